"""Weight-only quantization before export (torchao), for ``mps-backend export --quantize``.

    model = quantize_model(model, "int4", group_size=32)   # int4 weights, one scale per 32 columns
    model = quantize_model(model, "int8")                  # int8 weights, one scale per output channel

Applies ``torchao.quantization.quantize_(model, IntxWeightOnlyConfig(...))`` to the
``nn.Linear`` layers (and, with ``embeddings=True``, the ``nn.Embedding`` tables) in place.
Symmetric by default; ``asymmetric=True`` adds zero points (the lowering folds them exactly).
The exported edge graph then holds ``torchao.dequantize_affine`` on int8 weights, which
``mps_backend.operators.quant`` lowers:

- ``int4``: ``MPSDequantizePerChannelGroup`` on a packed 4-bit weight (0.5 byte per weight plus
  float16 scales). **The device needs macOS 15 / iOS 18** for that node (older systems fail at
  model load with NotImplemented). Layers with ``out_features % 8 != 0`` or
  ``in_features % 32 != 0`` stay in float (the device int4 layout cannot take them, and their
  dequantization left on CPU would have no kernel in the runtime).
- ``int8``: int8 weight constant (1 byte per weight), cast, scale multiply and matmul on the device
  (any OS the MPS delegate supports).

Layers whose ``in_features`` (embedding dim) the group size does not divide are left in float.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from mps_backend.errors import MPSBackendError
from mps_backend.pages import PageReleaser

SCHEMES = ("int4", "int8")
#: group size used by the CLI for int4 when none is given
DEFAULT_INT4_GROUP_SIZE = 32


class QuantizationError(MPSBackendError, ValueError):
    """A quantization that cannot be done as asked: an unknown scheme, a group size out of range, or one that
    would leave every linear layer in float."""


def verify_tolerance(scheme: str) -> float:
    """Least ``--verify`` tolerance (max error / output scale) for a model quantized with ``scheme``:
    the int4 dequantize outputs float16 on the device, so each weight carries up to 2**-11 relative
    rounding (float16 scale, float16 product) even in float32 graphs; 1e-3 bounds the output error
    (measured <= 5e-4). int8 is computed exactly like eager (no extra tolerance)."""
    return 1e-3 if scheme == "int4" else 0.0


def resolve_group_size(scheme: str, group_size: Optional[int]) -> Optional[int]:
    """The CLI's ``--group-size``: unset means 32 for int4 and per channel (None) for int8; 0 means
    per channel."""
    if group_size is None:
        return DEFAULT_INT4_GROUP_SIZE if scheme == "int4" else None
    return group_size or None


def weight_only_config(scheme: str, group_size: Optional[int] = None, *, asymmetric: bool = False):
    """torchao's ``IntxWeightOnlyConfig`` for ``scheme`` (``"int4"`` / ``"int8"``) with one scale per
    ``group_size`` columns (``None`` or 0: per output channel)."""
    if scheme not in SCHEMES:
        raise QuantizationError(f"unknown quantization scheme {scheme!r}: use one of {', '.join(SCHEMES)}")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 0):
        raise QuantizationError(f"--group-size {group_size}: give 0 (one scale per output channel) or a positive group")
    from torchao.quantization import IntxWeightOnlyConfig  # noqa: PLC0415
    from torchao.quantization.granularity import PerAxis, PerGroup  # noqa: PLC0415
    from torchao.quantization.quant_primitives import MappingType  # noqa: PLC0415

    return IntxWeightOnlyConfig(
        weight_dtype=torch.int4 if scheme == "int4" else torch.int8,
        granularity=PerGroup(group_size) if group_size else PerAxis(0),
        mapping_type=MappingType.ASYMMETRIC if asymmetric else MappingType.SYMMETRIC,
    )


def quantizable(scheme: str, group_size: Optional[int] = None, *, embeddings: bool = False):
    """The filter ``(module, fqn) -> bool`` of the layers ``scheme`` quantizes: float 2-d weights of
    ``nn.Linear`` (and ``nn.Embedding`` with ``embeddings``) whose columns the group size divides and,
    for int4, whose shape the device's packed layout takes."""
    from mps_backend.operators.quant import int4_layout_fits  # noqa: PLC0415

    kinds = (torch.nn.Linear, torch.nn.Embedding) if embeddings else (torch.nn.Linear,)

    def wanted(module: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(module, kinds):
            return False
        w = getattr(module, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.dtype.is_floating_point:
            return False  # not a float weight (e.g. already quantized)
        if scheme == "int4" and not int4_layout_fits(w.shape[0], w.shape[1]):
            return False
        return not group_size or w.shape[1] % group_size == 0

    return wanted


def quantization_count(model: torch.nn.Module, scheme: str, group_size: Optional[int] = None) -> str:
    """How many of ``model``'s float linear layers ``scheme`` quantizes, as a note for the summary; a
    :class:`QuantizationError` naming why when it would quantize none (``--group-size 7``, a model whose
    shapes the int4 layout cannot take): a program in float labelled int4 is never the result."""
    from mps_backend.operators.quant import INT4_K_MULTIPLE, INT4_N_MULTIPLE, int4_layout_fits  # noqa: PLC0415

    weight_only_config(scheme, group_size)  # the scheme and group size themselves
    wanted = quantizable(scheme, group_size)
    shapes = [
        tuple(m.weight.shape)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and m.weight.dim() == 2 and m.weight.dtype.is_floating_point
    ]
    done = sum(1 for fqn, m in model.named_modules() if wanted(m, fqn))
    grouping = f"group size {group_size}" if group_size else "per channel"
    if done:
        return f"{scheme} weight-only, {grouping}: {done} of {len(shapes)} linear layers quantized" + (
            "; the rest stay in float (shapes the group size or the int4 layout cannot take)" if done < len(shapes) else ""
        )
    why = []
    if scheme == "int4" and not any(int4_layout_fits(n, k) for n, k in shapes):
        why.append(
            f"the device's int4 layout needs out_features % {INT4_N_MULTIPLE} == 0 and in_features % {INT4_K_MULTIPLE} == 0"
        )
    if group_size and not any(k % group_size == 0 for _, k in shapes):
        widths = sorted({k for _, k in shapes})
        why.append(f"the group size {group_size} divides none of their in_features ({', '.join(map(str, widths[:6]))})")
    raise QuantizationError(
        f"--quantize {scheme} ({grouping}) would quantize none of the {len(shapes)} linear layers: "
        + (
            "; ".join(why)
            or ("no float linear weight" if not shapes else "no layer's shape takes both the group size and the int4 layout")
        )
        + (
            f": choose a group size that divides in_features{' (a multiple of 32 for int4)' if scheme == 'int4' else ''}"
            if group_size
            else ""
        )
    )


class RowQuantizedEmbedding(torch.nn.Module):
    """An embedding table stored as int8 with one scale per row (symmetric): the lookup gathers the
    token's int8 row and its scale, then dequantizes that row (``q[idx].to(dtype) * scale[idx]``,
    plain ``aten.embedding`` / cast / mul): a step reads D bytes and one scale per token, never the
    table. ``--quantize-embedding`` (int4 lookups are not offered: the device's int4 dequantize
    takes a whole constant weight, so it would dequantize the whole table every step)."""

    def __init__(self, weight: torch.Tensor, padding_idx: Optional[int] = None):
        super().__init__()
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float16).tiny)
        self.register_buffer("qweight", torch.round(w / scale).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(weight.dtype))
        self.padding_idx = padding_idx

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized table (what eager code that reads ``.weight`` sees)."""
        return self.qweight.to(self.scale.dtype) * self.scale

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        rows = torch.nn.functional.embedding(idx, self.qweight)
        return rows.to(self.scale.dtype) * torch.nn.functional.embedding(idx, self.scale)


def quantize_embeddings(model: torch.nn.Module) -> int:
    """Replace ``model``'s ``nn.Embedding`` tables by :class:`RowQuantizedEmbedding` (int8, a scale per
    row), a table tied to a linear (``lm_head``) included: the linear keeps its own weight. Returns
    how many were replaced."""
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Embedding and child.weight.dim() == 2 and child.weight.dtype.is_floating_point
    ]
    for parent, name, child in swaps:
        setattr(parent, name, RowQuantizedEmbedding(child.weight, child.padding_idx))
    return len(swaps)


def quantize_model(
    model: torch.nn.Module,
    scheme: str,
    group_size: Optional[int] = None,
    *,
    asymmetric: bool = False,
    embeddings: bool = False,
    scratch: Optional[str | os.PathLike] = None,
) -> torch.nn.Module:
    """Quantize ``model``'s linear weights in place (torchao weight-only) and return it.

    ``scheme``: ``"int4"`` or ``"int8"``. ``group_size``: columns sharing one scale (``None`` or 0:
    one scale per output channel, ``PerAxis(0)``). ``embeddings``: also quantize ``nn.Embedding``.
    ``scratch``: a folder for the quantized weights (:func:`quantize_weight_spilled`): each weight is
    quantized on its own, a block of rows at a time, its int8 data written there and mapped back, and
    the float weight's file pages handed back, so neither all float weights nor all int8 data are
    ever resident (the values are exactly those of the whole-model call).
    """
    from torchao.quantization import quantize_  # noqa: PLC0415

    config = weight_only_config(scheme, group_size, asymmetric=asymmetric)
    wanted = quantizable(scheme, group_size, embeddings=embeddings)
    if scratch is None:
        quantize_(model, config, filter_fn=wanted)
        return model
    pages = PageReleaser()
    for fqn, module in list(model.named_modules()):
        if wanted(module, fqn):
            weight = module.weight
            module.weight = torch.nn.Parameter(quantize_weight_spilled(weight, config, scratch, fqn), requires_grad=False)
            pages.release(weight)  # a weight mapped from the checkpoint or the scratch folder: its pages go
            del weight
            pages.trim()  # and the blocks' temporaries
    return model


#: float elements quantized at once by :func:`quantize_weight_spilled` (bounds its temporaries)
QUANTIZE_BLOCK_ELEMENTS = 1 << 22


def quantize_weight_spilled(weight: torch.Tensor, config: Any, scratch: str | os.PathLike, name: str = "weight") -> torch.Tensor:
    """torchao's quantized tensor (``IntxUnpackedToInt8Tensor``) of a 2-d ``weight`` under the
    weight-only ``config``, its int8 data, scales and zero points mapped from files in ``scratch``
    (:class:`mps_backend.pages.ScratchFile`). Quantized a block of whole rows at a time, each by
    torchao's own ``quantize_`` on a linear holding those rows: the blocks of ``config`` never span
    rows (``[1, group]`` or a whole row), so the values equal those of the whole weight at once."""
    from mps_backend.pages import ScratchFile  # noqa: PLC0415

    n, k = weight.shape
    if n == 0:  # no rows: torchao's own result on the empty weight
        return _torchao_quantized(weight.detach(), config)
    rows = max(1, QUANTIZE_BLOCK_ELEMENTS // max(1, k))
    files = [ScratchFile(scratch, f"{name}.{part}") for part in ("qdata", "scale", "zero_point")]
    first = None
    try:
        for r in range(0, n, rows):
            part = _torchao_quantized(weight.detach()[r : r + rows], config)
            pieces = (part.qdata, part.scale, part.zero_point)
            if any(t.shape[0] != part.shape[0] for t in pieces):
                raise ValueError(f"{name}: torchao's {type(part).__name__} has per-tensor data (not rows)")
            for f, t in zip(files, pieces):
                f.append(t)
            first = first or (type(part), [(t.dtype, list(t.shape[1:])) for t in pieces], part)
            del part, pieces
    except BaseException:
        for f in files:
            f.discard()
        raise
    cls, layout, attrs = first
    qdata, scale, zero = (f.mapped(dtype, [n, *tail]) for f, (dtype, tail) in zip(files, layout))
    return cls(qdata, scale, zero, attrs.target_dtype, attrs.block_size, attrs.dtype, attrs.activation_quantization)


def quantize_dequantized(model: torch.nn.Module, scheme: str, group_size: Optional[int] = None) -> torch.nn.Module:
    """Replace each weight :func:`quantize_model` would quantize by the values it takes quantized and
    then dequantized (torchao's own ``dequantize``), in its own dtype: a reference that computes as
    the quantized model does. A block of rows at a time (:data:`QUANTIZE_BLOCK_ELEMENTS`), so the
    temporaries are one block's and no weight is held quantized and dequantized at once; the blocks
    never span rows, so the values are those of the whole-model call."""
    config = weight_only_config(scheme, group_size)
    wanted = quantizable(scheme, group_size)
    pages = PageReleaser()
    for fqn, module in list(model.named_modules()):
        if wanted(module, fqn):
            w = module.weight.detach()
            out = torch.empty(w.shape, dtype=w.dtype)
            rows = max(1, QUANTIZE_BLOCK_ELEMENTS // max(1, w.shape[1]))
            for r in range(0, w.shape[0], rows):
                out[r : r + rows] = _torchao_quantized(w[r : r + rows], config).dequantize()
            module.weight = torch.nn.Parameter(out, requires_grad=False)
            del w
            pages.trim()  # the blocks' temporaries
    return model


def _torchao_quantized(weight: torch.Tensor, config: Any) -> Any:
    """torchao's quantized tensor of a 2-d ``weight``: ``quantize_`` on a linear holding it."""
    from torchao.quantization import quantize_  # noqa: PLC0415

    holder = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    holder.weight = torch.nn.Parameter(weight, requires_grad=False)
    quantize_(holder, config, filter_fn=lambda m, _fqn: m is holder)
    return holder.weight.detach()
