"""Export a model to an MPS .pte with the plain ExecuTorch API, the way an export script does it.

    python examples/export_to_backend.py --model torchvision:resnet18 --out resnet18_mps.pte
    python examples/export_to_backend.py --model executorch:llama-kv --fp32

Steps: torch.export -> to_edge -> to_backend(MPSPartitioner()) -> to_executorch, then the partitioner's
report (every node left on CPU, with the reason) and a check of the .pte on the emulated MPS runtime
against eager PyTorch. ``--model`` takes the specs of ``mps-backend export`` (demo, torchvision:NAME,
executorch:NAME, torch:transformer_encoder, path/to/file.py:factory).
"""

from __future__ import annotations

import argparse
import sys

import torch
from executorch.exir import to_edge

from mps_backend import MPSPartitioner
from mps_backend.export import drop_unused_constants, verify
from mps_backend.tools.models import load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--fp32", action="store_true", help="compute in float32 on the device (default float16)")
    parser.add_argument("--out", default=None, help="where to write the .pte")
    args = parser.parse_args(argv)

    model, inputs = load(args.model)
    model.eval()
    with torch.no_grad():  # an inference export (models that update buffers in place need it)
        ep = drop_unused_constants(torch.export.export(model, tuple(inputs), strict=False))
        partitioner = MPSPartitioner(use_fp16=not args.fp32)
        edge = to_edge(ep).to_backend(partitioner)
        pte = edge.to_executorch().buffer
    report = partitioner.report()
    print(report)
    if args.out:
        with open(args.out, "wb") as f:
            f.write(pte)
        print(f"wrote {args.out} ({len(pte):,} bytes)")

    check = verify(pte, model, inputs, use_fp16=not args.fp32)  # device model vs eager PyTorch
    print(f"device model vs eager: {check}")
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
