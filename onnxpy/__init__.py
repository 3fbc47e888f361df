"""onnxpy: an ONNX inference runtime in Python, API-compatible with onnxruntime."""

from __future__ import annotations

import random as _random

import numpy as _np

from .capi.onnxruntime_pybind11_state import (  # noqa: F401
    EPFail, EngineError, Fail, InvalidArgument, InvalidGraph, InvalidProtobuf, ModelLoaded, NoModel, NoSuchFile,
    NotImplemented, RuntimeException,
)
from .iobinding import IOBinding
from .logging_utils import set_default_logger_callback, set_default_logger_severity
from .nodearg import ModelMetadata, NodeArg
from .options import ExecutionMode, ExecutionOrder, GraphOptimizationLevel, RunOptions, SessionOptions
from .ortvalue import OrtValue
from .providers import get_all_providers, get_available_providers
from .session import InferenceSession
from .sparse import OrtSparseFormat, SparseTensor

__version__ = "0.1.0"
version = __version__
package_name = "onnxpy"
cuda_version = ""

SessionIOBinding = IOBinding

_logger_severity = 2  # shared with logging_utils (process default severity)

def get_version_string() -> str:
    return __version__


def get_build_info() -> str:
    return f"onnxpy Build Info: version={__version__}, backend=numpy {_np.__version__}, build type=Release"


def get_device() -> str:
    return "CPU"


def set_default_logger_verbosity(verbosity: int) -> None:
    pass


def set_seed(seed: int) -> None:
    """Seed the generators used by random ops without a ``seed`` attribute."""
    from .ops import random_state

    random_state.seed(int(seed))
    _random.seed(int(seed))


__all__ = [
    "InferenceSession", "SessionOptions", "RunOptions", "OrtValue", "IOBinding", "SessionIOBinding", "NodeArg",
    "ModelMetadata", "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "get_available_providers",
    "get_all_providers", "get_device", "get_version_string", "get_build_info", "set_default_logger_severity",
    "set_seed", "set_default_logger_callback", "Fail", "InvalidArgument", "NoSuchFile", "InvalidProtobuf",
    "InvalidGraph", "NotImplemented",
    "RuntimeException", "EPFail", "EngineError", "NoModel", "ModelLoaded", "SparseTensor", "OrtSparseFormat",
]
