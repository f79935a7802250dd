"""Errors of the serialization layer."""

from mps_backend.errors import MPSBackendError


class MPSFormatError(MPSBackendError, ValueError):
    """A blob (or .pte) violates the MP00 format contract; the message names what and where."""
