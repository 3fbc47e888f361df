"""Text and hashing contrib ops (domain ``com.microsoft``): MurmurHash3, Tokenizer, WordConvEmbedding."""

from __future__ import annotations

import re

import numpy as np

from ._common import text
from .registry import MS_DOMAIN, kernel

# ----------------------------------------------------------------------------------------------- MurmurHash3

_M32 = np.uint64(0xFFFFFFFF)
_C1 = np.uint64(0xCC9E2D51)
_C2 = np.uint64(0x1B873593)


def _mul(a, b):
    return (a * b) & _M32


def _rotl(x, r):
    return ((x << np.uint64(r)) | (x >> np.uint64(32 - r))) & _M32


def _mix_k(k):
    return _mul(_rotl(_mul(k, _C1), 15), _C2)


def _murmur3_x86_32(data: np.ndarray, lengths: np.ndarray, seed: int) -> np.ndarray:
    """MurmurHash3_x86_32 of each row of ``data`` (uint8, rows zero-padded to a multiple of 4 bytes) whose byte
    length is ``lengths``; vectorized over rows, looping over 4-byte blocks."""
    n = data.shape[0]
    h = np.full(n, np.uint64(seed & 0xFFFFFFFF), dtype=np.uint64)
    lengths = lengths.astype(np.int64)
    nblocks = lengths // 4
    words = data.view("<u4").astype(np.uint64) if data.shape[1] else np.zeros((n, 0), dtype=np.uint64)
    for j in range(words.shape[1]):
        full = nblocks > j
        k = _mix_k(words[:, j])
        hb = h ^ k
        hb = (_mul(_rotl(hb, 13), np.uint64(5)) + np.uint64(0xE6546B64)) & _M32
        h = np.where(full, hb, h)
        tail = (nblocks == j) & (lengths % 4 > 0)
        if tail.any():
            rem = lengths % 4
            # the word holds the tail bytes (little endian) followed by zero padding: mask to the tail length
            mask = (np.uint64(1) << (rem.astype(np.uint64) * np.uint64(8))) - np.uint64(1)
            kt = _mix_k(words[:, j] & mask)
            h = np.where(tail, h ^ kt, h)
    h = h ^ lengths.astype(np.uint64)
    h ^= h >> np.uint64(16)
    h = _mul(h, np.uint64(0x85EBCA6B))
    h ^= h >> np.uint64(13)
    h = _mul(h, np.uint64(0xC2B2AE35))
    h ^= h >> np.uint64(16)
    return h.astype(np.uint32)


def _string_rows(flat: np.ndarray):
    enc = [(s if isinstance(s, bytes) else str(s).encode("utf-8")) for s in flat]
    lengths = np.fromiter((len(b) for b in enc), dtype=np.int64, count=len(enc))
    width = int(-(-lengths.max() // 4) * 4) if lengths.size else 0
    data = np.zeros((len(enc), width), dtype=np.uint8)
    if width and lengths.sum():
        joined = np.frombuffer(b"".join(enc), dtype=np.uint8)
        rows = np.repeat(np.arange(len(enc)), lengths)
        starts = np.cumsum(lengths) - lengths
        cols = np.arange(joined.size) - np.repeat(starts, lengths)
        data[rows, cols] = joined
    return data, lengths


@kernel("MurmurHash3", since=1, domain=MS_DOMAIN)
def murmur_hash3(X, *, positive=1, seed=0):
    """32-bit MurmurHash3 (x86 variant) of each element: the raw little-endian bytes of numbers, UTF-8 of strings."""
    op = "MurmurHash3"
    flat = X.reshape(-1)
    if X.dtype == object or X.dtype.kind in "SU":
        data, lengths = _string_rows(flat)
    elif X.dtype in (np.int32, np.uint32, np.float32, np.int64, np.uint64, np.float64):
        raw = np.ascontiguousarray(flat.astype(X.dtype.newbyteorder("<"), copy=False))
        data = raw.view(np.uint8).reshape(flat.size, X.dtype.itemsize)
        lengths = np.full(flat.size, X.dtype.itemsize, dtype=np.int64)
    else:
        raise TypeError(f"{op}: unsupported input type {X.dtype}")
    h = _murmur3_x86_32(data, lengths, int(seed))
    out = h if int(positive) else h.view(np.int32)
    return out.reshape(X.shape)


# ----------------------------------------------------------------------------------------------- Tokenizer


def _needs_longest(pattern: str) -> bool:
    """Whether Python's leftmost-first match may be shorter than RE2's leftmost-longest one."""
    return any(c in pattern for c in "|?{")


def _longest_matches(rx: re.Pattern, s: str):
    """Non-overlapping leftmost-longest (RE2 longest_match) non-empty matches of rx in s, as (start, end)."""
    longest = _needs_longest(rx.pattern)
    out = []
    pos = 0
    n = len(s)
    while pos < n:
        m = rx.search(s, pos)
        if m is None:
            break
        st, en = m.span()
        if longest or en == st:
            for e in range(n, en, -1):  # extend to the longest (non-empty) match from the same start
                if rx.fullmatch(s, st, e):
                    en = e
                    break
        if en == st:
            pos = st + 1
            continue
        out.append((st, en))
        pos = en
    return out


def _tokenize(s: str, mode: str, rx, mincharnum: int) -> list[str]:
    if mode == "char":
        toks = list(s)
    elif mode == "sep":
        toks = []
        pos = 0
        m0 = rx.search(s)
        if m0 is not None and m0.end() == m0.start():
            return []  # a separator matching the empty string swallows the text (as onnxruntime does)
        for st, en in _longest_matches(rx, s):
            toks.append(s[pos:st])
            pos = en
        toks.append(s[pos:])
        toks = [t for t in toks if t]
    else:
        toks = [s[st:en] for st, en in _longest_matches(rx, s)]
    if mincharnum > 1:
        toks = [t for t in toks if len(t) >= mincharnum]
    return toks


@kernel("Tokenizer", since=1, domain=MS_DOMAIN)
def tokenizer(X, *, mark=None, mincharnum=None, pad_value=None, separators=None, tokenexp=None):
    op = "Tokenizer"
    if mark is None or mincharnum is None or pad_value is None:
        raise ValueError(f"{op}: attributes mark, mincharnum and pad_value are required")
    mincharnum = int(mincharnum)
    if mincharnum <= 0:
        raise ValueError(f"{op}: attribute mincharnum must be positive, got {mincharnum}")
    pad = text(pad_value)
    seps = [text(v) for v in (separators or [])]
    texp = text(tokenexp)
    if seps:
        if len(seps) == 1 and seps[0] == "":
            mode, rx = "char", None
        else:
            mode = "sep"
            try:
                rx = re.compile("|".join(f"(?:{p})" for p in seps))
            except re.error as e:
                raise ValueError(f"{op}: invalid separator expression ({e})") from None
    elif texp:
        mode = "char" if texp == "." else "exp"
        try:
            rx = re.compile(texp)
        except re.error as e:
            raise ValueError(f"{op}: invalid tokenexp ({e})") from None
    else:
        raise ValueError(f"{op}: either separators or tokenexp must be set")
    if mode == "char" and mincharnum > 1:
        raise ValueError(f"{op}: mincharnum ({mincharnum}) is too big for character tokenization")
    if X.dtype != object and X.dtype.kind not in "SU":
        raise TypeError(f"{op}: input must be a string tensor, got {X.dtype}")
    if X.ndim not in (1, 2):
        raise ValueError(f"{op}: input must have shape [C] or [N, C], got {list(X.shape)}")
    if X.size == 0:
        return np.empty(X.shape, dtype=object)
    flat = [v.decode() if isinstance(v, bytes) else str(v) for v in X.reshape(-1)]  # (tensor elements, not attributes)
    rows = [_tokenize(s, mode, rx, mincharnum) for s in flat]
    most = max(len(r) for r in rows)
    if most == 0:
        return np.empty(X.shape + (0,), dtype=object)
    if int(mark):
        rows = [["\x02", *r, "\x03"] for r in rows]
        most += 2
    out = np.full((len(rows), most), pad, dtype=object)
    for i, r in enumerate(rows):  # one string per row: filling is per token
        out[i, :len(r)] = r
    return out.reshape(X.shape + (most,))


# ----------------------------------------------------------------------------------------------- WordConvEmbedding


@kernel("WordConvEmbedding", since=1, domain=MS_DOMAIN)
def word_conv_embedding(Sequence, W, B, C, *, char_embedding_size=None, conv_window_size=None, embedding_size=None):
    """Per word: char embeddings -> 1-D conv (window K, stride 1) + bias -> tanh -> max over positions.

    ``Sequence`` is (num_words, word_len) of char ids, 0 = padding; a word's length is its count of non-zero
    ids; a word shorter than K uses the single window at position 0; a padding word (first id 0) gives zeros
    (onnxruntime leaves those rows unwritten).
    """
    op = "WordConvEmbedding"
    seq = np.asarray(Sequence)
    if seq.dtype != np.int32:
        raise TypeError(f"{op}: Sequence must be int32, got {seq.dtype}")
    if seq.ndim != 2:
        raise ValueError(f"{op}: Sequence must have shape (num_words, word_len), got {list(seq.shape)}")
    if W.ndim != 4 or W.shape[1] != 1:
        raise ValueError(f"{op}: W must have shape (filters, 1, window, char_embedding), got {list(W.shape)}")
    F, _, K, E = W.shape
    if C.ndim != 2 or C.shape[1] != E:
        raise ValueError(f"{op}: C must have shape (vocab, {E}), got {list(C.shape)}")
    if B.reshape(-1).shape[0] != F:
        raise ValueError(f"{op}: B must have {F} values, got shape {list(B.shape)}")
    for name, v, want in (("char_embedding_size", char_embedding_size, E), ("conv_window_size", conv_window_size, K),
                          ("embedding_size", embedding_size, F)):
        if v is not None and int(v) != want:
            raise ValueError(f"{op}: attribute {name}={v} does not match the weights ({want})")
    S, L = seq.shape
    if seq.size and (seq.min() < 0 or seq.max() >= C.shape[0]):
        raise ValueError(f"{op}: char id out of range [0, {C.shape[0]})")
    if S == 0:
        return np.zeros((0, F), dtype=np.float32)
    lens = (seq > 0).sum(axis=1)
    if L:
        lens[seq[:, 0] == 0] = 0  # a word starting with the padding id is a padding word
    padL = max(L, K)
    ids = np.zeros((S, padL), dtype=np.int64)
    ids[:, :L] = seq
    emb = C.astype(np.float32)[ids]  # (S, padL, E)
    P = padL - K + 1
    wins = np.lib.stride_tricks.sliding_window_view(emb, (K, E), axis=(1, 2))[:, :, 0]  # (S, P, K, E)
    conv = np.tanh(np.einsum("spke,fke->spf", wins, W[:, 0].astype(np.float32)) + B.reshape(1, 1, F))
    npos = np.maximum(lens - K + 1, 1)
    valid = np.arange(P)[None, :] < npos[:, None]
    conv = np.where(valid[:, :, None], conv, -np.inf)
    out = conv.max(axis=1)
    out[lens == 0] = 0.0
    return out.astype(np.float32)
