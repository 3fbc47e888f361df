"""Small helpers shared by the tensor / indexing / shape kernel modules (not a kernel module itself)."""

from __future__ import annotations

import numpy as np

MAX_ALLOC_BYTES = 2**34  # refuse to allocate outputs larger than this (16 GiB)


class _NotConst:
    __slots__ = ()

    def __repr__(self):
        return "NOT_CONST"


# Marks an input whose value is not known when the plan is built (see ``specialize`` hooks, execution/plan.py).
NOT_CONST = _NotConst()


def to_ints(v, what: str = "value") -> list[int]:
    """A shape/axes-like input (tensor, list, scalar) as a list of Python ints."""
    if v is None:
        return []
    if isinstance(v, np.ndarray):
        k = v.dtype.kind
        if k == "i" or k == "u":
            return v.reshape(-1).tolist()
        if k not in "iub":
            if v.dtype.kind == "f" or v.dtype.kind == "V" or v.dtype.type.__module__.startswith("ml_dtypes"):
                return [int(x) for x in v.astype(np.float64).reshape(-1).tolist()]
            raise TypeError(f"{what} must be an integer tensor, got dtype {v.dtype}")
        return [int(x) for x in v.reshape(-1).tolist()]
    if isinstance(v, (list, tuple)):
        return [int(x) for x in v]
    return [int(v)]


def frozen(a) -> bool:
    """True when ``a`` is a read-only ndarray whose memory no writeable array owns (a constant: its content can
    not change behind our back), so results derived from it may be cached keyed by its identity."""
    if type(a) is not np.ndarray or a.flags.writeable:
        return False
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
        if root.flags.writeable:
            return False
    return True


def scalar_int(v, what: str = "value") -> int:
    """A scalar (or one-element) input as a Python int."""
    if isinstance(v, np.ndarray):
        if v.size != 1:
            raise ValueError(f"{what} must be a scalar or a one-element tensor, got shape {v.shape}")
        return int(v.reshape(-1)[0])
    return int(v)


def broadcast_shape(a: tuple, b: tuple, what: str = "shapes") -> tuple:
    """Numpy/ONNX multidirectional broadcast of two shapes (cheaper than np.broadcast_shapes)."""
    if a == b:
        return a
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ValueError(f"{what} {list(a)} and {list(b)} cannot be broadcast together")
    return tuple(out)


def norm_axis(axis: int, rank: int, what: str = "axis") -> int:
    """Map ``axis`` in [-rank, rank-1] to [0, rank-1] or raise."""
    a = int(axis)
    if not -rank <= a < rank:
        raise ValueError(f"{what} {axis} is out of range for a tensor of rank {rank}")
    return a + rank if a < 0 else a


def norm_axes(axes, rank: int, what: str = "axes", unique: bool = True) -> list[int]:
    out = [norm_axis(a, rank, what) for a in axes]
    if unique and len(set(out)) != len(out):
        raise ValueError(f"{what} {list(axes)} contains duplicate axes")
    return out


def check_shape(shape, dtype, what: str = "output") -> tuple:
    """Validate a requested output shape: no negative dims, total size within the configured tensor-size limit
    (``onnxpy.limits``: default 16 GiB, session config ``session.max_tensor_bytes``, env ONNXPY_MAX_TENSOR_BYTES)."""
    global _check_alloc
    if _check_alloc is None:
        from ..limits import check_alloc as _check_alloc
    return _check_alloc(shape, dtype, what)


_check_alloc = None


def within_limit(nbytes: int) -> bool:
    """True when a tensor of ``nbytes`` bytes is within the tensor-size limit in force (a cheap pre-check for
    kernels that know the size of what they allocate; :func:`check_shape` reports the error)."""
    global _limits
    if _limits is None:
        from .. import limits as _limits
    lim = _limits.current().max_tensor_bytes
    return lim is None or nbytes <= lim


_limits = None


def zero_of(dtype):
    """The padding/"zero" value of a dtype ('' for strings, False for bool)."""
    dt = np.dtype(dtype)
    if dt.kind == "O":
        return ""
    return np.zeros((), dtype=dt)[()]


def full(shape, value, dtype) -> np.ndarray:
    """np.full that also works for object (string) arrays and ml_dtypes."""
    if np.dtype(dtype).kind == "O":
        out = np.empty(shape, dtype=object)
        out.fill(value)
        return out
    return np.full(shape, value, dtype=dtype)


def norm_indices(idx: np.ndarray, dim, what: str = "indices") -> np.ndarray:
    """Indices in [-dim, dim-1] -> [0, dim-1] (int64), raising on anything out of range.

    ``dim`` may be an int or an array broadcastable against ``idx``.
    """
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{what} must be an integer tensor, got dtype {idx.dtype}")
    idx = idx.astype(np.int64, copy=False)
    n = idx.size
    if n == 0:
        return idx
    if type(dim) is int or np.ndim(dim) == 0:  # fast path: two reductions, no temporaries when everything is in range
        if n <= 16:  # a handful of indices: Python's min/max beat two numpy reductions
            flat = idx.reshape(-1).tolist()
            lo, hi = min(flat), max(flat)
        else:
            lo, hi = int(idx.min()), int(idx.max())
        if lo >= 0 and hi < dim:
            return idx
        if lo >= -dim and hi < dim:
            return np.where(idx < 0, idx + dim, idx)
    neg = idx < 0
    if neg.any():
        idx = np.where(neg, idx + dim, idx)
    bad = (idx < 0) | (idx >= dim)
    if bad.any():
        orig = np.where(neg, idx - dim, idx)[bad].reshape(-1)[0]
        rng = f" (valid range [{-dim}, {dim - 1}])" if np.ndim(dim) == 0 else ""
        raise IndexError(f"{what} value {int(orig)} is out of range{rng}")
    return idx
