"""Lightning 2.6 trains from a store on 2 CPU ranks (``strategy="ddp"``, gloo) with its defaults:
every epoch covers the whole store (``use_distributed_sampler=True`` leaves ``ShardSampler`` as it
is), and a run resumed from a mid-epoch checkpoint (``fit(ckpt_path=...)``, no user code) gets
exactly the samples of the uninterrupted run, step by step, rank by rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import shardkit
from shardkit.bench.sample import make_sample
from shardkit.errors import OptionError

pl = pytest.importorskip("lightning.pytorch")

TESTS = Path(__file__).resolve().parents[1]
IMAGES, BATCH, RANKS, EPOCHS = 32, 4, 2, 2
STEPS = IMAGES // RANKS // BATCH  # per epoch and rank


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("lightning")
    make_sample(str(base / "src"), IMAGES, IMAGES, seed=2, workers=1)  # one image per class
    shardkit.pack(str(base / "src"), str(base / "train.lmdb"), size=40, workers=1,
                  progress=False)
    return str(base / "train.lmdb")


def fit(store: str, log: Path, ckpt_dir: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "helpers.programs.lightning_train", store,
                           str(log), str(ckpt_dir), *args], cwd=TESTS, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stderr


def steps(log: Path) -> dict[tuple[int, int, int], list[int]]:
    found = {}
    for rank in range(RANKS):
        for line in Path(f"{log}.rank{rank}").read_text().splitlines():
            record = json.loads(line)
            assert record["dtype"] == "torch.float32" and record["contiguous"]
            found[record["epoch"], record["step"], rank] = record["labels"]
    return found


@pytest.mark.parametrize("loader", ["datamodule", "plain"])
def test_two_ranks_train_full_epochs_and_resume_mid_epoch_exactly(store, tmp_path, loader):
    """``datamodule``: ShardDataModule (a ShardSampler per rank, left as it is by Lightning);
    ``plain``: ``ds.loader(shuffle=True)`` in ``train_dataloader``, which Lightning rebuilds with
    its DistributedSampler (the loader then resumes by skipping the consumed batches)."""
    mode = ("--loader", loader)
    err = fit(store, tmp_path / "full", tmp_path / "ck-full", *mode)
    full = steps(tmp_path / "full")
    assert sorted(full) == [(e, e * STEPS + s, r) for e in range(EPOCHS) for s in range(STEPS)
                            for r in range(RANKS)]
    for epoch in range(EPOCHS):  # Lightning's default sampler handling: no halving, no repeat
        seen = [y for (e, _, _), labels in full.items() if e == epoch for y in labels]
        assert sorted(seen) == list(range(IMAGES))
    assert "Grad strides do not match" not in err
    if loader == "datamodule":  # validation each epoch: the ranks' in-order shares, padded
        for epoch in range(EPOCHS):
            seen = [y for rank in range(RANKS) for line in Path(
                f"{tmp_path / 'full'}.val.rank{rank}").read_text().splitlines()
                for y in json.loads(line)["labels"] if json.loads(line)["epoch"] == epoch]
            assert sorted(seen) == list(range(IMAGES))  # 32 = 2 x 16: nothing to pad

    # Resumed from the full run's mid-epoch checkpoint at step 2 (checkpoints every 2 steps, all
    # kept), saved while the loop went on and the workers prefetched past it.
    ckpt = tmp_path / "ck-full" / "step=2.ckpt"
    saved = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    (loader_state,) = saved["combined_loader"]
    assert loader_state["batches"] == 2  # what the loop received, not what workers prefetched
    if loader == "datamodule":
        assert loader_state["sampler"]["consumed"] == 2 * BATCH
    fit(store, tmp_path / "after", tmp_path / "ck-after", "--resume", str(ckpt), *mode)
    assert steps(tmp_path / "after") == {k: v for k, v in full.items() if k[1] >= 2}


def test_a_wrapped_shard_sampler_is_refused(store):
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    ds = shardkit.ShardDataset(store, crop=32)
    sampler = shardkit.ShardSampler(ds, num_replicas=1, rank=0)
    wrapped = DistributedSamplerWrapper(sampler, num_replicas=2, rank=0)
    with pytest.raises(OptionError, match="DistributedSamplerWrapper wrapped around a "
                                          "ShardSampler"):
        ds.loader(batch_size=4, sampler=wrapped)
    loader = ds.loader(batch_size=4, sampler=sampler)
    assert len([y for _, labels in loader for y in labels.tolist()]) == IMAGES
