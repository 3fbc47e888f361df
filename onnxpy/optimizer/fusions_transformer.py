"""Extended-level (ORT_ENABLE_EXTENDED) transformer fusions, each emitting an op onnxruntime's CPU EP runs:

* FastGeluFusion: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) (Pow(x,3), x*x*x or x*(x*x) cube; also the
  c1*x + c2*x^3 form) in its exported orders -> com.microsoft.FastGelu
* QuickGeluFusion: x*Sigmoid(alpha*x) (alpha = 1 without the Mul) -> com.microsoft.QuickGelu(alpha)
* SimplifiedLayerNormFusion: x / Sqrt(ReduceMean(x^2, -1) + eps) * scale (Div, or Reciprocal+Mul) ->
  SimplifiedLayerNormalization (domain "", onnxruntime's contrib schema)
* GemmActivationFusion: Gemm -> Relu/Tanh/Sigmoid/LeakyRelu/HardSigmoid/Elu/Selu/Softplus/Softsign/ThresholdedRelu
  -> com.microsoft.FusedGemm
* MatmulTransposeFusion: MatMul(Transpose(a) swapping the last two dims, ...) -> com.microsoft.FusedMatMul(transA/B)
* MatMulScaleFusion: scalar Mul/Div before or after a MatMul -> FusedMatMul(alpha)
* AttentionFusion: the BERT / GPT-2 self-attention subgraph torch exports (Reshape+Transpose heads, MatMul,
  Mul/Div scale, Add mask, Softmax, MatMul, Transpose back) -> com.microsoft.MultiHeadAttention
"""

from __future__ import annotations

import math

import numpy as np

from ..ir.model import Node
from .fusions import MS, SweepPass, _is, _reduce_axes, _scalar
from .fusions_misc import declared_dims, elem_types


def _close(a, b, tol=1e-3):
    return a is not None and abs(a - b) <= tol * max(1.0, abs(b))


def _readers(m, name):
    return m.cons.get(name, [])


def _only_reader(m, name, op):
    r = _readers(m, name)
    if len(r) == 1 and _is(r[0], op) and name not in m.outs:
        return r[0]
    return None


def _replace(g, last, new, dead):
    g.nodes[g.nodes.index(last)] = new
    for n in dead:
        if n is not last and n in g.nodes:
            g.nodes.remove(n)


# ----------------------------------------------------------------------------------------------------- FastGelu
class FastGeluFusion(SweepPass):
    name = "FastGeluFusion"
    level = 2

    anchors = ("Tanh",)

    def rewrite(self, tanh, m, g, ctx):
        inner = self._inner(g, m, tanh.inputs[0])
        if inner is None:
            return False
        x, inner_nodes = inner
        outer = self._outer(g, m, tanh, x)
        if outer is None:
            return False
        last, outer_nodes = outer
        chain = inner_nodes + [tanh] + outer_nodes
        if any(not m.single_use(n.outputs[0]) for n in chain if n is not last):
            return False
        # nodes reading x are allowed; nothing else of the chain may be visible
        _replace(g, last, Node("FastGelu", MS, [x], [last.outputs[0]], {}, name=ctx.fresh("FastGelu")), chain)
        return True

    @staticmethod
    def _cube(g, m, name):
        """(x, nodes) when ``name`` is x**3 written as Pow(x, 3), x*x*x or x*(x*x)."""
        n = m.producer(name)
        if _is(n, "Pow") and _scalar(g, n.inputs[1]) == 3.0:
            return n.inputs[0], [n]
        if _is(n, "Mul"):
            a, b = n.inputs
            for sq_name, x in ((a, b), (b, a)):
                sq = m.producer(sq_name)
                if _is(sq, "Mul") and sq.inputs[0] == sq.inputs[1] == x:
                    return x, [n, sq]
        return None

    def _inner(self, g, m, name):
        """(x, nodes) when ``name`` = sqrt(2/pi) * (x + 0.044715 x^3) (or c1 x + c2 x^3)."""
        c1, c2 = math.sqrt(2 / math.pi), 0.044715
        n = m.producer(name)
        if _is(n, "Mul"):
            for add_name, cname in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
                if not _close(_scalar(g, cname), c1, 1e-4):
                    continue
                add = m.producer(add_name)
                if not _is(add, "Add"):
                    continue
                for x, mul_name in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
                    mul = m.producer(mul_name)
                    if not _is(mul, "Mul"):
                        continue
                    for cube_name, k in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
                        if not _close(_scalar(g, k), c2, 1e-4):
                            continue
                        cube = self._cube(g, m, cube_name)
                        if cube is not None and cube[0] == x:
                            return x, [n, add, mul] + cube[1]
        if _is(n, "Add"):
            # c1*x + (c1*c2)*x^3
            terms = [m.producer(v) for v in n.inputs]
            if not all(_is(t, "Mul") for t in terms):
                return None
            for lin, cub in ((terms[0], terms[1]), (terms[1], terms[0])):
                for x, k in ((lin.inputs[0], lin.inputs[1]), (lin.inputs[1], lin.inputs[0])):
                    if not _close(_scalar(g, k), c1, 1e-4):
                        continue
                    for cube_name, k2 in ((cub.inputs[0], cub.inputs[1]), (cub.inputs[1], cub.inputs[0])):
                        if not _close(_scalar(g, k2), c1 * c2, 1e-3):
                            continue
                        cube = self._cube(g, m, cube_name)
                        if cube is not None and cube[0] == x:
                            return x, [n, lin, cub] + cube[1]
        return None

    @staticmethod
    def _outer(g, m, tanh, x):
        """(last node, nodes) for (1 + tanh) multiplied by x and 0.5 in any Mul order."""
        add1 = _only_reader(m, tanh.outputs[0], "Add")
        if add1 is None or _scalar(g, m.other_input(add1, tanh.outputs[0])) != 1.0:
            return None
        nodes, cur, have_x, half = [add1], add1, False, 1.0
        for _ in range(3):
            if have_x and _close(half, 0.5, 1e-6):
                return cur, nodes
            mul = _only_reader(m, cur.outputs[0], "Mul")
            if mul is None:
                return None
            other = m.other_input(mul, cur.outputs[0])
            if other is None:
                return None
            s = _scalar(g, other)
            p = m.producer(other)
            if other == x and not have_x:
                have_x = True
            elif s is not None:
                half *= s
            elif _is(p, "Mul") and not have_x and x in p.inputs and _scalar(g, m.other_input(p, x)) is not None \
                    and m.single_use(other):
                have_x = True
                half *= _scalar(g, m.other_input(p, x))
                nodes.append(p)
            else:
                return None
            nodes.append(mul)
            cur = mul
        if have_x and _close(half, 0.5, 1e-6):
            return cur, nodes
        return None


# ---------------------------------------------------------------------------------------------------- QuickGelu
class QuickGeluFusion(SweepPass):
    name = "QuickGeluFusion"
    level = 2

    anchors = ("Sigmoid",)

    def rewrite(self, sig, m, g, ctx):
        pre = m.producer(sig.inputs[0])
        x, alpha, chain = sig.inputs[0], 1.0, [sig]
        if _is(pre, "Mul") and m.single_use(pre.outputs[0]):
            for a, b in ((pre.inputs[0], pre.inputs[1]), (pre.inputs[1], pre.inputs[0])):
                s = _scalar(g, b)
                if s is not None and a not in g.initializers:
                    x, alpha, chain = a, s, [pre, sig]
                    break
        mul = _only_reader(m, sig.outputs[0], "Mul")
        if mul is None or m.other_input(mul, sig.outputs[0]) != x or mul.inputs[0] == mul.inputs[1]:
            return False
        _replace(g, mul, Node("QuickGelu", MS, [x], [mul.outputs[0]], {"alpha": float(alpha)},
                              name=ctx.fresh("QuickGelu")), chain)
        return True


# ------------------------------------------------------------------------------------------ SimplifiedLayerNorm
class SimplifiedLayerNormFusion(SweepPass):
    name = "SimplifiedLayerNormFusion"
    level = 2

    anchors = ("ReduceMean",)

    def rewrite(self, rm, m, g, ctx):
        sq = m.producer(rm.inputs[0])
        if _is(sq, "Pow") and _scalar(g, sq.inputs[1]) == 2.0:
            x = sq.inputs[0]
        elif _is(sq, "Mul") and sq.inputs[0] == sq.inputs[1]:
            x = sq.inputs[0]
        else:
            return False
        axes = _reduce_axes(g, rm)
        if axes is None or len(axes) != 1 or rm.attrs.get("keepdims", 1) != 1:
            return False
        if axes[0] != -1:
            dims = declared_dims(ctx, g, x)
            if dims is None or axes[0] != len(dims) - 1:
                return False
        add = _only_reader(m, rm.outputs[0], "Add")
        if add is None:
            return False
        eps = _scalar(g, m.other_input(add, rm.outputs[0]))
        sqrt = _only_reader(m, add.outputs[0], "Sqrt")
        if eps is None or sqrt is None:
            return False
        readers = _readers(m, sqrt.outputs[0])
        if len(readers) != 1 or sqrt.outputs[0] in m.outs:
            return False
        nxt = readers[0]
        if _is(nxt, "Div") and nxt.inputs == [x, sqrt.outputs[0]]:
            normed, chain = nxt, [sq, rm, add, sqrt, nxt]
        elif _is(nxt, "Reciprocal"):
            mul = _only_reader(m, nxt.outputs[0], "Mul")
            if mul is None or m.other_input(mul, nxt.outputs[0]) != x:
                return False
            normed, chain = mul, [sq, rm, add, sqrt, nxt, mul]
        else:
            return False
        scale_mul = _only_reader(m, normed.outputs[0], "Mul")
        if scale_mul is None:
            return False
        scale = m.other_input(scale_mul, normed.outputs[0])
        w = g.initializers.get(scale)
        if w is None or w.ndim != 1:
            return False
        sq_readers = _readers(m, sq.outputs[0])
        if len(sq_readers) != 1 or sq.outputs[0] in m.outs:
            return False
        if any(n.outputs[0] in m.outs for n in chain):
            return False
        node = Node("SimplifiedLayerNormalization", "", [x, scale], [scale_mul.outputs[0]],
                    {"axis": -1, "epsilon": float(eps)}, name=ctx.fresh("SimplifiedLayerNorm"))
        _replace(g, scale_mul, node, chain)
        return True


# --------------------------------------------------------------------------------------------------- FusedGemm
_GEMM_ACTS = {"Relu": (), "Tanh": (), "Sigmoid": (), "Softsign": (), "Softplus": (),
              "LeakyRelu": (("alpha", 0.01),), "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)),
              "Elu": (("alpha", 1.0),), "ThresholdedRelu": (("alpha", 1.0),),
              "Selu": (("alpha", 1.6732632423543772), ("gamma", 1.0507010221481445))}


class GemmActivationFusion(SweepPass):
    name = "GemmActivationFusion"
    level = 2

    anchors = ("Gemm",)

    def begin(self, g, ctx):
        return elem_types(g)

    def rewrite(self, gemm, m, g, ctx):
        if not m.single_use(gemm.outputs[0]):
            return False
        if m.sweep.get(gemm.inputs[0]) != 1 and m.sweep.get(gemm.inputs[1]) != 1:
            return False  # onnxruntime's FusedGemm is float32 only
        act = m.cons[gemm.outputs[0]][0]
        if act.domain not in ("", "ai.onnx") or act.op_type not in _GEMM_ACTS:
            return False
        attrs = dict(gemm.attrs, activation=act.op_type)
        for key, default in _GEMM_ACTS[act.op_type]:
            attrs[f"activation_{key}"] = float(act.attrs.get(key, default))
        fused = Node("FusedGemm", MS, list(gemm.inputs), [act.outputs[0]], attrs, name=ctx.fresh("FusedGemm"))
        _replace(g, act, fused, [gemm])
        return True


# ------------------------------------------------------------------------------------------------- FusedMatMul
def _float_mm(types, n):
    return types.get(n.inputs[0]) in (1, 10, 11) or types.get(n.inputs[1]) in (1, 10, 11)


def _as_fused(n):
    if _is(n, "MatMul"):
        return {"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0}
    if n is not None and n.op_type == "FusedMatMul" and n.domain == MS:
        return {"alpha": float(n.attrs.get("alpha", 1.0)), "transA": int(n.attrs.get("transA", 0)),
                "transB": int(n.attrs.get("transB", 0)), "transBatchA": int(n.attrs.get("transBatchA", 0)),
                "transBatchB": int(n.attrs.get("transBatchB", 0))}
    return None


class MatmulTransposeFusion(SweepPass):
    name = "MatmulTransposeFusion"
    level = 2

    anchors = ("MatMul", "FusedMatMul")

    def begin(self, g, ctx):
        return elem_types(g)

    def wants(self, node):
        return _as_fused(node) is not None

    def rewrite(self, mm, m, g, ctx):
        attrs = _as_fused(mm)
        if attrs["transBatchA"] or attrs["transBatchB"] or not _float_mm(m.sweep, mm):
            return False
        ins, changed = list(mm.inputs), False
        for i, key in ((0, "transA"), (1, "transB")):
            t = m.producer(ins[i])
            if not _is(t, "Transpose") or "perm" not in t.attrs:
                continue
            p = list(t.attrs["perm"])
            r = len(p)
            if r < 2 or p != list(range(r - 2)) + [r - 1, r - 2]:
                continue
            ins[i] = t.inputs[0]
            attrs[key] ^= 1
            changed = True
        if not changed:
            return False
        fused = Node("FusedMatMul", MS, ins, list(mm.outputs), attrs, name=ctx.fresh("FusedMatMul"))
        g.nodes[g.nodes.index(mm)] = fused
        return True


class MatMulScaleFusion(SweepPass):
    name = "MatMulScaleFusion"
    level = 2

    @staticmethod
    def _scale_of(g, n, operand):
        """The scalar ``n`` multiplies ``operand`` by (Mul either order, Div only as numerator), or None.

        float32/float64 only: in float16 the separate Mul rounds its product, and folding it into the MatMul
        changes results by more than float16 tolerance allows (the spec's per-op rounding is the reference).
        """
        if len(n.inputs) != 2:
            return None
        if any(x in g.initializers and g.initializers[x].dtype.itemsize < 4 for x in n.inputs):
            return None
        if _is(n, "Mul"):
            other = n.inputs[1] if n.inputs[0] == operand else n.inputs[0]
            v = g.initializers.get(other)
            if v is not None and v.size == 1 and v.ndim <= 1 and v.dtype.kind == "f":
                return float(v.reshape(-1)[0])
        if _is(n, "Div") and n.inputs[0] == operand:
            v = g.initializers.get(n.inputs[1])
            if v is not None and v.size == 1 and v.ndim <= 1 and v.dtype.kind == "f" and float(v.reshape(-1)[0]):
                return 1.0 / float(v.reshape(-1)[0])
        return None

    anchors = ("MatMul", "FusedMatMul")

    def begin(self, g, ctx):
        return elem_types(g)

    def wants(self, node):
        return _as_fused(node) is not None

    def rewrite(self, mm, m, g, ctx):
        attrs = _as_fused(mm)
        if not _float_mm(m.sweep, mm):
            return False
        ins, alpha, dead, last = list(mm.inputs), attrs["alpha"], [], mm
        for i in (0, 1):
            p = m.producer(ins[i])
            if p is None or not m.single_use(p.outputs[0]) or not (_is(p, "Mul") or _is(p, "Div")):
                continue
            for operand in p.inputs:
                if operand in g.initializers:
                    continue
                s = self._scale_of(g, p, operand)
                if s is not None:
                    ins[i], alpha = operand, alpha * s
                    dead.append(p)
                    break
        if m.single_use(mm.outputs[0]):
            post = m.cons[mm.outputs[0]][0]
            s = self._scale_of(g, post, mm.outputs[0]) if (_is(post, "Mul") or _is(post, "Div")) else None
            if s is not None:
                alpha *= s
                last = post
                dead.append(mm)
        if not dead:
            return False
        attrs["alpha"] = float(alpha)
        fused = Node("FusedMatMul", MS, ins, [last.outputs[0]], attrs, name=ctx.fresh("FusedMatMul"))
        _replace(g, last, fused, dead)
        return True


# --------------------------------------------------------------------------------------------------- Attention
def _const_ints(g, name):
    v = g.initializers.get(name) if name else None
    if v is None or v.dtype.kind not in "iu":
        return None
    return [int(x) for x in v.reshape(-1)]


def _shape_entries(g, m, name):
    """The entries of a 1-D shape tensor: ints where constant, None where computed; None if the length is unknown."""
    c = _const_ints(g, name)
    if c is not None:
        return c
    cat = m.producer(name)
    if not _is(cat, "Concat"):
        return None
    out = []
    for piece in cat.inputs:
        c = _const_ints(g, piece)
        if c is not None:
            out.extend(c)
            continue
        p = m.producer(piece)
        if _is(p, "Unsqueeze"):
            out.append(None)
        elif _is(p, "Shape") and "end" in p.attrs and int(p.attrs["end"]) - int(p.attrs.get("start", 0)) == 1 \
                and int(p.attrs.get("start", 0)) >= 0:
            out.append(None)
        else:
            return None
    return out


def _last_dim(g, m, ctx, name):
    """The size of the last dim of ``name`` when the producing projection or a declaration tells it."""
    dims = declared_dims(ctx, g, name)
    if dims and isinstance(dims[-1], int):
        return dims[-1]
    n = m.producer(name)
    if _is(n, "Add"):
        for a in n.inputs:
            p = m.producer(a)
            if _is(p, "MatMul") and p.inputs[1] in g.initializers and g.initializers[p.inputs[1]].ndim == 2:
                return int(g.initializers[p.inputs[1]].shape[1])
        for a in n.inputs:
            b = g.initializers.get(a)
            if b is not None and b.ndim == 1 and b.size > 1:
                return int(b.size)
    if (_is(n, "MatMul") or n is not None and n.op_type == "MatMulBias" and n.domain == "ai.onnxpy") \
            and n.inputs[1] in g.initializers and g.initializers[n.inputs[1]].ndim == 2:
        return int(g.initializers[n.inputs[1]].shape[1])
    if _is(n, "Split"):
        axis = int(n.attrs.get("axis", 0))
        parent = n.inputs[0]
        k = len(n.outputs)
        split = _const_ints(g, n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else n.attrs.get("split")
        pdims = declared_dims(ctx, g, parent)
        if axis != -1 and (pdims is None or axis != len(pdims) - 1):
            # a Reshape that keeps the last dim of a projection: [.., 3H]
            r = m.producer(parent)
            ent = _shape_entries(g, m, r.inputs[1]) if _is(r, "Reshape") else None
            if ent is None or axis != len(ent) - 1:
                return None
        total = _last_dim(g, m, ctx, parent)
        if split:
            return int(split[n.outputs.index(name)])
        if total is not None and total % k == 0:
            return total // k
        return None
    if _is(n, "Reshape"):
        ent = _shape_entries(g, m, n.inputs[1])
        if ent and ent[-1] is not None and ent[-1] > 0:
            return ent[-1]
    if _is(n, "Gemm") and n.inputs[1] in g.initializers:
        w = g.initializers[n.inputs[1]]
        return int(w.shape[0] if n.attrs.get("transB", 0) else w.shape[1])
    return None


class AttentionFusion(SweepPass):
    """Self-attention as torch exports it, for BERT-like (padding mask) and GPT-2-like (causal mask) models.

    scores = MatMul(Transpose(Reshape(q, [.., .., N, D]), [0,2,1,3]), Transpose(Reshape(k, ..), [0,2,3,1]))
    probs = Softmax(Add(Mul(scores, scale) | Div(scores, 1/scale) | scores, mask), -1)
    out = Reshape(Transpose(MatMul(probs, Transpose(Reshape(v, ..), [0,2,1,3])), [0,2,1,3]), [.., .., H])
    -> MultiHeadAttention(Reshape(q4, [0,0,-1]), Reshape(k4, [0,0,-1]), Reshape(v4, [0,0,-1]),
       attention_bias=mask, num_heads=N, scale) feeding the final Reshape.  The mask must provably have the full
    (.., .., S, T) trailing dims (declared, or built by Expand to a 4-entry shape).
    """

    name = "AttentionFusion"
    level = 2

    anchors = ("Softmax",)

    def begin(self, g, ctx):
        return elem_types(g)

    def rewrite(self, sm, m, g, ctx):
        res = self._match(g, m, ctx, sm, m.sweep)
        if res is None:
            return False
        q4, k4, v4, mask, n_heads, scale, out_t, dead = res
        shp = ctx.fresh("attn_bsh_shape")
        g.initializers[shp] = np.array([0, 0, -1], np.int64)
        names = []
        new_nodes = []
        for t4, tag in ((q4, "q"), (k4, "k"), (v4, "v")):
            nm = ctx.fresh(f"{t4}_{tag}_bsh")
            new_nodes.append(Node("Reshape", "", [t4, shp], [nm], {}, name=ctx.fresh("AttnReshape")))
            names.append(nm)
        out = ctx.fresh(out_t.outputs[0] + "_mha")
        mha = Node("MultiHeadAttention", MS, names + ["", "", mask], [out],
                   {"num_heads": int(n_heads), "scale": float(scale)}, name=ctx.fresh("MultiHeadAttention"))
        for r in m.cons[out_t.outputs[0]]:  # the final Reshape and batch/sequence Shape readers
            r.inputs = [out] + r.inputs[1:]
        idx = g.nodes.index(out_t)
        g.nodes[idx:idx + 1] = new_nodes + [mha]
        for n in dead:
            if n in g.nodes:
                g.nodes.remove(n)
            for o in n.outputs:
                g.value_info.pop(o, None)
        return True

    @staticmethod
    def _heads(g, m, t_name, perm):
        """(bsnd name, [N or None, D]) when ``t_name`` = Transpose(Reshape(x, [., ., N, D]), perm)."""
        t = m.producer(t_name)
        if not _is(t, "Transpose") or list(t.attrs.get("perm", [])) != perm:
            return None
        r = m.producer(t.inputs[0])
        if not _is(r, "Reshape"):
            return None
        ent = _shape_entries(g, m, r.inputs[1])
        if ent is None or len(ent) != 4 or ent[3] is None or ent[3] <= 0:
            return None
        if any(e == 0 for e in ent[2:]) and not r.attrs.get("allowzero", 0):
            return None
        n = ent[2] if ent[2] is not None and ent[2] > 0 else None
        if ent[2] is not None and ent[2] <= 0 and ent[2] != -1:
            return None
        return t.inputs[0], n, ent[3], r, t

    def _match(self, g, m, ctx, sm, types):
        axis = int(sm.attrs.get("axis", -1))
        if axis not in (-1, 3):
            return None
        pv = _only_reader(m, sm.outputs[0], "MatMul")
        if pv is None or pv.inputs[0] != sm.outputs[0]:
            return None
        out_t = _only_reader(m, pv.outputs[0], "Transpose")
        if out_t is None or list(out_t.attrs.get("perm", [])) != [0, 2, 1, 3] or out_t.outputs[0] in m.outs:
            return None
        # readers: the final Reshape, and Shape nodes whose values are only used for dims 0/1 (batch, sequence),
        # which the fused [B, S, N*D] output shares (torchscript computes the final shape that way)
        readers = _readers(m, out_t.outputs[0])
        finals = [r for r in readers if _is(r, "Reshape") and r.inputs[0] == out_t.outputs[0]]
        if len(finals) != 1 or any(r is not finals[0] and not self._batch_seq_shape(g, m, r) for r in readers):
            return None
        final = finals[0]
        fent = _shape_entries(g, m, final.inputs[1])
        if fent is None or len(fent) not in (2, 3) or fent[-1] == 0 or \
                (len(fent) == 2 and fent[0] == 0 and not final.attrs.get("allowzero", 0)):
            return None
        vh = self._heads(g, m, pv.inputs[1], [0, 2, 1, 3])
        if vh is None:
            return None
        # scores + mask
        add = m.producer(sm.inputs[0])
        if not _is(add, "Add") or not m.single_use(add.outputs[0]):
            return None
        scaled, mask = None, None
        for a, b in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            p = m.producer(a)
            if p is not None and (_is(p, "Mul") or _is(p, "Div") or _is(p, "MatMul")) and m.single_use(a):
                scaled, mask = p, b
                break
        if scaled is None or mask in g.initializers and g.initializers[mask].ndim != 4:
            return None
        dead = [add, sm, pv, out_t]
        if _is(scaled, "MatMul"):
            scores, scale = scaled, 1.0
        else:
            scores = None
            for a in scaled.inputs:
                p = m.producer(a)
                if _is(p, "MatMul") and m.single_use(a):
                    s = self._scale_of(g, scaled, a)
                    if s is not None:
                        scores, scale = p, s
                        break
            if scores is None:
                return None
            dead.append(scaled)
        dead.append(scores)
        qh = self._heads(g, m, scores.inputs[0], [0, 2, 1, 3])
        kh = self._heads(g, m, scores.inputs[1], [0, 2, 3, 1])
        if qh is None or kh is None:
            return None
        if types.get(qh[0]) not in (None, 1, 10):
            return None
        # number of heads: a constant N in a reshape, else hidden / D
        n_heads = next((h[1] for h in (qh, kh, vh) if h[1] is not None), None)
        if n_heads is None:
            hidden = _last_dim(g, m, ctx, qh[3].inputs[0])
            if hidden is None or hidden % qh[2]:
                return None
            n_heads = hidden // qh[2]
        for h in (qh, kh, vh):
            if h[1] is not None and h[1] != n_heads:
                return None
            if h[1] is None:
                hidden = _last_dim(g, m, ctx, h[3].inputs[0])
                if hidden is not None and hidden != n_heads * h[2]:
                    return None
        if qh[2] != kh[2]:
            return None
        if not self._full_mask(g, m, ctx, mask):
            return None
        for h in (qh, kh, vh):
            if m.single_use(h[4].outputs[0]):
                dead.append(h[4])
        return qh[0], kh[0], vh[0], mask, n_heads, scale, out_t, dead

    @staticmethod
    def _scale_of(g, n, operand):
        """The scalar ``n`` multiplies the scores ``operand`` by, or None.

        Unlike MatMulScaleFusion, a float16 constant is accepted here: the fused kernel computes the whole
        attention in float32 and rounds once, which is at least as accurate as the per-op float16 chain it replaces.
        """
        if len(n.inputs) != 2:
            return None
        if _is(n, "Mul"):
            other = n.inputs[1] if n.inputs[0] == operand else n.inputs[0]
            v = g.initializers.get(other)
            if v is not None and v.size == 1 and v.ndim <= 1 and v.dtype.kind == "f":
                s = float(v.reshape(-1)[0])
                return s if math.isfinite(s) else None
        if _is(n, "Div") and n.inputs[0] == operand:
            v = g.initializers.get(n.inputs[1])
            if v is not None and v.size == 1 and v.ndim <= 1 and v.dtype.kind == "f":
                d = float(v.reshape(-1)[0])
                return 1.0 / d if d and math.isfinite(d) else None
        return None

    @staticmethod
    def _batch_seq_shape(g, m, n):
        if not _is(n, "Shape") or int(n.attrs.get("start", 0)) != 0 or n.outputs[0] in m.outs:
            return False
        for gat in _readers(m, n.outputs[0]):
            idx = g.initializers.get(gat.inputs[1]) if _is(gat, "Gather") and len(gat.inputs) > 1 else None
            if idx is None or gat.inputs[0] != n.outputs[0] or int(gat.attrs.get("axis", 0)) != 0 \
                    or idx.dtype.kind not in "iu" or not np.all((idx == 0) | (idx == 1)):
                return False
        return True

    @staticmethod
    def _full_mask(g, m, ctx, mask):
        """True when the additive mask provably has the full (S, T) trailing dims (rank 4)."""
        dims = declared_dims(ctx, g, mask)
        if dims is not None:
            return len(dims) == 4 and dims[2] != 1 and dims[3] != 1
        cur = mask
        for _ in range(6):
            n = m.producer(cur)
            if n is None:
                return False
            if _is(n, "Where"):
                # the value branches that are not constants carry the shape; the condition broadcasts too
                runtime = [x for x in n.inputs if x not in g.initializers]
                if len(runtime) != 1:
                    return False
                cur = runtime[0]
            elif _is(n, "Cast") or _is(n, "Not"):
                cur = n.inputs[0]
            elif _is(n, "Expand"):
                ent = _shape_entries(g, m, n.inputs[1])
                if ent is None:
                    w = m.producer(n.inputs[1])  # Where(Equal(s, -1), 1, s) over s = Reshape(Concat(...), [-1])
                    if _is(w, "Where"):
                        r = m.producer(w.inputs[2])
                        if _is(r, "Reshape"):
                            ent = _shape_entries(g, m, r.inputs[0])
                if ent is None or len(ent) != 4:
                    return False
                return all(e is None or e > 1 for e in ent[2:])
            else:
                return False
        return False


TRANSFORMER_PASSES: list = [
    AttentionFusion(), FastGeluFusion(), QuickGeluFusion(), SimplifiedLayerNormFusion(), GemmActivationFusion(),
    MatmulTransposeFusion(), MatMulScaleFusion(),
]

__all__ = ["TRANSFORMER_PASSES"]
