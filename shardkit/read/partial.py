"""Decode only the pixel rows a crop needs, from a JPEG record with row markers.

A record packed with a restart marker before every MCU row (:mod:`shardkit.jpegrows`) decodes
any run of its MCU rows as a JPEG of its own: the original header with the frame height (SOF)
cut to the rows kept and the restart interval (DRI) kept, then those rows' entropy data with
their markers renumbered from RST0, then EOI. libjpeg-turbo (simplejpeg, with the same options
as a full decode) decodes it to exactly the pixels of the same rows of a full decode, except
where chroma upsampling reads across the cut: fancy upsampling (``fast=False``) of vertically
subsampled chroma (4:2:0) computes a pixel row from the chroma row above or below it, so a crop
that starts or ends on an MCU row's edge also decodes the MCU row beyond it (its context).
``fast=True`` (libjpeg-turbo's merged upsampling) reads nothing across rows and needs none.
A window that leaves out at most one MCU row (a centre crop's, usually) is decoded whole
(:func:`whole`): the cut would cost what it saves.

:func:`decode_rows` returns the decoded window and where it starts; every row of ``[top,
bottom)`` in it is identical to the full decode's (``tests/read/test_partial.py`` checks every
window of many images, both decode modes).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import simplejpeg

from .. import codec
from ..codec import RecordDecodeError
from ..jpegrows import RST_MARKERS, parse_header


class Header(NamedTuple):
    """What partial decodes of one header need: where the SOF height is, the image's size, its
    MCU height, and whether fancy upsampling reads across MCU rows (vertically subsampled
    chroma)."""

    sof_height: int
    height: int
    width: int
    mcu_height: int
    vertical_context: bool


_HEADERS: dict[bytes, Header] = {}
MAX_HEADERS = 256  # distinct headers cached per process (one per image size and quality)


def header(data, scan_start: int) -> Header:
    """``data``'s header (the bytes before its entropy data), parsed once per distinct one."""
    key = bytes(data[:scan_start])
    found = _HEADERS.get(key)
    if found is not None:
        return found
    frame = parse_header(key + b"\xff\xd9")
    if frame is None or frame.scan_start != scan_start or frame.restart != frame.mcus_per_row:
        raise RecordDecodeError("JPEG record does not decode: it does not match its row index")
    context = frame.mcu_height > 8  # some component has fewer rows than the MCU: upsampled
    found = Header(frame.sof_height, frame.height, frame.width, frame.mcu_height, context)
    if len(_HEADERS) >= MAX_HEADERS:
        _HEADERS.clear()
    _HEADERS[key] = found
    return found


def window(top: int, bottom: int, height: int, mcu_height: int,
           context: bool) -> tuple[int, int]:
    """The MCU rows ``[m0, m1)`` to decode for exact pixel rows ``[top, bottom)``: those the rows
    lie in and, with ``context``, the MCU row on either side where a row lies on its edge (fancy
    upsampling reads the chroma row just beyond it)."""
    if context:
        top, bottom = top - 1, bottom + 1
    top, bottom = max(top, 0), min(bottom, height)
    return top // mcu_height, -(-bottom // mcu_height)


#: A window that leaves out at most this many MCU rows is decoded whole: cutting the record
#: costs about what one MCU row's decode saves (docs/reading.md, *Partial decode*).
WHOLE_BELOW = 1


def whole(top: int, bottom: int, height: int, starts: np.ndarray, fast: bool = False) -> bool:
    """Whether pixel rows ``[top, bottom)`` of a ``height``-row record with row index ``starts``
    are decoded whole: their window (:func:`window`) leaves out at most ``WHOLE_BELOW`` MCU rows.
    The MCU height is the one (8 or 16) the index's row count gives, so no header is read."""
    rows = len(starts) - 1
    mh = 16 if -(-height // 16) == rows and -(-height // 8) != rows else 8
    m0, m1 = window(top, bottom, height, mh, mh > 8 and not fast)
    return rows - (m1 - m0) <= WHOLE_BELOW


def decode_rows(data, starts: np.ndarray, top: int, bottom: int, fast: bool = False,
                buffer: np.ndarray | None = None, bgr: bool = False,
                size: tuple[int, int] | None = None) -> tuple[np.ndarray, int]:
    """Decode the MCU rows of a JPEG record that pixel rows ``[top, bottom)`` need.

    ``starts`` is the record's row index (:func:`shardkit.jpegrows.row_starts`). Returns
    ``(pixels, y0)``: the decoded rows, from image row ``y0`` on, full width, RGB (BGR if
    ``bgr``); ``pixels[top - y0:bottom - y0]`` are exactly those rows of a full decode with the
    same ``fast``. ``buffer`` as in :func:`shardkit.codec.decode`; ``size``: the (height, width)
    the index gives the record, checked against its header.
    """
    scan = int(starts[0])
    head = header(data, scan)
    if size is not None and size != (head.height, head.width):
        raise RecordDecodeError(f"JPEG record is {head.width}x{head.height}, index says "
                                f"{size[1]}x{size[0]}")
    mh, rows = head.mcu_height, len(starts) - 1
    if rows != -(-head.height // mh):
        raise RecordDecodeError("JPEG record does not decode: it does not match its row index")
    m0, m1 = window(top, bottom, head.height, mh, head.vertical_context and not fast)
    if m1 <= m0:
        raise ValueError(f"no rows in [{top}, {bottom}) of a {head.height}-row image")
    kept = min(m1 * mh, head.height) - m0 * mh
    colorspace = "BGR" if bgr else "RGB"
    if m0 == 0 and m1 == rows:
        jpeg = data
    else:
        jpeg = cut(data, starts, scan, head, m0, m1, kept)
    try:
        img = simplejpeg.decode_jpeg(jpeg, colorspace=colorspace, fastdct=fast,
                                     fastupsample=fast, buffer=buffer)
    except ValueError as exc:
        raise RecordDecodeError(f"JPEG record does not decode: {exc}") from None
    if img.shape[:2] != (kept, head.width):
        raise RecordDecodeError(f"JPEG rows decode to {img.shape[1]}x{img.shape[0]}, expected "
                                f"{head.width}x{kept}")
    return img, m0 * mh


def cut(data, starts: np.ndarray, scan: int, head: Header, m0: int, m1: int,
        kept: int) -> bytes:
    """The JPEG of MCU rows ``[m0, m1)``: header (SOF height ``kept``), the rows' entropy data
    with their restart markers renumbered from RST0, EOI."""
    at = starts[m0:m1 + 1].tolist()  # row m0's start, the markers between the rows, the end
    view = memoryview(data)
    if not (scan <= at[0] and at[-1] <= len(data) and all(a < b for a, b in zip(at, at[1:]))):
        raise RecordDecodeError("JPEG record does not decode: it does not match its row index")
    sof = head.sof_height
    pieces = [view[:sof], struct.pack(">H", kept), view[sof + 2:scan]]
    begin = at[0] + (2 if m0 else 0)  # after row m0's RST marker
    for j, marker in enumerate(at[1:-1]):
        if view[marker] != 0xFF or view[marker + 1] != 0xD0 + (m0 + j) % 8:
            raise RecordDecodeError("JPEG record does not decode: it does not match its row index")
        pieces += (view[begin:marker], RST_MARKERS[j % 8])
        begin = marker + 2
    pieces += (view[begin:at[-1]], b"\xff\xd9")
    return b"".join(pieces)


def record_rows(shard, local: int) -> np.ndarray | None:
    """Record ``local``'s row starts in an open shard's index (``OpenShard.row_offsets`` /
    ``row_starts``), or None: a store packed before row markers, or a record without them."""
    offsets = shard.row_offsets
    if offsets is None:
        return None
    a, b = int(offsets[local]), int(offsets[local + 1])
    return shard.row_starts[a:b] if b > a else None


def box_rows(boxes, height: int) -> tuple[int, int]:
    """The image rows ``[top, bottom)`` that boxes ``(top, left, height, width, ...)`` cover
    (their union's rows, inside the image; boxes may reach outside it: zero padding)."""
    top = max(min(b[0] for b in boxes), 0)
    bottom = min(max(b[0] + b[2] for b in boxes), height)
    return top, max(bottom, top + 1)


def crop_into(out: np.ndarray, data, starts: np.ndarray, height: int, width: int,
              origin: tuple[int, int] | None = None, fast: bool = False) -> None:
    """``codec.decode_crop_into`` decoding only the rows the crop covers: ``out`` (N x N x 3)
    gets the crop whose top-left source corner is ``origin`` (centre crop if None), zeros
    outside the image; ``height`` x ``width``: the record's size in the index."""
    top, left = origin or codec.center_origin(height, width, out.shape[0])
    first, last = box_rows(((top, left, out.shape[0], out.shape[1]),), height)
    if whole(first, last, height, starts, fast):
        codec.decode_crop_into(out, data, "jpeg", height, width, (top, left), fast)
        return
    img, y0 = decode_rows(data, starts, first, last, fast, codec.scratch(height * width * 3),
                          size=(height, width))
    codec.crop_into(out, img, top - y0, left)
