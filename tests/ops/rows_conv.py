"""Convolution rows: 1-d and 2-d, bias or not, strides, dilations, groups, depthwise, batch norm
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


conv, conv1d = _seeded(nn.Conv2d), _seeded(nn.Conv1d)


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
    row("conv2d-basic", None, randn(1, 3, 8, 8), module=conv(3, 4, 3), kinds="MPSConv2D", tol=CONV_TOL),
    row("conv2d-stride-pad-dilation", None, randn(2, 4, 11, 9),
        module=conv(4, 6, (3, 2), stride=(2, 1), padding=(2, 1), dilation=(1, 2)), kinds="MPSConv2D", tol=CONV_TOL),
    row("conv2d-no-bias", None, randn(1, 3, 6, 6), module=conv(3, 5, 1, bias=False), kinds="MPSConv2D",
        tol=CONV_TOL),
    row("conv2d-groups", None, randn(1, 4, 7, 7), module=conv(4, 8, 3, groups=2, padding=1), kinds="MPSConv2D",
        tol=CONV_TOL),
    row("conv2d-depthwise", None, randn(1, 6, 9, 9), module=conv(6, 6, 3, groups=6, padding=1, stride=2),
        kinds="MPSDepthwiseConv2D", tol=CONV_TOL),
    row("conv1d-basic", None, randn(2, 3, 16), module=conv1d(3, 4, 5, padding=2, stride=2), kinds="MPSConv2D",
        tol=CONV_TOL),
    row("conv1d-depthwise-groups", None, randn(1, 4, 12), module=conv1d(4, 4, 3, groups=4), kinds="MPSConv2D",
        tol=CONV_TOL),
    row("conv-transposed", None, randn(1, 3, 5, 5), module=lambda: nn.ConvTranspose2d(3, 2, 3),
        cpu_reason="transposed convolution"),
    row("conv-transposed-padded", None, randn(1, 3, 5, 5), module=lambda: nn.ConvTranspose2d(3, 2, 2, 2, padding=1),
        cpu_reason="transposed convolution"),
    # kernel == stride (upsampling): 1x1 conv to C_out*r*r channels + pixel shuffle
    row("conv-transposed-k2s2", None, randn(2, 3, 5, 6), module=lambda: nn.ConvTranspose2d(3, 4, 2, stride=2),
        kinds={"MPSConv2D", "MPSPixelShuffle"}, tol={"fp16": 2e-3}),
    row("conv-transposed-k3s3-no-bias", None, randn(1, 5, 4, 3),
        module=lambda: nn.ConvTranspose2d(5, 2, 3, stride=3, bias=False), kinds={"MPSConv2D", "MPSPixelShuffle"},
        tol={"fp16": 2e-3}),
    # a computed weight and bias: permuted / broadcast on the device
    row("conv-transposed-weight-input", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2), randn(1, 3, 4, 4),
        randn(3, 2, 2, 2), randn(2), kinds={"MPSPermute", "MPSConv2D", "MPSPixelShuffle"}, tol={"fp16": 2e-3}),
    # batch norm folded into the weights and bias: W * s, (b - mean) * s + beta
    row("conv-bn-folded", None, randn(2, 3, 7, 7), module=lambda: ConvBN(nn.Conv2d(3, 8, 3, padding=1)),
        kinds="MPSConv2D", tol=CONV_TOL),
    row("conv-bn-folded-no-bias-depthwise", None, randn(1, 6, 9, 9),
        module=lambda: ConvBN(nn.Conv2d(6, 6, 3, groups=6, padding=1, bias=False)), kinds="MPSDepthwiseConv2D",
        tol=CONV_TOL),
    row("conv1d-bn-folded-no-affine", None, randn(2, 4, 16),
        module=lambda: ConvBN(nn.Conv1d(4, 5, 3, stride=2), affine=False), kinds="MPSConv2D", tol=CONV_TOL),
    row("conv-bn-conv-result-also-read", None, randn(1, 3, 6, 6),
        module=lambda: ConvBN(nn.Conv2d(3, 4, 3), also_conv=True), kinds={"MPSConv2D", "MPSBatchNorm"}, tol=CONV_TOL),
    # hardsigmoid(conv): x / 6 + 0.5 folded into the weights and bias, then one MPSHardTanh
    row("conv-hardsigmoid-folded", None, randn(1, 6, 5, 5, scale=4.0),
        module=lambda: nn.Sequential(nn.Conv2d(6, 6, 1), nn.Hardsigmoid()).eval(), kinds={"MPSConv2D", "MPSHardTanh"},
        tol=CONV_TOL),
    row("conv-hardsigmoid-result-also-read", None, randn(1, 3, 5, 5, scale=4.0), module=lambda: ConvThen(
        nn.Conv2d(3, 4, 1), lambda y: (F.hardsigmoid(y), y * 2)), kinds={"MPSConv2D", "MPSHardTanh", "MPSAdd"},
        tol=CONV_TOL),
    row("conv3d", None, randn(1, 2, 4, 4, 4), module=lambda: nn.Conv3d(2, 2, 3), cpu_reason="3-d convolution"),
]
