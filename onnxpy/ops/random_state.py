"""The process-wide generator for random ops without a ``seed`` attribute (seeded by ``onnxpy.set_seed``)."""

from __future__ import annotations

import threading

import numpy as np

_lock = threading.Lock()
_rng = np.random.default_rng()


def seed(value: int) -> None:
    global _rng
    with _lock:
        _rng = np.random.default_rng(value)


def generator(seed_attr: float | None = None) -> np.random.Generator:
    """A generator for one op call: seeded from the op's ``seed`` attribute when given, else the global one."""
    if seed_attr is not None:
        return np.random.default_rng(int(seed_attr) & 0xFFFFFFFF)
    with _lock:
        return np.random.default_rng(_rng.integers(0, 2**63))
