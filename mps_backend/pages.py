"""Weights mapped from files, and handing their pages back once the delegate blob holds a copy.

A language model exported in the precision its checkpoint stores does not need its weights read
into memory before lowering: :func:`map_copy_on_write` maps the checkpoint and each weight is a tensor over
its part of the mapping (copy-on-write: writing to such a tensor changes this process's copy, never
the file). Its pages are read when the blob writer copies them, and :class:`PageReleaser` then gives
them back to the kernel (``madvise(MADV_PAGEOUT)``), so at no point are all the weights resident next
to the finished blob: the peak is about the blob plus the process, not twice the weights.

``MADV_PAGEOUT`` never loses data: the kernel drops clean file pages (read again from the file on the
next access) and leaves a page this process has written (anonymous memory, no swap) or swaps it out.
The releaser only advises ranges that lie inside a file-backed mapping (``/proc/self/maps``), so
ordinary tensors, e.g. weights a user built in memory, are never touched. Elsewhere than on Linux 5.4+
(no ``/proc/self/maps`` or no ``MADV_PAGEOUT``) releasing does nothing.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import math
import mmap
import os
import sys
import tempfile
import warnings
from typing import Any

import torch

from mps_backend.errors import MPSBackendError

PAGE = mmap.PAGESIZE
#: Linux's MADV_PAGEOUT (uapi asm-generic/mman-common.h; Python's mmap module names it only when built
#: against 5.4+ headers), None elsewhere
_PAGEOUT: int | None = getattr(mmap, "MADV_PAGEOUT", 21) if sys.platform.startswith("linux") else None


def map_copy_on_write(path: str | os.PathLike) -> mmap.mmap:
    """The whole file mapped copy-on-write (``MAP_PRIVATE``, readable and writable)."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)


def mapped_tensor(mapping: mmap.mmap, offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor | None:
    """A tensor over ``mapping[offset:]`` (no copy; it keeps the mapping alive), or None when the
    bytes are not aligned for ``dtype`` or the tensor is empty (the caller reads those instead)."""
    numel = math.prod(int(d) for d in shape)
    if numel == 0 or offset % dtype.itemsize:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about buffers it cannot tell are writable
        t = torch.frombuffer(mapping, dtype=dtype, count=numel, offset=offset)
    return t.view(shape)


def _file_backed_ranges() -> list[tuple[int, int]]:
    """Sorted (start, end) address ranges of this process's mappings of files."""
    ranges = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                # address perms offset dev inode [path]: an inode other than 0 is a file
                if len(parts) >= 6 and parts[4] != "0" and parts[5].startswith("/"):
                    lo, hi = parts[0].split("-")
                    ranges.append((int(lo, 16), int(hi, 16)))
    except OSError:
        return []
    ranges.sort()
    return ranges


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """(first, end) address of the bytes a strided tensor reads."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 1)
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


class PageReleaser:
    """Hands a tensor's pages back to the kernel when they are pages of a file mapping.

    One per blob being written (the mappings are read once, on the first release); ``released`` counts
    the bytes advised."""

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int]] | None = None
        self._madvise: Any = None
        self._trim: Any = None
        self.released = 0

    def _in_file_mapping(self, lo: int, hi: int) -> bool:
        if self._ranges is None:
            self._ranges = _file_backed_ranges()
        i = bisect.bisect_right(self._ranges, (lo, float("inf"))) - 1
        return i >= 0 and self._ranges[i][0] <= lo and hi <= self._ranges[i][1]

    def release(self, t: Any) -> int:
        """Advise the kernel to reclaim ``t``'s pages if they belong to a file mapping; the bytes
        advised (0 when nothing was done). The tensor stays valid: its pages are read again if used."""
        if _PAGEOUT is None or not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return 0
        try:
            lo, hi = byte_span(t)
        except RuntimeError:  # a tensor without storage whose data pointer torch refuses to give
            return 0
        if hi - lo < PAGE or not self._in_file_mapping(lo, hi):
            return 0
        start = lo - lo % PAGE  # the pages the bytes touch (neighbours' bytes on them are refetched too)
        end = -(-hi // PAGE) * PAGE
        if self._madvise is None:
            libc = ctypes.CDLL(None, use_errno=True)
            self._madvise = libc.madvise
            self._madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            self._madvise.restype = ctypes.c_int
        if self._madvise(start, end - start, _PAGEOUT) != 0:
            return 0  # an older kernel without MADV_PAGEOUT (EINVAL): keep the pages
        self.released += end - start
        return end - start

    def trim(self) -> None:
        """Hand the memory the C allocator keeps after frees back to the kernel (glibc's
        ``malloc_trim(0)``, which also returns free pages inside its heaps; nothing elsewhere).

        Needed between large tensors made and freed one after another (a weight converted or quantized a
        block at a time, a packed weight once copied into the blob): glibc serves allocations up to
        32 MiB from heaps that it does not shrink on ``free``, so without this each freed block's
        pages stay resident and add up to gigabytes over a model."""
        if self._trim is None:
            libc = ctypes.CDLL(None)
            self._trim = getattr(libc, "malloc_trim", False) if sys.platform.startswith("linux") else False
            if self._trim:
                self._trim.argtypes = (ctypes.c_size_t,)
                self._trim.restype = ctypes.c_int
        if self._trim:
            self._trim(0)


class DiskFullError(MPSBackendError, OSError):
    """The disk a scratch file goes to is full (ENOSPC, EDQUOT): one line naming the folder."""


_FULL = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(folder: Any, e: OSError) -> DiskFullError:
    err = DiskFullError(
        f"the disk of {os.path.abspath(folder)} is full ({e.strerror or e}) while the export wrote its scratch data "
        "(converted and quantized weights, beside the output): free space there, or write the .pte to another disk"
    )
    err.errno = e.errno
    return err


class ScratchFile:
    """A tensor written to a scratch file piece by piece, then mapped back (:meth:`mapped`) instead of
    held in anonymous memory: its pages are read when used and :class:`PageReleaser` can hand them
    back. The file is unlinked once mapped (the mapping keeps its data; the disk space is freed when
    the last tensor over it goes), so nothing is left in ``folder`` after an error either, beyond a
    file being written when the process was killed."""

    def __init__(self, folder: str | os.PathLike, name: str) -> None:
        try:
            fd, self.path = tempfile.mkstemp(prefix=f"{name[:80]}.", suffix=".bin", dir=folder)
        except OSError as e:
            raise (_disk_full(folder, e) if e.errno in _FULL else e) from None
        self.folder = folder
        self._file = os.fdopen(fd, "wb")
        self.nbytes = 0

    def append(self, t: torch.Tensor) -> None:
        """Write ``t``'s bytes (row-major) after what was written so far."""
        data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        try:
            self._file.write(memoryview(data))
        except BaseException as e:
            self.discard()
            if isinstance(e, OSError) and e.errno in _FULL:
                raise _disk_full(self.folder, e) from None
            raise
        self.nbytes += data.nbytes

    def mapped(self, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        """The bytes written, as a ``dtype`` tensor of ``shape`` over a copy-on-write (private) mapping of
        the file."""
        try:
            try:
                self._file.close()  # flushes: a full disk may show only here
            except OSError as e:
                raise (_disk_full(self.folder, e) if e.errno in _FULL else e) from None
            numel = math.prod(int(d) for d in shape)
            if numel * dtype.itemsize != self.nbytes:
                need = numel * dtype.itemsize
                raise ValueError(f"{self.path}: {self.nbytes} bytes written, a {dtype}{list(shape)} tensor needs {need}")
            if not numel:
                return torch.empty(shape, dtype=dtype)
            # torch's own private mapping: unlike Python's mmap it keeps no file descriptor open (a
            # model's ~1000 scratch tensors would exceed a 1024 or macOS's 256 descriptor limit)
            return torch.from_file(self.path, shared=False, size=numel, dtype=dtype).view(shape)
        finally:
            self.discard()

    def discard(self) -> None:
        try:
            self._file.close()
        except OSError:  # its buffered bytes could not be written (a full disk): they are not wanted
            pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def untouched_zeros(shape: tuple[int, ...] | list[int], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor over a fresh anonymous mapping: the kernel supplies its zero pages when first
    written, so until then it takes no memory (``torch.zeros`` writes every byte). For large buffers
    whose zeros are never all written at export time, e.g. a language model's KV caches (their initial
    contents are not serialized)."""
    numel = math.prod(int(d) for d in shape)
    if numel == 0:
        return torch.zeros(shape, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.frombuffer(mmap.mmap(-1, numel * dtype.itemsize), dtype=dtype, count=numel).view(tuple(shape))
