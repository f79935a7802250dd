"""Conventions ExecuTorch users know: the XNNPACK aot_compiler / old MPS example-script flags, output
names, ETRecords, bundled programs (.bpte), mixed-backend programs, and old scripts importing
executorch.backends.apple.mps (mps_backend.compat)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from mps_backend.tools.cli import main


def test_old_flags_and_default_output_name(tmp_path, capsys):
    assert main(["export", "-m", "demo", "--no-use_fp16", "--output_dir", str(tmp_path)]) == 0
    assert (tmp_path / "demo_mps_fp32.pte").is_file()
    assert "precision        float32" in capsys.readouterr().out
    assert main(["export", "--model_name", "demo", "--use_fp16", "--output_dir", str(tmp_path)]) == 0
    assert (tmp_path / "demo_mps_fp16.pte").is_file()
    with pytest.raises(SystemExit, match="contradict"):
        main(["export", "--fp32", "--use_fp16", "--output_dir", str(tmp_path)])


def test_generate_etrecord_writes_one_the_inspector_parses(tmp_path):
    from executorch.devtools.etrecord import parse_etrecord

    assert main(["export", "--output_dir", str(tmp_path), "--generate_etrecord"]) == 0
    record = tmp_path / "demo_mps_fp16_etrecord.bin"
    assert record.is_file()
    parsed = parse_etrecord(str(record))
    assert parsed._delegate_map or parsed.edge_dialect_program is not None


def test_etrecord_goes_beside_the_output_or_where_named(tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the default ETRecord follows -o, not the current folder
    out = tmp_path / "out" / "m.pte"
    out.parent.mkdir()
    assert main(["export", "-o", str(out), "--etrecord"]) == 0
    assert (out.parent / "m_etrecord.bin").is_file()
    assert not list(elsewhere.iterdir())
    named = tmp_path / "named.bin"
    assert main(["export", "-o", str(out), "--etrecord", str(named)]) == 0
    assert named.is_file()


@pytest.mark.parametrize(
    "spec, stem",
    [
        ("demo", "demo"),
        ("torchvision:resnet18", "resnet18"),
        ("executorch:llama-kv", "llama-kv"),
        ("models/my net.py:make", "my_net"),
        ("hf:./ckpt/SmolLM2-135M", "SmolLM2-135M"),
        ("llama:weights/consolidated.00.pth", "consolidated.00"),
        ("old/model.ff", "model"),
    ],
)
def test_default_output_name_of_every_model_spec(spec, stem):
    import argparse

    from mps_backend.tools.cli import _output_path

    args = argparse.Namespace(output=None, output_dir="outdir", model=spec, bundled=False)
    assert str(_output_path(args, True)) == f"outdir/{stem}_mps_fp16.pte"
    args.bundled = True
    assert str(_output_path(args, False)) == f"outdir/{stem}_mps_fp32.bpte"


def test_model_help_lists_every_spec_form(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for form in (
        "demo",
        "torchvision:NAME",
        "executorch:NAME",
        "torch:transformer_encoder",
        "path/file.py:factory",
        ".ff/.ptl",
        "hf:FOLDER",
        "llama:CHECKPOINT.pth",
        "-m MODEL, --model MODEL, --model_name MODEL",
    ):
        assert form in help_text, form


def test_bundled_program_runs_and_checks(tmp_path, capsys):
    assert main(["export", "-b", "--output_dir", str(tmp_path)]) == 0
    bpte = tmp_path / "demo_mps_fp16.bpte"
    assert bpte.read_bytes()[4:8] == b"BP08"
    capsys.readouterr()
    assert main(["run", str(bpte)]) == 0
    assert "1/1 test cases pass" in capsys.readouterr().out
    assert main(["inspect", str(bpte)]) == 0
    assert "1 delegate(s), 1 MPS" in capsys.readouterr().out
    etdump = tmp_path / "run.etdump"
    assert main(["run", str(bpte), "--etdump", str(etdump)]) == 2  # refused, not silently ignored
    assert "bundled program" in capsys.readouterr().err and not etdump.exists()
    assert main(["run", str(bpte), "--random", "--etdump", str(etdump)]) == 0  # the program inside runs
    assert etdump.is_file()


def test_bundled_program_with_wrong_expectations_fails(tmp_path, capsys):
    from mps_backend.export import bundle, export_model
    from mps_backend.runtime import verify_bundled

    model = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    pte = export_model(model, [x], use_fp16=False).pte
    with torch.no_grad():
        right, wrong = model(x), model(x) + 1
    assert verify_bundled(bundle(pte, [[x], [x]], [[right], [wrong]])) == [True, False]
    path = tmp_path / "wrong.bpte"
    path.write_bytes(bundle(pte, [[x]], [[wrong]]))
    assert main(["run", str(path)]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_inspect_counts_every_backend(tmp_path, capsys):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from mps_backend import MPSPartitioner

    class Mixed(torch.nn.Module):  # XNNPACK (asked first) takes the convolution; it has no where/gt: MPS takes those
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return torch.where(y > 0, y, y * 0.5)

    ep = torch.export.export(Mixed().eval(), (torch.randn(1, 3, 8, 8),))
    pte = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner(), MPSPartitioner()]).to_executorch().buffer
    path = tmp_path / "mixed.pte"
    path.write_bytes(pte)
    assert main(["inspect", str(path)]) == 0
    assert "2 delegate(s), 1 MPS, 1 XnnpackBackend" in capsys.readouterr().out


OLD_SCRIPT = textwrap.dedent("""
    # an export script written for executorch <= 1.4's MPS backend, unchanged
    import sys
    import torch
    from executorch.backends.apple.mps import MPSBackend
    from executorch.backends.apple.mps.partition import MPSPartitioner
    from executorch.exir import to_edge
    from executorch.exir.backend.backend_api import to_backend
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    ep = torch.export.export(model, (torch.randn(1, 8),))
    specs = [CompileSpec("use_fp16", bytes([True]))]
    edge = to_edge(ep).to_backend(MPSPartitioner(compile_specs=specs))
    open(sys.argv[1], "wb").write(edge.to_executorch().buffer)
    lowered = to_backend(MPSBackend.__name__, to_edge(ep).exported_program(), specs)
    print("whole-program", type(lowered).__name__)
""")


def test_old_script_runs_unchanged_through_compat(tmp_path):
    script = tmp_path / "old_export.py"
    script.write_text(OLD_SCRIPT)
    out = tmp_path / "old.pte"
    r = subprocess.run(
        [sys.executable, "-m", "mps_backend.compat", str(script), str(out)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    assert "whole-program LoweredBackendModule" in r.stdout
    from mps_backend.serialization.pte import delegate_blobs

    assert len(delegate_blobs(out.read_bytes())) == 1
    # without the alias the script fails the way it does on executorch 1.5
    r = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "executorch.backends.apple.mps" in r.stderr


def test_compat_alias_names_what_it_lacks():
    import importlib

    import mps_backend.compat  # noqa: F401

    mod = importlib.import_module("executorch.backends.apple.mps.partition")
    assert mod.MPSPartitioner.__module__ == "mps_backend.partitioner"
    with pytest.raises(AttributeError, match="provides MPSPartitioner"):
        mod.SomethingElse  # noqa: B018
