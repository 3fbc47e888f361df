"""Small helpers shared by several kernel modules (dtype constants and input checks)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
FLOAT_NAMES = ("float16", "float32", "float64", "bfloat16")
_FLOAT_DTYPES = frozenset((F32, F64) + LOW_FLOATS)


def text(v, default=None):
    """A string attribute as str: bytes decoded as UTF-8 (how ONNX stores them), None as ``default``, a str as is,
    anything else through str()."""
    if isinstance(v, bytes):
        return v.decode()
    if v is None:
        return default
    return v if isinstance(v, str) else str(v)


def required_arr(x, op, name):
    """``x`` as an ndarray; a missing (None) required input raises ValueError naming ``op`` and ``name``."""
    if not isinstance(x, np.ndarray):
        if x is None:
            raise ValueError(f"{op}: required input '{name}' is missing")
        x = np.asarray(x)
    return x


def float_arr(x, op: str, name: str) -> np.ndarray:
    """``x`` as an ndarray of float16/float32/float64/bfloat16, else TypeError naming ``op`` and ``name``."""
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    if x.dtype not in _FLOAT_DTYPES:  # (a set of dtypes: ~30x cheaper than comparing dtype names)
        raise TypeError(f"{op}: {name} must be a float tensor, got {x.dtype}")
    return x


def compute_dtype(dt: np.dtype) -> np.dtype:
    """Compute dtype: float64 stays float64, everything else uses float32."""
    return F64 if dt == F64 else F32


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotary embedding: rotate the first 2*cos.shape[-1] features of x (..., H).

    cos/sin broadcast against x[..., :rd/2]; interleaved pairs (x0, x1), (x2, x3)... or the two halves.
    """
    half = cos.shape[-1]
    rd = 2 * half
    out = x.copy()
    if interleaved:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2] = cos * x1 - sin * x2
        out[..., 1:rd:2] = sin * x1 + cos * x2
    else:
        x1, x2 = x[..., :half], x[..., half:rd]
        out[..., :half] = cos * x1 - sin * x2
        out[..., half:rd] = sin * x1 + cos * x2
    return out


# Read-only ones vectors for sums computed as matrix-vector products (GlobalAveragePool, ReduceSum/Mean and
# Softmax's row sums through reduce._gemv_sum), cached
# up to ONES_MAX elements each and ~16 MiB in all.
ONES_MAX = 1 << 20
_ONES: dict = {}
_ONES_BYTES = [0]


def ones_vector(n: int, dtype) -> np.ndarray | None:
    """A read-only vector of n ones of ``dtype`` (cached), or None when n exceeds ONES_MAX."""
    if n > ONES_MAX:
        return None
    dt = np.dtype(dtype)
    v = _ONES.get((n, dt))
    if v is None:
        v = np.ones(n, dt)
        v.flags.writeable = False
        if _ONES_BYTES[0] + v.nbytes > 1 << 24:
            _ONES.clear()
            _ONES_BYTES[0] = 0
        _ONES[(n, dt)] = v
        _ONES_BYTES[0] += v.nbytes
    return v
