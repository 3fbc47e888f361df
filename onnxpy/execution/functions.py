"""Expanding ONNX schema function bodies for ops without a kernel.

Some ops are defined by the spec as functions of other ops (statically, or depending on input types).  When no
kernel is registered, the node becomes a :class:`FunctionKernel`: on first call with a given input signature it
asks the schema for the body, plans it as a sub-graph and caches the plan (bounded by the number of distinct
input type signatures, which is small).
"""

from __future__ import annotations

import importlib
import threading

import numpy as np

from .. import dtypes
from ..ir.load import _Loader
from ..ir.model import Graph, Node, TypeInfo

MAX_CACHED_SIGNATURES = 64


class _LazyModule:
    """onnx is imported on first use: only models with an op that has no kernel need its schema functions."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)


onnx = _LazyModule("onnx")
helper = _LazyModule("onnx.helper")
numpy_helper = _LazyModule("onnx.numpy_helper")


def _encode_attr(name, value):
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, TypeInfo):
        raise ValueError(f"attribute '{name}': type attributes cannot be re-encoded")
    if isinstance(value, Graph):
        raise ValueError(f"attribute '{name}': graph attributes cannot be re-encoded")
    return helper.make_attribute(name, value)


def _type_proto(v):
    if isinstance(v, np.ndarray):
        return helper.make_tensor_type_proto(dtypes.from_numpy(v.dtype), list(v.shape))
    if isinstance(v, list) and v and isinstance(v[0], np.ndarray):
        return helper.make_sequence_type_proto(_type_proto(v[0]))
    return onnx.TypeProto()


def _sig(v):
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.ndim)
    return type(v).__name__


def function_proto_for(schema, opset: int, node_proto, args):
    """The FunctionProto a schema defines for this call, or None."""
    if schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= opset]
        if versions:
            fp = onnx.FunctionProto()
            fp.ParseFromString(schema.get_function_with_opset_version(max(versions)))
            return fp
    if schema.has_context_dependent_function:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        if versions:
            types = [_type_proto(a).SerializeToString() for a in args]
            data = schema.get_context_dependent_function_with_opset_version(
                max(versions), node_proto.SerializeToString(), types
            )
            if data:
                fp = onnx.FunctionProto()
                fp.ParseFromString(data)
                return fp
    return None


class FunctionKernel:
    """Runs a node by expanding its schema's function body for the actual input types."""

    def __init__(self, node: Node, schema, opset: int, planner, runner):
        self.node = node
        self.schema = schema
        self.opset = opset
        self.planner = planner
        self.runner = runner
        self.n_in = len(node.inputs)
        self.n_out = len(node.outputs)
        self._cache: dict = {}
        self._lock = threading.Lock()
        attrs = [_encode_attr(k, v) for k, v in node.attrs.items()]
        self.call_proto = helper.make_node(
            node.op_type,
            [f"in{i}" if x else "" for i, x in enumerate(node.inputs)],
            [f"out{i}" if x else "" for i, x in enumerate(node.outputs)],
            domain=node.domain,
        )
        self.call_proto.attribute.extend(attrs)

    def _build(self, args):
        fp = function_proto_for(self.schema, self.opset, self.call_proto, args)
        if fp is None:
            raise NotImplementedError(f"{self.node.describe()}: the schema gives no function body for these inputs")
        opsets = dict(self.planner.opsets)
        for o in fp.opset_import:
            opsets["" if o.domain == "ai.onnx" else o.domain] = int(o.version)
        loader = _Loader(None, {}, opsets)
        body = loader.inline_function(fp, self.call_proto)
        g = helper.make_graph(
            body, f"{self.node.op_type}_body",
            [helper.make_value_info(f"in{i}", onnx.TypeProto()) for i in range(self.n_in)],
            [helper.make_value_info(o, onnx.TypeProto()) for o in self.call_proto.output if o],
        )
        graph = loader.graph(g)
        sub = type(self.planner)(opsets, self.runner, self.planner.custom_ops, self.planner.function_expander)
        return sub.plan(graph)

    def __call__(self, *args):
        key = tuple(_sig(a) for a in args)
        plan = self._cache.get(key)
        if plan is None:
            with self._lock:
                plan = self._cache.get(key)
                if plan is None:
                    plan = self._build(args)
                    if len(self._cache) < MAX_CACHED_SIGNATURES:
                        self._cache[key] = plan
        outs = self.runner(plan, args, ())
        return tuple(outs)


def make_function_expander(runner):
    def expand(node: Node, domain: str, opset: int, planner):
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, domain)
        except Exception:  # noqa: BLE001 - unknown op: the caller reports it
            return None
        if not (schema.has_function or schema.has_context_dependent_function):
            return None
        return FunctionKernel(node, schema, opset, planner, runner)

    return expand
