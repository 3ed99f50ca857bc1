"""Turn one source image file into the RGB pixels shardkit stores (the pack-side work).

Rules, applied in this order:
1. The format is detected from the content, never the extension.
2. Images declaring more than ``max_pixels`` pixels are refused before any pixel is decoded.
   Pillow's own decompression-bomb check also applies, as in any program: more than
   ``2 * PIL.Image.MAX_IMAGE_PIXELS`` pixels in the image or in a sub-image (an ICO or ICNS icon,
   a GIF frame) is refused before decoding. shardkit never changes Pillow's settings, so
   ``max_pixels`` can lower that bound but not raise it.
3. A file is accepted exactly when ImageFolder's loader (``Image.open(f).convert("RGB")`` with
   Pillow's defaults) would accept it. JPEGs in YCbCr or grey (nearly all) are decoded by
   libjpeg-turbo through simplejpeg, at the smallest DCT scale that still leaves the shorter side
   at least twice the target, so a 12000x12000 photo costs about as much as a 1500x1500 one.
   Other JPEGs (CMYK) and other formats are decoded by Pillow (JPEGs with ``draft`` to the same
   rule), and so is any JPEG on which libjpeg-turbo reports even a recoverable warning: Pillow
   then accepts or refuses it as ``ImageFolder`` would (extraneous bytes pass, a truncated file
   is refused).
4. EXIF orientation is applied, read only after the pixels decoded without error.
5. Colour: every mode becomes 8-bit RGB. Alpha is composited onto a white background: an alpha
   channel (RGBA, LA, PA), a palette's transparency, and the transparency key (PNG ``tRNS``) of
   1-bit, grey, 16-bit grey and RGB images, whose keyed pixels become white. 16/32-bit grey
   (I;16, I) is scaled from 0..65535 to 0..255; float grey (F) is clipped to 0..255. CMYK,
   YCbCr, LAB, HSV, 1, L and P use Pillow's conversion.
6. The shorter side is resized to ``size`` with an anti-aliased bicubic filter
   (:mod:`shardkit.packing.resize`; torchvision's ``Resize`` size rule, applied to the file's own
   oriented size, not to a DCT-scaled decode's rounded-up sides); smaller images are never
   upscaled. ``size=0`` keeps the original size.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Callable

import numpy as np
import simplejpeg

from .resize import resize_rgb, target_size

if TYPE_CHECKING:
    from .buckets import BucketSpec, Placement

try:
    from PIL import Image
except ImportError as exc:  # Pillow is an extra so that an installed pillow-simd is never replaced
    raise ImportError("shardkit needs a Pillow-API library: pip install Pillow, "
                      "or install pillow-simd (see README)") from exc

PILLOW_PIXEL_LIMIT = 2 * 89_478_485  # Pillow's default DecompressionBombError threshold
WHITE = (255, 255, 255)


class ImageRejected(Exception):
    """The file cannot be used; the message is the reason recorded in the store's metadata."""


def to_rgb(im: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB by rule 5 (transparency keys aside: see _keyed)."""
    mode = im.mode
    if mode == "RGB":
        return im
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
        mode = im.mode
    if mode.startswith("I;16") or mode == "I":
        arr = np.asarray(im, dtype=np.float64 if mode == "I" else np.uint16).astype(np.float64)
        arr = np.clip(np.rint(arr / 257.0), 0, 255).astype(np.uint8)
        return Image.fromarray(arr, "L").convert("RGB")
    if mode == "F":
        arr = np.clip(np.rint(np.asarray(im, dtype=np.float64)), 0, 255).astype(np.uint8)
        return Image.fromarray(arr, "L").convert("RGB")
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return im.convert("RGB")


def _keyed(im: Image.Image, data: bytes) -> np.ndarray | None:
    """HxW mask of the pixels a transparency key makes transparent (1, L, I, I;16, RGB images)."""
    key = im.info.get("transparency")
    if im.mode == "RGB":
        if not (isinstance(key, tuple) and len(key) == 3):
            return None
    elif im.mode not in ("1", "L", "I", "I;16") or not isinstance(key, int):
        return None
    if im.format == "PNG":  # tRNS holds samples at the file's bit depth; Pillow rescales pixels
        bits = data[24]  # IHDR, always the first chunk
        if im.mode == "L" and bits < 8:
            key = key * 255 // ((1 << bits) - 1)
        elif im.mode == "RGB" and bits == 16:  # Pillow keeps the high byte
            key = tuple(v >> 8 for v in key)
    keyed = np.asarray(im.convert("L") if im.mode == "1" else im) == key  # "1" key: 0 or 255
    return keyed.all(axis=2) if keyed.ndim == 3 else keyed


# EXIF orientation -> numpy view, as ImageOps.exif_transpose maps it (2: FLIP_LEFT_RIGHT,
# 3: ROTATE_180, 4: FLIP_TOP_BOTTOM, 5: TRANSPOSE, 6: ROTATE_270, 7: TRANSVERSE, 8: ROTATE_90).
_ORIENT = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: a.transpose(1, 0, 2)[:, ::-1],
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: a.transpose(1, 0, 2)[::-1],
}


def exif_orientation(im: Image.Image) -> int:
    """The EXIF orientation tag (1-8); 1 when absent, unreadable or absurd (pixels are still good)."""
    try:
        value = im.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - EXIF is untrusted metadata
        return 1
    return value if isinstance(value, int) and value in _ORIENT else 1


def _decode_jpeg(data: bytes, width: int, height: int, size: int) -> np.ndarray:
    """libjpeg-turbo decode to RGB, DCT-scaled down to no less than twice ``size`` (rule 3)."""
    min_w = min_h = 0
    if size > 0 and min(width, height) > 2 * size:
        if width <= height:
            min_w = 2 * size
        else:
            min_h = 2 * size
    return simplejpeg.decode_jpeg(data, "RGB", min_width=min_w, min_height=min_h)


def _decode_pillow(im: Image.Image, data: bytes, size: int) -> np.ndarray:
    if im.format == "JPEG" and size > 0:
        im.draft("RGB", (2 * size, 2 * size))
    im.load()  # the first load must decide: after a failed one, Pillow keeps the partial pixels
    pixels = np.asarray(to_rgb(im), dtype=np.uint8)
    keyed = _keyed(im, data)
    if keyed is not None and keyed.any():
        pixels = pixels.copy()
        pixels[keyed] = 255
    return pixels


def _bomb_reason(exc: Exception, max_pixels: int) -> str:
    """Why Pillow's decompression-bomb check refused an image or one of its sub-images."""
    found = re.search(r"\((\d+) pixels\)", str(exc))
    if found is None:
        return f"over Pillow's pixel limit: {exc}"
    pixels = int(found.group(1))
    if max_pixels and pixels > max_pixels:
        return f"{pixels} pixels exceeds --max-pixels {max_pixels}"
    return (f"{pixels} pixels exceeds Pillow's limit (2 * PIL.Image.MAX_IMAGE_PIXELS), which "
            f"--max-pixels {max_pixels} cannot raise")


def decode_rgb(data: bytes, size: int = 0, max_pixels: int = PILLOW_PIXEL_LIMIT) -> np.ndarray:
    """Rules 1-5 for one encoded image: HxWx3 uint8 RGB, oriented, not yet resized.

    JPEGs come out at the DCT scale chosen for ``size`` (rule 3), so the shape tells which scale
    the decoder used. Raises :class:`ImageRejected` with the reason for an unusable file.
    """
    return decode_sized(data, size, max_pixels)[0]


_quiet_lock = threading.Lock()
_quiet_inside = 0  # threads inside quiet_warnings()
_quiet_saved: warnings.catch_warnings | None = None  # the filters to put back


@contextlib.contextmanager
def quiet_warnings() -> Iterator[None]:
    """Warnings ignored while the block decodes an image: Pillow's (DecompressionBombWarning
    and the like) decide nothing here (``max_pixels`` does, and a file is kept exactly when
    ImageFolder's loader would keep it), and under ``python -W error`` they would reject it.

    Python's warning filters are one list for the whole process, and two threads' interleaved
    ``warnings.catch_warnings()`` blocks can leave "ignore" installed for good (the second to
    enter saves the first's "ignore" and restores it last): a Dask worker runs several packing
    threads. So the first of shardkit's threads to enter installs "ignore" and the last to
    leave puts the filters back as they were. While it lasts it applies to the process's other
    threads too, as any ``catch_warnings`` does before Python 3.14 (on a worker whose threads
    decode without pause that can be most of the pack; a filter another thread adds meanwhile
    is gone when they are put back). Where warnings are context-aware (Python 3.14's
    ``-X context_aware_warnings``, the default without the GIL) each thread's filters are its
    own, and ``catch_warnings`` is used as it is."""
    global _quiet_inside, _quiet_saved
    if getattr(sys.flags, "context_aware_warnings", False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
        return
    with _quiet_lock:
        if not _quiet_inside:
            _quiet_saved = warnings.catch_warnings()
            _quiet_saved.__enter__()
            warnings.simplefilter("ignore")
        _quiet_inside += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_inside -= 1
            if not _quiet_inside:
                saved, _quiet_saved = _quiet_saved, None
                saved.__exit__(None, None, None)


def decode_sized(data: bytes, size: int = 0, max_pixels: int = PILLOW_PIXEL_LIMIT,
                 size_for: Callable[[int, int], int] | None = None
                 ) -> tuple[np.ndarray, tuple[int, int]]:
    """:func:`decode_rgb`'s pixels and the file's own (width, height) after EXIF orientation.

    The resize target comes from that size, never from the DCT-scaled decode: libjpeg rounds a
    scaled side up (a 671x625 photo at 3/8 is 252x235), and the rule applied to the rounded
    sides can differ by a pixel from the rule applied to the file's. ``size_for(width,
    height)``, given the header's size, replaces ``size`` (a bucketed pack's target depends on
    it).
    """
    if not data:
        raise ImageRejected("empty file (0 bytes)")
    with quiet_warnings():  # e.g. DecompressionBombWarning: max_pixels decides
        try:
            im = Image.open(io.BytesIO(data))  # reads the header only (ICO: decodes its icon)
        except Image.UnidentifiedImageError:
            raise ImageRejected("not a recognised image format") from None
        except Image.DecompressionBombError as exc:
            raise ImageRejected(_bomb_reason(exc, max_pixels)) from None
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - any parser failure means the file is unusable
            raise ImageRejected(f"cannot parse image header: {exc}") from None
        width, height = im.size
        if width <= 0 or height <= 0:
            raise ImageRejected(f"invalid dimensions {width}x{height}")
        if max_pixels and width * height > max_pixels:
            raise ImageRejected(
                f"{width}x{height} = {width * height} pixels exceeds --max-pixels {max_pixels}")
        if size_for is not None:
            size = size_for(width, height)
        try:
            pixels = None
            if im.format == "JPEG" and im.mode in ("RGB", "L"):
                try:
                    pixels = _decode_jpeg(data, width, height, size)
                except ValueError:  # any libjpeg warning: Pillow decides, as ImageFolder would
                    pass
            if pixels is None:
                pixels = _decode_pillow(im, data, size)
            # Only now: reading EXIF loads a PNG, and a failed load must refuse the file (rule 4).
            orientation = exif_orientation(im)
        except Image.DecompressionBombError as exc:  # a sub-image over Pillow's limit
            raise ImageRejected(_bomb_reason(exc, max_pixels)) from None
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - truncated/corrupt data surfaces as many types
            reason = str(exc) or type(exc).__name__
            raise ImageRejected(f"cannot decode image: {reason}") from None
    oriented = (height, width) if orientation in (5, 6, 7, 8) else (width, height)
    return (_ORIENT[orientation](pixels) if orientation != 1 else pixels), oriented


def load_rgb(data: bytes, size: int, max_pixels: int = PILLOW_PIXEL_LIMIT) -> np.ndarray:
    """Decode, orient, convert and resize one encoded image; returns HxWx3 uint8 (C-contiguous)."""
    pixels, (width, height) = decode_sized(data, size, max_pixels)
    # The size rule on the file's own (oriented) size; the decode may be DCT-scaled (rule 3).
    new_w, new_h = target_size(width, height, size)
    if (new_w, new_h) == (pixels.shape[1], pixels.shape[0]):
        return np.ascontiguousarray(pixels)
    try:
        return resize_rgb(pixels, new_w, new_h)
    except RuntimeError as exc:  # torch's allocator failing on a huge image
        raise ImageRejected(f"cannot resize image: {exc}") from None


def load_bucketed(data: bytes, spec: BucketSpec, max_pixels: int = PILLOW_PIXEL_LIMIT
                  ) -> tuple[np.ndarray, Placement]:
    """Rules 1-5, then a bucketed pack's rule 6 (:mod:`.buckets`): resized to cover the bucket
    nearest the oriented image's aspect ratio and centre-cropped to it (or, too small and not
    upscaled, cropped to its own size in steps). Returns the pixels (C-contiguous) and where
    the source landed."""
    from .buckets import TooSmall

    pixels, (width, height) = decode_sized(data, 0, max_pixels, spec.decode_size)
    try:
        place = spec.place(height, width)
    except TooSmall as exc:
        raise ImageRejected(str(exc)) from None
    rh, rw = place.resized
    if pixels.shape[:2] != (rh, rw):
        try:
            pixels = resize_rgb(pixels, rw, rh)
        except RuntimeError as exc:  # torch's allocator failing on a huge image
            raise ImageRejected(f"cannot resize image: {exc}") from None
    (bh, bw), top, left = place.size, place.top, place.left
    return np.ascontiguousarray(pixels[top:top + bh, left:left + bw]), place
