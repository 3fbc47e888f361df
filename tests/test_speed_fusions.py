"""Speed paths: ConvActivationFusion, the shifted-GEMM / depthwise Conv paths, separable pooling, Pow fast path,
Constant nodes planned as constants.  Every case is checked against onnxruntime or an independent formula."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.ops._shape_util import NOT_CONST
from onnxpy.ops.conv import conv
from onnxpy.ops.elementwise import pow_

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _both(model, feeds, **kw):
    a = onnxpy.InferenceSession(model, **kw)
    b = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return a, a.run(None, feeds), b.run(None, feeds)


def _ref_conv(x, w, pads, dil, stride=(1, 1), group=1):
    """Direct float64 formula (sum over taps) for 2-D grouped convolution."""
    N, C, H, W = x.shape
    M, Cg, KH, KW = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    Ho = (xp.shape[2] - (KH - 1) * dil[0] - 1) // stride[0] + 1
    Wo = (xp.shape[3] - (KW - 1) * dil[1] - 1) // stride[1] + 1
    out = np.zeros((N, M, Ho, Wo))
    Mg = M // group
    for g in range(group):
        for i in range(KH):
            for j in range(KW):
                xs = xp[:, g * Cg:(g + 1) * Cg, i * dil[0]:i * dil[0] + (Ho - 1) * stride[0] + 1:stride[0],
                        j * dil[1]:j * dil[1] + (Wo - 1) * stride[1] + 1:stride[1]]
                out[:, g * Mg:(g + 1) * Mg] += np.einsum("mc,nchw->nmhw", w[g * Mg:(g + 1) * Mg, :, i, j], xs)
    return out


@pytest.mark.parametrize("N,C,H,W,M,K,pads,dil", [
    (2, 64, 9, 7, 16, (3, 3), [1, 1, 1, 1], [1, 1]),
    (1, 80, 10, 12, 8, (3, 5), [0, 2, 1, 0], [2, 1]),
    (3, 64, 40, 33, 64, (1, 3), [0, 0, 0, 0], [1, 1]),
    (1, 128, 5, 5, 4, (5, 5), [2, 2, 2, 2], [1, 1]),
    (1, 64, 33, 34, 64, (3, 3), [1, 1, 1, 1], [1, 1]),
])
def test_conv_shifted_gemm_path(N, C, H, W, M, K, pads, dil):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    w = rng.standard_normal((M, C, *K)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32)
    r = conv(x, w, b, pads=pads, dilations=dil)
    e = _ref_conv(x, w, pads, dil) + b.reshape(1, -1, 1, 1)
    assert r.shape == e.shape and r.dtype == np.float32 and r.flags.c_contiguous
    np.testing.assert_allclose(r, e, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("stride,mult", [(1, 1), (2, 1), (1, 2)])
def test_depthwise_conv(stride, mult):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, 11, 9)).astype(np.float32)
    w = rng.standard_normal((8 * mult, 1, 3, 3)).astype(np.float32)
    r = conv(x, w, pads=[1, 1, 1, 1], strides=[stride, stride], group=8)
    e = _ref_conv(x, w, [1, 1, 1, 1], [1, 1], (stride, stride), group=8)
    np.testing.assert_allclose(r, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 0, 1, 0])),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[1, 2], dilations=[2, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[5, 3], strides=[2, 1], pads=[2, 1, 2, 1], count_include_pad=1)),
])
def test_separable_pooling(op, attrs):
    x = np.random.default_rng(2).standard_normal((2, 3, 17, 15)).astype(np.float32)
    m = _model([helper.make_node(op, ["x"], ["y"], **attrs)],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], opset=19)
    _, a, b = _both(m, {"x": x})
    assert a[0].shape == b[0].shape
    np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("exp", [2.0, 3.0, 1.0, 0.5, -1.0, 2.5])
@pytest.mark.parametrize("ydt", [np.float32, np.float64, np.int64])
def test_pow_fast_path(exp, ydt):
    x = np.random.default_rng(3).uniform(0.1, 2.0, (4, 5)).astype(np.float32)
    y = np.array(exp).astype(ydt)
    r = pow_(x, y)
    assert r.dtype == np.float32 and r.shape == x.shape
    np.testing.assert_allclose(r, x.astype(np.float64) ** float(y), rtol=1e-6)
    # a (1, 1) exponent broadcasts the output to rank 2 whatever x's rank
    r1 = pow_(x[0], y.reshape(1, 1))
    assert r1.shape == (1, 5)


def _conv_act_model(act, extra_inits=(), act_inputs=None, **act_attrs):
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(act, act_inputs or ["c"], ["y"], **act_attrs)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b, *extra_inits])


@pytest.mark.parametrize("act,attrs,inits,ins", [
    ("Relu", {}, (), None),
    ("Sigmoid", {}, (), None),
    ("Tanh", {}, (), None),
    ("LeakyRelu", {"alpha": 0.2}, (), None),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, (), None),
    ("Clip", {}, (numpy_helper.from_array(np.array(0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6, np.float32), "hi")), ["c", "lo", "hi"]),
    ("Clip", {}, (numpy_helper.from_array(np.array(-1, np.float32), "lo"),), ["c", "lo"]),
])
def test_conv_activation_fusion(act, attrs, inits, ins):
    from onnxpy.optimizer import passes_for
    from onnxpy.optimizer.fusions_speed import ConvActivationFusion

    m = _conv_act_model(act, inits, ins, **attrs)
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    sess, a, b = _both(m, {"x": x})
    np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5)
    # the pass may or may not be in the lead's default list; when it is, it must have fired
    if any(isinstance(p, ConvActivationFusion) for p in passes_for(99)):
        assert sess._model.applied_passes.get("ConvActivationFusion") == 1


def test_conv_activation_fusion_pass_direct():
    """Apply the pass by hand: the graph gets one FusedConv whose result matches onnxruntime's."""
    from onnxpy.optimizer import OptContext, _copy_graph
    from onnxpy.optimizer.fusions_speed import ConvActivationFusion

    m = _conv_act_model("LeakyRelu", alpha=0.1)
    sess = onnxpy.InferenceSession(m, disabled_optimizers=["ConvActivationFusion"])
    model = sess._model
    model.graph = _copy_graph(model.graph)
    ctx = OptContext(model, None)
    ctx.protected = {o.name for o in model.graph.outputs}
    assert ConvActivationFusion().apply(model.graph, ctx) == 1
    ops = [(n.domain, n.op_type) for n in model.graph.nodes]
    assert ops == [("com.microsoft", "FusedConv")]
    fused = model.graph.nodes[0]
    assert fused.attrs["activation"] == "LeakyRelu" and fused.attrs["activation_params"] == [pytest.approx(0.1)]


def test_conv_activation_fusion_skips_shared_conv_output():
    from onnxpy.optimizer import OptContext, _copy_graph
    from onnxpy.optimizer.fusions_speed import ConvActivationFusion

    rng = np.random.default_rng(6)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("Neg", ["c"], ["z"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [w])
    sess = onnxpy.InferenceSession(m)
    model = sess._model
    model.graph = _copy_graph(model.graph)
    ctx = OptContext(model, None)
    ctx.protected = {o.name for o in model.graph.outputs}
    assert ConvActivationFusion().apply(model.graph, ctx) == 0


def test_constant_nodes_in_subgraph():
    """Constant nodes become plan constants; results (and reruns) are unchanged."""
    then_g = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([2.0], np.float32))),
         helper.make_node("Mul", ["x", "k"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph(
        [helper.make_node("Constant", [], ["k2"], value_floats=[3.0]),
         helper.make_node("Mul", ["x", "k2"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = _model(nodes, [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                       helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    s = onnxpy.InferenceSession(m)
    x = np.array([1, 2, 3], np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(s.run(None, {"c": np.array(True), "x": x})[0], x * 2)
        np.testing.assert_array_equal(s.run(None, {"c": np.array(False), "x": x})[0], x * 3)


@pytest.mark.parametrize("mult", [1, 3])
def test_depthwise_conv_channel_blocks(monkeypatch, mult):
    """Channel blocks smaller than the group count (uneven last block), dilation and asymmetric pads."""
    import onnxpy.ops.conv as conv_mod

    monkeypatch.setattr(conv_mod, "_DW_BLOCK_BYTES", 64 * 4 * mult)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 7, 6, 5)).astype(np.float32)
    w = rng.standard_normal((7 * mult, 1, 3, 2)).astype(np.float32)
    r = conv(x, w, pads=[2, 0, 1, 1], dilations=[2, 1], group=7)
    e = _ref_conv(x, w, [2, 0, 1, 1], [2, 1], group=7)
    np.testing.assert_allclose(r, e, rtol=1e-4, atol=1e-4)


def test_fp16_weight_f32_copy_cache():
    """A read-only float16 weight backed by bytes is converted once; results equal the uncached path."""
    import gc

    from onnxpy.ops import linalg

    rng = np.random.default_rng(8)
    w = np.frombuffer(rng.standard_normal((96, 64)).astype(np.float16).tobytes(), np.float16).reshape(96, 64)
    a = rng.standard_normal((3, 5, 96)).astype(np.float16)
    want = np.matmul(a.astype(np.float32), w.astype(np.float32)).astype(np.float16)
    for _ in range(2):
        np.testing.assert_array_equal(linalg.matmul(a, w), want)
    assert id(w) in linalg._F32_COPIES
    want2 = np.matmul(a[0].astype(np.float32), w.astype(np.float32)).astype(np.float16)
    g = linalg._gemm(a[0], w.T.copy().T, None, 1.0, 1.0, 0, 0)  # writable: not cached, same result
    np.testing.assert_allclose(g.astype(np.float32), want2, rtol=2e-3, atol=1e-3)
    wt = np.frombuffer(w.T.copy().tobytes(), np.float16).reshape(64, 96)
    for _ in range(2):
        gt = linalg._gemm(a[0], wt, None, 1.0, 1.0, 0, 1)
        np.testing.assert_allclose(gt.astype(np.float32), want2, rtol=2e-3, atol=1e-3)
    assert id(wt) in linalg._F32_COPIES
    key = id(w)
    del w
    gc.collect()
    assert key not in linalg._F32_COPIES


def _ref_conv1d(x, w, b, pb, pe, stride):
    """Direct float64 formula for 1-D convolution (group 1, no dilation)."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pb, pe)))
    K = w.shape[2]
    O = (xp.shape[2] - K) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], O))
    for k in range(K):
        out += np.einsum("mc,nco->nmo", w[:, :, k], xp[:, :, k:k + (O - 1) * stride + 1:stride])
    return out if b is None else out + b.reshape(1, -1, 1)


@pytest.mark.parametrize("N,C,L,M,K,stride,pads,auto_pad,bias", [
    (1, 1, 576, 258, 256, 128, (0, 0), "NOTSET", False),  # silero's STFT basis
    (1, 129, 3, 128, 3, 1, (1, 1), "NOTSET", True),
    (1, 128, 3, 64, 3, 2, (1, 1), "NOTSET", True),
    (3, 4, 9, 5, 4, 3, (2, 0), "NOTSET", True),
    (2, 6, 11, 3, 3, 2, (0, 0), "SAME_UPPER", False),
    (2, 6, 10, 3, 4, 1, (0, 0), "SAME_LOWER", True),
    (1, 8, 5, 4, 1, 1, (0, 0), "VALID", True),
    (1, 16, 4000, 8, 5, 1, (2, 2), "NOTSET", True),  # too big for the gather: the slice-copy path
])
def test_conv1d_plan_time_path(N, C, L, M, K, stride, pads, auto_pad, bias):
    """Constant 1-D filters are planned once (a gather index per input shape); the result matches the direct
    formula and onnxruntime, also for a second input length and batch size through the same session."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((M, C, K)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32) if bias else None
    attrs = {"strides": [stride], "auto_pad": auto_pad}
    if auto_pad == "NOTSET":
        attrs["pads"] = list(pads)
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if bias else [])
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", C, "l"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    sess = onnxpy.InferenceSession(model)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for n, length in ((N, L), (N + 1, L + 3), (N, L)):
        x = rng.standard_normal((n, C, length)).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        want = ref.run(None, {"x": x})[0]
        assert got.shape == want.shape and got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        if auto_pad == "NOTSET":
            np.testing.assert_allclose(got, _ref_conv1d(x, w, b, pads[0], pads[1], stride), rtol=1e-4, atol=1e-4)
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.InvalidArgument, match="x"):
        sess.run(None, {"x": np.zeros((N, C + 1, L), np.float32)})


def test_conv_activation_fused_inside_if_branch():
    """Conv -> Relu inside an If branch (weights are branch initializers) becomes FusedConv, as in the main graph."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    branch = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1]), helper.make_node("Relu", ["c"], ["r"])],
        "then", [], [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["i"])], "else", [],
                              [helper.make_tensor_value_info("i", TensorProto.FLOAT, None)])
    model = _model([helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)],
                   [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    sess, got, want = _both(model, {"cond": np.array(True), "x": rng.standard_normal((1, 3, 7)).astype(np.float32)})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert (got[0] >= 0).all()
    then = sess._state.plan.graph.nodes[0].attrs["then_branch"]
    assert [n.op_type for n in then.nodes] == ["FusedConv"]


# --- PadConvFusion: Pad -> [Unsqueeze] -> 1-D Conv as ai.onnxpy.PadConv ------------------------------------------
def _padconv_model(x_shape, w, b, mode, pads, unsqueeze, conv_attrs, value=None, opset=17, extra_use=False):
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array(pads, np.int64), "pads")]
    pad_ins = ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "cv"))
        pad_ins.append("cv")
    nodes = [helper.make_node("Pad", pad_ins, ["p"], mode=mode)]
    cin = "p"
    if unsqueeze:
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "ax"))
        nodes.append(helper.make_node("Unsqueeze", ["p", "ax"], ["u"]))
        cin = "u"
    conv_ins = [cin, "W"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "B"))
        conv_ins.append("B")
    nodes.append(helper.make_node("Conv", conv_ins, ["y"], **conv_attrs))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_use:
        nodes.append(helper.make_node("Identity", ["p"], ["p_out"]))
        outs.append(helper.make_tensor_value_info("p_out", TensorProto.FLOAT, None))
    dims = [None] * len(x_shape)
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)], outs, inits, opset)


def _fused_ops(sess):
    return [st.node.op_type for st in sess._plan.steps]


PADCONV_CASES = [  # x shape, w shape, mode, pads, unsqueeze, conv attrs
    ((1, 512), (258, 1, 256), "reflect", [0, 64, 0, 64], True, {"strides": [128]}),  # silero's STFT
    ((2, 40), (6, 1, 5), "reflect", [0, 3, 0, 2], True, {"strides": [2]}),
    ((1, 30), (4, 1, 3), "edge", [0, 4, 0, 1], True, {"pads": [1, 1]}),
    ((1, 30), (4, 1, 3), "wrap", [0, 2, 0, 5], True, {}),
    ((1, 30), (4, 1, 1), "constant", [0, 2, 0, 3], True, {}),  # a single tap: the direct product, composed
    ((1, 3, 20), (5, 3, 3), "reflect", [0, 0, 2, 0, 0, 2], False, {"dilations": [1], "strides": [1]}),
    ((1, 3, 20), (5, 3, 4), "constant", [0, 0, -2, 0, 0, 3], False, {"strides": [3]}),  # a negative pad crops
]


@pytest.mark.parametrize("x_shape,w_shape,mode,pads,unsqueeze,attrs", PADCONV_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_pad_conv_fusion_matches_onnxruntime(x_shape, w_shape, mode, pads, unsqueeze, attrs, with_bias, monkeypatch):
    import onnxpy.ops.fused_small as padconv

    generic = []
    orig = padconv.pad_conv
    monkeypatch.setattr(padconv, "pad_conv", lambda *a, **k: generic.append(1) or orig(*a, **k))
    rng = np.random.default_rng(3)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
    model = _padconv_model(x_shape, w, b, mode, pads, unsqueeze, attrs)
    for shape in (x_shape, x_shape[:-1] + (x_shape[-1] + 7,), x_shape):  # (plans are remembered per shape)
        x = rng.standard_normal(shape).astype(np.float32)
        s, got, want = _both(model, {"x": x})
        assert _fused_ops(s) == ["PadConv"]
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
        so = onnxpy.SessionOptions()
        so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        plain = onnxpy.InferenceSession(model, so)
        assert "PadConv" not in _fused_ops(plain)
        np.testing.assert_allclose(got[0], plain.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert not generic  # every shape ran the plan-time gather, never the three ops


def test_pad_conv_fusion_declines_and_generic_path():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((4, 1, 3)).astype(np.float32)
    x = rng.standard_normal((1, 30)).astype(np.float32)
    for kw in ({"value": 1.5, "mode": "constant"}, {"extra_use": True, "mode": "reflect"}):
        mode = kw.pop("mode")
        model = _padconv_model((1, 30), w, None, mode, [0, 2, 0, 2], True, {}, **kw)
        s, got, want = _both(model, {"x": x})
        assert "PadConv" not in _fused_ops(s)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    model = _padconv_model((1, 30), w, None, "reflect", [0, 2, 0, 2], True, {})
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("optimization.disable_specified_optimizers", "PadConvFusion")
    assert "PadConv" not in _fused_ops(onnxpy.InferenceSession(model, so))
    # the generic kernel (what runs when the plan-time form declines) is the three ops in sequence
    from onnxpy.ops.fused_small import pad_conv

    y = pad_conv(x, w, None, pad_mode="reflect", pad_pads=[0, 2, 0, 2], unsqueeze_axes=[1], strides=[2])
    xp = np.pad(x, ((0, 0), (2, 2)), mode="reflect")[:, None]
    np.testing.assert_allclose(y, conv(xp, w, None, strides=[2]), rtol=1e-6)
    # a reflection wider than the input fails as the Pad would, naming the fused node
    s = onnxpy.InferenceSession(_padconv_model((1, 30), w, None, "reflect", [0, 40, 0, 2], True, {}))
    assert _fused_ops(s) == ["PadConv"]
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.Fail, match="PadConv"):
        s.run(None, {"x": x})


# --- GemmSumFusion: Add(Gemm, Gemm) as one GEMM ---------------------------------------------------------------
def _gemm_sum_model(k1, k2, n, trans_b, alpha=1.0, shared=False, trans_b2=None):
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((n, k1) if trans_b else (k1, n)).astype(np.float32)
    tb2 = trans_b if trans_b2 is None else trans_b2
    w2 = rng.standard_normal((n, k2) if tb2 else (k2, n)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "C1"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "C2")]
    nodes = [helper.make_node("Gemm", ["a", "W1", "C1"], ["g1"], transB=trans_b, alpha=alpha),
             helper.make_node("Gemm", ["b", "W2", "C2"], ["g2"], transB=tb2),
             helper.make_node("Add", ["g1", "g2"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if shared:
        nodes.append(helper.make_node("Neg", ["g1"], ["z"]))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    ins = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, k1]),
           helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, k2])]
    return _model(nodes, ins, outs, inits)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("rows", [(1, 1), (5, 5), (1, 4), (3, 1)])  # (different rows: Add broadcasts, generic path)
def test_gemm_sum_fusion_matches_onnxruntime(trans_b, rows, monkeypatch):
    import onnxpy.ops.fused_small as padconv

    generic = []
    orig = padconv.gemm_sum
    monkeypatch.setattr(padconv, "gemm_sum", lambda *a, **k: generic.append(1) or orig(*a, **k))
    rng = np.random.default_rng(6)
    model = _gemm_sum_model(7, 9, 12, trans_b)
    feeds = {"a": rng.standard_normal((rows[0], 7)).astype(np.float32),
             "b": rng.standard_normal((rows[1], 9)).astype(np.float32)}
    s, got, want = _both(model, feeds)
    assert _fused_ops(s) == ["GemmSum"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert bool(generic) == (rows[0] != rows[1])


def test_gemm_sum_fusion_declines():
    rng = np.random.default_rng(7)
    feeds = {"a": rng.standard_normal((2, 7)).astype(np.float32), "b": rng.standard_normal((2, 9)).astype(np.float32)}
    for kw in ({"alpha": 2.0}, {"shared": True}, {"trans_b2": 0}):
        model = _gemm_sum_model(7, 9, 12, 1, **kw)
        s, got, want = _both(model, feeds)
        assert "GemmSum" not in _fused_ops(s)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("optimization.disable_specified_optimizers", "GemmSumFusion")
    assert "GemmSum" not in _fused_ops(onnxpy.InferenceSession(_gemm_sum_model(7, 9, 12, 1), so))


# --- ConvResidualFusion: Conv -> Add / Sum [-> Relu] as ai.onnxpy.ConvAdd ---------------------------------------
def _residual_model(x_shape, w_shape, z_shape, *, op="Add", conv_first=True, relu=True, bias=True, conv_attrs=None,
                    z_output=False, conv_output=False, dtype=np.float32):
    rng = np.random.default_rng(8)
    tp = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(dtype), "W")]
    cin = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[0]).astype(dtype), "B"))
        cin.append("B")
    nodes = [helper.make_node("Relu", ["r"], ["z"]),  # the residual: a fresh value the Add may take over
             helper.make_node("Conv", cin, ["c"], **(conv_attrs or {})),
             helper.make_node(op, ["c", "z"] if conv_first else ["z", "c"], ["s"])]
    outs = ["y"]
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    if z_output:
        outs.append("z")
    if conv_output:
        outs.append("c")
    ins = [helper.make_tensor_value_info("x", tp, x_shape), helper.make_tensor_value_info("r", tp, z_shape)]
    return _model(nodes, ins, [helper.make_tensor_value_info(o, tp, None) for o in outs], inits)


RESIDUAL_CASES = [  # x shape, w shape, z shape, conv attrs (outputs >= 131072 elements take the accumulating GEMMs)
    ((1, 64, 56, 56), (256, 64, 1, 1), (1, 256, 56, 56), {}),  # 1x1, bias folded in the GEMM (M >= C)
    ((1, 512, 32, 32), (128, 512, 1, 1), (1, 128, 32, 32), {}),  # 1x1, bias added after (M < C)
    ((1, 64, 64, 64), (256, 64, 1, 1), (1, 256, 32, 32), {"strides": [2, 2]}),  # strided 1x1 (projection)
    ((1, 16, 96, 96), (16, 16, 3, 3), (1, 16, 96, 96), {"pads": [1, 1, 1, 1]}),  # im2col GEMM
    ((1, 64, 48, 48), (64, 64, 3, 3), (1, 64, 48, 48), {"pads": [1, 1, 1, 1]}),  # per-tap GEMMs
    ((1, 128, 40, 40), (32, 128, 3, 3), (1, 32, 40, 40), {"pads": [1, 1, 1, 1]}),  # stacked taps (added after)
    ((1, 8, 10, 10), (8, 8, 3, 3), (1, 8, 10, 10), {"pads": [1, 1, 1, 1]}),  # small: conv, then the add
    ((1, 8, 10, 10), (8, 8, 3, 3), (1, 8, 1, 1), {"pads": [1, 1, 1, 1]}),  # Z broadcasts: Add's result
    ((1, 64, 40, 40), (128, 16, 1, 1), (1, 128, 40, 40), {"group": 4}),  # grouped: conv, then the add
]


@pytest.mark.parametrize("x_shape,w_shape,z_shape,attrs", RESIDUAL_CASES)
@pytest.mark.parametrize("op,conv_first,relu,bias", [("Add", True, True, True), ("Sum", False, False, False)])
def test_conv_residual_fusion_matches_onnxruntime(x_shape, w_shape, z_shape, attrs, op, conv_first, relu, bias,
                                                  monkeypatch):
    import onnxpy.ops.conv as conv_mod

    acc = []
    orig = conv_mod._conv2d_fast
    monkeypatch.setattr(conv_mod, "_conv2d_fast", lambda *a, **k: acc.append(k.get("acc", False)) or orig(*a, **k))
    rng = np.random.default_rng(9)
    model = _residual_model(x_shape, w_shape, z_shape, op=op, conv_first=conv_first, relu=relu, bias=bias,
                            conv_attrs=attrs)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32),
             "r": rng.standard_normal(z_shape).astype(np.float32)}
    s, got, want = _both(model, feeds)
    assert _fused_ops(s) == ["Relu", "ConvAdd"]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    out_size = int(np.prod(z_shape))
    big = out_size >= conv_mod._ACC_MIN and attrs.get("group", 1) == 1 and z_shape[2:] != (1, 1)
    assert (True in acc) == big  # the residual received the convolution's GEMMs exactly when it is large
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    plain = onnxpy.InferenceSession(model, so)
    assert "ConvAdd" not in _fused_ops(plain)
    np.testing.assert_allclose(got[0], plain.run(None, feeds)[0], rtol=1e-5, atol=1e-4)
    # twice in a row (the donated residual is a fresh array each run)
    np.testing.assert_allclose(s.run(None, feeds)[0], want[0], rtol=1e-4, atol=1e-4)


def test_conv_residual_fusion_keeps_visible_values():
    rng = np.random.default_rng(10)
    shape = (1, 64, 56, 56)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "r": rng.standard_normal((1, 256, 56, 56)).astype(
        np.float32)}
    # the residual is also a graph output: it must not be overwritten (the convolution then the add)
    model = _residual_model(shape, (256, 64, 1, 1), (1, 256, 56, 56), z_output=True)
    s, got, want = _both(model, feeds)
    assert "ConvAdd" in _fused_ops(s)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    # the convolution's output is visible: no fusion
    model = _residual_model(shape, (256, 64, 1, 1), (1, 256, 56, 56), conv_output=True)
    s, got, want = _both(model, feeds)
    assert "ConvAdd" not in _fused_ops(s)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    # a constant addend after a constant scale (PP-OCRv4 det's MobileOne blocks: conv * w0 + w1, the basic level
    # folds the scale first) is no residual: no ConvAdd, the addend ends up in the bias
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array([3.0], np.float32), "three")]
    inits.append(numpy_helper.from_array(np.array([0.7], np.float32), "w0"))
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["w0", "c"], ["n"]),
             helper.make_node("Add", ["n", "three"], ["s"]), helper.make_node("HardSigmoid", ["s"], ["h"]),
             helper.make_node("Mul", ["s", "h"], ["y"])]
    vi = helper.make_tensor_value_info
    model = _model(nodes, [vi("x", TensorProto.FLOAT, (1, 8, 12, 12))], [vi("y", TensorProto.FLOAT, None)], inits)
    s, got, want = _both(model, {"x": feeds["x"][:, :8, :12, :12].copy()})
    assert "ConvAdd" not in _fused_ops(s) and "Add" not in _fused_ops(s)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    # float64 convolutions and disabled_optimizers: no fusion
    feeds64 = {k: v.astype(np.float64) for k, v in feeds.items()}
    s = onnxpy.InferenceSession(_residual_model(shape, (256, 64, 1, 1), (1, 256, 56, 56), dtype=np.float64))
    assert "ConvAdd" not in _fused_ops(s)
    assert s.run(None, feeds64)[0].dtype == np.float64
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("optimization.disable_specified_optimizers", "ConvResidualFusion")
    model = _residual_model(shape, (256, 64, 1, 1), (1, 256, 56, 56))
    assert "ConvAdd" not in _fused_ops(onnxpy.InferenceSession(model, so))


def test_conv_add_kernel_generic_and_in_place():
    from onnxpy.ops.contrib_fused import conv_add

    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    w = rng.standard_normal((256, 64, 1, 1)).astype(np.float32)
    b = rng.standard_normal(256).astype(np.float32)
    z = rng.standard_normal((1, 256, 56, 56)).astype(np.float32)
    want = np.maximum(conv(x, w, b) + z, 0)
    np.testing.assert_allclose(conv_add(x, w, b, z, activation="Relu"), want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(conv_add(x, w, b, z[:, :, :1, :1]), conv(x, w, b) + z[:, :, :1, :1], rtol=1e-6)
    with pytest.raises(ValueError, match="activation"):
        conv_add(x, w, b, z, activation="Tanh")
    for a in (w, b):
        a.flags.writeable = False
    run = conv_add.specialize((NOT_CONST, w, b, NOT_CONST), {"activation": "Relu"})
    zc = z.copy()
    y = run(x, w, b, zc, _donated=(3,))
    assert y is zc  # accumulated into the handed-over residual
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
    zc = z.copy()
    y = run(x, w, b, zc)  # not handed over: the residual is left alone
    np.testing.assert_array_equal(zc, z)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)
    # a residual of another shape is not written
    zs = z[:, :, :28].copy()
    with pytest.raises(ValueError):
        run(x, w, b, zs, _donated=(3,))
    np.testing.assert_array_equal(zs, z[:, :, :28])


ACC_PATH_CASES = [  # x shape, w shape, pads, strides, group: every 2-D fast path, accumulating into its output
    ((2, 64, 20, 20), (256, 64, 1, 1), [0, 0, 0, 0], [1, 1], 1),  # 1x1, folded bias
    ((2, 64, 20, 20), (16, 64, 1, 1), [0, 0, 0, 0], [2, 2], 1),  # strided 1x1, bias after
    ((1, 64, 20, 20), (64, 16, 1, 1), [0, 0, 0, 0], [1, 1], 4),  # grouped 1x1
    ((2, 8, 15, 17), (12, 8, 3, 3), [1, 0, 2, 1], [1, 1], 1),  # im2col
    ((1, 8, 15, 17), (12, 8, 5, 5), [2, 2, 2, 2], [2, 2], 1),  # im2col from stride phases
    ((1, 64, 30, 30), (64, 64, 3, 3), [1, 1, 1, 1], [1, 1], 1),  # per-tap GEMMs
    ((1, 64, 30, 30), (64, 64, 3, 3), [1, 1, 1, 1], [2, 2], 1),  # per-tap GEMMs, strided
    ((1, 128, 12, 12), (32, 128, 3, 3), [1, 1, 1, 1], [1, 1], 1),  # stacked taps
    ((1, 256, 28, 28), (512, 256, 3, 3), [1, 1, 1, 1], [1, 1], 1),  # Winograd
    ((1, 16, 14, 14), (16, 1, 3, 3), [1, 1, 1, 1], [1, 1], 16),  # depthwise
]


@pytest.mark.parametrize("x_shape,w_shape,pads,strides,group", ACC_PATH_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_fast_paths_accumulate(x_shape, w_shape, pads, strides, group, dtype):
    import onnxpy.ops.conv as conv_mod

    rng = np.random.default_rng(12)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    want = conv(x, w, b, pads=pads, strides=strides, group=group)
    z = rng.standard_normal(want.shape).astype(dtype)
    out = z.copy()
    got = conv_mod._conv2d_fast(x, w, b, pads[:2], pads[2:], strides, [1, 1], group, (None, None), out=out, acc=True)
    assert got is out
    np.testing.assert_allclose(got, want + z, rtol=1e-4, atol=1e-3)
    # a non-contiguous destination (a channel range of a larger buffer) accumulates too
    big = np.concatenate([z, z], axis=1)
    view = big[:, : z.shape[1]]
    got = conv_mod._conv2d_fast(x, w, b, pads[:2], pads[2:], strides, [1, 1], group, (None, None), out=view,
                                acc=True)
    np.testing.assert_allclose(view, want + z, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(big[:, z.shape[1]:], z)


# --- ConvShuffleFusion: grouped 1x1 Conv [-> activation] -> channel shuffle as ai.onnxpy.ConvShuffle ------------
def _shuffle_model(C, M, G, H, W, *, act=None, bias=True, split=None, shape1=None, shape2=None, k=1,
                   conv_output=False, dtype=np.float32):
    """Conv(group=G) [-> act] -> Reshape(shape1) -> Transpose [0, 2, 1, 3, 4] -> Reshape(shape2), ShuffleNet's
    channel shuffle; ``split`` groups the shuffle over (default: the conv's G)."""
    rng = np.random.default_rng(11)
    tp = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    s = split or G
    shape1 = shape1 if shape1 is not None else [-1, s, M // s, H, W]
    shape2 = shape2 if shape2 is not None else [-1, M, H, W]
    inits = [numpy_helper.from_array(rng.standard_normal((M, C // G, k, k)).astype(dtype), "W"),
             numpy_helper.from_array(np.array(shape1, np.int64), "s1"),
             numpy_helper.from_array(np.array(shape2, np.int64), "s2")]
    cin = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(M).astype(dtype), "B"))
        cin.append("B")
    nodes = [helper.make_node("Conv", cin, ["c"], group=G, pads=[k // 2] * 4)]
    y = "c"
    if act:
        nodes.append(helper.make_node(act, ["c"], ["a"]))
        y = "a"
    nodes += [helper.make_node("Reshape", [y, "s1"], ["r1"]), helper.make_node("Transpose", ["r1"], ["t"],
                                                                                perm=[0, 2, 1, 3, 4]),
              helper.make_node("Reshape", ["t", "s2"], ["y"])]
    outs = [helper.make_tensor_value_info("y", tp, None)]
    if conv_output:
        outs.append(helper.make_tensor_value_info(y, tp, None))
    return _model(nodes, [helper.make_tensor_value_info("x", tp, [None, C, H, W])], outs, inits)


@pytest.mark.parametrize("C,M,G,H,W", [(24, 112, 4, 6, 5), (12, 12, 3, 7, 7), (8, 16, 2, 1, 9), (16, 8, 2, 5, 5)])
@pytest.mark.parametrize("act", [None, "Relu", "Sigmoid"])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_shuffle_fusion_matches_onnxruntime(C, M, G, H, W, act, bias, monkeypatch):
    import onnxpy.ops.fused_small as fs

    generic = []
    orig = fs.conv_shuffle
    monkeypatch.setattr(fs, "conv_shuffle", lambda *a, **k: generic.append(1) or orig(*a, **k))
    model = _shuffle_model(C, M, G, H, W, act=act, bias=bias)
    rng = np.random.default_rng(12)
    for n in (1, 2, 1):  # (the fit of the reshapes is remembered per input shape)
        x = rng.standard_normal((n, C, H, W)).astype(np.float32)
        s, got, want = _both(model, {"x": x})
        assert _fused_ops(s) == ["ConvShuffle"]
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        so = onnxpy.SessionOptions()
        so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        np.testing.assert_array_equal(got[0], onnxpy.InferenceSession(model, so).run(None, {"x": x})[0])
    assert not generic  # the plan-time GEMMs into the shuffled channels ran every time


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_shuffle_bias_folded_into_the_gemms(dtype):
    """Where each group has at least as many outputs as inputs the bias rides in the GEMMs on a row of ones (added
    last, so the sums round as the separate pass did): the same bits as the unfolded kernel, batches included."""
    import onnxpy.ops.fused_small as fs

    rng = np.random.default_rng(14)
    G, n, Cg = 4, 28, 6
    W = rng.standard_normal((G * n, Cg, 1, 1)).astype(dtype)
    B = rng.standard_normal(G * n).astype(dtype)
    kw = dict(group=G, shape1=[-1, G, n, 9, 7], shape2=[-1, G * n, 9, 7], activation="Relu")
    runs = {}
    try:
        for fold in (True, False):
            fs._FOLD_BIAS = fold
            runs[fold] = fs._conv_shuffle_specialize((None, W, B), kw)
    finally:
        fs._FOLD_BIAS = True
    for N in (1, 3):
        x = rng.standard_normal((N, G * Cg, 9, 7)).astype(dtype)
        got = runs[True](x, W, B)
        np.testing.assert_array_equal(got, runs[False](x, W, B))
        np.testing.assert_allclose(got, fs.conv_shuffle(x, W, B, **kw), rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-5 if dtype == np.float32 else 1e-12)


def test_conv_shuffle_float64_and_fixed_shapes():
    rng = np.random.default_rng(13)
    model = _shuffle_model(8, 8, 4, 3, 3, shape1=[2, 4, 2, 3, 3], shape2=[2, 8, 3, 3], dtype=np.float64)
    x = rng.standard_normal((2, 8, 3, 3))
    s = onnxpy.InferenceSession(model)  # (onnxruntime has no float64 Conv: the unoptimized graph is the reference)
    assert _fused_ops(s) == ["ConvShuffle"]
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = onnxpy.InferenceSession(model, so).run(None, {"x": x})
    np.testing.assert_allclose(s.run(None, {"x": x})[0], want[0], rtol=1e-12, atol=1e-12)
    # another batch than the constants name: the reshapes fail, naming the fused node, as they fail unfused
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.Fail, match="ConvShuffle.*Reshape|Reshape.*ConvShuffle"):
        s.run(None, {"x": x[:1]})


def test_conv_shuffle_fusion_declines():
    rng = np.random.default_rng(14)
    x = rng.standard_normal((1, 8, 4, 4)).astype(np.float32)
    for kw in ({"split": 2}, {"k": 3}, {"conv_output": True}, {"shape1": [1, 4, 2, 16, 1]}):
        # a shuffle over other groups than the conv's, a 3x3 conv, a visible conv output: not fused; a split of
        # the positions instead of the channels is fused (the constants name the groups) and runs the three ops
        model = _shuffle_model(8, 8, 4, 4, 4, act="Relu", **kw)
        s, got, want = _both(model, {"x": x})
        assert ("ConvShuffle" in _fused_ops(s)) == ("shape1" in kw)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("optimization.disable_specified_optimizers", "ConvShuffleFusion")
    assert "ConvShuffle" not in _fused_ops(onnxpy.InferenceSession(_shuffle_model(8, 8, 4, 4, 4), so))
    # the generic kernel is the ops in sequence
    from onnxpy.ops.fused_small import conv_shuffle

    w = rng.standard_normal((8, 2, 1, 1)).astype(np.float32)
    y = conv_shuffle(x, w, None, shape1=[1, 4, 2, 4, 4], shape2=[1, 8, 4, 4], group=4, activation="Relu")
    ref = np.maximum(conv(x, w, None, group=4), 0).reshape(1, 4, 2, 4, 4).transpose(0, 2, 1, 3, 4).reshape(1, 8, 4, 4)
    np.testing.assert_array_equal(y, ref)
