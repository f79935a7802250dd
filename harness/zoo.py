"""The model zoo: real models lowered to one MPS delegate each, checked against eager PyTorch.

``ZOO`` is the single table of zoo models (model spec for ``mps-backend export --model`` -> input
description); ``mps-backend zoo`` / ``python -m harness.zoo`` and ``tests/test_zoo.py`` use it.

    python -m harness.zoo [--models resnet18,executorch:llama] [--precision fp32,fp16] [--out docs/model-zoo.md]

For each model and precision a fresh subprocess (so models don't pollute each other's memory
figures) builds the model (random weights, nothing downloaded), lowers it with the
calls of ``mps_backend.export.export_model`` (what ``mps-backend export`` runs), runs the real ``.pte``
through the emulated MPS runtime (``mps_backend.export.compare``, what ``export --verify`` uses: a
different NaN/inf pattern counts as an infinite error) and reports:

* MPS delegates, operator nodes delegated / total, every node left on CPU with the partitioner's reason;
* MPS nodes in the blobs vs the edge nodes of the partition (``report().delegated``): no bloat;
* ``.pte`` bytes vs the weight bytes at the chosen precision (parameters, buffers and lifted constants of
  the exported program, float32 at 2 bytes in fp16, mutated buffers such as a KV cache excluded): no
  duplicated weights;
* lowering seconds (``to_edge_transform_and_lower``; torch.export and to_executorch separately);
* peak RSS of the child through the export (``VmHWM`` of /proc/self/status read right after it,
  before verification);
* max |device - eager| / max |eager| in fp32 and fp16 against ``TOLERANCE`` (fp16: and eager float16's own error).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import math
import pathlib
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Sequence

from harness import child_env

#: max |device - eager| / max |eager float32| for the zoo (keyed by use_fp16).
#: fp32: the issue's bound 1e-3; the device model computes in float32 like eager (op order differs only).
#: fp16: every device op rounds its result to float16 (unit roundoff 2^-11 = 4.9e-4) and the weights are
#: rounded too; through tens of layers with normalizations, softmax and long dot products this adds up.
#: Random-weight networks amplify it far more than trained ones: eager PyTorch itself, run in float16
#: (``model.half()`` on CPU, same inputs), is off by 3% (resnet50) to 24% (deeplabv3) of the output scale.
#: So an fp16 result passes at max(3e-2, HALF_FACTOR x that eager-float16 error) (``ZooResult.tolerance``):
#: the device is as close to float32 eager as float16 arithmetic itself allows, up to a factor 2 for a
#: different op order; a wrong lowering (a wrong axis, a missing bias, a swapped operand) is off by O(1).
#: 3e-2 is mps_backend.export.TOLERANCE[True] (the floor for models float16 barely perturbs).
TOLERANCE = {False: 1e-3, True: 3e-2}
HALF_FACTOR = 2.0
#: .pte size: at most 1% above the weight bytes, plus a fixed allowance for the program and the
#: MP00 flatbuffers (~100 bytes per MPS node/value), which dominates only for tiny models.
SIZE_SLACK, SIZE_ALLOWANCE = 0.01, 64 * 1024


@dataclass(frozen=True)
class Entry:
    spec: str  # mps_backend.tools.models.load spec
    inputs: str  # what the forward takes
    slow: bool = False  # too heavy for the default test run (tests/test_zoo.py: -m slow, make zoo)
    #: operator targets expected to stay on CPU (with the device limit in the reason); () = none
    cpu: tuple[str, ...] = ()
    note: str = ""  # why those stay on CPU / what limits the model on the device
    #: why the device cost model's fused bytes per execution exceed FUSED_BOUND x its floor ("" = they may not)
    cost_note: str = ""


#: a zoo model's fused bytes per execution above this many times its floor need an Entry.cost_note
FUSED_BOUND = 1.2
ACTIVATION_BOUND = (
    "activation-bound: at batch 1 the feature maps each convolution writes and the next reads outweigh "
    "the weights; the fused model fuses elementwise chains, not convolutions, and the floor counts only "
    "weights, inputs and outputs once"
)

ZOO: dict[str, Entry] = {
    e.spec: e
    for e in (
        Entry("torchvision:mobilenet_v2", "image [1, 3, 224, 224]", cost_note=ACTIVATION_BOUND),
        Entry(
            "torchvision:mobilenet_v3_large",
            "image [1, 3, 224, 224]",
            slow=True,
            cost_note=ACTIVATION_BOUND,
            note="hardswish has no MPS node: 3 MPS nodes each (operators/activation.py; executorch's own "
            "decomposition would be 7 edge nodes); the 46 batch norms fold into their convolutions and the 8 "
            "squeeze-excitation hardsigmoids into theirs (one MPSHardTanh each, operators/convolution.py), "
            "so the graph still has fewer MPS nodes than edge nodes",
        ),
        Entry("torchvision:resnet18", "image [1, 3, 224, 224]", cost_note=ACTIVATION_BOUND),
        Entry("torchvision:resnet50", "image [1, 3, 224, 224]", slow=True, cost_note=ACTIVATION_BOUND),
        Entry("torchvision:inception_v3", "image [1, 3, 299, 299] (no aux logits)", slow=True, cost_note=ACTIVATION_BOUND),
        Entry(
            "torchvision:vit_b_16",
            "image [1, 3, 224, 224]",
            slow=True,
            cost_note="activation-bound: 197 tokens x 768 through 12 layers; the attention scores (12 heads x 197 x 197 per"
            " layer) and the 3072-wide MLP activations between matmuls outweigh the weights",
        ),
        Entry(
            "torchvision:deeplabv3_resnet50",
            "image [1, 3, 224, 224] -> out [1, 21, 224, 224]",
            slow=True,
            cost_note=ACTIVATION_BOUND,
            note="bilinear upsampling has no MPS node: the 28x28 -> 224x224 one is two MPSMatMuls with torch's "
            "interpolation weights (operators/pooling.py); batch norms fold into their convolutions. fp32 "
            "error: this random-weight network amplifies rounding, eager float32 itself is 1.5e-4 off a "
            "float64 run; the device output is as close to float64 (measured 1.5e-4)",
        ),
        Entry(
            "executorch:llama",
            "tokens [1, 16] int64 -> last-token logits (dim 768, 12 layers, 12 heads, vocab 32000, max_seq_len 128)",
            slow=True,
        ),
        Entry(
            "executorch:llama-kv",
            "token [1, 1], input_pos [1] int64; KV cache buffers updated in place (same config, use_kv_cache=True)",
            slow=True,
            cost_note="executorch's own KVCache module writes the cache and then reads the written tensor: its "
            "index_put stays in the delegate (a whole new cache per layer, copied back by aten::copy_) and the "
            "attention reads that copy; `mps-backend export --model llama:CKPT` decodes the same checkpoints with "
            "the cache read in place and only the rows written (docs/llm.md)",
        ),
        Entry(
            "torch:transformer_encoder",
            "[1, 64, 512] (d_model 512, 8 heads, 6 layers, batch_first)",
            slow=True,
            cost_note="nn.TransformerEncoder deep-copies one layer, so the 6 layers' random weights are identical and "
            "stored once: the floor counts one layer's weights while each execution reads them 6 times (a model "
            "with distinct trained layers is near the floor)",
        ),
        Entry(
            "executorch:lstm",
            "x [5, 3, 10], h0 [2, 3, 20], c0 [2, 3, 20] -> y, h, c (2-layer quantizable LSTM)",
            cost_note="an unrolled recurrence: each of the 5 time steps reads the same 40 KB of weights again, and the gate"
            " activations of every step are written and read",
        ),
        Entry("executorch:ds_cnn", "MFCC [1, 1, 49, 10]", cost_note=ACTIVATION_BOUND),
        Entry("executorch:mobilenet_v1_025", "image [1, 3, 96, 96]", cost_note=ACTIVATION_BOUND),
        Entry("executorch:resnet8", "image [1, 3, 32, 32]", cost_note=ACTIVATION_BOUND),
        Entry("executorch:deep_autoencoder", "features [1, 640]"),
        Entry(
            "executorch:efficient_sam",
            "image [1, 3, 1024, 1024], points [1, 1, 1, 2], labels [1, 1, 1] "
            "(ViT-T, random weights: the checkpoint is not downloaded)",
            slow=True,
            cost_note="activation-bound: a 1024 x 1024 image through a ViT image encoder; its activations (tens "
            "of MB per layer) dwarf its 41 MB of weights",
            note="fp16: the prompt rescaling computes points x 1024 / 1024 (here 319.5 x 1024 = 327168, beyond "
            "float16's maximum 65504); the division lowering rewrites (x * a) / d with powers of two a, d "
            "into x * (a / d), exact, so the fp16 graph stays finite (operators/binary.py). Eager PyTorch "
            "cannot run this model in float16 (forward creates float32 tensors): the fp16 tolerance is "
            "the 3e-2 floor",
        ),
    )
}


def _cost_note(spec: str) -> str:
    return ZOO[spec].cost_note if spec in ZOO and ZOO[spec].cost_note else "NO REASON NAMED"


def resolve(name: str) -> str:
    """Zoo spec for ``name``: a spec (``torchvision:resnet18``) or the part after the colon (``resnet18``)."""
    if name in ZOO:
        return name
    hits = [spec for spec in ZOO if spec.split(":", 1)[1] == name]
    if len(hits) != 1:
        raise SystemExit(f"{name!r} is not a zoo model; zoo models: {', '.join(ZOO)}")
    return hits[0]


# ---- one model, one precision (in-process) ------------------------------------------------------------


def weight_bytes(ep, use_fp16: bool, on_cpu: Sequence[str] = (), mutated: Sequence[str] = ()) -> int:
    """Bytes of an ExportedProgram's parameters, buffers and lifted constants (each storage once) at the
    device precision (float32 counts 2 bytes per element in fp16 mode; the names in ``on_cpu``, constants
    left to CPU operators, keep their own dtype). Buffers the program mutates (``mutated``, e.g. a KV
    cache; torch.export's program keeps such mutations in-graph, the edge program's signature lists them)
    are state, not weights: ExecuTorch plans their memory, the .pte holds no copy."""
    import torch  # noqa: PLC0415

    mutated = set(mutated) | set(ep.graph_signature.buffers_to_mutate.values())
    cpu = set(on_cpu)
    seen, total = set(), 0
    for name, t in [*ep.state_dict.items(), *ep.constants.items()]:
        if name in mutated or not isinstance(t, torch.Tensor):
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        if key in seen:
            continue
        seen.add(key)
        size = 2 if (use_fp16 and t.dtype == torch.float32 and name not in cpu) else t.element_size()
        total += t.numel() * size
    return total


def boundary_casts(lowered_modules, use_fp16: bool) -> int:
    """MPSCasts the builder adds at the delegates' edges: in fp16 mode one per float32 input and output."""
    import torch  # noqa: PLC0415

    if not use_fp16:
        return 0
    n = 0
    for lm in lowered_modules:
        ep = lm.original_module
        user = set(ep.graph_signature.user_inputs)
        for node in ep.graph.nodes:
            val = node.meta.get("val")
            if node.op == "placeholder" and node.name in user and getattr(val, "dtype", None) == torch.float32:
                n += 1
            elif node.op == "output":
                outs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
                n += sum(getattr(o.meta.get("val"), "dtype", None) == torch.float32 for o in outs if hasattr(o, "meta"))
    return n


def expansion(lowered_modules, use_fp16: bool) -> dict[str, tuple[int, int]]:
    """Edge target -> (edge nodes, MPS nodes they lower to) over the given lowered modules, rebuilt
    with the GraphBuilder (``node_origin``); "boundary casts" are the fp16 input/output casts."""
    from mps_backend.backend import build_graph  # noqa: PLC0415
    from mps_backend.partitioner import _target_name  # noqa: PLC0415
    from mps_backend.passes._graph import REPLACES  # noqa: PLC0415
    from mps_backend.precision import PRECISION_INSERTED  # noqa: PLC0415

    edge: collections.Counter = collections.Counter()
    mps: collections.Counter = collections.Counter()
    for lm in lowered_modules:
        b = build_graph(lm.original_module, use_fp16)
        by_name = {n.name: n for n in lm.original_module.graph.nodes if n.op == "call_function"}
        for n in by_name.values():
            edge[_target_name(n.target)] += 1
        for origin in b.node_origin:  # a fused node (conv + batch norm) counts for its first fx node
            origin = origin[0] if isinstance(origin, tuple) else origin
            if origin is None or origin.op != "call_function":
                mps["boundary casts"] += 1
                continue
            if origin.meta.get(PRECISION_INSERTED):  # a cast or power-of-two scaling of the precision policy
                mps["precision casts"] += 1
                continue
            # a node a lowering pass put in an fx node's place counts for that node
            mps[_target_name(by_name.get(origin.meta.get(REPLACES, origin.name), origin).target)] += 1
    return {t: (edge[t], mps[t]) for t in sorted(set(edge) | set(mps), key=lambda t: edge[t] - mps[t])}


def _vm_kib(field_name: str) -> int:
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class ZooResult:
    spec: str
    precision: str
    delegates: int = 0
    delegated: int = 0  # operator nodes in MPS partitions (edge nodes of the partitions)
    total: int = 0  # operator nodes of the edge program
    mps_nodes: int = 0  # MPSNodes in the blobs
    casts: int = 0  # of which fp16 boundary casts (one per float32 input/output of a delegate)
    #: of which the precision policy's casts and power-of-two scalings (fp16; counted when MPS nodes exceed
    #: the edge nodes plus the boundary casts)
    precision_casts: int = 0
    on_cpu: list[tuple[str, str, str]] = field(default_factory=list)  # (node, target, reason)
    pte_bytes: int = 0
    weight_bytes: int = 0
    constant_bytes: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    peak_rss_kib: int = 0  # VmHWM right after the export
    base_rss_kib: int = 0  # VmRSS with the model built, before the export
    max_abs: float = float("nan")
    scale: float = float("nan")
    half_error: float = float("nan")  # fp16: relative error of eager PyTorch in float16 (model.half())
    #: edge targets lowered to more MPS nodes than edge nodes (when MPS nodes > delegated edge nodes):
    #: target -> (edge nodes, MPS nodes)
    expansion: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: the device cost model's bytes per execution / its floor (mps_backend/cost.py; a model)
    naive_ratio: float = float("nan")
    fused_ratio: float = float("nan")
    error: str = ""

    @property
    def use_fp16(self) -> bool:
        return self.precision == "fp16"

    @property
    def relative(self) -> float:
        return self.max_abs / self.scale if self.scale else self.max_abs

    @property
    def tolerance(self) -> float:
        """Relative error bound: fp32 1e-3; fp16 max(3e-2, HALF_FACTOR x eager float16's own error)."""
        if not self.use_fp16:
            return TOLERANCE[False]
        half = self.half_error if math.isfinite(self.half_error) else 0.0  # not measured, or overflowed
        return max(TOLERANCE[True], HALF_FACTOR * half)

    @property
    def size_limit(self) -> float:
        return self.weight_bytes * (1 + SIZE_SLACK) + SIZE_ALLOWANCE

    def failures(self) -> list[str]:
        """What this result misses of the zoo's targets (empty: all met)."""
        if self.error:
            return [self.error]
        out = []
        expected = sorted(ZOO[self.spec].cpu) if self.spec in ZOO else []
        if sorted(t for _, t, _ in self.on_cpu) != expected or (not expected and self.delegates != 1):
            out.append(
                f"{self.delegates} delegates, {len(self.on_cpu)} nodes on CPU"
                + (f" ({len(expected)} documented)" if expected else "")
            )
        if not self.scale > 0:
            out.append("eager output is all zeros: the comparison shows nothing")
        if not self.relative <= self.tolerance:
            out.append(f"relative error {self.relative:.3g} > {self.tolerance:.3g}")
        if self.pte_bytes > self.size_limit:
            out.append(f".pte {self.pte_bytes:,} B > 1.01 x weights {self.weight_bytes:,} B + 64 KiB")
        entry = ZOO.get(self.spec)
        if self.fused_ratio > FUSED_BOUND and not (entry and entry.cost_note):
            out.append(f"fused bytes per execution {self.fused_ratio:.2f}x the floor > {FUSED_BOUND} with no reason named")
        if self.mps_nodes > self.delegated + self.casts + self.precision_casts:
            out.append(
                f"{self.mps_nodes} MPS nodes > {self.delegated} edge nodes in the partition"
                + (f" + {self.casts} fp16 boundary casts" if self.casts else "")
                + (f" + {self.precision_casts} precision casts" if self.precision_casts else "")
            )
        return out


def check(spec: str, use_fp16: bool, model_and_inputs=None, *, run: bool = True) -> ZooResult:
    """Export ``spec`` (or the given ``(model, inputs)``) at one precision with the calls of
    ``mps_backend.export.export_model``, verify the .pte on the device model (``run``), and measure it."""
    from executorch.exir import to_edge_transform_and_lower  # noqa: PLC0415
    from executorch.exir.lowered_backend_module import get_lowered_submodules  # noqa: PLC0415

    from mps_backend import MPSPartitioner  # noqa: PLC0415
    from mps_backend.cost import cost_of_program  # noqa: PLC0415
    from mps_backend.export import compare, export_program  # noqa: PLC0415
    from mps_backend.export_scope import export_scope  # noqa: PLC0415
    from mps_backend.serialization.generated.mpsgraph.MPSGraph import MPSGraph  # noqa: PLC0415
    from mps_backend.serialization.model import Header  # noqa: PLC0415
    from mps_backend.tools import models  # noqa: PLC0415

    res = ZooResult(spec, "fp16" if use_fp16 else "fp32")
    model, inputs = model_and_inputs or models.load(spec)
    res.base_rss_kib = _vm_kib("VmRSS")

    def stage(name: str, fn):
        t0 = time.perf_counter()
        out = fn()
        res.seconds[name] = time.perf_counter() - t0
        return out

    partitioner = MPSPartitioner(use_fp16=use_fp16)
    ep = stage("torch.export", functools.partial(export_program, model, inputs))
    with export_scope():  # as export_model lowers
        edge = stage("lower to MPS", functools.partial(to_edge_transform_and_lower, ep, partitioner=[partitioner]))
    top = edge.exported_program()
    res.weight_bytes = weight_bytes(
        ep, use_fp16, on_cpu=[*top.state_dict, *top.constants], mutated=list(top.graph_signature.buffers_to_mutate.values())
    )
    del ep, top
    lowered = [m for _, m, _ in get_lowered_submodules(edge.exported_program().graph_module) if m.backend_id == "MPSBackend"]
    res.casts = boundary_casts(lowered, use_fp16)
    with export_scope():
        pte = stage("to_executorch", edge.to_executorch).buffer
    cost = cost_of_program(pte)
    res.naive_ratio, res.fused_ratio = cost.naive_ratio, cost.fused_ratio
    res.peak_rss_kib = _vm_kib("VmHWM")
    r = partitioner.report()
    res.delegates, res.delegated, res.total = len(lowered), len(r.delegated), r.total
    res.on_cpu = [(n.name, n.target, n.reason) for n in r.on_cpu]
    res.pte_bytes = len(pte)
    res.constant_bytes = sum(Header.from_bytes(m.processed_bytes[:24]).segment_size for m in lowered)
    res.mps_nodes = sum(MPSGraph.GetRootAs(m.processed_bytes, 24).MpsNodesLength() for m in lowered)
    if res.mps_nodes > res.delegated + res.casts:  # where the extra MPS nodes come from
        grown = expansion(lowered, use_fp16)
        res.precision_casts = grown.get("precision casts", (0, 0))[1]
        if res.mps_nodes > res.delegated + res.casts + res.precision_casts:
            res.expansion = {t: c for t, c in grown.items() if c[1] > c[0] and t != "precision casts"}
    del edge, lowered
    if run:
        res.max_abs, res.scale = compare(pte, model, inputs)
        if use_fp16:
            res.half_error = eager_half_error(model, inputs)
    return res


def eager_half_error(model, inputs) -> float:
    """max |eager float16 - eager float32| / max |eager float32| (NaN where eager float16 fails on CPU)."""
    import copy  # noqa: PLC0415

    import torch  # noqa: PLC0415

    from mps_backend.export import flat_outputs  # noqa: PLC0415

    try:
        with torch.no_grad():
            want = flat_outputs(model(*inputs))
            half = copy.deepcopy(model).half()
            got = flat_outputs(half(*[x.half() if x.is_floating_point() else x for x in inputs]))
    except Exception:  # noqa: BLE001  (an op without a CPU float16 kernel: no reference, fixed tolerance)
        return float("nan")
    scale = max(w.float().abs().max().item() for w in want)
    if not all(torch.isfinite(g).all() for g in got):
        return float("inf")  # eager float16 overflows too
    err = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want))
    return err / scale if scale else err


# ---- the command -------------------------------------------------------------------------------------


def _warm_up(use_fp16: bool) -> None:
    """Export a two-layer model first, so the lowering seconds of the zoo model leave out one-time costs
    (imports, registry, executorch pass set-up)."""
    import torch  # noqa: PLC0415

    from mps_backend.export import export_model  # noqa: PLC0415

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    export_model(model.eval(), (torch.randn(2, 8),), use_fp16=use_fp16)


def _child(spec: str, precision: str) -> int:
    try:
        _warm_up(precision == "fp16")
        res = check(spec, precision == "fp16")
    except BaseException as e:  # noqa: BLE001  (reported in the table)
        res = ZooResult(spec, precision, error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        res.peak_rss_kib = _vm_kib("VmHWM")
    print("ZOO-RESULT " + json.dumps(asdict(res)), flush=True)
    return 0


def run_one(spec: str, precision: str, timeout: float = 3600) -> ZooResult:
    """``check`` in a fresh subprocess (its stderr is dropped, the last line quoted on failure)."""
    cmd = [sys.executable, "-m", "harness.zoo", "--child", spec, "--precision", precision]
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=child_env())
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        err.seek(0)
        tail = err.read()[-2000:]
    line = next((ln for ln in out.splitlines() if ln.startswith("ZOO-RESULT ")), None)
    if line is None:
        last = [ln for ln in tail.splitlines() if ln.strip()][-1:] or [""]
        return ZooResult(
            spec,
            precision,
            error=f"child exited with {proc.returncode} after {time.monotonic() - t0:.0f}s without a result: {last[0][:300]}",
        )
    data = json.loads(line.split(" ", 1)[1])
    data["on_cpu"] = [tuple(x) for x in data["on_cpu"]]
    data["expansion"] = {k: tuple(v) for k, v in data["expansion"].items()}
    return ZooResult(**data)


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}" if n >= 1e6 else f"{n / 1e6:.2f}"


def _err(r: ZooResult | None) -> str:
    if r is None:
        return "–"
    if r.error:
        return "failed"
    mark = "" if r.relative <= r.tolerance else " ✗"
    half = ""
    if r.use_fp16 and math.isinf(r.half_error):
        half = " (eager fp16 overflows too)"
    elif r.use_fp16 and math.isfinite(r.half_error):
        half = f" (eager fp16 {r.half_error:.1e})"
    return f"{r.relative:.1e}{half}{mark}"


def render(results: dict[tuple[str, str], ZooResult], precisions: Sequence[str]) -> str:
    """The markdown of docs/model-zoo.md."""
    specs = list(dict.fromkeys(spec for spec, _ in results))
    p = list(precisions)
    head = " / ".join(p)
    lines = [
        "# Model zoo",
        "",
        "Generated by `python -m harness.zoo` (`make zoo`): every model exported with random weights, "
        "lowered like `mps_backend.export.export_model` does, and its `.pte` run through the emulated MPS runtime "
        "against eager PyTorch. One subprocess per model and precision.",
        "",
        f"Columns with two figures give {head}. *delegated/total*: operator nodes of the edge program "
        "inside MPS partitions; *MPS nodes*: nodes in the MP00 blobs, of which fp16 boundary casts in brackets "
        "(one MPSCast per float32 input/output of a delegate; target: MPS nodes ≤ delegated edge nodes + those casts); "
        "*.pte / weights*: `.pte` bytes over the bytes of the parameters and buffers at the precision "
        "(target ≤ 1.01, plus 64 KiB for program and flatbuffer on tiny models); *lower s*: "
        "`to_edge_transform_and_lower` (torch.export and to_executorch not included); *peak RSS*: VmHWM of "
        "the child right after the export (includes the eager model and Python/torch, ~0.5 GB); *error*: "
        f"max abs error / max abs eager float32 output (targets: fp32 ≤ {TOLERANCE[False]:g}; fp16 ≤ "
        f"max({TOLERANCE[True]:g}, {HALF_FACTOR:g} × the error of eager PyTorch run in float16, shown in "
        "brackets; see `TOLERANCE` in harness/zoo.py); *bytes / floor*: the device cost model's bytes "
        "moved per execution over its floor, naive and fused models (`mps-backend cost`, docs/device-cost.md: a model, "
        "not a device measurement). Weights are random; BatchNorm running statistics "
        "are calibrated on random inputs and zero-initialised matrices drawn randomly (mps_backend/tools/models.py), "
        "so activations have realistic ranges.",
        "",
        "| model | inputs | delegates | delegated/total | MPS nodes | .pte MB | .pte / weights | lower s | "
        "peak RSS MB | error fp32 | error fp16 | bytes / floor naive, fused |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    leftovers: list[str] = []
    failed: list[str] = []
    for spec in specs:
        rs = [results.get((spec, q)) for q in p]
        ok = [r for r in rs if r is not None and not r.error]

        def col(fn, rs=rs):
            return " / ".join("failed" if r is None or r.error else fn(r) for r in rs)

        lines.append(
            "| "
            + " | ".join(
                [
                    f"`{spec}`",
                    ZOO[spec].inputs if spec in ZOO else "",
                    col(lambda r: str(r.delegates)),
                    col(lambda r: f"{r.delegated}/{r.total}"),
                    col(lambda r: f"{r.mps_nodes}" + (f" ({r.casts})" if r.casts else "")),
                    col(lambda r: _mb(r.pte_bytes)),
                    col(lambda r: f"{r.pte_bytes / r.weight_bytes:.4f}" if r.weight_bytes else "–"),
                    col(lambda r: f"{r.seconds.get('lower to MPS', 0):.1f}"),
                    col(lambda r: f"{r.peak_rss_kib / 1024:.0f}"),
                    _err(results.get((spec, "fp32"))),
                    _err(results.get((spec, "fp16"))),
                    col(lambda r: f"{r.naive_ratio:.2f}, {r.fused_ratio:.2f}"),
                ]
            )
            + " |"
        )
        for r in rs:
            if r is None:
                continue
            if r.failures():
                failed.append(f"- `{spec}` {r.precision}: " + "; ".join(r.failures()))
        for r in ok:
            if not r.on_cpu or (r is not ok[0] and r.on_cpu == ok[0].on_cpu):
                continue
            names: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
            for name, t, reason in r.on_cpu:
                names[(t, reason)].append(name)
            same = " and ".join(q.precision for q in ok if q.on_cpu == r.on_cpu)
            note = f" {ZOO[spec].note}." if spec in ZOO and ZOO[spec].note else ""
            leftovers.append(f"- `{spec}` ({same}), {r.delegates} delegates.{note}")
            leftovers += [f"  - {len(n)} × `{t}`: {reason} ({', '.join(n)})" for (t, reason), n in names.items()]
    lines += ["", "## Left on CPU", ""]
    lines += leftovers or ["Nothing: every model above is one MPS delegate with no operator node on CPU."]
    lines += [
        "",
        "## More MPS nodes than edge nodes",
        "",
        "Edge targets that lower to more MPS nodes than there are edge nodes of that target "
        "(edge nodes → MPS nodes), for each model and precision whose blobs have more MPS nodes than its "
        "partitions have edge nodes plus fp16 boundary casts:",
        "",
    ]
    bloated = [r for r in results.values() if r.expansion]
    for r in bloated:
        lines.append(
            f"- `{r.spec}` {r.precision} ({r.mps_nodes} MPS nodes for {r.delegated} edge nodes): "
            + ", ".join(f"`{t}` {e} → {m}" for t, (e, m) in r.expansion.items())
        )
    if not bloated:
        lines.append("None.")
    lines += ["", "## Targets missed", ""]
    lines += failed or ["None."]
    over = [
        (spec, r)
        for spec in specs
        for r in [
            max(
                (x for x in (results.get((spec, q)) for q in p) if x is not None and not x.error),
                key=lambda x: x.fused_ratio,
                default=None,
            )
        ]
        if r is not None and r.fused_ratio > FUSED_BOUND
    ]
    lines += ["", f"## Above {FUSED_BOUND}x the floor (fused cost model)", ""]
    lines += [f"- `{spec}` ({r.fused_ratio:.2f}x, {r.precision}): {_cost_note(spec)}." for spec, r in over] or ["None."]
    notes = [f"- `{spec}`: {ZOO[spec].note}." for spec in specs if spec in ZOO and ZOO[spec].note]
    if notes:
        lines += ["", "## Notes", "", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mps-backend zoo", description="Export, verify and measure the model zoo.")
    ap.add_argument("--models", help="comma-separated zoo models (spec or short name); default: all")
    ap.add_argument("--precision", default="fp32,fp16", help="fp32,fp16 (default) or one of them")
    ap.add_argument("--out", default="docs/model-zoo.md", help="markdown table to write ('-' = stdout only)")
    ap.add_argument("--list", action="store_true", help="list the zoo models and exit")
    ap.add_argument("--fast", action="store_true", help="only the models not marked slow")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    precisions = [q.strip() for q in args.precision.split(",") if q.strip()]
    if not precisions or set(precisions) - {"fp32", "fp16"}:
        raise SystemExit("--precision takes fp32, fp16 or fp32,fp16")
    if args.child:
        return _child(args.child, precisions[0])
    if args.list:
        for e in ZOO.values():
            print(f"{e.spec:34s} {'slow ' if e.slow else '     '}{e.inputs}")
        return 0
    specs = (
        [resolve(m.strip()) for m in args.models.split(",")]
        if args.models
        else [s for s, e in ZOO.items() if not (args.fast and e.slow)]
    )
    results: dict[tuple[str, str], ZooResult] = {}
    for spec in specs:
        for q in precisions:
            print(f"[zoo] {spec} {q} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            r = results[(spec, q)] = run_one(spec, q)
            state = "; ".join(r.failures()) or "ok"
            print(
                f"      {r.delegates} delegate(s), {r.delegated}/{r.total} delegated, {r.mps_nodes} MPS nodes, "
                f".pte {r.pte_bytes / 1e6:.1f} MB / weights {r.weight_bytes / 1e6:.1f} MB, "
                f"lower {r.seconds.get('lower to MPS', 0):.1f}s, peak RSS {r.peak_rss_kib / 1024:.0f} MB, "
                f"error {r.relative:.2g}: {state} ({time.monotonic() - t0:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
    text = render(results, precisions)
    if args.out and args.out != "-":
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        print(text)
    return 1 if any(r.failures() for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
