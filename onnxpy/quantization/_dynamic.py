"""Dynamic quantization: weights quantized offline, activations by DynamicQuantizeLinear at run time."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from ._base import DYNAMIC_OPS, _Quantizer
from .quant_utils import QuantType, as_quant_type


class DynamicQuantizer(_Quantizer):
    def __init__(self, model, per_channel, reduce_range, weight_type, op_types, nodes_to_quantize, nodes_to_exclude,
                 extra_options):
        weight_type = as_quant_type(weight_type)
        if weight_type not in (QuantType.QInt8, QuantType.QUInt8):
            raise ValueError(f"dynamic quantization supports weight_type QInt8 or QUInt8, got {weight_type}")
        super().__init__(model, per_channel, reduce_range, weight_type, QuantType.QUInt8, op_types,
                         nodes_to_quantize, nodes_to_exclude, extra_options, DYNAMIC_OPS)
        self._dql: dict[str, tuple[str, str, str]] = {}

    def float_type(self, name):
        return name not in self.state.inits or self.state.const(name).dtype == np.float32

    def dql(self, name, new_nodes):
        if name not in self._dql:
            st = self.state
            outs = (st.unique(name + "_quantized"), st.unique(name + "_scale"), st.unique(name + "_zero_point"))
            new_nodes.append(st.make_node("DynamicQuantizeLinear", [name], list(outs), name + "_QuantizeLinear"))
            self._dql[name] = outs
        return self._dql[name]

    def _int_to_float(self, int_out, scale_a, scale_b, out_name, base, new_nodes, extra_scale=None, scale_shape=None):
        st = self.state
        f = st.unique(base + "_output_float")
        new_nodes.append(st.make_node("Cast", [int_out], [f], base + "_cast", to=TensorProto.FLOAT))
        if scale_shape is not None:
            s_b = st.const(scale_b) * (1.0 if extra_scale is None else extra_scale)
            scale_b = st.add_init(s_b.reshape(scale_shape).astype(np.float32), base + "_w_scale")
        elif extra_scale is not None:
            scale_b = st.add_init((st.const(scale_b) * extra_scale).astype(np.float32), base + "_w_scale")
        s = st.unique(base + "_scales_mul")
        new_nodes.append(st.make_node("Mul", [scale_a, scale_b], [s], base + "_scales_mul"))
        new_nodes.append(st.make_node("Mul", [f, s], [out_name], base + "_output_scale_mul"))

    def run(self):
        out_nodes = []
        for node in self.model.graph.node:
            done = False
            if self.selected(node):
                new_nodes = []
                done = getattr(self, "_" + node.op_type.lower())(node, new_nodes)
                if done:
                    out_nodes.extend(new_nodes)
            if not done:
                out_nodes.append(node)
        return self.finish(out_nodes)

    def _matmul(self, node, new):
        st = self.state
        a, b = node.input[0], node.input[1]
        w = st.const(b)
        if w is None or w.dtype != np.float32 or w.ndim < 2 or not self.float_type(a) or st.is_const(a):
            return False
        axis = w.ndim - 1 if (self.per_channel and w.ndim == 2) else None
        bq, bs, bz = self.quantize_weight(b, self.weight_type, axis)
        aq, as_, az = self.dql(a, new)
        base = node.name or node.output[0]
        i32 = st.unique(node.output[0] + "_output_quantized")
        new.append(st.make_node("MatMulInteger", [aq, bq, az, bz], [i32], base + "_quant"))
        self._int_to_float(i32, as_, bs, node.output[0], base, new)
        return True

    def _gemm(self, node, new):
        st = self.state
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transA", 0):
            return False
        a, b = node.input[0], node.input[1]
        w = st.const(b)
        if w is None or w.dtype != np.float32 or w.ndim != 2 or not self.float_type(a):
            return False
        c = node.input[2] if len(node.input) > 2 and node.input[2] else None
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        if attrs.get("transB", 0):
            bt = st.add_init(np.ascontiguousarray(w.T), b + "_transposed")
            st.graph_inputs.discard(bt)
        else:
            bt = b
        axis = 1 if self.per_channel else None
        bq, bs, bz = self.quantize_weight(bt, self.weight_type, axis)
        aq, as_, az = self.dql(a, new)
        base = node.name or node.output[0]
        i32 = st.unique(node.output[0] + "_output_quantized")
        new.append(st.make_node("MatMulInteger", [aq, bq, az, bz], [i32], base + "_quant"))
        y = node.output[0] if c is None else st.unique(node.output[0] + "_no_bias")
        self._int_to_float(i32, as_, bs, y, base, new, extra_scale=None if alpha == 1.0 else np.float32(alpha))
        if c is not None:
            cc = st.const(c)
            if beta != 1.0:
                if cc is not None:
                    c = st.add_init((cc * np.float32(beta)).astype(cc.dtype), c + "_scaled")
                else:
                    bname = st.add_init(np.array(beta, np.float32), base + "_beta")
                    c2 = st.unique(c + "_scaled")
                    new.append(st.make_node("Mul", [c, bname], [c2], base + "_beta_mul"))
                    c = c2
            new.append(st.make_node("Add", [y, c], [node.output[0]], base + "_bias_add"))
        return True

    def _conv(self, node, new):
        st = self.state
        x, wname = node.input[0], node.input[1]
        w = st.const(wname)
        if w is None or w.dtype != np.float32 or not self.float_type(x) or w.ndim < 3:
            return False
        # onnxruntime's ConvInteger takes a uint8 or int8 weight with one zero point
        bq, bs, bz = self.quantize_weight(wname, self.weight_type, None)
        xq, xs, xz = self.dql(x, new)
        base = node.name or node.output[0]
        i32 = st.unique(node.output[0] + "_output_quantized")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        new.append(st.make_node("ConvInteger", [xq, bq, xz, bz], [i32], base + "_quant", **attrs))
        b = node.input[2] if len(node.input) > 2 and node.input[2] else None
        y = node.output[0] if b is None else st.unique(node.output[0] + "_no_bias")
        self._int_to_float(i32, xs, bs, y, base, new)
        if b is not None:
            bc = st.const(b)
            shape = [1, -1] + [1] * (w.ndim - 2)
            if bc is not None:
                bb = st.add_init(bc.reshape(shape), b + "_reshaped")
            else:
                shp = st.add_init(np.array(shape, np.int64), base + "_bias_shape")
                bb = st.unique(b + "_reshaped")
                new.append(st.make_node("Reshape", [b, shp], [bb], base + "_bias_reshape"))
            new.append(st.make_node("Add", [y, bb], [node.output[0]], base + "_bias_add"))
        return True

    def _gather(self, node, new):
        st = self.state
        data = st.const(node.input[0])
        if data is None or data.dtype != np.float32 or st.is_const(node.input[1]):
            return False
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        dq, ds, dz = self.quantize_weight(node.input[0], self.weight_type, None)
        base = node.name or node.output[0]
        g = st.unique(node.output[0] + "_quantized")
        new.append(st.make_node("Gather", [dq, node.input[1]], [g], base + "_quant", **attrs))
        new.append(st.make_node("DequantizeLinear", [g, ds, dz], [node.output[0]], base + "_dequant"))
        return True
