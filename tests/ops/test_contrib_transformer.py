"""com.microsoft transformer / fused contrib ops (contrib_transformer.py, contrib_fused.py, contrib_norm.py).

Compared against onnxruntime's CPU kernels on single-node models; ops onnxruntime has no CPU kernel for
(BiasSoftmax, BiasAdd, GroupNorm, SkipGroupNorm, 4-D Attention masks, packed MHA inputs) are checked against
numpy formulas written here.  The end of the file runs BERT- and GPT-2-like graphs through
``onnxruntime.transformers.optimizer`` and compares the fused models.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from _oracle import run_onnxpy, run_ort, single_node

ort = pytest.importorskip("onnxruntime")
MS = "com.microsoft"


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _rng(seed=0):
    return np.random.default_rng(seed)


def _randn(r, *shape, dtype=np.float32):
    return r.standard_normal(shape).astype(dtype)


def _model(op, inputs, n_out=1, domain=MS, out_types=None, **attrs):
    """One-node model; ``inputs`` is a list of arrays or None (absent optional input); ``n_out`` outputs, or a
    list of bools saying which outputs exist."""
    present = [True] * n_out if isinstance(n_out, int) else list(n_out)
    outs = [f"out{i}" if p else "" for i, p in enumerate(present)]
    ovis = []
    for i, o in enumerate(outs):
        if not o:
            continue
        if out_types and out_types.get(i) is not None:
            ovis.append(helper.make_tensor_value_info(o, out_types[i], None))
        else:
            ovis.append(onnx.ValueInfoProto(name=o))
    m, feeds = single_node(op, inputs, outs, opsets=[("", 17), (MS, 1)], domain=domain, out_infos=ovis,
                           ir_version=9, **attrs)
    return m.SerializeToString(), feeds


def _ort_run(mb, feeds):
    return run_ort(mb, feeds, quiet=True)


_py_run = run_onnxpy


def _check(op, inputs, n_out=1, rtol=1e-4, atol=1e-5, out_types=None, only=None, **attrs):
    """Run op in onnxpy and onnxruntime and compare all outputs (or the indices in ``only``)."""
    mb, feeds = _model(op, inputs, n_out, out_types=out_types, **attrs)
    exp = _ort_run(mb, feeds)
    got = _py_run(mb, feeds)
    assert len(got) == len(exp)
    for i, (g, e) in enumerate(zip(got, exp)):
        if only is not None and i not in only:
            continue
        assert g.dtype == e.dtype, (op, i, g.dtype, e.dtype)
        assert g.shape == e.shape, (op, i, g.shape, e.shape)
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"{op} output {i}")
    return got


def _py(op, inputs, n_out=1, domain=MS, **attrs):
    mb, feeds = _model(op, inputs, n_out, domain=domain, **attrs)
    return _py_run(mb, feeds)


# ----------------------------------------------------------------------------------------------------------------
# GELU family, BiasAdd, BiasSoftmax


@pytest.mark.parametrize("shape", [(2, 3, 8), (5,), (0, 4), (3, 1, 16)])
def test_gelus_vs_ort(shape):
    r = _rng(1)
    x = _randn(r, *shape) * 3
    bias = _randn(r, shape[-1])
    _check("Gelu", [x])
    _check("FastGelu", [x])
    _check("FastGelu", [x, bias])
    _check("BiasGelu", [x, bias])
    _check("QuickGelu", [x])
    _check("QuickGelu", [x], alpha=0.5)


def test_gelu_fp16_and_bad_type():
    x = (_randn(_rng(2), 4, 8) * 2).astype(np.float16)
    y = _py("Gelu", [x])[0]
    assert y.dtype == np.float16
    xf = x.astype(np.float64)
    ref = 0.5 * xf * (1 + np.vectorize(math.erf)(xf / math.sqrt(2)))
    np.testing.assert_allclose(y.astype(np.float64), ref, atol=2e-3)
    with pytest.raises(Exception, match="float"):
        _py("Gelu", [np.arange(4, dtype=np.int32)])


def test_bias_add_numpy():
    r = _rng(3)
    x, skip, b = _randn(r, 2, 5, 8), _randn(r, 2, 5, 8), _randn(r, 8)
    np.testing.assert_allclose(_py("BiasAdd", [x, b, skip])[0], x + b + skip, rtol=1e-6)
    with pytest.raises(Exception, match="bias"):
        _py("BiasAdd", [x, _randn(r, 7), skip])


def _softmax_np(x, axis):
    lead = x.shape[:axis]
    x2 = x.reshape(int(np.prod(lead)), -1).astype(np.float64)
    e = np.exp(x2 - x2.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)).reshape(x.shape)


@pytest.mark.parametrize("inner", [0, 1])
def test_bias_softmax_numpy(inner):
    r = _rng(4)
    x = _randn(r, 2, 3, 4, 5)
    if inner:  # bias (B, S, T) broadcast across heads (dims 1..axis-1)
        bias = _randn(r, 2, 4, 5)
        full = bias[:, None]
        axis = 2
        got = _py("BiasSoftmax", [x, bias], axis=-2, is_inner_broadcast=1)[0]
        # axis=-2 means softmax over the last two dims
        np.testing.assert_allclose(got, _softmax_np(x + bias[:, None], axis), rtol=1e-5, atol=1e-6)
        got = _py("BiasSoftmax", [x, bias[..., 0, :]], axis=3, is_inner_broadcast=1)[0]
        np.testing.assert_allclose(got, _softmax_np(x + bias[:, None, 0:1, :], 3), rtol=1e-5, atol=1e-6)
    else:  # bias (N, S, T) broadcast across the batch
        bias = _randn(r, 3, 4, 5)
        full = bias[None]
        got = _py("BiasSoftmax", [x, bias], axis=3, is_inner_broadcast=0)[0]
        np.testing.assert_allclose(got, _softmax_np(x + full, 3), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# FusedMatMul / TransposeMatMul / FusedGemm / FusedConv


@pytest.mark.parametrize("sa,sb", [((2, 3, 4), (2, 4, 5)), ((3, 2, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)),
                                   ((2, 3, 4, 5), (2, 3, 5, 6)), ((4, 2, 3), (5, 2, 4)), ((3, 4), (4, 2)),
                                   ((1, 3, 4), (2, 4, 5)), ((4, 3), (2, 4, 3))])
def test_fused_matmul_vs_ort(sa, sb):
    r = _rng(5)
    a, b = _randn(r, *sa), _randn(r, *sb)
    ran = 0
    for ta, tb, tba, tbb in itertools.product([0, 1], repeat=4):
        attrs = dict(transA=ta, transB=tb, transBatchA=tba, transBatchB=tbb, alpha=0.75)
        mb, feeds = _model("FusedMatMul", [a, b], **attrs)
        try:
            exp = _ort_run(mb, feeds)[0]
        except Exception:  # noqa: BLE001 - incompatible combination: onnxpy must refuse it too
            with pytest.raises(Exception):  # noqa: B017
                _py_run(mb, feeds)
            continue
        ran += 1
        got = _py_run(mb, feeds)[0]
        assert got.shape == exp.shape
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5)
    assert ran > 0
    if a.ndim == 3 and b.ndim == 3 and sa[0] == sb[0] and sa[2] == sb[1]:
        _check("TransposeMatMul", [a, b], alpha=2.0)


def test_fused_matmul_double_and_transpose_matmul():
    r = _rng(6)
    a, b = _randn(r, 2, 4, 3, dtype=np.float64), _randn(r, 2, 5, 4, dtype=np.float64)
    _check("FusedMatMul", [a, b], transA=1, transB=1, rtol=1e-10, atol=1e-12)
    _check("TransposeMatMul", [a.astype(np.float32), b.astype(np.float32)], transA=1, transB=1)


_GEMM_ACTS = [("", {}), ("Relu", {}), ("Tanh", {}), ("Sigmoid", {}), ("LeakyRelu", dict(activation_alpha=0.2)),
              ("HardSigmoid", dict(activation_alpha=0.3, activation_beta=0.4)), ("Elu", dict(activation_alpha=0.7)),
              ("Softplus", {}), ("Softsign", {}), ("ScaledTanh", dict(activation_alpha=1.5, activation_beta=0.5)),
              ("ThresholdedRelu", dict(activation_alpha=0.5)),
              ("Selu", dict(activation_alpha=1.5, activation_gamma=1.1))]


@pytest.mark.parametrize("act,params", _GEMM_ACTS)
def test_fused_gemm_vs_ort(act, params):
    r = _rng(7)
    a, b, c = _randn(r, 4, 3), _randn(r, 5, 3), _randn(r, 5)
    kw = dict(params)
    if not act:  # onnxruntime's FusedGemm requires an activation; without one it is a plain Gemm
        got = _py("FusedGemm", [a, b, c], transB=1, alpha=0.5, beta=2.0)[0]
        np.testing.assert_allclose(got, 0.5 * a @ b.T + 2.0 * c, rtol=1e-5, atol=1e-6)
        return
    kw["activation"] = act
    try:
        _check("FusedGemm", [a, b, c], transB=1, alpha=0.5, beta=2.0, **kw)
    except Exception as e:  # noqa: BLE001
        if "Fail" in type(e).__name__ or "NOT_IMPLEMENTED" in str(e) or "supported" in str(e):
            pytest.skip(f"onnxruntime rejects FusedGemm activation {act}: {e}")
        raise
    _check("FusedGemm", [a.T.copy(), b.T.copy()], transA=1, **kw)


@pytest.mark.parametrize("act,params", [("", None), ("Relu", None), ("Tanh", None), ("Sigmoid", None),
                                        ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.5]), ("HardSigmoid", [0.3, 0.4])])
def test_fused_conv_vs_ort(act, params):
    r = _rng(8)
    x, w, b = _randn(r, 2, 4, 7, 6), _randn(r, 6, 2, 3, 3), _randn(r, 6)
    kw = {}
    if act:
        kw["activation"] = act
    if params:
        kw["activation_params"] = params
    _check("FusedConv", [x, w, b], group=2, pads=[1, 1, 1, 1], **kw)
    z = _randn(r, 2, 6, 3, 2) * 2
    _check("FusedConv", [x, w, b, z], group=2, strides=[2, 2], **kw)
    _check("FusedConv", [x, w, None, _randn(r, 2, 6, 5, 4)], group=2, **kw)
    # 1-D conv
    _check("FusedConv", [_randn(r, 1, 3, 9), _randn(r, 4, 3, 2)], dilations=[2], **kw)


def test_fused_conv_bad_z():
    r = _rng(9)
    with pytest.raises(Exception, match="Z"):
        _py("FusedConv", [_randn(r, 1, 2, 5, 5), _randn(r, 3, 2, 3, 3), None, _randn(r, 1, 3, 2, 2)])


# ----------------------------------------------------------------------------------------------------------------
# Layer norms


@pytest.mark.parametrize("skip_shape", ["full", "bcast1", "2d"])
@pytest.mark.parametrize("with_beta,with_bias", [(True, True), (False, False), (True, False), (False, True)])
def test_skip_layer_norm_vs_ort(skip_shape, with_beta, with_bias):
    r = _rng(10)
    B, S, D = 2, 3, 16
    x = _randn(r, B, S, D)
    sk = _randn(r, *{"full": (B, S, D), "bcast1": (1, S, D), "2d": (S, D)}[skip_shape])
    g, be, bi = _randn(r, D), _randn(r, D), _randn(r, D)
    _check("SkipLayerNormalization", [x, sk, g, be if with_beta else None, bi if with_bias else None], 4,
           epsilon=1e-5)
    _check("SkipLayerNormalization", [x, sk, g, be if with_beta else None, bi if with_bias else None], 1)
    _check("SkipLayerNormalization", [x, sk, g, be if with_beta else None, bi if with_bias else None],
           [True, False, False, True])
    _check("SkipSimplifiedLayerNormalization", [x, sk, g, bi if with_bias else None], 4, epsilon=1e-5)
    _check("SkipSimplifiedLayerNormalization", [x, sk, g, bi if with_bias else None], [True, False, True, True])


@pytest.mark.parametrize("dtype", [np.float16])
def test_skip_layer_norm_types_vs_ort(dtype):
    r = _rng(11)
    x, sk, g, be = _randn(r, 6, 8, dtype=dtype), _randn(r, 6, 8, dtype=dtype), _randn(r, 8, dtype=dtype), \
        _randn(r, 8, dtype=dtype)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    _check("SkipLayerNormalization", [x, sk, g, be], 4, rtol=tol, atol=tol)
    _check("SkipSimplifiedLayerNormalization", [x, sk, g], 1, rtol=tol, atol=tol)


def test_skip_layer_norm_bad_shapes():
    r = _rng(12)
    x, g = _randn(r, 2, 3, 8), _randn(r, 8)
    with pytest.raises(Exception, match="skip"):
        _py("SkipLayerNormalization", [x, _randn(r, 8), g])
    with pytest.raises(Exception, match="skip"):
        _py("SkipLayerNormalization", [x, _randn(r, 2, 1, 8), g])
    with pytest.raises(Exception, match="gamma"):
        _py("SkipLayerNormalization", [x, x, _randn(r, 7)])


def _simplified_ln(inputs, n_out, **attrs):
    mb, feeds = _model("SimplifiedLayerNormalization", inputs, n_out, **attrs)
    m = onnx.load_from_string(mb)
    m.graph.node[0].domain = ""
    return m.SerializeToString(), feeds


@pytest.mark.parametrize("shape,axis", [((2, 3, 8), -1), ((2, 3, 8), 1), ((4, 16), -1), ((2, 3, 4, 5), 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_simplified_layer_norm_vs_ort(shape, axis, dtype):
    r = _rng(13)
    x = _randn(r, *shape, dtype=dtype)
    scale = _randn(r, *shape[axis:], dtype=dtype)
    mb, feeds = _simplified_ln([x, scale], 2, axis=axis, epsilon=1e-3)
    exp, got = _ort_run(mb, feeds), _py_run(mb, feeds)
    tol = 3e-3 if dtype == np.float16 else 1e-5
    for g, e in zip(got, exp):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("with_seg,with_mask,pos", [(True, True, None), (False, False, None), (True, False, "1s"),
                                                    (False, True, "bs")])
def test_embed_layer_norm_vs_ort(with_seg, with_mask, pos):
    r = _rng(14)
    B, S, D, V = 2, 5, 16, 11
    ids = r.integers(0, V, (B, S)).astype(np.int32)
    seg = r.integers(0, 2, (B, S)).astype(np.int32)
    we, pe, se = _randn(r, V, D), _randn(r, 8, D), _randn(r, 2, D)
    g, be = _randn(r, D), _randn(r, D)
    mask = np.array([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]], np.int32)
    pid = None
    if pos == "1s":
        pid = np.array([[4, 3, 2, 1, 0]], np.int32)
    elif pos == "bs":
        pid = r.integers(0, 8, (B, S)).astype(np.int32)
    ins = [ids, seg if with_seg else None, we, pe, se if with_seg else None, g, be, mask if with_mask else None,
           pid]
    _check("EmbedLayerNormalization", ins, 3, epsilon=1e-5)
    _check("EmbedLayerNormalization", ins, 2)


def test_embed_layer_norm_out_of_range():
    r = _rng(15)
    ids = np.array([[0, 9]], np.int32)
    with pytest.raises(Exception, match="out of range"):
        _py("EmbedLayerNormalization", [ids, None, _randn(r, 5, 4), _randn(r, 4, 4), None, _randn(r, 4),
                                        _randn(r, 4)])


def _group_norm_np(x, g, b, groups, eps, silu):
    N, H, W, C = x.shape
    xg = x.astype(np.float64).reshape(N, H * W, groups, C // groups)
    m = xg.mean(axis=(1, 3), keepdims=True)
    v = xg.var(axis=(1, 3), keepdims=True)
    y = ((xg - m) / np.sqrt(v + eps)).reshape(x.shape) * g + b
    return y / (1 + np.exp(-y)) if silu else y


@pytest.mark.parametrize("silu", [0, 1])
def test_group_norm_numpy(silu):
    r = _rng(16)
    x, g, b = _randn(r, 2, 3, 4, 8), _randn(r, 8), _randn(r, 8)
    got = _py("GroupNorm", [x, g, b], activation=silu, groups=4, epsilon=1e-5)[0]
    np.testing.assert_allclose(got, _group_norm_np(x, g, b, 4, 1e-5, silu), rtol=1e-4, atol=1e-5)
    got = _py("GroupNorm", [x.transpose(0, 3, 1, 2).copy(), g, b], activation=silu, groups=4, channels_last=0)[0]
    np.testing.assert_allclose(got, _group_norm_np(x, g, b, 4, 1e-5, silu).transpose(0, 3, 1, 2), rtol=1e-4,
                               atol=1e-5)
    skip, bias = _randn(r, 2, 3, 4, 8), _randn(r, 8)
    y, s = _py("SkipGroupNorm", [x, g, b, skip, bias], 2, activation=silu, groups=2)
    np.testing.assert_allclose(s, x + skip + bias, rtol=1e-6)
    np.testing.assert_allclose(y, _group_norm_np(x + skip + bias, g, b, 2, 1e-5, silu), rtol=1e-4, atol=1e-5)
    skip2 = _randn(r, 2, 8)
    y, s = _py("SkipGroupNorm", [x, g, b, skip2], 2, activation=silu, groups=2)
    np.testing.assert_allclose(s, x + skip2[:, None, None], rtol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# numpy attention reference


def _bnsh(t, n):
    B, S, D = t.shape
    return t.reshape(B, S, n, D // n).transpose(0, 2, 1, 3).astype(np.float64)


def _merge(o):
    B, N, S, H = o.shape
    return o.transpose(0, 2, 1, 3).reshape(B, S, N * H)


def _sdpa(q, k, v, additive=None, causal_past=None, scale=None):
    S, T, H = q.shape[2], k.shape[2], q.shape[3]
    s = q @ np.swapaxes(k, -1, -2) * (scale or 1 / math.sqrt(H))
    if additive is not None:
        s = s + additive
    if causal_past is not None:
        s = np.where(np.arange(T)[None, :] > np.arange(S)[:, None] + causal_past, -np.inf, s)
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(-1, keepdims=True)) @ v


# ----------------------------------------------------------------------------------------------------------------
# Attention


def _attn_inputs(r, B=2, S=4, Din=12, N=3, sizes=(12, 12, 12), with_bias=True):
    x = _randn(r, B, S, Din)
    w = _randn(r, Din, sum(sizes)) * 0.5
    b = _randn(r, sum(sizes)) if with_bias else None
    return x, w, b


def _mask_forms(r, B, S, T):
    end = r.integers(1, T + 1, B).astype(np.int32)
    start = np.minimum(r.integers(0, 2, B), end - 1).astype(np.int32)
    raw = r.integers(0, 2, (B, T)).astype(np.int32)
    raw[:, 0] = 1
    raw3 = r.integers(0, 2, (B, S, T)).astype(np.int32)
    raw3[..., 0] = 1
    return {"none": None, "1d_end": end, "1d_end_start": np.concatenate([end, start]), "2d": raw, "3d": raw3,
            "2d_all_masked": np.zeros((B, T), np.int32)}


@pytest.mark.parametrize("mask", ["none", "1d_end", "1d_end_start", "2d", "3d", "2d_all_masked"])
@pytest.mark.parametrize("uni", [0, 1])
def test_attention_masks_vs_ort(mask, uni):
    r = _rng(20)
    x, w, b = _attn_inputs(r)
    m = _mask_forms(r, 2, 4, 4)[mask]
    _check("Attention", [x, w, b, m], num_heads=3, unidirectional=uni, atol=2e-5)
    _check("Attention", [x, w, None, m], num_heads=3, unidirectional=uni, mask_filter_value=-50.0, atol=2e-5)


@pytest.mark.parametrize("mask", ["none", "1d_end", "2d", "3d"])
def test_attention_past_present_vs_ort(mask):
    r = _rng(21)
    B, S, P, N, H = 2, 3, 5, 2, 4
    x, w, b = _attn_inputs(r, B, S, 10, N, (N * H,) * 3)
    past = _randn(r, 2, B, N, P, H)
    m = _mask_forms(r, B, S, P + S)[mask]
    _check("Attention", [x, w, b, m, past], 2, num_heads=N, unidirectional=1, atol=2e-5)
    _check("Attention", [x, w, b, m, past], 2, num_heads=N, unidirectional=0, atol=2e-5)
    # one-token decoding step
    x1 = x[:, :1]
    m1 = None if m is None or m.ndim == 3 else (m if m.ndim == 1 else m[:, :P + 1])
    _check("Attention", [x1, w, b, m1, past], 2, num_heads=N, unidirectional=1, atol=2e-5)


def test_attention_qkv_hidden_sizes_scale_bias_vs_ort():
    r = _rng(22)
    sizes = (8, 8, 12)
    x, w, b = _attn_inputs(r, 2, 5, 6, 4, sizes)
    _check("Attention", [x, w, b], num_heads=4, qkv_hidden_sizes=list(sizes))
    _check("Attention", [x, w, b], num_heads=4, qkv_hidden_sizes=list(sizes), scale=0.3)
    ab = _randn(r, 1, 4, 5, 5)
    _check("Attention", [x, w, b, None, None, ab], num_heads=4, qkv_hidden_sizes=list(sizes))
    ab = _randn(r, 2, 1, 5, 5)
    m = _mask_forms(r, 2, 5, 5)["2d"]
    _check("Attention", [x, w, b, m, None, ab], num_heads=4, qkv_hidden_sizes=list(sizes), unidirectional=1)


def test_attention_4d_mask_and_errors():
    r = _rng(23)
    B, S, N, H, M = 2, 3, 2, 4, 6
    x, w, b = _attn_inputs(r, B, S, 8, N, (N * H,) * 3)
    m4 = r.integers(0, 2, (B, 1, M, M)).astype(np.int32)
    m4[..., 0] = 1
    got = _py("Attention", [x, w, b, m4], num_heads=N)[0]
    qkv = x.astype(np.float64) @ w + b
    q, k, v = (_bnsh(t, N) for t in np.split(qkv, 3, -1))
    add = np.where(m4[:, :, :S, :S] > 0, 0.0, -10000.0)
    np.testing.assert_allclose(got, _merge(_sdpa(q, k, v, add)), rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="mask"):
        _py("Attention", [x, w, b, np.ones(5, np.int32)], num_heads=N)
    with pytest.raises(Exception, match="num_heads|divisible|multiples"):
        _py("Attention", [x, w, b], num_heads=3)
    with pytest.raises(Exception, match="rotary"):
        _py("Attention", [x, w, b], num_heads=N, do_rotary=1)


def test_attention_share_buffer_numpy():
    r = _rng(24)
    B, S, N, H, M, P = 1, 1, 2, 4, 8, 3
    x, w, b = _attn_inputs(r, B, S, 8, N, (N * H,) * 3)
    past = _randn(r, 2, B, N, M, H)
    out, present = _py("Attention", [x, w, b, None, past, None, np.array([P], np.int32)], 2, num_heads=N,
                       unidirectional=1, past_present_share_buffer=1)
    qkv = x.astype(np.float64) @ w + b
    q, k, v = (_bnsh(t, N) for t in np.split(qkv, 3, -1))
    K = np.concatenate([past[0, :, :, :P], k], 2)
    V = np.concatenate([past[1, :, :, :P], v], 2)
    np.testing.assert_allclose(out, _merge(_sdpa(q, K, V)), rtol=1e-4, atol=1e-5)
    assert present.shape == past.shape
    np.testing.assert_allclose(present[:, :, :, :P + S], np.stack([K, V]), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# MultiHeadAttention


def _mha_data(r, B=2, S=3, L=4, N=2, H=4, Hv=None):
    Hv = Hv or H
    return (_randn(r, B, S, N * H), _randn(r, B, L, N * H), _randn(r, B, L, N * Hv),
            _randn(r, 2 * N * H + N * Hv))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("mask", [None, "1d", "2d", "3d"])
def test_mha_cross_vs_ort(with_bias, mask):
    r = _rng(30)
    B, S, L, N = 2, 3, 4, 2
    q, k, v, bias = _mha_data(r, B, S, L, N, 4, 6)
    m = {None: None, "1d": np.array([3, 1], np.int32), "2d": np.array([[1, 1, 0, 1], [1, 0, 0, 0]], np.int32),
         "3d": np.concatenate([np.ones((B, S, 1)), r.integers(0, 2, (B, S, L - 1))], -1).astype(np.int32)}[mask]
    _check("MultiHeadAttention", [q, k, v, bias if with_bias else None, m], 3, num_heads=N)
    _check("MultiHeadAttention", [q, k, v, bias if with_bias else None, m], 1, num_heads=N, scale=0.2,
           mask_filter_value=-100.0)


def test_mha_bnsh_key_attention_bias_qk_vs_ort():
    r = _rng(31)
    B, S, L, N, H = 2, 3, 5, 2, 4
    q, _, _, bias = _mha_data(r, B, S, L, N, H)
    k4, v4 = _randn(r, B, N, L, H), _randn(r, B, N, L, H)
    _check("MultiHeadAttention", [q, k4, v4], num_heads=N)
    _check("MultiHeadAttention", [q, k4, v4, bias], num_heads=N)  # bias only added to Q for BNSH key/value
    ab = _randn(r, 1, N, S, L)
    k, v = _randn(r, B, L, N * H), _randn(r, B, L, N * H)
    _check("MultiHeadAttention", [q, k, v, None, None, ab], 4, num_heads=N,
           out_types={3: TensorProto.FLOAT})
    ab = _randn(r, B, 1, S, L)
    _check("MultiHeadAttention", [q, k, v, bias, np.array([[1, 1, 1, 0, 1], [1, 0, 1, 1, 1]], np.int32), ab], 4,
           num_heads=N, out_types={3: TensorProto.FLOAT}, only=(0, 1, 2))


@pytest.mark.parametrize("uni", [0, 1])
def test_mha_past_present_vs_ort(uni):
    r = _rng(32)
    B, S, N, H, P = 2, 3, 2, 4, 4
    q, k, v, bias = _mha_data(r, B, S, S, N, H)
    pk, pv = _randn(r, B, N, P, H), _randn(r, B, N, P, H)
    _check("MultiHeadAttention", [q, k, v, bias, None, None, pk, pv], 3, num_heads=N, unidirectional=uni)
    kpm = np.ones((B, P + S), np.int32)
    kpm[0, 1] = 0
    _check("MultiHeadAttention", [q, k, v, None, kpm, None, pk, pv], 3, num_heads=N, unidirectional=uni)
    _check("MultiHeadAttention", [q[:, :1], k[:, :1], v[:, :1], bias, None, None, pk, pv], 3, num_heads=N,
           unidirectional=uni)


def test_mha_self_unidirectional_vs_ort():
    r = _rng(33)
    q, k, v, bias = _mha_data(r, 2, 5, 5, 4, 2)
    _check("MultiHeadAttention", [q, k, v, bias], 3, num_heads=4, unidirectional=1)


def test_mha_packed_numpy():
    r = _rng(34)
    B, S, N, H = 2, 3, 2, 4
    qkv = _randn(r, B, S, N, 3, H)
    bias = _randn(r, 3 * N * H)
    got = _py("MultiHeadAttention", [qkv, None, None, bias], num_heads=N)[0]
    bq, bk, bv = (bias.reshape(3, N, H)[i] for i in range(3))
    t = lambda i, bb: (qkv[:, :, :, i] + bb).transpose(0, 2, 1, 3).astype(np.float64)  # noqa: E731
    np.testing.assert_allclose(got, _merge(_sdpa(t(0, bq), t(1, bk), t(2, bv))), rtol=1e-4, atol=1e-5)
    q = _randn(r, B, S, N * H)
    kv = _randn(r, B, 5, N, 2, H)
    got = _py("MultiHeadAttention", [q, kv], num_heads=N)[0]
    K = kv[:, :, :, 0].transpose(0, 2, 1, 3)
    V = kv[:, :, :, 1].transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, _merge(_sdpa(_bnsh(q, N), K, V)), rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="key"):
        _py("MultiHeadAttention", [q], num_heads=N)


# ----------------------------------------------------------------------------------------------------------------
# GroupQueryAttention


def _gqa_inputs(r, B, S, N, Nk, H, P, packed=False):
    q = _randn(r, B, S, N * H)
    k = _randn(r, B, S, Nk * H)
    v = _randn(r, B, S, Nk * H)
    pk = _randn(r, B, Nk, P, H)
    pv = _randn(r, B, Nk, P, H)
    if packed:
        return [np.concatenate([q, k, v], -1), None, None, pk, pv]
    return [q, k, v, pk, pv]


def _cos_sin(r, rows, half):
    ang = r.uniform(0, 6, (rows, half)).astype(np.float32)
    return np.cos(ang), np.sin(ang)


def _gqa_check(ins, sl, tsl, S, P, rows_valid_only=True, **attrs):
    """Compare output rows/present rows that onnxruntime defines (rows of padded prompt entries are unspecified)."""
    mb, feeds = _model("GroupQueryAttention", ins, 3, **attrs)
    exp, got = _ort_run(mb, feeds), _py_run(mb, feeds)
    for g, e in zip(got, exp):
        assert g.shape == e.shape and g.dtype == e.dtype
    tol = 2e-3 if exp[0].dtype == np.float16 else 2e-5
    for b, s in enumerate(sl):
        T = int(s) + 1
        rows = min(S, T) if (P == 0 or S == tsl) else S
        np.testing.assert_allclose(got[0][b, :rows].astype(np.float64), exp[0][b, :rows].astype(np.float64),
                                   rtol=tol, atol=tol)
        for i in (1, 2):
            np.testing.assert_allclose(got[i][b, :, :T].astype(np.float64), exp[i][b, :, :T].astype(np.float64),
                                       rtol=tol, atol=tol)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("N,Nk", [(4, 2), (4, 4), (6, 1)])
def test_gqa_prompt_and_decode_vs_ort(packed, N, Nk):
    r = _rng(40)
    B, H = 2, 16
    # first prompt (no past), right-padded second entry
    ins = _gqa_inputs(r, B, 5, N, Nk, H, 0, packed)
    sl = np.array([4, 2], np.int32)
    _gqa_check(ins + [sl, np.array(5, np.int32)], sl, 5, 5, 0, num_heads=N, kv_num_heads=Nk)
    # decoding one token with a ragged batch, past buffer of 6
    ins = _gqa_inputs(r, B, 1, N, Nk, H, 6, packed)
    sl = np.array([6, 3], np.int32)
    _gqa_check(ins + [sl, np.array(7, np.int32)], sl, 7, 1, 6, num_heads=N, kv_num_heads=Nk)
    # decoding into a larger (shared) buffer
    ins = _gqa_inputs(r, B, 1, N, Nk, H, 10, packed)
    _gqa_check(ins + [sl, np.array(7, np.int32)], sl, 7, 1, 10, num_heads=N, kv_num_heads=Nk)
    # several new tokens with past (batch 1)
    ins = _gqa_inputs(r, 1, 3, N, Nk, H, 4, packed)
    sl1 = np.array([6], np.int32)
    _gqa_check(ins + [sl1, np.array(7, np.int32)], sl1, 7, 3, 4, num_heads=N, kv_num_heads=Nk)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("H,half", [(16, 8), (32, 8)])
def test_gqa_rotary_vs_ort(interleaved, H, half):
    r = _rng(41)
    B, N, Nk = 2, 4, 2
    cos, sin = _cos_sin(r, 32, half)
    ins = _gqa_inputs(r, B, 4, N, Nk, H, 0)
    sl = np.array([3, 3], np.int32)
    attrs = dict(num_heads=N, kv_num_heads=Nk, do_rotary=1, rotary_interleaved=interleaved)
    _gqa_check(ins + [sl, np.array(4, np.int32), cos, sin], sl, 4, 4, 0, **attrs)
    ins = _gqa_inputs(r, B, 1, N, Nk, H, 8)
    sl = np.array([7, 4], np.int32)
    _gqa_check(ins + [sl, np.array(8, np.int32), cos, sin], sl, 8, 1, 8, **attrs)


def test_gqa_local_window_softcap_scale_vs_ort():
    r = _rng(42)
    B, N, Nk, H = 2, 4, 2, 16
    sl = np.array([5, 5], np.int32)
    ins = _gqa_inputs(r, B, 6, N, Nk, H, 0) + [sl, np.array(6, np.int32)]
    base = dict(num_heads=N, kv_num_heads=Nk)
    _gqa_check(ins, sl, 6, 6, 0, local_window_size=2, **base)
    _gqa_check(ins, sl, 6, 6, 0, softcap=1.5, **base)
    _gqa_check(ins, sl, 6, 6, 0, scale=0.1, **base)
    _gqa_check(ins, sl, 6, 6, 0, smooth_softmax=1, **base)
    sl = np.array([7, 4], np.int32)
    ins = _gqa_inputs(r, B, 1, N, Nk, H, 7) + [sl, np.array(8, np.int32)]
    _gqa_check(ins, sl, 8, 1, 7, local_window_size=3, softcap=2.0, **base)


def test_gqa_attention_bias_head_sink_vs_ort():
    r = _rng(43)
    B, N, Nk, H, S = 2, 4, 2, 16, 4
    sl = np.array([3, 3], np.int32)
    ab = _randn(r, B, 1, S, S)
    sink = _randn(r, N)
    ins = _gqa_inputs(r, B, S, N, Nk, H, 0) + [sl, np.array(S, np.int32), None, None, None, ab]
    _gqa_check(ins, sl, S, S, 0, num_heads=N, kv_num_heads=Nk)
    _gqa_check(ins + [sink], sl, S, S, 0, num_heads=N, kv_num_heads=Nk)


def test_gqa_fp16_vs_ort():
    r = _rng(44)
    B, N, Nk, H = 2, 4, 2, 16
    ins = [None if a is None else a.astype(np.float16) for a in _gqa_inputs(r, B, 1, N, Nk, H, 5)]
    sl = np.array([5, 2], np.int32)
    _gqa_check(ins + [sl, np.array(6, np.int32)], sl, 6, 1, 5, num_heads=N, kv_num_heads=Nk)


def test_gqa_errors():
    r = _rng(45)
    ins = _gqa_inputs(r, 2, 3, 4, 2, 8, 4)
    with pytest.raises(Exception, match="batch_size must be 1"):
        _py("GroupQueryAttention", ins + [np.array([6, 6], np.int32), np.array(7, np.int32)], 3, num_heads=4,
            kv_num_heads=2)
    with pytest.raises(Exception, match="multiple"):
        _py("GroupQueryAttention", ins + [np.array([6, 6], np.int32), np.array(7, np.int32)], 3, num_heads=3,
            kv_num_heads=2)


# ----------------------------------------------------------------------------------------------------------------
# RotaryEmbedding (com.microsoft)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["3d", "3d_noheads", "4d", "partial"])
@pytest.mark.parametrize("pid_kind", ["offset", "2d"])
def test_rotary_embedding_vs_ort(interleaved, layout, pid_kind):
    r = _rng(50)
    B, S, N, H = 2, 3, 2, 8
    half = 2 if layout == "partial" else H // 2
    cos, sin = _cos_sin(r, 16, half)
    pid = np.array([4], np.int64) if pid_kind == "offset" else r.integers(0, 16, (B, S)).astype(np.int64)
    attrs = dict(interleaved=interleaved)
    if layout == "4d":
        x = _randn(r, B, N, S, H)
    else:
        x = _randn(r, B, S, N * H)
        if layout in ("3d", "partial"):
            attrs["num_heads"] = N
        if layout == "partial":
            attrs["rotary_embedding_dim"] = 2 * half
    _check("RotaryEmbedding", [x, pid, cos, sin], **attrs)
    _check("RotaryEmbedding", [x.astype(np.float16), pid, cos.astype(np.float16), sin.astype(np.float16)],
           rtol=2e-3, atol=2e-3, **attrs)


def test_gqa_position_ids_and_qk_output_vs_ort():
    r = _rng(46)
    B, N, Nk, H = 2, 4, 2, 16
    cos, sin = _cos_sin(r, 32, 8)
    sl = np.array([6, 6], np.int32)
    ins = _gqa_inputs(r, B, 1, N, Nk, H, 6)
    pid = np.array([[9], [3]], np.int64)
    _gqa_check(ins + [sl, np.array(7, np.int32), cos, sin, pid], sl, 7, 1, 6, num_heads=N, kv_num_heads=Nk,
               do_rotary=1)
    for mode in (1, 2):
        ins = _gqa_inputs(r, B, 4, N, Nk, H, 0) + [np.array([3, 3], np.int32), np.array(4, np.int32)]
        mb, feeds = _model("GroupQueryAttention", ins, 4, num_heads=N, kv_num_heads=Nk, qk_output=mode,
                           out_types={3: TensorProto.FLOAT})
        exp, got = _ort_run(mb, feeds), _py_run(mb, feeds)
        assert got[3].shape == exp[3].shape
        np.testing.assert_allclose(got[3], exp[3], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[0], exp[0], rtol=1e-4, atol=2e-5)


# ----------------------------------------------------------------------------------------------------------------
# whole models fused by onnxruntime.transformers.optimizer


@pytest.fixture(scope="module")
def fused_models(tmp_path_factory):
    import io
    import warnings

    try:
        from onnxruntime.transformers.optimizer import optimize_model
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"onnxruntime.transformers.optimizer does not import: {e}")
    torch = pytest.importorskip("torch", reason="torch is needed to export the BERT/GPT-2 test models")
    transformers = pytest.importorskip("transformers", reason="transformers builds the BERT/GPT-2 test models")
    d = tmp_path_factory.mktemp("fused")
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0
    tt = torch.zeros(2, 8, dtype=torch.int64)
    pos = torch.arange(8).unsqueeze(0).expand(2, 8)
    dyn = {0: "batch", 1: "seq"}

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = transformers.BertConfig(vocab_size=50, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=128, max_position_embeddings=32,
                                          attn_implementation="eager")
            self.m = transformers.BertModel(cfg).eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state

    class Gpt2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = transformers.GPT2Config(vocab_size=50, n_embd=64, n_layer=2, n_head=4, n_positions=32,
                                          attn_implementation="eager")
            self.m = transformers.GPT2LMHeadModel(cfg).eval()

        def forward(self, input_ids, attention_mask, position_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False).logits

    out = {}
    for kind, mod, args, names in (("bert", Bert, (ids, mask, tt), ["input_ids", "attention_mask", "token_type_ids"]),
                                   ("gpt2", Gpt2, (ids, mask, pos), ["input_ids", "attention_mask", "position_ids"])):
        f = io.BytesIO()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(mod().eval(), args, f, input_names=names, output_names=["out"],
                                  dynamic_axes={n: dyn for n in names}, opset_version=14, dynamo=False)
        except Exception as e:  # noqa: BLE001
            pytest.skip(f"torch.onnx.export of the {kind} test model failed: {e}")
        src = d / f"{kind}.onnx"
        src.write_bytes(f.getvalue())
        opt = optimize_model(str(src), model_type=kind, num_heads=4, hidden_size=64, opt_level=0)
        stats = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
        path = d / f"{kind}_opt.onnx"
        opt.save_model_to_file(str(path))
        out[kind] = (path, stats, {n: a.numpy() for n, a in zip(names, args)})
    return out


_BERT_OPS = {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"}


@pytest.mark.parametrize("kind,expected_ops", [("bert", _BERT_OPS), ("gpt2", {"SkipLayerNormalization", "FastGelu"})])
def test_optimized_transformer_models_vs_ort(fused_models, kind, expected_ops):
    path, stats, feeds = fused_models[kind]
    assert expected_ops <= set(stats), stats
    m = onnx.load(str(path))
    assert any(n.domain == MS for n in m.graph.node)
    for batch_feeds in (feeds, {k: v[:1, :5].copy() for k, v in feeds.items()}):
        exp = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, batch_feeds)
        got = onnxpy.InferenceSession(str(path)).run(None, batch_feeds)
        for g, e in zip(got, exp):
            assert g.shape == e.shape and g.dtype == e.dtype
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------------------------
# fast paths (speed round 2): the transposed-layout attention core against the generic one, the Gelu family against
# activations' block functions, the MatMulNBits weight cache


@pytest.mark.parametrize("case", ["bias", "inf_rows", "causal", "kpm", "large"])
def test_mha_fast_core_matches_generic(case):
    from onnxpy.ops import contrib_transformer as ct

    r = _rng(40)
    B, S, T, N, H = (1, 64, 64, 4, 16) if case == "large" else (2, 5, 7, 2, 4)
    if case == "causal":
        T = S
    q, k, v = _randn(r, B, S, N * H), _randn(r, B, T, N * H), _randn(r, B, T, N * H)
    ab = kpm = None
    if case in ("bias", "large"):
        ab = _randn(r, 1, 1, S, T)
    if case == "inf_rows":
        ab = np.zeros((B, 1, S, T), np.float32)
        ab[:, :, 1] = -np.inf
        ab[0, :, 2, 1:] = -np.inf
        ab[1, :, 3, 2] = np.nan
    if case == "kpm":
        kpm = np.array([3, 7], np.int32)
    kw = dict(num_heads=N, unidirectional=int(case == "causal"))
    fast = ct.multi_head_attention(q, k, v, None, kpm, ab, **kw, _output_names=["o"])
    generic = ct.multi_head_attention(q, k, v, None, kpm, ab, **kw, _output_names=["o", "", "", "qk"])[0]
    assert fast.shape == generic.shape and fast.dtype == generic.dtype and fast.flags.c_contiguous
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(generic))
    np.testing.assert_allclose(fast, generic, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 40, 1700), (3, 5), (7,), (2, 0, 3)])
def test_gelu_family_matches_activation_blocks(shape):
    from onnxpy.ops import contrib_fused as cf
    from onnxpy.ops.activations import _blockwise, _gelu_erf_block, _gelu_tanh_block

    r = _rng(41)
    x = (_randn(r, *shape) * 3).astype(np.float32)
    b = _randn(r, shape[-1])
    np.testing.assert_array_equal(cf.ms_gelu(x), _blockwise(_gelu_erf_block, x))
    np.testing.assert_array_equal(cf.bias_gelu(x, b), _blockwise(_gelu_erf_block, x + b))
    np.testing.assert_array_equal(cf.fast_gelu(x), _blockwise(_gelu_tanh_block, x))
    np.testing.assert_array_equal(cf.fast_gelu(x, b), _blockwise(_gelu_tanh_block, x + b))


def test_matmul_nbits_weight_cache():
    import gc

    from onnxpy.ops import contrib_quant as cq

    r = _rng(42)
    K, N, bs, bits = 64, 5, 32, 4
    codes = r.integers(0, 16, (N, K))
    B = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8).reshape(N, K // bs, bs // 2)
    S = (r.random((N, K // bs)) * 0.1 + 0.01).astype(np.float32)
    A = _randn(r, 3, K)
    w = (codes - 8) * np.repeat(S, bs, axis=1)
    m, feeds = single_node("MatMulNBits", [A, B, S], 1, opsets=[("", 21), (MS, 1)], domain=MS, inits=(1, 2),
                           ir_version=10, K=K, N=N, bits=bits, block_size=bs)
    sess = onnxpy.InferenceSession(m.SerializeToString())
    n0 = len(cq._NBITS_CACHE)
    y1 = sess.run(None, feeds)[0]
    assert len(cq._NBITS_CACHE) == n0 + 1
    y2 = sess.run(None, feeds)[0]
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_allclose(y1, A @ w.T, rtol=1e-5, atol=1e-5)
    # non-constant (fed) weights are never cached
    from onnxpy.ops.contrib_quant import matmul_nbits

    matmul_nbits(A, B, S, K=K, N=N, bits=bits, block_size=bs)
    assert len(cq._NBITS_CACHE) == n0 + 1
    del sess
    gc.collect()
    assert len(cq._NBITS_CACHE) == n0
