"""onnxruntime-format profiling: a JSON array of Chrome trace "complete" events (Perfetto, chrome://tracing)."""

from __future__ import annotations

import datetime
import json
import os
import threading
import time

import numpy as np

from . import dtypes


def _type_shape(v):
    if isinstance(v, np.ndarray):
        try:
            name = dtypes.type_name(dtypes.from_numpy(v.dtype))
        except TypeError:
            name = str(v.dtype)
        return {name: list(v.shape)}
    return {type(v).__name__: []}


def _nbytes(vals) -> int:
    return int(sum(v.nbytes for v in vals if isinstance(v, np.ndarray)))


class Profiler:
    """Collects session and per-node events; ``end()`` writes ``<prefix><timestamp>.json``."""

    def __init__(self, prefix: str, source):
        self.prefix = prefix or "onnxruntime_profile_"
        self.start_ns = time.monotonic_ns()
        self._t0 = time.perf_counter_ns()
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._ended = False
        self.pid = os.getpid()
        self._load_name = "model_loading_uri" if isinstance(source, (str, os.PathLike)) else "model_loading_array"
        self.session_event(self._load_name, self._t0, self._t0)

    def now(self) -> int:
        return time.perf_counter_ns()

    def _event(self, cat, name, t0, t1, args=None):
        ev = {"cat": cat, "pid": self.pid, "tid": threading.get_ident() % 100000, "dur": (t1 - t0) // 1000,
              "ts": (t0 - self._t0) // 1000, "ph": "X", "name": name, "args": args or {}}
        with self._lock:
            self.events.append(ev)

    def session_event(self, name, t0, t1):
        self._event("Session", name, t0, t1)

    def node_event(self, step, args, outs, t0):
        t1 = time.perf_counter_ns()
        node = step.node
        name = node.name or f"{node.op_type}_{step.index}"
        self._event("Node", f"{name}_kernel_time", t0, t1, {
            "op_name": node.op_type,
            "provider": "CPUExecutionProvider",
            "node_index": str(step.index),
            "activation_size": str(_nbytes(args)),
            "parameter_size": "0",
            "output_size": str(_nbytes(outs)),
            "input_type_shape": [_type_shape(a) for a in args if a is not None],
            "output_type_shape": [_type_shape(o) for o in outs if o is not None],
        })

    def run_model(self, fn):
        t0 = time.perf_counter_ns()
        try:
            return fn()
        finally:
            self.session_event("model_run", t0, time.perf_counter_ns())

    def end(self) -> str:
        if self._ended:
            return ""
        self._ended = True
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")[:-3]
        path = f"{self.prefix}{stamp}.json"
        with self._lock, open(path, "w") as f:
            json.dump(self.events, f)
        return path
