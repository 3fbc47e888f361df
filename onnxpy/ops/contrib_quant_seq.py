"""Quantized sequence-model com.microsoft contrib ops (onnxruntime semantics): QAttention, DynamicQuantizeLSTM."""

from __future__ import annotations

import numpy as np

from .contrib_quant import _I8, MS, _arr, _int_matmul, _scalar_or_cols
from .quantize import dynamic_quantize_linear
from .registry import kernel


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
    from .rnn import _activations, _clipper, _Prep, _want_y, lstm_direction

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
        xw = (xq @ p.W[d].T + (p.Wb[d] + p.Rb[d])).reshape(p.T, p.B, -1)
        R_t = p.R[d].T
        fin_h[d], fin_c[d] = lstm_direction(p, d, xw, lambda h, R_t=R_t: _fake_quant_u8(h) @ R_t, acts[d], clp, P,
                                            input_forget, Y)
    return p.finish(Y, [fin_h, fin_c], want_y)
