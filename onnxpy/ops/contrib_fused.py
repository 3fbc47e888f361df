"""com.microsoft fused element-wise / matmul / conv ops (onnxruntime contrib semantics).

Gelu, FastGelu, BiasGelu, QuickGelu, BiasSoftmax, BiasAdd, FusedMatMul, TransposeMatMul, FusedGemm, FusedConv;
onnxpy's own level-99 fusions MatMulBias(Gelu), FeedForward, ConvAdd and ConvConcat (domain ai.onnxpy).

float16/bfloat16 inputs are computed in float32 and cast back; float64 stays float64.
"""

from __future__ import annotations

import math

import numpy as np

from . import _ew_math as _fast
from . import _packed
from ._common import F32 as _F32, text
from ._common import F64 as _F64
from ._common import float_arr as _float_arr
from .activations import _blockwise, _gelu_erf_block, _gelu_tanh_block
from . import conv as _conv_mod
from ._spatial import conv_out_shape
from .conv import conv as _conv
from .linalg import _gemm, _matmul_bias_generic, _mm, _to_f32
from .linalg import _mm_rows as _matmul
from .registry import MS_DOMAIN, kernel
from .tensor import _concat, replay_reshapes


def _up(x: np.ndarray) -> np.ndarray:
    return x if x.dtype in (_F32, _F64) else _fast.to_f32(x)


def _last_dim_bias(x: np.ndarray, bias, op: str, name: str = "bias") -> np.ndarray:
    """x + bias where bias is 1-D over the last dimension (or any shape that broadcasts to x)."""
    if bias is None:
        return x
    b = _float_arr(bias, op, name)
    try:
        if np.broadcast_shapes(b.shape, x.shape) != x.shape:
            raise ValueError
    except ValueError:
        raise ValueError(f"{op}: {name} of shape {b.shape} does not broadcast to input shape {x.shape}") from None
    return x + b.astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------------------------------------- GELUs
_GELU_BLOCK = 32768
_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _fits(b_shape, x_shape) -> bool:
    try:
        return np.broadcast_shapes(b_shape, x_shape) == x_shape
    except ValueError:
        return False


def _gelu_tanh_part(lo, hi, fs, fd):
    _gelu_tanh_block(fs[lo:hi], fd[lo:hi])  # (its exp2 overflow is silenced inside)


def _gelu(x: np.ndarray, bias, op: str, approx: bool, donated=()) -> np.ndarray:
    """Gelu(x [+ bias]) in x's type; float32 work is done block by block into one buffer: x itself when the
    executor donated it (see registry: ``_donated``), else a fresh one."""
    xf = _up(x)
    bname = "B" if op == "BiasGelu" else "bias"
    if xf.dtype != _F32 or xf.ndim == 0:
        s = _last_dim_bias(xf, bias, op, bname)
        return _blockwise(_gelu_tanh_block if approx else _gelu_erf_block, s).astype(x.dtype, copy=False)
    own = 0 in donated and xf is x and x.flags.writeable and x.flags.c_contiguous
    if bias is not None:
        b = _float_arr(bias, op, bname)
        if (own or xf is not x) and b.dtype == _F32 and b.ndim <= x.ndim and _fits(b.shape, x.shape):
            src = np.add(xf, b, out=xf)
        else:
            src = _last_dim_bias(xf, b, op, bname)  # fresh: work in place
        dst = src
    else:
        src = xf
        dst = xf if own or xf is not x else np.empty(xf.shape, dtype=_F32)  # xf is fresh when x was upcast
    if not approx:
        return _fast.gelu_erf32(src, dst).astype(x.dtype, copy=False)
    n = src.size
    fs = src.reshape(-1)
    fd = dst.reshape(-1)
    if not _fast.split_passes(_gelu_tanh_part, n, fs, fd):
        for i in range(0, n, _GELU_BLOCK):
            _gelu_tanh_block(fs[i:i + _GELU_BLOCK], fd[i:i + _GELU_BLOCK])
    return dst.astype(x.dtype, copy=False)


@kernel("Gelu", since=1, domain=MS_DOMAIN)
def ms_gelu(X, *, _donated=()):
    x = _float_arr(X, "Gelu", "X")
    return _gelu(x, None, "Gelu", False, _donated)


@kernel("BiasGelu", since=1, domain=MS_DOMAIN)
def bias_gelu(A, B, *, _donated=()):
    a = _float_arr(A, "BiasGelu", "A")
    return _gelu(a, B, "BiasGelu", False, _donated)


def _matmul_bias_gelu_generic(A, B, bias):
    op = "MatMulBiasGelu"
    a = _float_arr(A, op, "A")
    w = _float_arr(B, op, "B")
    if a.dtype != w.dtype:
        raise TypeError(f"{op}: A and B must have the same type, got {a.dtype} and {w.dtype}")
    dt = a.dtype
    a = _up(a)
    w = _up(w) if w.dtype in (_F32, _F64) else _to_f32(w)
    if w.ndim == 2 and a.ndim >= 1 and a.shape[-1] == w.shape[0]:
        y = _matmul(a, w)  # a fresh product: the GELU runs on it in place
    else:
        y = np.array(_mm(op, a, w), copy=True)
    return _gelu(y, bias, "BiasGelu", False, (0,)).astype(dt, copy=False)


@kernel("MatMulBiasGelu", domain="ai.onnxpy")
def matmul_bias_gelu(A, B, bias):
    """BiasGelu(MatMul(A, B), bias) (written by the level-99 MatMulBiasGeluFusion, optimizer/fusions.py).

    The product is formed in the compute type (float32 for float16/bfloat16) and the bias and GELU applied to
    it in place, so a narrow-float model rounds once instead of after the MatMul and again after the BiasGelu.
    """
    return _matmul_bias_gelu_generic(A, B, bias)


def _matmul_bias_gelu_specialize(consts, kwargs):
    """A constant 2-D weight of a narrow float: converted to float32 once, per plan."""
    if len(consts) != 3:
        return None
    w = consts[1]
    if not isinstance(w, np.ndarray) or w.ndim != 2 or w.dtype.kind not in "fV":
        return None
    dt = w.dtype
    w32 = w if dt in (_F32, _F64) else np.array(w, _F32, order="K")  # (layout kept: linalg.matmul_w)
    generic = _matmul_bias_gelu_generic

    def run(A, B, bias):
        if type(A) is not np.ndarray or A.dtype != dt or A.ndim == 0 or A.shape[-1] != w32.shape[0]:
            return generic(A, B, bias)
        y = _matmul(_up(A), w32)
        return _gelu(y, bias, "BiasGelu", False, (0,)).astype(dt, copy=False)

    return run


matmul_bias_gelu.specialize = _matmul_bias_gelu_specialize


_FF_ACTIVATIONS = ("gelu", "gelu_tanh")


def _ff_activation(activation) -> bool:
    """True for FeedForward's tanh-approximated GELU (FastGelu), False for the exact one; ValueError otherwise."""
    act = activation.decode() if isinstance(activation, bytes) else str(activation)
    if act not in _FF_ACTIVATIONS:
        raise ValueError(f"FeedForward: activation must be one of {_FF_ACTIVATIONS}, got {act!r}")
    return act == "gelu_tanh"


def _check_view(rows: int, F: int, view_shape, allowzero, flat_shape=None, flat_allowzero=0) -> None:
    """The Reshapes FeedForwardTanhFusion removed -- the first product's (rows, F) result viewed as ``view_shape``
    before the GELU and that view as ``flat_shape`` after it (None: a constant [-1, F]) -- raise what they would have
    raised for this input, and the second product's input must come out (rows, F) as its Gemm requires."""
    if view_shape is None:
        return
    shape = replay_reshapes((rows, F), (view_shape,), (allowzero,))
    if flat_shape is not None:
        flat = replay_reshapes(shape, (flat_shape,), (flat_allowzero,))
        if flat != (rows, F):
            raise ValueError(f"Gemm: A must be 2-D with {F} columns, got shape {list(flat)}")


@kernel("FeedForward", domain="ai.onnxpy")
def feed_forward(A, W1, b1, W2, b2, view_shape=None, flat_shape=None, *, activation="gelu", view_allowzero=0,
                 flat_allowzero=0):
    """MatMulBias(MatMulBiasGelu(A, W1, b1), W2, b2): a transformer's feed-forward block (written by the level-99
    FeedForwardFusion, optimizer/fusions.py); with ``activation="gelu_tanh"`` the GELU is FastGelu's tanh
    approximation (FeedForwardTanhFusion: GPT-2's MLP, whose first product the graph viewed as ``view_shape``
    before the GELU: that Reshape's errors are kept).  Exactly the ops in sequence; the float32 plan-time form runs
    the block on packed weights (see ``_feed_forward_specialize``)."""
    if view_shape is not None:
        _check_view(int(np.prod(np.shape(A)[:-1], dtype=np.int64)), np.shape(W1)[-1], view_shape, view_allowzero,
                    flat_shape, flat_allowzero)
    if _ff_activation(activation):
        h = _matmul_bias_generic(A, W1, b1)
        h = _gelu(h, None, "FastGelu", True, (0,) if isinstance(h, np.ndarray) and h.flags.writeable else ())
        return _matmul_bias_generic(h, W2, b2)
    return _matmul_bias_generic(_matmul_bias_gelu_generic(A, W1, b1), W2, b2)


# FeedForward's intermediate kept as the two threads' column blocks, each thread applying the GELU to its own block
# right after its share of the first product (``_packed.matmul_split``): the GELU reads what its thread just wrote,
# in flat passes, and needs no hand-off of its own (test and measurement hook)
FF_SPLIT = True
# ... and the second product split by depth over those blocks, each thread multiplying its own block into all outputs
# (``_packed.matmul_ksplit``; test and measurement hook)
FF_KSPLIT = True
FF_ONE = True


def _gelu_in_place(block: np.ndarray) -> None:
    flat = block.reshape(-1)
    _fast._gelu_part(0, flat.size, flat, flat)


def _gelu_tanh_in_place(block: np.ndarray) -> None:
    flat = block.reshape(-1)
    for i in range(0, flat.size, _GELU_BLOCK):
        part = flat[i:i + _GELU_BLOCK]
        _gelu_tanh_block(part, part)


def _feed_forward_specialize(consts, kwargs):
    """Constant float32 weights and biases: the block computed on transposed activations, h^T = W1^T x^T and
    y^T = W2^T h^T.  OpenBLAS runs these GEMMs (hidden x rows outputs) 15-25% faster than x W1 (rows x hidden) at
    transformer shapes, and the wide intermediate h (rows x 3072 in BERT-base) is never transposed back: only x
    (rows x 768) is transposed going in, and y coming out in the pass that adds b2.  The weights are Fortran-ordered
    at level 99 (optimizer ``_fortran_weights``), so W^T is their C-contiguous view (no copy)."""
    if len(consts) not in (5, 6, 7) or any(not isinstance(c, np.ndarray) for c in consts[1:5]):
        return None
    tanh = _ff_activation(kwargs.get("activation", "gelu"))
    allowzero = kwargs.get("view_allowzero", 0)
    flat_az = kwargs.get("flat_allowzero", 0)
    epilogue = _gelu_tanh_in_place if tanh else _gelu_in_place

    def check_views(rows, F, rest):  # (the Reshapes FeedForwardTanhFusion removed, when their targets came along)
        if len(rest) > 4:
            _check_view(rows, F, rest[4], allowzero, rest[5] if len(rest) > 5 else None, flat_az)

    def gelu_whole(a):  # (the whole intermediate at once: split between the threads when large)
        if tanh:
            _gelu(a, None, "FastGelu", True, (0,))
        else:
            _fast.gelu_erf32(a, a)

    _, w1, c1, w2, c2 = consts[:5]
    if (any(c.dtype != _F32 for c in (w1, c1, w2, c2)) or w1.ndim != 2 or w2.ndim != 2 or c1.shape != (w1.shape[1],)
            or c2.shape != (w2.shape[1],) or w2.shape[0] != w1.shape[1]):
        return None
    p1 = _packed.pack(w1)
    p2 = _packed.pack(w2) if p1 is not None else None
    if p2 is not None:  # both weights packed once for OpenBLAS's kernel (ops._packed); the plan releases them
        H1, F = w1.shape
        H2 = w2.shape[1]  # (the closure keeps no reference to the weights: the plan releases them)
        ld = _packed.out_pitch(F)  # (the intermediate never leaves: its rows may lie further apart)

        def run_packed(A, *rest):
            if type(A) is not np.ndarray or A.dtype != _F32 or A.ndim < 2 or A.shape[-1] != H1 or A.size == 0 or (
                    rest[1] is not c1 or rest[3] is not c2):
                return feed_forward(A, *[_packed.real(r) for r in rest], **kwargs)
            rows = A.size // H1
            check_views(rows, p1.N, rest)
            a2 = A.reshape(rows, H1)
            if FF_ONE and FF_SPLIT and FF_KSPLIT:
                y = _packed.matmul_chain(a2, p1, c1, epilogue, p2, c2)
                if y is not None:
                    return y.reshape(A.shape[:-1] + (H2,))
            # the intermediate as the threads' column blocks, each GELU'd by its own thread right after its product
            pieces = _packed.matmul_split(a2, p1, c1, epilogue, p2.Q) if FF_SPLIT else None
            if pieces is None:
                hb = np.empty((rows, ld), _F32)
                if ld > F:
                    hb[:, F:] = 0  # (spare columns: the GELU pass runs over them too)
                h = _packed.matmul(a2, p1, c1, out=hb)
                gelu_whole(hb)
                # (the helpers were busy: the second product still sums in the split's order, so that a run's
                # result does not depend on whether another run held the helpers)
                cut = _packed.split_cut(rows, p1, p2.Q) if FF_SPLIT and FF_KSPLIT else None
                if cut is None:
                    return _packed.matmul(h, p2, c2).reshape(A.shape[:-1] + (H2,))
                pieces = [(0, h[:, :cut]), (cut, h[:, cut:])]
            y = _packed.matmul_ksplit(pieces, p2, c2) if FF_KSPLIT else None
            if y is None:
                y = _packed.matmul(pieces, p2, c2)
            return y.reshape(A.shape[:-1] + (H2,))

        run_packed.releases = (1, 3)
        return run_packed
    w1t = np.ascontiguousarray(w1.T)  # (F, H): a view when w1 is Fortran-ordered
    w2t = np.ascontiguousarray(w2.T)  # (H2, F)
    c1col = c1.reshape(-1, 1)
    H, F = w1.shape
    H2 = w2.shape[1]

    def run(A, *rest):
        if type(A) is not np.ndarray or A.dtype != _F32 or A.ndim < 2 or A.shape[-1] != H or A.size == 0 or (
                rest[0] is not w1 or rest[1] is not c1 or rest[2] is not w2 or rest[3] is not c2):
            return feed_forward(A, *rest, **kwargs)
        rows = A.size // H
        check_views(rows, w1.shape[1], rest)
        xt = np.ascontiguousarray(A.reshape(rows, H).T)  # (H, rows)
        ht = np.matmul(w1t, xt)  # (F, rows)
        ht += c1col
        gelu_whole(ht)
        yt = np.matmul(w2t, ht)  # (H2, rows)
        out = np.empty((rows, H2), _F32)
        np.add(yt.T, c2, out=out)
        return out.reshape(A.shape[:-1] + (H2,))

    return run


feed_forward.specialize = _feed_forward_specialize


@kernel("FastGelu", since=1, domain=MS_DOMAIN)
def fast_gelu(X, bias=None, *, _donated=()):
    x = _float_arr(X, "FastGelu", "X")
    return _gelu(x, bias, "FastGelu", True, _donated)


@kernel("QuickGelu", since=1, domain=MS_DOMAIN)
def quick_gelu(X, *, alpha=1.702):
    x = _float_arr(X, "QuickGelu", "X")
    xf = _up(x)
    s = _fast.sigmoid(xf * xf.dtype.type(alpha))
    s *= xf
    return s.astype(x.dtype, copy=False)


# ------------------------------------------------------------------------------------------------------- BiasAdd
@kernel("BiasAdd", since=1, domain=MS_DOMAIN)
def bias_add(X, bias, skip):
    op = "BiasAdd"
    x = _float_arr(X, op, "X")
    sk = _float_arr(skip, op, "skip")
    if x.ndim != 3:
        raise ValueError(f"{op}: X must be 3-D (N, S, C), got shape {x.shape}")
    if sk.shape != x.shape:
        raise ValueError(f"{op}: skip shape {sk.shape} must equal X shape {x.shape}")
    b = _float_arr(bias, op, "bias")
    if b.shape != (x.shape[-1],):
        raise ValueError(f"{op}: bias must be 1-D of length {x.shape[-1]}, got shape {b.shape}")
    y = _up(x) + _up(sk)
    y += _up(b)
    return y.astype(x.dtype, copy=False)


# --------------------------------------------------------------------------------------------------- BiasSoftmax
@kernel("BiasSoftmax", since=1, domain=MS_DOMAIN)
def bias_softmax(data, bias, *, axis=1, is_inner_broadcast=0):
    """softmax(data + bias) over the dimensions ``axis``.. (flattened).

    A bias of lower rank broadcasts across the dimensions ``[broadcast_axis, axis)`` when ``is_inner_broadcast``
    (it then holds the leading dimensions and the softmax dimensions), else across the leading dimensions
    (numpy's right-aligned rule).
    """
    op = "BiasSoftmax"
    x = _float_arr(data, op, "data")
    b = _float_arr(bias, op, "bias")
    r = x.ndim
    ax = axis + r if axis < 0 else axis
    if not 0 <= ax < max(r, 1):
        raise ValueError(f"{op}: axis {axis} is out of range for rank {r}")
    if b.ndim > r:
        raise ValueError(f"{op}: bias rank {b.ndim} exceeds data rank {r}")
    if b.ndim < r and is_inner_broadcast:
        n_lead = b.ndim - (r - ax)
        if n_lead < 0:
            raise ValueError(f"{op}: bias of shape {b.shape} lacks the softmax dimensions of data {x.shape}")
        b = b.reshape(b.shape[:n_lead] + (1,) * (r - b.ndim) + b.shape[n_lead:])
    try:
        if np.broadcast_shapes(b.shape, x.shape) != x.shape:
            raise ValueError
    except ValueError:
        raise ValueError(f"{op}: bias of shape {b.shape} does not broadcast to data shape {x.shape}") from None
    s = _up(x) + _up(b)
    if s.size == 0:
        return s.astype(x.dtype)
    lead = s.shape[:ax]
    s2 = s.reshape(math.prod(lead), -1)
    s2 = s2 - s2.max(axis=1, keepdims=True)
    np.exp(s2, out=s2)
    s2 /= s2.sum(axis=1, keepdims=True)
    return s2.reshape(x.shape).astype(x.dtype, copy=False)


# ----------------------------------------------------------------------------------------------------- MatMuls
def _fused_matmul(op, A, B, alpha, transA, transB, transBatchA, transBatchB):
    a = _float_arr(A, op, "A")
    b = _float_arr(B, op, "B")
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: A and B must have the same type, got {a.dtype} and {b.dtype}")
    if (transBatchA or transBatchB) and (a.ndim < 3 or a.ndim != b.ndim):
        raise ValueError(f"{op}: transBatchA/transBatchB need inputs of the same rank >= 3, got {a.shape} and "
                         f"{b.shape}")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{op}: inputs must have rank >= 1")
    dt = a.dtype
    if dt not in (_F32, _F64):
        a = a.astype(_F32)
        b = _to_f32(b)  # before the transposes: the cache knows the (constant) weight, not a fresh view of it
    if transBatchA:
        a = np.moveaxis(a, 0, -2)
    if transBatchB:
        b = np.moveaxis(b, 0, -2)
    if transA and a.ndim >= 2:
        a = np.swapaxes(a, -1, -2)
    if transB and b.ndim >= 2:
        b = np.swapaxes(b, -1, -2)
    try:
        if a.ndim > 2 and b.ndim == 2 and a.shape[-1] == b.shape[0] and a.flags.c_contiguous:
            # (..., M, K) @ (K, N): one large GEMM instead of a loop of small ones
            y = np.matmul(a.reshape(math.prod(a.shape[:-1]), a.shape[-1]), b).reshape(a.shape[:-1] + (b.shape[1],))
        else:
            y = np.matmul(a, b)
    except ValueError:
        raise ValueError(f"{op}: incompatible shapes {a.shape} and {b.shape} after the transposes") from None
    if alpha != 1.0:
        y *= y.dtype.type(alpha)
    return y.astype(dt, copy=False)


@kernel("FusedMatMul", since=1, domain=MS_DOMAIN)
def fused_matmul(A, B, *, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
    return _fused_matmul("FusedMatMul", A, B, float(alpha), transA, transB, transBatchA, transBatchB)


@kernel("TransposeMatMul", since=1, domain=MS_DOMAIN)
def transpose_matmul(A, B, *, alpha=1.0, transA=0, transB=0):
    return _fused_matmul("TransposeMatMul", A, B, float(alpha), transA, transB, 0, 0)


# ---------------------------------------------------------------------------------------------- fused activations
def _activate(y: np.ndarray, name: str, op: str, alpha=None, beta=None, gamma=None) -> np.ndarray:
    """Apply the activation ``name`` (onnxruntime's fused-activation names) to the float32/64 array y in place."""
    t = y.dtype.type
    if name in (None, "", "Identity"):
        return y
    if name == "Relu":
        return _fast.relu(y, y)
    if name == "Tanh":
        return np.tanh(y, out=y)
    if name == "Sigmoid":
        if y.size <= 4096 and y.ndim:  # in place, one block, no errstate: as the Sigmoid kernel's small path
            return _fast.sigmoid_into(y, y)
        return _fast.sigmoid(y)
    if name == "LeakyRelu":
        a = t(0.01 if alpha is None else alpha)
        return np.where(y >= 0, y, y * a).astype(y.dtype, copy=False)
    if name == "Clip":
        lo = -np.inf if alpha is None else alpha
        hi = np.inf if beta is None else beta
        return _fast.clip(y, t(lo), t(hi), out=y)
    if name == "HardSigmoid":
        a = t(0.2 if alpha is None else alpha)
        b = t(0.5 if beta is None else beta)
        y *= a
        y += b
        return _fast.clip(y, t(0), t(1), out=y)
    if name == "Elu":
        a = t(1.0 if alpha is None else alpha)
        return np.where(y >= 0, y, a * np.expm1(np.minimum(y, 0))).astype(y.dtype, copy=False)
    if name == "Selu":
        a = t(1.6732632423543772 if alpha is None else alpha)
        g = t(1.0507010221481445 if gamma is None else gamma)
        return (g * np.where(y > 0, y, a * np.expm1(np.minimum(y, 0)))).astype(y.dtype, copy=False)
    if name == "ScaledTanh":
        a = t(1.0 if alpha is None else alpha)
        b = t(1.0 if beta is None else beta)
        return (a * np.tanh(b * y)).astype(y.dtype, copy=False)
    if name == "ThresholdedRelu":
        a = t(1.0 if alpha is None else alpha)
        return np.where(y > a, y, t(0)).astype(y.dtype, copy=False)
    if name == "Softplus":
        return np.logaddexp(y, t(0)).astype(y.dtype, copy=False)
    if name == "ParametricSoftplus":
        a = t(1.0 if alpha is None else alpha)
        b = t(1.0 if beta is None else beta)
        return (a * np.logaddexp(b * y, t(0))).astype(y.dtype, copy=False)
    if name == "Softsign":
        return (y / (1 + np.abs(y))).astype(y.dtype, copy=False)
    raise ValueError(f"{op}: unsupported activation {name!r}")


@kernel("FusedGemm", since=1, domain=MS_DOMAIN)
def fused_gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, activation="", activation_alpha=None,
               activation_beta=None, activation_gamma=None):
    a = _float_arr(A, "FusedGemm", "A")
    y = _gemm(_up(a), _up(_float_arr(B, "FusedGemm", "B")), None if C is None else _up(np.asarray(C)),
              alpha, beta, transA, transB)
    if not y.flags.writeable or y.base is not None:
        y = y.copy()
    y = _activate(y, activation, "FusedGemm", activation_alpha, activation_beta, activation_gamma)
    return y.astype(a.dtype, copy=False)


_ACT_PARAM_COUNT = {"LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2, "Elu": 1, "ScaledTanh": 2, "ThresholdedRelu": 1,
                    "ParametricSoftplus": 2, "Selu": 2}


def _params_short(activation: str, params) -> bool:
    """True when an activation that needs parameters (LeakyRelu, Clip, HardSigmoid) has fewer than it needs."""
    return activation in ("LeakyRelu", "Clip", "HardSigmoid") and len(params) < _ACT_PARAM_COUNT.get(activation, 0)


@kernel("FusedConv", since=1, domain=MS_DOMAIN)
def fused_conv(X, W, B=None, Z=None, *, activation="", activation_params=None, auto_pad="NOTSET", dilations=None,
               group=1, kernel_shape=None, pads=None, strides=None):
    op = "FusedConv"
    x = _float_arr(X, op, "X")
    params = list(activation_params or [])
    if _params_short(activation, params):
        raise ValueError(f"{op}: activation {activation} needs {_ACT_PARAM_COUNT[activation]} activation_params, "
                         f"got {len(params)}")
    y = _conv(_up(x), _up(_float_arr(W, op, "W")), None if B is None else _up(np.asarray(B)), auto_pad=auto_pad,
              dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides)
    y = np.array(y, copy=True) if not y.flags.writeable else y
    return _fused_conv_tail(y, Z, x.dtype, activation, params)


def _fused_conv_tail(y, Z, dt, activation, params):
    """FusedConv after the convolution: + Z, the activation, in place on the fresh output, back to ``dt``."""
    op = "FusedConv"
    if Z is not None:
        z = _float_arr(Z, op, "Z")
        if z.shape != y.shape:
            raise ValueError(f"{op}: Z of shape {z.shape} must match the convolution output shape {y.shape}")
        y += z.astype(y.dtype, copy=False)
    p = params + [None] * 3
    if activation == "Selu":
        y = _activate(y, activation, op, p[0], None, p[1])
    else:
        y = _activate(y, activation, op, p[0], p[1])
    return y.astype(dt, copy=False)


def _fused_conv_specialize(consts, kwargs):
    """Constant float32/float64 weights: the plan-time convolution of Conv (see ``conv._spec_conv``) plus the tail."""
    conv_kw = {k: v for k, v in kwargs.items() if k not in ("activation", "activation_params")}
    fast = _conv.specialize(consts[:3], conv_kw)
    if fast is None:
        return None
    activation = kwargs.get("activation", "")
    params = list(kwargs.get("activation_params") or [])
    if _params_short(activation, params):
        return None  # the generic kernel reports it
    generic = fused_conv
    W = consts[1]
    relu = activation == "Relu"
    zero = _fast.zero(W.dtype)
    clip_min = _fast.CLIP_MIN

    def run(X, Wr, B=None, Z=None):
        if type(X) is not np.ndarray or X.dtype != W.dtype:
            return generic(X, Wr, B, Z, **kwargs)
        y = fast(X, Wr, B) if B is not None else fast(X, Wr)
        if not y.flags.writeable:
            y = np.array(y, copy=True)
        if relu and Z is None:  # (small outputs, silero-vad's, call numpy's maximum directly: ~1% of its run)
            return _fast.relu(y, y) if y.size >= clip_min else np.maximum(y, zero, out=y)
        return _fused_conv_tail(y, Z, X.dtype, activation, params)

    return run


fused_conv.specialize = _fused_conv_specialize


# --------------------------------------------------------------------------------------------------------- ConvAdd
@kernel("ConvAdd", domain="ai.onnxpy")
def conv_add(X, W, B=None, Z=None, *, activation="", auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
             pads=None, strides=None):
    """activation(Conv(X, W, B) + Z), Add's broadcasting included; activation "" or "Relu" (written by the level-99
    ConvResidualFusion, optimizer/fusions_speed.py: a residual connection).  The plan-time form accumulates the
    convolution straight into Z when the executor hands Z over (see ``_conv_add_specialize``)."""
    op = "ConvAdd"
    if activation not in ("", "Relu"):
        raise ValueError(f"{op}: unsupported activation {activation!r} (expected '' or 'Relu')")
    y = _conv(X, W, B, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
              strides=strides)
    return _conv_add_tail(y, Z, activation == "Relu")


def _conv_add_tail(y, Z, relu):
    """y + Z (in place on a fresh, writeable y of Z's shape and type), then ReLU in place."""
    if Z is None:
        raise ValueError("ConvAdd: input Z (the residual) is required")
    if (type(y) is np.ndarray and y.flags.writeable and type(Z) is np.ndarray and Z.shape == y.shape
            and Z.dtype == y.dtype):
        y += Z
    else:
        y = np.add(y, Z)
    if relu:
        _fast.relu(y, y)
    return y


def _conv_add_specialize(consts, kwargs):
    """Constant float weights (the plan-time Conv, ``conv._spec_conv``): a handed-over Z (donated, see
    execution/plan.py) of the output's shape receives the convolution in place -- the float32 GEMMs accumulate into it
    (BLAS beta = 1), so the residual add costs no pass of its own; otherwise the convolution then the add."""
    if len(consts) != 4 or kwargs.get("activation", "") not in ("", "Relu"):
        return None
    conv_kw = {k: v for k, v in kwargs.items() if k != "activation"}
    fast = _conv.specialize(consts[:3], conv_kw)
    into = getattr(fast, "into", None)
    if into is None:
        return None
    relu = kwargs.get("activation", "") == "Relu"

    def run(X, Wr, B, Z, *, _donated=()):
        if 3 in _donated:
            y = into(X, Z)
            if y is not None:
                return _fast.relu(y, y) if relu else y
        y = fast(X, Wr, B) if B is not None else fast(X, Wr)
        return _conv_add_tail(y, Z, relu)

    run.donates = True
    return run


conv_add.specialize = _conv_add_specialize


# ------------------------------------------------------------------------------------------------------ ConvConcat
def _member_attrs(k, pads, strides, dilations, groups, op):
    """Per-member (pads, strides, dilations, group) of a ConvConcat with k members (4, 2, 2 and 1 values each)."""
    pads, strides, dilations, groups = (list(v or ()) for v in (pads, strides, dilations, groups))
    if len(pads) != 4 * k or len(strides) != 2 * k or len(dilations) != 2 * k or len(groups) != k:
        raise ValueError(f"{op}: {k} members need 4 pads, 2 strides, 2 dilations and 1 group each, got "
                         f"{len(pads)}, {len(strides)}, {len(dilations)} and {len(groups)}")
    return [(pads[4 * i:4 * i + 4], strides[2 * i:2 * i + 2], dilations[2 * i:2 * i + 2], int(groups[i]))
            for i in range(k)]


@kernel("ConvConcat", domain="ai.onnxpy")
def conv_concat(*inputs, activation="", activation_params=None, pads=None, strides=None, dilations=None,
                groups=None):
    """Concat(axis=1) of 2-D FusedConv(X_i, W_i, B_i) with one shared activation (written by the level-99
    ConvConcatFusion, optimizer/fusions_all.py): inputs X_1, W_1, B_1, X_2, ... (an absent bias is ''), the members'
    pads / strides / dilations / groups concatenated in the attributes.  Exactly the convolutions then the Concat;
    the plan-time form writes each convolution into its channel range of the output (no concatenation copy)."""
    op = "ConvConcat"
    if len(inputs) < 3 or len(inputs) % 3:
        raise ValueError(f"{op}: expects (X, W, B) triples, got {len(inputs)} inputs")
    k = len(inputs) // 3
    members = _member_attrs(k, pads, strides, dilations, groups, op)
    ys = [fused_conv(inputs[3 * i], inputs[3 * i + 1], inputs[3 * i + 2], activation=activation,
                     activation_params=activation_params, pads=p, strides=s, dilations=d, group=g)
          for i, (p, s, d, g) in enumerate(members)]
    return _concat(ys, 1)


def _conv_concat_specialize(consts, kwargs):
    """Constant float32/float64 filters (and biases): the output is allocated once and each member's convolution
    (``conv._conv2d_fast``) writes its channel range -- the GEMM paths straight into it -- then the activation
    runs once over the whole.  Anything unusual (another dtype, shapes that do not line up, a case the fast paths
    decline) runs the generic kernel, which reports errors as before."""
    if len(consts) < 6 or len(consts) % 3:
        return None
    k = len(consts) // 3
    try:
        members = _member_attrs(k, kwargs.get("pads"), kwargs.get("strides"), kwargs.get("dilations"),
                                kwargs.get("groups"), "ConvConcat")
    except ValueError:
        return None
    activation = kwargs.get("activation", "")
    activation = text(activation)
    params = list(kwargs.get("activation_params") or [])
    if _params_short(activation, params):
        return None
    ws, bs = consts[1::3], consts[2::3]
    if any(type(w) is not np.ndarray or w.ndim != 4 or w.dtype not in (_F32, _F64) for w in ws):
        return None
    dt = ws[0].dtype
    spec = []
    for w, b, (p, s, d, g) in zip(ws, bs, members):
        if (w.dtype != dt or b is not None and (type(b) is not np.ndarray or b.dtype != dt or b.size != w.shape[0])
                or min(p) < 0 or min(s) < 1 or min(d) < 1 or g < 1 or w.shape[0] % g):
            return None
        spec.append((w, b, None if b is None else b.reshape(-1), (p[0], p[1]), (p[2], p[3]), tuple(s), tuple(d), g,
                     w.shape[1] * g))
        if g == 1 and max(s) <= 2 and w.shape[2] * w.shape[3] > 1:
            _conv_mod._conv_packed.register(w)  # (packed on first use where that path applies: conv._conv2d_fast)
    bounds = np.cumsum([0] + [w.shape[0] for w in ws]).tolist()
    relu = activation == "Relu"
    generic = conv_concat

    def run(*args):
        xs = args[0::3]
        shape = None
        for i, (w, b, _, pb, pe, s, d, _, C) in enumerate(spec):
            x = xs[i]
            if (type(x) is not np.ndarray or x.dtype != dt or x.ndim != 4 or x.shape[1] != C
                    or args[3 * i + 1] is not w or args[3 * i + 2] is not b):
                return generic(*args, **kwargs)
            try:
                o = (x.shape[0],) + tuple(conv_out_shape(x.shape[2:], w.shape[2:], s, d, pb, pe, "ConvConcat"))
            except ValueError:
                return generic(*args, **kwargs)
            if shape is None:
                shape = o
            elif o != shape:
                return generic(*args, **kwargs)  # (reports the mismatch)
        out = np.empty((shape[0], bounds[-1]) + shape[1:], dtype=dt)
        for i, (w, b, bv, pb, pe, s, d, g, _) in enumerate(spec):
            if _conv_mod._conv2d_fast(xs[i], w, bv, pb, pe, s, d, g, (w, b), out=out[:, bounds[i]:bounds[i + 1]]) \
                    is None:
                return generic(*args, **kwargs)
        if relu:
            return _fast.relu(out, out)
        return _fused_conv_tail(out, None, dt, activation, params)

    return run


conv_concat.specialize = _conv_concat_specialize
