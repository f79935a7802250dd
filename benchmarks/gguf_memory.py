"""Memory of loading a GGUF file (``gguf:FILE``, #35 item 1): a synthetic Llama-3-shaped GGUF written with
``gguf.GGUFWriter`` (Q8_0 blocks of random int8 values with one float16 scale; dim 2048, 8 layers, 32/8
heads, hidden 8192, vocabulary 128256, untied head: 1.02 B parameters, 1.01 GiB; nothing downloaded),
loaded in float16 by each loader in a fresh process, its peak RSS taken from ``os.wait4``:

- transformers' own ``from_pretrained(folder, gguf_file=..., dtype=float16)`` (the yardstick, measured in
  the same run): it dequantizes every tensor to float32 with numpy and keeps the whole model in float16
  in anonymous memory;
- mps_backend's ``load_checkpoint("gguf:FILE", "fp16", scratch=...)``, as ``export_llm --quantize`` loads:
  tensor by tensor, a block of rows at a time, into scratch files mapped back;
- the same with ``keep_quantized=True``, as ``export_llm`` loads without ``--quantize`` (#43): the Q8_0 blocks
  kept as int8 groups.

Target: mps_backend's peaks <= 0.5x transformers'. ``--layers N`` changes the depth (``--layers 2`` checks
the script in a minute). Disk: the file and the float16 scratch files (~3 GiB), removed at the end.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).parent
SHAPE = dict(dim=2048, heads=32, kv_heads=8, hidden=8192, vocab=128256)


def write_gguf(path: pathlib.Path, layers: int) -> int:
    """A Llama-3-shaped GGUF of Q8_0 tensors (F32 norms) at ``path``; returns its parameter count."""
    import gguf
    import numpy as np

    from tests.llm_helpers import write_llama_gguf

    rng = np.random.default_rng(0)
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]
    scale = np.frombuffer(np.float16(0.02).tobytes(), dtype=np.uint8)

    def tensor(name: str, shape: tuple):
        if len(shape) == 1:
            return np.ones(shape, dtype=np.float32), None
        rows, cols = shape
        data = rng.integers(-127, 128, size=(rows, cols // block, size), dtype=np.int8).view(np.uint8)
        data[:, :, :2] = scale  # each block: a float16 scale, then 32 int8 values
        return data.reshape(rows, -1), gguf.GGMLQuantizationType.Q8_0

    return write_llama_gguf(path, SHAPE, layers, tensor, context=8192, rope_base=500000.0, bos=0, eos=1)


def child(kind: str, path: pathlib.Path, scratch: pathlib.Path) -> None:
    import torch

    if kind == "transformers":
        import transformers

        transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float16)
    else:
        sys.path.insert(0, str(HERE.parent))
        from mps_backend.llm.export import load_checkpoint

        load_checkpoint(f"gguf:{path}", "fp16", scratch=scratch, keep_quantized=kind == "mps_backend-kept")


def measured(kind: str, path: pathlib.Path, scratch: pathlib.Path) -> tuple[int, float, int]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", kind, str(path), str(scratch)], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), time.perf_counter() - t0, usage.ru_maxrss * 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "FILE", "SCRATCH"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], pathlib.Path(args.child[1]), pathlib.Path(args.child[2]))
        return 0
    with tempfile.TemporaryDirectory(prefix="mps-gguf-memory-", dir=HERE.parent) as tmp:
        path = pathlib.Path(tmp) / "synthetic.gguf"
        sys.path.insert(0, str(HERE.parent))  # tests.llm_helpers
        params = write_gguf(path, args.layers)
        size = path.stat().st_size
        print(
            f"synthetic Llama-3-shaped Q8_0 GGUF: {args.layers} layers, {params / 1e9:.2f} B parameters, {size / 2**30:.2f} GiB"
        )
        peaks = {}
        for kind in ("transformers", "mps_backend", "mps_backend-kept"):
            scratch = pathlib.Path(tmp) / f"scratch-{kind}"
            scratch.mkdir()
            status, seconds, peak = measured(kind, path, scratch)
            if status:
                print(f"{kind}: the load failed (exit {status})")
                return 1
            peaks[kind] = peak
            print(f"{kind:<16} load in float16: peak RSS {peak / 2**30:.2f} GiB = {peak / size:.2f}x the file, {seconds:.0f} s")
    ok = True
    for kind in ("mps_backend", "mps_backend-kept"):
        ratio = peaks[kind] / peaks["transformers"]
        ok = ok and ratio <= 0.5
        print(f"{kind} / transformers peak: {ratio:.2f} (target <= 0.5) {'OK' if ratio <= 0.5 else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
