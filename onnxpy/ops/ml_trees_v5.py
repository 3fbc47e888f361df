"""ai.onnx.ml TreeEnsemble (opset 5): the tensor-based tree encoding with separate leaf arrays and set membership.

Converted into the flat forest of :mod:`ml_trees` (interior nodes first, then one node per leaf entry).
"""

from __future__ import annotations

import numpy as np

from ._ml_common import as_2d_features
from .ml_trees import _AGGREGATES, _POST_BY_CODE, LEAF, MEMBER, _cached, _finish_regression, _Forest, _ints
from .registry import ML_DOMAIN, kernel


# ----------------------------------------------------------------------------------------------------------------
# TreeEnsemble (ai.onnx.ml 5)
# ----------------------------------------------------------------------------------------------------------------
def _te5_forest(tree_roots, nodes_modes, nodes_featureids, nodes_splits, nodes_truenodeids, nodes_trueleafs,
                nodes_falsenodeids, nodes_falseleafs, nodes_missing_value_tracks_true, membership_values,
                leaf_targetids, leaf_weights, n_targets):
    feat = _ints(nodes_featureids, "nodes_featureids")
    n = feat.size
    if nodes_modes is None:
        raise ValueError("TreeEnsemble: nodes_modes is required")
    mode = np.asarray(nodes_modes).ravel().astype(np.int64)
    if mode.size != n:
        raise ValueError(f"TreeEnsemble: nodes_modes has {mode.size} entries, expected {n}")
    if n and (mode.min() < 0 or mode.max() > MEMBER):
        raise ValueError("TreeEnsemble: nodes_modes values must be in [0, 6]")
    splits = np.asarray(nodes_splits if nodes_splits is not None else [], dtype=np.float64).ravel()
    if splits.size != n:
        raise ValueError(f"TreeEnsemble: nodes_splits has {splits.size} entries, expected {n}")
    t_ids = _ints(nodes_truenodeids, "nodes_truenodeids", n)
    f_ids = _ints(nodes_falsenodeids, "nodes_falsenodeids", n)
    t_leaf = _ints(nodes_trueleafs, "nodes_trueleafs", n).astype(bool)
    f_leaf = _ints(nodes_falseleafs, "nodes_falseleafs", n).astype(bool)
    miss = _ints(nodes_missing_value_tracks_true, "nodes_missing_value_tracks_true")
    if miss.size == 0:
        miss = np.zeros(n, dtype=np.int64)
    elif miss.size != n:
        raise ValueError(f"TreeEnsemble: nodes_missing_value_tracks_true has {miss.size} entries, expected {n}")
    targets = _ints(leaf_targetids, "leaf_targetids")
    n_leaf = targets.size
    weights = np.asarray(leaf_weights if leaf_weights is not None else [], dtype=np.float64).ravel()
    if weights.size != n_leaf:
        raise ValueError(f"TreeEnsemble: leaf_weights has {weights.size} entries, expected {n_leaf}")
    for ids, leafs, what in ((t_ids, t_leaf, "true"), (f_ids, f_leaf, "false")):
        lim = np.where(leafs, n_leaf, n)
        if np.any((ids < 0) | (ids >= lim)):
            raise ValueError(f"TreeEnsemble: a {what} branch index is out of range")
    true_next = np.where(t_leaf, n + t_ids, t_ids)
    false_next = np.where(f_leaf, n + f_ids, f_ids)
    all_mode = np.concatenate([mode, np.full(n_leaf, LEAF)])
    members = None
    member_nodes = np.flatnonzero(mode == MEMBER)
    if member_nodes.size:
        if membership_values is None:
            raise ValueError("TreeEnsemble: BRANCH_MEMBER nodes need membership_values")
        mv = np.asarray(membership_values, dtype=np.float64).ravel()
        sep = np.isnan(mv)
        set_id = np.cumsum(sep) - sep  # index of the set each value belongs to
        keep = ~sep
        n_sets = int(sep.sum()) + (0 if (mv.size == 0 or sep[-1]) else 1)
        if n_sets < member_nodes.size:
            raise ValueError(f"TreeEnsemble: {n_sets} membership sets for {member_nodes.size} BRANCH_MEMBER nodes")
        sid = set_id[keep]
        ok = sid < member_nodes.size
        members = (member_nodes[sid[ok]], mv[keep][ok])
    roots = _ints(tree_roots, "tree_roots")
    if roots.size and (roots.min() < 0 or roots.max() >= n):
        raise ValueError("TreeEnsemble: tree_roots index out of range")
    if n_targets is None:
        n_targets = int(targets.max()) + 1 if targets.size else 1
    return _Forest(np.concatenate([feat, np.zeros(n_leaf, np.int64)]),
                   np.concatenate([splits, np.zeros(n_leaf)]), all_mode,
                   np.concatenate([true_next, np.arange(n, n + n_leaf)]),
                   np.concatenate([false_next, np.arange(n, n + n_leaf)]),
                   np.concatenate([miss.astype(bool), np.zeros(n_leaf, bool)]), roots,
                   np.arange(n, n + n_leaf), targets, weights, n_targets, members)


@kernel("TreeEnsemble", since=5, domain=ML_DOMAIN)
def tree_ensemble(X, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None, membership_values=None,
                  n_targets=None, nodes_falseleafs=None, nodes_falsenodeids=None, nodes_featureids=None,
                  nodes_hitrates=None, nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                  nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0, tree_roots=None):
    if not isinstance(X, np.ndarray):
        X = np.asarray(X)
    if X.dtype.kind != "f":
        raise TypeError(f"TreeEnsemble: input must be float, double or float16, got {X.dtype}")
    if not 0 <= int(aggregate_function) <= 3:
        raise ValueError(f"TreeEnsemble: aggregate_function must be in [0, 3], got {aggregate_function}")
    if not 0 <= int(post_transform) <= 4:
        raise ValueError(f"TreeEnsemble: post_transform must be in [0, 4], got {post_transform}")
    if tree_roots is None:
        raise ValueError("TreeEnsemble: tree_roots is required")
    forest = _cached(
        lambda: _te5_forest(tree_roots, nodes_modes, nodes_featureids, nodes_splits, nodes_truenodeids,
                            nodes_trueleafs, nodes_falsenodeids, nodes_falseleafs, nodes_missing_value_tracks_true,
                            membership_values, leaf_targetids, leaf_weights, n_targets),
        tree_roots, nodes_modes, nodes_featureids, nodes_splits, nodes_truenodeids, nodes_trueleafs,
        nodes_falsenodeids, nodes_falseleafs, nodes_missing_value_tracks_true, membership_values, leaf_targetids,
        leaf_weights, n_targets)
    x = as_2d_features(X, "TreeEnsemble")
    scores, has = forest.scores(x, _AGGREGATES[int(aggregate_function)])
    out = _finish_regression(scores, has, np.zeros(0), _POST_BY_CODE[int(post_transform)])
    return out.astype(X.dtype)
