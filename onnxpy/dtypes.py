"""ONNX element types <-> numpy dtypes, including the ml_dtypes types (bfloat16, float8, int4, ...)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from .ir.protoenums import TensorProto

_T = TensorProto

# ONNX element type -> numpy dtype.  Narrow float and int types come from ml_dtypes.
_ONNX_TO_NP: dict[int, np.dtype] = {
    _T.FLOAT: np.dtype(np.float32),
    _T.UINT8: np.dtype(np.uint8),
    _T.INT8: np.dtype(np.int8),
    _T.UINT16: np.dtype(np.uint16),
    _T.INT16: np.dtype(np.int16),
    _T.INT32: np.dtype(np.int32),
    _T.INT64: np.dtype(np.int64),
    _T.STRING: np.dtype(object),
    _T.BOOL: np.dtype(np.bool_),
    _T.FLOAT16: np.dtype(np.float16),
    _T.DOUBLE: np.dtype(np.float64),
    _T.UINT32: np.dtype(np.uint32),
    _T.UINT64: np.dtype(np.uint64),
    _T.COMPLEX64: np.dtype(np.complex64),
    _T.COMPLEX128: np.dtype(np.complex128),
    _T.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    _T.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    _T.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    _T.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    _T.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    _T.UINT4: np.dtype(ml_dtypes.uint4),
    _T.INT4: np.dtype(ml_dtypes.int4),
    _T.FLOAT4E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
}
for _name, _ml in (("FLOAT8E8M0", "float8_e8m0fnu"), ("UINT2", "uint2"), ("INT2", "int2"),
                   ("FLOAT6E2M3", "float6_e2m3fn"), ("FLOAT6E3M2", "float6_e3m2fn")):
    if hasattr(_T, _name) and hasattr(ml_dtypes, _ml):
        _ONNX_TO_NP[getattr(_T, _name)] = np.dtype(getattr(ml_dtypes, _ml))

_NP_TO_ONNX: dict[np.dtype, int] = {v: k for k, v in _ONNX_TO_NP.items()}
_NP_TO_ONNX[np.dtype(np.str_)] = _T.STRING

# onnxruntime's type names as used in NodeArg.type ("tensor(float)") and error messages.
_ONNX_NAMES: dict[int, str] = {
    _T.FLOAT: "float", _T.UINT8: "uint8", _T.INT8: "int8", _T.UINT16: "uint16", _T.INT16: "int16",
    _T.INT32: "int32", _T.INT64: "int64", _T.STRING: "string", _T.BOOL: "bool", _T.FLOAT16: "float16",
    _T.DOUBLE: "double", _T.UINT32: "uint32", _T.UINT64: "uint64", _T.COMPLEX64: "complex64",
    _T.COMPLEX128: "complex128", _T.BFLOAT16: "bfloat16", _T.FLOAT8E4M3FN: "float8e4m3fn",
    _T.FLOAT8E4M3FNUZ: "float8e4m3fnuz", _T.FLOAT8E5M2: "float8e5m2", _T.FLOAT8E5M2FNUZ: "float8e5m2fnuz",
    _T.UINT4: "uint4", _T.INT4: "int4", _T.FLOAT4E2M1: "float4e2m1",
}
for _name in ("FLOAT8E8M0", "UINT2", "INT2", "FLOAT6E2M3", "FLOAT6E3M2"):
    if hasattr(_T, _name):
        _ONNX_NAMES[getattr(_T, _name)] = _name.lower()

FLOAT_TYPES = frozenset(
    np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)
)


def to_numpy(elem_type: int) -> np.dtype:
    """numpy dtype for an ONNX ``TensorProto.DataType`` value."""
    try:
        return _ONNX_TO_NP[int(elem_type)]
    except KeyError:
        raise TypeError(f"unsupported ONNX element type {elem_type}") from None


def from_numpy(dtype) -> int:
    """ONNX ``TensorProto.DataType`` value for a numpy dtype (str/unicode arrays map to STRING)."""
    dt = np.dtype(dtype)
    if dt.kind == "U":
        return _T.STRING
    try:
        return _NP_TO_ONNX[dt]
    except KeyError:
        raise TypeError(f"numpy dtype {dt} has no ONNX element type") from None


def type_name(elem_type: int) -> str:
    """onnxruntime's short name of an element type, e.g. ``float`` for FLOAT."""
    return _ONNX_NAMES.get(int(elem_type), f"type{elem_type}")


def is_ml_dtype(dtype) -> bool:
    """True for the narrow types numpy only knows through ml_dtypes (bfloat16, float8, int4, ...)."""
    return np.dtype(dtype).type.__module__.startswith("ml_dtypes")
