"""A device cost model of a ``.pte``: the bytes one execution of a method moves, per node and per role.

On an Apple GPU a language model's decode step is bound by memory traffic, so bytes moved per step /
bandwidth is the time a step takes. This module counts those bytes from the program alone. It is **a
model, not a device measurement**: it does not run anything, and how MPSGraph really schedules, fuses
and caches is unknown to it. Its assumptions:

- A value's size is its elements times its dtype's size (int4: half a byte), rank 0 is one element.
- **naive** model: every node writes its outputs and reads each distinct operand in full, except
  - a pure reshape (``MPSView``, ``MPSSqueeze``, ``MPSUnsqueeze``) moves nothing (its result aliases its
    operand; reading it costs what reading the operand costs);
  - a gather (``MPSEmbedding``, ``MPSIndexSelect``, ``MPSIndexTensor``) and a slice (``MPSSlice``,
    ``MPSSelect``) read only what they take (as many bytes as they write) plus their indices.
- **fused** model, the naive one plus what a fusing compiler could at best do:
  - an elementwise node's result consumed only by elementwise nodes (a cast between elementwise nodes
    counts as one; not a graph output) is neither written nor read: the chain is one kernel, which
    reads each distinct outside operand once;
  - a permute, expand, slice, select or cast of an operand is folded into its consumer (not written;
    the consumer reads the permute's/expand's/cast's source, or what the slice takes);
  - a dequantize whose result goes (through such folds) only to matmuls is folded into them: they read
    the packed weight and its scales instead of the dequantized weight; so is an elementwise node
    computing a value from constants alone (weight-derived: the per-group offsets added to a
    dequantized weight, an int8 weight's cast and scale) that goes only to matmuls or to other such
    nodes: the dequantize and its offsets are one fused read of the packed weight, scales and offsets.
- Roles: *weights* are the delegate's constants; *weight-derived* values are computed from constants
  alone (the same every execution: a permuted or dequantized weight); *state* is mutable state, a
  delegate input that is neither a method input nor computed earlier in the method (a buffer such as the
  KV cache, living across executions); *state copies* are values a data-movement node (permute, expand,
  slice, cast, index_put, cat) makes of state; everything else is an *activation*.
- CPU kernels (the program's non-delegate instructions) read their tensor arguments and write their
  outputs in full (per the operator's schema: mutated and trailing ``out`` arguments are outputs); an
  in-place index write (``index_put_``, ``index_copy_``, ``scatter_``) reads its source rows and indices
  and writes only the rows (never the whole destination; the out variants write it whole).
- The **floor**: every constant read once (one read only by gathers: the rows they take), every state
  buffer read once, the rows written into state
  (an index_put's values), the method's inputs read once and its outputs written once. The ratios are naive / floor and
  fused / floor.
"""

from __future__ import annotations

import collections
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from mps_backend.errors import MPSBackendError
from mps_backend.serialization import MPSFormatError
from mps_backend.serialization import program as _program
from mps_backend.serialization.device_facts import IGNORED_IDS, node_value_ids
from mps_backend.serialization.flatbuf import FlatBuffer, compile_schema
from mps_backend.serialization.model import Graph, Node, Tensor, expected_nbytes
from mps_backend.serialization.program import delegates, open_program
from mps_backend.serialization.pte import map_file
from mps_backend.serialization.reader import read_blob

DISCLAIMER = "a model with listed assumptions (docs/device-cost.md), not a device measurement"

#: pure reshapes: their result aliases their operand
RESHAPES = frozenset({"MPSView", "MPSSqueeze", "MPSUnsqueeze"})
#: read only what they take (their output's bytes) plus their indices
GATHERS = frozenset({"MPSEmbedding", "MPSIndexSelect", "MPSIndexTensor"})
SLICES = frozenset({"MPSSlice", "MPSSelect"})
#: folded into their consumer in the fused model
FOLDABLE = frozenset({"MPSPermute", "MPSExpand", "MPSCast"}) | SLICES
ELEMENTWISE = frozenset(
    {
        *(f"MPS{n}" for n in ("Add", "Sub", "Mul", "Div", "Fmod", "Remainder", "Min", "Max", "Pow", "Atan2")),
        *(f"MPS{n}" for n in ("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Minimum", "Where", "Clamp")),
        *(f"MPS{n}" for n in ("Exp", "Exp2", "Reciprocal", "Sqrt", "Neg", "Log", "Log10", "Log2", "Erf", "Floor")),
        *(f"MPS{n}" for n in ("Ceil", "Rsqrt", "Sigmoid", "Sin", "Sign", "Cos", "Tan", "Abs", "Asin", "Acos")),
        *(f"MPS{n}" for n in ("Atan", "Sinh", "Cosh", "Tanh", "Asinh", "Acosh", "Atanh", "Isnan", "Isinf", "Round")),
        *(f"MPS{n}" for n in ("LogicalNot", "HardTanh", "ReLU", "GELU", "LeakyReLU")),
        *(f"MPS{n}" for n in ("Eq", "Ne", "Ge", "Gt", "Le", "Lt")),
    }
)
MATMULS = frozenset({"MPSMatMul", "MPSAddmm"})
CONVOLUTIONS = frozenset({"MPSConv2D", "MPSDepthwiseConv2D"})
DEQUANTIZE = "MPSDequantizePerChannelGroup"
#: data-movement nodes: their result is a copy (of state: a *state copy*)
MOVES = RESHAPES | FOLDABLE | frozenset({"MPSIndexPut", "MPSCat", "MPSScatter"})
INDEX_WRITES = frozenset({"MPSIndexPut", "MPSScatter"})
ROLES = ("weights", "weight-derived", "state", "state copies", "activations")
#: executorch ScalarType -> bytes per element
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 8: 4, 9: 8, 10: 16, 11: 1, 12: 1, 13: 1, 14: 4, 15: 2}
_INDEX_DTYPES = frozenset({0, 1, 2, 3, 4, 11})
_CPU_INDEX_WRITES = ("index_put", "index_copy", "scatter")
#: EValue union tags of tensor lists -> their table (executorch program.fbs KernelTypes)
_TENSOR_LISTS = {10: "TensorList", 11: "OptionalTensorList"}


def value_bytes(t: Tensor) -> int:
    return expected_nbytes(t.datatype, list(t.device_shape)) or 0


@dataclass
class Traffic:
    """Bytes read and written, in all and by role."""

    read: int = 0
    written: int = 0
    by_role: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLES, 0))

    @property
    def total(self) -> int:
        return self.read + self.written

    def add(self, role: str, nbytes: int, write: bool) -> None:
        if write:
            self.written += nbytes
        else:
            self.read += nbytes
        self.by_role[role] += nbytes

    def merge(self, other: "Traffic") -> None:
        self.read += other.read
        self.written += other.written
        for k, v in other.by_role.items():
            self.by_role[k] += v


@dataclass
class NodeCost:
    delegate: int
    node: int  # index in the delegate's node list (-1: a CPU kernel, ``kind`` names it)
    kind: str
    naive: int
    fused: int


#: the prompt length the roofline's time to first token is given for
PROMPT = 512


@dataclass(frozen=True)
class Device:
    """An Apple GPU: memory bandwidth (GB/s, 10^9 bytes) and FP16 peak (TFLOPS; Apple GPUs run FP16 at
    the FP32 rate: cores x 128 ALUs x 2 FLOPs x clock). Sources: docs/device-cost.md, Devices."""

    name: str
    bandwidth_gbs: float
    fp16_tflops: float


#: the devices of the roofline table (top GPU configuration of each chip; docs/device-cost.md cites them)
DEVICES = (
    Device("M1", 68.25, 2.6),
    Device("M1 Pro", 200.0, 5.2),
    Device("M1 Max", 400.0, 10.4),
    Device("M2", 100.0, 3.6),
    Device("M2 Pro", 200.0, 6.8),
    Device("M2 Max", 400.0, 13.6),
    Device("M3", 100.0, 3.58),
    Device("M3 Pro", 150.0, 6.44),
    Device("M3 Max", 400.0, 14.31),
    Device("M4", 120.0, 3.76),
    Device("M4 Pro", 273.0, 7.53),
    Device("M4 Max", 546.0, 15.05),
    Device("A17 Pro", 51.2, 2.15),
    Device("A18 Pro", 60.0, 2.26),
)


@dataclass(frozen=True)
class Roofline:
    """One method's execution on one device (a model, not a measurement)."""

    device: str
    bandwidth_gbs: float
    fp16_tflops: float
    call_s: float  # max(memory time, compute time) of one execution
    flop_share: float  # compute time / memory time of one execution (decode at the memory floor: <= 0.5)
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    ttft_s: float  # ceil(prompt / tokens_per_call) executions
    floor_s: float  # the prompt's compute floor: 2 x weight_params x prompt FLOPs at the peak
    ttft_ratio: float


def roofline(cost: ProgramCost, device: Device, prompt: int = PROMPT) -> Roofline:
    """``cost``'s execution on ``device``: a call takes ``max(fused bytes / bandwidth, FLOPs / peak)``;
    decode is one call per token, a prompt ``ceil(prompt / tokens_per_call)`` calls; the prompt's compute
    floor is every prompt token through every matmul weight (``2 x weight_params x prompt`` FLOPs, as an
    eager forward computes) at the device's peak."""
    memory = cost.fused.total / (device.bandwidth_gbs * 1e9)
    compute = cost.flops / (device.fp16_tflops * 1e12)
    call = max(memory, compute)
    p = max(cost.tokens_per_call, 1)
    ttft = math.ceil(prompt / p) * call
    floor = 2 * cost.weight_params * prompt / (device.fp16_tflops * 1e12)
    return Roofline(
        device.name,
        device.bandwidth_gbs,
        device.fp16_tflops,
        call,
        compute / memory if memory else math.inf,
        1 / call if call else math.inf,
        p / call if call else math.inf,
        ttft,
        floor,
        ttft / floor if floor else math.inf,
    )


@dataclass
class ProgramCost:
    """The cost of one execution of a method (see the module docstring for what is counted)."""

    method: str
    nodes_by_kind: dict[str, int]
    naive: Traffic
    fused: Traffic
    cpu: Traffic  # the CPU kernels (included in naive and fused)
    cpu_kernels: dict[str, int]
    floor: int
    floor_parts: dict[str, int]
    worst: list[NodeCost]
    note: str = DISCLAIMER
    #: FLOPs of one execution (the MPS graphs' matmuls and convolutions)
    flops: int = 0
    #: elements of the weights the matmuls read (a token through all of them: 2 FLOPs each)
    weight_params: int = 0
    #: prompt tokens one execution takes: ``P`` of a language model's ``forward(tokens [1, P],
    #: input_pos [1])`` (its upper bound when dynamic), else 1
    tokens_per_call: int = 1

    @property
    def naive_ratio(self) -> float:
        return self.naive.total / self.floor if self.floor else math.inf

    @property
    def fused_ratio(self) -> float:
        return self.fused.total / self.floor if self.floor else math.inf

    def roofline(self, prompt: int = PROMPT) -> list[Roofline]:
        """The execution on every device of :data:`DEVICES` (:func:`roofline`)."""
        return [roofline(self, d, prompt) for d in DEVICES]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["roofline"] = [asdict(r) for r in self.roofline()]
        d["naive_ratio"], d["fused_ratio"] = round(self.naive_ratio, 4), round(self.fused_ratio, 4)
        for k in ("naive", "fused", "cpu"):
            d[k]["total"] = getattr(self, k).total
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def format(self) -> str:
        def line(name: str, t: Traffic) -> str:
            ratio = f" = {t.total / self.floor:.3f}x the floor" if self.floor else ""
            return f"{name:<6} {_b(t.total)} (read {_b(t.read)}, written {_b(t.written)}){ratio}"

        kinds = sorted(self.nodes_by_kind.items(), key=lambda kv: (-kv[1], kv[0]))
        return "\n".join(
            [
                f"method {self.method!r}: bytes moved per execution ({self.note})",
                f"nodes  {sum(self.nodes_by_kind.values())}: " + ", ".join(f"{k.removeprefix('MPS')} {v}" for k, v in kinds),
                f"floor  {_b(self.floor)} (" + ", ".join(f"{k} {_b(v)}" for k, v in self.floor_parts.items()) + ")",
                line("naive", self.naive),
                line("fused", self.fused),
                f"cpu    {_b(self.cpu.total)} in {sum(self.cpu_kernels.values())} kernel calls"
                + "".join(f", {k} x{v}" for k, v in self.cpu_kernels.items()),
                f"by role {'naive':>22} {'fused':>14}",
                *(f"  {r:<16} {_b(self.naive.by_role[r]):>14} {_b(self.fused.by_role[r]):>14}" for r in ROLES),
                *self.format_roofline().splitlines(),
                "costliest nodes (naive; fused):" if self.worst else "",
                *(
                    f"  {'cpu' if n.node < 0 else f'd{n.delegate} #{n.node}':>10} {n.kind:<30} {_b(n.naive):>14} {_b(fused):>14}"
                    for n, fused in ((n, n.fused) for n in self.worst)
                ),
            ]
        ).rstrip()

    def format_roofline(self, prompt: int = PROMPT) -> str:
        """The roofline table: per device, a call's time, decode and prefill tokens/s, the time to the
        first token of a ``prompt``-token prompt and its ratio to the prompt's compute floor."""
        gb = self.fused.total / 1e9
        lines = [
            f"roofline: a call moves {gb:.3f} GB (fused) and computes {self.flops / 1e9:.2f} GFLOP; "
            f"{self.tokens_per_call} prompt token(s) per call; time = max(bytes / bandwidth, FLOPs / peak) "
            f"(devices: docs/device-cost.md)",
            f"  {'device':<10} {'GB/s':>5} {'TFLOPS':>6} {'FLOP/mem':>8} {'decode tok/s':>12} "
            f"{'prefill tok/s':>13} {f'TTFT {prompt}':>9} {'x floor':>7}",
        ]
        for r in self.roofline(prompt):
            lines.append(
                f"  {r.device:<10} {r.bandwidth_gbs:>5.0f} {r.fp16_tflops:>6.2f} {r.flop_share:>8.2f} "
                f"{r.decode_tokens_per_s:>12.1f} {r.prefill_tokens_per_s:>13.0f} {r.ttft_s:>8.2f}s {r.ttft_ratio:>6.2f}x"
            )
        return "\n".join(lines)


def _b(n: int) -> str:
    """Bytes in a readable unit."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{n} B"


@dataclass
class GraphCost:
    """The cost of one MPS graph. The floor's parts: ``constants`` (each once; one only gathered from:
    the rows taken), ``state`` (the state inputs once), ``rows`` (written into state: index_put values)."""

    nodes_by_kind: dict[str, int]
    naive: Traffic
    fused: Traffic
    nodes: list[NodeCost]
    constants: int
    state: int
    rows: int
    #: multiply-adds x 2 of the matmuls and convolutions (elementwise ops and reductions not counted)
    flops: int = 0
    #: elements of the weights (constants and weight-derived values) the matmuls read: a token through
    #: every one of them costs ``2 * weight_params`` FLOPs
    weight_params: int = 0


def _numel(t: Tensor) -> int:
    return math.prod(t.device_shape) if t.device_shape else 1


def graph_cost(graph: Graph, state: Iterable[int] = (), delegate: int = 0) -> GraphCost:
    """The traffic of one execution of ``graph`` whose inputs ``state`` (value ids) are mutable state."""
    values = graph.values
    size = [value_bytes(t) for t in values]
    state = set(state)
    constants = set(graph.constant_ids)
    producer: dict[int, Node] = {}
    index_of: dict[int, int] = {}
    consumers: dict[int, list[int]] = collections.defaultdict(list)
    operands: list[list[int]] = []
    for i, n in enumerate(graph.nodes):
        read = {k: v for k, v in n.fields.items() if (n.op, k) not in IGNORED_IDS}
        ins = [v for v in dict.fromkeys(node_value_ids(read, outputs=False)) if 0 <= v < len(values)]
        operands.append(ins)
        for v in ins:
            consumers[v].append(i)
        for v in node_value_ids(n.fields, outputs=True):
            if 0 <= v < len(values):
                producer[v], index_of[v] = n, i

    # roles (a reshape's result has its operand's role)
    role: dict[int, str] = {}
    for v in range(len(values)):
        role[v] = "weights" if v in constants else "state" if v in state else "activations"
    for i, n in enumerate(graph.nodes):
        ins = operands[i]
        roles = [role[v] for v in ins]
        if n.op in RESHAPES and ins:
            r = roles[0]
        elif roles and all(x in ("weights", "weight-derived") for x in roles):
            r = "weight-derived"
        elif n.op in MOVES and ins and role[max(ins, key=lambda v: size[v])] in ("state", "state copies"):
            r = "state copies"
        else:
            r = "activations"
        for v in node_value_ids(n.fields, outputs=True):
            if 0 <= v < len(values):
                role[v] = r

    # consumers and graph-output-ness seen through reshapes
    escapes: set[int] = set(graph.output_ids)
    for i in reversed(range(len(graph.nodes))):
        n = graph.nodes[i]
        if n.op in RESHAPES and operands[i] and _out(n) in escapes:
            escapes.add(operands[i][0])

    def real_consumers(v: int) -> list[int]:
        out = []
        for c in consumers[v]:
            if graph.nodes[c].op in RESHAPES:
                out.extend(real_consumers(_out(graph.nodes[c])))
            else:
                out.append(c)
        return out

    def elementwise_use(c: int) -> bool:
        """Node ``c`` is elementwise, or a cast whose every use is (a cast between elementwise nodes)."""
        n = graph.nodes[c]
        if n.op == "MPSCast":
            uses = real_consumers(_out(n))
            return _out(n) not in escapes and bool(uses) and all(elementwise_use(u) for u in uses)
        return n.op in ELEMENTWISE

    folded: set[int] = set()  # values not materialized in the fused model (reshapes aside)
    for n in graph.nodes:
        v = _out(n)
        if v < 0 or v in escapes:
            continue
        if n.op in FOLDABLE:
            folded.add(v)
        elif n.op in ELEMENTWISE:
            cs = real_consumers(v)
            if cs and all(elementwise_use(c) for c in cs):
                folded.add(v)

    def weight_chain(c: int) -> bool:
        """Node ``c`` computes a weight-derived value elementwise (not a graph output)."""
        n = graph.nodes[c]
        return n.op in ELEMENTWISE and _out(n) not in escapes and role.get(_out(n)) == "weight-derived"

    to_matmuls: set[int] = set()  # folded values that go only to matmuls (through folds)
    for n in reversed(graph.nodes):  # consumers first: a chain's later nodes are decided before earlier ones
        v = _out(n)
        if v < 0 or v in escapes:
            continue
        chained = n.op == DEQUANTIZE or weight_chain(index_of[v])
        if chained and _only_matmuls(v, graph, real_consumers, folded, to_matmuls):
            folded.add(v)
            to_matmuls.add(v)

    # what reading a value costs: (key, root value, bytes) per underlying read
    memo: dict[tuple[int, bool], list[tuple[int, int, int]]] = {}

    def reads(v: int, fused: bool) -> list[tuple[int, int, int]]:
        if (v, fused) in memo:
            return memo[(v, fused)]
        n = producer.get(v)
        if n is None or not operands[index_of[v]]:
            r = [(v, v, size[v])]
        elif n.op in RESHAPES:
            r = reads(operands[index_of[v]][0], fused)
        elif fused and v in folded and n.op in SLICES:
            r = [(v, root, size[v]) for _, root, _ in reads(operands[index_of[v]][0], fused)[:1]]
        elif fused and v in folded:  # permute/expand/cast source, dequantize inputs, a fused chain's inputs
            r = [x for u in operands[index_of[v]] for x in reads(u, fused)]
        else:
            r = [(v, v, size[v])]
        memo[(v, fused)] = r
        return r

    naive, fused = Traffic(), Traffic()
    costs: list[NodeCost] = []
    for i, n in enumerate(graph.nodes):
        defined = {k: v for k, v in n.fields.items() if (n.op, k) not in IGNORED_IDS}
        outs = [v for v in node_value_ids(defined, outputs=True) if 0 <= v < len(values)]
        t_naive, t_fused = Traffic(), Traffic()
        if n.op not in RESHAPES:
            taken = sum(size[v] for v in outs)
            for model, t in ((False, t_naive), (True, t_fused)):
                if model and outs and all(v in folded for v in outs):
                    continue  # folded: its consumers pay
                seen: dict[int, tuple[int, int]] = {}
                for u in operands[i]:
                    data = u == operands[i][0] if n.op in SLICES else n.op in GATHERS and _gathered(n, u)
                    for key, root, b in reads(u, model):
                        seen[key] = (root, taken if data else b)
                for root, b in seen.values():
                    t.add(role[root], b, write=False)
                for v in outs:
                    t.add(role[v], size[v], write=True)
        naive.merge(t_naive)
        fused.merge(t_fused)
        costs.append(NodeCost(delegate, i, n.op, t_naive.total, t_fused.total))
    rows = 0
    for i, n in enumerate(graph.nodes):
        if n.op in INDEX_WRITES and operands[i] and reads(operands[i][0], False)[0][1] in state:
            src = n.fields.get("values_id", n.fields.get("src_id"))
            rows += size[src] if isinstance(src, int) and 0 <= src < len(values) else 0
    floor_constants = 0  # each constant once; one only gathered from: the rows taken
    for v in constants:
        if not 0 <= v < len(values):
            continue
        cs = real_consumers(v)
        gathers = [c for c in cs if graph.nodes[c].op in GATHERS and reads(operands[c][0], False)[0][1] == v]
        floor_constants += sum(size[_out(graph.nodes[c])] for c in gathers) if cs and gathers == cs else size[v]
    flops = weight_params = 0
    for i, n in enumerate(graph.nodes):
        if n.op not in MATMULS and n.op not in CONVOLUTIONS:
            continue
        out = _out(n)
        ins = [v for v in operands[i] if 0 <= v < len(values)]
        if out < 0 or not ins:
            continue
        if n.op in CONVOLUTIONS:  # weight [O, I/groups, kh, kw]: each output element is I/groups*kh*kw MACs
            w = n.fields.get("input2_id")
            per = _numel(values[w]) // max(values[w].device_shape[0], 1) if isinstance(w, int) and 0 <= w < len(values) else 0
            flops += 2 * _numel(values[out]) * per
            weights = [w] if isinstance(w, int) and role.get(w) in ("weights", "weight-derived") else []
        else:  # [.., M, K] @ [.., K, N]; MPSAddmm's first operand is the bias
            a = n.fields.get("input2_id") if n.op == "MPSAddmm" else n.fields.get("input1_id")
            b = n.fields.get("input3_id") if n.op == "MPSAddmm" else n.fields.get("input2_id")
            if not all(isinstance(x, int) and 0 <= x < len(values) for x in (a, b)):
                continue
            k = values[a].device_shape[-1] if values[a].device_shape else 1
            flops += 2 * _numel(values[out]) * k
            weights = [x for x in (a, b) if role.get(x) in ("weights", "weight-derived")]
        weight_params += sum(_numel(values[w]) for w in weights)
    return GraphCost(
        dict(collections.Counter(n.op for n in graph.nodes)),
        naive,
        fused,
        costs,
        floor_constants,
        sum(size[v] for v in state if 0 <= v < len(values)),
        rows,
        flops,
        weight_params,
    )


def _out(n: Node) -> int:
    v = n.fields.get("output_id", n.fields.get("output1_id"))
    return v if isinstance(v, int) else -1


def _gathered(n: Node, v: int) -> bool:
    """Whether ``v`` is the table a gather node takes rows of (not its indices)."""
    return n.fields.get("input1_id") == v


def _only_matmuls(v: int, graph: Graph, real_consumers: Any, folded: set[int], to_matmuls: set[int]) -> bool:
    """``v`` goes only to matmuls: directly, through folded permutes/casts/slices, or through the
    elementwise nodes of a weight chain that do (``to_matmuls``, decided before: they come later)."""
    cs = real_consumers(v)
    for c in cs:
        n = graph.nodes[c]
        if n.op in MATMULS or _out(n) in to_matmuls:
            continue
        if n.op in FOLDABLE and _out(n) in folded and _only_matmuls(_out(n), graph, real_consumers, folded, to_matmuls):
            continue
        return False
    return bool(cs)


# ----------------------------------------------------------------------------------------------
# The program: methods, delegate calls, CPU kernels


def _layouts() -> Any:
    f = _program._f
    schema = {**_program._SCHEMA, "tables": dict(_program._SCHEMA["tables"])}
    schema["tables"]["DelegateCall"] = [f("delegate_index", "int"), f("args", "[int]")]
    schema["tables"]["Tensor"] = [f("scalar_type", "byte"), f("storage_offset", "int"), f("sizes", "[int]")]
    schema["tables"]["Tensor"] += [f("dim_order", "[ubyte]"), f("requires_grad", "bool"), f("data_buffer_idx", "uint")]
    schema["tables"]["TensorList"] = schema["tables"]["OptionalTensorList"] = [f("items", "[int]")]
    return compile_schema(schema)


class CostError(MPSBackendError, ValueError):
    """The program cannot be costed (no such method, no MPS delegate)."""


def cost_of_program(pte: bytes | memoryview | str | os.PathLike, method: str | None = None, top: int = 10) -> ProgramCost:
    """The cost of one execution of ``method`` (default: ``forward``, else the method with the most
    instructions) of a ``.pte`` (its bytes or a path); see the module docstring."""
    data = map_file(pte) if isinstance(pte, (str, os.PathLike)) else pte
    tables = open_program(data, MPSFormatError)
    fb: FlatBuffer = tables.fb
    fb.layouts = _layouts()
    payloads = delegates(tables, MPSFormatError)
    plans, first = [], 0
    for p, pos in enumerate(tables.program["execution_plan"] or ()):
        plan = fb.table(pos, "ExecutionPlan", f"execution_plan[{p}]")
        n_delegates = len(plan["delegates"] or ())
        plans.append((plan, first))
        first += n_delegates
    names = [plan["name"] for plan, _ in plans]
    if method is None:
        method = "forward" if "forward" in names else max(plans, key=lambda pf: _n_instructions(fb, pf[0]))[0]["name"]
    if method not in names:
        raise CostError(f"the program has no method {method!r} (methods: {', '.join(map(str, names))})")
    plan, first = plans[names.index(method)]
    evalues = plan["values"] or ()
    n_plan_delegates = len(plan["delegates"] or ())

    def tensor(v: int) -> dict | None:
        if not 0 <= v < len(evalues):
            raise CostError(f"method {method!r}: value {v} outside its {len(evalues)} values")
        tag, body = fb.table(evalues[v], "EValue", f"values[{v}]")["val"]
        return fb.table(body, "Tensor", f"values[{v}]") if tag == 5 and body is not None else None

    def tensors_of(v: int) -> list[int]:
        """A kernel argument's tensors: itself, or a (optional-)tensor list's items (index_put's indices)."""
        tag, body = fb.table(evalues[v], "EValue", f"values[{v}]")["val"]
        if tag in _TENSOR_LISTS and body is not None:
            items = fb.table(body, _TENSOR_LISTS[tag], f"values[{v}]")["items"] or ()
            return [i for i in items if i >= 0 and tensor(i) is not None]
        return [v] if tensor(v) is not None else []

    def tbytes(t: dict) -> int:
        return math.prod(t["sizes"] or ()) * _SCALAR_BYTES.get(t["scalar_type"], 4)

    inputs, outputs = set(plan["inputs"] or ()), list(plan["outputs"] or ())
    written: set[int] = set(inputs)
    state: dict[int, int] = {}  # program value -> bytes
    operators = [fb.table(o, "Operator", "operator") for o in plan["operators"] or ()]
    naive, fused, cpu = Traffic(), Traffic(), Traffic()
    kinds: collections.Counter = collections.Counter()
    cpu_kernels: collections.Counter = collections.Counter()
    nodes: list[NodeCost] = []
    constants = rows = flops = weight_params = 0
    cpu_constants: dict[int, int] = {}
    for c, chain_pos in enumerate(plan["chains"] or ()):
        chain = fb.table(chain_pos, "Chain", f"chains[{c}]")
        for k, instr_pos in enumerate(chain["instructions"] or ()):
            tag, body = fb.table(instr_pos, "Instruction", f"instruction {k}")["instr_args"]
            if tag == 2:  # DelegateCall
                call = fb.table(body, "DelegateCall", f"instruction {k}")
                if not 0 <= call["delegate_index"] < n_plan_delegates:
                    raise CostError(f"instruction {k}: delegate {call['delegate_index']} of {n_plan_delegates}")
                d = payloads[first + call["delegate_index"]]
                if d.backend_id != "MPSBackend":
                    continue
                graph = read_blob(d.payload).graph
                args = list(call["args"] or ())
                in_args, out_args = args[: len(graph.input_ids)], args[len(graph.input_ids) :]
                st = set()
                for vid, a in zip(graph.input_ids, in_args):
                    t = tensor(a)
                    if a not in written and t is not None and not t["data_buffer_idx"]:
                        st.add(vid)
                        state[a] = tbytes(t)
                g = graph_cost(graph, st, d.index)
                naive.merge(g.naive)
                fused.merge(g.fused)
                kinds.update(g.nodes_by_kind)
                nodes.extend(g.nodes)
                constants += g.constants
                rows += g.rows
                flops += g.flops
                weight_params += g.weight_params
                written.update(out_args)
            elif tag == 1:  # KernelCall
                call = fb.table(body, "KernelCall", f"instruction {k}")
                if not 0 <= call["op_index"] < len(operators):
                    raise CostError(f"instruction {k}: operator {call['op_index']} of {len(operators)}")
                op = operators[call["op_index"]]
                name = f"{op['name']}.{op['overload'] or 'default'}"
                cpu_kernels[name] += 1
                t_cpu = Traffic()
                args = list(call["args"] or ())
                outs = _kernel_outputs(op["name"], op["overload"] or "", args)
                read_args = [a for a in dict.fromkeys(x for arg in args for x in tensors_of(arg)) if a not in outs]
                for a in read_args:
                    t = tensor(a)
                    if a not in written and not t["data_buffer_idx"]:
                        state.setdefault(a, tbytes(t))
                    if t["data_buffer_idx"]:
                        cpu_constants[a] = tbytes(t)
                    t_cpu.add("state" if a in state else "weights" if t["data_buffer_idx"] else "activations", tbytes(t), False)
                # in place (index_put_, not index_put.out, which copies the whole destination first)
                index_write = op["name"].endswith("_") and any(s in op["name"] for s in _CPU_INDEX_WRITES)
                for j, a in enumerate(dict.fromkeys(outs)):
                    t = tensor(a)
                    if t is None:
                        continue
                    if index_write:  # in place: only the source rows are written, once (the result aliases it)
                        if j:
                            continue
                        src = [tensor(r) for r in read_args]
                        n = sum(tbytes(s) for s in src if s["scalar_type"] not in _INDEX_DTYPES)
                        rows += n
                    else:
                        n = tbytes(t)
                    t_cpu.add("state" if a in state else "activations", n, True)
                written.update(outs)
                cpu.merge(t_cpu)
                nodes.append(NodeCost(-1, -1, name, t_cpu.total, t_cpu.total))
    naive.merge(cpu)
    fused.merge(cpu)
    out_bytes = sum(tbytes(t) for t in map(tensor, outputs) if t is not None)
    in_bytes = sum(tbytes(t) for t in map(tensor, sorted(inputs)) if t is not None)
    parts = {
        "constants": constants + sum(cpu_constants.values()),
        "state": sum(state.values()),
        "rows written": rows,
        "inputs": in_bytes,
        "outputs": out_bytes,
    }
    worst = sorted(nodes, key=lambda n: -n.naive)[:top]
    ins = [tensor(v) for v in plan["inputs"] or ()]
    tokens = 1  # a language model's step: tokens int64 [1, P], input_pos int64 [1]
    if len(ins) == 2 and all(t is not None and t["scalar_type"] == 4 for t in ins):
        if len(ins[0]["sizes"] or ()) == 2 and list(ins[1]["sizes"] or ()) == [1]:
            tokens = int(ins[0]["sizes"][1])
    return ProgramCost(
        str(method),
        dict(sorted(kinds.items())),
        naive,
        fused,
        cpu,
        dict(cpu_kernels),
        sum(parts.values()),
        parts,
        worst,
        flops=flops,
        weight_params=weight_params,
        tokens_per_call=tokens,
    )


def _n_instructions(fb: Any, plan: dict) -> int:
    return sum(len(fb.table(c, "Chain", "chain")["instructions"] or ()) for c in plan["chains"] or ())


def _kernel_outputs(name: str, overload: str, args: list[int]) -> list[int]:
    """The arguments a CPU kernel writes: those its schema marks mutated, and the returned ones (the
    arguments past the schema's); the last argument when torch does not know the operator."""
    import torch  # noqa: PLC0415

    try:
        schema = torch._C._get_schema(name, overload)
    except RuntimeError:
        return args[-1:]
    n = len(schema.arguments)
    outs = [a for a, arg in zip(args, schema.arguments) if arg.alias_info is not None and arg.alias_info.is_write]
    return outs + args[n:]
