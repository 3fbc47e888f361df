"""Tensor layout kernels: Reshape, Transpose, Concat, Split, Squeeze/Unsqueeze, Flatten, Tile, Expand,
DepthToSpace/SpaceToDepth, Trilu, ReverseSequence.

Kernels return numpy views wherever numpy allows (reshape, transpose, split, squeeze); they never write into
their inputs.
"""

from __future__ import annotations

import numpy as np

from ._shape_util import (NOT_CONST, broadcast_shape, check_shape, frozen, norm_axes, norm_axis, scalar_int, to_ints,
                          zero_of)
from .registry import kernel

# ----------------------------------------------------------------------------------------------------------
# Reshape


def _reshape(x: np.ndarray, shape: list[int], allowzero: int) -> np.ndarray:
    return x.reshape(_reshape_target(x, shape, allowzero))


def _reshape_target(x: np.ndarray, shape: list[int], allowzero: int) -> list[int]:
    new = list(shape)
    neg = -1
    known = 1
    for i, d in enumerate(new):
        if d == -1:
            if neg >= 0:
                raise ValueError(f"Reshape: shape {shape} has more than one -1")
            neg = i
            continue
        if d == 0 and not allowzero:
            if i >= x.ndim:
                raise ValueError(f"Reshape: shape {shape} copies dimension {i} (0) but the input has rank {x.ndim}")
            d = new[i] = x.shape[i]
        elif d < 0:
            raise ValueError(f"Reshape: shape {shape} has an invalid negative dimension {d}")
        known *= d
    if neg >= 0:
        if allowzero and 0 in shape:
            raise ValueError(f"Reshape: shape {shape} has both 0 and -1 while allowzero=1")
        if known == 0 or x.size % known:  # (a -1 next to a 0-sized dim is ambiguous; onnxruntime rejects it too)
            raise ValueError(f"Reshape: cannot reshape input of shape {list(x.shape)} to {shape}")
        new[neg] = x.size // known
    elif known != x.size:
        raise ValueError(
            f"Reshape: input of shape {list(x.shape)} ({x.size} elements) cannot be reshaped to {shape} "
            f"({known} elements)"
        )
    return new


_REPLAYS: dict = {}  # (shape, targets' values, allowzero flags) -> the resulting shape
_REPLAYS_MAX = 256


def replay_reshapes(shape, targets, allowzero) -> tuple:
    """The shape a chain of Reshapes (their shape inputs and allowzero flags) makes of ``shape``, raising their errors
    (fused nodes that absorbed Reshapes check them this way: AttentionBlock, FeedForward, ShapeOf).  Memoised: a run
    replays the same few chains (~20 us each otherwise)."""
    if not targets:
        return tuple(shape)
    key = (tuple(shape), tuple(tuple(to_ints(t, "shape")) for t in targets), tuple(allowzero))
    got = _REPLAYS.get(key)
    if got is None:
        got = tuple(shape)
        for t, az in zip(key[1], allowzero):
            got = tuple(_reshape_target(np.broadcast_to(np.float32(0), got), list(t), int(az)))
        if len(_REPLAYS) >= _REPLAYS_MAX:
            _REPLAYS.clear()
        _REPLAYS[key] = got
    return got



@kernel("Reshape", since=1)
def reshape_1(data, *, shape=None, consumed_inputs=None):
    if shape is None:
        raise ValueError("Reshape-1: the 'shape' attribute is required")
    return _reshape(np.asarray(data), to_ints(shape), 0)


@kernel("Reshape", since=5)
def reshape_5(data, shape):
    return _reshape(data, to_ints(shape, "shape"), 0)


@kernel("Reshape", since=14)
def reshape_14(data, shape, *, allowzero=0):
    return _reshape(data, to_ints(shape, "shape"), allowzero)


# -- plan-time specialisations (see execution/plan.py ``_specialize``): constant shape/axes inputs are parsed once,
# and the normalised result is memoised per input shape or rank (small dicts; entries are immutable tuples).
_SPEC_MAX = 64


def _const_ints(v):
    """A constant integer input as a list of ints, or None when it is not a usable plan-time constant."""
    if type(v) is not np.ndarray or v.dtype.kind not in "iu" or v.ndim > 1:
        return None
    return v.reshape(-1).tolist()


def _reshape_spec(shape, allowzero):
    memo = {}

    def reshape_const(data, *_):
        key = data.shape
        new = memo.get(key)
        if new is None:
            new = tuple(_reshape_target(data, shape, allowzero))
            if len(memo) < _SPEC_MAX:
                memo[key] = new
        return data.reshape(new)

    return reshape_const


def _spec_reshape(consts, kwargs):
    if len(consts) != 2:
        return None
    shape = _const_ints(consts[1])
    if shape is None:
        return None
    return _reshape_spec(shape, kwargs.get("allowzero", 0))


reshape_5.specialize = reshape_14.specialize = _spec_reshape


# ----------------------------------------------------------------------------------------------------------
# Transpose


@kernel("Transpose", since=1)
def transpose(data, *, perm=None):
    if perm is None:
        return data.transpose()
    perm = list(perm)
    if sorted(perm) != list(range(data.ndim)):
        raise ValueError(f"Transpose: perm {perm} is not a permutation of the {data.ndim} axes of the input")
    return data.transpose(perm)


# ----------------------------------------------------------------------------------------------------------
# Concat


def _concat(inputs, axis):
    if not inputs:
        raise ValueError("Concat needs at least one input")
    rank = inputs[0].ndim
    if rank == 0:
        raise ValueError("Concat: inputs must have rank >= 1")
    ax = norm_axis(axis, rank)
    if len(inputs) == 1:
        return inputs[0]
    for t in inputs[1:]:
        if t.ndim != rank or t.shape[:ax] != inputs[0].shape[:ax] or t.shape[ax + 1:] != inputs[0].shape[ax + 1:]:
            raise ValueError(
                f"Concat: input shapes {[list(t.shape) for t in inputs]} differ outside axis {axis}"
            )
    if all(type(t) is np.ndarray and not t.flags.writeable for t in inputs):
        key = (ax,) + tuple(id(t) for t in inputs)
        hit = _CONCAT_CACHE.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], inputs)):
            return hit[1]
        out = np.concatenate(inputs, axis=ax)
        if out.nbytes <= _CONCAT_CACHE_BYTES and all(frozen(t) for t in inputs):
            out.flags.writeable = False
            if len(_CONCAT_CACHE) >= 1024:
                _CONCAT_CACHE.clear()
            _CONCAT_CACHE[key] = (tuple(inputs), out)
        return out
    return np.concatenate(inputs, axis=ax)


# Concatenations of constants (e.g. LSTM weights re-ordered inside a subgraph the optimizer does not fold), keyed
# by the identities of the inputs (held by the entry) and returned read-only.
_CONCAT_CACHE: dict = {}
_CONCAT_CACHE_BYTES = 1 << 24


@kernel("Concat", since=1)
def concat_1(*inputs, axis=1):
    return _concat(inputs, axis)


@kernel("Concat", since=4)
def concat_4(*inputs, axis=None):
    if axis is None:
        raise ValueError("Concat: the 'axis' attribute is required")
    return _concat(inputs, axis)


def _spec_concat(consts, kwargs):
    axis = kwargs.get("axis")
    if axis is None or len(consts) < 2 or any(c is not NOT_CONST for c in consts):
        return None
    axis = int(axis)
    _cat = np.concatenate

    def concat_fast(*inputs):
        # writeable inputs of one rank: numpy's own checks suffice; anything else (read-only inputs, which the
        # generic path may cache, mismatched shapes, which it reports) goes the generic way
        x0 = inputs[0]
        if type(x0) is np.ndarray and x0.flags.writeable and -x0.ndim <= axis < x0.ndim:
            try:
                return _cat(inputs, axis=axis)
            except (ValueError, TypeError):
                pass
        return _concat(inputs, axis)

    return concat_fast


concat_4.specialize = _spec_concat


# ----------------------------------------------------------------------------------------------------------
# Split


def _split(x, axis, sizes, n_out):
    return tuple([x[i] for i in _split_slices(x, axis, sizes, n_out)])


def _split_slices(x, axis, sizes, n_out):
    """The index tuples of Split's outputs (validating the sizes)."""
    if x.ndim == 0:
        raise ValueError("Split: input must have rank >= 1")
    ax = norm_axis(axis, x.ndim)
    dim = x.shape[ax]
    if sizes is None:
        if n_out <= 0:
            raise ValueError("Split: no outputs")
        if dim % n_out:
            raise ValueError(f"Split: dimension {dim} of axis {axis} is not divisible into {n_out} equal parts")
        sizes = [dim // n_out] * n_out
    else:
        sizes = [int(s) for s in sizes]
        if any(s < 0 for s in sizes) or sum(sizes) != dim:
            raise ValueError(f"Split: split sizes {sizes} do not sum to dimension {dim} of axis {axis}")
        if n_out and len(sizes) != n_out:
            raise ValueError(f"Split: {len(sizes)} split sizes given for {n_out} outputs")
    out = []
    idx = [slice(None)] * x.ndim
    start = 0
    for s in sizes:
        idx[ax] = slice(start, start + s)
        out.append(tuple(idx))
        start += s
    return tuple(out)


@kernel("Split", since=1)
def split_1(x, split_input=None, *, axis=0, split=None, _num_outputs=1):
    sizes = list(split) if split else None
    if split_input is not None:
        sizes = to_ints(split_input, "split")
    return _split(x, axis, sizes, _num_outputs)


@kernel("Split", since=2)
def split_2(x, *, axis=0, split=None, _num_outputs=1):
    return _split(x, axis, None if not split else list(split), _num_outputs)


@kernel("Split", since=13)
def split_13(x, split=None, *, axis=0, _num_outputs=1):
    return _split(*_split_13_args(x, split, axis, _num_outputs))


def _split_13_args(x, split, axis, _num_outputs):
    return x, axis, None if split is None or split.size == 0 else to_ints(split, "split"), _num_outputs


@kernel("Split", since=18)
def split_18(x, split=None, *, axis=0, num_outputs=None, _num_outputs=1):
    return _split(*_split_18_args(x, split, axis, num_outputs, _num_outputs))


def _split_18_args(x, split, axis, num_outputs, _num_outputs):
    if split is not None and split.size > 0:
        if num_outputs is not None:
            raise ValueError("Split: both the 'split' input and the 'num_outputs' attribute are given")
        return x, axis, to_ints(split, "split"), _num_outputs
    if num_outputs is None:  # neither given: equal parts over the declared outputs (must divide evenly)
        return x, axis, None, _num_outputs
    n = int(num_outputs)
    if n <= 0:
        raise ValueError(f"Split: num_outputs must be positive, got {n}")
    if n != _num_outputs:
        raise ValueError(f"Split: num_outputs={n} but the node declares {_num_outputs} outputs")
    if x.ndim == 0:
        raise ValueError("Split: input must have rank >= 1")
    dim = x.shape[norm_axis(axis, x.ndim)]
    chunk = -(-dim // n)
    sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    if sizes[-1] < 0:
        raise ValueError(f"Split: dimension {dim} cannot be split into {n} outputs of size {chunk}")
    return x, axis, sizes, n


def _spec_split(consts, kwargs):
    """Split-13/18 with a constant (or absent) split input: the output slices are derived once per input shape."""
    if len(consts) > 2 or (len(consts) == 2 and consts[1] is NOT_CONST):
        return None
    split = consts[1] if len(consts) == 2 else None
    axis = kwargs.get("axis", 0)
    n_out = kwargs.get("_num_outputs", 1)
    v18 = "num_outputs" in kwargs
    num_outputs = kwargs.get("num_outputs")
    memo = {}

    def split_const(x, *_):
        sl = memo.get(x.shape)
        if sl is None:
            args = _split_18_args(x, split, axis, num_outputs, n_out) if v18 else _split_13_args(x, split, axis, n_out)
            sl = _split_slices(*args)
            if len(memo) < _SPEC_MAX:
                memo[x.shape] = sl
        return tuple([x[i] for i in sl])

    return split_const


def _spec_split_18(consts, kwargs):
    return _spec_split(consts, dict(kwargs, num_outputs=kwargs.get("num_outputs")))


def _spec_split_13(consts, kwargs):
    kw = dict(kwargs)
    kw.pop("num_outputs", None)
    return _spec_split(consts, kw)


split_13.specialize = _spec_split_13
split_18.specialize = _spec_split_18


# ----------------------------------------------------------------------------------------------------------
# Squeeze / Unsqueeze / Flatten


def _squeeze(x, axes):
    if not axes:  # absent or empty: remove every size-1 dimension (as onnxruntime does)
        return np.squeeze(x)
    ax = norm_axes(axes, x.ndim)
    for a in ax:
        if x.shape[a] != 1:
            raise ValueError(f"Squeeze: dimension {a} of input shape {list(x.shape)} is not 1")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in ax])


@kernel("Squeeze", since=1)
def squeeze_1(data, *, axes=None):
    return _squeeze(data, axes)


@kernel("Squeeze", since=13)
def squeeze_13(data, axes=None):
    return _squeeze(data, None if axes is None else to_ints(axes, "axes"))


def _squeeze_spec(axes):
    memo = {}  # rank -> (normalised axes, kept dimensions)

    def squeeze_const(data, *_):
        shp = data.shape
        ent = memo.get(len(shp))
        if ent is None:
            ax = norm_axes(axes, len(shp))
            ent = (tuple(ax), tuple(i for i in range(len(shp)) if i not in ax))
            memo[len(shp)] = ent
        for a in ent[0]:
            if shp[a] != 1:
                raise ValueError(f"Squeeze: dimension {a} of input shape {list(shp)} is not 1")
        return data.reshape(tuple([shp[i] for i in ent[1]]))

    return squeeze_const


def _spec_squeeze_13(consts, kwargs):
    if len(consts) != 2 or consts[1] is None:
        return None
    axes = _const_ints(consts[1])
    return _squeeze_spec(axes) if axes else None


def _spec_squeeze_1(consts, kwargs):
    axes = kwargs.get("axes")
    if not axes or len(consts) != 1:
        return None
    return _squeeze_spec([int(a) for a in axes])


squeeze_13.specialize = _spec_squeeze_13
squeeze_1.specialize = _spec_squeeze_1


def _unsqueeze(x, axes):
    r = x.ndim + len(axes)
    ax = norm_axes(axes, r)
    shape = list(x.shape)
    for a in sorted(ax):
        shape.insert(a, 1)
    return x.reshape(shape)


@kernel("Unsqueeze", since=1)
def unsqueeze_1(data, *, axes=None):
    if axes is None:
        raise ValueError("Unsqueeze: the 'axes' attribute is required")
    return _unsqueeze(data, list(axes))


@kernel("Unsqueeze", since=13)
def unsqueeze_13(data, axes):
    return _unsqueeze(data, to_ints(axes, "axes"))


def _unsqueeze_spec(axes):
    memo = {}  # input rank -> sorted normalised output axes
    n = len(axes)

    def unsqueeze_const(data, *_):
        shp = data.shape
        pos = memo.get(len(shp))
        if pos is None:
            pos = tuple(sorted(norm_axes(axes, len(shp) + n)))
            memo[len(shp)] = pos
        if n == 1:
            a = pos[0]
            return data.reshape(shp[:a] + (1,) + shp[a:])
        new = list(shp)
        for a in pos:
            new.insert(a, 1)
        return data.reshape(new)

    return unsqueeze_const


def _spec_unsqueeze_13(consts, kwargs):
    if len(consts) != 2:
        return None
    axes = _const_ints(consts[1])
    return None if axes is None else _unsqueeze_spec(axes)


def _spec_unsqueeze_1(consts, kwargs):
    axes = kwargs.get("axes")
    if axes is None or len(consts) != 1:
        return None
    return _unsqueeze_spec([int(a) for a in axes])


unsqueeze_13.specialize = _spec_unsqueeze_13
unsqueeze_1.specialize = _spec_unsqueeze_1


@kernel("Flatten", since=1)
def flatten(x, *, axis=1):
    r = x.ndim
    a = int(axis)
    if not -r <= a <= r:
        raise ValueError(f"Flatten: axis {axis} is out of range for a tensor of rank {r}")
    if a < 0:
        a += r
    outer = 1
    for d in x.shape[:a]:
        outer *= d
    inner = 1
    for d in x.shape[a:]:
        inner *= d
    return x.reshape(outer, inner)


# ----------------------------------------------------------------------------------------------------------
# Tile / Expand


@kernel("Tile", since=1)
def tile_1(x, tiles, axis):
    t = scalar_int(tiles, "tiles")
    a = norm_axis(scalar_int(axis, "axis"), x.ndim)
    reps = [1] * x.ndim
    reps[a] = t
    return _tile(x, reps)


def _tile(x, reps):
    if len(reps) != x.ndim:
        raise ValueError(f"Tile: repeats has {len(reps)} entries but the input has rank {x.ndim}")
    if any(r < 0 for r in reps):
        raise ValueError(f"Tile: repeats {reps} has negative values")
    check_shape([d * r for d, r in zip(x.shape, reps)], x.dtype, "Tile output")
    if all(r == 1 for r in reps):
        return x
    return np.tile(x, reps)


@kernel("Tile", since=6)
def tile_6(x, repeats):
    return _tile(x, to_ints(repeats, "repeats"))


@kernel("Expand", since=8)
def expand(x, shape):
    shp = tuple(to_ints(shape, "shape"))
    if any(d < 0 for d in shp):
        raise ValueError(f"Expand: shape {list(shp)} has negative dimensions")
    out_shape = broadcast_shape(x.shape, shp, "Expand: input shape and shape")
    if out_shape == x.shape:
        return x
    check_shape(out_shape, x.dtype, "Expand output")
    # a read-only broadcast view: no copy (consumers broadcast anyway)
    if x.size and x.flags.c_contiguous and x.dtype.kind != "O":
        pad = len(out_shape) - x.ndim
        strides = tuple(0 if d == 1 and o != 1 else st
                        for d, o, st in zip((1,) * pad + x.shape, out_shape, (0,) * pad + x.strides))
        out = np.ndarray(out_shape, x.dtype, x, 0, strides)  # ~10x cheaper than np.broadcast_to
        out.flags.writeable = False
        return out
    return np.broadcast_to(x, out_shape)


# ----------------------------------------------------------------------------------------------------------
# DepthToSpace / SpaceToDepth


def _block(x, blocksize, op):
    if blocksize is None:
        raise ValueError(f"{op}: the 'blocksize' attribute is required")
    b = int(blocksize)
    if b <= 0:
        raise ValueError(f"{op}: blocksize must be positive, got {b}")
    if x.ndim != 4:
        raise ValueError(f"{op}: input must be 4-D (N, C, H, W), got shape {list(x.shape)}")
    return b


@kernel("DepthToSpace", since=1)
def depth_to_space(x, *, blocksize=None, mode="DCR"):
    b = _block(x, blocksize, "DepthToSpace")
    n, c, h, w = x.shape
    if c % (b * b):
        raise ValueError(f"DepthToSpace: channels {c} not divisible by blocksize^2 = {b * b}")
    oc = c // (b * b)
    if mode == "DCR":
        t = x.reshape(n, b, b, oc, h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        t = x.reshape(n, oc, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"DepthToSpace: unknown mode {mode!r} (expected 'DCR' or 'CRD')")
    return t.reshape(n, oc, h * b, w * b)


@kernel("SpaceToDepth", since=1)
def space_to_depth(x, *, blocksize=None, mode="DCR"):
    b = _block(x, blocksize, "SpaceToDepth")
    n, c, h, w = x.shape
    if h % b or w % b:
        raise ValueError(f"SpaceToDepth: spatial dims {h}x{w} not divisible by blocksize {b}")
    t = x.reshape(n, c, h // b, b, w // b, b)
    if mode == "DCR":
        t = t.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        t = t.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"SpaceToDepth: unknown mode {mode!r} (expected 'DCR' or 'CRD')")
    return t.reshape(n, c * b * b, h // b, w // b)


# ----------------------------------------------------------------------------------------------------------
# Trilu


@kernel("Trilu", since=14)
def trilu(x, k=None, *, upper=1):
    if x.ndim < 2:
        raise ValueError(f"Trilu: input must have rank >= 2, got shape {list(x.shape)}")
    kk = 0 if k is None else scalar_int(k, "k")
    n, m = x.shape[-2:]
    # keep[i, j] is True where the element survives
    if upper:
        keep = ~np.tri(n, m, kk - 1, dtype=bool)
    else:
        keep = np.tri(n, m, kk, dtype=bool)
    return np.where(keep, x, np.asarray(zero_of(x.dtype), dtype=x.dtype))


# ----------------------------------------------------------------------------------------------------------
# ReverseSequence


@kernel("ReverseSequence", since=10)
def reverse_sequence(x, sequence_lens, *, batch_axis=1, time_axis=0):
    if x.ndim < 2:
        raise ValueError(f"ReverseSequence: input must have rank >= 2, got shape {list(x.shape)}")
    ba, ta = norm_axis(batch_axis, x.ndim, "batch_axis"), norm_axis(time_axis, x.ndim, "time_axis")
    if {ba, ta} != {0, 1}:
        raise ValueError(f"ReverseSequence: batch_axis/time_axis must be 0 and 1, got {batch_axis}, {time_axis}")
    T, B = x.shape[ta], x.shape[ba]
    lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    if lens.shape[0] != B:
        raise ValueError(f"ReverseSequence: sequence_lens has {lens.shape[0]} entries for batch size {B}")
    if ((lens < 0) | (lens > T)).any():
        raise ValueError(f"ReverseSequence: sequence_lens {lens.tolist()} out of range [0, {T}]")
    t = np.arange(T, dtype=np.int64)[:, None]
    src = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # (T, B)
    bidx = np.arange(B, dtype=np.int64)
    if ta == 0:
        return x[src, bidx[None, :]]
    return x[bidx[:, None], src.T]
