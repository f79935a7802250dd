"""Hostile inputs, round 4 (#38): no code from a checkpoint folder or the Hub ever runs, no checkpoint file
is ever overwritten, no export reports work it did not do. Each test is one way in or one class of input:
a one-line typed error (exit 2, nothing written) or a correct result, never a traceback."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from mps_backend.errors import CheckpointError
from mps_backend.tools.cli import main

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from llm_helpers import save_checkpoint  # noqa: E402


def _one_line_error(err: str) -> bool:
    return "Traceback" not in err and len([line for line in err.splitlines() if line.startswith("error: ")]) == 1


def _error_line(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("error: "))


# ---------------------------------------------------------------- 1. no code from a folder or the Hub runs

#: the folder's Python: importing it writes the marker file named by $EVIL_MARKER
EVIL_CODE = """import os, pathlib
pathlib.Path(os.environ["EVIL_MARKER"]).write_text("the checkpoint folder's code ran")
from transformers import LlamaConfig, LlamaForCausalLM
class EvilConfig(LlamaConfig):
    model_type = "{model_type}"
class EvilForCausalLM(LlamaForCausalLM):
    config_class = EvilConfig
"""


def _evil(folder: pathlib.Path, model_type: str) -> pathlib.Path:
    """A tiny llama checkpoint whose config.json names custom code in the folder (auto_map)."""
    save_checkpoint(folder, "llama", layers=1)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
    }
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (folder / name).write_text(EVIL_CODE.format(model_type=model_type))
    return folder


def _modules(cache: pathlib.Path) -> list[str]:
    """Python files in a Hugging Face modules cache (where transformers copies the code it runs)."""
    return sorted(p.name for p in cache.rglob("*.py") if p.name != "__init__.py") if cache.exists() else []


def test_folder_code_never_runs_whatever_stdin_says(tmp_path):
    """`yes | mps-backend export` of a folder whose config.json has an unknown model_type and an auto_map naming
    its configuration_evil.py: transformers asked "run the custom code? [y/N]", read the `y` and ran the file.
    Now one line naming auto_map, exit 2, no marker, nothing in the modules cache, no .pte. The control: the same
    folder through transformers with trust_remote_code=True does run the file (the fixture is a real attack)."""
    folder = _evil(tmp_path / "ck", "evilmodel")
    marker, out = tmp_path / "ran", tmp_path / "x.pte"
    env = dict(os.environ, EVIL_MARKER=str(marker), HF_HOME=str(tmp_path / "hf"), HF_MODULES_CACHE=str(tmp_path / "modules"))
    exe = pathlib.Path(sys.executable).parent / "mps-backend"
    proc = subprocess.run(
        [str(exe), "export", "--model", f"hf:{folder}", "-o", str(out)],
        input=b"y\n" * 10000,
        capture_output=True,
        env=env,
        timeout=600,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2 and _one_line_error(err), err
    assert "auto_map" in _error_line(err) and "evilmodel" in _error_line(err), err
    assert not marker.exists() and _modules(tmp_path / "modules") == [] and not out.exists()
    assert not (tmp_path / "hf").exists() or _modules(tmp_path / "hf") == []

    control = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import transformers; transformers.AutoConfig.from_pretrained({str(folder)!r}, trust_remote_code=True)",
        ],
        capture_output=True,
        env=env,
        timeout=600,
    )
    assert control.returncode == 0, control.stderr.decode()[-2000:]
    assert marker.exists() and "configuration_evil.py" in _modules(tmp_path / "modules")


def test_auto_map_beside_a_shipped_model_type_is_ignored(tmp_path, monkeypatch, capsys):
    """An auto_map beside a model type transformers ships (Phi-3's hub configs carry one): the export and its
    self-check's reload use transformers' own code with trust_remote_code=False, whatever standard input holds;
    the folder's files are never imported (no marker, nothing in the modules cache) and the summary says so."""
    import io

    import transformers.dynamic_module_utils as dynamic

    folder = _evil(tmp_path / "ck", "llama")
    marker = tmp_path / "ran"
    monkeypatch.setenv("EVIL_MARKER", str(marker))
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # read once, at import
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10000))
    out = tmp_path / "x.pte"
    assert main(["export", "--model", f"hf:{folder}", "-o", str(out), "--verify-steps", "2", "--fp32"]) == 0
    captured = capsys.readouterr()
    assert "auto_map ignored: transformers' own llama code is used" in captured.out, captured.out
    assert "verify" in captured.out and "ok" in captured.out
    assert out.is_file() and not marker.exists() and _modules(tmp_path / "modules") == []


def test_self_check_reload_never_runs_folder_code(tmp_path, monkeypatch):
    """The self-check's reload was a second way in (transformers' AutoModelForCausalLM on the folder): it now
    goes through the export's loader and its folder check. A folder turned hostile after the export: the
    reload refuses it in one line naming auto_map, nothing runs."""
    from mps_backend.llm.folder_check import FolderError
    from mps_backend.llm.verify import verify_llm

    folder = save_checkpoint(tmp_path / "ck", "llama", layers=1)
    out = tmp_path / "x.pte"
    assert main(["export", "--model", f"hf:{folder}", "-o", str(out), "--no-verify", "--fp32"]) == 0
    _evil(folder, "evilmodel")
    marker = tmp_path / "ran"
    monkeypatch.setenv("EVIL_MARKER", str(marker))
    with pytest.raises(FolderError, match="auto_map names custom code") as e:
        verify_llm(out, f"hf:{folder}", dtype="fp32", steps=1)
    assert "\n" not in str(e.value) and not marker.exists()


@pytest.mark.parametrize(
    "key, value, where",
    [
        ("_attn_implementation", "kernels-community/flash-attn", None),
        ("attn_implementation", "flash_attention_2", None),
        ("_attn_implementation", {"": "eager", "text_config": "kernels-community/vllm-flash-attn3"}, None),
        ("experts_implementation", "kernels-community/moe", None),
        ("_experts_implementation", "megablocks", None),
        ("_attn_implementation", "kernels-community/flash-attn", "text_config"),
    ],
)
def test_attention_implementations_are_the_shipped_ones(tmp_path, capsys, key, value, where):
    """An attention or experts implementation naming a Hub kernel (it would be fetched and run if the
    `kernels` package were installed; the self-check's reload ended in an ImportError traceback) or a package
    the project does not ship: one line naming the key, exit 2, nothing written. eager and sdpa pass."""
    from mps_backend.llm.folder_check import FolderError, check_code_free

    config = {"model_type": "llama", "num_hidden_layers": 1}
    if where:
        config[where] = {key: value}
    else:
        config[key] = value
    with pytest.raises(FolderError, match=f"{key} .* is not one of"):
        check_code_free(config, "config.json")
    for ok in ("eager", "sdpa", None):
        check_code_free({"model_type": "llama", "_attn_implementation": ok, "text_config": {"attn_implementation": ok}}, "c")
    if where is None and isinstance(value, str) and key == "_attn_implementation":
        folder = save_checkpoint(tmp_path / "ck", "llama", layers=1)
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, key: value}))
        out = tmp_path / "x.pte"
        assert main(["export", "--model", f"hf:{folder}", "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert _one_line_error(err) and key in _error_line(err) and value in _error_line(err), err
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_every_transformers_load_passes_trust_remote_code_false():
    """Source check of the contract: each transformers ``from_pretrained`` call of the package passes
    ``trust_remote_code=False`` (a new call without it would let transformers prompt on standard input)."""
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "mps_backend"
    calls = 0
    for path in root.rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"\.from_pretrained,?\s*\(?", text):
            end = text.find("\n\n", m.end())
            call = text[m.start() : end if end > 0 else None]
            calls += 1
            assert "trust_remote_code=False" in call, f"{path}: {call[:200]}"
    assert calls >= 2


# ---------------------------------------------------------------- 2. no file the export reads is overwritten


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 1-layer float32 llama checkpoint (with tokenizer and generation config), read-only for the tests."""
    return save_checkpoint(tmp_path_factory.mktemp("tiny") / "ck", "llama", layers=1)


def test_output_is_never_a_file_the_export_reads(tiny, tmp_path, capsys):
    """-o naming the weights, the config, the tokenizer, the generation config or the shard index (directly,
    through `..`, through a symlink, or a hard link) was replaced by the .pte (only -o FOLDER was refused):
    each is one line naming the file, exit 2, before anything is loaded, and every file is unchanged. A new
    file in the checkpoint folder is allowed. llama: its checkpoint, params.json and tokenizer likewise."""
    import shutil

    folder = tmp_path / "ck"
    shutil.copytree(tiny, folder)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.embed_tokens.weight": "model.safetensors"}})
    )
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    (tmp_path / "link.pte").symlink_to(folder / "model.safetensors")
    os.link(folder / "config.json", tmp_path / "hard.pte")
    outs = [
        *(folder / name for name in sorted(before)),
        tmp_path / "sub" / ".." / "ck" / "tokenizer.json",
        tmp_path / "link.pte",
        tmp_path / "hard.pte",
        folder,
    ]
    (tmp_path / "sub").mkdir()
    for out in outs:
        assert main(["export", "--model", f"hf:{folder}", "-o", str(out)]) == 2, out
        err = capsys.readouterr().err
        assert _one_line_error(err), err
        line = _error_line(err)
        assert "a file the export reads" in line or "is a directory" in line or "is the input checkpoint" in line, line
        assert "[load checkpoint]" not in err, err  # refused before the checkpoint is read
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "hard.pte", "link.pte", "sub"]

    from mps_backend.llm.guards import check_output_is_not_an_input

    check_output_is_not_an_input(folder / "model.pte", "hf", str(folder))  # a new file beside the weights: fine
    ckpt, params = tmp_path / "consolidated.00.pth", tmp_path / "params.json"
    for f in (ckpt, params, tmp_path / "tokenizer.model"):
        f.write_bytes(b"x")
    for out in (ckpt, params, tmp_path / "tokenizer.model"):
        with pytest.raises(CheckpointError, match="a file the export reads|is the input checkpoint"):
            check_output_is_not_an_input(out, "llama", str(ckpt), str(params))
    other = tmp_path / "p2.json"
    other.write_text("{}")
    with pytest.raises(CheckpointError, match="a file the export reads"):
        check_output_is_not_an_input(other, "llama", str(ckpt), str(other))


# ---------------------------------------------------------------- 3. weights only from the named files


def _zeros_safetensors(path: pathlib.Path, names_shapes: dict, dtype=torch.float32) -> None:
    from safetensors.torch import save_file

    save_file({n: torch.zeros(s, dtype=dtype) for n, s in names_shapes.items()}, str(path))


def test_weights_come_only_from_the_named_files(tiny, tmp_path, capsys):
    """A second *.safetensors holding a zeroed lm_head.weight replaced the real head (every file was read,
    the last won, the index was ignored: every logit 0, rc 0). Now: beside an index that does not name it, or
    as a second file without an index, one line naming it; an index placing a tensor in another shard, or
    naming one its shard lacks, too. Exit 2, nothing written."""
    import shutil

    from safetensors import safe_open

    from mps_backend.llm.folder_check import FolderError, check_folder, weight_files

    with safe_open(str(tiny / "model.safetensors"), framework="pt") as st:
        names = list(st.keys())
        head = list(st.get_slice("lm_head.weight").get_shape())
    index = {"weight_map": dict.fromkeys(names, "model.safetensors")}
    cases = {
        "a weights file model.safetensors.index.json does not name": (index, "extra.safetensors", {"lm_head.weight": head}),
        "2 weights files": (None, "extra.safetensors", {"lm_head.weight": head}),
        "which model.safetensors.index.json places in 'model-2.safetensors'": (
            {"weight_map": {**index["weight_map"], "lm_head.weight": "model-2.safetensors"}},
            "model-2.safetensors",
            {"lm_head.weight": head},  # and the one in model.safetensors
        ),
        "has no tensor 'lm_head.bias'": ({"weight_map": {**index["weight_map"], "lm_head.bias": "model.safetensors"}}, None, {}),
    }
    for i, (message, (idx, extra, tensors)) in enumerate(cases.items()):
        folder = tmp_path / f"c{i}"
        shutil.copytree(tiny, folder)
        if idx is not None:
            (folder / "model.safetensors.index.json").write_text(json.dumps(idx))
        if extra:
            _zeros_safetensors(folder / extra, tensors)
        with pytest.raises(FolderError, match=re.escape(message)):
            check_folder(folder)
        out = tmp_path / f"c{i}.pte"
        assert main(["export", "--model", f"hf:{folder}", "-o", str(out), "--no-verify"]) == 2
        err = capsys.readouterr().err
        assert _one_line_error(err) and message in _error_line(err), err
        assert not out.exists()
    assert weight_files(tiny) == [tiny / "model.safetensors"]


def test_self_check_loads_the_tensors_the_export_used(tiny, tmp_path, capsys):
    """The self-check reloaded through transformers' own file choice: with the weights in weights.safetensors
    and a pytorch_model.bin of zeros beside them (or a symlink out of the folder), its reference was the
    .bin, and the check failed after the .pte was written. It now reads what the export read (the one
    .safetensors) and passes; the .bin is never opened."""
    import shutil

    folder = tmp_path / "ck"
    shutil.copytree(tiny, folder)
    (folder / "model.safetensors").rename(folder / "weights.safetensors")
    from safetensors.torch import load_file

    torch.save(
        {k: torch.zeros_like(v) for k, v in load_file(str(folder / "weights.safetensors")).items()}, tmp_path / "zeros.bin"
    )
    (folder / "pytorch_model.bin").symlink_to(tmp_path / "zeros.bin")
    out = tmp_path / "x.pte"
    assert main(["export", "--model", f"hf:{folder}", "-o", str(out), "--verify-steps", "3", "--fp32"]) == 0
    text = capsys.readouterr().out
    assert "greedy tokens agree 3/3: ok" in text, text


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--quantize", "int4", "--group-size", "7"],
            "would quantize none of the 8 linear layers: the group size 7 divides none",
        ),
        (["--quantize", "int8", "--group-size", "7"], "would quantize none of the 8 linear layers"),
        (["--quantize", "int4", "--group-size", "48"], "would quantize none"),
        (["--quantize", "int4", "--group-size", str(10**9)], "--group-size 1000000000: give 0"),
        (["--quantize", "int4", "--group-size", "-1"], "--group-size -1: give 0"),
        (["--group-size", "32"], "--group-size 32 applies to --quantize"),
        (["--allow-requantize"], "--allow-requantize applies to --quantize"),
    ],
)
def test_a_quantization_that_quantizes_nothing_is_an_error(tiny, tmp_path, capsys, args, message):
    """--quantize int4 --group-size 7 (or 10^9; int8 too) quantized no layer, and the summary said int4, rc 0;
    --group-size -1 was a traceback. Each is one line, exit 2, nothing written."""
    out = tmp_path / "x.pte"
    assert main(["export", "--model", f"hf:{tiny}", "-o", str(out), "--no-verify", *args]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and message in _error_line(err), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_partial_quantization_says_how_many(tiny, tmp_path, capsys):
    """A group size only some layers take: every layer is quantized all the same (issue #43: before,
    the others stayed float), those it does not divide at a smaller group, and the summary says so."""
    out = tmp_path / "x.pte"
    assert (
        main(["export", "--model", f"hf:{tiny}", "-o", str(out), "--no-verify", "--quantize", "int8", "--group-size", "128"]) == 0
    )
    text = capsys.readouterr().out
    assert "note             quantized 7 of 8 linear layers (int8, group 128, asymmetric" in text, text
    assert "; 6 with in_features 64 at group 64; output head int8 groups of 32, symmetric" in text, text


@pytest.mark.parametrize(
    "dtype, message",
    [("BOOL", "dtype BOOL is not floating point"), ("I8", "dtype I8 is not floating point"), ("U8", "is not floating point")],
)
def test_weights_that_are_not_floats_are_refused(tiny, tmp_path, capsys, dtype, message):
    """A checkpoint with BOOL weights exported to all-zero logits (rc 0): weights of a non-float dtype are one
    line naming the tensor."""
    import math
    import shutil

    folder = tmp_path / "ck"
    shutil.copytree(tiny, folder)
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as st:
        shapes = {k: list(st.get_slice(k).get_shape()) for k in st.keys()}
    header, at = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape) * (1 if name == "model.norm.weight" else 4)
        header[name] = {"dtype": dtype if name == "model.norm.weight" else "F32", "shape": shape, "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(at))
    out = tmp_path / "x.pte"
    assert main(["export", "--model", f"hf:{folder}", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and message in _error_line(err) and "model.norm.weight" in _error_line(err), err
    assert not out.exists()


@pytest.mark.parametrize("method", ["nope", "fp8", "bitsandbytes", None])
def test_quantization_config_is_refused(tiny, tmp_path, capsys, method):
    """A quantization_config of an unknown method was ignored (fp8: exported as if float): any method is one
    line naming it (pre-quantized checkpoints are not exported), in a sub-config too."""
    import shutil

    folder = tmp_path / "ck"
    shutil.copytree(tiny, folder)
    config = json.loads((folder / "config.json").read_text())
    q = {"quant_method": method} if method else "x"
    if method == "bitsandbytes":
        config["text_config"] = {"quantization_config": q}
    else:
        config["quantization_config"] = q
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "x.pte"
    assert main(["export", "--model", f"hf:{folder}", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "quantization_config of method" in _error_line(err), err
    assert str(method or "x") in _error_line(err) and not out.exists()


# ---------------------------------------------------------------- 5. declared sizes bounded before allocation


def _declaring(folder: pathlib.Path, stored: dict[str, list[int]], **config) -> pathlib.Path:
    """A folder whose config declares ``config`` (a llama) and whose one weights file holds ``stored`` (zeros)."""
    import math

    folder.mkdir(parents=True)
    base = dict(model_type="llama", num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096)
    (folder / "config.json").write_text(json.dumps({**base, **config}))
    header, at = {}, 0
    for name, shape in stored.items():
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [at, at + 2 * math.prod(shape)]}
        at += 2 * math.prod(shape)
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(at))
    return folder


def test_declared_sizes_are_bounded_by_what_is_stored(tmp_path):
    """A 16 KB folder declaring 1024 layers of hidden 4096 with one stored tensor ran until the memory cap
    killed it (transformers built every missing weight before the "no weights for" check); so did one
    declaring an MLP of 2^18 x 2^14 beside small tensors. Each is one line from the safetensors headers
    (the layers) or a meta-device build (the declared values), exit 2, in a process whose address space is
    capped at 6 GiB (a regression fails there, not on the machine)."""
    import resource
    import time

    layers = _declaring(
        tmp_path / "layers",
        {"model.layers.0.input_layernorm.weight": [4096]},
        num_hidden_layers=1024,
        hidden_size=4096,
        intermediate_size=14336,
        vocab_size=128256,
    )
    wide = _declaring(
        tmp_path / "wide",
        {"model.layers.0.input_layernorm.weight": [1 << 14]},
        num_hidden_layers=1,
        hidden_size=1 << 14,
        intermediate_size=1 << 18,
        vocab_size=16,
    )
    assert sum(f.stat().st_size for f in layers.iterdir()) < 16 << 10

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    code = (
        "import sys; from mps_backend.tools.cli import main; "
        f"sys.exit(10 * main(['export', '--model', 'hf:{layers}', '-o', '{tmp_path / 'a.pte'}']) "
        f"+ main(['export', '--model', 'hf:{wide}', '-o', '{tmp_path / 'b.pte'}']))"
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=cap, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 22 and "Traceback" not in proc.stderr and len(errors) == 2, proc.stderr[-3000:]
    assert "config.json declares 1024 layers, the weights files hold tensors of 1: no weights for layers 1-1023" in errors[0]
    assert "the config declares 13,556,563,968 weight values, the weights files hold 16,384" in errors[1], errors
    assert time.monotonic() - start < 300 and sorted(p.name for p in tmp_path.iterdir()) == ["layers", "wide"]


def test_declared_weights_check_passes_real_checkpoints(tiny, tmp_path):
    """The meta-device count takes tied weights once (a tied head is not stored) and passes every tested
    architecture's checkpoint; one stored tensor short is refused naming it."""
    import shutil

    from mps_backend.llm.checkpoint import load_hf
    from mps_backend.llm.folder_check import FolderError

    tied = save_checkpoint(tmp_path / "tied", "smollm", layers=1)
    assert load_hf(tied, torch.float32).model.lm_head.weight is not None
    folder = tmp_path / "short"
    shutil.copytree(tiny, folder)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.0.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(FolderError, match=r"the weights files hold .*: no weights for model\.layers\.0\.mlp\.up_proj\.weight$"):
        load_hf(folder, torch.float32)


# ---------------------------------------------------------------- 4. token ids never wrap


@pytest.mark.parametrize(
    "index, message",
    [
        (2**32 - 1, "index 4294967295 does not fit int32: the device's cast to int32 would read index -1"),
        (2**32 + 5, "index 4294967301 does not fit int32: the device's cast to int32 would read index 5"),
        (-(2**40), "does not fit int32"),
        (-1, "index -1 out of range [0, 6)"),
        (6, "index 6 out of range [0, 6)"),
    ],
)
@pytest.mark.parametrize("op", ["MPSEmbedding", "MPSIndexSelect"])
def test_device_model_gather_refuses_out_of_range_ids(op, index, message):
    """The emulated embedding truncated int64 ids to int32 and wrapped negatives (2^32-1 and -1 read the last
    row, 2^32+5 row 5): an id outside [0, V) (before or after the device's int32 cast) is a DeviceError naming
    the node and the value, never another row; ids in range read their rows."""
    from mps_backend.runtime.core import DeviceError
    from tests.runtime.helpers import run_graph

    w = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    kw = (
        dict(out_dims=[2, 4], padding_idx=-1, scale_grad_by_freq=False, sparse=False)
        if op == "MPSEmbedding"
        else dict(out_dims=[2, 4], dim=0, index_id=1)
    )
    ok = torch.tensor([5, 0], dtype=torch.int64)
    assert torch.equal(run_graph(op, [w, ok], **kw), w[ok])
    with pytest.raises(DeviceError, match=re.escape(message)) as e:
        run_graph(op, [w, torch.tensor([1, index], dtype=torch.int64)], **kw)
    assert op in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def tiny_pte(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("pte") / "tiny.pte"
    from mps_backend.llm import export_llm

    export_llm(f"hf:{tiny}", out, prefill_chunk=1, dtype="fp32", max_seq_len=16)
    return out


def test_token_ids_are_checked_before_the_program(tiny, tiny_pte, tmp_path, capsys):
    """generate_ids / iter_tokens with an id outside the vocabulary (2^32-1, -1, 2^32+5, the vocabulary size)
    is one ValueError before the program runs; the program itself, given such an id through the runtime,
    fails in the device model's gather (DeviceError), never reads another row. The CLI's run with such an
    input is one line, exit 2."""
    import numpy as np

    from mps_backend.llm import generate_ids
    from mps_backend.runtime import LoadedMethod
    from mps_backend.runtime.core import DeviceError

    vocab = json.loads((tiny / "config.json").read_text())["vocab_size"]
    for bad in (2**32 - 1, -1, 2**32 + 5, vocab):
        with pytest.raises(ValueError, match=re.escape(f"prompt token id {bad} is not in the model's vocabulary [0, {vocab})")):
            generate_ids(tiny_pte, [3, bad], 2)
    assert len(generate_ids(tiny_pte, [3, vocab - 1], 2)) == 2
    step = LoadedMethod(tiny_pte, "forward")
    for bad, why in ((2**32 - 1, "would read index -1"), (-1, "index -1 out of range"), (2**32 + 5, "would read index 5")):
        with pytest.raises(DeviceError, match=f"MPSEmbedding.*{why}"):
            step([torch.tensor([[bad]], dtype=torch.long), torch.tensor([0], dtype=torch.long)])
    inputs = tmp_path / "in.npz"
    np.savez(inputs, input_0=np.array([[2**32 + 5]], dtype=np.int64), input_1=np.array([0], dtype=np.int64))
    assert main(["run", str(tiny_pte), "--inputs", str(inputs)]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "does not fit int32" in _error_line(err), err


# ---------------------------------------------------------------- 6. the two bundled programs that crashed run

HOSTILE = pathlib.Path(__file__).resolve().parent / "fixtures" / "hostile"


@pytest.mark.parametrize(
    "name, message",
    [
        ("demo_fp32_inner_one_byte_segv.bpte", "constant_segment: SubsegmentOffsets table at offset 2332033108"),
        ("tc_no_inputs.bpte", "method 'forward' test case 0: 0 inputs and 1 expected outputs, the method takes 1 inputs"),
    ],
)
def test_bundled_programs_that_crashed_run_are_refused(name, message, tmp_path, capsys):
    """Both ended `mps-backend run` with SIGSEGV: one flipped byte of the inner program's constant_segment
    offset (the program check did not read that table; executorch's bundled loader follows it unchecked),
    and a test case with an empty inputs vector (executorch's bundled check executed the method with its input
    unset). `run` (bundled check and --random), `inspect`, `run_pte` and `verify_bundled`: one line each. The
    program checked in a child process first: a regression is a failed assertion, not a dead test run."""
    from mps_backend.runtime import run_pte, verify_bundled
    from mps_backend.runtime.program_check import ProgramFormatError

    path = HOSTILE / name
    code = f"import sys; from mps_backend.tools.cli import main; sys.exit(main(['run', {str(path)!r}]))"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert child.returncode == 2 and message in child.stderr, (child.returncode, child.stderr[-2000:])
    for argv in (["run", str(path)], ["run", str(path), "--random"], ["inspect", str(path)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert _one_line_error(err) and message in _error_line(err) and str(path) in _error_line(err), (argv, err)
    with pytest.raises(ProgramFormatError, match=re.escape(message)):
        verify_bundled(path)
    with pytest.raises(ProgramFormatError):
        run_pte(path, [torch.zeros(1, 3, 32, 32)])  # a bundled program is not a .pte
    from mps_backend.runtime.bundled_check import read_bundled

    inner = tmp_path / "inner.pte"
    inner.write_bytes(bytes(read_bundled(path.read_bytes(), ProgramFormatError)[0]))
    if "constant_segment" in message:
        with pytest.raises(ProgramFormatError, match=re.escape(message)):
            run_pte(inner, [torch.zeros(1, 3, 32, 32)])
    else:  # its program is sound: it runs
        assert run_pte(inner, [torch.zeros(1, 3, 32, 32)])[0].shape == (1, 10)


# ---------------------------------------------------------------- 6. one line, nothing written, no leftovers


def test_verify_steps_are_refused_before_anything_is_written(tiny, tmp_path, capsys):
    """--verify-steps -1 and 10^9 were refused only after the .pte was written: -1 before the checkpoint is
    read, a count beyond the KV-cache length once that is known; nothing is written either way."""
    out = tmp_path / "x.pte"
    assert main(["export", "--model", f"hf:{tiny}", "-o", str(out), "--verify-steps", "-1"]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "--verify-steps -1: give a count of 0" in err and "[load checkpoint]" not in err, err
    argv = ["export", "--model", f"hf:{tiny}", "-o", str(out), "--verify-steps", str(10**9), "--max-seq-len", "16"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "--verify-steps 1000000000 exceeds the KV-cache length 16" in err, err
    assert "[torch.export]" not in err and sorted(p.name for p in tmp_path.iterdir()) == []


def test_stale_scratch_folders_of_dead_exports_are_removed(tiny, tmp_path):
    """A SIGKILLed export left its empty .NAME.pte.scratch.* folder and no later export removed it: scratch
    folders now carry the export's process id, and the next export beside them removes those whose process
    is gone (a live export's, and any other folder, are left)."""
    from mps_backend.llm import export_llm
    from mps_backend.llm.guards import scratch_prefix

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    out = tmp_path / "x.pte"
    stale = tmp_path / f".x.pte.scratch.{dead_pid}.abc123"
    live = tmp_path / (scratch_prefix(out) + "def456")
    other = tmp_path / ".x.pte.scratch.notapid"
    for d in (stale, live, other):
        d.mkdir()
    (stale / "weight.bin").write_bytes(b"x")
    export_llm(f"hf:{tiny}", out, prefill_chunk=1, dtype="fp32", max_seq_len=16)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, "x.pte"])


def test_a_full_scratch_disk_is_named_as_such(tmp_path, monkeypatch, capsys):
    """A full output disk while the converted weights went to the scratch folder was reported as "transformers
    cannot load this llama checkpoint: No space left": now one line naming the disk as full, exit 2, and
    nothing left (no .pte, no scratch folder). (A real 64 KiB tmpfs gives the same line.)"""
    import errno

    from mps_backend import pages

    folder = save_checkpoint(tmp_path / "ck", "llama", dtype=torch.bfloat16, layers=1)
    real_init = pages.ScratchFile.__init__

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            self.f.close()

    def full_init(self, folder, name):
        real_init(self, folder, name)
        self._file = Full(self._file)

    monkeypatch.setattr(pages.ScratchFile, "__init__", full_init)
    out = tmp_path / "out" / "x.pte"
    out.parent.mkdir()
    assert main(["export", "--model", f"hf:{folder}", "-o", str(out), "--fp16"]) == 2
    err = capsys.readouterr().err
    line = _error_line(err)
    assert _one_line_error(err) and f"the disk of {out.parent}" in line and "is full (No space left on device)" in line, err
    assert "transformers cannot load" not in err and list(out.parent.iterdir()) == []


def test_sigint_is_one_line_and_leaves_nothing(tiny, tmp_path):
    """SIGINT during an export was a KeyboardInterrupt traceback: one line, exit 130, no .pte, no partial or
    scratch files."""
    import signal
    import time

    out = tmp_path / "out" / "x.pte"
    out.parent.mkdir()
    exe = pathlib.Path(sys.executable).parent / "mps-backend"
    proc = subprocess.Popen(
        [str(exe), "export", "--model", f"hf:{tiny}", "-o", str(out), "--no-verify"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        # an xdist worker ignores SIGINT and a child inherits that (Python then installs no handler): a
        # terminal's process gets SIGINT's default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    seen = []
    deadline = time.monotonic() + 600
    for line in proc.stderr:  # progress lines: interrupt once the export is past loading
        seen.append(line)
        if "[torch.export]" in line or "[lower to MPS]" in line or time.monotonic() > deadline:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    proc.wait(timeout=600)
    err = "".join(seen) + rest
    assert proc.returncode == 130 and _one_line_error(err) and "interrupted (SIGINT)" in _error_line(err), err[-3000:]
    assert list(out.parent.iterdir()) == []


def test_generation_config_and_tokenizers_that_broke_are_one_line(tiny, tiny_pte, tmp_path, capfd):
    """A generation_config.json with an unknown cache_implementation was a traceback in the self-check's
    reload (it no longer reads transformers' generation config: the export passes); a tokenizer whose empty
    Replace regex makes the tokenizers library panic (a BaseException) was a traceback in generate, and one
    executorch's runner cannot load (its C++ tokenizers) a RuntimeError traceback: one line each, exit 2."""
    import shutil

    folder = tmp_path / "ck"
    shutil.copytree(tiny, folder)
    gen = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**gen, "cache_implementation": "kernels-community/evil"}))
    assert main(["export", "--model", f"hf:{folder}", "-o", str(tmp_path / "g.pte"), "--verify-steps", "1"]) == 0
    capfd.readouterr()

    tok = json.loads((tiny / "tokenizer.json").read_text())
    panics = tmp_path / "panic.json"
    panics.write_text(json.dumps({**tok, "normalizer": {"type": "Replace", "pattern": {"Regex": ""}, "content": "ab"}}))
    lookbehind = tmp_path / "lookbehind.json"
    split = {"type": "Split", "pattern": {"Regex": "(?<=a+)b"}, "behavior": "Isolated", "invert": False}
    lookbehind.write_text(json.dumps({**tok, "pre_tokenizer": split}))
    cases = [
        (panics, "python", "the tokenizer panicked when asked to encode (index out of bounds"),
        (panics, "executorch", "the tokenizer panicked when asked to encode"),
        (lookbehind, "executorch", "executorch's TextLLMRunner could not start: Failed to load tokenizer"),
    ]
    for path, runner, message in cases:
        argv = ["generate", str(tiny_pte), "--tokenizer", str(path), "--prompt", "hello", "--max-new-tokens", "2"]
        assert main([*argv, "--runner", runner]) == 2, (path, runner)
        err = capfd.readouterr().err
        assert _one_line_error(err) and message in _error_line(err), (runner, err)
        assert "panicked at" not in err  # Rust's own report of the panic is not passed on
