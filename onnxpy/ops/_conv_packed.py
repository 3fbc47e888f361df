"""Float32 2-D convolutions on OpenBLAS's micro-kernel, the filter packed once (see ``_packed``).

The direct path of ``conv.py`` (``_conv2d_direct``) runs one BLAS GEMM per filter tap over the flat zero-padded
image: OpenBLAS packs both operands on every call -- the tap's (M, C) filter slice and the image window -- and
threads each call on its own, waking its worker thread for every one of the KH * KW * row-block GEMMs.  Here the
filter's taps are packed once, as the kernel's right-hand operand (``sgemm_oncopy``: (C, M) per tap, in depth chunks
of at most 384 channels), and a convolution splits its output rows between the calling thread and the GEMM helper
thread (``_packed.run_ranges``): each thread takes its rows in blocks of whole padded rows, starts the block's
accumulator from the bias (or the residual), and for every tap packs the window (``sgemm_itcopy``: positions x
channels, straight from the image with the channel stride as its leading dimension) and calls the kernel into the
accumulator, which stays in cache across the taps; the block's spare columns are cropped as it is copied out.
Strided convolutions read the image's stride phases (``conv._polyphase``) the same way, each tap a window of one.

Measured on VGG-19's and ResNet's layer shapes (stride 1, 3x3, in-process, interleaved): 0.73-0.95x the direct
path's time (64 -> 64 channels on 224x224 0.82-0.84x, 128 on 112x112 0.85x, 256 on 56x56 0.95x, 64 -> 128 on
112x112 0.80x, 128 on 28x28 0.81x; stride 2: ResNet-50's 128-512 channel layers 0.86-0.87x).

Used for the shapes ``conv._packed_shape_ok`` admits, on filters registered at plan time (``register``: the
session allows prepacking, see ``_packed.prepacking``) and only once the kernels are bound (``_packed.available``).
"""

from __future__ import annotations

import numpy as np

from . import _native, _packed

__all__ = ["PackedFilter", "conv2d", "lookup", "register"]

_F32 = np.dtype(np.float32)
# Depth chunk (channels per kernel call): as the GEMM weights' (``_packed._Q``).
_Q = 384
# Floats of packed window per block (positions x channels): 512 KiB, so the window and the accumulator stay in L2
# (measured: 64K-128K floats alike; 32K 4-10% slower on 64-256 channels).
_A_FLOATS = 1 << 17
# Floats of accumulator per block at most (1 MiB).
_C_FLOATS = 1 << 18

_ON = True  # test hook: the packed path on/off
# Where the native kernels are used, each tap's window is multiplied straight from the image (``sgemm_kernel_a``:
# positions contiguous, channels a plane apart) instead of being packed first; the same sums in the same order
# (test and measurement hook)
DIRECT = True
_T = 0  # test hook: threads (0: the BLAS thread count)
# A registered filter has an entry in ``_packed``'s table of packed constants (keyed by the array, dropped with it):
# "filter" -> its PackedFilter, None until first use.


class PackedFilter:
    """A (M, C, KH, KW) float32 filter as KH * KW taps, each tap's (C, M) matrix packed for the kernel's right-hand
    operand in depth chunks (``kc`` channels from ``c0``); ``taps[t][j]`` is the address of tap t's chunk j."""

    __slots__ = ("M", "C", "KH", "KW", "kc", "c0", "taps", "buf", "__weakref__")

    def __init__(self, w: np.ndarray):
        M, C, KH, KW = w.shape
        oncopy = _packed._state[0][1]
        nc = -(-C // _Q)
        self.c0 = tuple(C * j // nc for j in range(nc))
        self.kc = tuple(C * (j + 1) // nc - C * j // nc for j in range(nc))
        wt = np.ascontiguousarray(w.transpose(2, 3, 0, 1), dtype=_F32).reshape(KH * KW, M, C)
        sizes = [-(-(k * M + 64) // 16) * 16 for k in self.kc]
        per = sum(sizes)
        self.buf = buf = _packed._aligned(per * KH * KW)
        taps = []
        for t in range(KH * KW):
            addr = buf.ctypes.data + 4 * t * per
            chunk = []
            for k, c0, size in zip(self.kc, self.c0, sizes):
                oncopy(k, M, wt[t].ctypes.data + 4 * c0, C, addr)
                chunk.append(addr)
                addr += 4 * size
            taps.append(tuple(chunk))
        self.taps = tuple(taps)
        self.M, self.C, self.KH, self.KW = M, C, KH, KW


def register(w) -> None:
    """Mark the constant filter ``w`` (a read-only float32 (M, C, KH, KW) array) as one the convolutions may pack,
    when this thread's plans pack weights (``_packed.prepacking``) and packing is not turned off."""
    if (type(w) is not np.ndarray or w.dtype != _F32 or w.ndim != 4 or w.flags.writeable
            or getattr(_packed._local, "off", False) or not _packed.enabled()):
        return
    with _packed._lock:
        if _packed._entry(w) is None:
            _packed._remember(w, {"filter": None})


def lookup(w) -> PackedFilter | None:
    """The packed form of a registered filter ``w`` (packed on first use), or None: not registered, or the kernels
    cannot be bound."""
    table = _packed._entry(w) if _ON else None
    if table is None or "filter" not in table:
        return None
    pf = table["filter"]
    if pf is None:
        if not _packed.available():
            return None
        with _packed._lock:
            pf = table["filter"]
            if pf is None:
                pf = table["filter"] = PackedFilter(w)
    return pf


def start_from_residual(c3: np.ndarray, res: np.ndarray, B) -> None:
    """A block accumulator (M, h, Wp) over padded rows set to the residual ``res`` (M, h, Wo) plus the bias ((M,) or
    None), its spare columns (cropped later) to zero."""
    Wo = res.shape[2]
    if B is not None:
        np.add(res, B.reshape(-1, 1, 1), out=c3[:, :, :Wo])
    else:
        c3[:, :, :Wo] = res
    c3[:, :, Wo:] = 0


def _rows(r0, r1, srcs, L, Wr, pf, B, out, Wo, acc, rows_b):
    """Output rows [r0, r1) of every image: per block of rows, the accumulator from the bias (or the residual in
    ``out``), then for each tap and depth chunk the packed window times the packed filter, then the crop into
    ``out``.  Tap t reads ``srcs[t] = (array (N, C, L), offset)``: rows ``Wr`` wide, ``L`` elements per channel."""
    itcopy, _, kern = _packed._state[0][:3]
    kern_a = _native.function("sgemm_kernel_a") if DIRECT else None
    M, kcs, c0s = pf.M, pf.kc, pf.c0
    N = out.shape[0]
    cap = rows_b * Wr
    abuf = _packed._aligned(max(kcs) * cap)
    ab = abuf.ctypes.data
    acc_buf = np.empty((M, cap), dtype=_F32)
    cp = acc_buf.ctypes.data
    Bc = None if B is None else B.reshape(M, 1)
    for n in range(N):
        bases = [(a.ctypes.data + 4 * n * pf.C * L, off) for a, off in srcs]
        for q0 in range(r0, r1, rows_b):
            h = min(rows_b, r1 - q0)
            mb = h * Wr
            c = acc_buf[:, :mb]
            c3 = c.reshape(M, h, Wr)
            if acc:
                start_from_residual(c3, out[n, :, q0:q0 + h], B)
            elif Bc is not None:
                np.copyto(c, Bc)
            else:
                c.fill(0)
            p0 = q0 * Wr
            for t, (base, off) in enumerate(bases):
                chunks = pf.taps[t]
                for j, k in enumerate(kcs):
                    if kern_a is not None:  # (the window read in place: no packed copy, the same sums)
                        kern_a(mb, M, k, 1.0, base + 4 * (c0s[j] * L + off + p0), L, chunks[j], cp, cap)
                        continue
                    itcopy(k, mb, base + 4 * (c0s[j] * L + off + p0), L, ab)
                    kern(mb, M, k, 1.0, ab, chunks[j], cp, cap)
            out[n, :, q0:q0 + h] = c3[:, :, :Wo]


def conv2d(x, pf: PackedFilter, B, pb, pe, strides, dilations, out_shape, out=None, acc=False):
    """Convolution of float32 ``x`` (N, C, H, W) with the packed filter, bias ``B`` ((M,) float32 or None), pads
    ``pb``/``pe`` (non-negative), ``strides`` and ``dilations``: a fresh (N, M, Ho, Wo) array, or ``out``
    (C-contiguous, that shape) filled -- or, with ``acc``, added to.  Stride 1 reads the flat zero-padded image
    (one spare row: the last taps' windows run into it); larger strides its stride phases (``conv._polyphase``),
    each tap a window of one phase."""
    N = x.shape[0]
    M = pf.M
    Ho, Wo = out_shape
    (sh, sw), (dh, dw) = strides, dilations
    from .conv import _flat_padded, _phase_taps, _polyphase

    if sh == sw == 1:
        xf, Wr = _flat_padded(x, pb, pe)
        L = xf.shape[-1]
        srcs = [(xf, i * dh * Wr + j * dw) for i in range(pf.KH) for j in range(pf.KW)]
    else:
        ph, Wr = _polyphase(x, pb, pe, sh, sw)
        L = ph.shape[-1]
        srcs = [(ph[p], qi * Wr + qj) for p, qi, qj in _phase_taps(pf.KH, pf.KW, strides, dilations)]
    if out is None:
        out = np.empty((N, M, Ho, Wo), dtype=_F32)
    T = max(1, min(_T or _packed._blas_threads(), Ho))
    rows_b = max(1, min(-(-Ho // T), _A_FLOATS // (max(pf.kc) * Wr), _C_FLOATS // (M * Wr)))
    args = (srcs, L, Wr, pf, B, out, Wo, acc, rows_b)
    if not _packed.run_ranges(_rows, Ho, T, *args, single_blas=False):
        _rows(0, Ho, *args)  # (one thread, or the helpers busy: the same blocks' results, rows in one range)
    return out
