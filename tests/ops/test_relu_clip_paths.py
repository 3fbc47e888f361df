"""ReLU and one-sided Clip through numpy's clip loop (ops/_ew_math.relu / clamp): the same values as np.maximum /
np.minimum on both sides of the size threshold, NaN propagated, in place or not, every kernel that uses them checked
against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.ops import _ew_math

ort = pytest.importorskip("onnxruntime")

_SPECIAL = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3.5, -3.5]


def _data(n, dtype, seed=0):
    x = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    x[:len(_SPECIAL)] = np.asarray(_SPECIAL[:n], dtype=dtype)
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("n", [3, _ew_math.CLIP_MIN - 1, _ew_math.CLIP_MIN, 50_000])
def test_relu_matches_maximum(dtype, n):
    x = _data(n, dtype) if np.dtype(dtype).kind == "f" else np.arange(-n // 2, n - n // 2, dtype=dtype)
    exp = np.maximum(x, dtype(0))
    got = _ew_math.relu(x)
    assert got.dtype == x.dtype and got is not x
    np.testing.assert_array_equal(got, exp)  # (NaN == NaN here; -0.0 == 0.0)
    y = x.copy()
    assert _ew_math.relu(y, y) is y
    np.testing.assert_array_equal(y, exp)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("n", [7, 4096])
@pytest.mark.parametrize("lo,hi", [(-0.5, None), (None, 0.25), (-0.5, 0.25), (0.5, -0.5), (None, None)])
def test_clamp_matches_maximum_minimum(dtype, n, lo, hi):
    x = _data(n, dtype, seed=1)
    t = np.dtype(dtype).type
    lo_, hi_ = (None if lo is None else t(lo)), (None if hi is None else t(hi))
    exp = x
    if lo_ is not None:
        exp = np.maximum(exp, lo_)
    if hi_ is not None:
        exp = np.minimum(exp, hi_)
    np.testing.assert_array_equal(_ew_math.clamp(x, lo_, hi_), exp)
    out = np.empty_like(x)
    assert _ew_math.clamp(x, lo_, hi_, out=out) is out
    np.testing.assert_array_equal(out, exp)


def test_relu_strided_and_multidimensional():
    x = _data(4 * 3000, np.float32).reshape(4, 3000)[:, ::2]
    np.testing.assert_array_equal(_ew_math.relu(x), np.maximum(x, np.float32(0)))


def _session_pair(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()
    return onnxpy.InferenceSession(data), ort.InferenceSession(data, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("op,attrs,extra", [
    ("Relu", {}, []),
    ("Clip", {}, ["lo"]),
    ("Clip", {}, ["", "hi"]),
    ("Clip", {}, ["lo", "hi"]),
    ("Elu", {"alpha": 0.7}, []),
    ("Celu", {"alpha": 1.3}, []),
    ("Softplus", {}, []),
    ("LeakyRelu", {"alpha": -0.3}, []),
    ("PRelu", {}, ["slope"]),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, []),
    ("HardSwish", {}, []),
])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 8, 40, 40)])
def test_activation_kernels_vs_onnxruntime(op, attrs, extra, shape):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(np.float32)
    inits = [numpy_helper.from_array(np.float32(-0.4), "lo"), numpy_helper.from_array(np.float32(0.6), "hi"),
             numpy_helper.from_array(rng.standard_normal((shape[1],) + (1,) * (len(shape) - 2)).astype(np.float32),
                                     "slope")]
    # a second node consumes the activation in place (the kernel gets a donated input): x + x -> op -> y
    nodes = [helper.make_node("Add", ["x", "x"], ["t"]), helper.make_node(op, ["t"] + extra, ["y"], **attrs)]
    vi = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    vo = [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)]
    py, rt = _session_pair(nodes, vi, vo, inits)
    np.testing.assert_allclose(py.run(None, {"x": x})[0], rt.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset,attrs", [(6, {"min": -0.25}), (6, {"max": 0.5}), (6, {"min": -0.25, "max": 0.5})])
def test_clip6_one_and_two_sided(opset, attrs):
    x = np.random.default_rng(3).standard_normal((4, 3000)).astype(np.float32)
    vi = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)]
    vo = [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)]
    py, rt = _session_pair([helper.make_node("Clip", ["x"], ["y"], **attrs)], vi, vo, opset=opset)
    np.testing.assert_array_equal(py.run(None, {"x": x})[0], rt.run(None, {"x": x})[0])


def test_fused_conv_relu_large_output_vs_onnxruntime():
    """Conv -> Relu fused at the extended level (FusedConv's ReLU in place) on an output above the threshold."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 8, 32, 32)).astype(np.float32)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "B")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    vi = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)]
    vo = [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 16, 32, 32))]
    py, rt = _session_pair(nodes, vi, vo, [w, b])
    got = py.run(None, {"x": x})[0]
    assert (got >= 0).all() and (got == 0).mean() > 0.2
    np.testing.assert_allclose(got, rt.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,cs", [
    ((1, 64, 56, 56), (64, 1, 1)),  # DenseNet's pre-activation floor: a value per channel over 3136-element rows
    ((1, 8, 64, 64), (1, 8, 1, 1)),
    ((4, 3000), ()), ((4, 3000), (1,)), ((4, 3000), (4, 1)),
    ((2, 8, 8), (8, 1)),  # short rows: numpy's maximum
    ((3000,), (1, 1)),  # the scalar has more axes: the result does too
    ((3, 4, 2048), (3, 1, 1)), ((16, 40), (40,)),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_max_min_with_broadcast_bound(xs, cs, dtype):
    from onnxpy.ops import elementwise as E
    rng = np.random.default_rng(5)
    x = rng.standard_normal(xs).astype(dtype)
    c = rng.standard_normal(cs).astype(dtype)
    x.flat[::97] = np.nan
    if c.size > 2:
        c.flat[1] = np.nan
    for f, ref in ((E.max_, np.maximum), (E.min_, np.minimum)):
        for args in ((x, c), (c, x)):
            got, want = f(*args), ref(*args)
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_preactivation_densenet_block_vs_onnxruntime():
    """BatchNorm -> Relu -> 1x1 Conv (DenseNet) becomes Max(x, per-channel floor) -> Conv at the extended level;
    on a 56x56 plane the floor runs through the clip loop."""
    rng = np.random.default_rng(6)
    C, M = 16, 8
    x = rng.standard_normal((1, C, 56, 56)).astype(np.float32)
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, C).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "m"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, C).astype(np.float32), "v"),
             numpy_helper.from_array(rng.standard_normal((M, C, 1, 1)).astype(np.float32), "W")]
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]), helper.make_node("Conv", ["r", "W"], ["y"])]
    vi = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)]
    vo = [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, M, 56, 56))]
    py, rt = _session_pair(nodes, vi, vo, inits)
    np.testing.assert_allclose(py.run(None, {"x": x})[0], rt.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
