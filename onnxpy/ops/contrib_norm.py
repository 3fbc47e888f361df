"""Normalization ops of onnxruntime's contrib set.

com.microsoft: SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization, GroupNorm,
SkipGroupNorm.  Domain "" (onnxruntime registers it there): SimplifiedLayerNormalization (RMSNorm).

Statistics are computed in float32 (float64 for double inputs); the optional mean / inv_std_var outputs are
float32 with the normalized axis kept as size 1.
"""

from __future__ import annotations

import math

import numpy as np

from . import _ew_math as _fast
from ._common import F32 as _F32
from ._common import compute_dtype as _cd
from ._common import float_arr as _float_arr
from . import normalization as _norm
from .normalization import _EINSUM_MAX_D, _normalize_rows
from .registry import MS_DOMAIN, kernel


def _vec(p, n: int, op: str, name: str, cd) -> np.ndarray | None:
    if p is None:
        return None
    p = _float_arr(p, op, name)
    if p.size != n or p.ndim > 1 and any(d != 1 for d in p.shape[:-1]):
        raise ValueError(f"{op}: {name} must hold {n} values (the hidden size), got shape {p.shape}")
    return p.reshape(n).astype(cd, copy=False)


def _layer_norm_rows(x2: np.ndarray, eps: float, simplified: bool, out: np.ndarray | None = None):
    """Normalize rows of a 2-D array; returns (y, mean, inv_std) with mean/inv_std of shape (rows, 1).

    ``y`` is a fresh array the caller may scale in place, or ``out`` (which may be x2 itself).
    """
    if not simplified:
        return _normalize_rows(x2, eps, out)
    D = x2.shape[1]
    if 0 < D <= _EINSUM_MAX_D and x2.shape[0]:
        t = x2.dtype.type
        ms = np.einsum("ij,ij->i", x2, x2)[:, None]
        ms *= t(1.0 / D)
        ms += t(eps)
        inv = np.sqrt(ms, out=ms)
        np.divide(t(1), inv, out=inv)
        return np.multiply(x2, inv, out=out), np.zeros_like(inv), inv
    ms = np.mean(np.square(x2), axis=1, keepdims=True)
    inv = 1.0 / np.sqrt(ms + x2.dtype.type(eps))
    return np.multiply(x2, inv, out=out), np.zeros_like(inv), inv


def _skip_norm(op, input, skip, gamma, beta, bias, epsilon, simplified, donated=(), output_names=None):
    x = _float_arr(input, op, "input")
    s = _float_arr(skip, op, "skip")
    if x.ndim not in (2, 3):
        raise ValueError(f"{op}: input must be 2-D or 3-D, got shape {x.shape}")
    if s.ndim not in (2, 3):
        raise ValueError(f"{op}: skip is expected to have 3 or 2 dimensions, got {s.ndim}")
    if s.shape[-2:] != x.shape[-2:] or (s.ndim == 3 and x.ndim == 3 and s.shape[0] not in (1, x.shape[0])) \
            or s.ndim > x.ndim:
        raise ValueError(f"{op}: skip shape {s.shape} is not compatible with input shape {x.shape}")
    D = x.shape[-1]
    cd = _cd(x.dtype)
    g = _vec(gamma, D, op, "gamma", cd)
    b = _vec(beta, D, op, "beta", cd)
    bi = _vec(bias, D, op, "bias", cd)
    rows = math.prod(x.shape[:-1])
    only_y = output_names is not None and not any(output_names[1:])  # only the normalized output is used
    own = 0 in donated and x.dtype == cd and s.dtype == cd and x.flags.writeable and x.flags.c_contiguous
    if only_y and x.dtype == _F32 and s.dtype == _F32 and s.ndim <= x.ndim and (s.ndim < 3 or s.shape[0] == 1
                                                                                or s.shape[0] == x.shape[0]):
        # (one native pass per row: the sum, its statistics and the affine; None where it does not apply)
        x2 = x.reshape(rows, D)
        y = _norm.native_rows(x2, epsilon, g, b, x2 if own and _norm.IN_PLACE else None, skip=s.reshape(-1, D),
                              bias=bi, simplified=simplified)
        if y is not None:
            return y.reshape(x.shape)
    if own:
        total = np.add(x, s, out=x)  # x dies here and is ours (see registry: _donated)
    elif x.dtype != cd and cd == _F32 and s.dtype == x.dtype:
        total = _fast.to_f32(x)  # fresh (x is narrower): converted once each, then summed in place
        total += _fast.to_f32(s)
    else:
        total = np.add(x, s, dtype=cd)
    if bi is not None:
        total += bi
    t2 = total.reshape(rows, D)
    if total.dtype == _F32:  # (the native pass over the sum: the same values as the fused pass above)
        stats = None if only_y else np.empty((rows, 2), dtype=_F32)
        y = _norm.native_rows(t2, epsilon, g, b, t2 if only_y and _norm.IN_PLACE else None, simplified=simplified,
                              stats=stats)
        if y is not None:
            y = y.reshape(x.shape).astype(x.dtype, copy=False)
            if only_y:
                return y
            stat_shape = x.shape[:-1] + (1,)
            return (y, stats[:, 0].reshape(stat_shape), stats[:, 1].reshape(stat_shape),
                    total.astype(x.dtype, copy=False))
    # (total is this call's own array, the donated input or a fresh sum: with the sum not wanted as an output, the
    # rows are normalized in place, one buffer touched instead of two: BERT-base's 25 SkipLayerNorms 6.1 -> 4.5 ms)
    y, mean, inv = _layer_norm_rows(t2, epsilon, simplified, t2 if only_y and _norm.IN_PLACE else None)
    y *= g
    if b is not None:
        y += b
    if only_y:
        return y.reshape(x.shape).astype(x.dtype, copy=False)
    stat_shape = x.shape[:-1] + (1,)
    return (y.reshape(x.shape).astype(x.dtype, copy=False), mean.reshape(stat_shape).astype(_F32),
            inv.reshape(stat_shape).astype(_F32), total.astype(x.dtype, copy=False))


@kernel("SkipLayerNormalization", since=1, domain=MS_DOMAIN)
def skip_layer_normalization(input, skip, gamma, beta=None, bias=None, *, epsilon=1e-12,  # noqa: A002 - spec name
                             _donated=(), _output_names=None):
    return _skip_norm("SkipLayerNormalization", input, skip, gamma, beta, bias, epsilon, False, _donated,
                      _output_names)


@kernel("SkipSimplifiedLayerNormalization", since=1, domain=MS_DOMAIN)
def skip_simplified_layer_normalization(input, skip, gamma, bias=None, *, epsilon=1e-12,  # noqa: A002 - spec name
                                        _donated=(), _output_names=None):
    return _skip_norm("SkipSimplifiedLayerNormalization", input, skip, gamma, None, bias, epsilon, True, _donated,
                      _output_names)


@kernel("SimplifiedLayerNormalization", since=1)
def simplified_layer_normalization(X, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    op = "SimplifiedLayerNormalization"
    x = _float_arr(X, op, "X")
    sc = _float_arr(scale, op, "scale")
    r = x.ndim
    ax = axis + r if axis < 0 else axis
    if not 0 <= ax < r:
        raise ValueError(f"{op}: axis {axis} is out of range for rank {r}")
    trailing = x.shape[ax:]
    try:
        if np.broadcast_shapes(sc.shape, trailing) != trailing:
            raise ValueError
    except ValueError:
        raise ValueError(f"{op}: scale of shape {sc.shape} does not broadcast to the normalized shape "
                         f"{trailing}") from None
    cd = _cd(x.dtype)
    rows = math.prod(x.shape[:ax])
    x2 = x.astype(cd).reshape(rows, -1)
    y, _, inv = _layer_norm_rows(x2, epsilon, True)
    y = y.reshape(x.shape) * sc.astype(cd, copy=False)
    return y.astype(sc.dtype, copy=False), inv.reshape(x.shape[:ax] + (1,) * (r - ax)).astype(_F32)


# ----------------------------------------------------------------------------------------- EmbedLayerNormalization
def _lookup(table: np.ndarray, ids: np.ndarray, op: str, name: str) -> np.ndarray:
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise ValueError(f"{op}: {name} out of range [0, {table.shape[0]})")
    return table[ids]


@kernel("EmbedLayerNormalization", since=1, domain=MS_DOMAIN)
def embed_layer_normalization(input_ids, segment_ids, word_embedding, position_embedding, segment_embedding=None,
                              gamma=None, beta=None, mask=None, position_ids=None, *, epsilon=1e-12,
                              mask_index_type=1):
    op = "EmbedLayerNormalization"
    ids = np.asarray(input_ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{op}: input_ids must be an integer tensor, got {ids.dtype}")
    if ids.ndim != 2:
        raise ValueError(f"{op}: input_ids must be 2-D (batch, sequence), got shape {ids.shape}")
    B, S = ids.shape
    we = _float_arr(word_embedding, op, "word_embedding")
    pe = _float_arr(position_embedding, op, "position_embedding")
    if we.ndim != 2 or pe.ndim != 2 or pe.shape[1] != we.shape[1]:
        raise ValueError(f"{op}: word/position embeddings must be 2-D with the same hidden size, got {we.shape} and "
                         f"{pe.shape}")
    D = we.shape[1]
    if gamma is None or beta is None:
        raise ValueError(f"{op}: gamma and beta are required")
    cd = _cd(we.dtype)
    emb = _lookup(we, ids, op, "input_ids").astype(cd)
    if position_ids is not None:
        pid = np.asarray(position_ids)
        if pid.ndim != 2 or pid.shape[1] != S or pid.shape[0] not in (1, B):
            raise ValueError(f"{op}: position_ids must have shape (1 or {B}, {S}), got {pid.shape}")
    else:
        pid = np.arange(S)[None, :]
    emb += _lookup(pe, pid, op, "position_ids").astype(cd, copy=False)
    if segment_ids is not None and segment_embedding is not None:
        seg = np.asarray(segment_ids)
        if seg.shape != ids.shape:
            raise ValueError(f"{op}: segment_ids shape {seg.shape} must equal input_ids shape {ids.shape}")
        se = _float_arr(segment_embedding, op, "segment_embedding")
        if se.ndim != 2 or se.shape[1] != D:
            raise ValueError(f"{op}: segment_embedding must be 2-D with hidden size {D}, got {se.shape}")
        emb += _lookup(se, seg, op, "segment_ids").astype(cd, copy=False)
    y, _, _ = _layer_norm_rows(emb.reshape(B * S, D), epsilon, False)
    y *= _vec(gamma, D, op, "gamma", cd)
    y += _vec(beta, D, op, "beta", cd)
    if mask is not None:
        m = np.asarray(mask)
        if m.shape != ids.shape:
            raise ValueError(f"{op}: mask shape {m.shape} must equal input_ids shape {ids.shape}")
        mask_index = np.count_nonzero(m, axis=1).astype(np.int32)
    else:
        mask_index = np.zeros(B, dtype=np.int32)
    return y.reshape(B, S, D).astype(we.dtype, copy=False), mask_index, emb.astype(we.dtype, copy=False)


# ------------------------------------------------------------------------------------------ GroupNorm (diffusion)
def _group_norm_nhwc(op, x, gamma, beta, groups, epsilon, activation, channels_last):
    if x.ndim < 3:
        raise ValueError(f"{op}: X must have rank >= 3, got shape {x.shape}")
    if not channels_last:
        x = np.moveaxis(x, 1, -1)
    N, C = x.shape[0], x.shape[-1]
    if groups <= 0 or C % groups:
        raise ValueError(f"{op}: channels ({C}) must be divisible by groups ({groups})")
    cd = _cd(x.dtype)
    g = _vec(gamma, C, op, "gamma", cd)
    b = _vec(beta, C, op, "beta", cd)
    xg = x.astype(cd, copy=False).reshape(N, -1, groups, C // groups)
    mean = xg.mean(axis=(1, 3), keepdims=True)
    d = xg - mean
    var = np.mean(np.square(d), axis=(1, 3), keepdims=True)
    d *= 1.0 / np.sqrt(var + cd.type(epsilon))
    y = d.reshape(x.shape) * g + b
    if activation == 1:
        y = y * _fast.sigmoid(y)
    elif activation != 0:
        raise ValueError(f"{op}: activation must be 0 (none) or 1 (SiLU), got {activation}")
    if not channels_last:
        y = np.moveaxis(y, -1, 1)
    return y


@kernel("GroupNorm", since=1, domain=MS_DOMAIN)
def group_norm(X, gamma, beta, *, activation, groups, epsilon=1e-5, channels_last=1):
    x = _float_arr(X, "GroupNorm", "X")
    y = _group_norm_nhwc("GroupNorm", x, gamma, beta, int(groups), epsilon, int(activation), int(channels_last))
    return y.astype(x.dtype, copy=False)


@kernel("SkipGroupNorm", since=1, domain=MS_DOMAIN)
def skip_group_norm(X, gamma, beta, skip, bias=None, *, activation, groups, epsilon=1e-5, channels_last=1):
    op = "SkipGroupNorm"
    x = _float_arr(X, op, "X")
    sk = _float_arr(skip, op, "skip")
    if not int(channels_last):
        raise ValueError(f"{op}: only channels_last=1 is supported")
    if x.ndim != 4:
        raise ValueError(f"{op}: X must be 4-D (N, H, W, C), got shape {x.shape}")
    N, C = x.shape[0], x.shape[-1]
    if sk.shape not in (x.shape, (N, C), (N, 1, 1, C)):
        raise ValueError(f"{op}: skip of shape {sk.shape} must be {x.shape}, ({N}, {C}) or ({N}, 1, 1, {C})")
    cd = _cd(x.dtype)
    s = x.astype(cd) + sk.astype(cd, copy=False).reshape(N, 1, 1, C) if sk.shape != x.shape \
        else x.astype(cd) + sk.astype(cd, copy=False)
    if bias is not None:
        s += _vec(bias, C, op, "bias", cd)
    y = _group_norm_nhwc(op, s, gamma, beta, int(groups), epsilon, int(activation), 1)
    return y.astype(x.dtype, copy=False), s.astype(x.dtype, copy=False)
