"""Runtime compatibility matrix: programs written with executorch 1.5.1, run by the runtimes apps ship.

Each case is exported here (executorch 1.5.1), then ``scripts/compat_check.py`` runs in every older
runtime and in this one. ``MPS_BACKEND_COMPAT_RUNTIMES`` lists them (``os.pathsep``-separated): a folder
holding an ``executorch`` package (``pip install --no-deps --target``; run with this Python, the folder
first on ``PYTHONPATH``) or another venv's Python executable (with this project installed
``--no-deps``); default: the folders under ``.runtime-et/`` (executorch 1.3.1 and 1.4.0), which
``make compat`` / ``make test`` create. In each
runtime the emulated MPS delegate is built against that runtime's headers and registered in its
registry; every program must verify, its forward method must read the same as in 1.5.1, every
operator must have a kernel, the program must load and run its steps through the runtime's own
module, and the outputs must equal those of the 1.5.1 run (bit for bit where no CPU kernel is
involved: the delegate is the same device model). The language model's decode step writes its KV cache
after the delegate, on CPU: its only CPU operator is ``aten::index_put_`` (in the 1.0 portable kernels,
as the export-time kernel check says and each runtime's registry confirms), writing the new rows only
(no ``aten::copy_`` of a whole cache: :mod:`mps_backend.cost`). The Whisper program runs as executorch's ASR
runner calls it: ``encoder`` once, then ``text_decoder`` steps each handed the encoder's output (its inputs
unplanned: the runtime points them at the caller's tensors). The vision-language program (Gemma 3) runs as
executorch's MultimodalRunner calls it: ``vision_encoder`` / ``token_embedding`` per input, each output
handed to ``text_decoder`` (any row count up to ``get_max_seq_len``), then decode steps. With ``MPS_BACKEND_COMPAT_REPORT=FILE``
the table is written there (docs/runtime-compat.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from mps_backend.cost import cost_of_program
from mps_backend.export import export_model
from mps_backend.quantize import quantize_model
from mps_backend.runtime_kernels import missing_kernels, program_operators

ROOT = Path(__file__).resolve().parents[1]
CHECKER = ROOT / "scripts" / "compat_check.py"
LLM_LAYERS, LLM_MAX_SEQ_LEN = 2, 32  # the KV-cache case: one K and one V buffer per layer
LLM_CHUNK = 4  # the chunked-prefill case: forward(tokens [1, n <= 4], input_pos [1]) (docs/llm.md)


def _runtimes() -> list[Path]:
    listed = os.environ.get("MPS_BACKEND_COMPAT_RUNTIMES")
    if not listed:
        return sorted(p for p in (ROOT / ".runtime-et").glob("*") if (p / "executorch").is_dir())
    paths = [Path(p) for p in listed.split(os.pathsep)]
    return [p for p in paths if (p / "executorch").is_dir() or p.is_file()]


class _GridSample(nn.Module):  # grid_sampler_2d has no MPS lowering (portable kernel since executorch 1.1)
    def forward(self, x, grid):
        return nn.functional.grid_sample(x, grid, align_corners=False) * 2.0


class _Mixed(nn.Module):  # MPS, CPU island, MPS
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 1)

    def forward(self, x, grid):
        return self.b(nn.functional.grid_sample(torch.relu(self.a(x)), grid, align_corners=False))


class _ConvNet(nn.Module):  # saved as a PyTorch Mobile flatbuffer (.ff), then migrated
    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2).mean((2, 3)))


def _cases(folder: Path) -> list[str]:
    """Write the cases (``NAME.pte``, ``NAME.inputs.pt``: a list of steps, each a list of inputs, and
    ``NAME.operators.json``); returns their names."""
    from mps_backend.tools import legacy  # noqa: PLC0415
    from mps_backend.tools.models import load  # noqa: PLC0415

    g = torch.Generator().manual_seed(0)
    x, grid = torch.randn(1, 2, 8, 8, generator=g), torch.rand(1, 4, 4, 2, generator=g) * 2 - 1
    image = torch.randn(1, 3, 16, 16, generator=g)
    torch.manual_seed(0)
    cnn = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Hardswish(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)
    ).eval()
    mlp4 = quantize_model(nn.Sequential(nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 16)).eval(), "int4", 32)
    mlp_in = torch.randn(2, 64, generator=g)
    ff = folder / "convnet.ff"
    torch.jit.save_jit_module_to_flatbuffer(torch.jit.script(_ConvNet().eval()), str(ff))
    migrated, migrated_in = legacy.load_legacy(str(ff), ["1,3,16,16"], progress=lambda msg: None)
    zoo, zoo_in = load("executorch:ds_cnn")
    exports = {
        "cnn_fp16": (export_model(cnn, [image]).pte, [[image]]),
        "cnn_fp32": (export_model(cnn, [image], use_fp16=False).pte, [[image]]),
        "int4_mlp": (export_model(mlp4, [mlp_in]).pte, [[mlp_in]]),
        "mixed_cpu_island": (export_model(_Mixed().eval(), [x, grid], target_runtime="1.1").pte, [[x, grid]]),
        "cpu_only": (_cpu_only(_GridSample().eval(), (x, grid)), [[x, grid]]),
        "migrated_ff": (export_model(migrated, list(migrated_in)).pte, [list(migrated_in)]),
        "zoo_ds_cnn": (export_model(zoo, list(zoo_in)).pte, [list(zoo_in)]),
        "llm_kv_cache": (_llm(folder, 1), [[torch.tensor([[t]]), torch.tensor([p])] for p, t in enumerate((1, 7, 3))]),
        "llm_prefill_chunk": (_llm(folder, LLM_CHUNK), _chunk_steps()),
        "whisper_asr": _whisper(folder),
        "whisper_preprocessor": _whisper_preprocessor(folder),
        "vlm_multimodal": _vision(folder),
    }
    # past the cache: the runner of 1.3/1.4 skips its capacity check for this program (max_seq_len <
    # max_context_len); the program itself refuses, on CPU, before the delegate runs
    torch.save([_step([5, 6], LLM_MAX_SEQ_LEN - 1), _step([5], LLM_MAX_SEQ_LEN)], folder / "llm_prefill_chunk.refused.pt")
    for name, (pte, steps) in exports.items():
        (folder / f"{name}.pte").write_bytes(pte)
        torch.save(steps, folder / f"{name}.inputs.pt")
        (folder / f"{name}.operators.json").write_text(json.dumps(program_operators(pte)))
    return list(exports)


def _cpu_only(model: nn.Module, inputs: tuple) -> bytes:
    from executorch.exir import to_edge_transform_and_lower  # noqa: PLC0415

    return to_edge_transform_and_lower(torch.export.export(model, inputs)).to_executorch().buffer


def _llm(folder: Path, chunk: int) -> bytes:
    from mps_backend.llm import export_llm  # noqa: PLC0415
    from tests.llm_helpers import save_checkpoint  # noqa: PLC0415

    ckpt = folder / "ckpt"
    if not ckpt.is_dir():
        save_checkpoint(ckpt, "llama", layers=LLM_LAYERS)
    out = folder / "llm.bin"
    export_llm(f"hf:{ckpt}", out, dtype="fp16", max_seq_len=LLM_MAX_SEQ_LEN, prefill_chunk=chunk)
    return out.read_bytes()


def _whisper(folder: Path) -> tuple[bytes, list]:
    """A tiny Whisper in float16 and the ASR runner's calls: ``encoder`` on the features of a test
    utterance, then three ``text_decoder`` steps, each handed the encoder's output (step 0's)."""
    from mps_backend.llm import export_llm  # noqa: PLC0415
    from tests.llm_helpers import train_tokenizer  # noqa: PLC0415
    from tests.whisper_helpers import START, features, save_whisper, utterance  # noqa: PLC0415

    ckpt = save_whisper(folder / "whisper", train_tokenizer())
    out = folder / "whisper.bin"
    export_llm(f"hf:{ckpt}", out, dtype="fp16", max_seq_len=LLM_MAX_SEQ_LEN)
    steps: list = [{"method": "encoder", "inputs": [features(ckpt, utterance())]}]
    for pos, token in enumerate((START, 7, 3)):
        steps.append({"method": "text_decoder", "inputs": [torch.tensor([[token]]), {"output_of": 0}, torch.tensor([pos])]})
    return out.read_bytes(), steps


def _whisper_preprocessor(folder: Path) -> tuple[bytes, list]:
    """The Whisper features program (mps_backend.llm.whisper_preprocessor) and what executorch's Whisper example
    hands it: the audio as one float32 tensor of its own length (2 s, then 0.5 s: the dynamic length)."""
    import transformers  # noqa: PLC0415

    from mps_backend.llm.whisper_preprocessor import export_preprocessor  # noqa: PLC0415
    from tests.whisper_helpers import utterance  # noqa: PLC0415

    out = folder / "whisper_preprocessor.bin"
    export_preprocessor(transformers.WhisperFeatureExtractor(), out)
    return out.read_bytes(), [[torch.from_numpy(utterance(2.0))], [torch.from_numpy(utterance(0.5, seed=1))]]


def _vision(folder: Path) -> tuple[bytes, list]:
    """A tiny Gemma 3 in float16 and the MultimodalRunner's calls on the processor's inputs: each input's
    ``vision_encoder`` or ``token_embedding``, then ``text_decoder`` handed its output at the runner's
    position, then two decode steps (``token_embedding`` of one token, ``text_decoder``)."""
    from mps_backend.llm import export_llm  # noqa: PLC0415
    from mps_backend.llm.multimodal import prompt_inputs  # noqa: PLC0415
    from tests.vlm_helpers import PROMPT, picture, save_vlm  # noqa: PLC0415

    ckpt = save_vlm(folder / "gemma3", "gemma3")
    out = folder / "vlm.bin"
    export_llm(f"hf:{ckpt}", out, dtype="fp16", max_seq_len=LLM_MAX_SEQ_LEN)
    steps: list = []
    pos = 0
    inputs = prompt_inputs(out, ckpt, PROMPT, picture()) + [("tokens", [7]), ("tokens", [3])]
    for kind, value in inputs:
        if kind == "image":
            steps.append({"method": "vision_encoder", "inputs": [value]})
        else:
            steps.append({"method": "token_embedding", "inputs": [torch.tensor([value])]})
        rows = 16 if kind == "image" else len(value)  # the image's N embeddings
        steps.append({"method": "text_decoder", "inputs": [{"output_of": len(steps) - 1}, torch.tensor([pos])]})
        pos += rows
    return out.read_bytes(), steps


def _step(tokens: list[int], pos: int) -> list[torch.Tensor]:
    return [torch.tensor([tokens]), torch.tensor([pos])]


def _chunk_steps() -> list[list[torch.Tensor]]:
    """A prompt of 2 chunks and 1 token (as the runner cuts 9 tokens at get_max_seq_len 4), 2 decode
    steps, a second prompt up to the cache's last 2 positions, then a chunk of 2 there (its 2 padding
    rows would fall past the cache's end)."""
    prompt = [1, 7, 3, 9, 12, 4, 8, 2, 6]
    steps = [_step(prompt[p : p + LLM_CHUNK], p) for p in range(0, len(prompt), LLM_CHUNK)]
    steps += [_step([11], len(prompt)), _step([13], len(prompt) + 1)]
    more = [(5 * i) % 100 + 2 for i in range(len(prompt) + 2, LLM_MAX_SEQ_LEN - 2)]
    steps += [_step(more[p : p + LLM_CHUNK], len(prompt) + 2 + p) for p in range(0, len(more), LLM_CHUNK)]
    return [*steps, _step([3, 5], LLM_MAX_SEQ_LEN - 2)]


def _check_cache_writes(pte: bytes) -> None:
    """The decode step's KV-cache writes (#23): one in-place ``index_put_`` per cache buffer on CPU after
    the delegate, a kernel of executorch 1.0's portable library, writing the new rows only."""
    assert program_operators(pte) == ["aten::index_put_"]
    assert missing_kernels(pte, "1.0") == []
    cost = cost_of_program(pte)
    assert cost.cpu_kernels == {"aten::index_put_.default": 2 * LLM_LAYERS}, cost.cpu_kernels
    # no cache is copied whole: nothing moves state around, and CPU writes exactly the new rows
    assert cost.naive.by_role["state copies"] == cost.fused.by_role["state copies"] == 0
    assert cost.cpu.written == cost.floor_parts["rows written"] > 0
    # each write is one position of its buffer ([1, kv_heads, 1, head_dim] of [.., LLM_MAX_SEQ_LEN, ..])
    assert cost.cpu.written * LLM_MAX_SEQ_LEN == cost.floor_parts["state"]


def _check_prefill_chunk(folder: Path, results: dict[str, dict], outputs) -> None:
    """The chunked program (#36) in every runtime: its logits are the token-by-token program's at each
    step's last row (float16: within the self-check's 1e-2 of their scale), and each step past the
    cache is an error of the runtime, not a run."""
    steps = torch.load(folder / "llm_prefill_chunk.inputs.pt")
    one = _token_by_token(folder / "llm_kv_cache.pte", steps)
    for version, rows in results.items():
        got = [o[0].reshape(-1) for o in outputs("llm_prefill_chunk", rows["llm_prefill_chunk"])]
        assert len(got) == len(one)
        for g, want in zip(got, one):
            assert float((g - want).abs().max() / want.abs().max()) <= 1e-2, version
        refused = rows["llm_prefill_chunk"].get("refused")
        assert refused and all(r != "ran" for r in refused), (version, refused)


def _token_by_token(pte: Path, steps) -> list[torch.Tensor]:
    """The token-by-token program's logits after each step's last token (the steps' tokens fed one per
    call at their positions, in this venv's runtime)."""
    from mps_backend.runtime import LoadedMethod  # noqa: PLC0415

    step = LoadedMethod(pte.read_bytes(), "forward")
    out = []
    for tokens_t, pos in steps:
        p0 = int(pos)
        for i, t in enumerate(tokens_t.reshape(-1).tolist()):
            logits = step([torch.tensor([[t]]), torch.tensor([p0 + i])])[0]
        out.append(logits.reshape(-1))
    return out


def _check(runtime: Path | None, folder: Path) -> dict[str, dict]:
    """Run the checker in this venv (None), with a runtime folder first on the path, or in another venv."""
    env, python = dict(os.environ), sys.executable
    if runtime is not None and runtime.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(runtime), env.get("PYTHONPATH")]))
    elif runtime is not None:
        python = str(runtime)
    run = subprocess.run([python, str(CHECKER), str(folder)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {r["case"]: r for r in rows}


def _compare(ours: list[list[torch.Tensor]], base: list[list[torch.Tensor]], exact: bool) -> str:
    """``equal`` (bit for bit), or ``close (max |diff| D)``; asserts the outputs are at least close."""
    assert len(ours) == len(base)
    diffs = []
    for got, want in zip(ours, base, strict=True):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            if not exact:  # a CPU kernel of another release: float32 rounding may differ in the last bits
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            diffs.append(0.0 if torch.equal(a, b) else float((a.double() - b.double()).abs().max()))
    if max(diffs) == 0.0:
        return "equal"
    assert not exact, f"outputs differ (max |diff| {max(diffs):.3g}) though no CPU kernel is involved"
    return f"close (max diff {max(diffs):.2g})"


def _write_report(path: Path, results: dict[str, dict[str, dict]], folder: Path) -> None:
    versions = list(results)
    lines = [
        "# Runtime compatibility",
        "",
        "Generated by `make compat` (tests/test_runtime_matrix.py): programs written with executorch 1.5.1, "
        "loaded and run by each runtime with `scripts/compat_check.py`, the MPS delegate emulated by the "
        "device model (its shim built against that runtime's headers and registered in that runtime's "
        "backend registry). *verifies*: full program verification; *meta*: the forward method (Whisper: each method) reads the "
        "same as in 1.5.1; *kernels*: every operator registered; *load*: the method loads (MPS delegates "
        "initialised); *steps*: calls of forward through the runtime's own module (the language model: "
        "three decode steps on its KV cache; Whisper: `encoder`, then three `text_decoder` steps handed its "
        "output, as executorch's ASR runner calls them; the vision-language program: `vision_encoder` or "
        "`token_embedding` per input, each output handed to `text_decoder`, as executorch's MultimodalRunner "
        "calls them); *outputs*: compared with the 1.5.1 run. *CPU operators*: "
        "the operators the program runs outside the delegate (the language model's KV-cache row writes: "
        "one in-place `aten::index_put_` per cache buffer, no `aten::copy_` of a cache).",
    ]
    if os.environ.get("MPS_BACKEND_COMPAT_RUNTIMES"):
        listed = [
            str(Path(p).relative_to(ROOT)) if Path(p).is_relative_to(ROOT) else p
            for p in os.environ["MPS_BACKEND_COMPAT_RUNTIMES"].split(os.pathsep)
        ]
        lines += [
            "",
            "Runtimes of this run: `MPS_BACKEND_COMPAT_RUNTIMES=" + os.pathsep.join(listed) + "` (a venv's "
            "Python per release that needs another torch, with the project installed `--no-deps`; "
            "`MPS_BACKEND_ET_HEADERS` pointing at that release's sources for wheels without the runtime "
            "headers).",
        ]
    if any(v.startswith("1.0.") for v in versions):
        lines += [
            "",
            "The pybindings of executorch 1.0 are built without `InternalConsistency` verification "
            '("requested but not available"): *verifies* there means the program parsed.',
        ]
    lines += ["", "| case | CPU operators | " + " | ".join(versions) + " |", "|---|---|" + "---|" * len(versions)]
    for case in sorted(results[versions[0]]):
        cells = []
        for v in versions:
            r = results[v][case]
            cells.append(
                f"verifies {'yes' if r['verifies'] else 'NO'}, meta {r.get('same_meta', '=')}, kernels "
                f"{'all' if not r.get('operators_missing') else r['operators_missing']}, load {r.get('load')}, "
                f"{r.get('outputs', 0)} step(s), outputs {r.get('equal', '-')}"
            )
        cpu = json.loads((folder / f"{case}.operators.json").read_text())
        lines.append(f"| {case} | {', '.join(f'`{op}`' for op in cpu) or 'none'} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.skipif(
    not _runtimes(),
    reason="no older executorch runtime: `make compat` (or `make test`) installs executorch 1.3.1 and 1.4.0 under .runtime-et/",
)
@pytest.mark.long
def test_programs_run_in_the_runtimes_apps_ship(tmp_path):
    cases = _cases(tmp_path)
    _check_cache_writes((tmp_path / "llm_kv_cache.pte").read_bytes())
    results = {"1.5.1 (this venv)": _check(None, tmp_path)}
    for runtime in _runtimes():
        rows = _check(runtime, tmp_path)
        version = next(iter(rows.values()))["runtime"]
        results[version] = rows
    assert len(results) >= 2
    base = results["1.5.1 (this venv)"]
    assert set(base) == set(cases)

    def outputs(case: str, r: dict) -> list[list[torch.Tensor]]:
        return torch.load(tmp_path / f"{case}.out-{r['runtime']}.pt")

    # the reference run itself is right (the delegated programs are checked against eager by the op and zoo tests)
    steps = torch.load(tmp_path / "cpu_only.inputs.pt")
    torch.testing.assert_close(outputs("cpu_only", base["cpu_only"])[0][0], _GridSample()(*steps[0]))
    for version, rows in results.items():
        for case in cases:
            r = rows[case]
            assert r["emulator"] == "ok", (version, r["emulator"])
            assert r["verifies"], (version, case, r)
            assert r["meta"] == base[case]["meta"], (version, case, r["meta"], base[case]["meta"])
            # the kernels the export-time check predicts missing (mps_backend/data/runtime_kernels.json) are
            # exactly those the real runtime lacks: such a program was exported for a newer target_runtime
            pte = (tmp_path / f"{case}.pte").read_bytes()
            predicted = [] if r is base[case] else sorted(k.operator for k in missing_kernels(pte, r["runtime"]))
            assert r["operators_missing"] == predicted, (version, case, r["operators_missing"], predicted)
            if predicted:
                assert r["load"] != "ok", (version, case, "loaded without kernels", predicted)
                r["load"], r["equal"] = f"refused ({', '.join(predicted)} missing, as predicted at export)", "-"
                continue
            assert r["load"] == "ok", (version, case, r["load"])
            n_steps = len(torch.load(tmp_path / f"{case}.inputs.pt"))
            assert r["outputs"] == n_steps, (version, case, r)
            has_cpu_kernel = case in ("cpu_only", "mixed_cpu_island")
            r["equal"] = _compare(outputs(case, r), outputs(case, base[case]), exact=not has_cpu_kernel)
    # the decode steps ran (each gives its own logits), they did not repeat one result
    llm = outputs("llm_kv_cache", base["llm_kv_cache"])
    assert not torch.equal(llm[0][0], llm[1][0])
    # the image's 16 embeddings, and the decode steps' own logits
    vlm = [o[0] for o in outputs("vlm_multimodal", base["vlm_multimodal"])]
    methods = [s["method"] for s in torch.load(tmp_path / "vlm_multimodal.inputs.pt")]
    assert [tuple(vlm[i].shape) for i, m in enumerate(methods) if m == "vision_encoder"] == [(1, 16, 64)]
    assert vlm[-1].shape == vlm[-3].shape and not torch.equal(vlm[-1], vlm[-3])
    asr = outputs("whisper_asr", base["whisper_asr"])
    assert asr[0][0].dim() == 3 and asr[1][0].shape == asr[2][0].shape and not torch.equal(asr[1][0], asr[2][0])
    # the features program: transformers' WhisperFeatureExtractor's features of each waveform
    import transformers  # noqa: PLC0415

    fe = transformers.WhisperFeatureExtractor()
    for out, (wave,) in zip(
        outputs("whisper_preprocessor", base["whisper_preprocessor"]), torch.load(tmp_path / "whisper_preprocessor.inputs.pt")
    ):
        want = fe(wave.numpy(), sampling_rate=16000, return_tensors="pt").input_features
        assert out[0].shape == (1, 80, 3000) and (out[0] - want).abs().max() <= 1e-3 * want.abs().max()
    # the chunked program: every step's logits of the token after its last row; past the cache refused
    _check_prefill_chunk(tmp_path, results, outputs)
    report = os.environ.get("MPS_BACKEND_COMPAT_REPORT")
    if report:
        _write_report(Path(report), results, tmp_path)
