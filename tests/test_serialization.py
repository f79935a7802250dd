"""MP00 serialization: header, alignment, write->read round trip, differential check of the writer
against the flatc accessors, upstream wire compatibility, and the reader's rejections."""

from __future__ import annotations

import importlib
import json
import struct

import flatbuffers
import numpy as np
import pytest

from mps_backend.serialization import MPSFormatError, read_blob, write_blob
from mps_backend.serialization.generated.mpsgraph import MPSCat as fb_cat
from mps_backend.serialization.generated.mpsgraph import MPSGraph as fb_graph
from mps_backend.serialization.generated.mpsgraph import MPSNode as fb_node
from mps_backend.serialization.generated.mpsgraph import MPSTensor as fb_tensor
from mps_backend.serialization.model import (
    UNION_MEMBERS,
    UNION_NAMES,
    UNION_TAGS,
    DataType,
    Graph,
    Header,
    Node,
    Tensor,
    member_fields,
    table_fields,
)
from mps_backend.serialization.pte import DelegateBlob, delegate_blobs
from mps_backend.serialization.reader import absent_fields
from mps_backend.serialization.writer import build_flatbuffer

F16, F32, I64, BOOL, INT4 = DataType.float16, DataType.float32, DataType.int64, DataType.bool, DataType.int4
UPSTREAM = [
    "cnn_fp16.pte",
    "cnn_fp32.pte",
    "conv1d_fp16.pte",
    "conv1d_fp32.pte",
    "mlp_fp16.pte",
    "mlp_fp32.pte",
    "ops_fp16.pte",
    "ops_fp32.pte",
]
GEN = "mps_backend.serialization.generated.mpsgraph."


def _align(n: int, a: int = 16) -> int:
    return (n + a - 1) // a * a


def node(op: str, min_max: tuple[float, float] | None = None, **fields) -> Node:
    assert sorted(fields) == sorted(member_fields(op)), f"{op}: test node must list every field"
    return Node(op, fields, min_max)


def rich_graph() -> tuple[Graph, dict[int, object]]:
    """Many union members: strings (GELU, Div with and without mode), int vectors, longs, bools,
    enums, min_max, -1 ids where allowed, id rebinding, constants of several dtypes incl. int4."""
    values = [
        Tensor(F32, [2, 4]),
        Tensor(F32, [2, 4]),
        Tensor(I64, [3]),  # 0-2 inputs
        Tensor(F32, [4]),
        Tensor(F16, [3]),
        Tensor(INT4, [4, 6]),  # 3-5 constants
        Tensor(BOOL, [5]),
        Tensor(F32, [2, 2, 1, 1]),
    ]  # 6-7 constants
    values += [Tensor(F32, [2, 4]) for _ in range(8, 32)]
    consts = {
        3: np.arange(4, dtype=np.float32),
        4: np.array([1, 2, 3], dtype=np.float16),
        5: bytes(range(12)),
        6: np.array([1, 0, 1, 1, 0], dtype=bool),
        7: np.ones((2, 2, 1, 1), dtype=np.float32),
    }
    pool = dict(
        kernel_height=2,
        kernel_width=2,
        stride_height=2,
        stride_width=2,
        padding_left=0,
        padding_right=1,
        padding_top=0,
        padding_bottom=1,
        dilation_height=1,
        dilation_width=1,
        ceil_mode=True,
        count_include_pad=False,
        divisor_override=0,
    )
    nodes = [
        node("MPSAdd", input1_id=0, input2_id=1, output_id=10, alpha=0.5),
        node("MPSGELU", input1_id=10, output_id=11, approximate="tanh"),
        node("MPSDiv", input1_id=11, input2_id=1, output_id=12, rounding_mode="floor"),
        node("MPSDiv", input1_id=12, input2_id=1, output_id=13, rounding_mode=None),
        node("MPSMean", input1_id=13, output_id=14, num_dims=1, dims=[1], keep_dims=True),
        node("MPSClamp", (-1.5, 2.0), input1_id=13, output_id=15),
        node("MPSView", input1_id=0, output_id=16, num_dims=4, shape=[1, 2, 2, 2]),
        node(
            "MPSConv2D",
            input1_id=16,
            input2_id=7,
            input3_id=-1,
            output_id=17,
            stride_x=1,
            stride_y=2,
            dilation_x=1,
            dilation_y=1,
            groups=1,
            padding_left=0,
            padding_right=0,
            padding_top=1,
            padding_bottom=1,
        ),
        node("MPSCat", input_ids=[0, 1], output_id=18, dim=0),
        node("MPSSplitWithSizes", input1_id=18, output_ids=[19, 20], split_sizes=[2, 2], dim=0),
        node("MPSSlice", input1_id=19, output_id=21, dim=1, start=0, end=2**40, step=1),
        node("MPSSoftmax", input1_id=21, output_id=22, dim=-1, half_to_float=False),
        node("MPSCast", input1_id=22, output_id=22, dtype=F16),
        node("MPSIndexTensor", input1_id=0, indices_id=[-1, 2], output_id=23),
        node("MPSArange", output_id=24, start=0.0, end=4.0, step=1.0, dtype=F32),
        node(
            "MPSDequantizePerChannelGroup",
            input1_id=5,
            output_id=25,
            scales_id=3,
            zero_points_id=-1,
            quant_min=-8,
            quant_max=7,
            dtype=INT4,
            group_size=3,
            output_dtype=F16,
        ),
        node(
            "MPSBatchNorm",
            input_id=16,
            mean_id=3,
            var_id=3,
            weight_id=3,
            bias_id=3,
            momentum=0.25,
            epsilon=2.0**-10,
            output2_id=27,
            output1_id=26,
            output3_id=28,
        ),
        node("MPSWhere", input1_id=6, input2_id=3, input3_id=3, output_id=29),
        node("MPSAvgPool2D", input1_id=16, output1_id=30, output2_id=-1, **pool),
        node("MPSMaxPool2DWithIndices", input1_id=16, output1_id=31, output2_id=8, **pool),
        node("MPSPermute", input1_id=31, output_id=9, num_dims=2, perm=[1, 0]),
        node("MPSReLU", input1_id=9, input2_id=-1, output_id=9),
    ]
    graph = Graph(
        nodes=nodes,
        values=values,
        input_ids=[0, 1, 2],
        constant_ids=[3, 4, 5, 6, 7],
        output_ids=[14, 15, 17, 20, 22, 23, 24, 25, 26, 27, 29, 30, 8, 9],
    )
    return graph, consts


def small_graph() -> tuple[Graph, dict[int, object]]:
    """x + y, times a constant: the base of the hand-made violations."""
    values = [
        Tensor(F32, [2, 2]),
        Tensor(F32, [2, 2]),
        Tensor(F32, [2, 2]),
        Tensor(F32, [2, 2]),
        Tensor(F32, [2, 2]),
        Tensor(F32, [2, 2]),
    ]
    nodes = [
        node("MPSAdd", input1_id=0, input2_id=1, output_id=3, alpha=1.0),
        node("MPSMul", input1_id=3, input2_id=2, output_id=4),
    ]
    graph = Graph(nodes=nodes, values=values, input_ids=[0, 1], constant_ids=[2], output_ids=[4])
    return graph, {2: np.arange(4, dtype=np.float32)}


def assemble(graph: Graph, segment: bytes) -> bytes:
    """A blob with the constants' segment_offset/constant_buffer_size exactly as set in ``graph``."""
    fb = build_flatbuffer(graph)
    offset = _align(len(fb) + Header.SIZE)
    size = _align(len(segment))
    return Header(offset, size).to_bytes() + fb + bytes(offset - Header.SIZE - len(fb)) + segment + bytes(size - len(segment))


# --------------------------------------------------------------------------- decoding via flatc accessors


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def _member_fields_via_bindings(obj, table: str) -> dict:
    out = {}
    for f in table_fields(table):
        acc, ftype = _camel(f["name"]), f["type"]
        if ftype == "string":
            raw = getattr(obj, acc)()
            out[f["name"]] = None if raw is None else raw.decode()
        elif ftype.startswith("["):
            n = getattr(obj, acc + "Length")()
            out[f["name"]] = [getattr(obj, acc)(j) for j in range(n)]
        else:
            out[f["name"]] = getattr(obj, acc)()
    return out


def decode_with_bindings(blob: bytes) -> Graph:
    """The graph as the flatc-generated accessor classes see it (no validation)."""
    g = fb_graph.MPSGraph.GetRootAs(blob, Header.SIZE)
    nodes = []
    for i in range(g.MpsNodesLength()):
        n = g.MpsNodes(i)
        op = UNION_NAMES[n.MpsnodeUnionType()]
        table = UNION_MEMBERS[op]
        member = getattr(importlib.import_module(GEN + table), table)()
        tab = n.MpsnodeUnion()
        member.Init(tab.Bytes, tab.Pos)
        mm = n.MinMax()
        nodes.append(Node(op, _member_fields_via_bindings(member, table), None if mm is None else (mm.MinValue(), mm.MaxValue())))
    values = []
    for i in range(g.MpsValuesLength()):
        t = g.MpsValues(i)
        assert t.NumDims() == t.DimsLength()
        values.append(
            Tensor(DataType(t.Datatype()), [t.Dims(j) for j in range(t.DimsLength())], t.ConstantBufferSize(), t.SegmentOffset())
        )
    seg = g.ConstantSegment()

    def ids(acc: str) -> list[int]:
        return [getattr(g, acc)(j) for j in range(getattr(g, acc + "Length")())]

    return Graph(
        nodes=nodes,
        values=values,
        input_ids=ids("InputIds"),
        output_ids=ids("OutputIds"),
        constant_ids=ids("ConstantIds"),
        graph_type=g.GraphType(),
        version=None if g.Version() is None else g.Version().decode(),
        constant_segment=(0, 0) if seg is None else (seg.Offset(), seg.Size()),
    )


# --------------------------------------------------------------------------- writer: layout and round trip


def test_header_bytes_exact():
    graph, consts = small_graph()
    blob = write_blob(graph, consts)
    fb = build_flatbuffer(graph)  # graph now carries the constant layout the writer chose
    offset = _align(24 + len(fb))
    assert blob[:24] == (b"\0\0\0\0MP00" + offset.to_bytes(8, "little") + (16).to_bytes(8, "little"))
    assert blob[24 : 24 + len(fb)] == fb
    assert blob[28:32] == b"MP00"
    assert blob[24 + len(fb) : offset] == bytes(offset - 24 - len(fb))
    assert len(blob) == offset + 16
    assert blob[offset:] == np.arange(4, dtype=np.float32).tobytes()


def test_segment_and_constants_aligned_and_padding_zero():
    graph, consts = rich_graph()
    blob = write_blob(graph, consts)
    header = Header.from_bytes(blob)
    assert header.segment_offset % 16 == 0 and header.segment_size % 16 == 0
    assert header.segment_offset + header.segment_size == len(blob)
    covered = np.zeros(header.segment_size, dtype=bool)
    for vid in graph.constant_ids:
        t = graph.values[vid]
        assert t.segment_offset % 16 == 0 and (header.segment_offset + t.segment_offset) % 16 == 0
        covered[t.segment_offset : t.segment_offset + t.constant_buffer_size] = True
    segment = np.frombuffer(blob, dtype=np.uint8, offset=header.segment_offset)
    assert not segment[~covered].any(), "padding between/after constants must be zero"


def test_writer_is_deterministic():
    assert write_blob(*rich_graph()) == write_blob(*rich_graph())


@pytest.mark.parametrize("make", [rich_graph, small_graph])
def test_round_trip(make):
    graph, consts = make()
    blob = write_blob(graph, consts)
    back = read_blob(blob)
    assert back.graph == graph  # nodes with every field, values, ids, min_max, version, segment
    assert back.data == blob
    for vid, data in consts.items():
        expected = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        assert bytes(back.constant_bytes(vid)) == expected
    # every field is written explicitly (format contract 4); a None string is the one way to omit
    expected_absent = [
        f"node {i} ({n.op}): {UNION_MEMBERS[n.op]}.{k}"
        for i, n in enumerate(graph.nodes)
        for k, v in n.fields.items()
        if v is None
    ]
    assert absent_fields(blob) == expected_absent


def test_round_trip_without_constants():
    graph = Graph(
        nodes=[node("MPSTanh", input1_id=0, output_id=1)],
        values=[Tensor(F32, []), Tensor(F32, [])],
        input_ids=[0],
        output_ids=[1],
    )
    blob = write_blob(graph, {})
    back = read_blob(blob)
    assert back.header.segment_size == 0 and back.header.segment_offset == len(blob)
    assert back.graph == graph and back.graph.values[0].device_shape == (1,)


def test_writer_rejects_missing_field():
    graph, consts = small_graph()
    graph.nodes[0] = Node("MPSAdd", {"input1_id": 0, "input2_id": 1, "output_id": 3})
    with pytest.raises(ValueError, match=r"node 0 \(MPSAdd\).*alpha missing"):
        write_blob(graph, consts)


@pytest.mark.parametrize("make", [rich_graph, small_graph])
def test_writer_matches_flatc_accessors(make):
    """Differential check of the writer (and the reader): the generated accessors agree."""
    graph, consts = make()
    blob = write_blob(graph, consts)
    assert decode_with_bindings(blob) == graph == read_blob(blob).graph


# --------------------------------------------------------------------------- upstream wire compatibility


@pytest.mark.parametrize("name", UPSTREAM)
def test_upstream_fixture_decodes(upstream_pte_dir, name):
    manifest = json.loads((upstream_pte_dir / "manifest.json").read_text())
    delegates = delegate_blobs(upstream_pte_dir / name)
    assert delegates and all(isinstance(d, DelegateBlob) and d.backend_id == "MPSBackend" for d in delegates)
    for d in delegates:
        assert d.compile_specs["use_fp16"] == bytes([manifest[name]["use_fp16"]])
        blob = read_blob(d.blob)
        g = blob.graph
        assert g.nodes and g.output_ids and g.input_ids == list(range(len(g.input_ids)))
        # the accessor classes see the same graph (upstream omits zero-valued scalars: same defaults)
        assert decode_with_bindings(d.blob) == g
        for vid in g.constant_ids:
            assert len(blob.constant_bytes(vid)) == g.values[vid].constant_buffer_size > 0


def test_pte_inline_and_segment_storage_agree(upstream_pte_dir):
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header, deserialize_pte_binary, serialize_pte_binary
    from executorch.exir.schema import DataLocation

    def location(pte: bytes) -> DataLocation:
        header = _get_extended_header(pte)
        program = _flatbuffer_to_program(pte[: header.program_size] if header else pte)
        return program.execution_plan[0].delegates[0].processed.location

    segmented = (upstream_pte_dir / "mlp_fp32.pte").read_bytes()
    inline = bytes(serialize_pte_binary(deserialize_pte_binary(segmented), extract_delegate_segments=False))
    assert location(segmented) == DataLocation.SEGMENT and location(inline) == DataLocation.INLINE
    assert delegate_blobs(segmented) == delegate_blobs(inline)
    assert delegate_blobs(segmented, backend_id="NoSuchBackend") == []
    assert [d.backend_id for d in delegate_blobs(segmented, backend_id=None)] == ["MPSBackend"]


def test_a_mapped_pte_is_read_in_place(upstream_pte_dir, tmp_path):
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    from mps_backend.serialization.pte import map_file

    segmented = (upstream_pte_dir / "mlp_fp32.pte").read_bytes()
    inline = bytes(serialize_pte_binary(deserialize_pte_binary(segmented), extract_delegate_segments=False))
    for data in (segmented, inline):
        path = tmp_path / "p.pte"
        path.write_bytes(data)
        view = map_file(path)
        (copied,) = delegate_blobs(data)
        (mapped,) = delegate_blobs(view, copy=False)
        assert isinstance(copied.blob, bytes) and isinstance(mapped.blob, memoryview)
        assert mapped.blob.obj is view.obj  # a slice of the file's mapping: nothing copied
        assert bytes(mapped.blob) == copied.blob and mapped.compile_specs == copied.compile_specs
        blob = read_blob(mapped.blob)
        assert isinstance(blob.data, memoryview) and blob.data.obj is view.obj  # constants read in place too
        assert blob.graph == read_blob(copied.blob).graph
        assert len(blob.graph.constant_ids) > 0
        for vid in blob.graph.constant_ids:
            assert bytes(blob.constant_bytes(vid)) == bytes(read_blob(copied.blob).constant_bytes(vid))


@pytest.mark.parametrize("data", [b"", b"not a program at all", b"\0\0\0\0MP00" + bytes(64)])
def test_pte_rejects_non_pte(data):
    with pytest.raises(MPSFormatError, match="not an executorch program"):
        delegate_blobs(data)


# --------------------------------------------------------------------------- reader rejections


def _union_type_pos(blob: bytes, index: int) -> int:
    n = fb_graph.MPSGraph.GetRootAs(blob, Header.SIZE).MpsNodes(index)
    return n._tab.Pos + n._tab.Offset(4)


def _patched(blob: bytes, pos: int, data: bytes) -> bytes:
    return blob[:pos] + data + blob[pos + len(data) :]


def _small_blob(**change) -> bytes:
    graph, consts = small_graph()
    for key, value in change.items():
        setattr(graph, key, value)
    return write_blob(graph, consts)


def _with_node(n: Node, extra_values: int = 0) -> bytes:
    graph, consts = small_graph()
    graph.values += [Tensor(F32, [2, 2]) for _ in range(extra_values)]
    graph.nodes.append(n)
    return write_blob(graph, consts)


def _constant_blob(size: int, offset: int, segment: bytes = bytes(16)) -> bytes:
    graph, _ = small_graph()
    graph.values[2].constant_buffer_size = size
    graph.values[2].segment_offset = offset
    return assemble(graph, segment)


def _swapped_nodes() -> bytes:
    graph, consts = small_graph()
    graph.nodes.reverse()
    return write_blob(graph, consts)


BAD_BLOBS = {
    "bad magic": (lambda: _patched(_small_blob(), 4, b"XP00"), r"magic .* expected b'MP00'"),
    "nonzero bytes 0-3": (lambda: _patched(_small_blob(), 0, b"\x01"), r"bytes 0-3"),
    "bad flatbuffer identifier": (lambda: _patched(_small_blob(), 28, b"MP01"), r"identifier at bytes 28-31"),
    "truncated": (lambda: _small_blob()[:-1], r"does not end the"),
    "too short": (lambda: _small_blob()[:30], r"too short"),
    "segment misaligned": (lambda: _patched(_small_blob(), 8, struct.pack("<Q", len(_small_blob()) - 8)), r"not 16-byte aligned"),
    "input_ids not 0..n-1": (lambda: _small_blob(input_ids=[1, 0]), r"input_ids \[1, 0\] are not 0..n-1"),
    "input id out of range": (lambda: _small_blob(input_ids=[0, 1, 9]), r"input_ids\[2\] = 9 out of range"),
    "constant out of segment": (lambda: _constant_blob(16, 16), r"constant value 2: bytes \[16, 32\) outside"),
    "zero-size constant": (lambda: _constant_blob(0, 0), r"constant value 2: constant_buffer_size is 0"),
    "constant size mismatch": (lambda: _constant_blob(8, 0), r"constant_buffer_size 8 but float32 \[2, 2\] takes 16"),
    "use before define": (_swapped_nodes, r"node 0 \(MPSMul\): input1_id 3 is used before it is defined"),
    "output never defined": (lambda: _small_blob(output_ids=[4, 5]), r"output_ids\[1\] = 5 is never defined"),
    "unknown union type": (
        lambda: _patched(_small_blob(), _union_type_pos(_small_blob(), 1), b"\xfa"),
        r"node 1: union type 250 \(unknown\)",
    ),
    "NONE union type": (
        lambda: _patched(_small_blob(), _union_type_pos(_small_blob(), 0), b"\x00"),
        r"node 0: union type 0 \(NONE\)",
    ),
    "metal_kernel graph": (lambda: _small_blob(graph_type=1), r"graph_type 1 \(metal_kernel\)"),
    "not dispatched": (
        lambda: _with_node(node("MPSMin", input1_id=0, input2_id=1, output_id=5)),
        r"node 2 \(MPSMin\): the runtime has no kernel",
    ),
    "conv bias id out of range": (
        lambda: _with_node(
            node(
                "MPSConv2D",
                input1_id=0,
                input2_id=2,
                input3_id=57,
                output_id=5,
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
        ),
        r"node 2 \(MPSConv2D\): input3_id 57 out of range \(6 values\)",
    ),
    "batch norm without weight": (
        lambda: _with_node(
            node(
                "MPSBatchNorm",
                input_id=0,
                mean_id=2,
                var_id=2,
                weight_id=-1,
                bias_id=2,
                momentum=0.1,
                epsilon=0.5,
                output2_id=-1,
                output1_id=5,
                output3_id=-1,
            )
        ),
        r"node 2 \(MPSBatchNorm\): weight_id -1 out of range",
    ),
    "index tensor with undefined index": (
        lambda: _with_node(node("MPSIndexTensor", input1_id=0, indices_id=[-1, 5], output_id=6), 1),
        r"node 2 \(MPSIndexTensor\): indices_id\[1\] 5 is used before it is defined",
    ),
    "max pool without indices": (
        lambda: _with_node(
            node(
                "MPSMaxPool2DWithIndices",
                input1_id=0,
                kernel_height=1,
                kernel_width=1,
                stride_height=1,
                stride_width=1,
                padding_left=0,
                padding_right=0,
                padding_top=0,
                padding_bottom=0,
                dilation_height=1,
                dilation_width=1,
                ceil_mode=False,
                count_include_pad=False,
                divisor_override=0,
                output1_id=5,
                output2_id=-1,
            )
        ),
        r"output2_id -1 out of range",
    ),
    "gelu without approximate": (
        lambda: _with_node(node("MPSGELU", input1_id=0, output_id=5, approximate=None)),
        r"node 2 \(MPSGELU\): approximate missing",
    ),
    "clamp without bounds as output": (
        lambda: _small_blob(nodes=small_graph()[0].nodes + [node("MPSClamp", input1_id=4, output_id=5)], output_ids=[5]),
        r"output_ids\[0\] = 5 is never defined",
    ),
    "batch norm output3 as output": (
        lambda: _small_blob(
            nodes=small_graph()[0].nodes
            + [
                node(
                    "MPSBatchNorm",
                    input_id=0,
                    mean_id=2,
                    var_id=2,
                    weight_id=2,
                    bias_id=2,
                    momentum=0.1,
                    epsilon=0.5,
                    output2_id=3,
                    output1_id=4,
                    output3_id=5,
                )
            ],
            output_ids=[5],
        ),
        r"output_ids\[0\] = 5 is never defined",
    ),
    "negative dimension": (
        lambda: _small_blob(values=[Tensor(F32, [-1, 2])] + small_graph()[0].values[1:]),
        r"value 0: negative dimension",
    ),
    "input dtype not on device": (
        lambda: _small_blob(values=[Tensor(DataType.uint8, [2, 2])] + small_graph()[0].values[1:]),
        r"input value 0: dtype uint8 is not supported",
    ),
}


@pytest.mark.parametrize("case", list(BAD_BLOBS))
def test_reader_rejects(case):
    make, message = BAD_BLOBS[case]
    with pytest.raises(MPSFormatError, match=message):
        read_blob(make())


def test_reader_accepts_allowed_minus_one_ids():
    """-1 where the runtime allows it: conv bias, IndexTensor entries, avg-pool indices, ignored ids."""
    graph, consts = rich_graph()
    assert read_blob(write_blob(graph, consts)).graph.nodes[7]["input3_id"] == -1


def test_reader_rejects_num_dims_beyond_dims():
    graph, consts = small_graph()
    blob = write_blob(graph, consts)
    t = fb_graph.MPSGraph.GetRootAs(blob, Header.SIZE).MpsValues(0)
    pos = t._tab.Pos + t._tab.Offset(6)  # MPSTensor.num_dims (slot 1)
    with pytest.raises(MPSFormatError, match=r"value 0: num_dims 3 but only 2 dims"):
        read_blob(_patched(blob, pos, struct.pack("<i", 3)))


def test_reader_bounds_work_on_shared_references():
    """Many nodes sharing one table with a long vector: rejected quickly instead of quadratic work."""
    n = 3000
    b = flatbuffers.Builder(0)
    ids = b.CreateNumpyVector(np.zeros(n, dtype="<i4"))
    fb_cat.Start(b)
    fb_cat.AddInputIds(b, ids)
    fb_cat.AddOutputId(b, 1)
    cat = fb_cat.End(b)
    fb_node.Start(b)
    fb_node.AddMpsnodeUnionType(b, UNION_TAGS["MPSCat"])
    fb_node.AddMpsnodeUnion(b, cat)
    shared = fb_node.End(b)

    def offsets(items):
        b.StartVector(4, len(items), 4)
        for off in reversed(items):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    nodes = offsets([shared] * n)
    tensors = []
    for _ in range(2):
        dims = b.CreateNumpyVector(np.array([1], dtype="<i4"))
        fb_tensor.Start(b)
        fb_tensor.AddDatatype(b, int(F32))
        fb_tensor.AddNumDims(b, 1)
        fb_tensor.AddDims(b, dims)
        tensors.append(fb_tensor.End(b))
    values = offsets(tensors)
    inputs = b.CreateNumpyVector(np.array([0], dtype="<i4"))
    outputs = b.CreateNumpyVector(np.array([1], dtype="<i4"))
    empty = b.CreateNumpyVector(np.zeros(0, dtype="<i4"))
    fb_graph.Start(b)
    fb_graph.AddMpsNodes(b, nodes)
    fb_graph.AddMpsValues(b, values)
    fb_graph.AddInputIds(b, inputs)
    fb_graph.AddOutputIds(b, outputs)
    fb_graph.AddConstantIds(b, empty)
    b.Finish(fb_graph.End(b), file_identifier=b"MP00")
    fb = bytes(b.Output())
    offset = _align(24 + len(fb))
    blob = Header(offset, 0).to_bytes() + fb + bytes(offset - 24 - len(fb))
    with pytest.raises(MPSFormatError, match="more objects referenced than"):
        read_blob(blob)
