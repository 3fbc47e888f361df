"""onnxpy IR -> ModelProto (for ``optimized_model_filepath`` and tools that write models)."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .. import dtypes
from .model import Graph, Model, TypeInfo, ValueInfo


def array_to_tensor(name: str, arr: np.ndarray) -> onnx.TensorProto:
    if arr.dtype == object:
        t = onnx.TensorProto()
        t.name = name
        t.data_type = onnx.TensorProto.STRING
        t.dims.extend(arr.shape)
        t.string_data.extend(str(x).encode("utf-8") if not isinstance(x, bytes) else x for x in arr.reshape(-1))
        return t
    return numpy_helper.from_array(np.asarray(arr), name)


def type_to_proto(t: TypeInfo | None) -> onnx.TypeProto:
    if t is None:
        return onnx.TypeProto()
    if t.kind in ("tensor", "sparse_tensor"):
        shape = None if t.shape is None else list(t.shape)
        if t.kind == "tensor":
            return helper.make_tensor_type_proto(t.elem_type, shape)
        return helper.make_sparse_tensor_type_proto(t.elem_type, shape)
    if t.kind == "sequence":
        return helper.make_sequence_type_proto(type_to_proto(t.elem))
    if t.kind == "map":
        return helper.make_map_type_proto(t.key_type, type_to_proto(t.elem))
    if t.kind == "optional":
        return helper.make_optional_type_proto(type_to_proto(t.elem))
    return onnx.TypeProto()


def _value_info(v: ValueInfo) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto()
    vi.name = v.name
    if v.type is not None:
        vi.type.CopyFrom(type_to_proto(v.type))
    if v.doc_string:
        vi.doc_string = v.doc_string
    return vi


def _attribute(name, value) -> onnx.AttributeProto:
    if isinstance(value, Graph):
        return helper.make_attribute(name, graph_to_proto(value))
    if isinstance(value, list) and value and isinstance(value[0], Graph):
        return helper.make_attribute(name, [graph_to_proto(g) for g in value])
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, array_to_tensor("", value))
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [array_to_tensor("", v) for v in value])
    if isinstance(value, TypeInfo):
        return helper.make_attribute(name, type_to_proto(value))
    if isinstance(value, list) and not value:
        a = onnx.AttributeProto()
        a.name = name
        a.type = onnx.AttributeProto.INTS
        return a
    return helper.make_attribute(name, value)


def graph_to_proto(g: Graph) -> onnx.GraphProto:
    nodes = []
    for n in g.nodes:
        p = helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name or None, domain=n.domain or None)
        p.attribute.extend(_attribute(k, v) for k, v in n.attrs.items())
        if n.doc_string:
            p.doc_string = n.doc_string
        nodes.append(p)
    inits = [array_to_tensor(k, v) for k, v in g.initializers.items()]
    gp = helper.make_graph(nodes, g.name or "graph", [_value_info(v) for v in g.inputs],
                           [_value_info(v) for v in g.outputs], inits,
                           value_info=[_value_info(v) for v in g.value_info.values()])
    if g.doc_string:
        gp.doc_string = g.doc_string
    return gp


def model_to_proto(m: Model) -> onnx.ModelProto:
    opsets = [helper.make_opsetid(d, v) for d, v in m.opsets.items()]
    used = _domains(m.graph)
    for d in sorted(used - set(m.opsets)):
        opsets.append(helper.make_opsetid(d, 1))
    p = helper.make_model(graph_to_proto(m.graph), opset_imports=opsets)
    p.ir_version = max(m.ir_version, 3) if m.ir_version else onnx.IR_VERSION
    if p.ir_version < 4:  # IR 3: every initializer must also be a graph input (a constant one, at this version)
        listed = {v.name for v in p.graph.input}
        p.graph.input.extend(helper.make_tensor_value_info(k, dtypes.from_numpy(v.dtype), list(v.shape))
                             for k, v in m.graph.initializers.items()
                             if k not in listed and isinstance(v, np.ndarray))
    p.producer_name = m.producer_name
    p.producer_version = m.producer_version
    p.domain = m.domain
    if m.model_version is not None:
        p.model_version = m.model_version
    p.doc_string = m.doc_string
    helper.set_model_props(p, dict(m.metadata))
    return p


def _domains(g: Graph) -> set:
    out = set()
    for n in g.nodes:
        if n.domain not in ("", "ai.onnx"):
            out.add(n.domain)
        for v in n.attrs.values():
            if isinstance(v, Graph):
                out |= _domains(v)
    return out


def save_model(m: Model, path: str, external_min_bytes: int | None = None, external_name: str | None = None) -> None:
    """Write ``m`` to ``path``; tensors of at least ``external_min_bytes`` go to an external data file."""
    proto = model_to_proto(m)
    total = sum(v.nbytes for v in m.graph.initializers.values() if isinstance(v, np.ndarray))
    if external_min_bytes is None and total < 1_800_000_000:
        onnx.save_model(proto, path)
        return
    location = external_name or (os.path.basename(path) + ".data")
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=external_min_bytes or 1024)


__all__ = ["model_to_proto", "save_model", "graph_to_proto", "dtypes"]
