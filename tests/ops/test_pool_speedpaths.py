"""The flat stride-1 2-D pooling path (``pool._pool2d_s1``: whole-block passes over shifted views of the flattened
planes, edge positions rewritten) against onnxpy's general separable path and against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from _oracle import assert_outputs_close, infer_output_types, run_onnxpy, run_ort, single_node
from onnxpy.ops import pool

RNG = np.random.default_rng(20240917)


def _general(fn, x, monkeypatch, **attrs):
    """``fn`` through the general separable path (flat path and AveragePool's window-matrix GEMMs off)."""
    with monkeypatch.context() as m:
        m.setattr(pool, "_FLAT_POOL", False)
        m.setattr(pool, "_AVG_GEMM_RATIO", 0)
        m.setattr(pool, "_AVG_GEMM_S1_RATIO", 0)
        return fn(x, **attrs)


def _random_case(rng, dtype, max_k=4):
    """A random 2-D pooling input and attributes, stride 1 three times out of four."""
    H, W = (int(v) for v in rng.integers(1, 16, size=2))
    x = rng.standard_normal((int(rng.integers(1, 3)), int(rng.integers(1, 5)), H, W)) * 40
    if np.dtype(dtype).kind == "f":
        x.flat[rng.integers(0, x.size, 2)] = [np.nan, -np.inf]
    elif np.dtype(dtype).kind == "u":
        x = np.abs(x)
    attrs = {"kernel_shape": [int(v) for v in rng.integers(1, max_k + 1, size=2)],
             "strides": [1, 1] if rng.random() < 0.75 else [int(v) for v in rng.integers(1, 3, size=2)],
             "dilations": [int(v) for v in rng.integers(1, 3, size=2)], "ceil_mode": int(rng.integers(0, 2)),
             "auto_pad": ["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"][int(rng.integers(0, 5))]}
    if attrs["auto_pad"] == "NOTSET":
        attrs["pads"] = [int(v) for v in rng.integers(0, 3, size=4)]
    return x.astype(dtype), attrs


def _geometry(x, attrs):
    """_pool_geometry's (ks, st, dl, pb, pe, out), or None for an invalid or empty pooling."""
    try:
        g = pool._pool_geometry(x, attrs["kernel_shape"], attrs["strides"], attrs["dilations"], attrs.get("pads"),
                                attrs["auto_pad"], attrs["ceil_mode"], "P")
    except ValueError:
        return None
    return g if min(g[-1]) > 0 else None


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.uint8, np.int8])
def test_flat_maxpool_matches_general(dtype, monkeypatch):
    """Random geometries (pads, auto_pad, dilations, ceil_mode, batch > 1), one-channel and default blocks, NaN and
    inf inputs: the flat path gives exactly the general path's values."""
    rng = np.random.default_rng(int(np.dtype(dtype).num))
    flat = 0
    for i in range(200):
        x, attrs = _random_case(rng, dtype)
        g = _geometry(x, attrs)
        if g is None:
            continue
        flat += pool._flat_ok(x.shape[2:], *g)
        want = _general(pool.max_pool, x, monkeypatch, **attrs)
        monkeypatch.setattr(pool, "_FLAT_BLOCK_BYTES", 1 if i % 2 else 1 << 19)
        got = pool.max_pool(x, **attrs)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert flat > 40


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("gemm_ratio", [0, pool._AVG_GEMM_S1_RATIO])
def test_flat_avgpool_matches_general(dtype, include_pad, gemm_ratio, monkeypatch):
    """The flat path (counts divided per block) against the general path; with the default ratio the small stride-1
    planes take the window-matrix GEMMs instead."""
    monkeypatch.setattr(pool, "_AVG_GEMM_S1_RATIO", gemm_ratio)
    rng = np.random.default_rng(7 + include_pad)
    flat = 0
    for i in range(300):
        x, attrs = _random_case(rng, dtype, max_k=3)
        x /= 40  # values ~1: summation order changes results by float rounding, up to atol with cancellation
        g = _geometry(x, attrs)
        if g is None:
            continue
        flat += pool._flat_ok(x.shape[2:], *g)
        want = _general(pool.average_pool, x, monkeypatch, count_include_pad=include_pad, **attrs)
        monkeypatch.setattr(pool, "_FLAT_BLOCK_BYTES", 1 if i % 2 else 1 << 19)
        got = pool.average_pool(x, count_include_pad=include_pad, **attrs)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        tol = 1e-6 if dtype == np.float32 else 1e-13
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert flat > 60


@pytest.mark.parametrize("shape", [(1, 4, 56, 60), (2, 3, 9, 7)])
def test_flat_wide_planes_and_half_floats(shape, monkeypatch):
    """Long rows and float16 inputs (computed in float32 for AveragePool, as float16 for MaxPool)."""
    x = RNG.standard_normal(shape).astype(np.float32)
    x.flat[::13] = np.inf
    for attrs in ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, {"kernel_shape": [2, 3], "pads": [0, 1, 1, 1]},
                  {"kernel_shape": [3, 3]}):
        assert pool._flat_ok(x.shape[2:], *pool._pool_geometry(x, attrs["kernel_shape"], None, None,
                                                                 attrs.get("pads"), "NOTSET", 0, "P"))
        np.testing.assert_array_equal(pool.max_pool(x, **attrs), _general(pool.max_pool, x, monkeypatch, **attrs))
        got, want = pool.average_pool(x, **attrs), _general(pool.average_pool, x, monkeypatch, **attrs)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        h = x.astype(np.float16)
        np.testing.assert_array_equal(pool.max_pool(h, **attrs), _general(pool.max_pool, h, monkeypatch, **attrs))
        got16 = pool.average_pool(h, **attrs)
        assert got16.dtype == np.float16
        np.testing.assert_array_equal(got16, _general(pool.average_pool, h, monkeypatch, **attrs))


def test_pass_plan_edges():
    """The edge positions of a pass and the taps left in range there."""
    assert pool._pass_plan(3, 1, 1, 7, 7) == ((-1, 0, 1), (1, 1), ((0, (0, 1)), (6, (5, 6))))
    # dilation 2, pads (1, 0), 6 outputs of 7: one tap in range at the first position
    assert pool._pass_plan(2, 2, 1, 7, 6) == ((-1, 1), (1, 1), ((0, (1,)),))
    # no pads, 5 outputs of 7: no edges
    assert pool._pass_plan(3, 1, 0, 7, 5) == ((0, 1, 2), (0, 2), ())


def _check_ort(op, x, attrs, opset):
    out_infos = [helper.make_tensor_value_info("out0", 0, None)]
    m, feeds = single_node(op, [x], 1, opsets=[("", opset)], out_infos=out_infos, ir_version=10, **attrs)
    infer_output_types(m, [None])
    data = m.SerializeToString()
    assert_outputs_close(run_onnxpy(data, feeds), run_ort(data, feeds), 1e-5, 1e-5)


CNN_CASES = [  # pooling nodes of the ONNX model zoo's CNNs (channels cut down)
    ((1, 24, 7, 7), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),  # inception v1/v2
    ((1, 20, 13, 13), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ((1, 12, 28, 28), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ((2, 8, 20, 20), {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2]}),  # YOLO SPP(F)
    ((1, 6, 6, 6), {"kernel_shape": [3, 3], "pads": [0, 0, 1, 1]}),
    ((1, 40, 14, 14), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),  # strided: other paths
]


@pytest.mark.parametrize("xs,attrs", CNN_CASES)
def test_cnn_pools_vs_ort(xs, attrs):
    pytest.importorskip("onnxruntime")
    x = RNG.standard_normal(xs).astype(np.float32)
    _check_ort("MaxPool", x, attrs, 12)
    _check_ort("AveragePool", x, attrs, 11)
    _check_ort("AveragePool", x, dict(attrs, count_include_pad=1), 11)


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
@pytest.mark.parametrize("shape", [(1, 37, 7, 7), (2, 3, 5, 4), (1, 2, 6)])
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_window_covering_the_whole_plane_is_the_global_pool(op, shape, ceil_mode):
    """A single unpadded window over the whole input (ShuffleNet's final 7x7 AveragePool) takes the global pool's
    path; values as onnxruntime's."""
    x = RNG.standard_normal(shape).astype(np.float32)
    ks = list(shape[2:])
    assert pool._whole_plane(shape[2:], ks, [1] * len(ks), [0] * len(ks), [0] * len(ks), [1] * len(ks))
    model, feeds = single_node(op, [x], 1, opsets=[("", 19)], kernel_shape=ks, ceil_mode=ceil_mode)
    assert_outputs_close(run_onnxpy(model, feeds), run_ort(model, feeds), rtol=1e-5, atol=1e-6)
    # padded or strided-out windows do not qualify
    assert not pool._whole_plane(shape[2:], ks, [1] * len(ks), [1] + [0] * (len(ks) - 1), [0] * len(ks),
                                 [1] * len(ks))
    assert not pool._whole_plane(shape[2:], [k - 1 for k in ks], [1] * len(ks), [0] * len(ks), [0] * len(ks),
                                 [2] * len(ks))
