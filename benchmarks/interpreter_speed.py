"""Device-model interpreter time on the demo model vs eager PyTorch, measured in the same run.

Target (issue: device model): interpreter within 3x of eager. Prints the ratio; exits 1 above it.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from mps_backend.export import export_model
from mps_backend.runtime.interpreter import Interpreter
from mps_backend.serialization.pte import delegate_blobs
from mps_backend.tools.demo import demo_model

TARGET = 3.0


def best_of(fn, repeat: int = 30) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(sorted(times)[: max(3, repeat // 3)])


def main() -> int:
    torch.set_num_threads(1)
    model, inputs = demo_model()
    worst = 0.0
    for use_fp16 in (False, True):
        pte = export_model(model, inputs, use_fp16=use_fp16).pte
        interp = Interpreter(delegate_blobs(pte)[0].blob)
        with torch.no_grad():
            eager = best_of(lambda: model(*inputs))
        device = best_of(lambda interp=interp: interp.run(list(inputs)))
        ratio = device / eager
        worst = max(worst, ratio)
        print(
            f"demo {'fp16' if use_fp16 else 'fp32'}: eager {eager * 1e3:.3f} ms, interpreter "
            f"{device * 1e3:.3f} ms, ratio {ratio:.2f}x (target <= {TARGET}x)"
        )
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
