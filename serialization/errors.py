"""Errors of the serialization layer."""


class MPSFormatError(ValueError):
    """A blob (or .pte) violates the MP00 format contract; the message names what and where."""
