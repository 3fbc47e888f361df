"""Memory: bounded RSS growth over many runs, bounded caches, memory released when a session is deleted."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from rel_helpers import model, rss_bytes, vi

import onnxpy as ort
from onnxpy.execution import functions
from onnxpy.execution.executor import run_subgraph
from onnxpy.execution.plan import Planner
from onnxpy.ir.model import Node

MiB = 2**20


def _varying_shape_model():
    nodes = [helper.make_node("Shape", ["X"], ["s"], name="shape"),
             helper.make_node("ConstantOfShape", ["s"], ["z"], name="cos",
                              value=numpy_helper.from_array(np.array([0.5], np.float32))),
             helper.make_node("Add", ["X", "z"], ["a"], name="add"),
             helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0], name="tr"),
             helper.make_node("MatMul", ["a", "t"], ["m"], name="mm"),
             helper.make_node("Softmax", ["m"], ["Y"], axis=-1, name="sm"),
             helper.make_node("ReduceMean", ["a"], ["R"], keepdims=0, name="rm")]
    return model(nodes, [vi("X", shape=["N", "M"])], [vi("Y"), vi("R")]).SerializeToString()


def _rss_growth(runs: int) -> tuple[int, int]:
    s = ort.InferenceSession(_varying_shape_model())
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1 + i % 17, 1 + (i * 7) % 13)).astype(np.float32) for i in range(64)]
    for i in range(500):  # warm-up: allocator pools, lazy imports
        s.run(None, {"X": xs[i % 64]})
    gc.collect()
    before = rss_bytes()
    for i in range(runs):
        s.run(None, {"X": xs[i % 64]})
    gc.collect()
    return before, rss_bytes() - before


def test_rss_bounded_over_10000_runs():
    before, growth = _rss_growth(10_000)
    print(f"RSS before {before / MiB:.1f} MiB, growth over 10,000 runs {growth / MiB:.2f} MiB")
    assert growth < 16 * MiB


@pytest.mark.slow
def test_rss_bounded_over_100000_runs():
    before, growth = _rss_growth(100_000)
    print(f"RSS before {before / MiB:.1f} MiB, growth over 100,000 runs {growth / MiB:.2f} MiB")
    assert growth < 16 * MiB


def test_function_expansion_cache_is_bounded():
    node = Node("Celu", "", ["X"], ["Y"], {"alpha": 1.0}, "celu", "")
    planner = Planner({"": 17}, run_subgraph, function_expander=functions.make_function_expander(run_subgraph))
    fk = functions.make_function_expander(run_subgraph)(node, "", 17, planner)
    assert fk is not None
    for rank in range(functions.MAX_CACHED_SIGNATURES + 20):
        x = np.ones((1,) * min(rank, 30), np.float32) if rank <= 30 else np.ones((1,) * (rank - 31), np.float64)
        fk(x)
    assert len(fk._cache) <= functions.MAX_CACHED_SIGNATURES


def test_fetch_plan_cache_is_bounded():
    nodes = [helper.make_node("Relu", ["X"], [f"y{i}"], name=f"r{i}") for i in range(8)]
    s = ort.InferenceSession(model(nodes, [vi("X", shape=[2])], [vi(f"y{i}") for i in range(8)]).SerializeToString())
    ro = ort.RunOptions()
    ro.only_execute_path_to_fetches = True
    x = np.ones(2, np.float32)
    import itertools

    combos = [c for r in (1, 2, 3) for c in itertools.combinations([f"y{i}" for i in range(8)], r)]
    assert len(combos) > 64
    for c in combos:
        s.run(list(c), {"X": x}, ro)
    assert len(s._state._fetch_plans) <= 32


def test_deleting_session_releases_memory():
    big = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 1024, 1024)).astype(np.float32), "W")
    data = model([helper.make_node("ReduceSum", ["W"], ["Y"], keepdims=0, name="rs")], [], [vi("Y")],
                 inits=[big]).SerializeToString()
    del big
    gc.collect()
    base = rss_bytes()
    for _ in range(3):
        s = ort.InferenceSession(data)
        s.run(None, {})
        loaded = rss_bytes()
        del s
        gc.collect()
    after = rss_bytes()
    print(f"256 MiB initializer: base {base / MiB:.0f} MiB, loaded {loaded / MiB:.0f} MiB, "
          f"after delete {after / MiB:.0f} MiB")
    assert loaded - base > 200 * MiB  # the weights were really resident
    assert after - base < 64 * MiB, "deleting the session did not release its weights"


def test_large_input_released_after_run():
    s = ort.InferenceSession(model([helper.make_node("Neg", ["X"], ["Y"], name="neg"),
                                    helper.make_node("ReduceSum", ["Y"], ["S"], keepdims=0, name="rs")],
                                   [vi("X", TensorProto.FLOAT, ["N"])], [vi("S")]).SerializeToString())
    gc.collect()
    base = rss_bytes()
    for _ in range(5):
        x = np.ones(32 * MiB, np.float32)  # 128 MiB
        s.run(None, {"X": x})
        del x
    gc.collect()
    assert rss_bytes() - base < 64 * MiB
