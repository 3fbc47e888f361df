"""ai.onnxpy.AttentionBlock: a transformer's self-attention from its input projection to its output projection.

Written by the level-99 AttentionBlockFusion (optimizer/fusions.py) in place of

    MatMulBias|Gemm(X, Wqkv, bqkv) -> Reshape* -> Split(3 equal parts) -> Reshape* (q, k and v alike)
    -> com.microsoft.MultiHeadAttention(q, k, v, key_padding_mask, attention_bias) -> Reshape* -> MatMulBias|Gemm(Wout)

Inputs: X, Wqkv, bqkv, Wout, bout, key_padding_mask, attention_bias, then the Reshapes' shape inputs in order (those
before the Split, those of the query's, the key's and the value's chains, those after the attention).  Attributes:
MultiHeadAttention's (num_heads, scale, mask_filter_value, unidirectional), the Split's axis and part size (0: three
equal parts), each Reshape's allowzero, and which projections were Gemms (their input must be 2-D).  The Reshapes are
replayed on shapes only: an input the original graph rejects is rejected with the same error.

Why: with two threads the unfused sequence is three parallel regions (the projection's feature blocks, the attention's
heads, the output projection's feature blocks), each paying a hand-off and a wait, and each thread's heads read
projections the other thread wrote.  Here each thread multiplies its heads' query, key and value columns of the
projection (packed weights, ``ops._packed``), runs the attention over those heads, and multiplies its heads' output
columns -- its depth share of the output projection -- into a partial sum of all outputs; the partial sums are added.
One region, and every thread's data stays in its own cache.  The result is the unfused sequence's up to rounding (the
output projection sums its depth in parts); runs with the helpers busy compute the same parts in the same order on
the calling thread (the same bits).  Inputs outside that form (more than 256 rows, fewer than 16, other layouts) run
the ops in turn on the packed weights.
"""

from __future__ import annotations

import numpy as np

from . import _packed
from ._common import F32 as _F32
from .contrib_transformer import _drop_masked_keys, _additive_terms, _mha_heads, multi_head_attention
from .linalg import _matmul_bias_generic
from .registry import kernel
from .tensor import replay_reshapes as _replay

_OP = "AttentionBlock"


def _split_part(shape, axis: int, size: int):
    """(axis, the shape of each of the Split's three outputs)."""
    nd = len(shape)
    if not -nd <= axis < nd:
        raise ValueError(f"Split: axis {axis} is out of range for an input of rank {nd}")
    ax = axis % nd
    n = shape[ax]
    if size and n != 3 * size or not size and n % 3:
        want = f"3 x {size}" if size else "three equal parts"
        raise ValueError(f"Split: dimension {ax} of the input {list(shape)} cannot be split into {want}")
    return ax, shape[:ax] + (n // 3,) + shape[ax + 1:]


def _counts(pre_allowzero, mid_allowzero, post_allowzero):
    return len(pre_allowzero), 3 * len(mid_allowzero), len(post_allowzero)


def _targets(targets, counts):
    """(pre, [q's, k's, v's], post) shape inputs."""
    a, b, _ = counts
    n = b // 3
    mid = targets[a:a + b]
    return targets[:a], [mid[:n], mid[n:2 * n], mid[2 * n:]], targets[a + b:]


def _check_2d(x_shape, which: str) -> None:
    if len(x_shape) != 2:
        raise ValueError(f"Gemm: A must be 2-D, got shape {tuple(x_shape)} ({which} projection)")


@kernel("AttentionBlock", domain="ai.onnxpy")
def attention_block(X, Wqkv, bqkv, Wout, bout, key_padding_mask=None, attention_bias=None, *targets, num_heads,
                    scale=0.0, mask_filter_value=-10000.0, unidirectional=0, split_axis=-1, split_size=0,
                    pre_allowzero=(), mid_allowzero=(), post_allowzero=(), proj_2d=(0, 0)):
    """The fused sequence computed op by op (any float type; the float32 plan-time form runs it in one region)."""
    return _sequence(np.asarray(X), lambda a: _matmul_bias_generic(a, Wqkv, bqkv),
                     lambda a: _matmul_bias_generic(a, Wout, bout), key_padding_mask, attention_bias, targets,
                     num_heads, scale, mask_filter_value, unidirectional, split_axis, split_size, pre_allowzero,
                     mid_allowzero, post_allowzero, proj_2d)


def _sequence(x, project_in, project_out, key_padding_mask, attention_bias, targets, num_heads, scale,
              mask_filter_value, unidirectional, split_axis, split_size, pre_allowzero, mid_allowzero, post_allowzero,
              proj_2d):
    """The fused ops one after the other, the projections by the given callables (the weights as given, or their
    packed forms)."""
    counts = _counts(pre_allowzero, mid_allowzero, post_allowzero)
    if sum(counts) != len(targets):
        raise ValueError(f"{_OP}: {len(targets)} shape inputs for {sum(counts)} Reshapes")
    pre, mid, post = _targets(targets, counts)
    if proj_2d[0]:
        _check_2d(x.shape, "input")
    g = project_in(x)
    g = g.reshape(_replay(g.shape, pre, pre_allowzero))
    ax, part = _split_part(g.shape, int(split_axis), int(split_size))
    q, k, v = (t.reshape(_replay(part, tg, mid_allowzero)) for t, tg in zip(np.split(g, 3, axis=ax), mid))
    o = multi_head_attention(q, k, v, None, key_padding_mask, attention_bias, num_heads=num_heads, scale=scale,
                             mask_filter_value=mask_filter_value, unidirectional=unidirectional,
                             _output_names=("output",))
    o = o.reshape(_replay(o.shape, post, post_allowzero))
    if proj_2d[1]:
        _check_2d(o.shape, "output")
    return project_out(o)


def _block_part(ctx, h0, h1, out_blocks, y, bias):
    """One thread's share: heads [h0, h1) from the projection through the attention to its partial sum ``y`` of the
    output projection (its depth blocks ``out_blocks``; ``y`` first set to ``bias``, or zero)."""
    (pq, bq, sb, R, B, S, D, H, scale, additive, causal, po) = ctx
    w = (h1 - h0) * H
    qkv = np.empty((R, 3 * w), dtype=_F32)
    P = pq.P
    for j in range(3):  # the heads' query, key and value columns of the projection, side by side
        c0 = j * D + h0 * H
        view = qkv[:, j * w:(j + 1) * w]
        _packed._run_blocks(_packed.feature_spans(c0, c0 + w, P), pq.blocks, R, sb, view.ctypes.data, 3 * w, view,
                            bq, c0)
    nh = h1 - h0
    q, k, v = (qkv[:, j * w:(j + 1) * w].reshape(B, S, nh, H).transpose(0, 2, 1, 3) for j in range(3))
    a = additive
    nd = np.ndim(a)
    if nd >= 3 and np.shape(a)[nd - 3] > 1:  # (a term with a heads axis: this thread's heads)
        a = a[:, h0:h1] if nd == 4 else a[h0:h1]
    if causal is None and a is not None:
        k, v, a = _drop_masked_keys(k, v, a)
    o = np.empty((B, S, nh, H), dtype=_F32)
    _mha_heads(0, nh, q, k, v, scale, a, causal, o.transpose(0, 2, 1, 3), True)
    lo, hi = out_blocks
    src = [None] * len(po.blocks)
    k0 = 0
    for i, (kb, _) in enumerate(po.blocks):
        if lo <= i < hi:
            src[i] = (o.ctypes.data + 4 * (k0 - h0 * H), w)
        k0 += kb
    _packed._kpart(lo, hi, po, src, R, y, bias)


def _block_parts(t0, t1, ctx, N, T, blocks_per, ys, bout):
    """The shares of threads [t0, t1) of T (``_packed.run_ranges`` gives each thread one; with the helpers busy the
    calling thread runs them all, in the same order): thread t's heads, output depth blocks and partial sum ys[t],
    the output bias on thread 0's."""
    for t in range(t0, t1):
        _block_part(ctx, N * t // T, N * (t + 1) // T, (t * blocks_per, (t + 1) * blocks_per), ys[t],
                    bout if t == 0 else None)


def _attention_block_specialize(consts, kwargs):
    """Constant float32 projection weights that pack (``ops._packed``), heads that split evenly between the BLAS
    threads on whole kernel panels: the one-region form (see the module notes); otherwise the generic kernel."""
    if len(consts) < 7 or any(type(c) is not np.ndarray or c.dtype != _F32 for c in consts[1:5]):
        return None
    wq, bq, wo, bo = consts[1:5]
    N = int(kwargs.get("num_heads", 0))
    if wq.ndim != 2 or wo.ndim != 2 or N <= 0 or wq.shape[1] % 3 or bq.shape != (wq.shape[1],):
        return None
    D = wq.shape[1] // 3
    if D % N or wo.shape[0] != D or bo.shape != (wo.shape[1],):
        return None
    H = D // N
    T = min(_packed._blas_threads(), N)
    while T > 1 and (N % T or (N // T * H) % 64):
        T -= 1
    share = N // T * H
    depth = share
    while depth > _packed._Q and depth % 2 == 0:
        depth //= 2
    if depth > _packed._Q:
        return None
    pq = _packed.pack(wq)
    po = _packed.pack(wo, depth=depth) if pq is not None else None
    if po is None:
        return None
    pre_az, mid_az, post_az = (kwargs.get(k, ()) for k in ("pre_allowzero", "mid_allowzero", "post_allowzero"))
    counts = _counts(pre_az, mid_az, post_az)
    axis, size = int(kwargs.get("split_axis", -1)), int(kwargs.get("split_size", 0))
    proj_2d = tuple(kwargs.get("proj_2d", (0, 0)))
    sc = float(kwargs.get("scale", 0.0) or 0.0)
    scale = sc if sc else 1.0 / float(np.sqrt(H))
    unidirectional = int(kwargs.get("unidirectional", 0))
    mfv = float(kwargs.get("mask_filter_value", -10000.0))
    K, Nout = wq.shape[0], wo.shape[1]
    blocks_per = share // depth
    generic = attention_block

    def run(X, Wqkv, bqkv, Wout, bout, kpm=None, ab=None, *targets):
        if (type(X) is not np.ndarray or X.dtype != _F32 or X.ndim < 1 or X.shape[-1] != K
                or bqkv is not bq or bout is not bo or len(targets) != sum(counts)):
            return generic(X, _packed.real(Wqkv), bqkv, _packed.real(Wout), bout, kpm, ab, *targets, **kwargs)
        pre, mid, post = _targets(targets, counts)
        if proj_2d[0]:
            _check_2d(X.shape, "input")
        g_shape = _replay(X.shape[:-1] + (3 * D,), pre, pre_az)
        ax, part = _split_part(g_shape, axis, size)
        qs = _replay(part, mid[0], mid_az)
        R = X.size // K
        # the layout the parallel form assumes: rows x [q | k | v] x heads x head size, the q/k/v shapes (B, S, D)
        plain = (len(qs) == 3 and qs[2] == D and ax == len(g_shape) - 1 and g_shape[-1] == 3 * D
                 and qs[0] * qs[1] == R and _packed._FEW_ROWS <= R <= _packed._R
                and all(_replay(part, tg, mid_az) == qs for tg in mid[1:]))
        if not plain:  # (more than one row pass, or another layout: the ops in turn, on the packed weights)
            return _sequence(X, lambda a: _packed.matmul_rows(a, pq, bq), lambda a: _packed.matmul_rows(a, po, bo),
                             kpm, ab, targets, N, sc, mfv, unidirectional, axis, size, pre_az, mid_az, post_az,
                             proj_2d)
        B, S = qs[0], qs[1]
        o_shape = _replay((B, S, D), post, post_az)
        if proj_2d[1]:
            _check_2d(o_shape, "output")
        if o_shape[-1] != D:
            raise ValueError(f"MatMulBias: the attention's output {list(o_shape)} does not match the output "
                             f"projection's {D} rows")
        additive = _additive_terms(kpm, "key_padding_mask", ab, B, N, S, S, 0, mfv, "MultiHeadAttention", _F32)
        x2 = X.reshape(R, K)
        _, src, held = _packed._activation_source(x2, pq)
        sbuf, sb = _packed._pack_rows(pq.blocks, src, 0, R)  # (sbuf holds the packed rows sb points into)
        ctx = (pq, bq, sb, R, B, S, D, H, scale, additive, 0 if unidirectional else None, po)
        ys = [np.empty((R, Nout), dtype=_F32) for _ in range(T)]
        args = (ctx, N, T, blocks_per, ys, bo)
        if not _packed.run_ranges(_block_parts, T, T, *args):  # (OpenBLAS held to one thread meanwhile)
            _block_parts(0, T, *args)  # (one thread, or the helpers busy: the same parts in the same order)
        y = ys[0]
        for other in ys[1:]:
            y += other
        return y.reshape(o_shape[:-1] + (Nout,))

    run.releases = (1, 3)
    return run


attention_block.specialize = _attention_block_specialize


@kernel("ShapeOf", domain="ai.onnxpy")
def shape_of(X, *targets, path=(), start=0, end=None):
    """Shape(v) for a value ``v`` inside a fused region (AttentionBlock, FeedForward): ``X``'s shape (the region's
    input) replayed along ``path``, flat (kind, argument) pairs -- (0, N): a projection to N features (the last
    dimension becomes N); (1, allowzero): a Reshape to the next of ``targets``; (2, axis) then (3, size): one of the
    three parts of a Split; (4, Dv): a MultiHeadAttention output ((B, S, Dv) of a (B, S, *) query) -- then sliced as
    Shape's start/end do.  The Reshapes' errors are raised as those nodes would."""
    shape = tuple(np.shape(X))
    steps = list(path)
    if len(steps) % 2:
        raise ValueError(f"ShapeOf: path must hold (kind, argument) pairs, got {steps}")
    ti = 0
    i = 0
    while i < len(steps):
        kind, arg = int(steps[i]), int(steps[i + 1])
        if kind == 0:
            if not shape:
                raise ValueError("ShapeOf: a projection of a 0-D value")
            shape = shape[:-1] + (arg,)
        elif kind == 1:
            if ti >= len(targets):
                raise ValueError(f"ShapeOf: path names more Reshapes than the {len(targets)} shape inputs")
            shape = _replay(shape, (targets[ti],), (arg,))
            ti += 1
        elif kind == 2:
            if i + 3 >= len(steps) or int(steps[i + 2]) != 3:
                raise ValueError("ShapeOf: a Split step (2, axis) must be followed by (3, size)")
            shape = _split_part(shape, arg, int(steps[i + 3]))[1]
            i += 2
        elif kind == 4:
            if len(shape) != 3:
                raise ValueError(f"MultiHeadAttention: query must be 3-D (B, S, hidden), got shape {list(shape)}")
            shape = (shape[0], shape[1], arg)
        else:
            raise ValueError(f"ShapeOf: unknown step kind {kind}")
        i += 2
    if ti != len(targets):
        raise ValueError(f"ShapeOf: {len(targets)} shape inputs for {ti} Reshapes")
    return np.array(shape[slice(int(start), None if end is None else int(end))], dtype=np.int64)
