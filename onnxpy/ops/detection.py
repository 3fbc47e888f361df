"""Detection ops: NonMaxSuppression, RoiAlign, MaxRoiPool."""

from __future__ import annotations

import math

import numpy as np

from ._common import text
from .registry import kernel




def _scalar(v, default, dtype, op, name):
    if v is None:
        return default
    a = np.asarray(v)
    if a.size == 0:
        return default
    if a.size != 1:
        raise ValueError(f"{op}: {name} must be a scalar, got shape {a.shape}")
    return dtype(a.reshape(-1)[0])


# ------------------------------------------------------------------------------------------ NonMaxSuppression


def _corners(boxes: np.ndarray, center_point_box: int):
    """(y1, x1, y2, x2, area) in float64 with y1 <= y2, x1 <= x2."""
    b = boxes.astype(np.float64)
    if center_point_box:
        xc, yc, w, h = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
        x1, x2 = xc - w / 2, xc + w / 2
        y1, y2 = yc - h / 2, yc + h / 2
    else:
        y1 = np.minimum(b[:, 0], b[:, 2])
        y2 = np.maximum(b[:, 0], b[:, 2])
        x1 = np.minimum(b[:, 1], b[:, 3])
        x2 = np.maximum(b[:, 1], b[:, 3])
    return y1, x1, y2, x2, (x2 - x1) * (y2 - y1)


def _iou_one(c, i, rest):
    """IoU of box i with boxes `rest`; zero where either box has no area."""
    y1, x1, y2, x2, area = c
    iw = np.clip(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0, None)
    ih = np.clip(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0, None)
    inter = iw * ih
    union = area[i] + area[rest] - inter
    ok = (area[i] > 0) & (area[rest] > 0) & (union > 0)
    return np.divide(inter, union, out=np.zeros_like(inter), where=ok)


@kernel("NonMaxSuppression", since=(10, 11))
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None, score_threshold=None,
                        *, center_point_box=0):
    op = "NonMaxSuppression"
    boxes = np.asarray(boxes)
    scores = np.asarray(scores)
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(f"{op}: boxes must have shape (batch, spatial, 4), got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"{op}: scores shape {scores.shape} does not match boxes shape {boxes.shape}")
    if center_point_box not in (0, 1):
        raise ValueError(f"{op}: center_point_box must be 0 or 1, got {center_point_box}")
    max_out = _scalar(max_output_boxes_per_class, 0, int, op, "max_output_boxes_per_class")
    iou_thr = _scalar(iou_threshold, 0.0, float, op, "iou_threshold")
    score_thr = _scalar(score_threshold, None, float, op, "score_threshold")
    if iou_thr < 0 or iou_thr > 1:
        raise ValueError(f"{op}: iou_threshold must be in [0, 1], got {iou_thr}")
    B, C, S = scores.shape
    result = []
    if max_out > 0 and S > 0:
        for b in range(B):
            corners = None
            for c in range(C):
                sc = scores[b, c].astype(np.float64)
                cand = np.arange(S) if score_thr is None else np.nonzero(sc > np.float32(score_thr))[0]
                if cand.size == 0:
                    continue
                order = cand[np.argsort(-sc[cand], kind="stable")]
                if corners is None:
                    corners = _corners(boxes[b], center_point_box)
                rest = order
                picked = 0
                while rest.size and picked < max_out:
                    sel = int(rest[0])
                    result.append((b, c, sel))
                    picked += 1
                    rest = rest[1:]
                    if rest.size:
                        rest = rest[~(_iou_one(corners, sel, rest) > iou_thr)]
    if not result:
        return np.zeros((0, 3), dtype=np.int64)
    return np.asarray(result, dtype=np.int64)


# ----------------------------------------------------------------------------------------------- RoiAlign


def _bilinear_setup(coords, size):
    """Per sample: low/high indices, weights, and a validity mask (RoiAlign sampling rules)."""
    valid = (coords >= -1.0) & (coords <= size)
    c = np.maximum(coords, 0.0)
    low = np.floor(c).astype(np.int64)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    c = np.where(at_end, low.astype(np.float64), c)
    frac = c - low
    return low, high, 1.0 - frac, frac, valid


def _roi_align(X, rois, batch_indices, *, mode, output_height, output_width, sampling_ratio, spatial_scale,
               half_pixel, op):
    X = np.asarray(X)
    rois = np.asarray(rois)
    bidx = np.asarray(batch_indices).reshape(-1).astype(np.int64)
    if X.ndim != 4:
        raise ValueError(f"{op}: X must be 4-D (N, C, H, W), got shape {X.shape}")
    if rois.ndim != 2 or rois.shape[1] != 4:
        raise ValueError(f"{op}: rois must have shape (num_rois, 4), got {rois.shape}")
    if bidx.size != rois.shape[0]:
        raise ValueError(f"{op}: batch_indices has {bidx.size} values for {rois.shape[0]} rois")
    if bidx.size and (bidx.min() < 0 or bidx.max() >= X.shape[0]):
        raise ValueError(f"{op}: batch_indices out of range [0, {X.shape[0]})")
    mode = text(mode)
    if mode not in ("avg", "max"):
        raise ValueError(f"{op}: unsupported mode {mode!r}")
    N, C, H, W = X.shape
    oh, ow = int(output_height), int(output_width)
    R = rois.shape[0]
    work = np.float64 if X.dtype == np.float64 else np.float32
    out = np.zeros((R, C, oh, ow), dtype=work)
    if R == 0 or C == 0:
        return out.astype(X.dtype)
    offset = 0.5 if half_pixel else 0.0
    xw = X.astype(work, copy=False)
    r64 = rois.astype(np.float64)
    for r in range(R):
        x1, y1, x2, y2 = (r64[r] * spatial_scale) - offset
        rw, rh = x2 - x1, y2 - y1
        if not half_pixel:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rh / oh))
        gw = int(sampling_ratio) if sampling_ratio > 0 else int(math.ceil(rw / ow))
        gh, gw = max(gh, 1), max(gw, 1)
        ys = y1 + (np.arange(oh)[:, None] * bh + (np.arange(gh)[None, :] + 0.5) * bh / gh)  # (oh, gh)
        xs = x1 + (np.arange(ow)[:, None] * bw + (np.arange(gw)[None, :] + 0.5) * bw / gw)  # (ow, gw)
        ylo, yhi, wyl, wyh, vy = _bilinear_setup(ys.reshape(-1), H)
        xlo, xhi, wxl, wxh, vx = _bilinear_setup(xs.reshape(-1), W)
        img = xw[bidx[r]]  # (C, H, W)
        if mode == "avg":
            # separable: interpolation matrices along y and x
            Ay = np.zeros((oh * gh, H))
            rows = np.arange(oh * gh)
            np.add.at(Ay, (rows, ylo), wyl * vy)
            np.add.at(Ay, (rows, yhi), wyh * vy)
            Ax = np.zeros((ow * gw, W))
            rows = np.arange(ow * gw)
            np.add.at(Ax, (rows, xlo), wxl * vx)
            np.add.at(Ax, (rows, xhi), wxh * vx)
            vals = np.matmul(np.matmul(Ay.astype(work), img), Ax.T.astype(work))  # (C, oh*gh, ow*gw)
            vals = vals.reshape(C, oh, gh, ow, gw).mean(axis=(2, 4))
            out[r] = vals
        else:
            valid = (vy[:, None] & vx[None, :])
            best = None
            for yi, wy in ((ylo, wyl), (yhi, wyh)):
                for xi, wx in ((xlo, wxl), (xhi, wxh)):
                    v = img[:, yi[:, None], xi[None, :]] * (wy[:, None] * wx[None, :]).astype(work)
                    best = v if best is None else np.maximum(best, v)
            best = np.where(valid, best, 0)
            out[r] = best.reshape(C, oh, gh, ow, gw).max(axis=(2, 4))
    return out.astype(X.dtype, copy=False)


@kernel("RoiAlign", since=10)
def roi_align_10(X, rois, batch_indices, *, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
                 spatial_scale=1.0):
    return _roi_align(X, rois, batch_indices, mode=mode, output_height=output_height, output_width=output_width,
                      sampling_ratio=sampling_ratio, spatial_scale=spatial_scale, half_pixel=False, op="RoiAlign")


@kernel("RoiAlign", since=(16, 22))
def roi_align(X, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg", output_height=1,
              output_width=1, sampling_ratio=0, spatial_scale=1.0):
    ctm = text(coordinate_transformation_mode)
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ValueError(f"RoiAlign: unsupported coordinate_transformation_mode {ctm!r}")
    return _roi_align(X, rois, batch_indices, mode=mode, output_height=output_height, output_width=output_width,
                      sampling_ratio=sampling_ratio, spatial_scale=spatial_scale, half_pixel=ctm == "half_pixel",
                      op="RoiAlign")


# ----------------------------------------------------------------------------------------------- MaxRoiPool


@kernel("MaxRoiPool", since=(1, 22))
def max_roi_pool(X, rois, *, pooled_shape=None, spatial_scale=1.0):
    op = "MaxRoiPool"
    X = np.asarray(X)
    rois = np.asarray(rois)
    if pooled_shape is None or len(pooled_shape) != 2:
        raise ValueError(f"{op}: attribute pooled_shape (2 values) is required")
    if X.ndim != 4:
        raise ValueError(f"{op}: X must be 4-D, got shape {X.shape}")
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise ValueError(f"{op}: rois must have shape (num_rois, 5), got {rois.shape}")
    ph, pw = int(pooled_shape[0]), int(pooled_shape[1])
    N, C, H, W = X.shape
    R = rois.shape[0]
    out = np.zeros((R, C, ph, pw), dtype=X.dtype)
    for r in range(R):
        b = int(rois[r, 0])
        if b < 0 or b >= N:
            raise ValueError(f"{op}: roi {r} batch index {b} out of range")
        x1, y1, x2, y2 = (int(np.round(float(v) * spatial_scale)) for v in rois[r, 1:])
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        bh, bw = rh / ph, rw / pw
        hs = np.clip(np.floor(np.arange(ph) * bh).astype(np.int64) + y1, 0, H)
        he = np.clip(np.ceil((np.arange(ph) + 1) * bh).astype(np.int64) + y1, 0, H)
        ws = np.clip(np.floor(np.arange(pw) * bw).astype(np.int64) + x1, 0, W)
        we = np.clip(np.ceil((np.arange(pw) + 1) * bw).astype(np.int64) + x1, 0, W)
        hm = (np.arange(H)[None, :] >= hs[:, None]) & (np.arange(H)[None, :] < he[:, None])  # (ph, H)
        wm = (np.arange(W)[None, :] >= ws[:, None]) & (np.arange(W)[None, :] < we[:, None])  # (pw, W)
        img = X[b].astype(np.float64)
        t = np.where(wm[None, None, :, :], img[:, :, None, :], -np.inf).max(axis=3)  # (C, H, pw)
        t = np.where(hm[None, :, :, None], t[:, None, :, :], -np.inf).max(axis=2)  # (C, ph, pw)
        t[:, (he <= hs)[:, None] | (we <= ws)[None, :]] = 0
        out[r] = t
    return out
