"""Utility contrib ops (com.microsoft) and the com.microsoft.nchwc layout ops, against onnxruntime.

Single-node models are run by both runtimes; NCHWc models are produced by onnxruntime itself (ORT_ENABLE_ALL with
``optimized_model_filepath``) from small CNNs and must give the original model's results in onnxpy.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
from onnxpy.dtypes import from_numpy
from _oracle import run_onnxpy as _run_onnxpy
from _oracle import run_ort, single_node

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
NCHWC = "com.microsoft.nchwc"
RNG = np.random.default_rng(20240611)


def _model(op, inputs, attrs=None, n_out=1, domain=MS):
    m, feeds = single_node(op, inputs, n_out, opsets=[("", 17), (domain, 1)], domain=domain, shapes=False,
                           **(attrs or {}))
    return m.SerializeToString(), feeds


def _run_both(op, inputs, attrs=None, n_out=1, domain=MS):
    mb, feeds = _model(op, inputs, attrs, n_out, domain)
    return run_ort(mb, feeds), _run_onnxpy(mb, feeds)


def check(op, inputs, attrs=None, n_out=1, rtol=1e-5, atol=1e-6):
    want, got = _run_both(op, inputs, attrs, n_out)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype, (op, g.dtype, w.dtype)
        assert g.shape == w.shape, (op, g.shape, w.shape)
        if w.dtype == object:
            assert g.tolist() == w.tolist()
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def run_onnxpy(op, inputs, attrs=None, n_out=1, domain=MS):
    return _run_onnxpy(*_model(op, inputs, attrs, n_out, domain))


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------------------- Range / Trilu / ...


@pytest.mark.parametrize("vals,dt", [((1, 10, None), np.int32), ((1, 10, 3), np.int64), ((10, 1, -3), np.int16),
                                     ((1.5, -3, -0.7), np.float32), ((0.0, 1.0, 0.1), np.float64),
                                     ((5, 5, 1), np.int32), ((5, 1, 1), np.int64)])
def test_range(vals, dt):
    check("Range", [np.array(v, dt) if v is not None else None for v in vals])


@pytest.mark.parametrize("shape,k,upper", [((4, 5), None, 1), ((2, 4, 5), None, 0), ((3, 3), 1, 1),
                                           ((2, 5, 3), -1, 0), ((2, 0, 3), None, 1), ((6, 4), 7, 0)])
def test_trilu(shape, k, upper):
    x = RNG.standard_normal(shape)
    check("Trilu", [x, None if k is None else np.array(k, np.int64)], dict(upper=upper))
    check("Trilu", [(x * 10).astype(np.int64)], dict(upper=upper))


@pytest.mark.parametrize("axis", [0, 1, 3, -1, -4])
def test_expand_dims(axis):
    check("ExpandDims", [f32(2, 3, 4), np.array(axis, np.int32)])


def test_expand_dims_strings_and_bad_axis():
    check("ExpandDims", [np.array(["a", "bc"], object), np.array(1, np.int32)])
    with pytest.raises(Exception, match="axis"):
        run_onnxpy("ExpandDims", [f32(2, 3), np.array(3, np.int32)])


@pytest.mark.parametrize("shape,dt", [((4, 4), np.float32), ((2, 3, 3), np.float64), ((3, 3), np.float16),
                                      ((2, 2, 1, 1), np.float32)])
def test_inverse(shape, dt):
    x = (RNG.standard_normal(shape) + 3 * np.eye(shape[-1])).astype(dt)
    tol = 1e-2 if dt == np.float16 else 1e-4
    check("Inverse", [x], rtol=tol, atol=tol)


@pytest.mark.parametrize("metric", [None, "sqeuclidean", "euclidean"])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_cdist(metric, dt):
    a, b = RNG.standard_normal((5, 3)).astype(dt), RNG.standard_normal((4, 3)).astype(dt)
    attrs = {} if metric is None else dict(metric=metric)
    check("CDist", [a, b], attrs, rtol=1e-4, atol=1e-5)
    check("CDist", [a, a], attrs, rtol=1e-4, atol=1e-3)  # zero distances stay >= 0


def test_cdist_other_metric_matches_scipy():
    from scipy.spatial.distance import cdist

    a, b = RNG.standard_normal((5, 3)), RNG.standard_normal((4, 3))
    (y,) = run_onnxpy("CDist", [a, b], dict(metric="cityblock"))
    np.testing.assert_allclose(y, cdist(a, b, "cityblock"))


@pytest.mark.parametrize("x", [[2, 1, 1, 3, 4, 3], [5.5], [1, 1, 1], [3, -1, 2, -1, 0, 3, 3]])
def test_unique(x):
    check("Unique", [np.array(x, np.float32)], n_out=3)


def test_unique_other_types():
    y, idx, cnt = run_onnxpy("Unique", [np.array([7, 3, 7, 7, 1], np.int64)], n_out=3)
    assert y.tolist() == [7, 3, 1] and idx.tolist() == [0, 1, 0, 0, 2] and cnt.tolist() == [3, 1, 1]
    assert idx.dtype == np.int64 and cnt.dtype == np.int64
    y, idx, cnt = run_onnxpy("Unique", [np.array([], np.float32)], n_out=3)
    assert y.shape == (0,) and idx.shape == (0,) and cnt.shape == (0,)


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample(mode, padding_mode, align_corners):
    x = f32(2, 3, 5, 6)
    grid = RNG.uniform(-1.3, 1.3, (2, 4, 7, 2)).astype(np.float32)
    check("GridSample", [x, grid], dict(mode=mode, padding_mode=padding_mode, align_corners=align_corners),
          rtol=1e-4, atol=1e-5)


def test_grid_sample_defaults():
    check("GridSample", [f32(1, 2, 4, 4), RNG.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float32)], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("crop", [[3, 4], [1, 1], [1, 5], [7, 2]])
def test_crop_and_resize(mode, crop):
    x = f32(2, 3, 7, 6)
    rois = np.array([[0.1, 0.2, 0.8, 0.9], [-0.2, 0.0, 1.3, 0.5], [0.5, 0.5, 0.5, 0.5], [0.9, 0.8, 0.1, 0.2]],
                    np.float32)
    bi = np.array([0, 1, 1, 0], np.int32)
    check("CropAndResize", [x, rois, bi, np.array(crop, np.int32)], dict(mode=mode, extrapolation_value=-1.5))
    check("CropAndResize", [x, rois[:2], bi[:2], np.array(crop, np.int32)], dict(mode=mode))


def test_crop_and_resize_bad_batch_index():
    with pytest.raises(Exception, match="batch index"):
        run_onnxpy("CropAndResize", [f32(1, 1, 4, 4), np.zeros((1, 4), np.float32), np.array([3], np.int32),
                                     np.array([2, 2], np.int32)])


@pytest.mark.parametrize("shape,ks,attrs", [
    ((1, 1, 9), [3], dict(strides=[2])), ((1, 1, 9), [2], dict(pads=[1, 1])),
    ((2, 3, 7, 6), [3, 3], dict(strides=[2, 2])), ((2, 3, 7, 6), [3, 2], dict(pads=[1, 0, 1, 1])),
    ((2, 3, 7, 6), [3, 3], dict(auto_pad="SAME_UPPER")), ((1, 2, 5, 6, 4), [2, 3, 2], dict(strides=[2, 2, 2])),
])
@pytest.mark.parametrize("mask_first", [0, 1])
def test_maxpool_with_mask(shape, ks, attrs, mask_first):
    x = f32(*shape)
    m = (RNG.random(shape) > 0.3).astype(np.int32)
    m.reshape(-1)[0] = 1 - mask_first
    check("MaxpoolWithMask", [x, m], dict(kernel_shape=ks, **attrs))


@pytest.mark.parametrize("dt", [np.int8, np.uint8])
@pytest.mark.parametrize("attrs", [dict(kernel_shape=[3, 3], strides=[2, 2]),
                                   dict(kernel_shape=[2, 3], pads=[1, 1, 0, 1]),
                                   dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
                                   dict(kernel_shape=[2, 2], dilations=[2, 1], ceil_mode=1, strides=[2, 2])])
def test_nhwc_max_pool(dt, attrs):
    info = np.iinfo(dt)
    x = RNG.integers(info.min, info.max, (2, 7, 6, 3)).astype(dt)
    check("NhwcMaxPool", [x], attrs)


# ------------------------------------------------------------------------------------------- Rfft / Irfft
# onnxruntime has CUDA kernels only for these: compare with numpy's FFT (torch.rfft/irfft conventions).


@pytest.mark.parametrize("shape,nd", [((8,), 1), ((3, 10), 1), ((2, 4, 6), 2), ((2, 3, 4, 8), 3)])
@pytest.mark.parametrize("normalized", [0, 1])
def test_rfft_irfft(shape, nd, normalized):
    x = RNG.standard_normal(shape).astype(np.float32)
    (y,) = run_onnxpy("Rfft", [x], dict(signal_ndim=nd, normalized=normalized, onesided=1))
    axes = tuple(range(x.ndim - nd, x.ndim))
    ref = np.fft.rfftn(x.astype(np.float64), axes=axes, norm="ortho" if normalized else "backward")
    assert y.dtype == np.float32 and y.shape == ref.shape + (2,)
    np.testing.assert_allclose(y[..., 0], ref.real, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y[..., 1], ref.imag, rtol=1e-4, atol=1e-4)
    (back,) = run_onnxpy("Irfft", [y], dict(signal_ndim=nd, normalized=normalized, onesided=1))
    assert back.dtype == np.float32 and back.shape == x.shape
    np.testing.assert_allclose(back, x, rtol=1e-4, atol=1e-4)


def test_rfft_float16_and_double():
    x = RNG.standard_normal((2, 8))
    (y,) = run_onnxpy("Rfft", [x], dict(signal_ndim=1))
    assert y.dtype == np.float64
    (h,) = run_onnxpy("Rfft", [x.astype(np.float16)], dict(signal_ndim=1))
    assert h.dtype == np.float16
    np.testing.assert_allclose(h.astype(np.float64), y, atol=2e-2, rtol=1e-2)


# ------------------------------------------------------------------------------------------- SparseToDenseMatMul


def _sparse_model(transA, transB, alpha, et, sparse_init=None):
    node = helper.make_node("SparseToDenseMatMul", ["A", "B"], ["Y"], domain=MS, transA=transA, transB=transB,
                            alpha=alpha)
    inputs = [helper.make_tensor_value_info("B", et, None)]
    if sparse_init is None:
        inputs.insert(0, helper.make_sparse_tensor_value_info("A", et, None))
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", et, None)],
                          sparse_initializer=[] if sparse_init is None else [sparse_init])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("transA,transB,alpha", [(0, 0, 1.0), (1, 0, 2.0), (0, 1, 0.5), (1, 1, 1.0)])
def test_sparse_to_dense_matmul(dt, transA, transB, alpha):
    A = (RNG.standard_normal((4, 5)) * 3).astype(dt) * (RNG.random((4, 5)) > 0.6)
    a = A.T if transA else A
    B = (RNG.standard_normal((a.shape[1], 3)) * 3).astype(dt)
    if transB:
        B = np.ascontiguousarray(B.T)
    et = from_numpy(np.dtype(dt))
    # onnxruntime: A is a SparseTensor graph input (it densifies sparse initializers, which its kernel rejects)
    m = _sparse_model(transA, transB, alpha, et)
    nz = np.ascontiguousarray(np.argwhere(A).astype(np.int64))
    st = ort.SparseTensor.sparse_coo_from_numpy(list(A.shape), np.ascontiguousarray(A[A != 0]), nz,
                                                ort.OrtDevice.make("cpu", 0))
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"A": ort.OrtValue.ort_value_from_sparse_tensor(st), "B": B})[0]
    # onnxpy: the sparse input fed densely ...
    got = onnxpy.InferenceSession(m.SerializeToString()).run(None, {"A": A, "B": B})[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # ... and as a sparse initializer (the loader densifies it)
    flat = np.flatnonzero(A)
    sp = helper.make_sparse_tensor(numpy_helper.from_array(A.reshape(-1)[flat], "A"),
                                   numpy_helper.from_array(flat.astype(np.int64), "A_idx"), list(A.shape))
    m2 = _sparse_model(transA, transB, alpha, et, sparse_init=sp)
    got2 = onnxpy.InferenceSession(m2.SerializeToString()).run(None, {"B": B})[0]
    np.testing.assert_allclose(got2, want, rtol=1e-5)


def test_sparse_to_dense_matmul_shape_error():
    with pytest.raises(Exception, match="inner dimensions"):
        run_onnxpy("SparseToDenseMatMul", [f32(3, 4), f32(3, 2)])


# ------------------------------------------------------------------------------------------- MurmurHash3


@pytest.mark.parametrize("x", [
    np.array([0, 1, -1, 3, 2**31 - 1], np.int32), np.array([0, 1, 2**32 - 1, 3], np.uint32),
    np.array([[0, 1], [-1, 3]], np.int64), np.array([0, 1, 2**64 - 1, 3, 2**32], np.uint64),
    np.array([0, 1.5, -1, np.inf], np.float32), np.array([0, 1.5, -1], np.float64),
    np.array(["", "a", "ab", "abc", "abcd", "abcde", "hello world", "é€", "x" * 37], object),
    np.array([], np.int32),
])
@pytest.mark.parametrize("positive,seed", [(1, None), (0, None), (1, 42), (0, 4294967295)])
def test_murmur_hash3(x, positive, seed):
    attrs = dict(positive=positive)
    if seed is not None:
        attrs["seed"] = seed
    check("MurmurHash3", [x], attrs)


# ------------------------------------------------------------------------------------------- Tokenizer


@pytest.mark.parametrize("x,attrs", [
    (["Hello World", "I love computer science !"], dict(separators=[" "], mark=0, mincharnum=1)),
    (["Hello World", "I love computer science !"], dict(separators=[" "], mark=1, mincharnum=1)),
    (["Hello World", "I love computer science !"], dict(separators=[" "], mark=1, mincharnum=2)),
    ([["Hello World", "a b"], ["x", "  y  z "]], dict(separators=[" "], mark=0, mincharnum=1)),
    ([["a b"], ["c d e"]], dict(separators=[" "], mark=1, mincharnum=1)),
    (["Hello World", "abc"], dict(separators=[""], mark=0, mincharnum=1)),
    (["aé€x", "b"], dict(separators=[""], mark=1, mincharnum=1)),
    (["Hello World", "abc"], dict(tokenexp=".", mark=0, mincharnum=1)),
    (["Hello World", "abc"], dict(tokenexp="[a-z]+", mark=0, mincharnum=1)),
    (["Hello World", "abc"], dict(tokenexp="[a-z]+", mark=1, mincharnum=3)),
    (["a;b,c", "d,,e"], dict(separators=[";", ","], mark=0, mincharnum=1)),
    (["ab;;cd", "xx"], dict(separators=[";", ";;"], mark=0, mincharnum=1)),
    (["", ""], dict(separators=[" "], mark=1, mincharnum=1)),
    (["", "a"], dict(separators=[" "], mark=1, mincharnum=1)),
    (["aé b", "cc dd"], dict(separators=[" "], mark=0, mincharnum=2)),
    (["a1b22c333", "x"], dict(separators=["[0-9]+"], mark=0, mincharnum=1)),
    (["a1b22c333", "x"], dict(tokenexp="[0-9]*", mark=0, mincharnum=1)),
    (["ab ab", "x"], dict(tokenexp="a|ab", mark=0, mincharnum=1)),
    (["ab12cd"], dict(tokenexp="[a-z]+|[a-z]+[0-9]+", mark=0, mincharnum=1)),
    (["a b"], dict(separators=[" "], tokenexp="a", mark=0, mincharnum=1)),
    (["axxb"], dict(separators=["x*"], mark=0, mincharnum=1)),
])
def test_tokenizer(x, attrs):
    check("Tokenizer", [np.array(x, object)], dict(pad_value="#", **attrs))


def test_tokenizer_empty_and_errors():
    (y,) = run_onnxpy("Tokenizer", [np.array([], object)], dict(separators=[" "], mark=0, pad_value="#",
                                                                  mincharnum=1))
    assert y.shape == (0,)
    with pytest.raises(Exception, match="mincharnum"):
        run_onnxpy("Tokenizer", [np.array(["ab"], object)], dict(separators=[""], mark=0, pad_value="#",
                                                                  mincharnum=2))
    with pytest.raises(Exception, match="separators or tokenexp"):
        run_onnxpy("Tokenizer", [np.array(["ab"], object)], dict(mark=0, pad_value="#", mincharnum=1))


# ------------------------------------------------------------------------------------------- WordConvEmbedding


@pytest.mark.parametrize("V,E,F,K,S,L", [(10, 3, 4, 2, 5, 5), (20, 4, 6, 3, 7, 6), (5, 2, 3, 4, 4, 4),
                                         (8, 3, 2, 1, 3, 4)])
@pytest.mark.parametrize("with_attrs", [False, True])
def test_word_conv_embedding(V, E, F, K, S, L, with_attrs):
    seq = RNG.integers(1, V, (S, L)).astype(np.int32)
    seq[1, 2:] = 0
    seq[2, 1:] = 0
    seq[0, 1] = 0
    W = f32(F, 1, K, E)
    B = f32(F)
    C = f32(V, E)
    attrs = dict(embedding_size=F, conv_window_size=K, char_embedding_size=E) if with_attrs else {}
    check("WordConvEmbedding", [seq, W, B, C], attrs, rtol=1e-5, atol=1e-6)


def test_word_conv_embedding_padding_word_is_zero():
    seq = np.array([[0, 0, 0], [1, 2, 0]], np.int32)
    (y,) = run_onnxpy("WordConvEmbedding", [seq, f32(3, 1, 2, 2), f32(3), f32(4, 2)])
    assert y.shape == (2, 3) and not y[0].any()


# ------------------------------------------------------------------------------------------- com.microsoft.nchwc


def _cnn(nodes, inits, xshape):
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xshape))]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _check_nchwc(model, xshape, tmp_path, expect=()):
    """Save ``model`` optimized by onnxruntime at ORT_ENABLE_ALL; the saved model in onnxpy must match."""
    path = str(tmp_path / "nchwc.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = path
    so.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    opt = onnx.load(path)
    ops = collections.Counter(n.op_type for n in opt.graph.node if n.domain == NCHWC)
    x = RNG.standard_normal(xshape).astype(np.float32)
    so0 = ort.SessionOptions()
    so0.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), so0, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = onnxpy.InferenceSession(opt.SerializeToString()).run(None, {"x": x})[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if ops:  # the transformer only runs on AVX2 / AVX-512 machines
        for op in expect:
            assert ops[op] > 0, (op, dict(ops))
    return ops


def _w(*shape):
    return RNG.standard_normal(shape) * 0.3


@pytest.mark.parametrize("cin,c1,c2,n,hw", [(3, 20, 24, 2, 16), (3, 32, 48, 1, 12), (1, 8, 40, 1, 9),
                                           (5, 17, 9, 2, 10)])
def test_nchwc_cnn_unaligned(cin, c1, c2, n, hw, tmp_path):
    """Conv+BN+Relu, MaxPool, depthwise Conv, 1x1 Conv, residual Add+Relu (Sum input), AveragePool, Upsample."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "b", "mu", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "wd"], ["d1"], group=c1, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "w3"], ["c3"]),
        helper.make_node("Add", ["c2", "c3"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["a3"]),
        helper.make_node("AveragePool", ["a3"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["ap", "", "sc"], ["up"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Conv", ["up", "w4"], ["c4"], strides=[2, 2], pads=[0, 0, 1, 1]),
        helper.make_node("Sigmoid", ["c4"], ["s4"]),
        helper.make_node("GlobalAveragePool", ["s4"], ["y"]),
    ]
    inits = dict(w1=_w(c1, cin, 3, 3), b1=_w(c1), s=RNG.random(c1) + 0.5, b=_w(c1), mu=_w(c1),
                 var=RNG.random(c1) + 0.5, wd=_w(c1, 1, 3, 3), w2=_w(c2, c1, 3, 3), b2=_w(c2), w3=_w(c2, c1, 1, 1),
                 sc=[1, 1, 2, 2], w4=_w(c2 + 3, c2, 3, 3))
    _check_nchwc(_cnn(nodes, inits, (n, cin, hw, hw)), (n, cin, hw, hw), tmp_path,
                 expect=("Conv", "ReorderOutput"))


@pytest.mark.parametrize("c", [16, 32])
def test_nchwc_aligned_pools_upsample_concat(c, tmp_path):
    """Channel counts on the block: pools, Upsample (nearest and linear) and Concat stay in NCHWc."""
    cin = 3
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c1"], ["r1"], alpha=0.2),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "wd", "bd"], ["d1"], group=32, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d1", "lo", "hi"], ["d2"]),
        helper.make_node("Conv", ["d2", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "w3"], ["c3"]),
        helper.make_node("Add", ["c2", "c3"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["a3"]),
        helper.make_node("AveragePool", ["a3"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        helper.make_node("Resize", ["ap", "", "sc"], ["up"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Resize", ["up", "", "sc"], ["up2"], mode="linear",
                         coordinate_transformation_mode="asymmetric"),
        helper.make_node("Conv", ["up2", "w4"], ["c4"], strides=[2, 2], pads=[0, 0, 1, 1]),
        helper.make_node("HardSigmoid", ["c4"], ["s4"], alpha=0.3, beta=0.4),
        helper.make_node("Conv", ["up2", "w4b"], ["s4b"], strides=[2, 2], pads=[0, 0, 1, 1]),
        helper.make_node("Concat", ["s4", "s4b"], ["cc"], axis=1),
        helper.make_node("GlobalMaxPool", ["cc"], ["g1"]),
        helper.make_node("Conv", ["g1", "w5"], ["y"]),
    ]
    inits = dict(w1=_w(32, cin, 3, 3), b1=_w(32), wd=_w(32, 1, 3, 3), bd=_w(32), lo=[-0.5], hi=[0.6],
                 w2=_w(48, 32, 3, 3), b2=_w(48), w3=_w(48, 32, 1, 1), sc=[1, 1, 2, 2], w4=_w(c, 48, 3, 3),
                 w4b=_w(16, 48, 3, 3), w5=_w(10, c + 16, 1, 1))
    _check_nchwc(_cnn(nodes, inits, (2, cin, 16, 16)), (2, cin, 16, 16), tmp_path,
                 expect=("Conv", "MaxPool", "AveragePool", "Upsample", "GlobalMaxPool", "ReorderOutput"))


def test_nchwc_channels_last_and_global_average(tmp_path):
    """NHWC input (Transpose -> ReorderInput channels_last=1) and NHWC output (ReorderOutput channels_last=1)."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["xt", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], dilations=[2, 2], strides=[1, 2]),
        helper.make_node("GlobalAveragePool", ["c1"], ["g"]),
        helper.make_node("Mul", ["c1", "g"], ["mm"]),
        helper.make_node("AveragePool", ["mm"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        helper.make_node("Transpose", ["ap"], ["y"], perm=[0, 2, 3, 1]),
    ]
    inits = dict(w0=_w(32, 20, 3, 3), w1=_w(32, 32, 3, 3), b1=_w(32))
    _check_nchwc(_cnn(nodes, inits, (2, 11, 9, 20)), (2, 11, 9, 20), tmp_path,
                 expect=("ReorderInput", "Conv", "GlobalAveragePool", "AveragePool", "ReorderOutput"))


def test_nchwc_kernels_direct():
    """The kernels on hand-made blocked data (independent of the machine's transformer)."""
    from onnxpy.ops import contrib_nchwc as nc
    from onnxpy.ops.conv import conv

    b = nc.block_size()
    x = f32(2, 5, 6, 7)
    xb = nc.reorder_input(x)
    assert xb.shape == (2, -(-5 // b) * b, 6, 7) and not xb[:, 5:].any()
    np.testing.assert_array_equal(nc.reorder_output(xb, channels=5), x)
    np.testing.assert_array_equal(nc.reorder_input(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), channels_last=1), xb)
    np.testing.assert_array_equal(nc.reorder_output(xb, channels=5, channels_last=1), x.transpose(0, 2, 3, 1))
    # OIHWBiBo filter from a plain one
    O, Ip = 2 * b, xb.shape[1]
    w = np.zeros((O, Ip, 3, 3), np.float32)
    w[:7, :5] = f32(7, 5, 3, 3)
    blocked = w.reshape(O // b, b, Ip // b, b, 3, 3).transpose(0, 2, 4, 5, 3, 1).reshape(O, Ip, 3, 3)
    s = f32(2, O, 6, 7)
    y = nc.nchwc_conv(xb, np.ascontiguousarray(blocked), None, s, pads=[1, 1, 1, 1], activation="Relu")
    ref = np.maximum(conv(x, w[:, :5], None, pads=[1, 1, 1, 1]) + s, 0)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="channels"):
        nc.reorder_output(xb, channels=xb.shape[1] + 1)
