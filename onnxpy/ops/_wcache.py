"""A cache of layouts derived from constant weights (transposed, packed, transformed filters).

Session constants are read-only arrays; a layout derived from one is computed once and kept, keyed by the
arrays' identity and checked through weak references, so a recycled id never returns a stale layout.  Writeable
arrays (whose content may change between calls) are never cached.
"""

from __future__ import annotations

import weakref

from ._shape_util import frozen

_CACHE: dict = {}
_CACHE_MAX = 512


def derived(tag, arrays, make):
    """``make()``, cached while every array in ``arrays`` (None allowed) is a frozen ndarray.

    The entry holds weak references to the arrays, so a recycled id never returns a stale layout; writeable arrays
    (whose content may change between calls) are never cached; ``arrays`` all None: no caching."""
    live = [a for a in arrays if a is not None]
    if not live or not all(frozen(a) for a in live):
        return make()
    key = (tag,) + tuple(None if a is None else id(a) for a in arrays)
    hit = _CACHE.get(key)
    if hit is not None and all(r() is a for r, a in zip(hit[0], live)):
        return hit[1]
    res = make()
    try:
        refs = tuple(weakref.ref(a) for a in live)
    except TypeError:
        return res
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    res.flags.writeable = False
    _CACHE[key] = (refs, res)
    return res


