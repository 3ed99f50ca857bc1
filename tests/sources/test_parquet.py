"""Packing from Hugging Face parquet and ``save_to_disk`` folders written by ``datasets``,
compared with packing the same images from their folder and with ``datasets``' own reader."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import CLASSES, read_bytes, store_fields, store_files, store_records
from datasets import ClassLabel, Dataset, Features, Image, Value, load_dataset, load_from_disk

import shardkit
from shardkit.cli import main as cli_main


def hf_dataset(folder, label_feature=None) -> Dataset:
    root, samples = folder
    features = Features(image=Image(), label=label_feature or ClassLabel(names=CLASSES),
                        caption=Value("string"))
    return Dataset.from_dict({
        "image": [{"bytes": read_bytes(os.path.join(root, rel)), "path": None}
                  for rel, _ in samples],
        "label": [lab if label_feature is None else CLASSES[lab] for _, lab in samples],
        "caption": [f"caption of {rel}" for rel, _ in samples]}, features=features)


@pytest.fixture(scope="module")
def hub_folder(folder, tmp_path_factory) -> str:
    """The Hub's layout: data/train-0000N-of-00002.parquet, row groups of 5 rows."""
    out = tmp_path_factory.mktemp("hf") / "hub"
    (out / "data").mkdir(parents=True)
    ds = hf_dataset(folder)
    for k in range(2):
        ds.shard(2, k, contiguous=True).to_parquet(
            str(out / "data" / f"train-{k:05d}-of-00002.parquet"), batch_size=5)
    return str(out)


def test_parquet_packs_as_its_folder_and_as_datasets_reads_it(hub_folder, folder_store,
                                                              tmp_path):
    files = sorted(os.path.join(hub_folder, "data", n)
                   for n in os.listdir(os.path.join(hub_folder, "data")))
    assert pq.ParquetFile(files[0]).metadata.num_row_groups > 1  # read row group by row group
    out = str(tmp_path / "pq.lmdb")
    # in this process: worker processes give the same bytes (test_byte_identical_for_any_workers)
    result = shardkit.pack(hub_folder, out, size=64, workers=1, progress=False)
    assert result.count == 24 and result.skipped == []
    got = store_records(out)
    assert [r[:4] for r in got] == [r[:4] for r in store_records(folder_store(64))]
    ds = shardkit.ShardDataset(out)
    assert ds.classes == CLASSES  # the ClassLabel names from the schema metadata
    theirs = load_dataset("parquet", data_files=files, split="train")
    assert theirs.features["label"].names == ds.classes
    assert [r[1] for r in got] == theirs["label"]
    assert store_fields(out, "caption") == theirs["caption"]  # other columns: typed fields


def test_save_to_disk_folder_and_one_file(folder, folder_store, tmp_path):
    saved = str(tmp_path / "saved")
    hf_dataset(folder).save_to_disk(saved, max_shard_size="20KB")
    assert len([n for n in os.listdir(saved) if n.endswith(".arrow")]) > 1
    out = str(tmp_path / "saved.lmdb")
    shardkit.pack(saved, out, size=64, workers=2, progress=False)
    got = store_records(out)
    assert [r[:4] for r in got] == [r[:4] for r in store_records(folder_store(64))]
    assert [r[1] for r in got] == load_from_disk(saved)["label"]
    one = str(tmp_path / "one.parquet")
    hf_dataset(folder).to_parquet(one)
    shardkit.pack(one, str(tmp_path / "one.lmdb"), size=64, workers=1, progress=False)
    assert [r[:4] for r in store_records(str(tmp_path / "one.lmdb"))] == [r[:4] for r in got]


def test_string_labels_become_sorted_classes(folder, tmp_path):
    path = str(tmp_path / "s.parquet")
    hf_dataset(folder, label_feature=Value("string")).to_parquet(path)
    out = str(tmp_path / "s.lmdb")
    shardkit.pack(path, out, size=32, workers=1, progress=False)
    ds = shardkit.ShardDataset(out)
    assert ds.classes == sorted(CLASSES)
    assert list(ds.targets) == [lab for _, lab in folder[1]]


def test_byte_identical_for_any_workers(hub_folder, tmp_path):
    files = []
    for workers in (0, 3):
        out = str(tmp_path / f"w{workers}")
        shardkit.pack(hub_folder, out, size=32, workers=workers, num_shards=2, progress=False)
        files.append(store_files(out))
    assert files[0] == files[1]


def test_wrong_schema_is_refused_with_one_line(tmp_path, capsys):
    bad = str(tmp_path / "bad.parquet")
    pq.write_table(pa.table({"image": [1, 2], "label": [0, 1]}), bad)
    assert cli_main(["pack", bad, str(tmp_path / "o.lmdb"), "-q"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "image column 'image' is int64" in err
    nolabel = str(tmp_path / "nolabel.parquet")
    pq.write_table(pa.table({"image": [b"x"], "other": [0]}), nolabel)
    assert cli_main(["pack", nolabel, str(tmp_path / "o.lmdb"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "no label column" in err and "--label-key" in err


def test_rows_without_image_bytes_read_their_path_or_are_skipped(folder, tmp_path):
    root, samples = folder
    jpg = read_bytes(os.path.join(root, samples[0][0]))
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    path = str(tmp_path / "p.parquet")
    pq.write_table(pa.table({"image": pa.array([{"bytes": jpg, "path": None},
                                                {"bytes": None, "path": "/etc/passwd"},
                                                {"bytes": None, "path": "missing.jpg"},
                                                None], type=image),
                             "label": [0, 1, 1, 1]}), path)
    result = shardkit.pack(path, str(tmp_path / "p.lmdb"), size=0, workers=1, progress=False)
    assert result.count == 1
    assert [(os.path.basename(s["path"]), s["reason"]) for s in result.skipped] == [
        ("p.parquet#0:1", "not a recognised image format"),
        ("p.parquet#0:2", "cannot read image file 'missing.jpg': No such file or directory"),
        ("p.parquet#0:3", "no image bytes and no path (null)")]


def test_path_only_images_from_to_parquet_pack_as_their_folder(folder, folder_store, tmp_path,
                                                                monkeypatch):
    """``Dataset.to_parquet`` of image files writes only their paths ({bytes: null, path}): read
    relative to the parquet file's folder, or absolute, they pack as the folder does."""
    root, samples = folder
    monkeypatch.chdir(tmp_path)  # where datasets resolves the relative ones
    names = [os.path.join(root, rel) for rel, _ in samples]
    names = [p if k % 2 else os.path.relpath(p, tmp_path) for k, p in enumerate(names)]
    ds = Dataset.from_dict({"image": names, "label": [lab for _, lab in samples]},
                           features=Features(image=Image(), label=ClassLabel(names=CLASSES)))
    path = str(tmp_path / "paths.parquet")
    ds.to_parquet(path)
    stored = pq.read_table(path).column("image").to_pylist()
    assert [r["bytes"] for r in stored] == [None] * len(samples)  # datasets wrote paths only
    assert any(not os.path.isabs(r["path"]) for r in stored)
    out = str(tmp_path / "paths.lmdb")
    result = shardkit.pack(path, out, size=64, workers=1, progress=False)
    assert (result.count, result.skipped) == (len(samples), [])
    assert [r[:4] for r in store_records(out)] == [r[:4] for r in store_records(folder_store(64))]


def test_a_column_some_rows_lack_is_an_optional_field(folder, tmp_path):
    """Nulls in a ``datasets`` parquet (a caption, a score, a list per row) are absent values:
    every row is packed, each field where given, None or empty where null."""
    root, samples = folder
    samples = samples[:6]
    caption = ["a", None, "c", None, None, "f"]
    score = [None, 2, None, None, 5, None]
    points = [[[1.0, 2.0]], None, None, [[3.0, 4.0], [5.0, 6.0]], None, None]
    Dataset.from_dict(
        {"image": [{"bytes": read_bytes(os.path.join(root, rel)), "path": None}
                   for rel, _ in samples],
         "label": [lab for _, lab in samples], "caption": caption, "score": score,
         "points": points},
        features=Features(image=Image(), label=ClassLabel(names=CLASSES),
                          caption=Value("string"), score=Value("int64"),
                          points=[[Value("float32")]])).to_parquet(str(tmp_path / "o.parquet"))
    out = str(tmp_path / "o.lmdb")
    result = shardkit.pack(str(tmp_path / "o.parquet"), out, size=0, workers=1, progress=False)
    assert (result.count, result.skipped) == (6, [])
    assert store_fields(out, "caption") == caption and store_fields(out, "score") == score
    assert [p.tolist() for p in store_fields(out, "points")] == [p or [] for p in points]
    assert shardkit.verify(out).ok
