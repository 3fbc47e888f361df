"""quantize_dynamic / quantize_static / quantize: onnxruntime.quantization's entry points, implemented on onnx
protobufs and numpy.  Calibration runs the float model in onnxpy."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .calibrate import CalibrationDataReader, TensorsData, create_calibrator, load_tensors_data, save_tensors_data
from .graph import GraphState, constants_to_initializers, topo_sort
from .quant_utils import (
    MS_DOMAIN, CalibrationMethod, QuantFormat, QuantType, add_domain, as_quant_type, compute_scale_zp, ensure_opset,
    is_signed, load_model, onnx_opset, qrange, quantize_array, save_model, zp_array,
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


class QuantConfig:
    def __init__(self, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, op_types_to_quantize=None,
                 nodes_to_quantize=None, nodes_to_exclude=None, per_channel=False, reduce_range=False,
                 use_external_data_format=False):
        self.activation_type = activation_type
        self.weight_type = weight_type
        self.op_types_to_quantize = op_types_to_quantize or []
        self.nodes_to_quantize = nodes_to_quantize or []
        self.nodes_to_exclude = nodes_to_exclude or []
        self.per_channel = per_channel
        self.reduce_range = reduce_range
        self.use_external_data_format = use_external_data_format


class StaticQuantConfig(QuantConfig):
    def __init__(self, calibration_data_reader: CalibrationDataReader, calibrate_method=CalibrationMethod.MinMax,
                 quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                 op_types_to_quantize=None, nodes_to_quantize=None, nodes_to_exclude=None, per_channel=False,
                 reduce_range=False, use_external_data_format=False, calibration_providers=None, extra_options=None):
        super().__init__(activation_type, weight_type, op_types_to_quantize, nodes_to_quantize, nodes_to_exclude,
                         per_channel, reduce_range, use_external_data_format)
        self.calibration_data_reader = calibration_data_reader
        self.calibrate_method = calibrate_method
        self.quant_format = quant_format
        self.calibration_providers = calibration_providers
        self.extra_options = extra_options or {}


class DynamicQuantConfig(QuantConfig):
    def __init__(self, weight_type=QuantType.QInt8, op_types_to_quantize=None, nodes_to_quantize=None,
                 nodes_to_exclude=None, per_channel=False, reduce_range=False, use_external_data_format=False,
                 extra_options=None):
        super().__init__(QuantType.QUInt8, weight_type, op_types_to_quantize, nodes_to_quantize, nodes_to_exclude,
                         per_channel, reduce_range, use_external_data_format)
        self.extra_options = extra_options or {}


def quantize(model_input, model_output, quant_config: QuantConfig):
    if isinstance(quant_config, StaticQuantConfig):
        return quantize_static(
            model_input, model_output, quant_config.calibration_data_reader,
            quant_format=quant_config.quant_format, op_types_to_quantize=quant_config.op_types_to_quantize,
            per_channel=quant_config.per_channel, reduce_range=quant_config.reduce_range,
            activation_type=quant_config.activation_type, weight_type=quant_config.weight_type,
            nodes_to_quantize=quant_config.nodes_to_quantize, nodes_to_exclude=quant_config.nodes_to_exclude,
            use_external_data_format=quant_config.use_external_data_format,
            calibrate_method=quant_config.calibrate_method, extra_options=quant_config.extra_options)
    if isinstance(quant_config, DynamicQuantConfig):
        return quantize_dynamic(
            model_input, model_output, op_types_to_quantize=quant_config.op_types_to_quantize,
            per_channel=quant_config.per_channel, reduce_range=quant_config.reduce_range,
            weight_type=quant_config.weight_type, nodes_to_quantize=quant_config.nodes_to_quantize,
            nodes_to_exclude=quant_config.nodes_to_exclude,
            use_external_data_format=quant_config.use_external_data_format, extra_options=quant_config.extra_options)
    raise TypeError("quant_config must be a StaticQuantConfig or a DynamicQuantConfig")


# ---------------------------------------------------------------------------------------------------- base


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


# ---------------------------------------------------------------------------------------------------- dynamic


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


def _prepare(model_input, minimum_opset=10):
    model = load_model(model_input)
    if onnx_opset(model) < minimum_opset:
        model = ensure_opset(model, 13)
    constants_to_initializers(model)
    return model


def quantize_dynamic(model_input, model_output, op_types_to_quantize=None, per_channel=False, reduce_range=False,
                     weight_type=QuantType.QInt8, nodes_to_quantize=None, nodes_to_exclude=None,
                     use_external_data_format=False, extra_options=None):
    """Weights quantized offline, activations quantized at run time (DynamicQuantizeLinear + MatMulInteger /
    ConvInteger).  Returns the quantized ModelProto and writes it to ``model_output`` (unless None)."""
    model = _prepare(model_input, 11)
    q = DynamicQuantizer(model, per_channel, reduce_range, weight_type, op_types_to_quantize, nodes_to_quantize,
                         nodes_to_exclude, extra_options)
    out = q.run()
    if model_output is not None:
        save_model(out, model_output, use_external_data_format)
    return out


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


def quantize_static(model_input, model_output, calibration_data_reader: CalibrationDataReader = None,
                    quant_format=QuantFormat.QDQ, op_types_to_quantize=None, per_channel=False, reduce_range=False,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, nodes_to_quantize=None,
                    nodes_to_exclude=None, use_external_data_format=False,
                    calibrate_method=CalibrationMethod.MinMax, calibration_providers=None, extra_options=None,
                    calibration_cache_path=None):
    """Weights and activations quantized offline from ranges collected by running the float model (in onnxpy) on
    ``calibration_data_reader``'s inputs.  Returns the quantized ModelProto and writes it to ``model_output``."""
    extra = dict(extra_options or {})
    if isinstance(quant_format, str):
        quant_format = QuantFormat.from_string(quant_format)
    if not isinstance(quant_format, QuantFormat):
        raise TypeError(f"quant_format must be a QuantFormat, got {quant_format!r}")
    if isinstance(calibrate_method, str):
        calibrate_method = CalibrationMethod[calibrate_method]
    model = _prepare(model_input, 10)
    if calibration_cache_path is not None and __import__("os").path.exists(str(calibration_cache_path)):
        ranges = load_tensors_data(calibration_cache_path)
    else:
        if calibration_data_reader is None:
            raise ValueError("quantize_static needs a calibration_data_reader (or an existing calibration_cache_path)")
        cal_extra = {
            "symmetric": extra.get("CalibTensorRangeSymmetric", False),
            "moving_average": extra.get("CalibMovingAverage", False),
            "averaging_constant": extra.get("CalibMovingAverageConstant", 0.01),
        }
        for k in ("num_bins", "num_quantized_bins", "percentile"):
            key = "Calib" + "".join(p.capitalize() for p in k.split("_"))
            if key in extra:
                cal_extra[k] = extra[key]
        cal = create_calibrator(model, None, calibrate_method=calibrate_method, extra_options=cal_extra)
        cal.collect_data(calibration_data_reader)
        ranges = cal.compute_data()
        if calibration_cache_path is not None:
            save_tensors_data(ranges, calibration_cache_path)
    cls = QDQQuantizer if quant_format == QuantFormat.QDQ else QOperatorQuantizer
    q = cls(model, ranges, per_channel, reduce_range, weight_type, activation_type, op_types_to_quantize,
            nodes_to_quantize, nodes_to_exclude, extra)
    out = q.run()
    if model_output is not None:
        save_model(out, model_output, use_external_data_format)
    return out
