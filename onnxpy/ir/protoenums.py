"""The ONNX enum values the runtime needs, without importing onnx (whose import costs ~100 ms per process).

The names and values are those of ``onnx.TensorProto.DataType``, ``onnx.TensorProto.DataLocation`` and
``onnx.AttributeProto.AttributeType``; ``tests/test_proto_loading.py`` checks them against the installed onnx.
"""

from __future__ import annotations


class TensorProto:
    UNDEFINED = 0
    FLOAT = 1
    UINT8 = 2
    INT8 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    STRING = 8
    BOOL = 9
    FLOAT16 = 10
    DOUBLE = 11
    UINT32 = 12
    UINT64 = 13
    COMPLEX64 = 14
    COMPLEX128 = 15
    BFLOAT16 = 16
    FLOAT8E4M3FN = 17
    FLOAT8E4M3FNUZ = 18
    FLOAT8E5M2 = 19
    FLOAT8E5M2FNUZ = 20
    UINT4 = 21
    INT4 = 22
    FLOAT4E2M1 = 23
    FLOAT8E8M0 = 24
    UINT2 = 25
    INT2 = 26
    FLOAT6E2M3 = 27
    FLOAT6E3M2 = 28
    # DataLocation
    DEFAULT = 0
    EXTERNAL = 1


class AttributeProto:
    UNDEFINED = 0
    FLOAT = 1
    INT = 2
    STRING = 3
    TENSOR = 4
    GRAPH = 5
    FLOATS = 6
    INTS = 7
    STRINGS = 8
    TENSORS = 9
    GRAPHS = 10
    SPARSE_TENSOR = 11
    SPARSE_TENSORS = 12
    TYPE_PROTO = 13
    TYPE_PROTOS = 14


def data_type_names() -> dict[str, int]:
    """Every element-type name defined here -> its value."""
    return {k: v for k, v in vars(TensorProto).items() if k.isupper() and k not in ("DEFAULT", "EXTERNAL")}


def attribute_type_names() -> dict[str, int]:
    return {k: v for k, v in vars(AttributeProto).items() if k.isupper()}


def onnx_package_dir() -> str | None:
    """The installed onnx package's folder, found without importing it (None if there is none)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("onnx")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def onnx_version() -> str | None:
    """The installed onnx's version, read from its distribution metadata without importing it (None if unknown)."""
    import os

    pkg = onnx_package_dir()
    if pkg is None:
        return None
    try:
        names = os.listdir(os.path.dirname(pkg))
    except OSError:
        return None
    found = [n for n in names if n.startswith("onnx-") and n.endswith((".dist-info", ".egg-info"))]
    if len(found) != 1:
        return None
    return found[0][len("onnx-"):].rsplit(".", 1)[0]
