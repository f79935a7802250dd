"""Model specs for ``mps-backend export --model``: 'demo', 'torchvision:NAME', 'path/file.py:factory'.

A factory returns ``(model, example_inputs)``. Weights are random (nothing is downloaded).
"""
from __future__ import annotations

import importlib.util
import pathlib

import torch

#: torchvision models whose default input is not 224x224
_TV_INPUT = {"inception_v3": 299}


def _torchvision(name: str):
    try:
        import torchvision  # noqa: PLC0415
    except ImportError as e:
        raise SystemExit("torchvision is not installed: pip install torchvision==0.29.1") from e
    kwargs = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, **kwargs).eval()
    size = _TV_INPUT.get(name, 224)
    return model, (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0)),)


def _from_file(path: str, factory: str):
    file = pathlib.Path(path)
    if not file.exists():
        raise SystemExit(f"model file {file} does not exist")
    spec = importlib.util.spec_from_file_location(f"_mps_model_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, factory):
        raise SystemExit(f"{file} has no function {factory!r}")
    model, inputs = getattr(module, factory)()
    return model.eval(), tuple(inputs)


def load(spec: str):
    """(model, example_inputs) for a --model spec."""
    if spec == "demo":
        from mps_backend.demo import demo_model  # noqa: PLC0415

        return demo_model()
    kind, _, name = spec.partition(":")
    if kind == "torchvision" and name:
        return _torchvision(name)
    if spec.count(":") == 1 and kind.endswith(".py"):
        return _from_file(kind, name)
    raise SystemExit(f"unknown model spec {spec!r}: use demo, torchvision:NAME or path/to/file.py:factory")
