"""torch's provenance records shared, not copied, while a lowering runs (:func:`shared_provenance`).

Every node a pass creates records where it came from: ``node.meta["from_node"]``, a list of
``torch.fx.traceback.NodeSource``, each holding the list of its own node's sources. torch builds each record
with ``copy.deepcopy`` of the source node's list, so the chain a node carries is copied whole at every pass
that touches it: ``to_edge_transform_and_lower`` runs about twenty such passes, and a decoder layer's
records are copied again and again (10 to 15 % of an export's CPU time, more the more passes a node went
through).

A ``NodeSource`` is never changed once built (passes append to a node's ``meta["from_node"]`` list, never to a
record's ``from_node``), so a record can hold a new list of the same records instead of a deep copy: the same
provenance, the same debug handles and ``.pte`` bytes, without the copies. :func:`shared_provenance` puts that
constructor in place for the lowering and torch's own back when it ends, also when it raises; when torch's
``NodeSource`` is not the one this was written for (its attributes differ), nothing is replaced.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

#: the attributes torch 2.14's ``NodeSource.__init__`` sets (anything else: leave torch's constructor alone)
_FIELDS = frozenset({"pass_name", "action", "node_info", "from_node", "_action_string", "_dict"})


def _shared_init(own):
    def __init__(self, node, pass_name: str = "", action=None) -> None:
        own(self, None, pass_name, action)  # the action checks, the caches, no source
        if node:
            self.node_info = type(self).NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
            self.from_node = list(node.meta.get("from_node", ()))  # the same (never changed) records

    __init__.__wrapped__ = own
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
    if getattr(own, "__wrapped__", None) is not None or not _compatible(NodeSource):
        yield False
        return
    NodeSource.__init__ = _shared_init(own)
    try:
        yield True
    finally:
        NodeSource.__init__ = own
