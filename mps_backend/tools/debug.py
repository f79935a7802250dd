"""Where does float16 lose precision? ``mps-backend debug --model SPEC``.

The model is exported once and its edge program lowered twice by the MPS lowering, in float32 and in
float16 (``mps_backend.backend.build_graph``, the code ``preprocess`` runs); both graphs run on the
device model on the same inputs, and every edge node's result is compared between the two (each fx
node's value is the one its lowering bound, ``GraphBuilder.ids``). A row per edge node, in graph
order: its relative gap ``max |fp16 - fp32| / max |fp32|``, and the gap it adds over the largest gap
of its inputs — the node where precision is lost stands out even deep in the network. Inputs and
weights have rows too: their gap is their rounding to float16.

Needs a program the MPS lowering takes whole (``report`` names the nodes that would stay on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from mps_backend.backend import build_graph
from mps_backend.export import export_program
from mps_backend.operators.registry import default_registry
from mps_backend.runtime.interpreter import Interpreter
from mps_backend.serialization.writer import write_blob


@dataclass
class GapRow:
    node: str
    target: str
    shape: tuple[int, ...]
    gap: float  # max |fp16 - fp32| / max |fp32|
    added: float  # gap minus the largest gap among the node's inputs

    def __str__(self) -> str:
        return f"{self.gap:10.3e} {self.added:+10.3e}  {self.node} ({self.target}) {list(self.shape)}"


def _relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if a.shape != b.shape:
        return float("inf")
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = b[finite].abs().max().item()
    diff = (a[finite] - b[finite]).abs().max().item()
    return diff / scale if scale else diff


def fp16_gap_table(model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> list[GapRow]:
    """One :class:`GapRow` per edge node whose result both graphs computed, in graph order."""
    from executorch.exir import to_edge  # noqa: PLC0415

    with torch.no_grad():
        edge = to_edge(export_program(model, inputs)).exported_program()
    registry = default_registry()
    unsupported = [
        f"{n.name}: {registry.check(n)}" for n in edge.graph.nodes if n.op == "call_function" and registry.check(n) is not None
    ]
    if unsupported:
        raise ValueError("debug needs a program the MPS lowering takes whole; on CPU: " + "; ".join(unsupported[:5]))
    values, ids = {}, {}
    for fp16 in (False, True):
        b = build_graph(edge, fp16)
        ids[fp16] = {n.name: v for n, v in b.ids.items()}  # b lowered a copy of edge
        values[fp16] = Interpreter(write_blob(b.graph, b.constants)).run_values(list(inputs))
    rows: list[GapRow] = []
    gaps: dict[object, float] = {}

    def upstream(n) -> float:
        """The gap arriving through ``n``: its own, else (unrecorded: a multi-output node) its inputs'."""
        if n not in gaps:
            gaps[n] = max((upstream(i) for i in n.all_input_nodes), default=0.0)
        return gaps[n]

    for node in edge.graph.nodes:
        if node.op not in ("call_function", "placeholder"):
            continue
        v32, v16 = ids[False].get(node.name), ids[True].get(node.name)
        a = values[True].get(v16) if isinstance(v16, int) else None
        b = values[False].get(v32) if isinstance(v32, int) else None
        if a is None or b is None:
            continue  # multi-output, folded into a neighbour, or removed by simplify (merged or dead)
        gap = _relative_gap(a, b)
        before = max((upstream(i) for i in node.all_input_nodes), default=0.0)
        gaps[node] = gap
        target = "input or weight" if node.op == "placeholder" else str(getattr(node.target, "__name__", node.target))
        rows.append(GapRow(node.name, target, tuple(b.shape), gap, gap - before))
    return rows


def format_table(rows: list[GapRow], top: int = 10) -> str:
    lines = [
        f"{'gap':>10} {'added':>10}  node (op) shape   — float16 vs float32 on the device model, "
        "relative to the float32 result's largest magnitude"
    ]
    lines += [str(r) for r in rows]
    worst = sorted(rows, key=lambda r: -r.added)[:top]
    lines.append(f"\nwhere float16 loses the most (largest added gap, top {len(worst)}):")
    lines += [str(r) for r in worst]
    return "\n".join(lines)
