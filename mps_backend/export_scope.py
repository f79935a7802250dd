"""Five costs of torch's and executorch's export machinery avoided while a lowering runs (:func:`export_scope`), each
scoped: their own code is put back when the lowering ends, also when it raises, and the program is the same, byte
for byte.

- **Provenance copies** (:func:`shared_provenance`). Every node a pass creates records where it came from:
  ``node.meta["from_node"]``, a list of ``torch.fx.traceback.NodeSource``, each holding the list of its own
  node's sources. torch builds each record with ``copy.deepcopy`` of the source node's list, so the chain a
  node carries is copied whole at every pass that touches it: ``to_edge_transform_and_lower`` runs about
  twenty such passes (8-14 % of an export's CPU time, more the more passes a node went through). A
  ``NodeSource`` is never changed once built (passes append to a node's ``meta["from_node"]`` list, never to a
  record's ``from_node``), so a record can hold a new list of the same records instead of a deep copy: the
  same provenance and debug handles.
- **A second functionalization** (:func:`functional_once`). ``to_edge_transform_and_lower`` runs
  ``run_decompositions({})`` on each method (to functionalize it before asking the partitioner what to keep) right
  after :meth:`~mps_backend.partitioner.MPSPartitioner.transform_for_pre_decomposition` gave it a program that
  ``run_decompositions`` just made: functional already, and an empty table decomposes nothing, so the re-trace
  (10-25 % of an export) gives the same graph. Inside the scope, ``run_decompositions`` with an empty table of a
  program a ``run_decompositions`` of the same scope returned is that program itself; any other program is traced
  as torch does.
- **The composite-implicit operator census** (:func:`remembered_cia_ops`). ``run_decompositions`` and every read
  of a default decomposition table (``CustomDecompTable.materialize``) ask torch for all operators with a
  ``CompositeImplicitAutograd`` kernel (``torch._export.utils._collect_all_valid_cia_ops``): a walk over every
  operator namespace that re-materializes the dispatcher's registrations once per namespace, about 55 ms, six
  times per lowered method, the same answer each time. Inside the scope the answer is kept, and asked again
  when the dispatcher's ``CompositeImplicitAutograd`` registrations or the operator namespaces change (a
  library registered meanwhile).

- **The same dtype check of the same graph, five times** (:func:`verified_once`). Every ``ExportedProgram``
  executorch builds of an edge program is validated, and the validation interprets the whole graph on fake
  tensors to check each edge operator's tensor arguments against the dtypes the operator allows
  (``executorch.exir.verification.verifier._check_tensor_args_matching_op_allowed_dtype``): 7 times a lowered
  method, 5 of them on an unchanged graph (SmolLM2's 4,719 nodes: 0.85 s each; 10 % of a small model's
  export). Inside the scope a graph that passed is not interpreted again while it is the same graph: the same
  nodes in the same order with the same targets, arguments and placeholder dtypes, shapes and strides, and the
  same attribute tensors' dtypes and shapes (its fingerprint, a few ms). A graph that fails is checked (and
  fails) each time; any other graph is checked as executorch does.

- **Re-traces that rewrite nothing** (:func:`no_idle_retraces`). On the way to the edge dialect and to the
  executorch program, executorch runs ten ``ExportPass`` passes, each re-tracing the whole graph on fake tensors
  (30 % of a small model's export, about 1.4 s each on SmolLM2) to rewrite a few operators. Six of them rewrite
  only what a graph of our lowerings often does not hold: ``NormalizeTransposePass`` (``aten.t``),
  ``ReplaceBrokenOpsWithFunctionalOpsPass`` (view operators, made view-copies before it), ``SymToTensorPass``
  (symbolic values), ``RemoveMixedTypeOperators`` (an add, mul, sub, div or minimum of mixed dtypes, or an
  integer division), ``MemoryFormatOpsPass`` (operators taking a memory format) and
  ``LegalizePortableDimOrderPass`` (a few portable operators on a non-contiguous input). Inside the scope each of
  them returns the graph unchanged when it holds none of what the pass rewrites (and no nested graph); otherwise
  it runs as executorch wrote it. The passes that always rewrite (``ScalarToTensorPass``, ``OpReplacePass``) and
  the one that refreshes every node's metadata (``SpecPropPass``) run as always.

When torch's code is not the one this was written for (``NodeSource``'s attributes, the census's callers),
nothing is replaced.
"""

from __future__ import annotations

import contextlib
import importlib
import weakref
from typing import Any, Iterator

#: the attributes torch 2.14's ``NodeSource.__init__`` sets (anything else: leave torch's constructor alone)
_FIELDS = frozenset({"pass_name", "action", "node_info", "from_node", "_action_string", "_dict"})
#: the modules that call the census by the name they imported it under
_CENSUS_CALLERS = ("torch.export.exported_program", "torch.export.decomp_utils")
_CENSUS = "_collect_all_valid_cia_ops"
#: set on what a scope puts in torch's place (a nested scope replaces nothing)
_MARK = "_mps_backend_export_scope"


def _shared_init(own):
    def __init__(self, node, pass_name: str = "", action=None) -> None:
        own(self, None, pass_name, action)  # the action checks, the caches, no source
        if node:
            self.node_info = type(self).NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
            self.from_node = list(node.meta.get("from_node", ()))  # the same (never changed) records

    __init__.__wrapped__ = own
    setattr(__init__, _MARK, True)
    return __init__


def _compatible(cls) -> bool:
    try:
        probe = cls(None)
    except Exception:  # noqa: BLE001 - a torch whose constructor differs: keep its own
        return False
    return set(vars(probe)) == _FIELDS and hasattr(cls, "NodeInfo")


@contextlib.contextmanager
def shared_provenance() -> Iterator[bool]:
    """While open, ``NodeSource`` records share their sources' records instead of deep-copying them
    (module docstring); yields whether the constructor was replaced. Nested uses replace it once."""
    from torch.fx.traceback import NodeSource  # noqa: PLC0415 - torch is imported by every caller already

    own = NodeSource.__dict__["__init__"]
    if getattr(own, _MARK, False) or not _compatible(NodeSource):
        yield False
        return
    NodeSource.__init__ = _shared_init(own)
    try:
        yield True
    finally:
        NodeSource.__init__ = own


def _census_key() -> tuple:
    """What the census's answer depends on that can change in a process: the dispatcher's
    ``CompositeImplicitAutograd`` registrations and the operator namespaces."""
    import torch  # noqa: PLC0415

    return len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")), tuple(torch.ops._dir)


def _remembering(own):
    kept: dict[tuple, frozenset] = {}  # this scope's answers (one scope, one closure: nothing outlives it)

    def census() -> set:
        key = _census_key()
        if key not in kept:
            kept.clear()
            kept[key] = frozenset(own())
        return set(kept[key])  # a set of its own for each caller, as torch's returns

    census.__wrapped__ = own
    setattr(census, _MARK, True)
    return census


@contextlib.contextmanager
def remembered_cia_ops() -> Iterator[bool]:
    """While open, torch's census of composite-implicit operators is answered from the last answer while
    what it depends on is unchanged (module docstring); yields whether it was replaced. Nested uses replace
    it once."""
    try:
        modules = [importlib.import_module(name) for name in _CENSUS_CALLERS]
    except ImportError:  # a torch without them: nothing to replace
        modules = []
    if not modules or any(not callable(getattr(m, _CENSUS, None)) for m in modules):
        yield False
        return
    owns = [getattr(m, _CENSUS) for m in modules]
    if any(getattr(own, _MARK, False) for own in owns) or len({id(o) for o in owns}) != 1:
        yield False
        return
    census = _remembering(owns[0])
    for m in modules:
        setattr(m, _CENSUS, census)
    try:
        yield True
    finally:
        for m, own in zip(modules, owns):
            setattr(m, _CENSUS, own)


@contextlib.contextmanager
def functional_once() -> Iterator[bool]:
    """While open, ``ExportedProgram.run_decompositions`` with an empty table returns a program that a
    ``run_decompositions`` inside this scope returned as it is (module docstring); yields whether it was replaced.
    Nested uses replace it once."""
    from torch.export import ExportedProgram  # noqa: PLC0415
    from torch.export.decomp_utils import CustomDecompTable  # noqa: PLC0415

    own = ExportedProgram.__dict__.get("run_decompositions")
    if own is None or getattr(own, _MARK, False):
        yield False
        return
    made: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # id -> what this scope's
    # decompositions returned, while it lives (nothing kept alive: a lowering releases its programs as it goes)

    def run_decompositions(self, decomp_table=None, decompose_custom_triton_ops=False):
        empty = decomp_table is not None and not isinstance(decomp_table, CustomDecompTable) and len(decomp_table) == 0
        if empty and not decompose_custom_triton_ops and made.get(id(self)) is self:
            return self  # functional already; an empty table decomposes nothing
        out = own(self, decomp_table, decompose_custom_triton_ops)
        made[id(out)] = out
        return out

    run_decompositions.__wrapped__ = own
    setattr(run_decompositions, _MARK, True)
    ExportedProgram.run_decompositions = run_decompositions
    try:
        yield True
    finally:
        ExportedProgram.run_decompositions = own
        made.clear()


_VERIFIER = "executorch.exir.verification.verifier"
_DTYPE_CHECK = "_check_tensor_args_matching_op_allowed_dtype"


def _describe(value: Any, seen: dict) -> Any:
    """What the dtype check reads of a placeholder's value or a fetched attribute."""
    import torch  # noqa: PLC0415

    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), str(value.device), tuple(map(str, value.shape)), tuple(map(str, value.stride())))
    if isinstance(value, torch.fx.GraphModule):
        return ("graph", graph_fingerprint(value, seen))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", repr(value))
    return ("object", type(value).__qualname__, id(value))  # anything else: this very object


def graph_fingerprint(gm: Any, seen: dict | None = None) -> bytes:
    """A digest of everything :data:`_DTYPE_CHECK` depends on in ``gm``: each node's kind, target and arguments
    (other nodes by position), placeholders' example values and fetched attributes (dtype, device, shape,
    strides), nested graphs recursively."""
    import hashlib  # noqa: PLC0415

    import torch  # noqa: PLC0415

    seen = {} if seen is None else seen
    if id(gm) in seen:
        return seen[id(gm)]
    index: dict = {}

    def arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return ("node", index[a])
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(arg(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple((k, arg(v)) for k, v in a.items()))
        if isinstance(a, torch.Tensor):
            return _describe(a, seen)
        return (type(a).__qualname__, repr(a))

    rows = []
    for i, node in enumerate(gm.graph.nodes):
        index[node] = i
        target = node.target
        row: tuple = (node.op, type(target).__module__, type(target).__qualname__, str(target), arg(node.args), arg(node.kwargs))
        if node.op == "placeholder":
            row += (_describe(node.meta.get("val"), seen),)
        elif node.op in ("get_attr", "call_module"):
            value: Any = gm
            try:
                for part in str(target).split("."):
                    value = getattr(value, part)
            except AttributeError:
                value = None
            row += (_describe(value, seen),)
        rows.append(row)
    digest = hashlib.blake2b(repr(rows).encode(), digest_size=32).digest()
    seen[id(gm)] = digest
    return digest


@contextlib.contextmanager
def verified_once() -> Iterator[bool]:
    """While open, executorch's dtype check of an edge graph skips a graph that passed it inside this scope and
    is still the same graph (module docstring); yields whether it was replaced. Nested uses replace it once."""
    try:
        module = importlib.import_module(_VERIFIER)
    except ImportError:  # an executorch without it: nothing to replace
        yield False
        return
    own = getattr(module, _DTYPE_CHECK, None)
    if not callable(own) or getattr(own, _MARK, False):
        yield False
        return
    passed: set[bytes] = set()  # fingerprints of the graphs that passed, for this scope only

    def check(gm) -> None:
        key = graph_fingerprint(gm)
        if key in passed:
            return
        own(gm)  # raises on a violation: nothing remembered
        passed.add(key)

    check.__wrapped__ = own  # type: ignore[attr-defined]
    setattr(check, _MARK, True)
    setattr(module, _DTYPE_CHECK, check)
    try:
        yield True
    finally:
        setattr(module, _DTYPE_CHECK, own)
        passed.clear()


def _plain(gm: Any) -> list | None:
    """The call_function nodes of ``gm``, or None when it holds a nested graph (then every pass runs)."""
    import torch  # noqa: PLC0415

    if any(isinstance(m, torch.fx.GraphModule) for m in gm.children()):
        return None
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def _none_of(gm: Any, rewritten) -> bool:
    """Whether ``gm`` holds no nested graph and no call of an operator ``rewritten(target)`` says a pass rewrites."""
    nodes = _plain(gm)
    return nodes is not None and not any(rewritten(n.target) for n in nodes)


def _no_transpose(gm: Any) -> bool:
    import torch  # noqa: PLC0415

    return _none_of(gm, lambda t: t is torch.ops.aten.t.default)


def _no_view(gm: Any) -> bool:
    import torch  # noqa: PLC0415

    return _none_of(gm, lambda t: isinstance(t, torch._ops.OpOverload) and t.is_view)


def _no_symbol(gm: Any) -> bool:
    import torch  # noqa: PLC0415

    if _plain(gm) is None:
        return False
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        if "val" not in n.meta:  # a value the pass would see but this cannot: let it look
            return False
        for v in torch.utils._pytree.tree_leaves(n.meta["val"]):
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return False
            if isinstance(v, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in (*v.shape, *v.stride())):
                return False
    return True


def _no_dim_order_op(gm: Any) -> bool:
    """MemoryFormatOpsPass rewrites the edge operators that take a memory format (``DimOrderOpsMap``)."""
    from executorch.exir.passes.dim_order_ops_registry import DimOrderOpsMap  # noqa: PLC0415

    return _none_of(gm, lambda t: t in DimOrderOpsMap)


def _no_portable_layout_op(gm: Any) -> bool:
    """LegalizePortableDimOrderPass rewrites the inputs of the operators of its ``_target_ops``."""
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass  # noqa: PLC0415

    targets = getattr(LegalizePortableDimOrderPass, "_target_ops", None)
    return isinstance(targets, (set, frozenset)) and _none_of(gm, lambda t: t in targets)


#: the operators RemoveMixedTypeOperators looks at (its allow list: add.Tensor, mul.Tensor, sub.Tensor, div.Tensor,
#: div.Tensor_mode, minimum.default), by name; and the names its ``call_operator`` uses in executorch 1.5.1 (any other
#: code: it always runs)
_PROMOTING = frozenset({"add", "mul", "sub", "div", "minimum"})
_MIXED_NAMES = (
    "len", "super", "call_operator", "torch", "ops", "aten", "add", "Tensor", "ELEMENTWISE_TYPE_PROMOTION_KIND",
    "DEFAULT", "mul", "sub", "div", "INT_TO_FLOAT", "Tensor_mode", "minimum", "default", "get", "isinstance",
    "ProxyValue", "is_tensor", "append", "to_tensor", "data", "SymFloat", "SymInt", "SymBool", "tensor", "tuple",
    "elementwise_dtypes", "PyTree", "Argument", "map_args",
)  # fmt: skip


def _no_mixed_types(gm: Any) -> bool:
    """RemoveMixedTypeOperators casts the tensor arguments of an operator of its allow list (called with two or more
    positional arguments) to their promoted dtype: nothing to cast when no such call mixes tensor dtypes, takes a
    symbolic value or a python number, or divides tensors that are not floating."""
    import torch  # noqa: PLC0415
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators  # noqa: PLC0415

    nodes = _plain(gm)
    if nodes is None or RemoveMixedTypeOperators.call_operator.__code__.co_names != _MIXED_NAMES:
        return False
    for n in nodes:
        name = getattr(getattr(n.target, "_schema", None), "name", "").split("::")[-1]
        if len(n.args) <= 1 or name not in _PROMOTING:
            continue
        dtypes = set()
        for a in n.args:
            v = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
            if isinstance(v, torch.Tensor):
                dtypes.add(v.dtype)
            elif v is None or isinstance(v, (bool, int, float, complex, torch.SymInt, torch.SymFloat, torch.SymBool)):
                return False
        if len(dtypes) > 1 or (name == "div" and not all(d.is_floating_point for d in dtypes)):
            return False
    return True


#: (module, class) of an executorch pass -> when its re-trace rewrites nothing (:func:`no_idle_retraces`)
_IDLE_WHEN = {
    ("executorch.exir.passes.normalize_transpose_pass", "NormalizeTransposePass"): _no_transpose,
    ("executorch.exir.passes.replace_broken_ops_with_function_ops_pass", "ReplaceBrokenOpsWithFunctionalOpsPass"): _no_view,
    ("executorch.exir.passes.sym_to_tensor_pass", "SymToTensorPass"): _no_symbol,
    ("executorch.exir.passes.remove_mixed_type_operators", "RemoveMixedTypeOperators"): _no_mixed_types,
    ("executorch.exir.passes.memory_format_ops_pass", "MemoryFormatOpsPass"): _no_dim_order_op,
    ("executorch.exir.passes.legalize_portable_dim_order_pass", "LegalizePortableDimOrderPass"): _no_portable_layout_op,
}


def _skipping(own, idle):
    from torch.fx.passes.infra.pass_base import PassResult  # noqa: PLC0415

    def call(self, graph_module):
        if idle(graph_module):
            return PassResult(graph_module, False)
        return own(self, graph_module)

    call.__wrapped__ = own  # type: ignore[attr-defined]
    setattr(call, _MARK, True)
    return call


@contextlib.contextmanager
def no_idle_retraces() -> Iterator[bool]:
    """While open, the executorch passes of :data:`_IDLE_WHEN` return a graph that holds nothing they rewrite as
    it is (module docstring); yields whether any was replaced. Nested uses replace them once."""
    replaced = []
    for (name, cls_name), idle in _IDLE_WHEN.items():
        try:
            cls = getattr(importlib.import_module(name), cls_name)
        except (ImportError, AttributeError):  # an executorch without it: nothing to replace
            continue
        own = cls.__dict__.get("call")
        if own is None:  # ExportPass's own call: only its subclass's operators differ
            own = cls.call
        if getattr(own, _MARK, False):
            continue
        had = "call" in cls.__dict__
        cls.call = _skipping(own, idle)
        replaced.append((cls, own, had))
    try:
        yield bool(replaced)
    finally:
        for cls, own, had in replaced:
            if had:
                cls.call = own
            else:
                del cls.call


@contextlib.contextmanager
def export_scope() -> Iterator[None]:
    """All five (module docstring), for one lowering: ``export_model``, ``export_llm`` and the Whisper
    preprocessor lower inside it."""
    with shared_provenance(), remembered_cia_ops(), functional_once(), verified_once(), no_idle_retraces():
        yield
