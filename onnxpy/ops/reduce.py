"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin, TopK, CumSum, CumProd.

Axes are an attribute before opset 13 (ReduceSum) / 18 (the others) and an optional int64 input after.  Reducing over
an empty axes list reduces over every axis unless ``noop_with_empty_axes`` is set, in which case the reduction runs
over no axis at all (the element-wise parts -- square, abs, log, exp -- still apply, as onnxruntime does).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ._common import ones_vector
from ._shape_util import NOT_CONST
from .registry import kernel

_F32 = np.dtype(np.float32)
_LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _is_low_float(dt: np.dtype) -> bool:
    return dt in _LOW_FLOATS


def _as_array(x, name="input"):
    if not isinstance(x, np.ndarray):
        if x is None:
            raise ValueError(f"required {name} is missing")
        x = np.asarray(x)
    return x


def _norm_axes(axes, ndim: int, op: str) -> tuple[int, ...] | None:
    """Normalize an axes attribute/input to a sorted tuple of non-negative axes; None means 'not given / empty'."""
    if axes is None:
        return None
    if isinstance(axes, np.ndarray):
        if axes.dtype.kind not in "iu":
            raise TypeError(f"{op}: axes must be an integer tensor, got {axes.dtype}")
        axes = axes.reshape(-1).tolist()
    else:
        axes = [int(a) for a in axes]
    if len(axes) == 0:
        return None
    out = set()
    for a in axes:
        if not -ndim <= a < max(ndim, 1) or (ndim == 0 and a not in (0, -1)):
            raise ValueError(f"{op}: axis {a} is out of range for a tensor of rank {ndim}")
        out.add(a + ndim if a < 0 else a)
    if ndim == 0:
        return ()
    return tuple(sorted(out))


def _reduced_is_empty(x: np.ndarray, axes: tuple[int, ...]) -> bool:
    return any(x.shape[a] == 0 for a in axes)


def _finish(res, x_dtype: np.dtype):
    res = np.asarray(res)
    if res.dtype != x_dtype:
        res = res.astype(x_dtype)
    return res


# --- reduction bodies: (x, axes, keepdims) -> array; axes is a tuple (possibly empty, meaning no reduction) --------


_GEMV_F = (np.dtype(np.float32), np.dtype(np.float64))


def _reduced_shape(shape, axes, keepdims) -> list:
    """The shape of ``shape`` reduced over ``axes`` (kept as 1s with ``keepdims``)."""
    return [1 if i in axes else d for i, d in enumerate(shape)] if keepdims else \
        [d for i, d in enumerate(shape) if i not in axes]


def _gemv_sum(x, axes, keepdims):
    """np.add.reduce(x, axes) for a C-contiguous float32/float64 x reduced over a run of adjacent axes, as
    matrix-vector products with ones (BLAS runs them 3-5x faster than numpy's reduction, with float32 errors of
    1-4e-7 relative, as onnxruntime's float accumulation); None otherwise."""
    k = len(axes)
    if x.dtype not in _GEMV_F or not k or not x.flags.c_contiguous or x.size < 4096:  # (small: numpy's is faster)
        return None
    axes = tuple(sorted(axes))
    a0 = axes[0]
    if axes != tuple(range(a0, a0 + k)):
        return None
    A, S = math.prod(x.shape[:a0]), math.prod(x.shape[a0:a0 + k])
    B = x.size // (A * S)
    ones = ones_vector(S, x.dtype) if S >= 8 else None
    if ones is None:
        return None
    if B == 1:
        res = np.matmul(x.reshape(A, S), ones)
    else:  # (one vector-matrix product per leading index)
        res = np.matmul(ones, x.reshape(A, S, B))
    return res.reshape(_reduced_shape(x.shape, axes, keepdims))


def _sum(x, axes, keepdims):
    fast = _gemv_sum(x, axes, keepdims)
    if fast is not None:
        return fast
    if _is_low_float(x.dtype):
        return _finish(np.add.reduce(x.astype(_F32), axis=axes, keepdims=keepdims), x.dtype)
    if x.dtype == np.bool_:
        return _finish(np.add.reduce(x, axis=axes, keepdims=keepdims, dtype=np.int64), x.dtype)
    return np.add.reduce(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _mean(x, axes, keepdims):
    count = 1
    for a in axes:
        count *= x.shape[a]
    if x.dtype.kind == "f" or _is_low_float(x.dtype):
        acc = x.astype(_F32) if _is_low_float(x.dtype) else x
        with np.errstate(invalid="ignore", divide="ignore"):
            s = np.add.reduce(acc, axis=axes, keepdims=keepdims)
            res = s / acc.dtype.type(count) if count else s * np.nan
        return _finish(res, x.dtype)
    # integers: the mean truncates toward zero like the C++ integer division onnxruntime does
    s = np.add.reduce(x, axis=axes, keepdims=keepdims, dtype=np.float64)
    if count == 0:
        return np.zeros(s.shape, x.dtype)
    return _finish(np.trunc(s / count), x.dtype)


def _minmax(ufunc, is_max):
    def body(x, axes, keepdims):
        work = x.astype(_F32) if _is_low_float(x.dtype) else x
        if _reduced_is_empty(x, axes):
            dt = work.dtype
            if dt == np.bool_:
                init = not is_max
            elif dt.kind == "f":
                init = -np.inf if is_max else np.inf
            elif dt.kind in "iu":
                info = np.iinfo(dt)
                init = info.min if is_max else info.max
            else:
                raise TypeError(f"unsupported element type {dt} for an empty reduction")
            res = ufunc.reduce(work, axis=axes, keepdims=keepdims, initial=init)
        else:
            res = ufunc.reduce(work, axis=axes, keepdims=keepdims)
        return _finish(res, x.dtype)

    return body


_max = _minmax(np.maximum, True)
_min = _minmax(np.minimum, False)


def _prod(x, axes, keepdims):
    if _is_low_float(x.dtype):
        return _finish(np.multiply.reduce(x.astype(_F32), axis=axes, keepdims=keepdims), x.dtype)
    return np.multiply.reduce(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _float_work(x):
    """Working dtype for reductions with a float transform: float32 for narrow floats, float64 for integers."""
    if _is_low_float(x.dtype):
        return x.astype(_F32)
    if x.dtype.kind in "iub":
        return x.astype(np.float64)
    return x


def _l1(x, axes, keepdims):
    if x.dtype.kind in "iu":
        return np.add.reduce(np.abs(x), axis=axes, keepdims=keepdims, dtype=x.dtype)
    w = _float_work(x)
    return _finish(np.add.reduce(np.abs(w), axis=axes, keepdims=keepdims), x.dtype)


def _sum_square(x, axes, keepdims):
    if x.dtype.kind in "iu":
        return np.add.reduce(x * x, axis=axes, keepdims=keepdims, dtype=x.dtype)
    w = _float_work(x)
    return _finish(np.add.reduce(w * w, axis=axes, keepdims=keepdims), x.dtype)


def _l2(x, axes, keepdims):
    w = _float_work(x)
    res = np.sqrt(np.add.reduce(w * w, axis=axes, keepdims=keepdims))
    if x.dtype.kind in "iu":
        res = np.trunc(res)
    return _finish(res, x.dtype)


def _log_sum(x, axes, keepdims):
    w = _float_work(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        res = np.log(np.add.reduce(w, axis=axes, keepdims=keepdims))
    return _finish(res, x.dtype)


def _log_sum_exp(x, axes, keepdims):
    w = _float_work(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if _reduced_is_empty(w, axes) or w.size == 0:
            res = np.log(np.add.reduce(np.exp(w), axis=axes, keepdims=keepdims))
        else:
            m = np.maximum.reduce(w, axis=axes, keepdims=True)
            m = np.where(np.isfinite(m), m, 0).astype(w.dtype, copy=False)
            s = np.add.reduce(np.exp(w - m), axis=axes, keepdims=True)
            res = np.log(s) + m
            if not keepdims:
                res = res.reshape([d for i, d in enumerate(w.shape) if i not in axes])
    return _finish(res, x.dtype)


_BODIES = {
    "ReduceSum": _sum,
    "ReduceMean": _mean,
    "ReduceMax": _max,
    "ReduceMin": _min,
    "ReduceProd": _prod,
    "ReduceL1": _l1,
    "ReduceL2": _l2,
    "ReduceLogSum": _log_sum,
    "ReduceLogSumExp": _log_sum_exp,
    "ReduceSumSquare": _sum_square,
}


def _reduce(op, body, data, axes, keepdims, noop):
    data = _as_array(data, "data")
    if data.dtype == object:
        raise TypeError(f"{op} does not support string tensors")
    ax = _norm_axes(axes, data.ndim, op)
    if ax is None:
        ax = () if noop else tuple(range(data.ndim))
    return body(data, ax, bool(keepdims))


def _make_attr_kernel(op, body):
    def reduce_attr(data, *, axes=None, keepdims=1):
        return _reduce(op, body, data, axes, keepdims, False)

    reduce_attr.__name__ = reduce_attr.__qualname__ = f"{op}_attr_axes"
    return reduce_attr


def _make_input_kernel(op, body):
    def reduce_input(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(op, body, data, axes, keepdims, noop_with_empty_axes)

    reduce_input.__name__ = reduce_input.__qualname__ = f"{op}_input_axes"
    return reduce_input


# (attribute-axes versions, input-axes versions) for each op
_VERSIONS = {
    "ReduceSum": ((1, 11), (13,)),
    "ReduceMean": ((1, 11, 13), (18,)),
    "ReduceMax": ((1, 11, 12, 13), (18, 20)),
    "ReduceMin": ((1, 11, 12, 13), (18, 20)),
    "ReduceProd": ((1, 11, 13), (18,)),
    "ReduceL1": ((1, 11, 13), (18,)),
    "ReduceL2": ((1, 11, 13), (18,)),
    "ReduceLogSum": ((1, 11, 13), (18, 28)),
    "ReduceLogSumExp": ((1, 11, 13), (18, 28)),
    "ReduceSumSquare": ((1, 11, 13), (18,)),
}

_NATIVE_F = (_F32, np.dtype(np.float64))


def _mean_native(x, axes, keepdims):
    """ReduceMean of a float32/float64 tensor over a non-empty selection (errstate-free: nothing to warn about
    but an overflowing sum, and plans run with floating-point warnings off); anything else: :func:`_mean`."""
    dt = x.dtype
    if dt in _NATIVE_F:
        count = 1
        shp = x.shape
        for a in axes:
            count *= shp[a]
        if count == 1:  # (every reduced axis has length 1: the mean of one element is that element, exactly)
            return x.reshape(_reduced_shape(shp, axes, keepdims))
        if count:
            s = _gemv_sum(x, axes, keepdims)
            if s is None:
                s = np.add.reduce(x, axis=axes, keepdims=keepdims)
            return np.asarray(s / dt.type(count))
    return _mean(x, axes, keepdims)


def _make_spec(op, body, attr: bool):
    """Plan-time specialisation: constant axes (attribute or constant input) are normalised once per rank."""
    fast_body = _mean_native if body is _mean else body

    def spec(consts, kwargs):
        if attr:
            if len(consts) != 1:
                return None
            axes = kwargs.get("axes")
            noop = False
        else:
            axes = consts[1] if len(consts) > 1 else None
            if axes is NOT_CONST or len(consts) > 2:
                return None
            noop = bool(kwargs.get("noop_with_empty_axes", 0))
        keepdims = bool(kwargs.get("keepdims", 1))
        memo = {}

        def reduce_const(data, *args):
            if type(data) is not np.ndarray or data.dtype == object:
                return _reduce(op, body, data, axes, keepdims, noop)
            r = data.ndim
            ax = memo.get(r)
            if ax is None:
                ax = _norm_axes(axes, r, op)
                if ax is None:
                    ax = () if noop else tuple(range(r))
                memo[r] = ax
            return fast_body(data, ax, keepdims)

        return reduce_const

    return spec


for _op, (_attr_vs, _input_vs) in _VERSIONS.items():
    _k = _make_attr_kernel(_op, _BODIES[_op])
    _k.specialize = _make_spec(_op, _BODIES[_op], True)
    kernel(_op, since=_attr_vs)(_k)
    _k = _make_input_kernel(_op, _BODIES[_op])
    _k.specialize = _make_spec(_op, _BODIES[_op], False)
    kernel(_op, since=_input_vs)(_k)


# --- ArgMax / ArgMin ---------------------------------------------------------------------------------------------


def _norm_axis(axis, ndim, op):
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def _arg(op, fn, data, axis, keepdims, select_last_index):
    data = _as_array(data, "data")
    if data.ndim == 0:
        data = data.reshape(1)
    axis = _norm_axis(axis, data.ndim, op)
    if data.shape[axis] == 0:
        raise ValueError(f"{op}: cannot reduce over axis {axis} of size 0 (shape {data.shape})")
    work = data.astype(_F32) if _is_low_float(data.dtype) else data
    if select_last_index:
        n = work.shape[axis]
        idx = (n - 1) - fn(np.flip(work, axis=axis), axis=axis, keepdims=bool(keepdims))
    else:
        idx = fn(work, axis=axis, keepdims=bool(keepdims))
    return np.asarray(idx, dtype=np.int64)


@kernel("ArgMax", since=(1, 11, 12, 13))
def argmax(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg("ArgMax", np.argmax, data, axis, keepdims, select_last_index)


@kernel("ArgMin", since=(1, 11, 12, 13))
def argmin(data, *, axis=0, keepdims=1, select_last_index=0):
    return _arg("ArgMin", np.argmin, data, axis, keepdims, select_last_index)


# --- TopK ----------------------------------------------------------------------------------------------------------


def _stable_order(v: np.ndarray, largest: bool) -> np.ndarray:
    """Indices sorting the last axis of ``v``; ties keep the lower index first; NaN counts as the largest value."""
    if not largest:
        return np.argsort(v, axis=-1, kind="stable")
    n = v.shape[-1]
    # ascending stable sort of the reversed array, reversed again: descending with ties by ascending index
    return (n - 1) - np.argsort(v[..., ::-1], axis=-1, kind="stable")[..., ::-1]


def _topk_last_axis(v: np.ndarray, k: int, largest: bool) -> np.ndarray:
    n = v.shape[-1]
    if k == 0:
        return np.zeros(v.shape[:-1] + (0,), np.int64)
    if n >= 512 and k * 8 <= n and v.size > 0:
        idx = _topk_partition(v, k, largest)
        if idx is not None:
            return idx
    return _stable_order(v, largest)[..., :k]


def _topk_partition(v, k, largest):
    """Select the k extreme elements in O(n) per row, then sort only those; None when a NaN is the threshold."""
    n = v.shape[-1]
    kth = n - k if largest else k - 1
    thr = np.partition(v, kth, axis=-1)[..., kth:kth + 1]
    is_float = v.dtype.kind == "f"
    if is_float and np.isnan(thr).any():
        return None
    # strictly beyond the threshold (for largest, NaN counts as beyond: it compares false with <=)
    strict = np.logical_not(np.less_equal(v, thr)) if largest else np.less(v, thr)
    eq = np.equal(v, thr)
    need = k - np.count_nonzero(strict, axis=-1, keepdims=True)
    n_eq = np.count_nonzero(eq, axis=-1, keepdims=True)
    if (n_eq != need).any():  # more ties than slots on some rows: keep the lowest-index ties
        eq &= np.cumsum(eq, axis=-1) <= need
    strict |= eq
    rows = int(np.prod(v.shape[:-1], dtype=np.int64))
    flat = np.flatnonzero(strict)
    cand = (flat.reshape(rows, k) - np.arange(rows, dtype=flat.dtype)[:, None] * n).reshape(v.shape[:-1] + (k,))
    vals = np.take_along_axis(v, cand, axis=-1)
    return np.take_along_axis(cand, _stable_order(vals, largest), axis=-1)


def _topk(x, k, axis, largest):
    x = _as_array(x, "X")
    if x.ndim == 0:
        raise ValueError("TopK: input must have rank >= 1")
    axis = _norm_axis(axis, x.ndim, "TopK")
    n = x.shape[axis]
    if k < 0 or k > n:
        raise ValueError(f"TopK: k={k} is out of range for axis {axis} of size {n}")
    work = x.astype(_F32) if _is_low_float(x.dtype) else x
    v = np.moveaxis(work, axis, -1)
    idx = _topk_last_axis(v, k, bool(largest))
    values = np.take_along_axis(np.moveaxis(x, axis, -1), idx, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(idx.astype(np.int64, copy=False), -1, axis)


def _k_value(K):
    K = _as_array(K, "K")
    if K.dtype.kind not in "iu" or K.size != 1:
        raise ValueError(f"TopK: K must be a single int64 value, got {K.dtype} of shape {K.shape}")
    return int(K.reshape(-1)[0])


@kernel("TopK", since=1)
def topk_1(X, *, k, axis=-1):
    return _topk(X, int(k), axis, True)


@kernel("TopK", since=10)
def topk_10(X, K, *, axis=-1):
    return _topk(X, _k_value(K), axis, True)


@kernel("TopK", since=(11, 24))
def topk_11(X, K, *, axis=-1, largest=1, sorted=1):  # noqa: A002 - attribute name from the spec
    return _topk(X, _k_value(K), axis, largest)


# --- CumSum / CumProd ---------------------------------------------------------------------------------------------


def _cumulate(op, ufunc, identity, x, axis, exclusive, reverse):
    x = _as_array(x, "x")
    axis = _as_array(axis, "axis")
    if axis.dtype.kind not in "iu" or axis.size != 1:
        raise ValueError(f"{op}: axis must be a single integer, got {axis.dtype} of shape {axis.shape}")
    if x.ndim == 0:
        raise ValueError(f"{op}: input must have rank >= 1")
    ax = _norm_axis(int(axis.reshape(-1)[0]), x.ndim, op)
    work = x.astype(_F32) if _is_low_float(x.dtype) else x
    if reverse:
        work = np.flip(work, axis=ax)
    if exclusive:
        n = work.shape[ax]
        head = [slice(None)] * x.ndim
        head[ax] = slice(0, max(n - 1, 0))
        res = np.empty(work.shape, work.dtype)
        first = [slice(None)] * x.ndim
        first[ax] = slice(0, min(1, n))
        rest = [slice(None)] * x.ndim
        rest[ax] = slice(1, None)
        res[tuple(first)] = identity
        ufunc.accumulate(work[tuple(head)], axis=ax, dtype=work.dtype, out=res[tuple(rest)])
    else:
        res = ufunc.accumulate(work, axis=ax, dtype=work.dtype)
    if reverse:
        res = np.flip(res, axis=ax)
    return _finish(res, x.dtype)


@kernel("CumSum", since=(11, 14))
def cumsum(x, axis, *, exclusive=0, reverse=0):
    return _cumulate("CumSum", np.add, 0, x, axis, exclusive, reverse)


@kernel("CumProd", since=26)
def cumprod(x, axis, *, exclusive=0, reverse=0):
    return _cumulate("CumProd", np.multiply, 1, x, axis, exclusive, reverse)
