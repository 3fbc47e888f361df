"""Tensor / shape / indexing kernels against onnxruntime (single-node models) and numpy formulas."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy
import _oracle as oracle
from _oracle import Init, infer_output_types, single_node

ort = pytest.importorskip("onnxruntime")

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min
RNG = np.random.default_rng(0)


def _model(op, inputs, n_out, opset, attrs, domain=""):
    m, feeds = single_node(op, inputs, n_out, opsets=[(domain, opset)], domain=domain,
                           ir_version=10 if opset < 23 else 11, **attrs)
    return infer_output_types(m).SerializeToString(), feeds


def run_ours(op, inputs, n_out=1, opset=21, **attrs):
    return oracle.run_onnxpy(*_model(op, inputs, n_out, opset, attrs))


def run_ort(op, inputs, n_out=1, opset=21, **attrs):
    return oracle.run_ort(*_model(op, inputs, n_out, opset, attrs), quiet=True)


def assert_same(got, exp):
    assert len(got) == len(exp)
    for g, e in zip(got, exp):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape, (g.shape, e.shape)
        if e.dtype.kind in "OUS":
            assert g.dtype == object
            assert g.tolist() == e.astype(object).tolist()
            continue
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        if e.dtype.kind in "fc" or e.dtype.type.__module__.startswith("ml_dtypes"):
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(g, e)


def check(op, inputs, n_out=1, opset=21, **attrs):
    """onnxpy must match onnxruntime (or both must fail)."""
    try:
        exp = run_ort(op, inputs, n_out, opset, **attrs)
    except Exception as e:  # noqa: BLE001
        if "NOT_IMPLEMENTED" in str(e):  # onnxruntime lacks this type combination: just run ours
            return run_ours(op, inputs, n_out, opset, **attrs)
        try:
            got = run_ours(op, inputs, n_out, opset, **attrs)
        except Exception:  # noqa: BLE001
            return str(e)
        pytest.fail(f"onnxruntime failed ({e}) but onnxpy returned {got}")
    got = run_ours(op, inputs, n_out, opset, **attrs)
    assert_same(got, exp)
    return got


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*v):
    return np.array(v, dtype=np.int64)


# ------------------------------------------------------------------------------------------------------------
# Reshape / Transpose / Squeeze / Unsqueeze / Flatten


@pytest.mark.parametrize(
    "shape_in,new,allowzero",
    [
        ((2, 3, 4), [4, -1], 0),
        ((2, 3, 4), [0, -1], 0),
        ((2, 3, 4), [0, 0, 2, 2], 0),
        ((2, 3, 4), [], None),
        ((0, 3), [3, 0], 1),
        ((0, 3), [0, -1], 0),
        ((2, 3), [-1], 0),
        ((1,), [], 0),
        ((2, 3, 4), [5, -1], 0),
        ((2, 3, 4), [-1, -1], 0),
        ((2, 3, 4), [0, -1], 1),
    ],
)
def test_reshape(shape_in, new, allowzero):
    x = np.arange(int(np.prod(shape_in)), dtype=np.float32).reshape(shape_in)
    if new == []:
        x = np.full([1] * len(shape_in), 7.0, dtype=np.float32)
    attrs = {} if allowzero is None else {"allowzero": allowzero}
    check("Reshape", [x, i64(*new)], opset=21, **attrs)


def test_reshape_opset1_and_5():
    x = f32(2, 3, 4)
    assert run_ours("Reshape", [x], opset=1, shape=[0, -1])[0].shape == (2, 12)
    check("Reshape", [x, i64(6, 4)], opset=5)


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1], [1, 0, 2]])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": perm}
    check("Transpose", [f32(2, 3, 4)], **attrs)


def test_transpose_bad_perm():
    with pytest.raises(Exception, match="perm"):
        run_ours("Transpose", [f32(2, 3)], perm=[0, 0])


@pytest.mark.parametrize("axes", [None, [0], [-1], [0, 2]])
def test_squeeze(axes):
    x = f32(1, 3, 1)
    check("Squeeze", [x] + ([] if axes is None else [i64(*axes)]), opset=13)
    if axes is not None:
        check("Squeeze", [x], opset=11, axes=axes)


def test_squeeze_not_one():
    with pytest.raises(Exception, match="not 1"):
        run_ours("Squeeze", [f32(2, 3), i64(0)], opset=13)


@pytest.mark.parametrize("axes", [[0], [-1], [0, 3], [3, 0], [1, -1]])
def test_unsqueeze(axes):
    check("Unsqueeze", [f32(2, 3), i64(*axes)], opset=13)
    check("Unsqueeze", [f32(2, 3)], opset=11, axes=axes)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check("Flatten", [f32(2, 3, 4)], axis=axis)
    check("Flatten", [np.zeros((0, 3, 2), np.float32)], axis=axis)


# ------------------------------------------------------------------------------------------------------------
# Concat / Split


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    a, b = f32(2, 3), f32(2, 3)
    check("Concat", [a, b, a], axis=axis)


def test_concat_empty_and_strings():
    check("Concat", [np.zeros((0, 3), np.int64), np.ones((2, 3), np.int64)], axis=0)
    check("Concat", [np.array(["a", "b"], dtype=object), np.array(["c"], dtype=object)], axis=0)


def test_concat_mismatch():
    with pytest.raises(Exception, match="Concat"):
        run_ours("Concat", [f32(2, 3), f32(3, 3)], axis=1)


@pytest.mark.parametrize("opset", [13, 18])
def test_split_inputs(opset):
    x = f32(6, 4)
    check("Split", [x, i64(1, 2, 3)], 3, opset=opset)
    check("Split", [x, i64(0, 6)], 2, opset=opset)
    check("Split", [x, i64(2, 2)], 2, opset=opset, axis=-1)
    if opset == 13:
        check("Split", [x], 3, opset=opset)
        check("Split", [x], 4, opset=opset)  # not divisible -> error in both


def test_split_old_attrs():
    x = f32(6, 4)
    check("Split", [x], 3, opset=11, split=[1, 2, 3])
    check("Split", [x], 2, opset=11, axis=1)
    got = run_ours("Split", [x], 2, opset=1, split=[2, 4], axis=0)
    assert [g.shape for g in got] == [(2, 4), (4, 4)]


@pytest.mark.parametrize("n,dim", [(3, 7), (4, 8), (2, 1), (3, 5), (4, 5)])
def test_split_num_outputs(n, dim):
    check("Split", [f32(2, dim)], n, opset=18, axis=1, num_outputs=n)


# ------------------------------------------------------------------------------------------------------------
# Slice


@pytest.mark.parametrize(
    "starts,ends,axes,steps",
    [
        ([0, 1], [2, 3], None, None),
        ([1], [INT64_MAX], [1], None),
        ([-1], [INT64_MIN], [0], [-1]),
        ([INT64_MAX], [INT64_MIN], [1], [-2]),
        ([-100], [100], [-1], [3]),
        ([5], [1], [0], [1]),
        ([2, 0], [-1, 4], [-1, 0], [-1, 2]),
        ([-10], [-20], [0], [-1]),
        ([3], [-100], [1], [-1]),
        ([0], [1], [0], [0]),
        ([0, 0], [1, 1], [1, 1], None),
    ],
)
def test_slice(starts, ends, axes, steps):
    x = f32(5, 6, 3)
    ins = [x, i64(*starts), i64(*ends)]
    if axes is not None or steps is not None:
        ins.append(i64(*axes) if axes is not None else None)
    if steps is not None:
        ins.append(i64(*steps))
    check("Slice", ins, opset=13)


def test_slice_int32_indices_and_opset1():
    x = f32(4, 5)
    check("Slice", [x, np.array([1], np.int32), np.array([-1], np.int32), np.array([1], np.int32)], opset=13)
    check("Slice", [x], opset=1, starts=[1, -3], ends=[1000, -1])
    check("Slice", [x], opset=1, starts=[1], ends=[3], axes=[1])


def test_slice_empty_dim_negative_step():
    check("Slice", [np.zeros((0, 3), np.float32), i64(-1), i64(INT64_MIN), i64(0), i64(-1)], opset=13)


# ------------------------------------------------------------------------------------------------------------
# Gather family


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(axis):
    x = f32(4, 5, 3)
    check("Gather", [x, np.array([[0, -1], [2, 1]], np.int64)], axis=axis)
    check("Gather", [x, np.array(-2, np.int32)], axis=axis)
    check("Gather", [x, np.zeros((0,), np.int64)], axis=axis)


def test_gather_out_of_range():
    with pytest.raises(Exception, match="out of range"):
        run_ours("Gather", [f32(3, 2), i64(3)])


def test_gather_strings():
    check("Gather", [np.array(["a", "b", "c"], dtype=object), i64(2, 0, -1)])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    x = f32(3, 4)
    idx = RNG.integers(-3, 3, size=(2, 3)).astype(np.int64)
    check("GatherElements", [x, idx], axis=axis)


@pytest.mark.parametrize(
    "dshape,ishape,bd",
    [((2, 3, 4), (5, 1), 0), ((2, 3, 4), (5, 2), 0), ((2, 3, 4), (5, 3), 0),
     ((2, 3, 4), (2, 1), 1), ((2, 3, 4), (2, 5, 2), 1), ((2, 3, 4, 5), (2, 3, 1), 2), ((2, 3), (4, 2, 2), 0)],
)
def test_gather_nd(dshape, ishape, bd):
    x = f32(*dshape)
    k = ishape[-1]
    hi = np.array(dshape[bd:bd + k])
    idx = (RNG.integers(0, 1 << 20, size=ishape) % hi) - (RNG.integers(0, 2, size=ishape) * hi)
    check("GatherND", [x, idx.astype(np.int64)], opset=13, batch_dims=bd)


# ------------------------------------------------------------------------------------------------------------
# Scatter family


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(reduction, axis):
    x = f32(4, 5)
    ax = axis % 2
    if reduction == "none":  # unique indices along the axis
        idx = np.stack([RNG.permutation(x.shape[ax])[:3] for _ in range(3)], axis=1 - ax).astype(np.int64)
        if ax == 1:
            idx = idx.T.copy().T
    else:
        idx = RNG.integers(-x.shape[ax], x.shape[ax], size=(3, 3)).astype(np.int64)
    upd = f32(*idx.shape)
    check("ScatterElements", [x, idx, upd], opset=18, axis=axis, reduction=reduction)


def test_scatter_deprecated_and_old():
    x = np.zeros((3, 3), np.float32)
    idx = np.array([[1, 0, 2], [0, 2, 1]], np.int64)
    upd = f32(2, 3)
    check("Scatter", [x, idx, upd], opset=9)
    check("ScatterElements", [x, idx, upd], opset=11)
    check("ScatterElements", [x, idx, upd], opset=16, reduction="add")


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    x = f32(4, 3, 2)
    if reduction == "none":
        idx = np.array([[[0], [2]], [[-1], [1]]], np.int64)
    else:
        idx = np.array([[[0], [2]], [[-2], [2]]], np.int64)
    upd = f32(2, 2, 3, 2)
    check("ScatterND", [x, idx, upd], opset=18, reduction=reduction)
    idx2 = np.array([[0, 1, 1], [3, 2, 0], [0, 1, 1]], np.int64)
    if reduction == "none":
        idx2 = idx2[:2]
    check("ScatterND", [x, idx2, f32(idx2.shape[0])], opset=18, reduction=reduction)


def test_scatter_nd_int_and_does_not_mutate():
    x = np.arange(8, dtype=np.int32)
    keep = x.copy()
    check("ScatterND", [Init(x), i64(4, 3, 1, 7).reshape(4, 1), np.array([9, 10, 11, 12], np.int32)], opset=16)
    np.testing.assert_array_equal(x, keep)


def _tensor_scatter_ref(past, upd, wi, axis, circular):
    out = past.copy()
    ax = axis % past.ndim
    L, S = past.shape[ax], upd.shape[ax]
    for prefix in np.ndindex(past.shape[:ax]):
        for s in range(S):
            p = wi[prefix[0]] + s
            if circular:
                p %= L
            out[prefix + (p,)] = upd[prefix + (s,)]
    return out


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1, 2])
def test_tensor_scatter(mode, axis):
    past = f32(3, 4, 6, 5)
    ushape = list(past.shape)
    ushape[axis] = 2
    upd = f32(*ushape)
    L = past.shape[axis]
    wi = np.array([0, L - 2, 1], np.int64) if mode == "linear" else np.array([L - 1, 3, 0], np.int64)
    got = run_ours("TensorScatter", [past, upd, wi], opset=24, mode=mode, axis=axis)[0]
    np.testing.assert_array_equal(got, _tensor_scatter_ref(past, upd, wi, axis, mode == "circular"))
    got = run_ours("TensorScatter", [past, upd], opset=24, mode=mode, axis=axis)[0]
    np.testing.assert_array_equal(got, _tensor_scatter_ref(past, upd, [0, 0, 0], axis, False))


def test_tensor_scatter_overflow():
    with pytest.raises(Exception, match="cache length"):
        run_ours("TensorScatter", [f32(2, 4, 3), f32(2, 2, 3), i64(3, 0)], opset=24)


# ------------------------------------------------------------------------------------------------------------
# Pad / CenterCropPad


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [[1, 2, 0, 1], [0, 0, 0, 0], [2, -1, -1, 2], [0, 3, 0, 3], [-1, 0, 0, 0]])
def test_pad(mode, pads):
    x = f32(3, 4)
    check("Pad", [x, i64(*pads), np.array(1.5, np.float32)], opset=19, mode=mode)


def test_pad_axes_and_types():
    x = f32(2, 3, 4)
    check("Pad", [x, i64(1, 2, 0, 1), None, i64(0, -1)], opset=18)
    check("Pad", [np.arange(6, dtype=np.int32).reshape(2, 3), i64(1, 1, 1, 1), np.array(7, np.int32)], opset=18)
    check("Pad", [np.array([[True, False]]), i64(0, 1, 0, 1)], opset=18)
    got = check("Pad", [np.array(["a", "b"], dtype=object), i64(1, 1)], opset=18)
    assert got[0].tolist() == ["", "a", "b", ""]


def test_pad_old_opsets():
    x = f32(2, 3)
    check("Pad", [x], opset=2, pads=[0, 1, 1, 0], value=2.0)
    check("Pad", [x], opset=2, pads=[0, 1, 1, 0], mode="edge")
    check("Pad", [x, i64(0, 1, 1, 0)], opset=11, mode="reflect")
    got = run_ours("Pad", [x], opset=1, paddings=[1, 0, 0, 1], value=3.0)[0]
    np.testing.assert_array_equal(got, np.pad(x, [(1, 0), (0, 1)], constant_values=3.0))


def test_pad_reflect_too_large():
    check("Pad", [f32(3), i64(3, 0)], opset=18, mode="reflect")


@pytest.mark.parametrize("shape,axes", [([2, 5], None), ([7, 2], None), ([3], [1]), ([6, 1], [-1, 0])])
def test_center_crop_pad(shape, axes):
    x = f32(4, 3)
    attrs = {} if axes is None else {"axes": axes}
    got = run_ours("CenterCropPad", [x, i64(*shape)], opset=18, **attrs)[0]
    ax = list(range(2)) if axes is None else [a % 2 for a in axes]
    exp_shape = list(x.shape)
    for a, s in zip(ax, shape):
        exp_shape[a] = s
    assert list(got.shape) == exp_shape
    # independent check: element (i, j) of the output comes from input (i - off0, j - off1)
    offs = [(t - d) // 2 if t >= d else -((d - t) // 2) for d, t in zip(x.shape, exp_shape)]
    exp = np.zeros(exp_shape, np.float32)
    for i in range(exp_shape[0]):
        for j in range(exp_shape[1]):
            si, sj = i - offs[0], j - offs[1]
            if 0 <= si < x.shape[0] and 0 <= sj < x.shape[1]:
                exp[i, j] = x[si, sj]
    np.testing.assert_array_equal(got, exp)


# ------------------------------------------------------------------------------------------------------------
# Tile / Expand


def test_tile():
    x = f32(2, 3)
    check("Tile", [x, i64(2, 3)])
    check("Tile", [x, i64(1, 1)])
    check("Tile", [x, i64(0, 2)])
    got = run_ours("Tile", [x, np.array(3, np.int64), np.array(1, np.int64)], opset=1)[0]
    np.testing.assert_array_equal(got, np.tile(x, (1, 3)))


def test_tile_limits():
    with pytest.raises(Exception, match="negative"):
        run_ours("Tile", [f32(2, 3), i64(-1, 2)])
    with pytest.raises(Exception, match="more than the limit of"):
        run_ours("Tile", [f32(2, 3), i64(1 << 20, 1 << 20)])


@pytest.mark.parametrize("shape", [[3, 1], [2, 3, 4], [1], [4, 1, 1], [3, 4], [0, 4], [2, 2]])
def test_expand(shape):
    check("Expand", [f32(3, 1), i64(*shape)], opset=13)


def test_expand_limits():
    with pytest.raises(Exception, match="more than the limit of"):
        run_ours("Expand", [f32(1), i64(1 << 40)], opset=13)
    with pytest.raises(Exception, match="negative"):
        run_ours("Reshape", [f32(2), i64(-2)], opset=14)
    with pytest.raises(Exception, match="more than the limit of"):
        run_ours("ConstantOfShape", [i64(1 << 20, 1 << 20)], opset=20)


# ------------------------------------------------------------------------------------------------------------
# Shape / Size / ConstantOfShape / Constant / Range


@pytest.mark.parametrize("start,end", [(None, None), (1, None), (-1, None), (None, -1), (1, 2), (2, 1), (-10, 10)])
def test_shape(start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    check("Shape", [f32(2, 3, 4)], opset=15, **attrs)


def test_size_and_shape_scalar():
    check("Size", [f32(2, 3, 4)])
    check("Size", [np.zeros((0, 3), np.float32)])
    check("Shape", [np.array(1.0, np.float32)])


def test_constant_of_shape():
    check("ConstantOfShape", [i64(2, 3)], opset=20)
    check("ConstantOfShape", [i64()], opset=20, value=numpy_helper.from_array(np.array([5], np.int32)))
    check("ConstantOfShape", [i64(0, 3)], opset=20, value=numpy_helper.from_array(np.array([True])))


def _const_model(**attrs):
    node = helper.make_node("Constant", [], ["y"], **attrs)
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", 0, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return onnxpy.InferenceSession(m.SerializeToString()).run(None, {})[0]


def test_constant_variants():
    assert _const_model(value_float=1.5).dtype == np.float32
    np.testing.assert_array_equal(_const_model(value_floats=[1.0, 2.0]), np.array([1, 2], np.float32))
    y = _const_model(value_int=3)
    assert y.dtype == np.int64 and y.shape == ()
    assert _const_model(value_ints=[1, 2, 3]).tolist() == [1, 2, 3]
    y = _const_model(value_string="hi")
    assert y.shape == () and y.dtype == object and y[()] == "hi"
    assert _const_model(value_strings=["a", "b"]).tolist() == ["a", "b"]
    t = numpy_helper.from_array(np.array([[1, 2]], np.int16))
    np.testing.assert_array_equal(_const_model(value=t), np.array([[1, 2]], np.int16))
    sp = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0, 6.0], np.float32), "v"),
        numpy_helper.from_array(np.array([1, 4], np.int64), "i"), [2, 3])
    np.testing.assert_array_equal(_const_model(sparse_value=sp), np.array([[0, 5, 0], [0, 6, 0]], np.float32))


@pytest.mark.parametrize(
    "start,limit,delta,dtype",
    [(0, 10, 3, np.int64), (10, 4, -2, np.int32), (1, 1, 1, np.int16), (0.5, 3.2, 0.7, np.float32),
     (5.0, -1.0, -1.5, np.float64), (3, 9, -1, np.int64), (2.0, 2.5, 1.0, np.float32)],
)
def test_range(start, limit, delta, dtype):
    ins = [np.array(v, dtype=dtype) for v in (start, limit, delta)]
    check("Range", ins, opset=11)


def test_range_half_types():
    for dt in (np.float16, ml_dtypes.bfloat16):
        ins = [np.array(v, dtype=dt) for v in (1.0, 9.0, 0.5)]
        got = run_ours("Range", ins, opset=27)[0]
        assert got.dtype == dt
        np.testing.assert_array_equal(got.astype(np.float32), np.arange(1, 9, 0.5, dtype=np.float32))
    with pytest.raises(Exception, match="delta"):
        run_ours("Range", [i64(1), i64(3), i64(0)][:3], opset=11)


# ------------------------------------------------------------------------------------------------------------
# OneHot / NonZero / Unique / Compress


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_onehot(axis):
    idx = np.array([[1, -1, 9], [2, 11, -12]], np.int64)
    check("OneHot", [idx, np.array(10, np.int64), np.array([2, 5], np.float32)], opset=11, axis=axis)
    got = check("OneHot", [idx.astype(np.float32), np.array([10.0], np.float32), np.array([0, 1], np.int32)],
                opset=11, axis=axis)[0]
    exp = run_ort("OneHot", [idx, np.array(10, np.int64), np.array([0, 1], np.int64)], opset=11, axis=axis)[0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("x", [np.array([[1, 0, 3], [0, 0, 2]], np.float32), np.zeros((2, 2), np.int32),
                               np.array([True, False, True]), np.array(2.0, np.float32), np.zeros((0, 3), np.float32)])
def test_nonzero(x):
    check("NonZero", [x], opset=13)


@pytest.mark.parametrize("sorted_", [0, 1])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_unique(sorted_, axis):
    x = RNG.integers(0, 3, size=(6, 4)).astype(np.float32)
    x[2] = x[0]
    x[:, 3] = x[:, 1]
    attrs = {"sorted": sorted_}
    if axis is not None:
        attrs["axis"] = axis
    check("Unique", [x], 4, opset=11, **attrs)


def test_unique_strings_and_empty():
    got = run_ours("Unique", [np.array(["b", "a", "b", "c"], dtype=object)], 4, opset=11, sorted=0)
    assert got[0].tolist() == ["b", "a", "c"]
    assert got[1].tolist() == [0, 1, 3] and got[2].tolist() == [0, 1, 0, 2] and got[3].tolist() == [2, 1, 1]
    check("Unique", [np.zeros((0,), np.int64)], 4, opset=11)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress(axis):
    x = f32(3, 4)
    attrs = {} if axis is None else {"axis": axis}
    check("Compress", [x, np.array([True, False, True])], **attrs)
    check("Compress", [x, np.array([False, False])], **attrs)


# ------------------------------------------------------------------------------------------------------------
# DepthToSpace / SpaceToDepth / Trilu / EyeLike / ReverseSequence


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_space(mode):
    x = f32(2, 8, 3, 5)
    check("DepthToSpace", [x], opset=13, blocksize=2, mode=mode)
    y = run_ours("DepthToSpace", [x], opset=13, blocksize=2, mode=mode)[0]
    back = run_ours("SpaceToDepth", [y], opset=28, blocksize=2, mode=mode)[0]
    np.testing.assert_array_equal(back, x)
    check("SpaceToDepth", [f32(2, 3, 4, 6)], opset=13, blocksize=2)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -1, 5, -5])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 5, 3)])
def test_trilu(upper, k, shape):
    ins = [f32(*shape)] + ([] if k is None else [np.array(k, np.int64)])
    check("Trilu", ins, opset=14, upper=upper)


@pytest.mark.parametrize("k", [0, 1, -2, 7])
def test_eyelike(k):
    check("EyeLike", [f32(3, 5)], opset=9, k=k)
    check("EyeLike", [np.zeros((4, 2), np.int32)], opset=9, k=k, dtype=TensorProto.DOUBLE)


@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
def test_reverse_sequence(time_axis, batch_axis):
    x = f32(4, 5, 2) if time_axis == 0 else f32(5, 4, 2)
    lens = np.array([4, 0, 1, 3, 2], np.int64)
    check("ReverseSequence", [x, lens], opset=10, time_axis=time_axis, batch_axis=batch_axis)


def test_views_do_not_alias_constants():
    # Reshape of a constant followed by another op must not corrupt the initializer between runs
    x = np.arange(6, dtype=np.float32)
    b, feeds = _model("Reshape", [Init(x), i64(2, 3)], 1, 14, {})
    s = onnxpy.InferenceSession(b)
    r1 = s.run(None, feeds)[0].copy()
    r2 = s.run(None, feeds)[0]
    np.testing.assert_array_equal(r1, r2)


# ------------------------------------------------------------------------------------------------------------
# dtype coverage


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint16, np.int32, np.bool_, ml_dtypes.bfloat16])
def test_layout_ops_dtypes(dtype):
    x = (RNG.standard_normal((2, 3, 4)) * 3).astype(dtype)
    for op, ins, n, kw in [
        ("Transpose", [x], 1, {"perm": [2, 0, 1]}),
        ("Concat", [x, x], 1, {"axis": 1}),
        ("Split", [x, i64(1, 3)], 2, {"axis": -1}),
        ("Slice", [x, i64(-1), i64(INT64_MIN), i64(1), i64(-2)], 1, {}),
        ("Gather", [x, i64(1, 0, -1)], 1, {"axis": 2}),
        ("GatherElements", [x, np.zeros((2, 2, 4), np.int64)], 1, {"axis": 1}),
        ("GatherND", [x, i64(1, 2).reshape(1, 2)], 1, {}),
        ("ScatterND", [x, i64(1, 2).reshape(1, 2), x[:1, 0]], 1, {}),
        ("Pad", [x, i64(0, 1, 0, 1, 0, 2), None, None], 1, {"mode": "edge"}),
        ("Pad", [x, i64(1, 0, 2, 0, 1, 0)], 1, {}),
        ("Tile", [x, i64(1, 2, 1)], 1, {}),
        ("Expand", [x, i64(2, 2, 3, 4)], 1, {}),
        ("Trilu", [x], 1, {}),
        ("Compress", [x, np.array([True, False, True])], 1, {"axis": 1}),
        ("DepthToSpace", [x.reshape(1, 4, 2, 3)], 1, {"blocksize": 2}),
        ("ReverseSequence", [x, i64(2, 1, 0)], 1, {"batch_axis": 1, "time_axis": 0}),
        ("Unique", [x], 4, {}),
        ("NonZero", [x], 1, {}),
    ]:
        if dtype is ml_dtypes.bfloat16:  # onnxruntime's Python API cannot feed bfloat16: compare via float32
            as32 = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype == dtype else a for a in ins]
            exp = run_ort(op, as32, n, opset=22, **kw)
            exp = [e.astype(dtype) if e.dtype == np.float32 else e for e in exp]
            assert_same(run_ours(op, ins, n, opset=22, **kw), exp)
        else:
            check(op, ins, n, opset=22, **kw)


def test_split_opset1_input():
    x = f32(6, 4)
    got = run_ours("Split", [x, np.array([2.0, 4.0], np.float32)], 2, opset=1)
    assert [g.shape for g in got] == [(2, 4), (4, 4)]


def test_larger_inputs():
    x = f32(16, 64, 48)
    check("GatherND", [x, RNG.integers(-16, 16, size=(500, 1)).astype(np.int64)], opset=13)
    check("GatherND", [x, np.stack([RNG.integers(0, 64, size=(16, 300))], -1).astype(np.int64)], opset=13,
          batch_dims=1)
    check("ScatterND", [x, RNG.integers(0, 64, size=(300, 2)).astype(np.int64) % [16, 64], f32(300, 48)],
          opset=18, reduction="add")
    check("ScatterElements", [x, RNG.integers(0, 48, size=(16, 64, 100)).astype(np.int64), f32(16, 64, 100)],
          opset=18, axis=2, reduction="max")
    check("Unique", [RNG.integers(0, 50, size=(4000,)).astype(np.int32)], 4, opset=11, sorted=0)
    check("Unique", [RNG.integers(0, 2, size=(300, 4)).astype(np.int64)], 4, opset=11, axis=0)
    check("Gather", [f32(1000, 64), RNG.integers(-1000, 1000, size=(8, 128)).astype(np.int64)])
    check("Pad", [x, i64(1, 2, 3, 4, 5, 6)], opset=18, mode="reflect")
    check("OneHot", [RNG.integers(0, 100, size=(64, 32)).astype(np.int64), np.array(100, np.int64),
                     np.array([0, 1], np.float32)], opset=11)
