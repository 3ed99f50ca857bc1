"""``shardkit export``: tars that ``webdataset`` reads back, parquet that
``datasets.load_dataset("parquet", ...)`` reads back, the record bytes unchanged."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
import webdataset as wds
from datasets import Image as HFImage
from datasets import load_dataset
from helpers import image_tree
from PIL import Image

import shardkit
from shardkit.cli import main as cli_main
from shardkit.fields import Boxes, Json, Text
from shardkit.read.store import Store


def records(path: str) -> list[tuple[bytes, int, int, int]]:
    """(bytes, label, height, width) of every record in the dataset's order (ds[i])."""
    ds = shardkit.ShardDataset(path)
    base = Store(path)
    out = []
    try:
        for i in range(len(ds)):
            k, local = ds.store.locate(i)
            shard = base.shard(k)
            with shard.reader.records() as get:
                out.append((bytes(get(local)), int(shard.labels[local]),
                            int(shard.heights[local]), int(shard.widths[local])))
    finally:
        base.close()
    assert [r[1] for r in out] == list(ds.targets)  # the dataset's own labels, in its order
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("export")
    image_tree(str(base / "src"), classes=3, per_class=6, seed=4, pngs=1)
    out = str(base / "store")
    shardkit.pack(str(base / "src"), out, size=48, workers=1, num_shards=2, progress=False)
    assert "layout" in Store(out).meta  # a mixed layout: ds order is not the shards' order
    return out


def test_webdataset_export_reads_back_and_packs_back(store, tmp_path, capsys):
    pattern = str(tmp_path / "tars" / "train-%06d.tar")  # tars/ is created, as `mkdir -p` would
    assert cli_main(["export", store, pattern, "--shard-size", "20KB", "-q"]) == 0
    assert "exported 18 records" in capsys.readouterr().err
    tars = sorted(n for n in os.listdir(tmp_path / "tars") if n.endswith(".tar"))
    assert len(tars) > 1 and tars[0] == "train-000000.tar"
    brace = str(tmp_path / "tars" / f"train-{{000000..{len(tars) - 1:06d}}}.tar")
    theirs = list(wds.WebDataset(brace, shardshuffle=False).to_tuple("jpg", "cls"))
    ours = records(store)
    assert [(jpg, int(cls)) for jpg, cls in theirs] == [(r[0], r[1]) for r in ours]
    with open(tmp_path / "tars" / "classes.json") as f:
        assert json.load(f) == shardkit.ShardDataset(store).classes
    # Packed back with --size 0: the same records, labels and class names.
    back = str(tmp_path / "back.lmdb")
    shardkit.pack(str(tmp_path / "tars"), back, size=0, workers=1, progress=False)
    assert records(back) == ours
    assert shardkit.ShardDataset(back).classes == shardkit.ShardDataset(store).classes
    # The same store exports to the same bytes.
    again = tmp_path / "again"
    again.mkdir()
    shardkit.export.export(store, str(again / "train-%06d.tar"), shard_size=20_000,
                           progress=False)
    for name in tars:
        with open(tmp_path / "tars" / name, "rb") as a, open(again / name, "rb") as b:
            assert a.read() == b.read()
    assert cli_main(["export", store, pattern, "-q"]) == 1  # exists: refused
    assert "already exists" in capsys.readouterr().err


def test_parquet_export_reads_back_with_datasets(store, tmp_path):
    pattern = str(tmp_path / "train-%05d.parquet")
    result = shardkit.export.export(store, pattern, to="parquet", progress=False)
    assert result.count == 18 and len(result.files) == 1
    ds = load_dataset("parquet", data_files=result.files, split="train")
    assert ds.features["label"].names == shardkit.ShardDataset(store).classes
    assert isinstance(ds.features["image"], HFImage)
    raw = ds.cast_column("image", HFImage(decode=False))
    ours = records(store)
    assert [(row["image"]["bytes"], row["label"]) for row in raw] == [(r[0], r[1]) for r in ours]
    assert ds[0]["image"].size == (ours[0][3], ours[0][2])
    # ... and shardkit packs it back as the same store content.
    back = str(tmp_path / "back.lmdb")
    shardkit.pack(result.files[0], back, size=0, workers=1, progress=False)
    assert records(back) == ours


def test_raw_records_export_as_lossless_png_and_fields_as_members(tmp_path):
    rng = np.random.default_rng(0)
    out = str(tmp_path / "f.lmdb")
    schema = [Text("caption"), Json("meta"), Boxes("boxes")]
    pixels = [rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8) for i in range(3)]
    with shardkit.StoreWriter(out, ["a", "b"], encoding="raw", size=0, schema=schema) as w:
        for i, px in enumerate(pixels):
            w.add(px, i % 2, caption=f"cap {i}", meta={"i": i},
                  boxes=np.array([[1, 2, 10, 12]], dtype=np.float32))
    shardkit.export.export(out, str(tmp_path / "t-%06d.tar"), progress=False)
    got = list(wds.WebDataset(str(tmp_path / "t-000000.tar"), shardshuffle=False))
    assert len(got) == 3
    for i, sample in enumerate(got):
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(sample["png"]))), pixels[i])
        assert int(sample["cls"]) == i % 2
        assert sample["caption.txt"].decode() == f"cap {i}"
        assert json.loads(sample["meta.json"]) == {"i": i}
        assert np.load(io.BytesIO(sample["boxes.npy"])).tolist() == [[1, 2, 10, 12]]
    pq = shardkit.export.export(out, str(tmp_path / "p-%02d.parquet"), to="parquet",
                                progress=False)
    ds = load_dataset("parquet", data_files=pq.files, split="train")
    assert ds["caption"] == ["cap 0", "cap 1", "cap 2"]
    assert [json.loads(m) for m in ds["meta"]] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert np.array_equal(np.asarray(ds[1]["image"]), pixels[1])


def test_bad_options_are_one_line(store, tmp_path, capsys):
    assert cli_main(["export", store, str(tmp_path / "x.tar"), "-q"]) == 1
    assert "must hold one integer field" in capsys.readouterr().err
    (tmp_path / "f").write_bytes(b"x")
    assert cli_main(["export", store, str(tmp_path / "f" / "no" / "x-%d.tar"), "-q"]) == 1
    assert f"{tmp_path / 'f'} is not a folder" in capsys.readouterr().err
    with pytest.raises(ValueError, match="`to` must be one of webdataset, parquet"):
        shardkit.export.export(store, str(tmp_path / "x-%d"), to="zip")


def test_a_symlink_planted_at_the_partial_name_is_never_written_through(store, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"not the export's")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / ".train-000000.tar.partial")
    with pytest.raises(shardkit.ShardkitError, match=r"\.train-000000\.tar\.partial is in the "
                                                     "way of the export's partial file"):
        shardkit.export.export(store, str(out / "train-%06d.tar"), progress=False)
    assert victim.read_bytes() == b"not the export's"
    assert os.path.islink(out / ".train-000000.tar.partial")
    assert not os.path.lexists(out / "train-000000.tar")
