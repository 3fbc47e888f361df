"""Convolution, pooling, resampling and detection kernels against onnxruntime (single-node models) and numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import onnxpy
from _oracle import Init, assert_outputs_close, infer_output_types, run_onnxpy, run_ort, single_node

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(1234)


def _model(op, inputs, n_out, opset, attrs, out_types=None):
    out_infos = [helper.make_tensor_value_info(f"out{j}", 0, None) for j in range(n_out)]
    m, feeds = single_node(op, inputs, n_out, opsets=[("", opset)], out_infos=out_infos,
                           ir_version=10 if opset < 23 else 11, **attrs)
    infer_output_types(m, out_types or [None] * n_out)
    return m.SerializeToString(), feeds


def run_both(op, inputs, attrs=None, opset=19, n_out=1, out_types=None):
    data, feeds = _model(op, inputs, n_out, opset, attrs or {}, out_types)
    return run_onnxpy(data, feeds), run_ort(data, feeds)


def check(op, inputs, attrs=None, opset=19, n_out=1, rtol=1e-4, atol=1e-5, out_types=None):
    got, want = run_both(op, inputs, attrs, opset, n_out, out_types)
    assert_outputs_close(got, want, rtol, atol)
    return got


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------------------------------------------ Conv


@pytest.mark.parametrize("xs,ws,attrs", [
    ((2, 4, 9, 9), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 4, 10, 11), (6, 2, 3, 2), {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 2, 0]}),
    ((1, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 4, 8, 8), (8, 1, 3, 3), {"group": 4, "strides": [2, 2], "auto_pad": "SAME_UPPER"}),  # multiplier 2
    ((2, 8, 7, 7), (5, 8, 1, 1), {}),  # 1x1
    ((1, 8, 7, 7), (5, 8, 1, 1), {"strides": [2, 2]}),
    ((1, 3, 7, 8), (4, 3, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 3, 7, 8), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 3]}),
    ((2, 3, 20), (4, 3, 5), {"pads": [2, 1], "dilations": [2]}),  # 1-D
    ((1, 2, 5, 6, 7), (3, 2, 3, 2, 3), {"pads": [1, 0, 1, 1, 1, 0], "strides": [1, 2, 1]}),  # 3-D
    ((0, 3, 5, 5), (4, 3, 3, 3), {}),  # empty batch
])
def test_conv(xs, ws, attrs):
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    check("Conv", [x, Init(w), Init(b)], attrs, opset=11, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_conv_dtypes(dtype):
    x, w = rand(1, 3, 6, 6, dtype=dtype), rand(4, 3, 3, 3, dtype=dtype)
    data, feeds = _model("Conv", [x, Init(w)], 1, 11, {"pads": [1, 1, 1, 1]})
    got = onnxpy.InferenceSession(data).run(None, feeds)[0]
    assert got.dtype == dtype
    _, want = run_both("Conv", [x.astype(np.float32), Init(w.astype(np.float32))], {"pads": [1, 1, 1, 1]}, 11)
    tol = 1e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float32), want[0], rtol=tol, atol=tol)


def test_conv_errors():
    data, feeds = _model("Conv", [rand(1, 3, 5, 5), Init(rand(4, 2, 3, 3))], 1, 11, {})
    with pytest.raises(Exception, match="channels"):
        onnxpy.InferenceSession(data).run(None, feeds)


@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 3, 4, 5), (3, 2, 3, 3), {}),
    ((2, 4, 3, 3), (4, 3, 3, 3), {"group": 2, "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": [3, 2], "output_padding": [1, 1]}),
    ((1, 2, 3, 4), (2, 3, 2, 2), {"dilations": [2, 2], "strides": [2, 2]}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [7, 8]}),
    ((1, 2, 3, 3), (2, 3, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 5), (2, 3, 4), {"strides": [3]}),
    ((1, 2, 2, 3, 3), (2, 1, 2, 2, 2), {"strides": [2, 1, 2]}),
    ((1, 4, 5, 5), (4, 2, 1, 1), {}),
    # kernel == stride (non-overlapping tiles, PP-OCR's 2x2 upsampling): the tiles path
    ((1, 6, 8, 8), (6, 6, 2, 2), {"strides": [2, 2]}),
    ((2, 3, 5, 7), (3, 4, 3, 2), {"strides": [3, 2]}),
    ((1, 5, 4, 4), (5, 1, 2, 2), {"strides": [2, 2], "auto_pad": "VALID"}),
    # kernel == stride but padded / output_padding / grouped: the general path
    ((1, 4, 4, 4), (4, 3, 2, 2), {"strides": [2, 2], "pads": [1, 0, 0, 1]}),
    ((1, 4, 4, 4), (4, 3, 2, 2), {"strides": [2, 2], "output_padding": [1, 1]}),
    ((1, 4, 4, 4), (4, 3, 2, 2), {"strides": [2, 2], "group": 2}),
])
def test_conv_transpose(xs, ws, attrs):
    x, w, b = rand(*xs), rand(*ws), rand(ws[1] * attrs.get("group", 1))
    check("ConvTranspose", [x, Init(w), Init(b)], attrs, opset=11, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xdt,wdt", [(np.uint8, np.uint8), (np.uint8, np.int8)])
def test_conv_integer(xdt, wdt):
    x = RNG.integers(0, 255, (1, 4, 7, 7)).astype(xdt)
    w = RNG.integers(np.iinfo(wdt).min, np.iinfo(wdt).max, (3, 4, 3, 3)).astype(wdt)
    check("ConvInteger", [x, Init(w), Init(np.array(7, xdt)), Init(np.array(3, wdt))],
          {"pads": [1, 1, 1, 1], "strides": [2, 1]}, opset=10)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("xdt", [np.uint8, np.int8])
def test_qlinear_conv(per_channel, xdt):
    M = 6
    x = RNG.integers(np.iinfo(xdt).min, np.iinfo(xdt).max, (2, 4, 8, 8)).astype(xdt)
    w = RNG.integers(-127, 127, (M, 2, 3, 3)).astype(np.int8)
    ws = (RNG.random(M) * 0.05 + 0.01).astype(np.float32) if per_channel else np.float32(0.02)
    wzp = np.zeros(M, np.int8) if per_channel else np.int8(0)
    b = RNG.integers(-2000, 2000, M).astype(np.int32)
    xzp = np.asarray(3 if xdt == np.uint8 else -2, xdt)
    inputs = [x, Init(np.float32(0.05)), Init(xzp), Init(w), Init(np.asarray(ws)), Init(np.asarray(wzp)),
              Init(np.float32(0.1)), Init(np.asarray(128 if xdt == np.uint8 else 5, xdt)), Init(b)]
    got, want = run_both("QLinearConv", inputs, {"group": 2, "pads": [1, 1, 1, 1]}, opset=10)
    assert got[0].dtype == want[0].dtype
    # rounding of exact .5 ties may differ by one unit in rare cases
    assert np.abs(got[0].astype(np.int32) - want[0].astype(np.int32)).max() <= 1
    assert (got[0] == want[0]).mean() > 0.99


def test_deform_conv_zero_offset_matches_conv():
    x, w = rand(1, 4, 6, 6), rand(6, 2, 3, 3)
    off = np.zeros((1, 2 * 9, 6, 6), np.float32)
    data, feeds = _model("DeformConv", [x, Init(w), off], 1, 19, {"group": 2, "pads": [1, 1, 1, 1]})
    got = onnxpy.InferenceSession(data).run(None, feeds)[0]
    want = check_conv_ref(x, w)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def check_conv_ref(x, w):
    data, feeds = _model("Conv", [x, Init(w)], 1, 11, {"group": 2, "pads": [1, 1, 1, 1]})
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_deform_conv_integer_offset_shifts():
    # an integer offset of +1 along W equals convolving the input shifted left by one (zeros entering)
    x, w = rand(1, 2, 5, 5), rand(3, 2, 1, 1)
    off = np.zeros((1, 2, 5, 5), np.float32)
    off[:, 1] = 1.0
    data, feeds = _model("DeformConv", [x, Init(w), off], 1, 19, {})
    got = onnxpy.InferenceSession(data).run(None, feeds)[0]
    xs = np.zeros_like(x)
    xs[..., :-1] = x[..., 1:]
    want = np.einsum("mc,nchw->nmhw", w[:, :, 0, 0], xs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_col2im_roundtrip_counts():
    # col2im of all-ones columns counts how many blocks cover each pixel
    img, blk = [5, 6], [2, 3]
    L = (5 - 2 + 1) * (6 - 3 + 1)
    cols = np.ones((1, 2 * 6, L), np.float32)
    data, feeds = _model("Col2Im", [cols, Init(np.array(img)), Init(np.array(blk))], 1, 18, {})
    got = onnxpy.InferenceSession(data).run(None, feeds)[0]
    cy = np.array([1, 2, 2, 2, 1])
    cx = np.array([1, 2, 3, 3, 2, 1])
    np.testing.assert_array_equal(got[0, 0], np.outer(cy, cx))


# --------------------------------------------------------------------------------------------------- Pooling


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 1, 1]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [2, 3], "strides": [1, 2], "storage_order": 1},
])
def test_maxpool_with_indices(attrs):
    x = rand(2, 3, 9, 10)
    check("MaxPool", [x], attrs, opset=12, n_out=2)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float16, np.float64])
def test_maxpool_dtypes(dtype):
    x = (RNG.integers(-100, 100, (1, 2, 7, 7)) if dtype != np.uint8 else RNG.integers(0, 255, (1, 2, 7, 7)))
    check("MaxPool", [x.astype(dtype)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, opset=12)


def test_maxpool_large_kernel_1d_3d():
    check("MaxPool", [rand(1, 2, 300)], {"kernel_shape": [100], "strides": [50]}, opset=12)
    check("MaxPool", [rand(1, 2, 5, 6, 7)], {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2]}, opset=12, n_out=2)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 0, 0]},
    {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 0, 0], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 0, 1, 1]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "count_include_pad": 1},
])
def test_average_pool(attrs):
    check("AveragePool", [rand(2, 3, 9, 10)], attrs, opset=19)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    check("LpPool", [rand(1, 3, 8, 9)], {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "p": p},
          opset=18)
    check("GlobalLpPool", [rand(2, 3, 5, 4)], {"p": p}, opset=2)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pools(op):
    check(op, [rand(2, 3, 5, 4)], opset=1)
    check(op, [rand(2, 3, 5, 4, 3)], opset=1)
    check(op, [rand(2, 3, 7)], opset=22)


def test_maxunpool_roundtrip():
    x = rand(1, 2, 6, 6)
    data, feeds = _model("MaxPool", [x], 2, 12, {"kernel_shape": [2, 2], "strides": [2, 2]})
    y, idx = onnxpy.InferenceSession(data).run(None, feeds)
    check("MaxUnpool", [y, idx], {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11)
    # output_shape larger than the default: indices address output_shape (onnxruntime behaviour)
    x = rand(1, 2, 5, 5)
    data, feeds = _model("MaxPool", [x], 2, 12, {"kernel_shape": [2, 2], "strides": [2, 2]})
    y, idx = onnxpy.InferenceSession(data).run(None, feeds)
    check("MaxUnpool", [y, idx, Init(np.array([1, 2, 5, 5]))], {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=11)


def _unpool(x, idx, out_shape, **attrs):
    data, feeds = _model("MaxUnpool", [x, idx, Init(np.array(out_shape))], 1, 11, attrs)
    return onnxpy.InferenceSession(data).run(None, feeds)[0]


def test_maxunpool_indices_of_the_implied_shape():
    # Indices that only fit their pooling windows when read against the implied 4x4 shape (the ONNX spec's
    # example) are decoded there and land in the leading corner of the larger output_shape.
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    got = _unpool(x, np.array([[[[5, 7], [13, 15]]]]), [1, 1, 5, 5], kernel_shape=[2, 2], strides=[2, 2])
    want = np.zeros((1, 1, 5, 5), np.float32)
    want[0, 0, 1, 1], want[0, 0, 1, 3], want[0, 0, 3, 1], want[0, 0, 3, 3] = 5, 6, 7, 8
    np.testing.assert_array_equal(got, want)
    # the same values with indices MaxPool computes on a 5x5 input: read against output_shape
    got = _unpool(x, np.array([[[[6, 8], [16, 18]]]]), [1, 1, 5, 5], kernel_shape=[2, 2], strides=[2, 2])
    np.testing.assert_array_equal(got, want)
    # indices that fit neither reading keep onnxruntime's (output_shape) reading
    got = _unpool(x, np.array([[[[0, 1], [2, 3]]]]), [1, 1, 5, 5], kernel_shape=[2, 2], strides=[2, 2])
    np.testing.assert_array_equal(got.reshape(-1)[:4], [5, 6, 7, 8])


@pytest.mark.parametrize("shape,pads", [((2, 3, 7, 6), [0, 0, 0, 0]), ((1, 2, 6, 7), [1, 1, 0, 0]),
                                        ((2, 2, 9), [1, 1])])
def test_maxunpool_after_maxpool_matches_onnxruntime(shape, pads):
    x = rand(*shape)
    nd = len(shape) - 2
    attrs = {"kernel_shape": [3] * nd, "strides": [2] * nd, "pads": pads}
    data, feeds = _model("MaxPool", [x], 2, 12, attrs)
    y, idx = onnxpy.InferenceSession(data).run(None, feeds)
    got = check("MaxUnpool", [y, idx, Init(np.array(shape))], attrs, opset=11)[0]
    # unpooling puts every pooled maximum back where it was
    np.testing.assert_array_equal(got.reshape(-1)[idx.reshape(-1)], y.reshape(-1))


# ----------------------------------------------------------------------------------------------------- Resize


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("sizes", [(7, 5), (3, 9)])
def test_resize_sizes(mode, ctm, sizes):
    x = rand(1, 2, 5, 6)
    check("Resize", [x, None, None, Init(np.array([1, 2, *sizes], np.int64))],
          {"mode": mode, "coordinate_transformation_mode": ctm}, opset=13, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("scales", [(1, 1, 2.0, 3.0), (1, 1, 0.5, 0.75), (1, 1, 1.7, 0.6)])
def test_resize_nearest_scales(nearest_mode, scales):
    x = rand(2, 3, 8, 8)
    check("Resize", [x, None, Init(np.array(scales, np.float32))],
          {"mode": "nearest", "nearest_mode": nearest_mode}, opset=13)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32])
def test_resize_dtypes(dtype):
    x = (RNG.random((1, 1, 6, 6)) * 100).astype(dtype)
    check("Resize", [x, None, Init(np.array([1, 1, 2.0, 1.5], np.float32))], {"mode": "nearest"}, opset=13)
    if dtype != np.int32:
        sizes = Init(np.array([1, 1, 9, 4], np.int64))
        got, want = run_both("Resize", [x, None, None, sizes], {"mode": "linear"}, opset=13)
        assert got[0].dtype == want[0].dtype
        assert np.abs(got[0].astype(int) - want[0].astype(int)).max() <= 1


def test_resize_float64():
    x = rand(1, 2, 5, 6, dtype=np.float64)
    data, feeds = _model("Resize", [x, None, Init(np.array([1, 1, 2.0, 0.5], np.float32))], 1, 13, {"mode": "linear"})
    got = onnxpy.InferenceSession(data).run(None, feeds)[0]
    _, want = run_both("Resize", [x.astype(np.float32), None, Init(np.array([1, 1, 2.0, 0.5], np.float32))],
                       {"mode": "linear"}, opset=13)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)


def test_resize_cubic_exclude_outside_and_a():
    x = rand(1, 1, 6, 7)
    check("Resize", [x, None, Init(np.array([1, 1, 1.5, 0.8], np.float32))],
          {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, opset=13)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(mode):
    x = rand(1, 2, 12, 13)
    check("Resize", [x, None, None, Init(np.array([5, 7], np.int64))],
          {"mode": mode, "antialias": 1, "axes": [2, 3]}, opset=18)
    check("Resize", [x, None, Init(np.array([0.4, 0.6], np.float32))],
          {"mode": mode, "antialias": 1, "axes": [-2, -1]}, opset=18)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect(policy):
    x = rand(1, 1, 6, 9)
    check("Resize", [x, None, None, Init(np.array([4, 4], np.int64))],
          {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": policy}, opset=18)


def test_resize_tf_crop_and_resize():
    x = rand(1, 1, 6, 6)
    roi = np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2], np.float32)
    for mode in ("linear", "nearest"):
        check("Resize", [x, Init(roi), None, Init(np.array([1, 1, 4, 5], np.int64))],
              {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 3.5},
              opset=13)


def test_resize_opset10_and_upsample():
    x = rand(1, 2, 4, 5)
    check("Resize", [x, Init(np.array([1, 1, 2, 1.5], np.float32))], {"mode": "nearest"}, opset=10)
    check("Resize", [x, Init(np.array([1, 1, 2, 1.5], np.float32))], {"mode": "linear"}, opset=10)
    check("Upsample", [x, Init(np.array([1, 1, 2, 3], np.float32))], {"mode": "nearest"}, opset=9)
    check("Upsample", [x, Init(np.array([1, 1, 2, 3], np.float32))], {"mode": "linear"}, opset=9)
    check("Upsample", [x], {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 2.0]}, opset=7)


def test_resize_opset11_empty_scales():
    x = rand(1, 2, 4, 5)
    check("Resize", [x, Init(np.zeros(0, np.float32)), Init(np.zeros(0, np.float32)),
                     Init(np.array([1, 2, 7, 3], np.int64))], {"mode": "linear"}, opset=11)


# ------------------------------------------------------------------------------------------------ GridSample


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample(mode, padding_mode, align_corners):
    x = rand(2, 3, 5, 6)
    grid = (RNG.random((2, 4, 7, 2)) * 2.6 - 1.3).astype(np.float32)
    check("GridSample", [x, grid], {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners},
          opset=16, rtol=1e-4, atol=1e-4)


def test_grid_sample_3d():
    x = rand(1, 2, 4, 5, 6)
    grid = (RNG.random((1, 3, 4, 2, 3)) * 2.4 - 1.2).astype(np.float32)
    for mode in ("linear", "nearest"):
        for pm in ("zeros", "border"):
            check("GridSample", [x, grid], {"mode": mode, "padding_mode": pm}, opset=20, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid_then_grid_sample_identity(align_corners):
    theta = np.tile(np.array([[1, 0, 0], [0, 1, 0]], np.float32), (2, 1, 1))
    data, feeds = _model("AffineGrid", [theta, Init(np.array([2, 3, 5, 6], np.int64))], 1, 20,
                         {"align_corners": align_corners})
    grid = onnxpy.InferenceSession(data).run(None, feeds)[0]
    assert grid.shape == (2, 5, 6, 2)
    x = rand(2, 3, 5, 6)
    data, feeds = _model("GridSample", [x, grid], 1, 20, {"align_corners": align_corners})
    y = onnxpy.InferenceSession(data).run(None, feeds)[0]
    np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------- Detection ops


@pytest.mark.parametrize("center", [0, 1])
def test_nms_random(center):
    B, C, S = 2, 3, 40
    xy = RNG.random((B, S, 2)) * 10
    wh = RNG.random((B, S, 2)) * 4 + 0.1
    if center:
        boxes = np.concatenate([xy, wh], axis=-1).astype(np.float32)
    else:
        boxes = np.concatenate([xy, xy + wh], axis=-1).astype(np.float32)
    scores = RNG.random((B, C, S)).astype(np.float32)
    check("NonMaxSuppression", [boxes, scores, Init(np.array([5], np.int64)), Init(np.array([0.3], np.float32)),
                                Init(np.array([0.2], np.float32))], {"center_point_box": center}, opset=11)
    check("NonMaxSuppression", [boxes, scores, Init(np.array([100], np.int64)), Init(np.array([0.5], np.float32))],
          {"center_point_box": center}, opset=11)


def test_nms_no_max_output():
    boxes = rand(1, 4, 4)
    scores = RNG.random((1, 1, 4)).astype(np.float32)
    got, _ = run_both("NonMaxSuppression", [boxes, scores], opset=11)
    assert got[0].shape == (0, 3) and got[0].dtype == np.int64


@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align(ctm, mode, sampling_ratio):
    x = rand(2, 3, 10, 12)
    rois = np.array([[0, 0, 9, 9], [1.5, 2.2, 7.3, 8.8], [-2, -1, 3, 4], [5, 5, 5.5, 5.2], [8, 6, 14, 13]],
                    np.float32)
    bi = np.array([0, 1, 0, 1, 1], np.int64)
    check("RoiAlign", [x, rois, bi], {"coordinate_transformation_mode": ctm, "mode": mode, "output_height": 3,
                                      "output_width": 4, "sampling_ratio": sampling_ratio, "spatial_scale": 0.9},
          opset=16, rtol=1e-4, atol=1e-5)


def test_max_roi_pool():
    x = rand(2, 3, 10, 12)
    rois = np.array([[0, 0, 0, 9, 9], [1, 1.5, 2.2, 7.3, 8.8], [0, -2, -1, 3, 4], [1, 5, 5, 5, 5]], np.float32)
    check("MaxRoiPool", [x, rois], {"pooled_shape": [3, 2], "spatial_scale": 0.75}, opset=1)


def test_resize_more_modes():
    x = rand(1, 2, 5, 6)
    check("Resize", [x, Init(np.zeros(0, np.float32)), Init(np.array([1, 1, 1.6, 2.5], np.float32))],
          {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}, opset=11)
    for mode in ("nearest", "linear", "cubic"):
        check("Resize", [x, None, Init(np.array([1, 1, 1.7, 0.7], np.float32))],
              {"mode": mode, "coordinate_transformation_mode": "half_pixel_symmetric"}, opset=19)
        if mode != "nearest":
            check("Resize", [x, None, Init(np.array([1.0, 1.0, 2.3, 3.0], np.float32))],
                  {"mode": mode, "antialias": 1}, opset=18)
    # trilinear on a 5-D tensor and nearest on every axis
    x5 = rand(1, 2, 3, 4, 5)
    check("Resize", [x5, None, None, Init(np.array([1, 2, 5, 3, 7], np.int64))], {"mode": "linear"}, opset=13)
    check("Resize", [x5, None, Init(np.array([2, 1.5, 1, 0.5, 2], np.float32))], {"mode": "nearest"}, opset=13)


def test_roi_align_opset10():
    x = rand(1, 2, 8, 8)
    rois = np.array([[0.5, 1.2, 6.3, 7.1], [2, 2, 3, 3]], np.float32)
    check("RoiAlign", [x, rois, np.zeros(2, np.int64)], {"output_height": 2, "output_width": 3}, opset=10)


def test_deform_conv_vs_ort():
    x, w = rand(2, 4, 7, 8), rand(6, 2, 3, 3)
    off = (RNG.random((2, 2 * 2 * 9, 4, 3)) * 4 - 2).astype(np.float32)
    mask = RNG.random((2, 2 * 9, 4, 3)).astype(np.float32)
    check("DeformConv", [x, Init(w), off, Init(rand(6)), mask],
          {"group": 2, "offset_group": 2, "pads": [1, 0, 1, 1], "strides": [2, 2], "dilations": [1, 2]}, opset=19)


@pytest.mark.parametrize("C,hw,k,pads,dil,st,dtype", [
    (128, (7, 9), 3, [1, 1, 1, 1], [1, 1], [1, 1], np.float32),
    (96, (6, 11), 5, [2, 1, 0, 3], [1, 2], [1, 1], np.float32),
    (160, (5, 5), 3, [0, 0, 0, 0], [2, 1], [1, 1], np.float64),
    (8, (17, 20), 3, [1, 1, 1, 1], [1, 1], [2, 2], np.float32),
    (6, (13, 11), 3, [0, 2, 1, 1], [2, 1], [3, 2], np.float64),
    (130, (9, 12), 5, [2, 2, 2, 2], [1, 1], [2, 1], np.float32),
])
def test_depthwise_fast_paths(C, hw, k, pads, dil, st, dtype):
    """Depthwise convolutions (channels-last and polyphase strided kernels) against a direct numpy formula."""
    from onnxpy.ops.conv import conv

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, C, *hw)).astype(dtype)
    w = rng.standard_normal((C, 1, k, k)).astype(dtype)
    b = rng.standard_normal(C).astype(dtype)
    got = conv(x, w, b, group=C, pads=pads, dilations=dil, strides=st)
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    Ho = (xp.shape[2] - (k - 1) * dil[0] - 1) // st[0] + 1
    Wo = (xp.shape[3] - (k - 1) * dil[1] - 1) // st[1] + 1
    ref = np.zeros((2, C, Ho, Wo), np.float64)
    for i in range(k):
        for j in range(k):
            ref += (xp[:, :, i * dil[0]:i * dil[0] + (Ho - 1) * st[0] + 1:st[0],
                       j * dil[1]:j * dil[1] + (Wo - 1) * st[1] + 1:st[1]].astype(np.float64)
                    * w[None, :, 0, i, j, None, None])
    ref += b[None, :, None, None]
    assert got.dtype == dtype and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose_tiles_without_bias_and_errors():
    """The non-overlapping path without a bias, in float64 and float16, against a direct float64 sum; a bias of the
    wrong size still raises."""
    from onnxpy.ops import conv

    r = np.random.default_rng(21)
    for dt, tol in ((np.float64, 1e-12), (np.float16, 3e-2)):
        x = r.standard_normal((2, 3, 4, 5)).astype(dt)
        w = r.standard_normal((3, 2, 2, 3)).astype(dt)
        y = conv.conv_transpose(x, w, kernel_shape=[2, 3], strides=[2, 3])
        want = np.zeros((2, 2, 8, 15))
        for a in range(2):
            for b in range(3):
                want[:, :, a::2, b::3] = np.einsum("nchw,cm->nmhw", x.astype(np.float64),
                                                   w[:, :, a, b].astype(np.float64))
        assert y.dtype == dt and y.shape == want.shape
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="bias has 3 values, expected 2"):
        conv.conv_transpose(x, w, np.ones(3, dt), kernel_shape=[2, 3], strides=[2, 3])


@pytest.mark.parametrize("dt", [np.float32, np.float16, np.float64, np.int8, np.uint8, np.int32, np.int64, np.bool_,
                                "bfloat16"])
def test_resize_nearest_integer_repeat_matches_gather(dt):
    """Nearest resizing by integer factors of the last two axes (one-pass repeat, the 2x bit-doubling form for 1-4
    byte types) gives exactly the gather path's result, for every coordinate mode and shape, NaN bits included."""
    import ml_dtypes

    from onnxpy.ops import image

    dt = ml_dtypes.bfloat16 if dt == "bfloat16" else dt
    r = np.random.default_rng(8)
    modes = [("asymmetric", "floor"), ("half_pixel", "round_prefer_floor"), ("align_corners", "round_prefer_ceil"),
             ("asymmetric", "ceil")]
    for shape in ((1, 3, 4, 5), (2, 2, 3, 3), (4, 5), (1, 1, 1, 7, 3)):
        x = (r.standard_normal(shape) * 10).astype(dt)
        for sc in ((2, 2), (2, 1), (1, 2), (3, 2), (2, 3), (4, 4), (0.5, 2), (2.5, 2)):
            scales = np.array([1] * (len(shape) - 2) + list(sc), np.float32)
            for ctm, nm in modes:
                kw = {"mode": "nearest", "coordinate_transformation_mode": ctm, "nearest_mode": nm}
                got = image.resize(x, None, scales, **kw)
                saved = image._repeat_last2
                image._repeat_last2 = lambda *a: None
                try:
                    want = image.resize(x, None, scales, **kw)
                finally:
                    image._repeat_last2 = saved
                assert got.dtype == want.dtype and got.shape == want.shape
                assert got.tobytes() == want.tobytes(), (dt, shape, sc, ctm, nm)
    x = np.array([[[[np.nan, -0.0], [np.inf, 1.5]]]], np.float32)
    y = image.resize(x, None, np.array([1, 1, 2, 2], np.float32), mode="nearest",
                     coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    assert y.view(np.uint32).tolist() == np.repeat(np.repeat(x, 2, 2), 2, 3).view(np.uint32).tolist()
