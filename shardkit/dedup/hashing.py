"""The two hashes of a packed image (HxWx3 uint8 RGB, oriented, converted and resized: the
pixels the packer encodes).

* ``exact``: :func:`pixel_digest`, SHA-256 of the image's shape and pixel bytes (the CPUs'
  SHA instructions make it about 3x faster than BLAKE2b here: 0.16 ms for 256x341). Two
  sources share it exactly when they pack to the same pixels: the same file under two names,
  or one image saved twice losslessly (PNG and BMP, say).
* ``near``: :func:`phash`, a 64-bit perceptual hash (pHash in the manner of the ``imagehash``
  library: the 8x8 lowest frequencies of a 32x32 DCT against their median): the image resized to 32x32 (torch's bilinear kernel with antialias, on
  uint8: each output pixel a triangle-weighted average over its whole footprint, as
  torchvision's ``Resize``; the same kernel the packer resizes with), made grey (ITU-R 601
  luma: 0.299 R + 0.587 G + 0.114 B), its 2-D DCT-II (orthonormal), and the 8x8 lowest
  frequencies (DC included) compared with their median: bit ``8 * row + column`` (most
  significant first) is set where the coefficient is above it. Re-encoding, resizing and small
  crops move few bits; :mod:`.search` pairs hashes within a Hamming distance.

The resize reads the pixels where they lie (no copy into another layout): about 0.1 ms for
256x341 against 0.4-0.6 ms through Pillow, whose ``fromarray`` copies RGB into 4-byte pixels
first (``benchmarks/dedup_near.py``).
"""

from __future__ import annotations

import hashlib

import numpy as np

MODES = ("exact", "near")
_SIDE = 32  # the image is averaged to _SIDE x _SIDE before the DCT
_LOW = 8  # the _LOW x _LOW lowest frequencies make the 64 bits


def _dct_rows() -> np.ndarray:
    """The first _LOW rows of the orthonormal DCT-II matrix of size _SIDE."""
    k = np.arange(_SIDE)
    m = np.sqrt(2.0 / _SIDE) * np.cos(np.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * _SIDE))
    m[0] /= np.sqrt(2.0)
    return np.ascontiguousarray(m[:_LOW])


_DCT = _dct_rows()
_DCT_T = np.ascontiguousarray(_DCT.T)
_LUMA = np.array([0.299, 0.587, 0.114])


def pixel_digest(pixels: np.ndarray) -> str:
    """The exact hash: hex SHA-256 of the shape and the bytes of ``pixels``."""
    h = hashlib.sha256()
    h.update(np.asarray(pixels.shape, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(pixels).data)
    return h.hexdigest()


def thumbnail(pixels: np.ndarray) -> np.ndarray:
    """The first half of :func:`phash`: HxWx3 uint8 RGB ``pixels`` resized to 3x32x32 uint8."""
    import torch  # here: a pack's client process need not load torch for its workers' hashes
    from torch.nn import functional

    # HxWx3 seen as 1x3xHxW channels-last: torch's fast uint8 path, no copy of the image.
    image = torch.from_numpy(np.asarray(pixels, dtype=np.uint8)).permute(2, 0, 1)[None]
    small = functional.interpolate(image, size=(_SIDE, _SIDE), mode="bilinear",
                                   align_corners=False, antialias=True)
    return np.ascontiguousarray(small[0].numpy())


def phash_many(thumbnails: np.ndarray) -> list[int]:
    """The second half of :func:`phash`, for Nx3x32x32 :func:`thumbnail` s at once: the luma,
    DCT and median of many images in a few array operations cost about 3 us an image against
    some 60 one at a time (so the packer's workers hash a batch of records together)."""
    n = len(thumbnails)
    flat = np.asarray(thumbnails, dtype=np.float64).reshape(n, 3, _SIDE * _SIDE)
    grey = np.einsum("c,ncp->np", _LUMA, flat).reshape(n, _SIDE, _SIDE)
    low = (_DCT @ grey @ _DCT_T).reshape(n, _LOW * _LOW)
    ranked = np.sort(low, axis=1)
    median = (ranked[:, 31] + ranked[:, 32]) / 2
    bits = np.packbits(low > median[:, None], axis=1)
    return bits.view(">u8").ravel().tolist()


def phash(pixels: np.ndarray) -> int:
    """The 64-bit perceptual hash of HxWx3 uint8 RGB ``pixels`` (see the module's definition)."""
    return phash_many(thumbnail(pixels)[None])[0]
