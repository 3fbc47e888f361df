"""Graph-output NodeArgs as onnxruntime shows them: declared types merged with onnx's shape inference.

Inference runs on a slim copy of the model (nodes and types, no large initializer data), only for outputs
declared without a full shape, and only when ``get_outputs()`` is first called.
"""

from __future__ import annotations

from .nodearg import NodeArg


def _merge_dims(src: tuple, tgt: tuple) -> tuple | None:
    """onnxruntime's merge of an inferred output shape ``src`` into the declared ``tgt`` (onnx mergeInShapeInfo,
    falling back to a union of the two when they conflict)."""
    if len(src) != len(tgt):
        return None
    out = list(tgt)
    for i, (s, d) in enumerate(zip(src, tgt)):
        if isinstance(s, int):
            if isinstance(d, int) and d != s:  # conflict: keep what agrees, forget the rest
                return tuple(a if a == b else None for a, b in zip(out, src))
            if not isinstance(d, int):
                out[i] = s
        elif d is None and isinstance(s, str):
            out[i] = s
    return tuple(out)


def _merge_type(decl, inf):
    if inf is None:
        return decl
    if decl is None:
        return inf
    if decl.kind != inf.kind:
        return decl
    from dataclasses import replace

    if decl.kind in ("tensor", "sparse_tensor"):
        if decl.elem_type and inf.elem_type and decl.elem_type != inf.elem_type:
            return decl
        shape = decl.shape
        if inf.shape is not None:
            shape = inf.shape if decl.shape is None else _merge_dims(inf.shape, decl.shape)
        den = decl.denotations if shape is not None and len(decl.denotations) == len(shape) else ()
        return replace(decl, elem_type=decl.elem_type or inf.elem_type, shape=shape, denotations=den)
    if decl.kind in ("sequence", "optional", "map"):
        return replace(decl, elem=_merge_type(decl.elem, inf.elem))
    return decl


# Models read by onnxpy.ir.wire of at most this many bytes keep their file's bytes for output type inference, which
# parses them with protobuf when the outputs' NodeArgs are first asked for (session creation then imports no
# protobuf); larger ones get their slim copy at once (keeping their bytes would double the memory).
_LAZY_SLIM_MAX = 16 << 20


def _slim_source(proto):
    """What the outputs' NodeArgs infer from (see ``_output_node_args``): a slim protobuf copy of the model, a
    callable that makes one on first use, or None when none can be made (the declared types then stand)."""
    from .ir import wire

    if isinstance(proto, wire.Message):
        buf = proto.__dict__["_span"][0]
        if len(buf) <= _LAZY_SLIM_MAX:
            return lambda: _slim_from_bytes(buf)
        return _slim_from_bytes(buf)
    try:
        return _slim_proto(proto)
    except (ValueError, TypeError):  # e.g. names that are not valid UTF-8: no inference, declared types stay
        return None


def _slim_from_bytes(buf: bytes):
    from .ir.proto import messages

    try:
        m = messages().ModelProto()
        m.ParseFromString(buf)
        return _slim_proto(m)
    except Exception:  # noqa: BLE001 - bytes protobuf refuses or names that are not text: declared types stand
        return None


def _slim_proto(proto):
    """A copy of the model for shape inference: nodes and types, without the large initializers' data (onnx's
    classes, loaded without importing onnx: inference itself imports it, on first use)."""
    from .ir.proto import messages

    pb = messages()
    g = proto.graph
    m = pb.ModelProto(ir_version=proto.ir_version)
    m.opset_import.extend(proto.opset_import)
    m.functions.extend(proto.functions)
    mg = m.graph
    mg.name = g.name
    mg.node.extend(g.node)
    mg.input.extend(g.input)
    mg.value_info.extend(g.value_info)
    mg.sparse_initializer.extend(g.sparse_initializer)
    for o in g.output:
        mg.output.add().name = o.name
    for t in g.initializer:
        if t.data_location == pb.TensorProto.EXTERNAL or t.ByteSize() <= 4096:
            mg.initializer.append(t)
        else:  # only its type and dims matter for inference; the data is left out
            stub = mg.initializer.add()
            stub.name, stub.data_type = t.name, t.data_type
            stub.dims.extend(t.dims)
            stub.data_location = pb.TensorProto.EXTERNAL
            e = stub.external_data.add()
            e.key, e.value = "location", "__onnxpy_not_loaded__"
    return m


def _inferred_output_types(slim) -> dict:
    """Graph outputs' types from onnx shape inference on a slim copy (see :func:`_slim_proto`)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(slim, check_type=False, strict_mode=False, data_prop=False)
    from .ir.load import decode_type

    return {o.name: _forget_generated_dims(decode_type(o.type)) for o in inferred.graph.output if o.HasField("type")}


def _forget_generated_dims(t):
    """onnx names the unknown dims it creates ``unk__N``; onnxruntime shows them as unnamed (None)."""
    if t is None:
        return None
    from dataclasses import replace

    if t.shape is not None:
        t = replace(t, shape=tuple(None if isinstance(d, str) and d.startswith("unk__") else d for d in t.shape))
    if t.elem is not None:
        t = replace(t, elem=_forget_generated_dims(t.elem))
    return t


def _output_node_args(outputs, proto) -> list:
    """NodeArgs of the graph outputs as onnxruntime shows them: the declared type with the inferred one merged in
    (an output declared without a type or shape gets what shape inference finds)."""
    from .ir.model import ValueInfo

    inferred = {}
    if proto is not None:
        try:
            inferred = _inferred_output_types(proto)
        except Exception:  # noqa: BLE001 - inference is best effort; the declared types stay
            inferred = {}
    return [NodeArg.from_value_info(ValueInfo(v.name, _merge_type(v.type, inferred.get(v.name))))
            for v in outputs]
