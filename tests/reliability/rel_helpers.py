"""Shared helpers for the reliability tests (model builders, error-type checks, RSS)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
from onnx import TensorProto, helper

from onnxpy.capi import onnxruntime_pybind11_state as C

ORT_ERRORS = (C.Fail, C.InvalidArgument, C.NoSuchFile, C.NoModel, C.InvalidProtobuf, C.InvalidGraph,
              C.NotImplemented, C.RuntimeException, C.EngineError)


def model(nodes, inputs, outputs, inits=(), opset=17, ir=8, functions=()):
    g = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], functions=list(functions))
    m.ir_version = ir
    return m


def vi(name, elem=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm (no psutil)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def run_with_timeout(fn, seconds: float):
    """Run ``fn`` in a daemon thread; returns (finished, result_or_exception)."""
    box = {}

    def work():
        try:
            box["r"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["e"] = e

    t = threading.Thread(target=work, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds)
    if t.is_alive():
        return False, None
    box["elapsed"] = time.monotonic() - t0
    return True, box.get("e", box.get("r"))


def loop_model(body_nodes=True, opset=17):
    """Loop with trip count M (int64 scalar input) carrying a float tensor x; body adds 1 (or is empty)."""
    bx_in = vi("x_in", TensorProto.FLOAT, [1])
    b_i = vi("i", TensorProto.INT64, [])
    b_c = vi("c", TensorProto.BOOL, [])
    if body_nodes:
        one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
        nodes = [helper.make_node("Add", ["x_in", "one"], ["x_out"], name="body_add"),
                 helper.make_node("Identity", ["c"], ["c_out"], name="body_cond")]
        body = helper.make_graph(nodes, "body", [b_i, b_c, bx_in],
                                 [vi("c_out", TensorProto.BOOL, []), vi("x_out", TensorProto.FLOAT, [1])],
                                 initializer=[one])
    else:
        body = helper.make_graph([], "body", [b_i, b_c, bx_in],
                                 [vi("c", TensorProto.BOOL, []), vi("x_in", TensorProto.FLOAT, [1])])
    loop = helper.make_node("Loop", ["M", "", "x0"], ["x_final"], body=body, name="the_loop")
    return model([loop], [vi("M", TensorProto.INT64, []), vi("x0", TensorProto.FLOAT, [1])],
                 [vi("x_final", TensorProto.FLOAT, [1])], opset=opset)


def x0():
    return np.zeros(1, np.float32)
