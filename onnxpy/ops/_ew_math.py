"""Fast vectorized float math shared by the elementwise and activation kernels.

* :func:`erf32` -- erf for float32 as ``x * P(x^2) / Q(x^2)`` on ``[-4, 4]`` (erf is +-1 in float32 beyond), with a
  (5, 5) rational approximation fitted for this project (max relative error ~4e-7, i.e. a few float32 ulp).
  scipy's erf is ~10x slower on float32 arrays; float64 inputs still use scipy for full double precision.
* :func:`sigmoid` -- ``1 / (1 + exp(-x))``: numpy's SIMD exp makes it several times faster than scipy's expit.
* :func:`blockwise` -- applies such multi-pass formulas block by block so the temporaries stay in cache.
* :func:`gelu_erf32_into` -- exact (erf) GELU for float32 as ``x / (1 + exp(-x P(x^2)))``: x Phi(x) with
  Phi = sigmoid(h), h(x) = log(Phi(x) / Phi(-x)) = 2 atanh(erf(x / sqrt 2)) fitted as an odd polynomial x P(x^2)
  (degree 13, weighted minimax on [0, 6] for an output error below 1 float32 ulp plus 1 ulp of |x| / 2^24;
  measured max abs error 6e-7 over [-12, 12], half that of the erf route).  17 array passes (one exp2) instead
  of 29; no cancellation in the negative tail (1 + erf is never formed); the polynomial stays above 10 for x >= 4,
  so exp(-h) vanishes and x passes through unchanged for large x, and -0.0 comes out for large negative x.
* :func:`relu`, :func:`clamp`, :data:`clip` -- max(x, 0) and one-sided bounds through numpy's clip ufunc: numpy's float
  maximum/minimum against a broadcast scalar run a loop ~4x slower than its clip loop (numpy 2.4 on an AVX-512 EPYC:
  0.37 vs 0.09 ns per float32 element of a 351K-element ReLU in place, 130 vs 33 us; maximum with an array operand,
  or add with a scalar, run at clip's rate).  NaN propagates as in maximum; max(-0.0, 0) stays -0.0.  ``clip`` is
  that ufunc itself: np.clip's Python wrappers cost ~3 us a call (PP-OCR cls's 27 hard-swish clips: ~80 us a run).
"""

from __future__ import annotations

import math as _math

import numpy as np

from . import _native

BLOCK = 16384

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

_P = tuple(np.float32(c) for c in (
    1.1283791397171488, 0.19350489237331298, 0.05309687497360959, 0.0038817531850241986,
    0.0002845527599528705, 1.9873790885195126e-06,
))
_Q = tuple(np.float32(c) for c in (
    1.0, 0.5048218065639265, 0.11533379893404333, 0.015204033589561097, 0.0011852285193463949,
    3.7425692746742445e-05,
))
_ONE = np.float32(1.0)
# log of the largest finite float32 / float64 (by itemsize): exp above it overflows
_EXP_MAX = {4: float(np.log(np.finfo(np.float32).max)), 8: float(np.log(np.finfo(np.float64).max))}


_um = getattr(np, "_core", None)
clip = (_um if _um is not None else np.core).umath.clip  # np.clip(x, lo, hi, out=...) without its Python wrappers
del _um
# below this many elements numpy's maximum (no clip bounds to convert) is as fast
CLIP_MIN = 1024
_BOUNDS = {_F32: (np.float32(0), np.float32(-np.inf), np.float32(np.inf)),
           _F64: (np.float64(0), np.float64(-np.inf), np.float64(np.inf))}
_ZEROS: dict = {}


def zero(dt) -> np.ndarray:
    """A read-only 0-d zero of ``dt`` (cached): a same-typed operand, ~3x less ufunc overhead than the Python int 0."""
    z = _ZEROS.get(dt)
    if z is None:
        z = np.zeros((), dtype=dt)
        z.flags.writeable = False
        _ZEROS[dt] = z
    return z


def relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """max(x, 0) of a float array, into ``out`` when given (``out=x``: in place)."""
    if x.size >= CLIP_MIN:
        b = _BOUNDS.get(x.dtype)
        if b is not None:
            return clip(x, b[0], b[2], out=out)
    z = _ZEROS.get(x.dtype)
    return np.maximum(x, zero(x.dtype) if z is None else z, out=out)


def clamp(x: np.ndarray, lo=None, hi=None, out: np.ndarray | None = None) -> np.ndarray:
    """x clipped below at ``lo`` and/or above at ``hi`` (scalars of x's dtype, None for no bound), as
    np.maximum / np.minimum / np.clip would (NaN propagates); into ``out`` when given."""
    b = _BOUNDS.get(x.dtype)
    if b is not None and x.size >= CLIP_MIN:
        return clip(x, b[1] if lo is None else lo, b[2] if hi is None else hi, out=out)
    if lo is not None and hi is not None:
        return clip(x, lo, hi, out=out)
    if lo is not None:
        return np.maximum(x, lo, out=out)
    if hi is not None:
        return np.minimum(x, hi, out=out)
    if out is None:
        return x
    out[...] = x
    return out


# a bound broadcast along rows of at least this many elements goes through the clip loop with both bounds as arrays
# (numpy's clip runs its scalar-bound loop per row, ~0.8 us to set up; maximum against a row-broadcast value runs
# its slow loop: 0.37 ns per float32 element)
CLIP_ROW_MIN = 2048


def bound(a, b, upper: bool):
    """max(a, b) (``upper`` False) or min(a, b) through the clip loop when that is faster and gives the larger
    operand's shape: that operand x a float32/64 array of CLIP_MIN+ elements, the other, c, of its dtype
    broadcasting into x's shape with a single value or with unit trailing axes over rows of CLIP_ROW_MIN+ elements
    (a per-channel floor); None otherwise (the caller uses np.maximum / np.minimum)."""
    if type(a) is not np.ndarray or type(b) is not np.ndarray:
        return None
    x, c = (a, b) if b.size < a.size or b.ndim < a.ndim else (b, a) if a.size < b.size else (None, None)
    if x is None:
        return None
    lim = _BOUNDS.get(x.dtype)
    if lim is None or c.dtype != x.dtype or x.size < CLIP_MIN or c.ndim > x.ndim:
        return None
    if c.size == 1:
        c = c.reshape(())
        return clip(x, lim[1], c) if upper else clip(x, c, lim[2])
    cs = (1,) * (x.ndim - c.ndim) + c.shape
    if any(d != 1 and d != n for d, n in zip(cs, x.shape)):
        return None
    k = max(i for i, d in enumerate(cs) if d != 1)
    run = 1
    for n in x.shape[k + 1:]:
        run *= n
    if run < CLIP_ROW_MIN:
        return None
    other = np.full(c.shape, lim[1] if upper else lim[2], dtype=x.dtype)
    return clip(x, other, c) if upper else clip(x, c, other)


def blockwise(fn, x: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """``fn(x)`` for an elementwise ``fn`` returning a new array of x's dtype, computed ``block`` elements at a time."""
    n = x.size
    if n <= block:
        return fn(x) if x.ndim else fn(x.reshape(1)).reshape(())
    flat = x.reshape(-1)
    out = np.empty(n, dtype=x.dtype)
    for i in range(0, n, block):
        out[i:i + block] = fn(flat[i:i + block])
    return out.reshape(x.shape)


def _erf32_block(x: np.ndarray) -> np.ndarray:
    xc = np.clip(x, -4.0, 4.0)
    t = xc * xc
    p0, p1, p2, p3, p4, p5 = _P
    q0, q1, q2, q3, q4, q5 = _Q
    num = t * p5
    num += p4
    for c in (p3, p2, p1, p0):
        num *= t
        num += c
    den = t * q5
    den += q4
    for c in (q3, q2, q1, q0):
        den *= t
        den += c
    num *= xc
    num /= den
    return clip(num, -_ONE, _ONE, out=num)


def erf32(x: np.ndarray) -> np.ndarray:
    """erf of a float32 array (float32 result)."""
    return blockwise(_erf32_block, x)


# -h(x) / x as a polynomial in u = x^2, times log2(e): the kernel forms exp(-h) as exp2 (numpy's float32 exp2 loop
# is ~1.6x faster than exp)
_GH = tuple(np.float32(-c * 1.4426950408889634) for c in (
    1.5957701362477157, 0.07266547502557592, -6.460973021683908e-05, -0.00011081503587274633,
    7.962081394954778e-06, -2.6688682643016447e-07, 3.5738314518976234e-09,
))
GELU_BLOCK = 65536  # elements per block: 4 blocks of 256 KiB (source, result, two scratch) stay in a 2 MiB L2;
# in-model A/B against 16384: BERT-base 0.964-0.975x, MiniLM 0.95-0.99x (fewer calls per pass), 131072+ slower


# The GELUs' native forms (``_native.py``: the same formulas and roundings, exp2 in machine code, one pass over the
# elements with the GIL released; test and measurement hook)
NATIVE = True


def native_gelu(src: np.ndarray, dst: np.ndarray | None = None, poly: tuple = _GH, name: str = "gelu_erf_f32"):
    """x / (1 + 2^(x P(x^2))) of float32 ``src`` into ``dst`` (same size, both C-contiguous; dst may be src; None: a
    fresh array) by the native kernel ``name`` with coefficients ``poly`` (constant term first): the result, or
    None, doing nothing, where that kernel is not used (no AVX-512, turned off) -- the caller then runs the numpy
    passes."""
    if not NATIVE or src.dtype != _F32 or not src.flags.c_contiguous:
        return None
    if dst is not None and (dst.dtype != _F32 or src.size != dst.size or not dst.flags.c_contiguous
                            or not dst.flags.writeable):
        return None
    fn = _native.function(name)
    if fn is None:
        return None
    if dst is None:
        dst = np.empty(src.shape, dtype=_F32)
    fn(src.size, src.ctypes.data, dst.ctypes.data, _native.exp2_constants(poly))
    return dst


def gelu_erf32_into(x: np.ndarray, out: np.ndarray, u: np.ndarray, p: np.ndarray) -> None:
    """out = x Phi(x) for equal-length 1-D float32 blocks; ``u``/``p`` are scratch of the same length (out may be
    x itself).  Floating-point warnings are the caller's business (exp overflows to inf for x < -9.5, giving -0)."""
    if native_gelu(x, out) is not None:
        return
    np.multiply(x, x, out=u)
    g = _GH
    np.multiply(u, g[6], out=p)
    for c in (g[5], g[4], g[3], g[2], g[1]):
        p += c
        p *= u
    p += g[0]
    p *= x
    np.exp2(p, out=p)
    p += _ONE
    np.divide(x, p, out=out)


# Element-wise passes over at least this many elements split between the calling thread and the GEMM helper
# (``split_passes``), one long run of numpy calls per thread: BERT-base's 128 x 3072 GELU 0.8x, in-model BERT-base
# 0.97-0.98x and MiniLM (128 x 1536) 0.985-0.99x.  Short blocks per thread lose: each numpy call takes the GIL, and
# a thread that finds it held sleeps until it is handed over (a 16-55 us wake-up on this VM), so a thread's share is
# one block, not cache-sized ones (128 x 3072 in 64K blocks: 1.1-1.2x the one-thread time).
SPLIT_MIN = 1 << 17
_SPLIT = True  # (test and measurement hook)


def split_passes(part, n: int, *args) -> bool:
    """``part(lo, hi, *args)`` over [0, n) split between the calling thread and the helper threads, each share one
    block (see ``SPLIT_MIN``); False, running nothing, when n is below ``SPLIT_MIN`` or the helpers are not
    available (the caller then runs the passes itself)."""
    if n < SPLIT_MIN or not _SPLIT:
        return False
    from . import _packed

    return _packed.run_ranges(part, n, _packed._blas_threads(), *args, single_blas=False)


def _gelu_part(lo, hi, fs, fd):
    if native_gelu(fs[lo:hi], fd[lo:hi]) is not None:
        return
    n = hi - lo
    u = np.empty(n, dtype=_F32)
    p = np.empty(n, dtype=_F32)
    with np.errstate(over="ignore", invalid="ignore"):
        gelu_erf32_into(fs[lo:hi], fd[lo:hi], u, p)


def gelu_erf32(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Exact GELU of a C-contiguous float32 array into ``dst`` (same shape, may be ``src``), block by block, or split
    between two threads when large (``split_passes``)."""
    n = src.size
    fs = src.reshape(-1)
    fd = dst.reshape(-1)
    if n and not split_passes(_gelu_part, n, fs, fd) and native_gelu(fs, fd) is None:
        b = min(n, GELU_BLOCK)
        u = np.empty(b, dtype=_F32)
        p = np.empty(b, dtype=_F32)
        with np.errstate(over="ignore", invalid="ignore"):
            for i in range(0, n, b):
                j = min(i + b, n)
                k = j - i
                gelu_erf32_into(fs[i:j], fd[i:j], u[:k], p[:k])
    return dst


def erf64(x: np.ndarray) -> np.ndarray:
    """erf in double precision (scipy, imported on first use: scipy.special costs ~0.2-0.4 s to import)."""
    from scipy.special import erf as _erf64

    return _erf64(x)


def erf(x: np.ndarray) -> np.ndarray:
    """erf in x's float type: scipy for float64, the fast float32 path for float32/float16/bfloat16."""
    dt = x.dtype
    if dt == _F64:
        return erf64(x)
    if dt == _F32:
        return erf32(x)
    if dt.kind in "iub":
        return erf64(x.astype(np.float64))
    return erf32(x.astype(np.float32)).astype(dt)


def sigmoid_into(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-x)) in one block, into ``out`` when given (``x`` itself works).  numpy only: importing
    scipy.special would cost ~0.2 s of session creation.  Sessions run with floating-point warnings off; exp
    overflow gives the exact limit 0.  A one-element float32/float64 array (a classifier's score) is computed in
    double precision by the math module and rounded once: one numpy call instead of four, 2.6 -> 0.4 us."""
    if x.size == 1 and x.ndim and (x.dtype is _F32 or x.dtype is _F64):
        return _sigmoid_one(x, out)
    y = np.negative(x, out=out)
    np.exp(y, out=y)
    y += 1
    return np.reciprocal(y, out=y)


def _sigmoid_one(x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    v = -float(x.reshape(-1)[0])
    # exp(-x) past the type's largest finite value: numpy's exp gives inf there, so the result is exactly 0
    e = _math.inf if v >= _EXP_MAX[x.dtype.itemsize] else _math.exp(v)  # (NaN: exp gives NaN, and so the result)
    if out is None:
        out = np.empty(x.shape, x.dtype)
    out.reshape(-1)[0] = 1.0 / (1.0 + e)
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function of a float32/float64 array, in its type (exp overflow gives the exact limit 0)."""
    with np.errstate(over="ignore"):
        return blockwise(sigmoid_into, x)


# --------------------------------------------------------------------------------------------- narrow float -> f32
_F16 = np.dtype(np.float16)
_F16_SHIFT_MASK = np.int32(-1879056384)  # 0x8FFFE000: the sign bit and the 15 exponent/mantissa bits, shifted
_F16_SCALE = np.float32(2.0 ** 112)  # rebias the 5-bit exponent to float32's (subnormals come out exact too)
_F16_BIG = np.float32(65536.0)  # exponent 31 (inf/nan) lands at or above 2^16; finite float16 stay below
_DENORM = np.float32(1e-40)
_FAST_MIN = 2048


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    """float16 -> float32 (a new array, exact for every bit pattern), ~2x faster than ``astype`` on large arrays.

    The bits are moved into place with integer ops and the exponent rebiased with one float multiply by 2^112
    (exact: float16 subnormals land on float32 subnormals, which the multiply renormalizes); inf/nan (exponent
    31) are rare and redone with ``astype``.  Small or strided arrays, and processes running with
    denormals-are-zero, use ``astype``.
    """
    if h.size < _FAST_MIN or not h.flags.c_contiguous or _DENORM * _F16_SCALE == 0:
        return h.astype(_F32)
    i = h.view(np.int16).astype(np.int32)  # sign-extended: bits 16.. copy the sign
    np.left_shift(i, 13, out=i)
    np.bitwise_and(i, _F16_SHIFT_MASK, out=i)
    f = i.view(_F32)
    f *= _F16_SCALE
    if f.max() >= _F16_BIG or f.min() <= -_F16_BIG:
        bad = np.abs(f) >= _F16_BIG
        f[bad] = h[bad].astype(_F32)
    return f


def to_f32(x: np.ndarray) -> np.ndarray:
    """x as float32: float32 itself, float16 via :func:`f16_to_f32`, anything else via ``astype``."""
    dt = x.dtype
    if dt == _F32:
        return x
    if dt == _F16:
        return f16_to_f32(x)
    return x.astype(_F32)
