"""onnxpy's level-99 fusions for small (streaming-audio) models, domain ai.onnxpy:

* PadConv: Pad (any mode, constant pads) -> [Unsqueeze] -> 1-D Conv, as one op (written by PadConvFusion,
  optimizer/fusions_speed.py; silero-vad's STFT pads its audio by reflection, adds a channel axis and runs a strided
  convolution with the Fourier basis).  The generic kernel runs the three ops in sequence.  With a constant filter
  the plan-time form composes the Pad's index map with the convolution's column gather (``conv._spec_conv1d``): the
  padding is never materialised, and the column matrix is one gather from the unpadded input.  The index map is the
  Pad kernel itself applied to an array of positions, so every mode (reflect, edge, wrap, constant zeros, negative
  pads) means exactly what the Pad op means.
* GemmSum: Gemm + Gemm -> Add (an LSTM cell exported as primitives) as one GEMM of the concatenated inputs.
"""

from __future__ import annotations

import numpy as np

from .conv import conv as _conv
from .linalg import _dot2
from .pad import pad_18 as _pad
from .registry import kernel
from .tensor import _unsqueeze

DOMAIN = "ai.onnxpy"
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_PLANS_MAX = 32


def _padded(X, pad_mode, pad_pads, unsqueeze_axes):
    y = _pad(X, np.asarray(list(pad_pads), np.int64), mode=pad_mode)
    return _unsqueeze(y, list(unsqueeze_axes)) if len(unsqueeze_axes) else y


@kernel("PadConv", domain=DOMAIN)
def pad_conv(X, W, B=None, *, pad_mode="constant", pad_pads=(), unsqueeze_axes=(), auto_pad="NOTSET",
             dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv(Unsqueeze(Pad(X, pad_pads, mode=pad_mode), unsqueeze_axes), W, B) (no Unsqueeze when the axes are
    empty); the Pad pads with zeros in constant mode."""
    y = _padded(X, pad_mode, pad_pads, unsqueeze_axes)
    return _conv(y, W, B, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
                 pads=pads, strides=strides)


def _pad_conv_specialize(consts, kwargs):
    """Constant 3-D filter (and bias): the column gather of the 1-D convolution, composed with the Pad."""
    if len(consts) < 2 or not isinstance(consts[1], np.ndarray) or consts[1].ndim != 3:
        return None
    W = consts[1]
    B = consts[2] if len(consts) > 2 else None
    conv_kw = {k: kwargs[k] for k in _CONV_ATTRS if k in kwargs}
    fast = _conv.specialize(consts, conv_kw)
    plan_for = getattr(fast, "plan_for", None)
    if plan_for is None:
        return None
    mode = kwargs.get("pad_mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    pp = [int(v) for v in kwargs.get("pad_pads", ())]
    axes = [int(v) for v in kwargs.get("unsqueeze_axes", ())]
    M = W.shape[0]
    dt = W.dtype
    full = {k: kwargs[k] for k in kwargs if not k.startswith("_")}
    memo: dict = {}

    def generic(X, *rest):
        return pad_conv(X, *rest, **full)

    def build(shape):
        """(filter, gather index into [x, 0, 1] per batch row, the (N, 2) [0, 1] tail) for input shape ``shape``, or
        False."""
        if len(shape) < 1 or shape[0] == 0 or len(pp) != 2 * len(shape) or pp[0] or pp[len(shape)]:
            return False  # (the batch axis must not be padded: the map covers one batch row)
        S = 1
        for d in shape[1:]:
            S *= d
        pos = np.arange(1, S + 1, dtype=np.int64).reshape((1,) + tuple(shape[1:]))  # 0: a constant pad
        try:
            pos = _padded(pos, mode, pp, axes)
        except Exception:  # noqa: BLE001 - the generic kernel reports it
            return False
        if pos.ndim != 3:
            return False
        p = plan_for((shape[0],) + pos.shape[1:])
        if p is False:
            return False
        wl, idx, tail = p
        C, Lp = pos.shape[1], pos.shape[2]
        if idx.__class__ is tuple:  # a single plain tap: as a gather with a bias row
            a, b = idx
            idx = np.empty((C + 1, b - a), np.intp)
            idx[:C] = np.arange(C)[:, None] * Lp + np.arange(a, b)[None, :]
            idx[C] = C * Lp + 1
            wl = np.concatenate((wl, np.zeros((M, 1), dt) if tail is None else tail), axis=1)
            tail = np.zeros((shape[0], 2), dt)  # (the gather's appended 0 and 1, as the gather plans carry)
            tail[:, 1] = 1
        flat = pos.reshape(-1) - 1  # padded position -> position in the batch row (-1: a constant pad)
        real = idx < C * Lp
        out = np.where(real, flat[np.where(real, idx, 0)], -1)
        out[out < 0] = S  # zeros: constant padding and the convolution's own padding
        out[idx == C * Lp + 1] = S + 1  # the bias row's ones
        wl = np.ascontiguousarray(wl)
        wl.flags.writeable = False
        return wl, out.astype(np.intp), tail

    def run(X, Wr, Br=None):
        if type(X) is not np.ndarray or X.dtype != dt or Wr is not W or Br is not B:
            return generic(X, Wr, Br)
        shape = X.shape
        ent = memo.get(shape)
        if ent is None:
            ent = build(shape)
            if len(memo) < _PLANS_MAX:
                memo[shape] = ent
        if ent is False:
            return generic(X, Wr, Br)
        wl, idx, tail = ent
        N = shape[0]
        ext = np.concatenate((X.reshape(N, -1), tail), axis=1)
        if N == 1:
            return _dot2(wl, ext.take(idx)).reshape(1, M, idx.shape[1])
        return np.matmul(wl, ext[:, idx])

    return run


pad_conv.specialize = _pad_conv_specialize


# ----------------------------------------------------------------------------------------------------- GemmSum
@kernel("GemmSum", domain=DOMAIN)
def gemm_sum(A, W1, C1, B, W2, C2, *, transB=0):
    """Gemm(A, W1, C1) + Gemm(B, W2, C2) (alpha = beta = 1, transA = 0, both with ``transB``), written by the level-99
    GemmSumFusion (optimizer/fusions_speed.py) for an LSTM cell exported as primitives (silero-vad's "ifless"
    models: h R^T + b_hh + x W^T + b_ih).  Generic: the two Gemms and the Add, broadcasting included."""
    from .linalg import _gemm

    return _gemm(A, W1, C1, 1.0, 1.0, 0, transB) + _gemm(B, W2, C2, 1.0, 1.0, 0, transB)


def _gemm_sum_specialize(consts, kwargs):
    """Constant float32 weights and 1-D biases: one GEMM of [A B] with the weights stacked along K and the biases
    summed (same rows in A and B; anything else runs the generic kernel)."""
    if len(consts) != 6:
        return None
    _, W1, C1, _, W2, C2 = consts
    arrs = (W1, C1, W2, C2)
    if any(not isinstance(a, np.ndarray) or a.dtype != np.float32 for a in arrs) or W1.ndim != 2 or W2.ndim != 2:
        return None
    t = int(kwargs.get("transB", 0))
    w1, w2 = (W1.T, W2.T) if t else (W1, W2)  # (K, N)
    N = w1.shape[1]
    if w2.shape[1] != N or C1.shape != (N,) or C2.shape != (N,):
        return None
    K1, K2 = w1.shape[0], w2.shape[0]
    wc = np.ascontiguousarray(np.concatenate((w1, w2), axis=0))
    cc = (C1.astype(np.float64) + C2).astype(np.float32)  # (one rounding of the summed biases)
    wc.flags.writeable = False
    cc.flags.writeable = False

    def run(A, W1r, C1r, B, W2r, C2r):
        if (type(A) is not np.ndarray or type(B) is not np.ndarray or A.dtype != np.float32 or B.dtype != np.float32
                or A.ndim != 2 or B.ndim != 2 or A.shape[0] != B.shape[0] or A.shape[1] != K1 or B.shape[1] != K2
                or W1r is not W1 or W2r is not W2 or C1r is not C1 or C2r is not C2):
            return gemm_sum(A, W1r, C1r, B, W2r, C2r, transB=t)
        y = _dot2(np.concatenate((A, B), axis=1), wc)
        y += cc
        return y

    return run


gemm_sum.specialize = _gemm_sum_specialize
