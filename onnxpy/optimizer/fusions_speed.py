"""Speed fusions for CNNs (extended level, onnxruntime's names and replacement ops).

* ConvActivationFusion: Conv -> Relu / LeakyRelu / Clip (constant bounds) / Sigmoid / Tanh / HardSigmoid
  becomes com.microsoft.FusedConv(activation=..., activation_params=...): the activation runs in place on the
  convolution's output (one pass and one allocation fewer per layer).  Only float32 convolutions are fused, as in
  onnxruntime (so a model saved at this level still loads there).
"""

from __future__ import annotations

import numpy as np

from ..ir.model import Node
from .fusions import _is, _Matcher
from .fusions_misc import elem_types
from .passes import Pass

MS = "com.microsoft"
_FLOAT = 1
_F32_MAX = float(np.finfo(np.float32).max)


# ops whose output 0 has the element type of input 0 (enough to type the activations of a CNN)
_SAME_TYPE = {"Conv", "ConvTranspose", "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish",
              "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN", "Add",
              "Sub", "Mul", "Div", "Sum", "Max", "Min", "Concat", "Reshape", "Flatten", "Transpose", "Squeeze",
              "Unsqueeze", "Pad", "Dropout", "Identity", "Softmax", "Resize", "Upsample", "Split", "Slice",
              "InstanceNormalization", "Elu", "Selu", "PRelu", "Gemm", "MatMul", "Neg", "Abs", "Sqrt", "Exp"}


def _types(g):
    """elem_types plus forward propagation through type-preserving ops (light models declare no value_info)."""
    out = elem_types(g)
    for n in g.nodes:
        same = n.op_type in _SAME_TYPE if n.domain in ("", "ai.onnx") else (n.domain == MS and n.op_type == "FusedConv")
        if same and n.inputs and n.inputs[0] in out:
            for o in n.outputs[:1] if n.op_type not in ("Split",) else n.outputs:
                if o and o not in out:
                    out[o] = out[n.inputs[0]]
    return out


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


class ConvActivationFusion(Pass):
    name = "ConvActivationFusion"
    level = 2

    def apply(self, g, ctx):
        opset = ctx.model.opsets.get("", ctx.model.opsets.get("ai.onnx", 1))
        m = None
        types = None
        done = 0
        for act in list(g.nodes):
            if act.domain not in ("", "ai.onnx") or act.op_type not in ("Relu", "Sigmoid", "Tanh", "LeakyRelu",
                                                                        "HardSigmoid", "Clip"):
                continue
            if not act.inputs or not act.inputs[0] or len(act.outputs) != 1:
                continue
            if m is None:
                m = _Matcher(g, ctx)
                types = _types(g)
            conv = m.producer(act.inputs[0])
            if not _is(conv, "Conv") or len(conv.outputs) != 1 or not m.single_use(conv.outputs[0]):
                continue
            if types.get(conv.inputs[0]) != _FLOAT and types.get(conv.outputs[0]) != _FLOAT:
                continue
            spec = _activation(g, act, opset)
            if spec is None:
                continue
            name, params = spec
            attrs = dict(conv.attrs)
            attrs["activation"] = name
            if params:
                attrs["activation_params"] = params
            fused = Node("FusedConv", MS, list(conv.inputs), list(act.outputs), attrs,
                         ctx.fresh((conv.name or "conv") + "_fused"))
            g.nodes[g.nodes.index(act)] = fused
            g.nodes.remove(conv)
            done += 1
            m = None
        return done


SPEED_PASSES = [ConvActivationFusion()]

__all__ = ["SPEED_PASSES", "ConvActivationFusion"]
