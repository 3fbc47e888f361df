"""Enums, quantization-parameter arithmetic and small graph helpers shared by the quantizers."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

MS_DOMAIN = "com.microsoft"


class QuantType(enum.Enum):
    QInt8 = 0
    QUInt8 = 1
    QFLOAT8E4M3FN = 2
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5
    QUInt4 = 6

    def __str__(self):
        return self.name

    @staticmethod
    def from_string(t):
        try:
            return QuantType[t]
        except KeyError:
            raise ValueError(f"unknown QuantType '{t}'; expected one of {[q.name for q in QuantType]}") from None

    @property
    def tensor_type(self) -> int:
        return _ONNX_TYPE[self]


class QuantFormat(enum.Enum):
    QOperator = 0
    QDQ = 1

    def __str__(self):
        return self.name

    @staticmethod
    def from_string(fmt):
        try:
            return QuantFormat[fmt]
        except KeyError:
            raise ValueError(f"unknown QuantFormat '{fmt}'; expected QOperator or QDQ") from None


class CalibrationMethod(enum.Enum):
    MinMax = 0
    Entropy = 1
    Percentile = 2
    Distribution = 3


_ONNX_TYPE = {
    QuantType.QInt8: TensorProto.INT8, QuantType.QUInt8: TensorProto.UINT8,
    QuantType.QInt16: TensorProto.INT16, QuantType.QUInt16: TensorProto.UINT16,
    QuantType.QInt4: TensorProto.INT4, QuantType.QUInt4: TensorProto.UINT4,
    QuantType.QFLOAT8E4M3FN: TensorProto.FLOAT8E4M3FN,
}
_NP_TYPE = {
    QuantType.QInt8: np.dtype(np.int8), QuantType.QUInt8: np.dtype(np.uint8),
    QuantType.QInt16: np.dtype(np.int16), QuantType.QUInt16: np.dtype(np.uint16),
    QuantType.QInt4: np.dtype(ml_dtypes.int4), QuantType.QUInt4: np.dtype(ml_dtypes.uint4),
}
_BITS = {QuantType.QInt8: 8, QuantType.QUInt8: 8, QuantType.QInt16: 16, QuantType.QUInt16: 16,
         QuantType.QInt4: 4, QuantType.QUInt4: 4}


def as_quant_type(t) -> QuantType:
    if isinstance(t, QuantType):
        return t
    if isinstance(t, str):
        return QuantType.from_string(t)
    if isinstance(t, int):
        return QuantType(t)
    raise TypeError(f"expected a QuantType, got {t!r}")


def numpy_type(qt: QuantType) -> np.dtype:
    if qt not in _NP_TYPE:
        raise ValueError(f"{qt} is not supported by onnxpy.quantization (integer types only)")
    return _NP_TYPE[qt]


def is_signed(qt: QuantType) -> bool:
    return qt in (QuantType.QInt8, QuantType.QInt16, QuantType.QInt4)


def qrange(qt: QuantType, reduce_range: bool = False, symmetric: bool = False) -> tuple[int, int]:
    """The integer range [qmin, qmax] used for ``qt``.

    Symmetric signed ranges are restricted to be symmetric around 0 (e.g. [-127, 127]) so that zero_point is 0;
    ``reduce_range`` drops one bit (7-bit weights for the u8s8 saturation issue on AVX2).
    """
    bits = _BITS.get(qt)
    if bits is None:
        raise ValueError(f"{qt} is not supported by onnxpy.quantization (integer types only)")
    if reduce_range:
        bits -= 1
    if is_signed(qt):
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        if symmetric:
            lo = -hi
        return lo, hi
    return 0, (1 << bits) - 1


def compute_scale_zp(rmin, rmax, qmin: int, qmax: int, symmetric: bool = False, min_real_range=None):
    """Scale and zero point mapping [rmin, rmax] (widened to contain 0) onto [qmin, qmax].

    Works element-wise on arrays (per-channel).  Returns float32 scale and int64 zero point arrays.
    """
    rmin = np.minimum(np.asarray(rmin, np.float64), 0.0)
    rmax = np.maximum(np.asarray(rmax, np.float64), 0.0)
    if min_real_range is not None:
        rmax = np.maximum(rmax, rmin + float(min_real_range))
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    scale = (rmax - rmin) / float(qmax - qmin)
    zero_range = scale <= 0
    scale = np.where(zero_range, 1.0, scale)
    if symmetric:
        zp = np.full(scale.shape, (qmin + qmax + 1) // 2 if qmin >= 0 else 0, dtype=np.int64)
    else:
        zp = np.clip(np.round(qmin - rmin / scale), qmin, qmax).astype(np.int64)
    zp = np.where(zero_range, 0 if qmin < 0 else zp, zp)
    scale = scale.astype(np.float32)
    # a scale that underflows float32 would give inf in 1/scale
    scale = np.where(scale < np.finfo(np.float32).tiny, np.float32(1.0), scale).astype(np.float32)
    return scale, zp.astype(np.int64)


def quantize_array(x: np.ndarray, scale, zp, qt: QuantType, axis: int | None = None, qmin=None, qmax=None):
    """round-half-to-even(x / scale) + zp, saturated to [qmin, qmax] (the full type range by default)."""
    x = np.asarray(x, np.float32)
    scale = np.asarray(scale, np.float32)
    zp = np.asarray(zp, np.int64)
    if axis is not None and scale.ndim == 1:
        shape = [1] * x.ndim
        shape[axis] = -1
        scale = scale.reshape(shape)
        zp = zp.reshape(shape)
    lo, hi = qrange(qt)
    if qmin is not None:
        lo = max(lo, qmin)
    if qmax is not None:
        hi = min(hi, qmax)
    q = np.clip(np.rint(x / scale) + zp, lo, hi)
    return q.astype(np.int64).astype(numpy_type(qt))


def dequantize_array(q, scale, zp, axis: int | None = None):
    q = np.asarray(q).astype(np.float32)
    scale = np.asarray(scale, np.float32)
    zp = np.asarray(zp).astype(np.float32)
    if axis is not None and scale.ndim == 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (q - zp) * scale


def zp_array(zp, qt: QuantType) -> np.ndarray:
    return np.asarray(zp).astype(np.int64).astype(numpy_type(qt))


def make_initializer(arr: np.ndarray, name: str) -> TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def load_model(model) -> onnx.ModelProto:
    """A ModelProto from a path, bytes, ModelProto or an object with ``.model`` (the ONNXModel wrapper)."""
    if isinstance(model, onnx.ModelProto):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out
    if hasattr(model, "model") and isinstance(model.model, onnx.ModelProto):
        return load_model(model.model)
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    if hasattr(model, "__fspath__") or isinstance(model, str):
        return onnx.load(str(model))
    raise TypeError(f"expected a model path, bytes or onnx.ModelProto, got {type(model).__name__}")


def save_model(model: onnx.ModelProto, path, use_external_data_format: bool = False) -> None:
    if use_external_data_format:
        import os

        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(str(path)) + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def onnx_opset(model: onnx.ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    return 0


def ensure_opset(model: onnx.ModelProto, minimum: int) -> onnx.ModelProto:
    """Upgrade the ai.onnx opset to at least ``minimum`` with onnx's version converter."""
    if onnx_opset(model) >= minimum:
        return model
    from onnx import version_converter

    try:
        return version_converter.convert_version(model, minimum)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"the model uses ai.onnx opset {onnx_opset(model)}; quantization needs opset >= {minimum} "
                         f"and onnx's version converter failed: {e}") from e


def add_domain(model: onnx.ModelProto, domain: str, version: int = 1) -> None:
    if not any(op.domain == domain for op in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(domain, version))


class ONNXModel:
    """A small wrapper like onnxruntime's ``ONNXModel``: ``.model`` is the ModelProto."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model

    def graph(self):
        return self.model.graph

    def nodes(self):
        return self.model.graph.node

    def initializer(self):
        return self.model.graph.initializer

    def save_model_to_file(self, output_path, use_external_data_format: bool = False) -> None:
        save_model(self.model, output_path, use_external_data_format)
