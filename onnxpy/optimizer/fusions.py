"""Fusions: decomposed subgraphs -> single ops.

Each pass anchors on one op type (a cheap filter), walks producers to check the pattern, and says nothing
when a check fails (the node is left alone).  Replacement ops are the ones onnxruntime itself writes, so a
model saved at the same level also loads in onnxruntime:

* LayerNormFusion (basic): ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add -> LayerNormalization
* GeluFusion (extended): x * 0.5 * (1 + Erf(x / sqrt(2))) in its exported orders -> com.microsoft.Gelu
* BiasGeluFusion (extended): Gelu(Add(x, const bias)) -> com.microsoft.BiasGelu
* SkipLayerNormFusion (extended): LayerNormalization(Add(a, b)) -> com.microsoft.SkipLayerNormalization
* MatMulAddFusion (basic): MatMul(2-D X, const W) + const B -> Gemm
* MatMulBiasFusion (level 99 only, onnxpy's internal op): MatMul(X of any rank, const 2-D W) + const 1-D bias of
  W's width -> ai.onnxpy.MatMulBias (one GEMM, the bias added in place; float16 rounded once)
* MatMulBiasGeluFusion (level 99 only): BiasGelu(MatMul(X, const 2-D W), const bias) -> ai.onnxpy.MatMulBiasGelu
  (neither runs when the session writes its optimized model: that file stays loadable by onnxruntime)
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.model import Node
from .graph_utils import graph_changed, graph_output_names, shared_consumers, shared_producers
from .passes import Pass

MS = "com.microsoft"


def _scalar(g, name):
    v = g.initializers.get(name) if name else None
    if v is None or v.size != 1 or v.dtype.kind != "f":
        return None
    return float(v.reshape(-1)[0])


def _is(n, op):
    return n is not None and n.op_type == op and n.domain in ("", "ai.onnx")


class _Matcher:
    """Per-pass view of the graph: producers, consumers and which values must stay visible.

    The maps are built on first use (a pass that never asks costs nothing) and shared with the other passes
    through ``graph_utils`` until the graph changes (see ``graph_utils.shared_consumers``).
    """

    def __init__(self, g, ctx):
        self.g = g
        self.outs = graph_output_names(g) | ctx.protected
        self._prod = self._cons = None

    @property
    def prod(self):
        if self._prod is None:
            self._prod = shared_producers(self.g)
        return self._prod

    @property
    def cons(self):
        if self._cons is None:
            self._cons = shared_consumers(self.g)
        return self._cons

    def producer(self, name):
        return self.prod.get(name)

    def producer_of(self, names, op):
        """The first node of ONNX type ``op`` producing one of ``names``, or None."""
        return next((n for n in map(self.prod.get, names) if _is(n, op)), None)

    def single_use(self, name):
        return len(self.cons.get(name, [])) == 1 and name not in self.outs

    def other_input(self, node, name):
        a, b = node.inputs[0], node.inputs[1]
        return b if a == name else (a if b == name else None)


def _reduce_axes(g, n):
    if "axes" in n.attrs:
        return list(n.attrs["axes"])
    if len(n.inputs) > 1 and n.inputs[1] in g.initializers:
        return [int(v) for v in g.initializers[n.inputs[1]].reshape(-1)]
    return None


class AnchoredFusion(Pass):
    """A fusion found from one anchor node: ``match`` returns (replacement, matched nodes) or None.

    The matched nodes (anchor included) are removed and the replacement takes the place of the last of them,
    which keeps the node list topologically ordered; the matcher is rebuilt after each rewrite.
    """

    anchor = ""  # op type of the anchor node
    anchor_domain = ""  # "" means the ONNX domain

    def apply(self, g, ctx):
        domains = (self.anchor_domain,) if self.anchor_domain else ("", "ai.onnx")
        anchor = self.anchor
        if not any(n.op_type == anchor and n.domain in domains for n in g.nodes):
            return 0
        m = _Matcher(g, ctx)
        done = 0
        gone: set = set()  # ids of nodes removed earlier in this sweep
        for node in list(g.nodes):
            if node.op_type != self.anchor or node.domain not in domains or id(node) in gone:
                continue
            found = self.match(node, m, g, ctx)
            if found is None:
                continue
            new, matched = found
            ids = {id(n) for n in matched}
            last = max(i for i, n in enumerate(g.nodes) if id(n) in ids)
            g.nodes[last] = new
            g.nodes[:] = [n for n in g.nodes if id(n) not in ids]
            gone |= ids
            graph_changed(g)
            m = _Matcher(g, ctx)
            done += 1
        return done

    def match(self, node, m: _Matcher, g, ctx):  # pragma: no cover - interface
        raise NotImplementedError


class SweepPass(Pass):
    """A rewrite tried at every node of the ``anchors`` op types (ONNX domain unless ``wants`` says otherwise).

    ``rewrite`` changes the graph in place and returns True when it did; nodes removed earlier in the sweep are
    skipped and the matcher is rebuilt after each rewrite.  ``begin`` computes per-sweep data once (kept as
    ``m.sweep``, e.g. element types) before the first node is tried.
    """

    anchors: tuple = ()

    def wants(self, node) -> bool:
        return node.op_type in self.anchors and node.domain in ("", "ai.onnx")

    def begin(self, g, ctx):
        return None

    def apply(self, g, ctx):
        wants = self.wants
        if not any(wants(n) for n in g.nodes):
            return 0
        state = self.begin(g, ctx)
        m = _Matcher(g, ctx)
        m.sweep = state
        done = 0
        live = None  # ids of the nodes still in the graph, once a rewrite has run
        for node in list(g.nodes):
            if not self.wants(node) or (live is not None and id(node) not in live):
                continue
            if self.rewrite(node, m, g, ctx):
                done += 1
                graph_changed(g)
                m = _Matcher(g, ctx)
                m.sweep = state
                live = set(map(id, g.nodes))
        return done

    def rewrite(self, node, m: _Matcher, g, ctx) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


class LayerNormFusion(AnchoredFusion):
    name = "LayerNormFusion"
    level = 1
    anchor = "Add"

    def match(self, add, m, g, ctx):
        mul = m.producer_of(add.inputs, "Mul")
        if mul is None or not m.single_use(mul.outputs[0]):
            return None
        beta = m.other_input(add, mul.outputs[0])
        div = m.producer_of(mul.inputs, "Div")
        if div is None or beta not in g.initializers or not m.single_use(div.outputs[0]):
            return None
        gamma = m.other_input(mul, div.outputs[0])
        if gamma not in g.initializers:
            return None
        sub, sqrt = m.producer(div.inputs[0]), m.producer(div.inputs[1])
        if not (_is(sub, "Sub") and _is(sqrt, "Sqrt")):
            return None
        eps_add = m.producer(sqrt.inputs[0])
        if not _is(eps_add, "Add"):
            return None
        var = m.producer_of(eps_add.inputs, "ReduceMean")
        if var is None:
            return None
        eps = _scalar(g, m.other_input(eps_add, var.outputs[0]))
        sq = m.producer(var.inputs[0])
        if eps is None or sq is None:
            return None
        if _is(sq, "Pow"):
            if sq.inputs[0] != sub.outputs[0] or _scalar(g, sq.inputs[1]) != 2.0:
                return None
        elif not (_is(sq, "Mul") and sq.inputs == [sub.outputs[0], sub.outputs[0]]):
            return None
        mean = m.producer(sub.inputs[1])
        x = sub.inputs[0]
        if not _is(mean, "ReduceMean") or mean.inputs[0] != x:
            return None
        axes1, axes2 = _reduce_axes(g, mean), _reduce_axes(g, var)
        if axes1 is None or axes1 != axes2 or len(axes1) != 1 or axes1[0] != -1:
            return None
        if mean.attrs.get("keepdims", 1) != 1 or var.attrs.get("keepdims", 1) != 1:
            return None
        if any(not m.single_use(n.outputs[0]) for n in (var, eps_add, sqrt, mean)):
            return None
        sub_readers = m.cons.get(sub.outputs[0], [])
        if set(map(id, sub_readers)) != {id(sq), id(div)} or sub.outputs[0] in m.outs:
            return None
        ln = Node("LayerNormalization", "", [x, gamma, beta], [add.outputs[0]],
                  {"axis": -1, "epsilon": eps}, name=ctx.fresh("LayerNorm"))
        return ln, [sub, sq, var, eps_add, sqrt, div, mul, mean, add]


def _near(value, target):
    """Constants as exporters write them, float16-rounded ones included (sqrt(2) is 1.4140625 in float16)."""
    return value is not None and abs(value - target) <= 1e-3 * abs(target)


class GeluFusion(AnchoredFusion):
    """Mul(Mul(x, 0.5)?, Add(Erf(Div(x, sqrt2)), 1)) in the orders exporters write."""

    name = "GeluFusion"
    level = 2
    anchor = "Erf"

    def match(self, erf, m, g, ctx):
        div = m.producer(erf.inputs[0])
        if not ((_is(div, "Div") and _near(_scalar(g, div.inputs[1]), math.sqrt(2)))
                or (_is(div, "Mul") and _near(_scalar(g, div.inputs[1]), 1 / math.sqrt(2)))):
            return None
        x = div.inputs[0]
        add1 = self._only_reader(m, erf, "Add")
        if add1 is None or _scalar(g, m.other_input(add1, erf.outputs[0])) != 1.0:
            return None
        mul1 = self._only_reader(m, add1, "Mul")
        if mul1 is None:
            return None
        other = m.other_input(mul1, add1.outputs[0])
        half_first = m.producer(other)
        chain = [div, erf, add1, mul1]
        if other == x:  # (x * (1 + erf)) * 0.5
            last = self._only_reader(m, mul1, "Mul")
            if last is None or _scalar(g, m.other_input(last, mul1.outputs[0])) != 0.5:
                return None
            chain.append(last)
        elif _is(half_first, "Mul") and x in half_first.inputs and m.single_use(other) \
                and _scalar(g, m.other_input(half_first, x)) == 0.5:  # (x * 0.5) * (1 + erf)
            last = mul1
            chain.append(half_first)
        elif _scalar(g, other) == 0.5:  # x * (0.5 * (1 + erf))  (torch.onnx dynamo exports)
            last = self._only_reader(m, mul1, "Mul")
            if last is None or m.other_input(last, mul1.outputs[0]) != x:
                return None
            chain.append(last)
        else:
            return None
        if any(not m.single_use(n.outputs[0]) for n in chain if n is not last):
            return None
        return Node("Gelu", MS, [x], [last.outputs[0]], {}, name=ctx.fresh("Gelu")), chain

    @staticmethod
    def _only_reader(m, node, op):
        readers = m.cons.get(node.outputs[0], [])
        return readers[0] if len(readers) == 1 and _is(readers[0], op) else None


class BiasGeluFusion(AnchoredFusion):
    name = "BiasGeluFusion"
    level = 2
    anchor = "Gelu"
    anchor_domain = MS

    def match(self, gelu, m, g, ctx):
        add = m.producer(gelu.inputs[0])
        if not _is(add, "Add") or not m.single_use(add.outputs[0]):
            return None
        bias = next((x for x in add.inputs if x in g.initializers and g.initializers[x].ndim == 1), None)
        if bias is None:
            return None
        x = m.other_input(add, bias)
        return Node("BiasGelu", MS, [x, bias], list(gelu.outputs), {}, name=ctx.fresh("BiasGelu")), [add, gelu]


class SkipLayerNormFusion(AnchoredFusion):
    name = "SkipLayerNormFusion"
    level = 2
    anchor = "LayerNormalization"

    def match(self, ln, m, g, ctx):
        if len([o for o in ln.outputs if o]) != 1 or ln.attrs.get("axis", -1) != -1 or len(ln.inputs) < 2:
            return None
        add = m.producer(ln.inputs[0])
        if not _is(add, "Add") or not m.single_use(add.outputs[0]):
            return None
        a, b = add.inputs
        if a in g.initializers or b in g.initializers:
            return None
        inputs = [a, b, ln.inputs[1]] + ([ln.inputs[2]] if len(ln.inputs) > 2 and ln.inputs[2] else [])
        sln = Node("SkipLayerNormalization", MS, inputs, [ln.outputs[0]],
                   {"epsilon": ln.attrs.get("epsilon", 1e-5)}, name=ctx.fresh("SkipLayerNorm"))
        return sln, [add, ln]


class MatMulAddFusion(AnchoredFusion):
    name = "MatMulAddFusion"
    level = 1
    anchor = "Add"

    def match(self, add, m, g, ctx):
        mm = m.producer_of(add.inputs, "MatMul")
        if mm is None or not m.single_use(mm.outputs[0]):
            return None
        bias = m.other_input(add, mm.outputs[0])
        w = g.initializers.get(mm.inputs[1])
        b = g.initializers.get(bias)
        if w is None or b is None or w.ndim != 2 or b.ndim > 2 or w.dtype.kind != "f" or b.dtype != w.dtype:
            return None
        if b.ndim == 2 and b.shape[0] != 1:
            return None
        x_info = ctx.value_type(g, mm.inputs[0])
        if x_info is None or x_info.shape is None or len(x_info.shape) != 2:
            return None
        gemm = Node("Gemm", "", [mm.inputs[0], mm.inputs[1], bias], [add.outputs[0]], {}, name=ctx.fresh("Gemm"))
        return gemm, [mm, add]


_FLOAT_KINDS = frozenset(("float16", "float32", "float64", "bfloat16"))


def _saving(ctx) -> bool:
    """True when the optimized graph is to be written out (``optimized_model_filepath``): the MatMul fusions below
    only speed up this process's runs, and leaving them out keeps the saved model loadable by onnxruntime."""
    return bool(getattr(ctx.options, "optimized_model_filepath", "")) if ctx.options is not None else False


class MatMulBiasFusion(AnchoredFusion):
    """MatMul + bias Add for the activations of transformers ([batch, seq, hidden] @ [hidden, out] + [out]).

    Level 99 only (the op is onnxpy's): it runs after the extended fusions of the same round, so BiasGelu and
    SkipLayerNormalization have taken their Adds and attention fusion has read the projections first.
    """

    name = "MatMulBiasFusion"
    level = 99
    anchor = "Add"

    def match(self, add, m, g, ctx):
        if len(add.inputs) != 2 or len(add.outputs) != 1 or _saving(ctx):
            return None
        for mm_out, bias in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            mm = m.producer(mm_out)
            if not _is(mm, "MatMul") or len(mm.inputs) != 2 or not m.single_use(mm_out):
                continue
            w = g.initializers.get(mm.inputs[1])
            b = g.initializers.get(bias)
            if w is None or b is None or not isinstance(w, np.ndarray) or not isinstance(b, np.ndarray):
                continue
            if w.ndim != 2 or b.ndim != 1 or b.shape[0] != w.shape[1] or b.dtype != w.dtype \
                    or w.dtype.name not in _FLOAT_KINDS or mm.inputs[0] in g.initializers:
                continue
            new = Node("MatMulBias", "ai.onnxpy", [mm.inputs[0], mm.inputs[1], bias], [add.outputs[0]], {},
                       name=ctx.fresh("MatMulBias"))
            return new, [mm, add]
        return None


class MatMulBiasGeluFusion(AnchoredFusion):
    """BiasGelu(MatMul(X, const 2-D W), const 1-D bias) -> ai.onnxpy.MatMulBiasGelu (level 99 only).

    The GELU runs in place on the GEMM's fresh output; a float16 model skips rounding the product to float16 and
    widening it again.
    """

    name = "MatMulBiasGeluFusion"
    level = 99
    anchor = "BiasGelu"
    anchor_domain = MS

    def match(self, bg, m, g, ctx):
        if len(bg.inputs) != 2 or len(bg.outputs) != 1 or _saving(ctx):
            return None
        mm = m.producer(bg.inputs[0])
        if not _is(mm, "MatMul") or len(mm.inputs) != 2 or not m.single_use(bg.inputs[0]):
            return None
        w = g.initializers.get(mm.inputs[1])
        b = g.initializers.get(bg.inputs[1])
        if not isinstance(w, np.ndarray) or not isinstance(b, np.ndarray) or mm.inputs[0] in g.initializers:
            return None
        if w.ndim != 2 or b.ndim != 1 or b.shape[0] != w.shape[1] or b.dtype != w.dtype \
                or w.dtype.name not in _FLOAT_KINDS:
            return None
        new = Node("MatMulBiasGelu", "ai.onnxpy", [mm.inputs[0], mm.inputs[1], bg.inputs[1]], [bg.outputs[0]], {},
                   name=ctx.fresh("MatMulBiasGelu"))
        return new, [mm, bg]


class FeedForwardFusion(AnchoredFusion):
    """MatMulBiasGelu -> MatMulBias (a transformer's feed-forward block, the GELU output read only by the second
    GEMM) -> ai.onnxpy.FeedForward, float32 constant weights only (level 99, after the two MatMul fusions): its
    kernel keeps the wide intermediate in the transposed layout OpenBLAS multiplies fastest."""

    name = "FeedForwardFusion"
    level = 99
    anchor = "MatMulBias"
    anchor_domain = "ai.onnxpy"

    def match(self, mb, m, g, ctx):
        if len(mb.inputs) != 3 or len(mb.outputs) != 1 or _saving(ctx):
            return None
        up = m.producer(mb.inputs[0])
        if up is None or up.op_type != "MatMulBiasGelu" or up.domain != "ai.onnxpy" or len(up.inputs) != 3 \
                or not m.single_use(mb.inputs[0]):
            return None
        consts = [g.initializers.get(n) for n in (up.inputs[1], up.inputs[2], mb.inputs[1], mb.inputs[2])]
        if any(not isinstance(c, np.ndarray) or c.dtype != np.float32 for c in consts):
            return None
        w1, b1, w2, b2 = consts
        if w1.ndim != 2 or w2.ndim != 2 or w2.shape[0] != w1.shape[1] or b1.shape != (w1.shape[1],) \
                or b2.shape != (w2.shape[1],):
            return None
        new = Node("FeedForward", "ai.onnxpy", [up.inputs[0], up.inputs[1], up.inputs[2], mb.inputs[1], mb.inputs[2]],
                   [mb.outputs[0]], {}, name=ctx.fresh("FeedForward"))
        return new, [up, mb]


def _gemm_plain(n, g) -> bool:
    """A Gemm that is ``A @ B (+ C)`` with a constant 2-D float32 B and a constant C of B's width (or none)."""
    if not _is(n, "Gemm") or len(n.outputs) != 1 or n.inputs[0] in g.initializers:
        return False
    a = n.attrs
    if float(a.get("alpha", 1.0)) != 1.0 or float(a.get("beta", 1.0)) != 1.0 or a.get("transA", 0) \
            or a.get("transB", 0):
        return False
    w = g.initializers.get(n.inputs[1])
    if not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.ndim != 2:
        return False
    c = g.initializers.get(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
    if len(n.inputs) > 2 and n.inputs[2] and not (
            isinstance(c, np.ndarray) and c.dtype == np.float32 and c.size == w.shape[1] and c.ndim <= 2
            and c.shape[-1] == w.shape[1]):
        return False
    return True


def _bias_input(g, ctx, name, N: int, extra=None) -> str:
    """A fused node's 1-D float32 bias of N values: the constant ``name`` itself when it already is one (and nothing
    is added), else a new constant -- zeros for a missing bias, a (1, N) one flattened, ``extra`` added."""
    c = g.initializers.get(name) if name else None
    if c is not None and extra is None and c.shape == (N,):
        return name
    v = np.zeros(N, np.float32) if c is None else np.array(c, np.float32).reshape(N)
    if extra is not None:
        v = v + extra
    new = ctx.fresh("fused_bias")
    g.initializers[new] = v
    return new


class FeedForwardTanhFusion(AnchoredFusion):
    """Gemm -> Reshape -> FastGelu -> Reshape -> Gemm (GPT-2's MLP as PyTorch's Conv1D exports it: 2-D products on
    the flattened rows, the GELU between them on the [batch, seq, hidden] view) -> ai.onnxpy.FeedForward with
    ``activation="gelu_tanh"`` (level 99, float32 constant weights).  The Reshapes go: FastGelu is element-wise, the
    second Reshape must turn the GELU's output back into the first product's 2-D shape (rows, F) -- so its Gemm
    requires -- and their targets become the node's sixth and seventh inputs (checked, not applied: an input the
    original Reshapes reject is still rejected; a constant [-1 or rows, F] second target is left out).  Shape nodes
    reading the values inside (TorchScript exports read the GELU's output shape) become ai.onnxpy.ShapeOf nodes.  A
    missing bias becomes zeros; FastGelu's own bias is added to the first product's."""

    name = "FeedForwardTanhFusion"
    level = 99
    anchor = "Gemm"

    def match(self, g2, m, g, ctx):
        if _saving(ctx) or not _gemm_plain(g2, g):
            return None
        r2 = m.producer(g2.inputs[0])
        if not _input_reshape(r2):
            return None
        act = m.producer(r2.inputs[0])
        if act is None or act.op_type != "FastGelu" or act.domain != MS:
            return None
        r1 = m.producer(act.inputs[0])
        if not _input_reshape(r1):
            return None
        g1 = m.producer(r1.inputs[0])
        if g1 is None or not _gemm_plain(g1, g):
            return None
        # every value inside read by the next step only, or also by Shape nodes (kept as ShapeOf nodes)
        readers = [_shape_readers(m, v, n) for v, n in ((g1.outputs[0], r1), (r1.outputs[0], act),
                                                       (act.outputs[0], r2), (r2.outputs[0], g2))]
        if any(r is None for r in readers):
            return None
        w1, w2 = g.initializers[g1.inputs[1]], g.initializers[g2.inputs[1]]
        F = w1.shape[1]
        if w2.shape[0] != F:
            return None
        tgt = g.initializers.get(r2.inputs[1])
        # a constant [-1 or rows, F] gives the first product's shape back; any other target goes along, checked
        flat_const = isinstance(tgt, np.ndarray) and tgt.size == 2 and int(tgt.reshape(-1)[1]) == F \
            and int(tgt.reshape(-1)[0]) != 0  # (no 0 in the target: allowzero does not matter)
        fb = None
        if len(act.inputs) > 1 and act.inputs[1]:
            fb = g.initializers.get(act.inputs[1])
            if not isinstance(fb, np.ndarray) or fb.dtype != np.float32 or fb.shape != (F,):
                return None
        biases = [_bias_input(g, ctx, n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None,
                              g.initializers[n.inputs[1]].shape[1], extra) for n, extra in ((g1, fb), (g2, None))]
        sides = _Sides()
        F1 = [(0, F)]
        sides.add(readers[0], F1, [])
        sides.add(readers[1] + readers[2], F1 + _reshape_steps([r1]), [r1.inputs[1]])
        sides.add(readers[3], F1 + _reshape_steps([r1, r2]), [r1.inputs[1], r2.inputs[1]])
        sides.write(g, m, g1.inputs[0], ctx)
        # (the first Reshape's target goes along: the kernel raises what that Reshape would have raised)
        inputs = [g1.inputs[0], g1.inputs[1], biases[0], g2.inputs[1], biases[1], r1.inputs[1]]
        attrs = {"activation": "gelu_tanh", "view_allowzero": int(r1.attrs.get("allowzero", 0))}
        if not flat_const:
            inputs.append(r2.inputs[1])
            attrs["flat_allowzero"] = int(r2.attrs.get("allowzero", 0))
        new = Node("FeedForward", "ai.onnxpy", inputs, [g2.outputs[0]], attrs, name=ctx.fresh("FeedForward"))
        return new, [g1, r1, act, r2, g2]


def _projection(n, g):
    """(weight name, bias name or None, was it a Gemm) for a float32 MatMulBias / plain Gemm with a constant 2-D
    weight and a constant 1-D bias of its width (or none), else None."""
    if n is None or len(n.outputs) != 1:
        return None
    if n.op_type == "MatMulBias" and n.domain == "ai.onnxpy" and len(n.inputs) == 3:
        w, b = g.initializers.get(n.inputs[1]), g.initializers.get(n.inputs[2])
        if (isinstance(w, np.ndarray) and isinstance(b, np.ndarray) and w.dtype == np.float32 and w.ndim == 2
                and b.shape == (w.shape[1],) and b.dtype == np.float32):
            return n.inputs[1], n.inputs[2], False
        return None
    if _gemm_plain(n, g):
        c = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
        return n.inputs[1], c, True
    return None


def _input_reshape(n) -> bool:
    """A Reshape whose target shape is an input (opset 5 and later)."""
    return _is(n, "Reshape") and len(n.inputs) == 2 and bool(n.inputs[1])


def _chain_back(m, name):
    """(the Reshapes producing ``name``, in order, the value they start from)."""
    chain = []
    while _input_reshape(n := m.producer(name)):
        chain.append(n)
        name = n.inputs[0]
    return chain[::-1], name


def _shape_readers(m, name, main):
    """The Shape nodes reading ``name`` besides its one other reader ``main``; None when anything else reads it (or it
    is a graph output).  A fused region keeps such Shape readers as ai.onnxpy.ShapeOf nodes (see ``_Sides``)."""
    if name in m.outs:
        return None
    rs, mains = [], 0
    for n in m.cons.get(name, []):
        if n is main:
            mains += 1
        elif _is(n, "Shape") and len(n.outputs) == 1:
            rs.append(n)
        else:
            return None
    return rs if mains == 1 else None


def _reshapes_back(m, name, reader):
    """The Reshapes (shape given as an input) producing ``name`` (read by ``reader``), back to the value they start
    from: (chain in order, start, {i: Shape nodes reading the value after the chain's first i Reshapes}); None when a
    value on the way has another reader."""
    chain, start = _chain_back(m, name)
    sides = {}
    values = [start] + [n.outputs[0] for n in chain]  # (the value after the chain's first i Reshapes)
    for i, (v, rd) in enumerate(zip(values, chain + [reader])):
        got = _shape_readers(m, v, rd)
        if got is None:
            return None
        if got:
            sides[i] = got
    return chain, start, sides


def _reshapes_forward(m, name):
    """The Reshapes reading ``name`` onwards: (chain, the value they end at, its reader, {i: Shape nodes reading the
    value after the chain's first i Reshapes}); None when a value has other readers than one node and Shapes."""
    chain, sides = [], {}
    while True:
        others = [n for n in m.cons.get(name, []) if not (_is(n, "Shape") and len(n.outputs) == 1)]
        if len(others) != 1:
            return None
        got = _shape_readers(m, name, others[0])
        if got is None:
            return None
        if got:
            sides[len(chain)] = got
        n = others[0]
        if not (_input_reshape(n) and n.inputs[0] == name):
            return chain, name, n, sides
        chain.append(n)
        name = n.outputs[0]


def _targets_of(chain):
    return [n.inputs[1] for n in chain], [int(n.attrs.get("allowzero", 0)) for n in chain]


class _Sides:
    """Shape nodes reading values inside a fused region, each to become an ai.onnxpy.ShapeOf of the region's input:
    the shape replayed along the region's steps (``path``: (kind, argument) pairs, see ops/attention_block.py) with
    the Reshapes' shape inputs it passes."""

    def __init__(self):
        self.items = []

    def add(self, nodes, path, targets):
        for n in nodes or ():
            self.items.append((n, list(path), list(targets)))

    def write(self, g, m, x, ctx):
        if not self.items:
            return
        # replayed from before the Reshapes that give the region's input its shape (TorchScript's flattening of
        # the [batch, seq, hidden] activations): the ShapeOf nodes then join the shape chains of that value, which
        # the executor runs once per input shape
        flatten, x = _chain_back(m, x)
        head, head_t = _reshape_steps(flatten), _targets_of(flatten)[0]
        where = {id(n): i for i, n in enumerate(g.nodes)}
        for n, path, targets in self.items:
            path, targets = head + path, head_t + targets
            attrs = {"path": [v for step in path for v in step]}
            if "start" in n.attrs:
                attrs["start"] = int(n.attrs["start"])
            if "end" in n.attrs:
                attrs["end"] = int(n.attrs["end"])
            g.nodes[where[id(n)]] = Node("ShapeOf", "ai.onnxpy", [x] + targets, list(n.outputs), attrs,
                                         name=ctx.fresh("ShapeOf"))


def _reshape_steps(chain):
    return [(1, az) for az in _targets_of(chain)[1]]


def _chain_sides(sides, out, chain, head_path, head_targets):
    """Record the Shape readers along ``chain`` (``sides`` as the walkers give them) after ``head_path``."""
    t, steps = _targets_of(chain)[0], _reshape_steps(chain)
    for i, nodes in sides.items():
        out.add(nodes, head_path + steps[:i], head_targets + t[:i])


class AttentionBlockFusion(AnchoredFusion):
    """Self-attention from its input projection to its output projection -> ai.onnxpy.AttentionBlock (level 99,
    float32 constant projections; see ops/attention_block.py):

        MatMulBias|Gemm -> Reshape* -> Split(3) -> Reshape* (q, k, v alike) -> MultiHeadAttention -> Reshape*
        -> MatMulBias|Gemm

    The Reshapes' shape inputs go along (the kernel replays them on shapes: their errors stand).  Only attention
    without a bias input, past keys/values or other outputs; every value inside read by the next step only, or also
    by Shape nodes (TorchScript exports read the split heads' and the attention output's shapes to build the next
    Reshape's target): those become ai.onnxpy.ShapeOf nodes, the same shape replayed from the block's input."""

    name = "AttentionBlockFusion"
    level = 99
    anchor = "MultiHeadAttention"
    anchor_domain = MS
    _ATTRS = {"num_heads", "scale", "mask_filter_value", "unidirectional"}

    def match(self, mha, m, g, ctx):
        if _saving(ctx) or len(mha.outputs) != 1 or not mha.outputs[0] or len(mha.inputs) > 6:
            return None
        ins = list(mha.inputs) + [""] * (6 - len(mha.inputs))
        if not all(ins[:3]) or ins[3] or set(mha.attrs) - self._ATTRS or "num_heads" not in mha.attrs:
            return None
        if len(set(ins[:3])) != 3:
            return None
        chains = []
        for x in ins[:3]:
            got = _reshapes_back(m, x, mha)
            if got is None:
                return None
            chains.append(got)
        split = m.producer(chains[0][1])
        if not _is(split, "Split") or len(split.outputs) != 3 or [c[1] for c in chains] != list(split.outputs):
            return None
        mid = _targets_of(chains[0][0])
        if any(_targets_of(c[0])[1] != mid[1] for c in chains[1:]):
            return None  # (q, k and v reshaped alike: the same number of Reshapes, the same allowzero flags)
        size = self._split_size(split, g)
        if size is None:
            return None
        pre_got = _reshapes_back(m, split.inputs[0], split)
        if pre_got is None:
            return None
        pre_chain, src, pre_sides = pre_got
        p1 = m.producer(src)
        got1 = _projection(p1, g)
        if got1 is None or p1.inputs[0] in g.initializers:
            return None
        post_got = _reshapes_forward(m, mha.outputs[0])
        if post_got is None:
            return None
        post_chain, end, p2, post_sides = post_got
        got2 = _projection(p2, g)
        if got2 is None or p2.inputs[0] != end:
            return None
        w1, w2 = g.initializers[got1[0]], g.initializers[got2[0]]
        if w1.shape[1] % 3 or w2.shape[0] != w1.shape[1] // 3:
            return None
        D = w1.shape[1] // 3
        axis = int(split.attrs.get("axis", 0))
        # the Shape readers inside: shapes replayed from the block's input along the steps to their value
        sides = _Sides()
        pre_t = _targets_of(pre_chain)[0]
        _chain_sides(pre_sides, sides, pre_chain, [(0, 3 * D)], [])
        head = [(0, 3 * D)] + _reshape_steps(pre_chain) + [(2, axis), (3, size)]
        for c in chains:
            _chain_sides(c[2], sides, c[0], head, pre_t)
        q_chain = chains[0][0]
        _chain_sides(post_sides, sides, post_chain, head + _reshape_steps(q_chain) + [(4, D)],
                     pre_t + _targets_of(q_chain)[0])
        biases = [_bias_input(g, ctx, got[1], w.shape[1]) for got, w in ((got1, w1), (got2, w2))]
        post = _targets_of(post_chain)
        attrs = {k: v for k, v in mha.attrs.items()}
        attrs.update(split_axis=axis, split_size=size, pre_allowzero=_targets_of(pre_chain)[1],
                     mid_allowzero=mid[1], post_allowzero=post[1], proj_2d=[int(got1[2]), int(got2[2])])
        mids = [t for c in chains for t in _targets_of(c[0])[0]]
        inputs = [p1.inputs[0], got1[0], biases[0], got2[0], biases[1], ins[4], ins[5]] + pre_t + mids + post[0]
        new = Node("AttentionBlock", "ai.onnxpy", inputs, [p2.outputs[0]], attrs, name=ctx.fresh("AttentionBlock"))
        matched = [p1, *pre_chain, split, *(n for c in chains for n in c[0]), mha, *post_chain, p2]
        sides.write(g, m, p1.inputs[0], ctx)
        return new, matched

    @staticmethod
    def _split_size(split, g):
        """The Split's part size (0: three equal parts), or None for uneven or unknown parts."""
        sizes = None
        if len(split.inputs) > 1 and split.inputs[1]:
            v = g.initializers.get(split.inputs[1])
            if not isinstance(v, np.ndarray):
                return None
            sizes = [int(s) for s in v.reshape(-1)]
        elif "split" in split.attrs:
            sizes = [int(s) for s in split.attrs["split"]]
        if sizes is None:
            return 0 if split.attrs.get("num_outputs", 3) == 3 else None
        return sizes[0] if len(sizes) == 3 and sizes[0] == sizes[1] == sizes[2] and sizes[0] > 0 else None


FUSION_PASSES: list = [GeluFusion(), BiasGeluFusion(), SkipLayerNormFusion(), MatMulBiasFusion(),
                       MatMulBiasGeluFusion(), FeedForwardFusion(), FeedForwardTanhFusion(), AttentionBlockFusion()]
BASIC_FUSIONS: list = [LayerNormFusion(), MatMulAddFusion()]

__all__ = ["FUSION_PASSES", "BASIC_FUSIONS", "AnchoredFusion", "SweepPass", "np"]
