"""Fields computed from a store's records after packing: ``shardkit.add_field`` / ``shardkit
map`` install them as a version, resume after a kill, and cover records appended later only
once computed again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

import shardkit
from shardkit import ShardDataset
from shardkit.cli import main
from shardkit.errors import StoreError
from shardkit.fields import Array


def _images(root, seed: int, classes: dict[str, int]) -> None:
    rng = np.random.default_rng(seed)
    for name, n in classes.items():
        os.makedirs(root / name, exist_ok=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (24, 28, 3), dtype=np.uint8)).save(
                root / name / f"s{seed}_{i}.png")


def mean_colour(batch):
    """One value per record: its mean over pixels, per channel (what an embedding stands for)."""
    images, _ = batch
    return images.float().mean(dim=(2, 3)).numpy()


def _expected(ds: ShardDataset) -> np.ndarray:
    return np.stack([ds[i][0].float().mean(dim=(1, 2)).numpy() for i in range(len(ds))])


@pytest.fixture()
def store(tmp_path):
    _images(tmp_path / "src", 0, {"a": 7, "b": 6})
    shardkit.pack(tmp_path / "src", tmp_path / "out", shard_size=4000, workers=1,
                  progress=False)
    return tmp_path


def test_a_field_added_later_reads_like_a_packed_one(store):
    out = store / "out"
    done = shardkit.add_field(out, "emb", mean_colour, batch_size=4, progress=False)
    assert (done.version, done.computed, done.resumed) == (2, 13, 0)
    assert done.field == Array("emb", [3], "float32")
    ds = ShardDataset(out, fields=["emb"])
    want = _expected(ShardDataset(out))
    got = np.stack([ds[i][1]["emb"].numpy() for i in range(len(ds))])
    np.testing.assert_array_equal(got, want)  # the same float32 values fn returned
    loader = ds.loader(batch_size=5, num_workers=1, multiprocessing_context="fork",
                       sampler=range(len(ds)))
    np.testing.assert_array_equal(np.concatenate([t["emb"].numpy() for _, t in loader]), want)
    with pytest.raises(Exception, match="emb"):
        ShardDataset(out, version=1, fields=["emb"])  # version 1 has no such field
    assert shardkit.verify(out).ok
    # A caption computed the same way, beside it, through the command line.
    assert main(["log", str(out)]) == 0


def test_a_killed_run_resumes_and_the_store_stays_as_it_was(store):
    out = store / "out"
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import shardkit
        from test_add_field import mean_colour
        calls = [0]
        def fn(batch):
            calls[0] += 1
            if calls[0] == 3:  # two batches computed and kept: killed while on the third
                os.kill(os.getpid(), signal.SIGKILL)
            return mean_colour(batch)
        shardkit.add_field({str(out)!r}, "emb", fn, batch_size=4, progress=False)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert ShardDataset(out).version == 1 and len(ShardDataset(out)) == 13
    calls = []

    def counting(batch):
        calls.append(len(batch[1]))
        return mean_colour(batch)

    done = shardkit.add_field(out, "emb", counting, batch_size=4, progress=False)
    assert (done.resumed, done.computed, sum(calls)) == (8, 5, 5)
    ds = ShardDataset(out, fields=["emb"])
    np.testing.assert_array_equal(np.stack([ds[i][1]["emb"].numpy() for i in range(13)]),
                                  _expected(ShardDataset(out)))
    assert not any(".field-" in n for n in os.listdir(store))  # the work folder is gone


def test_records_appended_later_need_the_field_computed_again(store):
    out = store / "out"
    shardkit.add_field(out, "emb", mean_colour, batch_size=8, progress=False)
    _images(store / "src", 1, {"b": 2, "c": 2})
    shardkit.pack(store / "src", out, append=True, workers=1, progress=False)
    ds = ShardDataset(out, fields=["emb"])
    new = ds.index_of("c/s1_0.png")
    with pytest.raises(StoreError, match="field 'emb' was added for the first 13 records"):
        ds[new]
    assert ds[ds.index_of("a/s0_0.png")][1]["emb"].shape == (3,)  # the others still read
    done = shardkit.add_field(out, "emb", mean_colour, batch_size=8, progress=False)
    assert (done.computed, done.version) == (4, 4)
    ds = ShardDataset(out, fields=["emb"])
    np.testing.assert_array_equal(np.stack([ds[i][1]["emb"].numpy() for i in range(len(ds))]),
                                  _expected(ShardDataset(out)))


def test_compact_drops_dead_records_and_keeps_every_value(store):
    out = store / "out"
    _images(store / "fix", 3, {"a": 1})
    os.rename(store / "fix" / "a" / "s3_0.png", store / "fix" / "a" / "s0_2.png")
    shardkit.update(out, replace=store / "fix", delete=["b/s0_1.png", "a/s0_4.png"],
                    set_labels={"a/s0_0.png": "b"}, workers=1, progress=False)
    shardkit.add_field(out, "emb", mean_colour, batch_size=8, progress=False)
    before = ShardDataset(out, fields=["emb"])
    want = {before.key(i): (before[i][0].numpy().tobytes(), before.targets[i],
                            before[i][1]["emb"].tolist()) for i in range(len(before))}
    raw = ShardDataset(out, output="bytes")
    stored = {raw.key(i): raw[i][0] for i in range(len(raw))}
    assert main(["compact", str(out), "-q"]) == 0
    ds = ShardDataset(out, fields=["emb"])
    assert ds.version == before.version + 1 and len(ds) == 11
    got = {ds.key(i): (ds[i][0].numpy().tobytes(), ds.targets[i], ds[i][1]["emb"].tolist())
           for i in range(len(ds))}
    assert got == want
    raw = ShardDataset(out, output="bytes")
    assert {raw.key(i): raw[i][0] for i in range(len(raw))} == stored  # copied, not re-encoded
    manifest = ds.store.meta
    assert "records" not in manifest and "added_fields" not in manifest
    assert sum(e["count"] for e in manifest["shards"]) == 11
    plain = ShardDataset(out)  # labels from the new shards themselves
    assert [plain[i][1] for i in range(len(plain))] == plain.targets.tolist()
    assert shardkit.verify(out).ok
