"""The fast 2-D Conv paths (bias folded into the GEMM, strided/polyphase im2col, shifted GEMMs, pointwise,
depthwise with fused crop + bias), the filter-layout cache and the pairwise pooling reductions, against onnxruntime
and against onnxpy's general N-D path."""

from __future__ import annotations

import functools
import gc

import numpy as np
import pytest
from onnx import helper

from _oracle import Init, assert_outputs_close, infer_output_types, run_onnxpy, run_ort, single_node
from onnxpy.ops import conv as conv_mod
from onnxpy.ops import pool as pool_mod
from onnxpy.ops import _packed


@pytest.fixture(autouse=True)
def _numpy_paths(monkeypatch):
    """These tests cover the numpy depthwise-convolution and pooling paths (machines without the native kernels run
    them); the native kernels are checked against them in test_native_kernel.py."""
    monkeypatch.setattr(conv_mod, "DW_NATIVE", False)
    monkeypatch.setattr(pool_mod, "POOL_NATIVE", False)

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(20240611)


def _check(op, inputs, attrs, opset=19, rtol=1e-4, atol=1e-4, n_out=1):
    out_infos = [helper.make_tensor_value_info(f"out{j}", 0, None) for j in range(n_out)]
    m, feeds = single_node(op, inputs, n_out, opsets=[("", opset)], out_infos=out_infos, ir_version=10, **attrs)
    infer_output_types(m, [None] * n_out)
    data = m.SerializeToString()
    got, want = run_onnxpy(data, feeds), run_ort(data, feeds)
    assert_outputs_close(got, want, rtol, atol)
    return got


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _general(x, w, b, pads, strides, dilations, group):
    """onnxpy's general N-D path (im2col through a strided view), the reference for the fast paths."""
    n = x.ndim - 2
    pb, pe = list(pads[:n]), list(pads[n:])
    out = conv_mod._conv_core(x, w, pb, pe, list(strides), list(dilations), group, "Conv")
    return conv_mod._add_bias(out, b, w.shape[0], "Conv")


CASES = [
    # (x shape, w shape, attrs)
    ((1, 16, 15, 13), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # GEMM path, M >= C
    ((2, 5, 9, 11), (7, 5, 3, 2), {"pads": [1, 0, 2, 1], "dilations": [2, 1]}),  # batch 2, asymmetric pads
    ((1, 40, 10, 9), (8, 40, 3, 3), {"pads": [1, 1, 1, 1]}),  # shifted GEMMs (2M <= C)
    ((2, 40, 8, 7), (8, 40, 3, 3), {"pads": [0, 2, 1, 0], "dilations": [1, 2]}),  # shifted, dilated, batch 2
    ((1, 3, 23, 21), (8, 3, 3, 3), {"strides": [2, 2]}),  # strided, view im2col
    ((1, 3, 30, 29), (6, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),  # strided, polyphase
    ((2, 4, 25, 22), (5, 4, 5, 4), {"strides": [3, 2], "pads": [2, 1, 0, 2], "dilations": [1, 2]}),  # polyphase
    ((1, 6, 12, 10), (9, 2, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),  # grouped KxK
    ((1, 6, 12, 10), (9, 2, 3, 3), {"group": 3, "strides": [2, 1], "pads": [0, 1, 1, 0]}),
    ((2, 12, 7, 9), (24, 4, 1, 1), {"group": 3}),  # grouped 1x1, M >= C (bias in the GEMM)
    ((1, 24, 7, 9), (6, 8, 1, 1), {"group": 3}),  # grouped 1x1, M < C (bias added)
    ((1, 16, 9, 9), (32, 16, 1, 1), {"strides": [2, 2]}),  # strided 1x1
    ((1, 8, 9, 10), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),  # depthwise, flat
    ((2, 100, 6, 7), (100, 1, 5, 5), {"group": 100, "pads": [2, 2, 2, 2]}),  # depthwise, channels-last
    ((1, 12, 17, 16), (12, 1, 3, 3), {"group": 12, "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # depthwise strided
    ((1, 6, 12, 96), (12, 1, 3, 3), {"group": 6, "strides": [2, 1], "pads": [1, 1, 1, 1]}),  # multiplier 2
    ((1, 4, 9, 8), (6, 4, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 4, 9, 8), (6, 4, 2, 2), {"auto_pad": "SAME_LOWER"}),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs,ws,attrs", CASES)
def test_conv2d_fast_paths_vs_ort(xs, ws, attrs, bias):
    x, w = rand(*xs), rand(*ws)
    inputs = [x, Init(w)] + ([Init(rand(ws[0]))] if bias else [])
    _check("Conv", inputs, attrs, opset=11)


@pytest.mark.parametrize("xs,ws,attrs", [c for c in CASES if "auto_pad" not in c[2]])
def test_conv2d_fast_paths_vs_general(xs, ws, attrs):
    x, w, b = rand(*xs, dtype=np.float64), rand(*ws, dtype=np.float64), rand(ws[0], dtype=np.float64)
    pads = attrs.get("pads", [0, 0, 0, 0])
    strides = attrs.get("strides", [1, 1])
    dil = attrs.get("dilations", [1, 1])
    group = attrs.get("group", 1)
    want = _general(x, w, b.copy(), pads, strides, dil, group)
    got = conv_mod.conv(x, w, b, **attrs)
    assert got.dtype == np.float64 and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_conv2d_small_column_blocks(monkeypatch):
    """Row blocks of the GEMM path (forced tiny) give the same result."""
    monkeypatch.setattr(conv_mod, "_GEMM_COLS_BLOCK", 1)
    x, w, b = rand(2, 5, 13, 11), rand(7, 5, 3, 3), rand(7)
    for attrs in ({"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [1, 0, 0, 1]}):
        want = _general(x, w, b.copy(), attrs["pads"], attrs.get("strides", [1, 1]), [1, 1], 1)
        np.testing.assert_allclose(conv_mod.conv(x, w, b, **attrs), want, rtol=1e-5, atol=1e-5)
    x7, w7 = rand(1, 3, 20, 19), rand(4, 3, 7, 7)
    want = _general(x7, w7, b[:4].copy(), [3, 3, 3, 3], [2, 2], [1, 1], 1)
    got = conv_mod.conv(x7, w7, b[:4], pads=[3, 3, 3, 3], strides=[2, 2])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_conv2d_fast_paths_dtypes(dtype):
    x, w, b = rand(1, 6, 11, 10, dtype=dtype), rand(8, 6, 3, 3, dtype=dtype), rand(8, dtype=dtype)
    got = conv_mod.conv(x, w, b, pads=[1, 1, 1, 1], strides=[2, 1])
    assert got.dtype == dtype
    want = _general(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), [1, 1, 1, 1], [2, 1],
                    [1, 1], 1)
    tol = 2e-2 if dtype == np.float16 else 1e-12
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def _frozen(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def test_filter_layout_cache_is_never_stale():
    x = rand(1, 4, 8, 8)
    w1, b1 = _frozen(rand(6, 4, 3, 3)), _frozen(rand(6))
    want1 = _general(x, w1, b1.copy(), [1, 1, 1, 1], [1, 1], [1, 1], 1)
    np.testing.assert_allclose(conv_mod.conv(x, w1, b1, pads=[1, 1, 1, 1]), want1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(conv_mod.conv(x, w1, b1, pads=[1, 1, 1, 1]), want1, rtol=1e-5, atol=1e-5)
    # same filter without bias, and as a grouped filter: other layouts
    want1nb = _general(x, w1, None, [1, 1, 1, 1], [1, 1], [1, 1], 1)
    np.testing.assert_allclose(conv_mod.conv(x, w1, None, pads=[1, 1, 1, 1]), want1nb, rtol=1e-5, atol=1e-5)
    # new frozen arrays (possibly at recycled ids) get their own layout
    for _ in range(5):
        del w1, b1
        gc.collect()
        w1, b1 = _frozen(rand(6, 4, 3, 3)), _frozen(rand(6))
        want = _general(x, w1, b1.copy(), [1, 1, 1, 1], [1, 1], [1, 1], 1)
        np.testing.assert_allclose(conv_mod.conv(x, w1, b1, pads=[1, 1, 1, 1]), want, rtol=1e-5, atol=1e-5)
    # writeable filters are never cached: changing them in place changes the result
    w2, b2 = rand(6, 4, 3, 3), rand(6)
    conv_mod.conv(x, w2, b2, pads=[1, 1, 1, 1])
    w2 *= 2
    b2 += 1
    want2 = _general(x, w2, b2.copy(), [1, 1, 1, 1], [1, 1], [1, 1], 1)
    np.testing.assert_allclose(conv_mod.conv(x, w2, b2, pads=[1, 1, 1, 1]), want2, rtol=1e-5, atol=1e-5)
    # a read-only view of a writeable array is not a constant either
    w3 = rand(6, 4, 3, 3)
    v3 = w3.view()
    v3.flags.writeable = False
    conv_mod.conv(x, v3, None, pads=[1, 1, 1, 1])
    w3[...] = 0
    assert not np.any(conv_mod.conv(x, v3, None, pads=[1, 1, 1, 1]))


@pytest.mark.parametrize("xs,attrs", [
    ((1, 5, 23, 21), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ((2, 3, 16, 17), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 4, 12, 13), {"kernel_shape": [3, 2], "strides": [1, 1], "pads": [1, 0, 1, 1]}),
    ((1, 4, 12, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 4, 14, 13), {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 1, 0, 2]}),
    ((1, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((1, 2, 7, 8, 6), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 0, 0, 1, 1]}),
])
def test_pool_pairwise_reductions_vs_ort(xs, attrs):
    x = rand(*xs)
    _check("MaxPool", [x], attrs, opset=12 if "dilations" in attrs else 11)
    avg = {k: v for k, v in attrs.items() if k != "dilations"}
    if "dilations" not in attrs:
        _check("AveragePool", [x], avg, opset=11)
        _check("AveragePool", [x], dict(avg, count_include_pad=1), opset=11)


# ------------------------------------------------------------------ banded depthwise GEMMs, GEMM average pooling


def _naive_depthwise(x, w, b, pads, strides, dilations):
    """Direct sum over the kernel taps in float64 (independent of every onnxpy path)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, G, H, W = x.shape
    M, _, KH, KW = w.shape
    Mg = M // G
    (pt, pl, pd, pr), (sh, sw), (dh, dw) = pads, strides, dilations
    xp = np.zeros((N, G, H + pt + pd, W + pl + pr))
    xp[:, :, pt:pt + H, pl:pl + W] = x
    Ho = (H + pt + pd - (KH - 1) * dh - 1) // sh + 1
    Wo = (W + pl + pr - (KW - 1) * dw - 1) // sw + 1
    out = np.zeros((N, G, Mg, Ho, Wo))
    wg = w.reshape(G, Mg, KH, KW)
    for i in range(KH):
        for j in range(KW):
            src = xp[:, :, None, i * dh:i * dh + (Ho - 1) * sh + 1:sh, j * dw:j * dw + (Wo - 1) * sw + 1:sw]
            out += src * wg[None, :, :, i, j, None, None]
    out = out.reshape(N, M, Ho, Wo)
    if b is not None:
        out += np.asarray(b, dtype=np.float64).reshape(1, M, 1, 1)
    return out


DW_CASES = [
    # (x shape, multiplier, kernel, attrs)
    ((1, 6, 12, 20), 1, (5, 5), {"pads": [2, 2, 2, 2]}),  # one tile, bias folded
    ((2, 5, 30, 17), 1, (3, 3), {"pads": [1, 1, 1, 1]}),  # tiles, Ho % rows != 0, batch 2
    ((1, 4, 13, 11), 2, (3, 3), {"pads": [1, 1, 1, 1]}),  # channel multiplier, tiles
    ((1, 4, 9, 11), 3, (3, 5), {"pads": [1, 2, 1, 2], "strides": [2, 1]}),  # multiplier, H stride
    ((1, 6, 12, 19), 1, (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),  # column phases
    ((1, 6, 28, 28), 1, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # phases and tiles
    ((1, 5, 12, 21), 1, (3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2]}),  # W stride only
    ((1, 5, 15, 17), 1, (5, 4), {"pads": [2, 1, 0, 3], "strides": [1, 3], "dilations": [1, 2]}),
    ((1, 4, 9, 17), 1, (3, 5), {"pads": [1, 0, 1, 6], "strides": [1, 4]}),  # stride > kernel columns used
    ((2, 4, 10, 6), 2, (4, 2), {"pads": [1, 0, 3, 3], "strides": [2, 1], "dilations": [2, 3]}),
    ((1, 4, 7, 9), 1, (3, 3), {"pads": [3, 5, 2, 4]}),  # pads wider than the kernel
    ((1, 4, 7, 9), 1, (3, 3), {"pads": [0, 3, 2, 0]}),  # asymmetric pads, no same-size column
    ((1, 4, 7, 9), 1, (3, 3), {"strides": [3, 1]}),  # no pads, input rows left over
    ((1, 3, 2, 6), 1, (5, 5), {"pads": [2, 2, 2, 2]}),  # image shorter than the kernel
    ((1, 3, 1, 6), 1, (5, 5), {"pads": [2, 2, 2, 2]}),
    ((1, 4, 9, 9), 1, (3, 3), {"pads": [16, 16, 16, 16], "dilations": [16, 16]}),  # mostly-zero band: other paths
    ((1, 4, 20, 9), 1, (1, 3), {"pads": [0, 1, 0, 1]}),  # 1-row kernel
    ((1, 4, 12, 9), 1, (3, 3), {"pads": [6, 6, 6, 6], "dilations": [6, 6]}),  # tall band
]


@pytest.mark.parametrize("frozen_w", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs,mult,ks,attrs", DW_CASES)
def test_depthwise_band_vs_direct_sum(xs, mult, ks, attrs, bias, frozen_w):
    G = xs[1]
    x, w = rand(*xs), rand(G * mult, 1, *ks)
    b = rand(G * mult) if bias else None
    if frozen_w:
        w = _frozen(w)
        b = None if b is None else _frozen(b)
    pads = attrs.get("pads", [0, 0, 0, 0])
    want = _naive_depthwise(x, w, b, pads, attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1]))
    for _ in range(2):  # second call: cached band matrices
        got = conv_mod.conv(x, w, b, group=G, **attrs)
        assert got.dtype == np.float32 and got.flags.c_contiguous and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the un-biased general entry (ConvInteger / QLinearConv use it) takes the same path
    n = 2
    got = conv_mod._conv_core(x, w, list(pads[:n]), list(pads[n:]), list(attrs.get("strides", [1, 1])),
                              list(attrs.get("dilations", [1, 1])), G, "Conv")
    want_nb = want - (0 if b is None else b.reshape(1, -1, 1, 1))
    np.testing.assert_allclose(got, want_nb, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,mult,ks,attrs", DW_CASES[:8])
def test_depthwise_band_vs_ort(xs, mult, ks, attrs):
    G = xs[1]
    _check("Conv", [rand(*xs), Init(rand(G * mult, 1, *ks)), Init(rand(G * mult))], dict(attrs, group=G), opset=11)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_depthwise_band_dtypes(dtype):
    x, w, b = rand(2, 6, 14, 11, dtype=dtype), rand(6, 1, 3, 3, dtype=dtype), rand(6, dtype=dtype)
    for attrs in ({"pads": [1, 1, 1, 1]}, {"pads": [1, 1, 1, 1], "strides": [2, 2]}):
        got = conv_mod.conv(x, w, b, group=6, **attrs)
        assert got.dtype == dtype
        want = _naive_depthwise(x, w, b, attrs["pads"], attrs.get("strides", [1, 1]), [1, 1])
        tol = 2e-2 if dtype == np.float16 else 1e-12
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def test_depthwise_band_small_channel_blocks(monkeypatch):
    """Channel blocks of the banded path (forced to one channel each) give the same result."""
    monkeypatch.setattr(conv_mod, "_DW_BAND_BLOCK", 1)
    x, w, b = rand(2, 5, 17, 12), rand(10, 1, 3, 3), rand(10)
    for attrs in ({"pads": [1, 1, 1, 1]}, {"pads": [1, 2, 1, 0], "strides": [2, 2]}):
        want = _naive_depthwise(x, w, b, attrs["pads"], attrs.get("strides", [1, 1]), [1, 1])
        np.testing.assert_allclose(conv_mod.conv(x, w, b, group=5, **attrs), want, rtol=1e-4, atol=1e-4)


def test_depthwise_band_cache_is_never_stale():
    x = rand(1, 4, 9, 10)
    for _ in range(4):
        w, b = _frozen(rand(4, 1, 3, 3)), _frozen(rand(4))
        want = _naive_depthwise(x, w, b, [1, 1, 1, 1], [1, 1], [1, 1])
        np.testing.assert_allclose(conv_mod.conv(x, w, b, group=4, pads=[1, 1, 1, 1]), want, rtol=1e-4, atol=1e-4)
        del w, b
        gc.collect()
    w2 = rand(4, 1, 3, 3)
    conv_mod.conv(x, w2, None, group=4, pads=[1, 1, 1, 1])
    w2 *= -3
    want = _naive_depthwise(x, w2, None, [1, 1, 1, 1], [1, 1], [1, 1])
    np.testing.assert_allclose(conv_mod.conv(x, w2, None, group=4, pads=[1, 1, 1, 1]), want, rtol=1e-4, atol=1e-4)


AVG_CASES = [
    ((1, 6, 14, 14), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 3, 7, 7), {"kernel_shape": [7, 7]}),  # whole image: one output
    ((1, 4, 3, 20), {"kernel_shape": [3, 2], "strides": [3, 2]}),  # one output row
    ((1, 4, 1, 20), {"kernel_shape": [1, 3], "strides": [1, 2], "pads": [0, 1, 0, 1]}),  # one input row
    ((1, 3, 12, 13), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 3, 12, 13), {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 0, 2]}),
    ((1, 3, 11, 9), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("xs,attrs", AVG_CASES)
def test_avgpool_gemm_vs_ort(xs, attrs, include_pad):
    _check("AveragePool", [rand(*xs)], dict(attrs, count_include_pad=include_pad), opset=11)


def test_avgpool_gemm_dilations_and_dtypes():
    from onnxpy.ops import pool as pool_mod

    x = rand(2, 3, 13, 12, dtype=np.float64)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "dilations": [2, 3], "pads": [2, 1, 1, 2]}
    for include_pad in (0, 1):
        ks, st, dl, pb, pe, out = pool_mod._pool_geometry(x, attrs["kernel_shape"], attrs["strides"],
                                                          attrs["dilations"], attrs["pads"], "NOTSET", 0, "AvgPool")
        sums = pool_mod._reduce_windows(pool_mod._padded(x, ks, st, dl, pb, pe, out, 0), ks, st, dl, out, "sum")
        want = sums / pool_mod._counts(x.shape[2:], ks, st, dl, pb, pe, out, bool(include_pad), np.float64)
        got = pool_mod.average_pool(x, count_include_pad=include_pad, **attrs)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        got16 = pool_mod.average_pool(x.astype(np.float16), count_include_pad=include_pad, **attrs)
        assert got16.dtype == np.float16
        np.testing.assert_allclose(got16.astype(np.float64), want, rtol=1e-2, atol=1e-2)


def test_avgpool_gemm_non_finite_inputs():
    """An inf/NaN outside every window (or inside some) gives exactly the direct path's result."""
    from onnxpy.ops import pool as pool_mod

    x = rand(1, 2, 9, 9)
    x[0, 0, 4, 4] = np.inf
    x[0, 1, 8, 8] = np.nan  # outside every window of the stride-3 pooling below
    x[0, 1, 0, 0] = -np.inf
    for attrs in ({"kernel_shape": [2, 2], "strides": [3, 3]}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}):
        got = pool_mod.average_pool(x, **attrs)
        ks, st, dl, pb, pe, out = pool_mod._pool_geometry(x, attrs["kernel_shape"], attrs.get("strides"), None,
                                                          attrs.get("pads"), "NOTSET", 0, "AvgPool")
        sums = pool_mod._reduce_windows(pool_mod._padded(x, ks, st, dl, pb, pe, out, 0), ks, st, dl, out, "sum")
        want = sums / pool_mod._counts(x.shape[2:], ks, st, dl, pb, pe, out, False, np.float32)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("xs", [(1, 20, 2, 96), (2, 3, 130, 70), (2, 3, 5), (1, 4, 2, 3, 5), (0, 3, 4, 4), (2, 0, 3)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_global_average_pool_paths(xs, dtype):
    from onnxpy.ops import pool as pool_mod

    x = rand(*xs, dtype=dtype)
    got = pool_mod.global_average_pool(x)
    want = x.astype(np.float64).mean(axis=tuple(range(2, x.ndim)), keepdims=True)
    assert got.dtype == dtype and got.shape == want.shape
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
    got_nc = pool_mod.global_average_pool(np.swapaxes(x, 0, 1).copy().swapaxes(0, 1))  # non-contiguous input
    np.testing.assert_allclose(got_nc.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", [(1, 16, 120, 140), (3, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hard_swish_blocked(shape, dtype):
    from onnxpy.ops.internal import hard_swish_like

    x = (rand(*shape) * 4).astype(dtype)
    want = x * np.clip(x * dtype(1 / 6) + dtype(0.5), dtype(0), dtype(1))
    got = hard_swish_like(x, add=3.0, lo=0.0, hi=6.0, scale=6.0, scale_op="Div")
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("xs,mult,ks,attrs", DW_CASES)
def test_depthwise_band_layouts_vs_direct_sum(xs, mult, ks, attrs, monkeypatch):
    """The banded path (row tiles side by side) against the float64 direct sum, with frozen (cached band matrices)
    and writeable filters, and with channel blocks of one channel."""
    G = xs[1]
    x, w, b = rand(*xs), rand(G * mult, 1, *ks), rand(G * mult)
    pads, strides, dil = attrs.get("pads", [0, 0, 0, 0]), attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    want = _naive_depthwise(x, w, b, pads, strides, dil)
    for wk, bk in ((w, b), (_frozen(w), _frozen(b))):
        for _ in range(2):  # second call: cached band matrices
            np.testing.assert_allclose(conv_mod.conv(x, wk, bk, group=G, **attrs), want, rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(conv_mod, "_DW_BAND_BLOCK", 1)
    np.testing.assert_allclose(conv_mod.conv(x, w, None, group=G, **attrs), want - b.reshape(1, -1, 1, 1),
                               rtol=1e-4, atol=1e-4)


MAXPOOL_W3S2_CASES = [
    ((1, 4, 11, 11), {"kernel_shape": [3, 3], "strides": [2, 2]}),  # no pads, odd width
    ((2, 3, 12, 12), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # left pad column
    ((1, 3, 13, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),  # last window past the edge
    ((1, 3, 9, 14), {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [1, 0, 0, 1]}),  # top pad rows
    ((1, 3, 9, 14), {"kernel_shape": [4, 3], "strides": [3, 2], "pads": [2, 1, 2, 1]}),  # rows without full taps
    ((1, 2, 5, 6), {"kernel_shape": [1, 3], "strides": [1, 2], "pads": [0, 1, 0, 0]}),  # one-row kernel
    ((1, 2, 3, 4), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # tiny image
]


@pytest.mark.parametrize("xs,attrs", MAXPOOL_W3S2_CASES)
def test_maxpool_w3s2_vs_ort(xs, attrs):
    _check("MaxPool", [rand(*xs)], attrs, opset=12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.uint8])
@pytest.mark.parametrize("xs,attrs", MAXPOOL_W3S2_CASES)
def test_maxpool_w3s2_vs_general(xs, attrs, dtype, monkeypatch):
    from onnxpy.ops import pool as pool_mod
    x = (RNG.standard_normal(xs) * 50).astype(dtype)
    if dtype == np.float32:
        x.flat[::7] = np.nan
    got = pool_mod.max_pool(x, **attrs)
    monkeypatch.setattr(pool_mod, "_MAXPOOL_W3S2", False)
    want = pool_mod.max_pool(x, **attrs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    monkeypatch.setattr(pool_mod, "_MAXPOOL_W3S2", True)
    monkeypatch.setattr(pool_mod, "_MAXPOOL_BLOCK_BYTES", 1)  # one channel per block
    np.testing.assert_array_equal(pool_mod.max_pool(x, **attrs), want)


# ------------------------------------------------- channels-last sum of products (small planes, many channels)
SOP_CASES = [
    # (x shape, kernel, attrs): output planes <= 196 with at least as many channels (half as many when strided)
    ((1, 200, 14, 14), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 64, 7, 7), (3, 3), {"pads": [1, 1, 1, 1]}),  # batch 2
    ((1, 120, 14, 14), (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ((1, 100, 28, 28), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # 196 outputs, strided
    ((1, 72, 9, 8), (3, 2), {"pads": [2, 0, 1, 1], "dilations": [2, 1]}),  # asymmetric pads, dilation
    ((1, 80, 11, 13), (3, 3), {"strides": [1, 2]}),  # no pads, one strided axis
    ((1, 128, 8, 10), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [1, 2]}),  # dilated columns
    ((1, 96, 12, 12), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}),  # strided rows, stride-1 columns
]


@pytest.mark.parametrize("wide", [True, False])  # stride-1 columns: merged (column, channel) rows or not
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs,ks,attrs", SOP_CASES)
def test_depthwise_sum_of_products(xs, ks, attrs, bias, dtype, wide, monkeypatch):
    monkeypatch.setattr(conv_mod, "_DW_SOP_WIDE", wide)
    calls = []
    orig = conv_mod._depthwise2d_sop
    monkeypatch.setattr(conv_mod, "_depthwise2d_sop", lambda *a, **k: calls.append(1) or orig(*a, **k))
    C = xs[1]
    x, w = rand(*xs, dtype=dtype), _frozen(rand(C, 1, *ks, dtype=dtype))
    b = _frozen(rand(C, dtype=dtype)) if bias else None
    pads, st, dl = attrs.get("pads", [0, 0, 0, 0]), attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    want = _naive_depthwise(x, w, b, pads, st, dl)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    for _ in range(2):  # second call: the cached channels-last filter
        got = conv_mod.conv(x, w, b, group=C, **attrs)
        assert got.dtype == dtype and got.flags.c_contiguous and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert calls
    # into a given output (a concatenation's channel range) and accumulated into one (a residual)
    fast = functools.partial(conv_mod._conv2d_fast, x, w, b, pads[:2], pads[2:], st, dl, C, (w, b))
    out = np.full(want.shape, 7, dtype)
    assert fast(out=out) is out
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)
    z = rand(*want.shape, dtype=dtype)
    res = fast(out=z.copy(), acc=True)
    np.testing.assert_allclose(res, want + z, rtol=tol, atol=tol)
    _check("Conv", [x.astype(np.float32), Init(w.astype(np.float32))] + ([Init(b.astype(np.float32))] if bias else []),
           dict(attrs, group=C), opset=11)


def test_depthwise_sum_of_products_declines():
    """Planes larger than the channel count, channel multipliers and kernels taller than the output take the other
    paths (where they are faster)."""
    for xs, m, ks, attrs in [((1, 100, 14, 14), 1, (3, 3), {"pads": [1, 1, 1, 1]}),
                             ((1, 200, 14, 14), 2, (3, 3), {"pads": [1, 1, 1, 1]}),
                             ((1, 200, 2, 96), 1, (5, 5), {"pads": [2, 2, 2, 2]})]:
        C = xs[1]
        x, w = rand(*xs), rand(C * m, 1, *ks)
        orig = conv_mod._depthwise2d_sop
        try:
            conv_mod._depthwise2d_sop = None  # would raise if called
            got = conv_mod.conv(x, w, None, group=C, **attrs)
        finally:
            conv_mod._depthwise2d_sop = orig
        np.testing.assert_allclose(got, _naive_depthwise(x, w, None, attrs["pads"], [1, 1], [1, 1]), rtol=1e-4,
                                   atol=1e-4)


# ------------------------------------------------------- large-plane depthwise through BLAS saxpy (one per tap)
AXPY_CASES = [
    # (x shape, kernel, attrs): per-channel outputs above the threshold once it is lowered to 0 below
    ((1, 5, 40, 36), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 33, 31), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # odd sizes, batch 2
    ((1, 4, 30, 28), (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ((1, 6, 25, 27), (3, 3), {"pads": [2, 0, 1, 2], "dilations": [2, 1]}),  # asymmetric pads, dilation
    ((1, 3, 24, 24), (3, 2), {"strides": [2, 2], "dilations": [1, 2]}),  # no pads, dilated columns
    ((1, 7, 20, 22), (1, 3), {"pads": [0, 1, 0, 1]}),
]


@pytest.mark.parametrize("block", [1 << 19, 1])  # all channels in one block, or one channel per block
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xs,ks,attrs", AXPY_CASES)
def test_depthwise_axpy(xs, ks, attrs, bias, block, monkeypatch):
    from onnxpy.ops import _blas
    if _blas.axpy_function() is None:
        pytest.skip("no cblas_saxpy in numpy's BLAS")
    monkeypatch.setattr(conv_mod, "_DW_AXPY_MIN", 0)
    monkeypatch.setattr(conv_mod, "_DW_AXPY_BLOCK_BYTES", block)
    calls = []
    orig = conv_mod._depthwise2d_axpy
    monkeypatch.setattr(conv_mod, "_depthwise2d_axpy", lambda *a, **k: calls.append(1) or orig(*a, **k))
    C = xs[1]
    x, w = rand(*xs), _frozen(rand(C, 1, *ks))
    b = _frozen(rand(C)) if bias else None
    pads, st, dl = attrs.get("pads", [0, 0, 0, 0]), attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    want = _naive_depthwise(x, w, b, pads, st, dl)
    got = conv_mod.conv(x, w, b, group=C, **attrs)
    assert calls and got.dtype == np.float32 and got.flags.c_contiguous and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    fast = functools.partial(conv_mod._conv2d_fast, x, w, b, pads[:2], pads[2:], st, dl, C, (w, b))
    z = rand(*want.shape)
    np.testing.assert_allclose(fast(out=z.copy(), acc=True), want + z, rtol=1e-5, atol=1e-5)
    _check("Conv", [x, Init(w)] + ([Init(b)] if bias else []), dict(attrs, group=C), opset=11)


def test_depthwise_axpy_declines():
    """Channel multipliers, unequal or larger strides, float64 and small planes take the other paths."""
    from onnxpy.ops import _blas
    if _blas.axpy_function() is None:
        pytest.skip("no cblas_saxpy in numpy's BLAS")
    big = (1, 2, 130, 130)
    cases = [(rand(*big), 2, (3, 3), {"pads": [1, 1, 1, 1]}),
             (rand(*big), 1, (3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2]}),
             (rand(*big), 1, (3, 3), {"pads": [1, 1, 1, 1], "strides": [3, 3]}),
             (rand(*big, dtype=np.float64), 1, (3, 3), {"pads": [1, 1, 1, 1]}),
             (rand(1, 8, 60, 60), 1, (3, 3), {"pads": [1, 1, 1, 1]})]
    orig = conv_mod._depthwise2d_axpy
    try:
        conv_mod._depthwise2d_axpy = None  # would raise if called
        for x, m, ks, attrs in cases:
            C = x.shape[1]
            w = rand(C * m, 1, *ks, dtype=x.dtype)
            got = conv_mod.conv(x, w, None, group=C, **attrs)
            want = _naive_depthwise(x, w, None, attrs["pads"], attrs.get("strides", [1, 1]), [1, 1])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    finally:
        conv_mod._depthwise2d_axpy = orig
    # and a large float32 plane takes it
    calls = []
    conv_mod._depthwise2d_axpy = lambda *a, **k: calls.append(1) or orig(*a, **k)
    try:
        x, w = rand(*big), rand(2, 1, 3, 3)
        np.testing.assert_allclose(conv_mod.conv(x, w, None, group=2, pads=[1, 1, 1, 1]),
                                   _naive_depthwise(x, w, None, [1, 1, 1, 1], [1, 1], [1, 1]), rtol=1e-4, atol=1e-4)
    finally:
        conv_mod._depthwise2d_axpy = orig
    assert calls


@pytest.mark.parametrize("shape", [(1, 8, 32, 32), (2, 3, 7, 9), (1, 5, 8, 6), (1, 2, 2, 4), (1, 3, 5, 4),
                                   (2, 3, 9, 8)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("block", [1 << 19, 1])
@pytest.mark.parametrize("columns_first", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_maxpool_2x2_stride2(shape, dtype, block, columns_first, split, monkeypatch):
    """Both pass orders, channel blocks of one channel or many, channels split between two threads or not: the
    strided passes' results bit for bit."""
    x = (np.random.default_rng(7).standard_normal(shape) * 100).astype(dtype)
    if dtype == np.float32:
        x.flat[::13] = np.nan
        x.flat[5::17] = -np.inf
    monkeypatch.setattr(pool_mod, "_MAXPOOL_2X2_BLOCK_BYTES", block)
    monkeypatch.setattr(pool_mod, "_MAXPOOL_HFIRST_BYTES", 0 if columns_first else 1 << 40)
    monkeypatch.setattr(pool_mod, "_POOL_SPLIT_BYTES", 0 if split else 1 << 40)
    shared = []
    orig_shared = _packed._run_shared
    monkeypatch.setattr(_packed, "_run_shared",
                        lambda fn, parts, *rest: shared.append(len(parts)) or orig_shared(fn, parts, *rest))
    calls = []
    orig = pool_mod._max_pool_2x2s2
    monkeypatch.setattr(pool_mod, "_max_pool_2x2s2", lambda *a: calls.append(1) or orig(*a))
    first = []
    orig_first = pool_mod._max_pool_2x2s2_columns_first
    monkeypatch.setattr(pool_mod, "_max_pool_2x2s2_columns_first", lambda *a: first.append(1) or orig_first(*a))
    got = pool_mod.max_pool(x, kernel_shape=[2, 2], strides=[2, 2])
    assert calls and bool(first) == (columns_first and shape[3] % 2 == 0)
    assert shared == ([2] if split and _packed._blas_threads() >= 2 and _packed.available() else [])
    monkeypatch.setattr(pool_mod, "_MAXPOOL_2X2", False)
    want = pool_mod.max_pool(x, kernel_shape=[2, 2], strides=[2, 2])
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if dtype == np.float32:  # (onnxruntime's MaxPool does not propagate NaN; numpy's maximum, both paths here, does)
        _check("MaxPool", [np.nan_to_num(x, nan=0.0)], {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=12)


def test_depthwise_axpy_zero_coefficient_keeps_nan(monkeypatch):
    """A zero filter coefficient against an inf input gives NaN (0 * inf) as in every other path: such filters
    leave the saxpy path (BLAS skips a zero multiplier)."""
    from onnxpy.ops import _blas
    if _blas.axpy_function() is None:
        pytest.skip("no cblas_saxpy in numpy's BLAS")
    monkeypatch.setattr(conv_mod, "_DW_AXPY_MIN", 0)
    x = rand(1, 3, 20, 20)
    x[0, 1, 5, 5] = np.inf
    w = rand(3, 1, 3, 3)
    w[1, 0, 1, 1] = 0.0
    calls = []
    orig = conv_mod._depthwise2d_axpy
    monkeypatch.setattr(conv_mod, "_depthwise2d_axpy", lambda *a, **k: calls.append(1) or orig(*a, **k))
    with np.errstate(invalid="ignore"):
        got = conv_mod.conv(x, w, None, group=3, pads=[1, 1, 1, 1])
        want = _naive_depthwise(x, w, None, [1, 1, 1, 1], [1, 1], [1, 1])
    assert not calls and np.isnan(got[0, 1, 5, 5]) and np.isnan(want[0, 1, 5, 5])
    w[1, 0, 1, 1] = 0.5  # no zero: the saxpy path, inf propagated
    got = conv_mod.conv(x, w, None, group=3, pads=[1, 1, 1, 1])
    assert calls and np.isinf(got[0, 1, 5, 5])


def test_strided_view_matches_as_strided():
    from numpy.lib.stride_tricks import as_strided

    from onnxpy.ops._spatial import strided_view
    x = rand(2, 3, 9, 10)
    s = x.strides
    shape, strides = (2, 3, 7, 8, 3, 3), (s[0], s[1], s[2], s[3], s[2], s[3])
    for src in (x, x[:, :, ::2], np.asfortranarray(x), x[:, 1:]):  # contiguous, strided, Fortran, offset view
        st = src.strides
        sh, stv = (2, src.shape[1], 2, 3, 2, 2), (st[0], st[1], st[2], st[3], st[2], st[3])
        v = strided_view(src, sh, stv)
        np.testing.assert_array_equal(v, as_strided(src, sh, stv))
        assert not v.flags.writeable and np.shares_memory(v, src)
    v = strided_view(x, shape, strides)
    np.testing.assert_array_equal(v, as_strided(x, shape, strides))
    assert not v.flags.writeable
