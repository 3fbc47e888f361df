"""Padding kernels: Pad (all versions; constant/reflect/edge/wrap, negative pads crop) and CenterCropPad."""

from __future__ import annotations

import numpy as np

from ._common import text
from ._shape_util import NOT_CONST, check_shape, full, norm_axes, to_ints, within_limit, zero_of
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


def _pad_plan(x: np.ndarray, pads: list[int], mode: str, axes):
    """How to pad arrays of ``x``'s shape: (crop index or None, out shape, per-axis gather indices or the
    destination index of a constant pad).  Only called after the generic kernel accepted the same arguments."""
    r = x.ndim
    axes = list(range(r)) if axes is None else norm_axes(axes, r)
    n = len(axes)
    begin = [0] * r
    end = [0] * r
    for i, a in enumerate(axes):
        begin[a] = pads[i]
        end[a] = pads[i + n]
    crop = None
    shape = list(x.shape)
    if any(p < 0 for p in pads):
        crop = tuple(slice(-b if b < 0 else 0, d + e if e < 0 else d) for d, b, e in zip(x.shape, begin, end))
        shape = [len(range(*s.indices(d))) for s, d in zip(crop, x.shape)]
        begin = [max(p, 0) for p in begin]
        end = [max(p, 0) for p in end]
    out_shape = tuple(d + b + e for d, b, e in zip(shape, begin, end))
    if not any(begin) and not any(end):
        return crop, out_shape, None  # nothing to add (at most a crop)
    if mode == "constant":
        return crop, out_shape, tuple(slice(b, b + d) for b, d in zip(begin, shape))
    takes = []
    for a in range(r):
        b, e, d = begin[a], end[a], shape[a]
        if not b and not e:
            continue
        i = np.arange(-b, d + e)
        if mode == "reflect":
            i = np.abs(i)
            i = np.where(i > d - 1, 2 * (d - 1) - i, i)
        elif mode == "edge":
            i = np.clip(i, 0, d - 1)
        else:  # wrap
            i = i % d
        i = i.astype(np.intp)
        i.flags.writeable = False
        takes.append((a, i))
    return crop, out_shape, tuple(takes)


def _spec_pad(consts, kwargs):
    """Pad-11+ with constant pads (and constant value/axes): the padding layout is derived once per input shape;
    edge/reflect/wrap padding becomes one gather per padded axis."""
    mode = kwargs.get("mode", "constant")
    mode = text(mode)
    if mode not in _MODES or len(consts) < 2 or any(c is NOT_CONST for c in consts[1:]):
        return None
    pads_c = consts[1]
    if type(pads_c) is not np.ndarray or pads_c.dtype.kind not in "iu":
        return None
    pads = to_ints(pads_c, "pads")
    cv = consts[2] if len(consts) > 2 else None
    axes_c = consts[3] if len(consts) > 3 else None
    if axes_c is not None and (type(axes_c) is not np.ndarray or axes_c.dtype.kind not in "iu"):
        return None
    axes = None if axes_c is None else to_ints(axes_c, "axes")
    generic = pad_18 if len(consts) > 3 else pad_11
    memo = {}

    def pad_const(data, *args):
        key = (data.shape, data.dtype)
        ent = memo.get(key)
        if ent is None:
            out = generic(data, *args, mode=mode)  # validates (and reports) exactly as the generic kernel
            if len(memo) < 32:
                plan = _pad_plan(data, pads, mode, axes)
                nbytes = data.dtype.itemsize or 8  # (as limits.check_alloc counts)
                if data.dtype.kind == "O":
                    nbytes = max(nbytes, 8)
                for d in plan[1]:
                    nbytes *= d
                memo[key] = (plan, _value(cv, data.dtype), nbytes)
            return out
        (crop, out_shape, how), value, nbytes = ent
        x = data if crop is None else data[crop]
        if how is None:
            return x
        if not within_limit(nbytes):
            check_shape(out_shape, x.dtype, "Pad output")  # raises the limit error
        if mode == "constant":
            out = full(out_shape, value, x.dtype)
            out[how] = x
            return out
        for a, i in how:
            x = x.take(i, axis=a)
        return x

    return pad_const


pad_11.specialize = pad_18.specialize = _spec_pad


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
