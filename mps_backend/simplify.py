"""Graph clean-up after lowering, before the blob is written (``simplify(builder)``).

Lowerings emit node by node and cannot see what their neighbours emit; rewrites that are exact on
the device tidy up what that leaves:

* reshape chains: an ``MPSView`` reading the output of an ``MPSView`` / ``MPSSqueeze`` /
  ``MPSUnsqueeze`` (all pure reshapes, same elements in the same order) reads that node's input
  instead: ``view(view(x, a), b) == view(x, b)``. Edge programs are full of these
  (``view_copy`` after ``view_copy``, ``squeeze`` then ``view``), and lowerings add their own.
  Only an ``MPSView`` consumer is rewritten: its shape is absolute, while squeeze/unsqueeze/expand
  are relative to their input's shape.
* identity expands: an ``MPSExpand`` to its input's own shape (torch's matmul decomposition puts
  one before every bmm) is bypassed, its readers reading its input.
* negations: ``MPSLogicalNot`` of an ``MPSEq``/``MPSNe`` result becomes the opposite comparison of
  the same operands (exact, NaN included: ``not(NaN == c)`` is ``NaN != c``; not so for ``<`` and
  ``>=``), and an ``MPSWhere`` whose condition is an ``MPSLogicalNot`` reads the negated value with
  its branches swapped. Edge programs of torch's SDPA have both (``logical_not(eq(s, -inf))`` and
  ``where(logical_not(any(...)), 0, p)``). The bypassed producers usually die.
* common subexpressions: constants with the same dtype, shape and contents become one (small ones,
  <= 64 elements, compared by bytes; larger ones by a 16-element sample of their source tensor, then
  in full only when the samples match, so weights are never converted or hashed whole: executorch's
  llama gives every layer the same attention-mask buffer), and a node with the same member, fields, inputs and output
  types as an earlier node
  is dropped, its readers reading the earlier node's outputs (a node writing a graph output is
  kept). Edge programs repeat computations, e.g. torch's bicubic decomposition computes the same
  clamped source rows for every one of its 16 taps, and lifted constants repeat values.
* dead nodes: a node none of whose outputs is read by a later node or is a graph output is
  removed (after the rewrite above many are), repeated until nothing changes, and so are the
  constants no remaining node reads (a weight consumed only by a removed node does not stay in
  the blob).

Value ids never change: removed nodes leave their output entries in ``mps_values`` unused (the
device creates tensors only for inputs and constants), so user inputs stay ids 0..n-1.
``node_origin`` (the debug-handle map) is kept in step with the node list.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from mps_backend.serialization.device_facts import IGNORED_IDS, OUTPUT_FIELDS
from mps_backend.serialization.model import DataType, Node

#: members whose output is their input reshaped (same elements, same order)
RESHAPES = frozenset({"MPSView", "MPSSqueeze", "MPSUnsqueeze"})


def _ids(node: Node, outputs: bool, ignored: bool = False) -> Iterator[int]:
    """Value ids ``node`` reads (``outputs=False``) or writes; -1 entries skipped, and the fields
    the runtime ignores unless ``ignored``."""
    for name, value in node.fields.items():
        if not (name.endswith("_id") or name.endswith("_ids")) or (name in OUTPUT_FIELDS) != outputs:
            continue
        if (node.op, name) in IGNORED_IDS and not ignored:
            continue
        for v in value if isinstance(value, list) else (value,):
            if v >= 0:
                yield v


def reads(node: Node) -> Iterator[int]:
    return _ids(node, outputs=False)


def writes(node: Node) -> Iterator[int]:
    return _ids(node, outputs=True)


def _collapse_reshapes(nodes: list[Node]) -> int:
    producer: dict[int, Node] = {}
    rewired = 0
    for node in nodes:
        if node.op == "MPSView":
            src = producer.get(node.fields["input1_id"])
            if src is not None and src.op in RESHAPES:
                node.fields["input1_id"] = src.fields["input1_id"]
                rewired += 1
        for v in writes(node):
            producer[v] = node
    return rewired


def _cancel_permutes(graph) -> int:
    """An MPSPermute of an MPSPermute reads the inner one's input with the composed order; when that
    order is the identity (``permute(permute(Wt, [1, 0]), [1, 0])``: a linear reading a weight stored
    transposed, ``mps_backend.passes.linear_weights``), its readers read the inner input itself.
    Exact: a permutation only moves elements. The permutes left unread go in dead-node removal."""
    producer: dict[int, Node] = {}
    replace: dict[int, int] = {}
    outputs = set(graph.output_ids)
    cancelled = 0
    for node in graph.nodes:
        if replace:
            _rename(node, replace)
        src = producer.get(node.fields.get("input1_id", -1)) if node.op == "MPSPermute" else None
        if src is not None and src.op == "MPSPermute":
            inner, outer = src.fields["perm"], node.fields["perm"]
            order = [inner[i] for i in outer]
            if order == list(range(len(order))) and node.fields["output_id"] not in outputs:
                replace[node.fields["output_id"]] = src.fields["input1_id"]
            else:
                node.fields["input1_id"], node.fields["perm"] = src.fields["input1_id"], order
            cancelled += 1
        for v in writes(node):
            producer[v] = node
    return cancelled


def _drop_identity_expands(graph) -> int:
    """An MPSExpand to its input's own shape (what torch's matmul decomposition emits before every
    bmm) is the identity: its readers read its input. The expands left unread go in dead-node removal."""
    replace: dict[int, int] = {}
    outputs = set(graph.output_ids)
    dropped = 0
    for node in graph.nodes:
        if replace:
            _rename(node, replace)
        if node.op != "MPSExpand" or node.fields["output_id"] in outputs:
            continue
        src, out = node.fields["input1_id"], node.fields["output_id"]
        if list(graph.values[src].dims) == list(graph.values[out].dims) and (
            graph.values[src].datatype == graph.values[out].datatype
        ):
            replace[out] = src
            dropped += 1
    return dropped


#: comparison -> the comparison that is its exact negation
NEGATED = {"MPSEq": "MPSNe", "MPSNe": "MPSEq"}


def _fold_negations(graph) -> int:
    nodes = graph.nodes
    producer: dict[int, Node] = {}
    folded = 0
    for node in nodes:
        src = producer.get(node.fields.get("input1_id", -1))
        if node.op == "MPSLogicalNot" and src is not None and src.op in NEGATED:
            node.op = NEGATED[src.op]
            node.fields = {
                "input1_id": src.fields["input1_id"],
                "input2_id": src.fields["input2_id"],
                "output_id": node.fields["output_id"],
            }
            folded += 1
        elif (
            node.op == "MPSWhere"
            and src is not None
            and src.op == "MPSLogicalNot"
            and graph.values[src.fields["input1_id"]].datatype == DataType.bool
        ):  # the device's NOT of a
            # non-bool tensor is unverified
            f = node.fields
            f["input1_id"], f["input2_id"], f["input3_id"] = src.fields["input1_id"], f["input3_id"], f["input2_id"]
            folded += 1
        for v in writes(node):
            producer[v] = node
    return folded


#: constants up to this many elements are compared by value
SMALL_CONSTANT = 64


def _rename(node: Node, replace: dict[int, int]) -> None:
    for name, value in node.fields.items():
        if not (name.endswith("_id") or name.endswith("_ids")) or name in OUTPUT_FIELDS:
            continue
        if isinstance(value, list):
            node.fields[name] = [replace.get(v, v) for v in value]
        else:
            node.fields[name] = replace.get(value, value)


#: elements sampled to tell large constants apart before comparing them in full
SAMPLE = 16


def _source_tensor(b, vid: int) -> torch.Tensor | None:
    """The tensor whose contents decide constant ``vid``'s bytes (before a deferred float16
    conversion), or None for a computed entry (a scaled fold, ...)."""
    if vid not in b.constants:
        return None
    return b.constants.original(vid)


def _sample(t: torch.Tensor) -> bytes:
    n = t.numel()
    flat = torch.linspace(0, n - 1, min(n, SAMPLE)).long()
    picked = t[torch.unravel_index(flat, t.shape)] if t.dim() else t.reshape(1)
    return bytes(picked.contiguous().view(torch.uint8).numpy())


def _same_constant(a: torch.Tensor, c: torch.Tensor) -> bool:
    if a.dtype != c.dtype or a.shape != c.shape:
        return False
    if a.data_ptr() == c.data_ptr() and a.stride() == c.stride():
        return True
    return bool(torch.equal(a, c))


def _dedupe_constants(b) -> dict[int, int]:
    """constant id -> the first constant with the same dtype, shape and contents."""
    graph = b.graph
    replace: dict[int, int] = {}
    first_small: dict[tuple, int] = {}
    large: dict[tuple, list[int]] = {}
    for vid in graph.constant_ids:
        t = graph.values[vid]
        if math.prod(t.dims) <= SMALL_CONSTANT:
            if vid not in b.constants:  # membership only: ``get`` would materialize a deferred conversion
                continue
            data = b.constants[vid].reshape(-1).contiguous().view(torch.uint8)
            key = (t.datatype, tuple(t.dims), bytes(data.numpy()))
            replace[vid] = first_small.setdefault(key, vid)
            continue
        src = _source_tensor(b, vid)
        if src is None:
            continue
        candidates = large.setdefault((t.datatype, tuple(t.dims), src.dtype, _sample(src)), [])
        same = next((c for c in candidates if _same_constant(src, _source_tensor(b, c))), None)
        if same is None:
            candidates.append(vid)
        else:
            replace[vid] = same
    return replace


def _dedupe(b) -> int:
    graph = b.graph
    replace = _dedupe_constants(b)
    graph_outputs = set(graph.output_ids)
    first_node: dict[tuple, Node] = {}
    kept: list[int] = []
    for i, node in enumerate(graph.nodes):
        _rename(node, replace)
        outs = [n for n in node.fields if n in OUTPUT_FIELDS]
        out_ids = [v for n in outs for v in (node.fields[n] if isinstance(node.fields[n], list) else [node.fields[n]])]
        key = (
            node.op,
            node.min_max,
            tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in node.fields.items() if k not in OUTPUT_FIELDS),
            tuple((graph.values[v].datatype, tuple(graph.values[v].dims)) if v >= 0 else None for v in out_ids),
        )
        earlier = first_node.get(key)
        if earlier is None or graph_outputs.intersection(out_ids):
            first_node.setdefault(key, node)
            kept.append(i)
            continue
        earlier_ids = [
            v for n in outs for v in (earlier.fields[n] if isinstance(earlier.fields[n], list) else [earlier.fields[n]])
        ]
        replace.update((a, c) for a, c in zip(out_ids, earlier_ids) if a >= 0)
    removed = len(graph.nodes) - len(kept)
    if removed:
        graph.nodes[:] = [graph.nodes[i] for i in kept]
        b.node_origin[:] = [b.node_origin[i] for i in kept]
    return removed


def _remove_dead(b) -> int:
    graph = b.graph
    keep_values = set(graph.output_ids)
    alive = [True] * len(graph.nodes)
    for i in range(len(graph.nodes) - 1, -1, -1):  # one backward sweep finds every dead chain
        node = graph.nodes[i]
        if any(v in keep_values for v in writes(node)):
            keep_values.update(reads(node))
        else:
            alive[i] = False
    removed = alive.count(False)
    if removed:
        graph.nodes[:] = [n for n, a in zip(graph.nodes, alive) if a]
        b.node_origin[:] = [o for o, a in zip(b.node_origin, alive) if a]
    referenced = set(graph.output_ids)  # a constant named by any field of a kept node stays
    for node in graph.nodes:
        referenced.update(_ids(node, outputs=False, ignored=True))
    for vid in [c for c in graph.constant_ids if c not in referenced]:
        b.forget_constant(vid)
    return removed


def simplify(b) -> dict[str, int]:
    """Apply the rewrites to builder ``b`` in place; returns how many of each were made."""
    rewired = _collapse_reshapes(b.graph.nodes)
    permutes = _cancel_permutes(b.graph)
    expands = _drop_identity_expands(b.graph)
    folded = _fold_negations(b.graph)
    merged = _dedupe(b)
    removed = _remove_dead(b)
    return {
        "reshapes rewired": rewired,
        "permutes composed": permutes,
        "identity expands dropped": expands,
        "negations folded": folded,
        "duplicates merged": merged,
        "nodes removed": removed,
    }
