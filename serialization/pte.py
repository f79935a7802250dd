"""Extract delegate blobs (by default the MPS ones) from an ExecuTorch ``.pte`` program.

Uses ExecuTorch's own deserializer (``executorch.exir._serialize._program.deserialize_pte_binary``),
which moves delegate data stored in segments back inline, so both storage forms come out the same.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import MPSFormatError

MPS_BACKEND_ID = "MPSBackend"
#: bytes 4-5 of a .pte: the program flatbuffer's file identifier starts with "ET" ("ET12", ...)
_PTE_IDENTIFIER_PREFIX = b"ET"


@dataclass(frozen=True)
class DelegateBlob:
    """One delegate of a program.

    ``index`` is the delegate's position in program order (execution plans in order, the delegates
    of each plan in order), counting delegates of every backend.
    """

    index: int
    backend_id: str
    blob: bytes
    compile_specs: dict[str, bytes] = field(default_factory=dict)


def _read_bytes(pte: bytes | bytearray | memoryview | str | os.PathLike) -> bytes:
    if isinstance(pte, (str, os.PathLike)):
        with open(pte, "rb") as f:
            return f.read()
    return bytes(pte)


def delegate_blobs(pte: bytes | bytearray | memoryview | str | os.PathLike,
                   backend_id: str | None = MPS_BACKEND_ID) -> list[DelegateBlob]:
    """The processed bytes of every delegate with id ``backend_id`` (None: every delegate).

    Raises MPSFormatError when ``pte`` is not a readable ExecuTorch program.
    """
    data = _read_bytes(pte)
    if len(data) < 8 or data[4:6] != _PTE_IDENTIFIER_PREFIX:
        raise MPSFormatError(f"not an ExecuTorch .pte program: expected a flatbuffer identifier 'ET..' at "
                             f"bytes 4-7, found {data[4:8]!r} ({len(data)} bytes)")
    from executorch.exir._serialize._program import deserialize_pte_binary  # noqa: PLC0415 (heavy import)

    try:
        program = deserialize_pte_binary(data).program
    except Exception as e:  # a third-party parser: any failure on bad input means "not a readable .pte"
        raise MPSFormatError(f"not a readable ExecuTorch .pte program: {type(e).__name__}: {e}") from e
    inline = program.backend_delegate_data or []
    out: list[DelegateBlob] = []
    index = 0
    for plan in program.execution_plan or []:
        for delegate in plan.delegates or []:
            if backend_id is None or delegate.id == backend_id:
                out.append(_delegate_blob(index, delegate, inline))
            index += 1
    return out


def _delegate_blob(index: int, delegate, inline: list) -> DelegateBlob:
    from executorch.exir.schema import DataLocation  # noqa: PLC0415

    ref = delegate.processed
    where = f"delegate {index} ({delegate.id})"
    if ref is None or ref.location != DataLocation.INLINE:  # the deserializer inlines segment data
        raise MPSFormatError(f"{where}: processed data not found ({ref})")
    if not 0 <= ref.index < len(inline) or inline[ref.index].data is None:
        raise MPSFormatError(f"{where}: processed data index {ref.index} out of range "
                             f"({len(inline)} inline entries)")
    specs = {spec.key: bytes(spec.value) for spec in delegate.compile_specs or []}
    return DelegateBlob(index, delegate.id, bytes(inline[ref.index].data), specs)
