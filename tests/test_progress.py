"""Progress display: summary lines everywhere, live bars on a terminal only."""

from __future__ import annotations

import io
import time

from mps_backend.progress import CountingWriter, Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_stream_gets_one_line_per_stage_event():
    out = io.StringIO()
    prog = Progress(stream=out)
    with prog.stage("lower"):
        pass
    assert out.getvalue().splitlines() == ["[lower] ...", f"[lower] done in {prog.seconds['lower']:.1f}s"]
    bar = prog.bytes_bar("write", 10)
    bar.update(10)  # a no-op bar off a terminal
    bar.close()


def test_terminal_gets_a_live_ticker_and_a_bytes_bar():
    out = _Terminal()
    prog = Progress(stream=out)
    with prog.stage("export"):
        time.sleep(0.7)  # the ticker refreshes every 0.5 s
    assert "[export]" in out.getvalue() and out.getvalue().rstrip().endswith("s")
    assert "[export] ..." not in out.getvalue()
    sink = io.BytesIO()
    bar = prog.bytes_bar("write", 4)
    writer = CountingWriter(sink, bar)
    writer.write(b"abcd")
    bar.close()
    assert writer.written == 4 and sink.getvalue() == b"abcd" and "[write]" in out.getvalue()


def test_disabled_prints_nothing():
    out = io.StringIO()
    with Progress(enabled=False, stream=out).stage("x"):
        pass
    assert out.getvalue() == ""
