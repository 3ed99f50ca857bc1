"""``pack_shard``, one shard packed in this process (the unit of a Dask task): records are
encoded a batch at a time, then written (the stop check asked before each batch), a shard
stopped between batches leaves no file, and errors come as one record at a time gave them."""

from __future__ import annotations

import os

import pytest

from shardkit.errors import PackError
from shardkit.packing import local
from shardkit.packing import workers as encoders
from shardkit.packing.encoding import Encoded
from shardkit.packing.plan import make_plan
from shardkit.packing.settings import PackSettings
from shardkit.packing.sources import SourceOptions, resolve

from helpers import image_tree

N = 150  # 64 + 64 + 22


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("src"))
    image_tree(root, classes=3, per_class=N // 3, seed=2, sides=(8, 12))
    options = SourceOptions(root)
    folder = str(tmp_path_factory.mktemp("plan"))
    return make_plan(resolve(options).scan_into(options, folder), PackSettings(size=8), folder,
                     num_shards=1)


@pytest.fixture
def encoded(monkeypatch):
    """How many sources have been encoded so far (the real encoder, counted)."""
    count = [0]
    real = encoders.encode_file

    def counted(path, settings):
        count[0] += 1
        return real(path, settings)

    monkeypatch.setattr(encoders, "encode_file", counted)
    return count


def test_records_are_encoded_a_batch_at_a_time_and_the_stop_check_comes_between(
        plan, encoded, tmp_path):
    asked = []
    dest = str(tmp_path / "shard-00000.lmdb")
    entry = local.pack_shard(plan, 0, dest, stop=lambda: asked.append(encoded[0]) or False)
    assert asked == [0, 64, 128, 150]  # before each batch, and once more at the end
    assert (entry["count"], entry["skipped"]) == (N, [])


def test_a_batch_ends_at_its_byte_bound_and_batches_change_no_byte(plan, encoded, monkeypatch,
                                                                    tmp_path):
    batched = str(tmp_path / "batched.lmdb")
    local.pack_shard(plan, 0, batched)
    monkeypatch.setattr(local, "BATCH_BYTES", 1)  # every record is over it: batches of one
    asked = []
    single = str(tmp_path / "single.lmdb")
    local.pack_shard(plan, 0, single, stop=lambda: asked.append(encoded[0] - N) or False)
    assert asked == list(range(N + 1))
    with open(batched, "rb") as a, open(single, "rb") as b:
        assert a.read() == b.read()


def test_a_shard_stopped_between_batches_leaves_no_file(plan, encoded, tmp_path):
    dest = str(tmp_path / "shard-00000.lmdb")
    asked = []
    with pytest.raises(local.ShardStopped, match="shard 0"):
        local.pack_shard(plan, 0, dest, stop=lambda: asked.append(encoded[0]) or len(asked) == 2)
    assert asked == [0, 64]  # no record encoded after the check said stop
    assert not os.listdir(tmp_path)


def test_errors_come_in_the_order_one_record_at_a_time_gave(plan, monkeypatch, tmp_path):
    """Record 1 is rejected and reading record 4 raises (a URL out of retries, say): with
    ``strict`` the rejection's PackError comes and record 2 is never read; without it records
    0-3 are handed to the writer, then the read's error comes."""
    real = encoders.encode_file
    calls = []

    def faulty(path, settings):
        calls.append(path)
        if len(calls) == 2:
            return Encoded.rejected("forged rejection")
        if len(calls) == 5:
            raise RuntimeError("read failed")
        return real(path, settings)

    monkeypatch.setattr(encoders, "encode_file", faulty)
    with pytest.raises(PackError, match="forged rejection"):
        local.pack_shard(plan, 0, str(tmp_path / "strict.lmdb"), strict=True)
    assert len(calls) == 2
    calls.clear()
    added = []
    real_add = local.add_source
    monkeypatch.setattr(local, "add_source",
                        lambda writer, plan, source, *a: added.append(source) or
                        real_add(writer, plan, source, *a))
    with pytest.raises(RuntimeError, match="read failed"):
        local.pack_shard(plan, 0, str(tmp_path / "lenient.lmdb"))
    assert added == list(plan.rows(0)[0][0][:4])
