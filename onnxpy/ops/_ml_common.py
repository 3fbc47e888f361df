"""Shared helpers of the ai.onnx.ml kernels: score post-transforms and classifier label handling.

Not an op-family module (the leading underscore keeps ``load_all`` from importing it for kernels).
"""

from __future__ import annotations

import numpy as np

POST_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def check_post_transform(name: str) -> str:
    if name not in POST_TRANSFORMS:
        raise ValueError(f"post_transform must be one of {', '.join(POST_TRANSFORMS)}, got {name!r}")
    return name


def logistic(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    pos = 1.0 / (1.0 + e)
    return np.where(x >= 0, pos, 1.0 - pos)


def probit(x: np.ndarray) -> np.ndarray:
    """Inverse of the standard normal CDF, sqrt(2) * erfinv(2x - 1).

    onnxruntime evaluates erfinv with Winitzki's closed-form approximation (a = 0.147, relative error up to
    ~2e-3 in the tails); it is used here too so that scores agree with onnxruntime's within 1e-3.
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = 2.0 * x - 1.0
        ln = np.log((1.0 - y) * (1.0 + y))
        a = 2.0 / (3.14159 * 0.147) + 0.5 * ln
        b = ln / 0.147
        r = np.sign(y) * np.sqrt(-a + np.sqrt(a * a - b))
        r = np.where(y == 0, 0.0, r)
    return 1.41421356 * r


def probit_exact(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        from scipy.special import ndtri  # imported on use: scipy.special costs ~0.2 s at import

        return ndtri(x)


def softmax(x: np.ndarray) -> np.ndarray:
    if x.shape[-1] == 0:
        return x
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def softmax_zero(x: np.ndarray) -> np.ndarray:
    """Softmax where zero scores (|x| <= 1e-7) stay zero: they are treated as absent."""
    if x.shape[-1] == 0:
        return x
    nz = np.abs(x) > 1e-7
    m = x.max(axis=-1, keepdims=True)
    e = np.where(nz, np.exp(x - m), 0.0)
    s = e.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return e / s  # an all-zero row is 0/0 = NaN, as in onnxruntime


def apply_post_transform(scores: np.ndarray, post_transform: str) -> np.ndarray:
    """Apply a post transform to [N, C] scores along the last axis (in float64)."""
    if post_transform == "NONE":
        return scores
    if post_transform == "LOGISTIC":
        return logistic(scores)
    if post_transform == "SOFTMAX":
        return softmax(scores)
    if post_transform == "SOFTMAX_ZERO":
        return softmax_zero(scores)
    if post_transform == "PROBIT":
        return probit(scores)
    raise ValueError(f"unknown post_transform {post_transform!r}")


def class_labels(classlabels_ints, classlabels_strings, op: str):
    """The class-label array (int64 or object str) from the two alternative attributes."""
    if classlabels_strings:
        if classlabels_ints:
            raise ValueError(f"{op}: only one of the integer and string class labels may be set")
        out = np.empty(len(classlabels_strings), dtype=object)
        out[:] = [str(s) for s in classlabels_strings]
        return out
    if classlabels_ints:
        return np.asarray(classlabels_ints, dtype=np.int64)
    raise ValueError(f"{op}: class labels (integers or strings) are required")


def as_2d_features(X, op: str) -> np.ndarray:
    """The input as [N, F] float64 (1-D is one row), with a clear error for non-numeric input."""
    if not isinstance(X, np.ndarray):
        X = np.asarray(X)
    if X.dtype.kind not in "iuf":
        raise TypeError(f"{op}: input must be a numeric tensor, got {X.dtype}")
    if X.ndim == 0:
        raise ValueError(f"{op}: input must have at least one dimension")
    if X.ndim == 1:
        X = X.reshape(1, -1)
    elif X.ndim > 2:
        X = X.reshape(X.shape[0], -1)
    return X.astype(np.float64, copy=False)
