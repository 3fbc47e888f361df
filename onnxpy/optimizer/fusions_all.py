"""ORT_ENABLE_ALL (level 99) fusions that write onnxpy's internal ops (domain ``ai.onnxpy``).

Like onnxruntime's level-99 layout rewrites, a model saved after these passes only loads in onnxpy, so they
never run at levels 1 and 2.

* HardSwishFusion: Add(x, 3) -> Clip(0, 6) -> Mul(x, .) -> Div(., 6) (either order of the Mul and the Div/Mul by a
  constant) -> ai.onnxpy.HardSwishLike, and Mul(x, HardSigmoid(x)) -> ai.onnxpy.HardSigmoidMul
* ConvBatchNormFusion (not in ALL_PASSES, see below): Conv -> BatchNormalization (test mode, parameters not
  constant) [-> Relu] -> ai.onnxpy.ConvBatchNorm
"""

from __future__ import annotations

from ..ir.model import Node
from .fusions import AnchoredFusion, _is

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


# ConvBatchNormFusion is correct but did not pay in measurements (light_densenet121/inception_v2 ~2-4% slower,
# shufflenet/resnet50 unchanged), so it is not part of ALL_PASSES for now
ALL_PASSES: list = [HardSwishFusion(), HardSigmoidMulFusion()]

__all__ = ["ALL_PASSES", "HardSwishFusion", "HardSigmoidMulFusion", "ConvBatchNormFusion"]
