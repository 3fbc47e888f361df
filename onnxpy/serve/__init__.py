"""Inference server for onnxpy sessions speaking the KServe v2 / Triton open inference protocol (HTTP/REST).

``onnxpy serve model.onnx`` or ``python -m onnxpy.serve model.onnx``; needs the ``serve`` extra
(``pip install 'onnxpy[serve]'``: starlette + uvicorn).  See docs/serving.md.

The protocol/repository modules are plain numpy; the web framework is imported only by :func:`build_app`,
:class:`ServerThread` and :func:`cli_main`, so ``import onnxpy.serve`` works without the extra.
"""

from __future__ import annotations

from .protocol import ProtocolError
from .repository import ModelRepository, ServedModel


def build_app(repository, config=None):
    """Starlette ASGI app serving ``repository`` (a :class:`ModelRepository`)."""
    from .app import build_app as _build

    return _build(repository, config)


def cli_main(argv=None) -> int:
    """Entry point of ``onnxpy serve``."""
    from .server import cli_main as _main

    return _main(argv)


def __getattr__(name):
    if name == "ServeConfig":
        from .app import ServeConfig

        return ServeConfig
    if name == "ServerThread":
        from .server import ServerThread

        return ServerThread
    raise AttributeError(name)


__all__ = ["ModelRepository", "ProtocolError", "ServeConfig", "ServedModel", "ServerThread", "build_app", "cli_main"]
