"""Where a tensor's memory comes from, read from /proc/self (Linux): the mapped file, and how much of
its mapping is resident."""

from __future__ import annotations

import torch


def _mapping_of(t: torch.Tensor) -> list[str]:
    """The /proc/self/maps fields of the mapping holding ``t``'s first byte."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= t.data_ptr() < hi:
                return parts
    raise AssertionError("no mapping holds the tensor")


def mapped_from(t: torch.Tensor) -> str | None:
    """The file a tensor's memory is mapped from, None for ordinary memory."""
    parts = _mapping_of(t)
    return parts[5].strip() if len(parts) == 6 and parts[4] != "0" else None


def resident_bytes(t: torch.Tensor) -> int:
    """Resident bytes of the whole mapping holding ``t`` (its ``Rss:`` line in /proc/self/smaps)."""
    start = _mapping_of(t)[0].split("-")[0]
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = head.split("-")[0] == start
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError("no Rss line for the mapping")
