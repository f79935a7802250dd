"""Recurrent layers in the static decode step: short convolutions (LFM2), and the conv and recurrent states
of transformers' other linear-attention layers, as mutable buffers beside the KV cache (issue #39 item 2).

transformers 5 gives every such layer one cache API (``cache_utils.LinearAttentionCacheLayerMixin``): a
layer reads ``past_key_values.get_conv_state(i)`` / ``get_recurrent_state(i)`` (``None`` before the first
step: the prompt path) and writes them back in place (``copy_``) or through ``update_conv_state`` /
``update_recurrent_state``. The decode step's cache (:class:`mps_backend.llm.decoder.StaticCache`)
answers those calls with buffers of the model's own state shapes, found by running the model eagerly on
one token with transformers' own cache (:func:`probe_states`), so every family with that API gets the
shapes it computes with:

- a state is small and fixed (a short convolution's last ``L`` inputs, ``[1, D, L]``): a step reads and
  writes it whole, which is its floor; the write-back is executorch's copy of a mutated buffer;
- the states are always present, so every call reads them, the first too (a zero state is what a layer's
  prompt path starts from): a one-token step takes the layer's one-token path; a chunk of rows
  (``--prefill-chunk``) its path for several rows from the state, the chunk's padding rows made to leave the
  state alone (:data:`CHUNK_SCANS`; a short convolution keeps the columns of the prompt's rows:
  :meth:`mps_backend.llm.decoder.StaticCache.update_conv_state`);
- at ``input_pos == 0`` the step starts from a zero state (:func:`restart_at_zero`): the runner starts a new
  prompt at position 0 in the same loaded program, and a state, unlike the KV cache's rows, is not masked
  by position.
"""

from __future__ import annotations

import inspect
import sys

import torch

from mps_backend.llm.swap import modeling_modules

#: the layer types the masks serve; a ``layer_types`` entry beyond these whose layers keep recurrent state
#: only (LFM2's ``conv``) takes no mask
ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention")
#: buffer name of a layer's state: (kind, layer, state index)
STATE_NAME = "{kind}_state_{layer}_{index}"


class States(dict):
    """``(kind, layer, index) -> (shape, dtype)`` of every conv and recurrent state; ``recurrent_only``: the
    layers that keep a state and no attention (no KV cache for them)."""

    def __init__(self, *args, recurrent_only: frozenset[int] = frozenset(), **kwargs):
        super().__init__(*args, **kwargs)
        self.recurrent_only = recurrent_only


def probe_states(model: torch.nn.Module) -> States:
    """``(kind, layer, index) -> (shape, dtype)`` of every conv and recurrent state the model keeps, from
    one eager step on one token with transformers' own cache (empty for a model without such layers),
    and which layers keep a state only (``recurrent_only``: their cache layer holds no keys and values)."""
    from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin, StaticLayer  # noqa: PLC0415

    with torch.no_grad():
        out = model(input_ids=torch.zeros(1, 1, dtype=torch.long), use_cache=True)
    cache = getattr(out, "past_key_values", None)
    states: dict[tuple[str, int, int], tuple[tuple[int, ...], torch.dtype]] = {}
    only: set[int] = set()
    for i, layer in enumerate(getattr(cache, "layers", ()) or ()):
        if not isinstance(layer, LinearAttentionCacheLayerMixin):
            continue
        if not isinstance(layer, (DynamicLayer, StaticLayer)):
            only.add(i)
        for s in range(layer.number_of_states):
            for kind, table in (("conv", layer.conv_states), ("recurrent", layer.recurrent_states)):
                t = table.get(s)
                if isinstance(t, torch.Tensor):
                    states[(kind, i, s)] = (tuple(t.shape), t.dtype)
    return States(states, recurrent_only=frozenset(only))


def _gated_delta_scan(scan, keep: torch.Tensor):
    """``torch_chunk_gated_delta_rule`` with the padding rows' decay ``g`` and write strength ``beta`` zero:
    ``S = exp(0) S + 0``, the state after the prompt's last row; and its block the call's C rows, not the 64
    transformers' callers leave it at (the algorithm is exact for any block: a C-row call then computes C rows,
    not 64 rows of which 64 - C are padding; docs/llm.md, Recurrent layers)."""
    default = inspect.signature(scan).parameters.get("chunk_size")
    block = default.default if default is not None and isinstance(default.default, int) else None

    def masked(query, key, value, g, beta, *args, **kwargs):
        m = keep.view(1, -1, 1)
        rows = int(query.shape[1])
        if block is not None and not args and "chunk_size" not in kwargs and rows < block:
            kwargs["chunk_size"] = rows
        return scan(query, key, value, g * m.to(g.dtype), beta * m.to(beta.dtype), *args, **kwargs)

    return masked


def _mamba2_scan(scan, keep: torch.Tensor):
    """``mamba2_chunk_scan`` with the padding rows' step ``dt`` zero (before the softplus, a large negative
    value): the decay ``exp(A dt)`` is 1 and the input ``dt B x`` 0, so the state stays the prompt's; and its
    block the call's C rows when its callers' (the config's ``mamba_chunk_size``, 256 by default) is longer
    (the scan is exact for any block, as the gated delta rule's)."""

    def masked(hidden_states, dt, *args, **kwargs):
        rows = int(hidden_states.shape[1])
        if isinstance(kwargs.get("chunk_size"), int) and rows < kwargs["chunk_size"]:
            kwargs["chunk_size"] = rows
        zero = -1e4 if kwargs.get("dt_softplus") else 0.0
        return scan(hidden_states, torch.where(keep.view(1, -1, 1), dt, torch.full_like(dt, zero)), *args, **kwargs)

    return masked


#: the functions transformers' recurrent layers call for more than one row (module-level functions of
#: their modeling modules), by name -> the wrapper that makes a chunk's padding rows leave the state alone
CHUNK_SCANS = {"torch_chunk_gated_delta_rule": _gated_delta_scan, "mamba2_chunk_scan": _mamba2_scan}


def known_scans() -> str:
    """The names of :data:`CHUNK_SCANS`, for a refusal."""
    return ", ".join(CHUNK_SCANS)


def chunk_scan_modules(model: torch.nn.Module) -> tuple[str, ...]:
    """The modeling modules of ``model`` that define one of :data:`CHUNK_SCANS`."""
    names = (n for n in modeling_modules(model) if n in sys.modules)
    return tuple(sorted(n for n in names if any(hasattr(sys.modules[n], f) for f in CHUNK_SCANS)))


def chunk_scan_swaps(modules: tuple[str, ...], keep: torch.Tensor) -> tuple:
    """The swaps (:mod:`mps_backend.llm.swap`) under which the scans of ``modules`` see ``keep`` (bool ``[C]``:
    the prompt's rows of a chunk) and leave the state as the last prompt row left it."""
    return tuple(
        (name, fn, lambda own, wrap=wrap: wrap(own, keep))
        for name in modules
        for fn, wrap in CHUNK_SCANS.items()
        if hasattr(sys.modules[name], fn)
    )


def register_states(owner: torch.nn.Module, states) -> None:
    """Zero buffers of the probed shapes (:data:`STATE_NAME`), in the model's dtype."""
    for (kind, i, s), (shape, dtype) in sorted(states.items()):
        owner.register_buffer(STATE_NAME.format(kind=kind, layer=i, index=s), torch.zeros(shape, dtype=dtype), persistent=False)


def state_buffer(owner: torch.nn.Module, kind: str, layer: int, index: int) -> torch.Tensor | None:
    return getattr(owner, STATE_NAME.format(kind=kind, layer=layer, index=index), None)


def restart_at_zero(owner: torch.nn.Module, states, input_pos: torch.Tensor) -> None:
    """Every state set to zero where ``input_pos == 0``: a new prompt starts from zero states (selected, not
    multiplied: an inf or NaN a previous prompt left would survive a product with zero)."""
    for kind, i, s in sorted(states):
        buf = state_buffer(owner, kind, i, s)
        buf.copy_(torch.where(input_pos != 0, buf, torch.zeros_like(buf)))


__all__ = [
    "ATTENTION_KINDS",
    "CHUNK_SCANS",
    "States",
    "chunk_scan_modules",
    "known_scans",
    "chunk_scan_swaps",
    "probe_states",
    "register_states",
    "restart_at_zero",
    "state_buffer",
]
