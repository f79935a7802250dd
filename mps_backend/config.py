"""The environment variables mps_backend reads, parsed one way (README.md, "Configuration", lists them all)."""

from __future__ import annotations

import os

from mps_backend.errors import MPSBackendError


class ConfigError(MPSBackendError, ValueError):
    """An environment variable of mps_backend holds a value it cannot use."""


def env_bytes(name: str, default: int) -> int:
    """``$name`` as a number of bytes (a positive integer; ``_`` separators allowed), ``default`` when unset
    or empty; anything else is a :class:`ConfigError` naming the variable."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    digits = value.replace("_", "")
    if not digits.isdigit() or int(digits) <= 0:
        raise ConfigError(f"${name}={value!r}: not a number of bytes (a positive integer, e.g. {default})")
    return int(digits)


def env_path(name: str) -> str | None:
    """``$name`` as a path (``~`` expanded), None when unset or empty."""
    value = os.environ.get(name, "").strip()
    return os.path.expanduser(value) if value else None
