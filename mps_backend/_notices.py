"""One logging filter, installed when the package is imported (before executorch is)."""

from __future__ import annotations

import logging


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
