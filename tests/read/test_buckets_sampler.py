"""``BucketSampler`` and ``ds.buckets`` on a real bucketed store: every batch one bucket; every
sample once an epoch over the ranks (padding only to even them out; ``drop_last``: nothing
twice, the dropped count said); equal batches per rank; a pure function of (seed, epoch) with
buckets interleaved; exact resume 4 -> 2 and 2 -> 4 (also through ``ShardLoader``); a foreign
state refused; the same batches in fork and spawn workers, stacked at the bucket's size; crops
and flips at decode within a bucket; DDP under torchrun (gloo, 2 ranks) and Lightning
(``use_distributed_sampler=False``) use it as given."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

import shardkit
from shardkit import BucketSampler, OptionError

from helpers import program_env, rank_outputs
from helpers.buckets import COUNTS, SIZES, bucketed_store

N = sum(COUNTS)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("buckets")
    return bucketed_store(str(base / "src"), str(base / "b.lmdb"))


@pytest.fixture(scope="module")
def ds(store):
    ds = shardkit.ShardDataset(store)
    yield ds
    ds.close()


def _ranks(ds, world, **kw) -> list[BucketSampler]:
    return [BucketSampler(ds, 4, num_replicas=world, rank=r, **kw) for r in range(world)]


def _interleave(lists):
    return [lst[i] for i in range(max(map(len, lists), default=0)) for lst in lists
            if i < len(lst)]


def test_buckets_are_each_records_size(ds):
    sizes = ds.bucket_sizes
    assert sizes.tolist() == sorted(list(s) for s in SIZES)
    buckets = ds.buckets
    assert buckets.dtype == np.int64 and buckets.shape == (N,)
    for i in range(N):
        assert list(ds[i][0].shape[1:]) == sizes[buckets[i]].tolist()
    # a subset's buckets are its records'
    picked = [5, 0, 40, 17]
    assert ds.subset(picked).buckets.tolist() == buckets[picked].tolist()


def test_a_store_without_buckets_says_so(pack_photos):
    plain = shardkit.ShardDataset(pack_photos("lmdb"))
    assert plain.buckets is None and plain.bucket_sizes is None
    with pytest.raises(OptionError, match="has no aspect-ratio buckets; pack it with buckets="):
        BucketSampler(plain, 4, num_replicas=1, rank=0)


def test_misuse_gets_one_line_that_names_the_fix(ds):
    """A BucketSampler passed as ``sampler=`` (its items are batches), and a bucketed store
    batched without one (images of several sizes), each say what to pass instead."""
    with pytest.raises(OptionError, match="sampler: a BucketSampler yields batches; pass it as "
                                          "batch_sampler="):
        ds.loader(sampler=BucketSampler(ds, 4, num_replicas=1, rank=0))
    with pytest.raises(ValueError, match=r"the images of one batch differ in size \(3x\d+x\d+ "
                                         r"and 3x\d+x\d+\): .*batch_sampler=shardkit.BucketSampler"):
        next(iter(ds.loader(batch_size=len(ds))))


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_batch_one_bucket_every_sample_once_equal_ranks(ds, drop_last):
    buckets = ds.buckets
    for world in (1, 2, 3, 4):
        samplers = _ranks(ds, world, seed=3, drop_last=drop_last)
        for s in samplers:
            s.set_epoch(2)
        lists = [list(s) for s in samplers]
        assert len({len(lst) for lst in lists}) == 1, world  # equal batches per rank
        assert all(len(lst) == len(s) for lst, s in zip(lists, samplers))
        batches = [b for lst in lists for b in lst]
        for b in batches:
            assert len(set(buckets[b].tolist())) == 1 and 1 <= len(b) <= 4  # one bucket
        seen = Counter(i for b in batches for i in b)
        if drop_last:
            assert all(len(b) == 4 for b in batches)
            assert max(seen.values()) == 1  # nothing repeats
            assert N - len(seen) == samplers[0].dropped  # what is left out is said
            assert samplers[0].dropped < sum(c % 4 for c in COUNTS) + 4 * world
        else:
            assert set(seen) == set(range(N))  # every sample
            distinct = {tuple(sorted(b)) for b in batches}
            # the distinct batches cut the dataset exactly once; fewer than `world` repeat
            assert sorted(i for b in distinct for i in b) == list(range(N))
            assert len(batches) - len(distinct) < world
            # each bucket's batches: full ones, and its last partial one kept
            per_bucket = Counter(int(buckets[list(b)[0]]) for b in distinct)
            assert [per_bucket[k] for k in range(len(SIZES))] == \
                [-(-COUNTS[SIZES.index(tuple(s))] // 4) for s in ds.bucket_sizes.tolist()]


def test_order_is_a_pure_function_of_seed_and_epoch_with_buckets_interleaved(ds):
    def epoch(seed, e, world=2):
        samplers = _ranks(ds, world, seed=seed)
        for s in samplers:
            s.set_epoch(e)
        return _interleave([list(s) for s in samplers])

    assert epoch(1, 3) == epoch(1, 3)  # fresh samplers: the same batches in the same order
    assert epoch(1, 3) != epoch(1, 4) and epoch(1, 3) != epoch(2, 3)
    # each epoch cuts the buckets into other batches, too
    assert {frozenset(b) for b in epoch(1, 3)} != {frozenset(b) for b in epoch(1, 4)}
    buckets = ds.buckets
    switches = []
    for e in range(8):
        seq = [int(buckets[b[0]]) for b in epoch(0, e, world=1)]  # what one rank reads
        switches.append(sum(a != b for a, b in zip(seq, seq[1:])) / (len(seq) - 1))
    # shuffled batches of 4 buckets switch bucket ~70 % of steps; sorted by bucket ~20 %
    assert np.mean(switches) > 0.5


def _state_after(ds, world, k, epoch=1):
    samplers = _ranks(ds, world, seed=7, num_canonical=4)
    consumed = []
    for s in samplers:
        s.set_epoch(epoch)
        consumed.append(list(s)[:k])
        s.consumed = k
    states = [s.state_dict() for s in samplers]
    assert all(st == states[0] for st in states)
    return json.loads(json.dumps(states[0])), consumed


@pytest.mark.parametrize("before,after", [(4, 2), (2, 4)])
def test_resume_at_another_world_size_yields_exactly_the_rest(ds, before, after):
    full = _interleave([list(s) for s in _ranks(ds, 1, seed=7, num_canonical=4)
                        if s.set_epoch(1) is None])
    state, consumed = _state_after(ds, before, 2)
    done = _interleave(consumed)
    assert done == full[:len(done)]  # the global order is the same at every world size
    resumed = _ranks(ds, after, seed=7)  # the saved num_canonical is adopted
    for s in resumed:
        s.load_state_dict(state)
        s.set_epoch(1)
    lists = [list(s) for s in resumed]
    assert len({len(x) for x in lists}) == 1
    rest = _interleave(lists)
    left = len(full) - len(done)
    assert rest[:left] == full[len(done):]  # exactly the rest, in order
    assert len(rest) - left < after  # then padding only to even out the ranks


def test_foreign_state_is_refused(ds):
    state, _ = _state_after(ds, 2, 1)
    for other, why in ((dict(seed=8), "seed"), (dict(batch_size=5), "batch_size"),
                       (dict(dataset=ds.subset(list(range(N - 1)))), "dataset_len")):
        kw = dict(dataset=ds, batch_size=4, num_replicas=2, rank=0, seed=7, **{})
        kw.update(other)
        with pytest.raises(OptionError, match=f"cannot resume: saved {why}="):
            BucketSampler(**kw).load_state_dict(state)
    # the same length, other records: the fingerprint
    shuffled = ds.subset(np.random.default_rng(0).permutation(N))
    with pytest.raises(OptionError, match="cannot resume: saved fingerprint="):
        BucketSampler(shuffled, 4, num_replicas=2, rank=0, seed=7).load_state_dict(state)


def _loader_batches(ds, sampler, **kw):
    out = []
    for images, labels in ds.loader(batch_sampler=sampler, **kw):
        out.append((images.clone(), labels.clone()))
    return out


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_loader_batches_are_stacked_at_the_bucket_size_in_fork_and_spawn_workers(ds, context):
    def sampler():
        s = BucketSampler(ds, 4, num_replicas=2, rank=1, seed=5)
        s.set_epoch(1)
        return s

    expect = list(sampler())
    got = _loader_batches(ds, sampler(), num_workers=2, multiprocessing_context=context)
    assert len(got) == len(expect)
    sizes, buckets = ds.bucket_sizes, ds.buckets
    for (images, labels), idx in zip(got, expect):
        h, w = sizes[buckets[idx[0]]].tolist()
        assert images.dtype == torch.uint8 and images.shape == (len(idx), 3, h, w)
        assert torch.equal(images, torch.stack([ds[i][0] for i in idx]))
        assert labels.tolist() == [ds[i][1] for i in idx]


def test_shard_loader_resumes_a_bucket_sampler_at_another_world_size(ds):
    def loaders(world):
        out = []
        for r in range(world):
            s = BucketSampler(ds, 4, num_replicas=world, rank=r, seed=2, num_canonical=4)
            s.set_epoch(0)
            out.append(ds.loader(batch_sampler=s))
        return out

    full = _interleave([[labels.tolist() for _, labels in loader] for loader in loaders(1)])
    first = loaders(4)
    done = []
    for loader in first:
        it = iter(loader)
        done.append([next(it)[1].tolist() for _ in range(2)])
    state = first[0].state_dict()
    assert state["sampler"]["position"] == 8  # batches: 2 each at 4 ranks
    again = loaders(2)
    for loader in again:
        loader.load_state_dict(state)
        assert len(loader) == len(next(iter(again)).batch_sampler) + 4  # the whole epoch
    rest = _interleave([[labels.tolist() for _, labels in loader] for loader in again])
    assert _interleave(done) + rest[:len(full) - 8] == full


def test_crops_and_flips_within_a_bucket(store, ds):
    center = shardkit.ShardDataset(store, crop=16)
    sampler = BucketSampler(center, 4, num_replicas=1, rank=0, seed=1)
    expect = list(sampler)
    for (images, _), idx in zip(_loader_batches(center, sampler), expect):
        assert images.shape == (len(idx), 3, 16, 16)
        for image, i in zip(images, idx):
            whole = ds[i][0]
            top, left = (whole.shape[1] - 16) // 2, (whole.shape[2] - 16) // 2
            assert torch.equal(image, whole[:, top:top + 16, left:left + 16])
    rand = shardkit.ShardDataset(store, crop=16, crop_mode="random", flip=0.5)
    flipped = 0
    for (images, _), idx in zip(_loader_batches(rand, sampler, generator=torch.Generator()
                                                .manual_seed(0)), expect):
        assert images.shape == (len(idx), 3, 16, 16)
        for image, i in zip(images, idx):
            windows = ds[i][0].unfold(1, 16, 1).unfold(2, 16, 1)  # 3 x H' x W' x 16 x 16
            same = (windows == image[:, None, None]).flatten(3).all(-1).all(0)
            mirrored = (windows == image.flip(-1)[:, None, None]).flatten(3).all(-1).all(0)
            assert bool(same.any() or mirrored.any())  # a window of its own image
            flipped += bool(mirrored.any() and not same.any())
    assert 0 < flipped < N  # some flipped, some not


def test_ddp_under_torchrun_every_rank_takes_the_same_steps(store, ds, tmp_path):
    out = str(tmp_path / "ranks.json")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", "-m", "helpers.programs.bucket_ddp", store,
                           out], env=program_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = rank_outputs(out, 2)
    reference = [BucketSampler(ds, 4, num_replicas=2, rank=r, seed=1) for r in range(2)]
    sizes, buckets = ds.bucket_sizes, ds.buckets
    for got, sampler in zip(ranks, reference):
        assert got["batches"] == list(sampler)  # world and rank from torch.distributed
        assert got["shapes"] == [[len(b), 3, *sizes[buckets[b[0]]].tolist()]
                                 for b in got["batches"]]
    assert len(ranks[0]["shapes"]) == len(ranks[1]["shapes"])
    assert {i for g in ranks for b in g["batches"] for i in b} == set(range(N))


def test_lightning_uses_the_bucket_sampler_as_given_and_sets_its_epoch(ds, tmp_path):
    pl = pytest.importorskip("lightning.pytorch")

    class Recorder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.seen: dict[int, list] = {}

        def training_step(self, batch, batch_idx):
            images, labels = batch
            self.seen.setdefault(self.current_epoch, []).append(
                (labels.tolist(), list(images.shape[2:])))
            return (self.weight * images.float().mean()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    sampler = BucketSampler(ds, 4, num_replicas=1, rank=0, seed=4)
    model = Recorder()
    trainer = pl.Trainer(max_epochs=2, use_distributed_sampler=False, accelerator="cpu",
                         devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=str(tmp_path))
    trainer.fit(model, train_dataloaders=ds.loader(batch_sampler=sampler))
    sizes, buckets, labels = ds.bucket_sizes, ds.buckets, ds.targets
    for epoch in range(2):
        reference = BucketSampler(ds, 4, num_replicas=1, rank=0, seed=4)
        reference.set_epoch(epoch)
        assert model.seen[epoch] == [(labels[b].tolist(), sizes[buckets[b[0]]].tolist())
                                     for b in reference], epoch
    assert model.seen[0] != model.seen[1]  # Lightning called set_epoch


def test_random_crops_are_each_samples_own_at_every_world_size(store):
    """Crops and flips drawn at decode under a ``ds.loader`` follow each batch's place in the
    global sequence (``drop_last``: 12 full batches, every world size dividing them reads the
    same ones): at 2 and 4 ranks every sample gets the crop it gets at 1 rank, the ranks read
    disjoint batches that together are the 1-rank epoch, and no two ranks share a draw seed."""
    rand = shardkit.ShardDataset(store, crop=16, crop_mode="random_resized", flip=0.5)

    def epoch(world):
        crops, seeds = {}, []
        for rank in range(world):
            sampler = BucketSampler(rand, 4, num_replicas=world, rank=rank, seed=3,
                                    drop_last=True, num_canonical=4)
            sampler.set_epoch(1)
            loader = rand.loader(batch_sampler=sampler,
                                 generator=torch.Generator().manual_seed(5))
            seeds += [s for batch in loader._index_sampler for s in batch.seeds.tolist()]
            for (images, _), idx in zip(loader, list(sampler)):
                assert not set(idx) & set(crops)  # no sample twice, within or across ranks
                crops.update(zip(idx, images.clone()))
        assert len(seeds) == len(set(seeds)) == len(crops)
        return crops

    one = epoch(1)
    assert len(one) == 12 * 4
    for world in (2, 4):
        got = epoch(world)
        assert sorted(got) == sorted(one)
        assert all(torch.equal(got[i], one[i]) for i in one), world
