"""Reductions, linear algebra, normalization, random and loss kernels against onnxruntime (test oracle) or numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxpy
from _oracle import assert_outputs_close

RNG = np.random.default_rng(1234)


def _model(node, opset, feeds, out_types=None):
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for n, v in zip(node.input, feeds)
        if n
    ]
    g = helper.make_graph([node], "g", ins, [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(m)
    known = {
        v.name: v
        for v in list(inferred.graph.value_info) + list(inferred.graph.output)
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type
    }
    del m.graph.output[:]
    for i, o in enumerate(o for o in node.output if o):
        if out_types and out_types[i] is not None:
            m.graph.output.append(helper.make_tensor_value_info(o, out_types[i], None))
        elif o in known:
            m.graph.output.append(known[o])
        else:
            m.graph.output.append(helper.make_tensor_value_info(o, TensorProto.FLOAT, None))
    return m.SerializeToString()


def run_onnxpy(node, opset, feeds, out_types=None):
    data = _model(node, opset, feeds, out_types)
    sess = onnxpy.InferenceSession(data)
    return sess.run(None, {n: v for n, v in zip(node.input, feeds) if n})


def run_ort(node, opset, feeds, out_types=None):
    data = _model(node, opset, feeds, out_types)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(None, {n: v for n, v in zip(node.input, feeds) if n})


def check(node, opset, feeds, rtol=1e-5, atol=1e-6, out_types=None):
    ours = run_onnxpy(node, opset, feeds, out_types)
    ref = run_ort(node, opset, feeds, out_types)
    assert len(ours) == len(ref)
    assert_outputs_close(ours, ref, rtol, atol)
    return ours


def node(op, inputs, outputs=("y",), **attrs):
    return helper.make_node(op, list(inputs), list(outputs), **attrs)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# --- reductions -----------------------------------------------------------------------------------------------------

REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", REDUCE_OPS + ["ReduceLogSum"])
@pytest.mark.parametrize("axes", [None, [1], [-1, 0], [0, 1, 2]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_float_input_axes(op, axes, keepdims):
    x = randn(3, 4, 5)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    opset = 13 if op == "ReduceSum" else 18
    feeds = [x] if axes is None else [x, np.array(axes, np.int64)]
    check(node(op, ["x", "axes"][: len(feeds)], keepdims=keepdims), opset, feeds, rtol=1e-4)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_attr_axes_opset11(op):
    x = randn(2, 3, 4, dtype=np.float64)
    check(node(op, ["x"], axes=[0, -1], keepdims=0), 11, [x])
    check(node(op, ["x"]), 11, [x])


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                "ReduceL2", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_integers(op, dtype):
    x = RNG.integers(-7, 8, (3, 5)).astype(dtype)
    opset = 13 if op == "ReduceSum" else 18
    check(node(op, ["x", "axes"], keepdims=1), opset, [x, np.array([1], np.int64)])
    check(node(op, ["x", "axes"], keepdims=0), opset, [x, np.array([0], np.int64)])


@pytest.mark.parametrize("op", REDUCE_OPS + ["ReduceLogSum"])
def test_reduce_noop_with_empty_axes(op):
    x = np.abs(randn(2, 3)) + 0.5
    opset = 13 if op == "ReduceSum" else 18
    check(node(op, ["x", "axes"], noop_with_empty_axes=1), opset, [x, np.array([], np.int64)])
    check(node(op, ["x"], noop_with_empty_axes=1), opset, [x])


@pytest.mark.parametrize("op,expected", [("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf),
                                         ("ReduceMin", np.inf), ("ReduceL1", 0.0), ("ReduceL2", 0.0),
                                         ("ReduceSumSquare", 0.0), ("ReduceLogSum", -np.inf),
                                         ("ReduceLogSumExp", -np.inf)])
def test_reduce_empty_set(op, expected):
    x = np.zeros((2, 0, 4), np.float32)
    opset = 13 if op == "ReduceSum" else 18
    (y,) = run_onnxpy(node(op, ["x", "axes"], keepdims=1), opset, [x, np.array([1], np.int64)])
    assert y.shape == (2, 1, 4) and y.dtype == np.float32
    assert np.all(y == expected)


def test_reduce_max_min_integers_empty_and_bool():
    x = np.zeros((0, 3), np.int32)
    (y,) = run_onnxpy(node("ReduceMax", ["x", "axes"], keepdims=0), 20, [x, np.array([0], np.int64)])
    np.testing.assert_array_equal(y, np.full(3, np.iinfo(np.int32).min, np.int32))
    b = np.array([[True, False], [False, False]])
    (mx,) = run_onnxpy(node("ReduceMax", ["x", "axes"], keepdims=0), 20, [b, np.array([1], np.int64)])
    (mn,) = run_onnxpy(node("ReduceMin", ["x", "axes"], keepdims=0), 20, [b, np.array([1], np.int64)])
    assert mx.dtype == np.bool_ and mx.tolist() == [True, False]
    assert mn.tolist() == [False, False]


def test_reduce_float16_and_bfloat16():
    x = randn(4, 64).astype(np.float16)
    check(node("ReduceSum", ["x", "axes"]), 13, [x, np.array([1], np.int64)], rtol=2e-3, atol=1e-2)
    check(node("ReduceMean", ["x", "axes"]), 18, [x, np.array([1], np.int64)], rtol=2e-3, atol=1e-3)
    xb = randn(3, 8).astype(ml_dtypes.bfloat16)
    (y,) = run_onnxpy(node("ReduceSum", ["x", "axes"], keepdims=0), 13, [xb, np.array([1], np.int64)])
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(y.astype(np.float32), xb.astype(np.float32).sum(1), rtol=1e-2, atol=1e-2)


def test_reduce_logsumexp_large_values_stable():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0]], np.float32)
    (y,) = run_onnxpy(node("ReduceLogSumExp", ["x", "axes"], keepdims=0), 18, [x, np.array([1], np.int64)])
    np.testing.assert_allclose(y, [1000 + np.log(2), -1000 + np.log(2)], rtol=1e-6)


def test_reduce_bad_axis_raises():
    with pytest.raises(Exception, match="out of range"):
        run_onnxpy(node("ReduceSum", ["x", "axes"]), 13, [randn(2, 3), np.array([2], np.int64)])


# --- ArgMax / ArgMin / TopK -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("axis,keepdims", [(0, 1), (-1, 0), (1, 1)])
def test_arg_ops_with_ties(op, select_last_index, axis, keepdims):
    x = RNG.integers(0, 3, (4, 5, 3)).astype(np.float32)
    check(node(op, ["x"], axis=axis, keepdims=keepdims, select_last_index=select_last_index), 13, [x])
    xi = RNG.integers(-2, 2, (6, 7)).astype(np.int64)
    check(node(op, ["x"], axis=axis % 2, keepdims=keepdims, select_last_index=select_last_index), 13, [xi])


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("shape,axis,k", [((3, 20), -1, 5), ((7, 4), 0, 3), ((2, 3000), 1, 40), ((3, 2000, 2), 1, 7),
                                          ((5, 6), 1, 0), ((5, 6), 1, 6)])
def test_topk_ties_match_onnxruntime(largest, shape, axis, k):
    x = RNG.integers(0, 10, shape).astype(np.float32)  # many ties: lower index must come first
    check(node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest), 11, [x, np.array([k], np.int64)])
    xr = randn(*shape)
    check(node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest), 11, [xr, np.array([k], np.int64)])


@pytest.mark.parametrize("dtype", [np.uint8, np.int64, np.float64, np.int32])
def test_topk_dtypes(dtype):
    x = RNG.integers(0, 200, (4, 1000)).astype(dtype)
    check(node("TopK", ["x", "k"], ["v", "i"]), 11, [x, np.array([10], np.int64)])
    check(node("TopK", ["x", "k"], ["v", "i"], largest=0), 11, [x, np.array([10], np.int64)])


def test_topk_uint64_against_numpy():
    x = RNG.integers(0, 5, (3, 700)).astype(np.uint64)
    x[0, 0] = np.iinfo(np.uint64).max
    for largest in (0, 1):
        v, i = run_onnxpy(node("TopK", ["x", "k"], ["v", "i"], largest=largest), 24, [x, np.array([20], np.int64)])
        key = -x.astype(np.float64) if largest else x.astype(np.float64)
        ref = np.argsort(key, axis=-1, kind="stable")[:, :20]
        np.testing.assert_array_equal(i, ref)
        np.testing.assert_array_equal(v, np.take_along_axis(x, ref, axis=-1))
        assert v.dtype == np.uint64 and i.dtype == np.int64


def test_topk_old_versions_and_nan():
    x = randn(3, 6)
    check(node("TopK", ["x"], ["v", "i"], k=2), 1, [x])
    check(node("TopK", ["x", "k"], ["v", "i"], axis=0), 10, [x, np.array([2], np.int64)])
    xn = np.array([1, np.nan, 3, 2, np.nan], np.float32)
    check(node("TopK", ["x", "k"], ["v", "i"]), 11, [xn, np.array([3], np.int64)])
    check(node("TopK", ["x", "k"], ["v", "i"], largest=0), 11, [xn, np.array([3], np.int64)])


def test_topk_k_too_large_raises():
    with pytest.raises(Exception, match="out of range"):
        run_onnxpy(node("TopK", ["x", "k"], ["v", "i"]), 11, [randn(2, 3), np.array([4], np.int64)])


# --- CumSum / CumProd -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
def test_cumsum(exclusive, reverse, axis, dtype):
    x = RNG.integers(-5, 5, (3, 4, 5)).astype(dtype)
    check(node("CumSum", ["x", "a"], exclusive=exclusive, reverse=reverse), 14, [x, np.array(axis, np.int32)])


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumprod_against_numpy(exclusive, reverse):
    x = RNG.integers(1, 4, (3, 5)).astype(np.int64)
    (y,) = run_onnxpy(node("CumProd", ["x", "a"], exclusive=exclusive, reverse=reverse), 26,
                      [x, np.array([1], np.int64)])
    w = x[:, ::-1] if reverse else x
    ref = np.cumprod(w, axis=1)
    if exclusive:
        ref = np.concatenate([np.ones((3, 1), np.int64), ref[:, :-1]], axis=1)
    if reverse:
        ref = ref[:, ::-1]
    np.testing.assert_array_equal(y, ref)
    assert y.dtype == np.int64


def test_cumsum_empty_axis():
    (y,) = run_onnxpy(node("CumSum", ["x", "a"], exclusive=1), 14, [np.zeros((2, 0), np.float32), np.array(1)])
    assert y.shape == (2, 0)


# --- MatMul / Gemm / MatMulInteger / Einsum / Det -------------------------------------------------------------------


@pytest.mark.parametrize("sa,sb", [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((5, 2, 3), (3, 4)),
                                   ((2, 1, 2, 3), (4, 3, 5)), ((4, 0), (0, 3)), ((1, 6, 64), (64, 32))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.float16])
def test_matmul_shapes_and_dtypes(sa, sb, dtype):
    a = RNG.integers(-3, 4, sa).astype(dtype)
    b = RNG.integers(-3, 4, sb).astype(dtype)
    tol = 1e-2 if dtype == np.float16 else 1e-6
    check(node("MatMul", ["a", "b"]), 13, [a, b], rtol=tol, atol=tol)


def test_matmul_shape_mismatch_raises():
    with pytest.raises(Exception, match="MatMul"):
        run_onnxpy(node("MatMul", ["a", "b"]), 13, [randn(2, 3), randn(4, 2)])


@pytest.mark.parametrize("transA,transB", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (5,), (3, 1), (1, 5), (3, 5)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (1.0, 0.0)])
def test_gemm(transA, transB, c_shape, alpha, beta):
    a = randn(4, 3) if transA else randn(3, 4)
    b = randn(5, 4) if transB else randn(4, 5)
    feeds = [a, b] if c_shape is None else [a, b, randn(*c_shape)]
    n = node("Gemm", ["a", "b", "c"][: len(feeds)], transA=transA, transB=transB, alpha=alpha, beta=beta)
    check(n, 13, feeds)


def test_gemm_old_opsets_and_types():
    a, b, c = randn(3, 4, dtype=np.float64), randn(4, 2, dtype=np.float64), randn(2, dtype=np.float64)
    (y6,) = run_onnxpy(node("Gemm", ["a", "b", "c"], broadcast=1), 6, [a, b, c])  # onnxruntime lacks Gemm-6
    np.testing.assert_allclose(y6, a @ b + c, rtol=1e-12)
    check(node("Gemm", ["a", "b", "c"]), 7, [a, b, c])
    check(node("Gemm", ["a", "b", "c"], alpha=2.0), 9, [a, b, c])
    ai = RNG.integers(-4, 4, (3, 4)).astype(np.int32)
    bi = RNG.integers(-4, 4, (4, 2)).astype(np.int32)
    ci = RNG.integers(-4, 4, (2,)).astype(np.int32)
    (y,) = run_onnxpy(node("Gemm", ["a", "b", "c"]), 13, [ai, bi, ci])
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, ai @ bi + ci)


def test_gemm_bad_c_raises():
    with pytest.raises(Exception, match="broadcast"):
        run_onnxpy(node("Gemm", ["a", "b", "c"]), 13, [randn(3, 4), randn(4, 5), randn(4)])


def test_matmul_integer_scalar_zero_points():
    a = RNG.integers(0, 255, (2, 4, 3)).astype(np.uint8)
    b = RNG.integers(-128, 127, (3, 5)).astype(np.int8)
    check(node("MatMulInteger", ["a", "b", "az", "bz"]), 10, [a, b, np.array(12, np.uint8), np.array(-3, np.int8)])
    check(node("MatMulInteger", ["a", "b"]), 10, [a, b])


def test_matmul_integer_per_row_and_column_zero_points():
    a = RNG.integers(0, 255, (4, 3)).astype(np.uint8)
    b = RNG.integers(0, 255, (3, 5)).astype(np.uint8)
    az = RNG.integers(0, 255, (4,)).astype(np.uint8)
    bz = RNG.integers(0, 255, (5,)).astype(np.uint8)
    (y,) = run_onnxpy(node("MatMulInteger", ["a", "b", "az", "bz"]), 10, [a, b, az, bz])
    ref = (a.astype(np.int32) - az.astype(np.int32)[:, None]) @ (b.astype(np.int32) - bz.astype(np.int32))
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ij", [(3, 4)]),
    ("ba,cb", [(3, 4), (2, 3)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij->...", [(2, 3, 4)]),
    ("i,i", [(5,), (5,)]),
    ("bhqd, bhkd -> bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij->", [(3, 4)]),
])
def test_einsum(eq, shapes):
    feeds = [randn(*s) for s in shapes]
    names = [f"x{i}" for i in range(len(feeds))]
    check(node("Einsum", names, equation=eq), 12, feeds, rtol=1e-5)


def test_einsum_integers():
    feeds = [RNG.integers(-3, 3, (3, 4)).astype(np.int64), RNG.integers(-3, 3, (4, 2)).astype(np.int64)]
    check(node("Einsum", ["a", "b"], equation="ij,jk->ik"), 12, feeds)


def test_det():
    # onnxruntime's CPU provider has no Det kernel: compare with numpy
    for x, opset in ((randn(3, 3), 11), (randn(2, 4, 5, 5, dtype=np.float64), 22), (randn(2, 2, dtype=np.float16), 22)):
        (y,) = run_onnxpy(node("Det", ["x"]), opset, [x])
        assert y.dtype == x.dtype and y.shape == x.shape[:-2]
        np.testing.assert_allclose(y.astype(np.float64), np.linalg.det(x.astype(np.float64)), rtol=2e-3, atol=1e-3)


# --- normalization --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,axis", [((2, 3, 8), -1), ((2, 3, 8), 1), ((4, 6), 0), ((2, 3, 4, 5), -2), ((5,), 0)])
def test_layer_norm_with_stats(shape, axis):
    x = randn(*shape)
    ns = shape[axis:] if axis >= 0 else shape[axis:]
    s, b = randn(*ns), randn(*ns)
    check(node("LayerNormalization", ["x", "s", "b"], ["y", "m", "i"], axis=axis, epsilon=1e-3), 17, [x, s, b],
          rtol=1e-4, atol=1e-5)


def test_layer_norm_broadcast_scale_no_bias_and_dtypes():
    x = randn(2, 3, 16)
    check(node("LayerNormalization", ["x", "s"]), 17, [x, randn(1, 16)], rtol=1e-4, atol=1e-5)
    check(node("LayerNormalization", ["x", "s", "b"], axis=1), 17, [x, randn(1, 16), randn(16)], rtol=1e-4, atol=1e-5)
    xd = randn(4, 10, dtype=np.float64)
    check(node("LayerNormalization", ["x", "s", "b"], ["y", "m", "i"]), 17,
          [xd, randn(10, dtype=np.float64), randn(10, dtype=np.float64)], rtol=1e-5, atol=1e-6)
    xh = randn(4, 32, dtype=np.float16)
    check(node("LayerNormalization", ["x", "s", "b"]), 17,
          [xh, randn(32, dtype=np.float16), randn(32, dtype=np.float16)], rtol=5e-3, atol=5e-3)


def test_layer_norm_full_shape_scale():
    x = randn(2, 3, 4)
    check(node("LayerNormalization", ["x", "s", "b"], axis=-1), 17, [x, randn(2, 3, 4), randn(4)], rtol=1e-4, atol=1e-5)


def test_rms_normalization_against_numpy():
    x = randn(2, 5, 8)
    s = randn(8)
    (y,) = run_onnxpy(node("RMSNormalization", ["x", "s"], epsilon=1e-5), 23, [x, s])
    ref = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * s
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    (y2,) = run_onnxpy(node("RMSNormalization", ["x", "s"], axis=1), 23, [x, randn(5, 8)])
    assert y2.shape == x.shape
    (y3,) = run_onnxpy(node("RMSNormalization", ["x", "s"]), 23, [x.astype(np.float16), s.astype(np.float64)])
    assert y3.dtype == np.float64  # the output takes the scale's type


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 4, 7), (1, 2, 3, 2, 2)])
def test_instance_norm(shape):
    C = shape[1]
    check(node("InstanceNormalization", ["x", "s", "b"], epsilon=1e-4), 6, [randn(*shape), randn(C), randn(C)],
          rtol=1e-4, atol=1e-5)


def _group_norm_ref(x, g, scale_c, bias_c, eps):
    N, C = x.shape[:2]
    xr = x.reshape(N, g, -1)
    y = (xr - xr.mean(-1, keepdims=True)) / np.sqrt(xr.var(-1, keepdims=True) + eps)
    y = y.reshape(x.shape)
    cs = (1, C) + (1,) * (x.ndim - 2)
    return y * scale_c.reshape(cs) + bias_c.reshape(cs)


def test_group_norm_opset18_and_21():
    x = randn(2, 6, 4, 3)
    sg, bg = randn(3), randn(3)
    (y18,) = run_onnxpy(node("GroupNormalization", ["x", "s", "b"], num_groups=3, epsilon=1e-3), 18, [x, sg, bg])
    np.testing.assert_allclose(y18, _group_norm_ref(x, 3, np.repeat(sg, 2), np.repeat(bg, 2), 1e-3), rtol=1e-4,
                               atol=1e-5)
    sc, bc = randn(6), randn(6)
    (y21,) = run_onnxpy(node("GroupNormalization", ["x", "s", "b"], num_groups=3, epsilon=1e-3), 21, [x, sc, bc])
    np.testing.assert_allclose(y21, _group_norm_ref(x, 3, sc, bc, 1e-3), rtol=1e-4, atol=1e-5)
    check(node("GroupNormalization", ["x", "s", "b"], num_groups=2), 21, [x, sc, bc], rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="num_groups"):
        run_onnxpy(node("GroupNormalization", ["x", "s", "b"], num_groups=4), 21, [x, sc, bc])


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3), (2, 3, 5)])
def test_batch_norm_inference(shape):
    C = shape[1]
    feeds = [randn(*shape), randn(C), randn(C), randn(C), np.abs(randn(C)) + 0.1]
    check(node("BatchNormalization", ["x", "s", "b", "m", "v"]), 15, feeds, rtol=1e-4, atol=1e-5)
    check(node("BatchNormalization", ["x", "s", "b", "m", "v"], epsilon=1e-2), 9, feeds, rtol=1e-4, atol=1e-5)
    (y6,) = run_onnxpy(node("BatchNormalization", ["x", "s", "b", "m", "v"], is_test=1), 6, feeds)
    cs = (1, C) + (1,) * (len(shape) - 2)
    x, s, b, m, v = feeds
    ref = (x - m.reshape(cs)) / np.sqrt(v.reshape(cs) + 1e-5) * s.reshape(cs) + b.reshape(cs)
    np.testing.assert_allclose(y6, ref, rtol=1e-4, atol=1e-5)


def test_batch_norm_training_outputs():
    x = randn(4, 3, 5, 2)
    feeds = [x, randn(3), randn(3), randn(3), np.abs(randn(3)) + 0.1]
    check(node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1, momentum=0.8),
          15, feeds, rtol=1e-4, atol=1e-5)
    check(node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv", "sm", "sv"]), 9, feeds,
          rtol=1e-4, atol=1e-5)


def test_batch_norm_float16_and_non_spatial():
    C = 4
    feeds = [randn(2, C, 3, dtype=np.float16)] + [randn(C, dtype=np.float16) for _ in range(3)]
    feeds.append((np.abs(randn(C)) + 0.5).astype(np.float16))
    check(node("BatchNormalization", ["x", "s", "b", "m", "v"]), 15, feeds, rtol=5e-3, atol=5e-3)
    x = randn(2, 3, 4)
    p = [randn(3, 4), randn(3, 4), randn(3, 4), np.abs(randn(3, 4)) + 0.1]
    (y,) = run_onnxpy(node("BatchNormalization", ["x", "s", "b", "m", "v"], spatial=0, is_test=1), 6, [x] + p)
    ref = (x - p[2]) / np.sqrt(p[3] + 1e-5) * p[0] + p[1]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1, 1])
def test_lp_normalization(p, axis):
    x = randn(3, 4, 5)
    x[1] = 0.0
    (y,) = run_onnxpy(node("LpNormalization", ["x"], p=p, axis=axis), 22, [x])
    norm = np.linalg.norm(x, ord=p, axis=axis, keepdims=True) if p == 2 else np.abs(x).sum(axis, keepdims=True)
    ref = np.where(norm == 0, 0, x / np.where(norm == 0, 1, norm))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_mvn():
    check(node("MeanVarianceNormalization", ["x"]), 13, [randn(2, 3, 4, 5)], rtol=1e-4, atol=1e-5)
    check(node("MeanVarianceNormalization", ["x"], axes=[1]), 13, [randn(2, 3, 4)], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("size", [1, 3, 5, 9])
def test_lrn(size):
    check(node("LRN", ["x"], size=size, alpha=1e-2, beta=0.6, bias=1.5), 13, [randn(2, 6, 3, 3)], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("size", [2, 4])
def test_lrn_even_size_against_formula(size):
    x = randn(2, 5, 3)
    (y,) = run_onnxpy(node("LRN", ["x"], size=size, alpha=0.1, beta=0.75, bias=2.0), 13, [x])
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    ss = np.stack([np.sum(x[:, max(0, c - lo): c + hi + 1] ** 2, axis=1) for c in range(5)], axis=1)
    np.testing.assert_allclose(y, x / (2.0 + 0.1 / size * ss) ** 0.75, rtol=1e-5)


# --- dropout / random ----------------------------------------------------------------------------------------------


def test_dropout_inference_versions():
    x = randn(3, 4)
    for opset in (7, 10, 12, 13, 22):
        y, m = run_onnxpy(node("Dropout", ["x"], ["y", "m"]), opset, [x])
        np.testing.assert_array_equal(y, x)
        assert m.shape == x.shape and bool(np.all(m))
    y, m = run_onnxpy(node("Dropout", ["x", "r"], ["y", "m"]), 13, [x, np.array(0.3, np.float32)])
    assert m.dtype == np.bool_ and m.all()


def test_dropout_training_seed_and_scale():
    x = np.ones((200, 50), np.float32)
    feeds = [x, np.array(0.25, np.float32), np.array(True)]
    y1, m1 = run_onnxpy(node("Dropout", ["x", "r", "t"], ["y", "m"], seed=7), 13, feeds)
    y2, _ = run_onnxpy(node("Dropout", ["x", "r", "t"], ["y", "m"], seed=7), 13, feeds)
    np.testing.assert_array_equal(y1, y2)
    assert m1.dtype == np.bool_
    assert 0.7 < m1.mean() < 0.8
    np.testing.assert_allclose(y1[m1], 1 / 0.75, rtol=1e-6)
    assert np.all(y1[~m1] == 0)
    y3, m3 = run_onnxpy(node("Dropout", ["x", "r", "t"], ["y", "m"]), 13, [x, np.array(0.0, np.float32),
                                                                            np.array(True)])
    np.testing.assert_array_equal(y3, x)


def test_random_ops_shape_dtype_range_and_seed():
    (n1,) = run_onnxpy(node("RandomNormal", [], shape=[200, 50], mean=2.0, scale=0.5, seed=3.0), 22, [])
    (n2,) = run_onnxpy(node("RandomNormal", [], shape=[200, 50], mean=2.0, scale=0.5, seed=3.0), 22, [])
    assert n1.dtype == np.float32 and n1.shape == (200, 50)
    np.testing.assert_array_equal(n1, n2)
    assert abs(n1.mean() - 2.0) < 0.05 and abs(n1.std() - 0.5) < 0.05
    (u,) = run_onnxpy(node("RandomUniform", [], shape=[1000], low=-2.0, high=3.0, dtype=TensorProto.DOUBLE), 22, [])
    assert u.dtype == np.float64 and u.min() >= -2 and u.max() < 3
    x = np.zeros((4, 5), np.float16)
    (nl,) = run_onnxpy(node("RandomNormalLike", ["x"]), 22, [x])
    assert nl.dtype == np.float16 and nl.shape == (4, 5)
    (ul,) = run_onnxpy(node("RandomUniformLike", ["x"], dtype=TensorProto.FLOAT), 22, [x])
    assert ul.dtype == np.float32 and ((ul >= 0) & (ul < 1)).all()


def test_bernoulli_and_multinomial():
    p = np.array([0.0, 1.0, 0.5] * 1000, np.float32)
    (b,) = run_onnxpy(node("Bernoulli", ["p"], seed=1.0), 22, [p])
    assert b.dtype == np.float32
    assert (b[0::3] == 0).all() and (b[1::3] == 1).all() and 0.4 < b[2::3].mean() < 0.6
    (bi,) = run_onnxpy(node("Bernoulli", ["p"], dtype=TensorProto.INT32), 22, [p])
    assert bi.dtype == np.int32
    logits = np.log(np.array([[0.1, 0.0, 0.9], [1.0, 0.0, 0.0]], np.float32) + 1e-30)
    (s,) = run_onnxpy(node("Multinomial", ["x"], sample_size=2000, seed=5.0), 22, [logits])
    assert s.dtype == np.int32 and s.shape == (2, 2000)
    assert (s[1] == 0).all() and set(np.unique(s[0])) <= {0, 2}
    assert 0.85 < (s[0] == 2).mean() < 0.95
    (s64,) = run_onnxpy(node("Multinomial", ["x"], dtype=TensorProto.INT64), 22, [logits])
    assert s64.dtype == np.int64 and s64.shape == (2, 1)


# --- losses ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore", [None, 1, -5])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 2, 2)])
def test_nll_and_sce(reduction, weighted, ignore, shape):
    C = shape[1]
    tshape = (shape[0],) + shape[2:]
    target = RNG.integers(0, C, tshape).astype(np.int64)
    if ignore is not None:
        target.reshape(-1)[0] = ignore
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    x = randn(*shape)
    feeds = [x, target] + ([np.abs(randn(C)) + 0.1] if weighted else [])
    names = ["x", "t", "w"][: len(feeds)]
    check(node("NegativeLogLikelihoodLoss", names, **attrs), 13, feeds, rtol=1e-5)
    check(node("SoftmaxCrossEntropyLoss", names, ["l", "lp"], **attrs), 13, feeds, rtol=1e-5)


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 0), (0, 4)), ((0, 3, 5), (5, 2)), ((2, 0, 5), (5, 2))])
def test_matmul_batched_empty(a_shape, b_shape):
    from onnxpy.ops.linalg import matmul

    a = np.ones(a_shape, np.float32)
    b = np.ones(b_shape, np.float32)
    np.testing.assert_array_equal(matmul(a, b), np.matmul(a, b))
