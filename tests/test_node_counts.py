"""No bloat: how many MPS nodes an edge node lowers to, for the ops that need more than one (the
model-zoo target "MPS nodes <= edge nodes of the partition" rests on these)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import get_lowered_submodules

from harness import zoo
from mps_backend import MPSPartitioner


def _expansion(fn, *inputs, use_fp16=False, module=None):
    class Op(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    ep = torch.export.export((module or Op()).eval(), inputs)
    part = MPSPartitioner(use_fp16=use_fp16)
    edge = to_edge_transform_and_lower(ep, partitioner=[part])
    assert not part.report().on_cpu, part.report().on_cpu
    lowered = [m for _, m, _ in get_lowered_submodules(edge.exported_program().graph_module)]
    return zoo.expansion(lowered, use_fp16)


class _KVUpdate(torch.nn.Module):
    """Two caches written at the same positions (a KV cache layer), read back through index.Tensor."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 16, 4))
        self.register_buffer("v", torch.zeros(1, 2, 16, 4))

    def forward(self, pos, k_new, v_new):
        k = torch.ops.aten.index_put(self.k, [None, None, pos], k_new)
        v = torch.ops.aten.index_put(self.v, [None, None, pos], v_new)
        mask = torch.ones(16, 16)[pos]
        rope = torch.ones(32, 4)[pos]  # another axis size: its own (i < 0) * 32 + i, the i < 0 shared
        return k + v, mask, rope


@pytest.mark.targets("aten.hardswish.default", "aten.hardsigmoid.default")
@pytest.mark.parametrize("use_fp16", [False, True])
def test_hardswish_and_hardsigmoid(use_fp16):
    # (two inputs: on the same input, hardsigmoid's two nodes are hardswish's first two, merged)
    e = _expansion(lambda x, y: F.hardswish(x) + F.hardsigmoid(y), torch.randn(8), torch.randn(8), use_fp16=use_fp16)
    assert e["aten::hardswish"] == (1, 3)  # 0.5 + x/6 (one MPSAdd with alpha), hardtanh, times x
    assert e["aten::hardsigmoid"] == (1, 2)


@pytest.mark.targets("aten.any.dim")
@pytest.mark.parametrize("use_fp16", [False, True])
def test_any_is_cast_mean_compare(use_fp16):
    e = _expansion(lambda m: m.any(-1, keepdim=True), torch.rand(2, 3, 8) > 0.5, use_fp16=use_fp16)
    assert e["aten::any.dim"] == (1, 3)


@pytest.mark.targets("aten.linear.default", "aten.addmm.default")
def test_linear_with_bias_is_one_addmm_for_any_input_rank():
    lin = torch.nn.Linear(8, 5)
    for x in (torch.randn(3, 8), torch.randn(2, 3, 8), torch.randn(2, 2, 3, 8)):
        assert _expansion(lin, x)["aten::linear"] == (1, 1), x.shape


@pytest.mark.targets("aten.index_put.default", "aten.index.Tensor")
def test_negative_index_fix_up_is_shared_by_the_ops_reading_one_index():
    e = _expansion(None, torch.tensor([3]), torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), module=_KVUpdate())
    # the int64 user index may be negative: i + (i < 0) * 16 is computed once (3 nodes) for the three
    # readers of axes of size 16, and the axis of size 32 adds its multiply and add (2 nodes)
    assert e["aten::index_put"][0] == 2 and e["aten::index.Tensor"][0] == 2
    assert e["aten::index_put"][1] + e["aten::index.Tensor"][1] == 4 + 3 + 2


@pytest.mark.targets("aten.clamp.default", "aten.floor.default", "dim_order_ops._to_dim_order_copy.default")
@pytest.mark.parametrize("use_fp16", [False, True])
def test_float_clamp_is_one_hardtanh_and_floor_then_cast_one_cast(use_fp16):
    e = _expansion(
        lambda x: (x.clamp(-1.0, 2.0) + x.clamp(min=0.5), torch.floor(x).to(torch.int64)), torch.randn(8), use_fp16=use_fp16
    )
    assert e["aten::clamp"] == (2, 2)
    assert e["dim_order_ops::_to_dim_order_copy"] == (1, 1)  # no truncation of a floored value


@pytest.mark.targets("aten.index.Tensor")
def test_outer_product_indexing_shares_row_gathers_and_trusts_clamps():
    def taps(x, r, c):
        rows = r.clamp(0, 4)[:, None]  # interpolation-style source indices: never negative
        return x[:, :, rows, c.clamp(min=0)] + x[:, :, rows, (c + 1).clamp(min=0)]

    e = _expansion(taps, torch.randn(1, 2, 5, 4), torch.tensor([4, 7, 0]), torch.tensor([3, -4]))
    # one row gather shared by both taps + one column gather each + one flattening view of rows; no
    # negative-index fix-ups
    assert e["aten::index.Tensor"] == (2, 4)


@pytest.mark.targets("aten.upsample_bilinear2d.vec")
def test_bilinear_upsampling_is_one_node_per_resized_axis():
    up = lambda size: lambda x: F.interpolate(x, size=size, mode="bilinear")  # noqa: E731
    assert _expansion(up((28, 28)), torch.randn(1, 3, 1, 1))["aten::upsample_bilinear2d.vec"] == (1, 1)
    assert _expansion(up((4, 9)), torch.randn(1, 3, 4, 5))["aten::upsample_bilinear2d.vec"] == (1, 1)
    assert _expansion(up((16, 20)), torch.randn(1, 3, 4, 5))["aten::upsample_bilinear2d.vec"] == (1, 2)


@pytest.mark.targets("aten.convolution.default", "conv2d", "conv1d", "aten._native_batch_norm_legit_no_training.default")
@pytest.mark.parametrize("use_fp16", [False, True])
def test_batch_norm_after_convolution_is_folded_into_it(use_fp16):
    from tests.ops.rows_conv import ConvBN

    for conv, x in (
        (torch.nn.Conv2d(3, 8, 3), torch.randn(1, 3, 6, 6)),
        (torch.nn.Conv2d(4, 4, 3, groups=4, bias=False), torch.randn(1, 4, 6, 6)),
        (torch.nn.Conv1d(3, 5, 3), torch.randn(2, 3, 9)),
    ):
        e = _expansion(None, x, use_fp16=use_fp16, module=ConvBN(conv))
        assert e["aten::convolution"] == (1, 1), conv
        assert e["aten::_native_batch_norm_legit_no_training"] == (1, 0), conv


@pytest.mark.targets("aten.convolution.default", "conv2d", "aten.hardsigmoid.default")
@pytest.mark.parametrize("use_fp16", [False, True])
def test_hardsigmoid_after_convolution_is_one_node(use_fp16):
    se = torch.nn.Sequential(torch.nn.Conv2d(6, 6, 1), torch.nn.Hardsigmoid())  # mobilenet_v3's excitation
    e = _expansion(None, torch.randn(1, 6, 1, 1), use_fp16=use_fp16, module=se)
    assert e["aten::convolution"] == (1, 1)
    assert e["aten::hardsigmoid"] == (1, 1)


@pytest.mark.targets("aten.mul.Tensor", "aten.div.Tensor")
@pytest.mark.parametrize("use_fp16", [False, True])
def test_power_of_two_rescale_is_one_multiply_or_nothing(use_fp16):
    e = _expansion(lambda x: x * 4096 / 16, torch.randn(8), use_fp16=use_fp16)
    assert e["aten::mul.Tensor"] == (1, 0) and e["aten::div.Tensor"] == (1, 1)
    e = _expansion(lambda x: torch.relu(x * 1024 / 1024), torch.randn(8), use_fp16=use_fp16)
    assert e["aten::mul.Tensor"] == (1, 0) and e["aten::div.Tensor"] == (1, 0)


@pytest.mark.targets("aten.convolution.default", "conv2d", "aten._native_batch_norm_legit_no_training.default")
def test_batch_norm_stays_when_the_convolution_result_is_read_elsewhere():
    from tests.ops.rows_conv import ConvBN

    e = _expansion(None, torch.randn(1, 3, 6, 6), module=ConvBN(torch.nn.Conv2d(3, 4, 3), also_conv=True))
    assert e["aten::convolution"] == (1, 1)
    assert e["aten::_native_batch_norm_legit_no_training"] == (1, 1)


@pytest.mark.targets("aten.convolution.default", "conv2d", "aten._native_batch_norm_legit_no_training.default")
def test_folded_batch_norm_leaves_only_the_folded_constants_in_the_blob():
    """Folded: the blob holds the conv's new weight and bias only (the original weight, bias and the
    four batch norm vectors are gone), and the debug handle of the conv node names both fx nodes."""
    from executorch.exir.lowered_backend_module import get_lowered_submodules

    from mps_backend.serialization.reader import read_blob
    from tests.ops.rows_conv import ConvBN

    model = ConvBN(torch.nn.Conv2d(3, 8, 3))
    edge = to_edge_transform_and_lower(
        torch.export.export(model, (torch.randn(1, 3, 6, 6),)), partitioner=[MPSPartitioner(use_fp16=False)]
    )
    (lowered,) = [m for _, m, _ in get_lowered_submodules(edge.exported_program().graph_module)]
    g = read_blob(lowered.processed_bytes).graph
    sizes = sorted(g.values[i].constant_buffer_size for i in g.constant_ids)
    assert sizes == [8 * 4, 8 * 3 * 3 * 3 * 4], sizes
    assert [n.op for n in g.nodes] == ["MPSConv2D", "MPSReLU"]
    handles = lowered.meta["debug_handle_map"]
    assert len(handles[0]) == 2 and len(handles[1]) == 1, handles


def test_every_node_count_test_names_its_targets():
    """``pytest -k <op>`` finds these tests: each carries the OpOverloads it counts (real ones)."""
    import sys

    from executorch.exir.dialects._ops import ops as exir_ops

    module = sys.modules[__name__]
    tests = [
        f
        for name, f in vars(module).items()
        if name.startswith("test_") and f is not test_every_node_count_test_names_its_targets
    ]
    for f in tests:
        marks = [m for m in getattr(f, "pytestmark", []) if m.name == "targets"]
        assert marks, f"{f.__name__} has no @pytest.mark.targets"
        for name in (n for m in marks for n in m.args if "." in n):
            ns, op, overload = name.split(".")
            root = exir_ops.edge if ns == "dim_order_ops" else torch.ops
            packet = getattr(getattr(root, ns), op) if ns != "dim_order_ops" else getattr(root.dim_order_ops, op)
            assert hasattr(packet, overload), f"{f.__name__}: {name} is not an OpOverload"
