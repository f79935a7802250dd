"""MPS export recipes for ``executorch.export`` (registered with its recipe registry on import, like
XNNPACK's, CoreML's and QNN's).

    from executorch.export import ExportRecipe, export
    from mps_backend.recipes import MPSRecipeType

    session = export(model, [example_inputs], ExportRecipe.get_recipe(MPSRecipeType.FP16))
    session.save_to_pte("model")  # model.pte

| recipe | what it does |
|---|---|
| ``MPSRecipeType.FP16`` (``mps_fp16``) | ``MPSPartitioner()``: float16 on the device |
| ``MPSRecipeType.FP32`` (``mps_fp32``) | ``MPSPartitioner(use_fp16=False)`` |
| ``MPSRecipeType.INT4_WEIGHT_ONLY`` (``mps_int4_weight_only``) | torchao int4 weight-only (``group_size``, default 32),
  float16; needs macOS 15 / iOS 18 on the device |
| ``MPSRecipeType.INT8_WEIGHT_ONLY`` (``mps_int8_weight_only``) | torchao int8 weight-only (``group_size``, default per
  channel), float16 |
| ``..._XNNPACK_FALLBACK`` variants of the four | the same, then ``XnnpackPartitioner()`` for what MPS leaves on CPU |

The quantization recipes quantize the linear layers the device can take (``mps_backend.quantize``):
int4 layers whose shape the device's packed layout cannot hold stay float.
``session.run_method`` runs the program through executorch's runtime in this process, whose
pybindings have no MPS backend (executorch removed it in 1.5): creating an MPS recipe therefore
registers the emulated MPS delegate (``mps_backend.runtime.load_emulator()``, built once per machine
and cached) unless an ``MPSBackend`` is registered already, so ``run_method`` runs the delegates on
the device model. Where the emulator cannot be built (no C++ compiler) the recipe warns
(:class:`EmulatorUnavailableWarning`) and exporting works as before.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

from executorch.export import (
    AOQuantizationConfig,
    BackendRecipeProvider,
    ExportRecipe,
    LoweringRecipe,
    QuantizationRecipe,
    RecipeType,
    recipe_registry,
)

from mps_backend.errors import MPSBackendWarning
from mps_backend.partitioner import MPSPartitioner, edge_compile_config
from mps_backend.quantize import quantizable, resolve_group_size, weight_only_config
from mps_backend.runtime.emulator import EmulatorError, load_emulator, pybindings

BACKEND_NAME = "mps"


class MPSRecipeType(RecipeType):
    """MPS recipe types (``ExportRecipe.get_recipe(MPSRecipeType.FP16)``)."""

    FP16 = "mps_fp16"
    FP32 = "mps_fp32"
    INT4_WEIGHT_ONLY = "mps_int4_weight_only"
    INT8_WEIGHT_ONLY = "mps_int8_weight_only"
    FP16_XNNPACK_FALLBACK = "mps_fp16_xnnpack_fallback"
    FP32_XNNPACK_FALLBACK = "mps_fp32_xnnpack_fallback"
    INT4_WEIGHT_ONLY_XNNPACK_FALLBACK = "mps_int4_weight_only_xnnpack_fallback"
    INT8_WEIGHT_ONLY_XNNPACK_FALLBACK = "mps_int8_weight_only_xnnpack_fallback"

    @classmethod
    def get_backend_name(cls) -> str:
        return BACKEND_NAME


#: recipe -> (use_fp16, quantization scheme or None, XNNPACK fallback)
_RECIPES: dict[MPSRecipeType, tuple[bool, Optional[str], bool]] = {
    MPSRecipeType.FP16: (True, None, False),
    MPSRecipeType.FP32: (False, None, False),
    MPSRecipeType.INT4_WEIGHT_ONLY: (True, "int4", False),
    MPSRecipeType.INT8_WEIGHT_ONLY: (True, "int8", False),
    MPSRecipeType.FP16_XNNPACK_FALLBACK: (True, None, True),
    MPSRecipeType.FP32_XNNPACK_FALLBACK: (False, None, True),
    MPSRecipeType.INT4_WEIGHT_ONLY_XNNPACK_FALLBACK: (True, "int4", True),
    MPSRecipeType.INT8_WEIGHT_ONLY_XNNPACK_FALLBACK: (True, "int8", True),
}


class EmulatorUnavailableWarning(MPSBackendWarning):
    """The emulated MPS delegate could not be registered: ``session.run_method`` cannot run MPS delegates."""


def _ensure_mps_backend() -> None:
    """Register the emulated MPS delegate with this process's executorch runtime unless an
    ``MPSBackend`` is registered already (``load_emulator`` does the work once per process)."""
    try:
        if "MPSBackend" not in pybindings()._get_registered_backend_names():
            load_emulator()
    except (EmulatorError, OSError) as e:
        warnings.warn(
            EmulatorUnavailableWarning(
                f"the emulated MPS delegate is unavailable ({e}); the recipe exports, but session.run_method "
                "cannot run its MPS delegates in this process"
            ),
            stacklevel=3,
        )


class MPSRecipeProvider(BackendRecipeProvider):
    """Builds the :class:`MPSRecipeType` recipes. The only keyword is ``group_size`` (weight-only
    recipes: columns sharing one scale; 0 = per output channel)."""

    @property
    def backend_name(self) -> str:
        return BACKEND_NAME

    def get_supported_recipes(self) -> Sequence[RecipeType]:
        return list(MPSRecipeType)

    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> Optional[ExportRecipe]:
        if recipe_type not in _RECIPES:
            return None
        use_fp16, scheme, fallback = _RECIPES[recipe_type]  # type: ignore[index]
        unknown = set(kwargs) - ({"group_size"} if scheme else set())
        if unknown:
            raise ValueError(
                f"MPS recipe {recipe_type.value!r} takes no parameter {sorted(unknown)}"
                + (" (only group_size)" if scheme else "")
            )

        partitioners: list[Any] = [MPSPartitioner(use_fp16=use_fp16)]
        if fallback:
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: PLC0415

            partitioners.append(XnnpackPartitioner())
        quantization = None
        if scheme:
            group = kwargs.get("group_size")
            if group is not None and (not isinstance(group, int) or group < 0):
                raise ValueError(f"group_size must be a non-negative integer, got {group!r}")
            group = resolve_group_size(scheme, group)
            quantization = QuantizationRecipe(
                quantizers=None,
                ao_quantization_configs=[
                    AOQuantizationConfig(weight_only_config(scheme, group), filter_fn=quantizable(scheme, group))
                ],
            )
        _ensure_mps_backend()
        return ExportRecipe(
            name=recipe_type.value,
            quantization_recipe=quantization,
            lowering_recipe=LoweringRecipe(partitioners=partitioners, edge_compile_config=edge_compile_config()),
        )


if BACKEND_NAME not in recipe_registry.list_backends():  # an ecosystem registration, once per process
    recipe_registry.register_backend_recipe_provider(MPSRecipeProvider())

__all__ = ["EmulatorUnavailableWarning", "MPSRecipeProvider", "MPSRecipeType"]
