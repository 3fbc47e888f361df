"""A protobuf wire-format reader for the parts of onnx.proto the loader reads, so loading a model does not import onnx.

``parse_model(data)`` returns a :class:`ModelMsg`: a read-only message whose fields carry onnx's names and values
(``model.graph.node[0].attribute[0].ints``), with ``HasField`` and ``WhichOneof`` as protobuf has them, so the
loader reads it exactly as it reads an ``onnx.ModelProto``.  The whole message tree is tokenized eagerly (a malformed
file fails here, not halfway through loading); scalar fields are decoded on first access; tensor payloads stay
spans of the input buffer until :func:`tensor_array` copies them into an array.

What it does not cover it hands to onnx, by re-parsing the message's own bytes (:meth:`Msg.to_onnx`): model-local
functions, sub-byte tensor types, training info.  Fields it does not know are skipped, as protobuf keeps them
unknown.  Proto semantics followed: the last value of a singular scalar wins, repeated occurrences of a singular
message merge, packed and unpacked repeated scalars are both accepted.
"""

from __future__ import annotations

import re
import sys

import numpy as np


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message of the expected type."""


_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63


def _varint(buf, pos: int):
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def _scan(buf, start: int, end: int, fields: dict) -> None:
    """Split buf[start:end] into fields: number -> list of (wire type, value or start, end)."""
    pos = start
    try:
        while pos < end:
            tag = buf[pos]
            if tag < 0x80:
                pos += 1
            else:
                tag, pos = _varint(buf, pos)
            wt = tag & 7
            num = tag >> 3
            if wt == 2:
                n = buf[pos]
                if n < 0x80:
                    pos += 1
                else:
                    n, pos = _varint(buf, pos)
                stop = pos + n
                if stop > end:
                    raise WireError("a length-delimited field runs past the end of its message")
                item = (2, pos, stop)
                pos = stop
            elif wt == 0:
                v = buf[pos]
                if v < 0x80:
                    pos += 1
                else:
                    v, pos = _varint(buf, pos)
                item = (0, v, 0)
            elif wt == 5:
                item = (5, pos, pos + 4)
                pos += 4
            elif wt == 1:
                item = (1, pos, pos + 8)
                pos += 8
            elif wt == 3:  # a group: none in onnx.proto, so an unknown field protobuf skips
                if num == 0:
                    raise WireError("field number 0")
                pos = _skip_group(buf, pos, end, num, 0)
                continue
            else:
                raise WireError(f"unexpected wire type {wt} (field {num})")
            if num == 0:
                raise WireError("field number 0")
            lst = fields.get(num)
            if lst is None:
                fields[num] = [item]
            else:
                lst.append(item)
    except IndexError:
        raise WireError("truncated message") from None
    if pos != end:
        raise WireError("a fixed-width field runs past the end of its message")


def _skip_group(buf, pos: int, end: int, num: int, depth: int) -> int:
    """Position after the end-group tag matching ``num`` (groups nest)."""
    if depth > MAX_DEPTH:
        raise WireError("groups nested too deep")
    while pos < end:
        tag, pos = _varint(buf, pos)
        wt, n = tag & 7, tag >> 3
        if n == 0:
            raise WireError("field number 0")
        if wt == 4:
            if n != num:
                raise WireError("mismatched end-group tag")
            return pos
        if wt == 0:
            _, pos = _varint(buf, pos)
        elif wt == 2:
            size, pos = _varint(buf, pos)
            pos += size
        elif wt == 5:
            pos += 4
        elif wt == 1:
            pos += 8
        elif wt == 3:
            pos = _skip_group(buf, pos, end, n, depth + 1)
        else:
            raise WireError(f"unexpected wire type {wt}")
    raise WireError("unterminated group")


_LONG_VARINT = re.compile(rb"[\x80-\xff]{10}")


def _check_packed(buf, a: int, b: int, kind, name) -> None:
    """Protobuf rejects a malformed packed field when it parses the message, read or not: so does this reader."""
    if kind in _FIXED:
        if (b - a) % _FIXED[kind][2]:
            raise WireError(f"packed field '{name}' has a length that is not a multiple of {_FIXED[kind][2]}")
    elif b > a and (buf[b - 1] >= 0x80 or _LONG_VARINT.search(buf, a, b)):
        raise WireError(f"packed field '{name}' holds a truncated or overlong varint")


# ----------------------------------------------------------------------------------------------------------
# messages

MAX_DEPTH = 100  # protobuf's default recursion limit

# field kinds
_I64, _U64, _I32, _F32, _F64, _STR, _BYTES = "i64", "u64", "i32", "f32", "f64", "str", "bytes"
_LOC, _ATYPE = "DataLocation", "AttributeType"  # closed proto2 enums: an unknown value leaves the field unset
_ENUMS = {_LOC: frozenset((0, 1)), _ATYPE: frozenset(range(15))}
_WIRE = {_I64: 0, _U64: 0, _I32: 0, _LOC: 0, _ATYPE: 0, _F32: 5, _F64: 1, _STR: 2, _BYTES: 2}
_SCALAR_DEFAULT = {_I64: 0, _U64: 0, _I32: 0, _LOC: 0, _ATYPE: 0, _F32: 0.0, _F64: 0.0, _STR: "", _BYTES: b""}


def _matches(it, kind) -> bool:
    if it[0] != _WIRE[kind]:
        return False
    valid = _ENUMS.get(kind)
    return valid is None or _signed64(it[1]) in valid


class Msg:
    """Base of the read-only messages.  Subclasses set FIELDS: name -> (number, kind or Msg subclass, repeated)."""

    FIELDS: dict = {}
    ONEOFS: dict = {}  # oneof name -> member field names
    _ONNX = ""  # onnx class name, for to_onnx
    _msg_fields: tuple = ()
    _packed_fields: tuple = ()

    def __init__(self, buf, spans, depth: int = 0):
        if depth > MAX_DEPTH:
            raise WireError(f"messages nested deeper than {MAX_DEPTH} levels")
        self._buf = buf
        self._spans = spans  # the byte ranges this message was merged from
        f: dict = {}
        for s, e in spans:
            _scan(buf, s, e, f)
        self._f = f
        for num, kind, name in self._packed_fields:
            for it in f.get(num, ()):
                if it[0] == 2:
                    _check_packed(buf, it[1], it[2], kind, name)
        depth += 1
        for num, cls, repeated, _name in self._msg_fields:
            lst = f.get(num)
            if lst is None:
                continue
            if any(it[0] != 2 for it in lst):
                lst = [it for it in lst if it[0] == 2]  # another wire type: an unknown field to protobuf
                if not lst:
                    del f[num]
                    continue
            if repeated:
                f[num] = [cls(buf, ((it[1], it[2]),), depth) for it in lst]
            else:
                f[num] = [cls(buf, tuple((it[1], it[2]) for it in lst), depth)]

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        cls._index()

    @classmethod
    def _index(cls):
        fields = cls.FIELDS
        cls._msg_fields = tuple((spec[0], spec[1], spec[2], name) for name, spec in fields.items()
                                if isinstance(spec[1], type))
        cls._packed_fields = tuple((spec[0], spec[1], name) for name, spec in fields.items()
                                   if spec[2] and not isinstance(spec[1], type) and spec[1] not in (_STR, _BYTES))

    def __getattr__(self, name):
        spec = type(self).FIELDS.get(name)
        if spec is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__} has no field '{name}'")
        num, kind, repeated = spec
        items = self._f.get(num)
        if isinstance(kind, type):
            if repeated:
                value = list(items) if items else []
            elif items:
                value = items[0]
            else:
                value = kind(self._buf, ())
        elif repeated:
            value = _decode_repeated(self._buf, items, kind, name) if items else []
        else:
            value = _SCALAR_DEFAULT[kind]
            for it in reversed(items or ()):
                if _matches(it, kind):  # a value of another wire type is an unknown field to protobuf
                    value = _decode_scalar(self._buf, it, kind, name)
                    break
        self.__dict__[name] = value
        return value

    def _present(self, name: str) -> bool:
        num, kind, _rep = type(self).FIELDS[name]
        items = self._f.get(num)
        if not items:
            return False
        if isinstance(kind, type):
            return True
        return any(_matches(it, kind) for it in items)

    def HasField(self, name: str) -> bool:  # noqa: N802 - protobuf's name
        spec = type(self).FIELDS.get(name)
        if spec is None or spec[2]:
            raise ValueError(f"{type(self).__name__} has no singular field '{name}'")
        if not self._present(name):
            return False
        for group, members in type(self).ONEOFS.items():
            if name in members:
                return self.WhichOneof(group) == name
        return True

    def WhichOneof(self, group: str):  # noqa: N802 - protobuf's name
        present = [m for m in type(self).ONEOFS[group] if self._present(m)]
        if len(present) <= 1:
            return present[0] if present else None
        # Several members set: the one written last wins, as when protobuf parses it.
        order: dict = {}
        for k, (s, e) in enumerate(self._spans):
            _field_order(self._buf, s, e, k, order)
        return max(present, key=lambda m: order.get(type(self).FIELDS[m][0], (-1, -1)))

    def serialized(self) -> bytes:
        return b"".join(bytes(self._buf[s:e]) for s, e in self._spans)

    def to_onnx(self):
        """The same message as onnx's protobuf class (imports onnx)."""
        import onnx

        return getattr(onnx, self._ONNX).FromString(self.serialized())

    def ListFields(self):  # noqa: N802 - protobuf's name
        return [(name, getattr(self, name)) for name, spec in type(self).FIELDS.items() if spec[0] in self._f]

    def __repr__(self):
        return f"<{type(self).__name__} {self.ListFields()!r}>"


def _field_order(buf, start: int, end: int, span: int, order: dict) -> None:
    """order[field number] = (span, index) of the field's last occurrence in an already validated message."""
    i = 0
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        wt = tag & 7
        if wt == 0:
            _, pos = _varint(buf, pos)
        elif wt == 2:
            n, pos = _varint(buf, pos)
            pos += n
        else:
            pos += 4 if wt == 5 else 8
        order[tag >> 3] = (span, i)
        i += 1


def _signed64(v: int) -> int:
    v &= _MASK64
    return v - (1 << 64) if v & _SIGN64 else v


def _text(b: bytes):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b  # protobuf hands back bytes for a proto2 string that is not valid UTF-8


def _decode_scalar(buf, item, kind, name):
    wt, a, b = item
    if kind in (_I64, _I32, _LOC, _ATYPE, _U64):
        if wt != 0:
            raise WireError(f"field '{name}' is not a varint")
        return a if kind == _U64 else _signed64(a)
    if kind == _F32:
        if wt != 5:
            raise WireError(f"field '{name}' is not a 32-bit float")
        return float(np.frombuffer(buf, "<f4", 1, a)[0])
    if kind == _F64:
        if wt != 1:
            raise WireError(f"field '{name}' is not a 64-bit float")
        return float(np.frombuffer(buf, "<f8", 1, a)[0])
    if wt != 2:
        raise WireError(f"field '{name}' is not length-delimited")
    raw = bytes(buf[a:b])
    return _text(raw) if kind == _STR else raw


def _decode_repeated(buf, items, kind, name):
    if kind in (_STR, _BYTES):
        return [_decode_scalar(buf, it, kind, name) for it in items if it[0] == 2]
    return numeric_array(buf, items, kind, name).tolist()


_FIXED = {_F32: ("<f4", 5, 4), _F64: ("<f8", 1, 8)}


def numeric_array(buf, items, kind, name) -> np.ndarray:
    """A repeated numeric field (packed and/or unpacked occurrences) as a numpy array."""
    if kind in _FIXED:
        dt, want_wt, size = _FIXED[kind]
        parts = []
        for wt, a, b in items:
            if wt == 2:
                if (b - a) % size:
                    raise WireError(f"packed field '{name}' has a length that is not a multiple of {size}")
                parts.append(np.frombuffer(buf, dt, (b - a) // size, a))
            elif wt == want_wt:
                parts.append(np.frombuffer(buf, dt, 1, a))
        if not parts:
            return np.zeros(0, dt)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
    parts = []
    for wt, a, b in items:
        if wt == 2:
            parts.append(_packed_varints(buf, a, b, name))
        elif wt == 0:
            parts.append(np.array([a & _MASK64], dtype=np.uint64))
    if not parts:
        parts.append(np.zeros(0, np.uint64))
    u = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return u if kind == _U64 else u.view(np.int64)


def _packed_varints(buf, a: int, b: int, name) -> np.ndarray:
    if b - a <= 32:
        out = []
        pos = a
        try:
            while pos < b:
                v, pos = _varint(buf, pos)
                out.append(v & _MASK64)
        except IndexError:
            raise WireError(f"packed field '{name}' is truncated") from None
        if pos != b:
            raise WireError(f"packed field '{name}' is truncated")
        return np.array(out, dtype=np.uint64)
    by = np.frombuffer(buf, np.uint8, b - a, a)
    ends = np.flatnonzero(by < 0x80)
    if not len(ends) or ends[-1] != len(by) - 1:
        raise WireError(f"packed field '{name}' is truncated")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise WireError(f"packed field '{name}' holds a varint longer than 10 bytes")
    if lengths.max() == 1:
        return by.astype(np.uint64)
    shift = (np.arange(len(by), dtype=np.int64) - np.repeat(starts, lengths)) * 7
    payload = (by & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    return np.bitwise_or.reduceat(payload, starts)


# ----------------------------------------------------------------------------------------------------------
# the schema (onnx.proto field numbers)


class StringStringEntryMsg(Msg):
    _ONNX = "StringStringEntryProto"
    FIELDS = {"key": (1, _STR, False), "value": (2, _STR, False)}


class SegmentMsg(Msg):
    FIELDS = {"begin": (1, _I64, False), "end": (2, _I64, False)}


class TensorAnnotationMsg(Msg):
    FIELDS = {"tensor_name": (1, _STR, False), "quant_parameter_tensor_names": (2, StringStringEntryMsg, True)}


class OpaqueTypeMsg(Msg):
    FIELDS = {"domain": (1, _STR, False), "name": (2, _STR, False)}


class SimpleShardedDimMsg(Msg):
    FIELDS = {"dim_value": (1, _I64, False), "dim_param": (2, _STR, False), "num_shards": (3, _I64, False)}
    ONEOFS = {"dim": ("dim_value", "dim_param")}


class ShardedDimMsg(Msg):
    FIELDS = {"axis": (1, _I64, False), "simple_sharding": (2, SimpleShardedDimMsg, True)}


class IntIntListEntryMsg(Msg):
    FIELDS = {"key": (1, _I64, False), "value": (2, _I64, True)}


class ShardingSpecMsg(Msg):
    FIELDS = {"tensor_name": (1, _STR, False), "device": (2, _I64, True),
              "index_to_device_group_map": (3, IntIntListEntryMsg, True), "sharded_dim": (4, ShardedDimMsg, True)}


class NodeDeviceConfigurationMsg(Msg):
    FIELDS = {"configuration_id": (1, _STR, False), "sharding_spec": (2, ShardingSpecMsg, True),
              "pipeline_stage": (3, _I32, False)}


class OperatorSetIdMsg(Msg):
    _ONNX = "OperatorSetIdProto"
    FIELDS = {"domain": (1, _STR, False), "version": (2, _I64, False)}


class DimensionMsg(Msg):
    _ONNX = "TensorShapeProto"  # (nested type; to_onnx is not used on it)
    FIELDS = {"dim_value": (1, _I64, False), "dim_param": (2, _STR, False), "denotation": (3, _STR, False)}
    ONEOFS = {"value": ("dim_value", "dim_param")}


class TensorShapeMsg(Msg):
    _ONNX = "TensorShapeProto"
    FIELDS = {"dim": (1, DimensionMsg, True)}


class TensorTypeMsg(Msg):
    FIELDS = {"elem_type": (1, _I32, False), "shape": (2, TensorShapeMsg, False)}


class TypeMsg(Msg):
    _ONNX = "TypeProto"
    FIELDS = {"denotation": (6, _STR, False)}
    ONEOFS = {"value": ("tensor_type", "sequence_type", "map_type", "optional_type", "sparse_tensor_type",
                        "opaque_type")}


class SequenceTypeMsg(Msg):
    FIELDS = {"elem_type": (1, TypeMsg, False)}


class MapTypeMsg(Msg):
    FIELDS = {"key_type": (1, _I32, False), "value_type": (2, TypeMsg, False)}


TypeMsg.FIELDS = {
    "tensor_type": (1, TensorTypeMsg, False),
    "sequence_type": (4, SequenceTypeMsg, False),
    "map_type": (5, MapTypeMsg, False),
    "optional_type": (9, SequenceTypeMsg, False),
    "sparse_tensor_type": (8, TensorTypeMsg, False),
    "opaque_type": (7, OpaqueTypeMsg, False),
    "denotation": (6, _STR, False),
}
TypeMsg._index()


class ValueInfoMsg(Msg):
    _ONNX = "ValueInfoProto"
    FIELDS = {"name": (1, _STR, False), "type": (2, TypeMsg, False), "doc_string": (3, _STR, False),
              "metadata_props": (4, StringStringEntryMsg, True)}


class TensorMsg(Msg):
    _ONNX = "TensorProto"
    FIELDS = {
        "dims": (1, _I64, True),
        "data_type": (2, _I32, False),
        "segment": (3, SegmentMsg, False),
        "float_data": (4, _F32, True),
        "int32_data": (5, _I32, True),
        "string_data": (6, _BYTES, True),
        "int64_data": (7, _I64, True),
        "name": (8, _STR, False),
        "raw_data": (9, _BYTES, False),
        "double_data": (10, _F64, True),
        "uint64_data": (11, _U64, True),
        "doc_string": (12, _STR, False),
        "external_data": (13, StringStringEntryMsg, True),
        "data_location": (14, _LOC, False),
        "metadata_props": (16, StringStringEntryMsg, True),
    }


class SparseTensorMsg(Msg):
    _ONNX = "SparseTensorProto"
    FIELDS = {"values": (1, TensorMsg, False), "indices": (2, TensorMsg, False), "dims": (3, _I64, True)}


class AttributeMsg(Msg):
    _ONNX = "AttributeProto"
    FIELDS = {
        "name": (1, _STR, False),
        "ref_attr_name": (21, _STR, False),
        "doc_string": (13, _STR, False),
        "type": (20, _ATYPE, False),
        "f": (2, _F32, False),
        "i": (3, _I64, False),
        "s": (4, _BYTES, False),
        "t": (5, TensorMsg, False),
        "sparse_tensor": (22, SparseTensorMsg, False),
        "tp": (14, TypeMsg, False),
        "floats": (7, _F32, True),
        "ints": (8, _I64, True),
        "strings": (9, _BYTES, True),
        "tensors": (10, TensorMsg, True),
        "sparse_tensors": (23, SparseTensorMsg, True),
        "type_protos": (15, TypeMsg, True),
    }


class NodeMsg(Msg):
    _ONNX = "NodeProto"
    FIELDS = {
        "input": (1, _STR, True),
        "output": (2, _STR, True),
        "name": (3, _STR, False),
        "op_type": (4, _STR, False),
        "domain": (7, _STR, False),
        "attribute": (5, AttributeMsg, True),
        "doc_string": (6, _STR, False),
        "overload": (8, _STR, False),
        "metadata_props": (9, StringStringEntryMsg, True),
        "device_configurations": (10, NodeDeviceConfigurationMsg, True),
    }


class GraphMsg(Msg):
    _ONNX = "GraphProto"
    FIELDS = {
        "node": (1, NodeMsg, True),
        "name": (2, _STR, False),
        "initializer": (5, TensorMsg, True),
        "sparse_initializer": (15, SparseTensorMsg, True),
        "doc_string": (10, _STR, False),
        "input": (11, ValueInfoMsg, True),
        "output": (12, ValueInfoMsg, True),
        "value_info": (13, ValueInfoMsg, True),
        "quantization_annotation": (14, TensorAnnotationMsg, True),
        "metadata_props": (16, StringStringEntryMsg, True),
    }


AttributeMsg.FIELDS["g"] = (6, GraphMsg, False)
AttributeMsg.FIELDS["graphs"] = (11, GraphMsg, True)
AttributeMsg._index()

# ModelProto fields the reader hands to onnx instead: training_info (20), functions (25), configuration (26).
MODEL_FALLBACK_FIELDS = (20, 25, 26)


class ModelMsg(Msg):
    _ONNX = "ModelProto"
    FIELDS = {
        "ir_version": (1, _I64, False),
        "opset_import": (8, OperatorSetIdMsg, True),
        "producer_name": (2, _STR, False),
        "producer_version": (3, _STR, False),
        "domain": (4, _STR, False),
        "model_version": (5, _I64, False),
        "doc_string": (6, _STR, False),
        "graph": (7, GraphMsg, False),
        "metadata_props": (14, StringStringEntryMsg, True),
    }

    @property
    def functions(self):
        return []


def needs_onnx(data) -> bool:
    """Whether a serialized model uses parts this reader leaves to onnx (a top-level scan only)."""
    f: dict = {}
    _scan(data, 0, len(data), f)
    return any(n in f for n in MODEL_FALLBACK_FIELDS)


def parse_model(data: bytes) -> ModelMsg:
    """Parse a serialized ModelProto (raises WireError when it is malformed)."""
    try:
        return ModelMsg(data, ((0, len(data)),))
    except RecursionError:
        raise WireError("message nesting too deep") from None


# ----------------------------------------------------------------------------------------------------------
# tensors

# element types whose values travel in int32_data as the bit patterns of the narrow type
_BITS_IN_INT32 = {10: np.uint16, 16: np.uint16, 17: np.uint8, 18: np.uint8, 19: np.uint8, 20: np.uint8, 24: np.uint8}
_FROM_INT32 = {2, 3, 4, 5, 6, 9}  # uint8 int8 uint16 int16 int32 bool: values in int32_data
_SUB_BYTE = {21, 22, 23, 25, 26, 27, 28}  # packed several to a byte: onnx decodes these


def tensor_array(t: TensorMsg, raw: bytes | None = None, np_dtype=None) -> np.ndarray | None:
    """Decode a tensor message to an owned numpy array, or None when onnx should decode it (sub-byte types, a
    big-endian machine).  ``raw`` replaces raw_data (external data already read).  Raises ValueError when the
    data does not match the dims."""
    dt = t.data_type
    if dt in _SUB_BYTE or sys.byteorder != "little" or np_dtype is None:
        return None
    dims = tuple(t.dims)
    count = 1
    for d in dims:
        count *= d
    if dt == 8:  # STRING
        vals = t.string_data
        if len(vals) != count:
            raise ValueError(f"{len(vals)} strings for dims {list(dims)}")
        out = np.empty(count, dtype=object)
        for i, v in enumerate(vals):
            out[i] = v.decode("utf-8", errors="surrogateescape")
        return out.reshape(dims)
    f = t._f
    if raw is not None or t._present("raw_data"):
        if raw is None:
            buf, (_wt, a, b) = t._buf, [it for it in f[9] if it[0] == 2][-1]
        else:
            buf, a, b = raw, 0, len(raw)
        size = np_dtype.itemsize
        if (b - a) != count * size:
            raise ValueError(f"raw_data holds {b - a} bytes, dims {list(dims)} of {np_dtype} need {count * size}")
        # A read-only array over its own bytes object, as onnx's numpy_helper gives (kernels treat such arrays as
        # model constants); the model's buffer is not kept alive.
        arr = np.frombuffer(bytes(buf[a:b]) if raw is None else raw, np_dtype.newbyteorder("<"), count)
        return arr.reshape(dims)
    if dt in (1, 14):
        src, kind = f.get(4), _F32
    elif dt in (11, 15):
        src, kind = f.get(10), _F64
    elif dt == 7:
        src, kind = f.get(7), _I64
    elif dt in (12, 13):
        src, kind = f.get(11), _U64
    elif dt in _FROM_INT32 or dt in _BITS_IN_INT32:
        src, kind = f.get(5), _I32
    else:
        return None
    vals = numeric_array(t._buf, src, kind, "data") if src else np.zeros(0, np.int64 if kind != _F32 else np.float32)
    if dt in (14, 15):
        if len(vals) != 2 * count:
            raise ValueError(f"{len(vals)} values for {count} complex elements of dims {list(dims)}")
        arr = (vals[0::2] + 1j * vals[1::2]).astype(np_dtype)
    else:
        if len(vals) != count:
            raise ValueError(f"{len(vals)} values for dims {list(dims)}")
        bits = _BITS_IN_INT32.get(dt)
        arr = vals.astype(bits).view(np_dtype) if bits is not None else vals.astype(np_dtype)
    arr.shape = dims
    return arr


# ----------------------------------------------------------------------------------------------------------
# writing (the slim copy of a model that onnx's shape inference reads)


def _enc_varint(v: int) -> bytes:
    v &= _MASK64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _enc_len(num: int, payload: bytes) -> bytes:
    return _enc_varint(num << 3 | 2) + _enc_varint(len(payload)) + payload


def _enc_int(num: int, v: int) -> bytes:
    return _enc_varint(num << 3) + _enc_varint(v)


def _enc_text(num: int, v) -> bytes:
    return _enc_len(num, v if isinstance(v, bytes) else v.encode("utf-8"))


def slim_model_bytes(model: ModelMsg, small: int = 4096) -> bytes:
    """A serialized copy of the model for shape inference: nodes and types, the initializers' types and dims, and
    the data of small (<= ``small`` bytes) initializers only; outputs keep only their names."""
    g = model.graph
    parts = [_enc_int(1, model.ir_version)]
    parts += [_enc_len(8, o.serialized()) for o in model.opset_import]
    gp = [_enc_text(2, g.name)]
    gp += [_enc_len(1, n.serialized()) for n in g.node]
    gp += [_enc_len(11, v.serialized()) for v in g.input]
    gp += [_enc_len(13, v.serialized()) for v in g.value_info]
    gp += [_enc_len(15, s.serialized()) for s in g.sparse_initializer]
    gp += [_enc_len(12, _enc_text(1, o.name)) for o in g.output]
    for t in g.initializer:
        if t.data_location == 1 or sum(e - s for s, e in t._spans) <= small:
            gp.append(_enc_len(5, t.serialized()))
            continue
        stub = [_enc_text(8, t.name), _enc_int(2, t.data_type)]
        stub += [_enc_int(1, d) for d in t.dims]
        stub.append(_enc_int(14, 1))
        stub.append(_enc_len(13, _enc_text(1, "location") + _enc_text(2, "__onnxpy_not_loaded__")))
        gp.append(_enc_len(5, b"".join(stub)))
    parts.append(_enc_len(7, b"".join(gp)))
    return b"".join(parts)
