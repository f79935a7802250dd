"""Check a Hugging Face checkpoint folder before anything loads it (``hf:FOLDER``).

:func:`check_folder` reads only small, bounded parts of the folder (``config.json``, the JSON headers of
the ``*.safetensors`` files, the shard index, the tokenizer and generation JSON files) and refuses, with
one :class:`FolderError` line naming the file and the reason, before any weight or model is allocated:

- a file that is not a regular file (a FIFO, a device, a directory named ``*.safetensors``), or a
  symlink that resolves outside the folder (the Hugging Face cache's ``snapshots/REV/x -> ../../blobs/y``
  layout is allowed: its target stays in the same cache repository); no file outside it is opened;
- ``config.json`` that is not a JSON object, or whose sizes are missing, not integers, or out of the
  bounds below (for the text config of a multimodal config too), the sizes of recurrent states included
  (:data:`STATE_BOUNDS`);
- a safetensors header whose length is beyond the file or above 100 MiB, that is not a JSON object, has
  a tensor of an unknown dtype, a shape that is not non-negative integers, data offsets that are not
  ``[begin, end]`` within the data, point into one another (overlap) or disagree with the shape;
- tensors that disagree with the config: the embedding and output matrices (``[vocab, hidden]``),
  layer indexes ``layers.N`` at or beyond ``num_hidden_layers``, a declared layer without tensors, and
  (:func:`check_declared_weights`, once transformers' model class is known) more weight values declared
  than the headers hold: no size the config declares is allocated before it is known to be stored;
- a key repeated within one JSON object of ``config.json``, the shard index or a safetensors header
  (parsers disagree on which value wins: the check could read one, the loader use the other);
- a shard index (``model.safetensors.index.json``) naming a file outside the folder (``..``, a path, an
  absolute name) or a shard that is missing;
- weights from anywhere but the files the index names (or the one weights file there is): a
  ``*.safetensors`` the index does not name, several without an index, a tensor the index places in another
  shard than the one holding it, a tensor the index names that its shard lacks or one a shard holds that
  the index does not name (:func:`weight_files` is the list every reader of the weights uses);
- weights that are not floating point (``BOOL``, integers: a boolean tensor loaded as a float weight gave
  all-zero logits; quantized checkpoints are not exported, ``--quantize`` quantizes float weights) and a
  ``quantization_config`` of any method (transformers ignored an unknown one, and the weights of a known
  one are not what the export reads);
- ``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``, ``special_tokens_map.json``
  that are not JSON objects (``tokenizer.json`` also needs its ``model``), or larger than the bounds;
- a config that would make transformers run code that is not its own (:func:`check_code_free`): an
  ``auto_map`` naming the folder's Python files (or a Hub repository's) for a model type transformers
  does not ship, an attention or MoE-experts implementation other than the torch ones
  (:data:`IMPLEMENTATIONS`: a Hub kernel name such as ``kernels-community/flash-attn`` would fetch and
  run code when the ``kernels`` package is installed). Every transformers call of the project also
  passes ``trust_remote_code=False``, so no answer on standard input can turn it on.

The bounds (:data:`CONFIG_BOUNDS`) are far above any released model and far below what would exhaust
the memory of the machine building it (a layer count of 10^6 or a vocabulary of 2^40 would).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import stat
from typing import Any

from mps_backend.errors import MPSBackendError
from mps_backend.llm.checkpoint import CheckpointError, refuse_unsupported_kind

#: config key -> (smallest, largest) accepted value. Largest released values today: 126 layers
#: (Llama 3.1 405B), hidden 16384, vocabulary 262144 (Gemma 3), context 10M (Llama 4 Scout).
CONFIG_BOUNDS = {
    "num_hidden_layers": (1, 1024),
    "hidden_size": (1, 1 << 16),
    "vocab_size": (1, 1 << 22),
    "intermediate_size": (1, 1 << 18),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "max_position_embeddings": (1, 1 << 24),
}
#: config keys sizing a recurrent layer's state (Mamba-2, the gated delta rule, short convolutions) -> (smallest,
#: largest) accepted value, where the value is a number (``"auto"`` and None are transformers'). The largest
#: released values: a state of 256 (Bamba-9B, Granite 4.0, Falcon-H1: ``mamba_d_state``), 128 heads of 64
#: (Bamba, Granite 4.0), linear-attention heads of 128 with 32 value heads (Qwen3-Next, Qwen3.5), kernels of 4
#: (LFM2: 3); the bounds are 4x to 8x those (docs/llm.md, Bounds)
STATE_BOUNDS = {
    "mamba_d_state": (1, 1024),
    "ssm_state_size": (1, 1024),
    "state_size": (1, 1024),
    "mamba_d_head": (1, 1024),
    "linear_key_head_dim": (1, 1024),
    "linear_value_head_dim": (1, 1024),
    "mamba_n_heads": (1, 1024),
    "mamba_n_groups": (1, 1024),
    "linear_num_key_heads": (1, 1024),
    "linear_num_value_heads": (1, 1024),
    "mamba_d_conv": (1, 64),
    "linear_conv_kernel_dim": (1, 64),
    "conv_L_cache": (1, 64),
    "mamba_expand": (1, 16),
}
#: the names older configs give the same sizes (GPT-2, GPT-J, Bloom, OPT, ...: transformers' attribute_map)
ALIASES = {
    "num_hidden_layers": ("n_layer", "num_layers", "n_layers"),
    "hidden_size": ("n_embd", "d_model"),
    "num_attention_heads": ("n_head", "num_heads"),
    "max_position_embeddings": ("n_positions", "max_sequence_length"),
}
REQUIRED = ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads")
#: an encoder-decoder config's per-stack sizes (Whisper, BART): the larger of the two stands for the key
#: (it bounds the layer indexes of both stacks), each checked within the key's bounds
STACKS = {
    "num_hidden_layers": ("encoder_layers", "decoder_layers"),
    "num_attention_heads": ("encoder_attention_heads", "decoder_attention_heads"),
    "max_position_embeddings": ("max_source_positions", "max_target_positions"),
}
MAX_HEADER_BYTES = 100 << 20  # a safetensors JSON header
MAX_JSON_BYTES = {"config.json": 16 << 20, "tokenizer.json": 512 << 20}
DEFAULT_MAX_JSON_BYTES = 64 << 20
#: safetensors dtypes of the weights the export reads (the rest of DTYPE_BYTES are refused as weights)
SAFETENSORS_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
#: config keys naming an attention or MoE-experts implementation -> the values accepted: the ones computed
#: by torch alone (the export and its self-check run transformers' eager attention and batched_mm experts,
#: whatever the config says); any other name is a package or a Hub kernel the project does not ship
IMPLEMENTATIONS = {
    "attn_implementation": ("eager", "sdpa"),
    "_attn_implementation": ("eager", "sdpa"),
    "experts_implementation": ("eager", "batched_mm", "grouped_mm"),
    "_experts_implementation": ("eager", "batched_mm", "grouped_mm"),
}
#: a decoder layer's tensor (not a vision or audio tower's): model.layers.N., model.language_model.layers.N.
_LAYER = re.compile(r"^(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(\d+)\.")


class FolderError(CheckpointError):
    """A checkpoint folder that must not be loaded: the message names the file and the reason."""


def _inside(folder: pathlib.Path, path: pathlib.Path) -> pathlib.Path:
    """``path`` resolved, refused if it leaves the folder (or, in a Hugging Face cache snapshot, its
    cache repository), or is not a regular file."""
    real = path.resolve()
    root = folder.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":  # hub cache: models--x--y/snapshots/REV/f -> ../../blobs/HASH
        allowed.append(root.parent.parent / "blobs")
    if not any(real == a or a in real.parents for a in allowed):
        raise FolderError(f"{path}: resolves to {real}, outside the checkpoint folder {root}")
    try:
        st = os.stat(real)
    except OSError as e:
        raise FolderError(f"{path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise FolderError(f"{path}: not a regular file (a FIFO, device or directory is not a checkpoint file)")
    return real


def _open(real: pathlib.Path):
    """Open a checked regular file without following a symlink swapped in since, nor blocking on a FIFO."""
    fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FolderError(f"{real}: not a regular file")
    return os.fdopen(fd, "rb")


class _DuplicateKey(MPSBackendError, ValueError):
    """A key given twice in one JSON object (caught here and reported as a :class:`FolderError`)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """json object_pairs_hook: a key given twice is refused (parsers disagree on which one wins: the
    check would read one value, the loader may use the other)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _loads(data: bytes, unique: bool) -> Any:
    return json.loads(data, object_pairs_hook=_unique_keys) if unique else json.loads(data)


#: files whose objects must not repeat a key (tokenizer files are left to the tokenizer's own parser)
UNIQUE_KEY_FILES = ("config.json", "model.safetensors.index.json")


def _json_object(folder: pathlib.Path, name: str, *, required: bool = False) -> dict | None:
    path = folder / name
    if not os.path.lexists(path):
        if required:
            raise FolderError(f"{folder}: no {name}")
        return None
    real = _inside(folder, path)
    limit = MAX_JSON_BYTES.get(name, DEFAULT_MAX_JSON_BYTES)
    with _open(real) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FolderError(f"{path}: larger than {limit >> 20} MiB")
    try:
        value = _loads(data, name in UNIQUE_KEY_FILES)
    except _DuplicateKey as e:
        raise FolderError(f"{path}: key {str(e)[:120]!r} appears twice in one JSON object") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise FolderError(f"{path}: not valid JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(value, dict):
        raise FolderError(f"{path}: not a JSON object")
    return value


def _bounded_int(config: dict, key: str, where: str, *, required: bool, bounds: tuple[int, int] | None = None) -> int | None:
    if key not in config or config[key] is None:
        if required:
            raise FolderError(f"{where}: no {key!r}")
        return None
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise FolderError(f"{where}: {key} is {value!r}, not an integer")
    low, high = bounds or CONFIG_BOUNDS[key]
    if not low <= value <= high:
        raise FolderError(f"{where}: {key} = {value} outside [{low}, {high}]")
    return value


def config_attribute_map(model_type: Any) -> dict[str, str]:
    """The names a model type's config class gives the standard sizes (transformers' ``attribute_map``,
    e.g. MPT's ``{"num_attention_heads": "n_heads"}``); empty for an unknown type or without transformers."""
    if not isinstance(model_type, str):
        return {}
    try:
        from transformers import CONFIG_MAPPING  # noqa: PLC0415
    except ImportError:
        return {}
    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError:
        return {}
    found = getattr(cls, "attribute_map", None)
    return dict(found) if isinstance(found, dict) else {}


def check_config(config: dict, where: str) -> dict[str, int]:
    """The bounded sizes of a config (its text config for a multimodal one); raise :class:`FolderError`."""
    text = config.get("text_config")
    if text is not None:
        if not isinstance(text, dict):
            raise FolderError(f"{where}: text_config is not an object")
        config, where = {**{k: v for k, v in config.items() if k in CONFIG_BOUNDS}, **text}, f"{where} text_config"
    for key, names in STACKS.items():
        if config.get(key) is None and any(config.get(n) is not None for n in names):
            values = [_bounded_int(config, n, where, required=False, bounds=CONFIG_BOUNDS[key]) for n in names]
            if key == "num_attention_heads" and isinstance(config.get("d_model"), int):
                for n, v in zip(names, values):
                    if v and config["d_model"] % v:
                        raise FolderError(f"{where}: d_model {config['d_model']} is not a multiple of {n} {v}")
            config = {**config, key: max(v for v in values if v is not None)}
    own = config_attribute_map(config.get("model_type"))
    for key in CONFIG_BOUNDS:
        if config.get(key) is None:
            # the model type's own name for the size first (transformers' attribute_map: MPT's n_heads,
            # XGLM's attention_heads), then the names older configs share
            names = ((own[key],) if isinstance(own.get(key), str) else ()) + ALIASES.get(key, ())
            alias = next((n for n in names if config.get(n) is not None), None)
            if alias is not None:
                config = {**config, key: config[alias]}
    sizes = {}
    for key in CONFIG_BOUNDS:
        value = _bounded_int(config, key, where, required=key in REQUIRED)
        if value is not None:
            sizes[key] = value
    for key, (low, high) in STATE_BOUNDS.items():  # a recurrent state's sizes, where numbers
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not low <= value <= high:
            raise FolderError(f"{where}: {key} = {value} outside [{low}, {high}] (it sizes a recurrent layer's state)")
    heads, kv = sizes["num_attention_heads"], sizes.get("num_key_value_heads")
    if kv is not None and heads % kv:
        raise FolderError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    if "head_dim" not in sizes and sizes["hidden_size"] % heads:
        raise FolderError(f"{where}: hidden_size {sizes['hidden_size']} is not a multiple of num_attention_heads {heads}")
    return sizes


def _objects(value: Any, depth: int = 0):
    """Every JSON object in ``value`` (itself and nested ones: sub-configs such as ``text_config``)."""
    if depth > 32:
        return
    if isinstance(value, dict):
        yield value
        for v in value.values():
            yield from _objects(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _objects(v, depth + 1)


def native_model_type(model_type: Any) -> bool:
    """Whether transformers ships the configuration and modeling code of ``model_type``."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # noqa: PLC0415 - a dict of names

    return isinstance(model_type, str) and model_type in CONFIG_MAPPING_NAMES


def check_code_free(config: dict, where: str) -> None:
    """Refuse (:class:`FolderError`) a config with which transformers would run code it does not ship:
    ``auto_map`` (custom code in the folder, or in a Hub repository for ``repo--module.Class``) for a model
    type transformers has no code for, and an implementation key (:data:`IMPLEMENTATIONS`) naming
    anything but the torch ones, in the config or any sub-config. An ``auto_map`` beside a model type
    transformers ships (Phi-3's hub configs have one) is left to transformers, which, with
    ``trust_remote_code=False``, uses its own code and never imports the folder's."""
    model_type = config.get("model_type")
    for obj in _objects(config):
        auto_map = obj.get("auto_map")
        if auto_map is not None and not native_model_type(model_type):
            names = list(auto_map.values()) if isinstance(auto_map, dict) else [auto_map]
            raise FolderError(
                f"{where}: auto_map names custom code ({str(names[0])[:80]}) for model type {str(model_type)[:40]!r}, "
                "which transformers does not ship: code from a checkpoint folder or the Hub is never run"
            )
        for key, allowed in IMPLEMENTATIONS.items():
            value = obj.get(key)
            for v in value.values() if isinstance(value, dict) else [value]:
                if v is not None and v not in allowed:
                    raise FolderError(
                        f"{where}: {key} {str(v)[:80]!r} is not one of {', '.join(allowed)}: the export computes with "
                        "torch's own implementations (a kernel from the Hub or another package is never loaded)"
                    )


def check_safetensors(path: pathlib.Path, real: pathlib.Path, sizes: dict[str, int] | None = None) -> dict[str, list[int]]:
    """Tensor name -> shape of a safetensors file, its header checked against the file (and, with
    ``sizes``, against the config); raise :class:`FolderError`."""
    with _open(real) as f:
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
    try:
        header = _loads(raw, True)
    except _DuplicateKey as e:
        raise FolderError(f"{path}: safetensors header names {str(e)[:120]!r} twice") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise FolderError(f"{path}: safetensors header is not JSON ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(header, dict):
        raise FolderError(f"{path}: safetensors header is not a JSON object")
    data_size = file_size - 8 - n
    spans = []
    shapes = {}
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
        if dtype not in SAFETENSORS_FLOAT_DTYPES:
            raise FolderError(
                f"{at}: dtype {dtype} is not floating point ({', '.join(SAFETENSORS_FLOAT_DTYPES)}): a language model's weights "
                "are float (quantized checkpoints are not exported; --quantize int4|int8 quantizes float weights)"
            )
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
        spans.append((offsets[0], offsets[1], name))
        shapes[name] = shape
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise FolderError(f"{path}: tensors {a[:200]!r} and {b[:200]!r} overlap in the file")
    if sizes:
        _check_shapes(path, shapes, sizes)
    return shapes


def _check_shapes(path: pathlib.Path, shapes: dict[str, list[int]], sizes: dict[str, int]) -> None:
    vocab, hidden, layers = sizes["vocab_size"], sizes["hidden_size"], sizes["num_hidden_layers"]
    for name, shape in shapes.items():
        m = _LAYER.search(name)
        if m and int(m.group(1)) >= layers:
            raise FolderError(f"{path}: tensor {name!r} is of layer {m.group(1)}, the config has {layers} layers")
        if name.endswith(("embed_tokens.weight", "lm_head.weight", "wte.weight")) and shape != [vocab, hidden]:
            # a vocabulary padded beyond the config's (some checkpoints) is not something we load either
            raise FolderError(f"{path}: tensor {name!r} has shape {shape}, the config says [{vocab}, {hidden}]")


def check_quantization_config(config: dict, where: str) -> None:
    """Refuse a ``quantization_config`` (in the config or a sub-config), of whatever method: the export reads
    float weights and quantizes them itself (``--quantize``)."""
    for obj in _objects(config):
        q = obj.get("quantization_config")
        if q is not None:
            method = q.get("quant_method", "?") if isinstance(q, dict) else q
            raise FolderError(
                f"{where}: quantization_config of method {str(method)[:40]!r}: pre-quantized checkpoints are not "
                "exported (export the float checkpoint; --quantize int4|int8 quantizes it)"
            )


INDEX = "model.safetensors.index.json"


def _index_map(folder: pathlib.Path) -> dict[str, str] | None:
    """The shard index's tensor -> file name map (each name a file of the folder), or None without an index."""
    index = _json_object(folder, INDEX)
    if index is None:
        return None
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise FolderError(f"{folder / INDEX}: no weight_map object")
    for shard in set(weight_map.values()):
        if not isinstance(shard, str) or not shard or os.path.basename(shard) != shard or shard in (".", ".."):
            raise FolderError(f"{folder / INDEX}: shard {str(shard)[:200]!r} is not a file name in the folder")
    return weight_map


def weight_files(folder: str | pathlib.Path) -> list[pathlib.Path]:
    """The weights files of a checkpoint folder, the only ones any reader of its weights opens: those the
    shard index names, else the one ``*.safetensors`` file. A weights file the index does not name, or
    several without an index, is a :class:`FolderError` (every file was read and the last tensor of a name
    won: a stray file replaced the real weights)."""
    folder = pathlib.Path(folder)
    present = {p.name: p for p in sorted(folder.glob("*.safetensors"))}
    for p in present.values():
        _inside(folder, p)  # a link out of the folder, a FIFO: refused whether named or not
    weight_map = _index_map(folder)
    if weight_map is None:
        if len(present) > 1:
            raise FolderError(
                f"{folder}: {len(present)} weights files ({', '.join(sorted(present)[:3])}{', ...' if len(present) > 3 else ''}) "
                f"and no {INDEX} saying which to read: keep one, or add the index"
            )
        return list(present.values())
    named = sorted(set(weight_map.values()))
    for shard in named:
        if shard not in present:
            raise FolderError(f"{folder}: shard {shard!r} named by {INDEX} is missing")
    stray = sorted(set(present) - set(named))
    if stray:
        raise FolderError(
            f"{folder / stray[0]}: a weights file {INDEX} does not name: its tensors would not be read; "
            "move it out of the checkpoint folder (or name it in the index)"
        )
    return [present[n] for n in named]


def check_folder_weights(folder: str | pathlib.Path) -> tuple[dict[str, int], dict[str, list[int]]]:
    """Check the checkpoint folder (module docstring); return the config's bounded sizes and the shape of
    each tensor of its weights files (from their headers)."""
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise FolderError(f"{folder}: not a checkpoint folder")
    config = _json_object(folder, "config.json", required=True)
    assert config is not None
    check_code_free(config, f"{folder / 'config.json'}")  # first: nothing else matters if code would run
    check_quantization_config(config, f"{folder / 'config.json'}")
    refuse_unsupported_kind(folder, config)
    sizes = check_config(config, f"{folder / 'config.json'}")
    files = weight_files(folder)
    weight_map = _index_map(folder)
    shapes: dict[str, list[int]] = {}
    for path in files:
        held = check_safetensors(path, _inside(folder, path), sizes)
        for name in held:
            if weight_map is not None and weight_map.get(name) != path.name:
                said = f"in {weight_map[name]!r}" if name in weight_map else "nowhere"
                raise FolderError(f"{path}: holds tensor {name[:200]!r}, which {INDEX} places {said}")
        shapes.update(held)
    for name, shard in (weight_map or {}).items():
        if name not in shapes:
            raise FolderError(f"{folder / shard}: has no tensor {str(name)[:200]!r}, which {INDEX} places there")
    _check_layers_present(folder, shapes, sizes["num_hidden_layers"])
    tok = _json_object(folder, "tokenizer.json")
    if tok is not None and not isinstance(tok.get("model"), dict):
        raise FolderError(f"{folder / 'tokenizer.json'}: not a tokenizer (no 'model' object)")
    for name in ("tokenizer_config.json", "generation_config.json", "special_tokens_map.json"):
        _json_object(folder, name)
    for name in ("tokenizer.model",):
        if os.path.lexists(folder / name):
            _inside(folder, folder / name)
    return sizes, shapes


def _check_layers_present(folder: pathlib.Path, shapes: dict[str, list[int]], layers: int) -> None:
    """Every decoder layer the config declares has tensors in the weights files (when the files name their
    layers ``model.layers.N.``): a 16 KB folder declaring 1024 layers with one stored tensor ran until memory
    ran out, transformers building every missing weight before its own check."""
    held = {int(m.group(1)) for m in map(_LAYER.search, shapes) if m}
    if held and len(held) < layers:
        missing = [i for i in range(layers) if i not in held]
        run = missing == list(range(missing[0], missing[-1] + 1))
        shown = str(missing[0]) if len(missing) == 1 else f"{missing[0]}-{missing[-1]}" if run else str(missing[:8])[1:-1]
        raise FolderError(
            f"{folder}: config.json declares {layers} layers, the weights files hold tensors of {len(held)}: "
            f"no weights for layer{'s' if len(missing) > 1 else ''} {shown}"
        )


def check_declared_weights(folder: pathlib.Path, model_class: Any, config: Any, shapes: dict[str, list[int]]) -> None:
    """Refuse, before transformers allocates anything, a model that declares more weight values than the
    weights files hold (their headers, ``shapes``): transformers builds every weight it does not find, so a
    config declaring far more than is stored (a hidden size of 65536 beside small tensors, ...) ran until
    memory ran out. The model is built on the meta device (no storage, seconds even at the bounds)."""
    import copy  # noqa: PLC0415
    import math  # noqa: PLC0415

    import torch  # noqa: PLC0415

    with torch.device("meta"):
        model = model_class(copy.deepcopy(config))  # a copy: the constructor writes into its config
    declared = {name: p.numel() for name, p in model.named_parameters()}  # tied weights counted once
    stored = sum(math.prod(s) for s in shapes.values())
    if sum(declared.values()) > stored:
        missing = [n for n in declared if n not in shapes]
        raise FolderError(
            f"{folder}: the config declares {sum(declared.values()):,} weight values, the weights files hold {stored:,}"
            + (
                f": no weights for {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                if missing
                else ""
            )
        )


def check_folder(folder: str | pathlib.Path) -> dict[str, int]:
    """Check the checkpoint folder (module docstring); return the config's bounded sizes."""
    return check_folder_weights(folder)[0]


def check_tokenizer_json(path: str | pathlib.Path) -> Any:
    """``tokenizer.json`` parsed as a bounded JSON object with its ``model``; raise :class:`FolderError`."""
    path = pathlib.Path(path)
    tok = _json_object(path.parent, path.name)
    if tok is None or not isinstance(tok.get("model"), dict):
        raise FolderError(f"{path}: not a tokenizer (no 'model' object)")
    return tok
