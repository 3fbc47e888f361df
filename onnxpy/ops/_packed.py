"""Constant GEMM weights packed once for OpenBLAS's micro-kernel (onnxruntime's MLAS prepacks its weights the same way).

``np.matmul`` hands OpenBLAS both operands on every call, and OpenBLAS copies ("packs") blocks of each into the
layout its micro-kernel reads before multiplying them.  For a transformer's constant weights that copy is repeated on
every run and reads the weight from memory at a slower rate than the kernel would: measured on weights out of cache
(128 x 768 activations), OpenBLAS's threaded ``sgemm`` ran at 150-175 GFLOP/s where its own kernel over weights
packed in advance ran at 179-204.  So a constant float32 weight of a MatMul-family node is packed at plan time with
OpenBLAS's own packing routine (``sgemm_itcopy_<core>``, the layout of the core OpenBLAS selected), the original is
released (see ``plan.py``: the packed copy replaces it, so memory does not grow), and each product packs only the
activations (``sgemm_oncopy_<core>``) and calls the micro-kernel (``sgemm_kernel_<core>``, or onnxpy's own AVX-512 one
over the same operands where the CPU has it, see ``_native.py``) per block of weight rows, the blocks shared between
the calling thread and helper threads (ctypes releases the GIL during each call).

OpenBLAS's idle worker threads spin for ~2^28 cycles after each call before they sleep; spinning, the worker holds
the core a helper thread needs (measured: products 1.5x slower than with one thread).  Before the first weight is
packed, OpenBLAS's threads are therefore restarted with the shortest idle timeout (``OPENBLAS_THREAD_TIMEOUT=4``, which
onnxpy sets for the restart only); that is done only while no other Python thread exists (no BLAS call can be in
flight), and only once per process (a timeout the user set is left alone).  Measured on the corpus's convolutional
models the shorter timeout is neutral (0.98-1.01x).

Bound only where it is known to hold: numpy's own OpenBLAS, a dynamic-architecture build with pthreads, Linux on
x86-64, its core's routines exported (``itcopy``/``incopy`` for C- and Fortran-ordered weights, ``oncopy``,
``kernel``), and products of odd sizes checked against numpy (both packings, the kernel and the threads together).
``ONNXPY_PACKED_GEMM=0`` turns it off.  Weights with a NaN or an infinity are not packed (the identity product that
recovers a released weight for an unusual call would turn them into NaN).

The same kernels multiply attention's per-head products (``stacked_matmul``: both operands packed per call, the heads
split between threads), where OpenBLAS would otherwise wake its sleeping worker for every product it threads.
"""

from __future__ import annotations

import ctypes
import os
import platform
import queue
import sys
import threading
import weakref

import numpy as np

from . import _blas, _native

__all__ = ["available", "bound", "enabled", "matmul", "matmul_rows", "matmul_split", "matmul_ksplit", "out_pitch",
           "pack", "prepack_enabled", "prepacking", "real", "run_ranges", "split_cut", "split_matmul", "stacked_matmul",
           "standin", "will_pack", "PackedWeight"]

_F32 = np.dtype(np.float32)
# Weight rows (output features) and depth per kernel call: a 128 x 384 block (192 KiB) stays in L2 while the
# activations' packed panel streams through it.
_P = 128
_Q = 384
# Activation rows per pass over the packed weight (the packed activations, rows x 384, stay in L2).
_R = 256
# Weights with fewer elements keep numpy's products (the per-call overhead of a few kernel calls would dominate).
_MIN_ELEMENTS = 1 << 16
# Products with fewer multiply-adds run on the calling thread alone.
_MIN_PARALLEL = 1 << 20
# Products with fewer rows call the kernel once per depth block over a long run of features (see ``_spans``).
# With one row the packed product takes ~2x numpy's matrix-vector product on a weight in cache (1024 x 1000: 89 vs
# 40 us; classifier heads are therefore left unpacked, see plan.py) and 1.0-1.1x on weights out of cache, as in
# token-by-token decoding (768 x 3072: 338 vs 310 us); from 4 rows on it is 2-2.3x faster than numpy's.
_FEW_ROWS = 16
_ALIGN = 4096

_lock = threading.Lock()
_local = threading.local()  # .off: plans built on this thread leave weights unpacked (session.disable_prepacking)
_state: list = [None]  # None: not tried; "retry": try again later; False: unavailable; else _bind's routines


def _bind():
    """(itcopy, oncopy, kernel, incopy, otcopy, OpenBLAS's kernel) of the core numpy's OpenBLAS runs (the kernel
    used is onnxpy's own where it runs, see ``_native.py``); "retry" when OpenBLAS's threads cannot be quieted now;
    None when the kernels cannot be used."""
    if not enabled():
        return None
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    lib = _blas.library()
    if lib is None:
        return None
    cfg = _blas.openblas_info(lib, "get_config", ctypes.c_char_p) or b""
    core = (_blas.openblas_info(lib, "get_corename", ctypes.c_char_p) or b"").decode("ascii", "replace")
    if (b"OpenBLAS" not in cfg or b"DYNAMIC_ARCH" not in cfg or not core.isalnum()
            or _blas.openblas_info(lib, "get_parallel", ctypes.c_int) != 1):  # (1: pthreads)
        return None
    suffix = core.upper()
    fns = [getattr(lib, f"sgemm_{r}_{suffix}", None) for r in ("itcopy", "oncopy", "kernel", "incopy", "otcopy")]
    if any(f is None for f in fns):
        return None
    L, P = ctypes.c_int64, ctypes.c_void_p  # (BLASLONG is a C long: 64 bits on Linux x86-64)
    itcopy, oncopy, kern, incopy, otcopy = fns
    for f in (itcopy, oncopy, incopy, otcopy):
        f.argtypes = [L, L, P, L, P]
        f.restype = ctypes.c_int
    kern.restype = ctypes.c_int
    kern.argtypes = [L, L, L, ctypes.c_float, P, P, P, L]
    quiet = _quiet_threads(lib)
    if not quiet:
        return "retry" if quiet is None else None
    # (onnxpy's own AVX-512 kernel where it runs: same operands, same bits, faster; see _native.py)
    return itcopy, oncopy, _native.sgemm_kernel() or kern, incopy, otcopy, kern


def _quiet_threads(lib):
    """Restart OpenBLAS's worker threads with the shortest idle timeout (see the module notes): True when done (or
    set by the user), None when it cannot be done now (another Python thread exists), False when it cannot be done
    (the entry points are missing)."""
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ or "GOTO_THREAD_TIMEOUT" in os.environ:
        return True  # the user's setting stands
    names = ("openblas_read_env", "blas_thread_shutdown_", "blas_thread_init")
    fns = [getattr(lib, n, None) for n in names]
    if any(f is None for f in fns):
        return False
    if threading.active_count() != 1:
        return None  # (not now: another thread might be inside OpenBLAS; a later session may try again)
    read_env, shutdown, init = fns
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"
    try:
        read_env()
        shutdown()
        init()
    finally:
        del os.environ["OPENBLAS_THREAD_TIMEOUT"]
        read_env()
    return True


def enabled() -> bool:
    """False when packing is turned off (``ONNXPY_PACKED_GEMM=0``) or known to be unavailable; asks nothing of
    OpenBLAS (``available`` binds the kernels)."""
    return _state[0] is not False and os.environ.get("ONNXPY_PACKED_GEMM", "1") != "0"


def available() -> bool:
    """True when weights can be packed (bound, threads quieted, self-test passed)."""
    if _state[0] is None or _state[0] == "retry":
        with _lock:
            if _state[0] is None or _state[0] == "retry":
                fns = None
                try:
                    fns = _bind()
                except (OSError, AttributeError, ValueError, TypeError):
                    fns = None
                _state[0] = fns or False
                if isinstance(fns, tuple):
                    try:
                        ok = _self_test()
                    except Exception:  # noqa: BLE001 - a self-test that trips means: not usable here
                        ok = False
                    if not ok:
                        _state[0] = False
    return isinstance(_state[0], tuple)


def _self_test() -> bool:
    global _P, _Q, _R
    rng = np.random.default_rng(7)
    w = rng.standard_normal((45, 150)).astype(np.float32)
    x = rng.standard_normal((21, 45)).astype(np.float32)
    b = rng.standard_normal(150).astype(np.float32)
    saved = _P, _Q, _R
    _P, _Q, _R = 64, 16, 8  # several blocks along every axis, with edges (rows 21: two passes of 8 and one of 5)
    try:
        pw = PackedWeight(w)
        pf = PackedWeight(np.asfortranarray(w))
        y = matmul(x, pw, b, threads=2)
        yf = matmul(x, pf, b, threads=1)
        back = _unpack(pw)
    finally:
        _P, _Q, _R = saved
    want = x.astype(np.float64) @ w.astype(np.float64) + b
    return bool(np.allclose(y, want, rtol=1e-4, atol=1e-4) and np.array_equal(y, yf) and np.array_equal(back, w))


def _aligned(n: int) -> np.ndarray:
    """n float32 elements starting on a 4 KiB boundary, with 4 KiB to spare past the end (kernels may read ahead of
    the panel they multiply)."""
    raw = np.empty(n + 2 * _ALIGN // 4, dtype=_F32)
    off = (-raw.ctypes.data % _ALIGN) // 4
    return raw[off:off + n + _ALIGN // 4]


class PackedWeight:
    """A (K, N) float32 weight in OpenBLAS's packed layout, depth block by depth block (``_Q`` deep): each block
    holds the N output features' panels in order, so any run of features starting at a multiple of 64 (a whole number
    of panels) is one contiguous kernel operand (``blocks``: ((depth, address), ...))."""

    __slots__ = ("K", "N", "P", "Q", "buf", "blocks", "__weakref__")

    def __init__(self, w: np.ndarray, Q: int | None = None):
        K, N = w.shape
        if w.flags.f_contiguous and not w.flags.c_contiguous and w.dtype == _F32:
            # (the level-99 layout of transformer weights: w.T is C-contiguous, packed as OpenBLAS packs a
            # transposed A -- the same panels, no C-ordered copy)
            src, incopy = w.T, _state[0][3]

            def copy(kb, mb, m0, k0, addr):
                incopy(kb, mb, src.ctypes.data + 4 * (k0 + m0 * K), K, addr)
        else:
            src, itcopy = np.ascontiguousarray(w, dtype=_F32), _state[0][0]

            def copy(kb, mb, m0, k0, addr):
                itcopy(kb, mb, src.ctypes.data + 4 * (m0 + k0 * N), N, addr)
        P, Q = _P, Q or _Q  # (a smaller depth block: each thread of a depth split owns whole blocks)
        depths = [min(Q, K - k0) for k0 in range(0, K, Q)]
        sizes = [-(-(N * kb + 64) // 16) * 16 for kb in depths]
        self.buf = buf = _aligned(sum(sizes))
        blocks = []
        addr = buf.ctypes.data
        for j, kb in enumerate(depths):
            for m0 in range(0, N, P):  # (panels of P features at a time: the copy's working set stays small)
                copy(kb, min(P, N - m0), m0, j * Q, addr + 4 * m0 * kb)
            blocks.append((kb, addr))
            addr += 4 * sizes[j]
        self.K, self.N, self.P, self.Q = K, N, P, Q
        self.blocks = tuple(blocks)


# -- helper threads -------------------------------------------------------------------------------------------------
class _Helper:
    __slots__ = ("jobs", "done", "thread")

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        self.done = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="onnxpy-gemm", daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            fn, args, fp = self.jobs.get()
            err = None
            try:
                with np.errstate(**fp):  # (the calling thread's floating-point settings: a session's "ignore")
                    fn(*args)
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                err = e
            del fn, args  # (no reference to the last product's arrays outlives it)
            self.done.put(err)
            err = None


_helpers: list = []
_pool_lock = threading.Lock()  # (guards the list)
_pool_acquire = threading.Lock()  # held by the product using the helpers


def _after_fork() -> None:
    """In a forked child the helper threads are gone (and a lock may have been held): start afresh."""
    global _pool_lock, _pool_acquire
    _helpers.clear()
    _pool_lock = threading.Lock()
    _pool_acquire = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


_threads_getter: list = []
_CPUS = os.cpu_count() or 1


def _blas_threads() -> int:
    """The BLAS library's current thread count (``SessionOptions.intra_op_num_threads`` sets it)."""
    if not _threads_getter:
        from ..execution.threads import _find_api

        api = _find_api()
        _threads_getter.append(api[1] if api else (lambda: 1))
    return max(1, min(int(_threads_getter[0]() or 1), _CPUS))


def _run_blocks(spans, blocks, R, sb, y, ldc, out, bias, col0=0, fill=True):
    """The kernel over feature ranges ``spans`` ((start, count), ...) for every depth block, each range's outputs
    first set to the bias (or zero) by the thread that then accumulates into them (``y``: the address of ``out``,
    whose rows are ``ldc`` floats apart; ``out``'s column 0 is feature ``col0``; ``fill=False``: accumulated into as
    they are)."""
    kern = _state[0][2]
    for m0, mb in spans:
        c = m0 - col0
        if fill:
            part = out[:, c:c + mb]
            if bias is None:
                part.fill(0)
            else:
                np.copyto(part, bias if bias.size == 1 else bias[m0:m0 + mb])
        for i, (kb, addr) in enumerate(blocks):
            kern(mb, R, kb, 1.0, addr + 4 * m0 * kb, sb[i], y + 4 * c, ldc)


def _run_block_then(spans, blocks, R, sb, out, bias, col0, epilogue, full=None):
    """:func:`_run_blocks` into ``out`` (a thread's own block of features from ``col0``: C-contiguous, or the first
    columns of the C-contiguous ``full`` whose spare columns hold zeros, see :func:`_block`), then ``epilogue`` on
    the same thread, over ``full`` when given (an element-wise epilogue: the spare zeros go through it too)."""
    _run_blocks(spans, blocks, R, sb, out.ctypes.data, out.strides[0] // 4, out, bias, col0)
    if epilogue is not None:
        epilogue(out if full is None else full)


# Thread blocks whose rows would lie a multiple of 2 KiB apart get 16 spare floats per row (test and measurement hook)
PAD_BLOCKS = True


def _block(R: int, n: int):
    """(a (R, n) float32 block for a thread's share of a product, the C-contiguous array holding it): rows
    ``out_pitch(n)`` floats apart, the spare columns zeroed (an epilogue may run over them)."""
    ld = out_pitch(n) if PAD_BLOCKS else n
    full = np.empty((R, ld), dtype=_F32)
    if ld == n:
        return full, full
    full[:, n:] = 0
    return full[:, :n], full


def feature_spans(c0: int, c1: int, P: int):
    """Features [c0, c1) as the kernel's ranges of at most ``P``: [(start, count), ...]."""
    return [(m0, min(P, c1 - m0)) for m0 in range(c0, c1, P)]


def _spans(N: int, R: int, T: int, P: int):
    """Per thread, the feature ranges it multiplies: an even share of the features (cut at multiples of 64, a whole
    number of the kernel's panels), as blocks of ``P`` when the rows are many (each block's weights stay in cache
    while all rows pass) or as one range when they are few (one kernel call per depth block streams the weight
    once).  Contiguous shares: the threads' outputs then meet once per row (interleaved blocks measured 1.5x slower
    on the second thread: cache lines shared at every block boundary)."""
    ng = -(-N // 64)
    cuts = [min(N, (ng * t // T) * 64) for t in range(T + 1)]
    out = []
    for c0, c1 in zip(cuts, cuts[1:]):
        if c1 <= c0:
            continue
        if R >= _FEW_ROWS:
            out.append(feature_spans(c0, c1, P))
        else:
            out.append([(c0, c1 - c0)])
    return out


def _row_pitch(a: np.ndarray):
    """Elements between the rows of a 2-D float32 array with contiguous rows that do not overlap (``_blas._ld``'s
    test), or None."""
    if a.dtype != _F32 or a.ndim != 2:
        return None
    if a.size == 0:
        return a.shape[1]
    try:
        return _blas._ld(a)
    except ValueError:
        return None


def _pieces_source(pieces, K: int, Q: int):
    """(rows, [(address of column 0, row pitch) per depth block]) for an activation given as column pieces
    [(first column, float32 (rows, n) array with contiguous rows), ...] that cover [0, K) in order, each depth block of
    ``Q`` columns inside one piece; None otherwise."""
    rows = pieces[0][1].shape[0]
    src = []
    for k0 in range(0, K, Q):
        k1 = min(K, k0 + Q)
        for c0, a in pieces:
            if c0 <= k0 and k1 <= c0 + a.shape[1]:
                ld = _row_pitch(a) if a.shape[0] == rows else None
                if ld is None:
                    return None
                src.append((a.ctypes.data + 4 * (k0 - c0), ld))
                break
        else:
            return None
    return rows, src


def _activation_source(x, pw: PackedWeight):
    """(rows, [(address, row pitch) of each depth block's columns], the arrays those addresses point into) for a 2-D
    float32 activation or the column pieces :func:`matmul_split` returns (concatenated where a depth block straddles
    two of them); ValueError when its columns do not match the weight's rows."""
    if isinstance(x, list):
        got = _pieces_source(x, pw.K, pw.Q)
        if got is not None:
            return got[0], got[1], [a for _, a in x]
        x = np.concatenate([a for _, a in x], axis=1)
    R, K = x.shape
    if K != pw.K:
        raise ValueError(f"packed matmul: x has {K} columns, the weight {pw.K} rows")
    lda = _row_pitch(x)
    if lda is None:
        x = np.ascontiguousarray(x, dtype=_F32)
        lda = K
    return R, [(x.ctypes.data + 4 * k0, lda) for k0 in range(0, K, pw.Q)], [x]


def _pack_rows(blocks, src, r0: int, R: int):
    """Rows [r0, r0 + R) of the activation at ``src`` ((address, row pitch) per depth block of ``blocks``) packed for
    the kernel, one panel per depth block: (the buffer, the panels' addresses in it)."""
    oncopy = _state[0][1]
    stride = R * blocks[0][0] + 64  # (the first depth block is the deepest)
    sbuf = _aligned(stride * len(blocks))
    sb = []
    for i, (kb, _) in enumerate(blocks):
        addr = sbuf.ctypes.data + 4 * i * stride
        a0, ld = src[i]
        oncopy(kb, R, a0 + 4 * r0 * ld, ld, addr)
        sb.append(addr)
    return sbuf, sb


def matmul(x, pw: PackedWeight, bias=None, threads: int | None = None, out=None) -> np.ndarray:
    """``x @ W (+ bias)`` for a 2-D float32 ``x`` (rows, K; its rows may lie further apart than K) and a packed (K, N)
    weight: a fresh (rows, N) float32 array, or the first N columns of ``out`` (a writeable float32 (rows, >= N)
    array with contiguous rows, not overlapping x), which are returned.  ``bias``: None or float32 values
    broadcasting to (1, N).  ``x`` may also be the column pieces :func:`matmul_split` returns (each depth block of
    the weight inside one piece, as there)."""
    N, K = pw.N, pw.K
    R, src, held = _activation_source(x, pw)
    bias = _bias_vector(bias, N)
    if out is None:
        y = np.empty((R, N), dtype=_F32)
        ldc = N
    else:
        ldc = _row_pitch(out)
        if ldc is None or out.shape[0] != R or out.shape[1] < N or not out.flags.writeable or any(
                np.may_share_memory(out, a) for a in held):
            raise ValueError(f"packed matmul: out must be a writeable float32 ({R}, >= {N}) array with contiguous "
                             "rows, apart from x")
        y = out[:, :N]
    if R == 0 or N == 0 or K == 0:
        y[...] = 0
        if bias is not None:
            y += bias
        return y
    blocks = pw.blocks
    T = _blas_threads() if threads is None else threads
    if threads is None and R * K * N < _MIN_PARALLEL:
        T = 1  # (a helper's hand-off, ~40 us, costs more than it saves)
    P = pw.P
    T = max(1, min(T, -(-N // 64)))
    for r0 in range(0, R, _R):
        rb = min(_R, R - r0)
        sbuf, sb = _pack_rows(blocks, src, r0, rb)  # (sbuf holds the packed rows sb points into)
        yp = y.ctypes.data + 4 * r0 * ldc
        yr = y[r0:r0 + rb]
        spans = _spans(N, rb, T, P)
        if len(spans) <= 1:
            _run_blocks(spans[0], blocks, rb, sb, yp, ldc, yr, bias)
            continue
        if not _run_shared(_run_blocks, [(part, blocks, rb, sb, yp, ldc, yr, bias) for part in spans]):
            # (another product holds the helpers: this one runs on its own thread)
            _run_blocks([sp for part in spans for sp in part], blocks, rb, sb, yp, ldc, yr, bias)
    return y


def _bias_vector(bias, N: int):
    if bias is None:
        return None
    bias = np.asarray(bias, dtype=_F32)
    if bias.size != 1 and bias.size != N or bias.ndim > 2 or bias.ndim == 2 and bias.shape[0] != 1:
        raise ValueError(f"packed matmul: bias of shape {bias.shape} does not broadcast to (1, {N})")
    return bias.reshape(-1)


def _splittable(R: int, pw: PackedWeight) -> bool:
    """A product of ``R`` rows that :func:`matmul_split` / :func:`matmul_ksplit` share between threads: one row pass
    of many rows, large enough for a hand-off."""
    return _FEW_ROWS <= R <= _R and R * pw.K * pw.N >= _MIN_PARALLEL


def _split_spans(R: int, pw: PackedWeight, align: int):
    """The threads' feature ranges of :func:`matmul_split`, or None where it does not split (a fact of the shapes and
    the thread count, not of whether the helpers are free)."""
    N = pw.N
    if not _splittable(R, pw):
        return None
    T = min(_blas_threads(), -(-N // 64))
    spans = _spans(N, R, T, pw.P) if T >= 2 else []
    if len(spans) < 2 or any(part[0][0] % align for part in spans):
        return None
    return spans


def split_cut(R: int, pw: PackedWeight, align: int = 64):
    """Where :func:`matmul_split` cuts a product of ``R`` rows between two threads (the second block's first feature),
    None where it does not split it in two."""
    spans = _split_spans(R, pw, align)
    return spans[1][0][0] if spans is not None and len(spans) == 2 else None


def matmul_split(x: np.ndarray, pw: PackedWeight, bias=None, epilogue=None, align: int = 64):
    """``x @ W (+ bias)`` as the threads' column blocks: [(first feature, C-contiguous float32 (rows, n) array), ...],
    one per thread (the shares :func:`matmul` gives them), each block written -- and ``epilogue(block)`` run on it --
    by the thread that computes it, so that an element-wise pass after the product reads what its own thread just
    wrote and needs no hand-off of its own.  None, running nothing, where the product would not split (one thread,
    fewer than 16 or more than 256 rows, a small product, a block not starting at a multiple of ``align``) or another
    product holds the helpers.  :func:`matmul` takes the blocks as its ``x``."""
    R, K = x.shape
    spans = _split_spans(R, pw, align)
    if K != pw.K or x.dtype != _F32 or spans is None:
        return None
    _, src, held = _activation_source(x, pw)
    bias = _bias_vector(bias, pw.N)
    blocks = pw.blocks
    sbuf, sb = _pack_rows(blocks, src, 0, R)  # (sbuf holds the packed rows sb points into)
    outs, parts = [], []
    for part in spans:
        c0 = part[0][0]
        blk, full = _block(R, part[-1][0] + part[-1][1] - c0)
        outs.append((c0, blk))
        parts.append((part, blocks, R, sb, blk, bias, c0, epilogue, full))
    return outs if _run_shared(_run_block_then, parts) else None


def _kpart(lo, hi, pw, src, R, y, bias, fill=True):
    """One thread's share of :func:`matmul_ksplit`: the depth blocks [lo, hi) of ``pw`` (their activations at
    ``src``: (address, row pitch) per block) packed on this thread and multiplied into ``y`` (rows, N), first set to
    the bias (or zero; ``fill=False``: added to what ``y`` holds)."""
    blocks = pw.blocks[lo:hi]
    sbuf, sb = _pack_rows(blocks, src[lo:hi], 0, R)  # (sbuf holds the packed rows sb points into)
    _run_blocks(feature_spans(0, pw.N, pw.P), blocks, R, sb, y.ctypes.data, pw.N, y, bias, fill=fill)


def matmul_ksplit(pieces, pw: PackedWeight, bias=None):
    """``x @ W (+ bias)`` for an activation given as two column pieces (as :func:`matmul_split` returns them, each
    written by one thread) split by depth instead of features: each thread packs the depth blocks of its own piece
    -- data its own cache holds -- and multiplies them into all N outputs, and the two partial sums are added (the
    sum's order differs from one thread's by rounding only).  With another product holding the helpers the calling
    thread computes both partial sums itself, in the same order: the result does not depend on which thread computed
    what.  None, running nothing, where the split does not apply (not two pieces at depth-block boundaries, one BLAS
    thread, rows outside 16-256, a small product)."""
    if len(pieces) != 2 or _blas_threads() < 2:
        return None
    got = _pieces_source(pieces, pw.K, pw.Q)
    if got is None:
        return None
    R, src = got
    N, K, Q = pw.N, pw.K, pw.Q
    cut = pieces[1][0]
    if cut % Q or not 0 < cut < K or not _splittable(R, pw):
        return None
    nb = cut // Q
    y = np.empty((R, N), dtype=_F32)
    y1 = np.empty((R, N), dtype=_F32)
    args = [(0, nb, pw, src, R, y, _bias_vector(bias, N)), (nb, len(pw.blocks), pw, src, R, y1, None)]
    if not _run_shared(_kpart, args):
        for a in args:
            _kpart(*a)
    y += y1
    return y


def _ff_part(part, p1, R, sb, blk, c1, c0, epilogue, lo, hi, p2, y, c2):
    """One thread's share of :func:`matmul_chain`.  ``blk``: its (rows, n) block of the first product, or -- on the
    threads that stagger -- a list of (rows, depth) blocks, one per depth block [lo, hi) of the second product: all of
    the first product's share is computed first, then each block's epilogue is followed at once by its depth block of
    the second product, so this thread's element-wise passes run while the others multiply (two threads in their
    GELU passes at once slow each other down: each numpy call takes the GIL, and a thread that finds it held sleeps;
    BERT-base's GELU block 0.3 ms alone, ~0.48 ms side by side).  Same sums in the same order either way."""
    if not isinstance(blk, list):
        blk, full = blk
        _run_block_then(part, p1.blocks, R, sb, blk, c1, c0, epilogue, full)
        ld = blk.strides[0] // 4
        src = [(blk.ctypes.data + 4 * (k0 - c0), ld) if c0 <= k0 < c0 + blk.shape[1] else None
               for k0 in range(0, p2.K, p2.Q)]
        _kpart(lo, hi, p2, src, R, y, c2)
        return
    k0 = lo * p2.Q
    for b in blk:  # (the first product: every depth block's columns, kept apart so each block is C-contiguous)
        w = b.shape[1]
        _run_blocks([sp for sp in part if k0 <= sp[0] < k0 + w], p1.blocks, R, sb, b.ctypes.data, w, b, c1, k0)
        k0 += w
    src = [None] * len(p2.blocks)
    for j, b in enumerate(blk):
        if epilogue is not None:
            epilogue(b)
        src[lo + j] = (b.ctypes.data, b.shape[1])
        _kpart(lo + j, lo + j + 1, p2, src, R, y, c2, fill=j == 0)


STAGGER = True  # (test and measurement hook)


def matmul_chain(x: np.ndarray, p1: PackedWeight, c1, epilogue, p2: PackedWeight, c2):
    """``epilogue(x @ W1 + c1) @ W2 + c2`` in one parallel region: each thread computes its column block of the
    first product, runs ``epilogue`` on it, and multiplies that block (its depth share of the second product) into a
    partial sum of all outputs; the partial sums are added.  None where the split does not apply or the helpers are
    busy (the caller then runs :func:`matmul_split` / :func:`matmul_ksplit`, which sum in the same order)."""
    R, K = x.shape
    spans = _split_spans(R, p1, p2.Q)
    if K != p1.K or x.dtype != _F32 or spans is None or len(spans) != 2 or p2.K != p1.N or not _splittable(R, p2):
        return None
    _, src, held = _activation_source(x, p1)
    c1 = _bias_vector(c1, p1.N)
    sbuf, sb = _pack_rows(p1.blocks, src, 0, R)
    N2 = p2.N
    y = np.empty((R, N2), dtype=_F32)
    y1 = np.empty((R, N2), dtype=_F32)
    parts = []
    for t, part in enumerate(spans):
        c0 = part[0][0]
        n = part[-1][0] + part[-1][1] - c0
        lo, hi = c0 // p2.Q, -(-(c0 + n) // p2.Q)
        if t and STAGGER and hi - lo > 1 and all(span[0] % p2.Q + span[1] <= p2.Q for span in part):
            # (the second thread staggers its epilogue, see _ff_part; its spans lie inside depth blocks)
            blk = [np.empty((R, min(p2.Q, c0 + n - k0)), dtype=_F32) for k0 in range(c0, c0 + n, p2.Q)]
        else:
            blk = _block(R, n)
        parts.append((part, p1, R, sb, blk, c1, c0, epilogue, lo, hi, p2, y if t == 0 else y1,
                      _bias_vector(c2, N2) if t == 0 else None))
    if not _run_shared(_ff_part, parts):
        return None
    y += y1
    return y


def out_pitch(N: int) -> int:
    """A row pitch for a product's (rows, N) result that the caller keeps to itself: N, or N + 16 when N floats are
    a multiple of 2 KiB (rows that many bytes apart map to few cache sets, and the kernel's stores to a block's rows
    collide: 128 x 768 @ 768 x 3072 ran 3-4% faster into rows 3088 apart, 128 x 384 @ 384 x 1536 2-3%; BERT-base
    0.98-1.0x in-process through FeedForward's intermediate, MiniLM 0.99x; a thread's 128 x 1536 half of that
    product, 6 KiB rows, 3% faster on two threads into rows 1552 apart)."""
    return N + 16 if (N * 4) % 2048 == 0 else N


def matmul_rows(a: np.ndarray, pw: PackedWeight, bias=None) -> np.ndarray:
    """:func:`matmul` over the last axis of ``a`` (..., K): a fresh (..., N) result."""
    return matmul(a.reshape(-1, pw.K), pw, bias).reshape(a.shape[:-1] + (pw.N,))


def _run_shared(fn, parts, blas_api=None) -> bool:
    """``fn(*parts[0])`` on the calling thread and ``fn(*parts[i])`` on helper thread i, returning when all are done
    (the first error raised); False, running nothing, when another product holds the helpers.  With ``blas_api``
    (the BLAS library's (set, get) thread-count functions) OpenBLAS is held to one thread while the parts run, the
    count read and restored under the helpers' lock (so two such calls cannot restore each other's lowered count)."""
    if not _pool_acquire.acquire(blocking=False):
        return False
    err = None
    before = None
    try:
        if blas_api is not None:
            before = int(blas_api[1]())
            blas_api[0](1)
        with _pool_lock:
            while len(_helpers) < len(parts) - 1:
                _helpers.append(_Helper())
        hs = _helpers[:len(parts) - 1]
        fp = np.geterr()
        for h, args in zip(hs, parts[1:]):
            h.jobs.put((fn, args, fp))
        try:
            fn(*parts[0])
        except BaseException as e:  # noqa: BLE001 - raised below, once the helpers are done with their parts
            err = e
        errs = [h.done.get() for h in hs]
    finally:
        if before is not None:
            blas_api[0](before)
        _pool_acquire.release()
    for e in [err] + errs:
        if e is not None:
            raise e
    return True


# -- stacks of small products (attention) -----------------------------------------------------------------------
def bound() -> bool:
    """True when the kernels are bound already (asks nothing of OpenBLAS otherwise)."""
    return isinstance(_state[0], tuple)


# Stacked products with more elements per packed operand than this keep numpy's (their operands leave the cache),
# and so do products of at most 10^6 multiply-adds: OpenBLAS runs those with its single-threaded small-matrix kernel
# (no worker to wake), faster than a hand-off here (12 heads of 128x32x128: 1.0-1.13x numpy's time; of 128x64x128,
# which OpenBLAS threads, 0.87-0.89x).
_STACK_MAX_PANEL = 1 << 16
_STACK_MIN_MACS = 1_000_000


def _mat(a: np.ndarray):
    """(row stride in elements, head stride in elements) of a 3-D float32 stack of row-major matrices with unit inner
    stride, or None."""
    if a.dtype != _F32 or a.ndim != 3 or a.strides[2] != 4 or a.strides[1] % 4 or a.strides[0] % 4:
        return None
    ld = a.strides[1] // 4
    if ld < a.shape[2] and a.shape[1] > 1 or ld < 1:
        return None
    return ld, a.strides[0] // 4


def _stack_part(heads, a, lda, sa_h, trans_a, b, ldb, sb_h, trans_b, c, ldc, sc_h, M, N, K):
    itcopy, oncopy, kern, incopy, otcopy = _state[0][:5]
    pa = _aligned(N * K)  # packed op(B)^T (the kernel's A)
    pb = _aligned(K * M)  # packed op(A)^T (the kernel's B)
    pa_p, pb_p = pa.ctypes.data, pb.ctypes.data
    for h in heads:
        bp = b + 4 * h * sb_h
        (incopy if trans_b else itcopy)(K, N, bp, ldb, pa_p)
        ap = a + 4 * h * sa_h
        (otcopy if trans_a else oncopy)(K, M, ap, lda, pb_p)
        kern(N, M, K, 1.0, pa_p, pb_p, c + 4 * h * sc_h, ldc)


def stacked_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, trans_a: bool = False, trans_b: bool = False):
    """``out[h] = op(a[h]) @ op(b[h])`` for 3-D float32 stacks (op: transposed when asked; every matrix row-major with
    contiguous rows, any strides between rows and between matrices: attention's heads as views of the projections),
    the matrices split between the calling thread and the helper threads, each packing both operands for OpenBLAS's
    kernel: a stack of small products without OpenBLAS's threading (which wakes its sleeping worker on every product
    of 10^6 multiply-adds or more, ~20-50 us each).  ``out`` (zeroed here) must not overlap the operands.  Returns
    False, without touching ``out``, when the kernels are not bound or the stack does not fit these rules (the caller
    then uses numpy)."""
    if not bound() or a.ndim != 3 or b.ndim != 3 or out.ndim != 3:
        return False
    Hn = a.shape[0]
    M, K = (a.shape[2], a.shape[1]) if trans_a else (a.shape[1], a.shape[2])
    K2, N = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    ma, mb, mc = _mat(a), _mat(b), _mat(out)
    if (ma is None or mb is None or mc is None or K2 != K or b.shape[0] != Hn or out.shape != (Hn, M, N)
            or min(M, N, K, Hn) < 1 or M * K > _STACK_MAX_PANEL or N * K > _STACK_MAX_PANEL
            or M * N * K <= _STACK_MIN_MACS
            or not out.flags.writeable or np.shares_memory(out, a) or np.shares_memory(out, b)):
        return False
    out[...] = 0
    T = min(_blas_threads(), Hn) if Hn * M * N * K >= _MIN_PARALLEL else 1
    args = (a.ctypes.data, ma[0], ma[1], trans_a, b.ctypes.data, mb[0], mb[1], trans_b, out.ctypes.data, mc[0],
            mc[1], M, N, K)
    cuts = [Hn * t // T for t in range(T + 1)]
    if T <= 1 or not _run_shared(_stack_part, [(range(c0, c1),) + args for c0, c1 in zip(cuts, cuts[1:])]):
        _stack_part(range(Hn), *args)
    return True


# Stacks of at least this many multiply-adds are split between the calling thread and the helpers by
# ``split_matmul``; smaller ones cost less than a hand-off (~80 us with the wake-ups on this VM): numpy's loop.
_SPLIT_MIN_MACS = 8_000_000
_SPLIT = True  # (test and measurement hook)


def _split_part(h0, h1, a, b, out):
    np.matmul(a[h0:h1], b[h0:h1], out=out[h0:h1])


def split_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, trans_a: bool = False, trans_b: bool = False):
    """``out[h] = op(a[h]) @ op(b[h])`` for 3-D float32 stacks, the matrices split between the calling thread and the
    helper threads, each running one ``np.matmul`` over its share (numpy loops over the matrices in C with the GIL
    released) while OpenBLAS is held to one thread, so that no per-matrix call wakes its worker and no thread waits
    for the GIL between matrices.  Measured on attention's per-head products (12 heads of 128 x 128 x 64): 0.55-0.65x
    numpy's threaded loop and 0.6-0.75x ``stacked_matmul`` (whose three calls per matrix each hand the GIL over,
    costing a thread wake-up whenever the other thread holds it).  OpenBLAS's thread count is global: while a split
    runs, BLAS calls on other Python threads run single-threaded (same results).  Returns False, without touching
    ``out``, when the stack is too small, fewer than two threads are allowed, another product holds the helpers or
    ``out`` may overlap an operand (the caller then uses numpy)."""
    if not _SPLIT or a.ndim != 3 or b.ndim != 3 or out.ndim != 3 or a.dtype != _F32 or b.dtype != _F32 \
            or out.dtype != _F32:
        return False
    Hn = a.shape[0]
    M, K = (a.shape[2], a.shape[1]) if trans_a else (a.shape[1], a.shape[2])
    K2, N = (b.shape[2], b.shape[1]) if trans_b else (b.shape[1], b.shape[2])
    if (K2 != K or b.shape[0] != Hn or out.shape != (Hn, M, N) or Hn < 2 or Hn * M * N * K < _SPLIT_MIN_MACS
            or not out.flags.writeable or np.may_share_memory(out, a) or np.may_share_memory(out, b)):
        return False
    return run_ranges(_split_part, Hn, _blas_threads(), a.swapaxes(1, 2) if trans_a else a,
                      b.swapaxes(1, 2) if trans_b else b, out)


def run_ranges(fn, n: int, threads: int, *args, single_blas: bool = True) -> bool:
    """``fn(lo, hi, *args)`` over [0, n) cut into ``min(threads, n)`` contiguous ranges, the first on the calling
    thread and the others on helper threads (:func:`_run_shared`); with ``single_blas`` OpenBLAS is held to one
    thread meanwhile, so that BLAS calls inside the parts (numpy's products) run on the thread that makes them instead
    of waking OpenBLAS's worker.  False, running nothing, when that leaves fewer than two ranges, the BLAS thread
    count cannot be set, another product holds the helpers, or the kernels are not bound (``available``: only then
    are OpenBLAS's idle workers known to sleep instead of spinning on the helper's core for ~0.1 s after each
    threaded call).  OpenBLAS's thread count is global: BLAS calls on other Python threads run single-threaded
    meanwhile (same results)."""
    T = min(int(threads), n)
    if T < 2 or not available():  # (binding quiets OpenBLAS's idle workers, which would otherwise spin)
        return False
    api = None
    if single_blas:
        from ..execution.threads import _find_api

        api = _find_api()
        if not api:
            return False
    cuts = [n * t // T for t in range(T + 1)]
    return _run_shared(fn, [(c0, c1) + args for c0, c1 in zip(cuts, cuts[1:])], api)


# -- weights and their stand-ins ------------------------------------------------------------------------------------
# id(array) -> (weakref to the array, {transposed?: PackedWeight}); an array and the stand-in that replaces it share
# the inner dict (a convolution filter's holds "filter": its _conv_packed.PackedFilter, see _conv_packed.register)
_PACKS: dict = {}


def _entry(a):
    hit = _PACKS.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    return None


def _remember(a, table: dict) -> None:
    key = id(a)
    _PACKS[key] = (weakref.ref(a, lambda _r, k=key: _PACKS.pop(k, None)), table)


class prepacking:
    """``with prepacking(False):`` plans built inside leave their weights unpacked (``session.disable_prepacking``)."""

    def __init__(self, enabled: bool):
        self.enabled = bool(enabled)

    def __enter__(self):
        self.saved = getattr(_local, "off", False)
        _local.off = not self.enabled
        return self

    def __exit__(self, *exc):
        _local.off = self.saved
        return False


def prepack_enabled(options) -> bool:
    """False when ``SessionOptions`` ask for no prepacking (``session.disable_prepacking`` = 1)."""
    return options is None or options._config.get("session.disable_prepacking", "0") != "1"


def _eligible(b) -> bool:
    """A float32 matrix big enough to pack."""
    return type(b) is np.ndarray and b.dtype == _F32 and b.ndim == 2 and b.size >= _MIN_ELEMENTS


def will_pack(b) -> bool:
    """True when :func:`pack` would pack ``b`` (as either orientation) on this thread now."""
    return _eligible(b) and not getattr(_local, "off", False) and available()


def pack(b, transposed: bool = False, depth: int | None = None) -> PackedWeight | None:
    """The packed form of the constant ``b`` (``b.T`` when ``transposed``) as a (K, N) weight, made once per array
    (and shared with its stand-in); None when packing is off or not worth it (not a finite float32 matrix of at
    least ``_MIN_ELEMENTS`` elements).  ``depth``: its depth blocks (``_Q`` by default)."""
    if not _eligible(b):
        return None
    table = _entry(b)
    if getattr(_local, "off", False) and not (table and table.get("standin")):
        return None
    key = transposed if depth is None or depth == _Q else (transposed, int(depth))
    if table is not None and key in table:
        return table[key]
    if table is not None and table.get("standin"):  # a stand-in asked for the other orientation: from the real one
        src = real(b)
    else:
        src = b
    if not available() or not np.isfinite(src).all():
        return None
    pw = PackedWeight(src.T if transposed else src, depth)
    if table is None:
        table = {}
        _remember(b, table)
    table[key] = pw
    return pw


def standin(b):
    """A stand-in for a packed constant whose original the plan releases: an array of its shape and type that holds no
    data (one zero, broadcast) and maps back to the packed forms; None when ``b`` was not packed."""
    table = _entry(b)
    if table is None or not any(isinstance(v, PackedWeight) for v in table.values()):
        return None
    s = np.broadcast_to(np.zeros((), dtype=b.dtype), b.shape)
    new = dict(table)
    new["standin"] = True
    _remember(s, new)
    return s


def is_standin(a) -> bool:
    table = _entry(a) if type(a) is np.ndarray else None
    return bool(table and table.get("standin"))


def _unpack(pw: PackedWeight) -> np.ndarray:
    """The (K, N) weight back from its packed form: the identity times the weight, in blocks of its rows (exact for
    finite weights, up to the sign of zeros)."""
    K = pw.K
    out = np.empty((K, pw.N), dtype=_F32)
    step = max(1, min(K, (1 << 20) // max(1, K)))
    for r0 in range(0, K, step):
        r1 = min(K, r0 + step)
        eye = np.zeros((r1 - r0, K), dtype=_F32)
        eye[np.arange(r1 - r0), np.arange(r0, r1)] = 1
        out[r0:r1] = matmul(eye, pw, threads=1)
    return out


def real(a):
    """``a`` itself, or for a stand-in the weight it replaced (recomputed from the packed form)."""
    if not is_standin(a):
        return a
    table = _entry(a)
    for key, pw in table.items():  # (any packed form: plain ones first, as the table lists them)
        if isinstance(pw, PackedWeight):
            transposed = key[0] if isinstance(key, tuple) else key
            return np.ascontiguousarray(_unpack(pw).T) if transposed else _unpack(pw)
    raise ValueError("packed weight stand-in without a packed form")
