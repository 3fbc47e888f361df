"""Control flow: If, Loop, Scan.

Graph attributes arrive as callables ``body(*inputs) -> list`` with outer-scope values already bound (see
``onnxpy.execution.plan.SubgraphCall``).  Values are never mutated in place, so loop-carried values (tensors,
sequences, optionals) are passed from one iteration to the next as they are.
"""

from __future__ import annotations

import numpy as np

from ..limits import check_iterations
from .registry import kernel

_TRUE = np.array(True)
_FALSE = np.array(False)


def _scalar_bool(v, what: str) -> bool:
    if v is None:
        raise ValueError(f"{what} is missing")
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{what} must contain exactly one element, got shape {a.shape}")
    return bool(a.reshape(-1)[0])


def _output_info(body, k: int):
    """(numpy dtype, static shape or None) of graph output ``k`` of a subgraph callable, when declared."""
    plan = getattr(body, "plan", None)
    graph = getattr(plan, "graph", None)
    if graph is None or k >= len(graph.outputs):
        return None, None
    t = graph.outputs[k].type
    if t is None or t.kind != "tensor":
        return None, None
    try:
        dt = t.np_dtype
    except TypeError:
        dt = None
    shape = None
    if t.shape is not None and all(isinstance(d, int) for d in t.shape):
        shape = tuple(t.shape)
    return dt, shape


def _stack(items: list, body, k: int, what: str) -> np.ndarray:
    """Stack per-iteration outputs along a new axis 0 (an empty result takes its type/shape from the graph)."""
    if not items:
        dt, shape = _output_info(body, k)
        return np.empty((0,) + (shape or ()), dtype=dt or np.float32)
    first = items[0]
    if not isinstance(first, np.ndarray):
        raise TypeError(f"{what} must be a tensor, got {type(first).__name__}")
    for i, it in enumerate(items):
        if not isinstance(it, np.ndarray) or it.shape != first.shape:
            got = it.shape if isinstance(it, np.ndarray) else type(it).__name__
            raise ValueError(f"{what}: iteration {i} produced shape {got} but iteration 0 produced {first.shape}")
    return np.stack(items, axis=0)


# --------------------------------------------------------------------------------------------------------------
# If


@kernel("If", since=(1, 11, 13, 16, 19, 21, 23, 24, 25))
def if_(cond, *, then_branch, else_branch):
    branch = then_branch if _scalar_bool(cond, "If condition") else else_branch
    outs = branch()
    return tuple(outs)


# --------------------------------------------------------------------------------------------------------------
# Loop


@kernel("Loop", since=(1, 11, 13, 16, 19, 21, 23, 24, 25))
def loop(M=None, cond=None, *v_initial, body):
    n_carried = len(v_initial)
    if M is not None:
        m = np.asarray(M)
        if m.size != 1:
            raise ValueError(f"Loop trip count M must be a scalar, got shape {m.shape}")
        max_trip = int(m.reshape(-1)[0])
    else:
        max_trip = None
    keep_going = True if cond is None else _scalar_bool(cond, "Loop condition")
    carried = list(v_initial)
    scans: list[list] | None = None
    i = 0
    while keep_going and (max_trip is None or i < max_trip):
        check_iterations(i + 1, "Loop")
        outs = body(np.array(i, dtype=np.int64), _TRUE if keep_going else _FALSE, *carried)
        if len(outs) < 1 + n_carried:
            raise ValueError(
                f"Loop body returned {len(outs)} outputs but needs at least {1 + n_carried} "
                f"(condition + {n_carried} loop-carried values)"
            )
        keep_going = _scalar_bool(outs[0], "Loop body condition output")
        carried = list(outs[1:1 + n_carried])
        extra = outs[1 + n_carried:]
        if scans is None:
            scans = [[] for _ in extra]
        elif len(extra) != len(scans):
            raise ValueError("Loop body changed its number of scan outputs between iterations")
        for lst, v in zip(scans, extra):
            lst.append(v)
        i += 1
    if scans is None:  # zero iterations
        n_body_out = len(getattr(body, "output_names", ())) or (1 + n_carried)
        scans = [[] for _ in range(max(0, n_body_out - 1 - n_carried))]
    results = carried + [
        _stack(lst, body, 1 + n_carried + j, f"Loop scan output {j}") for j, lst in enumerate(scans)
    ]
    return tuple(results)


# --------------------------------------------------------------------------------------------------------------
# Scan


def _norm_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _scan_core(states, scan_inputs, body, in_axes, in_dirs, out_axes, out_dirs, seq_len=None):
    """One (unbatched) scan; returns (final states, scan outputs stacked along their output axes)."""
    n = len(states)
    lengths = {x.shape[a] for x, a in zip(scan_inputs, in_axes)}
    if len(lengths) > 1:
        raise ValueError(f"Scan inputs have different sequence lengths {sorted(lengths)}")
    length = lengths.pop() if lengths else 0
    steps = length if seq_len is None else seq_len
    states = list(states)
    per_iter: list[list] | None = None
    for t in range(steps):
        elems = []
        for x, a, d in zip(scan_inputs, in_axes, in_dirs):
            idx = steps - 1 - t if d else t
            elems.append(np.take(x, idx, axis=a))
        outs = body(*states, *elems)
        if len(outs) < n:
            raise ValueError(f"Scan body returned {len(outs)} outputs but has {n} state variables")
        states = list(outs[:n])
        extra = outs[n:]
        if per_iter is None:
            per_iter = [[] for _ in extra]
        for lst, v in zip(per_iter, extra):
            lst.append(v)
    if per_iter is None:
        n_body_out = len(getattr(body, "output_names", ())) or n
        per_iter = [[] for _ in range(max(0, n_body_out - n))]
    scan_outs = []
    for j, lst in enumerate(per_iter):
        if j < len(out_dirs) and out_dirs[j]:
            lst = lst[::-1]
        stacked = _stack(lst, body, n + j, f"Scan output {j}")
        ax = out_axes[j] if j < len(out_axes) else 0
        ax = _norm_axis(ax, stacked.ndim, "scan_output_axes value")
        if ax:
            stacked = np.moveaxis(stacked, 0, ax)
        scan_outs.append(stacked)
    return states, scan_outs


def _split_scan_inputs(initial_state_and_scan_inputs, num_scan_inputs):
    """(m scan inputs, n states, the states, the scan inputs as arrays) of Scan's variadic inputs."""
    vals = list(initial_state_and_scan_inputs)
    m = int(num_scan_inputs)
    if m < 1 or m > len(vals):
        raise ValueError(f"num_scan_inputs {m} does not fit {len(vals)} state/scan inputs")
    n = len(vals) - m
    return m, n, vals[:n], [np.asarray(v) for v in vals[n:]]


@kernel("Scan", since=8)
def scan_8(sequence_lens=None, *initial_state_and_scan_inputs, body, num_scan_inputs, directions=None):
    m, n, states, scans = _split_scan_inputs(initial_state_and_scan_inputs, num_scan_inputs)
    dirs = list(directions) if directions else [0] * m
    if len(dirs) != m:
        raise ValueError(f"directions has {len(dirs)} entries but there are {m} scan inputs")
    for s in scans:
        if s.ndim < 2:
            raise ValueError(f"Scan-8 scan inputs need a batch and a sequence axis, got shape {s.shape}")
    batch = scans[0].shape[0]
    max_len = scans[0].shape[1]
    for s in scans:
        if s.shape[0] != batch or s.shape[1] != max_len:
            raise ValueError("Scan-8 scan inputs must share batch size and sequence length")
    for s in states:
        if np.asarray(s).shape[:1] != (batch,):
            raise ValueError(f"Scan-8 initial states need batch size {batch} as first dim")
    if sequence_lens is not None:
        lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
        if lens.shape[0] != batch:
            raise ValueError(f"sequence_lens has {lens.shape[0]} entries but batch size is {batch}")
        if np.any(lens < 0) or np.any(lens > max_len):
            raise ValueError(f"sequence_lens values must be in [0, {max_len}]")
    else:
        lens = np.full(batch, max_len, dtype=np.int64)
    final_states: list[list] = [[] for _ in range(n)]
    outs_per_batch: list[list] = []
    for b in range(batch):
        st = [np.asarray(s)[b] for s in states]
        sc = [s[b] for s in scans]
        seq = int(lens[b])
        st, so = _scan_core(st, sc, body, [0] * m, dirs, [], [], seq_len=seq)
        for k in range(n):
            final_states[k].append(st[k])
        outs_per_batch.append(so)
    k_out = len(outs_per_batch[0]) if outs_per_batch else max(0, len(getattr(body, "output_names", ())) - n)
    scan_results = []
    for j in range(k_out):
        pieces = []
        ref = next((o[j] for o in outs_per_batch if o[j].shape[0] > 0), None)
        for o in outs_per_batch:
            piece = o[j]
            if piece.shape[0] < max_len:
                if ref is not None:
                    tail_shape, dt = ref.shape[1:], ref.dtype
                else:
                    tail_shape, dt = piece.shape[1:], piece.dtype
                pad = np.zeros((max_len - piece.shape[0],) + tail_shape, dtype=dt)
                piece = np.concatenate([piece.astype(dt, copy=False).reshape((-1,) + tail_shape), pad], axis=0)
            pieces.append(piece)
        if pieces:
            scan_results.append(np.stack(pieces, axis=0))
        else:
            dt, shape = _output_info(body, n + j)
            scan_results.append(np.empty((0, max_len) + (shape or ()), dtype=dt or np.float32))
    finals = []
    for k in range(n):
        if final_states[k]:
            finals.append(np.stack(final_states[k], axis=0))
        else:
            finals.append(np.asarray(states[k]))
    return tuple(finals + scan_results)


@kernel("Scan", since=(9, 11, 16, 19, 21, 23, 24, 25))
def scan_9(*initial_state_and_scan_inputs, body, num_scan_inputs, scan_input_axes=None,
           scan_input_directions=None, scan_output_axes=None, scan_output_directions=None):
    m, n, states, scans = _split_scan_inputs(initial_state_and_scan_inputs, num_scan_inputs)
    in_axes = list(scan_input_axes) if scan_input_axes else [0] * m
    in_dirs = list(scan_input_directions) if scan_input_directions else [0] * m
    if len(in_axes) != m or len(in_dirs) != m:
        raise ValueError(f"scan_input_axes/scan_input_directions must have {m} entries")
    in_axes = [_norm_axis(a, s.ndim, "scan_input_axes value") for a, s in zip(in_axes, scans)]
    out_axes = list(scan_output_axes) if scan_output_axes else []
    out_dirs = list(scan_output_directions) if scan_output_directions else []
    st, so = _scan_core(states, scans, body, in_axes, in_dirs, out_axes, out_dirs)
    return tuple(st + so)
