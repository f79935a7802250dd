"""The file formats a language-model checkpoint is read from, each through one bounded reader: nothing
is read past its bound, nothing that is not a regular file is opened, and a malformed file is one
:class:`FolderError` line naming the file and what is wrong.

- JSON (``config.json``, the shard index, ``generation_config.json``, the tokenizer files, a
  ``llama:`` checkpoint's ``params.json``): :func:`read_json_object`, an object of at most
  :func:`json_limit` bytes (``unique``: a key given twice is refused);
- safetensors headers: :func:`read_safetensors_header`, every tensor's dtype (:data:`SAFETENSORS_DTYPES`,
  the one table of safetensors dtypes), shape and data span, checked against the file: a known dtype,
  a shape of non-negative integers, a span inside the data that holds what the shape needs, no two
  spans overlapping, no name twice.

The folder check (:mod:`mps_backend.llm.folder_check`), the loaders (:mod:`mps_backend.llm.checkpoint`)
and the self-check (:mod:`mps_backend.llm.verify`) read these files through these functions only.
"""

from __future__ import annotations

import json
import os
import pathlib
import stat
from typing import Any, Callable, NamedTuple

import torch

from mps_backend.errors import CheckpointError, MPSBackendError

#: safetensors dtype name -> torch dtype (the bytes per value are its itemsize)
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
#: safetensors dtype name -> bytes per value
DTYPE_BYTES = {name: dtype.itemsize for name, dtype in SAFETENSORS_DTYPES.items()}
#: the largest safetensors JSON header read
MAX_HEADER_BYTES = 100 << 20
#: the largest JSON file read, by file name; any other name: DEFAULT_MAX_JSON_BYTES
MAX_JSON_BYTES = {"config.json": 16 << 20, "tokenizer.json": 512 << 20}
DEFAULT_MAX_JSON_BYTES = 64 << 20


class FolderError(CheckpointError):
    """A checkpoint folder (or file) that must not be loaded: the message names the file and the reason."""


class TensorEntry(NamedTuple):
    """A tensor of a safetensors file: its dtype's name, shape, and data span (offsets in the file)."""

    dtype: str
    shape: list[int]
    start: int
    end: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return SAFETENSORS_DTYPES[self.dtype]


def open_regular(real: str | os.PathLike):
    """Open a (resolved) regular file for reading without following a symlink swapped in since, nor
    blocking on a FIFO; anything else that opens is a :class:`FolderError`."""
    fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FolderError(f"{real}: not a regular file")
    return os.fdopen(fd, "rb")


class _DuplicateKey(MPSBackendError, ValueError):
    """A key given twice in one JSON object (caught here and reported as a :class:`FolderError`)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json object_pairs_hook: a key given twice is refused (parsers disagree on which one wins: a check
    would read one value, a loader may use the other)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _decode(data: bytes, unique: bool, twice: Callable[[str], str], invalid: Callable[[str], str]) -> Any:
    """``data`` parsed as JSON; a key given twice in one object (``unique``) or a parse error is a
    :class:`FolderError` saying ``twice(the key)`` or ``invalid(the parser's reason)``."""
    try:
        return json.loads(data, object_pairs_hook=_unique_keys) if unique else json.loads(data)
    except _DuplicateKey as e:
        raise FolderError(twice(repr(str(e)[:120]))) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise FolderError(invalid(str(e).splitlines()[0][:120])) from None


def json_limit(name: str) -> int:
    """The largest JSON file of this name read (:data:`MAX_JSON_BYTES`)."""
    return MAX_JSON_BYTES.get(name, DEFAULT_MAX_JSON_BYTES)


def read_json_object(path: str | os.PathLike, *, real: str | os.PathLike | None = None, unique: bool = False) -> dict:
    """The JSON object in ``path`` (read from ``real``, its checked resolution, if given), at most
    :func:`json_limit` bytes; ``unique``: a key repeated within one object is refused."""
    path = pathlib.Path(path)
    limit = json_limit(path.name)
    with open_regular(real if real is not None else path.resolve()) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FolderError(f"{path}: larger than {limit >> 20} MiB")
    value = _decode(
        data,
        unique,
        lambda key: f"{path}: key {key} appears twice in one JSON object",
        lambda why: f"{path}: not valid JSON ({why})",
    )
    if not isinstance(value, dict):
        raise FolderError(f"{path}: not a JSON object")
    return value


def read_safetensors_header(
    path: str | os.PathLike,
    *,
    real: str | os.PathLike | None = None,
    check_dtype: Callable[[str, str], None] | None = None,
) -> dict[str, TensorEntry]:
    """Tensor name -> :class:`TensorEntry` of a safetensors file (read from ``real``, its checked
    resolution, when given), its header checked against the file (the module doc).
    ``check_dtype(where, dtype)`` may refuse a known dtype (raising), before the tensor's shape is read."""
    path = pathlib.Path(path)
    with open_regular(real if real is not None else path.resolve()) as f:
        file_size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) != 8:
            raise FolderError(f"{path}: not a safetensors file ({file_size} bytes)")
        n = int.from_bytes(head, "little")
        if not 2 <= n <= min(MAX_HEADER_BYTES, file_size - 8):
            raise FolderError(f"{path}: safetensors header length {n} beyond the {file_size}-byte file (or the 100 MiB bound)")
        raw = f.read(n)
    if len(raw) != n:
        raise FolderError(f"{path}: truncated safetensors header")
    header = _decode(
        raw,
        True,
        lambda key: f"{path}: safetensors header names {key} twice",
        lambda why: f"{path}: safetensors header is not JSON ({why})",
    )
    if not isinstance(header, dict):
        raise FolderError(f"{path}: safetensors header is not a JSON object")
    data_size = file_size - 8 - n
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise FolderError(f"{path}: __metadata__ is not an object of strings")
            continue
        at = f"{path}: tensor {name[:200]!r}"
        if not isinstance(info, dict):
            raise FolderError(f"{at}: its entry is not an object")
        dtype = info.get("dtype")
        itemsize = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None  # a list is not even hashable
        if itemsize is None:
            raise FolderError(f"{at}: unknown dtype {str(info.get('dtype'))[:40]!r} (known: {', '.join(DTYPE_BYTES)})")
        if check_dtype is not None:
            check_dtype(at, dtype)
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 1 << 40 for d in shape) or len(shape) > 8:
            raise FolderError(f"{at}: shape {str(shape)[:80]} is not up to 8 non-negative integers")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            raise FolderError(f"{at}: data offsets {str(offsets)[:80]} outside the {data_size} bytes of data")
        nbytes = itemsize
        for d in shape:
            nbytes *= d
        if nbytes != offsets[1] - offsets[0]:
            raise FolderError(
                f"{at}: data offsets {offsets} hold {offsets[1] - offsets[0]} bytes, its shape {shape} needs {nbytes}"
            )
        entries[name] = TensorEntry(dtype, shape, 8 + n + offsets[0], 8 + n + offsets[1])
    spans = sorted((e.start, e.end, name) for name, e in entries.items())
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise FolderError(f"{path}: tensors {a[:200]!r} and {b[:200]!r} overlap in the file")
    return entries


__all__ = [
    "DEFAULT_MAX_JSON_BYTES",
    "DTYPE_BYTES",
    "FolderError",
    "MAX_HEADER_BYTES",
    "MAX_JSON_BYTES",
    "SAFETENSORS_DTYPES",
    "TensorEntry",
    "json_limit",
    "open_regular",
    "read_json_object",
    "read_safetensors_header",
]
