"""accelerate (1.x) with shardkit's loaders, on the data path of diffusers' SDXL training script:
a bucketed store with SDXL's micro-conditioning, a ``BucketSampler`` per process,
``ds.loader(engine="threads")`` and ``shardkit.accelerate.prepare`` in place of
``accelerator.prepare``. Two processes on gloo (torchrun): every record once an epoch across the
ranks, the same steps on both, the thread engine kept, gradient accumulation synced at each
epoch's end, and ``save_state`` (main process only, as the script calls it) / ``load_state``
resuming mid-epoch with exactly the remaining batches. In one process: ``accelerator.prepare``
refuses a shardkit loader in one line, and each shardkit sampler refuses to be read through a
loader accelerate rebuilt (a second split of a rank's share)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import program_env
from helpers.buckets import SIZES
from PIL import Image

import shardkit
from shardkit.errors import OptionError

accelerate = pytest.importorskip("accelerate")
from accelerate.data_loader import prepare_data_loader, skip_first_batches  # noqa: E402

import shardkit.accelerate  # noqa: E402

COUNTS = (30, 26, 22, 18)  # 96 records; at batch 4: 8 + 7 + 6 + 5 = 26 batches, partial ones too
N, BATCH, RANKS, EPOCHS, ACCUMULATE = sum(COUNTS), 4, 2, 2, 2
STEPS = 26 // RANKS  # batches per rank and epoch
SAVE_AT = 10  # global step: epoch 1 (7 updates an epoch: 6 of 2 batches, then the 13th alone)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """96 PNGs a little larger than 4 bucket sizes, each with a caption naming its number."""
    base = tmp_path_factory.mktemp("accelerate")
    rng = np.random.default_rng(5)
    order = [b for b, c in enumerate(COUNTS) for _ in range(c)]
    rng.shuffle(order)
    for i, b in enumerate(order):
        h, w = SIZES[b]
        grow = 1 + rng.random()
        folder = base / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (int(h * grow) + 1, int(w * grow), 3),
                                     dtype=np.uint8)).save(folder / f"{i:03d}.png")
        (folder / f"{i:03d}.txt").write_text(f"photo {i} of class {i % 2}")
    out = str(base / "train.lmdb")
    shardkit.pack(str(base / "src"), out, buckets=list(SIZES), bucket_step=8, workers=1,
                  progress=False, encoding="raw", captions=True, shard_size=40 * 48 * 3 * 20)
    return out


@pytest.fixture(scope="module")
def accelerator():
    return accelerate.Accelerator(cpu=True)


def train(store: str, log: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", str(RANKS), "-m",
                           "helpers.programs.accelerate_train", store, str(log), *args],
                          env=program_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def records(log: Path) -> list[list[dict]]:
    return [[json.loads(line) for line in Path(f"{log}.rank{rank}").read_text().splitlines()]
            for rank in range(RANKS)]


def test_two_processes_train_every_record_once_an_epoch_and_resume_exactly(store, tmp_path):
    log, ckpt = tmp_path / "full", tmp_path / "ckpt"
    train(store, log, "--refusals", "--save-at", str(SAVE_AT), "--ckpt", str(ckpt))
    for rank in range(RANKS):  # the patterns that cannot work, said in one line each
        said = json.loads(Path(f"{log}.refusals.rank{rank}").read_text())
        assert len(said) == 4 and all("\n" not in line for line in said)
        assert said[0].startswith("accelerator.prepare would rebuild this ThreadLoader")
        assert said[1].startswith("accelerate is reading this BucketSampler")
        assert "shardkit.accelerate.prepare(accelerator, ...)" in said[0] + said[1]
        assert said[2].startswith("this loader's RandomSampler would give each of the 2")
        assert said[3].startswith("the processes' loaders draw random crops, flips or transforms "
                                  "with different seeds")
    full = records(log)
    assert [len(r) for r in full] == [EPOCHS * STEPS] * RANKS  # the same steps, nobody waits
    orders = []
    for epoch in range(EPOCHS):
        steps = [[r for r in ranks if r["epoch"] == epoch] for ranks in full]
        assert [[r["step"] for r in s] for s in steps] == [list(range(STEPS))] * RANKS
        seen = sorted(i for s in steps for r in s for i in r["ids"])
        assert seen == list(range(N))  # every record once an epoch across the ranks
        for s in steps:
            assert all(r["loader"] == "ThreadLoader" and r["sizes_match"] and r["time_ids"] == 6
                       and r["device"] == "cpu" for r in s)
            # accumulate syncs every 2nd batch and at the epoch's last one (end_of_dataloader)
            assert [r["sync"] for r in s] == [i % 2 == 1 or i == STEPS - 1
                                              for i in range(STEPS)]
        orders.append([r["ids"] for r in steps[0]])
    assert orders[0] != orders[1]  # each epoch's own order (set_epoch by the loader)

    resumed = tmp_path / "resumed"
    train(store, resumed, "--resume", str(ckpt / f"checkpoint-{SAVE_AT}"))
    cut = STEPS + 6  # epoch 1's update 3 (global step 10) is its batch 6
    for before, after in zip(full, records(resumed)):
        assert [(r["epoch"], r["ids"]) for r in after] == \
            [(r["epoch"], r["ids"]) for r in before[cut:]]
        assert all(r["loader"] == "ThreadLoader" for r in after)


def one_line_refusal(call, *words: str) -> str:
    with pytest.raises(OptionError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


def test_accelerator_prepare_refuses_a_shardkit_loader_in_one_line(store, accelerator):
    ds = shardkit.ShardDataset(store)
    bucketed = ds.loader(batch_sampler=shardkit.BucketSampler(ds, BATCH, num_replicas=1, rank=0),
                         engine="threads", num_threads=1)
    for loader in (bucketed, ds.loader(batch_size=BATCH, shuffle=True)):
        one_line_refusal(lambda: accelerator.prepare(loader), "accelerator.prepare would rebuild",
                         "shardkit.accelerate.prepare(accelerator, ...)")
    assert not hasattr(bucketed, "_is_accelerate_prepared")  # asked by anyone else: no answer


def test_shardkit_samplers_refuse_a_loader_accelerate_rebuilt(store, accelerator):
    ds = shardkit.ShardDataset(store)
    square = shardkit.ShardDataset(store, crop=16)  # one size: batches without buckets
    mix = shardkit.Mix([square, square])
    made = {
        "BucketSampler": lambda: dict(dataset=ds, batch_sampler=shardkit.BucketSampler(
            ds, BATCH, num_replicas=1, rank=0)),
        "ShardSampler": lambda: dict(dataset=square, batch_size=BATCH,
                                     sampler=shardkit.ShardSampler(square, num_replicas=1, rank=0)),
        "MixSampler": lambda: dict(dataset=mix, batch_size=BATCH, sampler=shardkit.MixSampler(
            mix, repeat=[1, 0.5], num_replicas=1, rank=0))}
    for name, options in made.items():
        plain = lambda: torch.utils.data.DataLoader(collate_fn=shardkit.collate, **options())
        assert len(list(plain())) > 0  # read by torch itself: as ever
        for rebuilt in (lambda: prepare_data_loader(plain(), num_processes=2, process_index=0),
                        lambda: accelerator.prepare(plain()),
                        lambda: skip_first_batches(plain(), 1)):
            loader = rebuilt()
            one_line_refusal(lambda: next(iter(loader)), f"reading this {name}",
                             "shardkit.accelerate.prepare(accelerator, ...)")


def test_prepare_refuses_what_would_not_give_this_process_its_share(store, accelerator):
    ds = shardkit.ShardDataset(store)
    other = ds.loader(batch_sampler=shardkit.BucketSampler(ds, BATCH, num_replicas=2, rank=1))
    one_line_refusal(lambda: shardkit.accelerate.prepare(accelerator, other), "rank 1 of 2",
                     "num_replicas=accelerator.num_processes, rank=accelerator.process_index")
    plain = torch.utils.data.DataLoader(ds, batch_size=BATCH, collate_fn=shardkit.collate,
                                        sampler=shardkit.ShardSampler(ds, num_replicas=1, rank=0))
    one_line_refusal(lambda: shardkit.accelerate.prepare(accelerator, plain),
                     "a torch DataLoader over a ShardSampler", "ds.loader(")
