"""Loading models without importing onnx (onnxpy.ir.proto): the enum table, tensor decoding against onnx's
numpy_helper on every tensor of onnx's backend test data, the slim copy for shape inference, and that creating a
session does not import onnx while a later ``import onnx`` sees the same message classes."""

from __future__ import annotations

import functools
import glob
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxpy
from onnxpy.ir import proto, protoenums
from onnxpy.ir.load import load_model, read_model_proto

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
TENSORS = sorted(glob.glob(os.path.join(DATA, "*", "*", "test_data_set_*", "*.pb")))


@functools.lru_cache(maxsize=1)
def _all_models() -> list:
    """(name, serialized model) of every backend case (generated node/model cases and the wheel's file cases)."""
    from onnxpy.testing.conformance import collect_cases

    out = []
    for c in collect_cases():
        out.append((c.name, c.load()[0]))
    for path in sorted(glob.glob(os.path.join(DATA, "light", "*.onnx"))):
        out.append((os.path.basename(path), open(path, "rb").read()))
    return out


def _tensors(g):
    yield from g.initializer
    for n in g.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _tensors(a.g)
            for sub in a.graphs:
                yield from _tensors(sub)


def test_enums_match_onnx():
    assert protoenums.data_type_names() == dict(onnx.TensorProto.DataType.items())
    assert protoenums.attribute_type_names() == dict(onnx.AttributeProto.AttributeType.items())
    assert protoenums.TensorProto.EXTERNAL == onnx.TensorProto.EXTERNAL
    assert protoenums.TensorProto.DEFAULT == onnx.TensorProto.DEFAULT
    assert protoenums.onnx_version() == onnx.__version__


def _check_decode(p, where):
    try:
        want = numpy_helper.to_array(p)
    except Exception:  # noqa: BLE001 - onnx cannot decode it either
        return False
    got = proto.tensor_array(p, None, onnxpy.dtypes.to_numpy(p.data_type))
    if got is None:  # sub-byte types go to onnx
        assert p.data_type in proto.SUB_BYTE, where
        return False
    if p.data_type == onnx.TensorProto.STRING:
        from onnxpy.ir.load import _strings

        want = _strings(want)  # what the loader made of onnx's decoding
    assert got.dtype == want.dtype and got.shape == want.shape, where
    np.testing.assert_array_equal(got, want, err_msg=where)
    root = got
    while isinstance(root.base, np.ndarray):
        root = root.base
    assert root.base is None or len(root.base) == got.nbytes, where  # its own memory, not a model-sized buffer
    return True


def test_tensors_decode_as_numpy_helper():
    checked = 0
    for name, data in _all_models():
        for tp in _tensors(onnx.ModelProto.FromString(data).graph):
            checked += _check_decode(tp, f"{name}: {tp.name}")
    for path in TENSORS:
        data = open(path, "rb").read()
        p = onnx.TensorProto()
        try:
            p.ParseFromString(data)
        except Exception:  # noqa: BLE001 - a sequence/optional file, not a tensor
            continue
        checked += _check_decode(p, path)
    assert checked > 1000


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "int8", "uint8", "uint16", "int16",
                                   "bool", "float16", "uint32", "uint64", "complex64", "complex128"])
def test_typed_fields_and_raw_data(dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 4)) * 100).astype(dtype)
    for raw in (True, False):
        t = helper.make_tensor("t", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape,
                               a.tobytes() if raw else a.reshape(-1).tolist(), raw=raw)
        got = proto.tensor_array(t, None, a.dtype)
        np.testing.assert_array_equal(got, a)
        assert got.dtype == a.dtype


def test_bit_pattern_types_in_int32_data():
    import ml_dtypes

    for dt, code in ((ml_dtypes.bfloat16, onnx.TensorProto.BFLOAT16),
                     (ml_dtypes.float8_e4m3fn, onnx.TensorProto.FLOAT8E4M3FN),
                     (ml_dtypes.float8_e5m2, onnx.TensorProto.FLOAT8E5M2)):
        a = np.array([1.5, -2.0, 0.25, 3.0], dtype=dt)
        t = helper.make_tensor("t", code, [4], a.astype(np.float32).tolist())
        got = proto.tensor_array(t, None, np.dtype(dt))
        np.testing.assert_array_equal(got.astype(np.float32), numpy_helper.to_array(t).astype(np.float32))


@pytest.mark.parametrize("cut", [1, 5, 17, 100])
def test_truncated_and_garbage_models_raise_invalid_protobuf(cut):
    path = os.path.join(DATA, "light", "light_squeezenet.onnx")
    data = open(path, "rb").read()
    bad = data[: len(data) // cut - 3] if cut > 1 else data[:-7]
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.InvalidProtobuf):
        onnxpy.InferenceSession(bad)
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.InvalidProtobuf):
        onnxpy.InferenceSession(b"\x0b\x0c" + data[:50])  # an empty group, then a truncated field


def test_random_bytes_never_crash():
    rng = np.random.default_rng(1)
    errors = (onnxpy.capi.onnxruntime_pybind11_state.InvalidProtobuf,
              onnxpy.capi.onnxruntime_pybind11_state.InvalidGraph,
              onnxpy.capi.onnxruntime_pybind11_state.Fail,
              onnxpy.capi.onnxruntime_pybind11_state.NotImplemented,
              onnxpy.capi.onnxruntime_pybind11_state.InvalidArgument)
    w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 4, 4])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [w, shape])
    src = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    onnxpy.InferenceSession(src)
    for i in range(300):
        b = bytearray(src)
        for _ in range(1 + i % 4):
            b[int(rng.integers(len(b)))] = int(rng.integers(256))
        try:
            onnxpy.InferenceSession(bytes(b))
        except errors:
            pass


def test_slim_bytes_give_the_same_inference_as_onnx_slim():
    from onnxpy.output_types import _inferred_output_types, _slim_proto, _slim_source

    w = numpy_helper.from_array(np.ones((300, 200), np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, 20, 10], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 300])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [w, shape])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    src = _slim_source(read_model_proto(data, fast=True)[0])
    slim = src() if callable(src) else src
    from_wire = _inferred_output_types(slim)
    from_onnx = _inferred_output_types(_slim_proto(onnx.ModelProto.FromString(data)))
    assert from_wire == from_onnx
    assert from_wire["y"].shape == (None, 20, 10)
    assert slim.ByteSize() < len(data) / 10
    s = onnxpy.InferenceSession(data)
    assert s.get_outputs()[0].shape == [None, 20, 10]


def test_model_with_local_functions():
    add = helper.make_function("custom", "MyAdd", ["a", "b"], ["c"], [helper.make_node("Add", ["a", "b"], ["c"])],
                               [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("MyAdd", ["x", "y"], ["z"], domain="custom")], "g",
                          [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in "xy"],
                          [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                          functions=[add])
    from onnxpy.ir import wire

    with pytest.raises(wire.Unsupported):  # (functions: protobuf's route for session creation, inlined as before)
        wire.decode_model(m.SerializeToString())
    model = load_model(m.SerializeToString())
    assert isinstance(model.proto, onnx.ModelProto)
    assert [n.op_type for n in model.graph.nodes] == ["Add"]
    s = onnxpy.InferenceSession(m.SerializeToString())
    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(s.run(None, {"x": x, "y": x})[0], 2 * x)


def test_creating_a_session_does_not_import_onnx():
    path = os.path.join(DATA, "light", "light_squeezenet.onnx")
    code = (
        "import sys, numpy as np, onnxpy\n"
        f"s = onnxpy.InferenceSession({path!r})\n"
        "out = s.run(None, {s.get_inputs()[0].name: np.zeros((1, 3, 224, 224), np.float32)})\n"
        "print('google.protobuf' in sys.modules)\n"  # (onnxpy.ir.wire read the model)
        "s.get_outputs()\n"
        "print('onnx' in sys.modules)\n"
        "from onnxpy.ir.load import read_model_proto\n"
        f"m = read_model_proto({path!r})[0]\n"
        "import onnx\n"  # imported afterwards: the same message classes
        "print(type(m) is onnx.ModelProto, isinstance(m.graph.node[0], onnx.NodeProto))\n"
        "onnx.checker.check_model(m)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "True", "True"]


def test_sessions_created_from_threads_in_a_fresh_process():
    path = os.path.join(DATA, "light", "light_squeezenet.onnx")
    code = (
        "import sys, threading, numpy as np, onnxpy\n"
        "errors = []\n"
        "def make():\n"
        "    try:\n"
        f"        s = onnxpy.InferenceSession({path!r})\n"
        "        s.run(None, {s.get_inputs()[0].name: np.zeros((1, 3, 224, 224), np.float32)})\n"
        "    except Exception as e:\n"
        "        errors.append(repr(e))\n"
        "ts = [threading.Thread(target=make) for _ in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(errors, 'onnx' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[] False"
