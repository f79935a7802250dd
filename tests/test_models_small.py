"""Small transformer models lower to one MPS delegate with nothing on CPU, and the delegate blob of
the .pte, run in the device model, matches eager PyTorch.

- ExecuTorch's example llama (``construct_transformer``, no KV cache): embedding, RMSNorm (mean,
  rsqrt), RoPE (slices, cat, mul), attention through ``F.scaled_dot_product_attention`` (torch 2.14's
  decomposition: softmax plus the fully-masked-row guard eq/logical_not/any/where), SwiGLU (sigmoid).
- ``torch.nn.TransformerEncoder`` (batch_first, 2 layers): addmm/linear, layer norm, relu, SDPA.

Tolerances (max |device - eager| / max |eager|):
- fp32 1e-5: the device model computes every op in float32 like eager; only the order of some
  reductions differs (measured ~3e-7).
- fp16 1e-2: every op's result is rounded to float16 (2^-11 ~ 4.9e-4 relative) through ~250 chained
  ops with reductions (softmax, norms, matmuls over 64-256 elements); measured ~1e-3. A wrong
  lowering gives errors of order 1, so 1e-2 keeps a 10x margin without hiding one. The fp16 eager
  reference runs in float32 on the inputs rounded to float16 (what the device's boundary cast sees).
"""

from __future__ import annotations

import pytest
import torch

from mps_backend.export import export_model
from mps_backend.runtime import run_pte
from mps_backend.runtime.interpreter import execute
from mps_backend.serialization.pte import delegate_blobs

TOL = {False: 1e-5, True: 1e-2}


def small_llama():
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(0)
    model = construct_transformer(ModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=128, max_seq_len=32))
    return model.eval(), (torch.randint(0, 128, (1, 8)),)


def small_encoder():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    return model.eval(), (torch.randn(2, 8, 64),)


MODELS = {"llama": small_llama, "transformer_encoder": small_encoder}


@pytest.fixture(
    scope="module",
    params=[(name, fp16) for name in MODELS for fp16 in (False, True)],
    ids=[f"{name}-{'fp16' if fp16 else 'fp32'}" for name in MODELS for fp16 in (False, True)],
)
def exported(request):
    name, use_fp16 = request.param
    model, inputs = MODELS[name]()
    return model, inputs, use_fp16, export_model(model, inputs, use_fp16=use_fp16)


def test_one_delegate_nothing_on_cpu(exported):
    _, _, _, result = exported
    report = result.report
    assert report.on_cpu == [], str(report)
    assert result.delegates == 1 and report.partitions == 1, str(report)
    assert len(report.delegated) > 100


def test_delegate_blob_matches_eager(exported):
    model, inputs, use_fp16, result = exported
    blobs = delegate_blobs(result.pte)
    assert len(blobs) == 1
    outs, info = execute(blobs[0].blob, list(inputs), return_report=True)
    assert not [i for i in info if i.reinterpreted]
    eager_in = [x.half().float() if use_fp16 and x.dtype == torch.float32 else x for x in inputs]
    with torch.no_grad():
        want = model(*eager_in)
    assert len(outs) == 1
    got = outs[0]
    assert got.dtype == want.dtype and got.numel() == want.numel()
    err = (got.reshape(want.shape).double() - want.double()).abs().max().item() / want.abs().max().item()
    assert err <= TOL[use_fp16], f"relative error {err:.3g} > {TOL[use_fp16]}"
    if use_fp16:
        assert err > 0, "fp16 output bit-identical to fp32 eager: is the graph computing in float16?"


def test_whole_pte_in_the_emulated_runtime(exported):
    """The .pte run by ExecuTorch with the emulated MPSBackend gives the delegate's own result."""
    _, inputs, _, result = exported
    direct = execute(delegate_blobs(result.pte)[0].blob, list(inputs))
    via_runtime = run_pte(result.pte, list(inputs))
    assert len(via_runtime) == 1 and torch.equal(via_runtime[0].reshape(direct[0].shape), direct[0])
