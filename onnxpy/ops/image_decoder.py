"""ImageDecoder (opset 20) without third-party image libraries.

Decodes PNG (all colour types and bit depths, Adam7 interlacing), BMP (1/4/8/16/24/32 bits, BI_RGB/BITFIELDS),
PNM (P1-P6), TIFF (8-bit strips: uncompressed, PackBits, LZW, Deflate; horizontal predictor) and sequential
Huffman JPEG (see ``_jpeg``) with numpy and zlib.  JPEG 2000, WebP and progressive JPEG are recognised but not
decoded by this module (they need codecs of their own): when the optional extra ``onnxpy[image]`` (Pillow) is
installed they are decoded through it, otherwise the kernel raises a clear error naming the extra.  A stream that
is corrupt or in an unknown format gives an empty ``(0, 0, C)`` image, as the spec requires.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from ._jpeg import UnsupportedImageFormat, _Corrupt, decode_jpeg
from .registry import kernel


# --------------------------------------------------------------------------------------------------------------
# colour helpers


def _to_rgb(img: np.ndarray) -> np.ndarray:
    """(H, W, C) uint8 with C in {1, 2, 3, 4} (gray, gray+alpha, RGB, RGBA) -> (H, W, 3) RGB."""
    c = img.shape[2]
    if c in (1, 2):
        return np.repeat(img[:, :, :1], 3, axis=2)
    return img[:, :, :3]


def _rgb_to_gray(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma with the integer rounding common decoders use."""
    r = rgb[:, :, 0].astype(np.uint32)
    g = rgb[:, :, 1].astype(np.uint32)
    b = rgb[:, :, 2].astype(np.uint32)
    y = (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16
    return y.astype(np.uint8)[:, :, None]


def _scale_to_8bit(a: np.ndarray, maxval: int) -> np.ndarray:
    if maxval == 255:
        return a.astype(np.uint8)
    return ((a.astype(np.uint32) * 255 + maxval // 2) // maxval).astype(np.uint8)


# --------------------------------------------------------------------------------------------------------------
# PNG


def _png_unfilter(raw: np.ndarray, h: int, stride: int, bpp: int) -> np.ndarray:
    if raw.size < h * (stride + 1):
        raise _Corrupt("PNG image data is truncated")
    rows = raw[: h * (stride + 1)].reshape(h, stride + 1)
    out = np.zeros((h, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(h):
        ft = int(rows[y, 0])
        line = rows[y, 1:].astype(np.int32)
        if ft == 0:
            cur = line
        elif ft == 1:  # Sub: running sum per byte lane
            pad = (-stride) % bpp
            tmp = np.concatenate([line, np.zeros(pad, np.int32)]).reshape(-1, bpp)
            cur = (np.cumsum(tmp, axis=0) & 0xFF).reshape(-1)[:stride]
        elif ft == 2:  # Up
            cur = (line + prev) & 0xFF
        elif ft in (3, 4):  # Average / Paeth depend on the reconstructed left pixel: one pixel at a time
            cur = np.zeros(stride, dtype=np.int32)
            left = np.zeros(bpp, dtype=np.int32)
            upleft = np.zeros(bpp, dtype=np.int32)
            for x in range(0, stride, bpp):
                n = min(bpp, stride - x)
                up = prev[x:x + n]
                if ft == 3:
                    v = (line[x:x + n] + ((left[:n] + up) >> 1)) & 0xFF
                else:
                    a, b, c = left[:n], up, upleft[:n]
                    p = a + b - c
                    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
                    pred = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
                    v = (line[x:x + n] + pred) & 0xFF
                cur[x:x + n] = v
                left = np.zeros(bpp, np.int32)
                left[:n] = v
                upleft = np.zeros(bpp, np.int32)
                upleft[:n] = up
        else:
            raise _Corrupt(f"PNG filter type {ft} is invalid")
        out[y] = cur
        prev = cur
    return out


def _png_samples(data: np.ndarray, w: int, h: int, depth: int, channels: int) -> np.ndarray:
    """Unfiltered bytes -> (h, w, channels) integer samples."""
    if depth == 16:
        s = data.reshape(h, -1)[:, : w * channels * 2]
        return (s[:, 0::2].astype(np.uint16) << 8 | s[:, 1::2]).reshape(h, w, channels)
    if depth == 8:
        return data.reshape(h, -1)[:, : w * channels].reshape(h, w, channels)
    bits = np.unpackbits(data.reshape(h, -1), axis=1)
    bits = bits[:, : w * channels * depth].reshape(h, w * channels, depth)
    weights = (1 << np.arange(depth - 1, -1, -1)).astype(np.uint8)
    vals = (bits * weights).sum(axis=2).astype(np.uint8)
    return vals.reshape(h, w, channels)


def _decode_png(buf: bytes) -> np.ndarray:
    pos = 8
    ihdr = None
    palette = None
    idat = []
    while pos + 8 <= len(buf):
        (length,) = struct.unpack(">I", buf[pos:pos + 4])
        ctype = buf[pos + 4:pos + 8]
        body = buf[pos + 8:pos + 8 + length]
        if len(body) != length:
            raise _Corrupt("PNG chunk is truncated")
        pos += 12 + length
        if ctype == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif ctype == b"PLTE":
            palette = np.frombuffer(body, dtype=np.uint8).reshape(-1, 3)
        elif ctype == b"IDAT":
            idat.append(body)
        elif ctype == b"IEND":
            break
    if ihdr is None or not idat:
        raise _Corrupt("PNG has no IHDR or IDAT")
    w, h, depth, ctype_, _comp, _filt, interlace = ihdr
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(ctype_)
    if channels is None or depth not in (1, 2, 4, 8, 16) or w == 0 or h == 0:
        raise _Corrupt("PNG header is invalid")
    try:
        raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    except zlib.error as e:
        raise _Corrupt(f"PNG data does not inflate: {e}") from None
    bpp = max(1, channels * depth // 8)

    def decode_pass(raw_part, pw, ph):
        stride = (pw * channels * depth + 7) // 8
        flat = _png_unfilter(raw_part, ph, stride, bpp)
        return _png_samples(flat.reshape(-1), pw, ph, depth, channels), ph * (stride + 1)

    if interlace == 0:
        samples, _ = decode_pass(raw, w, h)
    else:
        samples = np.zeros((h, w, channels), dtype=np.uint16 if depth == 16 else np.uint8)
        off = 0
        for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                               (0, 1, 1, 2)):
            pw = (w - x0 + dx - 1) // dx
            ph = (h - y0 + dy - 1) // dy
            if pw <= 0 or ph <= 0:
                continue
            part, used = decode_pass(raw[off:], pw, ph)
            samples[y0::dy, x0::dx] = part
            off += used
    if ctype_ == 3:
        if palette is None:
            raise _Corrupt("palette PNG without PLTE")
        idx = samples[:, :, 0].astype(np.intp)
        if idx.size and idx.max() >= palette.shape[0]:
            raise _Corrupt("PNG palette index out of range")
        return palette[idx]
    if depth == 16:
        return (samples >> 8).astype(np.uint8)
    if depth < 8:
        return _scale_to_8bit(samples, (1 << depth) - 1)
    return samples.astype(np.uint8)


# --------------------------------------------------------------------------------------------------------------
# BMP


def _mask_channel(px: np.ndarray, mask: int) -> np.ndarray:
    if mask == 0:
        return np.zeros(px.shape, np.uint8)
    shift = (mask & -mask).bit_length() - 1
    maxv = mask >> shift
    return _scale_to_8bit((px & mask) >> shift, maxv)


def _decode_bmp(buf: bytes) -> np.ndarray:
    if len(buf) < 26:
        raise _Corrupt("BMP is truncated")
    (offset,) = struct.unpack("<I", buf[10:14])
    (hsize,) = struct.unpack("<I", buf[14:18])
    if hsize == 12:
        w, h, _planes, bits = struct.unpack("<HHHH", buf[18:26])
        comp = 0
        n_colors = 0
        pal_entry = 3
    else:
        w, h, _planes, bits, comp = struct.unpack("<iiHHI", buf[18:34])
        (n_colors,) = struct.unpack("<I", buf[46:50])
        pal_entry = 4
    top_down = h < 0
    h = abs(h)
    if w <= 0 or h == 0:
        raise _Corrupt("BMP size is invalid")
    if comp not in (0, 3, 6):
        raise UnsupportedImageFormat(f"ImageDecoder: BMP compression {comp} (RLE/embedded JPEG/PNG) is not supported")
    stride = ((w * bits + 31) // 32) * 4
    data = np.frombuffer(buf, dtype=np.uint8, count=stride * h, offset=offset) if offset + stride * h <= len(buf) \
        else None
    if data is None:
        raise _Corrupt("BMP pixel data is truncated")
    rows = data.reshape(h, stride)
    if not top_down:
        rows = rows[::-1]
    if bits == 24:
        img = rows[:, : w * 3].reshape(h, w, 3)[:, :, ::-1]
    elif bits in (16, 32):
        if bits == 16:
            px = rows[:, : w * 2].copy().view("<u2").astype(np.uint32)
        else:
            px = rows[:, : w * 4].copy().view("<u4")
        if comp in (3, 6):
            masks = struct.unpack("<III", buf[54:66]) if hsize in (40,) else struct.unpack("<III", buf[54:66])
        elif bits == 16:
            masks = (0x7C00, 0x03E0, 0x001F)
        else:
            masks = (0xFF0000, 0x00FF00, 0x0000FF)
        img = np.stack([_mask_channel(px, m) for m in masks], axis=2)
    elif bits in (1, 2, 4, 8):
        n = n_colors or (1 << bits)
        pstart = 14 + hsize
        pal = np.frombuffer(buf, dtype=np.uint8, count=n * pal_entry, offset=pstart).reshape(n, pal_entry)
        pal = pal[:, 2::-1]
        bitsarr = np.unpackbits(rows, axis=1)[:, : w * bits].reshape(h, w, bits)
        weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint16)
        idx = (bitsarr * weights).sum(axis=2)
        if idx.max() >= n:
            raise _Corrupt("BMP palette index out of range")
        img = pal[idx]
    else:
        raise _Corrupt(f"BMP bit depth {bits} is invalid")
    return np.ascontiguousarray(img)


# --------------------------------------------------------------------------------------------------------------
# PNM


def _decode_pnm(buf: bytes) -> np.ndarray:
    kind = buf[1:2]
    pos = 2
    tokens = []
    need = 2 if kind in (b"1", b"4") else 3
    while len(tokens) < need:
        while pos < len(buf) and buf[pos:pos + 1].isspace():
            pos += 1
        if pos < len(buf) and buf[pos:pos + 1] == b"#":
            while pos < len(buf) and buf[pos:pos + 1] not in (b"\n", b"\r"):
                pos += 1
            continue
        start = pos
        while pos < len(buf) and not buf[pos:pos + 1].isspace() and buf[pos:pos + 1] != b"#":
            pos += 1
        if start == pos:
            raise _Corrupt("PNM header is truncated")
        tokens.append(int(buf[start:pos]))
    w, h = tokens[0], tokens[1]
    maxval = tokens[2] if need == 3 else 1
    if w <= 0 or h <= 0 or not 0 < maxval < 65536:
        raise _Corrupt("PNM header is invalid")
    channels = 3 if kind in (b"3", b"6") else 1
    if kind in (b"1", b"2", b"3"):
        body = buf[pos:]
        if kind == b"1":
            digits = np.frombuffer(body, dtype=np.uint8)
            digits = digits[(digits == ord("0")) | (digits == ord("1"))] - ord("0")
            vals = digits[: w * h]
        else:
            vals = np.array(body.split(), dtype=np.int64)[: w * h * channels]
        if vals.size < w * h * channels:
            raise _Corrupt("PNM data is truncated")
        arr = vals.reshape(h, w, channels)
    else:
        pos += 1  # the single whitespace after the header
        if kind == b"4":
            stride = (w + 7) // 8
            raw = np.frombuffer(buf, dtype=np.uint8, count=stride * h, offset=pos).reshape(h, stride)
            arr = np.unpackbits(raw, axis=1)[:, :w].reshape(h, w, 1)
        else:
            bps = 2 if maxval > 255 else 1
            count = w * h * channels
            if pos + count * bps > len(buf):
                raise _Corrupt("PNM data is truncated")
            arr = np.frombuffer(buf, dtype=">u2" if bps == 2 else np.uint8, count=count, offset=pos)
            arr = arr.reshape(h, w, channels)
    if kind in (b"1", b"4"):
        return np.where(arr > 0, 0, 255).astype(np.uint8)  # 1 is black
    return _scale_to_8bit(arr, maxval)


# --------------------------------------------------------------------------------------------------------------
# TIFF


def _lzw_decode(data: bytes) -> bytes:
    out = bytearray()
    table = [bytes([i]) for i in range(256)] + [b"", b""]
    width = 9
    bitpos = 0
    nbits = len(data) * 8
    prev = None
    as_int = int.from_bytes(data, "big")
    while bitpos + width <= nbits:
        code = (as_int >> (nbits - bitpos - width)) & ((1 << width) - 1)
        bitpos += width
        if code == 256:
            table = table[:258]
            width = 9
            prev = None
            continue
        if code == 257:
            break
        if code < len(table):
            entry = table[code]
            if prev is not None:
                table.append(prev + entry[:1])
        elif prev is not None and code == len(table):
            entry = prev + prev[:1]
            table.append(entry)
        else:
            raise _Corrupt("TIFF LZW stream is invalid")
        out += entry
        prev = entry
        if len(table) + 1 >= (1 << width) and width < 12:
            width += 1
    return bytes(out)


def _packbits_decode(data: bytes) -> bytes:
    out = bytearray()
    i = 0
    while i < len(data):
        n = data[i]
        i += 1
        if n < 128:
            out += data[i:i + n + 1]
            i += n + 1
        elif n > 128:
            out += data[i:i + 1] * (257 - n)
            i += 1
    return bytes(out)


def _decode_tiff(buf: bytes) -> np.ndarray:
    bo = "<" if buf[:2] == b"II" else ">"
    (ifd,) = struct.unpack(bo + "I", buf[4:8])
    (n,) = struct.unpack(bo + "H", buf[ifd:ifd + 2])
    sizes = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8}
    codes = {1: "B", 3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 16: "Q"}
    tags: dict[int, list] = {}
    for k in range(n):
        e = ifd + 2 + 12 * k
        tag, typ, count = struct.unpack(bo + "HHI", buf[e:e + 8])
        size = sizes.get(typ, 1) * count
        where = e + 8 if size <= 4 else struct.unpack(bo + "I", buf[e + 8:e + 12])[0]
        if typ in codes:
            tags[tag] = list(struct.unpack(bo + codes[typ] * count, buf[where:where + size]))
    w = tags[256][0]
    h = tags[257][0]
    bits = tags.get(258, [1])
    comp = tags.get(259, [1])[0]
    photometric = tags.get(262, [1])[0]
    spp = tags.get(277, [1])[0]
    offsets = tags.get(273)
    counts = tags.get(279)
    planar = tags.get(284, [1])[0]
    predictor = tags.get(317, [1])[0]
    if offsets is None or counts is None:
        raise UnsupportedImageFormat("ImageDecoder: tiled TIFF is not supported")
    if any(b != 8 for b in bits) and not (bits == [1] and photometric in (0, 1)):
        raise UnsupportedImageFormat(f"ImageDecoder: TIFF with {bits} bits per sample is not supported")
    if planar != 1:
        raise UnsupportedImageFormat("ImageDecoder: planar TIFF is not supported")
    chunks = []
    for off, cnt in zip(offsets, counts):
        strip = buf[off:off + cnt]
        if comp == 1:
            chunks.append(strip)
        elif comp == 32773:
            chunks.append(_packbits_decode(strip))
        elif comp == 5:
            chunks.append(_lzw_decode(strip))
        elif comp in (8, 32946):
            try:
                chunks.append(zlib.decompress(strip))
            except zlib.error as e:
                raise _Corrupt(f"TIFF deflate strip is invalid: {e}") from None
        else:
            raise UnsupportedImageFormat(f"ImageDecoder: TIFF compression {comp} is not supported")
    raw = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    if bits == [1]:
        stride = (w + 7) // 8
        if raw.size < stride * h:
            raise _Corrupt("TIFF data is truncated")
        px = np.unpackbits(raw[: stride * h].reshape(h, stride), axis=1)[:, :w]
        img = np.where(px > 0, 255, 0).astype(np.uint8)
        if photometric == 0:
            img = 255 - img
        return img[:, :, None]
    if raw.size < w * h * spp:
        raise _Corrupt("TIFF data is truncated")
    img = raw[: w * h * spp].reshape(h, w, spp)
    if predictor == 2:
        img = (np.cumsum(img.astype(np.uint32), axis=1) & 0xFF).astype(np.uint8)
    if photometric == 3:
        cmap = np.asarray(tags[320], dtype=np.uint32).reshape(3, -1).T
        return (cmap[img[:, :, 0]] >> 8).astype(np.uint8)
    if photometric == 0:
        img = 255 - img
    elif photometric not in (1, 2):
        raise UnsupportedImageFormat(f"ImageDecoder: TIFF photometric interpretation {photometric} is not supported")
    return img


# --------------------------------------------------------------------------------------------------------------


def _decode(buf: bytes) -> np.ndarray:
    if buf.startswith(b"\x89PNG\r\n\x1a\n"):
        return _decode_png(buf)
    if buf.startswith(b"BM"):
        return _decode_bmp(buf)
    if len(buf) > 2 and buf[:1] == b"P" and buf[1:2] in b"123456" and buf[2:3].isspace():
        return _decode_pnm(buf)
    if buf[:4] in (b"II*\x00", b"MM\x00*"):
        return _decode_tiff(buf)
    if buf.startswith(b"\xff\xd8"):
        return decode_jpeg(buf)
    if buf.startswith(b"RIFF") and buf[8:12] == b"WEBP":
        raise UnsupportedImageFormat("ImageDecoder: WebP decoding is not supported by onnxpy (no WebP codec)")
    if buf.startswith(b"\x00\x00\x00\x0cjP  ") or buf.startswith(b"\xff\x4f\xff\x51"):
        raise UnsupportedImageFormat("ImageDecoder: JPEG 2000 decoding is not supported by onnxpy")
    raise _Corrupt("unknown image format")


def _decode_with_pillow(buf: bytes, why: UnsupportedImageFormat) -> np.ndarray:
    """Formats this module does not decode (WebP, JPEG 2000, progressive JPEG...) through Pillow, if installed."""
    try:
        import io

        from PIL import Image
    except ImportError:
        raise UnsupportedImageFormat(f"{why} (install the optional extra onnxpy[image] to decode it)") from None
    try:
        with Image.open(io.BytesIO(buf)) as im:
            return np.asarray(im.convert("RGB"))
    except Exception as e:  # noqa: BLE001 - Pillow's decoder errors, reported as unsupported input
        raise UnsupportedImageFormat(f"{why}; Pillow could not decode it either: {e}") from None


@kernel("ImageDecoder", since=20)
def image_decoder(encoded_stream, *, pixel_format="RGB"):
    if pixel_format not in ("RGB", "BGR", "Grayscale"):
        raise ValueError(f"ImageDecoder: pixel_format must be RGB, BGR or Grayscale, got {pixel_format!r}")
    if encoded_stream is None:
        raise ValueError("ImageDecoder: input 'encoded_stream' is missing")
    data = np.asarray(encoded_stream)
    if data.dtype != np.uint8 or data.ndim != 1:
        raise TypeError(f"ImageDecoder: encoded_stream must be a 1-D uint8 tensor, got {data.dtype} {data.shape}")
    channels = 1 if pixel_format == "Grayscale" else 3
    try:
        img = _decode(data.tobytes())
    except UnsupportedImageFormat as e:
        img = _decode_with_pillow(data.tobytes(), e)
    except (_Corrupt, struct.error, KeyError, IndexError, ValueError):
        return np.zeros((0, 0, channels), dtype=np.uint8)
    if img.ndim == 2:
        img = img[:, :, None]
    rgb = _to_rgb(img)
    if pixel_format == "RGB":
        return np.ascontiguousarray(rgb)
    if pixel_format == "BGR":
        return np.ascontiguousarray(rgb[:, :, ::-1])
    if img.shape[2] in (1, 2):
        return np.ascontiguousarray(img[:, :, :1])
    return _rgb_to_gray(rgb)
