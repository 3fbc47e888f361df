"""ONNX backend conformance: run every backend test case of the installed onnx package through onnxpy.

Cases: the node cases generated in memory by ``onnx.backend.test.case.node``, the model cases of
``onnx.backend.test.case.model`` that carry their model, and the file cases shipped in the onnx wheel
(``simple``, ``pytorch-converted``, ``pytorch-operator``).  Comparison uses onnx's own backend runner rule
(``Runner.assert_similar_outputs``) with each case's tolerances (rtol 1e-3, atol 1e-7 by default).

    python -m onnxpy.testing.conformance [REGEX] [-v] [--list]     # prints "N/M passed"
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

FILE_KINDS = ("simple", "pytorch-converted", "pytorch-operator")
EXCLUSIONS_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "backend", "exclusions")


@dataclass
class Case:
    name: str
    kind: str
    load: Callable[[], tuple[bytes, list[tuple[list, list]]]]  # -> model bytes, [(inputs, outputs)]
    rtol: float = 1e-3
    atol: float = 1e-7


def _data_dir() -> str:
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def _read_pb(path: str, type_proto) -> Any:
    which = type_proto.WhichOneof("value") if type_proto is not None else "tensor_type"
    with open(path, "rb") as f:
        data = f.read()
    if which == "sequence_type":
        p = onnx.SequenceProto()
        p.ParseFromString(data)
        return numpy_helper.to_list(p)
    if which == "optional_type":
        p = onnx.OptionalProto()
        p.ParseFromString(data)
        return numpy_helper.to_optional(p)
    if which == "map_type":
        p = onnx.MapProto()
        p.ParseFromString(data)
        return numpy_helper.to_dict(p)
    t = onnx.TensorProto()
    t.ParseFromString(data)
    arr = numpy_helper.to_array(t)
    if arr.dtype == object:
        arr = np.array([x.decode() if isinstance(x, bytes) else x for x in arr.reshape(-1)],
                       dtype=object).reshape(arr.shape)
    return arr


def _value(x):
    """Node cases give some tensors as TensorProto (float8, int4, ...): decode them like the runtime does."""
    if isinstance(x, onnx.TensorProto):
        from onnxpy.ir.load import tensor_to_array

        return tensor_to_array(x)
    return x


def assert_similar(expected, got, rtol: float, atol: float) -> None:
    """onnx's backend comparison, with sequences compared element by element (0-d elements included)."""
    from onnx.backend.test.runner import Runner

    assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
    for e, g in zip(expected, got):
        if isinstance(e, (list, tuple)):
            assert isinstance(g, (list, tuple)), f"expected a sequence, got {type(g).__name__}"
            assert len(g) == len(e), f"sequence of {len(g)} elements, expected {len(e)}"
            assert_similar(list(e), list(g), rtol, atol)
        elif e is None or g is None:
            assert e is None and g is None, f"expected {e!r}, got {g!r}"
        else:
            Runner.assert_similar_outputs([e], [g], rtol=rtol, atol=atol)


def _file_case(kind: str, case_dir: str) -> Case:
    name = os.path.basename(case_dir)

    def load():
        model_path = os.path.join(case_dir, "model.onnx")
        model = onnx.load(model_path)
        init = {i.name for i in model.graph.initializer}
        ins = [v for v in model.graph.input if v.name not in init]
        outs = list(model.graph.output)
        sets = []
        for ds in sorted(glob.glob(os.path.join(case_dir, "test_data_set_*"))):
            n_in = len(glob.glob(os.path.join(ds, "input_*.pb")))
            n_out = len(glob.glob(os.path.join(ds, "output_*.pb")))
            inputs = [_read_pb(os.path.join(ds, f"input_{i}.pb"), ins[i].type if i < len(ins) else None)
                      for i in range(n_in)]
            outputs = [_read_pb(os.path.join(ds, f"output_{i}.pb"), outs[i].type if i < len(outs) else None)
                       for i in range(n_out)]
            sets.append((inputs, outputs))
        with open(model_path, "rb") as f:
            return f.read(), sets

    return Case(name, kind, load)


def collect_cases() -> list[Case]:
    """Every backend case, node cases first, de-duplicated by name."""
    from onnx.backend.test.case import model as model_cases
    from onnx.backend.test.case import node as node_cases

    cases: dict[str, Case] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        generated = list(node_cases.collect_testcases(None)) + [
            t for t in model_cases.collect_testcases() if t.model is not None
        ]
    for t in generated:
        def load(t=t):
            return t.model.SerializeToString(), [([_value(x) for x in i], [_value(x) for x in o])
                                                  for i, o in t.data_sets]

        cases.setdefault(t.name, Case(t.name, t.kind, load, t.rtol, t.atol))
    for kind in FILE_KINDS:
        for d in sorted(glob.glob(os.path.join(_data_dir(), kind, "*"))):
            if os.path.isdir(d):
                cases.setdefault(os.path.basename(d), _file_case(kind, d))
    return list(cases.values())


def load_exclusions(path: str = EXCLUSIONS_DIR) -> dict[str, str]:
    """name -> reason, from every ``*.txt`` file under the exclusions folder (``name  # reason`` lines)."""
    out = {}
    for f in sorted(glob.glob(os.path.join(path, "*.txt"))):
        with open(f) as fh:
            for line in fh:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                name, _, reason = line.partition("#")
                out[name.strip()] = reason.strip() or "no reason given"
    return out


# Cases whose expected values are draws of numpy's unseeded global RNG (the spec leaves the random stream
# unspecified): their outputs are checked by property instead -- same shape and dtype, every value in the
# op's support, and for a seeded op the same values on every run.
RANDOM_OUTPUT_CASES = {
    "test_bernoulli": {0, 1},
    "test_bernoulli_expanded": {0, 1},
    "test_bernoulli_double": {0, 1},
    "test_bernoulli_double_expanded": {0, 1},
    "test_bernoulli_seed": {0, 1},
    "test_bernoulli_seed_expanded": {0, 1},
}


def _check_random(case: Case, sess, feeds_and_expected) -> None:
    support = RANDOM_OUTPUT_CASES[case.name]
    for feed, expected in feeds_and_expected:
        got = sess.run(None, feed)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype, f"{g.dtype}{g.shape} vs {e.dtype}{e.shape}"
            assert set(np.unique(g).tolist()) <= support, f"values outside {support}"
        if "seed" in case.name:
            again = sess.run(None, feed)
            assert all(np.array_equal(a, b) for a, b in zip(got, again)), "a seeded op changed between runs"


def run_case(case: Case) -> None:
    """Run one case; raises AssertionError (wrong result) or the runtime's exception."""
    import onnxpy

    model_bytes, sets = case.load()
    sess = onnxpy.InferenceSession(model_bytes)
    names = [i.name for i in sess.get_inputs()]
    if case.name in RANDOM_OUTPUT_CASES:
        _check_random(case, sess, [(dict(zip(names, i)), o) for i, o in sets])
        return
    for inputs, expected in sets:
        feed = {n: v for n, v in zip(names, inputs)}
        if len(inputs) > len(names):  # cases that also feed overridable initializers
            over = [i.name for i in sess.get_overridable_initializers()]
            feed.update(zip(over, inputs[len(names):]))
        got = sess.run(None, feed)
        assert_similar(expected, got, case.rtol, case.atol)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pattern", nargs="?", default="", help="regex on case names (re.search)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every failure with its error")
    ap.add_argument("--list", action="store_true", help="only list matching case names")
    ap.add_argument("--include-excluded", action="store_true", help="also run cases in the exclusions files")
    args = ap.parse_args(argv)
    rx = re.compile(args.pattern)
    excl = load_exclusions()
    cases = [c for c in collect_cases() if rx.search(c.name)]
    if args.list:
        for c in cases:
            print(c.kind, c.name)
        return 0
    passed, failed, skipped = 0, [], 0
    t0 = time.perf_counter()
    for c in cases:
        if c.name in excl and not args.include_excluded:
            skipped += 1
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run_case(c)
            passed += 1
        except Exception as e:  # noqa: BLE001 - every failure is reported
            msg = f"{type(e).__name__}: {e}".replace("\n", " ")
            failed.append((c.name, msg))
    for name, msg in failed:
        print(f"FAIL {name}: {msg[:400] if not args.verbose else msg[:3000]}")
    total = len(cases)
    print(f"{passed}/{total} passed ({len(failed)} failed, {skipped} excluded) in {time.perf_counter() - t0:.1f}s")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
