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


# numpy asks the kernel for transparent huge pages for every large array (madvise(MADV_HUGEPAGE)); where the
# kernel then compacts memory on the fault ("defrag: madvise", a common default) loading a model's weights stalls
# for it: BERT-base's 440 MB of initializers took 800-1000 ms to load instead of 420-560.  Run times measured the
# same either way (within 1-2% on BERT-base and GPT-2), so sessions are built with the advice off and runs keep it.
_hp_lock = threading.Lock()
_hp_depth = 0
_hp_prev = None


_hp_fn: list = []  # numpy's switch, once looked up (None when numpy has none)


def _hp_setter():
    if not _hp_fn:
        fn = None
        for mod in ("numpy._core.multiarray", "numpy.core.multiarray"):
            try:
                fn = getattr(__import__(mod, fromlist=["_set_madvise_hugepage"]), "_set_madvise_hugepage", None)
            except ImportError:
                continue
            if fn is not None:
                break
        _hp_fn.append(fn)
    return _hp_fn[0]


class without_hugepages:
    """Context manager: numpy's huge-page advice off inside (nested and concurrent uses restore it once, when
    the last one leaves); a no-op where numpy has no such switch."""

    def __enter__(self):
        global _hp_depth, _hp_prev
        fn = _hp_setter()
        with _hp_lock:
            if fn is not None:
                if _hp_depth == 0:
                    _hp_prev = bool(fn(False))
                _hp_depth += 1
        self._fn = fn
        return self

    def __exit__(self, *exc):
        global _hp_depth
        fn = self._fn
        with _hp_lock:
            if fn is not None:
                _hp_depth -= 1
                if _hp_depth == 0:
                    fn(bool(_hp_prev))
        return False
