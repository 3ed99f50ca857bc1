"""Hugging Face's imagefolder layout: each folder written here is loaded with the real
``datasets.load_dataset("imagefolder", data_dir=...)`` and packed; every record's file, pixels,
label and columns must agree, and what datasets keeps but cannot read (a missing file, a broken
image) or leaves out (an image no metadata row names) is listed as skipped, with the reason.
Also: kohya's ``N_name/`` folders with ``.txt``/``.caption`` sidecars, and the ImageFolder tree
without metadata, keep their rules."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import run_cli
from PIL import Image

import shardkit
from shardkit.errors import PackError, PackOptionError
from shardkit.packing.sources import detect

datasets = pytest.importorskip("datasets")


def png(path, seed: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (9 + seed % 4, 12, 3), dtype=np.uint8)).save(path)


def jsonl(path, rows) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Folders in the layouts datasets documents, by name."""
    base = tmp_path_factory.mktemp("hf")
    # flat: metadata.jsonl in row order (not file order), an image no row names, a row naming
    # a missing file, a broken image
    flat = base / "flat"
    for i, name in enumerate(["0.png", "1.png", "2.png", "3.png"]):
        png(flat / name, i)
    (flat / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    jsonl(flat / "metadata.jsonl", [
        {"file_name": "2.png", "text": "two, \u00e9", "score": 0.5, "extra": {"k": 2}},
        {"file_name": "0.png", "text": "zero", "score": 1.5, "extra": {"k": 0}},
        {"file_name": "broken.png", "text": "broken", "score": 2.0, "extra": {"k": 9}},
        {"file_name": "ghost.png", "text": "ghost", "score": 3.0, "extra": {"k": 8}},
        {"file_name": "./1.png", "text": "one", "score": 4.5, "extra": {"k": 1}}])
    # nested class folders, one metadata.csv naming files with their folder; images deeper
    # than others; a text column holding a number; an integer column with an empty cell
    nested = base / "nested"
    for i, rel in enumerate(["cat/0.png", "cat/1.png", "dog/0.png", "dog/deep/2.png"]):
        png(nested / rel, 10 + i)
    (nested / "metadata.csv").write_text(
        'file_name,text,note,count\n'
        'dog/0.png,"a dog, ""quoted""",12,3\n'
        'cat/0.png,a cat,x,\n'
        'dog/deep/2.png,deep dog,y,5\n'
        'cat/1.png,another cat,z,7\n', encoding="utf-8")
    # class folders, each with its own metadata.jsonl naming files without the folder
    per_folder = base / "per_folder"
    for c in ("cat", "dog"):
        for i in range(2):
            png(per_folder / c / f"{i}.png", 20 + i + (c == "dog") * 2)
        jsonl(per_folder / c / "metadata.jsonl",
              [{"file_name": f"{i}.png", "text": f"{c} {i}"} for i in (1, 0)])
    # train/ and test/ split folders with metadata.parquet and a label column
    import pyarrow as pa
    import pyarrow.parquet as pq

    splits = base / "splits"
    for split, rels in (("train", ["cat/a.png", "dog/b.png", "cat/c.png"]),
                        ("test", ["dog/d.png"])):
        for i, rel in enumerate(rels):
            png(splits / split / rel, 30 + i + len(split))
        pq.write_table(pa.table({
            "file_name": rels, "text": [f"{split} {r}" for r in rels],
            "label": [r.split("/")[0] for r in rels], "size": list(range(len(rels)))}),
            splits / split / "metadata.parquet")
    # no metadata: class folders under split folders (folder labels), and a flat folder
    labels = base / "labels"
    for i, rel in enumerate(["train/cat/x.png", "train/dog/y.png", "train/dog/z.png",
                             "test/dog/w.png"]):
        png(labels / rel, 40 + i)
    bare = base / "bare"
    for i in range(2):
        png(bare / f"img{i}.png", 50 + i)
    return {p.name: str(p) for p in (flat, nested, per_folder, splits, labels, bare)}


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hf-cache"))


def hf_records(data_dir: str, split: str, cache: str):
    """(features, records) as datasets loads them, each record's image as its path."""
    loaded = datasets.load_dataset("imagefolder", data_dir=data_dir, split=split,
                                   cache_dir=cache)
    features = loaded.features
    return features, loaded.cast_column("image", datasets.Image(decode=False)).to_list()


def assert_agrees(src: str, out: str, cache: str, split: str = "train", by_path: bool = False,
                  unread: tuple[str, ...] = (), **options) -> shardkit.ShardDataset:
    """Pack ``src`` and check it against datasets record by record (``by_path``: in any order;
    datasets' order of several metadata files of one split is a set's). ``unread``: the files
    of records datasets keeps but that have no image to read, skipped by the pack."""
    features, records = hf_records(src, split, cache)
    result = shardkit.pack(src, out, size=0, encoding="raw", workers=1, progress=False,
                           split=split, **options)
    assert shardkit.verify(out).ok
    names = [f["name"] for f in shardkit.ShardDataset(out).store.meta.get("fields") or []]
    ds = shardkit.ShardDataset(out, fields=names, tv_tensors=False)
    kept = [r for r in records if os.path.relpath(r["image"]["path"], src) not in unread]
    assert len(ds) == len(kept) == result.count
    ours = [(ds.source_path(i), ds[i], int(ds.targets[i])) for i in range(len(ds))]
    if by_path:
        ours.sort(key=lambda t: t[0])
        kept.sort(key=lambda r: os.path.relpath(r["image"]["path"], src))
    label = features.get("label")
    for (path, (image, target), y), record in zip(ours, kept):
        assert os.path.realpath(os.path.join(src, path)) == os.path.realpath(
            record["image"]["path"])
        with Image.open(record["image"]["path"]) as im:
            assert np.array_equal(image.permute(1, 2, 0).numpy(), np.asarray(im.convert("RGB")))
        columns = {k: v for k, v in record.items() if k not in ("image", "label")}
        if "text" in columns and "caption" not in columns:
            columns["caption"] = columns.pop("text")
        present = {k for k, v in target.items() if v is not None}  # an absent field: None
        assert present == {k for k, v in columns.items() if v is not None} | (
            {"caption"} if options.get("captions") and "caption" not in columns else set())
        for k, v in columns.items():
            assert target.get(k) == v, (path, k)
        if isinstance(label, datasets.ClassLabel):  # folder labels
            assert ds.classes == label.names and y == record["label"]
        elif "label" in record:  # a metadata column
            assert ds.classes[y] == str(record["label"])
        else:
            assert ds.classes == [] and y == -1
    return ds, result


def test_flat_metadata_jsonl(layouts, hf_cache, tmp_path):
    src = layouts["flat"]
    assert detect(src) == "imagefolder"
    ds, result = assert_agrees(src, str(tmp_path / "f.lmdb"), hf_cache,
                               unread=("ghost.png", "broken.png"))
    assert [ds.source_path(i) for i in range(len(ds))] == ["2.png", "0.png", "1.png"]
    reasons = {os.path.relpath(s["path"], src): s["reason"] for s in result.skipped}
    assert set(reasons) == {"ghost.png", "broken.png", "3.png"}
    assert "no such file (named by metadata.jsonl row 4" in reasons["ghost.png"]
    assert "no metadata row names it" in reasons["3.png"]
    assert "not a recognised image format" in reasons["broken.png"]


def test_nested_metadata_csv_with_folder_prefix(layouts, hf_cache, tmp_path):
    ds, _ = assert_agrees(layouts["nested"], str(tmp_path / "n.lmdb"), hf_cache)
    notes = [ds[i][1]["note"] for i in range(len(ds))]
    assert notes == ["12", "x", "y", "z"]  # a text column keeps "12" as text, as datasets does


def test_metadata_per_class_folder(layouts, hf_cache, tmp_path):
    assert_agrees(layouts["per_folder"], str(tmp_path / "p.lmdb"), hf_cache, by_path=True)


def test_split_folders_with_metadata_parquet(layouts, hf_cache, tmp_path):
    src = layouts["splits"]
    train, _ = assert_agrees(src, str(tmp_path / "train.lmdb"), hf_cache)
    assert train.classes == ["cat", "dog"] and train.targets.tolist() == [0, 1, 0]
    assert_agrees(src, str(tmp_path / "test.lmdb"), hf_cache, split="test")
    with pytest.raises(PackError, match=r"no split 'validation' .*\(splits: train, test\)"):
        shardkit.pack(src, str(tmp_path / "v.lmdb"), split="validation", progress=False)


def test_folder_labels_only_where_datasets_gives_them(layouts, hf_cache, tmp_path):
    src = layouts["labels"]
    # Without a metadata file the ImageFolder tree keeps torchvision's rules ...
    assert detect(src) == "folder"
    plain = shardkit.ShardDataset(shardkit.pack(src, str(tmp_path / "tv.lmdb"), size=0,
                                                workers=1, progress=False).out)
    assert plain.classes == ["test", "train"]
    with pytest.raises(PackOptionError, match="source_format='imagefolder'"):
        shardkit.pack(src, str(tmp_path / "x.lmdb"), split="test", progress=False)
    # ... and read as the imagefolder layout, the folder labels are datasets', over all splits.
    ds, _ = assert_agrees(src, str(tmp_path / "l.lmdb"), hf_cache, split="test",
                          source_format="imagefolder")
    assert ds.classes == ["cat", "dog"] and ds.targets.tolist() == [1]
    bare = layouts["bare"]
    assert detect(bare) == "imagefolder"
    assert_agrees(bare, str(tmp_path / "b.lmdb"), hf_cache)


def test_cli_packs_a_flat_folder_with_captions_or_metadata(layouts, tmp_path):
    """The flat folder ``--captions`` and ``--metadata`` used to refuse (no class folders)."""
    src = layouts["flat"]
    for flag in (["--captions"], ["--metadata", os.path.join(src, "metadata.jsonl")]):
        out = str(tmp_path / f"{len(flag)}.lmdb")
        done = run_cli("pack", src, out, *flag, "--workers", "1", "-q")
        assert done.returncode == 0, done.stderr
        assert "caption: text" in done.stderr and "skipped 3" in done.stderr
        ds = shardkit.ShardDataset(out, fields=["caption"])
        assert [ds[i][1]["caption"] for i in range(len(ds))] == ["two, \u00e9", "zero", "one"]
    done = run_cli("pack", src, str(tmp_path / "s.lmdb"), "--split", "test", "-q")
    assert done.returncode == 1 and "no split 'test'" in done.stderr and "--split" in done.stderr


def test_kohya_folders_with_txt_and_caption_sidecars(tmp_path):
    """kohya's ``N_name/`` folders: class folders (labels as ImageFolder's), a ``.txt`` or a
    ``.caption`` beside each image; two that differ skip the image with the reason."""
    src = tmp_path / "kohya"
    for i, rel in enumerate(["10_cat/a.png", "10_cat/b.png", "5_dog/c.png", "5_dog/d.png"]):
        png(src / rel, 60 + i)
    (src / "10_cat/a.txt").write_text("a cat\n", encoding="utf-8")
    (src / "10_cat/b.caption").write_text("b cat", encoding="utf-8")
    (src / "5_dog/c.txt").write_text("c dog", encoding="utf-8")
    (src / "5_dog/c.caption").write_text("c dog", encoding="utf-8")
    (src / "5_dog/d.txt").write_text("d dog", encoding="utf-8")
    (src / "5_dog/d.caption").write_text("another", encoding="utf-8")
    assert detect(str(src)) == "folder"
    result = shardkit.pack(str(src), str(tmp_path / "k.lmdb"), captions=True, workers=1,
                           progress=False)
    ds = shardkit.ShardDataset(result.out, fields=["caption"])
    assert ds.classes == ["10_cat", "5_dog"] and ds.targets.tolist() == [0, 0, 1]
    assert [ds[i][1]["caption"] for i in range(3)] == ["a cat", "b cat", "c dog"]
    assert [(os.path.basename(s["path"]), s["reason"]) for s in result.skipped] == [
        ("d.png", "annotation: two different captions: d.txt and d.caption")]


def test_metadata_file_outside_a_flat_folder_is_its_metadata(tmp_path):
    """A flat folder of images and ``metadata_file`` kept elsewhere: every row's columns become
    the records' fields (``file_name`` relative to SRC); none is dropped without a word."""
    src = tmp_path / "flat"
    for i in range(3):
        png(str(src / f"{i}.png"), i)
    meta = tmp_path / "elsewhere" / "rows.jsonl"
    meta.parent.mkdir()
    jsonl(meta, [{"file_name": f"{i}.png", "score": 10 * i, "text": f"t{i}"} for i in (2, 0)])
    out = str(tmp_path / "o.lmdb")
    result = shardkit.pack(str(src), out, metadata_file=str(meta), workers=1, progress=False)
    assert [s["reason"] for s in result.skipped] == [
        f"no metadata row names it ({meta}): datasets' imagefolder leaves it out"]
    ds = shardkit.ShardDataset(out, fields=["score", "caption"])
    assert [(ds[i][1]["score"], ds[i][1]["caption"]) for i in range(len(ds))] == [
        (20, "t2"), (0, "t0")]
