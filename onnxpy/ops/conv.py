"""Convolutions: Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv, Col2Im."""

from __future__ import annotations

import functools

import numpy as np

from ..limits import check_alloc
from ._common import F32 as _F32, text
from ._common import F64 as _F64
from ._shape_util import NOT_CONST, frozen
from ._wcache import derived as _derived
from ._spatial import (
    check_rank,
    compute_dtype,
    conv_out_shape,
    conv_pads,
    explicit_pads,
    pad_array,
    prod,
    spatial_attr,
    strided_view,
    windows,
)
from . import _blas, _native
from . import _conv_packed
from . import _packed
from .linalg import _dot2
from .registry import kernel
from .winograd import winograd_conv2d

# Largest im2col buffer (elements) built at once; bigger batches are processed in chunks.
_COLS_LIMIT = 1 << 24
# Channel block of the depthwise path (bytes of accumulator per block).
_DW_BLOCK_BYTES = 1 << 19
# Depthwise convolutions with at least this many channels run channels-last (elements per row block).
_DW_NHWC_MIN_C = 96
_DW_NHWC_BLOCK = 1 << 16
# Bytes of GEMM products per channel block of the banded depthwise path.
_DW_BAND_BLOCK = 1 << 20
# The banded depthwise GEMMs run about 8-12x more multiply-adds per second than numpy's multiply-add passes: they
# are used while the band's rows hold at most this many entries per kernel row (zeros included).
_DW_BAND_WASTE = 8
# Largest per-channel product buffer of the banded path (bytes).
_DW_BAND_MAX_BYTES = 1 << 26
# Residuals (ai.onnxpy.ConvAdd) with fewer elements are added after the convolution instead of receiving its GEMMs
# (BLAS beta = 1): below ~100K outputs the direct BLAS calls cost more than the add pass they save (measured:
# 802816 outputs 0.54x, 200704 0.82x, 100352 0.98x, 46080 1.11x), and grouped ones always (one call per group).
_ACC_MIN = 1 << 17
# Strided convolutions with at least this many kernel taps build their columns from a stride-phase split.
_POLY_MIN_TAPS = 16
# Stride-1 depthwise convolutions with output planes up to this size run channels-last (measured: 544x7x7 1.8x the
# banded GEMMs; at 14x14 the bands win).
_DW_TINY_PLANE = 64
# Depthwise convolutions (one filter per channel) with output planes up to this size and at least as many channels
# as output positions (half as many when strided) run as one channels-last sum of products (``_depthwise2d_sop``):
# its inner loop runs over the channels, so it wins where the planes are small and the channels many (measured:
# 544x7x7 0.45x the channels-last passes, 272x14x14 0.82x and 480x14x14 0.76x the banded GEMMs, 544x14x14/2 0.39x,
# 96x28x28/2 0.77x; 128x14x14 1.25x, 256x16x16 1.21x, 384x20x20 (5x5) 1.18x, 136x28x28 1.28x)
_DW_SOP_MAX_PLANE = 196
# test hook: stride-1 sum-of-products over merged (column, channel) rows (else per output position)
_DW_SOP_WIDE = True
# Depthwise convolutions whose per-channel output (with each row's spare columns) has at least this many elements run
# one BLAS saxpy per channel and tap (``_depthwise2d_axpy``); test hook ``_DW_AXPY``.
_DW_AXPY = True
_DW_AXPY_MIN = 12288
_DW_AXPY_BLOCK_BYTES = 1 << 19
# Winograd F(2x2,3x3) for 3x3 stride-1 float32 convs with at least this many input and output channels on 196 to
# 1024 output positions (14x14 to 32x32).  Measured per layer inside the models, interleaved with the GEMM paths,
# on the 2026-12-04 machine (AVX-512 EPYC): VGG-19's 512->512 at 28x28 0.55x, at 14x14 0.58x, 256->512 at 28x28
# 0.71x, ResNet-50's 256->256 at 14x14 0.89x; Inception v2's 192-channel 14x14 layers even (0.92x alone).  Larger
# planes lose inside a model (VGG-19's 256->256 at 56x56 1.2x, 0.87x alone: the transformed tiles no longer stay
# in cache), as do 7x7 outputs (512->512 1.18x alone) and narrower layers (128 channels 1.0-1.7x) -- the transforms
# are numpy passes on one core.  VGG-19 0.86x with the rule, 0.935x against the rule without its upper bound.
# (An earlier machine measured the 14x14 layers even and kept to >= 256 -> 512 channels on >= 28x28.)
_WINOGRAD = True
_WINOGRAD_MIN_C = 192
_WINOGRAD_MIN_M = 192
_WINOGRAD_MIN_P = 196
_WINOGRAD_MAX_P = 1024  # (32x32; 56x56 measured slower)
# Larger planes with 128+ channels and filters run Winograd with its tile rows split between two threads
# (``winograd_conv2d(threads=...)``: each thread's transforms and products on its own core, OpenBLAS held to one
# thread), which beats the packed-filter path there: VGG-19's 128 -> 128 at 112x112 0.87x, 128 -> 256 at 56x56
# 0.83x, 256 -> 256 at 56x56 0.78x alone; 64 channels (1.02-1.05x) and the planes below stay as they were (the
# 28x28 Winograd layers 1.0-1.03x, 14x14 ones 1.07-1.2x, 13x13 and below 1.3-2x).  VGG-19 0.91x in-process.
_WINOGRAD_WIDE = True
_WINOGRAD_WIDE_MIN_C = 128
_WINOGRAD_WIDE_MIN_P = 2500
# Elements of one im2col block of the 2-D GEMM path (4 MiB of float32).
_GEMM_COLS_BLOCK = 1 << 20
# Stride-1 convolutions (group 1, at most 9 taps) take the packed-filter path (``_conv_packed``) with at least this
# many input channels, filters and output positions, and channels x positions (measured on the corpus's layer shapes,
# in-process: 0.69-0.96x the direct / im2col / Winograd paths' time from 14x14 planes with 96+ channels up to 224x224
# with 64; 1.03-1.9x on 7x7 and 6x6 planes, with 32 or fewer filters (DenseNet's growth, PP-OCR's neck), 16-48 input
# channels (SqueezeNet's expand) or 5x5 filters on few channels; 14x14 with 64 channels 1.24x), except where
# Winograd takes the layer on planes larger than ``_PACKED_MAX_WINOGRAD_P`` (28x28 with 256-512 channels: Winograd
# 0.73-0.81x the packed path's time; at 14x14 the packed path 0.70-0.83x Winograd's, 1.04x with 512 channels).
_PACKED_MAX_TAPS = 9
_PACKED_MIN_C = 64
_PACKED_MIN_M = 64
_PACKED_MIN_P = 196
_PACKED_MIN_CP = 16384
_PACKED_MAX_WINOGRAD_P = 400
# Stride 2 (the image split into its stride phases, each tap a window of one): with 128+ channels and filters and
# channels x positions from 8192 (ResNet-50's 128-512 channel layers 0.86-0.87x, 256 channels onto 7x7 0.48x,
# 128 -> 160 onto 14x14 1.02x); 96 channels 1.05x, 128 -> 192 onto 7x7 1.48x.
_PACKED_STRIDED_MIN_C = 128
_PACKED_STRIDED_MIN_CP = 8192
# Per-tap BLAS convolution (``_conv2d_direct``) for float32 layers with at least this many input channels and
# output positions per input channel (below that the per-tap packing of the filter dominates).
_DIRECT = True
_DIRECT_MIN_C = 64
_DIRECT_MIN_RATIO = 4
_DIRECT_BLOCK_BYTES = 1 << 20
# Largest buffer of tap products ``_conv2d_stacked`` may use (KH*KW*M*(Hp+1)*Wp elements)
_STACKED_MAX_BYTES = 64 << 20
def _conv_core(x: np.ndarray, w: np.ndarray, pb, pe, strides, dilations, group: int, op: str) -> np.ndarray:
    """N-D grouped convolution of x (N, C, *S) with w (M, C/group, *K); x and w share a float compute dtype."""
    N, C = x.shape[:2]
    in_shape = x.shape[2:]
    M, Cg = w.shape[:2]
    kshape = w.shape[2:]
    n = len(in_shape)
    if len(kshape) != n:
        raise ValueError(f"{op}: weight rank {w.ndim} does not match input rank {x.ndim}")
    if group < 1 or C != Cg * group:
        raise ValueError(f"{op}: input channels ({C}) must equal weight channels ({Cg}) x group ({group})")
    if M % group:
        raise ValueError(f"{op}: output channels ({M}) not divisible by group ({group})")
    Mg = M // group
    out_shape = conv_out_shape(in_shape, kshape, strides, dilations, pb, pe, op)
    P = prod(out_shape)
    K = prod(kshape)
    dt = x.dtype
    if N == 0 or P == 0 or M == 0:
        return np.zeros((N, M, *out_shape), dtype=dt)
    if Cg == 0 or K == 0:
        return np.zeros((N, M, *out_shape), dtype=dt)

    # 1x1 kernel without padding: one GEMM.
    if K == 1 and not any(pb) and not any(pe):
        xs = x[(slice(None), slice(None)) + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out_shape, strides))]
        xs = xs.reshape(N, group, Cg, P)
        out = np.matmul(w.reshape(group, Mg, Cg), xs)
        return out.reshape(N, M, *out_shape)

    if (group == 1 and n == 2 and strides[0] == 1 and strides[1] == 1 and C >= 64 and (2 * M <= C or P >= 1024)
            and min(pb) >= 0 and min(pe) >= 0):
        return _conv2d_shifted(x, w, pb, pe, dilations, out_shape)
    if Cg == 1 and group > 1 and n == 2 and min(pb) >= 0 and min(pe) >= 0:
        th = _band_plan(x.shape, w.shape, pb, pe, strides, dilations, out_shape)
        if th is not None:
            return _depthwise2d_band(x, w, None, pb, pe, strides, dilations, out_shape, group, th)
    if Cg == 1 and group > 1 and n == 2 and strides[0] == 1 and strides[1] == 1 and min(pb) >= 0 and min(pe) >= 0:
        if Mg == 1 and group >= _DW_NHWC_MIN_C:
            return _depthwise2d_nhwc(x, w, pb, pe, dilations, out_shape)
        return _depthwise2d_flat(x, w, pb, pe, dilations, out_shape, group)
    if (Cg == 1 and group > 1 and n == 2 and min(pb) >= 0 and min(pe) >= 0 and strides[0] <= 4 and strides[1] <= 4
            and prod(out_shape) >= 64):
        return _depthwise2d_strided(x, w, pb, pe, strides, dilations, out_shape, group)
    xp = pad_array(x, pb, pe, 0)
    # Depthwise: sum of shifted slices, no im2col (products land in one scratch buffer, no temporaries).
    if Cg == 1 and group > 1:
        xg = xp.reshape(N, group, 1, *xp.shape[2:])
        wg = w.reshape(group, Mg, K)
        out = np.empty((N, group, Mg, *out_shape), dtype=dt)
        tmp = np.empty_like(out) if K > 1 else None
        tail = (1,) * n
        for kidx, kpos in enumerate(np.ndindex(*kshape)):
            sl = tuple(slice(k * d, k * d + (o - 1) * s + 1, s)
                       for k, d, o, s in zip(kpos, dilations, out_shape, strides))
            coef = wg[:, :, kidx].reshape(group, Mg, *tail)
            src = xg[(slice(None), slice(None), slice(None)) + sl]
            if kidx == 0:
                np.multiply(src, coef, out=out)
            else:
                np.multiply(src, coef, out=tmp)
                out += tmp
        return out.reshape(N, M, *out_shape)

    # General: im2col through a strided view + one batched matmul per group.
    view = windows(xp, kshape, strides, dilations, out_shape)  # (N, C, *K, *O)
    wmat = w.reshape(group, Mg, Cg * K)
    per_image = C * K * P
    chunk = max(1, _COLS_LIMIT // max(per_image, 1))
    if chunk >= N:
        cols = view.reshape(N, group, Cg * K, P)
        return np.matmul(wmat, cols).reshape(N, M, *out_shape)
    out = np.empty((N, M, *out_shape), dtype=dt)
    for s0 in range(0, N, chunk):
        s1 = min(N, s0 + chunk)
        cols = view[s0:s1].reshape(s1 - s0, group, Cg * K, P)
        out[s0:s1] = np.matmul(wmat, cols).reshape(s1 - s0, M, *out_shape)
    return out


def _conv2d_shifted(x, w, pb, pe, dilations, out_shape, B=None):
    """Stride-1 2-D convolution without im2col: one GEMM per kernel tap, accumulated in place.

    The input is zero-padded into a (C, Hp + 1, Wp) buffer and flattened; tap (i, j) then reads the contiguous
    window starting at i*dh*Wp + j*dw, so each tap is W[:, :, i, j] (M x C) @ window (C x Ho*Wp) with no copy.
    The Wp - Wo extra columns per row are garbage and are cropped at the end.
    """
    N, C, H, W = x.shape
    M, _, KH, KW = w.shape
    dh, dw = dilations
    Wp = W + pb[1] + pe[1]
    Ho, Wo = out_shape
    dt = x.dtype
    xf, Wp = _flat_padded(x, pb, pe)
    L = Ho * Wp
    wk = np.ascontiguousarray(w.transpose(2, 3, 0, 1))  # (KH, KW, M, C)
    acc = np.empty((N, M, L), dtype=dt)
    tmp = np.empty((M, L), dtype=dt)
    for b in range(N):
        ab = acc[b]
        first = True
        for i in range(KH):
            for j in range(KW):
                off = i * dh * Wp + j * dw
                if first:
                    np.matmul(wk[i, j], xf[b, :, off:off + L], out=ab)
                    first = False
                else:
                    np.matmul(wk[i, j], xf[b, :, off:off + L], out=tmp)
                    ab += tmp
    res = acc.reshape(N, M, Ho, Wp)
    if B is not None:  # crop and bias in one pass
        return np.add(res[..., :Wo], B.reshape(M, 1, 1), out=np.empty((N, M, Ho, Wo), dtype=res.dtype))
    return res if Wo == Wp else np.ascontiguousarray(res[..., :Wo])


def _bias_keyed(wkey, B):
    """``wkey`` for a layout that folds the bias B in: no caching, (None, None), when B is given but not part of the
    key (a bias the caller did not pass as the constant it keyed)."""
    return wkey if B is None or wkey[1] is not None else (None, None)


def _stacked_weights(w, B, C):
    """Filter (M, C, KH, KW) as the tap-stacked (KH*KW*M, C + 1) matrix of ``_conv2d_stacked``: rows t*M .. t*M+M-1
    hold tap t = i*KW + j, the last column the bias on tap 0 (it multiplies the row of ones) and zeros elsewhere."""
    M, _, KH, KW = w.shape
    ws = np.zeros((KH * KW, M, C + 1), dtype=w.dtype)
    ws[:, :, :C] = _tap_weights(w)
    if B is not None:
        ws[0, :, C] = B
    return ws.reshape(KH * KW * M, C + 1)


def _conv2d_stacked(x, w, pb, pe, dilations, out_shape, B=None, wkey=(None, None), out=None):
    """Stride-1 2-D convolution with few output channels as ONE GEMM of the tap-stacked filter (KH*KW*M, C + 1)
    with the flat zero-padded image (C + 1, (Hp + 1) * Wp) (a row of ones carries the bias), then the taps' shifted
    sums.

    Per-tap GEMMs (``_conv2d_shifted``) and im2col both leave BLAS with M output rows against a wide operand it must
    pack again for every call: with M = 24-32 (DenseNet's growth convolutions, PP-OCR's neck) packing dominates and
    OpenBLAS runs at 40-70 GFLOP/s.  Stacked, the GEMM has KH*KW*M rows, the image is packed once (no im2col copy
    at all) and it runs at 110-130 GFLOP/s; tap t's product is then added at its offset t_off = i*dh*Wp + j*dw.
    Each image row runs on into the next in the flat layout, so each shifted add is ONE contiguous pass over all M
    rows of a tap (the spill past a row end lands in the Wp - Wo cropped columns or the spare padded row)."""
    N, C, H, W = x.shape
    M, _, KH, KW = w.shape
    dh, dw = dilations
    Ho, Wo = out_shape
    dt = x.dtype
    Hp, Wp = H + pb[0] + pe[0], W + pb[1] + pe[1]
    Lx = (Hp + 1) * Wp
    xp = np.zeros((N, C + 1, Hp + 1, Wp), dtype=dt)
    xp[:, :C, pb[0]:pb[0] + H, pb[1]:pb[1] + W] = x
    xp[:, C] = 1
    xf = xp.reshape(N, C + 1, Lx)
    ws = _derived(("stacked", dt.str), _bias_keyed(wkey, B), lambda: _stacked_weights(w, B, C))
    T = KH * KW
    offs = [i * dh * Wp + j * dw for i in range(KH) for j in range(KW)]
    n = M * Lx - max(offs)
    y = np.empty((T, M * Lx), dtype=dt)
    if out is None:
        out = np.empty((N, M, Ho, Wo), dtype=dt)
    for b in range(N):
        np.matmul(ws, xf[b], out=y.reshape(T * M, Lx))
        acc = y[0, :n]
        for t in range(1, T):
            acc += y[t, offs[t]:offs[t] + n]
        out[b] = y[0].reshape(M, Lx)[:, :Ho * Wp].reshape(M, Ho, Wp)[:, :, :Wo]
    return out


def _tap_weights(w):
    """Filter (M, C, KH, KW) as (KH*KW, M, C): one contiguous (M, C) matrix per tap."""
    M, C, KH, KW = w.shape
    return np.ascontiguousarray(w.transpose(2, 3, 0, 1)).reshape(KH * KW, M, C)


def _conv2d_direct(x, w, pb, pe, strides, dilations, out_shape, B=None, wkey=(None, None), out=None, acc=False):
    """Float32 2-D convolution without im2col: one BLAS GEMM per tap, accumulated in place (beta = 1).

    In the flat zero-padded image (C, (Hp + 1) * Wp) the input window of tap (i, j) for all output positions is the
    column range starting at i*dh*Wp + j*dw: a (C, Ho*Wp) view with the image's row stride, which BLAS reads
    directly (numpy's matmul cannot take such a view without copying it, nor accumulate).  Strided convolutions
    read the tap's stride phase (``_polyphase``) the same way.  The output rows carry the spare columns of the
    layout, cropped at the end; output rows go in blocks whose accumulator stays in cache across the taps.
    im2col copies KH*KW times the image and BLAS then packs that copy again; here BLAS packs each window once,
    straight from the image (measured 0.67-0.86x the im2col path on 64-256 channel layers from 28x28 to 224x224;
    with few positions per channel the per-tap packing of the filter dominates instead)."""
    N, C, H, W = x.shape
    M, _, KH, KW = w.shape
    sh, sw = strides
    dh, dw = dilations
    Ho, Wo = out_shape
    if sh == 1 and sw == 1:
        xf, Wp = _flat_padded(x, pb, pe)
        src = [(xf, i * dh * Wp + j * dw) for i in range(KH) for j in range(KW)]
    else:
        ph, Wp = _polyphase(x, pb, pe, sh, sw)
        src = [(ph[p], qi * Wp + qj) for p, qi, qj in _phase_taps(KH, KW, strides, dilations)]
    wt = _derived(("taps", w.dtype.str), (wkey[0], None), lambda: _tap_weights(w))
    # output row blocks whose accumulator stays in cache across the taps (>= 2048 columns per GEMM)
    rows = max(1, min(Ho, max(-(-2048 // Wp), _DIRECT_BLOCK_BYTES // (M * Wp * x.dtype.itemsize))))
    y = np.empty((M, rows * Wp), dtype=x.dtype)
    if out is None:
        out = np.empty((N, M, Ho, Wo), dtype=x.dtype)
    for n in range(N):
        for r0 in range(0, Ho, rows):
            h = min(rows, Ho - r0)
            yb = y[:, :h * Wp]
            if acc:  # start from the residual held in ``out`` (+ bias); the spare columns, cropped below, from 0
                _conv_packed.start_from_residual(yb.reshape(M, h, Wp), out[n, :, r0:r0 + h], B)
            elif B is not None:
                yb[...] = B.reshape(M, 1)
            s0 = r0 * Wp
            for t, (a, off) in enumerate(src):
                _blas.sgemm(wt[t], a[n, :, s0 + off:s0 + off + h * Wp], yb, 1.0 if t or acc or B is not None else 0.0)
            out[n, :, r0:r0 + h] = yb.reshape(M, h, Wp)[:, :, :Wo]
    return out


def _flat_padded(x, pb, pe):
    """x (N, C, H, W) zero-padded into (N, C, Hp + 1, Wp) and flattened to (N, C, (Hp + 1) * Wp).  Only the borders
    are zeroed (0.7x np.zeros + copy on 64x224x224)."""
    N, C, H, W = x.shape
    Hp, Wp = H + pb[0] + pe[0], W + pb[1] + pe[1]
    xp = np.empty((N, C, Hp + 1, Wp), dtype=x.dtype)
    xp[:, :, :pb[0]] = 0
    xp[:, :, pb[0] + H:] = 0  # (the bottom padding and the spare row)
    inner = xp[:, :, pb[0]:pb[0] + H]
    inner[..., :pb[1]] = 0
    inner[..., pb[1] + W:] = 0
    inner[..., pb[1]:pb[1] + W] = x
    return xp.reshape(N, C, (Hp + 1) * Wp), Wp


def _polyphase(x, pb, pe, sh, sw):
    """The zero-padded x split into its sh*sw stride phases: (sh*sw, N, C, Hq*Wq) with phase (a, b) holding padded
    rows a::sh and columns b::sw (plus one zero row at the end), and Wq.  A stride-(sh, sw) window tap then reads
    one phase at a fixed offset, contiguously."""
    N, C, H, W = x.shape
    Hp, Wp = H + pb[0] + pe[0], W + pb[1] + pe[1]
    Hq, Wq = -(-Hp // sh) + 1, -(-Wp // sw)
    ph = np.zeros((sh, sw, N, C, Hq, Wq), dtype=x.dtype)
    for a in range(sh):
        q0 = max(0, -(-(pb[0] - a) // sh))  # first phase row that lies inside x
        r0 = q0 * sh + a - pb[0]
        if r0 >= H:
            continue
        nr = (H - 1 - r0) // sh + 1
        for b in range(sw):
            p0 = max(0, -(-(pb[1] - b) // sw))
            c0 = p0 * sw + b - pb[1]
            if c0 >= W:
                continue
            nc = (W - 1 - c0) // sw + 1
            ph[a, b, :, :, q0:q0 + nr, p0:p0 + nc] = x[:, :, r0::sh, c0::sw]
    return ph.reshape(sh * sw, N, C, Hq * Wq), Wq


def _phase_taps(KH, KW, strides, dilations):
    """Kernel taps (row-major) as (phase, qi, qj) of the ``_polyphase`` split: tap (i, j) reads phase
    p = (i*dh % sh) * sw + (j*dw % sw) at row offset qi = i*dh // sh and column offset qj = j*dw // sw."""
    (sh, sw), (dh, dw) = strides, dilations
    taps = []
    for i in range(KH):
        qi, a = divmod(i * dh, sh)
        for j in range(KW):
            qj, b = divmod(j * dw, sw)
            taps.append((a * sw + b, qi, qj))
    return taps


def _gemm_layout(w, B, group, wkey, P):
    """(weights (group, Mg, K [+ 1]), bias folded?) for the GEMM paths.  Constant filters get the bias folded in
    as a last column (cached); for writeable ones the column is only built when copying the filter is cheaper
    than a bias pass over the P output positions, else the plain (copy-free) filter view is used."""
    if B is None:
        return w.reshape(group, w.shape[0] // group, w[0].size), False
    live = [a for a in wkey if a is not None]
    if live and all(frozen(a) for a in live):
        return _derived(("gemm", group, w.dtype.str), wkey, lambda: _gemm_weights(w, B, group)), True
    if w[0].size <= 2 * P:
        return _gemm_weights(w, B, group), True
    return w.reshape(group, w.shape[0] // group, w[0].size), False


def _gemm_weights(w, B, group):
    """Filter (M, Cg, *K) as (group, Mg, Cg*prod(K) [+ 1]) with the bias as a last column when given (it multiplies
    a row of ones in the column buffer)."""
    M = w.shape[0]
    Mg = M // group
    k = w[0].size
    wr = np.empty((group, Mg, k + (B is not None)), dtype=w.dtype)
    wr[:, :, :k] = w.reshape(group, Mg, k)
    if B is not None:
        wr[:, :, k] = B.reshape(group, Mg)
    return wr


def _conv1x1(x, w, B, group, wkey, out=None, acc=False):
    """Pointwise convolution (N, C, *S) -> (N, M, *S): one (grouped) GEMM into the output.  The bias rides in the
    GEMM on a row of ones when the output has at least as many channels as the input (copying the input is then
    cheaper than a separate pass over the output), else it is added in place.  ``acc`` (float32, direct BLAS, a
    given C-contiguous ``out``): the GEMMs accumulate into ``out``."""
    N, C = x.shape[:2]
    M = w.shape[0]
    Cg, Mg = C // group, M // group
    P = x[0, 0].size
    if out is None:  # (a given ``out`` is C-contiguous: see _conv2d_fast)
        out = np.empty((N, M) + x.shape[2:], dtype=x.dtype)
    of = out.reshape(N, group, Mg, P)
    xg = x.reshape(N, group, Cg, P)
    wr, folded = _gemm_layout(w, B, group, wkey, P) if B is not None and M >= C else (None, False)
    if folded:
        cols = np.empty((group, Cg + 1, P), dtype=x.dtype)
        cols[:, Cg] = 1
        for n in range(N):
            cols[:, :Cg] = xg[n]
            if acc:
                for g in range(group):
                    _blas.sgemm(wr[g], cols[g], of[n, g], 1.0)
            else:
                np.matmul(wr, cols, out=of[n])
        return out
    if acc:
        w3 = w.reshape(group, Mg, Cg)
        for n in range(N):
            for g in range(group):
                _blas.sgemm(w3[g], xg[n, g], of[n, g], 1.0)
    else:
        np.matmul(w.reshape(group, Mg, Cg), xg, out=of)
    if B is not None:
        out.reshape(N, M, P)[...] += B.reshape(M, 1)
    return out


def _conv2d_gemm(x, w, B, pb, pe, strides, dilations, out_shape, group, wkey=(None, None), out=None, acc=False):
    """2-D convolution as one GEMM per block of output rows, written straight into the output, with the bias
    folded into the GEMM as a row of ones.

    The column block is copied from one strided window view of the zero-padded image; strided kernels with many
    taps first split the image into its stride phases (``_polyphase``), so each tap copies a window of one phase
    whose rows are contiguous (strided element reads are slower; the split pays off when each phase is read by
    several taps)."""
    N, C = x.shape[:2]
    M, Cg, KH, KW = w.shape
    Mg = M // group
    Ho, Wo = out_shape
    sh, sw = strides
    dt = x.dtype
    T = KH * KW
    P = Ho * Wo
    wr, folded = _gemm_layout(w, B, group, wkey, N * P)
    Kg = wr.shape[2]
    # blocks of >= ~2048 columns (GEMM efficiency) and about _GEMM_COLS_BLOCK elements (cache), within the limit
    rows = max(-(-2048 // Wo), _GEMM_COLS_BLOCK // max(1, group * Kg * Wo))
    rows = max(1, min(Ho, rows, _COLS_LIMIT // max(1, group * Kg * Wo)))
    cols = np.empty((group, Kg, rows * Wo), dtype=dt)
    if folded:
        cols[:, -1] = 1
    if out is None:  # (a given ``out`` is C-contiguous: see _conv2d_fast)
        out = np.empty((N, M, Ho, Wo), dtype=dt)
    of = out.reshape(N, group, Mg, P)
    if (sh == 1 and sw == 1) or T < _POLY_MIN_TAPS:
        xp = pad_array(x, pb, pe, 0)
        view = windows(xp, (KH, KW), strides, dilations, out_shape)  # (N, C, KH, KW, Ho, Wo)
        phases = None
    else:
        phases, Wq = _polyphase(x, pb, pe, sh, sw)
        Hq = phases.shape[-1] // Wq
        phases = phases.reshape(sh * sw, N, C, Hq, Wq)
        taps = _phase_taps(KH, KW, strides, dilations)
    for n in range(N):
        for r0 in range(0, Ho, rows):
            r1 = min(Ho, r0 + rows)
            h = r1 - r0
            c = cols[:, :, :h * Wo]
            dst = c[:, :Cg * T].reshape(group, Cg, KH, KW, h, Wo)
            if phases is None:
                dst[...] = view[n, :, :, :, r0:r1].reshape(group, Cg, KH, KW, h, Wo)
            else:
                dst = dst.reshape(group, Cg, T, h, Wo)
                for t, (p, qi, qj) in enumerate(taps):
                    dst[:, :, t] = phases[p, n, :, qi + r0:qi + r1, qj:qj + Wo].reshape(group, Cg, h, Wo)
            if acc:  # (a residual in ``out``: BLAS adds the products to it)
                for g in range(group):
                    _blas.sgemm(wr[g], c[g], of[n, g, :, r0 * Wo:r1 * Wo], 1.0)
            else:
                np.matmul(wr, c, out=of[n, :, :, r0 * Wo:r1 * Wo])
    if B is not None and not folded:
        out.reshape(N, M, P)[...] += B.reshape(M, 1)
    return out


def _depthwise2d_flat(x, w, pb, pe, dilations, out_shape, group, B=None):
    """Stride-1 2-D depthwise convolution on the flattened padded image: every tap is one multiply-add over
    whole (Ho x Wp) planes (long inner loops) instead of Ho short rows; the Wp - Wo extra columns are cropped.
    Channels go in blocks of ~512 KiB so the accumulator and scratch stay in cache across the taps."""
    N = x.shape[0]
    M, _, KH, KW = w.shape
    Mg = M // group
    Ho, Wo = out_shape
    xf, Wp = _flat_padded(x, pb, pe)
    L = Ho * Wp
    xg = xf.reshape(N, group, 1, xf.shape[-1])
    wg = w.reshape(group, Mg, KH, KW)
    acc = np.empty((N, group, Mg, L), dtype=x.dtype)
    step = max(1, _DW_BLOCK_BYTES // max(1, Mg * L * x.dtype.itemsize))
    tmp = np.empty((min(step, group), Mg, L), dtype=x.dtype)
    taps = [(i * dilations[0] * Wp + j * dilations[1], i, j) for i in range(KH) for j in range(KW)]
    for b in range(N):
        for g0 in range(0, group, step):
            g1 = min(group, g0 + step)
            a = acc[b, g0:g1]
            t = tmp[:g1 - g0]
            src = xg[b, g0:g1]
            for k, (off, i, j) in enumerate(taps):
                coef = wg[g0:g1, :, i, j:j + 1]  # (g, Mg, 1)
                if k == 0:
                    np.multiply(src[..., off:off + L], coef, out=a)
                else:
                    np.multiply(src[..., off:off + L], coef, out=t)
                    a += t
    res = acc.reshape(N, M, Ho, Wp)
    if B is not None:  # crop and bias in one pass
        return np.add(res[..., :Wo], B.reshape(M, 1, 1), out=np.empty((N, M, Ho, Wo), dtype=res.dtype))
    return res if Wo == Wp else np.ascontiguousarray(res[..., :Wo])


# Depthwise convolutions (one filter per channel) run as the native kernel where it is used (``_native.py``: four
# output rows x 16 columns at a time over each plane padded once into scratch, every tap one multiply-add per row;
# test and measurement hook)
DW_NATIVE = True


# ... and split their channels between the calling thread and a helper (the kernel runs without the GIL) from this
# many multiply-adds on (a helper's wake-up costs ~20-50 us on the benchmark VM; ~0.1 ns per multiply-add)
_DW_SPLIT_MIN = 1 << 21


def _native_conv_setup(name, on, x, w, B, pb, strides, dilations, out_shape, out, acc):
    """(kernel, output, contiguous filter, bias, the kernel's arguments from the strides to the output width, the
    floats of scratch one padded input plane takes) for the native convolution kernel ``name`` (``on``: its hook), or
    None where it is not used: not float32, a column stride above 2, an input that is not C-contiguous, an ``out``
    of another layout."""
    if (not on or x.dtype != _F32 or w.dtype != _F32 or strides[1] > 2 or B is not None and B.dtype != _F32
            or not x.flags.c_contiguous):
        return None
    fn = _native.function(name)
    if fn is None:
        return None
    shape = (x.shape[0], w.shape[0], *out_shape)
    if out is None:
        out = np.zeros(shape, dtype=_F32) if acc else np.empty(shape, dtype=_F32)
    elif out.dtype != _F32 or not out.flags.c_contiguous or out.shape != shape or not out.flags.writeable:
        return None
    args = (strides[0], strides[1], dilations[0], dilations[1], pb[0], pb[1], *out_shape)
    pad_floats = _native.function("win_pad_floats")(*w.shape[2:], *args[:4], *out_shape)
    return fn, out, np.ascontiguousarray(w), None if B is None else np.ascontiguousarray(B), args, pad_floats


def _dw_native_part(lo, hi, fn, x, wc, bc, args, out, tail, pad_floats, n=0):
    """Channels [lo, hi) of image ``n`` (``args``: the kernel's arguments from the strides to the output width;
    ``tail``: those after the output but the scratch, which each part allocates, 64-byte aligned)."""
    _, C, H, W = x.shape
    _, _, KH, KW = wc.shape
    pad = _packed._aligned(pad_floats)
    fn(hi - lo, hi - lo, H, W, x.ctypes.data + 4 * (n * C + lo) * H * W, wc.ctypes.data + 4 * lo * KH * KW,
       None if bc is None else bc.ctypes.data + 4 * lo, KH, KW, *args,
       out.ctypes.data + 4 * (n * C + lo) * out.shape[2] * out.shape[3], *tail, pad.ctypes.data)


def _depthwise2d_native(x, w, B, pb, strides, dilations, out_shape, out=None, acc=False):
    """Float32 depthwise convolution (w: (C, 1, KH, KW), column stride 1 or 2) by the native kernel, into ``out``
    (added to it with ``acc``) or a fresh array; None where the kernel is not used (the caller's paths then run)."""
    setup = _native_conv_setup("dwconv2d_f32", DW_NATIVE, x, w, B, pb, strides, dilations, out_shape, out, acc)
    if setup is None:
        return None
    fn, out, wc, bc, args, pad_floats = setup
    N, C = x.shape[:2]
    tail = (int(acc), _native.EVEN_LANES)
    if N == 1 and C > 1 and out[0].size * w.shape[2] * w.shape[3] >= _DW_SPLIT_MIN and _packed.run_ranges(
            _dw_native_part, C, _packed._blas_threads(), fn, x, wc, bc, args, out, tail, pad_floats,
            single_blas=False):
        return out
    for n in range(N):
        _dw_native_part(0, C, fn, x, wc, bc, args, out, tail, pad_floats, n)
    return out


# Convolutions with at most this many input channels per group (first layers: RGB) run as the native direct kernel
# (``conv2d_small_f32``: each tap's input vector multiplied into 8 output channels, no im2col; 3x3 and 7x7 stems
# 1.7-3.8x faster than im2col + GEMM); their output channels split between two threads from 16M multiply-adds on
_SMALL_C_MAX = 4
_SMALL_SPLIT_MIN = 1 << 24
SMALL_NATIVE = True  # (test and measurement hook)


def _small_part(b0, b1, fn, x, w, bc, args, out, acc, pad_floats):
    """Output channel blocks [b0, b1) (of 8 channels; the last may be short) of a single image, one group."""
    N, C, H, W = x.shape
    M, Cg, KH, KW = w.shape
    lo, hi = 8 * b0, min(8 * b1, M)
    pad = _packed._aligned(pad_floats * Cg)
    plane = out.shape[2] * out.shape[3]
    fn(N, C, H, W, x.ctypes.data, hi - lo, 1, w.ctypes.data + 4 * lo * Cg * KH * KW,
       None if bc is None else bc.ctypes.data + 4 * lo, KH, KW, *args, out.ctypes.data + 4 * lo * plane, int(acc),
       _native.EVEN_LANES, pad.ctypes.data)


def _conv2d_small_native(x, w, B, group, pb, strides, dilations, out_shape, out=None, acc=False):
    """A float32 convolution with few input channels per group by the native direct kernel, into ``out`` (added to
    it with ``acc``) or a fresh array; None where it is not used."""
    setup = _native_conv_setup("conv2d_small_f32", SMALL_NATIVE, x, w, B, pb, strides, dilations, out_shape, out,
                               acc)
    if setup is None:
        return None
    fn, out, wc, bc, args, pad_floats = setup
    N, C, H, W = x.shape
    M, Cg, KH, KW = w.shape
    Ho, Wo = out_shape
    if (N == 1 and group == 1 and M >= 16 and M * Cg * KH * KW * Ho * Wo >= _SMALL_SPLIT_MIN
            and _packed.run_ranges(_small_part, -(-M // 8), _packed._blas_threads(), fn, x, wc, bc, args, out, acc,
                                   pad_floats, single_blas=False)):
        return out
    pad = _packed._aligned(pad_floats * Cg)
    fn(N, C, H, W, x.ctypes.data, M, group, wc.ctypes.data, None if bc is None else bc.ctypes.data, KH, KW, *args,
       out.ctypes.data, int(acc), _native.EVEN_LANES, pad.ctypes.data)
    return out


def _dw_axpy_ok(x, w, pb, pe, strides, out_shape, group) -> bool:
    """``_depthwise2d_axpy`` applies: float32, one filter per channel, equal strides up to 2, planes whose
    per-channel BLAS calls are long enough (``_DW_AXPY_MIN`` outputs, counting a row's spare columns) for the ~1 us
    call to stay small next to the work, and no zero coefficient (BLAS's saxpy skips a zero multiplier, so an inf or
    NaN input would not turn its products into NaN as the other paths' 0 * inf does)."""
    Ho, Wo = out_shape
    s = strides[0]
    return (_DW_AXPY and x.dtype == _F32 and w.dtype == _F32 and w.shape[0] == group == x.shape[1]
            and s == strides[1] and s <= 2 and (Ho - 1) * -(-(x.shape[3] + pb[1] + pe[1]) // s) + Wo >= _DW_AXPY_MIN
            and _blas.axpy_function() is not None and w.all())


def _depthwise2d_axpy(x, w, B, pb, pe, strides, dilations, out_shape):
    """Depthwise 2-D convolution (one filter per channel, equal strides s of 1 or 2) on large planes as BLAS
    ``saxpy`` calls.  The zero-padded image of a channel is split into its s*s stride phases (rows a::s, columns
    b::s; s = 1: the padded image itself), each flattened with row pitch Wq; output (h, w) at l = h * Wq + w then
    reads, for tap (i, j), phase ((i*dh) % s, (j*dw) % s) at l + ((i*dh) // s) * Wq + (j*dw) // s, so each tap of a
    channel is one contiguous y += w_t * x[off:] over the channel's whole output (Wq - Wo spare columns per row,
    cropped at the end with the bias): one pass per tap instead of numpy's multiply-then-add, in BLAS's threads.
    Channels go in blocks whose phases and products stay in cache (memory traffic otherwise dominates); the
    padding is zeroed once and each block copies in its interior; the first tap of a block is one numpy
    multiply."""
    N, C, H, W = x.shape
    KH, KW = w.shape[2:]
    s = strides[0]
    dh, dw = dilations
    Ho, Wo = out_shape
    Hp, Wp = H + pb[0] + pe[0], W + pb[1] + pe[1]
    Hq, Wq = -(-Hp // s), -(-Wp // s)
    axpy = _blas.axpy_function()
    n_out = (Ho - 1) * Wq + Wo  # elements per channel (the last row's spare columns left out)
    # (phase, offset) per tap; the largest read of a phase, n_out - 1 + its offset, lies inside it (the windows fit
    # the padded image)
    taps = [(((i * dh) % s) * s + (j * dw) % s, ((i * dh) // s) * Wq + (j * dw) // s)
            for i in range(KH) for j in range(KW)]
    wt = w.reshape(C, KH * KW)
    coef = wt.astype(np.float64).tolist()
    step = max(1, min(C, _DW_AXPY_BLOCK_BYTES // ((s * s * Hq + Ho) * Wq * x.dtype.itemsize)))
    ph = np.zeros((s * s, step, Hq, Wq), dtype=x.dtype)
    copies = []  # (phase interior, input rows, input columns) per phase
    for a in range(s):
        q0 = -(-(pb[0] - a) // s) if pb[0] > a else 0  # first phase row inside x
        r0 = q0 * s + a - pb[0]
        for b in range(s):
            p0 = -(-(pb[1] - b) // s) if pb[1] > b else 0
            c0 = p0 * s + b - pb[1]
            if r0 < H and c0 < W:
                nr, nc = (H - 1 - r0) // s + 1, (W - 1 - c0) // s + 1
                copies.append((ph[a * s + b, :, q0:q0 + nr, p0:p0 + nc], slice(r0, r0 + (nr - 1) * s + 1, s),
                               slice(c0, c0 + (nc - 1) * s + 1, s)))
    pf = ph.reshape(s * s, step, Hq * Wq)
    acc = np.empty((step, Ho * Wq), dtype=x.dtype)
    pbase, ps, cs, yb, ys = pf.ctypes.data, pf.strides[0], pf.strides[1], acc.ctypes.data, acc.strides[0]
    p_first, o_first = taps[0]
    first = pf[p_first, :, o_first:o_first + n_out]
    res = np.empty((N, C, Ho, Wo), dtype=x.dtype)
    for n in range(N):
        for c0 in range(0, C, step):
            c1 = min(C, c0 + step)
            k = c1 - c0
            for dst, rows, cols in copies:
                dst[:k] = x[n, c0:c1, rows, cols]
            np.multiply(first[:k], wt[c0:c1, :1], out=acc[:k, :n_out])
            for c in range(k):
                wc, yc = coef[c0 + c], yb + c * ys
                for t in range(1, len(taps)):
                    p, off = taps[t]
                    axpy(n_out, wc[t], pbase + p * ps + c * cs + 4 * off, 1, yc, 1)
            a3 = acc[:k].reshape(k, Ho, Wq)[:, :, :Wo]
            if B is not None:  # crop and bias in one pass
                np.add(a3, B[c0:c1].reshape(k, 1, 1), out=res[n, c0:c1])
            else:
                res[n, c0:c1] = a3
    return res


def _depthwise2d_nhwc(x, w, pb, pe, dilations, out_shape, B=None):
    """Stride-1 2-D depthwise convolution (one filter per channel) in channels-last layout.

    The padded input is laid out (Hp + 1, Wp, C) and flattened over (H, W): tap (i, j) reads the contiguous rows
    starting at i*dh*Wp + j*dw, and its C coefficients broadcast along the contiguous channel axis (numpy's fast
    row-vector loop; a per-channel scalar broadcast along W is ~2x slower).  Rows go in blocks of ~64K elements so
    the accumulator and scratch stay in cache across the taps; the Wp - Wo extra columns per row are cropped.
    """
    N, C, H, W = x.shape
    KH, KW = w.shape[2:]
    Ho, Wo = out_shape
    Hp, Wp = H + pb[0] + pe[0], W + pb[1] + pe[1]
    dt = x.dtype
    xp = np.zeros((N, Hp + 1, Wp, C), dtype=dt)
    xp[:, pb[0]:pb[0] + H, pb[1]:pb[1] + W, :] = x.transpose(0, 2, 3, 1)
    xf = xp.reshape(N, (Hp + 1) * Wp, C)
    L = Ho * Wp
    wt = np.ascontiguousarray(w.reshape(C, KH * KW).T)  # (K, C)
    taps = [i * dilations[0] * Wp + j * dilations[1] for i in range(KH) for j in range(KW)]
    acc = np.empty((N, L, C), dtype=dt)
    rows = max(1, _DW_NHWC_BLOCK // C)
    tmp = np.empty((min(rows, L), C), dtype=dt)
    for b in range(N):
        for r0 in range(0, L, rows):
            r1 = min(L, r0 + rows)
            a = acc[b, r0:r1]
            t = tmp[:r1 - r0]
            for k, off in enumerate(taps):
                if k == 0:
                    np.multiply(xf[b, off + r0:off + r1], wt[k], out=a)
                else:
                    np.multiply(xf[b, off + r0:off + r1], wt[k], out=t)
                    a += t
    res = acc.reshape(N, Ho, Wp, C)[:, :, :Wo, :].transpose(0, 3, 1, 2)
    if B is not None:  # crop, transpose and bias in one pass
        return np.add(res, B.reshape(C, 1, 1), out=np.empty(res.shape, dtype=dt))
    return np.ascontiguousarray(res)


def _depthwise2d_sop(x, w, B, pb, pe, strides, dilations, out_shape, wkey=(None, None), out=None, acc=False):
    """2-D depthwise convolution (one filter per channel, M == C) as one channels-last sum of products.

    The padded input is laid out (N, Hp, Wp, C) and viewed (no copy) as its (N, Ho, Wo, KH, KW, C) windows; numpy's
    einsum then sums the taps' products against the (KH, KW, C) filter with the contiguous channel axis innermost:
    one C-long multiply-add loop per output position and tap, no temporaries.  The result gets the bias and is
    transposed back to channels-first (into ``out`` when given; added to it with ``acc``)."""
    N, C, H, W = x.shape
    KH, KW = w.shape[2:]
    Ho, Wo = out_shape
    dt = x.dtype
    xp = np.zeros((N, H + pb[0] + pe[0], W + pb[1] + pe[1], C), dtype=dt)
    xp[:, pb[0]:pb[0] + H, pb[1]:pb[1] + W] = x.transpose(0, 2, 3, 1)
    s0, s1, s2, s3 = xp.strides
    if strides[1] == 1 and _DW_SOP_WIDE:
        # a stride-1 row of Wo outputs reads Wo * C contiguous inputs per tap: (w, c) merge into one axis against the
        # filter tiled Wo times, so each of the Ho * KH * KW sum-of-products loops runs Wo * C long instead of C
        # (measured 0.66x the per-position loops at 272 channels on 14x14, 0.85x at 544 on 7x7)
        wt = _derived(("dw_sop_w", Wo, w.dtype.str), wkey[:1], lambda: np.ascontiguousarray(np.broadcast_to(
            w.reshape(C, KH, KW).transpose(1, 2, 0).astype(dt, copy=False)[:, :, None], (KH, KW, Wo, C))).reshape(
                KH, KW, Wo * C))
        win = strided_view(xp, (N, Ho, KH, KW, Wo * C), (s0, s1 * strides[0], s1 * dilations[0], s2 * dilations[1], s3))
        res = np.einsum("nhijm,ijm->nhm", win, wt, out=np.empty((N, Ho, Wo * C), dtype=dt)).reshape(N, Ho, Wo, C)
    else:
        wt = _derived(("dw_sop", w.dtype.str), wkey[:1],
                      lambda: np.ascontiguousarray(w.reshape(C, KH, KW).transpose(1, 2, 0).astype(dt, copy=False)))
        win = strided_view(xp, (N, Ho, Wo, KH, KW, C),
                           (s0, s1 * strides[0], s2 * strides[1], s1 * dilations[0], s2 * dilations[1], s3))
        res = np.einsum("nhwijc,ijc->nhwc", win, wt, out=np.empty((N, Ho, Wo, C), dtype=dt))
    if B is not None:  # along the contiguous channel axis (a bias add in the transposing pass costs 2x the copy)
        res += B
    res = res.transpose(0, 3, 1, 2)
    if out is None:
        return np.ascontiguousarray(res)
    if acc:
        out += res
    else:
        out[...] = res
    return out


def _band_filters(w, B, group, th, sh, dh, order, thp1):
    """Banded filter matrices of ``_depthwise2d_band``: (KW, group, Mg, 1, th, thp1), entry [k, c, m, 0, r, :]
    holding w[c*Mg+m, 0, i, order[k]] at input row r*sh + i*dh of a tile, and, when ``B`` is given, the bias in the
    last column of entry k = 0 (it multiplies a row of ones)."""
    M, _, KH, KW = w.shape
    T = np.zeros((KW, M, th, thp1), dtype=w.dtype)
    r = np.arange(th)
    wt = w[:, 0].transpose(2, 0, 1)[list(order)]  # (KW, M, KH)
    for i in range(KH):
        T[:, :, r, r * sh + i * dh] = wt[:, :, i, None]
    if B is not None:
        T[0, :, :, thp1 - 1] = B[:, None]
    return T.reshape(KW, group, M // group, 1, th, thp1)


def _band_rows(Ho, KH, sh, dh):
    """Output rows per tile of ``_depthwise2d_band``: all of them for short images, else ~8 (taller tiles waste
    more multiply-adds on the band's zeros, shorter ones make the GEMMs too small)."""
    return Ho if Ho <= 12 else 8


def _band_plan(x_shape, w_shape, pb, pe, strides, dilations, out_shape):
    """Rows per tile for ``_depthwise2d_band``, or None when the band would be mostly zeros (tall dilations, 1-row
    kernels with tall tiles) or its per-channel buffers too large -- the multiply-add paths are then cheaper."""
    KH, KW = w_shape[2:]
    M = w_shape[0]
    Ho, Wo = out_shape
    sh, sw = strides
    dh = dilations[0]
    if Ho <= 0 or Wo <= 0:
        return None
    th = _band_rows(Ho, KH, sh, dh)
    nt = -(-Ho // th)
    th = -(-Ho // nt)
    thp1 = (th - 1) * sh + (KH - 1) * dh + 2
    # tall bands (>= 16 rows of K) run at a better GEMM rate and may waste 1.5x more
    if thp1 > (_DW_BAND_WASTE * 3 // 2 if thp1 >= 16 else _DW_BAND_WASTE) * KH:
        return None
    Wq = -(-(x_shape[3] + pb[1] + pe[1]) // sw)
    if KW * (M // x_shape[1]) * nt * th * Wq * 8 > _DW_BAND_MAX_BYTES:
        return None
    return th


def _depthwise2d_band(x, w, B, pb, pe, strides, dilations, out_shape, group, th=None, wkey=(None, None)):
    """Depthwise 2-D convolution (one input channel per group) as GEMMs with banded filter matrices.

    Output rows go in tiles of ``th`` rows; a tile reads thp = (th-1)*sh + (KH-1)*dh + 1 zero-padded input rows X.
    Kernel column j of channel c contributes T[j, c] @ X, where the th x thp band T[j, c] holds w[c, 0, i, j] at
    (r, r*sh + i*dh); that product, shifted left by j*dw columns, is the column's share of the output.  With a
    stride along W the padded columns are first split into their sw phases and kernel column j reads phase
    j*dw % sw, shifted by j*dw // sw.  The tiles of a channel sit side by side (``_band_wide``), so the KW*C GEMMs
    run in one matmul call per phase into a tap-major buffer and each shift-add is a single 1-D contiguous pass
    (the spare columns per row absorb the shifts); the bias rides in the first column's GEMM on a row of ones.
    The GEMMs cost thp / KH times the multiply-adds of the direct sum, but run in BLAS instead of two numpy passes
    per tap."""
    W = x.shape[3]
    KH, KW = w.shape[2:]
    sh, sw = strides
    dh, dw = dilations
    Ho = out_shape[0]
    if th is None:
        th = _band_rows(Ho, KH, sh, dh)
    nt = -(-Ho // th)
    th = -(-Ho // nt)
    thp = (th - 1) * sh + (KH - 1) * dh + 1  # input rows per tile
    Wp = W + pb[1] + pe[1]
    Wq = -(-Wp // sw)  # columns per phase
    # kernel columns grouped by phase (column 0 first: it needs no shift and carries the bias)
    order = sorted(range(KW), key=lambda j: ((j * dw) % sw, j))
    shifts = [(j * dw) // sw for j in order]
    spans = []
    for b in range(sw):
        ks = [k for k, j in enumerate(order) if (j * dw) % sw == b]
        if ks:
            spans.append((b, ks[0], ks[-1] + 1))
    wkey = _bias_keyed(wkey, B)
    return _band_wide(x, w, B, pb, strides, dilations, out_shape, group, th, nt, thp, Wq, order, shifts, spans, wkey)


def _band_wide(x, w, B, pb, strides, dilations, out_shape, group, th, nt, thp, Wq, order, shifts, spans, wkey):
    """``_depthwise2d_band`` with the row tiles of a channel laid side by side, (thp [+ 1], nt * Wq) per channel and
    column phase, so each kernel column's band multiplies all tiles of a channel in one GEMM: KW * C GEMMs instead
    of KW * C * nt tiny ones (numpy's per-matrix BLAS call overhead dominates those).  The output rows then come
    out tile-row-major and are transposed back in the final copy."""
    N, C, H, W = x.shape
    M, _, KH, KW = w.shape
    Mg = M // group
    sh, sw = strides
    Ho, Wo = out_shape
    dt = x.dtype
    fold = B is not None
    thp1 = thp + fold
    NW = nt * Wq
    tiles = np.zeros((sw, N, C, thp1, nt, Wq), dtype=dt)
    for b in range(sw):
        u0 = max(0, -(-(pb[1] - b) // sw))  # first phase column inside x
        c0 = b + u0 * sw - pb[1]
        if c0 >= W:
            continue
        nc = (W - 1 - c0) // sw + 1
        for t in range(nt):
            r0 = t * th * sh - pb[0]  # input row of the tile's first row
            a0, a1 = max(0, r0), min(H, r0 + thp)
            if a1 > a0:
                tiles[b, :, :, a0 - r0:a1 - r0, t, u0:u0 + nc] = x[:, :, a0:a1, c0::sw]
    if fold:
        tiles[:, :, :, thp] = 1
    tiles = tiles.reshape(sw, N, group, 1, thp1, NW)

    dh = dilations[0]
    T = _derived(("band", group, th, sh, dh, tuple(order), thp1, w.dtype.str), wkey,
                 lambda: _band_filters(w, B, group, th, sh, dh, order, thp1))
    T = T.reshape(KW, group, Mg, th, thp1)
    out = np.empty((N, M, Ho, Wo), dtype=dt)
    per_c = KW * Mg * th * NW * dt.itemsize
    step = max(1, min(group, _DW_BAND_BLOCK // max(1, per_c)))
    # kernel-column-major products: the shifted adds below then read and write disjoint contiguous ranges (numpy
    # would copy an operand of an in-place add that interleaves with its output)
    Y = np.empty((KW, step, Mg, th, NW), dtype=dt)
    exact = nt * th == Ho
    for n in range(N):
        for g0 in range(0, group, step):
            g1 = min(group, g0 + step)
            gb = g1 - g0
            for b, k0, k1 in spans:
                np.matmul(T[k0:k1, g0:g1], tiles[b, n, g0:g1], out=Y[k0:k1, :gb])
            Yf = Y[:, :gb].reshape(KW, -1)
            acc = Yf[0]
            L = acc.size
            for k in range(1, KW):
                q = shifts[k]
                a = acc[:L - q]
                a += Yf[k, q:]
            src = acc.reshape(gb * Mg, th, nt, Wq)
            dst = out[n, g0 * Mg:g1 * Mg]
            if exact:
                dst.reshape(gb * Mg, nt, th, Wo)[...] = src[..., :Wo].transpose(0, 2, 1, 3)
            else:
                for t in range(nt):
                    h = min(th, Ho - t * th)
                    dst[:, t * th:t * th + h] = src[:, :h, t, :Wo]
    return out


def _depthwise2d_strided(x, w, pb, pe, strides, dilations, out_shape, group, B=None):
    """Strided 2-D depthwise convolution through a polyphase split: the padded input is copied once into
    sh*sw contiguous phase images (rows a::sh, columns b::sw), so tap (i, j) becomes a stride-1 read of phase
    (i*dh % sh, j*dw % sw) at offset (i*dh // sh, j*dw // sw); each tap is then one multiply-add over whole
    flattened planes as in _depthwise2d_flat (strided ufunc reads are several times slower)."""
    N, C, H, W = x.shape
    M, _, KH, KW = w.shape
    Mg = M // group
    sh, sw = strides
    Ho, Wo = out_shape
    dt = x.dtype
    ph, Wq = _polyphase(x, pb, pe, sh, sw)
    ph = ph.reshape(sh * sw, N, group, 1, ph.shape[-1])
    L = Ho * Wq
    wg = w.reshape(group, Mg, KH * KW)
    acc = np.empty((N, group, Mg, L), dtype=dt)
    step = max(1, _DW_BLOCK_BYTES // max(1, Mg * L * dt.itemsize))
    tmp = np.empty((min(step, group), Mg, L), dtype=dt)
    taps = [(p, qi * Wq + qj) for p, qi, qj in _phase_taps(KH, KW, strides, dilations)]
    for b in range(N):
        for g0 in range(0, group, step):
            g1 = min(group, g0 + step)
            a = acc[b, g0:g1]
            t = tmp[:g1 - g0]
            for k, (p, off) in enumerate(taps):
                src = ph[p, b, g0:g1, :, off:off + L]
                coef = wg[g0:g1, :, k:k + 1]  # (g, Mg, 1)
                if k == 0:
                    np.multiply(src, coef, out=a)
                else:
                    np.multiply(src, coef, out=t)
                    a += t
    res = acc.reshape(N, M, Ho, Wq)
    if B is not None:  # crop and bias in one pass
        return np.add(res[..., :Wo], B.reshape(M, 1, 1), out=np.empty((N, M, Ho, Wo), dtype=res.dtype))
    return np.ascontiguousarray(res[..., :Wo])


def _prepare(X, W, op, kernel_shape, strides, dilations):
    check_rank(X, op, "X")
    check_rank(W, op, "W")
    if X.ndim != W.ndim:
        raise ValueError(f"{op}: X rank {X.ndim} and W rank {W.ndim} differ")
    n = X.ndim - 2
    ks = spatial_attr(kernel_shape, n, 1, op, "kernel_shape") if kernel_shape else list(W.shape[2:])
    if list(ks) != list(W.shape[2:]):
        raise ValueError(f"{op}: kernel_shape {ks} does not match weight shape {W.shape}")
    st = spatial_attr(strides, n, 1, op, "strides")
    dl = spatial_attr(dilations, n, 1, op, "dilations")
    if any(s < 1 for s in st) or any(d < 1 for d in dl):
        raise ValueError(f"{op}: strides and dilations must be positive")
    return n, ks, st, dl


def _add_bias(out, B, M, op):
    if B is None:
        return out
    B = np.asarray(B)
    if B.size != M:
        raise ValueError(f"{op}: bias has {B.size} values, expected {M}")
    out += B.reshape((1, M) + (1,) * (out.ndim - 2)).astype(out.dtype, copy=False)
    return out


def _conv1d_small(X, W, B, pads, strides):
    """Fast path: float32/float64 1-D convolution, group 1, no dilation, explicit non-negative pads.

    Builds the (N, C, K, O) column buffer with a short loop over min(K, O) slice copies (no strided-view
    machinery), then one GEMM.  Returns None when the case is not covered (the caller runs the generic path).
    """
    N, C, L = X.shape
    M, Cw, K = W.shape
    if C != Cw or K == 0 or C == 0 or N == 0 or M == 0:
        return None
    if pads is None or len(pads) == 0:
        p0 = p1 = 0
    elif len(pads) == 2:
        p0, p1 = int(pads[0]), int(pads[1])
        if p0 < 0 or p1 < 0:
            return None
    else:
        return None
    s = 1 if not strides else int(strides[0])
    if s < 1:
        return None
    Lp = L + p0 + p1
    if Lp < K:
        return None
    O = (Lp - K) // s + 1
    if B is not None and (not isinstance(B, np.ndarray) or B.size != M or B.dtype != X.dtype):
        return None
    if p0 or p1:
        xp = np.zeros((N, C, Lp), dtype=X.dtype)
        xp[:, :, p0:p0 + L] = X
    else:
        xp = X
    if K == 1 and s == 1:
        cols = xp
    else:
        cols = np.empty((N, C, K, O), dtype=X.dtype)
        if K <= O:
            span = (O - 1) * s + 1
            for k in range(K):
                cols[:, :, k, :] = xp[:, :, k:k + span:s]
        else:
            for o in range(O):
                cols[:, :, :, o] = xp[:, :, o * s:o * s + K]
        cols = cols.reshape(N, C * K, O)
    out = np.matmul(W.reshape(M, C * K), cols)
    if B is not None:
        out += B.reshape(M, 1)
    return out


@kernel("Conv", since=(1, 11, 22))
def conv(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    op = "Conv"
    if (group == 1 and type(X) is np.ndarray and type(W) is np.ndarray and X.ndim == 3 and W.ndim == 3
            and (X.dtype == np.float32 or X.dtype == np.float64) and W.dtype == X.dtype
            and (auto_pad == "NOTSET" or auto_pad == "VALID" and not pads)
            and (not dilations or (len(dilations) == 1 and dilations[0] == 1))
            and (not kernel_shape or (len(kernel_shape) == 1 and kernel_shape[0] == W.shape[2]))
            and (not strides or len(strides) == 1)):
        out = _conv1d_small(X, W, B, pads, strides)
        if out is not None:
            return out
    n, ks, st, dl = _prepare(X, W, op, kernel_shape, strides, dilations)
    if X.dtype.kind != "f" and str(X.dtype) != "bfloat16":
        raise TypeError(f"{op}: unsupported input type {X.dtype}")
    pb, pe = conv_pads(auto_pad, pads, X.shape[2:], ks, st, dl, op)
    cd = compute_dtype(X.dtype)
    x, w = X.astype(cd, copy=False), W.astype(cd, copy=False)
    if n == 2:
        out = _conv2d_fast(x, w, B, pb, pe, st, dl, int(group), (W, B))
        if out is not None:
            return out.astype(X.dtype, copy=False)
    out = _conv_core(x, w, pb, pe, st, dl, int(group), op)
    out = _add_bias(out, B, W.shape[0], op)
    return out.astype(X.dtype, copy=False)


def _spec_conv(consts, kwargs):
    """Plan-time form of :func:`conv` for a constant 4-D (or 3-D: :func:`_spec_conv1d`) float weight and a constant
    or absent bias: attributes are checked and parsed once and the pads are remembered per input shape, so a call
    goes straight to the 2-D fast paths (on small convolutions the argument handling cost several times the GEMM).
    Anything unusual -- another dtype or rank, a channel mismatch, a case the fast paths decline -- runs the generic
    kernel, which reports errors as before."""
    if len(consts) < 2:
        return None
    W = consts[1]
    B = consts[2] if len(consts) > 2 else None
    if (type(W) is not np.ndarray or W.ndim not in (3, 4) or W.dtype not in (_F32, _F64) or B is NOT_CONST
            or B is not None and (type(B) is not np.ndarray or B.dtype != W.dtype or B.size != W.shape[0])):
        return None
    auto_pad = text(kwargs.get("auto_pad")) or "NOTSET"
    if W.ndim == 3:
        return _spec_conv1d(W, B, auto_pad, kwargs)
    group = int(kwargs.get("group", 1))
    kernel_shape = kwargs.get("kernel_shape")
    if kernel_shape and list(kernel_shape) != list(W.shape[2:]):
        return None
    st = spatial_attr(kwargs.get("strides"), 2, 1, "Conv", "strides")
    dl = spatial_attr(kwargs.get("dilations"), 2, 1, "Conv", "dilations")
    if min(st) < 1 or min(dl) < 1 or group < 1 or W.shape[1] * group < 1:
        return None
    pads, ks, dt, C = kwargs.get("pads"), list(W.shape[2:]), W.dtype, W.shape[1] * group
    if group == 1 and ks[0] * ks[1] > 1 and max(st) <= 2:
        _conv_packed.register(W)  # (packed on first use, where the packed path applies: _conv2d_fast)
    Bv = None if B is None else B.reshape(-1)
    generic = functools.partial(conv, **kwargs)
    pad_cache: dict = {}

    def run(X, *rest):
        if type(X) is not np.ndarray or X.dtype != dt or X.ndim != 4 or X.shape[1] != C or (rest and (
                rest[0] is not W or len(rest) > 1 and rest[1] is not B)):
            return generic(X, *rest)
        hw = X.shape[2:]
        pp = pad_cache.get(hw)
        if pp is None:
            pp = conv_pads(auto_pad, pads, hw, ks, st, dl, "Conv")
            if len(pad_cache) < 64:
                pad_cache[hw] = pp
        out = _conv2d_fast(X, W, Bv, pp[0], pp[1], st, dl, group, (W, B))
        return out if out is not None else generic(X, *rest)

    M = W.shape[0]

    def into(X, Z):
        """Z += conv(X) in place (ai.onnxpy.ConvAdd's residual, handed over by the executor): the float32 GEMM paths
        accumulate into Z.  None, with Z untouched, when X or Z do not fit (Z must be a C-contiguous writeable
        array of the output's shape and dtype), the convolution is grouped or small (``_ACC_MIN``) or no fast path
        covers the case."""
        if (group != 1 or type(X) is not np.ndarray or X.dtype != dt or X.ndim != 4 or X.shape[1] != C
                or X.shape[0] == 0 or type(Z) is not np.ndarray or Z.dtype != dt or Z.size < _ACC_MIN
                or not Z.flags.c_contiguous or not Z.flags.writeable):
            return None
        hw = X.shape[2:]
        pp = pad_cache.get(hw)
        if pp is None:
            try:
                pp = conv_pads(auto_pad, pads, hw, ks, st, dl, "Conv")
            except ValueError:
                return None
            if len(pad_cache) < 64:
                pad_cache[hw] = pp
        try:
            oshape = conv_out_shape(hw, ks, st, dl, pp[0], pp[1], "Conv")
        except ValueError:
            return None
        if Z.shape != (X.shape[0], M) + tuple(oshape):
            return None
        return _conv2d_fast(X, W, Bv, pp[0], pp[1], st, dl, group, (W, B), out=Z, acc=True)

    run.into = into
    if (ks == [1, 1] and st == [1, 1] and auto_pad in ("NOTSET", "VALID") and not any(pads or ()) and M % group == 0):
        # pointwise: one (grouped) GEMM straight from the input, bias added in place
        w3 = W.reshape(group, M // group, W.shape[1])
        b2 = None if Bv is None else Bv.reshape(M, 1)

        def run1x1(X, *rest):
            if type(X) is not np.ndarray or X.dtype != dt or X.ndim != 4 or X.shape[1] != C or X.shape[0] == 0 or (
                    rest and (rest[0] is not W or len(rest) > 1 and rest[1] is not B)):
                return generic(X, *rest)
            N, _, H, Wd = X.shape
            if H * Wd > 256:  # large planes: the general path folds the bias into the GEMM
                return run(X, *rest)
            out = np.matmul(w3, X.reshape(N, group, C // group, H * Wd))
            if b2 is not None:
                out = out.reshape(N, M, H * Wd)
                out += b2
            return out.reshape(N, M, H, Wd)

        run1x1.into = into
        return run1x1
    return run


conv.specialize = _spec_conv

# Column matrices of the plan-time 1-D path up to this many elements are gathered with one precomputed index
# (small convolutions: streaming audio models run them on a few frames, where argument handling and the slice
# copies cost more than the GEMM); larger ones take the slice-copy path of ``_conv1d_small``.
_CONV1D_GATHER_MAX = 1 << 16


def _spec_conv1d(W, B, auto_pad, kwargs):
    """:func:`_spec_conv` for a 3-D weight (checked there, with the bias), group 1, no dilation: per input shape,
    the column matrix (the bias row of ones included) is one gather from the input with two elements appended (a 0
    that padding taps read and a 1), then one GEMM with the bias-extended filter -- restricted to the taps that
    read the input at that length, and a plain product with the input's columns when one such tap is left."""
    if int(kwargs.get("group", 1)) != 1:
        return None
    M, C, K = W.shape
    kernel_shape, pads = kwargs.get("kernel_shape"), kwargs.get("pads")
    if kernel_shape and list(kernel_shape) != [K] or M == 0 or C == 0 or K == 0:
        return None
    st = spatial_attr(kwargs.get("strides"), 1, 1, "Conv", "strides")
    dl = spatial_attr(kwargs.get("dilations"), 1, 1, "Conv", "dilations")
    if st[0] < 1 or dl != [1]:
        return None
    dt = W.dtype
    wb = np.empty((M, C * K + 1), dt)  # the filter with the bias as a last column
    wb[:, :-1] = W.reshape(M, C * K)
    wb[:, -1] = 0 if B is None else B.reshape(-1)
    wb.flags.writeable = False
    generic = functools.partial(conv, **kwargs)
    plans: dict = {}

    def plan(shape):
        """(filter, gather index, tail) for input shape (N, C, L), or False when the gather path does not apply.
        Taps that read only padding at this length (a 3-tap kernel on a 1-frame input) are left out of both the
        filter and the column matrix; when a single tap remains and it reads a plain column range of the input
        (stride 1, no padding), the index is that range's (start, end) and the tail is the bias column."""
        N, _, L = shape
        pb, pe = conv_pads(auto_pad, pads, (L,), [K], st, dl, "Conv")
        Lp = L + pb[0] + pe[0]
        if min(pb[0], pe[0]) < 0 or Lp < K or N == 0:
            return False
        O = (Lp - K) // st[0] + 1
        if (C * K + 1) * O > _CONV1D_GATHER_MAX:
            return False
        # input position of tap k of output o, per channel; positions outside the input read the appended 0
        pos = np.arange(O)[None, :] * st[0] + np.arange(K)[:, None] - pb[0]  # (K, O)
        inside = (pos >= 0) & (pos < L)
        live = np.flatnonzero(inside.any(axis=1))  # (at least one: every output window holds an input position)
        Kl = len(live)
        wl = wb
        if Kl < K:
            wl = np.ascontiguousarray(np.concatenate(
                (wb[:, :-1].reshape(M, C, K)[:, :, live].reshape(M, C * Kl), wb[:, -1:]), axis=1))
            wl.flags.writeable = False
        if Kl == 1 and inside[live[0]].all() and st[0] == 1:
            a = int(pos[live[0], 0])
            w1 = np.ascontiguousarray(wl[:, :-1])  # (a view would be copied by every product)
            w1.flags.writeable = False
            return w1, (a, a + O), None if B is None else np.ascontiguousarray(wl[:, -1:])
        pos, inside = pos[live], inside[live]
        idx = np.empty((C * Kl + 1, O), np.intp)
        idx[:-1] = np.where(inside[None], np.arange(C)[:, None, None] * L + pos[None], C * L).reshape(C * Kl, O)
        idx[-1] = C * L + 1  # the appended 1: the bias row
        tail = np.zeros((N, 2), dt)
        tail[:, 1] = 1
        return wl, idx, tail

    def run(X, *rest):
        if type(X) is not np.ndarray or X.dtype != dt or X.ndim != 3 or X.shape[1] != C or (rest and (
                rest[0] is not W or len(rest) > 1 and rest[1] is not B)):
            return generic(X, *rest)
        shape = X.shape
        p = plans.get(shape)
        if p is None:
            p = plan(shape)
            if len(plans) < 64:
                plans[shape] = p
        if p is False:
            return generic(X, *rest)
        wl, idx, tail = p
        N = shape[0]
        if idx.__class__ is tuple:  # one live tap over a plain column range: the product straight from X
            a, b = idx
            y = _dot2(wl, X[0, :, a:b]).reshape(1, M, b - a) if N == 1 else np.matmul(wl, X[:, :, a:b])
            if tail is not None:
                y += tail
            return y
        ext = np.concatenate((X.reshape(N, -1), tail), axis=1)
        if N == 1:
            return _dot2(wl, ext.take(idx)).reshape(1, M, idx.shape[1])
        return np.matmul(wl, ext[:, idx])

    def plan_for(shape):
        """The remembered plan for input shape (N, C, L) (see ``plan``): ops that compose the gather with their
        own index map (ai.onnxpy.PadConv) read it."""
        p = plans.get(shape)
        if p is None:
            p = plan(shape)
            if len(plans) < 64:
                plans[shape] = p
        return p

    run.plan_for = plan_for
    return run


def _packed_shape_ok(C: int, M: int, P: int, strides) -> bool:
    """The packed-filter path pays off for these channels, filters, output positions and strides (see the notes at
    ``_PACKED_MAX_TAPS``)."""
    if strides[0] == strides[1] == 1:
        return C >= _PACKED_MIN_C and M >= _PACKED_MIN_M and P >= _PACKED_MIN_P and C * P >= _PACKED_MIN_CP
    return (strides[0] <= 2 and strides[1] <= 2 and C >= _PACKED_STRIDED_MIN_C and M >= _PACKED_STRIDED_MIN_C
            and C * P >= _PACKED_STRIDED_MIN_CP)


def _winograd_3x3(x, w, strides, dilations) -> bool:
    """What both Winograd rules ask first: a 3x3 float32 filter at stride 1, no dilation, float32 input."""
    return (w.shape[2] == w.shape[3] == 3 and strides[0] == strides[1] == 1 and dilations[0] == dilations[1] == 1
            and x.dtype == _F32 and w.dtype == _F32)


def _winograd_ok(x, w, strides, dilations, out_shape) -> bool:
    """A group-1 convolution ``_conv2d_fast`` runs as Winograd F(2x2, 3x3): 3x3, stride 1, no dilation, float32,
    wide layers (VGG's, ResNet's 256/512-channel stages) on mid-size planes (56x56 measured slower)."""
    return (_WINOGRAD and _winograd_3x3(x, w, strides, dilations)
            and x.shape[1] >= _WINOGRAD_MIN_C and w.shape[0] >= _WINOGRAD_MIN_M
            and _WINOGRAD_MIN_P <= out_shape[0] * out_shape[1] <= _WINOGRAD_MAX_P)


def _winograd_wide_ok(x, w, strides, dilations, out_shape) -> bool:
    """A group-1 convolution ``_conv2d_fast`` runs as two-thread Winograd: 3x3, stride 1, no dilation, float32,
    128+ channels and filters on planes of 2500+ positions (VGG-19's 56x56 and 112x112 layers), two BLAS threads
    allowed and OpenBLAS's kernels bound (``_packed.available``: its idle workers then sleep instead of spinning on the
    helper's core)."""
    return (_WINOGRAD_WIDE and _winograd_3x3(x, w, strides, dilations)
            and x.shape[1] >= _WINOGRAD_WIDE_MIN_C and w.shape[0] >= _WINOGRAD_WIDE_MIN_C
            and out_shape[0] * out_shape[1] >= _WINOGRAD_WIDE_MIN_P and _packed._blas_threads() >= 2
            and _packed.available())


def _direct_ok(x, w, out_shape):
    C = x.shape[1]
    M = w.shape[0]
    return (_DIRECT and x.dtype == _F32 and w.dtype == _F32 and C >= _DIRECT_MIN_C and C <= M <= 3 * C
            and out_shape[0] * out_shape[1] >= _DIRECT_MIN_RATIO * C)


def _conv2d_fast(x, w, B, pb, pe, strides, dilations, group, wkey, out=None, acc=False):
    """Fast 2-D paths (bias included) for well-formed float convolutions with non-negative pads; None when the
    case is not covered (the general path then runs, and reports any error).  With ``out`` (an array of the output
    shape and x's dtype, e.g. a channel range of a concatenation) the result is written there and ``out`` is
    returned: the GEMM paths write it directly, the others copy their result in.  With ``acc`` the result is added
    to ``out`` instead (a residual connection): float32 GEMMs accumulate straight into it (BLAS beta = 1), the
    other paths add their result."""
    if acc and not (x.dtype == _F32 and _blas.available()):
        return _into(_conv2d_fast(x, w, B, pb, pe, strides, dilations, group, wkey), out, True)
    if out is not None and not out.flags.c_contiguous:  # (the GEMM paths view ``out`` as matrices)
        res = _conv2d_fast(x, w, B, pb, pe, strides, dilations, group, wkey)
        return _into(res, out, acc)
    N, C, H, W = x.shape
    M, Cg, KH, KW = w.shape
    if (group < 1 or Cg < 1 or C != Cg * group or M % group or min(pb) < 0 or min(pe) < 0 or N == 0 or M == 0
            or H + pb[0] + pe[0] < (KH - 1) * dilations[0] + 1 or W + pb[1] + pe[1] < (KW - 1) * dilations[1] + 1):
        return None
    if B is not None:
        B = np.asarray(B)
        if B.size != M or B.dtype.kind != "f":
            return None
        B = B.astype(x.dtype, copy=False).reshape(M)
    out_shape = conv_out_shape((H, W), (KH, KW), strides, dilations, pb, pe, "Conv")
    if KH == 1 and KW == 1 and not any(pb) and not any(pe):
        if strides[0] > 1 or strides[1] > 1:
            x = np.ascontiguousarray(x[:, :, ::strides[0], ::strides[1]])
        return _conv1x1(x, w, B, group, wkey, out, acc)
    if Cg == 1 and group > 1:
        if M == group:
            res = _depthwise2d_native(x, w, B, pb, strides, dilations, out_shape, out, acc)
        else:  # (several filters per channel)
            res = _conv2d_small_native(x, w, B, group, pb, strides, dilations, out_shape, out, acc)
        if res is not None:
            return res
        P = out_shape[0] * out_shape[1]
        if _dw_axpy_ok(x, w, pb, pe, strides, out_shape, group):  # large planes (PP-OCR's detector)
            return _into(_depthwise2d_axpy(x, w, B, pb, pe, strides, dilations, out_shape), out, acc)
        if (M == group and P <= _DW_SOP_MAX_PLANE and C * (1 if strides[0] == strides[1] == 1 else 2) >= P
                and out_shape[0] >= KH and out_shape[1] >= KW):  # (not where whole tap rows read the padding)
            return _depthwise2d_sop(x, w, B, pb, pe, strides, dilations, out_shape, wkey, out, acc)
        if (M == group and group >= _DW_NHWC_MIN_C and strides[0] == 1 and strides[1] == 1
                and P <= _DW_TINY_PLANE):
            # tiny planes (7x7): per-channel band GEMMs are call overhead; channels-last row-vector passes win
            return _into(_depthwise2d_nhwc(x, w, pb, pe, dilations, out_shape, B), out, acc)
        th = _band_plan(x.shape, w.shape, pb, pe, strides, dilations, out_shape)
        if th is not None:
            return _into(_depthwise2d_band(x, w, B, pb, pe, strides, dilations, out_shape, group, th, wkey), out, acc)
        if strides[0] == 1 and strides[1] == 1:
            if M == group and group >= _DW_NHWC_MIN_C:
                return _into(_depthwise2d_nhwc(x, w, pb, pe, dilations, out_shape, B), out, acc)
            return _into(_depthwise2d_flat(x, w, pb, pe, dilations, out_shape, group, B), out, acc)
        if strides[0] <= 4 and strides[1] <= 4 and prod(out_shape) >= 64:
            return _into(_depthwise2d_strided(x, w, pb, pe, strides, dilations, out_shape, group, B), out, acc)
        return None
    if Cg <= _SMALL_C_MAX and KH * KW > 1:  # (a network's first layer: 3 input channels)
        res = _conv2d_small_native(x, w, B, group, pb, strides, dilations, out_shape, out, acc)
        if res is not None:
            return res
    P = out_shape[0] * out_shape[1]
    wide = group == 1 and _winograd_wide_ok(x, w, strides, dilations, out_shape)
    winograd = wide or group == 1 and _winograd_ok(x, w, strides, dilations, out_shape)
    if (group == 1 and 1 < KH * KW <= _PACKED_MAX_TAPS and wkey[0] is w and x.dtype == _F32
            and _packed_shape_ok(C, M, P, strides) and not (winograd and P > _PACKED_MAX_WINOGRAD_P)):
        pf = _conv_packed.lookup(w)  # (a filter registered at plan time: packed once for OpenBLAS's kernel)
        if pf is not None:
            return _conv_packed.conv2d(x, pf, B, pb, pe, strides, dilations, out_shape, out, acc)
    if winograd:
        # wide 3x3 layers (VGG's, ResNet's 256/512-channel stages): Winograd F(2x2,3x3), 2.25x fewer multiplications;
        # large planes split between two threads
        return _into(winograd_conv2d(x, w, (pb[0], pb[1], pe[0], pe[1]), B,
                                     threads=_packed._blas_threads() if wide else 1), out, acc)
    if (group == 1 and KH * KW > 1 and strides[0] <= 4 and strides[1] <= 4 and _direct_ok(x, w, out_shape)
            and _blas.available()):
        # 64+ channels, C <= M <= 3C, many positions: per-tap BLAS GEMMs straight from the padded image
        return _conv2d_direct(x, w, pb, pe, strides, dilations, out_shape, B, wkey, out, acc)
    if group == 1 and strides[0] == 1 and strides[1] == 1 and KH * KW > 1 and 2 * M <= C and M <= 256:
        # few output channels (DenseNet's growth convolutions, PP-OCR's neck): one GEMM of the tap-stacked filter
        # with the flat image, then the taps' shifted sums (measured 0.64-0.71x the per-tap GEMMs; with M close to
        # C im2col's single GEMM is as fast, and with M > 256 faster)
        if KH * KW * M * (H + pb[0] + pe[0] + 1) * (W + pb[1] + pe[1]) * x.dtype.itemsize <= _STACKED_MAX_BYTES:
            return _into(_conv2d_stacked(x, w, pb, pe, dilations, out_shape, B, wkey, None if acc else out), out, acc)
        # (too large for the stacked products) per-tap GEMMs on the flat image, accumulated in place
        return _into(_conv2d_shifted(x, w, pb, pe, dilations, out_shape, B), out, acc)
    return _conv2d_gemm(x, w, B, pb, pe, strides, dilations, out_shape, group, wkey, out, acc)


def _into(res, out, acc=False):
    """``res`` copied into ``out`` (added to it with ``acc``) when one is given (None stays None: the case was not
    covered)."""
    if out is None or res is None:
        return res
    if acc:
        out += res
    else:
        out[...] = res
    return out


# --------------------------------------------------------------------------------------------- ConvTranspose


def _scatter_cols(cols, kshape, in_shape, strides, dilations, lead):
    """Col2im: cols (*lead, *K, *I) accumulated into the full (uncropped) output (*lead, *F)."""
    full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(strides, in_shape, kshape, dilations)]
    buf = np.zeros(tuple(lead) + tuple(full), dtype=cols.dtype)
    nl = len(lead)
    for kpos in np.ndindex(*kshape):
        sl = tuple(slice(k * d, k * d + s * (i - 1) + 1, s) for k, d, s, i in zip(kpos, dilations, strides, in_shape))
        buf[(slice(None),) * nl + sl] += cols[(slice(None),) * nl + kpos]
    return buf


def _crop(buf, begins, sizes, lead):
    """buf[..., b:b+size] per spatial axis, zero-filling anything outside buf."""
    nl = lead
    src, dst = [], []
    simple = True
    for b, sz, full in zip(begins, sizes, buf.shape[nl:]):
        lo, hi = max(b, 0), min(b + sz, full)
        if lo != b or hi != b + sz:
            simple = False
        src.append(slice(lo, max(lo, hi)))
        dst.append(slice(lo - b, lo - b + max(0, hi - lo)))
    if simple:
        return buf[(slice(None),) * nl + tuple(src)]
    out = np.zeros(buf.shape[:nl] + tuple(sizes), dtype=buf.dtype)
    out[(slice(None),) * nl + tuple(dst)] = buf[(slice(None),) * nl + tuple(src)]
    return out


@kernel("ConvTranspose", since=(1, 11, 22))
def conv_transpose(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                   output_padding=None, output_shape=None, pads=None, strides=None):
    op = "ConvTranspose"
    n, ks, st, dl = _prepare(X, W, op, kernel_shape, strides, dilations)
    group = int(group)
    N, C = X.shape[:2]
    in_shape = list(X.shape[2:])
    if W.shape[0] != C:
        raise ValueError(f"{op}: weight first dim ({W.shape[0]}) must equal input channels ({C})")
    if group < 1 or C % group:
        raise ValueError(f"{op}: input channels ({C}) not divisible by group ({group})")
    Cg = C // group
    Mg = W.shape[1]
    M = Mg * group
    op_pad = spatial_attr(output_padding, n, 0, op, "output_padding")
    auto_pad = text(auto_pad) or "NOTSET"
    eff = [(k - 1) * d + 1 for k, d in zip(ks, dl)]
    natural = [s * (i - 1) + p + e for s, i, p, e in zip(st, in_shape, op_pad, eff)]
    if (output_shape is not None and len(output_shape) > 0) or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is not None and len(output_shape) > 0:
            osh = [int(v) for v in output_shape][-n:]
            if len(osh) != n:
                raise ValueError(f"{op}: output_shape {output_shape} must have {n} spatial values")
            totals = [nat - o for nat, o in zip(natural, osh)]
        else:
            osh = [i * s for i, s in zip(in_shape, st)]
            totals = [max(0, nat - o) for nat, o in zip(natural, osh)]
        # the total padding is split with the odd unit at the end for SAME_UPPER, at the start otherwise
        small = [t // 2 for t in totals]
        big = [t - t // 2 for t in totals]
        pb, pe = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad in ("NOTSET", "VALID"):
        pb, pe = explicit_pads(pads if auto_pad == "NOTSET" else None, n, op)
        osh = [nat - b - e for nat, b, e in zip(natural, pb, pe)]
    else:
        raise ValueError(f"{op}: unsupported auto_pad value {auto_pad!r}")
    if any(o < 0 for o in osh):
        raise ValueError(f"{op}: computed output shape {osh} is negative")
    check_alloc([N, M, *osh], X.dtype, f"{op} output")
    cd = compute_dtype(X.dtype)
    x = X.astype(cd, copy=False)
    w = W.astype(cd, copy=False)
    K = prod(ks)
    P = prod(in_shape)
    if N == 0 or M == 0 or prod(osh) == 0:
        return np.zeros((N, M, *osh), dtype=X.dtype)
    if (_TRANSPOSE_TILES and n == 2 and group == 1 and list(ks) == list(st) and all(d == 1 for d in dl)
            and not any(pb) and not any(pe) and list(osh) == [i * s for i, s in zip(in_shape, st)]):
        return _conv_transpose_tiles(x, w, B, st, op).astype(X.dtype, copy=False)
    wt = w.reshape(group, Cg, Mg * K).transpose(0, 2, 1)  # (G, Mg*K, Cg)
    cols = np.matmul(wt, x.reshape(N, group, Cg, P))  # (N, G, Mg*K, P)
    cols = cols.reshape(N, M, *ks, *in_shape)
    if K == 1 and all(s == 1 for s in st):
        buf = cols.reshape(N, M, *in_shape)
    else:
        buf = _scatter_cols(cols, ks, in_shape, st, dl, (N, M))
    out = _crop(buf, pb, osh, 2)
    out = np.array(out, dtype=cd, copy=True) if not out.flags.owndata else out
    out = _add_bias(out, B, M, op)
    return out.astype(X.dtype, copy=False)


_TRANSPOSE_TILES = True  # test hook: ConvTranspose's non-overlapping path on/off


def _conv_transpose_tiles(x, w, B, st, op):
    """2-D ConvTranspose whose kernel equals its stride (no dilation, padding or output padding, one group): the
    windows tile the output without overlap, so output pixel (i*sh + a, j*sw + b) is input pixel (i, j) times
    W[:, :, a, b].  One GEMM gives every tap's plane -- the filter laid out (sh, sw, M) x C -- and each tap's
    plane is written into its strided place in the output with the bias in the same pass (the general path
    accumulates the taps into a zeroed buffer, then copies and adds the bias: 0.55-0.7x of its time at PP-OCR's
    2x2 upsampling)."""
    N, C, H, W = x.shape
    M = w.shape[1]
    sh, sw = st
    if B is not None:
        B = np.asarray(B)
        if B.size != M:
            raise ValueError(f"{op}: bias has {B.size} values, expected {M}")
        B = B.astype(x.dtype, copy=False).reshape(M, 1, 1)
    wab = np.ascontiguousarray(w.transpose(2, 3, 1, 0)).reshape(sh * sw * M, C)  # rows (a, b, m)
    y = np.empty((N, M, H, sh, W, sw), dtype=x.dtype)
    for n in range(N):
        taps = np.matmul(wab, x[n].reshape(C, H * W)).reshape(sh, sw, M, H, W)
        for a in range(sh):
            for b in range(sw):
                if B is None:
                    y[n, :, :, a, :, b] = taps[a, b]
                else:
                    np.add(taps[a, b], B, out=y[n, :, :, a, :, b])
    return y.reshape(N, M, H * sh, W * sw)


# ------------------------------------------------------------------------------------------ integer convs


def _zero_point(zp, dt, op, name, count=None):
    if zp is None:
        return np.zeros((), dtype=np.float64)
    zp = np.asarray(zp)
    if zp.size != 1 and (count is None or zp.ndim != 1 or zp.size != count):
        raise ValueError(f"{op}: {name} must be a scalar" + (f" or have {count} values" if count else "") +
                         f", got shape {zp.shape}")
    return zp.astype(np.float64)


def _int_conv(x, w, xzp, wzp, pads, auto_pad, strides, dilations, group, kernel_shape, op):
    n, ks, st, dl = _prepare(x, w, op, kernel_shape, strides, dilations)
    M = w.shape[0]
    xf = x.astype(np.float64) - xzp
    wz = wzp.reshape((-1,) + (1,) * (w.ndim - 1)) if wzp.ndim == 1 else wzp
    wf = w.astype(np.float64) - wz
    pb, pe = conv_pads(auto_pad, pads, x.shape[2:], ks, st, dl, op)
    return _conv_core(xf, wf, pb, pe, st, dl, int(group), op), M


@kernel("ConvInteger", since=10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
    op = "ConvInteger"
    check_rank(w, op, "w")
    xzp = _zero_point(x_zero_point, x.dtype, op, "x_zero_point")
    wzp = _zero_point(w_zero_point, w.dtype, op, "w_zero_point", w.shape[0])
    out, _ = _int_conv(x, w, xzp, wzp, pads, auto_pad, strides, dilations, group, kernel_shape, op)
    return out.astype(np.int32)


def _requantize(acc, scale, y_zero_point, out_dtype, axis_len, op):
    """round-half-to-even(acc * scale) + zero point, saturated to the output type."""
    scale = np.asarray(scale, dtype=np.float32)
    if scale.ndim == 1 and scale.size == axis_len and scale.size != 1:
        scale = scale.reshape((1, -1) + (1,) * (acc.ndim - 2))
    y = acc.astype(np.float32) * scale
    y = np.rint(y) + np.asarray(y_zero_point, dtype=np.float32)
    info = np.iinfo(out_dtype)
    return np.clip(y, info.min, info.max).astype(out_dtype)


@kernel("QLinearConv", since=10)
def qlinear_conv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None, *,
                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    op = "QLinearConv"
    check_rank(w, op, "w")
    M = w.shape[0]
    if np.asarray(x_scale).size != 1 or np.asarray(y_scale).size != 1:
        raise ValueError(f"{op}: x_scale and y_scale must be scalars")
    ws = np.asarray(w_scale, dtype=np.float32)
    if ws.size not in (1, M):
        raise ValueError(f"{op}: w_scale must be a scalar or have {M} values, got shape {ws.shape}")
    xzp = _zero_point(x_zero_point, x.dtype, op, "x_zero_point")
    wzp = _zero_point(w_zero_point, w.dtype, op, "w_zero_point", M)
    acc, _ = _int_conv(x, w, xzp, wzp, pads, auto_pad, strides, dilations, group, kernel_shape, op)
    if B is not None:
        acc = _add_bias(acc, np.asarray(B).astype(np.float64), M, op)
    out_dtype = np.asarray(y_zero_point).dtype if y_zero_point is not None else x.dtype
    if out_dtype.kind not in "iu":
        out_dtype = x.dtype
    scale = (np.float32(np.asarray(x_scale, dtype=np.float32).reshape(())) * ws.reshape(-1)
             / np.float32(np.asarray(y_scale, dtype=np.float32).reshape(())))
    scale = scale.astype(np.float32)
    if scale.size == 1:
        scale = scale.reshape(())
    yzp = np.asarray(y_zero_point if y_zero_point is not None else 0).reshape(())
    return _requantize(acc, scale, yzp, out_dtype, M, op)


# --------------------------------------------------------------------------------------------- DeformConv


def _sample_linear(xg, pos, in_shape):
    """N-linear sampling with zeros outside.  xg: (N, G, Cg, *S); pos: (N, G, n, *Q) -> (N, G, Cg, *Q)."""
    N, G, Cg = xg.shape[:3]
    n = len(in_shape)
    Q = pos.shape[3:]
    flat = xg.reshape(N * G, Cg, prod(in_shape)).transpose(0, 2, 1)  # (NG, S, Cg)
    pos = pos.reshape(N * G, n, -1)
    lo = np.floor(pos)
    frac = pos - lo
    lo = lo.astype(np.int64)
    out = np.zeros((N * G, pos.shape[2], Cg), dtype=xg.dtype)
    bidx = np.arange(N * G)[:, None]
    for corner in np.ndindex(*(2,) * n):
        idx = np.zeros((N * G, pos.shape[2]), dtype=np.int64)
        wgt = np.ones((N * G, pos.shape[2]), dtype=xg.dtype)
        valid = np.ones((N * G, pos.shape[2]), dtype=bool)
        for a in range(n):
            ia = lo[:, a] + corner[a]
            valid &= (ia >= 0) & (ia < in_shape[a])
            idx = idx * in_shape[a] + np.clip(ia, 0, in_shape[a] - 1)
            wgt = wgt * (frac[:, a] if corner[a] else 1 - frac[:, a])
        wgt = np.where(valid, wgt, 0)
        out += flat[bidx, idx] * wgt[..., None]
    return out.transpose(0, 2, 1).reshape(N, G, Cg, *Q)


@kernel("DeformConv", since=(19, 22))
def deform_conv(X, W, offset, B=None, mask=None, *, dilations=None, group=1, kernel_shape=None, offset_group=1,
                pads=None, strides=None):
    op = "DeformConv"
    n, ks, st, dl = _prepare(X, W, op, kernel_shape, strides, dilations)
    group, offset_group = int(group), int(offset_group)
    N, C = X.shape[:2]
    in_shape = list(X.shape[2:])
    M = W.shape[0]
    pb, pe = explicit_pads(pads, n, op)
    out_shape = conv_out_shape(in_shape, ks, st, dl, pb, pe, op)
    K = prod(ks)
    if offset_group < 1 or C % offset_group:
        raise ValueError(f"{op}: channels ({C}) not divisible by offset_group ({offset_group})")
    if group < 1 or C != W.shape[1] * group or M % group:
        raise ValueError(f"{op}: channel/group mismatch (C={C}, W={W.shape}, group={group})")
    exp_off = (N, offset_group * n * K, *out_shape)
    if tuple(offset.shape) != exp_off:
        raise ValueError(f"{op}: offset shape {offset.shape}, expected {exp_off}")
    cd = compute_dtype(X.dtype)
    x = X.astype(cd, copy=False)
    off = offset.astype(cd, copy=False).reshape(N, offset_group, K, n, *out_shape)
    # base sampling positions: o*s - pb + k*d, shape (K, n, *O)
    grids = np.meshgrid(*[np.arange(o) for o in out_shape], indexing="ij")
    base = np.empty((K, n, *out_shape), dtype=cd)
    for kidx, kpos in enumerate(np.ndindex(*ks)):
        for a in range(n):
            base[kidx, a] = grids[a] * st[a] - pb[a] + kpos[a] * dl[a]
    pos = base[None, None] + off  # (N, OG, K, n, *O)
    pos = np.moveaxis(pos, 3, 2)  # (N, OG, n, K, *O)
    xg = x.reshape(N, offset_group, C // offset_group, *in_shape)
    sampled = _sample_linear(xg, pos, in_shape)  # (N, OG, Cog, K, *O)
    if mask is not None:
        exp_mask = (N, offset_group * K, *out_shape)
        if tuple(mask.shape) != exp_mask:
            raise ValueError(f"{op}: mask shape {mask.shape}, expected {exp_mask}")
        sampled = sampled * mask.astype(cd, copy=False).reshape(N, offset_group, 1, K, *out_shape)
    P = prod(out_shape)
    cols = sampled.reshape(N, group, (C // group) * K, P)
    wmat = W.astype(cd, copy=False).reshape(group, M // group, (C // group) * K)
    out = np.matmul(wmat, cols).reshape(N, M, *out_shape)
    out = _add_bias(out, B, M, op)
    return out.astype(X.dtype, copy=False)


# ------------------------------------------------------------------------------------------------- Col2Im


@kernel("Col2Im", since=18)
def col2im(input, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    op = "Col2Im"
    x = np.asarray(input)
    if x.ndim != 3:
        raise ValueError(f"{op}: input must be 3-D (N, C*prod(block_shape), L), got shape {x.shape}")
    img = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    blk = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    n = len(img)
    if len(blk) != n:
        raise ValueError(f"{op}: image_shape and block_shape lengths differ ({n} vs {len(blk)})")
    st = spatial_attr(strides, n, 1, op, "strides")
    dl = spatial_attr(dilations, n, 1, op, "dilations")
    pb, pe = explicit_pads(pads, n, op)
    K = prod(blk)
    N, CK, L = x.shape
    if K == 0 or CK % K:
        raise ValueError(f"{op}: input dim 1 ({CK}) not divisible by prod(block_shape) ({K})")
    C = CK // K
    check_alloc([N, C, *img], x.dtype, f"{op} output")
    blocks = [(i + b + e - ((k - 1) * d + 1)) // s + 1 for i, b, e, k, d, s in zip(img, pb, pe, blk, dl, st)]
    if prod(blocks) != L:
        raise ValueError(f"{op}: input has {L} blocks, expected {prod(blocks)} for image_shape {img}")
    cols = x.reshape(N, C, *blk, *blocks)
    buf = _scatter_cols(cols, blk, blocks, st, dl, (N, C))
    out = _crop(buf, pb, img, 2)
    return np.ascontiguousarray(out).astype(x.dtype, copy=False)
