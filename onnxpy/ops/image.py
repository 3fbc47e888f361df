"""Image resampling: Resize, Upsample, GridSample, AffineGrid."""

from __future__ import annotations

import math

import numpy as np

from ._common import text
from ..limits import check_alloc
from ._spatial import prod
from .registry import kernel

_CTMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
         "tf_half_pixel_for_nn", "tf_crop_and_resize")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")




def _is_float(dt) -> bool:
    return dt.kind == "f" or str(dt) == "bfloat16"


def _vec(v):
    """An optional 1-D input as a float64 array, or None when absent / empty."""
    if v is None:
        return None
    a = np.asarray(v).reshape(-1)
    return None if a.size == 0 else a


# ------------------------------------------------------------------------------------------ coordinate maps


def _original_coords(ctm, out_len, in_len, scale, roi_start, roi_end, from_scales=False):
    """x_original for every output index along one axis.

    Computed in float32 like onnxruntime (it decides nearest-pixel ties), returned as float64.  With
    ``from_scales`` the resized length used by align_corners is the fractional ``in_len * scale`` (the spec's
    ``output_width``).
    """
    f = np.float32
    x = np.arange(out_len, dtype=f)
    scale = f(scale)
    half = f(0.5)
    if ctm in ("half_pixel", "pytorch_half_pixel"):
        if ctm == "pytorch_half_pixel" and out_len <= 1:
            r = np.zeros_like(x)
        else:
            r = (x + half) / scale - half
    elif ctm == "half_pixel_symmetric":
        adjustment = f(out_len) / (scale * f(in_len))
        center = f(in_len) / f(2)
        offset = center * (f(1) - adjustment)
        r = offset + (x + half) / scale - half
    elif ctm == "align_corners":
        length = f(in_len) * scale if from_scales else f(out_len)
        if out_len > 1 and length != 1:
            r = x * f(in_len - 1) / (length - f(1))
        else:
            r = np.zeros_like(x)
    elif ctm == "asymmetric":
        r = x / scale
    elif ctm == "tf_half_pixel_for_nn":
        r = (x + half) / scale
    elif ctm == "tf_crop_and_resize":
        rs, re_ = f(roi_start), f(roi_end)
        if out_len > 1:
            r = rs * f(in_len - 1) + x * (re_ - rs) * f(in_len - 1) / f(out_len - 1)
        else:
            r = np.full_like(x, half * (rs + re_) * f(in_len - 1))
    else:
        raise ValueError(f"Resize: unsupported coordinate_transformation_mode {ctm!r}")
    return r.astype(np.float64)


def _nearest_index(xo, mode, in_len, downsampling):
    if mode == "round_prefer_floor":
        idx = np.ceil(xo - 0.5)
    elif mode == "round_prefer_ceil":
        idx = np.floor(xo + 0.5)
    elif mode == "floor":
        idx = np.floor(xo)
    elif mode == "ceil":
        idx = np.ceil(xo)
    elif mode == "simple":  # opset < 11 semantics
        idx = np.ceil(xo) if downsampling else np.trunc(xo)
    else:
        raise ValueError(f"Resize: unsupported nearest_mode {mode!r}")
    return np.clip(idx, 0, in_len - 1).astype(np.int64)


def _cubic(d, a):
    d = np.abs(d)
    d2, d3 = d * d, d * d * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _linear(d):
    return np.maximum(0.0, 1.0 - np.abs(d))


def _taps(xo, in_len, mode, cubic_a, exclude_outside, antialias, scale):
    """Interpolation taps along one axis: input indices (out, T) (clamped to the edge) and weights (out, T)."""
    if antialias and scale < 1:
        support = (1.0 if mode == "linear" else 2.0) / scale
        span = int(math.ceil(support)) * 2 + 1
        base = np.floor(xo).astype(np.int64) - span // 2
        taps = base[:, None] + np.arange(span + 1)[None, :]
        d = (taps - xo[:, None]) * scale
        w = _linear(d) if mode == "linear" else _cubic(d, cubic_a)
        if exclude_outside:
            w = np.where((taps >= 0) & (taps < in_len), w, 0.0)
        tot = w.sum(axis=1, keepdims=True)
        w = np.divide(w, tot, out=np.zeros_like(w), where=tot != 0)
        keep = np.flatnonzero(np.any(w != 0, axis=0))  # drop all-zero tap columns
        if keep.size:
            taps, w = taps[:, keep[0]:keep[-1] + 1], w[:, keep[0]:keep[-1] + 1]
        return np.clip(taps, 0, in_len - 1), w
    if mode == "linear":
        xc = np.clip(xo, 0, in_len - 1)
        x0 = np.floor(xc)
        t = xc - x0
        x0 = x0.astype(np.int64)
        x1 = np.minimum(x0 + 1, in_len - 1)
        return np.stack([x0, x1], axis=1), np.stack([1 - t, t], axis=1)
    # cubic
    x0 = np.floor(xo)
    t = xo - x0
    x0 = x0.astype(np.int64)
    offs = np.arange(-1, 3)
    taps = x0[:, None] + offs[None, :]
    w = _cubic(t[:, None] - offs[None, :], cubic_a)
    if exclude_outside:
        inside = (taps >= 0) & (taps < in_len)
        w = np.where(inside, w, 0.0)
        tot = w.sum(axis=1, keepdims=True)
        w = np.divide(w, tot, out=np.zeros_like(w), where=tot != 0)
    return np.clip(taps, 0, in_len - 1), w


def _apply_axis(y, idx, w, axis):
    """Interpolate axis `axis` of y with taps idx/w of shape (out, T)."""
    out_len, T = idx.shape
    in_len = y.shape[axis]
    if T > 8 and T * 2 > in_len:
        m = np.zeros((out_len, in_len), dtype=np.float64)
        np.add.at(m, (np.repeat(np.arange(out_len), T), idx.reshape(-1)), w.reshape(-1))
        moved = np.moveaxis(y, axis, -1)
        return np.moveaxis(np.matmul(moved, m.T.astype(y.dtype, copy=False)), -1, axis)
    shape = [1] * y.ndim
    shape[axis] = out_len
    wt = w.astype(y.dtype)
    res = None
    for t in range(T):
        col = wt[:, t]
        if not col.any():
            continue
        term = np.take(y, idx[:, t], axis=axis)
        term *= col.reshape(shape)
        if res is None:
            res = term
        else:
            res += term
    if res is None:
        shp = list(y.shape)
        shp[axis] = out_len
        res = np.zeros(shp, dtype=y.dtype)
    return res


def _repeat_last2(X, index):
    """Nearest resizing that repeats each element of the last two axes an integer number of times (the gather
    indices are arange(out) // f, as 2x FPN upsampling has), other axes unchanged: written in one pass over the
    output instead of two gathers; None for any other mapping.  A 2x repeat along the last axis of 1-, 2- or 4-byte
    elements multiplies their bits, viewed as unsigned integers, by 2^bits + 1 into integers twice as wide: each
    product holds the element twice, so the output is written directly with both axes repeated (bit-exact, NaN
    payloads included)."""
    r = X.ndim
    if r < 2 or any(len(index[a]) != X.shape[a] or not np.array_equal(index[a], np.arange(X.shape[a]))
                    for a in range(r - 2)):
        return None
    H, W = X.shape[-2:]
    oh, ow = len(index[-2]), len(index[-1])
    if not H or not W or oh % H or ow % W:
        return None
    fh, fw = oh // H, ow // W
    if (fh, fw) == (1, 1) or not (np.array_equal(index[-2], np.arange(oh) // fh)
                                  and np.array_equal(index[-1], np.arange(ow) // fw)):
        return None
    x = np.ascontiguousarray(X)
    lead = x.shape[:-2]
    size = x.dtype.itemsize
    plain = x.dtype.kind in "biuf" or x.dtype.kind == "V" and x.dtype.names is None  # (bfloat16, float8: "V")
    if fw == 2 and size in (1, 2, 4) and plain:
        half, full = np.dtype(f"u{size}"), np.dtype(f"u{2 * size}")
        out = np.empty(lead + (H, fh, W), dtype=full)
        np.multiply(x.view(half)[..., :, None, :], full.type((1 << (8 * size)) + 1), out=out, dtype=full)
        return out.view(x.dtype).reshape(lead + (oh, ow))
    out = np.empty(lead + (H, fh, ow), dtype=x.dtype)
    out[...] = (np.repeat(x, fw, axis=-1) if fw > 1 else x)[..., :, None, :]
    return out.reshape(lead + (oh, ow))


def _resize(X, roi, scales, sizes, *, mode, ctm, cubic_a, exclude_outside, extrapolation_value, nearest_mode,
            antialias=0, axes=None, policy="stretch"):
    op = "Resize"
    X = np.asarray(X)
    r = X.ndim
    mode, ctm, nearest_mode, policy = text(mode), text(ctm), text(nearest_mode), text(policy)
    if mode not in ("nearest", "linear", "cubic"):
        raise ValueError(f"{op}: unsupported mode {mode!r}")
    if ctm not in _CTMS:
        raise ValueError(f"{op}: unsupported coordinate_transformation_mode {ctm!r}")
    if nearest_mode not in _NEAREST:
        raise ValueError(f"{op}: unsupported nearest_mode {nearest_mode!r}")
    if axes is None or len(axes) == 0:
        ax = list(range(r))
    else:
        ax = [int(a) + r if int(a) < 0 else int(a) for a in axes]
        if any(a < 0 or a >= r for a in ax) or len(set(ax)) != len(ax):
            raise ValueError(f"{op}: invalid axes {axes} for rank {r}")
    k = len(ax)
    scales, sizes, roi = _vec(scales), _vec(sizes), _vec(roi)
    if scales is not None and sizes is not None:
        raise ValueError(f"{op}: only one of scales and sizes may be given")
    if scales is None and sizes is None:
        raise ValueError(f"{op}: one of scales and sizes must be given")
    in_sz = [X.shape[a] for a in ax]
    starts, ends = [0.0] * k, [1.0] * k
    if roi is not None and ctm == "tf_crop_and_resize":
        if roi.size != 2 * k:
            raise ValueError(f"{op}: roi has {roi.size} values, expected {2 * k}")
        starts = [float(v) for v in roi[:k]]
        ends = [float(v) for v in roi[k:]]
    if sizes is not None:
        if sizes.size != k:
            raise ValueError(f"{op}: sizes has {sizes.size} values, expected {k}")
        req = [int(v) for v in sizes]
        if any(v < 0 for v in req):
            raise ValueError(f"{op}: sizes must be non-negative, got {req}")
        if policy == "stretch":
            out_sz = req
            sc = [float(np.float32(o) / np.float32(i)) if i else 1.0 for o, i in zip(out_sz, in_sz)]
        elif policy in ("not_larger", "not_smaller"):
            ratios = [o / i for o, i in zip(req, in_sz) if i]
            s = (min(ratios) if policy == "not_larger" else max(ratios)) if ratios else 1.0
            out_sz = [int(math.floor(s * i + 0.5)) for i in in_sz]
            sc = [s] * k
        else:
            raise ValueError(f"{op}: unsupported keep_aspect_ratio_policy {policy!r}")
    else:
        if scales.size != k:
            raise ValueError(f"{op}: scales has {scales.size} values, expected {k}")
        sc = [float(v) for v in scales]
        if any(not (s > 0) for s in sc):
            raise ValueError(f"{op}: scales must be positive, got {sc}")
        out_sz = [int(math.floor(i * (e - b) * s)) for i, b, e, s in zip(in_sz, starts, ends, sc)]
    out_shape = list(X.shape)
    for a, o in zip(ax, out_sz):
        out_shape[a] = o
    check_alloc(out_shape, X.dtype, f"{op} output")
    if prod(out_shape) == 0 or X.size == 0:
        if X.size == 0 and prod(out_shape) != 0:
            raise ValueError(f"{op}: cannot resize an empty tensor to shape {out_shape}")
        return np.zeros(out_shape, dtype=X.dtype)

    crop = ctm == "tf_crop_and_resize"
    from_scales = sizes is None
    outside = None
    if mode == "nearest":
        index = [np.arange(n) for n in X.shape]
        for j, a in enumerate(ax):
            xo = _original_coords(ctm, out_sz[j], in_sz[j], sc[j], starts[j], ends[j], from_scales)
            index[a] = _nearest_index(xo, nearest_mode, in_sz[j], sc[j] < 1)
            if crop:
                bad = (xo < 0) | (xo > in_sz[j] - 1)
                if bad.any():
                    shape = [1] * r
                    shape[a] = out_sz[j]
                    bad = bad.reshape(shape)
                    outside = bad if outside is None else (outside | bad)
        if outside is None:
            y = _repeat_last2(X, index)
            if y is not None:
                return y
        y = X
        for a in range(r):
            if index[a].shape[0] != X.shape[a] or not np.array_equal(index[a], np.arange(X.shape[a])):
                y = np.take(y, index[a], axis=a)
        if outside is not None:
            y = np.where(outside, np.asarray(extrapolation_value).astype(X.dtype), y)
        return y

    work = np.float64 if X.dtype == np.float64 else np.float32
    y = X.astype(work, copy=False)
    # contract the axes that shrink the most first
    order = sorted(range(k), key=lambda j: out_sz[j] / max(in_sz[j], 1))
    for j in order:
        a = ax[j]
        xo = _original_coords(ctm, out_sz[j], in_sz[j], sc[j], starts[j], ends[j], from_scales)
        if crop:
            bad = (xo < 0) | (xo > in_sz[j] - 1)
            if bad.any():
                shape = [1] * r
                shape[a] = out_sz[j]
                bad = bad.reshape(shape)
                outside = bad if outside is None else (outside | bad)
        if out_sz[j] == in_sz[j] and np.array_equal(xo, np.arange(in_sz[j], dtype=np.float64)):
            continue
        idx, w = _taps(xo, in_sz[j], mode, float(cubic_a), int(exclude_outside), int(antialias), sc[j])
        y = _apply_axis(y, idx, w, a)
    if outside is not None:
        y = np.where(outside, work(extrapolation_value), y)
    if not _is_float(X.dtype):
        if X.dtype == np.bool_:
            return y > 0.5
        info = np.iinfo(X.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return np.ascontiguousarray(y).astype(X.dtype, copy=False)


@kernel("Resize", since=10)
def resize_10(X, scales, *, mode="nearest"):
    return _resize(X, None, scales, None, mode=mode, ctm="asymmetric", cubic_a=-0.75, exclude_outside=0,
                   extrapolation_value=0.0, nearest_mode="simple")


@kernel("Resize", since=(11, 13, 18, 19))
def resize(X, roi=None, scales=None, sizes=None, *, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
           cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
           mode="nearest", nearest_mode="round_prefer_floor"):
    return _resize(X, roi, scales, sizes, mode=mode, ctm=coordinate_transformation_mode, cubic_a=cubic_coeff_a,
                   exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
                   nearest_mode=nearest_mode, antialias=antialias, axes=axes, policy=keep_aspect_ratio_policy)


def _upsample(X, scales, mode):
    mode = text(mode)
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise ValueError(f"Upsample: unsupported mode {mode!r}")
    sc = _vec(scales)
    if sc is None or sc.size != np.asarray(X).ndim:
        raise ValueError(f"Upsample: scales must have one value per input axis ({np.asarray(X).ndim})")
    if np.any(sc < 1):
        raise ValueError(f"Upsample: scales must be >= 1, got {sc.tolist()}")
    return _resize(X, None, sc, None, mode=mode, ctm="asymmetric", cubic_a=-0.75, exclude_outside=0,
                   extrapolation_value=0.0, nearest_mode="simple")


@kernel("Upsample", since=1)
def upsample_1(X, *, height_scale=None, mode="nearest", width_scale=None):
    if height_scale is None or width_scale is None or np.asarray(X).ndim != 4:
        raise ValueError("Upsample-1: needs a 4-D input and the height_scale and width_scale attributes")
    return _upsample(X, np.array([1.0, 1.0, height_scale, width_scale]), mode)


@kernel("Upsample", since=7)
def upsample_7(X, *, mode="nearest", scales=None):
    if scales is None:
        raise ValueError("Upsample: attribute scales is required")
    return _upsample(X, np.asarray(scales, dtype=np.float64), mode)


@kernel("Upsample", since=(9, 10))
def upsample_9(X, scales, *, mode="nearest"):
    return _upsample(X, scales, mode)


# ----------------------------------------------------------------------------------------------- GridSample


def _reflect(x, lo, hi):
    """Reflect coordinates into [lo, hi] (repeatedly)."""
    span = hi - lo
    if span <= 0:
        return np.zeros_like(x)
    d = np.abs(x - lo)
    flips = np.floor(d / span)
    extra = d - flips * span
    return np.where(np.mod(flips, 2) == 0, lo + extra, hi - extra)


def _bound_coords(x, size, padding, align_corners):
    if padding == "border":
        return np.clip(x, 0, size - 1)
    if padding == "reflection":
        if align_corners:
            x = _reflect(x, 0.0, size - 1.0)
        else:
            x = _reflect(x, -0.5, size - 0.5)
        return np.clip(x, 0, size - 1)
    return x


def _grid_sample(X, grid, mode, padding_mode, align_corners, op):
    X = np.asarray(X)
    grid = np.asarray(grid)
    mode, padding_mode = text(mode), text(padding_mode)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    if mode not in ("linear", "nearest", "cubic"):
        raise ValueError(f"{op}: unsupported mode {mode!r}")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise ValueError(f"{op}: unsupported padding_mode {padding_mode!r}")
    if X.ndim < 3:
        raise ValueError(f"{op}: X must have rank >= 3, got shape {X.shape}")
    n = X.ndim - 2
    if grid.ndim != X.ndim or grid.shape[0] != X.shape[0] or grid.shape[-1] != n:
        raise ValueError(f"{op}: grid shape {grid.shape} does not match X shape {X.shape}")
    if mode == "cubic" and n != 2:
        raise ValueError(f"{op}: cubic mode supports only 4-D inputs")
    N, C = X.shape[:2]
    in_shape = X.shape[2:]
    out_sp = grid.shape[1:-1]
    P = prod(out_sp)
    work = np.float64 if X.dtype == np.float64 else np.float32
    if N == 0 or C == 0 or P == 0:
        return np.zeros((N, C, *out_sp), dtype=X.dtype)
    if prod(in_shape) == 0:
        raise ValueError(f"{op}: X has empty spatial dimensions")
    g = grid.reshape(N, P, n).astype(np.float64)
    # grid's last axis is (x, y, z...) = reversed spatial order
    coords = []
    for a in range(n):
        size = in_shape[a]
        gv = g[:, :, n - 1 - a]
        if align_corners:
            c = (gv + 1) / 2 * (size - 1)
        else:
            c = ((gv + 1) * size - 1) / 2
        coords.append(c)
    xt = X.astype(work, copy=False).reshape(N, C, -1).transpose(0, 2, 1)  # (N, S, C)
    bidx = np.arange(N)[:, None]
    out = np.zeros((N, P, C), dtype=work)

    def gather(tap_idx, weight):
        valid = np.ones((N, P), dtype=bool)
        flat = np.zeros((N, P), dtype=np.int64)
        for a in range(n):
            ia = tap_idx[a]
            if padding_mode == "zeros":
                valid &= (ia >= 0) & (ia < in_shape[a])
            ia = np.clip(ia, 0, in_shape[a] - 1)
            flat = flat * in_shape[a] + ia
        w = np.where(valid, weight, 0.0).astype(work)
        out[...] += xt[bidx, flat] * w[..., None]

    if mode == "nearest":
        cs = [_bound_coords(c, in_shape[a], padding_mode, align_corners) for a, c in enumerate(coords)]
        idx = [np.rint(c).astype(np.int64) for c in cs]
        gather(idx, np.ones((N, P)))
    elif mode == "linear":
        cs = [_bound_coords(c, in_shape[a], padding_mode, align_corners) for a, c in enumerate(coords)]
        lo = [np.floor(c) for c in cs]
        fr = [c - f for c, f in zip(cs, lo)]
        lo = [f.astype(np.int64) for f in lo]
        for corner in np.ndindex(*(2,) * n):
            w = np.ones((N, P))
            for a in range(n):
                w = w * (fr[a] if corner[a] else 1 - fr[a])
            gather([lo[a] + corner[a] for a in range(n)], w)
    else:  # cubic: taps are bounded individually
        lo = [np.floor(c) for c in coords]
        fr = [c - f for c, f in zip(coords, lo)]
        lo = [f.astype(np.int64) for f in lo]
        wts = [[_cubic(fr[a] - o, -0.75) for o in range(-1, 3)] for a in range(n)]
        for taps in np.ndindex(*(4,) * n):
            w = np.ones((N, P))
            idx = []
            for a in range(n):
                w = w * wts[a][taps[a]]
                ia = lo[a] + taps[a] - 1
                if padding_mode != "zeros":
                    ia = np.rint(_bound_coords(ia.astype(np.float64), in_shape[a], padding_mode,
                                               align_corners)).astype(np.int64)
                idx.append(ia)
            gather(idx, w)
    res = out.transpose(0, 2, 1).reshape(N, C, *out_sp)
    return res.astype(X.dtype, copy=False)


@kernel("GridSample", since=16)
def grid_sample_16(X, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    if np.asarray(X).ndim != 4:
        raise ValueError(f"GridSample: opset 16 supports only 4-D input, got shape {np.asarray(X).shape}")
    return _grid_sample(X, grid, mode, padding_mode, int(align_corners), "GridSample")


@kernel("GridSample", since=(20, 22))
def grid_sample(X, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    return _grid_sample(X, grid, mode, padding_mode, int(align_corners), "GridSample")


# ----------------------------------------------------------------------------------------------- AffineGrid


@kernel("AffineGrid", since=20)
def affine_grid(theta, size, *, align_corners=0):
    op = "AffineGrid"
    theta = np.asarray(theta)
    sz = [int(v) for v in np.asarray(size).reshape(-1)]
    if len(sz) not in (4, 5):
        raise ValueError(f"{op}: size must have 4 or 5 values, got {sz}")
    n = len(sz) - 2
    N = sz[0]
    if theta.shape != (N, n, n + 1):
        raise ValueError(f"{op}: theta shape {theta.shape}, expected {(N, n, n + 1)}")
    spatial = sz[2:]
    work = np.float64 if theta.dtype == np.float64 else np.float32
    lin = []
    for s in spatial:
        if align_corners:
            v = np.linspace(-1.0, 1.0, s) if s > 1 else np.zeros(s)
        else:
            v = (np.arange(s, dtype=np.float64) * 2 + 1) / s - 1
        lin.append(v)
    mesh = np.meshgrid(*lin, indexing="ij")  # each of shape spatial
    # base columns in (x, y, z) order = reversed spatial axes, plus 1
    base = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(prod(spatial))], axis=-1)
    grid = np.matmul(base.astype(work)[None], theta.astype(work).transpose(0, 2, 1))  # (N, P, n)
    return grid.reshape(N, *spatial, n).astype(theta.dtype, copy=False)
