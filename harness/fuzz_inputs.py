"""The input kinds ``make fuzz-checkpoint`` fuzzes beside ``hf:`` folders (#47): GGUF files (header, metadata,
tensor table, data), chat templates, image-processor configs, image files and WAV files. Driven by
:mod:`harness.fuzz_checkpoint` (``--kind gguf|templates|processors|images|audio``), each case in its worker
process under the address-space and time limits:

- ``gguf``: a tiny llama written byte by byte (:mod:`harness.gguf_files`), its metadata and tensor table edited
  (declared blocks, widths, heads, vocabulary, alignment, architecture; offsets, types, shapes, names, counts)
  or its bytes (truncated, extended, flipped); the case is ``export_llm("gguf:...")`` up to the end of its
  load-and-check step, then ``Tokenizer(file).encode``;
- ``templates``: a tokenizer folder whose ``chat_template.jinja`` is built from fragments (loops, powers,
  repetition, includes, the sandbox's forbidden attributes, ``raise_exception``, recursion, syntax errors,
  bytes); the case is ``Tokenizer(folder).chat``, rendered in its bounded child (the worker's CPU limit is
  lowered to 1 s: the same mechanism, a faster campaign);
- ``processors``: a LLaVA, Gemma 3 or SmolVLM processor folder (no model) whose ``processor_config.json`` has
  sizes, crops, patch sizes, token counts and flags of the wrong value or type; the case is ``load_processor``,
  ``process`` of a small picture and ``runner_inputs``;
- ``images``: PNG, JPEG, GIF, BMP, TIFF and WebP files whose headers declare other sizes (bombs, lines),
  truncated or with flipped bytes; the case is ``process`` with the LLaVA processor.
- ``audio``: WAV files (PCM 8/16/24-bit, float, mono and stereo, one extensible, two with LIST and fact
  chunks) whose fmt fields (format tag, channels, rate 0, 1 Hz to 2^32-1, bits per sample, block align),
  declared sizes (RIFF, fmt, data: zero, off by one, beyond the file), chunks (extra, odd, repeated, missing,
  reordered), samples (truncated, odd, none, a non-finite float) or bytes are changed, or that are another
  container's header; the case is ``transcribe``'s front end (:func:`run_audio`: ``read_audio``, then the
  features), whose result must also be bounded (``WRONG`` otherwise).

Allowed outcomes: a clean run (``ok``), a typed error of the project (an ``MPSBackendError``), or a one-line
``ValueError`` (what ``generate`` and ``transcribe`` print as their one ``error:`` line).
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import zlib
from pathlib import Path

KINDS = ("gguf", "templates", "processors", "images", "audio")
#: seconds a case may take before it is a hang (a template is stopped at 1 s of CPU in the worker)
#: (audio: an hour of 16 kHz samples, the most a header may declare, reads and gets its features in about 7 s)
CASE_SECONDS = {"gguf": 90.0, "templates": 150.0, "processors": 60.0, "images": 60.0, "audio": 60.0}
PROMPT = "the quick brown fox"


# ---------------------------------------------------------------- bases


def _tokenizer(specials: list[str]):
    import transformers  # noqa: PLC0415
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<s>", "</s>", *specials], show_progress=False)
    tok.train_from_iterator([PROMPT + " jumps over the lazy dog"] * 20, trainer)
    extra = {"image_token": specials[0]} if specials else {}
    if len(specials) > 2:
        extra = {"boi_token": specials[0], "image_token": specials[1], "eoi_token": specials[2]}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="</s>", extra_special_tokens=extra
    )


#: SmolLM2-Instruct's chat template (the GGUF the project tests with), the base of the template cases
BASE_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def vlm_processor(family: str, tokenizer):
    """The small processor of ``family`` (``llava``, ``gemma3``, ``smolvlm``: 32-pixel images, SmolVLM's tiles of
    32 up to 64) around ``tokenizer``: the fuzz bases' and the vision tests' (tests/vlm_helpers.py)."""
    import transformers  # noqa: PLC0415

    if family == "llava":
        images = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        return transformers.LlavaProcessor(
            image_processor=images,
            tokenizer=tokenizer,
            patch_size=8,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
        )
    if family == "gemma3":
        images = transformers.Gemma3ImageProcessor(size={"height": 32, "width": 32})
        return transformers.Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=16)
    return transformers.SmolVLMProcessor(
        image_processor=transformers.SmolVLMImageProcessor(size={"longest_edge": 64}, max_image_size={"longest_edge": 32}),
        tokenizer=tokenizer,
        video_processor=transformers.SmolVLMVideoProcessor(),
        image_seq_len=16,
    )


def _processor(family: str, folder: Path) -> None:
    if family == "llava":
        fast = _tokenizer(["<image>"])
    elif family == "gemma3":
        fast = _tokenizer(["<start_of_image>", "<image_soft_token>", "<end_of_image>"])
    else:
        grid = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
        fast = _tokenizer(["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>", *grid])
        fast.image_token, fast.fake_image_token, fast.global_image_token = "<image>", "<fake_token_around_image>", "<global-img>"
        fast.end_of_utterance_token = "<end_of_utterance>"
    vlm_processor(family, fast).save_pretrained(folder)


def _picture(path: Path, fmt: str, size: tuple[int, int] = (48, 40)) -> None:
    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    pixels = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    if fmt == "GIF":
        image = image.convert("P")
    image.save(path, format=fmt)


IMAGE_FORMATS = {"PNG": "png", "JPEG": "jpg", "GIF": "gif", "BMP": "bmp", "TIFF": "tiff", "WEBP": "webp"}


def bases(kind: str, root: Path) -> dict[str, Path]:
    """The files or folders the cases of ``kind`` are made from (deterministic), written under ``root``."""
    from harness.gguf_files import tiny_llama, write_gguf  # noqa: PLC0415

    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    if kind == "gguf":
        for name, shape in (("llama2", {}), ("llama1_wide", {"layers": 1, "hidden": 32, "heads": 4, "kv_heads": 2})):
            out[name] = root / f"{name}.gguf"
            write_gguf(out[name], *tiny_llama(**shape))
        out["tokenizer_only"] = root / "tokenizer_only.gguf"
        write_gguf(out["tokenizer_only"], tiny_llama(layers=0)[0], [])
    elif kind == "templates":
        folder = root / "tok"
        _tokenizer([]).save_pretrained(folder)
        (folder / "chat_template.jinja").write_text(BASE_TEMPLATE)
        out["tok"] = folder
    elif kind == "processors":
        for family in ("llava", "gemma3", "smolvlm"):
            out[family] = root / family
            _processor(family, out[family])
    elif kind == "audio":
        for name, spec in WAV_BASES.items():
            out[name] = root / f"{name}.wav"
            _wav_base(out[name], *spec)
    else:
        for fmt, ext in IMAGE_FORMATS.items():
            out[fmt] = root / f"picture.{ext}"
            _picture(out[fmt], fmt)
        out["wide_png"] = root / "wide.png"
        _picture(out["wide_png"], "PNG", (400, 4))
    return out


def shared(root: Path) -> dict[str, Path]:
    """What every case of a kind reads beside its own input: the LLaVA processor (images) and a picture
    (processors)."""
    out = {"llava": root / "shared" / "llava", "picture": root / "shared" / "picture.png"}
    _processor("llava", out["llava"])
    _picture(out["picture"], "PNG")
    return out


# ---------------------------------------------------------------- GGUF mutations

WEIRD_INTS = (0, 1, 2, 3, 7, 16, 129, 1024, 16384, 100_000, 1 << 20, (1 << 31) - 1, (1 << 32) - 1)


def _gguf_structure(rng: random.Random, path: Path) -> str:
    """A tiny llama rebuilt with edited metadata or tensor table (harness.gguf_files)."""
    from harness import gguf_files as g  # noqa: PLC0415

    layers = rng.choice((0, 1, 2, 3))
    metadata, tensors = g.tiny_llama(layers=max(layers, 1) if rng.random() < 0.9 else 0)
    what = rng.randrange(12)
    if what == 0:  # declared sizes beyond, or short of, the tensors
        key = rng.choice(
            (
                "llama.block_count",
                "llama.embedding_length",
                "llama.feed_forward_length",
                "llama.attention.head_count",
                "llama.attention.head_count_kv",
                "llama.context_length",
                "llama.vocab_size",
                "llama.rope.dimension_count",
            )
        )
        metadata = [(k, t, rng.choice(WEIRD_INTS) if k == key else v) for k, t, v in metadata]
        done = f"metadata {key}"
    elif what == 1:  # a value of another type
        i = rng.randrange(len(metadata))
        k, _, _ = metadata[i]
        metadata[i] = (
            k,
            *rng.choice(
                (
                    (g.STRING, "x"),
                    (g.F32, float("nan")),
                    (g.F32, -1.0),
                    (g.I32, -5),
                    (g.BOOL, True),
                    (g.ARRAY, (g.U32, [1, 2])),
                    (g.U64, 1 << 40),
                    (g.F64, 1e308),
                )
            ),
        )
        done = f"metadata type of {k}"
    elif what == 2:  # alignment, architecture
        alignment = ("general.alignment", g.U32, rng.choice((0, 1, 3, 8, 64, 1 << 20)))
        architecture = ("general.architecture", g.STRING, rng.choice(("gpt2", "qwen2", "mamba", "", "x" * 300, "falcon")))
        choice = rng.choice((alignment, architecture))
        metadata = [m for m in metadata if m[0] != choice[0]] + [choice]
        done = f"metadata {choice[0]}"
    elif what == 3:  # a key dropped or repeated
        i = rng.randrange(len(metadata))
        metadata = metadata[:i] + metadata[i + 1 :] if rng.random() < 0.6 else metadata + [metadata[i]]
        done = "metadata key dropped or repeated"
    elif what == 4 and tensors:  # an offset
        t = rng.choice(tensors)
        t.offset = rng.choice((0, 1, 31, 32, 1 << 40, len(t.data)))
        done = "tensor offset"
    elif what == 5 and tensors:  # a type that is not the data's
        t = rng.choice(tensors)
        t.ggml_type = rng.choice((g.GGML_F16, g.GGML_Q4_0, g.GGML_Q8_0, 2, 12, 30, 99))
        done = "tensor type"
    elif what == 6 and tensors:  # a shape
        t = rng.choice(tensors)
        shapes = (t.dims[::-1], (0,) + t.dims[1:], t.dims + (1,), (1, 1, 1, 1, 1), (t.dims[0] * 2,) + t.dims[1:], (1 << 33,))
        t.dims = rng.choice(shapes)
        done = "tensor shape"
    elif what == 7 and tensors:  # a tensor dropped, repeated or renamed
        i = rng.randrange(len(tensors))
        choice = rng.randrange(3)
        if choice == 0:
            del tensors[i]
        elif choice == 1:
            tensors.append(tensors[i])
        else:
            tensors[i].name = rng.choice(("blk.99.attn_q.weight", "blk.-1.ffn_up.weight", "", "x" * 300, tensors[0].name))
        done = "tensor dropped, repeated or renamed"
    elif what == 8:  # the vocabulary's arrays disagree or are not strings
        metadata = [
            (k, t, (g.STRING, v[1][: rng.randrange(len(v[1]) + 1)]) if k == "tokenizer.ggml.tokens" and rng.random() < 0.5 else v)
            if k.startswith("tokenizer.") and t == g.ARRAY
            else (k, t, v)
            for k, t, v in metadata
        ]
        metadata.append(("tokenizer.ggml.bos_token_id", g.U32, rng.choice((0, 33, 1 << 30))))
        done = "vocabulary"
    else:
        done = "none (structure)"
    g.write_gguf(path, metadata, tensors)
    return done


def _count_field_offsets(data: bytes) -> list[int]:
    """Offsets of the tensor count, the metadata count and each metadata array's length (best effort)."""
    out = [8, 16]
    pos = 24
    try:
        n_kv = struct.unpack_from("<Q", data, 16)[0]
        for _ in range(min(n_kv, 64)):
            n = struct.unpack_from("<Q", data, pos)[0]
            pos += 8 + n
            kind = struct.unpack_from("<I", data, pos)[0]
            pos += 4
            if kind == 9:
                sub, count = struct.unpack_from("<IQ", data, pos)
                out.append(pos + 4)
                pos += 12
                for _ in range(count):
                    if sub == 8:
                        pos += 8 + struct.unpack_from("<Q", data, pos)[0]
                    else:
                        pos += {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4}.get(sub, 8)
            elif kind == 8:
                pos += 8 + struct.unpack_from("<Q", data, pos)[0]
            else:
                pos += {0: 1, 1: 1, 7: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4}.get(kind, 8)
    except struct.error:
        pass
    return out


def _gguf_bytes(rng: random.Random, path: Path) -> str:
    data = bytearray(path.read_bytes())
    what = rng.randrange(5)
    if what == 0:
        cut = rng.choice((rng.randrange(len(data)), 24, 8, len(data) - 1))
        path.write_bytes(bytes(data[:cut]))
        return "truncated"
    if what == 1:
        path.write_bytes(bytes(data) + bytes(rng.choice((1, 31, 32, 4096))))
        return "extended"
    if what == 2:  # a count or an array length made huge or off by one
        at = rng.choice(_count_field_offsets(bytes(data)))
        (n,) = struct.unpack_from("<Q", data, at)
        struct.pack_into("<Q", data, at, rng.choice((n + 1, max(n - 1, 0), 1 << 40, (1 << 64) - 1, 600_000, 4_000_000)))
        path.write_bytes(bytes(data))
        return "count field"
    if what == 3:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(min(len(data), 2048))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        return "header bytes"
    data[4:8] = struct.pack("<I", rng.choice((1, 2, 4, 0xFFFFFFFF)))
    path.write_bytes(bytes(data))
    return "version"


def mutate_gguf(rng: random.Random, path: Path) -> list[str]:
    done = []
    if rng.random() < 0.7:
        done.append(_gguf_structure(rng, path))
    if rng.random() < 0.5 or not done:
        done.append(_gguf_bytes(rng, path))
    return done


# ---------------------------------------------------------------- template mutations

#: pieces of hostile or broken Jinja
FRAGMENTS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 99 ** 999999999 }}",
    "{{ 9 ** 9 ** 9 }}",
    "{{ 'A' * 2000000000 }}",
    "{{ 'A' * 2e9 }}",
    "{% for i in range(100000) %}{{ 'A' * 2000 }}{% endfor %}",
    "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% include 'evil.jinja' %}",
    "{% import 'x' as y %}",
    "{% extends 'base' %}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('true') }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__ }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "{{ raise_exception('refused by the template') }}",
    "{{ strftime_now('%Y') }}",
    "{{ messages|tojson(indent=1000000) }}",
    "{{ 'x'|center(1000000000) }}",
    "{{ '%s'|format(messages) * 100000 }}",
    "{{ messages[0]['content']|replace('', 'xx') * 10000 }}",
    "{{ range(10**9)|list|length }}",
    "{{ dict.fromkeys(range(10**7)) }}",
    "{% for m in messages %}{{ m['content'] }",
    "{{ undefined_thing.attr }}",
    "{{ messages[5]['content'] }}",
    "{% if %}",
    "{{ (1, 2)|join(3) }}",
    "{{ 1 / 0 }}",
    "{{ 'é' * 3 }}\x00\xff",
    "{% generation %}x{% endgeneration %}",
    "{% break %}",
    "{{ loop.index }}",
)


def mutate_template(rng: random.Random, folder: Path) -> list[str]:
    path = folder / "chat_template.jinja"
    text = BASE_TEMPLATE
    done = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        what = rng.randrange(5)
        if what <= 2:
            frag = rng.choice(FRAGMENTS)
            at = rng.randrange(len(text) + 1)
            text = text[:at] + frag + text[at:] if rng.random() < 0.5 else text + frag
            done.append(f"fragment {FRAGMENTS.index(frag)}")
        elif what == 3:
            b = bytearray(text.encode()) or bytearray(b"{{ x }}")
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.choice(b"{}%#()[]'\"|~.-+*")
            text = b.decode(errors="replace")
            done.append("template bytes")
        else:
            text = rng.choice(("", "x" * 2_000_000, "{{" * 10000, "{%" + " for" * 50000 + "%}", BASE_TEMPLATE * 2000))
            done.append("template replaced")
    path.write_text(text, errors="surrogateescape")
    return done


# ---------------------------------------------------------------- processor mutations

SIZE_VALUES = (0, -1, 1, 3, 32, 33, 4096, 4097, 40000, 10**9, 1.5, float("nan"), float("inf"), "x", None, [], [32], {}, True)
PROCESSOR_KEYS = {
    "size": lambda rng: rng.choice(
        (
            {"shortest_edge": rng.choice(SIZE_VALUES)},
            {"longest_edge": rng.choice(SIZE_VALUES)},
            {"height": rng.choice(SIZE_VALUES), "width": rng.choice(SIZE_VALUES)},
            {"shortest_edge": rng.choice(SIZE_VALUES), "longest_edge": rng.choice(SIZE_VALUES)},
            {"max_pixels": rng.choice((10**12, 1, -1)), "min_pixels": 1},
            rng.choice(SIZE_VALUES),
        )
    ),
    "crop_size": lambda rng: rng.choice(({"height": rng.choice(SIZE_VALUES), "width": 32}, rng.choice(SIZE_VALUES))),
    "max_image_size": lambda rng: {"longest_edge": rng.choice(SIZE_VALUES)},
    "do_resize": lambda rng: rng.choice((True, False, "x", None)),
    "do_center_crop": lambda rng: rng.choice((True, False)),
    "do_image_splitting": lambda rng: rng.choice((True, False)),
    "do_pan_and_scan": lambda rng: rng.choice((True, False)),
    "pan_and_scan_max_num_crops": lambda rng: rng.choice(SIZE_VALUES),
    "pan_and_scan_min_crop_size": lambda rng: rng.choice(SIZE_VALUES),
    "resample": lambda rng: rng.choice((0, 3, 99, -1, "x")),
    "image_mean": lambda rng: rng.choice(([0.5], [0.5] * 4, [], "x", [float("nan")] * 3)),
    "image_std": lambda rng: rng.choice(([0.0, 0.0, 0.0], [1e-30] * 3, [], None)),
    "rescale_factor": lambda rng: rng.choice((0, -1, 1e308, "x")),
    "do_convert_rgb": lambda rng: rng.choice((True, False)),
    "image_processor_type": lambda rng: rng.choice(("NoSuchImageProcessor", "", 3)),
}
TOP_KEYS = {
    "patch_size": lambda rng: rng.choice(SIZE_VALUES),
    "image_seq_length": lambda rng: rng.choice(SIZE_VALUES),
    "image_seq_len": lambda rng: rng.choice(SIZE_VALUES),
    "num_additional_image_tokens": lambda rng: rng.choice(SIZE_VALUES),
    "vision_feature_select_strategy": lambda rng: rng.choice(("default", "full", "x")),
    "image_token": lambda rng: rng.choice(("<image>", "", "the", "<nope>")),
    "processor_class": lambda rng: rng.choice(("NoSuchProcessor", "LlavaProcessor", "")),
}


def mutate_processor(rng: random.Random, folder: Path) -> list[str]:
    path = folder / "processor_config.json"
    config = json.loads(path.read_text())
    done = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        if not isinstance(config, dict):  # an earlier mutation of this case replaced it
            break
        if rng.random() < 0.7 and isinstance(config.get("image_processor"), dict):
            key = rng.choice(list(PROCESSOR_KEYS))
            config["image_processor"][key] = PROCESSOR_KEYS[key](rng)
        elif rng.random() < 0.9:
            key = rng.choice(list(TOP_KEYS))
            config[key] = TOP_KEYS[key](rng)
        else:
            key = "whole"
            config = rng.choice(([], "x", {}, {"image_processor": []}))
        done.append(f"processor {key}")
    path.write_text(json.dumps(config, allow_nan=True))
    return done


# ---------------------------------------------------------------- image mutations


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def declared_png(width: int, height: int, color: int = 0, depth: int = 1) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` over a few bytes of zero rows (a bomb when large)."""
    row = bytes(1 + max(1, (width * depth + 7) // 8))
    comp = zlib.compressobj(9)
    body = comp.compress(row * min(height, max(1, (1 << 20) // len(row)))) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", body) + _png_chunk(b"IEND", b"")


def _patch_dims(rng: random.Random, data: bytearray, fmt: str, w: int, h: int) -> None:
    """The format's own width/height fields set to ``w`` x ``h`` (the pixel data left as it was)."""
    if fmt == "PNG":
        ihdr = data[16:29]
        struct.pack_into(">II", ihdr, 0, w, h)
        data[16:33] = ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + bytes(ihdr)) & 0xFFFFFFFF)
    elif fmt == "GIF":
        struct.pack_into("<HH", data, 6, w & 0xFFFF, h & 0xFFFF)
    elif fmt == "BMP":
        struct.pack_into("<ii", data, 18, w & 0x7FFFFFFF, rng.choice((h, -h)) if h < 1 << 31 else 1)
    elif fmt == "JPEG":
        at = data.find(b"\xff\xc0")
        if at < 0:
            at = data.find(b"\xff\xc2")
        if at >= 0:
            struct.pack_into(">HH", data, at + 5, h & 0xFFFF, w & 0xFFFF)


#: sizes an image header is made to declare: bombs, lines, nothing, the largest 16-bit fields, near the bound
DECLARED_SIZES = (
    (20000, 20000),
    (40_000_000, 1),
    (1, 40_000_000),
    (500_000, 1),
    (65535, 65535),
    (0, 10),
    (10000, 9000),
    (9000, 9000),
)


def mutate_image(rng: random.Random, path: Path) -> list[str]:
    fmt = next((f for f, ext in IMAGE_FORMATS.items() if path.suffix == f".{ext}"), "PNG")
    data = bytearray(path.read_bytes())
    what = rng.randrange(6)
    if what == 0:  # a declared size: a bomb, a line, zero, the largest the field holds
        w, h = rng.choice(DECLARED_SIZES)
        if fmt == "PNG" and rng.random() < 0.6:
            path.write_bytes(declared_png(w, h, *rng.choice(((0, 1), (2, 8), (6, 16), (3, 8)))))
        else:
            _patch_dims(rng, data, fmt, w, h)
            path.write_bytes(bytes(data))
        return [f"{fmt} declares {w}x{h}"]
    if what == 1:
        path.write_bytes(bytes(data[: rng.choice((0, 8, 16, 33, len(data) // 2, len(data) - 1))]))
        return [f"{fmt} truncated"]
    if what == 2:
        for _ in range(rng.randint(1, 16)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        return [f"{fmt} bytes"]
    if what == 3:
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(min(64, len(data)))] = rng.randrange(256)
        path.write_bytes(bytes(data))
        return [f"{fmt} header bytes"]
    if what == 4:
        path.write_bytes(rng.choice((b"", b"not an image", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"\xff\xd8\xff" * 100)))
        return ["not an image"]
    _patch_dims(rng, data, fmt, rng.randint(1, 300), rng.randint(1, 300))
    path.write_bytes(bytes(data))
    return [f"{fmt} small declared size"]


# ---------------------------------------------------------------- audio (WAV) mutations

#: WAVE format tags: PCM, ADPCM, IEEE float, A-law, mu-law, IMA ADPCM, GSM 6.10, MP3, extensible, unknown ones
WAV_TAGS = (0, 1, 2, 3, 6, 7, 0x11, 0x31, 0x55, 0xFFFE, 0x1234, 0xFFFF)
WAV_RATES = (0, 1, 2, 7, 100, 8000, 16000, 44100, 192000, 10**6, 10**9, (1 << 31) - 1, (1 << 32) - 1)
WAV_CHANNELS = (0, 1, 2, 3, 7, 255, 256, 1024, 65535)
WAV_BITS = (0, 1, 4, 7, 8, 12, 16, 17, 24, 31, 32, 48, 64, 65535)
#: sizes a chunk or the RIFF header is made to declare (``n`` the true size: off by one, zero, beyond the file)
WAV_SIZES = (0, 1, 2, 15, 16, 17, 18, 40, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFF0)
#: what a case's file may start with instead of a WAV: other containers libsndfile parses, and nothing
NOT_WAV = (
    b"",
    b"RIFF",
    b"RIFF\xff\xff\xff\xffWAVE",
    b"RIFX\x24\x00\x00\x00WAVEfmt ",
    b"RF64\xff\xff\xff\xffWAVEds64",
    b"RIFF\x24\x00\x00\x00AVI LIST",
    b"fLaC\x00\x00\x00\x22" + bytes(34),
    b"OggS" + bytes(60),
    b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\xff\xfb\x90\x00" * 50,
    b"FORM\x00\x00\x00\x40AIFFCOMM\x00\x00\x00\x12\x00\x01" + bytes(56),
    b"caff\x00\x01\x00\x00desc" + bytes(40),
    b"this is not audio\n" * 20,
)
_SUBFORMAT_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"  # KSDATAFORMAT_SUBTYPE_* after the tag


def wav_chunks(*, rate: int, channels: int, bits: int, tag: int, data: bytes, extensible: bool = False) -> list:
    """The chunks of a WAV file as ``[id, payload, declared size or None]`` lists (:func:`wav_file` lays them out)."""
    align = max(1, channels * bits // 8)
    fmt = struct.pack("<HHIIHH", 0xFFFE if extensible else tag, channels, rate, (rate * align) & 0xFFFFFFFF, align & 0xFFFF, bits)
    if extensible:  # cbSize 22: valid bits, channel mask, the sub-format GUID (its first two bytes the tag)
        fmt += (
            struct.pack("<HHI", 22, bits, (1 << channels) - 1 if channels < 32 else 0) + struct.pack("<H", tag) + _SUBFORMAT_TAIL
        )
    return [[b"fmt ", fmt, None], [b"data", data, None]]


def wav_file(chunks: list, riff_size: int | None = None, magic: bytes = b"RIFF", form: bytes = b"WAVE") -> bytes:
    """A RIFF file of ``chunks`` (:func:`wav_chunks`), each padded to an even size as RIFF asks; a declared size
    of None is the payload's own."""
    body = form
    for cid, payload, size in chunks:
        body += cid + struct.pack("<I", len(payload) if size is None else size & 0xFFFFFFFF) + payload
        body += b"\0" * (len(payload) % 2)
    return magic + struct.pack("<I", (len(body) if riff_size is None else riff_size) & 0xFFFFFFFF) + body


def _wav_parse(data: bytes) -> tuple[bytes, list] | None:
    """(magic, chunks) of a well-formed RIFF file, None when it is not one (an earlier mutation of the case)."""
    if len(data) < 12 or data[8:12] != b"WAVE":
        return None
    chunks, pos = [], 12
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if pos + 8 + size > len(data):
            return None
        chunks.append([cid, data[pos + 8 : pos + 8 + size], None])
        pos += 8 + size + size % 2
    return (data[:4], chunks) if pos == len(data) and chunks else None


def _tone(seconds: float, rate: int, bits: int, tag: int, channels: int) -> bytes:
    import numpy as np  # noqa: PLC0415

    t = np.arange(int(seconds * rate)) / rate
    sig = 0.5 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3000 * t)
    sig = np.repeat(sig[:, None], channels, axis=1)
    if tag == 3:
        return sig.astype("<f4" if bits == 32 else "<f8").tobytes()
    if bits == 8:
        return np.round(sig * 127 + 128).astype("u1").tobytes()
    ints = np.round(sig * ((1 << (bits - 1)) - 1)).astype("<i4")
    return b"".join(int(v).to_bytes(4, "little", signed=True)[: bits // 8] for v in ints.reshape(-1))


#: the WAV bases: (rate, channels, bits, format tag, seconds, extensible, extra chunks)
WAV_BASES = {
    "pcm16_mono_16k": (16000, 1, 16, 1, 1.0, False, False),
    "pcm16_stereo_44k": (44100, 2, 16, 1, 0.5, False, True),
    "pcm8_mono_8k": (8000, 1, 8, 1, 1.0, False, False),
    "pcm24_stereo_22k": (22050, 2, 24, 1, 0.25, True, False),
    "float32_mono_48k": (48000, 1, 32, 3, 0.5, False, True),
}


def _wav_base(path: Path, rate: int, channels: int, bits: int, tag: int, seconds: float, extensible: bool, extra: bool) -> None:
    chunks = wav_chunks(
        rate=rate, channels=channels, bits=bits, tag=tag, data=_tone(seconds, rate, bits, tag, channels), extensible=extensible
    )
    if extra:  # a LIST/INFO chunk between fmt and data, and a fact chunk, as many writers add
        chunks[1:1] = [[b"LIST", b"INFOISFT\x06\x00\x00\x00fuzz\x00\x00", None], [b"fact", struct.pack("<I", 1), None]]
    path.write_bytes(wav_file(chunks))


def _wav_fmt_field(rng: random.Random, fmt: bytes) -> tuple[bytes, str]:
    fields = ("tag", "channels", "rate", "byte rate", "block align", "bits")
    b = bytearray(fmt if len(fmt) >= 16 else fmt + bytes(16 - len(fmt)))
    i = rng.randrange(len(fields))
    values = {
        "tag": WAV_TAGS,
        "channels": WAV_CHANNELS,
        "rate": WAV_RATES,
        "byte rate": (0, 1, 3, (1 << 32) - 1),
        "block align": (0, 1, 3, 7, 65535),
        "bits": WAV_BITS,
    }[fields[i]]
    value = rng.choice(values)
    at, form = ((0, "<H"), (2, "<H"), (4, "<I"), (8, "<I"), (12, "<H"), (14, "<H"))[i]
    struct.pack_into(form, b, at, value)
    if fields[i] == "tag" and len(b) >= 40 and rng.random() < 0.5:  # the extensible sub-format's tag instead
        struct.pack_into("<H", b, 24, value)
        return bytes(b), f"WAV sub-format tag {value}"
    return bytes(b), f"WAV {fields[i]} {value}"


def _wav_structure(rng: random.Random, magic: bytes, chunks: list) -> tuple[bytes, str]:
    """One edit of a parsed WAV's header fields or chunks; returns the new file and what was done."""
    ids = [c[0] for c in chunks]
    fmt_i = ids.index(b"fmt ") if b"fmt " in ids else None
    data_i = ids.index(b"data") if b"data" in ids else None
    riff_size = None
    what = rng.randrange(8)
    if what <= 1 and fmt_i is not None:  # a field of the fmt chunk
        chunks[fmt_i][1], done = _wav_fmt_field(rng, chunks[fmt_i][1])
    elif what == 2:  # a declared size: the RIFF header's, the fmt or data chunk's
        target = rng.choice(("riff", "fmt", "data"))
        n = rng.choice(WAV_SIZES)
        if target == "riff":
            riff_size = n
        elif (fmt_i if target == "fmt" else data_i) is not None:
            chunks[fmt_i if target == "fmt" else data_i][2] = n
        done = f"WAV {target} size {n}"
    elif what == 3:  # an extra chunk: metadata, an odd size, one that claims more than the file, a second fmt or data
        extra = rng.choice(
            (
                [b"LIST", b"INFOINAM\x03\x00\x00\x00ab\x00", None],
                [b"JUNK", bytes(rng.choice((0, 1, 3, 28))), None],
                [b"fact", struct.pack("<I", rng.choice((0, 1, 1 << 31))), None],
                [b"abcd", b"x" * 5, None],
                [b"cue ", struct.pack("<I", 1 << 30), None],
                [b"smpl", bytes(36) + struct.pack("<I", 1 << 28), None],
                [b"bext", bytes(8), 0xFFFFFFFF],
                [b"fmt ", wav_chunks(rate=8000, channels=2, bits=8, tag=1, data=b"")[0][1], None],
                [b"data", bytes(rng.choice((0, 1, 2, 1000))), None],
                [b"\0\0\0\0", b"", None],
            )
        )
        at = rng.randrange(len(chunks) + 1)
        chunks.insert(at, extra)
        done = f"WAV extra {extra[0].decode(errors='replace').strip() or 'nul'} chunk at {at}"
    elif what == 4:  # the chunks' order or presence
        choice = rng.randrange(4)
        if choice == 0 and fmt_i is not None:
            del chunks[fmt_i]
        elif choice == 1 and data_i is not None:
            del chunks[data_i]
        elif choice == 2:
            chunks.reverse()
        else:
            chunks.append(list(chunks[rng.randrange(len(chunks))]))
        done = f"WAV chunks {('no fmt', 'no data', 'reversed', 'repeated')[choice]}"
    elif what == 5 and data_i is not None:  # the samples: truncated, odd, none, non-finite floats, more of them
        data = chunks[data_i][1]
        choice = rng.randrange(5)
        if choice == 0:
            data = data[: rng.randrange(len(data) + 1)]
        elif choice == 1:
            data = data[:-1] if data else b"\x01"
        elif choice == 2:
            data = b""
        elif choice == 3:
            import numpy as np  # noqa: PLC0415

            bad = np.array([rng.choice((float("nan"), float("inf"), -float("inf"), 3e38, -0.0, 1e-45))], "<f4").tobytes()
            at = rng.randrange(max(1, len(data) // 4)) * 4
            data = data[:at] + bad + data[at + 4 :]
        else:
            data = data * rng.choice((2, 8, 32))
        chunks[data_i][1] = data
        done = f"WAV samples {('truncated', 'odd length', 'none', 'one non-finite float', 'repeated')[choice]}"
    elif what == 6 and fmt_i is not None:  # the fmt chunk's length: short, cbSize given, extensible with no room
        fmt = chunks[fmt_i][1]
        chunks[fmt_i][1] = rng.choice(
            (
                fmt[:14],
                fmt[:16],
                fmt[:16] + b"\0\0",
                fmt[:16] + struct.pack("<H", 22),
                fmt[:16] + struct.pack("<H", 0xFFFF) + bytes(4),
                fmt + bytes(100),
            )
        )
        done = "WAV fmt length"
    else:  # the container's magic or form type
        magic = rng.choice((b"RIFF", b"RIFX", b"RF64", b"riff", b"\0\0\0\0"))
        form = rng.choice((b"WAVE", b"wave", b"AVI ", b"WAVX"))
        return wav_file(chunks, riff_size, magic, form), f"WAV magic {magic!r} {form!r}"
    return wav_file(chunks, riff_size, magic), done


def mutate_audio(rng: random.Random, path: Path) -> list[str]:
    done = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        data = path.read_bytes()
        parsed = _wav_parse(data)
        what = rng.randrange(10)
        if what < 6 and parsed is not None:
            data, step = _wav_structure(rng, *parsed)
        elif what < 8 and data:
            b = bytearray(data)
            span = len(b) if rng.random() < 0.3 else min(64, len(b))
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(span)] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
            data, step = bytes(b), f"WAV {'bytes' if span > 64 else 'header bytes'}"
        elif what == 8:
            data, step = data[: rng.choice((0, 4, 8, 12, 20, 36, 44, rng.randrange(len(data) + 1)))], "WAV truncated"
        else:
            data, step = rng.choice(NOT_WAV), "not a WAV"
        path.write_bytes(data)
        done.append(step)
    return done


def mutate(kind: str, rng: random.Random, path: Path) -> list[str]:
    mutations = {
        "gguf": mutate_gguf,
        "templates": mutate_template,
        "processors": mutate_processor,
        "images": mutate_image,
        "audio": mutate_audio,
    }
    return mutations[kind](rng, path)


def copy_base(base: Path, to: Path) -> Path:
    """A copy of a base file or folder at ``to`` (a file keeps its suffix)."""
    if base.is_dir():
        shutil.copytree(base, to)
        return to
    to.mkdir()
    shutil.copyfile(base, to / base.name)
    return to / base.name


# ---------------------------------------------------------------- the worker's side


def classify(e: BaseException) -> str:
    """'typed CLASS' for the errors ``generate`` and ``export`` print as one line, else 'UNTYPED ...'."""
    from mps_backend.errors import MPSBackendError  # noqa: PLC0415

    text = str(e).strip()
    if isinstance(e, (MPSBackendError, ValueError, FileNotFoundError)) and text and "\n" not in text:
        return f"typed {type(e).__name__}"
    return f"UNTYPED {type(e).__name__}: {text[:300]}"


def run_input_case(kind: str, path: Path, shared_paths: dict[str, str], stop: type[BaseException]) -> str:
    """One case of ``kind`` on ``path`` (module docstring): 'ok', 'typed CLASS' or 'UNTYPED CLASS: message'."""
    try:
        if kind == "gguf":
            from mps_backend.llm.export import export_llm  # noqa: PLC0415
            from mps_backend.llm.generate import Tokenizer  # noqa: PLC0415

            try:
                export_llm(f"gguf:{path}", path.with_name("out.pte"), prefill_chunk=1, dtype="fp32", verify_steps=0)
                return "UNTYPED: the export ran past its load step"
            except stop:
                pass
            Tokenizer(path).encode(PROMPT)
        elif kind == "templates":
            from mps_backend.llm.generate import Tokenizer  # noqa: PLC0415

            Tokenizer(path).chat("hello")
        elif kind == "audio":
            return run_audio(path)
        else:
            from mps_backend.llm.multimodal import image_token_id, load_processor, process, runner_inputs  # noqa: PLC0415

            folder = path if kind == "processors" else Path(shared_paths["llava"])
            image = shared_paths["picture"] if kind == "processors" else path
            processor = load_processor(folder)
            runner_inputs(process(processor, PROMPT, image), image_token_id(processor), 16)
        return "ok"
    except stop:
        return "UNTYPED: the export ran past its load step"
    except Exception as e:  # noqa: BLE001 - classified
        return classify(e)


def run_audio(path: Path) -> str:
    """``transcribe``'s front end on ``path``: :func:`read_audio` as ``transcribe`` calls it (its default
    ``max_seconds``, to the extractor's 16 kHz), then transformers' ``WhisperFeatureExtractor`` (Whisper's defaults,
    80 mel bins) as ``transcribe`` calls it (one padded window up to 30 s, the whole beyond). 'ok' when the samples
    are mono float32, finite, at most ``MAX_SECONDS`` at 16 kHz, and the features finite ``[1, 80, >= 3000]``;
    'WRONG ...' otherwise; errors are the caller's to classify."""
    import numpy as np  # noqa: PLC0415

    from mps_backend.llm.transcribe import MAX_SECONDS, feature_extractor, read_audio  # noqa: PLC0415

    fe = feature_extractor(None, 80)
    samples, rate = read_audio(path, MAX_SECONDS, fe.sampling_rate)
    if samples.dtype != np.float32 or samples.ndim != 1 or not 0 < len(samples) <= MAX_SECONDS * fe.sampling_rate + 16:
        return f"WRONG samples {samples.dtype} {samples.shape} (from {rate} Hz)"
    if not np.isfinite(samples).all():
        return f"WRONG non-finite samples (from {rate} Hz)"
    kwargs = {"truncation": False, "padding": "longest"} if len(samples) > fe.n_samples else {}
    features = fe(samples, sampling_rate=fe.sampling_rate, return_tensors="pt", **kwargs).input_features
    if tuple(features.shape[:2]) != (1, 80) or features.shape[2] < fe.nb_max_frames or not bool(features.isfinite().all()):
        return f"WRONG features {tuple(features.shape)} of {len(samples)} samples (from {rate} Hz)"
    return "ok"


def worker_setup(kind: str) -> None:
    """What a worker of ``kind`` changes in its own process: the template renderer's CPU limit lowered to 1 s
    (the same mechanism as the default 10 s, a faster campaign)."""
    if kind == "templates":
        import mps_backend.llm.chat_templates as chat  # noqa: PLC0415

        chat.MAX_RENDER_SECONDS = 1
    if kind == "audio":
        import soundfile  # noqa: F401, PLC0415
        import soxr  # noqa: F401, PLC0415
        import transformers  # noqa: F401, PLC0415
    elif kind in ("gguf", "templates"):
        import transformers  # noqa: F401, PLC0415
    else:
        import PIL.Image  # noqa: F401, PLC0415
        import transformers  # noqa: F401, PLC0415
