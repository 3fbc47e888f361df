"""The per-tap BLAS convolution (``conv._conv2d_direct``: one cblas_sgemm per kernel tap, reading windows of the flat
padded image or of its stride phases in place, accumulating with beta = 1) and the BLAS binding under it
(``ops._blas``): chosen where it should be, same values as the general path, and the binding's checks."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpy.ops import _blas
from onnxpy.ops import conv as conv_mod

RNG = np.random.default_rng(5)

needs_blas = pytest.mark.skipif(not _blas.available(), reason="no cblas_sgemm found in the loaded BLAS library")


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _reference(x, w, b, pads, strides, dilations):
    """float64 im2col-free reference: the general (windowed) path."""
    pb, pe = list(pads[:2]), list(pads[2:])
    out = conv_mod._conv_core(x.astype(np.float64), w.astype(np.float64), pb, pe, list(strides), list(dilations), 1,
                              "Conv")
    return conv_mod._add_bias(out, None if b is None else b.astype(np.float64), w.shape[0], "Conv")


@pytest.fixture
def direct(monkeypatch):
    """Small thresholds so small layers take the direct path; records the calls."""
    taken = []
    fn = conv_mod._conv2d_direct

    def spy(*a, **k):
        taken.append(a[0].shape)
        return fn(*a, **k)

    monkeypatch.setattr(conv_mod, "_conv2d_direct", spy)
    monkeypatch.setattr(conv_mod, "_DIRECT_MIN_C", 4)
    monkeypatch.setattr(conv_mod, "_DIRECT_MIN_RATIO", 1)
    monkeypatch.setattr(conv_mod, "SMALL_NATIVE", False)  # (4 channels would take the native small-channel kernel)
    return taken


CASES = [  # x shape, w shape, pads, strides, dilations
    ((1, 8, 9, 11), (8, 8, 3, 3), [1, 1, 1, 1], [1, 1], [1, 1]),
    ((2, 6, 10, 7), (12, 6, 3, 3), [0, 2, 1, 0], [1, 1], [1, 2]),  # batch 2, asymmetric pads, dilated
    ((1, 8, 12, 10), (8, 8, 5, 5), [2, 2, 2, 2], [1, 1], [1, 1]),
    ((1, 6, 13, 12), (9, 6, 3, 2), [0, 0, 0, 0], [1, 1], [2, 3]),  # no padding, dilated both ways
    ((1, 8, 11, 12), (8, 8, 3, 3), [1, 1, 1, 1], [2, 2], [1, 1]),  # stride 2 (stride phases)
    ((2, 5, 15, 14), (7, 5, 7, 7), [3, 3, 2, 3], [2, 2], [1, 1]),  # 7x7 / 2, odd sizes
    ((1, 4, 16, 13), (6, 4, 3, 3), [1, 0, 0, 1], [3, 2], [2, 1]),  # mixed strides and dilations
    ((1, 8, 4, 30), (8, 8, 1, 3), [0, 1, 0, 1], [1, 1], [1, 1]),  # 1x3
]


@needs_blas
@pytest.mark.parametrize("xs,ws,pads,strides,dil", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_direct_matches_reference(xs, ws, pads, strides, dil, bias, direct):
    x, w = rand(*xs), rand(*ws)
    b = rand(ws[0]) if bias else None
    got = conv_mod.conv(x, w, b, pads=pads, strides=strides, dilations=dil)
    assert direct == [xs]
    ref = _reference(x, w, b, pads, strides, dil)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@needs_blas
def test_direct_row_blocks(direct, monkeypatch):
    """Output row blocks smaller than the image (a tiny block budget): same values."""
    monkeypatch.setattr(conv_mod, "_DIRECT_BLOCK_BYTES", 1)
    x, w, b = rand(1, 8, 70, 40), rand(8, 8, 3, 3), rand(8)
    got = conv_mod.conv(x, w, b, pads=[1, 1, 1, 1])
    assert direct
    np.testing.assert_allclose(got, _reference(x, w, b, [1, 1, 1, 1], [1, 1], [1, 1]), rtol=1e-4, atol=1e-4)


@needs_blas
def test_direct_constant_filter_cache(direct):
    """The per-tap filter layout is cached on a read-only filter, and a new filter of the same shape is not served
    the old layout."""
    x = rand(1, 8, 9, 9)
    outs = []
    for _ in range(2):
        w = rand(8, 8, 3, 3)
        w.flags.writeable = False
        spec = conv_mod.conv.specialize((None, w, None), {"pads": [1, 1, 1, 1]})
        got = spec(x, w) if spec is not None else conv_mod.conv(x, w, pads=[1, 1, 1, 1])
        np.testing.assert_allclose(got, _reference(x, w, None, [1, 1, 1, 1], [1, 1], [1, 1]), rtol=1e-4, atol=1e-4)
        outs.append(got)
    assert not np.allclose(outs[0], outs[1])


@pytest.mark.parametrize("xs,ws,dtype,group", [
    ((1, 2, 9, 9), (2, 2, 3, 3), np.float32, 1),  # too few input channels (default thresholds)
    ((1, 64, 9, 9), (64, 64, 3, 3), np.float32, 1),  # too few positions per channel
    ((1, 64, 30, 30), (200, 64, 3, 3), np.float32, 1),  # M > 2C: im2col
    ((1, 64, 30, 30), (32, 64, 3, 3), np.float32, 1),  # M < C: stacked taps
    ((1, 64, 30, 30), (64, 64, 3, 3), np.float64, 1),  # float64
    ((1, 64, 30, 30), (64, 32, 3, 3), np.float32, 2),  # grouped
])
def test_direct_not_chosen(xs, ws, dtype, group, monkeypatch):
    called = []
    monkeypatch.setattr(conv_mod, "_conv2d_direct", lambda *a, **k: called.append(1))
    x, w = rand(*xs, dtype=dtype), rand(*ws, dtype=dtype)
    got = conv_mod.conv(x, w, pads=[1, 1, 1, 1], group=group)
    assert not called and got is not None


@needs_blas
def test_direct_chosen_by_default(monkeypatch):
    called = []
    fn = conv_mod._conv2d_direct
    monkeypatch.setattr(conv_mod, "_conv2d_direct", lambda *a, **k: called.append(1) or fn(*a, **k))
    x, w = rand(1, 64, 20, 20), rand(64, 64, 3, 3)
    got = conv_mod.conv(x, w, pads=[1, 1, 1, 1])
    assert called
    np.testing.assert_allclose(got, _reference(x, w, None, [1, 1, 1, 1], [1, 1], [1, 1]), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------ the binding


@needs_blas
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_sgemm_strided_views(beta):
    big_a, big_b = rand(10, 20), rand(30, 50)
    a, b = big_a[2:7, 3:11], big_b[4:12, 5:41]  # rows with strides wider than the views
    c_big = rand(9, 60)
    c = c_big[1:6, 10:46]
    want = a.astype(np.float64) @ b + beta * c
    _blas.sgemm(a, b, c, beta)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)


@needs_blas
def test_sgemm_leaves_surroundings():
    c_big = np.zeros((6, 12), np.float32)
    _blas.sgemm(np.ones((4, 3), np.float32), np.ones((3, 8), np.float32), c_big[1:5, 2:10], 0.0)
    assert (c_big[1:5, 2:10] == 3).all()
    c_big[1:5, 2:10] = 0
    assert not c_big.any()


@needs_blas
@pytest.mark.parametrize("a,b,c", [
    (np.ones((3, 4), np.float64), np.ones((4, 5), np.float32), np.ones((3, 5), np.float32)),  # dtype
    (np.ones((3, 4), np.float32), np.ones((5, 5), np.float32), np.ones((3, 5), np.float32)),  # inner sizes
    (np.ones((3, 4), np.float32), np.ones((4, 5), np.float32), np.ones((5, 3), np.float32).T),  # columns strided
    (np.ones((4, 3), np.float32).T, np.ones((4, 5), np.float32), np.ones((3, 5), np.float32)),  # transposed a
])
def test_sgemm_rejects_layouts(a, b, c):
    with pytest.raises(ValueError, match="sgemm"):
        _blas.sgemm(a, b, c, 0.0)


def test_sgemm_rejects_overlapping_rows():
    if not _blas.available():
        pytest.skip("no BLAS")
    base = np.zeros(100, np.float32)
    rows = np.lib.stride_tricks.as_strided(base, shape=(4, 10), strides=(8, 4))  # each row overlaps the next
    with pytest.raises(ValueError, match="overlap"):
        _blas.sgemm(rows, np.ones((10, 2), np.float32), np.zeros((4, 2), np.float32), 0.0)


def test_direct_blas_can_be_turned_off():
    import subprocess
    import sys

    code = "from onnxpy.ops import _blas; print(_blas.available())"
    out = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "ONNXPY_DIRECT_BLAS": "0"},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_plain_cblas_name_only_from_lp64_openblas():
    """A plain ``cblas_sgemm`` (integer width not in its name) is bound only from an OpenBLAS configured without
    64-bit integers; other libraries (MKL's ILP64 layer uses the same name) are left alone."""
    from types import SimpleNamespace

    def lib(config):
        return SimpleNamespace(openblas_get_config=lambda: config)

    assert _blas._lp64_openblas(lib(b"OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64"))
    assert not _blas._lp64_openblas(lib(b"OpenBLAS 0.3.31 USE64BITINT DYNAMIC_ARCH SkylakeX"))
    assert not _blas._lp64_openblas(lib(None))
    assert not _blas._lp64_openblas(SimpleNamespace())  # not OpenBLAS


@pytest.mark.parametrize("shape,cut", [((3072, 128), None), ((1, 5), None), ((5, 1), None), ((7, 3), None),
                                       ((10, 20), (3, 11)), ((6, 9), (0, 1))])
@pytest.mark.parametrize("bound", [True, False])
def test_transpose_into(shape, cut, bound, monkeypatch):
    """transpose_into writes a.T exactly -- OpenBLAS's somatcopy where bound (row-strided sources included), numpy's
    copy otherwise (or for other dtypes / layouts)."""
    if not bound:
        monkeypatch.setattr(_blas, "_omat", False)
    rng = np.random.default_rng(3)
    a = rng.standard_normal(shape).astype(np.float32)
    if cut:
        a = a[:, cut[0]:cut[1]]
    out = np.full(a.shape[::-1], np.nan, np.float32)
    assert _blas.transpose_into(a, out) is out
    assert np.array_equal(out, a.T)
    d = a.astype(np.float64)  # (numpy's copy)
    o64 = np.empty(d.shape[::-1])
    assert np.array_equal(_blas.transpose_into(d, o64), d.T)
    f = np.asfortranarray(a)  # (column-major source: numpy's copy)
    assert np.array_equal(_blas.transpose_into(f, np.empty(a.shape[::-1], np.float32)), a.T)


@needs_blas
def test_transpose_bound_and_checked():
    """numpy's OpenBLAS exports somatcopy; the binding passed its self-test (a strided 5 x 7 source)."""
    assert _blas.transpose_available()
