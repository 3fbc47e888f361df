"""Session-creation fast paths: static arity table, per-op kernel loading, direct constant folding, shared
producer/consumer maps kept up to date incrementally.  Each is checked against the general path it replaces."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.ir import _arity_table, validate
from onnxpy.ir.model import Graph, Node, ValueInfo
from onnxpy.optimizer import OptContext
from onnxpy.optimizer import graph_utils as gu


# -- arity table ---------------------------------------------------------------------------------------------------
def test_arity_table_matches_onnx():
    if _arity_table.ONNX_VERSION != onnx.__version__:
        pytest.skip("table built for another onnx version (the check asks onnx directly then)")
    top = max(v[0] for rows in _arity_table.RANGES.values() for v in rows) + 3
    for (dom, op) in _arity_table.RANGES:
        for opset in range(1, top):
            assert validate._ranges.__wrapped__(op, opset, dom) == validate._onnx_ranges(op, opset, dom), (dom, op,
                                                                                                          opset)
    # ops the table does not list go to onnx
    assert validate._ranges.__wrapped__("NoSuchOp", 13, "") is None


def test_arity_error_still_raised():
    node = helper.make_node("Relu", [], ["y"])
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(Exception, match="input size 0"):
        onnxpy.InferenceSession(m.SerializeToString())


# -- kernel index --------------------------------------------------------------------------------------------------
def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout


def test_kernel_index_is_consistent():
    import onnxpy.ops as ops
    from onnxpy.ops import _kernel_index

    # a stale index is not wrong, only slow (every session then imports every op module): fail, so it is noticed
    assert _kernel_index.FILES == ops.source_crcs(), "kernel index stale: run onnxpy.ops.write_index()"
    out = _run("import json, onnxpy.ops as o; m, c = o.build_index(); "
               "print(json.dumps([[list(k), list(v)] for k, v in sorted(m.items())]))")
    built = {tuple(k): tuple(v) for k, v in json.loads(out)}
    assert built == dict(_kernel_index.MODULES)


@pytest.mark.parametrize("edited", [(), ("conv", "pool"), ("contrib_fused", "elementwise"), ("_spatial",)])
def test_lazy_lookup_same_kernels_as_load_all(edited):
    """Lookups with per-op loading give the kernels ``load_all`` gives, also when family modules were edited
    after the index was written (they are imported up front) or a helper was (everything is loaded)."""
    code = f"""
import json, onnxpy.ops as o
from onnxpy.ops import registry, _kernel_index
for name in {list(edited)!r}:
    _kernel_index.FILES[name + ".py"] = -1
"""
    code += """
keys = sorted(_kernel_index.MODULES)
res = {}
for dom, op in keys:
    for v in (1, 7, 13, 18, 21, 99):
        info = registry.lookup(dom, op, v)
        res[f"{dom}|{op}|{v}"] = None if info is None else f"{getattr(info.fn, '__module__', '')}.{info.since}"
print(json.dumps([res, o._loaded]))
"""
    lazy, lazy_loaded = json.loads(_run(code))
    import onnxpy.ops as ops
    from onnxpy.ops import _kernel_index

    if _kernel_index.FILES == ops.source_crcs():  # (a stale index may load everything anyway)
        assert lazy_loaded == (edited == ("_spatial",))
    full, loaded = json.loads(_run("import onnxpy.ops as o; o.load_all()\n" + code))
    assert loaded and lazy == full


def test_unknown_op_loads_everything():
    out = _run("import onnxpy.ops as o; from onnxpy.ops import registry; "
               "print(registry.lookup('', 'NoSuchOp', 13), o._loaded)")
    assert out.split() == ["None", "True"]


# -- direct constant folding ---------------------------------------------------------------------------------------
def _ctx(opset=17):
    m = onnxpy.ir.model.Model(Graph("g", [], [], [], {}), {"": opset, "com.microsoft": 1})
    return OptContext(m, None)


def _slow(ctx, node, inputs):
    ctx._run_node_direct = lambda n, i: NotImplemented
    try:
        return ctx.run_node(node, inputs)
    finally:
        del ctx._run_node_direct


CASES = [
    (Node("Add", "", ["a", "b"], ["y"]), [np.arange(6, dtype=np.float32).reshape(2, 3), np.float32([1, 2, 3])]),
    (Node("Add", "", ["a", "a"], ["y"]), [np.arange(3, dtype=np.int64)] * 2),
    (Node("ConstantOfShape", "", ["s"], ["y"], {"value": np.array([2.5], np.float32)}), [np.int64([2, 3])]),
    (Node("Constant", "", [], ["y"], {"value": np.ones((2, 2), np.float16)}), []),
    (Node("Constant", "", [], ["y"], {"value_ints": [1, 2]}), []),
    (Node("Shape", "", ["x"], ["y"], {"start": 1}), [np.zeros((2, 3, 4), np.float64)]),
    (Node("Cast", "", ["x"], ["y"], {"to": 10}), [np.float32([1.5, -2.25])]),
    (Node("Reshape", "", ["x", "s"], ["y"]), [np.arange(12, dtype=np.float32), np.int64([3, -1])]),
    (Node("Split", "", ["x"], ["p", "", "r"], {"axis": 0}), [np.arange(9, dtype=np.int32)]),
    (Node("TopK", "", ["x", "k"], ["v", "i"]), [np.float32([3, 1, 2, 5]), np.int64([2])]),
    (Node("Slice", "", ["x", "st", "en", "", ""], ["y"]), [np.arange(10.0), np.int64([2]), np.int64([7]), None,
                                                            None]),
    (Node("Unsqueeze", "", ["x", "ax"], ["y"]), [np.float32(3.0).reshape(()), np.int64([0])]),
    (Node("Gather", "", ["x", "i"], ["y"], {"axis": 1}), [np.arange(12.0).reshape(3, 4), np.int64([[0, 3]])]),
    (Node("Conv", "", ["x", "w", "b"], ["y"], {"pads": [1, 1, 1, 1], "group": 2}),
     [np.random.default_rng(0).standard_normal((1, 4, 5, 5)).astype(np.float32),
      np.random.default_rng(1).standard_normal((6, 2, 3, 3)).astype(np.float32), np.float32(np.arange(6))]),
    (Node("Add", "", ["a", "b"], ["y"]), [np.zeros((2, 3), np.float32), np.zeros((4,), np.float32)]),  # error
    (Node("NoSuchOp", "", ["a"], ["y"]), [np.zeros(2)]),  # no kernel
    (Node("Relu", "", ["a"], ["__in0"]), [np.float32([-1, 1])]),  # reserved name: planner path
    (Node("Split", "", ["x"], ["p", "p"], {"axis": 0}), [np.arange(4)]),  # repeated output: planner path
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_direct_fold_matches_planner(case):
    node, inputs = CASES[case]
    ctx = _ctx()
    fast = ctx.run_node(node, inputs)
    slow = _slow(_ctx(), node, inputs)
    assert (fast is None) == (slow is None)
    if fast is not None:
        assert len(fast) == len(slow)
        for a, b in zip(fast, slow):
            assert type(a) is type(b)
            if isinstance(a, np.ndarray):
                assert a.dtype == b.dtype and a.shape == b.shape
                np.testing.assert_array_equal(a, b)


# -- shared maps ---------------------------------------------------------------------------------------------------
def _graph():
    nodes = [Node("Relu", "", ["x"], ["a"], name="n0"), Node("Add", "", ["a", "x"], ["b"], name="n1"),
             Node("Mul", "", ["b", "a"], ["c"], name="n2"), Node("Neg", "", ["c"], ["d"], name="n3"),
             Node("Add", "", ["d", "a"], ["e"], name="n4")]
    return Graph("g", nodes, [ValueInfo("x")], [ValueInfo("e")], {})


def _check(g):
    assert gu.shared_producers(g) == gu.producers(g)
    assert gu.shared_consumers(g) == gu.consumers(g)


def _edits():
    def remove(g):
        g.nodes.remove(g.nodes[3])
        g.nodes[3].inputs = ["c", "a"]

    def replace(g):
        new = Node("Sub", "", ["a", "b"], ["c"], name="s")
        g.nodes[2] = new

    def insert(g):
        g.nodes.insert(2, Node("Sigmoid", "", ["b"], ["b2"], name="sg"))
        g.nodes[3].inputs = ["b2", "a"]

    def outputs(g):
        g.nodes[2].outputs = ["d"]
        del g.nodes[3]

    def reorder(g):
        g.nodes[1], g.nodes[0] = g.nodes[0], g.nodes[1]

    def duplicate_producer(g):
        g.nodes.append(Node("Identity", "", ["x"], ["a"], name="dup"))

    def nothing(g):
        pass

    return [remove, replace, insert, outputs, reorder, duplicate_producer, nothing]


@pytest.mark.parametrize("edit", _edits(), ids=lambda f: f.__name__)
@pytest.mark.parametrize("which", ["both", "prod", "cons"])
def test_shared_maps_follow_rewrites(edit, which):
    g = _graph()
    with gu.free_names_memo():
        if which in ("both", "prod"):
            gu.shared_producers(g)
        if which in ("both", "cons"):
            gu.shared_consumers(g)
        edit(g)
        gu.graph_changed(g)
        _check(g)
        # a second round on the updated maps
        g.nodes[-1].inputs = list(g.nodes[-1].inputs[::-1])
        gu.graph_changed(g)
        _check(g)
        gu.forget_free_names()
        _check(g)


def test_shared_maps_with_subgraph_reads():
    body = Graph("body", [Node("Add", "", ["a", "x"], ["o"])], [], [ValueInfo("o")], {})
    g = _graph()
    g.nodes.insert(2, Node("If", "", ["b"], ["f"], {"then_branch": body, "else_branch": body}, name="if"))
    g.nodes[-1].inputs = ["d", "f"]
    with gu.free_names_memo():
        _check(g)
        g.nodes[2] = Node("If", "", ["c"], ["f"], {"then_branch": body, "else_branch": body}, name="if2")
        g.nodes[1], g.nodes[2], g.nodes[3] = g.nodes[1], g.nodes[3], g.nodes[2]
        gu.graph_changed(g)
        _check(g)


def test_optimizer_result_unchanged_small_model():
    """A model where the sweeps rewrite many times: the same nodes as with maps rebuilt after every rewrite."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []
    x = "x"
    for i in range(6):
        w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
        inits += [onnx.numpy_helper.from_array(w, f"w{i}"),
                  onnx.numpy_helper.from_array(np.float32(rng.random(4) + 0.5), f"s{i}"),
                  onnx.numpy_helper.from_array(np.float32(rng.random(4)), f"b{i}"),
                  onnx.numpy_helper.from_array(np.float32(rng.random(4)), f"m{i}"),
                  onnx.numpy_helper.from_array(np.float32(rng.random(4) + 1), f"v{i}"),
                  onnx.numpy_helper.from_array(np.float32(rng.random((1, 4, 1, 1))), f"k{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}", f"s{i}", f"b{i}", f"m{i}", f"v{i}"], [f"n{i}"]),
                  helper.make_node("Mul", [f"n{i}", f"k{i}"], [f"u{i}"]),
                  helper.make_node("Relu", [f"u{i}"], [f"r{i}"])]
        x = f"r{i}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    feed = {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)}
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = onnxpy.InferenceSession(data, so).run(None, feed)[0]
    s = onnxpy.InferenceSession(data)
    np.testing.assert_allclose(s.run(None, feed)[0], ref, rtol=1e-4, atol=1e-4)
    assert len(s._state.model.graph.nodes) == 6


def test_sessions_are_built_without_hugepage_advice(monkeypatch):
    """numpy's huge-page advice is off while a session is built (weights load without compaction stalls) and
    restored afterwards -- once, by the last of nested or concurrent builds, and also when a build fails."""
    import threading

    import numpy as np

    from onnxpy.execution import memory

    state = {"on": True}
    seen = []

    def fake(flag):
        prev, state["on"] = state["on"], bool(flag)
        return prev

    monkeypatch.setattr(memory, "_hp_setter", lambda: fake)
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    blob = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    orig = memory.without_hugepages.__enter__

    def spy(self):
        r = orig(self)
        seen.append(state["on"])
        return r

    monkeypatch.setattr(memory.without_hugepages, "__enter__", spy)
    s = onnxpy.InferenceSession(blob)
    assert seen == [False] and state["on"] is True
    np.testing.assert_array_equal(s.run(None, {"x": np.array([-1.0, 2.0], np.float32)})[0], [0.0, 2.0])
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.InvalidProtobuf):
        onnxpy.InferenceSession(b"not a model")
    assert state["on"] is True
    with memory.without_hugepages():  # nested: the inner exit leaves it off
        with memory.without_hugepages():
            assert state["on"] is False
        assert state["on"] is False
    assert state["on"] is True
    barrier = threading.Barrier(4)
    inside = []

    def build():
        with memory.without_hugepages():
            barrier.wait()
            inside.append(state["on"])
            barrier.wait()

    ts = [threading.Thread(target=build) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert inside == [False] * 4 and state["on"] is True
    state["on"] = False  # a process that had it off keeps it off
    onnxpy.InferenceSession(blob)
    assert state["on"] is False
