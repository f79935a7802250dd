"""The command line ends bad input in one line and an exit status, never a traceback, and writes
exactly the files it names."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from mps_backend.tools.cli import main


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("err") / "demo.pte"
    assert main(["export", "--fp32", "-o", str(out)]) == 0
    return out


def test_run_out_writes_exactly_the_named_file(demo, tmp_path, capsys):
    out = tmp_path / "result.pte"  # not .npz: np.savez alone would write result.pte.npz
    assert main(["run", str(demo), "--out", str(out)]) == 0
    assert out.is_file() and not (tmp_path / "result.pte.npz").exists()
    assert f"wrote {out}" in capsys.readouterr().out
    with np.load(out) as npz:
        assert npz.files == ["output_0"]


@pytest.mark.parametrize("content", [b"not a zip at all", b"PK\x03\x04broken"])
def test_run_with_a_bad_inputs_file_is_one_line(demo, tmp_path, capsys, content):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(content)
    assert main(["run", str(demo), "--inputs", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_run_with_wrong_inputs_is_one_line(demo, tmp_path, capsys):
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, input_0=np.zeros((2, 2), dtype=np.float32))
    assert main(["run", str(demo), "--inputs", str(wrong)]) == 2
    assert "must have shape" in capsys.readouterr().err


@pytest.mark.parametrize("keep", [100, 2000])
def test_run_of_a_truncated_program_is_one_line(demo, tmp_path, capsys, keep):
    cut = tmp_path / "cut.pte"
    cut.write_bytes(demo.read_bytes()[:keep])
    assert main(["run", str(cut)]) == 2
    err = capsys.readouterr().err  # executorch's own log line may come first
    assert "\nerror: " in "\n" + err and "Traceback" not in err


def test_export_output_checks(demo, tmp_path, capsys):
    with pytest.raises(SystemExit, match="unknown torchvision model 'nonexistent'"):
        main(["export", "-m", "torchvision:nonexistent", "-o", str(tmp_path / "x.pte")])
    assert main(["export", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    script = tmp_path / "model.py"
    shutil.copy(__import__("mps_backend.tools.demo", fromlist=["x"]).__file__, script)
    before = script.read_bytes()
    assert main(["export", "-m", f"{script}:demo_model", "-o", str(script)]) == 2
    assert "is the input model" in capsys.readouterr().err and script.read_bytes() == before


def test_export_replaces_a_file_only_when_complete(demo, tmp_path):
    target = tmp_path / "keep.pte"
    target.write_bytes(b"old")
    assert main(["export", "--fp32", "-o", str(target)]) == 0
    assert target.read_bytes()[4:8] == b"ET12"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.pte"]  # no temporary left behind


@pytest.mark.parametrize("flag", ["--etdump", "--out", "--debug-buffer"])
def test_run_output_that_is_a_directory_or_device_is_one_line(demo, tmp_path, capsys, flag):
    """#26: `run --etdump DIR` ended in a traceback; a directory, a device or a missing folder is refused
    before the program runs, and nothing is written."""
    extra = ["--etdump", str(tmp_path / "t.etdp")] if flag == "--debug-buffer" else []
    for target, why in (
        (tmp_path, "is a directory"),
        ("/dev/null", "not a regular file"),
        (tmp_path / "no" / "f", "does not exist"),
    ):
        assert main(["run", str(demo), *extra, flag, str(target)]) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "t.etdp").exists()


def test_generate_on_a_non_llm_program_or_a_garbage_tokenizer_is_one_line(demo, tmp_path, capsys):
    """#26: `generate --runner executorch` on a non-LLM .pte and a garbage tokenizer.json were tracebacks; a negative
    --max-new-tokens generated nothing and exited 0."""
    for count in ("0", "-5"):  # a negative count generated nothing and exited 0
        assert main(["generate", str(demo), "--tokenizer", str(tmp_path), "--prompt", "hi", "--max-new-tokens", count]) == 2
        err = capsys.readouterr().err
        assert "--max-new-tokens must be at least 1" in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "nonsense"}}')
    assert main(["generate", str(demo), "--tokenizer", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "not a readable tokenizer" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    from tests.llm_helpers import train_tokenizer

    train_tokenizer().save(str(tmp_path / "tokenizer.json"))
    for runner in ("executorch", "python"):
        assert main(["generate", str(demo), "--tokenizer", str(tmp_path), "--prompt", "hi", "--runner", runner]) == 2
        err = capsys.readouterr().err
        assert "not an LLM export" in err and "Traceback" not in err, err
