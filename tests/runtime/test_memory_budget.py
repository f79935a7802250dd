"""Blobs whose fields ask for huge tensors end in a DeviceError, not in the machine's memory running out.
The cases run in a subprocess under an address-space limit, so a regression fails the case instead of
taking the machine down; ``MPS_BACKEND_MAX_TENSOR_BYTES`` is the device model's per-tensor budget."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

#: each case builds a tiny graph with tests/runtime/helpers.GraphSpec and runs it
CASES = {
    "full 65536x65536 (declared)": """
        o = g.value(DataType.float32, [65536, 65536])
        g.node("MPSFull", input1_id=-1, output_id=o, shape=[65536, 65536], fill_value=1.0, dtype=DataType.float32)
        g.output(o); inputs = []
    """,
    "full 65536x65536 (declared small)": """
        o = g.value(DataType.float32, [1])
        g.node("MPSFull", input1_id=-1, output_id=o, shape=[65536, 65536], fill_value=1.0, dtype=DataType.float32)
        g.output(o); inputs = []
    """,
    "arange to 2**31": """
        o = g.value(DataType.float32, [4])
        g.node("MPSArange", output_id=o, start=0.0, end=2.0**31, step=1.0, dtype=DataType.float32)
        g.output(o); inputs = []
    """,
    "pad 2**31-1": """
        x = g.input(torch.ones(2, 2)); o = g.value(DataType.float32, [2, 2])
        g.node("MPSConstantPadND", input1_id=x, output_id=o, pad=[0, 2**31 - 1], value=0.0)
        g.output(o); inputs = [torch.ones(2, 2)]
    """,
    "max pool padding 2**30": """
        x = g.input(torch.ones(1, 1, 4, 4))
        o1, o2 = g.value(DataType.float32, [1, 1, 2, 2]), g.value(DataType.int32, [1, 1, 2, 2])
        g.node("MPSMaxPool2DWithIndices", input1_id=x, output1_id=o1, output2_id=o2, kernel_height=2, kernel_width=2,
               stride_height=2, stride_width=2, padding_left=2**30, padding_right=0, padding_top=0, padding_bottom=0,
               dilation_height=1, dilation_width=1, ceil_mode=False, count_include_pad=False, divisor_override=0)
        g.output(o1); inputs = [torch.ones(1, 1, 4, 4)]
    """,
    "conv padding 2**20 on both axes": """
        x = g.input(torch.ones(1, 1, 4, 4)); w = g.constant(torch.ones(1, 1, 1, 1)); o = g.value(DataType.float32, [1, 1, 4, 4])
        g.node("MPSConv2D", input1_id=x, input2_id=w, input3_id=-1, output_id=o, stride_x=1, stride_y=1, dilation_x=1,
               dilation_y=1, groups=1, padding_left=2**20, padding_right=0, padding_top=2**20, padding_bottom=0)
        g.output(o); inputs = [torch.ones(1, 1, 4, 4)]
    """,
    "expand 50000x50000 then a unary op": """
        x = g.input(torch.ones(1, 1)); e = g.value(DataType.float32, [1, 1]); o = g.value(DataType.float32, [1, 1])
        g.node("MPSExpand", input1_id=x, output_id=e, num_dims=2, shape=[50000, 50000])
        g.node("MPSExp", input1_id=e, output_id=o)
        g.output(o); inputs = [torch.ones(1, 1)]
    """,
}

#: runs every case, one after the other, in one process under the limit (a process per case spent its
#: time importing torch: 7 x 35 s on a loaded machine); prints one JSON line per case
RUNNER = """
import json, resource, sys, torch
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a regression dies here, not the machine
sys.path.insert(0, {root!r})
from tests.runtime.helpers import GraphSpec
from mps_backend.runtime.core import DeviceError
from mps_backend.runtime.interpreter import Interpreter
from mps_backend.serialization.model import DataType
for name, case in json.loads(sys.stdin.read()).items():
    g = GraphSpec()
    exec(case)
    try:
        Interpreter(g.blob()).run(inputs)
        out = "RAN"
    except DeviceError as e:
        out = f"DEVICE_ERROR {{e}}"
    except Exception as e:  # noqa: BLE001 - reported for this case, the next ones still run
        out = f"{{type(e).__name__}}: {{e}}"
    print(json.dumps([name, out]), flush=True)
"""


@pytest.fixture(scope="module")
def outcomes() -> tuple[dict[str, str], str]:
    """Each case's printed outcome, and the runner's stderr (a crash or the limit ends the process)."""
    root = str(pathlib.Path(__file__).resolve().parents[2])
    cases = {name: textwrap.dedent(code).strip() for name, code in CASES.items()}
    r = subprocess.run(
        [sys.executable, "-c", RUNNER.format(root=root)], input=json.dumps(cases), capture_output=True, text=True, timeout=600
    )
    done = dict(json.loads(line) for line in r.stdout.splitlines() if line.startswith("["))
    return done, f"exit status {r.returncode}: {r.stderr[-2000:]}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_huge_requests_are_device_errors(outcomes, name):
    done, stderr = outcomes
    assert name in done, stderr
    assert done[name].startswith("DEVICE_ERROR"), done[name]
    assert "GiB" in done[name] and "MPS_BACKEND_MAX_TENSOR_BYTES" in done[name]
