"""A folder store that grows: ``pack(..., append=True)`` adds the sources it lacks as its next
version; readers pin versions; ``shardkit log`` / ``gc``; keys."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import shardkit
from helpers.versioned import by_key, write_images
from shardkit import ShardDataset, ShardSampler
from shardkit.cli import main
from shardkit.errors import OptionError, PackError, PackOptionError, StoreError


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A store packed from 2 classes, then appended twice (a new class each time, one file
    that is not an image), and a fresh pack of the same union."""
    root = tmp_path_factory.mktemp("append")
    src, out = root / "src", root / "out"
    write_images(src, 0, {"cat": 5, "dog": 4})
    shardkit.pack(src, out, shard_size=6000, workers=1, progress=False)
    before = by_key(ShardDataset(out))
    write_images(src, 1, {"ant": 3, "dog": 3})
    (src / "dog" / "broken.jpg").write_bytes(b"not an image")
    first = shardkit.pack(src, out, append=True, workers=1, progress=False)
    write_images(src, 2, {"bee": 2})
    second = shardkit.pack(src, out, append=True, workers=1, progress=False)
    fresh = root / "fresh"
    shardkit.pack(src, fresh, shard_size=6000, workers=1, progress=False)
    return {"src": src, "out": out, "fresh": fresh, "before": before,
            "results": (first, second)}


def test_append_equals_a_fresh_pack_of_the_union(grown):
    out = grown["out"]
    first, second = grown["results"]
    assert (first.count, second.count) == (6, 2)  # only what the store lacked
    assert [os.path.relpath(s["path"], grown["src"]) for s in first.skipped] == [
        "dog/broken.jpg"]
    ds, fresh = ShardDataset(out), ShardDataset(grown["fresh"])
    # The store's classes keep their indices; new ones follow, in the order they came.
    assert ds.classes == ["cat", "dog", "ant", "bee"]
    assert fresh.classes == ["ant", "bee", "cat", "dog"]
    assert by_key(ds) == by_key(fresh)  # same records, pixels and classes, per key
    assert ds.version == 3
    assert [os.path.relpath(s["path"], grown["src"]) for s in ds.store.skipped] == [
        "dog/broken.jpg"]
    # Version 1 is still the store as first packed.
    assert by_key(ShardDataset(out, version=1)) == grown["before"]
    # The targets agree with the records' labels in every version.
    for v in (1, 2, 3):
        old = ShardDataset(out, version=v)
        assert [old[i][1] for i in range(len(old))] == old.targets.tolist()


def _labels_by_key(ds) -> dict[str, int]:
    return {ds.key(i): int(ds[i][1]) for i in range(len(ds))}


def test_relabel_numbers_the_classes_as_a_fresh_pack(grown, tmp_path, capsys):
    """``update --relabel`` (and ``pack --append --relabel``): a new version whose classes and
    label indices are a fresh pack's of the same images; the version before keeps its own."""
    out = tmp_path / "store"
    shutil.copytree(grown["out"], out)
    fresh = ShardDataset(grown["fresh"])
    pinned = ShardDataset(out)
    v3 = _labels_by_key(pinned)
    assert main(["pack", str(grown["src"]), str(out), "--relabel"]) != 0
    assert "--relabel numbers an appended store's classes afresh" in capsys.readouterr().err
    assert main(["update", str(out), "--relabel"]) == 0
    assert "4 classes renumbered" in capsys.readouterr().err
    ds = ShardDataset(out)
    assert ds.version == 4 and ds.classes == fresh.classes == ["ant", "bee", "cat", "dog"]
    assert _labels_by_key(ds) == _labels_by_key(fresh)
    assert by_key(ds) == by_key(fresh) and ds.targets.tolist() == [ds[i][1] for i in
                                                                    range(len(ds))]
    assert _labels_by_key(pinned) == v3 and pinned.classes == ["cat", "dog", "ant", "bee"]
    assert main(["verify", str(out)]) == 0
    again = shardkit.update(out, relabel=True)
    assert (again.version, again.reordered) == (4, 0)  # already in name order: no version
    # An append adds its new class last; --relabel then numbers it in name order.
    src = tmp_path / "src"
    shutil.copytree(grown["src"], src)
    write_images(src, 3, {"bat": 2})
    capsys.readouterr()
    assert main(["pack", str(src), str(out), "--append", "--relabel", "--workers", "1",
                 "--quiet"]) == 0
    assert "version 6, 4 classes renumbered in name order" in capsys.readouterr().err
    ds = ShardDataset(out)
    assert ShardDataset(out, version=5).classes == ["ant", "bee", "cat", "dog", "bat"]
    assert ds.classes == ["ant", "bat", "bee", "cat", "dog"]
    union = shardkit.pack(src, tmp_path / "union", shard_size=6000, workers=1, progress=False)
    assert _labels_by_key(ds) == _labels_by_key(ShardDataset(union.out))
    assert [v.change.get("classes_reordered") for v in shardkit.storelog.history(str(out))] \
        == [None, None, None, 4, None, 4]


def test_append_refuses_what_it_cannot_add(grown, tmp_path):
    out = tmp_path / "store"
    shutil.copytree(grown["out"], out)
    with pytest.raises(PackError, match="nothing to append"):
        shardkit.pack(grown["src"], out, append=True, workers=1, progress=False)
    with pytest.raises(PackOptionError, match=r"size=128 \(the store: 256\)"):
        shardkit.pack(grown["src"], out, append=True, size=128, workers=1, progress=False)
    with pytest.raises(PackOptionError, match="needs an existing folder store"):
        shardkit.pack(grown["src"], tmp_path / "none", append=True, progress=False)
    single = tmp_path / "one.lmdb"
    shardkit.pack(grown["src"], single, workers=1, progress=False)
    with pytest.raises(PackOptionError, match="needs an existing folder store"):
        shardkit.pack(grown["src"], single, append=True, progress=False)
    # A failed append (strict: the broken file) leaves the store as it was.
    write_images(tmp_path / "more", 5, {"cat": 2})
    (tmp_path / "more" / "cat" / "zz.jpg").write_bytes(b"broken")
    with pytest.raises(PackError):
        shardkit.pack(tmp_path / "more", out, append=True, strict=True, workers=1,
                      progress=False)
    assert ShardDataset(out).version == 3 and len(ShardDataset(out)) == 17


def test_a_reader_keeps_its_version_while_new_ones_are_installed(grown, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    shutil.copytree(grown["src"], src)
    shutil.copytree(grown["out"], out)
    made = ShardDataset(out)  # made at version 3, first read after 4 and 5 exist
    used = ShardDataset(out, version=2)
    v2 = by_key(used)
    write_images(src, 7, {"cat": 2})
    shardkit.pack(src, out, append=True, workers=1, progress=False)
    write_images(src, 8, {"eel": 2})
    shardkit.pack(src, out, append=True, workers=1, progress=False)
    shardkit.update(out, delete=["cat/s0_0.jpg"])
    shardkit.compact(out, progress=False)  # versions 6 and 7: new shards, the dead one dropped
    assert made.version == 3 and len(made) == 17
    assert by_key(made) == by_key(ShardDataset(grown["out"]))
    assert ShardDataset(out).version == 7 and len(ShardDataset(out)) == 20
    # gc keeps what a reader holds: version 2 is dropped, its files stay while `used` reads.
    assert main(["gc", str(out), "--keep", "1"]) == 0
    assert not os.path.exists(out / "versions" / "2.json")
    assert by_key(used) == v2
    with pytest.raises(StoreError, match="has no version 2 \\(kept: 7"):
        ShardDataset(out, version=2)
    used.close()
    made.close()
    shardkit.storelog.gc(str(out), 1)
    manifest = json.loads((out / "manifest.json").read_bytes())
    named = {e["file"] for e in manifest["shards"]} | {manifest["labels"]["file"],
                                                        manifest["layout"]["file"]}
    left = {n for n in os.listdir(out) if not n.startswith((".", "versions"))}
    assert left == named | {"manifest.json"}  # old labels/layout files are gone
    assert len(ShardDataset(out)) == 20


def test_keys_and_log(grown, capsys):
    ds = ShardDataset(grown["out"])
    for i in range(len(ds)):
        assert ds.index_of(ds.key(i)) == i
    assert ds.key(ds.index_of("bee/s2_1.jpg")) == "bee/s2_1.jpg"
    with pytest.raises(KeyError):
        ds.index_of("dog/broken.jpg")
    assert main(["log", str(grown["out"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["1", "2", "3"]
    assert "append (added 6, classes_added 1, skipped 1)" in lines[1]
    assert main(["info", str(grown["out"])]) == 0
    assert "version:    3" in capsys.readouterr().out


def test_a_sampler_state_names_its_version(grown):
    out = grown["out"]
    sampler = ShardSampler(ShardDataset(out, version=2), num_replicas=1, rank=0)
    state = json.loads(json.dumps(sampler.state_dict(consumed=4)))
    with pytest.raises(OptionError, match="saved store_version=\\[2\\].*version=N"):
        ShardSampler(ShardDataset(out), num_replicas=1, rank=0).load_state_dict(state)
    again = ShardSampler(ShardDataset(out, version=2), num_replicas=1, rank=0)
    again.load_state_dict(state)
    assert list(again) == list(sampler)[4:]
    assert (ShardDataset(out, version=2).targets == ShardDataset(out).targets[:15]).all()


def test_update_deletes_relabels_and_replaces_without_rewriting_shards(grown, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    shutil.copytree(grown["src"], src)
    shutil.copytree(grown["out"], out)
    shards_before = {n: os.stat(out / n).st_ino for n in os.listdir(out) if n.startswith("shard")}
    v3 = by_key(ShardDataset(out))
    # New pixels for two keys (one in the first pack, one appended), in a folder of their own.
    fix = tmp_path / "fix"
    write_images(fix, 9, {"cat": 1, "ant": 1})
    os.rename(fix / "cat" / "s9_0.jpg", fix / "cat" / "s0_1.jpg")
    os.rename(fix / "ant" / "s9_0.jpg", fix / "ant" / "s1_2.jpg")
    (tmp_path / "gone.txt").write_text("dog/s0_0.jpg\nbee/s2_0.jpg\n")
    (tmp_path / "labels.csv").write_text("key,label\ncat/s0_2.jpg,dog\ndog/s1_0.jpg,fish\n")
    assert main(["update", str(out), "--replace", str(fix), "--delete",
                 str(tmp_path / "gone.txt"), "--set-labels", str(tmp_path / "labels.csv"),
                 "-q"]) == 0
    ds = ShardDataset(out)
    assert ds.version == 5  # replace, then delete + relabel
    now = by_key(ds)
    assert set(now) == set(v3) - {"dog/s0_0.jpg", "bee/s2_0.jpg"}
    fresh = ShardDataset(shardkit.pack(fix, tmp_path / "fresh", workers=1, progress=False).out)
    assert now["cat/s0_1.jpg"] == by_key(fresh)["cat/s0_1.jpg"] != v3["cat/s0_1.jpg"]
    assert now["ant/s1_2.jpg"][0] == by_key(fresh)["ant/s1_2.jpg"][0]
    assert now["cat/s0_2.jpg"] == (v3["cat/s0_2.jpg"][0], "dog")
    assert now["dog/s1_0.jpg"] == (v3["dog/s1_0.jpg"][0], "fish")
    untouched = set(now) - {"cat/s0_1.jpg", "ant/s1_2.jpg", "cat/s0_2.jpg", "dog/s1_0.jpg"}
    assert {k: now[k] for k in untouched} == {k: v3[k] for k in untouched}
    assert [ds[i][1] for i in range(len(ds))] == ds.targets.tolist()
    assert ds.classes[-1] == "fish" and ds.classes[:4] == ["cat", "dog", "ant", "bee"]
    # No shard was rewritten: the same files, and one more for the two new images.
    after = {n: os.stat(out / n).st_ino for n in os.listdir(out) if n.startswith("shard")}
    assert {n: after[n] for n in shards_before} == shards_before and len(after) == \
        len(shards_before) + 1
    assert by_key(ShardDataset(out, version=3)) == v3
    assert shardkit.verify(out).ok
    # A worker process reads the version as the parent does; a subset composes with it.
    loader = ShardDataset(out, crop=24).loader(batch_size=4, num_workers=1,
                                               multiprocessing_context="fork")
    assert sorted(int(y) for _, ys in loader for y in ys) == sorted(ds.targets.tolist())
    sub = ds.subset([0, len(ds) - 1])
    assert [sub.key(0), sub.key(1)] == [ds.key(0), ds.key(len(ds) - 1)]
    # A deleted key can be appended again; unknown keys are refused.
    with pytest.raises(PackError, match="not in .*first: 'dog/s0_0.jpg'"):
        shardkit.update(out, delete=["dog/s0_0.jpg"])
    assert shardkit.pack(src, out, append=True, workers=1, progress=False).count == 2
    assert by_key(ShardDataset(out))["dog/s0_0.jpg"] == v3["dog/s0_0.jpg"]


def test_verify_checks_every_kept_version(grown, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(grown["out"], out)
    assert shardkit.verify(out).ok
    first = json.loads((out / "versions" / "1.json").read_bytes())["labels"]["file"]
    assert first != ShardDataset(out).store.meta["labels"]["file"]  # only version 1 reads it
    data = bytearray((out / first).read_bytes())
    data[-1] ^= 1
    (out / first).write_bytes(bytes(data))
    faults = shardkit.verify(out).faults
    assert len(faults) == 1 and faults[0].startswith("version 1:") and "checksum" in faults[0]


def test_a_killed_append_leaves_the_store_and_resume_finishes_it(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    src, out = tmp_path / "src", tmp_path / "out"
    write_images(src, 0, {"cat": 3})
    shardkit.pack(src, out, shard_size=1, workers=1, progress=False)
    write_images(src, 4, {"dog": 60})
    partial = tmp_path / ".out.partial"
    proc = subprocess.Popen([sys.executable, "-c", (
        "import shardkit; shardkit.pack(%r, %r, append=True, shard_size=1, workers=1, "
        "progress=False)" % (str(src), str(out)))])
    try:
        deadline = time.monotonic() + 120
        while not (partial.is_dir() and any(n.endswith(".done.json")
                                            for n in os.listdir(partial))):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL  # killed while packing, not after
    ds = ShardDataset(out)
    assert (ds.version, len(ds)) == (1, 3)  # the store as it was, readable
    done = shardkit.pack(src, out, append=True, resume=True, shard_size=1, workers=1,
                         progress=False)
    assert done.kept_shards >= 1 and done.count == 60
    fresh = shardkit.pack(src, tmp_path / "fresh", workers=1, progress=False)
    assert by_key(ShardDataset(out)) == by_key(ShardDataset(fresh.out))


def test_an_overwrite_of_a_store_with_versions_is_its_next_version(grown, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(grown["out"], out)
    shardkit.pack(grown["src"], out, shard_size=6000, workers=1, progress=False,
                  overwrite=True)
    assert ShardDataset(out).version == 4
    assert [v.change["kind"] for v in shardkit.storelog.history(str(out))] == [
        "pack", "append", "append", "overwrite"]
    assert by_key(ShardDataset(out, version=1)) == grown["before"]
    assert by_key(ShardDataset(out)) == by_key(ShardDataset(grown["fresh"]))
