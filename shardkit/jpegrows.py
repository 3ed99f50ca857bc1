"""JPEG records with a restart marker before every MCU row, and where each row starts.

A baseline JPEG whose restart interval (DRI) is one MCU row has an RSTn marker (0xFFD0-0xFFD7,
cycling) before each row's entropy-coded data, and its DC predictions start again from zero
there: any run of rows decodes on its own (``shardkit.read.partial`` builds that JPEG).

:func:`encode_rows` makes such records with the coefficients of the encoder shardkit has always
used (simplejpeg's libjpeg-turbo, fast DCT below quality 96). Where :mod:`shardkit.libjpeg` can
reach libjpeg-turbo's own API (Pillow's wheels bundle it) the markers are written in one pass,
about 1.1x a whole-image encode. Otherwise :func:`encode_each_row` encodes each MCU row as a JPEG
of its own and joins the rows' entropy data with markers between them (about 1.4x): every DCT
block depends only on its own pixels (the 4:2:0 chroma is averaged inside 2x2 pixel cells, which
never straddle an MCU row), and a JPEG starts its DC prediction from zero, as a restart does, so
the coefficients, and the decoded pixels, are exactly those of the same image encoded whole; only
the entropy stream is split (a marker and a padded byte per row, ~0.1 % of a 256-pixel record).
Both write the same bytes (the one-pass encoder is used only after it wrote them on a probe).
Pillow's own ``restart_marker_rows`` is no substitute: it encodes with libjpeg's accurate integer
DCT, whose coefficients (so pixels) differ from the fast DCT's.

:func:`row_starts` finds the rows of any such JPEG (ours, or one saved by Pillow with
``restart_marker_rows=1``): the packer stores them in the shard index (``row_offsets`` /
``row_starts``), so a reader seeks a row without scanning.
"""

from __future__ import annotations

import struct

import numpy as np
import simplejpeg

from .libjpeg import one_pass_encoder

#: The index arrays holding each record's row starts: ``row_starts[row_offsets[i]:
#: row_offsets[i + 1]]`` are record i's (empty: no row markers, decoded whole).
ROW_ARRAYS: dict[str, str] = {"row_offsets": "<i8", "row_starts": "<u4"}

MCU_HEIGHT_420 = 16
_SOFS = (0xC0, 0xC1)  # baseline and extended sequential, Huffman-coded: one scan of all rows
_NO_LENGTH = frozenset([0x01, *range(0xD0, 0xDA)])
#: RST0..RST7, the restart markers, in the order they cycle.
RST_MARKERS = [bytes([0xFF, 0xD0 + k]) for k in range(8)]


def encode_rows(pixels: np.ndarray, quality: int) -> bytes:
    """HxWx3 uint8 RGB as a 4:2:0 baseline JPEG with a restart marker before every MCU row.

    Decodes to exactly the pixels of ``simplejpeg.encode_jpeg(pixels, quality, "RGB", "420")``;
    written in one libjpeg-turbo pass where :mod:`shardkit.libjpeg` can, else row by row
    (:func:`encode_each_row`), the same bytes either way.
    """
    one_pass = one_pass_encoder(encode_each_row)
    if one_pass is not None and pixels.shape[0] > MCU_HEIGHT_420:  # one row: no marker to write
        return one_pass(pixels, quality)
    return encode_each_row(pixels, quality)


def encode_each_row(pixels: np.ndarray, quality: int) -> bytes:
    """:func:`encode_rows` by simplejpeg alone: each MCU row encoded as a JPEG of its own and the
    rows' entropy data joined with restart markers between them."""
    height = pixels.shape[0]
    mh = MCU_HEIGHT_420
    if height <= mh:  # one row: nothing to split
        return simplejpeg.encode_jpeg(pixels, quality=quality, colorspace="RGB",
                                      colorsubsampling="420")
    encode = simplejpeg.encode_jpeg
    strips = [encode(pixels[top:top + mh], quality, "RGB", "420") for top in range(0, height, mh)]
    first, last = strips[0], strips[-1]
    frame = parse_header(first)
    if frame is None or frame.scan_end != len(first) - 2:
        raise ValueError("simplejpeg wrote a JPEG shardkit cannot split into rows")
    # Every strip has the first one's headers (the last one's SOF height aside), so the header
    # is parsed once and the others are only compared with it (the per-row cost is the encode).
    start, sof = frame.scan_start, frame.sof_height
    head = first[:start]
    if (not all([strip.startswith(head) and strip.endswith(b"\xff\xd9") for strip in strips[1:-1]])
            or not last.startswith(head[:sof]) or last[sof + 2:start] != head[sof + 2:start]
            or not last.endswith(b"\xff\xd9")):
        raise ValueError("simplejpeg wrote a JPEG shardkit cannot split into rows")
    mcus = -(-pixels.shape[1] // (8 * frame.hmax))
    parts = [first[:sof], struct.pack(">H", height), first[sof + 2:frame.sos],
             b"\xff\xdd\x00\x04", struct.pack(">H", mcus), first[frame.sos:-2]]
    for k in range(1, len(strips)):
        parts.append(RST_MARKERS[(k - 1) % 8])
        parts.append(strips[k][start:-2])
    parts.append(b"\xff\xd9")
    return b"".join(parts)


class Frame:
    """What a JPEG's header says: where the SOF's height field and the SOS segment are, where
    the entropy data starts (and ends, for one-row files), the MCU size and the restart
    interval (0: none)."""

    __slots__ = ("sof_height", "sos", "scan_start", "scan_end", "height", "width", "hmax",
                 "mcu_height", "restart")

    def __init__(self, **kw: int) -> None:
        for key, value in kw.items():
            setattr(self, key, value)

    @property
    def mcu_rows(self) -> int:
        return -(-self.height // self.mcu_height)

    @property
    def mcus_per_row(self) -> int:
        return -(-self.width // (8 * self.hmax))


def parse_header(data) -> Frame | None:
    """The frame of a single-scan sequential Huffman JPEG, or None for anything else
    (progressive, arithmetic, lossless, hierarchical, a damaged header)."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    pos, sof, restart = 2, None, 0
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _NO_LENGTH:
            return None
        length = (data[pos + 2] << 8) | data[pos + 3]
        if length < 2 or pos + 2 + length > n:
            return None
        body = pos + 4
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if marker not in _SOFS or sof is not None or length < 8:
                return None
            height, width = struct.unpack_from(">HH", data, body + 1)
            ncomp = data[body + 5]
            if length != 8 + 3 * ncomp or ncomp == 0 or height == 0 or width == 0:
                return None
            factors = [data[body + 7 + 3 * c] for c in range(ncomp)]
            hmax, vmax = max(f >> 4 for f in factors), max(f & 15 for f in factors)
            if ncomp == 1:  # one component: its MCU is one block whatever its factors say
                hmax = vmax = 1
            sof = (body + 1, height, width, ncomp, hmax, vmax)
        elif marker == 0xDD:
            if length != 4:
                return None
            restart = (data[body] << 8) | data[body + 1]
        elif marker == 0xDA:
            if sof is None or data[body] != sof[3]:  # a scan of every component (interleaved)
                return None
            sof_height, height, width, _, hmax, vmax = sof
            scan_end = len(data) - 2 if data[-2:] == b"\xff\xd9" else -1
            return Frame(sof_height=sof_height, sos=pos, scan_start=pos + 2 + length,
                         scan_end=scan_end, height=height, width=width, hmax=hmax,
                         mcu_height=8 * vmax, restart=restart)
        pos += 2 + length
    return None


def row_starts(data) -> np.ndarray | None:
    """Where each MCU row of a JPEG with a restart marker before every row starts, as uint32
    offsets: the first row's entropy data, then each RSTn marker, then the EOI marker (rows + 1
    entries). None for a JPEG without such markers (or not a single-scan baseline JPEG)."""
    frame = parse_header(data)
    if frame is None or frame.restart != frame.mcus_per_row:
        return None
    rows = frame.mcu_rows
    if rows < 2:
        return None
    if len(data) >= 1 << 32:
        return None
    scan = np.frombuffer(data, np.uint8)[frame.scan_start:]
    ff = np.flatnonzero(scan[:-1] == 0xFF)  # entropy data escapes its 0xFF bytes as FF 00
    after = scan[ff + 1]
    eoi = ff[after == 0xD9]
    if not len(eoi):
        return None
    rst = ff[((after & 0xF8) == 0xD0) & (ff < eoi[0])]
    if (len(rst) != rows - 1 or not np.array_equal(scan[rst + 1], 0xD0 + np.arange(rows - 1) % 8)):
        return None
    out = np.empty(rows + 1, dtype="<u4")
    out[0] = frame.scan_start
    out[1:rows] = rst + frame.scan_start
    out[rows] = eoi[0] + frame.scan_start
    return out


def row_index(starts: list[np.ndarray | None]) -> dict[str, np.ndarray]:
    """The ``ROW_ARRAYS`` columns for records' ``row_starts`` (None: a record without)."""
    offsets = np.zeros(len(starts) + 1, dtype="<i8")
    np.cumsum([0 if s is None else len(s) for s in starts], out=offsets[1:])
    kept = [s for s in starts if s is not None]
    flat = np.concatenate(kept).astype("<u4") if kept else np.zeros(0, "<u4")
    return {"row_offsets": offsets, "row_starts": flat}
