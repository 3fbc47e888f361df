"""com.microsoft attention ops with onnxruntime's CPU semantics.

Attention (packed QKV projection), MultiHeadAttention, GroupQueryAttention (KV cache, rotary, local window,
softcap), RotaryEmbedding.

All attention runs as batched matmuls over [batch, heads, seq, head_size] with the softmax in float32 (float64
for double inputs); grouped-query attention reshapes the query heads to [batch, kv_heads, group, ...] so the
key/value heads broadcast without copies.  Masks follow onnxruntime: key masks add ``mask_filter_value``
(default -10000) to the scaled scores, causal masking removes the future keys entirely.
"""

from __future__ import annotations

import math

import numpy as np

from . import _native, _packed
from ._common import F32 as _F32
from ._common import compute_dtype as _cd
from ._common import float_arr as _float_arr
from ._common import ones_vector
from ._common import rotate as _rotate
from ._ew_math import to_f32 as _to_f32
from .activations import _EXP_SAFE32 as _EXP_SAFE  # the unshifted softmax's bounds, shared with activations
from .activations import _ROW_SUM_MIN as _DEN_MIN
from .registry import MS_DOMAIN, kernel


def _in_cd(x: np.ndarray, cd) -> np.ndarray:
    """x in the compute type (float16 widened by the fast bit conversion)."""
    if x.dtype == cd:
        return x
    return _to_f32(x) if cd == _F32 else x.astype(cd)


def _wants(output_names, i: int) -> bool:
    if output_names is None:
        return True
    return len(output_names) > i and output_names[i] != ""


def _split_heads(x: np.ndarray, n: int, op: str, name: str) -> np.ndarray:
    """[B, S, n*h] -> [B, n, S, h]."""
    B, S, D = x.shape
    if n <= 0 or D % n:
        raise ValueError(f"{op}: {name} hidden size {D} is not divisible by the number of heads {n}")
    return x.reshape(B, S, n, D // n).transpose(0, 2, 1, 3)


def _merge_heads(x: np.ndarray) -> np.ndarray:
    B, N, S, H = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, S, N * H)


def _scores(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """q [B, N, S, H], k [B, Nk, T, H] (N a multiple of Nk) -> scale * q k^T as [B, N, S, T]."""
    B, N, S, H = q.shape
    Nk, T = k.shape[1], k.shape[2]
    if N == Nk:
        s = np.matmul(q, np.swapaxes(k, -1, -2))
    else:
        g = N // Nk
        s = np.matmul(q.reshape(B, Nk, g, S, H), np.swapaxes(k, -1, -2)[:, :, None]).reshape(B, N, S, T)
    s *= s.dtype.type(scale)
    return s


def _weighted(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    B, N, S, T = p.shape
    Nk = v.shape[1]
    if N == Nk:
        return np.matmul(p, v)
    g = N // Nk
    return np.matmul(p.reshape(B, Nk, g, S, T), v[:, :, None]).reshape(B, N, S, v.shape[-1])


def _softmax(s: np.ndarray, sink: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis (rows with no finite entry give zeros).  ``sink`` ([N] or scalar, broadcast as
    [1, N, 1, 1]) adds exp(sink) to the denominator (smooth softmax / attention sinks)."""
    m = np.max(s, axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    m = np.where(np.isfinite(m), m, s.dtype.type(0))
    e = np.subtract(s, m)
    np.exp(e, out=e)
    den = np.sum(e, axis=-1, keepdims=True)
    if sink is not None:
        den = den + np.exp(sink - m)
    e /= np.where(den == 0, s.dtype.type(1), den)
    return e


def _causal(S: int, T: int, past: int | np.ndarray) -> np.ndarray:
    """Boolean [S, T] (or [B, 1, S, T] for per-batch past lengths): True where key j is after query i."""
    if np.ndim(past) == 0:
        return np.arange(T)[None, :] > (np.arange(S)[:, None] + int(past))
    pos = np.asarray(past).reshape(-1, 1, 1, 1) + np.arange(S)[:, None]
    return np.arange(T)[None, None, None, :] > pos


# --------------------------------------------------------------------------------------------------- key masks
def _additive_terms(mask, mask_name, attention_bias, B, N, S, T, P, mask_filter_value, op, cd):
    """The key mask's additive term plus attention_bias (either may be None; None when both are)."""
    additive = None
    if mask is not None:
        additive = _key_mask(mask, B, S, T, P, mask_filter_value, op, mask_name, cd)
    if attention_bias is not None:
        ab = _attention_bias(attention_bias, B, N, S, T, op, cd)
        additive = ab if additive is None else additive + ab
    return additive


def _key_mask(mask, B: int, S: int, T: int, P: int, filter_value: float, op: str, name: str, cd) -> np.ndarray:
    """onnxruntime mask forms -> additive mask broadcastable to [B, N, S, T] (0 or filter_value)."""
    m = np.asarray(mask)
    fv = cd.type(filter_value)
    zero = cd.type(0)
    if m.ndim == 1:
        n = m.shape[0]
        if n not in (B, 2 * B, 3 * B + 2):
            raise ValueError(f"{op}: 1-D {name} must have length batch ({B}), 2*batch or 3*batch+2, got {n}")
        j = np.arange(T)[None, :]
        masked = j >= m[:B, None].astype(np.int64)
        if n == 2 * B:
            masked |= j < np.minimum(m[B:2 * B, None].astype(np.int64), T)
        return np.where(masked, fv, zero)[:, None, None, :]
    if m.ndim == 2:
        if m.shape[0] != B or m.shape[1] < T and m.shape[1] != T - P:
            raise ValueError(f"{op}: 2-D {name} must have shape ({B}, {T}), got {m.shape}")
        if m.shape[1] == T - P and P:  # a mask over the new keys only: the past keys stay visible
            m = np.concatenate([np.ones((B, P), dtype=m.dtype), m], axis=1)
        return np.where(m[:, :T] > 0, zero, fv)[:, None, None, :]
    if m.ndim == 3:
        if m.shape[0] != B or m.shape[1] != S or m.shape[2] < T:
            raise ValueError(f"{op}: 3-D {name} must have shape ({B}, {S}, {T}), got {m.shape}")
        return np.where(m[:, :, :T] > 0, zero, fv)[:, None]
    if m.ndim == 4:
        if m.shape[0] != B or m.shape[1] != 1 or m.shape[2] < P + S or m.shape[3] < T:
            raise ValueError(f"{op}: 4-D {name} must have shape ({B}, 1, max_seq >= {max(P + S, T)}, ...), "
                             f"got {m.shape}")
        return np.where(m[:, :, P:P + S, :T] > 0, zero, fv)
    raise ValueError(f"{op}: {name} must be 1-D to 4-D, got shape {m.shape}")


def _attention_bias(bias, B, N, S, T, op, cd) -> np.ndarray:
    b = _float_arr(bias, op, "attention_bias")
    if b.ndim != 4 or b.shape[0] not in (1, B) or b.shape[1] not in (1, N) or b.shape[2] != S or b.shape[3] < T:
        raise ValueError(f"{op}: attention_bias must have shape (1 or {B}, 1 or {N}, {S}, {T}), got {b.shape}")
    return b[..., :T].astype(cd, copy=False)


_CAUSAL_T: dict = {}


def _causal_t(S: int, T: int, past: int) -> np.ndarray:
    """Cached boolean [T, S]: True where key j (row) is after query i (column)."""
    key = (S, T, past)
    c = _CAUSAL_T.get(key)
    if c is None:
        if len(_CAUSAL_T) > 32:
            _CAUSAL_T.clear()
        c = np.ascontiguousarray(_causal(S, T, past).T)
        c.flags.writeable = False
        _CAUSAL_T[key] = c
    return c


def _stacks_mm(a, b, out, trans_a, trans_b) -> bool:
    """``out = op(a) @ op(b)`` over the heads of 4-D float32 stacks, batch by batch, the heads split between threads:
    ``_packed.split_matmul`` (large stacks) or ``_packed.stacked_matmul``; False when neither applies to the first
    batch (the caller uses numpy)."""
    if a.dtype != _F32:
        return False
    for i in range(a.shape[0]):
        if not (_packed.split_matmul(a[i], b[i], out[i], trans_a, trans_b)
                or _packed.bound() and _packed.stacked_matmul(a[i], b[i], out[i], trans_a, trans_b)):
            if i:  # (a later batch declined: the helpers are busy elsewhere; numpy finishes the rest)
                np.matmul(a[i:].swapaxes(-1, -2) if trans_a else a[i:], b[i:].swapaxes(-1, -2) if trans_b else b[i:],
                          out=out[i:])
                return True
            return False
    return True


def _scores_t(k, q, additive, causal_past, S, T, dt, plain=False, scale=1.0):
    """[B, N, T, S] scores k q^T times ``scale``, plus the (transposed) additive term and the causal mask (``plain``:
    numpy's product, as a thread's share of a split attention runs it).  The scale multiplies the scores just written
    rather than the query read from the projection's output (cold in the cache: BERT-base's attention 0.88x per run
    in-model; bit-identical where the scale is a power of two, 1/8 for heads of 64)."""
    st = np.empty(k.shape[:2] + (T, S), dtype=dt)
    if plain or not _stacks_mm(k, q, st, False, True):
        np.matmul(k, q.swapaxes(-1, -2), out=st)
    if scale != 1:
        st *= dt.type(scale)
    if additive is not None:
        a = np.asarray(additive)
        if a.ndim < 4:
            a = a.reshape((1,) * (4 - a.ndim) + a.shape)
        at = a.swapaxes(-1, -2)
        if at.shape[-1] > 1 and at.shape[-2] > 1:  # a full [.., S, T] mask: transpose it once, not per head
            at = np.ascontiguousarray(at)
        st += at
    if causal_past is not None:
        np.copyto(st, np.finfo(dt).min, where=_causal_t(S, T, int(causal_past)))
    return st


# Attention whose two products reach this many multiply-adds in all runs its heads split between the calling thread
# and the helper (``_mha_heads`` per thread: one numpy call per step over the thread's heads, OpenBLAS held to one
# thread): BERT-base's and GPT-2's 12 heads of 64 at sequence 128 (25M).
_HEADS_SPLIT_MIN_MACS = 8_000_000
_HEADS_SPLIT = True  # (test and measurement hook)


def _mha_core_t(q, k, v, scale, additive, causal_past):
    """The same-heads attention of :func:`_mha_core` computed in the transposed layout.

    Scores are formed as k q^T ([B, N, T, S]) so that the softmax reductions run over axis -2, which numpy
    vectorizes far better than reductions over the last axis; the scale multiplies the scores just written (see
    ``_scores_t``), the 1/sum normalization is applied to the [S, Hv] output rows instead of the [S, T]
    probabilities, and the result is written straight into the merged-heads layout.  Returns the output as a
    [B, N, S, Hv] view of a contiguous [B, S, N, Hv] array.

    When no score exceeds 60 the scores are exponentiated without subtracting the row maxima (softmax is
    shift-invariant and each exp is correctly rounded on its own; one global max replaces a per-row max and a
    subtraction pass).  Should a row sum come out below 1e-20 (every key of the row far below zero: masked, or
    extreme), the scores are formed again and the row maxima subtracted as usual.

    Large float32 attention splits its heads between the calling thread and the helper (``_packed.run_ranges``),
    each thread running every step over its heads: the element-wise passes (scale, mask, exp, sums, normalization)
    then use both cores too, and the two products need one hand-off instead of one each.
    """
    B, N, S, H = q.shape
    T, Hv = k.shape[2], v.shape[3]
    dt = q.dtype
    out = np.empty((B, S, N, Hv), dtype=dt)
    ov = out.transpose(0, 2, 1, 3)
    if (_HEADS_SPLIT and dt == _F32 and N > 1 and B * N * S * T * (H + Hv) >= _HEADS_SPLIT_MIN_MACS
            and _packed.run_ranges(_mha_heads, N, _packed._blas_threads(), q, k, v, scale, additive, causal_past,
                                   ov, True)):
        return ov
    _mha_heads(0, N, q, k, v, scale, additive, causal_past, ov, False)
    return ov


# The softmax's sums over the keys (axis -2 of the transposed scores) as one matrix product with a row of ones per
# head (BLAS: 6 x 128 x 128 float32 in 6 instead of numpy's 23 us for the axis reduction; test and measurement hook)
_ONES_SUMS = True


def _key_sums(st: np.ndarray) -> np.ndarray:
    """st [..., T, S] summed over T, keeping the axis: [..., 1, S]."""
    ones = ones_vector(st.shape[-2], st.dtype) if _ONES_SUMS and st.dtype.kind == "f" else None
    if ones is None:  # (off, or more keys than the shared ones vectors hold)
        return np.sum(st, axis=-2, keepdims=True)
    return np.matmul(ones[None], st)


# Float32 attention's steps between its two products (scale, additive term, causal mask, the maxima, exp and the
# sums over the keys) run as one native call over the scores (``_native.py``: two passes per 16 queries instead of
# numpy's four to six over the whole stack, without the GIL; test and measurement hook)
SOFTMAX_NATIVE = True
# (the native softmax's own constants: log2 e, -inf, the lowest float32, masking the keys past a causal window)
_SOFTMAX_CONSTANTS = (math.log2(math.e), -math.inf, float(np.finfo(np.float32).min))


def _native_softmax_term(q, k, v, additive, causal_past):
    """(the native softmax kernel, the additive term as an array its strides suit or None, those strides (per head,
    key, query)) where the native softmax applies to :func:`_mha_heads`'s attention, else None (not float32, a
    causal window that leaves a query no key, a term that does not broadcast to the scores)."""
    if not SOFTMAX_NATIVE or q.dtype != _F32 or k.dtype != _F32 or v.dtype != _F32:
        return None
    fn = _native.function("softmax_keys_f32")
    if fn is None or causal_past is not None and (np.ndim(causal_past) or int(causal_past) < 0):
        return None
    if additive is None:
        return fn, None, (0, 0, 0)
    B, N, S = q.shape[:3]
    T = k.shape[2]
    a = np.asarray(additive)
    if a.dtype != _F32 or a.ndim > 4:
        return None
    a = a.reshape((1,) * (4 - a.ndim) + a.shape)
    try:
        a = np.broadcast_to(a, (B, N, S, T))
    except ValueError:
        return None
    sb, sn, ss, stt = (x // 4 for x in a.strides)
    if ss not in (0, 1) and stt != 1 or not (sb == N * sn or B == 1 or sb == sn == 0):
        a = np.ascontiguousarray(a)
        sb, sn, ss, stt = (x // 4 for x in a.strides)
    if ss not in (0, 1):  # (queries a row apart: transposed once, as the numpy path does)
        a = np.ascontiguousarray(a.swapaxes(-1, -2)).swapaxes(-1, -2)
        sb, sn, ss, stt = (x // 4 for x in a.strides)
    return fn, a, ((sn if N > 1 else sb), stt, ss)


def _native_softmax(st, scale, causal_past, native):
    """The weights exp(scale st + term - max) over the keys of the raw scores ``st`` [B, N, T, S] in place, and
    their sums [B, N, 1, S] (``native``: :func:`_native_softmax_term`'s)."""
    fn, a, (ah, at, as_) = native
    B, N, T, S = st.shape
    den = np.empty((B, N, 1, S), dtype=_F32)
    fn(B * N, T, S, st.ctypes.data, float(scale), None if a is None else a.ctypes.data, ah, at, as_,
       -1 if causal_past is None else int(causal_past), den.ctypes.data, _native.exp2_constants(_SOFTMAX_CONSTANTS))
    return den


def _mha_heads(h0, h1, q, k, v, scale, additive, causal_past, ov, plain):
    """:func:`_mha_core_t` for heads [h0, h1), written into those heads of ``ov`` (``plain``: numpy's products, on
    one of the threads a split attention runs on)."""
    if h0 or h1 != q.shape[1]:
        q, k, v, ov = q[:, h0:h1], k[:, h0:h1], v[:, h0:h1], ov[:, h0:h1]
        nd = np.ndim(additive)  # (the term broadcasts as [B, N, S, T]: its heads axis, if any, is cut too)
        if nd >= 3 and np.shape(additive)[nd - 3] > 1:
            additive = additive[:, h0:h1] if nd == 4 else additive[h0:h1]
    S, T = q.shape[2], k.shape[2]
    dt = q.dtype
    native = _native_softmax_term(q, k, v, additive, causal_past)
    if native is not None:  # (the raw products, then the native softmax)
        st = _scores_t(k, q, None, None, S, T, dt, plain)
        den = _native_softmax(st, scale, causal_past, native)
    else:
        st = _scores_t(k, q, additive, causal_past, S, T, dt, plain, scale)
        den = None
    if den is None and st.size and st.max() <= _EXP_SAFE:  # False for NaN
        np.exp(st, out=st)
        den = _key_sums(st)
        if not den.min() >= _DEN_MIN:
            st = _scores_t(k, q, additive, causal_past, S, T, dt, plain, scale)
            den = None
    if den is None:
        m = np.max(st, axis=-2, keepdims=True)  # [B, N, 1, S]
        finite = bool(np.isfinite(m).all())
        if not finite:  # rows with no finite score (or NaN): exp(s - 0) as in _softmax
            m = np.where(np.isfinite(m), m, dt.type(0))
        st -= m
        np.exp(st, out=st)
        den = _key_sums(st)
        if not finite:
            den = np.where(den == 0, dt.type(1), den)
    if plain or not _stacks_mm(st, v, ov, True, False):
        np.matmul(st.swapaxes(-1, -2), v, out=ov)
    ov /= den.swapaxes(-1, -2)


# Additive terms at or below this drop their key from the softmax exactly: exp(score + term) is 0 in any float type for
# every finite score up to ~1e30 (padding masks are written as -inf, finfo.min or -1e4..-1e9; only the first two
# are at or below it, so a -10000 mask keeps the general route).
_DROP_BELOW = -1e30
_ROW_TERM = True


def _drop_masked_keys(k, v, additive):
    """(k, v, additive) without the keys a batch-1, key-only additive term ([1, 1, 1 or S, T], the same row for every
    query, as exporters expand a padding mask) rules out (<= _DROP_BELOW):
    they contribute exp(...) = 0 to every row, so attention over the rest is the same softmax, minus the pass that
    adds the term and the masked keys' share of both products.  Kept keys that are a prefix (padding at the end)
    stay views.  Unchanged when nothing or everything is masked, or when a masked key or value is not finite (its
    NaN/inf would have reached the output through 0 * inf)."""
    a = additive
    if (type(a) is not np.ndarray or a.ndim != 4 or a.shape[:2] != (1, 1) or k.shape[0] != 1
            or a.shape[3] != k.shape[2] or a.dtype.kind != "f"):
        return k, v, additive
    row = a[0, 0, 0]
    if a.shape[2] > 1 and not (a[0, 0] == row).all():  # (a [1, 1, S, T] term the same for every query: key-only)
        return k, v, additive
    drop = row <= _DROP_BELOW
    n_keep = k.shape[2] - int(np.count_nonzero(drop))
    if n_keep == k.shape[2] and _ROW_TERM:  # nothing to drop: the one row stands for the term, or nothing when
        return k, v, (row.reshape(1, 1, 1, -1) if row.any() else None)  # it is all zeros (adding 0 changes nothing)
    if n_keep == k.shape[2] or n_keep == 0:
        return k, v, additive
    if not (np.isfinite(k[:, :, drop]).all() and np.isfinite(v[:, :, drop]).all()):
        return k, v, additive
    if not drop[:n_keep].any():  # padding at the end: views
        k, v, rest = k[:, :, :n_keep], v[:, :, :n_keep], row[:n_keep]
    else:
        keep = ~drop
        k, v, rest = k[:, :, keep], v[:, :, keep], row[keep]
    return k, v, (rest.reshape(1, 1, 1, n_keep) if rest.any() else None)


def _mha_core(q, k, v, scale, additive=None, causal_past=None, want_qk=False):
    """q [B,N,S,H], k/v [B,Nk,T,*] in the compute dtype -> (output [B,N,S,Hv], pre-softmax scores or None)."""
    if not want_qk and q.shape[1] == k.shape[1] and (causal_past is None or np.ndim(causal_past) == 0) \
            and q.size and k.size and v.size:
        if causal_past is None and additive is not None:
            k, v, additive = _drop_masked_keys(k, v, additive)
        return _mha_core_t(q, k, v, scale, additive, causal_past), None
    s = _scores(q, k, scale)
    if additive is not None:
        s += additive
    if causal_past is not None:
        c = _causal(s.shape[2], s.shape[3], causal_past)
        s = np.where(c, np.finfo(s.dtype).min, s)
    qk = s.copy() if want_qk else None
    p = _softmax(s)
    return _weighted(p, v), qk


# ------------------------------------------------------------------------------------------------------ Attention
@kernel("Attention", since=1, domain=MS_DOMAIN)
def ms_attention(input, weights, bias=None, mask_index=None, past=None, attention_bias=None,  # noqa: A002
                 past_sequence_length=None, *, num_heads, unidirectional=0, qkv_hidden_sizes=None, scale=0.0,
                 mask_filter_value=-10000.0, do_rotary=0, rotary_embedding_dim=0, past_present_share_buffer=0,
                 _output_names=None):
    op = "Attention"
    x = _float_arr(input, op, "input")
    w = _float_arr(weights, op, "weights")
    if x.ndim != 3:
        raise ValueError(f"{op}: input must be 3-D (batch, sequence, input_hidden), got shape {x.shape}")
    if w.ndim != 2 or w.shape[0] != x.shape[2]:
        raise ValueError(f"{op}: weights must have shape ({x.shape[2]}, hidden_q + hidden_k + hidden_v), got "
                         f"{w.shape}")
    if do_rotary:
        raise NotImplementedError(f"{op}: do_rotary is not supported by the CPU kernel; use MultiHeadAttention "
                                  f"with RotaryEmbedding")
    N = int(num_heads)
    if qkv_hidden_sizes:
        sizes = [int(v) for v in qkv_hidden_sizes]
        if len(sizes) != 3 or sum(sizes) != w.shape[1]:
            raise ValueError(f"{op}: qkv_hidden_sizes {sizes} must have 3 values summing to {w.shape[1]}")
    else:
        if w.shape[1] % 3:
            raise ValueError(f"{op}: weights' second dimension {w.shape[1]} must be divisible by 3")
        sizes = [w.shape[1] // 3] * 3
    if any(s_ <= 0 or s_ % N for s_ in sizes):
        raise ValueError(f"{op}: Q/K/V hidden sizes {sizes} must be positive multiples of num_heads={N}")
    if sizes[0] != sizes[1]:
        raise ValueError(f"{op}: Q and K hidden sizes must be equal, got {sizes[:2]}")
    cd = _cd(x.dtype)
    B, S, _ = x.shape
    qkv = np.matmul(x.astype(cd, copy=False), w.astype(cd, copy=False))
    if bias is not None:
        b = _float_arr(bias, op, "bias")
        if b.shape != (w.shape[1],):
            raise ValueError(f"{op}: bias must have shape ({w.shape[1]},), got {b.shape}")
        qkv += b.astype(cd, copy=False)
    q = _split_heads(qkv[..., :sizes[0]], N, op, "Q")
    k = _split_heads(qkv[..., sizes[0]:sizes[0] + sizes[1]], N, op, "K")
    v = _split_heads(qkv[..., sizes[0] + sizes[1]:], N, op, "V")
    H = sizes[0] // N
    P = 0
    if past is not None:
        pst = _float_arr(past, op, "past")
        if pst.ndim != 5 or pst.shape[0] != 2 or pst.shape[1] != B or pst.shape[2] != N or pst.shape[4] != H:
            raise ValueError(f"{op}: past must have shape (2, {B}, {N}, past_len, {H}), got {pst.shape}")
        if sizes[1] != sizes[2]:
            raise ValueError(f"{op}: with past, Q/K/V hidden sizes must be equal, got {sizes}")
        pst = pst.astype(cd, copy=False)
        if past_present_share_buffer:
            if past_sequence_length is None:
                raise ValueError(f"{op}: past_sequence_length is required with past_present_share_buffer")
            P = int(np.asarray(past_sequence_length).reshape(-1)[0])
            if P < 0 or P + S > pst.shape[3]:
                raise ValueError(f"{op}: past_sequence_length {P} + sequence {S} exceeds the buffer length "
                                 f"{pst.shape[3]}")
            present = pst.copy()
            present[0, :, :, P:P + S] = k
            present[1, :, :, P:P + S] = v
            k, v = present[0, :, :, :P + S], present[1, :, :, :P + S]
        else:
            P = pst.shape[3]
            k = np.concatenate([pst[0], k], axis=2)
            v = np.concatenate([pst[1], v], axis=2)
            present = None
    else:
        present = None
    T = k.shape[2]
    sc = float(scale) if scale else 1.0 / math.sqrt(H)
    additive = _additive_terms(mask_index, "mask_index", attention_bias, B, N, S, T, P, mask_filter_value, op, cd)
    out, _ = _mha_core(q, k, v, sc, additive, P if unidirectional else None)
    out = _merge_heads(out).astype(x.dtype, copy=False)
    if not _wants(_output_names, 1):
        return out
    if present is None:
        present = np.stack([k, v])
    return out, present.astype(x.dtype, copy=False)


# ------------------------------------------------------------------------------------------- MultiHeadAttention
@kernel("MultiHeadAttention", since=1, domain=MS_DOMAIN)
def multi_head_attention(query, key=None, value=None, bias=None, key_padding_mask=None, attention_bias=None,
                         past_key=None, past_value=None, past_sequence_length=None, cache_indirection=None, *,
                         num_heads, unidirectional=0, scale=0.0, mask_filter_value=-10000.0, _output_names=None):
    op = "MultiHeadAttention"
    qx = _float_arr(query, op, "query")
    N = int(num_heads)
    cd = _cd(qx.dtype)
    if cache_indirection is not None:
        raise NotImplementedError(f"{op}: cache_indirection (beam search) is not supported")
    if N <= 0:
        raise ValueError(f"{op}: num_heads must be positive, got {N}")
    bq = bk = bv = None
    if qx.ndim == 5:  # packed QKV (B, S, N, 3, H)
        if key is not None or value is not None:
            raise ValueError(f"{op}: key and value must be absent with packed QKV query {qx.shape}")
        if qx.shape[2] != N or qx.shape[3] != 3:
            raise ValueError(f"{op}: packed QKV query must have shape (B, S, {N}, 3, H), got {qx.shape}")
        B, S, _, _, H = qx.shape
        pk = qx.astype(cd, copy=False).transpose(3, 0, 2, 1, 4)  # (3, B, N, S, H)
        q, k, v = pk[0], pk[1], pk[2]
        if bias is not None:
            b = _float_arr(bias, op, "bias").astype(cd, copy=False).reshape(3, 1, N, 1, H)
            q, k, v = q + b[0], k + b[1], v + b[2]
        Hv = H
    else:
        if qx.ndim != 3:
            raise ValueError(f"{op}: query must be 3-D (B, S, hidden) or 5-D packed QKV, got shape {qx.shape}")
        B, S, D = qx.shape
        if D % N:
            raise ValueError(f"{op}: query hidden size {D} is not divisible by num_heads={N}")
        H = D // N
        if key is None:
            raise ValueError(f"{op}: key is required unless query is packed QKV (B, S, N, 3, H)")
        kx = _float_arr(key, op, "key")
        b = None if bias is None else _float_arr(bias, op, "bias").astype(cd, copy=False)
        if b is not None:
            if b.ndim != 1 or b.shape[0] < 2 * D:
                raise ValueError(f"{op}: bias must be 1-D of length hidden_q + hidden_k + hidden_v, got {b.shape}")
            bq, bk, bv = b[:D], b[D:2 * D], b[2 * D:]
        q = _in_cd(qx, cd)
        if bq is not None:
            q = q + bq
        q = _split_heads(q, N, op, "query")
        if kx.ndim == 5:  # packed KV (B, L, N, 2, H)
            if value is not None:
                raise ValueError(f"{op}: value must be absent with packed KV key {kx.shape}")
            if kx.shape[0] != B or kx.shape[2] != N or kx.shape[3] != 2 or kx.shape[4] != H:
                raise ValueError(f"{op}: packed KV key must have shape ({B}, L, {N}, 2, {H}), got {kx.shape}")
            pk = kx.astype(cd, copy=False).transpose(3, 0, 2, 1, 4)
            k, v = pk[0], pk[1]
            if bk is not None:
                k = k + bk.reshape(N, 1, H)
                v = v + bv.reshape(N, 1, H)
            Hv = H
        else:
            if value is None:
                raise ValueError(f"{op}: value is required with a {kx.ndim}-D key")
            vx = _float_arr(value, op, "value")
            if kx.ndim == 4:  # BNSH, already projected (bias not added)
                if kx.shape[:2] != (B, N) or kx.shape[3] != H or vx.ndim != 4 or vx.shape[:3] != kx.shape[:3]:
                    raise ValueError(f"{op}: BNSH key/value must have shape ({B}, {N}, L, {H}), got {kx.shape} "
                                     f"and {vx.shape}")
                k = kx.astype(cd, copy=False)
                v = vx.astype(cd, copy=False)
                Hv = v.shape[3]
            elif kx.ndim == 3:
                if kx.shape[0] != B or kx.shape[2] != D or vx.ndim != 3 or vx.shape[:2] != kx.shape[:2]:
                    raise ValueError(f"{op}: key/value must have shape ({B}, L, {D}) and ({B}, L, v_hidden), got "
                                     f"{kx.shape} and {vx.shape}")
                k = _in_cd(kx, cd)
                v = _in_cd(vx, cd)
                if bk is not None:
                    if bv.shape[0] != v.shape[2]:
                        raise ValueError(f"{op}: bias length {b.shape[0]} does not match hidden sizes "
                                         f"{D}+{D}+{v.shape[2]}")
                    k = k + bk
                    v = v + bv
                k = _split_heads(k, N, op, "key")
                v = _split_heads(v, N, op, "value")
                Hv = v.shape[3]
            else:
                raise ValueError(f"{op}: key must be 3-D, 4-D (BNSH) or 5-D packed KV, got shape {kx.shape}")
    P = 0
    if past_key is not None or past_value is not None:
        if past_key is None or past_value is None:
            raise ValueError(f"{op}: past_key and past_value must be given together")
        pk_ = _float_arr(past_key, op, "past_key")
        pv_ = _float_arr(past_value, op, "past_value")
        if pk_.ndim != 4 or pk_.shape[:2] != (B, N) or pk_.shape[3] != H or pv_.shape[:3] != pk_.shape[:3]:
            raise ValueError(f"{op}: past_key/past_value must have shape ({B}, {N}, past_len, head_size), got "
                             f"{pk_.shape} and {pv_.shape}")
        P = pk_.shape[2]
        k = np.concatenate([pk_.astype(cd, copy=False), k], axis=2)
        v = np.concatenate([pv_.astype(cd, copy=False), v], axis=2)
    T = k.shape[2]
    sc = float(scale) if scale else 1.0 / math.sqrt(H)
    additive = _additive_terms(key_padding_mask, "key_padding_mask", attention_bias, B, N, S, T, P,
                               mask_filter_value, op, cd)
    want_qk = _wants(_output_names, 3)
    out, qk = _mha_core(q, k, v, sc, additive, P if unidirectional else None, want_qk)
    dt = qx.dtype
    out = out.transpose(0, 2, 1, 3).reshape(B, S, N * Hv).astype(dt, copy=False)
    if _output_names is not None and len(_output_names) <= 1:
        return out
    return out, k.astype(dt, copy=False), v.astype(dt, copy=False), None if qk is None else qk.astype(dt)


# ---------------------------------------------------------------------------------------------- rotary helpers
def _cache_rows(cache: np.ndarray, pos: np.ndarray, op: str, name: str) -> np.ndarray:
    if pos.size and (pos.min() < 0 or pos.max() >= cache.shape[0]):
        raise ValueError(f"{op}: position {int(pos.max()) if pos.max() >= cache.shape[0] else int(pos.min())} is "
                         f"out of range of {name} with {cache.shape[0]} rows")
    return cache[pos]


@kernel("RotaryEmbedding", since=1, domain=MS_DOMAIN)
def ms_rotary_embedding(input, position_ids, cos_cache, sin_cache, *, interleaved=0, num_heads=0,  # noqa: A002
                        rotary_embedding_dim=0, scale=1.0, is_packed_batching=0):
    op = "RotaryEmbedding"
    x = _float_arr(input, op, "input")
    cos_c = _float_arr(cos_cache, op, "cos_cache")
    sin_c = _float_arr(sin_cache, op, "sin_cache")
    if is_packed_batching:
        raise NotImplementedError(f"{op}: is_packed_batching=1 is not supported")
    if cos_c.ndim != 2 or sin_c.shape != cos_c.shape:
        raise ValueError(f"{op}: cos_cache and sin_cache must be 2-D of the same shape, got {cos_c.shape} and "
                         f"{sin_c.shape}")
    half = cos_c.shape[1]
    rd = int(rotary_embedding_dim) if rotary_embedding_dim else 2 * half
    if rd != 2 * half:
        raise ValueError(f"{op}: rotary_embedding_dim {rd} must be twice the cache width {half}")
    if x.ndim == 4:  # (B, N, S, H)
        B, N, S, H = x.shape
        xs = x.transpose(0, 2, 1, 3)
    elif x.ndim == 3:
        B, S, D = x.shape
        if num_heads:
            N = int(num_heads)
            if D % N:
                raise ValueError(f"{op}: hidden size {D} is not divisible by num_heads={N}")
            H = D // N
        else:
            if rotary_embedding_dim:
                raise ValueError(f"{op}: num_heads is required when rotary_embedding_dim is set")
            H = rd
            if D % H:
                raise ValueError(f"{op}: hidden size {D} is not divisible by the head size {H}")
            N = D // H
        xs = x.reshape(B, S, N, H)
    else:
        raise ValueError(f"{op}: input must be 3-D or 4-D, got shape {x.shape}")
    if rd > H:
        raise ValueError(f"{op}: rotary dimension {rd} exceeds the head size {H}")
    pid = np.asarray(position_ids)
    if pid.dtype.kind not in "iu":
        raise TypeError(f"{op}: position_ids must be an integer tensor, got {pid.dtype}")
    if pid.ndim == 1 and pid.size == 1:
        pos = int(pid[0]) + np.arange(S)[None, :]
    elif pid.ndim == 2 and pid.shape == (B, S):
        pos = pid.astype(np.int64)
    else:
        raise ValueError(f"{op}: position_ids must have shape (1,) or ({B}, {S}), got {pid.shape}")
    cd = _cd(x.dtype)
    cos = _cache_rows(cos_c, pos, op, "cos_cache").astype(cd)[:, :, None, :]  # (B|1, S, 1, half)
    sin = _cache_rows(sin_c, pos, op, "sin_cache").astype(cd)[:, :, None, :]
    out = _rotate(xs.astype(cd, copy=False), cos, sin, bool(interleaved))
    if x.ndim == 4:
        out = out.transpose(0, 2, 1, 3)
    return out.reshape(x.shape).astype(x.dtype, copy=False)


# ------------------------------------------------------------------------------------------- GroupQueryAttention
@kernel("GroupQueryAttention", since=1, domain=MS_DOMAIN)
def group_query_attention(query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None,
                          total_sequence_length=None, cos_cache=None, sin_cache=None, position_ids=None,
                          attention_bias=None, head_sink=None, k_scale=None, v_scale=None, q_norm_weight=None,
                          k_norm_weight=None, query_seqlens=None, *, num_heads, kv_num_heads, scale=0.0,
                          softcap=0.0, local_window_size=-1, do_rotary=0, rotary_interleaved=0, smooth_softmax=-1,
                          causal=1, qk_output=0, kv_cache_bit_width=0, k_quant_type="NONE", v_quant_type="NONE",
                          sliding_window_cache=0, qk_norm_epsilon=1e-6, q_norm_epsilon=None, k_norm_epsilon=None,
                          _output_names=None):
    op = "GroupQueryAttention"
    qx = _float_arr(query, op, "query")
    N, Nk = int(num_heads), int(kv_num_heads)
    if N <= 0 or Nk <= 0 or N % Nk:
        raise ValueError(f"{op}: num_heads ({N}) must be a positive multiple of kv_num_heads ({Nk})")
    for name, val in (("k_scale", k_scale), ("v_scale", v_scale), ("q_norm_weight", q_norm_weight),
                      ("k_norm_weight", k_norm_weight), ("query_seqlens", query_seqlens)):
        if val is not None:
            raise NotImplementedError(f"{op}: input {name} is not supported")
    if str(k_quant_type) != "NONE" or str(v_quant_type) != "NONE" or sliding_window_cache:
        raise NotImplementedError(f"{op}: quantized or windowed KV caches are not supported")
    if seqlens_k is None or total_sequence_length is None:
        raise ValueError(f"{op}: seqlens_k and total_sequence_length are required")
    if qx.ndim != 3:
        raise ValueError(f"{op}: query must be 3-D (batch, sequence, hidden), got shape {qx.shape}")
    B, S, Dq = qx.shape
    cd = _cd(qx.dtype)
    if key is None:
        if value is not None:
            raise ValueError(f"{op}: value given without key")
        if Dq % (N + 2 * Nk):
            raise ValueError(f"{op}: packed QKV hidden size {Dq} is not divisible by num_heads + 2*kv_num_heads")
        H = Dq // (N + 2 * Nk)
        xq = qx[..., :N * H]
        xk = qx[..., N * H:(N + Nk) * H]
        xv = qx[..., (N + Nk) * H:]
    else:
        if value is None:
            raise ValueError(f"{op}: key given without value")
        xq = qx
        xk = _float_arr(key, op, "key")
        xv = _float_arr(value, op, "value")
        if Dq % N:
            raise ValueError(f"{op}: query hidden size {Dq} is not divisible by num_heads={N}")
        H = Dq // N
        if xk.shape != (B, S, Nk * H) or xv.shape != xk.shape:
            raise ValueError(f"{op}: key/value must have shape ({B}, {S}, {Nk * H}), got {xk.shape} and {xv.shape}")
    q = _split_heads(xq.astype(cd, copy=False), N, op, "query")
    k_new = _split_heads(xk.astype(cd, copy=False), Nk, op, "key")
    v_new = _split_heads(xv.astype(cd, copy=False), Nk, op, "value")

    sk = np.asarray(seqlens_k).reshape(-1).astype(np.int64)
    if sk.shape[0] != B:
        raise ValueError(f"{op}: seqlens_k must have {B} values, got {sk.shape[0]}")
    tsl = int(np.asarray(total_sequence_length).reshape(-1)[0])
    total = sk + 1  # keys per batch entry after this step
    if past_key is not None and past_value is not None:
        pk = _float_arr(past_key, op, "past_key")
        pv = _float_arr(past_value, op, "past_value")
        if pk.ndim != 4 or pk.shape[0] != B or pk.shape[1] != Nk or pk.shape[3] != H or pv.shape != pk.shape:
            raise ValueError(f"{op}: past_key/past_value must have shape ({B}, {Nk}, past_len, {H}), got "
                             f"{pk.shape} and {pv.shape}")
        buf = pk.shape[2]
    elif past_key is not None or past_value is not None:
        raise ValueError(f"{op}: past_key and past_value must be given together")
    else:
        pk = pv = None
        buf = 0
    first_prompt = buf == 0 or S == tsl
    if first_prompt:
        past = np.zeros(B, dtype=np.int64)
    else:
        past = total - S
        if B > 1 and S > 1:
            raise ValueError(f"{op}: batch_size must be 1 when sequence_length > 1 and past context is given")
        if (past < 0).any():
            raise ValueError(f"{op}: seqlens_k + 1 ({total.tolist()}) is smaller than the sequence length {S}")
    T_cap = max(buf, tsl)
    if (past + S > T_cap).any() or (total > T_cap).any():
        raise ValueError(f"{op}: seqlens_k {sk.tolist()} exceed total_sequence_length {tsl}")

    if do_rotary:
        if cos_cache is None or sin_cache is None:
            raise ValueError(f"{op}: cos_cache and sin_cache are required with do_rotary=1")
        cos_c = _float_arr(cos_cache, op, "cos_cache")
        sin_c = _float_arr(sin_cache, op, "sin_cache")
        if cos_c.ndim != 2 or sin_c.shape != cos_c.shape or 2 * cos_c.shape[1] > H:
            raise ValueError(f"{op}: cos/sin caches must be 2-D (max_seq, <= head_size/2), got {cos_c.shape} and "
                             f"{sin_c.shape}")
        if position_ids is not None:
            pos = np.asarray(position_ids).astype(np.int64)
            if pos.shape != (B, S):
                pos = np.broadcast_to(pos.reshape(-1, S) if pos.size % S == 0 else pos, (B, S))
        else:
            pos = past[:, None] + np.arange(S)[None, :]
        cos = _cache_rows(cos_c, pos, op, "cos_cache").astype(cd)[:, None]  # (B, 1, S, half)
        sin = _cache_rows(sin_c, pos, op, "sin_cache").astype(cd)[:, None]
        q = _rotate(q, cos, sin, bool(rotary_interleaved))
        k_new = _rotate(k_new, cos, sin, bool(rotary_interleaved))

    # present cache: past rows, then the new rows, zeros elsewhere
    present_k = np.zeros((B, Nk, T_cap, H), dtype=cd)
    present_v = np.zeros((B, Nk, T_cap, H), dtype=cd)
    j = np.arange(T_cap)
    if pk is not None and not first_prompt:
        keep = (j[None, :buf] < past[:, None])[:, None, :, None]
        present_k[:, :, :buf] = np.where(keep, pk.astype(cd, copy=False), 0)
        present_v[:, :, :buf] = np.where(keep, pv.astype(cd, copy=False), 0)
    if B and (past == past[0]).all():
        p0 = int(past[0])
        present_k[:, :, p0:p0 + S] = k_new
        present_v[:, :, p0:p0 + S] = v_new
    elif B:  # ragged batch: scatter each entry's rows at its own offset
        bidx = np.arange(B)[:, None]
        rows = past[:, None] + np.arange(S)[None, :]
        present_k[bidx, :, rows] = k_new.transpose(0, 2, 1, 3)
        present_v[bidx, :, rows] = v_new.transpose(0, 2, 1, 3)

    T = int(total.max()) if B else 0
    T = max(T, 1)
    kk, vv = present_k[:, :, :T], present_v[:, :, :T]
    sc = float(scale) if scale else 1.0 / math.sqrt(H)
    s = _scores(q, kk, sc)
    if softcap and softcap > 0:
        s /= cd.type(softcap)
        np.tanh(s, out=s)
        s *= cd.type(softcap)
    if attention_bias is not None:
        ab = _float_arr(attention_bias, op, "attention_bias")
        if ab.ndim != 4 or ab.shape[0] not in (1, B) or ab.shape[1] not in (1, N) or ab.shape[2] != S \
                or ab.shape[3] < T:
            raise ValueError(f"{op}: attention_bias must have shape (1 or {B}, 1 or {N}, {S}, >= {T}), got "
                             f"{ab.shape}")
        s += ab[..., :T].astype(cd, copy=False)
    qpos = past[:, None] + np.arange(S)[None, :]  # (B, S) absolute query positions
    kj = np.arange(T)[None, None, :]
    masked = kj >= total[:, None, None]
    if causal:
        masked = masked | (kj > qpos[:, :, None])
        if local_window_size is not None and int(local_window_size) > 0:
            masked |= kj <= qpos[:, :, None] - int(local_window_size)
    s = np.where(masked[:, None], -np.inf, s)
    sink = None
    if head_sink is not None:
        sink = _float_arr(head_sink, op, "head_sink").astype(cd).reshape(1, N, 1, 1)
    elif smooth_softmax is not None and int(smooth_softmax) > 0:
        sink = cd.type(0)
    qk = np.where(masked[:, None], cd.type(0), s) if int(qk_output) == 1 else None  # masked scores read as 0
    p = _softmax(s, sink)
    if int(qk_output) == 2:
        qk = p.copy()
    out = _merge_heads(_weighted(p, vv)).astype(qx.dtype, copy=False)
    dt = qx.dtype if pk is None else pk.dtype
    res = (out, present_k.astype(dt, copy=False), present_v.astype(dt, copy=False))
    if qk is not None:
        res = res + (np.pad(qk, ((0, 0), (0, 0), (0, 0), (0, max(tsl - T, 0)))).astype(qx.dtype),)
    return res
