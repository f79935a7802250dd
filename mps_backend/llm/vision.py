"""Vision-language models for executorch's MultimodalRunner: an ``hf:`` Gemma 3, SmolVLM or LLaVA
checkpoint -> one ``.pte`` with the runner's methods.

The runner (``extension/llm/runner``, ``MultimodalRunner`` from executorch 1.0; docs/speech-vision.md
cites the lines) calls, for each input of a prompt in order:

    vision_encoder(image: float32 [1, 3, H, W]) -> embeddings [1, N, D]      (an image)
    token_embedding(tokens: int64 [1, T]) -> embeddings [1, T, D]             (a text segment)
    text_decoder(those embeddings [1, S, D], input_pos: int64 [1]) -> logits  (S = N or T, one call)

then per generated token ``token_embedding([1, 1])`` and ``text_decoder([1, 1, D], pos)``. Every
method is the model's own code (transformers' modeling files):

- ``vision_encoder`` (:class:`VisionEncoderStep`): the vision tower and the projector, at the
  processor's fixed resolution; its input is the processor's ``pixel_values`` (normalized float32),
  its output the N embeddings that replace the prompt's N image tokens. One MPS delegate.
- ``token_embedding`` (:class:`TokenEmbeddingStep`): the text model's embedding (Gemma's scaled one
  included), ``T`` bounded dynamic (``1 <= T <= get_max_seq_len``): a gather on CPU.
- ``text_decoder`` (:class:`TextDecoderStep`): the language model and its head over a static KV cache,
  the language models' chunked step (:class:`mps_backend.llm.decoder.HFDecoder`) fed embeddings: the
  CPU pads the ``S`` rows to ``P = get_max_seq_len``, one static ``P``-row MPS delegate computes them,
  the CPU writes the first ``S`` rows of keys and values into the cache; the logits of the last given
  row. Gemma 3 attends bidirectionally within an image (transformers' ``token_type_ids`` mask): a call
  of exactly N rows, the image's, is attended so.
"""

from __future__ import annotations

import torch

from mps_backend.errors import CheckpointError
from mps_backend.llm.checkpoint import LoadedLM
from mps_backend.llm.decoder import HFDecoder
from mps_backend.llm.family import Family, Method, runner_metadata
from mps_backend.llm.multimodal import ImageGeneration, generate_ids, load_processor, process, prompt_inputs
from mps_backend.llm.options import ExportOptions
from mps_backend.llm.spec import parse_model_spec
from mps_backend.llm.swap import Replacements
from mps_backend.llm.verify import LLMVerification, precision_name, tolerance
from mps_backend.quantize import Quantization

#: the method names (extension/llm/runner/constants.h:23-26 at v1.0.0)
VISION_METHOD, EMBEDDING_METHOD, DECODER_METHOD = "vision_encoder", "token_embedding", "text_decoder"

#: the dtype of the embeddings vision_encoder and token_embedding return and text_decoder takes, whatever the
#: model's: a float16 model's scaled or outlier embeddings may pass 65,504 (they start the residual stream)
EMBEDDINGS_DTYPE = torch.float32

#: the static signatures, as the export summary states them
VISION_SIGNATURE = (
    "vision_encoder pixel_values float32 [1, 3, H, W] -> float32 [1, N, D]; token_embedding tokens [1, T] -> float32 "
    "[1, T, D]; text_decoder float32 embeddings [1, S, D], input_pos [1] -> logits [1, vocab] (S <= get_max_seq_len)"
)


def image_shape(config) -> tuple[int, int]:
    """(H, W) of the vision tower's input: the processor's fixed resolution."""
    size = config.vision_config.image_size
    return (int(size[0]), int(size[1])) if isinstance(size, (list, tuple)) else (int(size), int(size))


def _full_image_position_ids(embeddings: torch.nn.Module, h: int, w: int) -> torch.Tensor:
    """SmolVLM's patch position ids for a whole (unpadded) image, as its own embedding computes them
    (bucketized fractional coordinates, data-dependent in general): read once, eagerly."""
    seen: list[torch.Tensor] = []
    hook = embeddings.position_embedding.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    try:
        dtype = next(embeddings.parameters()).dtype
        patch = embeddings.patch_size
        with torch.no_grad():
            embeddings(torch.zeros(1, 3, h, w, dtype=dtype), torch.ones(1, h // patch, w // patch, dtype=torch.bool))
    finally:
        hook.remove()
    return seen[0].clone()


class VisionEncoderStep(torch.nn.Module):
    """``vision_encoder``: pixel_values float32 ``[1, 3, H, W]`` (the processor's, normalized) ->
    the embeddings replacing the image's N tokens ``[1, N, D]``, float32 (:data:`EMBEDDINGS_DTYPE`)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self.model_type = model.config.model_type
        self.dtype = next(model.parameters()).dtype
        if self.model_type == "smolvlm":
            h, w = image_shape(model.config)
            vision = model.model.vision_model
            self.register_buffer("position_ids", _full_image_position_ids(vision.embeddings, h, w), persistent=False)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        pixel_values = pixel_values.to(self.dtype)
        inner = self.model.model
        if self.model_type == "smolvlm":
            # the vision model on one whole image (no padding patches, no mask), then the connector
            vision = inner.vision_model
            emb = vision.embeddings
            x = emb.patch_embedding(pixel_values).flatten(2).transpose(1, 2) + emb.position_embedding(self.position_ids)
            h = vision.post_layernorm(vision.encoder(inputs_embeds=x, attention_mask=None).last_hidden_state)
            return inner.connector(h).float()
        cfg = self.model.config
        kwargs = {}
        if self.model_type == "llava":
            kwargs = {
                "vision_feature_layer": cfg.vision_feature_layer,
                "vision_feature_select_strategy": cfg.vision_feature_select_strategy,
            }
        out = inner.get_image_features(pixel_values=pixel_values, **kwargs)
        features = getattr(out, "pooler_output", out)
        if isinstance(features, (list, tuple)):
            features = torch.stack(list(features))
        return features.reshape(1, -1, features.shape[-1]).float()


class TokenEmbeddingStep(torch.nn.Module):
    """``token_embedding``: tokens int64 ``[1, T]`` -> the text model's input embeddings ``[1, T, D]``,
    float32 (:data:`EMBEDDINGS_DTYPE`): the rows gathered in the table's dtype, then upcast, and a scaled
    embedding's scale (Gemma's ``sqrt(hidden)``) applied in float32: a float16 row times 50 passes 65,504
    for a trained model's outlier channels, and the text decoder's residual stream is float32 anyway."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.embed = model.get_input_embeddings()
        scale = getattr(self.embed, "embed_scale", None)
        self.scale = None if scale is None else float(scale)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = torch.nn.functional.embedding(tokens, self.embed.weight, self.embed.padding_idx).float()
        return rows if self.scale is None else rows * self.scale


class _Logits:
    def __init__(self, logits: torch.Tensor):
        self.logits = logits


class _LanguageModel(torch.nn.Module):
    """A vision-language model's text stack and head as a causal LM over input embeddings (what
    :class:`HFDecoder` runs): transformers' own language model, its ``lm_head``, Gemma's final logit
    soft-capping where the config sets one."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        inner = model.model
        self.language_model = inner.text_model if hasattr(inner, "text_model") else inner.language_model
        self.lm_head = model.lm_head
        self.softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)

    @property
    def config(self):
        return self.language_model.config

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def _can_set_attn_implementation(self) -> bool:
        return self.language_model._can_set_attn_implementation()

    def set_attn_implementation(self, name: str) -> None:
        self.language_model.set_attn_implementation(name)

    def forward(self, *, inputs_embeds, attention_mask, position_ids, past_key_values, use_cache):
        # float32 embeddings (EMBEDDINGS_DTYPE) into the model's dtype: on the device, where the precision
        # policy keeps the residual stream they start float32 (a float16 program never rounds them)
        out = self.language_model(
            inputs_embeds=inputs_embeds.to(self.lm_head.weight.dtype),
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        logits = self.lm_head(out.last_hidden_state)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return _Logits(logits)


def image_tokens(model: torch.nn.Module) -> int:
    """N: the embeddings one image becomes (the vision encoder's output rows, the prompt's image tokens)."""
    h, w = image_shape(model.config)
    cfg = model.config
    patch = int(cfg.vision_config.patch_size)
    patches = (h // patch) * (w // patch)
    if cfg.model_type == "gemma3":
        return int(cfg.mm_tokens_per_image)
    if cfg.model_type == "smolvlm":
        return patches // int(cfg.scale_factor) ** 2
    return patches + (0 if cfg.vision_feature_select_strategy == "default" else 1)


class TextDecoderStep(HFDecoder):
    """``text_decoder``: embeddings ``[1, S, D]`` (``1 <= S <= P``), input_pos ``[1]`` -> float32 logits
    ``[1, vocab]`` of the last row: :class:`HFDecoder` with a ``P``-row chunk fed embeddings. ``block``:
    a call of exactly that many rows is one image, attended bidirectionally (Gemma 3)."""

    input_key = "inputs_embeds"

    def __init__(
        self, model: torch.nn.Module, max_seq_len: int, rows: int, block: int | None = None, changes: Replacements | None = None
    ):
        super().__init__(_LanguageModel(model), max_seq_len, rows, changes)
        self.block = block

    def _chunk_rows_visible(self, i: torch.Tensor, j: torch.Tensor, n) -> torch.Tensor:
        causal = j <= i
        if self.block is None or n is None:
            return causal
        # the call's rows (the rest are padding) and whether it is an image (an image's N rows come in one
        # call of exactly N), from n alone: computed on CPU before the delegate (nothing the delegate
        # computes feeds them, which would cut it in two)
        ones = torch.ones(n, dtype=j.dtype)
        given = torch.nn.functional.pad(ones, (0, self.chunk - n)).view(1, self.chunk) > 0
        image = ones.sum() == self.block
        return causal | (given & image)


def check_rows(model: torch.nn.Module, rows: int | None, max_seq_len: int) -> int:
    """``P = get_max_seq_len``, the rows one ``text_decoder`` call takes: at least an image's N (the
    runner hands them over in one call), default N."""
    n = image_tokens(model)
    rows = n if rows is None else rows
    if rows < n:
        raise CheckpointError(
            f"--prefill-chunk {rows}: the MultimodalRunner hands text_decoder an image's {n} embeddings in one call "
            f"(its rows per call must be at least {n})"
        )
    if rows >= max_seq_len:
        raise CheckpointError(f"--max-seq-len {max_seq_len}: the cache must hold more than the {rows} rows of one call")
    return rows


def vision_methods(model: torch.nn.Module, max_seq_len: int, rows: int) -> list[Method]:
    """The MultimodalRunner's methods: ``vision_encoder`` and ``token_embedding`` (the model's eager
    attention), ``text_decoder`` (the language model switched to grouped attention and its rotary
    embeddings to tables while it is built and exported)."""
    h, w = image_shape(model.config)
    width = int(model.config.get_text_config().hidden_size)
    pixels = torch.zeros(1, 3, h, w, dtype=torch.float32)
    block = image_tokens(model) if model.config.model_type == "gemma3" else None
    t = torch.export.Dim("tokens", min=1, max=rows)
    s = torch.export.Dim("rows", min=1, max=rows)
    return [
        Method(VISION_METHOD, lambda changes: (VisionEncoderStep(model).eval(), (pixels,), None)),
        Method(
            EMBEDDING_METHOD,
            lambda changes: (TokenEmbeddingStep(model).eval(), (torch.zeros(1, 2, dtype=torch.long),), {"tokens": {1: t}}),
        ),
        Method(
            DECODER_METHOD,
            lambda changes: (
                TextDecoderStep(model, max_seq_len, rows, block, changes).eval(),
                (torch.zeros(1, 2, width, dtype=EMBEDDINGS_DTYPE), torch.zeros(1, dtype=torch.long)),
                {"tokens": {1: s}, "input_pos": None},
            ),
        ),
    ]


def vision_metadata(lm, max_seq_len: int, rows: int) -> dict:
    """The MultimodalRunner's metadata (``get_llm_metadata``): ``get_max_seq_len`` the rows of one
    ``text_decoder`` call, ``get_max_context_len`` the cache's length (the runner stops there)."""
    # Gemma 3: a call of this many rows is an image (attended bidirectionally)
    extra = {"image_block_rows": image_tokens(lm.model)} if lm.model.config.model_type == "gemma3" else {}
    return runner_metadata(lm, rows=rows, context=max_seq_len, dynamic=True, extra=extra)


#: the self-check's prompt (after the image)
VERIFY_PROMPT = "Describe the image."


def verification_image(h: int = 64, w: int = 80):
    """A fixed test picture (gradients, a disc, noise) as a PIL image: the self-check's input."""
    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    y, x = np.mgrid[0:h, 0:w]
    disc = ((y - h / 2) ** 2 + (x - w / 3) ** 2 < (h / 4) ** 2) * 200.0
    noise = np.random.default_rng(0).integers(0, 40, (h, w))
    rgb = np.stack([x * 255.0 / w, y * 255.0 / h, disc + noise], axis=-1)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


def text_part(model: torch.nn.Module) -> torch.nn.Module:
    """The language model of a vision-language model and its head, as one container of those same
    modules: what ``--quantize`` quantizes (the weights every decode step reads). The vision encoder
    and its projector run once an image, compute-bound, and stay in the export's float precision."""
    return torch.nn.ModuleDict({"language_model": model.get_decoder(), "lm_head": model.get_output_embeddings()})


def eager_reference(
    folder,
    batch,
    generated: list[int],
    *,
    quantization: Quantization | None = None,
    dtype: str = "fp32",
) -> torch.Tensor:
    """transformers' eager float32 model on the processor's ``batch`` followed by ``generated`` (teacher-forced,
    one forward): the logits after the prompt's last token and after each generated token but the last,
    ``[len(generated), vocab]``. With ``quantization``, the text part's weights (:func:`text_part`) are
    quantized as an export in ``dtype`` quantizes them (from weights in that precision) and
    dequantized, then computed in float32: the same quantized weights, eagerly."""
    import transformers  # noqa: PLC0415

    load = torch.float16 if quantization and dtype == "fp16" else torch.float32
    model = transformers.AutoModelForImageTextToText.from_pretrained(
        folder, dtype=load, attn_implementation="eager", local_files_only=True, trust_remote_code=False
    ).eval()
    if quantization:
        quantization.dequantize_alike(text_part(model))
        model.float()
    extra = torch.tensor([generated[:-1]], dtype=torch.long)
    inputs = dict(batch)
    inputs["input_ids"] = torch.cat([batch["input_ids"], extra], dim=1)
    for key in ("attention_mask", "token_type_ids", "mm_token_type_ids"):
        if key in inputs:
            fill = torch.ones_like(extra) if key == "attention_mask" else torch.zeros_like(extra)
            inputs[key] = torch.cat([inputs[key], fill], dim=1)
    n = batch["input_ids"].shape[1]
    with torch.no_grad():
        logits = model(**inputs).logits[0]
    return logits[n - 1 : n - 1 + len(generated)].float()


def verify_vision(result, model: str, options: ExportOptions, *, pte=None):
    """The export's self-check: the written ``.pte`` on the emulated runtime (the python MultimodalRunner
    loop on :func:`verification_image` and :data:`VERIFY_PROMPT` through the folder's processor, then
    ``options.verify_steps`` greedy tokens) against transformers' eager float32 model on the same inputs,
    teacher-forced; the language models' tolerances."""
    steps = options.verify_steps
    _, folder = parse_model_spec(model)
    where = pte or result.path
    image = verification_image()
    run = ImageGeneration(logits=[])
    tokens = generate_ids(where, prompt_inputs(where, folder, VERIFY_PROMPT, image), steps, result=run, stop_at_eos=False)
    batch = process(load_processor(folder), VERIFY_PROMPT, image)
    dtype = precision_name(options.precision)
    ref = eager_reference(folder, batch, tokens, dtype=dtype, quantization=options.quantization)
    dev = torch.stack(run.logits)
    quantized = f" ({options.quantize} text weights quantized alike, dequantized)" if options.quantize else ""
    return LLMVerification(
        steps=len(tokens),
        max_abs_diff=float((dev - ref).abs().max()),
        scale=float(ref.abs().max()),
        tolerance=tolerance(dtype, options.quantize),
        tokens_agree=sum(int(a) == b for a, b in zip(ref.argmax(-1).tolist(), tokens)),
        reference=f"eager transformers float32{quantized}, after a test image and {VERIFY_PROMPT!r} through the "
        f"checkpoint's processor ({run.prompt_rows} rows), teacher-forced",
    )


class VisionLanguage(Family):
    """Vision-language models (:data:`mps_backend.llm.registry.VISION_LANGUAGE_TYPES`) for executorch's
    MultimodalRunner (the module doc)."""

    name = "vision-language"
    signature = VISION_SIGNATURE
    quantize_rest = "; the vision encoder stays in float"

    def check(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> None:
        super().check(lm, options, max_seq_len)
        if options.quantize_embedding:
            raise CheckpointError(
                f"--quantize-embedding: not done for vision-language models ({lm.model_type}): their token_embedding "
                "method reads the float table"
            )

    def chunk_choice(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> None:
        return None  # its rows are fixed by its runner (rows below), not chosen for a device

    def rows(self, lm: LoadedLM, options: ExportOptions, max_seq_len: int) -> int:
        return check_rows(lm.model, options.prefill_chunk, max_seq_len)  # at least an image's embeddings

    def quantize_target(self, lm: LoadedLM) -> torch.nn.Module:
        return text_part(lm.model)

    def methods(self, lm: LoadedLM, max_seq_len: int, rows: int) -> list[Method]:
        return vision_methods(lm.model, max_seq_len, rows)

    def metadata(self, lm: LoadedLM, max_seq_len: int, rows: int) -> dict:
        return vision_metadata(lm, max_seq_len, rows)

    def dynamic(self, rows: int) -> bool:
        return True  # token_embedding takes [1, T] and text_decoder [1, S, D]: padding and slices on CPU

    def describe(self, max_seq_len: int, rows: int) -> str:
        return f"{max_seq_len} (KV cache; {self.signature}; the device computes {rows} rows per text_decoder call)"

    def verify(self, result, spec: str, options: ExportOptions, pte, export):
        return verify_vision(result, spec, options, pte=pte)


FAMILY = VisionLanguage()
