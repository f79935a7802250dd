"""What executorch's C++ runners print, kept off standard output (#47).

``TextLLMRunner.generate`` and ``MultimodalRunner.generate`` print every token piece to the process's standard
output themselves (``safe_printf`` in their token callback), then a ``PyTorchObserver {json}`` stats line; the
pieces also reach the Python callback, and ``mps-backend generate`` prints the answer from those. Standard
output held the answer twice with the stats line between. :func:`quiet_stdout` sends file descriptor 1 to a
temporary file for the duration of the call; the stats line is passed on to standard error (where the python
runner writes its own), the printed pieces are dropped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
from typing import Iterator

#: the prefix of the stats line executorch's runners print (extension/llm/runner/stats.h)
STATS_PREFIX = "PyTorchObserver "


def _flush_c_stdio() -> None:
    """``fflush(NULL)``: what the C library holds for standard output is written before the descriptor moves."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Standard output (the descriptor, so C and C++ writes too) into a temporary file while the block runs;
    the runner's stats line is then written to standard error."""
    sys.stdout.flush()
    _flush_c_stdio()
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(1)
        os.dup2(captured.fileno(), 1)
        try:
            yield
        finally:
            _flush_c_stdio()
            os.dup2(saved, 1)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if line.startswith(STATS_PREFIX):
                    sys.stderr.write(line + "\n")
