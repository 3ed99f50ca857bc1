"""Records packed with a restart marker before every MCU row: byte for byte the rows encoded one by
one and joined at their markers (what stores have always held), so they decode, whole and by
rows, to exactly the pixels of the same image encoded without markers; the store's row index
points at those markers."""

from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import simplejpeg
from helpers import image_tree, noise

import shardkit
from shardkit import jpegrows, libjpeg
from shardkit.codec import encode
from shardkit.packing.imaging import load_rgb
from shardkit.read import partial


def _rows_one_by_one(pixels: np.ndarray, quality: int) -> bytes:
    """The reference: each 16-row strip its own simplejpeg JPEG, the first one's headers (SOF
    height patched, a DRI of one MCU row added), every strip's entropy data, RST0..7 between."""
    strips = [simplejpeg.encode_jpeg(pixels[top:top + 16], quality=quality, colorspace="RGB",
                                     colorsubsampling="420")
              for top in range(0, pixels.shape[0], 16)]
    if len(strips) == 1:
        return strips[0]
    frames = [jpegrows.parse_header(s) for s in strips]
    first, frame = strips[0], frames[0]
    mcus = -(-pixels.shape[1] // 16)
    out = bytearray(first[:frame.sos])
    out[frame.sof_height:frame.sof_height + 2] = struct.pack(">H", pixels.shape[0])
    out += b"\xff\xdd\x00\x04" + struct.pack(">H", mcus) + first[frame.sos:frame.scan_start]
    for k, (strip, f) in enumerate(zip(strips, frames)):
        out += (bytes([0xFF, 0xD0 + (k - 1) % 8]) if k else b"") + strip[f.scan_start:-2]
    return bytes(out + b"\xff\xd9")


def test_records_are_the_rows_encoded_one_by_one() -> None:
    """Every height around the MCU rows (one row, exact multiples, a short last row, more than
    eight rows so the markers wrap) and odd widths: the same bytes as the reference."""
    rng = np.random.default_rng(21)
    for h in [1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 143, 144, 145, 161]:
        for w in [1, 9, 16, 33]:
            arr = noise(rng, h, w)
            assert encode(arr, "jpeg", 90) == _rows_one_by_one(arr, 90), (h, w)
    arr = noise(rng, 70, 45)
    assert encode(arr, "jpeg", 75) == _rows_one_by_one(arr, 75)


def test_one_pass_records_are_the_rows_encoded_one_by_one() -> None:
    """Where libjpeg-turbo is at hand (every Linux Pillow wheel bundles it) the markers are written
    in one pass: the same bytes as the reference on both sides of the quality where TurboJPEG
    turns to the accurate DCT, for an image whose output outgrows the encoder's buffer, and from
    threads encoding at once; the row-by-row fallback too."""
    one_pass = libjpeg.one_pass_encoder(jpegrows.encode_each_row)
    assert one_pass is not None
    rng = np.random.default_rng(22)
    images = [noise(rng, h, w) for h, w in [(17, 33), (49, 9), (161, 40)]]
    for arr in images:
        for quality in (0, 50, 95, 96, 100):
            expected = _rows_one_by_one(arr, quality)
            assert one_pass(arr, quality) == expected, (arr.shape, quality)
            assert jpegrows.encode_each_row(arr, quality) == expected
    large = rng.integers(0, 256, (420, 400, 3), dtype=np.uint8)  # more than 256 KiB at 100
    assert len(one_pass(large, 100)) > 1 << 18
    assert one_pass(large, 100) == _rows_one_by_one(large, 100)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda a: encode(a, "jpeg", 90), images * 4))
    assert got == [_rows_one_by_one(a, 90) for a in images] * 4


def test_packed_records_decode_to_the_unmarked_pixels(tmp_path) -> None:
    """``shardkit.pack``: each record decodes whole, in both modes, and by rows to exactly the
    pixels of its resized source encoded without markers, and the shard's row index is the
    record's own markers (RST0..7 in turn, then EOI)."""
    image_tree(str(tmp_path / "src"), classes=2, per_class=3, sides=(60, 110))
    out = str(tmp_path / "s.lmdb")
    shardkit.pack(str(tmp_path / "src"), out, size=52, workers=1, progress=False)
    ds = shardkit.ShardDataset(out, output="numpy")
    shard = ds.store.shard(0)
    offsets, starts = shard.row_offsets, shard.row_starts
    assert len(ds) == 6
    with shard.reader.records() as get:
        for i in range(len(ds)):
            record = bytes(get(i))
            with open(os.path.join(str(tmp_path / "src"), ds.source_path(i)), "rb") as f:
                pixels = load_rgb(f.read(), 52)
            assert record == _rows_one_by_one(pixels, 90)
            plain = encode(pixels, "jpeg", 90, row_markers=False)
            row = starts[offsets[i]:offsets[i + 1]]
            rows = -(-pixels.shape[0] // 16)
            assert np.array_equal(row, jpegrows.row_starts(record)) and len(row) == rows + 1
            assert [record[s:s + 2] for s in row[1:]] == (
                [bytes([0xFF, 0xD0 + k % 8]) for k in range(rows - 1)] + [b"\xff\xd9"])
            for fast in (False, True):
                full = simplejpeg.decode_jpeg(plain, fastdct=fast, fastupsample=fast)
                assert np.array_equal(
                    simplejpeg.decode_jpeg(record, fastdct=fast, fastupsample=fast), full)
                height = full.shape[0]
                for top, bottom in [(0, 1), (17, 30), (height - 20, height), (5, height - 5)]:
                    got, y0 = partial.decode_rows(record, row, top, bottom, fast)
                    assert np.array_equal(got[top - y0:bottom - y0], full[top:bottom]), (i, top)
