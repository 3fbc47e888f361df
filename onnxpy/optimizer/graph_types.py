"""What the optimizer can tell about a value without running anything: element types, static shapes, constants."""

from __future__ import annotations

import numpy as np

from .. import dtypes

_SAME_TYPE_OPS = {"Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Add", "Sub", "Mul", "Div", "Pow",
                  "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Slice", "Gather", "Concat",
                  "Identity", "Dropout", "Softmax", "LayerNormalization", "MatMul", "Gemm", "Conv", "Erf", "Clip",
                  "LeakyRelu", "Max", "Min", "ReduceMean", "ReduceSum", "Where", "Tile", "Pad", "Reciprocal",
                  "ReduceMax", "ReduceMin", "Resize", "MaxPool", "AveragePool", "GlobalAveragePool",
                  "BatchNormalization", "Selu", "Elu", "HardSigmoid", "Softplus", "Gelu", "Sin", "Cos", "Floor",
                  "Ceil", "Round", "CumSum", "Einsum", "GatherElements", "GatherND", "ScatterND", "Trilu",
                  "ConvTranspose", "HardSwish", "GlobalMaxPool", "LRN", "Sum", "Upsample", "InstanceNormalization",
                  "PRelu"}
_MS_SAME_TYPE_OPS = {"SkipLayerNormalization", "FastGelu", "BiasGelu", "Gelu", "QuickGelu", "MultiHeadAttention",
                     "FusedMatMul", "FusedGemm", "FusedConv", "Attention", "SkipSimplifiedLayerNormalization"}

def elem_types(g) -> dict:
    """value name -> ONNX element type, where it can be told without running anything."""
    out = {}
    for v in list(g.inputs) + list(g.outputs) + list(g.value_info.values()):
        if v.type is not None and v.type.kind == "tensor" and v.type.elem_type:
            out[v.name] = v.type.elem_type
    for k, a in g.initializers.items():
        if isinstance(a, np.ndarray) and a.dtype != object:
            try:
                out[k] = dtypes.from_numpy(a.dtype)
            except Exception:  # noqa: BLE001 - exotic dtype: type unknown
                pass
    for n in g.nodes:
        if not n.outputs or not n.outputs[0] or n.outputs[0] in out:
            continue
        if n.domain == "com.microsoft" and n.op_type in _MS_SAME_TYPE_OPS and n.inputs and n.inputs[0] in out:
            out[n.outputs[0]] = out[n.inputs[0]]
            continue
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type == "Split" and n.inputs and n.inputs[0] in out:
            for o in n.outputs:
                if o:
                    out[o] = out[n.inputs[0]]
            continue
        if n.op_type == "Cast" and isinstance(n.attrs.get("to"), int):  # Cast-1 may name the type as a string
            out[n.outputs[0]] = n.attrs["to"]
        elif n.op_type in ("Shape", "Size", "ArgMax", "ArgMin", "NonZero"):
            out[n.outputs[0]] = 7
        elif n.op_type == "QuantizeLinear":
            zp = n.inputs[2] if len(n.inputs) > 2 else ""
            out[n.outputs[0]] = out.get(zp) if zp else int(n.attrs.get("output_dtype", 0) or 2)
        elif n.op_type == "DequantizeLinear" and len(n.inputs) > 1 and n.inputs[1] in out:
            out[n.outputs[0]] = out[n.inputs[1]]
        elif n.op_type == "Where" and len(n.inputs) > 1 and n.inputs[1] in out:
            out[n.outputs[0]] = out[n.inputs[1]]
        elif n.op_type in _SAME_TYPE_OPS and n.inputs and n.inputs[0] in out:
            out[n.outputs[0]] = out[n.inputs[0]]
    return out


def static_shape(ctx, g, name):
    """The shape of ``name`` as a tuple of ints when it is fully known (initializer or declared type), else None."""
    a = g.initializers.get(name)
    if isinstance(a, np.ndarray):
        return tuple(a.shape)
    t = ctx.value_type(g, name)
    if t is None:
        for o in g.outputs:
            if o.name == name:
                t = o.type
    if t is None or t.kind != "tensor" or t.shape is None:
        return None
    if all(isinstance(d, int) and d >= 0 for d in t.shape):
        return tuple(t.shape)
    return None


def declared_dims(ctx, g, name):
    """The declared dims (int | str | None each) or None when the rank is unknown."""
    a = g.initializers.get(name)
    if isinstance(a, np.ndarray):
        return tuple(a.shape)
    t = ctx.value_type(g, name)
    if t is None or t.kind != "tensor" or t.shape is None:
        return None
    return tuple(t.shape)


def _const(g, name):
    v = g.initializers.get(name) if name else None
    return v if isinstance(v, np.ndarray) else None


def _ints(g, name):
    v = _const(g, name)
    return None if v is None or v.dtype.kind not in "iu" else [int(x) for x in v.reshape(-1)]


# ops whose output 0 has the rank of input 0
_SAME_RANK_OPS = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "BatchNormalization", "Dropout",
                  "Identity", "Concat", "LRN", "InstanceNormalization", "MaxPool", "AveragePool",
                  "GlobalAveragePool", "GlobalMaxPool", "Softmax", "Elu", "Selu", "HardSigmoid",
                  "HardSwish", "PRelu", "Sqrt", "Exp", "Neg", "Abs", "Pad", "Resize", "Upsample",
                  "LpNormalization", "Cast", "Erf"}


def value_ranks(ctx, g) -> dict:
    """value name -> rank, where it can be told statically: declared shapes, initializers, then forward through
    rank-preserving ops and convolutions (a convolution's output has its weight's rank)."""
    out = {}
    for v in list(g.inputs) + list(g.outputs) + list(g.value_info.values()):
        if v.type is not None and v.type.kind == "tensor" and v.type.shape is not None:
            out[v.name] = len(v.type.shape)
    for k, a in g.initializers.items():
        if isinstance(a, np.ndarray):
            out[k] = a.ndim
    for n in g.nodes:
        if not n.outputs or not n.outputs[0] or n.outputs[0] in out:
            continue
        if n.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        if n.op_type in ("Conv", "FusedConv", "ConvTranspose") and len(n.inputs) > 1 and n.inputs[1] in out:
            out[n.outputs[0]] = out[n.inputs[1]]
        elif n.op_type in _SAME_RANK_OPS and n.inputs and n.inputs[0] in out:
            out[n.outputs[0]] = out[n.inputs[0]]
        elif n.op_type in ("Add", "Sub", "Mul", "Div", "Sum", "Max", "Min") and n.inputs \
                and all(x in out for x in n.inputs if x):
            out[n.outputs[0]] = max(out[x] for x in n.inputs if x)
    return out
