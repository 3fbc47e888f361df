"""Fuzz harness: mutated model bytes and random single-op graphs drawn from ``onnx.defs`` schemas.

    python -m onnxpy.testing.fuzz --seconds 600 [--seed N] [--mode load|op|both] [-v]

Accepted outcomes of every case: a result, an onnxruntime-style exception (``onnxpy.capi`` classes), or the
``ValueError``/``TypeError`` that feed validation raises.  Anything else is a *finding*: a raw exception leaking
from a kernel or the loader, a case that does not finish (hang; stopped with ``RunOptions.terminate`` when
possible), or a process crash (which ends the run; the last case is printed before each execution with ``-v``).
Every session runs with a 64 MiB tensor-size limit so random attributes cannot exhaust memory.
Exit status: 0 without findings, 1 with findings.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

CASE_TIMEOUT_S = 20.0
FUZZ_MAX_TENSOR_BYTES = 64 * 2**20
SKIP_OPS = {
    # ops whose random instances legitimately take unbounded time or need external resources
    "ImageDecoder",
}

_TYPE_NAMES = {
    "float": TensorProto.FLOAT, "double": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16, "int8": TensorProto.INT8, "int16": TensorProto.INT16,
    "int32": TensorProto.INT32, "int64": TensorProto.INT64, "uint8": TensorProto.UINT8,
    "uint16": TensorProto.UINT16, "uint32": TensorProto.UINT32, "uint64": TensorProto.UINT64,
    "bool": TensorProto.BOOL, "string": TensorProto.STRING,
}


@dataclass
class Finding:
    kind: str  # "exception" | "hang"
    what: str  # op or seed model
    detail: str
    case: str = ""


@dataclass
class Stats:
    executions: int = 0
    ok: int = 0
    ort_errors: int = 0
    feed_errors: int = 0
    findings: list = field(default_factory=list)
    by_error: dict = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.executions} executions: {self.ok} ran, {self.ort_errors} onnxruntime-style errors, "
                f"{self.feed_errors} feed errors, {len(self.findings)} findings")


# ----------------------------------------------------------------------------------------------------------
# running one case


def _ort_error_types():
    from ..capi.onnxruntime_pybind11_state import _OrtError

    return _OrtError


def _random_feed(sess, rng: random.Random):
    """Random inputs of the declared element types; free dims get small random sizes."""
    feed = {}
    for arg in sess.get_inputs():
        t = arg.type
        if not (t.startswith("tensor(") and t.endswith(")")):
            return None
        name = t[7:-1]
        shape = [d if isinstance(d, int) and 0 <= d <= 8 else rng.randint(0, 3) for d in (arg.shape or [])]
        feed[arg.name] = _random_array(name, shape, rng)
    return feed


def _random_array(type_name: str, shape, rng: random.Random) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    g = np.random.default_rng(rng.getrandbits(32))
    if type_name == "string":
        return np.array([rng.choice(["", "a", "xyz", "ab c"]) for _ in range(n)], dtype=object).reshape(shape)
    if type_name == "bool":
        return g.integers(0, 2, n).astype(bool).reshape(shape)
    et = _TYPE_NAMES.get(type_name)
    if et is None:
        from .. import dtypes

        try:
            et = getattr(TensorProto, type_name.upper())
            dt = dtypes.to_numpy(et)
        except Exception:  # noqa: BLE001 - unknown type: let the session reject a float feed
            dt = np.dtype(np.float32)
        return g.integers(-3, 4, n).astype(np.float32).astype(dt).reshape(shape)
    dt = helper.tensor_dtype_to_np_dtype(et)
    if dt.kind in "iu":
        lo = 0 if dt.kind == "u" else -3
        return g.integers(lo, 5, n).astype(dt).reshape(shape)
    special = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e30, -1e-30]
    vals = g.normal(0, 2, n)
    if n and rng.random() < 0.2:
        vals[g.integers(0, n)] = rng.choice(special)
    return vals.astype(dt).reshape(shape)


def run_case(source, rng: random.Random, stats: Stats, what: str, case_desc: str = "") -> None:
    """Create a session from ``source`` and run it on random feeds; classify the outcome into ``stats``."""
    import onnxpy as ort

    OrtError = _ort_error_types()
    ro = ort.RunOptions()
    box: dict = {}

    def work():
        try:
            so = ort.SessionOptions()
            so.add_session_config_entry("session.max_tensor_bytes", str(FUZZ_MAX_TENSOR_BYTES))
            sess = ort.InferenceSession(source, so)
            feed = _random_feed(sess, rng)
            if feed is None:
                box["r"] = "skip"
                return
            try:
                sess.run(None, feed, ro)
            except (ValueError, TypeError) as e:
                if isinstance(e, OrtError):
                    raise
                box["feed"] = e
                return
            box["r"] = "ok"
        except OrtError as e:
            box["ort"] = e
        except BaseException as e:  # noqa: BLE001 - anything else is a finding
            box["bad"] = e
            box["tb"] = traceback.format_exc()

    stats.executions += 1
    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(CASE_TIMEOUT_S)
    if t.is_alive():
        ro.terminate = True
        t.join(5.0)
        stats.findings.append(Finding("hang", what, f"did not finish in {CASE_TIMEOUT_S} s "
                                      f"(terminate {'worked' if not t.is_alive() else 'did not stop it'})",
                                      case_desc))
        if t.is_alive():
            raise RuntimeError("a fuzz case hangs and cannot be stopped; aborting the fuzz run")
        return
    if "bad" in box:
        e = box["bad"]
        tb = box["tb"].strip().splitlines()
        loc = next((ln.strip() for ln in reversed(tb) if ln.strip().startswith("File ")), "")
        stats.findings.append(Finding("exception", what, f"{type(e).__name__}: {str(e)[:300]} @ {loc}", case_desc))
    elif "ort" in box:
        stats.ort_errors += 1
        key = (what, type(box["ort"]).__name__)
        stats.by_error[key] = stats.by_error.get(key, 0) + 1
    elif "feed" in box:
        stats.feed_errors += 1
    else:
        stats.ok += 1


# ----------------------------------------------------------------------------------------------------------
# single-op graphs from schemas


def _schemas():
    out = []
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain not in ("", "ai.onnx", "ai.onnx.ml") or s.deprecated or s.name in SKIP_OPS:
            continue
        out.append(s)
    out.sort(key=lambda s: (s.domain, s.name, s.since_version))
    return out


_INT_ATTRS_SMALL = [-2, -1, 0, 1, 2, 3]


def _random_attr(name, a, rng: random.Random, rank: int):
    t = a.type
    if t == AttributeProto.INT:
        return helper.make_attribute(name, rng.choice(_INT_ATTRS_SMALL + [rank, 10, -(2**31)]))
    if t == AttributeProto.FLOAT:
        return helper.make_attribute(name, rng.choice([0.0, 0.5, 1.0, -1.0, 1e-5, 3.0, float("nan")]))
    if t == AttributeProto.INTS:
        n = rng.randint(0, max(rank, 1) * 2)
        return helper.make_attribute(name, [rng.choice(_INT_ATTRS_SMALL) for _ in range(n)], attr_type=t)
    if t == AttributeProto.FLOATS:
        return helper.make_attribute(name, [rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(rng.randint(0, 4))],
                                      attr_type=t)
    if t == AttributeProto.STRING:
        choices = ["", "NOTSET", "SAME_UPPER", "VALID", "linear", "nearest", "constant", "reflect", "edge",
                   "half_pixel", "asymmetric", "DCR", "CRD", "mean", "sum", "max", "none", "tanh", "Relu",
                   "Sigmoid", "forward", "reverse", "bidirectional", "round_prefer_floor", "floor", "ceil"]
        return helper.make_attribute(name, rng.choice(choices))
    if t == AttributeProto.STRINGS:
        return helper.make_attribute(name, [rng.choice(["a", "b", "Relu", "Tanh"]) for _ in range(rng.randint(0, 3))],
                                      attr_type=t)
    if t == AttributeProto.TENSOR:
        arr = np.asarray(rng.choice([0.0, 1.0, 2.5]), dtype=rng.choice([np.float32, np.int64]))
        if rng.random() < 0.5:
            arr = arr.reshape(1)
        return helper.make_attribute(name, onnx.numpy_helper.from_array(arr))
    if t == AttributeProto.GRAPH:
        g = helper.make_graph([], "empty_body", [], [])
        return helper.make_attribute(name, g)
    return None


def _pick_type(constraint_types, rng: random.Random):
    tensors = [s for s in constraint_types if s.startswith("tensor(") and s[7:-1] in _TYPE_NAMES]
    if not tensors:
        return None
    prefer = [s for s in tensors if s in ("tensor(float)", "tensor(int64)", "tensor(double)", "tensor(int32)")]
    return rng.choice(prefer if prefer and rng.random() < 0.7 else tensors)


def random_op_model(schema, rng: random.Random):
    """A random model with one node of ``schema``; None when its types can't be drawn."""
    rank = rng.randint(0, 4)
    base_shape = [rng.randint(0, 4) if rng.random() < 0.15 else rng.randint(1, 4) for _ in range(rank)]
    tc = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    chosen = {}
    inputs, in_names, vis = [], [], []
    n_formal = len(schema.inputs)
    n_in = rng.randint(schema.min_input, min(schema.max_input, n_formal + 2))
    for i in range(n_in):
        formal = schema.inputs[min(i, n_formal - 1)] if n_formal else None
        if formal is None:
            break
        if formal.option == onnx.defs.OpSchema.FormalParameterOption.Optional and rng.random() < 0.3:
            in_names.append("")
            continue
        ts = formal.type_str
        if ts in tc:
            if ts not in chosen:
                chosen[ts] = _pick_type(tc[ts], rng)
            typ = chosen[ts]
        else:
            typ = ts if ts.startswith("tensor(") else None
        if typ is None or typ[7:-1] not in _TYPE_NAMES:
            return None
        shape = list(base_shape) if rng.random() < 0.7 else [rng.randint(1, 3) for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.2 and shape:  # broadcasting partner
            shape = shape[rng.randint(0, len(shape)):]
        name = f"in{i}"
        vis.append(helper.make_tensor_value_info(name, _TYPE_NAMES[typ[7:-1]], shape))
        in_names.append(name)
        inputs.append(name)
    while in_names and in_names[-1] == "":
        in_names.pop()
    if len([x for x in in_names if x]) < 1 and schema.min_input > 0:
        return None
    n_out = max(1, min(schema.max_output, len(schema.outputs) or 1, rng.randint(1, max(schema.min_output, 1) + 1)))
    out_names = [f"out{i}" for i in range(n_out)]
    attrs = []
    for aname, a in schema.attributes.items():
        if a.required or rng.random() < 0.35:
            at = _random_attr(aname, a, rng, rank)
            if at is not None:
                attrs.append(at)
    node = helper.make_node(schema.name, in_names, out_names, name=f"fuzz_{schema.name}", domain=schema.domain)
    node.attribute.extend(attrs)
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in out_names]
    g = helper.make_graph([node], "fuzz", vis, outs)
    opsets = [helper.make_opsetid("", max(schema.since_version, 7) if schema.domain in ("", "ai.onnx") else 17)]
    if schema.domain == "ai.onnx.ml":
        opsets.append(helper.make_opsetid("ai.onnx.ml", schema.since_version))
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 8
    return m


# ----------------------------------------------------------------------------------------------------------
# mutated model bytes


def seed_models():
    """Small valid models covering common structures (initializers, subgraphs, functions, attributes)."""
    V = helper.make_tensor_value_info
    F = TensorProto.FLOAT
    models = []

    def mk(nodes, ins, outs, inits=(), opset=17, functions=()):
        m = helper.make_model(helper.make_graph(nodes, "seed", ins, outs, initializer=list(inits)),
                              opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("local", 1)],
                              functions=list(functions))
        m.ir_version = 8
        return m

    w = onnx.numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "W")
    b = onnx.numpy_helper.from_array(np.ones(4, np.float32), "B")
    models.append(mk([helper.make_node("Gemm", ["X", "W", "B"], ["G"], name="gemm"),
                      helper.make_node("Relu", ["G"], ["Y"], name="relu")],
                     [V("X", F, ["N", 3])], [V("Y", F, ["N", 4])], [w, b]))
    k = onnx.numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "K")
    models.append(mk([helper.make_node("Conv", ["X", "K"], ["C"], pads=[1, 1, 1, 1], name="conv"),
                      helper.make_node("MaxPool", ["C"], ["Y"], kernel_shape=[2, 2], name="pool")],
                     [V("X", F, [1, 1, 4, 4])], [V("Y", F, None)], [k]))
    shp = onnx.numpy_helper.from_array(np.array([2, -1], np.int64), "S")
    models.append(mk([helper.make_node("Reshape", ["X", "S"], ["R"], name="reshape"),
                      helper.make_node("Transpose", ["R"], ["T"], perm=[1, 0], name="tr"),
                      helper.make_node("Softmax", ["T"], ["Y"], axis=-1, name="sm")],
                     [V("X", F, [2, 3])], [V("Y", F, None)], [shp]))
    then_g = helper.make_graph([helper.make_node("Neg", ["X"], ["t"])], "then", [], [V("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Abs", ["X"], ["e"])], "else", [], [V("e", F, None)])
    models.append(mk([helper.make_node("If", ["c"], ["Y"], then_branch=then_g, else_branch=else_g, name="if")],
                     [V("c", TensorProto.BOOL, []), V("X", F, [3])], [V("Y", F, None)]))
    body = helper.make_graph([helper.make_node("Add", ["x_in", "x_in"], ["x_out"]),
                              helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
                             [V("i", TensorProto.INT64, []), V("cond", TensorProto.BOOL, []), V("x_in", F, None)],
                             [V("cond_out", TensorProto.BOOL, []), V("x_out", F, None)])
    models.append(mk([helper.make_node("Loop", ["M", "", "X"], ["Y"], body=body, name="loop")],
                     [V("M", TensorProto.INT64, []), V("X", F, [2])], [V("Y", F, None)]))
    fn = helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    models.append(mk([helper.make_node("Twice", ["X"], ["Y"], domain="local", name="twice")],
                     [V("X", F, [2])], [V("Y", F, None)], functions=[fn]))
    models.append(mk([helper.make_node("Shape", ["X"], ["s"], name="shape"),
                      helper.make_node("ConstantOfShape", ["s"], ["z"], name="cos"),
                      helper.make_node("Concat", ["X", "z"], ["c"], axis=0, name="concat"),
                      helper.make_node("ReduceSum", ["c"], ["Y"], keepdims=0, name="rs")],
                     [V("X", F, [2, 3])], [V("Y", F, None)]))
    idx = onnx.numpy_helper.from_array(np.array([0, 2], np.int64), "I")
    models.append(mk([helper.make_node("Gather", ["X", "I"], ["g"], axis=1, name="gather"),
                      helper.make_node("Cast", ["g"], ["Y"], to=TensorProto.INT32, name="cast")],
                     [V("X", F, [2, 3])], [V("Y", TensorProto.INT32, None)], [idx]))
    return [m.SerializeToString() for m in models]


def mutate(data: bytes, rng: random.Random, pool=()) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.random()
        if not b:
            b.extend(rng.randbytes(rng.randint(1, 16)))
            continue
        i = rng.randrange(len(b))
        if op < 0.3:
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.5:
            b[i] = rng.choice([0x00, 0xFF, 0x7F, 0x80, 0x01, rng.randrange(256)])
        elif op < 0.6:
            del b[i: i + rng.randint(1, 8)]
        elif op < 0.7:
            b[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op < 0.8:
            del b[rng.randrange(len(b)):]
        elif op < 0.9 and pool:
            other = rng.choice(pool)
            j = rng.randrange(len(other))
            b[i:] = other[j:]
        else:  # varint of a huge value (lengths, dims)
            b[i:i + 1] = bytes([0xFF] * rng.randint(1, 9) + [0x01])
    return bytes(b)


# ----------------------------------------------------------------------------------------------------------
# driver


def fuzz(seconds: float, seed: int = 0, mode: str = "both", verbose: bool = False,
         max_executions: int | None = None) -> Stats:
    rng = random.Random(seed)
    stats = Stats()
    schemas = _schemas() if mode in ("op", "both") else []
    seeds = seed_models() if mode in ("load", "both") else []
    pool = list(seeds)
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline and (max_executions is None or stats.executions < max_executions):
        i += 1
        case_rng = random.Random(rng.getrandbits(64))
        case_seed = case_rng.getrandbits(32)
        case_rng.seed(case_seed)
        do_op = schemas and (not seeds or i % 2 == 0)
        if do_op:
            schema = case_rng.choice(schemas)
            try:
                m = random_op_model(schema, case_rng)
            except Exception:  # noqa: BLE001 - the model builder (onnx.helper) refused: not our bug
                continue
            if m is None:
                continue
            what = f"{schema.domain or 'ai.onnx'}::{schema.name}-{schema.since_version}"
            data = m.SerializeToString()
            if case_rng.random() < 0.1:
                pool.append(data)
                if len(pool) > 200:
                    pool.pop(len(seeds))
            desc = f"op seed={case_seed}"
        else:
            data = mutate(case_rng.choice(pool), case_rng, pool)
            what, desc = "mutated-model", f"load seed={case_seed} bytes={data[:64].hex()}..."
        if verbose:
            print(f"[{stats.executions}] {what} {desc}", flush=True)
        src = data if case_rng.random() < 0.9 else _as_proto(data)
        if src is None:
            continue
        run_case(src, case_rng, stats, what, desc)
    return stats


def _as_proto(data: bytes):
    m = onnx.ModelProto()
    try:
        m.ParseFromString(data)
    except Exception:  # noqa: BLE001
        return None
    return m


def report(stats: Stats, out=sys.stdout) -> None:
    print(stats.summary(), file=out)
    seen = set()
    for f in stats.findings:
        key = (f.kind, f.what, f.detail.split(" @ ")[-1])
        if key in seen:
            continue
        seen.add(key)
        print(f"FINDING [{f.kind}] {f.what}: {f.detail}  ({f.case})", file=out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m onnxpy.testing.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=("load", "op", "both"), default="both")
    ap.add_argument("--max-executions", type=int, default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    import warnings

    warnings.simplefilter("ignore")
    stats = fuzz(args.seconds, args.seed, args.mode, args.verbose, args.max_executions)
    report(stats)
    return 1 if stats.findings else 0


if __name__ == "__main__":
    sys.exit(main())
