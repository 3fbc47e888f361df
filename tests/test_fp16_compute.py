"""Level 99 runs float16 graphs in float32 (onnxpy/optimizer/fp16.py), keeping the session's input/output types."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy

H = TensorProto.FLOAT16
NAME = "Float16ComputeInFloat32All"
RNG = np.random.default_rng(3)


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets]).SerializeToString()


def _sess(data, level=99, disabled=()):
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = level
    return onnxpy.InferenceSession(data, so, disabled_optimizers=list(disabled))


def _applied(s):
    return s._state.model.applied_passes.get(NAME, 0)


def _mlp():
    w = (RNG.standard_normal((8, 6)) * 0.5).astype(np.float16)
    b = RNG.standard_normal(6).astype(np.float16)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    data = _model(nodes, [helper.make_tensor_value_info("x", H, [3, 8])],
                  [helper.make_tensor_value_info("y", H, [3, 6])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return data, w, b


def test_float16_mlp_runs_in_float32_and_rounds_once():
    data, w, b = _mlp()
    x = RNG.standard_normal((3, 8)).astype(np.float16)
    s = _sess(data)
    assert _applied(s) == 1
    assert s.get_inputs()[0].type == "tensor(float16)" and s.get_outputs()[0].type == "tensor(float16)"
    y = s.run(None, {"x": x})[0]
    assert y.dtype == np.float16
    want = np.maximum(x.astype(np.float32) @ w.astype(np.float32) + b.astype(np.float32), 0)
    # the float32 result rounded once (summation order may move it by one float16 step)
    np.testing.assert_allclose(y.astype(np.float32), want, rtol=1e-3, atol=1e-4)
    base = _sess(data, level=0).run(None, {"x": x})[0]
    np.testing.assert_allclose(y.astype(np.float32), base.astype(np.float32), rtol=2e-3, atol=2e-3)
    # disabled by name, and not at the lower levels
    for s2 in (_sess(data, disabled=[NAME]), _sess(data, level=2)):
        assert _applied(s2) == 0
        np.testing.assert_allclose(s2.run(None, {"x": x})[0].astype(np.float32), base.astype(np.float32),
                                   rtol=2e-3, atol=2e-3)


def test_outputs_that_are_inputs_or_constants_keep_float16():
    c = np.array([1.5, -2.25], np.float16)
    nodes = [helper.make_node("Add", ["x", "x"], ["d"])]
    data = _model(nodes, [helper.make_tensor_value_info("x", H, [2])],
                  [helper.make_tensor_value_info(n, H, [2]) for n in ("d", "x", "c")],
                  [numpy_helper.from_array(c, "c")])
    x = np.array([0.5, 3.0], np.float16)
    s = _sess(data)
    assert _applied(s) == 1
    d, xo, co = s.run(None, {"x": x})
    assert d.dtype == xo.dtype == co.dtype == np.float16
    np.testing.assert_array_equal(d, x + x)
    np.testing.assert_array_equal(xo, x)
    np.testing.assert_array_equal(co, c)


def test_type_attributes_tensor_attributes_and_subgraphs():
    """Cast(to=FLOAT16), ConstantOfShape with a float16 value and an If branch reading an outer float16 input."""
    then = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", H, [2])],
                             [numpy_helper.from_array(np.array([2, 2], np.float16), "k")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", H, [2])])
    nodes = [helper.make_node("Cast", ["f"], ["fh"], to=H),
             helper.make_node("ConstantOfShape", ["shape"], ["z"],
                              value=numpy_helper.from_array(np.array([0.25], np.float16))),
             helper.make_node("If", ["cond"], ["i"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["fh", "z"], ["s"]), helper.make_node("Add", ["s", "i"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", H, [2]), helper.make_tensor_value_info("f", TensorProto.FLOAT, [2]),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]
    data = _model(nodes, inputs, [helper.make_tensor_value_info("y", H, [2])],
                  [numpy_helper.from_array(np.array([2], np.int64), "shape")])
    feeds = {"x": np.array([1.5, -3.0], np.float16), "f": np.array([0.1, 7.0], np.float32)}
    for cond in (True, False):
        feeds["cond"] = np.array(cond)
        s = _sess(data)
        assert _applied(s) == 1
        y = s.run(None, feeds)[0]
        base = _sess(data, level=0).run(None, feeds)[0]
        assert y.dtype == base.dtype == np.float16
        np.testing.assert_allclose(y.astype(np.float32), base.astype(np.float32), rtol=1e-3, atol=1e-3)


def test_custom_op_domains_keep_float16(tmp_path):
    so = onnxpy.SessionOptions()
    seen = []

    def twice(x):
        seen.append(x.dtype)
        return x * 2

    so.register_custom_op("my.ops", "Twice", twice)
    nodes = [helper.make_node("Twice", ["x"], ["y"], domain="my.ops")]
    data = _model(nodes, [helper.make_tensor_value_info("x", H, [2])], [helper.make_tensor_value_info("y", H, [2])],
                  opsets=(("", 17), ("my.ops", 1)))
    s = onnxpy.InferenceSession(data, so)
    assert _applied(s) == 0
    y = s.run(None, {"x": np.array([1, 2], np.float16)})[0]
    assert seen == [np.float16] and y.dtype == np.float16


@pytest.mark.parametrize("level", [99])
def test_saved_optimized_model_is_valid_onnx(tmp_path, level):
    import onnx

    data, _, _ = _mlp()
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = level
    path = str(tmp_path / "opt.onnx")
    so.optimized_model_filepath = path
    onnxpy.InferenceSession(data, so)
    m = onnx.load(path)
    onnx.checker.check_model(m)
    assert m.graph.input[0].type.tensor_type.elem_type == H and m.graph.output[0].type.tensor_type.elem_type == H
    x = RNG.standard_normal((3, 8)).astype(np.float16)
    np.testing.assert_array_equal(onnxpy.InferenceSession(path).run(None, {"x": x})[0],
                                  _sess(data).run(None, {"x": x})[0])


def test_explicit_casts_to_float16_still_round():
    """Cast(to=FLOAT16) is a rounding the model asks for: 2049 -> 2048 before the Cast to int, also at level 99 and
    inside subgraphs."""
    body = helper.make_graph([helper.make_node("Cast", ["f"], ["bh"], to=H),
                              helper.make_node("Cast", ["bh"], ["bi"], to=TensorProto.INT32)], "b", [],
                             [helper.make_tensor_value_info("bi", TensorProto.INT32, [2])])
    nodes = [helper.make_node("Cast", ["f"], ["h"], to=H), helper.make_node("Add", ["h", "x"], ["s"]),
             helper.make_node("Cast", ["h"], ["i"], to=TensorProto.INT32),
             helper.make_node("If", ["c"], ["j"], then_branch=body, else_branch=body)]
    inputs = [helper.make_tensor_value_info("f", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("x", H, [2]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    outs = [helper.make_tensor_value_info("s", H, [2]), helper.make_tensor_value_info("i", TensorProto.INT32, [2]),
            helper.make_tensor_value_info("j", TensorProto.INT32, [2])]
    data = _model(nodes, inputs, outs)
    feeds = {"f": np.array([2049.0, 3.0], np.float32), "x": np.array([0.0, 1.0], np.float16), "c": np.array(True)}
    s = _sess(data)
    assert _applied(s) == 1
    got = s.run(None, feeds)
    base = _sess(data, level=0).run(None, feeds)
    for g_, b_ in zip(got, base):
        assert g_.dtype == b_.dtype
        np.testing.assert_array_equal(g_, b_)
    assert got[1].tolist() == [2048, 3]
