"""Helpers the passes share: who reads a value, renaming uses, removing nodes."""

from __future__ import annotations

import itertools
import operator
import os
import threading
from contextlib import contextmanager

from ..ir.model import Graph, Node


_memo = threading.local()
_CHECK_SHARED = bool(os.environ.get("ONNXPY_CHECK_SHARED_MAPS"))


@contextmanager
def free_names_memo():
    """While a block runs, remember each subgraph's outer-scope reads; ``forget_free_names()`` after any change.

    Every pass asks who reads what (``consumers``/``use_counts``), which walks all nested subgraphs; on models
    that are one big If (silero-vad) that walk was most of the session's creation time.
    """
    prev = getattr(_memo, "cache", None), getattr(_memo, "maps", None)
    _memo.cache, _memo.maps = {}, {}
    try:
        yield
    finally:
        _memo.cache, _memo.maps = prev


def forget_free_names() -> None:
    """The graph changed: subgraph reads and the shared producer/consumer maps are recomputed when next asked."""
    cache = getattr(_memo, "cache", None)
    if cache:
        cache.clear()
    maps = getattr(_memo, "maps", None)
    if maps:
        maps.clear()


def graph_changed(g: Graph) -> None:
    """A pass rewrote ``g``: its shared producer/consumer maps are brought up to date.

    Rewrites replace nodes and assign new ``inputs``/``outputs`` lists (they never edit those lists in place), so
    the nodes that changed are the ones not in the snapshot taken with the maps, or whose lists are other objects
    than the snapshot's; only the names those nodes read or write are looked at again.  Anything the update does
    not handle exactly (nodes reordered, a value with two producers) drops the maps: they are rebuilt when asked.
    """
    maps = getattr(_memo, "maps", None)
    if not maps:
        return
    hit = maps.get(id(g))
    if hit is None:
        return
    if hit[0] is not g or not hit[3] or not _update_maps(g, hit):
        maps.pop(id(g), None)


def _reads(n: Node, ins) -> set:
    names = {x for x in ins if x}
    if n.attrs:
        for sub in n.subgraphs():
            names |= _free_names(sub)
    return names


_get_inputs = operator.attrgetter("inputs")
_get_outputs = operator.attrgetter("outputs")
_GAP = 1 << 32  # label spacing: new nodes take labels between their neighbours' (order without positions)


class _Snapshot:
    """The node list the shared maps describe: nodes, their input/output list objects (held, so ids are not
    reused), and an order label per node (increasing along the list)."""

    __slots__ = ("nodes", "ins", "outs", "label")

    def __init__(self, nodes):
        self.nodes = list(nodes)
        self.ins = list(map(_get_inputs, self.nodes))
        self.outs = list(map(_get_outputs, self.nodes))
        self.label = dict(zip(map(id, self.nodes), range(0, len(self.nodes) * _GAP, _GAP)))


def _first_diff(a, b, limit: int) -> int:
    """Index of the first position < limit where the iterables hold different objects, else limit."""
    return next(itertools.compress(itertools.count(), map(operator.is_not, a, b)), limit)


def _update_maps(g: Graph, hit) -> bool:
    st = hit[3]
    nodes = g.nodes
    n_new, n_old = len(nodes), len(st.nodes)
    lim = min(n_new, n_old)
    # the rewrite changed one stretch of the list: skip the unchanged head and tail (compared object by object)
    p = min(_first_diff(nodes, st.nodes, lim), _first_diff(map(_get_inputs, nodes), st.ins, lim),
            _first_diff(map(_get_outputs, nodes), st.outs, lim))
    lim_s = lim - p
    q = min(_first_diff(reversed(nodes), reversed(st.nodes), lim_s),
            _first_diff(map(_get_inputs, reversed(nodes)), reversed(st.ins), lim_s),
            _first_diff(map(_get_outputs, reversed(nodes)), reversed(st.outs), lim_s))
    gone = list(zip(st.nodes[p:n_old - q], st.ins[p:n_old - q], st.outs[p:n_old - q]))
    mid = nodes[p:n_new - q]
    if not gone and not mid:
        return True
    label = st.label
    for n, _, _ in gone:
        label.pop(id(n), None)
    lo = label[id(nodes[p - 1])] if p else -_GAP
    hi = label[id(nodes[n_new - q])] if q else lo + (len(mid) + 1) * _GAP
    step = (hi - lo) // (len(mid) + 1)
    if step < 1:
        return False  # labels exhausted here: the maps are rebuilt (with fresh labels)
    for i, n in enumerate(mid, 1):
        if id(n) in label:
            return False  # a node listed twice
        label[id(n)] = lo + i * step
    prod, cons = hit[1], hit[2]
    if prod is not None:
        for n, _, outs in gone:
            for o in outs:
                if o and prod.get(o) is n:
                    del prod[o]
        for n in mid:
            for o in n.outputs:
                if o:
                    if o in prod:
                        return False  # two producers of one name: a full rebuild decides as it always did
                    prod[o] = n
    if cons is not None:
        gone_ids = {id(n) for n, _, _ in gone}
        affected = set()
        for n, ins, _ in gone:
            affected |= _reads(n, ins)
        added: dict = {}
        for n in mid:
            for x in _reads(n, n.inputs):
                affected.add(x)
                added.setdefault(x, []).append(n)
        for x in affected:
            keep = [c for c in cons.get(x, ()) if id(c) not in gone_ids]
            more = added.get(x)
            if more:
                keep.extend(more)
                keep.sort(key=lambda c: label[id(c)])
            if keep:
                cons[x] = keep
            else:
                cons.pop(x, None)
    st.nodes[p:n_old - q] = mid
    st.ins[p:n_old - q] = [n.inputs for n in mid]
    st.outs[p:n_old - q] = [n.outputs for n in mid]
    return True


def _shared(g: Graph, kind: int, build):
    """``build(g)`` shared by every pass while the optimizer runs, until the graph changes (a pass that rewrites
    reports it: the optimizer calls ``forget_free_names`` after each pass that changed something, and the sweeps
    call ``graph_changed`` after each rewrite).  Callers must not modify the returned map."""
    maps = getattr(_memo, "maps", None)
    if maps is None:
        return build(g)
    hit = maps.get(id(g))
    if hit is None or hit[0] is not g:
        hit = maps[id(g)] = [g, None, None, None]
    val = hit[kind]
    if val is None:
        if hit[3] is None:  # the snapshot the incremental updates start from (no map exists yet)
            hit[3] = _Snapshot(g.nodes)
            if len(hit[3].label) != len(g.nodes):
                hit[3] = False  # a node listed twice: no incremental updates
        val = hit[kind] = build(g)
        if kind == 1 and len(val) != sum(1 for n in g.nodes for o in n.outputs if o):
            hit[3] = False  # a name with two producers: no incremental updates for this graph
    elif _CHECK_SHARED and val != build(g):  # test aid: a pass changed the graph without reporting it
        raise AssertionError(f"stale shared {build.__name__} map for graph {g.name!r}")
    return val


def shared_producers(g: Graph) -> dict:
    return _shared(g, 1, producers)


def shared_consumers(g: Graph) -> dict:
    return _shared(g, 2, consumers)


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
    get = counts.get
    for n in g.nodes:
        for x in n.inputs:
            if x:
                counts[x] = get(x, 0) + 1
        if n.attrs:
            subs = n.subgraphs()
            if subs:
                for sub in subs:
                    for x in _free_names(sub):
                        counts[x] = get(x, 0) + 1
    for o in g.outputs:
        counts[o.name] = get(o.name, 0) + 1
    return counts


def consumers(g: Graph) -> dict:
    """value name -> list of nodes reading it directly (subgraph reads map to the owning node)."""
    out: dict = {}
    get = out.get
    for n in g.nodes:
        ins = n.inputs
        subs = n.subgraphs() if n.attrs else ()
        if subs:
            names = {x for x in ins if x}
            for sub in subs:
                names |= _free_names(sub)
        elif len(ins) == 1:
            names = ins
        else:
            names = set(ins)
        for x in names:
            if x:
                lst = get(x)
                if lst is None:
                    out[x] = [n]
                else:
                    lst.append(n)
    return out


def producers(g: Graph) -> dict:
    return {o: n for n in g.nodes for o in n.outputs if o}


def rename_uses(g: Graph, old: str, new: str) -> None:
    """Every read of ``old`` in ``g`` (and in subgraphs that do not shadow it) reads ``new`` instead."""
    for n in g.nodes:
        if old in n.inputs:
            n.inputs = [new if x == old else x for x in n.inputs]
        for sub in n.subgraphs():
            local = {v.name for v in sub.inputs} | set(sub.initializers) | {o for m in sub.nodes for o in m.outputs}
            if old not in local:
                rename_uses(sub, old, new)
                for o in sub.outputs:
                    if o.name == old:
                        o.name = new


def graph_output_names(g: Graph) -> set:
    return {o.name for o in g.outputs}
