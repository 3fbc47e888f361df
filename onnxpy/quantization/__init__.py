"""``onnxpy.quantization``: the ``onnxruntime.quantization`` API (dynamic / static QDQ / static QOperator
quantization, calibration, MatMulNBits weight-only quantization) written on onnx protobufs and numpy.

Calibration runs the float model with onnxpy; the quantized models run in onnxpy and in onnxruntime.
"""

from __future__ import annotations

from .calibrate import (
    CalibraterBase, CalibrationDataReader, DistributionCalibrater, EntropyCalibrater, HistogramCalibrater,
    MinMaxCalibrater, PercentileCalibrater, TensorData, TensorsData, create_calibrator, load_tensors_data,
    save_tensors_data, write_calibration_table,
)
from .matmul_nbits import (
    DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer, RTNWeightOnlyQuantConfig, WeightOnlyQuantConfig,
    quantize_matmul_nbits,
)
from .quant_utils import CalibrationMethod, ONNXModel, QuantFormat, QuantType
from .quantize import (
    DynamicQuantConfig, QuantConfig, StaticQuantConfig, quantize, quantize_dynamic, quantize_static,
)

__all__ = [
    "CalibraterBase", "CalibrationDataReader", "CalibrationMethod", "DefaultWeightOnlyQuantConfig",
    "DistributionCalibrater", "DynamicQuantConfig", "EntropyCalibrater", "HistogramCalibrater",
    "MatMulNBitsQuantizer", "MinMaxCalibrater", "ONNXModel", "PercentileCalibrater", "QuantConfig", "QuantFormat",
    "QuantType", "RTNWeightOnlyQuantConfig", "StaticQuantConfig", "TensorData", "TensorsData",
    "WeightOnlyQuantConfig", "cli_main", "create_calibrator", "get_qdq_config", "load_tensors_data", "quantize",
    "quantize_dynamic", "quantize_matmul_nbits", "quantize_static", "save_tensors_data", "write_calibration_table",
]


def get_qdq_config(model_input, calibration_data_reader, calibrate_method=CalibrationMethod.MinMax,
                   calibrate_args=None, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                   activation_symmetric=False, weight_symmetric=None, per_channel=False, reduce_range=False,
                   keep_removable_activations=False, min_real_range=None, tensor_quant_overrides=None,
                   calibration_providers=None, op_types_to_quantize=None, nodes_to_exclude=None,
                   extra_options=None) -> StaticQuantConfig:
    extra = dict(extra_options or {})
    extra.setdefault("ActivationSymmetric", activation_symmetric)
    if weight_symmetric is not None:
        extra.setdefault("WeightSymmetric", weight_symmetric)
    extra.setdefault("QDQKeepRemovableActivations", keep_removable_activations)
    if min_real_range is not None:
        extra.setdefault("MinimumRealRange", min_real_range)
    for k, v in (calibrate_args or {}).items():
        extra.setdefault("Calib" + "".join(p.capitalize() for p in k.split("_")), v)
    return StaticQuantConfig(calibration_data_reader, calibrate_method, QuantFormat.QDQ, activation_type,
                             weight_type, op_types_to_quantize, None, nodes_to_exclude, per_channel, reduce_range,
                             False, calibration_providers, extra)


class _RandomReader(CalibrationDataReader):
    """Random (or .npz-file) calibration inputs for the command line."""

    def __init__(self, model, count, seed=0, npz=None):
        import numpy as np

        from .. import InferenceSession
        from ..cli import _random_input

        self.batches = []
        if npz:
            for path in npz:
                with np.load(path) as data:
                    self.batches.append({k: data[k] for k in data.files})
        else:
            sess = InferenceSession(model.SerializeToString())
            rng = np.random.default_rng(seed)
            for _ in range(count):
                self.batches.append({a.name: _random_input(a, rng) for a in sess.get_inputs()})
        self._it = iter(self.batches)

    def get_next(self):
        return next(self._it, None)


def cli_main(argv=None) -> int:
    """``onnxpy quantize IN OUT --mode dynamic|static|nbits ...``"""
    import argparse

    p = argparse.ArgumentParser(prog="onnxpy quantize", description="quantize an ONNX model")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--mode", choices=["dynamic", "static", "nbits"], default="dynamic")
    p.add_argument("--format", choices=["QDQ", "QOperator"], default="QDQ", help="static only")
    p.add_argument("--activation-type", default="QInt8", choices=[q.name for q in QuantType])
    p.add_argument("--weight-type", default="QInt8", choices=[q.name for q in QuantType])
    p.add_argument("--per-channel", action="store_true")
    p.add_argument("--reduce-range", action="store_true")
    p.add_argument("--op-types", default=None, help="comma separated op types to quantize")
    p.add_argument("--nodes-to-exclude", default=None, help="comma separated node names")
    p.add_argument("--calibrate-method", default="MinMax", choices=["MinMax", "Entropy", "Percentile"])
    p.add_argument("--calibration-data", nargs="*", default=None,
                   help=".npz files, one per batch, keys = input names (default: random inputs)")
    p.add_argument("--calibration-samples", type=int, default=8, help="random calibration batches")
    p.add_argument("--bits", type=int, default=4, help="nbits mode")
    p.add_argument("--block-size", type=int, default=128, help="nbits mode")
    p.add_argument("--symmetric", action="store_true", help="nbits mode")
    p.add_argument("--external-data", action="store_true")
    args = p.parse_args(argv)
    ops = args.op_types.split(",") if args.op_types else None
    excl = args.nodes_to_exclude.split(",") if args.nodes_to_exclude else None
    try:
        if args.mode == "dynamic":
            quantize_dynamic(args.input, args.output, op_types_to_quantize=ops, per_channel=args.per_channel,
                             reduce_range=args.reduce_range, weight_type=QuantType[args.weight_type],
                             nodes_to_exclude=excl, use_external_data_format=args.external_data)
        elif args.mode == "static":
            from .quant_utils import load_model

            reader = _RandomReader(load_model(args.input), args.calibration_samples, npz=args.calibration_data)
            quantize_static(args.input, args.output, reader, quant_format=QuantFormat[args.format],
                            op_types_to_quantize=ops, per_channel=args.per_channel, reduce_range=args.reduce_range,
                            activation_type=QuantType[args.activation_type], weight_type=QuantType[args.weight_type],
                            nodes_to_exclude=excl, use_external_data_format=args.external_data,
                            calibrate_method=CalibrationMethod[args.calibrate_method])
        else:
            q = MatMulNBitsQuantizer(args.input, bits=args.bits, block_size=args.block_size,
                                     is_symmetric=args.symmetric, nodes_to_exclude=excl)
            q.process().save_model_to_file(args.output, args.external_data)
    except (ValueError, TypeError, OSError) as e:
        print(f"onnxpy quantize: error: {e}")
        return 1
    print(f"wrote {args.output}")
    return 0
