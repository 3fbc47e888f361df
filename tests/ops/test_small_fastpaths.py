"""Fast paths for small tensors (1-D Conv, cached constant Slice/Concat, reflect/edge Pad) against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy

ort = pytest.importorskip("onnxruntime")


def _run_both(model, feeds):
    data = model.SerializeToString()
    got = onnxpy.InferenceSession(data).run(None, feeds)
    exp = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, exp


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("C,L,M,K,stride,pads,bias", [
    (1, 576, 20, 256, 128, [0, 0], False),
    (7, 3, 5, 3, 1, [1, 1], True),
    (6, 3, 4, 3, 2, [1, 1], True),
    (4, 1, 6, 3, 1, [1, 1], True),
    (3, 9, 2, 1, 1, [0, 0], True),
    (3, 9, 2, 2, 3, [2, 0], False),
])
def test_conv1d_small(C, L, M, K, stride, pads, bias):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, C, L)).astype(np.float32)
    w = rng.standard_normal((M, C, K)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    ins = ["X", "W"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(M).astype(np.float32), "B"))
        ins.append("B")
    node = helper.make_node("Conv", ins, ["Y"], kernel_shape=[K], strides=[stride], pads=pads)
    m = _model([node], [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
               [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    got, exp = _run_both(m, {"X": x})
    assert got[0].shape == exp[0].shape
    np.testing.assert_allclose(got[0], exp[0], rtol=1e-4, atol=1e-4)


def test_constant_slice_concat_cached_and_repeatable():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    c = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    inits = [numpy_helper.from_array(w, "w"), c("s0", [0]), c("e0", [2]), c("s1", [6]), c("e1", [8]),
             c("ax", [0]), c("st", [-1]), c("sb", [-1]), c("eb", [-100])]
    nodes = [helper.make_node("Slice", ["w", "s0", "e0", "ax"], ["a"]),
             helper.make_node("Slice", ["w", "s1", "e1", "ax"], ["b"]),
             helper.make_node("Slice", ["w", "sb", "eb", "ax", "st"], ["r"]),
             helper.make_node("Concat", ["b", "a", "r"], ["cat"], axis=0),
             helper.make_node("Add", ["cat", "X"], ["Y"]),
             helper.make_node("Slice", ["X", "s0", "e0", "ax"], ["Z"])]
    m = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
               [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("cat", TensorProto.FLOAT, None),
                helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)], inits)
    sess = onnxpy.InferenceSession(m.SerializeToString())
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(3):
        x = rng.standard_normal((12, 3)).astype(np.float32)
        got = sess.run(None, {"X": x})
        exp = ref.run(None, {"X": x})
        for g, e in zip(got, exp):
            np.testing.assert_array_equal(g, e)
        got[1][:] = 0  # callers may write into results; the next run must not see it
        got[2][:] = 0


@pytest.mark.parametrize("mode", ["reflect", "edge"])
@pytest.mark.parametrize("shape,pads", [((1, 512), [0, 0, 0, 64]), ((3, 4), [2, 3, 2, 3]),
                                        ((2, 3, 4), [0, 1, 2, 1, 1, 3]), ((5,), [4, 4])])
def test_pad_reflect_edge(mode, shape, pads):
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    if mode == "reflect" and any(p > d - 1 for p, d in zip(pads, list(shape) * 2)):
        pytest.skip("reflect pad larger than dim - 1")
    node = helper.make_node("Pad", ["X", "p"], ["Y"], mode=mode)
    m = _model([node], [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
               [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
               [numpy_helper.from_array(np.array(pads, np.int64), "p")])
    got, exp = _run_both(m, {"X": x})
    np.testing.assert_array_equal(got[0], exp[0])
    np.testing.assert_array_equal(got[0], np.pad(x, list(zip(pads[:len(shape)], pads[len(shape):])), mode=mode))


_EXTREMES = [0.0, -0.0, 0.3, -1.0, 5.0, -20.0, 80.0, -80.0, -88.0, -88.8, 88.8, -100.0, -709.0, -710.0, 1e30, -1e30,
             np.inf, -np.inf, np.nan]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_element_sigmoid(dtype):
    """Sigmoid (and FusedConv's Sigmoid tail) of one-element arrays, computed by the math module: within 1 ulp of
    the many-element numpy path at every magnitude (exp overflow -> exactly 0, NaN -> NaN), in place or not."""
    from onnxpy.ops import _ew_math

    xs = np.array(_EXTREMES, dtype)
    many = _ew_math.sigmoid_into(np.concatenate([xs, xs]))[: len(xs)]  # (the numpy passes)
    for x, want in zip(xs, many):
        a = np.array([[x]], dtype)
        got = _ew_math.sigmoid_into(a)
        assert got.shape == (1, 1) and got.dtype == dtype and got is not a
        same = _ew_math.sigmoid_into(a, a)
        assert same is a and (np.isnan(a[0, 0]) or a[0, 0] == got[0, 0])
        if np.isnan(want):
            assert np.isnan(got[0, 0])
        else:
            assert abs(float(got[0, 0]) - float(want)) <= np.spacing(dtype(max(abs(want), np.finfo(dtype).tiny)))
            assert (want == 0) == (got[0, 0] == 0)
    x = np.array([[-3.0]], np.float32)
    m = _model([helper.make_node("Sigmoid", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                          [1, 1])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])])
    got, exp = _run_both(m, {"x": x})
    np.testing.assert_allclose(got[0], exp[0], rtol=1e-6)


@pytest.mark.parametrize("shape,axes,keepdims", [((1, 1), [1], 0), ((1, 1), [0, 1], 1), ((3, 1, 4), [1], 0),
                                                  ((3, 1, 4), [1], 1), ((2, 1, 1), [1, 2], 0)])
def test_reduce_mean_over_unit_axes(shape, axes, keepdims):
    """ReduceMean whose reduced axes all have length 1 is the input reshaped: same values (NaN included), shapes
    and dtype as onnxruntime (a -0.0 stays -0.0, as numpy's one-element sum keeps it; onnxruntime's sum gives +0.0)."""
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    x.reshape(-1)[-1] = -0.0
    x.reshape(-1)[0] = np.nan  # (the same element when there is one)
    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=keepdims)
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
               [numpy_helper.from_array(np.array(axes, np.int64), "axes")])
    got, exp = _run_both(m, {"x": x})
    assert got[0].shape == exp[0].shape and got[0].dtype == exp[0].dtype
    np.testing.assert_array_equal(got[0], exp[0])
    got[0][...] = 7  # the result is the caller's, the next run is unchanged
    assert np.isnan(onnxpy.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0].reshape(-1)[0])
