"""Custom operators written as Python functions.

A custom op is a Python callable used as the kernel of every node with its ``(domain, op_type)``::

    import numpy as np
    import onnxpy
    from onnxpy import custom_ops

    @custom_ops.register("my.domain", "ScaledTanh")
    def scaled_tanh(x, *, alpha=1.0, beta=1.0):
        return (alpha * np.tanh(beta * x)).astype(x.dtype)

The calling convention is the one built-in kernels use (see :mod:`onnxpy.ops.registry`): the node's inputs
arrive positionally (a missing optional input as ``None``), the node's attributes as keyword arguments (only
those the signature names, or all of them when it has ``**kwargs``), and the function returns one value or a
tuple of values.  The reserved keywords ``_num_outputs``, ``_opset``, ``_node_name`` and ``_output_names`` are
filled when named.

Registrations are looked up when a session is planned:

* per session: :func:`add_to_session_options` (or ``SessionOptions.register_custom_op``) -- wins over
* the process-wide registry: :func:`register` (decorator or call), :func:`unregister`, :func:`registered`
  (a context manager for temporary registration) -- which wins over the built-in kernels.

A custom op can also give ``shape_fn`` to describe its outputs' types without running it; :func:`infer_shapes`
uses it to complete ``onnx.shape_inference`` (which stops at nodes of unknown domains).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

log = logging.getLogger("onnxpy.custom_ops")

__all__ = [
    "CustomOp", "TensorSpec", "register", "unregister", "registered", "lookup", "list_registered",
    "add_to_session_options", "kernel_info", "infer_shapes",
]


class TensorSpec(NamedTuple):
    """Element type and shape of a tensor for ``shape_fn``: dims are ints, or None/str when unknown."""

    dtype: np.dtype | None
    shape: tuple | None


@dataclass(frozen=True)
class CustomOp:
    """A registered custom op: the kernel ``fn`` and an optional ``shape_fn``."""

    domain: str
    op_type: str
    fn: Callable[..., Any]
    shape_fn: Callable[..., Any] | None = None
    since: int = 1

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


_lock = threading.Lock()
_REGISTRY: dict[tuple[str, str], dict[int, CustomOp]] = {}


def _norm(domain: str) -> str:
    if not isinstance(domain, str):
        raise TypeError(f"custom op domain must be a str, got {type(domain).__name__}")
    return "" if domain in ("", "ai.onnx") else domain


def _check(op_type, fn, shape_fn):
    if not isinstance(op_type, str) or not op_type:
        raise ValueError(f"custom op op_type must be a non-empty str, got {op_type!r}")
    if not callable(fn):
        raise TypeError(f"custom op '{op_type}': the kernel must be callable, got {type(fn).__name__}")
    if shape_fn is not None and not callable(shape_fn):
        raise TypeError(f"custom op '{op_type}': shape_fn must be callable, got {type(shape_fn).__name__}")


def register(domain: str, op_type: str, fn: Callable | None = None, shape_fn: Callable | None = None,
             since: int = 1):
    """Register ``fn`` process-wide as the kernel of ``(domain, op_type)`` from opset ``since`` of ``domain``.

    Without ``fn`` it is a decorator: ``@register("my.domain", "MyOp")``.  Returns ``fn``.  Registering the
    same ``(domain, op_type, since)`` again replaces the previous function (logged as a warning); registering a
    standard op (domain ``""``) overrides the built-in kernel in every session.
    """
    dom = _norm(domain)

    def deco(f):
        _check(op_type, f, shape_fn)
        op = CustomOp(dom, op_type, f, shape_fn, int(since))
        with _lock:
            versions = _REGISTRY.setdefault((dom, op_type), {})
            if int(since) in versions:
                log.warning("custom op %s:%s (since %d) registered again; the new function replaces the old one",
                            dom or "ai.onnx", op_type, int(since))
            versions[int(since)] = op
        if dom == "":
            log.warning("custom op %s overrides the built-in ai.onnx kernel in every session", op_type)
        return f

    return deco if fn is None else deco(fn)


def unregister(domain: str, op_type: str, since: int | None = None) -> bool:
    """Remove a process-wide registration (all versions when ``since`` is None); True if one was removed."""
    key = (_norm(domain), op_type)
    with _lock:
        versions = _REGISTRY.get(key)
        if not versions:
            return False
        if since is None:
            del _REGISTRY[key]
            return True
        removed = versions.pop(int(since), None) is not None
        if not versions:
            del _REGISTRY[key]
        return removed


@contextlib.contextmanager
def registered(domain: str, op_type: str, fn: Callable, shape_fn: Callable | None = None, since: int = 1):
    """Register for the duration of a ``with`` block (restores what was registered before)."""
    key = (_norm(domain), op_type)
    with _lock:
        before = dict(_REGISTRY.get(key, {}))
    register(domain, op_type, fn, shape_fn=shape_fn, since=since)
    try:
        yield fn
    finally:
        with _lock:
            if before:
                _REGISTRY[key] = before
            else:
                _REGISTRY.pop(key, None)


def lookup(domain: str, op_type: str, opset: int | None = None) -> CustomOp | None:
    """The process-wide custom op for a node: the newest ``since`` not above ``opset`` (None: the newest)."""
    versions = _REGISTRY.get((_norm(domain), op_type))
    if not versions:
        return None
    ok = [v for v in versions if opset is None or v <= opset]
    return versions[max(ok)] if ok else None


def list_registered() -> list[tuple[str, str, int]]:
    """Every process-wide registration as ``(domain, op_type, since)``."""
    with _lock:
        return sorted((d, o, v) for (d, o), vs in _REGISTRY.items() for v in vs)


def add_to_session_options(sess_options, domain: str, op_type: str, fn: Callable,
                           shape_fn: Callable | None = None) -> None:
    """Register ``fn`` for sessions created with ``sess_options`` only (takes precedence over :func:`register`).

    Equivalent to ``sess_options.register_custom_op(domain, op_type, fn)`` plus a ``shape_fn``.
    """
    _check(op_type, fn, shape_fn)
    dom = _norm(domain)
    sess_options._custom_ops[(dom, op_type)] = CustomOp(dom, op_type, fn, shape_fn)


# -- planner hook --------------------------------------------------------------------------------------------

def kernel_info(custom, domain: str, op_type: str):
    """A :class:`~onnxpy.ops.registry.KernelInfo` for a custom callable, so the planner binds its attributes.

    The signature decides what is passed, exactly like built-in kernels: keyword-only parameters receive the
    node's attributes of that name (``**kwargs`` receives them all), reserved ``_xxx`` names are filled.
    A plain ``lambda x: ...`` therefore receives no attributes.
    """
    from .ops.registry import KernelInfo, _describe

    fn = custom.fn if isinstance(custom, CustomOp) else custom
    since = custom.since if isinstance(custom, CustomOp) else 1
    if isinstance(fn, KernelInfo):
        return fn
    return _describe(fn, domain, op_type, since)


def _signature(fn):
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def resolve(session_ops: dict, domain: str, op_type: str, opset: int | None):
    """The custom op for a node: per-session registration first, then the process-wide registry; or None."""
    dom = _norm(domain)
    custom = session_ops.get((dom, op_type)) if session_ops else None
    if custom is None:
        custom = lookup(dom, op_type, opset)
    return custom


# -- shape inference -----------------------------------------------------------------------------------------

def _spec_from_type(tp) -> TensorSpec | None:
    from . import dtypes

    if tp is None or not tp.HasField("tensor_type"):
        return None
    tt = tp.tensor_type
    if not tt.elem_type:
        return None
    try:
        dt = dtypes.to_numpy(tt.elem_type)
    except TypeError:
        dt = None
    shape = None
    if tt.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
    return TensorSpec(dt, shape)


def _node_attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _call_shape_fn(op: CustomOp, specs, node) -> list:
    attrs = _node_attrs(node)
    sig = _signature(op.shape_fn)
    if sig is not None and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        attrs = {k: v for k, v in attrs.items() if k in sig.parameters}
    res = op.shape_fn(*specs, **attrs)
    if isinstance(res, TensorSpec) or (isinstance(res, tuple) and len(res) == 2 and not isinstance(res[0], tuple)
                                       and not isinstance(res[0], TensorSpec)):
        res = [res]
    out = []
    for r in res:
        if not isinstance(r, (tuple, list)) or len(r) != 2:
            raise ValueError(f"shape_fn of {op.domain}:{op.op_type} must return (dtype, shape) pairs, got {r!r}")
        out.append(TensorSpec(None if r[0] is None else np.dtype(r[0]), None if r[1] is None else tuple(r[1])))
    return out


def infer_shapes(model, sess_options=None):
    """``onnx.shape_inference.infer_shapes`` completed with the ``shape_fn`` of registered custom ops.

    ``model`` is a ModelProto (or path); returns a new ModelProto whose ``value_info`` includes the outputs of
    custom nodes (and everything onnx can infer downstream of them).  Only the main graph is handled.
    """
    import onnx
    from onnx import helper, shape_inference

    from . import dtypes

    if isinstance(model, (str, bytes)) and not isinstance(model, bytes):
        model = onnx.load(model)
    elif isinstance(model, bytes):
        model = onnx.load_from_string(model)
    session_ops = dict(getattr(sess_options, "_custom_ops", {}) or {})
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    done: set[int] = set()
    for _ in range(len(model.graph.node) + 1):
        model = shape_inference.infer_shapes(model)
        known = {v.name: v.type for v in list(model.graph.input) + list(model.graph.value_info)
                 + list(model.graph.output)}
        for init in model.graph.initializer:
            known.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims)))
        added = False
        for i, node in enumerate(model.graph.node):
            if i in done:
                continue
            op = resolve(session_ops, node.domain, node.op_type, opsets.get(_norm(node.domain)))
            if not isinstance(op, CustomOp) or op.shape_fn is None:
                continue
            specs = [_spec_from_type(known.get(x)) if x else None for x in node.input]
            if any(s is None for x, s in zip(node.input, specs) if x):
                continue  # inputs not known yet: retry after the next inference round
            done.add(i)
            results = _call_shape_fn(op, specs, node)
            existing = {v.name for v in model.graph.value_info} | {v.name for v in model.graph.output}
            for name, spec in zip(node.output, results):
                if not name or name in existing or spec.dtype is None:
                    continue
                shape = None if spec.shape is None else [d if d is not None else None for d in spec.shape]
                model.graph.value_info.append(
                    helper.make_tensor_value_info(name, dtypes.from_numpy(spec.dtype), shape))
                added = True
        if not added:
            break
    return model
