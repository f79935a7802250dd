"""Extract delegate blobs (by default the MPS ones) from an ExecuTorch ``.pte`` program.

Reads the program with the project's bounded reader (``program.py``), so both storage forms of a
delegate payload (inline in the program, or in a segment after it) come out the same, and a file opened
with :func:`map_file` is read only where its tables and the payloads asked for are.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field

from .errors import MPSFormatError
from .program import delegates, open_program

MPS_BACKEND_ID = "MPSBackend"


@dataclass(frozen=True)
class DelegateBlob:
    """One delegate of a program.

    ``index`` is the delegate's position in program order (execution plans in order, the delegates
    of each plan in order), counting delegates of every backend. ``blob`` is ``bytes``, or with
    ``copy=False`` a ``memoryview`` into the program's buffer.
    """

    index: int
    backend_id: str
    blob: bytes | memoryview
    compile_specs: dict[str, bytes] = field(default_factory=dict)


def map_file(path: str | os.PathLike) -> memoryview:
    """A read-only memory map of ``path``: its pages are read from disk when touched, not up front."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def delegate_blobs(
    pte: bytes | bytearray | memoryview | str | os.PathLike, backend_id: str | None = MPS_BACKEND_ID, *, copy: bool = True
) -> list[DelegateBlob]:
    """The processed bytes of every delegate with id ``backend_id`` (None: every delegate); a path is
    memory-mapped. ``copy=False``: the blobs are views into ``pte`` (no copy of multi-GB payloads).

    Raises MPSFormatError when ``pte`` is not a readable ExecuTorch program.
    """
    data = map_file(pte) if isinstance(pte, (str, os.PathLike)) else pte
    tables = open_program(data, MPSFormatError)
    return [
        DelegateBlob(d.index, d.backend_id, bytes(d.payload) if copy else d.payload, d.compile_specs)
        for d in delegates(tables, MPSFormatError)
        if backend_id is None or d.backend_id == backend_id
    ]
