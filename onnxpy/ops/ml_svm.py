"""ai.onnx.ml support vector machines: SVMClassifier and SVMRegressor (opset 1).

Kernels: LINEAR ``<x, s>``, POLY ``(gamma <x, s> + coef0) ** degree``, RBF ``exp(-gamma |x - s|^2)``,
SIGMOID ``tanh(gamma <x, s> + coef0)`` with ``kernel_params = [gamma, coef0, degree]``.

The classifier is libsvm's one-vs-one SVC: pairwise decision values ``sum_k coef * K + rho`` vote for a class;
with ``prob_a``/``prob_b`` the pairwise values become Platt probabilities that are coupled into class
probabilities (Wu, Lin & Weng 2004, the method libsvm uses).  Output conventions follow onnxruntime.
"""

from __future__ import annotations

import numpy as np

from ._ml_common import apply_post_transform, as_2d_features, check_post_transform, class_labels, probit
from .registry import ML_DOMAIN, kernel

_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


def _kernel_matrix(x: np.ndarray, sv: np.ndarray, kernel_type: str, params) -> np.ndarray:
    """[N, V] kernel values between the rows of ``x`` and the support vectors ``sv``."""
    if kernel_type not in _KERNELS:
        raise ValueError(f"kernel_type must be one of {_KERNELS}, got {kernel_type!r}")
    p = list(params or []) + [0.0, 0.0, 0.0]
    gamma, coef0, degree = float(p[0]), float(p[1]), float(p[2])
    if kernel_type == "RBF":
        d = (x * x).sum(axis=1)[:, None] + (sv * sv).sum(axis=1)[None, :] - 2.0 * (x @ sv.T)
        return np.exp(-gamma * np.maximum(d, 0.0))
    dot = x @ sv.T
    if kernel_type == "LINEAR":
        return dot
    if kernel_type == "POLY":
        return np.power(gamma * dot + coef0, degree)
    return np.tanh(gamma * dot + coef0)


def _floats(v):
    return np.asarray(v if v is not None else [], dtype=np.float64).ravel()


def _support_vectors(support_vectors, n_vectors, n_features, op):
    sv = _floats(support_vectors)
    if n_vectors == 0 or sv.size != n_vectors * n_features:
        raise ValueError(f"{op}: {sv.size} support vector values for {n_vectors} vectors of {n_features} features")
    return sv.reshape(n_vectors, n_features)


# ----------------------------------------------------------------------------------------------------------------
# SVMRegressor
# ----------------------------------------------------------------------------------------------------------------
@kernel("SVMRegressor", since=1, domain=ML_DOMAIN)
def svm_regressor(X, *, coefficients=None, kernel_params=None, kernel_type="LINEAR", n_supports=0, one_class=0,
                  post_transform="NONE", rho=None, support_vectors=None):
    check_post_transform(post_transform)
    x = as_2d_features(X, "SVMRegressor")
    coef = _floats(coefficients)
    r = _floats(rho)
    r0 = r[0] if r.size else 0.0
    if n_supports > 0:
        sv = _support_vectors(support_vectors, int(n_supports), x.shape[1], "SVMRegressor")
        if coef.size < n_supports:
            raise ValueError(f"SVMRegressor: {coef.size} coefficients for {n_supports} support vectors")
        scores = _kernel_matrix(x, sv, kernel_type, kernel_params) @ coef[:n_supports] + r0
    else:
        # linear form: the coefficients are the weight vector (a plain dot product, whatever the kernel)
        if coef.size != x.shape[1]:
            raise ValueError(f"SVMRegressor: {coef.size} coefficients for {x.shape[1]} features")
        scores = x @ coef + r0
    scores = scores.reshape(-1, 1)
    if one_class:
        scores = np.where(scores > 0, 1.0, -1.0)
    # onnxruntime applies no post transform to the single regression score
    return scores.astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# SVMClassifier
# ----------------------------------------------------------------------------------------------------------------
def _sigmoid_probability(dec, a, b):
    f = dec * a + b
    e = np.exp(-np.abs(f))
    return np.where(f >= 0, e / (1.0 + e), 1.0 / (1.0 + e))


def _couple(r: np.ndarray) -> np.ndarray:
    """Class probabilities from pairwise probabilities r[n, i, j] ~ P(i | i or j), for every row at once."""
    n, k, _ = r.shape
    q = -r.transpose(0, 2, 1) * r  # Q[t, j] = -r[j, t] r[t, j]
    eye = np.eye(k, dtype=bool)
    diag = np.where(eye, 0.0, r.transpose(0, 2, 1) ** 2).sum(axis=2)  # Q[t, t] = sum_{j != t} r[j, t]^2
    q[:, eye] = diag
    p = np.full((n, k), 1.0 / k)
    eps = 0.005 / k
    active = np.ones(n, dtype=bool)
    for _ in range(max(100, k)):
        qp = np.einsum("ntj,nj->nt", q, p)
        pqp = (p * qp).sum(axis=1)
        active &= np.abs(qp - pqp[:, None]).max(axis=1) >= eps
        if not active.any():
            break
        idx = np.flatnonzero(active)
        qa, pa, qpa, pqpa = q[idx], p[idx], qp[idx], pqp[idx]
        for t in range(k):
            qtt = qa[:, t, t]
            d = np.where(qtt != 0, (-qpa[:, t] + pqpa) / np.where(qtt != 0, qtt, 1.0), 0.0)
            pa[:, t] += d
            pqpa = (pqpa + d * (d * qtt + 2.0 * qpa[:, t])) / (1.0 + d) ** 2
            qpa = (qpa + d[:, None] * qa[:, t, :]) / (1.0 + d)[:, None]
            pa /= (1.0 + d)[:, None]
        p[idx] = pa
    return p


@kernel("SVMClassifier", since=1, domain=ML_DOMAIN)
def svm_classifier(X, *, classlabels_ints=None, classlabels_strings=None, coefficients=None, kernel_params=None,
                   kernel_type="LINEAR", post_transform="NONE", prob_a=None, prob_b=None, rho=None,
                   support_vectors=None, vectors_per_class=None):
    check_post_transform(post_transform)
    labels = class_labels(classlabels_ints, classlabels_strings, "SVMClassifier")
    c = labels.size
    x = as_2d_features(X, "SVMClassifier")
    n = x.shape[0]
    coef = _floats(coefficients)
    r = _floats(rho)
    per_class = np.asarray(vectors_per_class if vectors_per_class is not None else [], dtype=np.int64)
    n_vectors = int(per_class.sum()) if per_class.size else 0
    if n_vectors == 0 or support_vectors is None or len(support_vectors) == 0:
        return _linear_svm(x, coef, r, labels, post_transform)
    if per_class.size != c:
        raise ValueError(f"SVMClassifier: vectors_per_class has {per_class.size} entries for {c} classes")
    sv = _support_vectors(support_vectors, n_vectors, x.shape[1], "SVMClassifier")
    if coef.size != (c - 1) * n_vectors:
        raise ValueError(f"SVMClassifier: expected {(c - 1) * n_vectors} coefficients, got {coef.size}")
    n_pairs = c * (c - 1) // 2
    if r.size < n_pairs:
        raise ValueError(f"SVMClassifier: rho needs {n_pairs} values, got {r.size}")
    alpha = coef.reshape(c - 1, n_vectors)
    kmat = _kernel_matrix(x, sv, kernel_type, kernel_params)
    start = np.concatenate([[0], np.cumsum(per_class)])
    pairs_i, pairs_j = np.triu_indices(c, k=1)
    dec = np.empty((n, n_pairs))
    for p, (i, j) in enumerate(zip(pairs_i, pairs_j)):
        si, sj = slice(start[i], start[i + 1]), slice(start[j], start[j + 1])
        dec[:, p] = kmat[:, si] @ alpha[j - 1, si] + kmat[:, sj] @ alpha[i, sj] + r[p]
    votes = np.zeros((n, c), dtype=np.int64)
    rows = np.arange(n)
    for p, (i, j) in enumerate(zip(pairs_i, pairs_j)):
        win = np.where(dec[:, p] > 0, i, j)
        np.add.at(votes, (rows, win), 1)
    pa, pb = _floats(prob_a), _floats(prob_b)
    if pa.size and pb.size:
        if pa.size < n_pairs or pb.size < n_pairs:
            raise ValueError(f"SVMClassifier: prob_a and prob_b need {n_pairs} values")
        pr = np.clip(_sigmoid_probability(dec, pa[:n_pairs], pb[:n_pairs]), 1e-7, 1.0 - 1e-7)
        rmat = np.zeros((n, c, c))
        rmat[:, pairs_i, pairs_j] = pr
        rmat[:, pairs_j, pairs_i] = 1.0 - pr
        probs = _couple(rmat)
        best = np.argmax(votes, axis=1)  # onnxruntime keeps the one-vs-one vote for the label
        z = apply_post_transform(probs, post_transform)
        return labels[best], z.astype(np.float32)
    if c == 2:
        # one decision value d; the label follows its sign.  Scores as onnxruntime lays them out:
        # [-d, d], [1 - d, d] for the softmax transforms, [probit(d), 0] for PROBIT.
        d = dec[:, 0]
        label = labels[np.where(d > 0, 0, 1)]
        if post_transform in ("SOFTMAX", "SOFTMAX_ZERO"):
            z = np.stack([1.0 - d, d], axis=1)
        elif post_transform == "PROBIT":
            z = np.stack([probit(d), np.zeros_like(d)], axis=1)
        else:
            z = apply_post_transform(np.stack([-d, d], axis=1), post_transform)
        return label, z.astype(np.float32)
    return labels[np.argmax(votes, axis=1)], apply_post_transform(dec, post_transform).astype(np.float32)


def _linear_svm(x, coef, r, labels, post_transform):
    c = labels.size
    if coef.size % max(c, 1) or coef.size // c != x.shape[1]:
        raise ValueError(f"SVMClassifier: {coef.size} coefficients for {c} classes and {x.shape[1]} features")
    w = coef.reshape(c, -1)
    scores = x @ w.T + (r[0] if r.size else 0.0)
    best = np.argmax(scores, axis=1)
    if c == 2:
        # onnxruntime: the first class only wins with the top score when that score is not above a threshold
        # (0.5 when all coefficients are >= 0, else 0)
        threshold = 0.5 if bool((coef >= 0).all()) else 0.0
        best = np.where((best == 0) & (scores[:, 0] <= threshold), 0, 1)
    if c == 1:
        return labels[best], (probit(scores) if post_transform == "PROBIT" else scores).astype(np.float32)
    return labels[best], apply_post_transform(scores, post_transform).astype(np.float32)
