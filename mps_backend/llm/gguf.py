"""GGUF files (``gguf:FILE.gguf``, the format of llama.cpp and Ollama) -> an eager transformers model in
the export precision, through transformers' own GGUF support, tensor by tensor.

What transformers' ``from_pretrained(folder, gguf_file=NAME)`` does, and what is kept of it:

- the config and the tokenizer (with its chat template) come from the file's metadata, read by
  transformers (``AutoConfig`` / ``AutoTokenizer`` with ``gguf_file``): kept as is;
- the weights: for the architectures its older loader handles (llama, qwen2, mistral, phi3, gemma, ...)
  it dequantizes **every** tensor with the ``gguf`` package to a float32 numpy array, copies it, then
  converts it to the requested dtype and keeps it in a dict: the whole model in the load precision in
  anonymous memory, plus the float32 temporaries of the largest tensor (2.1 GB for an 8B model's
  embedding, twice). Replaced here by a state dict of :class:`_GGUFOnRead` tensors handed to the same
  ``from_pretrained`` (as ``hf:`` loading does): each tensor is read from the file and dequantized by
  the same ``gguf.dequantize`` when transformers takes it, a block of rows at a time
  (:data:`~mps_backend.llm.checkpoint.CONVERT_BLOCK_BYTES` of float32), converted to the export dtype,
  written to a scratch file and mapped back. The tensor names and llama.cpp's row order (its
  interleaved q/k rotary rows) are transformers': its name map (``get_gguf_hf_weights_map``) and its
  tensor processor, whose row permutation is read off by processing the row indices. A processor that
  does more than permute rows (merging MoE experts, transposing) is refused naming the tensor.
  Dequantizing gives the same values as transformers' loader, bit for bit (tests/llm/test_gguf.py).
- ``keep_quantized`` (what ``export_llm`` asks for without ``--quantize``): a linear or embedding weight
  of a type :mod:`mps_backend.llm.gguf_quants` keeps (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) is
  handed to transformers as an untouched placeholder (:class:`_Kept`) and then replaced by a
  :class:`~mps_backend.quant_tensor.GroupQuantizedTensor` of the file's blocks (rows in transformers'
  order, a block of rows at a time into scratch files): the program stores the file's values, not a
  float copy. Other types are dequantized as above, with a note naming them. The tensor table is read by
  transformers' ``GgufHeader`` with the byte sizes of every type the ``gguf`` package knows.

The self-check's layer-truncated copy of a GGUF (:func:`truncated_gguf`) is a GGUF again: the metadata
with the layer count changed and the kept tensors' blocks copied as stored.
"""

from __future__ import annotations

import contextlib
import functools
import math
import pathlib
import re
from typing import Any, Callable, Iterator

import numpy as np
import torch

from mps_backend.errors import CheckpointError
from mps_backend.llm.checkpoint import (
    CONVERT_BLOCK_BYTES,
    LoadedLM,
    _ConvertOnRead,
    _token_ids,
    load_state_dict_into,
)
from mps_backend.llm.gguf_check import check_model, scan_header
from mps_backend.llm.gguf_quants import LAYOUTS, decode_rows
from mps_backend.llm.registry import TESTED_MODEL_TYPES
from mps_backend.llm.swap import swapped
from mps_backend.operators.quant import int4_layout_fits
from mps_backend.pages import PageReleaser
from mps_backend.quant_tensor import GroupQuantizedTensor, collect_rows

_NEEDS = "gguf: checkpoints need transformers, gguf and accelerate: pip install 'mps-backend[llm]'"
_LAYER = re.compile(r"^blk\.(\d+)\.")


def _file(path: str | pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"{path}: not a GGUF file (it does not start with the bytes GGUF)")
    return path


def _any_type_bytes(own: Callable) -> Callable:
    """transformers' byte count of a tensor (``reader._byte_count``), for every type the ``gguf`` package
    knows (transformers' table lacks Q5_0, Q5_1, the TQ types, MXFP4, ...: it refused those files)."""

    def byte_count(ggml_type: int, elements: int, gguf_path: str) -> int:
        import gguf  # noqa: PLC0415

        try:
            block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            return own(ggml_type, elements, gguf_path)  # a type unknown to both: transformers' refusal
        return elements // block * size

    return byte_count


def read_header(path: str | pathlib.Path) -> Any:
    """The file's tensor table (transformers' ``GgufHeader``: names, shapes in torch order, ggml types,
    offsets, sizes: those of every type the ``gguf`` package knows), read without touching the tensor data, once
    the header passed the bounded checks of :func:`mps_backend.llm.gguf_check.scan_header`."""
    path = _file(path)

    scan_header(path)  # every count bounded before transformers' reader walks it (#47)
    try:
        from transformers.integrations.gguf.reader import GgufHeader  # noqa: PLC0415
    except ImportError as e:
        raise CheckpointError(_NEEDS) from e
    try:
        with swapped([("transformers.integrations.gguf.reader", "_byte_count", _any_type_bytes)]):
            return GgufHeader.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - any refusal of the file's header is one line
        raise CheckpointError(f"{path}: unreadable GGUF header: {type(e).__name__}: {str(e)[:200]}") from None


def parameter_count(path: str | pathlib.Path) -> int:
    """Parameters of the tensors in a GGUF file (from its header)."""
    return sum(math.prod(info.shape) for info in read_header(path).tensors)


def load_config(path: pathlib.Path) -> Any:
    """transformers' config of the model in the GGUF file (from its metadata)."""
    try:
        import gguf  # noqa: F401, PLC0415
        import transformers  # noqa: PLC0415
    except ImportError as e:
        raise CheckpointError(_NEEDS) from e
    try:
        return transformers.AutoConfig.from_pretrained(
            path.parent, gguf_file=path.name, local_files_only=True, trust_remote_code=False
        )
    except Exception as e:  # noqa: BLE001 - whatever transformers refuses the metadata with
        detail = " ".join(line.strip() for line in str(e).splitlines() if line.strip())[:300]
        raise CheckpointError(f"{path}: transformers could not read its GGUF metadata: {type(e).__name__}: {detail}") from None


def load_tokenizer(path: str | pathlib.Path) -> Any:
    """transformers' tokenizer from the GGUF file's metadata (vocabulary, merges, special tokens, chat
    template), once the header passed :func:`mps_backend.llm.gguf_check.scan_header` (a vocabulary of more than
    :data:`~mps_backend.llm.gguf_check.MAX_GGUF_VOCAB` tokens is refused before transformers builds it)."""
    path = _file(path)

    scan_header(path)
    try:
        import transformers  # noqa: PLC0415
    except ImportError as e:
        raise CheckpointError(_NEEDS) from e
    try:
        return transformers.AutoTokenizer.from_pretrained(
            path.parent, gguf_file=path.name, local_files_only=True, trust_remote_code=False
        )
    except Exception as e:  # noqa: BLE001
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ValueError(f"{path}: transformers could not read its GGUF tokenizer: {type(e).__name__}: {detail}") from None


class _GGUFOnRead(_ConvertOnRead):
    """One GGUF tensor, dequantized (``gguf.dequantize``: float32) a block of rows at a time when read,
    its rows taken in ``order`` (transformers' processor's row permutation, None: as stored)."""

    def __init__(self, path: pathlib.Path, info: Any, data_start: int, order, dtype, clamp, overflows, bar, scratch):
        super().__init__(info.name, list(info.shape), info.nbytes, dtype, clamp, overflows, bar, scratch)
        self.path, self.info, self.order = path, info, order
        self.start = data_start + info.offset
        rows = int(info.shape[0]) if len(info.shape) == 2 else 1
        self.stored_rows, self.stored_row_bytes = rows, info.nbytes // rows

    def _row_bytes(self) -> int:
        return 4 * int(self.shape[-1]) if len(self.shape) == 2 else 4  # the float32 values dequantized

    def _open(self) -> Any:
        return open(self.path, "rb", buffering=0)

    def _read(self, f: Any, lo: int, hi: int) -> np.ndarray:
        """Stored rows ``lo .. hi`` as bytes [rows, row bytes]: a plain read (mapped pages would stay
        resident next to the converted copy)."""
        buf = np.empty((hi - lo, self.stored_row_bytes), dtype=np.uint8)
        f.seek(self.start + lo * self.stored_row_bytes)
        if f.readinto(memoryview(buf).cast("B")) != buf.nbytes:
            raise CheckpointError(f"{self.path}: tensor {self.name} is truncated")
        return buf

    def _stored(self, source: Any, first: int, count: int) -> np.ndarray:
        """Rows ``first .. first + count`` in transformers' order (:attr:`order`), as stored (bytes)."""
        want = np.arange(first, first + count) if self.order is None else self.order[first : first + count]
        lo, hi = int(want.min()), int(want.max()) + 1
        raw = self._read(source, lo, hi)
        return raw if self.order is None else raw[want - lo]

    def _rows(self, source: Any, first: int, count: int) -> torch.Tensor:
        import gguf  # noqa: PLC0415

        kind = gguf.GGMLQuantizationType(self.info.ggml_type)
        if len(self.shape) != 2:  # a vector (norms, biases): small, whole
            values = gguf.dequantize(self._read(source, 0, 1), kind).reshape(-1)
            return torch.from_numpy(np.ascontiguousarray(values[first : first + count]))
        values = gguf.dequantize(self._stored(source, first, count), kind).reshape(count, int(self.shape[-1]))
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


class _Kept(_GGUFOnRead):
    """A quantized GGUF tensor kept as its blocks are (:mod:`mps_backend.llm.gguf_quants`): transformers'
    loading takes an unfilled placeholder of its shape (never read nor written: its pages are never
    touched), and :meth:`quantized` then reads the blocks, a block of rows at a time, into the weight
    the program stores (with a scratch folder, written there and mapped back)."""

    def __getitem__(self, index: Any) -> torch.Tensor:
        if self.bar is not None:
            self.bar.update(self.nbytes)
        return torch.empty(list(self.shape), dtype=self.dtype)[index]

    @property
    def kind(self) -> str:
        import gguf  # noqa: PLC0415

        return gguf.GGMLQuantizationType(self.info.ggml_type).name

    def quantized(self, packed: bool) -> GroupQuantizedTensor:
        """The tensor as :class:`~mps_backend.quant_tensor.GroupQuantizedTensor` of the export dtype;
        ``packed``: its 4-bit values in the device's int4 layout (a weight only matmuls read)."""
        rows, columns = (int(d) for d in self.shape)
        per = max(1, CONVERT_BLOCK_BYTES // (4 * columns))

        def as_stored(a: np.ndarray | None) -> torch.Tensor | None:
            if a is None or a.dtype == np.int8:  # the K-quants' minimums: stored as they are
                return None if a is None else torch.from_numpy(a)
            t = torch.from_numpy(a).to(torch.float16)
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(
                    f"{self.path}: tensor {self.name} ({self.kind}) has scales beyond float16's range: "
                    "export with --quantize int8"
                )
            return t

        def blocks():
            with self._open() as source:
                for r in range(0, rows, per):
                    q, *groups = decode_rows(self._stored(source, r, min(per, rows - r)), self.kind, columns)
                    yield torch.from_numpy(q), *(as_stored(t) for t in groups)

        parts = ("qdata", "scale", "offset", "minimums", "minimum_scale")
        q, scale, offset, minimums, minimum_scale = collect_rows(blocks(), rows, self.scratch, self.name, parts)
        layout = LAYOUTS[self.kind]
        return GroupQuantizedTensor(q, scale, layout.bits, packed, self.dtype, offset, minimums, minimum_scale, layout.shift)


def _row_order(path: pathlib.Path, processor: Any, name: str, shape: tuple, mapping: dict) -> np.ndarray | None:
    """The row permutation transformers' tensor processor applies to tensor ``name`` (read off by
    processing the row indices), None when it keeps the rows as stored; anything else is refused."""
    if len(shape) > 2:
        raise CheckpointError(f"{path}: tensor {name} has {len(shape)} dimensions (stacked MoE experts): not supported by gguf:")
    rows = int(shape[0]) if len(shape) == 2 else int(math.prod(shape))
    probe = np.arange(rows, dtype=np.float64).reshape(rows, 1) if len(shape) == 2 else np.arange(rows, dtype=np.float64)
    side: dict[str, dict] = {"tensors": {}}
    try:
        result = processor.process(weights=probe, name=name, tensor_key_mapping=mapping, parsed_parameters=side)
    except Exception as e:  # noqa: BLE001 - a shape its processor cannot take (a config that disagrees with the file)
        raise CheckpointError(f"{path}: tensor {name} {list(shape)}: {type(processor).__name__} refused it: {e}") from None
    order = np.asarray(result.weights)
    if result.name != name or side["tensors"] or order.shape != probe.shape:
        raise CheckpointError(
            f"{path}: transformers' GGUF loader ({type(processor).__name__}) transforms tensor {name} beyond a row "
            "permutation (merged, renamed or reshaped): not supported by gguf:"
        )
    order = order.reshape(-1).astype(np.int64)
    if not np.array_equal(np.sort(order), np.arange(rows)):
        raise CheckpointError(f"{path}: transformers' GGUF loader mixes the rows of tensor {name}: not supported by gguf:")
    if len(shape) != 2 and not np.array_equal(order, np.arange(rows)):
        raise CheckpointError(f"{path}: transformers' GGUF loader permutes vector {name}: not supported by gguf:")
    return None if np.array_equal(order, np.arange(rows)) else order


def _gguf_tensors(path, header, model_class, config, dtype, clamp, overflows, bar, scratch, keep=False) -> dict:
    """The file's tensors by transformers' names, each a :class:`_GGUFOnRead`, or with ``keep`` a
    :class:`_Kept` when it is a quantized type :data:`~mps_backend.llm.gguf_quants.LAYOUTS` keeps and the
    weight of an ``nn.Linear`` or ``nn.Embedding``; tensors the model has no place for are left out, as
    transformers' loader does."""
    import gguf  # noqa: PLC0415
    from transformers.modeling_gguf_pytorch_utils import (  # noqa: PLC0415
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=config.to_dict())
    with torch.device("meta"):
        skeleton = model_class(config)  # its parameter names, for transformers' name map
    with one_name_map():
        mapping = get_gguf_hf_weights_map(skeleton, processor)
    modules = dict(skeleton.named_modules())
    del skeleton
    tensors: dict[str, Any] = {}
    for info in header.tensors:
        if info.name not in mapping:
            continue
        order = _row_order(path, processor, info.name, info.shape, mapping)
        name = mapping[info.name]
        owner, _, leaf = name.rpartition(".")
        kept = (
            keep
            and gguf.GGMLQuantizationType(info.ggml_type).name in LAYOUTS
            and len(info.shape) == 2
            and leaf == "weight"
            and isinstance(modules.get(owner), (torch.nn.Linear, torch.nn.Embedding))
        )
        kind = _Kept if kept else _GGUFOnRead
        tensors[name] = kind(path, info, header.data_start, order, dtype, clamp, overflows, bar, scratch)
    return tensors


def _keep_quantized(model: torch.nn.Module, kept: dict[str, _Kept]) -> dict[str, list[int]]:
    """Put each kept tensor into ``model`` as its quantized weight, in every module that holds it (an
    embedding table tied to the head: both); packed int4 when only linears read it and the device's int4
    layout takes its shape. Returns per ggml type: [tensors, bytes stored, bytes in the file] of the weights
    only matmuls read, then the same of those read by a lookup (an embedding table: stored unpacked)."""
    holders: dict[int, list[torch.nn.Module]] = {}
    for m in model.modules():
        w = m._parameters.get("weight") if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) else None
        if w is not None:
            holders.setdefault(id(w), []).append(m)
    sizes: dict[str, list[int]] = {}
    done: set[int] = set()
    for name, tensor in kept.items():
        param = model.get_parameter(name)
        if id(param) in done:
            continue
        done.add(id(param))
        users = holders.get(id(param), [])
        packed = (
            LAYOUTS[tensor.kind].bits == 4
            and bool(users)
            and all(isinstance(m, torch.nn.Linear) for m in users)
            and int4_layout_fits(*param.shape)
        )
        weight = torch.nn.Parameter(tensor.quantized(packed), requires_grad=False)
        for m in users:
            m.weight = weight
        stored = weight.stored_bytes()  # values, scales and offsets or minimums, as the program stores them
        size = sizes.setdefault(tensor.kind, [0] * 6)
        at = 3 if any(isinstance(m, torch.nn.Embedding) for m in users) else 0
        size[at], size[at + 1], size[at + 2] = size[at] + 1, size[at + 1] + stored, size[at + 2] + tensor.nbytes
        del weight
        PageReleaser().trim()
    return sizes


def _kept_note(kind: str, size: list[int]) -> str:
    """``Q4_K (16) as int4 groups of 32, 1.07x their bytes; 1 read by a lookup, unpacked: 1.96x``."""
    n, stored, file, tables, table_stored, table_file = size
    layout = LAYOUTS[kind]
    text = f"{kind} ({n + tables}) as int{layout.bits} groups of {layout.group}"
    if n:
        text += f", {stored / file:.2f}x their bytes"
    if tables:
        unpacked = ", unpacked" if layout.bits == 4 else ""
        text += f"{';' if n else ','} {tables} read by a lookup{unpacked}: {table_stored / table_file:.2f}x"
    return text


@contextlib.contextmanager
def one_metadata_read() -> Iterator[None]:
    """While it is open, transformers reads each GGUF file's metadata once: ``load_gguf_checkpoint(path,
    return_tensors=False)`` (what a config and a tokenizer of the file start from) parses every field, the whole
    vocabulary included (2.8 CPU s for SmolLM2's 49,152 tokens), and an export asks for it three times (the
    loaded model's config, the self-check's prompt tokenizer and its eager reference's config: ``export_llm``
    holds this scope open). A file is the same while its path, size and modification
    time are; each caller gets a copy of its own. Reads of tensors are transformers' own; the function is restored
    on exit, also on error."""
    import copy  # noqa: PLC0415
    import os  # noqa: PLC0415

    try:
        from transformers import modeling_gguf_pytorch_utils as utils  # noqa: PLC0415
    except ImportError:  # no transformers: nothing reads GGUF metadata
        yield
        return
    own = utils.load_gguf_checkpoint
    read: dict[tuple, dict] = {}  # this scope's reads (one scope, one closure)

    def load_gguf_checkpoint(gguf_checkpoint_path, return_tensors=False, model_to_load=None, **kwargs):
        if return_tensors or model_to_load is not None or kwargs:
            return own(gguf_checkpoint_path, return_tensors=return_tensors, model_to_load=model_to_load, **kwargs)
        st = os.stat(gguf_checkpoint_path)
        key = (os.path.realpath(gguf_checkpoint_path), st.st_size, st.st_mtime_ns)
        if key not in read:
            read[key] = own(gguf_checkpoint_path, return_tensors=False)
        return copy.deepcopy(read[key])

    utils.load_gguf_checkpoint = load_gguf_checkpoint
    try:
        yield
    finally:
        utils.load_gguf_checkpoint = own
        read.clear()


@contextlib.contextmanager
def one_name_map() -> Iterator[None]:
    """While it is open, ``gguf.get_tensor_name_map`` builds each (architecture, block count)'s map once:
    transformers' ``get_gguf_hf_weights_map`` recurses into every submodule of the model and builds gguf's
    map of every block again at each (quadratic in the layer count: 6 CPU s of SmolLM2-135M's 30-layer
    load). The maps are only read; the function is restored on exit, also on error."""
    import gguf  # noqa: PLC0415

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def load_gguf(
    path: str | pathlib.Path,
    dtype: torch.dtype,
    *,
    clamp_fp16: bool = False,
    bar: Callable[[int], Any] | None = None,
    scratch: pathlib.Path | None = None,
    keep_quantized: bool = False,
) -> LoadedLM:
    """A transformers causal LM from a GGUF file, weights dequantized into ``dtype`` tensor by tensor
    (module docstring); ``bar`` and ``scratch`` as for :func:`mps_backend.llm.checkpoint.load_hf`. With
    ``keep_quantized``, the linear and embedding weights of a type :mod:`mps_backend.llm.gguf_quants`
    keeps are :class:`~mps_backend.quant_tensor.GroupQuantizedTensor` of the file's values instead."""
    path = _file(path)
    header = read_header(path)
    config = load_config(path)
    model_type = str(getattr(config, "model_type", "?"))
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING  # noqa: PLC0415

    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise CheckpointError(f"{path}: model type {model_type!r} has no *ForCausalLM class in transformers")
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]

    check_model(scan_header(path), config, model_class)  # hf:'s config bounds and declared-weights check (#47)
    weight_bytes = sum(info.nbytes for info in header.tensors)
    kept: dict[str, _Kept] = {}

    def tensors(progress: Any, overflows: list) -> dict:
        state = _gguf_tensors(path, header, model_class, config, dtype, clamp_fp16, overflows, progress, scratch, keep_quantized)
        kept.update({name: t for name, t in state.items() if isinstance(t, _Kept)})
        return state

    model, clamped = load_state_dict_into(
        model_class,
        config,
        tensors,
        dtype,
        where=f"{path}: transformers cannot load this {model_type} GGUF",
        missing_in=str(path),
        clamp_fp16=clamp_fp16,
        progress=bar(weight_bytes) if bar is not None else None,
    )
    sizes = _keep_quantized(model, kept) if kept else {}
    import gguf  # noqa: PLC0415

    kinds: dict[str, int] = {}
    for info in header.tensors:
        kind = gguf.GGMLQuantizationType(info.ggml_type).name
        kinds[kind] = kinds.get(kind, 0) + 1
    for kind, size in sizes.items():
        kinds[kind] -= size[0] + size[3]
    notes = []
    if sizes:
        notes.append("GGUF tensors kept quantized: " + ", ".join(_kept_note(k, size) for k, size in sorted(sizes.items())))
    floats = {k: n for k, n in kinds.items() if n and k in ("F32", "F16", "BF16", "F64")}
    others = {k: n for k, n in kinds.items() if n and k not in floats}
    if floats:
        notes.append(f"GGUF tensors {', '.join(f'{k} ({n})' for k, n in sorted(floats.items()))} in {str(dtype).split('.')[-1]}")
    if others:
        how = "no int4/int8 layout keeps them" if keep_quantized else "--quantize re-quantizes the model"
        notes.append(
            f"GGUF tensors {', '.join(f'{k} ({n})' for k, n in sorted(others.items()))} dequantized to "
            f"{str(dtype).split('.')[-1]} ({how})"
        )
    if model_type not in TESTED_MODEL_TYPES:
        notes.append(f"model type {model_type!r} is not among the tested ones ({', '.join(TESTED_MODEL_TYPES)})")
    if clamped:
        notes.append(f"{clamped} weight values beyond ±65504 clamped to the float16 range")
    vocab = int(config.vocab_size)
    bos = _token_ids(path, {}, config, "bos_token_id", vocab, where=path)
    eos = _token_ids(path, {}, config, "eos_token_id", vocab, where=path)
    return LoadedLM(
        model=model,
        kind="hf",
        model_type=model_type,
        n_layers=int(config.num_hidden_layers),
        vocab_size=vocab,
        max_positions=int(getattr(config, "max_position_embeddings", 0) or 0),
        bos_id=bos[0] if bos else None,
        eos_ids=eos,
        dtype=dtype,
        source_dtype=header.dtype,
        weight_bytes=weight_bytes,
        tokenizer_path=path,
        notes=notes,
    )


def truncated_gguf(path: str | pathlib.Path, into: pathlib.Path, layers: int) -> tuple[pathlib.Path, int]:
    """A GGUF of the first ``layers`` layers of ``path`` written into ``into`` (its metadata with the
    layer count changed, the kept tensors' blocks copied as stored): returns (the file, the original
    layer count)."""
    import gguf  # noqa: PLC0415

    path = _file(path)
    reader = gguf.GGUFReader(path)
    arch = str(reader.fields["general.architecture"].contents())
    count_key = f"{arch}.block_count"
    old = int(reader.fields[count_key].contents())
    out = into / "truncated.gguf"
    writer = gguf.GGUFWriter(out, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = min(layers, old) if key == count_key else field.contents()
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)
    for t in reader.tensors:
        m = _LAYER.match(t.name)
        if m is None or int(m.group(1)) < layers:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    with contextlib.closing(writer):
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    return out, old
