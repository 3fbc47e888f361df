"""ORT_PARALLEL: run independent branches of a plan concurrently on a thread pool.

numpy releases the GIL inside BLAS and most ufunc loops on large arrays, so branches such as the towers of
an Inception block overlap.  Steps become ready when every step producing one of their inputs is done; a
value is dropped when its last reader finishes (the sequential free-after lists assume sequential order).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import limits
from ..capi.onnxruntime_pybind11_state import Fail, _OrtError
from .executor import node_error
from .plan import SINK, ExecutionPlan


class ParallelSchedule:
    """Dependency data for one plan, computed once."""

    def __init__(self, plan: ExecutionPlan):
        producer = {}
        for i, st in enumerate(plan.steps):
            for s in st.outs:
                if s != SINK:
                    producer[s] = i
        self.n_deps = []
        self.children = [[] for _ in plan.steps]
        readers = {}
        for i, st in enumerate(plan.steps):
            deps = {producer[s] for s in st.ins if s in producer}
            self.n_deps.append(len(deps))
            for d in deps:
                self.children[d].append(i)
            for s in set(st.ins):
                readers[s] = readers.get(s, 0) + 1
        pinned = set(plan.output_slots) | set(plan.input_slots.values()) | set(plan.outer_slots) | {SINK}
        pinned |= {i for i, v in enumerate(plan.template) if v is not None}
        self.readers = {s: c for s, c in readers.items() if s not in pinned}
        self.roots = [i for i, n in enumerate(self.n_deps) if n == 0]


_pools: dict = {}
_pools_lock = threading.Lock()


def get_pool(n_threads: int) -> ThreadPoolExecutor:
    n = n_threads if n_threads > 0 else (os.cpu_count() or 2)
    with _pools_lock:
        pool = _pools.get(n)
        if pool is None:
            pool = _pools[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="onnxpy-inter-op")
        return pool


def run_parallel(plan: ExecutionPlan, schedule: ParallelSchedule, vals: list, pool: ThreadPoolExecutor,
                 run_options=None) -> None:
    """Run every step of ``plan`` on ``vals`` (already holding feeds and constants), in dependency order."""
    steps = plan.steps
    remaining = list(schedule.n_deps)
    readers = dict(schedule.readers)
    lock = threading.Lock()
    done = threading.Event()
    state = {"left": len(steps), "error": None}
    if not steps:
        return
    lim = limits.current()  # the session's limits, re-installed on the pool threads

    def finish_step(i):
        ready = []
        with lock:
            for s in set(steps[i].ins):
                c = readers.get(s)
                if c is not None:
                    if c == 1:
                        del readers[s]
                        vals[s] = None
                    else:
                        readers[s] = c - 1
            for c in schedule.children[i]:
                remaining[c] -= 1
                if remaining[c] == 0:
                    ready.append(c)
            state["left"] -= 1
            if state["left"] == 0:
                done.set()
        return ready

    def work(i):
        with limits.applied(lim):
            _work(i)

    def _work(i):
        while True:
            if state["error"] is not None:
                done.set()
                return
            st = steps[i]
            args = [vals[s] for s in st.ins]
            try:
                if run_options is not None and run_options.terminate:
                    raise Fail.make("Exiting due to terminate flag being set to true.")
                res = st.fn(*args)
                if type(res) is not tuple:
                    res = (res,)
                for s, r in zip(st.outs, res):
                    if s != SINK:
                        vals[s] = np.asarray(r) if isinstance(r, np.generic) else r
            except _OrtError as e:
                state["error"] = e
                done.set()
                return
            except Exception as e:  # noqa: BLE001 - reported with the node's context
                state["error"] = node_error(st, args, e)
                done.set()
                return
            ready = finish_step(i)
            if not ready:
                return
            for c in ready[1:]:
                pool.submit(work, c)
            i = ready[0]  # keep going on this thread with the first ready child

    for r in schedule.roots:
        pool.submit(work, r)
    done.wait()
    if state["error"] is not None:
        raise state["error"]
