"""Winograd F(2x2, 3x3) convolution (onnxpy.ops.winograd) against a float64 direct convolution and onnxruntime."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _oracle import run_ort, single_node

from onnxpy.ops import _wcache
from onnxpy.ops import winograd as wg


def _ref(x, w, pads, bias=None):
    """float64 direct 3x3 cross-correlation (the ONNX Conv definition)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    pt, pl, pb, pr = pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    Ho, Wo = xp.shape[2] - 2, xp.shape[3] - 2
    out = np.zeros((x.shape[0], w.shape[0], Ho, Wo))
    for i in range(3):
        for j in range(3):
            out += np.einsum("mc,nchw->nmhw", w[:, :, i, j], xp[:, :, i:i + Ho, j:j + Wo])
    if bias is not None:
        out += np.asarray(bias, np.float64).reshape(1, -1, 1, 1)
    return out


def _check(y, ref, tol=1e-5):
    assert y.shape == ref.shape
    assert y.flags.c_contiguous
    scale = max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(y.astype(np.float64) - ref).max()) / scale
    assert err < tol, err


def _frozen(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("pads", list(itertools.product((0, 1), repeat=4)))
@pytest.mark.parametrize("hw", [(5, 5), (6, 6), (5, 8), (8, 7), (3, 3), (3, 4)])
def test_pads_and_odd_even_sizes(pads, hw):
    rng = np.random.default_rng(hash((pads, hw)) % 2**32)
    x = rng.standard_normal((2, 3, *hw)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    y = wg.winograd_conv2d(x, w, pads, b)
    assert y.dtype == np.float32
    _check(y, _ref(x, w, pads, b))
    _check(wg.winograd_conv2d(x, w, pads), _ref(x, w, pads))


@pytest.mark.parametrize("C,M", [(1, 1), (1, 3), (3, 1), (17, 3), (3, 17), (17, 17), (64, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_channels(C, M, with_bias):
    rng = np.random.default_rng(C * 100 + M)
    x = rng.standard_normal((1, C, 11, 9)).astype(np.float32)
    w = rng.standard_normal((M, C, 3, 3)).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32) if with_bias else None
    _check(wg.winograd_conv2d(x, w, (1, 1, 1, 1), b), _ref(x, w, (1, 1, 1, 1), b))


@pytest.mark.parametrize("block_rows", [1, 2, 3, None])
def test_blocks_and_batch(block_rows):
    rng = np.random.default_rng(block_rows or 0)
    x = rng.standard_normal((3, 8, 13, 10)).astype(np.float32)
    w = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    for pads in [(1, 1, 1, 1), (0, 1, 1, 0), (1, 0, 0, 0)]:
        _check(wg.winograd_conv2d(x, w, pads, b, block_rows=block_rows), _ref(x, w, pads, b))


def test_wide_channels_accuracy():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 512, 10, 10)).astype(np.float32)
    w = rng.standard_normal((8, 512, 3, 3)).astype(np.float32)
    _check(wg.winograd_conv2d(x, w, (1, 1, 1, 1)), _ref(x, w, (1, 1, 1, 1)))


def test_float64():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 9, 6))
    w = rng.standard_normal((4, 5, 3, 3))
    b = rng.standard_normal(4)
    y = wg.winograd_conv2d(x, w, (1, 0, 1, 1), b)
    assert y.dtype == np.float64
    _check(y, _ref(x, w, (1, 0, 1, 1), b), tol=1e-12)


@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 0, 0, 0), (0, 1, 1, 0)])
def test_against_onnxruntime(pads):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 17, 12, 15)).astype(np.float32)
    w = rng.standard_normal((17, 17, 3, 3)).astype(np.float32)
    b = rng.standard_normal(17).astype(np.float32)
    m, feeds = single_node("Conv", [x, w, b], opsets=[("", 17)], kernel_shape=[3, 3], pads=list(pads))
    want = run_ort(m, feeds)[0]
    y = wg.winograd_conv2d(x, _frozen(w), pads, _frozen(b))
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_filter_cache():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    pads = (1, 1, 1, 1)
    # a writeable weight is never cached: changing it in place changes the result
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    wg.winograd_conv2d(x, w, pads)
    assert not any(r() is w for refs, _ in _wcache._CACHE.values() for r in refs)
    w *= 2
    _check(wg.winograd_conv2d(x, w, pads), _ref(x, w, pads))
    # read-only weights are cached, and two different weights of the same shape give their own results
    w1 = _frozen(rng.standard_normal((3, 4, 3, 3)).astype(np.float32))
    w2 = _frozen(rng.standard_normal((3, 4, 3, 3)).astype(np.float32))
    y1 = wg.winograd_conv2d(x, w1, pads)
    assert _wcache._CACHE[(("winograd",), id(w1))][0][0]() is w1
    assert wg.winograd_conv2d(x, w1, pads) is not y1
    _check(y1, _ref(x, w1, pads))
    _check(wg.winograd_conv2d(x, w2, pads), _ref(x, w2, pads))
    _check(wg.winograd_conv2d(x, w1, pads), _ref(x, w1, pads))
    # a read-only view of a writeable array is not frozen (its content may still change): not cached
    base = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)
    view = base.view()
    view.flags.writeable = False
    wg.winograd_conv2d(x, view, pads)
    base += 1
    _check(wg.winograd_conv2d(x, view, pads), _ref(x, view, pads))
    # a recycled id never returns a stale filter
    del w1
    w3 = _frozen(rng.standard_normal((3, 4, 3, 3)).astype(np.float32))
    _check(wg.winograd_conv2d(x, w3, pads), _ref(x, w3, pads))


def test_supported():
    x = np.zeros((1, 4, 5, 5), np.float32)
    w = np.zeros((2, 4, 3, 3), np.float32)
    assert wg.winograd_supported(x, w, (1, 1, 1, 1))
    assert not wg.winograd_supported(x, w.astype(np.float64), (1, 1, 1, 1))
    assert not wg.winograd_supported(x.astype(np.float16), w.astype(np.float16), (1, 1, 1, 1))
    assert not wg.winograd_supported(x, np.zeros((2, 4, 5, 5), np.float32), (1, 1, 1, 1))
    assert not wg.winograd_supported(x, np.zeros((2, 2, 3, 3), np.float32), (1, 1, 1, 1))
    assert not wg.winograd_supported(x, w, (-1, 1, 1, 1))
    assert not wg.winograd_supported(np.zeros((1, 4, 2, 2), np.float32), w, (0, 0, 0, 0))


@pytest.mark.parametrize("C, M, H, W", [(256, 512, 28, 29), (128, 128, 56, 57)])  # (the second: two threads)
def test_conv_dispatches_wide_layers_to_winograd_and_matches_onnxruntime(monkeypatch, C, M, H, W):
    ort = pytest.importorskip("onnxruntime")
    import onnxpy
    from onnx import helper, numpy_helper
    from onnxpy.ops import conv as conv_mod

    from onnxpy.ops import _packed

    if C < conv_mod._WINOGRAD_MIN_C and (_packed._blas_threads() < 2 or not _packed.available()):
        pytest.skip("two-thread Winograd needs two BLAS threads and OpenBLAS's kernels bound")
    calls = []
    real = conv_mod.winograd_conv2d
    monkeypatch.setattr(conv_mod, "winograd_conv2d", lambda *a, **k: calls.append(1) or real(*a, **k))
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array((rng.standard_normal((M, C, 3, 3)) * 0.05).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(M).astype(np.float32), "B")
    g = helper.make_graph([helper.make_node("Conv", ["X", "W", "B"], ["Y"], pads=[1, 1, 1, 1])], "g",
                          [helper.make_tensor_value_info("X", 1, [1, C, H, W])],
                          [helper.make_tensor_value_info("Y", 1, None)], [w, b])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = rng.standard_normal((1, C, H, W)).astype(np.float32)
    got = onnxpy.InferenceSession(data).run(None, {"X": x})[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    assert calls, f"the {C}->{M} 3x3 layer should run through Winograd"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("C, M, H, expected", [(192, 192, 14, True), (256, 512, 28, True), (256, 256, 56, "wide"),
                                               (128, 256, 56, "wide"), (128, 128, 50, "wide"), (128, 128, 48, False),
                                               (64, 64, 56, False), (256, 128, 14, False), (128, 128, 28, False),
                                               (512, 512, 7, False)])
def test_conv_winograd_dispatch_rule(monkeypatch, C, M, H, expected):
    # 3x3 stride-1 layers with >= 192 input and output channels on 14x14 to 28x28 outputs take Winograd, and so do
    # layers with >= 128 channels and filters on 2500+ positions ("wide": two threads, when two BLAS threads are
    # allowed); narrower layers, 7x7 outputs and smaller planes keep the GEMM paths; the result is the same
    # convolution either way
    from onnxpy.ops import _packed
    from onnxpy.ops import conv as conv_mod

    calls = []
    real = conv_mod.winograd_conv2d
    monkeypatch.setattr(conv_mod, "winograd_conv2d", lambda *a, **k: calls.append(k.get("threads", 1)) or real(*a, **k))
    if expected == "wide":
        expected = _packed._blas_threads() >= 2 and _packed.available()
        threads = [_packed._blas_threads()] if expected else []
    else:
        threads = [1] if expected else []
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, C, H, H)).astype(np.float32)
    w = (rng.standard_normal((M, C, 3, 3)) * 0.05).astype(np.float32)
    b = rng.standard_normal(M).astype(np.float32)
    got = conv_mod.conv(x, w, b, pads=[1, 1, 1, 1])
    assert calls == threads
    want = conv_mod.conv(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), pads=[1, 1, 1, 1])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("block_rows", [1, 2, None])
@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 1, 1, 0), (0, 0, 0, 0)])
def test_threads_split_tile_rows_bit_identically(threads, block_rows, pads):
    """Tile rows split between the calling thread and the helpers (OpenBLAS held to one thread meanwhile): the
    one-thread result bit for bit, for batches, odd sizes, partial blocks and bias or none; OpenBLAS's thread count
    is back where it was."""
    from onnxpy.execution import threads as blas_threads

    rng = np.random.default_rng(5)
    before = blas_threads.get_blas_threads()
    for shape, M, bias in (((2, 5, 13, 10), 7, True), ((1, 3, 9, 14), 4, False), ((1, 2, 3, 3), 3, True)):
        x = rng.standard_normal(shape).astype(np.float32)
        w = rng.standard_normal((M, shape[1], 3, 3)).astype(np.float32)
        b = rng.standard_normal(M).astype(np.float32) if bias else None
        one = wg.winograd_conv2d(x, w, pads, b, block_rows=block_rows)
        got = wg.winograd_conv2d(x, w, pads, b, block_rows=block_rows, threads=threads)
        assert np.array_equal(got, one)
        _check(got, _ref(x, w, pads, b), 1e-5)
    assert blas_threads.get_blas_threads() == before


def test_threads_with_busy_helpers():
    """Another product holds the helpers: the convolution runs on the calling thread alone, same result."""
    from onnxpy.ops import _packed

    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 4, 12, 12)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    one = wg.winograd_conv2d(x, w, (1, 1, 1, 1))
    with _packed._pool_acquire:
        assert np.array_equal(wg.winograd_conv2d(x, w, (1, 1, 1, 1), threads=2), one)
