"""IR graph -> immutable :class:`ExecutionPlan`.

Everything that can be decided before a run is decided here: kernels are resolved once, attributes bound,
values given integer slots, constants placed in a template slot list, and each step carries the slots that
die after it (free-after lists) so a run holds only live intermediates.  A plan is shared by all threads.
"""

from __future__ import annotations

import functools
import logging
import operator
import sys
import threading
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import numpy as np

from .. import custom_ops
from ..capi.onnxruntime_pybind11_state import InvalidGraph, NotImplemented as OrtNotImplemented, _OrtError
from ..ir.model import Graph, Node
from ..ops import registry
from ..ops._shape_util import NOT_CONST

_log = logging.getLogger("onnxpy.plan")
SINK = 0  # slot 0 always holds None: absent optional inputs read it, absent optional outputs write it


@dataclass(frozen=True)
class Step:
    fn: Callable[..., Any]
    ins: tuple  # input slots
    outs: tuple  # output slots (SINK for absent optional outputs)
    free: tuple  # slots whose value dies after this step
    node: Node
    index: int


@dataclass
class ExecutionPlan:
    """Steps in topological order over integer slots; immutable once built."""

    steps: tuple
    n_slots: int
    template: tuple  # initial slot values (constants bound, everything else None)
    input_slots: dict  # graph input name -> slot
    output_names: tuple
    output_slots: tuple
    slot_names: tuple  # slot -> value name (errors, profiling)
    outer_names: tuple = ()  # outer-scope names this (sub)plan reads; fed after the inputs
    outer_slots: tuple = ()
    graph: Graph | None = None
    opsets: dict = field(default_factory=dict)
    # the sequential executor's view of ``steps``: (fn, get, mode, out, outs, free, step) per step, where
    # mode 0 calls ``fn(get(vals))``, mode 1 ``fn(*get(vals))`` and mode 2 ``fn(vals)`` (an in-place donor);
    # ``out`` is the single output slot (0 when the step has several outputs or an absent one)
    fast: tuple = ()
    # the executor's generated runner of ``fast``, built after a few runs (executor._run_steps): None or a run
    # count before, then (the fast tuple it was made from, runner), or False when the loop stays
    compiled: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if not self.fast and self.steps:
            self.fast = tuple(_fast_step(st, None) for st in self.steps)


def _with_frees(raw_steps, pinned) -> tuple:
    """Steps with their free-after lists: a slot dies after its last reader unless it is pinned."""
    last_use: dict[int, int] = {}
    for i, (_, ins, outs, _, _, _) in enumerate(raw_steps):
        for s in ins:
            last_use[s] = i
        for s in outs:
            last_use.setdefault(s, i)
    frees: dict[int, list[int]] = {}
    for s, i in last_use.items():
        if s not in pinned:
            frees.setdefault(i, []).append(s)
    return tuple(
        Step(fn, ins, outs, tuple(frees.get(i, ())), node, idx)
        for i, (fn, ins, outs, node, idx, _) in enumerate(raw_steps)
    )


# -- shape-only chains -----------------------------------------------------------------------------------------
# Shape -> Gather -> Equal -> ..., Shape -> Size -> Not -> Cast ...: values computed only from the shape of one
# array (the chain's root) and constants.  The sequential executor runs each such chain as one step that memoises
# the chain's results per root shape.  Members are deterministic standard ops without subgraphs.
_SHAPE_SOURCES = frozenset({"Shape", "Size"})
_SHAPE_CHAIN_OPS = frozenset({
    "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast", "CastLike", "Equal", "Not", "Slice", "Add", "Sub", "Mul",
    "Div", "Mod", "Neg", "Abs", "Reshape", "Identity", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "And",
    "Or", "Xor", "Where", "Min", "Max", "ReduceProd", "ReduceSum", "ReduceMin", "ReduceMax", "Floor", "Ceil",
    "Sqrt", "Range", "ConstantOfShape", "Expand", "Flatten", "Transpose", "Sign", "Pow", "Clip", "Shape", "Size",
    "Tile", "Split",
})
_CHAIN_MEMO_MAX = 64  # shapes remembered per chain
_CHAIN_MEMO_BYTES = 1 << 16  # results larger than this are recomputed, not remembered


def _group_shape_chains(steps, raw_steps, const_vals, dynamic, out_slots):
    """``raw_steps`` with each single-root shape-only chain (two nodes or more) replaced by one memoising step at
    the position of its first node; ``raw_steps`` itself when there is none."""
    def const(s):
        return s == SINK or (s in const_vals and s not in dynamic)

    root_of: dict[int, object] = {}  # slot -> its root slot, or MANY for values of several roots
    chains: dict[int, list[int]] = {}  # root slot -> member step indices
    for i, (_, ins, outs, node, _, _) in enumerate(raw_steps):
        if not outs or SINK in outs:
            continue
        op = node.op_type
        if node.domain == "ai.onnxpy" and op == "ShapeOf" and ins and ins[0] != SINK:
            # (a fused region's Shape reader: its first input's shape replayed along shape inputs of the same chain)
            root = root_of.get(ins[0], ins[0])
            if not all(s in root_of or const(s) for s in ins[1:]):
                continue
            if {root_of[s] for s in ins[1:] if s in root_of} - {root}:
                root = _MANY
        elif node.domain not in ("", "ai.onnx"):
            continue
        elif op in _SHAPE_SOURCES and len(ins) == 1 and ins[0] != SINK:
            root = root_of.get(ins[0], ins[0])  # (the shape of a chain value is fixed by the chain's root)
        elif op in _SHAPE_CHAIN_OPS and len(ins) == len(node.inputs):  # (no implicit inputs: no subgraphs)
            roots = {root_of[s] for s in ins if s in root_of}
            if not roots or not all(s in root_of or const(s) for s in ins):
                continue
            root = roots.pop() if len(roots) == 1 else _MANY
        else:
            continue
        for o in outs:
            root_of[o] = root
        if root is not _MANY:
            chains.setdefault(root, []).append(i)
    chains = {r: m for r, m in chains.items() if len(m) >= 2}
    if not chains:
        return raw_steps
    first: dict[int, tuple] = {}
    dropped = set()
    for r, members in chains.items():
        inside = set(members)
        produced = {o for i in members for o in raw_steps[i][2]}
        used = set(out_slots)
        for j, raw in enumerate(raw_steps):
            if j not in inside:
                used.update(raw[1])
        ext = tuple(o for i in members for o in raw_steps[i][2] if o in used)
        assert produced >= set(ext)
        head = raw_steps[members[0]]
        group = _ShapeChain(r, tuple(steps[i] for i in members), ext,
                            {s: const_vals[s] for i in members for s in raw_steps[i][1] if s in const_vals})
        first[members[0]] = (group, (r,), ext, head[3], head[4], None)
        dropped.update(members[1:])
    return [first.get(i, raw) for i, raw in enumerate(raw_steps) if i not in dropped]


class _Many:
    __slots__ = ()


_MANY = _Many()


class _ShapeChain:
    """Step callable ``chain(root) -> output(s)``: runs the chain's nodes on ``root``'s shape once per shape and
    returns the remembered (read-only) results afterwards; a failing node reports itself, as in the executor."""

    __slots__ = ("root", "members", "ext", "consts", "memo")

    def __init__(self, root, members, ext, consts):
        self.root = root
        self.members = members  # Steps, in execution order
        self.ext = ext  # member output slots read outside the chain (returned in this order)
        self.consts = consts
        self.memo = {}

    def __call__(self, x):
        key = getattr(x, "shape", None)
        if key is not None:
            hit = self.memo.get(key)
            if hit is not None:
                return hit
        vals = dict(self.consts)
        vals[self.root] = x
        for st in self.members:
            args = [vals.get(s) for s in st.ins]
            try:
                res = st.fn(*args)
            except _OrtError:
                raise
            except RecursionError:
                raise
            except Exception as e:  # noqa: BLE001 - reported like the executor reports a failing node
                from .executor import node_error

                raise node_error(st, args, e) from e
            if type(res) is not tuple:
                res = (res,)
            for s, r in zip(st.outs, res):
                vals[s] = np.asarray(r) if isinstance(r, np.generic) else r
        out = tuple(vals[s] for s in self.ext)
        if key is not None and len(self.memo) < _CHAIN_MEMO_MAX and all(
                type(v) is np.ndarray for v in out) and sum(v.nbytes for v in out) <= _CHAIN_MEMO_BYTES:
            consts = self.consts.values()
            for v in out:
                if not any(v is c for c in consts):  # (the model's constants are left as they are)
                    v.flags.writeable = False
            out = out if len(out) != 1 else out[0]
            self.memo[key] = out
            return out
        return out if len(out) != 1 else out[0]


def _empty_args(vals):
    return ()


def _fast_step(st: Step, donor):
    """The executor tuple of one step (see :attr:`ExecutionPlan.fast`)."""
    ins, outs = st.ins, st.outs
    free = st.free
    if SINK in outs:  # an absent optional output was written to the sink slot: clear it after the step
        free = free + (SINK,)
    out = outs[0] if len(outs) == 1 else SINK
    if donor is not None:
        return (donor, None, 2, out, outs, free, st)
    if not ins:
        return (st.fn, _empty_args, 1, out, outs, free, st)
    if len(ins) == 1:
        return (st.fn, operator.itemgetter(ins[0]), 0, out, outs, free, st)
    return (st.fn, operator.itemgetter(*ins), 1, out, outs, free, st)


# -- in-place donation ---------------------------------------------------------------------------------------------
# A kernel that names the reserved keyword ``_donated`` may overwrite the inputs at the positions it is given
# (``_donated`` is a tuple of input positions, ``()`` on ordinary calls); so may the plan-time form a ``specialize``
# hook returns when it carries ``donates = True``.  The planner offers a position only when
# its slot dies at that step, is not pinned (graph input/output, initializer, constant, outer-scope value) and is
# read once by the step; at run time the donor hands it over only when the array owns its memory, is writeable,
# and nothing but the slot list references it (no other slot, no view of it, no caller): a reference count check
# calibrated below with the same code, so it is exact for the running interpreter.
_getrc = sys.getrefcount
_ndarray = np.ndarray


DONATE_MIN = 4096  # smaller arrays gain nothing from in-place computation


def _rc_of(vals, s):
    x = vals[s]  # the same references as in _owned: the list slot, this local, getrefcount's argument
    return _getrc(x)


_RC_OWNED = _rc_of([np.empty(4)], 0)  # an array referenced only by one list slot


class _Donor:
    """Step callable ``donor(vals)``: calls the kernel with ``_donated`` set to the candidate positions it owns."""

    __slots__ = ("fn", "ins", "cands", "bound", "one", "get")

    def __init__(self, fn, ins, cands, bound):
        self.fn = fn  # the kernel without donation
        self.ins = ins
        self.cands = cands  # ((position, slot), ...)
        self.bound = bound  # positions tuple -> kernel bound with that ``_donated``
        self.one = cands[0] if len(cands) == 1 else None
        self.get = None if len(ins) == 1 else operator.itemgetter(*ins)  # the arguments as a tuple

    def __call__(self, vals):
        if self.one is not None:  # one candidate (unary kernels, most binary ones)
            p, s = self.one
            x = vals[s]  # references: the slot, this local, getrefcount's argument (as in _rc_of)
            if (type(x) is _ndarray and x.size >= DONATE_MIN and _getrc(x) == _RC_OWNED and x.base is None
                    and x.flags.writeable):
                fn = self.bound[(p,)]
            else:
                fn = self.fn
            x = None
            if self.get is None:
                return fn(vals[s])  # a unary kernel: its one input is the candidate
            return fn(*self.get(vals))
        got = ()
        for p, s in self.cands:
            x = vals[s]  # references: the slot, this local, getrefcount's argument (as in _rc_of)
            if (type(x) is _ndarray and x.size >= DONATE_MIN and _getrc(x) == _RC_OWNED and x.base is None
                    and x.flags.writeable):
                got += (p,)
        x = None
        fn = self.bound.get(got, self.fn) if got else self.fn
        return fn(*[vals[i] for i in self.ins])


class SubgraphCall:
    """A graph attribute bound to the outer-scope values of one kernel call: ``body(*inputs) -> list``."""

    __slots__ = ("plan", "outer", "runner")

    def __init__(self, plan: ExecutionPlan, outer: tuple, runner):
        self.plan = plan
        self.outer = outer
        self.runner = runner

    @property
    def input_names(self):
        return [v.name for v in self.plan.graph.inputs]

    @property
    def output_names(self):
        return list(self.plan.output_names)

    def __call__(self, *inputs):
        return self.runner(self.plan, inputs, self.outer)


def graph_free_names(g: Graph) -> list[str]:
    """Names a graph reads from enclosing scopes (in first-use order), including its subgraphs' needs."""
    defined = {v.name for v in g.inputs} | set(g.initializers)
    free: list[str] = []
    seen = set()

    def use(name):
        if name and name not in defined and name not in seen:
            seen.add(name)
            free.append(name)

    for n in g.nodes:
        for x in n.inputs:
            use(x)
        for sub in n.subgraphs():
            for x in graph_free_names(sub):
                use(x)
        defined.update(o for o in n.outputs if o)
    for o in g.outputs:
        use(o.name)
    return free


def topological_order(g: Graph, available: set) -> list:
    """(index, node) pairs in a valid execution order (stable: keeps file order when it is already valid).

    Nodes whose inputs never become available (a cycle, a node feeding itself, a missing value) are left out
    here; the planner then reports the first of them by name.
    """
    deps = []
    for n in g.nodes:
        need = {x for x in n.inputs if x}
        for sub in n.subgraphs():
            need.update(graph_free_names(sub))
        deps.append(need)
    have = set(available)
    order = []
    done = [False] * len(g.nodes)
    progress = True
    while progress:
        progress = False
        for i, n in enumerate(g.nodes):
            if not done[i] and deps[i] <= have:
                done[i] = True
                order.append((i, n))
                have.update(o for o in n.outputs if o)
                progress = True
    for i, n in enumerate(g.nodes):
        if not done[i]:
            missing = sorted(deps[i] - have)
            raise InvalidGraph.make(
                f"{n.describe()}: input(s) {missing} are not graph inputs, initializers or outputs of other "
                "nodes that can run first (a cycle, a node reading its own output, or a missing value)"
            )
    return order


class Planner:
    """Builds plans; ``runner`` is the executor entry used by subgraph calls."""

    def __init__(self, opsets: dict, runner, custom_ops=None, function_expander=None):
        # kernels are loaded per op by ``registry.lookup`` (only the op families the model uses)
        self.opsets = opsets
        self.runner = runner
        self.custom_ops = custom_ops or {}
        self.function_expander = function_expander

    # -- kernel resolution -------------------------------------------------------------------------
    def resolve(self, node: Node):
        dom = "" if node.domain in ("", "ai.onnx") else node.domain
        custom = custom_ops.resolve(self.custom_ops, dom, node.op_type, self.opsets.get(dom))
        if custom is not None:  # custom ops receive the node's attributes as kwargs, like built-in kernels
            return custom_ops.kernel_info(custom, dom, node.op_type)
        opset = self.opsets.get(dom)
        if opset is None:
            if dom in ("com.microsoft", "com.microsoft.nchwc", "ai.onnx.ml", "ai.onnx.preview.training",
                       "ai.onnxpy"):
                opset = 1 if dom != "ai.onnx.ml" else 5
            else:
                raise InvalidGraph.make(
                    f"{node.describe()}: domain '{dom}' is not in the model's opset_import"
                )
        info = registry.lookup(dom, node.op_type, opset)
        if info is not None:
            return info
        if self.function_expander is not None:
            fk = self.function_expander(node, dom, opset, self)
            if fk is not None:
                _log.info("fallback: no kernel for %s(%d) in domain '%s'; node '%s' runs the op's ONNX function body",
                          node.op_type, opset, dom or "ai.onnx", node.name)
                return fk
        have = registry.versions_of(dom, node.op_type)
        detail = (f"kernels exist from opset(s) {have}" if have else "no kernel is implemented for it")
        raise OrtNotImplemented.make(
            f"Could not find an implementation for {node.op_type}({opset}) node with name '{node.name}' "
            f"in domain '{dom or 'ai.onnx'}': {detail}"
        )

    # -- planning -------------------------------------------------------------------------------------
    def plan(self, g: Graph, outer_names: tuple = (), keep: frozenset = frozenset()) -> ExecutionPlan:
        slots: dict[str, int] = {}
        names = [""]

        def slot(name: str) -> int:
            if not name:
                return SINK
            s = slots.get(name)
            if s is None:
                s = slots[name] = len(names)
                names.append(name)
            return s

        input_slots = {v.name: slot(v.name) for v in g.inputs}
        outer_slots = tuple(slot(n) for n in outer_names)
        const_vals = {slot(k): v for k, v in g.initializers.items()}
        # slots whose value may differ between runs although an initializer names them (fed inputs, outer values)
        dynamic = set(input_slots.values()) | set(outer_slots)

        raw_steps = []
        produced = set(slots)
        lazy: dict = {}  # initializer read counts, classifier heads: computed when a node first needs them
        for idx, node in topological_order(g, set(slots)):
            ins = []
            for x in node.inputs:
                if x and x not in produced:
                    raise InvalidGraph.make(
                        f"{node.describe()}: input '{x}' is not a graph input, initializer or output of an "
                        "earlier node (the graph is not topologically sorted, has a cycle, or names a "
                        "missing value)"
                    )
                ins.append(slot(x))
            fn, implicit, dk = self._bind(node)
            spec = getattr(fn, "_onnxpy_spec", None)
            if spec is not None:
                if node.op_type in ("Gemm", "MatMul") and idx in _lazy(lazy, "heads", _pooled_heads, g):
                    from ..ops._packed import prepacking

                    with prepacking(False):  # (a classifier head on pooled features: its few rows multiply fastest
                        fn = _specialize(fn, spec, ins, const_vals, dynamic)  # unpacked)
                else:
                    fn = _specialize(fn, spec, ins, const_vals, dynamic)
                if getattr(fn, "releases", None):
                    _release_packed(fn, ins, names, _lazy(lazy, "uses", _initializer_uses, g), const_vals, dynamic, g)
                # a plan-time form marked ``donates`` takes ``_donated`` itself (see the in-place donation notes)
                dk = (fn, {}) if getattr(fn, "donates", False) else None
            if (node.op_type == "Constant" and node.domain in ("", "ai.onnx") and not ins and not implicit
                    and len(node.outputs) == 1 and node.outputs[0] and node.outputs[0] not in produced):
                try:
                    val = fn()  # a constant's value is known now: it goes in the template like an initializer
                except Exception:  # noqa: BLE001 - a bad Constant fails at run time with the usual error
                    val = None
                if isinstance(val, np.ndarray):
                    const_vals[slot(node.outputs[0])] = val
                    produced.add(node.outputs[0])
                    continue
            ins.extend(slot(x) for x in implicit)
            outs = []
            for o in node.outputs:
                if o and o in produced and o not in outer_names:
                    raise InvalidGraph.make(f"{node.describe()}: output '{o}' is produced more than once")
                outs.append(slot(o))
                if o:
                    produced.add(o)
            raw_steps.append((fn, tuple(ins), tuple(outs), node, idx, dk))

        out_slots = []
        for v in g.outputs:
            if v.name not in slots:
                raise InvalidGraph.make(f"Graph output '{v.name}' is not produced by any node or input")
            out_slots.append(slots[v.name])

        # free-after lists: a slot dies after its last reader unless it is an output/input/constant/outer
        pinned = set(out_slots) | set(input_slots.values()) | set(const_vals) | set(outer_slots) | {SINK}
        pinned |= {slots[k] for k in keep if k in slots}
        steps = _with_frees(raw_steps, pinned)
        # The sequential executor's steps: as ``steps``, with shape-only chains collapsed into memoised steps.
        # (Profiled runs, runs with run options and the parallel executor use ``steps`` as they are.)
        grouped = _group_shape_chains(steps, raw_steps, const_vals, dynamic,
                                      set(out_slots) | {slots[k] for k in keep if k in slots})
        if grouped is not raw_steps:
            fast_steps, fast_raw = _with_frees(grouped, pinned), grouped
        else:
            fast_steps, fast_raw = steps, raw_steps
        fast = tuple(_fast_step(st, _donor(st, raw[5])) for st, raw in zip(fast_steps, fast_raw))
        template = [None] * len(names)
        for s, v in const_vals.items():
            template[s] = v
        return ExecutionPlan(
            steps=steps,
            n_slots=len(names),
            template=tuple(template),
            input_slots=input_slots,
            output_names=tuple(v.name for v in g.outputs),
            output_slots=tuple(out_slots),
            slot_names=tuple(names),
            outer_names=tuple(outer_names),
            outer_slots=outer_slots,
            graph=g,
            opsets=self.opsets,
            fast=fast,
        )

    def _bind(self, node: Node):
        """The step callable for a node, and the outer-scope names its subgraphs read (implicit inputs)."""
        info = self.resolve(node)
        if not isinstance(info, registry.KernelInfo):
            return info, (), None  # a ready callable (custom op or expanded function)
        kwargs = {}
        graph_attrs = {}
        for k, v in node.attrs.items():
            if k in info.attr_names or info.accepts_any_attr:
                if isinstance(v, Graph) or (isinstance(v, list) and v and isinstance(v[0], Graph)):
                    graph_attrs[k] = v
                else:
                    kwargs[k] = v
        if "_num_outputs" in info.reserved:
            kwargs["_num_outputs"] = len(node.outputs)
        if "_opset" in info.reserved:
            kwargs["_opset"] = self.opsets.get(info.domain, 1)
        if "_node_name" in info.reserved:
            kwargs["_node_name"] = node.name
        if "_output_names" in info.reserved:
            kwargs["_output_names"] = tuple(node.outputs)
        if not graph_attrs:
            dk = (info.fn, kwargs) if "_donated" in info.reserved else None
            # ``fn.plain``: an equivalent faster callable for calls without donation (a bare ufunc)
            plain = getattr(info.fn, "plain", info.fn) if dk is not None else info.fn
            fn = functools.partial(plain, **kwargs) if kwargs else plain
            sp = getattr(info.fn, "specialize", None)
            if sp is not None:
                fn = _Specializable(fn, sp, kwargs)
            return fn, (), dk
        implicit: list[str] = []
        subplans = {}
        for k, g in graph_attrs.items():
            if isinstance(g, list):
                raise OrtNotImplemented.make(f"{node.describe()}: list-of-graphs attribute '{k}' is not supported")
            free = graph_free_names(g)
            for x in free:
                if x not in implicit:
                    implicit.append(x)
        for k, g in graph_attrs.items():
            subplans[k] = self.plan(g, outer_names=tuple(implicit))
        if info.fn is _if_kernel() and set(subplans) == {"then_branch", "else_branch"} and len(node.inputs) == 1:
            return _IfKernel(subplans["then_branch"], subplans["else_branch"], self.runner), tuple(implicit), None
        return _GraphKernel(info.fn, kwargs, subplans, len(node.inputs), self.runner), tuple(implicit), None


class _Specializable:
    """A kernel callable whose kernel offers ``specialize`` (see :func:`_specialize`); calls pass through."""

    __slots__ = ("fn", "_onnxpy_spec")

    def __init__(self, fn, sp, kwargs):
        self.fn = fn
        self._onnxpy_spec = (sp, kwargs)

    def __call__(self, *args):
        return self.fn(*args)


def _lazy(memo: dict, key: str, fn, g):
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = fn(g)
    return hit


def _initializer_uses(g: Graph) -> dict:
    """How many times each initializer of ``g`` is read: node inputs, subgraphs' free names, graph outputs."""
    inits = g.initializers
    uses: dict = {}
    for node in g.nodes:
        for x in node.inputs:
            if x in inits:
                uses[x] = uses.get(x, 0) + 1
        for v in node.attrs.values():
            if isinstance(v, Graph):
                for x in graph_free_names(v):
                    if x in inits:
                        uses[x] = uses.get(x, 0) + 1
    for v in g.outputs:
        if v.name in inits:
            uses[v.name] = uses.get(v.name, 0) + 1
    return uses


_POOLS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "AveragePool", "MaxPool", "GlobalLpPool"})
_ROW_KEEPING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Relu", "FusedGemm",
                          "Gemm", "MatMul", "Sigmoid", "Clip", "LeakyRelu"})


def _pooled_heads(g: Graph) -> set:
    """Positions (in ``g.nodes``) of Gemm/MatMul nodes whose first input comes from a pooling op through reshapes,
    activations and other fully connected layers: a CNN's classifier head, whose rows are the batch size (one image:
    one row), where OpenBLAS's matrix-vector product beats the packed kernel (see ``ops._packed``)."""
    prod = {o: n for n in g.nodes for o in n.outputs if o}
    memo: dict = {}

    def pooled(name: str, depth: int = 0) -> bool:
        if name in memo:
            return memo[name]
        n = prod.get(name)
        ok = False
        if n is not None and depth < 32 and n.domain in ("", "ai.onnx", "com.microsoft"):
            if n.op_type in _POOLS:
                ok = True
            elif n.op_type in _ROW_KEEPING and n.inputs and n.inputs[0]:
                ok = pooled(n.inputs[0], depth + 1)
        memo[name] = ok
        return ok

    return {i for i, n in enumerate(g.nodes)
            if n.op_type in ("Gemm", "MatMul") and n.domain in ("", "ai.onnx") and n.inputs and pooled(n.inputs[0])}


def _release_packed(fn, ins, names, uses, const_vals, dynamic, g) -> None:
    """A plan-time form that packed constant weights (``ops._packed``) names them in ``releases`` (input positions):
    each one read by this node only is replaced -- in the plan and in the graph -- by a stand-in that holds no data,
    so the original's memory goes (the packed copy takes its place).  A later plan of the same graph (a fetch of
    some outputs) maps the stand-in back to the packed weight."""
    rel = getattr(fn, "releases", None)
    if not rel:
        return
    from ..ops import _packed

    for pos in rel:
        if pos >= len(ins):
            continue
        s = ins[pos]
        name = names[s] if s != SINK else ""
        if not name or uses.get(name) != 1 or s in dynamic or s not in const_vals or name not in g.initializers:
            continue
        st = _packed.standin(const_vals[s])
        if st is not None:
            const_vals[s] = st
            g.initializers[name] = st


def _with_real_weights(fn):
    """``fn`` called with any stand-in argument (a released packed weight) replaced by the weight itself."""
    from ..ops import _packed

    def call(*args):
        return fn(*[_packed.real(a) for a in args])

    return call


def _specialize(fn, spec, ins, const_vals, dynamic):
    """The step callable of a kernel with a ``specialize`` hook.

    ``kernel.specialize(consts, kwargs)`` receives, per explicit input, the plan-time value of a constant input
    (initializer or folded Constant that no feed or outer scope can replace; None for an absent input) or
    ``NOT_CONST``, and the bound attributes; it returns a callable taking the same positional arguments as the
    kernel (attributes bound) that computes the same results, or None to keep the generic kernel.
    """
    sp, kwargs = spec
    consts = tuple(
        None if s == SINK else (const_vals[s] if s in const_vals and s not in dynamic else NOT_CONST) for s in ins
    )
    try:
        fast = sp(consts, kwargs)
    except Exception:  # noqa: BLE001 - a hook that trips keeps the generic kernel (errors are reported at run time)
        _log.debug("specialize hook failed", exc_info=True)
        fast = None
    if fast is not None:
        return fast
    from ..ops import _packed

    if any(_packed.is_standin(c) for c in consts):  # (a released weight: the generic kernel needs its data)
        return _with_real_weights(fn.fn)
    return fn.fn


def _donor(st: Step, dk):
    """The in-place donor of a step whose kernel accepts ``_donated`` and has inputs dying at it, or None."""
    if dk is None or not st.free:
        return None
    fn, kwargs = dk
    dying = set(st.free)
    cands = tuple((p, s) for p, s in enumerate(st.ins) if s != SINK and s in dying and st.ins.count(s) == 1)[:3]
    if not cands:
        return None
    bound = {}
    pos = [p for p, _ in cands]
    for mask in range(1, 1 << len(pos)):
        combo = tuple(p for b, p in enumerate(pos) if mask >> b & 1)
        bound[combo] = functools.partial(fn, **kwargs, _donated=combo)
    return _Donor(st.fn, st.ins, cands, bound)


def _if_kernel():
    from ..ops import control_flow

    return control_flow.if_


def if_condition(cond) -> bool:
    """An If node's condition as a bool (the If kernel's and the generated runner's inlined Ifs' test)."""
    if type(cond) is np.ndarray and cond.size == 1:
        return bool(cond)  # (a one-element array's truth value is its element's)
    from ..ops.control_flow import _scalar_bool

    return _scalar_bool(cond, "If condition")


class _IfKernel:
    """The If kernel with its branches prebound: runs the chosen branch's plan directly (no per-call objects)."""

    __slots__ = ("then_plan", "else_plan", "runner", "branch")

    def __init__(self, then_plan, else_plan, runner):
        from .executor import run_branch, run_subgraph

        self.then_plan = then_plan
        self.else_plan = else_plan
        self.runner = runner
        # the session's runner: call the executor's lean branch entry (same semantics, fewer layers)
        self.branch = run_branch if runner is run_subgraph else None

    def __call__(self, cond, *outer):
        c = if_condition(cond)
        if self.branch is not None:
            return self.branch(self.then_plan if c else self.else_plan, outer)
        return tuple(self.runner(self.then_plan if c else self.else_plan, (), outer))


class _GraphKernel:
    """Calls a kernel whose attributes include graphs, binding them to this call's outer-scope values."""

    def __init__(self, fn, kwargs, subplans, n_explicit, runner):
        self.fn = fn
        self.kwargs = kwargs
        self.subplans = subplans
        self.n = n_explicit
        self.runner = runner

    def __call__(self, *args):
        outer = args[self.n:]
        bound = {k: SubgraphCall(p, outer, self.runner) for k, p in self.subplans.items()}
        return self.fn(*args[: self.n], **self.kwargs, **bound)


def build_plan(graph: Graph, opsets: dict, runner, custom_ops=None, function_expander=None,
               keep=frozenset()) -> ExecutionPlan:
    return Planner(opsets, runner, custom_ops, function_expander).plan(graph, keep=keep)


_np_generic = np.generic
_lock = threading.Lock()
