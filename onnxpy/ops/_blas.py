"""Direct access to the BLAS library numpy links, for what ``np.matmul`` cannot express: a GEMM that accumulates
into its output (beta = 1) and operands that are strided views of a larger buffer (a row-major matrix with a row
stride larger than its width, e.g. a window of a flattened zero-padded image) -- and OpenBLAS's out-of-place
transpose (``cblas_somatcopy``), 3-4x faster than numpy's copy of a transposed view (a 3072 x 128 float32 matrix:
0.29 vs 1.07 ms with a bias pass in both; numpy walks one side with a large stride element by element).

The ``cblas_sgemm`` entry point is looked up among the shared objects loaded in this process (the same search
as ``execution.threads``), only where its integer width is known: the ``64_``-suffixed ILP64 symbols of OpenBLAS
(numpy's wheels: ``scipy_cblas_sgemm64_``) take 64-bit integers; a plain ``cblas_sgemm`` is used only from an
OpenBLAS whose configuration string says it was not built with 64-bit integers (other libraries -- MKL's ILP64
layer exports the same name with 64-bit integers -- are left alone).  On first use a small product is checked
against numpy (a wrong binding is never used); without a usable library :func:`available` is False and callers
keep their numpy paths.  ``ONNXPY_DIRECT_BLAS=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

__all__ = ["available", "axpy_function", "library", "sgemm", "transpose_available", "transpose_into"]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_NAMES = (("scipy_cblas_sgemm64_", ctypes.c_int64), ("cblas_sgemm64_", ctypes.c_int64),
          ("scipy_cblas_sgemm", ctypes.c_int32), ("cblas_sgemm", ctypes.c_int32))
_lock = threading.Lock()
_fn = None  # the bound function, False when there is none
_omat = None  # the bound cblas_somatcopy of the same library (None: not looked up yet, False: none)
_axpy = None  # the bound cblas_saxpy of the same library (likewise)
_lib = [None]  # the library those came from (a ctypes.CDLL)


def _bind():
    global _omat, _axpy
    from ..execution.threads import _loaded_libraries

    for path in _loaded_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name, itype in _NAMES:
            f = getattr(lib, name, None)
            if f is None or itype is ctypes.c_int32 and not _lp64_openblas(lib):
                continue
            P, F, E = ctypes.c_void_p, ctypes.c_float, ctypes.c_int
            f.argtypes = [E, E, E, itype, itype, itype, F, P, itype, P, itype, F, P, itype]
            f.restype = None
            _omat = _bind_omatcopy(lib, name, itype)
            _axpy = _bind_axpy(lib, name, itype)
            _lib[0] = lib
            return f
    return None


def _bind_omatcopy(lib, sgemm_name: str, itype):
    """``cblas_somatcopy`` (an OpenBLAS extension) named like the bound sgemm, with the same integer width, or
    False."""
    g = getattr(lib, sgemm_name.replace("sgemm", "somatcopy"), None)
    if g is None:
        return False
    P, F, E = ctypes.c_void_p, ctypes.c_float, ctypes.c_int
    g.argtypes = [E, E, itype, itype, F, P, itype, P, itype]
    g.restype = None
    return g


def _bind_axpy(lib, sgemm_name: str, itype):
    """``cblas_saxpy`` named like the bound sgemm (same library, same integer width), or False."""
    g = getattr(lib, sgemm_name.replace("sgemm", "saxpy"), None)
    if g is None:
        return False
    g.argtypes = [itype, ctypes.c_float, ctypes.c_void_p, itype, ctypes.c_void_p, itype]
    g.restype = None
    return g


def openblas_info(lib, what: str, restype):
    """The answer of OpenBLAS's ``openblas_<what>`` query (``get_config``, ``get_corename``, ``get_parallel``) under
    the names numpy's build (``scipy_`` prefix, ``64_`` suffix) and others export; None when the library has none."""
    for name in (f"scipy_openblas_{what}64_", f"openblas_{what}64_", f"scipy_openblas_{what}", f"openblas_{what}"):
        f = getattr(lib, name, None)
        if f is not None:
            f.restype = restype
            return f()
    return None


def _lp64_openblas(lib) -> bool:
    """True for an OpenBLAS built with 32-bit integers (its configuration string lacks USE64BITINT)."""
    cfg = openblas_info(lib, "get_config", ctypes.c_char_p)
    return cfg is not None and b"USE64BITINT" not in (cfg or b"USE64BITINT")


def _self_test(f) -> bool:
    global _omat, _axpy
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 9)).astype(np.float32)
    c = np.ones((5, 9), dtype=np.float32)
    f(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, 5, 9, 7, 1.0, a.ctypes.data, 7, b.ctypes.data, 9, 1.0, c.ctypes.data, 9)
    if _omat:  # a strided source (row stride 9 > 7 columns): the transpose must be exact
        t = np.full((7, 5), np.nan, dtype=np.float32)
        _omat(_ROW_MAJOR, _TRANS, 5, 7, 1.0, c.ctypes.data, 9, t.ctypes.data, 5)
        if not np.array_equal(t, c[:, :7].T):
            _omat = False
    if _axpy:  # y += 0.5 * x[::2], y strided too
        x = rng.standard_normal(12).astype(np.float32)
        y = rng.standard_normal(12).astype(np.float32)
        want = y.copy()
        want[::2] += np.float32(0.5) * x[::2]
        _axpy(6, 0.5, x.ctypes.data, 2, y.ctypes.data, 2)
        if not np.allclose(y, want, rtol=1e-6, atol=1e-6):
            _axpy = False
    return bool(np.allclose(c, a @ b + 1, rtol=1e-5, atol=1e-5))


def available() -> bool:
    """True when a checked ``cblas_sgemm`` is bound."""
    global _fn
    if _fn is None:
        with _lock:
            if _fn is None:
                f = None
                if os.environ.get("ONNXPY_DIRECT_BLAS", "1") != "0":
                    try:
                        f = _bind()
                        if f is not None and not _self_test(f):
                            f = None
                    except (OSError, AttributeError, ValueError, TypeError):
                        f = None
                _fn = f if f is not None else False
    return _fn is not False


def sgemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, beta: float) -> None:
    """c = a @ b + beta * c for float32 2-D arrays whose last axis is contiguous and whose rows do not overlap
    (strided row views allowed); c is written in place.  Call only when :func:`available` is True."""
    m, k = a.shape
    k2, n = b.shape
    if (k2 != k or c.shape != (m, n) or a.dtype != np.float32 or b.dtype != np.float32 or c.dtype != np.float32
            or not c.flags.writeable):
        raise ValueError("sgemm: operands must be float32 (m, k) @ (k, n) -> writeable (m, n)")
    lda, ldb, ldc = (_ld(x) for x in (a, b, c))
    if m and n:
        _fn(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, float(beta),
            c.ctypes.data, ldc)


def library():
    """The ctypes handle of the BLAS library whose checked ``cblas_sgemm`` is bound, or None."""
    return _lib[0] if available() else None


def axpy_function():
    """The bound ``cblas_saxpy(n, alpha, x, incx, y, incy)`` of the library numpy uses (pointers as integer
    addresses, float32 data), checked like sgemm; None when there is none.  A raw ctypes function: the caller keeps
    every pointer and count inside its buffers."""
    return _axpy if available() and _axpy else None


def transpose_available() -> bool:
    """True when :func:`transpose_into` runs OpenBLAS's transpose (else it is numpy's copy)."""
    return available() and bool(_omat)


def transpose_into(a: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[...] = a.T`` for a 2-D float32 ``a`` whose rows are contiguous (a row stride larger than its width is
    fine) and a C-contiguous float32 ``out`` of the transposed shape; OpenBLAS's ``somatcopy`` when it is bound
    (checked like sgemm), else numpy's copy.  Returns ``out``."""
    if (_omat and available() and a.dtype == np.float32 and out.dtype == np.float32 and a.ndim == 2
            and out.shape == a.shape[::-1] and out.flags.c_contiguous and out.flags.writeable and a.size
            and (a.strides[1] == 4 or a.shape[1] == 1) and a.strides[0] % 4 == 0 and a.strides[0] // 4 >= a.shape[1]
            and not np.may_share_memory(a, out)):
        rows, cols = a.shape
        _omat(_ROW_MAJOR, _TRANS, rows, cols, 1.0, a.ctypes.data, max(1, a.strides[0] // 4), out.ctypes.data,
              max(1, rows))
        return out
    np.copyto(out, a.T)
    return out


def _ld(x: np.ndarray) -> int:
    """Leading dimension (elements) of a row-major matrix view; ValueError unless BLAS can read it as one."""
    s0, s1 = x.strides
    rows, cols = x.shape
    if (s1 != 4 and cols > 1) or s0 % 4 or (rows > 1 and s0 // 4 < cols):
        raise ValueError("sgemm: a matrix needs contiguous rows that do not overlap")
    return max(1, s0 // 4 if rows > 1 else cols)
