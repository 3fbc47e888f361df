"""The Gradient operator (ai.onnx.preview.training), lowered to backward nodes, against finite differences."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxpy as ort


def _model(nodes, y, xs, shapes):
    ins = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, s) for n, s in zip(xs, shapes)]
    grads = [f"d_{x}" for x in xs]
    nodes = nodes + [helper.make_node("Gradient", xs, grads, domain="ai.onnx.preview.training", xs=xs, y=y)]
    outs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in [y] + grads]
    g = helper.make_graph(nodes, "g", ins, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("ai.onnx.preview.training", 1)])
    return ort.InferenceSession(m.SerializeToString())


def _numeric(sess, feeds, x, eps=1e-6):
    base = {k: v.copy() for k, v in feeds.items()}
    grad = np.zeros_like(feeds[x])
    for i in np.ndindex(feeds[x].shape):
        plus, minus = dict(base), dict(base)
        plus[x] = base[x].copy()
        minus[x] = base[x].copy()
        plus[x][i] += eps
        minus[x][i] -= eps
        grad[i] = (sess.run(None, plus)[0].sum() - sess.run(None, minus)[0].sum()) / (2 * eps)
    return grad


@pytest.mark.parametrize("case", ["broadcast_arith", "matmul_chain", "unary"])
def test_gradient_matches_finite_differences(case):
    rng = np.random.default_rng(0)
    if case == "broadcast_arith":
        nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Div", ["m", "c"], ["d"]),
                 helper.make_node("Sub", ["d", "a"], ["y"])]
        xs, shapes = ["a", "b", "c"], [[2, 3], [3], [1, 3]]
    elif case == "matmul_chain":
        nodes = [helper.make_node("MatMul", ["a", "b"], ["m"]), helper.make_node("Tanh", ["m"], ["t"]),
                 helper.make_node("MatMul", ["t", "c"], ["y"])]
        xs, shapes = ["a", "b", "c"], [[2, 3], [3, 4], [4]]
    else:
        nodes = [helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Exp", ["b"], ["e"]),
                 helper.make_node("Mul", ["s", "e"], ["p"]), helper.make_node("Relu", ["p"], ["r"]),
                 helper.make_node("Add", ["r", "s"], ["y"])]
        xs, shapes = ["a", "b"], [[3], [3]]
    sess = _model(nodes, "y", xs, shapes)
    feeds = {x: rng.uniform(0.5, 1.5, s) for x, s in zip(xs, shapes)}
    outs = sess.run(None, feeds)
    # Gradient differentiates y itself; with a non-scalar y the seed is ones, i.e. d(sum y)/dx
    for x, got in zip(xs, outs[1:]):
        np.testing.assert_allclose(got, _numeric(sess, feeds, x), rtol=1e-5, atol=1e-7)


def test_unsupported_op_is_named():
    from onnxpy.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

    with pytest.raises(OrtNotImplemented, match="Softmax"):
        _model([helper.make_node("Softmax", ["a"], ["y"])], "y", ["a"], [[3]])
