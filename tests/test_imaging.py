"""The pack-side per-image path against Pillow: libjpeg-turbo decode, EXIF orientation, resize.

shardkit decodes JPEGs with simplejpeg and resizes with torch's antialiased bicubic kernel, so its
pixels are checked here against what Pillow (the reference users know) makes of the same files.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageOps

from helpers import all_records, jpeg_bytes, noise, write_bytes
from shardkit.imaging import ImageRejected, load_rgb
from shardkit.packer import _chunk_bounds, _largest_chunk, PackSettings, pack
from shardkit.resize import resize_rgb, target_size


def _pil_reference(data: bytes, size: int) -> np.ndarray:
    """Pillow: full decode, exif_transpose, RGB, BICUBIC shorter side to ``size``."""
    im = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    new = target_size(im.width, im.height, size)
    if new != im.size:
        im = im.resize(new, Image.Resampling.BICUBIC)
    return np.asarray(im)


def _png_bytes(arr: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG", exif=exif)
    return buf.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_matches_pillow_exactly(orientation):
    """Lossless source, no resize: the pixels are exactly ImageOps.exif_transpose's."""
    arr = np.random.default_rng(orientation).integers(0, 256, (30, 50, 3), dtype=np.uint8)
    data = _png_bytes(arr, orientation)
    got = load_rgb(data, 0)
    assert np.array_equal(got, _pil_reference(data, 0))
    assert got.shape[:2] == ((50, 30) if orientation >= 5 else (30, 50))


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_jpeg_orientation_and_resize_match_pillow(orientation):
    """A JPEG through the libjpeg-turbo path and resize: Pillow's pixels within a level or two."""
    arr = noise(np.random.default_rng(orientation), 400, 600)
    data = jpeg_bytes(arr, 90, exif_orientation=orientation)
    got, ref = load_rgb(data, 256), _pil_reference(data, 256)
    assert got.shape == ref.shape == ((384, 256, 3) if orientation >= 5 else (256, 384, 3))
    diff = np.abs(got.astype(int) - ref.astype(int))
    assert diff.max() <= 3 and diff.mean() < 0.1, (diff.max(), diff.mean())


def test_resize_matches_pillow_bicubic():
    rng = np.random.default_rng(1)
    for h, w, nh, nw in [(375, 500, 256, 341), (1000, 700, 365, 256), (257, 256, 256, 255)]:
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        got = resize_rgb(arr, nw, nh)
        ref = np.asarray(Image.fromarray(arr).resize((nw, nh), Image.Resampling.BICUBIC))
        assert got.shape == (nh, nw, 3) and got.flags.c_contiguous
        assert np.abs(got.astype(int) - ref.astype(int)).max() <= 2


def test_resize_accepts_views_and_read_only_arrays():
    arr = noise(np.random.default_rng(2), 300, 400)
    expected = resize_rgb(np.ascontiguousarray(arr[::-1]), 200, 150)
    assert np.array_equal(resize_rgb(arr[::-1], 200, 150), expected)
    frozen = np.ascontiguousarray(arr[::-1])
    frozen.flags.writeable = False
    assert np.array_equal(resize_rgb(frozen, 200, 150), expected)


def test_large_jpeg_is_dct_scaled_but_still_resized_from_twice_the_target():
    """A 2400x1800 JPEG: decoded at a reduced scale, still the right size and close to Pillow."""
    arr = noise(np.random.default_rng(3), 1800, 2400)
    data = jpeg_bytes(arr, 90)
    got, ref = load_rgb(data, 256), _pil_reference(data, 256)
    assert got.shape == ref.shape == (256, 341, 3)
    assert np.abs(got.astype(float) - ref.astype(float)).mean() < 2.0


def _with_extraneous_bytes(data: bytes) -> bytes:
    """libjpeg warns "N extraneous bytes before marker 0xd9"; Pillow decodes it regardless."""
    assert data.endswith(b"\xff\xd9")
    return data[:-2] + b"\x00\x01\x02" + data[-2:]


def test_recoverable_jpeg_warning_is_decoded_as_pillow_does():
    arr = noise(np.random.default_rng(4), 300, 400)
    data = _with_extraneous_bytes(jpeg_bytes(arr, 90))
    with pytest.raises(ValueError):  # libjpeg-turbo's strict decode refuses it...
        simplejpeg.decode_jpeg(data, "RGB")
    got = load_rgb(data, 256)  # ... so Pillow decodes it
    assert np.abs(got.astype(int) - _pil_reference(data, 256).astype(int)).max() <= 3


def test_truncated_jpeg_is_still_refused():
    data = jpeg_bytes(noise(np.random.default_rng(5), 300, 400), 90)
    with pytest.raises(ImageRejected, match="cannot decode"):
        load_rgb(data[: len(data) // 2], 256)


def test_grey_and_cmyk_jpegs_become_rgb():
    grey = np.full((300, 400), 77, np.uint8)
    buf = io.BytesIO()
    Image.fromarray(grey, "L").save(buf, "JPEG", quality=95)
    got = load_rgb(buf.getvalue(), 256)
    assert got.shape == (256, 341, 3) and np.abs(got.astype(int) - 77).max() <= 2
    buf = io.BytesIO()
    Image.new("RGB", (400, 300), (200, 30, 60)).convert("CMYK").save(buf, "JPEG", quality=95)
    got = load_rgb(buf.getvalue(), 256)
    assert np.abs(got.reshape(-1, 3).mean(0) - [200, 30, 60]).max() <= 6


def test_chunks_cover_every_source_once_and_shrink_to_one():
    for n, workers, largest in [(0, 2, 128), (1, 2, 128), (1000, 2, 128), (5003, 16, 64),
                                (7, 4, 1)]:
        bounds = _chunk_bounds(n, workers, largest)
        sizes = np.diff(bounds)
        assert bounds[0] == 0 and bounds[-1] == n
        assert (sizes >= 1).all() and (sizes <= largest).all()
        if n > 0:
            assert sizes[-1] == 1 and list(sizes) == sorted(sizes, reverse=True)
    assert _largest_chunk(PackSettings(size=256)) == 128
    assert _largest_chunk(PackSettings(size=1024, encoding="raw")) == 2
    assert _largest_chunk(PackSettings(size=0)) == 4


def test_pack_with_another_thread_running_uses_forkserver_and_same_records(tmp_path):
    """A packing process with other threads cannot fork safely; the forkserver path must give
    the same store."""
    rng = np.random.default_rng(6)
    src = tmp_path / "src"
    for i in range(12):
        write_bytes(str(src / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(noise(rng, 300, 420), 90))
    plain = str(tmp_path / "plain.lmdb")
    # A fresh single-threaded process packs with fork.
    script = ("import sys; from shardkit.packer import _start_method, pack; "
              "assert _start_method() == 'fork'; pack(sys.argv[1], sys.argv[2], workers=2, "
              "progress=False)")
    subprocess.run([sys.executable, "-c", script, str(src), plain], check=True, timeout=120)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        from shardkit.packer import _start_method

        assert _start_method() == "forkserver"
        threaded = str(tmp_path / "threaded.lmdb")
        pack(str(src), threaded, workers=2, progress=False)
    finally:
        stop.set()
        other.join()
    a, b = all_records(plain), all_records(threaded)
    assert len(a) == len(b) == 12
    for (x, lx), (y, ly) in zip(a, b):
        assert lx == ly and np.array_equal(x, y)
    assert os.path.getsize(plain) > 0


def test_float_fallback_resize_agrees_with_the_uint8_kernel():
    """Older torch builds lack the uint8 kernel; the float path must give the same picture."""
    import torch

    from shardkit import resize

    arr = noise(np.random.default_rng(7), 375, 500).copy()  # writable, as torch wants
    fast = resize.resize_rgb(arr, 341, 256)
    slow = resize._resize_float(torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0), 341, 256)
    assert slow.shape == fast.shape and slow.flags.c_contiguous
    assert np.abs(slow.astype(int) - fast.astype(int)).max() <= 2
