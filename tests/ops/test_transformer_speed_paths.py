"""Fast paths of the transformer kernels and the level-99 MatMul fusions.

* exact GELU as x * sigmoid(x P(x^2)) (_ew_math.gelu_erf32) against a float64 reference and onnxruntime;
* float16 -> float32 bit conversion (_ew_math.f16_to_f32) over every bit pattern;
* MatMulBias / MatMulBiasGelu (ai.onnxpy): kernels against numpy, fused sessions against unfused ones and
  onnxruntime, and the fusion guards;
* MultiHeadAttention's softmax without the row-max subtraction and its fallbacks;
* SkipLayerNormalization's float16 path.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.ops import _ew_math as em
from onnxpy.ops import _packed
from onnxpy.ops import contrib_fused as cf
from onnxpy.ops import contrib_transformer as ct
from onnxpy.ops import linalg
from onnxpy.ops._shape_util import NOT_CONST

ort = pytest.importorskip("onnxruntime")
special = pytest.importorskip("scipy.special")
MS = "com.microsoft"
_TP = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
       np.dtype(np.float64): TensorProto.DOUBLE}


def _rng(seed=0):
    return np.random.default_rng(seed)


def _gelu_ref(x):
    x = np.asarray(x, dtype=np.float64)
    return x * special.ndtr(x)


def _ort(mb, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(mb, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _py(mb, feeds, level=None, disabled=()):
    so = onnxpy.SessionOptions()
    if level is not None:
        so.graph_optimization_level = level
    s = onnxpy.InferenceSession(mb, so, disabled_optimizers=list(disabled))
    return s.run(None, feeds), s


# ------------------------------------------------------------------------------------------------------------ GELU
def test_gelu_erf32_accuracy_dense_grid():
    x = np.concatenate([np.linspace(-12, 12, 400_001, dtype=np.float32),
                        (_rng(1).standard_normal(100_000) * 3).astype(np.float32)])
    y = em.gelu_erf32(x, np.empty_like(x)).astype(np.float64)
    err = np.abs(y - _gelu_ref(x))
    assert err.max() < 1e-6
    # a few float32 ulp of the output, or of |x| / 2 where 1 + erf cancels
    assert np.all(err <= 4 * np.spacing(np.abs(y).astype(np.float32)) + 3e-8 * np.abs(x) + 1e-30)


def test_gelu_erf32_special_values_and_in_place():
    x = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, 3e38, -3e38, 1e-40, -1e-40, 4.0, -4.0, 20, -20],
                 np.float32)
    y = em.gelu_erf32(x.copy(), np.empty_like(x))
    assert y[0] == np.inf and np.isnan(y[1]) and np.isnan(y[2])  # -inf * Phi(-inf) = -inf * 0, as 0.5x(1+erf)
    assert y[3] == 0 and y[4] == 0 and np.signbit(y[4])
    assert y[5] == np.float32(1e30) and y[7] == np.float32(3e38)
    assert y[6] == 0 and y[8] == 0
    err = np.abs(y[9:].astype(np.float64) - _gelu_ref(x[9:]))
    assert np.all(err <= 2e-6 * np.abs(_gelu_ref(x[9:])) + 3e-8 * np.abs(x[9:]))
    z = (_rng(2).standard_normal(40_000) * 4).astype(np.float32)  # several blocks and a ragged tail
    ref = em.gelu_erf32(z, np.empty_like(z))
    w = z.copy()
    assert em.gelu_erf32(w, w) is w
    np.testing.assert_array_equal(w, ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("shape", [(3, 5, 7), (1, 2, 20_001), (0, 4)])
def test_gelu_ops_vs_ort(dtype, shape):
    r = _rng(3)
    x = (r.standard_normal(shape) * 3).astype(dtype)
    b = r.standard_normal(shape[-1]).astype(dtype)
    tp = _TP[np.dtype(dtype)]
    for op, dom, ins in (("Gelu", MS, [x]), ("BiasGelu", MS, [x, b]), ("Gelu", "", [x])):
        names = [f"i{k}" for k in range(len(ins))]
        node = helper.make_node(op, names, ["y"], domain=dom)
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, tp, list(a.shape))
                                            for n, a in zip(names, ins)],
                              [helper.make_tensor_value_info("y", tp, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(MS, 1)],
                              ir_version=9)
        feeds = dict(zip(names, ins))
        got, _ = _py(m.SerializeToString(), feeds)
        ref = _gelu_ref(x + (b if op == "BiasGelu" else 0))
        assert got[0].dtype == x.dtype and got[0].shape == x.shape
        tol = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-12}[dtype]
        np.testing.assert_allclose(got[0].astype(np.float64), ref, rtol=tol, atol=tol)
        if dtype != np.float64 or dom == "":
            try:
                exp = _ort(m.SerializeToString(), feeds)
            except Exception:  # noqa: BLE001 - onnxruntime lacks some of these type/op pairs on CPU
                continue
            np.testing.assert_allclose(got[0].astype(np.float64), exp[0].astype(np.float64),
                                       rtol=10 * tol, atol=10 * tol)


def test_gelu_block_routine_matches_contrib():
    from onnxpy.ops.activations import _blockwise, _gelu_erf_block

    x = (_rng(4).standard_normal((2, 3, 7001)) * 3).astype(np.float32)
    np.testing.assert_array_equal(cf.ms_gelu(x), _blockwise(_gelu_erf_block, x))
    xs = x[:, :, ::3]  # strided
    np.testing.assert_array_equal(cf.ms_gelu(np.ascontiguousarray(xs)), _blockwise(_gelu_erf_block, xs))


# ------------------------------------------------------------------------------------------------ float16 -> f32
def test_f16_to_f32_every_bit_pattern():
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    got = em.f16_to_f32(h)
    exp = h.astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), exp.view(np.uint32))  # nan payloads and -0 included
    for v in (h.reshape(256, 256)[:, ::3], h[:100], h[:0], h.reshape(256, 256).T):
        np.testing.assert_array_equal(em.f16_to_f32(v), v.astype(np.float32))
    assert em.to_f32(exp) is exp


# ----------------------------------------------------------------------------------------- MatMulBias (kernel)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
@pytest.mark.parametrize("a_shape", [(5,), (4, 5), (2, 3, 5), (2, 1, 3, 5)])
def test_matmul_bias_kernel(dtype, a_shape):
    r = _rng(5)
    a = (r.standard_normal(a_shape) * 3).astype(dtype)
    w = (r.standard_normal((5, 6)) * 3).astype(dtype)
    b = (r.standard_normal(6) * 3).astype(dtype)
    got = linalg.matmul_bias(a, w, b)
    if dtype == np.float16:
        exp = (a.astype(np.float32) @ w.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    else:
        exp = np.matmul(a, w) + b
    assert got.dtype == exp.dtype and got.shape == exp.shape
    np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=1e-6, atol=1e-6)
    fast = linalg._matmul_bias_specialize((NOT_CONST, w, b), {})
    if np.dtype(dtype).kind == "f":
        assert fast is not None
        np.testing.assert_array_equal(fast(a, w, b), got)
        if a.ndim > 1:  # non-contiguous activations and a mismatched dtype fall back to the generic kernel
            at = np.swapaxes(np.swapaxes(a, -1, -2).copy(), -1, -2)
            np.testing.assert_allclose(fast(at, w, b).astype(np.float64), got.astype(np.float64), rtol=1e-6,
                                       atol=1e-6)
    else:
        assert fast is None


def test_matmul_bias_kernel_broadcasting_bias_and_errors():
    r = _rng(6)
    a = r.standard_normal((3, 4)).astype(np.float32)
    w = r.standard_normal((4, 2)).astype(np.float32)
    b2 = r.standard_normal((5, 3, 1)).astype(np.float32)  # grows the output: not in place
    np.testing.assert_allclose(linalg.matmul_bias(a, w, b2), a @ w + b2, rtol=1e-6)
    with pytest.raises((ValueError, TypeError)):
        linalg.matmul_bias(a, w.astype(np.float64), b2)
    with pytest.raises(ValueError):
        linalg.matmul_bias(a, r.standard_normal((3, 2)).astype(np.float32), np.zeros(2, np.float32))


# ---------------------------------------------------------------------------------------- MatMul fusions (graph)
def _ffn_model(dtype, n=6, k=10, h=16, seq=7, bias_first=False, extra_reader=False, bias_2d=False, gelu=True):
    """x @ W1 + b1 -> Gelu (erf form) -> @ W2 + b2, the BERT feed-forward block as torch exports it."""
    r = _rng(7)
    dt = np.dtype(dtype)
    tp = _TP[dt]
    w1 = (r.standard_normal((k, h)) * 0.3).astype(dt)
    b1 = r.standard_normal((1, h) if bias_2d else h).astype(dt)
    w2 = (r.standard_normal((h, k)) * 0.3).astype(dt)
    b2 = r.standard_normal(k).astype(dt)
    inits = [numpy_helper.from_array(v, nm) for v, nm in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    inits += [numpy_helper.from_array(np.array(v, dt), nm) for v, nm in ((np.sqrt(2), "sq2"), (1.0, "one"),
                                                                         (0.5, "half"))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]),
             helper.make_node("Add", ["b1", "m1"] if bias_first else ["m1", "b1"], ["a1"])]
    if gelu:
        nodes += [helper.make_node("Div", ["a1", "sq2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["a1", "e1"], ["m"]),
                  helper.make_node("Mul", ["m", "half"], ["g"])]
    else:
        nodes += [helper.make_node("Relu", ["a1"], ["g"])]
    nodes += [helper.make_node("MatMul", ["g", "w2"], ["m2"]), helper.make_node("Add", ["m2", "b2"], ["y"])]
    outs = [helper.make_tensor_value_info("y", tp, None)]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("m1", tp, None))
    g = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", tp, [n, seq, k])], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    x = (r.standard_normal((n, seq, k)) * 2).astype(dt)
    return m.SerializeToString(), {"x": x}


def _op_types(sess):
    return [n.op_type for n in sess._plan.graph.nodes]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("bias_first", [False, True])
def test_matmul_fusions_vs_unfused_and_ort(dtype, bias_first):
    mb, feeds = _ffn_model(dtype, bias_first=bias_first)
    got, s = _py(mb, feeds)
    ops = _op_types(s)
    if dtype != np.float64:  # the two fused GEMMs become one float32 FeedForward block (float16: computed in float32)
        assert ops.count("FeedForward") == 1 and "MatMulBias" not in ops and "MatMul" not in ops
    else:
        assert "MatMulBiasGelu" in ops and "MatMulBias" in ops and "MatMul" not in ops and "FeedForward" not in ops
    ref, s1 = _py(mb, feeds, level=onnxpy.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    assert "MatMulBias" not in _op_types(s1) and "MatMulBiasGelu" not in _op_types(s1)
    tol = 2e-2 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got[0].astype(np.float64), ref[0].astype(np.float64), rtol=tol, atol=tol)
    if dtype == np.float64:
        return  # onnxruntime's CPU EP has no double Erf
    exp = _ort(mb, feeds)
    assert got[0].dtype == exp[0].dtype
    np.testing.assert_allclose(got[0].astype(np.float64), exp[0].astype(np.float64), rtol=tol, atol=tol)


def test_matmul_bias_fusion_guards():
    # the product is also a graph output: neither Add is fusable for the first MatMul
    mb, feeds = _ffn_model(np.float32, extra_reader=True, gelu=False)
    got, s = _py(mb, feeds)
    assert _op_types(s).count("MatMulBias") == 1 and "MatMul" in _op_types(s)
    np.testing.assert_allclose(got[0], _ort(mb, feeds)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], _ort(mb, feeds)[1])
    # a [1, h] bias is not the 1-D form
    mb, feeds = _ffn_model(np.float32, bias_2d=True, gelu=False)
    got, s = _py(mb, feeds)
    assert _op_types(s).count("MatMulBias") == 1
    np.testing.assert_allclose(got[0], _ort(mb, feeds)[0], rtol=1e-5, atol=1e-5)
    # switched off by name
    _, s = _py(mb, feeds, disabled=("MatMulBiasFusion",))
    assert "MatMulBias" not in _op_types(s)


def test_matmul_bias_fusion_dynamic_weight_not_fused():
    r = _rng(8)
    a = r.standard_normal((2, 3, 4)).astype(np.float32)
    w = r.standard_normal((4, 5)).astype(np.float32)
    b = r.standard_normal(5).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                          "g", [helper.make_tensor_value_info("a", 1, list(a.shape)),
                                helper.make_tensor_value_info("w", 1, list(w.shape))],
                          [helper.make_tensor_value_info("y", 1, None)], [numpy_helper.from_array(b, "b")])
    mb = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    got, s = _py(mb, {"a": a, "w": w})
    assert "MatMulBias" not in _op_types(s)
    np.testing.assert_allclose(got[0], a @ w + b, rtol=1e-6)


# ------------------------------------------------------------------------------------------------ MHA softmax
def _mha(q, k, v, mask, n):
    return ct.multi_head_attention(q, k, v, None, None, mask, num_heads=n, _output_names=("y",))


def _mha_slow(q, k, v, mask, n, monkeypatch):
    with monkeypatch.context() as mp:
        mp.setattr(ct, "_EXP_SAFE", -np.inf)
        return _mha(q, k, v, mask, n)


@pytest.mark.parametrize("case", ["plain", "large", "masked_row", "neg_inf_row", "nan", "f64"])
def test_mha_fast_softmax_matches_max_subtraction(case, monkeypatch):
    r = _rng(9)
    B, S, N, H = 2, 9, 3, 4
    dt = np.float64 if case == "f64" else np.float32
    q, k, v = [r.standard_normal((B, S, N * H)).astype(dt) for _ in range(3)]
    mask = np.zeros((B, 1, S, S), dt)
    mask[..., -2:] = -10000
    if case == "large":
        q *= 40  # scores beyond 60: the usual path
    elif case == "masked_row":
        mask[1, :, 3, :] = -10000  # every key of one query masked: its sum underflows, redone with the maxima
    elif case == "neg_inf_row":
        mask[0, :, 2, :] = -np.inf
    elif case == "nan":
        q[0, 1, 0] = np.nan
    fast = _mha(q, k, v, mask, N)
    slow = _mha_slow(q, k, v, mask, N, monkeypatch)
    np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.array_equal(np.isnan(fast), np.isnan(slow))


def test_mha_vs_ort_bert_shape():
    r = _rng(10)
    B, S, N, H = 1, 33, 4, 8
    q, k, v = [r.standard_normal((B, S, N * H)).astype(np.float32) for _ in range(3)]
    mask = np.zeros((1, 1, S, S), np.float32)
    mask[..., 20:] = -10000
    mb, feeds = _mha_model(q, k, v, mask, N)
    got, _ = _py(mb, feeds)
    np.testing.assert_allclose(got[0], _ort(mb, feeds)[0], rtol=1e-4, atol=1e-5)


def _mha_model(q, k, v, mask, n):
    """A one-node MultiHeadAttention model (attention_bias input) and its feeds."""
    names = ["q", "k", "v", "", "", "m"]
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain=MS, num_heads=n)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(nm, 1, list(a.shape))
                                        for nm, a in zip(("q", "k", "v", "m"), (q, k, v, mask))],
                          [helper.make_tensor_value_info("y", 1, None)])
    mb = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                           ir_version=9).SerializeToString()
    return mb, {"q": q, "k": k, "v": v, "m": mask}


# ------------------------------------------------------------------------------ MHA: masked keys left out
_FMIN = float(np.finfo(np.float32).min)


def _mha_all_keys(q, k, v, mask, n, monkeypatch):
    with monkeypatch.context() as mp:
        mp.setattr(ct, "_DROP_BELOW", np.nan)  # (no entry compares <= NaN: every key attended)
        return _mha(q, k, v, mask, n)


@pytest.mark.parametrize("case", ["suffix", "scattered", "kept_bias", "one_row", "query_rows_differ", "neg_10000",
                                  "all_masked", "nan_masked_key", "inf_masked_value", "batch2"])
def test_mha_drops_masked_keys_exactly(case, monkeypatch):
    """A batch-1 key-only additive term of finfo.min / -inf entries: the masked keys are left out of the softmax
    (exp would give 0 for them), with the same result as attending over all keys; the cases that must not drop
    (query-dependent terms, -10000, everything masked, a non-finite masked key or value, batch > 1) agree too."""
    r = _rng(12)
    B, S, N, H = (2 if case == "batch2" else 1), 10, 3, 4
    q, k, v = [r.standard_normal((B, S, N * H)).astype(np.float32) for _ in range(3)]
    mask = np.zeros((1, 1, S, S), np.float32)
    mask[..., 7:] = _FMIN
    if case == "scattered":
        mask[..., [1, 4]] = -np.inf
    elif case == "kept_bias":
        mask[..., :7] = r.standard_normal(7).astype(np.float32)
    elif case == "query_rows_differ":
        mask[0, 0, 3, 2] = _FMIN
    elif case == "neg_10000":
        mask[..., 7:] = -10000
    elif case == "all_masked":
        mask[...] = _FMIN
    elif case == "nan_masked_key":
        k[0, 8, 1] = np.nan
    elif case == "inf_masked_value":
        v[0, 9, 0] = np.inf
    kept = []
    orig = ct._drop_masked_keys
    monkeypatch.setattr(ct, "_drop_masked_keys", lambda *a: kept.append(orig(*a)[0].shape[2]) or orig(*a))
    if case == "one_row":  # a 2-D key padding mask with a finfo.min filter value: a [1, 1, 1, T] term
        kpm = np.array([[1] * 7 + [0] * 3], np.int32)
        run = lambda: ct.multi_head_attention(q, k, v, None, kpm, None, num_heads=N, mask_filter_value=_FMIN,  # noqa: E731
                                              _output_names=("y",))
        got = run()
        monkeypatch.setattr(ct, "_drop_masked_keys", orig)
        monkeypatch.setattr(ct, "_DROP_BELOW", np.nan)
        want = run()
    else:
        got = _mha(q, k, v, mask, N)
        monkeypatch.setattr(ct, "_drop_masked_keys", orig)
        want = _mha_all_keys(q, k, v, mask, N, monkeypatch)
    dropped = case in ("suffix", "scattered", "kept_bias", "one_row")
    assert kept == ([7 - 2 * (case == "scattered")] if dropped else [S] * len(kept))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, equal_nan=True)
    if case == "suffix":  # (and onnxruntime, which attends over every key)
        mb, feeds = _mha_model(q, k, v, mask, N)
        np.testing.assert_allclose(got, _ort(mb, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_mha_and_skip_layernorm_float16_inputs(dtype):
    r = _rng(11)
    B, S, N, H = 2, 5, 2, 6
    q, k, v = [r.standard_normal((B, S, N * H)).astype(dtype) for _ in range(3)]
    got = _mha(q, k, v, None, N)
    exp = _mha(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), None, N).astype(dtype)
    np.testing.assert_array_equal(got, exp)  # float16 widened exactly, computed in float32, rounded once
    x, sk = [r.standard_normal((B, S, 3001)).astype(dtype) for _ in range(2)]
    gam, bet = [r.standard_normal(3001).astype(dtype) for _ in range(2)]
    from onnxpy.ops.contrib_norm import skip_layer_normalization as sln

    got = sln(x, sk, gam, bet, epsilon=1e-5, _output_names=("y",))
    exp = sln(x.astype(np.float32), sk.astype(np.float32), gam.astype(np.float32), bet.astype(np.float32),
              epsilon=1e-5, _output_names=("y",)).astype(dtype)
    np.testing.assert_array_equal(got, exp)
    sk1 = sk[:1]  # a broadcast skip
    got = sln(x, sk1, gam, bet, epsilon=1e-5, _output_names=("y",))
    exp = sln(x.astype(np.float32), sk1.astype(np.float32), gam.astype(np.float32), bet.astype(np.float32),
              epsilon=1e-5, _output_names=("y",)).astype(dtype)
    np.testing.assert_array_equal(got, exp)


def test_saved_model_leaves_matmul_fusions_out(tmp_path):
    mb, feeds = _ffn_model(np.float32)
    so = onnxpy.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    s = onnxpy.InferenceSession(mb, so)
    y = s.run(None, feeds)[0]
    saved = onnx.load(str(tmp_path / "opt.onnx"))
    assert not {n.op_type for n in saved.graph.node} & {"MatMulBias", "MatMulBiasGelu", "FeedForward"}
    np.testing.assert_allclose(_ort(saved.SerializeToString(), feeds)[0], y, rtol=1e-5, atol=1e-5)
    _, s2 = _py(mb, feeds)  # without a file to write, the session itself runs the fused ops
    assert "FeedForward" in _op_types(s2)
    _, s3 = _py(mb, feeds, disabled=("FeedForwardFusion",))
    assert "MatMulBiasGelu" in _op_types(s3) and "FeedForward" not in _op_types(s3)


# ------------------------------------------------------------------------------ FeedForward (level-99 FFN block)
def _ffn_weights(h=24, f=40, h2=24, dtype=np.float32, layout="F", seed=11):
    r = _rng(seed)
    w1 = np.asarray((r.standard_normal((h, f)) * 0.2).astype(dtype), order=layout)
    w2 = np.asarray((r.standard_normal((f, h2)) * 0.2).astype(dtype), order=layout)
    b1, b2 = r.standard_normal(f).astype(dtype), r.standard_normal(h2).astype(dtype)
    for a in (w1, w2, b1, b2):
        a.flags.writeable = False
    return w1, b1, w2, b2


def _ffn_ref(a, w1, b1, w2, b2):
    h = a.astype(np.float64) @ w1 + b1
    return (_gelu_ref(h) @ w2 + b2)


@pytest.mark.parametrize("a_shape", [(9, 24), (2, 7, 24), (1, 24), (1, 1, 3, 24)])
@pytest.mark.parametrize("layout", ["C", "F"])
def test_feed_forward_specialized_vs_reference(a_shape, layout):
    w1, b1, w2, b2 = _ffn_weights(layout=layout)
    a = (_rng(2).standard_normal(a_shape) * 2).astype(np.float32)
    run = cf.feed_forward.specialize((NOT_CONST, w1, b1, w2, b2), {})
    assert run is not None
    got = run(a, w1, b1, w2, b2)
    assert got.shape == a_shape[:-1] + (24,) and got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_allclose(got, _ffn_ref(a, w1, b1, w2, b2), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, cf.feed_forward(a, w1, b1, w2, b2), rtol=1e-5, atol=1e-5)
    assert not np.shares_memory(got, a)


def test_feed_forward_fallbacks_and_errors():
    w1, b1, w2, b2 = _ffn_weights()
    run = cf.feed_forward.specialize((NOT_CONST, w1, b1, w2, b2), {})
    a = _rng(3).standard_normal((5, 24))
    # float64 activations, a non-contiguous activation and other weights go the generic (two-op) way
    np.testing.assert_allclose(run(a.astype(np.float32).T.copy().T, w1, b1, w2, b2),
                               _ffn_ref(a, w1, b1, w2, b2), rtol=1e-5, atol=1e-5)
    with pytest.raises((TypeError, ValueError)):
        run(a, w1, b1, w2, b2)  # float64 A with float32 weights: MatMulBiasGelu's type error
    w1b = np.ascontiguousarray(w1) * 2
    np.testing.assert_allclose(run(a.astype(np.float32), w1b, b1, w2, b2), _ffn_ref(a, w1b, b1, w2, b2),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        run(_rng(4).standard_normal((5, 23)).astype(np.float32), w1, b1, w2, b2)  # wrong inner size
    # no plan-time form for other types or shapes
    w1d = w1.astype(np.float64)
    assert cf.feed_forward.specialize((NOT_CONST, w1d, b1, w2, b2), {}) is None
    assert cf.feed_forward.specialize((NOT_CONST, w1, b1[:-1], w2, b2), {}) is None
    assert cf.feed_forward.specialize((NOT_CONST, w1, b1, NOT_CONST, b2), {}) is None


def test_feed_forward_fusion_guards():
    # the GELU output is also read elsewhere (a graph output): the two GEMMs stay apart
    mb, feeds = _ffn_model(np.float32)
    m = onnx.load_from_string(mb)
    m.graph.output.append(helper.make_tensor_value_info("g", TensorProto.FLOAT, None))
    got, s = _py(m.SerializeToString(), feeds)
    ops = _op_types(s)
    assert "FeedForward" not in ops and "MatMulBiasGelu" in ops
    exp = _ort(m.SerializeToString(), feeds)
    for g_, e_ in zip(got, exp):
        np.testing.assert_allclose(g_, e_, rtol=1e-5, atol=1e-5)
    # a ReLU block is not a GELU block
    mb, feeds = _ffn_model(np.float32, gelu=False)
    _, s = _py(mb, feeds)
    assert "FeedForward" not in _op_types(s)


# ------------------------------------------------------------------ Fortran-ordered constant weights (level 99)
@pytest.mark.parametrize("m,k,n", [(128, 300, 260), (1, 300, 260), (5, 64, 2000), (7, 40, 3), (3, 16, 4500)])
@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("blas_transpose", [True, False])
def test_matmul_w_layouts(m, k, n, layout, bias, blas_transpose, monkeypatch):
    """matmul_w gives a fresh C-contiguous a @ w (+ c) for either weight layout and every width (2000: the
    transposed product only with OpenBLAS's transpose; 4500: past its limit too), with and without that transpose."""
    monkeypatch.setattr(linalg, "_YT_FAST", blas_transpose)
    rng = _rng(1)
    w = np.asarray(rng.standard_normal((k, n)).astype(np.float32), order=layout)
    a = rng.standard_normal((m, k)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32) if bias else None
    got = linalg.matmul_w(a, w, c)
    want = a.astype(np.float64) @ w.astype(np.float64) + (0 if c is None else c)
    assert got.flags.c_contiguous and got.flags.writeable and got.shape == (m, n) and got.dtype == np.float32
    assert not np.shares_memory(got, a) and not np.shares_memory(got, w)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("a_shape", [(128, 300), (2, 9, 300), (1, 300)])
@pytest.mark.parametrize("layout", ["C", "F"])
def test_specialized_matmul_bias_and_gelu_weight_layouts(dtype, a_shape, layout):
    rng = _rng(3)
    w = np.asarray(rng.standard_normal((300, 260)).astype(dtype) * dtype(0.05), order=layout)
    w.flags.writeable = False
    c = rng.standard_normal(260).astype(dtype)
    a = rng.standard_normal(a_shape).astype(dtype)
    run = linalg.matmul_bias.specialize((NOT_CONST, w, c), {})
    tol = 2e-3 if dtype == np.float16 else 1e-5
    got = run(a, w, c)
    assert got.dtype == np.dtype(dtype) and got.flags.c_contiguous
    np.testing.assert_allclose(got.astype(np.float64), linalg.matmul_bias(a, w, c).astype(np.float64), rtol=tol,
                               atol=tol)
    run_g = cf.matmul_bias_gelu.specialize((NOT_CONST, w, c), {})
    assert run_g is not None
    ref = cf.matmul_bias_gelu(a, w, c)
    got = run_g(a, w, c)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol)
    # another dtype than the weight's goes to the generic kernel (and its error)
    with pytest.raises(TypeError):
        run(a.astype(np.int32), w, c)


def _linear_model(shared: bool, as_input: bool):
    """x @ W1 + b1 -> (Gelu-free) -> @ W2 + b2 [-> + x @ W1 when ``shared``: W1 also read by a plain MatMul]."""
    rng = _rng(5)
    w1 = (rng.standard_normal((384, 384)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((384, 256)) * 0.05).astype(np.float32)
    b1 = rng.standard_normal(384).astype(np.float32)
    b2 = rng.standard_normal(256).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["h"]),
             helper.make_node("Gemm", ["h", "W2", "b2"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if shared:
        nodes.append(helper.make_node("MatMul", ["h", "W1"], ["z"]))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "W1"), (w2, "W2"), (b1, "b1"), (b2, "b2"))]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 384])]
    if as_input:
        ins.append(helper.make_tensor_value_info("W2", TensorProto.FLOAT, [384, 256]))
    g = helper.make_graph(nodes, "g", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("shared,as_input", [(False, False), (True, False), (False, True)])
def test_level99_fortran_weights(shared, as_input):
    """At level 99 the weights only MatMulBias / Gemm(transB=0) read are kept in Fortran order (same values); a weight
    another op also reads, or one a feed may override, keeps its layout; results match onnxruntime."""
    model = _linear_model(shared, as_input)
    x = _rng(6).standard_normal((128, 384)).astype(np.float32)
    nopack = onnxpy.SessionOptions()  # (weights the plan packs for OpenBLAS's kernel keep their layout: see below)
    nopack.add_session_config_entry("session.disable_prepacking", "1")
    sess = onnxpy.InferenceSession(model, nopack)
    inits = sess._state.plan.graph.initializers
    assert inits["W1"].flags.f_contiguous is not shared
    assert inits["W2"].flags.f_contiguous is not as_input
    want = _ort(model, {"x": x})
    for got, exp in zip(sess.run(None, {"x": x}), want):
        assert got.flags.c_contiguous
        np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)
    if _packed.available():  # packed: not copied to Fortran order first; a weight only its GEMM reads is released
        packed = onnxpy.InferenceSession(model)
        inits = packed._state.plan.graph.initializers
        assert _packed.is_standin(inits["W1"]) is not shared and not inits["W1"].flags.f_contiguous
        assert not _packed.is_standin(inits["W2"]) if as_input else _packed.is_standin(inits["W2"])
        for got, exp in zip(packed.run(None, {"x": x}), want):
            np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-4)
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = onnxpy.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    plain = onnxpy.InferenceSession(model, so)
    assert not any(a.flags.f_contiguous and not a.flags.c_contiguous
                   for a in plain._state.plan.graph.initializers.values())


def _gemm_model(m, k, n, trans_a, trans_b, alpha, beta, with_c, dtype, opset):
    rng = _rng(4)
    tp = _TP[np.dtype(dtype)]
    b = (rng.standard_normal((n, k) if trans_b else (k, n)) * 0.05).astype(dtype)
    inits = [numpy_helper.from_array(b, "B")]
    ins = ["A", "B"]
    if with_c:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(dtype), "C"))
        ins.append("C")
    node = helper.make_node("Gemm", ins, ["Y"], alpha=alpha, beta=beta, transA=trans_a, transB=trans_b)
    a_shape = [k, m] if trans_a else [m, k]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", tp, a_shape)],
                          [helper.make_tensor_value_info("Y", tp, [m, n])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return model, rng.standard_normal(a_shape).astype(dtype)


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("alpha,beta,with_c", [(1.0, 1.0, True), (0.5, 2.0, True), (1.0, 1.0, False)])
@pytest.mark.parametrize("dtype,opset", [(np.float32, 13), (np.float64, 11)])
def test_gemm_constant_b_specialized_vs_ort(trans_a, trans_b, alpha, beta, with_c, dtype, opset):
    model, a = _gemm_model(33, 300, 260, trans_a, trans_b, alpha, beta, with_c, dtype, opset)
    data = model.SerializeToString()
    got = onnxpy.InferenceSession(data).run(None, {"A": a})[0]
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]
    assert got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_gemm_errors_with_constant_b():
    """Gemm with a constant B (the transposed-B product path) still reports bad inputs like the generic kernel."""
    model, _ = _gemm_model(4, 260, 300, 0, 1, 1.0, 1.0, False, np.float32, 13)
    sess = onnxpy.InferenceSession(model.SerializeToString())
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.InvalidArgument):
        sess.run(None, {"A": np.ones((4, 7), np.float32)})
    a = _rng(5).standard_normal((4, 260)).astype(np.float32)
    b = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(sess.run(None, {"A": a})[0], a @ b.T, rtol=1e-4, atol=1e-4)


def test_level99_fortran_weights_replace_the_shared_original():
    """The optimizer's copy of the graph shares arrays with the loaded model: the Fortran-ordered weight replaces the
    original in both, so no second copy of a weight stays alive while the session is built."""
    from onnxpy.ir.load import load_model
    from onnxpy.optimizer import optimize

    model = load_model(_linear_model(False, False))
    before = model.graph.initializers["W1"]
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")  # (else W1 is left for the plan to pack)
    opt = optimize(model, so)
    after = opt.graph.initializers["W1"]
    assert after.flags.f_contiguous and np.array_equal(after, before)
    # the loaded model now holds the same memory (equal values: its content is unchanged), not the original
    assert np.shares_memory(model.graph.initializers["W1"], after) and not np.shares_memory(before, after)


@pytest.mark.parametrize("case", ["zeros", "same_rows", "rows_differ", "nan_entry"])
def test_mha_key_only_term_without_masked_keys(case, monkeypatch):
    """A [1, 1, S, T] term with no masked key (a padding mask over a full-length input): the term is the same for
    every query, so one row stands for it, and an all-zero term is left out (a NaN entry keeps the full term: the
    rows no longer compare equal); results equal adding the full term."""
    r = _rng(13)
    S, N, H = 9, 3, 4
    q, k, v = [r.standard_normal((1, S, N * H)).astype(np.float32) for _ in range(3)]
    mask = np.zeros((1, 1, S, S), np.float32)
    if case in ("same_rows", "rows_differ", "nan_entry"):
        mask[...] = r.standard_normal(S).astype(np.float32)
    if case == "rows_differ":
        mask[0, 0, 4, 2] += 1.5
    if case == "nan_entry":
        mask[..., 5] = np.nan
    terms = []
    orig = ct._drop_masked_keys
    monkeypatch.setattr(ct, "_drop_masked_keys", lambda *a: terms.append(orig(*a)[2]) or orig(*a))
    got = _mha(q, k, v, mask, N)
    monkeypatch.setattr(ct, "_ROW_TERM", False)
    monkeypatch.setattr(ct, "_drop_masked_keys", orig)
    want = _mha(q, k, v, mask, N)
    expect_shape = {"zeros": None, "same_rows": (1, 1, 1, S), "rows_differ": (1, 1, S, S), "nan_entry": (1, 1, S, S)}
    assert [None if t is None else t.shape for t in terms] == [expect_shape[case]]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_key_sums_as_products_with_ones(dtype):
    """The softmax's sums over the keys are products with a row of ones: numpy's sums up to rounding, NaN and inf
    carried through, and the same shape (the axis kept)."""
    from onnxpy.ops import contrib_transformer as ct

    st = np.random.default_rng(4).random((2, 3, 40, 17)).astype(dtype)
    st[0, 1, 5, 2] = np.nan
    st[1, 2, 7, 3] = np.inf
    got = ct._key_sums(st)
    want = np.sum(st, axis=-2, keepdims=True)
    assert got.shape == want.shape == (2, 3, 1, 17) and got.dtype == st.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert np.isnan(got[0, 1, 0, 2]) and np.isposinf(got[1, 2, 0, 3])


# ------------------------------------------------- FeedForward with FastGelu (GPT-2's MLP as Conv1D exports it)
def _gpt2_mlp_model(h=32, f=128, rows=(2, 7), biases=(True, True), gelu_bias=False, target=(-1, None),
                    allowzero=1, trans_b=0, extra_reader=False, view=None, ts_shapes=False):
    r = _rng(21)
    w1 = (r.standard_normal((f, h) if trans_b else (h, f)) * 0.2).astype(np.float32)
    w2 = (r.standard_normal((h, f) if trans_b else (f, h)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
             numpy_helper.from_array(np.array(view or rows + (f,), np.int64), "s3"),
             numpy_helper.from_array(np.array([t if t is not None else f for t in target], np.int64), "s2")]
    g1_in, g2_in = ["x", "w1"], ["h2", "w2"]
    for i, (on, n, ins) in enumerate(((biases[0], f, g1_in), (biases[1], h, g2_in))):
        if on:
            inits.append(numpy_helper.from_array(r.standard_normal(n).astype(np.float32), f"c{i}"))
            ins.append(f"c{i}")
    gelu_in = ["g3"]
    if gelu_bias:
        inits.append(numpy_helper.from_array(r.standard_normal(f).astype(np.float32), "fb"))
        gelu_in.append("fb")
    nodes = [helper.make_node("Gemm", g1_in, ["g"], transB=trans_b),
             helper.make_node("Reshape", ["g", "s3"], ["g3"], allowzero=allowzero),
             helper.make_node("FastGelu", gelu_in, ["a3"], domain=MS),
             helper.make_node("Reshape", ["a3", "s2d" if ts_shapes else "s2"], ["h2"], allowzero=allowzero),
             helper.make_node("Gemm", g2_in, ["y"], transB=trans_b)]
    if ts_shapes:  # (TorchScript's form: the second target built from the GELU output's shape)
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "m1"))
        nodes[3:3] = [helper.make_node("Shape", ["a3"], ["sa"], start=-1),
                      helper.make_node("Concat", ["m1", "sa"], ["s2d"], axis=0)]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("a3", TensorProto.FLOAT, None))
    n = rows[0] * rows[1]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, h])], outs,
                              inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    return m.SerializeToString(), {"x": _rng(22).standard_normal((n, h)).astype(np.float32)}


@pytest.mark.parametrize("biases,gelu_bias,ts", [((True, True), False, False), ((False, False), False, False),
                                                 ((True, False), True, False), ((False, True), True, True)])
@pytest.mark.parametrize("rows", [(2, 7), (1, 128)])
def test_feed_forward_tanh_fusion_vs_unfused_and_ort(biases, gelu_bias, ts, rows):
    """Gemm -> Reshape -> FastGelu -> Reshape -> Gemm becomes one FeedForward(activation="gelu_tanh"): the
    unfused graph's results (and onnxruntime's) with missing biases as zeros and FastGelu's bias folded in; a Shape
    reading the GELU's output (TorchScript's second target) becomes a ShapeOf of the block's input."""
    mb, feeds = _gpt2_mlp_model(rows=rows, biases=biases, gelu_bias=gelu_bias, h=64 if rows[1] > 100 else 32,
                                f=768 if rows[1] > 100 else 128, ts_shapes=ts)
    got, s = _py(mb, feeds)
    ops = _op_types(s)
    assert ops.count("FeedForward") == 1 and "FastGelu" not in ops and "Gemm" not in ops
    assert ("ShapeOf" in ops) == ts and "Shape" not in ops
    step = next(st for st in s._plan.steps if st.node.op_type == "FeedForward")
    assert callable(step.fn) and getattr(step.fn, "__name__", "") in ("run", "run_packed")  # the plan-time form
    want, s0 = _py(mb, feeds, disabled=("FeedForwardTanhFusion",))
    assert "FeedForward" not in _op_types(s0)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[0], _ort(mb, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ts", [False, True])
def test_feed_forward_tanh_weights_fortran_ordered_unpacked(ts):
    """Without prepacking, the fused MLP's weights take the Fortran layout its transposed GEMMs run fastest, with one
    or both view shapes as inputs (six or seven)."""
    mb, feeds = _gpt2_mlp_model(ts_shapes=ts, rows=(2, 70), h=256, f=512)  # (64K+ elements each)
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    s = onnxpy.InferenceSession(mb, so)
    ff = next(n for n in s._plan.graph.nodes if n.op_type == "FeedForward")
    assert len(ff.inputs) == (7 if ts else 6)
    inits = s._state.plan.graph.initializers
    assert inits["w1"].flags.f_contiguous and inits["w2"].flags.f_contiguous
    np.testing.assert_allclose(s.run(None, feeds)[0], _ort(mb, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["target", "zero_target", "trans_b", "extra_reader"])
def test_feed_forward_tanh_fusion_guards(case):
    kw = {"target": dict(target=(-1, 64)), "zero_target": dict(target=(0, None), allowzero=0, rows=(14, 1)),
          "trans_b": dict(trans_b=1), "extra_reader": dict(extra_reader=True)}[case]
    mb, feeds = _gpt2_mlp_model(**kw)
    if case == "zero_target":  # a second target other than [-1, F] goes along as an input, checked at run time
        got, s = _py(mb, feeds)
        assert "FeedForward" in _op_types(s)
        np.testing.assert_allclose(got[0], _ort(mb, feeds)[0], rtol=1e-4, atol=1e-4)
        return
    if case == "target":  # the second Reshape does not give back the first product's rows x 128: an error either way
        with pytest.raises(Exception, match="Gemm|MatMul|inner|dimension"):
            _py(mb, feeds)
        return
    got, s = _py(mb, feeds)
    assert "FeedForward" not in _op_types(s)
    for g_, e_ in zip(got, _ort(mb, feeds)):
        np.testing.assert_allclose(g_, e_, rtol=1e-4, atol=1e-4)


def test_feed_forward_activation_attribute():
    w1, b1, w2, b2 = _ffn_weights()
    a = (_rng(5).standard_normal((6, 24)) * 2).astype(np.float32)
    h = a.astype(np.float64) @ w1 + b1
    want = (0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))) @ w2 + b2
    np.testing.assert_allclose(cf.feed_forward(a, w1, b1, w2, b2, activation="gelu_tanh"), want, rtol=1e-5,
                               atol=1e-5)
    run = cf.feed_forward.specialize((NOT_CONST, w1, b1, w2, b2), {"activation": b"gelu_tanh"})
    np.testing.assert_allclose(run(a, w1, b1, w2, b2), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="activation"):
        cf.feed_forward(a, w1, b1, w2, b2, activation="relu")
    with pytest.raises(ValueError, match="activation"):
        cf.feed_forward.specialize((NOT_CONST, w1, b1, w2, b2), {"activation": "swish"})
    # the removed Reshape's target is checked, not applied (its sixth input: the plan-time form still applies)
    assert cf.feed_forward.specialize((NOT_CONST, w1, b1, w2, b2, NOT_CONST), {"activation": "gelu_tanh"}) is not None
    v = np.array([2, 3, 40], np.int64)
    np.testing.assert_allclose(run(a, w1, b1, w2, b2, v), want, rtol=1e-5, atol=1e-5)
    for bad in (np.array([4, 4, 40], np.int64), np.array([-1, 7], np.int64)):
        with pytest.raises(ValueError, match="Reshape"):
            run(a, w1, b1, w2, b2, bad)
        with pytest.raises(ValueError, match="Reshape"):
            cf.feed_forward(a, w1, b1, w2, b2, bad, activation="gelu_tanh")


@pytest.mark.parametrize("rows", [(2, 7), (1, 128)])
def test_feed_forward_tanh_fusion_keeps_the_view_error(rows):
    """A first Reshape the input does not fit raises in the fused graph as in the unfused one."""
    big = rows[1] > 100
    mb, feeds = _gpt2_mlp_model(rows=rows, view=(3, 5, 768 if big else 128), h=64 if big else 32, f=768 if big else 128)
    so = onnxpy.SessionOptions()
    s = onnxpy.InferenceSession(mb, so)
    assert "FeedForward" in _op_types(s)
    with pytest.raises(Exception, match="cannot be reshaped"):
        s.run(None, feeds)
    s1 = onnxpy.InferenceSession(mb, so, disabled_optimizers=["FeedForwardTanhFusion"])
    with pytest.raises(Exception, match="cannot be reshaped"):
        s1.run(None, feeds)
