"""Quantized com.microsoft contrib ops (onnxruntime semantics): weight-only and dynamic quantization.

MatMulNBits, GatherBlockQuantized, DynamicQuantizeMatMul, MatMulIntegerToFloat, DynamicQuantizeLSTM, QGemm,
QAttention and the contrib QuantizeLinear / DequantizeLinear (8/16-bit and 4-bit, per-tensor or per-axis).

Integer products are accumulated with float64 BLAS, which is exact for int8 operands at any realistic K
(|products| <= 2^16); results are then scaled in float32 as onnxruntime does.

Known divergence: onnxruntime 1.32's CPU MatMulNBits ignores uint8 ``zero_points`` when ``g_idx`` is given (it
uses the default 2^(bits-1)); onnxpy applies them, per the op's documented formula.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .quantize import _dequantize, _quantize, dynamic_quantize_linear
from .registry import kernel

MS = "com.microsoft"
_I8 = (np.dtype(np.int8), np.dtype(np.uint8))
_FP_DATA = {
    np.dtype(getattr(ml_dtypes, n))
    for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn")
    if hasattr(ml_dtypes, n)
}
_INT4 = (np.dtype(ml_dtypes.int4), np.dtype(ml_dtypes.uint4))


def _arr(x, op: str, name: str) -> np.ndarray:
    if x is None:
        raise ValueError(f"{op}: input '{name}' is required")
    return x if isinstance(x, np.ndarray) else np.asarray(x)


def _float_out(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Unpack ``bits``-wide unsigned codes stored low-order first along the last axis of a uint8 array.

    Returns int16 codes with last dimension ``count`` (the trailing padding codes are dropped).
    """
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    lead = packed.shape[:-1]
    if bits == 8:
        out = packed.astype(np.int16)
    elif bits == 4:
        out = np.empty(lead + (packed.shape[-1], 2), np.int16)
        out[..., 0] = packed & 0x0F
        out[..., 1] = packed >> 4
        out = out.reshape(lead + (-1,))
    elif bits in (1, 2):
        per = 8 // bits
        shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
        out = ((packed[..., None] >> shifts) & ((1 << bits) - 1)).astype(np.int16).reshape(lead + (-1,))
    elif 1 <= bits <= 8:
        flat = np.unpackbits(packed, axis=-1, bitorder="little")
        n = flat.shape[-1] // bits
        flat = flat[..., : n * bits].reshape(lead + (n, bits)).astype(np.int16)
        out = (flat << np.arange(bits, dtype=np.int16)).sum(axis=-1, dtype=np.int16)
    else:
        raise ValueError(f"bits must lie in [1, 8], got {bits}")
    if out.shape[-1] < count:
        raise ValueError(f"packed data holds {out.shape[-1]} {bits}-bit values, expected at least {count}")
    return out[..., :count]


# ---------------------------------------------------------------------------------------------------- MatMulNBits


def _int8_blockwise(a: np.ndarray, bs: int) -> np.ndarray:
    """A rounded through symmetric int8 quantization per block of ``bs`` along the last axis (scale amax/127)."""
    K = a.shape[-1]
    nq = -(-K // bs)
    ap = a if nq * bs == K else np.concatenate([a, np.zeros(a.shape[:-1] + (nq * bs - K,), a.dtype)], axis=-1)
    ab = ap.reshape(a.shape[:-1] + (nq, bs))
    sa = (np.abs(ab).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(sa == 0, np.float32(0), np.float32(1) / np.where(sa == 0, np.float32(1), sa))
    aq = np.rint(ab * inv) * sa
    return aq.reshape(ap.shape)[..., :K]


@kernel("MatMulNBits", since=1, domain=MS)
def matmul_nbits(A, B, scales, zero_points=None, g_idx=None, bias=None, *, K, N, bits=4, block_size,
                 accuracy_level=0, weight_prepacked=0):
    op = "MatMulNBits"
    A = _arr(A, op, "A")
    B = _arr(B, op, "B")
    K, N, bits, bs = int(K), int(N), int(bits), int(block_size)
    if not 2 <= bits <= 8:
        raise ValueError(f"{op}: bits must lie in [2, 8], got {bits}")
    if bs < 16 or bs & (bs - 1):
        raise ValueError(f"{op}: block_size must be a power of 2 and >= 16, got {bs}")
    if weight_prepacked:
        raise NotImplementedError(f"{op}: weight_prepacked=1 (an execution-provider specific layout) is not supported")
    if A.dtype.name not in ("float32", "float16", "bfloat16", "float64"):
        raise TypeError(f"{op}: A must be float/float16/bfloat16, got {A.dtype}")
    if A.ndim < 1 or A.shape[-1] != K:
        raise ValueError(f"{op}: A's last dimension must be K={K}, got shape {A.shape}")
    if B.dtype != np.uint8:
        raise TypeError(f"{op}: B must be uint8, got {B.dtype}")
    nb = -(-K // bs)
    blob = bs * bits // 8
    out_shape = A.shape[:-1] + (N,)
    cdt = _float_out(A.dtype)
    if B.size == 0:  # an omitted projection: zeros (plus bias)
        y = np.zeros(out_shape, cdt)
        if bias is not None:
            y = y + np.asarray(bias).astype(cdt).reshape(-1)
        return y.astype(A.dtype)
    if B.size != N * nb * blob:
        raise ValueError(f"{op}: B has shape {B.shape}, expected [{N}, {nb}, {blob}] for K={K}, N={N}, bits={bits}, "
                         f"block_size={bs}")
    q = unpack_bits(B.reshape(N, nb * blob), bits, nb * bs)  # [N, nb*bs] codes
    scales = _arr(scales, op, "scales")
    if scales.size != N * nb:
        raise ValueError(f"{op}: scales has shape {scales.shape}, expected [{N}, {nb}]")
    s = scales.reshape(N, nb).astype(np.float32)
    if zero_points is None:
        z = np.full((N, nb), float(1 << (bits - 1)), np.float32)
    else:
        zp = np.asarray(zero_points)
        if zp.dtype == np.uint8:
            row = -(-nb * bits // 8)
            if zp.size != N * row:
                raise ValueError(f"{op}: packed uint8 zero_points has shape {zp.shape}, expected [{N}, {row}]")
            z = unpack_bits(zp.reshape(N, row), bits, nb).astype(np.float32)
        elif zp.dtype.kind == "f" or zp.dtype.name == "bfloat16":
            if zp.size != N * nb:
                raise ValueError(f"{op}: zero_points has shape {zp.shape}, expected [{N}, {nb}]")
            z = zp.reshape(N, nb).astype(np.float32)
        else:
            raise TypeError(f"{op}: zero_points must be uint8 or float, got {zp.dtype}")
    if g_idx is not None and np.asarray(g_idx).size:
        gi = np.asarray(g_idx).astype(np.int64).reshape(-1)
        if gi.size != K:
            raise ValueError(f"{op}: g_idx must have K={K} entries, got {gi.size}")
        if gi.size and (gi.min() < 0 or gi.max() >= nb):
            raise ValueError(f"{op}: g_idx values must lie in [0, {nb})")
        w = (q[:, :K] - z[:, gi]) * s[:, gi]
    else:
        w = ((q.reshape(N, nb, bs) - z[:, :, None]) * s[:, :, None]).reshape(N, nb * bs)[:, :K]
    w = w.astype(cdt, copy=False)
    a = A.astype(cdt, copy=False)
    if accuracy_level == 4 and A.dtype == np.float32 and not (bits == 2 and bs == 16):
        a = _int8_blockwise(a, bs)  # onnxruntime's CompInt8 path quantizes A per block of K to int8
    y = np.matmul(a, w.T)
    if bias is not None:
        b = np.asarray(bias).astype(cdt)
        if b.size != N:
            raise ValueError(f"{op}: bias must have N={N} values, got shape {b.shape}")
        y = y + b.reshape(-1)
    return y.astype(A.dtype, copy=False)


# ------------------------------------------------------------------------------------------- GatherBlockQuantized


def _unpack_last(x: np.ndarray, bits: int) -> np.ndarray:
    if bits >= 8:
        return x.astype(np.int16)
    return unpack_bits(x, bits, x.shape[-1] * (8 // bits))


@kernel("GatherBlockQuantized", since=1, domain=MS)
def gather_block_quantized(data, indices, scales, zero_points=None, *, bits=4, block_size=128, gather_axis=0,
                           quantize_axis=1):
    op = "GatherBlockQuantized"
    data = _arr(data, op, "data")
    indices = _arr(indices, op, "indices")
    scales = _arr(scales, op, "scales")
    if indices.dtype.kind not in "iu":
        raise TypeError(f"{op}: indices must be int32/int64, got {indices.dtype}")
    if scales.dtype.name not in ("float32", "float16", "bfloat16"):
        raise TypeError(f"{op}: scales must be float/float16/bfloat16, got {scales.dtype}")
    r = data.ndim
    if r < 1:
        raise ValueError(f"{op}: data must have rank >= 1")
    if not -r <= gather_axis < r or not -r <= quantize_axis < r:
        raise ValueError(f"{op}: gather_axis {gather_axis} / quantize_axis {quantize_axis} out of range for rank {r}")
    g = gather_axis % r
    qa = quantize_axis % r
    dt = data.dtype
    zp = None if zero_points is None else np.asarray(zero_points)
    if dt == np.uint8:
        bits = int(bits)
        if bits not in (2, 4, 8):
            raise ValueError(f"{op}: bits must be 2, 4 or 8 for uint8 data, got {bits}")
        if bits < 8 and g == r - 1:
            raise ValueError(f"{op}: packed uint8 data cannot be gathered along its last (packed) axis")
        if zp is not None and zp.dtype != np.uint8:
            raise TypeError(f"{op}: zero_points must have data's type uint8, got {zp.dtype}")
        default_zp = float(1 << (bits - 1))
        logical_shape = data.shape[:-1] + (data.shape[-1] * (8 // bits),)
        zlog = None if zp is None else _unpack_last(zp, bits)
    elif dt in _INT4:
        if zp is not None and zp.dtype != dt:
            raise TypeError(f"{op}: zero_points must have data's type {dt}, got {zp.dtype}")
        default_zp = 0.0
        logical_shape = data.shape
        zlog = None if zp is None else zp.astype(np.int16)
    elif dt in _FP_DATA:
        if zp is not None:
            raise ValueError(f"{op}: zero_points must not be given for {dt} data")
        default_zp = 0.0
        logical_shape = data.shape
        zlog = None
    else:
        raise TypeError(f"{op}: unsupported data type {dt}")
    bs = int(block_size)
    qdim = logical_shape[qa]
    if bs == 0 and dt in _FP_DATA:
        bs = max(qdim, 1)
    if bs < 1:
        raise ValueError(f"{op}: block_size must be positive, got {block_size}")
    nblk = -(-qdim // bs)
    if scales.ndim != r:
        raise ValueError(f"{op}: scales must have data's rank {r}, got shape {scales.shape}")
    for i in range(r):
        want = nblk if i == qa else logical_shape[i]
        if scales.shape[i] != want and not (dt in _FP_DATA and i != qa and scales.shape[i] == 1):
            raise ValueError(f"{op}: scales shape {scales.shape} does not match data shape {logical_shape} "
                             f"(block_size {bs} on axis {qa})")
    if zlog is not None and dt == np.uint8 and zlog.shape[-1] > scales.shape[-1] > zlog.shape[-1] - 8 // bits:
        zlog = zlog[..., : scales.shape[-1]]  # packed zero points are padded to whole bytes
    if zlog is not None and zlog.shape != scales.shape:
        raise ValueError(f"{op}: scales and zero_points shape does not match: {scales.shape} vs {zlog.shape}")
    gdim = logical_shape[g]
    idx = indices.astype(np.int64)
    if idx.size and (idx.min() < -gdim or idx.max() >= gdim):
        raise IndexError(f"{op}: indices must lie in [{-gdim}, {gdim - 1}]")
    idx = np.where(idx < 0, idx + gdim, idx)
    dg = np.take(data, idx, axis=g)  # gather packed rows, then unpack (g is not the packed axis)
    dg = _unpack_last(dg, bits) if dt == np.uint8 else dg.astype(np.float32)

    def gathered_param(p):
        if g == qa:
            return np.take(p, idx // bs, axis=g)
        if p.shape[g] == 1:
            pg = np.take(p, np.zeros_like(idx), axis=g)
        else:
            pg = np.take(p, idx, axis=g)
        qa2 = qa if qa < g else qa + idx.ndim - 1
        rep = np.repeat(pg, bs, axis=qa2)
        return np.take(rep, np.arange(qdim), axis=qa2)

    sg = gathered_param(scales.astype(np.float32))
    vals = dg.astype(np.float32)
    if zlog is not None:
        vals = vals - gathered_param(zlog).astype(np.float32)
    elif default_zp:
        vals = vals - np.float32(default_zp)
    return (vals * sg).astype(scales.dtype, copy=False)


# ------------------------------------------------------------------------------- MatMulIntegerToFloat and friends


def _b_param(p, B: np.ndarray, op: str, name: str, dtype):
    """A scale or zero point of B: scalar, per-column [N], or B-shaped with a 1 in the K position."""
    p = np.asarray(p).astype(dtype)
    if p.size == 1:
        return p.reshape(())
    N = B.shape[-1]
    if p.ndim == 1:
        if p.shape[0] != N:
            raise ValueError(f"{op}: {name} has {p.shape[0]} values but B has {N} columns")
        return p
    if p.ndim == B.ndim and p.shape[-1] == N and p.shape[-2] == 1:
        return p
    raise ValueError(f"{op}: {name} of shape {p.shape} is neither a scalar nor per-column for B of shape {B.shape}")


def _int_matmul(op, A, B, a_zp, b_zp) -> np.ndarray:
    """(A - a_zp) @ (B - b_zp) exactly (float64 accumulation of int8 products)."""
    if A.ndim < 1 or B.ndim < 2 and B.ndim != 1:
        raise ValueError(f"{op}: bad ranks A {A.shape}, B {B.shape}")
    af = A.astype(np.float64)
    if a_zp is not None:
        az = np.asarray(a_zp)
        if az.dtype != A.dtype:
            raise TypeError(f"{op}: a_zero_point must have A's type {A.dtype}, got {az.dtype}")
        if az.size == 1:
            af -= float(az.reshape(-1)[0])
        elif az.ndim == 1 and A.ndim >= 2 and az.shape[0] == A.shape[-2]:
            af -= az.astype(np.float64).reshape(-1, 1)
        else:
            raise ValueError(f"{op}: a_zero_point must be a scalar (or per-row), got shape {az.shape}")
    bf = B.astype(np.float64)
    if b_zp is not None:
        bz = np.asarray(b_zp)
        if bz.dtype != B.dtype:
            raise TypeError(f"{op}: b_zero_point must have B's type {B.dtype}, got {bz.dtype}")
        bf -= _b_param(bz, B, op, "b_zero_point", np.float64)
    if af.shape[-1] != (bf.shape[-2] if bf.ndim >= 2 else bf.shape[0]):
        raise ValueError(f"{op}: inner dimensions differ: A {A.shape}, B {B.shape}")
    return np.matmul(af, bf)


def _to_float(op, acc, scale, B, bias, out_dt):
    y = acc.astype(np.float32) * scale
    if bias is not None:
        b = np.asarray(bias).astype(np.float32)
        if b.size != B.shape[-1]:
            raise ValueError(f"{op}: bias must have {B.shape[-1]} values, got shape {b.shape}")
        y = y + b.reshape(-1)
    return y.astype(out_dt, copy=False)


@kernel("MatMulIntegerToFloat", since=1, domain=MS)
def matmul_integer_to_float(A, B, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None):
    op = "MatMulIntegerToFloat"
    A, B = _arr(A, op, "A"), _arr(B, op, "B")
    a_scale, b_scale = _arr(a_scale, op, "a_scale"), _arr(b_scale, op, "b_scale")
    if A.dtype not in _I8 or B.dtype not in _I8:
        raise TypeError(f"{op}: A and B must be int8/uint8, got {A.dtype}, {B.dtype}")
    if a_scale.dtype.kind != "f":
        raise TypeError(f"{op}: a_scale must be float, got {a_scale.dtype}")
    acc = _int_matmul(op, A, B, a_zero_point, b_zero_point)
    sa = a_scale.astype(np.float32)
    if sa.size == 1:
        sa = sa.reshape(())
    elif sa.ndim == 1 and A.ndim >= 2 and sa.shape[0] == A.shape[-2]:
        sa = sa.reshape(-1, 1)
    else:
        raise ValueError(f"{op}: a_scale must be a scalar, got shape {a_scale.shape}")
    scale = sa * _b_param(b_scale, B, op, "b_scale", np.float32)
    return _to_float(op, acc, scale, B, bias, a_scale.dtype)


@kernel("DynamicQuantizeMatMul", since=1, domain=MS)
def dynamic_quantize_matmul(A, B, b_scale, b_zero_point=None, bias=None):
    op = "DynamicQuantizeMatMul"
    A, B = _arr(A, op, "A"), _arr(B, op, "B")
    if A.dtype != np.float32:
        raise TypeError(f"{op}: A must be float32, got {A.dtype}")
    if B.dtype not in _I8:
        raise TypeError(f"{op}: B must be int8/uint8, got {B.dtype}")
    aq, a_s, a_zp = dynamic_quantize_linear(A)
    acc = _int_matmul(op, aq, B, a_zp, b_zero_point)
    scale = np.float32(a_s) * _b_param(_arr(b_scale, op, "b_scale"), B, op, "b_scale", np.float32)
    return _to_float(op, acc, scale, B, bias, np.dtype(np.float32))


# ----------------------------------------------------------------------------------------------------------- QGemm


def _scalar_or_cols(p, n: int, op: str, name: str, dtype) -> np.ndarray:
    p = np.asarray(p).astype(dtype)
    if p.size == 1:
        return p.reshape(())
    if p.ndim == 1 and p.shape[0] == n:
        return p
    raise ValueError(f"{op}: {name} must be a scalar or have {n} values, got shape {p.shape}")


def _requant(y: np.ndarray, y_scale, y_zero_point, out_dt: np.dtype) -> np.ndarray:
    info = np.iinfo(out_dt)
    q = np.rint(y / np.float32(np.asarray(y_scale, np.float32).reshape(())))
    if y_zero_point is not None:
        q = q + np.float32(np.asarray(y_zero_point).reshape(()))
    return np.clip(q, info.min, info.max).astype(out_dt)


@kernel("QGemm", since=1, domain=MS)
def qgemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None, y_zero_point=None, *, alpha=1.0,
          transA=0, transB=0):
    op = "QGemm"
    A, B = _arr(A, op, "A"), _arr(B, op, "B")
    if A.dtype not in _I8 or B.dtype not in _I8:
        raise TypeError(f"{op}: A and B must be int8/uint8, got {A.dtype}, {B.dtype}")
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError(f"{op}: A and B must be 2-D, got {A.shape}, {B.shape}")
    if transA:
        A = A.T
    if transB:
        B = B.T
    M, Kd = A.shape
    if B.shape[0] != Kd:
        raise ValueError(f"{op}: inner dimensions differ: A {A.shape}, B {B.shape} (after transposes)")
    N = B.shape[1]
    az = _arr(a_zero_point, op, "a_zero_point")
    if az.size != 1:
        raise ValueError(f"{op}: a_zero_point must be a scalar")
    bz = _scalar_or_cols(_arr(b_zero_point, op, "b_zero_point"), N, op, "b_zero_point", np.float64)
    acc = np.matmul(A.astype(np.float64) - float(az.reshape(-1)[0]), B.astype(np.float64) - bz)
    sa = float(np.asarray(a_scale, np.float32).reshape(-1)[0])
    if np.asarray(a_scale).size != 1:
        raise ValueError(f"{op}: a_scale must be a scalar")
    sb = _scalar_or_cols(_arr(b_scale, op, "b_scale"), N, op, "b_scale", np.float32)
    scale = (np.float32(alpha) * np.float32(sa) * sb).astype(np.float32)
    if C is not None:
        c = np.asarray(C)
        if c.dtype != np.int32:
            raise TypeError(f"{op}: C must be int32, got {c.dtype}")
        acc = acc + np.broadcast_to(c.astype(np.float64), acc.shape)
    y = acc.astype(np.float32) * scale
    if y_scale is None:
        return y.astype(np.float32)
    out_dt = np.asarray(y_zero_point).dtype if y_zero_point is not None else A.dtype
    if out_dt not in _I8:
        raise TypeError(f"{op}: y_zero_point must be int8/uint8, got {out_dt}")
    return _requant(y, y_scale, y_zero_point, out_dt)


# ------------------------------------------------------------------------------------------------------ QAttention


def _attention_mask_bias(mask_index, B: int, S: int, L: int, past: int, unidirectional: int, filt: float):
    """Additive [B, 1, S, L] bias from a contrib-Attention mask_index (and the causal mask), or None."""
    bias = None
    if mask_index is not None:
        m = np.asarray(mask_index)
        pos = np.arange(L)
        if m.ndim == 1 and m.shape[0] in (B, 2 * B):
            keep = pos[None, :] < m[:B, None]
            if m.shape[0] == 2 * B:
                keep &= pos[None, :] >= m[B:, None]
            keep = keep[:, None, None, :]
        elif m.ndim == 2 and m.shape == (B, L):
            keep = (m != 0)[:, None, None, :]
        elif m.ndim == 3 and m.shape == (B, S, L):
            keep = (m != 0)[:, None, :, :]
        elif m.ndim == 4 and m.shape[0] == B and m.shape[2] >= S and m.shape[3] >= L:
            keep = (m[:, :, past: past + S, :L] != 0)  # Megatron-style [B, 1, max_S, max_S]
        else:
            raise ValueError(f"QAttention: unsupported mask_index shape {m.shape} for batch {B}, total length {L}")
        bias = np.where(keep, np.float32(0), np.float32(filt))
    if unidirectional:
        causal = np.arange(L)[None, :] > (np.arange(S)[:, None] + past)
        cb = np.where(causal, np.float32(filt), np.float32(0))[None, None]
        bias = cb if bias is None else bias + cb
    return bias


@kernel("QAttention", since=1, domain=MS)
def qattention(input, weight, bias, input_scale, weight_scale, mask_index=None, input_zero_point=None,
               weight_zero_point=None, past=None, *, num_heads, unidirectional=0, scale=0.0,
               mask_filter_value=-10000.0, do_rotary=0, past_present_share_buffer=0, _output_names=None):
    op = "QAttention"
    x, w = _arr(input, op, "input"), _arr(weight, op, "weight")
    if x.dtype not in _I8 or w.dtype not in _I8:
        raise TypeError(f"{op}: input and weight must be int8/uint8, got {x.dtype}, {w.dtype}")
    if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[2] or w.shape[1] % 3:
        raise ValueError(f"{op}: input must be [B, S, hidden] and weight [hidden, 3*hidden], got {x.shape}, {w.shape}")
    if do_rotary:
        raise NotImplementedError(f"{op}: do_rotary=1 is not supported")
    bias = _arr(bias, op, "bias")
    out_dt = bias.dtype
    Bn, S, _ = x.shape
    Hd3 = w.shape[1]
    Hd = Hd3 // 3
    nh = int(num_heads)
    if nh < 1 or Hd % nh:
        raise ValueError(f"{op}: hidden size {Hd} is not divisible by num_heads {nh}")
    hs = Hd // nh
    acc = _int_matmul(op, x, w, input_zero_point, weight_zero_point)
    sw = _scalar_or_cols(_arr(weight_scale, op, "weight_scale"), Hd3, op, "weight_scale", np.float32)
    qkv = acc.astype(np.float32) * (np.float32(np.asarray(input_scale, np.float32).reshape(-1)[0]) * sw)
    if bias.size != Hd3:
        raise ValueError(f"{op}: bias must have {Hd3} values, got shape {bias.shape}")
    qkv = qkv + bias.astype(np.float32).reshape(-1)
    q, k, v = (qkv[..., i * Hd: (i + 1) * Hd].reshape(Bn, S, nh, hs).transpose(0, 2, 1, 3) for i in range(3))
    P = 0
    if past is not None and np.asarray(past).size:
        pst = np.asarray(past).astype(np.float32)
        if pst.ndim != 5 or pst.shape[:3] != (2, Bn, nh) or pst.shape[4] != hs:
            raise ValueError(f"{op}: past must be [2, {Bn}, {nh}, past_len, {hs}], got {pst.shape}")
        P = pst.shape[3]
        k = np.concatenate([pst[0], k], axis=2)
        v = np.concatenate([pst[1], v], axis=2)
    L = P + S
    sc = np.float32(scale) if scale else np.float32(1.0 / np.sqrt(hs))
    scores = np.matmul(q, k.transpose(0, 1, 3, 2)) * sc
    mb = _attention_mask_bias(mask_index, Bn, S, L, P, unidirectional, float(mask_filter_value))
    if mb is not None:
        scores = scores + mb
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    probs = e / e.sum(axis=-1, keepdims=True)
    out = np.matmul(probs, v).transpose(0, 2, 1, 3).reshape(Bn, S, Hd).astype(out_dt)
    present = np.stack([k, v]).astype(out_dt)
    return out, present


# ------------------------------------------------------------------------------ QuantizeLinear / DequantizeLinear


@kernel("QuantizeLinear", since=1, domain=MS)
def ms_quantize_linear(x, y_scale, y_zero_point=None, *, axis=1):
    x = _arr(x, "QuantizeLinear", "x")
    if x.dtype not in (np.float32, np.float16):
        raise TypeError(f"QuantizeLinear (com.microsoft): x must be float/float16, got {x.dtype}")
    return _quantize(x, y_scale, y_zero_point, axis=axis, block_size=0, saturate=1, output_dtype=0, precision=0)


@kernel("DequantizeLinear", since=1, domain=MS)
def ms_dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1):
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=0, output_dtype=0)


# ------------------------------------------------------------------------------------------- DynamicQuantizeLSTM


def _deq_lstm_weight(w, scale, zp, op: str, name: str) -> np.ndarray:
    """[D, in, 4H] int8/uint8 weights with per-direction or per-(direction, column) scale -> float [D, 4H, in]."""
    w = _arr(w, op, name)
    if w.dtype not in _I8:
        raise TypeError(f"{op}: {name} must be int8/uint8, got {w.dtype}")
    if w.ndim != 3:
        raise ValueError(f"{op}: {name} must be 3-D [num_directions, input, 4*hidden], got shape {w.shape}")
    D, _, G = w.shape
    s = _arr(scale, op, f"{name}_scale").astype(np.float32)
    z = _arr(zp, op, f"{name}_zero_point")
    if z.dtype != w.dtype:
        raise TypeError(f"{op}: {name}_zero_point must have {name}'s type {w.dtype}, got {z.dtype}")
    if s.size == D:
        s3, z3 = s.reshape(D, 1, 1), z.astype(np.float32).reshape(D, 1, 1)
    elif s.size == D * G:
        s3, z3 = s.reshape(D, 1, G), z.astype(np.float32).reshape(D, 1, G)
    else:
        raise ValueError(f"{op}: {name}_scale must have shape [{D}] or [{D}, {G}], got {s.shape}")
    if z.size != s.size:
        raise ValueError(f"{op}: {name}_zero_point shape {z.shape} differs from the scale's {s.shape}")
    return np.ascontiguousarray(((w.astype(np.float32) - z3) * s3).transpose(0, 2, 1))


def _fake_quant_u8(x: np.ndarray) -> np.ndarray:
    """x rounded through onnxruntime's dynamic uint8 quantization (range widened to include 0)."""
    q, sc, zp = dynamic_quantize_linear(np.ascontiguousarray(x, dtype=np.float32))
    return (q.astype(np.float32) - np.float32(zp)) * np.float32(sc)


@kernel("DynamicQuantizeLSTM", since=1, domain=MS)
def dynamic_quantize_lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
                          W_scale=None, W_zero_point=None, R_scale=None, R_zero_point=None, *, activation_alpha=None,
                          activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
                          input_forget=0, _output_names=None):
    """LSTM whose weights are int8/uint8; like onnxruntime, the input and every hidden state are quantized to uint8
    (dynamic range) before their matmuls, so results match it up to float rounding."""
    from .rnn import _activations, _clipper, _Prep, _want_y

    op = "DynamicQuantizeLSTM"
    Wf = _deq_lstm_weight(W, W_scale, W_zero_point, op, "W")
    Rf = _deq_lstm_weight(R, R_scale, R_zero_point, op, "R")
    want_y = _want_y(None, _output_names)
    p = _Prep(op, X, Wf, Rf, B, sequence_lens, initial_h, direction, hidden_size, 0, 4,
              extra_states=[("initial_c", initial_c)])
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], p.D)
    clp = _clipper(clip)
    H = p.H
    if P is not None:
        P = np.asarray(P).astype(p.ct, copy=False)
        if P.shape != (p.D, 3 * H):
            raise ValueError(f"{op}: P has shape {P.shape}, expected {(p.D, 3 * H)}")
    Y = np.zeros((p.T, p.D, p.B, H), p.ct) if want_y else None
    fin_h = np.empty((p.D, p.B, H), p.ct)
    fin_c = np.empty((p.D, p.B, H), p.ct)
    xq = _fake_quant_u8(p.X).reshape(p.T * p.B, -1) if p.X.size else p.X.reshape(p.T * p.B, -1)
    for d in range(p.D):
        f, g, hf = acts[d]
        xw = (xq @ p.W[d].T + (p.Wb[d] + p.Rb[d])).reshape(p.T, p.B, -1)
        R_t = p.R[d].T
        h = p.states[0][d]
        c = p.states[1][d]
        for t, m in p.time_steps(d):
            gates = xw[t] + _fake_quant_u8(h) @ R_t
            if P is None:
                i = f(clp(gates[:, :H]))
                o = f(clp(gates[:, H: 2 * H]))
                fg = (1 - i) if input_forget else f(clp(gates[:, 2 * H: 3 * H]))
                cn = fg * c + i * g(clp(gates[:, 3 * H:]))
            else:
                i = f(clp(gates[:, :H] + P[d, :H] * c))
                fg = (1 - i) if input_forget else f(clp(gates[:, 2 * H: 3 * H] + P[d, 2 * H:] * c))
                cn = fg * c + i * g(clp(gates[:, 3 * H:]))
                o = f(clp(gates[:, H: 2 * H] + P[d, H: 2 * H] * cn))
            hn = o * hf(cn)
            if m is None:
                h, c = hn, cn
                if want_y:
                    Y[t, d] = hn
            else:
                h = np.where(m, hn, h)
                c = np.where(m, cn, c)
                if want_y:
                    Y[t, d] = np.where(m, hn, 0)
        fin_h[d] = h
        fin_c[d] = c
    return p.finish(Y, [fin_h, fin_c], want_y)
