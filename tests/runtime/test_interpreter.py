"""The interpreter: blob decoding, input binding, constant loading, node loop, outputs and report
(semantics §1, §2, §4, §5.17, §7), on graphs written with the writer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mps_backend.runtime.core import DeviceError
from mps_backend.runtime.interpreter import Interpreter, execute, unpack_int4
from mps_backend.serialization.model import DataType, OpType
from tests.work_count import CallCount

from .helpers import GraphSpec, one_node, run_graph


def t(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def add_graph(x: torch.Tensor, c: torch.Tensor) -> GraphSpec:
    return one_node("MPSAdd", [x], constants=[c], alpha=1.0)


def const_graph(data: torch.Tensor, dtype: DataType | None = None, dims=None) -> GraphSpec:
    """A graph with no nodes whose only output is one constant."""
    g = GraphSpec()
    return g.output(g.constant(data, dtype, dims))


class TestEntryPoints:
    def test_bytes_are_decoded_with_read_blob(self):
        x, c = t([1.0, 2.0]), t([10.0, 20.0])
        blob = add_graph(x, c).to_bytes()
        (y,) = execute(blob, [x])
        assert torch.equal(y, t([11.0, 22.0]))

    def test_decoded_blob_and_reuse(self):
        x, c = t([1.0, 2.0]), t([10.0, 20.0])
        interp = Interpreter(add_graph(x, c).blob())
        assert torch.equal(interp.run([x])[0], t([11.0, 22.0]))
        assert torch.equal(interp.run([t([0.0, 1.0])])[0], t([10.0, 21.0]))

    def test_invalid_mode(self):
        with pytest.raises(ValueError, match="mode"):
            execute(add_graph(t([1.0]), t([1.0])).blob(), [t([1.0])], mode="eager")

    def test_not_a_blob(self):
        with pytest.raises(TypeError):
            execute("blob.bin", [])

    def test_metal_kernel_graph_fails_at_init(self):
        g = add_graph(t([1.0]), t([1.0]))
        g.graph.graph_type = OpType.metal_kernel
        with pytest.raises(DeviceError, match="metal_kernel"):
            Interpreter(g.blob())


READER_CASES = [
    ("MPSDiv", [t([7, -7], torch.int32), t([2, 2], torch.int32)], dict(rounding_mode=None)),
    ("MPSFmod", [t([5.5, -5.5]), t([2.0, 2.0])], dict(rounding_mode=None)),
    ("MPSGELU", [t([0.3, -1.2])], dict(approximate="tanh")),
    ("MPSClamp", [t([-2.0, 0.1, 9.0])], dict(min_max=(0.1, 6.0))),
    ("MPSAdd", [t([1.0, 2.0]), t([3.0, 4.0])], dict(alpha=0.1)),
    ("MPSLeakyReLU", [t([-1.0, 1.0])], dict(negative_slope=0.01)),
    ("MPSArange", [], dict(start=0.0, end=1.0, step=0.1, dtype=int(DataType.float32))),
    ("MPSFull", [], dict(input1_id=-1, shape=[2], fill_value=0.1, dtype=int(DataType.float16))),
]


@pytest.mark.parametrize("op,inputs,fields", READER_CASES, ids=[c[0] for c in READER_CASES])
def test_read_blob_path_matches_the_written_graph(op, inputs, fields):
    """Floats come back from the reader as float32 and absent strings as None: same results."""
    direct = run_graph(op, inputs, **fields)
    decoded = run_graph(op, inputs, decode=True, **fields)
    torch.testing.assert_close(decoded, direct, rtol=0, atol=0)


class TestInputs:
    def test_count_mismatch(self):
        g = add_graph(t([1.0]), t([1.0]))
        with pytest.raises(ValueError, match="1 inputs, 2 tensors"):
            g.run([t([1.0]), t([1.0])])

    def test_shape_mismatch_is_not_reinterpreted(self):
        g = add_graph(t([1.0, 2.0]), t([1.0, 2.0]))
        with pytest.raises(ValueError, match="static placeholder"):
            g.run([t([1.0, 2.0, 3.0])])

    def test_dtype_mismatch_is_not_reinterpreted(self):
        g = add_graph(t([1.0, 2.0]), t([1.0, 2.0]))
        with pytest.raises(ValueError, match="reinterpret"):
            g.run([t([1, 2], torch.int32)])

    def test_float64_input_is_read_as_f32(self):
        g = GraphSpec()
        v = g.input(t([1.0, 2.0]), DataType.float64)
        g.output(v)
        with pytest.raises(ValueError, match="float32"):
            g.run([t([1.0, 2.0], torch.float64)])
        (y,), report = g.run([t([1.0, 2.0])], report=True)
        assert y.dtype == torch.float32 and report[0].reinterpreted

    def test_rank0_input_is_one_element(self):
        g = GraphSpec()
        v = g.input(torch.tensor(3.0))
        out = g.value(DataType.float32, [])
        g.node("MPSNeg", input1_id=v, output_id=out).output(out)
        for feed in (torch.tensor(3.0), t([3.0])):
            (y,), report = g.run([feed], report=True)
            assert torch.equal(y, t([-3.0])) and not report[0].reinterpreted

    def test_unset_and_minus_one_ids(self):
        g = GraphSpec()
        v = g.input(t([1.0]))
        a, b = g.value(), g.value()
        g.node("MPSNeg", input1_id=a, output_id=b).output(b)
        with pytest.raises(DeviceError, match=r"node 0 \(MPSNeg\).*read before it is set"):
            g.run([t([1.0])])
        g.graph.nodes[0].fields["input1_id"] = -1
        with pytest.raises(DeviceError, match="-1"):
            g.run([t([1.0])])
        g.graph.nodes[0].fields["input1_id"] = 99
        with pytest.raises(DeviceError, match="outside the value table"):
            g.run([t([1.0])])
        assert v == 0


class TestConstants:
    @pytest.mark.parametrize(
        "data",
        [
            t([[1.5, -2.0]]),
            t([1.0, 2.0], torch.float16),
            t([-(2**40), 7], torch.int64),
            t([-3, 4], torch.int8),
            t([1, 2], torch.int16),
            t([5], torch.int32),
        ],
    )
    def test_dense_constants(self, data):
        (y,) = const_graph(data).run([])
        assert y.dtype == data.dtype and torch.equal(y, data)

    def test_rank0_constant_is_one_element(self):
        (y,) = const_graph(torch.tensor(2.5)).run([])
        assert torch.equal(y, t([2.5]))

    def test_bool_constant_nonzero_bytes(self):
        (y,) = const_graph(torch.tensor([0, 1, 2], dtype=torch.uint8), DataType.bool).run([])
        assert torch.equal(y, t([False, True, True], torch.bool))

    def test_float64_constant_holds_f32_bytes(self):
        (y,) = const_graph(t([0.1, 2.0]), DataType.float64).run([])
        assert y.dtype == torch.float32 and torch.equal(y, t([0.1, 2.0]))
        with pytest.raises(DeviceError, match="float32 bytes"):
            const_graph(t([0.1, 2.0], torch.float64)).run([])

    def test_size_mismatch(self):
        with pytest.raises(DeviceError, match="reads 16"):
            const_graph(t([1.0, 2.0]), DataType.float32, [4]).run([])

    def test_unsupported_dtype_aborts(self):
        with pytest.raises(DeviceError, match="Invalid MPS data type"):
            const_graph(torch.tensor([1, 2], dtype=torch.uint8)).run([])

    def test_int4_low_nibble_is_even_column_and_signed(self):
        packed = np.array([[0x21, 0xF8], [0x7F, 0x08]], dtype=np.uint8)  # shape [2, 4] as [2, 2] bytes
        expected = t([[1, 2, -8, -1], [-1, 7, -8, 0]], torch.int8)
        assert torch.equal(unpack_int4(packed.tobytes(), (2, 4)), expected)
        (y,) = const_graph(torch.from_numpy(packed), DataType.int4, [2, 4]).run([])
        assert torch.equal(y, expected)

    def test_int4_all_values(self):
        nibbles = np.arange(16, dtype=np.uint8)
        packed = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
        expected = torch.tensor([v - 16 if v >= 8 else v for v in range(16)], dtype=torch.int8)
        assert torch.equal(unpack_int4(packed.tobytes(), (1, 16)).reshape(-1), expected)


class TestNodesAndOutputs:
    def test_rebinding_an_id_fp16_io(self):
        x = t([1.0, 1.0 / 3.0])
        g = GraphSpec()
        v = g.input(x)
        g.node("MPSCast", input1_id=v, output_id=v, dtype=int(DataType.float16))
        g.node("MPSCast", input1_id=v, output_id=v, dtype=int(DataType.float32)).output(v)
        (y,) = g.run([x])
        assert torch.equal(y, x.half().float())

    def test_undispatched_member(self):
        g = one_node("MPSAtan2", [t([1.0]), t([1.0])])
        with pytest.raises(DeviceError, match=r"node 0 \(MPSAtan2\).*not dispatched"):
            g.run([t([1.0]), t([1.0])])

    def test_unknown_member(self):
        g = one_node("MPSNeg", [t([1.0])])
        g.graph.nodes[0].op = "MPSFancy"
        with pytest.raises(DeviceError, match="no dispatch case"):
            Interpreter(_blob_without_writer(g)).run([t([1.0])])

    def test_output_never_set(self):
        g = GraphSpec()
        v = g.input(t([1.0]))
        g.output(v, g.value())
        with pytest.raises(DeviceError, match="never set"):
            g.run([t([1.0])])

    def test_torch_errors_become_build_failures(self):
        with pytest.raises(DeviceError, match=r"node 0 \(MPSMul\).*MPSGraph would fail"):
            run_graph("MPSMul", [t([1.0, 2.0]), t([1.0, 2.0, 3.0])])

    def test_outputs_are_fresh_copies_and_may_repeat(self):
        x = t([1.0, 2.0])
        g = GraphSpec()
        v = g.input(x)
        c = g.constant(t([5.0]))
        g.output(v, c, v)
        a, b, a2 = g.run([x])
        a.add_(1.0)
        b.add_(1.0)
        assert torch.equal(x, t([1.0, 2.0])) and torch.equal(a2, x)
        assert torch.equal(g.run([x])[1], t([5.0]))

    def test_a_run_drops_each_value_after_its_last_reader(self):
        """As MPSGraph frees its intermediates: a run holds only the values a later node reads (an
        LLM step's dequantized weights are gigabytes); run_values keeps them all, for debuggers."""
        import weakref

        x = t([1.0, 2.0])
        g = GraphSpec()
        chain = [g.input(x)] + [g.value(DataType.float32, [2]) for _ in range(4)]
        for a, b in zip(chain, chain[1:]):
            g.node("MPSNeg", input1_id=a, output_id=b)
        g.output(chain[-1])
        interp = Interpreter(g.blob())

        class Watch:
            def __init__(self):
                self.refs, self.alive = [], []

            def begin(self, index, node):
                self.alive.append([r() is not None for r in self.refs])

            def end(self, index, node, outputs):
                self.refs += [weakref.ref(o) for o in outputs]

        w = Watch()
        (y,) = interp.run_with_report([x], w)[0]
        assert torch.equal(y, x) and w.alive == [[], [True], [False, True], [False, False, True]], w.alive
        values = interp.run_values([x])
        assert all(torch.equal(values[v], x if k % 2 == 0 else -x) for k, v in enumerate(chain))

    def test_report_flags_device_dtype_mismatch(self):
        # int operands with a mode give f32 on the device, declared int32 => reinterpreted
        a, b = t([7], torch.int32), t([2], torch.int32)
        _, report = run_graph("MPSDiv", [a, b], rounding_mode="floor", report=True)
        (info,) = report
        assert info.declared_dtype == DataType.int32 and info.device_dtype == torch.float32
        assert info.reinterpreted
        _, report = run_graph("MPSDiv", [a, b], rounding_mode="floor", report=True, mode="aten")
        assert not report[0].reinterpreted

    def test_execute_return_report(self):
        x = t([1.0])
        outs, report = execute(add_graph(x, t([1.0])).blob(), [x], return_report=True)
        assert len(outs) == len(report) == 1 and report[0].value_id == 2

    def test_per_node_overhead_is_small(self):
        x = t([1.0, 2.0])
        g = GraphSpec()
        prev = g.input(x)
        for _ in range(2000):
            nxt = g.value(DataType.float32, [2])
            g.node("MPSNeg", input1_id=prev, output_id=nxt)
            prev = nxt
        g.output(prev)
        interp = Interpreter(g.blob())
        with CallCount() as work:  # function calls, not a clock: machine load does not count
            (y,) = interp.run([x])
        assert torch.equal(y, x)
        # a constant, small number of calls per node (dispatch, one torch op, bookkeeping)
        assert work.calls < 40 * 2000, work.calls


def _blob_without_writer(g: GraphSpec):
    """A Blob whose graph holds a member name the writer would refuse (written with a valid name)."""
    from mps_backend.serialization.model import Blob, Header  # noqa: PLC0415

    name = g.graph.nodes[0].op
    g.graph.nodes[0].op = "MPSNeg"
    data = g.to_bytes()
    g.graph.nodes[0].op = name
    return Blob(Header.from_bytes(data), g.graph, data)
