"""Exception types (onnxruntime's classes) and helpers that build messages naming node, inputs and shapes."""

from __future__ import annotations

import numpy as np

from .capi.onnxruntime_pybind11_state import (  # noqa: F401 - re-exported
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoaded,
    NoModel,
    NoSuchFile,
    NotImplemented,
    RuntimeException,
)


class OnnxpyKernelError(ValueError):
    """Raised by kernels for invalid inputs/attributes; the executor wraps it with the node's context."""


def describe_value(v) -> str:
    """Short type/shape text of a runtime value for error messages."""
    if v is None:
        return "None"
    if isinstance(v, np.ndarray):
        return f"{v.dtype}{list(v.shape)}"
    if isinstance(v, list):
        return f"seq[{len(v)}]"
    if isinstance(v, dict):
        return f"map[{len(v)}]"
    return type(v).__name__
