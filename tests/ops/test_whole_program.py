"""Issue #15: preprocess never fails on a node the partitioner accepted, on either entry point.

Every row of every ``rows_*.py`` op-table file, in both precisions (whatever ``precisions=`` the row
restricts its numeric checks to), goes through

- the partitioner path: ``EdgeProgramManager.to_backend(MPSPartitioner(use_fp16=...))``, the second
  half of ``to_edge_transform_and_lower``; it must not raise, and every delegate blob must decode;
- the whole-program path of the old scripts: ``executorch.exir.backend.backend_api.to_backend(
  "MPSBackend", edge.exported_program(), [CompileSpec("use_fp16", ...)])`` on the same edge program:
  - partitioner left no operator node on CPU: it must succeed and its blob decode;
  - partitioner left nodes on CPU: it must raise ``LoweringError`` from the up-front check (not a
    lowering that crashed), naming one of those nodes with the partitioner's reason for it.

One edge program per row (``harness.prepared``'s export and decomposition, uncached: lowering with a
partitioner removes lifted constants from the program it was given, so each lowering gets a copy).
Nothing runs past ``to_backend``: no ``to_executorch``, no device model (the op table checks numerics).
One test per row file; a failure lists every failing row with its exception and last frames.
"""

from __future__ import annotations

import copy
import importlib
import pathlib
import traceback

import pytest
from executorch.exir.backend.backend_api import to_backend

from mps_backend import MPSPartitioner
from mps_backend.backend import LoweringBug, LoweringError
from mps_backend.compile_specs import fp16_spec
from mps_backend.export import _delegate_blobs
from mps_backend.serialization import read_blob

from . import harness

_FILES = sorted(p.stem for p in pathlib.Path(__file__).parent.glob("rows_*.py"))


def _describe(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)[-3:]
    where = " <- ".join(f"{pathlib.Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    text = f"{type(e).__name__}: {e}"
    if e.__cause__ is not None:
        text += f" (from {_describe(e.__cause__)})"
    return f"{text} [{where}]"


def check_row(r: harness.Row) -> list[str]:
    """The row's problems on both entry points, both precisions (empty: none)."""
    _, _, em = harness.prepared.__wrapped__(r)
    problems = []
    for precision in harness.PRECISIONS:
        case = f"{r.id}-{precision}"
        fp16 = precision == "fp16"
        part = MPSPartitioner(use_fp16=fp16)
        try:
            blobs = _delegate_blobs(copy.deepcopy(em).to_backend({"forward": part}))
            for blob in blobs:
                read_blob(blob)
        except Exception as e:  # noqa: BLE001  (reported with the row; the whole program is still tried)
            problems.append(f"{case}: partitioner path raised {_describe(e)}")
        on_cpu = part.report().on_cpu  # partition() reports before any preprocess runs
        try:
            lowered = to_backend("MPSBackend", em.exported_program(), [fp16_spec(fp16)])
            read_blob(lowered.processed_bytes)
        except LoweringError as e:
            msg = str(e)
            if not on_cpu:
                problems.append(f"{case}: fully delegated by the partitioner, whole program raised {_describe(e)}")
            elif isinstance(e, LoweringBug):
                problems.append(
                    f"{case}: whole program: a lowering crashed instead of the support check refusing "
                    f"{[c.name for c in on_cpu]}: {_describe(e)}"
                )
            elif not any(f"{c.name} (" in msg and c.reason in msg for c in on_cpu):
                problems.append(
                    f"{case}: whole program: the error names none of the CPU nodes with its reason "
                    f"{[(c.name, c.reason) for c in on_cpu]}: {msg}"
                )
        except Exception as e:  # noqa: BLE001  (reported with the row)
            problems.append(
                f"{case}: whole program raised {_describe(e)}"
                + (f" (partitioner left on CPU: {[c.name for c in on_cpu]})" if on_cpu else "")
            )
        else:
            if on_cpu:
                problems.append(
                    f"{case}: whole program lowered nodes the partitioner left on CPU: {[(c.name, c.reason) for c in on_cpu]}"
                )
    return problems


@pytest.mark.parametrize("rows_file", _FILES)
def test_whole_program_and_partitioner_paths(rows_file):
    rows = importlib.import_module(f"{__package__}.{rows_file}").ROWS
    problems = [p for r in rows for p in check_row(r)]
    assert not problems, f"{len(problems)} of {2 * len(rows)} cases fail:\n" + "\n".join(problems)
