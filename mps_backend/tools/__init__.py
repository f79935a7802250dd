"""Tooling around the lowering pipeline (``mps_backend``'s top-level modules: partitioner, graph
passes, builder, backend, simplify, and ``mps_backend.operators`` / ``mps_backend.serialization``).
Nothing here is imported by the pipeline.

* :mod:`~mps_backend.tools.cli` -- the ``mps-backend`` command line.
* :mod:`~mps_backend.tools.models` -- ``--model`` specs (torchvision:, executorch:, file.py:factory, ...);
  :mod:`~mps_backend.tools.demo` -- the built-in demo model.
* :mod:`~mps_backend.tools.zoo` -- the model zoo (``python -m mps_backend.tools.zoo``, ``make zoo``).
* :mod:`~mps_backend.tools.legacy` -- PyTorch Mobile flatbuffer (``.ff``/``.ptl``) import.
* :mod:`~mps_backend.tools.debug` -- the float16-vs-float32 gap table (``mps-backend debug``).
* :mod:`~mps_backend.tools.suite_flow` -- a pytest plugin that adds the ``mps`` and ``mps_fp16`` flows to
  ExecuTorch's backend test suite (``pytest -p mps_backend.tools.suite_flow -m flow_mps ...``);
  :mod:`~mps_backend.tools.run_suite` runs the suite's operator tests for a flow and writes
  ``docs/operator-suite.md``.
* :mod:`~mps_backend.tools.fuzz_pte` -- the ``.pte`` fuzz campaign (``make fuzz``).

Importing this package has no side effects.
"""
