"""ORT_ENABLE_ALL (level 99) fusions that write onnxpy's internal ops (domain ``ai.onnxpy``).

Like onnxruntime's level-99 layout rewrites, a model saved after these passes only loads in onnxpy, so they
never run at levels 1 and 2.

* HardSwishFusion: Add(x, 3) -> Clip(0, 6) -> Mul(x, .) -> Div(., 6) (either order of the Mul and the Div/Mul by a
  constant) -> ai.onnxpy.HardSwishLike, and Mul(x, HardSigmoid(x)) -> ai.onnxpy.HardSigmoidMul
* PreActivationConvFold: BatchNormalization (constant parameters, every scale >= 0) -> Relu -> 1x1 Conv/FusedConv
  without padding (pre-activation networks such as DenseNet) -> Max(x, -shift/scale) -> Conv with the scale folded
  into the weights and the shift into the bias: one pass over the activations instead of three (standard ops)
* SiblingPointwiseConvFusion: 1x1 Conv/FusedConv nodes reading the same tensor (Inception's 1x1 branches) -> one
  convolution with the filters stacked, then a Split into the original outputs (the input is packed for BLAS once)
* PoolProjectionSwap: AveragePool -> 1x1 Conv with fewer output channels (Inception's pool projection) -> Conv ->
  AveragePool -> Add(bias) [-> Relu]: both are linear, so they commute, and the pooling then reads fewer channels
* ConvConcatFusion: Concat on the channel axis of 2-D Conv/FusedConv outputs (constant filters, one shared
  activation, each output read only by the Concat: SqueezeNet's fire modules) -> ai.onnxpy.ConvConcat, whose
  convolutions write their channel ranges of one output (no concatenation copy)
* SiblingMatMulBiasFusion: ai.onnxpy.MatMulBias nodes reading the same activations with constant float32 weights
  (a transformer's query, key and value projections) -> one MatMulBias with the weights side by side, then a Split
  of the last axis into the original outputs (views): one GEMM with three times the columns
* ConvBatchNormFusion (not in ALL_PASSES, see below): Conv -> BatchNormalization (test mode, parameters not
  constant) [-> Relu] -> ai.onnxpy.ConvBatchNorm
"""

from __future__ import annotations

import numpy as np

from ..ir.model import Node
from ..ops._common import text
from .fusions import MS, AnchoredFusion, SweepPass, _is

DOMAIN = "ai.onnxpy"


def _const(g, name):
    """(value, ndim) of a 1-element float initializer, else None."""
    v = g.initializers.get(name) if name else None
    if v is None or v.size != 1 or v.dtype.kind != "f":
        return None
    return float(v.reshape(-1)[0]), v.ndim, v.dtype


def _only_reader(m, node):
    out = node.outputs[0]
    if not m.single_use(out):
        return None
    return m.cons[out][0]


class HardSwishFusion(AnchoredFusion):
    name = "HardSwishFusionAll"
    level = 99
    anchor = "Clip"

    def match(self, clip, m, g, ctx):
        if len(clip.outputs) != 1:
            return None
        add = m.producer(clip.inputs[0])
        if not _is(add, "Add") or not m.single_use(add.outputs[0]):
            return None
        consts = []
        x = None
        for i, j in ((0, 1), (1, 0)):
            c = _const(g, add.inputs[j])
            if c is not None and add.inputs[i] not in g.initializers:
                x, addc = add.inputs[i], c
                break
        if x is None:
            return None
        consts.append(addc)
        bounds = []
        for k, attr in ((1, "min"), (2, "max")):
            if len(clip.inputs) > k and clip.inputs[k]:
                c = _const(g, clip.inputs[k])
                if c is None:
                    return None
                consts.append(c)
                bounds.append(c[0])
            elif len(clip.inputs) == 1 and attr in clip.attrs:
                bounds.append(float(clip.attrs[attr]))
            elif len(clip.inputs) > 1:
                bounds.append(None)
            else:  # Clip-6 defaults are +-FLT_MAX, Clip-11 has none: not worth telling apart here
                return None
        r1 = _only_reader(m, clip)
        if r1 is None or not (_is(r1, "Mul") or _is(r1, "Div")):
            return None
        scale_first = 0
        if _is(r1, "Mul") and m.other_input(r1, clip.outputs[0]) == x and r1.inputs[0] != r1.inputs[1]:
            mul = r1
            last = _only_reader(m, mul)
            sc = self._scale(g, last, mul.outputs[0])
        else:  # clip / 6 (or * 1/6) first, then * x
            sc = self._scale(g, r1, clip.outputs[0])
            last = _only_reader(m, r1) if sc is not None else None
            if last is None or not _is(last, "Mul") or m.other_input(last, r1.outputs[0]) != x \
                    or last.inputs[0] == last.inputs[1]:
                return None
            scale_first, mul = 1, last
        if sc is None:
            return None
        scale, scale_op, c = sc
        consts.append(c)
        if len({c[2] for c in consts}) != 1:
            return None
        attrs = {"add": addc[0], "scale": scale, "scale_op": scale_op, "scale_first": scale_first,
                 "rank": max(c[1] for c in consts)}
        if bounds[0] is not None:
            attrs["lo"] = bounds[0]
        if bounds[1] is not None:
            attrs["hi"] = bounds[1]
        chain = [add, clip, r1] + ([last] if last is not r1 else [])
        new = Node("HardSwishLike", DOMAIN, [x], [last.outputs[0]], attrs, name=ctx.fresh("HardSwishLike"))
        return new, chain

    @staticmethod
    def _scale(g, node, name):
        """(value, op, const) when ``node`` is Div(name, c) or Mul(name, c) / Mul(c, name) with a scalar c."""
        if node is None or len(node.inputs) != 2:
            return None
        if _is(node, "Div") and node.inputs[0] == name:
            c = _const(g, node.inputs[1])
            return None if c is None else (c[0], "Div", c)
        if _is(node, "Mul"):
            other = node.inputs[1] if node.inputs[0] == name else node.inputs[0]
            c = _const(g, other) if other != name else None
            return None if c is None else (c[0], "Mul", c)
        return None


class HardSigmoidMulFusion(AnchoredFusion):
    name = "HardSigmoidMulFusionAll"
    level = 99
    anchor = "HardSigmoid"

    def match(self, hs, m, g, ctx):
        x = hs.inputs[0]
        mul = _only_reader(m, hs)
        if mul is None or not _is(mul, "Mul") or m.other_input(mul, hs.outputs[0]) != x or x in g.initializers:
            return None
        attrs = {"alpha": float(hs.attrs.get("alpha", 0.2)), "beta": float(hs.attrs.get("beta", 0.5))}
        return Node("HardSigmoidMul", DOMAIN, [x], [mul.outputs[0]], attrs, name=ctx.fresh("HardSigmoidMul")), \
            [hs, mul]


_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


class ConvBatchNormFusion(AnchoredFusion):
    name = "ConvBatchNormFusionAll"
    level = 99
    anchor = "BatchNormalization"

    def match(self, bn, m, g, ctx):
        if len([o for o in bn.outputs if o]) != 1 or len(bn.outputs) != 1 or len(bn.inputs) != 5:
            return None
        if bn.attrs.get("training_mode", 0) or bn.attrs.get("spatial", 1) != 1:
            return None
        if set(bn.attrs) - {"epsilon", "momentum", "training_mode", "spatial", "is_test", "consumed_inputs"}:
            return None
        conv = m.producer(bn.inputs[0])
        if not _is(conv, "Conv") or len(conv.outputs) != 1 or not m.single_use(conv.outputs[0]):
            return None
        if set(conv.attrs) - set(_CONV_ATTRS) or not all(bn.inputs[1:]) or len(conv.inputs) < 2:
            return None
        b = conv.inputs[2] if len(conv.inputs) > 2 else ""
        attrs = {k: conv.attrs[k] for k in _CONV_ATTRS if k in conv.attrs}
        attrs["epsilon"] = float(bn.attrs.get("epsilon", 1e-5))
        matched, out = [conv, bn], bn.outputs[0]
        relu = _only_reader(m, bn)
        if relu is not None and _is(relu, "Relu") and len(relu.outputs) == 1:
            attrs["activation"] = "Relu"
            matched.append(relu)
            out = relu.outputs[0]
        new = Node("ConvBatchNorm", DOMAIN, [conv.inputs[0], conv.inputs[1], b] + list(bn.inputs[1:]), [out], attrs,
                   name=ctx.fresh("ConvBatchNorm"))
        return new, matched


class PreActivationConvFold(SweepPass):
    """relu(s*x + t) = s*max(x, -t/s) + t for s > 0 (and the constant relu(t) where s = 0), so a 1x1 convolution
    W of it is (W diag(s)) max(x, -t/s) + W t'.  Exact up to rounding; padding would break it (padded zeros are
    not max(x, -t/s)), so only unpadded 1x1 convolutions of one group qualify."""

    name = "PreActivationConvFoldAll"
    level = 99
    anchors = ("BatchNormalization",)

    def rewrite(self, bn, m, g, ctx):
        if len(bn.inputs) != 5 or len(bn.outputs) != 1 or bn.attrs.get("training_mode", 0):
            return False
        if bn.attrs.get("spatial", 1) != 1 or not m.single_use(bn.outputs[0]):
            return False
        relu = m.cons[bn.outputs[0]][0]
        if not _is(relu, "Relu") or len(relu.outputs) != 1 or not m.single_use(relu.outputs[0]):
            return False
        conv = m.cons[relu.outputs[0]][0]
        if not (_is(conv, "Conv") or (conv.op_type == "FusedConv" and conv.domain == MS)):
            return False
        if len(conv.inputs) not in (2, 3) or conv.inputs[0] != relu.outputs[0] or conv.inputs[1] == conv.inputs[0]:
            return False
        params = [g.initializers.get(x) for x in bn.inputs[1:]]
        w = g.initializers.get(conv.inputs[1])
        b = g.initializers.get(conv.inputs[2]) if len(conv.inputs) == 3 and conv.inputs[2] else None
        if w is None or any(p is None for p in params) or (len(conv.inputs) == 3 and conv.inputs[2] and b is None):
            return False
        if w.dtype.kind != "f" or w.ndim < 3 or any(d != 1 for d in w.shape[2:]):
            return False
        if int(conv.attrs.get("group", 1)) != 1 or any(int(p) for p in conv.attrs.get("pads", ())):
            return False
        if conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", b"NOTSET", b"VALID"):
            return False
        C = w.shape[1]
        if any(p.dtype != w.dtype or p.shape != (C,) for p in params) or (b is not None and b.shape != (w.shape[0],)):
            return False
        gamma, beta, mean, var = (p.astype(np.float64) for p in params)
        eps = float(bn.attrs.get("epsilon", 1e-5))
        with np.errstate(all="ignore"):
            s = gamma / np.sqrt(var + eps)
            t = beta - mean * s
        if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t)) and np.all(s >= 0)):
            return False
        pos = s > 0
        with np.errstate(all="ignore"):
            neg_c = np.where(pos, -t / np.where(pos, s, 1.0), 0.0)
        if not np.all(np.isfinite(neg_c)):
            return False
        w64 = w.astype(np.float64).reshape(w.shape[0], C)
        const = np.where(pos, t, np.maximum(t, 0.0))  # the per-channel value the shift (or relu(t)) contributes
        b2 = w64 @ const + (b.astype(np.float64) if b is not None else 0.0)
        w2 = (w64 * s).reshape(w.shape)
        spatial = (1,) * (w.ndim - 2)
        names = [ctx.fresh(bn.inputs[0] + "_preact_floor"), ctx.fresh(conv.inputs[1] + "_preact"),
                 ctx.fresh(conv.outputs[0] + "_preact_bias")]
        g.initializers[names[0]] = neg_c.astype(w.dtype).reshape((C,) + spatial)
        g.initializers[names[1]] = w2.astype(w.dtype)
        g.initializers[names[2]] = b2.astype(w.dtype)
        floor = Node("Max", "", [bn.inputs[0], names[0]], [relu.outputs[0]], {}, ctx.fresh("PreActivationMax"))
        g.nodes[g.nodes.index(bn)] = floor
        g.nodes.remove(relu)
        conv.inputs = [conv.inputs[0], names[1], names[2]]
        return True


def _const_conv(n, g):
    """(filter, bias or None, activation, activation params) of a Conv/FusedConv with a constant float filter of rank
    >= 3 (and a constant bias of its dtype and size), no Z input, one output and only convolution attributes (and
    FusedConv's activation); else None."""
    fused = n.op_type == "FusedConv" and n.domain == MS
    if not (fused or _is(n, "Conv")) or len(n.inputs) not in (2, 3) or len(n.outputs) != 1 or not n.outputs[0]:
        return None
    w = g.initializers.get(n.inputs[1])
    b = n.inputs[2] if len(n.inputs) == 3 else ""
    bv = g.initializers.get(b) if b else None
    if not isinstance(w, np.ndarray) or w.ndim < 3 or w.dtype.kind != "f" or (b and bv is None):
        return None
    if bv is not None and (bv.dtype != w.dtype or bv.shape != (w.shape[0],)):
        return None
    if set(n.attrs) - set(_CONV_ATTRS) - ({"activation", "activation_params"} if fused else set()):
        return None
    act = text(n.attrs.get("activation", ""))
    return w, bv, act, tuple(float(v) for v in n.attrs.get("activation_params", ()))


def _auto_pad(a) -> str:
    return text(a.get("auto_pad", "NOTSET"))


def _pointwise_conv(n, g):
    """(filter, bias or None, activation, activation params, strides) of a pointwise convolution: Conv/FusedConv
    with a constant (M, C, 1, 1) float filter (and bias), one group, no padding, no Z input, one output; else None."""
    c = _const_conv(n, g)
    if c is None or c[0].ndim != 4 or c[0].shape[2:] != (1, 1):
        return None
    a = n.attrs
    if int(a.get("group", 1)) != 1 or any(int(p) for p in a.get("pads", ())) or list(a.get("kernel_shape",
                                                                                         [1, 1])) != [1, 1]:
        return None
    if _auto_pad(a) not in ("NOTSET", "VALID"):
        return None
    return c + (tuple(int(v) for v in a.get("strides", (1, 1))),)


def _pointwise_key(n, g, x):
    """The merge key of a pointwise convolution (``_pointwise_conv``) reading ``x``: op, activation, strides,
    filter dtype and input channels; None when ``n`` is not one."""
    if not n.inputs or n.inputs[0] != x or x in n.inputs[1:]:
        return None
    pc = _pointwise_conv(n, g)
    if pc is None:
        return None
    w, _, act, params, strides = pc
    return n.op_type, n.domain, act, params, strides, w.dtype.str, w.shape[1]


_VIEW_SAFE_READERS = frozenset({"Conv", "FusedConv", "Concat", "MaxPool", "AveragePool", "GlobalAveragePool",
                                 "GlobalMaxPool"})


def _replace_by_split(g, ctx, group, merged, sizes, axis, split_name, node_name):
    """Replace the sibling nodes ``group`` by ``merged`` (one output) followed by a Split on ``axis`` into the
    group's outputs (the sizes as an input from opset 13, as the attribute before), placed where the first member
    stood."""
    outs = [n.outputs[0] for n in group]
    opset = ctx.model.opsets.get("", ctx.model.opsets.get("ai.onnx", 1))
    if opset >= 13:
        sname = ctx.fresh(split_name)
        g.initializers[sname] = np.array(sizes, dtype=np.int64)
        split = Node("Split", "", [merged.outputs[0], sname], outs, {"axis": axis}, name=ctx.fresh(node_name))
    else:
        split = Node("Split", "", [merged.outputs[0]], outs, {"axis": axis, "split": sizes},
                     name=ctx.fresh(node_name))
    ids = {id(n) for n in group}
    at = min(i for i, n in enumerate(g.nodes) if id(n) in ids)
    rest = [n for n in g.nodes if id(n) not in ids]
    g.nodes[:] = rest[:at] + [merged, split] + rest[at:]


class SiblingPointwiseConvFusion(SweepPass):
    """Pointwise (1x1) convolutions reading the same tensor with the same strides and activation (the 1x1 branches
    of an Inception module) -> one convolution with their filters stacked along the output channels, then a Split
    (on the channel axis: views, no copy) into the original outputs.

    BLAS packs the wide operand (the C x H*W input) again on every call, which with 16-96 output channels per
    convolution is a large share of the work; merged, the input is packed once and the GEMM has more rows.  Exact:
    every output channel is the same dot product as before."""

    name = "SiblingPointwiseConvFusionAll"
    level = 99

    def wants(self, node) -> bool:
        return (node.op_type == "Conv" and node.domain in ("", "ai.onnx")) or (
            node.op_type == "FusedConv" and node.domain == MS)

    @staticmethod
    def _view_safe(n, m) -> bool:
        """The output is read only by kernels that never take over their input's buffer (convolutions, pools,
        Concat): the Split's outputs are views, which an element-wise consumer could not overwrite in place, so
        it would allocate where it now reuses the convolution's output."""
        out = n.outputs[0]
        if out in m.outs:
            return False
        return all(c.op_type in _VIEW_SAFE_READERS for c in m.cons.get(out, []))

    def rewrite(self, first, m, g, ctx):
        if not first.inputs:
            return False
        x = first.inputs[0]
        key = _pointwise_key(first, g, x)
        if key is None:
            return False
        group = [n for n in m.cons.get(x, []) if _pointwise_key(n, g, x) == key and self._view_safe(n, m)]
        if len(group) < 2 or group[0] is not first:
            return False  # (the group is rewritten when its first member in the consumer list comes up)
        ws = [g.initializers[n.inputs[1]] for n in group]
        sizes = [w.shape[0] for w in ws]
        has_b = any(len(n.inputs) == 3 and n.inputs[2] for n in group)
        names = [ctx.fresh(x + "_pointwise_w")]
        g.initializers[names[0]] = np.concatenate(ws, axis=0)
        if has_b:
            names.append(ctx.fresh(x + "_pointwise_b"))
            g.initializers[names[1]] = np.concatenate([
                g.initializers[n.inputs[2]] if len(n.inputs) == 3 and n.inputs[2] else np.zeros(k, ws[0].dtype)
                for n, k in zip(group, sizes)])
        merged_out = ctx.fresh(x + "_pointwise")
        merged = Node(first.op_type, first.domain, [x] + names, [merged_out], dict(first.attrs),
                      name=ctx.fresh("SiblingPointwiseConv"))
        _replace_by_split(g, ctx, group, merged, sizes, 1, x + "_pointwise_split", "SiblingPointwiseSplit")
        return True


class PoolProjectionSwap(SweepPass):
    """AveragePool -> unpadded stride-1 1x1 Conv/FusedConv (no activation or Relu) with fewer output than input
    channels (Inception's pool-projection branch) -> Conv (no bias) -> AveragePool -> Add(bias) [-> Relu].

    Average pooling and a 1x1 convolution are both linear and act on different axes (the pooling's divisor depends
    on the position only), so they commute: W avgpool(x) + b = avgpool(W x) + b.  Pooled after the projection, the
    pooling reads M channels instead of C (Inception v2: 32-128 instead of 192-576), and numpy's pooling is the slow
    part.  Same values up to rounding (the sums are taken in another order)."""

    name = "PoolProjectionSwapAll"
    level = 99
    anchors = ("AveragePool",)

    def rewrite(self, pool, m, g, ctx):
        if len(pool.inputs) != 1 or len(pool.outputs) != 1 or not m.single_use(pool.outputs[0]):
            return False
        conv = m.cons[pool.outputs[0]][0]
        if conv.inputs[0] != pool.outputs[0] or pool.outputs[0] in conv.inputs[1:]:
            return False
        pc = _pointwise_conv(conv, g)
        if pc is None:
            return False
        w, b, act, _, strides = pc
        if w.shape[0] >= w.shape[1] or act not in ("", "Relu") or any(v != 1 for v in strides):
            return False
        out = conv.outputs[0]
        projected, pooled = ctx.fresh(out + "_projected"), ctx.fresh(out + "_pooled")
        new_conv = Node("Conv", "", [pool.inputs[0], conv.inputs[1]], [projected], {"kernel_shape": [1, 1]},
                        name=ctx.fresh("PoolProjectionConv"))
        new_pool = Node("AveragePool", pool.domain, [projected], [pooled], dict(pool.attrs),
                        name=ctx.fresh("PoolProjectionPool"))
        tail = []
        last = pooled
        if b is not None:
            bias = ctx.fresh(conv.inputs[2] + "_pooled_bias")
            g.initializers[bias] = b.reshape(1, -1, 1, 1)
            nxt = out if act == "" else ctx.fresh(out + "_biased")
            tail.append(Node("Add", "", [last, bias], [nxt], {}, name=ctx.fresh("PoolProjectionBias")))
            last = nxt
        if act == "Relu":
            tail.append(Node("Relu", "", [last], [out], {}, name=ctx.fresh("PoolProjectionRelu")))
        elif b is None:  # (no bias, no activation: the pooling writes the output itself)
            new_pool.outputs = [out]
        i = g.nodes.index(pool)
        g.nodes[i:i + 1] = [new_conv, new_pool]
        j = g.nodes.index(conv)
        g.nodes[j:j + 1] = tail
        return True


def _concat_member(n, g):
    """(x, W, B or '', activation, params, pads, strides, dilations, group) of a ConvConcat member: a 2-D Conv or
    FusedConv with a constant 4-D float filter (and bias), explicit or VALID padding, no Z input; else None."""
    c = _const_conv(n, g)
    if c is None or c[0].ndim != 4 or n.inputs[0] in n.inputs[1:]:
        return None
    w, _, act, params = c
    a = n.attrs
    ap = _auto_pad(a)
    pads = [int(v) for v in a.get("pads", (0, 0, 0, 0))] if ap == "NOTSET" else [0, 0, 0, 0]
    strides = [int(v) for v in a.get("strides", (1, 1))]
    dil = [int(v) for v in a.get("dilations", (1, 1))]
    if (ap not in ("NOTSET", "VALID") or len(pads) != 4 or len(strides) != 2 or len(dil) != 2 or min(pads) < 0
            or "kernel_shape" in a and list(a["kernel_shape"]) != list(w.shape[2:])):
        return None
    b = n.inputs[2] if len(n.inputs) == 3 else ""
    return n.inputs[0], n.inputs[1], b, act, params, pads, strides, dil, int(a.get("group", 1))


class ConvConcatFusion(SweepPass):
    """Concat(axis=1) whose every input is a 2-D Conv/FusedConv output read by nothing else, with constant filters
    of one dtype and the same activation (SqueezeNet's fire modules: the 1x1 and 3x3 expand convolutions) ->
    ai.onnxpy.ConvConcat.  Its kernel allocates the concatenation once and each convolution writes its channel
    range (the GEMM paths directly), then the activation runs once: the Concat's copy of every member's output and
    the members' own allocations are gone.  Exact (the same convolutions); placed at the Concat, where every
    member's input exists."""

    name = "ConvConcatFusionAll"
    level = 99
    anchors = ("Concat",)

    def rewrite(self, cat, m, g, ctx):
        ins = cat.inputs
        if len(ins) < 2 or len(set(ins)) != len(ins) or len(cat.outputs) != 1 or int(cat.attrs.get("axis", 0)) \
                not in (1, -3):
            return False
        members, nodes = [], []
        for x in ins:
            p = m.producer(x)
            if p is None or not m.single_use(x):
                return False
            mem = _concat_member(p, g)
            if mem is None:
                return False
            members.append(mem)
            nodes.append(p)
        if len({(mm[3], mm[4]) for mm in members}) != 1 or len({g.initializers[mm[1]].dtype for mm in members}) != 1:
            return False
        act, params = members[0][3], members[0][4]
        attrs = {"pads": [v for mm in members for v in mm[5]], "strides": [v for mm in members for v in mm[6]],
                 "dilations": [v for mm in members for v in mm[7]], "groups": [mm[8] for mm in members]}
        if act:
            attrs["activation"] = act
        if params:
            attrs["activation_params"] = list(params)
        fused = Node("ConvConcat", DOMAIN, [v for mm in members for v in mm[:3]], [cat.outputs[0]], attrs,
                     name=ctx.fresh("ConvConcat"))
        ids = {id(n) for n in nodes}
        at = g.nodes.index(cat)
        g.nodes[at] = fused
        g.nodes[:] = [n for n in g.nodes if id(n) not in ids]
        return True


def _matmul_bias_key(n, g, x):
    """(weight rows, dtype) of an ai.onnxpy.MatMulBias reading ``x`` with a constant 2-D float32 weight and 1-D
    bias (and x nowhere else), else None."""
    if n.op_type != "MatMulBias" or n.domain != DOMAIN or len(n.inputs) != 3 or len(n.outputs) != 1 \
            or n.inputs[0] != x or x in n.inputs[1:]:
        return None
    w, b = g.initializers.get(n.inputs[1]), g.initializers.get(n.inputs[2])
    if not isinstance(w, np.ndarray) or not isinstance(b, np.ndarray) or w.dtype != np.float32 or w.ndim != 2 \
            or b.dtype != np.float32 or b.shape != (w.shape[1],):
        return None
    return w.shape[0]


class SiblingMatMulBiasFusion(SweepPass):
    """ai.onnxpy.MatMulBias nodes reading the same activations with constant float32 weights of the same depth (a
    transformer's query / key / value projections, 3 x [768 x 768] in BERT-base) -> one MatMulBias with the
    weights side by side ([768 x 2304]) and the biases concatenated, then a Split of the last axis into the
    original outputs (views, no copy).  OpenBLAS multiplies the wide weight ~10-20% faster than three narrow ones
    (the activations are packed once).  Exact: every output is the same dot product."""

    name = "SiblingMatMulBiasFusionAll"
    level = 99

    def wants(self, node) -> bool:
        return node.op_type == "MatMulBias" and node.domain == DOMAIN

    def rewrite(self, first, m, g, ctx):
        x = first.inputs[0] if first.inputs else ""
        k = _matmul_bias_key(first, g, x) if x else None
        if k is None:
            return False
        group = [n for n in m.cons.get(x, []) if _matmul_bias_key(n, g, x) == k and n.outputs[0] not in m.outs]
        if len(group) < 2 or group[0] is not first:
            return False
        ws = [g.initializers[n.inputs[1]] for n in group]
        sizes = [w.shape[1] for w in ws]
        wname, bname = ctx.fresh(x + "_sibling_w"), ctx.fresh(x + "_sibling_b")
        # Fortran-ordered (the layout level 99 gives MatMulBias weights), so each original is a contiguous column
        # range: the unoptimized graph's copy of it becomes that view and the original can be freed (the merged
        # weight takes the originals' memory instead of adding to it)
        merged_w = np.empty((k, sum(sizes)), dtype=np.float32, order="F")
        ends = np.cumsum([0] + sizes).tolist()
        source = ctx.source
        members = {id(n) for n in group}
        for n, w, a, b in zip(group, ws, ends, ends[1:]):
            merged_w[:, a:b] = w
            name = n.inputs[1]
            if source is not None and source.initializers.get(name) is w:
                source.initializers[name] = merged_w[:, a:b]
            if g.initializers.get(name) is w and all(id(c) in members for c in m.cons.get(name, [])) \
                    and name not in m.outs:
                del g.initializers[name]
        ws = w = None
        g.initializers[wname] = merged_w
        g.initializers[bname] = np.concatenate([g.initializers[n.inputs[2]] for n in group])
        merged_out = ctx.fresh(x + "_sibling_mm")
        merged = Node("MatMulBias", DOMAIN, [x, wname, bname], [merged_out], {}, name=ctx.fresh("SiblingMatMulBias"))
        _replace_by_split(g, ctx, group, merged, sizes, -1, x + "_sibling_split", "SiblingMatMulSplit")
        return True


# ConvBatchNormFusion is correct but did not pay in measurements (light_densenet121/inception_v2 ~2-4% slower,
# shufflenet/resnet50 unchanged), so it is not part of ALL_PASSES for now
ALL_PASSES: list = [HardSwishFusion(), HardSigmoidMulFusion(), PreActivationConvFold(), SiblingPointwiseConvFusion(),
                     PoolProjectionSwap(), ConvConcatFusion(),
                     SiblingMatMulBiasFusion()]

__all__ = ["ALL_PASSES", "ConvConcatFusion", "HardSwishFusion", "HardSigmoidMulFusion", "ConvBatchNormFusion",
           "PoolProjectionSwap", "PreActivationConvFold", "SiblingMatMulBiasFusion", "SiblingPointwiseConvFusion"]
