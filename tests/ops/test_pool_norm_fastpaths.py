"""Fast paths of pooling (unpadded separable reduction), cached test-mode BatchNormalization and in-place Clip."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from onnxpy.ops import elementwise, normalization, pool


def test_unpadded_reduction_matches_padded():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(400):
        n = int(rng.integers(1, 4))
        shp = [int(v) for v in rng.integers(1, 8, size=n)]
        ks = [int(v) for v in rng.integers(1, 5, size=n)]
        st = [int(v) for v in rng.integers(1, 4, size=n)]
        dl = [int(v) for v in rng.integers(1, 3, size=n)]
        pads = [int(v) for v in rng.integers(0, 3, size=2 * n)]
        x = rng.standard_normal((2, 3, *shp)).astype(np.float32)
        try:
            k_, s_, d_, pb, pe, out = pool._pool_geometry(x, ks, st, dl, pads, "NOTSET", int(rng.integers(0, 2)), "P")
        except ValueError:
            continue
        if int(np.prod(out)) == 0:
            continue
        for how, fill in (("max", -np.inf), ("sum", 0.0)):
            got = pool._reduce_unpadded(x, k_, s_, d_, pb, out, how, fill)
            ref = pool._reduce_windows(pool._padded(x, k_, s_, d_, pb, pe, out, fill), k_, s_, d_, out, how)
            assert got.shape == ref.shape
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
        checked += 1
    assert checked > 100


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_maxpool_dtypes_and_negative_values(dtype):
    x = (np.arange(2 * 3 * 7 * 6) % 23 - 11).astype(np.float64).reshape(2, 3, 7, 6)
    if dtype == np.uint8:
        x = x + 11
    x = x.astype(dtype)
    y = pool.max_pool(x, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    ref = np.full((2, 3, 4, 3), np.iinfo(dtype).min if dtype != np.float32 else -np.inf, dtype=np.float64)
    for i in range(4):
        for j in range(3):
            win = x[:, :, max(0, 2 * i - 1):2 * i + 2, max(0, 2 * j - 1):2 * j + 2]
            ref[:, :, i, j] = win.max(axis=(2, 3))
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, ref.astype(dtype))


def _ro(a):
    a = np.array(a, dtype=np.float32)
    a.flags.writeable = False
    return a


def _bn_ref(x, s, b, m, v, eps):
    sh = (-1,) + (1,) * (x.ndim - 2)
    return (x - m.reshape(sh)) / np.sqrt(v.reshape(sh) + eps) * s.reshape(sh) + b.reshape(sh)


def test_batchnorm_cached_params_and_donation():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 5, 3)).astype(np.float32)
    ps = [_ro(rng.standard_normal(4)), _ro(rng.standard_normal(4)), _ro(rng.standard_normal(4)),
          _ro(rng.random(4) + 0.5)]
    ref = _bn_ref(x, *ps, 1e-3)
    y1 = normalization.batch_normalization_9(x, *ps, epsilon=1e-3)
    y2 = normalization.batch_normalization_9(x, *ps, epsilon=1e-3)  # cached k/c
    np.testing.assert_allclose(y1, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y1, y2)
    # another epsilon is another entry
    np.testing.assert_allclose(normalization.batch_normalization_9(x, *ps, epsilon=0.5), _bn_ref(x, *ps, 0.5),
                               rtol=1e-5, atol=1e-5)
    # donated input is overwritten and returned
    xd = x.copy()
    y3 = normalization.batch_normalization_14(xd, *ps, epsilon=1e-3, _donated=(0,))
    assert y3 is xd
    np.testing.assert_array_equal(y3, y1)
    # not donated: input untouched
    x0 = x.copy()
    normalization.batch_normalization_14(x0, *ps, epsilon=1e-3)
    np.testing.assert_array_equal(x0, x)
    # parameters that die and are replaced never hit a stale entry
    for _ in range(5):
        qs = [_ro(rng.standard_normal(4)), _ro(rng.standard_normal(4)), _ro(rng.standard_normal(4)),
              _ro(rng.random(4) + 0.5)]
        np.testing.assert_allclose(normalization.batch_normalization_9(x, *qs), _bn_ref(x, *qs, 1e-5),
                                   rtol=1e-5, atol=1e-5)
        del qs
        gc.collect()


def test_batchnorm_writeable_params_not_cached():
    x = np.ones((1, 2, 2, 2), np.float32)
    s, b, m, v = (np.ones(2, np.float32) for _ in range(4))
    y1 = normalization.batch_normalization_9(x, s, b, m, v)
    s[:] = 2
    y2 = normalization.batch_normalization_9(x, s, b, m, v)
    np.testing.assert_allclose(y2, 2 * y1 - 1, rtol=1e-6)


def test_batchnorm_float16_and_non_spatial():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 2)).astype(np.float16)
    ps = [_ro(rng.standard_normal(4)), _ro(rng.standard_normal(4)), _ro(rng.standard_normal(4)),
          _ro(rng.random(4) + 0.5)]
    y = normalization.batch_normalization_9(x, *ps)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float32), _bn_ref(x.astype(np.float32), *ps, 1e-5), rtol=2e-3, atol=2e-3)
    x2 = rng.standard_normal((3, 4, 2)).astype(np.float32)
    qs = [_ro(rng.standard_normal((4, 2))), _ro(rng.standard_normal((4, 2))), _ro(rng.standard_normal((4, 2))),
          _ro(rng.random((4, 2)) + 0.5)]
    y2 = normalization.batch_normalization_7(x2, *qs, spatial=0)
    ref = (x2 - qs[2]) / np.sqrt(qs[3] + 1e-5) * qs[0] + qs[1]
    np.testing.assert_allclose(y2, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("donate", [False, True])
def test_clip_in_place(donate):
    x = np.array([[np.nan, -2.0, 0.5, 9.0]], np.float32)
    lo, hi = np.array(0, np.float32), np.array(6, np.float32)
    xin = x.copy()
    y = elementwise.clip_11(xin, lo, hi, _donated=(0,) if donate else ())
    np.testing.assert_array_equal(y, [[np.nan, 0.0, 0.5, 6.0]])
    assert (y is xin) == donate
    if not donate:
        np.testing.assert_array_equal(xin, x)
    # min > max gives max everywhere (except NaN)
    np.testing.assert_array_equal(elementwise.clip_11(x[:, 1:], hi, lo), [[0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(elementwise.clip_11(x[:, 1:].copy(), lo, _donated=(0,)), [[0.0, 0.5, 9.0]])
    np.testing.assert_array_equal(elementwise.clip_11(x[:, 1:].copy(), None, hi, _donated=(0,)), [[-2.0, 0.5, 6.0]])
    xi = np.array([-5, 3, 100], np.int8)
    np.testing.assert_array_equal(elementwise.clip_11(xi, np.array(0, np.int8), np.array(6, np.int8)), [0, 3, 6])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_donated_input_normalized_in_place(dtype):
    """The plan-time LayerNormalization takes a dying input as its output buffer: same values as the fresh-buffer
    route, written into the donated array; an input it does not own is left alone."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 48)).astype(dtype)
    g, b = rng.standard_normal(48).astype(dtype), rng.standard_normal(48).astype(dtype)
    from onnxpy.ops._shape_util import NOT_CONST

    run = normalization.layer_normalization.specialize((NOT_CONST, g, b), {"axis": -1, "epsilon": 1e-5})
    assert run is not None and run.donates
    ref = run(x, g, b)
    xd = x.copy()
    y = run(xd, g, b, _donated=(0,))
    assert np.shares_memory(y, xd)
    np.testing.assert_array_equal(y, ref)
    x0 = x.copy()
    np.testing.assert_array_equal(run(x0, g, b), ref)
    np.testing.assert_array_equal(x0, x)
    mean = x.mean(-1, keepdims=True)
    np.testing.assert_allclose(ref, (x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b, rtol=1e-4,
                               atol=1e-5)
    xs = x[:, ::2].copy()[:, :2]  # a donated input that is not C-contiguous keeps the fresh buffer
    xv = np.asfortranarray(xs)
    yv = run(xv, g, b, _donated=(0,))
    assert not np.shares_memory(yv, xv)
    np.testing.assert_array_equal(yv, run(xs, g, b))


@pytest.mark.parametrize("simplified", [False, True])
def test_skip_layer_norm_in_place_matches_all_outputs_route(simplified):
    """With only the normalized output wanted, SkipLayerNormalization normalizes its sum in place: the values are
    those of the route that also returns mean, inv_std and the sum (which keeps the sum intact)."""
    from onnxpy.ops import contrib_norm

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 32)).astype(np.float32)
    s = rng.standard_normal((2, 6, 32)).astype(np.float32)
    g, b, bias = (rng.standard_normal(32).astype(np.float32) for _ in range(3))
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    beta = None if simplified else b
    full = contrib_norm._skip_norm(op, x, s, g, beta, bias, 1e-5, simplified, (), ("y", "m", "i", "sum"))
    np.testing.assert_array_equal(full[3], x + s + bias)
    xd = x.copy()
    y = contrib_norm._skip_norm(op, xd, s, g, beta, bias, 1e-5, simplified, (0,), ("y", "", "", ""))
    assert np.shares_memory(y, xd)
    np.testing.assert_array_equal(y, full[0])
    x0 = x.copy()
    y0 = contrib_norm._skip_norm(op, x0, s, g, beta, bias, 1e-5, simplified, (), ("y",))
    np.testing.assert_array_equal(y0, full[0])
    np.testing.assert_array_equal(x0, x)
