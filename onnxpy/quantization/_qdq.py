"""Static quantization in QDQ format: QuantizeLinear / DequantizeLinear pairs around the float ops."""

from __future__ import annotations

import numpy as np

from ._base import QDQ_OPS, SHARED_OPS, _StaticQuantizer
from .quant_utils import MS_DOMAIN, QuantType, zp_array


def _weight_axis(node, idx, w, per_channel):
    if not per_channel:
        return None
    op = node.op_type
    if op == "Conv" and idx == 1:
        return 0
    if op == "ConvTranspose" and idx == 1:
        return 1
    if op == "MatMul" and idx == 1 and w.ndim >= 2:
        return w.ndim - 1
    if op == "Gemm" and idx == 1:
        for a in node.attribute:
            if a.name == "transB" and a.i:
                return 0
        return 1
    return None


class QDQQuantizer(_StaticQuantizer):
    def __init__(self, model, tensors_range, per_channel, reduce_range, weight_type, activation_type, op_types,
                 nodes_to_quantize, nodes_to_exclude, extra_options):
        super().__init__(model, tensors_range, per_channel, reduce_range, weight_type, activation_type, op_types,
                         nodes_to_quantize, nodes_to_exclude, extra_options, QDQ_OPS)
        wide = {QuantType.QInt16, QuantType.QUInt16, QuantType.QInt4, QuantType.QUInt4}
        self.use_ms = bool(self.extra.get("UseQDQContribOps", False)) or (
            self.opset < 21 and (self.activation_type in wide or self.weight_type in wide)) or (
            self.opset < 13 and self.per_channel)
        if self.activation_type in (QuantType.QInt4, QuantType.QUInt4):
            raise ValueError("4-bit activations are not supported; use QInt4/QUInt4 as weight_type")
        if self.activation_type == QuantType.QFLOAT8E4M3FN or self.weight_type == QuantType.QFLOAT8E4M3FN:
            raise ValueError("QFLOAT8E4M3FN is not supported by onnxpy.quantization")
        self.domain = MS_DOMAIN if self.use_ms else None

    def run(self):
        st = self.state
        self.fuse_removable_activations()
        g = self.model.graph
        replacements: list[tuple] = []  # (node, input index, new name)
        act_to_quantize: list[str] = []
        new_nodes = []
        for node in g.node:
            if not self.selected(node):
                continue
            op = node.op_type
            acts = []
            if op in SHARED_OPS:
                data = node.input[0]
                if st.is_const(data):
                    if op != "Gather":
                        continue
                    wq, ws, wz = self.quantize_weight(data, self.weight_type, None)
                    dq = st.unique(data + "_DequantizeLinear_Output")
                    new_nodes.append(st.make_node("DequantizeLinear", [wq, ws, wz], [dq], data + "_DequantizeLinear",
                                                  domain=self.domain))
                    replacements.append((node, 0, dq))
                    if op not in self.no_output_quant and self.act_qparams(node.output[0]) is not None:
                        act_to_quantize.append(node.output[0])
                    continue
                if self.act_qparams(data) is None:
                    continue
                acts.append(data)
                if op not in self.no_output_quant:
                    self.shared_output(node)
                    acts.extend(o for o in node.output if o)
                act_to_quantize.extend(acts)
                continue
            n_in = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2, "Clip": 1, "Relu": 1, "Sigmoid": 1,
                    "LeakyRelu": 1, "Softmax": 1, "AveragePool": 1, "GlobalAveragePool": 1}.get(op, len(node.input))
            weights = {}
            ok = True
            for i in range(n_in):
                name = node.input[i]
                if not name:
                    continue
                w = st.const(name)
                if w is not None:
                    if w.dtype != np.float32:
                        ok = False
                        break
                    weights[i] = w
                elif self.act_qparams(name) is None:
                    ok = False
                    break
                else:
                    acts.append(name)
            if not ok:
                continue
            act_to_quantize.extend(acts)
            wq_names = {}
            for i, w in weights.items():
                axis = _weight_axis(node, i, w, self.per_channel)
                wq, ws, wz = self.quantize_weight(node.input[i], self.weight_type, axis)
                wq_names[i] = wq
                dq = st.unique(node.input[i] + "_DequantizeLinear_Output")
                attrs = {"axis": axis} if axis is not None else {}
                new_nodes.append(st.make_node("DequantizeLinear", [wq, ws, wz], [dq],
                                              node.input[i] + "_DequantizeLinear", domain=self.domain, **attrs))
                replacements.append((node, i, dq))
            # int32 bias of Conv / Gemm
            if op in ("Conv", "ConvTranspose", "Gemm") and len(node.input) > 2 and node.input[2] and \
                    self.quantize_bias and 1 in wq_names:
                b = st.const(node.input[2])
                beta = 1.0
                for a in node.attribute:
                    if a.name == "beta":
                        beta = a.f
                if b is not None and b.ndim == 1 and b.dtype == np.float32 and beta == 1.0:
                    scale = self.bias_scale(node.input[0], wq_names[1])
                    if scale is not None:
                        qn, sn, zn = self.quantize_bias_init(node.input[2], scale)
                        dq = st.unique(node.input[2] + "_DequantizeLinear_Output")
                        attrs = {"axis": 0} if np.asarray(scale).ndim else {}
                        new_nodes.append(st.make_node("DequantizeLinear", [qn, sn, zn], [dq],
                                                      node.input[2] + "_DequantizeLinear", domain=self.domain,
                                                      **attrs))
                        replacements.append((node, 2, dq))
            if op not in self.no_output_quant:
                fixed = (0.0, 1.0) if op == "Softmax" else None
                if self.act_qparams(node.output[0], fixed) is not None:
                    act_to_quantize.append(node.output[0])
        for node, i, new in replacements:
            node.input[i] = new
        # activation Q / DQ pairs
        consumers = {}
        for node in g.node:
            for idx, name in enumerate(node.input):
                consumers.setdefault(name, []).append((node, idx))
        done = set()
        producers = {o: n for n in g.node for o in n.output}
        for t in act_to_quantize:
            if t in done:
                continue
            done.add(t)
            scale, zp = self.act_params[t]
            sn = st.add_init(np.asarray(scale, np.float32), t + "_scale")
            zn = st.add_init(zp_array(zp, self.activation_type), t + "_zero_point")
            src = t
            if t in st.graph_outputs and t in producers:
                src = st.unique(t + "_float")
                prod = producers[t]
                for k, o in enumerate(prod.output):
                    if o == t:
                        prod.output[k] = src
                for node, idx in consumers.get(t, []):
                    node.input[idx] = src
                dq_out = t
            else:
                dq_out = st.unique(t + "_DequantizeLinear_Output")
            q_out = st.unique(t + "_QuantizeLinear_Output")
            new_nodes.append(st.make_node("QuantizeLinear", [src, sn, zn], [q_out], t + "_QuantizeLinear",
                                          domain=self.domain))
            new_nodes.append(st.make_node("DequantizeLinear", [q_out, sn, zn], [dq_out], t + "_DequantizeLinear",
                                          domain=self.domain))
            if dq_out != t:
                for node, idx in consumers.get(t, []):
                    node.input[idx] = dq_out
        return self.finish(list(g.node) + new_nodes, [MS_DOMAIN] if self.use_ms else [])
