"""Graph passes.

* Program passes (:mod:`.program`) run on a user's whole exported program before partitioning:
  unread constants are dropped, float16's range is checked.
* Lowering passes run inside ``MPSBackend.preprocess`` on the delegated program, after the support
  checks and before lowering (``backend.build_graph``): every rewrite that spans several nodes lives
  here, so that each lowering in ``mps_backend.operators`` takes one fx node and emits MPS nodes. They
  rewrite the graph into aten ops (the rewritten graph still computes the same values) or annotate a
  node (``CHANNEL_AFFINE``), and each is tested on its own (``tests/test_passes.py``):

  1. :func:`.conv_epilogue.fold_conv_epilogues` -- an inference batch norm or a hardsigmoid reading a
     convolution becomes part of the convolution's weights and bias;
  2. :func:`.rescale.fold_power_of_two_rescales` -- ``(x * a) / d`` with powers of two is ``x * (a / d)``,
     ``x * 1`` is ``x``;
  3. :func:`.linear_weights.transpose_linear_weights` -- a constant weight read only by linears is
     stored transposed (what the device's matmul reads), the linears read it through one permute;
  4. :func:`.precision.assign_device_dtypes` -- the device dtype of every float value under the
     precision policy (float32 islands, the float32 residual, rescaled matmuls; casts where dtypes meet).

``simplify`` (``mps_backend/simplify.py``) is the clean-up after lowering, on the MPS graph.
"""

from __future__ import annotations

from torch.export import ExportedProgram

from mps_backend.precision import Precision

from .conv_epilogue import CHANNEL_AFFINE, ChannelAffine, fold_conv_epilogues
from .linear_weights import transpose_linear_weights
from .precision import assign_device_dtypes
from .program import (
    FP16_MAX,
    Float16RangeError,
    Float16RangeWarning,
    check_fp16_constants,
    drop_unused_constants,
    fp16_overflow,
    largest_magnitude,
)
from .rescale import fold_power_of_two_rescales


def run_lowering_passes(ep: ExportedProgram, precision: Precision | bool) -> dict[str, int]:
    """The lowering passes, in order, on the program ``preprocess`` was handed (its own copy of the
    graph; the weight tensors it shares are never modified), under ``precision`` (a Precision or the
    old ``use_fp16`` boolean). Returns the rewrites per pass."""
    precision = Precision.of(precision)
    counts = {
        "conv epilogues folded": fold_conv_epilogues(ep),
        "power-of-two rescales and unit multiplies folded": fold_power_of_two_rescales(ep, precision.float16),
        "linear weights stored transposed": transpose_linear_weights(ep),
    }
    counts.update(assign_device_dtypes(ep, precision))
    if any(counts.values()):
        ep.graph.lint()
        ep.graph_module.recompile()
    return counts


__all__ = [
    "CHANNEL_AFFINE",
    "FP16_MAX",
    "ChannelAffine",
    "Float16RangeError",
    "Float16RangeWarning",
    "assign_device_dtypes",
    "check_fp16_constants",
    "drop_unused_constants",
    "fold_conv_epilogues",
    "fold_power_of_two_rescales",
    "fp16_overflow",
    "largest_magnitude",
    "run_lowering_passes",
    "transpose_linear_weights",
]
