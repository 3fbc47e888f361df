"""A pure-Python reader of the protobuf wire format for the parts of ``onnx.ModelProto`` the loader reads.

Importing protobuf and onnx's generated message module costs ~11-14 ms of every fresh process -- a third of session
creation for a small model such as silero-vad (onnxruntime's whole creation is ~40 ms).  :func:`decode_model` reads
the serialized bytes into light objects with the attribute names, defaults, ``HasField`` and ``WhichOneof`` of
onnx's messages, as far as :mod:`onnxpy.ir.load` uses them, so loading needs neither.

It covers what plain inference models contain and gives up (:class:`Unsupported`, the caller then parses with
protobuf as before, whose results and errors stand) on anything else: model-local functions, an enum value the
installed onnx does not define, a known field with an unexpected wire type, a singular message field given twice
(protobuf merges those), groups, and any malformed input.  Tensors keep the span of their serialized bytes, so the
rare element types only onnx's ``numpy_helper`` decodes (sub-byte types) still get a real ``TensorProto``
(:meth:`Message.to_protobuf`); the model object keeps the file's bytes for the same reason (output type inference
runs onnx's on a protobuf copy).
"""

from __future__ import annotations

import struct

import numpy as np

from .protoenums import TensorProto as _TP
from .protoenums import attribute_type_names, data_type_names

__all__ = ["Unsupported", "decode_model"]


class Unsupported(Exception):
    """The bytes use something this reader leaves to protobuf (or are malformed)."""


_DATA_TYPES = frozenset(data_type_names().values())
_LOCATIONS = frozenset((_TP.DEFAULT, _TP.EXTERNAL))
_ATTR_TYPES = frozenset(attribute_type_names().values())

_unpack_f = struct.Struct("<f").unpack_from
_unpack_d = struct.Struct("<d").unpack_from


class Message:
    """Fields set while reading live in the instance; absent ones read the class defaults (scalars, empty tuples for
    repeated fields, an empty message for message fields), as with protobuf's classes."""

    _oneofs: dict = {}
    _proto_name = ""

    def HasField(self, name: str) -> bool:  # noqa: N802 - protobuf's spelling
        return name in self.__dict__

    def WhichOneof(self, group: str):  # noqa: N802 - protobuf's spelling
        for f in self._oneofs.get(group, ()):
            if f in self.__dict__:
                return f
        return None

    def to_protobuf(self):
        """This message as onnx's protobuf class (parsed from its own bytes)."""
        from . import proto

        buf, a, b = self.__dict__["_span"]
        msg = getattr(proto.messages(), self._proto_name)()
        msg.ParseFromString(bytes(buf[a:b]))
        return msg


# field kinds (the length-delimited ones first: the reader tests ``kind <= _MSG``), and _PACKED for a repeated number
# written as one length-delimited run; _DOUBLE: repeated double (packed, or fixed64 one by one)
_STR, _BYTES, _MSG, _VARINT, _SINT32, _ENUM, _FLOAT, _DOUBLE, _PACKED = range(9)
_WIRE = {_STR: 2, _BYTES: 2, _MSG: 2, _VARINT: 0, _SINT32: 0, _ENUM: 0, _FLOAT: 5, _DOUBLE: 1}


def _message(name, fields, oneofs=None, keep_span=False):
    """A Message subclass: ``fields`` maps field number -> (attribute, kind, repeated, message class name or enum
    set)."""
    cls = type(name, (Message,), {"_fields": fields, "_oneofs": oneofs or {}, "_proto_name": name,
                                  "_keep_span": keep_span})
    return cls


_S, _R = False, True
ModelProto = _message("ModelProto", {
    1: ("ir_version", _VARINT, _S, None), 8: ("opset_import", _MSG, _R, "OperatorSetIdProto"),
    2: ("producer_name", _STR, _S, None), 3: ("producer_version", _STR, _S, None), 4: ("domain", _STR, _S, None),
    5: ("model_version", _VARINT, _S, None), 6: ("doc_string", _STR, _S, None), 7: ("graph", _MSG, _S, "GraphProto"),
    14: ("metadata_props", _MSG, _R, "StringStringEntryProto"),
})
OperatorSetIdProto = _message("OperatorSetIdProto", {1: ("domain", _STR, _S, None), 2: ("version", _VARINT, _S, None)})
StringStringEntryProto = _message("StringStringEntryProto", {1: ("key", _STR, _S, None), 2: ("value", _STR, _S, None)})
GraphProto = _message("GraphProto", {
    1: ("node", _MSG, _R, "NodeProto"), 2: ("name", _STR, _S, None), 5: ("initializer", _MSG, _R, "TensorProto"),
    15: ("sparse_initializer", _MSG, _R, "SparseTensorProto"), 10: ("doc_string", _STR, _S, None),
    11: ("input", _MSG, _R, "ValueInfoProto"), 12: ("output", _MSG, _R, "ValueInfoProto"),
    13: ("value_info", _MSG, _R, "ValueInfoProto"), 16: ("metadata_props", _MSG, _R, "StringStringEntryProto"),
})
NodeProto = _message("NodeProto", {
    1: ("input", _STR, _R, None), 2: ("output", _STR, _R, None), 3: ("name", _STR, _S, None),
    4: ("op_type", _STR, _S, None), 7: ("domain", _STR, _S, None), 8: ("overload", _STR, _S, None),
    5: ("attribute", _MSG, _R, "AttributeProto"), 6: ("doc_string", _STR, _S, None),
    9: ("metadata_props", _MSG, _R, "StringStringEntryProto"),
})
AttributeProto = _message("AttributeProto", {
    1: ("name", _STR, _S, None), 21: ("ref_attr_name", _STR, _S, None), 13: ("doc_string", _STR, _S, None),
    20: ("type", _ENUM, _S, _ATTR_TYPES), 2: ("f", _FLOAT, _S, None), 3: ("i", _VARINT, _S, None),
    4: ("s", _BYTES, _S, None), 5: ("t", _MSG, _S, "TensorProto"), 6: ("g", _MSG, _S, "GraphProto"),
    22: ("sparse_tensor", _MSG, _S, "SparseTensorProto"), 14: ("tp", _MSG, _S, "TypeProto"),
    7: ("floats", _FLOAT, _R, None), 8: ("ints", _VARINT, _R, None), 9: ("strings", _BYTES, _R, None),
    10: ("tensors", _MSG, _R, "TensorProto"), 11: ("graphs", _MSG, _R, "GraphProto"),
    23: ("sparse_tensors", _MSG, _R, "SparseTensorProto"), 15: ("type_protos", _MSG, _R, "TypeProto"),
})
ValueInfoProto = _message("ValueInfoProto", {
    1: ("name", _STR, _S, None), 2: ("type", _MSG, _S, "TypeProto"), 3: ("doc_string", _STR, _S, None),
    4: ("metadata_props", _MSG, _R, "StringStringEntryProto"),
})
TypeProto = _message("TypeProto", {
    1: ("tensor_type", _MSG, _S, "TypeProto_Tensor"), 4: ("sequence_type", _MSG, _S, "TypeProto_Sequence"),
    5: ("map_type", _MSG, _S, "TypeProto_Map"), 9: ("optional_type", _MSG, _S, "TypeProto_Optional"),
    8: ("sparse_tensor_type", _MSG, _S, "TypeProto_SparseTensor"), 6: ("denotation", _STR, _S, None),
}, {"value": ("tensor_type", "sequence_type", "map_type", "optional_type", "sparse_tensor_type")})
TypeProto_Tensor = _message("TypeProto_Tensor", {
    1: ("elem_type", _SINT32, _S, None), 2: ("shape", _MSG, _S, "TensorShapeProto")})
TypeProto_SparseTensor = _message("TypeProto_SparseTensor", {
    1: ("elem_type", _SINT32, _S, None), 2: ("shape", _MSG, _S, "TensorShapeProto")})
TypeProto_Sequence = _message("TypeProto_Sequence", {1: ("elem_type", _MSG, _S, "TypeProto")})
TypeProto_Optional = _message("TypeProto_Optional", {1: ("elem_type", _MSG, _S, "TypeProto")})
TypeProto_Map = _message("TypeProto_Map", {
    1: ("key_type", _SINT32, _S, None), 2: ("value_type", _MSG, _S, "TypeProto")})
TensorShapeProto = _message("TensorShapeProto", {1: ("dim", _MSG, _R, "TensorShapeProto_Dimension")})
TensorShapeProto_Dimension = _message("TensorShapeProto_Dimension", {
    1: ("dim_value", _VARINT, _S, None), 2: ("dim_param", _STR, _S, None), 3: ("denotation", _STR, _S, None),
}, {"value": ("dim_value", "dim_param")})
TensorProto = _message("TensorProto", {
    1: ("dims", _VARINT, _R, None), 2: ("data_type", _ENUM, _S, _DATA_TYPES), 4: ("float_data", _FLOAT, _R, None),
    5: ("int32_data", _SINT32, _R, None), 6: ("string_data", _BYTES, _R, None), 7: ("int64_data", _VARINT, _R, None),
    8: ("name", _STR, _S, None), 12: ("doc_string", _STR, _S, None), 9: ("raw_data", _BYTES, _S, None),
    13: ("external_data", _MSG, _R, "StringStringEntryProto"), 14: ("data_location", _ENUM, _S, _LOCATIONS),
    10: ("double_data", _DOUBLE, _R, None), 11: ("uint64_data", _VARINT, _R, None),
    16: ("metadata_props", _MSG, _R, "StringStringEntryProto"),
}, keep_span=True)
SparseTensorProto = _message("SparseTensorProto", {
    1: ("values", _MSG, _S, "TensorProto"), 2: ("indices", _MSG, _S, "TensorProto"), 3: ("dims", _VARINT, _R, None),
})

ModelProto.functions = ()  # (a model with functions goes to protobuf)

# Fields of onnx's schema the reader leaves to protobuf (which also checks their contents): a model with any of them
# is parsed by protobuf.  Fields outside the schema are skipped, as protobuf keeps them as unknown fields (their
# framing checked alike).  tests/test_wire_loading.py checks that these tables cover the installed onnx's schema.
_GIVE_UP = {
    "ModelProto": {20, 25, 26},  # training_info, functions, configuration
    "GraphProto": {14},  # quantization_annotation
    "NodeProto": {10},  # device_configurations
    "TensorProto": {3},  # segment (a chunked tensor)
    "TypeProto": {7},  # opaque_type (as the oneof's last member it would replace a type read before it)
}

_CLASSES = {c.__name__: c for c in (ModelProto, OperatorSetIdProto, StringStringEntryProto, GraphProto, NodeProto,
                                    AttributeProto, ValueInfoProto, TypeProto, TypeProto_Tensor, TypeProto_SparseTensor,
                                    TypeProto_Sequence, TypeProto_Optional, TypeProto_Map, TensorShapeProto,
                                    TensorShapeProto_Dimension, TensorProto, SparseTensorProto)}
# Per class: ``_keys``, the field key (number << 3 | wire type) -> (attribute, kind + 16 if repeated, message class /
# enum values) for every encoding the reader takes (repeated numbers both packed and one by one), and the defaults.
for _cls in _CLASSES.values():
    _keys = {}
    for _num, (_attr, _kind, _rep, _extra) in _cls._fields.items():
        _sub = _CLASSES[_extra] if _kind == _MSG else _extra
        if _kind == _VARINT and _attr == "uint64_data":
            _sub = "unsigned"
        _keys[_num << 3 | _WIRE[_kind]] = (_attr, _kind + (16 if _rep else 0), _sub)
        if _rep and _kind > _MSG:
            _keys[_num << 3 | 2] = (_attr, _PACKED, (_kind, _sub))
        if _rep:
            setattr(_cls, _attr, ())
        elif _kind == _STR:
            setattr(_cls, _attr, "")
        elif _kind == _BYTES:
            setattr(_cls, _attr, b"")
        elif _kind in (_FLOAT, _DOUBLE):
            setattr(_cls, _attr, 0.0)
        elif _kind != _MSG:
            setattr(_cls, _attr, 0)
    _cls._keys = _keys
    _cls._nums = frozenset(_cls._fields)
    _cls._oneof = _cls._oneofs.get("value")
    _cls._give_up = frozenset(_GIVE_UP.get(_cls.__name__, ())) | {0}
for _cls in _CLASSES.values():
    for _num, (_attr, _kind, _rep, _extra) in _cls._fields.items():
        if _kind == _MSG and not _rep:
            setattr(_cls, _attr, _CLASSES[_extra]())  # (an empty message: read-only by convention)
del _cls, _keys, _num, _attr, _kind, _rep, _extra, _sub


def _varint(buf, pos: int, end: int):
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        if pos >= end or shift > 63:
            raise Unsupported("truncated or overlong varint")
        b = buf[pos]
        result |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return result, pos
        shift += 7


def _packed_varints(buf, pos: int, end: int, signed: bool) -> list:
    out = []
    append = out.append
    while pos < end:
        b = buf[pos]
        if b < 0x80:
            append(b)
            pos += 1
            continue
        v, pos = _varint(buf, pos, end)
        append(v - (1 << 64) if signed and v >= 1 << 63 else v)
    if pos != end:
        raise Unsupported("packed varints overrun their field")
    return out


def _decode(cls, buf, pos: int, end: int, depth: int):
    if depth > 100:
        raise Unsupported("messages nested too deeply")
    msg = cls()
    d = msg.__dict__
    keys = cls._keys
    if cls._keep_span:
        d["_span"] = (buf, pos, end)
    while pos < end:
        key = buf[pos]
        pos += 1
        if key >= 0x80:
            key, pos = _varint(buf, pos - 1, end)
        f = keys.get(key)
        if f is None:
            pos = _unknown(cls, buf, pos, end, key)
            continue
        attr, kind, sub = f
        rep = kind >= 16
        kind &= 15
        if kind <= _MSG:  # length-delimited
            n = buf[pos]
            pos += 1
            if n >= 0x80:
                n, pos = _varint(buf, pos - 1, end)
            stop = pos + n
            if stop > end:
                raise Unsupported("truncated field")
            if kind == _STR:
                raw = buf[pos:stop]
                try:
                    val = raw.decode("utf-8")
                except UnicodeDecodeError:
                    val = raw  # (as protobuf hands back an invalid proto2 string: the loader reports it)
            elif kind == _MSG:
                val = _decode(sub, buf, pos, stop, depth + 1)
                if not rep and attr in d:
                    raise Unsupported(f"{cls.__name__}.{attr} given twice")  # (protobuf merges the two)
            else:
                val = buf[pos:stop]
            pos = stop
        elif kind == _PACKED:
            n, pos = _varint(buf, pos, end)
            stop = pos + n
            if stop > end:
                raise Unsupported("truncated packed field")
            vals = _packed(buf, pos, stop, *sub)
            pos = stop
            old = d.get(attr)
            if old is not None:  # (a field given in several pieces: protobuf concatenates them)
                vals = np.concatenate([np.asarray(old, vals.dtype), vals]) if isinstance(vals, np.ndarray) \
                    else list(old) + vals
            d[attr] = vals
            continue
        elif kind == _FLOAT:
            if pos + 4 > end:
                raise Unsupported("truncated fixed32")
            val = _unpack_f(buf, pos)[0]
            pos += 4
        elif kind == _DOUBLE:
            if pos + 8 > end:
                raise Unsupported("truncated fixed64")
            val = _unpack_d(buf, pos)[0]
            pos += 8
        else:  # varints
            v = buf[pos]
            pos += 1
            if v >= 0x80:
                v, pos = _varint(buf, pos - 1, end)
            if kind == _VARINT:
                val = v if sub == "unsigned" or v < 1 << 63 else v - (1 << 64)
            else:
                val = _int32(v)
                if kind == _ENUM and val not in sub:
                    raise Unsupported(f"{cls.__name__}.{attr}: enum value {val}")
        if rep:
            old = d.get(attr)
            if old is None:
                d[attr] = [val]
            elif type(old) is list:
                old.append(val)
            else:  # (after a packed piece)
                d[attr] = list(old.tolist()) + [val]
        else:
            oneof = cls._oneof
            if oneof is not None and attr in oneof:
                for other in oneof:
                    d.pop(other, None)  # (a later member of a oneof replaces the earlier one)
            d[attr] = val
    if pos != end:
        raise Unsupported("field overruns its message")
    return msg


def _unknown(cls, buf, pos: int, end: int, key: int) -> int:
    """Past a field the reader does not take: skipped when protobuf would not hand it to the loader either."""
    num = key >> 3
    if num in cls._nums:
        raise Unsupported(f"{cls.__name__} field {num}: unexpected wire type {key & 7}")
    if num in cls._give_up:
        raise Unsupported(f"{cls.__name__} field {num}")
    return _skip(buf, pos, end, key & 7)


def _packed(buf, pos: int, stop: int, kind, sub) -> list:
    n = stop - pos
    if kind == _FLOAT or kind == _DOUBLE:  # (a read-only array over the bytes: what readers do is np.array / float)
        size = 4 if kind == _FLOAT else 8
        if n % size:
            raise Unsupported("packed floats of a bad length")
        return np.frombuffer(buf, "<f4" if size == 4 else "<f8", n // size, pos)
    if kind == _ENUM:
        raise Unsupported("packed enum")
    vals = _packed_varints(buf, pos, stop, sub != "unsigned")
    return [_int32(v) for v in vals] if kind == _SINT32 else vals


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _skip(buf, pos: int, end: int, wt: int) -> int:
    if wt == 0:
        _, pos = _varint(buf, pos, end)
    elif wt == 1:
        pos += 8
    elif wt == 2:
        n, pos = _varint(buf, pos, end)
        pos += n
    elif wt == 5:
        pos += 4
    else:
        raise Unsupported(f"wire type {wt}")  # (groups: protobuf's business)
    if pos > end:
        raise Unsupported("truncated unknown field")
    return pos


def decode_model(data) -> ModelProto:
    """The ModelProto in ``data`` (bytes) as light objects (see the module notes); :class:`Unsupported` when the
    caller should parse it with protobuf instead."""
    buf = data if isinstance(data, bytes) else bytes(data)
    try:
        model = _decode(ModelProto, buf, 0, len(buf), 0)
    except (IndexError, struct.error, ValueError, RecursionError) as e:
        raise Unsupported(str(e)) from None
    model.__dict__["_span"] = (buf, 0, len(buf))
    return model
