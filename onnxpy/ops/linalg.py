"""Linear algebra: MatMul, Gemm, MatMulInteger, Einsum, Det.

MatMul/Gemm are thin wrappers over ``np.matmul`` (BLAS for float32/float64).  Narrow floats (float16, bfloat16) have
no BLAS path in numpy, so they are multiplied in float32 and rounded back once, as onnxruntime's kernels accumulate
in float32 too.
"""

from __future__ import annotations

import math
import weakref

import ml_dtypes
import numpy as np

from . import _blas, _packed
from ._ew_math import to_f32 as _act_f32
from ._shape_util import NOT_CONST
from .registry import kernel

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_matmul = np.matmul
# 2-D products: np.dot calls BLAS directly, without the gufunc machinery np.matmul goes through (~0.5-1.5 us less
# per call, which tiny models such as silero-vad make dozens of times per run; the same GEMM for large ones)
_dot2 = np.dot

# float32 copies of immutable narrow-float weights (read-only views of the model's bytes), so that a float16
# MatMul/Gemm converts its constant weight once per session instead of on every run.  Entries go with the weight.
_F32_COPIES: dict = {}


def _to_f32(b: np.ndarray) -> np.ndarray:
    if b.flags.writeable or b.size < 4096:
        return b.astype(_F32)
    root = b
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not isinstance(root.base, bytes):  # only buffers nobody can write to are cached
        return b.astype(_F32)
    key = id(b)
    hit = _F32_COPIES.get(key)
    if hit is not None and hit[0]() is b:
        return hit[1]
    out = b.astype(_F32)
    out.flags.writeable = False
    _F32_COPIES[key] = (weakref.ref(b, lambda _r, k=key: _F32_COPIES.pop(k, None)), out)
    return out


def _arr(x, op, name):
    if not isinstance(x, np.ndarray):
        if x is None:
            raise ValueError(f"{op}: required input '{name}' is missing")
        x = np.asarray(x)
    if x.dtype == object or x.dtype == np.bool_:
        raise TypeError(f"{op}: input '{name}' has unsupported element type {x.dtype}")
    return x


def _check_same_type(op, a, b):
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: inputs must have the same element type, got {a.dtype} and {b.dtype}")


# --- MatMul ------------------------------------------------------------------------------------------------------


def _mm(op, a, b):
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{op}: inputs must have rank >= 1, got shapes {a.shape} and {b.shape}")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if ka != kb:
        raise ValueError(f"{op}: incompatible shapes {a.shape} and {b.shape} (inner dimensions {ka} != {kb})")
    return _matmul(a, b)


@kernel("MatMul", since=(1, 9, 13))
def matmul(A, B):
    dt = A.dtype
    if dt != B.dtype:
        raise TypeError(f"MatMul: inputs must have the same element type, got {dt} and {B.dtype}")
    if dt in _LOW_FLOATS:
        return matmul(_act_f32(A), _to_f32(B)).astype(dt)
    if A.ndim > 2 and B.ndim == 2 and A.shape[-1] == B.shape[0]:
        # (..., M, K) @ (K, N): one large GEMM instead of a loop of small ones
        return _matmul(A.reshape(math.prod(A.shape[:-1]), A.shape[-1]), B).reshape(A.shape[:-1] + (B.shape[1],))
    try:
        return _matmul(A, B)
    except ValueError:
        return _mm("MatMul", A, B)  # raises with a clear message


def _matmul_specialize(consts, kwargs):
    """A constant float32 2-D B of at least ``_packed._MIN_ELEMENTS`` elements: packed once for OpenBLAS's kernel
    (``ops._packed``; the plan releases the original), each call packing only A's rows."""
    if len(consts) != 2:
        return None
    b = consts[1]
    pw = _packed.pack(b)
    if pw is None:
        return None
    K = b.shape[0]

    def run(A, B):
        if type(A) is not np.ndarray or A.dtype != _F32 or A.ndim < 2 or A.shape[-1] != K:
            return matmul(A, _packed.real(B))
        return _packed.matmul_rows(A, pw)

    run.releases = (1,)
    return run


matmul.specialize = _matmul_specialize


def _mm_rows(a: np.ndarray, w: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """a (..., K) @ w (K, N) (+ c, a bias of 1 or N values) as one 2-D GEMM (:func:`matmul_w`) when a is
    C-contiguous: a fresh result."""
    if a.ndim >= 2 and a.flags.c_contiguous:
        rows = math.prod(a.shape[:-1])
        return matmul_w(a.reshape(rows, a.shape[-1]), w, c).reshape(a.shape[:-1] + (w.shape[1],))
    y = _matmul(a, w)
    if c is not None:
        y += c
    return y


def _matmul_bias_generic(A, B, bias):
    a = _arr(A, "MatMulBias", "A")
    b = _arr(B, "MatMulBias", "B")
    c = _arr(bias, "MatMulBias", "bias")
    dt = a.dtype
    if dt != b.dtype or dt != c.dtype:
        raise TypeError(f"MatMulBias: inputs must have the same element type, got {dt}, {b.dtype} and {c.dtype}")
    if dt in _LOW_FLOATS:
        y = _matmul_bias_f32(_act_f32(a), _to_f32(b), c.astype(_F32))
        return y.astype(dt)
    if dt.kind != "f":
        return np.add(matmul(a, b), c)  # integer MatMul then Add: the unfused results exactly
    return _matmul_bias_f32(a, b, c)


def _matmul_bias_f32(a, w, c):
    """a @ w + c for float32/float64 operands; c is added in place when it does not grow the product's shape."""
    if a.ndim == 0 or w.ndim == 0:
        raise ValueError(f"MatMulBias: inputs must have rank >= 1, got shapes {a.shape} and {w.shape}")
    if w.ndim == 2 and a.shape[-1] == w.shape[0]:
        if c.dtype == a.dtype and c.ndim <= 1 and c.size in (1, w.shape[1]):
            return _mm_rows(a, w, c)  # the bias added in the product's own pass
        y = _mm_rows(a, w)
    else:
        y = _mm("MatMulBias", a, w)
    if y.ndim == 0 or c.ndim > y.ndim or not _fits(c.shape, y.shape) or not y.flags.writeable:
        return np.add(y, c)
    y += c
    return y


def _fits(c_shape, y_shape) -> bool:
    try:
        return np.broadcast_shapes(c_shape, y_shape) == y_shape
    except ValueError:
        return False


@kernel("MatMulBias", domain="ai.onnxpy")
def matmul_bias(A, B, bias):
    """MatMul(A, B) + bias (written by the level-99 MatMulBiasFusion, onnxpy/optimizer/fusions.py).

    float32/float64: one GEMM and an in-place bias add on its fresh output.  float16/bfloat16: the product and
    the sum are computed in float32 and rounded once (the unfused graph rounds after the MatMul and again after
    the Add; the fused value is the more accurate of the two, within one unit of the narrow type).
    """
    return _matmul_bias_generic(A, B, bias)


# Output widths up to this take the transposed product (see :func:`matmul_w`); wider outputs cost more to transpose
# back with numpy than the product saves (measured: 128x3072 outputs ~0.9 ms to transpose against ~1 ms saved).
# OpenBLAS's transpose (``_blas.transpose_into``, 3-4x numpy's) moves the limit: 128 x 2304 / 3072 products then run
# 0.92-0.94x the plain ones; at 128 x 50257 (a language-model head) the transpose costs more than the product saves.
_WT_MAX_N = 1024
_WT_MAX_N_BLAS = 4096
_YT_FAST = True  # test hook: the BLAS transpose on/off


def yt_fast() -> bool:
    """True when transposed products are turned back with OpenBLAS's transpose."""
    return _YT_FAST and _blas.transpose_available()


def matmul_w(a: np.ndarray, w: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """``a @ w (+ c)`` for a C-contiguous 2-D ``a`` (M, K) and a 2-D weight ``w`` (K, N): a fresh C-contiguous result.

    A Fortran-ordered ``w`` (the layout the level-99 optimizer gives MatMulBias weights, and the transposed B of
    Gemm(transB=1)) is C-contiguous as ``w.T``: the product is then formed as ``(w.T @ a.T).T``, which OpenBLAS runs
    20-25% faster than ``a @ w`` at transformer shapes (128x768 @ 768x768: 0.84 vs 1.09 ms; 128x3072 @ 3072x768:
    3.5 vs 4.8 ms), and turned back with OpenBLAS's transpose before the bias pass (float32, up to
    ``_WT_MAX_N_BLAS`` columns), else with numpy's transposed copy in the pass that adds the bias (up to
    ``_WT_MAX_N``)."""
    N = w.shape[1]
    fast = w.dtype == _F32 and a.dtype == _F32 and yt_fast()  # (the product is turned back by OpenBLAS)
    if w.flags.f_contiguous and not w.flags.c_contiguous and a.shape[0] > 1 and (
            N <= _WT_MAX_N or fast and N <= _WT_MAX_N_BLAS):
        yt = _dot2(w.T, a.T)
        out = np.empty((a.shape[0], N), yt.dtype)
        if fast:
            _blas.transpose_into(yt, out)
            if c is not None:
                out += c
        elif c is None:
            np.copyto(out, yt.T)
        else:
            np.add(yt.T, c, out=out)
        return out
    y = _dot2(a, w)
    if c is not None:
        y += c
    return y


def _matmul_bias_specialize(consts, kwargs):
    """Constant 2-D weight and bias: converted to the compute type once, per plan."""
    if len(consts) != 3:
        return None
    _, w, c = consts
    if w is NOT_CONST or c is NOT_CONST or not isinstance(w, np.ndarray) or not isinstance(c, np.ndarray):
        return None
    dt = w.dtype
    if w.ndim != 2 or c.dtype != dt or dt.kind != "f" and dt not in _LOW_FLOATS:
        return None
    generic = _matmul_bias_generic
    pw = _packed.pack(w) if dt == _F32 and c.ndim <= 1 and c.size in (1, w.shape[1]) else None
    if pw is not None:  # packed once for OpenBLAS's kernel (ops._packed); the plan releases the original
        K = w.shape[0]

        def run_packed(A, B, bias):
            if type(A) is not np.ndarray or A.dtype != _F32 or A.ndim < 2 or A.shape[-1] != K or bias is not c:
                return generic(A, _packed.real(B), bias)
            return _packed.matmul_rows(A, pw, c)

        run_packed.releases = (1,)
        return run_packed
    low = dt in _LOW_FLOATS
    w_c = np.array(w, _F32, order="K") if low else w  # (a Fortran-ordered weight stays so: see matmul_w)
    c_c = c.astype(_F32) if low else c

    def run(A, B, bias):
        if type(A) is not np.ndarray or A.dtype != dt or A.ndim == 0 or A.shape[-1] != w_c.shape[0]:
            return generic(A, B, bias)
        if low:
            return _matmul_bias_f32(_act_f32(A), w_c, c_c).astype(dt)
        return _matmul_bias_f32(A, w_c, c_c)

    return run


matmul_bias.specialize = _matmul_bias_specialize


# --- Gemm --------------------------------------------------------------------------------------------------------


def _gemm(A, B, C, alpha, beta, transA, transB):
    a = _arr(A, "Gemm", "A")
    b = _arr(B, "Gemm", "B")
    _check_same_type("Gemm", a, b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm: A and B must be 2-D, got shapes {a.shape} and {b.shape}")
    dt = a.dtype
    low = dt in _LOW_FLOATS
    if low:
        a = a.astype(_F32)
        b = _to_f32(b)  # before the transpose: the cache knows the weight, not a fresh view of it
    if transA:
        a = a.T
    if transB:
        b = b.T
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"Gemm: incompatible shapes A'{a.shape} and B'{b.shape} (transA={transA}, transB={transB})"
        )
    y = _mm_rows(a, b) if a.dtype.kind == "f" and b.dtype == a.dtype else _matmul(a, b)
    is_int = y.dtype.kind in "iu"
    alpha = float(alpha)
    beta = float(beta)
    if alpha != 1.0:
        if is_int:
            y = (y * alpha).astype(dt)
        else:
            y *= y.dtype.type(alpha)
    if C is not None and beta != 0.0:
        c = _arr(C, "Gemm", "C")
        if c.dtype != dt:
            raise TypeError(f"Gemm: C must have the same element type as A, got {c.dtype} and {dt}")
        if low:
            c = c.astype(_F32)
        if beta != 1.0:
            c = (c * beta).astype(dt) if is_int else c * c.dtype.type(beta)
        if c.shape == y.shape or c.ndim <= 1 and c.size in (1, y.shape[1]):  # (the usual biases, checked cheaply)
            ok = True
        else:
            try:
                ok = np.broadcast_shapes(c.shape, y.shape) == y.shape
            except ValueError:
                ok = False
        if not ok:
            raise ValueError(f"Gemm: C of shape {c.shape} cannot be broadcast to the output shape {y.shape}")
        y += c
    if low:
        y = y.astype(dt)
    return y


def _gemm_specialize(consts, kwargs):
    """Constant float32/float64 B (and C, a bias of 1 or N values), alpha = 1, A not transposed -- the Gemm of
    classifier heads and of exported LSTM cells: the generic checks and transposes are done once, per plan; each
    call is the product (the same GEMM call as the generic path) and the bias added in place."""
    if len(consts) < 2:
        return None
    b = consts[1]
    c = c0 = consts[2] if len(consts) > 2 else None
    if type(b) is not np.ndarray or b.ndim != 2 or b.dtype not in (_F32, _F64) or c is NOT_CONST:
        return None
    alpha, beta = float(kwargs.get("alpha", 1.0)), float(kwargs.get("beta", 1.0))
    transA, transB = int(kwargs.get("transA", 0)), int(kwargs.get("transB", 0))
    if alpha != 1.0 or transA:
        return None
    dt = b.dtype
    w = b.T if transB else b
    K, N = w.shape
    if c is not None and beta != 0.0:
        if type(c) is not np.ndarray or c.dtype != dt or beta != 1.0 or not (
                c.shape in ((N,), (1, N)) or c.ndim <= 2 and c.size == 1):
            return None
    else:
        c = None
    pw = _packed.pack(b, bool(transB))
    if pw is not None:  # packed once for OpenBLAS's kernel (ops._packed); the plan releases the original

        def run_packed(A, B, C=None):
            if type(A) is not np.ndarray or A.dtype != dt or A.ndim != 2 or A.shape[1] != K or C is not c0:
                return _gemm(A, _packed.real(B), C, alpha, beta, transA, transB)
            return _packed.matmul(A, pw, c)

        run_packed.releases = (1,)
        return run_packed

    def run(A, B, C=None):
        if type(A) is not np.ndarray or A.dtype != dt or A.ndim != 2 or A.shape[1] != K:
            return _gemm(A, B, C, alpha, beta, transA, transB)
        y = _mm_rows(A, w)
        if c is not None:
            y += c
        return y

    return run


@kernel("Gemm", since=(1, 6))
def gemm_1(A, B, C, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    return _gemm(A, B, C, alpha, beta, transA, transB)


@kernel("Gemm", since=(7, 9))
def gemm_7(A, B, C, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    return _gemm(A, B, C, alpha, beta, transA, transB)


@kernel("Gemm", since=(11, 13))
def gemm_11(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    return _gemm(A, B, C, alpha, beta, transA, transB)


gemm_1.specialize = gemm_7.specialize = gemm_11.specialize = _gemm_specialize


# --- MatMulInteger -----------------------------------------------------------------------------------------------


def _int8_type(op, name, x):
    if x.dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise TypeError(f"{op}: input '{name}' must be int8 or uint8, got {x.dtype}")


@kernel("MatMulInteger", since=10)
def matmul_integer(A, B, a_zero_point=None, b_zero_point=None):
    op = "MatMulInteger"
    a = _arr(A, op, "A")
    b = _arr(B, op, "B")
    _int8_type(op, "A", a)
    _int8_type(op, "B", b)
    # float64 BLAS is exact here: |products| <= 2^16, so sums stay exact far beyond any realistic K
    af = a.astype(np.float64)
    bf = b.astype(np.float64)
    if a_zero_point is not None:
        az = _arr(a_zero_point, op, "a_zero_point")
        if az.dtype != a.dtype:
            raise TypeError(f"{op}: a_zero_point must have A's type {a.dtype}, got {az.dtype}")
        if az.size == 1:
            af -= float(az.reshape(-1)[0])
        else:
            if az.ndim == 1 and a.ndim >= 2:
                if az.shape[0] != a.shape[-2]:
                    raise ValueError(f"{op}: a_zero_point of shape {az.shape} does not match A's {a.shape[-2]} rows")
                az = az.reshape(-1, 1)
            af -= az.astype(np.float64)
    if b_zero_point is not None:
        bz = _arr(b_zero_point, op, "b_zero_point")
        if bz.dtype != b.dtype:
            raise TypeError(f"{op}: b_zero_point must have B's type {b.dtype}, got {bz.dtype}")
        if bz.size == 1:
            bf -= float(bz.reshape(-1)[0])
        else:
            if bz.ndim == 1 and b.ndim >= 2 and bz.shape[0] != b.shape[-1]:
                raise ValueError(f"{op}: b_zero_point of shape {bz.shape} does not match B's {b.shape[-1]} columns")
            bf -= bz.astype(np.float64)
    y = _mm(op, af, bf)
    return y.astype(np.int64).astype(np.int32)


# --- Einsum ------------------------------------------------------------------------------------------------------


@kernel("Einsum", since=(12, 28))
def einsum(*Inputs, equation):
    eq = str(equation).replace(" ", "")
    if not Inputs:
        raise ValueError("Einsum: needs at least one input")
    ops = [_arr(x, "Einsum", f"Inputs[{i}]") for i, x in enumerate(Inputs)]
    dt = ops[0].dtype
    for x in ops[1:]:
        if x.dtype != dt:
            raise TypeError(f"Einsum: all inputs must have the same element type, got {dt} and {x.dtype}")
    lhs = eq.split("->")[0]
    if lhs.count(",") + 1 != len(ops):
        n_terms = lhs.count(",") + 1
        raise ValueError(f"Einsum: equation '{equation}' has {n_terms} terms but {len(ops)} inputs were given")
    low = dt in _LOW_FLOATS
    if low:
        ops = [x.astype(_F32) for x in ops]
    try:
        res = np.einsum(eq, *ops, optimize=len(ops) > 1)
    except (ValueError, TypeError) as e:
        raise ValueError(f"Einsum: invalid equation '{equation}' for shapes {[x.shape for x in ops]}: {e}") from None
    res = np.asarray(res)
    if res.dtype != dt:
        res = res.astype(dt)
    return res


# --- Det ---------------------------------------------------------------------------------------------------------


@kernel("Det", since=(11, 22))
def det(X):
    x = _arr(X, "Det", "X")
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"Det: input must have shape [*, M, M], got {x.shape}")
    if x.dtype.kind not in "f" and x.dtype not in _LOW_FLOATS:
        raise TypeError(f"Det: input must be a float tensor, got {x.dtype}")
    work = x.astype(_F32) if x.dtype in _LOW_FLOATS else x
    return np.asarray(np.linalg.det(work)).astype(x.dtype, copy=False)
