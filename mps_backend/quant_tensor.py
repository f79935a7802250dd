"""A weight quantized in groups of columns, each group with a float scale and an optional float offset,
stored the way the device reads it.

    w = GroupQuantizedTensor(q, scale, bits=4, packed=True, dtype=torch.float16, offset=offset)
    w.dequantize()   # [N, K]: q * scale + offset, per group of K / scale.shape[1] columns

``qdata`` is int8 ``[N, K]``, ``scale`` and ``offset`` ``[N, G]`` (float16, or float32 when a value is
beyond float16's range), one per group of ``K / G`` columns of a row. A value is ``q * scale + offset``
(``offset`` None: ``q * scale``). The offsets can instead be computed from constants the way llama.cpp's
K-quants store them (``minimums``, ``minimum_scale``, ``shift``): ``offset = shift * scale + minimums *
minimum_scale`` with ``minimums`` int8 ``[N, G]`` and ``minimum_scale`` ``[N, S]`` (float16), one per
``G / S`` groups (a 256-column super-block), computed in float32 from the stored scale and rounded once
to the tensor's dtype: 1 + 2 / (G / S) bytes per group instead of a float16 offset's 2 (Q4_K kept from a
GGUF: ``d sc_j`` the scale, ``m_j`` the minimums, ``-dmin`` their scale, ``shift`` 8 for its values stored
shifted into [-8, 7]). As a module's weight it computes as the device does:

- ``linear``: ``dequantize()`` then the linear. ``dequantize()`` is ``torchao.dequantize_affine`` (no
  zero point) on ``qdata``, cast to the tensor's dtype, plus the offset broadcast over each group: in
  the exported graph ``dequantize_affine``, a cast, a ``view`` to ``[N, G, K/G]``, an ``add`` of the
  ``[N, G, 1]`` offsets and a ``view`` back (computed offsets: casts to float32, a ``mul`` of the
  ``[N, S, G/S]`` minimums by the ``[N, S, 1]`` minimum scales, an ``add`` of the scales times ``shift``
  (its ``alpha``) and a cast to the dtype: nodes on constants alone, ``K / 32`` values a row, that the
  program computes once per step before the weight's matmul). ``packed`` (values in [-8, 7]): the dequantize declares the
  int4 range and yields float16, so ``mps_backend.operators.quant`` lowers it to
  ``MPSDequantizePerChannelGroup`` on the packed 4-bit weight (0.5 byte a weight), which computes
  ``float16(q * scale)`` exactly as the eager product here. Otherwise (int8 storage, 1 byte a weight)
  the generic lowering casts and multiplies in the tensor's dtype, as here.
- ``embedding``: the rows taken and their scales (and offsets) are gathered, then only those rows are
  dequantized with the same arithmetic: a table tied to the output head is one constant the program
  reads both ways (a gather of rows, and the head's dequantize). A table read by a gather is stored
  unpacked (int8): the device's int4 dequantize takes only a whole constant weight.

:func:`affine_groups` and :func:`symmetric_groups` make the data from float weights.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

import torch
from torchao.utils import TorchAOBaseTensor

from mps_backend.pages import ScratchFile

aten = torch.ops.aten

#: the float16 range: a scale or offset beyond it is stored in float32
F16_MAX = 65504.0


class GroupQuantizedTensor(TorchAOBaseTensor):
    """``[N, K]`` weight: ``qdata`` int8 ``[N, K]``, ``scale`` ``[N, G]``, ``offset`` ``[N, G]`` or None,
    or the offsets computed from ``minimums`` int8 ``[N, G]``, ``minimum_scale`` ``[N, S]`` and ``shift``;
    ``bits``: the width of the values (4: in [-8, 7]; 8: int8, any of [-128, 127]); ``packed``: 4-bit
    values the device's int4 dequantize reads packed (module docstring)."""

    tensor_data_names = ["qdata", "scale"]
    tensor_attribute_names = ["bits", "packed", "dtype"]
    # "minimums", not "minimum" (a torch.Tensor method): named so, torch.export 2.14 refused the program
    # ("We found a fake tensor in the exported program constant's list")
    optional_tensor_data_names = ["offset", "minimums", "minimum_scale"]
    optional_tensor_attribute_names = ["shift"]

    def __new__(cls, qdata, scale, bits, packed, dtype, offset=None, minimums=None, minimum_scale=None, shift=0):
        return torch.Tensor._make_wrapper_subclass(cls, qdata.shape, dtype=dtype, device=qdata.device, requires_grad=False)

    def __init__(self, qdata, scale, bits, packed, dtype, offset=None, minimums=None, minimum_scale=None, shift=0):
        super().__init__()
        if qdata.dtype != torch.int8 or qdata.dim() != 2 or scale.dim() != 2 or scale.shape[0] != qdata.shape[0]:
            raise ValueError(f"group quantized weight: qdata int8 [N, K] and scale [N, G], got {qdata.dtype}{list(qdata.shape)}")
        if qdata.shape[1] % max(1, scale.shape[1]) or (offset is not None and offset.shape != scale.shape):
            raise ValueError(f"group quantized weight: {scale.shape[1]} groups do not tile {qdata.shape[1]} columns")
        if packed and bits != 4:
            raise ValueError("only 4-bit values are packed")
        if (minimums is None) != (minimum_scale is None) or (minimums is not None and offset is not None):
            raise ValueError("group quantized weight: an offset, or minimums with their minimum scale, not both")
        if minimums is not None and (
            minimums.dtype != torch.int8
            or minimums.shape != scale.shape
            or minimum_scale.dim() != 2
            or minimum_scale.shape[0] != scale.shape[0]
            or scale.shape[1] % max(1, minimum_scale.shape[1])
        ):
            raise ValueError(
                f"group quantized weight: minimums int8 {list(scale.shape)} and minimum scale [N, S] with S dividing "
                f"{scale.shape[1]}, got {minimums.dtype}{list(minimums.shape)} and {list(minimum_scale.shape)}"
            )
        self.qdata, self.scale, self.offset = qdata, scale, offset
        self.minimums, self.minimum_scale, self.shift = minimums, minimum_scale, int(shift)
        self.bits, self.packed = bits, packed

    @property
    def group_size(self) -> int:
        return self.qdata.shape[1] // self.scale.shape[1]

    def _quantization_type(self) -> str:
        offset = "offset" if self.offset is not None else "no offset"
        if self.minimums is not None:
            offset = (
                f"offset {self.shift} scale + minimums * minimum scale (per {self.group_size * self.groups_per_minimum_scale})"
            )
        return f"int{self.bits}, group {self.group_size}, {offset}" + (", packed" if self.packed else "")

    @property
    def groups_per_minimum_scale(self) -> int:
        return self.scale.shape[1] // self.minimum_scale.shape[1] if self.minimum_scale is not None else 1

    def parts(self) -> tuple:
        """The constructor's arguments after ``qdata`` (a copy: ``type(w)(w.qdata, *w.parts())``)."""
        return (self.scale, self.bits, self.packed, self.dtype, self.offset, self.minimums, self.minimum_scale, self.shift)

    def stored_bytes(self) -> int:
        """Bytes of the values (packed int4: half a byte each), scales and offsets (or minimums) as stored."""
        extra = (self.scale, self.offset, self.minimums, self.minimum_scale)
        return self.qdata.numel() // (2 if self.packed else 1) + sum(t.numel() * t.element_size() for t in extra if t is not None)

    def _offsets(self, scale, offset, minimums, minimum_scale) -> Optional[torch.Tensor]:
        """The offsets ``[..., G, 1]`` of groups whose scales are ``scale [..., G]`` (the same rows of
        ``offset``, ``minimums`` and ``minimum_scale``), in the tensor's dtype: stored, or computed in float32
        and rounded once (module docstring)."""
        if minimums is None:
            return None if offset is None else offset.to(self.dtype).unsqueeze(-1)
        *lead, g = minimums.shape
        s = minimum_scale.shape[-1]
        off = minimums.view(*lead, s, g // s).to(torch.float32) * minimum_scale.to(torch.float32).unsqueeze(-1)
        if self.shift:
            off = torch.add(off, scale.to(torch.float32).view(*lead, s, g // s), alpha=self.shift)
        return off.to(self.dtype).view(*lead, g, 1)

    def product_dtype(self) -> torch.dtype:
        """The dtype ``q * scale`` is computed in: float16 for packed values with float16 scales (what
        the device's int4 dequantize yields), else the tensor's dtype."""
        return torch.float16 if self.packed and self.scale.dtype == torch.float16 else self.dtype

    def dequantize(self) -> torch.Tensor:
        """The ``[N, K]`` weight in the tensor's dtype (module docstring)."""
        n, k = self.qdata.shape
        groups = self.scale.shape[1]
        lo, hi = (-8, 7) if self.packed else (-128, 127)
        w = torch.ops.torchao.dequantize_affine(
            self.qdata, [1, k // groups], self.scale, None, torch.int8, lo, hi, output_dtype=self.product_dtype()
        ).to(self.dtype)
        offset = self._offsets(self.scale, self.offset, self.minimums, self.minimum_scale)
        if offset is None:
            return w
        return (w.view(n, groups, k // groups) + offset).view(n, k)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` (any shape) dequantized: ``[*index.shape, K]``, equal to ``dequantize()[index]``."""
        k, groups = self.qdata.shape[1], self.scale.shape[1]
        shape = [*index.shape, groups, k // groups]
        q = torch.nn.functional.embedding(index, self.qdata).view(shape)
        s = torch.nn.functional.embedding(index, self.scale).unsqueeze(-1)
        w = (q.to(self.product_dtype()) * s.to(self.product_dtype())).to(self.dtype)
        groups = (self.scale, self.offset, self.minimums, self.minimum_scale)
        taken = [None if t is None else torch.nn.functional.embedding(index, t) for t in groups]
        offset = self._offsets(*taken)
        if offset is not None:
            w = w + offset
        return w.view(*index.shape, k)

    def to(self, *args, **kwargs):
        """Another dtype or device: the same data, dequantized into that dtype."""
        kw = self._get_to_kwargs(*args, **kwargs)
        move = [t.to(kw["device"]) if t is not None else None for t in (self.qdata, self.scale, self.offset)]
        minimums = [t.to(kw["device"]) if t is not None else None for t in (self.minimums, self.minimum_scale)]
        return GroupQuantizedTensor(move[0], move[1], self.bits, self.packed, kw["dtype"], move[2], *minimums, self.shift)


implements = GroupQuantizedTensor.implements
implements_torch_function = GroupQuantizedTensor.implements_torch_function


@implements(aten.linear.default)
@implements_torch_function(torch.nn.functional.linear)
def _linear(func, types, args, kwargs):
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    return torch.nn.functional.linear(x, w.dequantize(), bias)


@implements_torch_function((torch.Tensor.t, torch.t, torch.Tensor.T.__get__, torch.Tensor.mT.__get__))
def _t(func, types, args, kwargs):
    return transposed(args[0])


@implements_torch_function((torch.Tensor.transpose, torch.transpose))
def _transpose(func, types, args, kwargs):
    w, dims = args[0], [*args[1:3], *kwargs.values()]
    return transposed(w) if sorted(d % 2 for d in dims) == [0, 1] else w


@implements_torch_function((torch.Tensor.permute, torch.permute))
def _permute(func, types, args, kwargs):
    w, dims = args[0], args[1:] if not kwargs else kwargs["dims"]
    dims = list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (list, tuple)) else list(dims)
    return transposed(w) if [d % 2 for d in dims] == [1, 0] else w


@implements_torch_function((torch.Tensor.__matmul__, torch.matmul, torch.Tensor.matmul))
def _matmul(func, types, args, kwargs):
    x, w = args[0], args[1]
    if isinstance(w, TransposedGroups) and not isinstance(x, GroupQuantizedTensor):
        return torch.nn.functional.linear(x, w.untransposed())
    left = x.dequantize() if isinstance(x, GroupQuantizedTensor) else x
    right = w.dequantize() if isinstance(w, GroupQuantizedTensor) else w
    return torch.matmul(left, right)


@implements(aten.embedding.default)
@implements_torch_function(torch.nn.functional.embedding)
def _embedding(func, types, args, kwargs):
    index, w = args[0], args[1]
    if isinstance(w, TransposedGroups):
        return torch.nn.functional.embedding(index, w.dequantize())
    return w.rows(index)


@implements(aten._to_copy.default)
def _to_copy(func, types, args, kwargs):
    return args[0].to(*args[1:], **kwargs)


# defined after the handlers above: a subclass starts with a copy of its parent's tables
class TransposedGroups(GroupQuantizedTensor):
    """``W.T`` of a :class:`GroupQuantizedTensor` ``W`` (``[K, N]``, the same data): what ``x @ W.T``
    (Falcon's ``FalconLinear``) reads. ``x @ W.T`` is ``linear(x, W)``, so the program gets the linear the
    device reads the dequantized weight for as the left operand (``operators/linalg.py``), never a
    weight-sized permute; ``.T`` of it is ``W`` again. Anything else done with it dequantizes."""

    def __new__(cls, qdata, scale, bits, packed, dtype, offset=None, minimums=None, minimum_scale=None, shift=0):
        shape = qdata.shape[::-1]
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=qdata.device, requires_grad=False)

    def untransposed(self) -> GroupQuantizedTensor:
        return GroupQuantizedTensor(self.qdata, *self.parts())

    def dequantize(self) -> torch.Tensor:
        return self.untransposed().dequantize().t()


def transposed(w: GroupQuantizedTensor) -> GroupQuantizedTensor:
    """``w.T`` as a :class:`TransposedGroups` (or, of one, the weight again)."""
    if isinstance(w, TransposedGroups):
        return w.untransposed()
    return TransposedGroups(w.qdata, *w.parts())


# ---- making the data ------------------------------------------------------------------------------


def storage_dtype(w: torch.Tensor) -> torch.dtype:
    """The dtype of the scales and offsets of ``w``'s groups: float16, or float32 when they could leave
    float16's range (a refined offset stays within two ranges of its group: ``5 max |w|`` at most)."""
    if not w.numel():
        return torch.float16
    low, high = torch.aminmax(w.detach())
    return torch.float16 if 5 * max(-float(low), float(high)) <= F16_MAX else torch.float32


def _grouped(w: torch.Tensor, group: int) -> torch.Tensor:
    n, k = w.shape
    if group < 1 or k % group:
        raise ValueError(f"group size {group} does not divide {k} columns")
    return w.detach().float().reshape(n, k // group, group)


#: HQQ's refinement (Badri & Shaji, "Half-Quadratic Quantization of Large Machine Learning Models", 2023):
#: iterations at most, the l_p norm of the error it minimises, its penalty and the penalty's growth
HQQ_ITERATIONS, HQQ_P, HQQ_BETA, HQQ_KAPPA = 20, 0.7, 10.0, 1.01


def _hqq_minimum(x: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, levels: int) -> torch.Tensor:
    """Each group's minimum (the value of level 0) refined for the fixed ``scale``: the zero point
    ``z`` (``x ~ (q - z) * scale``) minimising the l_p error (p < 1: most weights exact, a few far)
    by half-quadratic splitting, stopped when the mean squared error grows."""
    s = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(-1)
    z = (-low / s.squeeze(-1)).unsqueeze(-1)
    beta, best = HQQ_BETA, None
    for _ in range(HQQ_ITERATIONS):
        q = torch.round(x / s + z).clamp(0, levels)
        err = x - (q - z) * s
        mse = float(err.square().mean())
        if best is not None and mse > best[0]:
            break
        best = (mse, z)
        shrunk = torch.sign(err) * torch.relu(err.abs() - err.abs().pow(HQQ_P - 1) / beta)
        z = (q - (x - shrunk) / s).mean(-1, keepdim=True)
        beta *= HQQ_KAPPA
    assert best is not None
    refined = (-best[1].squeeze(-1) * s.squeeze(-1)).clamp(low - (levels * scale), low + levels * scale)
    return torch.where(scale > 0, refined, low)


def _group_range(x: torch.Tensor, bits: int, signed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(value of the lowest level, step) of each group of ``x [N, G, g]`` (float32): its minimum and
    ``(max - min) / (2**bits - 1)`` (llama.cpp's Q4_1 keeps both ends); ``signed``: llama.cpp's Q4_0,
    a step of ``max |x| / 2**(bits-1)`` with the extreme value on the level ``-2**(bits-1)`` (its highest
    level ``2**(bits-1) - 1`` steps up may be unused: the lowest level is the extreme when it is
    negative, else ``2**(bits-1) - 1`` steps below zero)."""
    low, high = x.amin(-1), x.amax(-1)
    if not signed:
        return low, (high - low) / (2**bits - 1)
    half = 2 ** (bits - 1)
    negative = -low >= high
    step = torch.where(negative, -low, high) / half
    return torch.where(negative, low, -(half - 1) * step), step


#: bfloat16's and float16's relative rounding (the spacing of the values at 1)
BF16_EPS, F16_EPS = torch.finfo(torch.bfloat16).eps, torch.finfo(torch.float16).eps


def value_rounding(w: torch.Tensor) -> float:
    """The relative spacing of ``w``'s values: bfloat16's when they are bfloat16 values (a bfloat16
    checkpoint, also loaded into float16 or float32; float16 subnormals excepted: float16 rounds
    those itself), else float16's (float16 weights, and float32 ones held to float16's scale)."""
    if w.dtype == torch.bfloat16:
        return BF16_EPS
    if w.dtype == torch.float16:  # bfloat16's 8 significant bits: the 3 low bits of the mantissa clear
        bits = w.view(torch.int16)
        short = ((bits & 7) == 0) | ((bits & 0x7C00) == 0)  # or a subnormal
    elif w.dtype == torch.float32:
        short = (w.view(torch.int32) & 0xFFFF) == 0
    else:
        return F16_EPS
    return BF16_EPS if bool(short.all()) else F16_EPS


def on_grid(w: torch.Tensor, bits: int, group: int, *, signed: bool = False) -> Optional[int]:
    """Whether each group of ``group`` columns of ``w [N, K]`` lies on a ``bits``-wide affine grid
    (:func:`_group_range`: ``low + k * step``, ``k`` an integer in ``0 .. 2**bits - 1``) within the rounding
    of its values (:func:`value_rounding`; twice the spacing at the group's largest magnitude: the value's
    own rounding and that of the two ends the step is read from): None when a value is off its group's
    grid, else how many groups resolve their grid (levels more than four roundings apart; the others
    hold any values that close together)."""
    x = _grouped(w, group)
    low, step = _group_range(x, bits, signed)
    tol = (2 * value_rounding(w)) * x.abs().amax(-1)
    k = ((x - low.unsqueeze(-1)) / torch.where(step > 0, step, 1.0).unsqueeze(-1)).round_().clamp_(0, 2**bits - 1)
    err = x - k.mul_(step.unsqueeze(-1)).add_(low.unsqueeze(-1))  # x may be w itself (a float32 weight)
    if bool((err.abs_() > tol.unsqueeze(-1)).any()):
        return None
    return int((step > 4 * tol).sum())


def affine_groups(
    w: torch.Tensor,
    bits: int,
    group: int,
    *,
    refine: bool = False,
    store: Optional[torch.dtype] = None,
    signed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``w [N, K]`` in groups of ``group`` columns with a float scale and a float offset each: ``(q
    int8 [N, K] in [-2**(bits-1), 2**(bits-1) - 1], scale [N, G], offset [N, G])`` in ``store``
    (default :func:`storage_dtype`). The range of a group is its minimum and maximum (``scale = (max - min) /
    (2**bits - 1)``), the minimum refined by HQQ when ``refine``; ``signed``: Q4_0's range, for a weight
    already on such a grid (:func:`_group_range`). Each value is rounded to the nearest level of the stored
    (rounded) scale and offset."""
    x = _grouped(w, group)
    low, scale = _group_range(x, bits, signed)
    levels = 2**bits - 1
    if refine:
        low = _hqq_minimum(x, scale, low, levels)
    half = 2 ** (bits - 1)
    s = scale.to(store or storage_dtype(w))
    offset = (low + half * s.float()).to(s.dtype)  # the value of q = 0 (levels shifted to be signed)
    sf, of = s.float().unsqueeze(-1), offset.float().unsqueeze(-1)
    q = torch.where(sf > 0, torch.round((x - of) / torch.where(sf > 0, sf, 1.0)), 0.0).clamp(-half, half - 1)
    return q.to(torch.int8).reshape(w.shape), s, offset


def symmetric_groups(
    w: torch.Tensor, bits: int, group: int, *, store: Optional[torch.dtype] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` in groups of ``group`` columns with a float scale each, no offset (llama.cpp's Q8_0
    for 8 bits): ``scale = max |x| / (2**(bits-1) - 1)``, ``q`` in ``[-(2**(bits-1) - 1), 2**(bits-1) - 1]``."""
    x = _grouped(w, group)
    top = 2 ** (bits - 1) - 1
    s = (x.abs().amax(-1) / top).to(store or storage_dtype(w))
    sf = s.float().unsqueeze(-1)
    q = torch.where(sf > 0, torch.round(x / torch.where(sf > 0, sf, 1.0)), 0.0).clamp(-top, top)
    return q.to(torch.int8).reshape(w.shape), s


def group_for(k: int, want: int, bits: int) -> Optional[int]:
    """The group size a weight of ``k`` columns gets when ``want`` is asked (0: one group a row):
    ``want`` when it divides ``k``, else the largest power of two below it that does, at least 32 for
    4-bit values (None when there is none) and 8 for 8-bit ones (else one group a row)."""
    if not want:
        return k
    if k % want == 0:
        return want
    g = 1 << (min(want, k).bit_length() - 1)
    while g >= (32 if bits == 4 else 8):
        if k % g == 0:
            return g
        g //= 2
    return None if bits == 4 else k


def collect_rows(
    blocks: Iterable[tuple[Optional[torch.Tensor], ...]],
    rows: int,
    scratch: Optional[str | os.PathLike] = None,
    name: str = "weight",
    parts: tuple[str, ...] = ("qdata", "scale", "offset"),
) -> tuple[Optional[torch.Tensor], ...]:
    """The tensors ``parts`` (q, scale, offset, ...: each block a tuple of them, None for one a weight
    lacks) of a weight of ``rows`` rows from ``blocks`` of whole rows, in order: with ``scratch``, each
    written to a file there as it comes and mapped back (:class:`mps_backend.pages.ScratchFile`), so the
    whole is never anonymous memory; else concatenated."""
    files = [ScratchFile(scratch, f"{name}.{part}") for part in parts] if scratch is not None else None
    pieces_of: list[list[torch.Tensor]] = [[] for _ in parts]
    layout: list = []
    try:
        for pieces in blocks:
            if not layout:
                layout = [(t.dtype, list(t.shape[1:])) if t is not None else None for t in pieces]
            for i, t in enumerate(pieces):
                if t is None:
                    continue
                if files is not None:
                    files[i].append(t)
                else:
                    pieces_of[i].append(t)
            del pieces
        if not layout:
            raise ValueError(f"{name}: no rows")
    except BaseException:
        for f in files or ():
            f.discard()
        raise
    if files is None:
        out = tuple(torch.cat(p) if p else None for p in pieces_of)
    else:
        for f, lay in zip(files, layout):
            if lay is None:
                f.discard()
        out = tuple(f.mapped(lay[0], [rows, *lay[1]]) if lay else None for f, lay in zip(files, layout))
    assert out[0] is not None and out[1] is not None
    return out
