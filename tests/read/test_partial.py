"""Partial JPEG decode (shardkit.read.partial) and the row markers it needs (shardkit.jpegrows):
every window of rows decoded on its own equals the same rows of a full decode, pixel for pixel;
records with row markers decode to exactly the pixels of records without; stores index them."""

from __future__ import annotations

import io

import numpy as np
import pytest
import simplejpeg
import torch
from helpers import image_tree, noise, run_cli
from PIL import Image

import shardkit
from shardkit import ShardDataset, jpegrows
from shardkit.codec import encode
from shardkit.packing import StoreWriter
from shardkit.read import partial


def _pillow(arr: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=85, restart_marker_rows=1, **kw)
    return buf.getvalue()


def _records() -> list[tuple[str, bytes]]:
    """Odd sizes (not multiples of 8 or 16), shardkit's own 4:2:0 records and Pillow's
    4:2:0, 4:4:4 and greyscale JPEGs with a restart marker every MCU row."""
    rng = np.random.default_rng(3)
    out = []
    for h, w in [(71, 33), (50, 17)]:
        arr = noise(rng, h, w)
        out += [("shardkit 4:2:0", encode(arr, "jpeg", 90)),
                ("4:2:0", _pillow(arr, subsampling="4:2:0")),
                ("4:4:4", _pillow(arr, subsampling="4:4:4")),
                ("grey", _pillow(arr[..., 1].copy()))]
    return out


def test_every_row_window_equals_the_full_decode() -> None:
    """Both decode modes, every [top, bottom) of every image: rows identical to a full decode
    (fails if the window is shifted by one MCU row or the context row is dropped)."""
    for name, data in _records():
        starts = jpegrows.row_starts(data)
        assert starts is not None, name
        for fast in (False, True):
            full = simplejpeg.decode_jpeg(data, fastdct=fast, fastupsample=fast)
            height = full.shape[0]
            decoded = 0
            for top in range(height):
                for bottom in range(top + 1, height + 1):
                    rows, y0 = partial.decode_rows(data, starts, top, bottom, fast)
                    decoded += len(rows)
                    assert np.array_equal(rows[top - y0:bottom - y0], full[top:bottom]), (
                        name, fast, top, bottom)
            # Not the whole image each time: the windows do skip rows.
            assert decoded < 0.8 * height * height * (height + 1) / 2, (name, fast)


def test_context_row_only_where_fancy_upsampling_reads_across() -> None:
    """4:2:0 with fancy upsampling decodes the MCU row beyond a crop on an MCU edge; fast
    upsampling, 4:4:4 and greyscale decode only the crop's own rows."""
    arr = noise(np.random.default_rng(5), 64, 40)
    data = encode(arr, "jpeg", 90)
    starts = jpegrows.row_starts(data)
    assert len(starts) == 4 + 1  # four 16-row MCU rows, then EOI
    assert partial.decode_rows(data, starts, 16, 32)[0].shape[0] == 48  # rows 0..47
    assert partial.decode_rows(data, starts, 17, 31)[0].shape[0] == 16
    assert partial.decode_rows(data, starts, 16, 32, fast=True)[0].shape[0] == 16
    grey = _pillow(arr[..., 0].copy())
    assert partial.decode_rows(grey, jpegrows.row_starts(grey), 8, 16)[0].shape[0] == 8


def test_row_markers_keep_the_pixels_and_cost_little() -> None:
    """A record with a marker before every MCU row decodes, in both modes, to exactly the pixels
    of the same image encoded without (simplejpeg, as shardkit always encoded); Pillow opens it."""
    rng = np.random.default_rng(7)
    for h, w in [(256, 341), (257, 255), (33, 9)]:
        arr = noise(rng, h, w)
        marked, plain = encode(arr, "jpeg", 90), encode(arr, "jpeg", 90, row_markers=False)
        assert marked != plain and jpegrows.row_starts(plain) is None
        assert len(jpegrows.row_starts(marked)) == -(-h // 16) + 1
        for fast in (False, True):
            assert np.array_equal(simplejpeg.decode_jpeg(marked, fastdct=fast, fastupsample=fast),
                                  simplejpeg.decode_jpeg(plain, fastdct=fast, fastupsample=fast))
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(marked)).convert("RGB")),
                              np.asarray(Image.open(io.BytesIO(plain)).convert("RGB")))
        # a marker and a padded byte per row, the DRI segment: a few bytes a row
        assert len(marked) - len(plain) <= 6 + 4 * -(-h // 16)


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_store_indexes_row_markers(tmp_path, fmt) -> None:
    """Records written with markers (add, or add_encoded of such a JPEG) get their row starts in
    the shard index and ``info`` counts them; a record without (an old store's) gets none."""
    rng = np.random.default_rng(9)
    arrs = [noise(rng, 70, 45), noise(rng, 40, 33)]
    out = str(tmp_path / f"s.{'h5' if fmt == 'hdf5' else 'lmdb'}")
    with StoreWriter(out, ["a"], format=fmt, size=0) as w:
        w.add(arrs[0], 0)
        w.add_encoded(encode(arrs[1], "jpeg", 90, row_markers=False), 0, 40, 33)
        w.add_encoded(_pillow(arrs[1], subsampling="4:4:4"), 0, 40, 33)
    assert shardkit.info(out)["row_markers"] == 2
    ds = shardkit.ShardDataset(out, output="numpy")
    shard = ds.store.shard(0)
    offsets = shard.row_offsets
    assert offsets.tolist() == [0, 6, 6, 6 + 5 + 1]  # 5 rows of 16, none, 5 rows of 8 + EOI
    with shard.reader.records() as get:
        first = bytes(get(0))
    assert np.array_equal(shard.row_starts[:6], jpegrows.row_starts(first))

    old = str(tmp_path / "old.lmdb")
    with StoreWriter(old, ["a"], size=0) as w:
        w.add_encoded(encode(arrs[0], "jpeg", 90, row_markers=False), 0, 70, 45)
    assert shardkit.info(old)["row_markers"] == 0
    assert shardkit.ShardDataset(old).store.shard(0).row_offsets is None


def test_pack_marks_every_record_and_info_says_so(tmp_path) -> None:
    """A sharded pack: every record has row markers, each shard's count is in the manifest, and
    ``shardkit info`` prints them."""
    image_tree(str(tmp_path / "src"), classes=2, per_class=2, sides=(20, 40))
    out = str(tmp_path / "out")
    shardkit.pack(str(tmp_path / "src"), out, size=48, num_shards=2, workers=1, progress=False)
    assert shardkit.info(out)["row_markers"] == 4
    proc = run_cli("info", out)
    assert proc.returncode == 0, proc.stderr
    assert "row markers: all 4 records" in proc.stdout


def _twin_stores(tmp_path, fmt: str) -> tuple[str, str]:
    """The same images of odd sizes stored twice: with row markers, and as stores packed before
    them (no markers, no row index: decoded whole)."""
    rng = np.random.default_rng(11)
    arrs = [noise(rng, int(h), int(w)) for h, w in rng.integers(33, 90, size=(12, 2))]
    ext = ".h5" if fmt == "hdf5" else ".lmdb"
    paths = []
    for name, markers in (("rows", True), ("old", False)):
        path = str(tmp_path / f"{name}{ext}")
        with StoreWriter(path, ["a", "b"], format=fmt, size=0) as w:
            for i, arr in enumerate(arrs):
                w.add_encoded(encode(arr, "jpeg", 90, row_markers=markers), i % 2, *arr.shape[:2])
        paths.append(path)
    assert [shardkit.info(p)["row_markers"] for p in paths] == [12, 0]
    return paths[0], paths[1]


def _epoch(ds, seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    items = [ds[i][0] for i in range(len(ds))]
    torch.manual_seed(seed)
    images, _ = shardkit.collate(ds.__getitems__(list(range(len(ds)))))
    return items + list(images)


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_crops_decoded_by_rows_equal_full_decodes(tmp_path, fmt) -> None:
    """Centre, random and random resized crops (flipped or not), exact and fast decode, items
    and batches: the store with row markers (decoded by rows) gives exactly the pixels of the
    store without (decoded whole), many seeds."""
    rows, old = _twin_stores(tmp_path, fmt)
    for fast in (False, True):
        for mode, kw in (("center", {}), ("random", {"flip": 0.5}),
                         ("random_resized", {"flip": 0.5, "scale": (0.05, 0.6)})):
            opts = dict(crop=24, crop_mode=mode, fast_decode=fast, **kw)
            a, b = ShardDataset(rows, **opts), ShardDataset(old, **opts)
            assert a.store.shard(0).row_offsets is not None
            for seed in range(4 if mode != "center" else 1):
                for x, y in zip(_epoch(a, seed), _epoch(b, seed)):
                    assert torch.equal(x, y), (fast, mode, seed)


def test_row_decode_in_dataloader_workers(tmp_path) -> None:
    """Forked DataLoader workers decode by rows too: the same batches as the old store's."""
    rows, old = _twin_stores(tmp_path, "lmdb")
    opts = dict(crop=24, crop_mode="random_resized", flip=0.5, scale=(0.05, 0.6))
    got = []
    for path in (rows, old):
        torch.manual_seed(0)
        loader = ShardDataset(path, **opts).loader(batch_size=4, num_workers=2)
        got.append([images for images, _ in loader])
    assert len(got[0]) == 3
    assert all(torch.equal(x, y) for x, y in zip(*got))


def test_window_over_nearly_every_row_decodes_whole() -> None:
    """A window leaving out at most one MCU row is decoded whole (the cut costs what it saves),
    one leaving out two is decoded by rows; the crops' pixels are the full decode's either way."""
    from shardkit.read import cut
    from shardkit.read.augment import Plan

    arr = noise(np.random.default_rng(5), 64, 40)  # four 16-row MCU rows (4:2:0)
    data = jpegrows.encode_rows(arr, 90)
    starts = jpegrows.row_starts(data)
    for bottom, decoded_rows in ((40, 64), (24, 32)):  # context row: MCU rows 0-2, then 0-1
        plan = Plan(0, 3, bottom, 30, False)
        src = cut.decode_boxes(data, "jpeg", 64, 40, [plan], rows=starts)
        assert (src.row0, src.pixels.shape[0]) == (0, decoded_rows)
        got, want = np.empty((20, 20, 3), np.uint8), np.empty((20, 20, 3), np.uint8)
        cut.decode_views([got], data, "jpeg", 64, 40, [plan], rows=starts)
        cut.decode_views([want], data, "jpeg", 64, 40, [plan])
        assert np.array_equal(got, want)
    # the centre crop of an image packed at 256 covers every MCU row: decoded whole
    assert partial.whole(*partial.box_rows([(16, 16, 224, 224)], 256), 256, np.zeros(17))
    assert not partial.whole(*partial.box_rows([(16, 16, 200, 224)], 256), 256, np.zeros(17))
