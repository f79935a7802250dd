"""Checks of a language-model export's request made before anything is loaded or written (#38).

- :func:`check_output_is_not_an_input`: the output path is not, and does not resolve to, a file the export
  reads (a checkpoint's weights, index, config, generation config, tokenizer files; a ``llama:`` checkpoint,
  its ``params.json`` and tokenizer): ``-o FOLDER/model.safetensors`` replaced the weights with the program.
- :func:`check_export_options`: ``--verify-steps`` and ``--group-size`` are counts the export can honour,
  refused in one line before the checkpoint is read (a negative step count or group size failed only after
  the ``.pte`` was written, or as a traceback).
- :func:`remove_stale_scratch`: the scratch folders (``.NAME.pte.scratch.*``) of exports killed (SIGKILL runs
  no clean-up) are removed by the next export beside them.
"""

from __future__ import annotations

import os
import pathlib
import shutil

from mps_backend.llm.checkpoint import CheckpointError

#: the files of an ``hf:`` folder the export (or its self-check) reads, beside its ``*.safetensors``
HF_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)
#: the files beside a ``llama:`` checkpoint the export reads (its tokenizer for the runner)
LLAMA_FILES = ("params.json", "tokenizer.model", "tokenizer.json")
#: the largest ``--group-size``: beyond any weight's row (the bound of ``hidden_size`` and ``intermediate_size``)
MAX_GROUP_SIZE = 1 << 18


def export_inputs(kind: str, source: str | os.PathLike, params: str | os.PathLike | None = None) -> list[pathlib.Path]:
    """The files an export of ``kind:source`` reads (those that exist)."""
    src = pathlib.Path(source)
    if kind == "hf":
        files = [src / name for name in HF_FILES]
        files += sorted(src.glob("*.safetensors")) if src.is_dir() else []
    else:
        files = [src, *(src.with_name(name) for name in LLAMA_FILES)]
        if params:
            files.append(pathlib.Path(params))
    return [f for f in files if os.path.lexists(f)]


def _same(a: pathlib.Path, b: pathlib.Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output_is_not_an_input(out: str | os.PathLike, kind: str, source: str, params: str | None = None) -> None:
    """Refuse (:class:`CheckpointError`) an output path that is, or resolves to, the checkpoint (a folder or
    a file) or any file the export reads (:func:`export_inputs`), before anything is loaded."""
    out = pathlib.Path(out)
    src = pathlib.Path(source)
    if _same(out, src) and os.path.lexists(src):
        raise CheckpointError(f"output {out} is the input checkpoint: choose another -o")
    for f in export_inputs(kind, src, params):
        if _same(out, f):
            shown = f"{out} (resolves to {out.resolve()})" if out.resolve() != out.absolute() else str(out)
            raise CheckpointError(f"output {shown} is {f}, a file the export reads: choose another -o")


def check_export_options(verify_steps: int, group_size: int | None, quantize: str | None) -> None:
    """Refuse step counts and group sizes no export can honour, before the checkpoint is read. (A step count
    beyond the KV-cache length is refused once that length is known, still before anything is written.)"""
    if isinstance(verify_steps, bool) or not isinstance(verify_steps, int) or verify_steps < 0:
        raise CheckpointError(f"--verify-steps {verify_steps}: give a count of 0 (no check) or more")
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or not 0 <= group_size <= MAX_GROUP_SIZE:
            raise CheckpointError(
                f"--group-size {group_size}: give 0 (one scale per output channel) or a group of 1 to {MAX_GROUP_SIZE} columns"
            )
        if not quantize:
            raise CheckpointError(f"--group-size {group_size} applies to --quantize int4|int8")


def check_verify_steps(verify_steps: int, max_seq_len: int) -> None:
    """The self-check runs one decode step per position: at most ``max_seq_len`` steps."""
    if verify_steps > max_seq_len:
        raise CheckpointError(
            f"--verify-steps {verify_steps} exceeds the KV-cache length {max_seq_len} (--max-seq-len): nothing written"
        )


def scratch_prefix(out: pathlib.Path) -> str:
    """The name prefix of an export's scratch folder beside ``out``: ``.NAME.scratch.PID.`` (the process id
    tells a later export whether the folder's export still runs)."""
    return f".{out.name}.scratch.{os.getpid()}."


def writer_gone(pid: str) -> bool:
    """Whether ``pid`` (the text of a temporary name) is the id of a process that no longer runs."""
    if not pid.isdigit() or len(pid) > 9:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def remove_stale_scratch(out: pathlib.Path) -> list[pathlib.Path]:
    """Remove the scratch folders ``.NAME.scratch.PID.*`` beside ``out`` whose export no longer runs (SIGKILL
    runs no clean-up; a live export's folder is left alone). Returns what was removed."""
    import glob  # noqa: PLC0415

    removed = []
    for folder in out.parent.glob(f".{glob.escape(out.name)}.scratch.*"):
        pid = folder.name[len(out.name) + len(".scratch.") + 1 :].split(".", 1)[0]
        if folder.is_dir() and not folder.is_symlink() and writer_gone(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
