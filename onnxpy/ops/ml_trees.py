"""ai.onnx.ml tree ensembles: TreeEnsembleClassifier / TreeEnsembleRegressor (opsets 1, 3, 5) and TreeEnsemble (5).

Every encoding is converted into one flat forest (``_Forest``): arrays over all nodes (feature, threshold, mode,
true/false child, NaN direction) plus the leaf votes ``(node, target, weight)``.  Evaluation walks all
(sample, tree) pairs one level at a time with vectorized gathers (the Python loop runs over the depth only),
then the votes of the reached leaves are aggregated with ``bincount`` / ``ufunc.at``.

Conventions follow onnxruntime where the spec leaves them open: with several targets/classes a base value only
applies to the targets some reached leaf voted for (the others report 0); a single score column is only
transformed by PROBIT; the classifier's label and [N, 2] layout of binary models (one score -> [1 - p, p] or
[-s, s]) mirror onnxruntime.  Where onnxruntime contradicts the spec, the spec wins: TreeEnsemble's
post_transform codes are 1 = SOFTMAX, 2 = LOGISTIC (onnxruntime swaps them), set membership is exact (onnxruntime
truncates to integers), and binary labels always come from the class labels.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ._ml_common import apply_post_transform, as_2d_features, check_post_transform, class_labels, probit
from ._ml_common import logistic as _logistic
from .registry import ML_DOMAIN, kernel

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = range(8)
_MODE_CODES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT, "BRANCH_EQ": EQ,
               "BRANCH_NEQ": NEQ, "BRANCH_MEMBER": MEMBER, "LEAF": LEAF}
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
_POST_BY_CODE = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")

# memory bound for the expanded (sample, tree, vote) arrays
_CHUNK_ELEMS = 1 << 22


class _Forest:
    """A flat forest.  Node arrays are indexed by global node position; leaves have mode LEAF."""

    def __init__(self, feature, threshold, mode, true_next, false_next, missing_true, roots, votes_node,
                 votes_target, votes_weight, n_targets, members=None):
        self.feature = np.asarray(feature, dtype=np.int64)
        self.threshold = np.asarray(threshold, dtype=np.float64)
        self.mode = np.asarray(mode, dtype=np.int8)
        self.true_next = np.asarray(true_next, dtype=np.int64)
        self.false_next = np.asarray(false_next, dtype=np.int64)
        self.missing_true = np.asarray(missing_true, dtype=bool)
        self.has_missing = bool(self.missing_true.any())
        self.roots = np.asarray(roots, dtype=np.int64)
        self.n_nodes = self.mode.size
        self.is_leaf = self.mode == LEAF
        self.n_targets = int(n_targets)
        interior = ~self.is_leaf
        self.max_feature = int(self.feature[interior].max()) if interior.any() else -1
        if interior.any() and int(self.feature[interior].min()) < 0:
            raise ValueError("tree ensemble: negative feature id")
        modes = np.unique(self.mode[interior])
        self.modes = [int(m) for m in modes]
        # leaf votes sorted by node -> contiguous ranges
        vn = np.asarray(votes_node, dtype=np.int64)
        vt = np.asarray(votes_target, dtype=np.int64)
        vw = np.asarray(votes_weight, dtype=np.float64)
        if vt.size and (vt.min() < 0 or vt.max() >= self.n_targets):
            raise ValueError(f"tree ensemble: target/class id out of range [0, {self.n_targets})")
        order = np.argsort(vn, kind="stable")
        self.v_target, self.v_weight = vt[order], vw[order]
        self.v_count = np.bincount(vn, minlength=self.n_nodes).astype(np.int64)
        self.v_start = np.cumsum(self.v_count) - self.v_count
        # set membership: (node, value) pairs encoded as node * (K + 1) + rank(value)
        self.member_values = None
        if members is not None and members[0].size:
            m_nodes, m_vals = members
            uniq = np.unique(m_vals)
            rank = np.searchsorted(uniq, m_vals)
            self.member_values = uniq
            self.member_keys = np.unique(m_nodes * (uniq.size + 1) + rank)
        self._check_structure()

    def _check_structure(self):
        interior = np.flatnonzero(~self.is_leaf)
        for nxt in (self.true_next[interior], self.false_next[interior]):
            if nxt.size and (nxt.min() < 0 or nxt.max() >= self.n_nodes):
                raise ValueError("tree ensemble: a child index is out of range")
        if self.roots.size and (self.roots.min() < 0 or self.roots.max() >= self.n_nodes):
            raise ValueError("tree ensemble: a tree root is out of range")
        if MEMBER in self.modes and self.member_values is None:
            raise ValueError("tree ensemble: BRANCH_MEMBER nodes need membership_values")

    # -- traversal ---------------------------------------------------------------------------------
    def _compare(self, xv, nodes):
        if len(self.modes) == 1:
            res = self._cmp(self.modes[0], xv, self.threshold.take(nodes), nodes)
        else:
            md = self.mode.take(nodes)
            thr = self.threshold.take(nodes)
            res = np.zeros(xv.shape, dtype=bool)
            for m in self.modes:
                sel = np.flatnonzero(md == m)
                if sel.size:
                    res[sel] = self._cmp(m, xv[sel], thr[sel], nodes[sel])
        if self.has_missing:
            res |= np.isnan(xv) & self.missing_true.take(nodes)
        return res

    def _cmp(self, m, x, t, nodes):
        if m == LEQ:
            return x <= t
        if m == LT:
            return x < t
        if m == GTE:
            return x >= t
        if m == GT:
            return x > t
        if m == EQ:
            return x == t
        if m == NEQ:
            return x != t
        if m == MEMBER:
            uniq = self.member_values
            pos = np.minimum(np.searchsorted(uniq, x), uniq.size - 1)
            found = uniq[pos] == x
            key = nodes * (uniq.size + 1) + pos
            kpos = np.minimum(np.searchsorted(self.member_keys, key), self.member_keys.size - 1)
            return found & (self.member_keys[kpos] == key)
        raise ValueError(f"tree ensemble: unknown node mode {m}")

    def leaves(self, X: np.ndarray) -> np.ndarray:
        """Reached leaf of every (sample, tree), flat in sample-major order.

        All pairs descend one level per step; pairs that reached a leaf stay there (a leaf's children are
        itself), and the working set is compacted once fewer than half of it is still moving.
        """
        n, f = X.shape
        if self.max_feature >= f:
            raise ValueError(f"tree ensemble: feature id {self.max_feature} is out of range for an input with "
                             f"{f} features")
        t = self.roots.size
        cur = np.tile(self.roots, n)
        xf = np.ascontiguousarray(X).ravel()
        pos = np.flatnonzero(~self.is_leaf.take(cur))
        node = cur[pos]
        off = (pos // max(t, 1)) * f
        moving = pos.size
        steps = 0
        while moving:
            xv = xf.take(off + self.feature.take(node))
            go = self._compare(xv, node)
            node = np.where(go, self.true_next.take(node), self.false_next.take(node))
            still = ~self.is_leaf.take(node)
            moving = int(np.count_nonzero(still))
            if moving < node.size // 2:
                cur[pos] = node
                pos, node, off = pos[still], node[still], off[still]
            steps += 1
            if steps > self.n_nodes:
                raise ValueError("tree ensemble: the trees contain a cycle")
        cur[pos] = node
        return cur

    # -- aggregation -------------------------------------------------------------------------------
    def scores(self, X: np.ndarray, aggregate: str):
        """[N, n_targets] aggregated leaf votes (float64) and the [N, n_targets] mask of targets that got one."""
        n, k = X.shape[0], self.n_targets
        scores = np.zeros((n, k), dtype=np.float64)
        has = np.zeros((n, k), dtype=bool)
        t = max(self.roots.size, 1)
        per_row = t * max(1, int(np.ceil(self.v_target.size / max(1, int((self.v_count > 0).sum())))))
        chunk = max(1, _CHUNK_ELEMS // max(per_row, 1))
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            sc, hs = self._scores_chunk(X[s:e], aggregate)
            scores[s:e], has[s:e] = sc, hs
        if aggregate == "AVERAGE" and self.roots.size:
            scores /= self.roots.size
        return scores, has

    def _scores_chunk(self, X, aggregate):
        n, k = X.shape[0], self.n_targets
        leaf = self.leaves(X)
        row = np.repeat(np.arange(n, dtype=np.int64), self.roots.size)
        cnt = self.v_count[leaf]
        total = int(cnt.sum())
        if total == 0:
            return np.zeros((n, k)), np.zeros((n, k), dtype=bool)
        offs = np.cumsum(cnt) - cnt
        idx = np.arange(total, dtype=np.int64) - np.repeat(offs - self.v_start[leaf], cnt)
        flat = np.repeat(row, cnt) * k + self.v_target[idx]
        w = self.v_weight[idx]
        has = np.bincount(flat, minlength=n * k) > 0
        if aggregate in ("SUM", "AVERAGE"):
            sc = np.bincount(flat, weights=w, minlength=n * k)
        elif aggregate == "MIN":
            sc = np.full(n * k, np.inf)
            np.minimum.at(sc, flat, w)
        elif aggregate == "MAX":
            sc = np.full(n * k, -np.inf)
            np.maximum.at(sc, flat, w)
        else:
            raise ValueError(f"aggregate_function must be one of {_AGGREGATES}, got {aggregate!r}")
        sc = np.where(has, sc, 0.0)
        return sc.reshape(n, k), has.reshape(n, k)


# ----------------------------------------------------------------------------------------------------------------
# building forests (cached per attribute set: the planner decodes attributes once per node)
# ----------------------------------------------------------------------------------------------------------------
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 64


_CACHE_LOCK = threading.Lock()


def _cached(build, *attrs):
    """The forest built from these attribute objects (identity-keyed; the entry keeps them alive)."""
    key = tuple(id(a) for a in attrs)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], attrs)):
            _CACHE.move_to_end(key)
            return hit[1]
    forest = build()
    with _CACHE_LOCK:
        _CACHE[key] = (attrs, forest)
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return forest


def _ints(v, name, n=None):
    a = np.asarray(v if v is not None else [], dtype=np.int64).ravel()
    if n is not None and a.size != n:
        raise ValueError(f"tree ensemble: {name} has {a.size} entries, expected {n}")
    return a


def _floats(plain, tensor, name, n=None):
    v = tensor if tensor is not None else plain
    a = np.asarray(v if v is not None else [], dtype=np.float64).ravel()
    if n is not None and a.size != n:
        raise ValueError(f"tree ensemble: {name} has {a.size} entries, expected {n}")
    return a


def _mode_codes(modes, n):
    if modes is None or len(modes) != n:
        raise ValueError(f"tree ensemble: nodes_modes must have {n} entries")
    uniq, inv = np.unique(np.asarray(list(modes), dtype=object).astype(str), return_inverse=True)
    try:
        codes = np.array([_MODE_CODES[str(u)] for u in uniq], dtype=np.int8)
    except KeyError as e:
        raise ValueError(f"tree ensemble: unknown node mode {e.args[0]!r}") from None
    if (codes == MEMBER).any():
        raise ValueError("tree ensemble: BRANCH_MEMBER is only supported by TreeEnsemble")
    return codes[inv.ravel()]


def _legacy_forest(treeids, nodeids, featureids, values, modes, truenodeids, falsenodeids, missing, v_treeids,
                   v_nodeids, v_ids, v_weights, n_targets):
    nodeids = _ints(nodeids, "nodes_nodeids")
    n = nodeids.size
    if n == 0:
        raise ValueError("tree ensemble: the model has no nodes")
    treeids = _ints(treeids, "nodes_treeids", n)
    featureids = _ints(featureids, "nodes_featureids", n)
    values = np.asarray(values, dtype=np.float64)
    if values.size != n:
        raise ValueError(f"tree ensemble: nodes_values has {values.size} entries, expected {n}")
    mode = _mode_codes(modes, n)
    truenodeids = _ints(truenodeids, "nodes_truenodeids", n)
    falsenodeids = _ints(falsenodeids, "nodes_falsenodeids", n)
    miss = _ints(missing, "nodes_missing_value_tracks_true")
    if miss.size == 0:
        miss = np.zeros(n, dtype=np.int64)
    elif miss.size != n:
        raise ValueError(f"tree ensemble: nodes_missing_value_tracks_true has {miss.size} entries, expected {n}")
    if nodeids.min() < 0:
        raise ValueError("tree ensemble: negative node id")
    m = int(nodeids.max()) + 1
    keys = treeids * m + nodeids
    order = np.argsort(keys, kind="stable")
    skeys = keys[order]
    if np.any(skeys[1:] == skeys[:-1]):
        raise ValueError("tree ensemble: a (tree id, node id) pair appears twice")

    def find(tree, node, what):
        ok = (node >= 0) & (node < m)
        k = tree * m + np.where(ok, node, 0)
        pos = np.minimum(np.searchsorted(skeys, k), n - 1)
        ok &= skeys[pos] == k
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"tree ensemble: {what} refers to node {int(node[bad])} of tree {int(tree[bad])}, "
                             f"which does not exist")
        return order[pos]

    interior = mode != LEAF
    self_idx = np.arange(n, dtype=np.int64)
    true_next = self_idx.copy()
    false_next = self_idx.copy()
    ii = np.flatnonzero(interior)
    true_next[ii] = find(treeids[ii], truenodeids[ii], "nodes_truenodeids")
    false_next[ii] = find(treeids[ii], falsenodeids[ii], "nodes_falsenodeids")
    _, first = np.unique(treeids, return_index=True)
    roots = np.sort(first)
    v_nodeids = _ints(v_nodeids, "target/class nodeids")
    nv = v_nodeids.size
    v_treeids = _ints(v_treeids, "target/class treeids", nv)
    v_ids = _ints(v_ids, "target/class ids", nv)
    v_weights = np.asarray(v_weights, dtype=np.float64).ravel()
    if v_weights.size != nv:
        raise ValueError(f"tree ensemble: {v_weights.size} weights for {nv} leaf votes")
    v_node = find(v_treeids, v_nodeids, "a leaf vote") if nv else np.zeros(0, np.int64)
    return _Forest(np.where(interior, featureids, 0), values, mode, true_next, false_next, miss.astype(bool), roots,
                   v_node, v_ids, v_weights, n_targets)


def _base(base_values, base_values_as_tensor):
    b = base_values_as_tensor if base_values_as_tensor is not None else base_values
    return np.asarray(b if b is not None else [], dtype=np.float64).ravel()


def _finish_regression(scores, has, base, post_transform):
    if base.size:
        if base.size != scores.shape[1]:
            raise ValueError(f"tree ensemble: {base.size} base values for {scores.shape[1]} targets")
        if scores.shape[1] == 1:
            scores = scores + base
        else:
            # onnxruntime adds the base value only to the targets some leaf voted for (others stay 0)
            scores = np.where(has, scores + base, 0.0)
    if scores.shape[1] == 1:
        # a single score: onnxruntime only applies PROBIT (the others need several scores)
        return probit(scores) if post_transform == "PROBIT" else scores
    return apply_post_transform(scores, post_transform)


# ----------------------------------------------------------------------------------------------------------------
# TreeEnsembleRegressor
# ----------------------------------------------------------------------------------------------------------------
def _regressor(X, aggregate_function, base_values, base_values_as_tensor, n_targets, nodes_falsenodeids,
               nodes_featureids, nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
               nodes_truenodeids, nodes_values, nodes_values_as_tensor, post_transform, target_ids, target_nodeids,
               target_treeids, target_weights, target_weights_as_tensor):
    check_post_transform(post_transform)
    if aggregate_function not in _AGGREGATES:
        raise ValueError(f"aggregate_function must be one of {_AGGREGATES}, got {aggregate_function!r}")
    x = as_2d_features(X, "TreeEnsembleRegressor")
    if n_targets is None:
        ids = np.asarray(target_ids or [0])
        n_targets = int(ids.max()) + 1 if ids.size else 1
    forest = _cached(
        lambda: _legacy_forest(nodes_treeids, nodes_nodeids, nodes_featureids,
                               _floats(nodes_values, nodes_values_as_tensor, "nodes_values"), nodes_modes,
                               nodes_truenodeids, nodes_falsenodeids, nodes_missing_value_tracks_true,
                               target_treeids, target_nodeids, target_ids,
                               _floats(target_weights, target_weights_as_tensor, "target_weights"), n_targets),
        nodes_treeids, nodes_nodeids, nodes_featureids, nodes_values, nodes_values_as_tensor, nodes_modes,
        nodes_truenodeids, nodes_falsenodeids, nodes_missing_value_tracks_true, target_treeids, target_nodeids,
        target_ids, target_weights, target_weights_as_tensor)
    if forest.n_targets != n_targets:
        raise ValueError("tree ensemble: inconsistent n_targets")
    scores, has = forest.scores(x, aggregate_function)
    return _finish_regression(scores, has, _base(base_values, base_values_as_tensor), post_transform).astype(np.float32)


@kernel("TreeEnsembleRegressor", since=1, domain=ML_DOMAIN)
def tree_ensemble_regressor_1(X, *, aggregate_function="SUM", base_values=None, n_targets=None,
                              nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                              nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                              nodes_treeids=None, nodes_truenodeids=None, nodes_values=None, post_transform="NONE",
                              target_ids=None, target_nodeids=None, target_treeids=None, target_weights=None):
    return _regressor(X, aggregate_function, base_values, None, n_targets, nodes_falsenodeids, nodes_featureids,
                      nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids, nodes_truenodeids,
                      nodes_values, None, post_transform, target_ids, target_nodeids, target_treeids,
                      target_weights, None)


@kernel("TreeEnsembleRegressor", since=(3, 5), domain=ML_DOMAIN)
def tree_ensemble_regressor_3(X, *, aggregate_function="SUM", base_values=None, base_values_as_tensor=None,
                              n_targets=None, nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                              nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None, nodes_modes=None,
                              nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                              nodes_values_as_tensor=None, post_transform="NONE", target_ids=None,
                              target_nodeids=None, target_treeids=None, target_weights=None,
                              target_weights_as_tensor=None):
    return _regressor(X, aggregate_function, base_values, base_values_as_tensor, n_targets, nodes_falsenodeids,
                      nodes_featureids, nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
                      nodes_truenodeids, nodes_values, nodes_values_as_tensor, post_transform, target_ids,
                      target_nodeids, target_treeids, target_weights, target_weights_as_tensor)


# ----------------------------------------------------------------------------------------------------------------
# TreeEnsembleClassifier
# ----------------------------------------------------------------------------------------------------------------
def _classifier_finish(scores, has, base, labels, binary_case, all_positive, post_transform):
    """onnxruntime's classifier conventions: label choice and the [N, 2] layout of binary models.

    ``scores``/``has``: summed votes per class and which classes received a vote (per row).  A class that got
    no vote scores 0 (base values do not apply to it), except with more than two classes, where base values
    are added to every class.
    """
    n, c = scores.shape
    if c != 2:
        if base.size:
            if base.size > c:
                raise ValueError(f"tree ensemble: {base.size} base values for {c} classes")
            scores[:, :base.size] += base
            has[:, :base.size] = True
        best = np.argmax(np.where(has, scores, -np.inf), axis=1)
        best = np.where(has.any(axis=1), best, 0)
        if c == 1:
            z = probit(scores) if post_transform == "PROBIT" else scores
        else:
            z = apply_post_transform(scores, post_transform)
        return labels[best], z
    s0, s1 = scores[:, 0].copy(), scores[:, 1].copy()
    h0, h1 = has[:, 0], has[:, 1]
    if base.size == 2:
        # a model voting for the second class: its score is base[1] + the first class's votes (onnxruntime)
        t1 = base[1] + s0
        s0 = np.where(h1, -t1, s0 + base[0])
        s1 = np.where(h1, t1, s1 + base[1])
        single = np.zeros(n, dtype=bool)
    elif base.size == 1:
        s0 = s0 + base[0]
        single = ~h1
    elif base.size == 0:
        single = ~h1
    else:
        raise ValueError(f"tree ensemble: {base.size} base values for 2 classes")
    pos_weight = np.where(h1, s1, np.where(h0, s0, 0.0))
    threshold = 0.5 if (binary_case and all_positive) else 0.0
    label = labels[(pos_weight > threshold).astype(np.int64)]
    z = apply_post_transform(np.stack([np.where(h0, s0, 0.0), np.where(h1, s1, 0.0)], axis=1), post_transform)
    if single.any():
        # one score s for the pair of classes: [1 - s, s] for probabilities, [-s, s] for margins
        s = np.where(h0, s0, 0.0)
        if not binary_case and base.size == 1:
            # onnxruntime writes the raw score and leaves the second column unset (here 0)
            pair = (s, np.zeros(n))
        elif post_transform == "LOGISTIC":
            pair = (_logistic(-s), _logistic(s))
        elif post_transform == "PROBIT":
            pair = (probit(s), np.zeros(n))
        elif binary_case and all_positive:
            pair = (1.0 - s, s)
        else:
            pair = (-s, s)
        z = np.where(single[:, None], np.stack(pair, axis=1), z)
    return label, z


def _classifier(X, base_values, base_values_as_tensor, class_ids, class_nodeids, class_treeids, class_weights,
                class_weights_as_tensor, classlabels_int64s, classlabels_strings, nodes_falsenodeids,
                nodes_featureids, nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
                nodes_truenodeids, nodes_values, nodes_values_as_tensor, post_transform):
    check_post_transform(post_transform)
    labels = class_labels(classlabels_int64s, classlabels_strings, "TreeEnsembleClassifier")
    x = as_2d_features(X, "TreeEnsembleClassifier")
    weights = _floats(class_weights, class_weights_as_tensor, "class_weights")
    forest = _cached(
        lambda: _legacy_forest(nodes_treeids, nodes_nodeids, nodes_featureids,
                               _floats(nodes_values, nodes_values_as_tensor, "nodes_values"), nodes_modes,
                               nodes_truenodeids, nodes_falsenodeids, nodes_missing_value_tracks_true,
                               class_treeids, class_nodeids, class_ids, weights, labels.size),
        nodes_treeids, nodes_nodeids, nodes_featureids, nodes_values, nodes_values_as_tensor, nodes_modes,
        nodes_truenodeids, nodes_falsenodeids, nodes_missing_value_tracks_true, class_treeids, class_nodeids,
        class_ids, class_weights, class_weights_as_tensor, classlabels_int64s, classlabels_strings)
    scores, has = forest.scores(x, "SUM")
    ids = np.unique(np.asarray(class_ids if class_ids is not None else [], dtype=np.int64))
    binary_case = labels.size == 2 and ids.size == 1
    all_positive = bool((weights >= 0).all())
    label, z = _classifier_finish(scores, has, _base(base_values, base_values_as_tensor), labels, binary_case,
                                  all_positive, post_transform)
    return label, z.astype(np.float32)


@kernel("TreeEnsembleClassifier", since=1, domain=ML_DOMAIN)
def tree_ensemble_classifier_1(X, *, base_values=None, class_ids=None, class_nodeids=None, class_treeids=None,
                               class_weights=None, classlabels_int64s=None, classlabels_strings=None,
                               nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                               nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                               nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                               post_transform="NONE"):
    return _classifier(X, base_values, None, class_ids, class_nodeids, class_treeids, class_weights, None,
                       classlabels_int64s, classlabels_strings, nodes_falsenodeids, nodes_featureids,
                       nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids, nodes_truenodeids,
                       nodes_values, None, post_transform)


@kernel("TreeEnsembleClassifier", since=(3, 5), domain=ML_DOMAIN)
def tree_ensemble_classifier_3(X, *, base_values=None, base_values_as_tensor=None, class_ids=None,
                               class_nodeids=None, class_treeids=None, class_weights=None,
                               class_weights_as_tensor=None, classlabels_int64s=None, classlabels_strings=None,
                               nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                               nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                               nodes_modes=None, nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None,
                               nodes_values=None, nodes_values_as_tensor=None, post_transform="NONE"):
    return _classifier(X, base_values, base_values_as_tensor, class_ids, class_nodeids, class_treeids,
                       class_weights, class_weights_as_tensor, classlabels_int64s, classlabels_strings,
                       nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true, nodes_modes,
                       nodes_nodeids, nodes_treeids, nodes_truenodeids, nodes_values, nodes_values_as_tensor,
                       post_transform)
