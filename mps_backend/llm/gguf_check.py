"""Checks of a GGUF file's header and of the model it declares, before transformers reads it (#47).

transformers' GGUF reader trusts the file: it walks every metadata array whatever its declared length, its
tokenizer builds every token (4M tokens in a 91 MB file passed 8 GB), its name map is quadratic in the
block count (a 72 KB file declaring 1024 blocks was still loading after 180 s), and the model it builds from
the metadata is allocated whether the file holds its tensors or not (a 34 MB file declaring two layers of
width 16384 was killed at 6 GB). Here, one :class:`GGUFError` line naming the file and the limit:

- :func:`scan_header` reads the header with every count bounded before it is walked (:data:`LIMITS`: metadata
  keys, string bytes, array lengths, the vocabulary, tensors, dimensions) and checks the tensor table as
  llama.cpp's reader does: known ggml types, rows a whole number of blocks, each tensor's data where the one
  before it ends (padded to the file's alignment: no tensor overlaps another, none is relabelled to a type of
  another size), the data within the file and ending where the last tensor ends, and the block count at most
  :data:`MAX_GGUF_LAYERS`;
- :func:`check_model` checks transformers' config of the file with the bounds ``hf:`` folders have
  (:func:`mps_backend.llm.folder_check.check_config`), that every declared layer has tensors and no tensor
  is of a layer beyond them, and (:func:`mps_backend.llm.folder_check.check_declared_weights`, the model built
  on the meta device) that the file holds at least as many weight values as the model declares.

The bounds and the real models they come from: docs/llm.md, Bounds.
"""

from __future__ import annotations

import mmap
import os
import pathlib
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from mps_backend.errors import CheckpointError
from mps_backend.llm.folder_check import FolderError, check_config, check_declared_weights

#: blocks (layers) of a GGUF model: the largest released GGUF is Llama 3.1 405B's 126 (transformers' GGUF name
#: map, ``get_gguf_hf_weights_map``, takes time quadratic in the count, 164 s for 128 blocks, except under
#: :func:`mps_backend.llm.gguf.one_name_map`, which the loader uses: 0.1 s)
MAX_GGUF_LAYERS = 128
#: tokens of a GGUF vocabulary (``tokenizer.ggml.tokens``, ``scores``, ``token_type``): Gemma 3 has 262,144;
#: transformers builds a tokenizer of 1M tokens in 2.9 GB
MAX_GGUF_VOCAB = 1 << 19
#: the header's counts, each checked before it is walked
LIMITS = {
    "metadata keys": 1 << 12,  # real files: 30-60
    "string bytes": 16 << 20,  # the longest strings are chat templates (a few KB to tens of KB)
    "array length": 1 << 20,  # merges: Llama 3's 280,147; Qwen's 151,387
    "tensors": 1 << 16,  # Llama 3.1 405B: 1,138; old-style MoE files with one tensor per expert: ~14k
    "tensor name bytes": 256,  # llama.cpp's GGML_MAX_NAME is 64
    "elements": 1 << 40,
}
#: ggml keeps at most 4 dimensions (GGML_MAX_DIMS)
MAX_DIMS = 4
#: the metadata arrays that are the vocabulary (bounded by :data:`MAX_GGUF_VOCAB`)
VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
_LAYER = re.compile(r"^blk\.(\d+)\.")
#: fixed-size metadata value types: type id -> struct format
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFError(CheckpointError):
    """A GGUF file that must not be loaded: one line naming the file and the reason."""


@dataclass
class ScannedTensor:
    name: str
    shape: tuple[int, ...]  # torch order
    ggml_type: int
    offset: int
    nbytes: int


@dataclass
class GGUFScan:
    """What :func:`scan_header` read: the scalar and string metadata, each array's length, the tensor table."""

    path: pathlib.Path
    metadata: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, int] = field(default_factory=dict)
    tensors: list[ScannedTensor] = field(default_factory=list)
    data_start: int = 0

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    def layers(self) -> int | None:
        value = self.metadata.get(f"{self.architecture}.block_count")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Reader:
    def __init__(self, path: pathlib.Path, buf: Any) -> None:
        self.path, self.buf, self.pos = path, buf, 0

    def fail(self, message: str) -> GGUFError:
        return GGUFError(f"{self.path}: {message}")

    def unpack(self, fmt: str, what: str) -> tuple:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise self.fail(f"the header ends inside {what} (offset {self.pos} of {len(self.buf)} bytes)")
        values = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return values

    def count(self, what: str, limit_name: str, limit: int | None = None) -> int:
        (n,) = self.unpack("<Q", what)
        bound = LIMITS[limit_name] if limit is None else limit
        if n > bound:
            raise self.fail(f"{what}: {n:,} {limit_name}, beyond the bound of {bound:,}")
        return n

    def string(self, what: str, limit_name: str = "string bytes") -> str:
        n = self.count(what, limit_name)
        if self.pos + n > len(self.buf):
            raise self.fail(f"{what}: a string of {n:,} bytes reaches past the end of the file")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what}: not UTF-8 text") from None

    def value(self, key: str, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], f"the value of {key}")[0]
        if kind == _STRING:
            return self.string(f"the value of {key}")
        if kind != _ARRAY:
            raise self.fail(f"metadata {key[:80]!r} has value type {kind}, not a GGUF type")
        (sub,) = self.unpack("<I", f"the array {key}")
        limit = MAX_GGUF_VOCAB if key in VOCAB_ARRAYS else None
        n = self.count(f"metadata array {key[:80]!r}", "array length" if limit is None else "tokens", limit)
        if sub in _SCALARS:
            size = struct.calcsize(_SCALARS[sub]) * n
            if self.pos + size > len(self.buf):
                raise self.fail(f"metadata array {key[:80]!r} of {n:,} values reaches past the end of the file")
            self.pos += size
        elif sub == _STRING:
            for i in range(n):
                self.string(f"metadata array {key[:80]!r} element {i}")
        else:
            raise self.fail(f"metadata array {key[:80]!r} has elements of type {sub}, not a GGUF scalar or string")
        return _ArrayLength(n)


class _ArrayLength(int):
    """The length of a metadata array (its values are not kept)."""


LIMITS["tokens"] = MAX_GGUF_VOCAB


def _quant_sizes() -> dict[int, tuple[int, int]]:
    """ggml type id -> (elements per block, bytes per block), the gguf package's table."""
    import gguf  # noqa: PLC0415

    return {int(t): (int(b), int(s)) for t, (b, s) in gguf.GGML_QUANT_SIZES.items()}


def scan_header(path: str | os.PathLike) -> GGUFScan:
    """The file's header, read and checked with every count bounded (module docstring); raise :class:`GGUFError`."""
    path = pathlib.Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 24:
                raise GGUFError(f"{path}: {size} bytes, too short for a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _scan(path, buf, size)
    except OSError as e:
        raise GGUFError(f"{path}: {e.strerror or e}") from None


def _scan(path: pathlib.Path, buf: Any, size: int) -> GGUFScan:
    r = _Reader(path, buf)
    magic, version = r.unpack("<4sI", "the magic")
    if magic != b"GGUF":
        raise r.fail("not a GGUF file (it does not start with the bytes GGUF)")
    if version not in (2, 3):
        raise r.fail(f"GGUF version {version}: versions 2 and 3 are read")
    n_tensors = r.count("the tensor count", "tensors")
    n_keys = r.count("the metadata count", "metadata keys")
    scan = GGUFScan(path)
    for _ in range(n_keys):
        key = r.string("a metadata key")
        (kind,) = r.unpack("<I", f"the type of {key[:80]}")
        if key in scan.metadata or key in scan.arrays:
            raise r.fail(f"metadata key {key[:80]!r} appears twice")
        value = r.value(key, kind)
        if isinstance(value, _ArrayLength):
            scan.arrays[key] = int(value)
        else:
            scan.metadata[key] = value
    if "general.architecture" not in scan.metadata or not isinstance(scan.metadata["general.architecture"], str):
        raise r.fail("no general.architecture string in the metadata")
    layers = scan.layers()
    if layers is not None and not 1 <= layers <= MAX_GGUF_LAYERS:
        raise r.fail(
            f"{scan.architecture}.block_count = {layers}, outside [1, {MAX_GGUF_LAYERS}] (the largest GGUF models have 126 "
            "blocks; transformers' GGUF name map takes time quadratic in the count)"
        )
    alignment = scan.metadata.get("general.alignment", 32)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise r.fail(f"general.alignment = {alignment!r} is not a power of two")
    sizes = _quant_sizes()
    names = set()
    table = []
    for i in range(n_tensors):
        name = r.string(f"the name of tensor {i}", "tensor name bytes")
        if name in names:
            raise r.fail(f"tensor {name!r} appears twice in the tensor table")
        names.add(name)
        (n_dims,) = r.unpack("<I", f"the dimensions of tensor {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dimensions (ggml keeps 1 to {MAX_DIMS})")
        dims = r.unpack(f"<{n_dims}Q", f"the shape of tensor {name}")
        kind, offset = r.unpack("<IQ", f"the type and offset of tensor {name}")
        elements = 1
        for d in dims:
            elements *= d
        if min(dims) < 1 or elements > LIMITS["elements"]:
            raise r.fail(f"tensor {name!r} has shape {list(dims)} (each dimension at least 1, at most 2^40 elements)")
        if kind not in sizes:
            raise r.fail(f"tensor {name!r} has ggml type {kind}, not one the gguf package knows")
        block, block_bytes = sizes[kind]
        if dims[0] % block:
            raise r.fail(f"tensor {name!r}: its rows of {dims[0]} values are not whole blocks of {block} (ggml type {kind})")
        table.append(ScannedTensor(name, tuple(reversed(dims)), kind, offset, elements // block * block_bytes))
    scan.data_start = (r.pos + alignment - 1) // alignment * alignment
    expected = 0
    for t in table:  # llama.cpp's rule (gguf.cpp): each tensor where the previous one ends, padded to the alignment
        if t.offset != expected:
            raise r.fail(
                f"tensor {t.name!r} starts at data offset {t.offset}, not where the tensor before it ends ({expected}): tensors "
                "that overlap, leave a gap, or are stored in a type of another size than their table says"
            )
        expected += (t.nbytes + alignment - 1) // alignment * alignment
    end = scan.data_start + (table[-1].offset + table[-1].nbytes if table else 0)
    if table and end > size:
        raise r.fail(f"the tensor data ends at byte {end:,}, beyond the {size:,}-byte file (truncated)")
    if table and size > scan.data_start + expected:
        raise r.fail(
            f"{size - end:,} bytes after the last tensor's data (the tensor table accounts for {end:,} of the {size:,} bytes): "
            "a tensor missing from the table, or one stored in a type of another size than the table says"
        )
    scan.tensors = table
    return scan


def check_model(scan: GGUFScan, config: Any, model_class: Any) -> None:
    """The model transformers builds from the file's metadata against the file (module docstring)."""
    where = f"{scan.path}"
    try:
        sizes = check_config(config.to_dict(), f"{where} (its config)")
    except FolderError as e:
        raise GGUFError(str(e)) from None
    layers = int(sizes["num_hidden_layers"])
    held = {int(m.group(1)) for m in map(_LAYER.match, (t.name for t in scan.tensors)) if m}
    beyond = sorted(i for i in held if i >= layers)
    if beyond:
        raise GGUFError(f"{where}: tensors of block {beyond[0]}, the metadata declares {layers} blocks")
    missing = [i for i in range(layers) if i not in held]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (f" ... ({len(missing)} blocks)" if len(missing) > 8 else "")
        raise GGUFError(f"{where}: the metadata declares {layers} blocks, the file holds no tensors of block {shown}")
    shapes = {t.name: list(t.shape) for t in scan.tensors}
    try:
        check_declared_weights(scan.path, model_class, config, shapes)
    except FolderError as e:
        raise GGUFError(str(e).replace("the weights files hold", "the GGUF file holds")) from None
    except Exception as e:  # noqa: BLE001 - transformers refusing to build the model the metadata declares
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise GGUFError(
            f"{where}: transformers cannot build the model its metadata declares: {type(e).__name__}: {detail}"
        ) from None
