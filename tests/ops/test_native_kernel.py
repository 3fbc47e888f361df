"""onnxpy's AVX-512 GEMM micro-kernel (ops/_native.py): the same bits as OpenBLAS's kernel on the same packed
operands, every edge of its tiling, nothing written outside its block, and the conditions under which it is used."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from onnxpy.ops import _native, _packed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _checked_calls(monkeypatch):
    """Every native function fetched through ``_native.function`` checks its argument count here: ctypes lets a
    prototype take more arguments than it declares (varargs), which would pass a wrong argument silently."""
    table = _native._state[0]
    if not table:
        yield
        return

    def checked(name, fn):
        n = len(fn.argtypes)

        def call(*args):
            assert len(args) == n, f"{name}: {len(args)} arguments for {n}"
            return fn(*args)
        call.argtypes = fn.argtypes
        return call

    monkeypatch.setattr(_native, "_state", [{name: checked(name, fn) for name, fn in table.items()}])
    yield


def _kernels():
    if not _packed.available():
        pytest.skip("packed products unavailable here")
    ours, openblas = _packed._state[0][2], _packed._state[0][5]
    if ours is openblas:
        pytest.skip("onnxpy's kernel is not used here (no AVX-512, or turned off)")
    return ours, openblas


def _packed_operands(m, n, k):
    """(A: m features x k packed as weights are, B: n rows x k packed as activations are, w (k, m), x (n, k))."""
    itcopy, oncopy = _packed._state[0][:2]
    w = RNG.standard_normal((k, m)).astype(np.float32)
    x = RNG.standard_normal((n, k)).astype(np.float32)
    pa = _packed._aligned(m * k)
    pb = _packed._aligned(n * k)
    itcopy(k, m, w.ctypes.data, m, pa.ctypes.data)
    oncopy(k, n, x.ctypes.data, k, pb.ctypes.data)
    return pa, pb, w, x


# every tile kind: feature panels 1-3 (+ tails of 8/4/2/1), row panels 1-2 of 4 (+ rows of 2 and 1)
SHAPES = [(m, n, k) for m in (1, 7, 15, 16, 31, 32, 47, 48, 49, 63, 64, 95, 96, 112, 127, 128, 143)
          for n in (1, 2, 3, 4, 5, 7, 8, 11, 12, 13) for k in (1, 3, 64)]
SHAPES += [(128, 128, 384), (384, 128, 384), (50, 37, 200), (4096 + 17, 6, 9)]


@pytest.mark.parametrize("alpha", [1.0, -0.75])
def test_same_bits_as_openblas(alpha):
    ours, openblas = _kernels()
    for m, n, k in SHAPES:
        pa, pb, w, x = _packed_operands(m, n, k)
        ldc = m + 5  # (a row's spare columns must stay as they were)
        c0 = RNG.standard_normal((n, ldc)).astype(np.float32)
        c_ours, c_blas = c0.copy(), c0.copy()
        ours(m, n, k, alpha, pa.ctypes.data, pb.ctypes.data, c_ours.ctypes.data, ldc)
        openblas(m, n, k, alpha, pa.ctypes.data, pb.ctypes.data, c_blas.ctypes.data, ldc)
        assert np.array_equal(c_ours, c_blas), (m, n, k)
        assert np.array_equal(c_ours[:, m:], c0[:, m:]), (m, n, k)
        want = c0[:, :m] + alpha * (x.astype(np.float64) @ w.astype(np.float64))
        np.testing.assert_allclose(c_ours[:, :m], want, rtol=1e-4, atol=1e-4 * k)


def test_nothing_written_past_the_last_row():
    ours, _ = _kernels()
    m, n, k = 40, 7, 16
    pa, pb, w, x = _packed_operands(m, n, k)
    c = np.full((n + 3, m), 7.0, np.float32)
    ours(m, n, k, 1.0, pa.ctypes.data, pb.ctypes.data, c.ctypes.data, m)
    assert np.all(c[n:] == 7.0)
    np.testing.assert_allclose(c[:n], 7.0 + x @ w, rtol=1e-5, atol=1e-4)


def test_empty_products_leave_c_alone():
    ours, _ = _kernels()
    c = np.ones((4, 16), np.float32)
    pa, pb, _, _ = _packed_operands(16, 4, 8)
    for m, n, k in ((0, 4, 8), (16, 0, 8)):
        ours(m, n, k, 1.0, pa.ctypes.data, pb.ctypes.data, c.ctypes.data, 16)
    assert np.all(c == 1.0)
    ours(16, 4, 0, 1.0, pa.ctypes.data, pb.ctypes.data, c.ctypes.data, 16)  # (no depth: adds zeros)
    assert np.all(c == 1.0)


def test_packed_products_use_it_and_match_numpy():
    _kernels()
    w = RNG.standard_normal((768, 1000)).astype(np.float32)
    x = RNG.standard_normal((70, 768)).astype(np.float32)
    pw = _packed.PackedWeight(w)
    np.testing.assert_allclose(_packed.matmul(x, pw), x @ w, rtol=1e-4, atol=1e-3)


def test_cpu_flags_and_support(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert _native.cpu_flags(str(info)) >= {"avx512f", "fma", "avx2"}
    assert _native.cpu_flags(str(tmp_path / "missing")) == frozenset()
    monkeypatch.setattr(_native, "cpu_flags", lambda path="": frozenset({"avx2", "fma"}))
    assert not _native.supported()


def test_unusable_where_the_code_does_not_match(monkeypatch):
    from onnxpy.ops import _native_code

    monkeypatch.setattr(_native, "supported", lambda: True)
    monkeypatch.setattr(_native, "_state", [None])
    monkeypatch.setattr(_native_code, "SHA256", "0" * 64)
    assert _native.sgemm_kernel() is None
    monkeypatch.setattr(_native, "_state", [None])
    monkeypatch.setenv("ONNXPY_NATIVE_KERNEL", "0")
    assert _native.sgemm_kernel() is None


def test_turned_off_by_environment():
    """ONNXPY_NATIVE_KERNEL=0: the packed products call OpenBLAS's kernel (checked in a fresh process)."""
    code = ("from onnxpy.ops import _packed; ok = _packed.available(); "
            "print(ok and _packed._state[0][2] is _packed._state[0][5])")
    env = dict(os.environ, ONNXPY_NATIVE_KERNEL="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    if not _packed.available():
        pytest.skip("packed products unavailable here")
    assert out.stdout.strip() == "True"


def test_generator_matches_the_committed_source():
    """tools/native/sgemm_avx512.c is what gen_sgemm.py writes (the machine code is built from that file)."""
    tools = os.path.join(ROOT, "tools", "native")
    if not os.path.isdir(tools):
        pytest.skip("source tree only")
    sys.path.insert(0, tools)
    try:
        import gen_sgemm
    finally:
        sys.path.remove(tools)
    with open(os.path.join(tools, "sgemm_avx512.c")) as f:
        assert f.read() == gen_sgemm.source()


# -- the element-wise and row kernels ----------------------------------------------------------------------------
def _native_or_skip(name):
    if _native.function(name) is None:
        pytest.skip("native kernels are not used here")


SPECIAL = np.array([0, -0.0, 1e-30, -1e-30, 1e-40, 5, -5, 9.4, -9.4, -9.6, -10, -20, -100, 20, 100, 1e30, -1e30,
                    3.4e38, np.inf, -np.inf, np.nan], np.float32)


@pytest.mark.parametrize("tanh", [False, True])
def test_native_gelu_matches_the_numpy_passes(tanh):
    from onnxpy.ops import _ew_math, activations

    _native_or_skip("gelu_tanh_f32" if tanh else "gelu_erf_f32")
    x = np.concatenate([RNG.standard_normal(100_003).astype(np.float32) * 4, SPECIAL])

    def run(native):
        saved = _ew_math.NATIVE
        _ew_math.NATIVE = native
        try:
            with np.errstate(all="ignore"):
                if tanh:
                    return activations._gelu_tanh_block(x.copy())
                out = np.empty_like(x)
                _ew_math.gelu_erf32_into(x, out, np.empty_like(x), np.empty_like(x))
                return out
        finally:
            _ew_math.NATIVE = saved

    got, want = run(True), run(False)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.signbit(got), np.signbit(want))
    fin = np.isfinite(want)
    np.testing.assert_array_equal(got[~fin], want[~fin])
    assert np.max(np.abs(got[fin].astype(np.float64) - want[fin])) <= 1e-6  # (exp2 may differ in its last bit)
    if not tanh:  # ... and as close to the exact GELU as the numpy passes
        import math

        xd = x[fin].astype(np.float64)
        exact = xd * 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in xd]))
        assert np.max(np.abs(got[fin] - exact)) <= 1e-6


def test_native_gelu_in_place_and_odd_lengths():
    from onnxpy.ops import _ew_math

    _native_or_skip("gelu_erf_f32")
    for n in (1, 15, 16, 17, 33, 1000):
        x = RNG.standard_normal(n + 3).astype(np.float32)
        ref = np.empty(n, np.float32)
        assert _ew_math.native_gelu(x[:n], ref) is ref
        y = x.copy()
        assert _ew_math.native_gelu(y[:n], y[:n]) is not None  # (in place; the elements past n untouched)
        np.testing.assert_array_equal(y[:n], ref)
        np.testing.assert_array_equal(y[n:], x[n:])
    assert _ew_math.native_gelu(x[::2], np.empty(x[::2].size, np.float32)) is None  # (strided: the numpy passes)
    assert _ew_math.native_gelu(x.astype(np.float64), np.empty(x.size)) is None


def _ln_ref(t, g, b, eps, simplified):
    t = t.astype(np.float64)
    if simplified:
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + eps) * g
    y = (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + eps) * g
    return y if b is None else y + b


@pytest.mark.parametrize("D", [1, 7, 16, 31, 768, 1000])
@pytest.mark.parametrize("simplified", [False, True])
def test_native_layer_norm_rows(D, simplified):
    from onnxpy.ops import normalization as nz

    _native_or_skip("layer_norm_f32")
    rows = 12
    x = (RNG.standard_normal((rows, D)) * 3 + 5).astype(np.float32)
    g, b, bias = (RNG.standard_normal(D).astype(np.float32) for _ in range(3))
    beta = None if simplified else b
    y = nz.native_rows(x, 1e-5, g, beta, simplified=simplified)
    np.testing.assert_allclose(y, _ln_ref(x, g, beta, 1e-5, simplified), rtol=1e-5, atol=2e-5)
    for skip in (RNG.standard_normal((rows, D)).astype(np.float32), RNG.standard_normal((4, D)).astype(np.float32)):
        stats = np.empty((rows, 2), np.float32)
        xc = x.copy()
        y = nz.native_rows(xc, 1e-5, g, beta, xc, skip=skip, bias=bias, simplified=simplified, stats=stats)
        assert y is xc
        t = x + np.tile(skip, (rows // skip.shape[0], 1)) + bias
        np.testing.assert_allclose(y, _ln_ref(t, g, beta, 1e-5, simplified), rtol=1e-5, atol=2e-5)
        inv = 1 / np.sqrt((t.astype(np.float64) ** 2).mean(-1) + 1e-5) if simplified else 1 / np.sqrt(
            t.astype(np.float64).var(-1) + 1e-5)
        np.testing.assert_allclose(stats[:, 1], inv, rtol=1e-6)
        np.testing.assert_allclose(stats[:, 0], 0 if simplified else t.astype(np.float64).mean(-1), rtol=1e-6,
                                   atol=1e-6)


def test_native_layer_norm_declines_and_propagates_nan():
    from onnxpy.ops import normalization as nz

    _native_or_skip("layer_norm_f32")
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    g = np.ones(8, np.float32)
    assert nz.native_rows(np.asfortranarray(x), 1e-5, g) is None  # (not C-contiguous)
    assert nz.native_rows(x, 1e-5, np.ones(7, np.float32)) is None  # (gamma of another length)
    assert nz.native_rows(x.astype(np.float64), 1e-5, g) is None
    assert nz.native_rows(x, 1e-5, g, skip=np.ones((3, 8), np.float32)) is None  # (3 does not divide 4 rows)
    x[1, 3] = np.nan
    y = nz.native_rows(x, 1e-5, g)
    assert np.isnan(y[1]).all() and np.isfinite(np.delete(y, 1, 0)).all()


DW_CASES = [  # (N, C, H, W), K (KH, KW), pads (top, left, bottom, right), strides, dilations
    ((1, 24, 56, 56), (3, 3), (1, 1, 1, 1), (2, 2), (1, 1)),
    ((1, 40, 28, 28), (3, 3), (1, 1, 1, 1), (1, 1), (1, 1)),
    ((2, 17, 9, 13), (5, 5), (2, 1, 0, 2), (1, 2), (1, 1)),
    ((1, 8, 30, 31), (3, 3), (2, 2, 2, 2), (2, 2), (2, 2)),
    ((1, 33, 7, 7), (3, 3), (1, 1, 1, 1), (1, 1), (1, 1)),
    ((1, 4, 1, 40), (1, 3), (0, 1, 0, 1), (1, 1), (1, 1)),
    ((1, 5, 20, 3), (3, 1), (1, 0, 1, 0), (3, 1), (1, 1)),
    ((1, 16, 40, 70), (7, 7), (3, 3, 3, 3), (2, 1), (1, 1)),
    ((1, 6, 12, 17), (2, 3), (0, 0, 0, 0), (2, 2), (1, 3)),
    ((1, 3, 50, 50), (3, 3), (0, 5, 2, 0), (1, 1), (1, 1)),  # (pads wider than the filter: rows of zeros)
]


@pytest.mark.parametrize("case", DW_CASES)
@pytest.mark.parametrize("mode", ["fresh", "acc", "split"])
def test_native_depthwise_matches_the_numpy_paths(case, mode, monkeypatch):
    from onnxpy.ops import conv

    _native_or_skip("dwconv2d_f32")
    shp, (KH, KW), pads, s, d = case
    N, C, H, W = shp
    x = RNG.standard_normal(shp).astype(np.float32)
    w = RNG.standard_normal((C, 1, KH, KW)).astype(np.float32)
    B = None if mode == "acc" else RNG.standard_normal(C).astype(np.float32)
    pb, pe = pads[:2], pads[2:]
    Ho = (H + pb[0] + pe[0] - d[0] * (KH - 1) - 1) // s[0] + 1
    Wo = (W + pb[1] + pe[1] - d[1] * (KW - 1) - 1) // s[1] + 1
    monkeypatch.setattr(conv, "DW_NATIVE", False)
    want = conv._conv2d_fast(x, w, B, pb, pe, s, d, C, (None, None))
    if want is None:
        want = conv.conv(x, w, B, pads=list(pb) + list(pe), strides=list(s), dilations=list(d), group=C)
    monkeypatch.setattr(conv, "DW_NATIVE", True)
    if mode == "split":
        monkeypatch.setattr(conv, "_DW_SPLIT_MIN", 0)
    out = None
    if mode == "acc":
        base = RNG.standard_normal((N, C, Ho, Wo)).astype(np.float32)
        out = base.copy()
        want = want + base
    got = conv._depthwise2d_native(x, w, B, pb, s, d, (Ho, Wo), out, mode == "acc")
    assert got is not None and got.shape == want.shape
    if out is not None:
        assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_native_depthwise_declines():
    from onnxpy.ops import conv

    _native_or_skip("dwconv2d_f32")
    x = RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
    assert conv._depthwise2d_native(x, w, None, (1, 1), (1, 3), (1, 1), (9, 3)) is None  # (column stride 3)
    assert conv._depthwise2d_native(x.astype(np.float64), w, None, (1, 1), (1, 1), (1, 1), (9, 9)) is None
    assert conv._depthwise2d_native(x[:, :, :, ::2], w, None, (1, 1), (1, 1), (1, 1), (9, 5)) is None
    bad_out = np.empty((1, 4, 9, 9), np.float32, order="F")
    assert conv._depthwise2d_native(x, w, None, (1, 1), (1, 1), (1, 1), (9, 9), bad_out) is None


POOL_CASES = [  # shape, kernel, strides, pads, dilations, ceil_mode
    ((1, 24, 112, 112), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 0),
    ((1, 8, 111, 111), (3, 3), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    ((2, 5, 17, 19), (2, 3), (1, 2), (1, 0, 0, 2), (1, 1), 0),
    ((1, 16, 28, 28), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 0),
    ((1, 8, 14, 14), (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), 1),
    ((1, 4, 40, 44), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 0),
    ((1, 3, 20, 21), (3, 2), (3, 1), (1, 1, 0, 0), (2, 2), 1),
    ((1, 2, 5, 40), (1, 7), (1, 1), (0, 3, 0, 3), (1, 1), 0),
]


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("split", [False, True])
def test_native_pooling_matches_the_numpy_paths(case, split, monkeypatch):
    from onnxpy.ops import pool

    _native_or_skip("pool2d_f32")
    shp, ks, st, pads, dl, ceil = case
    x = RNG.standard_normal(shp).astype(np.float32)
    x.flat[::97] = np.nan
    x.flat[5::89] = -np.inf
    kw = dict(kernel_shape=list(ks), strides=list(st), pads=list(pads), dilations=list(dl), ceil_mode=ceil)
    if split:
        monkeypatch.setattr(pool, "_POOL_SPLIT_MIN", 0)
    for op, extra in ((pool.max_pool, {}), (pool.average_pool, {"count_include_pad": 0}),
                      (pool.average_pool, {"count_include_pad": 1})):
        if op is pool.average_pool and dl != (1, 1):
            continue  # (AveragePool's dilations: opset 19+, same kernel)
        monkeypatch.setattr(pool, "POOL_NATIVE", False)
        want = op(x, **kw, **extra)
        monkeypatch.setattr(pool, "POOL_NATIVE", True)
        gk, gs, gd, gb, ge, _ = pool._pool_geometry(x, list(ks), list(st), list(dl), list(pads), "NOTSET", ceil, "P")
        assert pool._pool2d_native(x, gk, gs, gd, gb, want.shape[2:], 0 if op is pool.max_pool else 1, ge,
                                   extra.get("count_include_pad", 0)) is not None
        got = op(x, **kw, **extra)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_native_pooling_declines():
    from onnxpy.ops import pool

    _native_or_skip("pool2d_f32")
    x = RNG.standard_normal((1, 2, 9, 9)).astype(np.float32)
    assert pool._pool2d_native(x, (3, 3), (1, 3), (1, 1), (0, 0), (7, 3), 0) is None  # (column stride 3)
    assert pool._pool2d_native(x[:, :, ::2], (3, 3), (1, 1), (1, 1), (0, 0), (3, 7), 0) is None
    assert pool._pool2d_native(x.astype(np.float64), (3, 3), (1, 1), (1, 1), (0, 0), (7, 7), 0) is None
    assert pool._pool2d_native(x[0], (3,), (1,), (1,), (0,), (7,), 0) is None


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_unpacked_a_kernel_same_bits_as_packing_first(alpha):
    """sgemm_kernel_a reads A in place (feature f at depth p: A[f + p * lda]); itcopy + the kernel give the same
    bits, every edge of the tiling included, and nothing past a row's m features is written."""
    ours, _ = _kernels()
    ka = _native.function("sgemm_kernel_a")
    itcopy, oncopy = _packed._state[0][:2]
    for m in (1, 5, 15, 16, 17, 31, 47, 48, 49, 64, 100, 143):
        for n in (1, 2, 3, 4, 5, 7, 8, 9, 12, 13):
            for k in (1, 3, 64):
                lda = m + 7
                a = RNG.standard_normal((k, lda)).astype(np.float32)
                x = RNG.standard_normal((n, k)).astype(np.float32)
                pa, pb = _packed._aligned(m * k), _packed._aligned(n * k)
                itcopy(k, m, a.ctypes.data, lda, pa.ctypes.data)
                oncopy(k, n, x.ctypes.data, k, pb.ctypes.data)
                c0 = RNG.standard_normal((n, m + 3)).astype(np.float32)
                c1, c2 = c0.copy(), c0.copy()
                ours(m, n, k, alpha, pa.ctypes.data, pb.ctypes.data, c1.ctypes.data, m + 3)
                ka(m, n, k, alpha, a.ctypes.data, lda, pb.ctypes.data, c2.ctypes.data, m + 3)
                assert np.array_equal(c1, c2), (m, n, k)
                assert np.array_equal(c2[:, m:], c0[:, m:])


@pytest.mark.parametrize("C,M,H,s", [(64, 64, 30, 1), (48, 72, 17, 2), (400, 40, 9, 1), (24, 36, 11, 1)])
def test_packed_convolution_reads_windows_in_place_with_the_same_bits(C, M, H, s, monkeypatch):
    from onnxpy.ops import _conv_packed

    _kernels()
    x = RNG.standard_normal((1, C, H, H)).astype(np.float32)
    w = (RNG.standard_normal((M, C, 3, 3)) * 0.1).astype(np.float32)
    B = RNG.standard_normal(M).astype(np.float32)
    pf = _conv_packed.PackedFilter(w)
    Ho = (H + 2 - 3) // s + 1
    outs = []
    for direct in (False, True):
        monkeypatch.setattr(_conv_packed, "DIRECT", direct)
        outs.append(_conv_packed.conv2d(x, pf, B, (1, 1), (1, 1), (s, s), (1, 1), (Ho, Ho)))
    assert np.array_equal(outs[0], outs[1])
    from onnxpy.ops import conv

    want = conv.conv(x, w, B, pads=[1, 1, 1, 1], strides=[s, s])
    np.testing.assert_allclose(outs[1], want, rtol=1e-4, atol=1e-4)


SMALL_CASES = [  # x shape, w shape, group, pads (top, left, bottom, right), strides, dilations
    ((1, 3, 64, 64), (24, 3, 3, 3), 1, (1, 1, 1, 1), (2, 2), (1, 1)),
    ((1, 3, 61, 58), (20, 3, 7, 7), 1, (3, 3, 3, 3), (2, 2), (1, 1)),
    ((1, 3, 40, 40), (64, 3, 3, 3), 1, (1, 1, 1, 1), (1, 1), (1, 1)),
    ((2, 6, 17, 19), (10, 3, 3, 2), 2, (1, 0, 2, 1), (1, 2), (1, 1)),
    ((1, 4, 30, 31), (20, 1, 5, 5), 4, (2, 2, 2, 2), (2, 1), (2, 1)),
    ((1, 2, 9, 70), (13, 2, 3, 3), 1, (0, 0, 0, 0), (3, 2), (1, 1)),
]


@pytest.mark.parametrize("case", SMALL_CASES)
@pytest.mark.parametrize("mode", ["fresh", "acc", "split"])
def test_native_small_channel_convolution_matches_the_numpy_paths(case, mode, monkeypatch):
    from onnxpy.ops import conv

    _native_or_skip("conv2d_small_f32")
    xs, ws, group, pads, s, d = case
    x = RNG.standard_normal(xs).astype(np.float32)
    w = (RNG.standard_normal(ws) * 0.3).astype(np.float32)
    B = None if mode == "acc" else RNG.standard_normal(ws[0]).astype(np.float32)
    kw = dict(pads=list(pads), strides=list(s), dilations=list(d), group=group)
    monkeypatch.setattr(conv, "SMALL_NATIVE", False)
    want = conv.conv(x, w, B, **kw)
    monkeypatch.setattr(conv, "SMALL_NATIVE", True)
    if mode == "split":
        monkeypatch.setattr(conv, "_SMALL_SPLIT_MIN", 0)
    out = None
    if mode == "acc":
        out = RNG.standard_normal(want.shape).astype(np.float32)
        want = want + out
    got = conv._conv2d_small_native(x, w, B, group, pads[:2], s, d, want.shape[2:], out, mode == "acc")
    assert got is not None and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if mode == "fresh":  # (and the Conv kernel itself takes that path)
        calls = []
        real = conv._conv2d_small_native
        monkeypatch.setattr(conv, "_conv2d_small_native", lambda *a, **k: calls.append(1) or real(*a, **k))
        np.testing.assert_allclose(conv.conv(x, w, B, **kw), want, rtol=1e-5, atol=1e-5)
        assert calls


ATTN_CASES = [  # B, N, S, T, head size, additive term shape (None: none), causal past (None: not causal)
    (1, 12, 128, 128, 64, None, None),
    (1, 6, 128, 128, 32, (1, 1, 1, 128), None),
    (2, 5, 100, 140, 64, (2, 5, 100, 140), None),
    (2, 4, 9, 9, 8, (2, 1, 9, 9), None),
    (1, 12, 128, 128, 64, None, 0),
    (1, 4, 7, 20, 16, None, 13),
    (1, 2, 40, 40, 4, (1, 1, 40, 40), 0),
    (1, 2, 40, 50, 4, (40, 50), 10),
]


@pytest.mark.parametrize("case", ATTN_CASES)
def test_native_softmax_matches_the_numpy_attention(case, monkeypatch):
    """The native pass between attention's two products gives the numpy steps' values, masked keys, rows whose
    every visible key is -inf (numpy's masking of the causal keys with the lowest float then weighs those) and NaN
    included."""
    from onnxpy.ops import contrib_transformer as ct

    _native_or_skip("softmax_keys_f32")
    B, N, S, T, H, mask, causal = case
    qkv = RNG.standard_normal((B, S, 3 * N * H)).astype(np.float32)
    q = qkv[..., :N * H].reshape(B, S, N, H).transpose(0, 2, 1, 3)
    kv = RNG.standard_normal((B, T, 2 * N * H)).astype(np.float32)
    k = kv[..., :N * H].reshape(B, T, N, H).transpose(0, 2, 1, 3)
    v = kv[..., N * H:].reshape(B, T, N, H).transpose(0, 2, 1, 3)
    add = None if mask is None else RNG.standard_normal(mask).astype(np.float32)
    if mask == (1, 1, 1, 128):
        add[..., 100:] = -np.inf
    if mask == (1, 1, 40, 40):
        add[0, 0, 2, :] = -np.inf
        add[0, 0, 4, 1] = np.nan
        add[0, 0, 20, :21] = -np.inf
    outs = []
    for native in (False, True):
        monkeypatch.setattr(ct, "SOFTMAX_NATIVE", native)
        o = np.empty((B, S, N, H), np.float32)
        with np.errstate(all="ignore"):
            ct._mha_heads(0, N, q, k, v, 1 / np.sqrt(H), add, causal, o.transpose(0, 2, 1, 3), False)
        outs.append(o)
    assert np.array_equal(np.isnan(outs[0]), np.isnan(outs[1]))
    np.testing.assert_allclose(outs[1], outs[0], rtol=2e-5, atol=2e-6, equal_nan=True)


def test_native_paths_never_write_read_only_arrays():
    """A read-only destination (a session constant) is declined: the numpy paths then raise as numpy does."""
    from onnxpy.ops import _ew_math, conv
    from onnxpy.ops import normalization as nz

    _native_or_skip("gelu_erf_f32")
    x = RNG.standard_normal(64).astype(np.float32)
    ro = np.zeros(64, np.float32)
    ro.setflags(write=False)
    assert _ew_math.native_gelu(x, ro) is None
    assert np.all(ro == 0)
    x2 = RNG.standard_normal((4, 16)).astype(np.float32)
    ro2 = np.zeros((4, 16), np.float32)
    ro2.setflags(write=False)
    assert nz.native_rows(x2, 1e-5, np.ones(16, np.float32), out=ro2) is None
    img = RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
    ro3 = np.zeros((1, 4, 9, 9), np.float32)
    ro3.setflags(write=False)
    assert conv._depthwise2d_native(img, w, None, (1, 1), (1, 1), (1, 1), (9, 9), ro3) is None
    assert np.all(ro3 == 0)
