"""Cast, CastLike and BitCast: every numeric type pair (ml_dtypes narrow types included) and string <-> number."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
from ._common import text
from ..ir.protoenums import data_type_names

from ..dtypes import to_numpy
from .registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_OBJ = np.dtype(object)
_BOOL = np.dtype(np.bool_)

# float8 types -> their largest finite value (saturation bound)
_F8_MAX = {
    np.dtype(t): float(ml_dtypes.finfo(t).max)
    for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3fnuz, ml_dtypes.float8_e5m2, ml_dtypes.float8_e5m2fnuz)
}
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu) if hasattr(ml_dtypes, "float8_e8m0fnu") else None

# bit widths of the types narrower than their one-byte numpy storage (stored in the low bits of the byte)
_SUB_BYTE_BITS = {np.dtype(ml_dtypes.int4): 4, np.dtype(ml_dtypes.uint4): 4, np.dtype(ml_dtypes.float4_e2m1fn): 4}
for _n, _b in (("int2", 2), ("uint2", 2), ("float6_e2m3fn", 6), ("float6_e3m2fn", 6)):
    if hasattr(ml_dtypes, _n):
        _SUB_BYTE_BITS[np.dtype(getattr(ml_dtypes, _n))] = _b


_SUB_BYTE_INTS = frozenset(d for d in _SUB_BYTE_BITS if d.kind in "iu" or "int" in d.name)


def _target_dtype(to) -> np.dtype:
    if isinstance(to, (str, bytes)):  # Cast-1 names the type as a string ("FLOAT")
        name = text(to)
        code = data_type_names().get(name.upper())
        if not isinstance(code, int):
            raise TypeError(f"Cast: unknown target type name {name!r}")
        to = code
    return to_numpy(to)


def _is_floatish(dt: np.dtype) -> bool:
    return dt.kind == "f" or (dt.kind == "V" and dt in _FLOATISH_ML)


_FLOATISH_ML = frozenset(
    np.dtype(getattr(ml_dtypes, n))
    for n in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
              "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")
    if hasattr(ml_dtypes, n)
)


# ---------------------------------------------------------------------------------------------------------------
# numbers -> strings
# ---------------------------------------------------------------------------------------------------------------
def _to_string(x: np.ndarray) -> np.ndarray:
    dt = x.dtype
    if dt.kind in "OU":
        return x.astype(object)
    if dt == _BOOL:
        return np.where(x, "1", "0").astype(object)
    if dt.kind in "iu":
        return x.astype(str).astype(object)
    if dt.kind == "c":
        return x.astype(str).astype(object)
    xf = x.astype(np.float64)
    s = np.char.mod("%.8g", xf)
    nan = np.isnan(xf)
    if nan.any():
        s = np.where(nan, "NaN", s)
    inf = np.isinf(xf)
    if inf.any():
        s = np.where(inf, np.where(xf > 0, "INF", "-INF"), s)
    return s.astype(object)


# ---------------------------------------------------------------------------------------------------------------
# strings -> numbers (std::stod / std::stoll / std::stoull prefix-parsing semantics)
# ---------------------------------------------------------------------------------------------------------------
# Patterns for string -> number casts, compiled on first use (compiling them costs every session that loads
# this module, Cast-only models included).
_FLOAT_PREFIX = r"\s*[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
_HEX_PREFIX = r"\s*[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
_SPECIAL_PREFIX = r"(?i)\s*([+-]?)(inf(?:inity)?|nan)"
_INT_PREFIX = r"\s*([+-]?\d+)"


def _stod(s) -> float:
    s = str(s)
    try:
        return float(s)
    except ValueError:
        pass
    m = re.match(_HEX_PREFIX, s)
    if m:
        return float.fromhex(m.group(0).strip())
    m = re.match(_SPECIAL_PREFIX, s)
    if m:
        return float(m.group(1) + m.group(2))
    m = re.match(_FLOAT_PREFIX, s)
    if m:
        return float(m.group(0))
    raise ValueError(f"Cast: cannot convert string {s!r} to a floating point number")


def _strtoint(s, unsigned: bool) -> int:
    m = re.match(_INT_PREFIX, str(s))
    if not m:
        raise ValueError(f"Cast: cannot convert string {s!r} to an integer")
    v = int(m.group(1))
    if unsigned:
        if abs(v) > 0xFFFFFFFFFFFFFFFF:
            raise ValueError(f"Cast: string {s!r} is out of the range of a 64-bit unsigned integer")
        return v % (1 << 64)
    if not -(1 << 63) <= v < (1 << 63):
        raise ValueError(f"Cast: string {s!r} is out of the range of a 64-bit integer")
    return v


def _parse_floats(x: np.ndarray) -> np.ndarray:
    try:
        return np.asarray(x, dtype=str).astype(np.float64)
    except (ValueError, TypeError):
        flat = [_stod(s) for s in x.reshape(-1)]
        return np.array(flat, dtype=np.float64).reshape(x.shape)


def _from_string(x: np.ndarray, dt: np.dtype, saturate, round_mode) -> np.ndarray:
    if dt.kind in "iu" or dt == _BOOL or (dt in _SUB_BYTE_BITS and not _is_floatish(dt)):
        unsigned = dt.kind == "u" or dt == _BOOL
        flat = [_strtoint(s, unsigned) for s in x.reshape(-1)]
        arr = np.array(flat, dtype=np.uint64 if unsigned else np.int64).reshape(x.shape)
        if dt == _BOOL:
            return arr != 0
        return arr.astype(dt)
    if dt.kind == "c":
        flat = [complex(str(s).strip()) for s in x.reshape(-1)]
        return np.array(flat, dtype=dt).reshape(x.shape)
    return _cast(_parse_floats(x), dt, saturate, round_mode)


# ---------------------------------------------------------------------------------------------------------------
# float8e8m0 (powers of two; bits 0xFF is NaN, no zero, no sign)
# ---------------------------------------------------------------------------------------------------------------
def _to_e8m0(x: np.ndarray, saturate, round_mode) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32)
    man = bits & 0x7FFFFF
    nan = (exp == 255) & (man != 0)
    inf = (exp == 255) & (man == 0)
    sub = exp == 0  # zero and subnormals: value = man * 2**-149, 2**-127 is man == 0x400000
    if round_mode == "up":
        bump = np.where(sub, man > 0x400000, man != 0)
        base = np.where(sub, 0, exp)
    elif round_mode == "down":
        bump = np.zeros(bits.shape, dtype=np.bool_)
        base = np.where(sub, 0, exp)
    elif round_mode == "nearest":
        bump = np.where(sub, man >= 0x600000, man >= 0x400000)
        base = np.where(sub, 0, exp)
    else:
        raise ValueError(f"Cast: round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    e = base + bump
    if saturate:
        e = np.where((e > 254) | inf, 254, e)
    else:
        # without saturation, values outside [2**-127, 2**127] (zero included) become NaN
        out = (exp == 255) | ((exp == 254) & (man != 0)) | (sub & (man < 0x400000)) | (e > 254)
        e = np.where(out, 255, e)
    e = np.where(nan, 255, e)
    return e.astype(np.uint8).view(_E8M0)


# ---------------------------------------------------------------------------------------------------------------
# the cast itself
# ---------------------------------------------------------------------------------------------------------------
def _cast(x: np.ndarray, dt: np.dtype, saturate=1, round_mode="up") -> np.ndarray:
    src = x.dtype
    if src == dt:
        return x
    if dt == _OBJ:
        return _to_string(x)
    if src == _OBJ or src.kind == "U":
        return _from_string(x, dt, saturate, round_mode)
    if dt in _F8_MAX:
        if saturate and src.kind != "b":
            m = _F8_MAX[dt]
            xf = x if src in (_F32, _F64) else x.astype(np.float64 if src.kind in "iu" else np.float32)
            return np.clip(xf, -m, m).astype(dt)
        return _astype(x, dt)
    if _E8M0 is not None and dt == _E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if dt in _SUB_BYTE_INTS and _is_floatish(src):
        # onnxruntime rounds half away from zero when narrowing floats to 4-/2-bit integers
        xf = x.astype(np.float32) if src not in (_F32, _F64) else x
        xf = np.trunc(xf + np.copysign(0.5, xf))
        return _astype(xf, dt)
    return _astype(x, dt)


def _astype(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    try:
        return x.astype(dt)
    except (TypeError, ValueError):
        # a pair ml_dtypes does not convert directly: go through a wide type
        mid = np.float64 if (_is_floatish(x.dtype) or _is_floatish(dt)) else np.int64
        return x.astype(mid).astype(dt)


@kernel("Cast", (1, 6, 9, 13))
def cast(x, *, to):
    return _cast(x, _target_dtype(to))


@kernel("Cast", (19, 21, 23))
def cast_19(x, *, to, saturate=1):
    return _cast(x, _target_dtype(to), saturate)


@kernel("Cast", (24, 25, 28))
def cast_24(x, *, to, saturate=1, round_mode="up"):
    return _cast(x, _target_dtype(to), saturate, round_mode)


def _spec_cast(consts, kwargs):
    """Cast with its target type resolved once; a plain numeric target (no saturation or rounding rules) is a
    bare ``astype`` for numeric sources."""
    if len(consts) != 1 or "to" not in kwargs:
        return None
    dt = _target_dtype(kwargs["to"])
    saturate = kwargs.get("saturate", 1)
    round_mode = kwargs.get("round_mode", "up")
    special = dt == _OBJ or dt in _F8_MAX or (_E8M0 is not None and dt == _E8M0) or dt in _SUB_BYTE_INTS
    if special:
        return lambda x: _cast(x, dt, saturate, round_mode)

    def cast_plain(x):
        src = x.dtype
        if src == dt:
            return x
        if src == _OBJ or src.kind == "U":
            return _from_string(x, dt, saturate, round_mode)
        return _astype(x, dt)

    return cast_plain


cast.specialize = cast_19.specialize = cast_24.specialize = _spec_cast


@kernel("CastLike", 15)
def cast_like(x, target_type):
    return _cast(x, target_type.dtype)


@kernel("CastLike", (19, 21, 23))
def cast_like_19(x, target_type, *, saturate=1):
    return _cast(x, target_type.dtype, saturate)


@kernel("CastLike", (24, 25))
def cast_like_24(x, target_type, *, saturate=1, round_mode="up"):
    return _cast(x, target_type.dtype, saturate, round_mode)


# ---------------------------------------------------------------------------------------------------------------
# BitCast
# ---------------------------------------------------------------------------------------------------------------
def _bit_width(dt: np.dtype) -> int:
    if dt == _OBJ or dt.kind == "U":
        raise TypeError("BitCast does not support string tensors")
    return _SUB_BYTE_BITS.get(dt, dt.itemsize * 8)


@kernel("BitCast", 26)
def bitcast(x, *, to):
    dt = _target_dtype(to)
    src = x.dtype
    if src == dt:
        return x
    if _bit_width(src) != _bit_width(dt):
        raise ValueError(
            f"BitCast: source type {src} ({_bit_width(src)} bits) and target type {dt} ({_bit_width(dt)} bits) "
            "must have the same bit width"
        )
    if dt == _BOOL:
        return x.view(np.uint8) != 0
    return x.view(dt)
