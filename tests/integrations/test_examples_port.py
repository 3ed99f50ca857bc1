"""The pytorch/examples ``imagenet/main.py`` port (``examples/imagenet_main.patch``, shown in
docs/trainers.md) drives loops shaped like main.py's ``train()`` and ``validate()`` on CPU.

main.py is not shipped (no outside code in the repository), so this test executes the patch's
own added statements (datasets, samplers, loaders, the distributed remainder loader) and runs
main.py's loop bodies over them: the device move, ``-j 0`` (no ``persistent_workers``) and
``-j 1``, validation without any image handling of its own (main.py moves no images to the CPU),
``--evaluate`` (validation only) and the remainder a distributed validation reads."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.utils.data import DistributedSampler

import shardkit
from shardkit.bench.sample import make_sample

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "examples" / "imagenet_main.patch"
DOC = ROOT / "docs" / "trainers.md"
IMAGES, CLASSES, BATCH = 21, 3, 4


def added_statements() -> dict[str, str]:
    """The patch's runs of added lines, dedented, keyed by the name they assign."""
    runs, current = [], []
    for line in PATCH.read_text().splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            current.append(line[1:])
        elif current:
            runs.append(current)
            current = []
    statements = {}
    for run in runs:
        code = textwrap.dedent("\n".join(run)).strip()
        for chunk in re.split(r"\n(?=\S)", code):
            match = re.match(r"(\w+) = ", chunk)
            if match:
                statements[match.group(1)] = chunk
            elif chunk.startswith("import"):
                statements["import"] = chunk
    return statements


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("examples")
    make_sample(str(base / "src"), IMAGES, CLASSES, seed=4, workers=1)
    (base / "data").mkdir()
    shardkit.pack(str(base / "src"), str(base / "data" / "train"), size=256, workers=1,
                  progress=False)
    shardkit.pack(str(base / "src"), str(base / "data" / "val"), size=256, num_shards=2,
                  workers=1, progress=False)
    return str(base / "data")


def model_and_criterion():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 7, stride=8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, CLASSES))
    return model, nn.CrossEntropyLoss()


def build(data: str, workers: int) -> dict:
    """Run the patch's statements as main_worker does on one CPU process."""
    code = added_statements()
    ns = {"args": SimpleNamespace(batch_size=BATCH, workers=workers),
          "device": torch.device("cpu"), "traindir": f"{data}/train", "valdir": f"{data}/val",
          "train_sampler": None, "val_sampler": None}
    exec(code["import"] + "\n" + code["NORMALIZE"], ns)
    exec(code["train_dataset"] + "\n" + code["val_dataset"], ns)
    exec(code["train_loader"] + "\n" + code["val_loader"], ns)
    return ns


def train_steps(train_loader, model, criterion, device) -> int:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for images, target in train_loader:  # main.py train(): move, forward, backward, step
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        assert images.dtype == torch.float32 and images.is_contiguous()
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
    return steps


def validate(val_loader, model, criterion) -> list[int]:
    seen = []
    model.eval()
    with torch.no_grad():
        for images, target in val_loader:  # main.py validate() on CPU: nothing moved
            output = model(images)
            criterion(output, target)
            seen += target.tolist()
    return seen


def test_the_doc_shows_the_patch_that_is_shipped():
    text = DOC.read_text()
    blocks = re.findall(r"```diff\n(.*?)```", text, re.S)
    hunks = PATCH.read_text().split("\n@@", 1)[1]
    assert any(block.strip().endswith(hunks.strip()) for block in blocks)


def test_the_pin_is_the_blob_the_patch_was_made_against():
    """The commit and blob the docs pin are those the patch's header and ``index`` line name
    (``git rev-parse 77f55b9:imagenet/main.py``), and each hunk's line counts and new start
    follow from its lines, as git writes them (read against that blob, the patch applies with
    no offset)."""
    commit, blob = "77f55b9", "42e5e9fa64f023f019689ab871332d5e3ffa2ab8"
    patch = PATCH.read_text()
    assert f"commit {commit}; blob {blob}" in patch.splitlines()[0]
    assert re.search(r"^index ([0-9a-f]{40})\.\.", patch, re.M).group(1) == blob
    assert f"commit `{commit}`, whose `imagenet/main.py` is the blob\n`{blob}`" in DOC.read_text()
    hunks = re.split(r"^(@@ .*)$", patch, flags=re.M)[1:]
    shift = 0
    for header, body in zip(hunks[::2], hunks[1::2]):
        old_start, old_len, new_start, new_len = map(int, re.match(
            r"@@ -(\d+),(\d+) \+(\d+),(\d+) @@", header).groups())
        lines = body.strip("\n").split("\n")
        assert old_len == sum(not line.startswith("+") for line in lines), header
        assert new_len == sum(not line.startswith("-") for line in lines), header
        assert new_start == old_start + shift, header
        shift += new_len - old_len


@pytest.mark.parametrize("workers", [0, 1], ids=["-j0", "-j1"])
def test_train_then_validate_on_cpu(data, workers):
    ns = build(data, workers)
    assert ns["train_loader"].persistent_workers is (workers > 0)  # -j 0 must not pass it
    model, criterion = model_and_criterion()
    assert train_steps(ns["train_loader"], model, criterion, ns["device"]) == -(-IMAGES // BATCH)
    assert sorted(validate(ns["val_loader"], model, criterion)) == sorted(
        ns["val_dataset"].targets.tolist())


def test_evaluate_gives_the_normalised_centre_crops(data):
    ns = build(data, 0)
    images, _ = next(iter(ns["val_loader"]))
    # In the store's order (ds.loader without shuffle reads shard after shard).
    order = ns["val_loader"].sampler.indices()[:BATCH].tolist()
    raw = shardkit.ShardDataset(f"{data}/val", crop=224).__getitems__(order)
    assert torch.equal(images, shardkit.normalize(raw.images, *ns["NORMALIZE"]))
    model, criterion = model_and_criterion()
    assert len(validate(ns["val_loader"], model, criterion)) == IMAGES  # --evaluate


def test_distributed_validation_reads_the_remainder(data):
    code = added_statements()
    world = 2
    ns = {"args": SimpleNamespace(batch_size=BATCH, workers=0, world_size=world),
          "device": torch.device("cpu")}
    exec(code["import"] + "\n" + code["NORMALIZE"], ns)
    ns["val_dataset"] = shardkit.ShardDataset(f"{data}/val", crop=224)
    sampler = DistributedSampler(ns["val_dataset"], num_replicas=world, rank=0, shuffle=False,
                                 drop_last=True)
    ns["val_loader"] = ns["val_dataset"].loader(batch_size=BATCH, sampler=sampler,
                                                normalize=ns["NORMALIZE"], device=ns["device"])
    exec(code["aux_val_loader"], ns)
    model, criterion = model_and_criterion()
    tail = validate(ns["aux_val_loader"], model, criterion)
    assert tail == ns["val_dataset"].targets[len(sampler) * world:].tolist() and tail
