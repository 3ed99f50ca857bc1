"""Interrupted sharded packs: SIGKILL / Ctrl-C after some shards finished, then --resume (or not).

The pack is stopped at a known point without timing races: it runs under
tests/helpers/programs/blocking_pack.py, where encoding one source (inside shard 2) never
finishes, so shards 0 and 1 are done and the rest are not when the test kills it. The resumed
run is the plain CLI.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

import shardkit
from shardkit.cli import main as cli_main
from shardkit.errors import PackError, StoreError
from shardkit.packing.layout import mixed_slots
from shardkit.read.inspect import verify

from helpers import image_tree, program_cmd, program_env
from helpers.scaleout import manifest, partial_of, store_files



def _source_at_slot(slot: int, classes: int = 3, per_class: int = 16) -> str:
    """The source the default (mixed) layout writes at ``slot`` of image_tree(3, 16, pngs=1)."""
    labels = [c for c in range(classes) for _ in range(per_class)]
    s = int(mixed_slots(labels, 0)[slot])
    k = s % per_class
    return f"c{s // per_class}/img{k:03d}.{'png' if k == per_class - 1 else 'jpg'}"


BLOCKER = _source_at_slot(21)  # slot 21 of 48: inside shard 2 of 6 (8 slots each)
PACK_ARGS = ["--num-shards", "6", "--size", "32", "-q"]


def _start(src: str, out: str, *extra: str) -> subprocess.Popen:
    # Own session, so the whole process group (pack + pool workers) can be signalled.
    return subprocess.Popen([*program_cmd("blocking_pack"), "pack", src, out, *PACK_ARGS, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env=program_env({"SHARDKIT_TEST_BLOCK": BLOCKER,
                                             "SHARDKIT_TEST_EVENTS": _events(out)}))


def _events(out: str) -> str:
    return f"{out}.events"


def _blocked(out: str) -> bool:
    try:
        with open(_events(out)) as f:
            return any(line.startswith("block ") for line in f)
    except FileNotFoundError:
        return False


def _wait_for(path: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``path`` exists and an encoder is frozen on the blocking source of shard 2."""
    out = os.path.join(os.path.dirname(path), "..",
                       os.path.basename(os.path.dirname(path))[1:-len(".partial")])
    deadline = time.monotonic() + timeout  # only against a hang
    while not (os.path.exists(path) and _blocked(os.path.normpath(out))):
        if proc.poll() is not None:
            raise AssertionError(f"pack exited early ({proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.02)


def _assert_nothing_complete(out: str) -> None:
    """Nothing a reader or verify accepts as a finished store."""
    partial = partial_of(out)
    assert not os.path.exists(out)
    for candidate in [out, partial] + [os.path.join(partial, f) for f in os.listdir(partial)
                                       if f.endswith((".lmdb", ".h5"))]:
        with pytest.raises(StoreError):
            shardkit.ShardDataset(candidate)
        with pytest.raises(StoreError):
            verify(candidate)
        assert cli_main(["verify", candidate, "-q"]) == 1


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns


@pytest.mark.parametrize("fmt,workers", [("lmdb", "2"), ("hdf5", "1")])
def test_sigkill_then_resume_keeps_finished_shards(tmp_path, fmt, workers, capsys):
    src, out, ref = str(tmp_path / "src"), str(tmp_path / "out"), str(tmp_path / "ref")
    image_tree(src, classes=3, per_class=16, seed=5, pngs=1)
    ext = {"lmdb": ".lmdb", "hdf5": ".h5"}[fmt]
    proc = _start(src, out, "--format", fmt, "--workers", workers)
    partial = partial_of(out)
    _wait_for(os.path.join(partial, "shard-00001.done.json"), proc)
    os.killpg(proc.pid, signal.SIGKILL)  # the pack and its pool workers, as a crash would
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()

    names = sorted(os.listdir(partial))
    assert "shard-00000.done.json" in names and "shard-00001.done.json" in names
    assert not any(n.startswith(("shard-00003", "shard-00004", "shard-00005")) for n in names)
    assert "manifest.json" not in names and "labels.npy" not in names
    _assert_nothing_complete(out)

    kept = {k: _stat(os.path.join(partial, f"shard-{k:05d}{ext}")) for k in (0, 1)}
    # A shard whose bytes changed after it was recorded as done is redone, not trusted.
    shard1 = os.path.join(partial, f"shard-00001{ext}")
    with open(shard1, "r+b") as f:
        f.seek(os.path.getsize(shard1) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    kept[1] = _stat(shard1)

    capsys.readouterr()
    assert cli_main(["pack", src, out, *PACK_ARGS, "--format", fmt, "--workers", workers,
                     "--resume"]) == 0
    done = sum(n.endswith(".done.json") for n in names)
    # every recorded shard but the damaged one; the rate counts only what this run packed
    assert f" shards, {done - 1} kept from the earlier run) in " in capsys.readouterr().err
    assert not os.path.exists(partial)
    assert _stat(os.path.join(out, f"shard-00000{ext}")) == kept[0]  # kept: same inode, mtime
    assert _stat(os.path.join(out, f"shard-00001{ext}")) != kept[1]  # damaged: redone

    assert cli_main(["pack", src, ref, *PACK_ARGS, "--format", fmt, "--workers", workers]) == 0
    assert manifest(out) == manifest(ref)  # shard sha256s, counts, labels: all identical
    assert store_files(out) == store_files(ref)
    assert verify(out).ok


def test_ctrl_c_then_plain_rerun_starts_over(tmp_path):
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    image_tree(src, classes=3, per_class=16, seed=5, pngs=1)
    proc = _start(src, out, "--workers", "2")
    partial = partial_of(out)
    _wait_for(os.path.join(partial, "shard-00001.done.json"), proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    _assert_nothing_complete(out)
    first = _stat(os.path.join(partial, "shard-00000.lmdb"))

    # Resuming with other settings is refused: the finished shards belong to another plan.
    assert cli_main(["pack", src, out, *PACK_ARGS, "--quality", "80", "--resume"]) == 1
    assert os.path.exists(os.path.join(partial, "shard-00000.done.json"))

    # Without --resume the partial run is discarded and everything is packed again.
    assert cli_main(["pack", src, out, *PACK_ARGS, "--workers", "1"]) == 0
    assert _stat(os.path.join(out, "shard-00000.lmdb")) != first
    assert not os.path.exists(partial)
    assert verify(out).ok and len(shardkit.ShardDataset(out)) == 48


def test_resume_without_partial_is_a_fresh_pack(tmp_path):
    src, out, ref = str(tmp_path / "src"), str(tmp_path / "out"), str(tmp_path / "ref")
    shutil.rmtree(src, ignore_errors=True)
    image_tree(src, classes=2, per_class=6, seed=2, pngs=1)
    assert cli_main(["pack", src, out, "--num-shards", "3", "-q", "--resume"]) == 0
    assert cli_main(["pack", src, ref, "--num-shards", "3", "-q"]) == 0
    assert store_files(out) == store_files(ref)


# A pack interrupted as a node of two leaves shards 0 and 2 done and its plan in the partial
# folder (in-process, no blocking program needed): what a resume finds.
SPLIT = {"size": 16, "num_shards": 4, "progress": False, "workers": 1}


@pytest.fixture(scope="module")
def half_packed(tmp_path_factory) -> dict[str, str]:
    """A source, the partial folder of its pack interrupted after two of four shards (kept
    aside: each test copies it into place), and the store of the same pack uninterrupted."""
    root = tmp_path_factory.mktemp("half")
    src, out = str(root / "src"), str(root / "out")
    image_tree(src, classes=3, per_class=8, seed=5, sides=(16, 24))
    shardkit.pack(src, out, num_nodes=2, node_rank=0, **SPLIT)
    os.rename(partial_of(out), str(root / "kept"))
    shardkit.pack(src, str(root / "ref"), **SPLIT)
    return {"src": src, "kept": str(root / "kept"), "ref": str(root / "ref")}


def _partial_in_place(half_packed: dict[str, str], out: str) -> str:
    partial = partial_of(out)
    shutil.copytree(half_packed["kept"], partial)
    return os.path.join(partial, "plan")


def test_resume_refuses_a_damaged_or_altered_plan(half_packed, tmp_path, capsys):
    """Labels changed, two paths swapped, slots that are no permutation, a header changed: each
    refused before any shard is packed, naming the plan folder and the file; a plan altered
    with its seal made anew still differs from the source's (its labels). `overwrite` starts
    over, and the store is the uninterrupted pack's."""
    src, out = half_packed["src"], str(tmp_path / "out")

    def labels(data: bytes) -> bytes:
        return np.frombuffer(data, "<i4")[::-1].tobytes()

    def paths(data: bytes) -> bytes:  # two sources of one length trade places
        a, b = data.index(b"c0/img001.jpg"), data.index(b"c1/img001.jpg")
        return (data[:a] + data[b:b + 13] + data[a + 13:b] + data[a:a + 13] + data[b + 13:])

    def slots(data: bytes) -> bytes:
        s = np.frombuffer(data, "<i8").copy()
        s[1] = s[0]
        return s.tobytes()

    def header(data: bytes) -> bytes:
        return data.replace(b'"bounds": [0, 6, 12, 18, 24]', b'"bounds": [0, 5, 12, 18, 24]')

    for name, change in (("labels.bin", labels), ("paths.bin", paths), ("slots.bin", slots),
                         ("header.json", header)):
        plan = _partial_in_place(half_packed, out)
        with open(os.path.join(plan, name), "rb") as f:
            data = f.read()
        assert change(data) != data
        with open(os.path.join(plan, name), "wb") as f:
            f.write(change(data))
        with pytest.raises(PackError, match=f"cannot resume: the pack's plan in {plan} is "
                           rf"damaged \({name} does not match .*`overwrite=True` to start over"):
            shardkit.pack(src, out, resume=True, **SPLIT)
        assert not os.path.exists(out)
        assert sorted(os.listdir(partial_of(out))) == sorted(os.listdir(half_packed["kept"]))
        shutil.rmtree(partial_of(out))

    # Labels altered and the plan sealed again: sound, but not the source's plan.
    from shardkit.packing import plan_seal

    plan = _partial_in_place(half_packed, out)
    with open(os.path.join(plan, "labels.bin"), "rb") as f:
        data = labels(f.read())
    with open(os.path.join(plan, "labels.bin"), "wb") as f:
        f.write(data)
    sealed = plan_seal.read_header(plan)
    plan_seal.write_header(plan, {k: v for k, v in sealed.items()
                                  if k not in ("files", "meta_crc32")})
    capsys.readouterr()
    assert cli_main(["pack", src, out, "--num-shards", "4", "--size", "16", "-q", "--workers",
                     "1", "--resume"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the plan in {plan} differs from the one made now from " \
        "the source in its labels; pack again with --overwrite to start over" in err, err

    result = shardkit.pack(src, out, resume=True, overwrite=True, **SPLIT)
    assert result.kept_shards == 0 and result.count == 24
    assert store_files(out) == store_files(half_packed["ref"])


def test_resume_after_the_source_moved_packs_every_image(half_packed, tmp_path):
    """The same tree under another root resumes (same fingerprint), and the shards left are
    packed from where the images are now, not from the paths the first run listed."""
    src, out = str(tmp_path / "moved"), str(tmp_path / "out")
    shutil.copytree(half_packed["src"], src)
    _partial_in_place(half_packed, out)
    os.rename(half_packed["src"], half_packed["src"] + ".away")  # the first run's root is gone
    try:
        result = shardkit.pack(src, out, resume=True, **SPLIT)
    finally:
        os.rename(half_packed["src"] + ".away", half_packed["src"])
    assert result.kept_shards == 2 and result.skipped == [] and result.count == 24
    ds = shardkit.ShardDataset(out)
    ref = shardkit.ShardDataset(half_packed["ref"])
    assert ds.targets.tolist() == ref.targets.tolist()
    assert [ds.source_path(i) for i in range(24)] == [ref.source_path(i) for i in range(24)]
    assert verify(out).ok


def test_resume_refuses_labels_changed_at_the_source(tmp_path):
    """A file list whose labels changed between the interrupted pack and its resume (records in
    the sources' order: no layout to differ with them) is refused, naming the labels."""
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    rows = image_tree(src, classes=2, per_class=4, seed=3, sides=(16, 24))
    listing = str(tmp_path / "list.csv")
    with open(listing, "w") as f:
        f.writelines(f"{rel},{i % 3}\n" for i, (rel, _) in enumerate(rows))
    kw = SPLIT | {"file_list": listing, "order": "source"}
    shardkit.pack(src, out, num_nodes=2, node_rank=0, **kw)
    with open(listing, "w") as f:  # the same classes, one label moved
        f.writelines(f"{rel},{(i % 3) if i != 5 else 0}\n" for i, (rel, _) in enumerate(rows))
    with pytest.raises(PackError, match="differs from the one made now from the source in its "
                       "labels;"):
        shardkit.pack(src, out, resume=True, **kw)
