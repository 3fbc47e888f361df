"""Per-run overhead fast paths: plan-time kernel specialisations on constant inputs, the lean run() path, the If
branch entry and the in-place donor.

Each specialised kernel is checked against the generic kernel: the same one-node model is run once with the
constant inputs as initializers (the planner specialises the step) and once with them fed as graph inputs (the
generic kernel runs); results must be identical and failures must raise the same error.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, ValueInfoProto, helper, numpy_helper

import onnxpy
from onnxpy.dtypes import from_numpy
from onnxpy.ops._shape_util import NOT_CONST

OPSET = 18


def _model(op, data, consts, n_out=1, opset=OPSET, as_init=True, shapes=True, **attrs):
    """One-node model: ``data`` (list of fed arrays) then ``consts`` (initializers when ``as_init``; None: an
    absent optional input)."""
    names, vis, inits, feeds = [], [], [], {}
    for i, x in enumerate(data):
        nm = f"d{i}"
        names.append(nm)
        vis.append(helper.make_tensor_value_info(nm, from_numpy(x.dtype), list(x.shape) if shapes else None))
        feeds[nm] = x
    for i, c in enumerate(consts):
        if c is None:
            names.append("")
            continue
        nm = f"c{i}"
        names.append(nm)
        c = np.asarray(c)
        if as_init:
            inits.append(numpy_helper.from_array(c, nm))
        else:
            vis.append(helper.make_tensor_value_info(nm, from_numpy(c.dtype), list(c.shape)))
            feeds[nm] = c
    outs = [f"y{j}" for j in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    g = helper.make_graph([node], "g", vis, [ValueInfoProto(name=o) for o in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString(), feeds


def _session(model):
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the node as it is
    return onnxpy.InferenceSession(model, so)


def _run(sess, feeds):
    try:
        return sess.run(None, feeds), None
    except Exception as e:  # noqa: BLE001 - compared below
        return None, e


def _same(a, b):
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
        if a.dtype.kind == "f":
            np.testing.assert_array_equal(a, b)
        else:
            assert a.tolist() == b.tolist()


def check(op, data, consts, n_out=1, opset=OPSET, specialised=True, **attrs):
    """Specialised (constants as initializers) vs generic (constants fed) results, or the same error."""
    m_fast, f_fast = _model(op, data, consts, n_out, opset, True, **attrs)
    m_gen, f_gen = _model(op, data, consts, n_out, opset, False, **attrs)
    fast, gen = _session(m_fast), _session(m_gen)
    fn = fast._plan.steps[0].fn
    if specialised:
        assert getattr(fn, "__module__", "").startswith("onnxpy.ops") and "spec" in fn.__qualname__, fn
    for _ in range(2):  # the second call hits the specialisation's memo
        got, err = _run(fast, f_fast)
        want, werr = _run(gen, f_gen)
        if werr is not None:
            assert err is not None, f"generic raised {werr!r}, specialised returned {got}"
            assert type(err) is type(werr) and str(err) == str(werr)
            continue
        assert err is None, err
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _same(a, b)
    return got


rng = np.random.default_rng(0)


def _f(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ----------------------------------------------------------------------------------------------------------
# shape-manipulation kernels


@pytest.mark.parametrize("shape,target", [
    ((2, 3, 4), [4, -1]), ((2, 3, 4), [0, 12]), ((2, 3, 4), [-1]), ((6,), [2, 3]), ((2, 3), [7, -1]),
    ((2, 3), [0, 0, 0]), ((0, 3), [-1, 3]),
])
def test_reshape(shape, target):
    check("Reshape", [_f(*shape)], [np.array(target, np.int64)])
    check("Reshape", [_f(*shape)], [np.array(target, np.int64)], opset=13)


def test_reshape_allowzero():
    check("Reshape", [_f(0, 3)], [np.array([0, 3], np.int64)], allowzero=1)
    check("Reshape", [_f(2, 3)], [np.array([0, -1], np.int64)], allowzero=1)


@pytest.mark.parametrize("shape,axes", [
    ((1, 3, 1), [0]), ((1, 3, 1), [-1]), ((1, 3, 1), [0, 2]), ((3, 1), [1]), ((3, 2), [1]), ((1,), [0]),
    ((1, 3), [5]), ((1, 1), [0, -2]),
])
def test_squeeze(shape, axes):
    check("Squeeze", [_f(*shape)], [np.array(axes, np.int64)])
    check("Squeeze", [_f(*shape)], [], opset=11, axes=axes)


@pytest.mark.parametrize("shape,axes", [
    ((3,), [0]), ((3,), [-1]), ((2, 3), [0, 3]), ((2, 3), [-1, 1]), ((), [0]), ((2,), [3]), ((2,), [0, 0]),
    ((2, 3), [1, -1, 0]),
])
def test_unsqueeze(shape, axes):
    x = np.asarray(_f(*shape)) if shape else np.array(1.5, np.float32)
    check("Unsqueeze", [x], [np.array(axes, np.int64)])
    check("Unsqueeze", [x], [], opset=11, axes=axes)


def test_unsqueeze_int_and_string():
    check("Unsqueeze", [np.arange(6, dtype=np.int64).reshape(2, 3)], [np.array([1], np.int64)])
    check("Unsqueeze", [np.array(["a", "bc"], dtype=object)], [np.array([0], np.int64)])


@pytest.mark.parametrize("axis", [0, 1, -1, -2, 2])
def test_concat(axis):
    a, b = _f(2, 3), _f(2, 3)
    m_fast, feeds = _model("Concat", [a, b], [], axis=axis)
    s = _session(m_fast)
    assert "spec" in s._plan.steps[0].fn.__qualname__
    m_gen = _model("Concat", [a, b], [], axis=axis)[0]
    got, err = _run(s, feeds)
    if axis == 2:  # out of range: the generic kernel's error
        assert err is not None and "out of range" in str(err)
        return
    np.testing.assert_array_equal(got[0], np.concatenate([a, b], axis=axis))
    assert m_gen  # (same model: Concat's specialisation depends on no constant)


def test_concat_mismatch_and_readonly():
    a, b = _f(2, 3), _f(3, 3)
    s = _session(_model("Concat", [a, b], [], axis=1)[0])
    with pytest.raises(Exception, match="differ outside axis"):
        s.run(None, {"d0": a, "d1": b})
    fn = s._plan.steps[0].fn
    ro = _f(2, 3)
    ro.flags.writeable = False
    np.testing.assert_array_equal(fn(ro, ro), np.concatenate([ro, ro], axis=1))
    np.testing.assert_array_equal(fn(_f(2, 3).astype(np.float64), ro).dtype, np.float64)


@pytest.mark.parametrize("split,n", [([2, 3, 1], 3), ([6], 1), ([0, 6], 2), ([1, 1], 2), (None, 3), (None, 4)])
def test_split(split, n):
    x = _f(2, 6, 3)
    consts = [None if split is None else np.array(split, np.int64)]
    check("Split", [x], consts, n_out=n, opset=13, axis=1)
    check("Split", [x], consts, n_out=n, opset=18, axis=-2)
    if split is None:
        check("Split", [x], [], n_out=n, opset=18, axis=1, num_outputs=n)


def test_split_uneven_num_outputs():
    check("Split", [_f(7, 2)], [], n_out=3, opset=18, axis=0, num_outputs=3)
    check("Split", [_f(7, 2)], [np.array([3, 4], np.int64)], n_out=2, opset=18, axis=0, num_outputs=2)


# ----------------------------------------------------------------------------------------------------------
# indexing


@pytest.mark.parametrize("shape,idx,axis", [
    ((3,), 0, 0), ((3,), -1, 0), ((3,), 3, 0), ((4, 5), 2, 1), ((4, 5), -5, -1), ((4, 5), 5, 1),
    ((3,), [-1], 0), ((3,), [0, 2, 1], 0), ((3,), [[0, 1], [2, -3]], 0), ((4, 5), [1, -1], 1),
    ((4, 5, 2), [[1], [3]], 1), ((4, 5), [4], 0), ((4, 5), [-6], 1), ((2, 3), [0], 2), ((2, 3), [0], -3),
])
def test_gather(shape, idx, axis):
    check("Gather", [np.arange(np.prod(shape), dtype=np.int64).reshape(shape)], [np.array(idx, np.int64)],
          axis=axis)
    check("Gather", [_f(*shape)], [np.array(idx, np.int32)], axis=axis)


def test_gather_changing_dims():
    """One specialised step sees data of several shapes (the per-length memo)."""
    s = _session(_model("Gather", [np.arange(3, dtype=np.int64)], [np.array([-1, 0], np.int64)], shapes=False)[0])
    for n in (3, 5, 2, 3, 1, 0):
        x = np.arange(n, dtype=np.int64) * 10
        if n == 0:
            with pytest.raises(Exception, match="out of range"):
                s.run(None, {"d0": x})
        else:
            (y,) = s.run(None, {"d0": x})
            assert y.tolist() == [x[-1], x[0]]
            y[0] = 99  # results are the caller's (never the memoised indices)
    (y,) = s.run(None, {"d0": np.arange(4, dtype=np.int64)})
    assert y.tolist() == [3, 0]


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0], [2], None, None), ([1, 0], [100, -1], [1, 0], None), ([-1], [-100], [0], [-1]),
    ([0, 0], [9223372036854775807, 2], [0, 2], [2, 1]), ([5], [1], [1], [1]), ([0], [1], [3], None),
    ([0], [1], [0], [0]),
])
def test_slice(starts, ends, axes, steps):
    consts = [np.array(starts, np.int64), np.array(ends, np.int64),
              None if axes is None else np.array(axes, np.int64), None if steps is None else np.array(steps, np.int64)]
    while consts and consts[-1] is None:
        consts.pop()
    check("Slice", [_f(4, 5, 3)], consts)


def test_slice_readonly_data_uses_generic():
    s = _session(_model("Slice", [_f(4, 5)], [np.array([1], np.int64), np.array([3], np.int64)])[0])
    fn = s._plan.steps[0].fn
    x = _f(4, 5)
    x.flags.writeable = False
    np.testing.assert_array_equal(fn(x, np.array([1]), np.array([3])), x[1:3])


# ----------------------------------------------------------------------------------------------------------
# Cast / Shape


@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_])
@pytest.mark.parametrize("to", [TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL, TensorProto.FLOAT16,
                                TensorProto.STRING, TensorProto.FLOAT8E4M3FN, TensorProto.INT4, TensorProto.DOUBLE])
def test_cast(src, to):
    x = (np.array([0.0, 1.5, -2.25, 300.0, 7.0]) if np.dtype(src).kind == "f" else np.array([0, 1, 5, 7, 1]))
    x = x.astype(src)
    fast = check("Cast", [x], [], opset=21, to=to)
    gen = check("Cast", [x], [], opset=13, to=to)
    if to != TensorProto.STRING:
        _same(fast[0], gen[0])


def test_cast_from_string():
    check("Cast", [np.array(["1.5", "-2", "nan"], dtype=object)], [], opset=13, to=TensorProto.FLOAT)


@pytest.mark.parametrize("kw", [{}, {"start": 1}, {"end": -1}])
def test_shape(kw):
    check("Shape", [_f(2, 3, 4)], [], opset=15, specialised=not kw, **kw)


# ----------------------------------------------------------------------------------------------------------
# Pad


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[0, 0, 0, 64], [1, 2, 3, 1], [0, -1, 2, 0], [-1, 1, 1, -2], [0, 0, 0, 0],
                                  [4, 0, 0, 0], [0, 9, 0, 0]])
def test_pad(mode, pads):
    x = _f(4, 8)
    check("Pad", [x], [np.array(pads, np.int64), np.array(1.25, np.float32)], opset=11, mode=mode)
    check("Pad", [x], [np.array(pads, np.int64)], opset=18, mode=mode)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_axes_and_dtypes(mode):
    check("Pad", [_f(2, 3, 4)], [np.array([1, 2, 0, 1], np.int64), None, np.array([2, -3], np.int64)],
          opset=18, mode=mode)
    check("Pad", [np.arange(12, dtype=np.int32).reshape(3, 4)], [np.array([1, 1, 1, 1], np.int64),
                                                                 np.array(7, np.int32)], opset=18, mode=mode)
    check("Pad", [np.zeros((0, 3), np.float32)], [np.array([1, 1, 1, 1], np.int64)], opset=18, mode=mode)


def test_pad_limit_still_enforced():
    m, feeds = _model("Pad", [_f(4, 8)], [np.array([0, 0, 0, 64], np.int64)], opset=18, mode="reflect")
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.max_tensor_bytes", "1000")
    s = onnxpy.InferenceSession(m, so)
    for _ in range(2):
        with pytest.raises(Exception, match="limit"):
            s.run(None, feeds)


# ----------------------------------------------------------------------------------------------------------
# reductions


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "ReduceLogSumExp"])
@pytest.mark.parametrize("axes", [[1], [-1, 0], [], [3]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce(op, axes, keepdims):
    x = _f(2, 3, 4)
    a = np.array(axes, np.int64)
    check(op, [x], [a], opset=18, keepdims=keepdims)
    check(op, [x], [a], opset=18, keepdims=keepdims, noop_with_empty_axes=1)
    if op != "ReduceSum":
        check(op, [x], [], opset=13, keepdims=keepdims, **({"axes": axes} if axes else {}))


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64])
def test_reduce_mean_dtypes(dtype):
    x = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    check("ReduceMean", [x], [np.array([1, 2], np.int64)], opset=18, keepdims=0)
    check("ReduceMean", [np.zeros((2, 0), dtype)], [np.array([1], np.int64)], opset=18, keepdims=0)


# ----------------------------------------------------------------------------------------------------------
# LSTM


def _lstm_consts(I, H, bias=True, dtype=np.float32):
    W = (rng.standard_normal((1, 4 * H, I)) * 0.3).astype(dtype)
    R = (rng.standard_normal((1, 4 * H, H)) * 0.3).astype(dtype)
    B = (rng.standard_normal((1, 8 * H)) * 0.3).astype(dtype) if bias else None
    return W, R, B


@pytest.mark.parametrize("T,Bsz,I,H", [(1, 1, 16, 8), (1, 3, 5, 4), (4, 2, 7, 6), (3, 1, 16, 8), (0, 2, 5, 4)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("states", [True, False])
def test_lstm_constant_weights(T, Bsz, I, H, bias, states):
    W, R, B = _lstm_consts(I, H, bias)
    X = _f(T, Bsz, I)
    m_fast, feeds = _lstm_model(X, W, R, B, states, Bsz, H)
    s = _session(m_fast)
    assert "spec" in s._plan.steps[0].fn.__qualname__
    if T == 0:  # (the generic kernel's behaviour, whatever it is, is kept)
        try:
            _generic_lstm(X, W, R, B, feeds)
        except Exception as e:  # noqa: BLE001
            with pytest.raises(Exception, match=str(type(e).__name__)):
                s.run(None, feeds)
            return
    got = s.run(None, feeds)
    want = _generic_lstm(X, W, R, B, feeds)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.shares_memory(got[0], got[1]) and not np.shares_memory(got[1], got[2])


def _lstm_model(X, W, R, B, states, Bsz, H, outputs=("Y", "Y_h", "Y_c"), state_shapes=True, **attrs):
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(R, "R")]
    if B is not None:
        inits.append(numpy_helper.from_array(B, "B"))
    vis = [helper.make_tensor_value_info("X", from_numpy(X.dtype), list(X.shape) if state_shapes else None)]
    feeds = {"X": X}
    names = ["X", "W", "R", "B" if B is not None else ""]
    if states:
        names += ["", "h0", "c0"]
        for nm in ("h0", "c0"):
            feeds[nm] = _f(1, Bsz, H, dtype=X.dtype)
            vis.append(helper.make_tensor_value_info(nm, from_numpy(X.dtype), [1, Bsz, H] if state_shapes else None))
    node = helper.make_node("LSTM", names, list(outputs), hidden_size=H, **attrs)
    outs = [ValueInfoProto(name=o) for o in outputs if o]
    g = helper.make_graph([node], "g", vis, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m.SerializeToString(), feeds


def _generic_lstm(X, W, R, B, feeds):
    from onnxpy.ops.rnn import lstm

    return [o for o in lstm(X, W, R, B, None, feeds.get("h0"), feeds.get("c0"), hidden_size=W.shape[1] // 4)
            if o is not None]


def test_lstm_vs_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    W, R, B = _lstm_consts(16, 8)
    for T in (1, 5):
        m, feeds = _lstm_model(_f(T, 2, 16), W, R, B, True, 2, 8)
        got = _session(m).run(None, feeds)
        want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_lstm_dtypes(dtype):
    W, R, B = _lstm_consts(6, 5, dtype=dtype)
    X = _f(2, 3, 6, dtype=dtype)
    m, feeds = _lstm_model(X, W, R, B, True, 3, 5)
    s = _session(m)
    assert "spec" in s._plan.steps[0].fn.__qualname__
    got = s.run(None, feeds)
    want = _generic_lstm(X, W, R, B, feeds)
    tol = 2e-3 if dtype == np.float16 else 1e-12
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


def test_lstm_without_y_and_fallbacks():
    W, R, B = _lstm_consts(6, 5)
    X = _f(3, 2, 6)
    m, feeds = _lstm_model(X, W, R, B, True, 2, 5, outputs=("", "Y_h"))
    got = _session(m).run(None, feeds)
    want = _generic_lstm(X, W, R, B, feeds)
    np.testing.assert_allclose(got[0], want[1], rtol=1e-5, atol=1e-6)
    # non-default configurations keep the generic kernel
    for attrs in ({"direction": "bidirectional"}, {"clip": 1.0}, {"input_forget": 1},
                  {"activations": ["Sigmoid", "Tanh", "Relu"]}):
        W2, R2, B2 = (W, R, B) if "direction" not in attrs else (np.concatenate([W, W]), np.concatenate([R, R]),
                                                                  np.concatenate([B, B]))
        m, feeds = _lstm_model(X, W2, R2, B2, False, 2, 5, **attrs)
        assert "spec" not in getattr(_session(m)._plan.steps[0].fn, "__qualname__", "")
    # a wrong state shape goes to the generic kernel, which reports it
    m, feeds = _lstm_model(X, W, R, B, True, 2, 5, state_shapes=False)
    s = _session(m)
    feeds["h0"] = _f(1, 3, 5)
    with pytest.raises(Exception, match="initial_h"):
        s.run(None, feeds)


# ----------------------------------------------------------------------------------------------------------
# planner rules


def test_fed_initializer_is_not_specialised():
    """An initializer that is also a graph input can be replaced by a feed: no specialisation on it."""
    x = _f(2, 3)
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                        helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([3, 2], np.int64), "shape")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    s = _session(m.SerializeToString())
    assert s.run(None, {"x": x})[0].shape == (3, 2)
    assert s.run(None, {"x": x, "shape": np.array([6, 1], np.int64)})[0].shape == (6, 1)


def test_specialize_hook_errors_fall_back():
    from onnxpy.ops import tensor

    assert tensor._spec_unsqueeze_13((NOT_CONST, NOT_CONST), {}) is None
    assert tensor._spec_unsqueeze_13((NOT_CONST, np.array([0.5])), {}) is None  # non-integer: generic reports
    check("Unsqueeze", [_f(2)], [np.array([0.0], np.float32)], specialised=False)


def test_outer_scope_values_are_not_constants():
    """Inside an If branch, a value from the enclosing graph is not a constant even when it is an initializer
    there (the branch reads it through an outer slot)."""
    then_g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [2, 3]), helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([3, 2], np.int64), "shape")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    s = _session(m.SerializeToString())
    x = _f(2, 3)
    assert s.run(None, {"c": np.array(True), "x": x})[0].shape == (3, 2)
    assert s.run(None, {"c": np.array(True), "x": x, "shape": np.array([1, 6], np.int64)})[0].shape == (1, 6)
    assert s.run(None, {"c": np.array(False), "x": x})[0].shape == (2, 3)


# ----------------------------------------------------------------------------------------------------------
# the lean run() path and If branches


def _if_model():
    then_g = helper.make_graph([helper.make_node("Add", ["x", "k"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["k"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["x"], ["xo"])], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [1]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("xo", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.full((1, 3), 2.0, np.float32), "k")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_lean_run_results_and_detach():
    s = _session(_if_model())
    x = _f(2, 3)
    y, xo = s.run(None, {"c": np.array([True]), "x": x})
    np.testing.assert_array_equal(y, x + 2)
    assert xo is not x and np.array_equal(xo, x)  # an output that is a feed is the caller's own copy
    y, _ = s.run(None, {"c": np.array([False]), "x": x})
    np.testing.assert_array_equal(y, np.full((1, 3), 2.0, np.float32))
    y[...] = 7  # an output that is a constant is a copy: the model is unchanged
    y2, _ = s.run(None, {"c": np.array([False]), "x": x})
    np.testing.assert_array_equal(y2, np.full((1, 3), 2.0, np.float32))


def test_lean_run_feed_errors_unchanged():
    s = _session(_if_model())
    x = _f(2, 3)
    with pytest.raises(Exception, match="Unexpected input data type"):
        s.run(None, {"c": np.array([True]), "x": x.astype(np.float64)})
    with pytest.raises(Exception, match="Invalid rank"):
        s.run(None, {"c": np.array([True]), "x": x[0]})
    with pytest.raises(Exception, match="Got invalid dimensions"):
        s.run(None, {"c": np.array([True]), "x": _f(2, 4)})
    with pytest.raises(ValueError, match="missing from input feed"):
        s.run(None, {"x": x})
    with pytest.raises(Exception, match="Invalid input name"):
        s.run(None, {"c": np.array([True]), "x": x, "zz": x})
    with pytest.raises(TypeError):
        s.run("", {"c": np.array([True]), "x": x})
    # conversions the lean path leaves to the full one
    big = x.astype(">f4")
    np.testing.assert_array_equal(s.run(None, {"c": np.array([True]), "x": big})[0], x + 2)
    np.testing.assert_array_equal(s.run(None, {"c": [True], "x": x})[0], x + 2)
    np.testing.assert_array_equal(s.run(["xo"], {"c": np.array([True]), "x": x})[0], x)


def test_lean_run_named_outputs():
    """Named outputs take the lean path too: the same selection, order, duplicates and errors as the full path."""
    s = _session(_if_model())
    x = _f(2, 3)
    feed = {"c": np.array([True]), "x": x}
    for names in (["xo"], ("y",), ["xo", "y"], ["y", "xo", "y"]):
        got = s.run(list(names) if isinstance(names, list) else names, feed)
        full = s._state._run_full(list(names), feed)
        assert len(got) == len(names)
        for g, f, n in zip(got, full, names):
            np.testing.assert_array_equal(g, f)
            np.testing.assert_array_equal(g, x + 2 if n == "y" else x)
    xo = s.run(["xo"], feed)[0]
    assert xo is not x  # an output that is a feed is still the caller's own copy
    assert s._state._fetch_index[("xo",)] == [1]
    for bad in (["nope"], ["y", "nope"], [1], [["y"]]):
        with pytest.raises(Exception, match="Invalid output name|incompatible|unhashable|not"):
            s.run(bad, feed)
    with pytest.raises(Exception, match="Invalid output name:nope"):
        s.run(["nope"], feed)
    assert ("nope",) not in s._state._fetch_index


def test_if_branch_with_run_options_and_profiling(tmp_path):
    s = _session(_if_model())
    x = _f(2, 3)
    ro = onnxpy.RunOptions()
    np.testing.assert_array_equal(s.run(None, {"c": np.array([True]), "x": x}, ro)[0], x + 2)
    ro.terminate = True
    with pytest.raises(Exception, match="terminate"):
        s.run(None, {"c": np.array([True]), "x": x}, ro)
    so = onnxpy.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    p = onnxpy.InferenceSession(_if_model(), so)
    np.testing.assert_array_equal(p.run(None, {"c": np.array([True]), "x": x})[0], x + 2)
    assert p.end_profiling()


def test_concurrent_runs_share_specialisations():
    W, R, B = _lstm_consts(16, 8)
    m, _ = _lstm_model(_f(1, 1, 16), W, R, B, True, 1, 8, state_shapes=False)
    s = _session(m)
    errors = []

    def work(seed):
        try:
            body(seed)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def body(seed):
        r = np.random.default_rng(seed)
        for _ in range(30):
            T, Bsz = int(r.integers(1, 4)), int(r.integers(1, 3))
            feeds = {"X": r.standard_normal((T, Bsz, 16)).astype(np.float32),
                     "h0": r.standard_normal((1, Bsz, 8)).astype(np.float32),
                     "c0": r.standard_normal((1, Bsz, 8)).astype(np.float32)}
            got = s.run(None, feeds)
            want = _generic_lstm(feeds["X"], W, R, B, feeds)
            if not all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want)):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_donor_single_candidate():
    """The in-place donor's one-candidate path: a dying intermediate is reused, a live one is not."""
    x = _f(64, 128)
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Sigmoid", ["b"], ["c"]), helper.make_node("Add", ["c", "a2"], ["d"]),
         helper.make_node("Neg", ["x"], ["a2"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 128])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("a2", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    s = _session(m.SerializeToString())
    d, a2 = s.run(None, {"x": x})
    np.testing.assert_allclose(d, 1 / (1 + np.exp(-np.maximum(x + x, 0))) - x, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(a2, -x)


# ----------------------------------------------------------------------------------------------------------
# shape-only chains (memoised per root shape)


def _chain_model(out_chain=False, idx=-1):
    """y = x reshaped by a shape computed from x's shape; c = (x.shape[idx] == 3), optionally a graph output."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i"], ["d"], axis=0),
        helper.make_node("Equal", ["d", "three"], ["c"]),
        helper.make_node("Size", ["s"], ["n"]),
        helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape2"], axis=0),
        helper.make_node("Reshape", ["x", "shape2"], ["y"]),
        helper.make_node("Cast", ["c"], ["cf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["y", "cf"], ["z"]),
    ]
    outs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)]
    if out_chain:
        outs += [helper.make_tensor_value_info("c", TensorProto.BOOL, None),
                 helper.make_tensor_value_info("shape2", TensorProto.INT64, None)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)], outs, [
        numpy_helper.from_array(np.array([idx], np.int64), "i"),
        numpy_helper.from_array(np.array(3, np.int64), "three"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _chain_ref(x, idx=-1):
    c = x.shape[idx] == 3
    return (x.reshape(x.ndim, -1) * np.float32(c)), np.array([c]), np.array([x.ndim, -1])


def test_shape_chain_is_grouped_and_memoised():
    from onnxpy.execution.plan import _ShapeChain

    s = _session(_chain_model(out_chain=True))
    chains = [t[0] for t in s._plan.fast if isinstance(t[0], _ShapeChain)]
    assert len(chains) == 1 and [m.node.op_type for m in chains[0].members] == [
        "Shape", "Gather", "Equal", "Size", "Unsqueeze", "Concat", "Cast"]
    assert len(s._plan.steps) == 9  # the plan's own steps (profiling, run options, parallel) are unchanged
    for shape in [(2, 3), (4, 3), (2, 3), (3, 2, 3), (5,), (2, 3)]:
        x = _f(*shape)
        z, c, shape2 = s.run(None, {"x": x})
        wz, wc, ws = _chain_ref(x)
        np.testing.assert_array_equal(z, wz)
        assert c.tolist() == wc.tolist() and shape2.tolist() == ws.tolist()
        assert c.flags.writeable and shape2.flags.writeable  # outputs from the memo are the caller's copies
        shape2[0] = 99
        c[0] = not c[0]
    assert len(chains[0].memo) == 4
    # the same results through the step-by-step executor paths
    ro = onnxpy.RunOptions()
    x = _f(4, 3)
    for a, b in zip(s.run(None, {"x": x}, ro), _chain_ref(x)):
        np.testing.assert_array_equal(a, b)


def test_shape_chain_error_names_the_node():
    s = _session(_chain_model(idx=2))
    x = _f(2, 2, 3)
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], _chain_ref(x, 2)[0])
    for _ in range(2):  # a failing shape is never remembered
        with pytest.raises(Exception, match="Gather") as e:
            s.run(None, {"x": _f(2, 3)})
        assert "out of range" in str(e.value)
        with pytest.raises(Exception, match="Gather") as e2:
            s.run(None, {"x": _f(2, 3)}, onnxpy.RunOptions())
        assert str(e.value) == str(e2.value)


def test_shape_chain_fetch_subset():
    s = _session(_chain_model(out_chain=True))
    x = _f(2, 3)
    ro = onnxpy.RunOptions()
    ro.only_execute_path_to_fetches = True
    (c,) = s.run(["c"], {"x": x}, ro)
    assert c.tolist() == [True]
    (c,) = s.run(["c"], {"x": x})
    assert c.tolist() == [True]


def test_shape_chain_in_if_branch_reads_outer_value():
    then_g = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "k0"], ["d"], axis=0),
         helper.make_node("Cast", ["d"], ["t"], to=TensorProto.FLOAT)], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(0, np.int64), "k0")])
    else_g = helper.make_graph([helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(
        np.array(-1.0, np.float32)))], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    s = _session(m.SerializeToString())
    for n in (3, 5, 3, 1):
        (y,) = s.run(None, {"c": np.array(True), "x": _f(n, 2)})
        assert y.tolist() == float(n) and y.flags.writeable
    assert s.run(None, {"c": np.array(False), "x": _f(2)})[0].tolist() == -1.0


def test_shape_chain_vs_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    m = _chain_model(out_chain=True)
    o = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    s = onnxpy.InferenceSession(m)
    for shape in [(2, 3), (3, 3, 3), (7,)]:
        x = _f(*shape)
        for a, b in zip(s.run(None, {"x": x}), o.run(None, {"x": x})):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("e", [2.0, 3.0, 0.5, -1.0, 1.0, 1.5])
@pytest.mark.parametrize("base", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("e_shape", [(), (1,), (1, 1)])
def test_pow_constant_exponent(e, base, e_shape):
    x = np.abs(_f(2, 3)).astype(base) + (1 if base is np.int32 else 0)
    if base is np.int32 and e not in (2.0, 3.0, 1.0):
        return  # (integer bases with fractional / negative exponents: not this fast path's business)
    exp = np.full(e_shape, e, np.float32 if base is not np.int32 else np.int32)
    if base is not np.int32:
        exp = exp.astype(base)
    check("Pow", [x[0] if e_shape == (1, 1) else x], [exp], specialised=e != 1.5)
