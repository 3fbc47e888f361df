"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (reductions none/sum/mean, weights, ignore_index)."""

from __future__ import annotations

import numpy as np

from ._common import F32 as _F32
from ._common import LOW_FLOATS as _LOW_FLOATS
from ._common import required_arr as _arr
from .registry import kernel


def _nll(logp, target, weight, ignore_index, reduction, op):
    """logp (N, C, d1..dk) float, target (N, d1..dk) int -> loss per the reduction, in logp's dtype."""
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"{op}: reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    if logp.ndim < 2:
        raise ValueError(f"{op}: input must have shape (N, C, d1, ..., dk), got {logp.shape}")
    if target.dtype.kind not in "iu":
        raise TypeError(f"{op}: target must be an integer tensor, got {target.dtype}")
    expected = (logp.shape[0],) + logp.shape[2:]
    if target.shape != expected:
        raise ValueError(f"{op}: target shape {target.shape} does not match input shape {logp.shape}")
    C = logp.shape[1]
    t = target.astype(np.int64, copy=False)
    valid = np.ones(t.shape, np.bool_) if ignore_index is None else t != int(ignore_index)
    t_safe = np.where(valid, t, 0)
    if ((t_safe < 0) | (t_safe >= C)).any():
        bad = t_safe[(t_safe < 0) | (t_safe >= C)].reshape(-1)[0]
        raise ValueError(f"{op}: target value {bad} is out of range for {C} classes")
    picked = np.take_along_axis(logp, t_safe[:, None], axis=1)[:, 0]
    if weight is not None:
        w = _arr(weight, op, "weight")
        if w.ndim != 1 or w.shape[0] != C:
            raise ValueError(f"{op}: weight must have shape ({C},), got {w.shape}")
        wt = w.astype(logp.dtype, copy=False)[t_safe]
        wt = np.where(valid, wt, 0).astype(logp.dtype, copy=False)
    else:
        wt = valid.astype(logp.dtype)
    loss = -picked * wt
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return np.asarray(total, dtype=logp.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(total / wt.sum(), dtype=logp.dtype)


def _float_input(x, op, name):
    x = _arr(x, op, name)
    if x.dtype.kind != "f" and x.dtype not in _LOW_FLOATS:
        raise TypeError(f"{op}: input '{name}' must be a float tensor, got {x.dtype}")
    return x


@kernel("NegativeLogLikelihoodLoss", since=(12, 13, 22))
def negative_log_likelihood_loss(input, target, weight=None, *, ignore_index=None, reduction="mean"):  # noqa: A002
    op = "NegativeLogLikelihoodLoss"
    x = _float_input(input, op, "input")
    low = x.dtype in _LOW_FLOATS
    xc = x.astype(_F32) if low else x
    loss = _nll(xc, _arr(target, op, "target"), weight, ignore_index, reduction, op)
    return loss.astype(x.dtype) if low else loss


def _log_softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    m[~np.isfinite(m)] = 0
    z = x - m
    with np.errstate(divide="ignore"):
        z -= np.log(np.sum(np.exp(z), axis=axis, keepdims=True))
    return z


@kernel("SoftmaxCrossEntropyLoss", since=(12, 13))
def softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index=None, reduction="mean",
                               _num_outputs=1):
    op = "SoftmaxCrossEntropyLoss"
    x = _float_input(scores, op, "scores")
    if x.ndim < 2:
        raise ValueError(f"{op}: scores must have shape (N, C, d1, ..., dk), got {x.shape}")
    low = x.dtype in _LOW_FLOATS
    xc = x.astype(_F32) if low else x
    logp = _log_softmax(xc, 1)
    loss = _nll(logp, _arr(labels, op, "labels"), weights, ignore_index, reduction, op)
    if low:
        loss = loss.astype(x.dtype)
    if _num_outputs > 1:
        return loss, (logp.astype(x.dtype) if low else logp)
    return loss
