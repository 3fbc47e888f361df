"""The fast 2-D Conv paths (bias folded into the GEMM, strided/polyphase im2col, shifted GEMMs, pointwise,
depthwise with fused crop + bias), the filter-layout cache and the pairwise pooling reductions, against onnxruntime
and against onnxpy's general N-D path."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import helper

from _oracle import Init, assert_outputs_close, infer_output_types, run_onnxpy, run_ort, single_node
from onnxpy.ops import conv as conv_mod

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
