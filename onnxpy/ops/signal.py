"""Signal processing: DFT (17, 20), STFT, Hann/Hamming/Blackman windows, MelWeightMatrix."""

from __future__ import annotations

import numpy as np

from .. import limits
from ..dtypes import to_numpy
from .registry import kernel

_FLOAT_KINDS = ("float16", "float32", "float64", "bfloat16")


def _check_float(name: str, x: np.ndarray) -> None:
    if x.dtype.name not in _FLOAT_KINDS:
        raise TypeError(f"{name}: input must be a float tensor (float16/float/double/bfloat16), got {x.dtype}")


def _scalar_int(name: str, v) -> int:
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer tensor, got {a.dtype}")
    return int(a.reshape(()))


def _to_complex(x: np.ndarray, what: str) -> np.ndarray:
    """[..., 1] real or [..., 2] complex float tensor -> complex128 array without the last axis."""
    last = x.shape[-1] if x.ndim else 0
    # float32 and narrower types are transformed in single precision (like the ONNX test generators), double in double
    ft, ct = (np.float64, np.complex128) if x.dtype == np.float64 else (np.float32, np.complex64)
    xf = x.astype(ft, copy=False)
    if last == 1:
        return xf[..., 0].astype(ct)
    if last == 2:
        out = np.empty(xf.shape[:-1], dtype=ct)
        out.real = xf[..., 0]
        out.imag = xf[..., 1]
        return out
    raise ValueError(f"{what}: the last dimension must be 1 (real) or 2 (complex), got shape {x.shape}")


def _from_complex(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = np.empty(y.shape + (2,), dtype=y.real.dtype)
    out[..., 0] = y.real
    out[..., 1] = y.imag
    return out.astype(dtype, copy=False)


def _dft(x, dft_length, axis: int, inverse: int, onesided: int) -> np.ndarray:
    x = np.asarray(x)
    _check_float("DFT", x)
    r = x.ndim
    if r < 2:
        raise ValueError(f"DFT: input must have rank >= 2 (last axis holds real/imag), got shape {x.shape}")
    if not (-r <= axis <= -2 or 0 <= axis <= r - 2):
        raise ValueError(f"DFT: axis {axis} out of range for input of rank {r} (last axis is the complex axis)")
    ax = axis + r if axis < 0 else axis
    real_input = x.shape[-1] == 1
    c = _to_complex(x, "DFT")
    n_axis = c.shape[ax]
    if dft_length is not None:
        n = _scalar_int("DFT dft_length", dft_length)
        if n < 1:
            raise ValueError(f"DFT: dft_length must be positive, got {n}")
    elif onesided and inverse:
        n = 2 * (n_axis - 1)
        if n < 1:
            raise ValueError(f"DFT: cannot infer the IRFFT length from an axis of size {n_axis}")
    else:
        n = n_axis
    if n_axis == 0:
        raise ValueError("DFT: the signal axis is empty")
    out_n = n // 2 + 1 if onesided and not inverse else n
    if onesided and inverse:
        limits.check_alloc(c.shape[:ax] + (n,) + c.shape[ax + 1:] + (1,), x.dtype, "DFT output")
    else:
        limits.check_alloc(c.shape[:ax] + (out_n,) + c.shape[ax + 1:] + (2,), x.dtype, "DFT output")
    if onesided and inverse:
        y = np.fft.irfft(c, n=n, axis=ax)
        return y[..., None].astype(x.dtype, copy=False)
    if onesided:
        if real_input:
            y = np.fft.rfft(c.real, n=n, axis=ax)
        else:
            y = np.take(np.fft.fft(c, n=n, axis=ax), np.arange(n // 2 + 1), axis=ax)
    elif inverse:
        y = np.fft.ifft(c, n=n, axis=ax)
    else:
        y = np.fft.fft(c, n=n, axis=ax)
    return _from_complex(y, x.dtype)


@kernel("DFT", since=17)
def dft_17(input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    return _dft(input, dft_length, int(axis), int(inverse), int(onesided))


@kernel("DFT", since=20)
def dft_20(input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    ax = -2 if axis is None else _scalar_int("DFT axis", axis)
    return _dft(input, dft_length, ax, int(inverse), int(onesided))


@kernel("STFT", since=17)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    signal = np.asarray(signal)
    _check_float("STFT", signal)
    if signal.ndim != 3:
        raise ValueError(f"STFT: signal must have shape [batch, length, 1 or 2], got {signal.shape}")
    step = _scalar_int("STFT frame_step", frame_step)
    if step < 1:
        raise ValueError(f"STFT: frame_step must be positive, got {step}")
    sig = _to_complex(signal, "STFT")  # [B, L]
    L = sig.shape[1]
    win = None
    if window is not None:
        win = np.asarray(window)
        if win.ndim != 1:
            raise ValueError(f"STFT: window must be 1-D, got shape {win.shape}")
    if frame_length is not None:
        fl = _scalar_int("STFT frame_length", frame_length)
        if win is not None and win.shape[0] != fl:
            raise ValueError(f"STFT: window length {win.shape[0]} does not equal frame_length {fl}")
    elif win is not None:
        fl = win.shape[0]
    else:
        fl = L
    if fl < 1 or fl > L:
        raise ValueError(f"STFT: frame_length {fl} must lie in [1, signal_length={L}]")
    nframes = (L - fl) // step + 1
    limits.check_alloc((sig.shape[0], nframes, fl // 2 + 1 if onesided else fl, 2), signal.dtype, "STFT output")
    idx = np.arange(nframes)[:, None] * step + np.arange(fl)[None, :]
    frames = sig[:, idx]  # [B, F, fl]
    if win is not None:
        if win.dtype.name not in _FLOAT_KINDS:
            raise TypeError(f"STFT: window must be a float tensor, got {win.dtype}")
        frames = frames * win.astype(frames.real.dtype)
    real_input = signal.shape[-1] == 1
    if onesided:
        if not real_input:
            raise ValueError("STFT: onesided=1 requires a real signal (last dimension 1)")
        y = np.fft.rfft(frames.real, axis=-1)
    else:
        y = np.fft.fft(frames, axis=-1)
    return _from_complex(y, signal.dtype)


# --------------------------------------------------------------------------------------------------------------
# windows
# --------------------------------------------------------------------------------------------------------------


def _window(op: str, size, periodic: int, output_datatype: int, coeffs: tuple[float, ...]) -> np.ndarray:
    n = _scalar_int(f"{op} size", size)
    if n < 0:
        raise ValueError(f"{op}: size must be non-negative, got {n}")
    try:
        dt = to_numpy(int(output_datatype))
    except Exception as e:  # noqa: BLE001
        raise TypeError(f"{op}: unsupported output_datatype {output_datatype}") from e
    denom = n if periodic else n - 1
    k = np.arange(n, dtype=np.float64)
    if denom <= 0:
        w = np.ones(n, dtype=np.float64)
    else:
        w = np.zeros(n, dtype=np.float64)
        for m, a in enumerate(coeffs):
            w += a * np.cos(2.0 * np.pi * m * k / denom)
    if dt.kind in "iu":  # integer windows: truncate from single precision (1 - 1e-16 counts as 1)
        w = w.astype(np.float32)
    return w.astype(dt)


@kernel("HannWindow", since=17)
def hann_window(size, *, output_datatype=1, periodic=1):
    return _window("HannWindow", size, periodic, output_datatype, (0.5, -0.5))


@kernel("HammingWindow", since=17)
def hamming_window(size, *, output_datatype=1, periodic=1):
    a0 = 25.0 / 46.0
    return _window("HammingWindow", size, periodic, output_datatype, (a0, -(1.0 - a0)))


@kernel("BlackmanWindow", since=17)
def blackman_window(size, *, output_datatype=1, periodic=1):
    return _window("BlackmanWindow", size, periodic, output_datatype, (0.42, -0.5, 0.08))


# --------------------------------------------------------------------------------------------------------------
# MelWeightMatrix
# --------------------------------------------------------------------------------------------------------------


@kernel("MelWeightMatrix", since=17)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *,
                      output_datatype=1):
    nmel = _scalar_int("MelWeightMatrix num_mel_bins", num_mel_bins)
    nfft = _scalar_int("MelWeightMatrix dft_length", dft_length)
    sr = _scalar_int("MelWeightMatrix sample_rate", sample_rate)
    lo = float(np.asarray(lower_edge_hertz).reshape(()))
    hi = float(np.asarray(upper_edge_hertz).reshape(()))
    if nmel < 1 or nfft < 1 or sr < 1:
        raise ValueError(f"MelWeightMatrix: num_mel_bins, dft_length and sample_rate must be positive, "
                         f"got {nmel}, {nfft}, {sr}")
    if not (0 <= lo < hi):
        raise ValueError(f"MelWeightMatrix: need 0 <= lower_edge_hertz < upper_edge_hertz, got {lo}, {hi}")
    dt = to_numpy(int(output_datatype))
    nbins = nfft // 2 + 1
    lo_mel = 2595.0 * np.log10(1.0 + lo / 700.0)
    hi_mel = 2595.0 * np.log10(1.0 + hi / 700.0)
    # nmel + 2 band edges spaced evenly on the mel scale, mapped back to hertz and then to DFT bin indices
    step = (hi_mel - lo_mel) / (nmel + 2)
    mels = np.arange(nmel + 2, dtype=np.float64) * step + lo_mel
    hz = 700.0 * (np.power(10.0, mels / 2595.0) - 1.0)
    edges = np.floor((nfft + 1) * hz / sr).astype(np.int64)
    left, center, right = edges[:-2][None, :], edges[1:-1][None, :], edges[2:][None, :]
    j = np.arange(nbins, dtype=np.int64)[:, None]
    up_den = np.maximum(center - left, 1)
    down_den = np.maximum(right - center, 1)
    rising = np.where(center > left, (j - left) / up_den, 1.0)
    falling = (right - j) / down_den
    out = np.zeros((nbins, nmel), dtype=np.float64)
    in_rise = (j >= left) & (j <= center)
    in_fall = (j >= center) & (j < right)
    out = np.where(in_rise, rising, out)
    out = np.where(in_fall, falling, out)
    return out.astype(dt)
