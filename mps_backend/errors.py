"""The roots of every exception and warning mps_backend raises.

``except MPSBackendError`` catches any of the project's errors; each class keeps the builtin base it had
(``CheckpointError`` is still a ``ValueError``, ``LoweringError`` a ``RuntimeError``), so code catching
those keeps working. :class:`InternalError` marks a bug of this project (never the input's fault); every
other ``MPSBackendError`` says what is wrong with the model, the program file or the request.
``warnings.filterwarnings("ignore", category=MPSBackendWarning)`` silences all of the project's warnings.

This module imports nothing: every layer (serialization, the lowering, the device model, the CLI) may use it.
"""

from __future__ import annotations


class MPSBackendError(Exception):
    """Base of every exception mps_backend raises on purpose."""


class InternalError(MPSBackendError):
    """A bug of mps_backend (a check passed that its lowering contradicts, ...): please report it."""


class CheckpointError(MPSBackendError, ValueError):
    """A checkpoint cannot be exported as asked (missing file, unsupported model, float16 overflow, a request
    the export cannot honour): one line naming the file or the option and the reason."""


class MPSBackendWarning(UserWarning):
    """Base of every warning mps_backend emits."""


__all__ = ["CheckpointError", "InternalError", "MPSBackendError", "MPSBackendWarning"]
