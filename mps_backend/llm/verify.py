"""An LLM export that checks itself: the first decode steps of the written ``.pte`` on the emulated
runtime against the eager model in float32, on the same tokens.

    from mps_backend.llm.verify import verify_llm
    v = verify_llm("model.pte", "hf:./my-checkpoint", dtype="fp16", steps=4)
    print(v)            # the gap, whether greedy tokens agree, ok / FAILED
    assert v.ok

The tokens: the model's BOS id (else 0) and, when the checkpoint has a tokenizer, the tokens of a
fixed English text (:data:`VERIFY_PROMPT`, teacher-forced: BOS alone hides little of what real text
makes the activations do), then at each step the ``.pte``'s own greedy token; the eager model
(transformers ``AutoModelForCausalLM`` with eager attention for ``hf:``, executorch's example llama
for ``llama:``, both float32, quantized the same way when the export was; a ``gguf:`` file's kept
quantized tensors as kept) reads the same tokens. The gap is ``max |pte logits - eager logits|`` over
every position, and relative to the eager logits' scale ``max |eager logits|`` it must be at most
:func:`tolerance` (the bounds the LLM tests use, ``tests/llm/test_export.py``).

A model whose eager float32 copy does not fit the memory bound (:func:`eager_budget`) is verified on
a layer-truncated copy instead: the checkpoint's first :data:`TRUNCATED_LAYERS` layers (and its
embedding, final norm and head) written to a temporary folder, exported there with the same options,
and that program compared with its eager model.
"""

from __future__ import annotations

import gc
import json
import math
import os
import pathlib
import re
import tempfile
import types
from dataclasses import dataclass

import torch

from mps_backend.config import env_bytes
from mps_backend.errors import CheckpointError
from mps_backend.llm.checkpoint import load_hf, load_llama
from mps_backend.llm.folder_check import json_object, weight_files
from mps_backend.llm.formats import read_json_object, read_safetensors_header
from mps_backend.llm.generate import Tokenizer, read_metadata
from mps_backend.llm.gguf import load_gguf, one_metadata_read, truncated_gguf
from mps_backend.llm.gguf import parameter_count as gguf_parameters
from mps_backend.llm.greedy import GenerationStats, greedy, prefill
from mps_backend.llm.options import ExportOptions
from mps_backend.llm.quality import perplexity
from mps_backend.llm.spec import parse_model_spec
from mps_backend.pages import PageReleaser
from mps_backend.precision import Precision
from mps_backend.quantize import Quantization, dequantize_weights, quantize_embeddings
from mps_backend.runtime import LoadedMethod

#: decode steps verified by default (``mps-backend export --verify-steps``)
DEFAULT_STEPS = 4
#: max |pte - eager float32| / max |eager float32| of the logits, per export precision. float32:
#: the bound tests/llm/test_export.py's int8 test holds a float32 program to (it computes as eager does,
#: in another op order); float16: tests/llm/test_export.py's FP16_LOGIT_TOL (each device op rounds to
#: float16, ~40 ops a layer). An error in a lowering or the decode step is of order 1.
TOLERANCE = {"fp32": 1e-5, "fp16": 1e-2}
#: least tolerance with int4 weights (tests/llm/test_export.py test_quantized_llm: the device's int4
#: dequantize yields float16, so each weight is rounded to float16 even in a float32 program)
INT4_TOLERANCE = 2e-3
#: layers kept in the truncated copy of a model too large to run eagerly
TRUNCATED_LAYERS = 2
#: environment variable overriding :func:`eager_budget` (bytes)
BUDGET_ENV = "MPS_BACKEND_VERIFY_MAX_BYTES"
#: the text the self-check reads before its greedy steps, tokenized with the checkpoint's own tokenizer
#: (words, digits, punctuation: what real text makes the activations do); cut to fit ``max_seq_len``
VERIFY_PROMPT = (
    "The history of the town begins in 1851, when three families crossed the river and built a mill. "
    "By the spring of 1903 it had a school, two churches and a railway station; today"
)


def precision_name(precision: Precision) -> str:
    """The tolerance's name of a precision policy: ``fp16`` for any float16 one, else ``fp32``."""
    return "fp16" if precision.float16 else "fp32"


def tolerance(dtype: str, quantize: str | None = None) -> float:
    """The verify bound for an export in ``dtype`` (``fp16``/``fp32``) with ``quantize`` weights."""
    tol = TOLERANCE[dtype]
    return max(tol, INT4_TOLERANCE) if quantize == "int4" else tol


@dataclass
class LLMVerification:
    steps: int
    max_abs_diff: float
    scale: float
    tolerance: float
    tokens_agree: int
    reference: str
    truncated: str | None = None  # why and how the model was truncated, if it was
    #: tokens of :data:`VERIFY_PROMPT` read (teacher-forced) after BOS before the greedy steps
    prompt_tokens: int = 0
    #: of the prompt's positions the .pte gave logits for before its last (all of them token by token;
    #: each piece's last in a chunked prefill), those where its and the eager model's top token agree
    prompt_agree: int = 0
    #: how many prompt positions were compared (``prompt_agree`` of them)
    prompt_rows: int = 0
    #: where the prompt's tokens came from (the tokenizer file), or why there are none
    prompt_source: str = ""
    #: a quantized export: the eager model with the quantized weights against the one with the float
    #: weights on the same tokens (:func:`quantization_price`), None otherwise
    price: str | None = None
    #: a check of the program beside its logits that failed (Whisper: its decoding rules' row), None: none did
    failure: str | None = None

    @property
    def relative(self) -> float:
        return self.max_abs_diff / self.scale if self.scale > 0 else float("inf")

    @property
    def ok(self) -> bool:
        return self.relative <= self.tolerance and self.failure is None

    def __str__(self) -> str:
        head = f"verify           {self.steps} decode steps on the emulated runtime vs {self.reference}"
        if self.prompt_tokens:
            head += (
                f"\nverify           after a {self.prompt_tokens}-token English prompt ({self.prompt_source}), "
                f"teacher-forced: top tokens agree {self.prompt_agree}/{self.prompt_rows}"
            )
        elif self.prompt_source:
            head += f"\nverify           from BOS alone: {self.prompt_source}"
        if self.truncated:
            head += f"\nverify           {self.truncated}"
        if self.price:
            head += f"\nverify           {self.price}"
        if self.failure:
            head += f"\nverify           FAILED: {self.failure}"
        return (
            f"{head}\nverify           max |logit diff| {self.max_abs_diff:.3g} = {self.relative:.3g} of the logits' "
            f"scale {self.scale:.3g} (tolerance {self.tolerance:g}); greedy tokens agree {self.tokens_agree}/{self.steps}: "
            + ("ok" if self.ok else "FAILED (the .pte does not compute what the model does)")
        )


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable``), else the physical memory."""
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def eager_budget() -> int:
    """Bytes the eager float32 reference plus the emulated program may take: half the available
    memory (``$MPS_BACKEND_VERIFY_MAX_BYTES`` overrides)."""
    return env_bytes(BUDGET_ENV, available_memory() // 2)


def _hf_tensors(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """Every tensor name of a safetensors checkpoint folder -> its file."""
    names = {}
    for f in weight_files(folder):  # the files the export read, no other
        names.update(dict.fromkeys(read_safetensors_header(f), f))
    return names


def parameter_count(kind: str, path: pathlib.Path) -> int:
    """Parameters in a checkpoint, from its headers (hf, gguf) or its mapped tensors (llama)."""
    if kind == "gguf":
        return gguf_parameters(path)
    if kind == "hf":
        return sum(math.prod(e.shape) for f in weight_files(path) for e in read_safetensors_header(f).values())
    state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    state = state.get("model", state) if isinstance(state.get("model"), dict) else state
    return sum(t.numel() for t in state.values() if isinstance(t, torch.Tensor))


_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
_N_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def _kept(name: str, layers: int) -> bool:
    m = _LAYER.search(name)
    return m is None or int(m.group(1)) < layers


def _truncate_config(cfg: dict, layers: int) -> int:
    """Set ``cfg``'s layer count to ``layers`` (and cut per-layer lists); returns the old count."""
    key = next(k for k in _N_LAYER_KEYS if isinstance(cfg.get(k), int))
    old = cfg[key]
    for k, v in list(cfg.items()):
        if isinstance(v, list) and len(v) == old:
            cfg[k] = v[:layers]
    cfg[key] = layers
    return old


def truncated_copy(kind: str, path: pathlib.Path, params: pathlib.Path | None, into: pathlib.Path, layers: int) -> tuple:
    """A checkpoint of the first ``layers`` layers of ``path`` written into ``into``: returns
    (spec, params path or None, the original layer count). Only the kept tensors are read."""
    if kind == "gguf":
        file, old = truncated_gguf(path, into, layers)
        return f"gguf:{file}", None, old
    if kind == "hf":
        from safetensors import safe_open  # noqa: PLC0415
        from safetensors.torch import save_file  # noqa: PLC0415

        cfg = json_object(path, "config.json", required=True)
        old = _truncate_config(cfg, layers)
        (into / "config.json").write_text(json.dumps(cfg))
        for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            if (path / name).is_file():
                (into / name).write_bytes((path / name).read_bytes())
        by_file: dict[pathlib.Path, list[str]] = {}
        for name, f in _hf_tensors(path).items():
            if _kept(name, layers):
                by_file.setdefault(f, []).append(name)
        kept = {}
        for f, names in by_file.items():
            with safe_open(str(f), framework="pt") as st:
                kept.update({n: st.get_tensor(n).contiguous() for n in names})
        save_file(kept, str(into / "model.safetensors"), metadata={"format": "pt"})
        return f"hf:{into}", None, old
    p = read_json_object(params or path.with_name("params.json"))
    old = _truncate_config(p, layers)
    (into / "params.json").write_text(json.dumps(p))
    state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    state = state["model"] if isinstance(state.get("model"), dict) else state
    torch.save({k: v for k, v in state.items() if _kept(k, layers)}, into / "consolidated.pth")
    return f"llama:{into / 'consolidated.pth'}", into / "params.json", old


def _pte_logits(pte: pathlib.Path, prefix: list[int], steps: int) -> tuple[list[int], torch.Tensor, list[int]]:
    """The program's logits after ``prefix``, read as executorch's runner reads it (in pieces of
    ``get_max_seq_len`` tokens when the program takes ``[1, n]`` tokens, ``enable_dynamic_shape``; one
    token a call otherwise), then its greedy tokens for ``steps`` tokens in all (the first chosen after
    the prefix's last), one a call. Returns every token read or chosen, the logits of each call, and
    the position each call's logits follow (its last row)."""
    meta = read_metadata(pte)
    piece = int(meta["get_max_seq_len"]) if meta.get("enable_dynamic_shape") else 1
    step = LoadedMethod(pte, "forward")  # a path: executorch maps the file

    def call(ids: list[int], pos: int) -> torch.Tensor:
        out = step([torch.tensor([ids], dtype=torch.long), torch.tensor([pos], dtype=torch.long)])[0]
        return out.reshape(-1, out.shape[-1])[-1].float()  # [1, V] or [1, n, V]: the last row

    logits, rows = prefill(call, prefix, piece)
    run = GenerationStats(logits=[])  # the logits each greedy token was chosen from: the prefill's last, then each step's
    tokens = [
        *prefix,
        *greedy(lambda token, pos: call([token], pos), logits[-1], len(prefix), steps, stats=run, stop_at_eos=False),
    ]
    rows += range(len(prefix), len(prefix) + steps - 1)
    return tokens, torch.stack([*logits[:-1], *run.logits]), rows


def prompt_tokens(kind: str, path: pathlib.Path, vocab: int | None, room: int) -> tuple[list[int], str]:
    """The tokens of :data:`VERIFY_PROMPT` by the checkpoint's own tokenizer (an ``hf:`` folder's
    ``tokenizer.json`` or ``tokenizer.model``; a ``gguf:`` file's own; for ``llama:`` one beside the checkpoint), at most
    ``room``, and where they came from; none, and why, when there is no usable tokenizer."""
    folder = path if kind == "hf" else path.parent
    if room < 1:
        return [], "no room for a prompt below --max-seq-len"
    if kind != "gguf" and not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer.model")):
        return [], f"no tokenizer.json or tokenizer.model in {folder}"
    try:
        tok = Tokenizer(path if kind == "gguf" else folder)  # a GGUF file holds its tokenizer
        ids = tok.encode(VERIFY_PROMPT)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - a tokenizer that cannot load or panics (a BaseException)
        return [], f"its tokenizer could not be used ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    if vocab is not None and any(not 0 <= i < vocab for i in ids):
        return [], f"{tok.path.name} gives ids beyond the model's vocabulary of {vocab}"
    return ids[:room], tok.path.name


def _eager_logits(
    kind: str,
    path: pathlib.Path,
    params,
    tokens: list[int],
    quantization: Quantization | None,
    max_seq_len: int,
    dtype: str,
    embedding=False,
    keep: bool = True,
):
    """Float32 eager logits after each of ``tokens``. A quantized export's reference quantizes the
    weights as the export did (in the export precision: scales of float16 weights differ from those of
    the float32 ones) and computes in float32 with those weights dequantized; so does a ``gguf:``
    file's with its quantized tensors kept (``keep``, without ``quantization``: as the export keeps them)."""
    kept = kind == "gguf" and keep and not quantization
    load = torch.float16 if (quantization or embedding or kept) and dtype == "fp16" else torch.float32
    if kind == "gguf":
        # the GGUF as the export loads it: its kept tensors dequantized as the device computes them
        model = load_gguf(path, load, clamp_fp16=True, keep_quantized=kept).model
        reference = "eager transformers float32"
        if kept and dequantize_weights(model):
            reference += " (the GGUF's quantized tensors as kept, dequantized)"
    elif kind == "hf":
        # the export's own loader: the same folder check (no code from the folder runs, trust_remote_code=False)
        # and the same tensors from the same files, in the reference precision (clamped as an fp16 export's were)
        model = load_hf(path, load, clamp_fp16=True).model
        reference = "eager transformers float32"
    else:
        model = load_llama(path, params, load, max_seq_len).model
        reference = "eager executorch llama float32"
    if quantization:
        quantization.dequantize_alike(model)
        reference += f" ({quantization.scheme} weights quantized alike, dequantized)"
    if embedding:
        quantize_embeddings(model)
        reference += " (embedding quantized alike)"
    undo = float32_on_use(model) if load != torch.float32 else None

    def run() -> torch.Tensor:
        with torch.no_grad():
            if kind != "llama":
                return model(input_ids=torch.tensor([tokens])).logits[0].float()
            vocab = model.params.vocab_size
            steps = [model(torch.tensor([[t]]), {"input_pos": torch.tensor([pos])}) for pos, t in enumerate(tokens)]
            return torch.stack([s.reshape(-1, vocab)[-1] for s in steps]).float()

    try:
        logits = run()
    except RuntimeError:
        if undo is None:
            raise
        undo()  # modeling code read a held 16-bit weight outside its module (a dtype mismatch); a
        logits = run()  # rerun from position 0 rewrites every KV-cache row it reads
    return logits, reference


#: weights of at least this many elements stay in the load precision between calls (float32_on_use)
ON_USE_NUMEL = 1 << 20
#: float32 bytes of a held linear weight widened at once (a block of its output rows)
ON_USE_CHUNK_BYTES = 64 << 20


def _embedding_rows(mod, ids):
    """``torch.nn.Embedding.forward`` on its 16-bit table, the gathered rows widened: the same values
    as a lookup in the widened table, without widening the table."""
    return torch.nn.functional.embedding(ids, mod._parameters["weight"], mod.padding_idx).float()


def _linear_blocks(mod, x):
    """``torch.nn.Linear.forward`` with its 16-bit weight widened a block of output rows at a time."""
    w, b = mod._parameters["weight"], mod.bias
    rows = max(1, ON_USE_CHUNK_BYTES // (4 * w.shape[1]))
    return torch.cat(
        [
            torch.nn.functional.linear(x, w[r : r + rows].float(), None if b is None else b[r : r + rows])
            for r in range(0, w.shape[0], rows)
        ],
        dim=-1,
    )


def float32_on_use(model: torch.nn.Module, min_numel: int | None = None):
    """Make ``model`` compute in float32 while its large 16-bit weights stay 16-bit: a module whose
    ``weight`` has ``min_numel`` (default :data:`ON_USE_NUMEL`) elements or more keeps it, and
    everything else is converted by ``model.float()``. A plain ``Linear`` widens its weight a block of
    rows at a time, a plain ``Embedding`` the rows it gathers, and any other module its whole weight
    while its forward runs (its own code may read the weight's dtype). Widening is exact, so the
    logits are the float32 model's, without the float32 copy of each weight (an LLM's embedding and
    head in float32 take 4 bytes a vocabulary entry and dimension each). Returns a function that
    makes the held weights float32 for good (for modeling code that reads a weight outside its
    module's forward)."""
    min_numel = ON_USE_NUMEL if min_numel is None else min_numel
    held = {}
    for m in model.modules():
        w = m._parameters.get("weight")
        if w is not None and w.dtype in (torch.float16, torch.bfloat16) and w.numel() >= min_numel:
            held[m] = w
            m._parameters["weight"] = None  # out of model.float()'s way
    model.float()
    hooks = []
    for m, w in held.items():
        m._parameters["weight"] = w
        if type(m) is torch.nn.Linear:
            m.forward = types.MethodType(_linear_blocks, m)
        elif type(m) is torch.nn.Embedding and m.max_norm is None:
            m.forward = types.MethodType(_embedding_rows, m)
        else:

            def widen(mod, args, w=w):
                mod._parameters["weight"] = torch.nn.Parameter(w.float(), requires_grad=False)

            def narrow(mod, args, out, w=w):
                mod._parameters["weight"] = w

            hooks += [m.register_forward_pre_hook(widen), m.register_forward_hook(narrow)]

    def undo() -> None:
        for h in hooks:
            h.remove()
        for m in held:
            m.__dict__.pop("forward", None)
        model.float()

    return undo


def verify_llm(
    pte: str | os.PathLike,
    model: str,
    *,
    dtype: str = "fp16",
    steps: int = DEFAULT_STEPS,
    quantization: Quantization | None = None,
    params: str | None = None,
    max_seq_len: int | None = None,
    bos_id: int | None = None,
    quantize_embedding: bool = False,
    prompt: tuple[list[int], str] | None = None,
) -> LLMVerification:
    """Compare the ``.pte`` (exported from ``model``, ``hf:``/``gguf:``/``llama:``) with the eager float32 model
    on the same tokens (the module docstring): BOS, the prompt's tokens (``prompt``: tokens and where
    they came from; default :func:`prompt_tokens` of ``model``'s tokenizer), then ``steps`` greedy steps."""
    if steps < 1:
        raise CheckpointError(f"--verify-steps must be at least 1, got {steps}")
    kind, path = parse_model_spec(model)
    path = pathlib.Path(path)
    pte = pathlib.Path(pte)
    if max_seq_len is not None and steps > max_seq_len:
        raise CheckpointError(f"--verify-steps {steps} exceeds --max-seq-len {max_seq_len}")
    if prompt is None:
        prompt = prompt_tokens(kind, path, None, (max_seq_len or steps) - steps)
    ids, source = prompt
    prefix = [bos_id if bos_id is not None else 0, *ids]
    tokens, dev, rows = _pte_logits(pte, prefix, steps)
    length = max_seq_len or len(tokens)
    ref, reference = _eager_logits(kind, path, params, tokens[:-1], quantization, length, dtype, quantize_embedding)
    if ref.shape[-1:] != dev.shape[-1:] or ref.shape[0] != len(tokens) - 1:
        raise CheckpointError(f"the .pte's logits {list(dev.shape)} and the eager model's {list(ref.shape)} differ in shape")
    price = None
    if quantization or quantize_embedding:  # the float model loaded after the quantized one is released
        floating, _ = _eager_logits(kind, path, params, tokens[:-1], None, length, dtype, keep=False)
        price = quantization_price(ref, floating, tokens)
        del floating
    ref = ref[rows]  # the positions the program gave logits for (a chunked prefill: each piece's last)
    top_ref, top_dev = ref.argmax(-1).tolist(), dev.argmax(-1).tolist()
    m = len(prefix)
    prompt_rows = sum(r < m - 1 for r in rows)  # the prompt's calls before the one after its last token
    return LLMVerification(
        steps=steps,
        max_abs_diff=float((dev - ref).abs().max()),
        scale=float(ref.abs().max()),
        tolerance=tolerance(dtype, quantization.scheme if quantization else None),
        tokens_agree=sum(int(a) == b for a, b in zip(top_ref[prompt_rows:], tokens[m:])),
        reference=reference,
        prompt_tokens=len(ids),
        prompt_agree=sum(int(a == b) for a, b in zip(top_ref[:prompt_rows], top_dev[:prompt_rows])),
        prompt_rows=prompt_rows,
        prompt_source=source,
        price=price,
    )


def quantization_price(quantized: torch.Tensor, floating: torch.Tensor, tokens: list[int]) -> str:
    """What quantizing cost on ``tokens`` (every token read or chosen): ``quantized`` and ``floating`` are
    the eager logits after each but the last, with the quantized and with the float weights; the top-1
    agreement over every position and the perplexity of the tokens under each."""
    agree = int((quantized.argmax(-1) == floating.argmax(-1)).sum())
    ppl_q, ppl_f = perplexity(quantized, tokens), perplexity(floating, tokens)
    return (
        "the quantization's price on these tokens (eager, quantized weights vs float ones): "
        f"top tokens agree {agree}/{quantized.shape[0]}, perplexity {ppl_q:.4g} vs {ppl_f:.4g} = {ppl_q / ppl_f:.4f}x"
    )


def needs_truncation(kind: str, path: pathlib.Path, pte_bytes: int) -> tuple[bool, int, int]:
    """(too large, bytes the verification would take, the bound): the eager float32 copy (4 bytes a
    parameter) plus twice the ``.pte`` (the emulator's copy of the program and its working memory)."""
    need = 4 * parameter_count(kind, path) + 2 * pte_bytes
    budget = eager_budget()
    return need > budget, need, budget


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def verify_export(result, model: str, options: ExportOptions, *, export, pte: pathlib.Path | None = None) -> LLMVerification:
    """Verify the export ``result`` (an ``LLMExportResult``) of ``model`` with ``options``, written to ``pte``
    (default ``result.path``); when the eager model is too large (:func:`needs_truncation`), on a truncated
    copy exported by ``export(spec, out, params)``."""
    _release()
    with one_metadata_read():  # a GGUF's metadata, read by the prompt's tokenizer and the eager reference's config
        return _verify_export(result, model, options, export=export, pte=result.path if pte is None else pte)


def _release() -> None:
    """An export's program and graphs, freed before what comes next is loaded."""
    gc.collect()
    PageReleaser().trim()


def _verify_export(result, model: str, options: ExportOptions, *, export, pte: pathlib.Path) -> LLMVerification:
    steps, params = options.verify_steps, options.params
    kind, path = parse_model_spec(model)
    common = dict(
        dtype=precision_name(options.precision),
        steps=steps,
        quantization=options.quantization,
        quantize_embedding=options.quantize_embedding,
    )
    bos = result.metadata.get("get_bos_id")
    common["prompt"] = prompt_tokens(kind, pathlib.Path(path), result.metadata.get("get_vocab_size"), result.max_seq_len - steps)
    too_large, need, budget = needs_truncation(kind, pathlib.Path(path), result.pte_bytes)
    if not too_large:
        return verify_llm(pte, model, params=params, max_seq_len=result.max_seq_len, bos_id=bos, **common)
    with tempfile.TemporaryDirectory(prefix="mps-verify-") as tmp:
        tmp = pathlib.Path(tmp)
        spec, tparams, old = truncated_copy(
            kind, pathlib.Path(path), pathlib.Path(params) if params else None, tmp, TRUNCATED_LAYERS
        )
        out = tmp / "truncated.pte"
        export(spec, out, str(tparams) if tparams else None)
        _release()
        v = verify_llm(out, spec, params=str(tparams) if tparams else None, max_seq_len=result.max_seq_len, bos_id=bos, **common)
    v.truncated = (
        f"on a copy truncated to the first {min(TRUNCATED_LAYERS, old)} of {old} layers, exported separately: the full "
        f"model's eager float32 check would take {_size(need)}, above the bound {_size(budget)} "
        f"(half the available memory; ${BUDGET_ENV})"
    )
    return v
