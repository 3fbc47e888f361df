"""Structural checks onnxruntime makes at load time, before any pass or kernel looks at a node.

Every node of a known domain must have an input and output count within its schema's range (optional trailing
values may be absent).  A node that breaks this raises InvalidGraph naming it, as onnxruntime does ("Node (n)
has input size 0 not in range [min=1, max=1]"), instead of failing later inside a pass or kernel.
"""

from __future__ import annotations

import functools

from ..capi.onnxruntime_pybind11_state import InvalidGraph
from . import _arity_table
from .model import Graph
from .protoenums import onnx_version

CHECKED_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")


@functools.lru_cache(maxsize=4096)
def _ranges(op_type: str, opset: int, domain: str):
    """(min_input, max_input, min_output, max_output) of the schema onnx picks for ``opset``, or None."""
    if _arity_table.ONNX_VERSION == _installed_onnx():
        rows = _arity_table.RANGES.get((domain, op_type))
        if rows is not None:
            best = None
            for r in rows:
                if r[0] <= opset:
                    best = r
            if best is not None:
                return best[1:]
    return _onnx_ranges(op_type, opset, domain)


@functools.lru_cache(maxsize=1)
def _installed_onnx() -> str:
    """onnx's version without importing onnx when its metadata says it (the table is only valid for that one)."""
    v = onnx_version()
    if v is None:
        import onnx

        v = onnx.__version__
    return v


def _onnx_ranges(op_type: str, opset: int, domain: str):
    import onnx

    try:
        s = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # noqa: BLE001 - unknown op: the planner reports it
        return None
    return s.min_input, s.max_input, s.min_output, s.max_output


def check_arity(g: Graph, opsets: dict) -> None:
    for n in g.nodes:
        dom = "" if n.domain in ("", "ai.onnx") else n.domain
        if dom in CHECKED_DOMAINS and dom in opsets:
            r = _ranges(n.op_type, opsets[dom], dom)
            if r is not None:
                lo_i, hi_i, lo_o, hi_o = r
                n_in = len(n.inputs)
                while n_in and not n.inputs[n_in - 1]:
                    n_in -= 1  # trailing absent optional inputs
                if not lo_i <= len(n.inputs) <= hi_i and not lo_i <= n_in <= hi_i:
                    raise InvalidGraph.make(
                        f"This is an invalid model. Node ({n.name or n.op_type}) of type {n.op_type} has input size "
                        f"{len(n.inputs)} not in range [min={lo_i}, max={hi_i}]."
                    )
                if not lo_o <= len(n.outputs) <= hi_o:
                    raise InvalidGraph.make(
                        f"This is an invalid model. Node ({n.name or n.op_type}) of type {n.op_type} has output "
                        f"size {len(n.outputs)} not in range [min={lo_o}, max={hi_o}]."
                    )
        for v in n.attrs.values():
            if isinstance(v, Graph):
                check_arity(v, opsets)
            elif isinstance(v, list) and v and isinstance(v[0], Graph):
                for sub in v:
                    check_arity(sub, opsets)
