"""Shared helpers for the convolution / pooling / image families (attribute normalisation, padding, windows)."""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._common import text


def compute_dtype(dt) -> np.dtype:
    """The dtype kernels compute in for an input dtype (float16/bfloat16 -> float32)."""
    dt = np.dtype(dt)
    if dt == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def check_rank(x: np.ndarray, op: str, name: str = "X", min_rank: int = 3) -> None:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{op}: input {name} must be a tensor, got {type(x).__name__}")
    if x.ndim < min_rank:
        raise ValueError(f"{op}: input {name} must have rank >= {min_rank} (N x C x D1 x ...), got shape {x.shape}")


def spatial_attr(value, n: int, default: int, op: str, name: str) -> list[int]:
    """Normalise a per-spatial-axis attribute (strides, dilations, kernel_shape) to a list of n ints."""
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return [default] * n
    vals = [int(v) for v in value]
    if len(vals) != n:
        raise ValueError(f"{op}: attribute {name} has {len(vals)} values, expected {n} (one per spatial axis)")
    return vals


def explicit_pads(pads, n: int, op: str) -> tuple[list[int], list[int]]:
    if pads is None or len(pads) == 0:
        return [0] * n, [0] * n
    p = [int(v) for v in pads]
    if len(p) != 2 * n:
        raise ValueError(f"{op}: attribute pads has {len(p)} values, expected {2 * n}")
    return p[:n], p[n:]


def conv_pads(auto_pad: str, pads, in_shape, kernel, strides, dilations, op: str) -> tuple[list[int], list[int]]:
    """Begin/end pads for Conv-like ops (output = floor((in + pads - eff_k) / s) + 1)."""
    n = len(in_shape)
    auto_pad = text(auto_pad) or "NOTSET"
    if auto_pad == "NOTSET":
        return explicit_pads(pads, n, op)
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pb, pe = [], []
        for i in range(n):
            out = -(-in_shape[i] // strides[i])
            eff = (kernel[i] - 1) * dilations[i] + 1
            total = max(0, (out - 1) * strides[i] + eff - in_shape[i])
            small, big = total // 2, total - total // 2
            if auto_pad == "SAME_UPPER":
                pb.append(small)
                pe.append(big)
            else:
                pb.append(big)
                pe.append(small)
        return pb, pe
    raise ValueError(f"{op}: unsupported auto_pad value {auto_pad!r}")


def pad_array(x: np.ndarray, pb, pe, value=0, leading: int = 2) -> np.ndarray:
    """Pad the trailing spatial axes of x (after `leading` axes) with a constant (negative pads crop)."""
    if not any(pb) and not any(pe):
        return x
    crop = tuple(slice(max(0, -b), x.shape[leading + i] - max(0, -e)) for i, (b, e) in enumerate(zip(pb, pe)))
    if any(b < 0 for b in pb) or any(e < 0 for e in pe):
        x = x[(slice(None),) * leading + crop]
        pb = [max(0, b) for b in pb]
        pe = [max(0, e) for e in pe]
    shape = x.shape[:leading] + tuple(s + b + e for s, b, e in zip(x.shape[leading:], pb, pe))
    out = np.full(shape, value, dtype=x.dtype) if value != 0 else np.zeros(shape, dtype=x.dtype)
    out[(slice(None),) * leading + tuple(slice(b, b + s) for b, s in zip(pb, x.shape[leading:]))] = x
    return out


def strided_view(x: np.ndarray, shape, strides) -> np.ndarray:
    """A read-only view of x's memory with the given shape and byte strides, starting at x's first element (as
    ``as_strided(..., writeable=False)``).  A C-contiguous x is viewed through the ndarray constructor (~0.9 us
    against as_strided's ~3 us: it builds its view through an ``__array_interface__`` object), which also checks
    that the view stays inside x; others go through as_strided."""
    if x.flags.c_contiguous:
        try:
            v = np.ndarray(shape, x.dtype, x, 0, strides)
        except (ValueError, TypeError):
            pass
        else:
            v.flags.writeable = False
            return v
    return as_strided(x, shape, strides, writeable=False)


def windows(xp: np.ndarray, kernel, strides, dilations, out_shape, leading: int = 2, kernel_first: bool = True):
    """Strided view of xp: leading axes, then kernel axes then output axes (kernel_first) or the reverse."""
    st = xp.strides
    lead_shape, lead_st = xp.shape[:leading], st[:leading]
    sp_st = st[leading:]
    k_shape = tuple(kernel)
    k_st = tuple(s * d for s, d in zip(sp_st, dilations))
    o_shape = tuple(out_shape)
    o_st = tuple(s * t for s, t in zip(sp_st, strides))
    if kernel_first:
        return strided_view(xp, lead_shape + k_shape + o_shape, lead_st + k_st + o_st)
    return strided_view(xp, lead_shape + o_shape + k_shape, lead_st + o_st + k_st)


def conv_out_shape(in_shape, kernel, strides, dilations, pb, pe, op: str) -> list[int]:
    out = []
    for i in range(len(in_shape)):
        eff = (kernel[i] - 1) * dilations[i] + 1
        o = (in_shape[i] + pb[i] + pe[i] - eff) // strides[i] + 1
        if in_shape[i] == 0:
            o = max(o, 0)
        elif o < 0 or in_shape[i] + pb[i] + pe[i] - eff < 0:
            raise ValueError(
                f"{op}: kernel (effective size {eff}) larger than padded input ({in_shape[i] + pb[i] + pe[i]}) "
                f"on spatial axis {i}")
        out.append(o)
    return out


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def prod(vals) -> int:
    return int(math.prod(int(v) for v in vals))
