"""Records keyed by a column or member of their source (``id_key``): parquet written by pyarrow
with an ``id`` column, WebDataset tars written by webdataset's own writer; appends match records
by that key, whatever their row position."""

from __future__ import annotations

import io
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from PIL import Image

import shardkit
from helpers.versioned import by_key as _by_key
from shardkit import ShardDataset
from shardkit.cli import main as cli_main
from shardkit.errors import PackError, PackOptionError


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (12, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _parquet(path, ids: list) -> None:
    """Rows whose image is seeded by their id (a row is the same record wherever it sits)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table({"image": [_png(i if isinstance(i, int) else 0) for i in ids],
                             "label": [int(i) % 2 if isinstance(i, int) else 0 for i in ids],
                             "id": ids}), path, row_group_size=3)


@pytest.fixture(scope="module")
def keyed_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("idkey")
    _parquet(str(root / "first" / "a.parquet"), [10, 11, 12, 13])
    out = root / "out"
    shardkit.pack(root / "first", out, id_key="id", shard_size=2000, size=0, workers=1,
                  progress=False)
    return root, out


def test_keys_are_the_id_column_and_info_says_so(keyed_store, capsys):
    _, out = keyed_store
    ds = ShardDataset(out)
    assert sorted(ds.key(i) for i in range(len(ds))) == ["10", "11", "12", "13"]
    i = ds.index_of("12")
    assert ds.key(i) == "12" and ds.targets[i] == 0
    assert shardkit.info(out)["keys"] == "column id of the source (id_key)"
    assert cli_main(["info", str(out)]) in (0, None)
    assert "(keys: column id of the source (id_key))" in capsys.readouterr().out


def test_append_adds_only_new_ids_wherever_old_rows_moved(keyed_store, tmp_path):
    root, out = keyed_store
    grown = tmp_path / "grown"
    shutil.copytree(out, grown)
    before = _by_key(ShardDataset(grown))
    # old ids 12 and 10 at other row positions, new ids 14 and 15 between them
    _parquet(str(tmp_path / "second" / "b.parquet"), [12, 14, 10, 15])
    result = shardkit.pack(tmp_path / "second", grown, append=True, workers=1, progress=False)
    assert result.count == 2
    after = _by_key(ShardDataset(grown))
    assert sorted(after) == ["10", "11", "12", "13", "14", "15"]
    assert {k: after[k] for k in before} == before
    # the same key option by hand is accepted; another is refused naming both
    with pytest.raises(PackOptionError, match=r"id_key='label' \(the store: 'id'\)"):
        shardkit.pack(tmp_path / "second", grown, append=True, id_key="label", workers=1,
                      progress=False)


def test_append_by_path_to_a_keyed_store_is_refused(keyed_store, tmp_path):
    _, out = keyed_store
    folder = tmp_path / "imgs" / "c"
    folder.mkdir(parents=True)
    (folder / "x.png").write_bytes(_png(1))
    with pytest.raises(PackOptionError, match="`id_key`.*'folder'"):
        shardkit.pack(tmp_path / "imgs", out, append=True, workers=1, progress=False)


def test_duplicate_id_is_one_line_naming_both_rows(tmp_path):
    _parquet(str(tmp_path / "src" / "a.parquet"), [1, 2, 3, 2])
    with pytest.raises(PackError) as err:
        shardkit.pack(tmp_path / "src", tmp_path / "o.lmdb", id_key="id", workers=1,
                      progress=False)
    message = str(err.value)
    assert "\n" not in message and "key '2'" in message
    assert "a.parquet#1:0" in message and "a.parquet#0:1" in message


def test_null_or_unusable_ids_are_skipped_with_reason(tmp_path):
    _parquet(str(tmp_path / "src" / "a.parquet"), ["a", None, "../b", "c/d"])
    result = shardkit.pack(tmp_path / "src", tmp_path / "o.lmdb", id_key="id", workers=1,
                           progress=False)
    assert sorted(ShardDataset(tmp_path / "o.lmdb").key(i) for i in range(2)) == ["a", "c/d"]
    assert shardkit.info(tmp_path / "o.lmdb")["keys"] == "column id of the source (id_key)"
    reasons = {os.path.basename(s["path"]): s["reason"] for s in result.skipped}
    assert reasons["a.parquet#0:1"] == "id: no key (null)"
    assert "not usable as a key" in reasons["a.parquet#0:2"]


def test_a_missing_or_float_key_column_is_refused(tmp_path):
    _parquet(str(tmp_path / "src" / "a.parquet"), [1, 2])
    with pytest.raises(PackError, match="no key column 'uid'"):
        shardkit.pack(tmp_path / "src", tmp_path / "o.lmdb", id_key="uid", workers=1,
                      progress=False)
    pq.write_table(pa.table({"image": [_png(0)], "label": [0], "id": [1.5]}),
                   str(tmp_path / "src" / "a.parquet"))
    with pytest.raises(PackError, match="'id'.*is double, not integers or strings"):
        shardkit.pack(tmp_path / "src", tmp_path / "o.lmdb", id_key="id", workers=1,
                      progress=False)


def test_webdataset_keyed_by_sample_key_or_member(tmp_path):
    src = tmp_path / "wds"
    src.mkdir()
    with wds.TarWriter(str(src / "a.tar")) as sink:
        for i in range(3):
            sink.write({"__key__": f"s{i}", "png": _png(i), "cls": str(i % 2),
                        "uid": f"u-{10 + i}\n"})
    by_sample = tmp_path / "k.lmdb"
    shardkit.pack(src, by_sample, source=shardkit.sources.WebDataset(id_key="__key__"),
                  workers=1, progress=False)
    ds = ShardDataset(by_sample)
    assert [ds.key(i) for i in range(3)] == ["s0", "s1", "s2"]
    by_member = tmp_path / "m.lmdb"
    assert cli_main(["pack", str(src), str(by_member), "--id-key", "uid", "--workers", "1",
                     "--quiet"]) in (0, None)
    ds = ShardDataset(by_member)
    assert sorted(ds.key(i) for i in range(3)) == ["u-10", "u-11", "u-12"]
    assert ds.targets[ds.index_of("u-11")] == 1
