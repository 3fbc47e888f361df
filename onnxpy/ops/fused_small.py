"""onnxpy's level-99 fusions for small (streaming-audio) models, domain ai.onnxpy:

* PadConv: Pad (any mode, constant pads) -> [Unsqueeze] -> 1-D Conv, as one op (written by PadConvFusion,
  optimizer/fusions_speed.py; silero-vad's STFT pads its audio by reflection, adds a channel axis and runs a strided
  convolution with the Fourier basis).  The generic kernel runs the three ops in sequence.  With a constant filter
  the plan-time form composes the Pad's index map with the convolution's column gather (``conv._spec_conv1d``): the
  padding is never materialised, and the column matrix is one gather from the unpadded input.  The index map is the
  Pad kernel itself applied to an array of positions, so every mode (reflect, edge, wrap, constant zeros, negative
  pads) means exactly what the Pad op means.
* GemmSum: Gemm + Gemm -> Add (an LSTM cell exported as primitives) as one GEMM of the concatenated inputs.
* ConvShuffle: a grouped convolution [with FusedConv's activation] -> Reshape -> Transpose -> Reshape, ShuffleNet's
  channel shuffle (written by ConvShuffleFusion).  The generic kernel runs the ops in sequence; with a constant
  1x1 filter the plan-time form has each group's GEMM write its output channels straight to their shuffled places
  (every G-th channel: a strided matrix BLAS writes as is), so the shuffle's copy and its three nodes are gone.
"""

from __future__ import annotations

import functools

import numpy as np

from ._common import text
from . import _ew_math as _fast
from ._shape_util import NOT_CONST
from .contrib_fused import _fused_conv_tail, _params_short, fused_conv
from .conv import conv as _conv
from .linalg import _dot2
from .pad import pad_18 as _pad
from .registry import kernel
from .tensor import _reshape, _reshape_target, _unsqueeze

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
    mode = text(mode)
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


# ----------------------------------------------------------------------------------------------------- ConvShuffle
_SHUFFLE_PERM = (0, 2, 1, 3, 4)
_FOLD_BIAS = True  # (test and measurement hook: ConvShuffle's bias folded into its GEMMs)


@kernel("ConvShuffle", domain=DOMAIN)
def conv_shuffle(X, W, B=None, *, shape1=(), shape2=(), activation="", activation_params=None, auto_pad="NOTSET",
                 dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Reshape(Transpose(Reshape(Y, shape1), perm=[0, 2, 1, 3, 4]), shape2) with Y = Conv(X, W, B), or FusedConv's
    activation(Conv(X, W, B)) when ``activation`` is set (Reshape without allowzero)."""
    kw = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
              strides=strides)
    if activation:
        y = fused_conv(X, W, B, activation=activation, activation_params=activation_params, **kw)
    else:
        y = _conv(X, W, B, **kw)
    y = _reshape(y, list(shape1), 0)
    if y.ndim != 5:
        raise ValueError(f"ConvShuffle: shape1 {list(shape1)} must have 5 dimensions to be transposed by "
                         f"{list(_SHUFFLE_PERM)}")
    return _reshape(y.transpose(_SHUFFLE_PERM), list(shape2), 0)


def _shuffle_fits(N, M, G, H, W, shape1, shape2) -> bool:
    """Whether Reshape(shape1) of an (N, M, H, W) output splits its channels into (G, M // G) and Reshape(shape2)
    of the transposed (N, M // G, G, H, W) merges them back (0 copying a dimension, -1 inferred, as Reshape)."""
    n = M // G
    shaped = lambda dims: np.broadcast_to(np.empty((), np.uint8), dims)  # noqa: E731  (shape only, no memory)
    try:
        return (tuple(_reshape_target(shaped((N, M, H, W)), shape1, 0)) == (N, G, n, H, W)
                and tuple(_reshape_target(shaped((N, n, G, H, W)), shape2, 0)) == (N, M, H, W))
    except ValueError:
        return False


def _conv_shuffle_specialize(consts, kwargs):
    """A constant 1x1 grouped filter (stride 1, no padding) and bias: each group's GEMM writes its output rows to
    channels i, i + G, i + 2G, ... of the result (one strided matrix per group, which BLAS writes as is), the bias
    is added in shuffled order and the activation runs in place.  Other input shapes (or ones the reshapes do not
    split into the conv's groups) run the generic kernel."""
    if len(consts) < 2:
        return None
    W = consts[1]
    B = consts[2] if len(consts) > 2 else None
    if (type(W) is not np.ndarray or W.ndim != 4 or W.dtype not in (np.float32, np.float64) or W.shape[2:] != (1, 1)
            or B is NOT_CONST or B is not None and (type(B) is not np.ndarray or B.dtype != W.dtype
                                                    or B.size != W.shape[0])):
        return None
    G = int(kwargs.get("group", 1))
    M, Cg = W.shape[:2]
    auto_pad = text(kwargs.get("auto_pad")) or "NOTSET"
    act = text(kwargs.get("activation")) or ""
    params = list(kwargs.get("activation_params") or [])
    if (G < 2 or M % G or auto_pad not in ("NOTSET", "VALID") or any(kwargs.get("pads") or ())
            or any(int(v) != 1 for v in kwargs.get("strides") or ()) or any(int(v) != 1 for v in
                                                                            kwargs.get("dilations") or ())
            or list(kwargs.get("kernel_shape") or (1, 1)) != [1, 1] or act and _params_short(act, params)):
        return None
    shape1, shape2 = [int(v) for v in kwargs.get("shape1", ())], [int(v) for v in kwargs.get("shape2", ())]
    n = M // G
    w3 = np.ascontiguousarray(W.reshape(G, n, Cg))
    # shuffled channel j * G + i holds the conv's channel i * n + j
    bias = None if B is None else np.ascontiguousarray(B.reshape(G, n).T).reshape(M, 1)
    folded = bias is not None and n >= Cg and _FOLD_BIAS
    if folded:
        # the bias rides in the GEMMs on a row of ones (as _conv1x1 does where the output has at least as many
        # channels as the input: copying the input costs less than a pass over the output; ShuffleNet's first
        # ConvShuffle, 24 -> 112 channels on 56x56: 73 instead of 115 us)
        w3 = np.concatenate([w3, B.reshape(G, n, 1)], axis=2)
        bias = None
    generic = functools.partial(conv_shuffle, **kwargs)
    fits: dict = {}

    def run(X, *rest):
        if (type(X) is not np.ndarray or X.dtype != W.dtype or X.ndim != 4 or X.shape[1] != Cg * G or X.shape[0] == 0
                or rest[0] is not W or len(rest) > 1 and rest[1] is not B):
            return generic(X, *rest)
        N, _, H, Wd = X.shape
        ok = fits.get(X.shape)
        if ok is None:
            ok = _shuffle_fits(N, M, G, H, Wd, shape1, shape2)
            if len(fits) < _PLANS_MAX:
                fits[X.shape] = ok
        if not ok:
            return generic(X, *rest)
        P = H * Wd
        out = np.empty((N, n, G, P), dtype=W.dtype)
        src = X.reshape(N, G, Cg, P)
        if folded:
            cols = np.empty((N, G, Cg + 1, P), dtype=W.dtype)
            cols[:, :, :Cg] = src
            cols[:, :, Cg] = 1
            src = cols
        np.matmul(w3, src, out=out.transpose(0, 2, 1, 3))
        y = out.reshape(N, M, P)
        if bias is not None:
            y += bias
        y = y.reshape(N, M, H, Wd)
        if act == "Relu":
            return _fast.relu(y, y)
        return _fused_conv_tail(y, None, y.dtype, act, params) if act else y

    return run


conv_shuffle.specialize = _conv_shuffle_specialize
