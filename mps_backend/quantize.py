"""Weight-only quantization before export, for ``mps-backend export --quantize``.

    model = quantize_model(model, "int4", group_size=32)   # int4, a scale and an offset per 32 columns
    model = quantize_model(model, "int8")                  # int8, a scale and an offset per output channel

Each float weight of an ``nn.Linear`` (and, with ``embeddings=True``, of an ``nn.Embedding``) becomes a
:class:`~mps_backend.quant_tensor.GroupQuantizedTensor` in place (:func:`plan_quantization` says which
and how; the export prints its summary, ``quantized 210 of 211 linear layers (int4, group 32, ...);
output head int8 groups of 32, symmetric (one table with the tied embedding)``):

- **asymmetric** groups: a float16 scale and a float16 offset per group of ``group`` columns of a row,
  the range being the group's minimum and maximum (``scale = (max - min) / 15`` for int4, the levels
  shifted to [-8, 7], ``offset`` the value of level 0). Groups above 32 columns get HQQ's refinement of
  their minimum (:data:`REFINE_ABOVE_GROUP`); measured on SmolLM2 in docs/llm.md, Quality, where the
  choice is made: min/max reproduces a Q4_1 checkpoint's blocks at group 32, and HQQ gains at 64 and 128.
- ``int4``: ``MPSDequantizePerChannelGroup`` on the packed 4-bit weight (0.5 byte a weight), then the
  offsets added per group (``mps_backend.operators.quant``). **The device needs macOS 15 / iOS 18** for
  that node. A layer whose ``in_features`` the group does not divide gets the largest power-of-two group
  below it that does (576 columns at group 128: group 64); a layer the device's int4 layout cannot take
  (``out_features % 8`` or ``in_features % 32``) is int8 per channel. No layer is left in float; the
  summary names every exception.
- **a checkpoint already 4-bit**: an int4 weight whose every group of ``g0`` columns (a power of two,
  32 <= g0 < the group asked) already lies on a 4-bit affine grid (a Q4_1 or Q4_0 GGUF's blocks, also
  as an ``hf:`` folder of their values in bfloat16) keeps that grid: it is quantized at group ``g0``
  (the same values) rather than rounded a second time onto a coarser grid, and the summary says so
  (``210 already on a 4-bit grid of 32 columns kept at group 32 (...)``); ``allow_requantize``
  (``--allow-requantize``, llama.cpp's flag) re-rounds them as asked (:func:`checkpoint_grid`).
- ``int8``: an int8 constant (1 byte a weight), cast, scale multiply, offset add and matmul on the device
  (any OS the MPS delegate supports); one scale and offset per output channel unless ``group_size``.
- **the output head** (transformers' ``get_output_embeddings()``, executorch's llama ``output``):
  ``head="int8"`` (the default, ``--quantize-head``) stores it as int8 in symmetric groups of 32 (a
  float16 scale each, llama.cpp's Q8_0 layout), ``"int4"`` as the other layers, ``"float"`` leaves it.
  A head tied to the embedding table stays one table: the embedding's lookup gathers the token's int8
  row and its scales, the head dequantizes the whole table (the program stores it once, unpacked).

torchao's ``IntxWeightOnlyConfig`` (:func:`weight_only_config`, symmetric) remains for executorch's
recipes (:mod:`mps_backend.recipes`); the lowering takes its graphs too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from mps_backend.errors import MPSBackendError
from mps_backend.operators.quant import int4_layout_fits
from mps_backend.pages import PageReleaser
from mps_backend.quant_tensor import (
    GroupQuantizedTensor,
    affine_groups,
    collect_rows,
    group_for,
    on_grid,
    storage_dtype,
    symmetric_groups,
)

SCHEMES = ("int4", "int8")
SCHEME_BITS = {"int4": 4, "int8": 8}
#: group size used by the CLI for int4 when none is given (docs/llm.md, Quality: measured)
DEFAULT_INT4_GROUP_SIZE = 32
#: ``--quantize-head``: the output head int8 (default), as the other layers (int4), or not quantized
HEADS = ("int8", "int4", "float")
#: the int8 head's groups (symmetric, llama.cpp's Q8_0)
HEAD_INT8_GROUP = 32
#: int4 groups wider than this get HQQ's refinement of their minimum (docs/llm.md, Quality)
REFINE_ABOVE_GROUP = 32
#: the finest grid of a checkpoint's 4-bit blocks looked for (llama.cpp's: 32 columns), :func:`checkpoint_grid`
GRID_MIN_GROUP = 32


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


@dataclass(frozen=True)
class Quantization:
    """What ``--quantize`` asks of the weights, as one value (an export's
    :attr:`~mps_backend.llm.options.ExportOptions.quantization`): the scheme (``int4`` / ``int8``), the group size as
    given (None: the scheme's default, 0: one scale per output channel), the head (``--quantize-head``; None: the
    scheme's default) and ``--allow-requantize``. The export quantizes with it (:meth:`plan`), and every eager
    reference of a quantized export (the self-check's, the tests', the benchmarks') takes the same weights from it
    (:meth:`dequantize_alike`)."""

    scheme: str
    group_size: Optional[int] = None
    head: Optional[str] = None
    allow_requantize: bool = False

    @property
    def group(self) -> Optional[int]:
        """Columns sharing a scale (None: one per output channel), the defaults resolved."""
        return resolve_group_size(self.scheme, self.group_size)

    def plan(self, model: torch.nn.Module, **extra: Any) -> "QuantizationPlan":
        """:func:`plan_quantization` of ``model`` with these settings (``extra``: its other keywords)."""
        return plan_quantization(model, self.scheme, self.group, head=self.head, allow_requantize=self.allow_requantize, **extra)

    def dequantize_alike(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model``'s weights replaced by the values the export computes with: quantized with these settings
        and dequantized as the device does (:func:`quantize_dequantized`), in their own dtype."""
        return quantize_dequantized(model, self.scheme, self.group, self.head, allow_requantize=self.allow_requantize)


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
    """The filter ``(module, fqn) -> bool`` of the layers torchao's ``weight_only_config`` quantizes
    (the executorch recipes, :mod:`mps_backend.recipes`): float 2-d weights of ``nn.Linear`` (and
    ``nn.Embedding`` with ``embeddings``) whose columns the group size divides and, for int4, whose
    shape the device's packed layout takes."""
    kinds = (torch.nn.Linear, torch.nn.Embedding) if embeddings else (torch.nn.Linear,)

    def wanted(module: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(module, kinds):
            return False
        w = getattr(module, "weight", None)
        if not _float_weight(w):
            return False  # not a float weight (e.g. already quantized)
        if scheme == "int4" and not int4_layout_fits(w.shape[0], w.shape[1]):
            return False
        return not group_size or w.shape[1] % group_size == 0

    return wanted


def _float_weight(w: Any) -> bool:
    """A plain float 2-d weight (not one already quantized: a tensor subclass)."""
    return type(w) in (torch.Tensor, torch.nn.Parameter) and w.dim() == 2 and w.dtype.is_floating_point


def resolve_head(scheme: str, head: Optional[str]) -> str:
    """``--quantize-head``: unset means int8 (int4 and int8 exports alike)."""
    if head is None:
        return "int8"
    if head not in HEADS:
        raise QuantizationError(f"--quantize-head {head!r}: use one of {', '.join(HEADS)}")
    return head


def output_head(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    """The model's output head (the ``nn.Linear`` giving the logits): transformers'
    ``get_output_embeddings()``, executorch's example llama's ``output``; None for other models."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else getattr(model, "output", None)
    if isinstance(model, torch.nn.ModuleDict):  # a vision-language model's text part (mps_backend.llm.vision)
        head = model["lm_head"] if "lm_head" in model else None
    return head if isinstance(head, torch.nn.Linear) else None


@dataclass
class LayerPlan:
    """How one weight is quantized: ``modules`` hold it (a table tied to the head: the embedding and the
    head), ``bits`` and ``group`` its values and groups, ``offset`` a float offset per group (affine) or
    none (symmetric), ``packed`` the device's int4 layout, ``refine`` HQQ's refinement of the offsets;
    ``kept``: the weight already lies on a 4-bit grid of ``group`` columns (:func:`checkpoint_grid`), kept
    at that group, its range Q4_0's when ``signed``."""

    fqn: str
    modules: list[torch.nn.Module]
    role: str  # "linear", "head" or "embedding"
    bits: int
    group: int
    offset: bool = True
    packed: bool = False
    refine: bool = False
    kept: bool = False
    signed: bool = False

    def quantize(self, w: torch.Tensor, store: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(q, scale, offset) of rows of the weight, scales and offsets in ``store``."""
        if self.offset:
            return affine_groups(w, self.bits, self.group, refine=self.refine, store=store, signed=self.signed)
        q, s = symmetric_groups(w, self.bits, self.group, store=store)
        return q, s, None

    def tensor(self, q, scale, offset, dtype) -> GroupQuantizedTensor:
        return GroupQuantizedTensor(q, scale, self.bits, self.packed, dtype, offset)


@dataclass
class QuantizationPlan:
    """What :func:`quantize_model` does to a model (:func:`plan_quantization`)."""

    scheme: str
    group: Optional[int]
    head: str
    layers: list[LayerPlan] = field(default_factory=list)
    linears: int = 0  # the model's float linear layers, the head included
    head_found: bool = False
    head_tied: bool = False

    def summary(self) -> str:
        """``quantized 210 of 211 linear layers (int4, group 32); output head int8 (...)``: what was done,
        and to which layers not as asked (a checkpoint's 4-bit grid kept, a smaller group, int8 for shapes
        the int4 layout cannot take)."""
        body = [p for p in self.layers if p.role == "linear"]
        asked = [p for p in body if p.bits == SCHEME_BITS[self.scheme]]
        grouping = f"group {self.group}" if self.group else "per channel"
        kind = "asymmetric: a float16 scale and offset per group"
        text = f"quantized {len(body)} of {self.linears} linear layers ({self.scheme}, {grouping}, {kind})"
        kept: dict[int, int] = {}
        smaller: dict[tuple[int, int], int] = {}
        for p in asked:
            k = p.modules[0].weight.shape[1]
            if p.kept:
                kept[p.group] = kept.get(p.group, 0) + 1
            elif self.group and p.group != self.group:
                smaller[(k, p.group)] = smaller.get((k, p.group), 0) + 1
        extras = [
            f"{n} already on a 4-bit grid of {g} columns kept at group {g} (re-rounding them at group {self.group} "
            "costs quality: --allow-requantize)"
            for g, n in sorted(kept.items())
        ]
        extras += [f"{n} with in_features {k} at group {g}" for (k, g), n in sorted(smaller.items())]
        wide = [p for p in body if p.bits != SCHEME_BITS[self.scheme]]
        if wide:
            shapes = sorted({tuple(p.modules[0].weight.shape) for p in wide})
            extras.append(
                f"{len(wide)} int8 per channel: the device's int4 layout cannot take "
                + ", ".join(f"[N={n}, K={k}]" for n, k in shapes[:4])
                + ("..." if len(shapes) > 4 else "")
            )
        tables = [p for p in self.layers if p.role == "embedding"]
        if tables:
            extras.append(f"{len(tables)} embedding table{'s' if len(tables) > 1 else ''} {self.scheme}")
        if extras:
            text += "; " + "; ".join(extras)
        if self.head_found:
            head = next((p for p in self.layers if p.role == "head"), None)
            if head is None:
                text += "; output head float"
            else:
                how = f"int8 groups of {head.group}, symmetric" if head.bits == 8 else f"int4 group {head.group}"
                text += f"; output head {how}" + (" (one table with the tied embedding)" if self.head_tied else "")
        return text


def plan_quantization(
    model: torch.nn.Module,
    scheme: str,
    group_size: Optional[int] = None,
    *,
    head: Optional[str] = None,
    embeddings: bool = False,
    allow_requantize: bool = False,
) -> QuantizationPlan:
    """How :func:`quantize_model` quantizes ``model``'s float weights (module docstring); a
    :class:`QuantizationError` naming why when it would quantize none of the linear layers. An int4 weight
    already on a 4-bit grid of fewer columns than its group (:func:`checkpoint_grid`) keeps that grid
    unless ``allow_requantize``."""
    weight_only_config(scheme, group_size)  # the scheme and group size themselves
    head = resolve_head(scheme, head)
    bits = SCHEME_BITS[scheme]
    head_module = output_head(model)
    holders: dict[int, list[tuple[str, torch.nn.Module]]] = {}
    for fqn, m in model.named_modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) and _float_weight(getattr(m, "weight", None)):
            holders.setdefault(id(m.weight), []).append((fqn, m))
    plan = QuantizationPlan(scheme, group_size, head, head_found=head_module is not None)
    widths = set()
    pages = PageReleaser()
    for held in holders.values():
        fqn, first = held[0]
        modules = [m for _, m in held]
        plan.linears += sum(isinstance(m, torch.nn.Linear) for m in modules)
        n, k = first.weight.shape
        gathered = any(isinstance(m, torch.nn.Embedding) for m in modules)
        if head_module is not None and any(m is head_module for m in modules):
            plan.head_tied = gathered
            if head == "float":
                continue
            if head == "int8":
                plan.layers.append(LayerPlan(fqn, modules, "head", 8, group_for(k, HEAD_INT8_GROUP, 8) or k, offset=False))
                continue
        elif gathered and not any(isinstance(m, torch.nn.Linear) for m in modules):
            if embeddings:
                plan.layers.append(LayerPlan(fqn, modules, "embedding", bits, group_for(k, group_size or 0, 8) or k))
            continue
        role = "head" if head_module is not None and any(m is head_module for m in modules) else "linear"
        widths.add(k)
        group = group_for(k, group_size or 0, bits)
        if bits == 4 and (group is None or not int4_layout_fits(n, k)):
            plan.layers.append(LayerPlan(fqn, modules, role, 8, k))  # int8 per channel, with a note
            continue
        assert group is not None
        grid = checkpoint_grid(first.weight, bits, group) if bits == 4 and not allow_requantize else None
        pages.release(first.weight)  # a weight mapped from a file: the pages the look read go
        layer = LayerPlan(fqn, modules, role, bits, group, packed=bits == 4 and not gathered)
        if grid is not None:
            layer.group, layer.signed, layer.kept = *grid, True
        layer.refine = bits == 4 and layer.group > REFINE_ABOVE_GROUP and not layer.kept
        plan.layers.append(layer)
    if not plan.linears:
        raise QuantizationError(f"--quantize {scheme} would quantize none of the model's layers: no float linear weight")
    if group_size and widths and not any(k % group_size == 0 for k in widths):
        raise QuantizationError(
            f"--quantize {scheme} (group size {group_size}) would quantize none of the {plan.linears} linear layers: "
            f"the group size {group_size} divides none of their in_features ({', '.join(map(str, sorted(widths)[:6]))}): "
            f"choose a group size that divides in_features{' (a multiple of 32 for int4)' if scheme == 'int4' else ''}"
        )
    return plan


def checkpoint_grid(weight: torch.Tensor, bits: int, group: int) -> Optional[tuple[int, bool]]:
    """``(g0, signed)``: the coarsest grid of ``g0`` columns (a power of two, :data:`GRID_MIN_GROUP` <= g0 <
    ``group``, dividing the columns) that every group of every row of ``weight`` already lies on, ``bits``
    wide (:func:`~mps_backend.quant_tensor.on_grid`: llama.cpp's Q4_1 blocks, min/max, or Q4_0's, ``signed``),
    within the rounding of its values; None when there is none. Re-rounding such a weight onto a coarser
    grid rounds it a second time (llama.cpp's ``llama-quantize`` refuses it without ``--allow-requantize``);
    at ``g0`` it is kept. A block of rows at a time (:func:`_row_blocks`), stopping at the first value off
    the grid."""
    g = 1 << max(0, (group - 1).bit_length() - 1)
    while g >= GRID_MIN_GROUP:
        if weight.shape[1] % g == 0:
            for signed in (False, True):
                resolved = 0
                for _, block in _row_blocks(weight):
                    n = on_grid(block, bits, g, signed=signed)
                    if n is None:
                        break
                    resolved += n
                else:
                    if resolved:  # not only groups whose values all lie within rounding of each other
                        return g, signed
        g //= 2
    return None


def quantization_count(
    model: torch.nn.Module,
    scheme: str,
    group_size: Optional[int] = None,
    head: Optional[str] = None,
    *,
    allow_requantize: bool = False,
) -> str:
    """What :func:`quantize_model` will do to ``model``, as a note for the summary (:meth:`QuantizationPlan.summary`);
    a :class:`QuantizationError` when it would quantize none as asked."""
    return plan_quantization(model, scheme, group_size, head=head, allow_requantize=allow_requantize).summary()


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
    head: Optional[str] = None,
    embeddings: bool = False,
    scratch: Optional[str | os.PathLike] = None,
    allow_requantize: bool = False,
) -> torch.nn.Module:
    """Quantize ``model``'s linear weights in place (:func:`plan_quantization`, module docstring) and
    return it.

    ``scheme``: ``"int4"`` or ``"int8"``. ``group_size``: columns sharing one scale and offset (``None``
    or 0: one per output channel). ``head``: the output head's ``--quantize-head`` (default int8).
    ``embeddings``: also quantize ``nn.Embedding`` tables. ``allow_requantize``: re-round int4 weights
    already on a finer 4-bit grid at ``group_size`` too (:func:`checkpoint_grid`; by default they keep
    their grid). ``scratch``: a folder for the quantized data
    (:func:`quantize_weight_spilled`): each weight is quantized on its own, a block of rows at a time,
    its data written there and mapped back, and the float weight's file pages handed back, so neither
    all float weights nor all quantized data are ever resident (the values are those of the whole
    weight at once: the groups never span rows)."""
    plan = plan_quantization(model, scheme, group_size, head=head, embeddings=embeddings, allow_requantize=allow_requantize)
    apply_plan(plan, scratch)
    return model


def apply_plan(plan: QuantizationPlan, scratch: Optional[str | os.PathLike] = None) -> None:
    """Quantize the weights of a :func:`plan_quantization` in place, as :func:`quantize_model` does."""
    pages = PageReleaser()
    for layer in plan.layers:
        weight = layer.modules[0].weight
        quantized = torch.nn.Parameter(quantize_weight_spilled(weight, layer, scratch, layer.fqn), requires_grad=False)
        for m in layer.modules:
            m.weight = quantized
        pages.release(weight)  # a weight mapped from the checkpoint or the scratch folder: its pages go
        del weight
        pages.trim()  # and the blocks' temporaries


#: float elements quantized at once by :func:`quantize_weight_spilled` (bounds its temporaries)
QUANTIZE_BLOCK_ELEMENTS = 1 << 22


def _row_blocks(weight: torch.Tensor):
    rows = max(1, QUANTIZE_BLOCK_ELEMENTS // max(1, weight.shape[1]))
    for r in range(0, weight.shape[0], rows):
        yield r, weight.detach()[r : r + rows]


def quantize_weight_spilled(
    weight: torch.Tensor, layer: LayerPlan, scratch: Optional[str | os.PathLike] = None, name: str = "weight"
) -> GroupQuantizedTensor:
    """``weight`` (2-d) quantized as ``layer`` says, a block of whole rows at a time; with ``scratch``,
    its data, scales and offsets written to files there and mapped back
    (:func:`mps_backend.quant_tensor.collect_rows`)."""
    store = storage_dtype(weight)
    if not weight.shape[0]:  # no rows
        return layer.tensor(*layer.quantize(weight.detach(), store), weight.dtype)
    q, s, off = collect_rows((layer.quantize(block, store) for _, block in _row_blocks(weight)), weight.shape[0], scratch, name)
    return layer.tensor(q, s, off, weight.dtype)


def quantize_dequantized(
    model: torch.nn.Module,
    scheme: str,
    group_size: Optional[int] = None,
    head: Optional[str] = None,
    *,
    allow_requantize: bool = False,
) -> torch.nn.Module:
    """Replace each weight :func:`quantize_model` would quantize by the values it takes quantized and
    then dequantized (``GroupQuantizedTensor.dequantize``: the device's arithmetic), in its own dtype:
    a reference that computes as the quantized model does. A block of rows at a time
    (:data:`QUANTIZE_BLOCK_ELEMENTS`), so the temporaries are one block's; the groups never span rows,
    so the values are those of the whole weight."""
    plan = plan_quantization(model, scheme, group_size, head=head, allow_requantize=allow_requantize)
    pages = PageReleaser()
    for layer in plan.layers:
        w = layer.modules[0].weight.detach()
        out = torch.empty(w.shape, dtype=w.dtype)
        store = storage_dtype(w)
        for r, block in _row_blocks(w):
            out[r : r + block.shape[0]] = layer.tensor(*layer.quantize(block, store), w.dtype).dequantize()
        values = torch.nn.Parameter(out, requires_grad=False)
        for m in layer.modules:
            m.weight = values
        del w
        pages.trim()  # the blocks' temporaries
    return model


def dequantize_weights(model: torch.nn.Module) -> int:
    """Replace every :class:`GroupQuantizedTensor` weight of ``model`` by its dequantized values (a plain
    parameter in its dtype, shared by the modules that shared it); returns how many."""
    done: dict[int, torch.nn.Parameter] = {}
    for m in model.modules():
        w = m._parameters.get("weight") if hasattr(m, "_parameters") else None
        if isinstance(w, GroupQuantizedTensor):
            if id(w) not in done:
                done[id(w)] = torch.nn.Parameter(w.dequantize(), requires_grad=False)
            m.weight = done[id(w)]
    return len(done)
