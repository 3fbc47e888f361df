"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul.

Quantization granularity follows the scale's shape: a scalar (or one-element 1-D) scale is per-tensor, a 1-D scale
is per-axis along ``axis``, and a scale of the input's rank with ``block_size > 0`` is blocked along ``axis``.
Division rounds half to even and saturates to the target type's range; float8 targets saturate to +-max unless
``saturate=0`` (then out-of-range values become inf/NaN as the type allows).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .. import dtypes
from .registry import kernel

# integer quantized types: dtype -> (min, max)
_INT_RANGES: dict[np.dtype, tuple[int, int]] = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(ml_dtypes.uint4): (0, 15),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(np.int32): (-(2**31), 2**31 - 1),
}
for _n, _r in (("uint2", (0, 3)), ("int2", (-2, 1))):
    if hasattr(ml_dtypes, _n):
        _INT_RANGES[np.dtype(getattr(ml_dtypes, _n))] = _r

# narrow float quantized types (value of ``saturate`` matters only for the float8 ones)
_FLOAT_TARGETS = {
    np.dtype(getattr(ml_dtypes, n))
    for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn",
              "float6_e2m3fn", "float6_e3m2fn")
    if hasattr(ml_dtypes, n)
}
_NO_INF_TARGETS = {  # types without infinity/NaN where conversion always saturates
    np.dtype(getattr(ml_dtypes, n)) for n in ("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")
    if hasattr(ml_dtypes, n)
}
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu) if hasattr(ml_dtypes, "float8_e8m0fnu") else None
_COMPUTE_FLOATS = {np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16)}


def _as_array(x, name: str) -> np.ndarray:
    if x is None:
        raise ValueError(f"input '{name}' is required")
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    return x


def _expand_param(p: np.ndarray, x_shape: tuple, axis: int, block_size: int, name: str) -> np.ndarray:
    """Reshape/repeat a scale or zero point so that it broadcasts against an input of ``x_shape``."""
    rank = len(x_shape)
    if block_size and block_size > 0:
        if p.ndim != rank:
            raise ValueError(
                f"blocked quantization: '{name}' must have the input's rank {rank}, got shape {p.shape}"
            )
        ax = _norm_axis(axis, rank)
        for i in range(rank):
            if i != ax and p.shape[i] != x_shape[i]:
                raise ValueError(
                    f"blocked quantization: '{name}' shape {p.shape} must match input shape {x_shape} "
                    f"except on axis {ax}"
                )
        di, si = x_shape[ax], p.shape[ax]
        if si * block_size < di or (si > 0 and (si - 1) * block_size >= di and di > 0):
            raise ValueError(
                f"blocked quantization: block_size {block_size} does not fit input dim {di} with {si} blocks "
                f"of '{name}'"
            )
        return np.take(np.repeat(p, block_size, axis=ax), np.arange(di), axis=ax)
    if p.size == 1 and p.ndim <= 1:
        return p.reshape(())
    if p.ndim == 0:
        return p
    if p.ndim == 1:
        if rank == 0:
            raise ValueError(f"'{name}' has shape {p.shape} but the input is a scalar")
        ax = _norm_axis(axis, rank)
        if p.shape[0] != x_shape[ax]:
            raise ValueError(
                f"per-axis quantization: '{name}' has {p.shape[0]} elements but input dim {ax} is {x_shape[ax]}"
            )
        shape = [1] * rank
        shape[ax] = p.shape[0]
        return p.reshape(shape)
    raise ValueError(
        f"'{name}' of shape {p.shape} is neither a scalar, a 1-D per-axis tensor, nor (with block_size > 0) a "
        "blocked tensor"
    )


def _norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for a tensor of rank {rank}")
    return axis + rank if axis < 0 else axis


def _to_compute(a: np.ndarray, dt: np.dtype) -> np.ndarray:
    if a.dtype == dt:
        return a
    if _E8M0 is not None and a.dtype == _E8M0:
        return a.astype(np.float32).astype(dt)
    return a.astype(dt)


def _quantize(x, y_scale, y_zero_point, *, axis, block_size, saturate, output_dtype, precision):
    x = _as_array(x, "x")
    y_scale = _as_array(y_scale, "y_scale")
    if y_zero_point is not None:
        y_zero_point = np.asarray(y_zero_point)
    # output type
    if output_dtype:
        out_dt = dtypes.to_numpy(output_dtype)
        if y_zero_point is not None and y_zero_point.dtype != out_dt:
            raise TypeError(
                f"output_dtype {dtypes.type_name(output_dtype)} does not match y_zero_point type {y_zero_point.dtype}"
            )
    elif y_zero_point is not None:
        out_dt = y_zero_point.dtype
    else:
        out_dt = np.dtype(np.uint8)
    if out_dt not in _INT_RANGES and out_dt not in _FLOAT_TARGETS:
        raise TypeError(f"QuantizeLinear cannot quantize to {out_dt}")
    if y_zero_point is not None and y_zero_point.shape != y_scale.shape and y_zero_point.size != y_scale.size:
        raise ValueError(f"y_zero_point shape {y_zero_point.shape} differs from y_scale shape {y_scale.shape}")
    # division precision
    if precision:
        pdt = dtypes.to_numpy(precision)
    else:
        pdt = y_scale.dtype
    if pdt not in _COMPUTE_FLOATS:
        pdt = np.dtype(np.float32) if pdt != np.dtype(np.int32) else np.dtype(np.float64)
    scale = _expand_param(_to_compute(y_scale, pdt), x.shape, axis, block_size, "y_scale")
    q = _to_compute(x, pdt) / scale
    if out_dt in _INT_RANGES:
        lo, hi = _INT_RANGES[out_dt]
        r = np.rint(q).astype(np.float64)
        if y_zero_point is not None:
            zp = _expand_param(y_zero_point.astype(np.int64), x.shape, axis, block_size, "y_zero_point")
            r = r + zp
        r = np.clip(r, lo, hi)
        if np.isnan(r).any():
            r = np.where(np.isnan(r), 0.0, r)
        return r.astype(np.int64).astype(out_dt)
    # float targets
    q = q.astype(np.float32)
    if y_zero_point is not None:
        zp = _expand_param(y_zero_point.astype(np.float32), x.shape, axis, block_size, "y_zero_point")
        q = q + zp
    if saturate or out_dt in _NO_INF_TARGETS:
        m = float(ml_dtypes.finfo(out_dt).max)
        q = np.clip(q, -m, m)
    return q.astype(out_dt)


@kernel("QuantizeLinear", since=(10, 13, 19, 21, 23, 24, 25))
def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, saturate=1, output_dtype=0,
                    precision=0):
    return _quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size, saturate=saturate,
                     output_dtype=output_dtype, precision=precision)


@kernel("QuantizeLinear", since=28)
def quantize_linear_28(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, saturate=1, output_dtype=0,
                       precision=0):
    return _quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size, saturate=saturate,
                     output_dtype=output_dtype, precision=precision)


def _dequantize(x, x_scale, x_zero_point, *, axis, block_size, output_dtype):
    x = _as_array(x, "x")
    x_scale = _as_array(x_scale, "x_scale")
    if output_dtype:
        out_dt = dtypes.to_numpy(output_dtype)
    elif _E8M0 is not None and x_scale.dtype == _E8M0:
        out_dt = np.dtype(np.float32)
    else:
        out_dt = x_scale.dtype
    if out_dt not in _COMPUTE_FLOATS:
        raise TypeError(f"DequantizeLinear output type must be a float type, got {out_dt}")
    if x.dtype not in _INT_RANGES and x.dtype not in _FLOAT_TARGETS:
        raise TypeError(f"DequantizeLinear cannot dequantize {x.dtype}")
    if x_zero_point is not None:
        x_zero_point = np.asarray(x_zero_point)
        if x.dtype == np.int32 and np.any(x_zero_point != 0):
            raise ValueError("DequantizeLinear: int32 input requires a zero x_zero_point")
        if x_zero_point.dtype != x.dtype:
            raise TypeError(f"x_zero_point type {x_zero_point.dtype} differs from x type {x.dtype}")
        if x_zero_point.shape != x_scale.shape and x_zero_point.size != x_scale.size:
            raise ValueError(f"x_zero_point shape {x_zero_point.shape} differs from x_scale shape {x_scale.shape}")
    cdt = np.dtype(np.float64) if out_dt == np.float64 else np.dtype(np.float32)
    scale = _expand_param(_to_compute(x_scale, cdt), x.shape, axis, block_size, "x_scale")
    if x.dtype in _INT_RANGES:
        v = x.astype(np.int64)
        if x_zero_point is not None:
            v = v - _expand_param(x_zero_point.astype(np.int64), x.shape, axis, block_size, "x_zero_point")
        v = v.astype(cdt)
    else:
        v = x.astype(cdt)
        if x_zero_point is not None:
            v = v - _expand_param(x_zero_point.astype(cdt), x.shape, axis, block_size, "x_zero_point")
    y = v * scale
    return y.astype(out_dt, copy=False)


@kernel("DequantizeLinear", since=(10, 13, 19, 21, 23, 24, 25, 28))
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype)


@kernel("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x):
    x = _as_array(x, "x")
    if x.dtype != np.float32:
        raise TypeError(f"DynamicQuantizeLinear expects float32 input, got {x.dtype}")
    finite = x[~np.isnan(x)] if x.size else x
    if finite.size:
        mx = max(0.0, float(np.max(finite)))
        mn = min(0.0, float(np.min(finite)))
    else:
        mx = mn = 0.0
    scale = np.float32((np.float32(mx) - np.float32(mn)) / np.float32(255.0))
    if scale == 0 or not np.isfinite(scale):
        scale = np.float32(1.0)  # all-zero (or empty) input: onnxruntime reports scale 1, zero point 0
    zp_f = np.clip(np.rint(np.float32(0.0) - np.float32(mn) / scale), 0, 255)
    zp = np.uint8(zp_f)
    q = np.clip(np.rint(x / scale) + np.float32(zp_f), 0, 255)
    y = np.where(np.isnan(q), 0, q).astype(np.uint8)
    return y, np.array(scale, dtype=np.float32), np.array(zp, dtype=np.uint8)


def _matmul_param(p: np.ndarray, rows: bool, shape: tuple, name: str) -> np.ndarray:
    """A QLinearMatMul scale/zero point: scalar, per-row of a ([M]) or per-column of b ([N]); or broadcastable."""
    if p.size == 1:
        return p.reshape(())
    if p.ndim == 1:
        n = shape[-2] if rows else shape[-1]
        if len(shape) < 2 or p.shape[0] != n:
            raise ValueError(f"'{name}' has {p.shape[0]} elements but expected {n} (per-{'row' if rows else 'column'})")
        return p.reshape(-1, 1) if rows else p
    return p


@kernel("QLinearMatMul", since=(10, 21))
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    a = _as_array(a, "a")
    b = _as_array(b, "b")
    a_scale = _as_array(a_scale, "a_scale")
    b_scale = _as_array(b_scale, "b_scale")
    y_scale = _as_array(y_scale, "y_scale")
    out_dt = np.asarray(y_zero_point).dtype if y_zero_point is not None else np.dtype(np.uint8)
    if a.ndim < 1 or b.ndim < 1:
        raise ValueError("QLinearMatMul inputs must have rank >= 1")

    def centered(t, zp, rows, name):
        if t.dtype in _INT_RANGES:
            v = t.astype(np.int64)
            if zp is not None:
                v = v - _matmul_param(np.asarray(zp).astype(np.int64), rows, t.shape, name)
            return v
        v = t.astype(np.float32)
        if zp is not None:
            v = v - _matmul_param(np.asarray(zp).astype(np.float32), rows, t.shape, name)
        return v

    a2 = a if a.ndim >= 2 else a.reshape(1, -1)
    b2 = b if b.ndim >= 2 else b.reshape(-1, 1)
    av = centered(a2, a_zero_point, True, "a_zero_point")
    bv = centered(b2, b_zero_point, False, "b_zero_point")
    if av.shape[-1] != bv.shape[-2]:
        raise ValueError(f"QLinearMatMul: inner dimensions differ: a {a.shape}, b {b.shape}")
    if av.dtype == np.int64 and bv.dtype == np.int64:
        acc = np.matmul(av, bv).astype(np.float64)
    else:
        acc = np.matmul(av.astype(np.float64), bv.astype(np.float64))
    sa = _matmul_param(a_scale.astype(np.float32), True, a2.shape, "a_scale").astype(np.float64)
    sb = _matmul_param(b_scale.astype(np.float32), False, b2.shape, "b_scale").astype(np.float64)
    sy = y_scale.astype(np.float32).astype(np.float64)
    if sy.size != 1:
        sy = _matmul_param(sy, False, acc.shape, "y_scale")
    else:
        sy = sy.reshape(())
    mult = (sa * sb / sy).astype(np.float32).astype(np.float64)
    y = acc * mult
    if a.ndim == 1:
        y = y[..., 0, :]
    if b.ndim == 1:
        y = y[..., 0]
    if out_dt in _INT_RANGES:
        lo, hi = _INT_RANGES[out_dt]
        r = np.rint(y)
        if y_zero_point is not None:
            zp = np.asarray(y_zero_point).astype(np.int64)
            r = r + (zp.reshape(()) if zp.size == 1 else zp)
        return np.clip(r, lo, hi).astype(np.int64).astype(out_dt)
    y = y.astype(np.float32)
    if y_zero_point is not None:
        y = y + np.asarray(y_zero_point).astype(np.float32)
    if out_dt in _FLOAT_TARGETS:
        m = float(ml_dtypes.finfo(out_dt).max)
        y = np.clip(y, -m, m)
    return y.astype(out_dt)
