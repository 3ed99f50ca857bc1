"""Fields packed from an ImageFolder with a metadata file, a file list's extra columns and
same-stem caption files (pack -> verify -> read), and the collation of fields in every read
path (items, batches, threads, fork/spawn workers): ragged as lists, padded or packed."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from helpers import run_cli
from PIL import Image

import shardkit
from shardkit.errors import OptionError, PackError


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    base = tmp_path_factory.mktemp("meta")
    src = base / "src"
    rows = []
    rng = np.random.default_rng(4)
    for c in ("cat", "dog"):
        os.makedirs(src / c)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (40 + i, 50, 3), dtype=np.uint8)).save(
                src / c / f"{i}.jpg", quality=95)
            (src / c / f"{i}.txt").write_text(f"a {c}, number {i} \u00e9\n", encoding="utf-8")
            rows.append({"file_name": f"{c}/{i}.jpg", "tags": [c, "pet"] if i % 2 else ["pet"],
                         "score": i * 0.5, "meta": {"k": i, "c": c}, "emb": [i, -i, 0.5]})
    meta = base / "metadata.jsonl"
    meta.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(src), str(meta), rows


def test_metadata_and_captions_round_trip(folder, tmp_path):
    src, meta, rows = folder
    out = str(tmp_path / "m.lmdb")
    done = run_cli("pack", src, out, "--metadata", meta, "--captions", "--workers", "1", "-q")
    assert done.returncode == 0, done.stderr
    assert "fields (inferred" in done.stderr and "tags: multilabel" in done.stderr
    assert shardkit.verify(out).ok
    ds = shardkit.ShardDataset(out, fields=["label", "tags", "score", "meta", "emb", "caption"],
                               multi_hot=["tags"])
    assert ds.classes == ["cat", "dog"] and ds.targets.tolist() == [0] * 4 + [1] * 4
    for i, row in enumerate(rows):  # ImageFolder order is the metadata's order here
        target = ds[i][1]
        assert ds.source_path(i) == row["file_name"]
        assert target["label"] == (0 if row["file_name"].startswith("cat") else 1)
        hot = torch.zeros(3)
        hot[[["cat", "dog", "pet"].index(t) for t in row["tags"]]] = 1
        assert torch.equal(target["tags"], hot)
        assert target["score"] == row["score"] and target["meta"] == row["meta"]
        assert target["emb"].tolist() == row["emb"]
        name = row["file_name"].split("/")
        assert target["caption"] == f"a {name[0]}, number {name[1][0]} \u00e9"
        assert isinstance(target["caption"], str)
    indices = shardkit.ShardDataset(out, fields=["tags"])[1][1]["tags"]
    assert indices.tolist() == [0, 2]  # class indices unless multi-hot is asked for


def test_metadata_rows_must_match_the_images(folder, tmp_path):
    src, meta, rows = folder
    missing = tmp_path / "missing.jsonl"
    missing.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    with pytest.raises(PackError, match="no row for image 'cat/0.jpg'"):
        shardkit.pack(src, str(tmp_path / "a.lmdb"), metadata_file=str(missing), workers=1,
                      progress=False)
    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps(r) + "\n" for r in rows + [
        dict(rows[0], file_name="cat/ghost.jpg")]))
    with pytest.raises(PackError, match="ghost.jpg"):
        shardkit.pack(src, str(tmp_path / "b.lmdb"), metadata_file=str(extra), workers=1,
                      progress=False)
    twice = tmp_path / "twice.jsonl"
    twice.write_text("".join(json.dumps(r) + "\n" for r in rows + rows[:1]))
    with pytest.raises(PackError, match="two rows"):
        shardkit.pack(src, str(tmp_path / "c.lmdb"), metadata_file=str(twice), workers=1,
                      progress=False)


def test_file_list_extra_columns_and_csv_metadata(folder, tmp_path):
    src, _, rows = folder
    listing = tmp_path / "list.csv"
    listing.write_text("path,label,weight,note\n" + "".join(
        f"{r['file_name']},{n % 3},{n * 1.5},\"note, {n}\"\n" for n, r in enumerate(rows)))
    out = str(tmp_path / "l.lmdb")
    shardkit.pack(src, out, file_list=str(listing), workers=1, progress=False)
    ds = shardkit.ShardDataset(out, fields=["label", "weight", "note"])
    assert [ds[i][1] for i in range(3)] == [
        {"label": n % 3, "weight": n * 1.5, "note": f"note, {n}"} for n in range(3)]
    assert shardkit.verify(out).ok
    table = tmp_path / "meta.csv"
    table.write_text("file_name,count,vec\n" + "".join(
        f"{r['file_name']},{n},\"[{n}, {n + 1}]\"\n" for n, r in enumerate(rows)))
    out2 = str(tmp_path / "c.lmdb")
    shardkit.pack(src, out2, metadata_file=str(table), workers=1, progress=False)
    t = shardkit.ShardDataset(out2, fields=["count", "vec"])[5][1]
    assert t["count"] == 5 and t["vec"].tolist() == [5, 6]


def test_metadata_boxes_normalized_or_refused(folder, tmp_path):
    src, _, rows = folder
    table = tmp_path / "boxes.jsonl"
    table.write_text("".join(json.dumps({"file_name": r["file_name"],
                                         "box": [[0.25, 0.5, 0.5, 1.0]]}) + "\n" for r in rows))
    pixel = tmp_path / "pixel.json"
    pixel.write_text(json.dumps([{"name": "box", "kind": "boxes"}]))
    with pytest.raises(PackError, match="normalized=True"):
        shardkit.pack(src, str(tmp_path / "p.lmdb"), metadata_file=str(table),
                      schema=str(pixel), workers=1, progress=False)
    spec = tmp_path / "norm.json"
    spec.write_text(json.dumps([{"name": "box", "kind": "boxes", "normalized": True}]))
    out = str(tmp_path / "n.lmdb")
    shardkit.pack(src, out, metadata_file=str(table), schema=str(spec), workers=1,
                  progress=False, size=0)
    ds = shardkit.ShardDataset(out, fields=["box"], tv_tensors=False)
    image, target = ds[3]
    h, w = image.shape[1:]
    assert target["box"].tolist() == [[0.25 * w, 0.5 * h, 0.5 * w, 1.0 * h]]


def test_missing_caption_skips_the_image(folder, tmp_path):
    src, _, _ = folder
    import shutil

    copy = str(tmp_path / "src")
    shutil.copytree(src, copy)
    os.remove(os.path.join(copy, "dog", "2.txt"))
    result = shardkit.pack(copy, str(tmp_path / "c.lmdb"), captions=True, workers=1,
                           progress=False)
    assert result.count == 7 and "no caption file 2.txt" in result.skipped[0]["reason"]


@pytest.fixture(scope="module")
def detection(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("det")
    path = str(base / "d.lmdb")
    rng = np.random.default_rng(9)
    schema = [shardkit.fields.Boxes("boxes", format="CXCYWH", normalized=True),
              shardkit.fields.PerBox("labels"), shardkit.fields.Masks("masks"),
              shardkit.fields.Array("emb", (2,)), shardkit.fields.Text("caption")]
    with shardkit.StoreWriter(path, ["a"], schema=schema) as w:
        for i in range(10):
            h, wd = 240 + 3 * i, 300 - 2 * i
            k = i % 4
            boxes = np.column_stack([rng.uniform(0.3, 0.7, k), rng.uniform(0.3, 0.7, k),
                                     rng.uniform(0.05, 0.5, k), rng.uniform(0.05, 0.5, k)])
            masks = (rng.random((k, h, wd)) > 0.7).astype(np.uint8)
            w.add(rng.integers(0, 255, (h, wd, 3), dtype=np.uint8), 0, boxes=boxes,
                  labels=rng.integers(1, 9, k), masks=masks, emb=[i, 2 * i], caption=f"#{i}")
    return path


FIELDS = ["boxes", "labels", "masks", "emb", "caption"]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("sanitize", [False, True])
@pytest.mark.parametrize("ragged", ["list", "padded", "packed"])
def test_every_read_path_gives_the_same_batches(detection, ragged, sanitize):
    kw = dict(fields=FIELDS, crop=200, crop_mode="random_resized", flip=0.5, ragged=ragged,
              sanitize=sanitize, scale=(0.02, 0.3))  # small crops: boxes cut to slivers
    ds = shardkit.ShardDataset(detection, **kw)
    torch.manual_seed(3)
    batch = shardkit.collate(ds.__getitems__(list(range(10))))
    torch.manual_seed(3)
    items = [ds[i] for i in range(10)]
    from_items = shardkit.collate(items, ragged=ragged)
    assert _same(batch, from_items)
    torch.manual_seed(3)
    threaded = shardkit.ShardDataset(detection, threads=2, **kw)
    assert _same(shardkit.collate(threaded.__getitems__(list(range(10)))), batch)
    targets = batch[1]
    assert targets["emb"].shape == (10, 2) and targets["caption"] == [f"#{i}" for i in range(10)]
    lengths = [len(t["labels"]) for _, t in items]
    assert all(len(t["boxes"]) == n == len(t["masks"]) for (_, t), n in zip(items, lengths))
    if sanitize:  # every kept box passes SanitizeBoundingBoxes' rule, and some were dropped
        kept = torch.cat([t["boxes"] for _, t in items])
        assert ((kept[:, 2] - kept[:, 0] >= 1) & (kept[:, 3] - kept[:, 1] >= 1)).all()
        full = shardkit.ShardDataset(detection, fields=["boxes"])
        assert sum(lengths) < sum(len(full[i][1]["boxes"]) for i in range(10))
    if ragged == "list":
        assert [len(b) for b in targets["boxes"]] == lengths
    elif ragged == "padded":
        assert targets["boxes"].shape == (10, max(lengths), 4)
        assert targets["boxes_lengths"].tolist() == lengths
        assert targets["boxes_mask"].sum(1).tolist() == lengths
        assert targets["masks"].shape == (10, max(lengths), 200, 200)
    else:
        assert targets["boxes"].shape == (sum(lengths), 4)
        assert targets["boxes_batch"].tolist() == [i for i, n in enumerate(lengths)
                                                   for _ in range(n)]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_give_what_this_process_gives(detection, context):
    ds = shardkit.ShardDataset(detection, fields=FIELDS, crop=200, crop_mode="center",
                               ragged={"boxes": "padded", "masks": "list"})
    loader = ds.loader(batch_size=4, num_workers=2, multiprocessing_context=context,
                       persistent_workers=False)
    got = list(loader)
    want = [shardkit.collate(ds.__getitems__(list(range(s, min(s + 4, 10)))))
            for s in range(0, 10, 4)]
    assert len(got) == 3 and all(_same(list(a), list(b)) for a, b in zip(got, want))
    assert got[0][1]["boxes"].ndim == 3 and isinstance(got[0][1]["masks"], list)


def test_bad_read_options(detection):
    with pytest.raises(OptionError, match="not a field"):
        shardkit.ShardDataset(detection, fields=["nope"])
    with pytest.raises(OptionError, match="ragged"):
        shardkit.ShardDataset(detection, fields=["boxes"], ragged="stacked")
    with pytest.raises(OptionError, match="sanitize"):
        shardkit.ShardDataset(detection, fields=["caption"], sanitize=True)
    with pytest.raises(OptionError, match="multi_hot"):
        shardkit.ShardDataset(detection, fields=["boxes"], multi_hot=["boxes"])


def test_metadata_columns_some_rows_lack_are_optional(folder, tmp_path):
    """A JSON Lines key some rows lack (or hold null) and an empty CSV cell are absent values:
    every image is packed, the field None (or empty, ragged) where absent, batches as lists."""
    src, _, rows = folder
    notes = {1: "one", 4: None, 6: "six"}  # None: a JSON null; others: the key left out
    points = {0: [[0.5, 0.5]], 6: [[1, 2], [3, 4]]}
    meta = tmp_path / "meta.jsonl"
    meta.write_text("".join(json.dumps({"file_name": r["file_name"], "score": n,
                                        **({"note": notes[n]} if n in notes else {}),
                                        **({"points": points[n]} if n in points else {})}) + "\n"
                            for n, r in enumerate(rows)))
    out = str(tmp_path / "o.lmdb")
    done = run_cli("pack", src, out, "--metadata", str(meta), "--workers", "1", "-q")
    assert done.returncode == 0, done.stderr
    assert "note: text optional" in done.stderr
    assert shardkit.verify(out).ok
    ds = shardkit.ShardDataset(out, fields=["score", "note", "points"])
    assert len(ds) == len(rows)
    _, target = shardkit.collate(ds.__getitems__(list(range(len(rows)))))
    assert target["score"].tolist() == list(range(len(rows)))
    assert target["note"] == [notes.get(n) for n in range(len(rows))]
    assert [p.tolist() for p in target["points"]] == [points.get(n, []) for n in range(len(rows))]
    table = tmp_path / "meta.csv"
    table.write_text("file_name,weight\n" + "".join(
        f"{r['file_name']},{'' if n % 3 else n}\n" for n, r in enumerate(rows)))
    out2 = str(tmp_path / "c.lmdb")
    result = shardkit.pack(src, out2, metadata_file=str(table), workers=1, progress=False)
    assert (result.count, result.skipped) == (len(rows), [])
    got = shardkit.ShardDataset(out2, fields=["weight"])
    _, target = shardkit.collate(got.__getitems__(list(range(len(rows)))))
    assert target["weight"] == [None if n % 3 else n for n in range(len(rows))]  # a list
