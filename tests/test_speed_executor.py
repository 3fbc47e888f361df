"""Executor fast path and in-place donation: results must never depend on whether a kernel ran in place."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import onnxpy
from onnxpy.execution import plan as P

SHAPE = (2, 8, 32, 32)  # above the donation threshold


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TP.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def _session(blob, level=0, parallel=False):
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel(level) if level else \
        onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    if parallel:
        so.execution_mode = onnxpy.ExecutionMode.ORT_PARALLEL
    return onnxpy.InferenceSession(blob, so)


def _x(seed=0, shape=SHAPE):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_refcount_calibration():
    assert P._rc_of([np.empty(3)], 0) == P._RC_OWNED
    a = np.empty(3)
    vals = [a]
    assert P._rc_of(vals, 0) > P._RC_OWNED  # a second holder is seen


def test_donor_steps_exist_and_results_match():
    x = _x()
    blob = _model(
        [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Add", ["b", "x"], ["c"]), helper.make_node("Sigmoid", ["c"], ["y"])],
        [("x", SHAPE)], ["y"],
    )
    s = _session(blob)
    assert any(f[2] == 2 for f in s._plan.fast)
    x0 = x.copy()
    for _ in range(3):
        y = s.run(None, {"x": x})[0]
        ref = 1 / (1 + np.exp(-(np.maximum(-x0, 0) + x0)))
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(x, x0)  # the feed is never written


def test_view_of_dying_value_blocks_donation():
    # a = Neg(x) (fresh); v = Reshape(a) is a view of a and still alive when Relu(a) runs
    x = _x(1)
    shape = np.array([-1], dtype=np.int64)
    blob = _model(
        [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["v"]),
         helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["rf"]),
         helper.make_node("Add", ["rf", "v"], ["y"])],
        [("x", SHAPE)], ["y"], inits=[("shape", shape)],
    )
    y = _session(blob).run(None, {"x": x})[0]
    a = -x.reshape(-1)
    np.testing.assert_allclose(y, np.maximum(a, 0) + a, rtol=1e-6)


def test_same_array_in_two_slots_blocks_donation():
    x = _x(2)
    blob = _model(
        [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Identity", ["a"], ["b"]),
         helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Sub", ["r", "b"], ["y"])],
        [("x", SHAPE)], ["y"],
    )
    y = _session(blob).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, np.maximum(-x, 0) - (-x), rtol=1e-6)


def test_graph_outputs_initializers_and_feeds_are_not_donated():
    x = _x(3)
    w = _x(4)
    blob = _model(
        [helper.make_node("Add", ["w", "x"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("Mul", ["x", "w"], ["m"])],
        [("x", SHAPE)], ["a", "r", "m"], inits=[("w", w)],
    )
    s = _session(blob)
    for _ in range(2):
        a, r, m = s.run(None, {"x": x})
        np.testing.assert_allclose(a, w + x, rtol=1e-6)
        np.testing.assert_allclose(r, np.maximum(w + x, 0), rtol=1e-6)
        np.testing.assert_allclose(m, x * w, rtol=1e-6)


@pytest.mark.parametrize("op,fn", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply),
                                   ("Div", np.divide)])
def test_binary_broadcast_and_both_positions(op, fn):
    x = _x(5)
    small = _x(6, (1, 8, 1, 32))
    # the small dying operand cannot hold the broadcast result; the big one (position 1) can
    blob = _model(
        [helper.make_node("Neg", ["s"], ["sn"]), helper.make_node("Exp", ["x"], ["xe"]),
         helper.make_node(op, ["sn", "xe"], ["y"])],
        [("x", SHAPE), ("s", small.shape)], ["y"],
    )
    y = _session(blob).run(None, {"x": x, "s": small})[0]
    np.testing.assert_allclose(y, fn(-small, np.exp(x)), rtol=1e-6)


def test_integer_div_not_in_place_and_sum():
    a = np.arange(-5000, 5000, dtype=np.int64).reshape(100, 100)
    b = np.full((100, 100), 3, dtype=np.int64)
    g = helper.make_graph(
        [helper.make_node("Neg", ["a"], ["an"]), helper.make_node("Div", ["an", "b"], ["q"]),
         helper.make_node("Neg", ["a"], ["an2"]), helper.make_node("Sum", ["an2", "q"], ["y"])],
        "g",
        [helper.make_tensor_value_info("a", TP.INT64, a.shape), helper.make_tensor_value_info("b", TP.INT64, b.shape)],
        [helper.make_tensor_value_info("q", TP.INT64, None), helper.make_tensor_value_info("y", TP.INT64, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    q, y = _session(m.SerializeToString()).run(None, {"a": a, "b": b})
    ref_q = np.trunc(-a / 3).astype(np.int64)
    np.testing.assert_array_equal(q, ref_q)
    np.testing.assert_array_equal(y, -a + ref_q)


def test_parallel_mode_and_optimized_match_sequential():
    x = _x(7)
    blob = _model(
        [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Sigmoid", ["a"], ["c"]), helper.make_node("Add", ["b", "c"], ["d"]),
         helper.make_node("LeakyRelu", ["d"], ["y"], alpha=0.1)],
        [("x", SHAPE)], ["y"],
    )
    ref = np.maximum(-x, 0) + 1 / (1 + np.exp(x))
    ref = np.maximum(ref, ref * 0.1)
    for sess in (_session(blob), _session(blob, parallel=True), _session(blob, level=99)):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5, atol=1e-7)


def test_kernel_error_names_the_node():
    blob = _model([helper.make_node("Add", ["x", "z"], ["y"], name="the_add")],
                  [("x", (2, 3)), ("z", (4, 5))], ["y"])
    s = _session(blob)
    with pytest.raises(Exception, match="the_add"):
        s.run(None, {"x": np.zeros((2, 3), np.float32), "z": np.zeros((4, 5), np.float32)})


def test_multi_output_and_absent_optional_output():
    x = _x(8, (4, 6))
    g = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["v", ""], axis=1),
         helper.make_node("Split", ["x"], ["s0", "s1"], axis=1),
         helper.make_node("Add", ["s0", "s1"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TP.FLOAT, x.shape)],
        [helper.make_tensor_value_info("v", TP.FLOAT, None), helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(np.array([2], np.int64), "k")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    v, y = _session(m.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(v, -np.sort(-x, axis=1)[:, :2])
    np.testing.assert_allclose(y, x[:, :3] + x[:, 3:])


def test_relu_dtypes_and_zero_d():
    from onnxpy.ops.activations import relu

    for dt in (np.float16, np.float32, np.float64, np.int32, np.int8):
        x = np.array([-2, 0, 3], dtype=dt)
        r = relu(x)
        assert r.dtype == dt
        np.testing.assert_array_equal(r, np.array([0, 0, 3], dtype=dt))
    assert np.asarray(relu(np.array(-1.5, np.float32))).reshape(()) == 0


def test_onnx_is_importable_here():  # keeps the onnx import used for helper models
    assert onnx.__version__


def _if_model():
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TP.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TP.FLOAT, None)])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], "g",
        [helper.make_tensor_value_info("c", TP.BOOL, None), helper.make_tensor_value_info("x", TP.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_if_fast_path_branches_and_bad_condition():
    s = _session(_if_model())
    x = np.array([1, -2, 3], np.float32)
    np.testing.assert_array_equal(s.run(None, {"c": np.array(True), "x": x})[0], x + x)
    np.testing.assert_array_equal(s.run(None, {"c": np.array([False]), "x": x})[0], -x)
    with pytest.raises(Exception, match="exactly one element"):
        s.run(None, {"c": np.array([True, False]), "x": x})


# --- the generated straight-line runner (executor._compile) against the step loop ---------------------------------
def _mixed_model():
    """Multi-output Split, an absent optional output (Dropout's mask), a 0-d ReduceSum (numpy scalar results are
    normalised), donors, and an If whose one-node branches run generated runners of their own."""
    axes = np.array([1], np.int64)
    then = helper.make_graph([helper.make_node("Neg", ["p"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TP.FLOAT, None)])
    els = helper.make_graph([helper.make_node("Identity", ["p"], ["e"])], "else", [],
                            [helper.make_tensor_value_info("e", TP.FLOAT, None)])
    return _model(
        [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Split", ["b"], ["p", "q"], axis=1, num_outputs=2),
         helper.make_node("Dropout", ["q"], ["d"]),
         helper.make_node("ReduceSum", ["d"], ["s"], keepdims=0),
         helper.make_node("ReduceSum", ["x", "axes"], ["r"], keepdims=1),
         helper.make_node("Greater", ["s", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els),
         helper.make_node("Add", ["y", "r"], ["z"])],
        [("x", SHAPE)], ["z", "s"], inits=[("axes", axes), ("zero", np.array(0, np.float32))], opset=18)


def test_generated_runner_matches_the_loop(monkeypatch):
    from onnxpy.execution import executor

    blob = _mixed_model()
    compiled = _session(blob)
    x = _x(3)
    for _ in range(executor._COMPILE_AFTER_RUNS):
        compiled.run(None, {"x": x})  # the loop's runs
    got = compiled.run(None, {"x": x})
    assert type(compiled._plan.compiled) is tuple
    monkeypatch.setattr(executor, "_COMPILE", False)
    loop = _session(blob)
    for _ in range(executor._COMPILE_AFTER_RUNS):
        loop.run(None, {"x": x})
    want = loop.run(None, {"x": x})
    assert loop._plan.compiled is False
    for g, w in zip(got, want):
        assert type(g) is np.ndarray and g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got[1], np.maximum(-x, 0)[:, 4:].sum())


def test_generated_runner_reports_the_failing_node_as_the_loop_does(monkeypatch):
    from onnxpy.execution import executor

    blob = _model([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["b"],
                                                                          name="bad_reshape"),
                   helper.make_node("Relu", ["b"], ["y"])],
                  [("x", ("n", 3))], ["y"], inits=[("shape", np.array([-1, 6], np.int64))])
    msgs = []
    for flag in (True, False):
        monkeypatch.setattr(executor, "_COMPILE", flag)
        s = _session(blob)
        for _ in range(executor._COMPILE_AFTER_RUNS):  # the loop's runs (successful ones count)
            s.run(None, {"x": np.ones((2, 3), np.float32)})
        assert (type(s._plan.compiled) is tuple) is flag
        with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.Fail) as ei:
            s.run(None, {"x": np.ones((3, 3), np.float32)})
        msgs.append(str(ei.value))
    assert msgs[0] == msgs[1]
    assert "bad_reshape" in msgs[0] and "a: float32[3, 3]" in msgs[0]


def test_generated_runner_still_donates():
    x = _x(4)
    blob = _model([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                  [("x", SHAPE)], ["y"])
    s = _session(blob)
    for _ in range(3):
        s.run(None, {"x": x})
    assert type(s._plan.compiled) is tuple
    donor = next(f[0] for f in s._plan.fast if f[2] == 2)
    calls = []
    for key, fn in list(donor.bound.items()):
        donor.bound[key] = lambda *a, _fn=fn, **k: calls.append(1) or _fn(*a, **k)
    y = s.run(None, {"x": x})[0]
    assert calls  # Relu ran in place on Neg's fresh output
    np.testing.assert_array_equal(y, np.maximum(-x, 0))


def test_very_long_plans_run_the_loop(monkeypatch):
    from onnxpy.execution import executor

    monkeypatch.setattr(executor, "_COMPILE_MAX_STEPS", 1)
    blob = _model([helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                  [("x", (3,))], ["y"])
    s = _session(blob)
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(s.run(None, {"x": x})[0], np.maximum(-x, 0))
    assert s._plan.compiled is False


# --- If nodes inlined into the generated runner -----------------------------------------------------------------
def _vi(name):
    return helper.make_tensor_value_info(name, TP.FLOAT, None)


def _nested_if_model():
    """An If whose then-branch holds a constant, a donor chain on outer values, two outputs and a nested If (whose
    else-branch returns an outer value unchanged and whose then-branch returns a branch constant); the else-branch
    returns an outer value and a constant of its own."""
    k = numpy_helper.from_array(np.full(SHAPE[1:], 0.5, np.float32), "k")
    k2 = numpy_helper.from_array(np.full(SHAPE[1:], 3.0, np.float32), "k2")
    k3 = numpy_helper.from_array(np.full(SHAPE[1:], -1.0, np.float32), "k3")
    inner_then = helper.make_graph([helper.make_node("Identity", ["k2"], ["it"])], "inner_then", [], [_vi("it")],
                                   [k2])
    inner_else = helper.make_graph([helper.make_node("Identity", ["x"], ["ie"])], "inner_else", [], [_vi("ie")])
    then = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t0"]), helper.make_node("Relu", ["t0"], ["t1"]),
         helper.make_node("Add", ["t1", "k"], ["t2"], name="then_add"),
         helper.make_node("If", ["c2"], ["t3"], then_branch=inner_then, else_branch=inner_else),
         helper.make_node("Mul", ["t2", "t3"], ["t4"])],
        "then", [], [_vi("t4"), _vi("t2")], [k])
    els = helper.make_graph([helper.make_node("Identity", ["x"], ["e0"]), helper.make_node("Identity", ["k3"], ["e1"])],
                            "else", [], [_vi("e0"), _vi("e1")], [k3])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y", "w"], then_branch=then, else_branch=els),
         helper.make_node("Sub", ["y", "w"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["n"] + list(SHAPE[2:])),
         helper.make_tensor_value_info("c", TP.BOOL, []),
         helper.make_tensor_value_info("c2", TP.BOOL, [])],
        [_vi("z"), _vi("y"), _vi("w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _inlined_ifs(sess):
    from onnxpy.execution import plan as plan_mod

    run = sess._plan.compiled[1]
    return not any(isinstance(v, plan_mod._IfKernel) for v in run.__globals__.values())


def test_inlined_if_matches_the_loop_and_onnxruntime(monkeypatch):
    from onnxpy.execution import executor

    ort = pytest.importorskip("onnxruntime")
    blob = _nested_if_model()
    x = _x(5, SHAPE[1:])
    oracle = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    s = _session(blob)
    for _ in range(executor._COMPILE_AFTER_RUNS):
        s.run(None, {"x": x, "c": np.array(True), "c2": np.array(True)})
    assert type(s._plan.compiled) is tuple and _inlined_ifs(s)
    monkeypatch.setattr(executor, "_COMPILE", False)
    loop = _session(blob)
    for _rep in range(2):  # (the branches' constants are appended to every run's slot list)
        for c in (True, False):
            for c2 in (True, False):
                feeds = {"x": x, "c": np.array(c), "c2": np.array(c2)}
                got, want, ref = s.run(None, feeds), loop.run(None, feeds), oracle.run(None, feeds)
                for g, w, r in zip(got, want, ref):
                    assert type(g) is np.ndarray and g.shape == w.shape and g.dtype == w.dtype
                    np.testing.assert_array_equal(g, w)
                    np.testing.assert_allclose(g, r, rtol=1e-6)
                for g in got:  # results are the caller's: writing into them changes no later run
                    g[...] = 42
    np.testing.assert_array_equal(x, _x(5, SHAPE[1:]))


def test_inlined_if_donates_and_frees_its_branch_values():
    blob = _nested_if_model()
    x = _x(6, SHAPE[1:])
    s = _session(blob)
    feeds = {"x": x, "c": np.array(True), "c2": np.array(False)}
    for _ in range(3):
        s.run(None, feeds)
    run = s._plan.compiled[1]
    donors = [v for v in run.__globals__.values() if isinstance(v, P._Donor)]
    assert donors  # the branch's Relu/Add run in place on values that die inside the branch
    calls = []
    for d in donors:
        for key, fn in list(d.bound.items()):
            d.bound[key] = lambda *a, _fn=fn, **k: calls.append(1) or _fn(*a, **k)
    z, y, w = s.run(None, feeds)
    assert calls
    t2 = np.maximum(-x, 0) + 0.5
    np.testing.assert_array_equal(y, t2 * x)
    np.testing.assert_array_equal(w, t2)
    # after a run the slot list holds nothing but the outputs it hands back
    vals = list(s._plan.template)
    vals[s._plan.input_slots["x"]] = x
    vals[s._plan.input_slots["c"]] = np.array(True)
    vals[s._plan.input_slots["c2"]] = np.array(False)
    run(vals)
    n = len(s._plan.template)
    live = [i for i, v in enumerate(vals[n:]) if v is not None]
    consts = {i for i, v in enumerate(run.__globals__["_ext"]) if v is not None}
    assert set(live) <= consts


def test_inlined_if_reports_branch_failures_as_the_loop_does(monkeypatch):
    from onnxpy.execution import executor

    blob = _nested_if_model()
    msgs = []
    for flag in (True, False):
        monkeypatch.setattr(executor, "_COMPILE", flag)
        s = _session(blob)
        good = {"x": _x(1, SHAPE[1:]), "c": np.array(True), "c2": np.array(True)}
        for _ in range(executor._COMPILE_AFTER_RUNS):
            s.run(None, good)
        assert (type(s._plan.compiled) is tuple) is flag
        with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.Fail) as ei:  # k no longer broadcasts
            s.run(None, {**good, "x": _x(1, (3,) + SHAPE[2:])})
        msgs.append(str(ei.value))
        with pytest.raises(Exception, match="If condition") as ei:  # a condition with two elements
            s.run(None, {**good, "c": np.array([True, False])})
        msgs.append(str(ei.value))
    assert msgs[0] == msgs[2] and msgs[1] == msgs[3]
    assert "then_add" in msgs[0] and "t1: float32[3, 32, 32]" in msgs[0]


def test_inlining_respects_the_step_budget(monkeypatch):
    from onnxpy.execution import executor

    monkeypatch.setattr(executor, "_COMPILE_MAX_STEPS", 3)  # the outer plan fits, its branches do not
    s = _session(_nested_if_model())
    feeds = {"x": _x(2, SHAPE[1:]), "c": np.array(True), "c2": np.array(True)}
    for _ in range(3):
        got = s.run(None, feeds)
    assert type(s._plan.compiled) is tuple and not _inlined_ifs(s)
    t2 = np.maximum(-feeds["x"], 0) + 0.5
    np.testing.assert_array_equal(got[1], t2 * 3)
