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
