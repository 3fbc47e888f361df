"""Intra-op threads: the BLAS library's thread count follows ``SessionOptions.intra_op_num_threads``.

numpy's heavy kernels (matmul, and through it Conv/Gemm/attention) run in the BLAS library it links
(OpenBLAS for the PyPI wheels, MKL or BLIS elsewhere).  The library is found among the shared objects loaded
in this process and its ``*_set_num_threads`` entry point is called through ctypes.  The thread count is
process-wide in these libraries, so sessions with different settings take turns (a lock around the change
is cheap: it only happens when the wanted count differs from the current one).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads", "MKL_Set_Num_Threads", "bli_thread_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads", "MKL_Get_Max_Threads", "bli_thread_get_num_threads")

_lock = threading.Lock()
_api = None  # (setter, getter) or () when no BLAS library was found


def _loaded_libraries() -> list[str]:
    paths = []
    if sys.platform.startswith("linux") and os.path.exists("/proc/self/maps"):
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1] if line.strip() else ""
                if p.startswith("/") and ".so" in p and p not in paths:
                    low = os.path.basename(p).lower()
                    if "blas" in low or "mkl" in low or "blis" in low:
                        paths.append(p)
    return paths


def _find_api():
    global _api
    if _api is not None:
        return _api
    import numpy  # noqa: F401 - make sure numpy's BLAS is loaded

    _api = ()
    for path in _loaded_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, s) for s in _SETTERS if hasattr(lib, s)), None)
        getter = next((getattr(lib, g) for g in _GETTERS if hasattr(lib, g)), None)
        if setter is not None and getter is not None:
            getter.restype = ctypes.c_int
            _api = (setter, getter)
            break
    return _api


def blas_available() -> bool:
    return bool(_find_api())


def get_blas_threads() -> int | None:
    api = _find_api()
    return int(api[1]()) if api else None


def set_blas_threads(n: int) -> bool:
    """Set the BLAS thread count (n >= 1); False when no controllable BLAS library is loaded."""
    api = _find_api()
    if not api or n < 1:
        return False
    with _lock:
        if api[1]() != n:
            api[0](int(n))
    return True
