"""Random ops: Dropout, RandomNormal, RandomUniform, RandomNormalLike, RandomUniformLike, Bernoulli, Multinomial.

A ``seed`` attribute gives a deterministic generator per call (the same seed always gives the same values); without
one the process-wide generator of :mod:`onnxpy.ops.random_state` is used.  Seeded Dropout draws its mask from
numpy's legacy ``RandomState`` so ``mask = uniform(0, 1, shape) >= ratio`` matches numpy-based references.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..dtypes import to_numpy
from . import random_state
from ..limits import check_alloc
from .registry import kernel

_FLOATS = (
    np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64), np.dtype(ml_dtypes.bfloat16),
)


def _arr(x, op, name):
    if not isinstance(x, np.ndarray):
        if x is None:
            raise ValueError(f"{op}: required input '{name}' is missing")
        x = np.asarray(x)
    return x


def _rng(seed):
    return random_state.generator(None if seed is None else float(seed))


def _float_dtype(dtype, op, fallback=None):
    if dtype is None:
        if fallback is None:
            raise TypeError(f"{op}: no dtype given")
        dt = np.dtype(fallback)
    else:
        dt = to_numpy(int(dtype))
    if dt not in _FLOATS:
        raise TypeError(f"{op}: output type must be a float type, got {dt}")
    return dt


def _shape(shape, op):
    if shape is None:
        raise ValueError(f"{op}: the 'shape' attribute is required")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"{op}: shape {shape} has a negative dimension")
    check_alloc(shape, np.float64, f"{op} output")
    return shape


def _normal(shape, dt, mean, scale, seed):
    rng = _rng(seed)
    if dt == np.float64:
        return rng.normal(float(mean), float(scale), size=shape)
    v = rng.standard_normal(size=shape, dtype=np.float32)
    if scale != 1.0:
        v *= np.float32(scale)
    if mean != 0.0:
        v += np.float32(mean)
    return v.astype(dt, copy=False)


def _uniform(shape, dt, low, high, seed):
    rng = _rng(seed)
    if dt == np.float64:
        return rng.uniform(float(low), float(high), size=shape)
    v = rng.random(size=shape, dtype=np.float32)
    if high - low != 1.0:
        v *= np.float32(high - low)
    if low != 0.0:
        v += np.float32(low)
    return v.astype(dt, copy=False)


@kernel("RandomNormal", since=(1, 22))
def random_normal(*, shape=None, dtype=1, mean=0.0, scale=1.0, seed=None):
    op = "RandomNormal"
    return _normal(_shape(shape, op), _float_dtype(dtype, op), mean, scale, seed)


@kernel("RandomUniform", since=(1, 22))
def random_uniform(*, shape=None, dtype=1, high=1.0, low=0.0, seed=None):
    op = "RandomUniform"
    return _uniform(_shape(shape, op), _float_dtype(dtype, op), low, high, seed)


@kernel("RandomNormalLike", since=(1, 22))
def random_normal_like(input, *, dtype=None, mean=0.0, scale=1.0, seed=None):  # noqa: A002 - spec name
    op = "RandomNormalLike"
    x = _arr(input, op, "input")
    return _normal(x.shape, _float_dtype(dtype, op, x.dtype), mean, scale, seed)


@kernel("RandomUniformLike", since=(1, 22))
def random_uniform_like(input, *, dtype=None, high=1.0, low=0.0, seed=None):  # noqa: A002 - spec name
    op = "RandomUniformLike"
    x = _arr(input, op, "input")
    return _uniform(x.shape, _float_dtype(dtype, op, x.dtype), low, high, seed)


@kernel("Bernoulli", since=(15, 22))
def bernoulli(input, *, dtype=None, seed=None):  # noqa: A002 - spec name
    op = "Bernoulli"
    p = _arr(input, op, "input")
    if p.dtype not in _FLOATS:
        raise TypeError(f"{op}: input must be a float tensor of probabilities, got {p.dtype}")
    out_dt = p.dtype if dtype is None else to_numpy(int(dtype))
    if out_dt.kind == "O":
        raise TypeError(f"{op}: output type cannot be string")
    pf = p.astype(np.float64) if p.dtype != np.float64 else p
    return (_rng(seed).random(size=p.shape) < pf).astype(out_dt)


@kernel("Multinomial", since=(7, 22))
def multinomial(input, *, dtype=6, sample_size=1, seed=None):  # noqa: A002 - spec name
    op = "Multinomial"
    x = _arr(input, op, "input")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{op}: input must be a float tensor of log-probabilities, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{op}: input must have shape [batch_size, class_size], got {x.shape}")
    out_dt = to_numpy(int(dtype))
    if out_dt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"{op}: dtype must be int32 or int64, got {out_dt}")
    n = int(sample_size)
    if n < 0:
        raise ValueError(f"{op}: sample_size must be non-negative, got {n}")
    batch, classes = x.shape
    if classes == 0:
        raise ValueError(f"{op}: class_size must be positive")
    lx = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(lx, axis=1, keepdims=True)
        m[~np.isfinite(m)] = 0
        p = np.exp(lx - m)
    cdf = np.cumsum(p, axis=1)
    total = cdf[:, -1:].copy()
    total[total == 0] = 1
    cdf /= total
    u = _rng(seed).random(size=(batch, n))
    # one searchsorted over all rows: offset every row's cdf and draws by its row index
    offs = np.arange(batch, dtype=np.float64)[:, None]
    flat = (cdf + offs).reshape(-1)
    idx = np.searchsorted(flat, (u + offs).reshape(-1), side="right").reshape(batch, n)
    idx -= np.arange(batch)[:, None] * classes
    np.clip(idx, 0, classes - 1, out=idx)
    return idx.astype(out_dt)


# --- Dropout -------------------------------------------------------------------------------------------------------


def _dropout_train(x, ratio, seed, op):
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"{op}: ratio must be in [0, 1), got {ratio}")
    if seed is not None:
        s = float(seed)
        key = int(s) & 0xFFFFFFFF if s.is_integer() else int(np.float64(s).view(np.uint64)) & 0xFFFFFFFF
        u = np.random.RandomState(key).random_sample(x.shape)
    else:
        u = _rng(None).random(size=x.shape)
    mask = u >= ratio
    scale = 1.0 / (1.0 - ratio)
    if x.dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        y = x * x.dtype.type(scale)
        y *= mask
    else:
        y = (x.astype(np.float32) * np.float32(scale) * mask).astype(x.dtype)
    return y, mask


@kernel("Dropout", since=(1, 6))
def dropout_1(data, *, is_test=0, ratio=0.5, consumed_inputs=None, _num_outputs=1):
    x = _arr(data, "Dropout", "data")
    if is_test or ratio == 0:
        return (x, np.ones(x.shape, x.dtype)) if _num_outputs > 1 else x
    y, mask = _dropout_train(x, float(ratio), None, "Dropout")
    return (y, mask.astype(x.dtype)) if _num_outputs > 1 else y


@kernel("Dropout", since=7)
def dropout_7(data, *, ratio=0.5, _num_outputs=1):
    x = _arr(data, "Dropout", "data")
    return (x, np.ones(x.shape, x.dtype)) if _num_outputs > 1 else x


@kernel("Dropout", since=10)
def dropout_10(data, *, ratio=0.5, _num_outputs=1):
    x = _arr(data, "Dropout", "data")
    return (x, np.ones(x.shape, np.bool_)) if _num_outputs > 1 else x


@kernel("Dropout", since=(12, 13, 22))
def dropout_12(data, ratio=None, training_mode=None, *, seed=None, _num_outputs=1):
    op = "Dropout"
    x = _arr(data, op, "data")
    training = False
    if training_mode is not None:
        t = _arr(training_mode, op, "training_mode")
        if t.size != 1:
            raise ValueError(f"{op}: training_mode must be a scalar, got shape {t.shape}")
        training = bool(t.reshape(-1)[0])
    r = 0.5
    if ratio is not None:
        ra = _arr(ratio, op, "ratio")
        if ra.size != 1:
            raise ValueError(f"{op}: ratio must be a scalar, got shape {ra.shape}")
        r = float(ra.reshape(-1)[0])
        if not 0.0 <= r < 1.0:
            raise ValueError(f"{op}: ratio must be in [0, 1), got {r}")
    if not training or r == 0.0:
        return (x, np.ones(x.shape, np.bool_)) if _num_outputs > 1 else x
    y, mask = _dropout_train(x, r, seed, op)
    return (y, mask) if _num_outputs > 1 else y
