"""Static quantization in QOperator format: QLinearConv / QLinearMatMul / com.microsoft QLinear* ops."""

from __future__ import annotations

import numpy as np
import onnx

from ._base import QOPERATOR_OPS, _StaticQuantizer
from .quant_utils import MS_DOMAIN, QuantType, zp_array


class QOperatorQuantizer(_StaticQuantizer):
    def __init__(self, model, tensors_range, per_channel, reduce_range, weight_type, activation_type, op_types,
                 nodes_to_quantize, nodes_to_exclude, extra_options):
        super().__init__(model, tensors_range, per_channel, reduce_range, weight_type, activation_type, op_types,
                         nodes_to_quantize, nodes_to_exclude, extra_options, QOPERATOR_OPS)
        eight = (QuantType.QInt8, QuantType.QUInt8)
        if self.activation_type not in eight or self.weight_type not in eight:
            raise ValueError("QuantFormat.QOperator supports only 8-bit types (QInt8/QUInt8); use QuantFormat.QDQ "
                             "for 16-bit or 4-bit quantization")
        self.qinfo: dict[str, tuple[str, str, str]] = {}  # tensor -> quantized name, scale, zero point
        self.float_missing: set[str] = set()
        self.out: list = []
        self.used_ms = False

    def _params_inits(self, t):
        scale, zp = self.act_params[t]
        st = self.state
        return (st.add_init(np.asarray(scale, np.float32), t + "_scale"),
                st.add_init(zp_array(zp, self.activation_type), t + "_zero_point"))

    def quantized(self, t):
        """The quantized form of activation ``t`` (adds a QuantizeLinear when it only exists in float)."""
        if t in self.qinfo:
            return self.qinfo[t]
        if self.act_qparams(t) is None:
            return None
        sn, zn = self._params_inits(t)
        q = self.state.unique(t + "_quantized")
        self.out.append(self.state.make_node("QuantizeLinear", [t, sn, zn], [q], t + "_QuantizeLinear"))
        self.qinfo[t] = (q, sn, zn)
        return self.qinfo[t]

    def new_output(self, t, params=None):
        """Register a QOperator output: returns (quantized name, scale, zp) names."""
        if params is not None:
            self.act_params[t] = params
        elif self.act_qparams(t) is None:
            return None
        sn, zn = self._params_inits(t)
        q = self.state.unique(t + "_quantized")
        return q, sn, zn

    def commit_output(self, t, info):
        self.qinfo[t] = info
        self.float_missing.add(t)

    def need_float(self, t):
        if t in self.float_missing:
            q, sn, zn = self.qinfo[t]
            self.out.append(self.state.make_node("DequantizeLinear", [q, sn, zn], [t], t + "_DequantizeLinear"))
            self.float_missing.discard(t)

    def act_or_weight(self, name, axis=None, as_activation=False):
        """Quantized form of an input: an activation, or a constant quantized as a weight."""
        if self.state.is_const(name):
            w = self.state.const(name)
            if w.dtype != np.float32:
                return None
            if as_activation:  # same type and asymmetric range as activations (QLinearAdd / Concat ...)
                return self.quantize_weight(name, self.activation_type, None, symmetric=self.activation_symmetric,
                                            reduce_range=False)
            return self.quantize_weight(name, self.weight_type, axis)
        return self.quantized(name)

    def run(self):
        st = self.state
        self.fuse_removable_activations()
        g = self.model.graph
        from .graph import node_inputs

        for node in list(g.node):
            handled = False
            if self.selected(node):
                mark = len(self.out)
                handled = bool(getattr(self, "_q_" + node.op_type.lower(), self._q_none)(node))
                if not handled:
                    del self.out[mark:]
            if not handled:
                for i in node_inputs(node):
                    self.need_float(i)
                self.out.append(node)
        for o in list(st.graph_outputs):
            self.need_float(o)
        return self.finish(self.out, [MS_DOMAIN] if self.used_ms else [])

    def _q_none(self, node):
        return False

    def _attrs(self, node, drop=()):
        return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name not in drop}

    def _q_conv(self, node):
        st = self.state
        if st.const(node.input[1]) is None or st.is_const(node.input[0]):
            return False
        x = self.quantized(node.input[0])
        if x is None:
            return False
        w = st.const(node.input[1])
        if w.dtype != np.float32:
            return False
        wq = self.quantize_weight(node.input[1], self.weight_type, 0 if self.per_channel else None)
        y = self.new_output(node.output[0])
        if y is None:
            return False
        inputs = [*x, *wq, y[1], y[2]]
        if len(node.input) > 2 and node.input[2]:
            b = st.const(node.input[2])
            if b is None:
                return False
            scale = self.bias_scale(node.input[0], wq[0])
            inputs.append(self.quantize_bias_init(node.input[2], scale)[0])
        self.out.append(st.make_node("QLinearConv", inputs, [y[0]], (node.name or node.output[0]) + "_quant",
                                     **self._attrs(node)))
        self.commit_output(node.output[0], y)
        return True

    def _q_matmul(self, node):
        st = self.state
        a_name, b_name = node.input[0], node.input[1]
        if st.is_const(a_name):
            return False
        a = self.quantized(a_name)
        bw = st.const(b_name)
        axis = None
        if bw is not None and self.per_channel and bw.ndim == 2:
            axis = 1
        b = self.act_or_weight(b_name, axis)
        if a is None or b is None:
            return False
        y = self.new_output(node.output[0])
        if y is None:
            return False
        self.out.append(st.make_node("QLinearMatMul", [*a, *b, y[1], y[2]], [y[0]],
                                     (node.name or node.output[0]) + "_quant"))
        self.commit_output(node.output[0], y)
        return True

    def _q_gemm(self, node):
        st = self.state
        attrs = self._attrs(node)
        w = st.const(node.input[1])
        if w is None or w.ndim != 2 or st.is_const(node.input[0]) or w.dtype != np.float32:
            return False
        a = self.quantized(node.input[0])
        if a is None:
            return False
        axis = (0 if attrs.get("transB", 0) else 1) if self.per_channel else None
        b = self.quantize_weight(node.input[1], self.weight_type, axis)
        y = self.new_output(node.output[0])
        if y is None:
            return False
        inputs = [*a, *b]
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        if len(node.input) > 2 and node.input[2]:
            c = st.const(node.input[2])
            if c is None or c.dtype != np.float32:
                return False
            scale = self.bias_scale(node.input[0], b[0]) * np.float32(alpha)
            c = (c * np.float32(beta)).astype(np.float32)
            cs = np.broadcast_to(scale, c.shape) if scale.ndim and c.ndim else scale
            if scale.ndim and c.ndim == 0:
                c = np.broadcast_to(c, scale.shape)
                cs = scale
            q = np.clip(np.rint(c / np.where(cs == 0, 1, cs)), -(2 ** 31), 2 ** 31 - 1).astype(np.int32)
            inputs.append(st.add_init(q, node.input[2] + "_quantized"))
        else:
            inputs.append("")
        inputs += [y[1], y[2]]
        keep = {k: v for k, v in attrs.items() if k in ("transA", "transB", "alpha")}
        self.out.append(st.make_node("QGemm", inputs, [y[0]], (node.name or node.output[0]) + "_quant",
                                     domain=MS_DOMAIN, **keep))
        self.used_ms = True
        self.commit_output(node.output[0], y)
        return True

    def _binary(self, node, op):
        st = self.state
        if all(st.is_const(i) for i in node.input[:2]):
            return False
        a = self.act_or_weight(node.input[0], as_activation=True)
        b = self.act_or_weight(node.input[1], as_activation=True)
        if a is None or b is None:
            return False
        y = self.new_output(node.output[0])
        if y is None:
            return False
        self.out.append(st.make_node(op, [*a, *b, y[1], y[2]], [y[0]], (node.name or node.output[0]) + "_quant",
                                     domain=MS_DOMAIN))
        self.used_ms = True
        self.commit_output(node.output[0], y)
        return True

    def _q_add(self, node):
        return self._binary(node, "QLinearAdd")

    def _q_mul(self, node):
        return self._binary(node, "QLinearMul")

    def _unary(self, node, op, fixed=None, **attrs):
        st = self.state
        if st.is_const(node.input[0]):
            return False
        x = self.quantized(node.input[0])
        if x is None:
            return False
        if fixed is not None:
            self.act_qparams(node.output[0], fixed)
        y = self.new_output(node.output[0])
        if y is None:
            return False
        self.out.append(st.make_node(op, [*x, y[1], y[2]], [y[0]], (node.name or node.output[0]) + "_quant",
                                     domain=MS_DOMAIN, **attrs))
        self.used_ms = True
        self.commit_output(node.output[0], y)
        return True

    def _q_sigmoid(self, node):
        return self._unary(node, "QLinearSigmoid")

    def _q_leakyrelu(self, node):
        return self._unary(node, "QLinearLeakyRelu", **self._attrs(node))

    def _q_softmax(self, node):
        attrs = self._attrs(node)
        attrs["opset"] = self.opset
        if self.opset < 13 and "axis" not in attrs:
            attrs["axis"] = 1
        return self._unary(node, "QLinearSoftmax", fixed=(0.0, 1.0), **attrs)

    def _q_averagepool(self, node):
        return self._unary(node, "QLinearAveragePool", **self._attrs(node))

    def _q_globalaveragepool(self, node):
        return self._unary(node, "QLinearGlobalAveragePool", channels_last=0)

    def _q_concat(self, node):
        st = self.state
        if all(st.is_const(i) for i in node.input):
            return False
        ins = []
        for i in node.input:
            q = self.act_or_weight(i, as_activation=True)
            if q is None:
                return False
            ins.extend(q)
        y = self.new_output(node.output[0])
        if y is None:
            return False
        self.out.append(st.make_node("QLinearConcat", [y[1], y[2], *ins], [y[0]],
                                     (node.name or node.output[0]) + "_quant", domain=MS_DOMAIN,
                                     **self._attrs(node)))
        self.used_ms = True
        self.commit_output(node.output[0], y)
        return True

    def _shared(self, node, min_opset=1):
        st = self.state
        if self.opset < min_opset:
            return False
        outs = [o for o in node.output if o]
        if node.op_type == "MaxPool" and len(outs) > 1:
            return False
        data = node.input[0]
        if st.is_const(data):
            if node.op_type != "Gather":
                return False
            x = self.quantize_weight(data, self.weight_type, None)
            params = (np.asarray(self.state.const(x[1])), np.asarray(self.state.const(x[2])).astype(np.int64))
            qt = self.weight_type
        else:
            x = self.quantized(data)
            if x is None:
                return False
            params = self.act_params[data]
            qt = self.activation_type
        q_out = self.state.unique(outs[0] + "_quantized")
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = self.state.unique((node.name or outs[0]) + "_quant")
        new.input[0] = x[0]
        new.output[0] = q_out
        self.out.append(new)
        if qt == self.activation_type and not st.is_const(data):
            self.act_params[outs[0]] = params
            self.commit_output(outs[0], (q_out, x[1], x[2]))
        else:
            # a quantized embedding: dequantize right away (parameters belong to the weight type)
            self.out.append(st.make_node("DequantizeLinear", [q_out, x[1], x[2]], [outs[0]],
                                         outs[0] + "_DequantizeLinear"))
        return True

    def _q_maxpool(self, node):
        return self._shared(node, 12)

    def _q_reshape(self, node):
        return self._shared(node)

    _q_transpose = _q_flatten = _q_squeeze = _q_unsqueeze = _q_reshape

    def _q_resize(self, node):
        return self._shared(node, 11)

    def _q_gather(self, node):
        return self._shared(node)
