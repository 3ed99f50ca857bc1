"""Packing from LitData optimized folders written by litdata's own ``BinaryWriter`` (in the side
environment: scripts/litdata_side_env.sh), compared with packing the same images from their
folder; pickled leaves refuse the folder without being loaded."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_side, store_fields, store_records

import shardkit
from shardkit.errors import PackError

WRITE = r"""
import json, sys
from PIL import Image
from litdata.streaming.writer import BinaryWriter
for out, rows in json.loads(sys.argv[1]):
    w = BinaryWriter(out, chunk_size=5)
    for i, row in enumerate(rows):
        sample = dict(row)
        if "image" in sample:  # a JpegImageFile: its file's bytes are stored (jpeg)
            sample["image"] = Image.open(sample["image"])
        if "pil" in sample:  # raw pixels and mode (pil)
            sample["pil"] = Image.open(sample["pil"]).convert("RGB")
        if "pickled" in sample:
            sample["pickled"] = {"a set", "is pickled"}  # no other serializer takes it
        w[i] = sample
    w.done()
    w.merge()
"""


@pytest.fixture(scope="module")
def litdata_folders(folder, litdata_env, tmp_path_factory):
    root, samples = folder
    base = tmp_path_factory.mktemp("litdata")
    jpgs = [(rel, lab) for rel, lab in samples if rel.endswith(".jpg")]
    pngs = [(rel, lab) for rel, lab in samples if rel.endswith(".png")]
    spec = [
        (str(base / "jpeg"), [{"image": os.path.join(root, rel), "label": lab,
                               "caption": f"caption of {rel}"} for rel, lab in jpgs]),
        (str(base / "pil"), [{"pil": os.path.join(root, rel), "label": f"c{lab}"}
                             for rel, lab in pngs]),
        (str(base / "pickled"), [{"image": os.path.join(root, rel), "label": lab, "pickled": 1}
                                 for rel, lab in jpgs[:2]]),
    ]
    run_side(litdata_env, WRITE, json.dumps(spec))
    return {name: str(base / name) for name in ("jpeg", "pil", "pickled")}, jpgs, pngs


def test_optimized_folder_packs_as_its_folder(litdata_folders, folder_store, tmp_path):
    """jpeg leaves keep the files' bytes: every record, label and size equals the folder's (an
    int label, a str leaf as a field); pil leaves (raw pixels) give the PNGs' records, their
    str labels the sorted classes."""
    folders, jpgs, pngs = litdata_folders
    reference = {os.path.relpath(p, os.path.dirname(os.path.dirname(p))): tuple(r)
                 for *r, p in store_records(folder_store(64))}
    out = str(tmp_path / "jpeg.lmdb")
    result = shardkit.pack(folders["jpeg"], out, size=64, workers=1, progress=False)
    assert result.count == len(jpgs) and result.skipped == []
    records = store_records(out)
    assert [r[:4] for r in records] == [reference[rel] for rel, _ in jpgs]
    assert store_fields(out, "caption") == [f"caption of {rel}" for rel, _ in jpgs]
    assert records[0][4].endswith("chunk-0-0.bin#0")

    out = str(tmp_path / "pil.lmdb")
    result = shardkit.pack(folders["pil"], out, size=64, workers=1, progress=False)
    assert result.count == len(pngs)
    assert [r[:4] for r in store_records(out)] == [reference[rel] for rel, _ in pngs]
    assert shardkit.ShardDataset(out).classes == sorted({f"c{lab}" for _, lab in pngs})


def test_pickled_leaf_refuses_the_folder_in_one_line(litdata_folders, tmp_path):
    folders, _, _ = litdata_folders
    with pytest.raises(PackError, match="leaf 'pickled' uses the 'pickle' serializer") as info:
        shardkit.pack(folders["pickled"], str(tmp_path / "p.lmdb"), workers=1, progress=False)
    assert "\n" not in str(info.value)
    assert not os.path.exists(tmp_path / "p.lmdb")
