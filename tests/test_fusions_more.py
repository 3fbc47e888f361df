"""More graph-optimizer fusions (fusions_misc / fusions_transformer / fusions_qdq).

Each case builds a small model, runs it through onnxpy at the pass's level with ``optimized_model_filepath``,
checks the op types of the saved model (rewrite happened / did not happen), and compares the results with
the unoptimized onnxpy run, with onnxruntime on the original model, and with onnxruntime on the saved
optimized model (so what we write is something onnxruntime understands).
"""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy

ort = pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT
MS = "com.microsoft"


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _model(nodes, inputs, outputs, inits=(), opset=18, extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 9
    return m


def _vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def run_opt(tmp_path, model, feeds, level=2, config=None, atol=1e-5, rtol=1e-5, ort_ref=True):
    """Optimize at ``level``; returns the op-type list ("domain:op" for non-ONNX domains) of the saved model."""
    data = model.SerializeToString()
    path = os.path.join(str(tmp_path), "opt.onnx")
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = path
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    got = onnxpy.InferenceSession(data, so).run(None, feeds)
    so0 = onnxpy.SessionOptions()
    so0.graph_optimization_level = 0
    base = onnxpy.InferenceSession(data, so0).run(None, feeds)
    for a, b in zip(got, base):
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
    if ort_ref:
        oso = ort.SessionOptions()
        oso.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ref = ort.InferenceSession(data, oso, providers=["CPUExecutionProvider"]).run(None, feeds)
        ref2 = ort.InferenceSession(path, oso, providers=["CPUExecutionProvider"]).run(None, feeds)
        for a, b, c in zip(got, ref, ref2):
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
            np.testing.assert_allclose(c.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)
    saved = onnx.load(path)
    return [(n.domain + ":" if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in saved.graph.node]


RNG = np.random.default_rng(0)


def rnd(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------------------------- basic passes
def test_transpose_inverse_pair(tmp_path):
    m = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                helper.make_node("Transpose", ["t"], ["u"], perm=[0, 2, 1]),
                helper.make_node("Relu", ["u"], ["y"])], [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4])])
    assert run_opt(tmp_path, m, {"x": rnd(2, 3, 4)}, level=1) == ["Relu"]


def test_transpose_pair_composed_and_extra_consumer(tmp_path):
    m = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 0]),
                helper.make_node("Transpose", ["t"], ["y"], perm=[1, 2, 0])], [_vi("x", [2, 3, 4])],
               [_vi("y", None)])
    assert run_opt(tmp_path, m, {"x": rnd(2, 3, 4)}, level=1) == ["Transpose"]
    m = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 0]),
                helper.make_node("Transpose", ["t"], ["y"], perm=[1, 2, 0]),
                helper.make_node("Relu", ["t"], ["z"])], [_vi("x", [2, 3, 4])], [_vi("y", None), _vi("z", None)])
    assert run_opt(tmp_path, m, {"x": rnd(2, 3, 4)}, level=1).count("Transpose") == 2


def test_transpose_around_unary(tmp_path):
    m = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
                helper.make_node("Relu", ["t"], ["r"]),
                helper.make_node("Transpose", ["r"], ["y"], perm=[1, 2, 0])], [_vi("x", [2, 3, 4])],
               [_vi("y", [2, 3, 4])])
    assert run_opt(tmp_path, m, {"x": rnd(2, 3, 4)}, level=1) == ["Relu"]
    m2 = _model([helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
                 helper.make_node("Relu", ["t"], ["r"]),
                 helper.make_node("Transpose", ["r"], ["y"], perm=[2, 0, 1])], [_vi("x", [2, 3, 4])],
                [_vi("y", None)])
    assert run_opt(tmp_path, m2, {"x": rnd(2, 3, 4)}, level=1).count("Transpose") == 2


def test_reshape_fusion(tmp_path):
    inits = [_init("s1", np.array([6, 4], np.int64)), _init("s2", np.array([3, 8], np.int64))]
    m = _model([helper.make_node("Reshape", ["x", "s1"], ["r"]), helper.make_node("Reshape", ["r", "s2"], ["y"])],
               [_vi("x", [2, 3, 4])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 3, 4)}, level=1) == ["Reshape"]
    inits = [_init("s1", np.array([6, 4], np.int64)), _init("s2", np.array([0, 2, 2], np.int64))]
    m = _model([helper.make_node("Reshape", ["x", "s1"], ["r"]), helper.make_node("Reshape", ["r", "s2"], ["y"])],
               [_vi("x", [2, 3, 4])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 3, 4)}, level=1) == ["Reshape", "Reshape"]  # 0 copies a dim of r


def test_unsqueeze_squeeze(tmp_path):
    inits = [_init("a", np.array([1], np.int64)), _init("b", np.array([-2], np.int64))]
    m = _model([helper.make_node("Unsqueeze", ["x", "a"], ["u"]), helper.make_node("Squeeze", ["u", "b"], ["s"]),
                helper.make_node("Relu", ["s"], ["y"])], [_vi("x", [2, 3])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 3)}, level=1) == ["Relu"]
    inits = [_init("a", np.array([1], np.int64)), _init("b", np.array([0], np.int64))]
    m = _model([helper.make_node("Unsqueeze", ["x", "a"], ["u"]), helper.make_node("Squeeze", ["u", "b"], ["y"])],
               [_vi("x", [1, 3])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(1, 3)}, level=1) == ["Unsqueeze", "Squeeze"]


def test_cast_expand_slice_noop(tmp_path):
    inits = [_init("shp", np.array([1, 1], np.int64)), _init("st", np.array([0, 0], np.int64)),
             _init("en", np.array([2, 1 << 40], np.int64))]
    m = _model([helper.make_node("Cast", ["x"], ["c"], to=F), helper.make_node("Expand", ["c", "shp"], ["e"]),
                helper.make_node("Slice", ["e", "st", "en"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
               [_vi("x", [2, 3])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 3)}, level=1) == ["Relu"]
    # changing type / shape / range: all stay
    inits = [_init("shp", np.array([4, 2, 3], np.int64)), _init("st", np.array([1, 0], np.int64)),
             _init("en", np.array([2, 1 << 40], np.int64))]
    m = _model([helper.make_node("Cast", ["x"], ["c"], to=TensorProto.DOUBLE),
                helper.make_node("Expand", ["c", "shp"], ["e"]),
                helper.make_node("Slice", ["e", "st", "en"], ["y"])],
               [_vi("x", [2, 3])], [_vi("y", None, TensorProto.DOUBLE)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 3)}, level=1) == ["Cast", "Expand", "Slice"]


def test_noop_arithmetic(tmp_path):
    inits = [_init("z", np.array(0, np.float32)), _init("one", np.array(1, np.float32))]
    m = _model([helper.make_node("Add", ["x", "z"], ["a"]), helper.make_node("Mul", ["one", "a"], ["b"]),
                helper.make_node("Add", ["b", "one"], ["y"])], [_vi("x", [2, 3])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 3)}, level=1) == ["Add"]


def test_cse(tmp_path):
    m = _model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["x"], ["b"]),
                helper.make_node("Add", ["a", "b"], ["y"])], [_vi("x", [2, 3])], [_vi("y", None)])
    assert run_opt(tmp_path, m, {"x": rnd(2, 3)}, level=1) == ["Relu", "Add"]
    m = _model([helper.make_node("RandomUniformLike", ["x"], ["a"], seed=1.0),
                helper.make_node("RandomUniformLike", ["x"], ["b"], seed=1.0),
                helper.make_node("Add", ["a", "b"], ["y"])], [_vi("x", [2, 3])], [_vi("y", None)])
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "r.onnx")
    onnxpy.InferenceSession(m.SerializeToString(), so)
    assert [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node].count("RandomUniformLike") == 2


def test_relu_clip(tmp_path):
    inits = [_init("lo", np.array(-1.0, np.float32)), _init("hi", np.array(6.0, np.float32))]
    m = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r", "lo", "hi"], ["y"])],
               [_vi("x", [2, 3])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 3) * 5}, level=1) == ["Clip"]
    m = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r", "", "hi"], ["y"])],
               [_vi("x", [2, 3])], [_vi("y", None)], inits[1:])
    assert run_opt(tmp_path, m, {"x": rnd(2, 3) * 5}, level=1) == ["Clip"]
    m = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Clip", ["r", "lo", "hi"], ["y"])],
               [_vi("x", [2, 3])], [_vi("y", None), _vi("r", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 3) * 5}, level=1) == ["Relu", "Clip"]


def test_conv_add_mul(tmp_path):
    inits = [_init("W", rnd(4, 3, 3, 3)), _init("B", rnd(4)), _init("m", rnd(4, 1, 1)), _init("a", rnd(1, 4, 1, 1))]
    m = _model([helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Mul", ["c", "m"], ["d"]), helper.make_node("Add", ["a", "d"], ["y"])],
               [_vi("x", [1, 3, 5, 5])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(1, 3, 5, 5)}, level=1, atol=1e-4) == ["Conv"]
    inits = [_init("W", rnd(4, 3, 3, 3)), _init("a", rnd(1, 1, 5, 5))]  # varies over space: not a bias
    m = _model([helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
                helper.make_node("Add", ["c", "a"], ["y"])], [_vi("x", [1, 3, 5, 5])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(1, 3, 5, 5)}, level=1) == ["Conv", "Add"]


def test_matmul_scale_fold(tmp_path):
    inits = [_init("W", rnd(4, 5)), _init("W2", rnd(4, 5)), _init("c", rnd(5)), _init("d", np.array(4.0, np.float32))]
    m = _model([helper.make_node("MatMul", ["x", "W"], ["a"]), helper.make_node("Mul", ["c", "a"], ["b"]),
                helper.make_node("MatMul", ["x", "W2"], ["e"]), helper.make_node("Div", ["e", "d"], ["f"]),
                helper.make_node("Add", ["b", "f"], ["y"])], [_vi("x", [2, 3, 4])], [_vi("y", None)], inits)
    ops = run_opt(tmp_path, m, {"x": rnd(2, 3, 4)}, level=1, atol=1e-5)
    assert ops.count("MatMul") == 2 and "Mul" not in ops and "Div" not in ops
    inits = [_init("W", rnd(4, 5)), _init("c", rnd(3, 1))]  # scales rows: not foldable into W
    m = _model([helper.make_node("MatMul", ["x", "W"], ["a"]), helper.make_node("Mul", ["a", "c"], ["y"])],
               [_vi("x", [2, 3, 4])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 3, 4)}, level=1) == ["MatMul", "Mul"]


def test_shape_gather_folding(tmp_path):
    inits = [_init("i", np.array(1, np.int64)), _init("j", np.array(0, np.int64))]
    m = _model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i"], ["g"]),
                helper.make_node("Gather", ["s", "j"], ["h"]),
                helper.make_node("Add", ["g", "h"], ["y"])], [_vi("x", ["N", 7])],
               [_vi("y", None, TensorProto.INT64)], inits)
    ops = run_opt(tmp_path, m, {"x": rnd(3, 7)}, level=1)
    assert ops.count("Gather") == 1 and "Shape" in ops  # dim 1 static -> folded; dim 0 symbolic -> kept
    m = _model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i"], ["y"])],
               [_vi("x", [3, 7])], [_vi("y", None, TensorProto.INT64)], inits[:1])
    assert "Shape" not in run_opt(tmp_path, m, {"x": rnd(3, 7)}, level=1, ort_ref=False)


# ------------------------------------------------------------------------------------------ transformer fusions
def _fast_gelu_model(cube="pow", k=0.044715):
    c = math.sqrt(2 / math.pi)
    inits = [_init("three", np.array(3.0, np.float32)), _init("k", np.array(k, np.float32)),
             _init("c", np.array(c, np.float32)), _init("one", np.array(1.0, np.float32)),
             _init("half", np.array(0.5, np.float32))]
    if cube == "pow":
        cube_nodes = [helper.make_node("Pow", ["x", "three"], ["x3"])]
    else:
        cube_nodes = [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x2", "x"], ["x3"])]
    nodes = cube_nodes + [
        helper.make_node("Mul", ["k", "x3"], ["kx3"]), helper.make_node("Add", ["x", "kx3"], ["inner"]),
        helper.make_node("Mul", ["inner", "c"], ["ci"]), helper.make_node("Tanh", ["ci"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["t1"]), helper.make_node("Mul", ["half", "x"], ["hx"]),
        helper.make_node("Mul", ["hx", "t1"], ["y"])]
    return _model(nodes, [_vi("x", [2, 8])], [_vi("y", None)], inits)


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_fast_gelu(tmp_path, cube):
    assert run_opt(tmp_path, _fast_gelu_model(cube), {"x": rnd(2, 8) * 3}) == [f"{MS}:FastGelu"]
    assert run_opt(tmp_path, _fast_gelu_model(cube), {"x": rnd(2, 8) * 3}, level=1).count("Tanh") == 1


def test_fast_gelu_wrong_constant(tmp_path):
    assert f"{MS}:FastGelu" not in run_opt(tmp_path, _fast_gelu_model("pow", 0.05), {"x": rnd(2, 8)})


def test_quick_gelu(tmp_path):
    inits = [_init("a", np.array(1.702, np.float32))]
    m = _model([helper.make_node("Mul", ["x", "a"], ["ax"]), helper.make_node("Sigmoid", ["ax"], ["s"]),
                helper.make_node("Mul", ["x", "s"], ["y"])], [_vi("x", [2, 8])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(2, 8)}) == [f"{MS}:QuickGelu"]
    m = _model([helper.make_node("Mul", ["x", "a"], ["ax"]), helper.make_node("Sigmoid", ["ax"], ["s"]),
                helper.make_node("Mul", ["x", "s"], ["y"])], [_vi("x", [2, 8])], [_vi("y", None), _vi("s", None)],
               inits)
    assert f"{MS}:QuickGelu" not in run_opt(tmp_path, m, {"x": rnd(2, 8)})


def _rms_model(axis=-1, two=2.0):
    inits = [_init("two", np.array(two, np.float32)), _init("eps", np.array(1e-6, np.float32)),
             _init("w", rnd(8)), _init("ax", np.array([axis], np.int64))]
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]), helper.make_node("ReduceMean", ["p", "ax"], ["m"]),
             helper.make_node("Add", ["m", "eps"], ["a"]), helper.make_node("Sqrt", ["a"], ["s"]),
             helper.make_node("Div", ["x", "s"], ["d"]), helper.make_node("Mul", ["w", "d"], ["y"])]
    return _model(nodes, [_vi("x", [2, 3, 8])], [_vi("y", None)], inits)


def test_simplified_layer_norm(tmp_path):
    assert run_opt(tmp_path, _rms_model(), {"x": rnd(2, 3, 8)}) == ["SimplifiedLayerNormalization"]
    assert "SimplifiedLayerNormalization" not in run_opt(tmp_path, _rms_model(axis=1), {"x": rnd(2, 3, 8)})
    assert "SimplifiedLayerNormalization" not in run_opt(tmp_path, _rms_model(two=3.0), {"x": rnd(2, 3, 8)})


def test_gemm_activation(tmp_path):
    inits = [_init("W", rnd(4, 5)), _init("B", rnd(5))]
    m = _model([helper.make_node("Gemm", ["x", "W", "B"], ["g"]), helper.make_node("LeakyRelu", ["g"], ["y"],
                                                                                  alpha=0.2)],
               [_vi("x", [3, 4])], [_vi("y", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(3, 4)}) == [f"{MS}:FusedGemm"]
    assert run_opt(tmp_path, m, {"x": rnd(3, 4)}, level=1) == ["Gemm", "LeakyRelu"]
    m = _model([helper.make_node("Gemm", ["x", "W", "B"], ["g"]), helper.make_node("Relu", ["g"], ["y"])],
               [_vi("x", [3, 4])], [_vi("y", None), _vi("g", None)], inits)
    assert run_opt(tmp_path, m, {"x": rnd(3, 4)}) == ["Gemm", "Relu"]


def test_matmul_transpose_and_scale(tmp_path):
    inits = [_init("s", np.array(0.125, np.float32))]
    m = _model([helper.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1]),
                helper.make_node("MatMul", ["at", "b"], ["p"]), helper.make_node("Mul", ["p", "s"], ["y"])],
               [_vi("a", [2, 4, 3]), _vi("b", [2, 4, 5])], [_vi("y", None)], inits)
    ops = run_opt(tmp_path, m, {"a": rnd(2, 4, 3), "b": rnd(2, 4, 5)})
    assert ops == [f"{MS}:FusedMatMul"]
    m = _model([helper.make_node("Transpose", ["a"], ["at"], perm=[1, 0, 2]),
                helper.make_node("MatMul", ["at", "b"], ["y"])],
               [_vi("a", [4, 2, 3]), _vi("b", [2, 3, 5])], [_vi("y", None)])
    assert run_opt(tmp_path, m, {"a": rnd(4, 2, 3), "b": rnd(2, 3, 5)}) == ["Transpose", "MatMul"]


def _attention_model(B=2, S=5, H=8, N=2, axis=-1, mask_shape=None, scale_op="Mul"):
    D = H // N
    inits, nodes = [], []
    for p in "qkv":
        inits += [_init(f"W{p}", rnd(H, H) * 0.3), _init(f"b{p}", rnd(H) * 0.1)]
        nodes += [helper.make_node("MatMul", ["x", f"W{p}"], [f"{p}m"]),
                  helper.make_node("Add", [f"{p}m", f"b{p}"], [f"{p}p"]),
                  helper.make_node("Reshape", [f"{p}p", "hs"], [f"{p}4"])]
    inits += [_init("hs", np.array([B, S, N, D], np.int64)), _init("os", np.array([B, S, H], np.int64)),
              _init("sc", np.array(1 / math.sqrt(D) if scale_op == "Mul" else math.sqrt(D), np.float32))]
    nodes += [helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qt", "kt"], ["sco"]),
              helper.make_node(scale_op, ["sco", "sc"], ["scs"]),
              helper.make_node("Add", ["scs", "mask"], ["msk"]),
              helper.make_node("Softmax", ["msk"], ["pr"], axis=axis),
              helper.make_node("MatMul", ["pr", "vt"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctxt", "os"], ["y"])]
    mask_shape = mask_shape or [B, 1, S, S]
    return _model(nodes, [_vi("x", [B, S, H]), _vi("mask", mask_shape)], [_vi("y", None)], inits)


def _attn_feeds(B=2, S=5, H=8, mask_shape=None):
    mask = np.zeros(mask_shape or (B, 1, S, S), np.float32)
    mask[..., -1] = -10000.0
    return {"x": rnd(B, S, H), "mask": mask}


@pytest.mark.parametrize("scale_op", ["Mul", "Div"])
def test_attention_fusion(tmp_path, scale_op):
    ops = run_opt(tmp_path, _attention_model(scale_op=scale_op), _attn_feeds(), atol=1e-5)
    assert f"{MS}:MultiHeadAttention" in ops and "Softmax" not in ops


def test_attention_not_fused(tmp_path):
    ops = run_opt(tmp_path, _attention_model(axis=2), _attn_feeds())
    assert "Softmax" in ops and f"{MS}:MultiHeadAttention" not in ops
    # a (B, 1, 1, T) padding mask broadcasts over the queries: onnxruntime's attention_bias needs (.., S, T)
    ops = run_opt(tmp_path, _attention_model(mask_shape=[2, 1, 1, 5]), _attn_feeds(mask_shape=(2, 1, 1, 5)))
    assert "Softmax" in ops


# ----------------------------------------------------------------------------------------------------------- QDQ
def _qdq(name, scale, zp, out, q=False, axis=None):
    kw = {} if axis is None else {"axis": axis}
    return helper.make_node("QuantizeLinear" if q else "DequantizeLinear", [name, scale, zp], [out], **kw)


def _qinits():
    return [_init("xs", np.array(0.05, np.float32)), _init("xz", np.array(128, np.uint8)),
            _init("ys", np.array(0.1, np.float32)), _init("yz", np.array(120, np.uint8)),
            _init("ws", np.array(0.02, np.float32)), _init("wz", np.array(0, np.int8))]


def _qfeed(*shape):
    return RNG.integers(90, 170, shape).astype(np.uint8)


def _run_q(tmp_path, m, feeds, config=None):
    # integer outputs may differ by one step of rounding between kernels
    return run_opt(tmp_path, m, feeds, config=config, atol=1.01, rtol=0)


def test_qdq_conv(tmp_path):
    w = RNG.integers(-50, 50, (4, 3, 3, 3)).astype(np.int8)
    ws = (RNG.random(4).astype(np.float32) * 0.02 + 0.01)
    bq = RNG.integers(-500, 500, 4).astype(np.int32)
    inits = _qinits() + [_init("w", w), _init("wsc", ws), _init("wzc", np.zeros(4, np.int8)), _init("b", bq),
                         _init("bs", (ws * np.float32(0.05)).astype(np.float32)), _init("bz", np.zeros(4, np.int32))]
    m = _model([_qdq("xq", "xs", "xz", "x"), _qdq("w", "wsc", "wzc", "wf", axis=0), _qdq("b", "bs", "bz", "bf", axis=0),
                helper.make_node("Conv", ["x", "wf", "bf"], ["c"], pads=[1, 1, 1, 1]),
                _qdq("c", "ys", "yz", "y", q=True)], [_vi("xq", [1, 3, 6, 6], TensorProto.UINT8)],
               [_vi("y", None, TensorProto.UINT8)], inits)
    assert _run_q(tmp_path, m, {"xq": _qfeed(1, 3, 6, 6)}) == ["QLinearConv"]
    ops = _run_q(tmp_path, m, {"xq": _qfeed(1, 3, 6, 6)}, config={"session.disable_quant_qdq": "1"})
    assert "QLinearConv" not in ops and "Conv" in ops


def _qmatmul(with_q=True):
    inits = _qinits() + [_init("w", RNG.integers(-60, 60, (8, 5)).astype(np.int8))]
    nodes = [_qdq("xq", "xs", "xz", "x"), _qdq("w", "ws", "wz", "wf"), helper.make_node("MatMul", ["x", "wf"], ["c"])]
    if with_q:
        nodes.append(_qdq("c", "ys", "yz", "y", q=True))
        out = _vi("y", None, TensorProto.UINT8)
    else:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        out = _vi("y", None)
    return _model(nodes, [_vi("xq", [3, 8], TensorProto.UINT8)], [out], inits)


def test_qdq_matmul(tmp_path):
    assert _run_q(tmp_path, _qmatmul(), {"xq": _qfeed(3, 8)}) == ["QLinearMatMul"]
    ops = run_opt(tmp_path, _qmatmul(False), {"xq": _qfeed(3, 8)}, atol=1e-4, rtol=1e-5)
    assert ops == [f"{MS}:MatMulIntegerToFloat", "Relu"]


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_qdq_binary(tmp_path, op):
    inits = _qinits() + [_init("bs", np.array(0.03, np.float32)), _init("bz", np.array(100, np.uint8))]
    m = _model([_qdq("aq", "xs", "xz", "a"), _qdq("bq", "bs", "bz", "b"), helper.make_node(op, ["a", "b"], ["c"]),
                _qdq("c", "ys", "yz", "y", q=True)],
               [_vi("aq", [2, 6], TensorProto.UINT8), _vi("bq", [2, 6], TensorProto.UINT8)],
               [_vi("y", None, TensorProto.UINT8)], inits)
    assert _run_q(tmp_path, m, {"aq": _qfeed(2, 6), "bq": _qfeed(2, 6)}) == [f"{MS}:QLinear{op}"]


def test_qdq_gemm(tmp_path):
    inits = _qinits() + [_init("w", RNG.integers(-60, 60, (8, 5)).astype(np.int8)),
                         _init("b", RNG.integers(-300, 300, 5).astype(np.int32)),
                         _init("bsc", np.array(0.05 * 0.02, np.float32)), _init("bz", np.array(0, np.int32))]
    m = _model([_qdq("xq", "xs", "xz", "x"), _qdq("w", "ws", "wz", "wf"), _qdq("b", "bsc", "bz", "bf"),
                helper.make_node("Gemm", ["x", "wf", "bf"], ["c"]), _qdq("c", "ys", "yz", "y", q=True)],
               [_vi("xq", [3, 8], TensorProto.UINT8)], [_vi("y", None, TensorProto.UINT8)], inits)
    assert _run_q(tmp_path, m, {"xq": _qfeed(3, 8)}) == [f"{MS}:QGemm"]


def test_qdq_movement(tmp_path):
    inits = _qinits() + [_init("shp", np.array([4, 3], np.int64))]
    m = _model([_qdq("xq", "xs", "xz", "x"), helper.make_node("Reshape", ["x", "shp"], ["r"]),
                _qdq("r", "xs", "xz", "y", q=True)], [_vi("xq", [2, 6], TensorProto.UINT8)],
               [_vi("y", None, TensorProto.UINT8)], inits)
    assert _run_q(tmp_path, m, {"xq": _qfeed(2, 6)}) == ["Reshape"]
    m = _model([_qdq("xq", "xs", "xz", "x"), helper.make_node("Reshape", ["x", "shp"], ["r"]),
                _qdq("r", "ys", "yz", "y", q=True)], [_vi("xq", [2, 6], TensorProto.UINT8)],
               [_vi("y", None, TensorProto.UINT8)], inits)
    assert _run_q(tmp_path, m, {"xq": _qfeed(2, 6)}) == ["DequantizeLinear", "Reshape", "QuantizeLinear"]
    m = _model([_qdq("xq", "xs", "xz", "x"), helper.make_node("MaxPool", ["x"], ["r"], kernel_shape=[2, 2]),
                _qdq("r", "xs", "xz", "y", q=True)], [_vi("xq", [1, 2, 4, 4], TensorProto.UINT8)],
               [_vi("y", None, TensorProto.UINT8)], inits[:6])
    assert _run_q(tmp_path, m, {"xq": _qfeed(1, 2, 4, 4)}) == ["MaxPool"]


# ------------------------------------------------------------------------------------ float16 attention (torch)
def _attention_fp16_model(B=2, S=5, H=8, N=2, expand_to=None, scale_op="Mul", scale_input=False):
    """The float16 torchscript export: float16 scale constant, and the additive mask built from a (B, T) int64
    padding mask as Where(Expand(Cast(Unsqueeze(mask)), shape), 0, -65504)."""
    D = H // N
    h = TensorProto.FLOAT16
    inits, nodes = [], []
    for p in "qkv":
        inits += [_init(f"W{p}", (rnd(H, H) * 0.3).astype(np.float16)),
                  _init(f"b{p}", (rnd(H) * 0.1).astype(np.float16))]
        nodes += [helper.make_node("MatMul", ["x", f"W{p}"], [f"{p}m"]),
                  helper.make_node("Add", [f"{p}m", f"b{p}"], [f"{p}p"]),
                  helper.make_node("Reshape", [f"{p}p", "hs"], [f"{p}4"])]
    sc = 1 / math.sqrt(D) if scale_op == "Mul" else math.sqrt(D)
    inits += [_init("hs", np.array([B, S, N, D], np.int64)), _init("os", np.array([B, S, H], np.int64)),
              _init("ax12", np.array([1, 2], np.int64)),
              _init("ms", np.array(expand_to or [B, 1, S, S], np.int64)),
              _init("zero", np.array(0, np.float16)), _init("neg", np.array(-65504, np.float16))]
    if not scale_input:
        inits.append(_init("sc", np.array(sc, np.float16)))
    nodes += [helper.make_node("Unsqueeze", ["am", "ax12"], ["am4"]),
              helper.make_node("Cast", ["am4"], ["amb"], to=TensorProto.BOOL),
              helper.make_node("Expand", ["amb", "ms"], ["ame"]),
              helper.make_node("Where", ["ame", "zero", "neg"], ["mask"]),
              helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qt", "kt"], ["sco"]),
              helper.make_node(scale_op, ["sco", "sc"], ["scs"]),
              helper.make_node("Add", ["scs", "mask"], ["msk"]),
              helper.make_node("Softmax", ["msk"], ["pr"], axis=-1),
              helper.make_node("MatMul", ["pr", "vt"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctxt", "os"], ["y"])]
    ins = [_vi("x", [B, S, H], h), _vi("am", [B, S], TensorProto.INT64)]
    if scale_input:
        ins.append(_vi("sc", [], h))
    return _model(nodes, ins, [_vi("y", None, h)], inits)


def _attn_fp16_feeds(B=2, S=5, H=8, scale_input=False, D=4):
    am = np.ones((B, S), np.int64)
    am[0, -2:] = 0
    feeds = {"x": rnd(B, S, H).astype(np.float16), "am": am}
    if scale_input:
        feeds["sc"] = np.array(1 / math.sqrt(D), np.float16)
    return feeds


@pytest.mark.parametrize("scale_op", ["Mul", "Div"])
def test_attention_fusion_fp16(tmp_path, scale_op):
    ops = run_opt(tmp_path, _attention_fp16_model(scale_op=scale_op), _attn_fp16_feeds(), atol=1e-2, rtol=1e-2)
    assert f"{MS}:MultiHeadAttention" in ops and "Softmax" not in ops


def test_attention_fp16_not_fused(tmp_path):
    # the mask expands only to (B, 1, 1, T): onnxruntime's attention_bias needs (.., S, T)
    ops = run_opt(tmp_path, _attention_fp16_model(expand_to=[2, 1, 1, 5]), _attn_fp16_feeds(), atol=1e-2, rtol=1e-2)
    assert "Softmax" in ops and f"{MS}:MultiHeadAttention" not in ops
    # the scale is a runtime value, not a constant
    ops = run_opt(tmp_path, _attention_fp16_model(scale_input=True), _attn_fp16_feeds(scale_input=True),
                  atol=1e-2, rtol=1e-2)
    assert "Softmax" in ops and f"{MS}:MultiHeadAttention" not in ops
