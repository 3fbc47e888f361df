"""ReduceSum / ReduceMean over adjacent axes of large float tensors as matrix-vector products with ones."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpy.ops import reduce as R


@pytest.mark.parametrize("shape,axes", [
    ((1, 96, 40, 40), (2, 3)), ((8, 64, 9, 9), (2, 3)), ((2, 128, 384), (1,)), ((2, 128, 384), (2,)),
    ((64, 1000), (0,)), ((4, 30, 100), (0, 1, 2)), ((3, 40, 50), (0, 1)), ((3, 40, 50), (1, 2)),
])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("keepdims", [True, False])
def test_gemv_sums_match_numpy(shape, axes, dt, keepdims):
    x = np.random.default_rng(2).standard_normal(shape).astype(dt)
    got = R._gemv_sum(x, axes, keepdims)
    assert got is not None
    want = np.add.reduce(x.astype(np.float64), axis=axes, keepdims=keepdims)
    assert got.shape == want.shape and got.dtype == dt
    np.testing.assert_allclose(got, want, rtol=1e-5 if dt == np.float32 else 1e-12, atol=1e-4)
    mean = R._mean_native(x, axes, keepdims)
    np.testing.assert_allclose(mean, want / (x.size // want.size), rtol=1e-5, atol=1e-6)


def test_gemv_sums_decline_and_propagate():
    r = np.random.default_rng(3)
    x = r.standard_normal((40, 50, 6)).astype(np.float32)
    assert R._gemv_sum(x, (0, 2), True) is None  # not adjacent
    assert R._gemv_sum(x[:, ::2], (1,), True) is None  # not contiguous
    assert R._gemv_sum(x.astype(np.float16), (1,), True) is None
    assert R._gemv_sum(x[:4, :4], (1,), True) is None  # small: numpy's own reduction
    y = x.copy()
    y[3, 7, 2] = np.nan
    y[5, 1, 0] = np.inf
    s = R._sum(y, (1,), False)
    assert np.isnan(s[3, 2]) and np.isinf(s[5, 0]) and np.isfinite(np.delete(s.reshape(-1), [3 * 6 + 2, 5 * 6])).all()


def test_ones_vectors_are_bounded():
    """The cached ones vectors stay small: none beyond ONES_MAX elements (such sums take numpy's reduction), and
    the cache is emptied before it passes 16 MiB."""
    from onnxpy.ops import _common

    assert _common.ones_vector(_common.ONES_MAX + 1, np.float32) is None
    for n in range(1, 11):  # (55 x 400 KB in all: the cache is emptied once on the way)
        v = _common.ones_vector(n * 100_000, np.float32)
        assert v.shape == (n * 100_000,) and not v.flags.writeable and v.min() == 1
    assert _common._ONES_BYTES[0] <= 1 << 24
    assert sum(v.nbytes for v in _common._ONES.values()) == _common._ONES_BYTES[0]


def _softmax64(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("case", ["plain", "large", "far_below", "neg_inf", "nan", "middle_axis", "opset11"])
def test_softmax_unshifted_path_and_its_fallbacks(case):
    """Softmax without the row maxima (element <= 60, row sums >= 1e-20) and the cases that take the usual steps
    give the float64 softmax to float32 precision; the input is left unchanged."""
    from onnxpy.ops import activations as A

    r = np.random.default_rng(5)
    x = (r.standard_normal((3, 7, 50)) * 4).astype(np.float32)
    axis = -1
    if case == "large":
        x[1, 2, 3] = 100.0
    elif case == "far_below":
        x[2, 1] -= 200.0  # one row whose exps underflow: that call falls back to subtracting the maxima
    elif case == "neg_inf":
        x[0, 0, :10] = -np.inf
    elif case == "nan":
        x[0, 3, 4] = np.nan
    elif case == "middle_axis":
        axis = 1
    keep = x.copy()
    got = A.softmax_1(x, axis=1) if case == "opset11" else A.softmax_13(x, axis=axis)
    want = _softmax64(x.reshape(3, -1), 1).reshape(x.shape) if case == "opset11" else _softmax64(x, axis)
    assert got.dtype == np.float32 and np.array_equal(x, keep, equal_nan=True)
    if case == "nan":
        assert np.isnan(got[0, 3]).all() and np.isfinite(np.delete(got.reshape(21, 50), 3, axis=0)).all()
        got, want = np.delete(got.reshape(21, 50), 3, axis=0), np.delete(want.reshape(21, 50), 3, axis=0)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)
