"""Constant GEMM weights packed once for OpenBLAS's micro-kernel (ops/_packed.py): products against float64 numpy for
every blocking edge and thread count, the exact unpacking, stand-ins that replace released originals in the plan, the
session paths (MatMul, Gemm, MatMulBias, FeedForward) against onnxruntime, fetches of part of the outputs, weights
that are shared, fed or not finite, session.disable_prepacking, and concurrent runs."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.ops import _packed

pytestmark = pytest.mark.skipif(not _packed.available(), reason="packed GEMMs need numpy's OpenBLAS on Linux x86-64")
RNG = np.random.default_rng(11)


@pytest.mark.parametrize("R,K,N", [(1, 1024, 1000), (3, 256, 300), (16, 384, 256), (17, 800, 129), (300, 500, 300),
                                   (600, 390, 260), (128, 768, 3072), (0, 512, 256), (5, 1, 70000)])
@pytest.mark.parametrize("threads", [None, 1, 2, 3])
def test_packed_product(R, K, N, threads):
    w = RNG.standard_normal((K, N)).astype(np.float32)
    x = RNG.standard_normal((R, K)).astype(np.float32)
    b = RNG.standard_normal(N).astype(np.float32)
    for src in (w, np.asfortranarray(w)):
        pw = _packed.PackedWeight(src)
        want = x.astype(np.float64) @ w.astype(np.float64)
        got = _packed.matmul(x, pw, threads=threads)
        assert got.shape == (R, N) and got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(K))
        np.testing.assert_allclose(_packed.matmul(x, pw, b, threads=threads), want + b, rtol=1e-4,
                                   atol=1e-4 * np.sqrt(K))
    # the thread count does not change a single bit (each output is summed by one thread, in one order)
    assert np.array_equal(_packed.matmul(x, pw, threads=1), _packed.matmul(x, pw, threads=3))


def test_unpack_is_exact_and_stand_in_maps_back():
    w = RNG.standard_normal((300, 400)).astype(np.float32)
    w[3, 5] = 0.0
    pw = _packed.pack(w)
    assert pw is _packed.pack(w)  # once per array
    assert np.array_equal(_packed._unpack(pw), w)
    s = _packed.standin(w)
    assert s.shape == w.shape and s.dtype == w.dtype and not any(s.strides) and not s.flags.writeable
    assert _packed.is_standin(s) and not _packed.is_standin(w)
    assert _packed.pack(s) is pw and np.array_equal(_packed.real(s), w) and _packed.real(w) is w
    t = _packed.pack(s, transposed=True)  # the other orientation, from the recovered weight
    assert np.array_equal(_packed._unpack(t), w.T)


def test_not_packed():
    assert _packed.pack(RNG.standard_normal((100, 100)).astype(np.float32)) is None  # small: numpy's product
    assert _packed.pack(RNG.standard_normal((300, 300))) is None  # float64
    bad = RNG.standard_normal((300, 300)).astype(np.float32)
    bad[1, 2] = np.inf
    assert _packed.pack(bad) is None  # (its identity product would turn the inf into NaN)
    with _packed.prepacking(False):
        assert _packed.pack(RNG.standard_normal((300, 300)).astype(np.float32)) is None
    assert _packed.standin(RNG.standard_normal((300, 300)).astype(np.float32)) is None  # never packed


def _model(kind, K=384, N=512, shared=False, fed=False):
    w = (RNG.standard_normal((K, N)) * 0.05).astype(np.float32)
    b = RNG.standard_normal(N).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")]
    if kind == "matmul":
        nodes = [helper.make_node("MatMul", ["x", "W"], ["y"])]
    elif kind == "matmul_add":  # -> MatMulBias at level 99
        nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    elif kind == "gemm_t":
        inits[0] = numpy_helper.from_array(np.ascontiguousarray(w.T), "W")
        nodes = [helper.make_node("Gemm", ["x2", "W", "b"], ["y2"], transB=1),
                 helper.make_node("Reshape", ["y2", "shp"], ["y"])]
        inits.append(numpy_helper.from_array(np.array([1, -1, N], np.int64), "shp"))
    else:  # ffn: MatMul+Add, Gelu, MatMul+Add -> FeedForward at level 99
        w2 = (RNG.standard_normal((N, K)) * 0.05).astype(np.float32)
        inits += [numpy_helper.from_array(w2, "W2"), numpy_helper.from_array(RNG.standard_normal(K).astype(np.float32),
                                                                              "b2")]
        nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["h"]),
                 helper.make_node("Gelu", ["h"], ["g"]), helper.make_node("MatMul", ["g", "W2"], ["m2"]),
                 helper.make_node("Add", ["m2", "b2"], ["y"])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "s", K])]
    if kind == "gemm_t":
        nodes.insert(0, helper.make_node("Reshape", ["x", "flat"], ["x2"]))
        inits.append(numpy_helper.from_array(np.array([-1, K], np.int64), "flat"))
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if shared:  # W also read by a second node: packed but not released
        nodes.append(helper.make_node("ReduceSum", ["W"], ["wsum"], keepdims=0))
        outs.append(helper.make_tensor_value_info("wsum", TensorProto.FLOAT, None))
    if fed:
        ins.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(numpy_helper.to_array(inits[0]).shape)))
    opset = 20 if kind == "ffn" else 17
    g = helper.make_graph(nodes, "g", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


@pytest.mark.parametrize("kind", ["matmul", "matmul_add", "gemm_t", "ffn"])
@pytest.mark.parametrize("rows", [1, 7, 128])
def test_session_paths_against_onnxruntime(kind, rows):
    data = _model(kind)
    x = RNG.standard_normal((1, rows, 384)).astype(np.float32)
    sess = onnxpy.InferenceSession(data)
    got = sess.run(None, {"x": x})[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    inits = sess._state.plan.graph.initializers
    assert _packed.is_standin(inits["W"])  # released: the packed copy took its place
    if kind == "ffn":
        assert _packed.is_standin(inits["W2"])
    # no prepacking: the original stays, same values
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    plain = onnxpy.InferenceSession(data, so)
    assert not _packed.is_standin(plain._state.plan.graph.initializers["W"])
    np.testing.assert_allclose(plain.run(None, {"x": x})[0], got, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["matmul", "matmul_add", "gemm_t"])
def test_unusual_inputs_take_the_generic_kernel_with_the_real_weight(kind):
    """A feed of the wrong width reaches the generic kernel with the weight recovered from its packed form: the same
    error as without packing (no product with the stand-in's zeros)."""
    data = _model(kind)
    sess = onnxpy.InferenceSession(data)
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    plain = onnxpy.InferenceSession(data, so)
    bad = RNG.standard_normal((1, 3, 200)).astype(np.float32)
    with pytest.raises(Exception) as e1:
        sess.run(None, {"x": bad})
    with pytest.raises(Exception) as e2:
        plain.run(None, {"x": bad})
    assert type(e1.value) is type(e2.value) and str(e1.value) == str(e2.value)


def test_fetching_part_of_the_outputs_reuses_the_packed_weight():
    data = _model("matmul_add", shared=True)
    x = RNG.standard_normal((1, 9, 384)).astype(np.float32)
    sess = onnxpy.InferenceSession(data)
    inits = sess._state.plan.graph.initializers
    assert not _packed.is_standin(inits["W"])  # read twice: kept
    full = sess.run(None, {"x": x})
    np.testing.assert_allclose(sess.run(["y"], {"x": x})[0], full[0], rtol=0, atol=0)
    np.testing.assert_allclose(sess.run(["wsum"], {"x": x})[0], full[1], rtol=0, atol=0)
    single = onnxpy.InferenceSession(_model("matmul"))
    y = single.run(None, {"x": x})[0]
    assert np.array_equal(single.run(["y"], {"x": x})[0], y)  # a fetch plan built over the stand-in


def test_fed_weight_is_not_packed():
    data = _model("matmul", fed=True)
    sess = onnxpy.InferenceSession(data)
    assert not _packed.is_standin(sess._state.plan.graph.initializers["W"])
    x = RNG.standard_normal((1, 4, 384)).astype(np.float32)
    w = RNG.standard_normal((384, 512)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x, "W": w})[0], x @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("N,rows", [(512, 64), (1536, 128)])
def test_concurrent_runs_give_identical_results(N, rows):
    """(1536 x 128 rows: FeedForward's intermediate split between the threads, which concurrent runs contend for.)"""
    sess = onnxpy.InferenceSession(_model("ffn", N=N))
    xs = [RNG.standard_normal((1, rows, 384)).astype(np.float32) for _ in range(4)]
    want = [sess.run(None, {"x": x})[0] for x in xs]
    out = [None] * 4

    def work(i):
        for _ in range(5):
            out[i] = sess.run(None, {"x": xs[i]})[0]

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(np.array_equal(o, w) for o, w in zip(out, want))


def test_packed_gemm_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("ONNXPY_PACKED_GEMM", "0")
    assert _packed._bind() is None


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_forked_child_runs_packed_products():
    """A child forked after the helper threads started gets its own (no job is left for a thread that is gone)."""
    import os

    sess = onnxpy.InferenceSession(_model("ffn"))
    x = RNG.standard_normal((1, 128, 384)).astype(np.float32)
    want = sess.run(None, {"x": x})[0]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        ok = b"0"
        try:
            ok = b"1" if np.array_equal(sess.run(None, {"x": x})[0], want) else b"0"
        finally:
            os.write(w, ok)
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    assert got == b"1"


def test_unpack_large_depth_in_blocks():
    w = RNG.standard_normal((3000, 70)).astype(np.float32)  # K=3000: the identity goes in blocks of rows
    pw = _packed.PackedWeight(w)
    assert np.array_equal(_packed._unpack(pw), w)


@pytest.mark.parametrize("via", ["Flatten", "Reshape", "FC"])
def test_classifier_head_on_pooled_features_is_not_packed(via):
    """A Gemm reading pooled features (through a Flatten/Reshape, or another fully connected layer) keeps its weight
    unpacked: its rows are the batch size, where OpenBLAS's matrix-vector product is faster."""
    w = (RNG.standard_normal((1000, 512)) * 0.05).astype(np.float32)
    b = RNG.standard_normal(1000).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([1, 512], np.int64), "shp")]
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"])]
    if via == "Flatten":
        nodes.append(helper.make_node("Flatten", ["p"], ["f"]))
    else:
        nodes.append(helper.make_node("Reshape", ["p", "shp"], ["f"]))
    if via == "FC":
        w1 = (RNG.standard_normal((512, 512)) * 0.05).astype(np.float32)
        inits.append(numpy_helper.from_array(w1, "W1"))
        nodes += [helper.make_node("Gemm", ["f", "W1"], ["f1"]), helper.make_node("Relu", ["f1"], ["f2"])]
        src = "f2"
    else:
        src = "f"
    nodes.append(helper.make_node("Gemm", [src, "W", "b"], ["y"], transB=1))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512, 7, 7])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    sess = onnxpy.InferenceSession(data)
    assert not any(_packed.is_standin(v) for v in sess._state.plan.graph.initializers.values())
    x = RNG.standard_normal((1, 512, 7, 7)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_feed_forward_kernel_keeps_no_weight():
    """The packed FeedForward kernel releases its original weights (the plan replaces them with stand-ins): nothing
    in it keeps them alive (a closure holding one kept BERT-base's 113 MB of second-layer weights resident)."""
    import gc
    import weakref

    from onnxpy.ops import contrib_fused

    w1 = RNG.standard_normal((256, 1024)).astype(np.float32)
    w2 = RNG.standard_normal((1024, 256)).astype(np.float32)
    c1 = RNG.standard_normal(1024).astype(np.float32)
    c2 = RNG.standard_normal(256).astype(np.float32)
    x = RNG.standard_normal((2, 64, 256)).astype(np.float32)
    want = contrib_fused.feed_forward(x, w1, c1, w2, c2)
    run = contrib_fused._feed_forward_specialize([None, w1, c1, w2, c2], {})
    assert run is not None and run.releases == (1, 3)
    refs = [weakref.ref(w1), weakref.ref(w2)]
    del w1, w2
    gc.collect()
    assert all(r() is None for r in refs)
    np.testing.assert_allclose(run(x, None, c1, None, c2), want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("R,K,N", [(3, 256, 300), (128, 768, 1024), (300, 500, 300)])
def test_packed_product_strided_rows_and_out(R, K, N):
    """x whose rows lie further apart than K is read in place, and ``out`` (rows further apart than N, e.g.
    ``out_pitch``'s) receives the product in its first N columns, its spare columns untouched; the same bits as the
    plain call."""
    w = RNG.standard_normal((K, N)).astype(np.float32)
    b = RNG.standard_normal(N).astype(np.float32)
    pw = _packed.PackedWeight(w)
    xs = RNG.standard_normal((R, K + 7)).astype(np.float32)
    x = xs[:, :K]
    want = _packed.matmul(np.ascontiguousarray(x), pw, b)
    ld = _packed.out_pitch(N)
    assert ld == (N + 16 if N % 1024 == 0 else N)
    out = np.full((R, ld + 5), 7.0, np.float32)
    got = _packed.matmul(x, pw, b, out=out)
    assert got.base is out or got.base is out.base
    assert np.array_equal(got, want) and np.array_equal(out[:, :N], want) and (out[:, N:] == 7.0).all()
    with pytest.raises(ValueError, match="out must be"):
        _packed.matmul(x, pw, b, out=np.empty((R, N - 1), np.float32))
    with pytest.raises(ValueError, match="out must be"):
        _packed.matmul(x, pw, b, out=np.empty((R, N), np.float64))
    with pytest.raises(ValueError, match="out must be"):
        _packed.matmul(x, pw, b, out=xs)  # overlaps x
    empty = np.full((0, N + 3), 7.0, np.float32)
    assert _packed.matmul(np.empty((0, K), np.float32), pw, b, out=empty).shape == (0, N)


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_stacked_matmul(ta, tb):
    """Stacks of products with both operands packed per call: equal to numpy's (same kernel, same order), operands as
    strided views (attention's heads inside the projections), the output a strided view too."""
    H, M, N, K = 6, 130, 70, 120
    L = max(M, K)
    big = RNG.standard_normal((3, L + 5, H, L + 3)).astype(np.float32)  # a view with row and head strides
    a = big[1, :K, :, :M].transpose(1, 0, 2) if ta else big[1, :M, :, :K].transpose(1, 0, 2)
    b = RNG.standard_normal((H, N, K) if tb else (H, K, N)).astype(np.float32)
    store = np.full((M, H, N), np.nan, np.float32)
    out = store.transpose(1, 0, 2)
    assert _packed.stacked_matmul(a, b, out, ta, tb)
    want = np.matmul(a.swapaxes(1, 2) if ta else a, b.swapaxes(1, 2) if tb else b)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


def test_stacked_matmul_declines():
    a = RNG.standard_normal((4, 64, 64)).astype(np.float32)
    b = RNG.standard_normal((4, 64, 64)).astype(np.float32)
    out = np.empty((4, 64, 64), np.float32)
    assert not _packed.stacked_matmul(a, b, out)  # 64^3 multiply-adds per product: numpy's small-matrix path
    a = RNG.standard_normal((4, 128, 128)).astype(np.float32)
    b = RNG.standard_normal((4, 128, 128)).astype(np.float32)
    assert not _packed.stacked_matmul(a, b, a)  # the output overlaps an operand
    assert not _packed.stacked_matmul(a.astype(np.float64), b, np.empty((4, 128, 128)))
    assert not _packed.stacked_matmul(a, b[:3], np.empty((4, 128, 128), np.float32))  # shapes disagree
    assert not _packed.stacked_matmul(a[:, :, ::2], b[:, ::2], np.empty((4, 128, 128), np.float32))  # strided rows
    out = np.full((4, 128, 128), 7.0, np.float32)
    assert _packed.stacked_matmul(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)


def test_attention_heads_through_stacked_products(monkeypatch):
    """MultiHeadAttention's per-head products through ``stacked_matmul`` (heads of 64 at sequence 128: OpenBLAS
    would thread every product) give numpy's results."""
    from onnxpy.ops import contrib_transformer as ct

    calls = []
    orig = _packed.stacked_matmul
    monkeypatch.setattr(ct, "_HEADS_SPLIT", False)  # (the products, not the whole attention, split)
    monkeypatch.setattr(_packed, "stacked_matmul", lambda *a: calls.append(1) or orig(*a))
    B, S, N, Hd = 2, 128, 4, 64
    q, k, v = [RNG.standard_normal((B, N, S, Hd)).astype(np.float32) for _ in range(3)]
    got = ct._mha_core_t(q, k, v, 0.125, None, None)
    assert len(calls) == 2 * B
    monkeypatch.setattr(ct, "_stacks_mm", lambda *a: False)
    want = ct._mha_core_t(q, k, v, 0.125, None, None)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _heads(H, r, c):
    """A stack of H (r, c) matrices as attention keeps them: views of one projection, rows ``H * (c + 3)`` apart."""
    return RNG.standard_normal((r, H, c + 3)).astype(np.float32)[:, :, :c].transpose(1, 0, 2)


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_split_matmul(ta, tb):
    """Stacks split between the calling thread and the helper (one numpy product each, OpenBLAS held to one thread):
    numpy's results for strided views and a strided output, and OpenBLAS's thread count back where it was."""
    from onnxpy.execution import threads

    H, M, N, K = 12, 128, 130, 64
    a = _heads(H, K, M) if ta else _heads(H, M, K)
    b = _heads(H, N, K) if tb else _heads(H, K, N)
    store = np.full((M, H, N), np.nan, np.float32)
    out = store.transpose(1, 0, 2)
    before = threads.get_blas_threads()
    assert _packed.split_matmul(a, b, out, ta, tb) == (min(before, H) >= 2)
    assert threads.get_blas_threads() == before
    if min(before, H) >= 2:
        want = np.matmul(a.swapaxes(1, 2) if ta else a, b.swapaxes(1, 2) if tb else b)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


def test_split_matmul_declines():
    from onnxpy.execution import threads

    a = RNG.standard_normal((12, 128, 64)).astype(np.float32)
    b = RNG.standard_normal((12, 64, 128)).astype(np.float32)
    out = np.full((12, 128, 128), 7.0, np.float32)
    before = threads.get_blas_threads()
    assert not _packed.split_matmul(a[:4], b[:4], out[:4])  # 4 x 1M multiply-adds: below the hand-off's worth
    assert not _packed.split_matmul(a[:1], b[:1], out[:1])  # one matrix
    assert not _packed.split_matmul(a, b[:11], out)  # shapes disagree
    assert not _packed.split_matmul(a, b.swapaxes(1, 2), out)  # inner sizes disagree
    assert not _packed.split_matmul(a.astype(np.float64), b, out.astype(np.float64))
    sq = RNG.standard_normal((12, 128, 128)).astype(np.float32)
    assert not _packed.split_matmul(sq, sq.copy(), sq)  # the output overlaps an operand
    ro = out.copy()
    ro.flags.writeable = False
    assert not _packed.split_matmul(a, b, ro)
    with _packed._pool_acquire:  # another product holds the helpers
        assert not _packed.split_matmul(a, b, out)
    assert (out == 7.0).all() and threads.get_blas_threads() == before
    if before >= 2:
        try:
            threads.set_blas_threads(1)  # intra_op_num_threads=1
            assert not _packed.split_matmul(a, b, out)
        finally:
            threads.set_blas_threads(before)


def test_splits_need_bound_kernels(monkeypatch):
    """Without OpenBLAS's kernels bound (``ONNXPY_PACKED_GEMM=0``, another BLAS) its idle workers are not known to
    sleep, so nothing splits over the helper: attention products, wide Winograd and large max pools run as before."""
    from onnxpy.ops import conv as conv_mod
    from onnxpy.ops import pool as pool_mod

    monkeypatch.setattr(_packed, "available", lambda: False)
    a = RNG.standard_normal((12, 128, 64)).astype(np.float32)
    b = RNG.standard_normal((12, 64, 128)).astype(np.float32)
    assert not _packed.split_matmul(a, b, np.empty((12, 128, 128), np.float32))
    x = np.zeros((1, 128, 56, 56), np.float32)
    w = np.zeros((128, 128, 3, 3), np.float32)
    assert not conv_mod._winograd_wide_ok(x, w, (1, 1), (1, 1), (56, 56))
    shared = []
    monkeypatch.setattr(_packed, "_run_shared", lambda *args: shared.append(1))
    monkeypatch.setattr(pool_mod, "_POOL_SPLIT_BYTES", 0)
    y = pool_mod.max_pool(RNG.standard_normal((1, 4, 8, 8)).astype(np.float32), kernel_shape=[2, 2], strides=[2, 2])
    assert y.shape == (1, 4, 4, 4) and not shared


def test_split_matmul_error_restores_threads(monkeypatch):
    from onnxpy.execution import threads

    before = threads.get_blas_threads()
    if before < 2:
        pytest.skip("needs two BLAS threads")

    def boom(*args):
        raise RuntimeError("part failed")

    monkeypatch.setattr(_packed, "_split_part", boom)
    a = RNG.standard_normal((12, 128, 64)).astype(np.float32)
    b = RNG.standard_normal((12, 64, 128)).astype(np.float32)
    with pytest.raises(RuntimeError, match="part failed"):
        _packed.split_matmul(a, b, np.empty((12, 128, 128), np.float32))
    assert threads.get_blas_threads() == before


def test_split_matmul_concurrent_callers():
    """Threads splitting stacks at the same time: every result right (a caller that finds the helpers busy is told
    so and uses numpy), and OpenBLAS's thread count back where it was (each split lowers and restores it under the
    helpers' lock, so no caller can restore another's lowered count)."""
    from onnxpy.execution import threads

    before = threads.get_blas_threads()
    a = RNG.standard_normal((12, 128, 64)).astype(np.float32)
    b = RNG.standard_normal((12, 64, 128)).astype(np.float32)
    want = np.matmul(a, b)
    errors = []

    def work():
        try:
            for _ in range(20):
                out = np.empty((12, 128, 128), np.float32)
                if not _packed.split_matmul(a, b, out):
                    np.matmul(a, b, out=out)
                np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]
    assert threads.get_blas_threads() == before


def test_attention_heads_through_split_products(monkeypatch):
    """MultiHeadAttention's per-head products of a BERT-base layer (12 heads of 64, sequence 128) through
    ``split_matmul`` give numpy's results; with the helpers busy every batch still gets its products."""
    from onnxpy.ops import contrib_transformer as ct

    if min(_packed._blas_threads(), 12) < 2:
        pytest.skip("needs two BLAS threads")
    calls = []
    orig = _packed.split_matmul
    monkeypatch.setattr(ct, "_HEADS_SPLIT", False)  # (the products, not the whole attention, split)
    monkeypatch.setattr(_packed, "split_matmul", lambda *a: calls.append(orig(*a)) or calls[-1])
    B, S, N, Hd = 2, 128, 12, 64
    q, k, v = [RNG.standard_normal((B, N, S, Hd)).astype(np.float32) for _ in range(3)]
    got = ct._mha_core_t(q, k, v, 0.125, None, None)
    assert calls == [True] * (2 * B)
    monkeypatch.setattr(ct, "_stacks_mm", lambda *a: False)
    want = ct._mha_core_t(q, k, v, 0.125, None, None)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    monkeypatch.undo()
    monkeypatch.setattr(ct, "_HEADS_SPLIT", False)
    flips = iter([True, False, False, False])  # the second batch's products find the helpers busy: numpy
    monkeypatch.setattr(_packed, "split_matmul", lambda *a: next(flips) and orig(*a))
    monkeypatch.setattr(_packed, "stacked_matmul", lambda *a: False)
    np.testing.assert_allclose(ct._mha_core_t(q, k, v, 0.125, None, None), want, rtol=1e-5, atol=1e-6)


def test_shared_work_raises_and_stays_in_step():
    """An error on either thread comes back to the caller once every part is done, and the helpers stay in step."""
    seen = []

    def part(i, fail):
        seen.append(i)
        if fail:
            raise RuntimeError(f"part {i}")

    for failing in (0, 1):
        seen.clear()
        with pytest.raises(RuntimeError, match=f"part {failing}"):
            _packed._run_shared(part, [(i, i == failing) for i in range(2)])
        assert sorted(seen) == [0, 1]
    seen.clear()
    assert _packed._run_shared(part, [(i, False) for i in range(2)]) and sorted(seen) == [0, 1]
    sess = onnxpy.InferenceSession(_model("matmul"))
    x = RNG.standard_normal((1, 64, 384)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ _packed.real(sess._state.plan.graph.initializers["W"]),
                               rtol=1e-4, atol=1e-4)


def test_openblas_threads_are_not_restarted_while_another_thread_runs():
    """The one-time restart of OpenBLAS's threads waits for a moment with no other Python thread (a BLAS call could
    be in flight on it): with one alive it reports "not now"."""
    from onnxpy.ops import _blas

    lib = _blas.library()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        if "OPENBLAS_THREAD_TIMEOUT" not in __import__("os").environ:
            assert _packed._quiet_threads(lib) is None
    finally:
        stop.set()
        t.join()


def test_weight_read_by_two_products_is_packed_once():
    w = (RNG.standard_normal((384, 512)) * 0.05).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("MatMul", ["x2", "W"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 384]) for n in
                                       ("x", "x2")],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "z")],
                          [numpy_helper.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = onnxpy.InferenceSession(model.SerializeToString())
    kept = sess._state.plan.graph.initializers["W"]
    assert not _packed.is_standin(kept)  # read twice: the original stays
    assert _packed.pack(kept) is not None and len(_packed._entry(kept)) == 1  # one packed form, shared
    x, x2 = RNG.standard_normal((2, 4, 384)).astype(np.float32)
    y, z = sess.run(None, {"x": x, "x2": x2})
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(z, x2 @ w, rtol=1e-4, atol=1e-4)


def test_deleting_the_session_frees_its_packed_weights():
    import gc
    import weakref

    sess = onnxpy.InferenceSession(_model("ffn"))
    sess.run(None, {"x": RNG.standard_normal((1, 32, 384)).astype(np.float32)})
    standin = sess._state.plan.graph.initializers["W"]
    refs = [weakref.ref(v) for v in _packed._entry(standin).values() if isinstance(v, _packed.PackedWeight)]
    assert refs
    del sess, standin
    gc.collect()
    assert all(r() is None for r in refs)


def test_failing_self_test_disables_packing(monkeypatch):
    """A bind whose self-check raises leaves packing off (sessions then build as without it) instead of failing."""
    saved = _packed._state[0]
    monkeypatch.setattr(_packed, "_bind", lambda: saved)  # (bound as before: only the self-check fails)
    monkeypatch.setattr(_packed, "_self_test", lambda: 1 / 0)
    try:
        _packed._state[0] = None
        assert not _packed.available()
        sess = onnxpy.InferenceSession(_model("matmul"))
        assert not _packed.is_standin(sess._state.plan.graph.initializers["W"])
    finally:
        _packed._state[0] = saved


def _attention_inputs(B, N, S, T, Hd, mask):
    """q, k, v as attention takes them from one projection (strided views), and an additive term of shape ``mask``
    (None: none; "causal": [1, 1, S, T] of 0 / finfo.min; else a shape, random values)."""
    qkv = RNG.standard_normal((B, S, 3 * N * Hd)).astype(np.float32)
    q = qkv[..., :N * Hd].reshape(B, S, N, Hd).transpose(0, 2, 1, 3)
    kv = RNG.standard_normal((B, T, 2 * N * Hd)).astype(np.float32)
    k = kv[..., :N * Hd].reshape(B, T, N, Hd).transpose(0, 2, 1, 3)
    v = kv[..., N * Hd:].reshape(B, T, N, Hd).transpose(0, 2, 1, 3)
    if mask is None:
        add = None
    elif mask == "causal":
        add = np.triu(np.full((S, T), np.finfo(np.float32).min, np.float32), 1 + T - S).reshape(1, 1, S, T)
    else:
        add = RNG.standard_normal(mask).astype(np.float32)
    return q, k, v, add


@pytest.mark.parametrize("B,N,S,T,Hd,mask,causal", [
    (1, 12, 128, 128, 64, "causal", None),   # GPT-2's layers
    (1, 12, 128, 128, 32, None, None),       # MiniLM's
    (2, 5, 100, 140, 64, (2, 5, 100, 140), None),  # per-head terms, odd head count, batches
    (1, 4, 128, 160, 64, (1, 1, 1, 160), 32),      # key-only term and a causal mask with a past
    (1, 12, 128, 128, 64, (1, 12, 128, 128), None),
    (2, 6, 128, 128, 64, (6, 128, 128), None),     # a 3-D term: its first axis is the heads'
    (1, 6, 128, 128, 64, (128, 128), None),
])
def test_attention_heads_split_between_threads(monkeypatch, B, N, S, T, Hd, mask, causal):
    """Large attention runs its heads split between two threads (every step on each thread's heads, numpy's
    products): bit-identical to the one-thread result, which the products through the helpers also give."""
    from onnxpy.ops import contrib_transformer as ct

    if _packed._blas_threads() < 2:
        pytest.skip("needs two BLAS threads")
    q, k, v, add = _attention_inputs(B, N, S, T, Hd, mask)
    splits = []
    orig = _packed.run_ranges
    monkeypatch.setattr(_packed, "run_ranges", lambda fn, *a, **kw: splits.append(fn) or orig(fn, *a, **kw))
    got = ct._mha_core_t(q, k, v, 0.125, add, causal)
    assert splits and splits[0] is ct._mha_heads
    monkeypatch.setattr(ct, "_HEADS_SPLIT", False)
    want = ct._mha_core_t(q, k, v, 0.125, add, causal)
    np.testing.assert_array_equal(got, want)
    monkeypatch.setattr(ct, "_stacks_mm", lambda *a: False)
    np.testing.assert_allclose(ct._mha_core_t(q, k, v, 0.125, add, causal), want, rtol=1e-5, atol=1e-6)


def test_attention_heads_split_shifted_softmax_and_busy_helpers(monkeypatch):
    """Scores too large for the unshifted softmax take the row-maxima route on each thread, rows with every key
    masked give what one thread gives, and with the helpers busy the attention runs on the calling thread."""
    from onnxpy.ops import contrib_transformer as ct

    if _packed._blas_threads() < 2:
        pytest.skip("needs two BLAS threads")
    q, k, v, add = _attention_inputs(1, 12, 128, 128, 64, (1, 12, 128, 128))
    q[0, 7] *= 40  # (heads 6-11 run on the helper: its scores exceed the unshifted bound)
    add[0, 2, 5] = -np.inf  # a row of head 2 with no finite score
    got = ct._mha_core_t(q, k, v, 0.125, add, None)
    monkeypatch.setattr(ct, "_HEADS_SPLIT", False)
    want = ct._mha_core_t(q, k, v, 0.125, add, None)
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(want).all() and not want[0, 2, 5].any()  # (onnxruntime's zeros for a fully masked row)
    monkeypatch.setattr(ct, "_HEADS_SPLIT", True)
    with _packed._pool_acquire:  # (another product holds the helpers)
        busy = ct._mha_core_t(q, k, v, 0.125, add, None)
    np.testing.assert_array_equal(busy, want)


def test_attention_heads_split_declines():
    """float64, one head and small attention keep the one-thread route (no split attempted)."""
    from onnxpy.ops import contrib_transformer as ct

    calls = []
    orig = _packed.run_ranges
    try:
        _packed.run_ranges = lambda fn, *a, **kw: calls.append(fn) or orig(fn, *a, **kw)
        for B, N, S, Hd, dt in [(1, 12, 128, 64, np.float64), (1, 1, 512, 64, np.float32),
                                (1, 12, 32, 64, np.float32)]:
            q, k, v = [RNG.standard_normal((B, N, S, Hd)).astype(dt) for _ in range(3)]
            got = ct._mha_core_t(q, k, v, 0.125, None, None)
            s = np.einsum("bnsh,bnth->bnst", q, k) * 0.125
            p = np.exp(s - s.max(-1, keepdims=True))
            want = np.einsum("bnst,bnth->bnsh", p / p.sum(-1, keepdims=True), v)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    finally:
        _packed.run_ranges = orig
    assert ct._mha_heads not in calls


@pytest.mark.parametrize("approx", [False, True])
@pytest.mark.parametrize("shape", [(128, 1024), (3, 128, 3079)])
def test_gelu_split_between_threads(monkeypatch, approx, shape):
    """Large GELUs (exact and tanh) run half on the helper thread: bit-identical to the one-thread passes, in place
    and into a fresh buffer, and on the calling thread alone while another product holds the helpers."""
    from onnxpy.ops import _ew_math, contrib_fused

    if _packed._blas_threads() < 2:
        pytest.skip("needs two BLAS threads")
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[:4] = [np.inf, -np.inf, np.nan, -30.0]
    assert x.size >= _ew_math.SPLIT_MIN
    parts = []
    orig = _packed.run_ranges
    monkeypatch.setattr(_packed, "run_ranges", lambda fn, *a, **kw: parts.append(fn) or orig(fn, *a, **kw))
    with np.errstate(all="ignore"):
        got = contrib_fused._gelu(x, None, "FastGelu" if approx else "Gelu", approx)
        got_inplace = contrib_fused._gelu(x.copy(), None, "FastGelu" if approx else "Gelu", approx, (0,))
        assert len(parts) == 2
        monkeypatch.setattr(_ew_math, "_SPLIT", False)
        want = contrib_fused._gelu(x, None, "FastGelu" if approx else "Gelu", approx)
        monkeypatch.setattr(_ew_math, "_SPLIT", True)
        with _packed._pool_acquire:
            busy = contrib_fused._gelu(x, None, "FastGelu" if approx else "Gelu", approx)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_inplace, want)
    np.testing.assert_array_equal(busy, want)
    assert len(parts) == 3


def test_gelu_below_split_size_stays_on_one_thread(monkeypatch):
    from onnxpy.ops import _ew_math

    calls = []
    monkeypatch.setattr(_packed, "run_ranges", lambda *a, **kw: calls.append(1) or False)
    x = RNG.standard_normal(_ew_math.SPLIT_MIN - 1).astype(np.float32)
    _ew_math.gelu_erf32(x, np.empty_like(x))
    assert not calls


def test_helper_parts_follow_the_callers_floating_point_settings():
    """A part run on a helper thread uses the calling thread's numpy error settings: a session's "ignore" stays
    quiet there, and "raise" raises there too."""
    if _packed._blas_threads() < 2:
        pytest.skip("needs two BLAS threads")
    big = np.full(4, 3e38, np.float32)

    def part(lo, hi, out):
        out[lo:hi] = big[lo:hi] * np.float32(10)

    out = np.zeros(4, np.float32)
    with np.errstate(all="ignore"):
        assert _packed.run_ranges(part, 4, 2, out, single_blas=False)
    assert np.isinf(out).all()
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        _packed.run_ranges(part, 4, 2, out, single_blas=False)


def _two_threads():
    if _packed._blas_threads() < 2:
        pytest.skip("needs two BLAS threads")


@pytest.mark.parametrize("R,K,N", [(128, 768, 3072), (16, 384, 1536), (200, 1000, 2000)])
@pytest.mark.parametrize("bias", ["none", "vector", "scalar"])
def test_matmul_split_blocks(R, K, N, bias):
    """The product as the threads' column blocks: bit-identical to the whole product, the epilogue run once on each
    block (by the thread that computed it), and the blocks taken back as a later product's activations."""
    _two_threads()
    w = RNG.standard_normal((K, N)).astype(np.float32)
    x = RNG.standard_normal((R, K)).astype(np.float32)
    b = {"none": None, "vector": RNG.standard_normal(N).astype(np.float32), "scalar": np.float32(0.5)}[bias]
    pw = _packed.PackedWeight(w)
    seen = []
    got = _packed.matmul_split(x, pw, b, lambda blk: seen.append((threading.get_ident(), blk.shape)) or blk.__imul__(2))
    assert got is not None and len(got) == 2 and got[0][0] == 0
    # (the epilogue runs over each block's whole array: rows 2 KiB-multiples wide get 16 spare, zeroed columns)
    assert len({t for t, _ in seen}) == 2
    assert sorted(s for _, s in seen) == sorted((a.shape[0], _packed.out_pitch(a.shape[1])) for _, a in got)
    whole = np.concatenate([a for _, a in got], axis=1)
    assert all(a.strides == (4 * _packed.out_pitch(a.shape[1]), 4) for _, a in got) and whole.shape == (R, N)
    np.testing.assert_array_equal(whole, 2 * _packed.matmul(x, pw, b))
    # the blocks as the activations of the next product (depth blocks inside one block each, or concatenated)
    w2 = RNG.standard_normal((N, 300)).astype(np.float32)
    pw2 = _packed.PackedWeight(w2)
    np.testing.assert_array_equal(_packed.matmul(got, pw2), _packed.matmul(whole, pw2))
    np.testing.assert_array_equal(_packed.matmul([(0, whole[:, :100]), (100, whole[:, 100:])], pw2),
                                  _packed.matmul(whole, pw2))  # (a piece boundary inside a depth block)


def test_matmul_split_declines():
    _two_threads()
    assert _packed.split_cut(128, _packed.PackedWeight(RNG.standard_normal((768, 3072)).astype(np.float32))) == 1536
    w = RNG.standard_normal((768, 3072)).astype(np.float32)
    pw = _packed.PackedWeight(w)
    for R in (8, 300):  # few rows (one long run per depth block) or more than one row pass
        assert _packed.matmul_split(RNG.standard_normal((R, 768)).astype(np.float32), pw) is None
    x = RNG.standard_normal((128, 768)).astype(np.float32)
    assert _packed.matmul_split(x, pw, align=1000) is None  # the cut (1536) is not a multiple of 1000
    assert _packed.matmul_split(x[:, :700].copy(), pw) is None  # x does not fit the weight
    with _packed._pool_acquire:  # another product holds the helpers
        assert _packed.matmul_split(x, pw) is None


@pytest.mark.parametrize("R,K,N", [(128, 3072, 768), (64, 1536, 384), (20, 768, 500)])
def test_matmul_ksplit(R, K, N):
    """The product over two column pieces split by depth: each thread multiplies its own piece into all outputs and
    the partial sums are added -- the same product up to rounding; declined where it does not apply."""
    _two_threads()
    w = RNG.standard_normal((K, N)).astype(np.float32)
    x = RNG.standard_normal((R, K)).astype(np.float32)
    b = RNG.standard_normal(N).astype(np.float32)
    pw = _packed.PackedWeight(w)
    cut = (K // pw.Q // 2) * pw.Q
    pieces = [(0, np.ascontiguousarray(x[:, :cut])), (cut, np.ascontiguousarray(x[:, cut:]))]
    got = _packed.matmul_ksplit(pieces, pw, b)
    want = x.astype(np.float64) @ w.astype(np.float64) + b
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(K))
    np.testing.assert_allclose(got, _packed.matmul(x, pw, b), rtol=1e-5, atol=1e-5 * np.sqrt(K))
    assert _packed.matmul_ksplit([(0, x)], pw, b) is None  # one piece
    off = cut - 1
    assert _packed.matmul_ksplit([(0, x[:, :off].copy()), (off, x[:, off:].copy())], pw, b) is None  # mid-block
    with _packed._pool_acquire:  # another product holds the helpers: the same sums, on the calling thread
        np.testing.assert_array_equal(_packed.matmul_ksplit(pieces, pw, b), got)
    # pieces that are column ranges of one array (rows further apart than their width)
    np.testing.assert_array_equal(_packed.matmul_ksplit([(0, x[:, :cut]), (cut, x[:, cut:])], pw, b), got)


@pytest.mark.parametrize("R,K,F,N", [(128, 768, 3072, 768), (64, 384, 1536, 384), (20, 300, 1536, 500)])
@pytest.mark.parametrize("stagger", [True, False])
def test_matmul_chain(R, K, F, N, stagger, monkeypatch):
    """Both products of a feed-forward block in one parallel region: each thread's column block of the first product,
    its epilogue and its depth share of the second -- the same bits as matmul_split then matmul_ksplit (the partial
    sums added in the same order), the epilogue once per block on the thread that wrote it; declined where the split
    does not apply or the helpers are busy."""
    _two_threads()
    w1 = (RNG.standard_normal((K, F)) * 0.05).astype(np.float32)
    w2 = (RNG.standard_normal((F, N)) * 0.05).astype(np.float32)
    c1 = RNG.standard_normal(F).astype(np.float32)
    c2 = RNG.standard_normal(N).astype(np.float32)
    x = RNG.standard_normal((R, K)).astype(np.float32)
    p1, p2 = _packed.PackedWeight(w1), _packed.PackedWeight(w2)
    seen = []

    def epi(blk):
        seen.append((threading.get_ident(), blk.shape))
        np.tanh(blk, out=blk)

    # (staggered, the second thread runs the epilogue per depth block of the second product, interleaved with it)
    monkeypatch.setattr(_packed, "STAGGER", stagger)
    got = _packed.matmul_chain(x, p1, c1, epi, p2, c2)
    assert got is not None and got.shape == (R, N)
    assert len({t for t, _ in seen}) == 2 and F <= sum(s[1] for _, s in seen) <= F + 32  # (spare columns)
    assert len(seen) == (2 + (F // 2) // p2.Q - 1 if stagger else 2)
    seen.clear()
    pieces = _packed.matmul_split(x, p1, c1, lambda b: np.tanh(b, out=b), p2.Q)
    np.testing.assert_array_equal(got, _packed.matmul_ksplit(pieces, p2, c2))
    monkeypatch.setattr(_packed, "PAD_BLOCKS", False)  # (blocks without spare columns: the same bits)
    np.testing.assert_array_equal(got, _packed.matmul_chain(x, p1, c1, epi, p2, c2))
    monkeypatch.setattr(_packed, "PAD_BLOCKS", True)
    want = np.tanh(x.astype(np.float64) @ w1 + c1) @ w2 + c2
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with _packed._pool_acquire:  # another product holds the helpers
        assert _packed.matmul_chain(x, p1, c1, epi, p2, c2) is None
    assert _packed.matmul_chain(x[:8].copy(), p1, c1, epi, p2, c2) is None  # few rows: no split
    assert _packed.matmul_chain(x, p1, c1, epi, _packed.PackedWeight(w2[:-1].copy()), c2) is None  # F mismatch


@pytest.mark.parametrize("ksplit", [False, True])
def test_feed_forward_split_intermediate(monkeypatch, ksplit):
    """FeedForward with its intermediate as the threads' GELU'd column blocks: what the one-buffer route gives
    (bit-identical with the second product split by features, up to rounding split by depth); with the helpers busy
    the same bits as with them free (a run's result does not depend on another run holding the helpers)."""
    _two_threads()
    from onnxpy.ops import contrib_fused

    w1 = (RNG.standard_normal((384, 1536)) * 0.05).astype(np.float32)
    w2 = (RNG.standard_normal((1536, 384)) * 0.05).astype(np.float32)
    c1 = RNG.standard_normal(1536).astype(np.float32)
    c2 = RNG.standard_normal(384).astype(np.float32)
    x = RNG.standard_normal((1, 128, 384)).astype(np.float32)
    run = contrib_fused._feed_forward_specialize([None, w1, c1, w2, c2], {})
    one = run(x, None, c1, None, c2)  # (both products in one parallel region: the split route's bits)
    monkeypatch.setattr(contrib_fused, "FF_ONE", False)
    calls = []
    orig = _packed.matmul_split
    monkeypatch.setattr(_packed, "matmul_split", lambda *a, **k: calls.append(1) or orig(*a, **k))
    monkeypatch.setattr(contrib_fused, "FF_KSPLIT", ksplit)
    got = run(x, None, c1, None, c2)
    assert calls
    if ksplit:
        np.testing.assert_array_equal(one, got)
    monkeypatch.setattr(contrib_fused, "FF_SPLIT", False)
    want = run(x, None, c1, None, c2)
    if ksplit:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)
    monkeypatch.setattr(contrib_fused, "FF_SPLIT", True)
    with _packed._pool_acquire:
        np.testing.assert_array_equal(run(x, None, c1, None, c2), got)
    np.testing.assert_allclose(want, contrib_fused.feed_forward(x, w1, c1, w2, c2), rtol=1e-4, atol=1e-4)
