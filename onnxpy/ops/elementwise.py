"""Elementwise math, logic, comparison, variadic and selection ops.

Hot-path kernels are registered as bare numpy ufuncs (``Add = np.add``) for the opset versions that have no
attributes; the pre-opset-7 versions (``consumed_inputs``, legacy ``broadcast``/``axis``) get thin Python wrappers.
"""

from __future__ import annotations

import numpy as np

from . import _ew_math as _fast
from .registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_NATIVE_FLOATS = frozenset((_F32, _F64))


def _wrap_unary(ufunc, name):
    """A one-input wrapper (for opset-1 versions, whose ``consumed_inputs`` attribute must be dropped)."""

    def fn(x):
        return ufunc(x)

    fn.__name__ = fn.__qualname__ = name
    return fn


# ---------------------------------------------------------------------------------------------------------------
# unary math
# ---------------------------------------------------------------------------------------------------------------
for _op, _uf, _since in (
    ("Abs", np.absolute, (6, 13)),
    ("Neg", np.negative, (6, 13)),
    ("Exp", np.exp, (6, 13)),
    ("Log", np.log, (6, 13)),
    ("Sqrt", np.sqrt, (6, 13)),
    ("Reciprocal", np.reciprocal, (6, 13)),
    ("Ceil", np.ceil, (6, 13)),
    ("Floor", np.floor, (6, 13)),
):
    kernel(_op, _since)(_uf)
    kernel(_op, 1)(_wrap_unary(_uf, _op.lower() + "_1"))

kernel("Round", (11, 22))(np.rint)  # round half to even
kernel("Sign", (9, 13))(np.sign)
kernel("IsNaN", (9, 13, 20))(np.isnan)
for _op, _uf, _since in (
    ("Sin", np.sin, (7, 22)),
    ("Cos", np.cos, (7, 22)),
    ("Tan", np.tan, (7, 22)),
    ("Asin", np.arcsin, (7, 22)),
    ("Acos", np.arccos, (7, 22)),
    ("Atan", np.arctan, (7, 22)),
    ("Sinh", np.sinh, (9, 22)),
    ("Cosh", np.cosh, (9, 22)),
    ("Asinh", np.arcsinh, (9, 22)),
    ("Acosh", np.arccosh, (9, 22)),
    ("Atanh", np.arctanh, (9, 22)),
):
    kernel(_op, _since)(_uf)

kernel("Erf", (9, 13))(_fast.erf)  # fast float32 rational approximation; scipy for float64


@kernel("IsInf", (10, 20))
def isinf(x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return np.isinf(x)
    if detect_positive:
        return np.isposinf(x) if x.dtype.kind == "f" else np.isinf(x) & (x > 0)
    if detect_negative:
        return np.isneginf(x) if x.dtype.kind == "f" else np.isinf(x) & (x < 0)
    return np.zeros(x.shape, dtype=np.bool_)


# ---------------------------------------------------------------------------------------------------------------
# binary arithmetic
# ---------------------------------------------------------------------------------------------------------------
def _legacy_b(a, b, broadcast, axis):
    """Pre-opset-7 broadcasting: with ``broadcast=1`` and ``axis``, B's dims line up with A's from ``axis``."""
    if broadcast and axis is not None and b.ndim and b.ndim < a.ndim:
        ax = axis + a.ndim if axis < 0 else axis
        trailing = a.ndim - ax - b.ndim
        if ax < 0 or trailing < 0:
            raise ValueError(f"legacy broadcast axis={axis} does not fit B{b.shape} into A{a.shape}")
        if trailing:
            b = b.reshape(b.shape + (1,) * trailing)
    elif not broadcast and a.shape != b.shape and b.ndim:
        # opset < 7 with broadcast=0 requires equal shapes; scalars B were always accepted.
        if np.broadcast_shapes(a.shape, b.shape) != a.shape:
            raise ValueError(f"shapes {a.shape} and {b.shape} differ and broadcast=0")
    return b


def _legacy_binary(fn, name):
    def legacy(a, b, *, broadcast=0, axis=None):
        return fn(a, _legacy_b(a, b, broadcast, axis))

    legacy.__name__ = legacy.__qualname__ = name
    return legacy


def _int_div(a, b):
    """Integer division truncating toward zero (C semantics)."""
    if a.dtype.kind == "u" and b.dtype.kind == "u":
        return np.floor_divide(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.fmod(a, b)
        return np.floor_divide(a - r, b)


def div(a, b):
    if a.dtype.kind in "iu":
        return _int_div(a, b)
    return np.divide(a, b)


def _in_place_target(a, b, donated):
    """The donated operand (see registry: ``_donated``) that can hold ``a op b`` as it is, or None."""
    for p in donated:
        t = a if p == 0 else b
        o = b if p == 0 else a
        if t.ndim and t.dtype == o.dtype and (o.shape == t.shape or np.broadcast_shapes(t.shape, o.shape) == t.shape):
            return t
    return None


def _donating_binary(ufunc, name, int_ok=True):
    """A binary kernel that writes into a donated operand when it can; ``.plain`` is the bare ufunc."""

    def fn(a, b, *, _donated=()):
        if _donated and (int_ok or a.dtype.kind == "f"):
            t = _in_place_target(a, b, _donated)
            if t is not None:
                return ufunc(a, b, out=t)
        return ufunc(a, b) if ufunc is not np.divide else div(a, b)

    fn.__name__ = fn.__qualname__ = name
    fn.plain = ufunc if ufunc is not np.divide else div
    return fn


for _op, _fn, _int_ok in (("Add", np.add, True), ("Sub", np.subtract, True), ("Mul", np.multiply, True),
                          ("Div", np.divide, False)):
    kernel(_op, (7, 13, 14))(_donating_binary(_fn, _op.lower(), _int_ok))
    kernel(_op, (1, 6))(_legacy_binary(_fn if _fn is not np.divide else div, _op.lower() + "_legacy"))


def _pow_float(x, y):
    """x ** y computed in a float type and cast back to x's type (integer base or mixed types)."""
    if x.dtype.kind in "iu":
        # std::pow semantics on double, truncated back to the integer type
        with np.errstate(all="ignore"):
            r = np.power(x.astype(np.float64), y.astype(np.float64))
        return r.astype(x.dtype)
    xf = x if x.dtype in _NATIVE_FLOATS else x.astype(np.float32)
    yf = y if y.dtype in _NATIVE_FLOATS else y.astype(np.float32 if y.dtype.kind not in "iu" else np.float64)
    return np.power(xf, yf).astype(x.dtype, copy=False)


_POW_FAST = {2.0: lambda x: np.multiply(x, x), 3.0: lambda x: x * x * x, 1.0: lambda x: x.copy(),
             0.5: np.sqrt, -1.0: lambda x: np.divide(1, x, dtype=x.dtype)}


def pow_(x, y):
    xd = x.dtype
    if y.size == 1 and xd.kind == "f" and y.ndim <= x.ndim and y.dtype.kind in "fiu" and xd in _NATIVE_FLOATS:
        # constant small exponent (x ** 3 in GELU-tanh, x ** 2 in norms): plain multiplies, no powf per element
        fast = _POW_FAST.get(float(y.reshape(-1)[0]))
        if fast is not None:
            return fast(x)
    if xd == y.dtype:
        if xd.kind not in "iu":
            return np.power(x, y)
        try:
            return np.power(x, y)
        except ValueError:  # integers to negative integer powers
            return _pow_float(x, y)
    if xd.kind in "iu" and y.dtype.kind in "iu":
        try:
            return np.power(x, y.astype(xd))
        except ValueError:
            return _pow_float(x, y)
    if xd.kind == "f" and y.dtype.kind in "iu":
        # float base with integer exponent: exponent converted to the base type
        return np.power(x, y.astype(xd))
    return _pow_float(x, y)


def _pow_specialize(consts, kwargs):
    """A constant one-element exponent with a multiply form (x ** 2 in norms and STFT magnitudes): the lookup is done
    once, per plan; any other base than a float32/float64 array of at least the exponent's rank takes ``pow_``."""
    y = consts[1] if len(consts) == 2 else None
    if type(y) is not np.ndarray or y.size != 1 or y.dtype.kind not in "fiu":
        return None
    fast = _POW_FAST.get(float(y.reshape(-1)[0]))
    if fast is None:
        return None
    nd = y.ndim

    def pow_const(x, e):
        if type(x) is np.ndarray and x.dtype in _NATIVE_FLOATS and nd <= x.ndim and e is y:
            return fast(x)
        return pow_(x, e)

    return pow_const


pow_.specialize = _pow_specialize
kernel("Pow", (7, 12, 13, 15))(pow_)
kernel("Pow", 1)(_legacy_binary(pow_, "pow_legacy"))


@kernel("Mod", (10, 13, 28))
def mod(a, b, *, fmod=0):
    if fmod:
        return np.fmod(a, b)
    return np.mod(a, b)


@kernel("BitShift", (11, 28))
def bitshift(x, y, *, direction=""):
    if direction == "LEFT":
        return np.left_shift(x, y)
    if direction == "RIGHT":
        return np.right_shift(x, y)
    raise ValueError(f"BitShift direction must be 'LEFT' or 'RIGHT', got {direction!r}")


# ---------------------------------------------------------------------------------------------------------------
# logic, bitwise, comparison
# ---------------------------------------------------------------------------------------------------------------
for _op, _fn in (("And", np.logical_and), ("Or", np.logical_or), ("Xor", np.logical_xor)):
    kernel(_op, 7)(_fn)
    kernel(_op, 1)(_legacy_binary(_fn, _op.lower() + "_legacy"))
kernel("Not", 1)(np.logical_not)
kernel("BitwiseAnd", 18)(np.bitwise_and)
kernel("BitwiseOr", 18)(np.bitwise_or)
kernel("BitwiseXor", 18)(np.bitwise_xor)
kernel("BitwiseNot", 18)(np.invert)

kernel("Equal", (7, 11, 13, 19))(np.equal)
kernel("Equal", 1)(_legacy_binary(np.equal, "equal_legacy"))
kernel("Greater", (7, 9, 13))(np.greater)
kernel("Greater", 1)(_legacy_binary(np.greater, "greater_legacy"))
kernel("Less", (7, 9, 13))(np.less)
kernel("Less", 1)(_legacy_binary(np.less, "less_legacy"))
kernel("GreaterOrEqual", (12, 16))(np.greater_equal)
kernel("LessOrEqual", (12, 16))(np.less_equal)


# ---------------------------------------------------------------------------------------------------------------
# variadic
# ---------------------------------------------------------------------------------------------------------------
def _need_inputs(op, xs):
    if not xs:
        raise ValueError(f"{op} needs at least one input")


@kernel("Max", (1, 6, 8, 12, 13))
def max_(*xs):
    if len(xs) == 2:
        r = _fast.bound(xs[0], xs[1], False)
        return np.maximum(xs[0], xs[1]) if r is None else r
    _need_inputs("Max", xs)
    r = xs[0]
    for x in xs[1:]:
        r = np.maximum(r, x)
    return r


@kernel("Min", (1, 6, 8, 12, 13))
def min_(*xs):
    if len(xs) == 2:
        r = _fast.bound(xs[0], xs[1], True)
        return np.minimum(xs[0], xs[1]) if r is None else r
    _need_inputs("Min", xs)
    r = xs[0]
    for x in xs[1:]:
        r = np.minimum(r, x)
    return r


@kernel("Sum", (1, 6, 8, 13))
def sum_(*xs, _donated=()):
    if len(xs) == 2:
        if _donated:
            t = _in_place_target(xs[0], xs[1], _donated)
            if t is not None:
                return np.add(xs[0], xs[1], out=t)
        return np.add(xs[0], xs[1])
    _need_inputs("Sum", xs)
    r = xs[0]
    for x in xs[1:]:
        r = np.add(r, x)
    return r


@kernel("Mean", (1, 6, 8, 13))
def mean(*xs):
    _need_inputs("Mean", xs)
    if len(xs) == 1:
        return xs[0]
    dt = xs[0].dtype
    if dt.kind != "f" or dt.itemsize < 4:  # float16 / bfloat16: accumulate in float32
        r = np.add(xs[0].astype(np.float32), xs[1])
    else:
        r = np.add(xs[0], xs[1])
    for x in xs[2:]:
        r = np.add(r, x)
    r /= len(xs)
    return r.astype(dt, copy=False)


# ---------------------------------------------------------------------------------------------------------------
# selection, clipping, identity
# ---------------------------------------------------------------------------------------------------------------
kernel("Where", (9, 16))(np.where)

_FLT_MAX = float(np.finfo(np.float32).max)


@kernel("Clip", (1, 6))
def clip_6(x, *, min=-_FLT_MAX, max=_FLT_MAX):  # noqa: A002 - ONNX attribute names
    if x.dtype in (np.float32, np.float64) and (min > -_FLT_MAX or max < _FLT_MAX):
        t = x.dtype.type
        return _fast.clamp(x, t(min) if min > -_FLT_MAX else None, t(max) if max < _FLT_MAX else None)
    if min > -_FLT_MAX:
        x = np.maximum(x, min)
    if max < _FLT_MAX:
        x = np.minimum(x, max)
    return x


def _clip_bound(v, name):
    if v.size != 1:
        raise ValueError(f"Clip '{name}' must be a scalar tensor, got shape {v.shape}")
    return v.reshape(())


@kernel("Clip", (11, 12, 13))
def clip_11(x, min=None, max=None, *, _donated=()):  # noqa: A002 - ONNX input names
    lo = None if min is None else _clip_bound(min, "min")
    hi = None if max is None else _clip_bound(max, "max")
    out = x if _donated and 0 in _donated and x.ndim else None
    if lo is not None and hi is not None:
        if lo.dtype == x.dtype and hi.dtype == x.dtype:
            # one pass: min(max(x, lo), hi), NaN propagates, lo > hi gives hi (as the spec says)
            return _fast.clamp(x, lo, hi, out=out)
        return np.minimum(np.maximum(x, lo), hi)
    if lo is not None:
        if lo.dtype == x.dtype:  # (float32/64: the clip loop, ~4x numpy's maximum against a scalar)
            return _fast.clamp(x, lo, None, out=out)
        return np.maximum(x, lo)
    if hi is not None:
        if hi.dtype == x.dtype:
            return _fast.clamp(x, None, hi, out=out)
        return np.minimum(x, hi)
    return x


@kernel("Identity", (1, 13, 14, 16, 19, 21, 23, 24, 25))
def identity(x):
    return x
