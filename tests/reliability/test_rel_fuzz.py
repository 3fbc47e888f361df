"""Bounded fuzzing in the normal suite (~40 s); longer runs: ``python -m onnxpy.testing.fuzz --seconds 600``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper
from rel_helpers import model, vi

import onnxpy as ort
from onnxpy.capi import onnxruntime_pybind11_state as C
from onnxpy.testing import fuzz


def _check(stats):
    assert stats.executions > 0
    text = "\n".join(f"[{f.kind}] {f.what}: {f.detail} ({f.case})" for f in stats.findings[:20])
    assert not stats.findings, f"{stats.summary()}\n{text}"


@pytest.mark.parametrize("mode,seed", [("load", 11), ("op", 12)])
def test_fuzz_bounded(mode, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = fuzz.fuzz(15.0, seed=seed, mode=mode)
    print(stats.summary())
    _check(stats)


@pytest.mark.slow
def test_fuzz_long():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stats = fuzz.fuzz(300.0, seed=99, mode="both")
    print(stats.summary())
    _check(stats)


def test_seed_models_are_valid():
    for data in fuzz.seed_models():
        s = ort.InferenceSession(data)
        import random

        feed = fuzz._random_feed(s, random.Random(0))
        s.run(None, feed)


def test_mutation_changes_bytes():
    import random

    rng = random.Random(0)
    data = fuzz.seed_models()[0]
    assert sum(fuzz.mutate(data, rng) != data for _ in range(50)) > 40


def test_fuzz_cli_runs():
    assert fuzz.main(["--seconds", "1", "--seed", "3"]) == 0


def test_raw_numpy_error_is_wrapped_with_node_name():
    """An IndexError raised inside a kernel surfaces as Fail naming the node and its input shapes."""
    m = model([helper.make_node("Gather", ["X", "I"], ["Y"], axis=0, name="my_gather")],
              [vi("X", shape=[3]), vi("I", TensorProto.INT64, [1])], [vi("Y", shape=[1])])
    s = ort.InferenceSession(m.SerializeToString())
    with pytest.raises(C.Fail) as ei:
        s.run(None, {"X": np.ones(3, np.float32), "I": np.array([7], np.int64)})
    msg = str(ei.value)
    assert "my_gather" in msg and "Gather" in msg
    assert "float32[3]" in msg  # input shapes are described


def test_custom_op_raising_anything_is_wrapped():
    so = ort.SessionOptions()

    def boom(x):
        raise KeyError("kaboom")

    so.register_custom_op("my.domain", "Boom", boom)
    g = helper.make_graph([helper.make_node("Boom", ["X"], ["Y"], domain="my.domain", name="boom_node")], "g",
                          [vi("X", shape=[1])], [vi("Y", shape=[1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 1)])
    m.ir_version = 8
    s = ort.InferenceSession(m.SerializeToString(), so)
    with pytest.raises(C.Fail, match="boom_node"):
        s.run(None, {"X": np.ones(1, np.float32)})
