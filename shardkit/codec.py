"""Record encoding: RGB pixels to stored bytes and back, plus decode-time cropping.

``jpeg`` records are baseline JPEGs encoded and decoded with libjpeg-turbo through simplejpeg
(which bundles the library, so ``pip`` alone installs it). ``raw`` records are the HxWx3 uint8
pixels themselves, for decode-free loading at the price of about 10x the disk space.
"""

from __future__ import annotations

from typing import Literal, get_args

import threading

import numpy as np
import simplejpeg

from .jpegrows import encode_rows

ENCODINGS: tuple[str, ...] = ("jpeg", "raw")
CropMode = Literal["center", "random", "random_resized"]
CROP_MODES: tuple[str, ...] = get_args(CropMode)


class RecordDecodeError(ValueError):
    """Stored bytes do not decode to the image the index describes."""


def encode(pixels: np.ndarray, encoding: str, quality: int = 90,
           row_markers: bool = True) -> bytes:
    """Encode HxWx3 uint8 RGB pixels as a record.

    A ``jpeg`` record has a restart marker before every MCU row (``row_markers``), so a reader
    can decode only the rows a crop needs (:mod:`shardkit.jpegrows`); the pixels are the same
    either way."""
    if encoding == "jpeg":
        if row_markers:
            return encode_rows(pixels, quality)
        return simplejpeg.encode_jpeg(pixels, quality=quality, colorspace="RGB",
                                      colorsubsampling="420")
    if encoding == "raw":
        return pixels.tobytes()
    raise ValueError(f"unknown encoding {encoding!r}; expected one of {ENCODINGS}")


def decode(data, encoding: str, height: int, width: int, fast: bool = False,
           buffer: np.ndarray | None = None, scale: int = 1, bgr: bool = False) -> np.ndarray:
    """Decode one record to HxWx3 uint8 RGB; checks the size against the index.

    ``raw`` records come back as a read-only view of ``data``; ``jpeg`` records are decoded into
    ``buffer`` (any writable uint8 array of at least HxWx3 bytes) when given, else new memory,
    DCT-scaled by ``1/scale`` (2, 4 or 8: libjpeg-turbo rounds each side up), with the channels
    in BGR order if ``bgr`` (the same values as RGB: libjpeg-turbo only stores them swapped).
    """
    if encoding == "raw":
        if bgr:
            raise ValueError("raw records are stored RGB: bgr needs a jpeg record")
        if len(data) != height * width * 3:
            raise RecordDecodeError(
                f"raw record has {len(data)} bytes, expected {height}x{width}x3")
        return np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3)
    expected = (-(-height // scale), -(-width // scale))
    try:
        img = simplejpeg.decode_jpeg(data, colorspace="BGR" if bgr else "RGB", fastdct=fast,
                                     fastupsample=fast, buffer=buffer,
                                     min_height=expected[0] if scale > 1 else 0,
                                     min_width=expected[1] if scale > 1 else 0)
    except ValueError as exc:
        raise RecordDecodeError(f"JPEG record does not decode: {exc}") from None
    if img.shape[:2] != expected:
        shown = f"{width}x{height}" + (f" (1/{scale}: {expected[1]}x{expected[0]})"
                                       if scale > 1 else "")
        raise RecordDecodeError(
            f"JPEG record is {img.shape[1]}x{img.shape[0]}, index says {shown}")
    return img


_scratch = threading.local()


def scratch(nbytes: int, slot: str = "decode") -> np.ndarray:
    """This thread's reusable buffer named ``slot`` (each user names its own: ``"decode"`` for
    decoded images), at least ``nbytes`` long.

    Decoding into the same memory every time saves an allocation and its page faults per image.
    """
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        buffers = _scratch.buffers = {}
    buf = buffers.get(slot)
    if buf is None or buf.nbytes < nbytes:
        buf = buffers[slot] = np.empty(max(nbytes, 1 << 20), dtype=np.uint8)
    return buf


def decode_crop_into(out: np.ndarray, data, encoding: str, height: int, width: int,
                     origin: tuple[int, int] | None = None, fast: bool = False) -> None:
    """Decode one record and copy its square crop into ``out`` (N x N x 3; centre crop unless
    ``origin`` is given). The full image goes through this thread's scratch buffer."""
    buffer = scratch(height * width * 3) if encoding == "jpeg" else None
    img = decode(data, encoding, height, width, fast, buffer)
    crop_into(out, img, *(origin or center_origin(height, width, out.shape[0])))


def center_origin(height: int, width: int, crop: int) -> tuple[int, int]:
    """Source (top, left) of a centre crop, as torchvision's ``CenterCrop`` computes it.

    Negative values mean zero padding on that side (torchvision pads smaller images with zeros).
    """
    def axis(n: int) -> int:
        return int(round((n - crop) / 2.0)) if n >= crop else -((crop - n) // 2)
    return axis(height), axis(width)


def random_origin(height: int, width: int, crop: int, rng: np.random.Generator) -> tuple[int, int]:
    """Source (top, left) of a uniformly random crop; a too-small side is padded as when centred.

    Draws as torchvision's ``RandomCrop``: nothing for a side that equals the crop.
    """
    def axis(n: int) -> int:
        if n == crop:
            return 0
        return int(rng.integers(0, n - crop + 1)) if n > crop else -((crop - n) // 2)
    return axis(height), axis(width)


def crop_into(out: np.ndarray, img: np.ndarray, top: int, left: int) -> None:
    """Copy the crop of ``img`` whose top-left source corner is (top, left) into ``out``.

    ``out`` has the crop's shape; parts outside ``img`` become zeros.
    """
    ch, cw = out.shape[:2]
    h, w = img.shape[:2]
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + ch, h), min(left + cw, w)
    if y1 - y0 < ch or x1 - x0 < cw:
        out[...] = 0
    out[y0 - top:y1 - top, x0 - left:x1 - left] = img[y0:y1, x0:x1]
