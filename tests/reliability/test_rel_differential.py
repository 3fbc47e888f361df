"""Differential testing against onnxruntime (test-time oracle only) with hypothesis-generated inputs."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper

import onnxpy

ort = pytest.importorskip("onnxruntime")

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
FLOATS = [np.float32, np.float64]
NUMERIC = [np.float32, np.float64, np.int32, np.int64]


def _elements(dt, allow_zero=True):
    dt = np.dtype(dt)
    if dt.kind == "f":
        return st.floats(-50, 50, width=32 if dt == np.float32 else 64, allow_nan=False)
    if dt.kind == "b":
        return st.booleans()
    lo, hi = (-50, 50) if dt.kind == "i" else (0, 50)
    s = st.integers(lo, hi)
    return s if allow_zero else s.filter(lambda v: v != 0)


def arrays(dt, shape, allow_zero=True):
    return hnp.arrays(dt, shape, elements=_elements(dt, allow_zero))


def compare(node, feeds: dict, opset=18, rtol=1e-4, atol=1e-5):
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in feeds.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output]
    m = helper.make_model(helper.make_graph([node], "diff", ins, outs),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    data = m.SerializeToString()
    try:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        exp = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except ort.capi.onnxruntime_pybind11_state.NotImplemented:
        return  # onnxruntime lacks this type/op combination; onnxpy may support more
    except Exception:  # noqa: BLE001 - onnxruntime refuses: onnxpy must refuse too
        with pytest.raises(Exception):  # noqa: B017
            onnxpy.InferenceSession(data).run(None, feeds)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = onnxpy.InferenceSession(data).run(None, feeds)
    assert len(got) == len(exp)
    for g, e in zip(got, exp):
        assert g.dtype == e.dtype, (node.op_type, g.dtype, e.dtype)
        assert g.shape == e.shape, (node.op_type, g.shape, e.shape)
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, e)


@st.composite
def broadcast_pair(draw, dtypes=NUMERIC, allow_zero_rhs=True):
    dt = draw(st.sampled_from(dtypes))
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, min_side=0, max_side=4))
    a = draw(arrays(dt, shapes.input_shapes[0]))
    b = draw(arrays(dt, shapes.input_shapes[1], allow_zero=allow_zero_rhs))
    return a, b


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@SETTINGS
@given(data=st.data())
def test_binary_broadcast(op, data):
    a, b = data.draw(broadcast_pair())
    compare(helper.make_node(op, ["A", "B"], ["Y"]), {"A": a, "B": b})


@SETTINGS
@given(pair=broadcast_pair(allow_zero_rhs=False))
def test_div(pair):
    a, b = pair
    compare(helper.make_node("Div", ["A", "B"], ["Y"]), {"A": a, "B": b})


def test_matmul_batched_empty_k():
    """(B, M, 0) @ (0, N) must give zeros (found by hypothesis; linalg.matmul reshapes with -1 on an empty array)."""
    a = np.zeros((2, 3, 0), np.float32)
    b = np.zeros((0, 4), np.float32)
    compare(helper.make_node("MatMul", ["A", "B"], ["Y"]), {"A": a, "B": b})


@SETTINGS
@given(dt=st.sampled_from(NUMERIC), m=st.integers(0, 4), k=st.integers(1, 4), n=st.integers(0, 4),
       batch=st.sampled_from([(), (2,), (1, 3)]), data=st.data())
def test_matmul(dt, m, k, n, batch, data):
    a = data.draw(arrays(dt, batch + (m, k)))
    b = data.draw(arrays(dt, (k, n)))
    compare(helper.make_node("MatMul", ["A", "B"], ["Y"]), {"A": a, "B": b}, rtol=1e-4, atol=1e-3)


@SETTINGS
@given(dt=st.sampled_from(FLOATS), m=st.integers(1, 4), k=st.integers(1, 4), n=st.integers(1, 4),
       ta=st.integers(0, 1), tb=st.integers(0, 1), alpha=st.sampled_from([1.0, 0.5]), beta=st.sampled_from([1.0, 2.0]),
       cshape=st.sampled_from(["none", "scalar", "row", "full"]), data=st.data())
def test_gemm(dt, m, k, n, ta, tb, alpha, beta, cshape, data):
    a = data.draw(arrays(dt, (k, m) if ta else (m, k)))
    b = data.draw(arrays(dt, (n, k) if tb else (k, n)))
    feeds = {"A": a, "B": b}
    ins = ["A", "B"]
    if cshape != "none":
        feeds["C"] = data.draw(arrays(dt, {"scalar": (), "row": (n,), "full": (m, n)}[cshape]))
        ins.append("C")
    compare(helper.make_node("Gemm", ins, ["Y"], transA=ta, transB=tb, alpha=alpha, beta=beta), feeds, atol=1e-3)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Neg", "Abs", "Exp", "Tanh"])
@SETTINGS
@given(dt=st.sampled_from(FLOATS), shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
       data=st.data())
def test_unary(op, dt, shape, data):
    compare(helper.make_node(op, ["X"], ["Y"]), {"X": data.draw(arrays(dt, shape))})


@SETTINGS
@given(dt=st.sampled_from(FLOATS), shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5),
       data=st.data(), opset=st.sampled_from([11, 13]))
def test_softmax(dt, shape, data, opset):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    compare(helper.make_node("Softmax", ["X"], ["Y"], axis=axis), {"X": data.draw(arrays(dt, shape))}, opset=opset)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
@SETTINGS
@given(dt=st.sampled_from(NUMERIC), shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4),
       keepdims=st.integers(0, 1), data=st.data())
def test_reduce(op, dt, shape, keepdims, data):
    if op == "ReduceMean" and np.dtype(dt).kind != "f":
        dt = np.float32
    x = data.draw(arrays(dt, shape))
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape),
                              unique_by=lambda a: a % len(shape)))
    feeds = {"X": x}
    ins = ["X"]
    if axes:
        feeds["axes"] = np.array(axes, np.int64)
        ins.append("axes")
    if op == "ReduceProd":  # keep products in range (integer overflow is unspecified)
        feeds["X"] = (np.clip(x, -1, 1) if np.dtype(dt).kind in "iu" else np.clip(x, -3, 3)).astype(dt)
    compare(helper.make_node(op, ins, ["Y"], keepdims=keepdims), feeds, opset=18, atol=1e-3)


@SETTINGS
@given(dt=st.sampled_from(NUMERIC + [np.bool_]),
       shape=hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=4), data=st.data())
def test_transpose(dt, shape, data):
    perm = list(data.draw(st.permutations(list(range(len(shape))))))
    node = helper.make_node("Transpose", ["X"], ["Y"], **({"perm": perm} if perm else {}))
    compare(node, {"X": data.draw(arrays(dt, shape))})


@SETTINGS
@given(dt=st.sampled_from(NUMERIC), shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4),
       n=st.integers(1, 4), data=st.data())
def test_concat(dt, shape, n, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    feeds = {}
    for i in range(n):
        s = list(shape)
        s[axis] = data.draw(st.integers(0, 3))
        feeds[f"x{i}"] = data.draw(arrays(dt, tuple(s)))
    compare(helper.make_node("Concat", list(feeds), ["Y"], axis=axis), feeds)


@SETTINGS
@given(dt=st.sampled_from(NUMERIC), shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=6),
       data=st.data())
def test_slice(dt, shape, data):
    x = data.draw(arrays(dt, shape))
    r = len(shape)
    axes = data.draw(st.lists(st.integers(-r, r - 1), min_size=1, max_size=r, unique_by=lambda a: a % r))
    big = st.integers(-8, 8) | st.sampled_from([2**62, -(2**62)])
    starts = [data.draw(big) for _ in axes]
    ends = [data.draw(big) for _ in axes]
    steps = [data.draw(st.sampled_from([1, 2, -1, -2, 3])) for _ in axes]
    feeds = {"X": x, "s": np.array(starts, np.int64), "e": np.array(ends, np.int64),
             "a": np.array(axes, np.int64), "p": np.array(steps, np.int64)}
    compare(helper.make_node("Slice", ["X", "s", "e", "a", "p"], ["Y"]), feeds)


@SETTINGS
@given(dt=st.sampled_from(NUMERIC), shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5),
       ishape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3), data=st.data())
def test_gather(dt, shape, ishape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    idx = data.draw(hnp.arrays(np.int64, ishape, elements=st.integers(-n, n - 1)))
    compare(helper.make_node("Gather", ["X", "I"], ["Y"], axis=axis), {"X": data.draw(arrays(dt, shape)), "I": idx})


@SETTINGS
@given(dt=st.sampled_from(NUMERIC), data=st.data())
def test_where(dt, data):
    shapes = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, min_side=0, max_side=3))
    c, a, b = shapes.input_shapes
    feeds = {"C": data.draw(arrays(np.bool_, c)), "A": data.draw(arrays(dt, a)), "B": data.draw(arrays(dt, b))}
    compare(helper.make_node("Where", ["C", "A", "B"], ["Y"]), feeds)


CAST_TYPES = [np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8, np.bool_, np.float16]


@SETTINGS
@given(src=st.sampled_from(CAST_TYPES), dst=st.sampled_from(CAST_TYPES),
       shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4), data=st.data())
def test_cast(src, dst, shape, data):
    dt = np.dtype(src)
    if dt.kind == "f":
        el = st.floats(-100, 100, width=16 if dt == np.float16 else 32).map(lambda v: float(np.trunc(v)))
    elif dt.kind == "b":
        el = st.booleans()
    else:
        el = st.integers(0 if dt.kind == "u" else -100, 100)
    x = data.draw(hnp.arrays(dt, shape, elements=el))
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    compare(helper.make_node("Cast", ["X"], ["Y"], to=to), {"X": x}, opset=13)


@SETTINGS
@given(dt=st.sampled_from(FLOATS), n=st.integers(1, 2), cin=st.integers(1, 3), cout=st.integers(1, 3),
       h=st.integers(1, 6), w=st.integers(1, 6), k=st.integers(1, 3), stride=st.integers(1, 2),
       pad=st.integers(0, 1), dil=st.integers(1, 2), bias=st.booleans(), data=st.data())
def test_conv_small(dt, n, cin, cout, h, w, k, stride, pad, dil, bias, data):
    if (k - 1) * dil + 1 > min(h, w) + 2 * pad:
        k = 1
    feeds = {"X": data.draw(arrays(dt, (n, cin, h, w))), "W": data.draw(arrays(dt, (cout, cin, k, k)))}
    ins = ["X", "W"]
    if bias:
        feeds["B"] = data.draw(arrays(dt, (cout,)))
        ins.append("B")
    node = helper.make_node("Conv", ins, ["Y"], strides=[stride, stride], pads=[pad] * 4, dilations=[dil, dil])
    compare(node, feeds, opset=11, rtol=1e-4, atol=1e-2)


def test_onnx_version_sanity():
    assert onnx.defs.onnx_opset_version() >= 18
