"""onnx's protobuf message classes without importing the onnx package, and tensor decoding without numpy_helper.

``import onnx`` costs ~100 ms of every fresh process (its Python helpers, json_format, the C++ extension); the
generated ``onnx_ml_pb2`` module alone costs ~25 ms.  :func:`messages` executes that module from the installed
onnx under a private name when onnx is not imported yet (protobuf keeps one class per message descriptor, so the
classes are the very ``onnx.ModelProto`` etc. a later ``import onnx`` exposes), or uses onnx's when it is.
Parsing, field access and error behaviour are protobuf's own.

:func:`tensor_array` decodes the element types numpy holds natively; sub-byte types (int4, float4, ...) are left to
onnx's ``numpy_helper``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading

import numpy as np

from .protoenums import onnx_package_dir

_MODULE = None
_LOCK = threading.Lock()  # sessions created from several threads load the module once


def messages():
    """The module holding onnx's ModelProto, TensorProto, ... classes."""
    if _MODULE is not None:
        return _MODULE
    with _LOCK:
        return _MODULE if _MODULE is not None else _find_messages()


def _find_messages():
    global _MODULE
    onnx = sys.modules.get("onnx")
    mod = None
    if onnx is not None and hasattr(onnx, "ModelProto"):
        mod = sys.modules.get(onnx.ModelProto.__module__)
    if mod is None:
        mod = _load_generated()
    if mod is None:  # an onnx whose layout we do not know: its own import
        import onnx

        mod = sys.modules[onnx.ModelProto.__module__]
    _MODULE = mod
    return mod


def _load_generated():
    pkg = onnx_package_dir()
    if pkg is None:
        return None
    path = os.path.join(pkg, "onnx_ml_pb2.py")
    if not os.path.isfile(path):
        return None
    name = "_onnxpy_onnx_ml_pb2"
    gen = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(gen)
    try:
        gen.loader.exec_module(mod)
    except Exception:  # noqa: BLE001 - fall back to importing onnx itself
        return None
    sys.modules[name] = mod
    return mod


# ----------------------------------------------------------------------------------------------------------
# tensors

# element types whose values travel in int32_data as the bit patterns of the narrow type
_BITS_IN_INT32 = {10: np.uint16, 16: np.uint16, 17: np.uint8, 18: np.uint8, 19: np.uint8, 20: np.uint8, 24: np.uint8}
_FROM_INT32 = {2, 3, 4, 5, 6, 9}  # uint8 int8 uint16 int16 int32 bool: values in int32_data
SUB_BYTE = frozenset({21, 22, 23, 25, 26, 27, 28})  # packed several to a byte: onnx's numpy_helper decodes these


def tensor_array(t, raw: bytes | None = None, np_dtype=None) -> np.ndarray | None:
    """Decode a TensorProto to a numpy array, or None when onnx's numpy_helper should (sub-byte element types, an
    unknown type, a big-endian machine).  ``raw`` replaces raw_data (external data already read).  Raises
    ValueError when the data does not match the dims.  Arrays decoded from raw bytes are read-only views of their
    own bytes object, as numpy_helper gives them (kernels treat such arrays as model constants)."""
    dt = t.data_type
    if dt in SUB_BYTE or sys.byteorder != "little" or np_dtype is None:
        return None
    dims = tuple(t.dims)
    count = 1
    for d in dims:
        count *= d
    if dt == 8:  # STRING
        vals = t.string_data
        if len(vals) != count:
            raise ValueError(f"{len(vals)} strings for dims {list(dims)}")
        out = np.empty(count, dtype=object)
        for i, v in enumerate(vals):
            out[i] = v.decode("utf-8", errors="surrogateescape")
        return out.reshape(dims)
    if raw is None and t.HasField("raw_data"):
        raw = t.raw_data
    if raw is not None:
        size = np_dtype.itemsize
        if len(raw) != count * size:
            raise ValueError(f"raw_data holds {len(raw)} bytes, dims {list(dims)} of {np_dtype} need {count * size}")
        return np.frombuffer(raw, np_dtype.newbyteorder("<"), count).reshape(dims)
    if dt in (1, 14):
        vals = np.array(t.float_data, dtype=np.float32)
    elif dt in (11, 15):
        vals = np.array(t.double_data, dtype=np.float64)
    elif dt == 7:
        vals = np.array(t.int64_data, dtype=np.int64)
    elif dt in (12, 13):
        vals = np.array(t.uint64_data, dtype=np.uint64)
    elif dt in _FROM_INT32 or dt in _BITS_IN_INT32:
        vals = np.array(t.int32_data, dtype=np.int32)
    else:
        return None
    if dt in (14, 15):
        if len(vals) != 2 * count:
            raise ValueError(f"{len(vals)} values for {count} complex elements of dims {list(dims)}")
        arr = (vals[0::2] + 1j * vals[1::2]).astype(np_dtype)
    else:
        if len(vals) != count:
            raise ValueError(f"{len(vals)} values for dims {list(dims)}")
        bits = _BITS_IN_INT32.get(dt)
        arr = vals.astype(bits).view(np_dtype) if bits is not None else vals.astype(np_dtype)
    arr.shape = dims
    return arr
