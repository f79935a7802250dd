"""Decode-step attention and RoPE that move each byte once (#23).

- :func:`grouped_attention`: grouped-query attention without ``repeat_kv``. The query heads that
  share a KV head are one matrix ``q [1, KV, G*T, d]`` against that head's cache, so K and V are
  read once, never expanded to every query head. Only ``q`` is scaled (never the whole K). The K
  cache is stored transposed, ``[1, KV, d, S]``, so ``q @ K`` needs no per-step transpose of the
  cache. Registered in transformers' ``AttentionInterface`` as :data:`ATTENTION`; it honours what
  transformers' eager attention does with what the layers pass: ``scaling``, the additive mask
  (the decode step passes it precomputed, sliding windows included, so ``sliding_window`` needs
  nothing more), ``softcap`` (Gemma 2), attention sinks ``s_aux`` (gpt-oss); dropout is 0 in eval.
- The decode step never writes the cache inside the delegate (#23): the cache's ``update`` returns
  the OLD K cache (the mutable buffer itself, read in place) carrying the new rows
  (:func:`with_new_rows`), the mask hides positions ``>= input_pos`` of it, and the new key/value
  join the softmax as one extra column: ``softmax([q @ K_old, q . k_new]) -> p_old @ V_old + p_new *
  v_new``. The decoder writes the rows into the buffers after the model's forward: one ``index_put``
  per buffer, left on CPU and made in place by executorch (:data:`mps_backend.partitioner.CACHE_WRITE_REASON`).
  The values ``update`` returns are ``[V_old; v_new]`` (old cache, then the new rows): a layer that
  passes them to attention as they are is computed as above (the concatenation has no user and leaves
  the program); a layer that transforms them row by row first (DiffLlama splits the KV heads in two
  halves and repeats each) has the new rows transformed with the old ones, and attention reads the
  transformed ``S + T`` rows (``p @ V``). Values of any other length (a transform of the old cache
  alone) are refused: the new rows would be missed.
  A chunk of T rows (:mod:`mps_backend.llm.decoder`) computes the scores of ``G*T`` query rows over the whole
  cache, the bytes a chunk adds to every step (#46): the cache's scores are masked in the elementwise chain
  that reads their matmul's result, and either the new keys join the cache's before one matmul (``keys =
  cat(K_old, k_new)``, when a copy of the K cache costs less than one more pass over the float32 scores:
  ``e x d < 4 x G x T``) or the masked scores join the new keys' before the softmax (docs/device-cost.md,
  The chunk's attention).
- :class:`RopeTable`: a model's rotary embedding replaced by its own cos/sin computed at export in
  float32 for every position ``0 .. max_seq_len-1``, stored in the model's dtype and gathered by
  position: the program has no position-dependent float16 arithmetic (an fp16 angle ``p * inv_freq``
  is off by up to 0.25 rad at positions 512-1023). A model whose RoPE is complex (``freqs_cis``, Llama 4,
  DeepSeek V2) gets its table as real ``(cos, sin)`` pairs and its ``apply_rotary_emb`` in real arithmetic
  for the decode step's forward (:func:`complex_rope_swaps`): the device has no complex dtype.
"""

from __future__ import annotations

import inspect

import torch

from mps_backend.errors import MPSBackendError
from mps_backend.llm.swap import Replacements, modeling_modules

#: the AttentionInterface name of :func:`grouped_attention` (K cache transposed: ``[1, KV, d, S]``)
ATTENTION = "mps_backend_grouped_kt"
#: the attribute of an old-cache alias holding the step's new rows and the values ``update`` returned:
#: ``(k_t [B, KV, d, T], v [B, KV, T, d], V_old [B, KV, S, d], [V_old; v] [B, KV, S + T, d])``
NEW_ROWS = "mps_backend_new_rows"


def with_new_rows(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a cache's ``update`` returns for :func:`grouped_attention`: an alias of the K cache buffer (a
    view: nothing copied, no state kept on the buffer) carrying this step's new rows, to attend to besides
    the cache, and the values ``[V_old; v]`` along the positions (what a layer that transforms its values
    before attention transforms; unused, and so not in the program, when the layer passes them as they are)."""
    alias = k_cache.view(k_cache.shape)
    values = torch.cat([v_cache, v], dim=2)
    setattr(alias, NEW_ROWS, (k_t, v, v_cache, values))
    return alias, values


def write_rows(cache: torch.Tensor, dim: int, input_pos: torch.Tensor, rows: torch.Tensor) -> None:
    """``cache[..., input_pos, ...] = rows`` along ``dim`` as one ``index_put_`` whose values keep
    the cache's rank (indexing assignment would squeeze them): the form executorch's portable
    ``index_put_`` writes in place (mps_backend.partitioner.is_row_write)."""
    indices = [None] * dim + [input_pos]
    torch.ops.aten.index_put_(cache, indices, rows)


def write_kv_rows(
    k_cache: torch.Tensor, v_cache: torch.Tensor, input_pos: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor
) -> None:
    """One layer's new rows into its caches: ``k_t [B, KV, d, T]`` as columns of the transposed K
    cache ``[B, KV, d, S]``, ``v [B, KV, T, d]`` as rows of the V cache ``[B, KV, S, d]``."""
    write_rows(k_cache, 3, input_pos, k_t)
    write_rows(v_cache, 2, input_pos, v)


def grouped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key_t: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``query [B, H, T, d]``, ``key_t [B, KV, d, S]`` (the cache, transposed), ``value [B, KV, S, d]``
    -> ``(out [B, T, H, d], None)``, transformers' attention-function contract."""
    if dropout and module.training:
        raise ValueError("grouped_attention is the inference decode step: dropout must be 0")
    mla = getattr(module, MLA, None)
    if mla is not None:  # multi-head latent attention: the query against the compressed cache
        query = mla.latent_query(query)
    b, h, t, d = query.shape
    kv, s = key_t.shape[1], key_t.shape[-1]
    g = h // kv
    new_rows = getattr(key_t, NEW_ROWS, None)  # (k_t, v, V_old, [V_old; v]) of this step: key_t is the old cache
    if new_rows is not None and new_rows[0].shape[-1] != t:
        raise ValueError(f"grouped_attention: {t} query rows but {new_rows[0].shape[-1]} new key rows")
    # the values as the layer hands them: the old cache and the new rows ([V_old; v] or V_old itself, read
    # apart), or [V_old; v] transformed row by row by the layer (S + T rows, read together: `joined`)
    joined = new_rows is not None and value is not new_rows[3] and value is not new_rows[2]
    rows = s + t if joined else s
    if new_rows is not None and not joined:
        value = new_rows[2]
    elif value.shape[-2] != rows or value.shape[1] != kv:
        raise ValueError(
            f"grouped_attention: {type(module).__name__} (layer {getattr(module, 'layer_idx', '?')}): values of "
            f"{value.shape[-2]} positions, {value.shape[1]} heads for keys of {rows}, {kv}: the cached keys or values "
            "transformed apart from the step's new rows"
        )
    if scaling is None:
        scaling = float(module.head_dim) ** -0.5
    # query head kv*G + j uses KV head kv (repeat_kv's order): [B, KV, G*T, d], scaled once
    q = (query * scaling).reshape(b, kv, g * t, d)
    chunk_mask = attention_mask is not None and attention_mask.shape[-1] == s + t
    if new_rows is not None and key_t.element_size() * d < 4 * g * t and (attention_mask is None or chunk_mask):
        # many query rows (a chunk): the new keys join the cache's as columns before one matmul, a copy of the
        # K cache (d x S keys, written and read) that costs less than a copy of the float32 scores of G*T rows
        # over it (docs/device-cost.md, The chunk's attention); the mask covers the old cache and the chunk's rows
        keys = torch.cat([key_t, new_rows[0]], dim=-1)
        scores = _masked(torch.matmul(q, keys), softcap, attention_mask, 0, s + t, g)
    else:
        # the scores over the cache, masked before they meet the new keys' scores: the matmul's result, its
        # float32 cast and the mask are one elementwise chain, and the concatenation (the only full-size copy of
        # the scores before the softmax) takes the masked scores
        scores = _masked(torch.matmul(q, key_t), softcap, attention_mask, 0, s, g)  # [B, KV, G*T, S]
        if new_rows is not None:  # the new keys' scores: T more columns (one in a decode step, always visible)
            new = _masked(torch.matmul(q, new_rows[0]), softcap, attention_mask if chunk_mask else None, s, s + t, g)
            scores = torch.cat([scores, new], dim=-1)
    if s_aux is not None:
        # gpt-oss: one learned sink logit per query head joins the softmax, its weight dropped
        sinks = s_aux.reshape(1, kv, g, 1, 1).expand(b, kv, g, t, 1).reshape(b, kv, g * t, 1).to(scores.dtype)
        combined = torch.cat([scores, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1].to(value.dtype)
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if joined:  # the layer's own transform of [V_old; v]: p @ V over the S + T rows
        out = torch.matmul(probs, value)
    elif new_rows is not None and t == 1:  # p_old @ V_old + p_new * v_new
        out = torch.matmul(probs[..., :s], value) + probs[..., s:] * new_rows[1]
    elif new_rows is not None:  # a chunk: p_old @ V_old + p_new @ V_new
        out = torch.matmul(probs[..., :s], value) + torch.matmul(probs[..., s:], new_rows[1])
    else:
        out = torch.matmul(probs, value)  # [B, KV, G*T, d_v]
    out = out.view(b, h, t, value.shape[-1])
    if mla is not None:
        out = mla.heads_out(out)
    return out.transpose(1, 2).contiguous(), None


def _masked(scores: torch.Tensor, softcap: float | None, mask: torch.Tensor | None, lo: int, hi: int, g: int) -> torch.Tensor:
    """``scores [B, KV, G*T, N]`` soft-capped (Gemma 2) and plus the additive mask's key columns ``lo:hi``
    (``mask [1|B, 1, T, >= hi]``, the same for the G query heads of a KV head); no mask: unchanged."""
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        return scores
    b, kv, rows, n = scores.shape
    return (scores.view(b, kv, g, rows // g, n) + mask[:, :, :, lo:hi].unsqueeze(2)).view(b, kv, rows, n)


#: the attribute of an attention module exported as multi-head latent attention (:class:`LatentAttention`)
MLA = "mps_backend_latent"


class LatentAttention(torch.nn.Module):
    """Multi-head latent attention (DeepSeek V2/V3, MiniCPM3, GLM-4 MoE lite, ...) over the compressed
    cache, in the absorbed form DeepSeek decodes with: the cache holds what the layer's
    ``kv_a_proj_with_mqa`` computes per token, the latent ``c`` (``kv_lora_rank``, normalized) and the
    shared rotary key ``k_rot`` (``qk_rope_head_dim``), never the heads' keys and values that
    ``kv_b_proj`` expands them to. ``kv_b_proj``'s weight ``[H, nope + v, r]`` is split at export into
    ``W_UK [H, nope, r]`` and ``W_UV^T [H, r, v]``; head ``h``'s score of position ``s`` is
    ``(q_nope W_UK) . c_s + q_rot . k_rot_s`` (= ``q_nope . k_nope_s + q_rot . k_rot_s``) and its output
    ``(sum_s p_s c_s) W_UV^T`` (= ``sum_s p_s v_s``): one KV head of ``r + rope`` key and ``r`` value
    columns for every query head, which :func:`grouped_attention` computes over the cache read in place
    (K transposed: ``[c; k_rot]^T``, V: ``c``)."""

    def __init__(self, attention: torch.nn.Module):
        super().__init__()
        proj = attention.kv_b_proj
        weight = proj.weight
        if type(weight) not in (torch.Tensor, torch.nn.Parameter):  # a quantized weight (torchao): its values
            weight = weight.dequantize()
        weight = weight.to(attention.kv_a_layernorm.weight.dtype)  # the model's precision
        self.nope, self.v = int(attention.qk_nope_head_dim), int(attention.v_head_dim)
        self.rank, self.rope = int(attention.kv_lora_rank), int(attention.qk_rope_head_dim)
        if getattr(proj, "bias", None) is not None:
            raise ValueError(f"{type(attention).__name__}: kv_b_proj with a bias is not absorbed")
        w = weight.detach().reshape(-1, self.nope + self.v, self.rank)  # [H, nope + v, r]
        self.register_buffer("w_uk", w[:, : self.nope].contiguous(), persistent=False)  # [H, nope, r]
        self.register_buffer("w_uv_t", w[:, self.nope :].transpose(1, 2).contiguous(), persistent=False)  # [H, r, v]

    def latent_query(self, query: torch.Tensor) -> torch.Tensor:
        """``[B, H, T, nope + rope]`` -> ``[B, H, T, r + rope]``: the nope part through ``W_UK``."""
        q_nope, q_rot = query.split([self.nope, self.rope], dim=-1)
        return torch.cat([torch.matmul(q_nope, self.w_uk), q_rot], dim=-1)

    def heads_out(self, out: torch.Tensor) -> torch.Tensor:
        """``[B, H, T, r]`` (the heads' weighted latents) -> ``[B, H, T, v]`` through ``W_UV^T``."""
        return torch.matmul(out, self.w_uv_t)

    @staticmethod
    def cache_rows(kv_nope: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the layer hands its cache (``[B, 1, T, r]``, ``[B, 1, T, rope]``) -> the rows of the K cache
        (``[c, k_rot]``, ``r + rope`` columns) and of the V cache (``c``)."""
        return torch.cat([kv_nope, k_rot], dim=-1), kv_nope


def latent_attention_layers(model: torch.nn.Module, changes: Replacements) -> dict[int, torch.nn.Module]:
    """The multi-head latent attention layers of ``model`` by layer index (modules with
    ``kv_a_proj_with_mqa``, ``kv_b_proj`` and ``expand_kv``), each given its :class:`LatentAttention`
    (attribute :data:`MLA`) and an ``expand_kv`` that hands the cache's tensors through unexpanded, until
    ``changes`` are undone."""
    found = {}
    for mod in model.modules():
        if not all(hasattr(mod, a) for a in ("kv_a_proj_with_mqa", "kv_b_proj", "expand_kv", "layer_idx")):
            continue
        changes.setattr(mod, MLA, LatentAttention(mod))
        changes.setattr(mod, "expand_kv", _unexpanded)
        found[int(mod.layer_idx)] = mod
    return found


def _unexpanded(kv_nope: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``expand_kv`` of an exported latent-attention layer: the cache's K (transposed, with the step's
    rows) and V, as the cache returned them (:class:`LatentAttention`)."""
    return kv_nope, k_rot


def use_grouped_attention(model: torch.nn.Module, changes: Replacements) -> bool:
    """Switch a transformers model to :func:`grouped_attention` (registered in transformers' process-wide
    ``AttentionInterface`` as :data:`ATTENTION`) when its modeling code dispatches through the interface,
    until ``changes`` are undone; False (model unchanged, eager attention) otherwise."""
    return changes.attention(model, ATTENTION, grouped_attention)


#: transformers modeling modules whose rotary embedding returns complex ``freqs_cis [B, T, d/2]`` and whose
#: ``apply_rotary_emb(xq, xk, freqs_cis)`` multiplies complex pairs -> the axis at which that function
#: broadcasts ``freqs_cis`` against the queries (Llama 4: ``[B, T, 1, d/2]`` for ``[B, T, H, d]``;
#: DeepSeek V2: ``[B, 1, T, d/2]`` for ``[B, H, T, d]``)
COMPLEX_ROPE = {
    "transformers.models.llama4.modeling_llama4": 2,
    "transformers.models.deepseek_v2.modeling_deepseek_v2": 1,
}


def real_rotary(axis: int):
    """``apply_rotary_emb(xq, xk, freqs)`` of a :data:`COMPLEX_ROPE` module in real arithmetic: ``freqs`` as
    :class:`RopeTable` gives it, ``[B, T, d/2, 2]`` (cos, sin) pairs (or complex, as the model's own
    rotary module gives it); each pair ``(a, b)`` of the last axis of ``xq`` / ``xk`` becomes
    ``(a cos - b sin, a sin + b cos)``, computed in float32 as the complex product is."""

    def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor):
        pairs = torch.view_as_real(freqs) if freqs.is_complex() else freqs
        f = pairs.unsqueeze(axis).float()
        cos, sin = f[..., 0], f[..., 1]

        def rotate(x: torch.Tensor) -> torch.Tensor:
            xy = x.float().reshape(*x.shape[:-1], -1, 2)
            a, b = xy[..., 0], xy[..., 1]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(3).type_as(x)

        return rotate(xq), rotate(xk)

    return apply_rotary_emb


def complex_rope_swaps(model: torch.nn.Module) -> tuple:
    """The swaps (:mod:`mps_backend.llm.swap`) that make ``model``'s :data:`COMPLEX_ROPE` modules apply RoPE
    with :func:`real_rotary` during the decode step's forward."""
    names = sorted(modeling_modules(model) & COMPLEX_ROPE.keys())
    return tuple((name, "apply_rotary_emb", lambda own, axis=COMPLEX_ROPE[name]: real_rotary(axis)) for name in names)


class NotCosSin(MPSBackendError, ValueError):
    """A rotary embedding that does not return float32 ``(cos, sin)`` rows per position (DeepSeek V2's
    complex ``freqs_cis``): it is left as the model computes it (caught inside :func:`tabulate_rope`)."""


def cos_sin(out, rotary: torch.nn.Module, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` of a rotary embedding as its ``(cos, sin)`` rows, or :class:`NotCosSin`."""
    if isinstance(out, torch.Tensor) and out.is_complex() and type(rotary).__module__ in COMPLEX_ROPE:
        return out.real.contiguous(), out.imag.contiguous()  # the pairs real_rotary reads
    if isinstance(out, torch.Tensor) and out.is_complex():
        raise ValueError(
            f"{type(rotary).__name__} computes RoPE as complex numbers (freqs_cis, applied with "
            "view_as_complex): the device has no complex dtype and torch.polar is not core ATen; missing: RoPE "
            "in real arithmetic for this model type"
        )
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(isinstance(t, torch.Tensor) for t in out):
        raise NotCosSin(f"{type(rotary).__name__} returns {type(out).__name__}, not (cos, sin)")
    cos, sin = out
    if cos.dtype != torch.float32 or cos.shape[:2] != (1, max_seq_len) or sin.shape != cos.shape:
        raise NotCosSin(f"{type(rotary).__name__}: cos/sin of shape {tuple(cos.shape)}, {cos.dtype}")
    return cos, sin


class RopeTable(torch.nn.Module):
    """A rotary embedding's ``(cos, sin)`` for positions ``0 .. max_seq_len-1``, computed once by the
    module itself in float32, stored in ``dtype`` and gathered by ``position_ids`` (one row each)."""

    def __init__(self, rotary: torch.nn.Module, max_seq_len: int, dtype: torch.dtype, layer_types=()):
        super().__init__()
        params = inspect.signature(rotary.forward).parameters
        # what modeling code reads off its rotary module besides calling it (GraniteMoE SWA keys its
        # rotary embeddings by config.rope_parameters["rope_theta"])
        for attr in ("config", "rope_type", "attention_scaling"):
            if hasattr(rotary, attr):
                setattr(self, attr, getattr(rotary, attr))
        self.keys = tuple(sorted(set(layer_types))) if "layer_type" in params and layer_types else (None,)
        # complex RoPE (COMPLEX_ROPE): gathered as (cos, sin) pairs [1, T, d/2, 2] for real_rotary
        self.pairs = type(rotary).__module__ in COMPLEX_ROPE
        x = torch.zeros(1, dtype=torch.float32)
        pos = torch.arange(max_seq_len, dtype=torch.long).view(1, -1)
        with torch.no_grad():
            for i, key in enumerate(self.keys):
                cos, sin = cos_sin(rotary(x, pos) if key is None else rotary(x, pos, key), rotary, max_seq_len)
                self.register_buffer(f"cos_{i}", cos.to(dtype), persistent=False)
                self.register_buffer(f"sin_{i}", sin.to(dtype), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
        """The rows of ``layer_type``'s table at ``position_ids``. With several layer types, the first call
        for a ``position_ids`` gathers every type's rows, in the sorted order of the types, and the other
        types' calls with the same ``position_ids`` get theirs: the traced program does not depend on the
        order modeling code asks in (Gemma 3 iterates ``set(config.layer_types)``, whose order changes with
        Python's string-hash seed), so its ``.pte`` is the same bytes in every process."""
        i = self.keys.index(layer_type if self.keys != (None,) else None)
        if len(self.keys) == 1:
            return self._rows(0, x, position_ids)
        memo = self.__dict__.get("_gathered")
        if memo is None or memo[0] is not position_ids or memo[1] is not x.dtype:
            memo = (position_ids, x.dtype, [self._rows(k, x, position_ids) for k in range(len(self.keys))])
            self.__dict__["_gathered"] = memo  # the last forward's rows only: dropped with the table when undone
        return memo[2][i]

    def _rows(self, i: int, x: torch.Tensor, position_ids: torch.Tensor):
        # multimodal RoPE (Qwen3.5: [3, B, T], temporal, height and width positions): a text-only step has the
        # same position in each section, which the table (computed from [1, S] positions) holds
        idx = (position_ids[0] if position_ids.dim() == 3 else position_ids).reshape(-1)
        cos = torch.index_select(getattr(self, f"cos_{i}"), 1, idx)
        sin = torch.index_select(getattr(self, f"sin_{i}"), 1, idx)
        if self.pairs:
            return torch.stack([cos, sin], dim=-1)
        return cos.to(x.dtype), sin.to(x.dtype)


#: rope types whose angles depend on the sequence seen so far (transformers' dynamic_rope_update):
#: not tabulated, left as the model computes them
_DYNAMIC_ROPE = ("dynamic", "longrope")


def tabulate_rope(model: torch.nn.Module, max_seq_len: int, dtype: torch.dtype, changes: Replacements) -> int:
    """Replace every rotary-embedding submodule of ``model`` (``*RotaryEmbedding``) by a
    :class:`RopeTable` until ``changes`` are undone; returns how many were replaced."""
    replaced = 0
    for name, mod in list(model.named_modules()):
        if not name or not type(mod).__name__.endswith("RotaryEmbedding"):
            continue
        rope_type = getattr(mod, "rope_type", "default")
        types = rope_type.values() if isinstance(rope_type, dict) else [rope_type]
        if any(k in str(t) for t in types for k in _DYNAMIC_ROPE):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        try:
            table = RopeTable(mod, max_seq_len, dtype, getattr(mod, "layer_types", ()))
        except NotCosSin:
            continue  # e.g. complex freqs_cis: the model computes it (and the export says if it cannot)
        changes.setattr(parent, attr, table)
        replaced += 1
    return replaced


class _TransposedKVCache(torch.nn.Module):
    """executorch's example-llama ``KVCache`` (static shapes) with K stored transposed,
    ``[B, KV, d, S]``: ``update`` returns the old ``(K^T, V)`` carrying the new rows (see the module
    doc) and keeps them in ``pending`` (set by the decoder for one forward) to be written after it."""

    def __init__(self, cache: torch.nn.Module):
        super().__init__()
        b, h, s, d = cache.k_cache.shape
        self.register_buffer("k_cache", torch.zeros((b, h, d, s), dtype=cache.k_cache.dtype))
        self.register_buffer("v_cache", torch.zeros_like(cache.v_cache))
        self.pending: list | None = None  # [(input_pos, k_t, v)] during a decoder's forward

    def update(self, input_pos: torch.Tensor, k_val: torch.Tensor, v_val: torch.Tensor):
        if self.pending is None:
            raise RuntimeError("_TransposedKVCache.update outside ExecutorchLlamaDecoder.forward")
        k_t = k_val.transpose(2, 3)
        self.pending.append((input_pos, k_t, v_val))
        return with_new_rows(self.k_cache, self.v_cache, k_t, v_val)

    def write_pending(self, positions: torch.Tensor | None = None, n=None) -> None:
        """Write the rows ``update`` kept into the buffers (after the model's forward) and forget them;
        a chunk's first ``n`` rows at ``positions`` (its padding rows are never written)."""
        for input_pos, k_t, v in self.pending or ():
            if n is not None:
                input_pos, k_t, v = positions, k_t[..., :n], v[:, :, :n]
            write_kv_rows(self.k_cache, self.v_cache, input_pos, k_t, v)
        self.pending = None


class _GroupedSDPA(torch.nn.Module):
    """executorch's example-llama ``SDPA`` (``repeat_interleave`` of K and V to every query head,
    then ``scaled_dot_product_attention``) as grouped attention over ``K^T`` (see
    :func:`grouped_attention`); ``mask`` is the boolean ``[T, S]`` row(s) of the causal mask."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, input_pos, q, k_t, v, bsz, seqlen, mask):
        d = q.shape[-1]
        if getattr(k_t, NEW_ROWS, None) is not None:  # the old cache: positions >= input_pos[0] hidden
            mask = mask & (torch.arange(mask.shape[-1], dtype=input_pos.dtype) < input_pos.reshape(-1)[:1])
            if seqlen > 1:  # a chunk (input_pos: its rows' positions): row i also sees the chunk's rows j <= i
                i = torch.arange(seqlen, dtype=input_pos.dtype)
                mask = torch.cat([mask, i.view(1, -1) <= i.view(-1, 1)], dim=-1)  # [T, S + T]
        additive = torch.where(mask, 0.0, float("-inf")).to(q.dtype)  # [T, S] or [T, S + T]
        out, _ = grouped_attention(self, q, k_t, v, additive.view(1, 1, *additive.shape), scaling=float(d) ** -0.5)
        return out.reshape(bsz, seqlen, self.dim)


def group_llama_attention(model: torch.nn.Module, changes: Replacements) -> int:
    """Give every attention layer of executorch's example llama (static KV cache) a transposed-K
    cache and grouped attention until ``changes`` are undone; returns how many layers were changed.
    Layers that share KV (YOCO), use a ring buffer or dynamic shapes keep executorch's own modules."""
    changed = 0
    for mod in model.modules():
        cache, sdpa = getattr(mod, "kv_cache", None), getattr(mod, "SDPA", None)
        if cache is None or sdpa is None or type(cache).__name__ != "KVCache" or type(sdpa).__name__ != "SDPA":
            continue
        if getattr(cache, "enable_dynamic_shape", False) or getattr(mod, "num_kv_shared_layers", 0):
            continue
        changes.setattr(mod, "kv_cache", _TransposedKVCache(cache))
        changes.setattr(mod, "SDPA", _GroupedSDPA(sdpa.dim))
        changed += 1
    return changed
