"""Shared helpers for the op tests: a one-node model builder and runners for onnxpy and the onnxruntime oracle.

Test modules import it as ``from _oracle import ...`` (pytest's default import mode puts tests/ops on sys.path).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import onnxpy
from onnxpy.dtypes import from_numpy


class Init:
    """An input stored as an initializer (a constant) instead of a graph input."""

    def __init__(self, value):
        self.value = np.asarray(value)


def graph_inputs(inputs, inits=(), shapes=True):
    """Names, value infos, feeds and initializers for a one-node model's ``inputs``.

    ``inputs`` holds arrays, ``None`` (an absent optional input, named "") or ``Init`` (an initializer); the
    indexes in ``inits`` are initializers too.  ``shapes``: give the inputs' value infos their shapes.
    """
    names, vis, feeds, init_protos = [], [], {}, []
    for i, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        nm = f"in{i}"
        names.append(nm)
        if isinstance(x, Init) or i in inits:
            init_protos.append(numpy_helper.from_array(x.value if isinstance(x, Init) else np.asarray(x), nm))
            continue
        x = np.asarray(x)
        vis.append(helper.make_tensor_value_info(nm, from_numpy(x.dtype), list(x.shape) if shapes else None))
        feeds[nm] = x
    return names, vis, feeds, init_protos


def single_node(op, inputs, outputs=1, *, opsets, domain=None, inits=(), shapes=True, out_infos=None,
                ir_version=None, **attrs):
    """A one-node model and its feeds.

    ``outputs``: a count (named out0, out1, ...) or a list of names ("" for an absent optional output);
    ``out_infos``: the graph outputs' value infos (default: untyped ones for the named outputs);
    ``opsets``: (domain, version) pairs; ``ir_version``: set when given, else onnx's default.
    """
    names, vis, feeds, init_protos = graph_inputs(inputs, inits, shapes)
    outs = [f"out{j}" for j in range(outputs)] if isinstance(outputs, int) else list(outputs)
    if out_infos is None:
        out_infos = [onnx.ValueInfoProto(name=o) for o in outs if o]
    node = helper.make_node(op, names, outs, domain=domain, **attrs)
    g = helper.make_graph([node], "g", vis, out_infos, init_protos)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    if ir_version is not None:
        m.ir_version = ir_version
    return m, feeds


def param_model(op, fed, params, *, const, outputs=("Y",), opset=17, ir_version=8, **attrs):
    """A one-node model whose first input ``fed`` (a name) is an untyped-shape graph input and whose ``params``
    ({name: array}, in input order) are initializers when ``const`` (what plan-time specialisation sees) or shaped
    graph inputs otherwise (the generic kernel, fed at run time); the serialized bytes."""
    elem = from_numpy(next(iter(params.values())).dtype)
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in params.items()]
    vis = [helper.make_tensor_value_info(fed, elem, None)]
    if not const:
        vis += [helper.make_tensor_value_info(i.name, elem, list(i.dims)) for i in inits]
    g = helper.make_graph([helper.make_node(op, [fed, *params], list(outputs), **attrs)], "g", vis,
                          [helper.make_tensor_value_info(o, elem, None) for o in outputs], inits if const else [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m.SerializeToString()


def _bytes(model):
    return model if isinstance(model, bytes) else model.SerializeToString()


def run_onnxpy(model, feeds):
    """Run a model (bytes or ModelProto) with onnxpy."""
    return onnxpy.InferenceSession(_bytes(model)).run(None, feeds)


def run_ort(model, feeds, *, optimize=True, quiet=False):
    """Run a model (bytes or ModelProto) with onnxruntime's CPU provider; ``optimize=False`` disables its graph
    optimizations, ``quiet`` silences its log."""
    import onnxruntime as ort

    so = ort.SessionOptions() if quiet or not optimize else None
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if quiet:
        so.log_severity_level = 4
    return ort.InferenceSession(_bytes(model), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_outputs_close(got, want, rtol, atol, exact_kinds="iub"):
    """Per output: same dtype and shape; integer/bool kinds (``exact_kinds``) equal, the rest close in float64."""
    for g, w in zip(got, want):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert g.shape == w.shape, (g.shape, w.shape)
        if g.dtype.kind in exact_kinds:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def infer_output_types(m, out_types=None):
    """Give ``m``'s graph outputs the types onnx shape inference finds for them, shapes dropped (in place).

    ``out_types``: element types paired with the outputs (zip order); one that is not None is set instead.
    """
    inferred = onnx.shape_inference.infer_shapes(m)
    types = {v.name: v.type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for o, t in zip(m.graph.output, out_types or [None] * len(m.graph.output)):
        if t is not None:
            o.type.tensor_type.elem_type = t
        elif o.name in types and types[o.name].WhichOneof("value"):
            o.type.CopyFrom(types[o.name])
            o.type.tensor_type.ClearField("shape")
    return m
