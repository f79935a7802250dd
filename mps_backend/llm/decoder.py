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
  (data-dependent lengths, vmap) enters the graph. Recurrent layers (short convolutions, linear
  attention, Mamba) keep their states in buffers beside the cache (:mod:`mps_backend.llm.recurrent`).
- :class:`ExecutorchLlamaDecoder` wraps executorch's example llama (``use_kv_cache=True``), whose
  own KV cache already has this shape.
"""

from __future__ import annotations

import torch

from mps_backend.llm.attention import (
    LatentAttention,
    complex_rope_swaps,
    group_llama_attention,
    latent_attention_layers,
    tabulate_rope,
    use_grouped_attention,
    with_new_rows,
    write_kv_rows,
    write_rows,
)
from mps_backend.llm.recurrent import (
    ATTENTION_KINDS,
    States,
    chunk_scan_modules,
    chunk_scan_swaps,
    known_scans,
    probe_states,
    register_states,
    restart_at_zero,
    state_buffer,
)
from mps_backend.llm.swap import swapped
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


def cache_layout(model: torch.nn.Module, config) -> tuple[int, int, int]:
    """(KV heads, K columns, V columns) of a layer's cache rows: for multi-head latent attention one
    head of ``kv_lora_rank + qk_rope_head_dim`` K and ``kv_lora_rank`` V columns (the compressed KV,
    :class:`mps_backend.llm.attention.LatentAttention`), else :func:`kv_heads` of ``head_dim``."""
    rank, rope = getattr(config, "kv_lora_rank", None), getattr(config, "qk_rope_head_dim", None)
    if rank and rope and any(hasattr(m, "kv_b_proj") for m in model.modules()):
        return 1, int(rank) + int(rope), int(rank)
    d = _head_dim(config)
    return kv_heads(config), d, d


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, rows: int = 1) -> torch.Tensor:
    """0 where visible, -inf elsewhere, shaped ``[1, 1, rows, S]`` (added to the attention scores)."""
    zero = torch.zeros((), dtype=dtype)
    return torch.where(visible, zero, torch.full((), float("-inf"), dtype=dtype)).view(1, 1, rows, -1)


def check_chunk(chunk: int, max_seq_len: int) -> int:
    """The rows a delegate call computes: ``1 <= chunk <= max_seq_len`` (ValueError otherwise)."""
    if not isinstance(chunk, int) or isinstance(chunk, bool) or not 1 <= chunk <= max_seq_len:
        raise ValueError(f"prefill chunk must be an integer from 1 to the cache length {max_seq_len}, got {chunk!r}")
    return chunk


def register_kv_caches(
    module: torch.nn.Module,
    n_layers: int,
    kv_heads: int,
    head_dim: int,
    max_seq_len: int,
    dtype: torch.dtype,
    *,
    grouped: bool,
    v_head_dim: int | None = None,
    without: frozenset[int] | set[int] = frozenset(),
) -> None:
    """Give ``module`` its KV-cache buffers ``k_cache_{i}`` / ``v_cache_{i}`` (what :class:`StaticCache`
    reads and writes): V ``[1, kv_heads, max_seq_len, v_head_dim]`` (default ``head_dim``), K
    ``[1, kv_heads, max_seq_len, head_dim]`` or, ``grouped``, transposed ``[1, kv_heads, head_dim, max_seq_len]``."""
    shape = (1, kv_heads, max_seq_len, v_head_dim or head_dim)
    k_shape = (1, kv_heads, head_dim, max_seq_len) if grouped else (1, kv_heads, max_seq_len, head_dim)
    for i in range(n_layers):
        if i in without:  # a layer that keeps a recurrent state and no attention (mps_backend.llm.recurrent)
            continue
        # zero pages the kernel supplies when written: no memory until a step writes rows
        module.register_buffer(f"k_cache_{i}", untouched_zeros(k_shape, dtype), persistent=False)
        module.register_buffer(f"v_cache_{i}", untouched_zeros(shape, dtype), persistent=False)


class StaticCache:
    """The object transformers' attention layers see as ``past_key_values`` (one per forward), over the
    buffers of ``owner`` (:func:`register_kv_caches`; ``owner.grouped``: K transposed).
    Grouped attention: ``update`` returns the old K buffer carrying the new rows (read in place, the
    rows attended to separately) and the values ``[V_old; v]`` (read apart too, unless the layer transforms
    them first: mps_backend.llm.attention.with_new_rows) and keeps the rows in ``pending``, which
    :meth:`write_pending` writes after the model's forward. Otherwise it writes the new key/value at
    ``input_pos`` and returns the whole buffers."""

    is_compileable = True

    def __init__(self, owner: torch.nn.Module, input_pos: torch.Tensor):
        self.owner, self.input_pos = owner, input_pos
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        #: a chunk's prompt rows, int64 ``[1]`` (its first ``given`` rows; the rest are padding): what a conv
        #: state keeps
        self.given: torch.Tensor | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        if layer_idx in getattr(self.owner, "latent", ()):  # latent attention: (c, k_rot) -> K rows [c, k_rot], V rows c
            key, value = LatentAttention.cache_rows(key, value)
        k_cache = getattr(self.owner, f"k_cache_{layer_idx}")
        v_cache = getattr(self.owner, f"v_cache_{layer_idx}")
        if self.owner.grouped:  # K stored transposed, [1, KV, d, S]: the new keys are columns
            k_t = key.transpose(2, 3)
            self.pending[layer_idx] = (k_t, value)
            return with_new_rows(k_cache, v_cache, k_t, value)
        if getattr(self.owner, "chunk", 1) > 1:  # eager attention over the old cache then the chunk's own rows
            self.pending[layer_idx] = (key, value)
            return torch.cat([k_cache, key], dim=2), torch.cat([v_cache, value], dim=2)
        k_cache[:, :, self.input_pos] = key
        v_cache[:, :, self.input_pos] = value
        return k_cache, v_cache

    def write_pending(self, positions: torch.Tensor | None = None, n=None) -> None:
        """Write the rows kept by :meth:`update` at ``positions`` (default: ``input_pos``); a chunk
        writes its first ``n`` rows only (the rest are padding, never written)."""
        positions = self.input_pos if positions is None else positions
        for i, (k_rows, value) in self.pending.items():  # grouped: K transposed, [1, KV, d, T]
            k_cache, v_cache = getattr(self.owner, f"k_cache_{i}"), getattr(self.owner, f"v_cache_{i}")
            if n is not None:
                k_rows, value = k_rows[..., :n] if self.owner.grouped else k_rows[:, :, :n], value[:, :, :n]
            if self.owner.grouped:
                write_kv_rows(k_cache, v_cache, positions, k_rows, value)
            else:  # K as V's layout
                write_rows(k_cache, 2, positions, k_rows)
                write_rows(v_cache, 2, positions, value)
        self.pending = {}

    # the states of recurrent layers (mps_backend.llm.recurrent): always present, so the layer takes its
    # one-token path; written back in place (copy_) by the layer or through update_*_state
    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return state_buffer(self.owner, "conv", layer_idx, state_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return state_buffer(self.owner, "recurrent", layer_idx, state_idx)

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs) -> torch.Tensor:
        """The state followed by the new columns (what the layer's convolution reads); the state keeps the last
        ones, in a chunk the last of its prompt rows (columns ``given .. given + K - 1``: the padding after them
        is never kept)."""
        state = state_buffer(self.owner, "conv", layer_idx, state_idx)
        full = torch.cat([state, conv_states.to(state.dtype)], dim=-1)
        k = state.shape[-1]
        if self.given is None:
            state.copy_(full[..., -k:])
        else:
            state.copy_(full.index_select(-1, torch.arange(k, dtype=torch.long) + self.given))
        return full

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs
    ) -> torch.Tensor:
        state = state_buffer(self.owner, "recurrent", layer_idx, state_idx)
        state.copy_(recurrent_states)
        return state

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def get_seq_length(self, layer_idx: int = 0) -> torch.Tensor:
        """The positions before this step's token (models that ask, e.g. Falcon, get ``input_pos``)."""
        return self.input_pos.view(())


def has_recurrent_layers(config) -> bool:
    """A config whose layers keep a recurrent state (a layer type beyond attention, or a convolution or
    Mamba size): its model is probed for the states' shapes (mps_backend.llm.recurrent)."""
    kinds = getattr(config, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and any(k not in ATTENTION_KINDS for k in kinds):
        return True
    names = config.to_dict() if hasattr(config, "to_dict") else {}
    return any(("conv" in k and "kernel" in k) or k.startswith("mamba_") or k == "conv_L_cache" for k in names)


class HFDecoder(torch.nn.Module):
    """One decode step of a transformers causal LM over a static KV cache (see the module doc)."""

    #: the model's keyword for what ``forward`` is given (a vision-language text decoder: ``inputs_embeds``)
    input_key = "input_ids"

    def __init__(self, model: torch.nn.Module, max_seq_len: int, chunk: int = 1):
        super().__init__()
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.model = model
        self.max_seq_len = int(max_seq_len)
        self.chunk = check_chunk(chunk, self.max_seq_len)
        self._row: torch.Tensor | None = None  # during a chunk's forward: the row lm_head reads
        if self.chunk > 1:
            # the positions 0 .. max_seq_len-1, gathered on CPU by a chunk's positions: executorch's
            # portable index_select refuses an index past the cache (a clean error, before the delegate)
            self.register_buffer("positions", torch.arange(self.max_seq_len, dtype=torch.long), persistent=False)
            head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
            if head is None:
                raise ValueError(f"{type(model).__name__}: no output embeddings (lm_head) to read one row of a chunk")
            head.register_forward_pre_hook(self._last_row)
        self.n_layers = int(config.num_hidden_layers)
        dtype = next(model.parameters()).dtype
        # recurrent layers (short convolutions, linear attention, Mamba): their states as buffers, their shapes
        # from one eager step (before the attention is replaced: transformers' own cache and attention)
        self.states = probe_states(model) if has_recurrent_layers(config) else States()
        # a chunk's padding rows must leave the recurrent states alone: the scans that update them for more
        # than one row are told which rows are the prompt's (a short convolution's state needs none of it)
        self.chunk_scans = chunk_scan_modules(model) if self.states else ()
        if self.chunk > 1 and not self.chunk_scans and any(kind != "conv" for kind, _, _ in self.states):
            raise ValueError(
                "--prefill-chunk: the recurrent states of this model are updated by a scan the export does not know "
                f"(known: {known_scans()}), which a chunk's padding rows would update"
            )
        register_states(self, self.states)
        # grouped attention (no repeat_kv, K cache transposed) where the modeling code dispatches
        # through transformers' AttentionInterface; RoPE from float32 tables (mps_backend.llm.attention)
        self.grouped = use_grouped_attention(model)
        self.rope_tables = tabulate_rope(model, self.max_seq_len, dtype)
        # RoPE as complex numbers (Llama 4, DeepSeek V2): applied in real arithmetic in the forward
        self.rope_swaps = complex_rope_swaps(model)
        # multi-head latent attention: the compressed latent and rotary key cached, attention absorbed
        self.latent = latent_attention_layers(model) if self.grouped else {}
        kv, head_dim, v_dim = cache_layout(model, config)
        register_kv_caches(
            self,
            self.n_layers,
            kv,
            head_dim,
            self.max_seq_len,
            dtype,
            grouped=self.grouped,
            v_head_dim=v_dim,
            without=self.states.recurrent_only,
        )
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
        self.attention_chunk = None
        if self.mask_kinds and "chunked_attention" in self.mask_kinds:
            size = getattr(config, "attention_chunk_size", None)
            if not size:
                raise ValueError(f"{type(model).__name__}: chunked_attention layers but no attention_chunk_size in the config")
            # Llama 4's chunked layers: position p sees k <= p of its own chunk of `size` positions
            # (k >= the chunk's first position): a table of each position's chunk start, gathered by
            # position (no integer division on the device)
            self.attention_chunk = int(size)
            starts = torch.arange(self.max_seq_len, dtype=torch.long) // self.attention_chunk * self.attention_chunk
            self.register_buffer("chunk_starts", starts, persistent=False)

    def _masks(self, input_pos: torch.Tensor):
        k = torch.arange(self.max_seq_len, dtype=input_pos.dtype)
        # grouped attention reads the old cache (the new row joins separately): positions < input_pos
        visible = k < input_pos if self.grouped else k <= input_pos
        full = additive_mask(visible, self.mask_dtype)
        if self.window is not None:
            sliding = additive_mask(visible & (k > input_pos - self.window), self.mask_dtype)
        chunked = None
        if self.attention_chunk is not None:
            chunked = additive_mask(visible & (k >= torch.index_select(self.chunk_starts, 0, input_pos)), self.mask_dtype)
        return self._by_kind(full, sliding if self.window is not None else None, chunked)

    def _by_kind(self, full: torch.Tensor, sliding: torch.Tensor | None, chunked: torch.Tensor | None = None):
        """The mask(s) the model takes: one (sliding where the config sets a window) or one per layer type."""
        one = sliding if sliding is not None else full
        # a model with recurrent layers keys its masks by its own layer types or by transformers' two
        # (full_attention, linear_attention; Falcon-H1's layers are all "hybrid"): both given, a
        # recurrent kind None (its layers read no mask: nothing padded to zero)
        recurrent = {"full_attention": one, "linear_attention": None} if self.states else {}
        if self.mask_kinds is None:
            return recurrent or one
        masks = {"full_attention": full, "sliding_attention": sliding, "chunked_attention": chunked}
        for kind in self.mask_kinds:
            if kind not in ATTENTION_KINDS and self.states:
                masks[kind] = None
            elif masks.get(kind) is None:
                raise ValueError(f"layer type {kind!r} is not supported by the static decode step")
        return recurrent | {kind: masks[kind] for kind in self.mask_kinds}

    def _last_row(self, module: torch.nn.Module, args: tuple):
        """lm_head's forward pre-hook: in a chunk, only the last prompt row's logits are computed."""
        if self._row is None:
            return None
        return (args[0].index_select(1, self._row), *args[1:])

    def _chunk_rows_visible(self, i: torch.Tensor, j: torch.Tensor, n) -> torch.Tensor:
        """Which of the chunk's own rows ``j`` query row ``i`` sees (``n``: the rows given): causal, ``j <= i``."""
        return j <= i

    def _chunk_masks(self, input_pos: torch.Tensor, n=None):
        """Additive masks ``[1, 1, C, S + C]`` of a chunk: query row ``i`` (position ``input_pos + i``) sees
        the old cache's positions ``< input_pos`` and the chunk's rows ``j <= i`` (:meth:`_chunk_rows_visible`);
        a sliding layer of width ``w`` only those less than ``w`` positions back. Padding rows come after the
        prompt's ``n`` rows, so no prompt row sees one."""
        c, s = self.chunk, self.max_seq_len
        i = torch.arange(c, dtype=input_pos.dtype).view(c, 1)
        j = torch.arange(c, dtype=input_pos.dtype).view(1, c)
        k = torch.arange(s, dtype=input_pos.dtype).view(1, s)
        old, new = (k < input_pos).expand(c, s), self._chunk_rows_visible(i, j, n)
        full = additive_mask(torch.cat([old, new], dim=1), self.mask_dtype, c)
        sliding = None
        if self.window is not None:
            old_w = old & (input_pos + i - k < self.window)
            sliding = additive_mask(torch.cat([old_w, new & (i - j < self.window)], dim=1), self.mask_dtype, c)
        chunked = None
        if self.attention_chunk is not None:  # row i's chunk starts at starts[i] (positions clamped to the cache)
            rows = (input_pos + torch.arange(c, dtype=input_pos.dtype)).clamp(max=s - 1)
            starts = torch.index_select(self.chunk_starts, 0, rows).view(c, 1)
            in_chunk = torch.cat([old & (k >= starts), new & (input_pos + j >= starts)], dim=1)
            chunked = additive_mask(in_chunk, self.mask_dtype, c)
        return self._by_kind(full, sliding, chunked)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """A decode step (``chunk`` 1: ``tokens [1, 1]``), or ``tokens [1, n]``, ``1 <= n <= C``: the CPU
        pads them to ``C`` rows, the delegate computes the chunk (static shapes), the CPU writes the first
        ``n`` rows of keys and values into the cache."""
        cache = StaticCache(self, input_pos)
        if self.states:
            restart_at_zero(self, self.states, input_pos)
        if self.chunk > 1:
            n, positions, last, tokens, rows = chunk_inputs(tokens, input_pos, self.positions, self.chunk)
            masks, position_ids, self._row = self._chunk_masks(input_pos, n), rows.view(1, -1), last - input_pos
            cache.given = self._row + 1  # n as a tensor [1] (the device adds it to a constant range)
        else:
            n, positions, masks, position_ids = None, None, self._masks(input_pos), input_pos.view(1, -1)
        swaps = self.rope_swaps
        if cache.given is not None and self.chunk_scans:  # the prompt's rows of the chunk
            swaps += chunk_scan_swaps(self.chunk_scans, torch.arange(self.chunk, dtype=torch.long) < cache.given)
        try:
            with swapped(swaps):
                out = self.model(
                    **{self.input_key: tokens},
                    attention_mask=masks,
                    position_ids=position_ids,
                    past_key_values=cache,
                    use_cache=True,
                )
        finally:
            self._row = None
        cache.write_pending(positions, n)  # the cache writes after attention: index_put on CPU, in place
        return out.logits[:, -1, :].float()


class ExecutorchLlamaDecoder(torch.nn.Module):
    """executorch's example llama built with ``use_kv_cache=True``: ``(tokens, input_pos)`` ->
    float32 logits of the last token; with ``chunk`` > 1, ``tokens [1, n]``, ``n <= chunk``, as
    :class:`HFDecoder`."""

    def __init__(self, model: torch.nn.Module, max_seq_len: int | None = None, chunk: int = 1):
        super().__init__()
        self.model = model
        # grouped attention over a transposed-K cache (mps_backend.llm.attention)
        self.grouped_layers = group_llama_attention(model)
        self.max_seq_len = int(max_seq_len or model.params.max_context_len)
        self.chunk = check_chunk(chunk, self.max_seq_len)
        if self.chunk > 1:
            if not self.grouped_layers or getattr(model, "generate_full_logits", False):
                raise ValueError("a prefill chunk needs executorch's llama with its static KV cache and last-token logits")
            self.register_buffer("positions", torch.arange(self.max_seq_len, dtype=torch.long), persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        caches = [m for m in self.model.modules() if hasattr(m, "write_pending")]
        for cache in caches:
            cache.pending = []
        try:
            if self.chunk > 1:
                n, positions, last, padded, rows = chunk_inputs(tokens, input_pos, self.positions, self.chunk)
                # the model reads its RoPE rows and causal-mask rows at every row's position; its
                # attention (_GroupedSDPA) reads the old cache before the chunk's first position
                options = {"input_pos": rows, "last_valid_token_pos": last - input_pos}
                logits = self.model(padded, options)
                for cache in caches:  # the chunk's first n rows, on CPU, in place
                    cache.write_pending(positions, n)
            else:
                logits = self.model(tokens, {"input_pos": input_pos})
                for cache in caches:  # the cache writes after attention: index_put on CPU, in place
                    cache.write_pending()
        finally:
            for cache in caches:
                cache.pending = None
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.reshape(1, -1, logits.shape[-1])[:, -1, :].float()


def chunk_inputs(tokens: torch.Tensor, input_pos: torch.Tensor, positions_table: torch.Tensor, chunk: int):
    """The CPU side of a chunk (``tokens [1, n]``, ``1 <= n <= chunk``; or embeddings ``[1, n, D]``):
    ``(n, positions [n], last [1], padded tokens [1, chunk] (embeddings [1, chunk, D]), rows [chunk])``.
    ``positions`` are the prompt rows' (where their keys and values are written); ``last`` the last one,
    gathered from ``positions_table`` (``0 .. S-1``) by executorch's portable ``index_select``, which
    refuses an index past the cache: a clean error before the delegate runs. ``rows`` are the chunk's
    positions clamped to the cache (padding rows read a valid RoPE row; nothing of theirs is kept)."""
    n = tokens.shape[1]
    positions = input_pos + torch.arange(n, dtype=input_pos.dtype)
    last = torch.index_select(positions_table, 0, positions)[-1:]
    padded = torch.nn.functional.pad(tokens, (0, 0) * (tokens.dim() - 2) + (0, chunk - n))
    rows = (input_pos + torch.arange(chunk, dtype=input_pos.dtype)).clamp(max=positions_table.shape[0] - 1)
    return n, positions, last, padded, rows


def example_inputs(position: int = 0, token: int = 0, chunk: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens [1, 1], input_pos [1])`` for one decode step; ``tokens [1, chunk]`` for a chunk."""
    return torch.full((1, chunk), token, dtype=torch.long), torch.tensor([position], dtype=torch.long)


def dynamic_shapes(chunk: int):
    """torch.export's ``dynamic_shapes`` of a chunked program: ``tokens [1, n]``, ``1 <= n <= chunk``;
    None for the static decode step (``chunk == 1``)."""
    if chunk == 1:
        return None
    n = torch.export.Dim("prompt_rows", min=1, max=chunk)
    return {"tokens": {1: n}, "input_pos": None}
