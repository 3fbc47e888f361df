"""Gemm specialised at plan time on a constant B (and C): bit-identical results and the same errors as the generic
kernel, which runs when B and C are fed as inputs."""

from __future__ import annotations

import numpy as np
import pytest

import onnxpy
from _oracle import param_model

RNG = np.random.default_rng(5)


def _model(b, c, attrs, const, opset=13):
    params = {"B": b, **({"C": c} if c is not None else {})}
    return onnxpy.InferenceSession(param_model("Gemm", "A", params, const=const, opset=opset, **attrs))


def _step_fn(sess):
    (step,) = [s for s in sess._state.plan.steps if s.node.op_type == "Gemm"]
    return getattr(step.fn, "__qualname__", "")


CASES = [  # M, K, N, C shape (None: no C), attrs
    (1, 128, 512, (512,), {"transB": 1}),  # an exported LSTM cell's GEMV
    (4, 16, 8, (8,), {}),
    (3, 16, 8, (1, 8), {"transB": 1}),
    (3, 16, 8, (), {}),
    (3, 16, 8, (1, 1), {"transB": 1}),
    (5, 7, 6, None, {}),
    (5, 7, 6, (6,), {"beta": 0.0}),
]


@pytest.mark.parametrize("m,k,n,c_shape,attrs", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_specialised_equals_generic(m, k, n, c_shape, attrs, dtype):
    b = RNG.standard_normal((n, k) if attrs.get("transB") else (k, n)).astype(dtype)
    c = None if c_shape is None else RNG.standard_normal(c_shape).astype(dtype)
    fast = _model(b, c, attrs, True)
    generic = _model(b, c, attrs, False)
    assert _step_fn(fast).startswith("_gemm_specialize")
    a = RNG.standard_normal((m, k)).astype(dtype)
    got = fast.run(None, {"A": a})[0]
    want = generic.run(None, {"A": a, "B": b, **({"C": c} if c is not None else {})})[0]
    assert got.dtype == want.dtype == dtype and got.shape == want.shape == (m, n)
    if "run_packed" in _step_fn(fast):  # a weight packed for OpenBLAS's kernel (ops._packed): the bias goes first
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert np.array_equal(got, want)
    ref = a.astype(np.float64) @ (b.T if attrs.get("transB") else b).astype(np.float64)
    if c is not None and attrs.get("beta", 1.0):
        ref = ref + c
    np.testing.assert_allclose(got, ref, rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-4)


@pytest.mark.parametrize("attrs,c_shape", [({"alpha": 0.5}, (6,)), ({"transA": 1}, (6,)), ({"beta": 2.0}, (6,)),
                                           ({}, (5, 6))])
def test_gemm_cases_left_to_the_generic_kernel(attrs, c_shape):
    """alpha != 1, transposed A, beta not in {0, 1} and a full-size C are not specialised (same results anyway)."""
    b = RNG.standard_normal((7, 6)).astype(np.float32)
    c = RNG.standard_normal(c_shape).astype(np.float32)
    sess = _model(b, c, attrs, True)
    assert not _step_fn(sess).startswith("_gemm_specialize")
    a = RNG.standard_normal((7, 5) if attrs.get("transA") else (5, 7)).astype(np.float32)
    a2 = a.T if attrs.get("transA") else a
    want = attrs.get("alpha", 1.0) * (a2.astype(np.float64) @ b) + attrs.get("beta", 1.0) * c
    np.testing.assert_allclose(sess.run(None, {"A": a})[0], want, rtol=1e-5, atol=1e-5)


def test_gemm_specialised_falls_back_for_other_inputs():
    """A of another shape or type reaches the generic kernel, which reports it as before."""
    b = RNG.standard_normal((16, 8)).astype(np.float32)
    c = RNG.standard_normal(8).astype(np.float32)
    sess = _model(b, c, {}, True)
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.Fail, match="incompatible shapes"):
        sess.run(None, {"A": RNG.standard_normal((2, 15)).astype(np.float32)})
    with pytest.raises(Exception, match="(?i)type|float"):
        sess.run(None, {"A": RNG.standard_normal((2, 16))})  # float64 into a float model
    a1 = RNG.standard_normal(16).astype(np.float32)
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.Fail, match="2-D"):
        sess.run(None, {"A": a1})


def test_gemm_specialised_opset_7():
    b = RNG.standard_normal((16, 8)).astype(np.float32)
    c = RNG.standard_normal(8).astype(np.float32)
    fast = _model(b, c, {}, True, opset=7)
    generic = _model(b, c, {}, False, opset=7)
    a = RNG.standard_normal((3, 16)).astype(np.float32)
    assert np.array_equal(fast.run(None, {"A": a})[0], generic.run(None, {"A": a, "B": b, "C": c})[0])
