"""Shape and generator kernels: Shape, Size, Constant, ConstantOfShape, Range, EyeLike, OneHot, Unique."""

from __future__ import annotations

import weakref

import numpy as np

from ..dtypes import is_ml_dtype, to_numpy
from ._shape_util import check_shape, full, norm_axis, to_ints
from .registry import kernel

# ----------------------------------------------------------------------------------------------------------
# Shape / Size


@kernel("Shape", since=1)
def shape_1(data):
    return np.array(data.shape, dtype=np.int64)


@kernel("Shape", since=15)
def shape_15(data, *, start=0, end=None):
    r = data.ndim
    s = int(start)
    s = min(max(s + r if s < 0 else s, 0), r)
    if end is None:
        e = r
    else:
        e = int(end)
        e = min(max(e + r if e < 0 else e, 0), r)
    return np.array(data.shape[s:e] if e > s else (), dtype=np.int64)


def _shape_spec_all(data):
    return np.array(data.shape, dtype=np.int64)


def _spec_shape(consts, kwargs):
    if len(consts) != 1 or int(kwargs.get("start", 0)) != 0 or kwargs.get("end") is not None:
        return None
    return _shape_spec_all


shape_15.specialize = _spec_shape


@kernel("Size", since=1)
def size(data):
    return np.array(data.size, dtype=np.int64)


# ----------------------------------------------------------------------------------------------------------
# Constant / ConstantOfShape


def _str_array(v) -> np.ndarray:
    out = np.empty(len(v) if isinstance(v, list) else (), dtype=object)
    if isinstance(v, list):
        out[:] = v
    else:
        out[()] = v
    return out


@kernel("Constant", since=1)
def constant(*, value=None, sparse_value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, value_string=None, value_strings=None):
    if (type(value) is np.ndarray and sparse_value is None and value_float is None and value_floats is None
            and value_int is None and value_ints is None and value_string is None and value_strings is None):
        return value  # the common case, on the hot path of subgraph bodies
    given = [(n, v) for n, v in (
        ("value", value), ("sparse_value", sparse_value), ("value_float", value_float),
        ("value_floats", value_floats), ("value_int", value_int), ("value_ints", value_ints),
        ("value_string", value_string), ("value_strings", value_strings),
    ) if v is not None]
    if len(given) != 1:
        raise ValueError(
            "Constant: exactly one of value, sparse_value, value_float(s), value_int(s), value_string(s) must be set"
            f" (got {[n for n, _ in given] or 'none'})"
        )
    name, v = given[0]
    if name in ("value", "sparse_value"):
        return v if isinstance(v, np.ndarray) else np.asarray(v)
    if name == "value_float":
        return np.array(v, dtype=np.float32)
    if name == "value_floats":
        return np.array(v, dtype=np.float32).reshape(-1)
    if name == "value_int":
        return np.array(v, dtype=np.int64)
    if name == "value_ints":
        return np.array(v, dtype=np.int64).reshape(-1)
    return _str_array(v)


# Results of ConstantOfShape whose shape tensor is still alive, keyed by that tensor's id: models that declare their
# weights as ConstantOfShape(shape initializer) (onnx's light_* models) refill the same weights on every run.  The
# cached result is read-only (kernels never write into inputs; the session copies read-only results it hands out)
# and the entry goes away with the shape tensor (a weakref callback), so it lives as long as the session's
# initializer does.
_COS_CACHE: dict = {}
_COS_MIN_ELEMS = 64  # below this a fresh np.full is as cheap as the lookup


def _cos_drop(key):
    def drop(_ref):
        for k in [k for k in list(_COS_CACHE) if k[0] == key]:
            _COS_CACHE.pop(k, None)
    return drop


@kernel("ConstantOfShape", since=9)
def constant_of_shape(input, *, value=None):
    shape = to_ints(input, "shape")
    if value is None:
        dtype, fill = np.dtype(np.float32), 0
    else:
        v = np.asarray(value)
        if v.size != 1:
            raise ValueError(f"ConstantOfShape: value must hold exactly one element, got shape {list(v.shape)}")
        dtype, fill = v.dtype, v.reshape(-1)[0]
    shape = tuple(check_shape(shape, dtype, "ConstantOfShape output"))
    if dtype.kind in "biuf" and isinstance(input, np.ndarray) and not input.flags.writeable:
        n = 1
        for d in shape:
            n *= d
        if n >= _COS_MIN_ELEMS:
            key = (id(input), dtype.str, np.asarray(fill, dtype=dtype).tobytes())
            hit = _COS_CACHE.get(key)
            if hit is not None and hit[0]() is input and hit[1] == shape:
                return hit[2]
            out = full(shape, fill, dtype)
            out.flags.writeable = False
            try:
                ref = weakref.ref(input, _cos_drop(id(input)))
            except TypeError:
                return out
            _COS_CACHE[key] = (ref, shape, out)
            return out
    return full(shape, fill, dtype)


# ----------------------------------------------------------------------------------------------------------
# Range


def _range(start, limit, delta, stash_type=1):
    arrs = [np.asarray(v) for v in (start, limit, delta)]
    for name, a in zip(("start", "limit", "delta"), arrs):
        if a.size != 1:
            raise ValueError(f"Range: {name} must be a scalar, got shape {list(a.shape)}")
    dtype = arrs[0].dtype
    s, lim, d = (a.reshape(()) for a in arrs)
    if dtype.kind in "iu":
        si, li, di = int(s), int(lim), int(d)
        if di == 0:
            raise ValueError("Range: delta must not be 0")
        n = max(-((si - li) // di), 0)
        check_shape([n], dtype, "Range output")
        return (si + np.arange(n, dtype=np.int64) * di).astype(dtype, copy=False)
    sf, lf, df = float(s), float(lim), float(d)
    if df == 0:
        raise ValueError("Range: delta must not be 0")
    if not np.isfinite([sf, lf, df]).all():
        raise ValueError(f"Range: start/limit/delta must be finite, got {sf}, {lf}, {df}")
    n = max(int(np.ceil((lf - sf) / df)), 0)
    check_shape([n], dtype, "Range output")
    if stash_type == 0 and (dtype == np.float16 or is_ml_dtype(dtype)):
        steps = np.full(n, d, dtype=dtype)
        if n:
            steps[0] = s
        return np.cumsum(steps, dtype=dtype)
    return (sf + np.arange(n, dtype=np.float64) * df).astype(dtype)


@kernel("Range", since=11)
def range_11(start, limit, delta):
    return _range(start, limit, delta)


@kernel("Range", since=27)
def range_27(start, limit, delta, *, stash_type=1):
    return _range(start, limit, delta, stash_type)


# ----------------------------------------------------------------------------------------------------------
# EyeLike / OneHot


@kernel("EyeLike", since=9)
def eye_like(input, *, dtype=None, k=0):
    if input.ndim != 2:
        raise ValueError(f"EyeLike: input must be 2-D, got shape {list(input.shape)}")
    dt = input.dtype if dtype is None else to_numpy(dtype)
    n, m = input.shape
    out = np.zeros((n, m), dtype=dt)
    kk = int(k)
    i = np.arange(max(0, -kk), min(n, m - kk)) if m - kk > 0 else np.arange(0)
    if i.size:
        out[i, i + kk] = 1
    return out


@kernel("OneHot", since=9)
def one_hot(indices, depth, values, *, axis=-1):
    ind = np.asarray(indices)
    dep = np.asarray(depth)
    if dep.size != 1:
        raise ValueError(f"OneHot: depth must be a scalar, got shape {list(dep.shape)}")
    d = int(dep.reshape(-1)[0].astype(np.float64)) if dep.dtype.kind == "f" or is_ml_dtype(dep.dtype) \
        else int(dep.reshape(-1)[0])
    if d <= 0:
        raise ValueError(f"OneHot: depth must be positive, got {d}")
    vals = np.asarray(values)
    if vals.size != 2:
        raise ValueError(f"OneHot: values must hold [off_value, on_value], got shape {list(vals.shape)}")
    vals = vals.reshape(-1)
    r = ind.ndim
    a = int(axis)
    if not -r - 1 <= a <= r:
        raise ValueError(f"OneHot: axis {axis} is out of range for output rank {r + 1}")
    if a < 0:
        a += r + 1
    check_shape(ind.shape + (d,), vals.dtype, "OneHot output")
    if ind.dtype.kind == "f" or is_ml_dtype(ind.dtype):
        ind = ind.astype(np.float64)
    idx = ind.astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)
    hot = idx[..., None] == np.arange(d, dtype=np.int64)
    if a != r:
        hot = np.moveaxis(hot, -1, a)
    return np.where(hot, vals[1], vals[0]).astype(vals.dtype, copy=False)


# ----------------------------------------------------------------------------------------------------------
# Unique


def _sort_key(x: np.ndarray) -> np.ndarray:
    """An array whose order/equality matches ``x`` and that numpy can sort (ml_dtypes -> float32)."""
    if is_ml_dtype(x.dtype):
        return x.astype(np.float32)
    return x


def _unique_rows(rows: np.ndarray):
    """Sorted unique rows of a 2-D array: (first-occurrence index, inverse, counts) in sorted order."""
    n = rows.shape[0]
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    if rows.shape[1] == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(n, dtype=np.int64), np.array([n], dtype=np.int64)
    order = np.lexsort(rows.T[::-1])  # stable: equal rows keep their original order
    srt = rows[order]
    new = np.empty(n, dtype=bool)
    new[0] = True
    neq = srt[1:] != srt[:-1]
    if srt.dtype.kind in "fc":  # NaN == NaN for uniqueness (as numpy.unique does)
        neq &= ~(np.isnan(srt[1:]) & np.isnan(srt[:-1]))
    new[1:] = neq.any(axis=1)
    group = np.cumsum(new) - 1
    first = order[new]
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = group
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, n))
    return first.astype(np.int64), inverse, counts.astype(np.int64)


@kernel("Unique", since=11)
def unique(X, *, axis=None, sorted=1):
    if axis is None:
        flat = X.reshape(-1)
        key = _sort_key(flat)
        if key.dtype == object:
            _, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
        else:
            first, inverse, counts = _unique_rows(key.reshape(-1, 1))
        src, ax = flat, 0
    else:
        ax = norm_axis(axis, X.ndim)
        moved = np.moveaxis(X, ax, 0)
        rows = _sort_key(moved.reshape(moved.shape[0], -1))
        first, inverse, counts = _unique_rows(rows)
        src = X
    first = np.asarray(first, dtype=np.int64).reshape(-1)
    inverse = np.asarray(inverse, dtype=np.int64).reshape(-1)
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    if not sorted:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.shape[0], dtype=np.int64)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    Y = np.take(src, first, axis=ax)
    return Y, first, inverse, counts


