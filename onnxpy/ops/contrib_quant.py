"""Quantized com.microsoft contrib ops (onnxruntime semantics): weight-only and dynamic quantization.

MatMulNBits, GatherBlockQuantized, DynamicQuantizeMatMul, MatMulIntegerToFloat, QGemm and the contrib
QuantizeLinear / DequantizeLinear (8/16-bit and 4-bit, per-tensor or per-axis).  QAttention and
DynamicQuantizeLSTM live in ``contrib_quant_seq``.

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
    scales = _arr(scales, op, "scales")
    key = _nbits_key(B, scales, zero_points, g_idx, K, N, bits, bs, cdt)
    w = _nbits_cached(key, B, scales, zero_points, g_idx)
    if w is None:
        w = _nbits_weight(op, B, scales, zero_points, g_idx, K, N, bits, bs, nb, blob, cdt)
        if key is not None:
            _nbits_store(key, B, scales, zero_points, g_idx, w)
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


# Dequantized MatMulNBits weights of constant (read-only, model-owned) inputs, so that the unpacking runs once per
# session instead of on every run.  Entries go with the packed weight; the cache is bounded in bytes.
_NBITS_CACHE: dict = {}
_NBITS_CACHE_MAX_BYTES = 1 << 30
_nbits_bytes = [0]


def _is_const(x) -> bool:
    if not isinstance(x, np.ndarray) or x.flags.writeable:
        return False
    root = x
    while isinstance(root.base, np.ndarray):
        root = root.base
    return isinstance(root.base, bytes)


def _nbits_key(B, scales, zero_points, g_idx, K, N, bits, bs, cdt):
    if not (_is_const(B) and _is_const(scales)):
        return None
    for x in (zero_points, g_idx):
        if x is not None and not _is_const(x):
            return None
    return (id(B), id(scales), None if zero_points is None else id(zero_points), None if g_idx is None else id(g_idx),
            K, N, bits, bs, cdt.str)


def _nbits_cached(key, B, scales, zero_points, g_idx):
    if key is None:
        return None
    hit = _NBITS_CACHE.get(key)
    if hit is None:
        return None
    refs, w = hit
    if all(r() is x for r, x in zip(refs, (B, scales, zero_points, g_idx)) if r is not None):
        return w
    return None


def _nbits_store(key, B, scales, zero_points, g_idx, w) -> None:
    import weakref

    if _nbits_bytes[0] + w.nbytes > _NBITS_CACHE_MAX_BYTES:
        return
    old = _NBITS_CACHE.pop(key, None)
    if old is not None:
        _nbits_bytes[0] -= old[1].nbytes

    def drop(_r, k=key):
        e = _NBITS_CACHE.pop(k, None)
        if e is not None:
            _nbits_bytes[0] -= e[1].nbytes

    refs = tuple(None if x is None else weakref.ref(x, drop) for x in (B, scales, zero_points, g_idx))
    w.flags.writeable = False
    _NBITS_CACHE[key] = (refs, w)
    _nbits_bytes[0] += w.nbytes


def _nbits_weight(op, B, scales, zero_points, g_idx, K, N, bits, bs, nb, blob, cdt):
    """The dequantized [N, K] weight of MatMulNBits in the compute type ``cdt``."""
    q = unpack_bits(B.reshape(N, nb * blob), bits, nb * bs)  # [N, nb*bs] codes
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
    return np.ascontiguousarray(w, dtype=cdt)


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
