"""Turn one source image file into the RGB pixels shardkit stores (the pack-side work).

Rules, applied in this order:
1. The format is detected from the content, never the extension.
2. Images declaring more than ``max_pixels`` pixels are refused before any pixel is decoded.
3. JPEGs are decoded at a reduced DCT scale (Pillow ``draft``) that still leaves the shorter side at
   least twice the target, so a 12000x12000 photo costs about as much as a 1500x1500 one.
4. EXIF orientation is applied.
5. Colour: every mode becomes 8-bit RGB. Alpha (RGBA, LA, PA, palette transparency) is composited
   onto a white background. 16/32-bit grey (I;16, I) is scaled from 0..65535 to 0..255; float grey
   (F) is clipped to 0..255. CMYK, YCbCr, LAB, HSV, 1, L and P use Pillow's conversion.
6. The shorter side is resized to ``size`` with an anti-aliased bicubic filter (torchvision's
   ``Resize`` size rule: the longer side becomes ``int(size * long / short)``); smaller images are
   never upscaled. ``size=0`` keeps the original size.
"""

from __future__ import annotations

import io
import warnings

import numpy as np

try:
    from PIL import Image, ImageOps
except ImportError as exc:  # Pillow is an extra so that an installed pillow-simd is never replaced
    raise ImportError("shardkit needs a Pillow-API library: pip install 'shardkit[pillow]', "
                      "or install pillow-simd (see README)") from exc

# We enforce our own pixel limit before decoding (rule 2).
Image.MAX_IMAGE_PIXELS = None

PILLOW_PIXEL_LIMIT = 2 * 89_478_485  # Pillow's DecompressionBombError threshold
WHITE = (255, 255, 255)


class ImageRejected(Exception):
    """The file cannot be used; the message is the reason recorded in the store's metadata."""


def target_size(width: int, height: int, size: int) -> tuple[int, int]:
    """(width, height) after resizing the shorter side to ``size``; never upscales."""
    short, long = min(width, height), max(width, height)
    if size <= 0 or short <= size:
        return width, height
    new_long = int(size * long / short)
    return (size, new_long) if width <= height else (new_long, size)


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


def _apply_orientation(im: Image.Image) -> Image.Image:
    """Apply EXIF orientation; an unreadable or absurd EXIF block leaves the image as decoded."""
    try:
        return ImageOps.exif_transpose(im) or im
    except Exception:  # noqa: BLE001 - EXIF is untrusted metadata; pixels are still good
        return im


def load_rgb(data: bytes, size: int, max_pixels: int = PILLOW_PIXEL_LIMIT) -> np.ndarray:
    """Decode, orient, convert and resize one encoded image; returns HxWx3 uint8 (C-contiguous)."""
    if not data:
        raise ImageRejected("empty file (0 bytes)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            im = Image.open(io.BytesIO(data))
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
            if im.format == "JPEG" and size > 0:
                im.draft("RGB", (2 * size, 2 * size))
            im.load()
            im = _apply_orientation(im)
            im = to_rgb(im)
            new_w, new_h = target_size(im.width, im.height, size)
            if (new_w, new_h) != im.size:
                im = im.resize((new_w, new_h), Image.Resampling.BICUBIC)
            arr = np.asarray(im, dtype=np.uint8)
        except ImageRejected:
            raise
        except Exception as exc:  # noqa: BLE001 - truncated/corrupt data surfaces as many types
            reason = str(exc) or type(exc).__name__
            raise ImageRejected(f"cannot decode image: {reason}") from None
    return np.ascontiguousarray(arr)
