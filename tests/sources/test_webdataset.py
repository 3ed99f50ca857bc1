"""Packing from WebDataset tars written by ``webdataset`` itself, compared with packing the
same images from their folder and with what ``webdataset.WebDataset`` reads from the tars."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile

import numpy as np
import pytest
import simplejpeg
import webdataset as wds
from conftest import (CLASSES, read_bytes, sample_key, store_fields, store_files, store_records,
                      write_json)
from PIL import Image

import shardkit
from shardkit.cli import main as cli_main
from shardkit.codec import encode
from shardkit.errors import PackError
from shardkit.packing.imaging import load_rgb


def write_tars(folder, out_dir: str, maxcount: int = 10, classes: bool = True) -> list[str]:
    """The folder's images as WebDataset shards (ShardWriter), in ImageFolder order."""
    root, samples = folder
    os.makedirs(out_dir, exist_ok=True)
    with wds.ShardWriter(os.path.join(out_dir, "train-%06d.tar"), maxcount=maxcount,
                         verbose=0) as sink:
        for rel, label in samples:
            ext = rel.rsplit(".", 1)[1]
            sink.write({"__key__": sample_key(rel), ext: read_bytes(os.path.join(root, rel)),
                        "cls": label, "txt": f"caption of {rel}"})
    if classes:
        write_json(os.path.join(out_dir, "classes.json"), CLASSES)
    return sorted(os.path.join(out_dir, n) for n in os.listdir(out_dir) if n.endswith(".tar"))


@pytest.fixture(scope="module")
def tars(folder, tmp_path_factory) -> tuple[str, list[str]]:
    out = str(tmp_path_factory.mktemp("wds") / "tars")
    return out, write_tars(folder, out)


def test_tars_pack_as_their_folder_and_as_webdataset_reads_them(tars, folder, folder_store,
                                                                tmp_path):
    out_dir, files = tars
    assert len(files) == 3  # 24 samples, 10 a shard
    out = str(tmp_path / "tars.lmdb")
    # in this process: worker processes give the same bytes (test_byte_identical_...)
    result = shardkit.pack(out_dir, out, size=64, workers=1, progress=False)
    assert result.count == 24 and result.skipped == []
    got, want = store_records(out), store_records(folder_store(64))
    # Same pipeline: byte-identical records (so identical pixels), labels and sizes.
    assert [r[:4] for r in got] == [r[:4] for r in want]
    ds = shardkit.ShardDataset(out)
    assert ds.classes == CLASSES and ds.class_to_idx == {c: i for i, c in enumerate(CLASSES)}
    # webdataset's own reader: the same samples, keys and labels, in the same order.
    brace = os.path.join(out_dir, "train-{000000..000002}.tar")
    theirs = [(key, int(cls), url) for key, cls, url in
              wds.WebDataset(brace, shardshuffle=False).to_tuple("__key__", "cls", "__url__")]
    assert [r[1] for r in got] == [t[1] for t in theirs]
    ext = {sample_key(rel): rel.rsplit(".", 1)[1] for rel, _ in folder[1]}
    assert [r[4] for r in got] == [f"{os.path.basename(url)}#{key}.{ext[key]}"
                                   for key, _, url in theirs]
    # the txt members became the text field "txt", as webdataset decodes them
    captions = [t for (t,) in wds.WebDataset(brace, shardshuffle=False).decode().to_tuple("txt")]
    assert store_fields(out, "txt") == captions == [f"caption of {rel}" for rel, _ in folder[1]]


def test_json_npy_txt_members_become_typed_fields(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rows = [({"id": i, "tags": ["a", "b"][:i + 1]}, np.arange(4 * (i + 1), dtype=np.float32)
             .reshape(i + 1, 4), f"photo {i}") for i in range(3)]
    with wds.TarWriter(str(src / "f.tar")) as sink:
        for i, (meta, boxes, caption) in enumerate(rows):
            sink.write({"__key__": f"s{i}", "jpg": _jpeg(i), "cls": i, "json": meta,
                        "boxes.npy": boxes, "caption.txt": caption})
    out = str(tmp_path / "f.lmdb")
    shardkit.pack(str(src), out, size=0, workers=1, progress=False)
    theirs = list(wds.WebDataset(str(src / "f.tar"), shardshuffle=False).decode()
                  .to_tuple("json", "boxes.npy", "caption.txt"))
    assert store_fields(out, "json") == [t[0] for t in theirs] == [r[0] for r in rows]
    assert store_fields(out, "caption") == [t[2] for t in theirs]
    for ours, (_, boxes, _) in zip(store_fields(out, "boxes"), theirs):
        assert np.array_equal(ours, boxes) and ours.dtype == boxes.dtype


def test_sharded_pack_keeps_the_containers_order(tars, folder, folder_store, tmp_path):
    out_dir, _ = tars
    mine = str(tmp_path / "tars")
    shardkit.pack(out_dir, mine, size=64, workers=1, num_shards=3, progress=False)
    # A container is read in its order (no mixed layout), cut where its tars end (10, 20).
    assert [r[:4] for r in store_records(mine)] == \
        [r[:4] for r in store_records(folder_store(64))]
    assert [e.count for e in shardkit.ShardDataset(mine).store.shards] == [10, 10, 4]
    assert list(shardkit.ShardDataset(mine).targets) == [lab for _, lab in folder[1]]


def test_brace_pattern_single_tar_and_forced_format(tars, folder_store, tmp_path):
    out_dir, files = tars
    want = store_records(folder_store(64))
    brace = os.path.join(out_dir, "train-{000000..000002}.tar")
    shardkit.pack(brace, str(tmp_path / "brace.lmdb"), size=64, workers=1, progress=False)
    assert [r[:4] for r in store_records(str(tmp_path / "brace.lmdb"))] == \
        [r[:4] for r in want]
    shardkit.pack(files[1], str(tmp_path / "one.lmdb"), size=64, workers=1, progress=False,
                  source_format="webdataset")
    assert [r[:4] for r in store_records(str(tmp_path / "one.lmdb"))] == \
        [r[:4] for r in want[10:20]]
    with pytest.raises(PackError, match="index.json"):
        shardkit.pack(out_dir, str(tmp_path / "x.lmdb"), source_format="mds", progress=False)


def test_gzipped_tars_pack_the_same(tars, folder_store, tmp_path):
    out_dir, files = tars
    gz = tmp_path / "gz"
    gz.mkdir()
    for f in files:
        with gzip.open(gz / (os.path.basename(f) + ".gz"), "wb") as g:
            g.write(read_bytes(f))
    write_json(str(gz / "classes.json"), CLASSES)
    shardkit.pack(str(gz), str(tmp_path / "gz.lmdb"), size=64, workers=2, progress=False)
    assert [r[:4] for r in store_records(str(tmp_path / "gz.lmdb"))] == \
        [r[:4] for r in store_records(folder_store(64))]


@pytest.mark.leaves_threads  # a Dask client in this process
def test_byte_identical_for_any_workers_and_engine(tars, tmp_path):
    out_dir, _ = tars
    singles = []
    for workers in (0, 3):  # in this process, and chunks over 3 worker processes
        out = str(tmp_path / f"w{workers}.lmdb")
        shardkit.pack(out_dir, out, size=48, workers=workers, progress=False)
        singles.append(list(store_files(out).values()))
    assert singles[0] == singles[1]
    sharded = []
    for workers, engine in ((1, "local"), (3, "local"), (2, "dask")):
        out = str(tmp_path / f"s{workers}{engine}")
        result = shardkit.pack(out_dir, out, size=48, workers=workers, num_shards=3,
                               engine=engine, progress=False)
        assert result.shards == 3
        sharded.append(store_files(out))
    assert sharded[0] == sharded[1] == sharded[2]
    # Output shards hold whole source shards: shard k is tar k (one Dask task each).
    store = shardkit.ShardDataset(str(tmp_path / "s2dask"))
    for k, entry in enumerate(store.store.shards):
        tars_seen = {store.source_path(i).split("#")[0]
                     for i in range(entry.start, entry.start + entry.count)}
        assert tars_seen == {f"train-{k:06d}.tar"}


def _tar(path: str, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _jpeg(seed: int, shape=(30, 40)) -> bytes:
    rng = np.random.default_rng(seed)
    return simplejpeg.encode_jpeg(rng.integers(0, 255, (*shape, 3), dtype=np.uint8), 90)


def test_skip_list_names_shard_member_and_reason(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with wds.TarWriter(str(src / "a.tar")) as sink:
        sink.write({"__key__": "good", "jpg": _jpeg(1), "cls": 2})
        sink.write({"__key__": "noimage", "cls": 1, "txt": "no picture"})
        sink.write({"__key__": "badlabel", "jpg": _jpeg(2), "cls": "abc"})
        sink.write({"__key__": "nolabel", "jpg": _jpeg(3)})
        sink.write({"__key__": "pickled", "jpg": _jpeg(4), "cls": 0, "pyd": {"a": 1}})
        sink.write({"__key__": "broken", "jpg": b"\xff\xd8 not a jpeg", "cls": 0})
    good_b = _jpeg(5)
    with wds.TarWriter(str(src / "b.tar")) as sink:
        sink.write({"__key__": "first", "jpg": good_b, "cls": 1})
        sink.write({"__key__": "cut", "jpg": _jpeg(6, (200, 200)), "cls": 1})
    data = read_bytes(str(src / "b.tar"))
    with open(src / "b.tar", "wb") as f:  # truncated inside the second sample's image
        f.write(data[:data.index(b"cut.jpg") + 512 + 700])
    out = str(tmp_path / "out.lmdb")
    result = shardkit.pack(str(src), out, size=0, workers=2, progress=False)
    reasons = {os.path.relpath(s["path"], str(src)): s["reason"] for s in result.skipped}
    assert reasons.keys() == {"a.tar#noimage.cls", "a.tar#badlabel.jpg", "a.tar#nolabel.jpg",
                              "a.tar#pickled.pyd", "a.tar#broken.jpg", "b.tar#cut.jpg",
                              "b.tar#cut.cls"}
    assert "no image member" in reasons["a.tar#noimage.cls"]
    assert "'abc' is not an integer" in reasons["a.tar#badlabel.jpg"]
    assert "no label member" in reasons["a.tar#nolabel.jpg"]
    assert reasons["a.tar#pickled.pyd"] == "pickled member refused (never loaded)"
    assert "decode" in reasons["a.tar#broken.jpg"] or "image" in reasons["a.tar#broken.jpg"]
    assert "truncated member" in reasons["b.tar#cut.jpg"]
    assert "no image member" in reasons["b.tar#cut.cls"]  # what is left of that sample
    records = store_records(out)
    assert [(r[1], r[4]) for r in records] == [(2, "a.tar#good.jpg"), (0, "a.tar#pickled.jpg"),
                                              (1, "b.tar#first.jpg")]
    assert shardkit.ShardDataset(out).classes == ["0", "1", "2"]  # integers, never renumbered
    assert records[2][0] == good_b  # --size 0 jpeg: the source JPEG kept byte for byte


def test_size_zero_keeps_clean_jpegs_and_reencodes_the_rest(tmp_path):
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
    clean = simplejpeg.encode_jpeg(rgb, 85)
    grey = simplejpeg.encode_jpeg(rgb[:, :, :1].copy(), 85, colorspace="GRAY")
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", exif=exif.tobytes())
    rotated = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    png = buf.getvalue()
    src = tmp_path / "src"
    src.mkdir()
    with wds.TarWriter(str(src / "s.tar")) as sink:
        for key, ext, data in (("a", "jpg", clean), ("b", "jpg", grey), ("c", "jpg", rotated),
                               ("d", "png", png)):
            sink.write({"__key__": key, ext: data, "cls": 0})
    out = str(tmp_path / "out.lmdb")
    shardkit.pack(str(src), out, size=0, workers=1, progress=False)
    records = store_records(out)
    assert records[0][0] == clean and records[1][0] == grey
    assert records[2][0] != rotated and (records[2][2], records[2][3]) == (64, 48)
    for record, data in zip(records, (clean, grey, rotated, png)):
        pixels = simplejpeg.decode_jpeg(record[0], "RGB")
        want = load_rgb(data, 0)
        if record[0] == data:  # kept: its pixels are the ones the pipeline decodes
            assert np.array_equal(pixels, want)
        else:  # exactly what the folder pipeline stores: its pixels encoded at quality 90
            assert record[0] == encode(want, "jpeg", 90)


def _cli_error(capsys, argv) -> str:
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_hostile_tars_are_refused_with_one_line(tmp_path, capsys):
    good = (tarfile.TarInfo("ok.jpg"), _jpeg(1))
    cls = (tarfile.TarInfo("ok.cls"), b"0")
    climb = tmp_path / "climb.tar"
    _tar(str(climb), [good, cls, (tarfile.TarInfo("../evil.jpg"), _jpeg(2))])
    assert "points outside the archive" in _cli_error(
        capsys, ["pack", str(climb), str(tmp_path / "o1.lmdb"), "-q"])
    link = tmp_path / "link.tar"
    sym = tarfile.TarInfo("x.jpg")
    sym.type, sym.linkname = tarfile.SYMTYPE, "/etc/passwd"
    _tar(str(link), [good, cls, (sym, None)])
    assert "is a link" in _cli_error(capsys, ["pack", str(link), str(tmp_path / "o2.lmdb"),
                                              "-q"])
    hard = tarfile.TarInfo("h.jpg")
    hard.type, hard.linkname = tarfile.LNKTYPE, "ok.jpg"
    _tar(str(link), [good, cls, (hard, None)])
    assert "is a link" in _cli_error(capsys, ["pack", str(link), str(tmp_path / "o3.lmdb"),
                                              "-q"])
    # A header claiming 10 GB in a small file: that member is skipped, nothing 10 GB is read.
    huge = tmp_path / "huge.tar"
    _tar(str(huge), [good, cls])
    body = read_bytes(str(huge))
    with tarfile.open(str(huge)) as tar:
        last = tar.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512  # where the end-of-archive blocks start
    info = tarfile.TarInfo("big.jpg")
    info.size = 10 << 30
    with open(huge, "wb") as f:
        f.write(body[:end] + info.tobuf(tarfile.GNU_FORMAT) + _jpeg(3) + b"\0" * 1024)
    out = str(tmp_path / "o4.lmdb")
    assert cli_main(["pack", str(huge), out, "-q", "--size", "0"]) == 0
    err = capsys.readouterr().err
    assert "big.jpg" in err and "its header says 10737418240 bytes" in err
    assert len(shardkit.ShardDataset(out)) == 1


def test_killed_pack_from_tars_resumes(tars, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out_dir, _ = tars
    out, ref = str(tmp_path / "out"), str(tmp_path / "ref")
    args = ["pack", out_dir, "--num-shards", "3", "--size", "32", "-q", "--workers", "2"]
    events = str(tmp_path / "events")
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__),
                                                          "block_pack.py"), *args[:2], out,
                             *args[2:]], start_new_session=True, stderr=subprocess.PIPE,
                            env=dict(os.environ, BLOCK_TAR="train-000002.tar",
                                     BLOCK_EVENTS=events))
    partial = os.path.join(str(tmp_path), ".out.partial")
    done = os.path.join(partial, "shard-00001.done.json")
    deadline = time.monotonic() + 300  # only against a hang
    while not (os.path.exists(done) and os.path.exists(events)):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the pack neither finished shard 1 nor blocked"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stderr.close()
    kept = {k: os.stat(os.path.join(partial, f"shard-{k:05d}.lmdb")).st_ino for k in (0, 1)}
    assert not os.path.exists(os.path.join(partial, "shard-00002.done.json"))
    assert cli_main([*args[:2], out, *args[2:], "--resume"]) == 0
    assert {k: os.stat(os.path.join(out, f"shard-{k:05d}.lmdb")).st_ino for k in (0, 1)} == kept
    # the reference in this process: the same bytes for any workers (test above)
    assert cli_main([*args[:2], ref, *args[2:], "--workers", "1"]) == 0
    assert store_files(out) == store_files(ref)


def test_class_names_from_classes_json_or_sorted_text_labels(tmp_path):
    named, plain = tmp_path / "named", tmp_path / "plain"
    for folder in (named, plain):
        folder.mkdir()
        with wds.TarWriter(str(folder / "t.tar")) as sink:
            for i, cls in enumerate(("dog", "cat", "eel", "1")):
                sink.write({"__key__": f"s{i}", "jpg": _jpeg(i), "cls": cls})
    write_json(str(named / "classes.json"), ["cat", "dog"])
    result = shardkit.pack(str(named), str(tmp_path / "n.lmdb"), size=0, workers=1,
                           progress=False)
    assert {os.path.basename(s["path"]): s["reason"] for s in result.skipped} == \
        {"t.tar#s2.jpg": "label 'eel' is not a known class"}
    ds = shardkit.ShardDataset(str(tmp_path / "n.lmdb"))
    assert ds.classes == ["cat", "dog"] and list(ds.targets) == [1, 0, 1]  # "1": index 1
    result = shardkit.pack(str(plain), str(tmp_path / "p.lmdb"), size=0, workers=1,
                           progress=False)
    ds = shardkit.ShardDataset(str(tmp_path / "p.lmdb"))
    # mixed text and integer labels without names: the integers count, names are refused
    assert ds.classes == ["0", "1"] and list(ds.targets) == [1]
    assert sorted(s["reason"] for s in result.skipped) == [
        f"label {n!r} is not an integer (the source mixes integers and names and declares no "
        "class names)"
        for n in ("cat", "dog", "eel")]


def test_a_member_some_samples_lack_is_an_optional_field(tmp_path):
    """3 of 12 samples carry a .json, 2 a boxes.npy, 4 a caption.txt: every sample is packed,
    each field where given, None (json, text) or empty (ragged boxes) where absent."""
    src = tmp_path / "src"
    src.mkdir()
    meta = {2: {"id": 2}, 5: {"id": 5, "tags": ["x"]}, 9: [1, 2]}
    boxes = {3: np.ones((2, 4), np.float32), 7: np.zeros((1, 4), np.float32)}
    captions = {0: "zero", 4: "four", 8: "eight", 11: "eleven"}
    with wds.TarWriter(str(src / "t.tar")) as sink:
        for i in range(12):
            sample = {"__key__": f"s{i:02d}", "jpg": _jpeg(i), "cls": i % 2}
            sample.update({"json": meta[i]} if i in meta else {})
            sample.update({"boxes.npy": boxes[i]} if i in boxes else {})
            sample.update({"caption.txt": captions[i]} if i in captions else {})
            sink.write(sample)
    out = str(tmp_path / "t.lmdb")
    result = shardkit.pack(str(src), out, size=0, workers=1, progress=False)
    assert (result.count, result.skipped) == (12, [])
    theirs = list(wds.WebDataset(str(src / "t.tar"), shardshuffle=False).decode())
    assert store_fields(out, "json") == [s.get("json") for s in theirs] == [
        meta.get(i) for i in range(12)]
    assert store_fields(out, "caption") == [captions.get(i) for i in range(12)]
    for i, got in enumerate(store_fields(out, "boxes")):
        assert got.dtype == np.float32 and np.array_equal(got, boxes.get(i, np.zeros((0, 4))))
    declared = {f["name"]: f for f in shardkit.ShardDataset(out).store.meta["fields"]}
    assert all(declared[n].get("optional") is True for n in ("json", "caption", "boxes"))
    assert shardkit.verify(out).ok
    ds = shardkit.ShardDataset(out, fields=["label", "json", "caption", "boxes"])
    _, target = shardkit.collate(ds.__getitems__(list(range(6))))
    assert target["json"] == [None, None, {"id": 2}, None, None, {"id": 5, "tags": ["x"]}]
    assert target["caption"] == ["zero", None, None, None, "four", None]
    assert [len(b) for b in target["boxes"]] == [0, 0, 0, 2, 0, 0]
    assert target["label"].tolist() == [0, 1, 0, 1, 0, 1]
    # exported, an absent field is no member, and the tars pack to the same fields again
    shardkit.export.export(out, str(tmp_path / "x" / "e-%06d.tar"), progress=False)
    again = str(tmp_path / "again.lmdb")
    assert shardkit.pack(str(tmp_path / "x"), again, size=0, workers=1, progress=False).count == 12
    assert store_fields(again, "json") == store_fields(out, "json")
    assert store_fields(again, "caption") == store_fields(out, "caption")


def test_member_suffixes_are_lower_cased_as_webdataset_does(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with wds.TarWriter(str(src / "u.tar")) as sink:
        sink.write({"__key__": "a", "JPG": _jpeg(1), "CLS": b"1", "Caption.TXT": b"upper"})
        sink.write({"__key__": "b", "Jpeg": _jpeg(2), "Cls": b"0", "caption.txt": b"lower"})
    theirs = list(wds.WebDataset(str(src / "u.tar"), shardshuffle=False))
    assert [sorted(k for k in s if not k.startswith("__")) for s in theirs] == [
        ["caption.txt", "cls", "jpg"], ["caption.txt", "cls", "jpeg"]]
    out = str(tmp_path / "u.lmdb")
    result = shardkit.pack(str(src), out, size=0, workers=1, progress=False)
    assert (result.count, result.skipped) == (2, [])
    assert [r[1] for r in store_records(out)] == [int(s["cls"]) for s in theirs] == [1, 0]
    assert store_fields(out, "caption") == ["upper", "lower"]
