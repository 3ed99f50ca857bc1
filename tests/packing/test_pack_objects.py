"""``shardkit.pack``'s records (Resize, Buckets, Shards, Local, Dask, Nodes, shardkit.sources):
the same stores as the keyword shortcuts they replace, every old keyword still taken, a record
beside its own shortcut refused naming both, and each record checked where it is built."""

from __future__ import annotations

import inspect
import os
import shutil

import pytest

from helpers import image_tree
from helpers.scaleout import sha256, store_files
import shardkit
from shardkit import Buckets, Dask, Local, Nodes, Resize, Shards
from shardkit.errors import OptionError
from shardkit.packing.shortcuts import Shortcuts
from shardkit.sources import Captions, Coco, FileList, HFImageFolder, ImageFolder, WebDataset

#: every keyword ``pack`` took before it took records
OLD_KEYWORDS = {
    "format", "size", "quality", "encoding", "workers", "strict", "overwrite", "max_pixels",
    "allow_empty", "file_list", "coco", "coco_masks", "metadata_file", "captions", "schema",
    "shard_size", "num_shards", "resume", "engine", "scheduler", "num_nodes", "node_rank",
    "progress", "retries", "source_format", "image_key", "label_key", "storage_options",
    "order", "layout_seed", "buckets", "bucket_step", "bucket_upscale", "min_bucket_count",
    "split"}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("src") / "src")
    image_tree(root, classes=2, per_class=4, seed=5, pngs=1)
    return root


def test_the_signature_is_short_and_every_old_keyword_is_still_taken():
    params = inspect.signature(shardkit.pack).parameters
    assert len(params) <= 16
    named = {n for n, p in params.items() if p.kind is not p.VAR_KEYWORD}
    # Every old keyword is a parameter or a shortcut (shortcuts may be newer than the list).
    assert OLD_KEYWORDS - named <= set(Shortcuts.__annotations__)


@pytest.mark.parametrize("old, new", [
    ({"size": 40, "quality": 80, "encoding": "raw", "workers": 1},
     {"image": Resize(40, 80, "raw"), "engine": Local(1)}),
    ({"num_shards": 2, "order": "source", "workers": 1, "source_format": "folder"},
     {"shards": Shards(count=2, order="source"), "engine": "local", "source": ImageFolder()}),
    ({"buckets": 64, "bucket_step": 16, "bucket_upscale": True, "workers": 1, "shard_size": 4000,
      "layout_seed": 3},
     {"image": Buckets(64, step=16, upscale=True), "shards": Shards(size=4000, layout_seed=3),
      "engine": Local(workers=1)}),
])
def test_records_pack_the_store_their_shortcuts_pack(src, tmp_path, old, new):
    a, b = str(tmp_path / "old"), str(tmp_path / "new")
    if "num_shards" not in old and "shard_size" not in old:
        a, b = a + ".lmdb", b + ".lmdb"
    shardkit.pack(src, a, progress=False, **old)
    shardkit.pack(src, b, progress=False, **new)
    if os.path.isdir(a):
        assert store_files(a) == store_files(b)
    else:
        assert sha256(a) == sha256(b)


@pytest.mark.parametrize("kwargs, message", [
    ({"image": Resize(64), "size": 32}, "give `image` or `size`, not both"),
    ({"image": Buckets(256), "bucket_step": 32}, "give `image` or `bucket_step`, not both"),
    ({"shards": Shards(count=2), "num_shards": 3}, "give `shards` or `num_shards`, not both"),
    ({"engine": Local(2), "workers": 2}, "give `engine` or `workers`, not both"),
    ({"engine": Nodes(2, 0), "node_rank": 1}, "give `engine` or `node_rank`, not both"),
    ({"source": ImageFolder(), "coco": "ann.json"}, "give `source` or `coco`, not both"),
    ({"source": (WebDataset(), ImageFolder())}, "give `WebDataset` or `ImageFolder`, not both"),
    ({"coco_masks": False}, "`coco_masks` needs `coco`"),
])
def test_a_record_beside_its_shortcut_is_one_error_naming_both(src, tmp_path, kwargs, message):
    out = str(tmp_path / "out")
    with pytest.raises(OptionError) as info:
        shardkit.pack(src, out, progress=False, **kwargs)
    assert str(info.value) == message
    assert not os.path.exists(out)


def test_an_unknown_keyword_is_a_type_error(src, tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'shard_count'"):
        shardkit.pack(src, str(tmp_path / "out"), shard_count=2)


@pytest.mark.parametrize("build, message", [
    (lambda: Resize(-1), "`Resize.size` must be >= 0 (0 keeps the original size)"),
    (lambda: Resize(quality=101), "`Resize.quality` must be between 1 and 100"),
    (lambda: Buckets(256, encoding="webp"), "`Buckets.encoding` must be one of jpeg, raw"),
    (lambda: Buckets(256, step=0), "`Buckets.step` must be a positive integer, not 0"),
    (lambda: Shards(), "give `Shards.size` (bytes a shard) or `Shards.count` (shards)"),
    (lambda: Shards(size=1, count=2), "give `Shards.size` or `Shards.count`, not both"),
    (lambda: Shards(count=2, order="random"),
     "`Shards.order` must be one of 'mixed', 'source', not 'random'"),
    (lambda: Local("2"), "`Local.workers` must be an integer, not '2'"),
    (lambda: Dask("tcp://h:8786", workers=2),
     "give `Dask.workers` (local processes) or `Dask.scheduler` (a running cluster's workers), "
     "not both"),
    (lambda: Nodes(2, 2), "`Nodes.rank` must be in 0..`Nodes.count`-1"),
    (lambda: Coco(3), "`Coco.path` must be a path, not 3"),
    (lambda: Coco("a.json", masks="yes"), "`Coco.masks` must be True, False or None, got 'yes'"),
    (lambda: HFImageFolder(split=1), "`HFImageFolder.split` must be a split's name, got 1"),
    (lambda: WebDataset(image_key=["jpg"]), "`WebDataset.image_key` must be a string, not "
                                            "['jpg']"),
])
def test_each_record_is_checked_where_it_is_built(build, message):
    with pytest.raises(OptionError) as info:
        build()
    assert str(info.value) == message


def test_sources_combine_as_their_shortcuts_do(src, tmp_path):
    """A file list with captions: the tuple of records packs what file_list= and captions=
    pack."""
    root = str(tmp_path / "src")
    shutil.copytree(src, root)
    rows = [f"c{k % 2}/img{k // 2:03d}.jpg" for k in range(6)]
    listing = tmp_path / "list.csv"
    listing.write_text("".join(f"{row},{k % 2}\n" for k, row in enumerate(rows)))
    for k, row in enumerate(rows):
        with open(os.path.join(root, row[:-4] + ".txt"), "w") as f:
            f.write(f"caption {k}")
    a, b = str(tmp_path / "a.lmdb"), str(tmp_path / "b.lmdb")
    shardkit.pack(root, a, file_list=str(listing), captions=True, workers=1, progress=False)
    shardkit.pack(root, b, source=(FileList(listing), Captions()), engine=Local(1),
                  progress=False)
    assert sha256(a) == sha256(b)
    _, target = shardkit.ShardDataset(b, fields=["caption"])[5]
    assert target["caption"] == "caption 5"
