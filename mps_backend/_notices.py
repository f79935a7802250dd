"""Upstream log records the package keeps out of its output: one logging filter installed when the package
is imported (before executorch is), and one installed only while a language-model export runs
(:func:`quiet_reraised_failures`)."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


class TorchaoEnumNotice(logging.Filter):
    """Drops one upstream notice: torchao 0.18 registers its ``KernelPreference`` enum as a pytree
    constant, which torch 2.14 logs as deprecated on every import of executorch (so every
    ``mps-backend`` command and every ``import mps_backend`` printed it). Only that record is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        arg = record.args[0] if isinstance(record.args, tuple) and record.args else None
        return not (
            "is an Enum subclass and is now natively supported" in str(record.msg)
            and getattr(arg, "__module__", "").startswith("torchao.")
        )


logging.getLogger("torch.utils._pytree").addFilter(TorchaoEnumNotice())


#: torch's loggers that print an exception's traceback right before raising it on: fake tensors
#: (``log.exception("failed while attempting to run meta for ...")``, then ``raise``)
RERAISING_LOGGERS = ("torch._subclasses.fake_tensor",)


class ReraisedFailure(logging.Filter):
    """Drops a record that carries an exception (``log.exception``): from the loggers of
    :data:`RERAISING_LOGGERS` that exception reaches the caller, who reports it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None


@contextlib.contextmanager
def quiet_reraised_failures() -> Iterator[None]:
    """While the block runs, torch's tracebacks of an exception it raises anyway are not printed (a model
    an export refuses is one line, the refusal); the filter is removed when the block ends, also on error."""
    loggers, dropped = [logging.getLogger(name) for name in RERAISING_LOGGERS], ReraisedFailure()
    for logger in loggers:
        logger.addFilter(dropped)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(dropped)
