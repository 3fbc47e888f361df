"""Compatibility namespace mirroring ``onnxruntime.capi``."""

from . import onnxruntime_pybind11_state  # noqa: F401
