"""onnxpy.tools.float16.convert_float_to_float16: converted models run in onnxpy and onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import onnxpy
from onnxpy.models import default_model
from onnxpy.tools.float16 import cli_main, convert_float_to_float16, convert_np_to_float16

ort = pytest.importorskip("onnxruntime")


def resize_model():
    nodes = [h.make_node("Constant", [], ["k"], value_float=2.0),
             h.make_node("Mul", ["x", "k"], ["m"]),
             h.make_node("Resize", ["m", "", "scales"], ["r"], mode="linear"),
             h.make_node("TopK", ["r", "kk"], ["v", "i"], axis=-1),
             h.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
             h.make_node("Add", ["v", "fi"], ["y"])]
    inits = [nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"), nh.from_array(np.array([3], np.int64), "kk")]
    g = h.make_graph(nodes, "r", [h.make_tensor_value_info("x", TP.FLOAT, [1, 2, 4, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _check(m32, m16, feeds32, keep):
    onnx.checker.check_model(m16, full_check=True)
    feeds = feeds32 if keep else {k: v.astype(np.float16) for k, v in feeds32.items()}
    ref = ort.InferenceSession(m32.SerializeToString()).run(None, feeds32)[0]
    a = ort.InferenceSession(m16.SerializeToString()).run(None, feeds)[0]
    b = onnxpy.InferenceSession(m16.SerializeToString()).run(None, feeds)[0]
    assert a.dtype == b.dtype == (np.float32 if keep else np.float16)
    np.testing.assert_allclose(b.astype(np.float32), a.astype(np.float32), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(b.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("block", [None, ["Softmax"], []])
def test_cnn(keep, block):
    m = default_model()
    m16 = convert_float_to_float16(m, keep_io_types=keep, op_block_list=block)
    inits = {t.name: t.data_type for t in m16.graph.initializer}
    assert inits["conv1_w"] == TP.FLOAT16
    if block:
        assert any(n.op_type == "Cast" for n in m16.graph.node)
    feeds = {"image": np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)}
    _check(m, m16, feeds, keep)


@pytest.mark.parametrize("keep", [False, True])
def test_float_only_inputs_and_blocked_ops(keep):
    m = resize_model()
    m16 = convert_float_to_float16(m, keep_io_types=keep)
    inits = {t.name: t.data_type for t in m16.graph.initializer}
    assert inits["scales"] == TP.FLOAT  # Resize scales only accept float32
    topk = [n for n in m16.graph.node if n.op_type == "TopK"][0]
    assert topk.input[0] != "r"  # TopK is in the default block list: fed through a Cast
    cast = [n for n in m16.graph.node if n.op_type == "Cast" and n.input == ["i"]][0]
    assert cast.attribute[0].i == TP.FLOAT16
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)}
    _check(m, m16, feeds, keep)


def test_node_block_list_and_shared_initializer():
    w = nh.from_array(np.random.default_rng(2).standard_normal((4, 4)).astype(np.float32), "w")
    nodes = [h.make_node("MatMul", ["x", "w"], ["a"], name="mm1"), h.make_node("MatMul", ["a", "w"], ["y"], name="mm2")]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [2, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [2, 4])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m16 = convert_float_to_float16(m, keep_io_types=True, node_block_list=["mm2"])
    types = {t.name: t.data_type for t in m16.graph.initializer}
    assert types["w"] == TP.FLOAT and TP.FLOAT16 in types.values()  # float32 and float16 copies
    _check(m, m16, {"x": np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)}, True)


def test_clamping():
    a = np.array([1e-9, -1e-9, 0.0, 1e6, -1e6, 1.5], np.float32)
    out = convert_np_to_float16(a)
    assert out.dtype == np.float16 and out[0] > 0 and out[1] < 0 and out[2] == 0
    assert out[3] == 65504 and out[4] == -65504 and out[5] == 1.5


def test_errors_and_cli(tmp_path):
    with pytest.raises(TypeError):
        convert_float_to_float16(42)
    src, dst = tmp_path / "m.onnx", tmp_path / "m16.onnx"
    onnx.save(default_model(), str(src))
    assert cli_main([str(src), str(dst), "--keep-io-types"]) == 0
    out = onnxpy.InferenceSession(str(dst)).run(None, {"image": np.zeros((1, 3, 32, 32), np.float32)})[0]
    assert out.dtype == np.float32
