"""The ``onnxpy`` command line.

    onnxpy run [MODEL] [--input name=file.npy ...] [--repeat N]    run a model (default: the embedded CNN)
    onnxpy info MODEL                                               inputs, outputs, opsets, op counts
    onnxpy optimize IN OUT [--level basic|extended|all]            save the optimized model
    onnxpy conformance [REGEX]                                      the ONNX backend suite, prints N/M passed
    onnxpy bench MODEL [-r N | -t SECONDS] [--compare-onnxruntime]  latency benchmark
    onnxpy profile MODEL [-o report.html]                           HTML profile report
    onnxpy quantize IN OUT --mode dynamic|static|nbits ...        quantization (onnxruntime.quantization's API)
    onnxpy convert-fp16 IN OUT [--keep-io-types]                   float16 conversion
    onnxpy serve MODEL... [--model-repository DIR] [--host H --port P]   KServe v2 / Triton HTTP server
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

import numpy as np

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def _random_input(arg, rng) -> object:
    from . import dtypes

    t = arg.type
    shape = [d if isinstance(d, int) and d >= 0 else 1 for d in arg.shape]
    if t.startswith("tensor("):
        name = t[len("tensor("):-1]
        if name == "string":
            return np.array(["onnxpy"] * int(np.prod(shape)), dtype=object).reshape(shape)
        for code in range(1, 29):
            try:
                if dtypes.type_name(code) == name:
                    dt = dtypes.to_numpy(code)
                    break
            except TypeError:
                continue
        else:
            raise SystemExit(f"cannot make a random input of type {t} for '{arg.name}'; pass --input")
        if dt.kind in "iu":
            return rng.integers(0, 10, size=shape).astype(dt)
        if dt.kind == "b":
            return rng.integers(0, 2, size=shape).astype(bool)
        return rng.standard_normal(shape).astype(dt)
    raise SystemExit(f"cannot make a random input of type {t} for '{arg.name}'; pass --input")


def _load_inputs(specs, sess) -> dict:
    feeds = {}
    for spec in specs or []:
        if "=" not in spec:
            if spec.endswith(".npz"):  # a whole feed dict: one array per input name
                with np.load(spec, allow_pickle=False) as z:
                    feeds.update({k: z[k] for k in z.files})
                continue
            raise SystemExit(f"--input expects NAME=FILE.npy|.json or FILE.npz, got '{spec}'")
        name, path = spec.split("=", 1)
        if path.endswith(".json"):
            with open(path) as f:
                feeds[name] = json.load(f)
        else:
            feeds[name] = np.load(path, allow_pickle=False)
    rng = np.random.default_rng(0)
    for arg in sess.get_inputs():
        if arg.name not in feeds:
            feeds[arg.name] = _random_input(arg, rng)
    return feeds


def cmd_run(args) -> int:
    from . import InferenceSession

    if args.model is None:
        from .models import default_input, default_model

        model = default_model().SerializeToString()
        print("model: embedded default CNN (image [N,3,32,32] -> probabilities [N,10])")
        t0 = time.perf_counter()
        sess = InferenceSession(model)
        feeds = default_input()
    else:
        t0 = time.perf_counter()
        sess = InferenceSession(args.model)
        feeds = _load_inputs(args.input, sess)
    print(f"session created in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    times = []
    outs = None
    for _ in range(max(1, args.repeat)):
        t = time.perf_counter()
        outs = sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    np.set_printoptions(precision=5, suppress=True, threshold=40)
    for o, v in zip(sess.get_outputs(), outs):
        if isinstance(v, np.ndarray):
            print(f"{o.name}: {v.dtype}{list(v.shape)}\n{v}")
        else:
            print(f"{o.name}: {v!r}")
        if args.output_dir:
            import os

            os.makedirs(args.output_dir, exist_ok=True)
            if isinstance(v, np.ndarray):
                np.save(os.path.join(args.output_dir, f"{o.name}.npy"), v)
    print(f"latency: median {np.median(times) * 1e3:.3f} ms over {len(times)} run(s)")
    return EXIT_OK


def cmd_info(args) -> int:
    import onnx

    from . import InferenceSession

    model = onnx.load(args.model, load_external_data=False)
    print(f"model: {args.model}  ir_version {model.ir_version}  producer {model.producer_name} "
          f"{model.producer_version}")
    print("opsets: " + ", ".join(f"{o.domain or 'ai.onnx'}={o.version}" for o in model.opset_import))
    counts = collections.Counter((n.domain or "ai.onnx", n.op_type) for n in model.graph.node)
    print("ops:")
    for (dom, op), c in sorted(counts.items()):
        print(f"  {dom}:{op} x{c}")
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    from . import dtypes
    from .ops import load_all, registry

    size = 0
    for t in model.graph.initializer:
        try:
            size += int(np.prod(t.dims)) * dtypes.to_numpy(t.data_type).itemsize
        except TypeError:
            pass
    print(f"parameters: {params} ({size / 2**20:.2f} MiB)")
    load_all()
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    missing = []
    for dom, op in sorted({(k[0] if k[0] != "ai.onnx" else "", k[1]) for k in counts}):
        version = opsets.get(dom, 1)
        if registry.lookup(dom, op, version) is None:
            try:
                schema = onnx.defs.get_schema(op, version, dom)
                if schema.has_function or schema.has_context_dependent_function:
                    continue  # expanded from the schema's function body
            except Exception:  # noqa: BLE001 - no schema: unsupported
                pass
            if (dom, op) not in {(f.domain, f.name) for f in model.functions}:
                missing.append(f"{dom or 'ai.onnx'}:{op}({version})")
    print("unsupported ops: " + (", ".join(missing) if missing else "none"))
    try:
        sess = InferenceSession(args.model)
    except Exception as e:  # noqa: BLE001 - reported to the user
        print(f"cannot create a session: {e}")
        return EXIT_FAIL
    for kind, items in (("input", sess.get_inputs()), ("output", sess.get_outputs())):
        for a in items:
            print(f"{kind}: {a.name} {a.type} {a.shape}")
    from .tools.bench import info_lines

    for line in info_lines(args.model, sess):
        print(line)
    return EXIT_OK


LEVELS = {"disable": 0, "basic": 1, "extended": 2, "layout": 3, "all": 99}


def cmd_optimize(args) -> int:
    from . import InferenceSession, SessionOptions

    so = SessionOptions()
    so.graph_optimization_level = LEVELS[args.level]
    so.optimized_model_filepath = args.output
    if args.external_data:
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", args.external_data)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                    str(args.external_min_bytes))
    kwargs = {"disabled_optimizers": args.disable.split(",")} if args.disable else {}
    t0 = time.perf_counter()
    sess = InferenceSession(args.input, so, **kwargs)
    applied = getattr(sess._model, "applied_passes", {}) or {}
    import onnx

    before = len(onnx.load(args.input, load_external_data=False).graph.node)
    after = len(onnx.load(args.output, load_external_data=False).graph.node)
    print(f"optimized at level '{args.level}' in {(time.perf_counter() - t0) * 1e3:.0f} ms: {before} -> {after} nodes")
    for name, n in sorted(applied.items()):
        print(f"  {name}: {n}")
    print(f"wrote {args.output}")
    return EXIT_OK


def cmd_conformance(args) -> int:
    from .testing.conformance import main as conf_main

    return conf_main([args.pattern] + (["-v"] if args.verbose else []))


def cmd_serve(args) -> int:
    from .serve import cli_main

    return cli_main(args.serve_args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="onnxpy", description="onnxpy: an ONNX runtime in Python")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a model (the embedded default CNN when MODEL is omitted)")
    r.add_argument("model", nargs="?", help="path to an .onnx model")
    r.add_argument("--input", action="append", metavar="NAME=FILE|FILE.npz",
                   help="input from a .npy or .json file, or all inputs from an .npz; missing inputs are random")
    r.add_argument("--repeat", type=int, default=10, help="runs to time (default 10)")
    r.add_argument("--output-dir", help="save each tensor output as NAME.npy here")
    r.set_defaults(fn=cmd_run)
    i = sub.add_parser("info", help="inputs, outputs, opsets and op counts of a model")
    i.add_argument("model")
    i.set_defaults(fn=cmd_info)
    o = sub.add_parser("optimize", help="optimize a model at an onnxruntime optimization level and save it")
    o.add_argument("input")
    o.add_argument("output")
    o.add_argument("--level", choices=list(LEVELS), default="extended",
                   help="basic/extended models also load in onnxruntime (default: extended)")
    o.add_argument("--disable", default="", help="comma-separated pass names to switch off (disabled_optimizers)")
    o.add_argument("--external-data", metavar="FILE", help="write large initializers to this external data file")
    o.add_argument("--external-min-bytes", type=int, default=1024, help="size from which a tensor goes external")
    o.set_defaults(fn=cmd_optimize)
    c = sub.add_parser("conformance", help="run the ONNX backend test suite; prints N/M passed")
    c.add_argument("pattern", nargs="?", default="")
    c.add_argument("-v", "--verbose", action="store_true")
    c.set_defaults(fn=cmd_conformance)
    from .tools import bench as _bench
    from .tools import profile_report as _prof

    b = sub.add_parser("bench", help="latency benchmark (like onnxruntime_perf_test)")
    _bench.build_parser(b)
    b.set_defaults(fn=_bench.run_from_args)
    pr = sub.add_parser("profile", help="profile a model and write a self-contained HTML report")
    _prof.build_parser(pr)
    pr.set_defaults(fn=_prof.run_from_args)
    for name, (_, help_text) in PASSTHROUGH.items():
        sub.add_parser(name, help=f"{help_text}; 'onnxpy {name} --help' for options", add_help=False)
    s = sub.add_parser("serve", add_help=False, prefix_chars="\0",
                       help="serve models over HTTP, KServe v2 / Triton protocol (needs onnxpy[serve]); "
                            "'onnxpy serve --help' for options")
    s.add_argument("serve_args", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_serve)
    return p


PASSTHROUGH = {  # subcommands whose own parsers take every argument
    "quantize": ("onnxpy.quantization", "quantize a model (dynamic, static QDQ/QOperator, 4-bit MatMulNBits)"),
    "convert-fp16": ("onnxpy.tools.float16", "convert a model to float16"),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        import importlib

        return importlib.import_module(PASSTHROUGH[argv[0]][0]).cli_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
