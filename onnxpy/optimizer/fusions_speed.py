"""Speed fusions for CNNs (extended level, onnxruntime's names and replacement ops).

* ConvActivationFusion: Conv -> Relu / LeakyRelu / Clip (constant bounds) / Sigmoid / Tanh / HardSigmoid
  becomes com.microsoft.FusedConv(activation=..., activation_params=...): the activation runs in place on the
  convolution's output (one pass and one allocation fewer per layer).  Only float32 convolutions are fused, as in
  onnxruntime (so a model saved at this level still loads there).
"""

from __future__ import annotations

import numpy as np

from ..ir.model import Node
from .fusions import SweepPass, _is
from .graph_types import elem_types

MS = "com.microsoft"
_FLOAT = 1
_F32_MAX = float(np.finfo(np.float32).max)


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
        return ctx.model.opsets.get("", ctx.model.opsets.get("ai.onnx", 1)), elem_types(g)

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


SPEED_PASSES = [ConvActivationFusion()]

__all__ = ["SPEED_PASSES", "ConvActivationFusion"]
