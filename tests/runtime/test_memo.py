"""The interpreter's memo (``interpreter.Memo``): what depends on constants only (a weight's
dequantization and transpose, float16 weights widened for a matmul) is computed on the first run and
kept, so a language model's decode step stops re-dequantizing and re-widening every weight each call.
It must change no number: runs with it equal runs without it bit for bit."""

from __future__ import annotations

import pytest
import torch

from mps_backend.runtime import interpreter as interp_mod
from mps_backend.runtime.interpreter import Interpreter
from mps_backend.serialization.model import DataType

from .helpers import GraphSpec

N, K, M, G = 6, 8, 5, 4


def _weight_graph() -> tuple[GraphSpec, dict[str, int]]:
    """x f16 [2, K] @ dequantize(int4 [N, K]).T -> y [2, N]; y @ w2 (a float16 constant [N, M]) -> z;
    z + x's row sums (an input-dependent node after the weights)."""
    gen = torch.Generator().manual_seed(0)
    g = GraphSpec()
    x = g.input(torch.zeros(2, K, dtype=torch.float16))
    packed = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.int64).to(torch.uint8)
    q = g.constant(packed, dtype=DataType.int4, dims=[N, K])
    s = g.constant((torch.rand(N, K // G, generator=gen) + 0.5).half())
    w2 = g.constant(torch.randn(N, M, generator=gen).half())
    w, wt = g.value(DataType.float16, [N, K]), g.value(DataType.float16, [K, N])
    y, z = g.value(DataType.float16, [2, N]), g.value(DataType.float16, [2, M])
    g.node(
        "MPSDequantizePerChannelGroup",
        input1_id=q,
        output_id=w,
        scales_id=s,
        zero_points_id=-1,
        quant_min=-8,
        quant_max=7,
        dtype=DataType.int4,
        group_size=G,
        output_dtype=DataType.float16,
    )
    g.node("MPSPermute", input1_id=w, output_id=wt, num_dims=2, perm=[1, 0])
    g.node("MPSMatMul", input1_id=x, input2_id=wt, output_id=y)
    g.node("MPSMatMul", input1_id=y, input2_id=w2, output_id=z)
    return g.output(z), {"x": x, "w": w, "wt": wt, "w2": w2, "y": y, "z": z}


def _inputs(seed: int) -> list[torch.Tensor]:
    return [torch.randn(2, K, generator=torch.Generator().manual_seed(seed)).half()]


def test_the_plan_keeps_the_transposed_weights_and_widens_what_matmuls_read():
    g, ids = _weight_graph()
    memo = Interpreter(g.blob()).memo
    assert memo is not None and memo.nodes == frozenset({0, 1})  # the dequantize and the permute
    # the dequantized weight is read only by the permute (which is skipped too): only wt is kept
    assert memo.keep_after == {1: (ids["wt"],)}
    assert memo.widen == frozenset({ids["wt"], ids["w2"]})


@pytest.mark.parametrize("chunk", [None, 100, 32], ids=["whole", "blocks-of-columns", "blocks-of-rows"])
def test_runs_with_the_memo_equal_runs_without_it_bit_for_bit(monkeypatch, chunk):
    """Also where the matmul kernel widens a block of the weight's columns, or of x's rows, at a time
    (x is 2 x K float16: 64 bytes widened; the transposed weight K x N: 192)."""
    from mps_backend.runtime.kernels import linalg

    if chunk is not None:
        monkeypatch.setattr(linalg, "CHUNK_BYTES", chunk)
    g, _ = _weight_graph()
    with_memo = Interpreter(g.blob())
    monkeypatch.setenv("MPS_BACKEND_EMULATOR_MEMO_BYTES", "1")
    without = Interpreter(g.blob())
    assert with_memo.memo is not None and without.memo is None
    for seed in range(4):
        (a,), (b,) = with_memo.run(_inputs(seed)), without.run(_inputs(seed))
        assert a.dtype == torch.float16 and torch.equal(a, b), seed
    assert with_memo.memo.filled and set(with_memo.memo.widened) == set(with_memo.memo.widen)


def test_later_runs_skip_the_weight_nodes():
    g, _ = _weight_graph()
    interp = Interpreter(g.blob())
    calls: dict[str, int] = {}

    def counting(kernel):
        def run(ctx, node):
            calls[node.op] = calls.get(node.op, 0) + 1
            return kernel(ctx, node)

        return run

    interp._plan = [(i, node, counting(fn)) for i, node, fn in interp._plan]
    for seed in range(3):
        interp.run(_inputs(seed))
    assert calls == {"MPSDequantizePerChannelGroup": 1, "MPSPermute": 1, "MPSMatMul": 6}


def test_an_observer_sees_every_node_every_run():
    g, _ = _weight_graph()
    interp = Interpreter(g.blob())
    interp.run(_inputs(0))

    class Seen:
        def __init__(self):
            self.nodes: list[int] = []

        def begin(self, index, node):
            self.nodes.append(index)

        def end(self, index, node, outputs):
            pass

    seen = Seen()
    interp.run_with_report(_inputs(1), observer=seen)
    assert seen.nodes == [0, 1, 2, 3]


@pytest.mark.parametrize("budget,keep,widen", [(1, False, False), (2 * K * N, True, False), (1 << 20, True, True)])
def test_the_budget_decides_from_declared_shapes(monkeypatch, budget, keep, widen):
    """wt is K x N float16 (2 K N bytes kept); widening wt and w2 to float32 takes 4 (K N + N M) more."""
    monkeypatch.setenv("MPS_BACKEND_EMULATOR_MEMO_BYTES", str(budget))
    g, _ = _weight_graph()
    interp = Interpreter(g.blob())
    memo = interp.memo
    assert (memo is not None) == keep
    assert bool(memo and memo.widen) == widen
    assert memo is None or 2 * K * N + (4 * (K * N + N * M) if widen else 0) <= budget
    (a,) = interp.run(_inputs(0))
    (b,) = interp.run(_inputs(0))
    assert torch.equal(a, b)


def test_a_node_that_writes_over_a_constant_is_not_memoized():
    """A blob may name a constant as a node's output: that node runs every time, in its place."""
    g = GraphSpec()
    x = g.input(torch.zeros(3))
    c = g.constant(torch.tensor([1.0, 2.0, 3.0]))
    d = g.constant(torch.tensor([10.0, 20.0, 30.0]))
    y, z = g.value(DataType.float32, [3]), g.value(DataType.float32, [3])
    g.node("MPSAdd", input1_id=x, input2_id=c, output_id=y, alpha=1.0)
    g.node("MPSAdd", input1_id=d, input2_id=d, output_id=c, alpha=1.0)  # c := 2 d, after y read it
    g.node("MPSAdd", input1_id=y, input2_id=c, output_id=z, alpha=1.0)
    interp = Interpreter(g.output(z).blob())
    assert interp.memo is not None and 1 not in interp.memo.nodes
    for _ in range(2):
        (out,) = interp.run([torch.ones(3)])
        assert torch.equal(out, torch.tensor([22.0, 43.0, 64.0]))


def test_the_default_budget_holds_a_small_model_widened_and_no_1b_one():
    assert 135e6 * (2 + 4) <= interp_mod.DEFAULT_MEMO_BYTES < 1.2e9 * 4
