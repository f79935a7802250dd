"""The environment variables mps_backend reads, parsed one way (README.md, "Configuration", lists them all)."""

from __future__ import annotations

import os

from mps_backend.errors import MPSBackendError


class ConfigError(MPSBackendError, ValueError):
    """An environment variable of mps_backend holds a value it cannot use."""


#: the byte-count variables (README.md, "Configuration") -> whether 0 turns the feature off
BYTE_SETTINGS = {
    "MPS_BACKEND_EMULATOR_MEMO_BYTES": True,
    "MPS_BACKEND_MAX_TENSOR_BYTES": False,
    "MPS_BACKEND_MAX_PLAN_BYTES": False,
    "MPS_BACKEND_VERIFY_MAX_BYTES": False,
}


def env_bytes(name: str, default: int) -> int:
    """``$name`` as a number of bytes (a positive integer, or 0 where :data:`BYTE_SETTINGS` says 0 turns the
    feature off; ``_`` separators allowed), ``default`` when unset or empty; anything else is a
    :class:`ConfigError` naming the variable."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    digits = value.replace("_", "")
    zero = BYTE_SETTINGS.get(name, False)
    if not digits.isascii() or not digits.isdigit() or int(digits) < (0 if zero else 1):
        allowed = "0 (off) or a positive integer" if zero else "a positive integer"
        raise ConfigError(f"${name}={value[:80]!r}: not a number of bytes ({allowed}, e.g. {default})")
    return int(digits)


def check_environment() -> None:
    """Parse every byte-count variable now (:data:`BYTE_SETTINGS`): a bad value is one :class:`ConfigError` before
    any work, not a failure where it is first read (the emulator's memo was read by the export's self-check,
    after the program was written)."""
    for name in BYTE_SETTINGS:
        env_bytes(name, 1)


def env_path(name: str) -> str | None:
    """``$name`` as a path (``~`` expanded), None when unset or empty."""
    value = os.environ.get(name, "").strip()
    return os.path.expanduser(value) if value else None
