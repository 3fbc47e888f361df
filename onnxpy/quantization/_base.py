"""Shared machinery of the quantizers: the op-type tables, ``_Quantizer`` (op selection, weight quantization,
final graph clean-up) and ``_StaticQuantizer`` (calibrated activation parameters, bias quantization)."""

from __future__ import annotations

import numpy as np
import onnx

from .calibrate import TensorsData
from .graph import GraphState, topo_sort
from .quant_utils import (
    QuantType, add_domain, as_quant_type, compute_scale_zp, is_signed, onnx_opset, qrange, quantize_array, zp_array,
)

DYNAMIC_OPS = ("MatMul", "Gemm", "Conv", "Gather")
# ops whose output takes the input's quantization parameters (pure data movement / max)
SHARED_OPS = ("MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Resize", "Gather", "Slice",
              "Split", "Expand", "Identity", "SpaceToDepth", "DepthToSpace", "Tile", "Pad")
QDQ_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Mul", "Relu", "Clip", "MaxPool", "AveragePool",
           "GlobalAveragePool", "Concat", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Softmax",
           "Sigmoid", "LeakyRelu", "Resize", "Gather", "Slice", "Split", "Identity", "Pad")
QOPERATOR_OPS = ("Conv", "MatMul", "Gemm", "Add", "Mul", "Relu", "Clip", "MaxPool", "AveragePool", "GlobalAveragePool",
                 "Concat", "Sigmoid", "LeakyRelu", "Softmax", "Reshape", "Transpose", "Flatten", "Squeeze",
                 "Unsqueeze", "Resize", "Gather")
_REMOVABLE_ACT = ("Relu", "Clip")
_ACT_PRODUCERS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Mul")


class _Quantizer:
    def __init__(self, model: onnx.ModelProto, per_channel, reduce_range, weight_type, activation_type,
                 op_types, nodes_to_quantize, nodes_to_exclude, extra_options, supported_ops):
        self.model = model
        self.per_channel = bool(per_channel)
        self.reduce_range = bool(reduce_range)
        self.weight_type = as_quant_type(weight_type)
        self.activation_type = as_quant_type(activation_type)
        self.extra = dict(extra_options or {})
        ops = list(op_types) if op_types else list(supported_ops)
        unknown = [o for o in ops if not isinstance(o, str)]
        if unknown:
            raise TypeError(f"op_types_to_quantize must be op type names, got {unknown}")
        self.op_types = set(ops) & set(supported_ops)
        self.nodes_to_quantize = set(nodes_to_quantize or [])
        self.nodes_to_exclude = set(nodes_to_exclude or [])
        self.weight_symmetric = bool(self.extra.get(
            "WeightSymmetric", is_signed(self.weight_type)))
        self.activation_symmetric = bool(self.extra.get("ActivationSymmetric", False))
        self.state = GraphState(model)
        self.opset = onnx_opset(model)

    def selected(self, node) -> bool:
        if node.op_type not in self.op_types or node.domain not in ("", "ai.onnx"):
            return False
        if self.nodes_to_quantize and node.name not in self.nodes_to_quantize:
            return False
        return node.name not in self.nodes_to_exclude

    # weights ---------------------------------------------------------------------------------------------
    def weight_params(self, w: np.ndarray, qt: QuantType, axis: int | None, symmetric: bool, reduce_range: bool):
        qmin, qmax = qrange(qt, reduce_range, symmetric)
        w = w.astype(np.float32)
        if axis is None:
            rmin, rmax = (float(w.min()), float(w.max())) if w.size else (0.0, 0.0)
        else:
            moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
            rmin, rmax = moved.min(axis=1), moved.max(axis=1)
        scale, zp = compute_scale_zp(rmin, rmax, qmin, qmax, symmetric)
        q = quantize_array(w, scale, zp, qt, axis=axis, qmin=qmin, qmax=qmax)
        return q, scale, zp

    def quantize_weight(self, name: str, qt: QuantType, axis: int | None = None, symmetric=None,
                        reduce_range=None):
        """Quantized initializer plus scale / zero-point initializers; returns (q, s, zp) names."""
        key = (name, qt, axis, symmetric)
        cache = self.__dict__.setdefault("_wcache", {})
        if key in cache:
            return cache[key]
        w = self.state.const(name)
        sym = self.weight_symmetric if symmetric is None else symmetric
        rr = self.reduce_range if reduce_range is None else reduce_range
        if axis is not None:
            axis = axis % w.ndim
        q, scale, zp = self.weight_params(w, qt, axis, sym, rr)
        if axis is None:
            scale, zp = scale.reshape(()), zp.reshape(())
        out = (self.state.add_init(q, name + "_quantized"), self.state.add_init(scale, name + "_scale"),
               self.state.add_init(zp_array(zp, qt), name + "_zero_point"))
        cache[key] = out
        self.__dict__.setdefault("_wparams", {})[out[0]] = (scale, axis)
        return out

    def weight_scale(self, qname):
        return self._wparams[qname]

    def finish(self, nodes, domains=()):
        g = self.model.graph
        del g.node[:]
        g.node.extend(topo_sort(g, nodes))
        for d in domains:
            add_domain(self.model, d)
        # drop initializers that nothing uses any more
        used = set()
        from .graph import node_inputs

        for n in g.node:
            used.update(node_inputs(n))
        used.update(o.name for o in g.output)
        used.update(i.name for i in g.input)
        keep = [t for t in g.initializer if t.name in used]
        del g.initializer[:]
        g.initializer.extend(keep)
        # value_info of retyped tensors may be stale
        del g.value_info[:]
        return self.model


# ---------------------------------------------------------------------------------------------------- static


class _StaticQuantizer(_Quantizer):
    def __init__(self, model, tensors_range: TensorsData, per_channel, reduce_range, weight_type, activation_type,
                 op_types, nodes_to_quantize, nodes_to_exclude, extra_options, supported_ops):
        super().__init__(model, per_channel, reduce_range, weight_type, activation_type, op_types,
                         nodes_to_quantize, nodes_to_exclude, extra_options, supported_ops)
        self.ranges = tensors_range
        self.act_params: dict[str, tuple] = {}  # tensor -> (scale array, zp array)
        self.min_real_range = self.extra.get("MinimumRealRange")
        self.quantize_bias = bool(self.extra.get("QuantizeBias", True))
        self.no_output_quant = set(self.extra.get("OpTypesToExcludeOutputQuantization", []))

    def tensor_range(self, name):
        if name in self.ranges:
            td = self.ranges[name]
            lo, hi = td.range_value
            return float(lo), float(hi)
        return None

    def act_qparams(self, name, fixed_range=None):
        if name in self.act_params:
            return self.act_params[name]
        r = fixed_range or self.tensor_range(name)
        if r is None:
            return None
        qmin, qmax = qrange(self.activation_type, False, self.activation_symmetric)
        scale, zp = compute_scale_zp(r[0], r[1], qmin, qmax, self.activation_symmetric, self.min_real_range)
        self.act_params[name] = (scale.reshape(()), zp.reshape(()))
        return self.act_params[name]

    def fuse_removable_activations(self):
        """Drop a Relu / Clip(min=0) that follows a quantized op: saturation at the zero point does the same."""
        if self.extra.get("QDQKeepRemovableActivations", False):
            return
        st = self.state
        g = self.model.graph
        remove = []
        for node in g.node:
            if node.op_type not in _REMOVABLE_ACT or not self.selected(node):
                continue
            if node.op_type == "Clip":
                lo = None
                if len(node.input) > 1 and node.input[1]:
                    c = st.const(node.input[1])
                    lo = None if c is None else float(c)
                else:
                    for a in node.attribute:
                        if a.name == "min":
                            lo = a.f
                if lo != 0.0:
                    continue
                hi_in = node.input[2] if len(node.input) > 2 and node.input[2] else None
                if hi_in is not None and st.const(hi_in) is None:
                    continue
            x = node.input[0]
            prod = st.producer.get(x)
            if prod is None or prod.op_type not in _ACT_PRODUCERS or not self.selected(prod):
                continue
            r = self.tensor_range(node.output[0])
            # saturation only reproduces the activation when the output range starts at 0
            if len(st.consumers.get(x, [])) != 1 or x in st.graph_outputs or r is None or r[0] < 0 \
                    or self.activation_symmetric:
                continue
            for i, o in enumerate(prod.output):
                if o == x:
                    prod.output[i] = node.output[0]
            remove.append(node)
        if remove:
            ids = {id(n) for n in remove}
            keep = [n for n in g.node if id(n) not in ids]
            del g.node[:]
            g.node.extend(keep)
            st.refresh()

    def shared_output(self, node):
        """MaxPool / Reshape / ...: the output takes the data input's parameters."""
        p = self.act_params.get(node.input[0])
        if p is None:
            p = self.act_qparams(node.input[0])
        if p is None:
            return None
        for o in node.output:
            if o and o not in self.act_params:
                self.act_params[o] = p
        return p

    def bias_scale(self, x_name, w_qname):
        xp = self.act_params.get(x_name)
        if xp is None:
            return None
        ws, _axis = self.weight_scale(w_qname)
        return (np.asarray(xp[0], np.float64) * np.asarray(ws, np.float64)).astype(np.float32)

    def quantize_bias_init(self, bname, scale):
        b = self.state.const(bname)
        scale = np.broadcast_to(scale, b.shape).astype(np.float32) if scale.ndim else scale
        safe = np.where(scale == 0, np.float32(1), scale)
        q = np.clip(np.rint(b.astype(np.float64) / safe), -(2 ** 31), 2 ** 31 - 1).astype(np.int32)
        qn = self.state.add_init(q, bname + "_quantized")
        sn = self.state.add_init(np.asarray(scale, np.float32).reshape(-1) if b.ndim else
                                 np.asarray(scale, np.float32).reshape(()), bname + "_quantized_scale")
        zn = self.state.add_init(np.zeros(np.asarray(scale).reshape(-1).shape if b.ndim else (), np.int32),
                                 bname + "_quantized_zero_point")
        return qn, sn, zn
