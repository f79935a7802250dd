"""Model specs for ``mps-backend export --model``: 'demo', 'torchvision:NAME', 'executorch:NAME' (llama,
llama-kv and the executorch example models of EXECUTORCH_EXAMPLES), 'torch:transformer_encoder',
'path/file.py:factory'. The model zoo (harness/zoo.py) lists the ones that are checked.

A factory returns ``(model, example_inputs)``. Weights are random (nothing is downloaded).
"""

from __future__ import annotations

import importlib.util
import pathlib

import torch

from mps_backend.tools import legacy
from mps_backend.tools.demo import demo_model

#: torchvision models whose default input is not 224x224
_TV_INPUT = {"inception_v3": 299}


def calibrate_batchnorm(model: torch.nn.Module, inputs, batch: int = 8, steps: int = 2) -> torch.nn.Module:
    """Give the BatchNorm layers of a randomly initialised model the running statistics of its own
    activations (``steps`` train-mode passes over seeded ``randn`` batches like ``inputs``, cumulative
    average), as training would. With the initial statistics (mean 0, var 1) the activations of deep
    random convnets shrink layer after layer (torchvision mobilenet_v2: outputs ~3e-9), below float16's
    range, so an fp16 check would only compare underflowed zeros. Weights stay random."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    floats = [x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if not norms or len(floats) != len(inputs):
        return model
    gen = torch.Generator().manual_seed(1)
    saved = [(m, m.momentum) for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average
    model.train()
    with torch.no_grad():
        for _ in range(steps):
            model(*(torch.randn((batch, *x.shape[1:]), generator=gen, dtype=x.dtype) for x in floats))
    for m, momentum in saved:
        m.momentum = momentum
    return model.eval()


def _torchvision(name: str):
    try:
        import torchvision  # noqa: PLC0415
    except ImportError as e:
        raise SystemExit("torchvision is not installed: pip install torchvision==0.29.1") from e
    kwargs = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
    if name in torchvision.models.list_models(torchvision.models.segmentation) or name in torchvision.models.list_models(
        torchvision.models.detection
    ):
        kwargs["weights_backbone"] = None  # the default would download ImageNet backbone weights
    if name not in torchvision.models.list_models():
        raise SystemExit(f"unknown torchvision model {name!r} (torchvision.models.list_models() lists them)")
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, **kwargs).eval()
    with torch.no_grad():  # zero-initialised matrices (vit's head and class token) would make the output 0
        for p in model.parameters():
            if p.dim() > 1 and not p.any():
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(p.numel()))
    if name in torchvision.models.list_models(torchvision.models.segmentation):
        model = _FlatForward(model, lambda x: ((x,), {}), lambda out: out["out"]).eval()  # {"out": ...}
    size = _TV_INPUT.get(name, 224)
    inputs = (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0)),)
    return calibrate_batchnorm(model, inputs), inputs


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


# ---- executorch example models, llama, TransformerEncoder (the model zoo: harness/zoo.py) ----------

#: the issue's llama: ``construct_transformer(ModelArgs(dim=768, n_layers=12, n_heads=12, vocab_size=32000,
#: max_seq_len=128))``; the prompt without KV cache is LLAMA_PROMPT tokens long
LLAMA_ARGS = {"dim": 768, "n_layers": 12, "n_heads": 12, "vocab_size": 32000, "max_seq_len": 128}
LLAMA_PROMPT = 16


class _FlatForward(torch.nn.Module):
    """Flat tensor inputs and outputs around a model with nested ones, so the ``.pte``'s forward
    arguments are the model's tensors in order (``run_pte``/``verify`` pass a flat list)."""

    def __init__(self, model: torch.nn.Module, pack, unpack=None):
        super().__init__()
        self.model, self._pack, self._unpack = model, pack, unpack

    def forward(self, *flat):
        args, kwargs = self._pack(*flat)
        out = self.model(*args, **kwargs)
        return self._unpack(out) if self._unpack else out


def llama(kv_cache: bool = False, prompt: int = LLAMA_PROMPT, **overrides):
    """executorch's example llama (random weights). Without KV cache: ``tokens [1, prompt]`` ->
    logits of the last token. With KV cache (``ModelArgs(use_kv_cache=True)``: k/v caches are
    mutable buffers updated in place at ``input_pos``): ``(tokens [1, 1], input_pos [1])`` -> logits."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer  # noqa: PLC0415
    from executorch.examples.models.llama.model_args import ModelArgs  # noqa: PLC0415

    torch.manual_seed(0)
    args = ModelArgs(**{**LLAMA_ARGS, **overrides}, use_kv_cache=kv_cache)
    model = construct_transformer(args).eval()
    # frozen weights: with weights requiring grad, to_executorch's copy_ of the updated KV cache back into its
    # buffer fails ("a leaf Variable that requires grad is being used in an in-place operation")
    model.requires_grad_(False)
    vocab = args.vocab_size
    if not kv_cache:
        tokens = torch.randint(1, vocab, (1, prompt), generator=torch.Generator().manual_seed(0))
        return model, (tokens,)
    wrapped = _FlatForward(model, lambda tokens, input_pos: ((tokens, {"input_pos": input_pos}), {}))
    return wrapped.eval(), (torch.tensor([[7]], dtype=torch.long), torch.tensor([0], dtype=torch.long))


def transformer_encoder(d_model: int = 512, nhead: int = 8, num_layers: int = 6, seq: int = 64):
    """``torch.nn.TransformerEncoder`` (batch_first), input ``[1, seq, d_model]``."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model, nhead, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False).eval()
    return model, (torch.randn(1, seq, d_model, generator=torch.Generator().manual_seed(0)),)


def _efficient_sam():
    """EfficientSAM ViT-T with random weights: ``build_efficient_sam_vitt()`` would download its
    checkpoint, so the same builder is called with ``checkpoint=None``."""
    from executorch.examples.models.efficient_sam import EfficientSAM  # noqa: PLC0415
    from executorch.examples.models.efficient_sam.efficient_sam_core.efficient_sam import build_efficient_sam  # noqa: PLC0415

    torch.manual_seed(0)
    model = build_efficient_sam(encoder_patch_embed_dim=192, encoder_num_heads=3, checkpoint=None).eval()
    return model, tuple(EfficientSAM().get_example_inputs())


#: executorch example models (executorch.examples.models.MODEL_NAME_TO_MODEL) built here
EXECUTORCH_EXAMPLES = ("lstm", "ds_cnn", "mobilenet_v1_025", "resnet8", "deep_autoencoder", "efficient_sam")


def _executorch_example(name: str):
    if name == "llama":
        return llama(kv_cache=False)
    if name == "llama-kv":
        return llama(kv_cache=True)
    if name == "efficient_sam":
        return _efficient_sam()
    from executorch.examples.models import MODEL_NAME_TO_MODEL  # noqa: PLC0415
    from executorch.examples.models.model_factory import EagerModelFactory  # noqa: PLC0415

    if name not in MODEL_NAME_TO_MODEL:
        raise SystemExit(f"unknown executorch example model {name!r}: " + ", ".join(("llama", "llama-kv") + EXECUTORCH_EXAMPLES))
    torch.manual_seed(0)
    model, inputs, _, _ = EagerModelFactory.create_model(*MODEL_NAME_TO_MODEL[name])
    model = calibrate_batchnorm(model, inputs)
    if name == "lstm":  # forward(x, (h0, c0)) -> (y, (h, c)): flat (x, h0, c0) -> (y, h, c)
        x, (h0, c0) = inputs
        model = _FlatForward(model, lambda x, h, c: ((x, (h, c)), {}), lambda out: (out[0], *out[1])).eval()
        inputs = (x, h0, c0)
    return model, tuple(inputs)


def load(spec: str, input_shapes=None):
    """(model, example_inputs) for a --model spec; ``input_shapes`` (--input-shape) only for the
    PyTorch Mobile flatbuffer files of mps_backend/tools/legacy.py."""
    if legacy.handles(spec):  # path.ff / path.ptl carrying PTMF: TorchScript -> ExportedProgram
        return legacy.load_legacy(spec, input_shapes)
    if input_shapes:
        raise SystemExit("--input-shape applies to PyTorch Mobile flatbuffer models (.ff/.ptl) only")
    if spec == "demo":
        return demo_model()
    kind, _, name = spec.partition(":")
    if kind == "torchvision" and name:
        return _torchvision(name)
    if kind == "executorch" and name:
        return _executorch_example(name)
    if spec == "torch:transformer_encoder":
        return transformer_encoder()
    if spec.count(":") == 1 and kind.endswith(".py"):
        return _from_file(kind, name)
    raise SystemExit(
        f"unknown model spec {spec!r}: use demo, torchvision:NAME, executorch:NAME, "
        "torch:transformer_encoder or path/to/file.py:factory"
    )
