"""Recurrent layers: RNN, GRU, LSTM (every opset version).

The input projection ``X @ W^T (+ biases)`` is computed for all time steps with one matmul; only the recurrent
part runs in a Python loop over time steps (vectorised over batch and hidden units).
"""

from __future__ import annotations

import numpy as np

from ._common import text
from . import _ew_math as _fast
from .linalg import _dot2
from .registry import kernel

# --------------------------------------------------------------------------------------------------------------
# activation functions
# --------------------------------------------------------------------------------------------------------------

# name -> (needs alpha, needs beta, default alpha, default beta)
_ACT_PARAMS = {
    "relu": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
}


def _make_act(name: str, alpha: float, beta: float):
    key = name.lower()
    if key == "relu":
        return lambda x: np.maximum(x, 0)
    if key == "tanh":
        return np.tanh
    if key == "sigmoid":
        return _fast.sigmoid_into
    if key == "affine":
        return lambda x: alpha * x + beta
    if key == "leakyrelu":
        return lambda x: np.where(x >= 0, x, alpha * x)
    if key == "thresholdedrelu":
        return lambda x: np.where(x >= alpha, x, 0).astype(x.dtype, copy=False)
    if key == "scaledtanh":
        return lambda x: alpha * np.tanh(beta * x)
    if key == "hardsigmoid":
        return lambda x: np.clip(alpha * x + beta, 0, 1)
    if key == "elu":
        return lambda x: np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0)))
    if key == "softsign":
        return lambda x: x / (1 + np.abs(x))
    if key == "softplus":
        return lambda x: np.logaddexp(0, x).astype(x.dtype, copy=False)
    raise ValueError(f"unsupported RNN activation function {name!r}")


def _activations(names, alphas, betas, defaults: list[str], num_directions: int):
    """Per direction list of activation callables (``len(defaults)`` per direction)."""
    per = len(defaults)
    if not names:
        names = list(defaults) * num_directions
    names = [text(n) for n in names]
    if len(names) == per and num_directions == 2:
        names = names * 2
    if len(names) != per * num_directions:
        raise ValueError(
            f"activations must list {per * num_directions} functions for {num_directions} direction(s), "
            f"got {len(names)}: {names}"
        )
    alphas = list(alphas or [])
    betas = list(betas or [])
    ai = bi = 0
    funcs = []
    for n in names:
        if n.lower() not in _ACT_PARAMS:
            raise ValueError(f"unsupported RNN activation function {n!r}")
        need_a, need_b, da, db = _ACT_PARAMS[n.lower()]
        a, b = da, db
        if need_a and ai < len(alphas):
            a = float(alphas[ai])
            ai += 1
        if need_b and bi < len(betas):
            b = float(betas[bi])
            bi += 1
        funcs.append(_make_act(n, a, b))
    return [funcs[d * per:(d + 1) * per] for d in range(num_directions)]


# --------------------------------------------------------------------------------------------------------------
# shared plumbing
# --------------------------------------------------------------------------------------------------------------


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _num_directions(direction) -> tuple[int, list[bool]]:
    d = text(direction)
    if d in ("forward", "foward"):
        return 1, [False]
    if d == "reverse":
        return 1, [True]
    if d == "bidirectional":
        return 2, [False, True]
    raise ValueError(f"direction must be forward, reverse or bidirectional, got {d!r}")


class _Prep:
    """Validated, layout-normalised inputs shared by RNN/GRU/LSTM."""

    def __init__(self, op, X, W, R, B, sequence_lens, initial_h, direction, hidden_size, layout, gates,
                 extra_states=()):
        if X is None or W is None or R is None:
            raise ValueError(f"{op}: inputs X, W and R are required")
        X, W, R = np.asarray(X), np.asarray(W), np.asarray(R)
        if X.ndim != 3:
            raise ValueError(f"{op}: X must be 3-D, got shape {X.shape}")
        if layout not in (0, 1):
            raise ValueError(f"{op}: layout must be 0 or 1, got {layout}")
        self.out_dtype = X.dtype
        if X.dtype.kind != "f" and X.dtype.name != "bfloat16":
            raise TypeError(f"{op}: X must be a floating tensor, got {X.dtype}")
        ct = _compute_dtype(X.dtype)
        self.ct = ct
        self.layout = layout
        if layout == 1:
            X = X.transpose(1, 0, 2)
        T, Bsz, I = X.shape
        self.T, self.B = T, Bsz
        D, self.reverse = _num_directions(direction)
        self.D = D
        if W.ndim != 3 or W.shape[0] != D or W.shape[2] != I or W.shape[1] % gates:
            raise ValueError(f"{op}: W has shape {W.shape}, expected [{D}, {gates}*hidden_size, {I}]")
        H = W.shape[1] // gates
        if hidden_size is not None and int(hidden_size) != H:
            raise ValueError(f"{op}: hidden_size={hidden_size} does not match W of shape {W.shape}")
        self.H = H
        if R.shape != (D, gates * H, H):
            raise ValueError(f"{op}: R has shape {R.shape}, expected {(D, gates * H, H)}")
        self.X = X.astype(ct, copy=False)
        self.W = W.astype(ct, copy=False)
        self.R = R.astype(ct, copy=False)
        if B is None:
            self.Wb = np.zeros((D, gates * H), ct)
            self.Rb = np.zeros((D, gates * H), ct)
        else:
            B = np.asarray(B).astype(ct, copy=False)
            if B.shape != (D, 2 * gates * H):
                raise ValueError(f"{op}: B has shape {B.shape}, expected {(D, 2 * gates * H)}")
            self.Wb, self.Rb = B[:, : gates * H], B[:, gates * H:]
        self.seq_lens = None
        if sequence_lens is not None:
            sl = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
            if sl.shape != (Bsz,):
                raise ValueError(f"{op}: sequence_lens has shape {np.shape(sequence_lens)}, expected ({Bsz},)")
            if np.any(sl < 0) or np.any(sl > T):
                raise ValueError(f"{op}: sequence_lens values must lie in [0, {T}], got {sl.tolist()}")
            if not np.all(sl == T):
                self.seq_lens = sl
        self.states = [self._state(op, "initial_h", initial_h)]
        for name, s in extra_states:
            self.states.append(self._state(op, name, s))

    def _state(self, op, name, s):
        shape = (self.D, self.B, self.H)
        if s is None:
            return np.zeros(shape, self.ct)
        s = np.asarray(s).astype(self.ct, copy=False)
        if self.layout == 1:
            if s.ndim == 3:
                s = s.transpose(1, 0, 2)
        if s.shape != shape:
            raise ValueError(f"{op}: {name} has shape {s.shape}, expected {shape} (layout {self.layout})")
        return s

    def input_projection(self, d: int, bias: np.ndarray) -> np.ndarray:
        """``X @ W[d]^T + bias`` for every time step: shape [T, B, gates*H]."""
        T, Bsz, I = self.X.shape
        xw = self.X.reshape(T * Bsz, I) @ self.W[d].T
        xw += bias
        return xw.reshape(T, Bsz, -1)

    def time_steps(self, d: int):
        """(t, mask) for each step of direction ``d``; mask is None when every batch entry is active."""
        order = range(self.T - 1, -1, -1) if self.reverse[d] else range(self.T)
        for t in order:
            yield t, (None if self.seq_lens is None else (t < self.seq_lens)[:, None])

    def finish(self, Y, finals, want_y: bool):
        """Cast and lay out the outputs: Y [T, D, B, H] and the final states [D, B, H]."""
        od = self.out_dtype
        outs = []
        if want_y:
            Yo = Y.astype(od, copy=False)
            if self.layout == 1:
                Yo = np.ascontiguousarray(Yo.transpose(2, 0, 1, 3))
            outs.append(Yo)
        else:
            outs.append(None)
        for s in finals:
            so = s.astype(od, copy=False)
            if self.layout == 1:
                so = np.ascontiguousarray(so.transpose(1, 0, 2))
            outs.append(so)
        return tuple(outs)


def _clipper(clip):
    if clip is None:
        return lambda x: x
    c = float(clip)
    if c <= 0:
        raise ValueError(f"clip must be positive, got {clip}")
    return lambda x: np.clip(x, -c, c, out=x)


def _want_y(_num_outputs, _output_names) -> bool:
    if _output_names is not None:
        return len(_output_names) > 0 and _output_names[0] != ""
    return True


# --------------------------------------------------------------------------------------------------------------
# RNN
# --------------------------------------------------------------------------------------------------------------


def _rnn(X, W, R, B, sequence_lens, initial_h, activation_alpha, activation_beta, activations, clip, direction,
         hidden_size, layout, want_y):
    p = _Prep("RNN", X, W, R, B, sequence_lens, initial_h, direction, hidden_size, layout, 1)
    acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], p.D)
    clp = _clipper(clip)
    Y = np.zeros((p.T, p.D, p.B, p.H), p.ct) if want_y else None
    finals = np.empty((p.D, p.B, p.H), p.ct)
    for d in range(p.D):
        f = acts[d][0]
        xw = p.input_projection(d, p.Wb[d] + p.Rb[d])
        Rt = p.R[d].T
        h = p.states[0][d]
        for t, m in p.time_steps(d):
            hn = f(clp(xw[t] + h @ Rt))
            if m is None:
                h = hn
                if want_y:
                    Y[t, d] = hn
            else:
                h = np.where(m, hn, h)
                if want_y:
                    Y[t, d] = np.where(m, hn, 0)
        finals[d] = h
    return p.finish(Y, [finals], want_y)


@kernel("RNN", since=(1, 7, 14, 22))
def rnn(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, output_sequence=0,
        _output_names=None):
    y = _want_y(None, _output_names)
    return _rnn(X, W, R, B, sequence_lens, initial_h, activation_alpha, activation_beta, activations, clip,
                direction, hidden_size, layout, y)


# --------------------------------------------------------------------------------------------------------------
# GRU
# --------------------------------------------------------------------------------------------------------------


@kernel("GRU", since=(1, 3, 7, 14, 22))
def gru(X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, linear_before_reset=0,
        output_sequence=0, _output_names=None):
    want_y = _want_y(None, _output_names)
    p = _Prep("GRU", X, W, R, B, sequence_lens, initial_h, direction, hidden_size, layout, 3)
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], p.D)
    clp = _clipper(clip)
    H = p.H
    Y = np.zeros((p.T, p.D, p.B, H), p.ct) if want_y else None
    finals = np.empty((p.D, p.B, H), p.ct)
    for d in range(p.D):
        f, g = acts[d]
        bias = p.Wb[d].copy()
        bias[: 2 * H] += p.Rb[d][: 2 * H]
        if not linear_before_reset:
            bias[2 * H:] += p.Rb[d][2 * H:]
        xw = p.input_projection(d, bias)
        Rd = p.R[d]
        Rzr_t = Rd[: 2 * H].T
        Rh_t = Rd[2 * H:].T
        R_t = Rd.T
        Rbh = p.Rb[d][2 * H:]
        h = p.states[0][d]
        for t, m in p.time_steps(d):
            x = xw[t]
            if linear_before_reset:
                hr = h @ R_t
                zr = f(clp(x[:, : 2 * H] + hr[:, : 2 * H]))
                z, r = zr[:, :H], zr[:, H:]
                hh = g(clp(x[:, 2 * H:] + r * (hr[:, 2 * H:] + Rbh)))
            else:
                zr = f(clp(x[:, : 2 * H] + h @ Rzr_t))
                z, r = zr[:, :H], zr[:, H:]
                hh = g(clp(x[:, 2 * H:] + (r * h) @ Rh_t))
            hn = hh + z * (h - hh)  # (1 - z) * hh + z * h
            if m is None:
                h = hn
                if want_y:
                    Y[t, d] = hn
            else:
                h = np.where(m, hn, h)
                if want_y:
                    Y[t, d] = np.where(m, hn, 0)
        finals[d] = h
    return p.finish(Y, [finals], want_y)


# --------------------------------------------------------------------------------------------------------------
# LSTM
# --------------------------------------------------------------------------------------------------------------


def lstm_direction(p, d, xw, recur, act, clp, P, input_forget, Y):
    """One direction of an LSTM over time (shared by LSTM and com.microsoft.DynamicQuantizeLSTM).

    ``xw[t]`` is the input projection of step t (biases included), ``recur(h)`` the recurrent product ``h @ R^T``;
    writes ``Y[t, d]`` when ``Y`` is given and returns the final (h, c).
    """
    f, g, hf = act
    H = p.H
    if P is not None:
        pi, po, pf = P[d, :H], P[d, H: 2 * H], P[d, 2 * H:]
    h = p.states[0][d]
    c = p.states[1][d]
    for t, m in p.time_steps(d):
        gates = xw[t] + recur(h)
        if P is None:  # i, o, f are contiguous: one activation call for the three gates
            iof = f(clp(gates[:, : 3 * H]))
            i, o = iof[:, :H], iof[:, H: 2 * H]
            fg = (1 - i) if input_forget else iof[:, 2 * H:]
            cn = fg * c + i * g(clp(gates[:, 3 * H:]))
        else:  # peepholes: i and f see C(t-1), o sees C(t)
            i = f(clp(gates[:, :H] + pi * c))
            fg = (1 - i) if input_forget else f(clp(gates[:, 2 * H: 3 * H] + pf * c))
            cn = fg * c + i * g(clp(gates[:, 3 * H:]))
            o = f(clp(gates[:, H: 2 * H] + po * cn))
        hn = o * hf(cn)
        if m is None:
            h, c = hn, cn
            if Y is not None:
                Y[t, d] = hn
        else:
            h = np.where(m, hn, h)
            c = np.where(m, cn, c)
            if Y is not None:
                Y[t, d] = np.where(m, hn, 0)
    return h, c


@kernel("LSTM", since=(1, 7, 14, 22))
def lstm(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *, activation_alpha=None,
         activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, input_forget=0,
         layout=0, output_sequence=0, _output_names=None):
    want_y = _want_y(None, _output_names)
    p = _Prep("LSTM", X, W, R, B, sequence_lens, initial_h, direction, hidden_size, layout, 4,
              extra_states=[("initial_c", initial_c)])
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], p.D)
    clp = _clipper(clip)
    H = p.H
    if P is not None:
        P = np.asarray(P).astype(p.ct, copy=False)
        if P.shape != (p.D, 3 * H):
            raise ValueError(f"LSTM: P has shape {P.shape}, expected {(p.D, 3 * H)}")
    Y = np.zeros((p.T, p.D, p.B, H), p.ct) if want_y else None
    fin_h = np.empty((p.D, p.B, H), p.ct)
    fin_c = np.empty((p.D, p.B, H), p.ct)
    for d in range(p.D):
        xw = p.input_projection(d, p.Wb[d] + p.Rb[d])
        R_t = p.R[d].T
        fin_h[d], fin_c[d] = lstm_direction(p, d, xw, lambda h, R_t=R_t: h @ R_t, acts[d], clp, P, input_forget, Y)
    return p.finish(Y, [fin_h, fin_c], want_y)


# --------------------------------------------------------------------------------------------------------------
# LSTM with constant weights and the default configuration (plan-time specialisation, see execution/plan.py)
# --------------------------------------------------------------------------------------------------------------

_FUSED_MAX_BYTES = 1 << 26  # the fused weight copy is made only for weights up to this size (64 MiB)


def _default_lstm_config(kwargs) -> bool:
    acts = kwargs.get("activations")
    if acts:
        names = [text(a).lower() for a in acts]
        if names != ["sigmoid", "tanh", "tanh"]:
            return False
    d = kwargs.get("direction", "forward")
    d = text(d)
    return (d in ("forward", "foward") and kwargs.get("clip") is None and not kwargs.get("input_forget", 0)
            and kwargs.get("layout", 0) == 0)


def _lstm_cell(g, c, H, sigmoid):
    """One default-activation LSTM step from the gate pre-activations ``g`` [B, 4H] (i, o, f, c order; overwritten)
    and the previous cell state: returns the new (h, c), both fresh arrays."""
    iof = g[:, : 3 * H]
    sigmoid(iof, out=iof)
    gg = g[:, 3 * H:]
    np.tanh(gg, out=gg)
    gg *= iof[:, :H]  # i * g
    cn = iof[:, 2 * H:] * c  # f * c
    cn += gg
    hn = np.tanh(cn)
    hn *= iof[:, H: 2 * H]  # o * tanh(c)
    return hn, cn


def _spec_lstm(consts, kwargs):
    """A forward LSTM with constant W/R/B, no peepholes, sequence lengths or clipping, default activations.

    The input and recurrent weights are transposed and stacked once, ``[W R]^T`` of shape [I + H, 4H], so a
    single-step call is one matrix product of ``[x h]``, and longer sequences use its two row blocks.
    """
    n = len(consts)
    W, R = consts[1], consts[2]
    B = consts[3] if n > 3 else None
    if (type(W) is not np.ndarray or type(R) is not np.ndarray or not (B is None or type(B) is np.ndarray)
            or (n > 4 and consts[4] is not None) or (n > 7 and consts[7] is not None)
            or not _default_lstm_config(kwargs)):
        return None
    dt = W.dtype
    if dt.kind != "f" or R.dtype != dt or (B is not None and B.dtype != dt) or W.ndim != 3 or W.shape[0] != 1:
        return None
    H4, I = W.shape[1], W.shape[2]
    H = H4 // 4
    hs = kwargs.get("hidden_size")
    if H4 % 4 or R.shape != (1, H4, H) or (B is not None and B.shape != (1, 2 * H4)) or (
            hs is not None and int(hs) != H):
        return None
    if W.nbytes + R.nbytes > _FUSED_MAX_BYTES:
        return None
    ct = _compute_dtype(dt)
    WR = np.empty((I + H, H4), ct)
    WR[:I] = W[0].T
    WR[I:] = R[0].T
    WR.flags.writeable = False
    Wt, Rt = WR[:I], WR[I:]
    bias = np.zeros(H4, ct) if B is None else (B[0, :H4].astype(ct) + B[0, H4:].astype(ct))
    bias.flags.writeable = False
    WRb = np.concatenate((WR, bias[None]))  # [W R b]^T: the bias rides on a column of ones
    WRb.flags.writeable = False
    ones: dict = {}  # batch size -> the (Bsz, 1) column of ones [x h 1] ends with (a few kept)
    want_y = _want_y(None, kwargs.get("_output_names"))
    generic = lstm
    expit = _fast.sigmoid_into

    def state(s, Bsz):
        if s is None:
            return np.zeros((Bsz, H), ct)
        if type(s) is not np.ndarray or s.shape != (1, Bsz, H) or s.dtype.kind != "f":
            return None
        return s[0].astype(ct, copy=False)

    def lstm_const(X, *args):
        if type(X) is not np.ndarray or X.dtype != dt or X.ndim != 3 or X.shape[2] != I:
            return generic(X, *args, **kwargs)
        T, Bsz = X.shape[0], X.shape[1]
        if T == 0:
            return generic(X, *args, **kwargs)
        h = state(args[4] if len(args) > 4 else None, Bsz)
        c = state(args[5] if len(args) > 5 else None, Bsz)
        if h is None or c is None:
            return generic(X, *args, **kwargs)
        Xc = X.astype(ct, copy=False)
        od = X.dtype
        if T == 1:  # one step: a single product of [x h 1] with the stacked weights and the bias
            one = ones.get(Bsz)
            if one is None:
                one = np.ones((Bsz, 1), ct)
                if len(ones) < 16:
                    ones[Bsz] = one
            g = _dot2(np.concatenate((Xc[0], h, one), axis=1), WRb)
            h, c = _lstm_cell(g, c, H, expit)
            # fresh arrays; with Y asked for too, Y_h gets its own copy so that no two outputs share memory
            Y = h.reshape(1, 1, Bsz, H).astype(od, copy=False) if want_y else None
            Yh = h.reshape(1, Bsz, H).astype(od, copy=Y is not None)
            return Y, Yh, c.reshape(1, Bsz, H).astype(od, copy=False)
        Y = np.empty((T, 1, Bsz, H), ct) if want_y else None
        xw = (Xc.reshape(T * Bsz, I) @ Wt).reshape(T, Bsz, H4)
        xw += bias
        for t in range(T):
            g = _dot2(h, Rt)
            g += xw[t]
            h, c = _lstm_cell(g, c, H, expit)
            if Y is not None:
                Y[t, 0] = h
        Yh = h.reshape(1, Bsz, H).astype(od)  # copies: no output shares memory with another
        Yc = c.reshape(1, Bsz, H).astype(od)
        return (Y.astype(od, copy=False) if Y is not None else None), Yh, Yc

    return lstm_const


lstm.specialize = _spec_lstm
