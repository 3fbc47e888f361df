"""``onnxpy profile MODEL [-o report.html]``: run a model with profiling and render a self-contained HTML report.

The session runs with ``SessionOptions.enable_profiling`` (onnxpy writes onnxruntime's Chrome-trace JSON, see
:mod:`onnxpy.profiling`); the report shows time per op type and per node as inline SVG bar charts, the per-run
latencies, and the slowest nodes with their input/output shapes.  No JavaScript, no external resources.
``--from-trace FILE.json`` renders a report from an existing trace (onnxpy's or onnxruntime's).  ``--png`` also
writes PNG charts when matplotlib is installed (skipped with a note otherwise).

Importable: :func:`load_trace`, :func:`summarize`, :func:`render_html`, :func:`svg_bar_chart`, :func:`profile_model`.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import os
import sys
import tempfile

import numpy as np

from .bench import EXIT_USAGE, OPT_LEVELS, ProgressBar, UsageError, exit_code, make_inputs

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac")


# -- trace -> summary -----------------------------------------------------------------------------------------

def load_trace(path: str) -> list[dict]:
    """Events of a Chrome-trace profile (a JSON array, or an object with ``traceEvents``)."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: not a Chrome trace (expected a JSON array of events)")
    return [e for e in data if isinstance(e, dict)]


def _fmt_shapes(items) -> str:
    parts = []
    for it in items or []:
        if isinstance(it, dict):
            for t, s in it.items():
                parts.append(f"{t}{list(s) if isinstance(s, (list, tuple)) else s}")
    return ", ".join(parts)


def summarize(events: list[dict], skip_runs: int = 0) -> dict:
    """Aggregate node events per op type and per node (durations in microseconds).

    ``skip_runs`` drops the node events of the first runs (warm-up), using the ``model_run`` session events.
    """
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e.get("ts", 0))
    cutoff = None
    if skip_runs and len(runs) > skip_runs:
        last = runs[skip_runs - 1]
        cutoff = last.get("ts", 0) + last.get("dur", 0)
        runs = runs[skip_runs:]
    nodes: dict[str, dict] = {}
    ops: dict[str, dict] = {}
    total = 0
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        if cutoff is not None and e.get("ts", 0) < cutoff:
            continue
        args = e.get("args") or {}
        name = str(e["name"])[: -len("_kernel_time")]
        op = str(args.get("op_name", "?"))
        dur = int(e.get("dur", 0))
        total += dur
        n = nodes.get(name)
        if n is None:
            n = nodes[name] = {"name": name, "op_type": op, "calls": 0, "total_us": 0, "min_us": dur, "max_us": dur,
                               "inputs": _fmt_shapes(args.get("input_type_shape")),
                               "outputs": _fmt_shapes(args.get("output_type_shape")),
                               "provider": args.get("provider", "")}
        n["calls"] += 1
        n["total_us"] += dur
        n["min_us"] = min(n["min_us"], dur)
        n["max_us"] = max(n["max_us"], dur)
        o = ops.setdefault(op, {"op_type": op, "calls": 0, "total_us": 0, "nodes": set()})
        o["calls"] += 1
        o["total_us"] += dur
        o["nodes"].add(name)
    for n in nodes.values():
        n["mean_us"] = n["total_us"] / max(1, n["calls"])
        n["percent"] = 100.0 * n["total_us"] / total if total else 0.0
    for o in ops.values():
        o["nodes"] = len(o["nodes"])
        o["mean_us"] = o["total_us"] / max(1, o["calls"])
        o["percent"] = 100.0 * o["total_us"] / total if total else 0.0
    run_us = [int(r.get("dur", 0)) for r in runs]
    init = [e for e in events if e.get("cat") == "Session" and e.get("name") == "session_initialization"]
    return {
        "op_types": sorted(ops.values(), key=lambda o: -o["total_us"]),
        "nodes": sorted(nodes.values(), key=lambda n: -n["total_us"]),
        "total_node_us": total,
        "run_us": run_us,
        "runs": len(run_us),
        "mean_run_us": float(np.mean(run_us)) if run_us else 0.0,
        "session_init_us": int(init[0].get("dur", 0)) if init else None,
    }


# -- SVG / HTML -----------------------------------------------------------------------------------------------

def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "\u2026"


def svg_bar_chart(items, unit: str = "ms", width: int = 860, bar_height: int = 18, label_width: int = 260,
                  title: str = "") -> str:
    """Horizontal bar chart as an inline ``<svg>``; ``items`` are (label, value, color or None, tooltip)."""
    items = list(items)
    if not items:
        return '<p class="muted">no data</p>'
    gap = 4
    top = 22 if title else 4
    height = top + len(items) * (bar_height + gap) + 4
    vmax = max(float(v) for _, v, _, _ in items) or 1.0
    plot_w = width - label_width - 90
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif" font-size="12">']
    if title:
        out.append(f'<text x="0" y="14" font-weight="bold">{html.escape(title)}</text>')
    for i, (label, value, color, tip) in enumerate(items):
        y = top + i * (bar_height + gap)
        w = max(1.0, plot_w * float(value) / vmax)
        c = color or PALETTE[i % len(PALETTE)]
        lab = html.escape(_short(str(label), 38))
        tip_s = html.escape(str(tip or label))
        out.append(f'<g><title>{tip_s}</title>'
                   f'<text x="{label_width - 6}" y="{y + bar_height - 5}" text-anchor="end">{lab}</text>'
                   f'<rect x="{label_width}" y="{y}" width="{w:.1f}" height="{bar_height}" fill="{c}" rx="2"/>'
                   f'<text x="{label_width + w + 4:.1f}" y="{y + bar_height - 5}">{float(value):.3f} {unit}</text>'
                   '</g>')
    out.append("</svg>")
    return "".join(out)


def svg_line_chart(values, unit: str = "ms", width: int = 860, height: int = 140, title: str = "") -> str:
    """Per-run latency as a polyline with min/max labels (inline SVG)."""
    vals = [float(v) for v in values]
    if not vals:
        return '<p class="muted">no runs</p>'
    pad_l, pad_r, pad_t, pad_b = 60, 10, 22 if title else 8, 20
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or (hi or 1.0)
    pw, ph = width - pad_l - pad_r, height - pad_t - pad_b
    n = len(vals)
    pts = " ".join(f"{pad_l + (pw * i / max(1, n - 1)):.1f},{pad_t + ph - ph * (v - lo) / span:.1f}"
                   for i, v in enumerate(vals))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">']
    if title:
        out.append(f'<text x="0" y="14" font-weight="bold" font-size="12">{html.escape(title)}</text>')
    out.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + ph}" stroke="#999"/>'
               f'<line x1="{pad_l}" y1="{pad_t + ph}" x2="{pad_l + pw}" y2="{pad_t + ph}" stroke="#999"/>'
               f'<text x="{pad_l - 4}" y="{pad_t + 10}" text-anchor="end">{hi:.3f} {unit}</text>'
               f'<text x="{pad_l - 4}" y="{pad_t + ph}" text-anchor="end">{lo:.3f} {unit}</text>'
               f'<text x="{pad_l + pw}" y="{height - 4}" text-anchor="end">run {n}</text>'
               f'<text x="{pad_l}" y="{height - 4}">run 1</text>')
    if n == 1:
        out.append(f'<circle cx="{pad_l}" cy="{pad_t + ph / 2:.1f}" r="3" fill="{PALETTE[0]}"/>')
    else:
        out.append(f'<polyline fill="none" stroke="{PALETTE[0]}" stroke-width="1.5" points="{pts}"/>')
    out.append("</svg>")
    return "".join(out)


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 12px; margin-top: 8px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
td.shape { text-align: left; font-family: monospace; max-width: 520px; overflow-wrap: anywhere; }
.muted { color: #888; } .kv td { text-align: left; }
"""


def render_html(summary: dict, title: str = "onnxpy profile", top: int = 20, meta: dict | None = None) -> str:
    """A self-contained HTML report (inline CSS and SVG only) from :func:`summarize`'s result."""
    esc = html.escape
    ops, nodes = summary["op_types"], summary["nodes"]
    total_ms = summary["total_node_us"] / 1e3
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(title)}</title><style>{_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>"]
    rows = dict(meta or {})
    rows["runs profiled"] = summary["runs"]
    if summary["run_us"]:
        run_ms = np.asarray(summary["run_us"], dtype=np.float64) / 1e3
        rows["run latency (ms)"] = (f"mean {run_ms.mean():.3f}, p50 {np.percentile(run_ms, 50):.3f}, "
                                    f"p90 {np.percentile(run_ms, 90):.3f}, min {run_ms.min():.3f}, "
                                    f"max {run_ms.max():.3f}")
    rows["time in kernels (ms, all runs)"] = f"{total_ms:.3f}"
    if summary["run_us"] and summary["total_node_us"]:
        frac = summary["total_node_us"] / max(1, sum(summary["run_us"]))
        rows["kernel share of run time"] = f"{100 * min(frac, 1.0):.1f}%"
    if summary.get("session_init_us") is not None:
        rows["session initialization (ms)"] = f"{summary['session_init_us'] / 1e3:.3f}"
    rows["nodes / op types"] = f"{len(nodes)} / {len(ops)}"
    parts.append('<table class="kv">' + "".join(f"<tr><th class='l'>{esc(str(k))}</th><td>{esc(str(v))}</td></tr>"
                                                for k, v in rows.items()) + "</table>")

    color = {o["op_type"]: PALETTE[i % len(PALETTE)] for i, o in enumerate(ops)}
    per_run = max(1, summary["runs"])
    parts.append("<h2>Time per op type</h2>")
    parts.append(svg_bar_chart(
        [(o["op_type"], o["total_us"] / 1e3 / per_run, color[o["op_type"]],
          f"{o['op_type']}: {o['percent']:.1f}% of kernel time, {o['nodes']} node(s), {o['calls']} call(s)")
         for o in ops[:top]], unit="ms/run"))
    parts.append("<table><tr><th class='l'>op type</th><th>nodes</th><th>calls</th><th>total ms</th>"
                 "<th>ms / run</th><th>mean us / call</th><th>%</th></tr>")
    for o in ops:
        parts.append(f"<tr><td class='l'>{esc(o['op_type'])}</td><td>{o['nodes']}</td><td>{o['calls']}</td>"
                     f"<td>{o['total_us'] / 1e3:.3f}</td><td>{o['total_us'] / 1e3 / per_run:.3f}</td>"
                     f"<td>{o['mean_us']:.1f}</td><td>{o['percent']:.1f}</td></tr>")
    parts.append("</table>")

    parts.append(f"<h2>Slowest nodes (top {min(top, len(nodes))} of {len(nodes)})</h2>")
    parts.append(svg_bar_chart(
        [(n["name"], n["total_us"] / 1e3 / per_run, color.get(n["op_type"]),
          f"{n['name']} ({n['op_type']}): {n['percent']:.1f}%\ninputs: {n['inputs']}\noutputs: {n['outputs']}")
         for n in nodes[:top]], unit="ms/run"))
    parts.append("<table><tr><th class='l'>node</th><th class='l'>op type</th><th>calls</th><th>mean us</th>"
                 "<th>min us</th><th>max us</th><th>%</th><th class='l'>input shapes</th>"
                 "<th class='l'>output shapes</th></tr>")
    for n in nodes[:max(top, 50)]:
        parts.append(f"<tr><td class='l'>{esc(n['name'])}</td><td class='l'>{esc(n['op_type'])}</td>"
                     f"<td>{n['calls']}</td><td>{n['mean_us']:.1f}</td><td>{n['min_us']}</td><td>{n['max_us']}</td>"
                     f"<td>{n['percent']:.1f}</td><td class='shape'>{esc(n['inputs'])}</td>"
                     f"<td class='shape'>{esc(n['outputs'])}</td></tr>")
    parts.append("</table>")
    if summary["run_us"]:
        parts.append("<h2>Latency per run</h2>")
        parts.append(svg_line_chart([u / 1e3 for u in summary["run_us"]]))
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    parts.append(f"<p class='muted'>generated by onnxpy profile, {esc(stamp)}</p></body></html>")
    return "\n".join(parts)


def write_pngs(summary: dict, base: str, top: int = 20) -> list[str]:
    """PNG bar charts with matplotlib; [] when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    per_run = max(1, summary["runs"])
    for key, label_key, fname in (("op_types", "op_type", "optypes"), ("nodes", "name", "nodes")):
        items = summary[key][:top][::-1]
        if not items:
            continue
        fig, ax = plt.subplots(figsize=(9, 0.3 * len(items) + 1))
        ax.barh([str(i[label_key])[:40] for i in items], [i["total_us"] / 1e3 / per_run for i in items])
        ax.set_xlabel("ms per run")
        fig.tight_layout()
        path = f"{base}_{fname}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


# -- running a model ------------------------------------------------------------------------------------------

def profile_model(model_path: str, runs: int = 10, warmup: int = 1, shapes=None, dims=None, files=None,
                  opt_level: int = 99, threads: int = 0, trace_dir: str | None = None, seed: int = 0,
                  progress: bool | None = False) -> str:
    """Run ``model_path`` with profiling (``warmup`` + ``runs`` runs); returns the trace JSON path."""
    import onnxpy

    so = onnxpy.SessionOptions()
    so.enable_profiling = True
    so.graph_optimization_level = opt_level
    if threads:
        so.intra_op_num_threads = int(threads)
    trace_dir = trace_dir or tempfile.mkdtemp(prefix="onnxpy_profile_")
    so.profile_file_prefix = os.path.join(trace_dir, "onnxpy_profile_")
    sess = onnxpy.InferenceSession(model_path, so)
    try:
        feeds = make_inputs(sess, shapes, dims, files, seed=seed)
        bar = ProgressBar(warmup + runs, "profile", enabled=progress if progress is not None else None)
        for i in range(warmup + runs):
            sess.run(None, feeds)
            bar.update(i + 1, f"{i + 1}/{warmup + runs}")
        bar.close()
    finally:
        path = sess.end_profiling()
    return path


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser if parser is not None else argparse.ArgumentParser(
        prog="onnxpy profile", description="Profile a model and write a self-contained HTML report.")
    p.add_argument("model", nargs="?", help="path to an .onnx model (omit with --from-trace)")
    p.add_argument("-o", "--output", default=None, help="HTML report path (default: <model>.profile.html)")
    p.add_argument("-r", "--runs", type=int, default=10, help="profiled runs (default 10)")
    p.add_argument("-w", "--warmup", type=int, default=1, help="warm-up runs left out of the report (default 1)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads")
    p.add_argument("--opt-level", default="all", choices=sorted(OPT_LEVELS, key=lambda k: (k.isdigit(), k)))
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS")
    p.add_argument("--dim", action="append", default=[], metavar="SYMBOL=VALUE")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top", type=int, default=20, help="bars in each chart (default 20)")
    p.add_argument("--from-trace", metavar="TRACE.json", help="render an existing profile instead of running")
    p.add_argument("--png", action="store_true", help="also write PNG charts (needs matplotlib)")
    p.add_argument("--progress", dest="progress", action="store_true", default=None)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def _profile(args, out) -> None:
    from .bench import _parse_common

    if args.runs < 1 or args.warmup < 0 or args.top < 1:
        raise UsageError("--runs and --top must be >= 1, --warmup >= 0")
    if args.from_trace:
        trace = args.from_trace
        skip = 0
        title = f"onnxpy profile: {os.path.basename(trace)}"
        default_out = os.path.splitext(trace)[0] + ".html"
    else:
        if not args.model:
            raise UsageError("give a MODEL, or --from-trace TRACE.json")
        if not os.path.exists(args.model):
            raise FileNotFoundError(f"model file not found: {args.model}")
        shapes, dims, files = _parse_common(args)
        default_out = os.path.splitext(args.model)[0] + ".profile.html"
        report = args.output or default_out
        trace_dir = os.path.dirname(os.path.abspath(report))
        trace = profile_model(args.model, runs=args.runs, warmup=args.warmup, shapes=shapes, dims=dims,
                              files=files, opt_level=OPT_LEVELS[str(args.opt_level)], threads=args.threads,
                              trace_dir=trace_dir, seed=args.seed, progress=args.progress)
        skip = args.warmup
        title = f"onnxpy profile: {os.path.basename(args.model)}"
    summary = summarize(load_trace(trace), skip_runs=skip)
    report = args.output or default_out
    meta = {"model": args.model or "", "trace": trace, "opt level": args.opt_level}
    with open(report, "w", encoding="utf-8") as f:
        f.write(render_html(summary, title=title, top=args.top, meta=meta))
    print(f"trace: {trace}", file=out)
    print(f"report: {report}", file=out)
    per_run = max(1, summary["runs"])
    print(f"{'op type':<24}{'ms/run':>10}{'%':>8}{'nodes':>7}", file=out)
    for o in summary["op_types"][:10]:
        print(f"{o['op_type']:<24}{o['total_us'] / 1e3 / per_run:>10.3f}{o['percent']:>8.1f}{o['nodes']:>7}",
              file=out)
    if args.png:
        pngs = write_pngs(summary, os.path.splitext(report)[0], top=args.top)
        print("png: " + (", ".join(pngs) if pngs else "skipped (matplotlib is not installed)"), file=out)


def run_from_args(args, out=None) -> int:
    return exit_code(_profile, args, out if out is not None else sys.stdout, plain=(OSError, ValueError))


def cli_main(argv=None) -> int:
    """Entry point of ``onnxpy profile``; returns the exit code (0 ok, 1 failure, 2 usage)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) if isinstance(e.code, int) else EXIT_USAGE
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(cli_main())
