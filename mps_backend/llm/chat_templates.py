"""Chat templates rendered within bounds (#47).

A chat template is a program: Jinja code from the checkpoint folder (``chat_template.jinja``,
``tokenizer_config.json``, a processor's) or a GGUF file's metadata. transformers renders it in Jinja's
sandbox, which stops it from reaching Python's internals but not from running for hours (nested
``range(100000)`` loops, ``99 ** 999999999``) or filling the memory (``'A' * 2000000000``, a 200 MB prompt).
:func:`bounded_rendering` makes every rendering transformers' ``apply_chat_template`` does (a tokenizer's or a
processor's) run in a child process (:mod:`mps_backend.llm.chat_render`, transformers' own
``render_jinja_template`` there; a fork on Linux, milliseconds; a fresh interpreter elsewhere) under these
limits, and turns whatever the template does wrong (a syntax error, its own ``raise_exception``,
``{% include %}``, a sandbox violation, a limit) into one :class:`ChatTemplateError` line naming the template's
source and the limit:

- :data:`MAX_RENDER_SECONDS` of CPU (the kernel's ``RLIMIT_CPU``: it stops a template inside one long C call);
- :data:`MAX_RENDER_MEMORY` bytes of memory beyond the renderer's own (``RLIMIT_AS``, Linux);
- an output of at most :data:`MAX_RENDERED_EXTRA` characters beyond the text of the messages and the
  template's variables (a template that repeats its input, or writes megabytes of its own, is refused:
  the rendered prompt is tokenized and prefilled next).

The bounds are far above real templates (docs/llm.md, Bounds): SmolLM2-Instruct's renders in 0.23 ms and
adds 148 characters to one user message; the longest templates shipped with instruct models
(tool-calling ones, a few KB) add a few KB.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import signal
import subprocess
import sys
from typing import Any, Iterator

from mps_backend.errors import MPSBackendError

#: CPU seconds one rendering may take (real templates: milliseconds)
MAX_RENDER_SECONDS = 10
#: bytes of memory one rendering may take beyond the renderer's own
MAX_RENDER_MEMORY = 1 << 30
#: characters a rendered prompt may hold beyond the text of its messages and variables
MAX_RENDERED_EXTRA = 1 << 20
#: wall-clock seconds for the child's start (its imports, on a loaded machine) and the rendering
WALL_SECONDS = 120
#: the modules whose ``render_jinja_template`` (imported by name) :func:`bounded_rendering` replaces
RENDERING_MODULES = ("transformers.tokenization_utils_base", "transformers.processing_utils")


class ChatTemplateError(MPSBackendError, ValueError):
    """A chat template that failed or passed a bound: one line naming its source and the reason."""


def _plain(value: Any) -> Any:
    """JSON for the child: what is not plain data becomes a placeholder naming its type, as transformers'
    ``_plain_template_data`` does for everything a template sees."""
    return f"<{type(value).__name__}>"


def _forked(request: dict) -> tuple[bytes, int | None]:
    """(the child's answer, its wait status; None: past :data:`WALL_SECONDS`, killed) of a forked child rendering
    ``request`` (transformers is imported already: the fork costs milliseconds)."""
    import os  # noqa: PLC0415
    import select  # noqa: PLC0415
    import time  # noqa: PLC0415

    from mps_backend.llm import chat_render  # noqa: PLC0415

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: render, answer, leave without running the parent's clean-up
        try:
            os.close(read_end)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            data = json.dumps(chat_render.answer(request)).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view) :]
        finally:
            os._exit(0)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + WALL_SECONDS
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return b"", None
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return b"".join(chunks), os.waitstatus_to_exitcode(status)


def _spawned(request: dict) -> tuple[bytes, int | None]:
    """The same with a fresh interpreter running :mod:`mps_backend.llm.chat_render` by path (not Linux)."""
    child = pathlib.Path(__file__).with_name("chat_render.py")
    try:
        proc = subprocess.run(
            [sys.executable, "-I", str(child)], input=json.dumps(request).encode(), capture_output=True, timeout=WALL_SECONDS
        )
    except subprocess.TimeoutExpired:
        return b"", None
    return proc.stdout, proc.returncode


def render_in_child(args: tuple, kwargs: dict, where: str) -> Any:
    """transformers' ``render_jinja_template(*args, **kwargs)`` in a child process within the limits (module
    docstring); a failure or a limit is a :class:`ChatTemplateError` naming ``where``."""
    request = json.loads(json.dumps({"args": list(args), "kwargs": kwargs}, default=_plain))  # plain data only
    request.update(cpu_seconds=MAX_RENDER_SECONDS, memory_bytes=MAX_RENDER_MEMORY, extra_bytes=MAX_RENDERED_EXTRA)
    out, status = _forked(request) if sys.platform.startswith("linux") else _spawned(request)
    if status is None:
        raise ChatTemplateError(f"{where}: the chat template did not finish within {WALL_SECONDS} s")
    if status in (-signal.SIGXCPU, -signal.SIGKILL):
        raise ChatTemplateError(
            f"{where}: the chat template ran past its {MAX_RENDER_SECONDS} s CPU limit (stopped; real templates render "
            "in milliseconds)"
        )
    try:
        answer = json.loads(out)
    except ValueError:
        raise ChatTemplateError(f"{where}: the chat template's renderer ended with status {status} and no answer") from None
    if "ok" in answer:
        return tuple(answer["ok"])
    kind, error = answer.get("kind"), answer.get("error", "?")
    if kind == "memory":
        raise ChatTemplateError(f"{where}: the chat template needed more than its {MAX_RENDER_MEMORY >> 20} MiB memory limit")
    if kind == "size":
        raise ChatTemplateError(
            f"{where}: the chat template's output passes the {MAX_RENDERED_EXTRA >> 20} MiB it may add to the messages ({error})"
        )
    raise ChatTemplateError(f"{where}: the chat template failed: {error}")


@contextlib.contextmanager
def bounded_rendering(where: str) -> Iterator[None]:
    """For the duration, every chat-template rendering of transformers' ``apply_chat_template`` (tokenizers'
    and processors') runs through :func:`render_in_child`, failures naming ``where``: the name
    ``render_jinja_template`` in the modules of :data:`RENDERING_MODULES` that are loaded is replaced, and put
    back on the way out (a scoped change of transformers, undone)."""
    import importlib  # noqa: PLC0415

    def render(*args: Any, **kwargs: Any) -> Any:
        return render_in_child(args, kwargs, where)

    modules = [importlib.import_module(name) for name in RENDERING_MODULES if name in sys.modules]
    saved = [m.render_jinja_template for m in modules]
    for m in modules:
        m.render_jinja_template = render
    try:
        yield
    finally:
        for m, original in zip(modules, saved):
            m.render_jinja_template = original
