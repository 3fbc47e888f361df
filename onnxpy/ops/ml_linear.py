"""ai.onnx.ml linear models: LinearClassifier and LinearRegressor (opset 1).

Scores are ``X @ coefficients.T + intercepts`` computed in float64 and returned as float32.  Like onnxruntime,
a single score column is only transformed by PROBIT (the other transforms need several scores), and a binary
classifier with one coefficient row reports the pair ``[1 - p, p]``.
"""

from __future__ import annotations

import numpy as np

from ._ml_common import apply_post_transform, as_2d_features, check_post_transform, class_labels, logistic, probit
from .registry import ML_DOMAIN, kernel


def _weights(coefficients, n_features, rows, op):
    coef = np.asarray(coefficients if coefficients is not None else [], dtype=np.float64).ravel()
    if rows is None:
        if n_features == 0 or coef.size % n_features:
            raise ValueError(f"{op}: {coef.size} coefficients do not divide into rows of {n_features} features")
        rows = coef.size // n_features
    if coef.size < rows * n_features:
        raise ValueError(f"{op}: coefficients length ({coef.size}) must be at least targets ({rows}) * "
                         f"features ({n_features})")
    return coef[:rows * n_features].reshape(rows, n_features)


def _intercepts(intercepts, rows, op):
    b = np.asarray(intercepts if intercepts is not None else [], dtype=np.float64).ravel()
    if b.size == 0:
        return np.zeros(rows)
    if b.size != rows:
        raise ValueError(f"{op}: {b.size} intercepts for {rows} score columns")
    return b


def _linear_scores(X, coefficients, intercepts, rows, op):
    x = as_2d_features(X, op)
    w = _weights(coefficients, x.shape[1], rows, op)
    return x @ w.T + _intercepts(intercepts, w.shape[0], op)


@kernel("LinearRegressor", since=1, domain=ML_DOMAIN)
def linear_regressor(X, *, coefficients=None, intercepts=None, post_transform="NONE", targets=1):
    check_post_transform(post_transform)
    if targets < 1:
        raise ValueError(f"LinearRegressor: targets must be >= 1, got {targets}")
    scores = _linear_scores(X, coefficients, intercepts, int(targets), "LinearRegressor")
    if scores.shape[1] == 1:
        out = probit(scores) if post_transform == "PROBIT" else scores
    else:
        out = apply_post_transform(scores, post_transform)
    return out.astype(np.float32)


@kernel("LinearClassifier", since=1, domain=ML_DOMAIN)
def linear_classifier(X, *, classlabels_ints=None, classlabels_strings=None, coefficients=None, intercepts=None,
                      multi_class=0, post_transform="NONE"):
    check_post_transform(post_transform)
    labels = class_labels(classlabels_ints, classlabels_strings, "LinearClassifier")
    scores = _linear_scores(X, coefficients, intercepts, None, "LinearClassifier")
    n, rows = scores.shape
    if rows == 1 and labels.size <= 2:
        # binary model with a single score column: positive class when the raw score is > 0
        s = scores[:, 0]
        positive = (s > 0).astype(np.int64)
        label = labels[np.minimum(positive, labels.size - 1)]
        if post_transform == "LOGISTIC":
            p = logistic(s)
        elif post_transform == "PROBIT":
            p = probit(s)
        else:
            p = s
        if labels.size == 1:
            return label, p.reshape(n, 1).astype(np.float32)
        return label, np.stack([1.0 - p, p], axis=1).astype(np.float32)
    if rows != labels.size:
        raise ValueError(f"LinearClassifier: {rows} coefficient rows for {labels.size} class labels")
    label = labels[np.argmax(scores, axis=1)] if n else labels[:0]
    return label, apply_post_transform(scores, post_transform).astype(np.float32)
