"""Packing from MosaicML MDS folders written by ``streaming.MDSWriter`` (in the side
environment: scripts/mds_side_env.sh), compared with packing the same images from their folder
and with what ``streaming.StreamingDataset`` reads from them."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import run_side, store_fields, store_records

import shardkit
from shardkit.cli import main as cli_main

WRITE = r"""
import json, sys
import numpy as np
from PIL import Image
from streaming import MDSWriter
spec = json.loads(sys.argv[1])
for out, columns, compression, rows in spec:
    with MDSWriter(out=out, columns=columns, compression=compression, size_limit=6000) as w:
        for row in rows:
            sample = dict(row)
            for key in ("image", "png", "pil"):
                if key in sample:
                    im = Image.open(sample[key])
                    sample[key] = im if key != "pil" else im.convert("RGB")
            if "boxes" in sample:  # n boxes of 4 float32
                sample["boxes"] = np.arange(4 * sample["boxes"], dtype=np.float32).reshape(-1, 4)
            if "pickled" in sample:
                sample["pickled"] = {"never": "loaded"}
            w.write(sample)
"""

READ = r"""
import json, sys
from streaming import StreamingDataset
out = []
for local in sys.argv[1:]:  # one interpreter for every folder: streaming takes seconds to import
    ds = StreamingDataset(local=local, shuffle=False, batch_size=1, allow_unsafe_types=True)
    out.append([{"label": int(ds[i]["label"]), "caption": ds[i]["caption"],
                 "meta": ds[i]["meta"], "boxes": ds[i]["boxes"].tolist(),
                 "dtype": str(ds[i]["boxes"].dtype)} for i in range(ds.size)])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def mds_sources(folder, mds_env, tmp_path_factory):
    root, samples = folder
    base = tmp_path_factory.mktemp("mds")
    jpgs = [(rel, lab) for rel, lab in samples if rel.endswith(".jpg")]
    pngs = [(rel, lab) for rel, lab in samples if rel.endswith(".png")]
    jpeg_cols = {"image": "jpeg", "label": "int", "caption": "str", "meta": "json",
                 "boxes": "ndarray", "pickled": "pkl"}
    rows = [{"image": os.path.join(root, rel), "label": lab, "caption": f"caption of {rel}",
             "meta": {"rel": rel}, "boxes": 1 + i % 3, "pickled": 1}
            for i, (rel, lab) in enumerate(jpgs)]
    png_rows = [{"png": os.path.join(root, rel), "pil": os.path.join(root, rel), "label": lab}
                for rel, lab in pngs]
    dirs = {name: str(base / name) for name in ("raw", "gz", "zstd", "png", "pil")}
    spec = [(dirs["raw"], jpeg_cols, None, rows), (dirs["gz"], jpeg_cols, "gz", rows),
            (dirs["zstd"], jpeg_cols, "zstd", rows),
            (dirs["png"], {"png": "png", "pil": "pil", "label": "int8"}, None, png_rows)]
    run_side(mds_env, WRITE, json.dumps(spec))
    return dirs, jpgs, pngs


def _by_source(store: str) -> dict[str, tuple]:
    return {r[4]: r[:4] for r in store_records(store)}


def test_mds_packs_as_its_folder_and_as_streaming_reads_it(mds_sources, mds_env, folder_store,
                                                           tmp_path):
    dirs, jpgs, pngs = mds_sources
    folder = _by_source(folder_store(64))
    assert len([n for n in os.listdir(dirs["raw"]) if n.endswith(".mds")]) > 1
    names = ("raw", "gz", "zstd")  # zstd: Streaming's default compression
    read = dict(zip(names, json.loads(run_side(mds_env, READ, *(dirs[n] for n in names)))))
    for name in names:
        out = str(tmp_path / f"{name}.lmdb")
        # worker processes for one (gz: for 0 and 2 workers below), this process for the others
        result = shardkit.pack(dirs[name], out, size=64, workers=2 if name == "zstd" else 0,
                               progress=False)
        assert result.count == len(jpgs)
        # the pkl column is named in the skip list, never decoded
        assert [(os.path.basename(s["path"]), s["reason"]) for s in result.skipped] == \
            [("index.json#pickled", "pickled column refused (never loaded)")]
        got = store_records(out)
        assert [r[:4] for r in got] == [folder[rel] for rel, _ in jpgs]
        theirs = read[name]
        assert [r[1] for r in got] == [t["label"] for t in theirs] == [lab for _, lab in jpgs]
        # str and json columns: typed fields, as streaming decodes them
        assert store_fields(out, "caption") == [t["caption"] for t in theirs]
        assert store_fields(out, "meta") == [t["meta"] for t in theirs]
        boxes = store_fields(out, "boxes")  # ndarray column: shape and dtype kept
        assert [b.tolist() for b in boxes] == [t["boxes"] for t in theirs]
        assert {str(b.dtype) for b in boxes} == {t["dtype"] for t in theirs} == {"float32"}
        assert shardkit.ShardDataset(out).classes == ["0", "1", "2"]  # no names in MDS
    for column in ("png", "pil"):  # a PNG column, and the same pixels as raw PIL values
        out = str(tmp_path / f"{column}.lmdb")
        shardkit.pack(dirs["png"], out, size=64, workers=1, image_key=column, progress=False)
        assert [r[:4] for r in store_records(out)] == [folder[rel] for rel, _ in pngs]


def test_mds_byte_identical_for_any_workers(mds_sources, tmp_path):
    dirs = mds_sources[0]
    outs = []
    for workers in (0, 2):  # in this process, and chunks over worker processes
        out = str(tmp_path / f"w{workers}.lmdb")
        shardkit.pack(dirs["gz"], out, size=32, workers=workers, progress=False)
        with open(out, "rb") as f:
            outs.append(f.read())
    assert outs[0] == outs[1]


def test_mds_index_pointing_outside_is_refused(mds_sources, tmp_path, capsys):
    hostile = str(tmp_path / "hostile")
    shutil.copytree(mds_sources[0]["raw"], hostile)
    with open(os.path.join(hostile, "index.json")) as f:
        index = json.load(f)
    index["shards"][0]["raw_data"]["basename"] = "../../etc/passwd"
    with open(os.path.join(hostile, "index.json"), "w") as f:
        json.dump(index, f)
    assert cli_main(["pack", hostile, str(tmp_path / "o.lmdb"), "-q"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "points outside its folder" in err
    index["shards"][0]["raw_data"]["basename"] = "shard.00000.mds"
    label = index["shards"][0]["column_names"].index("label")
    index["shards"][0]["column_encodings"][label] = "pkl"  # the label column pickled
    with open(os.path.join(hostile, "index.json"), "w") as f:
        json.dump(index, f)
    assert cli_main(["pack", hostile, str(tmp_path / "o.lmdb"), "-q"]) == 1
    assert "label column 'label' is pickled (pkl); refusing" in capsys.readouterr().err
