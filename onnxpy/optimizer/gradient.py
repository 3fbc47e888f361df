"""Lowering of ``ai.onnx.preview.training.Gradient`` into explicit backward nodes (reverse-mode autodiff).

The Gradient node names the output ``y`` and the inputs ``xs`` of the forward graph it differentiates; its
kernel would need the whole graph, so the node is replaced before planning by the backward graph of the nodes
between ``xs`` and ``y``.  Supported forward ops: Add, Sub, Mul, Div, Neg, Identity, MatMul, Relu, Sigmoid, Tanh,
Exp, Log, Sqrt, Abs, Sin, Cos, Reciprocal; anything else on the path raises NotImplemented naming the op.
"""

from __future__ import annotations

import itertools

from ..capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented
from ..ir.model import Graph, Node
from ..ops.internal import _UNARY_GRADS

TRAINING = "ai.onnx.preview.training"
INTERNAL = "ai.onnxpy"


def lower_gradients(g: Graph) -> bool:
    """Replace every Gradient node of ``g`` in place; True when something changed."""
    grads = [n for n in g.nodes if n.op_type == "Gradient" and n.domain == TRAINING]
    for gn in grads:
        _lower_one(g, gn)
    return bool(grads)


def _lower_one(g: Graph, gn: Node) -> None:
    xs = list(gn.attrs.get("xs", []))
    y = gn.attrs.get("y")
    counter = itertools.count()
    prefix = f"{gn.name or 'Gradient'}_bw"

    def fresh(tag):
        return f"{prefix}_{tag}_{next(counter)}"

    producer = {o: n for n in g.nodes for o in n.outputs if o}
    # nodes on a path from xs to y, in reverse topological order
    needed, stack = [], [y]
    seen = set()
    while stack:
        v = stack.pop()
        n = producer.get(v)
        if n is None or id(n) in seen or n is gn:
            continue
        seen.add(id(n))
        needed.append(n)
        stack.extend(x for x in n.inputs if x)
    order = [n for n in reversed(g.nodes) if id(n) in seen]
    new_nodes: list[Node] = []
    grads: dict[str, list[str]] = {}

    def emit(op_type, inputs, n_out=1, domain="", **attrs):
        outs = [fresh(op_type) for _ in range(n_out)]
        new_nodes.append(Node(op_type, domain, list(inputs), outs, attrs, name=fresh(op_type + "_node")))
        return outs if n_out > 1 else outs[0]

    def add_grad(name, gname):
        grads.setdefault(name, []).append(gname)

    def total(name):
        parts = grads.get(name)
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else emit("Sum", parts)

    add_grad(y, emit("OnesLike", [y], domain=INTERNAL))
    for n in order:
        gy = total(n.outputs[0])
        if gy is None:
            continue
        op, ins = n.op_type, n.inputs
        if n.domain not in ("", "ai.onnx"):
            raise OrtNotImplemented.make(f"Gradient: no backward rule for {n.domain}:{op} node '{n.name}'")
        if op in ("Add", "Sub"):
            add_grad(ins[0], emit("SumToShape", [gy, ins[0]], domain=INTERNAL))
            gb = gy if op == "Add" else emit("Neg", [gy])
            add_grad(ins[1], emit("SumToShape", [gb, ins[1]], domain=INTERNAL))
        elif op == "Mul":
            add_grad(ins[0], emit("SumToShape", [emit("Mul", [gy, ins[1]]), ins[0]], domain=INTERNAL))
            add_grad(ins[1], emit("SumToShape", [emit("Mul", [gy, ins[0]]), ins[1]], domain=INTERNAL))
        elif op == "Div":
            add_grad(ins[0], emit("SumToShape", [emit("Div", [gy, ins[1]]), ins[0]], domain=INTERNAL))
            gb = emit("Neg", [emit("Div", [emit("Mul", [gy, n.outputs[0]]), ins[1]])])
            add_grad(ins[1], emit("SumToShape", [gb, ins[1]], domain=INTERNAL))
        elif op == "Neg":
            add_grad(ins[0], emit("Neg", [gy]))
        elif op == "Identity":
            add_grad(ins[0], gy)
        elif op == "MatMul":
            ga, gb = emit("MatMulGrad", [gy, ins[0], ins[1]], n_out=2, domain=INTERNAL)
            add_grad(ins[0], ga)
            add_grad(ins[1], gb)
        elif op in _UNARY_GRADS:
            add_grad(ins[0], emit("UnaryGrad", [gy, ins[0], n.outputs[0]], domain=INTERNAL, op=op))
        else:
            raise OrtNotImplemented.make(f"Gradient: no backward rule for {op} node '{n.name}'")
    outs = []
    for x, out_name in zip(xs, gn.outputs):
        gx = total(x)
        src = gx if gx is not None else emit("ZerosLike", [x], domain=INTERNAL)
        outs.append(Node("Identity", "", [src], [out_name], {}, name=fresh("out")))
    idx = g.nodes.index(gn)
    g.nodes[idx:idx + 1] = new_nodes + outs
