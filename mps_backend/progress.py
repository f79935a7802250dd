"""Progress display for long command-line work: a live bar per stage on a terminal (tqdm), one
summary line per stage everywhere (``[name] done in 12.3s``), on standard error."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import IO, Any, Iterator


class Progress:
    """Stages of one long job. ``enabled=False`` prints nothing (the Python API's default)."""

    def __init__(self, enabled: bool = True, stream: IO[str] | None = None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.seconds: dict[str, float] = {}

    @property
    def live(self) -> bool:
        """Whether live bars are drawn (a terminal); otherwise only the summary lines."""
        return self.enabled and hasattr(self.stream, "isatty") and self.stream.isatty()

    def say(self, message: str) -> None:
        if self.enabled:
            print(message, file=self.stream, flush=True)

    @contextmanager
    def stage(self, name: str, *, ticker: bool = True) -> Iterator[None]:
        """A stage: a ticking elapsed-time bar while it runs (``ticker=False`` when the stage draws a
        determinate bar of its own, :meth:`bytes_bar`), then its summary line."""
        t0 = time.perf_counter()
        stop = threading.Event()
        thread = None
        if ticker and self.live:
            from tqdm import tqdm  # noqa: PLC0415

            bar = tqdm(desc=f"[{name}]", total=None, file=self.stream, leave=False, bar_format="{desc} {elapsed}")

            def tick() -> None:
                while not stop.wait(0.5):
                    bar.refresh()

            thread = threading.Thread(target=tick, daemon=True)
            thread.start()
        elif not self.live:
            self.say(f"[{name}] ...")
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join()
                bar.close()
            self.seconds[name] = time.perf_counter() - t0
        self.say(f"[{name}] done in {self.seconds[name]:.1f}s")

    def bytes_bar(self, name: str, total: int) -> Any:
        """A determinate bar in bytes (``update(n)``; ``close()``), or a no-op object."""
        if not self.live:
            return _NoBar()
        from tqdm import tqdm  # noqa: PLC0415

        return tqdm(
            desc=f"[{name}]", total=total or None, unit="B", unit_scale=True, unit_divisor=1024, file=self.stream, leave=False
        )


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class CountingWriter:
    """A binary file wrapper that reports each write's size to a bar."""

    def __init__(self, f: IO[bytes], bar: Any):
        self.f, self.bar, self.written = f, bar, 0

    def write(self, data: Any) -> int:
        n = self.f.write(data)
        self.written += len(data)
        self.bar.update(len(data))
        return n

    def flush(self) -> None:
        self.f.flush()
