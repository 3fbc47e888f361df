"""Elementwise math / logic / activation / cast / softmax kernels, compared with onnxruntime or numpy formulas."""

from __future__ import annotations

import itertools
import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from scipy import special

import onnxpy

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(3)

RNG = np.random.default_rng(1234)


# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------
def _elem_type(a) -> int:
    a = np.asarray(a)
    return T.STRING if a.dtype.kind in "OU" else helper.np_dtype_to_tensor_dtype(a.dtype)


def _model(op, inputs, out_type, opset, **attrs) -> tuple[bytes, dict]:
    ins, names, feeds = [], [], {}
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        a = np.asarray(a)
        ins.append(helper.make_tensor_value_info(f"i{i}", _elem_type(a), a.shape))
        names.append(f"i{i}")
        feeds[f"i{i}"] = a
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, ["y"], **attrs)
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", out_type, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10 if opset >= 21 else 8
    return m.SerializeToString(), feeds


def _ours(op, inputs, out_type=None, opset=21, **attrs):
    if out_type is None:
        out_type = _elem_type(inputs[0])
    mb, feeds = _model(op, inputs, out_type, opset, **attrs)
    return onnxpy.InferenceSession(mb).run(None, feeds)[0]


def _theirs(op, inputs, out_type=None, opset=21, **attrs):
    if out_type is None:
        out_type = _elem_type(inputs[0])
    mb, feeds = _model(op, inputs, out_type, opset, **attrs)
    return ort.InferenceSession(mb, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _assert_same(got, want, rtol=1e-5, atol=1e-6):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.kind in "biuOU":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True)


_ORT_LACKS = (ort.capi.onnxruntime_pybind11_state.NotImplemented, ort.capi.onnxruntime_pybind11_state.InvalidGraph)


def check(op, inputs, out_type=None, opset=21, rtol=1e-5, atol=1e-6, **attrs):
    """Compare with onnxruntime; a type/version onnxruntime has no kernel for is only run (returns False)."""
    inputs = [None if a is None else np.asarray(a) for a in inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _ours(op, inputs, out_type, opset, **attrs)
        try:
            want = _theirs(op, inputs, out_type, opset, **attrs)
        except _ORT_LACKS:
            return False
    _assert_same(got, want, rtol, atol)
    return True


INT_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOAT_TYPES = [np.float16, np.float32, np.float64]


def _ints(dt, n=40, lo=-100, hi=100):
    info = np.iinfo(dt)
    return RNG.integers(max(info.min, lo), min(info.max, hi), n).astype(dt)


def _floats(dt, shape=(60,), scale=3.0, specials=True):
    a = (RNG.standard_normal(shape) * scale).astype(dt)
    if specials:
        a.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
    return a


# ---------------------------------------------------------------------------------------------------------------
# binary arithmetic
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", INT_TYPES)
def test_integer_arithmetic(dt):
    a = _ints(dt)
    b = _ints(dt, lo=-9, hi=10)
    b[b == 0] = 3
    for op in ("Add", "Sub", "Mul", "Div"):
        check(op, [a, b], opset=14)
    for fmod in (0, 1):
        check("Mod", [a, b], opset=13, fmod=fmod)
    check("Max", [a, b], opset=13)
    check("Min", [a, b], opset=13)
    check("Abs", [a], opset=13)
    check("Sign", [a], opset=13)
    for op in ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"):
        check(op, [a, b], T.BOOL, opset=16)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check(op, [a, b], opset=18)
    check("BitwiseNot", [a], opset=18)


def test_integer_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7, 0, -1, 6], np.int32)
    b = np.array([2, 2, -2, -2, 3, 4, -3], np.int32)
    np.testing.assert_array_equal(_ours("Div", [a, b], opset=14), [3, -3, -3, 3, 0, 0, -2])
    check("Div", [a, b], opset=14)
    check("Div", [a.astype(np.int64), b.astype(np.int64)[:1]], opset=14)  # broadcast


@pytest.mark.parametrize("dt", FLOAT_TYPES)
def test_float_arithmetic_and_mod(dt):
    a, b = _floats(dt), _floats(dt, specials=False)
    b[3:6] = [0, np.nan, np.inf]
    for op in ("Add", "Sub", "Mul", "Div", "Pow"):
        check(op, [a, b], opset=15, rtol=1e-3)
    for fmod in (0, 1):
        check("Mod", [a, b], opset=28, fmod=fmod, rtol=1e-3)
    check("Max", [a, b], opset=13)
    check("Min", [a, b], opset=13)


def test_mod_sign_rules():
    a = np.array([5, -5, 5, -5, 0], np.int32)
    b = np.array([3, 3, -3, -3, 7], np.int32)
    np.testing.assert_array_equal(_ours("Mod", [a, b], opset=13), [2, 1, -1, -2, 0])
    np.testing.assert_array_equal(_ours("Mod", [a, b], opset=13, fmod=1), [2, -2, 2, -2, 0])


@pytest.mark.parametrize("base,exp", list(itertools.product(
    [np.int32, np.int64, np.float16, np.float32, np.float64],
    [np.uint8, np.uint32, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64])))
def test_pow_mixed_types(base, exp):
    x = np.array([2, 3, -2, 5, 0, 1, -1, 7]).astype(base)
    if np.dtype(base).kind == "f":
        x = np.array([2, 3, -2, 5, 0, 1.5, -1.5, 7]).astype(base)
    y = np.array([0, 1, 2, 3, 2, 3, 2, 1]).astype(exp)
    if np.dtype(exp).kind in "fi":
        y = np.array([0, 1, -2, 3, -1, 2.5 if np.dtype(exp).kind == "f" else 2, 2, -1]).astype(exp)
    check("Pow", [x, y], opset=15, rtol=1e-3)


def test_broadcasting_and_empty():
    a = _floats(np.float32, (2, 3, 4), specials=False)
    for b in (np.float32(2.5) * np.ones(()), _floats(np.float32, (4,), specials=False),
              _floats(np.float32, (3, 1), specials=False), _floats(np.float32, (1, 1, 1, 4), specials=False)):
        b = np.asarray(b, np.float32)
        for op in ("Add", "Sub", "Mul", "Div"):
            check(op, [a, b], opset=14)
            check(op, [b, a], opset=14)
    e = np.zeros((0, 3), np.float32)
    check("Add", [e, np.ones((1, 3), np.float32)], opset=14)
    for op in ("Relu", "Exp", "Sigmoid", "Softmax", "Neg", "Gelu"):
        got = _ours(op, [e], opset=20)
        assert got.shape == (0, 3) and got.dtype == np.float32


def test_legacy_broadcast_attributes():
    a = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    cases = [((3,), 1), ((3, 4), 1), ((4, 5), None), ((2,), 0), ((5,), None), ((4,), -2), ((), None)]
    for shape, axis in cases:
        b = (np.abs(RNG.standard_normal(shape)) + 0.5).astype(np.float32)
        kw = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
        aligned = b
        if axis is not None:
            ax = axis % a.ndim
            aligned = b.reshape(b.shape + (1,) * (a.ndim - ax - b.ndim))
        for op, fn in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide)):
            _assert_same(_ours(op, [a, b], opset=6, **kw), fn(a, aligned))
        _assert_same(_ours("Pow", [np.abs(a), b], opset=1, **kw), np.power(np.abs(a), aligned), rtol=1e-5)
        _assert_same(_ours("Greater", [a, b], T.BOOL, opset=1, **kw), a > aligned)
    m = RNG.standard_normal((2, 3)) > 0
    v = np.array([True, False, True])
    _assert_same(_ours("And", [m, v], T.BOOL, opset=1, broadcast=1, axis=1), m & v)
    with pytest.raises(Exception, match="broadcast"):
        _ours("Add", [a, np.ones((3,), np.float32)], opset=6, broadcast=0)


# ---------------------------------------------------------------------------------------------------------------
# unary math
# ---------------------------------------------------------------------------------------------------------------
UNARY = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Ceil", "Floor", "Round", "Erf", "Tanh", "Sigmoid",
         "Relu", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"]


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_unary_math(dt):
    a = _floats(dt)
    for op in UNARY:
        check(op, [a], opset=13 if op not in ("Relu",) else 14, rtol=1e-5, atol=1e-6)
    check("IsNaN", [a], T.BOOL, opset=13)
    for dn, dp in itertools.product((0, 1), (0, 1)):
        check("IsInf", [a], T.BOOL, opset=10, detect_negative=dn, detect_positive=dp)


def test_unary_float16_and_zero_d():
    a = _floats(np.float16)
    for op in ("Abs", "Neg", "Exp", "Sqrt", "Erf", "Tanh", "Sigmoid", "Relu", "Floor", "Round"):
        check(op, [a], opset=13, rtol=1e-3, atol=1e-3)
    for op in ("Abs", "Exp", "Erf", "Sigmoid", "Relu", "Softplus", "Elu", "HardSigmoid", "Celu", "Gelu", "Mish"):
        got = _ours(op, [np.array(0.5, np.float32)], opset=20)
        assert got.shape == () and got.dtype == np.float32, op


def test_erf_accuracy_float32():
    x = np.concatenate([np.linspace(-6, 6, 100001), np.geomspace(1e-30, 4, 2000), -np.geomspace(1e-30, 4, 2000)])
    x32 = x.astype(np.float32)
    got = _ours("Erf", [x32], opset=13)
    ref = special.erf(x32.astype(np.float64))
    assert got.dtype == np.float32
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-38)
    assert rel.max() < 1e-6
    assert np.abs(got).max() <= 1.0
    np.testing.assert_array_equal(_ours("Erf", [np.array([np.nan, np.inf, -np.inf], np.float32)], opset=13)[1:],
                                  [1, -1])


def test_round_half_to_even():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 2.3, -4.5, 0.9], np.float32)
    np.testing.assert_array_equal(_ours("Round", [x], opset=11), [0, 2, 2, -0, -2, 2, -4, 1])


# ---------------------------------------------------------------------------------------------------------------
# activations (large inputs exercise the block-wise paths)
# ---------------------------------------------------------------------------------------------------------------
ACTS = [("LeakyRelu", {"alpha": 0.1}, 16), ("LeakyRelu", {"alpha": 1.7}, 16), ("LeakyRelu", {"alpha": -0.3}, 16),
        ("Elu", {"alpha": 0.7}, 6), ("Selu", {}, 6), ("Celu", {"alpha": 2.0}, 12), ("HardSigmoid", {}, 6),
        ("HardSwish", {}, 14), ("ThresholdedRelu", {"alpha": 0.5}, 10), ("Shrink", {"lambd": 1.0, "bias": 0.3}, 9),
        ("Mish", {}, 18), ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20), ("Softplus", {}, 1),
        ("Softsign", {}, 1), ("Sigmoid", {}, 13), ("Tanh", {}, 13), ("Relu", {}, 14)]


@pytest.mark.parametrize("op,attrs,opset", ACTS, ids=[f"{a[0]}-{i}" for i, a in enumerate(ACTS)])
def test_activations_float32_large(op, attrs, opset):
    x = _floats(np.float32, (3, 50000), scale=4.0)
    check(op, [x], opset=opset, rtol=2e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("op,attrs,opset", ACTS[:14], ids=[f"{a[0]}-{i}" for i, a in enumerate(ACTS[:14])])
def test_activations_float16_float64(op, attrs, opset):
    check(op, [_floats(np.float16, scale=2.0)], opset=max(opset, 20 if op == "Gelu" else opset), rtol=3e-3,
          atol=2e-3, **attrs)
    if op not in ("Gelu", "Celu", "Shrink"):  # onnxruntime has no float64 kernels for these
        check(op, [_floats(np.float64, scale=2.0)], opset=opset if op != "HardSwish" else 22, rtol=1e-7, **attrs)


def test_swish_swiglu_formula():
    a = _floats(np.float32, (4, 30000), specials=False)
    b = _floats(np.float32, (4, 30000), specials=False)
    for alpha in (1.0, 1.702):
        want = a * special.expit(alpha * a.astype(np.float64))
        np.testing.assert_allclose(_ours("Swish", [a], opset=24, alpha=alpha), want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(_ours("SwiGLU", [a, b], opset=28, alpha=alpha), want * b, rtol=1e-5, atol=1e-7)
    h = a[:, :100].astype(np.float16)
    got = _ours("SwiGLU", [h, h], opset=28)
    assert got.dtype == np.float16
    with pytest.raises(Exception, match="identical shapes"):
        _ours("SwiGLU", [a, b[:, :1]], opset=28)


def test_bfloat16_activations():
    x = _floats(np.float32, specials=False).astype(ml_dtypes.bfloat16)
    xf = x.astype(np.float32)
    for op, ref in (("Sigmoid", special.expit(xf)), ("Relu", np.maximum(xf, 0)),
                    ("Gelu", 0.5 * xf * (1 + special.erf(xf / np.sqrt(2)))), ("Erf", special.erf(xf))):
        got = _ours(op, [x], opset=22)
        assert got.dtype == ml_dtypes.bfloat16, op
        np.testing.assert_allclose(got.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("opset", [6, 7, 9, 16])
def test_prelu(opset):
    x = _floats(np.float32, (2, 3, 4), specials=False)
    for slope in (np.array([0.25], np.float32), np.array([[0.1], [0.2], [0.3]], np.float32),
                  np.array([0.1, 0.2, 0.3, 0.4], np.float32)):
        want = np.where(x >= 0, x, x * slope)
        _assert_same(_ours("PRelu", [x, slope], opset=opset), want)
    if opset < 7:  # legacy: a 1-D slope of C values is per channel
        slope = np.array([0.1, 0.2, 0.3], np.float32)
        _assert_same(_ours("PRelu", [x, slope], opset=opset), np.where(x >= 0, x, x * slope[:, None]))
    xi = np.array([-3, 2, -1, 5], np.int32)
    _assert_same(_ours("PRelu", [xi, np.array([2], np.int32)], opset=16), np.array([-6, 2, -2, 5], np.int32))


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int32, np.float32])
def test_shrink_types(dt):
    x = np.array([-5, -2, -1, 0, 1, 2, 5, 100], dtype=np.float32).astype(dt)
    check("Shrink", [x], opset=9, lambd=1.5, bias=1.0)


# ---------------------------------------------------------------------------------------------------------------
# softmax family
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [1, 11, 13])
def test_softmax_family_axes(op, opset):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for axis in range(-4, 4):
        check(op, [x], opset=opset, axis=axis)
    check(op, [x], opset=opset)
    ties = np.array([[1, 3, 3, 2], [5, 5, 5, 5]], np.float32)
    check(op, [ties], opset=opset)
    check(op, [x.astype(np.float16)], opset=opset, rtol=1e-3, atol=1e-3)
    check(op, [x.astype(np.float64)], opset=opset)
    big = np.array([[1000.0, 1001.0, 1002.0], [-1e30, 0.0, 1e30]], np.float32)
    check(op, [big], opset=opset)


def test_softmax_empty_and_errors():
    for shape in ((0, 3), (3, 0)):
        got = _ours("Softmax", [np.zeros(shape, np.float32)], opset=13)
        assert got.shape == shape
    with pytest.raises(Exception, match="axis"):
        _ours("Softmax", [np.zeros((2, 3), np.float32)], opset=13, axis=2)


# ---------------------------------------------------------------------------------------------------------------
# logic, bitshift, variadic, where, clip, identity
# ---------------------------------------------------------------------------------------------------------------
def test_logic_and_strings():
    a = RNG.standard_normal((3, 4)) > 0
    b = RNG.standard_normal((4,)) > 0
    for op in ("And", "Or", "Xor"):
        check(op, [a, b], T.BOOL, opset=7)
    check("Not", [a], T.BOOL, opset=1)
    s1 = np.array(["a", "bb", "c", ""], dtype=object)
    s2 = np.array(["a", "b", "c", ""], dtype=object)
    check("Equal", [s1, s2], T.BOOL, opset=19)
    check("Equal", [s1.reshape(4, 1), np.array(["a"], dtype=object)], T.BOOL, opset=19)
    check("Where", [np.array([True, False, True, False]), s1, s2], T.STRING, opset=16)
    x = _floats(np.float32, (2, 4), specials=False)
    check("Where", [np.array([[True], [False]]), x, np.full((1, 4), 3.0, np.float32)], T.FLOAT, opset=16)


@pytest.mark.parametrize("dt", INT_TYPES)
def test_bitshift(dt):
    bits = np.dtype(dt).itemsize * 8
    info = np.iinfo(dt)
    signed = info.min < 0
    x = np.array([1, 5, info.max, info.min, 0, -3 if signed else 7, -128 if signed else 200], dtype=object).astype(dt)
    y = np.array([0, 1, bits - 1, bits, bits + 3, -1 if signed else 2, 3], dtype=object).astype(dt)
    # opset-28 semantics: shifts < 0 or >= width give the sign-fill alone (-1 for a right shift of a negative x)
    xi = [int(v) for v in x]
    yi = [int(v) for v in y]
    left, right = [], []
    for a, s in zip(xi, yi):
        ok = 0 <= s < bits
        left.append((a << s) if ok else 0)
        right.append((a >> s) if ok else (-1 if a < 0 else 0))
    mask = (1 << bits) - 1

    def wrap(v):
        v &= mask
        return v - (1 << bits) if signed and v >> (bits - 1) else v

    _assert_same(_ours("BitShift", [x, y], opset=28, direction="LEFT"), np.array([wrap(v) for v in left]).astype(dt))
    _assert_same(_ours("BitShift", [x, y], opset=28, direction="RIGHT"),
                 np.array([wrap(v) for v in right]).astype(dt))
    if not signed:
        ok = np.array(yi) < bits
        check("BitShift", [x[ok], y[ok]], opset=11, direction="LEFT")
        check("BitShift", [x[ok], y[ok]], opset=11, direction="RIGHT")
    with pytest.raises(Exception, match="direction"):
        _ours("BitShift", [x, y], opset=11, direction="UP")


def test_variadic():
    a = np.ones((2, 1), np.float32)
    b = np.full((3,), 2.0, np.float32)
    c = np.zeros((1, 1, 1), np.float32)
    for op in ("Max", "Min", "Sum", "Mean"):
        check(op, [a, b, c], opset=13)
        check(op, [b], opset=13)
        check(op, [a, b], opset=8)
    h = _floats(np.float16, specials=False)
    check("Mean", [h, h * 2, h], opset=13, rtol=1e-3)
    nan = np.array([np.nan, 1.0], np.float32)
    check("Max", [nan, np.array([0.0, np.nan], np.float32)], opset=13)


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.float32])
def test_clip(dt):
    x = (RNG.standard_normal(50) * 50).astype(np.float32)
    if np.dtype(dt).kind == "u":
        x = np.abs(x)
    x = x.astype(dt)
    lo, hi = np.array(5 if np.dtype(dt).kind == "u" else -5, dt), np.array(20, dt)
    check("Clip", [x, lo, hi], opset=13)
    check("Clip", [x, None, hi], opset=13)
    check("Clip", [x, lo], opset=13)
    check("Clip", [x], opset=13)
    check("Clip", [x, np.array(30, dt), hi], opset=13)  # min > max: everything becomes max
    if dt in (np.float16, np.float32):
        xf = x.astype(dt)
        _assert_same(_ours("Clip", [xf], opset=6, min=-1.0, max=1.5), np.clip(xf, -1.0, 1.5).astype(dt))
        _assert_same(_ours("Clip", [xf], opset=6, max=1.5), np.minimum(xf, dt(1.5)))
        _assert_same(_ours("Clip", [xf], opset=6), xf)


def test_identity_sequence_and_optional():
    from onnxpy.ops.elementwise import identity

    seq = [np.ones(2), np.zeros(3)]
    assert identity(seq) is seq
    assert identity(None) is None
    check("Identity", [np.array(["x", "y"], dtype=object)], opset=16)


# ---------------------------------------------------------------------------------------------------------------
# Cast / CastLike / BitCast
# ---------------------------------------------------------------------------------------------------------------
_CAST_TYPES = {T.BOOL: np.bool_, T.INT8: np.int8, T.INT16: np.int16, T.INT32: np.int32, T.INT64: np.int64,
               T.UINT8: np.uint8, T.UINT16: np.uint16, T.UINT32: np.uint32, T.UINT64: np.uint64,
               T.FLOAT16: np.float16, T.FLOAT: np.float32, T.DOUBLE: np.float64}


def _cast_source(src, dst):
    vals = np.array([0, 1, 2.5, -2.5, 7.9, -7.9, 100, 127, -128, 0.49, 300, -300, 65535, 1e5])
    sdt = _CAST_TYPES[src]
    if sdt is np.bool_:
        x = vals.astype(bool)
    elif np.dtype(sdt).kind in "iu":
        info = np.iinfo(sdt)
        x = np.array([int(t) for t in vals if info.min <= int(t) <= info.max], dtype=sdt)
    else:
        x = vals.astype(sdt)
    if dst in _CAST_TYPES and dst != T.BOOL and np.dtype(_CAST_TYPES[dst]).kind in "iu" and x.dtype.kind == "f":
        info = np.iinfo(_CAST_TYPES[dst])  # float -> out-of-range integer is undefined
        x = x[(x > info.min - 1) & (x < info.max + 1)]
    return x


@pytest.mark.parametrize("src", list(_CAST_TYPES))
def test_cast_numeric_and_to_string(src):
    for dst in list(_CAST_TYPES) + [T.STRING]:
        x = _cast_source(src, dst)
        check("Cast", [x], dst, opset=13, to=dst)
        check("Cast", [x], dst, opset=21, to=dst)
    x = _cast_source(src, T.FLOAT)
    check("CastLike", [x, np.zeros(1, np.float32)], T.FLOAT, opset=15)


def test_cast_special_floats_to_string():
    x = np.array([0.1, 1 / 3, 1e20, -1e-8, np.nan, np.inf, -np.inf, 100.0, -0.0, 1234567.0], np.float32)
    for dt in (np.float16, np.float32, np.float64):
        check("Cast", [x.astype(dt)], T.STRING, opset=19, to=T.STRING)


@pytest.mark.parametrize("dst", list(_CAST_TYPES))
def test_cast_from_string(dst):
    if np.dtype(_CAST_TYPES[dst]).kind == "f":
        s = ["0", "1.5", "-2.25", "1e-3", "INF", "-inf", "NaN", "  3.5", "0x1p3", "12abc", "+INF", "1E8"]
    else:
        s = ["0", "1", "-2", "7", "100", "3.7", "1e2", " 42"]
    check("Cast", [np.array(s, dtype=object)], dst, opset=19, to=dst)
    with pytest.raises(Exception, match="cannot convert"):
        _ours("Cast", [np.array(["abc"], dtype=object)], dst, opset=19, to=dst)


def test_cast_opset1_string_type_name():
    got = _ours("Cast", [np.array([1.7, -2.2], np.float32)], T.INT32, opset=1, to="INT32")
    _assert_same(got, np.array([1, -2], np.int32))


def _cast_chain(x, mid, opset=21, **attrs):
    """x -> Cast(mid) -> Cast(float): lets onnxruntime's python API compare types numpy cannot hold."""
    n1 = helper.make_node("Cast", ["x"], ["m"], to=mid, **attrs)
    n2 = helper.make_node("Cast", ["m"], ["y"], to=T.FLOAT)
    g = helper.make_graph([n1, n2], "g", [helper.make_tensor_value_info("x", _elem_type(x), x.shape)],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    mb = m.SerializeToString()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ort.InferenceSession(mb, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = onnxpy.InferenceSession(mb).run(None, {"x": x})[0]
    return got, want


@pytest.mark.parametrize("mid", [T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ])
def test_cast_float8_saturate(mid):
    f = np.array([0.3, -0.7, 1.5, 3.25, -448, 500, 1e6, -1e6, np.inf, -np.inf, np.nan, 1e-9, 57344, 60000, -0.0,
                  0.0019, 240, 250], np.float32)
    for sat in (0, 1):
        for x in (f, f.astype(np.float16), f.astype(np.float64)):
            got, want = _cast_chain(x, mid, saturate=sat)
            np.testing.assert_array_equal(got, want)
    got, want = _cast_chain(np.array([0, 1, -3, 100, 1000, -100000], np.int32), mid, saturate=1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mid", [T.INT4, T.UINT4])
def test_cast_int4_in_range_rounding(mid):
    lo, hi = (-8, 7) if mid == T.INT4 else (0, 15)
    x = np.array([0.2, 0.26, 1.3, 2.6, 5.2, 7, 0.25, 0.75, 2.5, -0.1, -2.5, -3.1], np.float32)
    x = x[(x >= lo - 0.5) & (x <= hi + 0.4)]
    got, want = _cast_chain(x, mid)
    np.testing.assert_array_equal(got, want)
    got, want = _cast_chain(np.arange(-20, 20).astype(np.int32), mid)  # integers wrap
    np.testing.assert_array_equal(got, want)


def test_cast_e8m0_round_modes():
    x = np.array([0.0, 0.124, 0.25, 0.5, 1.1, 2.0, 4.0, 8.0, 3.0, 0.75, 1e-39, 3e38, np.inf, np.nan], np.float32)
    for rm in ("up", "down", "nearest"):
        for sat in (0, 1):
            got, want = _cast_chain(x, T.FLOAT8E8M0, opset=25, saturate=sat, round_mode=rm)
            np.testing.assert_array_equal(got, want)


def test_bitcast():
    x = np.array([1.0, -2.5, np.inf], np.float32)
    _assert_same(_ours("BitCast", [x], T.INT32, opset=26, to=T.INT32), x.view(np.int32))
    _assert_same(_ours("BitCast", [x.view(np.int32)], T.FLOAT, opset=26, to=T.FLOAT), x)
    _assert_same(_ours("BitCast", [np.array([True, False])], T.UINT8, opset=26, to=T.UINT8), np.array([1, 0], np.uint8))
    _assert_same(_ours("BitCast", [np.array(3.5, np.float64)], T.UINT64, opset=26, to=T.UINT64),
                 np.array(3.5).view(np.uint64))
    from onnxpy.ops.cast import bitcast

    i4 = np.array([-8, -1, 0, 7], ml_dtypes.int4)
    u4 = bitcast(i4, to=T.UINT4)
    assert u4.dtype == ml_dtypes.uint4
    np.testing.assert_array_equal(u4.astype(np.int32), [8, 15, 0, 7])
    with pytest.raises(Exception, match="bit width"):
        _ours("BitCast", [x], T.INT64, opset=26, to=T.INT64)


def test_onnx_schema_versions_registered():
    """Every opset version of the family's ops resolves to a kernel."""
    from onnxpy.ops import load_all, registry

    load_all()
    ops = ["Abs", "Add", "Cast", "CastLike", "Clip", "Softmax", "Hardmax", "Identity", "Pow", "Mod", "Equal", "Max",
           "Relu", "Gelu", "Elu", "Sigmoid", "Where", "Round", "IsInf", "BitShift", "BitCast", "SwiGLU", "Swish"]
    schemas = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "" and s.name in ops:
            schemas.setdefault(s.name, []).append(s.since_version)
    for op, versions in schemas.items():
        for v in versions:
            info = registry.lookup("", op, v)
            assert info is not None, (op, v)
            assert info.since == v, (op, v, info.since)
