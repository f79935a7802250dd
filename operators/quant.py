"""Weight-only quantization: dequantize ops lowered to nodes the device computes exactly.

Recognised (edge graphs of ``torchao.quantization.quantize_`` 0.18 and the older
``quantized_decomposed`` flows), when the quantized tensor is a placeholder:

- ``torchao.dequantize_affine(q, block_size, scale, zero_point, input_dtype, quant_min, quant_max,
  output_dtype=)``: ``out = (q - zero_point) * scale`` block-wise (``IntxWeightOnlyConfig``: int8
  ``q [N, K]``, ``block_size [1, G]`` or ``[1, K]`` (PerAxis(0)), ``scale``/``zero_point [N, K/G]``).
- ``quantized_decomposed.dequantize_per_channel_group(q, scales, zero_points, quant_min, quant_max,
  dtype, group_size, output_dtype)``: the same with ``block_size [1, group_size]``.

Two lowerings, chosen in ``lower`` from the constant data (``check`` only looks at metadata):

**int4** (``quant_max - quant_min <= 15``, 2-D, blocks ``[1, g]``, ``q``/scales/zero points blob
constants): ``MPSDequantizePerChannelGroup`` (semantics §5.17; **needs macOS 15 / iOS 18** on the
device, older systems fail at init with NotImplemented). The weight is packed on the host
(``pack_int4``: ``[N, K/2]`` bytes, even ``k`` in the low nibble, two's complement), 0.5 byte per
element; the int8 weight constant is dropped from the blob once no node reads it (shared weights
are packed once). The device ignores zero points and always outputs float16, so:

- ranges other than ``[-8, 7]`` (e.g. uint4 ``[0, 15]``) are shifted: ``q' = q - c``,
  ``zp' = zp - c`` with ``c = quant_min + 8`` (``q - zp`` is unchanged);
- scales become a float16 constant ``s * 2**e`` (``e`` a power-of-two exponent, 0 unless the
  scales would leave the float16 normal range), so the device computes ``f16(q' * s * 2**e)``;
- the output is cast to the compute dtype (float32 graphs), multiplied by ``2**-e`` (exact) and,
  when any ``zp'`` is non-zero, ``zp' * s`` is subtracted per group (a ``[N, G, 1]`` constant
  broadcast over a ``[N, G, K/G]`` view): ``out = q'*s - zp'*s = (q - zp) * s``. Zero points are
  never dropped. The only rounding beyond eager is float16 rounding of ``s`` and of ``q' * s``
  (relative 2**-11 at most per weight).

Shapes the device layout cannot take (``N % 8 != 0`` or ``K % 32 != 0``, the limits of the MPS
int4 pack the upstream runtime was built and tested against) stay on CPU with a reason.

**int8 / generic** (any other range, or non-constant operands): ``MPSView`` into the reduction
shape, ``MPSCast`` to the compute dtype, ``MPSSub`` of the zero point (skipped when the constant is
all zero), ``MPSMul`` by the scale, ``MPSView`` back: the same operations as eager, so float32
graphs reproduce eager exactly. The weight stays an int8 constant, 1 byte per element.

Activation quantization (8da4w: ``torchao.choose_qparams_affine`` / ``quantize_affine`` and the
dequantize of their result, ``quantized_decomposed`` per-token ops) stays on CPU with a reason: the
device has no min/max reductions for the qparams and its ``round`` does not round half to even.
They are never turned into identities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines torch.ops.quantized_decomposed)
from torch.fx import Node

from mps_backend.builder import GraphBuilder
from mps_backend.pages import PageReleaser
from mps_backend.serialization.generated import nodes as N
from mps_backend.serialization.model import DataType

from ._util import arg, shape, val
from .emit import binary, vdtype, view, vshape
from .registry import Lowering, op_key

try:  # torchao registers torch.ops.torchao (executorch depends on it; tolerate its absence)
    import torchao.quantization.quant_primitives as _tao_primitives
except ImportError:  # pragma: no cover
    _tao_primitives = None

qd = torch.ops.quantized_decomposed

#: the device's int4 layout constraints (docs/upstream-defects.md §5.2 #8)
INT4_N_MULTIPLE, INT4_K_MULTIPLE = 8, 32


def int4_layout_fits(n: int, k: int) -> bool:
    """Whether an int4 weight ``[N, K]`` fits the device's packed layout."""
    return n % INT4_N_MULTIPLE == 0 and k % INT4_K_MULTIPLE == 0


_F16_MAX_EXP, _F16_MIN_NORMAL_EXP = 15, -14


@dataclass(frozen=True)
class DequantSpec:
    """One dequantize node: ``out = (q - zero) * scale`` over blocks of ``block`` elements."""

    q: Node
    scale: Node
    zero: Optional[Node]
    block: tuple[int, ...]
    quant_min: int
    quant_max: int
    out_dtype: torch.dtype

    @property
    def shape(self) -> list[int]:
        return shape(self.q)

    @property
    def is_4bit(self) -> bool:
        return self.quant_max - self.quant_min <= 15

    def reduction_shapes(self) -> tuple[list[int], list[int]]:
        """(shape of q split into blocks, shape of scale/zero broadcast over it): torchao's
        ``_get_reduction_params``."""
        split, after = [], []
        for size, blk in zip(self.shape, self.block):
            if blk != size and blk > 1:
                split += [size // blk, blk]
                after += [size // blk, 1]
            else:
                split.append(size)
                after.append(1 if blk != 1 else size)
        return split, after


def _qrange(dtype: torch.dtype, qmin, qmax) -> tuple[int, int] | str:
    if qmin is not None and qmax is not None:
        return int(qmin), int(qmax)
    bounds = getattr(_tao_primitives, "_DTYPE_TO_QVALUE_BOUNDS", {})
    if dtype in bounds:
        lo, hi = bounds[dtype]
    else:
        try:
            lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
        except (TypeError, ValueError):
            return f"quantized dtype {dtype} without quant_min/quant_max"
    return int(lo if qmin is None else qmin), int(hi if qmax is None else qmax)


def _affine_spec(node: Node) -> DequantSpec | str:
    q, block, scale, zero = (arg(node, i, n) for i, n in enumerate(("input", "block_size", "scale", "zero_point")))
    rng = _qrange(arg(node, 4, "input_dtype"), arg(node, 5, "quant_min"), arg(node, 6, "quant_max"))
    if isinstance(rng, str):
        return rng
    if not isinstance(q, Node) or not isinstance(scale, Node):
        return "dequantize_affine with a non-tensor input or scale"
    if zero is not None and not isinstance(zero, Node):
        return "dequantize_affine with a non-tensor zero point"
    return DequantSpec(q, scale, zero, tuple(int(b) for b in block), *rng, val(node).dtype)


def _group_spec(node: Node) -> DequantSpec | str:
    q, scales, zero = node.args[0], node.args[1], arg(node, 2, "zero_points")
    if not isinstance(q, Node) or not isinstance(scales, Node) or not isinstance(zero, (Node, type(None))):
        return "dequantize_per_channel_group with non-tensor operands"
    if val(q).dim() != 2:
        return "dequantize_per_channel_group of a non-2-D tensor"
    k = shape(q)[1]
    gs = int(arg(node, 6, "group_size", 128))
    if gs > k and list(shape(scales))[-1:] == [1]:  # eager's GPTQ single-column rule
        gs = k
    if gs <= 1 or k % gs:
        return f"group_size {gs} does not divide the {k} columns"
    return DequantSpec(q, scales, zero, (1, gs), int(arg(node, 3, "quant_min")), int(arg(node, 4, "quant_max")), val(node).dtype)


_SPECS = {}  # op overload -> spec parser (filled below)


def spec_of(node: Node) -> DequantSpec | str:
    return _SPECS[op_key(node.target)](node)


def _dequant_check(node: Node):
    spec = spec_of(node)
    if isinstance(spec, str):
        return spec
    q = spec.q
    if q.op != "placeholder":
        return (
            f"dequantizes the computed tensor {q.name} (dynamic activation quantization, e.g. 8da4w): "
            "kept on CPU with its choose_qparams/quantize ops"
        )
    qt = val(q)
    if qt.dtype.is_floating_point or qt.dtype == torch.bool:
        return f"quantized tensor of dtype {qt.dtype}"
    if not val(node).dtype.is_floating_point:
        return f"dequantize to {val(node).dtype}"
    dims = spec.shape
    if len(spec.block) != len(dims) or any(b < 1 or d % b for d, b in zip(dims, spec.block)):
        return f"block size {list(spec.block)} does not tile the quantized shape {dims}"
    _, after = spec.reduction_shapes()
    for what, t in (("scale", spec.scale), ("zero point", spec.zero)):
        if t is not None and val(t).numel() != math.prod(after):
            return f"{what} of shape {list(val(t).shape)} does not match blocks {list(spec.block)} of {dims}"
    if spec.is_4bit:
        if len(dims) != 2 or spec.block[0] != 1:
            return (
                f"4-bit weight {dims} with block size {list(spec.block)}: the device int4 dequantize takes 2-D "
                "weights in [1, group] blocks"
            )
        n, k = dims
        if not int4_layout_fits(n, k):
            return (
                f"int4 weight [N={n}, K={k}]: the MPS int4 layout needs N % {INT4_N_MULTIPLE} == 0 and K % {INT4_K_MULTIPLE} == 0"
            )
    return None


# ---- constants derived on the host ------------------------------------------------------------


#: int8 elements packed or scanned at once (bounds the temporaries of a large weight, e.g. an lm_head)
PACK_BLOCK_ELEMENTS = 1 << 22


def _row_blocks(q: torch.Tensor, pages: Optional[PageReleaser] = None) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, rows) blocks of a 2-D ``q`` of about PACK_BLOCK_ELEMENTS each; with ``pages``, each
    block's pages are handed back once used (a weight mapped from a file: mps_backend.pages)."""
    rows = max(1, PACK_BLOCK_ELEMENTS // max(1, q.shape[1]))
    for r in range(0, q.shape[0], rows):
        block = q[r : r + rows]
        yield r, block
        if pages is not None:
            pages.release(block)


def pack_int4(q: torch.Tensor, pages: Optional[PageReleaser] = None) -> torch.Tensor:
    """int8 values in [-8, 7], shape ``[N, K]`` (K even) -> the device bytes, uint8 ``[N, K/2]``:
    element ``(n, k)`` in byte ``n*K/2 + k//2``, low nibble for even ``k``, high nibble for odd ``k``,
    two's complement (semantics §5.17). Packed a block of rows at a time (``pages``: as
    :func:`_row_blocks`)."""
    if q.dim() != 2 or q.shape[1] % 2 or q.dtype != torch.int8:
        raise ValueError(f"pack_int4 takes int8 [N, K] with K even, got {q.dtype}{list(q.shape)}")
    out = torch.empty(q.shape[0], q.shape[1] // 2, dtype=torch.uint8)
    for r, block in _row_blocks(q, pages):
        u = block.contiguous().view(torch.uint8) & 0xF
        out[r : r + block.shape[0]] = u[:, 0::2] | (u[:, 1::2] << 4)
    return out


def _rescale_exponent(s: torch.Tensor) -> int:
    """e such that ``8 * |s| * 2**e`` stays in float16's normal range (0 when it already does)."""
    a = s.abs()
    top = a.max().item() * 8
    nonzero = a[a > 0]
    if top == 0 or nonzero.numel() == 0:
        return 0
    if top <= 2.0**_F16_MAX_EXP and nonzero.min().item() >= 2.0**_F16_MIN_NORMAL_EXP:
        return 0
    return _F16_MAX_EXP - math.ceil(math.log2(top))


def _const(b: GraphBuilder, node: Optional[Node]) -> Optional[torch.Tensor]:
    """The blob data bound to an fx argument, or None when it is not a constant."""
    if node is None:
        return None
    vid = b.ids.get(node)
    return b.constants.get(vid) if isinstance(vid, int) else None


def _release(b: GraphBuilder, fx_arg: Optional[Node], user: Node) -> None:
    """``user`` does not read ``fx_arg``'s blob constant on the device: once no user does, drop it."""
    if fx_arg is None or fx_arg.op != "placeholder" or _const(b, fx_arg) is None:
        return
    done = b.memo(("quant.unread", fx_arg), set)
    done.add(user)
    if done >= set(fx_arg.users):
        b.drop_constant(b.ids[fx_arg])


# ---- lowerings --------------------------------------------------------------------------------


def _int4_plan(spec: DequantSpec, b: GraphBuilder):
    """(q', zp', scale f32 [N, G]) shifted into [-8, 7], or None when the data is not constant or
    not in the declared range (then the generic path computes it)."""
    q, s = _const(b, spec.q), _const(b, spec.scale)
    zero = _const(b, spec.zero)
    if q is None or s is None or (spec.zero is not None and zero is None):
        return None
    n, k = spec.shape
    shift = spec.quant_min + 8
    for _, block in _row_blocks(q, b.constants.pages) if q.dim() == 2 else [(0, q)]:
        if block.numel() and (block.min().item() < spec.quant_min or block.max().item() > spec.quant_max):
            return None
    g = k // spec.block[1]
    q = (q.to(torch.int16) - shift).to(torch.int8) if shift else q.to(torch.int8)
    # float64 holds integer and float zero points exactly; q - zp == q' - zp'
    zp = (zero.reshape(n, g).double() if zero is not None else torch.zeros(n, g, dtype=torch.float64)) - shift
    return q, zp, s.reshape(n, g).float()


def _lower_int4(node: Node, spec: DequantSpec, b: GraphBuilder, plan) -> None:
    q, zp, s = plan
    n, k = spec.shape
    g = s.shape[1]
    shift = spec.quant_min + 8
    qvid = b.memo(("quant.int4", b.ids[spec.q], shift), lambda: b.int4_constant(pack_int4(q, b.constants.pages), [n, k]))
    e = _rescale_exponent(s)
    svid = b.ids[spec.scale]
    sconst = b.graph.values[svid]
    if not (e == 0 and sconst.datatype == DataType.float16 and list(sconst.dims) == [n, g]):
        svid = b.memo(("quant.int4.scales", svid, e), lambda: b.constant((s * 2.0**e).to(torch.float16), dtype=torch.float16))
    out16 = b.new_value(torch.float16, [n, k])
    b.emit(
        N.MPSDequantizePerChannelGroup(
            input1_id=qvid,
            scales_id=svid,
            zero_points_id=-1,
            quant_min=-8,
            quant_max=7,
            dtype=int(DataType.int4),
            group_size=k // g,
            output_dtype=int(DataType.float16),
            output_id=out16,
        )
    )
    dt = b.result_dtype(node, spec.out_dtype)
    x = out16 if dt == torch.float16 else b.cast(out16, dt)
    if e:
        x = binary(b, N.MPSMul, x, b.scalar(2.0**-e, dt))
    if bool(zp.any()):
        zs = b.memo(
            ("quant.int4.zs", b.ids.get(spec.zero), b.ids[spec.scale], shift, dt),
            lambda: b.constant((zp * s.double()).reshape(n, g, 1), dtype=dt),
        )
        x = binary(b, N.MPSSub, view(b, x, [n, g, k // g]), zs)
        x = view(b, x, [n, k])
    b.alias(node, x)
    for a in (spec.q, spec.scale, spec.zero):
        if a is not spec.scale or b.ids[spec.scale] != svid:
            _release(b, a, node)


def _lower_generic(node: Node, spec: DequantSpec, b: GraphBuilder) -> None:
    dt = b.result_dtype(node, spec.out_dtype)
    split, after = spec.reduction_shapes()
    x = b.id(spec.q)
    if split != spec.shape:
        x = view(b, x, split)
    x = b.cast(x, dt)
    zero = _const(b, spec.zero)
    if spec.zero is not None and (zero is None or bool(zero.any())):
        z = b.id(spec.zero)
        if vshape(b, z) != after:
            z = view(b, z, after)
        x = binary(b, N.MPSSub, x, z if vdtype(b, z) == dt else b.cast(z, dt))
    elif spec.zero is not None:  # an all-zero constant: q - 0 == q
        _release(b, spec.zero, node)
    s = b.id(spec.scale)
    x = binary(b, N.MPSMul, x, s if vshape(b, s) == after else view(b, s, after))
    if vdtype(b, x) != dt:
        x = b.cast(x, dt)
    b.alias(node, x if split == spec.shape else view(b, x, spec.shape))


def _lower_dequant(node: Node, b: GraphBuilder) -> None:
    spec = spec_of(node)
    assert isinstance(spec, DequantSpec), spec  # the support check accepted the node
    plan = _int4_plan(spec, b) if spec.is_4bit else None
    if plan is not None:
        _lower_int4(node, spec, b, plan)
    else:
        _lower_generic(node, spec, b)


_ACTIVATION_REASON = (
    "activation quantization (dynamic, e.g. 8da4w) stays on CPU: the device has no min/max "
    "reductions for the qparams and its round() does not round half to even"
)


def _activation_check(node: Node):
    return _ACTIVATION_REASON


def _never(node: Node, b: GraphBuilder) -> None:
    raise RuntimeError(_ACTIVATION_REASON)


_SPECS[qd.dequantize_per_channel_group.default] = _group_spec
_ACTIVATION_OPS = [
    qd.quantize_per_token.default,
    qd.dequantize_per_token.default,
    qd.choose_qparams_per_token_asymmetric.default,
    qd.choose_qparams_per_token.default,
]
if _tao_primitives is not None:
    _SPECS[torch.ops.torchao.dequantize_affine.default] = _affine_spec
    _ACTIVATION_OPS += [torch.ops.torchao.quantize_affine.default, torch.ops.torchao.choose_qparams_affine.default]

LOWERINGS = [
    Lowering(tuple(_SPECS), _lower_dequant, _dequant_check),
    Lowering(tuple(_ACTIVATION_OPS), _never, _activation_check),
]
