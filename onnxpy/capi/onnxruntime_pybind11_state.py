"""onnxruntime's exception classes, under the module path existing code imports them from.

Each class carries onnxruntime's status code and name; :func:`make` builds the message with onnxruntime's
``[ONNXRuntimeError] : <code> : <NAME> : <text>`` prefix so code matching on those strings keeps working.
"""

from __future__ import annotations


class _OrtError(Exception):
    code = 1
    status = "FAIL"

    @classmethod
    def make(cls, text: str) -> _OrtError:
        return cls(f"[ONNXRuntimeError] : {cls.code} : {cls.status} : {text}")


def _cls(name: str, code: int, status: str):
    return type(name, (_OrtError,), {"code": code, "status": status, "__module__": __name__})


Fail = _cls("Fail", 1, "FAIL")
InvalidArgument = _cls("InvalidArgument", 2, "INVALID_ARGUMENT")
NoSuchFile = _cls("NoSuchFile", 3, "NO_SUCHFILE")
NoModel = _cls("NoModel", 4, "NO_MODEL")
EngineError = _cls("EngineError", 5, "ENGINE_ERROR")
RuntimeException = _cls("RuntimeException", 6, "RUNTIME_EXCEPTION")
InvalidProtobuf = _cls("InvalidProtobuf", 7, "INVALID_PROTOBUF")
ModelLoaded = _cls("ModelLoaded", 8, "MODEL_LOADED")
NotImplemented = _cls("NotImplemented", 9, "NOT_IMPLEMENTED")  # noqa: A001 - onnxruntime's name
InvalidGraph = _cls("InvalidGraph", 10, "INVALID_GRAPH")
EPFail = _cls("EPFail", 11, "EP_FAIL")
ModelRequiresCompilation = _cls("ModelRequiresCompilation", 12, "MODEL_REQUIRES_COMPILATION")

__all__ = [
    "Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException", "InvalidProtobuf",
    "ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail", "ModelRequiresCompilation",
]
