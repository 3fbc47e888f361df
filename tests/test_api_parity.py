"""Differential tests: the same calls on onnxpy and onnxruntime must behave the same.

Each check runs a callable ``f(mod)`` with ``mod`` = onnxpy and = onnxruntime and compares the outcome: the
returned values (types, dtypes, shapes, contents) or the exception class name and message text.  Where onnxpy
deliberately differs (it accepts more, or gives a clearer answer), the test says so and asserts onnxpy's behaviour.
"""

import os
import pathlib
import threading
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import onnxpy

ortref = pytest.importorskip("onnxruntime")
ortref.set_default_logger_severity(4)
CPU = ["CPUExecutionProvider"]


# -- helpers ------------------------------------------------------------------------------------------------------
def mk(inputs, outputs, nodes, opset=18, inits=(), extra=(), **model_kw):
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)] + [h.make_opsetid(d, v) for d, v in extra],
                     **model_kw)
    m.ir_version = 9
    return m.SerializeToString()


def tvi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


def sess(mod, model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mod.InferenceSession(model, providers=CPU)


def norm(v):
    """A comparable description of a value returned by either runtime."""
    if isinstance(v, np.ndarray):
        return ("ndarray", str(v.dtype), v.shape, v.tolist())
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [norm(x) for x in v])
    if isinstance(v, dict):
        return ("dict", sorted((repr(k), type(k).__name__, norm(x)) for k, x in v.items()))
    if isinstance(v, (onnxpy.OrtValue, ortref.OrtValue)):
        return ("OrtValue", ov_info(v))
    if isinstance(v, np.generic):
        return (type(v).__name__, v.item())
    return (type(v).__name__, v)


def ov_info(o, values=True):
    r = {}
    for m in ("data_type", "element_type", "shape", "has_value", "is_tensor", "is_tensor_sequence",
              "is_sparse_tensor", "device_name", "tensor_size_in_bytes"):
        r[m] = outcome(getattr(o, m))
    if values:
        r["numpy"] = outcome(o.numpy)
    return r


def clean(msg: str) -> str:
    """onnxruntime messages sometimes carry a C++ source location and the failed check; compare the text after."""
    msg = msg.rstrip("\n")
    if "was false. " in msg:
        msg = msg.rsplit("was false. ", 1)[-1]
    elif msg.startswith("/onnxruntime_src/"):
        msg = msg.split("[ONNXRuntimeError]", 1)[-1] if "[ONNXRuntimeError]" in msg else msg.split(")> ", 1)[-1]
    return msg


def outcome(fn):
    try:
        return ("ok", norm(fn()))
    except Exception as e:  # noqa: BLE001
        return ("err", type(e).__name__, clean(str(e)))


def both(f):
    return outcome(lambda: f(onnxpy)), outcome(lambda: f(ortref))


def same(f):
    a, b = both(f)
    assert a == b, f"\nonnxpy:      {a}\nonnxruntime: {b}"
    return a


def same_error(f, cls=None, prefix_only=False, suffix=None):
    """Both raise the same class; the message is equal (or ``prefix_only``: same first line start; ``suffix``:
    both end with it)."""
    a, b = both(f)
    assert a[0] == "err" and b[0] == "err", f"\nonnxpy:      {a}\nonnxruntime: {b}"
    assert a[1] == b[1], f"\nonnxpy:      {a}\nonnxruntime: {b}"
    if cls is not None:
        assert a[1] == cls
    if suffix is not None:
        assert a[2].endswith(suffix) and b[2].endswith(suffix), (a, b)
    elif prefix_only:
        assert a[2].split(".")[0] == b[2].split(".")[0], (a, b)
    else:
        assert a[2] == b[2], f"\nonnxpy:      {a}\nonnxruntime: {b}"
    return a


X23 = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
RELU = mk([tvi("X", T.FLOAT, ["N", 3])], [tvi("Y", T.FLOAT, ["N", 3])], [h.make_node("Relu", ["X"], ["Y"])])
SEQ = h.make_sequence_type_proto(h.make_tensor_type_proto(T.FLOAT, None))
MAP_IF = h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, None))
MAP_SD = h.make_map_type_proto(T.STRING, h.make_tensor_type_proto(T.DOUBLE, None))
OPT_T = h.make_optional_type_proto(h.make_tensor_type_proto(T.FLOAT, [2]))
OPT_SEQ = h.make_optional_type_proto(SEQ)
UNTYPED = onnx.TypeProto()


def nodeargs(mod, model):
    s = sess(mod, model)
    return [[(a.name, a.type, a.shape) for a in lst] for lst in (s.get_inputs(), s.get_outputs(),
                                                                 s.get_overridable_initializers())]


# -- NodeArg ------------------------------------------------------------------------------------------------------
IDENTITY_TYPES = {
    "tensor": h.make_tensor_type_proto(T.FLOAT, [2, 3]),
    "string": h.make_tensor_type_proto(T.STRING, [None, 2]),
    "seq": SEQ,
    "optional_tensor": OPT_T,
    "optional_seq": OPT_SEQ,
    "unknown_shape": h.make_tensor_type_proto(T.FLOAT, None),
    "scalar": h.make_tensor_type_proto(T.FLOAT, []),
    "symbolic": h.make_tensor_type_proto(T.FLOAT, ["N", 3, None]),
    "int64": h.make_tensor_type_proto(T.INT64, ["batch"]),
}


@pytest.mark.parametrize("kind", sorted(IDENTITY_TYPES))
def test_nodearg_identity(kind):
    tp = IDENTITY_TYPES[kind]
    model = mk([h.make_value_info("X", tp)], [h.make_value_info("Y", tp)], [h.make_node("Identity", ["X"], ["Y"])])
    same(lambda m: nodeargs(m, model))


@pytest.mark.parametrize("kind", ["map_if", "map_sd", "seq_map", "sparse"])
def test_nodearg_pass_through(kind):
    tp = {"map_if": MAP_IF, "map_sd": MAP_SD, "seq_map": h.make_sequence_type_proto(MAP_IF),
          "sparse": h.make_sparse_tensor_type_proto(T.FLOAT, [2, 3])}[kind]
    model = mk([h.make_value_info("X", tp)], [h.make_value_info("X", tp)], [])
    same(lambda m: nodeargs(m, model))


@pytest.mark.parametrize("declared", [None, [], ["M", 3], [5, 3], [None], ["M", None], [None, 4], [None, None]])
def test_output_shape_merged_with_inference(declared):
    """onnxruntime merges its shape inference into the declared output shape (and unions on a conflict)."""
    out = tvi("Y", T.FLOAT, declared) if declared != [] else h.make_value_info("Y", UNTYPED)
    model = mk([tvi("X", T.FLOAT, ["N", 3])], [out], [h.make_node("Relu", ["X"], ["Y"])])
    same(lambda m: nodeargs(m, model))


@pytest.mark.parametrize("case", ["shape", "split_to_seq", "optional", "has_element", "reshape", "zipmap",
                                  "dictvectorizer", "nonzero", "concat_sym"])
def test_untyped_outputs_get_inferred_types(case):
    x = tvi("X", T.FLOAT, ["N", 3])
    ml = [("ai.onnx.ml", 3)]
    inputs, node, inits, extra = [x], None, [], ()
    if case == "shape":
        node = h.make_node("Shape", ["X"], ["Y"])
    elif case == "split_to_seq":
        node = h.make_node("SplitToSequence", ["X"], ["Y"], axis=0)
    elif case == "optional":
        node = h.make_node("Optional", ["X"], ["Y"])
    elif case == "has_element":
        inputs = [h.make_value_info("X", OPT_T)]
        node = h.make_node("OptionalHasElement", ["X"], ["Y"])
    elif case == "reshape":
        node, inits = h.make_node("Reshape", ["X", "S"], ["Y"]), [h.make_tensor("S", T.INT64, [1], [-1])]
    elif case == "zipmap":
        node, extra = h.make_node("ZipMap", ["X"], ["Y"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2]), ml
    elif case == "dictvectorizer":
        inputs = [h.make_value_info("X", MAP_IF)]
        node, extra = h.make_node("DictVectorizer", ["X"], ["Y"], domain="ai.onnx.ml", int64_vocabulary=[1, 2]), ml
    elif case == "nonzero":
        node = h.make_node("NonZero", ["X"], ["Y"])
    elif case == "concat_sym":
        inputs = [x, tvi("Z", T.FLOAT, ["M", 3])]
        node = h.make_node("Concat", ["X", "Z"], ["Y"], axis=0)
    model = mk(inputs, [h.make_value_info("Y", UNTYPED)], [node], inits=inits, extra=extra)
    same(lambda m: nodeargs(m, model))


def test_overridable_initializers():
    W = h.make_tensor("W", T.FLOAT, [3], [1, 2, 3])
    model = mk([tvi("X", T.FLOAT, [3]), tvi("W", T.FLOAT, [3])], [tvi("Y", T.FLOAT, [3])],
               [h.make_node("Add", ["X", "W"], ["Y"])], inits=[W])
    same(lambda m: nodeargs(m, model))
    one = np.ones(3, np.float32)
    same(lambda m: sess(m, model).run(None, {"X": one}))
    same(lambda m: sess(m, model).run(None, {"X": one, "W": np.zeros(3, np.float32)}))


# -- run(): feeds ---------------------------------------------------------------------------------------------------
NUMERIC = [T.FLOAT, T.DOUBLE, T.FLOAT16, T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8, T.UINT16, T.UINT32, T.UINT64,
           T.BOOL]


def _identity(elem, shape=(None, 2)):
    return mk([tvi("X", elem, list(shape))], [tvi("Y", elem, list(shape))], [h.make_node("Identity", ["X"], ["Y"])])


@pytest.mark.parametrize("elem", NUMERIC + [T.STRING])
def test_feed_every_dtype_and_layout(elem):
    model = _identity(elem)
    if elem == T.STRING:
        arr = np.array([["a", "b"], ["c", "dé"]], dtype=object)
    else:
        arr = np.array([[1, 0], [1, 1]]).astype(h.tensor_dtype_to_np_dtype(elem))
    for feed in (arr, arr.tolist(), np.asfortranarray(arr), arr[::-1, ::-1], arr[:, :1], arr[:0]):
        same(lambda m, feed=feed: sess(m, model).run(None, {"X": feed}))
    if elem != T.STRING:  # a numpy scalar (not a 0-d array): onnxpy takes it as 0-d (deliberate), onnxruntime not
        with pytest.raises(RuntimeError, match="Unable to handle object of type"):
            sess(ortref, model).run(None, {"X": arr[0, 0]})
        with pytest.raises(onnxpy.InvalidArgument, match="Invalid rank for input: X Got: 0 Expected: 2"):
            onnxpy.InferenceSession(model).run(None, {"X": arr[0, 0]})
    wrong = np.ones((2, 2), np.float64 if elem == T.FLOAT else np.float32)
    same_error(lambda m: sess(m, model).run(None, {"X": wrong}), "InvalidArgument")
    wrong_int = np.ones((2, 2), np.int32 if elem == T.INT64 else np.int64)
    same_error(lambda m: sess(m, model).run(None, {"X": wrong_int}), "InvalidArgument")


def test_feed_0d_and_scalar_inputs():
    model = _identity(T.FLOAT, ())
    same(lambda m: sess(m, model).run(None, {"X": np.array(2.5, np.float32)}))
    # deliberate: onnxpy accepts a numpy scalar as a 0-d tensor (the ONNX backend test data holds some)
    with pytest.raises(RuntimeError, match="Unable to handle object of type <class 'numpy.float32'>"):
        sess(ortref, model).run(None, {"X": np.float32(2.5)})
    assert onnxpy.InferenceSession(model).run(None, {"X": np.float32(2.5)})[0] == np.float32(2.5)
    same_error(lambda m: sess(m, model).run(None, {"X": 2.5}), "RuntimeError")
    same_error(lambda m: sess(m, model).run(None, {"X": 2}), "RuntimeError")
    # a rank-0 declared input is not shape-checked by onnxruntime
    same(lambda m: sess(m, model).run(None, {"X": np.ones((1, 2), np.float32)}))


FLOAT_FEEDS = {
    "list_int": [[1, 2, 3]], "list_bool": [[True, False, True]], "list_mixed": [[1, 2.5, True]],
    "ragged": [[1, 2, 3], [1]], "list_of_dicts": [{"a": 1.0}], "object_array": X23.astype(object),
    "unicode_array": X23.astype(str), "bool_array": X23 > 0, "rank3": X23[None], "dims": np.ones((2, 4), np.float32),
    "rank1": X23[0], "empty": np.zeros((0, 3), np.float32), "strided": np.ones((2, 6), np.float32)[:, ::2],
    "readonly": np.frombuffer(X23.tobytes(), np.float32).reshape(2, 3), "str": "abc", "bytes": b"abc",
    "np_str": np.str_("x"), "np_bytes": np.bytes_(b"x"), "set": {1.0}, "range": range(3), "py_bool": True,
    "dict_int_float": {1: 2.0}, "dict_str_float": {"a": 2.5}, "dict_str_str": {"a": "b"},
    "list_of_arrays": [X23[0], X23[1]],
    "empty_list": [], "int64": X23.astype(np.int64), "int32": X23.astype(np.int32), "float64": X23.astype(np.float64),
    "float16": X23.astype(np.float16),
}


@pytest.mark.parametrize("name", sorted(FLOAT_FEEDS))
def test_feed_variants_for_a_float_input(name):
    v = FLOAT_FEEDS[name]
    same(lambda m: sess(m, RELU).run(None, {"X": v}))


STRING_MODEL = _identity(T.STRING, (None,))


@pytest.mark.parametrize("feed", [np.array(["ab", "cé"]), ["a", "b"], np.array(["a", "b"], dtype=object),
                                  np.array([], dtype=object), np.array([1, 2]), np.array([1.5]), {1: 2.0}],
                         ids=["unicode", "list", "object", "empty", "int", "float", "dict"])
def test_string_feeds(feed):
    same(lambda m: sess(m, STRING_MODEL).run(None, {"X": feed}))


def test_string_feeds_onnxpy_decodes_bytes():
    """Deliberate: onnxruntime ``str()``s bytes (b'a' -> "b'a'") and misreads fixed-width ``S`` arrays
    ([b"ab", b"c"] -> ["abc", "c"]); onnxpy decodes bytes as UTF-8."""
    s = onnxpy.InferenceSession(STRING_MODEL)
    for feed in (np.array([b"ab", b"c"]), [b"ab", b"c"], np.array([b"ab", b"c"], dtype=object)):
        out = s.run(None, {"X": feed})[0]
        assert out.dtype == object and out.tolist() == ["ab", "c"]
    # other objects go through str(), as in onnxruntime
    same(lambda m: sess(m, STRING_MODEL).run(None, {"X": np.array(["a", 1, 2.5], dtype=object)}))


def test_feed_extras_kept_in_onnxpy():
    """Deliberate extras: tuples are accepted like lists, big-endian arrays are converted (onnxruntime reads their
    bytes as native and returns garbage), ml_dtypes arrays run."""
    s = onnxpy.InferenceSession(RELU)
    np.testing.assert_array_equal(s.run(None, {"X": ((1.0, -2.0, 3.0),)})[0], [[1, 0, 3]])
    np.testing.assert_array_equal(s.run(None, {"X": X23.astype(">f4")})[0], np.maximum(X23, 0))
    with pytest.raises(RuntimeError, match="Input must be a list of dictionaries"):
        sess(ortref, RELU).run(None, {"X": ((1.0, -2.0, 3.0),)})


def test_none_for_a_required_tensor():
    """Deliberate: onnxruntime fails inside the kernel (Fail: ... Missing Input: X); onnxpy refuses the feed."""
    with pytest.raises(Exception) as theirs:
        sess(ortref, RELU).run(None, {"X": None})
    assert type(theirs.value).__name__ == "Fail" and "Missing Input: X" in str(theirs.value)
    with pytest.raises(onnxpy.InvalidArgument, match="Input 'X' is None"):
        onnxpy.InferenceSession(RELU).run(None, {"X": None})


@pytest.mark.parametrize("call", ["missing", "extra", "feed_list", "feed_none", "out_unknown", "out_unknown2"])
def test_run_argument_errors(call):
    f = {
        "missing": lambda s: s.run(None, {}),
        "extra": lambda s: s.run(None, {"X": X23, "Z": X23}),
        "feed_list": lambda s: s.run(None, [X23]),
        "feed_none": lambda s: s.run(None, None),
        "out_unknown": lambda s: s.run(["Q"], {"X": X23}),
        "out_unknown2": lambda s: s.run(["Y", "Q", "R"], {"X": X23}),
    }[call]
    same_error(lambda m: f(sess(m, RELU)))


@pytest.mark.parametrize("call", ["out_str", "non_str_key", "bad_run_options"])
def test_run_type_errors(call):
    f = {
        "out_str": lambda s: s.run("Y", {"X": X23}),
        "non_str_key": lambda s: s.run(None, {"X": X23, 1: X23}),
        "bad_run_options": lambda s: s.run(None, {"X": X23}, 3),
    }[call]
    a = same_error(lambda m: f(sess(m, RELU)), "TypeError", prefix_only=True)
    assert a[2].startswith("run(): incompatible function arguments")


@pytest.mark.parametrize("names", [None, [], ["Y"], ("Y",), ["Y", "Y"]], ids=["None", "empty", "list", "tuple",
                                                                             "dup"])
def test_output_names(names):
    same(lambda m: sess(m, RELU).run(names, {"X": X23}))


def test_wrong_rank_and_dims_messages():
    same_error(lambda m: sess(m, RELU).run(None, {"X": X23[None]}), "InvalidArgument")
    same_error(lambda m: sess(m, RELU).run(None, {"X": np.ones((2, 4), np.float32)}), "InvalidArgument")
    m2 = _identity(T.FLOAT, (2, 3))
    same_error(lambda m: sess(m, m2).run(None, {"X": np.ones((3, 4), np.float32)}), "InvalidArgument")


# -- sequences, maps, optionals ------------------------------------------------------------------------------------
SEQ_LEN = mk([h.make_value_info("S", SEQ)], [tvi("L", T.INT64, [])], [h.make_node("SequenceLength", ["S"], ["L"])])
SEQ_ID = mk([h.make_value_info("S", SEQ)], [h.make_value_info("S2", SEQ)], [h.make_node("Identity", ["S"], ["S2"])])


@pytest.mark.parametrize("feed", [[X23, X23], [], [X23[0], X23[:, 0]], X23],
                         ids=["two", "empty", "ragged_shapes", "ndarray"])
def test_sequence_inputs(feed):
    for model in (SEQ_LEN, SEQ_ID):
        same(lambda m, model=model: sess(m, model).run(None, {"S": feed}))


def test_sequence_input_extras():
    """Deliberate: onnxpy also takes tuples and lists as sequence elements (onnxruntime: RuntimeError), and names
    a wrong element dtype with InvalidArgument (onnxruntime: RuntimeError from TensorSeq internals)."""
    s = onnxpy.InferenceSession(SEQ_LEN)
    assert s.run(None, {"S": (X23, X23)})[0] == 2
    assert s.run(None, {"S": [[1.0, 2.0], [3.0]]})[0] == 2
    with pytest.raises(onnxpy.InvalidArgument, match=r"Actual: \(tensor\(int64\)\)"):
        s.run(None, {"S": [X23.astype(np.int64)]})
    with pytest.raises(RuntimeError):
        sess(ortref, SEQ_LEN).run(None, {"S": [X23.astype(np.int64)]})


def test_sequence_outputs():
    model = mk([tvi("X", T.FLOAT, ["N", 3])], [h.make_value_info("Q", SEQ)],
               [h.make_node("SplitToSequence", ["X"], ["Q"], axis=0)])
    same(lambda m: sess(m, model).run(None, {"X": X23}))
    same(lambda m: sess(m, model).run(None, {"X": X23[:0]}))


@pytest.mark.parametrize("feed", [{"O": None}, {}, {"O": X23[0]}, {"O": [1.0, 2.0]}, {"O": X23[0].astype(np.int32)}],
                         ids=["none", "omitted", "value", "list", "wrong_dtype"])
def test_optional_tensor_inputs(feed):
    model = mk([h.make_value_info("O", OPT_T)], [tvi("B", T.BOOL, [])],
               [h.make_node("OptionalHasElement", ["O"], ["B"])])
    same(lambda m: sess(m, model).run(None, feed))


@pytest.mark.parametrize("feed", [{"O": None}, {}, {"O": [X23]}, {"O": []}], ids=["none", "omitted", "value", "empty"])
def test_optional_sequence_inputs(feed):
    model = mk([h.make_value_info("O", OPT_SEQ)], [tvi("B", T.BOOL, [])],
               [h.make_node("OptionalHasElement", ["O"], ["B"])])
    same(lambda m: sess(m, model).run(None, feed))


def test_optional_outputs():
    opt = h.make_optional_type_proto(h.make_tensor_type_proto(T.FLOAT, None))
    model = mk([h.make_value_info("O", opt)], [h.make_value_info("P", opt)], [h.make_node("Identity", ["O"], ["P"])])
    same(lambda m: sess(m, model).run(None, {"O": None}))
    same(lambda m: sess(m, model).run(None, {"O": X23}))
    empty = mk([tvi("X", T.FLOAT, [None])], [h.make_value_info("P", opt)],
               [h.make_node("Optional", [], ["P"], type=h.make_tensor_type_proto(T.FLOAT, None))])
    same(lambda m: sess(m, empty).run(None, {"X": X23[0]}))

    def empty_ortvalue(m):
        s = sess(m, empty)  # (onnxruntime crashes on data_type() of an empty optional; has_value() only)
        return [o.has_value() for o in s.run_with_ort_values(None, {"X": m.OrtValue.ortvalue_from_numpy(X23[0])})]
    same(empty_ortvalue)


DICTVEC_I = mk([h.make_value_info("M", MAP_IF)], [tvi("Y", T.FLOAT, None)],
               [h.make_node("DictVectorizer", ["M"], ["Y"], domain="ai.onnx.ml", int64_vocabulary=[1, 2, 3])],
               extra=[("ai.onnx.ml", 3)])
DICTVEC_S = mk([h.make_value_info("M", MAP_SD)], [tvi("Y", T.DOUBLE, None)],
               [h.make_node("DictVectorizer", ["M"], ["Y"], domain="ai.onnx.ml", string_vocabulary=["a", "b"])],
               extra=[("ai.onnx.ml", 3)])


@pytest.mark.parametrize("feed", [{1: 2.0, 3: 4.0}, {1: 2, 3: 4}, {np.int64(1): np.float32(2)}, {}, X23,
                                  {"a": 1.0}], ids=["ok", "int_values", "np_keys", "empty", "ndarray", "str_keys"])
def test_map_inputs_int_keys(feed):
    same(lambda m: sess(m, DICTVEC_I).run(None, {"M": feed}))


@pytest.mark.parametrize("feed", [{1: 2.0}], ids=["int_keys"])
def test_map_inputs_str_keys(feed):
    same(lambda m: sess(m, DICTVEC_S).run(None, {"M": feed}))


def test_map_input_extras_kept_in_onnxpy():
    """Deliberate: onnxruntime builds every Python dict as map(.., tensor(float)) and so cannot feed a
    map(string, double) input; onnxpy converts the values.  A list fed to a map input is an InvalidArgument naming
    the input (onnxruntime: an internal RuntimeError about missing type information)."""
    assert onnxpy.InferenceSession(DICTVEC_S).run(None, {"M": {"a": 2.0}})[0].tolist() == [[2.0, 0.0]]
    with pytest.raises(Exception, match=r"Actual: \(\(map\(string,tensor\(float\)\)\)\)"):
        sess(ortref, DICTVEC_S).run(None, {"M": {"a": 2.0}})
    with pytest.raises(onnxpy.InvalidArgument, match="Input 'M' expects a map"):
        onnxpy.InferenceSession(DICTVEC_I).run(None, {"M": [1.0]})


def test_map_pass_through_and_zipmap_outputs():
    passthru = mk([h.make_value_info("M", MAP_IF)], [h.make_value_info("M", MAP_IF)], [])
    same(lambda m: sess(m, passthru).run(None, {"M": {1: 2.0}}))
    for labels in ({"classlabels_int64s": [0, 1, 2]}, {"classlabels_strings": ["a", "b", "c"]}):
        model = mk([tvi("X", T.FLOAT, ["N", 3])], [h.make_value_info("Z", UNTYPED)],
                   [h.make_node("ZipMap", ["X"], ["Z"], domain="ai.onnx.ml", **labels)], extra=[("ai.onnx.ml", 3)])
        same(lambda m, model=model: sess(m, model).run(None, {"X": X23}))
        same(lambda m, model=model: [type(v).__name__ for v in sess(m, model).run(None, {"X": X23})[0][0].values()])


# -- OrtValue -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                np.uint16, np.uint32, np.uint64, np.bool_])
def test_ortvalue_from_numpy(dt):
    arr = X23.astype(dt)
    same(lambda m: ov_info(m.OrtValue.ortvalue_from_numpy(arr)))
    same(lambda m: ov_info(m.OrtValue.ortvalue_from_numpy(np.asfortranarray(arr))))
    same(lambda m: ov_info(m.OrtValue.ortvalue_from_numpy(arr[::-1])))
    same(lambda m: ov_info(m.OrtValue.ortvalue_from_numpy(np.array(arr[0, 0]))))


def test_ortvalue_zero_copy_and_data_ptr():
    def check(m):
        a = X23.copy()
        o = m.OrtValue.ortvalue_from_numpy(a)
        same_ptr = o.data_ptr() == a.__array_interface__["data"][0]
        a[0, 0] = 42
        neg = X23[::-1]
        o2 = m.OrtValue.ortvalue_from_numpy(neg)
        return same_ptr, o.data_ptr() == o.data_ptr(), o.numpy()[0, 0].item(), \
            o2.data_ptr() == neg.__array_interface__["data"][0], o2.numpy().tolist()
    same(check)


def test_ortvalue_devices():
    same_error(lambda m: m.OrtValue.ortvalue_from_numpy(X23, "cuda", 0), "RuntimeError")
    # onnxruntime raises a bare Exception for an unknown device; onnxpy a RuntimeError with the same text
    a, b = both(lambda m: m.OrtValue.ortvalue_from_numpy(X23, "foo", 0))
    assert (a[1], b[1]) == ("RuntimeError", "Exception") and a[2] == b[2]


@pytest.mark.parametrize("et", [np.float32, np.int64, np.bool_, np.float16, np.uint8, 1, 7, 9, 10, 11])
def test_ortvalue_from_shape_and_type(et):
    # the buffer is uninitialised in onnxruntime: compare everything but the values
    same(lambda m: ov_info(m.OrtValue.ortvalue_from_shape_and_type([2, 3], et), values=False))
    same(lambda m: ov_info(m.OrtValue.ortvalue_from_shape_and_type((4,), et), values=False))
    same(lambda m: m.OrtValue.ortvalue_from_shape_and_type([2, 3], et).numpy().shape)


@pytest.mark.parametrize("et", [16, 17, 22, 21])
def test_ortvalue_from_shape_and_type_narrow_types(et):
    """bfloat16/float8/int4: same metadata (int4 packs two per byte); onnxpy's numpy() returns ml_dtypes arrays
    where onnxruntime raises (bf16, int4) or returns raw uint8 (float8) -- deliberate."""
    same(lambda m: ov_info(m.OrtValue.ortvalue_from_shape_and_type([2, 3], et), values=False))
    import ml_dtypes  # noqa: F401 - the dtype names below come from it

    arr = onnxpy.OrtValue.ortvalue_from_shape_and_type([2, 3], et).numpy()
    assert arr.dtype == onnxpy.dtypes.to_numpy(et)


def test_ortvalue_constructor_errors():
    same_error(lambda m: m.OrtValue.ortvalue_from_shape_and_type([2], 99), "RuntimeError")
    same_error(lambda m: m.OrtValue.ortvalue_from_shape_and_type([-1, 3], np.float32), "RuntimeError",
               suffix="Tensor shape.Size() must be >= 0")
    same_error(lambda m: m.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ones(3, np.float64), 1), "RuntimeError")
    same_error(lambda m: m.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ones(3, np.float32), 99), "RuntimeError")


@pytest.mark.parametrize("arr,et", [(np.arange(3, dtype=np.uint16), 16), (np.arange(2, dtype=np.uint8), 22),
                                    (np.arange(2, dtype=np.uint8), 17), (np.arange(3, dtype=np.float32), 1),
                                    (np.arange(3, dtype=np.int32), 1)], ids=["bf16", "int4", "f8", "f32", "i32->f32"])
def test_ortvalue_from_numpy_with_onnx_type(arr, et):
    same(lambda m: ov_info(m.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, et), values=False))
    if et in (1,):
        same(lambda m: m.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, et).numpy())


def test_ortvalue_extras_kept_in_onnxpy():
    """Deliberate: onnxpy builds OrtValues from ml_dtypes, complex, string arrays, numpy scalars and lists, which
    onnxruntime refuses."""
    import ml_dtypes

    for v in (X23.astype(ml_dtypes.bfloat16), X23.astype(np.complex64), np.array(["a", "b"]), np.float32(1),
              [1.0, 2.0]):
        with pytest.raises(RuntimeError):
            ortref.OrtValue.ortvalue_from_numpy(v)
        o = onnxpy.OrtValue.ortvalue_from_numpy(v)
        assert o.is_tensor()
    assert onnxpy.OrtValue.ortvalue_from_numpy(np.array(["a", "b"])).numpy().dtype == object
    assert onnxpy.OrtValue.ortvalue_from_shape_and_type([2], np.str_).numpy().tolist() == ["", ""]


@pytest.mark.parametrize("src", ["same", "ortvalue", "reshaped", "other_size", "list"])
def test_ortvalue_update_inplace(src):
    def f(m):
        o = m.OrtValue.ortvalue_from_numpy(X23.copy())
        p = o.data_ptr()
        v = {"same": X23 * 2, "ortvalue": m.OrtValue.ortvalue_from_numpy(X23 + 1),
             "reshaped": np.arange(6, dtype=np.float32).reshape(3, 2), "other_size": np.ones(4, np.float32),
             "list": X23.tolist()}[src]
        o.update_inplace(v)
        return o.numpy(), o.data_ptr() == p
    same(f)


def test_ortvalue_update_inplace_converts_dtype():
    """Deliberate: onnxruntime copies raw bytes of a different dtype (garbage); onnxpy converts the values."""
    o = onnxpy.OrtValue.ortvalue_from_numpy(X23.copy())
    o.update_inplace(np.full((2, 3), 7.0))
    assert o.numpy().dtype == np.float32 and (o.numpy() == 7).all()


TWO_OUT = mk([tvi("X", T.FLOAT, ["N", 3])], [tvi("Y", T.FLOAT, None), h.make_value_info("Q", SEQ)],
             [h.make_node("Relu", ["X"], ["Y"]), h.make_node("SplitToSequence", ["X"], ["Q"], axis=0)])


def test_run_with_ort_values():
    def f(m, names=None, feed=None, model=TWO_OUT):
        s = sess(m, model)
        feed = feed if feed is not None else {"X": m.OrtValue.ortvalue_from_numpy(X23)}
        # (onnxruntime 1.32 returns a reused buffer for Y when Q is fetched too: values compared on RELU only)
        return [ov_info(o, values=model is RELU) | {"type": type(o).__name__}
                for o in s.run_with_ort_values(names, feed)]
    same(f)
    same(lambda m: f(m, ["Q"]))
    same(lambda m: f(m, None, None, RELU))
    same(lambda m: f(m, ["Y"], None, RELU))
    same_error(lambda m: f(m, None, {"X": X23}), "AttributeError")
    same_error(lambda m: f(m, None, {"X": m.OrtValue.ortvalue_from_numpy(X23.astype(np.float64))}))
    same_error(lambda m: f(m, None, {}), "ValueError")

    def seq_methods(m):
        o = sess(m, TWO_OUT).run_with_ort_values(["Q"], {"X": m.OrtValue.ortvalue_from_numpy(X23)})[0]
        return [outcome(getattr(o, n)) for n in ("shape", "numpy", "element_type", "tensor_size_in_bytes",
                                                  "data_ptr", "data_type", "is_tensor_sequence")]
    same(seq_methods)


# -- IOBinding ------------------------------------------------------------------------------------------------------
def test_iobinding_cpu_input_and_allocated_output():
    def f(m):
        s = sess(m, RELU)
        b = s.io_binding()
        b.bind_cpu_input("X", X23)
        b.bind_output("Y")
        s.run_with_iobinding(b)
        r = [b.copy_outputs_to_cpu(), b.get_outputs()]
        b.bind_cpu_input("X", X23 * -1)  # re-run with a changed input
        s.run_with_iobinding(b)
        r.append(b.copy_outputs_to_cpu())
        b.synchronize_inputs()
        b.synchronize_outputs()
        b.clear_binding_outputs()
        r.append(b.get_outputs())
        r.append(outcome(lambda: s.run_with_iobinding(b)))  # no output bound
        b.clear_binding_inputs()
        b.bind_output("Y")
        r.append(outcome(lambda: s.run_with_iobinding(b))[:2])  # no input bound
        return r
    same(f)


def test_iobinding_raw_pointers_and_preallocated_outputs():
    def f(m):
        s = sess(m, RELU)
        b = s.io_binding()
        a = X23.copy()
        out = np.full((2, 3), -7, np.float32)
        b.bind_input("X", "cpu", 0, np.float32, [2, 3], a.ctypes.data)
        b.bind_output("Y", "cpu", 0, np.float32, [2, 3], out.ctypes.data)
        s.run_with_iobinding(b)
        r = [out.copy(), b.copy_outputs_to_cpu(), b.get_outputs()[0].data_ptr() == out.ctypes.data]
        a[:] = 5  # the bound buffer is read at run time
        s.run_with_iobinding(b)
        r.append(out.copy())
        b2 = s.io_binding()
        b2.bind_input("X", "cpu", 0, 1, [2, 3], a.ctypes.data)  # ONNX element type as an int
        b2.bind_output("Y", "cpu")
        s.run_with_iobinding(b2)
        r.append(b2.copy_outputs_to_cpu())
        return r
    same(f)


def test_iobinding_ortvalue_output_filled_in_place():
    def f(m):
        s = sess(m, RELU)
        b = s.io_binding()
        ov = m.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
        b.bind_ortvalue_input("X", m.OrtValue.ortvalue_from_numpy(X23))
        b.bind_ortvalue_output("Y", ov)
        s.run_with_iobinding(b)
        return ov.numpy(), b.get_outputs()[0].data_ptr() == ov.data_ptr()
    same(f)


def test_iobinding_errors():
    def run(m, setup):
        s = sess(m, RELU)
        b = s.io_binding()
        setup(b)
        s.run_with_iobinding(b)
        return b.copy_outputs_to_cpu()
    same_error(lambda m: run(m, lambda b: b.bind_cpu_input("Z", X23)), "RuntimeError")
    same_error(lambda m: run(m, lambda b: (b.bind_cpu_input("X", X23), b.bind_output("Z"))), "RuntimeError")
    same_error(lambda m: run(m, lambda b: (b.bind_cpu_input("X", X23.astype(np.float64)), b.bind_output("Y"))),
               "RuntimeError")
    # binding an output to another device without a buffer is accepted by onnxruntime's CPU build too
    same(lambda m: run(m, lambda b: (b.bind_cpu_input("X", X23), b.bind_output("Y", "cuda"))))
    out = np.zeros((3, 3), np.float32)
    a, b = both(lambda m: run(m, lambda b: (b.bind_cpu_input("X", X23),
                                            b.bind_output("Y", "cpu", 0, np.float32, [3, 3], out.ctypes.data))))
    assert a[:2] == b[:2] == ("err", "RuntimeError")
    for msg in (a[2], b[2]):
        assert msg.startswith("Error in execution: ")
        assert "has shape {3,3} but the computed output shape for this run is {2,3}" in msg

    def other_session(m):
        s1, s2 = sess(m, RELU), sess(m, RELU)
        b = s1.io_binding()
        b.bind_cpu_input("X", X23)
        b.bind_output("Y")
        s2.run_with_iobinding(b)
    same_error(other_session, "ValueError")


# -- SessionOptions / RunOptions ----------------------------------------------------------------------------------
SO_ATTRS = ["enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "enable_profiling", "execution_mode",
            "execution_order", "graph_optimization_level", "inter_op_num_threads", "intra_op_num_threads",
            "log_severity_level", "log_verbosity_level", "logid", "optimized_model_filepath", "profile_file_prefix",
            "use_deterministic_compute", "use_per_session_threads"]
RO_ATTRS = ["log_severity_level", "log_verbosity_level", "logid", "only_execute_path_to_fetches", "terminate"]


def _attr(v):
    return type(v).__name__, str(v), repr(v) if not hasattr(v, "name") else v.name


def test_options_defaults():
    same(lambda m: {a: _attr(getattr(m.SessionOptions(), a)) for a in SO_ATTRS})
    same(lambda m: {a: _attr(getattr(m.RunOptions(), a)) for a in RO_ATTRS})
    same(lambda m: [a for a in SO_ATTRS + ["add_session_config_entry", "get_session_config_entry", "add_initializer",
                                           "add_external_initializers", "add_free_dimension_override_by_name",
                                           "add_free_dimension_override_by_denotation", "register_custom_ops_library"]
                    if not hasattr(m.SessionOptions(), a)])


def test_enums():
    same(lambda m: [(str(e), repr(e), int(e), e.name) for cls in (m.GraphOptimizationLevel, m.ExecutionMode,
                                                                   m.ExecutionOrder) for e in cls.__members__.values()])
    same(lambda m: (m.GraphOptimizationLevel.ORT_ENABLE_ALL == 99, m.ExecutionMode.ORT_PARALLEL == 1))


SO_SETS = [("graph_optimization_level", "LEVEL_BASIC"), ("execution_mode", "MODE_PARALLEL"),
           ("execution_order", "ORDER_PRIORITY"), ("graph_optimization_level", 5), ("graph_optimization_level", "x"),
           ("graph_optimization_level", -1), ("execution_mode", 2), ("execution_order", 7),
           ("intra_op_num_threads", -1), ("intra_op_num_threads", 2), ("intra_op_num_threads", 2.5),
           ("intra_op_num_threads", "2"), ("inter_op_num_threads", -3), ("log_severity_level", 7), ("logid", "a"),
           ("logid", 3), ("enable_profiling", 1), ("enable_profiling", "yes"), ("enable_mem_pattern", 0),
           ("optimized_model_filepath", 3), ("use_deterministic_compute", True), ("profile_file_prefix", None),
           ("foo_attr", 1)]


@pytest.mark.parametrize("attr,val", SO_SETS, ids=[f"{a}={v}" for a, v in SO_SETS])
def test_session_options_set_and_read_back(attr, val):
    def f(m):
        v = val
        if isinstance(v, str) and v.startswith(("LEVEL_", "MODE_", "ORDER_")):
            v = {"LEVEL_BASIC": m.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                 "MODE_PARALLEL": m.ExecutionMode.ORT_PARALLEL, "ORDER_PRIORITY": m.ExecutionOrder.PRIORITY_BASED}[v]
        so = m.SessionOptions()
        setattr(so, attr, v)
        return _attr(getattr(so, attr))
    a, b = both(f)
    if b[0] == "err" and b[1] == "TypeError":  # pybind11's long signature text: compare the start
        assert a[:2] == b[:2] and a[2].startswith("(): incompatible function arguments"), (a, b)
    elif b[0] == "err" and b[1] == "AttributeError":
        assert a[:2] == b[:2] and a[2].endswith("object has no attribute 'foo_attr'")
    else:
        assert a == b


def test_session_options_enum_ints_accepted_by_onnxpy():
    """Deliberate: onnxpy takes a plain int naming an enum member (onnxruntime: TypeError) and stores the enum."""
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = 1
    so.execution_mode = 1
    assert so.graph_optimization_level is onnxpy.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.execution_mode is onnxpy.ExecutionMode.ORT_PARALLEL
    with pytest.raises(TypeError):
        ortref.SessionOptions().graph_optimization_level = 1


@pytest.mark.parametrize("attr,val", [("log_severity_level", 3), ("log_severity_level", "x"), ("terminate", 1),
                                      ("only_execute_path_to_fetches", 1), ("logid", 5), ("logid", "r"), ("foo", 1)])
def test_run_options_set_and_read_back(attr, val):
    def f(m):
        ro = m.RunOptions()
        setattr(ro, attr, val)
        return _attr(getattr(ro, attr))
    a, b = both(f)
    if b[0] == "err":
        assert a[:2] == b[:2], (a, b)
    else:
        assert a == b


def test_config_entries():
    def f(m):
        so = m.SessionOptions()
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        ro = m.RunOptions()
        ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        return [so.get_session_config_entry("session.intra_op.allow_spinning"),
                outcome(lambda: so.get_session_config_entry("nope")),
                ro.get_run_config_entry("memory.enable_memory_arena_shrinkage"),
                outcome(lambda: ro.get_run_config_entry("nope"))]
    same(f)
    a, b = both(lambda m: m.SessionOptions().add_session_config_entry("k", 1))
    assert a[:2] == b[:2] == ("err", "TypeError")


def test_session_options_methods_errors():
    same(lambda m: m.SessionOptions().add_free_dimension_override_by_denotation("DATA_BATCH", 3))
    same(lambda m: m.SessionOptions().add_free_dimension_override_by_name("N", 3))
    same_error(lambda m: m.SessionOptions().add_free_dimension_override_by_name("N", "x"), "TypeError",
               prefix_only=True)
    suffix = "The provided Python object must be an OrtValue"
    same_error(lambda m: m.SessionOptions().add_initializer("W", np.ones(3, np.float32)), "RuntimeError",
               suffix=suffix)
    same_error(lambda m: m.SessionOptions().add_initializer("W", None), "RuntimeError", suffix=suffix)
    same(lambda m: m.SessionOptions().add_initializer("W", m.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))))
    same_error(lambda m: m.SessionOptions().add_external_initializers(["a"], [np.ones(3, np.float32)]),
               "AttributeError")
    same_error(lambda m: m.SessionOptions().add_external_initializers(
        ["a", "b"], [m.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))]), "RuntimeError",
        suffix="Expecting names and ort_values lists to have equal length")


def test_free_dimension_override_by_denotation_and_initializers():
    x = h.make_tensor_value_info("X", T.FLOAT, ["N", 3])
    x.type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    W = h.make_tensor("W", T.FLOAT, [3], [1, 2, 3])
    model = mk([x, tvi("W", T.FLOAT, [3])], [tvi("Y", T.FLOAT, ["N", 3])], [h.make_node("Add", ["X", "W"], ["Y"])],
               inits=[W])

    def f(m, external):
        so = m.SessionOptions()
        so.add_free_dimension_override_by_denotation("DATA_BATCH", 2)
        w = m.OrtValue.ortvalue_from_numpy(np.full(3, 10, np.float32))
        if external:
            so.add_external_initializers(["W"], [w])
        else:
            so.add_initializer("W", w)
        s = m.InferenceSession(model, so, providers=CPU)
        return [(a.name, a.shape) for a in s.get_inputs()], s.run(None, {"X": X23}), \
            outcome(lambda: s.run(None, {"X": X23[:1]}))[:2]
    same(lambda m: f(m, False))
    # add_external_initializers only replaces initializers whose data is external
    same_error(lambda m: f(m, True), "Fail", suffix="Trying to replace non-external initializer with external data")


def test_run_options_terminate():
    def f(m):
        ro = m.RunOptions()
        ro.terminate = True
        return sess(m, RELU).run(None, {"X": X23}, ro)
    same_error(f, "Fail")


# -- InferenceSession constructor and session methods ---------------------------------------------------------------
def _ctor(m, *args, **kwargs):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        s = m.InferenceSession(*args, **kwargs)
    msgs = [str(r.message).split("Available")[0] for r in rec if issubclass(r.category, UserWarning)]
    return s.get_providers(), s.get_provider_options(), msgs, s.run(None, {"X": X23})


def test_constructor_sources(tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(RELU)
    same(lambda m: _ctor(m, str(p)))
    same(lambda m: _ctor(m, pathlib.Path(p)))
    same(lambda m: _ctor(m, RELU))
    same(lambda m: _ctor(m, RELU, providers=CPU))
    same_error(lambda m: m.InferenceSession(3), "TypeError")
    same_error(lambda m: m.InferenceSession(str(tmp_path / "nope.onnx")), "NoSuchFile")
    (tmp_path / "bad.onnx").write_bytes(b"\x00garbage\xff" * 3)
    same_error(lambda m: m.InferenceSession(str(tmp_path / "bad.onnx")), "InvalidProtobuf")


def test_constructor_extras_kept_in_onnxpy():
    """Deliberate: onnxpy also loads a ModelProto, a bytearray or a memoryview (onnxruntime: TypeError)."""
    proto = onnx.load_from_string(RELU)
    for src in (proto, bytearray(RELU), memoryview(RELU)):
        assert onnxpy.InferenceSession(src).run(None, {"X": X23})[0].shape == (2, 3)
    for src in (proto, bytearray(RELU)):
        with pytest.raises(TypeError, match="Unable to load from type"):
            ortref.InferenceSession(src, providers=CPU)


@pytest.mark.parametrize("providers,opts", [
    ([("CPUExecutionProvider", {"arena_extend_strategy": "kSameAsRequested", "x": 1})], None),
    (["CPUExecutionProvider"], [{"a": 1}]),
    (["CPUExecutionProvider", "CPUExecutionProvider"], None),
    (["FooExecutionProvider", "CPUExecutionProvider"], None),
    (["CUDAExecutionProvider", "CPUExecutionProvider"], None),
    ([], None),
], ids=["tuple_options", "provider_options", "duplicate", "unknown", "cuda", "empty"])
def test_constructor_providers(providers, opts):
    same(lambda m: _ctor(m, RELU, providers=providers, provider_options=opts))


def test_provider_argument_errors_raise_in_onnxpy():
    """Deliberate: onnxruntime prints an 'EP Error' and silently retries on CPU for a malformed providers argument;
    onnxpy raises the ValueError."""
    for kw in ({"providers": ["CPUExecutionProvider"], "provider_options": [{}, {}]},
               {"providers": [("CPUExecutionProvider", {})], "provider_options": [{}]},
               {"providers": [("CPUExecutionProvider",)]}):
        with pytest.raises(ValueError):
            onnxpy.InferenceSession(RELU, **kw)


def test_session_methods():
    def f(m):
        s = sess(m, RELU)
        so = s.get_session_options()
        r = [so is s.get_session_options(), type(so).__name__]
        s.set_providers(["CPUExecutionProvider"], [{"a": 2}])
        r += [s.get_providers(), s.get_provider_options()]
        s.set_providers()
        r += [s.get_providers(), s.run(None, {"X": X23})]
        s.disable_fallback()
        s.enable_fallback()
        so2 = m.SessionOptions()
        so2.intra_op_num_threads = 1
        s2 = m.InferenceSession(RELU, so2, providers=CPU)
        so2.intra_op_num_threads = 2  # the session keeps its own copy
        r += [s2.get_session_options() is so2, s2.get_session_options().intra_op_num_threads]
        s3 = m.InferenceSession(RELU, providers=CPU, disabled_optimizers=["ConstantFolding"])
        r += [s3.run(None, {"X": X23}), s3.end_profiling(), s3.get_profiling_start_time_ns()]
        return r
    same(f)


@pytest.mark.parametrize("fields", [{}, {"producer_name": "p", "domain": "d", "doc_string": "doc", "model_version": 3},
                                    {"producer_name": "p"}], ids=["empty", "full", "partial"])
def test_modelmeta(fields):
    g = h.make_graph([h.make_node("Relu", ["X"], ["Y"])], "gname", [tvi("X", T.FLOAT, [1])], [tvi("Y", T.FLOAT, [1])],
                     doc_string="gdoc")
    mod = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], **fields)
    mod.ir_version = 9
    if fields:
        h.set_model_props(mod, {"k": "v", "a": "b"})
    b = mod.SerializeToString()

    def f(m):
        md = sess(m, b).get_modelmeta()
        return {a: getattr(md, a) for a in ("producer_name", "graph_name", "domain", "description",
                                            "graph_description", "version", "custom_metadata_map")}
    same(f)


@pytest.mark.parametrize("feed", ["ok", "bad_dtype", "bad_rank"])
def test_run_async_callback_arguments(feed):
    def f(m):
        s = sess(m, RELU)
        ev = threading.Event()
        got = {}

        def cb(res, user_data, err):
            got["r"] = (type(res).__name__, res, user_data, type(err).__name__, err)
            ev.set()
        v = {"ok": X23, "bad_dtype": X23.astype(np.float64), "bad_rank": X23[None]}[feed]
        s.run_async(None, {"X": v}, cb, {"ud": 1})
        assert ev.wait(10)
        return got["r"]
    same(f)
    same_error(lambda m: sess(m, RELU).run_async(None, {}, lambda *a: None, None), "ValueError")


def test_module_level_names():
    names = ["InferenceSession", "SessionOptions", "RunOptions", "OrtValue", "IOBinding", "SessionIOBinding",
             "NodeArg", "ModelMetadata", "GraphOptimizationLevel", "ExecutionMode", "ExecutionOrder", "SparseTensor",
             "OrtSparseFormat", "get_available_providers", "get_all_providers", "get_device", "get_version_string",
             "get_build_info", "set_default_logger_severity", "set_default_logger_verbosity", "set_seed"]
    same(lambda m: [n for n in names if not hasattr(m, n)])
    same(lambda m: (m.get_device(), m.get_all_providers(), "CPUExecutionProvider" in m.get_available_providers()))
    same(lambda m: sorted(e.name for e in m.OrtSparseFormat.__members__.values()))
    assert os.path.basename(onnxpy.__file__) == "__init__.py"
