"""Greedy generation with an exported language-model ``.pte`` on the emulated MPS runtime.

    from mps_backend.llm import generate
    for piece in generate("model.pte", "tokenizer.json", "Once upon a time", max_new_tokens=32):
        print(piece, end="", flush=True)

Two runners, the same methods and the same tokens:

- ``"python"`` (default): the loop executorch's LLM runner runs, written out here over
  :class:`mps_backend.runtime.LoadedMethod`: read the metadata methods, prefill the prompt (one token
  per ``forward`` call when ``enable_dynamic_shape`` is false; else pieces of up to ``get_max_seq_len``
  tokens per call, as executorch's ``TextPrefiller`` cuts them), then feed back the argmax one token
  per call until an EOS id, ``max_new_tokens`` or the cache's end (``get_max_context_len``).
- ``"executorch"``: executorch's own C++ ``TextLLMRunner`` (the wheel's ``_llm_runner`` binding),
  with the MPS delegates emulated in the same process; temperature 0 (greedy).

Speeds printed are of the emulation on this machine's CPU, not of a device.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch


def tokenizer_file(path: str | pathlib.Path) -> pathlib.Path:
    """The tokenizer file ``path`` names: itself (``tokenizer.json``, ``tokenizer.model``, or a GGUF file,
    whose metadata holds its tokenizer), or in a folder its ``tokenizer.json`` (Hugging Face) or else its
    ``tokenizer.model`` (Meta: SentencePiece or tiktoken)."""
    p = pathlib.Path(path)
    if p.is_dir():
        p = next((p / name for name in ("tokenizer.json", "tokenizer.model") if (p / name).is_file()), p / "tokenizer.json")
    if not p.is_file():
        raise FileNotFoundError(
            f"{path}: no tokenizer file (tokenizer.json, tokenizer.model, a GGUF file, or a folder holding one)"
        )
    return p


class Tokenizer:
    """encode/decode over a Hugging Face ``tokenizer.json``, a GGUF file's tokenizer (read by transformers),
    or a ``tokenizer.model`` (SentencePiece or tiktoken, through executorch's pytorch_tokenizers), or a
    folder holding one (:func:`tokenizer_file`). :meth:`chat` applies the model's chat template."""

    def __init__(self, path: str | pathlib.Path):
        p = self.path = tokenizer_file(path)
        self._transformers = None  # transformers' tokenizer, for the chat template (loaded when asked)
        self._pt = None
        if p.suffix == ".gguf":
            from mps_backend.llm.gguf import load_tokenizer  # noqa: PLC0415

            self._transformers = load_tokenizer(p)
            self._hf = self._transformers.backend_tokenizer
        elif p.suffix == ".json":
            from tokenizers import Tokenizer as HFTokenizer  # noqa: PLC0415

            self._hf = self._guarded("read", HFTokenizer.from_file, str(p))
        else:
            from pytorch_tokenizers import get_tokenizer  # noqa: PLC0415

            self._hf = None
            with contextlib.redirect_stdout(io.StringIO()):  # it prints "Using Tiktokenizer": stdout is the text
                self._pt = get_tokenizer(str(p))

    def _guarded(self, what: str, fn, *args):
        """``fn(*args)``, a call into the Rust tokenizers library: an error, or a panic (a
        ``pyo3_runtime.PanicException``, a BaseException: an empty ``Replace`` regex panics in encode),
        is one ValueError naming the file; the panic's own report, written by Rust to standard error,
        is dropped (what the call writes there otherwise is passed on)."""
        import os  # noqa: PLC0415
        import sys  # noqa: PLC0415
        import tempfile  # noqa: PLC0415

        sys.stderr.flush()
        with tempfile.TemporaryFile() as captured:
            saved = os.dup(2)
            os.dup2(captured.fileno(), 2)
            failed = None
            try:
                return fn(*args)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception or panics
                failed = e
                detail = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
                if what == "read" and isinstance(e, Exception):
                    raise ValueError(f"{self.path}: not a readable tokenizer ({detail})") from None
                how = "panicked" if not isinstance(e, Exception) else "failed"
                raise ValueError(f"{self.path}: the tokenizer {how} when asked to {what} ({detail})") from None
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                if failed is None:
                    captured.seek(0)
                    text = captured.read()
                    if text:
                        sys.stderr.write(text.decode(errors="replace"))

    def encode(self, text: str) -> list[int]:
        if self._hf is not None:
            return list(self._guarded("encode", self._hf.encode, text).ids)
        return list(self._pt.encode(text, bos=False, eos=False))

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        if self._hf is not None:
            return self._guarded("decode", self._hf.decode, ids, skip_special_tokens)
        return self._pt.decode(ids)

    def chat(self, prompt: str) -> str:
        """``prompt`` as one user message in the model's chat template, ready for the assistant's answer
        (transformers' ``apply_chat_template(..., add_generation_prompt=True)``). The template comes from
        the GGUF file, or from the tokenizer's folder (``tokenizer_config.json``, ``chat_template.jinja``);
        a tokenizer without one is a ValueError, and so is a template that fails or passes a bound (rendered in
        a child process: :mod:`mps_backend.llm.chat_templates`)."""
        tok = self._transformers
        if tok is None:
            import transformers  # noqa: PLC0415

            try:
                tok = transformers.AutoTokenizer.from_pretrained(self.path.parent, local_files_only=True, trust_remote_code=False)
            except Exception as e:  # noqa: BLE001 - whatever transformers refuses the folder with
                raise ValueError(f"{self.path.parent}: no chat template readable ({type(e).__name__}: {str(e)[:160]})") from None
            self._transformers = tok
        if not getattr(tok, "chat_template", None):
            raise ValueError(f"{self.path}: the tokenizer has no chat template (--chat needs an instruct model's)")
        from mps_backend.llm.chat_templates import bounded_rendering  # noqa: PLC0415 - a child process, within limits

        where = str(self.path if self.path.suffix == ".gguf" else self.path.parent)
        with bounded_rendering(where):
            return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)

    def json_file(self, folder: pathlib.Path) -> pathlib.Path:
        """A file executorch's runner reads: the tokenizer file itself, or for a GGUF its tokenizer
        written as ``tokenizer.json`` into ``folder``."""
        if self.path.suffix != ".gguf":
            return self.path
        out = folder / "tokenizer.json"
        self._hf.save(str(out))
        return out


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stopped_by: str = ""
    #: set to a list to receive the logits each generated token was chosen from
    logits: list[torch.Tensor] | None = None

    @property
    def tokens_per_second(self) -> float:
        n = max(len(self.generated) - 1, 0)  # the first token comes from the prefill's last step
        return n / self.decode_seconds if self.decode_seconds > 0 else 0.0

    def __str__(self) -> str:
        return (
            f"{self.prompt_tokens} prompt tokens, {len(self.generated)} generated ({self.stopped_by}); "
            f"emulated on this CPU, not a device: prefill {self.prefill_seconds:.2f}s, "
            f"decode {self.tokens_per_second:.1f} tokens/s"
        )


def _as_ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def read_metadata(pte: bytes | str | pathlib.Path) -> dict:
    from mps_backend.runtime import constant_method_values  # noqa: PLC0415

    meta = constant_method_values(pte)
    if "get_max_seq_len" not in meta:
        raise ValueError("the program has no get_max_seq_len method: not an LLM export (mps-backend export --model hf:...)")
    return meta


def check_token_ids(ids: list[int], meta: dict, what: str = "prompt") -> None:
    """Refuse (ValueError) a token id outside the program's vocabulary (``get_vocab_size``) before it reaches
    the program: an id of 2**32 - 1 ran, the device's int32 cast of the embedding index reading another
    row (the device model refuses such an index too: it never wraps)."""
    vocab = meta.get("get_vocab_size")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or (vocab is not None and not 0 <= t < int(vocab)):
            raise ValueError(f"{what} token id {t!r} is not in the model's vocabulary [0, {vocab}) (get_vocab_size)")


def iter_tokens(
    pte: bytes | str | pathlib.Path,
    prompt_ids: list[int],
    max_new_tokens: int = 32,
    *,
    stats: GenerationStats | None = None,
    mode: str = "faithful",
) -> Iterator[int]:
    """Greedy continuation of ``prompt_ids`` by the ``.pte``, one id at a time: the loop of
    executorch's LLM runner over the emulated runtime. Stops after an EOS id (yielded),
    ``max_new_tokens`` or at the cache's end (``get_max_context_len``)."""
    from mps_backend.runtime import LoadedMethod  # noqa: PLC0415

    if isinstance(pte, (str, pathlib.Path)):
        pte = pathlib.Path(pte).read_bytes()
    meta = read_metadata(pte)
    max_len = int(meta.get("get_max_context_len", meta["get_max_seq_len"]))  # the KV cache's length
    piece = int(meta["get_max_seq_len"]) if meta.get("enable_dynamic_shape") else 1  # tokens per prefill call
    eos = set(_as_ids(meta.get("get_eos_ids")))
    stats = stats if stats is not None else GenerationStats()
    if not prompt_ids:
        raise ValueError("empty prompt")
    check_token_ids(list(prompt_ids), meta)
    if len(prompt_ids) >= max_len:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens does not fit max_seq_len {max_len}")
    step = LoadedMethod(pte, "forward", mode)

    def forward(tokens: list[int], pos: int) -> torch.Tensor:
        return step([torch.tensor([tokens], dtype=torch.long), torch.tensor([pos], dtype=torch.long)])[0]

    stats.prompt_tokens = len(prompt_ids)
    t0 = time.perf_counter()
    for pos in range(0, len(prompt_ids), piece):
        logits = forward(prompt_ids[pos : pos + piece], pos)
    stats.prefill_seconds = time.perf_counter() - t0
    pos = len(prompt_ids)
    stats.stopped_by = "max_new_tokens"
    while len(stats.generated) < max_new_tokens:
        token = int(torch.argmax(logits.reshape(-1)))
        stats.generated.append(token)
        if stats.logits is not None:
            stats.logits.append(logits.reshape(-1).clone())
        yield token
        if token in eos:
            stats.stopped_by = "EOS"
            return
        if pos >= max_len:
            stats.stopped_by = "max_seq_len"
            return
        if len(stats.generated) < max_new_tokens:
            t0 = time.perf_counter()  # decode time: the forward calls only, not the caller's work
            logits = forward([token], pos)
            stats.decode_seconds += time.perf_counter() - t0
            pos += 1


def generate_ids(
    pte: bytes | str | pathlib.Path,
    prompt_ids: list[int],
    max_new_tokens: int = 32,
    *,
    stats: GenerationStats | None = None,
    mode: str = "faithful",
) -> list[int]:
    """The greedy continuation of ``prompt_ids`` as a list (see :func:`iter_tokens`)."""
    return list(iter_tokens(pte, prompt_ids, max_new_tokens, stats=stats, mode=mode))


def generate(
    pte: bytes | str | pathlib.Path,
    tokenizer: str | pathlib.Path | Tokenizer,
    prompt: str,
    max_new_tokens: int = 32,
    *,
    stats: GenerationStats | None = None,
    bos: bool = False,
) -> Iterator[str]:
    """Stream the greedy continuation of ``prompt`` as text pieces (python runner). ``bos``: put the
    model's BOS id (``get_bos_id``) before the prompt's tokens when the tokenizer did not."""
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
    if isinstance(pte, (str, pathlib.Path)):
        pte = pathlib.Path(pte).read_bytes()
    ids = tok.encode(prompt)
    if bos:
        bos_id = read_metadata(pte).get("get_bos_id")
        if bos_id is not None and (not ids or ids[0] != int(bos_id)):
            ids = [int(bos_id), *ids]
    out: list[int] = []
    done = text = ""
    for token in iter_tokens(pte, ids, max_new_tokens, stats=stats):
        out.append(token)
        text = tok.decode(out)
        # a multi-byte character split across tokens decodes to U+FFFD until it is complete
        if text.endswith("\ufffd") or not text.startswith(done):
            continue
        piece, done = text[len(done) :], text
        if piece:
            yield piece
    # bytes still held back at the end (no token completed them): as the whole sequence decodes them
    if text != done and text.startswith(done):
        yield text[len(done) :]


def generate_with_executorch_runner(
    pte: str | pathlib.Path,
    tokenizer: str | pathlib.Path | Tokenizer,
    prompt: str,
    max_new_tokens: int = 32,
    *,
    bos: bool = False,
) -> list[str]:
    """Greedy generation by executorch's C++ ``TextLLMRunner`` (MPS delegates emulated). Returns the
    text pieces its token callback received. A GGUF file's tokenizer is handed to it as a
    ``tokenizer.json`` written to a temporary folder. ``bos``: as for :func:`generate`, the model's BOS id
    before the prompt's tokens when the tokenizer did not put it: the runner is asked for one
    (``GenerationConfig.num_bos``), and a runner whose tokenizer did not add it (executorch's ``tokenizer.json``
    reader adds BOS only through the file's post-processor) is a ValueError, never a run without it."""
    import tempfile  # noqa: PLC0415

    meta = read_metadata(pte)  # a program without the runner's methods is one ValueError, not a runner abort
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
    # the runner refuses a prompt that does not fit (after its BOS) with a bare "Generation failed"
    ids = tok.encode(prompt)
    check_token_ids(ids, meta)  # a tokenizer of a larger vocabulary than the model's
    bos_id = meta.get("get_bos_id")
    if bos and bos_id is None:
        raise ValueError("--bos: the program has no get_bos_id (the model declares no BOS token)")
    expected = len(ids) + (1 if bos and (not ids or ids[0] != int(bos_id)) else 0)
    n_prompt = len(ids) + (1 if bos_id is not None else 0)
    max_len = int(meta.get("get_max_context_len", meta["get_max_seq_len"]))
    if n_prompt >= max_len:
        raise ValueError(f"prompt of {n_prompt} tokens (with BOS) does not fit max_seq_len {max_len}")
    with tempfile.TemporaryDirectory(prefix="mps-tokenizer-") as folder:
        pieces, used = _run_executorch_runner(
            pte, tok.json_file(pathlib.Path(folder)), prompt, max_new_tokens, num_bos=1 if bos else 0
        )
    if bos and used != expected:
        raise ValueError(
            f"--bos: executorch's TextLLMRunner prefilled {used} prompt tokens, not the {expected} of the BOS id {bos_id} "
            f"and the prompt's {len(ids)}: its tokenizer ({tok.path.name}) adds no BOS (executorch's tokenizer.json reader adds "
            "one only through the file's post-processor); --runner python puts get_bos_id first"
        )
    return pieces


def _run_executorch_runner(
    pte: str | pathlib.Path, tokenizer: pathlib.Path, prompt: str, max_new_tokens: int, *, num_bos: int = 0
) -> tuple[list[str], int]:
    """The runner's pieces and the prompt tokens it prefilled (its stats); its own printing of the pieces
    and stats kept off standard output (:mod:`mps_backend.llm.runner_output`)."""
    from mps_backend.llm.runner_output import quiet_stdout  # noqa: PLC0415
    from mps_backend.runtime.emulator import load_emulator  # noqa: PLC0415

    load_emulator()  # registers MPSBackend in the libexecutorch the runner binding links
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner  # noqa: PLC0415

    try:
        runner = TextLLMRunner(str(pte), str(tokenizer))
    except RuntimeError as e:  # its C++ tokenizers read fewer tokenizer.json features than the tokenizers library
        raise ValueError(f"executorch's TextLLMRunner could not start: {e} (--runner python reads it)") from None
    pieces: list[str] = []
    stats: list = []
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, echo=False, num_bos=num_bos)
    try:
        with quiet_stdout():
            runner.generate(prompt, config, token_callback=pieces.append, stats_callback=stats.append)
    except RuntimeError as e:  # its own refusals (logged by the runner above) as one line
        raise ValueError(f"executorch's TextLLMRunner failed: {e} (its log above says why)") from None
    except UnicodeDecodeError as e:
        raise ValueError(
            f"executorch's runner binding cannot hand Python a token piece that is not UTF-8 on its own ({e.reason} "
            f"after {len(pieces)} pieces: a byte-level token of a multi-byte character); the python runner "
            "(--runner python) decodes such tokens together"
        ) from e
    return pieces, int(stats[-1].num_prompt_tokens) if stats else -1
