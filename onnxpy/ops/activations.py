"""Activation functions and Softmax / LogSoftmax / Hardmax.

Composite formulas are computed in float32 for float16/bfloat16 inputs (and cast back) so that intermediate
rounding does not accumulate; float32/float64 inputs are computed in their own type.
"""

from __future__ import annotations

import math

import numpy as np

from . import _ew_math as _fast
from .reduce import _gemv_sum
from .registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_NATIVE = frozenset((_F32, _F64))
_erf = _fast.erf64
_sigmoid = _fast.sigmoid
_blockwise = _fast.blockwise


def _up(x):
    """x as a >= 1-d array of a type numpy computes natively and accurately (float32/float64).

    1-d so that in-place ufunc calls (``out=``) work: numpy returns scalars, not arrays, for 0-d operands.
    """
    if x.ndim == 0:
        x = x.reshape(1)
    return x if x.dtype in _NATIVE else x.astype(np.float32)


def _down(y, x):
    """y (computed from ``_up(x)``) back in x's type and shape."""
    y = y.astype(x.dtype, copy=False)
    return y if x.ndim else y.reshape(())


# ---------------------------------------------------------------------------------------------------------------
# simple activations
# ---------------------------------------------------------------------------------------------------------------
@kernel("Relu", (6, 13, 14))
def relu(x, *, _donated=()):
    # (x dies here and is ours: computed in place, see registry: _donated)
    return _fast.relu(x, x if _donated and x.ndim else None)


kernel("Relu", 1)(relu)  # relu's signature has no attributes: opset-1 `consumed_inputs` is dropped


kernel("Tanh", (6, 13))(np.tanh)


@kernel("Tanh", 1)
def tanh_1(x):
    return np.tanh(x)


def _sigmoid_inplace(x):
    with np.errstate(over="ignore"):
        return _fast.sigmoid_into(x, out=x)


_sigmoid_small = _fast.sigmoid_into  # one block, no errstate (sessions run with floating-point warnings off)


@kernel("Sigmoid", (1, 6, 13))
def sigmoid(x, *, _donated=()):
    if x.dtype in _NATIVE:
        if x.size <= 4096 and x.ndim:
            return _sigmoid_small(x)
        if _donated and x.ndim:
            return _sigmoid_inplace(x)
        return _sigmoid(x)
    return _sigmoid(x.astype(np.float32)).astype(x.dtype)


@kernel("LeakyRelu", (1, 6, 16))
def leaky_relu(x, *, alpha=0.01, _donated=()):
    if x.dtype.kind != "f":  # bfloat16: a Python-float product would promote to float32
        return _down(leaky_relu(_up(x), alpha=alpha), x)
    # branch-free forms (np.where is slow on unpredictable masks)
    if 0.0 <= alpha <= 1.0:
        return np.maximum(x, x * alpha, out=x if _donated and x.ndim else None)
    if alpha > 1.0:
        return np.minimum(x, x * alpha, out=x if _donated and x.ndim else None)
    y = _fast.clamp(x, None, x.dtype.type(0))
    y *= alpha
    y += _fast.relu(x)
    return y


def _channel_slope(x, slope):
    """Opset < 7 PRelu: a 1-D slope of C values applies per channel (axis 1) of an N x C x ... input."""
    if slope.ndim == 1 and slope.size > 1 and x.ndim >= 2 and slope.shape[0] == x.shape[1]:
        return slope.reshape((slope.shape[0],) + (1,) * (x.ndim - 2))
    return slope


@kernel("PRelu", (7, 9, 16))
def prelu(x, slope):
    y = _fast.clamp(x, None, x.dtype.type(0)) * slope
    y += _fast.relu(x)
    return y.astype(x.dtype, copy=False)


@kernel("PRelu", (1, 6))
def prelu_6(x, slope):
    return prelu(x, _channel_slope(x, slope))


def _elu_core(xf, alpha, scale=1.0):
    """alpha * expm1(min(x, 0)) + max(x, 0), branch-free."""
    y = _fast.clamp(xf, None, xf.dtype.type(0))
    np.expm1(y, out=y)
    y *= alpha
    y += _fast.relu(xf)
    if scale != 1.0:
        y *= scale
    return y


@kernel("Elu", (1, 6, 22))
def elu(x, *, alpha=1.0):
    return _down(_elu_core(_up(x), alpha), x)


@kernel("Selu", (1, 6, 22))
def selu(x, *, alpha=1.6732632423543772, gamma=1.0507010221481445):
    return _down(_elu_core(_up(x), alpha, gamma), x)


@kernel("Celu", (12, 28))
def celu(x, *, alpha=1.0):
    # max(0, x) + min(0, alpha * (exp(x / alpha) - 1))
    xf = _up(x)
    y = _fast.clamp(xf, None, xf.dtype.type(0))
    y /= alpha
    np.expm1(y, out=y)
    y *= alpha
    y += _fast.relu(xf)
    return _down(y, x)


@kernel("HardSigmoid", (1, 6, 22))
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    xf = _up(x)
    y = xf * alpha
    y += beta
    return _down(_fast.clip(y, 0, 1, out=y), x)


@kernel("HardSwish", (14, 22))
def hard_swish(x):
    xf = _up(x)
    y = xf * (1.0 / 6.0)
    y += 0.5
    _fast.clip(y, 0, 1, out=y)
    y *= xf
    return _down(y, x)


def _softplus_block(x):
    # log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow, ~10x faster than np.logaddexp
    y = np.abs(x)
    np.negative(y, out=y)
    np.exp(y, out=y)
    np.log1p(y, out=y)
    y += _fast.relu(x)
    return y


@kernel("Softplus", (1, 22))
def softplus(x):
    return _down(_blockwise(_softplus_block, _up(x)), x)


@kernel("Softsign", (1, 22))
def softsign(x):
    xf = _up(x)
    d = np.abs(xf)
    d += 1
    return _down(np.divide(xf, d, out=d), x)


@kernel("ThresholdedRelu", (10, 22))
def thresholded_relu(x, *, alpha=1.0):
    return np.where(x > alpha, x, 0).astype(x.dtype, copy=False)


@kernel("Shrink", 9)
def shrink(x, *, bias=0.0, lambd=0.5):
    if x.dtype.kind in "iu":
        xf = x.astype(np.float64)
    else:
        xf = _up(x)
    y = np.where(xf < -lambd, xf + bias, np.where(xf > lambd, xf - bias, 0))
    return _down(y, x)


_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_erf_block(x):
    if x.dtype == _F32:
        return _fast.gelu_erf32(np.ascontiguousarray(x), np.empty(x.shape, dtype=_F32))
    e = x * _SQRT_HALF
    e = _erf(e)
    e += 1.0
    e *= x
    e *= 0.5
    return e


# x / (1 + 2^(x (A + B x^2))) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): 0.5 (1 + tanh z) is sigmoid(2 z)
_GELU_TANH_A = -2.0 * _SQRT_2_OVER_PI * math.log2(math.e)
_GELU_TANH_B = _GELU_TANH_A * 0.044715
_GELU_TANH_POLY = (_GELU_TANH_A, _GELU_TANH_B)  # (the native kernel's coefficients: A + B x^2)


def _gelu_tanh_block(x, out=None):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) computed as x sigmoid(2 z): seven array passes with one exp2
    instead of nine and a tanh (0.75-0.8x the time per block of 64K float32), and no cancellation in 1 + tanh(z) for
    negative x (max abs error 5e-7 over [-12, 12] in float32).  Into ``out`` when given (it may be ``x`` itself);
    exp2 overflows to inf for x below about -9.5, giving -0.0 as the tanh form does."""
    res = _fast.native_gelu(x, out, _GELU_TANH_POLY, "gelu_tanh_f32")
    if res is not None:
        return res
    t = x.dtype.type
    u = x * x
    u *= t(_GELU_TANH_B)
    u += t(_GELU_TANH_A)
    u *= x
    with np.errstate(over="ignore"):
        np.exp2(u, out=u)
    u += t(1)
    return np.divide(x, u, out=out if out is not None else u)


@kernel("Gelu", 20)
def gelu(x, *, approximate="none"):
    if approximate == "none":
        xf = _up(x)
        if xf.dtype == _F32:
            src = np.ascontiguousarray(xf)
            dst = src if x.dtype != _F32 or src is not xf else np.empty(src.shape, dtype=_F32)  # fresh: in place
            return _down(_fast.gelu_erf32(src, dst), x)
        fn = _gelu_erf_block
    elif approximate == "tanh":
        fn = _gelu_tanh_block
    else:
        raise ValueError(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return _down(_blockwise(fn, _up(x)), x)


def _mish_block(x):
    # tanh(softplus(x)) = n / (n + 2) with n = e^x (e^x + 2); exp argument capped (the ratio is 1 beyond 20)
    e = np.minimum(x, 20.0)
    np.exp(e, out=e)
    n = e + 2.0
    n *= e
    e = np.add(n, 2.0, out=e)
    n /= e
    n *= x
    return n


@kernel("Mish", (18, 22))
def mish(x):
    return _down(_blockwise(_mish_block, _up(x)), x)


def _swish(xf, alpha):
    s = _sigmoid(xf * alpha if alpha != 1.0 else xf)
    s *= xf
    return s


@kernel("Swish", 24)
def swish(x, *, alpha=1.0):
    return _down(_swish(_up(x), alpha), x)


@kernel("SwiGLU", 28)
def swiglu(a, b, *, alpha=1.0):
    if a.shape != b.shape:
        raise ValueError(f"SwiGLU inputs A{a.shape} and B{b.shape} must have identical shapes")
    s = _swish(_up(a), alpha)
    s *= b
    return _down(s, a)


# ---------------------------------------------------------------------------------------------------------------
# Softmax family
# ---------------------------------------------------------------------------------------------------------------
def _axis(axis, ndim, op, allow_end=False):
    hi = ndim + 1 if allow_end else ndim
    a = axis + ndim if axis < 0 else axis
    if not 0 <= a < hi or ndim == 0:
        raise ValueError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim}")
    return a


def _softmax(x, axes):
    if x.size == 0:
        return x.copy()
    if x.dtype == np.float16:
        # The spec defines Softmax-13 as a function of Exp/ReduceMax/ReduceSum/Div at the input type: compute it
        # step by step in float16 (onnxruntime accumulates in float32; the two differ by at most one ulp).
        e = np.exp(x - x.max(axis=axes, keepdims=True))
        return e / e.sum(axis=axes, keepdims=True)
    xf = _up(x)
    if xf.dtype == _F32 and xf.flags.c_contiguous:
        e = _softmax_trailing_unshifted(xf, axes)
        if e is not None:
            return _down(e, x)
    e = xf - xf.max(axis=axes, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=axes, keepdims=True)
    return _down(e, x)


# Softmax without the row maxima (here and in contrib_transformer's attention): no element above this (e^60 per
# term: row sums stay finite in float32 for up to ~3e12 terms), and every row sum at least _ROW_SUM_MIN (no row lost
# precision to underflow without the max subtraction)
_EXP_SAFE32 = 60.0
_ROW_SUM_MIN = 1e-20


def _softmax_trailing_unshifted(x, axes):
    """Softmax of a C-contiguous float32 x over its trailing axes when no element exceeds 60: exp(x) / row sums
    without subtracting the row maxima (softmax is shift-invariant and each exp is rounded on its own), the sums
    as one matrix-vector product with ones -- one reduction over the whole array instead of a row-wise maximum
    and a subtraction pass (2.4-3x faster at attention-like shapes).  None (the caller takes the usual steps) for
    other axes, a NaN or an element above 60, or a row whose sum falls below 1e-20 (every element far below zero:
    its exps would lose precision)."""
    if isinstance(axes, int):
        axes = (axes,)
    r = x.ndim
    if tuple(sorted(axes)) != tuple(range(r - len(axes), r)) or not x.max() <= _EXP_SAFE32:
        return None
    S = math.prod(x.shape[r - len(axes):])
    e = np.exp(x)
    e2 = e.reshape(-1, S)
    s = _gemv_sum(e2, (1,), False)
    if s is None:
        s = e2.sum(axis=1)
    if not s.min() >= _ROW_SUM_MIN:
        return None
    np.divide(e2, s[:, None], out=e2)
    return e


def _log_softmax(x, axes):
    if x.size == 0:
        return x.copy()
    xf = _up(x)
    t = xf - xf.max(axis=axes, keepdims=True)
    lse = np.log(np.exp(t).sum(axis=axes, keepdims=True))
    t -= lse
    return _down(t, x)


def _hardmax_last(x2):
    """One-hot of the first maximum along the last axis of a tensor."""
    out = np.zeros(x2.shape, dtype=x2.dtype)
    if x2.size:
        idx = np.argmax(x2, axis=-1)[..., None]
        np.put_along_axis(out, idx, 1, axis=-1)
    return out


@kernel("Softmax", (1, 11))
def softmax_1(x, *, axis=1):
    a = _axis(axis, x.ndim, "Softmax", allow_end=True)
    return _softmax(x, tuple(range(a, x.ndim)))


@kernel("Softmax", 13)
def softmax_13(x, *, axis=-1):
    return _softmax(x, _axis(axis, x.ndim, "Softmax"))


@kernel("LogSoftmax", (1, 11))
def log_softmax_1(x, *, axis=1):
    a = _axis(axis, x.ndim, "LogSoftmax", allow_end=True)
    return _log_softmax(x, tuple(range(a, x.ndim)))


@kernel("LogSoftmax", 13)
def log_softmax_13(x, *, axis=-1):
    return _log_softmax(x, _axis(axis, x.ndim, "LogSoftmax"))


@kernel("Hardmax", (1, 11))
def hardmax_1(x, *, axis=1):
    a = _axis(axis, x.ndim, "Hardmax", allow_end=True)
    rows = math.prod(x.shape[:a])
    cols = math.prod(x.shape[a:])
    return _hardmax_last(x.reshape(rows, cols)).reshape(x.shape)


@kernel("Hardmax", 13)
def hardmax_13(x, *, axis=-1):
    a = _axis(axis, x.ndim, "Hardmax")
    return np.moveaxis(_hardmax_last(np.moveaxis(x, a, -1)), -1, a)
