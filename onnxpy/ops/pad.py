"""Padding kernels: Pad (all versions; constant/reflect/edge/wrap, negative pads crop) and CenterCropPad."""

from __future__ import annotations

import numpy as np

from ._shape_util import check_shape, full, norm_axes, to_ints, zero_of
from .registry import kernel

_MODES = ("constant", "reflect", "edge", "wrap")


def _pad(x: np.ndarray, pads: list[int], mode: str, value, axes=None) -> np.ndarray:
    r = x.ndim
    if mode not in _MODES:
        raise ValueError(f"Pad: unsupported mode {mode!r} (expected one of {', '.join(_MODES)})")
    axes = list(range(r)) if axes is None else norm_axes(axes, r)
    n = len(axes)
    if len(pads) != 2 * n:
        raise ValueError(f"Pad: pads has {len(pads)} values, expected {2 * n} (2 per padded axis)")
    begin = [0] * r
    end = [0] * r
    for i, a in enumerate(axes):
        begin[a] = pads[i]
        end[a] = pads[i + n]
    # negative pads remove elements: crop first
    if any(p < 0 for p in pads):
        sl = []
        for d in range(r):
            s = -begin[d] if begin[d] < 0 else 0
            e = x.shape[d] + end[d] if end[d] < 0 else x.shape[d]
            if e < s:
                raise ValueError(f"Pad: negative pads {pads} remove more than dimension {d} of size {x.shape[d]}")
            sl.append(slice(s, e))
        x = x[tuple(sl)]
        begin = [max(p, 0) for p in begin]
        end = [max(p, 0) for p in end]
    if not any(begin) and not any(end):
        return x
    shape = check_shape([d + b + e for d, b, e in zip(x.shape, begin, end)], x.dtype, "Pad output")
    if mode == "constant":
        out = full(shape, value, x.dtype)
        out[tuple(slice(b, b + d) for b, d in zip(begin, x.shape))] = x
        return out
    for d in range(r):
        if (begin[d] or end[d]) and x.shape[d] == 0:
            raise ValueError(f"Pad: cannot pad an empty dimension {d} in {mode} mode")
    if mode == "reflect":
        for d in range(r):
            if max(begin[d], end[d]) > x.shape[d] - 1:
                raise ValueError(
                    f"Pad: reflect pads ({begin[d]}, {end[d]}) exceed the maximum {x.shape[d] - 1} for axis {d} "
                    f"of size {x.shape[d]}"
                )
    if mode == "reflect" or mode == "edge":
        # One concatenate per padded axis (np.pad's generic machinery costs ~50 us even on tiny tensors).
        for d in range(r):
            b, e = begin[d], end[d]
            if not b and not e:
                continue
            pre = [slice(None)] * d
            parts = []
            if mode == "reflect":
                if b:
                    parts.append(x[tuple(pre + [slice(b, 0, -1)])])
                parts.append(x)
                if e:
                    n = x.shape[d]
                    parts.append(x[tuple(pre + [slice(n - 2, n - 2 - e if n - 2 - e >= 0 else None, -1)])])
            else:
                if b:
                    first = x[tuple(pre + [slice(0, 1)])]
                    parts.append(np.broadcast_to(first, first.shape[:d] + (b,) + first.shape[d + 1:]))
                parts.append(x)
                if e:
                    last = x[tuple(pre + [slice(-1, None)])]
                    parts.append(np.broadcast_to(last, last.shape[:d] + (e,) + last.shape[d + 1:]))
            x = np.concatenate(parts, axis=d)
        return x
    np_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
    return np.pad(x, list(zip(begin, end)), mode=np_mode)


def _value(constant_value, dtype):
    if constant_value is None or (isinstance(constant_value, np.ndarray) and constant_value.size == 0):
        return zero_of(dtype)
    v = np.asarray(constant_value)
    if v.size != 1:
        raise ValueError(f"Pad: constant_value must be a scalar, got shape {list(v.shape)}")
    return v.reshape(-1)[0]


@kernel("Pad", since=1)
def pad_1(data, *, paddings=None, mode="constant", value=0.0):
    if paddings is None:
        raise ValueError("Pad-1: the 'paddings' attribute is required")
    return _pad(data, list(paddings), mode, "" if data.dtype == object else value)


@kernel("Pad", since=2)
def pad_2(data, *, pads=None, mode="constant", value=0.0):
    if pads is None:
        raise ValueError("Pad: the 'pads' attribute is required")
    return _pad(data, list(pads), mode, "" if data.dtype == object else value)


@kernel("Pad", since=11)
def pad_11(data, pads, constant_value=None, *, mode="constant"):
    return _pad(data, to_ints(pads, "pads"), mode, _value(constant_value, data.dtype))


@kernel("Pad", since=18)
def pad_18(data, pads, constant_value=None, axes=None, *, mode="constant"):
    ax = None if axes is None else to_ints(axes, "axes")
    return _pad(data, to_ints(pads, "pads"), mode, _value(constant_value, data.dtype), ax)


@kernel("CenterCropPad", since=18)
def center_crop_pad(input_data, shape, *, axes=None):
    x = input_data
    r = x.ndim
    ax = list(range(r)) if axes is None else norm_axes(axes, r)
    target = to_ints(shape, "shape")
    if len(target) != len(ax):
        raise ValueError(f"CenterCropPad: shape has {len(target)} values for {len(ax)} axes")
    out_shape = list(x.shape)
    src = [slice(None)] * r
    dst = [slice(None)] * r
    for a, t in zip(ax, target):
        d = x.shape[a]
        if t < 0:
            raise ValueError(f"CenterCropPad: negative target size {t}")
        out_shape[a] = t
        if d > t:
            s = (d - t) // 2
            src[a] = slice(s, s + t)
        elif d < t:
            s = (t - d) // 2
            dst[a] = slice(s, s + d)
    cropped = x[tuple(src)]
    if all(isinstance(s, slice) and s == slice(None) for s in dst):
        return cropped
    out = full(check_shape(out_shape, x.dtype, "CenterCropPad output"), zero_of(x.dtype), x.dtype)
    out[tuple(dst)] = cropped
    return out
