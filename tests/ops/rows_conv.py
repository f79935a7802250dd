"""Convolution rows: 1-d and 2-d, bias or not, strides, dilations, groups, depthwise."""
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
    row("conv3d", None, randn(1, 2, 4, 4, 4), module=lambda: nn.Conv3d(2, 2, 3), cpu_reason="3-d convolution"),
]
