"""Baseline / extended-sequential Huffman JPEG decoding for ImageDecoder (numpy only).

Bit-exact with libjpeg(-turbo)'s defaults, which common image libraries use: the "islow" integer IDCT, "fancy"
(triangle) chroma upsampling and the integer YCbCr->RGB tables.  Progressive, arithmetic-coded, lossless, 12-bit
and CMYK JPEGs raise :class:`UnsupportedImageFormat`.  Entropy decoding is a Python loop over coefficients.
"""

from __future__ import annotations

import struct

import numpy as np


class _Corrupt(Exception):
    """The stream is not a valid image of the format its signature claims."""


class UnsupportedImageFormat(NotImplementedError):
    pass


_ZIGZAG = np.array([
    0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21,
    28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61,
    54, 47, 55, 62, 63], dtype=np.intp)


def _huff_table(counts: bytes, symbols: bytes) -> dict:
    table = {}
    code = 0
    k = 0
    for length in range(1, 17):
        for _ in range(counts[length - 1]):
            table[(length, code)] = symbols[k]
            k += 1
            code += 1
        code <<= 1
    return table


class _Bits:
    __slots__ = ("s", "pos")

    def __init__(self, data: bytes):
        self.s = "".join(f"{b:08b}" for b in data) if data else ""
        self.pos = 0

    def read(self, n: int) -> int:
        if n == 0:
            return 0
        p = self.pos
        chunk = self.s[p:p + n]
        self.pos = p + n
        if len(chunk) < n:  # past the end: libjpeg pads with 1 bits
            chunk = chunk + "1" * (n - len(chunk))
        return int(chunk, 2)

    def decode(self, table: dict) -> int:
        code = 0
        s = self.s
        for length in range(1, 17):
            p = self.pos
            code = (code << 1) | (1 if p >= len(s) or s[p] == "1" else 0)
            self.pos = p + 1
            v = table.get((length, code))
            if v is not None:
                return v
        raise _Corrupt("JPEG Huffman code is invalid")


def _extend(v: int, s: int) -> int:
    return v - (1 << s) + 1 if s and v < (1 << (s - 1)) else v


_C = {n: v for n, v in (("0_298631336", 2446), ("0_390180644", 3196), ("0_541196100", 4433), ("0_765366865", 6270),
                       ("0_899976223", 7373), ("1_175875602", 9633), ("1_501321110", 12299),
                       ("1_847759065", 15137), ("1_961570560", 16069), ("2_053119869", 16819),
                       ("2_562915447", 20995), ("3_072711026", 25172))}


def _idct_1d(v, shift: int):
    """libjpeg's jidctint 1-D pass on the last axis ([..., 8] int64); returns the 8 outputs descaled by ``shift``."""
    z2, z3 = v[..., 2], v[..., 6]
    z1 = (z2 + z3) * _C["0_541196100"]
    tmp2 = z1 - z3 * _C["1_847759065"]
    tmp3 = z1 + z2 * _C["0_765366865"]
    tmp0 = (v[..., 0] + v[..., 4]) << 13
    tmp1 = (v[..., 0] - v[..., 4]) << 13
    tmp10, tmp13, tmp11, tmp12 = tmp0 + tmp3, tmp0 - tmp3, tmp1 + tmp2, tmp1 - tmp2
    t0, t1, t2, t3 = v[..., 7], v[..., 5], v[..., 3], v[..., 1]
    z1, z2, z3, z4 = t0 + t3, t1 + t2, t0 + t2, t1 + t3
    z5 = (z3 + z4) * _C["1_175875602"]
    t0 = t0 * _C["0_298631336"]
    t1 = t1 * _C["2_053119869"]
    t2 = t2 * _C["3_072711026"]
    t3 = t3 * _C["1_501321110"]
    z1 = z1 * -_C["0_899976223"]
    z2 = z2 * -_C["2_562915447"]
    z3 = z3 * -_C["1_961570560"] + z5
    z4 = z4 * -_C["0_390180644"] + z5
    t0 = t0 + z1 + z3
    t1 = t1 + z2 + z4
    t2 = t2 + z2 + z3
    t3 = t3 + z1 + z4
    r = 1 << (shift - 1)
    outs = [tmp10 + t3, tmp11 + t2, tmp12 + t1, tmp13 + t0, tmp13 - t0, tmp12 - t1, tmp11 - t2, tmp10 - t3]
    return np.stack([(o + r) >> shift for o in outs], axis=-1)


def _idct_islow(coefs: np.ndarray) -> np.ndarray:
    """[N, 8, 8] dequantized coefficients (row-major) -> [N, 8, 8] uint8 samples."""
    c = coefs.astype(np.int64)
    ws = _idct_1d(np.swapaxes(c, 1, 2), 13 - 2)  # pass 1 on columns: [N, col, row-out]
    out = _idct_1d(np.swapaxes(ws, 1, 2), 13 + 2 + 3)  # pass 2 on rows: [N, row, col-out]
    return np.clip(out + 128, 0, 255).astype(np.uint8)


def _fancy_h2(x: np.ndarray) -> np.ndarray:
    """Horizontal 2x triangle upsampling (libjpeg h2v1_fancy_upsample), on int arrays [H, W]."""
    left = np.concatenate([x[:, :1], x[:, :-1]], axis=1)
    right = np.concatenate([x[:, 1:], x[:, -1:]], axis=1)
    out = np.empty((x.shape[0], x.shape[1] * 2), dtype=np.int32)
    out[:, 0::2] = (3 * x + left + 1) >> 2
    out[:, 1::2] = (3 * x + right + 2) >> 2
    return out


def _fancy_v2(x: np.ndarray) -> np.ndarray:
    up = np.concatenate([x[:1], x[:-1]], axis=0)
    down = np.concatenate([x[1:], x[-1:]], axis=0)
    out = np.empty((x.shape[0] * 2, x.shape[1]), dtype=np.int32)
    out[0::2] = (3 * x + up + 1) >> 2
    out[1::2] = (3 * x + down + 2) >> 2
    return out


def _fancy_h2v2(x: np.ndarray) -> np.ndarray:
    up = np.concatenate([x[:1], x[:-1]], axis=0)
    down = np.concatenate([x[1:], x[-1:]], axis=0)
    out = np.empty((x.shape[0] * 2, x.shape[1] * 2), dtype=np.int32)
    for rows, nb in ((slice(0, None, 2), up), (slice(1, None, 2), down)):
        cs = 3 * x + nb  # column sums
        last = np.concatenate([cs[:, :1], cs[:, :-1]], axis=1)
        nxt = np.concatenate([cs[:, 1:], cs[:, -1:]], axis=1)
        out[rows, 0::2] = (3 * cs + last + 8) >> 4
        out[rows, 1::2] = (3 * cs + nxt + 7) >> 4
    return out


def _upsample(plane: np.ndarray, fh: int, fv: int) -> np.ndarray:
    x = plane.astype(np.int32)
    if fh == 2 and fv == 2 and x.shape[1] > 2:
        return _fancy_h2v2(x)
    if fh == 2 and fv == 1 and x.shape[1] > 2:
        return _fancy_h2(x)
    if fh == 1 and fv == 2 and x.shape[1] > 2:
        return _fancy_v2(x)
    return np.repeat(np.repeat(x, fv, axis=0), fh, axis=1)


def _ycc_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    def fix(v):
        return int(v * 65536 + 0.5)

    half = 1 << 15
    cbx = cb.astype(np.int64) - 128
    crx = cr.astype(np.int64) - 128
    yy = y.astype(np.int64)
    r = yy + ((fix(1.40200) * crx + half) >> 16)
    g = yy + ((-fix(0.34414) * cbx + half - fix(0.71414) * crx) >> 16)
    b = yy + ((fix(1.77200) * cbx + half) >> 16)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


def decode_jpeg(buf: bytes) -> np.ndarray:
    qt: dict[int, np.ndarray] = {}
    dc_tabs: dict[int, dict] = {}
    ac_tabs: dict[int, dict] = {}
    frame = None
    comps: list[dict] = []
    restart = 0
    adobe_transform = None
    pos = 2
    n = len(buf)
    while pos < n:
        if buf[pos] != 0xFF:
            pos += 1
            continue
        marker = buf[pos + 1]
        pos += 2
        if marker in (0xD8, 0x01, 0xFF) or 0xD0 <= marker <= 0xD7:
            if marker == 0xFF:
                pos -= 1
            continue
        if marker == 0xD9:
            break
        (length,) = struct.unpack(">H", buf[pos:pos + 2])
        seg = buf[pos + 2:pos + length]
        if len(seg) != length - 2:
            raise _Corrupt("JPEG segment is truncated")
        pos += length
        if marker == 0xDB:  # DQT
            i = 0
            while i < len(seg):
                pq, tq = seg[i] >> 4, seg[i] & 15
                if pq:
                    vals = np.frombuffer(seg[i + 1:i + 129], dtype=">u2").astype(np.int64)
                    i += 129
                else:
                    vals = np.frombuffer(seg[i + 1:i + 65], dtype=np.uint8).astype(np.int64)
                    i += 65
                q = np.zeros(64, np.int64)
                q[_ZIGZAG] = vals
                qt[tq] = q.reshape(8, 8)
        elif marker == 0xC4:  # DHT
            i = 0
            while i < len(seg):
                tc, th = seg[i] >> 4, seg[i] & 15
                counts = seg[i + 1:i + 17]
                total = sum(counts)
                table = _huff_table(counts, seg[i + 17:i + 17 + total])
                (dc_tabs if tc == 0 else ac_tabs)[th] = table
                i += 17 + total
        elif marker in (0xC0, 0xC1):  # baseline / extended sequential, Huffman
            precision, hgt, wid, nc = struct.unpack(">BHHB", seg[:6])
            if precision != 8:
                raise UnsupportedImageFormat("ImageDecoder: 12-bit JPEG is not supported")
            comps = []
            for k in range(nc):
                cid, hv, tq = seg[6 + 3 * k:9 + 3 * k]
                comps.append({"id": cid, "h": hv >> 4, "v": hv & 15, "tq": tq})
            frame = (hgt, wid)
            hmax = max(c["h"] for c in comps)
            vmax = max(c["v"] for c in comps)
            mcux = -(-wid // (8 * hmax))
            mcuy = -(-hgt // (8 * vmax))
            for c in comps:
                c["bw"] = mcux * c["h"]
                c["bh"] = mcuy * c["v"]
                c["coef"] = np.zeros((c["bh"], c["bw"], 64), dtype=np.int64)
                c["w"] = -(-wid * c["h"] // hmax)
                c["hgt"] = -(-hgt * c["v"] // vmax)
        elif 0xC2 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            raise UnsupportedImageFormat("ImageDecoder: progressive/lossless/arithmetic JPEG is not supported")
        elif marker == 0xDD:
            (restart,) = struct.unpack(">H", seg[:2])
        elif marker == 0xEE and seg[:5] == b"Adobe" and len(seg) >= 12:
            adobe_transform = seg[11]
        elif marker == 0xDA:  # SOS
            if frame is None:
                raise _Corrupt("JPEG scan before frame header")
            ns = seg[0]
            scomps = []
            for k in range(ns):
                cid, tdta = seg[1 + 2 * k], seg[2 + 2 * k]
                c = next((c for c in comps if c["id"] == cid), None)
                if c is None:
                    raise _Corrupt("JPEG scan names an unknown component")
                scomps.append((c, dc_tabs.get(tdta >> 4), ac_tabs.get(tdta & 15)))
            end = pos
            while end < n - 1 and not (buf[end] == 0xFF and buf[end + 1] != 0 and not 0xD0 <= buf[end + 1] <= 0xD7):
                end += 1
            data = buf[pos:end]
            pos = end
            _decode_scan(data, scomps, frame, restart)
    if frame is None:
        raise _Corrupt("JPEG has no frame")
    hgt, wid = frame
    hmax = max(c["h"] for c in comps)
    vmax = max(c["v"] for c in comps)
    planes = []
    for c in comps:
        if c["tq"] not in qt:
            raise _Corrupt("JPEG quantization table is missing")
        blocks = c["coef"].reshape(-1, 8, 8)
        pix = _idct_islow(blocks * qt[c["tq"]])
        plane = pix.reshape(c["bh"], c["bw"], 8, 8).transpose(0, 2, 1, 3).reshape(c["bh"] * 8, c["bw"] * 8)
        plane = plane[: c["hgt"], : c["w"]]
        up = _upsample(plane, hmax // c["h"], vmax // c["v"])[:hgt, :wid]
        planes.append(up)
    if len(planes) == 1:
        return planes[0].astype(np.uint8)[:, :, None]
    if len(planes) == 3:
        if adobe_transform == 0:
            return np.stack(planes, axis=-1).astype(np.uint8)
        return _ycc_to_rgb(*planes)
    raise UnsupportedImageFormat(f"ImageDecoder: JPEG with {len(planes)} components (CMYK) is not supported")


def _decode_scan(data: bytes, scomps: list, frame: tuple, restart: int) -> None:
    hgt, wid = frame
    # split at restart markers, then remove byte stuffing
    segments = []
    start = 0
    i = 0
    while i < len(data) - 1:
        if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7:
            segments.append(data[start:i])
            start = i + 2
            i += 2
            continue
        i += 1
    segments.append(data[start:])
    segments = [s.replace(b"\xff\x00", b"\xff") for s in segments]
    if len(scomps) == 1:
        c = scomps[0][0]
        units = [(c, by, bx) for by in range(-(-c["hgt"] // 8)) for bx in range(-(-c["w"] // 8))]
        mcus = [[u] for u in units]
    else:
        any_c = scomps[0][0]
        mcux = any_c["bw"] // any_c["h"]
        mcuy = any_c["bh"] // any_c["v"]
        mcus = []
        for my in range(mcuy):
            for mx in range(mcux):
                blocks = []
                for c, _, _ in scomps:
                    for v in range(c["v"]):
                        for hh in range(c["h"]):
                            blocks.append((c, my * c["v"] + v, mx * c["h"] + hh))
                mcus.append(blocks)
    tabs = {id(c): (dc, ac) for c, dc, ac in scomps}
    if any(dc is None or ac is None for dc, ac in tabs.values()):
        raise _Corrupt("JPEG Huffman table is missing")
    per_seg = restart if restart else len(mcus)
    for s_idx in range(0, max(1, -(-len(mcus) // per_seg))):
        bits = _Bits(segments[s_idx] if s_idx < len(segments) else b"")
        pred = {id(c): 0 for c, _, _ in scomps}
        for mcu in mcus[s_idx * per_seg:(s_idx + 1) * per_seg]:
            for c, by, bx in mcu:
                dc, ac = tabs[id(c)]
                coef = c["coef"][by, bx]
                t = bits.decode(dc)
                pred[id(c)] += _extend(bits.read(t), t)
                coef[0] = pred[id(c)]
                k = 1
                while k < 64:
                    rs = bits.decode(ac)
                    r, s = rs >> 4, rs & 15
                    if s == 0:
                        if r != 15:
                            break
                        k += 16
                        continue
                    k += r
                    if k > 63:
                        raise _Corrupt("JPEG AC coefficient index out of range")
                    coef[_ZIGZAG[k]] = _extend(bits.read(s), s)
                    k += 1
