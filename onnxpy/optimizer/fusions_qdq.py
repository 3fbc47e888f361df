"""QDQ fusions (extended level, onnxruntime's ``QDQSelectorActionTransformer``): QuantizeLinear/DequantizeLinear
node units around an op become the op's quantized form, so a QDQ model runs on integers:

* DQ(x), DQ(w), [DQ(int32 b)] -> Conv -> Q           -> QLinearConv
* DQ(a), DQ(b) -> MatMul -> Q                        -> QLinearMatMul
* DQ(a), DQ(b) -> MatMul (float result kept)         -> com.microsoft.MatMulIntegerToFloat
* DQ(a), DQ(b) -> Add / Mul -> Q                     -> com.microsoft.QLinearAdd / QLinearMul
* DQ(a), DQ(b), [DQ(int32 c)] -> Gemm -> [Q]         -> com.microsoft.QGemm
* DQ -> Reshape/Transpose/Squeeze/Unsqueeze/Flatten/Slice/Gather/Expand/Tile/MaxPool/Concat -> Q with the same
  scale and zero point -> the op on the integer tensor (Q and DQ dropped)

Only uint8/int8 per-tensor activations with constant scales/zero points are fused (weights may be per-channel
along the axis the target op allows).  Skipped entirely when the session config has
``session.disable_quant_qdq`` = "1" (read from ``ctx.options`` / ``ctx.config``).
"""

from __future__ import annotations

import numpy as np

from ..ir.model import Node
from .fusions import MS, SweepPass, _is
from .graph_types import elem_types

_Q8 = (2, 3)  # uint8, int8
_NP8 = {2: np.uint8, 3: np.int8}


def qdq_disabled(ctx) -> bool:
    cfg = getattr(ctx, "config", None)
    if cfg is None:
        opts = getattr(ctx, "options", None)
        cfg = getattr(opts, "_config", None) or {}
    return str(cfg.get("session.disable_quant_qdq", "0")).strip() == "1"


class _Unit:
    """A DequantizeLinear feeding the op: quantized input, scale, zero point (names; zp may be synthesized)."""

    def __init__(self, node, q, scale, zp, qtype, axis, per_channel):
        self.node, self.q, self.scale, self.zp, self.qtype = node, q, scale, zp, qtype
        self.axis, self.per_channel = axis, per_channel


class _QDQBase(SweepPass):
    name = "QDQSelectorActionTransformer"
    level = 2

    def _dq(self, g, m, types, name, allow_per_channel=False):
        n = m.producer(name)
        if not _is(n, "DequantizeLinear") or int(n.attrs.get("block_size", 0) or 0):
            return None
        scale = g.initializers.get(n.inputs[1])
        zp_name = n.inputs[2] if len(n.inputs) > 2 else ""
        zp = g.initializers.get(zp_name) if zp_name else None
        if scale is None or (zp_name and zp is None) or scale.dtype != np.float32:
            return None
        qtype = types.get(n.inputs[0])
        if qtype not in _Q8 or (zp is not None and zp.dtype != _NP8[qtype]):
            return None
        per_channel = scale.size != 1 or scale.ndim > 1
        if per_channel and (not allow_per_channel or scale.ndim != 1):
            return None
        if zp is not None and zp.shape != scale.shape:
            return None
        return _Unit(n, n.inputs[0], n.inputs[1], zp_name, qtype, int(n.attrs.get("axis", 1)), per_channel)

    def _q(self, g, m, types, name):
        """The QuantizeLinear that is the only reader of float ``name`` (per-tensor, 8-bit)."""
        if not m.single_use(name):
            return None
        n = m.cons[name][0]
        if not _is(n, "QuantizeLinear") or n.inputs[0] != name or int(n.attrs.get("block_size", 0) or 0):
            return None
        scale = g.initializers.get(n.inputs[1])
        zp_name = n.inputs[2] if len(n.inputs) > 2 else ""
        zp = g.initializers.get(zp_name) if zp_name else None
        if scale is None or scale.size != 1 or scale.dtype != np.float32 or (zp_name and zp is None):
            return None
        qtype = types.get(n.outputs[0])
        if qtype not in _Q8 or (zp is not None and (zp.dtype != _NP8[qtype] or zp.size != 1)):
            return None
        if int(n.attrs.get("saturate", 1)) != 1:
            return None
        return _Unit(n, n.outputs[0], n.inputs[1], zp_name, qtype, 1, False)

    @staticmethod
    def _zp(g, ctx, u, shape=()):
        """The unit's zero-point name, creating a zero initializer when the Q/DQ had none."""
        if u.zp:
            return u.zp
        name = ctx.fresh(u.q + "_zero_point")
        g.initializers[name] = np.zeros(shape, _NP8[u.qtype])
        return name

    def begin(self, g, ctx):
        return elem_types(g)  # refreshed in place after each fusion (see _retype)

    needs = frozenset(("DequantizeLinear",))  # every rewrite starts from a DequantizeLinear feeding the op

    def apply(self, g, ctx):
        if qdq_disabled(ctx):
            return 0
        return super().apply(g, ctx)

    @staticmethod
    def _retype(g, types):
        types.clear()
        types.update(elem_types(g))


def _same_qparams(g, a: _Unit, b: _Unit) -> bool:
    if a.qtype != b.qtype:
        return False
    sa, sb = g.initializers[a.scale], g.initializers[b.scale]
    if sa.size != 1 or sb.size != 1 or float(sa.reshape(-1)[0]) != float(sb.reshape(-1)[0]):
        return False
    za = int(g.initializers[a.zp].reshape(-1)[0]) if a.zp else 0
    zb = int(g.initializers[b.zp].reshape(-1)[0]) if b.zp else 0
    return za == zb


class QDQDropMovement(_QDQBase):
    """DQ -> data-movement op -> Q with equal quantization parameters: the op runs on the integers."""

    OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Gather", "Expand", "Tile",
           "MaxPool", "Concat", "GatherElements", "DepthToSpace", "SpaceToDepth"}

    def wants(self, op):
        return op.domain in ("", "ai.onnx") and op.op_type in self.OPS

    def rewrite(self, op, m, g, ctx):
        types = m.sweep
        if len([o for o in op.outputs if o]) != 1 or (op.op_type == "MaxPool" and len(op.outputs) > 1):
            return False
        q = self._q(g, m, types, op.outputs[0])
        if q is None:
            return False
        data_idx = range(len(op.inputs)) if op.op_type == "Concat" else [0]
        units = [self._dq(g, m, types, op.inputs[i]) for i in data_idx]
        if any(u is None or not _same_qparams(g, u, q) for u in units):
            return False
        if op.op_type == "MaxPool" and (ctx.model.opsets.get("", 0) < 12 or
                                         float(g.initializers[q.scale].reshape(-1)[0]) <= 0):
            return False
        ins = list(op.inputs)
        for i, u in zip(data_idx, units):
            ins[i] = u.q
        g.nodes[g.nodes.index(q.node)] = Node(op.op_type, op.domain, ins, [q.q], dict(op.attrs), op.name)
        g.nodes.remove(op)
        return True


class QDQFusion(_QDQBase):
    """Conv / MatMul / Add / Mul / Gemm node units -> QLinear* / MatMulIntegerToFloat / QGemm."""

    def wants(self, op):
        return op.domain in ("", "ai.onnx") and op.op_type in ("Conv", "MatMul", "Add", "Mul", "Gemm")

    def rewrite(self, op, m, g, ctx):
        if getattr(self, "_" + op.op_type.lower())(g, ctx, m, m.sweep, op):
            self._retype(g, m.sweep)
            return True
        return False

    def _bias_int32(self, g, m, name, a: _Unit, b: _Unit):
        """The int32 quantized bias behind DQ(name) with scale a_scale*b_scale and zero point 0, or None."""
        n = m.producer(name)
        if not _is(n, "DequantizeLinear"):
            return None
        bq = g.initializers.get(n.inputs[0])
        bs = g.initializers.get(n.inputs[1])
        if bq is None or bs is None or bq.dtype != np.int32:
            return None
        if len(n.inputs) > 2 and n.inputs[2]:
            zp = g.initializers.get(n.inputs[2])
            if zp is None or np.any(zp != 0):
                return None
        expect = (g.initializers[a.scale].astype(np.float32) * g.initializers[b.scale].astype(np.float32)).reshape(-1)
        got = bs.reshape(-1)
        if got.shape != expect.shape and got.size != 1 and expect.size != 1:
            return None
        if not np.allclose(got, expect, rtol=1e-6, atol=0):
            return None
        return n.inputs[0]

    def _conv(self, g, ctx, m, types, op):
        if len(op.inputs) < 2:
            return False
        x = self._dq(g, m, types, op.inputs[0])
        w = self._dq(g, m, types, op.inputs[1], allow_per_channel=True)
        q = self._q(g, m, types, op.outputs[0])
        if x is None or w is None or q is None or w.q not in g.initializers:
            return False
        if w.per_channel and (w.axis != 0 or g.initializers[w.scale].size != g.initializers[w.q].shape[0]):
            return False
        bias = ""
        if len(op.inputs) > 2 and op.inputs[2]:
            bias = self._bias_int32(g, m, op.inputs[2], x, w)
            if bias is None:
                return False
        wzp_shape = g.initializers[w.scale].shape
        ins = [x.q, x.scale, self._zp(g, ctx, x), w.q, w.scale, self._zp(g, ctx, w, wzp_shape), q.scale,
               self._zp(g, ctx, q)] + ([bias] if bias else [])
        g.nodes[g.nodes.index(q.node)] = Node("QLinearConv", "", ins, [q.q], dict(op.attrs),
                                              name=ctx.fresh("QLinearConv"))
        g.nodes.remove(op)
        return True

    def _matmul(self, g, ctx, m, types, op):
        a = self._dq(g, m, types, op.inputs[0])
        b = self._dq(g, m, types, op.inputs[1], allow_per_channel=True)
        if a is None or b is None:
            return False
        if b.per_channel:
            bq = g.initializers.get(b.q)
            if bq is None or bq.ndim != 2 or b.axis not in (1, -1) or g.initializers[b.scale].size != bq.shape[1]:
                return False
        q = self._q(g, m, types, op.outputs[0])
        bzp_shape = g.initializers[b.scale].shape
        if q is not None:
            if b.per_channel:
                return False  # keep to what QLinearMatMul accepts everywhere: per-tensor b
            ins = [a.q, a.scale, self._zp(g, ctx, a), b.q, b.scale, self._zp(g, ctx, b), q.scale,
                   self._zp(g, ctx, q)]
            g.nodes[g.nodes.index(q.node)] = Node("QLinearMatMul", "", ins, [q.q], {}, name=ctx.fresh("QLinearMatMul"))
            g.nodes.remove(op)
            return True
        ins = [a.q, b.q, a.scale, b.scale, self._zp(g, ctx, a), self._zp(g, ctx, b, bzp_shape)]
        g.nodes[g.nodes.index(op)] = Node("MatMulIntegerToFloat", MS, ins, list(op.outputs), {},
                                          name=ctx.fresh("MatMulIntegerToFloat"))
        return True

    def _binary(self, g, ctx, m, types, op, target):
        if len(op.inputs) != 2:
            return False
        a = self._dq(g, m, types, op.inputs[0])
        b = self._dq(g, m, types, op.inputs[1])
        q = self._q(g, m, types, op.outputs[0])
        if a is None or b is None or q is None or not (a.qtype == b.qtype == q.qtype):
            return False
        ins = [a.q, a.scale, self._zp(g, ctx, a), b.q, b.scale, self._zp(g, ctx, b), q.scale, self._zp(g, ctx, q)]
        g.nodes[g.nodes.index(q.node)] = Node(target, MS, ins, [q.q], {}, name=ctx.fresh(target))
        g.nodes.remove(op)
        return True

    def _add(self, g, ctx, m, types, op):
        return self._binary(g, ctx, m, types, op, "QLinearAdd")

    def _mul(self, g, ctx, m, types, op):
        return self._binary(g, ctx, m, types, op, "QLinearMul")

    def _gemm(self, g, ctx, m, types, op):
        if float(op.attrs.get("beta", 1.0)) != 1.0 and len(op.inputs) > 2 and op.inputs[2]:
            return False
        a = self._dq(g, m, types, op.inputs[0])
        b = self._dq(g, m, types, op.inputs[1], allow_per_channel=True)
        if a is None or b is None or a.qtype != 2 and b.qtype == 2:
            return False
        if b.per_channel:
            bq = g.initializers.get(b.q)
            n_axis = 0 if op.attrs.get("transB", 0) else 1
            if bq is None or bq.ndim != 2 or b.axis % 2 != n_axis or g.initializers[b.scale].size != bq.shape[n_axis]:
                return False
        c = ""
        if len(op.inputs) > 2 and op.inputs[2]:
            c = self._bias_int32(g, m, op.inputs[2], a, b)
            if c is None:
                return False
        q = self._q(g, m, types, op.outputs[0])
        bzp_shape = g.initializers[b.scale].shape
        ins = [a.q, a.scale, self._zp(g, ctx, a), b.q, b.scale, self._zp(g, ctx, b, bzp_shape), c]
        attrs = {k: op.attrs[k] for k in ("alpha", "transA", "transB") if k in op.attrs}
        if q is not None:
            ins += [q.scale, self._zp(g, ctx, q)]
            g.nodes[g.nodes.index(q.node)] = Node("QGemm", MS, ins, [q.q], attrs, name=ctx.fresh("QGemm"))
            g.nodes.remove(op)
        else:
            while ins and not ins[-1]:
                ins.pop()
            g.nodes[g.nodes.index(op)] = Node("QGemm", MS, ins, list(op.outputs), attrs, name=ctx.fresh("QGemm"))
        return True


QDQ_PASSES: list = [QDQDropMovement(), QDQFusion()]

__all__ = ["QDQ_PASSES", "qdq_disabled"]
