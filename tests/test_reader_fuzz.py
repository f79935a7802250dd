"""Seeded fuzzing of the validating reader: every mutated blob decodes or raises MPSFormatError.

Mutations: byte flips (anywhere / in the flatbuffer), truncations, extensions (with and without a
matching header), random u32/u16 writes into the flatbuffer area. Any other exception fails. The
decoder has no timeouts: its work is bounded by the blob size, checked here per blob by counting
function calls (deterministic; a clock would measure the machine's load).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from mps_backend.serialization import MPSFormatError, read_blob, write_blob
from mps_backend.serialization.model import Blob, DataType, Graph, Node, Tensor
from mps_backend.serialization.pte import delegate_blobs
from tests.work_count import CallCount

F32, F16, I32 = DataType.float32, DataType.float16, DataType.int32
MUTANTS_PER_TEST = 10_000
# function calls per byte of blob while decoding a mutant: linear work, far above what valid blobs need
MAX_CALLS_PER_BYTE = 4
FIXED_CALLS = 1000  # setting up the reader, whatever the size
INTERESTING_U32 = (0, 1, 2, 4, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFC, 0xFFFF, 0x10000)


def writer_blobs() -> list[bytes]:
    """A few valid blobs from our writer: strings, int vectors, min_max, constants, rebinding."""
    values = [Tensor(F32, [2, 4]), Tensor(I32, [2]), Tensor(F32, [4]), Tensor(F16, [3])]
    values += [Tensor(F32, [2, 4]) for _ in range(8)]
    nodes = [
        Node("MPSAdd", {"input1_id": 0, "input2_id": 2, "output_id": 4, "alpha": 0.5}),
        Node("MPSGELU", {"input1_id": 4, "output_id": 5, "approximate": "none"}),
        Node("MPSDiv", {"input1_id": 5, "input2_id": 0, "output_id": 6, "rounding_mode": "trunc"}),
        Node("MPSClamp", {"input1_id": 6, "output_id": 7}, (-1.0, 1.0)),
        Node("MPSCat", {"input_ids": [7, 0], "output_id": 8, "dim": 0}),
        Node("MPSSplitWithSizes", {"input1_id": 8, "output_ids": [9, 10], "split_sizes": [2, 2], "dim": 0}),
        Node("MPSIndexSelect", {"input1_id": 9, "output_id": 11, "dim": 0, "index_id": 1}),
        Node("MPSCast", {"input1_id": 11, "output_id": 11, "dtype": int(F16)}),
    ]
    rich = Graph(nodes=nodes, values=values, input_ids=[0, 1], constant_ids=[2, 3], output_ids=[10, 11])
    consts = {2: np.arange(4, dtype=np.float32), 3: np.ones(3, dtype=np.float16)}
    tiny = Graph(
        nodes=[Node("MPSSigmoid", {"input1_id": 0, "output_id": 1})],
        values=[Tensor(F32, [3]), Tensor(F32, [3])],
        input_ids=[0],
        output_ids=[1],
    )
    return [write_blob(rich, consts), write_blob(tiny, {})]


def mutate(rng: random.Random, blob: bytes) -> tuple[str, bytes]:
    b = bytearray(blob)
    fb_end = max(32, min(len(b), int.from_bytes(blob[8:16], "little")))  # flatbuffer area [24, fb_end)
    kind = rng.randrange(7)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= rng.randint(1, 255)
        return "flip anywhere", bytes(b)
    if kind == 1:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(24, fb_end)] ^= rng.randint(1, 255)
        return "flip flatbuffer", bytes(b)
    if kind == 2:
        return "truncate", bytes(b[: rng.randrange(len(b))])
    if kind == 3:
        b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        if rng.random() < 0.5:  # keep "segment ends the blob" true so decoding goes deeper
            seg = int.from_bytes(blob[8:16], "little")
            b[16:24] = (len(b) - seg).to_bytes(8, "little")
        return "extend", bytes(b)
    if kind in (4, 5):
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(24, fb_end - 3) & ~3
            value = rng.choice(INTERESTING_U32) if rng.random() < 0.5 else rng.randrange(2**32)
            if rng.random() < 0.3:  # a plausible in-buffer offset
                value = rng.randrange(fb_end - 24)
            b[pos : pos + 4] = value.to_bytes(4, "little")
        return "u32 write", bytes(b)
    pos = rng.randrange(24, fb_end - 1) & ~1
    b[pos : pos + 2] = rng.randrange(2**16).to_bytes(2, "little")
    return "u16 write", bytes(b)


def fuzz(bases: list[bytes], seed: int, count: int) -> dict[str, int]:
    for base in bases:
        assert isinstance(read_blob(base), Blob)
    rng = random.Random(seed)
    outcome = {"valid": 0, "MPSFormatError": 0}
    for i in range(count):
        kind, data = mutate(rng, rng.choice(bases))
        work = CallCount()
        try:
            with work:
                read_blob(data)
            outcome["valid"] += 1
        except MPSFormatError as e:
            assert str(e), "an MPSFormatError must say what is wrong"
            outcome["MPSFormatError"] += 1
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"seed {seed} mutant {i} ({kind}, {len(data)} bytes): {type(e).__name__}: {e}\nblob hex: {data.hex()}")
        assert work.calls <= FIXED_CALLS + MAX_CALLS_PER_BYTE * len(data), (
            f"seed {seed} mutant {i} ({kind}, {len(data)} bytes) made {work.calls} calls"
        )
    # not vacuous: many mutants rejected, some (e.g. in constant bytes) still valid
    assert outcome["MPSFormatError"] > count // 4 and outcome["valid"] > count // 100, outcome
    return outcome


def test_fuzz_writer_blobs():
    fuzz(writer_blobs(), seed=20240601, count=MUTANTS_PER_TEST)


def test_fuzz_upstream_blobs(upstream_pte_dir):
    bases = [d.blob for pte in sorted(upstream_pte_dir.glob("*.pte")) for d in delegate_blobs(pte)]
    assert len(bases) >= 8
    fuzz(bases, seed=20240602, count=MUTANTS_PER_TEST)
