"""Opset-versioned kernel registry.

A kernel is registered under ``(domain, op_type, since_version)``.  Lookup picks the newest ``since`` that is
not above the model's opset for that domain (the rule the ONNX spec uses for operator versions).

Kernel contract (shared by every op family module):

* inputs are positional; a missing optional input arrives as ``None``; variadic inputs use ``*args``;
* attributes are keyword-only with the spec's defaults (the signature *is* the attribute schema);
  attributes the signature does not name are not passed;
* reserved keyword-only parameters, filled by the planner only when the signature names them:
  ``_num_outputs`` (how many outputs the node declares), ``_opset`` (the domain's opset of the model),
  ``_node_name`` (the node's name), ``_output_names`` (the node's output names, "" for absent optional ones),
  ``_donated`` (declare it as ``_donated=()``: a tuple of input positions whose arrays the kernel may overwrite
  and return as its output -- the executor passes them only for arrays that die at that step, own their memory
  and are referenced by nothing else; the kernel must still check shape/dtype before writing in place);
* graph attributes (If/Loop/Scan bodies) arrive as callables ``body(*inputs) -> list`` with
  ``body.input_names`` / ``body.output_names``; outer-scope values are already bound;
* a kernel returns one value, or a **tuple** of values for several outputs (extra trailing values are
  dropped).  Tensors are numpy arrays, sequences are Python ``list``, maps are ``dict``, an empty optional is
  ``None``.  A numpy scalar is accepted and turned into a 0-d array.
* string tensors are numpy object arrays of ``str``.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable


ONNX_DOMAIN = ""
ML_DOMAIN = "ai.onnx.ml"
MS_DOMAIN = "com.microsoft"
TRAINING_DOMAIN = "ai.onnx.preview.training"

RESERVED = ("_num_outputs", "_opset", "_node_name", "_output_names", "_donated")


@dataclass(frozen=True)
class KernelInfo:
    """A registered kernel with what the planner needs to know about its signature."""

    fn: Callable[..., Any]
    domain: str
    op_type: str
    since: int
    attr_names: frozenset  # keyword-only parameters that are attributes
    reserved: frozenset  # reserved keyword-only parameters it asked for
    accepts_any_attr: bool  # it has **kwargs


_REGISTRY: dict[tuple[str, str], dict[int, KernelInfo]] = {}


def _normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _describe(fn: Callable[..., Any], domain: str, op_type: str, since: int) -> KernelInfo:
    target = fn.__call__ if not inspect.isfunction(fn) and callable(fn) else fn
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        # a bare ufunc or other C function (Add = np.add, Where = np.where): positional inputs, no attributes
        # (inspect.signature would parse its text signature, ~15 ms the first time)
        return KernelInfo(fn, domain, op_type, since, frozenset(), frozenset(), False)
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return KernelInfo(fn, domain, op_type, since, frozenset(), frozenset(), True)
    attrs, reserved, any_attr = set(), set(), False
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            (reserved if p.name in RESERVED else attrs).add(p.name)
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            any_attr = True
    return KernelInfo(fn, domain, op_type, since, frozenset(attrs), frozenset(reserved), any_attr)


def kernel(op_type: str, since: int | tuple[int, ...] | list[int] = 1, domain: str = ONNX_DOMAIN):
    """Decorator registering ``fn`` for ``op_type`` from opset ``since`` (one version or several)."""
    versions = (since,) if isinstance(since, int) else tuple(since)
    dom = _normalize_domain(domain)

    def deco(fn):
        for v in versions:
            _REGISTRY.setdefault((dom, op_type), {})[int(v)] = fn  # described on first lookup (import time)
        if _track is not None:
            owner = _registering_family()
            for v in versions:
                _track.append(((dom, op_type), int(v), owner))
        return fn

    return deco


_track: list | None = None  # while a list: (key, version, family module) per registration (see ops._check_index)


def _registering_family() -> str | None:
    """The op-family module whose code is registering a kernel (the innermost such frame), or None."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_globals.get("__name__", "")
        if name.startswith("onnxpy.ops.") and not name.rsplit(".", 1)[1].startswith("_") \
                and name != "onnxpy.ops.registry":
            return name.rsplit(".", 1)[1]
        f = f.f_back
    return None


def register(op_type: str, fn: Callable[..., Any], since: int = 1, domain: str = ONNX_DOMAIN) -> None:
    """Non-decorator form of :func:`kernel` (used for custom ops)."""
    kernel(op_type, since, domain)(fn)


def _load_for(domain: str, op_type: str) -> None:
    from . import load_for

    load_for(domain, op_type)


def lookup(domain: str, op_type: str, opset: int) -> KernelInfo | None:
    """The kernel for ``op_type`` at the model's ``opset`` of ``domain``, or None (the op-family modules that
    register it are imported first, see ``onnxpy.ops.load_for``)."""
    _load_for(_normalize_domain(domain), op_type)
    versions = _REGISTRY.get((_normalize_domain(domain), op_type))
    if not versions:
        return None
    best = None
    for v in versions:
        if v <= opset and (best is None or v > best):
            best = v
    if best is None:
        return None
    info = versions[best]
    if not isinstance(info, KernelInfo):
        info = versions[best] = _describe(info, _normalize_domain(domain), op_type, best)
    return info


def versions_of(domain: str, op_type: str) -> list[int]:
    """The opset versions registered for an op (for error messages)."""
    _load_for(_normalize_domain(domain), op_type)
    return sorted(_REGISTRY.get((_normalize_domain(domain), op_type), {}))


def registered_ops() -> list[tuple[str, str, int]]:
    """Every (domain, op_type, since) in the registry."""
    from . import load_all

    load_all()
    return sorted((d, o, v) for (d, o), vs in _REGISTRY.items() for v in vs)
