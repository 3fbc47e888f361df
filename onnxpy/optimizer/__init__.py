"""Graph optimizer: passes chosen by ``GraphOptimizationLevel`` with onnxruntime's meanings.

* ORT_DISABLE_ALL: nothing;
* ORT_ENABLE_BASIC: constant folding, Identity/Dropout elimination, Conv+BatchNormalization folding, dead code;
* ORT_ENABLE_EXTENDED / ORT_ENABLE_ALL: the basic passes plus the fusions registered at those levels.

``disabled_optimizers`` (InferenceSession kwarg) and the session config entry
``optimization.disable_specified_optimizers`` (comma list) switch passes off by name.
``optimized_model_filepath`` writes the result as an ONNX model.
"""

from __future__ import annotations

import copy
import itertools
import logging

import numpy as np

from ..ir.model import Graph, Model
from .graph_utils import consumers, forget_free_names, free_names_memo
from .passes import BASIC_PASSES

log = logging.getLogger("onnxpy.optimizer")
MAX_ROUNDS = 5


class OptContext:
    def __init__(self, model: Model, options):
        self.model = model
        self.options = options
        self.config = dict(options._config) if options is not None else {}
        self.protected: set = set()  # names that must keep existing (graph outputs of the main graph)
        self._inputs_cache: dict = {}
        self._counter = itertools.count()
        limit = options._config.get("optimization.constant_folding_max_output_size_in_bytes") if options else None
        from .passes import DEFAULT_FOLD_LIMIT

        self.fold_limit = int(limit) if limit else DEFAULT_FOLD_LIMIT
        self.applied: dict = {}
        self._planner = None
        # the unoptimized graph, which shares its initializer arrays with the optimized copy: a pass that replaces a
        # weight by a view of a new array replaces it there too, so the original can be freed
        self.source = None

    def graph_input_names(self, g: Graph) -> set:
        return {v.name for v in g.inputs}

    def value_type(self, g: Graph, name: str):
        """Declared type of a value (graph input/output or value_info), or None."""
        for v in g.inputs:
            if v.name == name:
                return v.type
        vi = g.value_info.get(name)
        return vi.type if vi is not None else None

    def fresh(self, base: str) -> str:
        return f"{base}_{next(self._counter)}"

    def run_node(self, node, inputs):
        """Run one node on constant inputs with the CPU kernels; None when it cannot run here."""
        from ..execution.executor import run_plan
        from ..execution.plan import Planner
        from ..ir.model import ValueInfo

        if self._planner is None:
            self._planner = Planner(self.model.opsets, lambda p, i, o: run_plan(p, i, o))
        res = self._run_node_direct(node, inputs)
        if res is not NotImplemented:
            return res
        names = [f"__in{i}" if x else "" for i, x in enumerate(node.inputs)]
        tmp = Graph("fold", [type(node)(node.op_type, node.domain, names, list(node.outputs), node.attrs, node.name)],
                    [], [ValueInfo(o) for o in node.outputs if o],
                    {n: v for n, v in zip(names, inputs) if n})
        try:
            plan = self._planner.plan(tmp)
            outs = run_plan(plan, (), ())
        except Exception as e:  # noqa: BLE001 - a node that cannot be folded stays in the graph
            log.debug("constant folding skipped %s: %s", node.describe(), e)
            return None
        it = iter(outs)
        return [next(it) if o else None for o in node.outputs]

    def _run_node_direct(self, node, inputs):
        """``run_node`` without building a one-node plan: the kernel bound as the planner binds it (attributes,
        reserved arguments, ``specialize`` hook on the constant inputs), called once.  Same results as planning
        and running the one-node graph; ``NotImplemented`` for the cases only the planner handles (graph
        attributes, repeated or reserved output names)."""
        from ..execution.plan import SINK, _specialize

        outs = node.outputs
        named = [o for o in outs if o]
        if len(set(named)) != len(named) or any(o.startswith("__in") for o in named):
            return NotImplemented
        if node.subgraphs():
            return NotImplemented
        try:
            fn, implicit, _ = self._planner._bind(node)
            if implicit:
                return NotImplemented
            spec = getattr(fn, "_onnxpy_spec", None)
            if spec is not None:
                ins = tuple(i + 1 if x else SINK for i, x in enumerate(node.inputs))
                consts = {i + 1: v for i, (x, v) in enumerate(zip(node.inputs, inputs)) if x}
                fn = _specialize(fn, spec, ins, consts, set())
            res = fn(*[v if x else None for x, v in zip(node.inputs, inputs)])
        except Exception as e:  # noqa: BLE001 - a node that cannot be folded stays in the graph
            log.debug("constant folding skipped %s: %s", node.describe(), e)
            return None
        if type(res) is not tuple:
            res = (res,)
        vals = [None] * len(outs)
        for i, r in zip(range(len(outs)), res):
            if outs[i]:
                vals[i] = np.asarray(r) if isinstance(r, np.generic) else r
        return vals


def _disabled(options, kwargs) -> set:
    names = set(kwargs.get("disabled_optimizers") or []) if kwargs else set()
    cfg = options._config.get("optimization.disable_specified_optimizers", "") if options else ""
    names |= {x.strip() for x in cfg.split(",") if x.strip()}
    return names


def passes_for(level: int, disabled=frozenset()):
    from .fusions import BASIC_FUSIONS, FUSION_PASSES
    from .fusions_misc import MISC_PASSES
    from .fusions_qdq import QDQ_PASSES
    from .fusions_speed import SPEED_PASSES
    from .fusions_transformer import TRANSFORMER_PASSES

    chosen = [p for p in BASIC_PASSES if p.level <= level]
    chosen = chosen[:-1] + BASIC_FUSIONS + MISC_PASSES + chosen[-1:]
    if level >= 2:
        # Gelu/BiasGelu first: MatMulScaleFusion would otherwise fold Gelu's "* 0.5" into the next MatMul;
        # attention fusion must see the MatMul scales before MatMulScaleFusion folds them
        gelu = [p for p in FUSION_PASSES if p.name in ("GeluFusion", "BiasGeluFusion")]
        rest = [p for p in FUSION_PASSES if p not in gelu and p.level <= level]
        from .fusions_all import ALL_PASSES  # onnxpy-specific ops (ai.onnxpy): level 99 only, like NCHWc in ORT

        chosen = chosen[:-1] + QDQ_PASSES + gelu + TRANSFORMER_PASSES + rest \
            + [p for p in SPEED_PASSES if p.level <= level] + [p for p in ALL_PASSES if p.level <= level] \
            + chosen[-1:]
        if level >= 99:
            from .fp16 import FP16_PASSES  # first: every later pass sees the float32 graph

            chosen = FP16_PASSES + chosen
    return [p for p in chosen if p.name not in disabled]


def optimize(model: Model, options, kwargs=None) -> Model:
    """Return the optimized model for ``options.graph_optimization_level`` (the input model is not modified)."""
    level = int(options.graph_optimization_level) if options is not None else 99
    chosen = passes_for(level, _disabled(options, kwargs)) if level > 0 else []
    source = model.graph
    if chosen:
        model = copy.copy(model)
        model.graph = _copy_graph(model.graph)
        ctx = OptContext(model, options)
        ctx.protected = {o.name for o in model.graph.outputs}
        ctx.source = source
        with free_names_memo():
            _run_passes(model.graph, chosen, ctx)
            inner = [p for p in chosen if p.name not in SUBGRAPH_SKIP]
            if inner:
                _optimize_subgraphs(model.graph, inner, ctx, {})
        model.applied_passes = dict(ctx.applied)
    user = {id(ov._value) for ov in getattr(options, "_initializers", {}).values()} if options is not None else set()
    if chosen and level >= 99:
        from ..ops._packed import prepack_enabled

        _fortran_weights(model.graph, user, source, prepack_enabled(options))
    _freeze(model.graph, user)
    path = getattr(options, "optimized_model_filepath", "") if options is not None else ""
    if path:
        from ..ir.save import save_model

        min_size = options._config.get("session.optimized_model_external_initializers_min_size_in_bytes")
        ext_name = options._config.get("session.optimized_model_external_initializers_file_name")
        save_model(model, path, int(min_size) if min_size else (1024 if ext_name else None), ext_name)
    return model


_FORTRAN_READERS = frozenset({("ai.onnxpy", "MatMulBias"), ("ai.onnxpy", "MatMulBiasGelu")})
_FORTRAN_FF = ("ai.onnxpy", "FeedForward")  # (its weights are inputs 1 and 3)
_FORTRAN_MIN = 1 << 16  # elements


def _fortran_weights(g: Graph, user: set, source: Graph, prepack: bool = True) -> None:
    """Level 99 layout (like onnxruntime's weight pre-packing at that level): a large 2-D float weight that only
    MatMulBias / MatMulBiasGelu / Gemm (transB=0) read, as their B (FeedForward: either weight), is stored in
    Fortran order -- the same values, in the layout whose transpose is C-contiguous, which their GEMMs run fastest
    (ops/linalg.py ``matmul_w``).  The
    array replaces the original -- in the unoptimized ``source`` graph too, which shares it (equal values, so
    nothing observable changes there) -- so memory does not grow; weights a feed may override, graph outputs and
    values that subgraphs read keep their layout.  Weights the plan will pack for OpenBLAS's kernel (``ops._packed``)
    are left as they are (packing reads either layout; the copy would only cost time)."""
    from ..ops import _packed

    readers = consumers(g)  # (a value a subgraph reads counts as read by the If/Loop/Scan node: not eligible)
    skip = {v.name for v in g.inputs} | {v.name for v in g.outputs}
    for name in list(g.initializers):  # (names only: a list of the arrays would keep every original alive)
        arr = g.initializers[name]
        if (type(arr) is not np.ndarray or arr.ndim != 2 or arr.size < _FORTRAN_MIN or arr.flags.f_contiguous
                or arr.dtype.kind != "f" or name in skip or id(arr) in user):
            continue
        rs = readers.get(name)
        if rs and all(n.inputs.count(name) == 1 and _fortran_reader(n, name) for n in rs) and not (
                prepack and _packed.will_pack(arr)):  # (asked last: binding OpenBLAS's kernel costs ~17 ms once)
            f = _fortran_copy(arr)
            g.initializers[name] = f
            if source.initializers.get(name) is arr:
                source.initializers[name] = f
            arr = None  # (the C-ordered array is freed here, one weight at a time)


def _fortran_reader(n, name: str) -> bool:
    """``n`` reads ``name`` as a GEMM weight that runs fastest Fortran-ordered."""
    key = (n.domain, n.op_type)
    if key == _FORTRAN_FF:
        return 5 <= len(n.inputs) <= 7 and name in (n.inputs[1], n.inputs[3])  # (6, 7: the tanh form's view shapes)
    return n.inputs[1:2] == [name] and (
        key in _FORTRAN_READERS or n.op_type == "Gemm" and n.domain in ("", "ai.onnx") and not n.attrs.get("transB", 0))


def _fortran_copy(a: np.ndarray) -> np.ndarray:
    """A Fortran-ordered copy of a 2-D array, transposed in blocks of 16 rows: each destination row then takes 64
    contiguous bytes (a cache line of float32) per block.  On 768x3072 float32 3.1 ms against 6.8 for 128-row
    blocks and 7.5 for ``asfortranarray``; 2-5x ``asfortranarray`` on BERT's other weight shapes (measured
    2026-12-04), which adds up over a transformer's weights at session creation."""
    out = np.empty(a.shape[::-1], a.dtype)
    for i in range(0, a.shape[0], 16):
        out[:, i:i + 16] = a[i:i + 16].T
    return out.T


def _freeze(g: Graph, user: set) -> None:
    """Make the session's constants read-only: a kernel writing into one raises instead of corrupting later runs,
    and kernels may cache layouts derived from read-only weights.  Arrays the user handed over (add_initializer)
    are left as they are; the session reads them through read-only views."""
    for k, v in list(g.initializers.items()):
        if isinstance(v, np.ndarray) and v.flags.writeable:
            if id(v) in user or v.base is not None:
                v = v.view()
                g.initializers[k] = v
            v.flags.writeable = False
    for n in g.nodes:
        for sub in n.subgraphs():
            _freeze(sub, user)


SUBGRAPH_SKIP = ("Float16ComputeInFloat32All",)
HOIST_LIMIT = 1 << 20  # bytes: outer-scope constants up to this size are copied into a subgraph for folding


def _optimize_subgraphs(g: Graph, passes, ctx, outer_consts: dict) -> None:
    """Fold constants inside If/Loop/Scan bodies too.

    Outer-scope constants a body reads (up to HOIST_LIMIT bytes each) become initializers of the body, so work on
    them (e.g. exporters re-ordering LSTM weights inside If branches) is folded once instead of run every time.
    """
    inputs = {v.name for v in g.inputs}
    consts = dict(outer_consts)
    consts.update({k: v for k, v in g.initializers.items() if k not in inputs})
    for n in g.nodes:
        for sub in n.subgraphs():
            from ..execution.plan import graph_free_names

            for name in graph_free_names(sub):
                val = consts.get(name)
                if val is not None and getattr(val, "nbytes", HOIST_LIMIT + 1) <= HOIST_LIMIT:
                    sub.initializers[name] = val
                    forget_free_names()
            saved = ctx.protected
            ctx.protected = {o.name for o in sub.outputs}
            try:
                _run_passes(sub, passes, ctx)
            finally:
                ctx.protected = saved
            _optimize_subgraphs(sub, passes, ctx, consts)


def _anchor_ops(p):
    """The op types one of which ``p`` needs in the graph to do anything (declared as ``needs``, else its anchors),
    or None when it does not say (such passes always run)."""
    from .fusions import AnchoredFusion, SweepPass

    needs = getattr(p, "needs", None)
    if needs is not None:
        return needs
    cls = type(p)
    if isinstance(p, SweepPass) and cls.apply is SweepPass.apply and cls.wants is SweepPass.wants:
        return frozenset(p.anchors)
    if isinstance(p, AnchoredFusion) and cls.apply is AnchoredFusion.apply:
        return frozenset((p.anchor,))
    return None


def _run_passes(g: Graph, passes, ctx) -> None:
    """Apply ``passes`` in turn until a round changes nothing (at most MAX_ROUNDS rounds).  A pass whose anchor op
    types are all absent is skipped without a look at the nodes (If/Loop bodies are many and small)."""
    needs = [_anchor_ops(p) for p in passes]
    for _ in range(MAX_ROUNDS):
        changed = 0
        present = {node.op_type for node in g.nodes}
        for p, need in zip(passes, needs):
            if need is not None and need.isdisjoint(present):
                continue
            n = p.apply(g, ctx)
            if n:
                forget_free_names()
                ctx.applied[p.name] = ctx.applied.get(p.name, 0) + n
                log.debug("%s applied %d time(s)", p.name, n)
                present = {node.op_type for node in g.nodes}
            changed += n
        if not changed:
            break


def _copy_graph(g: Graph) -> Graph:
    """A copy whose node list, nodes and initializer dict can be edited (arrays are shared, never mutated)."""
    nodes = []
    for n in g.nodes:
        attrs = {k: (_copy_graph(v) if isinstance(v, Graph) else v) for k, v in n.attrs.items()}
        nodes.append(type(n)(n.op_type, n.domain, list(n.inputs), list(n.outputs), attrs, n.name, n.doc_string))
    return Graph(g.name, nodes, [copy.copy(v) for v in g.inputs], [copy.copy(v) for v in g.outputs],
                 dict(g.initializers), dict(g.value_info), g.doc_string, g.sparse_initializer_names)
