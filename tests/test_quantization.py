"""onnxpy.quantization: quantized models run in onnxpy and onnxruntime with matching outputs."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import onnxpy
from onnxpy.models import default_model
from onnxpy.quantization import (
    CalibrationDataReader, CalibrationMethod, MatMulNBitsQuantizer, QuantFormat, QuantType, cli_main,
    quantize_dynamic, quantize_static,
)

ort = pytest.importorskip("onnxruntime")


def mlp(D=32, H=64, T=8):
    rng = np.random.default_rng(0)

    def w(n, *s):
        return nh.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32), n)

    inits = [w("w1", D, H), nh.from_array(np.full(H, 0.01, np.float32), "b1"), w("w2", H, D),
             nh.from_array(np.ones(D, np.float32), "g"), nh.from_array(np.zeros(D, np.float32), "bb"),
             w("wo", D, 10)]
    nodes = [h.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
             h.make_node("Add", ["h1", "b1"], ["h2"], name="a1"),
             h.make_node("Relu", ["h2"], ["h3"], name="relu"), h.make_node("MatMul", ["h3", "w2"], ["h4"], name="fc2"),
             h.make_node("Add", ["h4", "x"], ["h5"], name="res"),
             h.make_node("LayerNormalization", ["h5", "g", "bb"], ["h6"], name="ln", axis=-1),
             h.make_node("MatMul", ["h6", "wo"], ["logits"], name="head"),
             h.make_node("Softmax", ["logits"], ["y"], name="sm", axis=-1)]
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", TP.FLOAT, ["N", T, D])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["N", T, 10])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def zoo():
    """Many quantizable ops: Conv, Sigmoid, LeakyRelu, AveragePool, Concat, Mul, Resize, Transpose, Reshape,
    Gather, Clip, MaxPool, GlobalAveragePool, Gemm."""
    rng = np.random.default_rng(1)
    f = lambda n, *s: nh.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)  # noqa: E731
    inits = [f("cw", 8, 3, 3, 3), f("cb", 8), f("cw2", 8, 16, 1, 1), f("mulc", 1, 8, 1, 1),
             nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             nh.from_array(np.array([0, 2, 1, 3], np.int64), "idx"), f("fw", 5, 8), f("fb", 5),
             nh.from_array(np.array(0.0, np.float32), "zero"), nh.from_array(np.array(6.0, np.float32), "six"),
             nh.from_array(np.array([0, -1], np.int64), "shp")]
    nodes = [
        h.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Sigmoid", ["c"], ["s"], name="sig"),
        h.make_node("LeakyRelu", ["c"], ["l"], name="lrelu", alpha=0.1),
        h.make_node("Concat", ["s", "l"], ["cat"], name="cat", axis=1),
        h.make_node("AveragePool", ["cat"], ["ap"], name="ap", kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["ap", "cw2"], ["c2"], name="conv2"),
        h.make_node("Clip", ["c2", "zero", "six"], ["r6"], name="clip"),
        h.make_node("Mul", ["r6", "mulc"], ["m"], name="mul"),
        h.make_node("Resize", ["m", "", "scales"], ["rs"], name="resize", mode="nearest"),
        h.make_node("MaxPool", ["rs"], ["mp"], name="mp", kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Transpose", ["mp"], ["t"], name="tr", perm=[0, 1, 3, 2]),
        h.make_node("Gather", ["t", "idx"], ["gt"], name="gather", axis=1),
        h.make_node("GlobalAveragePool", ["gt"], ["gap"], name="gap"),
        h.make_node("Reshape", ["gap", "shp"], ["flat"], name="reshape"),
        h.make_node("Gemm", ["flat", "fw", "fb"], ["y"], name="fc", transB=1, alpha=1.0),
    ]
    nodes[-1].input[1] = "fw_t"
    inits.append(nh.from_array(np.ascontiguousarray(nh.to_array(inits[6])[:, :4]), "fw_t"))
    g = h.make_graph(nodes, "zoo", [h.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 8, 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["N", 5])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


class Reader(CalibrationDataReader):
    def __init__(self, name, shape, n=4, seed=0):
        rng = np.random.default_rng(seed)
        self.data = iter([{name: rng.standard_normal(shape).astype(np.float32)} for _ in range(n)])

    def get_next(self):
        return next(self.data, None)


MODELS = {
    "cnn": (default_model, "image", (2, 3, 32, 32)),
    "mlp": (mlp, "x", (2, 8, 32)),
    "zoo": (zoo, "x", (2, 3, 8, 8)),
}


def _run_both(fm, qm, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(fm.SerializeToString()).run(None, feeds)[0]
    a = ort.InferenceSession(qm.SerializeToString(), so).run(None, feeds)[0]
    b = onnxpy.InferenceSession(qm.SerializeToString()).run(None, feeds)[0]
    return ref, a, b


def _feeds(name, shape, seed=7):
    return {name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _out_step(qm):
    """Scale of the last QuantizeLinear feeding the graph output (one quantization step), else 0."""
    inits = {t.name: nh.to_array(t) for t in qm.graph.initializer}
    steps = [float(np.max(inits[n.input[1]])) for n in qm.graph.node
             if n.op_type in ("QuantizeLinear", "QLinearMatMul", "QLinearConv") and len(n.input) > 1
             and n.input[-2 if n.op_type != "QuantizeLinear" else 1] in inits]
    return max(steps) if steps else 0.0


@pytest.mark.parametrize("model_name", ["cnn", "mlp", "zoo"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic(model_name, per_channel):
    make, name, shape = MODELS[model_name]
    fm = make()
    qm = quantize_dynamic(fm, None, per_channel=per_channel)
    ops = {n.op_type for n in qm.graph.node}
    assert "DynamicQuantizeLinear" in ops and ("MatMulInteger" in ops or "ConvInteger" in ops)
    ref, a, b = _run_both(fm, qm, _feeds(name, shape))
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    assert np.linalg.norm(b - ref) / np.linalg.norm(ref) < 0.05


@pytest.mark.parametrize("model_name", ["cnn", "mlp", "zoo"])
@pytest.mark.parametrize("fmt", [QuantFormat.QDQ, QuantFormat.QOperator])
@pytest.mark.parametrize("act", [QuantType.QUInt8, QuantType.QInt8])
def test_static_8bit(model_name, fmt, act):
    make, name, shape = MODELS[model_name]
    fm = make()
    qm = quantize_static(fm, None, Reader(name, shape), quant_format=fmt, activation_type=act,
                         per_channel=model_name != "mlp")
    ops = {n.op_type for n in qm.graph.node}
    if fmt == QuantFormat.QOperator:
        assert ops & {"QLinearConv", "QLinearMatMul"}
    else:
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    ref, a, b = _run_both(fm, qm, _feeds(name, shape))
    # both runtimes agree within one quantization step of the output
    tol = 1e-5 if fmt == QuantFormat.QDQ else 1.01 * _out_step(qm) + 1e-5
    assert np.max(np.abs(a - b)) <= tol
    assert np.linalg.norm(b - ref) / np.linalg.norm(ref) < 0.1


@pytest.mark.parametrize("act,wt", [(QuantType.QUInt16, QuantType.QInt8), (QuantType.QInt16, QuantType.QInt16),
                                    (QuantType.QUInt8, QuantType.QInt4), (QuantType.QUInt8, QuantType.QUInt4)])
def test_static_qdq_wide_and_4bit(act, wt):
    fm = mlp()
    qm = quantize_static(fm, None, Reader("x", (2, 8, 32)), activation_type=act, weight_type=wt, per_channel=True)
    assert any(op.domain == "com.microsoft" for op in qm.opset_import)  # opset 17 model: contrib Q/DQ
    ref, a, b = _run_both(fm, qm, _feeds("x", (2, 8, 32)))
    np.testing.assert_allclose(b, a, atol=1e-4)
    err = np.linalg.norm(b - ref) / np.linalg.norm(ref)
    assert err < (0.06 if act in (QuantType.QInt16, QuantType.QUInt16) else 0.2)


@pytest.mark.parametrize("method", [CalibrationMethod.Entropy, CalibrationMethod.Percentile])
def test_histogram_calibration(method):
    fm = default_model()
    qm = quantize_static(fm, None, Reader("image", (2, 3, 32, 32)), calibrate_method=method)
    ref, a, b = _run_both(fm, qm, _feeds("image", (2, 3, 32, 32)))
    np.testing.assert_allclose(b, a, atol=1e-5)
    assert np.linalg.norm(b - ref) / np.linalg.norm(ref) < 0.1


def test_include_exclude():
    fm = mlp()
    qm = quantize_dynamic(fm, None, nodes_to_exclude=["head"])
    assert [n for n in qm.graph.node if n.name == "head"][0].op_type == "MatMul"
    qm = quantize_dynamic(fm, None, nodes_to_quantize=["fc1"])
    assert sum(n.op_type == "MatMulInteger" for n in qm.graph.node) == 1
    qm = quantize_static(fm, None, Reader("x", (2, 8, 32)), op_types_to_quantize=["MatMul"])
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] == "y_float" for n in qm.graph.node)
    _run_both(fm, qm, _feeds("x", (2, 8, 32)))


def test_reduce_range_weights_7bit():
    qm = quantize_dynamic(mlp(), None, reduce_range=True)
    w = [nh.to_array(t) for t in qm.graph.initializer if t.name == "w1_quantized"][0]
    assert w.dtype == np.int8 and np.abs(w.astype(int)).max() <= 64


def test_errors(tmp_path):
    with pytest.raises(ValueError):
        quantize_dynamic(mlp(), None, weight_type=QuantType.QInt16)
    with pytest.raises(ValueError, match="no data"):
        quantize_static(mlp(), None, Reader("x", (2, 8, 32), n=0))
    with pytest.raises(ValueError, match="8-bit"):
        quantize_static(mlp(), None, Reader("x", (2, 8, 32)), quant_format=QuantFormat.QOperator,
                        activation_type=QuantType.QUInt16)
    with pytest.raises(TypeError):
        quantize_dynamic(12, None)


@pytest.mark.parametrize("bits,block,sym", [(4, 32, False), (4, 32, True), (4, 16, False), (8, 32, False),
                                            (2, 16, True)])
def test_matmul_nbits_layout_matches_onnxruntime(bits, block, sym):
    fm = mlp(D=48)  # K=48 is not a multiple of 32: padded last block
    q = MatMulNBitsQuantizer(fm, bits=bits, block_size=block, is_symmetric=sym)
    qm = q.process().model
    assert sum(n.op_type == "MatMulNBits" for n in qm.graph.node) == 3
    ref, a, b = _run_both(fm, qm, _feeds("x", (2, 8, 48)))
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    err = np.linalg.norm(b - ref) / np.linalg.norm(ref)
    assert err < {8: 0.02, 4: 0.2, 2: 0.8}[bits]


def test_matmul_nbits_save(tmp_path):
    q = MatMulNBitsQuantizer(mlp(), block_size=32)
    q.process()
    path = tmp_path / "q4.onnx"
    q.model.save_model_to_file(str(path))
    onnxpy.InferenceSession(str(path)).run(None, _feeds("x", (1, 8, 32)))


def test_cli(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(default_model(), str(src))
    for mode, extra in [("dynamic", []), ("static", ["--format", "QOperator", "--calibration-samples", "2"]),
                        ("static", ["--per-channel", "--calibration-samples", "2"])]:
        dst = tmp_path / f"q_{mode}.onnx"
        assert cli_main([str(src), str(dst), "--mode", mode, *extra]) == 0
        onnxpy.InferenceSession(str(dst)).run(None, _feeds("image", (1, 3, 32, 32)))
    assert cli_main([str(tmp_path / "missing.onnx"), str(tmp_path / "x.onnx")]) == 1
