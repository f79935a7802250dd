"""Static-shape decode-step programs for language models: what the MPS delegate can run.

The device has no dynamic shapes, so a language model becomes one method with fixed shapes, the
signature executorch's LLM runner calls for a model with a KV cache and no dynamic shapes:

    forward(tokens: int64 [1, 1], input_pos: int64 [1]) -> logits: float32 [1, vocab]

The KV cache is one pair of mutable buffers per layer, V ``[1, kv_heads, max_seq_len, head_dim]``
and K transposed ``[1, kv_heads, head_dim, max_seq_len]`` (what ``q @ K^T`` reads, so the cache is
never transposed per step; K as V's layout for a model whose attention cannot be replaced),
updated in place at ``input_pos`` (``v_cache[:, :, input_pos] = v``); attention is grouped (the
query heads sharing a KV head read it once, no ``repeat_kv``) and RoPE's cos/sin come from float32
tables gathered by position (:mod:`mps_backend.llm.attention`). The prompt is prefilled token by
token through the same method (the runner does so when ``enable_dynamic_shape`` is false). Attention
reads the whole cache under a mask computed from ``input_pos``: key position ``k`` is visible to
the query at position ``p`` when ``k <= p`` (and, for a sliding-window layer of width ``w``,
``p - k < w``), the rule transformers' own masks implement.

- :class:`HFDecoder` wraps a transformers ``*ForCausalLM`` (Llama, Qwen2/3, Mistral, Phi-3,
  Gemma 2/3, SmolLM, ...): transformers' own modeling code runs with the cache passed as
  ``past_key_values`` and the mask(s) passed precomputed, so no transformers cache or mask machinery
  (data-dependent lengths, vmap) enters the graph.
- :class:`ExecutorchLlamaDecoder` wraps executorch's example llama (``use_kv_cache=True``), whose
  own KV cache already has this shape.
"""

from __future__ import annotations

import torch

from mps_backend.llm.attention import group_llama_attention, tabulate_rope, use_grouped_attention, with_new_rows, write_kv_rows
from mps_backend.pages import untouched_zeros


def _head_dim(config) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def kv_heads(config) -> int:
    """The KV heads a layer writes into the cache: ``num_key_value_heads`` where the config class has
    that field (a GPT-2/NeoX/OPT config given one keeps it as an unused extra: every head); Falcon's
    own: one for its multi-query layout, every head for its new decoder architecture (Falcon-40B)."""
    if getattr(config, "model_type", None) == "falcon":
        if config.new_decoder_architecture:
            return int(config.num_attention_heads)
        return 1 if config.multi_query else int(config.num_kv_heads)
    fields = getattr(type(config), "__dataclass_fields__", None)
    declared = fields is None or "num_key_value_heads" in fields or "num_key_value_heads" in config.attribute_map
    return int((declared and getattr(config, "num_key_value_heads", None)) or config.num_attention_heads)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where visible, -inf elsewhere, shaped ``[1, 1, 1, S]`` (added to the attention scores)."""
    zero = torch.zeros((), dtype=dtype)
    return torch.where(visible, zero, torch.full((), float("-inf"), dtype=dtype)).view(1, 1, 1, -1)


def register_kv_caches(
    module: torch.nn.Module, n_layers: int, kv_heads: int, head_dim: int, max_seq_len: int, dtype: torch.dtype, *, grouped: bool
) -> None:
    """Give ``module`` its KV-cache buffers ``k_cache_{i}`` / ``v_cache_{i}`` (what :class:`StaticCache`
    reads and writes): V ``[1, kv_heads, max_seq_len, head_dim]``, K the same or, ``grouped``,
    transposed ``[1, kv_heads, head_dim, max_seq_len]``."""
    shape = (1, kv_heads, max_seq_len, head_dim)
    k_shape = (1, kv_heads, head_dim, max_seq_len) if grouped else shape
    for i in range(n_layers):
        # zero pages the kernel supplies when written: no memory until a step writes rows
        module.register_buffer(f"k_cache_{i}", untouched_zeros(k_shape, dtype), persistent=False)
        module.register_buffer(f"v_cache_{i}", untouched_zeros(shape, dtype), persistent=False)


class StaticCache:
    """The object transformers' attention layers see as ``past_key_values`` (one per forward), over the
    buffers of ``owner`` (:func:`register_kv_caches`; ``owner.grouped``: K transposed).
    Grouped attention: ``update`` returns the old buffers carrying the new rows (read in place, the
    rows attended to separately: mps_backend.llm.attention) and keeps the rows in ``pending``, which
    :meth:`write_pending` writes after the model's forward. Otherwise it writes the new key/value at
    ``input_pos`` and returns the whole buffers."""

    is_compileable = True

    def __init__(self, owner: torch.nn.Module, input_pos: torch.Tensor):
        self.owner, self.input_pos = owner, input_pos
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        k_cache = getattr(self.owner, f"k_cache_{layer_idx}")
        v_cache = getattr(self.owner, f"v_cache_{layer_idx}")
        if self.owner.grouped:  # K stored transposed, [1, KV, d, S]: the new key is one column
            k_t = key.transpose(2, 3)
            self.pending[layer_idx] = (k_t, value)
            return with_new_rows(k_cache, k_t, value), v_cache
        k_cache[:, :, self.input_pos] = key
        v_cache[:, :, self.input_pos] = value
        return k_cache, v_cache

    def write_pending(self) -> None:
        for i, (k_t, value) in self.pending.items():
            write_kv_rows(getattr(self.owner, f"k_cache_{i}"), getattr(self.owner, f"v_cache_{i}"), self.input_pos, k_t, value)
        self.pending = {}

    def get_seq_length(self, layer_idx: int = 0) -> torch.Tensor:
        """The positions before this step's token (models that ask, e.g. Falcon, get ``input_pos``)."""
        return self.input_pos.view(())


class HFDecoder(torch.nn.Module):
    """One decode step of a transformers causal LM over a static KV cache (see the module doc)."""

    def __init__(self, model: torch.nn.Module, max_seq_len: int):
        super().__init__()
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.model = model
        self.max_seq_len = int(max_seq_len)
        self.n_layers = int(config.num_hidden_layers)
        kv = kv_heads(config)
        dtype = next(model.parameters()).dtype
        # grouped attention (no repeat_kv, K cache transposed) where the modeling code dispatches
        # through transformers' AttentionInterface; RoPE from float32 tables (mps_backend.llm.attention)
        self.grouped = use_grouped_attention(model)
        self.rope_tables = tabulate_rope(model, self.max_seq_len, dtype)
        register_kv_caches(self, self.n_layers, kv, _head_dim(config), self.max_seq_len, dtype, grouped=self.grouped)
        self.mask_dtype = dtype
        window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None)
        if isinstance(layer_types, (list, tuple)):
            # models that take a dict of masks keyed by layer type (Qwen2/3, Gemma 2/3, SmolLM3, ...)
            self.mask_kinds: tuple[str, ...] | None = tuple(sorted(set(layer_types)))
            self.window = int(window) if window else None
        else:
            # one mask for every layer: sliding when the config sets a window (Mistral, Phi-3)
            self.mask_kinds = None
            self.window = int(window) if window else None
        if self.mask_kinds and "sliding_attention" in self.mask_kinds and not self.window:
            raise ValueError(f"{type(model).__name__}: sliding_attention layers but no sliding_window in the config")

    def _masks(self, input_pos: torch.Tensor):
        k = torch.arange(self.max_seq_len, dtype=input_pos.dtype)
        # grouped attention reads the old cache (the new row joins separately): positions < input_pos
        visible = k < input_pos if self.grouped else k <= input_pos
        full = additive_mask(visible, self.mask_dtype)
        if self.window is not None:
            sliding = additive_mask(visible & (k > input_pos - self.window), self.mask_dtype)
        if self.mask_kinds is None:
            return sliding if self.window is not None else full
        masks = {}
        for kind in self.mask_kinds:
            if kind == "full_attention":
                masks[kind] = full
            elif kind == "sliding_attention":
                masks[kind] = sliding
            else:
                raise ValueError(f"layer type {kind!r} is not supported by the static decode step")
        return masks

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        cache = StaticCache(self, input_pos)
        out = self.model(
            input_ids=tokens,
            attention_mask=self._masks(input_pos),
            position_ids=input_pos.view(1, -1),
            past_key_values=cache,
            use_cache=True,
        )
        cache.write_pending()  # the cache writes after attention: index_put on CPU, in place
        return out.logits[:, -1, :].float()


class ExecutorchLlamaDecoder(torch.nn.Module):
    """executorch's example llama built with ``use_kv_cache=True``: ``(tokens, input_pos)`` ->
    float32 logits of the last token."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        # grouped attention over a transposed-K cache (mps_backend.llm.attention)
        self.grouped_layers = group_llama_attention(model)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        caches = [m for m in self.model.modules() if hasattr(m, "write_pending")]
        for cache in caches:
            cache.pending = []
        try:
            logits = self.model(tokens, {"input_pos": input_pos})
            for cache in caches:  # the cache writes after attention: index_put on CPU, in place
                cache.write_pending()
        finally:
            for cache in caches:
                cache.pending = None
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.reshape(1, -1, logits.shape[-1])[:, -1, :].float()


def example_inputs(position: int = 0, token: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [1, 1], input_pos [1])`` for one decode step."""
    return torch.tensor([[token]], dtype=torch.long), torch.tensor([position], dtype=torch.long)
