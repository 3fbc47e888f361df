"""Graph bookkeeping shared by the quantizers: names, initializers, consumers, topological sort."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def subgraph_outer_refs(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read from the enclosing scope."""
    refs: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            defined = {i.name for i in g.input} | {i.name for i in g.initializer}
            for n in g.node:
                defined.update(n.output)
            for n in g.node:
                for i in list(n.input) + sorted(subgraph_outer_refs(n)):
                    if i and i not in defined:
                        refs.add(i)
            for o in g.output:
                if o.name not in defined:
                    refs.add(o.name)
    return refs


def node_inputs(node: onnx.NodeProto) -> list[str]:
    return [i for i in node.input if i] + sorted(subgraph_outer_refs(node))


class GraphState:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        g = model.graph
        self.graph = g
        self.inits = {t.name: t for t in g.initializer}
        self.graph_inputs = {i.name for i in g.input}
        self.graph_outputs = {o.name for o in g.output}
        self.names = set(self.inits) | self.graph_inputs | self.graph_outputs
        for n in g.node:
            self.names.update(n.input)
            self.names.update(n.output)
            if n.name:
                self.names.add(n.name)
        self._array_cache: dict[str, np.ndarray] = {}
        self.refresh()

    def refresh(self):
        self.producer = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.graph.node:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for i in node_inputs(n):
                self.consumers.setdefault(i, []).append(n)

    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            name = f"{base}_{k}"
            k += 1
        self.names.add(name)
        return name

    def is_const(self, name: str) -> bool:
        """A constant initializer (not overridable through a graph input)."""
        return name in self.inits and name not in self.graph_inputs

    def const(self, name: str) -> np.ndarray | None:
        if not self.is_const(name):
            return None
        if name not in self._array_cache:
            self._array_cache[name] = numpy_helper.to_array(self.inits[name])
        return self._array_cache[name]

    def add_init(self, arr: np.ndarray, base: str) -> str:
        name = self.unique(base)
        t = numpy_helper.from_array(np.asarray(arr), name)
        self.graph.initializer.append(t)
        self.inits[name] = t
        return name

    def make_node(self, op, inputs, outputs, base_name, domain=None, **attrs):
        node = helper.make_node(op, inputs, outputs, name=self.unique(base_name), domain=domain, **attrs)
        return node


def topo_sort(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Stable topological order (keeps the given order where dependencies allow)."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    producers: dict[str, int] = {}
    for idx, n in enumerate(nodes):
        for o in n.output:
            producers[o] = idx
    deps = []
    for n in nodes:
        d = set()
        for i in node_inputs(n):
            if i not in available and i in producers:
                d.add(producers[i])
        deps.append(d)
    order, done = [], [False] * len(nodes)
    users: dict[int, list[int]] = {}
    pending = [len(d) for d in deps]
    for idx, d in enumerate(deps):
        for p in d:
            users.setdefault(p, []).append(idx)
    import heapq

    ready = [i for i, c in enumerate(pending) if c == 0]
    heapq.heapify(ready)
    while ready:
        i = heapq.heappop(ready)
        done[i] = True
        order.append(nodes[i])
        for u in users.get(i, []):
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        missing = [nodes[i].name or nodes[i].op_type for i in range(len(nodes)) if not done[i]]
        raise ValueError(f"the quantized graph has a cycle or dangling inputs near nodes {missing[:5]}")
    return order


def constants_to_initializers(model: onnx.ModelProto) -> None:
    """Turn top-level ``Constant`` nodes (tensor-valued) into initializers so they are quantized as weights."""
    g = model.graph
    keep = []
    outputs = {o.name for o in g.output}
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.attribute) == 1 \
                and n.attribute[0].name == "value" and n.output[0] not in outputs:
            t = onnx.TensorProto()
            t.CopyFrom(n.attribute[0].t)
            t.name = n.output[0]
            g.initializer.append(t)
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)
