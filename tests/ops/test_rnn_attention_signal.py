"""Recurrent (RNN/GRU/LSTM), attention (Attention, RotaryEmbedding, FlexAttention, LinearAttention,
CausalConvWithState) and signal (DFT, STFT, windows, MelWeightMatrix) kernels.

Compared against onnxruntime on single-node models where it implements the case, else against independent
numpy formulas written here.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from _oracle import run_onnxpy, run_ort, single_node

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(7)


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _model(op, inputs, outputs, attrs, opset, domain=""):
    """One-node model; ``inputs`` is a list of arrays or None (absent optional input); ``outputs`` names,
    "" for an absent optional output."""
    imports = [(domain, opset)]
    if domain:
        imports.append(("", 21))
    m, feeds = single_node(op, inputs, outputs, opsets=imports, domain=domain, ir_version=10, **attrs)
    return m.SerializeToString(), feeds


def _run(op, inputs, outputs, attrs, opset, domain=""):
    return run_onnxpy(*_model(op, inputs, outputs, attrs, opset, domain))


def _ort(op, inputs, outputs, attrs, opset, domain=""):
    return run_ort(*_model(op, inputs, outputs, attrs, opset, domain))


def _check(op, inputs, outputs, attrs, opset, rtol=1e-4, atol=1e-5, domain=""):
    got = _run(op, inputs, outputs, attrs, opset, domain)
    exp = _ort(op, inputs, outputs, attrs, opset, domain)
    assert len(got) == len(exp)
    for g, e in zip(got, exp):
        g = np.asarray(g)
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, g.dtype, e.shape, e.dtype)
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
    return got


# ----------------------------------------------------------------------------------------------------------------
# RNN / GRU / LSTM


def _rnn_inputs(op, T=5, B=3, I=4, H=6, direction="forward", seq=None, init=True, peep=False, dt=np.float32):
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    D = 2 if direction == "bidirectional" else 1
    X = RNG.standard_normal((T, B, I)).astype(dt)
    W = (RNG.standard_normal((D, gates * H, I)) * 0.5).astype(dt)
    R = (RNG.standard_normal((D, gates * H, H)) * 0.5).astype(dt)
    Bi = RNG.standard_normal((D, 2 * gates * H)).astype(dt)
    sl = None if seq is None else np.array(seq, np.int32)
    h0 = RNG.standard_normal((D, B, H)).astype(dt) if init else None
    ins = [X, W, R, Bi, sl, h0]
    outs = ["Y", "Y_h"]
    if op == "LSTM":
        ins.append(RNG.standard_normal((D, B, H)).astype(dt) if init else None)
        ins.append(RNG.standard_normal((D, 3 * H)).astype(dt) if peep else None)
        outs.append("Y_c")
    return ins, outs, H


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("seq", [None, [5, 2, 3]])
def test_recurrent_vs_ort(op, direction, seq):
    ins, outs, H = _rnn_inputs(op, direction=direction, seq=seq, peep=(op == "LSTM"))
    _check(op, ins, outs, dict(hidden_size=H, direction=direction), 14)


@pytest.mark.parametrize("attrs", [dict(clip=0.5), dict(linear_before_reset=1),
                                   dict(activations=["HardSigmoid", "LeakyRelu"], activation_alpha=[0.3, 0.2],
                                        activation_beta=[0.4])])
def test_gru_options(attrs):
    direction = "forward" if "activations" in attrs else "bidirectional"
    ins, outs, H = _rnn_inputs("GRU", direction=direction, seq=[1, 4, 5])
    _check("GRU", ins, outs, dict(hidden_size=H, direction=direction, **attrs), 14)


@pytest.mark.parametrize("attrs", [dict(input_forget=1), dict(clip=0.3),
                                   dict(activations=["LeakyRelu", "Elu", "Softsign"], activation_alpha=[0.3, 0.7])])
def test_lstm_options(attrs):
    ins, outs, H = _rnn_inputs("LSTM", peep=True)
    _check("LSTM", ins, outs, dict(hidden_size=H, **attrs), 14)


@pytest.mark.parametrize("act", ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh",
                                 "HardSigmoid", "Elu", "Softsign", "Softplus"])
def test_rnn_activations_explicit_params(act):
    ins, outs, H = _rnn_inputs("RNN")
    _check("RNN", ins, outs, dict(hidden_size=H, activations=[act], activation_alpha=[0.7],
                                  activation_beta=[0.3]), 14)


def test_recurrent_layout1_matches_layout0():
    for op in ("RNN", "GRU", "LSTM"):
        ins, outs, H = _rnn_inputs(op, direction="bidirectional", seq=[5, 1, 3])
        ref = _run(op, ins, outs, dict(hidden_size=H, direction="bidirectional"), 14)
        ins1 = list(ins)
        ins1[0] = ins[0].transpose(1, 0, 2).copy()
        ins1[5] = ins[5].transpose(1, 0, 2).copy()
        if op == "LSTM":
            ins1[6] = ins[6].transpose(1, 0, 2).copy()
        got = _run(op, ins1, outs, dict(hidden_size=H, direction="bidirectional", layout=1), 14)
        np.testing.assert_allclose(got[0], ref[0].transpose(2, 0, 1, 3), rtol=1e-6)
        for g, r in zip(got[1:], ref[1:]):
            np.testing.assert_allclose(g, r.transpose(1, 0, 2), rtol=1e-6)


def test_recurrent_numpy_reference_and_dtypes():
    # LSTM without optional inputs against a direct numpy loop; float64 and float16 keep their dtype
    T, B, I, H = 4, 2, 3, 5
    for dt in (np.float64, np.float16):
        X = RNG.standard_normal((T, B, I)).astype(dt)
        W = (RNG.standard_normal((1, 4 * H, I)) * 0.5).astype(dt)
        R = (RNG.standard_normal((1, 4 * H, H)) * 0.5).astype(dt)
        y, yh, yc = _run("LSTM", [X, W, R], ["Y", "Y_h", "Y_c"], dict(hidden_size=H), 22)
        assert y.dtype == dt and yh.dtype == dt and yc.dtype == dt
        h = np.zeros((B, H))
        c = np.zeros((B, H))
        sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
        Xf, Wf, Rf = (a.astype(np.float64) for a in (X, W, R))
        for t in range(T):
            gt = Xf[t] @ Wf[0].T + h @ Rf[0].T
            i, o, f, cc = sig(gt[:, :H]), sig(gt[:, H:2 * H]), sig(gt[:, 2 * H:3 * H]), np.tanh(gt[:, 3 * H:])
            c = f * c + i * cc
            h = o * np.tanh(c)
            tol = 1e-9 if dt == np.float64 else 3e-3
            np.testing.assert_allclose(y[t, 0].astype(np.float64), h, rtol=tol, atol=tol)
        np.testing.assert_allclose(yc[0].astype(np.float64), c, rtol=tol, atol=tol)


def test_recurrent_only_last_state_output_and_opset1():
    ins, _, H = _rnn_inputs("GRU")
    full = _run("GRU", ins, ["Y", "Y_h"], dict(hidden_size=H), 7)
    only_h = _run("GRU", ins, ["", "Y_h"], dict(hidden_size=H), 7)
    np.testing.assert_allclose(only_h[0], full[1])
    old = _run("GRU", ins, ["Y", "Y_h"], dict(hidden_size=H, output_sequence=1), 1)
    np.testing.assert_allclose(old[1], full[1], rtol=1e-6)


def test_recurrent_bad_inputs():
    ins, outs, H = _rnn_inputs("LSTM")
    with pytest.raises(Exception, match="hidden_size|W has shape"):
        _run("LSTM", ins, outs, dict(hidden_size=H + 1), 14)
    with pytest.raises(Exception, match="activation"):
        _run("LSTM", ins, outs, dict(hidden_size=H, activations=["Nope", "Tanh", "Tanh"]), 14)
    bad = list(ins)
    bad[4] = np.array([9, 1, 1], np.int32)
    with pytest.raises(Exception, match="sequence_lens"):
        _run("LSTM", bad, outs, dict(hidden_size=H), 14)


def test_lstm_long_sequence_silero_like():
    # stateful small LSTM over many steps (the silero-vad pattern): one time loop, matches ORT
    T, B, I, H = 200, 1, 16, 16
    X = RNG.standard_normal((T, B, I)).astype(np.float32)
    W = (RNG.standard_normal((1, 4 * H, I)) * 0.3).astype(np.float32)
    R = (RNG.standard_normal((1, 4 * H, H)) * 0.3).astype(np.float32)
    Bi = (RNG.standard_normal((1, 8 * H)) * 0.1).astype(np.float32)
    h0 = np.zeros((1, B, H), np.float32)
    _check("LSTM", [X, W, R, Bi, None, h0, h0], ["Y", "Y_h", "Y_c"], dict(hidden_size=H), 14, atol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# Attention


def _attn_inputs(B=2, Hq=4, Hkv=4, Sq=5, Skv=7, D=8, Dv=8, three=False, mask=None, past=0, dt=np.float32):
    if three:
        Q = RNG.standard_normal((B, Sq, Hq * D)).astype(dt)
        K = RNG.standard_normal((B, Skv, Hkv * D)).astype(dt)
        V = RNG.standard_normal((B, Skv, Hkv * Dv)).astype(dt)
    else:
        Q = RNG.standard_normal((B, Hq, Sq, D)).astype(dt)
        K = RNG.standard_normal((B, Hkv, Skv, D)).astype(dt)
        V = RNG.standard_normal((B, Hkv, Skv, Dv)).astype(dt)
    T = Skv + past
    m = {None: None,
         "bool2": (RNG.random((Sq, T)) > 0.3) if mask == "bool2" else None,
         "float2": RNG.standard_normal((Sq, T)).astype(dt),
         "float3": RNG.standard_normal((Hq, Sq, T)).astype(dt),
         "bool4": RNG.random((B, Hq, Sq, T)) > 0.3,
         "float4": RNG.standard_normal((B, 1, Sq, T)).astype(dt)}[mask]
    pk = pv = None
    if past:
        pk = RNG.standard_normal((B, Hkv, past, D)).astype(dt)
        pv = RNG.standard_normal((B, Hkv, past, Dv)).astype(dt)
    return [Q, K, V, m, pk, pv]


@pytest.mark.parametrize("three", [False, True])
@pytest.mark.parametrize("hkv", [4, 2, 1])
@pytest.mark.parametrize("mask", [None, "bool2", "float3", "float4", "bool4"])
def test_attention_vs_ort(three, hkv, mask):
    ins = _attn_inputs(Hkv=hkv, three=three, mask=mask)
    attrs = dict(q_num_heads=4, kv_num_heads=hkv) if three else {}
    _check("Attention", ins, ["Y"], attrs, 23)
    _check("Attention", ins, ["Y"], dict(attrs, is_causal=1), 23)


@pytest.mark.parametrize("mode", [0, 1, 3])
@pytest.mark.parametrize("hkv", [4, 2])
def test_attention_past_present_qk_modes_vs_ort(mode, hkv):
    ins = _attn_inputs(Hkv=hkv, mask="float2", past=3, Dv=6)
    _check("Attention", ins, ["Y", "pk", "pv", "qk"], dict(qk_matmul_output_mode=mode, softcap=2.0, is_causal=1), 23)


def test_attention_mode2_masked_positions_are_neg_inf():
    # ORT writes the lowest float for masked cells in mode 2; the spec (and onnx's reference) uses -inf
    ins = _attn_inputs(mask="bool2")
    got = _run("Attention", ins, ["Y", "", "", "qk"], dict(qk_matmul_output_mode=2), 23)
    exp = _ort("Attention", ins, ["Y", "", "", "qk"], dict(qk_matmul_output_mode=2), 23)
    np.testing.assert_allclose(got[0], exp[0], rtol=1e-4, atol=1e-5)
    masked = ~np.broadcast_to(ins[3], got[1].shape)
    assert np.all(np.isneginf(got[1][masked]))
    np.testing.assert_allclose(got[1][~masked], exp[1][~masked], rtol=1e-4, atol=1e-5)


def test_attention_scale_head_sizes_fp16_and_decode():
    _check("Attention", _attn_inputs(), ["Y"], dict(scale=0.3), 23)
    _check("Attention", _attn_inputs(Dv=5, three=True, Hkv=2), ["Y"], dict(q_num_heads=4, kv_num_heads=2), 23)
    _check("Attention", _attn_inputs(dt=np.float16, mask="float2"), ["Y"], {}, 23, rtol=3e-3, atol=3e-3)
    _check("Attention", _attn_inputs(Sq=1, Skv=1, past=9), ["Y", "pk", "pv"], dict(is_causal=1), 23)


def test_attention_nonpad_vs_ort():
    ins = _attn_inputs()[:3] + [None, None, None, np.array([3, 7], np.int64)]
    _check("Attention", ins, ["Y"], {}, 24)
    _check("Attention", ins, ["Y"], dict(is_causal=1), 24)


def _np_attention(q, k, v, bias):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + bias
    m = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    tot = e.sum(-1, keepdims=True)
    p = e / np.where(tot == 0, 1, tot)
    return p @ v


def test_attention_fully_masked_row_zero_and_windows():
    Q, K, V = (RNG.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))
    m = np.ones((4, 4), bool)
    m[1] = False
    y, qk = _run("Attention", [Q, K, V, m], ["Y", "", "", "qk"], dict(qk_matmul_output_mode=3), 23)
    assert np.all(y[:, :, 1] == 0) and np.all(qk[:, :, 1] == 0) and np.all(np.isfinite(y))
    # opset 25 sliding window vs a numpy formula: key j visible iff i - 1 <= j <= i + 2
    i, j = np.arange(4)[:, None], np.arange(4)[None, :]
    bias = np.where((j >= i - 1) & (j <= i + 2), 0.0, -np.inf)
    (y,) = _run("Attention", [Q, K, V], ["Y"], dict(left_window_size=1, right_window_size=2), 25)
    np.testing.assert_allclose(y, _np_attention(Q.astype(np.float64), K, V, bias), rtol=1e-5, atol=1e-6)


def test_attention_short_mask_is_padded_and_bf16():
    Q, K, V = (RNG.standard_normal((2, 2, 3, 4)).astype(np.float32) for _ in range(3))
    K = np.concatenate([K, RNG.standard_normal((2, 2, 2, 4)).astype(np.float32)], axis=2)
    V = np.concatenate([V, RNG.standard_normal((2, 2, 2, 4)).astype(np.float32)], axis=2)
    m = RNG.standard_normal((3, 3)).astype(np.float32)
    (y,) = _run("Attention", [Q, K, V, m], ["Y"], {}, 24)
    bias = np.concatenate([m, np.full((3, 2), -np.inf)], axis=1)
    np.testing.assert_allclose(y, _np_attention(Q.astype(np.float64), K, V, bias), rtol=1e-5, atol=1e-6)
    bf = ml_dtypes.bfloat16
    (yb,) = _run("Attention", [Q.astype(bf), K.astype(bf), V.astype(bf)], ["Y"], {}, 23)
    assert yb.dtype == bf and yb.shape == (2, 2, 3, 4)


def test_attention_bad_inputs():
    Q = np.zeros((1, 3, 2, 4), np.float32)
    K = np.zeros((1, 2, 2, 4), np.float32)
    with pytest.raises(Exception, match="multiple"):
        _run("Attention", [Q, K, K], ["Y"], {}, 23)
    with pytest.raises(Exception, match="num_heads"):
        _run("Attention", [np.zeros((1, 2, 12), np.float32)] * 3, ["Y"], {}, 23)


# ----------------------------------------------------------------------------------------------------------------
# RotaryEmbedding, LinearAttention, CausalConvWithState, FlexAttention


@pytest.mark.parametrize("three", [False, True])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rd", [0, 4])
@pytest.mark.parametrize("pid", [True, False])
def test_rotary_vs_ort(three, interleaved, rd, pid):
    B, H, S, D = 2, 3, 5, 8
    X = RNG.standard_normal((B, S, H * D) if three else (B, H, S, D)).astype(np.float32)
    half = (rd or D) // 2
    if pid:
        cos, sin = (RNG.standard_normal((20, half)).astype(np.float32) for _ in range(2))
        p = RNG.integers(0, 20, (B, S)).astype(np.int64)
    else:
        cos, sin = (RNG.standard_normal((B, S, half)).astype(np.float32) for _ in range(2))
        p = None
    attrs = dict(interleaved=interleaved, rotary_embedding_dim=rd)
    if three:
        attrs["num_heads"] = H
    _check("RotaryEmbedding", [X, cos, sin, p], ["Y"], attrs, 23)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("heads", [(4, 2), (2, 2)])
def test_linear_attention_vs_ort(rule, heads):
    Hq, Hkv = heads
    B, T, dk, dv = 2, 5, 3, 4
    q = RNG.standard_normal((B, T, Hq * dk)).astype(np.float32)
    k = RNG.standard_normal((B, T, Hkv * dk)).astype(np.float32)
    v = RNG.standard_normal((B, T, Hkv * dv)).astype(np.float32)
    past = RNG.standard_normal((B, Hkv, dk, dv)).astype(np.float32) * 0.1
    decay = -np.abs(RNG.standard_normal((B, T, Hkv * dk if rule == "gated" else Hkv))).astype(np.float32)
    beta = RNG.random((B, T, Hkv)).astype(np.float32)
    ins = [q, k, v, past, decay if "gated" in rule else None, beta if "delta" in rule else None]
    _check("LinearAttention", ins, ["y", "s"], dict(q_num_heads=Hq, kv_num_heads=Hkv, update_rule=rule), 27)


def test_linear_attention_prefill_equals_stepwise_decode():
    B, T, H, dk, dv = 1, 6, 2, 3, 3
    q = RNG.standard_normal((B, T, H * dk)).astype(np.float32)
    k = RNG.standard_normal((B, T, H * dk)).astype(np.float32)
    v = RNG.standard_normal((B, T, H * dv)).astype(np.float32)
    decay = -np.abs(RNG.standard_normal((B, T, H))).astype(np.float32)
    beta = RNG.random((B, T, 1)).astype(np.float32)
    attrs = dict(q_num_heads=H, kv_num_heads=H)
    y_all, s_all = _run("LinearAttention", [q, k, v, None, decay, beta], ["y", "s"], attrs, 27)
    s = np.zeros((B, H, dk, dv), np.float32)
    for t in range(T):
        sl = slice(t, t + 1)
        y, s = _run("LinearAttention", [q[:, sl], k[:, sl], v[:, sl], s, decay[:, sl], beta[:, sl]], ["y", "s"],
                    attrs, 27)
        np.testing.assert_allclose(y[:, 0], y_all[:, t], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, s_all, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("act", ["none", "silu"])
def test_causal_conv_with_state_vs_ort(k, act):
    x = RNG.standard_normal((2, 4, 3)).astype(np.float32)
    w = RNG.standard_normal((4, 1, k)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    past = RNG.standard_normal((2, 4, k - 1)).astype(np.float32)
    _check("CausalConvWithState", [x, w, b, past], ["y", "s"], dict(activation=act), 27)
    _check("CausalConvWithState", [x, w], ["y", "s"], dict(activation=act), 27)


def test_flex_attention_score_mod_graph():
    B, Hq, Hkv, L, S, D = 1, 4, 2, 3, 5, 8
    Q = RNG.standard_normal((B, Hq, L, D)).astype(np.float32)
    K = RNG.standard_normal((B, Hkv, S, D)).astype(np.float32)
    V = RNG.standard_normal((B, Hkv, S, D)).astype(np.float32)
    bias = RNG.standard_normal((L, S)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Add", ["s", "bias"], ["o"])], "score_mod",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(bias, "bias")])
    (y,) = _run("FlexAttention", [Q, K, V], ["Y"], dict(score_mod=g), 1, domain="ai.onnx.preview")
    Kr, Vr = np.repeat(K, 2, axis=1), np.repeat(V, 2, axis=1)
    np.testing.assert_allclose(y, _np_attention(Q.astype(np.float64), Kr, Vr, bias), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# signal


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("shape,axis", [((2, 8, 1), 1), ((2, 8, 2), -2), ((3, 5, 7, 2), 0), ((3, 5, 7, 1), 2)])
@pytest.mark.parametrize("inverse,onesided", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("n", [None, 6])
def test_dft_vs_ort(opset, shape, axis, inverse, onesided, n):
    if onesided and (shape[-1] == 2) != bool(inverse):
        pytest.skip("RFFT needs real input, IRFFT complex input")
    if onesided and inverse and n is not None:
        pytest.skip("onnxruntime differs from numpy/scipy irfft when dft_length != 2 * (bins - 1)")
    x = RNG.standard_normal(shape).astype(np.float32)
    ins = [x, None if n is None else np.array(n, np.int64)]
    attrs = dict(inverse=inverse, onesided=onesided)
    if opset >= 20:
        ins.append(np.array(axis, np.int64))
    else:
        attrs["axis"] = axis
    _check("DFT", ins, ["y"], attrs, opset, rtol=1e-3, atol=1e-4)


def test_dft_irfft_length_and_double():
    spec = np.fft.rfft(RNG.standard_normal((3, 10)), axis=1)
    x = np.stack([spec.real, spec.imag], -1)
    for n in (10, 11, 6, 16):
        (y,) = _run("DFT", [x, np.array(n, np.int64), np.array(1, np.int64)], ["y"], dict(inverse=1, onesided=1), 20)
        assert y.dtype == np.float64 and y.shape == (3, n, 1)
        np.testing.assert_allclose(y[..., 0], np.fft.irfft(spec, n=n, axis=1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("step,fl,win", [(8, 16, None), (5, None, 16), (7, 20, 20)])
def test_stft_vs_ort(onesided, step, fl, win):
    x = RNG.standard_normal((2, 100, 1)).astype(np.float32)
    w = None if win is None else RNG.random(win).astype(np.float32)
    ins = [x, np.array(step, np.int64), w, None if fl is None else np.array(fl, np.int64)]
    _check("STFT", ins, ["y"], dict(onesided=onesided), 17, rtol=1e-3, atol=1e-3)


def test_stft_complex_and_default_frame_length():
    x = RNG.standard_normal((1, 32, 2))
    (y,) = _run("STFT", [x, np.array(4, np.int64), None, np.array(8, np.int64)], ["y"], dict(onesided=0), 17)
    c = x[0, :, 0] + 1j * x[0, :, 1]
    exp = np.stack([np.fft.fft(c[i * 4:i * 4 + 8]) for i in range(7)])
    np.testing.assert_allclose(y[0, ..., 0] + 1j * y[0, ..., 1], exp, rtol=1e-10, atol=1e-12)
    (y,) = _run("STFT", [x[..., :1].astype(np.float32), np.array(4, np.int64)], ["y"], {}, 17)
    assert y.shape == (1, 1, 17, 2)
    with pytest.raises(Exception, match="onesided"):
        _run("STFT", [x, np.array(4, np.int64)], ["y"], dict(onesided=1), 17)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("size", [2, 5, 10, 33])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("odt", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64])
def test_windows_vs_ort(op, size, periodic, odt):
    _check(op, [np.array(size, np.int64)], ["y"], dict(periodic=periodic, output_datatype=odt), 17,
           rtol=1e-3, atol=1e-3)


def test_windows_size_one_and_empty():
    (y,) = _run("HannWindow", [np.array(1, np.int32)], ["y"], dict(periodic=0), 17)
    np.testing.assert_array_equal(y, [1.0])
    (y,) = _run("BlackmanWindow", [np.array(0, np.int32)], ["y"], {}, 17)
    assert y.shape == (0,) and y.dtype == np.float32


@pytest.mark.parametrize("args", [(8, 16, 8192, 0.0, 4096.0), (10, 512, 16000, 20.0, 8000.0),
                                  (40, 400, 16000, 0.0, 8000.0), (64, 1024, 22050, 125.0, 7600.0)])
@pytest.mark.parametrize("odt", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_mel_weight_matrix_vs_ort(args, odt):
    ins = [np.array(args[0], np.int32), np.array(args[1], np.int32), np.array(args[2], np.int32),
           np.array(args[3], np.float32), np.array(args[4], np.float32)]
    _check("MelWeightMatrix", ins, ["y"], dict(output_datatype=odt), 17)
