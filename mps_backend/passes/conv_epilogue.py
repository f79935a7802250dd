"""Fold a per-output-channel affine map that the only reader of a convolution applies first into the
convolution (docs/architecture.md, "Lowering passes").

``y * s + t`` per output channel, where ``y`` is a forward 1-d / 2-d convolution with constant weights
(and bias), becomes part of the convolution: its lowering writes ``W * s`` and ``b * s + t`` (computed in
float64, rounded once, ``W * s`` straight into the blob). Readers folded:

* an inference batch norm (``_native_batch_norm_legit_no_training``) with constant statistics and affine
  parameters whose statistics outputs nobody reads: ``s = gamma / sqrt(var + eps)``,
  ``t = beta - mean * s``; the batch norm and its ``getitem`` leave the graph, its readers read the
  convolution;
* hardsigmoid, ``hardtanh(y / 6 + 0.5, 0, 1)``: ``s = 1/6``, ``t = 0.5``; the hardsigmoid becomes
  ``hardtanh(conv, 0, 1)`` (one MPS node instead of two).

The convolution node carries the map in ``node.meta[CHANNEL_AFFINE]`` (a :class:`ChannelAffine`, which
also names the fx nodes it absorbed, for the debug handle map); ``operators/convolution.py`` lowers it.
Against eager PyTorch the folded result differs by rounding only (one rounding of ``W * s`` instead of
one per output).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from ._graph import constant_tensor, edge_op, is_call, replace_node

aten = torch.ops.aten

#: node.meta key of a convolution whose output channels are mapped affinely after the convolution
CHANNEL_AFFINE = "mps_channel_affine"


@dataclass(frozen=True)
class ChannelAffine:
    """``y[:, c] * scale[c] + shift[c]`` applied to a convolution's result ``y`` (float64 factors)."""

    scale: torch.Tensor
    shift: torch.Tensor
    absorbed: tuple[Node, ...]  # fx nodes whose work the map does (the batch norm / hardsigmoid)

    def apply(self, y: torch.Tensor) -> torch.Tensor:
        """The mapped result in ``y``'s dtype (what the folded convolution computes, up to rounding)."""
        view = (1, -1) + (1,) * (y.dim() - 2)
        return (y.double() * self.scale.view(view) + self.shift.view(view)).to(y.dtype)


def _float_constant(ep: ExportedProgram, a: object) -> torch.Tensor | None:
    t = constant_tensor(ep, a)
    return t if t is not None and t.is_floating_point() else None


def _foldable(ep: ExportedProgram, conv: Node) -> bool:
    """A forward 1-d / 2-d convolution with constant float weights and bias (or none), one reader."""
    if not is_call(conv, aten.convolution.default) or len(conv.users) != 1:
        return False
    w, bias = conv.args[1], conv.args[2]
    weight = _float_constant(ep, w)
    transposed = conv.args[6] if len(conv.args) > 6 else conv.kwargs.get("transposed", False)
    return (
        weight is not None
        and weight.dim() in (3, 4)
        and not transposed
        and (bias is None or _float_constant(ep, bias) is not None)
    )


def _per_channel(ep: ExportedProgram, a: object, c: int, fill: float) -> torch.Tensor | None:
    """Float64 ``[C]`` data of constant ``a`` (``fill`` for an absent one), None when not a constant."""
    if a is None:
        return torch.full((c,), fill, dtype=torch.float64)
    t = _float_constant(ep, a)
    return t.detach().double().reshape(-1) if t is not None and t.numel() == c else None


def _batch_norm_map(ep: ExportedProgram, conv: Node, bn: Node, c: int) -> ChannelAffine | None:
    if bn.args[0] is not conv or not all(is_call(u, operator.getitem) and u.args[1] == 0 for u in bn.users):
        return None
    gamma, beta, mean, var = (_per_channel(ep, a, c, f) for a, f in zip(bn.args[1:5], (1.0, 0.0, 0.0, 1.0)))
    if gamma is None or beta is None or mean is None or var is None:
        return None
    scale = gamma / torch.sqrt(var + float(bn.args[6]))
    return ChannelAffine(scale, beta - mean * scale, (bn,))


def fold_conv_epilogues(ep: ExportedProgram) -> int:
    """Fold batch norms and hardsigmoids into the convolutions they read (module doc); returns how many."""
    graph, folded = ep.graph, 0
    for conv in list(graph.nodes):
        if not _foldable(ep, conv):
            continue
        (reader,) = conv.users
        c = int(conv.args[1].meta["val"].shape[0])
        if is_call(reader, aten._native_batch_norm_legit_no_training.default):
            affine = _batch_norm_map(ep, conv, reader, c)
            if affine is None:
                continue
            for item in list(reader.users):
                item.replace_all_uses_with(conv)
                graph.erase_node(item)
            graph.erase_node(reader)
        elif is_call(reader, aten.hardsigmoid.default):
            affine = ChannelAffine(
                torch.full((c,), 1 / 6, dtype=torch.float64), torch.full((c,), 0.5, dtype=torch.float64), (reader,)
            )
            with graph.inserting_after(reader):
                clamp = graph.call_function(edge_op(reader, aten.hardtanh.default), (conv, 0.0, 1.0))
            replace_node(reader, clamp)
        else:
            continue
        conv.meta[CHANNEL_AFFINE] = affine
        folded += 1
    return folded


__all__ = ["CHANNEL_AFFINE", "ChannelAffine", "fold_conv_epilogues"]
