"""One reproducible stream (issue 26.3): in ``ds.loader`` a sample's random crop and flip are a
pure function of the loader's seed, the epoch and the sample's place in the epoch
(``shardkit.read.draws``). So the batches, pixels included, are the same for any number of
workers (fork or spawn) and any batch size, a mid-epoch resume in a fresh loader (another
``torch.manual_seed``) yields the very same remaining batches, at the same or (``ShardSampler``,
``MixSampler``) another world size, and ``ds[i]`` outside a loader still follows torch's global
RNG. Real stores packed here, real DataLoaders.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from helpers import image_tree
from torch.utils.data import DistributedSampler

import shardkit
from shardkit.errors import OptionError
from shardkit.read import draws

CROP = dict(crop=24, crop_mode="random_resized", flip=0.5)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """24 small photo-like JPEGs of varied sides in 3 classes, packed at 48 into 3 LMDB shards."""
    base = tmp_path_factory.mktemp("reproducible")
    image_tree(str(base / "src"), classes=3, per_class=8, seed=26, sides=(40, 90))
    out = str(base / "s.lmdb")
    shardkit.pack(str(base / "src"), out, size=48, num_shards=3, workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def boxes_store(tmp_path_factory) -> str:
    """12 JPEGs with 3 boxes each (one the whole image) and per-box labels."""
    import simplejpeg

    from shardkit import fields as F

    rng = np.random.default_rng(7)
    path = str(tmp_path_factory.mktemp("reproducible-boxes") / "b.lmdb")
    with shardkit.StoreWriter(path, ["a"], schema=[F.Boxes("boxes"), F.PerBox("labels")]) as w:
        for _ in range(12):
            h, wd = (int(v) for v in rng.integers(40, 90, 2))
            img = rng.integers(0, 256, (h, wd, 3), dtype=np.uint8)
            x1, y1 = rng.uniform(0, wd - 2, 3), rng.uniform(0, h - 2, 3)
            boxes = np.column_stack([x1, y1, rng.uniform(x1, wd), rng.uniform(y1, h)])
            boxes[0] = [0, 0, wd, h]
            w.add_encoded(simplejpeg.encode_jpeg(img, quality=90), 0, h, wd, boxes=boxes,
                          labels=rng.integers(1, 5, 3))
    return path


def images_of(loader, seed: int | None = 1) -> list:
    """Every batch of one epoch: its images (each view's, with views) and its labels. ``loader``
    may be a function making it: called after ``torch.manual_seed(seed)``, so a shuffled
    loader's order (its generator seeded from torch's RNG) is the same every time."""
    if seed is not None:
        torch.manual_seed(seed)
    if callable(loader):
        loader = loader()
    out = []
    for images, labels in loader:
        images = [x.clone() for x in images] if isinstance(images, list) else [images.clone()]
        out.append((images, labels.clone() if isinstance(labels, torch.Tensor) else labels))
    return out


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        len(x[0]) == len(y[0]) and all(torch.equal(u, v) for u, v in zip(x[0], y[0]))
        for x, y in zip(a, b))


def samples(batches: list) -> list[torch.Tensor]:
    """The stream sample by sample (first view), whatever the batch size."""
    return [img for images, _ in batches for img in images[0]]


def roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_random_crops_are_the_same_batches_for_any_worker_count_and_batch_size(store):
    ds = shardkit.ShardDataset(store, **CROP)

    def run(**kw):
        torch.manual_seed(1)  # the loader's seed (torch.initial_seed()) and its shuffle
        return images_of(ds.loader(batch_size=5, shuffle=True, **kw), seed=None)

    base = run()
    assert len(base) == 5
    assert same(run(num_workers=1), base)
    assert same(run(num_workers=2), base)  # fork: each batch drawn in another worker
    assert same(run(num_workers=1, multiprocessing_context="spawn"), base)
    # Batches of 3 in index order hold other neighbours: the same samples, sample by sample.
    torch.manual_seed(1)
    by5 = images_of(ds.loader(batch_size=5, sampler=range(len(ds))), seed=None)
    torch.manual_seed(1)
    by3 = images_of(ds.loader(batch_size=3, sampler=range(len(ds)), num_workers=2), seed=None)
    assert all(torch.equal(a, b) for a, b in zip(samples(by5), samples(by3)))
    # The stream follows the seed, and a generator passed to the loader is the seed.
    torch.manual_seed(2)
    other = images_of(ds.loader(batch_size=5, sampler=range(len(ds))), seed=None)
    assert not any(torch.equal(a, b) for a, b in zip(samples(by5), samples(other)))
    with_gen = [images_of(ds.loader(batch_size=5, sampler=range(len(ds)),
                                    generator=torch.Generator().manual_seed(1)), seed=s)
                for s in (3, 4)]
    assert same(with_gen[0], with_gen[1]) and same(with_gen[0], by5)
    # A second epoch draws anew (a sampler without an epoch: the loader counts them).
    loader = ds.loader(batch_size=5, sampler=range(len(ds)))
    first, second = images_of(loader, seed=1), images_of(loader, seed=1)
    assert same(first, by5) and not any(
        torch.equal(a, b) for a, b in zip(samples(first), samples(second)))


def test_views_and_boxes_are_the_same_for_any_worker_count(store, boxes_store):
    views = [shardkit.View(24, scale=(0.3, 1.0)), shardkit.View(16, scale=(0.05, 0.3)),
             shardkit.View((20, 12), flip=1.0)]
    ds = shardkit.ShardDataset(store, views=views)
    runs = [images_of(lambda: ds.loader(batch_size=4, shuffle=True, num_workers=w))
            for w in (0, 2)]
    assert len(runs[0][0][0]) == 3 and same(runs[0], runs[1])

    boxed = shardkit.ShardDataset(boxes_store, fields=["boxes", "labels"], **CROP)
    got = []
    for workers in (0, 2):
        torch.manual_seed(1)
        got.append([(images.clone(), target["boxes"], target["labels"])
                    for images, target in boxed.loader(batch_size=5, shuffle=True,
                                                       num_workers=workers)])
    assert len(got[0]) == 3
    for (i0, b0, l0), (i1, b1, l1) in zip(*got):
        assert torch.equal(i0, i1)
        assert all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(b0, b1))
        assert all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(l0, l1))


SAMPLERS = {
    "shard": lambda ds: dict(sampler=shardkit.ShardSampler(ds, num_replicas=2, rank=1, seed=4)),
    "distributed": lambda ds: dict(sampler=DistributedSampler(ds, num_replicas=2, rank=0,
                                                              seed=4)),
    "shuffle": lambda ds: dict(shuffle=True),
}


@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_a_resumed_epoch_yields_the_same_remaining_batches_pixels_included(store, kind):
    ds = shardkit.ShardDataset(store, **CROP)
    torch.manual_seed(1)
    loader = ds.loader(batch_size=3, num_workers=2, **SAMPLERS[kind](ds))
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(1)
    it = iter(loader)
    head = [next(it)[0].clone() for _ in range(2)]
    state = roundtrip(loader.state_dict())
    tail = images_of(it, seed=None)

    torch.manual_seed(99)  # a new process: another seed, which the state's replaces
    resumed = ds.loader(batch_size=3, num_workers=2, **SAMPLERS[kind](ds))
    resumed.load_state_dict(state)
    again = images_of(resumed, seed=None)
    assert len(head) + len(tail) == len(loader) and same(again, tail)


def test_a_state_saved_at_an_epochs_end_resumes_with_the_next_epochs_draws(store):
    """Saved after the last batch of an epoch (a sampler without an epoch of its own: the loader
    counts epochs), a fresh loader resumes into the next epoch and draws what the uninterrupted
    loader's second epoch drew, not the first epoch's boxes again."""
    ds = shardkit.ShardDataset(store, **CROP)

    def make():
        return ds.loader(batch_size=5, sampler=range(len(ds)))

    torch.manual_seed(1)
    loader = make()
    first, second = images_of(loader, seed=None), images_of(loader, seed=None)
    assert not any(torch.equal(a, b) for a, b in zip(samples(first), samples(second)))
    torch.manual_seed(1)
    ended = make()
    assert same(images_of(ended, seed=None), first)
    state = roundtrip(ended.state_dict())
    torch.manual_seed(99)  # a new process: the state's seed and epoch replace its own
    resumed = make()
    resumed.load_state_dict(state)
    assert same(images_of(resumed, seed=None), second)


def test_an_elastic_resume_keeps_each_samples_draws(store):
    """Saved at 2 ranks after 2 batches each, resumed at 4: each remaining sample (no padding:
    24 samples) gets the pixels it got in the uninterrupted 2-rank run, and no two ranks ever
    share a seed."""
    ds = shardkit.ShardDataset(store, **CROP)

    def rank_loader(rank: int, world: int):
        sampler = shardkit.ShardSampler(ds, num_replicas=world, rank=rank, seed=5,
                                        num_canonical=4)
        sampler.set_epoch(3)
        return ds.loader(batch_size=3, sampler=sampler)

    whole, state, seeds = {}, None, set()
    for rank in range(2):
        torch.manual_seed(1)
        loader = rank_loader(rank, 2)
        order = loader.sampler.indices().tolist()
        tagged = [batch.seeds.tolist() for batch in loader._index_sampler]
        assert not seeds & {s for b in tagged for s in b}
        seeds |= {s for b in tagged for s in b}
        it = iter(loader)
        images = [next(it)[0].clone() for _ in range(2)]
        if rank == 0:
            state = roundtrip(loader.state_dict())
        images += [b[0].clone() for b in it]
        whole.update(zip(order, torch.cat(images)))
    resumed = {}
    for rank in range(4):
        torch.manual_seed(50 + rank)
        loader = rank_loader(rank, 4)
        loader.load_state_dict(state)
        order = loader.sampler.indices().tolist()
        resumed.update(zip(order, torch.cat([b[0].clone() for b in loader])))
    assert len(resumed) == 12
    assert all(torch.equal(img, whole[i]) for i, img in resumed.items())


def test_a_mix_draws_the_same_for_any_workers_batch_size_and_resume(store, boxes_store):
    """A ``MixSampler``'s batches hold both parts; each part's draws follow its samples."""
    a = shardkit.ShardDataset(store, **CROP)
    b = shardkit.ShardDataset(boxes_store, **CROP)
    mix = shardkit.Mix([a, b])

    def make(batch_size: int, workers: int = 0):
        sampler = shardkit.MixSampler(mix, repeat=[1, 1], num_replicas=1, rank=0, seed=3)
        return mix.loader(batch_size=batch_size, sampler=sampler, num_workers=workers)

    base = images_of(make(6))
    assert same(images_of(make(6, workers=2)), base)
    assert all(torch.equal(x, y) for x, y in zip(samples(images_of(make(4))), samples(base)))
    torch.manual_seed(1)
    loader = make(6, workers=2)
    it = iter(loader)
    next(it)
    state = roundtrip(loader.state_dict())
    torch.manual_seed(7)
    resumed = make(6, workers=2)
    resumed.load_state_dict(state)
    assert same(images_of(resumed, seed=None), base[1:])


def test_outside_a_loader_draws_follow_torch_manual_seed(store):
    """``ds[i]`` and ``ds.__getitems__`` untagged draw from torch's global RNG, as before; a
    tagged index draws what torchvision draws after ``torch.manual_seed`` of its seed."""
    ds = shardkit.ShardDataset(store, **CROP)
    torch.manual_seed(3)
    one = [ds[i][0] for i in range(6)]
    torch.manual_seed(3)
    batch = [img for img, _ in ds.__getitems__(list(range(6)))]
    torch.manual_seed(4)
    other = [ds[i][0] for i in range(6)]
    assert all(torch.equal(x, y) for x, y in zip(one, batch))
    assert not all(torch.equal(x, y) for x, y in zip(one, other))
    seed = draws.sample_seed(1, 0, 5)
    torch.manual_seed(seed)
    untagged = ds[2][0]
    torch.manual_seed(0)
    assert torch.equal(ds[draws.KeyedIndex(2, seed)][0], untagged)
    assert torch.equal(ds.__getitems__(draws.Keyed([2], np.array([seed])))[0][0], untagged)


def test_a_damaged_draws_state_is_refused(store):
    ds = shardkit.ShardDataset(store, **CROP)
    loader = ds.loader(batch_size=4, sampler=range(len(ds)))
    state = loader.state_dict()
    assert set(state["draws"]) == {"seed", "epoch"}
    state["draws"] = {"seed": -1, "epoch": 0}
    with pytest.raises(OptionError, match="draws"):
        loader.load_state_dict(state)


def test_the_thread_engine_gives_the_process_engines_batches_and_resumes_them(store):
    """Random-resized crops, flips and views: the thread engine with 1 and 3 threads (batches
    finishing out of order) gives the process engine's batches (two forked workers), and a
    mid-epoch resume on the thread engine, in a fresh loader under another seed, the rest of
    them, pixels included."""
    views = shardkit.ShardDataset(store, views=[shardkit.View(24), shardkit.View((16, 12))])
    for ds in (shardkit.ShardDataset(store, **CROP), views):
        ref = images_of(lambda: ds.loader(batch_size=4, shuffle=True, num_workers=2))
        for n in (1, 3):
            assert same(images_of(lambda: ds.loader(batch_size=4, shuffle=True, engine="threads",
                                                    num_threads=n, prefetch=3)), ref), n
    torch.manual_seed(1)
    loader = views.loader(batch_size=4, shuffle=True, engine="threads", num_threads=3,
                          prefetch=3)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = roundtrip(loader.state_dict())
    del it
    torch.manual_seed(42)
    resumed = views.loader(batch_size=4, shuffle=True, engine="threads", num_threads=2)
    resumed.load_state_dict(state)
    assert len(head) == 2 and same(images_of(resumed, seed=None), ref[2:])


def test_torch_subset_and_concat_dataset_keep_the_stream_or_are_refused(store):
    """Torch's own ``Subset``/``ConcatDataset`` hand their datasets plain indices: the draw seeds
    are lost, and the random crops would follow each worker's RNG. Around a dataset that draws,
    a loader over them gives the same batches on 0 and 2 workers, or refuses them in one line
    naming what keeps the seeds; ``ds.subset`` and ``Mix`` give the same batches, and a wrapper
    around a dataset that draws nothing is left alone."""
    from torch.utils.data import ConcatDataset, Subset

    ds = shardkit.ShardDataset(store, **CROP)
    centre = shardkit.ShardDataset(store, crop=24)
    picked = list(range(0, len(ds), 2))

    def both(dataset):
        return [images_of(lambda: shardkit.ShardLoader(
            dataset, batch_size=4, shuffle=True, num_workers=workers,
            collate_fn=shardkit.collate, worker_init_fn=shardkit.worker_init_fn))
            for workers in (0, 2)]

    for wrapped, instead in ((Subset(ds, picked), "ds.subset(indices)"),
                             (ConcatDataset([ds, centre]), "shardkit.Mix"),
                             (shardkit.Mix([Subset(ds, picked), centre]), "ds.subset(indices)")):
        try:
            runs = both(wrapped)
        except OptionError as exc:
            assert instead in str(exc) and "\n" not in str(exc)
            assert str(exc).startswith(f"dataset: torch's {type(wrapped).__name__}"
                                       if type(wrapped) is not shardkit.Mix else
                                       "dataset: torch's Subset")
        else:
            assert same(*runs), f"{type(wrapped).__name__}: 0 and 2 workers drew differently"
    for kept in (ds.subset(picked), shardkit.Mix([ds, centre]), Subset(centre, picked)):
        runs = both(kept)
        assert len(runs[0]) == -(-len(kept) // 4) and same(*runs)
