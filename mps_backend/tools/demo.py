"""The built-in demo model: a small convnet, one attention block and an MLP head."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        return x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))


class DemoModel(nn.Module):
    """Conv-BN-ReLU, max pool, strided conv, attention over the 8x8 grid, mean, MLP head."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.attn = Attention(32)
        self.head = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.conv2(x))
        tokens = self.attn(x.flatten(2).transpose(1, 2))
        return self.head(tokens.mean(dim=1))


def demo_model(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The demo model with deterministic random weights (and non-trivial batch-norm stats)."""
    gen = torch.Generator().manual_seed(seed)
    model = DemoModel()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        model.bn1.running_mean.copy_(torch.randn(16, generator=gen) * 0.1)
        model.bn1.running_var.copy_(torch.rand(16, generator=gen) + 0.5)
    return model.eval(), (torch.randn(1, 3, 32, 32, generator=gen),)
