"""Every ``ds.loader`` path works with a 64 MB ``/dev/shm`` (Docker's default), where a plain
DataLoader with torch's default collate fails: shardkit's worker batches live in memfd memory
(:mod:`shardkit.read.shipping`, :mod:`shardkit.read.batchpool`), which that mount does not bound.

Each case runs in a mount namespace whose /dev/shm is a fresh 64 MB tmpfs (``unshare -m``, as
root). Skipped where that is not possible, except under CI (env ``CI`` set), where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from helpers import build_store_fast, program_cmd, program_env
from helpers.programs import shm_loader

from shardkit import ShardDataset


def _namespace_or_skip() -> None:
    why = None
    if os.geteuid() != 0:
        why = "needs root (mount a 64 MB tmpfs on /dev/shm in a mount namespace)"
    elif shutil.which("unshare") is None:
        why = "needs unshare (util-linux)"
    else:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs "
                                "/dev/shm && df -k /dev/shm"], capture_output=True, text=True)
        if probe.returncode != 0 or " 65536 " not in probe.stdout:
            why = f"cannot mount a 64 MB /dev/shm in a mount namespace: {probe.stderr.strip()}"
    if why:
        if os.environ.get("CI"):
            pytest.fail(why + " (CI must run this test)")
        pytest.skip(why)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """512 records of 256 x 256 JPEGs (64 distinct ones), in 10 classes."""
    _namespace_or_skip()
    path = str(tmp_path_factory.mktemp("shm") / "s.lmdb")
    build_store_fast(path, 512, side=256, variants=64, seed=3)
    return path


def run_in_small_shm(store: str, case: str, context: str) -> subprocess.CompletedProcess:
    command = " ".join([*program_cmd("shm_loader"), store, case, context])
    return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs "
                           f"/dev/shm && exec {command}"], capture_output=True, text=True,
                          env=program_env(), timeout=300)


def expected(store: str, case: str) -> list:
    """The same batches read in this process (no workers, no shared memory)."""
    ds, batch_size = shm_loader.setup(store, case)
    return shm_loader.describe(ds.loader(batch_size=batch_size, num_workers=0))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_plain_dataloader_fails_there(store, context):
    """The control: with the per-sample float transform a batch is 77 MB; torch's default collate
    stacks each worker batch into /dev/shm, where it does not fit."""
    done = run_in_small_shm(store, "plain-transform", context)
    assert done.returncode != 0
    assert "shared memory" in done.stderr or "shm" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("case, context", [
    ("transform", "fork"), ("transform", "spawn"), ("crop", "fork"), ("crop", "spawn"),
    ("numpy", "fork"), ("target", "spawn"), ("single", "fork")])
def test_every_loader_path_works_there(store, case, context):
    done = run_in_small_shm(store, case, context)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got == expected(store, case)
    assert len(got) == (len(ShardDataset(store)) if case == "single" else 512 // shm_loader.BATCH)
