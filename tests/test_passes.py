"""The lowering passes (mps_backend.passes), each on its own: what it rewrites, what it leaves, and that the
rewritten graph still computes the model (run eagerly, a CHANNEL_AFFINE annotation applied as its map)."""

from __future__ import annotations

import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules
from torch import nn

from mps_backend import MPSPartitioner
from mps_backend.backend import shared_weight_copy
from mps_backend.passes import (
    CHANNEL_AFFINE,
    fold_conv_epilogues,
    fold_power_of_two_rescales,
    transpose_linear_weights,
)
from mps_backend.passes._graph import REPLACES, constant_tensor, target_of

aten = torch.ops.aten


def _delegated(model: nn.Module, *inputs: torch.Tensor):
    """The program MPSBackend.preprocess would be handed (one delegate), as a private copy."""
    edge = to_edge_transform_and_lower(torch.export.export(model.eval(), inputs), partitioner=[MPSPartitioner()])
    (lowered,) = [m for _, m, _ in get_lowered_submodules(edge.exported_program().graph_module)]
    return shared_weight_copy(lowered.original_module)


class _Eager(torch.fx.Interpreter):
    def run_node(self, n):
        out = super().run_node(n)
        affine = n.meta.get(CHANNEL_AFFINE)
        return affine.apply(out) if affine is not None else out


def _run(ep, *inputs: torch.Tensor) -> torch.Tensor:
    user = iter(inputs)
    args = [t if (t := constant_tensor(ep, n)) is not None else next(user) for n in ep.graph.nodes if n.op == "placeholder"]
    out = _Eager(ep.graph_module).run(*args)
    return out[0] if isinstance(out, (list, tuple)) else out


def _targets(ep) -> list:
    return [target_of(n) for n in ep.graph.nodes if n.op == "call_function"]


def _conv_bn(also_conv: bool = False) -> nn.Module:
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(4)
    bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    bn.bias.data.uniform_(-1, 1)
    conv = nn.Conv2d(3, 4, 3)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = conv, bn

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y if also_conv else self.bn(y)

    return M()


def test_batch_norm_folds_into_the_convolution():
    model, x = _conv_bn(), torch.randn(2, 3, 8, 8)
    ep = _delegated(model, x)
    assert aten._native_batch_norm_legit_no_training.default in _targets(ep)
    assert fold_conv_epilogues(ep) == 1
    assert aten._native_batch_norm_legit_no_training.default not in _targets(ep)
    (conv,) = [n for n in ep.graph.nodes if target_of(n) is aten.convolution.default]
    affine = conv.meta[CHANNEL_AFFINE]
    bn = model.bn
    torch.testing.assert_close(affine.scale, (bn.weight / torch.sqrt(bn.running_var + bn.eps)).double().detach())
    assert [n.name for n in affine.absorbed] and affine.absorbed[0].meta.get("debug_handle") is not None
    with torch.no_grad():
        torch.testing.assert_close(_run(ep, x), model(x), rtol=1e-5, atol=1e-5)


def test_batch_norm_stays_when_the_convolution_is_read_elsewhere():
    ep = _delegated(_conv_bn(also_conv=True), torch.randn(1, 3, 8, 8))
    assert fold_conv_epilogues(ep) == 0
    assert aten._native_batch_norm_legit_no_training.default in _targets(ep)
    assert not any(CHANNEL_AFFINE in n.meta for n in ep.graph.nodes)


def test_hardsigmoid_becomes_a_clamp_of_the_folded_convolution():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Conv2d(6, 6, 1), nn.Hardsigmoid()), torch.randn(1, 6, 4, 4) * 4
    ep = _delegated(model, x)
    (hs,) = [n for n in ep.graph.nodes if target_of(n) is aten.hardsigmoid.default]
    assert fold_conv_epilogues(ep) == 1
    (clamp,) = [n for n in ep.graph.nodes if target_of(n) is aten.hardtanh.default]
    assert clamp.args[1:] == (0.0, 1.0) and clamp.meta[REPLACES] == hs.name
    assert aten.hardsigmoid.default not in _targets(ep)
    with torch.no_grad():
        want = model(x)
    assert (want == 0).any() and (want == 1).any()  # inputs reach both ends of the clamp
    torch.testing.assert_close(_run(ep, x), want, rtol=1e-5, atol=1e-6)


def test_transposed_convolution_is_not_folded():
    model = nn.Sequential(nn.ConvTranspose2d(3, 4, 2, stride=2), nn.BatchNorm2d(4))
    ep = _delegated(model, torch.randn(1, 3, 4, 4))
    assert fold_conv_epilogues(ep) == 0


class _Rescale(nn.Module):
    def __init__(self, a, d):
        super().__init__()
        self.a, self.d = a, d

    def forward(self, x):
        return torch.relu(x * self.a / self.d)


def test_power_of_two_rescale_is_one_multiply():
    x = torch.randn(8) * 100
    ep = _delegated(_Rescale(4096, 16), x)
    assert fold_power_of_two_rescales(ep, use_fp16=True) == 1
    assert aten.div.Tensor not in _targets(ep) and aten.mul.Tensor not in _targets(ep)
    (mul,) = [n for n in ep.graph.nodes if target_of(n) is aten.mul.Scalar]
    assert mul.args[1] == 256.0
    torch.testing.assert_close(_run(ep, x), _Rescale(4096, 16)(x), rtol=0, atol=0)


def test_equal_powers_of_two_leave_the_input():
    x = torch.randn(8) * 100
    ep = _delegated(_Rescale(1024, 1024), x)
    assert fold_power_of_two_rescales(ep, use_fp16=False) == 1
    assert aten.div.Tensor not in _targets(ep) and aten.alias_copy.default in _targets(ep)
    torch.testing.assert_close(_run(ep, x), torch.relu(x), rtol=0, atol=0)


def test_rescales_that_are_not_exact_stay():
    x = torch.randn(8)
    assert fold_power_of_two_rescales(_delegated(_Rescale(3, 2), x), use_fp16=False) == 0
    # 2**-20 / 2**10 = 2**-30: a normal float32, below float16's normal range
    assert fold_power_of_two_rescales(_delegated(_Rescale(2.0**-20, 1024), x), use_fp16=False) == 1
    assert fold_power_of_two_rescales(_delegated(_Rescale(2.0**-20, 1024), x), use_fp16=True) == 0


class _UnitScaled(nn.Module):
    """Transformers' eager attention with the query scaled beforehand: ``matmul(q, k^T) * 1.0`` (Whisper)."""

    def forward(self, q, k):
        return torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 1.0, dim=-1) * 1


def test_a_multiply_by_one_leaves_its_operand():
    q, k = torch.randn(2, 6, 4), torch.randn(2, 6, 4)
    q[0, 0, 0], k[0, 1, 1] = float("nan"), float("-inf")
    ep = _delegated(_UnitScaled(), q, k)
    assert fold_power_of_two_rescales(ep, use_fp16=False) == 2
    assert not {aten.mul.Tensor, aten.mul.Scalar} & set(_targets(ep))
    torch.testing.assert_close(_run(ep, q, k), _UnitScaled()(q, k), rtol=0, atol=0, equal_nan=True)
    # a multiply by ones that broadcasts stays (its result is not its operand)
    assert fold_power_of_two_rescales(_delegated(_Fn(lambda x: x * torch.ones(3, 1, 1)), torch.randn(2, 6)), use_fp16=False) == 0


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class _Linears(nn.Module):
    """A weight shared by two linears (an LSTM's), one of its own, and an embedding tied to a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.shared, self.own = nn.Linear(8, 8), nn.Linear(8, 4, bias=False)
        self.emb = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x, ids):
        h = self.shared(self.shared(x) + self.emb(ids))
        return torch.cat([self.own(h), self.head(h)], dim=-1)


def test_linear_weights_are_stored_transposed_without_a_copy():
    model, x, ids = _Linears().eval(), torch.randn(2, 3, 8), torch.tensor([[1, 2, 3], [4, 5, 6]])
    ep = _delegated(model, x, ids)
    before = {n.name: constant_tensor(ep, n) for n in ep.graph.nodes if n.op == "placeholder"}
    assert transpose_linear_weights(ep) == 2  # shared and own; the tied table is read by the embedding too
    permutes = [n for n in ep.graph.nodes if target_of(n) is aten.permute_copy.default]
    assert len(permutes) == 2
    for p in permutes:
        (w,) = p.all_input_nodes
        stored = constant_tensor(ep, w)
        assert stored.shape == before[w.name].shape[::-1] and stored.data_ptr() == before[w.name].data_ptr()
        assert all(target_of(u) is aten.linear.default and u.args[1] is p for u in p.users)
    shared = next(p for p in permutes if len(p.users) == 2)  # both uses of the shared weight read one permute
    assert shared is not None
    (tied,) = [
        n
        for n in ep.graph.nodes
        if n.op == "placeholder" and before[n.name] is not None and tuple(before[n.name].shape) == (10, 8)
    ]
    assert constant_tensor(ep, tied) is before[tied.name]  # untouched
    with torch.no_grad():
        torch.testing.assert_close(_run(ep, x, ids), model(x, ids), rtol=1e-6, atol=1e-6)


def test_linear_weights_leave_no_permute_on_the_device():
    from mps_backend.runtime import run_pte
    from mps_backend.serialization import read_blob
    from mps_backend.serialization.pte import delegate_blobs

    model, x, ids = _Linears().eval(), torch.randn(2, 3, 8), torch.tensor([[1, 2, 3], [4, 5, 6]])
    edge = to_edge_transform_and_lower(torch.export.export(model, (x, ids)), partitioner=[MPSPartitioner(use_fp16=False)])
    pte = edge.to_executorch().buffer
    (blob,) = [d.blob for d in delegate_blobs(pte)]
    ops = [n.op for n in read_blob(blob).graph.nodes]
    assert ops.count("MPSPermute") == 1, ops  # the tied head's weight only; shared and own read W.T constants
    with torch.no_grad():
        torch.testing.assert_close(run_pte(pte, [x, ids])[0], model(x, ids), rtol=1e-5, atol=1e-5)


class _PreNormBlock(nn.Module):
    """A float16 pre-norm residual block as transformers writes one: the residual stream in the model
    dtype, RMSNorm statistics in float32 by an explicit upcast, a linear writing the residual."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False)

    def norm(self, h):
        z = h.float()
        return (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)

    def forward(self, x):
        h = x + self.out(torch.relu(self.inp(self.norm(x))))
        return self.norm(h)


def test_precision_pass_keeps_float32_parts_widens_the_residual_and_rescales():
    """Precision.FP16 on a float16 program: the model's float32 statistics stay float32 (the upcast and
    what follows it), the residual add the statistics read is computed in float32, the linear writing it
    is rescaled (its input times 2**-5, its float32 result times 2**5), and dtypes meet only at casts;
    the rewritten graph still computes the model."""
    from mps_backend.passes import assign_device_dtypes
    from mps_backend.precision import DEVICE_DTYPE, Precision

    model, x = _PreNormBlock().half(), torch.randn(2, 8).half()
    ep = _delegated(model, x)
    counts = assign_device_dtypes(ep, Precision.FP16)
    ep.graph_module.recompile()
    assert counts["rescaled matmuls"] == 1 and counts["widened"] >= 1 and counts["casts"] >= 2, counts
    dtype = {n: n.meta.get(DEVICE_DTYPE) for n in ep.graph.nodes}
    adds = [n for n in ep.graph.nodes if target_of(n) is aten.add.Tensor and n.meta["val"].dtype == torch.float16]
    assert adds and all(dtype[n] == torch.float32 for n in adds), "the residual add is not float32"
    assert all(dtype[n] == torch.float32 for n in ep.graph.nodes if target_of(n) in (aten.mean.dim, aten.rsqrt.default))
    assert all(dtype[n] == torch.float16 for n in ep.graph.nodes if target_of(n) in (aten.mm.default, aten.addmm.default))
    scales = sorted(n.args[1] for n in ep.graph.nodes if target_of(n) is aten.mul.Scalar)
    assert scales == [2.0**-5, 2.0**5], scales
    for n in ep.graph.nodes:  # float operands of one device dtype, except at casts
        if n.op != "call_function" or target_of(n) in (aten._to_copy.default,) or "to_dim_order_copy" in str(n.target):
            continue
        floats = {dtype.get(a) or a.meta["val"].dtype for a in n.all_input_nodes if a.meta["val"].dtype.is_floating_point}
        assert len(floats - {None}) <= 1, (n.name, floats)
    assert torch.allclose(_run(ep, x).float(), model(x).float(), atol=2e-3)


def test_precision_pass_keeps_statistics_float32_in_a_float32_program():
    """Precision.FP16 on a float32-traced program (the zoo path): layer norm and softmax are float32
    islands whose input (read by nothing else) stays float32 and whose weight is stored float32; the
    linear between them is float16; Precision.FP16_UNIFORM and FP32 record nothing."""
    from mps_backend.passes import assign_device_dtypes
    from mps_backend.precision import DEVICE_DTYPE, Precision

    model = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.Softmax(-1))
    x = torch.randn(2, 8)
    for policy in (Precision.FP16_UNIFORM, Precision.FP32):
        ep = _delegated(model, x)
        assert assign_device_dtypes(ep, policy) == {} and not any(DEVICE_DTYPE in n.meta for n in ep.graph.nodes)
    ep = _delegated(model, x)
    assign_device_dtypes(ep, Precision.FP16)
    dtype = {target_of(n): n.meta.get(DEVICE_DTYPE) for n in ep.graph.nodes if n.op == "call_function"}
    assert dtype[aten.native_layer_norm.default] == dtype[aten._softmax.default] == torch.float32
    assert dtype.get(aten.addmm.default, dtype.get(aten.linear.default)) == torch.float16
    inputs = [n for n in ep.graph.nodes if n.op == "placeholder" and constant_tensor(ep, n) is None]
    assert [n.meta[DEVICE_DTYPE] for n in inputs] == [torch.float32]
    weight = next(n for n in ep.graph.nodes if n.op == "placeholder" and "0_weight" in n.name)
    assert weight.meta[DEVICE_DTYPE] == torch.float32


def test_constant_tensors_is_constant_tensor_of_every_placeholder():
    """The one-pass table of the constants (parameters, persistent and non-persistent buffers, lifted tensor
    constants) holds what ``constant_tensor`` finds for each placeholder, and nothing for a user input."""
    from mps_backend.passes._graph import constant_tensors

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4))
            self.register_buffer("kept", torch.randn(4))
            self.register_buffer("scratch", torch.randn(4), persistent=False)

        def forward(self, x):
            return x * self.w + self.kept - self.scratch + torch.tensor([1.0, 2.0, 3.0, 4.0])

    ep = torch.export.export(M(), (torch.randn(4),))
    table = constant_tensors(ep)
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    assert len(table) == 4 and len(placeholders) == 5
    for n in placeholders:
        want = constant_tensor(ep, n)
        assert table.get(n.name) is want, n.name


class _EncoderAttention(nn.Module):
    """Self-attention as transformers' Whisper writes it: the query scaled, ``matmul(q, k^T) * 1.0``, softmax
    (``after``: the scores scaled instead, ``matmul(q, k^T) * after``)."""

    def __init__(self, d: int = 8, after: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d, bias=False), nn.Linear(d, d)
        self.after = after

    def forward(self, x):
        q = self.q(x) * (self.q.in_features**-0.5 if self.after == 1.0 else 1.0)
        p = torch.softmax(torch.matmul(q, self.k(x).transpose(-1, -2)) * self.after, dim=-1)
        return torch.matmul(p, self.v(x))


def _scores(pte: bytes, n: int) -> list[tuple[str, str]]:
    """(op, dtype) of the nodes writing an ``[.., n, n]`` value of the program's delegate."""
    from mps_backend.serialization import read_blob
    from mps_backend.serialization.device_facts import node_value_ids
    from mps_backend.serialization.pte import delegate_blobs

    (blob,) = [d.blob for d in delegate_blobs(pte)]
    g = read_blob(blob).graph
    out = []
    for node in g.nodes:
        for v in node_value_ids(node.fields, True):
            if list(g.values[v].dims[-2:]) == [n, n] and node.op not in ("MPSView", "MPSSqueeze", "MPSUnsqueeze"):
                out.append((node.op, g.values[v].datatype.name))
    return out


def test_attention_scores_only_a_softmax_reads_are_a_float32_product():
    """Precision.FP16, an encoder's attention (scores [n, n] larger than q and k together): the softmax
    reads its scores in float32, directly, so ``q @ k^T`` is computed in float32 (q and k cast up) instead of a float16
    product rescaled by 2**-5 per operand and multiplied back in float32: the scores are written once by the
    matmul, read and written by the softmax, read by ``p @ v`` (the cast folded into it), all float32, and
    not also written and read in float16 (Whisper-tiny's encoder: 1392.8 -> 1151.6 MiB a window). Scores no
    larger than their operands, or scaled before the softmax, keep the float16 product."""
    from mps_backend.cost import cost_of_program
    from mps_backend.export import export_model
    from mps_backend.runtime import run_pte

    model = _EncoderAttention().eval()
    x = torch.randn(1, 40, 8) * 3
    pte = export_model(model, [x]).pte
    assert _scores(pte, 40) == [("MPSMatMul", "float32"), ("MPSSoftmax", "float32"), ("MPSCast", "float16")]
    with torch.no_grad():
        ref = model(x)

    def gap(program: bytes) -> float:
        return ((run_pte(program, [x])[0] - ref).abs().max() / ref.abs().max()).item()

    # the rescaled float16 product (what the precision pass did before): the scores also written in float16
    import unittest.mock

    from mps_backend.passes import precision

    with unittest.mock.patch.object(precision._Assignment, "_float32_scores", lambda self, mm: False):
        rescaled = export_model(model, [x]).pte
    assert ("MPSMatMul", "float16") in _scores(rescaled, 40)
    assert gap(pte) <= 1e-2 and gap(pte) <= gap(rescaled) * 1.05, (gap(pte), gap(rescaled))  # no further from eager
    saved = cost_of_program(rescaled).fused.total - cost_of_program(pte).fused.total
    assert saved >= 2 * 40 * 40 * 2, saved  # at least the float16 scores' write and read
    # scores past float16's range (3e5 here; eager float16 overflows): finite, as eager float32
    big = x * 400
    with torch.no_grad():
        scores = (model.q(big) * 8**-0.5) @ model.k(big).transpose(-1, -2)
        assert scores.abs().max() > 65504 * 4
        out, want = run_pte(export_model(model, [big]).pte, [big])[0], model(big)
    assert torch.isfinite(out).all() and (out - want).abs().max() / want.abs().max() <= 1e-2
    # 4 positions: scores (16) smaller than q and k (32 each): the float16 product, rescaled
    small = export_model(model, [x[:, :4]]).pte
    assert ("MPSMatMul", "float16") in _scores(small, 4)
    # the scores scaled between the product and the softmax: the float16 product, rescaled (a float32 one
    # would be read and written once more in float32 by the scale: efficient_sam's encoder, 307 -> 357x)
    scaled = export_model(_EncoderAttention(after=8**-0.5).eval(), [x]).pte
    assert _scores(scaled, 40)[0] == ("MPSMatMul", "float16")
