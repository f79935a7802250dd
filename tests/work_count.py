"""Deterministic work measurement for tests: the number of Python and C function calls made while a
block runs (``sys.setprofile``). Unlike a clock it does not depend on machine load, so a test can
bound the work an input causes (linear in its size, constant per node) without timing anything."""

from __future__ import annotations

import sys


class CallCount:
    """``with CallCount() as c: ...`` then ``c.calls``: function calls made on this thread inside the block."""

    def __init__(self) -> None:
        self.calls = 0
        self._previous = None

    def _profile(self, frame, event, arg) -> None:  # noqa: ARG002 - sys.setprofile signature
        if event == "call" or event == "c_call":
            self.calls += 1

    def __enter__(self) -> "CallCount":
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(self._previous)
