"""Tooling around the lowering pipeline (``mps_backend``'s top-level modules: partitioner, graph
passes, builder, backend, simplify, and ``mps_backend.operators`` / ``mps_backend.serialization``).
Nothing here is imported by the pipeline.

* :mod:`~mps_backend.tools.cli` -- the ``mps-backend`` command line.
* :mod:`~mps_backend.tools.models` -- ``--model`` specs (torchvision:, executorch:, file.py:factory, ...);
  :mod:`~mps_backend.tools.demo` -- the built-in demo model.
* :mod:`~mps_backend.tools.legacy` -- PyTorch Mobile flatbuffer (``.ff``/``.ptl``) import.
* :mod:`~mps_backend.tools.debug` -- the float16-vs-float32 gap table (``mps-backend debug``).

The test and measurement harnesses (model zoo, operator-suite flow and runner, ``.pte`` fuzzer) are not part
of the installed package: they are ``harness/`` of the source checkout.

Importing this package has no side effects.
"""
