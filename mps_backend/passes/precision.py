"""The precision pass: the device dtype of every float value, from the policy
(:class:`mps_backend.precision.Precision`), recorded as ``node.meta[DEVICE_DTYPE]``; casts inserted where
a node reads a value of another device dtype (every node then sees one dtype), and matmuls read in
float32 rescaled. Runs last among the lowering passes (``backend.build_graph``); the builder declares
each value in the dtype recorded here.

In float16 mode (``Precision.FP16``), in this order:

1. **Device dtypes, forward.** A float value is float16, except (``float32_islands``):
   - a float32 value the program computes from a float16 -> float32 cast, or from another such value
     (the model's own float32 parts: transformers' RMSNorm statistics, softmax, SiLU ...);
   - the results of norm statistics (``native_layer_norm``, ``native_group_norm``, batch statistics,
     ``var``/``var_mean``, ``linalg_vector_norm``, and the mean or sum of a square with what is computed
     from it at its reduced shape, up to the product that normalizes) and of ``_softmax`` /
     ``_log_softmax``: float32 in any program (their float16 results would overflow where ``|x| > 255``
     is squared);
2. **Residual, backward** (``float32_residual``): a float16 value a float32 node reads is computed in
   float32 when it comes from an elementwise or data-movement op (add, mul, view, cast ...), and so on
   backward; it stops at matmuls, lookups, reductions, constants and inputs. A value the model casts
   down on purpose (``.to(float16)``) and that a float32 node reads again is then not rounded.
3. **Constants and inputs**: a float32 constant or user input whose every reader computes in float32
   stays float32 (a norm's weight, ``eps``); any other float32 one is stored (or boundary-cast) float16;
   float16 ones stay float16.
4. **Casts** (after step 5's scaling): where a node reads a float value of another device dtype than
   the one it computes in, a cast node (``aten._to_copy``, its device dtype the reader's) is inserted,
   one per value and dtype.
5. **Rescaled matmuls** (``rescale_exponent = k > 0``, before the casts): a float16
   ``mm``/``bmm``/``addmm``/``linear`` whose result is only read in float32 (through views) reads its
   activation (and bias) times ``2**-k`` (both operands when both are computed, neither a weight nor
   a state buffer such as a KV cache, nor a KV cache with a chunk's new keys concatenated: attention's
   ``q @ k^T`` in an encoder), the activation's
   elementwise producers computed in float32 first (``silu(gate) * up`` is scaled before it is
   rounded to float16); after the casts, the float32 cast of its result is multiplied back
   (``2**k``, ``2**2k``). Exact (powers of two) in float16's normal range; activations and results
   up to ``65504 * 2**k`` no longer overflow. Except **float32 scores**: a product of two computed
   operands that a softmax reads directly (through views: attention's ``q @ k^T`` in an encoder) and that
   is larger than its operands together is computed in float32, its operands cast up: the softmax's
   float32 input is written either way, and the float16 product would add its float16 copy, written and
   read (Whisper-tiny's encoder: 1392.8 -> 1151.6 MiB a 30-second window in the device cost model). With
   an elementwise op between (a scale, a mask) it stays rescaled: that op reads the float16 product.

In float32 mode nothing is recorded: every value keeps its traced dtype. ``Precision.FP16_UNIFORM``
records nothing either: every float32 value defaults to float16.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from executorch.exir.passes import dim_order_ops_registry  # noqa: F401  (defines torch.ops.dim_order_ops)
from torch.export import ExportedProgram
from torch.fx import Node

from mps_backend.precision import DEVICE_DTYPE, PRECISION_INSERTED, Precision

from ._graph import constant_tensor, edge_op, target_of

aten = torch.ops.aten
_f16, _f32 = torch.float16, torch.float32

CASTS = frozenset({aten._to_copy.default, torch.ops.dim_order_ops._to_dim_order_copy.default})
#: ops computed in float32 in float16 mode: norm statistics and softmax
STATISTICS = frozenset(
    {
        aten.native_layer_norm.default,
        aten.native_group_norm.default,
        aten._native_batch_norm_legit.no_stats,
        aten._softmax.default,
        aten._log_softmax.default,
        aten.var.correction,
        aten.var_mean.correction,
        aten.linalg_vector_norm.default,
    }
)
_REDUCTIONS = frozenset({aten.mean.dim, aten.mean.default, aten.sum.dim_IntList, aten.sum.default})
#: elementwise ops a statistic's reduced value goes through before it normalizes (eps, rsqrt ...)
_STAT_ELEMENTWISE = frozenset(
    {
        aten.add.Tensor,
        aten.add.Scalar,
        aten.sub.Tensor,
        aten.mul.Tensor,
        aten.mul.Scalar,
        aten.div.Tensor,
        aten.div.Scalar,
        aten.rsqrt.default,
        aten.sqrt.default,
        aten.reciprocal.default,
        aten.pow.Tensor_Scalar,
        aten.clamp.default,
        aten.maximum.default,
    }
)
#: ops the residual widening passes back through: elementwise arithmetic and data movement
WIDENABLE = frozenset(
    {
        aten.add.Tensor,
        aten.add.Scalar,
        aten.sub.Tensor,
        aten.sub.Scalar,
        aten.mul.Tensor,
        aten.mul.Scalar,
        aten.div.Tensor,
        aten.div.Scalar,
        aten.neg.default,
        aten.view_copy.default,
        aten.alias_copy.default,
        aten.clone.default,
        torch.ops.dim_order_ops._clone_dim_order.default,
        aten.squeeze_copy.dims,
        aten.squeeze_copy.dim,
        aten.squeeze_copy.default,
        aten.unsqueeze_copy.default,
        aten.permute_copy.default,
        aten.slice_copy.Tensor,
        aten.select_copy.int,
        aten.expand_copy.default,
        aten.cat.default,
        *CASTS,
    }
)
MATMULS = frozenset({aten.mm.default, aten.bmm.default, aten.addmm.default, aten.linear.default})
#: views a matmul's result goes through to its float32 cast (rescaling passes them unchanged)
_VIEWS = frozenset(
    {
        aten.view_copy.default,
        aten.squeeze_copy.dims,
        aten.squeeze_copy.dim,
        aten.squeeze_copy.default,
        aten.unsqueeze_copy.default,
        aten.permute_copy.default,
        aten.alias_copy.default,
    }
)
#: ops that take part of their first argument or repeat it (a KV cache read through them stays a cache)
_TAKES = frozenset({aten.expand_copy.default, aten.slice_copy.Tensor, aten.select_copy.int, aten.clone.default})
#: ops whose first tensor argument gives only a shape (its data is never read: no cast for it)
_SHAPE_ONLY_FIRST = frozenset(
    {aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, aten.copy.default}
)


def _traced(node: Any) -> torch.dtype | None:
    """The float dtype of a node's float results (the first float member of a tuple), else None."""
    v = node.meta.get("val") if isinstance(node, Node) else None
    for t in v if isinstance(v, (tuple, list)) else (v,):
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            return t.dtype
    return None


def _tensor_args(node: Node) -> list[Node]:
    """The fx nodes ``node`` reads (flattened args and kwargs, in order, each once)."""
    seen: dict[Node, None] = {}

    def visit(a: Any) -> None:
        if isinstance(a, Node):
            seen.setdefault(a, None)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)

    visit(node.args)
    visit(list(node.kwargs.values()))
    return list(seen)


def _float_operands(node: Node) -> list[Node]:
    """The float tensors ``node`` computes with (not a shape-only first argument)."""
    args = _tensor_args(node)
    if target_of(node) in _SHAPE_ONLY_FIRST and node.args and isinstance(node.args[0], Node):
        args = [a for a in args if a is not node.args[0]]
    return [a for a in args if isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dtype.is_floating_point]


def _is_square(node: Any) -> bool:
    if not isinstance(node, Node) or node.op != "call_function":
        return False
    t = target_of(node)
    if t is aten.pow.Tensor_Scalar:
        return node.args[1] == 2
    return t is aten.mul.Tensor and len(node.args) >= 2 and node.args[0] is node.args[1]


def _numel(node: Node) -> int | None:
    v = node.meta.get("val")
    return v.numel() if isinstance(v, torch.Tensor) else None


class _Assignment:
    def __init__(self, ep: ExportedProgram, precision: Precision):
        self.ep, self.p = ep, precision
        self.graph = ep.graph
        self.dtype: dict[Node, torch.dtype] = {}  # device dtype of each float node's results
        self.deliberate: set[Node] = set()  # float32 the model computes on purpose (from an upcast)
        self.statistic: set[Node] = set()  # reduced values of a norm statistic
        self.counts = {"float32 values": 0, "widened": 0, "casts": 0, "rescaled matmuls": 0, "float32 scores": 0}
        #: placeholder -> whether it holds a constant (``_from_constant`` asks for each of a matmul's operands:
        #: ``constant_tensor`` rebuilds torch's tables of every input at each call, 2/3 of a 135M model's export)
        self.constant: dict[Node, bool] = {}

    # ---- 1. forward -----------------------------------------------------------------------------
    def forward(self) -> None:
        squares = {
            n.args[0]
            for n in self.graph.nodes
            if n.op == "call_function" and target_of(n) in _REDUCTIONS and _is_square(n.args[0])
        }
        for node in self.graph.nodes:
            traced = _traced(node)
            if node.op == "placeholder":
                if traced is not None:
                    self.dtype[node] = self.p.default_dtype(traced)  # decided in constants_and_inputs
                continue
            if node.op != "call_function":
                continue
            operands = _float_operands(node)
            target = target_of(node)
            if target is operator.getitem:
                src = node.args[0]
                if traced is not None and src in self.dtype:
                    self.dtype[node] = self.dtype[src]
                    if src in self.statistic:
                        self.statistic.add(node)
                continue
            compute = self._forward_dtype(node, target, traced, operands, squares)
            if compute is not None:
                self.dtype[node] = compute

    def _forward_dtype(self, node, target, traced, operands, squares) -> torch.dtype | None:
        """The dtype ``node`` computes its float values in (for a node without float results, that
        of its float operands), and its marks."""
        if traced is None and not operands:
            return None
        if not self.p.float32_islands:
            return self.p.default_dtype(traced or _f32)
        if target in CASTS and traced == _f32 and operands and operands[0].meta["val"].dtype in (_f16, torch.bfloat16):
            self.deliberate.add(node)
            return _f32
        if traced == _f32 and any(a in self.deliberate for a in operands):
            self.deliberate.add(node)
            return _f32
        if target in STATISTICS or node in squares:
            if target not in (aten._softmax.default, aten._log_softmax.default, aten.native_layer_norm.default):
                self.statistic.add(node)
            return _f32
        if target in _REDUCTIONS and _is_square(node.args[0]):
            self.statistic.add(node)
            return _f32
        stats = [a for a in operands if a in self.statistic]
        if stats and target in _STAT_ELEMENTWISE:
            if _numel(node) == max(_numel(a) or 0 for a in stats):
                self.statistic.add(node)  # still the reduced statistic (+ eps, rsqrt ...)
            return _f32  # the product that normalizes: float32, its readers cast it down
        if traced is None:  # no float result (a comparison ...): the operands' common dtype
            return _f32 if any(self.dtype.get(a) == _f32 for a in operands) else self.p.default_dtype(_f32)
        return self.p.default_dtype(traced)

    # ---- 2. residual, backward ------------------------------------------------------------------
    def widen(self) -> None:
        self._widen([n for n, d in self.dtype.items() if d == _f32 and n.op == "call_function"])

    def _widen(self, work: list[Node]) -> None:
        while work:
            node = work.pop()
            for a in self._reads(node):
                if self.dtype.get(a) != _f16 or a.op != "call_function" or target_of(a) not in WIDENABLE:
                    continue
                if _traced(a) is None:
                    continue
                self.dtype[a] = _f32
                self.counts["widened"] += 1
                work.append(a)

    def _reads(self, node: Node) -> list[Node]:
        if target_of(node) is operator.getitem:
            return []
        return _float_operands(node)

    # ---- 3. constants and inputs ----------------------------------------------------------------
    def constants_and_inputs(self) -> None:
        for node in self.graph.nodes:
            if node.op != "placeholder" or _traced(node) != _f32 or not node.users:
                continue
            if all(self._reads_as(user) == _f32 for user in node.users):
                self.dtype[node] = _f32

    def _reads_as(self, user: Node) -> torch.dtype | None:
        """The dtype ``user`` reads its float operands in (a cast reads any: None, but float32 when it
        computes in float32, e.g. a model's ``.to(float16)`` of a float32 input widened into the residual)."""
        if user.op != "call_function":
            return None
        if target_of(user) in CASTS:
            return _f32 if self.dtype.get(user) == _f32 else None
        return self.dtype.get(user)

    # ---- 4. casts -------------------------------------------------------------------------------
    def insert_casts(self) -> None:
        made: dict[tuple[Node, torch.dtype], Node] = {}
        for node in list(self.graph.nodes):
            if node.op != "call_function" or target_of(node) in CASTS or target_of(node) is operator.getitem:
                continue
            want = self.dtype.get(node)
            if want is None:
                continue
            for a in _float_operands(node):
                have = self.dtype.get(a, self.p.default_dtype(a.meta["val"].dtype))
                if have == want:
                    continue
                cast = made.get((a, want))
                if cast is None:
                    cast = self._cast_after(a, want)
                    made[(a, want)] = cast
                node.replace_input_with(a, cast)

    def _cast_after(self, a: Node, dtype: torch.dtype) -> Node:
        anchor = a if a.op != "placeholder" else next(n for n in self.graph.nodes if n.op != "placeholder")
        with self.graph.inserting_after(a) if a.op != "placeholder" else self.graph.inserting_before(anchor):
            cast = self.graph.call_function(
                edge_op(self._any_call(), aten._to_copy.default), (a,), {"dtype": a.meta["val"].dtype}
            )
        cast.meta = {k: v for k, v in a.meta.items() if k in ("val", "stack_trace", "nn_module_stack")}
        cast.meta[DEVICE_DTYPE] = dtype
        cast.meta[PRECISION_INSERTED] = True
        self.dtype[cast] = dtype
        self.counts["casts"] += 1
        return cast

    def _any_call(self) -> Node:
        return next(n for n in self.graph.nodes if n.op == "call_function")

    # ---- 5. rescaled matmuls --------------------------------------------------------------------
    def _read_in_float32(self, mm: Node) -> bool:
        """Every reader of ``mm``'s result (through float16 views) computes in float32."""
        work = list(mm.users)
        while work:
            user = work.pop()
            if user.op != "call_function":
                return False
            if self.dtype.get(user) == _f32:
                continue
            if target_of(user) in _VIEWS and self.dtype.get(user) == _f16:
                work.extend(user.users)
                continue
            return False
        return bool(mm.users)

    def prescale(self) -> None:
        """Before the casts: each float16 matmul read only in float32 reads its activation (and bias)
        times ``2**-k``; the activation's elementwise producers are computed in float32 first (so a
        large product such as ``silu(gate) * up`` is scaled before it is rounded to float16)."""
        k = self.p.rescale_exponent
        self.rescaled: list[tuple[Node, int]] = []
        if not k:
            return
        for mm in list(self.graph.nodes):
            if mm.op != "call_function" or target_of(mm) not in MATMULS or self.dtype.get(mm) != _f16:
                continue
            if not self._read_in_float32(mm):
                continue
            target = target_of(mm)
            if target is aten.addmm.default:  # addmm(bias, m1, m2): the bias and the activation
                scaled = [0, self._activation(mm.args[1], mm.args[2], 1)]
            elif target is aten.linear.default:  # linear(x, w, bias?)
                scaled = [0] + ([2] if len(mm.args) > 2 and isinstance(mm.args[2], Node) else [])
            else:  # scale the computed operands: never a weight or a state buffer (a KV cache) read whole
                computed = [i for i in (0, 1) if not self._from_constant(mm.args[i]) and not self._stored(mm.args[i])]
                if len(computed) == 2 and self._float32_scores(mm):
                    continue
                scaled = computed if len(computed) == 2 else [self._activation(mm.args[0], mm.args[1], 0)]
            args = list(mm.args)
            if not all(isinstance(args[i], Node) for i in scaled):
                continue
            for i in scaled:
                a = args[i]
                if self.p.float32_residual and not self._from_constant(a):
                    self._widen_from(a)
                with self.graph.inserting_before(mm):
                    s = self.graph.call_function(edge_op(mm, aten.mul.Scalar), (a, 2.0**-k))
                s.meta = {"val": a.meta["val"], PRECISION_INSERTED: True}
                self.dtype[s] = self.dtype.get(a, self.p.default_dtype(a.meta["val"].dtype))
                args[i] = s
            mm.args = tuple(args)
            # the result carries 2**-k per scaled factor of the product (addmm's and linear's bias is a summand)
            factors = 2 if target in (aten.mm.default, aten.bmm.default) and len(scaled) == 2 else 1
            self.rescaled.append((mm, k * factors))

    def _float32_scores(self, mm: Node) -> bool:
        """A product of two computed operands that a softmax reads in float32 directly (through views:
        attention's ``q @ k^T`` in an encoder, its scale applied to q beforehand), larger than its operands
        together, is computed in float32 (True; its views with it). The softmax's float32 input is written
        anyway; a float16 product would add its float16 copy, written and read, and its multiply back
        (Whisper-tiny's encoder: 25.75 MiB twice per layer), and more rounding. With an elementwise op
        between (a scale, a mask) the float16 product stays: that op would read and write the float32
        product, where it reads the float16 one and writes float32 once. The operands are cast up (their
        elementwise producers widened under ``float32_residual``)."""
        size = _numel(mm) or 0
        if size <= sum(_numel(a) or 0 for a in mm.args[:2]):
            return False
        views, work, softmax = [], list(mm.users), False
        while work:
            user = work.pop()
            target = target_of(user)
            if target in (aten._softmax.default, aten._log_softmax.default):
                softmax = True
                continue
            if target not in _VIEWS or _numel(user) != size:
                return False
            views.append(user)
            work.extend(user.users)
        if not softmax:
            return False
        for n in (mm, *views):
            self.dtype[n] = _f32
        for a in mm.args[:2]:
            if self.p.float32_residual:
                self._widen_from(a)
        self.counts["float32 scores"] += 1
        return True

    def _widen_from(self, a: Node) -> None:
        if self.dtype.get(a) == _f16 and a.op == "call_function" and target_of(a) in WIDENABLE:
            self.dtype[a] = _f32
            self.counts["widened"] += 1
            self._widen([a])

    def rescale(self) -> None:
        """After the casts: the float32 cast of each rescaled matmul's result is multiplied by ``2**k``."""
        for mm, k in getattr(self, "rescaled", []):
            casts, work = [], list(mm.users)
            while work:
                user = work.pop()
                if target_of(user) in CASTS and self.dtype.get(user) == _f32:
                    casts.append(user)
                elif target_of(user) in _VIEWS and self.dtype.get(user) == _f16:
                    work.extend(user.users)
            for cast in casts:
                with self.graph.inserting_after(cast):
                    u = self.graph.call_function(edge_op(mm, aten.mul.Scalar), (cast, 2.0**k))
                # the matmul's debug handle goes to the product that holds its (unscaled) result
                u.meta = {"val": cast.meta["val"], PRECISION_INSERTED: True}
                if "debug_handle" in mm.meta:
                    u.meta["debug_handle"] = mm.meta["debug_handle"]
                self.dtype[u] = _f32
                cast.replace_all_uses_with(u, delete_user_cb=lambda user, u=u: user is not u)
            self.counts["rescaled matmuls"] += 1

    def _activation(self, a: Any, b: Any, first: int) -> int:
        """Index (``first`` or ``first + 1``) of the operand to scale: one not computed from constants
        alone (a weight, a dequantized weight), the smaller of two such."""
        const_a, const_b = self._from_constant(a), self._from_constant(b)
        if const_a != const_b:
            return first + 1 if const_a else first
        na, nb = _numel(a) or 0, _numel(b) or 0
        return first + 1 if nb < na else first

    def _stored(self, a: Any) -> bool:
        """``a`` is a placeholder (a state buffer, an input) seen through views and slices, or through a
        concatenation whose largest part it is (a KV cache and a chunk's new keys, read as one operand)."""
        while isinstance(a, Node) and a.op == "call_function":
            if target_of(a) in _VIEWS | _TAKES:
                a = a.args[0]
            elif target_of(a) is aten.cat.default and a.args[0]:
                a = max(a.args[0], key=lambda x: _numel(x) or 0)
            else:
                break
        return isinstance(a, Node) and a.op == "placeholder"

    def _from_constant(self, a: Any) -> bool:
        seen = 0
        while isinstance(a, Node) and seen < 16:
            if a.op == "placeholder":
                if a not in self.constant:
                    self.constant[a] = constant_tensor(self.ep, a) is not None
                return self.constant[a]
            args = _tensor_args(a)
            if a.op != "call_function" or not args:
                return False
            if not all(self._from_constant(x) for x in args[1:]):
                return False
            a, seen = args[0], seen + 1
        return False

    # ---- all ------------------------------------------------------------------------------------
    def record(self) -> None:
        for node, dtype in self.dtype.items():
            node.meta[DEVICE_DTYPE] = dtype
        self.counts["float32 values"] = sum(
            1 for n, d in self.dtype.items() if d == _f32 and n.op == "call_function" and _traced(n) is not None
        )


def assign_device_dtypes(ep: ExportedProgram, precision: Precision) -> dict[str, int]:
    """Record the device dtype of every float value of ``ep`` under ``precision`` (module doc), insert
    the casts and rescalings it needs; returns counts (float32 values, widened, casts, rescaled matmuls)."""
    if not precision.float16 or not precision.mixed:
        return {}
    a = _Assignment(ep, precision)
    a.forward()
    if precision.float32_residual:
        a.widen()
    a.prescale()
    a.constants_and_inputs()
    a.insert_casts()
    a.rescale()
    a.record()
    return a.counts


__all__ = ["CASTS", "MATMULS", "STATISTICS", "WIDENABLE", "assign_device_dtypes"]
