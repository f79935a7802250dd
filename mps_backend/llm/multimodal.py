"""Image + text to text with a vision-language ``.pte`` on the emulated MPS runtime.

    from mps_backend.llm.multimodal import generate_image
    print(generate_image("smolvlm.pte", "./SmolVLM-256M", "photo.png", "Describe the image.").text)

The prompt becomes the runner's inputs with transformers' own processor (the checkpoint folder's
``AutoProcessor``): its ``input_ids`` cut at the runs of the image token, each run replaced by one
image (the processor's ``pixel_values``, one ``[1, 3, H, W]`` per image or tile), the rest token
segments (:func:`runner_inputs`). The image and the processor's config are bounded before a pixel is decoded
or resized (:mod:`mps_backend.llm.image_bounds`); ``chat``: the prompt and image go through the processor's chat
template, rendered within bounds (:mod:`mps_backend.llm.chat_templates`). Two runners take those inputs:

- ``"python"``: executorch's ``MultimodalRunner`` loop written out over
  :class:`mps_backend.runtime.LoadedMethod` (``multimodal_prefiller.cpp`` and ``multimodal_runner.cpp``
  at v1.0.0 / v1.4.0; docs/speech-vision.md cites the lines): per input ``vision_encoder`` or
  ``token_embedding``, then ``text_decoder(embeddings, [pos])``, ``pos += S``; the last prefill's argmax
  is the first token; then per token ``token_embedding([1, 1])`` and ``text_decoder``, greedy, until an id
  of ``get_eos_ids``, ``max_new_tokens`` or the cache's end (``get_max_context_len``).
- ``"executorch"``: executorch's own C++ ``MultimodalRunner`` (the 1.5.1 wheel's binding), the MPS
  delegates emulated in the same process; temperature 0.

A text segment longer than ``get_max_seq_len`` is given in pieces (the runner itself would hand it over
in one call, which the program refuses); for Gemma 3 no piece is exactly an image's N rows (the
program attends a call of N rows as an image, bidirectionally). Causal attention gives the same cache
and logits however a text segment is cut.
"""

from __future__ import annotations

import pathlib
import time
from dataclasses import dataclass
from typing import Any, Union

import torch

from mps_backend.llm.chat_templates import bounded_rendering
from mps_backend.llm.generate import tokenizer_file
from mps_backend.llm.greedy import GenerationStats, eos_ids, greedy
from mps_backend.llm.image_bounds import check_dimensions, check_processor, check_processor_files, check_resize, open_image
from mps_backend.llm.runner_output import quiet_stdout
from mps_backend.runtime import LoadedMethod, constant_method_values
from mps_backend.runtime.emulator import load_emulator, program_input_specs

#: a runner input: ("tokens", ids) or ("image", pixel_values float32 [1, 3, H, W])
RunnerInput = tuple[str, Union[list[int], torch.Tensor]]


@dataclass
class ImageGeneration(GenerationStats):
    """A greedy run after an image and a prompt: :class:`mps_backend.llm.greedy.GenerationStats` (its
    ``prompt_tokens`` are the prompt's rows, the images' embeddings included) with the text and the
    images read."""

    text: str = ""
    images: int = 0

    @property
    def tokens(self) -> list[int]:
        """The generated tokens."""
        return self.generated

    @property
    def prompt_rows(self) -> int:
        return self.prompt_tokens

    def stats(self) -> str:
        rate = self.tokens_per_second
        return (
            f"{self.prompt_rows} prompt rows ({self.images} image(s)), {len(self.tokens)} generated ({self.stopped_by}); "
            f"emulated on this CPU, not a device: prefill {self.prefill_seconds:.2f}s, decode {rate:.1f} tokens/s"
        )


def _meta(pte) -> dict:
    """The program's metadata; a ValueError when it is not a vision-language export (the runner's methods)."""
    meta = constant_method_values(pte)
    for name in ("get_max_seq_len", "get_max_context_len"):
        if name not in meta:
            raise ValueError(
                f"the program has no {name} method: not a vision-language export (mps-backend export --model hf:...)"
            )
    for method in ("vision_encoder", "token_embedding", "text_decoder"):
        try:
            program_input_specs(pte, method=method)
        except Exception as e:  # noqa: BLE001 - the EmulatorError names the methods the program has
            raise ValueError(f"not a vision-language program (no MultimodalRunner methods): {e}") from None
    return meta


def image_placeholder(processor) -> str:
    """The text a prompt holds where an image goes: Gemma 3's ``<start_of_image>`` (its processor expands
    it), the image token otherwise."""
    mark = getattr(processor, "boi_token", None) or getattr(processor, "image_token", None)
    if not isinstance(mark, str) or not mark:
        raise ValueError(f"the {type(processor).__name__} names no image token (its image_token is {mark!r})")
    return mark


def image_token_id(processor) -> int:
    """The id of the tokens the processor puts where the vision encoder's embeddings go."""
    tok = processor.tokenizer
    token = getattr(tok, "image_token", None) or getattr(processor, "image_token", None)
    found = tok.convert_tokens_to_ids(token) if isinstance(token, str) and token else None
    if isinstance(found, bool) or not isinstance(found, int) or found < 0 or token not in tok.get_vocab():
        raise ValueError(f"the image token {token!r} of the {type(processor).__name__} is not a token of its tokenizer")
    return int(found)


def load_processor(folder: str | pathlib.Path):
    """transformers' ``AutoProcessor`` of the checkpoint folder (nothing downloaded)."""
    from transformers import AutoProcessor  # noqa: PLC0415

    p = pathlib.Path(folder)
    if not p.is_dir():
        raise ValueError(f"{folder}: not a checkpoint folder (its processor: preprocessor_config.json and tokenizer files)")

    check_processor_files(p)  # its files' values bounded before transformers builds it (#47)
    try:
        processor = AutoProcessor.from_pretrained(p, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - transformers' refusals of the folder as one line
        raise ValueError(
            f"{folder}: transformers cannot load its processor: {(str(e).splitlines() or [type(e).__name__])[0][:200]}"
        ) from None
    for part in ("image_processor", "tokenizer"):  # an unknown processor_class gives a bare tokenizer
        if getattr(processor, part, None) is None:
            raise ValueError(f"{folder}: transformers loaded a {type(processor).__name__}, not a processor with an {part}")
    check_processor(processor, str(folder))  # its sizes bounded before it sees an image (#47)
    return processor


def chat_text(processor, prompt: str, where: str) -> str:
    """``prompt`` after one image as a user message in the processor's chat template, ready for the answer
    (transformers' ``apply_chat_template(..., add_generation_prompt=True)``, rendered within the bounds of
    :mod:`mps_backend.llm.chat_templates`); a processor without a template, or a template that fails, is one
    ValueError line naming ``where`` (the checkpoint folder)."""
    if not getattr(processor, "chat_template", None):
        raise ValueError(f"{where}: the processor has no chat template (--chat needs an instruct model's)")
    message = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
    with bounded_rendering(where):
        try:
            return processor.apply_chat_template(message, add_generation_prompt=True, tokenize=False)
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001 - transformers' own refusals of the conversation
            raise ValueError(f"{where}: the chat template failed: {type(e).__name__}: {str(e)[:200]}") from None


def process(processor, prompt: str, image, *, chat: bool = False, folder: str | pathlib.Path = "the processor") -> Any:
    """The processor's tensors for ``prompt`` with ``image`` (a path or a PIL image): the prompt gets the
    image placeholder in front when it holds none; ``chat``: the prompt in the processor's chat template
    (:func:`chat_text`; no second BOS when the template writes one, as transformers' own). The image's size,
    and its size once resized, are bounded before its pixels are decoded (:mod:`mps_backend.llm.image_bounds`)."""
    from PIL import Image  # noqa: PLC0415

    where = str(image) if not isinstance(image, Image.Image) else "the image"
    if not isinstance(image, Image.Image):
        image = open_image(image)
    check_dimensions(image.width, image.height, where)
    check_resize(processor, image.width, image.height, where)
    image = image.convert("RGB")
    extra = {}
    if chat:
        text = chat_text(processor, prompt, str(folder))
        bos = getattr(processor.tokenizer, "bos_token", None)
        if bos and text.startswith(bos):
            extra["add_special_tokens"] = False
    else:
        mark = image_placeholder(processor)
        text = prompt if mark in prompt else mark + prompt
    try:
        return processor(text=text, images=image, return_tensors="pt", **extra)
    except Exception as e:  # noqa: BLE001 - transformers' processor on the folder's config: its failure in one line
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise ValueError(f"{folder}: the processor failed on {where}: {type(e).__name__}: {detail}") from None


def runner_inputs(batch, image_id: int, rows: int, block: int | None = None) -> list[RunnerInput]:
    """The processor's output as the runner's inputs in order: each run of ``image_id`` in ``input_ids``
    one image (the next of ``pixel_values``), the text between in pieces of at most ``rows`` tokens, none of
    exactly ``block`` tokens (see the module doc)."""
    ids = batch["input_ids"].reshape(-1).tolist()
    pixels = batch["pixel_values"]
    images = list(pixels.reshape(-1, *pixels.shape[-3:]).float())
    out: list[RunnerInput] = []
    text: list[int] = []

    def flush():
        i = 0
        while i < len(text):
            n = min(rows, len(text) - i)
            if block is not None and n == block:
                n -= 1
            out.append(("tokens", text[i : i + n]))
            i += n
        text.clear()

    i, used = 0, 0
    while i < len(ids):
        if ids[i] != image_id:
            text.append(ids[i])
            i += 1
            continue
        flush()
        j = i
        while j < len(ids) and ids[j] == image_id:
            j += 1
        if used >= len(images):
            raise ValueError(f"the prompt has more runs of image tokens than the processor made images ({len(images)})")
        out.append(("image", images[used].unsqueeze(0)))
        used += 1
        i = j
    flush()
    if used != len(images):
        raise ValueError(f"the processor made {len(images)} images for {used} runs of image tokens")
    return out


def generate_ids(
    pte: bytes | str | pathlib.Path,
    inputs: list[RunnerInput],
    max_new_tokens: int = 32,
    *,
    result: ImageGeneration | None = None,
    stop_at_eos: bool = True,
) -> list[int]:
    """The python runner (the module doc): the greedy tokens after ``inputs`` (``stop_at_eos`` False: on
    past an EOS id, ``max_new_tokens`` of them)."""
    if isinstance(pte, (str, pathlib.Path)):
        pte = pathlib.Path(pte).read_bytes()
    meta = _meta(pte)
    rows, ctx = int(meta["get_max_seq_len"]), int(meta["get_max_context_len"])
    eos = eos_ids(meta)
    result = result if result is not None else ImageGeneration()
    embed, decoder = LoadedMethod(pte, "token_embedding"), LoadedMethod(pte, "text_decoder")
    vision = None
    pos, logits = 0, None
    t0 = time.perf_counter()
    for kind, value in inputs:
        if kind == "image":
            vision = vision or LoadedMethod(pte, "vision_encoder")
            emb = vision([value])[0]
            result.images += 1
        else:
            emb = embed([torch.tensor([value], dtype=torch.long)])[0]
        s = int(emb.shape[1])
        if s > rows:
            raise ValueError(f"an input of {s} rows exceeds the {rows} rows one text_decoder call takes (get_max_seq_len)")
        if pos + s >= ctx:
            raise ValueError(f"the prompt ({pos + s} rows) does not fit the cache of {ctx} positions (get_max_context_len)")
        logits = decoder([emb, torch.tensor([pos], dtype=torch.long)])[0]
        pos += s
    if logits is None:
        raise ValueError("empty prompt")
    result.prompt_tokens = pos
    result.prefill_seconds = time.perf_counter() - t0

    def step(token: int, position: int) -> torch.Tensor:
        emb = embed([torch.tensor([[token]], dtype=torch.long)])[0]
        return decoder([emb, torch.tensor([position], dtype=torch.long)])[0]

    for _ in greedy(
        step, logits, pos, max_new_tokens, stats=result, eos=eos, stop_at_eos=stop_at_eos, max_len=ctx, end="max_context_len"
    ):
        pass
    return result.tokens


def prompt_inputs(pte, folder, prompt: str, image, *, chat: bool = False) -> list[RunnerInput]:
    """The runner's inputs for ``prompt`` and ``image`` by the folder's processor, cut for the program
    (``chat``: the prompt in the processor's chat template)."""
    meta = _meta(pte)
    processor = load_processor(folder)
    batch = process(processor, prompt, image, chat=chat, folder=folder)
    block = meta.get("image_block_rows")
    return runner_inputs(batch, image_token_id(processor), int(meta["get_max_seq_len"]), int(block) if block else None)


def generate_image(
    pte: str | pathlib.Path,
    folder: str | pathlib.Path,
    image,
    prompt: str,
    max_new_tokens: int = 32,
    *,
    runner: str = "python",
    chat: bool = False,
) -> ImageGeneration:
    """The text the program writes about ``image`` after ``prompt`` (greedy). ``folder``: the checkpoint
    folder (its processor and tokenizer). ``chat``: the image and prompt as a user message in the
    processor's chat template."""
    pte = pathlib.Path(pte)
    inputs = prompt_inputs(pte, folder, prompt, image, chat=chat)
    if runner == "executorch":
        text = generate_with_executorch_runner(pte, folder, inputs, max_new_tokens)
        return ImageGeneration(text=text, stopped_by="executorch MultimodalRunner")
    result = ImageGeneration()
    generate_ids(pte, inputs, max_new_tokens, result=result)
    processor = load_processor(folder)
    result.text = processor.tokenizer.decode(result.tokens, skip_special_tokens=True)
    return result


def generate_with_executorch_runner(
    pte: str | pathlib.Path, folder: str | pathlib.Path, inputs: list[RunnerInput], max_new_tokens: int
) -> str:
    """executorch's C++ ``MultimodalRunner`` (the wheel's binding, MPS delegates emulated) on ``inputs``:
    the text its token callback received (the prefill's token first)."""
    _meta(pte)  # a program without the runner's methods is one ValueError, not a runner abort
    load_emulator()  # registers MPSBackend in the libexecutorch the runner binding links
    from executorch.extension.llm.runner import (  # noqa: PLC0415
        GenerationConfig,
        MultimodalRunner,
        make_image_input,
        make_token_input,
    )

    runner = MultimodalRunner(str(pte), str(tokenizer_file(folder)))
    converted = [make_image_input(v[0]) if k == "image" else make_token_input(list(v)) for k, v in inputs]
    pieces: list[str] = []
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, echo=False)

    try:
        with quiet_stdout():  # it prints each piece itself: the CLI prints the answer once
            runner.generate(converted, config, pieces.append)
    except RuntimeError as e:
        raise ValueError(f"executorch's MultimodalRunner failed: {e} (its log above says why)") from None
    return "".join(pieces)
