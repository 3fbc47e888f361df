"""Level-99 fusions writing onnxpy's internal ops (onnxpy/optimizer/fusions_all.py)."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
import onnxpy.optimizer as opt
from onnxpy.optimizer.fusions_all import ALL_PASSES, ConvBatchNormFusion

TESTED = ALL_PASSES + [ConvBatchNormFusion()]  # ConvBatchNormFusion is kept out of ALL_PASSES (not paying yet)

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _wired(monkeypatch):
    """Wire the passes before DeadCodeElimination at level 99 (those passes_for does not have yet)."""
    orig = opt.passes_for
    def passes_for(level, disabled=frozenset()):
        ch = orig(level, disabled)
        if level >= 99:
            have = {p.name for p in ch}
            ch = ch[:-1] + [p for p in TESTED if p.name not in disabled and p.name not in have] + ch[-1:]
        return ch

    monkeypatch.setattr(opt, "passes_for", passes_for)


def _c(name, v, dt=np.float32, shape=()):
    return numpy_helper.from_array(np.full(shape, v, dtype=dt), name)


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def _vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def run(tmp_path, model, feeds, level=99, rtol=1e-6, atol=1e-6):
    data = model.SerializeToString()
    path = os.path.join(str(tmp_path), f"opt{level}.onnx")
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = path
    got = onnxpy.InferenceSession(data, so).run(None, feeds)
    so0 = onnxpy.SessionOptions()
    so0.graph_optimization_level = 0
    base = onnxpy.InferenceSession(data, so0).run(None, feeds)
    for a, b in zip(got, base):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
    return [(n.domain + ":" if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in onnx.load(path).graph.node]


def _hswish(order="mul_div", three=3.0, scale_op="Div", dt=F, npdt=np.float32, x_is_other=True):
    inits = [_c("three", three, npdt), _c("zero", 0.0, npdt), _c("six", 6.0, npdt),
             _c("sixth", 1 / 6, npdt)]
    sc = "six" if scale_op == "Div" else "sixth"
    nodes = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"])]
    other = "x" if x_is_other else "x2"
    if order == "mul_div":
        nodes += [helper.make_node("Mul", [other, "c"], ["m"]), helper.make_node(scale_op, ["m", sc], ["y"])]
    else:
        nodes += [helper.make_node(scale_op, ["c", sc], ["d"]), helper.make_node("Mul", ["d", other], ["y"])]
    inputs = [_vi("x", [2, 3, 4, 5], dt)] + ([] if x_is_other else [_vi("x2", [2, 3, 4, 5], dt)])
    return _model(nodes, inputs, [_vi("y", None, dt)], inits)


@pytest.mark.parametrize("order", ["mul_div", "div_mul"])
@pytest.mark.parametrize("scale_op", ["Div", "Mul"])
def test_hardswish_fuses_at_99_only(tmp_path, order, scale_op):
    x = (RNG.standard_normal((2, 3, 4, 5)) * 4).astype(np.float32)
    m = _hswish(order, scale_op=scale_op)
    assert run(tmp_path, m, {"x": x}, rtol=1e-6, atol=1e-6) == ["ai.onnxpy:HardSwishLike"]
    for level in (1, 2):
        assert "ai.onnxpy:HardSwishLike" not in run(tmp_path, m, {"x": x}, level=level)


def test_hardswish_float64_and_float16(tmp_path):
    x = (RNG.standard_normal((2, 3, 4, 5)) * 4)
    ops = run(tmp_path, _hswish(dt=TensorProto.DOUBLE, npdt=np.float64), {"x": x}, rtol=1e-12, atol=1e-12)
    assert ops == ["ai.onnxpy:HardSwishLike"]
    ops = run(tmp_path, _hswish(dt=TensorProto.FLOAT16, npdt=np.float16), {"x": x.astype(np.float16)},
              rtol=1e-3, atol=1e-3)
    assert ops == ["Cast", "ai.onnxpy:HardSwishLike", "Cast"]  # float16 graphs compute in float32 at level 99


def test_hardswish_other_constants_exact(tmp_path):
    # not the plain HardSwish: runs the unfused graph's steps, bit for bit
    x = (RNG.standard_normal((2, 3, 4, 5)) * 4).astype(np.float32)
    assert run(tmp_path, _hswish(three=2.5), {"x": x}, rtol=0, atol=0) == ["ai.onnxpy:HardSwishLike"]
    assert run(tmp_path, _hswish("div_mul", three=2.5), {"x": x}, rtol=0, atol=0) == ["ai.onnxpy:HardSwishLike"]


def test_hardswish_near_misses(tmp_path):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    x2 = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    # the Mul reads another tensor than the Add
    assert "ai.onnxpy:HardSwishLike" not in run(tmp_path, _hswish(x_is_other=False), {"x": x, "x2": x2})
    # an intermediate is also a graph output
    m = _hswish()
    m.graph.output.append(_vi("c", None))
    assert "ai.onnxpy:HardSwishLike" not in run(tmp_path, m, {"x": x})
    # a non-constant Clip bound
    m = _hswish()
    m.graph.initializer.pop(2)  # "six" becomes a graph input
    m.graph.input.append(_vi("six", []))
    ops = run(tmp_path, m, {"x": x, "six": np.array(6.0, np.float32)})
    assert "ai.onnxpy:HardSwishLike" not in ops


def test_hardsigmoid_mul(tmp_path):
    x = (RNG.standard_normal((2, 3, 4, 5)) * 4).astype(np.float32)
    nodes = [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5),
             helper.make_node("Mul", ["x", "h"], ["y"])]
    m = _model(nodes, [_vi("x", [2, 3, 4, 5])], [_vi("y", None)])
    assert run(tmp_path, m, {"x": x}, rtol=0, atol=0) == ["ai.onnxpy:HardSigmoidMul"]
    assert "ai.onnxpy:HardSigmoidMul" not in run(tmp_path, m, {"x": x}, level=2)
    nodes[1] = helper.make_node("Mul", ["x2", "h"], ["y"])
    m = _model(nodes, [_vi("x", [2, 3, 4, 5]), _vi("x2", [2, 3, 4, 5])], [_vi("y", None)])
    assert "ai.onnxpy:HardSigmoidMul" not in run(tmp_path, m, {"x": x, "x2": x})


def _conv_bn(relu=False, bias=True, group=1, extra_use=False, training=0, opset=15):
    M, C = 6, 4
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1], group=group,
                              strides=[2, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mean", "var"], ["n"], epsilon=1e-3,
                              **({"training_mode": training} if opset >= 14 else {}))]
    outs = [_vi("n" if not relu else "y", None)]
    if relu:
        nodes.append(helper.make_node("Relu", ["n"], ["y"]))
    if extra_use:
        outs.append(_vi("c", None))
    inputs = [_vi("x", [2, C, 9, 8])] + [_vi(n, [M]) for n in ("s", "bb", "mean", "var")]
    w = numpy_helper.from_array(RNG.standard_normal((M, C // group, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(M).astype(np.float32), "b")
    return _model(nodes, inputs, outs, [w] + ([b] if bias else []), opset=opset)


def _bn_feeds():
    return {"x": RNG.standard_normal((2, 4, 9, 8)).astype(np.float32),
            "s": RNG.standard_normal(6).astype(np.float32), "bb": RNG.standard_normal(6).astype(np.float32),
            "mean": RNG.standard_normal(6).astype(np.float32), "var": RNG.random(6).astype(np.float32) + 0.5}


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("group", [1, 2])
def test_conv_bn(tmp_path, relu, bias, group):
    m = _conv_bn(relu, bias, group)
    feeds = _bn_feeds()
    assert run(tmp_path, m, feeds, rtol=1e-5, atol=1e-5) == ["ai.onnxpy:ConvBatchNorm"]
    for level in (1, 2):
        assert "ai.onnxpy:ConvBatchNorm" not in run(tmp_path, m, feeds, level=level, rtol=1e-5, atol=1e-5)


def test_conv_bn_big_filter_scales_output(tmp_path):
    # filter larger than the output: the kernel scales the output instead of the filter
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mean", "var"], ["y"])]
    m = _model(nodes, [_vi("x", [1, 64, 3, 3])] + [_vi(n, [32]) for n in ("s", "bb", "mean", "var")],
               [_vi("y", None)], [numpy_helper.from_array(RNG.standard_normal((32, 64, 3, 3)).astype(np.float32), "w"),
                                  numpy_helper.from_array(RNG.standard_normal(32).astype(np.float32), "b")])
    feeds = {"x": RNG.standard_normal((1, 64, 3, 3)).astype(np.float32),
             "s": RNG.standard_normal(32).astype(np.float32), "bb": RNG.standard_normal(32).astype(np.float32),
             "mean": RNG.standard_normal(32).astype(np.float32), "var": RNG.random(32).astype(np.float32) + 0.5}
    assert run(tmp_path, m, feeds, rtol=1e-5, atol=1e-5) == ["ai.onnxpy:ConvBatchNorm"]


def test_conv_bn_old_opset_and_near_misses(tmp_path):
    feeds = _bn_feeds()
    assert run(tmp_path, _conv_bn(opset=9), feeds, rtol=1e-5, atol=1e-5) == ["ai.onnxpy:ConvBatchNorm"]
    assert "ai.onnxpy:ConvBatchNorm" not in run(tmp_path, _conv_bn(extra_use=True), feeds)
    m = _conv_bn()
    m.graph.node[1].output.extend(["rm", "rv"])
    m.graph.node[1].attribute[-1].i = 1
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = 99
    so.optimized_model_filepath = os.path.join(str(tmp_path), "t.onnx")
    try:
        onnxpy.InferenceSession(m.SerializeToString(), so)
    except Exception:
        pass  # training outputs may be rejected; what matters is that nothing was fused
    else:
        assert "ConvBatchNorm" not in [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]


def test_conv_bn_kernel_fallback():
    from onnxpy.ops.internal import conv_batch_norm
    from onnxpy.ops.normalization import batch_normalization_9
    from onnxpy.ops.conv import conv

    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float16)
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float16)
    p = [np.ones(3, np.float16), np.zeros(3, np.float16), np.zeros(3, np.float16), np.ones(3, np.float16)]
    got = conv_batch_norm(x, w, None, *p, epsilon=1e-5)
    ref = batch_normalization_9(conv(x, w, None), *p, epsilon=1e-5)
    np.testing.assert_array_equal(got, ref)
    with pytest.raises(ValueError):
        conv_batch_norm(x, w, None, *p, activation="Tanh")


def _preact(C=6, M=5, scale=None, pads=(0, 0, 0, 0), ksize=1, bias=True, extra_use=None, group=1):
    """BatchNormalization -> Relu -> Conv, as in pre-activation networks (DenseNet)."""
    r = np.random.default_rng(7)
    gamma = r.uniform(0.5, 2.0, C) if scale is None else np.asarray(scale, np.float64)
    inits = [numpy_helper.from_array(gamma.astype(np.float32), "g"),
             numpy_helper.from_array(r.standard_normal(C).astype(np.float32), "b"),
             numpy_helper.from_array(r.standard_normal(C).astype(np.float32), "mu"),
             numpy_helper.from_array(r.uniform(0.5, 2, C).astype(np.float32), "var"),
             numpy_helper.from_array(r.standard_normal((M, C // group, ksize, ksize)).astype(np.float32), "W")]
    conv_in = ["r", "W"]
    if bias:
        inits.append(numpy_helper.from_array(r.standard_normal(M).astype(np.float32), "B"))
        conv_in.append("B")
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "mu", "var"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", conv_in, ["y"], kernel_shape=[ksize, ksize], pads=list(pads), group=group)]
    outs = [_vi("y", None)]
    if extra_use:
        nodes.append(helper.make_node("Identity", [extra_use], ["z"]))
        outs.append(_vi("z", None))
    return _model(nodes, [_vi("x", [2, C, 5, 4])], outs, inits)


@pytest.mark.parametrize("bias", [True, False])
def test_preactivation_bn_relu_conv1x1_folds_to_max(tmp_path, bias):
    x = (RNG.standard_normal((2, 6, 5, 4)) * 2).astype(np.float32)
    ops = run(tmp_path, _preact(bias=bias), {"x": x}, rtol=1e-5, atol=1e-5)
    assert ops == ["Max", "Conv"]
    for level in (1, 2):
        assert "Max" not in run(tmp_path, _preact(bias=bias), {"x": x}, level=level, rtol=1e-5, atol=1e-5)


def test_preactivation_zero_scale_channels_keep_relu_of_shift(tmp_path):
    x = (RNG.standard_normal((2, 6, 5, 4)) * 2).astype(np.float32)
    ops = run(tmp_path, _preact(scale=[1.0, 0.0, 2.0, 0.0, 0.5, 1.5]), {"x": x}, rtol=1e-5, atol=1e-5)
    assert ops == ["Max", "Conv"]


@pytest.mark.parametrize("case", ["negative_scale", "padded", "3x3", "bn_output_used", "relu_output_used", "grouped"])
def test_preactivation_fold_near_misses(tmp_path, case):
    x = (RNG.standard_normal((2, 6, 5, 4)) * 2).astype(np.float32)
    kw = {"negative_scale": {"scale": [1.0, -1.0, 2.0, 1.0, 0.5, 1.5]}, "padded": {"pads": (1, 1, 1, 1)},
          "3x3": {"ksize": 3, "pads": (1, 1, 1, 1)}, "bn_output_used": {"extra_use": "n"},
          "relu_output_used": {"extra_use": "r"}, "grouped": {"group": 2, "M": 4}}[case]
    ops = run(tmp_path, _preact(**kw), {"x": x}, rtol=1e-5, atol=1e-5)
    assert "Max" not in ops


def _siblings(specs, opset=18, C=6, extra=(), x_shape=(2, 6, 5, 4), concat=True):
    """Convolutions of x, one per spec (M, bias, relu, kernel, attrs), read by one Concat (the graph output) as in
    an Inception module, or (concat=False) each a graph output."""
    r = np.random.default_rng(11)
    nodes, inits, outs = [], [], []
    for i, (M, bias, relu, k, attrs) in enumerate(specs):
        inits.append(numpy_helper.from_array(r.standard_normal((M, C, k, k)).astype(np.float32), f"W{i}"))
        ins = ["x", f"W{i}"]
        if bias:
            inits.append(numpy_helper.from_array(r.standard_normal(M).astype(np.float32), f"B{i}"))
            ins.append(f"B{i}")
        conv_out = f"c{i}" if relu else f"y{i}"
        nodes.append(helper.make_node("Conv", ins, [conv_out], kernel_shape=[k, k], **attrs))
        if relu:
            nodes.append(helper.make_node("Relu", [conv_out], [f"y{i}"]))
        outs.append(_vi(f"y{i}", None))
    if concat:
        nodes.append(helper.make_node("Concat", [f"y{i}" for i in range(len(specs))], ["cat"], axis=1))
        outs = [_vi("cat", None)]
    nodes += list(extra)
    return _model(nodes, [_vi("x", list(x_shape))], outs, inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 13, 18])
@pytest.mark.parametrize("relu", [True, False])
def test_sibling_pointwise_convs_merge(tmp_path, opset, relu):
    """Inception's 1x1 branches: one convolution with the filters stacked, then a Split (same dot products)."""
    specs = [(4, True, relu, 1, {}), (3, False, relu, 1, {}), (5, True, relu, 1, {})]
    x = RNG.standard_normal((2, 6, 5, 4)).astype(np.float32)
    ops = run(tmp_path, _siblings(specs, opset=opset), {"x": x})
    assert ops == [("com.microsoft:FusedConv" if relu else "Conv"), "Split", "Concat"]
    for level in (1, 2):
        assert "Split" not in run(tmp_path, _siblings(specs, opset=opset), {"x": x}, level=level)


def test_sibling_pointwise_convs_strided_batch_1(tmp_path):
    specs = [(4, True, True, 1, {"strides": [2, 2]}), (2, True, True, 1, {"strides": [2, 2]})]
    x = RNG.standard_normal((1, 6, 9, 8)).astype(np.float32)
    ops = run(tmp_path, _siblings(specs, x_shape=(1, 6, 9, 8)), {"x": x})
    assert ops == ["com.microsoft:FusedConv", "Split", "Concat"]


def test_sibling_pointwise_convs_read_by_convolutions(tmp_path):
    """A merged branch read by a 3x3 convolution (Inception's reduce -> 3x3)."""
    specs = [(4, True, True, 1, {}), (6, True, True, 1, {})]
    r = np.random.default_rng(5)
    extra = [helper.make_node("Conv", ["y1", "W3"], ["z"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["y0", "z"], ["cat"], axis=1)]
    m = _siblings(specs, extra=extra, concat=False)
    m.graph.initializer.append(numpy_helper.from_array(r.standard_normal((3, 6, 3, 3)).astype(np.float32), "W3"))
    del m.graph.output[:]
    m.graph.output.append(_vi("cat", None))
    x = RNG.standard_normal((2, 6, 5, 4)).astype(np.float32)
    ops = run(tmp_path, m, {"x": x}, rtol=1e-5, atol=1e-5)
    assert ops[:2] == ["com.microsoft:FusedConv", "Split"] and ops.count("Conv") == 1


def test_sibling_pointwise_convs_only_like_ones_merge(tmp_path):
    """Different strides, activations, kernel sizes or padding stay apart; the like ones still merge."""
    specs = [(4, True, True, 1, {}), (3, True, False, 1, {}), (2, True, True, 3, {"pads": [1, 1, 1, 1]}),
             (5, True, True, 1, {"strides": [2, 2]}), (2, False, True, 1, {}),
             (3, True, True, 1, {"pads": [1, 1, 1, 1]})]
    x = RNG.standard_normal((2, 6, 5, 4)).astype(np.float32)
    m = _siblings(specs, concat=False)  # (shapes differ: no Concat; y0 and y4 read by one Concat below)
    m.graph.node.append(helper.make_node("Concat", ["y0", "y4"], ["cat"], axis=1))
    m.graph.output.append(_vi("cat", None))
    for o in [o for o in m.graph.output if o.name in ("y0", "y4")]:
        m.graph.output.remove(o)
    ops = run(tmp_path, m, {"x": x})
    assert ops.count("Split") == 1 and ops.count("Conv") + ops.count("com.microsoft:FusedConv") == 5


@pytest.mark.parametrize("case", ["graph_output", "elementwise_reader"])
def test_sibling_pointwise_convs_not_merged_when_views_would_cost(tmp_path, case):
    """The Split's outputs are views: not for graph outputs, nor for element-wise readers (which could no longer
    overwrite the convolution's output in place)."""
    specs = [(6, True, True, 1, {}), (6, True, True, 1, {})]
    x = RNG.standard_normal((2, 6, 5, 4)).astype(np.float32)
    if case == "graph_output":
        m = _siblings(specs, concat=False)
    else:
        m = _siblings(specs, concat=False, extra=[helper.make_node("Add", ["y0", "y1"], ["s"])])
        del m.graph.output[:]
        m.graph.output.append(_vi("s", None))
    assert "Split" not in run(tmp_path, m, {"x": x})


def _pool_proj(C=8, M=3, bias=True, act="Relu", pool_attrs=None, conv_attrs=None, wshape=None, extra_use=False):
    """AveragePool -> 1x1 Conv [-> activation], Inception's pool-projection branch."""
    r = np.random.default_rng(9)
    inits = [numpy_helper.from_array(r.standard_normal(wshape or (M, C, 1, 1)).astype(np.float32), "W")]
    conv_in = ["p", "W"]
    if bias:
        inits.append(numpy_helper.from_array(r.standard_normal((wshape or (M,))[0]).astype(np.float32), "B"))
        conv_in.append("B")
    pa = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]} if pool_attrs is None else pool_attrs
    nodes = [helper.make_node("AveragePool", ["x"], ["p"], **pa),
             helper.make_node("Conv", conv_in, ["c" if act else "y"], **(conv_attrs or {}))]
    if act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    outs = [_vi("y", None)]
    if extra_use:
        outs.append(_vi("p", None))
    return _model(nodes, [_vi("x", [2, C, 7, 6])], outs, inits, opset=13)


@pytest.mark.parametrize("bias,act", [(True, "Relu"), (False, "Relu"), (True, None), (False, None)])
@pytest.mark.parametrize("pool_attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},  # edges divide by 9: still linear
    {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": 1},
])
def test_pool_projection_swap(tmp_path, bias, act, pool_attrs):
    x = RNG.standard_normal((2, 8, 7, 6)).astype(np.float32)
    ops = run(tmp_path, _pool_proj(bias=bias, act=act, pool_attrs=pool_attrs), {"x": x}, rtol=1e-5, atol=1e-5)
    assert ops[:2] == ["Conv", "AveragePool"]
    assert ops[2:] == (["Add"] if bias else []) + (["Relu"] if act else [])
    assert "AveragePool" not in run(tmp_path, _pool_proj(bias=bias, act=act, pool_attrs=pool_attrs), {"x": x},
                                    level=2, rtol=1e-5, atol=1e-5)[1:]


@pytest.mark.parametrize("case", ["more_outputs", "padded_conv", "strided_conv", "pool_used_twice", "sigmoid",
                                  "3x3_conv"])
def test_pool_projection_swap_near_misses(tmp_path, case):
    kw = {"more_outputs": {"M": 8}, "padded_conv": {"conv_attrs": {"pads": [1, 1, 1, 1]}, "wshape": (3, 8, 3, 3)},
          "strided_conv": {"conv_attrs": {"strides": [2, 2]}}, "pool_used_twice": {"extra_use": True},
          "sigmoid": {"act": "Sigmoid"}, "3x3_conv": {"wshape": (3, 8, 3, 3)}}[case]
    x = RNG.standard_normal((2, 8, 7, 6)).astype(np.float32)
    ops = run(tmp_path, _pool_proj(**kw), {"x": x}, rtol=1e-5, atol=1e-5)
    assert ops[0] == "AveragePool"


# ------------------------------------------------------------------------------------------- ConvConcatFusion
def _fire(C=6, M1=4, M3=5, x_shape=(1, 6, 7, 6), act="Relu", act2=None, attrs1=None, attrs3=None, bias=(True, True),
          extra=None, outputs=("cat",), axis=1, other_input=False):
    """SqueezeNet's fire expand: 1x1 and 3x3 convolutions of one tensor, each [-> activation], -> Concat."""
    r = np.random.default_rng(11)
    inits, nodes = [], []
    for i, (k, M, a, b) in enumerate(((1, M1, attrs1, bias[0]), (3, M3, attrs3, bias[1]))):
        cg = C // (a or {}).get("group", 1)
        inits.append(numpy_helper.from_array(r.standard_normal((M, cg, k, k)).astype(np.float32), f"W{i}"))
        ins = ["x2" if other_input and i else "x", f"W{i}"]
        if b:
            inits.append(numpy_helper.from_array(r.standard_normal(M).astype(np.float32), f"B{i}"))
            ins.append(f"B{i}")
        kw = {"kernel_shape": [k, k], "pads": [k // 2] * 4} if a is None else a
        a_i = act if i == 0 or act2 is None else act2
        nodes.append(helper.make_node("Conv", ins, [f"c{i}" if a_i else f"y{i}"], **kw))
        if a_i:
            nodes.append(helper.make_node(a_i, [f"c{i}"], [f"y{i}"]))
    nodes.append(helper.make_node("Concat", ["y0", "y1"], ["cat"], axis=axis))
    nodes += extra or []
    inputs = [_vi("x", list(x_shape))] + ([_vi("x2", list(x_shape))] if other_input else [])
    return _model(nodes, inputs, [_vi(o, None) for o in outputs], inits, opset=13)


@pytest.mark.parametrize("act", ["Relu", "", "Sigmoid"])
@pytest.mark.parametrize("batch", [1, 2])
def test_conv_concat_fuses_fire_modules(tmp_path, act, batch):
    """The convolutions write their channel ranges of one output: same values as the Concat of the two."""
    x = RNG.standard_normal((batch, 6, 7, 6)).astype(np.float32)
    ops = run(tmp_path, _fire(x_shape=(batch, 6, 7, 6), act=act), {"x": x}, rtol=1e-5, atol=1e-5)
    assert ops == ["ai.onnxpy:ConvConcat"]
    for level in (1, 2):
        assert "ai.onnxpy:ConvConcat" not in run(tmp_path, _fire(act=act), {"x": x[:1]}, level=level)


def test_conv_concat_strided_dilated_grouped_unbiased_and_two_inputs(tmp_path):
    a1 = {"kernel_shape": [1, 1], "strides": [2, 2]}
    a3 = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [2, 2, 2, 2], "dilations": [2, 2], "group": 2}
    m = _fire(C=6, M1=4, M3=6, x_shape=(2, 6, 9, 8), attrs1=a1, attrs3=a3, bias=(False, True), other_input=True)
    x, x2 = (RNG.standard_normal((2, 6, 9, 8)).astype(np.float32) for _ in range(2))
    assert run(tmp_path, m, {"x": x, "x2": x2}, rtol=1e-5, atol=1e-5) == ["ai.onnxpy:ConvConcat"]


@pytest.mark.parametrize("case", ["act_differs", "member_graph_output", "member_read_twice", "axis", "valid_mismatch"])
def test_conv_concat_not_fused(tmp_path, case):
    x = RNG.standard_normal((1, 6, 7, 6)).astype(np.float32)
    if case == "act_differs":
        m = _fire(act2="Sigmoid")
    elif case == "member_graph_output":
        m = _fire(outputs=("cat", "y0"))
    elif case == "member_read_twice":
        m = _fire(extra=[helper.make_node("Add", ["y1", "y1"], ["s"])], outputs=("cat", "s"))
    elif case == "axis":
        m = _fire(M1=5, attrs1={"kernel_shape": [1, 1]}, axis=2)  # (same channels: an axis-2 Concat is valid)
    else:  # unpadded 3x3 next to a 1x1: the shapes differ and the Concat reports it, fused or not
        m = _fire(attrs3={"kernel_shape": [3, 3]})
        with pytest.raises(Exception, match="Concat"):
            onnxpy.InferenceSession(m.SerializeToString()).run(None, {"x": x})
        return
    assert "ai.onnxpy:ConvConcat" not in run(tmp_path, m, {"x": x}, rtol=1e-5, atol=1e-5)


def test_conv_concat_kernel_matches_generic_and_reports_errors():
    """The plan-time kernel against the generic one (float32 / float64, every member path), and the errors."""
    from onnxpy.ops import contrib_fused as cf
    from onnxpy.ops._shape_util import NOT_CONST

    r = np.random.default_rng(3)
    for dt in (np.float32, np.float64):
        ws = [r.standard_normal(s).astype(dt) for s in ((4, 6, 1, 1), (5, 6, 3, 3), (6, 1, 3, 3))]
        bs = [r.standard_normal(4).astype(dt), None, r.standard_normal(6).astype(dt)]
        kw = {"activation": "LeakyRelu", "activation_params": [0.1], "pads": [0] * 4 + [1] * 4 + [1] * 4,
              "strides": [1] * 6, "dilations": [1] * 6, "groups": [1, 1, 6]}
        consts = [v for w, b in zip(ws, bs) for v in (NOT_CONST, w, b)]
        fast = cf.conv_concat.specialize(consts, kw)
        assert fast is not None
        for n in (1, 3):
            x = r.standard_normal((n, 6, 8, 7)).astype(dt)
            args = [v for w, b in zip(ws, bs) for v in (x, w, b)]
            got, want = fast(*args), cf.conv_concat(*args, **kw)
            assert got.shape == (n, 15, 8, 7) and got.dtype == dt
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="ConvConcat: 2 members need"):
        cf.conv_concat(x, ws[0], None, x, ws[1], None, pads=[0] * 4, strides=[1] * 4, dilations=[1] * 4, groups=[1, 1])
    with pytest.raises(ValueError, match="triples"):
        cf.conv_concat(x, ws[0])
    # inputs the plan-time form does not cover (another filter object, a wrong channel count) take the generic
    # kernel, which reports them
    args = [v for w, b in zip(ws, bs) for v in (x, w, b)]
    args[1] = ws[0].copy()
    np.testing.assert_allclose(fast(*args), cf.conv_concat(*args, **kw))
    args[0] = x[:, :5]
    with pytest.raises(ValueError, match="channels"):
        fast(*args)


@pytest.mark.parametrize("path", ["1x1", "1x1_strided", "im2col", "direct", "stacked", "depthwise", "winograd"])
@pytest.mark.parametrize("batch", [1, 2])
def test_conv2d_fast_writes_into_out(path, batch):
    """``conv._conv2d_fast(..., out=)`` writes a channel range of a larger array on every path (the GEMM paths
    directly when the range is contiguous, the others by a copy) and leaves the rest alone."""
    from onnxpy.ops import conv

    r = np.random.default_rng(4)
    C, M, H, k, s, p, g = {"1x1": (8, 6, 9, 1, 1, 0, 1), "1x1_strided": (8, 6, 9, 1, 2, 0, 1),
                           "im2col": (8, 6, 9, 3, 2, 1, 1), "direct": (64, 64, 17, 3, 1, 1, 1),
                           "stacked": (64, 16, 12, 3, 1, 1, 1), "depthwise": (16, 16, 12, 3, 1, 1, 16),
                           "winograd": (256, 512, 28, 3, 1, 1, 1)}[path]
    x = r.standard_normal((batch, C, H, H)).astype(np.float32)
    w = r.standard_normal((M, C // g, k, k)).astype(np.float32)
    b = r.standard_normal(M).astype(np.float32)
    want = conv._conv2d_fast(x, w, b, (p, p), (p, p), (s, s), (1, 1), g, (None, None))
    big = np.full((batch, M + 5) + want.shape[2:], 7.0, np.float32)
    got = conv._conv2d_fast(x, w, b, (p, p), (p, p), (s, s), (1, 1), g, (None, None), out=big[:, 2:M + 2])
    assert got.base is big or got is big or np.shares_memory(got, big)
    np.testing.assert_allclose(big[:, 2:M + 2], want, rtol=1e-5, atol=1e-4)
    assert (big[:, :2] == 7).all() and (big[:, M + 2:] == 7).all()


# -------------------------------------------------------------------------------------- SiblingMatMulBiasFusion
def _qkv(n=3, H=8, outs=None, opset=13, dynamic_w=False, widths=None):
    """A transformer's query / key / value projections: MatMul + bias Add of one [B, S, H] tensor, n times."""
    r = np.random.default_rng(13)
    widths = widths or [H] * n
    nodes, inits = [], []
    for i, N in enumerate(widths):
        if not (dynamic_w and i == 0):
            inits.append(numpy_helper.from_array(r.standard_normal((H, N)).astype(np.float32), f"W{i}"))
        inits.append(numpy_helper.from_array(r.standard_normal(N).astype(np.float32), f"b{i}"))
        nodes += [helper.make_node("MatMul", ["x", f"W{i}"], [f"m{i}"]), helper.make_node("Add", [f"m{i}", f"b{i}"],
                                                                                           [f"y{i}"])]
    # each projection read by a Reshape into heads, as in attention
    inits.append(numpy_helper.from_array(np.array([0, 0, 2, -1], dtype=np.int64), "heads"))
    for i in range(n):
        nodes.append(helper.make_node("Reshape", [f"y{i}", "heads"], [f"h{i}"]))
    inputs = [_vi("x", [2, 5, H])] + ([_vi("W0", [H, widths[0]])] if dynamic_w else [])
    outs = outs or [f"h{i}" for i in range(n)]
    return _model(nodes, inputs, [_vi(o, None) for o in outs], inits, opset=opset)


def _plan_ops(model, feeds, level=99):
    """Op types of the session's plan (MatMulBias is not written when saving, so no saved model to read), after
    checking the results against the unoptimized graph."""
    data = model.SerializeToString()
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = level
    sess = onnxpy.InferenceSession(data, so)
    so0 = onnxpy.SessionOptions()
    so0.graph_optimization_level = 0
    for a, b in zip(sess.run(None, feeds), onnxpy.InferenceSession(data, so0).run(None, feeds)):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return [st.node.op_type for st in sess._state.plan.steps]


@pytest.mark.parametrize("opset", [11, 13])
def test_sibling_matmul_bias_merge(opset):
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    ops = _plan_ops(_qkv(opset=opset, widths=[8, 6, 10]), {"x": x})
    assert ops.count("MatMulBias") == 1 and ops.count("Split") == 1
    for level in (1, 2):
        assert "Split" not in _plan_ops(_qkv(opset=opset), {"x": x}, level=level)


@pytest.mark.parametrize("case", ["graph_output", "dynamic_weight"])
def test_sibling_matmul_bias_leaves_out(case):
    """A projection that is a graph output, or whose weight is fed, stays on its own; the others still merge."""
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    feeds = {"x": x}
    if case == "graph_output":
        m = _qkv(outs=["h0", "h1", "h2", "y2"])
    else:
        m = _qkv(dynamic_w=True)
        feeds["W0"] = RNG.standard_normal((8, 8)).astype(np.float32)
    ops = _plan_ops(m, feeds)
    assert ops.count("Split") == 1 and ops.count("MatMulBias") == 2 - (case == "dynamic_weight")


def test_sibling_matmul_bias_originals_become_views():
    """The merged weight replaces the originals in the loaded (unoptimized) model too, as column views of it, so the
    originals are not kept alive next to it."""
    from onnxpy.ir.load import load_model
    from onnxpy.optimizer import optimize

    model = load_model(_qkv(widths=[8, 6, 10]).SerializeToString())
    before = [model.graph.initializers[f"W{i}"] for i in range(3)]
    opt = optimize(model, onnxpy.SessionOptions())
    merged = [v for k, v in opt.graph.initializers.items() if "sibling_w" in k]
    assert len(merged) == 1 and merged[0].shape == (8, 24) and merged[0].flags.f_contiguous
    assert not any(f"W{i}" in opt.graph.initializers for i in range(3))
    for i, b in enumerate(before):
        now = model.graph.initializers[f"W{i}"]
        assert np.array_equal(now, b) and np.shares_memory(now, merged[0]) and not np.shares_memory(b, merged[0])


@pytest.mark.parametrize("shape", [(1, 1), (15, 7), (16, 33), (37, 50), (129, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fortran_copy_any_shape(shape, dtype):
    # the level-99 weight layout: same values, Fortran order, for row counts that are no multiple of the block
    a = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    f = opt._fortran_copy(a)
    assert f.flags.f_contiguous and f.dtype == a.dtype and f.shape == a.shape
    np.testing.assert_array_equal(f, a)
