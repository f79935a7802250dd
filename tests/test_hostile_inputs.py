"""Hostile inputs, round 3 (#26): bundled programs, checkpoint folders, pickles, program-check bounds.
Each test checks a whole class of input: a one-line typed error (or a correct result), no crash, no
traceback, nothing executed or opened that the input names."""

from __future__ import annotations

import random
import re

import pytest
import torch

from mps_backend.runtime.program_check import ProgramFormatError
from mps_backend.tools.cli import main


def _one_line_error(err: str) -> bool:
    return "Traceback" not in err and any(line.startswith("error: ") for line in err.splitlines())


# ---------------------------------------------------------------- bundled programs (.bpte)


@pytest.fixture(scope="module")
def bundled():
    from mps_backend.export import bundle, export_model

    model = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    pte = export_model(model, [x], use_fp16=False).pte
    with torch.no_grad():
        y = model(x)
    return bytes(pte), bundle(pte, [[x], [x]], [[y], [y]])


def _bpte_without_inputs(program: bytes) -> bytes:
    """A well-formed BP08 flatbuffer whose one test case has expected outputs but no inputs field."""
    import flatbuffers

    b = flatbuffers.Builder(0)
    prog = b.CreateByteVector(program)
    name = b.CreateString("forward")
    b.StartVector(4, 0, 4)
    outs = b.EndVector()
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(1, outs, 0)  # expected_outputs only
    case = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(case)
    cases = b.EndVector()
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(0, name, 0)
    b.PrependUOffsetTRelativeSlot(1, cases, 0)
    suite = b.EndObject()
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(suite)
    suites = b.EndVector()
    b.StartObject(3)
    b.PrependUOffsetTRelativeSlot(1, suites, 0)
    b.PrependUOffsetTRelativeSlot(2, prog, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=b"BP08")
    return bytes(b.Output())


def test_bundled_program_goes_through_the_program_check(bundled, tmp_path, capsys):
    from mps_backend.runtime.bundled_check import read_bundled

    pte, bpte = bundled
    program, cases = read_bundled(bpte, ProgramFormatError)
    assert bytes(program) == pte and cases == {"forward": 2}
    at = bpte.index(pte)
    bad_id = bytearray(bpte)
    k = at + pte.index(b"MPSBackend")
    bad_id[k] = 0xFF  # a backend id that is not UTF-8: executorch's log redirection aborted on it
    no_inputs = _bpte_without_inputs(pte)
    for i, data in enumerate((bytes(bad_id), no_inputs)):
        path = tmp_path / f"bad{i}.bpte"
        path.write_bytes(data)
        for argv in (["run", str(path)], ["run", str(path), "--random"], ["inspect", str(path)]):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert _one_line_error(err) and str(path) in err or "test case" in err, (argv, err)


def test_mutated_bundled_programs_are_refused_or_well_formed(bundled, tmp_path, capsys):
    """Random byte and u32 mutations of a .bpte: the bundle reader and the program check either accept
    it or raise ProgramFormatError (never another exception: inspect no longer shells out to flatc)."""
    from mps_backend.export import unbundle
    from mps_backend.runtime.emulator import _check_bundled
    from mps_backend.runtime.program_check import check_program

    _, bpte = bundled
    rng = random.Random(26)
    refused = 0
    for n in range(300):
        data = bytearray(bpte)
        pos = rng.randrange(len(data) - 4)
        if n % 3 == 0:  # a near-limit u32 (lengths, offsets)
            data[pos : pos + 4] = rng.choice((0xFFFFFFFF, 0xFFFFFFF0, 0x7FFFFFFF, 0x80000000)).to_bytes(4, "little")
        else:
            data[pos] = rng.randrange(256)
        try:
            check_program(unbundle(bytes(data)))
            _check_bundled(bytes(data), "forward")
        except ProgramFormatError:
            refused += 1
    assert refused > 30
    path = tmp_path / "m.bpte"
    data = bytearray(bpte)
    data[0:4] = (0xFFFFFFF0).to_bytes(4, "little")  # the root offset
    path.write_bytes(bytes(data))
    assert main(["inspect", str(path)]) == 2 and _one_line_error(capsys.readouterr().err)


# ---------------------------------------------------------------- hf: checkpoint folders

CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 8,
    "vocab_size": 16,
    "intermediate_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
}


def _safetensors(tensors: dict[str, tuple[str, list[int]]], *, header: dict | None = None) -> bytes:
    """A safetensors file of zero-filled tensors (name -> (dtype, shape)), or with ``header`` as given."""
    import json
    import math

    from mps_backend.llm.formats import DTYPE_BYTES

    if header is None:
        header, at = {}, 0
        for name, (dtype, shape) in tensors.items():
            n = DTYPE_BYTES[dtype] * math.prod(shape)
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}
            at += n
    ends = [v["data_offsets"][1] for v in header.values() if isinstance(v, dict) and "data_offsets" in v]
    size = max([0, *(e for e in ends if isinstance(e, int) and e < 1 << 20)])
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + bytes(size)


def _folder(path, *, config=None, tensors=None, files=None):
    import json

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(CONFIG if config is None else config))
    if tensors is None:
        tensors = {
            "model.embed_tokens.weight": ("F16", [16, 8]),
            "model.layers.0.mlp.up_proj.weight": ("F16", [16, 8]),  # every declared layer holds tensors (#38)
            "model.layers.1.mlp.up_proj.weight": ("F16", [16, 8]),
        }
    (path / "model.safetensors").write_bytes(_safetensors(tensors))
    (path / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    for name, data in (files or {}).items():
        (path / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _header(**entry):
    base = {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]}
    return {"model.layers.0.w": {**base, **entry}}


@pytest.mark.parametrize(
    "config, tensors, header, message",
    [
        ({**CONFIG, "num_hidden_layers": 10**6}, None, None, "num_hidden_layers = 1000000 outside [1, 1024]"),
        ({**CONFIG, "vocab_size": 2**40}, None, None, "vocab_size = 1099511627776 outside"),
        ({**CONFIG, "hidden_size": 0}, None, None, "hidden_size = 0 outside"),
        ({**CONFIG, "hidden_size": -8}, None, None, "hidden_size = -8 outside"),
        ({**CONFIG, "hidden_size": "8"}, None, None, "hidden_size is '8', not an integer"),
        ({**CONFIG, "num_hidden_layers": True}, None, None, "not an integer"),
        ({**CONFIG, "num_hidden_layers": 1e6}, None, None, "not an integer"),
        ({k: v for k, v in CONFIG.items() if k != "vocab_size"}, None, None, "no 'vocab_size'"),
        ({**CONFIG, "num_key_value_heads": 3}, None, None, "not a multiple of num_key_value_heads"),
        ({**CONFIG, "text_config": {"num_hidden_layers": 10**9}}, None, None, "text_config: num_hidden_layers"),
        ([1, 2], None, None, "not a JSON object"),
        (None, {"model.embed_tokens.weight": ("F16", [17, 8])}, None, "the config says [16, 8]"),
        (None, {"model.layers.2.w": ("F16", [1])}, None, "is of layer 2, the config has 2 layers"),
        (None, None, _header(dtype="F8_E9M9"), "unknown dtype 'F8_E9M9'"),
        (None, None, _header(shape=[-2, 2]), "is not up to 8 non-negative integers"),
        (None, None, _header(shape=[2**30, 2**30]), "its shape [1073741824, 1073741824] needs"),
        (None, None, _header(data_offsets=[0, 2**40]), "outside the"),
        (None, None, _header(data_offsets=[-8, 0]), "outside the"),
        (None, None, _header(data_offsets=[0, "8"]), "outside the"),
        (None, None, {**_header(), "model.layers.1.v": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}}, "overlap"),
        (None, None, {"__metadata__": {"a": 1}}, "__metadata__ is not an object of strings"),
        (None, None, {"x": [1]}, "its entry is not an object"),
    ],
)
def test_hf_folder_check_refuses_each_class(tmp_path, config, tensors, header, message):
    from mps_backend.llm.folder_check import FolderError, check_folder

    folder = _folder(tmp_path / "ck", config=config, tensors=tensors)
    if header is not None:
        (folder / "model.safetensors").write_bytes(_safetensors({}, header=header))
    with pytest.raises(FolderError) as e:
        check_folder(folder)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_hf_folder_check_files(tmp_path):
    """Header lengths beyond the file, offsets into the header, garbage tokenizers, shard indexes and
    symlinks pointing out of the folder, FIFOs: refused without opening anything outside (an outside
    FIFO would block the test if it were opened)."""
    import json
    import os

    from mps_backend.llm.folder_check import FolderError, check_folder

    good = _folder(tmp_path / "good")
    assert check_folder(good)["num_hidden_layers"] == 2
    outside = tmp_path / "outside"
    outside.mkdir()
    os.mkfifo(outside / "secret.safetensors")
    os.mkfifo(outside / "config.json")
    index = {"weight_map": {"model.embed_tokens.weight": "model.safetensors"}}
    st = _safetensors({"model.layers.0.w": ("F16", [2, 2])})
    entry = json.dumps(_header())[1:-1].encode()
    twice = b"{" + entry + b", " + entry + b"}"  # one tensor name, two entries
    cases = {
        "beyond the": {"model.safetensors": (10**9).to_bytes(8, "little") + b"{}"},
        "not a safetensors file": {"model.safetensors": b"\x01\x00"},
        "header is not JSON": {"model.safetensors": (4).to_bytes(8, "little") + b"\xff\xfe{}"},
        "outside the 7 bytes": {"model.safetensors": st[:-1]},  # the data (offsets past the end)
        "not valid JSON": {"tokenizer.json": "{garbage"},
        "no 'model' object": {"tokenizer.json": "{}"},
        "generation_config.json: not a JSON object": {"generation_config.json": "[]"},
        "is not a file name in the folder": {
            "model.safetensors.index.json": json.dumps({"weight_map": {"a": "../outside/secret.safetensors"}})
        },
        "is missing": {"model.safetensors.index.json": json.dumps({**index, "weight_map": {"a": "model-00002.safetensors"}})},
        "no weight_map": {"model.safetensors.index.json": "{}"},
        "key 'num_hidden_layers' appears twice": {"config.json": json.dumps(CONFIG)[:-1] + ', "num_hidden_layers": 1000000}'},
        "key 'a' appears twice": {
            "model.safetensors.index.json": '{"weight_map": {"a": "model.safetensors", "a": "../outside/x"}}'
        },
        "header names 'model.layers.0.w' twice": {"model.safetensors": len(twice).to_bytes(8, "little") + twice + bytes(8)},
    }
    for i, (message, files) in enumerate(cases.items()):
        folder = _folder(tmp_path / f"c{i}", files=files)
        with pytest.raises(FolderError, match=message.replace("(", r"\(").replace("'", "'")):
            check_folder(folder)
    links = _folder(tmp_path / "links")
    (links / "extra.safetensors").symlink_to(outside / "secret.safetensors")
    with pytest.raises(FolderError, match="outside the checkpoint folder"):
        check_folder(links)
    (links / "extra.safetensors").unlink()
    (links / "config.json").unlink()
    (links / "config.json").symlink_to(outside / "config.json")
    with pytest.raises(FolderError, match="outside the checkpoint folder"):
        check_folder(links)
    fifo = _folder(tmp_path / "fifo")
    os.mkfifo(fifo / "w.safetensors")
    with pytest.raises(FolderError, match="not a regular file"):
        check_folder(fifo)
    # the hub cache layout: snapshots/REV/f -> ../../blobs/HASH is inside the cache repository
    repo = tmp_path / "models--x--y"
    (repo / "blobs").mkdir(parents=True)
    snap = _folder(repo / "snapshots" / "abc")
    (repo / "blobs" / "h1").write_bytes((snap / "model.safetensors").read_bytes())
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").symlink_to("../../blobs/h1")
    assert check_folder(snap)["vocab_size"] == 16


def test_hf_export_of_a_hostile_folder_is_one_line(tmp_path, capsys):
    folder = _folder(tmp_path / "ck", config={**CONFIG, "num_hidden_layers": 10**6})
    assert main(["export", "--model", f"hf:{folder}", "-o", str(tmp_path / "x.pte")]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "num_hidden_layers" in err and not (tmp_path / "x.pte").exists()


def test_checkpoint_fuzz_through_the_folder_check(tmp_path):
    """Mutated safetensors headers and config.json values (a seeded campaign; the 10,000-case run is
    in the report): each accepted or refused with FolderError, nothing else."""
    from mps_backend.llm.folder_check import FolderError, check_config, check_safetensors

    rng = random.Random(2626)
    st = _safetensors({"model.embed_tokens.weight": ("F16", [16, 8]), "model.layers.1.w": ("F32", [3])})
    sizes = check_config(CONFIG, "config")
    path = tmp_path / "m.safetensors"
    weird = [0, -1, 1 << 31, 1 << 64, 1e308, float("nan"), "", "x", None, True, [], {}, [1, 2], 10**6]
    refused = 0
    for n in range(600):
        if n % 2:
            config = dict(CONFIG)
            for _ in range(rng.randint(1, 3)):
                config[rng.choice([*CONFIG, "text_config", "head_dim"])] = rng.choice(weird)
            try:
                check_config(config, "config")
            except FolderError:
                refused += 1
            continue
        data = bytearray(st)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(data))
            data[pos] = rng.choice((rng.randrange(256), *b'"[]{},:-09e'))
        path.write_bytes(bytes(data))
        try:
            check_safetensors(path, path, sizes)
        except FolderError:
            refused += 1
    assert refused > 200


# ---------------------------------------------------------------- llama: pickles


class _Payload:
    """Unpickling this would run ``open(marker, 'w')`` (a pickle's ``__reduce__`` names any callable)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_llama_pickle_that_would_run_code_is_refused(tmp_path, capsys):
    import json

    marker = tmp_path / "ran"
    ckpt = tmp_path / "consolidated.00.pth"
    torch.save({"tok_embeddings.weight": torch.zeros(4, 2), "evil": _Payload(marker)}, ckpt)
    (tmp_path / "params.json").write_text(json.dumps({"dim": 2, "n_layers": 1, "n_heads": 1, "vocab_size": 4}))
    assert not marker.exists()
    assert main(["export", "--model", f"llama:{ckpt}", "-o", str(tmp_path / "x.pte")]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "refused by torch.load(weights_only=True)" in err, err
    assert len([line for line in err.splitlines() if line.startswith("error")]) == 1 and "\x1b" not in err
    assert not marker.exists() and not (tmp_path / "x.pte").exists()
    ckpt.write_bytes(b"\x80\x02garbage")  # a damaged pickle: one line too
    assert main(["export", "--model", f"llama:{ckpt}", "-o", str(tmp_path / "x.pte")]) == 2
    assert _one_line_error(capsys.readouterr().err)


# ---------------------------------------------------------------- program check: memory plan


def test_program_check_memory_plan(bundled, monkeypatch):
    """A planned tensor that lost its allocation_info is refused (it SIGSEGVed run); the plan budget is
    exclusive (a plan of exactly MPS_BACKEND_MAX_PLAN_BYTES is refused)."""
    import struct

    from mps_backend.runtime import program_check
    from mps_backend.serialization.program import open_program

    pte, _ = bundled
    program_check.check_program(pte)
    tables = open_program(pte, ProgramFormatError)
    fb = tables.fb
    fb.layouts = program_check._LAYOUTS
    plan = fb.table(tables.program["execution_plan"][0], "ExecutionPlan", "plan")
    planned = []  # the fully delegated test program plans only its output: check it as an intermediate
    for pos in plan["values"]:
        tag, body = fb.table(pos, "EValue", "v")["val"]
        if tag == program_check.TENSOR_TAG and fb.table(body, "Tensor", "t")["allocation_info"]:
            planned.append(body)
    assert planned, "the test program has no planned tensor"
    data = bytearray(pte)
    vt = planned[0] - struct.unpack_from("<i", data, planned[0])[0]
    struct.pack_into("<H", data, vt + 4 + 2 * 6, 0)  # allocation_info's vtable slot: the field is absent
    tables = open_program(bytes(data), ProgramFormatError)
    mutated = tables.fb.table(tables.program["execution_plan"][0], "ExecutionPlan", "plan")
    with pytest.raises(ProgramFormatError, match="no allocation_info"):
        program_check._check_planned_tensors(tables.fb, {**mutated, "outputs": [], "inputs": []}, "m")
    total = sum(plan["non_const_buffer_sizes"])
    monkeypatch.setenv("MPS_BACKEND_MAX_PLAN_BYTES", str(total))
    with pytest.raises(ProgramFormatError, match="beyond the"):
        program_check.check_program(pte)
    monkeypatch.setenv("MPS_BACKEND_MAX_PLAN_BYTES", str(total + 1))
    program_check.check_program(pte)


# ---------------------------------------------------------------- run: delegate failures, memory


def _blob_field_offset(blob: bytes, op: str, field: str) -> int:
    """Byte offset in ``blob`` of the scalar ``field`` of the first ``op`` node (to patch in place)."""
    import struct

    from mps_backend.serialization import reader
    from mps_backend.serialization.model import HEADER_SIZE, UNION_MEMBERS, UNION_NAMES

    header = reader.read_header(blob)
    fb = reader._FlatBuffer(memoryview(blob)[HEADER_SIZE : header.segment_offset], "blob")
    graph = fb.table(fb.deref(0, "root"), "MPSGraph", "graph")
    for pos in graph["mps_nodes"]:
        tag, body = fb.table(pos, "MPSNode", "node")["mpsnode_union"]
        if UNION_NAMES[tag] == op:
            (slot,) = [f.slot for f in reader._LAYOUTS[UNION_MEMBERS[op]] if f.name == field]
            vtable = body - struct.unpack_from("<i", fb.buf, body)[0]
            return HEADER_SIZE + body + struct.unpack_from("<H", fb.buf, vtable + 4 + 2 * slot)[0]
    raise AssertionError(f"no {op} node")


def test_run_of_a_program_the_device_aborts_on_is_one_line(tmp_path, capsys, monkeypatch):
    """A max-pool padding of 2**30 is refused by read_blob's static bound (inspect: malformed blob; run:
    one line naming it; it passed both and reached the device model). A program the device model refuses
    when it runs (here: a padded input beyond a small MPS_BACKEND_MAX_TENSOR_BYTES; DeviceError out of
    executorch's execute, was a traceback) is one line naming the MPS delegate, the node and the cause.
    A MemoryError (what std::bad_alloc becomes) is one line too."""
    import struct

    from mps_backend.export import export_model
    from mps_backend.serialization.pte import delegate_blobs

    model = torch.nn.Sequential(torch.nn.MaxPool2d(2, 2, padding=1)).eval()
    pte = bytes(export_model(model, [torch.randn(1, 1, 4, 4)], use_fp16=False).pte)
    blob = delegate_blobs(pte)[0].blob
    data = bytearray(pte)
    at = pte.index(blob) + _blob_field_offset(blob, "MPSMaxPool2DWithIndices", "padding_left")
    assert struct.unpack_from("<i", data, at) == (1,)
    struct.pack_into("<i", data, at, 2**30)
    path = tmp_path / "pool.pte"
    path.write_bytes(bytes(data))
    assert main(["inspect", str(path)]) == 2
    assert "malformed blob: node 0 (MPSMaxPool2DWithIndices): padding_left 1073741824 beyond" in capsys.readouterr().out
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("error: "))
    assert _one_line_error(err) and "malformed blob" in line and "padding_left 1073741824" in line, err
    path.write_bytes(pte)
    monkeypatch.setenv("MPS_BACKEND_MAX_TENSOR_BYTES", "64")  # the 1 x 1 x 6 x 6 float32 padded input: 144 bytes
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err), err
    line = next(line for line in err.splitlines() if line.startswith("error: "))
    assert "MPS delegate" in line and "MPSMaxPool2DWithIndices" in line and "padded to" in line, line

    import mps_backend.runtime

    def bad_alloc(*args, **kwargs):
        raise MemoryError("std::bad_alloc")

    monkeypatch.setattr(mps_backend.runtime, "run_pte", bad_alloc)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "out of memory (std::bad_alloc)" in err, err


def test_pooling_and_conv_parameters_are_bounded():
    """read_blob's static bounds (reader._check_window): every pooling and convolution a torch model
    exports passes them (ceil mode, the largest padding torch accepts, dilation, a conv padding beyond its
    kernel), and each out-of-bound field of the exported blob is refused, naming the node and field."""
    import struct

    from mps_backend.export import export_model
    from mps_backend.serialization import MPSFormatError, read_blob
    from mps_backend.serialization.pte import delegate_blobs

    class Windows(torch.nn.Module):
        def forward(self, x, w):
            f = torch.nn.functional
            return (
                f.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
                f.avg_pool2d(x, 3, 3, padding=1, ceil_mode=True, count_include_pad=True),
                f.max_pool2d(x, 2, 1, padding=1, dilation=2),
                f.avg_pool2d(x, 5, 4, padding=2, ceil_mode=True, count_include_pad=False),
                f.conv2d(x, w, padding=7, stride=2, dilation=2),
            )

    pte = export_model(Windows().eval(), [torch.randn(1, 2, 7, 9), torch.randn(3, 2, 2, 2)], use_fp16=False).pte
    (d,) = [d for d in delegate_blobs(bytes(pte)) if d.backend_id == "MPSBackend"]
    ops = [n.op for n in read_blob(d.blob).graph.nodes]
    assert {"MPSMaxPool2DWithIndices", "MPSAvgPool2D", "MPSConv2D"} <= set(ops), ops
    cases = [
        ("MPSMaxPool2DWithIndices", "padding_top", 7, "padding_top 7 beyond the window's span 3 times the stride 2"),
        ("MPSMaxPool2DWithIndices", "kernel_width", 0, "kernels must be at least 1"),
        ("MPSMaxPool2DWithIndices", "kernel_height", 40, "a window of span 40 on an axis of 7"),
        ("MPSAvgPool2D", "stride_width", 0, "strides, dilations and kernels must be at least 1"),
        ("MPSAvgPool2D", "padding_right", -1, "paddings at least 0"),
        ("MPSConv2D", "dilation_x", 0, "strides, dilations must be at least 1"),
        ("MPSConv2D", "padding_bottom", -3, "paddings at least 0"),
        ("MPSConv2D", "dilation_y", 100, "a window of span 101 on an axis of 7 padded by 7 + 7"),
    ]
    for op, field, value, message in cases:
        blob = bytearray(d.blob)
        struct.pack_into("<i", blob, _blob_field_offset(bytes(blob), op, field), value)
        with pytest.raises(MPSFormatError, match=re.escape(message)) as e:
            read_blob(bytes(blob))
        assert str(e.value).startswith("node ") and op in str(e.value)


def test_blob_value_sizes_are_bounded():
    """A value whose byte size overflows int64 (dims of 2**31-1 in five axes) is refused by read_blob
    (it passed, and the device model then failed in torch); one just within is left to the device model's
    per-tensor budget (a DeviceError). A host allocation failing inside a kernel is a DeviceError too."""
    import sys
    from pathlib import Path

    from mps_backend.runtime.core import DeviceError
    from mps_backend.runtime.interpreter import Interpreter
    from mps_backend.serialization import MPSFormatError, read_blob
    from mps_backend.serialization.model import DataType

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.runtime.helpers import GraphSpec

    def blob(dims):
        g = GraphSpec()
        x = g.value(DataType.float32, dims)
        g.graph.input_ids.append(x)
        o = g.value(DataType.float32, dims)
        g.node("MPSExp", input1_id=x, output_id=o)
        return g.output(o).to_bytes()

    for dims in ([2**31 - 1] * 5, [2**31 - 1, 2**31 - 1, 2**30]):
        with pytest.raises(MPSFormatError, match=r"not below 2\*\*63"):
            read_blob(blob(dims))
    near = blob([2**31 - 1, 2**30])  # 2**63 - 2**32 bytes: a valid blob the device model refuses
    read_blob(near)
    with pytest.raises(DeviceError, match="beyond the device model"):
        Interpreter(near)

    def no_memory(*args):
        raise MemoryError

    interp = Interpreter(blob([2]))
    interp._plan = [(i, node, no_memory) for i, node, _ in interp._plan]
    with pytest.raises(DeviceError, match="ran out of host memory"):
        interp.run([torch.ones(2)])


# ---------------------------------------------------------------- export: every program loads or is refused


def test_argsort_is_refused_for_the_target_runtime_or_named_at_load(tmp_path):
    """torch.argsort stays on CPU (the device has no sort) as aten::sort.values, which executorch 1.0's
    kernel libraries lack: export refuses it with the reason in both precisions (here as the warning of
    allow_missing_kernels). With the check skipped that way (or target_runtime=None, --target-runtime none)
    the program exports, and loading it names the missing kernel (it said "a delegate failed to initialise")."""
    from mps_backend.export import export_model
    from mps_backend.runtime import EmulatorError, run_pte
    from mps_backend.runtime_kernels import RuntimeCompatWarning

    class Argsort(torch.nn.Module):
        def forward(self, x):
            return torch.argsort(x, dim=-1)

    x = torch.randn(2, 8)
    for fp16 in (False, True):  # allow_missing_kernels: the refusal as a warning, and the program
        with pytest.warns(RuntimeCompatWarning, match=r"aten::sort\.values .*no kernel in executorch 1\.0"):
            result = export_model(Argsort().eval(), [x], use_fp16=fp16, allow_missing_kernels=True)
        assert "no MPS lowering for aten.sort.default" in str(result.report)
        with pytest.raises(EmulatorError, match=r"runs aten::sort\.values on CPU and this executorch runtime has no kernel"):
            run_pte(result.pte, [x])
    path = tmp_path / "argsort.pte"
    path.write_bytes(bytes(result.pte))
    assert main(["run", str(path)]) == 2


# ---------------------------------------------------------------- export outputs


def test_export_outputs_devices_fifos_symlinks_full_disk(tmp_path, capsys):
    """-o naming a FIFO (or a device: /dev/full was replaced, rc 0) is refused in one line before the
    export runs and is left as it was; a symlink is written through (the link stays, its target gets
    the program); a write failing with ENOSPC is one OSError line, leaves no .partial file and the old
    file intact."""
    import errno
    import os
    import stat

    from mps_backend.files import write_atomically

    fifo = tmp_path / "out.pte"
    os.mkfifo(fifo)
    for argv in (["export", "-o", str(fifo)], ["export", "--model", f"hf:{tmp_path}", "-o", str(fifo)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert _one_line_error(err) and "not a regular file" in err, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "link.pte").symlink_to(fifo)
    with pytest.raises(FileExistsError, match="a symlink to .*not a regular file"):
        write_atomically(tmp_path / "link.pte", lambda f: f.write(b"x"))

    target = tmp_path / "real" / "model.pte"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "link2.pte"
    link.symlink_to(target)
    assert write_atomically(link, lambda f: f.write(b"new program")) == len(b"new program")
    assert link.is_symlink() and target.read_bytes() == b"new program"

    def full_disk(f):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError) as e:
        write_atomically(target, full_disk)
    assert e.value.errno == errno.ENOSPC and "\n" not in str(e.value) and "nothing was replaced" in str(e.value)
    assert target.read_bytes() == b"new program"
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.pte"]  # no .partial left


# ---------------------------------------------------------------- a checkpoint changed during an export


@pytest.mark.parametrize("change", ["zeros in place", "truncated"])
def test_checkpoint_changed_while_an_export_maps_it(tmp_path, monkeypatch, capsys, change):
    """An fp16 checkpoint overwritten in place (the export succeeded, with unknown weights) or truncated
    (SIGBUS when the mapped weights are copied) after the export began: one CheckpointError line naming
    the file, before the weights are copied, and no .pte. (Size, mtime, ctime and inode of each weight
    file are compared before the copy and again before the write.)"""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from llm_helpers import save_checkpoint

    folder = save_checkpoint(tmp_path / "ck", "llama", dtype=torch.float16, layers=1)
    weights = folder / "model.safetensors"
    real_export = torch.export.export

    def export_then_change(*args, **kwargs):
        ep = real_export(*args, **kwargs)
        size = weights.stat().st_size
        with open(weights, "r+b") as f:  # in place: the mapping sees it
            if change == "truncated":
                f.truncate(size // 2)
            else:
                f.seek(size // 2)
                f.write(bytes(size - size // 2))
        return ep

    monkeypatch.setattr(torch.export, "export", export_then_change)
    out = tmp_path / "lm.pte"
    assert main(["export", "--model", f"hf:{folder}", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err), err
    assert f"{weights} was {'truncated' if change == 'truncated' else 'rewritten in place'}" in err, err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["ck"]
