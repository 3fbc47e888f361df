"""float32 -> float16 model conversion (``onnxruntime.transformers.float16.convert_float_to_float16``'s API).

Initializers, ``Constant`` / ``ConstantOfShape`` values, ``Cast(to=float)`` and tensor types become float16.  Nodes
that must stay in float32 (``op_block_list``, ``node_block_list``, ops whose schema has no float16 for an input)
get ``Cast`` nodes around them; inputs whose schema only allows float32 (e.g. Resize ``scales``) stay float32.
With ``keep_io_types`` the graph inputs / outputs stay float32 with Casts at the boundary.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16

DEFAULT_OP_BLOCK_LIST = [
    "ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer", "FeatureVectorizer",
    "Imputer", "LabelEncoder", "LinearClassifier", "LinearRegressor", "Normalizer", "OneHotEncoder",
    "RandomUniformLike", "SVMClassifier", "SVMRegressor", "Scaler", "TreeEnsembleClassifier",
    "TreeEnsembleRegressor", "TreeEnsemble", "ZipMap", "NonMaxSuppression", "TopK", "RoiAlign", "Range", "CumSum",
    "Min", "Max", "Upsample",
]


def convert_np_to_float16(np_array, min_positive_val=5.96e-08, max_finite_val=65504.0) -> np.ndarray:
    """Clamp tiny non-zero magnitudes up to ``min_positive_val`` and large ones to ``max_finite_val``, then cast."""
    a = np.asarray(np_array, np.float32)
    mag = np.abs(a)
    sign = np.where(a < 0, -1.0, 1.0).astype(np.float32)
    a = np.where((mag > 0) & (mag < min_positive_val), sign * np.float32(min_positive_val), a)
    a = np.where(np.isfinite(a) & (mag > max_finite_val), sign * np.float32(max_finite_val), a)
    return a.astype(np.float16)


def convert_tensor_float_to_float16(tensor: TensorProto, min_positive_val=5.96e-08, max_finite_val=65504.0):
    if not isinstance(tensor, TensorProto):
        raise TypeError(f"expected a TensorProto, got {type(tensor).__name__}")
    if tensor.data_type != FLOAT:
        return tensor
    arr = numpy_helper.to_array(tensor)
    new = numpy_helper.from_array(convert_np_to_float16(arr, min_positive_val, max_finite_val), tensor.name)
    tensor.CopyFrom(new)
    return tensor


def float_to_float16_max_diff(tensor, min_positive_val=5.96e-08, max_finite_val=65504.0) -> float:
    arr = numpy_helper.to_array(tensor) if isinstance(tensor, TensorProto) else np.asarray(tensor)
    if arr.size == 0:
        return 0.0
    return float(np.abs(convert_np_to_float16(arr, min_positive_val, max_finite_val).astype(np.float32) - arr).max())


def _schema(node, opsets):
    domain = node.domain or ""
    version = opsets.get(domain if domain != "ai.onnx" else "", None)
    if version is None:
        return None
    try:
        return onnx.defs.get_schema(node.op_type, version, domain)
    except Exception:  # noqa: BLE001
        return None


def _allowed(schema, params, idx):
    """Allowed type strings of formal parameter ``idx`` (variadic tail repeats the last one), or None."""
    if schema is None or not params:
        return None
    if idx >= len(params):
        last = params[-1]
        if last.option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
            return None
        p = last
    else:
        p = params[idx]
    for c in schema.type_constraints:
        if c.type_param_str == p.type_str:
            return set(c.allowed_type_strs), p.type_str
    return {p.type_str}, None


def _has_subgraph(node):
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def convert_float_to_float16(model, min_positive_val=5.96e-08, max_finite_val=65504.0, keep_io_types=False,
                             disable_shape_infer=False, op_block_list=None, node_block_list=None,
                             force_fp16_initializers=False, force_fp16_inputs=None,
                             use_bfloat16_as_blocked_nodes_dtype=False) -> onnx.ModelProto:
    """Return a float16 copy of ``model`` (a ModelProto or a path)."""
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        model = onnx.load(model) if not isinstance(model, bytes) else onnx.load_from_string(model)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto or a path, got {type(model).__name__}")
    if min_positive_val <= 0 or max_finite_val <= 0 or max_finite_val > 65504.0:
        raise ValueError("min_positive_val must be > 0 and max_finite_val in (0, 65504]")
    src = onnx.ModelProto()
    src.CopyFrom(model)
    if not disable_shape_infer:
        try:
            src = onnx.shape_inference.infer_shapes(src)
        except Exception:  # noqa: BLE001
            pass
    out = onnx.ModelProto()
    out.CopyFrom(src)
    g = out.graph
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in out.opset_import}
    op_block = set(DEFAULT_OP_BLOCK_LIST if op_block_list is None else op_block_list)
    node_block = set(node_block_list or [])
    force_inputs = dict(force_fp16_inputs or {})

    types: dict[str, int] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        types[t.name] = t.data_type
    io_names = {i.name for i in g.input} | {o.name for o in g.output}
    if isinstance(keep_io_types, (list, tuple, set)):
        keep_io = set(keep_io_types)
    else:
        keep_io = io_names if keep_io_types else set()

    inits = {t.name: t for t in g.initializer}
    graph_inputs = [i.name for i in g.input if i.name not in inits]
    cur: dict[str, int] = {}  # tensor -> elem type after conversion (only float-ish tensors tracked)
    for name in graph_inputs:
        if types.get(name) == FLOAT:
            cur[name] = FLOAT if name in keep_io else FLOAT16
    init_wants: dict[str, set] = {}
    names = set(types) | {o for n in g.node for o in n.output} | {i for n in g.node for i in n.input}
    new_nodes: list = []
    cast_cache: dict[tuple, str] = {}

    def unique(base):
        k, name = 0, base
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.add(name)
        return name

    def cast_to(name, to, before):
        key = (name, to)
        if key not in cast_cache:
            out_name = unique(f"{name}_cast_to_{'fp16' if to == FLOAT16 else 'fp32'}")
            before.append(helper.make_node("Cast", [name], [out_name], name=unique(out_name + "_node"), to=to))
            cast_cache[key] = out_name
        return cast_cache[key]

    init_float = {n for n, t in inits.items() if t.data_type == FLOAT}
    pending_init_refs: list[tuple] = []  # (node, idx, want)

    for node in g.node:
        schema = _schema(node, opsets)
        blocked = (node.op_type in op_block or node.name in node_block or _has_subgraph(node)
                   or node.domain in ("ai.onnx.ml",))
        in_allowed = [_allowed(schema, list(schema.inputs) if schema else [], i) for i in range(len(node.input))]
        if not blocked and schema is not None:
            # an op whose float inputs cannot take float16 at all (in this opset) stays float32
            float_in = [i for i, n in enumerate(node.input) if n and (cur.get(n) in (FLOAT, FLOAT16)
                                                                      or n in init_float)]
            if float_in and not any(in_allowed[i] and "tensor(float16)" in in_allowed[i][0] for i in float_in):
                blocked = True
        fp16_params = set()
        pre = []
        for i, name in enumerate(node.input):
            if not name:
                continue
            is_float_init = name in init_float
            t = cur.get(name)
            if t not in (FLOAT, FLOAT16) and not is_float_init:
                continue
            if blocked:
                want = FLOAT
            elif in_allowed[i] is None:
                want = FLOAT16 if schema is None else FLOAT
            else:
                want = FLOAT16 if "tensor(float16)" in in_allowed[i][0] else FLOAT
            if node.op_type in force_inputs and i in force_inputs[node.op_type]:
                want = FLOAT16
            if want == FLOAT16 and in_allowed[i] and in_allowed[i][1]:
                fp16_params.add(in_allowed[i][1])
            if is_float_init:
                init_wants.setdefault(name, set()).add(want)
                pending_init_refs.append((node, i, want))
                continue
            if t != want:
                node.input[i] = cast_to(name, want, pre)
        new_nodes.extend(pre)
        # attributes carrying float tensors / dtypes
        if not blocked:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == FLOAT:
                    convert_tensor_float_to_float16(a.t, min_positive_val, max_finite_val)
                elif a.type == onnx.AttributeProto.TENSORS:
                    for t in a.tensors:
                        convert_tensor_float_to_float16(t, min_positive_val, max_finite_val)
            if node.op_type == "Constant":
                for a in list(node.attribute):
                    if a.name in ("value_float", "value_floats"):
                        v = np.array(a.f if a.name == "value_float" else list(a.floats), np.float32)
                        node.attribute.remove(a)
                        node.attribute.append(helper.make_attribute(
                            "value", numpy_helper.from_array(convert_np_to_float16(v, min_positive_val,
                                                                                   max_finite_val))))
            for a in node.attribute:
                if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == FLOAT and \
                        node.op_type in ("Cast", "RandomNormal", "RandomUniform", "RandomNormalLike",
                                         "RandomUniformLike", "EyeLike", "Multinomial", "Bernoulli"):
                    a.i = FLOAT16
            if node.op_type in ("RandomNormal", "RandomUniform") and not any(a.name == "dtype"
                                                                            for a in node.attribute):
                node.attribute.append(helper.make_attribute("dtype", FLOAT16))
        # output types
        out_params = list(schema.outputs) if schema else []
        for j, o in enumerate(node.output):
            if not o:
                continue
            t = types.get(o)
            if t != FLOAT:
                continue
            if blocked:
                cur[o] = FLOAT
                continue
            al = _allowed(schema, out_params, j) if schema else None
            if schema is None:
                cur[o] = FLOAT16 if any(cur.get(n) == FLOAT16 for n in node.input) else FLOAT
            elif al is None:
                cur[o] = FLOAT
            elif al[1] is not None and al[1] in fp16_params:
                cur[o] = FLOAT16
            elif node.op_type in ("Constant", "ConstantOfShape", "Cast", "RandomNormal", "RandomUniform",
                                  "RandomNormalLike", "RandomUniformLike", "EyeLike", "Bernoulli") \
                    and "tensor(float16)" in al[0]:
                cur[o] = FLOAT16
            elif al[1] is not None and "tensor(float16)" in al[0] and al[1] not in {
                    (_allowed(schema, list(schema.inputs), i) or (None, None))[1] for i in range(len(node.input))}:
                cur[o] = FLOAT16  # an output-only type parameter (e.g. a dtype attribute)
            else:
                cur[o] = FLOAT
        new_nodes.append(node)

    # initializers: convert in place when every user wants float16, add a float16 copy when users are mixed
    for name, wants in init_wants.items():
        if wants == {FLOAT16} or (force_fp16_initializers and FLOAT16 in wants):
            convert_tensor_float_to_float16(inits[name], min_positive_val, max_finite_val)
        elif wants == {FLOAT, FLOAT16}:
            copy = numpy_helper.from_array(convert_np_to_float16(numpy_helper.to_array(inits[name]),
                                                                 min_positive_val, max_finite_val),
                                           unique(name + "_fp16"))
            g.initializer.append(copy)
            for node, i, want in pending_init_refs:
                if node.input[i] == name and want == FLOAT16:
                    node.input[i] = copy.name

    # graph outputs
    tail = []
    for vi in g.output:
        t = cur.get(vi.name)
        if t is None or not vi.type.HasField("tensor_type") or vi.type.tensor_type.elem_type != FLOAT:
            continue
        want = FLOAT if vi.name in keep_io else FLOAT16
        if t != want:
            inner = unique(vi.name + ("_fp16" if t == FLOAT16 else "_fp32"))
            for n in new_nodes:
                for k, o in enumerate(n.output):
                    if o == vi.name:
                        n.output[k] = inner
                for k, i in enumerate(n.input):
                    if i == vi.name:
                        n.input[k] = inner
            tail.append(helper.make_node("Cast", [inner], [vi.name], name=unique(vi.name + "_cast_node"), to=want))
        vi.type.tensor_type.elem_type = want
    for vi in g.input:
        if vi.name in cur and vi.name not in inits:
            vi.type.tensor_type.elem_type = cur[vi.name]
    del g.node[:]
    g.node.extend(new_nodes + tail)
    # value_info: update float types we know, drop the rest of the float entries
    keep_vi = []
    for vi in g.value_info:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == FLOAT:
            if vi.name in cur:
                vi.type.tensor_type.elem_type = cur[vi.name]
                keep_vi.append(vi)
        else:
            keep_vi.append(vi)
    del g.value_info[:]
    g.value_info.extend(keep_vi)
    return out


def cli_main(argv=None) -> int:
    """``onnxpy convert-fp16 IN OUT [--keep-io-types] [--op-block-list A,B] [--node-block-list n1,n2]``"""
    import argparse

    p = argparse.ArgumentParser(prog="onnxpy convert-fp16", description="convert a float32 model to float16")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--keep-io-types", action="store_true", help="keep float32 graph inputs / outputs")
    p.add_argument("--op-block-list", default=None, help="comma separated op types kept in float32")
    p.add_argument("--node-block-list", default=None, help="comma separated node names kept in float32")
    p.add_argument("--disable-shape-infer", action="store_true")
    p.add_argument("--min-positive-val", type=float, default=5.96e-08)
    p.add_argument("--max-finite-val", type=float, default=65504.0)
    args = p.parse_args(argv)
    try:
        m = convert_float_to_float16(
            onnx.load(args.input), args.min_positive_val, args.max_finite_val, args.keep_io_types,
            args.disable_shape_infer,
            args.op_block_list.split(",") if args.op_block_list is not None else None,
            args.node_block_list.split(",") if args.node_block_list else None)
        onnx.save(m, args.output)
    except (ValueError, TypeError, OSError, onnx.checker.ValidationError) as e:
        print(f"onnxpy convert-fp16: error: {e}")
        return 1
    print(f"wrote {args.output}")
    return 0
