"""Test and measurement harnesses of a source checkout, outside the installed package (pyproject.toml does not
install ``harness``): they drive the product, the product never imports them.

* :mod:`harness.zoo` -- the model zoo (``python -m harness.zoo``, ``make zoo``, ``mps-backend zoo`` in a checkout).
* :mod:`harness.suite_flow` -- a pytest plugin that adds the ``mps`` and ``mps_fp16`` flows to ExecuTorch's
  backend test suite (``pytest -p harness.suite_flow -m flow_mps ...``); :mod:`harness.run_suite` runs the
  suite's operator tests for a flow and writes ``docs/operator-suite.md``.
* :mod:`harness.fuzz_pte` -- the ``.pte`` fuzz campaign (``make fuzz``).
* :mod:`harness.fuzz_checkpoint` -- the ``hf:`` checkpoint-folder fuzz campaign (``make fuzz-checkpoint``), and
  :mod:`harness.fuzz_inputs` its other input kinds (GGUF files, chat templates, processor configs, images);
  :mod:`harness.gguf_files` writes the GGUF files byte by byte.

Run them from the checkout's root (``python -m harness.NAME``); the tests import them (pytest's
``pythonpath`` setting puts the root on ``sys.path``). Importing this package has no side effects.
"""

from __future__ import annotations

import os
from pathlib import Path

#: the source checkout holding this folder
ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child ``python -m harness.NAME``: this one, the checkout first on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)
