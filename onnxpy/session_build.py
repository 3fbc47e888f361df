"""Session state: the loaded model, its plan, and the feed checks/conversions onnxruntime performs."""

from __future__ import annotations

import threading

import numpy as np

from . import dtypes, limits, logging_utils
from .capi.onnxruntime_pybind11_state import InvalidArgument, InvalidGraph, _OrtError
from .execution.executor import RunContext, run_plan
from .execution.executor import run_subgraph as _subgraph_runner
from .execution.functions import make_function_expander
from .execution.plan import build_plan
from .execution.threads import set_blas_threads
from .ir.load import load_model, read_model_proto, model_from_proto
from .nodearg import INT64_MAX, ModelMetadata, NodeArg
from .ortvalue import OrtValue
from .sparse import SparseTensor




class SessionState:
    """Everything a session needs at run time; immutable after construction (shared by threads)."""

    def __init__(self, source, options, providers, kwargs):
        with logging_utils.session_scope(options, check_config=True):
            self._init(source, options, providers, kwargs)

    def _init(self, source, options, providers, kwargs):
        self.source = source
        self.options = options
        try:
            self.limits = limits.from_config(getattr(options, "_config", None))
        except ValueError as e:
            raise InvalidArgument.make(str(e)) from None
        if isinstance(source, (bytes, bytearray, memoryview)) or hasattr(source, "SerializeToString"):
            model = load_model(source)
        else:
            proto, base_dir = read_model_proto(source)
            model = model_from_proto(proto, base_dir)
        self._apply_initializer_overrides(model)
        source_proto = getattr(model, "proto", None)
        from .ir.validate import check_arity
        from .optimizer.gradient import lower_gradients

        check_arity(model.graph, model.opsets)
        lower_gradients(model.graph)
        from .optimizer import optimize

        try:
            model = optimize(model, options, kwargs)
        except _OrtError:
            raise
        except Exception as e:  # noqa: BLE001 - a pass tripping over a malformed graph must not leak raw errors
            raise InvalidGraph.make(
                f"Graph optimization failed (malformed node arity or structure?): {type(e).__name__}: {e}"
            ) from e
        self.model = model
        g = model.graph
        self.profiler = None
        if options.enable_profiling:
            from .profiling import Profiler

            self.profiler = Profiler(options.profile_file_prefix, source)
        custom = dict(getattr(options, "_custom_ops", {}))
        self.plan = build_plan(g, model.opsets, _subgraph_runner, custom_ops=custom,
                               function_expander=make_function_expander(_subgraph_runner))
        if getattr(options, "enable_cpu_mem_arena", True):
            _keep_freed_buffers()

        if self.profiler is not None:
            self.profiler.session_event("session_initialization", self.profiler._t0, self.profiler.now())
        init_names = set(g.initializers)
        dim_override = self._dim_override if (options._free_dims_by_name or options._free_dims_by_denotation) else None
        self.input_infos = [v for v in g.inputs if v.name not in init_names]
        self.inputs = [NodeArg.from_value_info(v, dim_override) for v in self.input_infos]
        self.overridable = [NodeArg.from_value_info(v) for v in g.inputs if v.name in init_names]
        # Output NodeArgs may need onnx's shape inference (for outputs declared without a shape); it runs on first
        # use, not at load: it costs time on large models, and onnx's C++ inference can crash on hostile graphs.
        needs = source_proto is not None and any(
            v.type is None or v.type.kind != "tensor" or v.type.shape is None
            or any(not isinstance(d, int) for d in v.type.shape) for v in g.outputs)
        self._output_values, self._outputs = g.outputs, None
        try:
            self._slim = _slim_proto(source_proto) if needs else None
        except (ValueError, TypeError):  # e.g. names that are not valid UTF-8: no inference, declared types stay
            self._slim = None
        model.proto = None  # the decoded arrays are what runs; the protobuf copy would double the memory
        self._outputs_lock = threading.Lock()
        self.required = [v.name for v in self.input_infos if v.type is None or v.type.kind != "optional"]
        self.feedable = {v.name: v for v in g.inputs}
        # name -> (slot, kind, np dtype or None, checked dims tuple or None)
        self.feed_specs = {}
        for v, arg in zip(self.input_infos, self.inputs):
            self.feed_specs[v.name] = (self.plan.input_slots[v.name], v.type, arg.shape)
        for v in g.inputs:
            if v.name in init_names:
                self.feed_specs[v.name] = (self.plan.input_slots[v.name], v.type, None)
        self.output_index = {n: i for i, n in enumerate(self.plan.output_names)}
        self.blas_threads = int(options.intra_op_num_threads or 0)
        self.parallel = None
        if int(options.execution_mode) == 1 and options.inter_op_num_threads != 1:
            from .execution.parallel import ParallelSchedule, get_pool

            self.parallel = (ParallelSchedule(self.plan), get_pool(int(options.inter_op_num_threads or 0)))
        self._fetch_plans: dict = {}
        self._const_ids = frozenset(id(v) for v in self.plan.template if isinstance(v, np.ndarray))
        self.meta = ModelMetadata(
            producer_name=model.producer_name,
            graph_name=g.name,
            domain=model.domain,
            description=model.doc_string,
            graph_description=g.doc_string,
            version=model.model_version if model.model_version is not None else INT64_MAX,
            custom_metadata_map=model.metadata,
        )

    @property
    def outputs(self) -> list:
        if self._outputs is None:
            with self._outputs_lock:
                if self._outputs is None:
                    self._outputs = _output_node_args(self._output_values, self._slim)
                    self._slim = None
        return self._outputs

    def _apply_initializer_overrides(self, model):
        ext = getattr(self.options, "_external_names", ())
        if ext and getattr(model, "proto", None) is not None:  # onnxruntime only replaces external initializers
            from .capi.onnxruntime_pybind11_state import Fail

            stored = {t.name: t.data_location for t in model.proto.graph.initializer}
            if any(stored.get(n, 1) != 1 for n in ext):
                raise Fail.make("Trying to replace non-external initializer with external data")
        for name, ov in self.options._initializers.items():
            model.graph.initializers[name] = ov._value

    def _dim_override(self, d, denotation):
        if isinstance(d, str) and d in self.options._free_dims_by_name:
            return self.options._free_dims_by_name[d]
        if denotation and denotation in self.options._free_dims_by_denotation:
            return self.options._free_dims_by_denotation[denotation]
        return d

    # -- feeds ------------------------------------------------------------------------------------
    def check_missing(self, feed):
        missing = [n for n in self.required if n not in feed]
        if missing:
            raise ValueError(f"Required inputs ({missing}) are missing from input feed ({list(feed)}).")

    def convert_feed(self, name, value):
        spec = self.feed_specs.get(name)
        if spec is None:
            raise InvalidArgument.make(f"Invalid input name: {name}")
        slot, t, shape = spec
        if isinstance(value, OrtValue):
            value = value._value
        if isinstance(value, SparseTensor):
            value = value.to_dense()
        kind = t.kind if t is not None else "tensor"
        if kind == "sparse_tensor":
            kind = "tensor"
        if kind == "optional":
            if value is None:
                return slot, None
            t = t.elem
            kind = t.kind if t is not None else "tensor"
        if kind == "tensor":
            return slot, self._convert_tensor(name, value, t, shape)
        if kind == "sequence":
            if isinstance(value, np.ndarray):  # onnxruntime's text (3: its code for a sequence)
                raise InvalidArgument.make(f"input with name: '{name}' expected to be of type: 3 but received a tensor")
            if not isinstance(value, (list, tuple)):
                raise InvalidArgument.make(
                    f"Unexpected input data type for '{name}': expected a list (seq), got {type(value).__name__}"
                )
            et = t.elem if t is not None else None
            return slot, [self._convert_tensor(name, np.asarray(x) if et is None else x, et, None) for x in value]
        if kind == "map":
            if isinstance(value, np.ndarray):  # onnxruntime's text
                raise InvalidArgument.make(f"input with name: '{name}' expected to be of type: 1 but received a tensor")
            if not isinstance(value, dict):
                raise InvalidArgument.make(f"Input '{name}' expects a map (dict), got {type(value).__name__}")
            if not value:
                raise RuntimeError("Size of dictionary is empty, unable to run the prediction.")
            _check_map_keys(value, t)
            vt = t.elem.np_dtype if t is not None and t.elem is not None else None
            if vt is not None and vt.kind != "O":
                value = {k: vt.type(v) for k, v in value.items()}
            return slot, value
        return slot, value

    @staticmethod
    def _convert_tensor(name, value, t, shape):
        want = t.np_dtype if t is not None else None
        if not isinstance(value, np.ndarray):
            if isinstance(value, (list, tuple)):  # a tuple is an onnxpy extra (onnxruntime takes lists only)
                try:
                    value = np.asarray(value, dtype=want if want is not None and want.kind != "O" else None)
                except (ValueError, TypeError):
                    raise RuntimeError("Could not create tensor from given input list") from None
                if value.dtype == object and want != np.dtype(object):
                    raise RuntimeError("Could not create tensor from given input list")
            elif value is None:
                raise InvalidArgument.make(f"Input '{name}' is None but the model expects a tensor")
            elif isinstance(value, dict):
                raise _map_for_tensor(name, value, t)
            elif isinstance(value, (np.number, np.bool_)):  # onnxpy extra: onnxruntime refuses numpy scalars
                value = np.asarray(value)
            elif isinstance(value, (int, float, complex)):
                raise RuntimeError(f"Unable to handle object of type {type(value)}")
            else:
                raise RuntimeError(f"Input must be a list of dictionaries or a single numpy array for input '{name}'.")
        if not value.dtype.isnative:  # onnxruntime reads big-endian buffers as if native; onnxpy converts them
            value = value.astype(value.dtype.newbyteorder("="))
        if want == np.dtype(object) and value.dtype.kind in "USO":
            value = _as_strings(value)
        if want is not None and value.dtype != want:
            got, exp = _type_str(value.dtype), dtypes.type_name(t.elem_type)
            raise InvalidArgument.make(
                f"Unexpected input data type. Actual: (tensor({got})) , expected: (tensor({exp}))"
            )
        if shape and value.ndim != len(shape):
            raise InvalidArgument.make(
                f"Invalid rank for input: {name} Got: {value.ndim} Expected: {len(shape)} Please fix either the "
                "inputs/outputs or the model."
            )
        if shape:
            bad = [(i, g, e) for i, (g, e) in enumerate(zip(value.shape, shape)) if isinstance(e, int) and g != e]
            if bad:
                lines = "".join(f"\n index: {i} Got: {g} Expected: {e}" for i, g, e in bad)
                raise InvalidArgument.make(
                    f"Got invalid dimensions for input: {name} for the following indices{lines}\n Please fix "
                    "either the inputs/outputs or the model."
                )
        return value

    # -- run --------------------------------------------------------------------------------------
    def run(self, output_names, input_feed, run_options=None):
        if isinstance(output_names, (str, bytes)):
            raise TypeError("run(): incompatible function arguments. The following argument types are supported:\n"
                            "    1. (arg0: Sequence[str], arg1: Mapping[str, object], arg2: RunOptions) -> list\n\n"
                            f"Invoked with: {output_names!r} (output_names must be a list of names)")
        if not hasattr(input_feed, "keys"):  # onnxruntime's Python layer calls input_feed.keys() first
            raise AttributeError(f"'{type(input_feed).__name__}' object has no attribute 'keys'")
        if any(not isinstance(k, str) for k in input_feed.keys()) or (
                run_options is not None and not hasattr(run_options, "terminate")):
            raise TypeError("run(): incompatible function arguments. The following argument types are supported:\n"
                            "    1. (arg0: Sequence[str], arg1: Mapping[str, object], arg2: RunOptions) -> list")
        self.check_missing(input_feed)
        feeds = [self.convert_feed(k, v) for k, v in input_feed.items()]
        if output_names:
            try:
                idx = [self.output_index[n] for n in output_names]
            except KeyError as e:
                raise InvalidArgument.make(f"Invalid output name:{e.args[0]}") from None
        else:
            idx = None
        plan = self.plan
        if idx is not None and run_options is not None and run_options.only_execute_path_to_fetches:
            plan = self._fetch_plan(tuple(output_names))
            idx = list(range(len(output_names)))
            feeds = [(plan.input_slots[n], v) for n, (_, v) in zip(input_feed, feeds) if n in plan.input_slots]
        ctx = None
        if run_options is not None or self.profiler is not None:
            ctx = RunContext(run_options, self.profiler)
        if self.blas_threads:
            set_blas_threads(self.blas_threads)
        with np.errstate(all="ignore"), limits.applied(self.limits):  # fp warnings are not ort behaviour
            outs = self._execute(plan, feeds, run_options, ctx)
        if idx is not None:
            outs = [outs[i] for i in idx]
        keep = self._const_ids.union(id(v) for _, v in feeds)
        return [_detach(o, keep) if isinstance(o, np.ndarray) else _py_map(o) if isinstance(o, dict) else o
                for o in outs]

    def _execute(self, plan, feeds, run_options, ctx):
        if self.parallel is not None and plan is self.plan and self.profiler is None:
            outs = self._run_parallel(feeds, run_options)
        elif self.profiler is not None:
            outs = self.profiler.run_model(lambda: run_plan(plan, (), (), ctx, feeds))
        else:
            outs = run_plan(plan, (), (), ctx, feeds)
        return outs

    def _run_parallel(self, feeds, run_options):
        from .execution.parallel import run_parallel

        vals = list(self.plan.template)
        for slot, v in feeds:
            vals[slot] = v
        schedule, pool = self.parallel
        run_parallel(self.plan, schedule, vals, pool, run_options)
        return [vals[s] for s in self.plan.output_slots]

    def _fetch_plan(self, names: tuple):
        """A plan with only the nodes the fetched outputs depend on (cached per fetch list, bounded)."""
        plan = self._fetch_plans.get(names)
        if plan is not None:
            return plan
        from .execution.plan import graph_free_names
        from .ir.model import Graph

        g = self.model.graph
        need = set(names)
        nodes = []
        for n in reversed(g.nodes):
            if any(o in need for o in n.outputs if o):
                nodes.append(n)
                need.update(x for x in n.inputs if x)
                for v in n.attrs.values():
                    if isinstance(v, Graph):
                        need.update(graph_free_names(v))
        nodes.reverse()
        outs = [next(v for v in g.outputs if v.name == n) for n in names]
        sub = Graph(g.name, nodes, [v for v in g.inputs if v.name in need], outs, g.initializers, g.value_info)
        plan = build_plan(sub, self.model.opsets, _subgraph_runner, custom_ops=dict(self.options._custom_ops),
                          function_expander=make_function_expander(_subgraph_runner))
        if len(self._fetch_plans) < 32:
            self._fetch_plans[names] = plan
        return plan


_heap_tuned = False


def _keep_freed_buffers() -> None:
    """The CPU memory "arena" (``enable_cpu_mem_arena``, on by default as in onnxruntime): glibc's malloc is told
    to serve large buffers from its heap and keep freed ones instead of mmap/munmap-ing each activation, which
    otherwise page-faults every large tensor on every run (15-17k faults/run on ResNet-50/VGG-19, ~15% of the
    run time).  Process-wide and done once; a no-op outside glibc."""
    global _heap_tuned
    if _heap_tuned:
        return
    _heap_tuned = True
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: buffers up to 1 GiB come from the (reused) heap
    mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD: do not give the freed top of the heap back after every run
    mallopt(-2, 64 << 20)  # M_TOP_PAD: grow the heap in 64 MiB steps


def _detach(arr: np.ndarray, const_ids) -> np.ndarray:
    """A result the caller may modify freely: views of constants or feeds, and read-only views, are copied.

    Kernels return views where numpy allows (Reshape, Transpose, Expand...); onnxruntime always hands out fresh
    buffers, and a caller writing into a view of an initializer would change the model.
    """
    if arr.base is None and arr.flags.writeable:
        return arr if id(arr) not in const_ids else arr.copy()
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not arr.flags.writeable or id(root) in const_ids or root.base is not None:
        return arr.copy()
    return arr


def _as_strings(value: np.ndarray) -> np.ndarray:
    """A string tensor as an object array of ``str``: bytes are decoded (UTF-8), other objects go through ``str()``.

    onnxruntime applies ``str()`` to every element (``b'a'`` becomes ``"b'a'"``) and misreads fixed-width ``S``
    arrays; onnxpy decodes bytes instead.
    """
    if value.dtype.kind == "U":
        return value.astype(object)
    if value.dtype.kind == "S":
        return np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(value) if value.size else \
            value.astype(object)
    flat = value.reshape(-1)
    if all(type(v) is str for v in flat):
        return value
    conv = [v if type(v) is str else (bytes(v).decode("utf-8", "replace") if isinstance(v, (bytes, np.bytes_))
                                      else str(v)) for v in flat]
    out = np.empty(value.shape, dtype=object)
    out.reshape(-1)[:] = conv
    return out


def _py_map(d: dict) -> dict:
    """A map output with Python keys and values (int/str/float), as onnxruntime returns it."""
    return {(k.item() if isinstance(k, np.generic) else k): (v.item() if isinstance(v, np.generic) else v)
            for k, v in d.items()}


def _check_map_keys(value: dict, t) -> None:
    """onnxruntime refuses a dict whose key kind (str/int) differs from the declared map key type."""
    if t is None or not t.key_type:
        return
    want_str = t.key_type == 8  # STRING
    k = next(iter(value))
    if isinstance(k, (str, np.str_)) != want_str:
        got = "string" if isinstance(k, str) else "int64"
        exp = f"map({dtypes.type_name(t.key_type)},{t.elem.ort_str() if t.elem is not None else ''})"
        raise InvalidArgument.make(
            f"Unexpected input data type. Actual: ((map({got},tensor(float)))) , expected: (({exp}))")


def _map_for_tensor(name, value: dict, t):
    """onnxruntime's error for a dict fed where a tensor is expected."""
    k = next(iter(value), "")
    v = value[k] if value else 0.0
    if isinstance(v, str):
        return RuntimeError(
            f"Unexpected value type  {type(v)}, it cannot be linked to C type string for input '{name}'.")
    key = "string" if isinstance(k, str) else "int64"
    exp = f"tensor({dtypes.type_name(t.elem_type)})" if t is not None and t.elem_type else "tensor"
    return InvalidArgument.make(
        f"Unexpected input data type. Actual: ((map({key},tensor(float)))) , expected: (({exp}))")


def _merge_dims(src: tuple, tgt: tuple) -> tuple | None:
    """onnxruntime's merge of an inferred output shape ``src`` into the declared ``tgt`` (onnx mergeInShapeInfo,
    falling back to a union of the two when they conflict)."""
    if len(src) != len(tgt):
        return None
    out = list(tgt)
    for i, (s, d) in enumerate(zip(src, tgt)):
        if isinstance(s, int):
            if isinstance(d, int) and d != s:  # conflict: keep what agrees, forget the rest
                return tuple(a if a == b else None for a, b in zip(out, src))
            if not isinstance(d, int):
                out[i] = s
        elif d is None and isinstance(s, str):
            out[i] = s
    return tuple(out)


def _merge_type(decl, inf):
    if inf is None:
        return decl
    if decl is None:
        return inf
    if decl.kind != inf.kind:
        return decl
    from dataclasses import replace

    if decl.kind in ("tensor", "sparse_tensor"):
        if decl.elem_type and inf.elem_type and decl.elem_type != inf.elem_type:
            return decl
        shape = decl.shape
        if inf.shape is not None:
            shape = inf.shape if decl.shape is None else _merge_dims(inf.shape, decl.shape)
        den = decl.denotations if shape is not None and len(decl.denotations) == len(shape) else ()
        return replace(decl, elem_type=decl.elem_type or inf.elem_type, shape=shape, denotations=den)
    if decl.kind in ("sequence", "optional", "map"):
        return replace(decl, elem=_merge_type(decl.elem, inf.elem))
    return decl


def _slim_proto(proto):
    """A copy of the model for shape inference: nodes and types, without the large initializers' data."""
    import onnx

    g = proto.graph
    m = onnx.ModelProto(ir_version=proto.ir_version)
    m.opset_import.extend(proto.opset_import)
    m.functions.extend(proto.functions)
    mg = m.graph
    mg.name = g.name
    mg.node.extend(g.node)
    mg.input.extend(g.input)
    mg.value_info.extend(g.value_info)
    mg.sparse_initializer.extend(g.sparse_initializer)
    for o in g.output:
        mg.output.add().name = o.name
    for t in g.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL or t.ByteSize() <= 4096:
            mg.initializer.append(t)
        else:  # only its type and dims matter for inference; the data is left out
            stub = mg.initializer.add()
            stub.name, stub.data_type = t.name, t.data_type
            stub.dims.extend(t.dims)
            stub.data_location = onnx.TensorProto.EXTERNAL
            e = stub.external_data.add()
            e.key, e.value = "location", "__onnxpy_not_loaded__"
    return m


def _inferred_output_types(slim) -> dict:
    """Graph outputs' types from onnx shape inference on a slim copy (see :func:`_slim_proto`)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(slim, check_type=False, strict_mode=False, data_prop=False)
    from .ir.load import decode_type

    return {o.name: _forget_generated_dims(decode_type(o.type)) for o in inferred.graph.output if o.HasField("type")}


def _forget_generated_dims(t):
    """onnx names the unknown dims it creates ``unk__N``; onnxruntime shows them as unnamed (None)."""
    if t is None:
        return None
    from dataclasses import replace

    if t.shape is not None:
        t = replace(t, shape=tuple(None if isinstance(d, str) and d.startswith("unk__") else d for d in t.shape))
    if t.elem is not None:
        t = replace(t, elem=_forget_generated_dims(t.elem))
    return t


def _output_node_args(outputs, proto) -> list:
    """NodeArgs of the graph outputs as onnxruntime shows them: the declared type with the inferred one merged in
    (an output declared without a type or shape gets what shape inference finds)."""
    from .ir.model import ValueInfo

    inferred = {}
    if proto is not None:
        try:
            inferred = _inferred_output_types(proto)
        except Exception:  # noqa: BLE001 - inference is best effort; the declared types stay
            inferred = {}
    return [NodeArg.from_value_info(ValueInfo(v.name, _merge_type(v.type, inferred.get(v.name))))
            for v in outputs]


def _type_str(dt) -> str:
    try:
        return dtypes.type_name(dtypes.from_numpy(dt))
    except TypeError:
        return str(dt)


def build_session_state(source, options, providers, kwargs):
    try:
        return SessionState(source, options, providers, kwargs)
    except RecursionError:
        raise InvalidGraph.make(
            "The model nests subgraphs or functions too deeply to load (Python recursion limit reached)"
        ) from None
