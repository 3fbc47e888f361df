"""Speed fusions for CNNs (extended level, onnxruntime's names and replacement ops).

* ConvActivationFusion: Conv -> Relu / LeakyRelu / Clip (constant bounds) / Sigmoid / Tanh / HardSigmoid
  becomes com.microsoft.FusedConv(activation=..., activation_params=...): the activation runs in place on the
  convolution's output (one pass and one allocation fewer per layer).  Only float32 convolutions are fused, as in
  onnxruntime (so a model saved at this level still loads there).
* PadConvFusion (level 99): Pad (constant pads; zeros in constant mode) -> [Unsqueeze (constant axes)] -> 1-D Conv
  with a constant filter, each intermediate read by nothing else (silero-vad's reflection-padded STFT) becomes
  ai.onnxpy.PadConv, whose plan-time form gathers the convolution's columns straight from the unpadded input.
* GemmSumFusion (level 99): Add of two Gemms (alpha = beta = 1, no transA, the same transB, constant 2-D float32
  weights and 1-D biases of one length), each read only by the Add (an LSTM cell exported as primitives) becomes
  ai.onnxpy.GemmSum: one GEMM of the concatenated inputs with the weights stacked.
* ConvResidualFusion (level 99): Add / Sum of a Conv's output (constant 4-D float32 filter, no activation, read only
  by the Add) and another, non-constant float32 value, optionally followed by a Relu (a residual connection: ResNet's,
  ShuffleNet's, MobileNet's) becomes ai.onnxpy.ConvAdd, whose plan-time form accumulates the convolution straight into
  the residual when it dies there (BLAS beta = 1): the add costs no pass of its own.
* ConvShuffleFusion (level 99): a grouped 1x1 Conv / FusedConv (constant float filter, stride 1, no padding) ->
  Reshape (N, G, M/G, H, W) -> Transpose [0, 2, 1, 3, 4] -> Reshape (N, M, H, W), each read only by the next (a
  ShuffleNet channel shuffle over the conv's own G groups) becomes ai.onnxpy.ConvShuffle, whose plan-time form has
  each group's GEMM write straight to the shuffled channels.
"""

from __future__ import annotations

import numpy as np

from ..ir.model import Node
from ..ops._common import text
from .fusions import SweepPass, _is
from .graph_types import _const, _ints, elem_types

MS = "com.microsoft"
_FLOAT = 1
_F32_MAX = float(np.finfo(np.float32).max)


def _onnx_opset(ctx) -> int:
    return ctx.model.opsets.get("", ctx.model.opsets.get("ai.onnx", 1))


def _const_scalar(g, name):
    """The float value of a 1-element constant input, None when absent, False when not a constant."""
    if not name:
        return None
    v = g.initializers.get(name)
    if v is None or not isinstance(v, np.ndarray) or v.size != 1 or v.dtype.kind not in "fiu":
        return False
    return float(v.reshape(-1)[0])


def _activation(g, act, opset):
    """(activation name, activation_params) for a fusable activation node, or None."""
    op = act.op_type
    if op in ("Relu", "Sigmoid", "Tanh"):
        return op, []
    if op == "LeakyRelu":
        return op, [float(act.attrs.get("alpha", 0.01))]
    if op == "HardSigmoid":
        return op, [float(act.attrs.get("alpha", 0.2)), float(act.attrs.get("beta", 0.5))]
    if op == "Clip":
        if opset < 11:
            return op, [float(act.attrs.get("min", -_F32_MAX)), float(act.attrs.get("max", _F32_MAX))]
        lo = _const_scalar(g, act.inputs[1] if len(act.inputs) > 1 else "")
        hi = _const_scalar(g, act.inputs[2] if len(act.inputs) > 2 else "")
        if lo is False or hi is False:
            return None
        return op, [-_F32_MAX if lo is None else lo, _F32_MAX if hi is None else hi]
    return None


class ConvActivationFusion(SweepPass):
    name = "ConvActivationFusion"
    level = 2
    anchors = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Clip")

    def begin(self, g, ctx):
        return _onnx_opset(ctx), elem_types(g)

    def rewrite(self, act, m, g, ctx):
        opset, types = m.sweep
        if not act.inputs or not act.inputs[0] or len(act.outputs) != 1:
            return False
        conv = m.producer(act.inputs[0])
        if not _is(conv, "Conv") or len(conv.outputs) != 1 or not m.single_use(conv.outputs[0]):
            return False
        if _FLOAT not in (types.get(conv.inputs[0]), types.get(conv.outputs[0]),
                          types.get(conv.inputs[1]) if len(conv.inputs) > 1 else None):  # (X and W share a type)
            return False
        spec = _activation(g, act, opset)
        if spec is None:
            return False
        name, params = spec
        attrs = dict(conv.attrs)
        attrs["activation"] = name
        if params:
            attrs["activation_params"] = params
        fused = Node("FusedConv", MS, list(conv.inputs), list(act.outputs), attrs,
                     ctx.fresh((conv.name or "conv") + "_fused"))
        g.nodes[g.nodes.index(act)] = fused
        g.nodes.remove(conv)
        return True


def _const_ints(g, name):
    """graph_types' integer constant for a 0-/1-D one (a 2-D pads or axes tensor is left for the op to reject)."""
    v = _const(g, name)
    return _ints(g, name) if v is not None and v.ndim <= 1 else None


class PadConvFusion(SweepPass):
    name = "PadConvFusion"
    level = 99
    anchors = ("Conv",)

    def begin(self, g, ctx):
        return _onnx_opset(ctx)

    def rewrite(self, conv, m, g, ctx):
        opset = m.sweep
        ins = conv.inputs
        if len(ins) < 2 or not ins[0] or len(conv.outputs) != 1:
            return False
        w = g.initializers.get(ins[1])
        if not isinstance(w, np.ndarray) or w.ndim != 3 or w.dtype not in (np.float32, np.float64):
            return False
        if len(ins) > 2 and ins[2] and not isinstance(g.initializers.get(ins[2]), np.ndarray):
            return False
        src, unsq, axes = m.producer(ins[0]), None, []
        if _is(src, "Unsqueeze") and m.single_use(ins[0]) and len(src.outputs) == 1:
            unsq = src
            axes = (_const_ints(g, src.inputs[1]) if len(src.inputs) > 1 else None) if opset >= 13 else \
                [int(a) for a in src.attrs.get("axes", [])]
            if not axes:
                return False
            src = m.producer(src.inputs[0])
        pad = src
        if not _is(pad, "Pad") or len(pad.outputs) != 1 or not m.single_use(pad.outputs[0]) or not pad.inputs[0]:
            return False
        mode = text(pad.attrs.get("mode", "constant"))
        if opset >= 11:
            pads = _const_ints(g, pad.inputs[1]) if len(pad.inputs) > 1 else None
            value = _const_scalar(g, pad.inputs[2] if len(pad.inputs) > 2 else "")
            if pads is None or value is False or len(pad.inputs) > 3 and pad.inputs[3]:
                return False  # (Pad-18 axes: not fused)
        else:
            pads = [int(v) for v in pad.attrs.get("pads", [])]
            value = float(pad.attrs.get("value", 0.0))
        if not pads or mode == "constant" and value not in (None, 0.0):
            return False
        attrs = dict(conv.attrs)
        attrs.update(pad_mode=mode, pad_pads=pads, unsqueeze_axes=axes)
        fused = Node("PadConv", "ai.onnxpy", [pad.inputs[0]] + list(ins[1:]), list(conv.outputs), attrs,
                     ctx.fresh((conv.name or "conv") + "_padconv"))
        g.nodes[g.nodes.index(conv)] = fused
        g.nodes.remove(pad)
        if unsq is not None:
            g.nodes.remove(unsq)
        return True


def _plain_gemm(n, g):
    """(transB, output columns of the weight, bias length) of a Gemm alpha = beta = 1, transA = 0 with a constant 2-D
    float32 weight and 1-D bias, else None."""
    if not _is(n, "Gemm") or len(n.inputs) != 3 or len(n.outputs) != 1 or not all(n.inputs):
        return None
    a = n.attrs
    if float(a.get("alpha", 1.0)) != 1.0 or float(a.get("beta", 1.0)) != 1.0 or int(a.get("transA", 0)):
        return None
    w, c = g.initializers.get(n.inputs[1]), g.initializers.get(n.inputs[2])
    if not isinstance(w, np.ndarray) or not isinstance(c, np.ndarray) or w.dtype != np.float32 or w.ndim != 2 \
            or c.dtype != np.float32 or c.ndim != 1:
        return None
    t = int(a.get("transB", 0))
    return t, (w.shape[0] if t else w.shape[1]), c.shape[0]


class GemmSumFusion(SweepPass):
    name = "GemmSumFusion"
    level = 99
    anchors = ("Add",)

    def rewrite(self, add, m, g, ctx):
        if len(add.inputs) != 2 or len(add.outputs) != 1 or add.inputs[0] == add.inputs[1]:
            return False
        g1, g2 = m.producer(add.inputs[0]), m.producer(add.inputs[1])
        if g1 is None or g2 is None or g1 is g2 or not all(m.single_use(x) for x in add.inputs):
            return False
        s1, s2 = _plain_gemm(g1, g), _plain_gemm(g2, g)
        if s1 is None or s2 is None or s1[0] != s2[0] or not s1[1] == s1[2] == s2[1] == s2[2]:
            return False
        fused = Node("GemmSum", "ai.onnxpy", list(g1.inputs) + list(g2.inputs), list(add.outputs), {"transB": s1[0]},
                     ctx.fresh((add.name or "add") + "_gemmsum"))
        g.nodes[g.nodes.index(add)] = fused
        g.nodes.remove(g1)
        g.nodes.remove(g2)
        return True


def _const_filter(n, g, activation_ok):
    """The constant 4-D float32/float64 filter of a Conv (or a FusedConv without Z; with an activation only when
    ``activation_ok``) whose bias is constant or absent, else None."""
    if not (_is(n, "Conv") or n is not None and n.op_type == "FusedConv" and n.domain == MS
            and (activation_ok or n.attrs.get("activation") in (None, "", b""))):
        return None
    ins = n.inputs
    if len(n.outputs) != 1 or not 2 <= len(ins) <= 3 or not ins[0]:
        return None
    w = g.initializers.get(ins[1])
    if not isinstance(w, np.ndarray) or w.ndim != 4 or w.dtype not in (np.float32, np.float64):
        return None
    return w if len(ins) < 3 or not ins[2] or isinstance(g.initializers.get(ins[2]), np.ndarray) else None


def _plain_conv(n, g):
    """Whether ``n`` is a Conv (or a FusedConv without activation or Z) with a constant 4-D float32 filter and a
    constant or absent bias."""
    w = _const_filter(n, g, False)
    return w is not None and w.dtype == np.float32


class ConvResidualFusion(SweepPass):
    name = "ConvResidualFusion"
    level = 99
    anchors = ("Add", "Sum")

    def begin(self, g, ctx):
        return elem_types(g)

    def rewrite(self, add, m, g, ctx):
        types = m.sweep
        if len(add.inputs) != 2 or len(add.outputs) != 1 or add.inputs[0] == add.inputs[1] or not all(add.inputs):
            return False
        for y, z in (add.inputs, add.inputs[::-1]):
            conv = m.producer(y)
            # a constant z (x + 3 of a hard-swish) is no residual: it is never handed over, and left alone the
            # basic level's Conv+Add folding puts it into the bias
            if (_plain_conv(conv, g) and m.single_use(y) and types.get(y) == _FLOAT and types.get(z) == _FLOAT
                    and z not in g.initializers):
                break
        else:
            return False
        last, outs, act = add, list(add.outputs), ""
        nxt = m.cons.get(add.outputs[0], [])
        if len(nxt) == 1 and _is(nxt[0], "Relu") and len(nxt[0].outputs) == 1 and m.single_use(add.outputs[0]):
            last, outs, act = nxt[0], list(nxt[0].outputs), "Relu"
        attrs = {k: v for k, v in conv.attrs.items() if k not in ("activation", "activation_params")}
        attrs["activation"] = act
        ins = list(conv.inputs) + [""] * (3 - len(conv.inputs))
        fused = Node("ConvAdd", "ai.onnxpy", ins + [z], outs, attrs, ctx.fresh((conv.name or "conv") + "_residual"))
        g.nodes[g.nodes.index(last)] = fused
        g.nodes.remove(conv)
        if last is not add:
            g.nodes.remove(add)
        return True


def _grouped_pointwise(n, g):
    """(groups, output channels) of a Conv or FusedConv (no Z) with a constant 1x1 float filter, G >= 2 groups,
    stride 1, no padding or dilation and a constant or absent bias, else None."""
    w = _const_filter(n, g, True)
    if w is None or w.shape[2:] != (1, 1):
        return None
    a = n.attrs
    G = int(a.get("group", 1))
    pad = text(a.get("auto_pad", "NOTSET"))
    if (G < 2 or w.shape[0] % G or pad not in ("NOTSET", "VALID", "") or any(a.get("pads") or ())
            or any(int(v) != 1 for v in list(a.get("strides") or ()) + list(a.get("dilations") or ()))):
        return None
    return G, w.shape[0]


class ConvShuffleFusion(SweepPass):
    name = "ConvShuffleFusion"
    level = 99
    anchors = ("Reshape",)

    def begin(self, g, ctx):
        return _onnx_opset(ctx)

    def rewrite(self, r2, m, g, ctx):
        if m.sweep < 5 or len(r2.inputs) != 2 or len(r2.outputs) != 1 or int(r2.attrs.get("allowzero", 0)):
            return False
        t = m.producer(r2.inputs[0])
        if (not _is(t, "Transpose") or list(t.attrs.get("perm", ())) != [0, 2, 1, 3, 4]
                or not m.single_use(r2.inputs[0])):
            return False
        r1 = m.producer(t.inputs[0])
        if (not _is(r1, "Reshape") or len(r1.inputs) != 2 or int(r1.attrs.get("allowzero", 0))
                or not m.single_use(t.inputs[0])):
            return False
        conv = m.producer(r1.inputs[0])
        gm = _grouped_pointwise(conv, g)
        s1, s2 = _const_ints(g, r1.inputs[1]), _const_ints(g, r2.inputs[1])
        if gm is None or not m.single_use(r1.inputs[0]) or s1 is None or s2 is None or len(s1) != 5 or len(s2) != 4:
            return False
        G, M = gm
        if s1[1:3] != [G, M // G] or s2[1] not in (M, -1):  # (the channels split into the conv's own groups)
            return False
        attrs = dict(conv.attrs)
        attrs.update(shape1=s1, shape2=s2)
        fused = Node("ConvShuffle", "ai.onnxpy", list(conv.inputs), list(r2.outputs), attrs,
                     ctx.fresh((conv.name or "conv") + "_shuffle"))
        g.nodes[g.nodes.index(r2)] = fused
        for n in (conv, r1, t):
            g.nodes.remove(n)
        return True


SPEED_PASSES = [ConvActivationFusion(), PadConvFusion(), GemmSumFusion(), ConvResidualFusion(), ConvShuffleFusion()]

__all__ = ["SPEED_PASSES", "ConvActivationFusion", "ConvResidualFusion", "ConvShuffleFusion", "GemmSumFusion",
           "PadConvFusion"]
