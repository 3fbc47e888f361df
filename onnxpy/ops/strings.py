"""String operators: StringNormalizer, StringConcat, StringSplit, RegexFullMatch, TfIdfVectorizer.

String tensors are numpy object arrays of ``str``.  Case changes and concatenation go through numpy's
``StringDType`` ufuncs; splitting and regex matching are per-element by nature.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from .registry import kernel

_SDT = np.dtypes.StringDType()


def _strings(x, name: str = "X") -> np.ndarray:
    if x is None:
        raise ValueError(f"input '{name}' is missing")
    a = np.asarray(x)
    if a.dtype.kind == "U" or a.dtype == _SDT:
        return a.astype(object)
    if a.dtype != object:
        raise TypeError(f"input '{name}' must be a string tensor, got {a.dtype}")
    return a


def _to_sdt(a: np.ndarray) -> np.ndarray:
    try:
        return a.astype(_SDT)
    except (TypeError, ValueError) as e:
        raise TypeError(f"string tensor holds a non-string element: {e}") from None


def _to_obj(a) -> np.ndarray:
    if not isinstance(a, np.ndarray):  # 0-d ufunc results come back as Python str
        out = np.empty((), dtype=object)
        out[()] = str(a)
        return out
    return a.astype(object)


# --------------------------------------------------------------------------------------------------------------
# StringNormalizer


@kernel("StringNormalizer", since=10)
def string_normalizer(X, *, case_change_action="NONE", is_case_sensitive=0, locale="", stopwords=None):
    x = _strings(X)
    action = (case_change_action or "NONE").upper()
    if action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(
            f"StringNormalizer: case_change_action must be NONE, LOWER or UPPER, got {case_change_action!r}"
        )
    if x.ndim == 1:
        two_d = False
        row = x
    elif x.ndim == 2 and x.shape[0] == 1:
        two_d = True
        row = x[0]
    else:
        raise ValueError(f"StringNormalizer accepts [C] or [1, C] inputs, got shape {x.shape}")
    if stopwords:
        s = _to_sdt(row)
        if is_case_sensitive:
            keep = ~np.isin(s, np.array(list(stopwords), dtype=_SDT))
        else:
            lowered = np.strings.lower(s)
            stops = np.strings.lower(np.array(list(stopwords), dtype=_SDT))
            keep = ~np.isin(lowered, stops)
        row = row[keep]
    if row.size == 0:
        out = np.array([""], dtype=object)
        return out.reshape(1, 1) if two_d else out
    if action != "NONE":
        s = _to_sdt(row)
        s = np.strings.lower(s) if action == "LOWER" else np.strings.upper(s)
        row = _to_obj(s)
    else:
        row = row.copy()
    return row.reshape(1, -1) if two_d else row


# --------------------------------------------------------------------------------------------------------------
# StringConcat


@kernel("StringConcat", since=20)
def string_concat(X, Y):
    x = _to_sdt(_strings(X, "X"))
    y = _to_sdt(_strings(Y, "Y"))
    try:
        z = np.strings.add(x, y)
    except ValueError as e:
        raise ValueError(f"StringConcat: shapes {x.shape} and {y.shape} do not broadcast: {e}") from None
    return _to_obj(z)


# --------------------------------------------------------------------------------------------------------------
# StringSplit


@kernel("StringSplit", since=20)
def string_split(X, *, delimiter="", maxsplit=None):
    x = _strings(X)
    sep = delimiter if delimiter else None
    ms = -1 if maxsplit is None else int(maxsplit)
    if ms < -1:
        raise ValueError(f"StringSplit: maxsplit must be non-negative, got {maxsplit}")
    flat = x.reshape(-1)
    if sep is None:  # whitespace mode: like str.split(), and the unsplit remainder is stripped too
        parts = [str(s).strip().split(None, ms) for s in flat]
    else:
        parts = [str(s).split(sep, ms) if s else [] for s in flat]
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    width = int(counts.max()) if counts.size else 0
    y = np.full((flat.shape[0], width), "", dtype=object)
    for i, p in enumerate(parts):
        y[i, : len(p)] = p
    return y.reshape(x.shape + (width,)), counts


# --------------------------------------------------------------------------------------------------------------
# RegexFullMatch


@functools.lru_cache(maxsize=64)
def _compile(pattern: str):
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"RegexFullMatch: invalid pattern {pattern!r}: {e}") from None


@kernel("RegexFullMatch", since=20)
def regex_full_match(X, *, pattern=""):
    x = _strings(X)
    rx = _compile(pattern)
    flat = x.reshape(-1)
    out = np.fromiter((rx.fullmatch(s) is not None for s in flat), dtype=np.bool_, count=flat.shape[0])
    return out.reshape(x.shape)


# --------------------------------------------------------------------------------------------------------------
# TfIdfVectorizer


@kernel("TfIdfVectorizer", since=9)
def tfidf_vectorizer(X, *, max_gram_length, max_skip_count, min_gram_length, mode, ngram_counts, ngram_indexes,
                     pool_int64s=None, pool_strings=None, weights=None):
    if X is None:
        raise ValueError("input 'X' is missing")
    x = np.asarray(X)
    if (pool_int64s is None) == (pool_strings is None):
        raise ValueError("TfIdfVectorizer: exactly one of pool_int64s / pool_strings must be set")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"TfIdfVectorizer: mode must be TF, IDF or TFIDF, got {mode!r}")
    if not 1 <= min_gram_length <= max_gram_length:
        raise ValueError(
            f"TfIdfVectorizer: need 1 <= min_gram_length ({min_gram_length}) <= max_gram_length ({max_gram_length})"
        )
    if max_skip_count < 0:
        raise ValueError(f"TfIdfVectorizer: max_skip_count must be >= 0, got {max_skip_count}")
    pool = list(pool_strings) if pool_strings is not None else list(pool_int64s)
    idx_map = np.asarray(ngram_indexes, dtype=np.int64)
    # pool position -> gram number: grams of each section are numbered consecutively, in pool order
    starts = list(ngram_counts)
    if pool_strings is not None:
        if x.dtype != object and x.dtype.kind != "U":
            raise TypeError(f"TfIdfVectorizer: pool_strings needs a string input, got {x.dtype}")
    elif x.dtype.kind not in "iu":
        raise TypeError(f"TfIdfVectorizer: pool_int64s needs an int32/int64 input, got {x.dtype}")
    if x.ndim == 1:
        rows = x.reshape(1, -1)
    elif x.ndim == 2:
        rows = x
    else:
        raise ValueError(f"TfIdfVectorizer: input must be 1-D or 2-D, got shape {x.shape}")
    n_rows, c = rows.shape
    out_dim = int(idx_map.max()) + 1 if idx_map.size else 0
    # vocabulary ids: every distinct pool item gets an id; input items not in the pool get -1
    if pool_strings is not None:
        vocab = {}
        for s in pool:
            vocab.setdefault(s, len(vocab))
        pool_ids = np.array([vocab[s] for s in pool], dtype=np.int64)
        ids = np.array([vocab.get(s, -1) for s in rows.reshape(-1)], dtype=np.int64).reshape(rows.shape)
    else:
        pvals = np.asarray(pool, dtype=np.int64)
        uniq, pool_ids = np.unique(pvals, return_inverse=True)
        flat = rows.reshape(-1).astype(np.int64)
        pos = np.searchsorted(uniq, flat)
        pos_c = np.minimum(pos, max(len(uniq) - 1, 0))
        found = (pos < len(uniq)) & (uniq[pos_c] == flat) if len(uniq) else np.zeros(flat.shape, bool)
        ids = np.where(found, pos_c, -1).reshape(rows.shape)
    # gram number g (0-based over the whole pool, section by section) -> output coordinate idx_map[g]
    counts = np.zeros((n_rows, out_dim), dtype=np.float32)
    gram_base = 0
    for n in range(1, len(starts) + 1):
        lo = starts[n - 1]
        hi = starts[n] if n < len(starts) else len(pool)
        if hi < lo or (hi - lo) % n:
            raise ValueError(f"TfIdfVectorizer: pool section for {n}-grams [{lo}, {hi}) is not a multiple of {n}")
        k = (hi - lo) // n
        if min_gram_length <= n <= max_gram_length and k and c:
            grams = pool_ids[lo:hi].reshape(k, n)
            skips = range(max_skip_count + 1) if n > 1 else range(1)
            for skip in skips:
                step = skip + 1
                span = (n - 1) * step
                if span >= c:
                    break
                pos = np.arange(c - span)[:, None] + np.arange(n)[None, :] * step  # [S, n]
                cand = ids[:, pos].reshape(-1, n)  # [rows*S, n]
                both = np.concatenate([grams, cand], axis=0)
                _, inv = np.unique(both, axis=0, return_inverse=True)
                inv = inv.reshape(-1)
                lookup = np.full(inv.max() + 1, -1, dtype=np.int64)
                lookup[inv[:k][::-1]] = np.arange(k)[::-1]  # first pool occurrence wins
                hit = lookup[inv[k:]]
                valid = (hit >= 0) & (cand >= 0).all(axis=1)
                row_of = np.repeat(np.arange(n_rows), pos.shape[0])
                g = gram_base + hit[valid]
                if np.any(g >= idx_map.shape[0]):
                    raise ValueError("TfIdfVectorizer: ngram_indexes is shorter than the pool")
                np.add.at(counts, (row_of[valid], idx_map[g]), 1.0)
        gram_base += k
    if mode != "TF":
        w = np.ones(idx_map.shape[0], dtype=np.float32) if weights is None else np.asarray(weights, np.float32)
        if w.shape[0] != idx_map.shape[0]:
            raise ValueError(f"TfIdfVectorizer: weights has {w.shape[0]} entries, ngram_indexes {idx_map.shape[0]}")
        wout = np.ones(out_dim, dtype=np.float32)
        wout[idx_map] = w
        if mode == "IDF":
            counts = np.minimum(counts, 1.0)
        counts = counts * wout
    return counts.reshape(-1) if x.ndim == 1 else counts
