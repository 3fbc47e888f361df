"""onnxpy's own protobuf reader (onnxpy.ir.wire) against onnx's, field by field, on every model and tensor file of
onnx's backend test data; malformed input; and that creating a session does not import onnx."""

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
from onnxpy.ir import protoenums, wire
from onnxpy.ir.load import load_model

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


def _same(w, p, where: str) -> None:
    """Every field the reader knows reads as onnx reads it (recursively), with HasField/WhichOneof."""
    for name, (_num, kind, repeated) in type(w).FIELDS.items():
        a, b = getattr(w, name), getattr(p, name)
        here = f"{where}.{name}"
        if isinstance(kind, type):
            if repeated:
                assert len(a) == len(b), here
                for i, (x, y) in enumerate(zip(a, b)):
                    _same(x, y, f"{here}[{i}]")
            else:
                assert w.HasField(name) == p.HasField(name), here
                if p.HasField(name):
                    _same(a, b, here)
        elif repeated and kind in ("f32", "f64"):
            assert len(a) == len(b) and all(type(x) is float for x in a), here
            np.testing.assert_array_equal(np.array(a, np.float64), np.array(b, np.float64), err_msg=here)
        elif repeated:
            assert list(a) == list(b) and all(type(x) is type(y) for x, y in zip(a, b)), here
        else:
            assert (a == b or (a != a and b != b)) and type(a) is type(b), here
            if kind not in ("enum",) and not repeated:
                try:
                    expect = p.HasField(name)
                except ValueError:  # proto3-style scalar without presence
                    continue
                assert w.HasField(name) == expect, here
    for group in type(w).ONEOFS:
        assert w.WhichOneof(group) == p.WhichOneof(group), f"{where}.{group}"


def test_models_read_as_onnx_reads_them():
    models = _all_models()
    assert len(models) > 2000
    for name, data in models:
        w = wire.parse_model(data)
        p = onnx.ModelProto.FromString(data)
        _same(w, p, name)
        assert bool(w._f.get(25)) == bool(p.functions), name


def _check_decode(w, p, where):
    try:
        want = numpy_helper.to_array(p)
    except Exception:  # noqa: BLE001 - onnx cannot decode it either
        return False
    got = wire.tensor_array(w, None, onnxpy.dtypes.to_numpy(p.data_type))
    if got is None:  # sub-byte types go to onnx
        assert p.data_type in wire._SUB_BYTE, where
        return False
    if p.data_type == onnx.TensorProto.STRING:
        from onnxpy.ir.load import _strings

        want = _strings(want)  # what the loader made of onnx's decoding
    assert got.dtype == want.dtype and got.shape == want.shape, where
    np.testing.assert_array_equal(got, want, err_msg=where)
    root = got
    while isinstance(root.base, np.ndarray):
        root = root.base
    # its own memory: the model's buffer is not kept alive by a decoded tensor
    assert root.base is None or (root.base is not w._buf and len(root.base) == got.nbytes), where
    return True


def test_tensors_decode_as_numpy_helper():
    checked = 0
    for name, data in _all_models():
        w, p = wire.parse_model(data), onnx.ModelProto.FromString(data)
        for tw, tp in zip(_tensors(w.graph), _tensors(p.graph)):
            checked += _check_decode(tw, tp, f"{name}: {tp.name}")
    for path in TENSORS:
        data = open(path, "rb").read()
        p = onnx.TensorProto()
        try:
            p.ParseFromString(data)
        except Exception:  # noqa: BLE001 - a sequence/optional file, not a tensor
            continue
        w = wire.TensorMsg(data, ((0, len(data)),))
        _same(w, p, os.path.relpath(path, DATA))
        checked += _check_decode(w, p, path)
    assert checked > 1000


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "int8", "uint8", "uint16", "int16",
                                   "bool", "float16", "uint32", "uint64", "complex64", "complex128"])
def test_typed_fields_and_raw_data(dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 4)) * 100).astype(dtype)
    for raw in (True, False):
        t = helper.make_tensor("t", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape,
                               a.tobytes() if raw else a.reshape(-1).tolist(), raw=raw)
        data = t.SerializeToString()
        got = wire.tensor_array(wire.TensorMsg(data, ((0, len(data)),)), None, a.dtype)
        np.testing.assert_array_equal(got, a)
        assert got.dtype == a.dtype


def test_bit_pattern_types_in_int32_data():
    import ml_dtypes

    for dt, code in ((ml_dtypes.bfloat16, onnx.TensorProto.BFLOAT16),
                     (ml_dtypes.float8_e4m3fn, onnx.TensorProto.FLOAT8E4M3FN),
                     (ml_dtypes.float8_e5m2, onnx.TensorProto.FLOAT8E5M2)):
        a = np.array([1.5, -2.0, 0.25, 3.0], dtype=dt)
        t = helper.make_tensor("t", code, [4], a.astype(np.float32).tolist())
        data = t.SerializeToString()
        got = wire.tensor_array(wire.TensorMsg(data, ((0, len(data)),)), None, np.dtype(dt))
        np.testing.assert_array_equal(got.astype(np.float32), numpy_helper.to_array(t).astype(np.float32))


def test_packed_and_unpacked_repeated_fields_and_last_value_wins():
    # ints attribute written unpacked (one varint per element), then the name twice: the last one wins
    a = helper.make_attribute("axes", [1, -2, 300])
    body = a.SerializeToString()
    extra = b"".join(wire._enc_int(8, v) for v in (7, -1)) + wire._enc_text(1, "perm")
    data = body + extra
    w = wire.AttributeMsg(data, ((0, len(data)),))
    p = onnx.AttributeProto.FromString(data)
    assert w.ints == list(p.ints) == [1, -2, 300, 7, -1]
    assert w.name == p.name == "perm"
    long_ints = list(range(-5000, 5000, 7)) + [2**62, -(2**62)]
    t = helper.make_tensor("x", onnx.TensorProto.INT64, [len(long_ints)], long_ints)
    data = t.SerializeToString()
    got = wire.tensor_array(wire.TensorMsg(data, ((0, len(data)),)), None, np.dtype(np.int64))
    assert got.tolist() == long_ints


def test_oneof_last_member_wins():
    d = onnx.TensorShapeProto.Dimension(dim_value=3)
    data = d.SerializeToString() + wire._enc_text(2, "N")
    w = wire.DimensionMsg(data, ((0, len(data)),))
    p = onnx.TensorShapeProto.Dimension.FromString(data)
    assert w.WhichOneof("value") == p.WhichOneof("value") == "dim_param"
    assert w.HasField("dim_value") == p.HasField("dim_value")


@pytest.mark.parametrize("cut", [1, 5, 17, 100])
def test_truncated_and_garbage_models_raise_invalid_protobuf(cut):
    path = os.path.join(DATA, "light", "light_squeezenet.onnx")
    data = open(path, "rb").read()
    bad = data[: len(data) // cut - 3] if cut > 1 else data[:-7]
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.InvalidProtobuf):
        onnxpy.InferenceSession(bad)
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.InvalidProtobuf):
        onnxpy.InferenceSession(b"\x0b\x0c" + data[:50])  # wire type 3 (groups)


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
    from onnxpy.output_types import _inferred_output_types, _slim_proto

    w = numpy_helper.from_array(np.ones((300, 200), np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, 20, 10], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 300])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [w, shape])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    slim = _slim_proto(wire.parse_model(data))
    from_wire = _inferred_output_types(slim)
    from_onnx = _inferred_output_types(_slim_proto(onnx.ModelProto.FromString(data)))
    assert from_wire == from_onnx
    assert from_wire["y"].shape == (None, 20, 10)
    assert len(slim) < len(data) / 10
    s = onnxpy.InferenceSession(data)
    assert s.get_outputs()[0].shape == [None, 20, 10]


def test_model_with_local_functions_goes_to_onnx():
    add = helper.make_function("custom", "MyAdd", ["a", "b"], ["c"], [helper.make_node("Add", ["a", "b"], ["c"])],
                               [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("MyAdd", ["x", "y"], ["z"], domain="custom")], "g",
                          [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2]) for n in "xy"],
                          [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                          functions=[add])
    model = load_model(m.SerializeToString())
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
        "s.get_outputs()\n"
        "print('onnx' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_schema_covers_every_message_field_of_onnx_proto():
    """Protobuf validates every message-typed field when it parses, read or not; so must the reader (and it must
    know every field onnx's loader reads).  Model fields left to onnx are the fallback ones."""
    seen = set()

    def walk(cls, desc, where):
        if desc.full_name in seen:
            return
        seen.add(desc.full_name)
        for f in desc.fields:
            if cls is wire.ModelMsg and f.number in wire.MODEL_FALLBACK_FIELDS:
                continue
            assert f.name in cls.FIELDS, f"{where}.{f.name} ({f.number})"
            num, kind, repeated = cls.FIELDS[f.name]
            assert num == f.number, f"{where}.{f.name}"
            if f.message_type is not None:
                assert isinstance(kind, type), f"{where}.{f.name}"
                walk(kind, f.message_type, f"{where}.{f.name}")
        for o in desc.oneofs:
            assert set(cls.ONEOFS[o.name]) == {f.name for f in o.fields}, f"{where}.{o.name}"

    walk(wire.ModelMsg, onnx.ModelProto.DESCRIPTOR, "ModelProto")


def test_enum_values_unknown_to_onnx_leave_the_field_unset():
    t = helper.make_tensor("t", onnx.TensorProto.FLOAT, [1], [1.0])
    data = t.SerializeToString() + wire._enc_int(14, 7)  # data_location 7: not a DataLocation
    w, p = wire.TensorMsg(data, ((0, len(data)),)), onnx.TensorProto.FromString(data)
    assert w.data_location == p.data_location == 0
    assert w.HasField("data_location") == p.HasField("data_location")


def test_groups_are_skipped_as_protobuf_skips_unknown_fields():
    t = helper.make_tensor("t", onnx.TensorProto.FLOAT, [1], [1.0])
    group = wire._enc_varint(30 << 3 | 3) + wire._enc_int(1, 5) + wire._enc_varint(30 << 3 | 4)
    data = group + t.SerializeToString()
    w, p = wire.TensorMsg(data, ((0, len(data)),)), onnx.TensorProto.FromString(data)
    _same(w, p, "t")
    with pytest.raises(wire.WireError):
        wire.TensorMsg(group[:-1], ((0, len(group) - 1),))


def test_nesting_deeper_than_protobuf_allows_is_refused():
    def model(levels):
        g = wire._enc_len(1, wire._enc_text(1, "x") + wire._enc_text(2, "y") + wire._enc_text(4, "Identity"))
        for _ in range(levels):
            attr = wire._enc_text(1, "then_branch") + wire._enc_int(20, 5) + wire._enc_len(6, g)
            node = wire._enc_text(1, "c") + wire._enc_text(2, "y") + wire._enc_text(4, "If") + wire._enc_len(5, attr)
            g = wire._enc_len(1, node) + wire._enc_text(2, "g")
        return wire._enc_int(1, 8) + wire._enc_len(8, wire._enc_int(2, 17)) + wire._enc_len(7, g)

    ok, deep = model(20), model(40)
    wire.parse_model(ok)
    onnx.ModelProto.FromString(ok)
    with pytest.raises(Exception):  # noqa: B017 - onnx's parser refuses it too
        onnx.ModelProto.FromString(deep)
    with pytest.raises(onnxpy.capi.onnxruntime_pybind11_state.InvalidProtobuf):
        onnxpy.InferenceSession(deep)
