"""The prompt chunk for the user's device (issue #46): the rows one call of a language model's ``forward``
computes when ``--prefill-chunk`` is not given.

A call reads the weights once whatever its rows, so a prompt taken ``C`` rows a call costs ``ceil(512 / C)``
calls, and a decode step (one token) of the same program computes ``C`` rows. Two targets (issue #36's, by the
roofline of :mod:`mps_backend.cost`, docs/device-cost.md):

- a 512-token prompt within **3x of its compute floor** (every prompt token through every matmul weight at the
  device's peak);
- a decode step's compute at most **half its memory time** (the step stays bound by the bytes it reads).

For a named device (``--device m2``) the export takes the smallest chunk of :data:`CANDIDATES` that meets both
(the least a decode step pays); if none does, the one whose worse target is missed by the least. For ``any``
(the default) it takes the chunk whose worst device of :data:`mps_backend.cost.DEVICES` misses its worse target
by the least (each target as a ratio to its bound; ties to the smaller chunk).

What a call moves and computes is **estimated** from the eager model (:func:`model_shape`) before anything is
exported (an export per candidate would cost minutes at 1B scale): the weights as they will be stored, the KV
cache, every row's activations, and each attention row's scores over the whole cache, as
:func:`mps_backend.llm.attention.grouped_attention` moves them (18 bytes a score when the new keys join the
cache's, 26 otherwise), and a recurrent layer's scan (its state read, updated and written, a chunk's C x C matrices:
:data:`SCAN_BYTES`). The per-row and per-scan constants were fitted to ``mps-backend cost`` of exported Llama graphs
(docs/llm.md, The chunk for your device); tests/llm/test_chunking.py holds the estimate to the cost model of
exported programs. It is a model, not a device measurement, and so is the roofline the export prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mps_backend.cost import DEVICES, PROMPT, Device
from mps_backend.quantize import resolve_head

#: the chunks the export chooses from (``--prefill-chunk`` takes any count)
CANDIDATES = (1, 2, 4, 8, 12, 16, 20, 24, 32, 48, 64, 96, 128)
#: a ``PROMPT``-token prompt within this many times its compute floor
TTFT_BOUND = 3.0
#: a decode step's compute time at most this share of its memory time
DECODE_BOUND = 0.5
#: ``--device``'s default: the chunk with the best worst case over :data:`mps_backend.cost.DEVICES`
ANY = "any"
#: bytes a row moves per layer beyond its attention scores, per hidden column, per intermediate (MLP) column and
#: per cache position (the mask's row): fitted to ``mps-backend cost`` of Llama graphs of 2 layers (hidden 64 and
#: 128, intermediate 128 and 512, 128 positions): the norms' float32 statistics, residuals, projections, RoPE
ROW_BYTES_HIDDEN, ROW_BYTES_INTERMEDIATE, ROW_BYTES_POSITION = 162.5, 16.1, 17.5
#: bytes a float32 attention score moves (fused model): the new keys joined to the cache's before one matmul,
#: or the masked scores joined to the new keys' (docs/device-cost.md, The chunk's attention)
SCORE_BYTES_KEYS_JOINED, SCORE_BYTES_SCORES_JOINED = 18, 26
#: ``layer_types`` of layers that keep a recurrent state and no KV cache (any other type attends over the cache:
#: ``full_attention``, ``sliding_attention``, ``chunked_attention``, Falcon-H1's ``hybrid``)
RECURRENT_LAYERS = ("linear", "conv", "mamba", "ssm", "recurrent")
#: a mixture of experts: each row's experts are gathered from the table (read, written, read by the matmuls)
EXPERT_PASSES = 3
#: bytes a recurrent layer's scan moves a call beyond its projections, as multiples of its float32 state ``S``
#: (value heads x key x value columns for the gated delta rule of Qwen3-Next, Qwen3.5 and OLMo hybrid; heads x
#: head columns x state columns for Mamba-2 of Granite 4 hybrid and Falcon-H1): ``one`` for the one-row step (the
#: recurrent update), ``a + b C + c C^2`` for a chunk of C rows (the chunked scan over the C rows as its block:
#: the state read, decayed, updated and written, the block's C x C matrices). Fitted to ``mps-backend cost`` of
#: exported fp16 programs of one recurrent and one attention layer (hidden 512 and 1024, 128-column key and value
#: heads, Mamba-2 heads of 64 with a state of 128; C = 1, 2, 4, 8, 16, 32): within 6 % of those programs' scan
#: bytes for C >= 2 (tests/llm/test_chunking.py holds whole programs to the cost model)
SCAN_BYTES = {"gated delta rule": (13.2, 10.72, 0.374, 0.0086), "mamba-2": (9.2, 17.4, 0.02, 0.0016)}
#: FLOPs of the scan's matmuls (the state's products, the block's C x C ones) a call, per element of the state, in
#: the same form and fitted to the same programs (within 5 % for C = 2 .. 64; 0.77x-1.33x at C = 128)
SCAN_FLOPS = {"gated delta rule": (0.24, 0.0, 6.59, 0.0646), "mamba-2": (2.14, 8.69, 3.99, 0.0575)}


def device_slug(name: str) -> str:
    """``M3 Pro`` -> ``m3-pro``: the spelling ``--device`` takes (any case, spaces, ``-`` or ``_``)."""
    return "-".join(name.lower().replace("_", " ").replace("-", " ").split())


#: ``--device`` values: ``any`` and a slug of every device of the cost model's table
DEVICE_CHOICES = (ANY, *(device_slug(d.name) for d in DEVICES))


def device_named(name: str) -> Device | None:
    """The device ``name`` names (None for ``any``); ValueError naming the choices otherwise."""
    slug = device_slug(str(name))
    if slug == ANY:
        return None
    for d in DEVICES:
        if device_slug(d.name) == slug:
            return d
    raise ValueError(f"unknown device {name!r}: use one of {', '.join(DEVICE_CHOICES)}")


@dataclass(frozen=True)
class ModelShape:
    """What a call of the decode step moves and computes, per row, as the chooser estimates it."""

    #: matmul weight elements (every expert; the lm_head)
    weight_params: int
    #: of them, the lm_head's (computed for the last prompt row only)
    head_params: int
    #: of them, the experts' (each row computes ``top_k`` of ``experts``)
    expert_params: int
    experts: int
    top_k: int
    #: bytes the weights are stored in (the experts' apart): read once a call
    dense_bytes: float
    expert_bytes: float
    layers: int
    attention_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    cache: int
    #: bytes of a cached element
    cache_element: int
    #: the recurrent layers' scans: (kind of :data:`SCAN_BYTES`, the float32 bytes of their states together)
    scans: tuple[tuple[str, float], ...] = ()

    @property
    def active_params(self) -> float:
        """The matmul weight elements a token goes through (a mixture of experts: ``top_k`` of them): the
        prompt's compute floor is ``2 x active_params`` FLOPs a token, as eager computes it."""
        experts = self.expert_params / self.experts * self.top_k if self.experts else 0.0
        return self.weight_params - self.expert_params + experts

    def score_bytes(self, rows: int) -> float:
        """Bytes the attention scores of ``rows`` rows move a call (and the K cache's copy when the new keys
        join the cache's: grouped_attention's choice, ``e x d < 4 x G x C``)."""
        group = max(self.heads // max(self.kv_heads, 1), 1)
        scores = self.attention_layers * self.heads * rows * self.cache
        if self.cache_element * self.head_dim < 4 * group * rows:
            copy = self.attention_layers * self.kv_heads * 2 * self.cache_element * self.head_dim * self.cache
            return scores * SCORE_BYTES_KEYS_JOINED + copy
        return scores * SCORE_BYTES_SCORES_JOINED

    def call_bytes(self, rows: int) -> float:
        """Bytes one call computing ``rows`` rows moves: the weights (each row's ``top_k`` experts gathered),
        the KV cache read once, every row's activations and the attention scores."""
        # each row gathers its top-k experts' weights (read, the gathered copy written, read by the matmul)
        experts = EXPERT_PASSES * self.expert_bytes * rows * self.top_k / self.experts if self.experts else 0.0
        cache = self.attention_layers * 2 * self.kv_heads * self.head_dim * self.cache * self.cache_element
        row = self.layers * (
            ROW_BYTES_HIDDEN * self.hidden + ROW_BYTES_INTERMEDIATE * self.intermediate + ROW_BYTES_POSITION * self.cache
        )
        return self.dense_bytes + experts + cache + rows * row + self.score_bytes(rows) + self.scan_bytes(rows)

    def scan_bytes(self, rows: int) -> float:
        """Bytes the recurrent layers' scans move a call of ``rows`` rows (:data:`SCAN_BYTES`)."""
        return self._scan(SCAN_BYTES, rows, 1.0)

    def _scan(self, table: dict, rows: int, per: float) -> float:
        """``table``'s fit over the recurrent layers' states (``per``: bytes an element of the fit's unit)."""
        total = 0.0
        for kind, state in self.scans:
            one, a, b, c = table[kind]
            total += state / per * (one if rows == 1 else a + b * rows + c * rows * rows)
        return total

    def call_flops(self, rows: int) -> float:
        """FLOPs of one call: every row through the dense weights and its experts, the lm_head once, and the
        two attention matmuls of every row over the cache and the call's rows (2 per multiply-add)."""
        dense = self.weight_params - self.head_params - self.expert_params
        experts = self.expert_params / self.experts * self.top_k if self.experts else 0.0
        # scores and values of every row over the cache and the call's own rows
        attention = self.attention_layers * 2 * 2 * self.heads * self.head_dim * (self.cache + rows)
        return 2 * rows * (dense + experts) + 2 * self.head_params + rows * attention + self._scan(SCAN_FLOPS, rows, 4.0)


@dataclass(frozen=True)
class Estimate:
    """A chunk on a device: a call's time, the prompt's time to the first token over its compute floor, a
    decode step's compute time over its memory time, decode tokens/s (a model, not a measurement)."""

    device: str
    chunk: int
    call_s: float
    ttft_s: float
    ttft_ratio: float
    decode_share: float
    decode_tokens_per_s: float

    @property
    def miss(self) -> float:
        """The worse of the two targets as a ratio to its bound (<= 1: both met)."""
        return max(self.ttft_ratio / TTFT_BOUND, self.decode_share / DECODE_BOUND)


def estimate(shape: ModelShape, chunk: int, device: Device, prompt: int = PROMPT) -> Estimate:
    """``shape``'s program of ``chunk`` rows a call on ``device``, as :func:`mps_backend.cost.roofline` times it."""
    memory = shape.call_bytes(chunk) / (device.bandwidth_gbs * 1e9)
    compute = shape.call_flops(chunk) / (device.fp16_tflops * 1e12)
    call = max(memory, compute)
    ttft = math.ceil(prompt / chunk) * call
    floor = 2 * shape.active_params * prompt / (device.fp16_tflops * 1e12)
    return Estimate(device.name, chunk, call, ttft, ttft / floor, compute / memory, 1 / call)


@dataclass(frozen=True)
class ChunkChoice:
    """The chunk chosen for ``device`` (``any``: over every device) and the estimates it was chosen by."""

    chunk: int
    device: str
    #: the chosen chunk on each device considered
    estimates: tuple[Estimate, ...]

    @property
    def worst(self) -> Estimate:
        return max(self.estimates, key=lambda e: e.miss)

    @property
    def meets(self) -> bool:
        return self.worst.miss <= 1.0

    def line(self) -> str:
        """The export's line: the chunk, the device, the predicted roofline of its worst device."""
        w = self.worst
        where = "every device of the cost model's table (worst: " + w.device + ")" if self.device == ANY else w.device
        verdict = "both targets met" if self.meets else "a target missed: no chunk meets both"
        return (
            f"prompt chunk {self.chunk} rows a call, chosen for {where}: a {PROMPT}-token prompt "
            f"{w.ttft_s:.2f} s = {w.ttft_ratio:.2f}x its compute floor (target {TTFT_BOUND:g}x), a decode step's "
            f"compute {w.decode_share:.2f} of its memory time (target {DECODE_BOUND:g}), {w.decode_tokens_per_s:.1f} "
            f"tokens/s; {verdict} (estimated before export, a model, not a device measurement; --prefill-chunk overrides)"
        )


def choose(shape: ModelShape, device: str = ANY, prompt: int = PROMPT) -> ChunkChoice:
    """The chunk for ``device`` (a ``--device`` value): see the module doc."""
    named = device_named(device)
    devices = DEVICES if named is None else (named,)
    candidates = [c for c in CANDIDATES if c <= shape.cache] or [1]
    table = {c: tuple(estimate(shape, c, d, prompt) for d in devices) for c in candidates}
    worst = {c: max(e.miss for e in table[c]) for c in candidates}
    met = [c for c in candidates if worst[c] <= 1.0]
    chunk = met[0] if met and named is not None else min(candidates, key=lambda c: (worst[c], c))
    return ChunkChoice(chunk, ANY if named is None else named.name, table[chunk])


def _stored_bytes(w: torch.Tensor) -> float:
    """Bytes ``w`` is stored in: a quantized tensor subclass's inner tensors, else its elements."""
    flatten = getattr(w, "__tensor_flatten__", None)
    if flatten is not None and type(w) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = flatten()
        return float(sum(getattr(w, n).nbytes for n in names if isinstance(getattr(w, n, None), torch.Tensor)))
    return float(w.numel() * w.element_size())


def _config(model: torch.nn.Module):
    cfg = getattr(model, "config", None)
    if cfg is not None:
        return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(model, "params", None)  # executorch's llama: its ModelArgs


def _first(cfg, *names: str, default: int = 0) -> int:
    for n in names:
        v = getattr(cfg, n, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return default


def model_shape(model: torch.nn.Module, *, cache: int, layers: int, element_bytes: int, quantization=None) -> ModelShape:
    """The :class:`ModelShape` of an eager decoder (a transformers model or executorch's llama) whose weights
    are stored in ``element_bytes`` a float element, or quantized by ``quantization``
    (:class:`mps_backend.quantize.Quantization`; its defaults resolved), with a cache of ``cache`` rows."""
    cfg = _config(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else getattr(model, "output", None)
    head_w = getattr(head, "weight", None)
    per_param = None
    if quantization is not None:
        group = quantization.group
        bits = 0.5 if quantization.scheme == "int4" else 1.0
        per_param = bits + (2.0 / group if group else 0.0)  # a float16 scale a group (symmetric)
    config_experts = _first(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    weight_params = head_params = expert_params = 0
    dense = experts_b = 0.0
    seen: set[int] = set()
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            is_head = head_w is not None and p is head_w
            # stacked experts [experts, out, in] (named so, or as many as the config's experts: JetMoE's)
            expert = p.dim() == 3 and ("expert" in f"{name}.{pname}".lower() or p.shape[0] == config_experts > 1)
            # a matmul's weight: nn.Linear's, GPT-2's Conv1D's, any 2-d parameter but an embedding table's
            linear = p.dim() == 2 and not isinstance(module, torch.nn.Embedding)
            if not (is_head or expert or linear):
                continue
            seen.add(id(p))
            n = p.numel()
            if is_head and quantization is not None:
                stored = n * {"float": float(element_bytes), "int4": 0.5}.get(
                    resolve_head(quantization.scheme, quantization.head), 1.0
                )
            elif per_param:
                stored = n * per_param
            elif type(p) not in (torch.Tensor, torch.nn.Parameter):
                stored = _stored_bytes(p)  # a checkpoint's quantized tensor kept as it is (gguf:)
            else:
                stored = float(n * element_bytes)
            weight_params += n
            if is_head:
                head_params += n
            if expert or (linear and ".experts." in f".{name}."):
                expert_params += n
                experts_b += stored
            else:
                dense += stored
    heads = _first(cfg, "num_attention_heads", "n_heads", "n_head", default=1)
    hidden = _first(cfg, "hidden_size", "dim", "n_embd", default=1)
    kv = _first(cfg, "num_key_value_heads", "n_kv_heads", "num_kv_heads", default=heads)
    head_dim = _first(cfg, "head_dim", default=max(hidden // heads, 1))
    intermediate = _first(cfg, "intermediate_size", "hidden_dim", "ffn_hidden_size", default=4 * hidden)
    n_experts = config_experts if expert_params else 0
    top_k = _first(cfg, "num_experts_per_tok", "num_activated_experts", "moe_top_k", default=1) if expert_params else 0
    if n_experts:  # a row's MLP columns: its experts'
        intermediate = top_k * _first(cfg, "moe_intermediate_size", "moe_hidden_dim", "intermediate_size", default=intermediate)
    scans: dict[str, float] = {}
    for module in model.modules():  # transformers' recurrent mixers, by the attributes their scans read
        if all(hasattr(module, a) for a in ("num_v_heads", "head_k_dim", "head_v_dim")):
            kind, state = "gated delta rule", module.num_v_heads * module.head_k_dim * module.head_v_dim * 4.0
        elif all(hasattr(module, a) for a in ("num_heads", "head_dim", "ssm_state_size")):
            kind, state = "mamba-2", module.num_heads * module.head_dim * module.ssm_state_size * 4.0
        else:
            continue
        scans[kind] = scans.get(kind, 0.0) + state
    types = getattr(cfg, "layer_types", None)
    attention = (
        sum(1 for t in types if not any(kind in str(t) for kind in RECURRENT_LAYERS))
        if isinstance(types, (list, tuple)) and types
        else layers
    )
    return ModelShape(
        weight_params=weight_params,
        head_params=head_params,
        expert_params=expert_params if n_experts else 0,
        experts=n_experts,
        top_k=top_k,
        dense_bytes=dense + (0.0 if n_experts else experts_b),
        expert_bytes=experts_b if n_experts else 0.0,
        layers=layers,
        attention_layers=attention,
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        hidden=hidden,
        intermediate=intermediate,
        cache=cache,
        cache_element=element_bytes,
        scans=tuple(sorted(scans.items())),
    )


__all__ = [
    "ANY",
    "CANDIDATES",
    "DECODE_BOUND",
    "DEVICE_CHOICES",
    "TTFT_BOUND",
    "ChunkChoice",
    "Estimate",
    "ModelShape",
    "choose",
    "device_named",
    "estimate",
    "model_shape",
]
