"""The tap-stacked convolution path (stride 1, few output channels: one GEMM of the (KH*KW*M, C + 1) stacked filter
with the flat padded image, then the taps' shifted sums): chosen where it should be, same values as onnxpy's general
path and onnxruntime, its cached filter layouts never stale, and the per-tap fallback for oversized buffers."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from onnxpy.ops import conv as conv_mod

RNG = np.random.default_rng(77)


def rand(*shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


def _general(x, w, b, pads, dilations):
    pb, pe = list(pads[:2]), list(pads[2:])
    out = conv_mod._conv_core(x, w, pb, pe, [1, 1], list(dilations), 1, "Conv")
    return conv_mod._add_bias(out, b, w.shape[0], "Conv")


@pytest.fixture
def paths(monkeypatch):
    """Which 2-D fast path each call took."""
    taken = []
    for name in ("_conv2d_stacked", "_conv2d_shifted", "_conv2d_gemm"):
        fn = getattr(conv_mod, name)

        def spy(*a, _fn=fn, _name=name, **k):
            taken.append(_name)
            return _fn(*a, **k)

        monkeypatch.setattr(conv_mod, name, spy)
    return taken


CASES = [  # x shape, w shape, pads, dilations
    ((1, 64, 9, 11), (16, 64, 3, 3), [1, 1, 1, 1], [1, 1]),
    ((2, 40, 8, 7), (8, 40, 3, 3), [0, 2, 1, 0], [1, 2]),  # batch 2, asymmetric pads, dilated
    ((1, 96, 1, 40), (24, 96, 1, 3), [0, 1, 0, 1], [1, 1]),  # 1x3 (PP-OCR rec)
    ((1, 32, 12, 10), (12, 32, 5, 5), [2, 2, 2, 2], [1, 1]),
    ((1, 30, 13, 12), (5, 30, 3, 2), [0, 0, 0, 0], [2, 3]),  # no padding, dilated both ways
    ((1, 20, 6, 6), (10, 20, 3, 3), [3, 1, 0, 2], [1, 1]),  # pads larger than the kernel reach
    ((1, 16, 3, 3), (8, 16, 3, 3), [0, 0, 0, 0], [1, 1]),  # a single output position
]


@pytest.mark.parametrize("xs,ws,pads,dil", CASES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stacked_vs_general(xs, ws, pads, dil, bias, dtype, paths):
    x, w = rand(*xs, dtype=dtype), rand(*ws, dtype=dtype)
    b = rand(ws[0], dtype=dtype) if bias else None
    got = conv_mod.conv(x, w, b, pads=pads, dilations=dil)
    assert paths == ["_conv2d_stacked"]
    want = _general(x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64),
                    pads, dil)
    assert got.dtype == dtype and got.shape == want.shape and got.flags.c_contiguous
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_stacked_vs_ort():
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    x = rand(1, 96, 20, 20, dtype=np.float32)
    w, b = rand(24, 96, 3, 3, dtype=np.float32) * 0.1, rand(24, dtype=np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["X", "W", "B"], ["Y"], pads=[1, 1, 1, 1])], "g",
                          [helper.make_tensor_value_info("X", 1, list(x.shape))],
                          [helper.make_tensor_value_info("Y", 1, None)],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    import onnxpy

    got = onnxpy.InferenceSession(m).run(None, {"X": x})[0]
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs,ws,attrs,path", [
    ((1, 16, 9, 9), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "_conv2d_gemm"),  # M = C: im2col
    ((1, 12, 9, 9), (8, 12, 3, 3), {"pads": [1, 1, 1, 1]}, "_conv2d_gemm"),  # 2M > C
    ((1, 600, 5, 5), (300, 600, 3, 3), {"pads": [1, 1, 1, 1]}, "_conv2d_gemm"),  # M > 256
    ((1, 64, 9, 9), (16, 64, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "_conv2d_gemm"),  # strided
])
def test_paths_taken_elsewhere(xs, ws, attrs, path, paths):
    x, w, b = rand(*xs), rand(*ws), rand(ws[0])
    got = conv_mod.conv(x, w, b, **attrs)
    assert paths == [path]
    st = attrs.get("strides", [1, 1])
    pb, pe = attrs["pads"][:2], attrs["pads"][2:]
    want = conv_mod._add_bias(conv_mod._conv_core(x, w, pb, pe, st, [1, 1], 1, "Conv"), b, ws[0], "Conv")
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_oversized_products_take_the_per_tap_path(monkeypatch, paths):
    monkeypatch.setattr(conv_mod, "_STACKED_MAX_BYTES", 1024)
    x, w, b = rand(1, 64, 9, 11), rand(16, 64, 3, 3), rand(16)
    got = conv_mod.conv(x, w, b, pads=[1, 1, 1, 1])
    assert paths == ["_conv2d_shifted"]
    np.testing.assert_allclose(got, _general(x, w, b, [1, 1, 1, 1], [1, 1]), rtol=1e-12, atol=1e-12)


def _frozen(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def test_stacked_filter_cache_is_never_stale(paths):
    x = rand(1, 32, 7, 8, dtype=np.float32)
    w1, b1 = _frozen(rand(8, 32, 3, 3, dtype=np.float32)), _frozen(rand(8, dtype=np.float32))

    def check(w, b):
        want = _general(x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64),
                        [1, 1, 1, 1], [1, 1])
        for _ in range(2):
            np.testing.assert_allclose(conv_mod.conv(x, w, b, pads=[1, 1, 1, 1]), want, rtol=1e-4, atol=1e-4)

    check(w1, b1)
    check(w1, None)  # same filter, no bias: its own layout
    b2 = _frozen(rand(8, dtype=np.float32))
    check(w1, b2)  # same filter, another bias
    for _ in range(5):  # new frozen arrays, possibly at recycled ids
        del w1, b1
        gc.collect()
        w1, b1 = _frozen(rand(8, 32, 3, 3, dtype=np.float32)), _frozen(rand(8, dtype=np.float32))
        check(w1, b1)
    w3, b3 = rand(8, 32, 3, 3, dtype=np.float32), rand(8, dtype=np.float32)  # writeable: never cached
    check(w3, b3)
    w3 *= 2
    b3 += 1
    check(w3, b3)
    w4, b4 = _frozen(w3), rand(8, dtype=np.float32)  # a frozen filter with a writeable bias
    check(w4, b4)
    b4 -= 3
    check(w4, b4)
    assert set(paths) == {"_conv2d_stacked"}
