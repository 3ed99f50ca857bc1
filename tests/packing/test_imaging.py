"""The pack-side per-image path against Pillow: libjpeg-turbo decode, EXIF orientation, resize.

shardkit decodes JPEGs with simplejpeg and resizes with torch's antialiased bicubic kernel, so its
pixels are checked here against what Pillow (the reference users know) makes of the same files.
"""

from __future__ import annotations

import io
import os
import struct
import threading
import warnings
import zlib

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageOps

from helpers import all_records, jpeg_bytes, noise, run_program, write_bytes
from shardkit.packing.imaging import ImageRejected, decode_rgb, load_rgb, quiet_warnings
from shardkit.packing.sources.encode import clean_jpeg
from shardkit.packing.api import pack
from shardkit.packing.settings import PackSettings
from shardkit.packing.stream import chunk_bounds, largest_chunk
from shardkit.packing.resize import resize_rgb, target_size
from shardkit.bench.sample import photo_like


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
    """A JPEG through the libjpeg-turbo path and resize: Pillow's pixels within one level."""
    arr = noise(np.random.default_rng(orientation), 400, 600)
    data = jpeg_bytes(arr, 90, exif_orientation=orientation)
    got, ref = load_rgb(data, 256), _pil_reference(data, 256)
    assert got.shape == ref.shape == ((384, 256, 3) if orientation >= 5 else (256, 384, 3))
    diff = np.abs(got.astype(int) - ref.astype(int))
    assert diff.max() <= 1 and diff.mean() < 0.01, (diff.max(), diff.mean())


def test_resize_matches_pillow_bicubic():
    """The README's claim: within +-2 of Pillow's BICUBIC, mean difference under 0.01, on uniform
    noise and on the photo-like image where the difference reaches 2 (benchmarks/
    resize_vs_pillow.py measures more)."""
    rng = np.random.default_rng(1)
    cases = [(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), nh, nw) for h, w, nh, nw in
             [(375, 500, 256, 341), (1000, 700, 365, 256), (257, 256, 256, 255),
              (1500, 1500, 256, 256)]]
    cases.append((photo_like(np.random.default_rng(3), 375, 500), 341, 256))
    for arr, nh, nw in cases:
        got = resize_rgb(arr, nw, nh)
        ref = np.asarray(Image.fromarray(arr).resize((nw, nh), Image.Resampling.BICUBIC))
        assert got.shape == (nh, nw, 3) and got.flags.c_contiguous
        diff = np.abs(got.astype(int) - ref.astype(int))
        assert diff.max() <= 2 and diff.mean() < 0.01, (diff.max(), diff.mean())


def test_resize_accepts_views_and_read_only_arrays():
    arr = noise(np.random.default_rng(2), 300, 400)
    expected = resize_rgb(np.ascontiguousarray(arr[::-1]), 200, 150)
    assert np.array_equal(resize_rgb(arr[::-1], 200, 150), expected)
    frozen = np.ascontiguousarray(arr[::-1])
    frozen.flags.writeable = False
    assert np.array_equal(resize_rgb(frozen, 200, 150), expected)


def _with_extraneous_bytes(data: bytes) -> bytes:
    """libjpeg warns "N extraneous bytes before marker 0xd9"; Pillow decodes it regardless."""
    assert data.endswith(b"\xff\xd9")
    return data[:-2] + b"\x00\x01\x02" + data[-2:]


@pytest.mark.parametrize("width, height, size, fast, slow", [
    # libjpeg-turbo scales by n/8: the smallest n that keeps the shorter side >= 2 * size
    (2400, 1800, 256, (675, 900), (900, 1200)),  # 3/8; Pillow's draft only has 1/2, 1/4, 1/8
    (1800, 2400, 256, (900, 675), (1200, 900)),
    (2400, 1800, 128, (450, 600), (450, 600)),  # 2/8; draft 1/4
    (2400, 1800, 0, (1800, 2400), (1800, 2400)),  # size 0: full size
    (640, 480, 256, (480, 640), (480, 640)),  # already under twice the target
])
def test_jpeg_decode_scale(width, height, size, fast, slow):
    """The DCT scale each JPEG path uses (libjpeg-turbo; Pillow's draft after a libjpeg warning),
    and the resize that follows starts from that decode."""
    data = jpeg_bytes(noise(np.random.default_rng(3), height, width), 90)
    for encoded, shape in ((data, fast), (_with_extraneous_bytes(data), slow)):
        decoded = decode_rgb(encoded, size)
        assert decoded.shape == shape + (3,)
        new_w, new_h = target_size(width, height, size)  # the file's size, not the decode's
        expected = decoded if (new_w, new_h) == shape[::-1] else resize_rgb(decoded, new_w, new_h)
        assert np.array_equal(load_rgb(encoded, size), expected)


def test_stored_size_is_the_resize_rule_on_the_files_own_size(tmp_path):
    """libjpeg rounds DCT-scaled sides up (Pillow's draft too): the rule applied to the scaled
    decode stored a 671x625 photo at 275x256 where ``v2.Resize(256)`` gives 274x256 (about a
    quarter of sizes over 512 differed). Packed, every size is the rule on the file's oriented
    size: ``int(256 * long / short)``, computed here by hand."""
    cases = [  # (width, height, EXIF orientation, Pillow path): each differed by one pixel
        (671, 625, None, False), (2295, 1454, None, False), (3188, 694, None, False),
        (590, 2401, 6, False), (1616, 1347, 8, False), (2859, 2506, None, True)]
    src = tmp_path / "src"
    want = []
    for n, (w, h, orientation, pillow) in enumerate(cases):
        data = jpeg_bytes(np.zeros((h, w, 3), np.uint8), 50, exif_orientation=orientation)
        if pillow:  # a libjpeg warning: Pillow decodes it, with draft
            data = _with_extraneous_bytes(data)
        write_bytes(str(src / "c" / f"{n}.jpg"), data)
        if orientation in (6, 8):
            w, h = h, w
        short, long = min(w, h), max(w, h)
        new = (256, int(256 * long / short))  # torchvision's _compute_resized_output_size
        want.append(new if w <= h else new[::-1])  # (width, height)
    out = str(tmp_path / "s.lmdb")
    pack(str(src), out, workers=1, progress=False)
    got = [(img.shape[1], img.shape[0]) for img, _ in all_records(out)]
    assert got == want
    assert want[0] == (274, 256)


def test_12000px_jpeg_is_decoded_at_one_eighth():
    """144 Mpixel (between Pillow's warning and error limits): decoded at 1500x1500 by either
    path, never at full size (432 MB)."""
    data = simplejpeg.encode_jpeg(np.zeros((12000, 12000, 3), np.uint8), quality=50,
                                  colorsubsampling="420")  # zero pages: costs no RAM to encode
    assert decode_rgb(data, 256).shape == (1500, 1500, 3)
    assert decode_rgb(_with_extraneous_bytes(data), 256).shape == (1500, 1500, 3)
    assert load_rgb(data, 256).shape == (256, 256, 3)


def test_large_jpeg_is_resized_close_to_pillow():
    """A 2400x1800 JPEG decoded at 3/8 and resized: close to Pillow's full decode + BICUBIC
    (DCT scaling is a different filter: a mean difference under one level)."""
    arr = noise(np.random.default_rng(3), 1800, 2400)
    data = jpeg_bytes(arr, 90)
    got, ref = load_rgb(data, 256), _pil_reference(data, 256)
    assert got.shape == ref.shape == (256, 341, 3)
    diff = np.abs(got.astype(int) - ref.astype(int))
    assert diff.max() <= 8 and diff.mean() < 1.0, (diff.max(), diff.mean())


def test_recoverable_jpeg_warning_is_decoded_as_pillow_does():
    arr = noise(np.random.default_rng(4), 300, 400)
    data = _with_extraneous_bytes(jpeg_bytes(arr, 90))
    with pytest.raises(ValueError):  # libjpeg-turbo's strict decode refuses it...
        simplejpeg.decode_jpeg(data, "RGB")
    got = load_rgb(data, 256)  # ... so Pillow decodes it
    assert np.abs(got.astype(int) - _pil_reference(data, 256).astype(int)).max() <= 1


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


def _png_by_hand(pixels: np.ndarray, bit_depth: int, colour_type: int, trns: bytes) -> bytes:
    """A PNG with a tRNS chunk, written byte by byte (Pillow cannot write 16-bit RGB)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)
    height, width = pixels.shape[:2]
    rows = pixels.astype(">u2" if bit_depth == 16 else "u1").reshape(height, -1)
    raw = b"".join(b"\0" + row.tobytes() for row in rows)
    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"tRNS", trns)
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _keyed_png(case: str) -> tuple[bytes, np.ndarray, np.ndarray]:
    """(PNG with a transparency key, HxW mask of the keyed pixels, the RGB expected elsewhere)."""
    rng = np.random.default_rng(11)
    keyed = np.zeros((20, 30), bool)
    keyed[5:12, 8:20] = True
    buf = io.BytesIO()
    if case == "RGB":
        arr = rng.integers(0, 200, (20, 30, 3), dtype=np.uint8)
        arr[keyed] = (220, 30, 40)
        Image.fromarray(arr).save(buf, "PNG", transparency=(220, 30, 40))
        return buf.getvalue(), keyed, arr
    if case == "RGB;16":  # Pillow keeps each sample's high byte
        arr = rng.integers(0, 200 << 8, (20, 30, 3)).astype(np.uint16)
        arr[keyed] = (0xDC12, 0x1E34, 0x2856)
        return (_png_by_hand(arr, 16, 2, struct.pack(">HHH", 0xDC12, 0x1E34, 0x2856)), keyed,
                (arr >> 8).astype(np.uint8))
    if case == "L":
        arr = rng.integers(8, 256, (20, 30), dtype=np.uint8)
        arr[keyed] = 7
        Image.fromarray(arr).save(buf, "PNG", transparency=7)
    elif case == "L;2":  # the key is a 2-bit sample (1); Pillow scales the pixels to 0..255
        arr = np.where(rng.integers(0, 2, (20, 30)) == 1, 170, 0).astype(np.uint8)
        arr[keyed] = 85
        Image.fromarray(arr).save(buf, "PNG", bits=2, transparency=1)
    elif case == "I;16":
        deep = rng.integers(1001, 65536, (20, 30)).astype(np.uint16)
        deep[keyed] = 1000
        Image.fromarray(deep).save(buf, "PNG", transparency=1000)
        arr = np.rint(deep / 257.0).astype(np.uint8)
    elif case == "1":  # a 1-bit image keyed on black: its black pixels become white
        arr = np.full((20, 30), 255, np.uint8)
        arr[keyed] = 0
        arr[0, ::2] = 0
        keyed = arr == 0
        Image.fromarray(arr).convert("1").save(buf, "PNG", transparency=0)
    return buf.getvalue(), keyed, np.repeat(arr[..., None], 3, axis=2)


@pytest.mark.parametrize("case", ["RGB", "RGB;16", "L", "L;2", "I;16", "1"])
def test_transparency_key_makes_pixels_white_in_every_mode(case):
    """One alpha rule: a tRNS key on RGB, grey, 16-bit grey or 1-bit images is transparency,
    composited onto white, as for palette images."""
    data, keyed, opaque = _keyed_png(case)
    im = Image.open(io.BytesIO(data))
    assert im.mode == {"RGB;16": "RGB", "L;2": "L"}.get(case, case)
    assert "transparency" in im.info
    got = load_rgb(data, 0)
    assert keyed.any() and (~keyed).any()
    assert (got[keyed] == 255).all()
    assert np.array_equal(got[~keyed], opaque[~keyed])


def test_chunks_cover_every_source_once_start_at_one_and_shrink_to_one():
    """The first chunk is one source (the first record is written as soon as one image is
    encoded), doubling up to the guided size, which then only shrinks."""
    for n, workers, largest in [(0, 2, 128), (1, 2, 128), (1000, 2, 128), (5003, 16, 64),
                                (7, 4, 1)]:
        bounds = chunk_bounds(n, workers, largest)
        sizes = list(np.diff(bounds))
        assert bounds[0] == 0 and bounds[-1] == n
        assert all(1 <= s <= largest for s in sizes)
        if n > 0:
            top = sizes.index(max(sizes))
            assert sizes[0] == 1 and sizes[-1] == 1
            assert all(b <= 2 * a for a, b in zip(sizes[:top], sizes[1:top + 1]))
            assert sizes[top:] == sorted(sizes[top:], reverse=True)
    assert np.diff(chunk_bounds(1000, 2, 128))[:8].tolist() == [1, 2, 4, 8, 16, 32, 64, 109]
    assert largest_chunk(PackSettings(size=256)) == 128
    assert largest_chunk(PackSettings(size=1024, encoding="raw")) == 2
    assert largest_chunk(PackSettings(size=0)) == 4


def test_pack_with_another_thread_running_spawns_workers_and_same_records(tmp_path):
    """A packing process with other threads cannot fork safely; workers started as fresh
    interpreters must give the same store."""
    rng = np.random.default_rng(6)
    src = tmp_path / "src"
    for i in range(12):
        write_bytes(str(src / f"c{i % 2}" / f"{i}.jpg"), jpeg_bytes(noise(rng, 300, 420), 90))
    plain = str(tmp_path / "plain.lmdb")
    # A fresh single-threaded process packs with fork.
    run_program("fork_pack", str(src), plain, check=True, timeout=120)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        from shardkit.packing.workers import start_method

        assert start_method() == "spawn"
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

    from shardkit.packing import resize

    arr = noise(np.random.default_rng(7), 375, 500).copy()  # writable, as torch wants
    fast = resize.resize_rgb(arr, 341, 256)
    slow = resize.resize_float(torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0), 341, 256)
    assert slow.shape == fast.shape and slow.flags.c_contiguous
    assert np.abs(slow.astype(int) - fast.astype(int)).max() <= 1


def test_pillows_warnings_neither_reject_an_image_nor_outlive_its_decode(monkeypatch):
    """An image over Pillow's warning limit but under its error limit is decoded even where
    warnings are errors (``python -W error``), for a JPEG (simplejpeg's check) and a PNG, and
    the caller's filters are as they were afterwards."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 40x40 = 1,600: warns, under 2,000
    pixels = noise(np.random.default_rng(3), 40, 40)
    images = {"PNG": _png_bytes(pixels, 1), "JPEG": jpeg_bytes(pixels)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = list(warnings.filters)
        for fmt, data in images.items():
            with pytest.raises(Image.DecompressionBombWarning):  # what a plain open does here
                Image.open(io.BytesIO(data))
            assert decode_rgb(data, 0, 0).shape == (40, 40, 3), fmt
            assert clean_jpeg(data, 0) == ((40, 40) if fmt == "JPEG" else None)
            assert warnings.filters == before


def test_interleaved_decoding_threads_leave_the_filters_as_they_were():
    """Thread A enters, B enters, A leaves, B leaves (forced by events): B's decode still
    ignores warnings after A left, and the filters are the caller's once both left (with
    ``warnings.catch_warnings`` in each thread, B put back the "ignore" A had installed)."""
    before = list(warnings.filters)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def a() -> None:
        with quiet_warnings():
            a_in.set()
            b_in.wait(30)
        a_out.set()

    def b() -> None:
        a_in.wait(30)
        with quiet_warnings():
            b_in.set()
            a_out.wait(30)
            seen.append(warnings.filters[0][0])

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == ["ignore"]
    assert warnings.filters == before
