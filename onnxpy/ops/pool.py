"""Pooling: MaxPool, AveragePool, LpPool, Global{Average,Max,Lp}Pool, MaxUnpool."""

from __future__ import annotations

import functools
import sys

import numpy as np

from ..limits import check_alloc
from ._common import F32 as _F32
from ._common import ones_vector, text
from ._spatial import ceil_div, check_rank, compute_dtype, explicit_pads, pad_array, prod, spatial_attr, windows
from .registry import kernel
from . import _native, _packed

# Above this many kernel positions reduce over a strided window view instead of looping over positions.
_LOOP_LIMIT = 64


def _pool_geometry(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, op):
    """(kernel, strides, dilations, pad_begin, pad_end, out_shape) for a pooling op."""
    check_rank(x, op, "X")
    n = x.ndim - 2
    if kernel_shape is None or len(kernel_shape) == 0:
        raise ValueError(f"{op}: attribute kernel_shape is required")
    ks = spatial_attr(kernel_shape, n, 1, op, "kernel_shape")
    st = spatial_attr(strides, n, 1, op, "strides")
    dl = spatial_attr(dilations, n, 1, op, "dilations")
    if any(k < 1 for k in ks) or any(s < 1 for s in st) or any(d < 1 for d in dl):
        raise ValueError(f"{op}: kernel_shape, strides and dilations must be positive")
    in_shape = x.shape[2:]
    eff = [(k - 1) * d + 1 for k, d in zip(ks, dl)]
    auto_pad = text(auto_pad) or "NOTSET"
    ceil_mode = bool(ceil_mode)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [ceil_div(i, s) for i, s in zip(in_shape, st)]
        pb, pe = [], []
        for i in range(n):
            total = max(0, (out[i] - 1) * st[i] + eff[i] - in_shape[i])
            small, big = total // 2, total - total // 2
            pb.append(small if auto_pad == "SAME_UPPER" else big)
            pe.append(big if auto_pad == "SAME_UPPER" else small)
        return ks, st, dl, pb, pe, out
    if auto_pad == "VALID":
        pb, pe = [0] * n, [0] * n
    elif auto_pad == "NOTSET":
        pb, pe = explicit_pads(pads, n, op)
    else:
        raise ValueError(f"{op}: unsupported auto_pad value {auto_pad!r}")
    out = []
    for i in range(n):
        span = in_shape[i] + pb[i] + pe[i] - eff[i]
        if span < 0:
            raise ValueError(f"{op}: kernel (effective size {eff[i]}) larger than padded input on spatial axis {i}")
        o = (ceil_div(span, st[i]) if ceil_mode else span // st[i]) + 1
        if ceil_mode and (o - 1) * st[i] >= in_shape[i] + pb[i]:
            o -= 1  # the last window would start in the right padding
        out.append(o)
    return ks, st, dl, pb, pe, out


def _padded(x, ks, st, dl, pb, pe, out, value):
    """x padded so that every window lies inside; extra room at the end for ceil-mode windows."""
    pe2 = []
    for i in range(len(ks)):
        need = (out[i] - 1) * st[i] + (ks[i] - 1) * dl[i] + 1
        have = x.shape[2 + i] + pb[i] + pe[i]
        pe2.append(pe[i] + max(0, need - have))
    return pad_array(x, pb, pe2, value)


def _slices(kpos, dl, out, st):
    return (slice(None), slice(None)) + tuple(
        slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, o, s in zip(kpos, dl, out, st))


def _min_value(dt):
    if dt.kind == "f" or str(dt) == "bfloat16":
        return -np.inf
    if dt.kind == "b":
        return False
    return np.iinfo(dt).min


def _reduce_windows(xp, ks, st, dl, out, how):
    """max or sum over every pooling window of the padded array."""
    n = len(ks)
    if sum(ks) > _LOOP_LIMIT:
        view = windows(xp, ks, st, dl, out, kernel_first=False)
        axes = tuple(range(2 + n, 2 + 2 * n))
        return view.max(axis=axes) if how == "max" else view.sum(axis=axes)
    # max and sum are separable: reduce one spatial axis at a time (sum(ks) passes instead of prod(ks)),
    # first spatial axis first (whole contiguous rows), each pass over an array already shrunk by the previous ones.
    acc = xp
    for a in range(n):
        k, d, o, s = ks[a], dl[a], out[a], st[a]
        lead = (slice(None),) * (2 + a)
        red = None
        for t in range(k):
            sl = acc[lead + (slice(t * d, t * d + (o - 1) * s + 1, s),)]
            if red is None:
                red = sl.copy()
            elif how == "max":
                np.maximum(red, sl, out=red)
            else:
                red += sl
        acc = red
    return acc


def _tap_range(in_len, k_off, s, pb, o):
    """Output positions [lo, hi) whose tap at offset ``k_off`` (= tap * dilation) lies inside the input."""
    # input coordinate of output j: j * s - pb + k_off, wanted in [0, in_len)
    lo = max(0, ceil_div(pb - k_off, s))
    hi = min(o, (in_len - 1 + pb - k_off) // s + 1) if in_len - 1 + pb - k_off >= 0 else 0
    return lo, max(lo, hi)


def _reduce_unpadded(x, ks, st, dl, pb, out, how, fill, dest=None):
    """max or sum over every pooling window, reading only the taps that fall inside ``x`` (padding taps are the
    reduction's identity ``fill``, so they are skipped instead of materialised).  One spatial axis at a time.

    ``dest``: an array of the result's shape to write into.  The first two taps that cover every output position
    combine straight into the result (no copy of the first one)."""
    n = len(ks)
    acc = x
    for a in range(n):
        k, d, o, s, p = ks[a], dl[a], out[a], st[a], pb[a]
        in_len = acc.shape[2 + a]
        lead = (slice(None),) * (2 + a)
        ranges = [_tap_range(in_len, t * d, s, p, o) for t in range(k)]
        full = next((t for t, (lo, hi) in enumerate(ranges) if lo == 0 and hi == o), None)
        last = dest is not None and a == n - 1
        full2 = None if full is None else next(
            (t for t, (lo, hi) in enumerate(ranges) if t > full and lo == 0 and hi == o), None)
        if full is not None:
            st0 = -p + full * d
            src0 = acc[lead + (slice(st0, st0 + (o - 1) * s + 1, s),)]
            if full2 is not None:  # the first two full taps combine straight into the result
                st1 = -p + full2 * d
                src1 = acc[lead + (slice(st1, st1 + (o - 1) * s + 1, s),)]
                red = (np.maximum if how == "max" else np.add)(src0, src1, out=dest if last else None)
            elif last:
                red = dest
                red[...] = src0
            else:
                red = src0.copy()
        else:
            shape = acc.shape[:2 + a] + (o,) + acc.shape[3 + a:]
            if last:
                red = dest
                red.fill(fill)
            else:
                red = np.full(shape, fill, dtype=acc.dtype)
        for t, (lo, hi) in enumerate(ranges):
            if t == full or t == full2 or hi <= lo:
                continue
            i0 = lo * s - p + t * d
            src = acc[lead + (slice(i0, i0 + (hi - lo - 1) * s + 1, s),)]
            dst = red[lead + (slice(lo, hi),)]
            if how == "max":
                np.maximum(dst, src, out=dst)
            else:
                dst += src
        acc = red
    return acc


def _axis_counts(in_len, k, s, d, pb, pe, o, include_pad):
    """Per output position, how many kernel taps fall inside the input (or inside input + explicit pads)."""
    starts = np.arange(o) * s - pb
    taps = starts[:, None] + np.arange(k)[None, :] * d
    lo, hi = (-pb, in_len + pe) if include_pad else (0, in_len)
    return ((taps >= lo) & (taps < hi)).sum(axis=1)


def _counts(in_shape, ks, st, dl, pb, pe, out, include_pad, dtype):
    c = np.ones((), dtype=dtype)
    for i in range(len(ks)):
        ci = _axis_counts(in_shape[i], ks[i], st[i], dl[i], pb[i], pe[i], out[i], include_pad).astype(dtype)
        c = np.multiply.outer(c, ci)
    return c


# AveragePool runs as two small GEMMs with 0/1 window matrices (scaled by the window counts) while the image is at
# most this many times the kernel along each axis (the dense window matrices do size/kernel multiply-adds per output).
_AVG_GEMM_RATIO = 24
# Stride-1 pooling takes the GEMMs instead of the flat passes on planes up to this many times the kernel (measured
# 0.44-0.7x the flat passes up to 28x28 for 3x3; 1.2-1.3x at 56x56 and 80x80).
_AVG_GEMM_S1_RATIO = 10


def _gemm_sized(shape, ks, ratio) -> bool:
    """A 2-D pooling whose image is at most ``ratio`` times the kernel along both axes (window-matrix GEMM size)."""
    return len(ks) == 2 and shape[2] <= ratio * ks[0] and shape[3] <= ratio * ks[1]


@functools.lru_cache(maxsize=256)
def _avg_matrices(in_shape, ks, st, dl, pb, pe, out, include_pad, dtype):
    """(SH (Ho, H), SW (W, Wo)) with SH[r, h] = 1 / count_h(r) for the rows h of window r (likewise SW), so that
    SH @ X @ SW is the windows' sums divided by their counts (the counts are a product of per-axis counts)."""
    mats = []
    for a in range(2):
        n, k, s, d, b, o = in_shape[a], ks[a], st[a], dl[a], pb[a], out[a]
        cnt = _axis_counts(n, k, s, d, b, pe[a], o, include_pad).astype(np.float64)
        m = np.zeros((o, n), dtype=np.float64)
        for t in range(k):
            pos = np.arange(o) * s - b + t * d
            ok = (pos >= 0) & (pos < n)
            m[np.arange(o)[ok], pos[ok]] = 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            m = (m / cnt[:, None]).astype(dtype)
        mats.append(m)
    sh, sw = np.ascontiguousarray(mats[0]), np.ascontiguousarray(mats[1].T)
    sh.flags.writeable = False
    sw.flags.writeable = False
    return sh, sw


def _avg_pool2d_gemm(x, ks, st, dl, pb, pe, out, include_pad):
    """2-D average pooling as GEMMs: Z = X (N*C*H, W) @ SW, then SH @ Z over the rows of every channel at once (Z is
    transposed to (H, N*C*Wo) for that).  None when an input is not finite: the matrices' zeros would turn an inf
    outside a window into a NaN, so those inputs take the direct path."""
    N, C, H, W = x.shape
    Ho, Wo = out
    sh, sw = _avg_matrices((H, W), tuple(ks), tuple(st), tuple(dl), tuple(pb), tuple(pe), tuple(out),
                           include_pad, x.dtype.str)
    NC = N * C
    with np.errstate(invalid="ignore", over="ignore"):
        return _avg_gemms(x.reshape(NC, H, W), sh, sw, N, C, Ho, Wo)


def _avg_gemms(x3, sh, sw, N, C, Ho, Wo):
    """Z = X (N*C*H, W) @ SW, then SH @ Z_c for every channel in one batched matmul, straight into the output layout
    (measured 0.57-0.6x the former transpose of Z to (H, N*C*Wo) and back at ShuffleNet's 3x3/2 pools)."""
    NC, H, W = x3.shape
    z = np.matmul(x3.reshape(NC * H, W), sw)  # (NC*H, Wo)
    if H == 1:
        res = (z * sh[:, 0]).reshape(N, C, 1, Wo) if Ho == 1 else None
    else:
        res = np.matmul(sh, z.reshape(NC, H, Wo)).reshape(N, C, Ho, Wo)
    if res is None or not np.isfinite(np.add.reduce(res.reshape(-1))):
        return None
    return res


def _maxpool_indices(x, ks, st, dl, pb, pe, out, storage_order):
    """Max values and flat (un-padded) indices of the first maximum of each window."""
    in_shape = x.shape[2:]
    n = len(ks)
    N, C = x.shape[:2]
    minv = _min_value(x.dtype)
    xp = _padded(x, ks, st, dl, pb, pe, out, minv)
    best = None
    best_idx = np.full((N, C, *out), -1, dtype=np.int64)
    # multipliers of each spatial coordinate in the flat index
    if storage_order:
        mult = [prod(in_shape[:a]) for a in range(n)]
    else:
        mult = [prod(in_shape[a + 1:]) for a in range(n)]
    for kpos in np.ndindex(*ks):
        flat = np.zeros((), dtype=np.int64)
        valid = np.ones((), dtype=bool)
        for a in range(n):
            coord = np.arange(out[a]) * st[a] - pb[a] + kpos[a] * dl[a]
            shape = [1] * n
            shape[a] = out[a]
            flat = flat + (coord * mult[a]).reshape(shape)
            valid = valid & ((coord >= 0) & (coord < in_shape[a])).reshape(shape)
        v = xp[_slices(kpos, dl, out, st)]
        if best is None:
            best = np.where(valid, v, minv).astype(x.dtype)
            best_idx = np.where(valid, np.broadcast_to(flat, best.shape), -1)
            continue
        upd = valid & ((v > best) | (best_idx < 0))
        best = np.where(upd, v, best)
        best_idx = np.where(upd, flat, best_idx)
    plane = prod(in_shape)
    base = (np.arange(N * C, dtype=np.int64) * plane).reshape((N, C) + (1,) * n)
    return best, np.maximum(best_idx, 0) + base


# Float32 2-D max and average pooling run as the native kernel where it is used (``_native.py``: four output rows x
# 16 columns per step over each plane padded once into scratch; test and measurement hook), split over the planes
# between the calling thread and a helper from this many window reads on (the kernel runs without the GIL)
POOL_NATIVE = True
_POOL_SPLIT_MIN = 1 << 22


def _pool_native_part(lo, hi, fn, x, y, args, tail, pad_floats):
    H, W = x.shape[2:]
    Ho, Wo = y.shape[2:]
    pad = _packed._aligned(pad_floats)  # (each part its own scratch, 64-byte aligned: the padded plane)
    fn(hi - lo, H, W, x.ctypes.data + 4 * lo * H * W, *args, y.ctypes.data + 4 * lo * Ho * Wo, *tail, pad.ctypes.data)


def _pool2d_native(x, ks, st, dl, pb, out, mode, pe=None, include_pad=False):
    """2-D max (mode 0) or average (mode 1: divided by the window counts, from the end pads ``pe`` and
    ``include_pad``) pooling of float32 ``x`` (N, C, H, W) with column stride 1 or 2 by the native kernel: a fresh
    array, or None where it is not used."""
    if (not POOL_NATIVE or x.dtype != _F32 or x.ndim != 4 or len(ks) != 2 or st[1] > 2 or not x.flags.c_contiguous
            or x.size == 0):
        return None
    fn = _native.function("pool2d_f32")
    if fn is None:
        return None
    N, C, H, W = x.shape
    Ho, Wo = out
    div = None
    if mode == 1:
        div = _native_divisor((H, W), tuple(ks), tuple(st), tuple(dl), tuple(pb), tuple(pe), tuple(out),
                              bool(include_pad))
    y = np.empty((N, C, Ho, Wo), dtype=_F32)
    args = (ks[0], ks[1], st[0], st[1], dl[0], dl[1], pb[0], pb[1], Ho, Wo)
    tail = (mode, None if div is None else div.ctypes.data, _native.NEG_INF, _native.EVEN_LANES)
    pad_floats = _native.function("win_pad_floats")(*args[:6], Ho, Wo)
    if N * C > 1 and y.size * ks[0] * ks[1] >= _POOL_SPLIT_MIN:
        if _packed.run_ranges(_pool_native_part, N * C, _packed._blas_threads(), fn, x, y, args, tail, pad_floats,
                              single_blas=False):
            return y
    _pool_native_part(0, N * C, fn, x, y, args, tail, pad_floats)
    return y


@functools.lru_cache(maxsize=64)
def _native_divisor(in_shape, ks, st, dl, pb, pe, out, include_pad):
    d = np.ascontiguousarray(_counts(in_shape, ks, st, dl, pb, pe, out, include_pad, _F32))
    d.setflags(write=False)
    return d


@kernel("MaxPool", since=(1, 8, 10, 11, 12, 22))
def max_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None, storage_order=0,
             strides=None, _num_outputs=1):
    op = "MaxPool"
    ks, st, dl, pb, pe, out = _pool_geometry(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, op)
    if X.dtype.kind not in "fiu" and str(X.dtype) != "bfloat16":
        raise TypeError(f"{op}: unsupported input type {X.dtype}")
    if _num_outputs > 1:
        if X.size == 0 or prod(out) == 0:
            shape = X.shape[:2] + tuple(out)
            return np.zeros(shape, dtype=X.dtype), np.zeros(shape, dtype=np.int64)
        return _maxpool_indices(X, ks, st, dl, pb, pe, out, int(storage_order))
    if X.size == 0 or prod(out) == 0:
        return np.zeros(X.shape[:2] + tuple(out), dtype=X.dtype)
    if _whole_plane(X.shape[2:], ks, dl, pb, pe, out):
        return global_max_pool(X)
    x = X if X.dtype.kind in "fiu" else X.astype(np.float32)  # bfloat16
    res = _pool2d_native(x, ks, st, dl, pb, out, 0)
    if res is not None:
        return res.astype(X.dtype, copy=False)
    if _FLAT_POOL and _flat_ok(x.shape[2:], ks, st, dl, pb, pe, out):
        with np.errstate(invalid="ignore"):  # (the second pass also reads positions the first left undefined)
            res = _pool2d_s1(x, ks, dl, pb, out, np.maximum)
        return res.astype(X.dtype, copy=False)
    if (_MAXPOOL_2X2 and _LITTLE_ENDIAN and tuple(ks) == (2, 2) and tuple(st) == (2, 2) and tuple(dl) == (1, 1)
            and not any(pb) and x.dtype.itemsize == 4 and 2 * out[0] <= x.shape[2] and 2 * out[1] <= x.shape[3]):
        return _max_pool_2x2s2(x, out).astype(X.dtype, copy=False)  # VGG's pools
    if (_MAXPOOL_W3S2 and len(ks) == 2 and ks[1] == 3 and st[1] == 2 and dl[0] == dl[1] == 1 and pb[1] <= 1
            and 2 * out[1] <= x.shape[3]):
        return _max_pool_w3s2(x, ks[0], st[0], pb[0], pb[1], out).astype(X.dtype, copy=False)
    if sum(ks) <= _LOOP_LIMIT:
        return _reduce_unpadded(x, ks, st, dl, pb, out, "max", _min_value(x.dtype)).astype(X.dtype, copy=False)
    xp = _padded(x, ks, st, dl, pb, pe, out, _min_value(x.dtype))
    return _reduce_windows(xp, ks, st, dl, out, "max").astype(X.dtype, copy=False)


# Channel block of ``_max_pool_w3s2`` (bytes of input): the row pass's result is reread while still in cache.
_MAXPOOL_BLOCK_BYTES = 1 << 19
_MAXPOOL_W3S2 = True
_MAXPOOL_2X2 = True  # test hook: ``_max_pool_2x2s2`` on/off
# Channel block of ``_max_pool_2x2s2`` (bytes of input; in-model on VGG-19, two threads: 1 MiB 0.8-0.9x 512 KiB).
_MAXPOOL_2X2_BLOCK_BYTES = 1 << 20
# Images (one batch item) of at least this many bytes take ``_max_pool_2x2s2_columns_first`` (read from memory once).
_MAXPOOL_HFIRST_BYTES = 8 << 20
_LITTLE_ENDIAN = sys.byteorder == "little"  # (``_max_pool_2x2s2`` takes a pair's first element as its low half)


def _max_pool_2x2s2(x, out):
    """2x2 stride-2 max pooling without padding for 4-byte elements (float32, int32): per block of channels, the row
    pairs' maximum (contiguous rows), then each element's maximum with its right neighbour over the flattened rows
    (one contiguous pass), whose even elements -- the low halves of the 8-byte pairs -- come out through one
    int64 -> int32 conversion (a contiguous pass instead of a stride-2 copy).  0.65-0.85x the strided passes on
    VGG-19's pools.  Extra input rows/columns (odd sizes) are ignored, as the floor-mode windows do.  Large images
    split their channels between two threads (``_by_channels``)."""
    N, C, H, W = x.shape
    res = np.empty((N, C) + tuple(out), dtype=x.dtype)
    if W == 2 * out[1] and x.flags.c_contiguous and C * H * W * 4 >= _MAXPOOL_HFIRST_BYTES:
        return _by_channels(_max_pool_2x2s2_columns_first, x, res)
    return _by_channels(_max_pool_2x2s2_rows_first, x, res)


def _max_pool_2x2s2_rows_first(c_lo, c_hi, x, res):
    """``_max_pool_2x2s2`` of channels [c_lo, c_hi) into ``res``."""
    N, C, H, W = x.shape
    Ho, Wo = res.shape[2:]
    step = max(1, min(c_hi - c_lo, _MAXPOOL_2X2_BLOCK_BYTES // max(1, 4 * Ho * 4 * Wo)))
    m = np.empty(step * Ho * 2 * Wo, dtype=x.dtype)
    q = np.empty_like(m)  # (its last element, the high half of the last pair, is never set: the conversion drops it)
    for n in range(N):
        for c0 in range(c_lo, c_hi, step):
            c1 = min(c_hi, c0 + step)
            L = (c1 - c0) * Ho * 2 * Wo
            mm = m[:L].reshape(c1 - c0, Ho, 2 * Wo)
            xb = x[n, c0:c1]
            np.maximum(xb[:, 0:2 * Ho:2, :2 * Wo], xb[:, 1:2 * Ho:2, :2 * Wo], out=mm)
            np.maximum(m[:L - 1], m[1:L], out=q[:L - 1])
            np.copyto(res[n, c0:c1].reshape(-1).view(np.int32), q[:L].view(np.int64), casting="unsafe")


def _max_pool_2x2s2_columns_first(c_lo, c_hi, x, res):
    """``_max_pool_2x2s2`` of channels [c_lo, c_hi) for large C-contiguous images of even width, the passes
    reordered so the image is read once, front to back: per block of channels each element's maximum with its right
    neighbour over the flattened block, the even elements out through the int64 -> int32 conversion, then the row
    pairs' maximum of that half-width result (in cache).  On VGG-19's first pool (64 x 224 x 224, 12.8 MB: read from
    memory) 0.59x the row-pairs-first order alone and 0.62x right after the convolution that writes it (2.95 -> 1.83
    ms); from 128 x 112 x 112 down, with the image in cache, the same (1.0-1.04x)."""
    N, C, H, W = x.shape
    Ho, Wo = res.shape[2:]
    step = max(1, min(c_hi - c_lo, _MAXPOOL_2X2_BLOCK_BYTES // (4 * H * W)))
    q = np.empty(step * H * W, dtype=x.dtype)  # (its last element is never set: the conversion drops it)
    e = np.empty(step * H * Wo, dtype=x.dtype)
    for n in range(N):
        for c0 in range(c_lo, c_hi, step):
            c1 = min(c_hi, c0 + step)
            L = (c1 - c0) * H * W
            f = x[n, c0:c1].reshape(-1)
            np.maximum(f[:L - 1], f[1:L], out=q[:L - 1])
            eb = e[:L // 2]
            np.copyto(eb.view(np.int32), q[:L].view(np.int64), casting="unsafe")
            e3 = eb.reshape(c1 - c0, H, Wo)
            np.maximum(e3[:, 0:2 * Ho:2], e3[:, 1:2 * Ho:2], out=res[n, c0:c1])


# 2x2 pools whose input has at least this many bytes split their channels between the calling thread and the GEMM
# helper thread (``_packed._run_shared``): each half's passes are long numpy calls (the GIL released), so the threads
# seldom wait for each other.  In-model on VGG-19 (with 1 MiB blocks): 64 x 224 x 224 0.60x, 128 x 112 x 112 0.63x,
# 256 x 56 x 56 0.91x one thread's time; smaller pools cost less than the hand-off (~50-80 us).  The 3x3 stride-2
# pools (``_max_pool_w3s2``, inputs in cache, more calls per block) lost: ResNet-50's 1.27x, SqueezeNet's 1.18x.
_POOL_SPLIT_BYTES = 2 << 20
_POOL_SPLIT = True  # test hook


def _by_channels(fn, x, res):
    """``fn(c_lo, c_hi, x, res)`` over every channel, in two halves on two threads for large inputs when the
    session allows two threads (``intra_op_num_threads``) and the helper is free (``_packed.run_ranges``; the passes
    call no BLAS, so OpenBLAS's thread count is left alone); returns ``res``."""
    C = x.shape[1]
    if _POOL_SPLIT and x.nbytes >= _POOL_SPLIT_BYTES:
        from . import _packed

        if _packed.run_ranges(fn, C, _packed._blas_threads(), x, res, single_blas=False):
            return res
    fn(0, C, x, res)
    return res


def _max_pool_w3s2(x, kh, sh, ph, pw, out):
    """2-D max pooling with 3-wide, stride-2 windows along W starting at column 2j - pw (pw in {0, 1}), no
    dilation: rows first (the kh strided-row taps, padding taps skipped), then columns.

    Along W the 3-tap maximum is taken at every column of the row pass's result with two passes over its flattened
    rows (numpy's contiguous loops run ~3x faster than the strided ones that would read every other column), then
    the even columns are copied out; a tap running past a row end reads the next row, so those outputs -- the
    first column with a left pad, the last when its third column lies past the edge -- are recomputed from their
    in-range taps.  Channels go in blocks of ~512 KiB so the intermediates stay in cache (measured 0.82-0.95x the
    strided column pass on the corpus's 3x3 stride-2 pools)."""
    N, C, H, W = x.shape
    Ho, Wo = out
    res = np.empty((N, C, Ho, Wo), dtype=x.dtype)
    step = min(C, max(1, _MAXPOOL_BLOCK_BYTES // max(1, H * W * x.dtype.itemsize)))
    rows = np.empty((step, Ho, W), dtype=x.dtype)
    cols = np.empty(step * Ho * W, dtype=x.dtype)
    ranges = [_tap_range(H, i, sh, ph, Ho) for i in range(kh)]
    full = [i for i, (lo, hi) in enumerate(ranges) if lo == 0 and hi == Ho]
    part = [i for i, (lo, hi) in enumerate(ranges) if hi > lo and i not in full]
    fill = _min_value(x.dtype)
    # outputs whose window the flat column pass gets wrong: (j, its in-range input columns)
    edges = [(j, [c for c in (2 * j - pw, 2 * j + 1 - pw, 2 * j + 2 - pw) if 0 <= c < W]) for j in range(Wo)
             if 2 * j - pw < 0 or 2 * j + 2 - pw >= W]
    for n in range(N):
        for c0 in range(0, C, step):
            c1 = min(C, c0 + step)
            b = c1 - c0
            xb = x[n, c0:c1]
            r = rows[:b]
            if not full:
                r.fill(fill)
            elif len(full) == 1:
                i0 = full[0] - ph
                r[...] = xb[:, i0:i0 + (Ho - 1) * sh + 1:sh]
            else:
                i0, i1 = full[0] - ph, full[1] - ph
                np.maximum(xb[:, i0:i0 + (Ho - 1) * sh + 1:sh], xb[:, i1:i1 + (Ho - 1) * sh + 1:sh], out=r)
            for i in full[2:] + part:
                lo, hi = ranges[i]
                a = lo * sh - ph + i
                d = r[:, lo:hi]
                np.maximum(d, xb[:, a:a + (hi - lo - 1) * sh + 1:sh], out=d)
            # q[k] = max(r[k - pw], r[k + 1 - pw], r[k + 2 - pw]) over the flattened rows, for pw <= k < L - 2 + pw
            rf = r.reshape(-1)
            L = rf.size
            q = cols[:L]
            if L > 2:
                np.maximum(rf[:L - 2], rf[1:L - 1], out=q[pw:L - 2 + pw])
                np.maximum(q[pw:L - 2 + pw], rf[2:], out=q[pw:L - 2 + pw])
            o = res[n, c0:c1]
            o[...] = q.reshape(b, Ho, W)[:, :, 0:2 * Wo - 1:2]
            for j, cs in edges:
                d = o[:, :, j]
                if len(cs) == 1:
                    d[...] = r[:, :, cs[0]]
                else:
                    np.maximum(r[:, :, cs[0]], r[:, :, cs[1]], out=d)
                    for c in cs[2:]:
                        np.maximum(d, r[:, :, c], out=d)
    return res


# Stride-1 2-D pooling runs as flat passes (``_pool2d_s1``) when the windows leave the plane at few positions.
_FLAT_POOL = True  # test hook: the flat path on/off
# Channel blocks of ``_pool2d_s1`` hold about this many bytes of input, so the intermediates stay in cache.
_FLAT_BLOCK_BYTES = 1 << 19


def _flat_ok(in_shape, ks, st, dl, pb, pe, out):
    """Whether ``_pool2d_s1`` takes a pooling: 2-D, stride 1, pads >= 0, no output position past the input (Ho <=
    H, Wo <= W: every window holds an input tap) and windows narrower than half the plane (each edge position is
    rewritten by its own numpy calls)."""
    return (len(ks) == 2 and st == [1, 1] and min(pb + pe) >= 0 and out[0] <= in_shape[0] and out[1] <= in_shape[1]
            and all(2 * (k - 1) * d < n for k, d, n in zip(ks, dl, in_shape)))


@functools.lru_cache(maxsize=1024)
def _pass_plan(k, d, p, L, lo):
    """How ``_axis_pass`` pools an axis of length L (k taps, stride 1, dilation d, begin pad p) to the positions
    j < lo: (offsets, cut, edges).  Tap t of position j reads index j + offsets[t]; ``cut``: the flat positions
    [cut[0], M - cut[1]) whose every tap lies inside the flattened array; ``edges``: (j, in-range indices) for each
    position whose window leaves [0, L) (it still holds an input tap, ``_flat_ok``)."""
    offs = tuple(t * d - p for t in range(k))
    edges = tuple((j, tuple(j + o for o in offs if 0 <= j + o < L)) for j in range(lo)
                  if j + offs[0] < 0 or j + offs[-1] >= L)
    return offs, (max(0, -offs[0]), max(0, offs[-1])), edges


def _axis_pass(src, plan, op, out):
    """Pool axis 1 of src (R, L, B) into ``out`` (R, L, B), both C-contiguous, following ``plan`` (``_pass_plan``):
    positions j < lo get op over the in-range taps src[:, j + t*d - p]; the others are left undefined.

    Every tap is a shifted view of the flattened array, so each numpy call is one contiguous loop over the whole
    block, where strided views of the planes make numpy loop (and buffer) row by row.  Rows run on into the next
    row in the flat views, so the positions whose window leaves [0, L) are rewritten afterwards."""
    offs, cut, edges = plan
    B = src.shape[2]
    M = out.size // B
    flat = src.reshape(M, B)
    a, b = cut[0], M - cut[1]  # (a < b: the window spans less than a row, ``_flat_ok``)
    _combine([flat[a + o:b + o] for o in offs], out.reshape(M, B)[a:b], op)
    for j, idx in edges:
        if len(idx) == 1:
            _copy_rows(out[:, j], src[:, idx[0]])
        else:
            _combine([src[:, c] for c in idx], out[:, j], op)
    return out


def _combine(views, out, op):
    """out = op over views (one or more)."""
    if len(views) == 1:
        np.copyto(out, views[0])
    else:
        op(views[0], views[1], out=out)
        for v in views[2:]:
            op(out, v, out=out)


@functools.cache
def _row_dtype(nbytes):
    """An opaque element of ``nbytes`` bytes (one row for ``_copy_rows``)."""
    return np.dtype((np.void, nbytes))


def _copy_rows(dst, src):
    """dst[...] = src for arrays whose last axis is contiguous, each row copied as one opaque element: numpy's copy
    loop otherwise runs once per row, which costs ~2x on rows of a few elements."""
    row = _row_dtype(dst.shape[-1] * dst.itemsize)
    np.copyto(dst.view(row), src.view(row))


def _flat_block(shape, dtype):
    """Channels per block of ``_pool2d_s1``."""
    return min(shape[0] * shape[1], max(1, _FLAT_BLOCK_BYTES // max(1, shape[2] * shape[3] * dtype.itemsize)))


def _pool2d_s1(x, ks, dl, pb, out, op, div=None):
    """Stride-1 2-D max or sum pooling (``op`` np.maximum or np.add), then divided by ``div`` (None, a number or
    ``_avg_divisor``'s counts), as two ``_axis_pass`` passes (along W, then along H) over channel blocks; for
    'same' pooling the second pass writes the result, otherwise the first Ho x Wo of each plane are copied out."""
    N, C, H, W = x.shape
    (kh, kw), (dh, dw), (ph, pw), (Ho, Wo) = ks, dl, pb, out
    R = N * C
    x3 = np.ascontiguousarray(x).reshape(R, H, W)
    res = np.empty((R, Ho, Wo), dtype=x.dtype)
    n_blk = _flat_block(x.shape, x.dtype)
    plan_w, plan_h = _pass_plan(kw, dw, pw, W, Wo), _pass_plan(kh, dh, ph, H, Ho)
    same = Ho == H and Wo == W
    mid = np.empty(n_blk * H * W, dtype=x.dtype)
    last = None if same else np.empty(n_blk * H * W, dtype=x.dtype)
    for r0 in range(0, R, n_blk):
        xb, rb = x3[r0:r0 + n_blk], res[r0:r0 + n_blk]
        n = xb.shape[0]
        a = _axis_pass(xb.reshape(n * H, W, 1), plan_w, op, mid[:n * H * W].reshape(n * H, W, 1))
        v = _axis_pass(a.reshape(n, H, W), plan_h, op, rb if same else last[:n * H * W].reshape(n, H, W))
        if not same:
            _copy_rows(rb, v[:, :Ho, :Wo])
        if div is not None:
            np.divide(rb, div if np.ndim(div) == 0 else div[:rb.size].reshape(rb.shape), out=rb)
    return res.reshape(N, C, Ho, Wo)


@functools.lru_cache(maxsize=32)
def _avg_divisor(in_shape, ks, st, dl, pb, pe, out, include_pad, dtype, n_blk):
    """AveragePool's divisor for ``_pool2d_s1``: the window count when all are equal, else the counts repeated over
    a block of n_blk channels (flat, so the division is one contiguous loop)."""
    cnt = _counts(in_shape, ks, st, dl, pb, pe, out, include_pad, np.dtype(dtype)).reshape(-1)
    if (cnt == cnt[0]).all():
        return cnt[0]
    tiled = np.tile(cnt, n_blk)
    tiled.flags.writeable = False
    return tiled


def _float_input(X, op):
    if X.dtype.kind != "f" and str(X.dtype) != "bfloat16":
        raise TypeError(f"{op}: input must be a float tensor, got {X.dtype}")
    return X.astype(compute_dtype(X.dtype), copy=False)


@kernel("AveragePool", since=(1, 7, 10, 11, 19, 22))
def average_pool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape=None,
                 pads=None, strides=None):
    op = "AveragePool"
    ks, st, dl, pb, pe, out = _pool_geometry(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, op)
    x = _float_input(X, op)
    if X.size == 0 or prod(out) == 0:
        return np.zeros(X.shape[:2] + tuple(out), dtype=X.dtype)
    if _whole_plane(X.shape[2:], ks, dl, pb, pe, out):  # (ShuffleNet's final 7x7 pooling): GlobalAveragePool
        return global_average_pool(X)
    res = _pool2d_native(x, ks, st, dl, pb, out, 1, pe, count_include_pad)
    if res is not None:
        return res.astype(X.dtype, copy=False)
    small = _gemm_sized(X.shape, ks, _AVG_GEMM_S1_RATIO)
    if _FLAT_POOL and max(ks) <= 3 and not small and _flat_ok(X.shape[2:], ks, st, dl, pb, pe, out):  # (larger: GEMMs)
        div = _avg_divisor(tuple(X.shape[2:]), tuple(ks), tuple(st), tuple(dl), tuple(pb), tuple(pe), tuple(out),
                           bool(count_include_pad), x.dtype.str, _flat_block(x.shape, x.dtype))
        # (edge positions combine neighbouring rows before they are rewritten; undefined positions are read too)
        with np.errstate(invalid="ignore", over="ignore"):
            return _pool2d_s1(x, ks, dl, pb, out, np.add, div).astype(X.dtype, copy=False)
    if _gemm_sized(X.shape, ks, _AVG_GEMM_RATIO) and prod(out) > 0:
        res = _avg_pool2d_gemm(x, ks, st, dl, pb, pe, out, bool(count_include_pad))
        if res is not None:
            return res.astype(X.dtype, copy=False)
    if sum(ks) <= _LOOP_LIMIT:
        s = _reduce_unpadded(x, ks, st, dl, pb, out, "sum", 0)
    else:
        s = _reduce_windows(_padded(x, ks, st, dl, pb, pe, out, 0), ks, st, dl, out, "sum")
    cnt = _counts(X.shape[2:], ks, st, dl, pb, pe, out, bool(count_include_pad), x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        s /= cnt
    return s.astype(X.dtype, copy=False)


def _whole_plane(in_shape, ks, dl, pb, pe, out) -> bool:
    """The one window covers the whole unpadded input: the pooling is its global counterpart."""
    return (all(o == 1 for o in out) and tuple(ks) == tuple(in_shape) and all(d == 1 for d in dl)
            and not any(pb) and not any(pe))


@kernel("LpPool", since=(1, 2, 11, 18, 22))
def lp_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None, strides=None):
    op = "LpPool"
    ks, st, dl, pb, pe, out = _pool_geometry(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, op)
    x = _float_input(X, op)
    if X.size == 0 or prod(out) == 0:
        return np.zeros(X.shape[:2] + tuple(out), dtype=X.dtype)
    p = float(p)
    xa = np.abs(x)
    xa = xa * xa if p == 2 else np.power(xa, p)
    xp = _padded(xa, ks, st, dl, pb, pe, out, 0)
    s = _reduce_windows(xp, ks, st, dl, out, "sum")
    s = np.sqrt(s) if p == 2 else np.power(s, 1.0 / p)
    return s.astype(X.dtype, copy=False)


def _global(X, op, fn):
    check_rank(X, op, "X")
    axes = tuple(range(2, X.ndim))
    return fn(axes)


@kernel("GlobalAveragePool", since=(1, 22))
def global_average_pool(X):
    x = _float_input(X, "GlobalAveragePool")
    check_rank(X, "GlobalAveragePool", "X")
    S = prod(x.shape[2:])
    if S == 0 or not x.flags.c_contiguous:
        return _global(x, "GlobalAveragePool", lambda ax: x.mean(axis=ax, keepdims=True)).astype(X.dtype, copy=False)
    # a sum over each contiguous plane as one matrix-vector product with ones (BLAS runs it 3-5x faster than
    # numpy's row reduction at every plane size measured, 49 to 409600, with float32 errors of 1-4e-7 relative;
    # planes beyond ones_vector's size numpy's reduction), then one division (mean's steps without its
    # Python-level overhead)
    xr = x.reshape(x.shape[0] * x.shape[1], S)
    ones = ones_vector(S, x.dtype)
    s = np.matmul(xr, ones) if ones is not None else np.add.reduce(xr, axis=1)
    np.divide(s, S, out=s)
    return s.reshape(x.shape[:2] + (1,) * (x.ndim - 2)).astype(X.dtype, copy=False)


@kernel("GlobalMaxPool", since=(1, 22))
def global_max_pool(X):
    check_rank(X, "GlobalMaxPool", "X")
    if prod(X.shape[2:]) == 0:
        raise ValueError("GlobalMaxPool: empty spatial dimensions")
    return X.max(axis=tuple(range(2, X.ndim)), keepdims=True)


@kernel("GlobalLpPool", since=(1, 2, 22))
def global_lp_pool(X, *, p=2):
    x = _float_input(X, "GlobalLpPool")
    check_rank(X, "GlobalLpPool", "X")
    p = float(p)
    s = np.power(np.abs(x), p).sum(axis=tuple(range(2, X.ndim)), keepdims=True)
    return np.power(s, 1.0 / p).astype(X.dtype, copy=False)


def _unpool_indices_fit(I, shape, ks, st, pb):
    """True when every flat index in ``I``, decoded against the full tensor ``shape``, lies in the pooling window
    of its own position (same batch and channel, spatial coordinate inside the window) -- which every index
    produced by MaxPool does."""
    coords = np.unravel_index(I.reshape(-1), shape)
    grid = np.indices(I.shape).reshape(I.ndim, -1)
    if not (np.array_equal(coords[0], grid[0]) and np.array_equal(coords[1], grid[1])):
        return False
    for d in range(2, I.ndim):
        start = grid[d] * st[d - 2] - pb[d - 2]
        off = coords[d] - start
        if off.size and (off.min() < 0 or off.max() >= ks[d - 2]):
            return False
    return True


@kernel("MaxUnpool", since=(9, 11, 22))
def max_unpool(X, I, output_shape=None, *, kernel_shape=None, pads=None, strides=None):
    """Scatter X into zeros at the flat indices I (MaxPool's second output, flattened over the whole tensor).

    With output_shape larger than the shape MaxPool's geometry implies, the indices are read against
    output_shape, as onnxruntime and PyTorch do -- unless they only make sense against the implied shape
    (an index outside its own pooling window when read against output_shape but inside it when read against
    the implied shape), in which case they are decoded there and the result sits in the leading corner of
    output_shape, as in the ONNX specification's example.
    """
    op = "MaxUnpool"
    check_rank(X, op, "X")
    n = X.ndim - 2
    if kernel_shape is None or len(kernel_shape) == 0:
        raise ValueError(f"{op}: attribute kernel_shape is required")
    ks = spatial_attr(kernel_shape, n, 1, op, "kernel_shape")
    st = spatial_attr(strides, n, 1, op, "strides")
    pb, pe = explicit_pads(pads, n, op)
    I = np.asarray(I)
    if I.shape != X.shape:
        raise ValueError(f"{op}: indices shape {I.shape} differs from X shape {X.shape}")
    implied = list(X.shape[:2]) + [(i - 1) * s + k - b - e for i, s, k, b, e in zip(X.shape[2:], st, ks, pb, pe)]
    shape = implied
    if output_shape is not None and np.asarray(output_shape).size > 0:
        shape = [int(v) for v in np.asarray(output_shape).reshape(-1)]
        if len(shape) != X.ndim:
            raise ValueError(f"{op}: output_shape {shape} must have rank {X.ndim}")
    check_alloc(shape, X.dtype, f"{op} output")
    total = prod(shape)
    idx = I.reshape(-1).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= total):
        raise ValueError(f"{op}: index out of range for output shape {shape}")
    out = np.zeros(shape, dtype=X.dtype)
    if (shape != implied and idx.size and shape[:2] == implied[:2] and min(implied) > 0
            and all(a >= b for a, b in zip(shape[2:], implied[2:])) and idx.max() < prod(implied)
            and not _unpool_indices_fit(idx.reshape(I.shape), shape, ks, st, pb)
            and _unpool_indices_fit(idx.reshape(I.shape), implied, ks, st, pb)):
        corner = np.zeros(implied, dtype=X.dtype)
        corner.reshape(-1)[idx] = X.reshape(-1)
        out[tuple(slice(0, d) for d in implied)] = corner
        return out
    out.reshape(-1)[idx] = X.reshape(-1)
    return out
