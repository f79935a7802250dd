"""The ``mps-backend`` command: export | inspect | cost | run | generate | transcribe | ops | zoo."""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import pathlib
import signal
import sys
import threading
import zipfile

import numpy as np
import torch

from mps_backend import runtime
from mps_backend.config import check_environment
from mps_backend.cost import cost_of_program
from mps_backend.errors import CheckpointError, InternalError, MPSBackendError
from mps_backend.export import bundle, export_model, flat_outputs, is_bundled, verify
from mps_backend.files import output_target, write_atomically
from mps_backend.llm.chunking import ANY, DEVICE_CHOICES, device_slug
from mps_backend.llm.export import export_llm
from mps_backend.llm.generate import GenerationStats, Tokenizer, generate, generate_with_executorch_runner
from mps_backend.llm.multimodal import generate_image
from mps_backend.llm.options import ExportOptions
from mps_backend.llm.spec import USAGE, is_llm_spec, parse_model_spec
from mps_backend.llm.transcribe import encoder_input, feature_extractor, preprocessor_path, transcribe
from mps_backend.llm.whisper import Speech
from mps_backend.llm.whisper_preprocessor import export_preprocessor
from mps_backend.operators import default_registry
from mps_backend.precision import Precision
from mps_backend.progress import Progress
from mps_backend.quantize import Quantization, apply_plan, verify_tolerance
from mps_backend.runtime.bundled_check import check_bundle
from mps_backend.runtime.core import DeviceError
from mps_backend.runtime.emulator import program_input_specs, run_with_etdump
from mps_backend.runtime.program_check import ProgramFormatError, check_program
from mps_backend.runtime_kernels import DEFAULT_TARGET, RUNTIME_VERSIONS, RuntimeCompatError
from mps_backend.serialization import MPSFormatError, read_blob
from mps_backend.serialization import pte as pte_format
from mps_backend.tools import legacy, models
from mps_backend.tools.debug import format_table, fp16_gap_table


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _use_fp16(args) -> bool:
    """The precision from --fp16/--fp32, --dtype and the old example script's --use_fp16/--no-use_fp16."""
    said = set()
    if args.fp32 or args.fp16:
        said.add(not args.fp32)
    if args.dtype:
        said.add(args.dtype == "fp16")
    if getattr(args, "use_fp16", None) is not None:
        said.add(bool(args.use_fp16))
    if len(said) > 1:
        raise SystemExit("error: the precision flags contradict each other (--fp16/--fp32, --dtype, --use_fp16)")
    return said.pop() if said else True


def _model_stem(spec: str) -> str:
    """A file-name stem for a --model spec: demo, resnet18, llama-kv, mymodel, SmolLM2-135M, ..."""
    kind, _, rest = spec.partition(":")
    if spec.endswith((".ff", ".ptl")):
        name = pathlib.Path(spec).stem
    elif kind == "hf":
        name = pathlib.Path(rest).resolve().name
    elif kind in ("llama", "gguf") or kind.endswith(".py"):
        name = pathlib.Path(rest if kind in ("llama", "gguf") else kind).stem
    else:
        name = rest or kind  # torchvision:resnet18, executorch:llama-kv, demo
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"


def _output_path(args, use_fp16: bool) -> pathlib.Path:
    """-o as given, else ``<output_dir>/<model>_mps_<fp16|fp32>.pte`` (``.bpte`` with --bundled)."""
    if args.output:
        return pathlib.Path(args.output)
    suffix = ".bpte" if getattr(args, "bundled", False) else ".pte"
    return pathlib.Path(args.output_dir or ".") / f"{_model_stem(args.model)}_mps_{'fp16' if use_fp16 else 'fp32'}{suffix}"


def _target_runtime(args) -> str | None:
    return None if args.target_runtime == "none" else args.target_runtime


def cmd_export_llm(args) -> int:
    if args.verify and args.no_verify:
        raise SystemExit("error: --verify and --no-verify contradict each other")
    if args.bundled or args.etrecord:
        raise SystemExit("error: --bundled and --etrecord apply to single-step models, not to language models")
    out = _output_path(args, _use_fp16(args))
    try:
        # the flags as one options object, each of the same name (mps_backend.llm.options), validated here
        options = ExportOptions(
            precision=Precision.of(_use_fp16(args)),
            max_seq_len=args.max_seq_len,
            prefill_chunk=args.prefill_chunk,
            device=args.device or ANY,
            language=args.language,
            task=args.task,
            quantize=args.quantize,
            group_size=args.group_size,
            quantize_head=args.quantize_head,
            allow_requantize=args.allow_requantize,
            quantize_embedding=args.quantize_embedding,
            verify_steps=0 if args.no_verify else args.verify_steps,
            params=args.params,
            clamp_fp16=args.clamp_fp16,
            target_runtime=_target_runtime(args),
            allow_missing_kernels=args.allow_missing_kernels,
        )
        result = export_llm(args.model, out, options, progress=Progress(enabled=True))
    except (CheckpointError, FileNotFoundError, RuntimeCompatError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.summary())
    if result.verification is not None and not result.verification.ok:
        print(
            f"error: the self-check failed: {out} was not written (left as it was); the program is kept as "
            f"{result.path} for inspection",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {result.path}")
    if result.family == Speech.name:  # Whisper: its audio front end beside it
        return _export_whisper_preprocessor(args, result)
    if args.preprocessor:
        print(f"error: --preprocessor applies to Whisper checkpoints, not {result.model_type}", file=sys.stderr)
        return 2
    return 0


def _export_whisper_preprocessor(args, result) -> int:
    """The Whisper program's audio front end, beside it (``--preprocessor FILE``, default
    ``OUT-preprocessor.pte``): waveform -> features on the MPS delegate (mps_backend.llm.whisper_preprocessor)."""
    path = pathlib.Path(args.preprocessor) if args.preprocessor else preprocessor_path(result.path)
    try:
        fe = feature_extractor(parse_model_spec(args.model)[1], encoder_input(result.path)[0])
        info = export_preprocessor(fe, path)
    except (ValueError, OSError) as e:
        print(f"error: the preprocessor: {e}", file=sys.stderr)
        return 2
    cpu = ", ".join(info["cpu"]) or "nothing"
    print(
        f"wrote {path} (waveform [n <= {fe.n_samples}] -> features [1, {fe.feature_size}, {fe.nb_max_frames}]; "
        f"MPS delegates {info['delegates']}, on CPU: {cpu})"
    )
    return 0


def cmd_generate(args) -> int:
    if args.max_new_tokens < 1:  # a negative count generated nothing and exited 0 (#26)
        print(f"error: --max-new-tokens must be at least 1, got {args.max_new_tokens}", file=sys.stderr)
        return 2
    pte = pathlib.Path(args.file)
    if not pte.is_file():
        print(f"error: {pte}: no such file", file=sys.stderr)
        return 2
    if args.image is not None:
        return _generate_image(args, pte)
    try:
        tok = Tokenizer(args.tokenizer)
        # --chat: the prompt as a user message in the model's chat template; only the answer is printed
        prompt = tok.chat(args.prompt) if args.chat else args.prompt
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    echo = "" if args.chat else args.prompt
    if args.runner == "executorch":
        try:
            pieces = generate_with_executorch_runner(pte, tok, prompt, args.max_new_tokens, bos=args.bos)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(echo + "".join(pieces))
        return 0
    stats = GenerationStats()
    print(echo, end="", flush=True)
    try:
        for piece in generate(pte.read_bytes(), tok, prompt, args.max_new_tokens, stats=stats, bos=args.bos):
            print(piece, end="", flush=True)
    except ValueError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 2
    print()
    _say(str(stats))
    return 0


def _generate_image(args, pte: pathlib.Path) -> int:
    """``generate --image``: a vision-language program's MultimodalRunner loop on the processor's inputs."""
    if not pathlib.Path(args.image).is_file():
        print(f"error: {args.image}: no such image file", file=sys.stderr)
        return 2
    if args.bos:
        print("error: --bos applies to text prompts (the processor makes a vision-language prompt's tokens)", file=sys.stderr)
        return 2
    try:
        result = generate_image(
            pte, args.tokenizer, args.image, args.prompt, args.max_new_tokens, runner=args.runner, chat=args.chat
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result.text)
    if args.runner == "python":
        _say(result.stats())
    return 0


def cmd_transcribe(args) -> int:
    pte = pathlib.Path(args.file)
    for path, what in ((pte, "program"), (pathlib.Path(args.audio), "audio file")):
        if not path.is_file():
            print(f"error: {path}: no such {what}", file=sys.stderr)
            return 2
    try:
        result = transcribe(
            pte,
            args.audio,
            args.tokenizer,
            args.max_new_tokens,
            language=args.language,
            task=args.task,
            timestamps=True if args.timestamps else None,
            max_seconds=args.max_seconds,
            preprocessor=args.preprocessor,
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in result.notes:
        _say(f"note: {note}")
    if args.timestamps:
        for seg in result.segments:
            print(f"[{seg.start:.2f} --> {seg.end:.2f}] {seg.text.strip()}")
    else:
        print(result.text)
    _say(result.stats())
    return 0


def cmd_export(args) -> int:
    if is_llm_spec(args.model):
        return cmd_export_llm(args)
    for flag in ("max_seq_len", "params", "prefill_chunk", "device", "preprocessor", "language", "task"):
        if getattr(args, flag) is not None:  # one line, exit 2 (a SystemExit of text had no "error:" and exit 1)
            raise UserError(f"--{flag.replace('_', '-')} applies to language models (--model {USAGE})")
    if args.quantize_embedding or args.no_verify:
        raise UserError(f"--quantize-embedding and --no-verify apply to language models (--model {USAGE})")

    model, inputs = models.load(args.model, getattr(args, "input_shape", None))
    if getattr(args, "quantize", None):
        plan = Quantization(args.quantize, args.group_size, args.quantize_head, args.allow_requantize).plan(model)
        device = " (int4 needs macOS 15 / iOS 18 on the device)" if args.quantize == "int4" else ""
        _say(f"[quantize] {plan.summary()}{device}")
        apply_plan(plan)
        del plan
    elif args.quantize_head is not None:
        raise SystemExit(f"--quantize-head {args.quantize_head} applies to --quantize int4|int8")
    elif args.allow_requantize:
        raise SystemExit("--allow-requantize applies to --quantize int4|int8")
    use_fp16 = _use_fp16(args)
    out = _output_path(args, use_fp16)
    output_target(out)  # a directory, device or FIFO is refused before the export runs
    source = args.model.split(":", 1)[0] if ".py:" in args.model else args.model
    if pathlib.Path(source).exists() and out.resolve() == pathlib.Path(source).resolve():
        raise UserError(f"output {out} is the input model {source}: choose another -o")

    try:
        result = export_model(
            model,
            inputs,
            use_fp16=use_fp16,
            progress=_say,
            etrecord=bool(args.etrecord),
            target_runtime=_target_runtime(args),
            allow_missing_kernels=args.allow_missing_kernels,
        )
    except RuntimeCompatError as e:
        raise UserError(str(e)) from e
    data = result.pte
    if args.bundled:
        with torch.no_grad():
            expected = flat_outputs(getattr(model, "reference_module", model)(*inputs))
        data = bundle(result.pte, [list(inputs)], [expected])
    write_atomically(out, lambda f: f.write(data))
    print(result.summary())
    if result.report.on_cpu:
        print(str(result.report).split("\n", 1)[1])
    print(f"wrote {out}" + (" (bundled program: the program, its inputs and eager outputs)" if args.bundled else ""))
    if args.etrecord:
        etrecord = out.with_name(f"{out.stem}_etrecord.bin") if args.etrecord is True else pathlib.Path(args.etrecord)
        result.etrecord.save(str(etrecord))
        print(f"wrote {etrecord} (ETRecord for executorch's Inspector)")
    if args.verify:
        _say("[verify] running the .pte through the emulated MPS runtime ...")
        # a migrated legacy model is checked against its TorchScript module's own output
        v = verify(result.pte, getattr(model, "reference_module", model), inputs, result.use_fp16)
        if getattr(args, "quantize", None):  # the device's int4 dequantize rounds weights to float16
            v.tolerance = max(v.tolerance, verify_tolerance(args.quantize))
        print(v)
        return 0 if v.ok else 1
    return 0


def _read_pte(path: str, mapped: bool = False) -> bytes | memoryview:
    """The program in ``path``: a .pte, or the program inside a bundled program (.bpte). ``mapped``: a
    .pte is memory-mapped (read where it is looked at: ``inspect`` of a multi-GB file stays small)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise SystemExit(f"{path}: no such file")

    data: bytes | memoryview = pte_format.map_file(p) if mapped else p.read_bytes()
    try:
        if is_bundled(bytes(data[:8])):  # the bundle, its program and its test cases (as `run` checks them)
            return bytes(check_bundle(bytes(data), ProgramFormatError)[0])
        check_program(data)  # before executorch's deserializer or runtime sees it
    except ProgramFormatError as e:
        raise ProgramFormatError(f"{path}: {e}") from None
    return data


def cmd_inspect(args) -> int:
    if legacy.is_mobile_file(args.file):  # PTMF at bytes 4-7: a PyTorch Mobile flatbuffer, not a .pte
        return legacy.inspect_mobile(args.file)
    try:
        delegates = pte_format.delegate_blobs(_read_pte(args.file, mapped=True), backend_id=None, copy=False)
    except MPSFormatError as e:
        print(f"{args.file}: {e}", file=sys.stderr)
        return 2
    mps = [d for d in delegates if d.backend_id == "MPSBackend"]
    others = collections.Counter(d.backend_id for d in delegates if d.backend_id != "MPSBackend")
    print(
        f"{args.file}: {len(delegates)} delegate(s), {len(mps)} MPS"
        + "".join(f", {n} {backend}" for backend, n in sorted(others.items()))
    )
    status = 0
    for d in mps:
        print(f"\n== delegate {d.index} (MPSBackend), {len(d.blob):,} bytes")
        try:
            blob = read_blob(d.blob)
        except MPSFormatError as e:
            print(f"   malformed blob: {e}")
            status = 2
            continue
        g, h = blob.graph, blob.header
        print(f"   header: segment offset {h.segment_offset}, segment size {h.segment_size}")
        print(
            f"   graph type {g.graph_type}, version {g.version!r}, {len(g.nodes)} nodes, "
            f"{len(g.values)} values, {len(g.constant_ids)} constants "
            f"({sum(g.values[c].constant_buffer_size for c in g.constant_ids):,} bytes)"
        )
        for label, ids in (("inputs", g.input_ids), ("outputs", g.output_ids)):
            desc = ", ".join(f"{i}:{g.values[i].datatype.name}{list(g.values[i].dims)}" for i in ids)
            print(f"   {label}: {desc}")
        print("   nodes:")
        for op, n in sorted(collections.Counter(n.op for n in g.nodes).items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"     {n:5d}  {op}")
        if args.values:
            for i, t in enumerate(g.values):
                kind = "const" if i in set(g.constant_ids) else ""
                print(f"     v{i}: {t.datatype.name}{list(t.dims)} {kind}")
    return status


def cmd_run(args) -> int:
    path = pathlib.Path(args.file)
    if path.is_file() and is_bundled(path.read_bytes()[:8]) and not (args.inputs or args.random):
        if args.etdump or args.etrecord or args.out:
            raise UserError(
                f"{path} is a bundled program: run checks it against its own expected outputs; "
                "--etdump, --etrecord and --out need --inputs FILE.npz (or --random) to run it"
            )

        results = runtime.verify_bundled(path)
        for i, ok in enumerate(results):
            print(f"test case {i}: {'outputs match the bundled expected outputs' if ok else 'MISMATCH'}")
        print(f"bundled program: {sum(results)}/{len(results)} test cases pass")
        return 0 if all(results) and results else 1
    pte = _read_pte(args.file)
    record_inputs = _etrecord_inputs(args.etrecord) if args.etrecord and not args.inputs else None
    if record_inputs is not None:
        inputs = record_inputs
    elif args.inputs:
        try:
            with np.load(args.inputs, allow_pickle=False) as npz:
                keys = sorted((k for k in npz.files if k.startswith("input")), key=lambda k: (len(k), k)) or npz.files
                inputs = [torch.from_numpy(np.ascontiguousarray(npz[k])) for k in keys]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, TypeError) as e:
            raise UserError(f"{args.inputs}: not a readable .npz of arrays ({e})") from e
    else:
        gen = torch.Generator().manual_seed(args.seed)
        inputs = [
            torch.randn(shape, generator=gen).to(dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
            for shape, dtype in program_input_specs(pte)
        ]
    tracing = args.etdump or args.etrecord
    if args.out:
        _check_output_file(args.out, "--out")
    if tracing:
        etdump = pathlib.Path(args.etdump or pathlib.Path(args.file).with_suffix(".etdp").name)
        debug_buffer = pathlib.Path(args.debug_buffer or etdump.with_suffix(".debug.bin"))
        _check_output_file(etdump, "--etdump")
        _check_output_file(debug_buffer, "--debug-buffer")
        outputs = run_with_etdump(pte, inputs, etdump, debug_buffer)
        print(
            f"wrote {etdump} (ETDump: one event per MPS node, times emulated on this CPU) and "
            f"{debug_buffer} (intermediate outputs)"
        )
    else:
        outputs = runtime.run_pte(pte, inputs)
    for i, o in enumerate(outputs):
        f = o.float()
        print(
            f"output {i}: {o.dtype} {list(o.shape)} min {f.min().item():.4g} max {f.max().item():.4g} mean {f.mean().item():.4g}"
        )
    if args.out:
        with open(args.out, "wb") as f:  # a file object: np.savez would append .npz to a name without it
            np.savez(f, **{f"output_{i}": o.numpy() for i, o in enumerate(outputs)})
        print(f"wrote {args.out} (npz: output_0, output_1, ...)")
    if args.etrecord:
        print(_numeric_gap_table(etdump, args.etrecord, debug_buffer))
    return 0


def _check_output_file(path, flag: str) -> None:
    """A file ``run`` writes must be a regular file (or not exist yet) in an existing folder: a directory,
    a device or a FIFO there is refused before anything runs."""
    p = pathlib.Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {p}: is a directory, not a file to write")
    if p.exists() and not p.is_file():
        raise UserError(f"{flag} {p}: not a regular file (a device or FIFO); give a file path")
    if not p.parent.is_dir():
        raise UserError(f"{flag} {p}: folder {p.parent} does not exist")


def _etrecord_inputs(path: str):
    """The first representative inputs an ETRecord holds (``export --etrecord`` stores the example
    inputs), so the ETDump's intermediate outputs are comparable with the reference graph's."""
    from executorch.devtools.etrecord import parse_etrecord  # noqa: PLC0415

    try:
        record = parse_etrecord(path)
    except Exception as e:  # noqa: BLE001 - executorch raises whatever its parser hits
        raise UserError(f"{path}: not a readable ETRecord ({type(e).__name__}: {e})") from e
    inputs = record._representative_inputs  # noqa: SLF001 - executorch keeps no public accessor
    return list(inputs[0]) if inputs else None


def _numeric_gap_table(etdump, etrecord: str, debug_buffer) -> str:
    """executorch Inspector's ``calculate_numeric_gap`` (MSE) as a table: one row per operator,
    also inside the MPS delegate, in program order."""
    from executorch.devtools import Inspector  # noqa: PLC0415

    inspector = Inspector(etdump_path=str(etdump), etrecord=etrecord, debug_buffer_path=str(debug_buffer))
    gaps = inspector.calculate_numeric_gap("MSE")
    lines = [
        "per-operator gap, device model vs the ETRecord's reference graph (Inspector.calculate_numeric_gap, MSE):",
        f"{'ops':<48} {'MSE':>12}",
    ]
    for ops, gap in zip(gaps["aot_ops"], gaps["gap"]):
        value = max(float(g) for g in gap) if len(gap) else float("nan")
        lines.append(f"{', '.join(map(str, ops))[:48]:<48} {value:>12.4g}")
    return "\n".join(lines)


def cmd_debug(args) -> int:
    model, inputs = models.load(args.model)
    try:
        rows = fp16_gap_table(model, inputs)
    except ValueError as e:
        raise UserError(str(e)) from e
    print(format_table(rows, args.top))
    return 0


def cmd_cost(args) -> int:
    if args.top < 0:
        raise UserError(f"--top {args.top}: give a count of 0 or more")
    cost = cost_of_program(_read_pte(args.file, mapped=True), args.method, top=args.top)
    print(cost.to_json() if args.json else cost.format())
    return 0


def cmd_ops(args) -> int:
    names = sorted(str(t) for t in default_registry().targets)
    print("\n".join(names))
    print(f"{len(names)} targets", file=sys.stderr)
    return 0


def cmd_zoo(args) -> int:
    """The model zoo is a harness of the source checkout (harness/zoo.py), not installed: run it from there."""
    checkout = pathlib.Path(__file__).resolve().parents[2]
    if not (checkout / "harness" / "zoo.py").is_file():
        raise UserError(
            "mps-backend zoo runs the model zoo of a source checkout (harness/zoo.py, `make zoo`); this installation has none"
        )
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    return importlib.import_module("harness.zoo").main(args.zoo_args)


class UserError(MPSBackendError):
    """A problem with what the user asked for: printed as one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["zoo"]:  # its own options (argparse.REMAINDER would not take leading --options)
        return _run(cmd_zoo, argparse.Namespace(zoo_args=argv[1:]))

    parser = argparse.ArgumentParser(prog="mps-backend", description="Lower PyTorch models to the ExecuTorch MPS delegate.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export", help="export a model (default: the built-in demo) to a .pte")
    p.add_argument(
        "--target-runtime",
        "--target_runtime",
        dest="target_runtime",
        default=DEFAULT_TARGET,
        choices=(*RUNTIME_VERSIONS, "none"),
        help="the oldest executorch release the app ships (default: %(default)s, the oldest with the MPS "
        "delegate): an operator left on CPU without a kernel there is an error; none: no check (such a "
        "program then fails to load, naming the missing kernel)",
    )
    p.add_argument(
        "--allow-missing-kernels",
        action="store_true",
        help="warn instead of failing when the target runtime lacks a CPU kernel the program needs",
    )
    p.add_argument(
        "-m",
        "--model",
        "--model_name",
        dest="model",
        default="demo",
        help="demo | torchvision:NAME | executorch:NAME | "
        "torch:transformer_encoder | path/file.py:factory | legacy PyTorch Mobile flatbuffer path.ff/.ptl | "
        "hf:FOLDER (Hugging Face checkpoint: a language model, or Whisper for the ASR runner) | gguf:FILE.gguf "
        "(llama.cpp / Ollama file: a language model, tokenizer and chat template in it) | "
        "llama:CHECKPOINT.pth (with --params)",
    )
    p.add_argument(
        "--input-shape",
        action="append",
        metavar="SHAPE",
        help="input shape of a .ff/.ptl model, once per forward input: 1,3,32,32 or 1,16:int64 "
        "(default: the file's mps_backend/input_shapes.json extra file)",
    )
    prec = p.add_mutually_exclusive_group()
    prec.add_argument("--fp32", action="store_true", help="keep float32 on the device")
    prec.add_argument("--fp16", action="store_true", help="compute in float16 (default)")
    p.add_argument("--dtype", choices=("fp16", "fp32"), help="the same as --fp16 / --fp32")
    p.add_argument(
        "--use_fp16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the old MPS example script's flag: --use_fp16 (default) / --no-use_fp16",
    )
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=None,
        help="language models: static KV-cache length (default 2048, capped by the model's positions)",
    )
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        metavar="C",
        help="language models: prompt tokens one forward call takes, the rows the device computes per call "
        "(default: the chunk chosen for --device; 1: the static one-token step, prompts prefilled token by token; "
        "C > 1: forward(tokens [1, n <= C]), prompts prefilled C tokens per call, every step computing C rows: "
        "docs/llm.md)",
    )
    p.add_argument(
        "--device",
        default=None,
        type=device_slug,  # "M3 Pro", "m3_pro" and "m3-pro" alike
        choices=DEVICE_CHOICES,
        metavar="DEVICE",
        help="language models: the Apple GPU the prompt chunk is chosen for when --prefill-chunk is not given: "
        f"{', '.join(DEVICE_CHOICES)} (default any: the chunk with the best worst case over them; docs/llm.md, "
        "The chunk for your device)",
    )
    p.add_argument(
        "--language",
        default=None,
        help="Whisper: the language the program's decoding forces for executorch's ASR runner (a code such as fr, or "
        "a name; default: the generation config's, else detected from the audio)",
    )
    p.add_argument(
        "--task",
        choices=("transcribe", "translate"),
        default=None,
        help="Whisper, multilingual checkpoints: the task the program's decoding forces (default: the generation config's)",
    )
    p.add_argument("--params", default=None, help="llama:CHECKPOINT.pth: its params.json (default: beside it)")
    p.add_argument(
        "--clamp-fp16",
        action="store_true",
        help="language models: clamp weights beyond the float16 range to ±65504 instead of failing",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="run the .pte in the device model and compare with eager, exit 1 on a mismatch "
        "(language models: always, unless --no-verify)",
    )
    p.add_argument(
        "--verify-steps",
        type=int,
        default=4,
        metavar="N",
        help="language models: after writing, run the first N decode steps (default %(default)s) of the .pte "
        "on the emulated runtime against the eager float32 model on the same tokens; exit 1 when "
        "max |logit diff| / max |eager logit| exceeds 1e-05 (fp32), 0.01 (fp16), at least 0.002 with int4. "
        "A model whose eager float32 copy exceeds half the available memory is checked on a copy of its "
        "first 2 layers",
    )
    p.add_argument("--no-verify", action="store_true", help="language models: skip the --verify-steps check")
    p.add_argument(
        "--preprocessor",
        default=None,
        help="Whisper: where to write the audio front end's program (waveform -> features on the MPS delegate; "
        "default: OUT-preprocessor.pte beside the output)",
    )
    p.add_argument(
        "-o",
        "--output",
        help="output path (default: <output_dir>/<model>_mps_<fp16|fp32>.pte); written atomically (a temporary "
        "file beside it, then renamed); a symlink is written through (its target gets the program, the link "
        "stays); a directory, device or FIFO is refused",
    )
    p.add_argument(
        "--output_dir",
        "--output-dir",
        dest="output_dir",
        default=None,
        help="folder for the default output name (default: the current folder)",
    )
    p.add_argument(
        "-b",
        "--bundled",
        action="store_true",
        help="write a bundled program (.bpte): the program with its example inputs and eager "
        "outputs, for executorch's bundled-program check on the device",
    )
    p.add_argument(
        "--etrecord",
        "--generate_etrecord",
        dest="etrecord",
        nargs="?",
        const=True,
        default=None,
        metavar="FILE",
        help="also write executorch's ETRecord (default: <output stem>_etrecord.bin beside it)",
    )
    p.add_argument(
        "--quantize",
        choices=("int4", "int8"),
        help="weight-only quantization of the linear layers (asymmetric groups: a float16 scale and offset each); "
        "int4 needs macOS 15 / iOS 18; a gguf: file keeps its own quantized tensors unless this is given",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="weights sharing one scale and offset (default: 32 for int4, per output channel for int8; 0 = per channel)",
    )
    p.add_argument(
        "--quantize-head",
        choices=("int8", "int4", "float"),
        default=None,
        help="with --quantize: the output head (the logits' linear; a tied embedding table with it) as int8 in "
        "symmetric groups of 32 (default), int4 like the other layers, or float",
    )
    p.add_argument(
        "--allow-requantize",
        action="store_true",
        help="with --quantize int4: re-round weights already on a finer 4-bit grid (a 4-bit checkpoint's blocks of "
        "32 columns) at --group-size too; by default they keep their grid (lossless; the summary counts them)",
    )
    p.add_argument(
        "--quantize-embedding",
        action="store_true",
        help="language models: store the embedding table as int8 with a scale per row; the lookup gathers "
        "the token's row and scale, then dequantizes that row (reads D bytes a token, never the table)",
    )
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("inspect", help="describe the MPS delegates of a .pte (or a PyTorch Mobile .ff)")
    p.add_argument("file")
    p.add_argument("--values", action="store_true", help="list every value")
    p.set_defaults(fn=cmd_inspect)
    p = sub.add_parser(
        "cost",
        help="bytes a method of a .pte moves per execution on the device, naive and fused, vs the floor "
        "(a model, not a device measurement: docs/device-cost.md)",
    )
    p.add_argument("file")
    p.add_argument("--method", default=None, help="the method (default: forward)")
    p.add_argument("--json", action="store_true", help="print the cost as JSON")
    p.add_argument("--top", type=int, default=10, help="how many of the costliest nodes to list (default: %(default)s)")
    p.set_defaults(fn=cmd_cost)
    p = sub.add_parser("run", help="run a .pte through the emulated MPS runtime")
    p.add_argument("file")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--inputs", help=".npz with the inputs (keys input_0, input_1, ...)")
    src.add_argument("--random", action="store_true", help="random inputs (the default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write outputs to this .npz")
    p.add_argument(
        "--etdump",
        metavar="FILE",
        help="run with executorch's event tracer and write its ETDump: one "
        "event per MPS node (times emulated), for executorch.devtools.Inspector",
    )
    p.add_argument(
        "--debug-buffer",
        "--debug_buffer",
        dest="debug_buffer",
        metavar="FILE",
        help="with --etdump: where the intermediate outputs go (default: <etdump>.debug.bin)",
    )
    p.add_argument(
        "--etrecord",
        metavar="FILE",
        help="the export's ETRecord (export --etrecord): run on its "
        "example inputs and print the Inspector's per-operator numeric gap table",
    )
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("generate", help="greedy generation with a language-model .pte on the emulated runtime")
    p.add_argument("file", help="the .pte (mps-backend export --model hf:...)")
    p.add_argument(
        "--tokenizer", required=True, help="tokenizer.json, tokenizer.model, a GGUF file (its tokenizer), or a checkpoint folder"
    )
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--bos", action="store_true", help="put the model's BOS id before the prompt tokens")
    p.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as a user message in the model's chat template (from the GGUF file or the "
        "tokenizer's folder; instruct models expect it) and print only the answer",
    )
    p.add_argument(
        "--image",
        metavar="FILE",
        help="an image for a vision-language .pte (--tokenizer: the checkpoint folder, whose processor makes the inputs)",
    )
    p.add_argument(
        "--runner",
        choices=("python", "executorch"),
        default="python",
        help="python: the runner's loop over the emulated runtime (streams tokens, prints tokens/s); "
        "executorch: executorch's C++ TextLLMRunner binding (MultimodalRunner with --image)",
    )
    p.set_defaults(fn=cmd_generate)
    p = sub.add_parser(
        "transcribe",
        help="speech to text with a Whisper .pte on the emulated runtime (executorch's ASR runner's loop, greedy)",
    )
    p.add_argument("file", help="the .pte (mps-backend export --model hf:WHISPER_FOLDER)")
    p.add_argument(
        "--audio",
        required=True,
        help="an audio file libsndfile reads (WAV, FLAC, Ogg, MP3...): mixed to mono, resampled to 16 kHz",
    )
    p.add_argument(
        "--tokenizer",
        required=True,
        help="the checkpoint folder (tokenizer.json; its preprocessor_config.json for the features) or a tokenizer.json",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens to generate at most per 30-s window (default: what the decoder's cache holds after the prompt)",
    )
    p.add_argument("--language", default=None, help="the spoken language (a code such as fr, or a name); default: detected")
    p.add_argument(
        "--task", choices=("transcribe", "translate"), default=None, help="multilingual checkpoints: translate to English"
    )
    p.add_argument("--timestamps", action="store_true", help="print each segment with its start and end in seconds")
    p.add_argument("--max-seconds", type=float, default=3600.0, help="longer audio is refused (memory: 64 KB a second at 16 kHz)")
    p.add_argument(
        "--preprocessor",
        default=None,
        help="the features program (default: FILE-preprocessor.pte beside the program, if there; 'none': "
        "transformers' WhisperFeatureExtractor)",
    )
    p.set_defaults(fn=cmd_transcribe)
    p = sub.add_parser(
        "debug", help="per-op float16-vs-float32 gap table of a model on the device model (which layer loses precision)"
    )
    p.add_argument("-m", "--model", "--model_name", dest="model", default="demo", help="a --model spec as for export")
    p.add_argument("--top", type=int, default=10, help="rows in the summary of the worst nodes")
    p.set_defaults(fn=cmd_debug)
    p = sub.add_parser("ops", help="list the aten targets with an MPS lowering")
    p.set_defaults(fn=cmd_ops)
    p = sub.add_parser(
        "zoo",
        add_help=False,
        help="export, verify and measure the model zoo (harness/zoo.py of a source checkout; --help for options)",
    )
    p.add_argument("zoo_args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_zoo)
    args = parser.parse_args(argv)
    return _run(args.fn, args)


#: the KeyboardInterrupt argument that tells SIGTERM from SIGINT
SIGTERM_NOTE = "SIGTERM"
#: seconds after a finalizer swallowed a SIGINT/SIGTERM until it is sent again (from another thread: see ``_run``)
REDELIVERY_DELAY_S = 0.05


def _terminate(signum, frame) -> None:
    """SIGTERM raised where the process is, as SIGINT's KeyboardInterrupt is (the same clean-up runs: the export's
    temporary files and scratch folder are removed on the way out)."""
    raise KeyboardInterrupt(SIGTERM_NOTE)


def _is_sigterm(e: BaseException) -> bool:
    return isinstance(e, KeyboardInterrupt) and e.args == (SIGTERM_NOTE,)


def _run(fn, args) -> int:
    """``fn(args)``, any error of mps_backend (or the file system) told in one line; SIGTERM handled as SIGINT
    for the duration (its previous handler put back after). A SIGINT or SIGTERM whose exception was raised
    inside a finalizer (a weakref callback, a ``__del__``: Python prints "Exception ignored" and goes on) is
    delivered again, so that it ends the command all the same: sent from another thread once the hook has
    returned (a signal sent from the hook itself is handled inside it, where Python ignores the exception too,
    and the command went on to exit 0)."""
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: no handler
        previous = None
    unraisable = sys.unraisablehook

    def redeliver(info) -> None:
        if previous is not None and isinstance(info.exc_value, KeyboardInterrupt):
            again = signal.SIGTERM if _is_sigterm(info.exc_value) else signal.SIGINT
            threading.Timer(REDELIVERY_DELAY_S, os.kill, (os.getpid(), again)).start()
            return
        unraisable(info)

    sys.unraisablehook = redeliver
    try:
        return _run_checked(fn, args)
    finally:
        sys.unraisablehook = unraisable
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run_checked(fn, args) -> int:
    try:
        check_environment()  # a bad MPS_BACKEND_*_BYTES is one line before any work
        return fn(args)
    except InternalError as e:  # a bug of mps_backend, not the input's fault: one line, exit 1
        print(f"internal error (a bug of mps_backend, please report it): {e}", file=sys.stderr)
        return 1
    except (MPSBackendError, OSError, MemoryError) as e:  # this input cannot be used: one line, exit 2
        print(f"error: {_runtime_failure(e) or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # SIGINT, SIGTERM: the export's temporary files and scratch folder are removed on the way out
        if _is_sigterm(e):
            print("\nerror: terminated (SIGTERM)", file=sys.stderr)
            return 143
        print("\nerror: interrupted (SIGINT)", file=sys.stderr)
        return 130


def _runtime_failure(e: BaseException) -> str | None:
    """One line for a failure of the program being run rather than of the CLI: an emulated MPS delegate
    the device would abort on (DeviceError, raised out of executorch's execute), or memory running out
    (a MemoryError, which is also what a C++ std::bad_alloc inside executorch or torch becomes)."""
    if isinstance(e, DeviceError):
        return f"the MPS delegate failed on the device model: {e}"
    if isinstance(e, MemoryError):
        detail = f" ({e})" if str(e) else ""
        return f"out of memory{detail}: the program or model needs more memory than this machine has"
    return None


if __name__ == "__main__":
    sys.exit(main())
