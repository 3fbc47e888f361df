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
