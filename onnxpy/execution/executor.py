"""Runs an :class:`ExecutionPlan` on a per-run slot list.  The loop never looks at op types."""

from __future__ import annotations

import threading

import numpy as np

from ..capi.onnxruntime_pybind11_state import Fail, _OrtError
from ..errors import describe_value
from .plan import SINK, ExecutionPlan, _Donor, _IfKernel, if_condition

_generic = np.generic
_asarray = np.asarray
_ndarray = np.ndarray


class RunContext:
    """Per-run settings the loop consults (terminate flag, profiler); None means a plain run."""

    __slots__ = ("run_options", "profiler")

    def __init__(self, run_options=None, profiler=None):
        self.run_options = run_options
        self.profiler = profiler


_local = threading.local()


def current_context() -> RunContext | None:
    """The RunContext of the run in progress on this thread (subgraph runs inherit it)."""
    return getattr(_local, "ctx", None)


def run_subgraph(plan: ExecutionPlan, inputs, outer):
    """Runner for subgraph calls: runs with the enclosing run's context (terminate flag)."""
    return run_plan(plan, inputs, outer, current_context())


def run_branch(plan: ExecutionPlan, outer) -> tuple:
    """:func:`run_subgraph` for a plan without inputs (an If branch), returning a tuple: the lean path."""
    ctx = getattr(_local, "ctx", None)
    if ctx is not None:
        return tuple(run_plan(plan, (), outer, ctx))
    vals = list(plan.template)
    for s, v in zip(plan.outer_slots, outer):
        vals[s] = v
    _run_steps(plan, vals)
    return tuple([vals[s] for s in plan.output_slots])


def node_error(step, args, exc: BaseException) -> Exception:
    node = step.node
    shapes = ", ".join(f"{n or '<absent>'}: {describe_value(a)}" for n, a in zip(node.inputs, args))
    msg = (
        f"Non-zero status code returned while running {node.op_type} node. Name:'{node.name}' "
        f"Status Message: {type(exc).__name__}: {exc} [inputs: {shapes}]"
    )
    return Fail.make(msg)


def run_plan(plan: ExecutionPlan, inputs, outer=(), ctx: RunContext | None = None, feeds_by_slot=None):
    """Execute ``plan``; ``inputs`` positional for the graph inputs (or ``feeds_by_slot``); returns outputs."""
    vals = list(plan.template)
    if feeds_by_slot is not None:
        for s, v in feeds_by_slot:
            vals[s] = v
    elif inputs:
        for s, v in zip(plan.input_slots.values(), inputs):
            vals[s] = v
    if outer:
        for s, v in zip(plan.outer_slots, outer):
            vals[s] = v
    if ctx is not None and (ctx.profiler is not None or ctx.run_options is not None):
        prev = getattr(_local, "ctx", None)
        _local.ctx = ctx
        try:
            _run_steps_ctx(plan, vals, ctx)
        finally:
            _local.ctx = prev
    else:
        _run_steps(plan, vals)
    return [vals[s] for s in plan.output_slots]


def _store_many(vals, outs, res):
    if type(res) is not tuple:
        res = (res,)
    for s, r in zip(outs, res):
        vals[s] = _asarray(r) if isinstance(r, _generic) else r


def _one(res):
    if type(res) is tuple:
        res = res[0]
    return _asarray(res) if isinstance(res, _generic) else res


# A plan that has run a few times runs as generated straight-line Python (one statement per step reading and
# writing the slot list), which drops the per-step tuple unpacking, argument gathering and mode dispatch of the
# loop below: ~0.2-0.5 us per step, 5-7% of a small model such as silero-vad.  Python compiles such code at
# ~60-100 us per step, so one-off plans (constant folding runs single nodes) never pay it, and plans longer than
# _COMPILE_MAX_STEPS keep the loop (their steps are heavy enough for the loop's overhead not to matter).
_COMPILE = True  # test hook: the generated runner on/off
_COMPILE_AFTER_RUNS = 2
_COMPILE_MAX_STEPS = 2000


def _run_steps(plan, vals):
    c = plan.compiled  # None, the number of loop runs so far, False (never), or (fast, runner)
    if c.__class__ is tuple and c[0] is plan.fast:
        c[1](vals)
        return
    _run_steps_loop(plan, vals)
    if c is False:
        return
    n = c + 1 if c.__class__ is int else 1
    if n < _COMPILE_AFTER_RUNS:
        plan.compiled = n
        return
    run = _compile(plan.fast, len(plan.template)) if _COMPILE else None
    plan.compiled = (plan.fast, run) if run is not None else False


def _compile(fast, n_slots=None):
    """The straight-line runner of a plan's ``fast`` steps, or None when the loop should run them.

    Each step becomes ``vals[out] = f_k(vals[a], vals[b], ...)`` (the result is stored straight into the slot
    list, never kept in a local, as the loop does: in-place donors count references), the loop's conversion of
    non-array results, and the step's frees.  A failure is reported for the step whose line raised it, exactly
    as the loop reports it.

    With ``n_slots`` (the plan's slot count), If nodes whose branches run through :func:`run_branch` are inlined:
    the condition becomes a Python ``if`` and each branch's steps follow in the same runner, on slots appended to
    the slot list (the branches' constants are appended at the start of every run; outer-scope values are read
    from the parent's slots directly), so a branch costs no plan call, slot list or output tuple."""
    if not fast or len(fast) > _COMPILE_MAX_STEPS:
        return None
    env = {"_nd": _ndarray, "_one": _one, "_store_many": _store_many, "_OrtError": _OrtError, "_cond": if_condition}
    lines = ["def run(vals):", "    try:"]
    line_step: dict[int, tuple] = {}  # line -> (step, its argument slots in the runner's slot list)
    ext: list = []  # the inlined branches' templates, appended to vals at the start of a run
    budget = [_COMPILE_MAX_STEPS - len(fast)] if n_slots is not None else [-1]
    names = [0]

    def add(fn):
        k = names[0]
        names[0] += 1
        env[f"f{k}"] = fn
        return f"f{k}"

    def emit(fast, m, pad, depth):
        for fn, _, mode, out, outs, free, step in fast:
            ins = tuple(m(i) for i in step.ins)
            out, outs, free = m(out) if out else out, tuple(m(i) for i in outs), tuple(m(i) for i in free)
            first = len(lines) + 1
            sub = _inlinable(fn, mode, depth, budget)
            if sub is not None:
                lines.append(f"{pad}if _cond(vals[{ins[0]}]):")
                line_step[first] = (step, ins)
                for b, plan in enumerate(sub):
                    if b:
                        lines.append(f"{pad}else:")
                    off = n_slots + len(ext)
                    ext.extend(plan.template)
                    bm = _slot_map(dict(zip(plan.outer_slots, ins[1:])), off)
                    n0 = len(lines)
                    emit(plan.fast, bm, pad + "    ", depth + 1)
                    srcs = [bm(i) for i in plan.output_slots]
                    lines.extend(f"{pad}    vals[{o}] = vals[{i}]" for o, i in zip(outs, srcs))
                    # (the branch's outputs now live in the If's slots: drop the branch's own references)
                    lines.extend(f"{pad}    vals[{i}] = None" for i in dict.fromkeys(srcs) if i >= off)
                    if len(lines) == n0:
                        lines.append(f"{pad}    pass")
                    for ln in range(n0 + 1, len(lines) + 1):
                        line_step.setdefault(ln, (step, ins))
                lines.extend(f"{pad}vals[{i}] = None" for i in free)
                for ln in range(len(lines) - len(free) + 1, len(lines) + 1):
                    line_step[ln] = (step, ins)
                continue
            if mode == 2:
                if depth:  # a donor inside an inlined branch: the same kernel over the runner's slots
                    fn = _Donor(fn.fn, ins, tuple((p, m(s)) for p, s in fn.cands), fn.bound)
                call = f"{add(fn)}(vals)"
            else:
                call = f"{add(fn)}({', '.join(f'vals[{i}]' for i in ins)})"
            if out:
                lines.append(f"{pad}vals[{out}] = {call}")
                lines.append(f"{pad}if vals[{out}].__class__ is not _nd: vals[{out}] = _one(vals[{out}])")
            else:
                lines.append(f"{pad}_store_many(vals, {outs!r}, {call})")
            lines.extend(f"{pad}vals[{i}] = None" for i in free)
            for ln in range(first, len(lines) + 1):
                line_step[ln] = (step, ins)

    emit(fast, lambda i: i, "        ", 0)
    if ext:
        env["_ext"] = tuple(ext)
        lines.insert(2, "        vals.extend(_ext)")
        line_step = {ln + 1 if ln >= 3 else ln: v for ln, v in line_step.items()}
    lines += ["    except _OrtError:", "        raise", "    except Exception as e:  # noqa: BLE001",
              "        _fail(e, vals)"]

    def _fail(e, vals):
        tb = e.__traceback__
        step, ins = line_step[tb.tb_lineno]  # (the first entry is the runner's own frame: the failing step's line)
        if isinstance(e, RecursionError):
            raise _nesting_error(step, e) from None
        raise node_error(step, [vals[i] for i in ins], e) from e

    env["_fail"] = _fail
    exec(compile("\n".join(lines), "<onnxpy plan>", "exec"), env)  # noqa: S102 - our own generated code
    return env["run"]


def _slot_map(outer: dict, off: int):
    """An inlined branch's slot -> the runner's slot: the sink stays, outer-scope values are the parent's slots,
    the branch's own slots follow ``off``."""
    return lambda i: i if i == SINK else outer.get(i, off + i)


_INLINE_DEPTH = 8  # If nodes nested deeper than this inside inlined branches keep their own runners


def _inlinable(fn, mode, depth, budget):
    """(then_plan, else_plan) when the step is an If the runner may inline (see :func:`_compile`), else None."""
    if fn.__class__ is not _IfKernel or mode != 1 or fn.branch is not run_branch or depth >= _INLINE_DEPTH:
        return None
    plans = (fn.then_plan, fn.else_plan)
    if any(len(p.outer_slots) != len(p.outer_names) for p in plans):
        return None
    n = sum(len(p.fast) for p in plans)
    if n > budget[0]:
        return None
    budget[0] -= n
    return plans


def _nesting_error(step, exc: RecursionError) -> Exception:
    """The error of a step that ran out of recursion depth (deeply nested subgraphs)."""
    return Fail.make(f"Graph nesting too deep while running {step.node.describe()}: {exc}")


def _run_steps_loop(plan, vals):
    # The result is stored straight into ``vals`` (never kept in a local): a later in-place donor counts the
    # references to an array, and a stale local would hide that it died.
    step = None
    try:
        for fn, get, mode, out, outs, free, step in plan.fast:  # noqa: B007 - step is read on errors
            if out:
                if mode == 0:
                    vals[out] = fn(get(vals))
                elif mode == 1:
                    vals[out] = fn(*get(vals))
                else:
                    vals[out] = fn(vals)
                if type(vals[out]) is not _ndarray:
                    vals[out] = _one(vals[out])
            elif mode == 0:
                _store_many(vals, outs, fn(get(vals)))
            elif mode == 1:
                _store_many(vals, outs, fn(*get(vals)))
            else:
                _store_many(vals, outs, fn(vals))
            for s in free:
                vals[s] = None
    except _OrtError:
        raise
    except RecursionError as e:
        raise _nesting_error(step, e) from None
    except Exception as e:  # noqa: BLE001 - every kernel failure becomes an onnxruntime-style error
        raise node_error(step, [vals[i] for i in step.ins], e) from e


def _run_steps_ctx(plan, vals, ctx: RunContext):
    """The same loop with the per-run hooks (terminate flag, per-node profiling)."""
    ro = ctx.run_options
    prof = ctx.profiler
    step = None
    args = ()
    if ro is not None and ro.terminate:  # also stops loops whose body has no nodes
        raise Fail.make("Exiting due to terminate flag being set to true.")
    try:
        for step in plan.steps:
            if ro is not None and ro.terminate:
                raise Fail.make("Exiting due to terminate flag being set to true.")
            args = [vals[i] for i in step.ins]
            t0 = prof.now() if prof is not None else 0
            res = step.fn(*args)
            outs = step.outs
            if type(res) is not tuple:
                res = (res,)
            for s, r in zip(outs, res):
                vals[s] = _asarray(r) if isinstance(r, _generic) else r
            if prof is not None:
                prof.node_event(step, args, [vals[s] for s in outs], t0)
            for s in step.free:
                vals[s] = None
            vals[SINK] = None
    except _OrtError:
        raise
    except RecursionError as e:
        raise _nesting_error(step, e) from None
    except Exception as e:  # noqa: BLE001
        raise node_error(step, args, e) from e
