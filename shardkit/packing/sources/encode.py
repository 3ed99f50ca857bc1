"""One container sample through the folder pipeline: read its bytes, then exactly what a
folder's file goes through (:func:`shardkit.packing.encoding.encode_data`).

With ``size=0`` and ``encoding='jpeg'`` (and no buckets) a source JPEG that decodes cleanly is
kept byte for byte: baseline or progressive YCbCr/grey, decoded by libjpeg-turbo without a
warning, no EXIF rotation, within ``max_pixels``. Its pixels are then the ones the pipeline
would have encoded, without a second lossy step.
"""

from __future__ import annotations

import io
import re

import numpy as np
import simplejpeg

from ...codec import encode
from ..imaging import exif_orientation, quiet_warnings
from ..resize import resize_rgb, target_size
from ..settings import PackSettings
from ..encoding import Encoded, encode_data
from . import MemberError, read_item
from .base import Item


def clean_jpeg(data: bytes, max_pixels: int) -> tuple[int, int] | None:
    """(height, width) of a JPEG the store can keep as it is, else None."""
    if not data.startswith(b"\xff\xd8"):
        return None
    from PIL import Image

    with quiet_warnings():
        try:
            im = Image.open(io.BytesIO(data))
            if im.format != "JPEG" or im.mode not in ("RGB", "L"):
                return None
            width, height = im.size
            if max_pixels and width * height > max_pixels:
                return None
            if exif_orientation(im) != 1:
                return None
        except Exception:  # noqa: BLE001 - the pipeline then decides, with its reason
            return None
    try:
        pixels = simplejpeg.decode_jpeg(data, "RGB")
    except ValueError:  # any libjpeg warning
        return None
    if pixels.shape[:2] != (height, width):
        return None
    return height, width


_PPM = re.compile(rb"P6\n([0-9]+) ([0-9]+)\n255\n")


def raw_rgb(data: bytes) -> np.ndarray | None:
    """The pixels of a binary PPM in the one form decoded video frames take (``P6``, one space,
    maxval 255, no comment), without a decoder; None for any other file."""
    m = _PPM.match(data)
    if m is None:
        return None
    width, height = int(m[1]), int(m[2])
    if len(data) - m.end() != width * height * 3:
        return None
    return np.frombuffer(data, np.uint8, offset=m.end()).reshape(height, width, 3)


def encode_pixels(pixels: np.ndarray, settings: PackSettings) -> Encoded | None:
    """RGB pixels resized and encoded as :func:`encode_data` would have them from their PPM
    (the same size rule and kernel); None where that pipeline must decide (buckets, over
    ``max_pixels``)."""
    height, width = pixels.shape[:2]
    if settings.buckets is not None or (settings.max_pixels and
                                        width * height > settings.max_pixels):
        return None
    new_w, new_h = target_size(width, height, settings.size)
    try:
        out = resize_rgb(pixels, new_w, new_h) if (new_w, new_h) != (width, height) else \
            np.ascontiguousarray(pixels)
    except RuntimeError:  # torch's allocator failing: the pipeline gives the reason
        return None
    return Encoded(encode(out, settings.encoding, settings.quality), new_h, new_w, None)


def encode_item(item: Item, settings: PackSettings) -> Encoded:
    # No image within max_pixels needs more than 8 bytes a pixel (the folder pipeline's bound).
    limit = settings.max_pixels * 8 + (64 << 20) if settings.max_pixels else None
    try:
        data = read_item(item, limit)
    except MemberError as exc:
        return Encoded.rejected(str(exc))
    except MemoryError:
        return Encoded.rejected("out of memory while reading the member")
    if settings.size == 0 and settings.encoding == "jpeg" and settings.buckets is None:
        kept = clean_jpeg(data, settings.max_pixels)
        if kept is not None:
            return Encoded(data, kept[0], kept[1], None)
    pixels = raw_rgb(data)
    done = encode_pixels(pixels, settings) if pixels is not None else None
    return done if done is not None else encode_data(data, settings)
