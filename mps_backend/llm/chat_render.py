"""The child process of :mod:`mps_backend.llm.chat_templates`: renders one chat template with transformers' own
``render_jinja_template`` (its sandboxed Jinja environment, ``raise_exception``, ``strftime_now``...) under the
limits it is given, and answers one JSON object (:func:`answer`). On Linux the child is a fork of the caller
(transformers already imported: milliseconds); elsewhere this file runs as a script by path (``python -I
chat_render.py``), importing transformers' chat-template module only, never the mps_backend package.

Input (standard input, JSON): ``{"args": [...], "kwargs": {...}, "cpu_seconds": N, "memory_bytes": M,
"extra_bytes": E}``. Output: ``{"ok": [rendered, generation_indices]}`` or ``{"error": "...", "kind": K}``
with K one of ``template`` (the template failed: its syntax, its ``raise_exception``, the sandbox), ``memory``
(it needed more than M bytes beyond the renderer's own), ``size`` (its output passed the messages' text by
more than E bytes). The CPU limit is the kernel's (``RLIMIT_CPU``): a template past it is killed with
SIGXCPU, even inside one long C call such as ``99 ** 999999999``.
"""

from __future__ import annotations

import json
import resource
import sys


def _text_bytes(value, depth: int = 0) -> int:
    """The characters of every string in ``value`` (the messages and template variables)."""
    if depth > 64:
        return 0
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_bytes(k, depth + 1) + _text_bytes(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_text_bytes(v, depth + 1) for v in value)
    return 0


def _lower(kind: int, value: int) -> None:
    """Set the soft and hard limit ``kind`` to ``value``, or to the hard limit already set when that is lower
    (a limit can be lowered, never raised)."""
    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value if hard == resource.RLIM_INFINITY else hard))


def _limit(cpu_seconds: float, memory_bytes: int) -> None:
    """CPU time and address space from now on: ``cpu_seconds`` more CPU (SIGXCPU at the soft limit, SIGKILL at
    the hard one) and ``memory_bytes`` more virtual memory than the process holds (limits already set lower stay)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(used.ru_utime + used.ru_stime + cpu_seconds) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    else:
        resource.setrlimit(resource.RLIMIT_CPU, (min(cpu, hard), hard))
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * resource.getpagesize()
    except OSError:  # not Linux: the CPU limit and the parent's clock bound it
        return
    _lower(resource.RLIMIT_AS, size + memory_bytes)


def answer(request: dict) -> dict:
    """Render ``request`` (module docstring) under its limits, in this process: the child's whole work."""
    from transformers.utils.chat_template_utils import render_jinja_template

    _limit(float(request["cpu_seconds"]), int(request["memory_bytes"]))
    args, kwargs = request["args"], request["kwargs"]
    try:
        rendered, indices = render_jinja_template(*args, **kwargs)
        allowed = _text_bytes([args, kwargs]) + int(request["extra_bytes"])
        longest = max((len(r) for r in rendered), default=0)
        if longest > allowed:
            held = allowed - int(request["extra_bytes"])
            return {"kind": "size", "error": f"{longest:,} characters rendered, the messages hold {held:,}"}
        return {"ok": [rendered, indices]}
    except MemoryError:
        return {"kind": "memory", "error": "MemoryError"}
    except RecursionError as e:
        return {"kind": "template", "error": f"RecursionError: {e}"}
    except Exception as e:  # noqa: BLE001 - whatever the template raises is its failure, told in one line
        detail = " ".join(str(e).split())[:300] or type(e).__name__
        return {"kind": "template", "error": f"{type(e).__name__}: {detail}"}


def main() -> None:
    sys.stdout.write(json.dumps(answer(json.loads(sys.stdin.read()))))


if __name__ == "__main__":
    main()
