"""onnxpy.ir.wire: session creation reads models without protobuf, to the same IR as the protobuf route, and leaves
to protobuf what it does not cover."""

from __future__ import annotations

import os
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxpy
from onnxpy.capi.onnxruntime_pybind11_state import InvalidGraph, InvalidProtobuf
from onnxpy.ir import load, wire

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def _both(data: bytes):
    """(IR through wire, IR through protobuf, the wire route's parsed object)."""
    parsed = load.parse_model_bytes(data, "x", fast=True)
    a = load.model_from_proto(parsed)
    saved = load._WIRE
    load._WIRE = False
    try:
        b = load.model_from_proto(load.parse_model_bytes(data, "x", fast=True))
    finally:
        load._WIRE = saved
    return a, b, parsed


def _same_graph(a, b):
    assert a.name == b.name and a.doc_string == b.doc_string
    assert [(n.op_type, n.domain, n.inputs, n.outputs, n.name, n.doc_string, list(n.attrs)) for n in a.nodes] == \
        [(n.op_type, n.domain, n.inputs, n.outputs, n.name, n.doc_string, list(n.attrs)) for n in b.nodes]
    for x, y in zip(a.nodes, b.nodes):
        for k in x.attrs:
            _same(x.attrs[k], y.attrs[k])
    assert a.inputs == b.inputs and a.outputs == b.outputs and a.value_info == b.value_info
    assert list(a.initializers) == list(b.initializers)
    for k, v in a.initializers.items():
        _same(v, b.initializers[k])
        assert v.flags.writeable == b.initializers[k].flags.writeable


def _same(u, v):
    if isinstance(u, np.ndarray):
        assert isinstance(v, np.ndarray) and u.dtype == v.dtype and u.shape == v.shape
        assert u.tolist() == v.tolist() if u.dtype == object else u.tobytes() == v.tobytes()
    elif hasattr(u, "nodes"):
        _same_graph(u, v)
    elif isinstance(u, list):
        assert isinstance(v, list) and len(u) == len(v)
        for p, q in zip(u, v):
            _same(p, q)
    else:
        assert u == v and type(u) is type(v), (u, v)


def _rich_model():
    t = helper.make_tensor("t", onnx.TensorProto.FLOAT, [2, 2], [1.5, -2.0, 3.25, np.inf])  # float_data (packed)
    ints = helper.make_tensor("i64", onnx.TensorProto.INT64, [3], [-1, 2**40, -(2**62)])  # int64_data, negatives
    u64 = helper.make_tensor("u64", onnx.TensorProto.UINT64, [2], [2**64 - 1, 7])  # uint64_data: no sign
    i8 = helper.make_tensor("i8", onnx.TensorProto.INT8, [3], [-128, 0, 127])  # int32_data
    f16 = helper.make_tensor("f16", onnx.TensorProto.FLOAT16, [2], np.array([1.5, -2], np.float16).view(np.uint16))
    dbl = helper.make_tensor("dbl", onnx.TensorProto.DOUBLE, [2], [0.1, -1e300])
    strs = helper.make_tensor("s", onnx.TensorProto.STRING, [2], [b"ab", "\u00e9".encode()])
    raw = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "raw")
    i4 = helper.make_tensor("i4", onnx.TensorProto.INT4, [3], [-8, 7, 1])  # sub-byte: onnx's numpy_helper
    then = helper.make_graph([helper.make_node("Identity", ["raw"], ["o1"])], "then", [],
                             [helper.make_tensor_value_info("o1", onnx.TensorProto.FLOAT, [2, 3])])
    els = helper.make_graph([helper.make_node("Neg", ["raw"], ["o2"])], "else", [],
                            [helper.make_tensor_value_info("o2", onnx.TensorProto.FLOAT, [2, "N"])])
    nodes = [
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els, name="if", doc_string="doc"),
        helper.make_node("Custom", ["x"], ["z"], domain="my.domain", f=0.1, i=-5, s="text", ints=[-1, 0, 2**33],
                         floats=[0.5, -1e-30], strings=["a", "b"], tensor=t, tensors=[t, raw]),
    ]
    seq = helper.make_tensor_sequence_value_info("q", onnx.TensorProto.FLOAT, [3, None])
    mp = onnx.ValueInfoProto(name="m")
    mp.type.map_type.key_type = onnx.TensorProto.INT64
    mp.type.map_type.value_type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    opt = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(onnx.TensorProto.INT32, ["B"])))
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3, None])
    x.type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    g = helper.make_graph(nodes, "main", [helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []), x],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [-1, 3])],
                          [t, ints, u64, i8, f16, dbl, strs, raw, i4], doc_string="graph doc",
                          value_info=[seq, mp, opt])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("my.domain", 3)],
                          producer_name="p", producer_version="v", doc_string="model doc", model_version=7,
                          domain="d.com")
    helper.set_model_props(m, {"k": "v", "e": "\u00e9"})
    m.ir_version = 10
    return m


def test_rich_model_same_ir_as_protobuf():
    data = _rich_model().SerializeToString()
    a, b, parsed = _both(data)
    assert isinstance(parsed, wire.Message)
    for f in ("opsets", "ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string",
              "metadata"):
        assert getattr(a, f) == getattr(b, f), f
    _same_graph(a.graph, b.graph)
    assert a.graph.initializers["i4"].tolist() == [-8, 7, 1]
    assert a.graph.initializers["u64"].tolist() == [2**64 - 1, 7]
    assert a.graph.inputs[1].type.shape == ("batch", 3, None)
    assert a.graph.inputs[1].type.denotations[0] == "DATA_BATCH"


def test_unpacked_repeated_fields_and_oneof_order():
    """Repeated numbers written one by one (as old writers do) read the same as packed ones; the last member of a
    oneof wins, as in protobuf."""
    m = _rich_model()
    data = bytearray(m.SerializeToString())
    # hand-written: a Dimension with dim_param then dim_value (both set on the wire, the later one wins)
    dim = onnx.TensorShapeProto.Dimension(dim_param="p").SerializeToString() + bytes([0x08, 0x05])
    assert onnx.TensorShapeProto.Dimension.FromString(dim).WhichOneof("value") == "dim_value"
    tt = onnx.TypeProto()
    tt.tensor_type.elem_type = 1
    shape = bytes([0x0A, len(dim)]) + dim
    tensor_type = bytes([0x08, 0x01, 0x12, len(shape)]) + shape
    typ = bytes([0x0A, len(tensor_type)]) + tensor_type
    vi = onnx.ValueInfoProto(name="w").SerializeToString() + bytes([0x12, len(typ)]) + typ
    g = onnx.GraphProto()
    g.ParseFromString(m.graph.SerializeToString())
    gb = g.SerializeToString() + bytes([0x6A, len(vi)]) + vi  # value_info (13)
    # an attribute with unpacked ints: field 8 as separate varints
    attr = onnx.AttributeProto(name="u", type=onnx.AttributeProto.INTS).SerializeToString() + bytes(
        [0x40, 0x03, 0x40, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01])
    node = helper.make_node("Custom2", ["x"], ["w"], domain="my.domain").SerializeToString() + bytes(
        [0x2A, len(attr)]) + attr
    gb += bytes([0x0A, len(node)]) + node
    mm = onnx.ModelProto()
    mm.CopyFrom(m)
    mm.ClearField("graph")
    data = mm.SerializeToString() + bytes([0x3A]) + _varint(len(gb)) + gb
    a, b, parsed = _both(data)
    assert isinstance(parsed, wire.Message)
    _same_graph(a.graph, b.graph)
    assert a.graph.value_info["w"].type.shape == (5,)
    assert a.graph.nodes[-1].attrs["u"] == [3, -1]


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def test_what_wire_leaves_to_protobuf():
    """(Model-local functions: tests/test_proto_loading.py, test_model_with_local_functions.)"""
    # an enum value the installed onnx does not define: protobuf's reading stands
    t = numpy_helper.from_array(np.ones(2, np.float32), "w")
    t.data_type = 1
    tb = bytearray(t.SerializeToString())
    i = tb.index(bytes([0x10, 0x01]))  # data_type = 1
    tb[i + 1] = 0x63
    with pytest.raises(wire.Unsupported):
        wire._decode(wire.TensorProto, bytes(tb), 0, len(tb), 0)
    # a singular message given twice (protobuf merges): left to protobuf
    two = bytes([0x3A, 0x00, 0x3A, 0x00])
    with pytest.raises(wire.Unsupported):
        wire.decode_model(two)


@pytest.mark.parametrize("bad", [b"\x0a\x05ab", b"\xff\xff\xff", b"\x3a\x10\x0a", b"\x0b\x00", b"garbage!" * 3])
def test_malformed_bytes_report_as_before(bad):
    with pytest.raises(wire.Unsupported):
        wire.decode_model(bad)
    with pytest.raises(InvalidProtobuf) as e:
        onnxpy.InferenceSession(bad)
    assert "protobuf parsing failed" in str(e.value)


def test_invalid_utf8_names_are_reported():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    bad = data.replace(b"\x0a\x01x\x12\x01y", b"\x0a\x01\xff\x12\x01y")
    assert bad != data
    with pytest.raises((InvalidProtobuf, InvalidGraph)) as e:
        onnxpy.InferenceSession(bad)
    assert "UTF-8" in str(e.value)


def test_lazy_output_inference_matches_protobuf_route():
    """Outputs declared without a shape: their NodeArgs come from onnx's inference on a protobuf copy made on first
    use (the wire route) -- the same as the protobuf route's."""
    w = numpy_helper.from_array(np.ones((30, 20), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 30])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [w])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    s = onnxpy.InferenceSession(data)
    assert callable(s._state._slim)  # (not made yet)
    got = [(o.name, o.type, o.shape) for o in s.get_outputs()]
    saved = load._WIRE
    load._WIRE = False
    try:
        ref = [(o.name, o.type, o.shape) for o in onnxpy.InferenceSession(data).get_outputs()]
    finally:
        load._WIRE = saved
    assert got == ref == [("y", "tensor(float)", ["N", 20])]


def test_external_data_through_wire(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = numpy_helper.from_array(arr, "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 4])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 4])], [t])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    p = str(tmp_path / "m.onnx")
    onnx.save_model(m, p, save_as_external_data=True, all_tensors_to_one_file=True, location="d.bin",
                    size_threshold=0)
    proto, base = load.read_model_proto(p, fast=True)
    assert isinstance(proto, wire.Message) and proto.graph.initializer[0].data_location == 1
    s = onnxpy.InferenceSession(p)
    np.testing.assert_array_equal(s.run(None, {"x": arr})[0], 2 * arr)


def test_read_model_proto_stays_protobuf():
    path = os.path.join(DATA, "light", "light_squeezenet.onnx")
    assert isinstance(load.read_model_proto(path)[0], onnx.ModelProto)
    with open(path, "rb") as f:
        assert isinstance(load.parse_model_bytes(f.read(), "x"), onnx.ModelProto)


def test_attributes_without_a_type_and_packed_floats():
    """Old writers leave AttributeProto.type unset: the value comes from the populated field on both routes (packed
    floats included, which the wire route keeps as an array)."""
    nodes = []
    for i, (k, v) in enumerate((("fl", [0.25, -1.5, 3.0]), ("f", 2.5), ("i", -3), ("ints", [4, -5]), ("s", "txt"))):
        n = helper.make_node("Custom", ["x"], [f"y{i}"], domain="my.domain", **{k: v})
        n.attribute[0].type = onnx.AttributeProto.UNDEFINED
        nodes.append(n)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, [1]) for i in range(5)])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 1)]
                             ).SerializeToString()
    a, b, parsed = _both(data)
    assert isinstance(parsed, wire.Message)
    _same_graph(a.graph, b.graph)
    assert [list(n.attrs.values())[0] for n in a.graph.nodes] == [[0.25, -1.5, 3.0], 2.5, -3, [4, -5], "txt"]


def test_opaque_type_goes_to_protobuf():
    vi = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    vi.type.opaque_type.domain = "d"  # (the oneof's last member: the tensor type is gone)
    g = helper.make_graph([helper.make_node("Relu", ["y"], ["z"])], "g",
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1])], value_info=[vi])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(wire.Unsupported):
        wire.decode_model(data)
    model = load.load_model(data)
    assert model.graph.value_info["x"].type is None


def test_tables_cover_the_installed_onnx_schema():
    """Every field onnx's messages define is either read or sent to protobuf: a field the reader skipped as unknown
    would escape the checks protobuf makes of its contents."""
    pairs = {"ModelProto": onnx.ModelProto, "GraphProto": onnx.GraphProto, "NodeProto": onnx.NodeProto,
             "AttributeProto": onnx.AttributeProto, "ValueInfoProto": onnx.ValueInfoProto, "TypeProto": onnx.TypeProto,
             "TypeProto_Tensor": onnx.TypeProto.Tensor, "TypeProto_SparseTensor": onnx.TypeProto.SparseTensor,
             "TypeProto_Sequence": onnx.TypeProto.Sequence, "TypeProto_Optional": onnx.TypeProto.Optional,
             "TypeProto_Map": onnx.TypeProto.Map, "TensorShapeProto": onnx.TensorShapeProto,
             "TensorShapeProto_Dimension": onnx.TensorShapeProto.Dimension, "TensorProto": onnx.TensorProto,
             "SparseTensorProto": onnx.SparseTensorProto, "OperatorSetIdProto": onnx.OperatorSetIdProto,
             "StringStringEntryProto": onnx.StringStringEntryProto}
    for name, cls in pairs.items():
        ours = getattr(wire, name)
        covered = set(ours._fields) | set(wire._GIVE_UP.get(name, ()))
        theirs = {f.number for f in cls.DESCRIPTOR.fields}
        assert theirs <= covered, (name, sorted(theirs - covered))
        for num, (attr, *_rest) in ours._fields.items():
            assert cls.DESCRIPTOR.fields_by_number[num].name == attr, (name, num, attr)


def test_metadata_props_are_read_and_checked():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    entry = m.graph.node[0].metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.stack_trace", "line 1"
    data = m.SerializeToString()
    parsed = wire.decode_model(data)
    assert parsed.graph.node[0].metadata_props[0].key == "pkg.torch.onnx.stack_trace"
    # a corrupt entry (a group start inside it) is refused, as protobuf refuses it
    bad = data.replace(b"\x0a\x1apkg.torch", b"\x0b\x1apkg.torch")
    assert bad != data
    with pytest.raises(wire.Unsupported):
        wire.decode_model(bad)
    with pytest.raises(InvalidProtobuf):
        onnxpy.InferenceSession(bad)


def test_corrupted_models_read_as_protobuf_reads_them():
    """Random byte changes to a model: whatever the wire reader accepts, protobuf accepts too, to the same IR (or the
    same loading error); what it declines goes to protobuf."""
    from onnxpy.capi.onnxruntime_pybind11_state import _OrtError
    from onnxpy.ir import proto

    src = open(os.path.join(DATA, "light", "light_squeezenet.onnx"), "rb").read()
    rng = np.random.default_rng(5)
    accepted = 0
    for it in range(300):
        b = bytearray(src)
        for _ in range(1 + it % 4):
            i = int(rng.integers(len(b)))
            b[i] = int(rng.integers(256))
        data = bytes(b)
        try:
            w = wire.decode_model(data)
        except wire.Unsupported:
            continue
        p = proto.messages().ModelProto()
        p.ParseFromString(data)  # (raises if protobuf refuses what the wire reader took)
        accepted += 1
        got = []
        for parsed in (w, p):
            try:
                got.append(load.model_from_proto(parsed))
            except _OrtError as e:
                got.append(str(e))
        if isinstance(got[0], str) or isinstance(got[1], str):
            assert got[0] == got[1]
        else:
            _same_graph(got[0].graph, got[1].graph)
    assert accepted > 100
