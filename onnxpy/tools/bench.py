"""``onnxpy bench MODEL``: latency benchmark in the spirit of ``onnxruntime_perf_test``.

Runs ``--warmup`` untimed runs, then ``-r N`` timed runs or as many as fit in ``-t SECONDS``, and prints mean,
min, max and the p50/p90/p95/p99 latencies and throughput.  ``--compare-onnxruntime`` runs onnxruntime on the same
inputs in the same process (when it is installed) and prints onnxpy/onnxruntime ratios and the largest output
difference.  Inputs are random data of each input's declared type; dynamic dimensions default to 1 and are set with
``--shape name=1x3x224x224`` (or ``--dim symbol=value``), real data comes with ``--input name=file.npy``.

Also importable: :func:`make_inputs`, :func:`time_runs`, :func:`percentiles`, :func:`info_lines`.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time

import numpy as np

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

OPT_LEVELS = {"disable": 0, "basic": 1, "extended": 2, "layout": 3, "all": 99,
              "0": 0, "1": 1, "2": 2, "3": 3, "99": 99}


class UsageError(ValueError):
    """A bad command-line value (exit code 2)."""


# -- progress bar ---------------------------------------------------------------------------------------------

class ProgressBar:
    """A one-line stderr progress bar (no dependencies); silent when disabled or stderr is not a terminal."""

    def __init__(self, total: float, label: str = "", enabled: bool | None = None, stream=None, width: int = 30):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled and total > 0
        self.total = float(total)
        self.label = label
        self.width = width
        self._last = -1.0
        self._drawn = False

    def update(self, done: float, extra: str = "") -> None:
        if not self.enabled:
            return
        frac = min(1.0, max(0.0, done / self.total))
        if frac - self._last < 0.01 and frac < 1.0:
            return
        self._last = frac
        filled = int(round(frac * self.width))
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {frac * 100:5.1f}% {extra}".rstrip() + " ")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


# -- inputs ---------------------------------------------------------------------------------------------------

def parse_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """``name=1x3x224x224`` (or ``name=1,3,224,224``; ``name=`` for a scalar) -> (name, dims)."""
    if "=" not in spec:
        raise UsageError(f"--shape expects NAME=DIMS like data=1x3x224x224, got '{spec}'")
    name, dims = spec.rsplit("=", 1)
    dims = dims.strip()
    if not dims or dims in ("()", "[]", "scalar"):
        return name, ()
    parts = dims.replace(",", "x").replace("X", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--shape {spec}: dimensions must be integers separated by 'x'") from None
    if any(d < 0 for d in shape):
        raise UsageError(f"--shape {spec}: dimensions must be >= 0")
    return name, shape


def parse_dim(spec: str) -> tuple[str, int]:
    if "=" not in spec:
        raise UsageError(f"--dim expects SYMBOL=VALUE like batch=8, got '{spec}'")
    name, v = spec.rsplit("=", 1)
    try:
        value = int(v)
    except ValueError:
        raise UsageError(f"--dim {spec}: the value must be an integer") from None
    if value < 0:
        raise UsageError(f"--dim {spec}: the value must be >= 0")
    return name, value


def _numpy_dtype(type_name: str):
    from .. import dtypes

    for code in range(1, 64):
        try:
            if dtypes.type_name(code) == type_name:
                return dtypes.to_numpy(code)
        except (TypeError, KeyError, ValueError):
            continue
    return None


def _split_type(t: str) -> tuple[str, str]:
    """'seq(tensor(float))' -> ('seq', 'tensor(float)')."""
    i = t.find("(")
    if i < 0 or not t.endswith(")"):
        return t, ""
    return t[:i], t[i + 1:-1]


def random_value(type_str: str, shape, rng, name: str = "input"):
    """Random data for an onnxruntime type string (``tensor(float)``, ``seq(tensor(int64))``, ``optional(...)``)."""
    kind, inner = _split_type(type_str)
    if kind == "tensor":
        shape = tuple(int(d) for d in shape)
        if inner == "string":
            return np.array([f"s{i}" for i in range(int(np.prod(shape, dtype=np.int64)))],
                            dtype=object).reshape(shape)
        dt = _numpy_dtype(inner)
        if dt is None:
            raise UsageError(f"cannot make random data of type {type_str} for input '{name}'; pass --input")
        if dt == np.dtype(bool):
            return rng.integers(0, 2, size=shape).astype(bool)
        if dt.kind in "iu":
            return rng.integers(0, 10, size=shape).astype(dt)
        if dt.kind == "c":
            return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
        return rng.standard_normal(shape).astype(np.float32).astype(dt)
    if kind == "seq":
        return [random_value(inner, shape, rng, name)]
    if kind == "optional":
        return random_value(inner, shape, rng, name)
    raise UsageError(f"cannot make random data of type {type_str} for input '{name}'; pass --input")


def resolve_shape(arg, shapes: dict, dims: dict, notes: list | None = None) -> tuple:
    """The concrete shape for a NodeArg: ``--shape`` wins, then ``--dim`` symbols; other dynamic dims -> 1."""
    if arg.name in shapes:
        shape = shapes[arg.name]
        declared = arg.shape or []
        if declared and len(declared) != len(shape):
            raise UsageError(f"--shape {arg.name}: rank {len(shape)} but the model declares rank {len(declared)} "
                             f"{declared}")
        for i, (got, want) in enumerate(zip(shape, declared)):
            if isinstance(want, int) and want >= 0 and got != want:
                raise UsageError(f"--shape {arg.name}: dimension {i} is {got} but the model fixes it to {want}")
        return tuple(shape)
    out = []
    for i, d in enumerate(arg.shape or []):
        if isinstance(d, int) and d >= 0:
            out.append(d)
        elif isinstance(d, str) and d in dims:
            out.append(dims[d])
        else:
            out.append(1)
            if notes is not None:
                notes.append(f"{arg.name}[{i}] ({d if d else 'unnamed'}) -> 1")
    return tuple(out)


def load_input_file(path: str):
    if path.endswith(".json"):
        with open(path) as f:
            return json.load(f)
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    return np.load(path, allow_pickle=False)


def make_inputs(sess, shapes: dict | None = None, dims: dict | None = None, files: dict | None = None,
                seed: int = 0, notes: list | None = None) -> dict:
    """A feed dict for ``sess``: files first, then random data of each input's declared type and shape."""
    shapes, dims, files = dict(shapes or {}), dict(dims or {}), dict(files or {})
    names = {a.name for a in sess.get_inputs()}
    for n in list(shapes) + list(files):
        if n not in names:
            raise UsageError(f"'{n}' is not an input of the model (inputs: {sorted(names)})")
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in sess.get_inputs():
        if arg.name in files:
            feeds[arg.name] = files[arg.name]
            continue
        feeds[arg.name] = random_value(arg.type, resolve_shape(arg, shapes, dims, notes), rng, arg.name)
    return feeds


# -- timing ---------------------------------------------------------------------------------------------------

def percentiles(times_s, qs=(50, 90, 95, 99)) -> dict:
    """Latency statistics in milliseconds."""
    a = np.asarray(times_s, dtype=np.float64) * 1e3
    if a.size == 0:
        return {"runs": 0}
    out = {"runs": int(a.size), "mean_ms": float(a.mean()), "min_ms": float(a.min()), "max_ms": float(a.max()),
           "std_ms": float(a.std())}
    for q in qs:
        out[f"p{q}_ms"] = float(np.percentile(a, q))
    total = float(a.sum()) / 1e3
    out["throughput_per_s"] = float(a.size / total) if total > 0 else math.inf
    return out


def time_runs(run, runs: int | None = None, duration: float | None = None, warmup: int = 0,
              progress: ProgressBar | None = None, label: str = "") -> list[float]:
    """Call ``run()`` ``warmup`` times untimed, then ``runs`` times (or until ``duration`` seconds); seconds each."""
    for _ in range(max(0, int(warmup))):
        run()
    times: list[float] = []
    if duration is not None:
        end = time.perf_counter() + float(duration)
        start = time.perf_counter()
        while True:
            t = time.perf_counter()
            run()
            t1 = time.perf_counter()
            times.append(t1 - t)
            if progress is not None:
                progress.update(t1 - start, f"{len(times)} runs")
            if t1 >= end or (runs is not None and len(times) >= runs):
                break
    else:
        n = max(1, int(runs or 1))
        for i in range(n):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
            if progress is not None:
                progress.update(i + 1, f"{i + 1}/{n}")
    if progress is not None:
        progress.close()
    return times


def _import_onnxruntime():
    """The real onnxruntime module, or None (also None when ``onnxruntime`` is aliased to onnxpy by compat)."""
    try:
        import onnxruntime
    except Exception:  # noqa: BLE001 - not installed or broken install
        return None
    if getattr(onnxruntime, "package_name", "") == "onnxpy" or onnxruntime.__name__.startswith("onnxpy"):
        return None
    return onnxruntime


def _ort_options(ort, level: int, threads: int | None):
    so = ort.SessionOptions()
    so.graph_optimization_level = {0: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   2: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}.get(
        level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    if threads:
        so.intra_op_num_threads = int(threads)
    so.log_severity_level = 3
    return so


def _max_diff(a, b) -> float | None:
    try:
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return math.inf
        if a.dtype == object or b.dtype == object:
            return 0.0 if np.array_equal(a, b) else math.inf
        if a.size == 0:
            return 0.0
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        return float(np.nanmax(d)) if not np.all(np.isnan(d)) else 0.0
    except (TypeError, ValueError):
        return None


# -- `onnxpy bench` -------------------------------------------------------------------------------------------

def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The ``bench`` options (pass a subparser to add them to it)."""
    p = parser if parser is not None else argparse.ArgumentParser(
        prog="onnxpy bench", description="Benchmark a model's latency (like onnxruntime_perf_test).")
    p.add_argument("model", help="path to an .onnx model")
    p.add_argument("-r", "--runs", type=int, default=None, help="timed runs (default 100, or unlimited with -t)")
    p.add_argument("-t", "--duration", type=float, default=None, metavar="SECONDS",
                   help="run for this many seconds instead of a fixed count")
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed warm-up runs (default 5)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (SessionOptions.intra_op_num_threads)")
    p.add_argument("--opt-level", default="all", choices=sorted(OPT_LEVELS, key=lambda k: (k.isdigit(), k)),
                   help="graph optimization level (default all)")
    p.add_argument("--parallel", action="store_true", help="ExecutionMode.ORT_PARALLEL (inter-op parallelism)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS",
                   help="input shape for dynamic dims, e.g. data=1x3x224x224 (repeatable)")
    p.add_argument("--dim", action="append", default=[], metavar="SYMBOL=VALUE",
                   help="value of a symbolic dimension in every input, e.g. batch=8 (repeatable)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE",
                   help="input data from .npy/.json (repeatable); other inputs are random")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--compare-onnxruntime", action="store_true",
                   help="also time onnxruntime (if installed) in this process and print ratios")
    p.add_argument("--json", dest="json_path", metavar="FILE", help="also write the results as JSON ('-': stdout)")
    p.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="always show the progress bar (default: when stderr is a terminal)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")
    return p


def _session_options(ort_mod, args):
    so = ort_mod.SessionOptions()
    so.graph_optimization_level = OPT_LEVELS[str(args.opt_level)]
    if args.threads:
        if args.threads < 0:
            raise UsageError("--threads must be >= 0")
        so.intra_op_num_threads = int(args.threads)
    if getattr(args, "parallel", False):
        so.execution_mode = ort_mod.ExecutionMode.ORT_PARALLEL
    return so


def _parse_common(args) -> tuple[dict, dict, dict]:
    shapes = dict(parse_shape(s) for s in args.shape)
    dims = dict(parse_dim(s) for s in args.dim)
    files = {}
    for spec in args.input:
        if "=" not in spec:
            raise UsageError(f"--input expects NAME=FILE, got '{spec}'")
        name, path = spec.split("=", 1)
        files[name] = load_input_file(path)
    return shapes, dims, files


def _fmt_row(name, stats) -> str:
    return (f"{name:<12}{stats['mean_ms']:>10.3f}{stats['p50_ms']:>10.3f}{stats['p90_ms']:>10.3f}"
            f"{stats['p99_ms']:>10.3f}{stats['min_ms']:>10.3f}{stats['max_ms']:>10.3f}"
            f"{stats['throughput_per_s']:>12.1f}{stats['runs']:>8d}")


def run_bench(args, out=None) -> dict:
    """Run the benchmark described by parsed ``args``; prints a report to ``out``; returns the results dict."""
    import onnxpy

    out = out if out is not None else sys.stdout
    if args.runs is not None and args.runs < 1:
        raise UsageError("-r/--runs must be >= 1")
    if args.duration is not None and not args.duration > 0:
        raise UsageError("-t/--duration must be > 0")
    if args.warmup < 0:
        raise UsageError("-w/--warmup must be >= 0")
    if str(args.opt_level) not in OPT_LEVELS:
        raise UsageError(f"--opt-level must be one of {sorted(OPT_LEVELS)}")
    if not os.path.exists(args.model):
        raise FileNotFoundError(f"model file not found: {args.model}")
    shapes, dims, files = _parse_common(args)
    runs = args.runs if (args.runs is not None or args.duration is not None) else 100

    t0 = time.perf_counter()
    sess = onnxpy.InferenceSession(args.model, _session_options(onnxpy, args))
    create_ms = (time.perf_counter() - t0) * 1e3
    notes: list[str] = []
    feeds = make_inputs(sess, shapes, dims, files, seed=args.seed, notes=notes)
    results: dict = {"model": args.model, "session_create_ms": create_ms, "opt_level": str(args.opt_level),
                     "threads": int(args.threads or 0),
                     "inputs": {k: {"shape": list(np.shape(v)), "dtype": str(getattr(v, "dtype", type(v).__name__))}
                                for k, v in feeds.items()}}
    print(f"model: {args.model}", file=out)
    print(f"session created in {create_ms:.1f} ms (opt level {args.opt_level}, threads {args.threads or 'default'})",
          file=out)
    for k, v in results["inputs"].items():
        print(f"input {k}: {v['dtype']}{v['shape']}", file=out)
    if notes:
        print("dynamic dims defaulted to 1 (set them with --shape/--dim): " + ", ".join(notes), file=out)

    def progress(label):
        total = args.duration if args.duration is not None else runs
        long_work = (args.duration or 0) >= 2 or (runs or 0) >= 50
        enabled = args.progress if args.progress is not None else None
        if args.progress is None and not long_work:
            enabled = False
        return ProgressBar(total, label, enabled=enabled)

    onnxpy_out = sess.run(None, feeds)
    times = time_runs(lambda: sess.run(None, feeds), runs=None if args.duration else runs,
                      duration=args.duration, warmup=args.warmup, progress=progress("onnxpy"), label="onnxpy")
    results["onnxpy"] = percentiles(times)
    rows = [("onnxpy", results["onnxpy"])]

    if args.compare_onnxruntime:
        ort = _import_onnxruntime()
        if ort is None:
            print("onnxruntime is not installed (or is aliased to onnxpy): comparison skipped", file=out)
            results["onnxruntime"] = None
        else:
            t0 = time.perf_counter()
            try:
                osess = ort.InferenceSession(args.model, _ort_options(ort, OPT_LEVELS[str(args.opt_level)],
                                                                      args.threads),
                                             providers=["CPUExecutionProvider"])
            except Exception as e:  # noqa: BLE001 - e.g. a custom op onnxruntime does not know
                print(f"onnxruntime cannot load the model: {str(e).splitlines()[0]}", file=out)
                results["onnxruntime"] = None
                osess = None
            if osess is not None:
                results["onnxruntime_session_create_ms"] = (time.perf_counter() - t0) * 1e3
                ort_out = osess.run(None, feeds)
                diffs = {o.name: _max_diff(a, b) for o, a, b in zip(sess.get_outputs(), onnxpy_out, ort_out)}
                otimes = time_runs(lambda: osess.run(None, feeds), runs=None if args.duration else runs,
                                   duration=args.duration, warmup=args.warmup,
                                   progress=progress("onnxruntime"), label="onnxruntime")
                results["onnxruntime"] = percentiles(otimes)
                results["max_abs_diff"] = diffs
                rows.append(("onnxruntime", results["onnxruntime"]))

    head = "".join(f"{h:>10}" for h in ("mean", "p50", "p90", "p99", "min", "max"))
    print(f"{'latency ms':<12}{head}{'runs/s':>12}{'runs':>8}", file=out)
    for name, st in rows:
        print(_fmt_row(name, st), file=out)
    if results.get("onnxruntime"):
        o, r = results["onnxpy"], results["onnxruntime"]
        ratios = {k: (o[k] / r[k] if r[k] > 0 else math.inf) for k in ("mean_ms", "p50_ms", "p90_ms", "p99_ms")}
        results["ratio_onnxpy_over_onnxruntime"] = ratios
        print("onnxpy / onnxruntime: " + "  ".join(f"{k[:-3]} {v:.2f}x" for k, v in ratios.items()), file=out)
        worst = [(k, v) for k, v in results["max_abs_diff"].items() if v is not None]
        if worst:
            print("max |onnxpy - onnxruntime| per output: " + ", ".join(f"{k} {v:.3g}" for k, v in worst), file=out)
    if args.json_path:
        text = json.dumps(results, indent=2, default=float)
        if args.json_path == "-":
            print(text, file=out)
        else:
            with open(args.json_path, "w") as f:
                f.write(text + "\n")
    return results


def cli_main(argv=None) -> int:
    """Entry point of ``onnxpy bench``; returns the exit code (0 ok, 1 failure, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) if isinstance(e.code, int) else EXIT_USAGE
    return run_from_args(args)


def exit_code(fn, *args, plain=(OSError,)) -> int:
    """Run ``fn(*args)`` for a CLI command: a one-line error and an exit code instead of a traceback.

    UsageError -> 2; the ``plain`` exception types -> 1 with their message; anything else -> 1 with its type.
    """
    try:
        fn(*args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except plain as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL
    except Exception as e:  # noqa: BLE001 - reported, not a traceback
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def run_from_args(args) -> int:
    """Run parsed arguments (for a lead CLI that adds :func:`build_parser`'s options to its own subparser)."""
    return exit_code(run_bench, args)


# -- extra `onnxpy info` lines ----------------------------------------------------------------------------------

def info_lines(model_path: str, sess=None) -> list[str]:
    """Extra lines for ``onnxpy info``: dynamic dims (for --shape), ops without a kernel, custom-domain ops."""
    import onnx

    from .. import custom_ops
    from ..ops import load_all, registry

    load_all()
    model = onnx.load(model_path, load_external_data=False)
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    lines = []
    init = {t.name for t in model.graph.initializer}
    dyn = []
    for vi in model.graph.input:
        if vi.name in init or not vi.type.HasField("tensor_type"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim]
        if any(not isinstance(d, int) for d in dims):
            dyn.append(f"{vi.name}[{','.join(str(d) for d in dims)}]")
    if dyn:
        lines.append("dynamic inputs (bench/profile: --shape NAME=DIMS or --dim SYMBOL=N): " + " ".join(dyn))
    counts = collections.Counter()
    _count_nodes(model.graph, counts)
    missing, custom = [], []
    session_ops = dict(getattr(sess.get_session_options(), "_custom_ops", {}) if sess is not None else {})
    for (dom, op), _c in sorted(counts.items()):
        opset = opsets.get(dom, 1)
        if custom_ops.resolve(session_ops, dom, op, opset) is not None:
            custom.append(f"{dom or 'ai.onnx'}:{op}")
        elif registry.lookup(dom, op, opset) is None:
            missing.append(f"{dom or 'ai.onnx'}:{op}({opset})")
    if custom:
        lines.append("custom ops (Python): " + ", ".join(custom))
    if missing:
        lines.append("ops without a kernel (expanded from their ONNX function body when the spec defines one, "
                     "else unsupported): " + ", ".join(missing))
    return lines


def _count_nodes(g, counts):
    from onnx import AttributeProto

    for n in g.node:
        counts[("" if n.domain == "ai.onnx" else n.domain, n.op_type)] += 1
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                _count_nodes(a.g, counts)
            elif a.type == AttributeProto.GRAPHS:
                for sg in a.graphs:
                    _count_nodes(sg, counts)


if __name__ == "__main__":
    sys.exit(cli_main())
