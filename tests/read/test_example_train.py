"""``examples/train_imagenet.py`` trains, checkpoints and resumes exactly, on CPU.

Two gloo processes under ``torchrun`` train a tiny model on a store whose every image is its own
class, so the labels each step receives name its samples: an interrupted run resumed from its
mid-epoch checkpoint must see exactly the samples the uninterrupted run saw, step by step, rank by
rank. A torchvision model runs in the torchvision environment (``.venv-tv``), when present.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import shardkit
from shardkit.bench.sample import make_sample

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "train_imagenet.py")
IMAGES, BATCH, RANKS = 32, 4, 2
STEPS = IMAGES // RANKS // BATCH  # per epoch and rank


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[str, str]:
    base = tmp_path_factory.mktemp("example")
    make_sample(str(base / "src"), IMAGES, IMAGES, seed=2, workers=1)  # one image per class
    train, val = str(base / "train.lmdb"), str(base / "val-shards")
    shardkit.pack(str(base / "src"), train, size=40, workers=1, progress=False)
    shardkit.pack(str(base / "src"), val, size=40, num_shards=3, workers=1, progress=False)
    return train, val


def train(stores: tuple[str, str], cwd: Path, *args: str, python: str = sys.executable,
          ranks: int = RANKS, arch: str = "tiny") -> str:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    cmd = [python, *(launcher if ranks > 1 else []), EXAMPLE, *stores, "--arch", arch,
           "--epochs", "2", "--batch-size", str(BATCH), "--workers", "1", "--crop", "32",
           "--print-freq", "1", "--checkpoint", str(cwd / "ck.pt"), *args]
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def steps_and_evals(prefix: Path) -> tuple[dict[tuple[int, int, int], list[int]], list[dict]]:
    steps, evals = {}, []
    for rank in range(RANKS):
        path = Path(f"{prefix}.rank{rank}")
        for line in path.read_text().splitlines() if path.exists() else []:
            record = json.loads(line)
            if "labels" in record:
                steps[record["epoch"], record["step"], rank] = record["labels"]
            else:
                evals.append(record)
    return steps, evals


def test_trains_two_ranks_then_resumes_mid_epoch_at_the_next_sample(stores, tmp_path):
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full_dir.mkdir()
    cut_dir.mkdir()
    out = train(stores, full_dir, "--log-file", str(full_dir / "log"))
    full, evals = steps_and_evals(full_dir / "log")
    assert sorted(full) == [(e, e * STEPS + s, r) for e in range(2) for s in range(STEPS)
                            for r in range(RANKS)]
    for epoch in range(2):  # each epoch: the ranks together see every image once
        seen = [y for (e, _, _), labels in full.items() if e == epoch for y in labels]
        assert sorted(seen) == list(range(IMAGES))
    assert [full[0, s, 0] for s in range(STEPS)] != [full[1, STEPS + s, 0] for s in range(STEPS)]
    assert [(e["epoch"], e["count"]) for e in evals] == [(0, IMAGES), (1, IMAGES)]
    assert "epoch 1 val top-1" in out

    # Interrupted after step 3, with a checkpoint at step 2 (mid-epoch 0), then resumed.
    train(stores, cut_dir, "--checkpoint-every", "2", "--max-steps", "3",
          "--log-file", str(cut_dir / "before"))
    before, evals = steps_and_evals(cut_dir / "before")
    assert before == {k: v for k, v in full.items() if k[1] < 3} and evals == []
    state = torch.load(cut_dir / "ck.pt", weights_only=True)
    assert (state["epoch"], state["step"]) == (0, 2)
    assert (state["sampler"]["epoch"], state["sampler"]["consumed"]) == (0, 2 * BATCH)

    train(stores, cut_dir, "--resume", str(cut_dir / "ck.pt"),
          "--log-file", str(cut_dir / "after"))
    after, evals = steps_and_evals(cut_dir / "after")
    assert after == {k: v for k, v in full.items() if k[1] >= 2}
    assert [(e["epoch"], e["count"]) for e in evals] == [(0, IMAGES), (1, IMAGES)]
    state = torch.load(cut_dir / "ck.pt", weights_only=True)
    assert (state["epoch"], state["step"], state["sampler"]["consumed"]) == (2, 2 * STEPS, 0)


def test_torchvision_model_trains_in_the_torchvision_environment(tv_python, stores, tmp_path):
    out = train(stores, tmp_path, "--epochs", "1", python=tv_python, ranks=1, arch="resnet18")
    assert f"epoch 0 step {IMAGES // BATCH} loss" in out
    assert "epoch 0 val top-1" in out and f"({IMAGES} images)" in out
    assert torch.load(tmp_path / "ck.pt", weights_only=True)["epoch"] == 1
