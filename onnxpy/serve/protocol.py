"""KServe v2 / Triton open inference protocol: datatypes and tensor (de)serialization.

Pure numpy; no web framework needed, so the Ray integration and tests can reuse it.

JSON tensors carry ``data`` as a (flat or nested) row-major list.  The binary-tensor extension puts the raw bytes
after the JSON header: the header length is sent in ``Inference-Header-Content-Length`` and each binary tensor
declares ``parameters.binary_data_size``.  BYTES elements are serialized as a 4-byte little-endian length followed
by the bytes.
"""

from __future__ import annotations

import json
import struct

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"


class ProtocolError(ValueError):
    """A malformed or invalid request; reported to the client with the given HTTP status (4xx)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _bf16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


# v2 datatype -> numpy dtype (BYTES -> object)
_V2_TO_NP = {
    "BOOL": np.dtype(bool), "UINT8": np.dtype(np.uint8), "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64), "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16), "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}

# ONNX tensor element type name (as in NodeArg.type "tensor(<name>)") -> v2 datatype
_ONNX_TO_V2 = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
    "float": "FP32", "double": "FP64", "string": "BYTES", "bfloat16": "BF16",
}


def numpy_dtype(datatype: str) -> np.dtype:
    """numpy dtype of a v2 datatype name (``FP32`` -> float32, ``BYTES`` -> object)."""
    if datatype == "BF16":
        return _bf16()
    try:
        return _V2_TO_NP[datatype]
    except (KeyError, TypeError):
        raise ProtocolError(f"unsupported datatype '{datatype}'") from None


def v2_datatype(dtype) -> str:
    """v2 datatype name of a numpy dtype."""
    dtype = np.dtype(dtype)
    if dtype.kind in "OUS":
        return "BYTES"
    if dtype == _bf16():
        return "BF16"
    for k, v in _V2_TO_NP.items():
        if v == dtype:
            return k
    raise ProtocolError(f"numpy dtype {dtype} has no v2 datatype", status=500)


def onnx_type_to_v2(type_str: str) -> str:
    """``tensor(float)`` -> ``FP32``; non-tensor or unsupported element types raise ValueError."""
    if not (isinstance(type_str, str) and type_str.startswith("tensor(") and type_str.endswith(")")):
        raise ValueError(f"only tensor inputs/outputs can be served, got {type_str}")
    elem = type_str[len("tensor("):-1]
    if elem not in _ONNX_TO_V2:
        raise ValueError(f"tensor element type '{elem}' has no v2 protocol datatype")
    return _ONNX_TO_V2[elem]


def v2_shape(shape) -> list[int]:
    """NodeArg shape (ints, symbolic names or None) -> v2 shape (dynamic dims are -1)."""
    if shape is None:
        return [-1]
    return [int(d) if isinstance(d, (int, np.integer)) and d >= 0 else -1 for d in shape]


# ---------------------------------------------------------------------------------------------------------- decode
def _check_shape(name, shape) -> tuple[int, ...]:
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                               for d in shape):
        raise ProtocolError(f"input '{name}': 'shape' must be a list of non-negative integers, got {shape!r}")
    return tuple(shape)


def _flatten_json(data):
    """Flatten nested lists (row-major) without numpy guessing dtypes."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(x, list) for x in data):
        return data
    out = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def deserialize_bytes_tensor(buf: bytes, count: int | None = None) -> np.ndarray:
    """Length-prefixed BYTES elements -> 1-D object array of bytes."""
    items = []
    off, n = 0, len(buf)
    mv = memoryview(buf)
    while off < n:
        if off + 4 > n:
            raise ProtocolError("truncated BYTES tensor: incomplete 4-byte length prefix")
        (ln,) = struct.unpack_from("<I", buf, off)
        off += 4
        if off + ln > n:
            raise ProtocolError("truncated BYTES tensor: element longer than the remaining data")
        items.append(bytes(mv[off:off + ln]))
        off += ln
    if count is not None and len(items) != count:
        raise ProtocolError(f"BYTES tensor has {len(items)} elements, the shape needs {count}")
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr


def serialize_bytes_tensor(arr: np.ndarray) -> bytes:
    """Object/str/bytes array -> length-prefixed bytes (row-major)."""
    parts = []
    for x in np.asarray(arr, dtype=object).reshape(-1):
        b = x if isinstance(x, (bytes, bytearray)) else str(x).encode("utf-8")
        parts.append(struct.pack("<I", len(b)))
        parts.append(bytes(b))
    return b"".join(parts)


def _bytes_to_str(arr: np.ndarray) -> np.ndarray:
    """BYTES elements for an ONNX string tensor: decode UTF-8 (onnx string tensors hold str)."""
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, x in enumerate(flat_in):
        if isinstance(x, (bytes, bytearray)):
            try:
                flat_out[i] = bytes(x).decode("utf-8")
            except UnicodeDecodeError:
                raise ProtocolError("BYTES element is not valid UTF-8 (ONNX string tensors hold text)") from None
        else:
            flat_out[i] = str(x)
    return out


def decode_input(spec: dict, binary: bytes | memoryview | None) -> tuple[str, np.ndarray, str]:
    """One request input (JSON object plus its binary payload, if any) -> (name, array, datatype)."""
    if not isinstance(spec, dict):
        raise ProtocolError("each entry of 'inputs' must be an object")
    name = spec.get("name")
    if not isinstance(name, str):
        raise ProtocolError("input is missing a string 'name'")
    datatype = spec.get("datatype")
    if not isinstance(datatype, str):
        raise ProtocolError(f"input '{name}' is missing a string 'datatype'")
    shape = _check_shape(name, spec.get("shape"))
    dtype = numpy_dtype(datatype)
    count = int(np.prod(shape, dtype=np.int64))
    params = spec.get("parameters") or {}
    if not isinstance(params, dict):
        raise ProtocolError(f"input '{name}': 'parameters' must be an object")
    if "shared_memory_region" in params:
        raise ProtocolError(f"input '{name}': shared memory is not supported")
    if binary is not None:
        if datatype == "BYTES":
            arr = deserialize_bytes_tensor(bytes(binary), count)
        else:
            if len(binary) != count * dtype.itemsize:
                raise ProtocolError(f"input '{name}': {len(binary)} bytes of binary data, shape {list(shape)} "
                                    f"of {datatype} needs {count * dtype.itemsize}")
            arr = np.frombuffer(binary, dtype=dtype.newbyteorder("<")).astype(dtype, copy=True)
        return name, arr.reshape(shape), datatype
    if "data" not in spec:
        raise ProtocolError(f"input '{name}' has neither 'data' nor binary data")
    flat = _flatten_json(spec["data"])
    if len(flat) != count:
        raise ProtocolError(f"input '{name}': {len(flat)} data elements, shape {list(shape)} needs {count}")
    if datatype == "BYTES":
        if not all(isinstance(x, str) for x in flat):
            raise ProtocolError(f"input '{name}': BYTES data must be strings")
        arr = np.empty(count, dtype=object)
        arr[:] = flat
    elif datatype == "BOOL":
        if not all(isinstance(x, bool) for x in flat):
            raise ProtocolError(f"input '{name}': BOOL data must be true/false")
        arr = np.array(flat, dtype=bool)
    else:
        ok = (float, int) if dtype.kind == "f" else (int,)
        if not all(isinstance(x, ok) and not isinstance(x, bool) for x in flat):
            kind = "numbers" if dtype.kind == "f" else "integers"
            raise ProtocolError(f"input '{name}': {datatype} data must be {kind}")
        try:
            if dtype.kind in "iu":
                info = np.iinfo(dtype)
                if flat and (min(flat) < info.min or max(flat) > info.max):
                    raise ProtocolError(f"input '{name}': value out of range for {datatype}")
            arr = np.array(flat, dtype=np.float64 if dtype == _bf16() else dtype).astype(dtype)
        except (OverflowError, ValueError) as e:
            if isinstance(e, ProtocolError):
                raise
            raise ProtocolError(f"input '{name}': cannot convert data to {datatype}: {e}") from None
    return name, arr.reshape(shape), datatype


def split_binary(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    """Body -> (JSON header bytes, binary remainder)."""
    if header_length is None:
        return body, memoryview(b"")
    if header_length < 0 or header_length > len(body):
        raise ProtocolError(f"{HEADER_LENGTH} {header_length} is outside the body of {len(body)} bytes")
    mv = memoryview(body)
    return bytes(mv[:header_length]), mv[header_length:]


def parse_infer_request(body: bytes, header_length: int | None) -> tuple[dict, dict[str, np.ndarray], dict]:
    """Parse an infer request body -> (request JSON, {input name: array}, {input name: datatype})."""
    head, rest = split_binary(body, header_length)
    try:
        req = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"malformed JSON in the request: {e}") from None
    if not isinstance(req, dict):
        raise ProtocolError("the request must be a JSON object")
    inputs = req.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ProtocolError("the request needs a non-empty 'inputs' list")
    feeds, types = {}, {}
    off = 0
    for spec in inputs:
        params = spec.get("parameters") if isinstance(spec, dict) else None
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        chunk = None
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ProtocolError("'binary_data_size' must be a non-negative integer")
            if off + size > len(rest):
                raise ProtocolError(f"binary data for input '{spec.get('name')}' runs past the end of the body")
            chunk = rest[off:off + size]
            off += size
        name, arr, dt = decode_input(spec, chunk)
        if name in feeds:
            raise ProtocolError(f"input '{name}' appears twice")
        feeds[name], types[name] = arr, dt
    if off != len(rest):
        raise ProtocolError(f"{len(rest) - off} bytes of binary data are not claimed by any input")
    outputs = req.get("outputs")
    if outputs is not None and (not isinstance(outputs, list)
                                or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs)):
        raise ProtocolError("'outputs' must be a list of objects with a 'name'")
    params = req.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ProtocolError("request 'parameters' must be an object")
    return req, feeds, types


# ---------------------------------------------------------------------------------------------------------- encode
def _json_data(arr: np.ndarray, datatype: str) -> list:
    flat = arr.reshape(-1)
    if datatype == "BYTES":
        return [x.decode("utf-8", errors="replace") if isinstance(x, (bytes, bytearray)) else str(x) for x in flat]
    if datatype == "BF16":
        return flat.astype(np.float32).tolist()
    if datatype in ("FP16", "FP32", "FP64"):
        return flat.astype(np.float64).tolist()  # inf/nan go out as Infinity/NaN (Python json, rapidjson read them)
    return flat.tolist()


def encode_output(name: str, value, binary: bool) -> tuple[dict, bytes | None]:
    """One output -> (JSON description, binary payload or None)."""
    arr = np.asarray(value)
    datatype = v2_datatype(arr.dtype)
    desc = {"name": name, "datatype": datatype, "shape": [int(d) for d in arr.shape]}
    if binary:
        if datatype == "BYTES":
            raw = serialize_bytes_tensor(arr)
        else:
            raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        desc["parameters"] = {"binary_data_size": len(raw)}
        return desc, raw
    desc["data"] = _json_data(arr, datatype)
    return desc, None


def build_infer_response(head: dict, outputs: list[tuple[str, np.ndarray, bool]]) -> tuple[bytes, int | None]:
    """Response body and, when any output is binary, the JSON header length for ``Inference-Header-Content-Length``."""
    descs, blobs = [], []
    for name, value, binary in outputs:
        d, raw = encode_output(name, value, binary)
        descs.append(d)
        if raw is not None:
            blobs.append(raw)
    head = dict(head, outputs=descs)
    js = json.dumps(head, separators=(",", ":")).encode("utf-8")
    if not blobs:
        return js, None
    return js + b"".join(blobs), len(js)


def to_model_input(arr: np.ndarray, datatype: str) -> np.ndarray:
    """BYTES inputs become str object arrays (what ONNX string tensors hold); other arrays pass through."""
    if datatype == "BYTES":
        return _bytes_to_str(arr)
    return arr
