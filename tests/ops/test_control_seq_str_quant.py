"""Control flow, sequences/optionals, strings, quantization and ImageDecoder kernels.

Compared against onnxruntime on single-node (or small) models where it implements the op, else against
independent numpy formulas.
"""

from __future__ import annotations

import struct
import zlib

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from onnxpy.dtypes import from_numpy
from _oracle import run_onnxpy, run_ort, single_node

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(1234)


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _vi(name, x):
    x = np.asarray(x)
    return h.make_tensor_value_info(name, from_numpy(x.dtype), list(x.shape))


def _single(op, inputs, n_out=1, opset=21, inits=(), **attrs):
    """One-node model; ``inputs`` is a list of arrays or None; indexes in ``inits`` become initializers."""
    return single_node(op, inputs, n_out, opsets=[("", opset)], inits=inits, ir_version=10, **attrs)


def _run_both(model, feeds):
    return run_onnxpy(model, feeds), run_ort(model, feeds)


_ours = run_onnxpy


def _same(got, exp, exact=True):
    assert len(got) == len(exp)
    for a, b in zip(got, exp):
        if isinstance(b, list):
            assert isinstance(a, list) and len(a) == len(b)
            _same(a, b, exact)
            continue
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        assert a.shape == b.shape, (a.shape, b.shape)
        if exact or a.dtype.kind not in "fc":
            if a.dtype == object:
                assert a.tolist() == b.tolist()
            else:
                np.testing.assert_array_equal(a.astype(np.float64) if a.dtype.kind == "V" else a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# quantization


@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.uint16, np.int16])
def test_quantize_per_tensor_rounding(zp_dtype):
    x = np.array([-1000, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.49, 1e6, 0.0], np.float32)
    zp = np.array(3, zp_dtype)
    got, exp = _run_both(*_single("QuantizeLinear", [x, np.float32(1.0), zp]))
    _same(got, exp)


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_quantize_per_axis_and_dequantize(axis):
    x = RNG.normal(size=(3, 4, 5)).astype(np.float32) * 50
    n = x.shape[axis]
    scale = RNG.uniform(0.1, 1.0, size=n).astype(np.float32)
    zp = RNG.integers(-20, 20, size=n).astype(np.int8)
    got, exp = _run_both(*_single("QuantizeLinear", [x, scale, zp], axis=axis))
    _same(got, exp)
    got2, exp2 = _run_both(*_single("DequantizeLinear", [got[0], scale, zp], axis=axis))
    _same(got2, exp2, exact=False)


def test_quantize_float16_input_and_no_zero_point():
    x = (RNG.normal(size=(4, 6)) * 30).astype(np.float16)
    got, exp = _run_both(*_single("QuantizeLinear", [x, np.float16(0.5)]))
    _same(got, exp)
    assert got[0].dtype == np.uint8


@pytest.mark.parametrize("shape,axis,block", [((4, 6), 1, 2), ((5, 3), 0, 2), ((2, 7, 3), 1, 3)])
def test_blocked_quantize_dequantize(shape, axis, block):
    x = (RNG.normal(size=shape) * 20).astype(np.float32)
    sshape = list(shape)
    sshape[axis] = -(-shape[axis] // block)
    scale = RNG.uniform(0.2, 2.0, size=sshape).astype(np.float32)
    zp = RNG.integers(0, 30, size=sshape).astype(np.uint8)
    q = _ours(*_single("QuantizeLinear", [x, scale, zp], axis=axis, block_size=block))[0]
    s_full = np.take(np.repeat(scale, block, axis=axis), np.arange(shape[axis]), axis=axis)
    z_full = np.take(np.repeat(zp, block, axis=axis), np.arange(shape[axis]), axis=axis)
    ref = np.clip(np.rint(x / s_full) + z_full, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(q, ref)
    d = _ours(*_single("DequantizeLinear", [q, scale, zp], axis=axis, block_size=block))[0]
    np.testing.assert_allclose(d, (q.astype(np.float32) - z_full) * s_full, rtol=1e-6)


def test_blocked_quantize_rejects_bad_block():
    x = np.zeros((4, 6), np.float32)
    scale = np.ones((4, 2), np.float32)
    with pytest.raises(Exception, match="block"):
        _ours(*_single("QuantizeLinear", [x, scale], axis=1, block_size=2))


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("ftype", [T.FLOAT8E4M3FN, T.FLOAT8E5M2])
def test_quantize_float8_saturate(saturate, ftype):
    x = np.array([0.0, 1.0, -3.3, 500.0, -1e5, 1e6, np.inf, -np.inf], np.float32)
    zp = h.make_tensor("in2", ftype, [], [0.0])
    node = h.make_node("QuantizeLinear", ["in0", "in1", "in2"], ["out0"], saturate=saturate)
    g = h.make_graph([node], "g", [_vi("in0", x)], [h.make_tensor_value_info("out0", ftype, None)],
                     [numpy_helper.from_array(np.float32(1.0), "in1"), zp])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)])
    m.ir_version = 10
    got = _ours(m, {"in0": x})[0]
    dt = ml_dtypes.float8_e4m3fn if ftype == T.FLOAT8E4M3FN else ml_dtypes.float8_e5m2
    mx = float(ml_dtypes.finfo(dt).max)
    ref = (np.clip(x, -mx, mx) if saturate else x).astype(dt)
    assert got.dtype == dt
    np.testing.assert_array_equal(got.astype(np.float32), ref.astype(np.float32))


def test_quantize_int4_output_dtype_and_dequantize_int4():
    x = np.array([[-20, -8.6, -0.5, 0.5], [1.5, 2.5, 7.4, 100]], np.float32)
    q = _ours(*_single("QuantizeLinear", [x, np.float32(1.0)], opset=21, output_dtype=T.INT4))[0]
    assert q.dtype == ml_dtypes.int4
    np.testing.assert_array_equal(q.astype(np.int8), [[-8, -8, 0, 0], [2, 2, 7, 7]])
    d = _ours(*_single("DequantizeLinear", [q, np.float32(2.0)], opset=21))[0]
    np.testing.assert_array_equal(d, q.astype(np.float32) * 2)


def test_dequantize_int32_and_empty():
    x = np.array([-(2**20), 0, 5, 2**30], np.int32)
    got, exp = _run_both(*_single("DequantizeLinear", [x, np.float32(0.25)], opset=13))
    _same(got, exp, exact=False)
    e = np.zeros((0, 3), np.uint8)
    got, exp = _run_both(*_single("DequantizeLinear", [e, np.float32(0.5), np.uint8(1)], opset=13))
    _same(got, exp)


@pytest.mark.parametrize("case", ["random", "positive", "negative", "zeros"])
def test_dynamic_quantize_linear(case):
    x = {"random": RNG.normal(size=(5, 7)).astype(np.float32) * 3,
         "positive": RNG.uniform(1, 5, size=(10,)).astype(np.float32),
         "negative": -RNG.uniform(1, 5, size=(3, 3)).astype(np.float32),
         "zeros": np.zeros((2, 2), np.float32)}[case]
    got, exp = _run_both(*_single("DynamicQuantizeLinear", [x], n_out=3, opset=11))
    _same(got[1:], exp[1:], exact=False)
    assert got[0].dtype == np.uint8
    assert np.max(np.abs(got[0].astype(int) - exp[0].astype(int))) <= 1
    assert np.mean(got[0] == exp[0]) > 0.95


@pytest.mark.parametrize("qt", [np.uint8, np.int8])
def test_qlinear_matmul_batched_vs_ort(qt):
    info = np.iinfo(qt)
    a = RNG.integers(info.min, info.max, size=(2, 3, 4, 5)).astype(qt)
    b = RNG.integers(info.min, info.max, size=(5, 6)).astype(qt)
    ins = [a, np.float32(0.02), qt(3), b, np.float32(0.03), qt(-2 if qt == np.int8 else 7), np.float32(0.5), qt(1)]
    got, exp = _run_both(*_single("QLinearMatMul", ins, opset=10))
    assert got[0].shape == exp[0].shape
    assert np.max(np.abs(got[0].astype(int) - exp[0].astype(int))) <= 1


def test_qlinear_matmul_per_column_b():
    a = RNG.integers(0, 255, size=(3, 4)).astype(np.uint8)
    b = RNG.integers(0, 255, size=(4, 5)).astype(np.uint8)
    bs = RNG.uniform(0.01, 0.05, size=5).astype(np.float32)
    bz = RNG.integers(100, 150, size=5).astype(np.uint8)
    ins = [a, np.float32(0.02), np.uint8(120), b, bs, bz, np.float32(0.3), np.uint8(128)]
    got = _ours(*_single("QLinearMatMul", ins, opset=21))[0]
    acc = (a.astype(np.int64) - 120) @ (b.astype(np.int64) - bz)
    ref = np.clip(np.rint(acc * (0.02 * bs.astype(np.float64) / 0.3)) + 128, 0, 255)
    assert np.max(np.abs(got.astype(int) - ref.astype(int))) <= 1


# ----------------------------------------------------------------------------------------------------------------
# control flow


def _loop_body():
    return h.make_graph([
        h.make_node("Constant", [], ["two"], value=h.make_tensor("t", T.INT64, [], [2])),
        h.make_node("Less", ["i", "two"], ["cond_out"]),
        h.make_node("Add", ["x_in", "x_in"], ["x_out"]),
        h.make_node("Cast", ["i"], ["i_f"], to=T.FLOAT),
        h.make_node("Add", ["x_in", "i_f"], ["s"]),
    ], "b", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
             h.make_tensor_value_info("x_in", T.FLOAT, None)],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("x_out", T.FLOAT, None),
         h.make_tensor_value_info("s", T.FLOAT, [2])])


def _loop_model(ins):
    vi = {"M": h.make_tensor_value_info("M", T.INT64, []), "cond": h.make_tensor_value_info("cond", T.BOOL, []),
          "x": h.make_tensor_value_info("x", T.FLOAT, [2])}
    g = h.make_graph([h.make_node("Loop", ins, ["xf", "scan"], body=_loop_body())], "g",
                     [vi[i] for i in ins if i],
                     [h.make_tensor_value_info("xf", T.FLOAT, None), h.make_tensor_value_info("scan", T.FLOAT, None)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("ins,M,cond", [
    (["M", "", "x"], 10, None), (["", "cond", "x"], None, True), (["M", "cond", "x"], 1, True),
    (["M", "cond", "x"], 10, False), (["M", "", "x"], 0, None),
])
def test_loop_trip_count_and_condition(ins, M, cond):
    feeds = {"x": np.array([1.0, 3.0], np.float32)}
    if M is not None:
        feeds["M"] = np.array(M, np.int64)
    if cond is not None:
        feeds["cond"] = np.array(cond)
    got, exp = _run_both(_loop_model(ins), feeds)
    _same(got, exp)


def test_if_with_sequence_outputs_and_outer_scope():
    then_g = h.make_graph([h.make_node("SequenceConstruct", ["a", "a"], ["seq"])], "then", [],
                          [h.make_tensor_sequence_value_info("seq", T.FLOAT, None)])
    else_g = h.make_graph([h.make_node("SequenceConstruct", ["a"], ["seq2"])], "else", [],
                          [h.make_tensor_sequence_value_info("seq2", T.FLOAT, None)])
    g = h.make_graph([h.make_node("If", ["c"], ["r"], then_branch=then_g, else_branch=else_g),
                      h.make_node("SequenceLength", ["r"], ["n"])], "g",
                     [h.make_tensor_value_info("c", T.BOOL, [1]), h.make_tensor_value_info("a", T.FLOAT, [2])],
                     [h.make_tensor_value_info("n", T.INT64, [])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 16)])
    m.ir_version = 8
    for c, n in ((True, 2), (False, 1)):
        got = _ours(m, {"c": np.array([c]), "a": np.ones(2, np.float32)})
        assert int(got[0]) == n


def _scan_body():
    # state s (shape [2]) += x_t ; scan out y_t = s * 2 ; second scan out z_t = x_t
    return h.make_graph([
        h.make_node("Add", ["s_in", "x_t"], ["s_out"]),
        h.make_node("Add", ["s_out", "s_out"], ["y_t"]),
        h.make_node("Identity", ["x_t"], ["z_t"]),
    ], "body", [h.make_tensor_value_info("s_in", T.FLOAT, [2]), h.make_tensor_value_info("x_t", T.FLOAT, [2])],
        [h.make_tensor_value_info("s_out", T.FLOAT, [2]), h.make_tensor_value_info("y_t", T.FLOAT, [2]),
         h.make_tensor_value_info("z_t", T.FLOAT, [2])])


@pytest.mark.parametrize("in_axis,in_dir,out_axes,out_dirs", [
    (0, 0, [0, 0], [0, 0]), (1, 1, [1, -1], [1, 0]), (-1, 0, [0, 1], [0, 1]),
])
def test_scan9_axes_and_directions(in_axis, in_dir, out_axes, out_dirs):
    x = RNG.normal(size=(4, 2)).astype(np.float32) if in_axis == 0 else RNG.normal(size=(2, 4)).astype(np.float32)
    s0 = np.zeros(2, np.float32)
    node = h.make_node("Scan", ["s0", "x"], ["sf", "y", "z"], body=_scan_body(), num_scan_inputs=1,
                       scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                       scan_output_axes=out_axes, scan_output_directions=out_dirs)
    g = h.make_graph([node], "g", [_vi("s0", s0), _vi("x", x)],
                     [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("sf", "y", "z")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 16)])
    m.ir_version = 8
    got, exp = _run_both(m, {"s0": s0, "x": x})
    _same(got, exp, exact=False)


def test_scan8_batch_and_sequence_lens():
    x = RNG.normal(size=(3, 4, 2)).astype(np.float32)
    s0 = np.zeros((3, 2), np.float32)
    lens = np.array([4, 2, 0], np.int64)
    node = h.make_node("Scan", ["lens", "s0", "x"], ["sf", "y", "z"], body=_scan_body(), num_scan_inputs=1,
                       directions=[1])
    g = h.make_graph([node], "g", [_vi("lens", lens), _vi("s0", s0), _vi("x", x)],
                     [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("sf", "y", "z")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 8)])
    m.ir_version = 4
    got = _ours(m, {"lens": lens, "s0": s0, "x": x})
    # independent reference: per batch, reverse over the first lens[b] steps
    for b in range(3):
        n = int(lens[b])
        np.testing.assert_allclose(got[0][b], x[b, :n].sum(axis=0), rtol=1e-6)
        acc = np.zeros(2, np.float32)
        for t in range(n):
            acc = acc + x[b, n - 1 - t]
            np.testing.assert_allclose(got[1][b, t], acc * 2, rtol=1e-6)
            np.testing.assert_allclose(got[2][b, t], x[b, n - 1 - t])
        assert not got[1][b, n:].any()
    assert got[1].shape == (3, 4, 2)


# ----------------------------------------------------------------------------------------------------------------
# sequences and optionals


def _seq_model(nodes, inputs, outputs, opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_sequence_ops_chain_vs_ort():
    a = RNG.normal(size=(2, 3)).astype(np.float32)
    b = RNG.normal(size=(1, 3)).astype(np.float32)
    c = RNG.normal(size=(4, 3)).astype(np.float32)
    nodes = [
        h.make_node("SequenceConstruct", ["a", "b"], ["s1"]),
        h.make_node("Constant", [], ["pneg"], value=h.make_tensor("p", T.INT64, [], [-1])),
        h.make_node("SequenceInsert", ["s1", "c", "pneg"], ["s2"]),  # a, c, b
        h.make_node("SequenceAt", ["s2", "pneg"], ["last"]),
        h.make_node("SequenceErase", ["s2"], ["s3"]),  # a, c
        h.make_node("SequenceLength", ["s3"], ["n"]),
        h.make_node("ConcatFromSequence", ["s2"], ["cat"], axis=-2),
        h.make_node("SplitToSequence", ["cat"], ["parts"], axis=0),
        h.make_node("ConcatFromSequence", ["parts"], ["stk"], axis=-1, new_axis=1),
    ]
    outs = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("last", "cat", "stk")]
    outs.insert(1, h.make_tensor_value_info("n", T.INT64, None))
    m = _seq_model(nodes, [_vi("a", a), _vi("b", b), _vi("c", c)], outs)
    got, exp = _run_both(m, {"a": a, "b": b, "c": c})
    _same(got, exp)


@pytest.mark.parametrize("split,keepdims,axis", [(None, 0, 1), (None, 1, -1), (np.array(2, np.int64), 1, 1),
                                                 (np.array([1, 0, 4], np.int32), 1, 1)])
def test_split_to_sequence(split, keepdims, axis):
    x = RNG.normal(size=(2, 5)).astype(np.float32)
    ins = ["x"] if split is None else ["x", "sp"]
    vis = [_vi("x", x)] + ([] if split is None else [_vi("sp", split)])
    m = _seq_model([h.make_node("SplitToSequence", ins, ["s"], axis=axis, keepdims=keepdims)], vis,
                   [h.make_tensor_sequence_value_info("s", T.FLOAT, None)])
    feeds = {"x": x} if split is None else {"x": x, "sp": split}
    got, exp = _run_both(m, feeds)
    _same(got, exp)


def test_sequence_position_out_of_range_is_an_error():
    a = np.ones(2, np.float32)
    m = _seq_model([h.make_node("SequenceConstruct", ["a"], ["s"]),
                    h.make_node("Constant", [], ["p"], value=h.make_tensor("p", T.INT64, [], [3])),
                    h.make_node("SequenceAt", ["s", "p"], ["o"])], [_vi("a", a)],
                   [h.make_tensor_value_info("o", T.FLOAT, None)])
    with pytest.raises(Exception, match="out of range"):
        _ours(m, {"a": a})


def test_sequence_map_with_tensor_input():
    body = h.make_graph([h.make_node("Add", ["e", "t"], ["o"]), h.make_node("Shape", ["e"], ["shp"])], "body",
                        [h.make_tensor_value_info("e", T.FLOAT, None), h.make_tensor_value_info("t", T.FLOAT, None)],
                        [h.make_tensor_value_info("o", T.FLOAT, None), h.make_tensor_value_info("shp", T.INT64, None)])
    x = RNG.normal(size=(3, 2)).astype(np.float32)
    t = np.float32(10)
    m = _seq_model([h.make_node("SplitToSequence", ["x"], ["s"]),
                    h.make_node("SequenceMap", ["s", "t"], ["r", "shapes"], body=body)],
                   [_vi("x", x), _vi("t", t)],
                   [h.make_tensor_sequence_value_info("r", T.FLOAT, None),
                    h.make_tensor_sequence_value_info("shapes", T.INT64, None)])
    got = _ours(m, {"x": x, "t": np.asarray(t)})
    assert len(got[0]) == 3
    for i in range(3):
        np.testing.assert_allclose(got[0][i], x[i:i + 1] + 10)
        np.testing.assert_array_equal(got[1][i], [1, 2])


def test_optional_ops():
    x = np.arange(3, dtype=np.float32)
    tp = h.make_tensor_type_proto(T.FLOAT, None)
    m = _seq_model([
        h.make_node("Optional", ["x"], ["ox"]),
        h.make_node("Optional", [], ["oe"], type=tp),
        h.make_node("OptionalHasElement", ["ox"], ["h1"]),
        h.make_node("OptionalHasElement", ["oe"], ["h2"]),
        h.make_node("OptionalGetElement", ["ox"], ["g"]),
    ], [_vi("x", x)], [h.make_tensor_value_info(n, T.BOOL, []) for n in ("h1", "h2")]
        + [h.make_tensor_value_info("g", T.FLOAT, None)], opset=18)
    got = _ours(m, {"x": x})
    assert bool(got[0]) and not bool(got[1])
    np.testing.assert_array_equal(got[2], x)


# ----------------------------------------------------------------------------------------------------------------
# strings


def test_string_normalizer_case_insensitive_2d():
    # onnxruntime needs an installed en_US locale for this op, so compare with Python's str methods
    x = np.array([["Monday", "tuesday", "MONDAY", "Straße", "wed"]], dtype=object)
    m, feeds = _single("StringNormalizer", [x], opset=10, stopwords=["monday", "WED"], case_change_action="UPPER",
                       is_case_sensitive=0)
    got = _ours(m, feeds)[0]
    assert got.dtype == object and got.tolist() == [["TUESDAY", "STRASSE"]]
    m, feeds = _single("StringNormalizer", [x[0]], opset=10, stopwords=["monday"], is_case_sensitive=1)
    assert _ours(m, feeds)[0].tolist() == list(x[0])
    m, feeds = _single("StringNormalizer", [x], opset=10, stopwords=list(x[0]), is_case_sensitive=1)
    got = _ours(m, feeds)[0]
    assert got.shape == (1, 1) and got[0, 0] == ""


def test_string_split_and_concat_vs_ort():
    x = np.array([["a b  c", "  lead trail  "], ["", "x"]], dtype=object)
    for attrs in ({}, {"delimiter": " "}, {"delimiter": " ", "maxsplit": 1}, {"maxsplit": 1}):
        got, exp = _run_both(*_single("StringSplit", [x], n_out=2, opset=20, **attrs))
        _same(got, exp)
    y = np.array(["-1", "-2"], dtype=object)
    got, exp = _run_both(*_single("StringConcat", [x, y], opset=20))
    _same(got, exp)


def test_regex_full_match_vs_ort():
    x = np.array([["abc@gmail.com", "x@y.org"], ["nope", "a@gmail.com.evil"]], dtype=object)
    got, exp = _run_both(*_single("RegexFullMatch", [x], opset=20, pattern=r"[a-z.]+@(gmail|y)\.(com|org)"))
    _same(got, exp)


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("skip", [0, 2])
def test_tfidf_int_vs_ort(mode, skip):
    x = RNG.integers(0, 6, size=(3, 12)).astype(np.int64)
    pool = [0, 1, 2, 3, 0, 1, 1, 2, 2, 2, 5, 5, 0, 1, 2]  # 4 unigrams, 4 bigrams, 1 trigram
    counts = [0, 4, 12]
    idx = list(range(9))[::-1]
    w = list(np.linspace(0.5, 2.0, 9))
    got, exp = _run_both(*_single("TfIdfVectorizer", [x], opset=9, mode=mode, min_gram_length=1, max_gram_length=3,
                                  max_skip_count=skip, ngram_counts=counts, ngram_indexes=idx, pool_int64s=pool,
                                  weights=w))
    _same(got, exp, exact=False)


def test_tfidf_strings_1d_vs_ort():
    x = np.array(["a", "b", "a", "c", "b", "a", "zz"], dtype=object)
    got, exp = _run_both(*_single("TfIdfVectorizer", [x], opset=9, mode="TF", min_gram_length=2, max_gram_length=2,
                                  max_skip_count=1, ngram_counts=[0, 2], ngram_indexes=[0, 1, 2, 3],
                                  pool_strings=["a", "b", "a", "b", "b", "a"]))
    _same(got, exp, exact=False)


# ----------------------------------------------------------------------------------------------------------------
# ImageDecoder (independent encoders)


def _png(img: np.ndarray, color_type: int) -> bytes:
    hgt, wid = img.shape[:2]
    bpp = img.shape[2]
    rows = img.reshape(hgt, wid * bpp).astype(np.int32)
    out = bytearray()
    prev = np.zeros(wid * bpp, np.int32)
    for y in range(hgt):
        cur = rows[y]
        left = np.concatenate([np.zeros(bpp, np.int32), cur[:-bpp]])
        upleft = np.concatenate([np.zeros(bpp, np.int32), prev[:-bpp]])
        ft = y % 5
        if ft == 0:
            f = cur
        elif ft == 1:
            f = cur - left
        elif ft == 2:
            f = cur - prev
        elif ft == 3:
            f = cur - (left + prev) // 2
        else:
            p = left + prev - upleft
            pa, pb, pc = abs(p - left), abs(p - prev), abs(p - upleft)
            f = cur - np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, upleft))
        out.append(ft)
        out += (f & 0xFF).astype(np.uint8).tobytes()
        prev = cur

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))

    ihdr = struct.pack(">IIBBBBB", wid, hgt, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(out))) + chunk(b"IEND", b"")


def _decode(buf: bytes, fmt="RGB"):
    data = np.frombuffer(buf, np.uint8).copy()
    return _ours(*_single("ImageDecoder", [data], opset=20, pixel_format=fmt))[0]


def test_image_decoder_png_all_filters_and_formats():
    img = RNG.integers(0, 256, size=(11, 7, 3)).astype(np.uint8)
    buf = _png(img, 2)
    np.testing.assert_array_equal(_decode(buf), img)
    np.testing.assert_array_equal(_decode(buf, "BGR"), img[:, :, ::-1])
    gray = _decode(buf, "Grayscale")
    r, g, b = (img[..., i].astype(np.uint32) for i in range(3))
    ref = (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16
    np.testing.assert_array_equal(gray[..., 0], ref)
    rgba = RNG.integers(0, 256, size=(5, 9, 4)).astype(np.uint8)
    np.testing.assert_array_equal(_decode(_png(rgba, 6)), rgba[..., :3])


def test_image_decoder_bmp_and_pnm_and_corrupt():
    img = RNG.integers(0, 256, size=(5, 6, 3)).astype(np.uint8)
    stride = (6 * 3 + 3) // 4 * 4
    rows = np.zeros((5, stride), np.uint8)
    rows[:, :18] = img[:, :, ::-1].reshape(5, 18)
    pix = rows[::-1].tobytes()
    hdr = struct.pack("<2sIHHI", b"BM", 54 + len(pix), 0, 0, 54)
    dib = struct.pack("<IiiHHIIiiII", 40, 6, 5, 1, 24, 0, len(pix), 2835, 2835, 0, 0)
    np.testing.assert_array_equal(_decode(hdr + dib + pix), img)
    ppm = b"P6\n# comment\n6 5\n255\n" + img.tobytes()
    np.testing.assert_array_equal(_decode(ppm), img)
    bad = _decode(b"\x89PNG\r\n\x1a\nthis is not a png")
    assert bad.shape == (0, 0, 3) and bad.dtype == np.uint8


def test_image_decoder_jpeg_backend_data_and_truncation():
    from onnx.backend.test.case.node import _image_decoder_data as d

    case = d.image_decoder_decode_jpeg_rgb
    buf = bytes(case.data.astype(np.uint8))
    np.testing.assert_array_equal(_decode(buf), case.output)
    cut = _decode(buf[: len(buf) // 3])  # truncated entropy data decodes without crashing (libjpeg pads)
    assert cut.dtype == np.uint8 and cut.ndim == 3
    assert _decode(b"\xff\xd8\xff\xd9").shape == (0, 0, 3)
