"""Checks of a language-model export's request made before anything is loaded or written (#38, #47).

- :func:`check_output_is_not_an_input`: the output path is not, and does not resolve to, the checkpoint or
  any file of its folder but an ExecuTorch program (decided by what the file is, not by a list of names:
  ``-o FOLDER/model.safetensors`` replaced the weights with the program (#38), ``-o FOLDER/processor_config.json``
  the processor the runner reads (#47)); a symlink loop is one line.
- :func:`check_export_options`: ``--verify-steps`` and ``--group-size`` are counts the export can honour,
  refused in one line before the checkpoint is read (a negative step count or group size failed only after
  the ``.pte`` was written, or as a traceback).
- :func:`check_positions`: a KV-cache length within a learned position table (GPT-2's ``wpe``).
- :func:`check_state_sizes`: the recurrent states a decode step will keep, from a fake-tensor run of its probe,
  bounded before any is allocated (#47: a Qwen3-Next with linear head dims of 16384 was killed at 8 GB).
- :func:`remove_stale_scratch`: the scratch folders (``.NAME.pte.scratch.*``) of exports killed (SIGKILL runs
  no clean-up) are removed by the next export beside them; :func:`temp_stem` keeps the temporary names of a
  long output name within the file system's 255 bytes.
"""

from __future__ import annotations

import os
import pathlib
import shutil

from mps_backend.llm.checkpoint import CheckpointError

#: the largest ``--group-size``: beyond any weight's row (the bound of ``hidden_size`` and ``intermediate_size``)
MAX_GROUP_SIZE = 1 << 18
#: entries of a checkpoint folder compared with the output by identity (hard links, a Hugging Face cache's
#: ``snapshots/REV/x -> ../../blobs/HASH`` links); a folder with more is compared by path only beyond these
MAX_FOLDER_ENTRIES = 100_000


def is_program_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an ExecuTorch program (flatbuffer identifier ``ET`` and two digits at bytes 4-7) or
    a bundled program (``BP08``): the only files of a checkpoint's folder an export may replace, since no
    loader, tokenizer, processor or runner reads one as its input."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return len(head) == 8 and (head[4:8] == b"BP08" or (head[4:6] == b"ET" and head[6:8].isdigit()))


def real_path(path: str | os.PathLike, what: str = "output") -> pathlib.Path:
    """``path`` with every symlink resolved; a symlink loop is one OSError line naming it (``Path.resolve``
    raises a RuntimeError, a traceback out of the CLI)."""
    import errno  # noqa: PLC0415

    try:
        return pathlib.Path(path).resolve()
    except RuntimeError:
        raise OSError(errno.ELOOP, f"{what} {path} is a symlink loop (it never resolves to a file)") from None


def checkpoint_roots(kind: str, source: str | os.PathLike, params: str | os.PathLike | None = None) -> list[pathlib.Path]:
    """The folders whose files an export of ``kind:source`` (its loader, tokenizer and processor, its self-check,
    the runners given the folder) may read: an ``hf:`` checkpoint folder, the folder of a ``gguf:`` or ``llama:``
    file, the folder of ``params``. Resolved; those that do not exist are left out."""
    src = pathlib.Path(source)
    roots = [src if kind == "hf" else src.parent]
    if params:
        roots.append(pathlib.Path(params).parent)
    out = []
    for root in roots:
        real = real_path(root, "checkpoint")
        if real.is_dir() and real not in out:
            out.append(real)
    return out


def _same(a: pathlib.Path, b: pathlib.Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _entries(root: pathlib.Path) -> list[pathlib.Path]:
    """The files of ``root`` (not descending), at most :data:`MAX_FOLDER_ENTRIES`."""
    out = []
    try:
        with os.scandir(root) as it:
            for entry in it:
                if len(out) >= MAX_FOLDER_ENTRIES:
                    break
                out.append(pathlib.Path(entry.path))
    except OSError:
        pass
    return out


def check_output_is_not_an_input(out: str | os.PathLike, kind: str, source: str, params: str | None = None) -> None:
    """Refuse (:class:`CheckpointError`), before anything is loaded, an output path that is, or resolves to
    (``..``, a symlink, a hard link), the checkpoint, its ``params``, or an existing file of the checkpoint's
    folder (:func:`checkpoint_roots`, any depth, or linked from it) that is not an ExecuTorch program: which of
    a folder's files transformers' loaders, tokenizers and processors, the self-check or the runners read is
    theirs to decide (``processor_config.json``, ``chat_template.jinja``, ``vocab.json``, ...), so every one is
    kept. A new file, or a program an earlier export wrote, may be written there."""
    out = pathlib.Path(out)
    target = real_path(out)
    src = pathlib.Path(source)
    shown = f"{out} (resolves to {target})" if target != out.absolute() else str(out)
    if os.path.lexists(src) and (target == real_path(src, "checkpoint") or _same(target, src)):
        raise CheckpointError(f"output {shown} is the input checkpoint: choose another -o")
    if params and os.path.lexists(params) and _same(target, pathlib.Path(params)):
        raise CheckpointError(f"output {shown} is {params}, a file the export reads (--params): choose another -o")
    if not target.is_file() or is_program_file(target):
        return
    for root in checkpoint_roots(kind, src, params):
        inside = root in target.parents
        linked = inside or next((f for f in _entries(root) if _same(target, f)), None)
        if linked:
            f = target if inside else linked
            raise CheckpointError(
                f"output {shown} is {f}, a file the export reads or may read (any file of the checkpoint's folder "
                f"{root} but an ExecuTorch program: the loader, tokenizer, processor, self-check and runners read "
                "from it): choose another -o"
            )


def check_export_options(verify_steps: int, group_size: int | None, quantize: str | None) -> None:
    """Refuse step counts and group sizes no export can honour, before the checkpoint is read. (A step count
    beyond the KV-cache length is refused once that length is known, still before anything is written.) The
    environment's byte-count settings are parsed too (:func:`mps_backend.config.check_environment`)."""
    from mps_backend.config import check_environment  # noqa: PLC0415

    check_environment()
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


def check_positions(model, max_positions: int, max_seq_len: int) -> None:
    """Refuse a KV-cache length beyond a learned position table (GPT-2's ``wpe``, OPT's and Whisper's
    ``embed_positions``: an embedding of ``max_position_embeddings`` rows the step indexes by position): a
    program exported with ``--max-seq-len 65536`` on a 128-position GPT-2 was written and refused by the device
    model's gather at position 128 in ``generate``. Rotary and ALiBi models have no such table: beyond their
    positions they compute, with the quality the model has there (a note says so)."""
    import torch  # noqa: PLC0415

    if not max_positions or max_seq_len <= max_positions:
        return
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Embedding) or not any(k in name.rsplit(".", 1)[-1] for k in ("wpe", "pos")):
            continue
        rows = module.num_embeddings - int(getattr(module, "offset", 0) or 0)  # OPT's table starts 2 rows in
        if rows == max_positions:
            raise CheckpointError(
                f"--max-seq-len {max_seq_len}: the model embeds positions with a learned table of {rows} rows ({name}): "
                f"a position beyond it has none (the program would fail at position {rows}); at most {rows}"
            )


#: values of one recurrent state (a layer's conv or recurrent state): 8x the largest released model's, Bamba-9B's
#: and Granite 4.0's Mamba-2 state of 128 heads x 64 x 256 = 2,097,152 (Qwen3-Next's gated delta rule:
#: 32 x 128 x 128 = 524,288)
MAX_STATE_VALUES = 1 << 24


def check_state_sizes(model, config, dtype) -> None:
    """Refuse, before the decode step allocates them, recurrent states (a Mamba-2 layer's, a gated-delta-rule
    layer's, a short convolution's) of more than :data:`MAX_STATE_VALUES` values each, or together beyond a
    program's planned-memory budget (``MPS_BACKEND_MAX_PLAN_BYTES``). The shapes are the
    model's own, from the decode step's probe (:func:`mps_backend.llm.recurrent.probe_states`) run on fake
    tensors: nothing is computed nor allocated. A model the fake run cannot take is left to the probe itself."""
    import math  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from mps_backend.llm.decoder import has_recurrent_layers  # noqa: PLC0415
    from mps_backend.llm.recurrent import probe_states  # noqa: PLC0415
    from mps_backend.runtime.program_check import max_plan_bytes  # noqa: PLC0415

    if not has_recurrent_layers(config):
        return
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            states = probe_states(model)
    except Exception:  # noqa: BLE001 - an op fake tensors cannot take: the real probe runs as before
        return
    total = 0
    for (kind, layer, _), (shape, state_dtype) in sorted(states.items()):
        values = math.prod(shape)
        if values > MAX_STATE_VALUES:
            raise CheckpointError(
                f"layer {layer}'s {kind} state {list(shape)} holds {values:,} values, beyond the bound of {MAX_STATE_VALUES:,} "
                "(8x the largest released model's): its config's state sizes are not a real model's"
            )
        total += values * torch.empty((), dtype=state_dtype or dtype).element_size()
    budget = max_plan_bytes()
    if total >= budget:
        raise CheckpointError(
            f"the recurrent states take {total / 2**30:.3g} GiB, beyond the {budget / 2**30:.3g} GiB a program's planned "
            "memory may hold (MPS_BACKEND_MAX_PLAN_BYTES)"
        )


#: bytes of an output's name kept in the temporary names beside it: a name holds at most 255 bytes (NAME_MAX),
#: and a temporary name adds up to ~40 to the output's (a valid 254-byte -o name was refused as "File name too
#: long" about a temporary name)
TEMP_NAME_BYTES = 160


def temp_stem(name: str) -> str:
    """``name`` as the temporary names beside it hold it: itself when short enough, else its first bytes, ``~``
    and a digest of the whole name (two long names still get distinct temporary names)."""
    import hashlib  # noqa: PLC0415

    raw = name.encode(errors="surrogateescape")
    if len(raw) <= TEMP_NAME_BYTES:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return raw[: TEMP_NAME_BYTES - 13].decode(errors="ignore") + "~" + digest


def scratch_prefix(out: pathlib.Path) -> str:
    """The name prefix of an export's scratch folder beside ``out``: ``.NAME.scratch.PID.`` (the process id
    tells a later export whether the folder's export still runs; NAME: :func:`temp_stem`)."""
    return f".{temp_stem(out.name)}.scratch.{os.getpid()}."


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
    stem = temp_stem(out.name)
    for folder in out.parent.glob(f".{glob.escape(stem)}.scratch.*"):
        pid = folder.name[len(stem) + len(".scratch.") + 1 :].split(".", 1)[0]
        if folder.is_dir() and not folder.is_symlink() and writer_gone(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
