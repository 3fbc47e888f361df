"""ai.onnx.ml and ai.onnx.preview.training kernels, compared with onnxruntime (or with numpy formulas).

Small models are built with onnx.helper; random tree ensembles / SVMs / linear models exercise the
classifier conventions (binary layouts, base values, post transforms) against onnxruntime.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import onnxpy

ort = pytest.importorskip("onnxruntime")

ML = "ai.onnx.ml"
TRAIN = "ai.onnx.preview.training"
F32, F64, I64, I32, STR = TP.FLOAT, TP.DOUBLE, TP.INT64, TP.INT32, TP.STRING
_OPSETS = {"LabelEncoder": 4, "TreeEnsemble": 5, "TreeEnsembleClassifier": 3, "TreeEnsembleRegressor": 3}


def _vi(name, t):
    if isinstance(t, int):
        return helper.make_tensor_value_info(name, t, None)
    return helper.make_value_info(name, t)


def _map(k, v):
    return helper.make_map_type_proto(k, helper.make_tensor_type_proto(v, None))


def _model(op, ins, outs, domain=ML, opset=None, **attrs):
    node = helper.make_node(op, [n for n, _ in ins], [n for n, _ in outs], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [_vi(*i) for i in ins], [_vi(*o) for o in outs])
    opsets = [helper.make_opsetid("", 19), helper.make_opsetid(domain, opset or _OPSETS.get(op, 1))]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def _run(model, *xs, engine=onnxpy):
    if engine is ort:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    else:
        sess = onnxpy.InferenceSession(model)
    return sess.run(None, {i.name: x for i, x in zip(sess.get_inputs(), xs)})


def _same(a, b, rtol=1e-3, atol=1e-4):
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), type(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        if a.dtype == object:
            assert a.tolist() == b.tolist()
        else:
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, equal_nan=True)
    else:
        assert a == b


def check(model, *xs, rtol=1e-3, atol=1e-4):
    """Run with onnxruntime and onnxpy and compare every output."""
    expected = _run(model, *xs, engine=ort)
    got = _run(model, *xs)
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        _same(e, g, rtol, atol)
    return got


# ------------------------------------------------------------------------------------------------------------------
# pre-processing
# ------------------------------------------------------------------------------------------------------------------
X3 = np.array([[1, -2, 3], [0, 0, 0], [-1, -2, -4], [0.5, 2, 0.25]], np.float32)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize("t,dt", [(F32, np.float32), (F64, np.float64), (I64, np.int64), (I32, np.int32)])
def test_normalizer(norm, t, dt):
    m = _model("Normalizer", [("X", t)], [("Y", F32)], norm=norm)
    check(m, X3.astype(dt))
    check(m, X3[0].astype(dt))


def test_scaler_and_binarizer():
    check(_model("Scaler", [("X", F32)], [("Y", F32)], scale=[2.0, 0.5, -1.0], offset=[1.0, 2.0, 3.0]), X3)
    check(_model("Scaler", [("X", F64)], [("Y", F32)], scale=[2.0], offset=[1.0]), X3.astype(np.float64))
    x = np.random.default_rng(0).normal(size=(3, 4, 5)).astype(np.float32)
    check(_model("Binarizer", [("X", F32)], [("Y", F32)], threshold=0.3), x)


def test_binarizer_nan_raises():
    m = _model("Binarizer", [("X", F32)], [("Y", F32)])
    with pytest.raises(Exception, match="NaN"):
        _run(m, np.array([1.0, np.nan], np.float32))


def test_imputer():
    x = np.array([[np.nan, 1, np.nan], [2, np.nan, 0]], np.float32)
    check(_model("Imputer", [("X", F32)], [("Y", F32)], imputed_value_floats=[9.0, 8.0, 7.0],
                 replaced_value_float=float("nan")), x)
    check(_model("Imputer", [("X", F32)], [("Y", F32)], imputed_value_floats=[9.0], replaced_value_float=0.0), x)
    check(_model("Imputer", [("X", I64)], [("Y", I64)], imputed_value_int64s=[9, 8], replaced_value_int64=-1),
          np.array([[-1, 1], [2, -1]], np.int64))
    # int32 input (onnxruntime has no kernel for it): compare with the formula
    m = _model("Imputer", [("X", I32)], [("Y", I32)], imputed_value_int64s=[9], replaced_value_int64=-1)
    (y,) = _run(m, np.array([[-1, 1], [2, -1]], np.int32))
    assert y.dtype == np.int32 and y.tolist() == [[9, 1], [2, 9]]


def test_one_hot_encoder():
    check(_model("OneHotEncoder", [("X", I64)], [("Y", F32)], cats_int64s=[3, 1, 5]),
          np.array([[1, 3], [5, 7]], np.int64))
    check(_model("OneHotEncoder", [("X", F64)], [("Y", F32)], cats_int64s=[3, 1, 5, -3]),
          np.array([[1.7, -3.5, np.nan, 5.0]], np.float64))
    check(_model("OneHotEncoder", [("X", STR)], [("Y", F32)], cats_strings=["a", "b"]),
          np.array([["a", "c"], ["b", "b"]], object))
    m = _model("OneHotEncoder", [("X", I64)], [("Y", F32)], cats_int64s=[1], zeros=0)
    with pytest.raises(Exception, match="(?i)category"):
        _run(m, np.array([2], np.int64))


def test_array_feature_extractor():
    m = _model("ArrayFeatureExtractor", [("X", F32), ("Y", I64)], [("Z", F32)])
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    check(m, x, np.array([[1], [3]], np.int64))
    check(m, x, np.array(2, np.int64))
    check(m, np.arange(5, dtype=np.float32), np.array([4, 0, 4], np.int64))
    with pytest.raises(Exception, match="out of range"):
        _run(m, x, np.array([4], np.int64))
    ms = _model("ArrayFeatureExtractor", [("X", STR), ("Y", I64)], [("Z", STR)])
    check(ms, np.array([["a", "b"], ["c", "d"]], object), np.array([1, 0], np.int64))


def test_feature_vectorizer():
    m = _model("FeatureVectorizer", [("A", F32), ("B", F32)], [("Y", F32)], inputdimensions=[1, 4])
    check(m, np.array([[1, 2], [3, 4]], np.float32), np.array([[5, 6, 7], [8, 9, 10]], np.float32))
    m = _model("FeatureVectorizer", [("A", I64)], [("Y", F32)], inputdimensions=[3])
    check(m, np.arange(8, dtype=np.int64).reshape(2, 2, 2))
    check(m, np.zeros((0, 3), np.int64))


def test_category_mapper():
    kw = dict(cats_strings=["a", "b", "c"], cats_int64s=[5, 6, 7])
    check(_model("CategoryMapper", [("X", STR)], [("Y", I64)], default_int64=-9, **kw),
          np.array([["a", "z"], ["c", "b"]], object))
    check(_model("CategoryMapper", [("X", I64)], [("Y", STR)], default_string="?", **kw),
          np.array([[5, 1], [7, 6]], np.int64))


def test_label_encoder_versions():
    x = np.array(["b", "z", "a"], object)
    check(_model("LabelEncoder", [("X", STR)], [("Y", I64)], opset=1, classes_strings=["a", "b", "c"]), x)
    check(_model("LabelEncoder", [("X", I64)], [("Y", STR)], opset=1, classes_strings=["a", "b"],
                 default_string="??"), np.array([[1, 5], [-1, 0]], np.int64))
    check(_model("LabelEncoder", [("X", I64)], [("Y", F32)], opset=2, keys_int64s=[1, 2], values_floats=[10.0, 20.0]),
          np.array([1, 2, 3], np.int64))
    check(_model("LabelEncoder", [("X", F32)], [("Y", F32)], opset=4, keys_floats=[1.0, float("nan"), 2.0],
                 values_floats=[10.0, 20.0, 30.0]), np.array([1, np.nan, 3, 2], np.float32))
    check(_model("LabelEncoder", [("X", F32)], [("Y", STR)], opset=4, keys_floats=[1.0, 2.0],
                 values_strings=["a", "b"]), np.array([[1, 2, 3]], np.float32))
    check(_model("LabelEncoder", [("X", STR)], [("Y", TP.INT16)], opset=4,
                 keys_tensor=helper.make_tensor("k", STR, [2], ["a", "b"]),
                 values_tensor=helper.make_tensor("v", TP.INT16, [2], [3, 4]),
                 default_tensor=helper.make_tensor("d", TP.INT16, [1], [42])), np.array([["a", "c", "b"]], object))
    check(_model("LabelEncoder", [("X", I64)], [("Y", F64)], opset=4, keys_int64s=[4],
                 values_tensor=helper.make_tensor("v", F64, [1], [3.0])), np.array([[4, 5]], np.int64))


def test_label_encoder_repeated_key_last_wins():
    # the spec: "If a key is repeated, the last key takes precedence" (onnxruntime keeps the first)
    m = _model("LabelEncoder", [("X", I64)], [("Y", I64)], opset=4, keys_int64s=[1, 2, 1], values_int64s=[10, 20, 30])
    (y,) = _run(m, np.array([1, 2, 3], np.int64))
    assert y.tolist() == [30, 20, -1]


def test_zipmap_and_dict_vectorizer():
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    seq_i = helper.make_sequence_type_proto(_map(I64, F32))
    seq_s = helper.make_sequence_type_proto(_map(STR, F32))
    check(_model("ZipMap", [("X", F32)], [("Z", seq_i)], classlabels_int64s=[10, 20, 30]), x)
    check(_model("ZipMap", [("X", F32)], [("Z", seq_s)], classlabels_strings=["a", "b", "c"]), x)
    check(_model("ZipMap", [("X", F32)], [("Z", seq_i)], classlabels_int64s=[10, 20, 30]), np.zeros((0, 3), np.float32))
    m = _model("DictVectorizer", [("X", _map(STR, F32))], [("Y", F32)], string_vocabulary=["a", "c", "b", "z"])
    check(m, {"a": 4.0, "c": 8.0})
    check(m, {"a": 4.0, "q": 8.0})
    m = _model("DictVectorizer", [("X", _map(I64, F32))], [("Y", F32)], int64_vocabulary=[1, 5, 3])
    check(m, {5: 2.5, 3: 1.0})


def test_cast_map():
    m = _model("CastMap", [("X", _map(I64, F32))], [("Y", STR)], cast_to="TO_STRING", map_form="SPARSE", max_map=7)
    check(m, {5: 1.5, 3: 2.0})
    m = _model("CastMap", [("X", _map(I64, F32))], [("Y", I64)], cast_to="TO_INT64", map_form="SPARSE", max_map=7)
    check(m, {5: 1.5, 3: -2.7})
    m = _model("CastMap", [("X", _map(I64, F32))], [("Y", F32)], cast_to="TO_FLOAT")
    check(m, {5: 1.5, 3: -2.7, 1: 0.25})
    # map(int64, string): onnxruntime's Python binding cannot feed it, check the values directly
    m = _model("CastMap", [("X", _map(I64, STR))], [("Y", F32)], cast_to="TO_FLOAT")
    (y,) = _run(m, {5: "1.5", 3: "2"})
    assert y.dtype == np.float32 and y.tolist() == [[2.0, 1.5]]


# ------------------------------------------------------------------------------------------------------------------
# tree ensembles
# ------------------------------------------------------------------------------------------------------------------
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]


def random_forest(rng, n_trees, n_features, n_out, depth=3, votes=(1, 2), pool=None, positive=False, missing=True):
    """Legacy-encoded random trees: node attributes and the leaf votes (tree, node, id, weight)."""
    nodes = {k: [] for k in ("treeids", "nodeids", "featureids", "values", "modes", "truenodeids", "falsenodeids",
                             "missing_value_tracks_true")}
    leaf = {k: [] for k in ("treeids", "nodeids", "ids", "weights")}
    for t in range(n_trees):
        counter = [0]

        def build(d, t=t, counter=counter):
            nid = counter[0]
            counter[0] += 1
            i = len(nodes["nodeids"])
            for v in nodes.values():
                v.append(0)
            nodes["treeids"][i], nodes["nodeids"][i], nodes["values"][i] = t, nid, 0.0
            if d >= depth or (d > 0 and rng.random() < 0.3):
                nodes["modes"][i] = "LEAF"
                choices = pool if pool is not None else list(range(n_out))
                k = min(int(rng.integers(votes[0], votes[1] + 1)), len(choices))
                for c in rng.choice(choices, size=k, replace=False):
                    w = float(np.round(rng.random() if positive else rng.normal(), 3))
                    for key, val in zip(("treeids", "nodeids", "ids", "weights"), (t, nid, int(c), w)):
                        leaf[key].append(val)
                return nid
            nodes["featureids"][i] = int(rng.integers(n_features))
            nodes["modes"][i] = str(rng.choice(MODES))
            nodes["values"][i] = float(np.float32(np.round(rng.normal(), 1)))
            nodes["missing_value_tracks_true"][i] = int(rng.integers(2)) if missing else 0
            nodes["truenodeids"][i] = build(d + 1)
            nodes["falsenodeids"][i] = build(d + 1)
            return nid

        build(0)
    return {f"nodes_{k}": v for k, v in nodes.items()}, leaf


def random_x(rng, n, f, nan=True):
    x = np.round(rng.normal(size=(n, f)), 1).astype(np.float32)
    if nan:
        x[rng.random(size=x.shape) < 0.15] = np.nan
    return x


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"])
def test_tree_ensemble_regressor(aggregate, post):
    rng = np.random.default_rng(zlib.crc32(f"{aggregate}-{post}".encode()))  # (str hashes vary per process)
    for n_targets in (1, 3):
        nodes, leaf = random_forest(rng, 3, 3, n_targets, positive=post == "PROBIT")
        attrs = dict(nodes, target_treeids=leaf["treeids"], target_nodeids=leaf["nodeids"], target_ids=leaf["ids"],
                     target_weights=[w / 4 for w in leaf["weights"]], n_targets=n_targets,
                     aggregate_function=aggregate, post_transform=post)
        if post != "PROBIT":
            attrs["base_values"] = np.round(rng.normal(size=n_targets), 2).tolist()
        # onnxruntime's PROBIT is an approximate inverse erf: up to 3.5e-4 from the exact value (measured over 2,400
        # random forests), so PROBIT outputs get a wider absolute tolerance
        check(_model("TreeEnsembleRegressor", [("X", F32)], [("Y", F32)], **attrs), random_x(rng, 30, 3),
              rtol=2e-3, atol=1e-3 if post == "PROBIT" else 1e-4)


def test_tree_ensemble_regressor_double_opset1_and_as_tensor():
    rng = np.random.default_rng(1)
    nodes, leaf = random_forest(rng, 4, 2, 2)
    attrs = dict(nodes, target_treeids=leaf["treeids"], target_nodeids=leaf["nodeids"], target_ids=leaf["ids"],
                 target_weights=leaf["weights"], n_targets=2)
    x = random_x(rng, 40, 2)
    check(_model("TreeEnsembleRegressor", [("X", F64)], [("Y", F32)], opset=1, **attrs), x.astype(np.float64))
    t_attrs = dict(attrs)
    values = t_attrs.pop("nodes_values")
    weights = t_attrs.pop("target_weights")
    t_attrs["nodes_values_as_tensor"] = helper.make_tensor("v", F64, [len(values)], values)
    t_attrs["target_weights_as_tensor"] = helper.make_tensor("w", F64, [len(weights)], weights)
    t_attrs["base_values_as_tensor"] = helper.make_tensor("b", F64, [2], [0.5, -0.25])
    check(_model("TreeEnsembleRegressor", [("X", F64)], [("Y", F32)], **t_attrs), x.astype(np.float64))
    # int64 input (no onnxruntime kernel): same result as the float input holding the same values
    xi = np.nan_to_num(x * 2).astype(np.int64)
    (yi,) = _run(_model("TreeEnsembleRegressor", [("X", I64)], [("Y", F32)], **attrs), xi)
    mf = _model("TreeEnsembleRegressor", [("X", F32)], [("Y", F32)], **attrs)
    (yf,) = _run(mf, xi.astype(np.float32), engine=ort)
    np.testing.assert_allclose(yi, yf, rtol=1e-5)


@pytest.mark.parametrize("n_classes", [2, 3, 5])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_tree_ensemble_classifier(n_classes, post):
    rng = np.random.default_rng(n_classes * 10 + len(post))
    cases = 0
    for trial in range(40):
        ids = ["all", "one0", "one1"][trial % 3]
        pool = {"all": None, "one0": [0], "one1": [n_classes - 1]}[ids]
        # leaves without votes only for two classes (onnxruntime fails on a row without any vote otherwise)
        nodes, leaf = random_forest(rng, int(rng.integers(1, 4)), 3, n_classes, pool=pool,
                                    positive=bool(trial % 2), votes=(0 if n_classes == 2 else 1, 2))
        if not leaf["ids"]:
            continue
        n_base = [0, n_classes, 1 if n_classes == 2 else 0][int(rng.integers(3))]
        if n_classes == 2 and ids == "all" and n_base == 1:
            continue  # onnxruntime leaves the second score uninitialized there
        strings = bool(rng.integers(2))
        attrs = dict(nodes, class_treeids=leaf["treeids"], class_nodeids=leaf["nodeids"], class_ids=leaf["ids"],
                     class_weights=leaf["weights"], post_transform=post)
        if n_base:
            attrs["base_values"] = np.round(rng.normal(size=n_base), 2).tolist()
        if strings:
            attrs["classlabels_strings"] = [f"c{i}" for i in range(n_classes)]
        elif n_classes == 2 and ids == "all":
            attrs["classlabels_int64s"] = [0, 1]  # onnxruntime reports 0/1 instead of the labels there
        else:
            attrs["classlabels_int64s"] = rng.choice(100, size=n_classes, replace=False).tolist()
        m = _model("TreeEnsembleClassifier", [("X", F32)], [("Y", STR if strings else I64), ("Z", F32)], **attrs)
        check(m, random_x(rng, 25, 3))
        cases += 1
    assert cases > 20


def test_tree_ensemble_classifier_zipmap_pipeline():
    """TreeEnsembleClassifier -> ZipMap, the usual converter output, end to end."""
    rng = np.random.default_rng(5)
    nodes, leaf = random_forest(rng, 5, 4, 3, positive=True)
    cls = helper.make_node("TreeEnsembleClassifier", ["X"], ["label", "prob"], domain=ML, classlabels_int64s=[0, 1, 2],
                           class_treeids=leaf["treeids"], class_nodeids=leaf["nodeids"], class_ids=leaf["ids"],
                           class_weights=leaf["weights"], post_transform="SOFTMAX", **nodes)
    zm = helper.make_node("ZipMap", ["prob"], ["probabilities"], domain=ML, classlabels_int64s=[0, 1, 2])
    seq = helper.make_sequence_type_proto(_map(I64, F32))
    graph = helper.make_graph([cls, zm], "g", [_vi("X", F32)], [_vi("label", I64), _vi("probabilities", seq)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(ML, 3)],
                              ir_version=9).SerializeToString()
    x = random_x(rng, 12, 4)
    exp_label, exp_probs = _run(model, x, engine=ort)
    label, probs = _run(model, x)
    np.testing.assert_array_equal(label, exp_label)
    assert isinstance(probs, list) and len(probs) == len(exp_probs)
    for e, g in zip(exp_probs, probs):
        assert set(e) == set(g)
        for k in e:
            assert abs(e[k] - g[k]) < 1e-5


def _te5_from_legacy(nodes, leaf, n_targets, dtype, rng=None, member_p=0.0):
    code = {m: i for i, m in enumerate(MODES)}
    n = len(nodes["nodes_nodeids"])
    key = {(nodes["nodes_treeids"][i], nodes["nodes_nodeids"][i]): i for i in range(n)}
    interior = [i for i in range(n) if nodes["nodes_modes"][i] != "LEAF"]
    ipos = {g: k for k, g in enumerate(interior)}
    votes = {}
    for t, nd, c, w in zip(leaf["treeids"], leaf["nodeids"], leaf["ids"], leaf["weights"]):
        votes.setdefault(key[(t, nd)], (c, w))
    lpos, targets, weights = {}, [], []
    for g in range(n):
        if nodes["nodes_modes"][g] == "LEAF":
            lpos[g] = len(targets)
            c, w = votes.get(g, (0, 0.0))
            targets.append(c)
            weights.append(w)
    a = {k: [] for k in ("modes", "feat", "split", "tn", "tl", "fn", "fl", "miss")}
    members = []
    for g in interior:
        mode = code[nodes["nodes_modes"][g]]
        if rng is not None and rng.random() < member_p:
            mode = 6
            members.append(sorted(set(rng.integers(-2, 3, size=3).astype(float).tolist())))
        a["modes"].append(mode)
        a["feat"].append(nodes["nodes_featureids"][g])
        a["split"].append(nodes["nodes_values"][g])
        a["miss"].append(nodes["nodes_missing_value_tracks_true"][g])
        t = nodes["nodes_treeids"][g]
        for ids, lk, nk in (("nodes_truenodeids", "tl", "tn"), ("nodes_falsenodeids", "fl", "fn")):
            child = key[(t, nodes[ids][g])]
            a[lk].append(int(child in lpos))
            a[nk].append(lpos[child] if child in lpos else ipos[child])
    roots, seen = [], set()
    for g in range(n):
        t = nodes["nodes_treeids"][g]
        if t in seen:
            continue
        seen.add(t)
        if g in ipos:
            roots.append(ipos[g])
        else:  # a single-leaf tree: one node whose two branches reach the same leaf
            for k, v in zip(a, (0, 0, 0.0, lpos[g], 1, lpos[g], 1, 0)):
                a[k].append(v)
            roots.append(len(a["modes"]) - 1)
    mv = [v for s in members for v in s + [float("nan")]]
    t = F64 if dtype == np.float64 else F32
    attrs = dict(n_targets=n_targets, tree_roots=roots,
                 nodes_modes=helper.make_tensor("m", TP.UINT8, [len(a["modes"])], a["modes"]),
                 nodes_featureids=a["feat"], nodes_splits=helper.make_tensor("s", t, [len(a["split"])], a["split"]),
                 nodes_truenodeids=a["tn"], nodes_trueleafs=a["tl"], nodes_falsenodeids=a["fn"],
                 nodes_falseleafs=a["fl"], nodes_missing_value_tracks_true=a["miss"], leaf_targetids=targets,
                 leaf_weights=helper.make_tensor("w", t, [len(weights)], weights))
    if mv:
        attrs["membership_values"] = helper.make_tensor("mv", t, [len(mv)], mv)
    return attrs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_5(dtype, aggregate):
    rng = np.random.default_rng(aggregate + (10 if dtype == np.float64 else 0))
    t = F64 if dtype == np.float64 else F32
    for trial in range(6):
        n_targets = int(rng.integers(1, 4))
        nodes, leaf = random_forest(rng, int(rng.integers(1, 4)), 3, n_targets, votes=(1, 1))
        member_p = 0.4 if trial % 2 else 0.0
        attrs = _te5_from_legacy(nodes, leaf, n_targets, dtype, rng, member_p)
        post = [0, 3][trial % 2]  # 1 and 2 are swapped in onnxruntime, see test_tree_ensemble_5_post_transforms
        m = _model("TreeEnsemble", [("X", t)], [("Y", t)], aggregate_function=aggregate, post_transform=post, **attrs)
        x = random_x(rng, 30, 3).astype(dtype)
        if member_p:  # onnxruntime only implements integer set members
            x = np.where(np.isnan(x), x, np.round(x * 2))
        check(m, x)


def test_tree_ensemble_5_post_transforms():
    """post_transform codes follow the spec: 1 = SOFTMAX, 2 = LOGISTIC, 3 = SOFTMAX_ZERO, 4 = PROBIT."""
    rng = np.random.default_rng(3)
    nodes, leaf = random_forest(rng, 3, 3, 3, votes=(1, 1), positive=True)
    attrs = _te5_from_legacy(nodes, leaf, 3, np.float64)
    x = random_x(rng, 20, 3).astype(np.float64)
    (raw,) = _run(_model("TreeEnsemble", [("X", F64)], [("Y", F64)], **attrs), x)
    (sm,) = _run(_model("TreeEnsemble", [("X", F64)], [("Y", F64)], post_transform=1, **attrs), x)
    (lg,) = _run(_model("TreeEnsemble", [("X", F64)], [("Y", F64)], post_transform=2, **attrs), x)
    e = np.exp(raw - raw.max(axis=1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(lg, 1 / (1 + np.exp(-raw)), rtol=1e-6)


def test_tree_ensemble_backend_style_membership():
    m = _model("TreeEnsemble", [("X", F32)], [("Y", F32)], n_targets=4, aggregate_function=1, tree_roots=[0],
               membership_values=helper.make_tensor("mv", F32, (8,), [1.2, 3.7, 8, 9, np.nan, 12, 7, np.nan]),
               nodes_modes=helper.make_tensor("m", TP.UINT8, (3,), [0, 6, 6]), nodes_featureids=[0, 0, 0],
               nodes_splits=helper.make_tensor("s", F32, (3,), [11, 232344.0, np.nan]),
               nodes_trueleafs=[0, 1, 1], nodes_truenodeids=[1, 0, 1], nodes_falseleafs=[1, 0, 1],
               nodes_falsenodeids=[2, 2, 3], leaf_targetids=[0, 1, 2, 3],
               leaf_weights=helper.make_tensor("w", F32, (4,), [1, 10, 1000, 100]))
    (y,) = _run(m, np.array([1.2, 3.4, -0.12, np.nan, 12, 7, 3.7], np.float32).reshape(-1, 1))
    assert y.dtype == np.float32
    assert y.tolist() == [[1, 0, 0, 0], [0, 0, 0, 100], [0, 0, 0, 100], [0, 0, 1000, 0], [0, 0, 1000, 0],
                          [0, 10, 0, 0], [1, 0, 0, 0]]


def test_tree_ensemble_large_batch_is_vectorized():
    rng = np.random.default_rng(7)
    nodes, leaf = random_forest(rng, 60, 8, 4, depth=6, votes=(1, 1), missing=False)
    attrs = dict(nodes, target_treeids=leaf["treeids"], target_nodeids=leaf["nodeids"], target_ids=leaf["ids"],
                 target_weights=leaf["weights"], n_targets=4, aggregate_function="SUM")
    check(_model("TreeEnsembleRegressor", [("X", F32)], [("Y", F32)], **attrs), random_x(rng, 3000, 8, nan=False))


def test_tree_ensemble_errors():
    base = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[5, 0, 0],
                nodes_values=[0.0, 0, 0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0],
                nodes_falsenodeids=[2, 0, 0], target_treeids=[0], target_nodeids=[1], target_ids=[0],
                target_weights=[1.0], n_targets=1)
    m = _model("TreeEnsembleRegressor", [("X", F32)], [("Y", F32)], **base)
    with pytest.raises(Exception, match="feature"):
        _run(m, np.zeros((2, 3), np.float32))
    bad = dict(base, nodes_falsenodeids=[7, 0, 0], nodes_featureids=[0, 0, 0])
    with pytest.raises(Exception, match="does not exist"):
        _run(_model("TreeEnsembleRegressor", [("X", F32)], [("Y", F32)], **bad), np.zeros((2, 3), np.float32))
    cyc = dict(base, nodes_modes=["BRANCH_LEQ", "BRANCH_LEQ", "LEAF"], nodes_truenodeids=[1, 0, 0],
               nodes_falsenodeids=[1, 0, 0], nodes_featureids=[0, 0, 0], target_nodeids=[2])
    with pytest.raises(Exception, match="cycle"):
        _run(_model("TreeEnsembleRegressor", [("X", F32)], [("Y", F32)], **cyc), np.zeros((2, 3), np.float32))


# ------------------------------------------------------------------------------------------------------------------
# linear models and SVMs
# ------------------------------------------------------------------------------------------------------------------
POSTS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"]


def test_linear_classifier_and_regressor():
    rng = np.random.default_rng(11)
    for trial in range(40):
        f = int(rng.integers(1, 5))
        c = int(rng.choice([2, 2, 3, 5]))
        rows = 1 if (c == 2 and trial % 2) else c
        strings = bool(trial % 3 == 0)
        t, dt = [(F32, np.float32), (F64, np.float64), (I64, np.int64), (I32, np.int32)][trial % 4]
        attrs = dict(coefficients=np.round(rng.normal(size=rows * f), 2).tolist(),
                     intercepts=np.round(rng.normal(size=rows), 2).tolist(), post_transform=POSTS[trial % 4])
        if strings:
            attrs["classlabels_strings"] = [f"l{i}" for i in range(c)]
        else:
            attrs["classlabels_ints"] = rng.choice(50, size=c, replace=False).tolist()
        m = _model("LinearClassifier", [("X", t)], [("Y", STR if strings else I64), ("Z", F32)], **attrs)
        # onnxruntime's softmax uses an approximate exp (errors up to ~5e-4 for tiny probabilities)
        check(m, (rng.normal(size=(10, f)) * 2).astype(dt), atol=1e-3)
    for trial in range(20):
        f, n_t = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        post = (POSTS + ["PROBIT"])[trial % 5]
        scale = 0.05 if post == "PROBIT" else 1.0
        m = _model("LinearRegressor", [("X", F32)], [("Y", F32)], targets=n_t, post_transform=post,
                   coefficients=(np.round(rng.normal(size=n_t * f), 2) * scale).tolist(),
                   intercepts=[0.5] * n_t if post == "PROBIT" else np.round(rng.normal(size=n_t), 2).tolist())
        # (onnxruntime's float32 probit loses ~1e-4 near p = 0.5)
        check(m, rng.normal(size=(10, f)).astype(np.float32), rtol=2e-3, atol=5e-4)


def _svc_attrs(rng, c, f, kernel_type, proba):
    per_class = rng.integers(1, 4, size=c).tolist()
    v = sum(per_class)
    attrs = dict(vectors_per_class=per_class, support_vectors=np.round(rng.normal(size=v * f), 2).tolist(),
                 coefficients=np.round(rng.normal(size=(c - 1) * v), 2).tolist(),
                 rho=np.round(rng.normal(size=c * (c - 1) // 2), 2).tolist(), kernel_type=kernel_type,
                 kernel_params=[float(np.round(rng.random(), 2)), float(np.round(rng.random(), 2)),
                                float(rng.integers(1, 4))],
                 classlabels_ints=rng.choice(50, size=c, replace=False).tolist())
    if proba:
        attrs["prob_a"] = np.round(-rng.random(size=c * (c - 1) // 2) * 3, 2).tolist()
        attrs["prob_b"] = np.round(rng.normal(size=c * (c - 1) // 2) * 0.3, 2).tolist()
    return attrs


@pytest.mark.parametrize("kernel_type", ["LINEAR", "POLY", "RBF", "SIGMOID"])
@pytest.mark.parametrize("proba", [False, True])
def test_svm_classifier(kernel_type, proba):
    rng = np.random.default_rng(len(kernel_type) * 2 + proba)
    for trial in range(12):
        c = [2, 3, 4][trial % 3]
        f = int(rng.integers(1, 4))
        attrs = _svc_attrs(rng, c, f, kernel_type, proba)
        m = _model("SVMClassifier", [("X", F32)], [("Y", I64), ("Z", F32)], post_transform=POSTS[trial % 4], **attrs)
        check(m, rng.normal(size=(15, f)).astype(np.float32))


def test_svm_classifier_linear_form():
    rng = np.random.default_rng(2)
    for trial in range(16):
        c, f = [1, 2, 3, 4][trial % 4], int(rng.integers(1, 4))
        m = _model("SVMClassifier", [("X", F32)], [("Y", I64), ("Z", F32)], kernel_type="LINEAR",
                   coefficients=np.round(rng.normal(size=c * f), 2).tolist(), rho=[0.25], kernel_params=[0.1, 0, 1],
                   classlabels_ints=list(range(c)), post_transform=POSTS[trial % 4])
        check(m, rng.normal(size=(10, f)).astype(np.float32))


def test_svm_regressor():
    rng = np.random.default_rng(4)
    for trial in range(24):
        f, v = int(rng.integers(1, 4)), int(rng.integers(0, 4))
        kernel_type = ["LINEAR", "POLY", "RBF", "SIGMOID"][trial % 4]
        attrs = dict(coefficients=np.round(rng.normal(size=v if v else f), 2).tolist(), rho=[0.3], n_supports=v,
                     kernel_type=kernel_type, one_class=trial % 2, kernel_params=[0.4, 0.2, 2.0])
        if v:
            attrs["support_vectors"] = np.round(rng.normal(size=v * f), 2).tolist()
        check(_model("SVMRegressor", [("X", F32)], [("Y", F32)], **attrs), rng.normal(size=(10, f)).astype(np.float32))


# ------------------------------------------------------------------------------------------------------------------
# training optimizers (numpy formulas from the spec)
# ------------------------------------------------------------------------------------------------------------------
def _train_model(op, n_in, n_out, **attrs):
    ins = [("R", F32), ("T", I64)] + [(f"i{k}", F32) for k in range(n_in)]
    outs = [(f"o{k}", F32) for k in range(n_out)]
    return _model(op, ins, outs, domain=TRAIN, opset=1, **attrs)


def test_adagrad_multiple():
    rng = np.random.default_rng(0)
    x1, g1, h1 = (rng.random((2, 3)).astype(np.float32) for _ in range(3))
    x2, g2, h2 = (rng.random(4).astype(np.float32) for _ in range(3))
    r, t = np.array(0.1, np.float32), np.array(3, np.int64)
    m = _train_model("Adagrad", 6, 4, norm_coefficient=0.01, epsilon=1e-5, decay_factor=0.1)
    out = _run(m, r, t, x1, x2, g1, g2, h1, h2)
    for x, g, h, xn, hn in ((x1, g1, h1, out[0], out[2]), (x2, g2, h2, out[1], out[3])):
        gr = 0.01 * x + g
        h_new = h + gr * gr
        np.testing.assert_allclose(hn, h_new, rtol=1e-5)
        np.testing.assert_allclose(xn, x - 0.1 / (1 + 3 * 0.1) * gr / (np.sqrt(h_new) + 1e-5), rtol=1e-5)


@pytest.mark.parametrize("t", [0, 4])
def test_adam(t):
    rng = np.random.default_rng(1)
    x, g, v, h = (rng.random(5).astype(np.float32) for _ in range(4))
    m = _train_model("Adam", 4, 3, alpha=0.9, beta=0.99, epsilon=1e-6, norm_coefficient=0.01,
                     norm_coefficient_post=0.02)
    xn, vn, hn = _run(m, np.array(0.05, np.float32), np.array(t, np.int64), x, g, v, h)
    gr = 0.01 * x + g
    v_new = 0.9 * v + 0.1 * gr
    h_new = 0.99 * h + 0.01 * gr * gr
    rate = 0.05 * np.sqrt(1 - 0.99 ** t) / (1 - 0.9 ** t) if t > 0 else 0.05
    np.testing.assert_allclose(vn, v_new, rtol=1e-5)
    np.testing.assert_allclose(hn, h_new, rtol=1e-5)
    np.testing.assert_allclose(xn, 0.98 * (x - rate * v_new / (np.sqrt(h_new) + 1e-6)), rtol=1e-5)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
def test_momentum(mode):
    rng = np.random.default_rng(2)
    x, g, v = (rng.random(3).astype(np.float32) for _ in range(3))
    m = _train_model("Momentum", 3, 2, alpha=0.9, beta=0.5, norm_coefficient=0.01, mode=mode)
    for t in (0, 2):
        xn, vn = _run(m, np.array(0.1, np.float32), np.array(t, np.int64), x, g, v)
        gr = 0.01 * x + g
        v_new = 0.9 * v + (0.5 if t > 0 else 1.0) * gr
        exp_x = x - 0.1 * v_new if mode == "standard" else x - 0.1 * (gr + 0.9 * v_new)
        np.testing.assert_allclose(vn, v_new, rtol=1e-5)
        np.testing.assert_allclose(xn, exp_x, rtol=1e-5)
