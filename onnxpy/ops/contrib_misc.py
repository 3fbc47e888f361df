"""Utility contrib ops (domain ``com.microsoft``) from older exporters, matching onnxruntime's CPU kernels.

Range, Trilu, ExpandDims, Inverse, CDist, Unique (3 outputs, first-occurrence order), GridSample (opset-1 contrib
semantics), CropAndResize (TF style, corner aligned), MaxpoolWithMask, NhwcMaxPool, Rfft/Irfft and
SparseToDenseMatMul (sparse ``A`` arrives dense: the loader densifies sparse initializers).
Text/hash ops (MurmurHash3, Tokenizer, WordConvEmbedding) live in ``contrib_text``.
"""

from __future__ import annotations

import numpy as np

from ._common import text
from ._shape_util import scalar_int
from .image import _grid_sample
from .pool import _pool_geometry, max_pool
from .registry import MS_DOMAIN, kernel
from .shape import _range, unique
from .tensor import trilu




def _check_float(x, op, name="X", kinds=(np.float16, np.float32, np.float64)):
    if x.dtype not in [np.dtype(k) for k in kinds]:
        raise TypeError(f"{op}: unsupported type {x.dtype} for input {name}")


# ----------------------------------------------------------------------------------------------- Range / Trilu


@kernel("Range", since=1, domain=MS_DOMAIN)
def ms_range(start, limit, delta=None):
    start = np.asarray(start)
    if delta is None:
        delta = np.ones((), dtype=start.dtype)
    if np.asarray(limit).dtype != start.dtype or np.asarray(delta).dtype != start.dtype:
        raise TypeError("Range: start, limit and delta must have the same type")
    return _range(start, limit, delta)


@kernel("Trilu", since=1, domain=MS_DOMAIN)
def ms_trilu(X, k=None, *, upper=1):
    return trilu(X, k, upper=upper)


# ----------------------------------------------------------------------------------------------- ExpandDims


@kernel("ExpandDims", since=1, domain=MS_DOMAIN)
def expand_dims(X, axis):
    a = scalar_int(axis, "ExpandDims: axis")
    r = X.ndim
    if a < -r - 1 or a > r:
        raise ValueError(f"ExpandDims: axis {a} out of range [{-r - 1}, {r}] for input of rank {r}")
    if a < 0:
        a += r + 1
    return np.expand_dims(X, a)


# ----------------------------------------------------------------------------------------------- Inverse


@kernel("Inverse", since=1, domain=MS_DOMAIN)
def inverse(X):
    op = "Inverse"
    _check_float(X, op)
    if X.ndim < 2 or X.shape[-1] != X.shape[-2]:
        raise ValueError(f"{op}: input must be a batch of square matrices, got shape {list(X.shape)}")
    if X.size == 0:
        return X.copy()
    work = np.float64 if X.dtype == np.float64 else np.float32
    try:
        y = np.linalg.inv(X.astype(work, copy=False))
    except np.linalg.LinAlgError as e:
        raise ValueError(f"{op}: a matrix in the batch is not invertible ({e})") from None
    return y.astype(X.dtype, copy=False)


# ----------------------------------------------------------------------------------------------- CDist


@kernel("CDist", since=1, domain=MS_DOMAIN)
def cdist(A, B, *, metric="sqeuclidean"):
    op = "CDist"
    metric = text(metric)
    _check_float(A, op, "A", (np.float32, np.float64))
    if B.dtype != A.dtype:
        raise TypeError(f"{op}: A ({A.dtype}) and B ({B.dtype}) must have the same type")
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1]:
        raise ValueError(f"{op}: A (M, N) and B (K, N) must be 2-D with the same N, got {A.shape} and {B.shape}")
    a = A.astype(np.float64)
    b = B.astype(np.float64)
    if metric in ("sqeuclidean", "euclidean"):
        d = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
        np.maximum(d, 0.0, out=d)
        if metric == "euclidean":
            np.sqrt(d, out=d)
        return d.astype(A.dtype)
    from scipy.spatial.distance import cdist as _scipy_cdist

    try:
        return _scipy_cdist(a, b, metric=metric).astype(A.dtype)
    except ValueError as e:
        raise ValueError(f"{op}: unsupported metric {metric!r} ({e})") from None


# ----------------------------------------------------------------------------------------------- Unique


@kernel("Unique", since=1, domain=MS_DOMAIN)
def ms_unique(x):
    if x.ndim != 1:
        raise ValueError(f"Unique: input must be 1-D, got shape {list(x.shape)}")
    y, _first, inv, counts = unique(x, sorted=0)
    return y, inv, counts


# ----------------------------------------------------------------------------------------------- GridSample


@kernel("GridSample", since=1, domain=MS_DOMAIN)
def ms_grid_sample(X, Grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    op = "GridSample"
    if X.ndim != 4:
        raise ValueError(f"{op}: only 4-D input is supported, got shape {list(X.shape)}")
    if Grid.ndim != 4 or Grid.shape[-1] != 2:
        raise ValueError(f"{op}: Grid must have shape (N, H_out, W_out, 2), got {list(Grid.shape)}")
    if text(mode) not in ("bilinear", "nearest", "bicubic"):
        raise ValueError(f"{op}: unsupported mode {text(mode)!r}")
    return _grid_sample(X, Grid, text(mode), text(padding_mode), int(align_corners), op)


# ----------------------------------------------------------------------------------------------- CropAndResize


def _crop_coords(lo, hi, size, crop):
    """Sample coordinates (R, crop) of the TF crop-and-resize rule in the box dtype."""
    one = lo.dtype.type(1)
    last = lo.dtype.type(size - 1)
    if crop > 1:
        scale = (hi - lo) * last / lo.dtype.type(crop - 1)
        pos = np.arange(crop, dtype=lo.dtype)
        return lo[:, None] * last + pos[None, :] * scale[:, None]
    return np.broadcast_to((lo.dtype.type(0.5) * (lo + hi) * last)[:, None] * one, (lo.shape[0], crop))


@kernel("CropAndResize", since=1, domain=MS_DOMAIN)
def crop_and_resize(X, rois, batch_indices, crop_size, *, extrapolation_value=0.0, mode="bilinear"):
    op = "CropAndResize"
    mode = text(mode)
    if mode not in ("bilinear", "nearest"):
        raise ValueError(f"{op}: mode must be 'bilinear' or 'nearest', got {mode!r}")
    _check_float(X, op)
    if X.ndim != 4:
        raise ValueError(f"{op}: X must be 4-D (N, C, H, W), got shape {list(X.shape)}")
    if rois.ndim != 2 or rois.shape[1] != 4:
        raise ValueError(f"{op}: rois must have shape (num_rois, 4), got {list(rois.shape)}")
    bi = np.asarray(batch_indices).reshape(-1).astype(np.int64)
    if bi.shape[0] != rois.shape[0]:
        raise ValueError(f"{op}: batch_indices has {bi.shape[0]} entries for {rois.shape[0]} rois")
    cs = np.asarray(crop_size).reshape(-1)
    if cs.size != 2 or (cs <= 0).any():
        raise ValueError(f"{op}: crop_size must hold two positive values, got {cs.tolist()}")
    ch, cw = int(cs[0]), int(cs[1])
    N, C, H, W = X.shape
    if bi.size and (bi.min() < 0 or bi.max() >= N):
        raise ValueError(f"{op}: batch index out of range [0, {N})")
    R = rois.shape[0]
    work = np.float64 if X.dtype == np.float64 else np.float32
    r = rois.astype(work, copy=False)
    iy = _crop_coords(r[:, 0], r[:, 2], H, ch)  # (R, ch)
    ix = _crop_coords(r[:, 1], r[:, 3], W, cw)  # (R, cw)
    vy = (iy >= 0) & (iy <= H - 1)
    vx = (ix >= 0) & (ix <= W - 1)
    if R == 0 or C == 0:
        return np.zeros((R, C, ch, cw), dtype=X.dtype)
    xw = X.astype(work, copy=False)
    b = bi[:, None, None]

    def take(yi, xi):  # (R, ch), (R, cw) int -> (R, ch, cw, C)
        return xw[b, :, yi[:, :, None], xi[:, None, :]]

    if mode == "nearest":
        yi = np.clip(np.floor(iy + 0.5), 0, H - 1).astype(np.int64)
        xi = np.clip(np.floor(ix + 0.5), 0, W - 1).astype(np.int64)
        out = take(yi, xi)
    else:
        cy = np.clip(iy, 0, H - 1)
        cx = np.clip(ix, 0, W - 1)
        t = np.floor(cy).astype(np.int64)
        bo = np.ceil(cy).astype(np.int64)
        le = np.floor(cx).astype(np.int64)
        ri = np.ceil(cx).astype(np.int64)
        ly = (cy - t)[:, :, None, None].astype(work)
        lx = (cx - le)[:, None, :, None].astype(work)
        tl, tr, bl, br = take(t, le), take(t, ri), take(bo, le), take(bo, ri)
        top = tl + (tr - tl) * lx
        bot = bl + (br - bl) * lx
        out = top + (bot - top) * ly
    valid = (vy[:, :, None] & vx[:, None, :])[..., None]
    out = np.where(valid, out, work(extrapolation_value))
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2)).astype(X.dtype, copy=False)


# ----------------------------------------------------------------------------------------------- MaxpoolWithMask


@kernel("MaxpoolWithMask", since=1, domain=MS_DOMAIN)
def maxpool_with_mask(X, M, *, auto_pad="NOTSET", kernel_shape=None, pads=None, storage_order=0, strides=None):
    """MaxPool where mask==0 positions end the current kernel row (onnxruntime's internal TP3 kernel).

    onnxruntime walks each window row by row and stops a row at the first masked position; every plane reads
    the mask's first spatial plane, and 2-D/3-D pooling never tests flat position 0.  An all-masked window yields
    the lowest finite float.  (onnxruntime's threaded 1-D loop sometimes offsets the mask by the plane number;
    that depends on its thread partitioning and is not reproduced.)
    """
    op = "MaxpoolWithMask"
    if X.dtype != np.float32:
        raise TypeError(f"{op}: X must be float32, got {X.dtype}")
    M = np.asarray(M)
    if M.ndim != X.ndim:
        raise ValueError(f"{op}: mask and input must have the same rank, got {M.ndim} and {X.ndim}")
    if M.shape[2:] != X.shape[2:]:
        raise ValueError(f"{op}: mask spatial shape {list(M.shape[2:])} differs from input {list(X.shape[2:])}")
    ks, st, dl, pb, pe, out = _pool_geometry(X, kernel_shape, strides, None, pads, auto_pad, 0, op)
    n = len(ks)
    sp = X.shape[2:]
    plane = int(np.prod(sp))
    N, C = X.shape[:2]
    lowest = np.finfo(np.float32).min
    if X.size == 0 or int(np.prod(out)) == 0:
        return np.zeros((N, C, *out), dtype=X.dtype)
    mflat = M.reshape(-1)
    # per-axis input coordinate of each (output position, tap): (o_a, k_a)
    coords = [np.arange(o)[:, None] * s - b + np.arange(k)[None, :] for o, s, b, k in zip(out, st, pb, ks)]
    inside = [(c >= 0) & (c < size) for c, size in zip(coords, sp)]
    clipped = [np.clip(c, 0, size - 1) for c, size in zip(coords, sp)]
    # full index grids of shape (*out, *ks): output axes first, then taps
    grids = []
    valid = np.ones((), dtype=bool)
    for a in range(n):
        shape = [1] * (2 * n)
        shape[a], shape[n + a] = out[a], ks[a]
        grids.append(clipped[a].reshape(shape))
        valid = valid & inside[a].reshape(shape)
    m0 = (mflat[:plane] == 0).reshape(sp) if mflat.size >= plane else np.zeros(sp, dtype=bool)
    if n >= 2:
        m0 = m0.copy()
        m0.reshape(-1)[0] = False  # the 2-D/3-D loops skip the mask test at flat position 0
    masked = m0[tuple(grids)] & valid
    # a masked tap stops the rest of its innermost-axis row (taps along the last kernel axis)
    stopped = np.logical_or.accumulate(masked, axis=-1)
    take = valid & ~stopped
    full = tuple(out) + tuple(ks)
    vals = X[(slice(None), slice(None)) + tuple(np.broadcast_to(g, full) for g in grids)]  # (N, C, *out, *ks)
    vals = np.where(take, vals, lowest)
    return vals.max(axis=tuple(range(2 + n, 2 + 2 * n))).astype(np.float32)


# ----------------------------------------------------------------------------------------------- NhwcMaxPool


@kernel("NhwcMaxPool", since=1, domain=MS_DOMAIN)
def nhwc_max_pool(x, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None, strides=None):
    op = "NhwcMaxPool"
    if x.dtype not in (np.int8, np.uint8):
        raise TypeError(f"{op}: input must be int8 or uint8, got {x.dtype}")
    if x.ndim < 3:
        raise ValueError(f"{op}: input must have rank >= 3 (N, *spatial, C), got shape {list(x.shape)}")
    perm = (0, x.ndim - 1) + tuple(range(1, x.ndim - 1))
    y = max_pool(np.ascontiguousarray(x.transpose(perm)), auto_pad=auto_pad, ceil_mode=ceil_mode,
                 dilations=dilations, kernel_shape=kernel_shape, pads=pads, strides=strides)
    back = (0,) + tuple(range(2, x.ndim)) + (1,)
    return np.ascontiguousarray(y.transpose(back))


# ----------------------------------------------------------------------------------------------- Rfft / Irfft


def _fft_work(X, op):
    _check_float(X, op)
    return np.float64 if X.dtype == np.float64 else np.float32


@kernel("Rfft", since=1, domain=MS_DOMAIN)
def rfft(X, *, normalized=0, onesided=1, signal_ndim=1):
    """One-sided FFT over the last ``signal_ndim`` axes; output (..., n//2+1, 2) holds (real, imag)."""
    op = "Rfft"
    work = _fft_work(X, op)
    nd = int(signal_ndim)
    if nd < 1 or nd > X.ndim:
        raise ValueError(f"{op}: signal_ndim {nd} must be in [1, {X.ndim}]")
    if not int(onesided):
        raise ValueError(f"{op}: only onesided=1 is supported")
    axes = tuple(range(X.ndim - nd, X.ndim))
    y = np.fft.rfftn(X.astype(work, copy=False), axes=axes, norm="ortho" if int(normalized) else "backward")
    return np.stack([y.real, y.imag], axis=-1).astype(X.dtype)


@kernel("Irfft", since=1, domain=MS_DOMAIN)
def irfft(X, *, normalized=0, onesided=1, signal_ndim=None):
    """Inverse of Rfft: input (..., n//2+1, 2) -> real output with n = 2*(m-1) on the last signal axis."""
    op = "Irfft"
    work = _fft_work(X, op)
    if signal_ndim is None:
        raise ValueError(f"{op}: attribute signal_ndim is required")
    nd = int(signal_ndim)
    if X.ndim < nd + 1 or X.shape[-1] != 2:
        raise ValueError(f"{op}: input must have shape (..., signal dims, 2), got {list(X.shape)}")
    if nd < 1:
        raise ValueError(f"{op}: signal_ndim must be positive, got {nd}")
    if not int(onesided):
        raise ValueError(f"{op}: only onesided=1 is supported")
    xc = X[..., 0].astype(work) + 1j * X[..., 1].astype(work)
    r = xc.ndim
    axes = tuple(range(r - nd, r))
    m = xc.shape[-1]
    if m < 1:
        raise ValueError(f"{op}: empty signal axis")
    s = list(xc.shape[r - nd:-1]) + [2 * (m - 1)]
    y = np.fft.irfftn(xc, s=s, axes=axes, norm="ortho" if int(normalized) else "backward")
    return y.astype(X.dtype)


# ----------------------------------------------------------------------------------------------- SparseToDenseMatMul


@kernel("SparseToDenseMatMul", since=1, domain=MS_DOMAIN)
def sparse_to_dense_matmul(A, B, *, alpha=1.0, transA=0, transB=0):
    """alpha * op(A) @ op(B) with A a 2-D sparse matrix (densified by the loader / session).

    As in onnxruntime, alpha is applied for float32 only (its double and integer kernels ignore it)."""
    op = "SparseToDenseMatMul"
    A = np.asarray(A)
    if A.ndim != 2:
        raise ValueError(f"{op}: A must be a 2-D matrix, got shape {list(A.shape)}")
    if B.ndim != 2:
        raise ValueError(f"{op}: B must be a 2-D matrix, got shape {list(B.shape)}")
    if A.dtype != B.dtype:
        raise TypeError(f"{op}: A ({A.dtype}) and B ({B.dtype}) must have the same element type")
    a = A.T if transA else A
    b = B.T if transB else B
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{op}: inner dimensions differ: op(A) {list(a.shape)}, op(B) {list(b.shape)}")
    # onnxruntime scales by alpha in its float32 kernel only; the double and integer kernels ignore alpha
    if B.dtype == np.float32:
        y = a @ b
        if float(alpha) != 1.0:
            y = y * np.float32(alpha)
        return y.astype(B.dtype, copy=False)
    if B.dtype.kind == "f":
        return (a @ b).astype(B.dtype, copy=False)
    wide = np.int64 if B.dtype.kind == "i" else np.uint64
    return (a.astype(wide) @ b.astype(wide)).astype(B.dtype)
