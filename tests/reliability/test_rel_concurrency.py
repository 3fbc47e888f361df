"""Concurrency: one session shared by many threads; sessions created/destroyed concurrently; terminate."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from rel_helpers import loop_model, model, vi, x0

import onnxpy as ort
from onnxpy.capi import onnxruntime_pybind11_state as C


def _mlp():
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W1")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "B1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 4)).astype(np.float32), "W2")
    nodes = [helper.make_node("Gemm", ["X", "W1", "B1"], ["h"], name="gemm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W2"], ["m"], name="mm"),
             helper.make_node("Softmax", ["m"], ["Y"], axis=-1, name="softmax"),
             helper.make_node("ReduceSum", ["r"], ["S"], keepdims=0, name="rsum")]
    return model(nodes, [vi("X", shape=["N", 8])], [vi("Y", shape=["N", 4]), vi("S")],
                 inits=[w1, b1, w2]).SerializeToString()


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_one_session_many_threads(mode):
    so = ort.SessionOptions()
    if mode == "parallel":
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    s = ort.InferenceSession(_mlp(), so)
    n_threads, n_runs = 8, 500
    inputs = [[np.random.default_rng(1000 * t + i).standard_normal((1 + (i % 5), 8)).astype(np.float32)
               for i in range(n_runs)] for t in range(n_threads)]
    expected = [[s.run(None, {"X": x}) for x in xs] for xs in inputs]
    errors = []
    barrier = threading.Barrier(n_threads)

    def work(t):
        barrier.wait()
        for i, x in enumerate(inputs[t]):
            got = s.run(None, {"X": x})
            for g, e in zip(got, expected[t][i]):
                if g.shape != e.shape or not np.array_equal(g, e):
                    errors.append((t, i))
                    return

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert not errors, f"{len(errors)} thread results differ from the single-threaded ones: {errors[:5]}"


def test_sessions_created_and_destroyed_concurrently():
    data = _mlp()
    x = np.ones((2, 8), np.float32)
    ref = ort.InferenceSession(data).run(None, {"X": x})

    def work(_):
        for _ in range(15):
            s = ort.InferenceSession(data)
            out = s.run(None, {"X": x})
            del s
            for o, r in zip(out, ref):
                np.testing.assert_array_equal(o, r)
        return True

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(work, range(6)))


def test_terminate_one_run_others_continue():
    s = ort.InferenceSession(loop_model(True).SerializeToString())
    ro_long = ort.RunOptions()
    box = {}

    def long_run():
        try:
            s.run(None, {"M": np.array(2**62, np.int64), "x0": x0()}, ro_long)
        except C.Fail as e:
            box["e"] = e

    t = threading.Thread(target=long_run, daemon=True)
    t.start()
    # other runs on the same session (with and without their own RunOptions) are unaffected
    ro_other = ort.RunOptions()
    for k in range(20):
        assert s.run(None, {"M": np.array(k, np.int64), "x0": x0()}, ro_other)[0][0] == float(k)
        assert s.run(None, {"M": np.array(k, np.int64), "x0": x0()})[0][0] == float(k)
    assert t.is_alive()
    time.sleep(0.1)
    ro_long.terminate = True
    t.join(10)
    assert not t.is_alive() and "terminate" in str(box.get("e"))


def test_terminate_run_async():
    s = ort.InferenceSession(loop_model(False).SerializeToString())
    ro = ort.RunOptions()
    done = threading.Event()
    box = {}

    def cb(res, user, err):
        box["res"], box["err"] = res, err
        done.set()

    s.run_async(None, {"M": np.array(2**62, np.int64), "x0": x0()}, cb, None, ro)
    time.sleep(0.2)
    assert not done.is_set()
    ro.terminate = True
    assert done.wait(10)
    assert "terminate" in box["err"]


def test_threads_with_different_tensor_limits():
    """Per-session limits are per run/thread: a strict session does not affect a lenient one running alongside."""
    g = model([helper.make_node("ConstantOfShape", ["S"], ["Y"], name="cos")], [vi("S", TensorProto.INT64, [1])],
              [vi("Y")]).SerializeToString()
    strict_opts = ort.SessionOptions()
    strict_opts.add_session_config_entry("session.max_tensor_bytes", "400")
    strict, lenient = ort.InferenceSession(g, strict_opts), ort.InferenceSession(g)
    feed = {"S": np.array([1000], np.int64)}
    errors = []

    def run_strict():
        for _ in range(200):
            try:
                strict.run(None, feed)
                errors.append("strict ran")
            except C.Fail:
                pass

    def run_lenient():
        for _ in range(200):
            if lenient.run(None, feed)[0].shape != (1000,):
                errors.append("lenient wrong")

    ts = [threading.Thread(target=f) for f in (run_strict, run_lenient, run_strict, run_lenient)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors
