"""Level 99: float16 graphs compute in float32, as onnxruntime's CPU provider does.

onnxruntime's CPU kernels are mostly float32: its InsertCastTransformer wraps float16 nodes in casts to float32
and then removes the back-to-back casts between them, so a float16 model runs in float32 from its inputs to its
outputs.  numpy is the same (float16 arithmetic is float32 arithmetic plus a rounding pass per op, ~1.9 ns per
element), so onnxpy does the same rewrite, over the whole graph at once: float16 initializers, tensor attributes
and declared value types become float32, ``to``/``dtype`` attributes naming float16 name float32, each float16
graph input gets a Cast to float32 and each float16 graph output a Cast back, so the session's inputs and outputs
keep their types.  Results are the float32 computation rounded once at the outputs (closer to exact than rounding
after every op).

The rewrite is skipped when the graph holds an op whose domain onnxpy does not know in full (a custom op would
see float32 where the model promised float16) or an overridable initializer of type float16.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir.model import Graph, Node, TypeInfo, ValueInfo
from .graph_types import elem_types
from .graph_utils import rename_uses
from .passes import Pass

F16, F32 = 10, 1
_KNOWN_DOMAINS = frozenset({"", "ai.onnx", "com.microsoft", "ai.onnxpy"})
_TYPE_ATTRS = frozenset({"to", "dtype"})


def _retype(t: TypeInfo | None) -> TypeInfo | None:
    if t is None:
        return None
    elem = _retype(t.elem) if t.elem is not None else None
    et = F32 if t.elem_type == F16 and t.kind in ("tensor", "sparse_tensor") else t.elem_type
    if et == t.elem_type and elem is t.elem:
        return t
    return replace(t, elem_type=et, elem=elem)


def _is_f16(t: TypeInfo | None) -> bool:
    return t is not None and _retype(t) is not t


def _attr(name: str, v):
    if isinstance(v, np.ndarray) and v.dtype == np.float16:
        return v.astype(np.float32)
    if isinstance(v, Graph):
        return _graph(v)
    if isinstance(v, list) and v and isinstance(v[0], Graph):
        return [_graph(x) for x in v]
    if isinstance(v, list) and v and isinstance(v[0], np.ndarray):
        return [_attr(name, x) for x in v]
    if name in _TYPE_ATTRS and isinstance(v, int) and not isinstance(v, bool) and v == F16:
        return F32
    if isinstance(v, TypeInfo):
        return _retype(v)
    return v


def _node(n: Node) -> Node:
    return Node(n.op_type, n.domain, list(n.inputs), list(n.outputs),
                {k: _attr(k, v) for k, v in n.attrs.items()}, n.name, n.doc_string)


def _retyped_nodes(nodes, mid_name) -> list:
    """Retyped copies of ``nodes``; an explicit rounding to float16 stays one: Cast to float16 (into
    ``mid_name(output)``), then the node itself widens it for the float32 graph."""
    out = []
    for n in nodes:
        m = _node(n)
        if _is_round_to_f16(n):
            mid = mid_name(m.outputs[0])
            out.append(Node("Cast", "", list(m.inputs), [mid], {"to": F16}, (n.name or "Cast") + "_round_f16"))
            m.inputs = [mid]
        out.append(m)
    return out


def _inits(inits: dict) -> dict:
    return {k: (v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float16 else v)
            for k, v in inits.items()}


def _graph(g: Graph) -> Graph:
    """A subgraph retyped throughout (its inputs and outputs are values of the retyped outer graph)."""
    # (subgraph-local intermediate names: a suffix no exporter writes)
    return Graph(g.name, _retyped_nodes(g.nodes, lambda o: o + "__onnxpy_f16"),
                 [ValueInfo(v.name, _retype(v.type), v.doc_string) for v in g.inputs],
                 [ValueInfo(v.name, _retype(v.type), v.doc_string) for v in g.outputs],
                 _inits(g.initializers),
                 {k: ValueInfo(v.name, _retype(v.type), v.doc_string) for k, v in g.value_info.items()},
                 g.doc_string, g.sparse_initializer_names)


def _is_round_to_f16(n: Node) -> bool:
    return (n.op_type == "Cast" and n.domain in ("", "ai.onnx") and n.attrs.get("to") == F16 and len(n.outputs) == 1
            and bool(n.outputs[0]))


def _names(g: Graph) -> set:
    """Every value name of a graph and its subgraphs (fresh names must not collide with any)."""
    out = {v.name for v in list(g.inputs) + list(g.outputs)} | set(g.initializers) | set(g.value_info)
    for n in g.nodes:
        out.update(n.inputs)
        out.update(n.outputs)
        for sub in n.subgraphs():
            out |= _names(sub)
    return out


def _walk(g: Graph):
    for n in g.nodes:
        yield n
        for sub in n.subgraphs():
            yield from _walk(sub)


def _attr_has_f16(name: str, v) -> bool:
    """Whether :func:`_attr` would change the attribute (checked without building the converted copy)."""
    if isinstance(v, np.ndarray):
        return v.dtype == np.float16
    if isinstance(v, Graph):
        return _has_f16(v)
    if isinstance(v, list):
        return any(_attr_has_f16(name, x) for x in v if isinstance(x, (Graph, np.ndarray)))
    if isinstance(v, TypeInfo):
        return _is_f16(v)
    return name in _TYPE_ATTRS and isinstance(v, int) and not isinstance(v, bool) and v == F16


def _has_f16(g: Graph) -> bool:
    if any(isinstance(v, np.ndarray) and v.dtype == np.float16 for v in g.initializers.values()):
        return True
    if any(_is_f16(v.type) for v in list(g.inputs) + list(g.outputs) + list(g.value_info.values())):
        return True
    return any(_attr_has_f16(k, v) for n in g.nodes for k, v in n.attrs.items())


class Float16ComputeInFloat32(Pass):
    name = "Float16ComputeInFloat32All"
    level = 99

    def apply(self, g: Graph, ctx) -> int:
        if ctx.applied.get(self.name):  # (once: the graph's own inputs/outputs stay float16)
            return 0
        try:
            return self._apply(g, ctx)
        except RecursionError:  # subgraphs nested too deep: left as they are (the planner reports the nesting)
            return 0

    def _apply(self, g: Graph, ctx) -> int:
        if not _has_f16(g):
            return 0
        if any(n.domain not in _KNOWN_DOMAINS for n in _walk(g)):
            return 0
        if any(_is_f16(v.type) and v.name in g.initializers for v in g.inputs):
            return 0
        if any(_is_f16(v.type) and v.type.kind != "tensor" for v in list(g.inputs) + list(g.outputs)):
            return 0  # a sequence/optional of float16 at the boundary: no Cast can restore it
        # Each output's type as its producer makes it (declared types can be wrong, and a Cast back to a wrong
        # declared type would change the result's type): known from the graph, and agreeing with the declaration.
        names = {v.name for v in g.outputs}
        bare = Graph(g.name, g.nodes, g.inputs, [ValueInfo(v.name) for v in g.outputs], g.initializers,
                     {k: v for k, v in g.value_info.items() if k not in names})
        known = elem_types(bare)
        out_f16 = set()
        for v in g.outputs:
            t = known.get(v.name)
            declared = v.type.elem_type if v.type is not None and v.type.kind == "tensor" else 0
            if t is None and declared and declared != F16:
                t = declared  # (e.g. an If's int64 output): the rewrite leaves non-float16 values as they are
            if t is None or (declared and declared != t):
                return 0  # an output whose type cannot be told for sure: it might be float16 and must stay so
            if t == F16:
                out_f16.add(v.name)
        taken = _names(g)

        def fresh(base):
            while True:
                name = ctx.fresh(base)
                if name not in taken:
                    taken.add(name)
                    return name

        outer_in = [v for v in g.inputs if _is_f16(v.type)]
        rename = {v.name: fresh(v.name + "_f32") for v in outer_in}
        # outputs that are graph inputs stay the inputs themselves (float16 already)
        outer_out = [v for v in g.outputs if v.name in out_f16 and v.name not in rename]
        out_rename = {v.name: fresh(v.name + "_f32") for v in outer_out}
        for old in list(out_rename):
            if old in g.initializers:  # a constant output: its float32 copy gets the new name
                g.initializers[out_rename[old]] = g.initializers.pop(old)
        g.nodes[:] = _retyped_nodes(g.nodes, lambda o: fresh(o + "_f16"))
        for n in g.nodes:
            n.outputs = [out_rename.get(x, x) for x in n.outputs]
        for old, new in rename.items():  # (before the input Casts exist: they read the float16 inputs)
            rename_uses(g, old, new)
        nodes = [Node("Cast", "", [v.name], [rename[v.name]], {"to": F32}, ctx.fresh("InputToFloat32"))
                 for v in outer_in]
        nodes += g.nodes
        for v in outer_out:
            src = out_rename[v.name]
            nodes.append(Node("Cast", "", [src], [v.name], {"to": F16}, ctx.fresh("OutputToFloat16")))
        g.nodes[:] = nodes
        g.initializers.update(_inits(g.initializers))
        for k, v in list(g.value_info.items()):
            g.value_info[k] = ValueInfo(v.name, _retype(v.type), v.doc_string)
        for old, new in list(rename.items()) + list(out_rename.items()):
            vi = g.value_info.pop(old, None)
            if vi is not None:
                g.value_info[new] = ValueInfo(new, vi.type, vi.doc_string)
        return 1


FP16_PASSES = [Float16ComputeInFloat32()]

__all__ = ["FP16_PASSES", "Float16ComputeInFloat32"]
