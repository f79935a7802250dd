"""Issue #15: preprocess never fails on a node the partitioner accepted, on either entry point.

Every row of the op table (``test_op_table.ROWS``), in both precisions (whatever ``precisions=`` the row
restricts its numeric checks to), one test each (id ``<target>-<case>-<precision>``), goes through

- the partitioner path: ``EdgeProgramManager.to_backend(MPSPartitioner(use_fp16=...))``, the second
  half of ``to_edge_transform_and_lower``; it must not raise, and every delegate blob must decode;
- the whole-program path of the old scripts: ``executorch.exir.backend.backend_api.to_backend(
  "MPSBackend", edge.exported_program(), [CompileSpec("use_fp16", ...)])`` on the same edge program:
  - partitioner left no operator node on CPU: it must succeed and its blob decode;
  - partitioner left nodes on CPU: it must raise ``LoweringError`` from the up-front check (not a
    lowering that crashed), naming one of those nodes with the partitioner's reason for it.

The edge program and the partitioner lowering are the op table's own (``harness.prepared`` and
``harness.lower``, cached per process; tests/ops/conftest.py runs a row's tests one after the other):
each row costs one export and one partitioner lowering per precision, plus the whole-program lowering
(on a copy of the edge program, which stays shared). Nothing runs past ``to_backend``: no
``to_executorch``, no device model (the op table checks numerics).
"""

from __future__ import annotations

import copy
import pathlib
import traceback

import pytest
from executorch.exir.backend.backend_api import to_backend

from mps_backend.backend import LoweringBug, LoweringError
from mps_backend.compile_specs import fp16_spec
from mps_backend.serialization import read_blob

from . import harness
from .test_op_table import ROWS


def _describe(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)[-3:]
    where = " <- ".join(f"{pathlib.Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    text = f"{type(e).__name__}: {e}"
    if e.__cause__ is not None:
        text += f" (from {_describe(e.__cause__)})"
    return f"{text} [{where}]"


@pytest.mark.parametrize(("row", "precision"), [pytest.param(r, p, id=f"{r.id}-{p}") for r in ROWS for p in harness.PRECISIONS])
def test_whole_program_and_partitioner_paths(row, precision):
    fp16 = precision == "fp16"
    try:
        low = harness.lower(row, precision)
        for blob in low.blobs:
            read_blob(blob)
    except Exception as e:  # noqa: BLE001  (reported with its last frames)
        pytest.fail(f"partitioner path raised {_describe(e)}")
    on_cpu = low.partitioner.report().on_cpu  # partition() reports before any preprocess runs
    _, _, em = harness.prepared(row)
    try:
        lowered = to_backend("MPSBackend", copy.deepcopy(em.exported_program()), [fp16_spec(fp16)])
        read_blob(lowered.processed_bytes)
    except LoweringError as e:
        msg = str(e)
        assert on_cpu, f"fully delegated by the partitioner, whole program raised {_describe(e)}"
        assert not isinstance(e, LoweringBug), (
            f"whole program: a lowering crashed instead of the support check refusing {[c.name for c in on_cpu]}: {_describe(e)}"
        )
        assert any(f"{c.name} (" in msg and c.reason in msg for c in on_cpu), (
            f"whole program: the error names none of the CPU nodes with its reason {[(c.name, c.reason) for c in on_cpu]}: {msg}"
        )
    except Exception as e:  # noqa: BLE001  (reported with its last frames)
        pytest.fail(
            f"whole program raised {_describe(e)}" + (f" (partitioner left on CPU: {[c.name for c in on_cpu]})" if on_cpu else "")
        )
    else:
        assert not on_cpu, f"whole program lowered nodes the partitioner left on CPU: {[(c.name, c.reason) for c in on_cpu]}"
