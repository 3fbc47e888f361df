"""Winograd F(2x2, 3x3) convolution for 3x3, stride-1, dilation-1, group-1 2-D convolutions.

Each output 2x2 tile is computed from a 4x4 input tile d as  Y = A^T [(G g G^T) * (B^T d B)] A,  so the 9 multiply-
adds per output pixel and channel pair of a direct convolution become 4 (16 per 2x2 tile): the channel reduction is
16 GEMMs  U[k] (M x C) @ V[k] (C x tiles)  run as one batched matmul, and the transforms are additions only.

Layout trick: the zero-padded input is split into its 4 stride-2 phases (row parity a, column parity b), each a flat
(C, Hq * Wq) plane.  Element (r, c) of tile (i, j) is then phase (r % 2, c % 2) at flat offset (i + r // 2) * Wq +
j + c // 2, so every transform step is a whole-plane add/subtract of two contiguous slices at fixed offsets; tiles
are indexed i * Wq + j with one spare (garbage) column per tile row, which is dropped when the output is written.
"""

from __future__ import annotations


import numpy as np

from ._wcache import derived

__all__ = ["winograd_conv2d", "winograd_supported"]

# F(2x2, 3x3) filter transform.
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

# Bytes of the per-block working set (transformed input + GEMM output); blocks are whole rows of tiles.
_BLOCK_BYTES = 1 << 21
# Fewest tile positions per block (keeps the 16 GEMMs wide enough to run at BLAS speed).
_MIN_BLOCK_TILES = 256

# Transformed filters of constant (read-only) weights: id(w) -> (weakref(w), U).


def winograd_supported(x, w, pads) -> bool:
    """True when ``winograd_conv2d`` handles these operands (float32/float64 4-D, 3x3 filter, same dtype, group 1,
    non-negative pads giving a non-empty output)."""
    if type(x) is not np.ndarray or type(w) is not np.ndarray or x.ndim != 4 or w.ndim != 4:
        return False
    if x.dtype != w.dtype or x.dtype not in (np.float32, np.float64):
        return False
    if w.shape[2:] != (3, 3) or w.shape[1] != x.shape[1] or 0 in x.shape or w.shape[0] == 0:
        return False
    if len(pads) != 4 or min(pads) < 0:
        return False
    return x.shape[2] + pads[0] + pads[2] >= 3 and x.shape[3] + pads[1] + pads[3] >= 3


def _transform_filter(w):
    """U = G g G^T for every (m, c) filter, as (16, M, C) C-contiguous (component k = 4 * row + column)."""
    M, C = w.shape[:2]
    u = np.einsum("ka,mcab,lb->klmc", _G, w.astype(np.float64), _G, optimize=True)
    return np.ascontiguousarray(u.reshape(16, M, C), dtype=w.dtype)


def _filter(w):
    """Transformed filter, cached while ``w`` is a frozen (read-only, unaliased) array; never for writeable ones."""
    return derived(("winograd",), (w,), lambda: _transform_filter(w))


def _phase_block(dst, x, n, pads, q0, Wq):
    """Fill dst (2, 2, C, R, Wq) with rows q0 .. q0 + R - 1 of the stride-2 phases of the zero-padded x[n]: phase
    (a, b) row q, column p is padded pixel (2q + a, 2p + b), i.e. x[n, :, 2q + a - top, 2p + b - left] (0 outside)."""
    C, H, W = x.shape[1:]
    pt, pl = pads
    R = dst.shape[3]
    for a in range(2):
        # phase rows q with 0 <= 2q + a - pt < H
        qa = max(q0, -(-(pt - a) // 2))
        qb = min(q0 + R, (H - 1 + pt - a) // 2 + 1)
        for b in range(2):
            d = dst[a, b]
            pa = max(0, -(-(pl - b) // 2))
            pb_ = min(Wq, (W - 1 + pl - b) // 2 + 1)
            if qb <= qa or pb_ <= pa:
                d.fill(0)
                continue
            if qa > q0:
                d[:, :qa - q0].fill(0)
            if qb < q0 + R:
                d[:, qb - q0:].fill(0)
            rows = d[:, qa - q0:qb - q0]
            if pa > 0:
                rows[:, :, :pa].fill(0)
            if pb_ < Wq:
                rows[:, :, pb_:].fill(0)
            h0, w0 = 2 * qa + a - pt, 2 * pa + b - pl
            rows[:, :, pa:pb_] = x[n, :, h0:h0 + 2 * (qb - qa) - 1:2, w0:w0 + 2 * (pb_ - pa) - 1:2]


def _block_rows(C, M, th, Wq, itemsize):
    """Tile rows per block: the (16, C) transformed input and (16, M) GEMM output of a block in ~_BLOCK_BYTES,
    with at least _MIN_BLOCK_TILES tiles."""
    per_row = 16 * (C + M) * Wq * itemsize
    rows = max(_BLOCK_BYTES // max(1, per_row), -(-_MIN_BLOCK_TILES // Wq), 1)
    return min(th, rows)


def winograd_conv2d(x, w, pads, bias=None, *, block_rows=None, threads=1):
    """3x3 stride-1 convolution (cross-correlation, as ONNX Conv) of x (N, C, H, W) with w (M, C, 3, 3).

    ``pads`` = (top, left, bottom, right), non-negative; ``bias`` (M,) or None.  x and w float32 (or both float64);
    returns (N, M, H + top + bottom - 2, W + left + right - 2) C-contiguous in x's dtype.  With ``threads`` > 1 the
    tile rows are split between the calling thread and the GEMM helper threads, each running its blocks' transforms
    and products with OpenBLAS held to one thread (``_packed.run_ranges``; one thread when the helpers are
    busy)."""
    N, C, H, W = x.shape
    M = w.shape[0]
    dt = x.dtype
    pt, pl, pb, pr = (int(p) for p in pads)
    Ho, Wo = H + pt + pb - 2, W + pl + pr - 2
    th, tw = (Ho + 1) // 2, (Wo + 1) // 2
    Wq = tw + 1
    U = _filter(w)
    out = np.empty((N, M, Ho, Wo), dtype=dt)
    rb = block_rows or _block_rows(C, M, th, Wq, dt.itemsize)
    bcol = None if bias is None else np.asarray(bias, dtype=dt).reshape(M, 1)
    args = (x, U, out, bcol, (pt, pl), Wq, rb)
    if threads > 1:
        from . import _packed

        if _packed.run_ranges(_tile_rows, th, threads, *args):
            return out
    _tile_rows(0, th, *args)
    return out


def _tile_rows(t0, t1, x, U, out, bcol, pads, Wq, rb):
    """Tile rows [t0, t1) of every image of ``winograd_conv2d``, in blocks of ``rb`` tile rows, into ``out``."""
    C = x.shape[1]
    M = U.shape[1]
    Ho, Wo = out.shape[2:]
    dt = x.dtype
    rb = max(1, min(rb, t1 - t0))
    Tmax = rb * Wq
    # scratch, reused by every block
    p_buf = np.empty((2, 2, C, rb + 2, Wq), dtype=dt)
    pf = p_buf.reshape(2, 2, C, (rb + 2) * Wq)
    r_buf = np.empty((2, C, Tmax + 1), dtype=dt)
    v_buf = np.empty(16 * C * Tmax, dtype=dt)
    m_buf = np.empty(16 * M * Tmax, dtype=dt)
    s_buf = np.empty((4, M * Tmax), dtype=dt)
    t_buf = np.empty(M * Tmax, dtype=dt)
    add, sub = np.add, np.subtract
    for n in range(x.shape[0]):
        for i0 in range(t0, t1, rb):
            i1 = min(t1, i0 + rb)
            T = (i1 - i0) * Wq
            L = T + 1
            _phase_block(p_buf[:, :, :, :i1 - i0 + 2], x, n, pads, i0, Wq)
            V = v_buf[:16 * C * T].reshape(16, C, T)
            r0, r1 = r_buf[0, :, :L], r_buf[1, :, :L]
            for k in range(4):
                # row transform (B^T d), row k, for both column phases (one extra column for the column shift)
                for b, rk in ((0, r0), (1, r1)):
                    q0, q1 = pf[0, b], pf[1, b]
                    if k == 0:
                        sub(q0[:, :L], q0[:, Wq:Wq + L], out=rk)
                    elif k == 1:
                        add(q1[:, :L], q0[:, Wq:Wq + L], out=rk)
                    elif k == 2:
                        sub(q0[:, Wq:Wq + L], q1[:, :L], out=rk)
                    else:
                        sub(q1[:, :L], q1[:, Wq:Wq + L], out=rk)
                # column transform (... B) into V[4k .. 4k + 3]  (C, T)
                e0, e1, e2, e3 = r0[:, :T], r1[:, :T], r0[:, 1:], r1[:, 1:]
                sub(e0, e2, out=V[4 * k])
                add(e1, e2, out=V[4 * k + 1])
                sub(e2, e1, out=V[4 * k + 2])
                sub(e1, e3, out=V[4 * k + 3])
            Mt = m_buf[:16 * M * T].reshape(16, M, T)
            np.matmul(U, V, out=Mt)
            if bcol is not None:
                Mt[5] += bcol  # component (1, 1) reaches all four outputs of a tile with weight 1
            # output transform: s[l] = sum_k A^T[p, k] m[k, l] for output row parity p, then
            # y[p, q] = sum_l s[l] A^T[q, l], written to the output's (p, q) phase
            S = s_buf[:, :M * T].reshape(4, M, T)
            tmp = t_buf[:M * T].reshape(M, T)
            o = out[n]
            for p in range(2):
                rlo = 2 * i0 + p
                nr = (min(Ho, 2 * i1) - rlo + 1) // 2
                if nr <= 0:
                    continue
                for col in range(4):
                    if p == 0:
                        add(Mt[col], Mt[4 + col], out=S[col])
                        add(S[col], Mt[8 + col], out=S[col])
                    else:
                        sub(Mt[4 + col], Mt[8 + col], out=S[col])
                        sub(S[col], Mt[12 + col], out=S[col])
                for q in range(2):
                    nc = (Wo - q + 1) // 2
                    dst = o[:, rlo:rlo + 2 * nr - 1:2, q:q + 2 * nc - 1:2]
                    if q == 0:
                        add(S[0], S[1], out=tmp)
                        third, op = S[2], add
                    else:
                        sub(S[1], S[2], out=tmp)
                        third, op = S[3], sub
                    op(tmp.reshape(M, i1 - i0, Wq)[:, :nr, :nc], third.reshape(M, i1 - i0, Wq)[:, :nr, :nc],
                       out=dst)
