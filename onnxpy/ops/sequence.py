"""Sequence and optional operators.

Sequences are Python lists of numpy arrays and an empty optional is ``None``.  Kernels never mutate an input list;
every sequence-producing op returns a new list.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from .registry import kernel


def _seq(s, name: str = "input_sequence") -> list:
    if s is None:
        raise ValueError(f"'{name}' is missing (or is an empty optional)")
    if not isinstance(s, (list, tuple)):
        raise TypeError(f"'{name}' must be a sequence, got {type(s).__name__}")
    return list(s)


def _tensor(t, name: str) -> np.ndarray:
    if t is None:
        raise ValueError(f"'{name}' is missing")
    if isinstance(t, (list, tuple, dict)):
        raise TypeError(f"'{name}' must be a tensor, got {type(t).__name__}")
    return np.asarray(t)


def _position(pos, n: int, *, allow_end: bool, name: str = "position") -> int:
    p = np.asarray(pos)
    if p.size != 1 or p.dtype.kind not in "iu":
        raise TypeError(f"'{name}' must be a scalar integer tensor, got {p.dtype} of shape {p.shape}")
    i = int(p.reshape(-1)[0])
    hi = n if allow_end else n - 1
    if not -n <= i <= hi:
        raise ValueError(f"{name} {i} is out of range [{-n}, {hi}] for a sequence of length {n}")
    return i + n if i < 0 else i


def _check_elem_type(seq: list, t: np.ndarray, op: str) -> None:
    if seq and isinstance(seq[0], np.ndarray) and seq[0].dtype != t.dtype:
        raise TypeError(f"{op}: tensor type {t.dtype} differs from the sequence's element type {seq[0].dtype}")


@kernel("SequenceEmpty", since=11)
def sequence_empty(*, dtype=1):
    dtypes.to_numpy(dtype)  # validates the element type
    return []


@kernel("SequenceConstruct", since=11)
def sequence_construct(*inputs):
    if not inputs:
        raise ValueError("SequenceConstruct needs at least one input")
    ts = [_tensor(t, f"inputs[{i}]") for i, t in enumerate(inputs)]
    for i, t in enumerate(ts[1:], 1):
        if t.dtype != ts[0].dtype:
            raise TypeError(f"SequenceConstruct: input {i} has type {t.dtype} but input 0 has {ts[0].dtype}")
    return ts


@kernel("SequenceInsert", since=11)
def sequence_insert(input_sequence, tensor, position=None):
    seq = _seq(input_sequence)
    t = _tensor(tensor, "tensor")
    _check_elem_type(seq, t, "SequenceInsert")
    if position is None:
        seq.append(t)
    else:
        seq.insert(_position(position, len(seq), allow_end=True), t)
    return seq


@kernel("SequenceAt", since=11)
def sequence_at(input_sequence, position):
    seq = _seq(input_sequence)
    return seq[_position(position, len(seq), allow_end=False)]


@kernel("SequenceErase", since=11)
def sequence_erase(input_sequence, position=None):
    seq = _seq(input_sequence)
    if not seq:
        raise ValueError("SequenceErase: cannot erase from an empty sequence")
    i = len(seq) - 1 if position is None else _position(position, len(seq), allow_end=False)
    del seq[i]
    return seq


@kernel("SequenceLength", since=11)
def sequence_length(input_sequence):
    return np.array(len(_seq(input_sequence)), dtype=np.int64)


@kernel("SplitToSequence", since=(11, 24))
def split_to_sequence(input, split=None, *, axis=0, keepdims=1):
    x = _tensor(input, "input")
    if x.ndim == 0:
        raise ValueError("SplitToSequence: input must have rank >= 1")
    r = x.ndim
    if not -r <= axis < r:
        raise ValueError(f"SplitToSequence: axis {axis} out of range for rank {r}")
    ax = axis + r if axis < 0 else axis
    dim = x.shape[ax]
    if split is None:
        parts = [np.take(x, [i], axis=ax) for i in range(dim)]
        if not keepdims:
            parts = [np.squeeze(p, axis=ax) for p in parts]
        return parts
    sp = np.asarray(split)
    if sp.dtype.kind not in "iu":
        raise TypeError(f"SplitToSequence: split must be int32/int64, got {sp.dtype}")
    if sp.ndim == 0:
        size = int(sp)
        if size <= 0:
            raise ValueError(f"SplitToSequence: split must be positive, got {size}")
        sizes = [size] * (dim // size) + ([dim % size] if dim % size else [])
    elif sp.ndim == 1:
        sizes = [int(v) for v in sp]
        if any(v < 0 for v in sizes) or sum(sizes) != dim:
            raise ValueError(
                f"SplitToSequence: split {sizes} must be non-negative and sum to the axis length {dim}"
            )
    else:
        raise ValueError(f"SplitToSequence: split must be a scalar or 1-D, got shape {sp.shape}")
    bounds = np.cumsum([0] + sizes)
    idx = [slice(None)] * r
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        idx[ax] = slice(int(a), int(b))
        out.append(x[tuple(idx)])
    return out


@kernel("ConcatFromSequence", since=11)
def concat_from_sequence(input_sequence, *, axis, new_axis=0):
    seq = [_tensor(t, "input_sequence element") for t in _seq(input_sequence)]
    if not seq:
        raise ValueError("ConcatFromSequence: the input sequence is empty")
    r = seq[0].ndim
    if new_axis:
        if not -r - 1 <= axis <= r:
            raise ValueError(f"ConcatFromSequence: axis {axis} out of range [{-r - 1}, {r}] with new_axis=1")
        ax = axis + r + 1 if axis < 0 else axis
        shapes = {t.shape for t in seq}
        if len(shapes) != 1:
            raise ValueError(f"ConcatFromSequence: new_axis=1 needs equal shapes, got {sorted(shapes)}")
        return np.stack(seq, axis=ax)
    if r == 0:
        raise ValueError("ConcatFromSequence: cannot concatenate scalars without new_axis=1")
    if not -r <= axis < r:
        raise ValueError(f"ConcatFromSequence: axis {axis} out of range [{-r}, {r - 1}]")
    return np.concatenate(seq, axis=axis)


@kernel("SequenceMap", since=17)
def sequence_map(input_sequence, *additional_inputs, body):
    first = _seq(input_sequence)
    n = len(first)
    extra = list(additional_inputs)
    for j, v in enumerate(extra):
        if isinstance(v, (list, tuple)) and len(v) != n:
            raise ValueError(
                f"SequenceMap: additional input {j} has {len(v)} elements but the first sequence has {n}"
            )
    n_out = len(getattr(body, "output_names", ()))
    results: list[list] = [[] for _ in range(n_out)]
    for i in range(n):
        args = [first[i]] + [v[i] if isinstance(v, (list, tuple)) else v for v in extra]
        outs = body(*args)
        if len(results) < len(outs):
            results.extend([] for _ in range(len(outs) - len(results)))
        for lst, o in zip(results, outs):
            lst.append(o)
    return tuple(results)


# --------------------------------------------------------------------------------------------------------------
# optionals


@kernel("Optional", since=(15, 28))
def optional(input=None, *, type=None):
    if input is None and type is None:
        raise ValueError("Optional: either the input or the 'type' attribute must be given")
    return input


@kernel("OptionalHasElement", since=(15, 18, 28))
def optional_has_element(input=None):
    return np.array(input is not None)


@kernel("OptionalGetElement", since=(15, 18, 28))
def optional_get_element(input=None):
    if input is None:
        raise ValueError("OptionalGetElement: the input is an empty optional")
    return input
