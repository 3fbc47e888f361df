import numpy as np
import pytest
from onnx import TensorProto, helper


@pytest.fixture
def add_model_bytes():
    """Z = X + Y with X, Y float [N, 3]."""
    X = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])
    Y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 3])
    Z = helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["N", 3])
    g = helper.make_graph([helper.make_node("Add", ["X", "Y"], ["Z"], name="add")], "g", [X, Y], [Z])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.fixture
def ones23():
    return np.ones((2, 3), np.float32)
