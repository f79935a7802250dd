"""Three costs of torch's export machinery avoided while a lowering runs (:func:`export_scope`), each scoped: torch's
own code is put back when the lowering ends, also when it raises, and the program is the same, byte for byte.

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


@contextlib.contextmanager
def export_scope() -> Iterator[None]:
    """All three (module docstring), for one lowering: ``export_model``, ``export_llm`` and the Whisper
    preprocessor lower inside it."""
    with shared_provenance(), remembered_cia_ops(), functional_once():
        yield
