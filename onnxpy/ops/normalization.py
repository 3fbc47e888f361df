"""Normalization: BatchNormalization, InstanceNormalization, LayerNormalization, GroupNormalization, RMSNormalization,
LpNormalization, MeanVarianceNormalization, LRN.

Statistics are computed in float32 for float32/float16/bfloat16 inputs and in float64 for float64 inputs.  The
row kernels work on a 2-D (rows, reduced elements) view so numpy's pairwise summation runs along a contiguous axis,
and reuse their temporaries to keep allocations down (LayerNorm runs in every transformer block).
"""

from __future__ import annotations

import weakref

import ml_dtypes
import numpy as np

from ..dtypes import to_numpy
from . import _native
from .registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _arr(x, op, name):
    if not isinstance(x, np.ndarray):
        if x is None:
            raise ValueError(f"{op}: required input '{name}' is missing")
        x = np.asarray(x)
    return x


def _float_input(x, op, name="X"):
    x = _arr(x, op, name)
    if x.dtype.kind != "f" and x.dtype not in _LOW_FLOATS:
        raise TypeError(f"{op}: input '{name}' must be a float tensor, got {x.dtype}")
    return x


def _cdtype(dt: np.dtype) -> np.dtype:
    """Compute dtype: float64 stays float64, everything else (float32, float16, bfloat16) uses float32."""
    return _F64 if dt == _F64 else _F32


def _cast(x, dt):
    return x if x.dtype == dt else x.astype(dt)


def _norm_axis(axis, ndim, op):
    axis = int(axis)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


# Rows up to this width get their sums from einsum (one SIMD pass, no temporary; ~3x faster than ``mean`` on
# transformer rows); longer ones (InstanceNormalization planes) keep numpy's pairwise summation.
_EINSUM_MAX_D = 8192
# Row normalizations whose input dies at them (or whose input is a fresh sum, SkipLayerNormalization) normalize in
# place (see ``_normalize_rows``; test and measurement hook)
IN_PLACE = True


# Float32 row normalizations with their scale (and shift) run as one native call where the native kernels are used
# (``_native.py``: sum, statistics and affine in one pass per row's cache-resident data instead of ~8 numpy passes;
# the statistics in double precision, the rest in float32 as the numpy passes round; test and measurement hook)
NATIVE = True


def _c32(a) -> bool:
    return type(a) is np.ndarray and a.dtype == _F32 and a.flags.c_contiguous


def native_rows(x2: np.ndarray, eps: float, gamma: np.ndarray, beta=None, out=None, *, skip=None, bias=None,
                simplified: bool = False, stats=None):
    """LayerNormalization over the rows of float32 ``x2`` (rows, D) -- after adding ``skip`` (rows or a divisor of
    rows, D) and ``bias`` (D,) when given -- times ``gamma`` plus ``beta`` (D,), into ``out`` (rows, D; may be x2):
    returns ``out``, or None, computing nothing, where the native kernel is not used or the arrays are not all
    C-contiguous float32 of those shapes.  ``stats`` (rows, 2) float32: each row's mean and 1 / std go there."""
    if not NATIVE or not _c32(x2) or x2.ndim != 2 or x2.size == 0:
        return None
    fn = _native.function("layer_norm_f32")
    rows, D = x2.shape
    vecs = (gamma, beta, bias)
    if fn is None or any(v is not None and (not _c32(v) or v.size != D) for v in vecs) or gamma is None:
        return None
    skip_rows = rows
    if skip is not None:
        if not _c32(skip) or skip.size % D or rows % (skip.size // D):
            return None
        skip_rows = skip.size // D
    if out is None:
        out = np.empty((rows, D), dtype=_F32)
    elif not _c32(out) or out.shape != (rows, D) or not out.flags.writeable:
        return None
    if stats is not None and (not _c32(stats) or stats.shape != (rows, 2) or not stats.flags.writeable):
        return None
    k = np.array((eps, 1.0))
    ptr = [None if v is None else v.ctypes.data for v in (skip, bias, beta, stats)]
    fn(rows, D, x2.ctypes.data, ptr[0], skip_rows, ptr[1], gamma.ctypes.data, ptr[2], k.ctypes.data,
       int(simplified), out.ctypes.data, ptr[3])
    return out


def _native_affine(x2, eps, scale, bias, trailing):
    """:func:`native_rows` for float32 Scale (and B) of exactly the normalized shape, else None."""
    params = [p for p in (scale, bias) if p is not None]
    if any(type(p) is not np.ndarray or p.dtype != _F32 or p.shape != tuple(trailing) for p in params):
        return None
    g, b = (None if p is None else np.ascontiguousarray(p).reshape(-1) for p in (scale, bias))
    return native_rows(x2, eps, g, b)


def _normalize_rows(x2: np.ndarray, eps: float, out: np.ndarray | None = None):
    """(x2 - mean) / sqrt(var + eps) over axis 1 of a 2-D float array; returns (normalized, mean, inv_std).

    The result is a fresh array that callers may modify in place, or ``out`` (x2 itself works: normalizing in place
    touches one buffer instead of two, which in-model is what a row normalization's time mostly goes to).
    """
    D = x2.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        if 0 < D <= _EINSUM_MAX_D and x2.shape[0]:
            t = x2.dtype.type
            mean = np.einsum("ij->i", x2)[:, None]
            mean *= t(1.0 / D)
            d = np.subtract(x2, mean, out=out)
            var = np.einsum("ij,ij->i", d, d)[:, None]
            var *= t(1.0 / D)
            var += t(eps)
            inv = np.sqrt(var, out=var)
            np.divide(t(1), inv, out=inv)
            d *= inv
            return d, mean, inv
        mean = x2.mean(axis=1, keepdims=True)
        d = np.subtract(x2, mean, out=out)
        buf = np.multiply(d, d)
        var = buf.mean(axis=1, keepdims=True)
        var += x2.dtype.type(eps)
        inv = np.sqrt(var, out=var)
        np.divide(1, inv, out=inv)
        np.multiply(d, inv, out=d)
    return d, mean, inv


def _trailing_param(p, trailing, cd):
    """Flatten a Scale/B that broadcasts over the trailing (normalized) dims to shape (1, inner); None if it also
    spans leading dims (the caller then broadcasts against the full shape)."""
    if p.ndim > len(trailing):
        return None
    try:
        if np.broadcast_shapes(p.shape, trailing) != trailing:
            return None
    except ValueError:
        return None
    p = _cast(p, cd)
    if p.shape != trailing:
        p = np.broadcast_to(p, trailing)
    return p.reshape(1, -1)


def _affine_rows(y2, shape, axis, cd, op, scale=None, bias=None):
    """y2 (rows, inner) * scale + bias where scale/bias broadcast unidirectionally to ``shape``; returns full shape."""
    trailing = tuple(shape[axis:])
    y = y2
    for p, name, is_scale in ((scale, "Scale", True), (bias, "B", False)):
        if p is None:
            continue
        p = _arr(p, op, name)
        flat = _trailing_param(p, trailing, cd)
        if flat is not None and y.ndim == 2:
            if is_scale:
                y *= flat
            else:
                y += flat
            continue
        if y.ndim == 2:
            y = y.reshape(shape)
        try:
            if np.broadcast_shapes(p.shape, tuple(shape)) != tuple(shape):
                raise ValueError
        except ValueError:
            msg = f"{op}: {name} of shape {p.shape} cannot be broadcast to input shape {tuple(shape)}"
            raise ValueError(msg) from None
        p = _cast(p, cd)
        if is_scale:
            y *= p
        else:
            y += p
    return y.reshape(shape)


# --- LayerNormalization / RMSNormalization ------------------------------------------------------------------------


def _stash_dtype(stash_type, op):
    dt = to_numpy(int(stash_type))
    if dt not in (_F32, _F64) and dt not in _LOW_FLOATS:
        raise TypeError(f"{op}: stash_type {stash_type} is not a float type")
    return dt


# since=1: onnxruntime registers LayerNormalization in the ONNX domain for every opset (a contrib schema
# predating opset 17), and its optimizer writes it into older-opset models; onnxpy's LayerNormFusion does too.
@kernel("LayerNormalization", since=(1, 17))
def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1, _num_outputs=1):
    op = "LayerNormalization"
    x = _float_input(X, op)
    if x.ndim == 0:
        raise ValueError(f"{op}: input must have rank >= 1")
    ax = _norm_axis(axis, x.ndim, op)
    shape = x.shape
    cd = _cdtype(x.dtype)
    x2 = _cast(x.reshape(_prod(shape[:ax]), _prod(shape[ax:])), cd)
    if _num_outputs <= 1 and x.dtype == _F32:  # (the specialised kernel's native path, for the same bits)
        y = _native_affine(x2, epsilon, Scale, B, shape[ax:])
        if y is not None:
            return y.reshape(shape)
    y2, mean, inv = _normalize_rows(x2, epsilon)
    if x.dtype in _LOW_FLOATS:  # the spec rounds the normalized value to X's type before scaling
        y2 = y2.astype(x.dtype).astype(cd)
    y = _affine_rows(y2, shape, ax, cd, op, _arr(Scale, op, "Scale"), B)
    y = _cast(y, x.dtype)
    if _num_outputs <= 1:
        return y
    sd = _stash_dtype(stash_type, op)
    stat_shape = tuple(shape[:ax]) + (1,) * (x.ndim - ax)
    return y, _cast(mean.reshape(stat_shape), sd), _cast(inv.reshape(stat_shape), sd)


def _layer_norm_specialize(consts, kwargs):
    """Constant float32/float64 Scale (and B) over the normalized dimensions, one output: the parameters are
    flattened once, per plan; a call is the row normalization and the two in-place affine passes of the generic
    kernel (bit-identical), without its per-call checks."""
    if len(consts) < 2 or int(kwargs.get("_num_outputs", 1)) > 1:
        return None
    scale = consts[1]
    bias = consts[2] if len(consts) > 2 else None
    if type(scale) is not np.ndarray or scale.dtype not in (_F32, _F64) or scale.ndim == 0:
        return None
    if bias is not None and (type(bias) is not np.ndarray or bias.dtype != scale.dtype or bias.shape != scale.shape):
        return None
    dt = scale.dtype
    trailing = scale.shape
    k = len(trailing)
    axis = int(kwargs.get("axis", -1))
    eps = float(kwargs.get("epsilon", 1e-5))
    g = scale.reshape(1, -1)
    b = None if bias is None else bias.reshape(1, -1)
    D = g.shape[1]
    g1 = np.ascontiguousarray(g.reshape(D))  # (the native kernel's contiguous vectors)
    b1 = None if b is None else np.ascontiguousarray(b.reshape(D))
    if D == 0:
        return None
    generic = layer_normalization

    def run(X, Scale, B=None, _donated=()):
        if (type(X) is not np.ndarray or X.dtype != dt or X.ndim < k or X.shape[X.ndim - k:] != trailing
                or not -X.ndim <= axis < X.ndim or (axis + X.ndim if axis < 0 else axis) != X.ndim - k):
            return generic(X, Scale, B, **kwargs)
        shape = X.shape
        x2 = X.reshape(-1, D)
        # X dies here and is ours (see registry: _donated): normalized in place
        own = IN_PLACE and 0 in _donated and X.flags.c_contiguous and X.flags.writeable
        if dt == _F32:
            y = native_rows(x2, eps, g1, b1, x2 if own else None)
            if y is not None:
                return y.reshape(shape)
        y, _, _ = _normalize_rows(x2, eps, x2 if own else None)
        y *= g
        if b is not None:
            y += b
        return y.reshape(shape)

    run.donates = True
    return run


layer_normalization.specialize = _layer_norm_specialize


@kernel("RMSNormalization", since=23)
def rms_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    op = "RMSNormalization"
    x = _float_input(X, op)
    s = _float_input(scale, op, "scale")
    if x.ndim == 0:
        raise ValueError(f"{op}: input must have rank >= 1")
    ax = _norm_axis(axis, x.ndim, op)
    shape = x.shape
    cd = _cdtype(x.dtype)
    x2 = _cast(x.reshape(_prod(shape[:ax]), _prod(shape[ax:])), cd)
    with np.errstate(invalid="ignore", divide="ignore"):
        ms = np.multiply(x2, x2).mean(axis=1, keepdims=True)
        ms += cd.type(epsilon)
        np.sqrt(ms, out=ms)
        y2 = np.divide(x2, ms)
    if x.dtype in _LOW_FLOATS:  # the spec rounds the normalized value to X's type before scaling
        y2 = y2.astype(x.dtype).astype(cd)
    y = _affine_rows(y2, shape, ax, cd, op, s)
    return _cast(y, s.dtype)


# --- InstanceNormalization / GroupNormalization --------------------------------------------------------------------


def _channel_param(p, C, op, name, cd):
    p = _arr(p, op, name)
    if p.size != C:
        raise ValueError(f"{op}: {name} must have {C} elements (one per channel), got shape {p.shape}")
    return _cast(p.reshape(1, C, 1), cd)


@kernel("InstanceNormalization", since=(1, 6, 22))
def instance_normalization(input, scale, B, *, epsilon=1e-5, consumed_inputs=None):  # noqa: A002 - spec name
    op = "InstanceNormalization"
    x = _float_input(input, op, "input")
    if x.ndim < 2:
        raise ValueError(f"{op}: input must have shape (N, C, ...), got {x.shape}")
    N, C = x.shape[0], x.shape[1]
    S = _prod(x.shape[2:])
    cd = _cdtype(x.dtype)
    y2, _, _ = _normalize_rows(_cast(x.reshape(N * C, S), cd), epsilon)
    y3 = y2.reshape(N, C, S)
    y3 *= _channel_param(scale, C, op, "scale", cd)
    y3 += _channel_param(B, C, op, "B", cd)
    return _cast(y3.reshape(x.shape), x.dtype)


def _group_norm(x, scale, bias, num_groups, epsilon, op, per_group):
    x = _float_input(x, op)
    if x.ndim < 2:
        raise ValueError(f"{op}: input must have shape (N, C, ...), got {x.shape}")
    G = int(num_groups)
    N, C = x.shape[0], x.shape[1]
    if G <= 0 or C % G:
        raise ValueError(f"{op}: num_groups={G} must be positive and divide the {C} channels")
    S = _prod(x.shape[2:])
    cd = _cdtype(x.dtype)
    y2, _, _ = _normalize_rows(_cast(x.reshape(N * G, (C // G) * S), cd), epsilon)
    if x.dtype in _LOW_FLOATS:  # the spec rounds the normalized value to X's type before scaling
        y2 = y2.astype(x.dtype).astype(cd)
    y3 = y2.reshape(N, C, S)
    params = []
    for p, name in ((scale, "scale"), (bias, "bias")):
        p = _arr(p, op, name)
        if per_group and p.size == G:
            p = np.repeat(p.reshape(-1), C // G)
        params.append(_channel_param(p, C, op, name, cd))
    y3 *= params[0]
    y3 += params[1]
    return _cast(y3.reshape(x.shape), x.dtype)


@kernel("GroupNormalization", since=18)
def group_normalization_18(X, scale, bias, *, num_groups, epsilon=1e-5):
    # opset 18: scale and bias hold one value per group (per-channel ones are accepted too, as exporters emit them)
    return _group_norm(X, scale, bias, num_groups, epsilon, "GroupNormalization", per_group=True)


@kernel("GroupNormalization", since=21)
def group_normalization_21(X, scale, bias, *, num_groups, epsilon=1e-5, stash_type=1):
    return _group_norm(X, scale, bias, num_groups, epsilon, "GroupNormalization", per_group=False)


# --- BatchNormalization --------------------------------------------------------------------------------------------


def _param_shape(x, spatial):
    if spatial:
        return (-1,) + (1,) * (x.ndim - 2)
    return tuple(x.shape[1:])


_BN_CACHE: dict = {}
_BN_CACHE_MAX = 4096


def _bn_affine(ps, pshape, cd, epsilon):
    """Test-mode BatchNormalization as ``x * k + c``: ``k = scale / sqrt(var + eps)``, ``c = B - mean * k``.

    When all four parameters are read-only arrays (initializers, cached constants) the pair is cached by their
    identity (checked through weak references, so a reused id never hits a stale entry)."""
    key = None
    if not any(p.flags.writeable for p in ps):
        key = (id(ps[0]), id(ps[1]), id(ps[2]), id(ps[3]), float(epsilon), cd, pshape)
        hit = _BN_CACHE.get(key)
        if hit is not None and all(r() is p for r, p in zip(hit[0], ps)):
            return hit[1], hit[2]
    s, b, m, v = (_cast(p, cd).reshape(pshape) for p in ps)
    k = s / np.sqrt(v + cd.type(epsilon))
    c = b - m * k
    if key is not None:
        try:
            refs = tuple(weakref.ref(p) for p in ps)
        except TypeError:
            return k, c
        if len(_BN_CACHE) >= _BN_CACHE_MAX:
            _BN_CACHE.clear()
        k.flags.writeable = False
        c.flags.writeable = False
        _BN_CACHE[key] = (refs, k, c)
    return k, c


def _batch_norm(X, scale, B, mean, var, epsilon, momentum, training, spatial, op="BatchNormalization",
                donated=()):
    x = _float_input(X, op)
    if x.ndim < 2:
        raise ValueError(f"{op}: input must have shape (N, C, ...), got {x.shape}")
    cd = _cdtype(x.dtype)
    C = x.shape[1]
    psize = C if spatial else _prod(x.shape[1:])
    ps = [_arr(p, op, n) for p, n in ((scale, "scale"), (B, "B"), (mean, "mean"), (var, "var"))]
    for p, n in zip(ps, ("scale", "B", "mean", "var")):
        if p.size != psize:
            raise ValueError(f"{op}: {n} must have {psize} elements for input shape {x.shape}, got shape {p.shape}")
    pshape = _param_shape(x, spatial)
    if not training:
        k, c = _bn_affine(ps, pshape, cd, epsilon)
        if x.dtype == cd:
            out = x if 0 in donated and x.ndim and x.flags.writeable else None
            y = np.multiply(x, k, out=out)
            y += c
            return y, None
        y = x.astype(cd) * k
        y += c
        return _cast(y, x.dtype), None
    s, b, m, v = (_cast(p, cd).reshape(pshape) for p in ps)
    xc = _cast(x, cd)
    eps = cd.type(epsilon)
    axes = (0,) + tuple(range(2, x.ndim)) if spatial else (0,)
    cur_mean = xc.mean(axis=axes, keepdims=True)
    cur_var = xc.var(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(cur_var + eps)
    k = s * inv
    y = xc * k
    y += b - cur_mean * k
    mom = cd.type(momentum)
    run_mean = m * mom + cur_mean.reshape(pshape) * (1 - mom)
    run_var = v * mom + cur_var.reshape(pshape) * (1 - mom)
    stats_dt = ps[2].dtype
    out_shape = ps[2].shape
    stats = tuple(_cast(a, stats_dt).reshape(out_shape) for a in (run_mean, run_var, cur_mean, inv))
    return _cast(y, x.dtype), stats


@kernel("BatchNormalization", since=(1, 6))
def batch_normalization_1(X, scale, B, mean, var, *, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1,
                          consumed_inputs=None, _num_outputs=1, _donated=()):
    # training statistics only when they are asked for: with Y alone the node runs in test mode
    training = not is_test and _num_outputs > 1
    y, stats = _batch_norm(X, scale, B, mean, var, epsilon, momentum, training, spatial, donated=_donated)
    return y if stats is None else (y,) + stats


@kernel("BatchNormalization", since=7)
def batch_normalization_7(X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9, spatial=1, _num_outputs=1,
                          _donated=()):
    y, stats = _batch_norm(X, scale, B, mean, var, epsilon, momentum, _num_outputs > 1, spatial, donated=_donated)
    return y if stats is None else (y,) + stats


@kernel("BatchNormalization", since=9)
def batch_normalization_9(X, scale, B, mean, var, *, epsilon=1e-5, momentum=0.9, _num_outputs=1, _donated=()):
    y, stats = _batch_norm(X, scale, B, mean, var, epsilon, momentum, _num_outputs > 1, True, donated=_donated)
    return y if stats is None else (y,) + stats


@kernel("BatchNormalization", since=(14, 15))
def batch_normalization_14(X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0,
                           _num_outputs=1, _donated=()):
    if not training_mode and _num_outputs > 1:
        raise ValueError("BatchNormalization: running_mean/running_var outputs are only valid with training_mode=1")
    y, stats = _batch_norm(X, scale, B, input_mean, input_var, epsilon, momentum, bool(training_mode), True,
                           donated=_donated)
    return y if stats is None else (y, stats[0], stats[1])


# --- LpNormalization / MeanVarianceNormalization / LRN -------------------------------------------------------------


@kernel("LpNormalization", since=(1, 22))
def lp_normalization(input, *, axis=-1, p=2):  # noqa: A002 - spec name
    op = "LpNormalization"
    x = _float_input(input, op, "input")
    if x.ndim == 0:
        raise ValueError(f"{op}: input must have rank >= 1")
    ax = _norm_axis(axis, x.ndim, op)
    cd = _cdtype(x.dtype)
    xc = _cast(x, cd)
    if p == 1:
        norm = np.add.reduce(np.abs(xc), axis=ax, keepdims=True)
    elif p == 2:
        norm = np.sqrt(np.add.reduce(xc * xc, axis=ax, keepdims=True))
    else:
        raise ValueError(f"{op}: p must be 1 or 2, got {p}")
    norm[norm == 0] = 1  # an all-zero slice has a zero norm: its output is 0
    return _cast(xc / norm, x.dtype)


@kernel("MeanVarianceNormalization", since=(9, 13))
def mean_variance_normalization(X, *, axes=(0, 2, 3)):
    op = "MeanVarianceNormalization"
    x = _float_input(X, op)
    axes = tuple(sorted({_norm_axis(a, x.ndim, op) for a in axes}))
    cd = _cdtype(x.dtype)
    xc = _cast(x, cd)
    mean = xc.mean(axis=axes, keepdims=True)
    d = xc - mean
    std = np.sqrt(np.mean(d * d, axis=axes, keepdims=True))
    std += cd.type(1e-9)
    d /= std
    return _cast(d, x.dtype)


@kernel("LRN", since=(1, 13))
def lrn(X, *, size, alpha=1e-4, beta=0.75, bias=1.0):
    op = "LRN"
    x = _float_input(X, op)
    if x.ndim < 2:
        raise ValueError(f"{op}: input must have shape (N, C, ...), got {x.shape}")
    size = int(size)
    if size <= 0:
        raise ValueError(f"{op}: size must be positive, got {size}")
    cd = _cdtype(x.dtype)
    xc = _cast(x, cd)
    sq = xc * xc
    C = x.shape[1]
    lo = (size - 1) // 2
    hi = size - 1 - lo
    acc = sq.copy()
    for off in range(-lo, hi + 1):
        if off == 0 or abs(off) >= C:
            continue
        if off > 0:  # channel c gathers c + off
            acc[:, : C - off] += sq[:, off:]
        else:
            acc[:, -off:] += sq[:, : C + off]
    acc *= cd.type(alpha / size)
    acc += cd.type(bias)
    np.power(acc, cd.type(beta), out=acc)
    return _cast(xc / acc, x.dtype)
