"""Images and image processors bounded before any pixel is decoded or resized (#47).

``generate --image`` decodes the image with PIL and hands it to the checkpoint folder's processor, which
resizes it (LLaVA's CLIP processor: its shortest edge to ``size.shortest_edge``, keeping the aspect ratio),
tiles it (SmolVLM) and expands the prompt's image token. A 48 KB PNG declaring 20000 x 20000 pixels, a 39 KB
one of 40,000,000 x 1 (resized to 32 x 1.28 G pixels), or a folder whose processor asks for a shortest edge
of 40000 took gigabytes before anything was refused. Here, from the image's header and the processor's
config alone:

- :func:`open_image`: at most :data:`MAX_IMAGE_PIXELS` pixels (PIL's own decompression-bomb threshold) and an
  aspect ratio of at most :data:`MAX_ASPECT_RATIO` (transformers' Qwen2-VL processor refuses more);
- :func:`check_processor_files` (the folder's ``processor_config.json`` / ``preprocessor_config.json``, before
  transformers builds the processor: a constructor may act on its values) and :func:`check_processor` (the
  processor built): every edge the image processor resizes or crops to at most
  :data:`MAX_PROCESSOR_EDGE`, a pixel budget at most its square, an image-token count at most
  :data:`MAX_IMAGE_TOKENS`, and (:func:`check_resize`) the image as the processor would resize it at most
  :data:`MAX_IMAGE_PIXELS` (a shortest edge ``S`` makes ``S * S * aspect`` pixels).

Each refusal is one :class:`ImageBoundError` line naming the image or the processor's value and the bound.
The bounds and the real models they are derived from: docs/llm.md, Bounds.
"""

from __future__ import annotations

import math
import pathlib
import warnings
from typing import Any

from mps_backend.errors import MPSBackendError

#: pixels of an image (and of an image as its processor resizes it): PIL's ``MAX_IMAGE_PIXELS`` default,
#: 89,478,485 (0.25 GiB of RGB), where PIL itself warns of a decompression bomb (it refuses twice that)
MAX_IMAGE_PIXELS = 89_478_485
#: the longer side over the shorter: transformers' Qwen2-VL processor refuses more (``smart_resize``)
MAX_ASPECT_RATIO = 200
#: an edge a processor resizes, crops or tiles to: twice the largest of the exported families (SmolVLM-256M
#: resizes the longest edge to 2048 = 4 x its 512-pixel SigLIP tiles; Gemma 3: 896; LLaVA-1.5: 336)
MAX_PROCESSOR_EDGE = 4096
#: image tokens one image may expand to: Qwen2-VL's most (12,845,056 pixels / 28^2 = 16384; the exported
#: families: LLaVA-1.5 576, Gemma 3 256, SmolVLM-256M 64 a tile)
MAX_IMAGE_TOKENS = 16384
#: crops or tiles of one image (Gemma 3's pan-and-scan ``pan_and_scan_max_num_crops``; its default is 4)
MAX_CROPS = 64

#: processor config keys (in the processor or its image processor) holding an edge in pixels, directly or as
#: a ``{"height", "width", "shortest_edge", "longest_edge"}`` dict
EDGE_KEYS = ("size", "crop_size", "max_image_size", "image_size", "pan_and_scan_min_crop_size", "patch_size", "tile_size")
#: keys holding a pixel count
PIXEL_KEYS = ("max_pixels", "min_pixels")
#: keys holding a count of image tokens
TOKEN_KEYS = ("image_seq_length", "image_seq_len", "num_image_tokens", "mm_tokens_per_image", "num_additional_image_tokens")
#: keys holding a count of crops or tiles
CROP_KEYS = ("pan_and_scan_max_num_crops", "max_num_crops", "max_num_tiles", "max_image_tiles")


class ImageBoundError(MPSBackendError, ValueError):
    """An image or image processor beyond a bound: one line naming it and the bound."""


def check_dimensions(width: int, height: int, where: str) -> None:
    """Refuse an image of more than :data:`MAX_IMAGE_PIXELS` pixels or an aspect ratio beyond
    :data:`MAX_ASPECT_RATIO`, from its declared size."""
    if width < 1 or height < 1:
        raise ImageBoundError(f"{where}: an image of {width} x {height} pixels has no pixels")
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageBoundError(
            f"{where}: {width} x {height} = {width * height:,} pixels, beyond the bound of {MAX_IMAGE_PIXELS:,} "
            "(PIL's decompression-bomb threshold): downscale it first"
        )
    ratio = max(width, height) / min(width, height)
    if ratio > MAX_ASPECT_RATIO:
        raise ImageBoundError(
            f"{where}: {width} x {height} pixels, an aspect ratio of {ratio:,.0f}:1, beyond the bound of "
            f"{MAX_ASPECT_RATIO}:1 (a processor resizing its shorter side would make it {ratio:,.0f} times longer)"
        )


def open_image(path: str | pathlib.Path) -> Any:
    """The image at ``path``, its size checked (:func:`check_dimensions`) from the header before any pixel is
    decoded, then decoded. Not an image, a truncated one, or one PIL refuses as a decompression bomb: one line."""
    from PIL import Image  # noqa: PLC0415

    where = str(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the bound below is ours, and lower
            image = Image.open(path)
    except Image.DecompressionBombError as e:
        raise ImageBoundError(f"{where}: {e} (the bound is {MAX_IMAGE_PIXELS:,} pixels): downscale it first") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise ImageBoundError(f"{where}: not an image file PIL reads ({str(e)[:200]})") from None
    check_dimensions(int(image.width), int(image.height), where)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image.load()
    except Image.DecompressionBombError as e:  # a frame larger than the header said
        raise ImageBoundError(f"{where}: {e} (the bound is {MAX_IMAGE_PIXELS:,} pixels)") from None
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise ImageBoundError(f"{where}: not an image file PIL reads ({str(e)[:200]})") from None
    return image


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _edges(value: Any) -> list[tuple[str, float | None]]:
    """(name, value) of the edges in a size value: a number, a list of numbers or a size dict."""
    if isinstance(value, dict):
        return [(k, _number(v)) for k, v in value.items() if v is not None]
    if isinstance(value, (list, tuple)):
        return [(str(i), _number(v)) for i, v in enumerate(value)]
    return [("", _number(value))] if value is not None else []


def _configs(processor: Any) -> list[tuple[str, dict]]:
    """(name, config dict) of the processor's parts that shape an image: the image processor and the processor."""
    out = []
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is not None and hasattr(image_processor, "to_dict"):
        out.append(("image_processor", image_processor.to_dict()))
    out.append(("processor", {k: getattr(processor, k) for k in (*EDGE_KEYS, *TOKEN_KEYS, *CROP_KEYS) if hasattr(processor, k)}))
    return out


def _check_configs(parts: list[tuple[str, dict]], where: str) -> None:
    """The bounds (module docstring) on the values of ``(part name, config dict)`` pairs."""
    for part, config in parts:
        for key in EDGE_KEYS:
            for sub, v in _edges(config.get(key)):
                name = f"{part} {key}" + (f".{sub}" if sub else "")
                if key in ("size", "max_image_size") and sub in PIXEL_KEYS:  # a pixel budget under the size dict
                    bound = MAX_PROCESSOR_EDGE**2
                else:
                    bound = MAX_PROCESSOR_EDGE
                if v is None or not math.isfinite(v) or not 1 <= v <= bound:
                    raise ImageBoundError(f"{where}: {name} = {str(config[key])[:80]} outside [1, {bound}]")
        bounds = [(k, MAX_PROCESSOR_EDGE**2) for k in PIXEL_KEYS] + [(k, MAX_IMAGE_TOKENS) for k in TOKEN_KEYS]
        for key, bound in bounds + [(k, MAX_CROPS) for k in CROP_KEYS]:
            if config.get(key) is None:
                continue
            v = _number(config[key])
            if v is None or not math.isfinite(v) or not 0 <= v <= bound:
                raise ImageBoundError(f"{where}: {part} {key} = {str(config[key])[:40]} outside [0, {bound}]")


#: the files a processor is read from: (name, where its image processor's values are)
PROCESSOR_FILES = (("processor_config.json", "image_processor"), ("preprocessor_config.json", None))


def check_processor_files(folder: str | pathlib.Path) -> None:
    """The bounds on a folder's processor files as JSON, before transformers builds the processor from them (a
    processor's constructor acts on its values: Gemma 3's writes its ``image_seq_length`` image tokens into a
    string, 10^9 of them at load time). A file that is not a bounded JSON object is a FolderError."""
    from mps_backend.llm.folder_check import _json_object  # noqa: PLC0415

    folder = pathlib.Path(folder)
    for name, sub in PROCESSOR_FILES:
        config = _json_object(folder, name)
        if config is None:
            continue
        inner = config.get(sub) if sub else config
        parts = [("processor", config)] if sub else []
        if isinstance(inner, dict):
            parts.append(("image_processor", inner))
        _check_configs(parts, str(folder / name))


def check_processor(processor: Any, where: str) -> None:
    """Refuse a processor whose config asks for more than the bounds (module docstring), before it sees an image."""
    _check_configs(_configs(processor), where)
    tokens = _patch_tokens(processor)
    if tokens > MAX_IMAGE_TOKENS:
        raise ImageBoundError(
            f"{where}: the processor expands an image to {tokens:,} image tokens (its crop size over its patch size), "
            f"beyond the bound of {MAX_IMAGE_TOKENS}"
        )


def _patch_tokens(processor: Any) -> int:
    """Image tokens a patch-counting processor (LLaVA's: ``(crop height / patch) * (crop width / patch)``) puts
    for one image; 0 when it does not count patches."""
    patch = _number(getattr(processor, "patch_size", None))
    image_processor = getattr(processor, "image_processor", None)
    crop = getattr(image_processor, "crop_size", None) if image_processor is not None else None
    if not patch or not isinstance(crop, dict) and not hasattr(crop, "get"):
        return 0
    h, w = _number(crop.get("height")), _number(crop.get("width"))
    return int((h or 0) // patch) * int((w or 0) // patch)


def check_resize(processor: Any, width: int, height: int, where: str) -> None:
    """Refuse an image the processor would resize to more than :data:`MAX_IMAGE_PIXELS` pixels (a shortest edge
    ``S`` resizes a ``W x H`` image to ``S * S * max(W, H) / min(W, H)`` pixels)."""
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None or not getattr(image_processor, "do_resize", True):
        return
    size = image_processor.to_dict().get("size") if hasattr(image_processor, "to_dict") else None
    if not isinstance(size, dict):
        return
    ratio = max(width, height) / min(width, height)
    edges = {k: _number(v) or 0.0 for k, v in size.items()}
    if edges.get("shortest_edge") and "longest_edge" not in edges:
        pixels = edges["shortest_edge"] ** 2 * ratio
    elif edges.get("longest_edge"):
        pixels = edges["longest_edge"] ** 2 / ratio if "shortest_edge" not in edges else edges["longest_edge"] ** 2
    else:
        pixels = edges.get("height", 0.0) * edges.get("width", 0.0)
    if pixels > MAX_IMAGE_PIXELS:
        raise ImageBoundError(
            f"{where}: the processor's size {size} would resize this {width} x {height} image to {pixels:,.0f} pixels, "
            f"beyond the bound of {MAX_IMAGE_PIXELS:,}"
        )
