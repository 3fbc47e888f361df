"""ai.onnx.ml feature pre-processing operators.

Normalizer, Scaler, Binarizer, Imputer, OneHotEncoder, ArrayFeatureExtractor, FeatureVectorizer,
CategoryMapper, LabelEncoder (opsets 1, 2, 4), ZipMap, DictVectorizer and CastMap.

Maps arrive as Python ``dict`` and ZipMap returns a Python ``list`` of ``dict`` (seq(map(K, float))).
"""

from __future__ import annotations

import numpy as np

from .registry import ML_DOMAIN, kernel

_STR = np.dtype(object)


# ----------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------
def _as_array(x, name="X"):
    if not isinstance(x, np.ndarray):
        if isinstance(x, (dict, list)) or x is None:
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
        x = np.asarray(x)
    return x


def _is_str(x: np.ndarray) -> bool:
    return x.dtype == _STR or x.dtype.kind in "US"


def _str_array(values, shape=None) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out if shape is None else out.reshape(shape)


def _lookup(x: np.ndarray, keys, values: np.ndarray, default) -> np.ndarray:
    """Map every element of ``x`` through ``keys -> values`` (later keys win), ``default`` when absent.

    String keys use a dict over the unique input values; numeric keys a sorted search (NaN keys match NaN).
    """
    values = np.asarray(values)
    out_dtype = values.dtype
    if len(keys) != len(values):
        raise ValueError(f"keys and values must have the same length, got {len(keys)} and {len(values)}")
    if x.size == 0:
        return np.empty(x.shape, dtype=out_dtype)
    if _is_str(x) or (len(keys) and isinstance(keys[0], str)) or (isinstance(keys, np.ndarray) and _is_str(keys)):
        table = {str(k): v for k, v in zip(list(keys), values.tolist())}
        flat = x.ravel()
        uniq, inv = np.unique(flat.astype(object) if flat.dtype.kind in "US" else flat, return_inverse=True)
        mapped = [table.get(u if isinstance(u, str) else str(u), default) for u in uniq.tolist()]
        res = _str_array(mapped) if out_dtype == _STR else np.array(mapped, dtype=out_dtype)
        return res[inv].reshape(x.shape)
    kf = np.asarray(keys)
    if kf.dtype.kind == "f" or x.dtype.kind == "f":
        kf = kf.astype(np.float64)
        xf = x.astype(np.float64)
    else:
        kf = kf.astype(np.int64)
        xf = x.astype(np.int64)
    nan_key = np.isnan(kf) if kf.dtype.kind == "f" else np.zeros(kf.shape, bool)
    nan_value = values[np.nonzero(nan_key)[0][-1]] if nan_key.any() else None
    keep = np.nonzero(~nan_key)[0]
    k_ok, v_ok = kf[keep], values[keep]
    # last occurrence wins: unique over the reversed order keeps the first of the reversed sequence
    rk, first = np.unique(k_ok[::-1], return_index=True)
    rv = v_ok[::-1][first]
    if out_dtype == _STR:
        res = np.empty(x.shape, dtype=object)
        res[...] = default
    else:
        res = np.full(x.shape, default, dtype=out_dtype)
    if rk.size:
        pos = np.searchsorted(rk, xf)
        posc = np.minimum(pos, rk.size - 1)
        hit = rk[posc] == xf
        res[hit] = rv[posc[hit]]
    if nan_value is not None and xf.dtype.kind == "f":
        res[np.isnan(xf)] = nan_value
    return res


def _rows(x: np.ndarray) -> np.ndarray:
    """View as [N, C]: 1-D -> [1, C], N-D -> [N, prod(rest)]."""
    if x.ndim == 0:
        raise ValueError("input must have at least one dimension")
    if x.ndim == 1:
        return x.reshape(1, -1)
    return x.reshape(x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64)))


# ----------------------------------------------------------------------------------------------------------------
# numeric transforms
# ----------------------------------------------------------------------------------------------------------------
@kernel("Binarizer", since=1, domain=ML_DOMAIN)
def binarizer(X, *, threshold=0.0):
    X = _as_array(X)
    if X.dtype.kind == "f" and np.isnan(X).any():
        idx = int(np.flatnonzero(np.isnan(X.ravel()))[0])
        raise ValueError(f"Binarizer: input data with index {idx} is NaN")
    return (X > np.asarray(threshold, dtype=np.float64)).astype(X.dtype)


@kernel("Normalizer", since=1, domain=ML_DOMAIN)
def normalizer(X, *, norm="MAX"):
    X = _as_array(X)
    if X.ndim == 0:
        raise ValueError("Normalizer: input must have at least one dimension")
    x = X.astype(np.float64)
    if norm == "MAX":
        d = x.max(axis=-1, keepdims=True) if x.shape[-1] else np.zeros(x.shape[:-1] + (1,))
    elif norm == "L1":
        d = np.abs(x).sum(axis=-1, keepdims=True)
    elif norm == "L2":
        d = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    else:
        raise ValueError(f"Normalizer: norm must be MAX, L1 or L2, got {norm!r}")
    safe = np.where(d == 0, 1.0, d)
    return (x / safe).astype(np.float32)


def _per_feature(vals, n, what):
    a = np.asarray(vals if vals is not None else [], dtype=np.float64)
    if a.size in (0, 1) or a.size == n:
        return a
    raise ValueError(f"{what} must have 1 or {n} (the last dimension) values, got {a.size}")


@kernel("Scaler", since=1, domain=ML_DOMAIN)
def scaler(X, *, offset=None, scale=None):
    X = _as_array(X)
    if X.ndim == 0:
        X = X.reshape(1)
    n = X.shape[-1]
    off = _per_feature(offset, n, "Scaler offset")
    sc = _per_feature(scale, n, "Scaler scale")
    x = X.astype(np.float64)
    if off.size:
        x = x - off
    if sc.size:
        x = x * sc
    return x.astype(np.float32)


@kernel("Imputer", since=1, domain=ML_DOMAIN)
def imputer(X, *, imputed_value_floats=None, imputed_value_int64s=None, replaced_value_float=0.0,
            replaced_value_int64=0):
    X = _as_array(X)
    if X.dtype.kind == "f":
        vals, rep = imputed_value_floats, replaced_value_float
    elif X.dtype.kind in "iu":
        vals, rep = imputed_value_int64s, replaced_value_int64
    else:
        raise TypeError(f"Imputer: unsupported input type {X.dtype}")
    if not vals:
        raise ValueError("Imputer: imputed_value_floats / imputed_value_int64s matching the input type is required")
    n = X.shape[-1] if X.ndim else 1
    imp = np.asarray(vals)
    if imp.size != 1 and imp.size != n:
        raise ValueError(f"Imputer: {imp.size} imputed values for a last dimension of {n}")
    if X.dtype.kind == "f" and np.isnan(rep):
        mask = np.isnan(X)
    else:
        mask = X == np.asarray(rep).astype(X.dtype)
    fill = np.broadcast_to(imp.astype(X.dtype), X.shape)
    return np.where(mask, fill, X)


@kernel("OneHotEncoder", since=1, domain=ML_DOMAIN)
def one_hot_encoder(X, *, cats_int64s=None, cats_strings=None, zeros=1):
    X = _as_array(X)
    if _is_str(X):
        if not cats_strings:
            raise ValueError("OneHotEncoder: string input needs cats_strings")
        cats = list(cats_strings)
        idx = _lookup(X, cats, np.arange(len(cats), dtype=np.int64), -1)
    else:
        if not cats_int64s:
            raise ValueError("OneHotEncoder: numeric input needs cats_int64s")
        cats = list(cats_int64s)
        if X.dtype.kind == "f":
            finite = np.isfinite(X)
            xi = np.where(finite, np.trunc(np.where(finite, X, 0)), 0).astype(np.int64)
        else:
            finite = None
            xi = X.astype(np.int64)
        idx = _lookup(xi, cats, np.arange(len(cats), dtype=np.int64), -1)
        if finite is not None:
            idx = np.where(finite, idx, -1)
    if not zeros and (idx < 0).any():
        raise ValueError("OneHotEncoder: unknown category and zeros = 0")
    n = len(cats)
    out = (idx[..., None] == np.arange(n, dtype=np.int64)).astype(np.float32)
    return out


@kernel("ArrayFeatureExtractor", since=1, domain=ML_DOMAIN)
def array_feature_extractor(X, Y):
    X = _as_array(X)
    Y = _as_array(Y, "Y")
    if X.ndim == 0:
        raise ValueError("ArrayFeatureExtractor: X input has empty dimensions")
    if Y.dtype.kind not in "iu":
        raise TypeError(f"ArrayFeatureExtractor: Y must be int64, got {Y.dtype}")
    idx = Y.astype(np.int64).ravel()
    n = X.shape[-1]
    bad = (idx < 0) | (idx >= n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"ArrayFeatureExtractor: index out of range: Y[{i}] ({idx[i]}) must be in [0, {n})")
    out = np.take(X, idx, axis=-1)
    if X.ndim == 1:
        out = out.reshape(1, -1)
    return out


@kernel("FeatureVectorizer", since=1, domain=ML_DOMAIN)
def feature_vectorizer(*inputs, inputdimensions=None):
    if not inputs:
        raise ValueError("FeatureVectorizer needs at least one input")
    dims = list(inputdimensions) if inputdimensions else None
    if dims is not None and len(dims) != len(inputs):
        raise ValueError(f"FeatureVectorizer: {len(inputs)} inputs but {len(dims)} inputdimensions")
    rows = []
    for i, x in enumerate(inputs):
        x = _as_array(x, f"input {i}")
        if x.ndim == 0:
            raise ValueError(f"FeatureVectorizer: input {i} must have at least 1 dimension")
        if x.dtype.kind not in "iuf":
            raise TypeError(f"FeatureVectorizer: input {i} has unsupported type {x.dtype}")
        rows.append(_rows(x))
    n = rows[0].shape[0]
    parts = []
    for i, r in enumerate(rows):
        if r.shape[0] != n:
            raise ValueError(f"FeatureVectorizer: all inputs must have the same batch size; input 0 has {n}, "
                             f"input {i} has {r.shape[0]}")
        d = dims[i] if dims is not None else r.shape[1]
        if d < 0:
            raise ValueError(f"FeatureVectorizer: negative inputdimensions {d}")
        part = np.zeros((n, d), dtype=np.float32)
        k = min(d, r.shape[1])
        part[:, :k] = r[:, :k]
        parts.append(part)
    return np.concatenate(parts, axis=1)


# ----------------------------------------------------------------------------------------------------------------
# categorical mappings
# ----------------------------------------------------------------------------------------------------------------
@kernel("CategoryMapper", since=1, domain=ML_DOMAIN)
def category_mapper(X, *, cats_int64s=None, cats_strings=None, default_int64=-1, default_string="_Unused"):
    X = _as_array(X)
    ints = list(cats_int64s or [])
    strs = list(cats_strings or [])
    if len(ints) != len(strs):
        raise ValueError(f"CategoryMapper: cats_int64s ({len(ints)}) and cats_strings ({len(strs)}) differ in length")
    if _is_str(X):
        return _lookup(X, strs, np.array(ints, dtype=np.int64), default_int64)
    if X.dtype.kind not in "iu":
        raise TypeError(f"CategoryMapper: input must be int64 or string, got {X.dtype}")
    return _lookup(X.astype(np.int64), ints, _str_array(strs), default_string)


@kernel("LabelEncoder", since=1, domain=ML_DOMAIN)
def label_encoder_1(X, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    X = _as_array(X)
    classes = list(classes_strings or [])
    if _is_str(X):
        return _lookup(X, classes, np.arange(len(classes), dtype=np.int64), default_int64)
    if X.dtype.kind not in "iu":
        raise TypeError(f"LabelEncoder: input must be int64 or string, got {X.dtype}")
    xi = X.astype(np.int64)
    ok = (xi >= 0) & (xi < len(classes))
    out = np.empty(X.shape, dtype=object)
    out[...] = default_string
    if classes:
        table = _str_array(classes)
        out[ok] = table[xi[ok]]
    return out


def _label_encoder(X, keys_floats, keys_int64s, keys_strings, keys_tensor, values_floats, values_int64s,
                   values_strings, values_tensor, default_float, default_int64, default_string, default_tensor):
    X = _as_array(X)
    key_sets = [k for k in (keys_floats, keys_int64s, keys_strings, keys_tensor) if k is not None and len(k)]
    val_sets = [v for v in (values_floats, values_int64s, values_strings, values_tensor) if v is not None and len(v)]
    if len(key_sets) != 1 or len(val_sets) != 1:
        raise ValueError("LabelEncoder: exactly one keys_* and one values_* attribute must be set")
    if keys_tensor is not None and len(keys_tensor):
        keys = np.asarray(keys_tensor).ravel()
        keys = list(keys) if _is_str(keys) else keys
    elif keys_strings:
        keys = list(keys_strings)
    elif keys_int64s:
        keys = np.asarray(keys_int64s, dtype=np.int64)
    else:
        keys = np.asarray(keys_floats, dtype=np.float32)
    if values_tensor is not None and len(values_tensor):
        vals = np.asarray(values_tensor).ravel()
    elif values_strings:
        vals = _str_array(values_strings)
    elif values_int64s:
        vals = np.asarray(values_int64s, dtype=np.int64)
    else:
        vals = np.asarray(values_floats, dtype=np.float32)
    if default_tensor is not None:
        default = np.asarray(default_tensor).ravel()
        if default.size != 1:
            raise ValueError("LabelEncoder: default_tensor must hold one value")
        default = default[0]
    elif vals.dtype == _STR:
        default = default_string
    elif vals.dtype.kind in "iu":
        default = default_int64
    else:
        default = default_float
    key_is_str = isinstance(keys, list)
    if key_is_str != _is_str(X):
        raise TypeError(f"LabelEncoder: input type {X.dtype} does not match the keys' type")
    return _lookup(X, keys, vals, default)


@kernel("LabelEncoder", since=2, domain=ML_DOMAIN)
def label_encoder_2(X, *, keys_floats=None, keys_int64s=None, keys_strings=None, values_floats=None,
                    values_int64s=None, values_strings=None, default_float=-0.0, default_int64=-1,
                    default_string="_Unused"):
    return _label_encoder(X, keys_floats, keys_int64s, keys_strings, None, values_floats, values_int64s,
                          values_strings, None, default_float, default_int64, default_string, None)


@kernel("LabelEncoder", since=4, domain=ML_DOMAIN)
def label_encoder_4(X, *, keys_floats=None, keys_int64s=None, keys_strings=None, keys_tensor=None,
                    values_floats=None, values_int64s=None, values_strings=None, values_tensor=None,
                    default_float=-0.0, default_int64=-1, default_string="_Unused", default_tensor=None):
    return _label_encoder(X, keys_floats, keys_int64s, keys_strings, keys_tensor, values_floats, values_int64s,
                          values_strings, values_tensor, default_float, default_int64, default_string,
                          default_tensor)


# ----------------------------------------------------------------------------------------------------------------
# maps
# ----------------------------------------------------------------------------------------------------------------
@kernel("ZipMap", since=1, domain=ML_DOMAIN)
def zip_map(X, *, classlabels_int64s=None, classlabels_strings=None):
    X = _as_array(X)
    if classlabels_strings and classlabels_int64s:
        raise ValueError("ZipMap: only one of classlabels_strings and classlabels_int64s may be set")
    if classlabels_strings:
        labels = [str(s) for s in classlabels_strings]
    elif classlabels_int64s:
        labels = [int(i) for i in classlabels_int64s]
    else:
        raise ValueError("ZipMap: classlabels_strings or classlabels_int64s is required")
    if X.ndim == 0 or X.ndim > 2:
        raise ValueError(f"ZipMap: input must be 1-D or 2-D, got shape {X.shape}")
    rows = X.reshape(1, -1) if X.ndim == 1 else X
    if rows.shape[1] != len(labels):
        raise ValueError(f"ZipMap: input has {rows.shape[1]} columns but {len(labels)} class labels")
    return [dict(zip(labels, r)) for r in rows.astype(np.float32).tolist()]


def _map_values_dtype(values):
    """numpy dtype of a map's values: numpy scalars keep theirs; Python float -> float32, int -> int64."""
    for v in values:
        if isinstance(v, np.generic) or isinstance(v, np.ndarray):
            return np.asarray(v).dtype
        if isinstance(v, str):
            return _STR
        if isinstance(v, (bool, int)) and not isinstance(v, bool):
            return np.dtype(np.int64)
        if isinstance(v, float):
            return np.dtype(np.float32)
    return np.dtype(np.float32)


def _check_map(X, op):
    if not isinstance(X, dict):
        raise TypeError(f"{op}: input must be a map (dict), got {type(X).__name__}")


@kernel("DictVectorizer", since=1, domain=ML_DOMAIN)
def dict_vectorizer(X, *, int64_vocabulary=None, string_vocabulary=None):
    _check_map(X, "DictVectorizer")
    if string_vocabulary:
        vocab = {str(k): i for i, k in enumerate(string_vocabulary)}
        conv = str
    elif int64_vocabulary:
        vocab = {int(k): i for i, k in enumerate(int64_vocabulary)}
        conv = int
    else:
        raise ValueError("DictVectorizer: string_vocabulary or int64_vocabulary is required")
    dtype = _map_values_dtype(X.values())
    out = np.empty((1, len(vocab)), dtype=dtype)
    if dtype == _STR:
        out[...] = ""
    else:
        out[...] = 0
    pos, vals = [], []
    for k, v in X.items():
        try:
            i = vocab.get(conv(k))
        except (TypeError, ValueError):
            i = None
        if i is not None:
            pos.append(i)
            vals.append(v)
    if pos:
        if dtype == _STR:
            out[0, pos] = _str_array([str(v) for v in vals])
        else:
            out[0, pos] = np.asarray(vals).astype(dtype)
    return out


def _cast_string_values(vals, cast_to):
    if cast_to == "TO_STRING":
        return _str_array([str(v) for v in vals])
    try:
        if cast_to == "TO_FLOAT":
            return np.array([float(v) for v in vals], dtype=np.float32)
        return np.array([int(float(v)) if not str(v).lstrip("+-").isdigit() else int(v) for v in vals],
                        dtype=np.int64)
    except ValueError as e:
        raise ValueError(f"CastMap: cannot convert map value to {cast_to}: {e}") from None


@kernel("CastMap", since=1, domain=ML_DOMAIN)
def cast_map(X, *, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
    _check_map(X, "CastMap")
    if cast_to not in ("TO_FLOAT", "TO_STRING", "TO_INT64"):
        raise ValueError(f"CastMap: cast_to must be TO_FLOAT, TO_STRING or TO_INT64, got {cast_to!r}")
    if map_form not in ("DENSE", "SPARSE"):
        raise ValueError(f"CastMap: map_form must be DENSE or SPARSE, got {map_form!r}")
    keys = sorted(int(k) for k in X)
    raw = [X[k] for k in sorted(X, key=int)]
    str_values = any(isinstance(v, str) for v in raw)
    if str_values:
        vals = _cast_string_values(raw, cast_to)
    else:
        f = np.asarray(raw, dtype=np.float32) if raw else np.zeros(0, np.float32)
        if cast_to == "TO_FLOAT":
            vals = f
        elif cast_to == "TO_INT64":
            vals = np.trunc(f).astype(np.int64)
        else:
            vals = _str_array([f"{v:f}" for v in f.tolist()])
    if map_form == "DENSE":
        return vals.reshape(1, -1)
    if max_map < 0:
        raise ValueError(f"CastMap: max_map must be >= 0, got {max_map}")
    if cast_to == "TO_STRING":
        out = np.empty((1, max_map), dtype=object)
        out[...] = "0.f"
    else:
        out = np.zeros((1, max_map), dtype=vals.dtype)
    k = np.asarray(keys, dtype=np.int64)
    ok = (k >= 0) & (k < max_map)
    out[0, k[ok]] = vals[ok]
    return out
