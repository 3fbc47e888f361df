"""onnxpy.tools (bench, profile report), onnxpy.custom_ops and onnxpy.logging_utils."""

from __future__ import annotations

import io
import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy as ort
from onnxpy import custom_ops, logging_utils
from onnxpy.tools import bench, profile_report

DOM = "test.tools"


def _model(nodes, inputs, outputs, extra_opsets=((DOM, 1),), opset=17, initializers=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    return helper.make_model(g, opset_imports=ops)


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


@pytest.fixture
def small_model(tmp_path):
    """x[N,4] -> MatMul(W) -> Add(b) -> Relu -> y."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 3], rng.standard_normal(12).astype(np.float32).tolist())
    b = helper.make_tensor("b", TensorProto.FLOAT, [3], [0.1, -0.2, 0.3])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "b"], ["a"], name="add<&>"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    m = _model(nodes, [_vi("x", ["N", 4])], [_vi("y", ["N", 3])], extra_opsets=(), initializers=[w, b])
    path = tmp_path / "small.onnx"
    onnx.save(m, str(path))
    return str(path)


@pytest.fixture
def clean_registry():
    before = set(custom_ops.list_registered())
    yield
    for dom, op, since in set(custom_ops.list_registered()) - before:
        custom_ops.unregister(dom, op, since)


@pytest.fixture
def log_messages():
    msgs = []
    logging_utils.set_default_logger_callback(lambda *a: msgs.append(a), severity=0)
    yield msgs
    logging_utils.set_default_logger_callback(None)


# -- bench ------------------------------------------------------------------------------------------------------

def test_bench_runs_and_writes_json(small_model, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = bench.cli_main([small_model, "-r", "5", "-w", "1", "--shape", "x=3x4", "--json", str(out), "--no-progress"])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["inputs"]["x"] == {"shape": [3, 4], "dtype": "float32"}
    st = res["onnxpy"]
    assert st["runs"] == 5
    assert st["min_ms"] <= st["p50_ms"] <= st["p90_ms"] <= st["p99_ms"] <= st["max_ms"]
    text = capsys.readouterr().out
    assert "p50" in text and "onnxpy" in text


def test_bench_duration_and_dim(small_model, capsys):
    assert bench.cli_main([small_model, "-t", "0.2", "-w", "0", "--dim", "N=2", "--json", "-"]) == 0
    text = capsys.readouterr().out
    res = json.loads(text[text.index("{"):])
    assert res["inputs"]["x"]["shape"] == [2, 4] and res["onnxpy"]["runs"] >= 1


def test_bench_compare_onnxruntime(small_model, capsys):
    pytest.importorskip("onnxruntime")
    assert bench.cli_main([small_model, "-r", "3", "-w", "1", "--compare-onnxruntime", "--json", "-"]) == 0
    text = capsys.readouterr().out
    res = json.loads(text[text.index("{"):])
    assert res["onnxruntime"]["runs"] == 3
    assert set(res["ratio_onnxpy_over_onnxruntime"]) == {"mean_ms", "p50_ms", "p90_ms", "p99_ms"}
    assert res["max_abs_diff"]["y"] < 1e-5
    assert "onnxpy / onnxruntime" in text


@pytest.mark.parametrize("argv, code", [
    (["--shape", "nope=1x4"], 2),
    (["--shape", "x=1xA"], 2),
    (["--shape", "x=2x5"], 2),          # dim 1 is fixed to 4
    (["--shape", "x=2"], 2),            # rank mismatch
    (["-r", "0"], 2),
    (["--opt-level", "fast"], 2),
    (["--input", "x"], 2),
])
def test_bench_usage_errors(small_model, argv, code, capsys):
    assert bench.cli_main([small_model, *argv]) == code
    assert "error" in capsys.readouterr().err.lower()


def test_bench_missing_model(tmp_path, capsys):
    assert bench.cli_main([str(tmp_path / "missing.onnx"), "-r", "1"]) == 1
    assert "not found" in capsys.readouterr().err


def test_bench_input_file(small_model, tmp_path):
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    out = tmp_path / "r.json"
    assert bench.cli_main([small_model, "-r", "2", "--input", f"x={tmp_path / 'x.npy'}", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["inputs"]["x"]["shape"] == [2, 4]


def test_parse_shape():
    assert bench.parse_shape("data=1x3x224x224") == ("data", (1, 3, 224, 224))
    assert bench.parse_shape("a=2,3") == ("a", (2, 3))
    assert bench.parse_shape("s=") == ("s", ())
    with pytest.raises(bench.UsageError):
        bench.parse_shape("nodims")
    with pytest.raises(bench.UsageError):
        bench.parse_shape("a=-1x2")


def test_random_values_per_type():
    rng = np.random.default_rng(0)
    assert bench.random_value("tensor(int64)", (2, 3), rng).dtype == np.int64
    assert bench.random_value("tensor(bool)", (2,), rng).dtype == np.bool_
    assert bench.random_value("tensor(float16)", (2,), rng).dtype == np.float16
    s = bench.random_value("tensor(string)", (2, 2), rng)
    assert s.dtype == object and s.shape == (2, 2)
    seq = bench.random_value("seq(tensor(double))", (3,), rng)
    assert isinstance(seq, list) and seq[0].dtype == np.float64
    assert bench.random_value("optional(tensor(uint8))", (1,), rng).dtype == np.uint8
    with pytest.raises(bench.UsageError):
        bench.random_value("map(int64,tensor(float))", (), rng)


def test_make_inputs_for_many_types():
    nodes = [helper.make_node("Identity", [n], [n + "_o"]) for n in ("f", "i", "b", "s")]
    m = _model(nodes, [_vi("f", ["B", 2]), _vi("i", [3], TensorProto.INT32), _vi("b", [], TensorProto.BOOL),
                       _vi("s", [2], TensorProto.STRING)],
               [_vi(n + "_o", None, t) for n, t in (("f", 1), ("i", 6), ("b", 9), ("s", 8))], extra_opsets=())
    sess = ort.InferenceSession(m.SerializeToString())
    notes = []
    feeds = bench.make_inputs(sess, notes=notes)
    assert feeds["f"].shape == (1, 2) and feeds["i"].dtype == np.int32 and feeds["b"].shape == ()
    assert notes and "f[0]" in notes[0]
    outs = sess.run(None, feeds)
    assert outs[3].tolist() == feeds["s"].tolist()


def test_percentiles():
    st = bench.percentiles([0.001] * 9 + [0.011])
    assert st["runs"] == 10 and st["p50_ms"] == pytest.approx(1.0) and st["max_ms"] == pytest.approx(11.0)
    assert st["mean_ms"] == pytest.approx(2.0) and st["throughput_per_s"] == pytest.approx(500.0)
    assert bench.percentiles([]) == {"runs": 0}


def test_progress_bar_draws_when_enabled():
    buf = io.StringIO()
    bar = bench.ProgressBar(4, "x", enabled=True, stream=buf)
    for i in range(1, 5):
        bar.update(i)
    bar.close()
    text = buf.getvalue()
    assert "100.0%" in text and text.endswith("\n") and "#" * 30 in text
    silent = io.StringIO()
    bench.ProgressBar(4, "x", stream=silent).update(2)  # not a tty -> nothing
    assert silent.getvalue() == ""


def test_info_lines(tmp_path, clean_registry):
    nodes = [helper.make_node("Mystery", ["x"], ["t"], domain=DOM), helper.make_node("Relu", ["t"], ["y"])]
    m = _model(nodes, [_vi("x", ["batch", 4])], [_vi("y", None)])
    path = str(tmp_path / "m.onnx")
    onnx.save(m, path)
    lines = bench.info_lines(path)
    assert any("batch" in line and "--shape" in line for line in lines)
    assert any(f"{DOM}:Mystery" in line for line in lines if line.startswith("ops without"))
    custom_ops.register(DOM, "Mystery", lambda x: x)
    assert any(f"{DOM}:Mystery" in line for line in bench.info_lines(path) if line.startswith("custom ops"))


# -- profile report ---------------------------------------------------------------------------------------------

def test_profile_cli_writes_html(small_model, tmp_path, capsys):
    report = tmp_path / "rep.html"
    argv = [small_model, "-o", str(report), "-r", "3", "-w", "1", "--png", "--opt-level", "disable"]
    assert profile_report.cli_main(argv) == 0
    text = report.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("<svg") >= 3
    assert "<script" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    for op in ("MatMul", "Add", "Relu"):
        assert op in text
    assert "add&lt;&amp;&gt;" in text and "add<&>" not in text  # node names are escaped
    assert "float[" in text  # shapes of the slowest nodes
    out = capsys.readouterr().out
    assert "report:" in out and "png:" in out
    trace = next(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("trace:"))
    summary = profile_report.summarize(profile_report.load_trace(trace), skip_runs=1)
    assert summary["runs"] == 3
    assert {o["op_type"] for o in summary["op_types"]} == {"MatMul", "Add", "Relu"}
    assert all(o["calls"] == 3 for o in summary["op_types"])
    assert sum(o["percent"] for o in summary["op_types"]) == pytest.approx(100.0, abs=0.01)
    # re-render from the trace
    rep2 = tmp_path / "from_trace.html"
    assert profile_report.cli_main(["--from-trace", trace, "-o", str(rep2)]) == 0
    assert "MatMul" in rep2.read_text()


def test_profile_cli_errors(tmp_path, capsys):
    assert profile_report.cli_main([]) == 2
    assert profile_report.cli_main([str(tmp_path / "missing.onnx")]) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1}')
    assert profile_report.cli_main(["--from-trace", str(bad), "-o", str(tmp_path / "x.html")]) == 0  # empty report
    bad.write_text("not json")
    assert profile_report.cli_main(["--from-trace", str(bad)]) == 1


def test_svg_bar_chart_and_empty_summary():
    svg = profile_report.svg_bar_chart([("a<b", 2.0, None, "tip"), ("c", 1.0, "#000", None)], title="T&")
    assert svg.startswith("<svg") and "a&lt;b" in svg and "T&amp;" in svg and svg.count("<rect") == 2
    assert "no data" in profile_report.svg_bar_chart([])
    html_text = profile_report.render_html(profile_report.summarize([]))
    assert "</html>" in html_text


def test_profile_onnxruntime_trace(small_model, tmp_path):
    ort_rt = pytest.importorskip("onnxruntime")
    so = ort_rt.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ortprof_")
    s = ort_rt.InferenceSession(small_model, so, providers=["CPUExecutionProvider"])
    s.run(None, {"x": np.ones((2, 4), np.float32)})
    summary = profile_report.summarize(profile_report.load_trace(s.end_profiling()))
    assert summary["nodes"] and summary["runs"] == 1


# -- custom ops -------------------------------------------------------------------------------------------------

def _scaled_model(**attrs):
    node = helper.make_node("Scaled", ["x"], ["y"], domain=DOM, name="scaled", **attrs)
    return _model([node], [_vi("x", [3])], [_vi("y", [3])])


def test_custom_op_receives_attributes(clean_registry):
    seen = {}

    @custom_ops.register(DOM, "Scaled")
    def scaled(x, *, alpha=1.0, mode="mul", _node_name=None):
        seen.update(alpha=alpha, mode=mode, name=_node_name)
        return x * alpha if mode == "mul" else x + alpha

    x = np.array([1, 2, 3], np.float32)
    y = ort.InferenceSession(_scaled_model(alpha=3.0, mode="add").SerializeToString()).run(None, {"x": x})[0]
    assert y.tolist() == [4, 5, 6] and seen == {"alpha": 3.0, "mode": "add", "name": "scaled"}
    y = ort.InferenceSession(_scaled_model().SerializeToString()).run(None, {"x": x})[0]  # defaults
    assert y.tolist() == [1, 2, 3]


def test_custom_op_kwargs_and_plain_callables(clean_registry):
    got = {}

    def anyattrs(x, **kw):
        got.update(kw)
        return x

    so = ort.SessionOptions()
    so.register_custom_op(DOM, "Scaled", anyattrs)
    ort.InferenceSession(_scaled_model(alpha=2.0, names=["a", "b"]).SerializeToString(), so).run(
        None, {"x": np.zeros(3, np.float32)})
    assert got == {"alpha": 2.0, "names": ["a", "b"]}
    so = ort.SessionOptions()
    so.register_custom_op(DOM, "Scaled", lambda x: x + 1)  # no attributes passed to a plain lambda
    y = ort.InferenceSession(_scaled_model(alpha=2.0).SerializeToString(), so).run(None, {"x": np.zeros(3, np.float32)})
    assert y[0].tolist() == [1, 1, 1]


def test_session_registration_wins_over_global(clean_registry):
    custom_ops.register(DOM, "Scaled", lambda x: x + 100)
    so = ort.SessionOptions()
    custom_ops.add_to_session_options(so, DOM, "Scaled", lambda x: x - 100)
    x = np.zeros(3, np.float32)
    m = _scaled_model().SerializeToString()
    assert ort.InferenceSession(m, so).run(None, {"x": x})[0].tolist() == [-100] * 3
    assert ort.InferenceSession(m).run(None, {"x": x})[0].tolist() == [100] * 3


def test_custom_op_versions_and_temporary_registration(clean_registry):
    custom_ops.register(DOM, "Scaled", lambda x: x + 1, since=1)
    custom_ops.register(DOM, "Scaled", lambda x: x + 2, since=3)
    x = np.zeros(3, np.float32)
    for opset, want in ((1, 1), (2, 1), (3, 2), (9, 2)):
        m = _model([helper.make_node("Scaled", ["x"], ["y"], domain=DOM)], [_vi("x", [3])], [_vi("y", [3])],
                   extra_opsets=((DOM, opset),))
        assert ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0].tolist() == [want] * 3
    with custom_ops.registered(DOM, "Scaled", lambda x: x + 7):
        assert custom_ops.lookup(DOM, "Scaled", 1).fn(0) == 7
    assert custom_ops.lookup(DOM, "Scaled", 1).fn(0) == 1 and custom_ops.lookup(DOM, "Scaled", 5).fn(0) == 2
    assert custom_ops.unregister(DOM, "Scaled", 3) and not custom_ops.unregister(DOM, "Scaled", 3)
    assert custom_ops.unregister(DOM, "Scaled") and custom_ops.lookup(DOM, "Scaled") is None


def test_custom_op_bad_registration():
    with pytest.raises(TypeError):
        custom_ops.register(DOM, "X", 42)
    with pytest.raises(ValueError):
        custom_ops.register(DOM, "", lambda x: x)
    with pytest.raises(TypeError):
        custom_ops.register(DOM, "X", lambda x: x, shape_fn="nope")
    with pytest.raises(TypeError):
        custom_ops.register(None, "X", lambda x: x)
    assert custom_ops.lookup(DOM, "X") is None


def test_custom_op_error_names_node(clean_registry):
    def boom(x):
        raise ValueError("bad value")

    custom_ops.register(DOM, "Scaled", boom)
    sess = ort.InferenceSession(_scaled_model().SerializeToString())
    with pytest.raises(ort.Fail, match="scaled.*bad value"):
        sess.run(None, {"x": np.zeros(3, np.float32)})


def test_custom_op_in_profile_and_optimized_model(clean_registry, tmp_path):
    custom_ops.register(DOM, "Scaled", lambda x, *, alpha=1.0: x * alpha)
    nodes = [helper.make_node("Identity", ["x"], ["i"]),
             helper.make_node("Scaled", ["i"], ["s"], domain=DOM, name="scaled", alpha=2.0),
             helper.make_node("Relu", ["s"], ["y"])]
    m = _model(nodes, [_vi("x", [3])], [_vi("y", [3])])
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p_")
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = ort.InferenceSession(m.SerializeToString(), so)
    assert sess.run(None, {"x": np.array([-1, 1, 2], np.float32)})[0].tolist() == [0, 2, 4]
    events = json.load(open(sess.end_profiling()))
    assert any(e["cat"] == "Node" and e["args"]["op_name"] == "Scaled" for e in events)
    saved = onnx.load(str(tmp_path / "opt.onnx"))
    node = next(n for n in saved.graph.node if n.op_type == "Scaled")
    assert node.domain == DOM and helper.get_attribute_value(node.attribute[0]) == pytest.approx(2.0)
    assert any(o.domain == DOM for o in saved.opset_import)
    y = ort.InferenceSession(str(tmp_path / "opt.onnx")).run(None, {"x": np.array([1, 2, 3], np.float32)})[0]
    assert y.tolist() == [2, 4, 6]


def test_custom_op_inside_subgraph(clean_registry):
    custom_ops.register(DOM, "Scaled", lambda x, *, alpha=1.0: x * alpha)
    then_g = helper.make_graph([helper.make_node("Scaled", ["x"], ["t"], domain=DOM, alpha=5.0)], "then", [],
                               [_vi("t", [3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e", [3])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    m = _model([node], [_vi("c", [], TensorProto.BOOL), _vi("x", [3])], [_vi("y", [3])])
    sess = ort.InferenceSession(m.SerializeToString())
    x = np.ones(3, np.float32)
    assert sess.run(None, {"c": np.array(True), "x": x})[0].tolist() == [5, 5, 5]
    assert sess.run(None, {"c": np.array(False), "x": x})[0].tolist() == [1, 1, 1]


def test_custom_op_overriding_builtin_warns(clean_registry, log_messages):
    custom_ops.register("", "Relu", lambda x: np.full_like(x, 7))
    assert any(s == 2 and "overrides the built-in" in m for s, _, _, _, m in log_messages)
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])], extra_opsets=())
    assert ort.InferenceSession(m.SerializeToString()).run(None, {"x": np.zeros(2, np.float32)})[0].tolist() == [7, 7]


def test_infer_shapes_with_shape_fn(clean_registry):
    def shape_fn(x, *, repeats=1):
        return [(np.float64, (x.shape[0], x.shape[1] * repeats))]

    custom_ops.register(DOM, "Tile2", lambda x, *, repeats=1: np.tile(x, (1, repeats)).astype(np.float64),
                        shape_fn=shape_fn)
    nodes = [helper.make_node("Tile2", ["x"], ["t"], domain=DOM, repeats=3),
             helper.make_node("Relu", ["t"], ["y"])]
    m = _model(nodes, [_vi("x", ["N", 2])], [_vi("y", None, TensorProto.DOUBLE)])
    inferred = custom_ops.infer_shapes(m)
    vi = {v.name: v for v in inferred.graph.value_info}
    t = vi["t"].type.tensor_type
    assert t.elem_type == TensorProto.DOUBLE
    assert [d.dim_param or d.dim_value for d in t.shape.dim] == ["N", 6]
    y = ort.InferenceSession(m.SerializeToString()).run(None, {"x": np.ones((2, 2), np.float32)})[0]
    assert y.shape == (2, 6) and y.dtype == np.float64


# -- logging ----------------------------------------------------------------------------------------------------

def _identity_model():
    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Relu", ["i"], ["y"])]
    return _model(nodes, [_vi("x", [2])], [_vi("y", [2])], extra_opsets=()).SerializeToString()


def test_severity_mapping_and_validation():
    assert [logging_utils.to_python_level(s) for s in range(5)] == [10, 20, 30, 40, 50]
    assert [logging_utils.severity_of(lv) for lv in (5, 10, 20, 25, 30, 40, 50, 60)] == [0, 0, 1, 1, 2, 3, 4, 4]
    with pytest.raises(ValueError):
        logging_utils.set_default_logger_severity(5)
    with pytest.raises(TypeError):
        logging_utils.set_default_logger_callback("not callable")
    with pytest.raises(ValueError):
        logging_utils.set_default_logger_callback(print, severity=-1)


def test_default_severity_is_shared_with_onnxpy():
    old = ort._logger_severity
    try:
        logging_utils.set_default_logger_severity(3)
        assert ort._logger_severity == 3 and logging_utils.get_default_logger_severity() == 3
        ort.set_default_logger_severity(1)
        assert logging_utils.effective_severity() == 1
    finally:
        logging_utils.set_default_logger_severity(old)


def test_callback_gets_optimizer_messages_at_verbose(log_messages):
    so = ort.SessionOptions()
    with logging_utils.session_scope(so):
        ort.InferenceSession(_identity_model(), so)
    assert any(s == 0 and cat == "onnxpy.optimizer" and "EliminateIdentity" in m
               for s, cat, _, _, m in log_messages), log_messages


def test_session_severity_filters(log_messages):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.logid = "quiet"
    with logging_utils.session_scope(so):
        assert logging_utils.effective_severity() == 3
        ort.InferenceSession(_identity_model(), so)
        logging_utils.get_logger("session").warning("dropped")
        logging_utils.get_logger("session").error("kept")
    assert [m for *_, m in log_messages] == ["kept"]
    assert log_messages[0][2] == "quiet" and log_messages[0][0] == 3
    ro = ort.RunOptions()
    ro.log_severity_level = 0
    ro.logid = "run1"
    with logging_utils.session_scope(so, ro):
        logging_utils.get_logger("session").debug("verbose in run")
    assert log_messages[-1][2] == "run1" and log_messages[-1][0] == 0
    assert logging_utils.effective_severity() == 0  # back to the callback's default


def test_scope_for_is_cheap_when_nothing_set():
    so, ro = ort.SessionOptions(), ort.RunOptions()
    assert logging_utils.scope_for(so, ro) is logging_utils.scope_for(None, None)
    ro.log_severity_level = 1
    assert logging_utils.scope_for(so, ro) is not logging_utils.scope_for(None, None)
    so.log_severity_level = 9
    with pytest.raises(ValueError, match="log_severity_level"):
        with logging_utils.session_scope(so):
            pass


def test_config_entries_checked(log_messages):
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.intra_op.allow_spining", "0")
    so.add_session_config_entry("optimization.disable_specified_optimizers", "")
    so.add_session_config_entry("onnxpy.anything", "1")
    found = logging_utils.check_config_entries(so)
    assert [s for s, _ in found] == [1, 2]
    assert "no effect" in found[0][1] and "allow_spining" in found[1][1]
    logging_utils.register_config_keys("session.allow_spining_custom")
    so2 = ort.SessionOptions()
    so2.add_session_config_entry("session.allow_spining_custom", "1")
    assert logging_utils.check_config_entries(so2) == []


def test_callback_exceptions_are_swallowed():
    def bad(*a):
        raise RuntimeError("callback failure")

    logging_utils.set_default_logger_callback(bad, severity=0)
    try:
        logging_utils.get_logger("session").warning("x")
        ort.InferenceSession(_identity_model()).run(None, {"x": np.zeros(2, np.float32)})
    finally:
        logging_utils.set_default_logger_callback(None)


def test_stderr_format_without_handlers(capsys, monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    logging_utils.get_logger("session").warning("printed %d", 5)
    err = capsys.readouterr().err
    assert "[W:onnxpy:Default," in err and "printed 5" in err


def test_session_creation_wiring(log_messages):
    """Needs the core hook: SessionState wraps construction in logging_utils.session_scope(options, check_config)."""
    import inspect

    from onnxpy import session_build

    if "logging_utils" not in inspect.getsource(session_build):
        pytest.skip("session_build does not call logging_utils.session_scope yet")
    so = ort.SessionOptions()
    so.add_session_config_entry("session.typo_key", "1")
    ort.InferenceSession(_identity_model(), so)
    assert any("typo_key" in m for *_, m in log_messages)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    del log_messages[:]
    ort.InferenceSession(_identity_model(), so)
    assert not [m for s, *_, m in log_messages if s < 3]


def test_corpus_bench_repeat_keeps_each_runtimes_fastest():
    """bench/bench.py --repeat: per runtime, the repeat with the lower median (its RSS with it) and the lowest
    session creation; a failed repeat never replaces a measured one."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "bench.py")
    spec = importlib.util.spec_from_file_location("corpus_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = {"median_ms": 5.0, "create_ms": 90.0, "peak_rss_mb": 100.0, "runs": 20}
    b = {"median_ms": 4.0, "create_ms": 120.0, "peak_rss_mb": 110.0, "runs": 20}
    best = mod._best(mod._best(None, a), b)
    assert best == {"median_ms": 4.0, "create_ms": 90.0, "peak_rss_mb": 110.0, "runs": 20}
    assert mod._best(best, {"error": "timeout"}) == best
    assert mod._best({"error": "timeout"}, a) == a
