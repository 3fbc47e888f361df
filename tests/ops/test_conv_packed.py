"""Stride-1 convolutions on OpenBLAS's kernel with the filter packed once (ops/_conv_packed.py): results against
float64 for pads, dilations, depth chunks, batches, thread counts and the accumulate / write-into forms; which filters
are registered (read-only float32, prepacking allowed) and which shapes take the path (conv._conv2d_fast); sessions
(Conv, FusedConv, ConvAdd's residual, ConvConcat) against onnxruntime, with and without session.disable_prepacking."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.ops import _conv_packed as cp
from onnxpy.ops import _packed, conv

pytestmark = pytest.mark.skipif(not _packed.available(), reason="packed kernels need numpy's OpenBLAS on Linux x86-64")
RNG = np.random.default_rng(5)


def _ref(x, w, b, pb, pe, dil, st=(1, 1)):
    """float64 convolution by taps."""
    N, C, H, W = x.shape
    M, _, KH, KW = w.shape
    xp = np.zeros((N, C, H + pb[0] + pe[0], W + pb[1] + pe[1]))
    xp[:, :, pb[0]:pb[0] + H, pb[1]:pb[1] + W] = x
    Ho = (xp.shape[2] - (KH - 1) * dil[0] - 1) // st[0] + 1
    Wo = (xp.shape[3] - (KW - 1) * dil[1] - 1) // st[1] + 1
    out = np.zeros((N, M, Ho, Wo))
    for i in range(KH):
        for j in range(KW):
            win = xp[:, :, i * dil[0]:i * dil[0] + (Ho - 1) * st[0] + 1:st[0],
                     j * dil[1]:j * dil[1] + (Wo - 1) * st[1] + 1:st[1]]
            out += np.einsum("mc,nchw->nmhw", w[:, :, i, j].astype(np.float64), win)
    if b is not None:
        out += b.reshape(1, M, 1, 1)
    return out


def _frozen(a):
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("N,C,H,W,M,KH,KW,pads,dil,st", [
    (1, 64, 13, 17, 80, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),
    (2, 70, 9, 11, 65, 3, 3, (0, 2, 1, 0), (1, 1), (1, 1)),  # batch, asymmetric pads
    (1, 96, 12, 12, 64, 3, 3, (2, 2, 2, 2), (2, 2), (1, 1)),  # dilation
    (1, 400, 6, 7, 72, 3, 3, (1, 1, 1, 1), (1, 1), (1, 1)),  # two depth chunks (> 384 channels)
    (1, 64, 5, 40, 66, 1, 3, (0, 1, 0, 1), (1, 1), (1, 1)),  # 1x3
    (1, 64, 8, 8, 64, 2, 2, (0, 0, 1, 1), (1, 1), (1, 1)),  # 2x2, padding at the end only
    (1, 65, 3, 3, 64, 3, 3, (0, 0, 0, 0), (1, 1), (1, 1)),  # one output position
    (1, 128, 15, 14, 130, 3, 3, (1, 1, 1, 1), (1, 1), (2, 2)),  # stride 2 (stride phases), odd height
    (2, 130, 9, 12, 128, 3, 3, (0, 1, 1, 0), (1, 1), (2, 1)),  # stride (2, 1), asymmetric pads
    (1, 128, 13, 13, 128, 3, 3, (2, 2, 2, 2), (2, 2), (2, 2)),  # stride 2 with dilation 2
])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_convolution(N, C, H, W, M, KH, KW, pads, dil, st, threads, bias, monkeypatch):
    monkeypatch.setattr(cp, "_T", threads)
    x = RNG.standard_normal((N, C, H, W)).astype(np.float32)
    w = (RNG.standard_normal((M, C, KH, KW)) * 0.1).astype(np.float32)
    b = RNG.standard_normal(M).astype(np.float32) if bias else None
    pb, pe = pads[:2], pads[2:]
    want = _ref(x, w, b, pb, pe, dil, st)
    pf = cp.PackedFilter(w)
    got = cp.conv2d(x, pf, b, pb, pe, st, dil, want.shape[2:])
    assert got.shape == want.shape and got.dtype == np.float32 and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(C * KH * KW))
    # accumulate into a residual, and write into a channel range of a larger (concatenation) output
    z = RNG.standard_normal(want.shape).astype(np.float32)
    acc = z.copy()
    assert cp.conv2d(x, pf, b, pb, pe, st, dil, want.shape[2:], out=acc, acc=True) is acc
    np.testing.assert_allclose(acc, want + z, rtol=1e-4, atol=1e-4 * np.sqrt(C * KH * KW))
    big = np.full((N, M + 5) + want.shape[2:], 7.0, np.float32)
    cp.conv2d(x, pf, b, pb, pe, st, dil, want.shape[2:], out=big[:, 2:2 + M])
    np.testing.assert_allclose(big[:, 2:2 + M], want, rtol=1e-4, atol=1e-4 * np.sqrt(C * KH * KW))
    assert (big[:, :2] == 7).all() and (big[:, 2 + M:] == 7).all()
    # each output is summed by one thread in one order: the thread count changes no bit
    monkeypatch.setattr(cp, "_T", 1)
    assert np.array_equal(cp.conv2d(x, pf, b, pb, pe, st, dil, want.shape[2:]), got)


def test_registration_rules():
    w = _frozen(RNG.standard_normal((64, 64, 3, 3)).astype(np.float32))
    assert cp.lookup(w) is None  # never registered
    cp.register(w)
    pf = cp.lookup(w)
    assert isinstance(pf, cp.PackedFilter) and cp.lookup(w) is pf  # packed once, on first use
    writeable = RNG.standard_normal((64, 64, 3, 3)).astype(np.float32)
    cp.register(writeable)  # its values may change between calls: never packed
    assert cp.lookup(writeable) is None
    w64 = _frozen(RNG.standard_normal((64, 64, 3, 3)))
    cp.register(w64)
    assert cp.lookup(w64) is None
    w2 = _frozen(RNG.standard_normal((64, 64, 3, 3)).astype(np.float32))
    with _packed.prepacking(False):
        cp.register(w2)
    assert cp.lookup(w2) is None
    # the entry goes with the filter
    ref = weakref.ref(pf)
    n = len(_packed._PACKS)
    del w, pf
    gc.collect()
    assert ref() is None and len(_packed._PACKS) == n - 1


def test_turned_off_by_environment(monkeypatch):
    monkeypatch.setenv("ONNXPY_PACKED_GEMM", "0")
    assert not _packed.enabled()
    w = _frozen(RNG.standard_normal((64, 64, 3, 3)).astype(np.float32))
    cp.register(w)
    assert cp.lookup(w) is None


@pytest.mark.parametrize("shape,wshape,taken,stride", [
    ((1, 128, 56, 56), (128, 128, 3, 3), True, 2),  # (ResNet-50's downsampling)
    ((1, 256, 14, 14), (256, 256, 3, 3), True, 2),  # onto 7x7
    ((1, 128, 14, 14), (192, 128, 3, 3), False, 2),  # onto 7x7 with 128 channels
    ((1, 96, 28, 28), (96, 96, 3, 3), False, 2),  # 96 channels
    ((1, 128, 28, 28), (128, 128, 3, 3), False, 3),  # stride 3
    ((1, 64, 56, 56), (64, 64, 3, 3), True, 1),
    ((1, 256, 14, 14), (256, 256, 3, 3), True, 1),  # (Winograd's range, but a 14x14 plane: packed)
    ((1, 256, 28, 28), (256, 256, 3, 3), False, 1),  # Winograd
    ((1, 512, 7, 7), (512, 512, 3, 3), False, 1),  # 7x7 plane
    ((1, 128, 28, 28), (32, 128, 3, 3), False, 1),  # few filters
    ((1, 32, 28, 28), (128, 32, 3, 3), False, 1),  # few channels
    ((1, 64, 14, 14), (96, 64, 3, 3), False, 1),  # channels x positions
    ((1, 96, 28, 28), (96, 96, 5, 5), False, 1),  # more than 9 taps
])
def test_which_shapes_take_the_packed_path(shape, wshape, taken, stride, monkeypatch):
    calls = []
    real = cp.conv2d
    monkeypatch.setattr(cp, "conv2d", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = RNG.standard_normal(shape).astype(np.float32)
    w = _frozen((RNG.standard_normal(wshape) * 0.05).astype(np.float32))
    cp.register(w)
    p = (wshape[2] // 2, wshape[3] // 2)
    st = (stride, stride)
    y = conv._conv2d_fast(x, w, None, p, p, st, (1, 1), 1, (w, None))
    assert bool(calls) == taken
    monkeypatch.setattr(cp, "_ON", False)
    np.testing.assert_allclose(y, conv._conv2d_fast(x, w, None, p, p, st, (1, 1), 1, (w, None)), rtol=1e-4,
                               atol=1e-3)


def _conv_model(kind, C=64, M=64):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = (RNG.standard_normal((M, C, 3, 3)) * 0.05).astype(np.float32)
    b = RNG.standard_normal(M).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")]
    if kind == "strided":
        nodes = [helper.make_node("Conv", ["x", "W", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    elif kind == "relu":  # -> FusedConv
        nodes = [helper.make_node("Conv", ["x", "W", "b"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["y"])]
    elif kind == "residual":  # -> ConvAdd: the convolution accumulates into the residual
        inits.append(numpy_helper.from_array((RNG.standard_normal((M, C, 1, 1)) * 0.1).astype(np.float32), "W1"))
        nodes = [helper.make_node("Conv", ["x", "W1"], ["r"]),
                 helper.make_node("Conv", ["x", "W", "b"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Add", ["c", "r"], ["y"])]
    else:  # concat -> ConvConcat: each member writes its channel range
        inits.append(numpy_helper.from_array((RNG.standard_normal((M, C, 3, 3)) * 0.05).astype(np.float32), "W2"))
        nodes = [helper.make_node("Conv", ["x", "W", "b"], ["c1"], pads=[1, 1, 1, 1]),
                 helper.make_node("Conv", ["x", "W2"], ["c2"], pads=[2, 2, 2, 2], dilations=[2, 2]),
                 helper.make_node("Relu", ["c1"], ["r1"]), helper.make_node("Relu", ["c2"], ["r2"]),
                 helper.make_node("Concat", ["r1", "r2"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "g", [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("kind", ["relu", "residual", "concat", "strided"])
def test_sessions_against_onnxruntime(kind, monkeypatch):
    calls = []
    real = cp.conv2d
    monkeypatch.setattr(cp, "conv2d", lambda *a, **k: calls.append(1) or real(*a, **k))
    C = 128 if kind == "strided" else 64
    data = _conv_model(kind, C, C)
    x = RNG.standard_normal((1, C, 30 if kind == "strided" else 20, 20)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxpy.InferenceSession(data).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert calls
    calls.clear()
    so = onnxpy.SessionOptions()
    so.add_session_config_entry("session.disable_prepacking", "1")
    plain = onnxpy.InferenceSession(data, so).run(None, {"x": x})[0]
    assert not calls  # not registered: the direct path
    np.testing.assert_allclose(plain, want, rtol=1e-4, atol=1e-4)


def test_other_input_shapes_of_the_same_session(monkeypatch):
    """The plan registers the filter; each call decides by its own shape (a small plane takes another path)."""
    data = _conv_model("relu")
    sess = onnxpy.InferenceSession(data)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for hw in (20, 6, 33):
        x = RNG.standard_normal((1, 64, hw, hw)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(Exception, match="64|channel"):
        sess.run(None, {"x": RNG.standard_normal((1, 32, 20, 20)).astype(np.float32)})


def test_concurrent_runs_give_identical_results():
    """Two threads running packed convolutions at once: one holds the helper, the other runs its parts alone."""
    import threading

    data = _conv_model("relu", 128, 128)
    sess = onnxpy.InferenceSession(data)
    xs = [RNG.standard_normal((1, 128, 24, 24)).astype(np.float32) for _ in range(4)]
    want = [sess.run(None, {"x": x})[0] for x in xs]
    out = [None] * len(xs)

    def work(i):
        for _ in range(5):
            out[i] = sess.run(None, {"x": xs[i]})[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(o, w) for o, w in zip(out, want))
