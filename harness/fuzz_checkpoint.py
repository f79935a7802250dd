"""Seeded fuzzing of ``hf:`` checkpoint folders through the export's real loading path, each case in a
worker process under an address-space limit and a time limit.

    python -m harness.fuzz_checkpoint --cases 10000 [--seed 1] [--crash-dir DIR]
        [--kind folders|gguf|templates|processors|images|audio|all]

Bases: tiny random checkpoints written here with ``save_pretrained`` (a llama in float16 in one file, a
llama in float32 in shards with ``model.safetensors.index.json``, a qwen2 with biases and tied
embeddings). Each case is one base folder with one or more of: a mutated safetensors header (its length
field, a tensor's dtype, shape or data offsets, a renamed, dropped or duplicated tensor, bytes of the
JSON text, a truncated or extended file), a mutated ``config.json`` (a value of the wrong type or out of
range, a dropped key, bytes of the JSON text), a mutated shard index or ``generation_config.json``, and
the hostile kinds of #38 (:func:`_mutate_hostile`): an ``auto_map`` naming Python files in the folder that
write a marker when imported, an attention or experts implementation naming a Hub kernel, an extra or
unnamed weights file, a tensor retyped to ``BOOL`` or an integer dtype (its size kept consistent), a
``quantization_config`` block, and tensors or layers the config or the index declares but no file holds.
The case goes through :func:`mps_backend.llm.export.export_llm` up to the end of its load-and-check step
(the folder check, transformers' config and model construction, the weights, the KV-cache bound): the
worker replaces ``program_methods``, the first step after it, by a stop, so a case costs a load, not an export.

``--kind`` fuzzes the other inputs instead (:mod:`harness.fuzz_inputs`: GGUF files, chat templates, image
processor configs, image files, WAV files), the same way.

Outcomes: the load finished (``ok``), or a typed error of the project (an ``MPSBackendError``: ``typed
CLASS``), both allowed; anything else fails the campaign: another exception (``UNTYPED``), a result out of
its bounds (``WRONG``: the audio kind's samples or features), the worker dying (``CRASH``: a signal, an
abort, the address-space limit), not answering within the time limit
(``HANG``), or code of the folder having run (``CODE RAN``: its marker file written, or a Python file in the
worker's Hugging Face modules cache, which points into the campaign's temporary folder). A failing
case's folder is copied to ``--crash-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import child_env
from harness.fuzz_pte import _limit  # the same address-space limit (24 GiB) and no core files

CASE_SECONDS = 60.0  # a load of these tiny folders takes well under a second; beyond this is a hang
STARTUP_SECONDS = 600.0  # a worker's imports (torch, executorch, transformers) on a loaded machine

#: config keys the mutations set (the bounded sizes, and what transformers reads to build the model)
CONFIG_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "vocab_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "model_type",
    "architectures",
    "torch_dtype",
    "dtype",
    "tie_word_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rms_norm_eps",
    "hidden_act",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "attention_bias",
    "mlp_bias",
    "text_config",
    "sliding_window",
    "use_sliding_window",
    "layer_types",
    "initializer_range",
)
WEIRD = (
    0,
    -1,
    1,
    2,
    3,
    7,
    1 << 31,
    1 << 63,
    1 << 64,
    10**6,
    1e308,
    -0.0,
    0.5,
    float("inf"),
    float("nan"),
    "",
    "x",
    "llama",
    "float16",
    "bfloat16",
    "float8_e4m3fn",
    "int64",
    None,
    True,
    False,
    [],
    {},
    [1, 2],
    ["x"],
    [-1],
    {"rope_type": "llama3"},
    {"rope_type": "linear", "factor": 0},
    {"rope_type": "yarn", "factor": "x"},
    {"rope_type": "nope"},
    {"num_hidden_layers": 10**9},
)
DTYPES = ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "Q4", "", 16, None, ["F16"])


def _save(folder: Path, cls: str, dtype: Any, shard: str | None, **config: Any) -> None:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    common = dict(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**(common | config))).eval()
    kwargs = {"max_shard_size": shard} if shard else {}
    model.to(dtype).save_pretrained(folder, **kwargs)


def bases(root: Path) -> dict[str, Path]:
    """The checkpoint folders the cases are made from (deterministic), written under ``root``."""
    import torch  # noqa: PLC0415

    out = {
        "llama_fp16": root / "llama_fp16",
        "llama_fp32_sharded": root / "llama_fp32_sharded",
        "qwen2_tied": root / "qwen2_tied",
    }
    _save(out["llama_fp16"], "LlamaConfig", torch.float16, None)
    _save(out["llama_fp32_sharded"], "LlamaConfig", torch.float32, "4KB")
    _save(out["qwen2_tied"], "Qwen2Config", torch.float16, None, tie_word_embeddings=True)
    assert (out["llama_fp32_sharded"] / "model.safetensors.index.json").is_file()
    return out


# ---------------------------------------------------------------- mutations


def _split(data: bytes) -> tuple[dict, bytes] | None:
    n = int.from_bytes(data[:8], "little")
    try:
        return json.loads(data[8 : 8 + n]), data[8 + n :]
    except ValueError:
        return None


def _join(header: dict, rest: bytes, rng: random.Random) -> bytes:
    raw = json.dumps(header).encode()
    n = len(raw)
    if rng.random() < 0.1:  # a length field that disagrees with the header
        n = rng.choice((n - 1, n + 1, n + 8, 0))
    return max(n, 0).to_bytes(8, "little") + raw + rest


def _weird_dim(rng: random.Random, d: int) -> Any:
    return rng.choice((d + 1, d - 1, 0, -d, d * 2, 1 << 40, 1 << 62, float(d), str(d), None, [d]))


def _mutate_header_entry(rng: random.Random, header: dict) -> str:
    def intact(k: str) -> bool:
        v = header[k]
        if not isinstance(v, dict) or not isinstance(v.get("shape"), list) or not isinstance(v.get("data_offsets"), list):
            return False
        return (
            all(type(d) is int for d in v["shape"])
            and len(v["data_offsets"]) == 2
            and all(type(o) is int for o in v["data_offsets"])
        )

    names = [k for k in header if k != "__metadata__" and intact(k)]
    if not names:  # an earlier mutation of this case broke every entry
        header[f"x{rng.randrange(9)}"] = {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}
        return "add tensor"
    name = rng.choice(names)
    info = header[name]
    kind = rng.randrange(9)
    if kind == 0:
        info["dtype"] = rng.choice(DTYPES)
        return "dtype"
    if kind == 1:
        shape = info["shape"]
        if shape and rng.random() < 0.7:
            i = rng.randrange(len(shape))
            shape[i] = _weird_dim(rng, shape[i])
        else:
            info["shape"] = rng.choice(([], [1] * 9, shape + [1], shape[:-1], "x", None, {"a": 1}))
        return "shape"
    if kind == 2:
        a, b = info["data_offsets"]
        info["data_offsets"] = rng.choice(
            (
                [a, b + 2],
                [a - 2, b],
                [b, a],
                [a + 1, b + 1],
                [-8, b],
                [a, 1 << 62],
                [a, b, b],
                [a],
                [float(a), b],
                None,
                [0, b - a],
            )
        )
        return "offsets"
    if kind == 3:  # point into another tensor's bytes (overlap) with a consistent size
        other = header[rng.choice(names)]["data_offsets"]
        a, b = info["data_offsets"]
        info["data_offsets"] = [other[0], other[0] + (b - a)]
        return "overlap"
    if kind == 4:
        del header[name]
        return "drop tensor"
    if kind == 5:
        new = rng.choice(
            (
                name.replace("layers.0.", "layers.7."),
                name.replace("layers.1.", "layers.-1."),
                name.replace("layers.1.", "layers.99999999999999999999."),
                name + ".extra",
                name.replace("weight", "bias"),
                "lm_head.weight",
                "model.embed_tokens.weight",
                "",
                "\u00ff" * 3,
            )
        )
        header[new] = header.pop(name)
        return "rename tensor"
    if kind == 6:
        header["__metadata__"] = rng.choice(({"format": 1}, [], "pt", {"format": "pt", "x": None}, None))
        return "metadata"
    if kind == 7:
        header[name] = rng.choice(([], "x", None, 1, {}, {"dtype": "F16"}))
        return "entry type"
    info[rng.choice(("dtype", "shape", "data_offsets"))] = rng.choice(WEIRD)
    return "field value"


def _mutate_safetensors(rng: random.Random, path: Path) -> str:
    data = path.read_bytes()
    if len(data) < 9:  # an earlier mutation of this case truncated it
        path.write_bytes(data + bytes(rng.randint(1, 16)))
        return "st extend"
    kind = rng.randrange(6)
    if kind == 0:  # the length field
        n = rng.choice((0, 1, 2, 7, len(data), len(data) - 8, 1 << 32, (1 << 63) + 5, (1 << 64) - 1, rng.randrange(1 << 16)))
        path.write_bytes((n % (1 << 64)).to_bytes(8, "little") + data[8:])
        return "st length"
    if kind == 1:  # bytes of the JSON text (structure characters, digits)
        n = min(int.from_bytes(data[:8], "little"), len(data) - 8)  # an earlier mutation may have changed it
        if n < 1:
            path.write_bytes(data + b"{}")
            return "st extend"
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            b[8 + rng.randrange(n)] = rng.choice((*b'"[]{},:-0919e.\\ ', 0x00, 0xFF, rng.randrange(256)))
        path.write_bytes(bytes(b))
        return "st json byte"
    if kind == 2:
        cut = rng.choice((rng.randrange(len(data)), len(data) - 1, 8, 4))
        path.write_bytes(data[:cut])
        return "st truncate"
    if kind == 3:
        path.write_bytes(data + bytes(rng.randint(1, 64)))
        return "st extend"
    split = _split(data)
    if split is None or not isinstance(split[0], dict) or not any(k != "__metadata__" for k in split[0]):
        path.write_bytes(data + b"\0")  # an earlier mutation of this case broke the header
        return "st extend"
    header, rest = split
    what = _mutate_header_entry(rng, header)
    if kind == 5:
        what += " + " + _mutate_header_entry(rng, header) if len(header) > 1 else ""
    path.write_bytes(_join(header, rest, rng))
    return f"st {what}"


def _mutate_json(rng: random.Random, path: Path, keys: tuple[str, ...]) -> str:
    text = path.read_bytes().decode(errors="replace")
    kind = rng.randrange(5)
    if kind == 0:
        b = bytearray(text.encode()) or bytearray(b"{}")
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.choice((*b'"[]{},:-0919e.', 0xFF, rng.randrange(32, 127)))
        path.write_bytes(bytes(b))
        return f"{path.name} byte"
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):  # an earlier mutation of this case broke it: another byte then
        return _mutate_json(rng, path, keys) if kind else f"{path.name} byte"
    if kind == 1 and obj:
        obj.pop(rng.choice(list(obj)))
        what = "drop key"
    elif kind == 2:
        obj = rng.choice(([], "x", None, 1, [obj]))
        what = "not an object"
    else:
        for _ in range(rng.randint(1, 3)):
            obj[rng.choice(keys)] = rng.choice(WEIRD)
        what = "value"
    raw = json.dumps(obj, allow_nan=True)
    if rng.random() < 0.05:  # a repeated key
        raw = raw[:-1] + ', "num_hidden_layers": 2}' if raw.endswith("}") else raw
    path.write_text(raw)
    return f"{path.name} {what}"


def _mutate_index(rng: random.Random, path: Path) -> str:
    try:
        obj = json.loads(path.read_text())
    except ValueError:
        obj = None
    wm = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(wm, dict) or not wm:  # an earlier mutation of this case broke it
        return _mutate_json(rng, path, ("weight_map", "metadata"))
    name = rng.choice(list(wm))
    kind = rng.randrange(6)
    if kind == 0:
        wm[name] = rng.choice(
            ("../x.safetensors", "/etc/passwd", "model-00099-of-00099.safetensors", "", ".", "..", 3, None, "sub/x")
        )
    elif kind == 1:
        del wm[name]
    elif kind == 2:
        obj["weight_map"] = rng.choice(([], None, "x", {}))
    elif kind == 3:
        obj["metadata"] = rng.choice(({"total_size": -1}, {"total_size": "x"}, None, [], {"total_size": 1 << 70}))
    elif kind == 4:
        del obj["weight_map"]
    else:
        return _mutate_json(rng, path, ("weight_map", "metadata"))
    path.write_text(json.dumps(obj))
    return f"index {('value', 'drop entry', 'map type', 'metadata', 'no map')[kind]}"


#: the file a case folder's Python writes when imported (it must never appear)
CODE_MARKER = "CODE_RAN"
#: the Python an auto_map names: importing it writes the marker beside it
FOLDER_CODE = "import pathlib\npathlib.Path(__file__).with_name('CODE_RAN').write_text('the folder\\'s code ran')\n"
#: what the hostile mutations put where a config names code, kernels or a quantization
AUTO_MAPS = (
    {"AutoConfig": "configuration_fuzz.FuzzConfig", "AutoModelForCausalLM": "modeling_fuzz.FuzzForCausalLM"},
    {"AutoModelForCausalLM": "modeling_fuzz.FuzzForCausalLM"},
    {"AutoConfig": "someone/repo--configuration_fuzz.FuzzConfig"},
    "configuration_fuzz.FuzzConfig",
    [],
)
IMPLEMENTATIONS = (
    "kernels-community/flash-attn",
    "flash_attention_2",
    "paged|eager",
    "eager",
    "sdpa",
    "batched_mm",
    3,
    {"": "x/y"},
)
QUANTIZATIONS = (
    {"quant_method": "nope"},
    {"quant_method": "fp8", "weight_block_size": [128, 128]},
    {"quant_method": "bitsandbytes", "load_in_8bit": True},
    {"quant_method": "gptq", "bits": 4},
    {"quant_method": 7},
    "x",
    [],
)
#: safetensors dtypes a float tensor is retyped to (the shape changed so that the byte size stays right)
RETYPES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "F64": 8}


def _json_dict(path: Path) -> dict | None:
    try:
        obj = json.loads(path.read_text())
    except (ValueError, OSError):
        return None
    return obj if isinstance(obj, dict) else None


def _header_of(path: Path) -> tuple[dict, bytes] | None:
    split = _split(path.read_bytes()) if path.is_file() else None
    return split if split is not None and isinstance(split[0], dict) else None


def _write_header(path: Path, header: dict, rest: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + rest)


def _mutate_hostile(rng: random.Random, folder: Path) -> str:
    """One of #38's hostile mutations of the folder (module docstring); returns what was done."""
    config = _json_dict(folder / "config.json")
    shards = sorted(folder.glob("*.safetensors"))
    kind = rng.randrange(7)
    if kind <= 2 and config is not None:  # code, kernels, quantization: config.json blocks
        target = config["text_config"] if isinstance(config.get("text_config"), dict) and rng.random() < 0.3 else config
        if kind == 0:
            target["auto_map"] = rng.choice(AUTO_MAPS)
            if rng.random() < 0.5:
                config["model_type"] = rng.choice(("fuzzmodel", "", "llama"))
            for name in ("configuration_fuzz.py", "modeling_fuzz.py"):
                (folder / name).write_text(FOLDER_CODE)
            what = "auto_map"
        elif kind == 1:
            target[rng.choice(("_attn_implementation", "attn_implementation", "experts_implementation"))] = rng.choice(
                IMPLEMENTATIONS
            )
            what = "implementation"
        else:
            target["quantization_config"] = rng.choice(QUANTIZATIONS)
            what = "quantization block"
        (folder / "config.json").write_text(json.dumps(config))
        return what
    if kind == 3 and shards:  # an extra or unnamed weights file
        src = rng.choice(shards)
        name = rng.choice(
            [n for n in ("extra.safetensors", "consolidated.safetensors", "model-zeros.safetensors") if n != src.name]
        )
        split = _header_of(src)
        if split is not None and rng.random() < 0.5:  # one tensor of the real ones, zeroed
            header, rest = split
            names = [k for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
            if names:
                tname = rng.choice(names)
                entry = dict(header[tname])
                offsets = entry.get("data_offsets")
                n = (
                    offsets[1] - offsets[0]
                    if isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                    else 0
                )
                _write_header(folder / name, {tname: {**entry, "data_offsets": [0, max(n, 0)]}}, bytes(max(n, 0)))
                return "extra shard (zeroed tensor)"
        shutil.copyfile(src, folder / name)
        return "extra shard (copy)"
    if kind == 4 and shards:  # a float tensor retyped, its byte size kept
        path = rng.choice(shards)
        split = _header_of(path)
        if split is not None:
            header, rest = split
            sizes = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
            names = [
                k
                for k, v in header.items()
                if isinstance(v, dict)
                and isinstance(v.get("dtype"), str)  # an earlier mutation may have made it a list or an object
                and v.get("dtype") in sizes
                and isinstance(v.get("shape"), list)
                and v["shape"]
                and all(type(d) is int for d in v["shape"])
            ]
            if names:
                entry = header[rng.choice(names)]
                new = rng.choice(list(RETYPES))
                ratio_num, ratio_den = sizes[entry["dtype"]], RETYPES[new]
                last = entry["shape"][-1] * ratio_num
                if last % ratio_den == 0:
                    entry["shape"][-1] = last // ratio_den
                    entry["dtype"] = new
                    _write_header(path, header, rest)
                    return f"retype {new}"
    # declared but missing: layers, tensors of a layer, a tensor only the index names, larger sizes
    if config is not None and rng.random() < 0.5:
        key = rng.choice(("num_hidden_layers", "num_hidden_layers", "intermediate_size", "vocab_size"))
        value = config.get(key)
        if type(value) is int:
            config[key] = rng.choice((value + 1, value * 2, 64, 1024))
            (folder / "config.json").write_text(json.dumps(config))
            return f"declared {key}"
    index = _json_dict(folder / "model.safetensors.index.json")
    if index is not None and isinstance(index.get("weight_map"), dict) and index["weight_map"] and rng.random() < 0.5:
        wm = index["weight_map"]
        wm[rng.choice(("model.layers.0.mlp.extra.weight", "lm_head.bias", "model.norm.bias"))] = rng.choice(list(wm.values()))
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        return "declared in index"
    for path in rng.sample(shards, len(shards)):
        split = _header_of(path)
        if split is None:
            continue
        header, rest = split
        layers = sorted({k.split(".")[2] for k in header if k.startswith("model.layers.") and k.count(".") > 2})
        if layers:
            gone = rng.choice(layers)
            _write_header(path, {k: v for k, v in header.items() if not k.startswith(f"model.layers.{gone}.")}, rest)
            return "missing layer tensors"
    return "no hostile mutation applicable"


def mutate(rng: random.Random, folder: Path) -> list[str]:
    """Mutate the files of a copied base folder in place; returns what was done."""
    done = []
    shards = sorted(folder.glob("*.safetensors"))
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        target = rng.randrange(14)
        if target >= 10:
            done.append(_mutate_hostile(rng, folder))
        elif target < 5:
            done.append(_mutate_safetensors(rng, rng.choice(shards)))
        elif target < 8:
            done.append(_mutate_json(rng, folder / "config.json", CONFIG_KEYS))
        elif target == 8 and (folder / "model.safetensors.index.json").is_file():
            done.append(_mutate_index(rng, folder / "model.safetensors.index.json"))
        else:
            gen = folder / "generation_config.json"
            done.append(_mutate_json(rng, gen, ("bos_token_id", "eos_token_id", "pad_token_id", "max_length")))
    return done


# ---------------------------------------------------------------- the worker


class _Loaded(BaseException):  # not an Exception: the export turns those into one-line refusals
    """Raised in place of the export's first step after loading: the case loaded and passed its checks."""


def _stop(*_args: Any, **_kwargs: Any) -> Any:
    raise _Loaded


def run_case(folder: Path, dtype: str) -> str:
    """``export_llm`` of ``hf:folder`` up to the end of its load-and-check step: 'ok', 'typed CLASS' or
    'UNTYPED CLASS: message'."""
    from mps_backend.errors import MPSBackendError  # noqa: PLC0415
    from mps_backend.llm.export import export_llm  # noqa: PLC0415

    try:
        export_llm(f"hf:{folder}", folder / "out.pte", prefill_chunk=1, dtype=dtype, verify_steps=0)
        return "UNTYPED: the export ran past its load step"  # the stop was not reached
    except _Loaded:
        return "ok"
    except MPSBackendError as e:
        if "\n" in str(e).strip():
            return f"UNTYPED multi-line {type(e).__name__}: {str(e)[:300]}"
        return f"typed {type(e).__name__}"
    except Exception as e:  # noqa: BLE001 - classified by the caller
        return f"UNTYPED {type(e).__name__}: {str(e)[:300]}"


def worker(kind: str = "folders") -> None:
    """Read one JSON case a line from stdin (``{"path", "dtype", "shared"}``), answer one JSON line per case."""
    import warnings  # noqa: PLC0415

    import mps_backend.llm.export as llm_export  # noqa: PLC0415
    from harness import fuzz_inputs  # noqa: PLC0415

    warnings.simplefilter("ignore")
    llm_export.program_methods = _stop  # this worker process only: the stop after the load-and-check step
    import executorch.exir  # noqa: F401, PLC0415 - what the first case would import: not counted in its time
    import transformers  # noqa: F401, PLC0415

    if kind != "folders":
        fuzz_inputs.worker_setup(kind)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        case = json.loads(line)
        if kind == "folders":
            result = run_case(Path(case["path"]), case["dtype"])
        else:
            result = fuzz_inputs.run_input_case(kind, Path(case["path"]), case.get("shared", {}), _Loaded)
        print(json.dumps({"result": result}), flush=True)


class _Worker:
    def __init__(self, hf_home: Path, kind: str = "folders") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.fuzz_checkpoint", "--worker", "--kind", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=child_env(
                TRANSFORMERS_OFFLINE="1",
                HF_HUB_OFFLINE="1",
                HF_HOME=str(hf_home),
                HF_MODULES_CACHE=str(hf_home / "modules"),
            ),
            preexec_fn=_limit,
        )
        self.buffer = b""
        if self._answer(STARTUP_SECONDS) is None:  # the imports; each case's time limit starts after them
            raise RuntimeError(f"the fuzz worker did not start within {STARTUP_SECONDS:.0f} s")

    def _answer(self, seconds: float) -> dict | None:
        """The worker's next JSON line, None if it died; {'result': 'HANG'} past ``seconds`` (then killed)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + seconds
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                self.proc.wait()
                return {"result": "HANG"}
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.proc.wait()
                    return None
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def run(self, case: dict, seconds: float) -> str:
        """The case's result, 'CRASH (exit N)' if the worker died on it, 'HANG' past ``seconds``
        (the worker is then killed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps(case) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        answer = self._answer(seconds)
        return f"CRASH (exit {self.proc.returncode})" if answer is None else answer["result"]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def campaign(cases: int, seed: int, crash_dir: Path | None = None, progress: bool = False, kind: str = "folders") -> dict:
    """Run ``cases`` mutated inputs of ``kind`` (``folders``: hf: checkpoint folders; the kinds of
    :mod:`harness.fuzz_inputs`); returns counts, failures and the time taken."""
    from harness import fuzz_inputs  # noqa: PLC0415

    start = time.monotonic()
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    kinds: dict[str, int] = {}
    failures: list[dict] = []
    seconds = CASE_SECONDS if kind == "folders" else fuzz_inputs.CASE_SECONDS[kind]
    with tempfile.TemporaryDirectory(prefix="fuzz-ckpt-") as tmp:
        root = Path(tmp)
        base = bases(root / "bases") if kind == "folders" else fuzz_inputs.bases(kind, root / "bases")
        reads_shared = kind in ("processors", "images")  # the LLaVA processor, a picture
        shared = {k: str(v) for k, v in fuzz_inputs.shared(root).items()} if reads_shared else {}
        names = sorted(base)
        hf_home = root / "hf"
        w = _Worker(hf_home, kind)
        try:
            for i in range(cases):
                name = rng.choice(names)
                folder = root / f"case-{i}"
                if kind == "folders":
                    shutil.copytree(base[name], folder)
                    done = mutate(rng, folder)
                    path = folder
                else:
                    path = fuzz_inputs.copy_base(base[name], folder)
                    done = fuzz_inputs.mutate(kind, rng, path)
                dtype = rng.choice(("fp16", "fp32"))
                result = w.run({"path": str(path), "dtype": dtype, "shared": shared}, seconds)
                if not w.alive():
                    w = _Worker(hf_home, kind)
                copied = sorted(p.name for p in hf_home.rglob("*.py") if p.name != "__init__.py") if hf_home.exists() else []
                if (folder / CODE_MARKER).exists() or copied:
                    result = f"CODE RAN (marker {(folder / CODE_MARKER).exists()}, modules cache {copied[:3]}): {result}"
                if result.startswith(("UNTYPED", "WRONG", "CRASH", "HANG", "CODE RAN")):
                    failures.append({"case": i, "base": name, "dtype": dtype, "mutations": done, "result": result})
                    if crash_dir is not None:
                        crash_dir.mkdir(parents=True, exist_ok=True)
                        shutil.copytree(folder, crash_dir / f"seed{seed}-case{i}-{name}", dirs_exist_ok=True)
                key = result.split(":")[0]
                counts[key] = counts.get(key, 0) + 1
                for m in done:
                    kinds[m] = kinds.get(m, 0) + 1
                shutil.rmtree(folder)
                if progress and (i + 1) % 250 == 0:
                    print(f"{i + 1}/{cases} {time.monotonic() - start:.0f}s {counts}", file=sys.stderr, flush=True)
        finally:
            w.close()
    return {
        "kind": kind,
        "cases": cases,
        "seed": seed,
        "seconds": round(time.monotonic() - start, 1),
        "counts": counts,
        "mutations": dict(sorted(kinds.items())),
        "failures": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--crash-dir", type=Path, default=None, help="copy the folders of failing cases here")
    parser.add_argument(
        "--kind",
        default="folders",
        choices=("folders", "gguf", "templates", "processors", "images", "audio", "all"),
        help="what to fuzz (default: hf: checkpoint folders; all: every kind, --cases each)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.kind)
        return
    from harness import fuzz_inputs  # noqa: PLC0415

    failed = False
    for kind in ("folders", *fuzz_inputs.KINDS) if args.kind == "all" else (args.kind,):
        report = campaign(args.cases, args.seed, args.crash_dir, progress=True, kind=kind)
        print(json.dumps(report, indent=1), flush=True)
        failed = failed or bool(report["failures"])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
