"""quantize_dynamic / quantize_static / quantize: onnxruntime.quantization's entry points, implemented on onnx
protobufs and numpy.  Calibration runs the float model in onnxpy.

The quantizers live in private modules: ``_base`` (op tables, ``_Quantizer``, ``_StaticQuantizer``), ``_dynamic``
(``DynamicQuantizer``), ``_qdq`` (``QDQQuantizer``) and ``_qoperator`` (``QOperatorQuantizer``); they are re-exported
here so ``onnxpy.quantization.quantize.<name>`` keeps working."""

from __future__ import annotations

from ._base import (  # noqa: F401  (re-exported)
    _ACT_PRODUCERS, _REMOVABLE_ACT, DYNAMIC_OPS, QDQ_OPS, QOPERATOR_OPS, SHARED_OPS, _Quantizer, _StaticQuantizer,
)
from ._dynamic import DynamicQuantizer
from ._qdq import QDQQuantizer, _weight_axis  # noqa: F401  (re-exported)
from ._qoperator import QOperatorQuantizer
from .calibrate import CalibrationDataReader, create_calibrator, load_tensors_data, save_tensors_data
from .graph import constants_to_initializers
from .quant_utils import CalibrationMethod, QuantFormat, QuantType, ensure_opset, load_model, onnx_opset, save_model

__all__ = [
    "DYNAMIC_OPS", "QDQ_OPS", "QOPERATOR_OPS", "SHARED_OPS", "DynamicQuantConfig", "DynamicQuantizer", "QDQQuantizer",
    "QOperatorQuantizer", "QuantConfig", "StaticQuantConfig", "quantize", "quantize_dynamic", "quantize_static",
]


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
