"""Optimizer passes: each rewrite on a small graph, results unchanged, saved models valid in onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxpy as ort

LEVELS = [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _optimized(model, level, tmp_path, **kw):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    path = tmp_path / f"opt_{int(level)}.onnx"
    so.optimized_model_filepath = str(path)
    sess = ort.InferenceSession(model.SerializeToString(), so, **kw)
    return sess, onnx.load(str(path))


def _conv_bn_model():
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(f(4, 3, 3, 3), "W"), numpy_helper.from_array(f(4), "B"),
             numpy_helper.from_array(f(4), "s"), numpy_helper.from_array(f(4), "b"),
             numpy_helper.from_array(f(4), "m"), numpy_helper.from_array(np.abs(f(4)) + 0.5, "v"),
             numpy_helper.from_array(np.array([2.0], np.float32), "c1"),
             numpy_helper.from_array(np.array([3.0], np.float32), "c2")]
    nodes = [
        helper.make_node("Identity", ["X"], ["Xi"]),
        helper.make_node("Conv", ["Xi", "W", "B"], ["C"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["C", "s", "b", "m", "v"], ["N"]),
        helper.make_node("Dropout", ["N"], ["D"]),
        helper.make_node("Add", ["c1", "c2"], ["c3"]),
        helper.make_node("Mul", ["D", "c3"], ["Y"]),
        helper.make_node("Neg", ["c1"], ["unused"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 8, 8])],
                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)


@pytest.mark.parametrize("level", LEVELS)
def test_levels_keep_results_and_save_valid_models(level, tmp_path):
    ortref = pytest.importorskip("onnxruntime")
    model = _conv_bn_model()
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    ref = ortref.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    sess, saved = _optimized(model, level, tmp_path)
    np.testing.assert_allclose(sess.run(None, {"X": x})[0], ref[0], rtol=1e-4, atol=1e-5)
    onnx.checker.check_model(saved)
    ops = [n.op_type for n in saved.graph.node]
    if level == 0:
        assert ops == [n.op_type for n in model.graph.node]
    else:  # BN folded into the Conv, then ConvMulFusion folds the constant Mul into its weights
        assert ops == ["Conv"], ops
        # the saved model also runs in onnxruntime with the same results
        theirs = ortref.InferenceSession(saved.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(theirs.run(None, {"X": x})[0], ref[0], rtol=1e-4, atol=1e-5)


def test_disabled_optimizers(tmp_path):
    model = _conv_bn_model()
    _, saved = _optimized(model, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, tmp_path,
                          disabled_optimizers=["ConvBNFusion"])
    assert "BatchNormalization" in [n.op_type for n in saved.graph.node]
    so = ort.SessionOptions()
    so.add_session_config_entry("optimization.disable_specified_optimizers", "ConstantFolding,EliminateIdentity")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "o.onnx")
    ort.InferenceSession(model.SerializeToString(), so)
    ops = [n.op_type for n in onnx.load(str(tmp_path / "o.onnx")).graph.node]
    assert "Identity" in ops and "Add" in ops


def test_dropout_with_used_mask_is_kept(tmp_path):
    model = _model([helper.make_node("Dropout", ["X"], ["Y", "M"])],
                   [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2]),
                    helper.make_tensor_value_info("M", TensorProto.BOOL, [2])])
    sess, saved = _optimized(model, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, tmp_path)
    assert [n.op_type for n in saved.graph.node] == ["Dropout"]
    y, m = sess.run(None, {"X": np.array([1, 2], np.float32)})
    assert m.dtype == bool and m.all()


def test_identity_feeding_graph_output_and_subgraph(tmp_path):
    then = helper.make_graph([helper.make_node("Identity", ["T"], ["o"])], "then", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])])
    els = helper.make_graph([helper.make_node("Neg", ["T"], ["o2"])], "else", [],
                            [helper.make_tensor_value_info("o2", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Identity", ["X"], ["T"]),
             helper.make_node("If", ["c"], ["Y"], then_branch=then, else_branch=els),
             helper.make_node("Identity", ["Y"], ["Z"])]
    model = _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2]),
                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                   [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2])])
    sess, _ = _optimized(model, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, tmp_path)
    x = np.array([1, -2], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"X": x, "c": np.array(True)})[0], x)
    np.testing.assert_array_equal(sess.run(None, {"X": x, "c": np.array(False)})[0], -x)


def test_constant_folding_respects_overridable_initializers(tmp_path):
    W = numpy_helper.from_array(np.ones(2, np.float32), "W")
    model = _model([helper.make_node("Neg", ["W"], ["nW"]), helper.make_node("Add", ["X", "nW"], ["Y"])],
                   [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2]),
                    helper.make_tensor_value_info("W", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])], [W])
    sess, saved = _optimized(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, tmp_path)
    assert "Neg" in [n.op_type for n in saved.graph.node]
    x = np.zeros(2, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"X": x, "W": np.full(2, 5, np.float32)})[0], [-5, -5])


def test_random_ops_not_folded(tmp_path):
    model = _model([helper.make_node("RandomUniform", [], ["R"], shape=[3]),
                    helper.make_node("Add", ["X", "R"], ["Y"])],
                   [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])])
    _, saved = _optimized(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, tmp_path)
    assert "RandomUniform" in [n.op_type for n in saved.graph.node]


def _ln_gelu_model(opset=13, half_first=False):
    """SkipLayerNorm and GELU decomposed; ``half_first``: GELU as x * (0.5 * (1 + erf)), as torch.onnx's dynamo
    exporter writes it, else (x * (1 + erf)) * 0.5."""
    rng = np.random.default_rng(0)
    H = 8
    inits = [numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), "beta"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(rng.standard_normal((H, H)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), "bias")]
    nodes = [
        helper.make_node("Add", ["X", "S"], ["xs"]),
        helper.make_node("ReduceMean", ["xs"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["xs", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Mul", ["n", "gamma"], ["ng"]),
        helper.make_node("Add", ["ng", "beta"], ["ln"]),
        helper.make_node("MatMul", ["ln", "W"], ["mm"]),
        helper.make_node("Add", ["mm", "bias"], ["h"]),
        helper.make_node("Div", ["h", "sqrt2"], ["hd"]),
        helper.make_node("Erf", ["hd"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["e1"]),
    ] + ([helper.make_node("Mul", ["half", "e1"], ["he"]), helper.make_node("Mul", ["h", "he"], ["Y"])] if half_first
         else [helper.make_node("Mul", ["h", "e1"], ["he"]), helper.make_node("Mul", ["he", "half"], ["Y"])])
    return _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", "S", H]),
                          helper.make_tensor_value_info("S", TensorProto.FLOAT, ["B", "S", H])],
                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["B", "S", H])], inits, opset=opset)


@pytest.mark.parametrize("half_first", [False, True])
@pytest.mark.parametrize("level", LEVELS)
def test_layernorm_gelu_fusions(level, half_first, tmp_path):
    ortref = pytest.importorskip("onnxruntime")
    model = _ln_gelu_model(half_first=half_first)
    rng = np.random.default_rng(2)
    feed = {"X": rng.standard_normal((2, 5, 8)).astype(np.float32),
            "S": rng.standard_normal((2, 5, 8)).astype(np.float32)}
    ref = ortref.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    sess, saved = _optimized(model, level, tmp_path)
    np.testing.assert_allclose(sess.run(None, feed)[0], ref, rtol=1e-4, atol=1e-5)
    ops = [(n.domain, n.op_type) for n in saved.graph.node]
    if level == 1:
        assert ops == [("", "Add"), ("", "LayerNormalization"), ("", "MatMul"), ("", "Add"), ("", "Div"),
                       ("", "Erf"), ("", "Add"), ("", "Mul"), ("", "Mul")], ops
    elif level >= 2:
        assert ops == [("com.microsoft", "SkipLayerNormalization"), ("", "MatMul"),
                       ("com.microsoft", "BiasGelu")], ops
    if level > 0:
        theirs = ortref.InferenceSession(saved.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(theirs.run(None, feed)[0], ref, rtol=1e-4, atol=1e-5)


def test_constants_folded_inside_subgraphs(tmp_path):
    """Work on outer-scope constants inside an If branch is folded into the branch (as exporters emit for LSTMs)."""
    W = numpy_helper.from_array(np.arange(8, dtype=np.float32), "W")
    starts = numpy_helper.from_array(np.array([2], np.int64), "starts")
    ends = numpy_helper.from_array(np.array([6], np.int64), "ends")
    then = helper.make_graph([helper.make_node("Slice", ["W", "starts", "ends"], ["ws"]),
                              helper.make_node("Add", ["X", "ws"], ["o"])], "then", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, [4])])
    els = helper.make_graph([helper.make_node("Neg", ["X"], ["o2"])], "else", [],
                            [helper.make_tensor_value_info("o2", TensorProto.FLOAT, [4])])
    model = _model([helper.make_node("If", ["c"], ["Y"], then_branch=then, else_branch=els)],
                   [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4]),
                    helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])], [W, starts, ends])
    sess, saved = _optimized(model, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, tmp_path)
    then_saved = next(a.g for a in saved.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then_saved.node] == ["Add"]
    x = np.ones(4, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"X": x, "c": np.array(True)})[0], x + [2, 3, 4, 5])
    np.testing.assert_array_equal(sess.run(None, {"X": x, "c": np.array(False)})[0], -x)
    ortref = pytest.importorskip("onnxruntime")
    theirs = ortref.InferenceSession(saved.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(theirs.run(None, {"X": x, "c": np.array(True)})[0], x + [2, 3, 4, 5])


@pytest.mark.parametrize("shape,c_shape,rank_known", [
    ((2, 4, 5, 6), (4, 1, 1), False), ((2, 4, 5, 6), (1, 4, 1, 1), True), ((2, 4, 7), (4, 1), True),
    ((2, 4, 5, 6), (1,), False)])
def test_batchnorm_affine_fusion(tmp_path, shape, c_shape, rank_known):
    # BN -> Mul(c) -> Add(d) on a concatenated input (no Conv to fold into): one BN with adjusted scale and bias
    ortref = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(3)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    C = shape[1]
    inits = [numpy_helper.from_array(f(C), "s"), numpy_helper.from_array(f(C), "b"),
             numpy_helper.from_array(f(C), "m"), numpy_helper.from_array(np.abs(f(C)) + 0.5, "v"),
             numpy_helper.from_array(f(*c_shape), "c"), numpy_helper.from_array(f(*c_shape), "d")]
    half = list(shape)
    half[1] //= 2
    nodes = [helper.make_node("Concat", ["X1", "X2"], ["X"], axis=1),
             helper.make_node("BatchNormalization", ["X", "s", "b", "m", "v"], ["N"]),
             helper.make_node("Mul", ["N", "c"], ["M"]),
             helper.make_node("Add", ["d", "M"], ["A"]),
             helper.make_node("Relu", ["A"], ["Y"])]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, half if rank_known else None) for n in ("X1", "X2")]
    model = _model(nodes, ins, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    feeds = {"X1": f(*half), "X2": f(*half)}
    ref = ortref.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    sess, saved = _optimized(model, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, tmp_path)
    np.testing.assert_allclose(sess.run(None, feeds)[0], ref[0], rtol=1e-5, atol=1e-5)
    ops = [n.op_type for n in saved.graph.node]
    if rank_known or c_shape == (1,):
        assert ops == ["Concat", "BatchNormalization", "Relu"], ops
    else:  # the constant's alignment with the channel axis needs the input's rank
        assert "Mul" in ops and "Add" in ops


@pytest.mark.parametrize("group,kernel,a_shape,b_shape,with_bias", [
    (1, 1, (1,), (1,), True), (1, 3, (1,), None, False), (2, 1, (1, 4, 1, 1), (4, 1, 1), True),
    (2, 3, None, (1,), True), (1, 2, (4, 1, 1), (1, 4, 1, 1), False)])
def test_conv_input_affine_fusion(tmp_path, group, kernel, a_shape, b_shape, with_bias):
    # Mul(a) -> Add(b) -> unpadded Conv folds into the Conv's weights and bias; a padded Conv is left alone
    ortref = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(5)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(f(6, 4 // group, kernel, kernel), "W")]
    nodes, x = [], "X"
    if a_shape is not None:
        inits.append(numpy_helper.from_array(f(*a_shape), "a"))
        nodes.append(helper.make_node("Mul", [x, "a"], ["M"]))
        x = "M"
    if b_shape is not None:
        inits.append(numpy_helper.from_array(f(*b_shape), "b"))
        nodes.append(helper.make_node("Add", ["b", x], ["A"]))
        x = "A"
    conv_in = [x, "W"]
    if with_bias:
        inits.append(numpy_helper.from_array(f(6), "B"))
        conv_in.append("B")
    for pads in ([0, 0, 0, 0], [1, 1, 1, 1]):
        conv = helper.make_node("Conv", conv_in, ["Y"], group=group, pads=pads, strides=[1, 2])
        model = _model(nodes + [conv], [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4, 7, 8])],
                       [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
        feeds = {"X": f(2, 4, 7, 8)}
        ref = ortref.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        sess, saved = _optimized(model, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, tmp_path)
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref[0], rtol=1e-4, atol=1e-4)
        ops = [n.op_type for n in saved.graph.node]
        assert ops == (["Conv"] if pads == [0, 0, 0, 0] else [n.op_type for n in nodes] + ["Conv"]), ops


def test_gelu_half_first_needs_the_same_x(tmp_path):
    """x * (0.5 * (1 + erf(x / sqrt2))) fuses only when the outer factor is the erf's own input."""
    model = _ln_gelu_model(half_first=True)
    last = model.graph.node[-1]
    last.input[0] = "X"  # another tensor of the same shape
    _, saved = _optimized(model, 2, tmp_path)
    assert "Erf" in [n.op_type for n in saved.graph.node]


def _noop_chain(x, tag):
    """Nodes that are no-ops on the float tensor ``x`` (Dropout, a full-range Slice, a float -> float Cast), then
    Neg: (nodes, output name, constants the Slice reads, value_info declaring the Cast input's type)."""
    c = [numpy_helper.from_array(np.array([0], np.int64), f"{tag}_s"),
         numpy_helper.from_array(np.array([2 ** 63 - 1], np.int64), f"{tag}_e"),
         numpy_helper.from_array(np.array([0], np.int64), f"{tag}_a")]
    nodes = [helper.make_node("Dropout", [x], [f"{tag}_d"]),
             helper.make_node("Slice", [f"{tag}_d", f"{tag}_s", f"{tag}_e", f"{tag}_a"], [f"{tag}_sl"]),
             helper.make_node("Cast", [f"{tag}_sl"], [f"{tag}_c"], to=TensorProto.FLOAT),
             helper.make_node("Neg", [f"{tag}_c"], [f"{tag}_o"])]
    vi = [helper.make_tensor_value_info(f"{tag}_sl", TensorProto.FLOAT, [4])]
    return nodes, f"{tag}_o", c, vi


def test_level_passes_run_inside_if_and_loop_bodies(tmp_path):
    """Like onnxruntime's transformers, the level's passes rewrite If branches and Loop bodies (not only constant
    folding there): no-op Dropout / Slice / Cast disappear inside them, values a nested subgraph reads are renamed
    there too, and results and the saved model (valid in onnxruntime) are unchanged."""
    t_nodes, t_out, t_c, t_vi = _noop_chain("X", "t")
    then = helper.make_graph(t_nodes, "then", [], [helper.make_tensor_value_info(t_out, TensorProto.FLOAT, [4])],
                             t_c, value_info=t_vi)
    els = helper.make_graph([helper.make_node("Identity", ["X"], ["e_o"])], "else", [],
                            [helper.make_tensor_value_info("e_o", TensorProto.FLOAT, [4])])
    # Loop body: the no-op chain on the carried value, and a nested If reading the Slice's output (renamed there)
    b_nodes, b_out, b_c, b_vi = _noop_chain("v_in", "b")
    inner = helper.make_graph([helper.make_node("Add", [b_out, "b_sl"], ["i_o"])], "inner", [],
                              [helper.make_tensor_value_info("i_o", TensorProto.FLOAT, [4])])
    inner_else = helper.make_graph([helper.make_node("Identity", [b_out], ["ie_o"])], "inner_else", [],
                                   [helper.make_tensor_value_info("ie_o", TensorProto.FLOAT, [4])])
    body = helper.make_graph(
        b_nodes + [helper.make_node("If", ["c"], ["v_out"], then_branch=inner, else_branch=inner_else),
                   helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [4])], b_c, value_info=b_vi)
    trips = numpy_helper.from_array(np.array(3, np.int64), "trips")
    model = _model([helper.make_node("If", ["c"], ["Y"], then_branch=then, else_branch=els),
                    helper.make_node("Loop", ["trips", "", "Y"], ["Z"], body=body)],
                   [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4]),
                    helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                   [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [4])], [trips])
    x = np.array([1.5, -2.0, 0.25, 3.0], np.float32)
    feeds = [{"X": x, "c": np.array(flag)} for flag in (True, False)]
    ortref = pytest.importorskip("onnxruntime")
    ref = ortref.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for level in LEVELS:
        sess, saved = _optimized(model, level, tmp_path)
        for f in feeds:
            np.testing.assert_array_equal(sess.run(None, f)[0], ref.run(None, f)[0])
        if level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL:
            continue
        if_node, loop_node = saved.graph.node
        then_saved = next(a.g for a in if_node.attribute if a.name == "then_branch")
        assert [n.op_type for n in then_saved.node] == ["Neg"]
        body_saved = next(a.g for a in loop_node.attribute if a.name == "body")
        assert [n.op_type for n in body_saved.node if n.op_type != "Identity"] == ["Neg", "If"]
        nested = next(a.g for a in body_saved.node[[n.op_type for n in body_saved.node].index("If")].attribute
                      if a.name == "then_branch")
        assert nested.node[0].input[1] == "v_in"  # the Slice output it read, renamed to the Slice's source
        if level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC:
            theirs = ortref.InferenceSession(saved.SerializeToString(), providers=["CPUExecutionProvider"])
            for f in feeds:
                np.testing.assert_array_equal(theirs.run(None, f)[0], ref.run(None, f)[0])
