"""Test tooling around ExecuTorch's backend test suite (``executorch.backends.test.suite``).

* :mod:`mps_backend.testing.suite_flow` -- a pytest plugin that adds the ``mps`` and
  ``mps_fp16`` flows to the suite (``pytest -p mps_backend.testing.suite_flow -m flow_mps ...``).
* :mod:`mps_backend.testing.run_suite` -- runs the suite's operator tests for a flow and
  writes ``docs/operator-suite.md``.

Importing this package has no side effects.
"""
