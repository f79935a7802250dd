"""Device-model kernels for the structured members: linalg, indexing, reduce, shape, conv, norm, pool,
pad, quant. Expectations are written from docs/device-semantics.md (§5.6, §5.9-§5.17),
mostly as explicit torch reference computations, not from the kernels.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from mps_backend.runtime.core import DeviceError, KernelContext
from mps_backend.runtime.kernels import conv, indexing, linalg, norm, pad, pool, quant, reduce, shape
from mps_backend.serialization.model import DataType, Graph, Node, Tensor, member_fields

KERNELS = {}
for _m in (conv, indexing, linalg, norm, pad, pool, quant, reduce, shape):
    KERNELS.update(_m.KERNELS)

POOL = dict(
    kernel_height=2,
    kernel_width=2,
    stride_height=2,
    stride_width=2,
    padding_left=0,
    padding_right=0,
    padding_top=0,
    padding_bottom=0,
    dilation_height=1,
    dilation_width=1,
    ceil_mode=False,
    count_include_pad=False,
    divisor_override=0,
    output1_id=10,
    output2_id=11,
)
CONV = dict(
    input3_id=-1,
    output_id=10,
    stride_x=1,
    stride_y=1,
    dilation_x=1,
    dilation_y=1,
    groups=1,
    padding_left=0,
    padding_right=0,
    padding_top=0,
    padding_bottom=0,
)


def run(op: str, inputs: dict[int, torch.Tensor], mode: str = "faithful", graph=None, **fields):
    """Run one kernel on a context holding ``inputs``; returns the value table afterwards."""
    base = POOL if op in ("MPSMaxPool2DWithIndices", "MPSAvgPool2D") else CONV if "Conv" in op else {}
    fields = {**base, **fields}
    assert set(fields) == set(member_fields(op)), sorted(set(fields) ^ set(member_fields(op)))
    ctx = KernelContext(values=dict(inputs), mode=mode, graph=graph)
    KERNELS[op](ctx, Node(op, fields))
    return ctx.values


def out(op, inputs, mode="faithful", **fields):
    return run(op, inputs, mode, **fields)[fields.get("output_id", fields.get("output1_id", 10))]


def same(actual: torch.Tensor, expected: torch.Tensor, exact=False, **tol):
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert tuple(actual.shape) == tuple(expected.shape), (tuple(actual.shape), tuple(expected.shape))
    if exact:
        assert torch.equal(actual, expected)
    else:
        torch.testing.assert_close(actual, expected, **tol)


def rnd(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


# ------------------------------------------------------------------------------------------ linalg
class TestLinalg:
    def test_matmul_batched_broadcast(self):
        a, b = rnd(2, 1, 3, 4), rnd(5, 4, 6, seed=1)
        same(out("MPSMatMul", {0: a, 1: b}, input1_id=0, input2_id=1, output_id=10), torch.matmul(a, b))

    def test_matmul_f16_accumulates_in_f32_and_rounds_once(self, monkeypatch):
        from mps_backend.runtime.kernels import linalg

        a, b = rnd(8, 64, dtype=torch.float16), rnd(64, 5, dtype=torch.float16, seed=1)
        want = (a.float() @ b.float()).half()
        same(out("MPSMatMul", {0: a, 1: b}, input1_id=0, input2_id=1, output_id=10), want, exact=True)
        # an operand too large to widen at once (an LLM head) is widened in blocks of rows of the
        # first operand, or of columns of the second: the same result
        monkeypatch.setattr(linalg, "CHUNK_BYTES", 3 * 64 * 4)
        same(out("MPSMatMul", {0: a, 1: b}, input1_id=0, input2_id=1, output_id=10), want, exact=True)
        bt, at = b.T.contiguous(), a.T.contiguous()
        same(out("MPSMatMul", {0: bt, 1: at}, input1_id=0, input2_id=1, output_id=10), want.T, exact=True)

    @pytest.mark.parametrize(
        "a,b",
        [
            (rnd(2, 3), rnd(3, 2, dtype=torch.float16)),  # mixed dtypes: no promotion
            (rnd(3), rnd(3, 2)),  # rank 1
            (rnd(2, 3), rnd(4, 2)),  # inner dims differ
        ],
    )
    def test_matmul_failures(self, a, b):
        with pytest.raises(DeviceError):
            run("MPSMatMul", {0: a, 1: b}, input1_id=0, input2_id=1, output_id=10)

    def test_addmm_alpha_beta(self):
        bias, m1, m2 = rnd(5), rnd(3, 4, seed=1), rnd(4, 5, seed=2)
        got = out("MPSAddmm", {0: bias, 1: m1, 2: m2}, input1_id=0, input2_id=1, input3_id=2, output_id=10, alpha=2.0, beta=0.5)
        same(got, 2.0 * (m1 @ m2) + 0.5 * bias)
        got = out("MPSAddmm", {0: bias, 1: m1, 2: m2}, input1_id=0, input2_id=1, input3_id=2, output_id=10, alpha=1.0, beta=1.0)
        same(got, torch.addmm(bias, m1, m2))

    def test_addmm_schema_default_zero_alpha_beta_gives_zeros(self):
        bias, m1, m2 = rnd(5), rnd(3, 4, seed=1), rnd(4, 5, seed=2)
        got = out("MPSAddmm", {0: bias, 1: m1, 2: m2}, input1_id=0, input2_id=1, input3_id=2, output_id=10, alpha=0.0, beta=0.0)
        same(got, torch.zeros(3, 5))

    def test_addmm_f16(self):
        bias, m1, m2 = (rnd(*s, dtype=torch.float16, seed=i) for i, s in enumerate([(5,), (3, 16), (16, 5)]))
        got = out("MPSAddmm", {0: bias, 1: m1, 2: m2}, input1_id=0, input2_id=1, input3_id=2, output_id=10, alpha=1.0, beta=1.0)
        # the matmul result is its own f16 tensor before the bias add: two roundings
        same(got, ((m1.float() @ m2.float()).half().float() + bias.float()).half(), exact=True)

    def test_addmm_f16_rounds_each_intermediate(self):
        bias, m1, m2 = (rnd(*s, dtype=torch.float16, seed=i) for i, s in enumerate([(4,), (4, 8), (8, 4)]))
        got = out("MPSAddmm", {0: bias, 1: m1, 2: m2}, input1_id=0, input2_id=1, input3_id=2, output_id=10, alpha=3.0, beta=0.3)
        h = lambda t: t.half().float()  # noqa: E731
        p = h(h(m1.float() @ m2.float()) * 3.0)
        c = h(bias.float() * h(torch.tensor(0.3)))
        same(got, (p + c).half(), exact=True)

    def test_addmm_mixed_bias_dtype_fails_like_issue_7904(self):
        with pytest.raises(DeviceError, match="mixed dtypes"):
            run(
                "MPSAddmm",
                {0: rnd(128, dtype=torch.float16), 1: rnd(8, 64), 2: rnd(64, 128)},
                input1_id=0,
                input2_id=1,
                input3_id=2,
                output_id=10,
                alpha=1.0,
                beta=1.0,
            )


# ---------------------------------------------------------------------------------------- indexing
class TestIndexing:
    def test_index_select(self):
        x, idx = rnd(3, 5, 2), torch.tensor([4, 0, 4])
        same(out("MPSIndexSelect", {0: x, 1: idx}, input1_id=0, output_id=10, dim=1, index_id=1), torch.index_select(x, 1, idx))
        same(out("MPSIndexSelect", {0: x, 1: idx.int()}, input1_id=0, output_id=10, dim=-2, index_id=1), x[:, [4, 0, 4], :])

    def test_index_select_multi_dim_index_shape(self):
        x, idx = rnd(3, 5), torch.tensor([[1, 2], [0, 4]])
        got = out("MPSIndexSelect", {0: x, 1: idx}, input1_id=0, output_id=10, dim=1, index_id=1)
        same(got, torch.stack([x[:, [1, 2]], x[:, [0, 4]]], dim=1))

    def test_index_select_out_of_range_fails(self):
        with pytest.raises(DeviceError):
            run("MPSIndexSelect", {0: rnd(3), 1: torch.tensor([3])}, input1_id=0, output_id=10, dim=0, index_id=1)

    def _embedding(self, padding_idx, mode="faithful"):
        w, idx = rnd(6, 4), torch.tensor([[2, 0], [5, 2]])
        got = out(
            "MPSEmbedding",
            {0: w, 1: idx},
            mode,
            input1_id=0,
            input2_id=1,
            output_id=10,
            padding_idx=padding_idx,
            scale_grad_by_freq=False,
            sparse=False,
        )
        return w, idx, got

    def test_embedding_padding_rows_zeroed_on_device(self):
        w, idx, got = self._embedding(2)
        expected = w[idx].clone()
        expected[0, 0] = 0
        expected[1, 1] = 0
        same(got, expected)

    def test_embedding_schema_default_padding_idx_zero_zeroes_row_zero(self):
        w, idx, got = self._embedding(0)
        expected = w[idx].clone()
        expected[0, 1] = 0
        same(got, expected)

    def test_embedding_no_padding_and_aten_mode(self):
        w, idx, got = self._embedding(-1)
        same(got, F.embedding(idx, w))
        w, idx, got = self._embedding(2, mode="aten")
        same(got, F.embedding(idx, w, padding_idx=2))  # torch forward keeps the stored row

    def test_embedding_f16(self):
        w, idx = rnd(6, 4, dtype=torch.float16), torch.tensor([1, 3], dtype=torch.int32)
        got = out(
            "MPSEmbedding",
            {0: w, 1: idx},
            input1_id=0,
            input2_id=1,
            output_id=10,
            padding_idx=-1,
            scale_grad_by_freq=False,
            sparse=False,
        )
        same(got, w[[1, 3]], exact=True)

    def test_index_tensor_one_index(self):
        x, idx = rnd(3, 5, 2), torch.tensor([[4, 1]])
        got = out("MPSIndexTensor", {0: x, 1: idx}, input1_id=0, indices_id=[-1, 1], output_id=10)
        same(got, x[:, idx])
        got = out("MPSIndexTensor", {0: x, 1: torch.tensor([2, 0])}, input1_id=0, indices_id=[1], output_id=10)
        same(got, x[[2, 0]])

    @pytest.mark.parametrize("ids,graph", [([1, 2], None), ([-1, -1], None), ([1], Graph(graph_type=1))])
    def test_index_tensor_failures(self, ids, graph):
        with pytest.raises(DeviceError):
            run(
                "MPSIndexTensor",
                {0: rnd(3, 4), 1: torch.tensor([0]), 2: torch.tensor([1])},
                graph=graph,
                input1_id=0,
                indices_id=ids,
                output_id=10,
            )

    def test_index_put(self):
        data, idx, values = rnd(3, 4), torch.tensor([3, 1]), rnd(3, 2, seed=1)
        got = out(
            "MPSIndexPut",
            {0: data, 1: idx, 2: values},
            input1_id=0,
            indices_id=[-1, 1],
            values_shape=[],
            values_id=2,
            output_id=10,
        )
        expected = data.clone()
        expected[:, 3], expected[:, 1] = values[:, 0], values[:, 1]
        same(got, expected)
        assert not torch.equal(got, data)  # the input value itself is untouched

    def test_index_put_values_broadcast_to_values_shape(self):
        data, idx, values = rnd(4, 3), torch.tensor([0, 2]), rnd(1, 3, seed=1)
        got = out(
            "MPSIndexPut",
            {0: data, 1: idx, 2: values},
            input1_id=0,
            indices_id=[1],
            values_shape=[2, 3],
            values_id=2,
            output_id=10,
        )
        expected = data.clone()
        expected[0], expected[2] = values[0], values[0]
        same(got, expected)

    @pytest.mark.parametrize("values,vshape", [(rnd(2, 3, dtype=torch.float16), []), (rnd(3), [])])
    def test_index_put_failures(self, values, vshape):
        with pytest.raises(DeviceError):  # mixed dtypes / values not in the scattered shape
            run(
                "MPSIndexPut",
                {0: rnd(4, 3), 1: torch.tensor([0, 2]), 2: values},
                input1_id=0,
                indices_id=[1],
                values_shape=vshape,
                values_id=2,
                output_id=10,
            )

    def test_scatter_as_slice_scatter(self):
        data, src = rnd(4, 6), rnd(4, 2, seed=1)
        idx = torch.arange(1, 5, 2).expand(4, 2).contiguous()
        got = out("MPSScatter", {0: data, 1: src, 2: idx}, input1_id=0, output_id=10, dim=1, idx_id=2, src_id=1)
        expected = data.clone()
        expected[:, 1:5:2] = src
        same(got, expected)
        got = out("MPSScatter", {0: data, 1: src, 2: idx}, input1_id=0, output_id=10, dim=-1, idx_id=2, src_id=1)
        same(got, expected)

    def test_scatter_mixed_dtype_fails(self):
        with pytest.raises(DeviceError):
            run(
                "MPSScatter",
                {0: rnd(4, 6), 1: rnd(4, 2, dtype=torch.float16), 2: torch.zeros(4, 2).long()},
                input1_id=0,
                output_id=10,
                dim=1,
                idx_id=2,
                src_id=1,
            )


# ------------------------------------------------------------------------------------------ reduce
class TestMean:
    def mean(self, x, dims, keep, mode="faithful", num_dims=None):
        return out(
            "MPSMean",
            {0: x},
            mode,
            input1_id=0,
            output_id=10,
            num_dims=len(dims) if num_dims is None else num_dims,
            dims=dims,
            keep_dims=keep,
        )

    def test_axes_negative_and_keep_dims(self):
        x = rnd(2, 3, 4)
        same(self.mean(x, [1, -1], True), x.mean(dim=(1, 2), keepdim=True))
        same(self.mean(x, [-1, 0], False), x.mean(dim=(0, 2)))

    def test_full_reduction_gives_rank_one(self):
        x = rnd(2, 3)
        same(self.mean(x, [0, 1], False), x.mean().reshape(1))

    def test_only_first_num_dims_entries_used(self):
        x = rnd(2, 3, 4)
        same(self.mean(x, [2, 0], False, num_dims=1), x.mean(dim=2))

    def test_empty_dims_is_identity_on_device_reduce_all_in_aten(self):
        x = rnd(2, 3)
        same(self.mean(x, [], False), x, exact=True)
        same(self.mean(x, [], False, mode="aten"), x.mean().reshape(1))
        same(self.mean(x, [], True, mode="aten"), x.mean().reshape(1, 1))

    def test_f16(self):
        x = rnd(4, 33, dtype=torch.float16)
        same(self.mean(x, [1], False), x.float().mean(1).half(), exact=True)

    def test_bad_axis_fails(self):
        with pytest.raises(DeviceError):
            self.mean(rnd(2, 3), [2], False)


# ------------------------------------------------------------------------------------------- shape
class TestShape:
    def test_permute(self):
        x = rnd(2, 3, 4)
        got = out("MPSPermute", {0: x}, input1_id=0, output_id=10, num_dims=3, perm=[2, 0, 1])
        same(got, x.permute(2, 0, 1))
        with pytest.raises(DeviceError):
            run("MPSPermute", {0: x}, input1_id=0, output_id=10, num_dims=2, perm=[1, 0])

    def test_view(self):
        x = rnd(2, 3, 4)
        same(out("MPSView", {0: x}, input1_id=0, output_id=10, num_dims=0, shape=[4, -1]), x.reshape(4, 6))
        same(out("MPSView", {0: rnd(1)}, input1_id=0, output_id=10, num_dims=0, shape=[]), rnd(1))
        for bad in ([-1, -1], [5, 5]):
            with pytest.raises(DeviceError):
                run("MPSView", {0: x}, input1_id=0, output_id=10, num_dims=2, shape=bad)

    def expand(self, x, shape, mode="faithful"):
        return out("MPSExpand", {0: x}, mode, input1_id=0, output_id=10, num_dims=len(shape), shape=shape)

    def test_expand_same_rank(self):
        x = rnd(3, 1)
        same(self.expand(x, [-1, 4]), x.expand(3, 4))
        same(self.expand(x, [3, 4], mode="aten"), x.expand(3, 4))

    def test_expand_rank_increase_uses_only_first_rank_entries(self):
        # device: t[i] for i < rank(x) only: [3] with shape [2, 3] -> broadcast [3] to [2] -> failure
        with pytest.raises(DeviceError):
            self.expand(rnd(3), [2, 3])
        same(self.expand(rnd(3), [2, 3], mode="aten"), rnd(3).expand(2, 3))
        # [1] with shape [4, 5] -> broadcast_to([4]): a rank-1 result instead of [4, 5]
        same(self.expand(torch.tensor([7.0]), [4, 5]), torch.full((4,), 7.0))

    def test_cat_skips_nil_inputs(self):
        a, b = rnd(2, 3), rnd(2, 1, seed=1)
        got = out("MPSCat", {0: a, 2: b}, input_ids=[0, 1, 2], output_id=10, dim=-1)  # id 1 is nil
        same(got, torch.cat([a, b], 1))

    @pytest.mark.parametrize("b", [rnd(2, 1, dtype=torch.float16), rnd(3, 1)])
    def test_cat_failures(self, b):
        with pytest.raises(DeviceError):
            run("MPSCat", {0: rnd(2, 3), 1: b}, input_ids=[0, 1], output_id=10, dim=1)

    def squeeze(self, x, dims, mode="faithful"):
        return out("MPSSqueeze", {0: x}, mode, input1_id=0, output_id=10, dims=dims)

    def test_squeeze_empty_dims_is_axis_one_on_device(self):
        x = rnd(2, 1, 3, 1)
        same(self.squeeze(x, []), x.reshape(2, 3, 1))
        same(self.squeeze(x, [], mode="aten"), x.reshape(2, 3))
        with pytest.raises(DeviceError):
            self.squeeze(rnd(1, 2, 1), [])  # axis 1 has size 2

    def test_squeeze_explicit(self):
        x = rnd(1, 2, 1)
        same(self.squeeze(x, [0, -1]), x.reshape(2))
        same(self.squeeze(rnd(1), [0]), rnd(1))  # rank 0 is [1] on device
        with pytest.raises(DeviceError):
            self.squeeze(x, [1])

    def test_unsqueeze(self):
        x = rnd(2, 3)
        same(out("MPSUnsqueeze", {0: x}, input1_id=0, output_id=10, dim=1), x.reshape(2, 1, 3))
        same(out("MPSUnsqueeze", {0: x}, input1_id=0, output_id=10, dim=-1), x.reshape(2, 3, 1))

    def test_select(self):
        x = rnd(2, 3, 4)
        same(out("MPSSelect", {0: x}, input1_id=0, output_id=10, dim=1, index=-1), x[:, 2])
        same(out("MPSSelect", {0: rnd(3)}, input1_id=0, output_id=10, dim=0, index=1), rnd(3)[1:2])
        for dim, index in ((-1, 0), (3, 0), (1, 3)):
            with pytest.raises(DeviceError):
                run("MPSSelect", {0: x}, input1_id=0, output_id=10, dim=dim, index=index)

    def test_slice(self):
        x = rnd(3, 10)
        sl = lambda **f: out("MPSSlice", {0: x}, input1_id=0, output_id=10, **f)  # noqa: E731
        same(sl(dim=1, start=1, end=8, step=3), x[:, 1:8:3])
        same(sl(dim=1, start=-4, end=100, step=1), x[:, 6:])
        same(sl(dim=0, start=2, end=1, step=1), x[:0])
        for f in (dict(dim=-1, start=0, end=2, step=1), dict(dim=1, start=0, end=2, step=0)):
            with pytest.raises(DeviceError):
                sl(**f)

    def test_pixel_shuffle(self):
        x = rnd(1, 8, 2, 3)
        same(out("MPSPixelShuffle", {0: x}, input1_id=0, output_id=10, upscale_factor=2), F.pixel_shuffle(x, 2))
        same(out("MPSPixelShuffle", {0: x}, input1_id=0, output_id=10, upscale_factor=1), x)
        for bad, r in ((x, 3), (rnd(4, 4), 2)):
            with pytest.raises(DeviceError):
                run("MPSPixelShuffle", {0: bad}, input1_id=0, output_id=10, upscale_factor=r)

    def test_split_with_sizes(self):
        x = rnd(2, 6)
        vals = run("MPSSplitWithSizes", {0: x}, input1_id=0, output_ids=[10, 11, 12], split_sizes=[1, 2, 3], dim=-1)
        for vid, piece in zip((10, 11, 12), torch.split(x, [1, 2, 3], 1)):
            same(vals[vid], piece)
        with pytest.raises(DeviceError):
            run("MPSSplitWithSizes", {0: x}, input1_id=0, output_ids=[10, 11], split_sizes=[2, 3], dim=1)

    def test_split_empty_sizes_is_one(self):
        vals = run("MPSSplitWithSizes", {0: rnd(1, 4)}, input1_id=0, output_ids=[10], split_sizes=[], dim=0)
        same(vals[10], rnd(1, 4))
        with pytest.raises(DeviceError):
            run("MPSSplitWithSizes", {0: rnd(2, 4)}, input1_id=0, output_ids=[10], split_sizes=[], dim=0)


# -------------------------------------------------------------------------------------------- conv
class TestConv:
    def test_conv2d_asymmetric_padding_stride_dilation_groups_bias(self):
        x, w, b = rnd(2, 4, 9, 8), rnd(6, 2, 3, 2, seed=1), rnd(6, seed=2)
        got = out(
            "MPSConv2D",
            {0: x, 1: w, 2: b},
            input1_id=0,
            input2_id=1,
            input3_id=2,
            stride_x=1,
            stride_y=2,
            dilation_x=2,
            dilation_y=1,
            groups=2,
            padding_left=1,
            padding_right=0,
            padding_top=2,
            padding_bottom=1,
        )
        expected = F.conv2d(F.pad(x, (1, 0, 2, 1)), w, b, stride=(2, 1), dilation=(1, 2), groups=2)
        same(got, expected, atol=1e-5, rtol=1e-5)

    def test_conv2d_no_bias(self):
        x, w = rnd(1, 3, 5, 5), rnd(2, 3, 3, 3, seed=1)
        got = out(
            "MPSConv2D",
            {0: x, 1: w},
            input1_id=0,
            input2_id=1,
            input3_id=-1,
            padding_left=1,
            padding_right=1,
            padding_top=1,
            padding_bottom=1,
        )
        same(got, F.conv2d(x, w, padding=1), atol=1e-5, rtol=1e-5)

    def test_conv1d_path(self):
        x, w, b = rnd(2, 3, 11), rnd(4, 3, 3, seed=1), rnd(4, seed=2)
        got = out(
            "MPSConv2D",
            {0: x, 1: w, 2: b},
            input1_id=0,
            input2_id=1,
            input3_id=2,
            stride_x=2,
            dilation_x=2,
            padding_left=2,
            padding_right=1,
        )
        same(got, F.conv1d(F.pad(x, (2, 1)), w, b, stride=2, dilation=2), atol=1e-5, rtol=1e-5)

    def test_conv1d_vertical_padding_cannot_squeeze(self):
        with pytest.raises(DeviceError):
            run("MPSConv2D", {0: rnd(1, 2, 5), 1: rnd(2, 2, 3)}, input1_id=0, input2_id=1, padding_top=1)

    def test_conv_f16_rounds_once(self):
        x, w, b = (
            rnd(1, 8, 6, 6, dtype=torch.float16),
            rnd(4, 8, 3, 3, dtype=torch.float16, seed=1),
            rnd(4, dtype=torch.float16, seed=2),
        )
        got = out("MPSConv2D", {0: x, 1: w, 2: b}, input1_id=0, input2_id=1, input3_id=2)
        same(got, F.conv2d(x.float(), w.float(), b.float()).half(), atol=1e-3, rtol=1e-3)

    @pytest.mark.parametrize(
        "w,b,f",
        [
            (rnd(2, 3, 3, 3, dtype=torch.float16), None, {}),  # mixed x/w dtypes
            (rnd(2, 3, 3, 3), rnd(2, dtype=torch.float16), {}),  # mixed bias dtype
            (rnd(2, 3, 3, 3), None, dict(stride_x=0)),  # schema-default stride 0
            (rnd(2, 3, 3), None, {}),  # rank-4 input, rank-3 weight
        ],
    )
    def test_conv_failures(self, w, b, f):
        vals = {0: rnd(1, 3, 5, 5), 1: w} | ({} if b is None else {2: b})
        with pytest.raises(DeviceError):
            run("MPSConv2D", vals, input1_id=0, input2_id=1, input3_id=-1 if b is None else 2, **f)

    def test_depthwise_ignores_groups_field(self):
        x, w, b = rnd(2, 3, 7, 6), rnd(3, 1, 3, 3, seed=1), rnd(3, seed=2)
        got = out(
            "MPSDepthwiseConv2D",
            {0: x, 1: w, 2: b},
            input1_id=0,
            input2_id=1,
            input3_id=2,
            stride_x=2,
            stride_y=1,
            dilation_y=2,
            groups=0,
            padding_left=0,
            padding_right=1,
            padding_top=2,
            padding_bottom=2,
        )
        expected = F.conv2d(F.pad(x, (0, 1, 2, 2)), w, b, stride=(1, 2), dilation=(2, 1), groups=3)
        same(got, expected, atol=1e-5, rtol=1e-5)

    def test_depthwise_rank3_weight_aborts(self):
        with pytest.raises(DeviceError, match="rank-3"):
            run("MPSDepthwiseConv2D", {0: rnd(1, 3, 5), 1: rnd(3, 1, 3)}, input1_id=0, input2_id=1, groups=3)


# -------------------------------------------------------------------------------------------- norm
def _bn(x, mean, var, w, b, **kw):
    return run(
        "MPSBatchNorm",
        {0: x, 1: mean, 2: var, 3: w, 4: b},
        input_id=0,
        mean_id=1,
        var_id=2,
        **{
            "weight_id": 3,
            "bias_id": 4,
            "momentum": 0.1,
            "epsilon": 1e-5,
            "output1_id": 10,
            "output2_id": 11,
            "output3_id": 12,
            **kw,
        },
    )


def _ln(x, w, b, mode="faithful", **kw):
    f = dict(
        input1_id=0, normalized_shape=list(w.shape), weight_id=1, bias_id=2, eps=1e-5, output1_id=10, output2_id=11, output3_id=12
    )
    return run("MPSLayerNorm", {0: x, 1: w, 2: b}, mode, **(f | kw))


class TestNorm:
    def test_batch_norm_outputs(self):
        x, mean, w, b = rnd(2, 3, 4, 5), rnd(3, seed=1), rnd(3, seed=3), rnd(3, seed=4)
        var = rnd(3, seed=2).abs() + 0.5
        vals = _bn(x, mean, var, w, b)
        same(vals[10], F.batch_norm(x, mean, var, w, b, training=False, eps=1e-5), atol=1e-5, rtol=1e-5)
        same(vals[11], mean)  # output2 = the running mean
        assert 12 not in vals  # output3 is never set

    def test_batch_norm_f16(self):
        x, mean, w, b = rnd(2, 3, 4, dtype=torch.float16), *(rnd(3, dtype=torch.float16, seed=i) for i in (1, 3, 4))
        var = rnd(3, dtype=torch.float16, seed=2).abs() + 1
        ref = (
            (x.float() - mean.float()[:, None]) / torch.sqrt(var.float()[:, None] + 1e-5) * w.float()[:, None]
            + b.float()[:, None]
        ).half()
        same(_bn(x, mean, var, w, b)[10], ref, atol=1e-3, rtol=1e-3)

    def test_batch_norm_without_affine_fails(self):
        with pytest.raises(DeviceError):
            _bn(rnd(2, 3, 4), rnd(3), rnd(3).abs(), rnd(3), rnd(3), weight_id=-1)

    def test_layer_norm_faithful_output3_is_variance(self):
        x, w, b = rnd(2, 5, 6), rnd(5, 6, seed=1), rnd(5, 6, seed=2)
        vals = _ln(x, w, b)
        same(vals[10], F.layer_norm(x, (5, 6), w, b, eps=1e-5), atol=1e-5, rtol=1e-5)
        same(vals[11], x.mean(dim=(1, 2), keepdim=True), atol=1e-6, rtol=1e-5)
        same(vals[12], x.var(dim=(1, 2), keepdim=True, unbiased=False), atol=1e-6, rtol=1e-5)
        aten = _ln(x, w, b, mode="aten")
        same(aten[12], torch.native_layer_norm(x, [5, 6], w, b, 1e-5)[2], atol=1e-5, rtol=1e-5)

    def test_layer_norm_f16(self):
        x, w, b = (rnd(*s, dtype=torch.float16, seed=i) for i, s in enumerate([(3, 8), (8,), (8,)]))
        ref = F.layer_norm(x.float(), (8,), w.float(), b.float(), eps=1e-5).half()
        same(_ln(x, w, b)[10], ref, atol=2e-3, rtol=2e-3)

    @pytest.mark.parametrize("kw", [dict(weight_id=-1), dict(bias_id=-1)])
    def test_layer_norm_without_affine_fails(self, kw):
        with pytest.raises(DeviceError):
            _ln(rnd(2, 4), rnd(4), rnd(4), **kw)


# -------------------------------------------------------------------------------------------- pool
def brute_pool(x, k, s, d, pads, kind, ceil=False, include_pad=False):
    """Independent loop reference: explicit pads (l, r, t, b), windows over the padded plane."""
    n, c, h, w = x.shape
    left, right, top, bottom = pads
    hp, wp = h + top + bottom, w + left + right

    def size(p, kk, ss, dd):
        span = dd * (kk - 1) + 1
        o = -(-(p - span) // ss) + 1 if ceil else (p - span) // ss + 1
        return o - 1 if ceil and (o - 1) * ss >= p else o

    oh, ow = size(hp, k[0], s[0], d[0]), size(wp, k[1], s[1], d[1])
    vals, idxs = torch.zeros(n, c, oh, ow), torch.zeros(n, c, oh, ow, dtype=torch.int64)
    for i, j in itertools.product(range(oh), range(ow)):
        cells = [(i * s[0] + a * d[0] - top, j * s[1] + b * d[1] - left) for a in range(k[0]) for b in range(k[1])]
        cells = [(r, q) for r, q in cells if r < h + bottom and q < w + right]  # clip to padded plane
        real = [(r, q) for r, q in cells if 0 <= r < h and 0 <= q < w]
        if kind == "max":
            win = torch.stack([x[:, :, r, q] for r, q in real], -1)
            vals[:, :, i, j], arg = win.max(-1)
            flat = torch.tensor([r * w + q for r, q in real])
            idxs[:, :, i, j] = flat[arg]
        else:
            total = sum(x[:, :, r, q] for r, q in real)
            vals[:, :, i, j] = total / (len(cells) if include_pad else len(real))
    return vals, idxs


def _pool(op, x, mode="faithful", **f):
    return run(op, {0: x}, mode, input1_id=0, **f)


class TestMaxPool:
    def test_symmetric_matches_torch_with_int32_indices(self):
        x = rnd(2, 3, 7, 8)
        vals = _pool(
            "MPSMaxPool2DWithIndices",
            x,
            kernel_height=3,
            kernel_width=3,
            padding_left=1,
            padding_right=1,
            padding_top=1,
            padding_bottom=1,
        )
        ev, ei = F.max_pool2d(x, 3, 2, 1, return_indices=True)
        same(vals[10], ev)
        same(vals[11], ei.int(), exact=True)

    def test_aten_mode_indices_int64(self):
        x = rnd(1, 2, 4, 4)
        vals = _pool("MPSMaxPool2DWithIndices", x, mode="aten")
        same(vals[11], F.max_pool2d(x, 2, 2, return_indices=True)[1], exact=True)

    def test_asymmetric_padding_and_dilation(self):
        x = rnd(1, 2, 9, 7)
        f = dict(
            kernel_height=3,
            kernel_width=2,
            stride_height=2,
            stride_width=1,
            padding_left=0,
            padding_right=1,
            padding_top=1,
            padding_bottom=0,
            dilation_height=2,
            dilation_width=1,
        )
        vals = _pool("MPSMaxPool2DWithIndices", x, **f)
        ev, ei = brute_pool(x, (3, 2), (2, 1), (2, 1), (0, 1, 1, 0), "max")
        same(vals[10], ev)
        same(vals[11], ei.int(), exact=True)

    def test_padding_wider_than_half_kernel(self):  # torch refuses it; the explicit-padding plane does not
        x = rnd(1, 2, 5, 5)
        f = {f"padding_{e}": 2 for e in ("left", "right", "top", "bottom")}
        vals = _pool("MPSMaxPool2DWithIndices", x, kernel_height=3, kernel_width=3, stride_height=1, **f)
        ev, ei = brute_pool(x, (3, 3), (1, 2), (1, 1), (2, 2, 2, 2), "max")
        same(vals[10], ev)
        same(vals[11], ei.int(), exact=True)
        got = _pool("MPSAvgPool2D", x, kernel_height=3, kernel_width=3, stride_height=1, count_include_pad=True, **f)
        same(got[10], brute_pool(x, (3, 3), (1, 2), (1, 1), (2, 2, 2, 2), "avg", include_pad=True)[0])

    def test_ceil_mode_without_padding_matches_torch(self):
        x = rnd(1, 1, 7, 6)
        vals = _pool("MPSMaxPool2DWithIndices", x, kernel_height=3, kernel_width=3, ceil_mode=True)
        ev, ei = F.max_pool2d(x, 3, 2, ceil_mode=True, return_indices=True)
        same(vals[10], ev)
        same(vals[11], ei.int(), exact=True)

    def test_ceil_mode_with_python_extra_padding_counts_it_as_plane(self):
        x = rnd(1, 1, 6, 6)  # Python: pad 1, ceil => bottom/right = pad*stride = 2
        vals = _pool(
            "MPSMaxPool2DWithIndices",
            x,
            kernel_height=3,
            kernel_width=3,
            padding_left=1,
            padding_right=2,
            padding_top=1,
            padding_bottom=2,
            ceil_mode=True,
        )
        ev, ei = brute_pool(x, (3, 3), (2, 2), (1, 1), (1, 2, 1, 2), "max", ceil=True)
        same(vals[10], ev)
        same(vals[11], ei.int(), exact=True)

    def test_f16_exact(self):
        x = rnd(1, 2, 6, 6, dtype=torch.float16)
        same(_pool("MPSMaxPool2DWithIndices", x)[10], F.max_pool2d(x.float(), 2).half(), exact=True)

    @pytest.mark.parametrize(
        "x,f",
        [
            (rnd(2, 6, 6), {}),
            (torch.ones(1, 1, 4, 4, dtype=torch.int32), {}),
            (rnd(1, 1, 4, 4), dict(stride_height=0)),
            (rnd(1, 1, 1, 1), {}),
        ],
    )
    def test_failures(self, x, f):
        with pytest.raises(DeviceError):
            _pool("MPSMaxPool2DWithIndices", x, **f)


class TestAvgPool:
    @pytest.mark.parametrize("include", [False, True])
    def test_symmetric_padding_count_include_pad(self, include):
        x = rnd(2, 3, 7, 8)
        got = _pool(
            "MPSAvgPool2D",
            x,
            kernel_height=3,
            kernel_width=3,
            padding_left=1,
            padding_right=1,
            padding_top=1,
            padding_bottom=1,
            count_include_pad=include,
        )[10]
        same(got, F.avg_pool2d(x, 3, 2, 1, count_include_pad=include), atol=1e-6, rtol=1e-5)

    @pytest.mark.parametrize("include", [False, True])
    def test_asymmetric_padding_dilation_ceil(self, include):
        x = rnd(1, 2, 8, 7)
        f = dict(
            kernel_height=2,
            kernel_width=3,
            stride_height=3,
            stride_width=2,
            padding_left=2,
            padding_right=0,
            padding_top=0,
            padding_bottom=1,
            dilation_height=1,
            dilation_width=2,
            ceil_mode=True,
            count_include_pad=include,
        )
        got = _pool("MPSAvgPool2D", x, **f)[10]
        ev, _ = brute_pool(x, (2, 3), (3, 2), (1, 2), (2, 0, 0, 1), "avg", ceil=True, include_pad=include)
        same(got, ev, atol=1e-6, rtol=1e-5)

    def test_divisor_override_f32(self):
        x = rnd(1, 2, 6, 6)
        got = _pool(
            "MPSAvgPool2D",
            x,
            kernel_height=3,
            kernel_width=3,
            padding_left=1,
            padding_right=1,
            padding_top=1,
            padding_bottom=1,
            divisor_override=5,
        )
        same(got[10], F.avg_pool2d(x, 3, 2, 1, divisor_override=5), atol=1e-6, rtol=1e-5)
        assert 11 not in got  # output2_id ignored

    def test_divisor_override_in_f16_graph_fails(self):
        with pytest.raises(DeviceError, match="f32 constant"):
            _pool("MPSAvgPool2D", rnd(1, 1, 4, 4, dtype=torch.float16), divisor_override=3)

    def test_f16(self):
        x = rnd(1, 2, 6, 6, dtype=torch.float16)
        same(_pool("MPSAvgPool2D", x)[10], F.avg_pool2d(x.float(), 2).half(), exact=True)


# --------------------------------------------------------------------------------------------- pad
class TestPad:
    @pytest.mark.parametrize("p", [[1, 2], [0, 1, 2, 0], [1, 0, 0, 2, 1, 1]])
    def test_pairs_from_last_axis(self, p):
        x = rnd(2, 3, 4)
        same(out("MPSConstantPadND", {0: x}, input1_id=0, output_id=10, pad=p, value=1.5), F.pad(x, p, value=1.5), exact=True)

    def test_value_converted_to_x_dtype(self):
        got = out("MPSConstantPadND", {0: torch.ones(2, dtype=torch.int32)}, input1_id=0, output_id=10, pad=[1, 0], value=2.7)
        same(got, torch.tensor([2, 1, 1], dtype=torch.int32), exact=True)
        got = out("MPSConstantPadND", {0: torch.ones(1, dtype=torch.float16)}, input1_id=0, output_id=10, pad=[0, 1], value=0.1)
        same(got, torch.tensor([1.0, 0.1], dtype=torch.float16), exact=True)

    @pytest.mark.parametrize("x,p", [(rnd(2, 2, 2, 2), [1] * 8), (rnd(2, 2), [1] * 6), (rnd(4), [-1, 0]), (rnd(4), [1])])
    def test_failures(self, x, p):
        with pytest.raises(DeviceError):
            run("MPSConstantPadND", {0: x}, input1_id=0, output_id=10, pad=p, value=0.0)


# ------------------------------------------------------------------------------------------- quant
def _dq(q, s, graph=None):
    return run(
        "MPSDequantizePerChannelGroup",
        {0: q, 1: s},
        graph=graph,
        input1_id=0,
        output_id=10,
        scales_id=1,
        zero_points_id=2,
        quant_min=-8,
        quant_max=7,
        dtype=DataType.int4,
        group_size=4,
        output_dtype=DataType.float32,
    )[10]


class TestDequantize:
    def test_group_scales_always_f16(self):
        q = torch.randint(-8, 8, (3, 8), generator=torch.Generator().manual_seed(0), dtype=torch.int8)
        s = rnd(3, 2).abs()
        expected = torch.stack([q[n, k] * s[n, k // 4] for n in range(3) for k in range(8)])
        expected = expected.reshape(3, 8).half()
        same(_dq(q, s), expected, exact=True)
        same(_dq(q, s.half()), (q.float() * s.half().float().repeat_interleave(4, 1)).half(), exact=True)

    def test_blocks_of_rows_compute_the_whole(self, monkeypatch):
        from mps_backend.runtime.kernels import quant

        q = torch.randint(-8, 8, (5, 8), generator=torch.Generator().manual_seed(1), dtype=torch.int8)
        s = rnd(5, 2).abs().half()
        whole = _dq(q, s)
        monkeypatch.setattr(quant, "CHUNK_BYTES", 2 * 8 * 4)  # 2 rows a block: 3 blocks, the last short
        same(_dq(q, s), whole, exact=True)
        # the interpreter's packed int4 constant (two values a byte, low nibble = even k): the same
        nibbles = (q.to(torch.uint8) & 0xF).reshape(5, 4, 2)
        same(_dq(nibbles[..., 0] | (nibbles[..., 1] << 4), s), whole, exact=True)
        same(whole, (q.float() * s.float().repeat_interleave(4, 1)).half(), exact=True)

    def test_failures(self):
        q = torch.zeros(2, 8, dtype=torch.int8)
        with pytest.raises(DeviceError):
            _dq(q, rnd(2, 3))  # K not divisible by G
        graph = Graph(values=[Tensor(DataType.int8, [2, 8]), Tensor(DataType.float32, [2, 2])])
        with pytest.raises(DeviceError, match="int4"):
            _dq(q, rnd(2, 2), graph=graph)


# ------------------------------------------------------------- whole blobs: writer + interpreter
from mps_backend.runtime.interpreter import Interpreter  # noqa: E402
from tests.runtime.helpers import GraphSpec, run_graph  # noqa: E402


class TestThroughBlob:
    def test_int4_nibble_order(self):
        g = GraphSpec()
        packed = torch.tensor([0x7F, 0x12, 0x80, 0x8F], dtype=torch.uint8)  # [N=2, K=4] -> 2 bytes a row
        q = g.constant(packed, dtype=DataType.int4, dims=[2, 4])
        s = g.constant(torch.tensor([[1.0, 0.5], [2.0, -1.0]]))
        o = g.value(DataType.float16, [2, 4])
        g.node(
            "MPSDequantizePerChannelGroup",
            input1_id=q,
            output_id=o,
            scales_id=s,
            zero_points_id=-1,
            quant_min=-8,
            quant_max=7,
            dtype=DataType.int4,
            group_size=2,
            output_dtype=DataType.float32,
        )
        (got,) = g.output(o).run([], decode=True)
        # low nibble = even k: 0x7F -> (-1, 7); 0x12 -> (2, 1); 0x80 -> (0, -8); 0x8F -> (-1, -8)
        q_vals = torch.tensor([[-1, 7, 2, 1], [0, -8, -1, -8]], dtype=torch.float32)
        scales = torch.tensor([[1.0, 1.0, 0.5, 0.5], [2.0, 2.0, -1.0, -1.0]])
        same(got, (q_vals * scales).half(), exact=True)
        # read only by the dequantize: kept as its bytes (a view of the blob), its values for a debugger
        interp = Interpreter(g.to_bytes())
        assert interp._constants[q].dtype == torch.uint8 and interp._constants[q].shape == (2, 2)
        same(interp.run_values([])[q], q_vals.to(torch.int8), exact=True)

    def test_embedding_padding_idx_faithful_vs_aten(self):
        w, idx = rnd(5, 3), torch.tensor([1, 4, 1])
        kw = dict(out_dims=[3, 3], padding_idx=1, scale_grad_by_freq=False, sparse=False)
        expected = w[idx].clone()
        expected[[0, 2]] = 0
        same(run_graph("MPSEmbedding", [w, idx], **kw), expected)
        same(run_graph("MPSEmbedding", [w, idx], mode="aten", **kw), F.embedding(idx, w, padding_idx=1))

    def test_squeeze_and_mean_empty_vectors_survive_the_bytes(self):
        x = rnd(2, 1, 3, 1)
        same(run_graph("MPSSqueeze", [x], out_dims=[2, 3, 1], dims=[], decode=True), x.reshape(2, 3, 1))
        same(run_graph("MPSMean", [x], num_dims=0, dims=[], keep_dims=False, decode=True), x)
        same(
            run_graph("MPSMean", [x], mode="aten", out_dims=[1], num_dims=0, dims=[], keep_dims=False, decode=True),
            x.mean().reshape(1),
        )

    def test_expand_rank_increase(self):
        x = torch.tensor([3.0])
        same(run_graph("MPSExpand", [x], out_dims=[2, 4], num_dims=2, shape=[2, 4]), torch.full((2,), 3.0))
        same(run_graph("MPSExpand", [x], mode="aten", out_dims=[2, 4], num_dims=2, shape=[2, 4]), torch.full((2, 4), 3.0))

    def test_cat_skips_zero_element_full(self):
        g = GraphSpec()
        a = g.input(rnd(2, 3))
        nil, o = g.value(DataType.float32, [2, 0]), g.value(DataType.float32, [4, 3])
        g.node("MPSFull", input1_id=-1, output_id=nil, shape=[2, 0], fill_value=0.0, dtype=DataType.float32)
        g.node("MPSCat", input_ids=[nil, a, a], output_id=o, dim=0)
        (got,) = g.output(o).run([rnd(2, 3)])
        same(got, torch.cat([rnd(2, 3)] * 2))

    def test_batch_norm_output3_never_set(self):
        x, p = rnd(1, 2, 3), [rnd(2, seed=i).abs() + 0.1 for i in range(4)]
        g = GraphSpec()
        ids = [g.input(x)] + [g.constant(t) for t in p]
        o1, o2, o3 = (g.value(DataType.float32, d) for d in ([1, 2, 3], [2], [2]))
        g.node(
            "MPSBatchNorm",
            input_id=ids[0],
            mean_id=ids[1],
            var_id=ids[2],
            weight_id=ids[3],
            bias_id=ids[4],
            momentum=0.1,
            epsilon=1e-5,
            output1_id=o1,
            output2_id=o2,
            output3_id=o3,
        )
        got1, got2 = g.output(o1, o2).run([x])
        same(got1, F.batch_norm(x, p[0], p[1], p[2], p[3], eps=1e-5), atol=1e-5, rtol=1e-5)
        same(got2, p[0])
        with pytest.raises(DeviceError, match="never set"):
            GraphSpec.output(g, o3).run([x])

    def test_max_pool_indices_are_reinterpreted_int32(self):
        x = rnd(1, 1, 4, 4)
        g = GraphSpec()
        i = g.input(x)
        v, ix = g.value(DataType.float32, [1, 1, 2, 2]), g.value(DataType.int64, [1, 1, 2, 2])
        g.node("MPSMaxPool2DWithIndices", input1_id=i, **{**POOL, "output1_id": v, "output2_id": ix})
        (vals, idx), report = g.output(v, ix).run([x], report=True)
        ev, ei = F.max_pool2d(x, 2, return_indices=True)
        same(vals, ev)
        same(idx, ei.int(), exact=True)
        assert [r.reinterpreted for r in report] == [False, True]

    def test_addmm_f16_graph_with_f32_bias_fails(self):
        g = GraphSpec()
        m1 = g.input(rnd(2, 4, dtype=torch.float16))
        b, m2 = g.constant(rnd(3)), g.constant(rnd(4, 3, dtype=torch.float16))
        o = g.value(DataType.float16, [2, 3])
        g.node("MPSAddmm", input1_id=b, input2_id=m1, input3_id=m2, output_id=o, beta=1.0, alpha=1.0)
        with pytest.raises(DeviceError, match="node 0 \\(MPSAddmm\\)"):
            g.output(o).run([rnd(2, 4, dtype=torch.float16)])

    def test_conv_with_bias_constant_f16(self):
        x, w, b = (
            rnd(1, 2, 5, 5, dtype=torch.float16),
            rnd(3, 2, 3, 3, dtype=torch.float16, seed=1),
            rnd(3, dtype=torch.float16, seed=2),
        )
        f = {k: v for k, v in CONV.items() if k not in ("input3_id", "output_id")}  # filled by the helper
        got = run_graph(
            "MPSConv2D", [x], constants=[w, b], out_dims=[1, 3, 4, 5], **f | dict(padding_top=1, padding_left=1, padding_right=1)
        )
        same(got, F.conv2d(F.pad(x.float(), (1, 1, 1, 0)), w.float(), b.float()).half(), atol=1e-3, rtol=1e-3)
