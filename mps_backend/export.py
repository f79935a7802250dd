"""The export pipeline behind ``mps-backend export``: torch.export -> edge -> MPS -> .pte,
with stage timings, a summary, and optional verification through the device model."""

from __future__ import annotations

import contextlib
import re
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from mps_backend import runtime
from mps_backend.errors import MPSBackendError, MPSBackendWarning
from mps_backend.export_scope import export_scope
from mps_backend.operators.registry import op_key
from mps_backend.operators.shape import as_strided_overrun
from mps_backend.partitioner import MPSPartitioner, PartitionReport, backend_config, edge_compile_config
from mps_backend.passes import check_fp16_constants, drop_unused_constants
from mps_backend.runtime.bundled_check import read_bundled
from mps_backend.runtime.program_check import ProgramFormatError
from mps_backend.runtime_kernels import DEFAULT_TARGET, check_kernels
from mps_backend.serialization.model import Header

#: max |device - eager| / max(|eager|) accepted by --verify. fp32: the device model computes in
#: float32 like eager, only op order differs. fp16: each op's result is rounded to float16
#: (relative step 2^-11 ~ 4.9e-4); over tens of chained ops with reductions the error grows to
#: ~1e-2 of the output scale, so 3e-2 leaves margin without hiding a wrong lowering (those are O(1)).
TOLERANCE = {False: 1e-4, True: 3e-2}


class UnsupportedOperatorError(MPSBackendError, ValueError):
    """An operator neither lowered to MPS nor allowed on CPU: it is not core ATen and nothing decomposes
    it, so executorch's edge verifier refuses the program (``aten.median.dim``)."""


class InvalidModelError(MPSBackendError, ValueError):
    """The model fails in eager PyTorch too, found in the exported graph (an ``as_strided`` reading past the
    end of its input: torch.export's fake tensors do not check storage bounds)."""


def check_cpu_reads(edge: Any) -> None:
    """Raise :class:`InvalidModelError` for an ``as_strided_copy`` left on CPU that reads past its input's end:
    its program would load and then fail at run time ("out of bounds for storage", as eager PyTorch does).
    The partitioner leaves such a node on CPU; ``export_model`` runs this after the lowering."""
    names = edge.methods if hasattr(edge, "methods") else ["forward"]
    for name in names:
        for node in edge.exported_program(name).graph.nodes:
            if node.op == "call_function" and op_key(node.target) == torch.ops.aten.as_strided_copy.default:
                overrun = as_strided_overrun(node)
                if overrun is not None:
                    raise InvalidModelError(
                        f"node {node.name}: {overrun} (eager PyTorch refuses it too: out of bounds for storage); "
                        "fix the model's as_strided sizes, strides or offset"
                    )


@dataclass
class ExportResult:
    pte: bytes
    report: PartitionReport
    use_fp16: bool
    delegates: int
    constant_bytes: int
    seconds: dict[str, float] = field(default_factory=dict)
    #: executorch's ETRecord of the export (``export_model(..., etrecord=True)``), for the Inspector
    etrecord: Any = None

    @property
    def precision(self) -> str:
        return "float16" if self.use_fp16 else "float32"

    def summary(self) -> str:
        r = self.report
        return "\n".join(
            [
                f"precision        {self.precision}",
                f"MPS delegates    {self.delegates}",
                f"nodes delegated  {len(r.delegated)}/{r.total}",
                f"constant bytes   {self.constant_bytes:,}",
                f".pte size        {len(self.pte):,} bytes",
                f"seconds          {sum(self.seconds.values()):.2f} "
                + "("
                + ", ".join(f"{k} {v:.2f}" for k, v in self.seconds.items())
                + ")",
            ]
        )


def export_program(model: torch.nn.Module, example_inputs: Sequence[torch.Tensor]) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` in eval mode (non-strict), without unread constants; outputs that are
    torch's named result tuples (``torch.topk``'s, ``torch.sort``'s) become plain tuples."""
    ep = drop_unused_constants(torch.export.export(model.eval(), tuple(example_inputs), strict=False))
    plain_structseq_outputs(ep)
    return ep


def _plain_spec(spec: Any) -> Any:
    import torch.utils._pytree as pytree  # noqa: PLC0415

    if spec.is_leaf():
        return spec
    children = [_plain_spec(c) for c in spec.children()]
    if pytree.is_structseq_class(spec.type):
        return pytree.TreeSpec(tuple, None, children)
    return pytree.TreeSpec(spec.type, spec.context, children)


def plain_structseq_outputs(ep: torch.export.ExportedProgram) -> None:
    """Give ``ep`` the output structure of its outputs with torch's named result tuples (``torch.return_types``:
    what ``torch.topk``, ``torch.sort``, ``torch.median(x, dim)`` return) as plain tuples, in place. executorch
    writes the output structure into the program and cannot name those types ("No registered serialization
    name for torch.return_types.topk" in ``to_executorch``); the program's outputs are the same tensors in
    the same order, the runtime returns them as a flat list either way."""
    for entry in ep.module_call_graph:
        signature = entry.signature
        if signature is not None:
            signature.out_spec = _plain_spec(signature.out_spec)


def _not_core_operator(ep: torch.export.ExportedProgram, error: Exception) -> UnsupportedOperatorError | None:
    """executorch's edge verifier refusing an operator (not core ATen, no decomposition, no MPS lowering)
    as one typed line naming the operator and its nodes; None for any other error."""
    found = re.search(r"Operator (?:torch\._ops\.)?(\S+) is not in Core ATen opset", str(error))
    if found is None:
        return None
    op = found.group(1)
    nodes = [n.name for n in ep.graph.nodes if n.op == "call_function" and str(n.target) == op]
    where = f" (node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)})" if nodes else ""
    return UnsupportedOperatorError(
        f"{op}{where}: no MPS lowering, and executorch cannot keep it on CPU either (not core ATen and no "
        "decomposition: its edge verifier refuses it). Change the model"
    )


def make_static(ep: torch.export.ExportedProgram, example_inputs: Sequence[torch.Tensor]) -> torch.export.ExportedProgram:
    """The same program with every shape fixed to those of ``example_inputs``: a program exported
    with ``dynamic_shapes`` (e.g. a dynamic prompt length) is re-exported from its own module, so
    the MPS delegate, which compiles static shapes only, can take all of it as one partition."""
    symbolic = sorted(
        {
            str(d)
            for n in ep.graph.nodes
            if n.op == "placeholder"
            for d in getattr(n.meta.get("val"), "shape", ())
            if not isinstance(d, int)
        }
    )
    if symbolic:
        shapes = ", ".join(str(list(x.shape)) for x in example_inputs if isinstance(x, torch.Tensor))
        warnings.warn(f"dynamic dimensions {', '.join(symbolic)} made static: inputs {shapes}", MPSBackendWarning, stacklevel=2)
    return drop_unused_constants(torch.export.export(ep.module(), tuple(example_inputs), strict=False))


def release_export_caches() -> None:
    """Empty the two process-wide caches that keep an export's graphs alive after it ends: torch's
    fake-tensor dispatch cache (``FakeTensorMode.cache_clear``: its keys keep the arguments of each
    operator traced, once executorch has traced the delegate call the lowered module) and executorch's
    ``lru_cache`` of ``exir.backend.utils.is_same_node`` (it keeps the nodes it compared, so their
    graphs). Through the lowered module they hold the delegate's blob and the model's weights: 2.8 GiB
    after a 3B LLM export, which its self-check then ran beside. Called when an export ends, also on
    error."""
    from executorch.exir.backend.utils import is_same_node  # noqa: PLC0415
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    FakeTensorMode.cache_clear()
    is_same_node.cache_clear()


def _delegate_blobs(edge) -> list[bytes]:
    from executorch.exir.lowered_backend_module import get_lowered_submodules  # noqa: PLC0415

    blobs = []
    for _, lowered, _ in get_lowered_submodules(edge.exported_program().graph_module):
        if lowered.backend_id == "MPSBackend":
            blobs.append(lowered.processed_bytes)
    return blobs


def export_model(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    *,
    use_fp16: bool = True,
    progress: Callable[[str], None] | None = None,
    etrecord: bool = False,
    target_runtime: str | None = DEFAULT_TARGET,
    allow_missing_kernels: bool = False,
) -> ExportResult:
    """Export ``model`` to a .pte whose supported parts run on the MPS delegate. ``etrecord``: also
    generate executorch's ETRecord (``result.etrecord.save(path)``; the Inspector reads it).
    ``target_runtime``: the oldest executorch release the app's runtime may be (default 1.0, the oldest
    with the MPS delegate); an operator left on CPU that it has no kernel for raises
    :class:`~mps_backend.runtime_kernels.RuntimeCompatError` (a warning with ``allow_missing_kernels``;
    ``None`` skips the check)."""
    from executorch.exir import to_edge_transform_and_lower  # noqa: PLC0415

    say = progress or (lambda msg: None)
    seconds: dict[str, float] = {}

    def stage(name: str, fn):
        say(f"[{len(seconds) + 1}/3] {name} ...")
        t0 = time.perf_counter()
        out = fn()
        seconds[name] = time.perf_counter() - t0
        say(f"      {name} done in {seconds[name]:.2f}s")
        return out

    partitioner = MPSPartitioner(use_fp16=use_fp16)
    # no_grad: an inference export. With grad mode on, a model whose buffers are updated in place from
    # values computed with grad-requiring weights (a KV cache) fails in to_executorch ("a leaf Variable
    # that requires grad is being used in an in-place operation"); the model itself is not modified.
    with torch.no_grad(), contextlib.ExitStack() as cleanup:
        cleanup.callback(release_export_caches)
        cleanup.enter_context(export_scope())  # torch's provenance shared, its operator census kept
        ep = stage("torch.export", lambda: export_program(model, example_inputs))
        if use_fp16:
            check_fp16_constants(ep)
        try:
            edge = stage(
                "lower to MPS",
                lambda: to_edge_transform_and_lower(
                    ep, partitioner=[partitioner], compile_config=edge_compile_config(), generate_etrecord=etrecord
                ),
            )
        except Exception as e:
            refusal = _not_core_operator(ep, e)
            if refusal is None:
                raise
            raise refusal from e
        check_cpu_reads(edge)
        blobs = _delegate_blobs(edge)
        # KV-cache row writes made in place (mps_backend.partitioner.backend_config)
        program = stage("to_executorch", lambda: edge.to_executorch(backend_config(edge)))
        check_kernels(program, target_runtime, warn_only=allow_missing_kernels)
        pte = program.buffer
    constant_bytes = sum(Header.from_bytes(b[:24]).segment_size for b in blobs)
    record = None
    if etrecord:
        record = program.get_etrecord()
        # the example inputs are what the Inspector's calculate_numeric_gap runs the reference graph on
        # (without them it fails inside the graph with "got None"); the same inputs make the ETDump
        record.update_representative_inputs([tuple(example_inputs)])
    return ExportResult(
        pte=pte,
        report=partitioner.report(),
        use_fp16=use_fp16,
        delegates=len(blobs),
        constant_bytes=constant_bytes,
        seconds=seconds,
        etrecord=record,
    )


@dataclass
class Verification:
    max_abs: float
    scale: float
    tolerance: float

    @property
    def relative(self) -> float:
        return self.max_abs / self.scale if self.scale else self.max_abs

    @property
    def ok(self) -> bool:
        return self.relative <= self.tolerance

    def __str__(self) -> str:
        verdict = "OK" if self.ok else "FAILED"
        return (
            f"verify: max abs error {self.max_abs:.3g}, relative to output scale {self.relative:.3g} "
            f"(tolerance {self.tolerance:g}) {verdict}"
        )


def bundle(
    pte: bytes, inputs: Sequence[Sequence[torch.Tensor]], outputs: Sequence[Sequence[torch.Tensor]], method: str = "forward"
) -> bytes:
    """A bundled program (``.bpte``): the program plus test cases (inputs and expected outputs), which
    an app checks on the device with executorch's bundled-program API
    (``load_bundled_input`` / ``verify_result_with_bundled_expected_output``)."""
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite  # noqa: PLC0415
    from executorch.devtools.bundled_program.core import BundledProgram  # noqa: PLC0415
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer  # noqa: PLC0415

    cases = [MethodTestCase(inputs=list(i), expected_outputs=list(o)) for i, o in zip(inputs, outputs)]
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/program.pte"
        with open(path, "wb") as f:
            f.write(pte)
        bundled = BundledProgram(None, [MethodTestSuite(method_name=method, test_cases=cases)], pte_file_path=path)
        return serialize_from_bundled_program_to_flatbuffer(bundled)


def unbundle(data: bytes) -> bytes:
    """The program inside a bundled program (``.bpte``), read by the project's bounded reader (no
    ``flatc``); a malformed bundle raises ``ProgramFormatError``. The program itself is not checked
    here: callers give it to ``mps_backend.runtime.program_check.check_program`` like any ``.pte``."""
    return bytes(read_bundled(data, ProgramFormatError)[0])


def is_bundled(data: bytes) -> bool:
    """Whether ``data`` is a bundled program (flatbuffer file identifier ``BP08`` at bytes 4-8)."""
    return data[4:8] == b"BP08"


def flat_outputs(out) -> list[torch.Tensor]:
    """The tensors of a model output (a tensor, or nested lists/tuples of them), in order."""
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flat_outputs(o)]
    return [out] if isinstance(out, torch.Tensor) else []


def compare(pte: bytes, model: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> tuple[float, float]:
    """(max |device - eager| over the finite values, max |eager|) across all outputs, running the .pte
    through the emulated MPS runtime. A different shape, NaN pattern or infinity makes the error
    infinite (Python's ``max(0.0, nan)`` would hide a NaN)."""
    with torch.no_grad():
        expected = flat_outputs(model(*inputs))
    got = runtime.run_pte(pte, list(inputs))
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs from the .pte, {len(expected)} from eager")
    max_abs, scale = 0.0, 0.0
    for g, e in zip(got, expected):
        g, e = g.float(), e.float()
        if g.shape != e.shape or not torch.equal(torch.isnan(g), torch.isnan(e)):
            return float("inf"), 1.0  # shape or NaN pattern differs
        finite = torch.isfinite(e) & torch.isfinite(g)
        if not torch.equal(g[~finite].nan_to_num(), e[~finite].nan_to_num()):
            return float("inf"), 1.0  # an inf where eager differs
        if finite.any():
            max_abs = max(max_abs, (g[finite] - e[finite]).abs().max().item())
            scale = max(scale, e[finite].abs().max().item())
    return max_abs, scale


def verify(pte: bytes, model: torch.nn.Module, inputs: Sequence[torch.Tensor], use_fp16: bool) -> Verification:
    """Run the .pte through the emulated MPS runtime and compare with eager PyTorch."""
    return Verification(*compare(pte, model, inputs), TOLERANCE[use_fp16])
