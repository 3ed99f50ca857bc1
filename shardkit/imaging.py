"""Turn one source image file into the RGB pixels shardkit stores (the pack-side work).

Rules, applied in this order:
1. The format is detected from the content, never the extension.
2. Images declaring more than ``max_pixels`` pixels are refused before any pixel is decoded.
3. JPEGs in YCbCr or grey (nearly all) are decoded by libjpeg-turbo through simplejpeg, at the
   smallest DCT scale that still leaves the shorter side at least twice the target, so a
   12000x12000 photo costs about as much as a 1500x1500 one. Other JPEGs (CMYK) and other formats
   are decoded by Pillow (JPEGs with ``draft`` to the same rule), and so is any JPEG on which
   libjpeg-turbo reports even a recoverable warning: Pillow then accepts or refuses it exactly as
   ``ImageFolder`` would (extraneous bytes pass, a truncated file is refused).
4. EXIF orientation is applied.
5. Colour: every mode becomes 8-bit RGB. Alpha (RGBA, LA, PA, palette transparency) is composited
   onto a white background. 16/32-bit grey (I;16, I) is scaled from 0..65535 to 0..255; float grey
   (F) is clipped to 0..255. CMYK, YCbCr, LAB, HSV, 1, L and P use Pillow's conversion.
6. The shorter side is resized to ``size`` with an anti-aliased bicubic filter
   (:mod:`shardkit.resize`; torchvision's ``Resize`` size rule); smaller images are never
   upscaled. ``size=0`` keeps the original size.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import simplejpeg

from .resize import resize_rgb, target_size

try:
    from PIL import Image
except ImportError as exc:  # Pillow is an extra so that an installed pillow-simd is never replaced
    raise ImportError("shardkit needs a Pillow-API library: pip install 'shardkit[pillow]', "
                      "or install pillow-simd (see README)") from exc

# We enforce our own pixel limit before decoding (rule 2).
Image.MAX_IMAGE_PIXELS = None

PILLOW_PIXEL_LIMIT = 2 * 89_478_485  # Pillow's DecompressionBombError threshold
WHITE = (255, 255, 255)


class ImageRejected(Exception):
    """The file cannot be used; the message is the reason recorded in the store's metadata."""


def to_rgb(im: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB by the rules in this module's docstring."""
    mode = im.mode
    if mode == "RGB":
        return im
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
        mode = im.mode
    elif mode == "L" and "transparency" in im.info:
        im = im.convert("LA")
        mode = "LA"
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


def _decode_pillow(im: Image.Image, size: int) -> np.ndarray:
    if im.format == "JPEG" and size > 0:
        im.draft("RGB", (2 * size, 2 * size))
    im.load()
    return np.asarray(to_rgb(im), dtype=np.uint8)


def load_rgb(data: bytes, size: int, max_pixels: int = PILLOW_PIXEL_LIMIT) -> np.ndarray:
    """Decode, orient, convert and resize one encoded image; returns HxWx3 uint8 (C-contiguous)."""
    if not data:
        raise ImageRejected("empty file (0 bytes)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            im = Image.open(io.BytesIO(data))  # reads the header only
        except Image.UnidentifiedImageError:
            raise ImageRejected("not a recognised image format") from None
        except Exception as exc:  # noqa: BLE001 - any parser failure means the file is unusable
            raise ImageRejected(f"cannot parse image header: {exc}") from None
        width, height = im.size
        if width <= 0 or height <= 0:
            raise ImageRejected(f"invalid dimensions {width}x{height}")
        if max_pixels and width * height > max_pixels:
            raise ImageRejected(
                f"{width}x{height} = {width * height} pixels exceeds --max-pixels {max_pixels}")
        try:
            orientation = exif_orientation(im)
            pixels = None
            if im.format == "JPEG" and im.mode in ("RGB", "L"):
                try:
                    pixels = _decode_jpeg(data, width, height, size)
                except ValueError:  # any libjpeg warning: Pillow decides, as ImageFolder would
                    pass
            if pixels is None:
                pixels = _decode_pillow(im, size)
            if orientation != 1:
                pixels = _ORIENT[orientation](pixels)
            new_w, new_h = target_size(pixels.shape[1], pixels.shape[0], size)
            if (new_w, new_h) != (pixels.shape[1], pixels.shape[0]):
                return resize_rgb(pixels, new_w, new_h)
        except ImageRejected:
            raise
        except Exception as exc:  # noqa: BLE001 - truncated/corrupt data surfaces as many types
            reason = str(exc) or type(exc).__name__
            raise ImageRejected(f"cannot decode image: {reason}") from None
    return np.ascontiguousarray(pixels)
