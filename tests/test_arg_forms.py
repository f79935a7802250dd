"""Short argument forms: every registered lowering that takes int-list arguments (kernel_size, stride,
padding, dilation, output_padding, dims, shifts, sizes, ...) gets the short forms its schema allows --
length-1 lists where one value stands for every dim, negative dims, empty lists, omitted defaults --
and whatever the partitioner accepts must lower: ``preprocess`` never fails on it, through
``to_edge_transform_and_lower(..., partitioner=[MPSPartitioner()])``, through ``to_edge(...).to_backend``
and through whole-program ``to_backend("MPSBackend", ...)`` (when the partitioner accepts every node).
A fully delegated case also runs on the device model against eager.

``test_every_int_list_lowering_has_cases`` keeps the table complete: a new lowering whose schema has an
int-list argument needs cases here (or an entry in ``EXEMPT`` saying why not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge, to_edge_transform_and_lower
from executorch.exir.backend.backend_api import to_backend
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.lowered_backend_module import get_lowered_submodules

from mps_backend import MPSBackend, MPSPartitioner
from mps_backend.export_scope import export_scope
from mps_backend.operators.registry import default_registry
from mps_backend.runtime.interpreter import execute
from mps_backend.serialization import read_blob
from tests.ops.harness import assert_close

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _scope():
    """Each lowering inside mps_backend.export_scope, as export_model's: the same programs (tests/test_export_scope.py)
    for about half the CPU of these one-operator programs (torch's operator census asked once, not six times)."""
    with export_scope():
        yield


@dataclass(frozen=True)
class Case:
    id: str
    fn: Callable
    inputs: tuple
    #: aten ops the program keeps that are not core ATen (edge verification needs them excepted)
    non_core: tuple = ()


def _r(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


W2, W1, WT = _r(4, 3, 3, 3), _r(4, 3, 3), _r(3, 4, 3, 3)

#: target -> cases calling it with short forms (direct aten calls: export records the args as given)
CASES: dict = {
    aten.convolution.default: [
        Case("conv2d-all-len1", lambda x: aten.convolution(x, W2, None, [1], [0], [1], False, [0], 1), (_r(1, 3, 8, 8),)),
        Case(
            "conv2d-len1-stride2-pad1-dil2",
            lambda x: aten.convolution(x, W2, None, [2], [1], [2], False, [0], 1),
            (_r(1, 3, 9, 9),),
        ),
        Case(
            "conv2d-padding-len1-only",
            lambda x: aten.convolution(x, W2, None, [1, 1], [0], [1, 1], False, [0, 0], 1),
            (_r(1, 3, 8, 8),),
        ),
        Case("conv1d-len1", lambda x: aten.convolution(x, W1, None, [2], [1], [1], False, [0], 1), (_r(1, 3, 9),)),
        Case("conv-transposed-len1", lambda x: aten.convolution(x, WT, None, [2], [1], [1], True, [1], 1), (_r(1, 3, 5, 5),)),
    ],
    aten.avg_pool2d.default: [
        Case("avg2d-kernel-len1-rest-omitted", lambda x: aten.avg_pool2d(x, [2]), (_r(1, 2, 6, 6),)),
        Case("avg2d-all-len1", lambda x: aten.avg_pool2d(x, [3], [2], [1]), (_r(1, 2, 7, 7),)),
        Case("avg2d-stride-empty", lambda x: aten.avg_pool2d(x, [2, 3], []), (_r(1, 2, 6, 6),)),
    ],
    aten.avg_pool3d.default: [
        Case("avg3d-kernel-len1-rest-omitted", lambda x: aten.avg_pool3d(x, [2]), (_r(1, 2, 4, 4, 4),)),
        Case("avg3d-all-len1", lambda x: aten.avg_pool3d(x, [3], [2], [1]), (_r(1, 2, 5, 5, 5),)),
    ],
    aten.max_pool2d_with_indices.default: [
        Case("max2d-kernel-len1-rest-omitted", lambda x: aten.max_pool2d_with_indices(x, [2])[0], (_r(1, 2, 6, 6),)),
        Case("max2d-all-len1", lambda x: aten.max_pool2d_with_indices(x, [3], [2], [1], [1])[0], (_r(1, 2, 7, 7),)),
        Case("max2d-dilation-len1-indices", lambda x: aten.max_pool2d_with_indices(x, [2], [1], [0], [2]), (_r(1, 2, 6, 6),)),
    ],
    aten.max_pool3d_with_indices.default: [
        Case("max3d-kernel-len1-rest-omitted", lambda x: aten.max_pool3d_with_indices(x, [2])[0], (_r(1, 2, 4, 4, 4),)),
        Case("max3d-all-len1", lambda x: aten.max_pool3d_with_indices(x, [3], [2], [1], [1])[0], (_r(1, 2, 5, 5, 5),)),
    ],
    # adaptive pools and upsampling: output_size must have one entry per spatial dim (no short form)
    aten.adaptive_max_pool2d.default: [
        Case(
            "adaptive-max2d",
            lambda x: aten.adaptive_max_pool2d(x, [2, 3])[0],
            (_r(1, 2, 6, 6),),
            (aten.adaptive_max_pool2d.default,),
        ),
    ],
    aten.adaptive_max_pool3d.default: [
        Case(
            "adaptive-max3d",
            lambda x: aten.adaptive_max_pool3d(x, [2, 2, 1])[0],
            (_r(1, 2, 4, 4, 4),),
            (aten.adaptive_max_pool3d.default,),
        ),
    ],
    aten._adaptive_avg_pool2d.default: [
        Case("adaptive-avg2d", lambda x: aten._adaptive_avg_pool2d(x, [3, 2]), (_r(1, 2, 6, 6),)),
    ],
    aten._adaptive_avg_pool3d.default: [
        Case("adaptive-avg3d", lambda x: aten._adaptive_avg_pool3d(x, [2, 1, 2]), (_r(1, 2, 4, 4, 4),)),
    ],
    aten.upsample_nearest2d.default: [
        Case(
            "nearest2d-scales-omitted",
            lambda x: aten.upsample_nearest2d(x, [6, 8]),
            (_r(1, 2, 3, 4),),
            (aten.upsample_nearest2d.default,),
        ),
    ],
    aten.upsample_nearest2d.vec: [
        Case("nearest2d-vec-scales", lambda x: aten.upsample_nearest2d.vec(x, None, [2.0, 2.0]), (_r(1, 2, 3, 4),)),
        Case("nearest2d-vec-size", lambda x: aten.upsample_nearest2d.vec(x, [6, 8], None), (_r(1, 2, 3, 4),)),
    ],
    aten._upsample_nearest_exact2d.default: [
        Case(
            "nearest-exact2d-scales-omitted",
            lambda x: aten._upsample_nearest_exact2d(x, [5, 6]),
            (_r(1, 2, 3, 4),),
            (aten._upsample_nearest_exact2d.default,),
        ),
    ],
    aten._upsample_nearest_exact2d.vec: [
        Case("nearest-exact2d-vec-size", lambda x: aten._upsample_nearest_exact2d.vec(x, [5, 6], None), (_r(1, 2, 3, 4),)),
    ],
    aten.upsample_bilinear2d.default: [
        Case("bilinear2d-scales-omitted", lambda x: aten.upsample_bilinear2d(x, [6, 8], False), (_r(1, 2, 3, 4),)),
    ],
    aten.upsample_bilinear2d.vec: [
        Case("bilinear2d-vec-scales", lambda x: aten.upsample_bilinear2d.vec(x, None, True, [2.0, 2.0]), (_r(1, 2, 3, 4),)),
    ],
    # reductions: dims omitted / None / [] (every axis), negative dims
    aten.amax.default: [
        Case("amax-dim-omitted", lambda x: aten.amax(x), (_r(2, 3, 4),)),
        Case("amax-negative", lambda x: aten.amax(x, [-1]), (_r(2, 3, 4),)),
        Case("amax-empty-keepdim", lambda x: aten.amax(x, [], True), (_r(2, 3, 4),)),
    ],
    aten.amin.default: [
        Case("amin-dim-omitted", lambda x: aten.amin(x), (_r(2, 3, 4),)),
        Case("amin-negative-pair", lambda x: aten.amin(x, [-1, 0]), (_r(2, 3, 4),)),
    ],
    aten.any.dims: [
        Case("any-dims-omitted", lambda x: aten.any.dims(x), (_r(2, 3, 4) > 0,)),
        Case("any-dims-negative", lambda x: aten.any.dims(x, [-1]), (_r(2, 3, 4) > 0,)),
        Case("any-dims-empty", lambda x: aten.any.dims(x, []), (_r(2, 3, 4) > 0,)),
    ],
    aten.mean.dim: [
        Case("mean-dim-none", lambda x: aten.mean.dim(x, None), (_r(2, 3, 4),)),
        Case("mean-negative", lambda x: aten.mean.dim(x, [-1]), (_r(2, 3, 4),)),
        Case("mean-empty", lambda x: aten.mean.dim(x, []), (_r(2, 3, 4),)),
    ],
    aten.sum.dim_IntList: [
        Case("sum-dim-none", lambda x: aten.sum.dim_IntList(x, None), (_r(2, 3, 4),)),
        Case("sum-negative-keepdim", lambda x: aten.sum.dim_IntList(x, [-2], True), (_r(2, 3, 4),)),
        Case("sum-empty", lambda x: aten.sum.dim_IntList(x, []), (_r(2, 3, 4),)),
    ],
    aten.var.correction: [
        Case("var-dim-omitted", lambda x: aten.var.correction(x), (_r(2, 3, 4),)),
        Case("var-negative", lambda x: aten.var.correction(x, [-1]), (_r(2, 3, 4),)),
    ],
    # shapes: -1 entries, negative dims, empty lists, omitted defaults
    aten.as_strided_copy.default: [
        Case("as-strided-offset-omitted", lambda x: aten.as_strided_copy(x, [2, 2], [4, 1]), (_r(3, 4),)),
        Case("as-strided-0d", lambda x: aten.as_strided_copy(x, [], [], 5), (_r(3, 4),)),
        Case("as-strided-len1", lambda x: aten.as_strided_copy(x, [3], [4]), (_r(3, 4),)),
    ],
    aten.constant_pad_nd.default: [
        Case("pad-last-dim-value-omitted", lambda x: aten.constant_pad_nd(x, [1, 2]), (_r(2, 3, 4),)),
        Case("pad-empty", lambda x: aten.constant_pad_nd(x, []) * 2, (_r(2, 3),)),
    ],
    aten.expand_copy.default: [
        Case("expand-minus-one", lambda x: aten.expand_copy(x, [-1, 3, -1]), (_r(2, 1, 4),)),
        Case("expand-rank-up-minus-one", lambda x: aten.expand_copy(x, [2, -1, 4]), (_r(3, 1),)),
    ],
    aten.flip.default: [
        Case("flip-negative", lambda x: aten.flip(x, [-1]), (_r(2, 3, 4),)),
        Case("flip-empty", lambda x: aten.flip(x, []) * 2, (_r(2, 3),)),
    ],
    aten.permute_copy.default: [
        Case("permute-negative", lambda x: aten.permute_copy(x, [-1, 0, -2]), (_r(2, 3, 4),)),
    ],
    aten.repeat.default: [
        Case("repeat-rank-up", lambda x: aten.repeat(x, [2, 1, 3]), (_r(2, 3),)),
        Case("repeat-ones", lambda x: aten.repeat(x, [1, 1]) * 2, (_r(2, 3),)),
    ],
    aten.reflection_pad1d.default: [Case("reflect1d", lambda x: aten.reflection_pad1d(x, [2, 1]), (_r(1, 2, 5),))],
    aten.reflection_pad2d.default: [
        Case("reflect2d", lambda x: aten.reflection_pad2d(x, [1, 0, 2, 1]), (_r(1, 2, 4, 5),)),
    ],
    aten.reflection_pad3d.default: [
        Case("reflect3d", lambda x: aten.reflection_pad3d(x, [1, 0, 0, 1, 1, 1]), (_r(1, 2, 3, 4, 3),)),
    ],
    aten.replication_pad1d.default: [Case("replicate1d", lambda x: aten.replication_pad1d(x, [0, 2]), (_r(1, 2, 5),))],
    aten.replication_pad2d.default: [
        Case("replicate2d", lambda x: aten.replication_pad2d(x, [1, 1, 0, 2]), (_r(1, 2, 4, 5),)),
    ],
    aten.replication_pad3d.default: [
        Case("replicate3d", lambda x: aten.replication_pad3d(x, [1, 0, 0, 1, 1, 1]), (_r(1, 2, 3, 4, 3),)),
    ],
    aten.roll.default: [
        Case("roll-dims-omitted", lambda x: aten.roll(x, [3]), (_r(3, 4),)),
        Case("roll-negative", lambda x: aten.roll(x, [-1], [-1]), (_r(3, 4),)),
        Case("roll-two-dims", lambda x: aten.roll(x, [1, -2], [0, -1]), (_r(3, 4),)),
    ],
    aten.split_with_sizes_copy.default: [
        Case("split-dim-omitted", lambda x: aten.split_with_sizes_copy(x, [1, 2]), (_r(3, 4),)),
        Case("split-negative", lambda x: aten.split_with_sizes_copy(x, [3, 1], -1), (_r(3, 4),)),
    ],
    aten.squeeze_copy.dims: [
        Case("squeeze-negative", lambda x: aten.squeeze_copy.dims(x, [-1]), (_r(3, 4, 1),)),
        Case("squeeze-empty", lambda x: aten.squeeze_copy.dims(x, []) * 2, (_r(3, 1),)),
    ],
    aten.view_copy.default: [Case("view-minus-one", lambda x: aten.view_copy(x, [-1, 4]), (_r(3, 4),))],
    aten._unsafe_view.default: [Case("unsafe-view-minus-one", lambda x: aten._unsafe_view(x, [2, -1]), (_r(3, 4),))],
    aten.native_layer_norm.default: [
        Case("layer-norm-last-dim", lambda x: aten.native_layer_norm(x, [4], None, None, 1e-5)[0], (_r(2, 3, 4),)),
    ],
    aten.full.default: [Case("full-0d-size", lambda x: x + aten.full([], 2.0), (_r(3),))],
    aten.zeros.default: [Case("zeros-len1", lambda x: x + aten.zeros([3]), (_r(3),))],
    aten.ones.default: [Case("ones-len1-broadcast", lambda x: x + aten.ones([1]), (_r(3),))],
    aten.empty.memory_format: [Case("empty-filled", lambda x: x + aten.empty.memory_format([3]).fill_(1.0), (_r(3),))],
    # int (not int-list) dims, here for the negative forms: unfold, topk
    aten.unfold_copy.default: [
        Case("unfold-negative-dim", lambda x: aten.unfold_copy(x, -1, 2, 1), (_r(3, 5),), (aten.unfold.default,))
    ],
    aten.topk.default: [
        Case("topk-dim-omitted", lambda x: aten.topk(x, 2), (_r(3, 5),)),
        Case("topk-negative-dim", lambda x: aten.topk(x, 1, -2, False), (_r(3, 5),)),
    ],
}

#: int-list lowerings without cases here, and why
EXEMPT = {
    "dim_order_ops": "dim_order describes a memory layout, written by executorch (not a user argument form)",
    "torchao": "quantization ops take block_size from torchao's own quantizers; tests/test_quant.py lowers them",
}


def _takes_int_list(target) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and any(repr(a.type) in ("List[int]", "Optional[List[int]]") for a in schema.arguments)


def test_every_int_list_lowering_has_cases():
    registered = {t for t in default_registry().targets if _takes_int_list(t)}
    exempt = {t for t in registered if t.namespace in EXEMPT}
    missing = sorted(map(str, registered - exempt - set(CASES)))
    assert not missing, f"lowerings with int-list arguments and no short-form cases in {__name__}: {missing}"


ALL = [c for cases in CASES.values() for c in cases]


def _export(case: Case):
    class Op(torch.nn.Module):
        def forward(self, *xs):
            return case.fn(*xs)

    return torch.export.export(Op().eval(), case.inputs)


def _config(case: Case) -> EdgeCompileConfig:
    return EdgeCompileConfig(_core_aten_ops_exception_list=list(case.non_core))


#: device model vs eager: fp32 as the op table; fp16 loose (the point is the arguments' meaning, and
#: window sums round once per term in float16)
TOL = {"fp32": 1e-5, "fp16": 1e-2}


def _device_matches_eager(case: Case, edge, precision: str) -> None:
    """One delegate reading the user inputs and computing every output: the device model agrees with
    eager (in fp16 on the inputs rounded to float16, as the device's boundary casts)."""
    ep = edge.exported_program()
    gm = ep.graph_module
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == executorch_call_delegate]
    others = [
        n for n in gm.graph.nodes if n.op == "call_function" and n not in calls and getattr(n.target, "__name__", "") != "getitem"
    ]
    if len(calls) != 1 or others:
        return
    user = {name: i for i, name in enumerate(ep.graph_signature.user_inputs)}
    if any(a.name not in user for a in calls[0].args[1:]):
        return  # reads a constant outside the delegate
    blob = read_blob(getattr(gm, calls[0].args[0].target).processed_bytes)
    outs = execute(blob, [case.inputs[user[a.name]] for a in calls[0].args[1:]])
    inputs = case.inputs
    if precision == "fp16":
        inputs = tuple(x.half().float() if x.dtype == torch.float32 else x for x in inputs)
    ref = case.fn(*inputs)
    ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
    assert len(outs) == len(ref)
    for k, (o, e) in enumerate(zip(outs, ref)):
        assert_close(o, e, TOL[precision], f"{case.id} output {k} ({precision})")


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_short_forms_lower_through_transform_and_lower(case, precision):
    part = MPSPartitioner() if precision == "fp16" else MPSPartitioner(use_fp16=False)  # MPSPartitioner(): fp16
    edge = to_edge_transform_and_lower(_export(case), partitioner=[part], compile_config=_config(case))
    if not part.report().on_cpu:
        _device_matches_eager(case, edge, precision)


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_short_forms_lower_through_to_backend(case):
    ep = _export(case)
    part = MPSPartitioner()
    to_edge(ep, compile_config=_config(case)).to_backend(part)  # the partitioned program lowers
    if part.report().on_cpu:
        return
    # everything accepted: the whole program lowers as one delegate
    lowered = to_backend(MPSBackend.__name__, to_edge(ep, compile_config=_config(case)).exported_program(), [])
    assert lowered.processed_bytes[4:8] == b"MP00"
    assert not [m for _, m, _ in get_lowered_submodules(lowered.original_module.graph_module)]
