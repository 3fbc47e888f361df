"""Basic-level (ORT_ENABLE_BASIC) redundancy eliminations and exact constant fusions, as onnxruntime's level-1
rewrite rules do them.  Every replacement is a standard ONNX op, so a model saved at BASIC loads anywhere.

* TransposeOptimizer: Transpose(Transpose(x)) with inverse perms -> x (composed into one Transpose otherwise);
  Transpose -> unary elementwise op -> inverse Transpose -> the op alone
* ReshapeFusion: Reshape(Reshape(x, s1), s2) -> Reshape(x, s2) (s2 constant, no 0 entries copying inner dims)
* UnsqueezeElimination: Squeeze(Unsqueeze(x, a), a) and Unsqueeze(Squeeze(x, a), a) -> x
* CastElimination: Cast to the type its input already has -> removed
* ExpandElimination: Expand whose result has the input's static shape -> removed
* EliminateSlice: Slice covering the whole tensor (starts 0, steps 1, ends past every dim) -> removed
* NoopElimination: x + 0, x - 0, x * 1, x / 1 with a scalar constant that cannot broadcast x -> x
* CommonSubexpressionElimination: nodes with the same op, domain, attributes and inputs computed once
  (random ops and nodes with subgraphs excluded)
* FuseReluClip: Clip(Relu(x), min, max) -> Clip(x, max(0, min), max)
* ConvAddFusion, ConvMulFusion, MatMulScaleFusion, ConstantFolding's shape part: see fusions_const.py
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..ir.model import Node
from .fusions import SweepPass, _is
from .fusions_const import (BatchNormAffineFusion, ConvAddFusion, ConvInputAffineFusion, ConvMulFusion,
                            MatMulScaleFoldFusion, ShapeFolding)
from .graph_types import _const, _ints, declared_dims, elem_types, static_shape
from .graph_utils import graph_output_names, rename_uses
from .passes import NONDETERMINISTIC, Pass

_UNARY_ELEMENTWISE = {"Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Erf", "LeakyRelu", "Elu",
                      "Selu", "HardSigmoid", "Softplus", "Softsign", "Ceil", "Floor", "Round", "Sign", "Reciprocal",
                      "Sin", "Cos", "Not", "IsNaN", "Gelu", "Celu", "ThresholdedRelu", "HardSwish", "Mish"}


# ------------------------------------------------------------------------------------------------------ helpers
def _attr_or_input_ints(g, n, attr, idx):
    """An int list given as attribute (old opsets) or constant input ``idx`` (new); None when neither/unknown."""
    if attr in n.attrs:
        return [int(x) for x in n.attrs[attr]]
    if len(n.inputs) > idx and n.inputs[idx]:
        return _ints(g, n.inputs[idx])
    return None


def _bypass(g, m, node, src) -> bool:
    """Remove single-output ``node`` so that its readers read ``src``; False when its output must stay visible."""
    dst = node.outputs[0]
    if dst in m.outs:
        return False
    g.nodes.remove(node)
    rename_uses(g, dst, src)
    return True


def _is_ms_or_onnx(n):
    return n.domain in ("", "ai.onnx")


# --------------------------------------------------------------------------------------------------- Transpose
class TransposeOptimizer(SweepPass):
    name = "TransposeOptimizer"
    level = 1
    anchors = ("Transpose",)

    def rewrite(self, t2, m, g, ctx):
        if "perm" not in t2.attrs:
            return False
        p2 = list(t2.attrs["perm"])
        mid = m.producer(t2.inputs[0])
        if _is(mid, "Transpose") and "perm" in mid.attrs:
            p1 = list(mid.attrs["perm"])
            if len(p1) != len(p2):
                return False
            comp = [p1[i] for i in p2]  # out[i] = x[p1[p2[i]]]
            if comp == list(range(len(comp))):
                return _bypass(g, m, t2, mid.inputs[0])
            if m.single_use(mid.outputs[0]):
                t2.inputs = [mid.inputs[0]]
                t2.attrs = dict(t2.attrs, perm=comp)
                g.nodes.remove(mid)
                return True
            return False
        # Transpose -> unary elementwise -> inverse Transpose
        if mid is None or mid.op_type not in _UNARY_ELEMENTWISE or not _is_ms_or_onnx(mid) \
                or len(mid.inputs) != 1 or len(mid.outputs) != 1 or not m.single_use(mid.outputs[0]):
            return False
        t1 = m.producer(mid.inputs[0])
        if not _is(t1, "Transpose") or "perm" not in t1.attrs or not m.single_use(t1.outputs[0]):
            return False
        p1 = list(t1.attrs["perm"])
        if len(p1) != len(p2) or [p1[i] for i in p2] != list(range(len(p2))):
            return False
        new = Node(mid.op_type, mid.domain, [t1.inputs[0]], [t2.outputs[0]], dict(mid.attrs), mid.name)
        g.nodes[g.nodes.index(t2)] = new
        g.nodes.remove(mid)
        g.nodes.remove(t1)
        return True


# ----------------------------------------------------------------------------------------------------- Reshape
class ReshapeFusion(SweepPass):
    name = "ReshapeFusion"
    level = 1
    anchors = ("Reshape",)

    def rewrite(self, r2, m, g, ctx):
        if len(r2.inputs) < 2:
            return False
        shape = _ints(g, r2.inputs[1])
        if shape is None:
            return False
        r1 = m.producer(r2.inputs[0])
        if _is(r1, "Reshape") and m.single_use(r1.outputs[0]):
            allow0 = r2.attrs.get("allowzero", 0)
            if 0 in shape and not allow0:
                return False  # a 0 copies a dim of the intermediate, not of x
            r2.inputs = [r1.inputs[0], r2.inputs[1]]
            g.nodes.remove(r1)
            return True
        # Reshape to the static shape x already has -> removed
        xs = static_shape(ctx, g, r2.inputs[0])
        return xs is not None and len(shape) == len(xs) and all(a == b for a, b in zip(shape, xs)) \
            and (0 not in shape or r2.attrs.get("allowzero", 0)) and _bypass(g, m, r2, r2.inputs[0])


# ------------------------------------------------------------------------------------------ Squeeze/Unsqueeze
class UnsqueezeElimination(SweepPass):
    name = "UnsqueezeElimination"
    level = 1
    anchors = ("Squeeze", "Unsqueeze")

    def rewrite(self, n2, m, g, ctx):
        inner = "Unsqueeze" if n2.op_type == "Squeeze" else "Squeeze"
        n1 = m.producer(n2.inputs[0])
        if not _is(n1, inner) or not m.single_use(n1.outputs[0]):
            return False
        a1, a2 = _attr_or_input_ints(g, n1, "axes", 1), _attr_or_input_ints(g, n2, "axes", 1)
        if not a1 or not a2:
            return False
        if any(a < 0 for a in a1 + a2):
            dims = declared_dims(ctx, g, n1.inputs[0])
            if dims is None:
                return False
            r = len(dims) + (len(a1) if inner == "Unsqueeze" else 0)
            a1 = [a + r if a < 0 else a for a in a1]
            a2 = [a + r if a < 0 else a for a in a2]
        return sorted(a1) == sorted(a2) and _bypass(g, m, n2, n1.inputs[0])


# ------------------------------------------------------------------------------------------- no-op eliminations
class CastElimination(SweepPass):
    name = "CastElimination"
    level = 1
    anchors = ("Cast",)

    def begin(self, g, ctx):
        return elem_types(g)

    def rewrite(self, n, m, g, ctx):
        if not isinstance(n.attrs.get("to"), int):
            return False
        src = n.inputs[0]
        # the input's type must come from a declaration, not from this Cast
        return m.sweep.get(src) == n.attrs["to"] and _bypass(g, m, n, src)


class ExpandElimination(SweepPass):
    name = "ExpandElimination"
    level = 1
    anchors = ("Expand",)

    def rewrite(self, n, m, g, ctx):
        if len(n.inputs) < 2:
            return False
        shape = _ints(g, n.inputs[1])
        xs = declared_dims(ctx, g, n.inputs[0])
        if shape is None or xs is None or len(shape) > len(xs):
            return False
        # result dims = broadcast(xs, shape): equal to xs when every shape entry is 1 or equals that dim
        ok = all(s == 1 or (isinstance(d, int) and s == d) for s, d in zip(shape[::-1], xs[::-1]))
        return ok and _bypass(g, m, n, n.inputs[0])


class EliminateSlice(SweepPass):
    name = "EliminateSlice"
    level = 1
    anchors = ("Slice",)

    def rewrite(self, n, m, g, ctx):
        big = (1 << 31) - 1
        if "starts" in n.attrs:
            starts, ends = list(n.attrs["starts"]), list(n.attrs["ends"])
            axes, steps = n.attrs.get("axes"), None
        else:
            starts, ends = _ints(g, n.inputs[1]), _ints(g, n.inputs[2])
            axes = _ints(g, n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] else None
            steps = _ints(g, n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] else None
            if (len(n.inputs) > 3 and n.inputs[3] and axes is None) or \
                    (len(n.inputs) > 4 and n.inputs[4] and steps is None):
                return False
        if starts is None or ends is None:
            return False
        if steps is not None and any(s != 1 for s in steps):
            return False
        dims = declared_dims(ctx, g, n.inputs[0])
        axes = list(axes) if axes is not None else list(range(len(starts)))
        for s, e, a in zip(starts, ends, axes):
            if s != 0:
                return False
            if e >= big:
                continue
            if dims is None:
                return False
            d = dims[a] if -len(dims) <= a < len(dims) else None
            if not (isinstance(d, int) and e >= d):
                return False
        return _bypass(g, m, n, n.inputs[0])


class NoopElimination(SweepPass):
    name = "NoopElimination"
    level = 1
    _NEUTRAL = {"Add": (0.0, True), "Sub": (0.0, False), "Mul": (1.0, True), "Div": (1.0, False)}
    anchors = tuple(_NEUTRAL)

    def begin(self, g, ctx):
        return elem_types(g)

    def rewrite(self, n, m, g, ctx):
        if len(n.inputs) != 2:
            return False
        neutral, commutes = self._NEUTRAL[n.op_type]
        for ci in ((1, 0) if commutes else (1,)):
            c = _const(g, n.inputs[ci])
            x = n.inputs[1 - ci]
            if c is None or c.size != 1 or c.dtype.kind not in "fiu" or float(c.reshape(-1)[0]) != neutral:
                continue
            xt = m.sweep.get(x)
            if xt is None or xt != dtypes.from_numpy(c.dtype):
                continue
            dims = declared_dims(ctx, g, x)
            if c.ndim > 0 and (dims is None or len(dims) < c.ndim):
                continue
            return _bypass(g, m, n, x)
        return False


# --------------------------------------------------------------------------------------------------------- CSE
def _hashable(v):
    if isinstance(v, np.ndarray):
        return ("nd", str(v.dtype), v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, float) and v != v:
        return ("nan",)
    try:
        hash(v)
        return v
    except TypeError:
        return ("repr", repr(v))


class CommonSubexpressionElimination(Pass):
    name = "CommonSubexpressionElimination"
    level = 1

    def apply(self, g, ctx):
        outs = graph_output_names(g) | ctx.protected
        seen: dict = {}
        mapping: dict = {}
        keep, done = [], 0
        for n in g.nodes:
            if mapping:
                n.inputs = [mapping.get(x, x) for x in n.inputs]
            if n.op_type in NONDETERMINISTIC or n.subgraphs() or not n.outputs \
                    or n.op_type in ("If", "Loop", "Scan"):
                keep.append(n)
                continue
            key = (n.op_type, n.domain, tuple(n.inputs), len(n.outputs),
                   tuple(sorted((k, _hashable(v)) for k, v in n.attrs.items())))
            first = seen.get(key)
            if first is not None and not any(o in outs for o in n.outputs if o) \
                    and all(b or not a for a, b in zip(n.outputs, first.outputs)):
                for a, b in zip(n.outputs, first.outputs):
                    if a:
                        mapping[a] = b
                done += 1
                continue
            if first is None:
                seen[key] = n
            keep.append(n)
        if done:
            g.nodes[:] = keep
            for n in g.nodes:
                for sub in n.subgraphs():
                    for a, b in mapping.items():
                        rename_uses(sub, a, b)
        return done


# ---------------------------------------------------------------------------------------------------- Relu+Clip
class FuseReluClip(SweepPass):
    name = "FuseReluClip"
    level = 1
    anchors = ("Clip",)

    def begin(self, g, ctx):
        return elem_types(g)

    def rewrite(self, clip, m, g, ctx):
        relu = m.producer(clip.inputs[0])
        if not _is(relu, "Relu") or not m.single_use(relu.outputs[0]):
            return False
        if not self._new_style(ctx):
            lo = float(clip.attrs.get("min", -3.4028234663852886e38))
            clip.attrs = dict(clip.attrs, min=max(0.0, lo))
        else:
            mn = clip.inputs[1] if len(clip.inputs) > 1 else ""
            if mn:
                c = _const(g, mn)
                if c is None or c.size != 1:
                    return False
                val = np.maximum(c, np.zeros((), c.dtype)).astype(c.dtype)
            else:
                t = m.sweep.get(clip.inputs[0]) or m.sweep.get(relu.inputs[0])
                if t is None:
                    return False
                val = np.zeros((), dtypes.to_numpy(t))
            name = ctx.fresh((mn or clip.outputs[0]) + "_relu_min")
            g.initializers[name] = val
            ins = list(clip.inputs) + [""] * (3 - len(clip.inputs))
            ins[1] = name
            clip.inputs = ins if ins[2] else ins[:2]
        clip.inputs = [relu.inputs[0]] + clip.inputs[1:]
        g.nodes.remove(relu)
        return True

    @staticmethod
    def _new_style(ctx):
        return ctx.model.opsets.get("", ctx.model.opsets.get("ai.onnx", 11)) >= 11


MISC_PASSES: list = [
    CommonSubexpressionElimination(), ShapeFolding(), CastElimination(), ExpandElimination(), EliminateSlice(),
    UnsqueezeElimination(), NoopElimination(), ReshapeFusion(), TransposeOptimizer(), FuseReluClip(),
    ConvAddFusion(), ConvMulFusion(), BatchNormAffineFusion(), ConvInputAffineFusion(), MatMulScaleFoldFusion(),
]

__all__ = ["MISC_PASSES", "elem_types", "static_shape", "declared_dims"]
