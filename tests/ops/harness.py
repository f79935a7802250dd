"""The op table harness: lower a one-op module, check delegation, the blob and the device model.

Row files
---------
Rows live in ``tests/ops/rows_<family>.py``; each file exports ``ROWS``, a list of ``row(...)``.
``test_op_table.py`` collects every ``rows_*.py`` of this folder automatically (adding a file is
enough). A row is one case of one op::

    from .harness import row, randn, randint, values

    ROWS = [
        row("aten.exp.default", "unary-exp", torch.exp, randn(3, 4), kinds="MPSExp"),
        row("aten.clamp.default", "clamp-int", lambda x: x.clamp(-2, 3), randint(-5, 5, (3, 4)), kinds="MPSClamp"),
        # fp16: three f16 roundings in the decomposition (one per op) -> 3e-3
        row("aten.atan2.default", "binary-atan2", torch.atan2, randn(8), randn(8), kinds={"MPSAtan"}, tol={"fp16": 3e-3}),
        row("aten.cumsum.default", "reduce-cumsum", lambda x: x.cumsum(0), randn(4), cpu_reason="no MPS lowering"),
        row("aten.pow.Tensor_Tensor", "binary-pow-neg", ..., xfail="device: MPSGraph power of negative bases is unverified"),
    ]

``row(target, id, fn, *inputs, kinds=(), precisions=("fp32", "fp16"), tol=None, cpu_reason=None, xfail=None,
module=None, non_core=())``

- ``target``: the registered ``OpOverload`` the row tests, by name (``"aten.gather.default"``): it
  must be a node of the row's edge graph (checked), and the test ids start with it
  (``aten.gather.default-index-gather-dim0-fp16``), so ``pytest -k gather`` runs every test of the op
  (op table, whole-program path). Every target of the registry needs a row (``test_op_table.py``).
- ``id``: the case, unique among the rows of its target (the test id is ``<target>-<id>``); prefix it
  with the family (``unary-``, ``binary-``, ``index-`` ...). It seeds the inputs.
- ``fn``: the op. A callable taking the inputs (wrapped in a tiny ``nn.Module``), an ``nn.Module``
  subclass (instantiated without arguments) or a zero-argument factory returning a module
  (``module=`` keyword instead of ``fn``: ``row("x", None, randn(2), module=lambda: Net(3))``).
- ``inputs``: tensors or input factories (zero-argument callables returning a tensor; the global
  RNG is seeded from the row id first, so rows are deterministic). Helpers below: ``randn``,
  ``uniform``, ``randint``, ``randbool``, ``values``.
- ``kinds``: union member names (``"MPSExp"``) that must appear in the decoded blob (str or set).
  MPSMin / MPSMax / MPSAtan2 must never appear (checked for every row).
- ``precisions``: which lowerings to test: ``"fp32"`` (``use_fp16=False``) and/or ``"fp16"``.
- ``tol``: ``{precision: rel}`` overriding the defaults ``DEFAULT_TOL`` (fp32 1e-5, fp16 1e-3 =
  about two f16 half-ulps, one rounding per op). Finite elements must satisfy
  ``max |device - eager| <= rel * scale`` with ``scale = max |eager|`` over finite elements (1 if 0);
  NaN and ±inf positions must match exactly; integer and bool outputs must be equal. Justify any
  looser tolerance in a comment on the row.
- ``cpu_reason``: the op must stay on CPU: some node is left on CPU with a partitioner reason
  containing this substring (checked once, in the row's first precision, not per precision). Then each
  precision's lowering goes on as ``export_model`` does (``to_executorch``, the kernel check for the default
  target runtime, executorch 1.0): it must be refused there with one ``RuntimeCompatError`` line naming
  the missing kernel, or give a program that loads and runs in the emulated runtime (``run_pte``) with
  eager's outputs (within ``tol``). An ``as_strided_copy`` reading past its input (eager refuses it too) is
  refused by ``check_cpu_reads`` (``InvalidModelError``).
- ``xfail``: the row is expected to fail (strict): name the device limit or the open work.
- ``non_core``: aten ops outside core ATen that the row's graph keeps (edge verification rejects
  them unless listed in ``EdgeCompileConfig._core_aten_ops_exception_list``; e.g. ``aten.exp2``).

What each row checks, per precision
-----------------------------------
The module is exported and decomposed once (``to_edge_transform_and_lower``'s first half, which
keeps the ops the partitioner preserves; plain ``to_edge`` with the same ``preserve_ops`` when the
graph holds none of them, which gives the same graph faster) and lowered per precision with
``MPSPartitioner``:

1. full delegation: exactly one MPS delegate and ``partitioner.report().on_cpu`` empty;
2. the blob decodes (``read_blob``), contains ``kinds``, no MPSMin/MPSMax/MPSAtan2, and in fp16
   float16 and float32 values meet only through MPSCast (the policy's float32 islands: norm
   statistics, softmax, rounding ops on float32 inputs; no float32 ``dtype`` field feeding float16);
3. the device model (``interpreter.execute``, faithful mode) run on the delegate's inputs (the
   module inputs, floats cast to the declared input dtype) matches eager PyTorch: no output is
   reinterpreted, dtypes are equal, values within ``tol``. In fp16 the eager reference runs in
   float32 on the inputs rounded to float16 (what the device's boundary cast sees), so the
   tolerance only has to cover the f16 rounding of each op.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
import torch._export.utils as torch_export_utils
import torch.export.decomp_utils as torch_decomp_utils
import torch.export.exported_program as torch_exported_program
from executorch.exir import EdgeCompileConfig, to_edge
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.program._program import _gen_edge_manager_for_partitioners

from mps_backend import MPSPartitioner
from mps_backend.export import InvalidModelError, UnsupportedOperatorError, check_cpu_reads, plain_structseq_outputs
from mps_backend.operators.registry import default_registry, op_key
from mps_backend.partitioner import backend_config
from mps_backend.runtime.emulator import run_pte
from mps_backend.runtime.interpreter import DECLARED_DTYPE, execute
from mps_backend.runtime_kernels import DEFAULT_TARGET, RuntimeCompatError, check_kernels
from mps_backend.serialization import DataType, read_blob
from mps_backend.serialization.device_facts import NOT_DISPATCHED

PRECISIONS = ("fp32", "fp16")
DEFAULT_TOL = {"fp32": 1e-5, "fp16": 1e-3}
#: union members without a runtime dispatch case: never emitted
BANNED = NOT_DISPATCHED  # the device facts module: the runtime cannot dispatch these


class Op(torch.nn.Module):
    """A module whose forward is ``fn(*inputs)``."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


@dataclass(eq=False, frozen=True)
class Row:
    target: Any  # the OpOverload the row tests (a registry key; it must appear in the edge graph)
    name: str  # the case, unique among the rows of its target (it seeds the inputs)
    module: Callable[[], torch.nn.Module]
    inputs: tuple
    kinds: frozenset = frozenset()
    precisions: tuple = PRECISIONS
    tol: Mapping[str, float] = field(default_factory=dict)
    cpu_reason: str | None = None
    xfail: str | None = None
    non_core: tuple = ()

    @property
    def id(self) -> str:
        """The test id: the target, then the case (``aten.gather.default-index-gather-dim0``), so
        ``pytest -k gather`` selects every test of an op."""
        return f"{target_name(self.target)}-{self.name}"

    def make_inputs(self) -> tuple:
        torch.manual_seed(zlib.crc32(self.name.encode()))
        return tuple(x() if callable(x) else x.clone() for x in self.inputs)

    def tolerance(self, precision: str) -> float:
        return self.tol.get(precision, DEFAULT_TOL[precision])


def target_name(target: Any) -> str:
    """``aten.gather.default`` for ``torch.ops.aten.gather.default``."""
    return str(target)


def resolve_target(name: str) -> Any:
    """The OpOverload named ``namespace.op.overload`` (``aten.gather.default``)."""
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def row(
    target: str,
    id: str,
    fn: Callable | type | None,
    *inputs: Any,
    kinds: str | Iterable[str] = (),
    precisions: Sequence[str] = PRECISIONS,
    tol: Mapping[str, float] | None = None,
    cpu_reason: str | None = None,
    xfail: str | None = None,
    module: Callable[[], torch.nn.Module] | None = None,
    non_core: Iterable = (),
) -> Row:
    if module is None:
        if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
            module = fn
        else:
            module = functools.partial(Op, fn)
    kinds = frozenset([kinds] if isinstance(kinds, str) else kinds)
    unknown = set(precisions) - set(PRECISIONS)
    if unknown or not precisions:
        raise ValueError(f"row {id}: precisions must be a non-empty subset of {PRECISIONS}")
    return Row(
        resolve_target(target),
        id,
        module,
        tuple(inputs),
        kinds,
        tuple(precisions),
        dict(tol or {}),
        cpu_reason,
        xfail,
        tuple(non_core),
    )


# ---- input factories ---------------------------------------------------------------------------


def randn(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0, offset: float = 0.0):
    return lambda: (torch.randn(shape) * scale + offset).to(dtype)


def uniform(lo: float, hi: float, *shape: int, dtype: torch.dtype = torch.float32):
    return lambda: (torch.rand(shape) * (hi - lo) + lo).to(dtype)


def randint(lo: int, hi: int, shape: Sequence[int], dtype: torch.dtype = torch.int32):
    return lambda: torch.randint(lo, hi, tuple(shape), dtype=dtype)


def randbool(*shape: int):
    return lambda: torch.rand(shape) > 0.5


def values(data, dtype: torch.dtype = torch.float32):
    """Fixed values (e.g. special cases: ties, signed zeros, infinities, NaN)."""
    return lambda: torch.tensor(data, dtype=dtype)


# ---- lowering ----------------------------------------------------------------------------------


@dataclass
class Lowered:
    partitioner: MPSPartitioner
    edge: Any  # the EdgeProgramManager after to_backend
    blobs: list
    delegate_inputs: list  # user-input index of each delegate input
    delegate_outputs: list  # delegate output index of each program output


@functools.lru_cache(maxsize=None)
def _cia_ops() -> frozenset:
    return frozenset(torch_export_utils._collect_all_valid_cia_ops())


@contextlib.contextmanager
def _cached_cia_ops():
    """Speed: every run_decompositions call re-collects all CompositeImplicitAutograd ops from the
    dispatcher (torch cannot cache it: Python custom-op registration may add some). Nothing
    registers operators while the table runs, so inside ``prepared`` the set is collected once per
    process; the torch functions are restored on exit."""
    saved = [(m, m._collect_all_valid_cia_ops) for m in (torch_exported_program, torch_decomp_utils)]
    for m, _ in saved:
        m._collect_all_valid_cia_ops = _cia_ops
    try:
        yield
    finally:
        for m, fn in saved:
            m._collect_all_valid_cia_ops = fn


@functools.lru_cache(maxsize=2)
def prepared(r: Row):
    """Export and decompose once per row: (module, inputs, edge manager before partitioning)."""
    inputs = r.make_inputs()
    module = r.module().eval()
    ep = torch.export.export(module, inputs)
    plain_structseq_outputs(ep)  # as export_model: topk/sort results as plain tuples (to_executorch needs it)
    # to_edge_transform_and_lower = this + to_backend; the decomposition (which keeps the ops
    # MPSPartitioner preserves) does not depend on the precision, so it is shared by both lowerings
    preserved = default_registry().preserved
    with _cached_cia_ops():
        if any(n.target in preserved for n in ep.graph.nodes):
            config = EdgeCompileConfig(_core_aten_ops_exception_list=list(r.non_core))
            em = _gen_edge_manager_for_partitioners({"forward": [MPSPartitioner()]}, {"forward": ep}, config, None)
        else:  # same graph with one decomposition pass instead of two (half the time)
            config = EdgeCompileConfig(_core_aten_ops_exception_list=list(r.non_core), preserve_ops=preserved)
            em = to_edge(ep, compile_config=config)
    return module, inputs, em


@functools.lru_cache(maxsize=4)
def lower(r: Row, precision: str) -> Lowered:
    """The row's partitioner lowering in one precision, once per process (the op table and the
    whole-program test share it: tests/ops/conftest.py runs a row's tests one after the other)."""
    _, _, em = prepared(r)
    part = MPSPartitioner(use_fp16=precision == "fp16")
    # on a copy: lowering removes the lifted constants it consumed from the program it was given
    edge = copy.deepcopy(em).to_backend({"forward": part})
    ep = edge.exported_program()
    gm = ep.graph_module
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == executorch_call_delegate]
    blobs = [getattr(gm, c.args[0].target).processed_bytes for c in calls]
    user = {name: i for i, name in enumerate(ep.graph_signature.user_inputs)}
    ins, outs = [], []
    if len(calls) == 1:
        call = calls[0]
        ins = [user.get(a.name) for a in call.args[1:]]
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        for a in out_node.args[0]:
            is_item = getattr(getattr(a, "target", None), "__name__", "") == "getitem"
            outs.append(a.args[1] if is_item and a.args[0] is call else None)
    return Lowered(part, edge, blobs, ins, outs)


# ---- checks ------------------------------------------------------------------------------------


def check_target(r: Row) -> None:
    """The row's target is a node of its edge graph (before partitioning)."""
    _, _, em = prepared(r)
    found = {op_key(n.target) for n in em.exported_program().graph.nodes if n.op == "call_function"}
    assert r.target in found, f"target {target_name(r.target)} is not in the edge graph: {sorted(map(str, found))}"


def check_cpu(r: Row) -> list[str]:
    """A CPU row: the reason (in its first precision), then each precision's program as ``export_model``
    makes it (the verdicts of :func:`check_exported_program_runs`, per precision). The lowerings are the
    cached ones the whole-program test uses too."""
    check_target(r)
    report = lower(r, r.precisions[0]).partitioner.report()
    reasons = [c.reason for c in report.on_cpu]
    assert any(r.cpu_reason in reason for reason in reasons), (
        f"expected a node left on CPU with a reason containing {r.cpu_reason!r}\n{report}"
    )
    module, inputs, _ = prepared(r)
    verdicts = []
    for precision in r.precisions:
        edge = lower(r, precision).edge

        def program(edge: Any = edge) -> bytes:  # export_model's last stage, on the cached lowering
            check_cpu_reads(edge)
            manager = edge.to_executorch(backend_config(edge))
            check_kernels(manager, DEFAULT_TARGET)
            return manager.buffer

        verdicts.append(check_exported_program_runs(program, module, inputs, r.tolerance(precision)))
    return verdicts


def check_exported_program_runs(
    export: Callable[[], bytes], module: torch.nn.Module, inputs: Sequence[torch.Tensor], rel: float
) -> str:
    """What every export must give (issue #26): ``export()`` refuses the model with one typed line naming
    the missing kernel, the operator or the node (``"refused"``), or its program loads and runs in the
    emulated runtime with eager's outputs within ``rel`` (``"ran"``)."""
    try:
        pte = export()
    except (RuntimeCompatError, UnsupportedOperatorError, InvalidModelError) as e:
        msg = str(e)
        assert "\n" not in msg, f"refusal is not one line: {msg}"
        named = "aten::" if isinstance(e, RuntimeCompatError) else "aten." if isinstance(e, UnsupportedOperatorError) else "node "
        assert named in msg, f"refusal names no kernel, operator or node: {msg}"
        return "refused"
    with torch.no_grad():
        ref = _flat(module(*inputs))
    outs = run_pte(pte, list(inputs))
    assert len(outs) == len(ref), f"{len(outs)} program outputs, eager {len(ref)}"
    for k, (o, e) in enumerate(zip(outs, ref)):
        assert_close(o, e, rel, f"program output {k}")
    return "ran"


def _fp16_float32_values(graph) -> set:
    """Where an fp16 graph mixes float dtypes other than through an MPSCast: a node reading float16 and
    float32 operands together (non-promoting device ops fail to compile, binary ones promote silently),
    or making a float32 result out of float16 operands only (a float32 ``dtype`` field: MPSFull,
    FullLike, Arange). Float32 islands are the precision policy's (``mps_backend.precision``: norm
    statistics, softmax, the residual, float32 inputs read by rounding ops): they meet float16 values
    only through casts."""
    from mps_backend.serialization.device_facts import node_value_ids

    floats = {DataType.float16, DataType.float32}

    def kinds(n, outputs: bool) -> set:
        return {graph.values[i].datatype for i in node_value_ids(n.fields, outputs=outputs) if i >= 0} & floats

    stray = set()
    for k, n in enumerate(graph.nodes):
        if n.op == "MPSCast":
            continue
        reads, outs = kinds(n, False), kinds(n, True)
        if reads == floats:
            stray.add(f"node {k} ({n.op}) reads float16 and float32")
        elif DataType.float32 in outs and DataType.float32 not in reads and DataType.float16 in reads | outs:
            stray.add(f"node {k} ({n.op}) makes float32 out of float16")
        elif (
            n.fields.get("dtype") == DataType.float32
            and not reads
            and any(
                DataType.float16 in kinds(m, False) and n.fields.get("output_id") in node_value_ids(m.fields, outputs=False)
                for m in graph.nodes
                if m.op != "MPSCast"
            )
        ):
            stray.add(f"node {k} ({n.op}.dtype float32) read by a float16 node")
    return stray


def _flat(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    out = []
    for item in x:
        out.extend(_flat(item))
    return out


def assert_close(out: torch.Tensor, ref: torch.Tensor, rel: float, what: str) -> None:
    assert out.dtype == ref.dtype, f"{what}: device dtype {out.dtype}, eager {ref.dtype}"
    assert out.numel() == ref.numel(), f"{what}: device shape {tuple(out.shape)}, eager {tuple(ref.shape)}"
    out = out.reshape(ref.shape)
    if not ref.is_floating_point():
        bad = (out != ref).nonzero()
        assert bad.numel() == 0, (
            f"{what}: {len(bad)} elements differ, e.g. at {bad[0].tolist()}: "
            f"device {out[tuple(bad[0])]}, eager {ref[tuple(bad[0])]}"
        )
        return
    o, e = out.double(), ref.double()
    nan_o, nan_e = o.isnan(), e.isnan()
    assert torch.equal(nan_o, nan_e), f"{what}: NaN positions differ\ndevice {out}\neager  {ref}"
    inf_e = e.isinf()
    assert torch.equal(o.isinf(), inf_e) and torch.equal(o[inf_e], e[inf_e]), (
        f"{what}: infinities differ\ndevice {out}\neager  {ref}"
    )
    fin = e.isfinite()
    if not fin.any():
        return
    scale = e[fin].abs().max().item() or 1.0
    err = (o - e).abs().masked_fill(~fin, 0)
    worst = err.argmax()
    assert err.max().item() <= rel * scale, (
        f"{what}: max error {err.max().item():.3g} > {rel:g} * scale {scale:.3g} at flat index {worst.item()}: "
        f"device {o.flatten()[worst].item()!r}, eager {e.flatten()[worst].item()!r}"
    )


def _read_in_float32_only(graph, delegate_inputs) -> set[int]:
    """Program inputs every node of an fp16 graph reads as float32 (floor, ceil, max-pool indices on
    the input itself): no node reads the float16 value of its boundary cast. Their eager reference is
    the float32 input; for the others it is the input rounded to float16, as the device sees it."""
    from mps_backend.serialization.device_facts import node_value_ids

    read = {i for n in graph.nodes for i in node_value_ids(n.fields, outputs=False)}
    exact = set()
    for j, vid in enumerate(graph.input_ids):
        if graph.values[vid].datatype != DataType.float32:
            continue
        casts = [n["output_id"] for n in graph.nodes if n.op == "MPSCast" and n["input1_id"] == vid]
        if not any(c in read or c in graph.output_ids for c in casts):
            exact.add(delegate_inputs[j])
    return exact


def check_row(r: Row, precision: str) -> None:
    module, inputs, _ = prepared(r)
    check_target(r)
    low = lower(r, precision)
    report = low.partitioner.report()
    assert report.on_cpu == [], f"not fully delegated:\n{report}"
    assert len(low.blobs) == 1 and report.partitions == 1, f"{len(low.blobs)} MPS delegates:\n{report}"

    blob = read_blob(low.blobs[0])
    g = blob.graph
    kinds = {n.op for n in g.nodes}
    assert r.kinds <= kinds, f"missing node kinds {sorted(r.kinds - kinds)}; blob has {sorted(kinds)}"
    assert not kinds & BANNED, f"emits {sorted(kinds & BANNED)} (not dispatched by the runtime)"
    if precision == "fp16":
        stray = _fp16_float32_values(g)
        assert not stray, f"float32 values inside an fp16 graph: {sorted(stray)}"

    assert None not in low.delegate_inputs, "a delegate input is not a user input"
    assert None not in low.delegate_outputs, "a program output does not come from the delegate"
    dev_in = []
    for j, index in enumerate(low.delegate_inputs):
        x = inputs[index]
        want = DECLARED_DTYPE[g.values[g.input_ids[j]].datatype]
        dev_in.append(x.to(want) if x.is_floating_point() and x.dtype != want else x)
    outs, info = execute(blob, dev_in, return_report=True)
    bad = [i for i in info if i.reinterpreted]
    assert not bad, f"outputs the runtime would reinterpret: {bad}"

    exact: set[int] = set()
    if precision == "fp16":  # what the device sees after its boundary casts, computed in float32
        exact = _read_in_float32_only(g, low.delegate_inputs)
        eager_in = [x.half().float() if x.dtype == torch.float32 and i not in exact else x for i, x in enumerate(inputs)]
    else:
        eager_in = list(inputs)
    with torch.no_grad():
        ref = _flat(module(*eager_in))
    if precision == "fp16" and exact:  # computed from the float32 input, still held in float16 at the end
        ref = [e.half().float() if e.dtype == torch.float32 else e for e in ref]
    assert len(ref) == len(low.delegate_outputs)
    for k, (e, d) in enumerate(zip(ref, low.delegate_outputs)):
        assert_close(outs[d], e, r.tolerance(precision), f"output {k} ({precision})")
