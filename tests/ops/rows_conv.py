"""Convolution rows: 1-d, 2-d and 3-d, forward and transposed, bias or not, strides, paddings, dilations,
groups, depthwise, every argument form of the schema (one value for all spatial dims), batch norm
folded into the convolution (tests/test_node_counts.py checks that no MPSBatchNorm is left)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .harness import randn, row


def _seeded(cls):
    def factory(*args, **kwargs):
        def make():
            torch.manual_seed(0)
            return cls(*args, **kwargs)

        return make

    return factory


conv, conv1d, conv3d = _seeded(nn.Conv2d), _seeded(nn.Conv1d), _seeded(nn.Conv3d)
convt, convt1d, convt3d = _seeded(nn.ConvTranspose2d), _seeded(nn.ConvTranspose1d), _seeded(nn.ConvTranspose3d)
aten_conv = torch.ops.aten.convolution.default


class ConvThen(nn.Module):
    def __init__(self, conv: nn.Module, then):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.then = conv, then
        self.eval()

    def forward(self, x):
        return self.then(self.conv(x))


class ConvBN(nn.Module):
    """conv -> inference batch norm with non-trivial statistics (``also_conv``: the conv's result is
    returned too, so the batch norm cannot be folded)."""

    def __init__(self, conv: nn.Module, affine: bool = True, also_conv: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.also_conv = conv, also_conv
        c = conv.out_channels
        self.bn = (nn.BatchNorm1d if isinstance(conv, nn.Conv1d) else nn.BatchNorm2d)(c, eps=1e-3, affine=affine)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.05, 3)
        if affine:
            self.bn.weight.data.uniform_(-2, 2)
            self.bn.bias.data.uniform_(-1, 1)
        self.eval()

    def forward(self, x):
        y = self.conv(x)
        return (self.bn(y), y) if self.also_conv else torch.relu(self.bn(y))


# conv accumulates K*K*C products in f32 and rounds once; 2e-3 covers the f16 inputs/weights
CONV_TOL = {"fp16": 2e-3}

ROWS = [
    row(
        "aten.convolution.default", "conv2d-basic", None, randn(1, 3, 8, 8), module=conv(3, 4, 3), kinds="MPSConv2D", tol=CONV_TOL
    ),
    row(
        "aten.convolution.default",
        "conv2d-stride-pad-dilation",
        None,
        randn(2, 4, 11, 9),
        module=conv(4, 6, (3, 2), stride=(2, 1), padding=(2, 1), dilation=(1, 2)),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv2d-no-bias",
        None,
        randn(1, 3, 6, 6),
        module=conv(3, 5, 1, bias=False),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv2d-groups",
        None,
        randn(1, 4, 7, 7),
        module=conv(4, 8, 3, groups=2, padding=1),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv2d-depthwise",
        None,
        randn(1, 6, 9, 9),
        module=conv(6, 6, 3, groups=6, padding=1, stride=2),
        kinds="MPSDepthwiseConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv1d-basic",
        None,
        randn(2, 3, 16),
        module=conv1d(3, 4, 5, padding=2, stride=2),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv1d-depthwise-groups",
        None,
        randn(1, 4, 12),
        module=conv1d(4, 4, 3, groups=4),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    # kernel == stride (upsampling): 1x1 conv to C_out*r*r channels + pixel shuffle
    row(
        "aten.convolution.default",
        "conv-transposed-k2s2",
        None,
        randn(2, 3, 5, 6),
        module=lambda: nn.ConvTranspose2d(3, 4, 2, stride=2),
        kinds={"MPSConv2D", "MPSPixelShuffle"},
        tol={"fp16": 2e-3},
    ),
    row(
        "aten.convolution.default",
        "conv-transposed-k3s3-no-bias",
        None,
        randn(1, 5, 4, 3),
        module=lambda: nn.ConvTranspose2d(5, 2, 3, stride=3, bias=False),
        kinds={"MPSConv2D", "MPSPixelShuffle"},
        tol={"fp16": 2e-3},
    ),
    # a computed weight and bias: permuted / broadcast on the device
    row(
        "aten.convolution.default",
        "conv-transposed-weight-input",
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2),
        randn(1, 3, 4, 4),
        randn(3, 2, 2, 2),
        randn(2),
        kinds={"MPSPermute", "MPSConv2D", "MPSPixelShuffle"},
        tol={"fp16": 2e-3},
    ),
    # batch norm folded into the weights and bias: W * s, (b - mean) * s + beta
    row(
        "aten.convolution.default",
        "conv-bn-folded",
        None,
        randn(2, 3, 7, 7),
        module=lambda: ConvBN(nn.Conv2d(3, 8, 3, padding=1)),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten._native_batch_norm_legit_no_training.default",
        "conv-bn-folded-no-bias-depthwise",
        None,
        randn(1, 6, 9, 9),
        module=lambda: ConvBN(nn.Conv2d(6, 6, 3, groups=6, padding=1, bias=False)),
        kinds="MPSDepthwiseConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten._native_batch_norm_legit_no_training.default",
        "conv1d-bn-folded-no-affine",
        None,
        randn(2, 4, 16),
        module=lambda: ConvBN(nn.Conv1d(4, 5, 3, stride=2), affine=False),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-bn-conv-result-also-read",
        None,
        randn(1, 3, 6, 6),
        module=lambda: ConvBN(nn.Conv2d(3, 4, 3), also_conv=True),
        kinds={"MPSConv2D", "MPSBatchNorm"},
        tol=CONV_TOL,
    ),
    # hardsigmoid(conv): x / 6 + 0.5 folded into the weights and bias, then one MPSHardTanh
    row(
        "aten.hardsigmoid.default",
        "conv-hardsigmoid-folded",
        None,
        randn(1, 6, 5, 5, scale=4.0),
        module=lambda: nn.Sequential(nn.Conv2d(6, 6, 1), nn.Hardsigmoid()).eval(),
        kinds={"MPSConv2D", "MPSHardTanh"},
        tol=CONV_TOL,
    ),
    row(
        "aten.hardsigmoid.default",
        "conv-hardsigmoid-result-also-read",
        None,
        randn(1, 3, 5, 5, scale=4.0),
        module=lambda: ConvThen(nn.Conv2d(3, 4, 1), lambda y: (F.hardsigmoid(y), y * 2)),
        kinds={"MPSConv2D", "MPSHardTanh", "MPSAdd"},
        tol=CONV_TOL,
    ),
    # ---- argument forms: a one-entry int list means that value for every spatial dim (schema rule)
    row(
        "aten.convolution.default",
        "conv2d-padding-valid",
        None,
        randn(1, 3, 8, 8),
        module=conv(3, 4, 3, padding="valid"),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),  # exports padding=[0]
    row(
        "aten.convolution.default",
        "conv2d-padding-same",
        None,
        randn(1, 3, 7, 9),
        module=conv(3, 4, 3, padding="same", dilation=2),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    # even kernel: "same" is an asymmetric constant_pad_nd, then the convolution
    row(
        "aten.convolution.default",
        "conv2d-padding-same-even-kernel",
        None,
        randn(1, 3, 8, 8),
        module=conv(3, 4, 4, padding="same"),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv1d-padding-valid",
        None,
        randn(2, 3, 10),
        module=conv1d(3, 4, 3, padding="valid"),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv1d-padding-same",
        None,
        randn(2, 3, 10),
        module=conv1d(3, 4, 4, padding="same"),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv2d-int-stride-padding",
        None,
        randn(1, 3, 9, 9),
        module=conv(3, 4, 3, stride=2, padding=1, dilation=1),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv2d-aten-one-entry-lists",
        lambda x, w, b: aten_conv(x, w, b, [2], [1], [2], False, [0], 1),
        randn(1, 3, 9, 8),
        randn(4, 3, 3, 3),
        randn(4),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    # output_padding is ignored by a forward convolution, whatever its value
    row(
        "aten.convolution.default",
        "conv2d-aten-one-entry-lists-output-padding",
        lambda x, w: aten_conv(x, w, None, [1], [0], [1], False, [1], 1),
        randn(1, 3, 6, 6),
        randn(4, 3, 3, 3),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv1d-aten-one-entry-lists",
        lambda x, w: aten_conv(x, w, None, [3], [2], [1], False, [0], 1),
        randn(2, 3, 11),
        randn(4, 3, 3),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv3d-aten-one-entry-lists",
        lambda x, w, b: aten_conv(x, w, b, [2], [1], [1], False, [0], 1),
        randn(1, 2, 5, 6, 5),
        randn(3, 2, 3, 3, 3),
        randn(3),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed2d-aten-one-entry-lists",
        lambda x, w, b: aten_conv(x, w, b, [2], [1], [1], True, [1], 1),
        randn(1, 3, 4, 5),
        randn(3, 2, 3, 3),
        randn(2),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed1d-aten-one-entry-lists",
        lambda x, w: aten_conv(x, w, None, [3], [0], [2], True, [1], 1),
        randn(2, 3, 5),
        randn(3, 2, 2),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    # ---- transposed convolution: zero insertion (a constant pad), then a forward convolution with the
    # kernel flipped and its channel axes swapped (a constant re-laid out once)
    row(
        "aten.convolution.default",
        "conv-transposed",
        None,
        randn(1, 3, 5, 5),
        module=convt(3, 2, 3),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed-padded",
        None,
        randn(1, 3, 5, 5),
        module=convt(3, 2, 2, 2, padding=1),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    # DCGAN / VAE decoders' upsampling: k4 s2 p1
    row(
        "aten.convolution.default",
        "conv-transposed-k4s2p1",
        None,
        randn(2, 4, 6, 5),
        module=convt(4, 3, 4, stride=2, padding=1),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed-output-padding",
        None,
        randn(1, 3, 5, 4),
        module=convt(3, 4, 3, stride=2, padding=1, output_padding=1),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed-asymmetric-all",
        None,
        randn(2, 4, 5, 6),
        module=convt(4, 6, (3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2), dilation=(1, 2), groups=2),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    # padding > dilation * (k - 1): the input is cropped (MPSSlice), the device's pads are non-negative
    row(
        "aten.convolution.default",
        "conv-transposed-crop",
        None,
        randn(1, 2, 7, 7),
        module=convt(2, 3, 3, stride=1, padding=(3, 2)),
        kinds={"MPSSlice", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed-stride-crop",
        None,
        randn(1, 2, 5, 6),
        module=convt(2, 3, 2, stride=3, padding=2),
        kinds={"MPSConstantPadND", "MPSSlice", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed-depthwise",
        None,
        randn(1, 4, 6, 6),
        module=convt(4, 4, 3, stride=2, groups=4, bias=False),
        kinds={"MPSConstantPadND", "MPSDepthwiseConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed-dilation-groups",
        None,
        randn(1, 6, 5, 5),
        module=convt(6, 4, 3, dilation=2, groups=2),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    # k == s on one axis only, and a 1x1 kernel: the general path (pixel shuffle needs a square r x r)
    row(
        "aten.convolution.default",
        "conv-transposed-k2s2-rect",
        None,
        randn(1, 3, 4, 5),
        module=convt(3, 2, (2, 1), stride=(2, 1)),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed-1x1",
        None,
        randn(1, 3, 4, 5),
        module=convt(3, 5, 1),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    # a computed weight: channel axes swapped (MPSPermute) and kernel flipped (MPSIndexSelect) on the device
    row(
        "aten.convolution.default",
        "conv-transposed-general-weight-input",
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2),
        randn(1, 4, 4, 5),
        randn(4, 3, 3, 2),
        randn(6),
        kinds={"MPSPermute", "MPSIndexSelect", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed1d",
        None,
        randn(2, 3, 7),
        module=convt1d(3, 5, 3),
        kinds="MPSConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed1d-stride-padding-output-padding",
        None,
        randn(2, 3, 7),
        module=convt1d(3, 4, 4, stride=3, padding=2, output_padding=1),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed1d-dilation-groups-crop",
        None,
        randn(1, 6, 9),
        module=convt1d(6, 3, 3, dilation=2, groups=3, padding=5, bias=False),
        kinds={"MPSSlice", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    # depthwise 1-d stays MPSConv2D (MPSDepthwiseConv2D aborts on rank-3 weights, semantics §6 #23)
    row(
        "aten.convolution.default",
        "conv-transposed1d-depthwise",
        None,
        randn(1, 5, 8),
        module=convt1d(5, 5, 3, stride=2, groups=5),
        kinds={"MPSConstantPadND", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed1d-weight-input",
        lambda x, w: F.conv_transpose1d(x, w, stride=2),
        randn(1, 3, 6),
        randn(3, 2, 3),
        kinds={"MPSPermute", "MPSIndexSelect", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    # ---- 3-d: one 2-d convolution over the depth taps stacked into channels (gather, permutes)
    row(
        "aten.convolution.default",
        "conv3d",
        None,
        randn(1, 2, 4, 4, 4),
        module=conv3d(2, 2, 3),
        kinds={"MPSIndexSelect", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv3d-stride-padding-dilation",
        None,
        randn(2, 3, 7, 6, 8),
        module=conv3d(3, 4, (3, 2, 3), stride=(2, 1, 2), padding=(2, 1, 0), dilation=(2, 1, 1)),
        kinds={"MPSConstantPadND", "MPSIndexSelect", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv3d-groups-no-bias",
        None,
        randn(1, 4, 5, 5, 5),
        module=conv3d(4, 6, 3, groups=2, padding=1, bias=False),
        kinds={"MPSConstantPadND", "MPSIndexSelect", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    # kD = 1, stride 1: no gather, a depthwise 2-d convolution over N*D images
    row(
        "aten.convolution.default",
        "conv3d-depthwise-k133",
        None,
        randn(2, 4, 3, 6, 6),
        module=conv3d(4, 4, (1, 3, 3), groups=4, padding=(0, 1, 1)),
        kinds="MPSDepthwiseConv2D",
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv3d-padding-same",
        None,
        randn(1, 2, 5, 6, 4),
        module=conv3d(2, 3, 3, padding="same"),
        kinds={"MPSConstantPadND", "MPSIndexSelect", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv3d-weight-input",
        lambda x, w: F.conv3d(x, w, stride=(1, 2, 1)),
        randn(1, 2, 4, 5, 5),
        randn(3, 2, 2, 3, 3),
        kinds={"MPSIndexSelect", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed3d",
        None,
        randn(1, 3, 3, 4, 4),
        module=convt3d(3, 2, 3),
        kinds={"MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed3d-stride-padding-output-padding",
        None,
        randn(2, 2, 3, 4, 3),
        module=convt3d(2, 3, (3, 2, 3), stride=(2, 2, 1), padding=(1, 0, 2), output_padding=(1, 1, 0)),
        kinds={"MPSConstantPadND", "MPSIndexSelect", "MPSConv2D"},
        tol=CONV_TOL,
    ),
    row(
        "aten.convolution.default",
        "conv-transposed3d-groups-dilation",
        None,
        randn(1, 4, 3, 3, 3),
        module=convt3d(4, 6, 2, stride=(1, 2, 2), groups=2, dilation=(2, 1, 1)),
        kinds={"MPSConstantPadND", "MPSIndexSelect", "MPSConv2D"},
        tol=CONV_TOL,
    ),
]
