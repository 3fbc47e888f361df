"""Conv / FusedConv specialised at plan time on constant weights: same results (and errors) as the generic kernel,
which runs when the weights are fed as inputs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy

RNG = np.random.default_rng(11)


def _sessions(op, x_shape, w, b, attrs, domain="", z_shape=None, dtype=np.float32, any_x=False):
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    ins = ["X", "W"] + (["B"] if b is not None else ([""] if z_shape else [])) + (["Z"] if z_shape else [])
    node = helper.make_node(op, ins, ["Y"], domain=domain or None, **attrs)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    out = []
    for const in (True, False):
        inits = [numpy_helper.from_array(w, "W")] + ([numpy_helper.from_array(b, "B")] if b is not None else [])
        vis = [helper.make_tensor_value_info("X", elem, None if any_x else list(x_shape[:2]) + ["h", "w"])]
        if z_shape:
            vis.append(helper.make_tensor_value_info("Z", elem, list(z_shape)))
        if not const:
            vis += [helper.make_tensor_value_info(i.name, elem, list(i.dims)) for i in inits]
        g = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info("Y", elem, None)],
                              inits if const else [])
        m = helper.make_model(g, opset_imports=opsets)
        m.ir_version = 8
        out.append(onnxpy.InferenceSession(m.SerializeToString()))
    return out


CASES = [  # x shape, w shape, attrs
    ((1, 16, 1, 1), (64, 16, 1, 1), {}),
    ((2, 8, 5, 7), (12, 8, 1, 1), {}),
    ((1, 8, 20, 20), (8, 8, 1, 1), {}),  # large plane: the general pointwise path
    ((1, 12, 6, 6), (12, 4, 1, 1), {"group": 3}),
    ((1, 8, 9, 11), (6, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 8, 9, 11), (6, 8, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 6, 10, 9), (6, 1, 5, 5), {"pads": [2, 2, 2, 2], "group": 6}),
    ((1, 4, 8, 8), (4, 4, 2, 2), {"strides": [2, 1], "dilations": [1, 2]}),
    ((1, 4, 7, 7), (4, 4, 1, 1), {"pads": [1, 0, 0, 1]}),
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_specialised_equals_generic(x_shape, w_shape, attrs, with_bias, dtype):
    w = RNG.standard_normal(w_shape).astype(dtype)
    b = RNG.standard_normal(w_shape[0]).astype(dtype) if with_bias else None
    fast, generic = _sessions("Conv", x_shape, w, b, attrs, dtype=dtype)
    x = RNG.standard_normal(x_shape).astype(dtype)
    feeds = {"X": x}
    got = fast.run(None, feeds)[0]
    want = generic.run(None, {**feeds, "W": w, **({"B": b} if with_bias else {})})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # a second input shape through the same session (pads are remembered per shape)
    x2 = RNG.standard_normal(x_shape[:2] + tuple(d + 1 for d in x_shape[2:])).astype(dtype)
    got2 = fast.run(None, {"X": x2})[0]
    want2 = generic.run(None, {"X": x2, "W": w, **({"B": b} if with_bias else {})})[0]
    np.testing.assert_allclose(got2, want2, rtol=1e-5, atol=1e-5)


def test_conv_specialised_reports_bad_input_like_generic():
    w = RNG.standard_normal((4, 3, 1, 1)).astype(np.float32)
    fast, generic = _sessions("Conv", (1, 3, 2, 2), w, None, {}, any_x=True)
    bads = (np.zeros((1, 5, 2, 2), np.float32), np.zeros((3, 2, 2), np.float32), np.zeros((1, 3, 2, 2), np.float64))
    for bad in bads:
        errors = []
        for s, extra in ((fast, {}), (generic, {"W": w})):
            with pytest.raises(Exception) as info:
                s.run(None, {"X": bad, **extra})
            errors.append((type(info.value), str(info.value).split("Status Message:")[-1]))
        assert errors[0] == errors[1]


@pytest.mark.parametrize("activation,params", [("Relu", []), ("LeakyRelu", [0.1]), ("Clip", [-0.5, 0.5]),
                                               ("HardSigmoid", [0.2, 0.5]), ("Sigmoid", []), ("", [])])
@pytest.mark.parametrize("x_shape,w_shape,attrs", [CASES[0], CASES[4], CASES[6]])
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv_specialised_equals_generic(activation, params, x_shape, w_shape, attrs, with_z):
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    a = dict(attrs)
    if activation:
        a["activation"] = activation
    if params:
        a["activation_params"] = params
    x = RNG.standard_normal(x_shape).astype(np.float32)
    y_shape = _sessions("Conv", x_shape, w, b, attrs)[0].run(None, {"X": x})[0].shape
    z_shape = y_shape if with_z else None
    fast, generic = _sessions("FusedConv", x_shape, w, b, a, domain="com.microsoft", z_shape=z_shape)
    feeds = {"X": x}
    if with_z:
        feeds["Z"] = RNG.standard_normal(y_shape).astype(np.float32)
    got = fast.run(None, feeds)[0]
    want = generic.run(None, {**feeds, "W": w, "B": b})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c,hw,k,pads,dil,mult", [(128, 7, 3, 1, 1, 1), (96, 5, 5, 2, 1, 1), (160, 7, 3, 2, 2, 1),
                                                 (128, 6, 3, 0, 1, 1), (96, 7, 3, 1, 1, 2)])
def test_depthwise_tiny_planes_match_onnxruntime(c, hw, k, pads, dil, mult):
    ort = pytest.importorskip("onnxruntime")
    w = RNG.standard_normal((c * mult, 1, k, k)).astype(np.float32)
    b = RNG.standard_normal(c * mult).astype(np.float32)
    fast, _ = _sessions("Conv", (2, c, hw, hw), w, b, {"group": c, "pads": [pads] * 4, "dilations": [dil, dil]})
    g = helper.make_graph([helper.make_node("Conv", ["X", "W", "B"], ["Y"], group=c, pads=[pads] * 4,
                                            dilations=[dil, dil])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, c, hw, hw])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = RNG.standard_normal((2, c, hw, hw)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    np.testing.assert_allclose(fast.run(None, {"X": x})[0], want, rtol=1e-4, atol=1e-4)


CASES_1D = [  # x shape (N, C, L), w shape (M, C, K), attrs
    ((1, 64, 1), (128, 64, 3), {"pads": [1, 1]}),  # one frame: only the centre tap reads the input
    ((1, 64, 2), (64, 64, 3), {"pads": [1, 1], "strides": [2]}),  # the first tap reads only padding
    ((1, 128, 1), (1, 128, 1), {}),  # pointwise on one frame (a plain product)
    ((2, 16, 5), (8, 16, 1), {}),  # pointwise, batch 2
    ((1, 16, 5), (8, 16, 1), {"pads": [1, 0]}),  # one tap, but it reads padding: the gather
    ((1, 16, 5), (8, 16, 1), {"strides": [2]}),  # one strided tap: the gather
    ((1, 8, 2), (4, 8, 5), {"pads": [2, 2]}),  # kernel wider than the input
    ((1, 8, 3), (4, 8, 3), {"auto_pad": "SAME_UPPER"}),
    ((2, 8, 9), (6, 8, 3), {"pads": [1, 1], "strides": [2]}),
    ((1, 1, 576), (258, 1, 256), {"strides": [128]}),  # silero's STFT
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES_1D)
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv1d_specialised_equals_generic(x_shape, w_shape, attrs, with_bias):
    """The plan-time 1-D path (taps that read only padding left out, a single plain tap as a direct product)
    against the generic kernel, and against onnxruntime; a second input length through the same session."""
    ort = pytest.importorskip("onnxruntime")
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
    node = helper.make_node("Conv", ["X", "W"] + (["B"] if with_bias else []), ["Y"], **attrs)
    inits = [numpy_helper.from_array(w, "W")] + ([numpy_helper.from_array(b, "B")] if with_bias else [])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, x_shape[1],
                                                                                                None])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    fast = onnxpy.InferenceSession(m.SerializeToString())
    oracle = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    from onnxpy.ops.conv import conv

    for L in (x_shape[2], x_shape[2] + 1, x_shape[2]):
        x = RNG.standard_normal(x_shape[:2] + (L,)).astype(np.float32)
        got = fast.run(None, {"X": x})[0]
        want = conv(x, w, b, **attrs)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, oracle.run(None, {"X": x})[0], rtol=1e-4, atol=1e-4)
