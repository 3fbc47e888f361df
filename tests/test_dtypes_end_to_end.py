"""Every ONNX element type goes in and out of run() as a numpy array (narrow types through ml_dtypes)."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxpy as ort
from onnxpy import dtypes

ALL_TYPES = [t for t in sorted(dtypes._ONNX_TO_NP) if t != TensorProto.UNDEFINED]


def _values(dt):
    if dt == np.dtype(object):
        return np.array(["a", "bc", "", "déjà"], dtype=object)
    if dt == np.dtype(bool):
        return np.array([True, False, True, True])
    if dt.kind == "c":
        return np.array([1 + 2j, -3j, 0, 4], dtype=dt)
    return np.array([0, 1, 2, 3], dtype=np.float32).astype(dt)


@pytest.mark.parametrize("elem_type", ALL_TYPES, ids=[dtypes.type_name(t) for t in ALL_TYPES])
def test_identity_reshape_round_trip(elem_type):
    dt = dtypes.to_numpy(elem_type)
    nodes = [helper.make_node("Identity", ["X"], ["Y"]), helper.make_node("Reshape", ["X", "shape"], ["Z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", elem_type, [4])],
                          [helper.make_tensor_value_info("Y", elem_type, [4]),
                           helper.make_tensor_value_info("Z", elem_type, [2, 2])],
                          [helper.make_tensor("shape", TensorProto.INT64, [2], [2, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 25)])
    s = ort.InferenceSession(m.SerializeToString())
    x = _values(dt)
    y, z = s.run(None, {"X": x})
    assert y.dtype == dt and z.dtype == dt and z.shape == (2, 2)
    assert s.get_inputs()[0].type == f"tensor({dtypes.type_name(elem_type)})"
    if dt.kind in "fciub" or dt == np.dtype(object):
        assert list(y.reshape(-1)) == list(x)
    else:  # ml_dtypes narrow types compare through float32
        np.testing.assert_array_equal(y.astype(np.float32), x.astype(np.float32))


@pytest.mark.parametrize("elem_type", [t for t in ALL_TYPES if t not in (TensorProto.STRING, TensorProto.BOOL)],
                         ids=lambda t: dtypes.type_name(t))
def test_cast_to_and_from_float(elem_type):
    g = helper.make_graph([helper.make_node("Cast", ["X"], ["Y"], to=elem_type),
                           helper.make_node("Cast", ["Y"], ["Z"], to=TensorProto.FLOAT)], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 25)])
    z = ort.InferenceSession(m.SerializeToString()).run(None, {"X": np.array([0, 1, 2, 3], np.float32)})[0]
    if elem_type == TensorProto.FLOAT8E8M0:  # exponent-only type: powers of two (and no zero)
        assert z[1:].tolist() == [1, 2, 4] or z[1:].tolist() == [1, 2, 2]
    elif elem_type in (TensorProto.UINT2, TensorProto.INT2):
        assert z[:2].tolist() == [0, 1]
    else:
        np.testing.assert_array_equal(z, [0, 1, 2, 3])
