"""The onnxruntime-compatible API: session construction, metadata, feeds, errors, options, OrtValue, IOBinding."""

import os
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy as ort
from onnxpy.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, InvalidProtobuf, NoSuchFile
from onnxpy.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

ortref = pytest.importorskip("onnxruntime")


def _both(model_bytes):
    return ort.InferenceSession(model_bytes), ortref.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


def test_run_matches_onnxruntime(add_model_bytes, ones23):
    a, b = _both(add_model_bytes)
    feed = {"X": ones23, "Y": ones23 * 2}
    np.testing.assert_array_equal(a.run(None, feed)[0], b.run(None, feed)[0])
    assert a.run([], feed)[0].shape == (2, 3)
    assert a.run(["Z"], feed)[0].dtype == np.float32


def test_node_args_like_onnxruntime(add_model_bytes):
    a, b = _both(add_model_bytes)
    for x, y in zip(a.get_inputs() + a.get_outputs(), b.get_inputs() + b.get_outputs()):
        assert (x.name, x.type, x.shape) == (y.name, y.type, y.shape)
    assert a.get_providers() == ["CPUExecutionProvider"]
    assert a.get_provider_options() == {"CPUExecutionProvider": {}}


@pytest.mark.parametrize("feed_fn, exc", [
    (lambda x: {"X": x}, ValueError),
    (lambda x: {"X": x, "Y": x, "W": x}, InvalidArgument),
    (lambda x: {"X": x, "Y": x.astype(np.float64)}, InvalidArgument),
    (lambda x: {"X": x, "Y": np.ones((2, 3, 1), np.float32)}, InvalidArgument),
    (lambda x: {"X": x, "Y": np.ones((2, 4), np.float32)}, InvalidArgument),
    (lambda x: {"X": x, "Y": 3.0}, RuntimeError),
])
def test_feed_errors_match_onnxruntime(add_model_bytes, ones23, feed_fn, exc):
    a, b = _both(add_model_bytes)
    with pytest.raises(exc) as ours:
        a.run(None, feed_fn(ones23))
    with pytest.raises(Exception) as theirs:
        b.run(None, feed_fn(ones23))
    assert str(ours.value) == str(theirs.value)


def test_invalid_output_name(add_model_bytes, ones23):
    a, _ = _both(add_model_bytes)
    with pytest.raises(InvalidArgument, match="Invalid output name:Q"):
        a.run(["Q"], {"X": ones23, "Y": ones23})
    with pytest.raises(TypeError):
        a.run("Z", {"X": ones23, "Y": ones23})


def test_lists_converted_and_noncontiguous(add_model_bytes, ones23):
    a, _ = _both(add_model_bytes)
    out = a.run(None, {"X": [[1, 2, 3], [4, 5, 6]], "Y": np.ones((3, 2), np.float32).T})[0]
    np.testing.assert_array_equal(out, np.array([[2, 3, 4], [5, 6, 7]], np.float32))
    empty = a.run(None, {"X": np.zeros((0, 3), np.float32), "Y": np.zeros((0, 3), np.float32)})[0]
    assert empty.shape == (0, 3)


def test_runtime_error_names_node(add_model_bytes):
    a, _ = _both(add_model_bytes)
    with pytest.raises(Fail, match="Add node. Name:'add'") as e:
        a.run(None, {"X": np.ones((2, 3), np.float32), "Y": np.ones((3, 3), np.float32)})
    assert "float32[2, 3]" in str(e.value) and "float32[3, 3]" in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(NoSuchFile):
        ort.InferenceSession(str(tmp_path / "missing.onnx"))
    with pytest.raises(InvalidProtobuf):
        ort.InferenceSession(b"garbage\xff\xff")
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x08\x07\x12\xff\xff\xff")
    with pytest.raises(InvalidProtobuf):
        ort.InferenceSession(str(p))


def test_unknown_op_is_named():
    g = helper.make_graph([helper.make_node("NoSuchOp", ["X"], ["Y"], domain="my.domain")], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 1)])
    with pytest.raises(OrtNotImplemented, match=r"NoSuchOp\(1\).*my\.domain"):
        ort.InferenceSession(m.SerializeToString())


def _model_with_initializer_input():
    W = numpy_helper.from_array(np.full((2, 3), 5, np.float32), "W")
    g = helper.make_graph([helper.make_node("Add", ["X", "W"], ["Z"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("W", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2, 3])], [W])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def test_overridable_initializers_and_add_initializer(ones23):
    mb = _model_with_initializer_input()
    a, b = _both(mb)
    assert [i.name for i in a.get_inputs()] == [i.name for i in b.get_inputs()] == ["X"]
    assert [i.name for i in a.get_overridable_initializers()] == ["W"]
    np.testing.assert_array_equal(a.run(None, {"X": ones23})[0], np.full((2, 3), 6, np.float32))
    np.testing.assert_array_equal(a.run(None, {"X": ones23, "W": ones23})[0], np.full((2, 3), 2, np.float32))
    so = ort.SessionOptions()
    w = ort.OrtValue.ortvalue_from_numpy(np.zeros((2, 3), np.float32))
    so.add_initializer("W", w)
    s = ort.InferenceSession(mb, so)
    np.testing.assert_array_equal(s.run(None, {"X": ones23})[0], ones23)


def test_model_metadata():
    g = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "gname",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="p", doc_string="docstr")
    m.ir_version = 8
    helper.set_model_props(m, {"k": "v"})
    a, b = _both(m.SerializeToString())
    ma, mb = a.get_modelmeta(), b.get_modelmeta()
    for f in ("producer_name", "graph_name", "domain", "description", "graph_description", "version",
              "custom_metadata_map"):
        assert getattr(ma, f) == getattr(mb, f), f


def test_session_options_defaults_match():
    a, b = ort.SessionOptions(), ortref.SessionOptions()
    for f in ("optimized_model_filepath", "intra_op_num_threads", "inter_op_num_threads", "enable_profiling",
              "profile_file_prefix", "enable_mem_pattern", "enable_mem_reuse", "enable_cpu_mem_arena",
              "log_severity_level", "log_verbosity_level", "logid", "use_deterministic_compute",
              "use_per_session_threads"):
        assert getattr(a, f) == getattr(b, f), f
    assert int(a.graph_optimization_level) == int(b.graph_optimization_level) == 99
    assert int(a.execution_mode) == int(b.execution_mode) == 0
    a.add_session_config_entry("session.intra_op.allow_spinning", "0")
    assert a.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    with pytest.raises(RuntimeError, match="does not have configuration with key: nope"):
        a.get_session_config_entry("nope")
    ro = ort.RunOptions()
    assert (ro.log_severity_level, ro.terminate, ro.only_execute_path_to_fetches) == (-1, False, False)


def test_enum_values_match():
    for enum_name in ("GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder"):
        ours, theirs = getattr(ort, enum_name), getattr(ortref, enum_name)
        for member in ours:
            if hasattr(theirs, member.name):
                assert int(member) == int(getattr(theirs, member.name))


def test_free_dimension_override(add_model_bytes, ones23):
    so = ort.SessionOptions()
    so.add_free_dimension_override_by_name("N", 5)
    s = ort.InferenceSession(add_model_bytes, so)
    assert s.get_inputs()[0].shape == [5, 3]
    with pytest.raises(InvalidArgument, match="Got invalid dimensions for input: X"):
        s.run(None, {"X": ones23, "Y": ones23})


def test_run_options_terminate(add_model_bytes, ones23):
    s = ort.InferenceSession(add_model_bytes)
    ro = ort.RunOptions()
    ro.terminate = True
    with pytest.raises(Fail, match="Exiting due to terminate flag being set to true."):
        s.run(None, {"X": ones23, "Y": ones23}, ro)


def test_ortvalue_and_run_with_ort_values(add_model_bytes, ones23):
    s = ort.InferenceSession(add_model_bytes)
    v = ort.OrtValue.ortvalue_from_numpy(ones23)
    assert v.shape() == [2, 3] and v.data_type() == "tensor(float)" and v.element_type() == TensorProto.FLOAT
    assert v.device_name() == "cpu" and v.is_tensor() and v.has_value()
    out = s.run_with_ort_values(["Z"], {"X": v, "Y": v})
    np.testing.assert_array_equal(out[0].numpy(), ones23 * 2)
    np.testing.assert_array_equal(np.asarray(out[0]), ones23 * 2)
    with pytest.raises(AttributeError):
        s.run_with_ort_values(["Z"], {"X": ones23, "Y": ones23})
    z = ort.OrtValue.ortvalue_from_shape_and_type([2, 2], TensorProto.BFLOAT16)
    assert z.numpy().dtype.name == "bfloat16"
    d = ort.OrtValue.from_dlpack(ones23)
    np.testing.assert_array_equal(np.from_dlpack(d), ones23)


def test_iobinding(add_model_bytes, ones23):
    s = ort.InferenceSession(add_model_bytes)
    b = s.io_binding()
    b.bind_cpu_input("X", ones23)
    b.bind_ortvalue_input("Y", ort.OrtValue.ortvalue_from_numpy(ones23))
    out = ort.OrtValue.ortvalue_from_numpy(np.zeros((2, 3), np.float32))
    b.bind_ortvalue_output("Z", out)
    s.run_with_iobinding(b)
    np.testing.assert_array_equal(out.numpy(), ones23 * 2)
    b.clear_binding_outputs()
    b.bind_output("Z")
    s.run_with_iobinding(b)
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], ones23 * 2)
    other = ort.InferenceSession(add_model_bytes)
    with pytest.raises(ValueError):
        other.run_with_iobinding(b)


def test_run_async(add_model_bytes, ones23):
    s = ort.InferenceSession(add_model_bytes)
    done = threading.Event()
    got = {}

    def cb(res, data, err):
        got.update(res=res, data=data, err=err)
        done.set()

    s.run_async(None, {"X": ones23, "Y": ones23}, cb, "ud")
    assert done.wait(10)
    assert got["err"] == "" and got["data"] == "ud"
    np.testing.assert_array_equal(got["res"][0], ones23 * 2)
    done.clear()
    s.run_async(None, {"X": ones23, "Y": np.ones((3, 3), np.float32)}, cb, None)
    assert done.wait(10)
    assert got["res"] == [] and "Add node" in got["err"] and not got["err"].startswith("[ONNXRuntimeError]")


def test_ml_dtypes_through_run():
    import ml_dtypes

    g = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.BFLOAT16, [3])],
                          [helper.make_tensor_value_info("Y", TensorProto.BFLOAT16, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    s = ort.InferenceSession(m.SerializeToString())
    x = np.array([1.5, -2, 3], dtype=ml_dtypes.bfloat16)
    y = s.run(None, {"X": x})[0]
    assert y.dtype == x.dtype and (y == x).all()


def test_module_functions():
    assert "CPUExecutionProvider" in ort.get_available_providers()
    assert ort.get_all_providers()[-1] == "CPUExecutionProvider"
    assert ort.get_device() == "CPU"
    assert ort.get_version_string() == ort.__version__
    assert "onnxpy" in ort.get_build_info()
    ort.set_default_logger_severity(3)
    ort.set_seed(1)
    with pytest.warns(UserWarning, match="not in available provider names"):
        s = ort.InferenceSession(_model_with_initializer_input(), providers=["FooExecutionProvider"])
    assert s.get_providers() == ["CPUExecutionProvider"]


def test_threads_share_a_session(add_model_bytes):
    s = ort.InferenceSession(add_model_bytes)
    errors = []

    def work(k):
        x = np.full((4, 3), k, np.float32)
        for _ in range(50):
            r = s.run(None, {"X": x, "Y": x})[0]
            if not (r == 2 * k).all():
                errors.append(k)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def test_external_data_and_escape(tmp_path):
    W = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "W")
    g = helper.make_graph([helper.make_node("Add", ["X", "W"], ["Z"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2, 3])], [W])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=0)
    s = ort.InferenceSession(str(path))
    np.testing.assert_array_equal(s.run(None, {"X": np.zeros((2, 3), np.float32)})[0], np.arange(6).reshape(2, 3))
    # a location escaping the model folder is refused
    m2 = onnx.load(str(path), load_external_data=False)
    for e in m2.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../" + os.path.basename(str(tmp_path)) + "/w.bin"
    sub = tmp_path / "sub"
    sub.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 24)
    for e in m2.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../secret.bin"
    onnx.save_model(m2, str(sub / "m.onnx"))
    with pytest.raises(Fail, match="escapes the model folder"):
        ort.InferenceSession(str(sub / "m.onnx"))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8, np.uint16, np.int64, np.bool_])
def test_external_data_every_plain_type_and_offset(tmp_path, dtype):
    # several tensors in one file (non-zero offsets), decoded straight from the file
    rng = np.random.default_rng(0)
    vals = [(rng.standard_normal((3, 5)) * 10).astype(dtype) for _ in range(3)] + [np.zeros((0, 4), dtype)]
    inits = [numpy_helper.from_array(v, f"c{i}") for i, v in enumerate(vals)]
    nodes = [helper.make_node("Identity", [f"c{i}"], [f"y{i}"]) for i in range(len(vals))]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    outs = [helper.make_tensor_value_info(f"y{i}", elem, list(v.shape)) for i, v in enumerate(vals)]
    m = helper.make_model(helper.make_graph(nodes, "g", [], outs, inits), opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=0)
    got = ort.InferenceSession(str(path)).run(None, {})
    for g_, v in zip(got, vals):
        assert g_.dtype == v.dtype and g_.shape == v.shape
        np.testing.assert_array_equal(g_, v)


def _large_external_model(tmp_path, shapes, location="w.bin"):
    """MatMul chain over external float32 weights of the given shapes, saved to ``tmp_path`` (one data file, the
    tensors at the offsets onnx writes: not page-aligned after the first)."""
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    inits = [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(ws)]
    nodes, x = [], "X"
    for i in range(len(ws)):
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
        x = f"y{i}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, shapes[0][0]])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0)
    return str(path), ws


def test_external_data_large_tensors_memory_mapped(tmp_path, monkeypatch):
    import mmap

    from onnxpy.ir.load import load_model

    # a small tensor first, so the large ones sit at offsets that are not page-aligned
    path, ws = _large_external_model(tmp_path, [(3, 600), (600, 1000), (1000, 300)])
    m = load_model(path)
    for i, w in enumerate(ws):
        a = m.graph.initializers[f"w{i}"]
        np.testing.assert_array_equal(a, w)
        mapped = w.nbytes >= 1 << 20  # (small tensors are read)
        on_file = isinstance(a.base, memoryview) and isinstance(a.base.obj, mmap.mmap)
        assert on_file == mapped and a.flags.writeable != mapped
    # every optimization level (level 99 re-lays the weights out from the mapping) matches onnxruntime
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    want = ortref.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        np.testing.assert_allclose(ort.InferenceSession(path, so).run(None, {"X": x})[0], want, rtol=1e-4, atol=1e-4)
    # turned off: read into memory the arrays own
    monkeypatch.setenv("ONNXPY_MMAP_EXTERNAL", "0")
    m = load_model(path)
    for i, w in enumerate(ws):
        a = m.graph.initializers[f"w{i}"]
        np.testing.assert_array_equal(a, w)
        assert a.base is None


def test_external_data_misaligned_or_short_tensors_are_read(tmp_path):
    from onnxpy.ir.load import load_model

    # an offset that is no multiple of the element size can't be viewed in place: read instead
    w = np.arange(300_000, dtype=np.float32).reshape(600, 500)
    (tmp_path / "w.bin").write_bytes(b"\0" * 6 + w.tobytes())
    t = numpy_helper.from_array(np.zeros((1,), np.float32), "w0")
    t.ClearField("raw_data")
    t.dims[:] = list(w.shape)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "w.bin"), ("offset", "6"), ("length", str(w.nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph([helper.make_node("Identity", ["w0"], ["Y"])], "g", [],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [t])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    a = load_model(str(path)).graph.initializers["w0"]
    assert a.base is None
    np.testing.assert_array_equal(a, w)
    np.testing.assert_array_equal(ort.InferenceSession(str(path)).run(None, {})[0], w)
    # a data file shorter than the tensor is an error naming it, not a mapping past the end of the file
    (tmp_path / "w.bin").write_bytes(b"\0" * 6 + w.tobytes()[:-4096])
    with pytest.raises(Fail, match="w0"):
        ort.InferenceSession(str(path))


def test_modelproto_accepted(add_model_bytes, ones23):
    s = ort.InferenceSession(onnx.load_from_string(add_model_bytes))
    assert s.run(None, {"X": ones23, "Y": ones23})[0].sum() == 12


def test_ops_modules_all_import():
    from onnxpy.ops import load_all, load_errors

    load_all()
    assert load_errors == {}


def test_only_execute_path_to_fetches():
    nodes = [helper.make_node("Neg", ["X"], ["A"]), helper.make_node("Abs", ["Y"], ["B"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2]),
                                       helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2]),
                           helper.make_tensor_value_info("B", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = ort.InferenceSession(m.SerializeToString())
    ro = ort.RunOptions()
    ro.only_execute_path_to_fetches = True
    x = np.array([1, -2], np.float32)
    # Y is required by the model but not on the path to A: its wrong dtype is never touched by a kernel
    out = s.run(["A"], {"X": x, "Y": x}, ro)
    np.testing.assert_array_equal(out[0], -x)


def test_profiling_writes_onnxruntime_trace(tmp_path, add_model_bytes, ones23):
    import json

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof_")
    s = ort.InferenceSession(add_model_bytes, so)
    assert s.get_profiling_start_time_ns() > 0
    s.run(None, {"X": ones23, "Y": ones23})
    path = s.end_profiling()
    assert path.startswith(str(tmp_path / "prof_")) and path.endswith(".json")
    assert s.end_profiling() == ""
    events = json.load(open(path))
    names = [e["name"] for e in events]
    for expected in ("model_loading_array", "session_initialization", "model_run", "add_kernel_time"):
        assert expected in names
    node = next(e for e in events if e["name"] == "add_kernel_time")
    assert node["args"]["op_name"] == "Add" and node["args"]["input_type_shape"] == [{"float": [2, 3]}] * 2
    assert all(e["ph"] == "X" and {"ts", "dur", "pid", "tid", "cat"} <= set(e) for e in events)


def test_parallel_execution_mode_matches_sequential():
    rng = np.random.default_rng(0)
    nodes, outs = [], []
    for b in range(6):  # six independent branches joined by Sum
        nodes += [helper.make_node("MatMul", ["X", f"W{b}"], [f"m{b}"]), helper.make_node("Relu", [f"m{b}"], [f"r{b}"])]
        outs.append(f"r{b}")
    nodes.append(helper.make_node("Sum", outs, ["Y"]))
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), f"W{b}") for b in range(6)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, "K"])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 16])], inits)
    mb = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = rng.standard_normal((4, 16)).astype(np.float32)
    ref = ort.InferenceSession(mb).run(None, {"X": x})[0]
    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    so.inter_op_num_threads = 3
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(mb, so)
    for _ in range(20):
        np.testing.assert_allclose(s.run(None, {"X": x})[0], ref, rtol=1e-6)
    with pytest.raises(Fail, match="MatMul"):
        s.run(None, {"X": np.ones((4, 5), np.float32)})


def test_blas_threads_follow_intra_op_num_threads(add_model_bytes, ones23):
    from onnxpy.execution import threads

    if not threads.blas_available():
        pytest.skip("no controllable BLAS library loaded")
    before = threads.get_blas_threads()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ort.InferenceSession(add_model_bytes, so).run(None, {"X": ones23, "Y": ones23})
    assert threads.get_blas_threads() == 1
    threads.set_blas_threads(before)


def test_terminate_stops_an_endless_loop():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [])])
    g = helper.make_graph([helper.make_node("Loop", ["", "c", "v0"], ["v"], body=body)], "g",
                          [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                           helper.make_tensor_value_info("v0", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("v", TensorProto.FLOAT, [])],
                          [numpy_helper.from_array(np.array(1, np.float32), "one")])
    s = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    ro = ort.RunOptions()
    timer = threading.Timer(0.3, lambda: setattr(ro, "terminate", True))
    timer.start()
    with pytest.raises(Fail, match="terminate flag"):
        s.run(None, {"c": np.array(True), "v0": np.array(0, np.float32)}, ro)


def test_outputs_never_alias_initializers_or_feeds():
    W = numpy_helper.from_array(np.arange(6, dtype=np.float32), "W")
    nodes = [helper.make_node("Reshape", ["W", "shape"], ["A"]), helper.make_node("Identity", ["X"], ["B"]),
             helper.make_node("Transpose", ["X"], ["C"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "ABC"],
                          [W, numpy_helper.from_array(np.array([2, 3], np.int64), "shape")])
    s = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    x = np.ones((2, 3), np.float32)
    a, b, c = s.run(None, {"X": x})
    a[...] = -1
    b[...] = -1
    c[...] = -1
    assert (x == 1).all()
    a2, _, _ = s.run(None, {"X": x})
    np.testing.assert_array_equal(a2.reshape(-1), np.arange(6))


def test_negative_dim_value_is_a_free_dimension():
    X = helper.make_tensor_value_info("X", TensorProto.FLOAT, [-1, 3])
    Y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [-1, 3])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "g", [X], [Y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    a, b = _both(m.SerializeToString())
    assert a.get_inputs()[0].shape == b.get_inputs()[0].shape == [None, 3]
    assert a.run(None, {"X": np.ones((2, 3), np.float32)})[0].shape == (2, 3)


def test_sparse_tensor_feeds_like_onnxruntime():
    dense = np.array([[0, 2, 0], [3, 0, 0]], np.float32)
    coo = ort.SparseTensor.sparse_coo_from_numpy([2, 3], np.array([2, 3], np.float32), np.array([1, 3], np.int64))
    csr = ort.SparseTensor.sparse_csr_from_numpy([2, 3], np.array([2, 3], np.float32), np.array([1, 0], np.int64),
                                                  np.array([0, 1, 2], np.int64))
    for st in (coo, csr):
        np.testing.assert_array_equal(st.to_dense(), dense)
    assert coo.as_coo_view().indices().tolist() == [1, 3] and csr.dense_shape() == [2, 3]
    assert coo.data_type() == "sparse_tensor(float)"
    X = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "g", [X],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])])
    s = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    v = ort.OrtValue.ort_value_from_sparse_tensor(coo)
    assert v.is_sparse_tensor() and v.as_sparse_tensor() is coo
    np.testing.assert_array_equal(s.run(None, {"X": v})[0], dense)


def test_ir3_initializers_are_constants_not_overridable(tmp_path):
    # Before IR 4 every initializer is also listed as a graph input, yet it is a constant (onnxruntime's reading):
    # not among the inputs or the overridable initializers, not feedable, and free to be folded.
    w = numpy_helper.from_array(np.full((2, 2), 3.0, np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 2]),
                           helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 2])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)])
    m.ir_version = 3
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    s = ort.InferenceSession(m.SerializeToString(), so)
    assert [i.name for i in s.get_inputs()] == ["x"]
    assert s.get_overridable_initializers() == []
    x = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], x + 3)
    with pytest.raises(InvalidArgument, match="Invalid input name: w"):
        s.run(None, {"x": x, "w": x})
    saved = onnx.load(str(tmp_path / "opt.onnx"))
    onnx.checker.check_model(saved)  # IR 3 still lists its initializers among the inputs
    np.testing.assert_array_equal(ort.InferenceSession(saved.SerializeToString()).run(None, {"x": x})[0], x + 3)


def test_session_constants_read_only_but_user_arrays_untouched():
    # A session's constants are frozen (a kernel writing into one would raise instead of corrupting later runs);
    # an array the user hands over with add_initializer stays writeable for the user.
    w = numpy_helper.from_array(np.full((2, 2), 3.0, np.float32), "w")
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = ort.InferenceSession(m.SerializeToString())
    assert not s._state.model.graph.initializers["w"].flags.writeable
    mine = np.full((2, 2), 5.0, np.float32)
    so = ort.SessionOptions()
    so.add_initializer("w", ort.OrtValue.ortvalue_from_numpy(mine))
    s2 = ort.InferenceSession(m.SerializeToString(), so)
    x = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(s2.run(None, {"x": x})[0], x + 5)
    assert mine.flags.writeable
