"""LayerNormalization specialised at plan time on a constant Scale/B: bit-identical to the generic kernel (which
runs when the parameters are fed as inputs), and the same errors for inputs it does not take."""

from __future__ import annotations

import numpy as np
import pytest

import onnxpy
from _oracle import param_model
from onnxpy.capi.onnxruntime_pybind11_state import Fail

RNG = np.random.default_rng(3)


def _model(scale, bias, attrs, const, outputs=1):
    params = {"S": scale, **({"B": bias} if bias is not None else {})}
    return onnxpy.InferenceSession(param_model("LayerNormalization", "X", params, const=const,
                                               outputs=["Y", "Mean", "InvStd"][:outputs], **attrs))


def _specialised(sess):
    (step,) = sess._state.plan.steps
    return getattr(step.fn, "__qualname__", "").startswith("_layer_norm_specialize")


CASES = [  # x shape, scale shape, attrs
    ((1, 128, 768), (768,), {}),
    ((2, 5, 16), (16,), {"epsilon": 1e-12}),
    ((3, 4, 6), (4, 6), {"axis": 1}),
    ((3, 4, 6), (4, 6), {"axis": -2}),
    ((7, 9000), (9000,), {}),  # rows past the einsum width: numpy's pairwise sums
]


@pytest.mark.parametrize("x_shape,s_shape,attrs", CASES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_specialised_equals_generic(x_shape, s_shape, attrs, with_bias, dtype):
    scale = RNG.standard_normal(s_shape).astype(dtype)
    bias = RNG.standard_normal(s_shape).astype(dtype) if with_bias else None
    fast = _model(scale, bias, attrs, True)
    generic = _model(scale, bias, attrs, False)
    assert _specialised(fast) and not _specialised(generic)
    x = (RNG.standard_normal(x_shape) * 3 + 1).astype(dtype)
    got = fast.run(None, {"X": x})[0]
    want = generic.run(None, {"X": x, "S": scale, **({"B": bias} if with_bias else {})})[0]
    assert got.dtype == dtype and got.shape == x_shape and np.array_equal(got, want)
    ax = len(x_shape) - len(s_shape)
    axes = tuple(range(ax, len(x_shape)))
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(axis=axes, keepdims=True)) / np.sqrt(x64.var(axis=axes, keepdims=True)
                                                              + attrs.get("epsilon", 1e-5)) * scale
    if with_bias:
        ref = ref + bias
    np.testing.assert_allclose(got, ref, rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-4)


def test_layer_norm_not_specialised_for_stats_outputs_or_mismatched_axis():
    scale = RNG.standard_normal(8).astype(np.float32)
    assert not _specialised(_model(scale, None, {}, True, outputs=3))
    # axis 1 of a 3-D input with an (8,) Scale (broadcast over the normalized (3, 8)): the generic kernel's case
    fast = _model(scale, None, {"axis": 1}, True)
    generic = _model(scale, None, {"axis": 1}, False)
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    assert np.array_equal(fast.run(None, {"X": x})[0], generic.run(None, {"X": x, "S": scale})[0])


def test_layer_norm_specialised_falls_back_to_the_generic_errors():
    scale = RNG.standard_normal(8).astype(np.float32)
    sess = _model(scale, scale, {}, True)
    assert _specialised(sess)
    with pytest.raises(Fail, match="Scale"):
        sess.run(None, {"X": RNG.standard_normal((2, 7)).astype(np.float32)})  # 7 features for an 8-wide Scale
    with pytest.raises(Exception):  # noqa: B017 - float64 into a float model: onnxpy's input type check
        sess.run(None, {"X": RNG.standard_normal((2, 8))})
    y = sess.run(None, {"X": np.zeros((0, 8), np.float32)})[0]
    assert y.shape == (0, 8)
