"""Helpers the passes share: who reads a value, renaming uses, removing nodes."""

from __future__ import annotations

import threading
from contextlib import contextmanager

from ..ir.model import Graph, Node


def subgraphs(n: Node):
    for v in n.attrs.values():
        if isinstance(v, Graph):
            yield v
        elif isinstance(v, list) and v and isinstance(v[0], Graph):
            yield from v


_memo = threading.local()


@contextmanager
def free_names_memo():
    """While a block runs, remember each subgraph's outer-scope reads; ``forget_free_names()`` after any change.

    Every pass asks who reads what (``consumers``/``use_counts``), which walks all nested subgraphs; on models
    that are one big If (silero-vad) that walk was most of the session's creation time.
    """
    prev = getattr(_memo, "cache", None)
    _memo.cache = {}
    try:
        yield
    finally:
        _memo.cache = prev


def forget_free_names() -> None:
    cache = getattr(_memo, "cache", None)
    if cache:
        cache.clear()


def _free_names(g: Graph) -> set:
    from ..execution.plan import graph_free_names

    cache = getattr(_memo, "cache", None)
    if cache is None:
        return set(graph_free_names(g))
    hit = cache.get(id(g))
    if hit is None or hit[0] is not g:
        hit = cache[id(g)] = (g, frozenset(graph_free_names(g)))
    return set(hit[1])


def use_counts(g: Graph) -> dict:
    """value name -> number of readers (node inputs, subgraph outer-scope reads, graph outputs)."""
    counts: dict = {}
    for n in g.nodes:
        for x in n.inputs:
            if x:
                counts[x] = counts.get(x, 0) + 1
        for sub in subgraphs(n):
            for x in _free_names(sub):
                counts[x] = counts.get(x, 0) + 1
    for o in g.outputs:
        counts[o.name] = counts.get(o.name, 0) + 1
    return counts


def consumers(g: Graph) -> dict:
    """value name -> list of nodes reading it directly (subgraph reads map to the owning node)."""
    out: dict = {}
    for n in g.nodes:
        names = {x for x in n.inputs if x}
        for sub in subgraphs(n):
            names |= _free_names(sub)
        for x in names:
            out.setdefault(x, []).append(n)
    return out


def producers(g: Graph) -> dict:
    return {o: n for n in g.nodes for o in n.outputs if o}


def rename_uses(g: Graph, old: str, new: str) -> None:
    """Every read of ``old`` in ``g`` (and in subgraphs that do not shadow it) reads ``new`` instead."""
    for n in g.nodes:
        if old in n.inputs:
            n.inputs = [new if x == old else x for x in n.inputs]
        for sub in subgraphs(n):
            local = {v.name for v in sub.inputs} | set(sub.initializers) | {o for m in sub.nodes for o in m.outputs}
            if old not in local:
                rename_uses(sub, old, new)
                for o in sub.outputs:
                    if o.name == old:
                        o.name = new


def graph_output_names(g: Graph) -> set:
    return {o.name for o in g.outputs}
