"""ai.onnx.preview.training optimizers: Adagrad, Adam, Momentum (standard and Nesterov), opset 1.

Each optimizer updates several tensors at once: the variadic inputs are ``X_1..X_n, G_1..G_n, <state>_1..``
and the outputs ``X_new_1..X_new_n, <state>_new_1..``.  Arithmetic runs in float64 and every output takes the
dtype of the input it replaces.
"""

from __future__ import annotations

import numpy as np

from .registry import TRAINING_DOMAIN, kernel


def _scalar(v, name, kinds):
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {a.shape}")
    if a.dtype.kind not in kinds:
        raise TypeError(f"{name} has unsupported type {a.dtype}")
    return a.reshape(()).item()


def _groups(inputs, k, op):
    if len(inputs) == 0 or len(inputs) % k:
        raise ValueError(f"{op}: expected a multiple of {k} tensors after R and T, got {len(inputs)}")
    n = len(inputs) // k
    arrs = [np.asarray(a) for a in inputs]
    for i, a in enumerate(arrs):
        if a.dtype.kind != "f":
            raise TypeError(f"{op}: input {i + 2} must be float or double, got {a.dtype}")
    return [arrs[j * n:(j + 1) * n] for j in range(k)]


def _f64(a):
    return a.astype(np.float64)


@kernel("Adagrad", since=1, domain=TRAINING_DOMAIN)
def adagrad(R, T, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    r = _scalar(R, "Adagrad R", "f")
    t = _scalar(T, "Adagrad T", "iu")
    xs, gs, hs = _groups(inputs, 3, "Adagrad")
    rate = r / (1.0 + t * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g_reg = norm_coefficient * _f64(x) + _f64(g)
        h_new = _f64(h) + g_reg * g_reg
        x_new = _f64(x) - rate * g_reg / (np.sqrt(h_new) + epsilon)
        new_x.append(x_new.astype(x.dtype))
        new_h.append(h_new.astype(h.dtype))
    return tuple(new_x + new_h)


@kernel("Adam", since=1, domain=TRAINING_DOMAIN)
def adam(R, T, *inputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0):
    r = _scalar(R, "Adam R", "f")
    t = _scalar(T, "Adam T", "iu")
    xs, gs, vs, hs = _groups(inputs, 4, "Adam")
    if t > 0:
        rate = r * np.sqrt(1.0 - beta ** t) / (1.0 - alpha ** t)
    else:
        rate = r
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g_reg = norm_coefficient * _f64(x) + _f64(g)
        v_new = alpha * _f64(v) + (1.0 - alpha) * g_reg
        h_new = beta * _f64(h) + (1.0 - beta) * g_reg * g_reg
        x_new = _f64(x) - rate * (v_new / (np.sqrt(h_new) + epsilon))
        x_new = (1.0 - norm_coefficient_post) * x_new
        new_x.append(x_new.astype(x.dtype))
        new_v.append(v_new.astype(v.dtype))
        new_h.append(h_new.astype(h.dtype))
    return tuple(new_x + new_v + new_h)


@kernel("Momentum", since=1, domain=TRAINING_DOMAIN)
def momentum(R, T, *inputs, alpha=None, beta=None, mode=None, norm_coefficient=None):
    for name, val in (("alpha", alpha), ("beta", beta), ("mode", mode), ("norm_coefficient", norm_coefficient)):
        if val is None:
            raise ValueError(f"Momentum: required attribute {name!r} is missing")
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum: mode must be 'standard' or 'nesterov', got {mode!r}")
    r = _scalar(R, "Momentum R", "f")
    t = _scalar(T, "Momentum T", "iu")
    xs, gs, vs = _groups(inputs, 3, "Momentum")
    beta_adj = beta if t > 0 else 1.0
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g_reg = norm_coefficient * _f64(x) + _f64(g)
        v_new = alpha * _f64(v) + beta_adj * g_reg
        if mode == "standard":
            x_new = _f64(x) - r * v_new
        else:
            x_new = _f64(x) - r * (g_reg + alpha * v_new)
        new_x.append(x_new.astype(x.dtype))
        new_v.append(v_new.astype(v.dtype))
    return tuple(new_x + new_v)
