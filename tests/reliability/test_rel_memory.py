"""Memory: bounded RSS growth over many runs, bounded caches, memory released when a session is deleted."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from rel_helpers import model, rss_bytes, vi

import onnxpy as ort
from onnxpy.execution import functions
from onnxpy.execution.memory import release_heap
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
    release_heap()  # memory other tests freed into the process heap goes back first
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


def _big_intermediate_session(arena: bool):
    """A small input expanded to a 128 MiB intermediate inside the graph, then reduced."""
    so = ort.SessionOptions()
    so.enable_cpu_mem_arena = arena
    shape = numpy_helper.from_array(np.array([32 * MiB], np.int64), "shape")
    nodes = [helper.make_node("Expand", ["X", "shape"], ["E"], name="expand"),
             helper.make_node("Neg", ["E"], ["Y"], name="neg"),
             helper.make_node("ReduceSum", ["Y"], ["S"], keepdims=0, name="rs")]
    return ort.InferenceSession(model(nodes, [vi("X", TensorProto.FLOAT, [1])], [vi("S")],
                                      inits=[shape]).SerializeToString(), so)


@pytest.mark.parametrize("how", ["arena_off", "shrinkage_run_option"])
def test_intermediates_released_after_run(how):
    """Without the CPU arena (or with onnxruntime's arena-shrinkage run option) a run's buffers go back."""
    s = _big_intermediate_session(arena=how != "arena_off")
    ro = ort.RunOptions()
    if how == "shrinkage_run_option":
        ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    gc.collect()
    release_heap()
    base = rss_bytes()
    for _ in range(5):
        assert s.run(None, {"X": np.ones(1, np.float32)}, ro)[0] == -32 * MiB
    gc.collect()
    assert rss_bytes() - base < 64 * MiB


def test_arena_holds_a_bounded_high_water_mark():
    """With the arena on (the default) freed buffers are reused by the next runs, so RSS stops growing."""
    s = _big_intermediate_session(arena=True)
    x = np.ones(1, np.float32)
    for _ in range(3):
        s.run(None, {"X": x})
    gc.collect()
    steady = rss_bytes()
    for _ in range(10):
        s.run(None, {"X": x})
    gc.collect()
    assert rss_bytes() - steady < 32 * MiB
