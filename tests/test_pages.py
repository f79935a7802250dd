"""Weights mapped from files: the blob writer hands their pages back to the kernel once it has
copied them (mps_backend.pages), values never change, and memory that is not a file mapping is
never touched."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
import torch

from mps_backend.pages import PAGE, PageReleaser, byte_span, map_copy_on_write, mapped_tensor
from tests.page_helpers import resident_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page release is Linux's MADV_PAGEOUT")

MIB = 1 << 20


def _mapped(tmp_path: pathlib.Path, nbytes: int, offset: int = 0, dtype=torch.float32):
    """(mapped tensor, the same values in ordinary memory) over a file of random bytes."""
    values = torch.randn(nbytes // dtype.itemsize, generator=torch.Generator().manual_seed(0)).to(dtype)
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(offset) + values.view(torch.uint8).numpy().tobytes())
    t = mapped_tensor(map_copy_on_write(path), offset, dtype, [len(values)])
    assert t is not None
    return t, values


def test_release_hands_back_the_pages_and_keeps_the_values(tmp_path):
    t, values = _mapped(tmp_path, 8 * MIB, offset=64)
    assert torch.equal(t, values)  # reads every page
    assert resident_bytes(t) >= 8 * MIB
    pages = PageReleaser()
    assert pages.release(t) >= 8 * MIB and pages.released >= 8 * MIB
    assert resident_bytes(t) < 8 * MIB // 16
    assert torch.equal(t, values)  # read again from the file


def test_release_keeps_what_the_process_wrote(tmp_path):
    """Copy-on-write: a written page is this process's own, the release never reverts it to the file."""
    t, values = _mapped(tmp_path, 2 * MIB)
    t[:1000] = 7.0
    PageReleaser().release(t)
    assert bool((t[:1000] == 7.0).all()) and torch.equal(t[1000:], values[1000:])
    on_disk = np.fromfile(tmp_path / "weights.bin", dtype=np.float32)
    assert np.array_equal(on_disk, values.numpy())  # the file never changes


class _NoStorage(torch.Tensor):
    """A tensor whose data pointer torch refuses to give, as for tensors without storage of their own
    (wrapper subclasses in torch releases that raise there)."""

    def data_ptr(self):
        raise RuntimeError("Cannot access data pointer of Tensor that doesn't have storage")


def test_release_leaves_ordinary_memory_alone():
    t = torch.randn(2 * MIB)
    before = t.clone()
    pages = PageReleaser()
    assert pages.release(t) == 0 and pages.released == 0
    assert pages.release(t.to(torch.float16)) == 0
    assert torch.equal(t, before)
    # nothing to release, and no error: not tensors, tensors off the CPU, tensors without storage
    assert pages.release(b"bytes") == pages.release(None) == 0
    assert pages.release(torch.empty(2 * MIB, device="meta")) == 0
    assert pages.release(torch.zeros(2 * MIB).as_subclass(_NoStorage)) == 0


def test_mapped_tensor_refuses_unaligned_and_empty(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(bytes(4 * PAGE))
    mapping = map_copy_on_write(path)
    assert mapped_tensor(mapping, 2, torch.float32, [4]) is None  # 2 is not a multiple of 4 bytes
    assert mapped_tensor(mapping, 0, torch.float32, [0, 3]) is None
    t = mapped_tensor(mapping, 8, torch.float32, [2, 3])
    assert t is not None and t.shape == (2, 3) and byte_span(t) == (t.data_ptr(), t.data_ptr() + 24)
    assert byte_span(t.t()) == byte_span(t)  # a strided view reads the same bytes


def test_float16_range_check_hands_back_what_it_read(tmp_path):
    from mps_backend.llm.checkpoint import check_fp16_range

    weight, values = _mapped(tmp_path, 8 * MIB, dtype=torch.float16)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(weight, requires_grad=False)
    assert check_fp16_range(model) == 0
    assert resident_bytes(weight) < MIB  # (the last pages read may still sit in a per-CPU batch)
    assert torch.equal(weight, values)


@pytest.mark.parametrize("use_fp16", [False, True])
def test_lowering_hands_back_mapped_weights(tmp_path, use_fp16):
    """A model whose weights are mapped from a file: once lowering has copied them into the blob, the
    mapping is no longer resident, and the program computes what the model does."""
    from executorch.exir import to_edge_transform_and_lower

    from mps_backend import MPSPartitioner
    from mps_backend.runtime import run_pte

    weight, values = _mapped(tmp_path, 1024 * 1024 * 4)  # a 1024 x 1024 float32 weight
    model = torch.nn.Linear(1024, 1024, bias=False).eval()
    model.weight = torch.nn.Parameter(weight.view(1024, 1024), requires_grad=False)
    x = torch.randn(2, 1024)
    ep = torch.export.export(model, (x,))
    expected = model(x)  # reads every page of the weight
    torch.testing.assert_close(expected, x @ values.view(1024, 1024).T)
    assert resident_bytes(weight) >= 4 * MIB
    program = to_edge_transform_and_lower(ep, partitioner=[MPSPartitioner(use_fp16=use_fp16)]).to_executorch()
    assert resident_bytes(weight) < MIB
    # 1024-term dot products: float32 summation order alone moves them ~1e-6 of their scale; a page
    # read back wrong (zeros, another page) moves them by the scale itself
    scale = float(expected.abs().max())
    tol = 1e-2 * scale if use_fp16 else 1e-5 * scale
    torch.testing.assert_close(run_pte(program.buffer, [x])[0], expected, atol=tol, rtol=0)
