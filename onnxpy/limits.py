"""Configurable resource limits that protect a process from hostile or broken models.

* ``max_tensor_bytes`` -- the largest single tensor a kernel may allocate.  Default 16 GiB; override per process
  with the environment variable ``ONNXPY_MAX_TENSOR_BYTES`` or per session with the session config entry
  ``session.max_tensor_bytes`` (``SessionOptions.add_session_config_entry``).  ``0`` or a negative value
  means "no limit".
* ``max_loop_iterations`` -- the most iterations one Loop node may run.  Default unlimited (like onnxruntime);
  set with ``ONNXPY_MAX_LOOP_ITERATIONS`` or the session config entry ``session.max_loop_iterations``.

Kernels that size their output from *data* (ConstantOfShape, Expand, Tile, Reshape, Range, Resize, Pad,
OneHot, ...) call :func:`check_alloc` before allocating; it raises :class:`AllocationLimitError` (a
``ValueError``, so the executor reports it as ``Fail`` naming the node) instead of letting numpy allocate
terabytes or the OS kill the process.

The per-session values are installed for the duration of a run on the running thread with :func:`applied`
(the session does this); subgraph runs happen on the same thread and inherit them.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

DEFAULT_MAX_TENSOR_BYTES = 16 * 2**30
ENV_MAX_TENSOR_BYTES = "ONNXPY_MAX_TENSOR_BYTES"
ENV_MAX_LOOP_ITERATIONS = "ONNXPY_MAX_LOOP_ITERATIONS"
CONFIG_MAX_TENSOR_BYTES = "session.max_tensor_bytes"
CONFIG_MAX_LOOP_ITERATIONS = "session.max_loop_iterations"


class AllocationLimitError(ValueError):
    """A kernel was asked to create a tensor larger than the configured limit (or with an invalid shape)."""


class IterationLimitError(ValueError):
    """A Loop ran more iterations than the configured limit."""


def _parse(text, what: str) -> int | None:
    """A limit value from config/env text: int (``1e9`` and ``16GiB``-style suffixes accepted); <=0 -> None."""
    s = str(text).strip().lower().replace("_", "")
    mult = 1
    for suffix, m in (("kib", 2**10), ("mib", 2**20), ("gib", 2**30), ("tib", 2**40),
                      ("kb", 10**3), ("mb", 10**6), ("gb", 10**9), ("tb", 10**12)):
        if s.endswith(suffix):
            s, mult = s[: -len(suffix)].strip(), m
            break
    try:
        v = int(s) if s.lstrip("+-").isdigit() else int(float(s))
    except (ValueError, OverflowError):
        raise ValueError(f"{what}: cannot parse limit value {text!r} (expected an integer number)") from None
    v *= mult
    return v if v > 0 else None


@dataclass(frozen=True)
class Limits:
    max_tensor_bytes: int | None = DEFAULT_MAX_TENSOR_BYTES
    max_loop_iterations: int | None = None


def from_env() -> Limits:
    """The process defaults (environment variables read at call time)."""
    tb = os.environ.get(ENV_MAX_TENSOR_BYTES)
    li = os.environ.get(ENV_MAX_LOOP_ITERATIONS)
    return Limits(
        max_tensor_bytes=DEFAULT_MAX_TENSOR_BYTES if tb is None else _parse(tb, ENV_MAX_TENSOR_BYTES),
        max_loop_iterations=None if li is None else _parse(li, ENV_MAX_LOOP_ITERATIONS),
    )


def from_config(config: dict | None) -> Limits:
    """Limits for a session: its config entries override the environment/defaults.

    Raises ``ValueError`` for an unparsable value (the session reports it as InvalidArgument).
    """
    base = from_env()
    config = config or {}
    tb, li = base.max_tensor_bytes, base.max_loop_iterations
    if CONFIG_MAX_TENSOR_BYTES in config:
        tb = _parse(config[CONFIG_MAX_TENSOR_BYTES], CONFIG_MAX_TENSOR_BYTES)
    if CONFIG_MAX_LOOP_ITERATIONS in config:
        li = _parse(config[CONFIG_MAX_LOOP_ITERATIONS], CONFIG_MAX_LOOP_ITERATIONS)
    return Limits(tb, li)


_local = threading.local()


def current() -> Limits:
    """Limits in force on this thread: the running session's, else the process defaults."""
    lim = getattr(_local, "limits", None)
    return lim if lim is not None else from_env()


def install(limits: Limits | None):
    """Install ``limits`` on this thread; returns what was there, for :func:`restore` (the cheap form of applied)."""
    prev = getattr(_local, "limits", None)
    _local.limits = limits
    return prev


def restore(prev) -> None:
    _local.limits = prev


@contextmanager
def applied(limits: Limits | None):
    """Install ``limits`` on this thread for the duration of the block (nestable)."""
    prev = install(limits)
    try:
        yield
    finally:
        restore(prev)


def max_tensor_bytes() -> int | None:
    return current().max_tensor_bytes


def check_alloc(shape, dtype, what: str = "output") -> tuple:
    """Validate a shape a kernel is about to allocate; returns it as a tuple of Python ints.

    Raises :class:`AllocationLimitError` for negative dimensions or when ``prod(shape) * itemsize`` exceeds the
    current ``max_tensor_bytes`` limit.  Sizes are computed with Python integers (no overflow).
    """
    try:
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError, OverflowError):
        raise AllocationLimitError(f"{what}: shape {shape!r} is not a list of integers") from None
    n = 1
    for d in shape:
        if d < 0:
            raise AllocationLimitError(f"{what} shape {list(shape)} has a negative dimension")
        n *= d
    dt = np.dtype(dtype)
    itemsize = dt.itemsize or 8
    if dt.kind == "O":
        itemsize = max(itemsize, 8)
    nbytes = n * itemsize
    limit = current().max_tensor_bytes
    if limit is not None and nbytes > limit:
        raise AllocationLimitError(
            f"{what} shape {list(shape)} ({dt}) would need {nbytes} bytes, more than the limit of {limit} bytes "
            f"(set session config '{CONFIG_MAX_TENSOR_BYTES}' or env {ENV_MAX_TENSOR_BYTES} to change it)"
        )
    return shape


def check_iterations(count: int, what: str = "Loop") -> None:
    """Raise :class:`IterationLimitError` once ``count`` iterations exceed ``max_loop_iterations``."""
    limit = current().max_loop_iterations
    if limit is not None and count > limit:
        raise IterationLimitError(
            f"{what} exceeded the limit of {limit} iterations (set session config '{CONFIG_MAX_LOOP_ITERATIONS}' "
            f"or env {ENV_MAX_LOOP_ITERATIONS} to change it)"
        )


__all__ = [
    "DEFAULT_MAX_TENSOR_BYTES", "AllocationLimitError", "IterationLimitError", "Limits", "from_env", "from_config",
    "current", "applied", "max_tensor_bytes", "check_alloc", "check_iterations",
]
