"""The CPU memory "arena" (``SessionOptions.enable_cpu_mem_arena``, on by default as in onnxruntime).

glibc's malloc is told to serve large buffers from its heap and to keep freed ones, instead of mmap/munmap-ing
each activation, which otherwise page-faults every large tensor on every run (15-17k faults per run on
ResNet-50/VGG-19, ~15% of the run time).  Like onnxruntime's arena, the memory a session freed is handed back
when the session goes away (``malloc_trim``).  Process-wide; a no-op outside glibc.
"""

from __future__ import annotations

import ctypes
import sys
import threading

_lock = threading.Lock()
_libc = None  # loaded libc, or False when unavailable
_tuned = False


def _glibc():
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(None)
                lib.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
                lib.malloc_trim.argtypes = (ctypes.c_size_t,)
                _libc = lib
            except (OSError, AttributeError):
                _libc = False
    return _libc


def tune_heap() -> bool:
    """Keep freed buffers in the heap (done once per process); True when glibc took the settings."""
    global _tuned
    with _lock:
        lib = _glibc()
        if not lib:
            return False
        if not _tuned:
            lib.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: buffers up to 1 GiB come from the (reused) heap
            lib.mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD: keep the freed top of the heap between runs
            lib.mallopt(-2, 64 << 20)  # M_TOP_PAD: grow the heap in 64 MiB steps
            _tuned = True
        return True


def release_heap() -> None:
    """Give the heap's free memory back to the operating system (called when a session is released)."""
    lib = _glibc()
    if lib and _tuned:
        lib.malloc_trim(0)
