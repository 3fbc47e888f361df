"""Attention family: Attention (23/24/25), RotaryEmbedding (23), FlexAttention (ai.onnx.preview),
LinearAttention (27), CausalConvWithState (27).

Half-precision inputs (float16/bfloat16) are computed in float32 and cast back; double stays double.
Attention runs as batched matmuls; grouped-query attention is handled by reshaping the query heads into
``[batch, kv_heads, group, ...]`` so the key/value heads broadcast without being copied.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import to_numpy
from ._common import rotate, text
from .registry import kernel

_FLOATS = ("float16", "float32", "float64", "bfloat16")


def _check_float(op: str, name: str, x: np.ndarray) -> None:
    if x.dtype.name not in _FLOATS:
        raise TypeError(f"{op}: {name} must be a float tensor (float16/float/double/bfloat16), got {x.dtype}")


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _wants(_output_names, i: int) -> bool:
    if _output_names is None:
        return True
    return len(_output_names) > i and _output_names[i] != ""


def _softmax_guarded(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row whose entries are all -inf gives zeros instead of NaN."""
    dt = x.dtype
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, dt.type(0))
    e = np.subtract(x, m)
    np.exp(e, out=e)
    s = np.sum(e, axis=-1, keepdims=True)
    if e.dtype != dt:  # narrow float types may be promoted by the ufuncs
        return (e / np.where(s == 0, dt.type(1), s)).astype(dt)
    e /= np.where(s == 0, dt.type(1), s)
    return e


# --------------------------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------------------------


def _to_4d(op: str, name: str, x: np.ndarray, heads, heads_attr: str) -> np.ndarray:
    if x.ndim == 4:
        return x
    if x.ndim != 3:
        raise ValueError(f"{op}: {name} must be 3-D or 4-D, got shape {x.shape}")
    if not heads:
        raise ValueError(f"{op}: {heads_attr} is required for 3-D {name}")
    b, s, hidden = x.shape
    if hidden % heads:
        raise ValueError(f"{op}: {name} hidden size {hidden} is not divisible by {heads_attr}={heads}")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _grouped_matmul(a: np.ndarray, b: np.ndarray, group: int) -> np.ndarray:
    """``a`` [B, Hq, M, K] @ ``b`` [B, Hkv, K, N] where query head h uses kv head h // group."""
    if group == 1:
        r = a @ b
    else:
        B, Hq, M, K = a.shape
        Hkv = b.shape[1]
        r = (a.reshape(B, Hkv, group, M, K) @ b[:, :, None]).reshape(B, Hq, M, b.shape[-1])
    return r.astype(a.dtype, copy=False)  # numpy promotes bfloat16 matmuls to float32


@kernel("Attention", since=(23, 24, 25))
def attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal=0,
              kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
              softmax_precision=None, left_window_size=-1, right_window_size=-1, _output_names=None):
    op = "Attention"
    Q, K, V = np.asarray(Q), np.asarray(K), np.asarray(V)
    for nm, t in (("Q", Q), ("K", K), ("V", V)):
        _check_float(op, nm, t)
    out_dt = Q.dtype
    ct = _compute_dtype(out_dt)
    q3 = Q.ndim == 3
    q = _to_4d(op, "Q", Q, q_num_heads, "q_num_heads")
    k = _to_4d(op, "K", K, kv_num_heads, "kv_num_heads")
    v = _to_4d(op, "V", V, kv_num_heads, "kv_num_heads")
    B, Hq, Sq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"{op}: batch sizes differ: Q {Q.shape}, K {K.shape}, V {V.shape}")
    Hkv = k.shape[1]
    if v.shape[1] != Hkv or k.shape[2] != v.shape[2]:
        raise ValueError(f"{op}: K {k.shape} and V {v.shape} disagree on heads or sequence length (4-D view)")
    if k.shape[3] != D:
        raise ValueError(f"{op}: Q head size {D} differs from K head size {k.shape[3]}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"{op}: q_num_heads={Hq} must be a multiple of kv_num_heads={Hkv}")
    group = Hq // Hkv

    if (past_key is None) != (past_value is None):
        raise ValueError(f"{op}: past_key and past_value must be given together")
    past_len = 0
    if past_key is not None:
        past_key, past_value = np.asarray(past_key), np.asarray(past_value)
        if past_key.ndim != 4 or past_key.shape[:2] != (B, Hkv) or past_key.shape[3] != D:
            raise ValueError(f"{op}: past_key has shape {past_key.shape}, expected ({B}, {Hkv}, past_len, {D})")
        if past_value.ndim != 4 or past_value.shape[:3] != past_key.shape[:3] or past_value.shape[3] != v.shape[3]:
            raise ValueError(f"{op}: past_value has shape {past_value.shape}, inconsistent with past_key "
                             f"{past_key.shape} and V")
        past_len = past_key.shape[2]
        k = np.concatenate([past_key.astype(k.dtype, copy=False), k], axis=2)
        v = np.concatenate([past_value.astype(v.dtype, copy=False), v], axis=2)
    present_k, present_v = k, v
    Skv = k.shape[2]

    s = (1.0 / np.sqrt(D)) if scale is None else float(scale)
    if out_dt.name == "bfloat16":
        # bfloat16 keeps too few bits for a float32 computation rounded once at the end to agree with the
        # spec's function body (every step rounded to bfloat16), so follow the body step by step in bfloat16.
        ct = out_dt
        rs = ct.type(np.sqrt(s))
        qc = q * rs
        kc = k.astype(ct, copy=False) * rs
    else:
        qc = q.astype(ct) * ct.type(s)
        kc = k.astype(ct, copy=False)
    vc = v.astype(ct, copy=False)
    scores = _grouped_matmul(qc, kc.transpose(0, 1, 3, 2), group)  # [B, Hq, Sq, Skv]

    want_qk = _wants(_output_names, 3)
    qk_out = scores if (want_qk and qk_matmul_output_mode == 0) else None
    if softcap:
        c = ct.type(softcap)
        scores = c * np.tanh(scores / c)
    if want_qk and qk_matmul_output_mode == 1:
        qk_out = scores

    # ---- additive bias: attn_mask + structural constraints (causal, window, padding) ----
    bias = None
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.ndim == 0 or m.ndim > 4:
            raise ValueError(f"{op}: attn_mask must have rank 1..4, got shape {m.shape}")
        if m.shape[-1] > Skv:
            raise ValueError(f"{op}: attn_mask last dimension {m.shape[-1]} exceeds total sequence length {Skv}")
        if m.dtype == np.bool_:
            bias = np.where(m, ct.type(0), ct.type(-np.inf))
        else:
            bias = m.astype(ct)
        if bias.shape[-1] < Skv:
            pad = np.full(bias.shape[:-1] + (Skv - bias.shape[-1],), -np.inf, dtype=ct)
            bias = np.concatenate([bias, pad], axis=-1)
        try:
            np.broadcast_shapes(bias.shape, (B, Hq, Sq, Skv))
        except ValueError:
            raise ValueError(f"{op}: attn_mask of shape {m.shape} does not broadcast to "
                             f"{(B, Hq, Sq, Skv)}") from None

    nonpad = None
    if nonpad_kv_seqlen is not None:
        nonpad = np.asarray(nonpad_kv_seqlen).astype(np.int64).reshape(-1)
        if nonpad.shape != (B,):
            raise ValueError(f"{op}: nonpad_kv_seqlen must have shape ({B},), got {np.shape(nonpad_kv_seqlen)}")
        if past_key is not None:
            raise ValueError(f"{op}: nonpad_kv_seqlen cannot be combined with past_key/past_value")

    left = -1 if left_window_size is None else int(left_window_size)
    right = -1 if right_window_size is None else int(right_window_size)
    allowed = None
    if is_causal or nonpad is not None or left >= 0 or right >= 0:
        i = np.arange(Sq).reshape(1, 1, Sq, 1)
        j = np.arange(Skv).reshape(1, 1, 1, Skv)
        if past_key is not None:
            offset = np.array(past_len).reshape(1, 1, 1, 1)
        elif nonpad is not None:
            offset = (nonpad - Sq).reshape(B, 1, 1, 1)
        else:
            offset = np.zeros((1, 1, 1, 1), np.int64)
        pos = i + offset
        allowed = np.ones(np.broadcast_shapes(pos.shape, j.shape), dtype=bool)
        if nonpad is not None:
            allowed &= j < nonpad.reshape(B, 1, 1, 1)
        if is_causal:
            allowed &= j <= pos
        if left >= 0:
            allowed &= j >= pos - left
        if right >= 0:
            allowed &= j <= pos + right
        struct = np.where(allowed, ct.type(0), ct.type(-np.inf))
        bias = struct if bias is None else bias + struct

    if bias is not None:
        scores = scores + bias
    if want_qk and qk_matmul_output_mode == 2:
        qk_out = np.broadcast_to(scores, (B, Hq, Sq, Skv))

    # ---- softmax (optionally at another precision) ----
    if softmax_precision is not None and int(softmax_precision) != 0:
        try:
            sp = to_numpy(int(softmax_precision))
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{op}: unsupported softmax_precision {softmax_precision}") from e
        if sp.name not in _FLOATS:
            raise ValueError(f"{op}: softmax_precision must be a float type, got {sp}")
        x = scores.astype(sp).astype(_compute_dtype(sp), copy=False)
        probs = _softmax_guarded(x).astype(sp).astype(ct)
    else:
        probs = _softmax_guarded(scores)
    if want_qk and qk_matmul_output_mode == 3:
        qk_out = probs
    if want_qk and qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ValueError(f"{op}: qk_matmul_output_mode must be 0..3, got {qk_matmul_output_mode}")

    y = _grouped_matmul(probs, vc, group)  # [B, Hq, Sq, Dv]
    if q3:
        y = y.transpose(0, 2, 1, 3).reshape(B, Sq, Hq * y.shape[-1])
    y = y.astype(out_dt)
    pk = present_k.astype(out_dt, copy=False) if _wants(_output_names, 1) else None
    pv = present_v.astype(V.dtype, copy=False) if _wants(_output_names, 2) else None
    qo = np.ascontiguousarray(qk_out).astype(out_dt, copy=False) if qk_out is not None else None
    return y, pk, pv, qo


# --------------------------------------------------------------------------------------------------------------
# RotaryEmbedding
# --------------------------------------------------------------------------------------------------------------


@kernel("RotaryEmbedding", since=23)
def rotary_embedding(X, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=None,
                     rotary_embedding_dim=0):
    op = "RotaryEmbedding"
    X = np.asarray(X)
    _check_float(op, "X", X)
    cos_cache, sin_cache = np.asarray(cos_cache), np.asarray(sin_cache)
    ct = _compute_dtype(X.dtype)
    if X.ndim == 4:
        B, H, S, D = X.shape
        x = X.astype(ct)  # [B, H, S, D]; caches broadcast as [B, 1, S, half]
        head_axis_first = True
    elif X.ndim == 3:
        B, S, hidden = X.shape
        if not num_heads:
            raise ValueError(f"{op}: num_heads is required for 3-D input")
        if hidden % num_heads:
            raise ValueError(f"{op}: hidden size {hidden} is not divisible by num_heads={num_heads}")
        D = hidden // num_heads
        x = X.astype(ct).reshape(B, S, num_heads, D)  # caches broadcast as [B, S, 1, half]
        head_axis_first = False
    else:
        raise ValueError(f"{op}: X must be 3-D or 4-D, got shape {X.shape}")
    rd = int(rotary_embedding_dim) if rotary_embedding_dim else D
    if rd > D or rd % 2:
        raise ValueError(f"{op}: rotary_embedding_dim {rd} must be even and <= head size {D}")
    half = rd // 2
    if position_ids is not None:
        pid = np.asarray(position_ids).astype(np.int64)
        if cos_cache.ndim != 2 or sin_cache.ndim != 2:
            raise ValueError(f"{op}: with position_ids the caches must be 2-D, got {cos_cache.shape}, "
                             f"{sin_cache.shape}")
        if pid.shape != (B, S):
            raise ValueError(f"{op}: position_ids has shape {pid.shape}, expected {(B, S)}")
        if pid.size and (pid.min() < 0 or pid.max() >= cos_cache.shape[0]):
            raise ValueError(f"{op}: position_ids out of range [0, {cos_cache.shape[0]})")
        cos = cos_cache[pid]
        sin = sin_cache[pid]
    else:
        cos, sin = cos_cache, sin_cache
        if cos.ndim != 3:
            raise ValueError(f"{op}: without position_ids the caches must be 3-D (B, S, rd/2), got {cos.shape}")
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise ValueError(f"{op}: cache last dimension {cos.shape[-1]} does not match rotary_embedding_dim/2={half}")
    try:
        cos = np.broadcast_to(cos, (B, S, half)).astype(ct)
        sin = np.broadcast_to(sin, (B, S, half)).astype(ct)
    except ValueError:
        raise ValueError(f"{op}: caches of shape {cos.shape} do not match (batch, seq) = {(B, S)}") from None
    if head_axis_first:
        cos, sin = cos[:, None], sin[:, None]
    else:
        cos, sin = cos[:, :, None], sin[:, :, None]
    out = rotate(x, cos, sin, bool(interleaved))
    if not head_axis_first:
        out = out.reshape(X.shape)
    return out.astype(X.dtype)


# --------------------------------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview)
# --------------------------------------------------------------------------------------------------------------


@kernel("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(Q, K, V, *, prob_mod=None, scale=None, score_mod=None, softmax_precision=None):
    op = "FlexAttention"
    Q, K, V = np.asarray(Q), np.asarray(K), np.asarray(V)
    for nm, t in (("Q", Q), ("K", K), ("V", V)):
        _check_float(op, nm, t)
        if t.ndim != 4:
            raise ValueError(f"{op}: {nm} must be 4-D, got shape {t.shape}")
    B, Hq, L, D = Q.shape
    Hkv = K.shape[1]
    if K.shape[0] != B or V.shape[0] != B or V.shape[1] != Hkv or K.shape[2] != V.shape[2] or K.shape[3] != D:
        raise ValueError(f"{op}: inconsistent shapes Q {Q.shape}, K {K.shape}, V {V.shape}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"{op}: q_num_heads={Hq} must be a multiple of kv_num_heads={Hkv}")
    group = Hq // Hkv
    if softmax_precision is not None:
        sp = to_numpy(int(softmax_precision))
        if sp.name not in _FLOATS:
            raise ValueError(f"{op}: softmax_precision must be a float type, got {sp}")
    else:
        sp = np.dtype(np.float64) if Q.dtype == np.float64 else np.dtype(np.float32)
    ct = np.dtype(np.float64) if sp == np.float64 else np.dtype(np.float32)
    s = (1.0 / np.sqrt(D)) if scale is None else float(scale)
    scores = _grouped_matmul(Q.astype(ct), K.astype(ct).transpose(0, 1, 3, 2), group) * ct.type(s)
    scores = scores.astype(sp, copy=False)
    if score_mod is not None:
        scores = np.asarray(score_mod(scores)[0])
    probs = _softmax_guarded(scores.astype(ct, copy=False)).astype(sp, copy=False)
    if prob_mod is not None:
        probs = np.asarray(prob_mod(probs)[0])
    y = _grouped_matmul(probs.astype(ct, copy=False), V.astype(ct), group)
    return y.astype(Q.dtype)


# --------------------------------------------------------------------------------------------------------------
# LinearAttention (opset 27)
# --------------------------------------------------------------------------------------------------------------


def _unpack_heads(op, name, x, heads):
    b, t, hd = x.shape
    if hd % heads:
        raise ValueError(f"{op}: {name} last dimension {hd} is not divisible by {heads} heads")
    return x.reshape(b, t, heads, hd // heads)


@kernel("LinearAttention", since=27)
def linear_attention(query, key, value, past_state=None, decay=None, beta=None, *, chunk_size=64,
                     kv_num_heads=None, q_num_heads=None, scale=0.0, update_rule="gated_delta"):
    op = "LinearAttention"
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    for nm, t in (("query", query), ("key", key), ("value", value)):
        _check_float(op, nm, t)
        if t.ndim != 3:
            raise ValueError(f"{op}: {nm} must be 3-D (B, T, H*D), got shape {t.shape}")
    if not q_num_heads or not kv_num_heads:
        raise ValueError(f"{op}: q_num_heads and kv_num_heads are required")
    Hq, Hkv = int(q_num_heads), int(kv_num_heads)
    if Hq % Hkv:
        raise ValueError(f"{op}: q_num_heads={Hq} must be a multiple of kv_num_heads={Hkv}")
    rule = text(update_rule)
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ValueError(f"{op}: update_rule must be linear, gated, delta or gated_delta, got {rule!r}")
    ct = np.dtype(np.float32)
    B, T, _ = query.shape
    if key.shape[:2] != (B, T) or value.shape[:2] != (B, T):
        raise ValueError(f"{op}: query {query.shape}, key {key.shape}, value {value.shape} disagree on (B, T)")
    q = _unpack_heads(op, "query", query.astype(ct), Hq)  # [B, T, Hq, dk]
    k = _unpack_heads(op, "key", key.astype(ct), Hkv)  # [B, T, Hkv, dk]
    v = _unpack_heads(op, "value", value.astype(ct), Hkv)  # [B, T, Hkv, dv]
    dk, dv = k.shape[-1], v.shape[-1]
    if q.shape[-1] != dk:
        raise ValueError(f"{op}: query head size {q.shape[-1]} differs from key head size {dk}")
    group = Hq // Hkv
    sc = float(scale) if scale else 1.0 / np.sqrt(q.shape[-1])

    gated = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    g = bt = None
    if gated:
        if decay is None:
            raise ValueError(f"{op}: decay is required for update_rule={rule!r}")
        decay = np.asarray(decay).astype(ct)
        if decay.shape == (B, T, Hkv * dk):
            g = np.exp(decay.reshape(B, T, Hkv, dk))[..., None]  # scales rows (key dim) of the state
        elif decay.shape == (B, T, Hkv):
            g = np.exp(decay)[..., None, None]
        else:
            raise ValueError(f"{op}: decay has shape {decay.shape}, expected {(B, T, Hkv * dk)} or {(B, T, Hkv)}")
    if delta:
        if beta is None:
            raise ValueError(f"{op}: beta is required for update_rule={rule!r}")
        beta = np.asarray(beta).astype(ct)
        if beta.shape not in ((B, T, Hkv), (B, T, 1)):
            raise ValueError(f"{op}: beta has shape {beta.shape}, expected {(B, T, Hkv)} or {(B, T, 1)}")
        bt = np.broadcast_to(beta, (B, T, Hkv))[..., None]  # [B, T, Hkv, 1]

    state_dt = query.dtype
    if past_state is not None:
        past_state = np.asarray(past_state)
        if past_state.shape != (B, Hkv, dk, dv):
            raise ValueError(f"{op}: past_state has shape {past_state.shape}, expected {(B, Hkv, dk, dv)}")
        state_dt = past_state.dtype
        S = past_state.astype(ct)
    else:
        S = np.zeros((B, Hkv, dk, dv), ct)

    out = np.empty((B, T, Hkv, group, dv), ct)
    qg = q.reshape(B, T, Hkv, group, dk)
    for t in range(T):
        kt, vt = k[:, t], v[:, t]  # [B, Hkv, dk], [B, Hkv, dv]
        if gated:
            S = g[:, t] * S
        if delta:
            pred = np.einsum("bhk,bhkv->bhv", kt, S)
            upd = bt[:, t] * (vt - pred)
        else:
            upd = vt
        S = S + kt[..., :, None] * upd[..., None, :]
        out[:, t] = np.einsum("bhgk,bhkv->bhgv", qg[:, t], S)
    out *= ct.type(sc)
    return out.reshape(B, T, Hq * dv).astype(query.dtype), S.astype(state_dt)


# --------------------------------------------------------------------------------------------------------------
# CausalConvWithState (opset 27)
# --------------------------------------------------------------------------------------------------------------


@kernel("CausalConvWithState", since=27)
def causal_conv_with_state(input, weight, bias=None, past_state=None, *, activation="none"):
    op = "CausalConvWithState"
    x, w = np.asarray(input), np.asarray(weight)
    _check_float(op, "input", x)
    if x.ndim != 3:
        raise ValueError(f"{op}: input must be 3-D (batch, channels, length), got shape {x.shape}")
    B, C, L = x.shape
    if w.ndim != 3 or w.shape[0] != C or w.shape[1] != 1 or w.shape[2] < 1:
        raise ValueError(f"{op}: weight has shape {w.shape}, expected ({C}, 1, k)")
    kk = w.shape[2]
    act = text(activation)
    if act not in ("none", "silu", "swish"):
        raise ValueError(f"{op}: activation must be 'silu', 'swish' or 'none', got {act!r}")
    ct = _compute_dtype(x.dtype)
    if past_state is not None:
        ps = np.asarray(past_state)
        if ps.shape != (B, C, kk - 1):
            raise ValueError(f"{op}: past_state has shape {ps.shape}, expected {(B, C, kk - 1)}")
        ps = ps.astype(ct)
    else:
        ps = np.zeros((B, C, kk - 1), ct)
    xp = np.concatenate([ps, x.astype(ct)], axis=2)  # [B, C, L + k - 1]
    wc = w[:, 0, :].astype(ct)  # [C, k]
    y = np.zeros((B, C, L), ct)
    for i in range(kk):
        y += wc[None, :, i, None] * xp[:, :, i:i + L]
    if bias is not None:
        b = np.asarray(bias)
        if b.shape != (C,):
            raise ValueError(f"{op}: bias has shape {b.shape}, expected ({C},)")
        y += b.astype(ct)[None, :, None]
    if act in ("silu", "swish"):
        from scipy.special import expit  # lazily: scipy.special costs ~0.2 s to import

        y = y * expit(y)
    present = xp[:, :, xp.shape[2] - (kk - 1):] if kk > 1 else xp[:, :, :0]
    return y.astype(x.dtype), np.ascontiguousarray(present).astype(x.dtype)
