"""QLinear* com.microsoft contrib ops (onnxruntime semantics): quantize(f(dequantize(x))) on uint8/int8 tensors.

QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearAveragePool,
QLinearGlobalAveragePool, QLinearConcat, QLinearWhere, QLinearConv (with channels_last), QLinearReduceMean.

Unary ops use a 256-entry lookup table (as onnxruntime does), so they match it exactly. The others compute in
float32 and round half to even; they match onnxruntime exactly or within one quantization step where its SIMD
kernels round an intermediate differently (QLinearAdd/Mul fixed-point paths, QLinearSoftmax's exp table,
QLinearAveragePool/QLinearGlobalAveragePool integer accumulation).
"""

from __future__ import annotations

import numpy as np

from .conv import qlinear_conv as _onnx_qlinear_conv
from .pool import average_pool as _average_pool
from .registry import kernel

MS = "com.microsoft"
_I8 = (np.dtype(np.int8), np.dtype(np.uint8))


def _arr(x, op: str, name: str) -> np.ndarray:
    if x is None:
        raise ValueError(f"{op}: input '{name}' is required")
    return x if isinstance(x, np.ndarray) else np.asarray(x)


def _q8(x, op: str, name: str = "X") -> np.ndarray:
    x = _arr(x, op, name)
    if x.dtype not in _I8:
        raise TypeError(f"{op}: {name} must be uint8 or int8, got {x.dtype}")
    return x


def _scale(s, op: str, name: str) -> np.float32:
    s = _arr(s, op, name)
    if s.size != 1:
        raise ValueError(f"{op}: {name} must be a scalar, got shape {s.shape}")
    return np.float32(s.reshape(-1)[0])


def _zp(z, dt: np.dtype, op: str, name: str) -> np.float32:
    if z is None:
        return np.float32(0)
    z = np.asarray(z)
    if z.size != 1:
        raise ValueError(f"{op}: {name} must be a scalar, got shape {z.shape}")
    if z.dtype != dt:
        raise TypeError(f"{op}: {name} must have type {dt}, got {z.dtype}")
    return np.float32(z.reshape(-1)[0])


def dequant(x: np.ndarray, scale, zp) -> np.ndarray:
    return (x.astype(np.float32) - np.float32(zp)) * np.float32(scale)


def quant(y: np.ndarray, scale, zp, dt: np.dtype) -> np.ndarray:
    """round-half-to-even(y / scale) + zp, saturated to ``dt``."""
    info = np.iinfo(dt)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        q = np.rint(np.asarray(y, np.float32) / np.float32(scale)) + np.float32(zp)
    q = np.where(np.isnan(q), np.float32(zp), q)
    return np.clip(q, info.min, info.max).astype(dt)


def _lut(x, x_scale, x_zero_point, y_scale, y_zero_point, fn, op):
    """Apply ``quantize(fn(dequantize(x)))`` through a table over every value of the 8-bit type."""
    x = _q8(x, op)
    dt = x.dtype
    xs, ys = _scale(x_scale, op, "X_scale"), _scale(y_scale, op, "Y_scale")
    xz, yz = _zp(x_zero_point, dt, op, "X_zero_point"), _zp(y_zero_point, dt, op, "Y_zero_point")
    info = np.iinfo(dt)
    codes = np.arange(info.min, info.max + 1, dtype=np.int32)
    table = quant(fn(dequant(codes, xs, xz)), ys, yz, dt)
    return table[x.astype(np.int32) - info.min]


@kernel("QLinearSigmoid", since=1, domain=MS)
def qlinear_sigmoid(X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None):
    def sig(v):
        with np.errstate(over="ignore"):
            return (np.float32(1) / (np.float32(1) + np.exp(-v))).astype(np.float32)

    return _lut(X, X_scale, X_zero_point, Y_scale, Y_zero_point, sig, "QLinearSigmoid")


@kernel("QLinearLeakyRelu", since=1, domain=MS)
def qlinear_leaky_relu(X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None, *, alpha=0.01):
    a = np.float32(alpha)
    return _lut(X, X_scale, X_zero_point, Y_scale, Y_zero_point, lambda v: np.where(v >= 0, v, v * a),
                "QLinearLeakyRelu")


# ---------------------------------------------------------------------------------------------------- binary ops


def _binary(op, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point, fn):
    A, B = _q8(A, op, "A"), _q8(B, op, "B")
    if A.dtype != B.dtype:
        raise TypeError(f"{op}: A and B must have the same type, got {A.dtype} and {B.dtype}")
    dt = A.dtype
    a = A.astype(np.float32) - _zp(A_zero_point, dt, op, "A_zero_point")
    b = B.astype(np.float32) - _zp(B_zero_point, dt, op, "B_zero_point")
    sa, sb, sc = _scale(A_scale, op, "A_scale"), _scale(B_scale, op, "B_scale"), _scale(C_scale, op, "C_scale")
    try:
        y = fn(a, b, sa, sb, sc)
    except ValueError as e:
        raise ValueError(f"{op}: shapes {A.shape} and {B.shape} do not broadcast") from e
    info = np.iinfo(dt)
    q = np.rint(y) + _zp(C_zero_point, dt, op, "C_zero_point")
    return np.clip(q, info.min, info.max).astype(dt)


@kernel("QLinearAdd", since=1, domain=MS)
def qlinear_add(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    return _binary("QLinearAdd", A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point,
                   lambda a, b, sa, sb, sc: a * np.float32(sa / sc) + b * np.float32(sb / sc))


@kernel("QLinearMul", since=1, domain=MS)
def qlinear_mul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None):
    return _binary("QLinearMul", A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point,
                   lambda a, b, sa, sb, sc: (a * b) * np.float32(sa * sb / sc))


# --------------------------------------------------------------------------------------------------- softmax


@kernel("QLinearSoftmax", since=1, domain=MS)
def qlinear_softmax(X, X_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *, axis=-1, opset=None):
    op = "QLinearSoftmax"
    if opset is None:
        raise ValueError(f"{op}: the 'opset' attribute (the opset of the original Softmax) is required")
    X = _q8(X, op)
    dt = X.dtype
    r = X.ndim
    if r == 0:
        raise ValueError(f"{op}: X must have rank >= 1")
    if not -r <= axis < r:
        raise ValueError(f"{op}: axis {axis} out of range for rank {r}")
    ax = axis % r
    xs = _scale(X_scale, op, "X_scale")
    x = X.astype(np.float32)
    if int(opset) < 13:  # coerced to 2-D: softmax over every axis from ``axis`` on
        lead = int(np.prod(X.shape[:ax], dtype=np.int64))
        x2 = x.reshape(lead, -1)
        red = -1
    else:
        x2 = x
        red = ax
    if x2.size == 0:
        return np.zeros(X.shape, dt)
    m = np.max(x2, axis=red, keepdims=True)
    e = np.exp((x2 - m) * xs)  # the zero point cancels out of the softmax
    p = e / np.sum(e, axis=red, keepdims=True)
    return quant(p, _scale(y_scale, op, "y_scale"), _zp(y_zero_point, dt, op, "y_zero_point"), dt).reshape(X.shape)


# ---------------------------------------------------------------------------------------------------- pooling


def _to_nchw(x: np.ndarray, channels_last) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if channels_last and x.ndim >= 3 else x


def _from_nchw(y: np.ndarray, channels_last) -> np.ndarray:
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if channels_last and y.ndim >= 3 else y


@kernel("QLinearAveragePool", since=1, domain=MS)
def qlinear_average_pool(X, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *, auto_pad="NOTSET",
                         ceil_mode=0, channels_last=0, count_include_pad=0, kernel_shape=None, pads=None,
                         strides=None):
    op = "QLinearAveragePool"
    X = _q8(X, op)
    dt = X.dtype
    if X.ndim < 3:
        raise ValueError(f"{op}: X must have rank >= 3, got shape {X.shape}")
    xf = dequant(_to_nchw(X, channels_last), _scale(x_scale, op, "x_scale"), _zp(x_zero_point, dt, op, "x_zero_point"))
    y = _average_pool(xf, auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                      kernel_shape=kernel_shape, pads=pads, strides=strides)
    out = quant(y, _scale(y_scale, op, "y_scale"), _zp(y_zero_point, dt, op, "y_zero_point"), dt)
    return _from_nchw(out, channels_last)


@kernel("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool(X, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last=0):
    op = "QLinearGlobalAveragePool"
    X = _q8(X, op)
    dt = X.dtype
    if X.ndim < 3:
        raise ValueError(f"{op}: X must have rank >= 3, got shape {X.shape}")
    axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    count = int(np.prod([X.shape[a] for a in axes], dtype=np.int64))
    if count == 0:
        raise ValueError(f"{op}: empty spatial extent")
    acc = X.astype(np.int64).sum(axis=axes, keepdims=True) - int(_zp(x_zero_point, dt, op, "x_zero_point")) * count
    mult = np.float32(_scale(x_scale, op, "x_scale") / (np.float32(count) * _scale(y_scale, op, "y_scale")))
    info = np.iinfo(dt)
    q = np.rint(acc.astype(np.float32) * mult) + _zp(y_zero_point, dt, op, "y_zero_point")
    return np.clip(q, info.min, info.max).astype(dt)


# ---------------------------------------------------------------------------------------------- concat / where


@kernel("QLinearConcat", since=1, domain=MS)
def qlinear_concat(Y_scale, Y_zero_point, *inputs, axis):
    op = "QLinearConcat"
    yz_arr = _arr(Y_zero_point, op, "Y_zero_point")
    dt = yz_arr.dtype
    if dt not in _I8:
        raise TypeError(f"{op}: Y_zero_point must be uint8 or int8, got {dt}")
    ys, yz = _scale(Y_scale, op, "Y_scale"), _zp(yz_arr, dt, op, "Y_zero_point")
    if not inputs or len(inputs) % 3:
        raise ValueError(f"{op}: inputs must come in (tensor, scale, zero_point) triples, got {len(inputs)} inputs")
    parts = []
    for i in range(0, len(inputs), 3):
        x = _q8(inputs[i], op, f"input {i // 3}")
        if x.dtype != dt:
            raise TypeError(f"{op}: input {i // 3} has type {x.dtype}, expected {dt}")
        s, z = _scale(inputs[i + 1], op, f"scale {i // 3}"), _zp(inputs[i + 2], dt, op, f"zero point {i // 3}")
        parts.append(x if (s == ys and z == yz) else quant(dequant(x, s, z), ys, yz, dt))
    r = parts[0].ndim
    if not -r <= axis < r:
        raise ValueError(f"{op}: axis {axis} out of range for rank {r}")
    try:
        return np.concatenate(parts, axis=axis)
    except ValueError as e:
        raise ValueError(f"{op}: {e}") from e


@kernel("QLinearWhere", since=1, domain=MS)
def qlinear_where(condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale, z_zero_point):
    op = "QLinearWhere"
    cond = _arr(condition, op, "condition")
    if cond.dtype != np.bool_:
        raise TypeError(f"{op}: condition must be bool, got {cond.dtype}")
    X, Y = _q8(X, op, "X"), _q8(Y, op, "Y")
    if X.dtype != Y.dtype:
        raise TypeError(f"{op}: X and Y must have the same type, got {X.dtype} and {Y.dtype}")
    dt = X.dtype
    zs, zz = _scale(z_scale, op, "z_scale"), _zp(z_zero_point, dt, op, "z_zero_point")

    def requant(t, s, z):
        s, z = _scale(s, op, "scale"), _zp(z, dt, op, "zero point")
        return t if (s == zs and z == zz) else quant(dequant(t, s, z), zs, zz, dt)

    xq, yq = requant(X, x_scale, x_zero_point), requant(Y, y_scale, y_zero_point)
    try:
        return np.where(cond, xq, yq).astype(dt)
    except ValueError as e:
        raise ValueError(f"{op}: shapes {cond.shape}, {X.shape}, {Y.shape} do not broadcast") from e


# ----------------------------------------------------------------------------------------------- conv / reduce


@kernel("QLinearConv", since=1, domain=MS)
def ms_qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, *,
                    auto_pad="NOTSET", channels_last=0, dilations=None, group=1, kernel_shape=None, pads=None,
                    strides=None):
    op = "QLinearConv"
    x = _q8(x, op, "x")
    w = _q8(w, op, "w")
    y = _onnx_qlinear_conv(_to_nchw(x, channels_last), x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                           y_zero_point, B, auto_pad=auto_pad, dilations=dilations, group=group,
                           kernel_shape=kernel_shape, pads=pads, strides=strides)
    return _from_nchw(y, channels_last)


@kernel("QLinearReduceMean", since=1, domain=MS)
def qlinear_reduce_mean(data, data_scale, data_zero_point=None, reduced_scale=None, reduced_zero_point=None, *, axes,
                        keepdims):
    op = "QLinearReduceMean"
    x = _q8(data, op, "data")
    dt = x.dtype
    r = x.ndim
    ax = tuple(sorted({a % r for a in axes})) if r else ()
    if any(not -r <= a < r for a in axes):
        raise ValueError(f"{op}: axes {list(axes)} out of range for rank {r}")
    xf = dequant(x, _scale(data_scale, op, "data_scale"), _zp(data_zero_point, dt, op, "data_zero_point"))
    y = np.mean(xf, axis=ax, keepdims=bool(keepdims), dtype=np.float32)
    return quant(y, _scale(reduced_scale, op, "reduced_scale"), _zp(reduced_zero_point, dt, op, "reduced_zero_point"),
                 dt)
