"""Normalization: inference batch norm -> MPSBatchNorm, layer norm -> MPSLayerNorm, group norm and
instance norm (batch statistics) -> MPSLayerNorm.

The device sets batch norm's second output to the running mean and never sets the third,
and writes the variance (not rstd) into layer norm's third output (semantics §5.13): those
outputs may only be lowered when nothing reads them. Missing affine parameters become
constant ones / zeros (the device dereferences id -1).

Group norm (``native_group_norm``) is MPSLayerNorm over the last axis of the ``[N, G, C/G * HxW]``
view (population variance, ``(x - mean) / sqrt(var + eps)``: torch's formula) with scalar unit
weight and zero bias constants, then the per-channel affine as MPSMul / MPSAdd over ``[N, C, HxW]``.
Its mean / rstd outputs are never lowered.

Batch statistics (``_native_batch_norm_legit.no_stats``: what instance norm decomposes into, on the
``[1, N * C, *spatial]`` view of its input, and a batch norm in training mode without running stats)
are the same MPSLayerNorm over the last axis: the input ``[B, C, *rest]`` is viewed as ``[C, B * R]``
(``B == 1``: a view; else channels moved first by one MPSPermute), normalised with unit / zero scalar
constants, the per-channel affine applied as MPSMul / MPSAdd over ``[C, 1]``, and the result viewed
(and permuted) back. Population variance and ``(x - mean) / sqrt(var + eps)`` are torch's formula; its
mean / rstd outputs are never lowered.

A batch norm whose input is a convolution read by nothing else, with constant parameters, is folded
into that convolution's weights and bias (``convolution`` module doc) and emits nothing.
"""

from __future__ import annotations

import math
import operator

import torch
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.serialization.generated import nodes as N

from ._util import is_float, shape, val
from .emit import binary, permute, view
from .registry import Lowering

aten = torch.ops.aten


def _used_outputs(node: Node) -> set[int]:
    used = set()
    for user in node.users:
        if user.target is operator.getitem:
            if user.users:
                used.add(user.args[1])
        else:
            used.update((0, 1, 2))
    return used


def _check(bad_outputs: dict[int, str]):
    def check(node: Node):
        if not is_float(node.args[0]):
            return "normalization of a non-float tensor"
        for index in sorted(_used_outputs(node)):
            if index in bad_outputs:
                return bad_outputs[index]
        dts = {val(a).dtype for a in node.args if isinstance(a, Node)}
        if len(dts) != 1:
            return f"mixed dtypes {sorted(map(str, dts))}; the device does not promote here"
        return None

    return check


def _param(b: GraphBuilder, node: Node | None, size: list[int], fill: float, dtype: torch.dtype) -> int:
    if isinstance(node, Node):
        return b.id(node)
    return b.constant(torch.full(size, fill, dtype=torch.float32), dtype=dtype)


def _batch_norm(node: Node, b: GraphBuilder) -> None:
    x, weight, bias, mean, var, momentum, eps = node.args[:7]
    c = shape(x)[1]
    dt = b.dtype(x)
    # outputs 1 and 2 are empty tensors in eval graphs; on the device they are [C] statistics
    out, stat2, stat3 = b.new_value(dt, shape(x)), b.new_value(dt, [c]), b.new_value(dt, [c])
    b.ids[node] = (out, stat2, stat3)
    b.emit(
        N.MPSBatchNorm(
            input_id=b.id(x),
            mean_id=b.id(mean),
            var_id=b.id(var),
            weight_id=_param(b, weight, [c], 1.0, dt),
            bias_id=_param(b, bias, [c], 0.0, dt),
            momentum=float(momentum),
            epsilon=float(eps),
            output1_id=out,
            output2_id=stat2,
            output3_id=stat3,
        )
    )


def _layer_norm(node: Node, b: GraphBuilder) -> None:
    x, normalized_shape, weight, bias, eps = node.args[:5]
    dt = b.dtype(x)
    ns = [int(d) for d in normalized_shape]
    out, mean, third = b.outs(node)
    b.emit(
        N.MPSLayerNorm(
            input1_id=b.id(x),
            normalized_shape=ns,
            weight_id=_param(b, weight, ns, 1.0, dt),
            bias_id=_param(b, bias, ns, 0.0, dt),
            eps=float(eps),
            output1_id=out,
            output2_id=mean,
            output3_id=third,
        )
    )


def _group_norm(node: Node, b: GraphBuilder) -> None:
    x, weight, bias, n, c, hxw, groups, eps = node.args[:8]
    n, c, hxw, groups = int(n), int(c), int(hxw), int(groups)
    dt = b.dtype(x)
    k = c // groups * hxw
    xv = view(b, b.id(x), [n, groups, k])
    normed, mean, var = b.new_value(dt, [n, groups, k]), b.new_value(dt, [n, groups, 1]), b.new_value(dt, [n, groups, 1])
    b.emit(
        N.MPSLayerNorm(
            input1_id=xv,
            normalized_shape=[k],
            weight_id=b.scalar(1.0, dt),
            bias_id=b.scalar(0.0, dt),
            eps=float(eps),
            output1_id=normed,
            output2_id=mean,
            output3_id=var,
        )
    )
    y = view(b, normed, [n, c, hxw])
    if isinstance(weight, Node):
        y = binary(b, N.MPSMul, y, view(b, b.id(weight), [c, 1]))
    if isinstance(bias, Node):
        y = binary(b, N.MPSAdd, y, view(b, b.id(bias), [c, 1]))
    out = b.new_value(dt, shape(x))
    view(b, y, shape(x), out=out)
    b.ids[node] = (out, mean, var)


def _batch_stats_norm(node: Node, b: GraphBuilder) -> None:
    x, weight, bias = node.args[:3]
    eps = float(node.args[5])
    s = shape(x)
    n, c, rest = s[0], s[1], s[2:]
    k = n * math.prod(rest)
    dt = b.dtype(x)
    vid = b.id(x)
    channels_first = [c, n] + rest
    if n != 1:
        vid = permute(b, vid, [1, 0] + list(range(2, len(s))))
    xv = view(b, vid, [c, k])
    normed, mean, var = b.new_value(dt, [c, k]), b.new_value(dt, [c, 1]), b.new_value(dt, [c, 1])
    b.emit(
        N.MPSLayerNorm(
            input1_id=xv,
            normalized_shape=[k],
            weight_id=b.scalar(1.0, dt),
            bias_id=b.scalar(0.0, dt),
            eps=eps,
            output1_id=normed,
            output2_id=mean,
            output3_id=var,
        )
    )
    y = normed
    if isinstance(weight, Node):
        y = binary(b, N.MPSMul, y, view(b, b.id(weight), [c, 1]))
    if isinstance(bias, Node):
        y = binary(b, N.MPSAdd, y, view(b, b.id(bias), [c, 1]))
    out = b.new_value(dt, s)
    if n == 1:
        view(b, y, s, out=out)
    else:
        permute(b, view(b, y, channels_first), [1, 0] + list(range(2, len(s))), out=out)
    b.ids[node] = (out, mean, var)


def _batch_stats_check(node: Node):
    reason = _check({1: "batch norm mean output read (not lowered)", 2: "batch norm rstd output read (not lowered)"})(node)
    if reason:
        return reason
    if len(shape(node.args[0])) < 2:
        return "batch norm of a rank < 2 tensor"
    return None


def _group_norm_check(node: Node):
    reason = _check({1: "group norm mean output read (not lowered)", 2: "group norm rstd output read (not lowered)"})(node)
    if reason:
        return reason
    if len(shape(node.args[0])) < 2:
        return "group norm of a rank < 2 tensor"
    return None


LOWERINGS = [
    Lowering(
        (aten._native_batch_norm_legit_no_training.default,),
        _batch_norm,
        _check(
            {
                1: "batch norm statistics output read (the device returns the running mean there)",
                2: "batch norm third output read (the device never sets it)",
            }
        ),
        generic="args",
    ),
    Lowering(
        (aten.native_layer_norm.default,),
        _layer_norm,
        _check({2: "layer norm rstd output read (the device returns the variance there)"}),
    ),
    Lowering((aten.native_group_norm.default,), _group_norm, _group_norm_check),
    Lowering((aten._native_batch_norm_legit.no_stats,), _batch_stats_norm, _batch_stats_check),
]
