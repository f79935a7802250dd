"""What a loop over one delegate would take (issue #46 item 3; docs/device-cost.md, "One delegate in a loop"):
the facts of torch 2.14 and executorch 1.5.1 the analysis rests on, on a toy decode step (a C-row linear layer
writing its rows into a cache buffer, ``torch.scan`` over the call's chunks). If one of them changes (a body
allowed to write its buffer in place, carries aliased instead of copied, a body's weights lowered as
constants of its delegate), this fails and the analysis is to be redone.

1. executorch refuses a scan body that writes the cache buffer in place (its graph must be functional), so the
   cache has to be a carry;
2. executorch's emitter copies a carry whole at the loop's start and after every iteration (``aten::copy_``),
   and the body's functional ``index_put`` writes a whole new cache: (6 + 4k) cache sizes moved on the CPU for
   k iterations;
3. a delegate lowered inside the body (executorch's ``to_backend`` recurses into it once a partitioner tags it)
   runs in executorch's runtime, once per iteration, equal to eager; but it takes the body's weights as inputs,
   not as constants of its blob, which the MPS runtime of 1.0-1.4 cannot take safely (#36's analysis).
"""

from __future__ import annotations

import pytest
import torch

C, D, CACHE = 4, 8, 16


def _toy(in_place: bool) -> torch.nn.Module:
    from torch._higher_order_ops.scan import scan

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(CACHE, D))
            self.w = torch.nn.Linear(D, D)

        def forward(self, chunks: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            if in_place:

                def body(i, rows):
                    y = torch.relu(self.w(rows))
                    self.cache.index_put_((torch.arange(C) + i,), y)
                    return i + C, y.clone()

                _, ys = scan(body, pos.clone(), chunks)
                return ys

            def body(carry, rows):
                i, cache = carry
                y = torch.relu(self.w(rows))
                cache = cache.index_put((torch.arange(C) + i,), y)
                return (i + C, cache), (y + cache.sum(0)).clone()

            (_, cache), ys = scan(body, (pos.clone(), self.cache.clone()), chunks)
            self.cache.copy_(cache)
            return ys

    torch.manual_seed(0)
    model = Step().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _export(model):
    k = torch.export.Dim("k", min=1, max=CACHE // C)
    with torch.no_grad():
        return torch.export.export(model, (torch.randn(2, C, D), torch.tensor(0)), dynamic_shapes=({0: k}, None))


def test_a_scan_body_cannot_write_the_cache_in_place():
    from executorch.exir import to_edge_transform_and_lower

    ep = _export(_toy(in_place=True))
    assert ep.graph_signature.buffers_to_mutate == {}  # the write is inside the body, not the program's
    with pytest.raises(Exception, match="copy_.default' is not functional"):
        to_edge_transform_and_lower(ep)


def _instructions(buffer: bytes) -> list[tuple[str, list]]:
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(buffer)
    plan = getattr(program, "program", program).execution_plan[0]
    out = []
    for ins in plan.chains[0].instructions:
        args = ins.instr_args
        if type(args).__name__ == "KernelCall":
            op = plan.operators[args.op_index]
            out.append((f"{op.name}.{op.overload}" if op.overload else op.name, list(args.args)))
        else:
            out.append((type(args).__name__, []))
    return out


def test_the_emitter_copies_a_carried_cache_whole_every_iteration():
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    prog = to_edge_transform_and_lower(_export(_toy(in_place=False))).to_executorch(ExecutorchBackendConfig())
    names = [name for name, _ in _instructions(prog.buffer)]
    loop_start = names.index("aten::select_copy.int_out")  # the iteration's chunk: the loop's first instruction
    jump = names.index("JumpFalseCall")
    body = names[loop_start:jump]
    # the cache carry: initialised by a copy, written whole by the body's functional index_put, copied back
    assert names[:loop_start].count("aten::copy_") == 2  # both carries (the position and the cache)
    assert "aten::index_put.out" in body and body.count("aten::copy_") == 2
    assert names[jump + 1 :].count("aten::copy_") == 1  # the final carry into the cache buffer
    assert "executorch_prim::et_copy_index.tensor" in body


def test_a_delegate_in_the_body_runs_each_iteration_but_takes_its_weights_as_inputs():
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.backend.partitioner import PartitionResult
    from executorch.exir.graph_module import get_control_flow_submodules
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    from mps_backend import MPSPartitioner
    from mps_backend.partitioner import _Support, default_registry
    from mps_backend.runtime import LoadedMethod

    class BodyPartitioner(MPSPartitioner):
        """MPSPartitioner, and the supported nodes of each control-flow body tagged as well."""

        def partition(self, ep):
            result = super().partition(ep)
            tags = dict(result.partition_tags)
            for _, body, _ in get_control_flow_submodules(ep.graph_module):
                support = _Support(default_registry(), {})
                for part in CapabilityBasedPartitioner(body, support, allows_single_node_partition=True).propose_partitions():
                    tag = f"mps_{len(tags)}"
                    tags[tag] = self.delegation_spec
                    for node in part.nodes:
                        node.meta["delegation_tag"] = tag
            return PartitionResult(tagged_exported_program=ep, partition_tags=tags)

    model = _toy(in_place=False)
    edge = to_edge_transform_and_lower(_export(model), partitioner=[BodyPartitioner(use_fp16=False)])
    gm = edge.exported_program().graph_module
    lowered = [(name, m) for name, m in gm.named_modules() if type(m).__name__ == "LoweredBackendModule"]
    in_body = [m for name, m in lowered if "." in name]  # submodule_0.lowered_module_0
    assert len(in_body) == 1
    specs = in_body[0].original_module.graph_signature.input_specs
    kinds = {s.kind.name for s in specs}
    assert kinds == {"USER_INPUT"} and len(specs) >= 4  # the weight and bias among them: no PARAMETER, no constant
    assert in_body[0].original_module.constants == {} and in_body[0].original_module.state_dict == {}
    pte = edge.to_executorch(ExecutorchBackendConfig()).buffer
    names = [name for name, _ in _instructions(pte)]
    body = names[names.index("aten::select_copy.int_out") : names.index("JumpFalseCall")]
    assert body.count("DelegateCall") == 1
    for n in (1, 2, 3):
        got = LoadedMethod(pte, "forward")([x := torch.randn(n, C, D), torch.tensor(0)])[0]
        with torch.no_grad():
            model.cache.zero_()
            want = model(x, torch.tensor(0))
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-5), n


@pytest.mark.parametrize("flow", ["scan", "cond"])
def test_a_model_with_control_flow_exports_its_bodies_on_cpu(flow):
    """``MPSPartitioner`` on a program whose ``scan`` or ``cond`` bodies hold supported operators (a linear
    layer): before, executorch refused the program (the partitioner kept ``aten.linear`` whole everywhere but
    tagged the top graph only: "was not decomposed or delegated"); now the bodies are decomposed and run on
    CPU, each of their nodes in the report with the reason, the top graph's supported nodes delegated, and
    the program's outputs equal eager in executorch's runtime."""
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    from mps_backend import MPSPartitioner
    from mps_backend.partitioner import BODY_REASON
    from mps_backend.runtime import LoadedMethod

    if flow == "scan":
        model = _toy(in_place=False)
        ep = _export(model)
        inputs = [[torch.randn(n, C, D), torch.tensor(0)] for n in (1, 3)]
    else:

        class Branches(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = torch.nn.Linear(D, D), torch.nn.Linear(D, D)

            def forward(self, x):
                x = torch.tanh(x) * 3.0  # supported, in the top graph
                return torch.cond(x.sum() > 0, lambda t: self.a(t), lambda t: torch.relu(self.b(t)), (x,))

        torch.manual_seed(0)
        model = Branches().eval()
        for p in model.parameters():
            p.requires_grad_(False)
        with torch.no_grad():
            ep = torch.export.export(model, (torch.randn(2, D),))
        inputs = [[torch.randn(2, D) + 2.0], [torch.randn(2, D) - 2.0]]  # both branches taken
    partitioner = MPSPartitioner(use_fp16=False)
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    report = partitioner.report()
    body = [n for n in report.on_cpu if n.reason == BODY_REASON.format(op=flow)]
    assert any("addmm" in n.target or "linear" in n.target for n in body), str(report)
    assert report.partitions >= 1 and report.delegated, str(report)
    pte = edge.to_executorch(ExecutorchBackendConfig()).buffer
    for args in inputs:
        got = LoadedMethod(pte, "forward")(args)[0]
        with torch.no_grad():
            if flow == "scan":
                model.cache.zero_()
            want = model(*args)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
