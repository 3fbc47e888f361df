"""The ``com.microsoft.nchwc`` domain: onnxruntime's blocked-layout ops (written by its NchwcTransformer into
models saved at ORT_ENABLE_ALL on x86 CPUs with AVX2 / AVX-512).

onnxruntime's NCHWc layout splits the channels into blocks of ``B`` (the machine's float vector width: 8 with
AVX2, 16 with AVX-512) stored innermost: ``(N, C/B, H, W, B)``, with the channel count padded up to a multiple of
``B`` (the padding is zero).  Its tensors are declared with the padded logical shape ``(N, Cpad, H, W)``.

Here an NCHWc value is kept as a plain numpy array of that logical shape ``(N, Cpad, *spatial)`` (channels padded
with zeros, NCHW element order).  Nothing outside these kernels can observe the difference: the transformer always
ends a blocked region with ReorderOutput, and the ONNX ops it leaves working on blocked data (elementwise
Add/Sum/Mul/activations, Concat on channel-aligned inputs) give the same result in either element order.

What does depend on ``B`` is the order of the **filters** stored in the model (initializers reordered ahead of
time by the transformer):

* ``OIHWBo`` -- ``(O/B, I, KH, KW, Bo)``: Conv whose input is still NCHW (fewer than ``B`` input channels), and
  depthwise Conv (``group`` = padded channels, ``I`` = 1);
* ``OIHWBiBo`` -- ``(O/B, I/B, KH, KW, Bi, Bo)``: every other Conv (input in NCHWc).

``B`` is the block size of the machine running the model, as in onnxruntime (such a model "should only be used in
the same environment the model was optimized in"): 16 where the CPU has AVX-512F, else 8.  The environment variable
``ONNXPY_NCHWC_BLOCK_SIZE`` overrides it (to run a model saved on another kind of machine).
"""

from __future__ import annotations

import os

import numpy as np

from ._common import text
from . import _ew_math as _fast
from .conv import conv
from .image import resize
from .pool import average_pool, global_average_pool, global_max_pool, max_pool
from .registry import kernel

NCHWC_DOMAIN = "com.microsoft.nchwc"

_block_size: int | None = None


def _detect_block_size() -> int:
    env = os.environ.get("ONNXPY_NCHWC_BLOCK_SIZE")
    if env:
        try:
            b = int(env)
        except ValueError:
            raise ValueError(f"ONNXPY_NCHWC_BLOCK_SIZE must be an integer, got {env!r}") from None
        if b < 1:
            raise ValueError(f"ONNXPY_NCHWC_BLOCK_SIZE must be positive, got {b}")
        return b
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return 16 if "avx512f" in line.split() else 8
    except OSError:
        pass
    return 8  # AVX2-class x86 (and the default elsewhere)


def block_size() -> int:
    """The NCHWc channel block size used to read reordered filters (see the module docstring)."""
    global _block_size
    if _block_size is None:
        _block_size = _detect_block_size()
    return _block_size


def set_block_size(b: int | None) -> None:
    """Override the block size (None: detect again); for running models saved on another machine."""
    global _block_size
    if b is not None and int(b) < 1:
        raise ValueError(f"NCHWc block size must be positive, got {b}")
    _block_size = None if b is None else int(b)




def _padded(c: int, b: int) -> int:
    return -(-c // b) * b


def _check_float(X, op):
    if X.dtype != np.float32:
        raise TypeError(f"{op}: NCHWc ops take float32 tensors, got {X.dtype}")
    if X.ndim < 3:
        raise ValueError(f"{op}: input must have rank >= 3, got shape {list(X.shape)}")


# ---------------------------------------------------------------------------------------------- reorders


@kernel("ReorderInput", since=1, domain=NCHWC_DOMAIN)
def reorder_input(X, *, channels_last=0):
    """NCHW (or NHWC with channels_last=1) -> NCHWc: channels padded with zeros to a multiple of the block."""
    op = "ReorderInput"
    _check_float(X, op)
    x = np.moveaxis(X, -1, 1) if int(channels_last) else X
    c = x.shape[1]
    cp = _padded(c, block_size())
    if cp == c:
        return np.ascontiguousarray(x)
    out = np.zeros((x.shape[0], cp) + x.shape[2:], dtype=x.dtype)
    out[:, :c] = x
    return out


@kernel("ReorderOutput", since=1, domain=NCHWC_DOMAIN)
def reorder_output(X, *, channels=0, channels_last=0):
    """NCHWc -> NCHW (or NHWC with channels_last=1) keeping the first ``channels`` channels."""
    op = "ReorderOutput"
    _check_float(X, op)
    c = int(channels)
    if c <= 0 or c > X.shape[1]:
        raise ValueError(f"{op}: channels={c} must be in [1, {X.shape[1]}] for input shape {list(X.shape)}")
    y = X[:, :c]
    if int(channels_last):
        y = np.moveaxis(y, 1, -1)
    return np.ascontiguousarray(y)


# ---------------------------------------------------------------------------------------------- Conv

_unblock_cache: dict = {}


def _unblock_filter(W: np.ndarray, b: int, both: bool) -> np.ndarray:
    """Reordered filter -> plain OIHW (same padded shape)."""
    O, I = W.shape[:2]
    ks = W.shape[2:]
    n = len(ks)
    key = (id(W), W.shape, b, both)
    hit = _unblock_cache.get(key)
    if hit is not None and hit[0] is W:
        return hit[1]
    if O % b or (both and I % b):
        raise ValueError(f"Conv (nchwc): filter shape {list(W.shape)} is not a multiple of the channel block {b}; "
                         "set ONNXPY_NCHWC_BLOCK_SIZE to the block size of the machine that saved the model")
    sp = tuple(range(2, 2 + n))
    if both:  # (O/B, I/B, *K, Bi, Bo) -> (O/B, Bo, I/B, Bi, *K)
        v = W.reshape((O // b, I // b) + ks + (b, b))
        perm = (0, 3 + n, 1, 2 + n) + sp
    else:  # (O/B, I, *K, Bo) -> (O/B, Bo, I, *K)
        v = W.reshape((O // b, I) + ks + (b,))
        perm = (0, 2 + n, 1) + sp
    out = np.ascontiguousarray(v.transpose(perm)).reshape(W.shape)
    if len(_unblock_cache) > 256:
        _unblock_cache.clear()
    _unblock_cache[key] = (W, out)
    return out


def _activation(y: np.ndarray, name, params) -> np.ndarray:
    if name is None:
        return y
    name = text(name)
    p = [float(v) for v in (params or [])]
    if name in ("", "Identity"):
        return y
    if name == "Relu":
        return _fast.relu(y, y)
    if name == "LeakyRelu":
        alpha = p[0] if p else 0.01
        return np.where(y >= 0, y, y * np.float32(alpha)).astype(y.dtype, copy=False)
    if name == "Tanh":
        return np.tanh(y, out=y)
    if name == "Sigmoid":
        with np.errstate(over="ignore"):
            return (1.0 / (1.0 + np.exp(-y))).astype(y.dtype, copy=False)
    if name == "Clip":
        lo = p[0] if len(p) > 0 else -np.inf
        hi = p[1] if len(p) > 1 else np.inf
        return _fast.clip(y, lo, hi, out=y)
    if name == "HardSigmoid":
        alpha = p[0] if len(p) > 0 else 0.2
        beta = p[1] if len(p) > 1 else 0.5
        return np.clip(y * np.float32(alpha) + np.float32(beta), 0, 1).astype(y.dtype, copy=False)
    raise ValueError(f"Conv (nchwc): unsupported activation {name!r}")


def _fit_channels(X: np.ndarray, c: int) -> np.ndarray:
    """Pad (with zeros) or drop trailing zero channels so X has ``c`` channels."""
    have = X.shape[1]
    if have == c:
        return X
    if have > c:
        return X[:, :c]
    out = np.zeros((X.shape[0], c) + X.shape[2:], dtype=X.dtype)
    out[:, :have] = X
    return out


@kernel("Conv", since=1, domain=NCHWC_DOMAIN)
def nchwc_conv(X, W, B=None, Sum=None, *, activation=None, activation_params=None, auto_pad="NOTSET",
               dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv on NCHWc data with a reordered filter; ``Sum`` (NCHWc) is added before the fused activation."""
    op = "Conv (nchwc)"
    _check_float(X, op)
    if W.ndim != X.ndim:
        raise ValueError(f"{op}: X rank {X.ndim} and W rank {W.ndim} differ")
    b = block_size()
    g = int(group)
    if g > 1:
        if W.shape[1] != 1:
            raise ValueError(f"{op}: grouped NCHWc convolution must be depthwise (filter {list(W.shape)})")
        w = _unblock_filter(W, b, both=False)
        x = _fit_channels(X, g)
    elif X.shape[1] < b:  # input still in NCHW
        w = _unblock_filter(W, b, both=False)
        x = X
        if X.shape[1] != W.shape[1]:
            raise ValueError(f"{op}: input has {X.shape[1]} channels, filter expects {W.shape[1]}")
    else:
        w = _unblock_filter(W, b, both=True)
        x = _fit_channels(X, W.shape[1])
    y = conv(x, w, B, auto_pad=auto_pad, dilations=dilations, group=g, kernel_shape=kernel_shape, pads=pads,
             strides=strides)
    if Sum is not None:
        if Sum.shape != y.shape:
            s = _fit_channels(Sum, y.shape[1])
            if s.shape != y.shape:
                raise ValueError(f"{op}: Sum shape {list(Sum.shape)} does not match output {list(y.shape)}")
        else:
            s = Sum
        y = y + s
    return _activation(y, activation, activation_params)


# ---------------------------------------------------------------------------------------------- pooling


@kernel("MaxPool", since=1, domain=NCHWC_DOMAIN)
def nchwc_max_pool(X, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
                   storage_order=0, strides=None):
    _check_float(X, "MaxPool (nchwc)")
    return max_pool(X, auto_pad=auto_pad, ceil_mode=ceil_mode, dilations=dilations, kernel_shape=kernel_shape,
                    pads=pads, storage_order=storage_order, strides=strides)


@kernel("AveragePool", since=1, domain=NCHWC_DOMAIN)
def nchwc_average_pool(X, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape=None,
                       pads=None, strides=None):
    _check_float(X, "AveragePool (nchwc)")
    return average_pool(X, auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                        dilations=dilations, kernel_shape=kernel_shape, pads=pads, strides=strides)


@kernel("GlobalAveragePool", since=1, domain=NCHWC_DOMAIN)
def nchwc_global_average_pool(X):
    _check_float(X, "GlobalAveragePool (nchwc)")
    return global_average_pool(X)


@kernel("GlobalMaxPool", since=1, domain=NCHWC_DOMAIN)
def nchwc_global_max_pool(X):
    _check_float(X, "GlobalMaxPool (nchwc)")
    return global_max_pool(X)


# ---------------------------------------------------------------------------------------------- Upsample


@kernel("Upsample", since=1, domain=NCHWC_DOMAIN)
def nchwc_upsample(X, *, coordinate_transformation_mode="asymmetric", mode="nearest", scales=None):
    """Integer-factor upsampling of the spatial axes (``scales`` covers every axis, N and C must be 1)."""
    op = "Upsample (nchwc)"
    _check_float(X, op)
    sc = [int(v) for v in (scales or [])]
    if len(sc) != X.ndim:
        raise ValueError(f"{op}: scales {sc} must have one value per axis of the rank-{X.ndim} input")
    if sc[0] != 1 or sc[1] != 1 or any(v < 1 for v in sc):
        raise ValueError(f"{op}: scales {sc} must be 1 on N and C and positive elsewhere")
    mode = text(mode)
    ctm = text(coordinate_transformation_mode)
    if mode == "nearest":
        y = X
        for a in range(2, X.ndim):
            if sc[a] != 1:
                y = np.repeat(y, sc[a], axis=a)
        return np.ascontiguousarray(y)
    if mode != "linear":
        raise ValueError(f"{op}: unsupported mode {mode!r}")
    return resize(X, None, np.array(sc, dtype=np.float32), None, mode="linear",
                  coordinate_transformation_mode=ctm)
