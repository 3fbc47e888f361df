"""Internal ops (domain ``ai.onnxpy``) that onnxpy's own graph rewrites emit, e.g. the Gradient lowering."""

from __future__ import annotations

import numpy as np

from .registry import kernel

DOMAIN = "ai.onnxpy"


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
