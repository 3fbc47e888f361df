"""Indexing kernels: Slice, Gather, GatherElements, GatherND, Scatter, ScatterElements, ScatterND,
TensorScatter, Compress, NonZero."""

from __future__ import annotations

import numpy as np

from ._shape_util import NOT_CONST, frozen, norm_axes, norm_axis, norm_indices, to_ints
from .registry import kernel

# ----------------------------------------------------------------------------------------------------------
# Slice


def _slice(x, starts, ends, axes, steps):
    return x[_slice_index(x, starts, ends, axes, steps)]


def _slice_index(x, starts, ends, axes, steps):
    r = x.ndim
    n = len(starts)
    if len(ends) != n:
        raise ValueError(f"Slice: starts has {n} values but ends has {len(ends)}")
    axes = list(range(n)) if axes is None else norm_axes(axes, r)
    if len(axes) != n:
        raise ValueError(f"Slice: axes has {len(axes)} values but starts has {n}")
    if steps is None:
        steps = [1] * n
    elif len(steps) != n:
        raise ValueError(f"Slice: steps has {len(steps)} values but starts has {n}")
    idx = [slice(None)] * r
    for a, s, e, st in zip(axes, starts, ends, steps):
        dim = x.shape[a]
        if st == 0:
            raise ValueError("Slice: steps must not be 0")
        if s < 0:
            s += dim
        if e < 0:
            e += dim
        if st > 0:
            s = min(max(s, 0), dim)
            e = min(max(e, 0), dim)
            idx[a] = slice(s, e, st)
        else:
            if dim == 0:
                idx[a] = slice(0, 0)
                continue
            s = min(max(s, 0), dim - 1)
            e = min(max(e, -1), dim - 1)
            idx[a] = slice(s, e if e >= 0 else None, st)
    return tuple(idx)


@kernel("Slice", since=1)
def slice_1(data, *, starts=None, ends=None, axes=None):
    if starts is None or ends is None:
        raise ValueError("Slice-1: the 'starts' and 'ends' attributes are required")
    return _slice(data, list(starts), list(ends), None if axes is None else list(axes), None)


# Parsed index tuples of Slice nodes whose starts/ends/axes/steps are constants, keyed by the identities of those
# arrays and the data shape; entries hold the arrays themselves so the identities stay valid.  Results of slicing
# constant data are cached too (read-only views).
_SLICE_CACHE: dict = {}
_SLICE_OUT_CACHE: dict = {}
_CACHE_MAX = 4096


@kernel("Slice", since=10)
def slice_10(data, starts, ends, axes=None, steps=None):
    key = (id(starts), id(ends), id(axes), id(steps), data.shape)
    ent = _SLICE_CACHE.get(key)
    if ent is not None and ent[0] is starts and ent[1] is ends and ent[2] is axes and ent[3] is steps:
        idx = ent[4]
    else:
        idx = _slice_index(
            data,
            to_ints(starts, "starts"),
            to_ints(ends, "ends"),
            None if axes is None else to_ints(axes, "axes"),
            None if steps is None else to_ints(steps, "steps"),
        )
        if frozen(starts) and frozen(ends) and (axes is None or frozen(axes)) and (steps is None or frozen(steps)):
            if len(_SLICE_CACHE) >= _CACHE_MAX:
                _SLICE_CACHE.clear()
            _SLICE_CACHE[key] = (starts, ends, axes, steps, idx)
        else:
            return data[idx]
    if not data.flags.writeable:
        okey = (id(data), key)
        hit = _SLICE_OUT_CACHE.get(okey)
        if hit is not None and hit[0] is data:
            return hit[1]
        out = data[idx]
        if frozen(data):
            if len(_SLICE_OUT_CACHE) >= _CACHE_MAX:
                _SLICE_OUT_CACHE.clear()
            _SLICE_OUT_CACHE[okey] = (data, out)
        return out
    return data[idx]


def _spec_slice(consts, kwargs):
    """Slice-10+ with constant starts/ends/axes/steps: the index tuple is parsed once per data shape."""
    if len(consts) < 3 or consts[0] is not NOT_CONST:
        return None  # constant data: the generic kernel caches its read-only result
    parts = []
    for i, name in enumerate(("starts", "ends", "axes", "steps")):
        c = consts[i + 1] if i + 1 < len(consts) else None
        if c is NOT_CONST or (c is not None and (type(c) is not np.ndarray or c.dtype.kind not in "iu")):
            return None
        parts.append(None if c is None else to_ints(c, name))
    starts, ends, axes, steps = parts
    if starts is None or ends is None:
        return None
    memo = {}
    generic = slice_10

    def slice_const(data, *args):
        if not data.flags.writeable:  # read-only data (constant-derived): the generic kernel may cache the view
            return generic(data, *args)
        key = data.shape
        idx = memo.get(key)
        if idx is None:
            idx = _slice_index(data, starts, ends, axes, steps)
            if len(memo) < 64:
                memo[key] = idx
        return data[idx]

    return slice_const


slice_10.specialize = _spec_slice


# ----------------------------------------------------------------------------------------------------------
# Gather family


@kernel("Gather", since=1)
def gather(data, indices, *, axis=0):
    if data.ndim == 0:
        raise ValueError("Gather: data must have rank >= 1")
    ax = norm_axis(axis, data.ndim)
    dim = data.shape[ax]
    if indices.ndim == 0 and indices.dtype.kind in "iu":  # the common "take one entry" case (shape arithmetic)
        i = int(indices)
        if not -dim <= i < dim:
            raise IndexError(f"indices value {i} is out of range (valid range [{-dim}, {dim - 1}])")
        if ax == 0:
            return data[i]  # a view
        return np.take(data, i, axis=ax)
    return np.take(data, norm_indices(indices, dim), axis=ax)


def _spec_gather(consts, kwargs):
    """Gather with constant indices: their range is known, so each call checks it against the axis length only."""
    if len(consts) != 2:
        return None
    idx = consts[1]
    if type(idx) is not np.ndarray or idx.dtype.kind not in "iu" or idx.size == 0:
        return None
    axis = int(kwargs.get("axis", 0))
    generic = gather
    take = np.take
    if idx.ndim == 0:
        i = int(idx)

        def gather_scalar(data, indices):
            r = data.ndim
            if r == 0 or not -r <= axis < r:
                return generic(data, indices, axis=axis)
            ax = axis + r if axis < 0 else axis
            dim = data.shape[ax]
            if not -dim <= i < dim:
                raise IndexError(f"indices value {i} is out of range (valid range [{-dim}, {dim - 1}])")
            if ax == 0:
                return data[i]  # a view
            return take(data, i, axis=ax)

        return gather_scalar
    flat = idx.reshape(-1).tolist()
    lo, hi = min(flat), max(flat)
    raw = idx.astype(np.int64)  # a private copy: the caller's constant is never aliased
    memo = {}  # axis length -> the indices mapped to [0, dim) (read-only)

    def gather_const(data, indices):
        r = data.ndim
        if r == 0 or not -r <= axis < r:
            return generic(data, indices, axis=axis)
        ax = axis + r if axis < 0 else axis
        dim = data.shape[ax]
        pos = memo.get(dim)
        if pos is None:
            if lo < -dim or hi >= dim:  # out of range: the generic kernel reports it
                return generic(data, indices, axis=axis)
            pos = np.where(raw < 0, raw + dim, raw) if lo < 0 else raw.copy()
            pos.flags.writeable = False
            if len(memo) < 64:
                memo[dim] = pos
        if r == 1:
            return data[pos]
        return take(data, pos, axis=ax)

    return gather_const


gather.specialize = _spec_gather


def _elements_index(indices: np.ndarray, dim: int, ax: int):
    """Full advanced-index tuple addressing ``data`` for GatherElements / ScatterElements."""
    idx = norm_indices(indices, dim)
    r = indices.ndim
    full = []
    for d in range(r):
        if d == ax:
            full.append(idx)
        else:
            shp = [1] * r
            shp[d] = indices.shape[d]
            full.append(np.arange(indices.shape[d], dtype=np.int64).reshape(shp))
    return tuple(full)


def _check_elements(data, indices, op, updates=None):
    if indices.ndim != data.ndim:
        raise ValueError(f"{op}: indices rank {indices.ndim} differs from data rank {data.ndim}")
    if data.ndim == 0:
        raise ValueError(f"{op}: data must have rank >= 1")
    if updates is not None and updates.shape != indices.shape:
        raise ValueError(f"{op}: updates shape {list(updates.shape)} differs from indices shape {list(indices.shape)}")


@kernel("GatherElements", since=11)
def gather_elements(data, indices, *, axis=0):
    _check_elements(data, indices, "GatherElements")
    ax = norm_axis(axis, data.ndim)
    for d in range(data.ndim):
        if d != ax and indices.shape[d] > data.shape[d]:
            raise ValueError(
                f"GatherElements: indices shape {list(indices.shape)} exceeds data shape {list(data.shape)} "
                f"on axis {d}"
            )
    return data[_elements_index(indices, data.shape[ax], ax)]


def _nd_index(data, indices, batch_dims, op):
    """(data reshaped to (N, prod(first k), *rest), batch index, flat index, output shape) for GatherND/ScatterND."""
    if indices.ndim < 1 or data.ndim < 1:
        raise ValueError(f"{op}: data and indices must have rank >= 1")
    b = int(batch_dims)
    if not 0 <= b < min(data.ndim, indices.ndim):
        raise ValueError(f"{op}: batch_dims {b} must be in [0, min(rank(data), rank(indices)))")
    if data.shape[:b] != indices.shape[:b]:
        raise ValueError(f"{op}: batch dims of data {list(data.shape)} and indices {list(indices.shape)} differ")
    k = indices.shape[-1]
    if k > data.ndim - b:
        raise ValueError(f"{op}: indices.shape[-1]={k} exceeds rank(data) - batch_dims = {data.ndim - b}")
    if indices.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be an integer tensor, got {indices.dtype}")
    dims = np.array(data.shape[b:b + k], dtype=np.int64)
    idx = norm_indices(indices.astype(np.int64, copy=False), dims)
    nb = int(np.prod(data.shape[:b], dtype=np.int64))
    lin = idx.reshape(nb, int(np.prod(indices.shape[b:-1], dtype=np.int64)), k)
    flat = np.zeros(lin.shape[:2], dtype=np.int64)
    for j in range(k):
        flat *= dims[j]
        flat += lin[..., j]
    rest = data.shape[b + k:]
    d2 = data.reshape((nb, int(np.prod(dims, dtype=np.int64))) + rest)
    bidx = np.arange(nb, dtype=np.int64)[:, None]
    out_shape = indices.shape[:-1] + rest
    return d2, bidx, flat, out_shape


@kernel("GatherND", since=11)
def gather_nd(data, indices, *, batch_dims=0):
    d2, bidx, flat, out_shape = _nd_index(data, indices, batch_dims, "GatherND")
    return d2[bidx, flat].reshape(out_shape)


# ----------------------------------------------------------------------------------------------------------
# Scatter family

_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduce_ufunc(reduction, op, allowed):
    if reduction == "none":
        return None
    if reduction not in allowed:
        raise ValueError(f"{op}: unsupported reduction {reduction!r} (expected one of none, {', '.join(allowed)})")
    return _REDUCE[reduction]


def _scatter_elements(data, indices, updates, axis, reduction, op, allowed):
    _check_elements(data, indices, op, updates)
    ufunc = _reduce_ufunc(reduction, op, allowed)
    ax = norm_axis(axis, data.ndim)
    for d in range(data.ndim):
        if d != ax and indices.shape[d] > data.shape[d]:
            raise ValueError(
                f"{op}: indices shape {list(indices.shape)} exceeds data shape {list(data.shape)} on axis {d}"
            )
    where = _elements_index(indices, data.shape[ax], ax)
    out = data.copy()
    if ufunc is None:
        out[where] = updates
    else:
        ufunc.at(out, where, updates)
    return out


@kernel("Scatter", since=9)
def scatter(data, indices, updates, *, axis=0):
    return _scatter_elements(data, indices, updates, axis, "none", "Scatter", ())


@kernel("ScatterElements", since=11)
def scatter_elements_11(data, indices, updates, *, axis=0):
    return _scatter_elements(data, indices, updates, axis, "none", "ScatterElements", ())


@kernel("ScatterElements", since=16)
def scatter_elements_16(data, indices, updates, *, axis=0, reduction="none"):
    return _scatter_elements(data, indices, updates, axis, reduction, "ScatterElements", ("add", "mul"))


@kernel("ScatterElements", since=18)
def scatter_elements_18(data, indices, updates, *, axis=0, reduction="none"):
    return _scatter_elements(data, indices, updates, axis, reduction, "ScatterElements", ("add", "mul", "max", "min"))


def _scatter_nd(data, indices, updates, reduction, allowed):
    ufunc = _reduce_ufunc(reduction, "ScatterND", allowed)
    out = data.copy()  # C-contiguous, so the reshape inside _nd_index is a view of it
    o2, bidx, flat, out_shape = _nd_index(out, indices, 0, "ScatterND")
    if tuple(updates.shape) != tuple(out_shape):
        raise ValueError(f"ScatterND: updates shape {list(updates.shape)} must be {list(out_shape)}")
    upd = updates.reshape(flat.shape + o2.shape[2:])
    if ufunc is None:
        o2[bidx, flat] = upd
    else:
        ufunc.at(o2, (bidx, flat), upd)
    return out


@kernel("ScatterND", since=11)
def scatter_nd_11(data, indices, updates):
    return _scatter_nd(data, indices, updates, "none", ())


@kernel("ScatterND", since=16)
def scatter_nd_16(data, indices, updates, *, reduction="none"):
    return _scatter_nd(data, indices, updates, reduction, ("add", "mul"))


@kernel("ScatterND", since=18)
def scatter_nd_18(data, indices, updates, *, reduction="none"):
    return _scatter_nd(data, indices, updates, reduction, ("add", "mul", "max", "min"))


@kernel("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, *, mode="linear", axis=-2):
    if mode not in ("linear", "circular"):
        raise ValueError(f"TensorScatter: unknown mode {mode!r} (expected 'linear' or 'circular')")
    r = past_cache.ndim
    if r < 2 or update.ndim != r:
        raise ValueError(
            f"TensorScatter: past_cache (shape {list(past_cache.shape)}) and update (shape {list(update.shape)}) "
            "must have the same rank >= 2"
        )
    ax = norm_axis(axis, r)
    if ax == 0:
        raise ValueError("TensorScatter: axis must not be the batch axis 0")
    if past_cache.shape[:ax] != update.shape[:ax] or past_cache.shape[ax + 1:] != update.shape[ax + 1:]:
        raise ValueError(
            f"TensorScatter: update shape {list(update.shape)} must match past_cache shape "
            f"{list(past_cache.shape)} except on axis {ax}"
        )
    batch, max_len, seq = past_cache.shape[0], past_cache.shape[ax], update.shape[ax]
    if seq > max_len:
        raise ValueError(f"TensorScatter: update sequence length {seq} exceeds the cache length {max_len}")
    if write_indices is None:
        wi = np.zeros(batch, dtype=np.int64)
    else:
        wi = np.asarray(write_indices).astype(np.int64).reshape(-1)
        if wi.shape[0] != batch:
            raise ValueError(f"TensorScatter: write_indices has {wi.shape[0]} entries for batch size {batch}")
        if (wi < 0).any():
            raise ValueError("TensorScatter: write_indices must be non-negative")
    out = past_cache.copy()
    if seq == 0:
        return out
    pos = wi[:, None] + np.arange(seq, dtype=np.int64)[None, :]  # (batch, seq)
    if mode == "circular":
        pos %= max_len
    elif (pos >= max_len).any():
        raise ValueError(
            f"TensorScatter: write_indices {wi.tolist()} + sequence length {seq} run past the cache length {max_len} "
            "in linear mode"
        )
    if write_indices is None or not wi.any():
        idx = [slice(None)] * r
        idx[ax] = slice(0, seq)
        out[tuple(idx)] = update
        return out
    o = np.moveaxis(out, ax, 1)  # view: (batch, max_len, ...)
    u = np.moveaxis(update, ax, 1)
    o[np.arange(batch, dtype=np.int64)[:, None], pos] = u
    return out


# ----------------------------------------------------------------------------------------------------------
# Compress / NonZero


def _as_bool(cond, op):
    c = np.asarray(cond)
    if c.ndim > 1:
        raise ValueError(f"{op}: condition must be 1-D, got shape {list(c.shape)}")
    return c.reshape(-1).astype(bool, copy=False)


@kernel("Compress", since=9)
def compress(x, condition, *, axis=None):
    c = _as_bool(condition, "Compress")
    if axis is None:
        flat = x.reshape(-1)
        if c.shape[0] > flat.shape[0]:
            if c[flat.shape[0]:].any():
                raise ValueError(f"Compress: condition of length {c.shape[0]} is longer than the input ({x.size})")
            c = c[: flat.shape[0]]
        return flat[: c.shape[0]][c]
    ax = norm_axis(axis, x.ndim)
    n = x.shape[ax]
    if c.shape[0] > n:
        if c[n:].any():
            raise ValueError(f"Compress: condition of length {c.shape[0]} is longer than axis {axis} ({n})")
        c = c[:n]
    idx = [slice(None)] * x.ndim
    idx[ax] = np.nonzero(c)[0]
    return x[tuple(idx)]


@kernel("NonZero", since=9)
def nonzero(x):
    if x.ndim == 0:
        x = x.reshape(1)
    if x.dtype == object:
        mask = np.array([bool(v) for v in x.reshape(-1)], dtype=bool).reshape(x.shape)
    elif x.dtype.kind in "biufc":
        mask = x != 0
    else:  # ml_dtypes
        mask = x.astype(np.float32) != 0
    nz = np.nonzero(mask)
    if not nz:
        return np.zeros((0, 0), dtype=np.int64)
    return np.stack(nz).astype(np.int64, copy=False)
