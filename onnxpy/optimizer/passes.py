"""Graph passes.  Each pass is a small object: ``name`` (onnxruntime's optimizer name where one exists, so
``disabled_optimizers`` works the same), the minimum ``level``, and ``apply(graph, ctx) -> number of rewrites``.
"""

from __future__ import annotations

import numpy as np

from ..ir.model import Graph, Node, ValueInfo
from .graph_utils import consumers, graph_output_names, producers, rename_uses, use_counts

NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                    "Multinomial"}
DEFAULT_FOLD_LIMIT = 1 << 28  # bytes: larger folded outputs stay computed at run time


class Pass:
    name = "Pass"
    level = 1
    # op types one of which the graph must hold for the pass to do anything (the pass runner skips it otherwise);
    # None: not declared (SweepPass / AnchoredFusion derive it from their anchors, see optimizer._anchor_ops)
    needs: frozenset | None = None

    def apply(self, g: Graph, ctx) -> int:  # pragma: no cover - interface
        raise NotImplementedError


class ConstantFolding(Pass):
    """Nodes whose inputs are all constants are run once; their outputs become initializers."""

    name = "ConstantFolding"
    level = 1

    def apply(self, g, ctx):
        consts = {k for k in g.initializers if k not in ctx.graph_input_names(g)}
        limit = ctx.fold_limit
        keep, folded = [], 0
        for n in g.nodes:
            if self._foldable(n, consts, ctx):
                outs = ctx.run_node(n, [g.initializers[x] if x else None for x in n.inputs])
                if outs is not None and all(isinstance(o, np.ndarray) and o.dtype != object and o.nbytes <= limit
                                            for o, name in zip(outs, n.outputs) if name):
                    for name, val in zip(n.outputs, outs):
                        if name:
                            g.initializers[name] = val
                            consts.add(name)
                    folded += 1
                    continue
            keep.append(n)
        g.nodes[:] = keep
        return folded

    @staticmethod
    def _foldable(n: Node, consts, ctx) -> bool:
        if n.op_type in NONDETERMINISTIC or n.domain not in ("", "ai.onnx") or n.subgraphs():
            return False
        if n.op_type in ("Dropout",) and len(n.outputs) > 1:
            return False
        if n.op_type == "DequantizeLinear":
            # kept for the QDQ fusions (as onnxruntime does) unless they are switched off
            from .fusions_qdq import qdq_disabled

            if not qdq_disabled(ctx):
                return False
        if any(o in ctx.protected for o in n.outputs):
            return False
        return all((not x) or x in consts for x in n.inputs)


class EliminateIdentity(Pass):
    """Identity(X) -> X: readers of the output read the input."""

    name = "EliminateIdentity"
    level = 1
    ops = ("Identity",)

    def apply(self, g, ctx):
        outs = graph_output_names(g)
        n_done = 0
        for n in list(g.nodes):
            if n.op_type not in self.ops or n.domain not in ("", "ai.onnx") or not self._removable(n, g):
                continue
            src, dst = n.inputs[0], n.outputs[0]
            if not src or dst in outs or dst in ctx.protected:
                continue
            g.nodes.remove(n)
            rename_uses(g, dst, src)
            n_done += 1
        return n_done

    def _removable(self, n, g):
        return len(n.inputs) >= 1 and len(n.outputs) == 1


class EliminateDropout(EliminateIdentity):
    """Dropout in inference (no used mask, not in training mode) -> its input."""

    name = "EliminateDropout"
    ops = ("Dropout",)

    def _removable(self, n, g):
        if len(n.outputs) > 1 and n.outputs[1]:
            if use_counts(g).get(n.outputs[1]):
                return False
        if len(n.inputs) >= 3 and n.inputs[2]:
            tm = g.initializers.get(n.inputs[2])
            if tm is None or bool(np.asarray(tm).reshape(-1)[0]):
                return False
        return True


class DeadCodeElimination(Pass):
    """Nodes none of whose outputs are read, and initializers nobody reads, are removed."""

    name = "DeadCodeElimination"
    level = 1

    def apply(self, g, ctx):
        removed = 0
        while True:
            counts = use_counts(g)
            keep = [n for n in g.nodes if any(counts.get(o) or o in ctx.protected for o in n.outputs if o)]
            if len(keep) == len(g.nodes):
                break
            removed += len(g.nodes) - len(keep)
            g.nodes[:] = keep
        counts = use_counts(g)
        inputs = ctx.graph_input_names(g)
        for k in [k for k in g.initializers if k not in counts and k not in inputs and k not in ctx.protected]:
            del g.initializers[k]
        return removed


def _const(g, name):
    return g.initializers.get(name) if name else None


class ConvBNFusion(Pass):
    """Conv(X, W, B) -> BatchNormalization(scale, bias, mean, var) with constant parameters -> Conv(X, W', B')."""

    name = "ConvBNFusion"
    level = 1
    needs = frozenset(("BatchNormalization",))

    def apply(self, g, ctx):
        prod = producers(g)
        cons = consumers(g)
        outs = graph_output_names(g)
        done = 0
        for bn in list(g.nodes):
            if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
                continue
            if len([o for o in bn.outputs if o]) != 1 or bn.attrs.get("training_mode", 0):
                continue
            conv = prod.get(bn.inputs[0])
            if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
                continue
            if len(cons.get(conv.outputs[0], [])) != 1 or conv.outputs[0] in outs:
                continue
            params = [_const(g, x) for x in bn.inputs[1:5]]
            w = _const(g, conv.inputs[1])
            b = _const(g, conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
            if w is None or any(p is None for p in params) or (len(conv.inputs) > 2 and conv.inputs[2] and b is None):
                continue
            if w.dtype.kind != "f" or any(p.dtype != w.dtype for p in params):
                continue
            scale, bias, mean, var = params
            eps = bn.attrs.get("epsilon", 1e-5)
            factor = scale / np.sqrt(var + np.asarray(eps, var.dtype))
            w2 = (w * factor.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
            b0 = b if b is not None else np.zeros(w.shape[0], w.dtype)
            b2 = ((b0 - mean) * factor + bias).astype(w.dtype)
            wn, bn_name = ctx.fresh(conv.inputs[1] + "_bnfused"), ctx.fresh(conv.outputs[0] + "_bias_bnfused")
            g.initializers[wn] = w2
            g.initializers[bn_name] = b2
            conv.inputs = [conv.inputs[0], wn, bn_name]
            old = conv.outputs[0]
            conv.outputs = [bn.outputs[0]]
            g.nodes.remove(bn)
            del old
            done += 1
        return done


BASIC_PASSES = [ConstantFolding(), EliminateIdentity(), EliminateDropout(), ConvBNFusion(), DeadCodeElimination()]

__all__ = ["BASIC_PASSES", "Pass", "ValueInfo"]
