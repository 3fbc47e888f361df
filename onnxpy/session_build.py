"""Session state: the loaded model, its plan, and the feed checks/conversions onnxruntime performs."""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from . import limits, logging_utils
from .capi.onnxruntime_pybind11_state import InvalidArgument, InvalidGraph, _OrtError
from .execution.executor import RunContext, run_plan
from .execution.executor import run_subgraph as _subgraph_runner
from .execution.functions import make_function_expander
from .execution.memory import release_heap, tune_heap, without_hugepages
from .execution.plan import build_plan
from .execution.threads import set_blas_threads
from .ir.load import load_model, read_model_proto, model_from_proto
from .nodearg import INT64_MAX, ModelMetadata, NodeArg
from .feeds import _py_map, convert_feed
from .output_types import _output_node_args, _slim_source


def _quiet_state():
    """(context variable, value) that numpy's ``errstate(all="ignore")`` sets, when numpy keeps its floating-point
    error state in a context variable (numpy 2); else None.  Setting and resetting it directly costs ~0.2 us per
    run against ~1.1 us for entering and leaving ``np.errstate`` (~1% of a silero-vad run)."""
    try:
        from numpy._core import _ufunc_config
        var = _ufunc_config._extobj_contextvar
        with np.errstate(all="ignore"):
            value = var.get()
        tok = var.set(value)  # (checks that it is a ContextVar the way numpy uses it)
        var.reset(tok)
        return var, value
    except Exception:  # noqa: BLE001 - any other numpy: np.errstate
        return None


_QUIET = _quiet_state()
_NO_CONTEXT = contextlib.nullcontext()


class SessionState:
    """Everything a session needs at run time; immutable after construction (shared by threads)."""

    def __init__(self, source, options, providers, kwargs):
        with logging_utils.session_scope(options, check_config=True), without_hugepages():
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
            proto, base_dir = read_model_proto(source, fast=True)
            model = model_from_proto(proto, base_dir)
        self._apply_initializer_overrides(model)
        if 0 < (model.ir_version or 0) < 4:
            # Before IR 4 every initializer is listed among the graph inputs, yet (as in onnxruntime) it is a
            # constant, not an overridable input: it can be folded, and feeding it is an invalid input name.
            model.graph.inputs = [v for v in model.graph.inputs if v.name not in model.graph.initializers]
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
        from .ops._packed import prepack_enabled, prepacking

        self.prepack = prepack_enabled(options)
        with prepacking(self.prepack):
            self.plan = build_plan(g, model.opsets, _subgraph_runner, custom_ops=custom,
                                   function_expander=make_function_expander(_subgraph_runner))
        self.shrink_arena = not getattr(options, "enable_cpu_mem_arena", True)
        self.heap_tuned = tune_heap()  # the arena's memory goes back when the session is deleted

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
        self._slim = _slim_source(source_proto) if needs else None
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
        self._fetch_index: dict = {}  # output-name tuple -> positions (the lean run path)
        # The lean run path's feed table: plain tensor inputs -> (slot, numpy dtype or None, rank or None,
        # ((axis, fixed dim), ...), required).  Anything it does not cover goes through convert_feed.
        self.lean_feeds = {}
        required = set(self.required)
        for name, (slot, t, shape) in self.feed_specs.items():
            if t is not None and t.kind != "tensor":
                continue
            try:
                want = t.np_dtype if t is not None else None
            except TypeError:  # an unsupported element type: the full path reports it when it is fed
                continue
            if want is not None and (want.kind == "O" or not want.isnative):
                continue
            fixed = tuple((i, e) for i, e in enumerate(shape or ()) if isinstance(e, int))
            self.lean_feeds[name] = (slot, want, len(shape) if shape else None, fixed, name in required)
        self.n_required = len(required)
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
                    slim = self._slim() if callable(self._slim) else self._slim
                    self._outputs = _output_node_args(self._output_values, slim)
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

    # -- run --------------------------------------------------------------------------------------
    def _lean_feeds(self, input_feed):
        """(slot, array) pairs when every feed is a native ndarray that passes its checks as it is, else None
        (the full path then converts the feeds or raises onnxruntime's error)."""
        table = self.lean_feeds
        feeds = []
        found = 0
        ndarray = np.ndarray
        for k, v in input_feed.items():
            spec = table.get(k)
            if spec is None or type(v) is not ndarray:
                return None
            slot, want, rank, fixed, req = spec
            dt = v.dtype
            if want is not None and dt is not want:
                return None
            if not dt.isnative or dt.kind == "O" or dt.kind == "U" or dt.kind == "S":
                return None
            if rank is not None:
                shp = v.shape
                if len(shp) != rank:
                    return None
                for i, e in fixed:
                    if shp[i] != e:
                        return None
            found += req
            feeds.append((slot, v))
        return feeds if found == self.n_required else None

    def run(self, output_names, input_feed, run_options=None):
        if run_options is None and type(input_feed) is dict and self.profiler is None and self.parallel is None:
            if not output_names:
                idx = None
            elif type(output_names) is list or type(output_names) is tuple:
                idx = self._lean_index(output_names)
                if idx is None:
                    return self._run_full(output_names, input_feed, run_options)  # (reports the unknown name)
            else:
                return self._run_full(output_names, input_feed, run_options)
            feeds = self._lean_feeds(input_feed)
            if feeds is not None:
                return self._run_lean(output_names, feeds, idx)
        return self._run_full(output_names, input_feed, run_options)

    def _lean_index(self, output_names):
        """Positions of the requested outputs in the plan's output list (remembered per name tuple), or None when
        a name is unknown or not a string (the full path then raises onnxruntime's error)."""
        key = tuple(output_names)
        try:
            idx = self._fetch_index.get(key)
        except TypeError:  # (an unhashable name)
            return None
        if idx is None:
            get = self.output_index.get
            idx = [get(n) if type(n) is str else None for n in key]
            if None in idx:
                return None
            if len(self._fetch_index) < 64:
                self._fetch_index[key] = idx
        return idx

    def _run_lean(self, output_names, feeds, idx=None):
        """:meth:`run` for plain feeds, no run options (the checks above stand for convert_feed); ``idx`` picks the
        requested outputs (None: all of them)."""
        if isinstance(output_names, (str, bytes)):
            return self._run_full(output_names, {}, None)  # (raises the usual TypeError)
        if self.blas_threads:
            set_blas_threads(self.blas_threads)
        prev = limits.install(self.limits)  # what limits.applied() does, without a generator-based context manager
        quiet = _QUIET
        tok = quiet[0].set(quiet[1]) if quiet is not None else None  # (floating-point warnings off, as errstate)
        try:
            with np.errstate(all="ignore") if tok is None else _NO_CONTEXT, logging_utils.scope_for(self.options, None):
                outs = run_plan(self.plan, (), (), None, feeds)
        finally:
            if tok is not None:
                quiet[0].reset(tok)
            limits.restore(prev)
        if self.shrink_arena:
            release_heap()
        if idx is not None:
            outs = [outs[i] for i in idx]
        const_ids = self._const_ids
        res = []
        for o in outs:
            if type(o) is np.ndarray:
                if o.base is not None or not o.flags.writeable or id(o) in const_ids or any(
                        o is v for _, v in feeds):
                    o = _detach(o, const_ids.union(id(v) for _, v in feeds))
            elif isinstance(o, np.ndarray):
                o = _detach(o, const_ids.union(id(v) for _, v in feeds))
            elif isinstance(o, dict):
                o = _py_map(o)
            res.append(o)
        return res

    def _run_full(self, output_names, input_feed, run_options=None):
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
        feeds = [convert_feed(self.feed_specs, k, v) for k, v in input_feed.items()]
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
        with np.errstate(all="ignore"), limits.applied(self.limits), \
                logging_utils.scope_for(self.options, run_options):  # (fp warnings are not onnxruntime behaviour)
            outs = self._execute(plan, feeds, run_options, ctx)
        if self.shrink_arena or (run_options is not None and "cpu" in run_options._config.get(
                "memory.enable_memory_arena_shrinkage", "")):
            release_heap()  # this run's freed buffers go back to the OS (arena off, or shrinkage asked for)
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
        from .ops._packed import prepacking

        with prepacking(self.prepack):
            plan = build_plan(sub, self.model.opsets, _subgraph_runner, custom_ops=dict(self.options._custom_ops),
                              function_expander=make_function_expander(_subgraph_runner))
        if len(self._fetch_plans) < 32:
            self._fetch_plans[names] = plan
        return plan




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


def build_session_state(source, options, providers, kwargs):
    try:
        return SessionState(source, options, providers, kwargs)
    except RecursionError:
        raise InvalidGraph.make(
            "The model nests subgraphs or functions too deeply to load (Python recursion limit reached)"
        ) from None
