"""ai.onnxpy.AttentionBlock (level 99): self-attention from its input projection to its output projection as one node
(optimizer AttentionBlockFusion, ops/attention_block.py) -- against the unfused graph, onnxruntime, its error replay
and its fallbacks."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.ops import _packed
from onnxpy.ops import attention_block as ab
from onnxpy.ops._shape_util import NOT_CONST

ort = pytest.importorskip("onnxruntime")
MS = "com.microsoft"


def _rng(seed=0):
    return np.random.default_rng(seed)


def _model(B=1, S=128, N=12, H=64, mask=None, bias=False, unidirectional=0, gemm=False, view=None, split_attr=None,
           out_view=None, extra_reader=False, ts_shapes=False):
    """X [B, S, D] -> projection -> Split -> Reshape [B, S, N, H] -> Reshape [B, S, D] (each of q, k, v, their own
    shape inputs) -> MultiHeadAttention -> Reshape -> projection.  ``gemm``: the projections as 2-D Gemms (X and the
    attention output flattened to rows, the projection viewed as [B, S, 3D] before the Split)."""
    r = _rng(3)
    D = N * H
    inits = [numpy_helper.from_array((r.standard_normal((D, 3 * D)) * 0.05).astype(np.float32), "wqkv"),
             numpy_helper.from_array((r.standard_normal(3 * D) * 0.1).astype(np.float32), "bqkv"),
             numpy_helper.from_array((r.standard_normal((D, D)) * 0.05).astype(np.float32), "wo"),
             numpy_helper.from_array((r.standard_normal(D) * 0.1).astype(np.float32), "bo"),
             numpy_helper.from_array(np.array((B, S, N, H), np.int64), "s4"),
             numpy_helper.from_array(np.array(view or (B, S, D), np.int64), "s3"),
             numpy_helper.from_array(np.array([B, S, 3 * D], np.int64), "sg"),
             numpy_helper.from_array(np.array(out_view or (B * S, D), np.int64), "s2")]
    nodes = []
    if gemm:
        nodes += [helper.make_node("Reshape", ["x", "s2x"], ["x2"]),
                  helper.make_node("Gemm", ["x2", "wqkv", "bqkv"], ["g2"]),
                  helper.make_node("Reshape", ["g2", "sg"], ["g"])]
        inits.append(numpy_helper.from_array(np.array([B * S, D], np.int64), "s2x"))
    else:
        nodes += [helper.make_node("MatMul", ["x", "wqkv"], ["m"]), helper.make_node("Add", ["m", "bqkv"], ["g"])]
    if split_attr is not None:
        inits.append(numpy_helper.from_array(np.array(split_attr, np.int64), "sp"))
        nodes.append(helper.make_node("Split", ["g", "sp"], ["q0", "k0", "v0"], axis=2))
    else:
        nodes.append(helper.make_node("Split", ["g"], ["q0", "k0", "v0"], axis=-1, num_outputs=3))
    for t in "qkv":
        s4 = "s4"
        if ts_shapes:  # (TorchScript's form: the view's target built from the split part's own shape)
            s4 = f"s4{t}"
            nodes += [helper.make_node("Shape", [f"{t}0"], [f"sh{t}"], end=2),
                      helper.make_node("Concat", [f"sh{t}", "nh"], [s4], axis=0)]
        nodes += [helper.make_node("Reshape", [f"{t}0", s4], [f"{t}1"]),
                  helper.make_node("Reshape", [f"{t}1", "s3"], [f"{t}2"])]
    if ts_shapes:
        inits.append(numpy_helper.from_array(np.array([N, H], np.int64), "nh"))
    mha_in = ["q2", "k2", "v2", "", "mask" if mask is not None and mask.ndim <= 2 else "",
              "bias" if bias else ""]
    while mha_in and not mha_in[-1]:
        mha_in.pop()
    nodes.append(helper.make_node("MultiHeadAttention", mha_in, ["o"], domain=MS, num_heads=N,
                                  unidirectional=unidirectional))
    if ts_shapes:  # (and the output's flattening target from the attention output's shape)
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "m1"))
        nodes += [helper.make_node("Shape", ["o"], ["sho"], start=-1),
                  helper.make_node("Concat", ["m1", "sho"], ["s2d"], axis=0)]
    nodes.append(helper.make_node("Reshape", ["o", "s2d" if ts_shapes else "s2"], ["o2"]))
    if gemm:
        nodes.append(helper.make_node("Gemm", ["o2", "wo", "bo"], ["y"]))
    else:
        nodes += [helper.make_node("MatMul", ["o2", "wo"], ["mo"]), helper.make_node("Add", ["mo", "bo"], ["y"])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D] if ts_shapes else [B, S, D])]
    feeds = {"x": r.standard_normal((B, S, D)).astype(np.float32)}
    if mask is not None:
        ins.append(helper.make_tensor_value_info("mask", TensorProto.INT32, list(mask.shape)))
        feeds["mask"] = mask
    if bias:
        b = np.where(np.triu(np.ones((S, S), bool), 1), np.float32(-1e9), np.float32(0)).reshape(1, 1, S, S)
        ins.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 1, S, S]))
        feeds["bias"] = b.astype(np.float32)
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        outs.append(helper.make_tensor_value_info("q1", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "attn", ins, outs, inits)
    mb = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)],
                           ir_version=9).SerializeToString()
    return mb, feeds


def _sess(mb, disabled=()):
    return onnxpy.InferenceSession(mb, disabled_optimizers=list(disabled))


def _ops(s):
    return [n.op_type for n in s._plan.graph.nodes]


def _ort(mb, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(mb, so, providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("kind", ["plain", "mask", "bias", "causal", "gemm", "small_heads", "batch2", "split_input",
                                  "ts_shapes", "gemm_ts_shapes"])
def test_attention_block_vs_unfused_and_ort(kind):
    kw = {"plain": {}, "mask": dict(mask=np.concatenate([np.ones((1, 100)), np.zeros((1, 28))], 1).astype(np.int32)),
          "bias": dict(bias=True), "causal": dict(unidirectional=1), "gemm": dict(gemm=True),
          "small_heads": dict(N=12, H=32), "batch2": dict(B=2, S=64, N=4, H=64),
          "split_input": dict(split_attr=[768, 768, 768]), "ts_shapes": dict(ts_shapes=True),
          "gemm_ts_shapes": dict(gemm=True, ts_shapes=True, unidirectional=1)}[kind]
    mb, feeds = _model(**kw)
    s = _sess(mb)
    assert _ops(s).count("AttentionBlock") == 1 and "MultiHeadAttention" not in _ops(s)
    if "ts_shapes" in kw:  # the Shape readers inside the block became ShapeOf nodes
        assert "Shape" not in _ops(s) and "ShapeOf" in _ops(s)  # (identical ones merged by CSE)
        from onnxpy.execution.plan import _ShapeChain

        # ... replayed from the input before its flattening, they join its shape chains (run once per shape)
        assert any(isinstance(f[0], _ShapeChain) for f in s._plan.fast)
    step = next(st for st in s._plan.steps if st.node.op_type == "AttentionBlock")
    if _packed.available():
        assert getattr(step.fn, "__name__", "") == "run"  # the plan-time form
    got = s.run(None, feeds)[0]
    s0 = _sess(mb, ("AttentionBlockFusion",))
    assert "AttentionBlock" not in _ops(s0)
    want = s0.run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, _ort(mb, feeds)[0], rtol=1e-4, atol=1e-4)
    with _packed._pool_acquire:  # the helpers busy (another run holds them): the same parts, the same bits
        np.testing.assert_array_equal(s.run(None, feeds)[0], got)


@pytest.mark.parametrize("case", ["extra_reader", "uneven_split"])
def test_attention_block_fusion_guards(case):
    kw = {"extra_reader": dict(extra_reader=True), "uneven_split": dict(split_attr=[768, 1024, 512])}[case]
    mb, feeds = _model(**kw)
    s = _sess(mb)
    assert "AttentionBlock" not in _ops(s)
    if case == "extra_reader":
        np.testing.assert_allclose(s.run(None, feeds)[0], _ort(mb, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["view", "out_view"])
def test_attention_block_keeps_the_reshape_errors(case):
    """A Reshape the input does not fit raises in the fused graph as in the unfused one (the basic level merges the
    [B, S, N, H] view into the one after it, in onnxruntime too: the chains' last targets are the ones checked)."""
    kw = {"view": dict(view=(1, 64, 768)), "out_view": dict(out_view=(100, 768))}[case]
    mb, feeds = _model(**kw)
    s = _sess(mb)
    assert "AttentionBlock" in _ops(s)
    with pytest.raises(Exception, match="cannot be reshaped"):
        s.run(None, feeds)
    with pytest.raises(Exception, match="cannot be reshaped"):
        _sess(mb, ("AttentionBlockFusion",)).run(None, feeds)


def test_attention_block_kernel_paths():
    """The plan-time form against the generic kernel: the parallel form, the few-rows and many-rows fallbacks (the
    generic sequence on the real weights), and other-than-plan inputs."""
    r = _rng(5)
    N, H = 4, 64
    D = N * H
    wq = (r.standard_normal((D, 3 * D)) * 0.05).astype(np.float32)
    bq = r.standard_normal(3 * D).astype(np.float32)
    wo = (r.standard_normal((D, D)) * 0.05).astype(np.float32)
    bo = r.standard_normal(D).astype(np.float32)
    kw = dict(num_heads=N, pre_allowzero=[], mid_allowzero=[0], post_allowzero=[])
    consts = (NOT_CONST, wq, bq, wo, bo, None, None, NOT_CONST, NOT_CONST, NOT_CONST)
    run = ab.attention_block.specialize(consts, kw)
    assert run is not None
    for B, S in ((1, 64), (2, 32), (1, 8), (1, 300)):
        x = r.standard_normal((B, S, D)).astype(np.float32)
        t = [np.array([B, S, D], np.int64)] * 3
        want = ab.attention_block(x, wq, bq, wo, bo, None, None, *t, **kw)
        np.testing.assert_allclose(run(x, wq, bq, wo, bo, None, None, *t), want, rtol=1e-5, atol=1e-5)
    # the plan releases the weights (stand-ins): no path unpacks them (300 rows take the ops in turn, packed)
    sq, so = _packed.standin(wq), _packed.standin(wo)
    if sq is not None and so is not None:
        x = r.standard_normal((1, 300, D)).astype(np.float32)
        t = [np.array([1, 300, D], np.int64)] * 3
        want = ab.attention_block(x, wq, bq, wo, bo, None, None, *t, **kw)
        orig = _packed._unpack
        _packed._unpack = None  # (would raise if called)
        try:
            np.testing.assert_allclose(run(x, sq, bq, so, bo, None, None, *t), want, rtol=1e-5, atol=1e-5)
        finally:
            _packed._unpack = orig
    with pytest.raises(ValueError, match="Reshape"):
        run(x, wq, bq, wo, bo, None, None, np.array([2, 2, D], np.int64), t[1], t[2])
    with pytest.raises(ValueError, match="shape inputs"):
        ab.attention_block(x, wq, bq, wo, bo, None, None, t[0], **kw)
    # no plan-time form for float64 weights or heads that do not divide the hidden size
    assert ab.attention_block.specialize((NOT_CONST, wq.astype(np.float64), bq, wo, bo, None, None), kw) is None
    assert ab.attention_block.specialize(consts, dict(kw, num_heads=5)) is None


def test_pack_with_depth_blocks_and_stand_in():
    r = _rng(6)
    w = r.standard_normal((384, 500)).astype(np.float32)
    pw = _packed.pack(w, depth=192)
    if pw is None:
        pytest.skip("packed GEMM unavailable")
    assert pw.Q == 192 and len(pw.blocks) == 2 and _packed.pack(w, depth=192) is pw and _packed.pack(w) is not pw
    x = r.standard_normal((40, 384)).astype(np.float32)
    np.testing.assert_allclose(_packed.matmul(x, pw), x @ w, rtol=1e-4, atol=1e-4)
    w2 = r.standard_normal((384, 500)).astype(np.float32)
    _packed.pack(w2, depth=192)
    st = _packed.standin(w2)
    np.testing.assert_array_equal(_packed.real(st), w2)


def test_shape_of_kernel():
    x = np.zeros((2, 5, 12), np.float32)
    t = [np.array([-1, 36], np.int64), np.array([10, 12], np.int64)]
    # projection to 36 features, a Reshape, a Split part, a Reshape, an attention output of width 6
    path = [0, 36, 1, 0, 2, -1, 3, 0, 1, 0, 4, 6]
    np.testing.assert_array_equal(ab.shape_of(x, t[0], np.array([2, 5, 12], np.int64), path=path), [2, 5, 6])
    with pytest.raises(ValueError, match="3-D"):  # (an attention output needs a 3-D query)
        ab.shape_of(x, t[0], t[1], path=[0, 36, 1, 0, 2, -1, 3, 0, 1, 0, 4, 6])
    np.testing.assert_array_equal(ab.shape_of(x, t[0], path=[0, 36, 1, 0], start=-1), [36])
    np.testing.assert_array_equal(ab.shape_of(x, path=[0, 36, 2, 2, 3, 12], end=2), [2, 5])
    with pytest.raises(ValueError, match="Reshape"):
        ab.shape_of(x, np.array([7, -1], np.int64), path=[0, 36, 1, 0])
    with pytest.raises(ValueError, match="Split"):
        ab.shape_of(x, path=[0, 35, 2, -1, 3, 0])
    with pytest.raises(ValueError, match="shape inputs"):
        ab.shape_of(x, t[0], path=[0, 36])
    with pytest.raises(ValueError, match="kind"):
        ab.shape_of(x, path=[9, 1])
