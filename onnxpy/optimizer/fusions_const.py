"""Basic-level exact constant fusions (onnxruntime's level-1 rules): per-channel Add/Mul folded into a Conv or
into an inference BatchNormalization, a constant scale folded into a MatMul's weight, and the shape part of constant
folding (Shape of static dims)."""

from __future__ import annotations

import numpy as np

from ..ops._common import text
from .fusions import SweepPass, _is
from .graph_types import _const, declared_dims, value_ranks
from .graph_utils import consumers, graph_output_names
from .passes import Pass


# ------------------------------------------------------------------------------------------- Conv/MatMul consts
def _per_channel(c, out_rank, channels):
    """``c`` (a constant broadcast against a (N, C, spatial...) tensor) as a length-C vector, or None."""
    if c.ndim > out_rank:
        return None
    if c.size == 1:
        return np.full(channels, c.reshape(-1)[0], c.dtype)
    shp = (1,) * (out_rank - c.ndim) + tuple(c.shape)
    if shp[1] != channels or any(d != 1 for i, d in enumerate(shp) if i != 1):
        return None
    return c.reshape(-1)


class _ConvConst(SweepPass):
    op = "Add"

    def wants(self, node):
        return _is(node, self.op)

    def rewrite(self, n, m, g, ctx):
        if len(n.inputs) != 2:
            return False
        conv = m.producer_of(n.inputs, "Conv")
        if conv is None or not m.single_use(conv.outputs[0]):
            return False
        cname = m.other_input(n, conv.outputs[0])
        c, w = _const(g, cname), _const(g, conv.inputs[1])
        b = _const(g, conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if c is None or w is None or (len(conv.inputs) > 2 and conv.inputs[2] and b is None):
            return False
        if w.dtype.kind != "f" or c.dtype != w.dtype:
            return False
        vec = _per_channel(c, w.ndim, w.shape[0])
        if vec is None:
            return False
        b0 = b if b is not None else np.zeros(w.shape[0], w.dtype)
        if self.op == "Add":
            w2, b2 = None, (b0 + vec).astype(w.dtype)
        else:
            w2 = (w * vec.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
            b2 = (b0 * vec).astype(w.dtype) if b is not None else None
        ins = [conv.inputs[0], conv.inputs[1]]
        if w2 is not None:
            ins[1] = ctx.fresh(conv.inputs[1] + "_" + self.op.lower())
            g.initializers[ins[1]] = w2
        if b2 is not None:
            bn = ctx.fresh((conv.inputs[2] if b is not None else conv.outputs[0] + "_B") + "_" + self.op.lower())
            g.initializers[bn] = b2
            ins.append(bn)
        conv.inputs = ins
        conv.outputs = [n.outputs[0]]
        g.nodes.remove(n)
        return True


class ConvAddFusion(_ConvConst):
    name = "ConvAddFusion"
    level = 1
    op = "Add"


class ConvMulFusion(_ConvConst):
    name = "ConvMulFusion"
    level = 1
    op = "Mul"


class BatchNormAffineFusion(SweepPass):
    """BatchNormalization (inference, constant parameters) -> Mul / Add by a per-channel or scalar constant ->
    one BatchNormalization with scale*c, B*c (Mul) or B+c (Add): the same affine map per channel, one pass fewer
    (caffe2-style exports put an affine Mul/Add after every BatchNorm)."""

    name = "BatchNormAffineFusion"
    level = 1
    anchors = ("Mul", "Add")

    def begin(self, g, ctx):
        return value_ranks(ctx, g)

    def rewrite(self, n, m, g, ctx):
        if len(n.inputs) != 2:
            return False
        bn = m.producer_of(n.inputs, "BatchNormalization")
        if bn is None or len(bn.inputs) != 5 or any(o for o in bn.outputs[1:]) or not m.single_use(bn.outputs[0]):
            return False
        if int(bn.attrs.get("training_mode", 0) or 0) or "spatial" in bn.attrs and not int(bn.attrs["spatial"]):
            return False
        params = [_const(g, x) for x in bn.inputs[1:]]
        c = _const(g, m.other_input(n, bn.outputs[0]))
        if c is None or any(p is None for p in params):
            return False
        scale, bias = params[0], params[1]
        if scale.dtype.kind != "f" or scale.dtype.itemsize < 4 or c.dtype != scale.dtype or bias.dtype != c.dtype:
            return False
        rank = m.sweep.get(bn.inputs[0])
        if c.size == 1 and c.ndim <= 1:
            rank = rank or 2  # a scalar never changes BN's (rank >= 2) output shape
        if rank is None or rank < 2 or scale.ndim != 1:
            return False
        vec = _per_channel(c, rank, scale.shape[0])
        if vec is None:
            return False
        if n.op_type == "Mul":
            scale, bias = (scale * vec).astype(c.dtype), (bias * vec).astype(c.dtype)
        else:
            bias = (bias + vec).astype(c.dtype)
        ins = list(bn.inputs)
        for i, arr in ((1, scale), (2, bias)):
            if arr is not params[i - 1]:
                ins[i] = ctx.fresh(bn.inputs[i] + "_" + n.op_type.lower())
                g.initializers[ins[i]] = arr
        bn.inputs = ins
        bn.outputs = [n.outputs[0]] + list(bn.outputs[1:])
        g.nodes.remove(n)
        return True


class ConvInputAffineFusion(SweepPass):
    """Mul(x, a) -> Add(b) (either or both; a, b scalar or per-input-channel constants) -> Conv without padding ->
    Conv(x) with W*a and B + sum(W*b): an unpadded convolution of an affine map of its input is the convolution of
    the input with rescaled weights plus a constant per output channel (PP-OCR's learnable affine blocks).  Padded
    convolutions are left alone: their zero padding would see the shifted values."""

    name = "ConvInputAffineFusion"
    level = 1
    anchors = ("Conv",)

    def rewrite(self, conv, m, g, ctx):
        if len(conv.inputs) < 2 or len(conv.outputs) != 1:
            return False
        w = _const(g, conv.inputs[1])
        b0 = _const(g, conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
        if w is None or w.dtype.kind != "f" or w.dtype.itemsize < 4 or (len(conv.inputs) > 2 and conv.inputs[2]
                                                                          and b0 is None):
            return False
        auto_pad = text(conv.attrs.get("auto_pad", "NOTSET"))
        if auto_pad not in ("NOTSET", "VALID") or any(int(p) for p in conv.attrs.get("pads", []) or []):
            return False
        group = int(conv.attrs.get("group", 1))
        M, Cg = w.shape[:2]
        C = Cg * group
        if group < 1 or M % group:
            return False
        vecs, src, chain = {}, conv.inputs[0], []
        for op in ("Add", "Mul"):  # walking up from the Conv: x * a + b
            node = m.producer(src)
            if not (_is(node, op) and len(node.inputs) == 2 and m.single_use(src)):
                continue
            other = next((x for x in node.inputs if _const(g, x) is not None), None)
            if other is None:
                continue
            c = _const(g, other)
            vecs[op] = _per_channel(c, w.ndim, C)
            if vecs[op] is None or c.dtype != w.dtype:
                return False
            chain.append(node)
            src = m.other_input(node, other)
        if not chain:
            return False
        shift, a = vecs.get("Add"), vecs.get("Mul")
        wg = w.reshape(group, M // group, Cg, -1).astype(np.float64)
        w2, bias = wg, np.zeros(M, np.float64) if b0 is None else b0.astype(np.float64)
        if shift is not None:
            bias = bias + (wg * shift.astype(np.float64).reshape(group, 1, Cg, 1)).sum(axis=(2, 3)).reshape(M)
        if a is not None:
            w2 = wg * a.astype(np.float64).reshape(group, 1, Cg, 1)
        wn = ctx.fresh(conv.inputs[1] + "_affine")
        g.initializers[wn] = w2.reshape(w.shape).astype(w.dtype)
        ins = [src, wn]
        if b0 is not None or shift is not None:
            bn = ctx.fresh((conv.inputs[2] if b0 is not None else conv.outputs[0] + "_B") + "_affine")
            g.initializers[bn] = bias.astype(w.dtype)
            ins.append(bn)
        conv.inputs = ins
        for n in chain:
            g.nodes.remove(n)
        return True


class MatMulScaleFoldFusion(SweepPass):
    """MatMul(x, const W) -> Mul(c) / Div(c) with c constant over the output's last dim only -> MatMul(x, W*c)."""

    name = "MatMulScaleFusion"
    level = 1
    anchors = ("Mul", "Div")

    def rewrite(self, n, m, g, ctx):
        if len(n.inputs) != 2:
            return False
        cands = [n.inputs[0]] if n.op_type == "Div" else list(n.inputs)
        mm = m.producer_of(cands, "MatMul")
        if mm is None or not m.single_use(mm.outputs[0]):
            return False
        cname = m.other_input(n, mm.outputs[0])
        c, w = _const(g, cname), _const(g, mm.inputs[1])
        if c is None or w is None or w.ndim != 2 or w.dtype.kind != "f" or c.dtype != w.dtype:
            return False
        if w.dtype.itemsize < 4:  # float16: the folded product rounds differently from the Mul it replaces
            return False
        if c.size != 1 and (c.ndim > 2 or c.shape[-1] != w.shape[1] or c.size != w.shape[1]):
            return False
        if c.ndim == 2:
            dims = declared_dims(ctx, g, mm.inputs[0])
            if dims is None or len(dims) < 2:
                return False  # a 2-D c would raise the rank of a 1-D product
        vec = c.reshape(-1)
        if n.op_type == "Div":
            if np.any(vec == 0):
                return False
            w2 = (w / vec).astype(w.dtype)
        else:
            w2 = (w * vec).astype(w.dtype)
        if c.size == 1 and c.ndim > 0:
            dims = declared_dims(ctx, g, mm.inputs[0])
            if dims is None or len(dims) < c.ndim:
                return False
        wn = ctx.fresh(mm.inputs[1] + "_scaled")
        g.initializers[wn] = w2
        mm.inputs = [mm.inputs[0], wn]
        mm.outputs = [n.outputs[0]]
        g.nodes.remove(n)
        return True


# ----------------------------------------------------------------------------------------------- Shape folding
class ShapeFolding(Pass):
    """Part of constant folding: the value of Shape(x) (or of Gather over it) when x's declared dims are known."""

    name = "ConstantFolding"
    level = 1

    def apply(self, g, ctx):
        done = 0
        outs = graph_output_names(g) | ctx.protected
        cons = consumers(g)
        for n in list(g.nodes):
            if not _is(n, "Shape") or n.outputs[0] in outs:
                continue
            dims = declared_dims(ctx, g, n.inputs[0])
            if dims is None:
                continue
            r = len(dims)
            start, end = int(n.attrs.get("start", 0)), n.attrs.get("end")
            start = min(max(start + r if start < 0 else start, 0), r)
            end = r if end is None else int(end)
            end = min(max(end + r if end < 0 else end, 0), r)
            sel = list(dims[start:end])
            if all(isinstance(d, int) and d >= 0 for d in sel):
                g.initializers[n.outputs[0]] = np.array(sel, np.int64)
                g.nodes.remove(n)
                done += 1
                continue
            for gat in cons.get(n.outputs[0], []):
                if not _is(gat, "Gather") or gat.inputs[0] != n.outputs[0] or gat.attrs.get("axis", 0) != 0 \
                        or gat.outputs[0] in outs:
                    continue
                idx = _const(g, gat.inputs[1])
                if idx is None or idx.dtype.kind not in "iu":
                    continue
                flat = idx.reshape(-1).astype(np.int64)
                if np.any(flat < -len(sel)) or np.any(flat >= len(sel)):
                    continue
                vals = [sel[int(i)] for i in flat]
                if all(isinstance(d, int) and d >= 0 for d in vals):
                    g.initializers[gat.outputs[0]] = np.array(vals, np.int64).reshape(idx.shape)
                    g.nodes.remove(gat)
                    done += 1
        return done
