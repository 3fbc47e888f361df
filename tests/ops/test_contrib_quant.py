"""Quantized com.microsoft contrib ops and models produced by onnxruntime.quantization, compared with onnxruntime.

onnxruntime (CPU) is the oracle; single-node models are built with onnx.helper.  Quantized outputs must match exactly
or within one quantization step where onnxruntime's SIMD kernels round differently (documented in the modules).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import onnxpy
from _oracle import run_ort, single_node

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(2024)


# ---------------------------------------------------------------------------------------------------------- helpers


def _model(op, inputs, n_out=1, inits=(), model_opset=21, domain="com.microsoft", **attrs):
    return single_node(op, inputs, n_out, opsets=[("", model_opset), ("com.microsoft", 1)], domain=domain,
                       inits=inits, ir_version=10, **attrs)


def _ort(model_bytes, feeds, optimize=False):
    return run_ort(model_bytes, feeds, optimize=optimize)


def _check(op, inputs, n_out=1, *, atol=1e-5, rtol=1e-5, steps=0, inits=(), **attrs):
    """Run op in onnxpy and onnxruntime; ``steps``: allowed difference in quantization steps for integer outputs."""
    m, feeds = _model(op, inputs, n_out, inits=inits, **attrs)
    b = m.SerializeToString()
    got = onnxpy.InferenceSession(b).run(None, feeds)
    exp = _ort(b, feeds)
    for g, e in zip(got, exp):
        g, e = np.asarray(g), np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape, (op, g.dtype, g.shape, e.dtype, e.shape)
        if e.dtype.kind in "iu":
            assert np.abs(g.astype(np.int64) - e.astype(np.int64)).max(initial=0) <= steps, op
        else:
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), atol=atol, rtol=rtol)
    return got


def _pack(q, bits):
    """Pack codes low-order first along the last axis into bytes."""
    per = 8 // bits
    pad = (-q.shape[-1]) % per
    q = np.concatenate([q, np.zeros(q.shape[:-1] + (pad,), q.dtype)], -1).reshape(q.shape[:-1] + (-1, per))
    return (q.astype(np.int64) << (np.arange(per) * bits)).sum(-1).astype(np.uint8)


def _rand_q(dt, shape):
    i = np.iinfo(dt)
    return RNG.integers(i.min, i.max + 1, shape).astype(dt)


# ------------------------------------------------------------------------------------------------------ MatMulNBits


def _nbits_case(bits, K, bs, N=7, a_shape=None):
    nb = -(-K // bs)
    A = RNG.standard_normal(a_shape or (3, K)).astype(np.float32)
    q = RNG.integers(0, 2**bits, (N, nb * bs))
    B = _pack(q, bits).reshape(N, nb, bs * bits // 8)
    S = (RNG.random((N, nb)) * 0.1 + 0.01).astype(np.float32)
    zp = RNG.integers(0, 2**bits, (N, nb))
    return A, B, S, zp


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("K,bs,a_shape", [(50, 16, (3, 50)), (64, 32, (2, 3, 64)), (128, 128, (128,))])
def test_matmul_nbits(bits, K, bs, a_shape):
    N = 7
    A, B, S, zp = _nbits_case(bits, K, bs, N, a_shape)
    kw = dict(K=K, N=N, block_size=bs, bits=bits)
    bias = RNG.random(N).astype(np.float32)
    _check("MatMulNBits", [A, B, S], inits=(1, 2), atol=1e-4, **kw)
    _check("MatMulNBits", [A, B, S, _pack(zp, bits)], inits=(1, 2, 3), atol=1e-4, **kw)
    _check("MatMulNBits", [A, B, S.reshape(-1), _pack(zp, bits).reshape(-1), None, bias], inits=(1, 2, 3), atol=1e-4,
           **kw)
    if bits != 8:  # onnxruntime's CPU kernel rejects float zero points with 8 bits
        _check("MatMulNBits", [A, B, S, (S * 3).astype(np.float32)], inits=(1, 2, 3), atol=1e-4, **kw)
    _check("MatMulNBits", [A.astype(np.float16), B, S.astype(np.float16)], inits=(1, 2), atol=1e-2, rtol=1e-3, **kw)
    # accuracy_level 4: onnxruntime quantizes A to int8 per block; onnxpy reproduces it
    _check("MatMulNBits", [A, B, S, _pack(zp, bits)], inits=(1, 2, 3), atol=1e-4, rtol=1e-4, accuracy_level=4, **kw)


@pytest.mark.parametrize("zp_kind", ["none", "float"])
def test_matmul_nbits_g_idx(zp_kind):
    K, bs, N, bits = 64, 16, 5, 4
    A, B, S, _ = _nbits_case(bits, K, bs, N)
    gi = RNG.integers(0, K // bs, K).astype(np.int32)
    zp = None if zp_kind == "none" else (RNG.random((N, K // bs)) * 15).astype(np.float32)
    _check("MatMulNBits", [A, B, S, zp, gi], inits=(1, 2, 3, 4), atol=1e-4, K=K, N=N, block_size=bs, bits=bits)


def test_matmul_nbits_empty_weight_and_errors():
    A = RNG.standard_normal((2, 32)).astype(np.float32)
    bias = np.arange(4, dtype=np.float32)
    m, feeds = _model("MatMulNBits", [A, np.zeros((0, 1, 16), np.uint8), np.zeros((0,), np.float32), None, None, bias],
                      K=32, N=4, block_size=32, bits=4)
    (y,) = onnxpy.InferenceSession(m.SerializeToString()).run(None, feeds)
    np.testing.assert_array_equal(y, np.broadcast_to(bias, (2, 4)))
    m, feeds = _model("MatMulNBits", [A[:, :30], np.zeros((4, 1, 16), np.uint8), np.ones((4, 1), np.float32)],
                      K=32, N=4, block_size=32, bits=4)
    with pytest.raises(Exception, match="K=32"):
        onnxpy.InferenceSession(m.SerializeToString()).run(None, feeds)


# ----------------------------------------------------------------------------------------------- GatherBlockQuantized


def test_gather_block_quantized_int4():
    D = RNG.integers(-8, 8, (5, 6, 32)).astype(ml_dtypes.int4)
    S = RNG.random((5, 6, 2)).astype(np.float32)
    Z = RNG.integers(-8, 8, (5, 6, 2)).astype(ml_dtypes.int4)
    idx = np.array([[0, 4], [2, -1]], np.int64)
    for zz in (None, Z):
        _check("GatherBlockQuantized", [D, idx, S, zz], inits=(0, 2, 3), block_size=16, quantize_axis=2)
        _check("GatherBlockQuantized", [D, idx.astype(np.int32), S, zz], inits=(0, 2, 3), block_size=16,
               quantize_axis=-1, gather_axis=1)
    DU = RNG.integers(0, 16, (5, 6, 32)).astype(ml_dtypes.uint4)
    ZU = RNG.integers(0, 16, (5, 6, 2)).astype(ml_dtypes.uint4)
    _check("GatherBlockQuantized", [DU, idx, S.astype(np.float16), ZU], inits=(0, 2, 3), block_size=16,
           quantize_axis=2)
    S0 = RNG.random((1, 6, 32)).astype(np.float32)
    for g in (1, 2):
        _check("GatherBlockQuantized", [D, idx, S0], inits=(0, 2), block_size=16, quantize_axis=0, gather_axis=g)
    S1 = RNG.random((5, 1, 32)).astype(np.float32)
    for g in (0, 1):
        _check("GatherBlockQuantized", [D, idx, S1], inits=(0, 2), block_size=16, quantize_axis=1, gather_axis=g)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gather_block_quantized_uint8(bits):
    idx = np.array([[0, 4], [8, -1]], np.int64)
    q = RNG.integers(0, 2**bits, (9, 64))
    data = _pack(q, bits) if bits < 8 else q.astype(np.uint8)
    S = RNG.random((9, 2)).astype(np.float32)
    z = RNG.integers(0, 2**bits, (9, 2))
    zp = _pack(z, bits) if bits < 8 else z.astype(np.uint8)
    _check("GatherBlockQuantized", [data, idx, S], inits=(0, 2), block_size=32, bits=bits)
    _check("GatherBlockQuantized", [data, idx, S, zp], inits=(0, 2, 3), block_size=32, bits=bits)


def test_gather_block_quantized_fp8():
    f8 = RNG.standard_normal((9, 64)).astype(ml_dtypes.float8_e4m3fn)
    idx = np.array([3, 0, 8], np.int64)
    S = RNG.random((9, 2)).astype(np.float32)
    _check("GatherBlockQuantized", [f8, idx, S], inits=(0, 2), block_size=32)
    _check("GatherBlockQuantized", [f8, idx, S[:, :1]], inits=(0, 2), block_size=0)
    _check("GatherBlockQuantized", [f8, idx, S[:1]], inits=(0, 2), block_size=32)


def test_gather_block_quantized_bad_index():
    D = RNG.integers(-8, 8, (4, 16)).astype(ml_dtypes.int4)
    m, feeds = _model("GatherBlockQuantized", [D, np.array([4], np.int64), np.ones((4, 1), np.float32)],
                      inits=(0, 2), block_size=16)
    with pytest.raises(Exception, match="indices"):
        onnxpy.InferenceSession(m.SerializeToString()).run(None, feeds)


# ----------------------------------------------------------------------------- dynamic / integer matmuls and QGemm


@pytest.mark.parametrize("bt", [np.int8, np.uint8])
def test_dynamic_quantize_matmul(bt):
    A = RNG.standard_normal((2, 3, 16)).astype(np.float32)
    B = _rand_q(bt, (16, 5))
    bsc = (RNG.random(5) * 0.05).astype(np.float32)
    bzc = RNG.integers(0, 10, 5).astype(bt)
    bias = RNG.random(5).astype(np.float32)
    _check("DynamicQuantizeMatMul", [A, B, np.float32(0.02)], atol=1e-4)
    _check("DynamicQuantizeMatMul", [A, B, bsc, bzc, bias], atol=1e-4)
    _check("DynamicQuantizeMatMul", [A[0, 0], B, np.float32(0.02), np.array(3, bt)], atol=1e-4)
    _check("DynamicQuantizeMatMul", [np.zeros((2, 16), np.float32), B, np.float32(0.02), None, bias], atol=1e-4)
    _check("DynamicQuantizeMatMul", [A, B, np.float32(0.02), np.array(3, bt), bias], inits=(1, 2, 3, 4), atol=1e-4)


@pytest.mark.parametrize("at", [np.int8, np.uint8])
def test_matmul_integer_to_float(at):
    bt = np.int8
    A = _rand_q(at, (2, 3, 16))
    B = _rand_q(bt, (16, 5))
    bsc = (RNG.random(5) * 0.05).astype(np.float32)
    bzc = RNG.integers(0, 10, 5).astype(bt)
    bias = RNG.random(5).astype(np.float32)
    az = np.array(5, at)
    _check("MatMulIntegerToFloat", [A, B, np.float32(0.1), np.float32(0.02)], atol=1e-4)
    _check("MatMulIntegerToFloat", [A, B, np.float32(0.1), bsc, az, bzc, bias], atol=1e-4)
    _check("MatMulIntegerToFloat", [A, B, np.float16(0.1), bsc.astype(np.float16), az, bzc, bias.astype(np.float16)],
           atol=0.1, rtol=1e-3)


@pytest.mark.parametrize("at,bt", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
def test_qgemm(at, bt):
    A = _rand_q(at, (3, 16))
    B = _rand_q(bt, (16, 5))
    az = np.array(5, at)
    for C in (None, RNG.integers(-100, 100, (5,)).astype(np.int32), RNG.integers(-100, 100, (3, 5)).astype(np.int32)):
        for tb in (0, 1):
            Bx = np.ascontiguousarray(B.T) if tb else B
            base = [A, np.float32(0.1), az, Bx, np.float32(0.05), np.array(2, bt), C]
            _check("QGemm", base, alpha=1.5, transB=tb, atol=1e-4)
            _check("QGemm", base + [np.float32(0.5), np.array(7, at)], alpha=1.5, transB=tb, steps=0)
    bsc = (RNG.random(5) * 0.05).astype(np.float32)
    bzc = RNG.integers(0, 10, 5).astype(bt)
    _check("QGemm", [np.ascontiguousarray(A.T), np.float32(0.1), az, B, bsc, bzc], transA=1, atol=1e-4)


# --------------------------------------------------------------------------------------------- DynamicQuantizeLSTM


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("wt", [np.int8, np.uint8])
def test_dynamic_quantize_lstm(direction, wt):
    T_, Bn, In, H = 5, 3, 8, 6
    D = 2 if direction == "bidirectional" else 1
    X = RNG.standard_normal((T_, Bn, In)).astype(np.float32)
    W = _rand_q(wt, (D, In, 4 * H))
    R = _rand_q(wt, (D, H, 4 * H))
    Ws = (RNG.random(D) * 0.01).astype(np.float32)
    Rs = (RNG.random((D, 4 * H)) * 0.01).astype(np.float32)
    Wz, Rz = np.zeros(D, wt), np.zeros((D, 4 * H), wt)  # onnxruntime requires zero zero points
    Bb = RNG.standard_normal((D, 8 * H)).astype(np.float32) * 0.1
    sl = np.array([5, 3, 4], np.int32)
    h0 = RNG.standard_normal((D, Bn, H)).astype(np.float32)
    Pp = RNG.standard_normal((D, 3 * H)).astype(np.float32) * 0.1
    # onnxruntime quantizes activations too; onnxpy reproduces that, up to float rounding of the dynamic ranges
    _check("DynamicQuantizeLSTM", [X, W, R, None, None, None, None, None, Ws, Wz, Rs, Rz], 3, hidden_size=H,
           direction=direction, atol=0.03, rtol=0)
    _check("DynamicQuantizeLSTM", [X, W, R, Bb, sl, h0, h0 * 0.5, Pp, Ws, Wz, Rs, Rz], 3, hidden_size=H,
           direction=direction, inits=(1, 2, 8, 9, 10, 11), atol=0.03, rtol=0)


# ------------------------------------------------------------------------------------------------------- QAttention


@pytest.mark.parametrize("wt", [np.int8, np.uint8])
def test_qattention(wt):
    Bn, S, Hd, nh = 2, 4, 8, 2
    x = _rand_q(np.uint8, (Bn, S, Hd))
    w = _rand_q(wt, (Hd, 3 * Hd))
    b = RNG.standard_normal(3 * Hd).astype(np.float32) * 0.1
    isc, wsc, izp, wzp = np.float32(0.02), np.float32(0.01), np.array(3, np.uint8), np.array(1, wt)
    kw = dict(num_heads=nh, atol=1e-4, rtol=1e-4)
    _check("QAttention", [x, w, b, isc, wsc], 2, **kw)
    _check("QAttention", [x, w, b, isc, (RNG.random(3 * Hd) * 0.02).astype(np.float32), None, izp, wzp], 2,
           inits=(1, 4, 7), **kw)
    for mask in (np.array([3, 2], np.int32), np.array([3, 4, 1, 0], np.int32),
                 (RNG.random((Bn, S)) > 0.3).astype(np.int32), (RNG.random((Bn, S, S)) > 0.3).astype(np.int32)):
        _check("QAttention", [x, w, b, isc, wsc, mask, izp, wzp], 2, **kw)
    _check("QAttention", [x, w, b, isc, wsc, None, izp, wzp], 2, unidirectional=1, **kw)
    past = RNG.standard_normal((2, Bn, nh, 3, Hd // nh)).astype(np.float32)
    _check("QAttention", [x, w, b, isc, wsc, None, izp, wzp, past], 2, unidirectional=1, **kw)
    _check("QAttention", [x, w, b, isc, wsc, (RNG.random((Bn, S + 3)) > 0.3).astype(np.int32), izp, wzp, past], 2,
           **kw)
    _check("QAttention", [x, w, b, isc, wsc, None, izp, wzp], 2, scale=0.3, **kw)


# ---------------------------------------------------------------------------- contrib QuantizeLinear/DequantizeLinear


@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.uint16, np.int16, ml_dtypes.int4, ml_dtypes.uint4])
def test_contrib_quantize_dequantize(dt):
    x = (RNG.standard_normal((2, 3, 4)) * 4).astype(np.float32)
    s = (RNG.random(3) * 0.1 + 0.01).astype(np.float32)
    zp = np.array([0, 1, 2], dt)
    zp0 = np.array(1, dt)
    ini = (1, 2)  # int4 tensors cannot be fed to onnxruntime from numpy: keep them initializers
    if np.dtype(dt).itemsize == 1 and np.dtype(dt).name.endswith("int4"):
        # onnxruntime cannot return int4 tensors to numpy: check QuantizeLinear against the formula
        m, feeds = _model("QuantizeLinear", [x, s, zp], inits=ini, axis=1)
        (q,) = onnxpy.InferenceSession(m.SerializeToString()).run(None, feeds)
        lo, hi = (-8, 7) if np.dtype(dt).name == "int4" else (0, 15)
        ref = np.clip(np.rint(x / s.reshape(1, 3, 1)) + np.arange(3).reshape(1, 3, 1), lo, hi)
        assert q.dtype == np.dtype(dt)
        np.testing.assert_array_equal(q.astype(np.int64), ref.astype(np.int64))
    else:
        _check("QuantizeLinear", [x, np.float32(0.05), zp0], inits=(2,))
        _check("QuantizeLinear", [x, np.float32(0.05), zp0], inits=ini)
        _check("QuantizeLinear", [x, (RNG.random(4) * 0.1 + 0.01).astype(np.float32), np.array([0, 1, 2, 3], dt)],
               axis=-1, inits=ini)
        q = _check("QuantizeLinear", [x, s, zp], axis=1, inits=ini)[0]
    _check("DequantizeLinear", [q, s, zp], axis=1, inits=(0, 1, 2))
    _check("DequantizeLinear", [q, np.float32(0.05), zp0], inits=(0, 2))
    _check("DequantizeLinear", [q, np.float16(0.05), zp0], atol=1e-3, inits=(0, 2))


def test_contrib_quantize_default_uint8():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    _check("QuantizeLinear", [x, np.float32(0.02)])
    _check("DequantizeLinear", [_rand_q(np.uint8, (3, 4)), np.float32(0.02)])


# ---------------------------------------------------------------------------------------------------- QLinear ops


def _zx(dt):
    return 128 if dt == np.uint8 else 0


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_unary(dt):
    z, zx = (lambda v: np.array(v, dt)), _zx(dt)
    X = _rand_q(dt, (2, 3, 4, 5))
    _check("QLinearSigmoid", [X, np.float32(0.05), z(zx + 3), np.float32(1 / 256), z(zx - 100 if zx == 0 else 0)])
    _check("QLinearSigmoid", [X, np.float32(0.05), None, np.float32(1 / 256), None])
    _check("QLinearLeakyRelu", [X, np.float32(0.05), z(zx + 3), np.float32(0.03), z(zx)], alpha=0.2)
    _check("QLinearLeakyRelu", [X, np.float32(0.05), z(zx + 3), np.float32(0.03), z(zx)])


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(dt, op):
    z, zx = (lambda v: np.array(v, dt)), _zx(dt)
    X = _rand_q(dt, (2, 3, 4, 5))
    cs = np.float32(0.07 if op == "QLinearAdd" else 0.2)
    for B in (_rand_q(dt, (4, 5)), _rand_q(dt, (3, 1, 5)), np.array(_rand_q(dt, ()))):
        _check(op, [X, np.float32(0.05), z(zx + 3), B, np.float32(0.02), z(zx - 5), cs, z(zx + 1)], steps=1)
        _check(op, [B, np.float32(0.02), z(zx - 5), X, np.float32(0.05), z(zx + 3), cs, z(zx + 1)], steps=1)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("axis", [-1, 1, 2])
def test_qlinear_softmax(dt, opset, axis):
    z, zx = (lambda v: np.array(v, dt)), _zx(dt)
    X = _rand_q(dt, (2, 3, 4, 5))
    _check("QLinearSoftmax", [X, np.float32(0.1), z(zx + 3), np.float32(1 / 256), z(-128 if zx == 0 else 0)],
           opset=opset, axis=axis, steps=1)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_pools(dt, channels_last):
    z, zx = (lambda v: np.array(v, dt)), _zx(dt)
    X = _rand_q(dt, (2, 3, 4, 5))
    if channels_last:
        X = np.ascontiguousarray(np.moveaxis(X, 1, -1))
    qp = [np.float32(0.05), z(zx + 3), np.float32(0.02), z(zx - 5)]
    _check("QLinearGlobalAveragePool", [X] + qp, channels_last=channels_last, steps=0)
    for cip in (0, 1):
        _check("QLinearAveragePool", [X] + qp, channels_last=channels_last, kernel_shape=[2, 3], pads=[1, 1, 0, 1],
               strides=[1, 2], count_include_pad=cip, steps=1)
    _check("QLinearAveragePool", [X] + qp, channels_last=channels_last, kernel_shape=[3, 3], auto_pad="SAME_UPPER",
           steps=1)
    _check("QLinearAveragePool", [X] + qp, channels_last=channels_last, kernel_shape=[2, 2], strides=[2, 2],
           ceil_mode=1, steps=1)
    _check("QLinearAveragePool", [_rand_q(dt, (2, 3, 9))] + qp, kernel_shape=[3], pads=[1, 1], steps=1)


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_concat_where(dt):
    z, zx = (lambda v: np.array(v, dt)), _zx(dt)
    X, Y, B = _rand_q(dt, (2, 3, 4, 5)), _rand_q(dt, (2, 2, 4, 5)), _rand_q(dt, (4, 5))
    _check("QLinearConcat", [np.float32(0.05), z(zx + 1), X, np.float32(0.05), z(zx + 1), Y, np.float32(0.03),
                             z(zx - 2)], axis=1)
    _check("QLinearConcat", [np.float32(0.05), z(zx + 1), X, np.float32(0.04), z(zx + 1), X, np.float32(0.05),
                             z(zx + 1)], axis=-1)
    cond = RNG.random((4, 5)) > 0.5
    _check("QLinearWhere", [cond, X, np.float32(0.05), z(zx + 3), B, np.float32(0.02), z(zx - 5), np.float32(0.07),
                            z(zx + 1)])
    _check("QLinearWhere", [cond, X, np.float32(0.05), z(zx + 3), B, np.float32(0.05), z(zx + 3), np.float32(0.05),
                            z(zx + 3)])


@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("wt", [np.int8, np.uint8])
def test_qlinear_conv_contrib(channels_last, wt):
    x = _rand_q(np.uint8, (2, 4, 7, 6))
    w = _rand_q(wt, (6, 2, 3, 3))
    xin = np.ascontiguousarray(np.moveaxis(x, 1, -1)) if channels_last else x
    bias = RNG.integers(-500, 500, 6).astype(np.int32)
    ws = (RNG.random(6) * 0.01).astype(np.float32)
    args = [xin, np.float32(0.02), np.array(120, np.uint8), w, ws, np.zeros(6, wt) if wt == np.int8 else
            np.full(6, 128, wt), np.float32(0.3), np.array(100, np.uint8), bias]
    _check("QLinearConv", args, inits=(3, 4, 5, 8), channels_last=channels_last, group=2, pads=[1, 0, 1, 1],
           strides=[2, 1], steps=1)


def test_qlinear_reduce_mean():
    from onnxpy.ops.contrib_qlinear import qlinear_reduce_mean

    x = _rand_q(np.uint8, (2, 3, 4))
    y = qlinear_reduce_mean(x, np.float32(0.1), np.array(128, np.uint8), np.float32(0.05), np.array(120, np.uint8),
                            axes=[1, -1], keepdims=1)
    ref = np.clip(np.rint(((x.astype(np.float64) - 128) * 0.1).mean(axis=(1, 2), keepdims=True) / 0.05) + 120, 0, 255)
    assert y.dtype == np.uint8 and y.shape == (2, 1, 1)
    assert np.abs(y.astype(int) - ref.astype(int)).max() <= 1


# --------------------------------------------------------------------------------- models from onnxruntime.quantization


def _cnn_model():
    def init(name, shape, scale=0.3):
        return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c2"], ["r2"]),
        h.make_node("Add", ["r2", "p1"], ["a0"]),
        h.make_node("LeakyRelu", ["a0"], ["lr"], alpha=0.1),
        h.make_node("Concat", ["lr", "p1"], ["a"], axis=1),
        h.make_node("AveragePool", ["a"], ["ap"], kernel_shape=[2, 2], strides=[1, 1]),
        h.make_node("GlobalAveragePool", ["ap"], ["g"]),
        h.make_node("Flatten", ["g"], ["f"]),
        h.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    inits = [init("w1", (8, 3, 3, 3)), init("b1", (8,), 0.1), init("w2", (8, 8, 3, 3), 0.2), init("b2", (8,), 0.1),
             init("wf", (5, 16)), init("bf", (5,), 0.1)]
    g = h.make_graph(nodes, "cnn", [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 12, 12])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["N", 5])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m, (lambda n: RNG.standard_normal((n, 3, 12, 12)).astype(np.float32))


def _mlp_model():
    def init(name, shape, scale=0.3):
        return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["m1"]),
        h.make_node("Add", ["m1", "b1"], ["h1"]),
        h.make_node("Sigmoid", ["h1"], ["s1"]),
        h.make_node("Mul", ["h1", "s1"], ["act"]),  # SiLU
        h.make_node("MatMul", ["act", "w2"], ["m2"]),
        h.make_node("Add", ["m2", "b2"], ["h2"]),
        h.make_node("Add", ["h2", "x"], ["res"]),
        h.make_node("MatMul", ["res", "w3"], ["m3"]),
        h.make_node("Softmax", ["m3"], ["y"], axis=-1),
    ]
    inits = [init("w1", (16, 32)), init("b1", (32,), 0.1), init("w2", (32, 16)), init("b2", (16,), 0.1),
             init("w3", (16, 8))]
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", T.FLOAT, ["N", 4, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["N", 4, 8])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m, (lambda n: RNG.standard_normal((n, 4, 16)).astype(np.float32))


def _reader(make, n_batches=4):
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.data = iter([{"x": make(2)} for _ in range(n_batches)])

        def get_next(self):
            return next(self.data, None)

    return Reader()


def _compare_models(path, x, atol):
    feeds = {"x": x}
    with open(path, "rb") as f:
        b = f.read()
    got = onnxpy.InferenceSession(b).run(None, feeds)[0]
    exp = _ort(b, feeds)[0]
    assert got.shape == exp.shape and got.dtype == exp.dtype
    np.testing.assert_allclose(got, exp, atol=atol, rtol=0)
    # onnxruntime's optimized graph (fused contrib ops) agrees to the same tolerance
    np.testing.assert_allclose(got, _ort(b, feeds, optimize=True)[0], atol=atol, rtol=0)
    return b


def _output_scale(model_bytes):
    """Scale of the last DequantizeLinear feeding the graph output, if any."""
    import onnx

    m = onnx.load_from_string(model_bytes)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    out = m.graph.output[0].name
    for n in m.graph.node:
        if out in n.output and n.op_type == "DequantizeLinear" and n.input[1] in inits:
            return float(np.max(inits[n.input[1]]))
    return None


@pytest.mark.parametrize("which", ["cnn", "mlp"])
def test_quantize_dynamic_models(tmp_path, which):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    m, make = _cnn_model() if which == "cnn" else _mlp_model()
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    src.write_bytes(m.SerializeToString())
    for wt in (QuantType.QInt8, QuantType.QUInt8):
        quantize_dynamic(str(src), str(dst), weight_type=wt)
        _compare_models(dst, make(3), atol=1e-4)


@pytest.mark.parametrize("which", ["cnn", "mlp"])
@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_quantize_static_models(tmp_path, which, fmt):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    m, make = _cnn_model() if which == "cnn" else _mlp_model()
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    src.write_bytes(m.SerializeToString())
    for act in (QuantType.QUInt8, QuantType.QInt8):
        quantize_static(str(src), str(dst), _reader(make), quant_format=getattr(QuantFormat, fmt),
                        activation_type=act, weight_type=QuantType.QInt8, per_channel=(which == "cnn"))
        with open(dst, "rb") as f:
            scale = _output_scale(f.read()) or 1 / 255
        # within one quantization step of the output scale (float outputs get a little slack on top)
        _compare_models(dst, make(3), atol=scale * 1.01 + 1e-5)


def test_matmul_nbits_quantizer_model(tmp_path):
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    w = numpy_helper.from_array((RNG.standard_normal((64, 32)) * 0.2).astype(np.float32), "w")
    w2 = numpy_helper.from_array((RNG.standard_normal((32, 64)) * 0.2).astype(np.float32), "w2")
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["r"]),
             h.make_node("MatMul", ["r", "w2"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["N", 64])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["N", 64])], [w, w2])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    for sym in (True, False):
        q = MatMulNBitsQuantizer(m, bits=4, block_size=32, is_symmetric=sym)
        q.process()
        path = tmp_path / "q4.onnx"
        q.model.save_model_to_file(str(path), False)
        qm = onnx.load(str(path))
        assert any(n.op_type == "MatMulNBits" for n in qm.graph.node)
        x = RNG.standard_normal((3, 64)).astype(np.float32)
        _compare_models(path, x, atol=1e-4)


def test_matmul_nbits_g_idx_uint8_zero_points_formula():
    # onnxruntime 1.32 ignores uint8 zero points when g_idx is given; onnxpy follows the documented formula
    K, bs, N, bits = 64, 16, 5, 4
    A, B, S, zp = _nbits_case(bits, K, bs, N)
    gi = RNG.integers(0, K // bs, K).astype(np.int32)
    m, feeds = _model("MatMulNBits", [A, B, S, _pack(zp, bits), gi], inits=(1, 2, 3, 4), K=K, N=N, block_size=bs,
                      bits=bits)
    (y,) = onnxpy.InferenceSession(m.SerializeToString()).run(None, feeds)
    q = np.stack([(B.reshape(N, -1) & 15), (B.reshape(N, -1) >> 4)], -1).reshape(N, K).astype(np.float64)
    w = (q - zp[:, gi]) * S[:, gi]
    np.testing.assert_allclose(y, A @ w.T, atol=1e-4, rtol=1e-5)


def test_qlinear_bad_inputs():
    a = _rand_q(np.uint8, (2, 3))
    m, feeds = _model("QLinearAdd", [a, np.float32(0.1), np.array(1, np.uint8), a.astype(np.int8), np.float32(0.1),
                                     np.array(1, np.int8), np.float32(0.1), np.array(1, np.uint8)])
    with pytest.raises(Exception, match="same type"):
        onnxpy.InferenceSession(m.SerializeToString()).run(None, feeds)
    m, feeds = _model("QLinearConcat", [np.float32(0.1), np.array(1, np.uint8), a, np.float32(0.1)], axis=0)
    with pytest.raises(Exception, match="triples"):
        onnxpy.InferenceSession(m.SerializeToString()).run(None, feeds)
