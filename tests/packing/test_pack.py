"""``shardkit.pack``: record shapes, orientation, colour, skipped files, determinism, atomic output."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from helpers import (all_records, jpeg_bytes, noise, program_cmd, program_env, region_mean,
                     resized_shape, run_program, sources_of, write_bytes)
from shardkit import ShardDataset
from shardkit.errors import PackError
from shardkit.formats import detect_format
from shardkit.read.inspect import info
from shardkit.packing.api import pack
from shardkit.packing.install import partial_path
from shardkit.read.store import Store

JPEG_TOLERANCE = 12  # max |mean error| per channel over a flat region, after two JPEG encodes


def _records(store: str) -> dict[str, tuple[np.ndarray, int]]:
    return dict(zip(sources_of(store), all_records(store)))


def test_record_shapes_follow_resize_rule(quirky, quirky_store):
    """Shorter side 256 (torchvision's int() rule for the longer side); smaller images kept."""
    records = _records(quirky_store)
    assert set(records) == set(quirky.expect)
    for rel, (img, _) in records.items():
        e = quirky.expect[rel]
        assert img.shape == resized_shape(e.height, e.width, 256) + (3,), rel
        assert img.dtype == np.uint8
    assert records["beta/tall.png"][0].shape[:2] == (599, 256)  # int(599.89), not round()
    assert records["beta/red.jpg"][0].shape[:2] == (256, 384)
    assert records["beta/small.png"][0].shape[:2] == (61, 101)  # never upscaled
    assert records["beta/short256.bmp"][0].shape[:2] == (256, 300)


def test_exif_orientation_is_applied(quirky_store):
    """Orientation 6 (90 degrees clockwise) and 3 (180): shape and where the red corner ends up."""
    records = _records(quirky_store)
    img6 = records["beta/exif6.jpg"][0]
    assert img6.shape[:2] == (512, 256)  # stored 640x320 landscape -> portrait, then resized
    h, w = img6.shape[:2]
    assert img6[h // 4, 3 * w // 4].tolist() == pytest.approx([255, 0, 0], abs=JPEG_TOLERANCE)
    assert img6[h // 4, w // 4].tolist() == pytest.approx([0, 0, 255], abs=JPEG_TOLERANCE)
    img3 = records["beta/exif3.jpg"][0]
    assert img3.shape[:2] == (48, 96)
    assert img3[36, 72].tolist() == pytest.approx([255, 0, 0], abs=JPEG_TOLERANCE)
    assert img3[12, 24].tolist() == pytest.approx([255, 255, 255], abs=JPEG_TOLERANCE)


def test_colour_modes_become_rgb(quirky, quirky_store):
    """CMYK, L, P (+transparency), RGBA, LA, I;16, 1, PNG-named-JPEG: colours as documented;
    transparent pixels become white."""
    records = _records(quirky_store)
    checked = 0
    for rel, e in quirky.expect.items():
        img = records[rel][0]
        for region in e.regions:
            mean = region_mean(img, region)
            assert np.abs(mean - np.array(region[4])).max() <= JPEG_TOLERANCE, (rel, region, mean)
            checked += 1
    assert checked >= 25


def test_lossless_sources_round_trip(quirky, pack_quirky):
    """raw records hold exactly the source pixels; jpeg records decode to the same shape, close."""
    raw, jpeg = _records(pack_quirky("lmdb", "raw")), _records(pack_quirky("lmdb", "jpeg"))
    exact = {rel: e.exact for rel, e in quirky.expect.items() if e.exact is not None}
    assert len(exact) >= 3
    for rel, pixels in exact.items():
        assert np.array_equal(raw[rel][0], pixels), rel
    assert raw.keys() == jpeg.keys()
    for rel in raw:
        assert raw[rel][0].shape == jpeg[rel][0].shape, rel
        assert raw[rel][1] == jpeg[rel][1]
        diff = np.abs(raw[rel][0].astype(int) - jpeg[rel][0].astype(int)).mean()
        assert diff < 16, (rel, diff)  # q90 on noise; a swap or flip gives > 50


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_raw_records_are_pixels(pack_quirky, fmt):
    ds = ShardDataset(pack_quirky(fmt, "raw"), output="bytes")
    pix = ShardDataset(pack_quirky(fmt, "raw"), output="numpy")
    for i in range(len(ds)):
        data, _ = ds[i]
        img, _ = pix[i]
        assert data == img.tobytes()


def test_size_zero_keeps_original_size(quirky, pack_quirky):
    records = _records(pack_quirky("hdf5", "raw", 0))
    for rel, (img, _) in records.items():
        e = quirky.expect[rel]
        assert img.shape[:2] == (e.height, e.width), rel
    assert records["beta/exif6.jpg"][0].shape[:2] == (640, 320)


def test_skipped_files_are_reported(quirky, quirky_store):
    store = Store(quirky_store)
    reported = {os.path.relpath(s["path"], quirky.root): s["reason"] for s in store.skipped}
    assert set(reported) == set(quirky.skipped)
    for rel, word in quirky.skipped.items():
        assert reported[rel] and word in reported[rel], (rel, reported[rel])
    assert info(quirky_store)["skipped"] == len(quirky.skipped)
    assert store.count == len(quirky.expect)


def test_pack_result_lists_skipped(quirky, tmp_path, monkeypatch):
    """Skipped paths are absolute, SRC given relative to the cwd too: what the Dask engine
    (workers with another cwd) records, so the store does not depend on the engine."""
    monkeypatch.chdir(os.path.dirname(quirky.root))
    result = pack(os.path.basename(quirky.root), tmp_path / "o.lmdb", workers=1,
                  allow_empty=True, progress=False)
    assert result.count == len(quirky.expect)
    assert result.sources == len(quirky.expect) + len(quirky.skipped)
    assert sorted(s["path"] for s in result.skipped) == \
        sorted(os.path.join(quirky.root, rel) for rel in quirky.skipped)


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_deterministic_across_worker_counts(quirky, pack_quirky, tmp_path, fmt):
    one = pack_quirky(fmt)  # packed with workers=1
    two = str(tmp_path / ("two" + (".h5" if fmt == "hdf5" else ".lmdb")))
    pack(quirky.root, two, format=fmt, workers=2, allow_empty=True, progress=False)
    a, b = ShardDataset(one, output="bytes"), ShardDataset(two, output="bytes")
    assert len(a) == len(b) == len(quirky.expect)
    assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]
    assert sources_of(one) == sources_of(two)
    assert Store(one).meta == Store(two).meta
    if fmt == "lmdb":  # written with meminit: the files are byte-identical
        with open(one, "rb") as f1, open(two, "rb") as f2:
            assert f1.read() == f2.read()


# -- atomic output --------------------------------------------------------------------------------

def test_strict_fails_and_writes_nothing(quirky, tmp_path):
    out = tmp_path / "out.lmdb"
    with pytest.raises(PackError, match="strict"):
        pack(quirky.root, out, workers=2, strict=True, allow_empty=True, progress=False)
    assert os.listdir(tmp_path) == []


def test_existing_out_refused_then_replaced_with_overwrite(photo_src, tmp_path):
    out = tmp_path / "out.lmdb"
    out.write_bytes(b"precious")
    with pytest.raises(PackError, match="exists"):
        pack(photo_src[0], out, workers=1, progress=False)
    assert out.read_bytes() == b"precious"
    assert sorted(os.listdir(tmp_path)) == ["out.lmdb"]
    pack(photo_src[0], out, workers=1, overwrite=True, progress=False)
    assert len(ShardDataset(out)) == len(photo_src[1])
    assert sorted(os.listdir(tmp_path)) == ["out.lmdb"]


def test_overwrite_replaces_a_folder(photo_src, tmp_path):
    out = tmp_path / "out.h5"
    out.mkdir()
    (out / "junk").write_bytes(b"x")
    pack(photo_src[0], out, workers=1, overwrite=True, progress=False)
    assert out.is_file() and detect_format(str(out)) == "hdf5"
    assert sorted(os.listdir(tmp_path)) == ["out.h5"]


BLOCKING_PACK = [*program_cmd("blocking_pack"), "pack"]


def _frozen_source(tmp_path) -> str:
    """Three images; under BLOCKING_PACK the second never finishes encoding (a frozen pack)."""
    src = tmp_path / "src"
    rng = np.random.default_rng(0)
    for name in ("0.jpg", "1.jpg", "2.jpg"):
        write_bytes(str(src / "a" / name), jpeg_bytes(noise(rng, 16, 16)))
    return str(src)


def _frozen_env(tmp_path) -> dict[str, str]:
    return program_env({"SHARDKIT_TEST_BLOCK": os.path.join("a", "1.jpg"),
                        # beside tmp_path: its listing is checked
                        "SHARDKIT_TEST_EVENTS": f"{tmp_path}.events"})


def _wait_for(partial: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the pack has created its partial output (or a side file of it, e.g. an HDF5 spool)
    and an encoder is frozen on the blocking source (its ``block`` event)."""
    folder, name = os.path.split(partial)
    events = f"{folder}.events"

    def blocked() -> bool:
        try:
            with open(events) as f:
                return any(line.startswith("block ") for line in f)
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + timeout  # only against a hang: the test waits on events
    while not (any(n.startswith(name) for n in os.listdir(folder)) and blocked()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "pack never froze on the blocking source"
        time.sleep(0.02)


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_leaves_no_output(tmp_path, workers):
    src, out = _frozen_source(tmp_path), str(tmp_path / "out.lmdb")
    proc = subprocess.Popen([*BLOCKING_PACK, src, out, "--workers", str(workers), "-q"],
                            stderr=subprocess.PIPE, text=True, env=_frozen_env(tmp_path))
    try:
        _wait_for(partial_path(out), proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_crash_leaves_no_out_and_rerun_succeeds(tmp_path):
    src, out = _frozen_source(tmp_path), str(tmp_path / "out.h5")
    proc = subprocess.Popen([*BLOCKING_PACK, src, out, "--workers", "1", "-q"],
                            stderr=subprocess.DEVNULL, env=_frozen_env(tmp_path))
    try:
        _wait_for(partial_path(out), proc)
        proc.kill()  # SIGKILL: no cleanup at all
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert not os.path.exists(out)
    assert len(os.listdir(tmp_path)) > 1  # the killed run's partial output (hidden name)
    result = pack(src, out, workers=1, progress=False)  # no --overwrite needed: OUT never existed
    assert result.count == 3
    assert sorted(os.listdir(tmp_path)) == ["out.h5", "src"]  # leftovers of the crash removed


# -- limits ---------------------------------------------------------------------------------------

def test_max_pixels_skips_large_images(tmp_path):
    src = tmp_path / "src"
    rng = np.random.default_rng(0)
    os.makedirs(src / "a")
    Image.fromarray(noise(rng, 40, 40)).save(src / "a" / "big.png")  # 1600 pixels
    write_bytes(str(src / "a" / "ok.jpg"), jpeg_bytes(noise(rng, 20, 30)))  # 600 pixels
    result = pack(src, tmp_path / "o.lmdb", max_pixels=1000, workers=1, progress=False)
    assert result.count == 1
    assert [os.path.basename(s["path"]) for s in result.skipped] == ["big.png"]
    assert "max-pixels" in result.skipped[0]["reason"]
    assert sources_of(str(tmp_path / "o.lmdb")) == ["a/ok.jpg"]


@pytest.fixture(scope="module")
def huge_src(tmp_path_factory) -> str:
    """A 12000x12000 JPEG (flat black, so it is cheap to write) plus a small image."""
    src = tmp_path_factory.mktemp("huge") / "src"
    # np.zeros is backed by the zero page: encoding it does not need 432 MB of RAM.
    data = simplejpeg.encode_jpeg(np.zeros((12000, 12000, 3), np.uint8), quality=50,
                                  colorsubsampling="420")
    write_bytes(str(src / "a" / "huge.jpg"), data)
    write_bytes(str(src / "a" / "small.jpg"), jpeg_bytes(noise(np.random.default_rng(0), 20, 20)))
    return str(src)


def test_12000px_jpeg_packs_cheaply(huge_src, tmp_path):
    """144 Mpixel (below Pillow's limit) must pack, via DCT-scaled decoding: far less memory than
    the 432 MB a full decode needs (the scale itself is asserted in test_imaging)."""
    out = str(tmp_path / "o.lmdb")
    proc = run_program("pack_rss_growth", huge_src, out, capture_output=True, text=True,
                       timeout=120)
    assert proc.returncode == 0, proc.stderr
    count, growth_kb = json.loads(proc.stdout)
    assert count == 2
    assert growth_kb < 200_000, f"peak RSS grew {growth_kb} kB: the JPEG was fully decoded"
    records = _records(out)
    assert records["a/huge.jpg"][0].shape == (256, 256, 3)
    assert records["a/huge.jpg"][0].max() < 10


def test_max_pixels_refuses_huge_jpeg_before_decoding(huge_src, tmp_path):
    result = pack(huge_src, tmp_path / "o.h5", max_pixels=100_000_000, workers=1, progress=False)
    assert result.count == 1
    assert [os.path.basename(s["path"]) for s in result.skipped] == ["huge.jpg"]
    assert "144000000" in result.skipped[0]["reason"]


# -- formats on disk ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,fmt", [("o.h5", "hdf5"), ("o.HDF5", "hdf5"), ("o.lmdb", "lmdb"),
                                      ("o.db", "lmdb"), ("o", "lmdb")])
def test_format_defaults_from_suffix(tmp_path, name, fmt):
    src = tmp_path / "src"
    write_bytes(str(src / "a" / "x.jpg"), jpeg_bytes(noise(np.random.default_rng(0), 16, 16)))
    pack(src, tmp_path / name, workers=1, progress=False)
    assert detect_format(str(tmp_path / name)) == fmt
    assert Store(tmp_path / name).settings["format"] == fmt


def test_explicit_format_overrides_suffix(photo_src, tmp_path):
    pack(photo_src[0], tmp_path / "o.lmdb", format="hdf5", workers=1, progress=False)
    assert detect_format(str(tmp_path / "o.lmdb")) == "hdf5"


def _check_meta(meta: dict, count: int, classes: list[str]) -> None:
    assert meta["format_version"] == 1 and meta["count"] == count
    assert meta["classes"] == classes
    assert meta["class_to_idx"] == {c: i for i, c in enumerate(classes)}
    assert {"size", "quality", "encoding", "format"} <= set(meta["settings"])
    assert isinstance(meta["shardkit_version"], str)
    assert isinstance(meta["skipped"], list)


def test_lmdb_layout_read_with_plain_lmdb(quirky, pack_quirky, tmp_path):
    """Keys from the record index, JSON metadata, raw little-endian index arrays, no pickle."""
    import lmdb

    path = str(tmp_path / "copy.lmdb")  # lmdb refuses a 2nd open of a file shardkit has open
    shutil.copyfile(pack_quirky("lmdb"), path)
    count = len(quirky.expect)
    assert os.path.getsize(path) < 4 << 20  # map grows as needed: no huge preallocated file
    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        keys = [k for k, _ in txn.cursor()]
        meta = json.loads(txn.get(b"__meta__"))
        labels = np.frombuffer(txn.get(b"__array__/labels"), "<i8")
        first = txn.get((0).to_bytes(8, "big"))
    env.close()
    assert keys[:count] == [i.to_bytes(8, "big") for i in range(count)]
    assert all(k.startswith(b"__") for k in keys[count:])
    _check_meta(meta, count, quirky.classes)
    assert labels.tolist() == ShardDataset(path).targets.tolist()
    assert first[:2] == b"\xff\xd8"  # a JPEG


def test_hdf5_layout_read_with_plain_h5py(quirky, pack_quirky):
    """One contiguous uint8 dataset + offsets; index arrays; JSON metadata attribute."""
    import h5py

    path = pack_quirky("hdf5")
    count = len(quirky.expect)
    with h5py.File(path, "r") as f:
        data, offsets = f["data"], f["offsets"][()]
        assert data.dtype == np.uint8 and data.ndim == 1 and data.chunks is None
        assert offsets.dtype == np.int64 and len(offsets) == count + 1
        assert offsets[-1] == data.shape[0]
        meta = json.loads(bytes(f.attrs["shardkit_meta"]))
        for name in ("labels", "heights", "widths"):
            assert f["index"][name].shape == (count,)
            assert f["index"][name].dtype.kind == "i"
        first = data[offsets[0]:offsets[1]].tobytes()
        heights = f["index/heights"][()]
    _check_meta(meta, count, quirky.classes)
    assert simplejpeg.decode_jpeg(first).shape[0] == heights[0]


def test_pack_from_a_script_on_stdin_uses_worker_processes(photo_src, tmp_path):
    """`python - <<EOF ... pack(workers=2)`: forkserver/spawn cannot re-import a '<stdin>' main
    module (their workers die and are restarted forever); the packer must still finish."""
    out = str(tmp_path / "o.lmdb")
    script = (f"import shardkit\nr = shardkit.pack({photo_src[0]!r}, {out!r}, workers=2, "
              "progress=False)\nprint(r.count)\n")
    proc = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) == len(photo_src[1])
