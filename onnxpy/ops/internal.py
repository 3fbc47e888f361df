"""Internal ops (domain ``ai.onnxpy``) that onnxpy's own graph rewrites emit, e.g. the Gradient lowering."""

from __future__ import annotations

import numpy as np

from . import _ew_math as _fast
from .registry import kernel

DOMAIN = "ai.onnxpy"
# Elements per block of the blocked HardSwish (512 KiB of float32: the passes stay in L2).
_HSW_BLOCK = 1 << 17


@kernel("SumToShape", domain=DOMAIN)
def sum_to_shape(g, like):
    """Undo numpy broadcasting: sum ``g`` down to ``like``'s shape."""
    shape = np.shape(like)
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    out = g.sum(axis=tuple(range(extra))) if extra > 0 else g
    axes = tuple(i for i, (a, b) in enumerate(zip(out.shape, shape)) if b == 1 and a != 1)
    if axes:
        out = out.sum(axis=axes, keepdims=True)
    return out.reshape(shape).astype(g.dtype, copy=False)


@kernel("OnesLike", domain=DOMAIN)
def ones_like(x):
    return np.ones_like(x)


@kernel("ZerosLike", domain=DOMAIN)
def zeros_like(x):
    return np.zeros_like(x)


_UNARY_GRADS = {
    "Relu": lambda gy, x, y: gy * (x > 0),
    "Sigmoid": lambda gy, x, y: gy * y * (1 - y),
    "Tanh": lambda gy, x, y: gy * (1 - y * y),
    "Exp": lambda gy, x, y: gy * y,
    "Log": lambda gy, x, y: gy / x,
    "Sqrt": lambda gy, x, y: gy / (2 * y),
    "Abs": lambda gy, x, y: gy * np.sign(x),
    "Sin": lambda gy, x, y: gy * np.cos(x),
    "Cos": lambda gy, x, y: -gy * np.sin(x),
    "Reciprocal": lambda gy, x, y: -gy * y * y,
}


@kernel("UnaryGrad", domain=DOMAIN)
def unary_grad(gy, x, y, *, op=""):
    fn = _UNARY_GRADS.get(op)
    if fn is None:
        raise ValueError(f"no gradient rule for {op}")
    return np.asarray(fn(gy, x, y), dtype=gy.dtype)


@kernel("MatMulGrad", domain=DOMAIN)
def matmul_grad(gy, a, b):
    """Gradients of Y = A @ B (numpy matmul semantics, 1-D operands included) for A and B."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = gy
    if a.ndim == 1:
        g2 = np.expand_dims(g2, -2)
    if b.ndim == 1:
        g2 = np.expand_dims(g2, -1)
    ga = np.matmul(g2, np.swapaxes(b2, -1, -2))
    gb = np.matmul(np.swapaxes(a2, -1, -2), g2)
    ga = sum_to_shape(ga, a2).reshape(a.shape)
    gb = sum_to_shape(gb, b2).reshape(b.shape)
    return ga.astype(a.dtype, copy=False), gb.astype(b.dtype, copy=False)


# --- fused kernels written by the level-99 passes (onnxpy/optimizer/fusions_all.py) --------------------------------
def _fix_rank(y, rank):
    return y.reshape((1,) * (rank - y.ndim) + y.shape) if y.ndim < rank else y


@kernel("HardSwishLike", domain=DOMAIN)
def hard_swish_like(x, *, add=3.0, lo=None, hi=None, scale=6.0, scale_op="Div", scale_first=0, rank=0):
    """x * (clip(x + add, lo, hi) / scale) in the unfused graph's order (``scale_first``: divide before the Mul).

    Each step rounds exactly like the separate Add/Clip/Div/Mul nodes; only the temporaries are reused."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"HardSwishLike: float input expected, got {x.dtype}")
    dt = x.dtype
    if (add == 3.0 and lo == 0.0 and hi == 6.0 and (scale_op, scale) in (("Div", 6.0), ("Mul", float(dt.type(1 / 6))))
            and dt.itemsize >= 4):
        # the plain HardSwish: x * clip(x / 6 + 0.5, 0, 1) in one buffer (same value up to float rounding), in
        # blocks of _HSW_BLOCK elements for large tensors so the four passes run in cache
        if x.size <= 2 * _HSW_BLOCK or not x.flags.c_contiguous:
            t = np.multiply(x, dt.type(1 / 6))
            t += dt.type(0.5)
            _fast.clip(t, dt.type(0), dt.type(1), out=t)
            t *= x
            return _fix_rank(t, rank)
        out = np.empty(x.shape, dtype=dt)
        xf, of = x.reshape(-1), out.reshape(-1)
        c6, half, zero, one = dt.type(1 / 6), dt.type(0.5), dt.type(0), dt.type(1)
        for s in range(0, xf.size, _HSW_BLOCK):
            xs, t = xf[s:s + _HSW_BLOCK], of[s:s + _HSW_BLOCK]
            np.multiply(xs, c6, out=t)
            t += half
            _fast.clip(t, zero, one, out=t)
            t *= xs
        return _fix_rank(out, rank)
    t = np.add(x, np.asarray(add, dtype=dt))
    if lo is not None or hi is not None:
        np.clip(t, None if lo is None else np.asarray(lo, dtype=dt), None if hi is None else np.asarray(hi, dtype=dt),
                out=t)
    s = np.asarray(scale, dtype=dt)
    scale_fn = np.divide if scale_op == "Div" else np.multiply
    if scale_first:
        scale_fn(t, s, out=t)
        np.multiply(x, t, out=t)
    else:
        np.multiply(x, t, out=t)
        scale_fn(t, s, out=t)
    return _fix_rank(t, rank)


@kernel("HardSigmoidMul", domain=DOMAIN)
def hard_sigmoid_mul(x, *, alpha=0.2, beta=0.5, rank=0):
    """x * HardSigmoid(x) with HardSigmoid's own numerics (computed in float32 at least, rounded once)."""
    from .activations import hard_sigmoid

    x = np.asarray(x)
    y = hard_sigmoid(x, alpha=alpha, beta=beta)
    if not y.flags.writeable or y is x:
        y = y.copy()
    np.multiply(x, y, out=y)
    return _fix_rank(y, rank)


@kernel("ConvBatchNorm", domain=DOMAIN)
def conv_batch_norm(X, W, B, scale, bias, mean, var, *, epsilon=1e-5, activation="", auto_pad="NOTSET",
                    dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv followed by test-mode BatchNormalization whose parameters are only known at run time.

    With ``k = scale / sqrt(var + eps)`` and ``c = bias - mean * k`` the filter is scaled per output channel
    (``W * k``, then ``+ (B * k + c)`` in place) when the filter is small next to the output, else the output is
    scaled in place; anything unusual (other dtypes, parameter shapes) runs the two ops one after the other.
    ``activation`` "Relu" follows."""
    from .conv import conv
    from .normalization import _bn_affine, batch_normalization_9

    cattrs = dict(auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads,
                  strides=strides)
    ps = [np.asarray(p) if p is not None else None for p in (scale, bias, mean, var)]
    X, W = np.asarray(X), np.asarray(W)
    dt = X.dtype
    M = W.shape[0] if W.ndim >= 1 else -1
    fast = (dt in (np.float32, np.float64) and W.dtype == dt and X.ndim >= 3 and W.ndim == X.ndim
            and all(p is not None and p.dtype == dt and p.shape == (M,) for p in ps)
            and (B is None or (np.asarray(B).dtype == dt and np.shape(B) == (M,))))
    if fast:
        k, c = _bn_affine(ps, (M,), dt, epsilon)  # cached while the parameters are read-only arrays
        kshape = (M,) + (1,) * (W.ndim - 1)
        est_out = X.shape[0] * M * int(np.prod(X.shape[2:])) // max(1, int(np.prod(strides or [1])))
        if W.size <= 2 * est_out:  # scaling the filter is cheaper than two passes over the output
            w2 = W * k.reshape(kshape)
            if B is not None:
                c = c + np.asarray(B) * k
            y = conv(X, w2, None, **cattrs)
            k = None
        else:  # big filter, small output (late layers): scale the output in place
            y = conv(X, W, B, **cattrs)
        if not (isinstance(y, np.ndarray) and y.flags.writeable and y.dtype == dt):
            y = np.array(y, dtype=dt)
        oshape = (1, M) + (1,) * (X.ndim - 2)
        if k is not None:
            y *= k.reshape(oshape)
        y += c.reshape(oshape)
    else:
        y = batch_normalization_9(conv(X, W, B, **cattrs), *ps, epsilon=epsilon)
    if activation == "Relu":
        if not (isinstance(y, np.ndarray) and y.flags.writeable):
            y = np.array(y)
        _fast.relu(y, y)
    elif activation:
        raise ValueError(f"ConvBatchNorm: unsupported activation {activation!r}")
    return y
