"""``ShardDataset(path, views=[View(...), ...])``: several RandomResizedCrop + flip views of a
sample from one decode (self-supervised multi-crop), without torchvision (its pixel identity
with v2 is in test_torchvision_parity.py).

Each view equals the single-view recipe (``crop_mode="random_resized"``) drawn from the RNG state
that view starts from; each record is decoded once for all its views; the batched path, threads,
subsets, fork and spawn DataLoader workers, HDF5 and multi-shard stores give what the per-item
path gives under the same RNG; fields follow every view.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import shardkit
from shardkit import OptionError, ShardDataset, ShardSampler, View
from shardkit.bench.sample import make_sample
from shardkit.read import cut

# Two "global" views and three "local" ones (one non-square), DINO-like at a small scale.
VIEWS = [View(40, scale=(0.32, 1.0))] * 2 + [View(16, scale=(0.05, 0.32), flip=1.0)] * 2 \
    + [View((20, 12), scale=(0.1, 0.5))]


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("views")
    make_sample(str(base / "src"), 20, 3, seed=25, workers=1)
    out = {"lmdb": str(base / "s.lmdb"), "shards": str(base / "shards"),
           "hdf5": str(base / "h5")}
    shardkit.pack(str(base / "src"), out["lmdb"], size=56, workers=1, progress=False)
    shardkit.pack(str(base / "src"), out["shards"], size=56, num_shards=3, workers=1,
                  progress=False)
    shardkit.pack(str(base / "src"), out["hdf5"], size=56, num_shards=2, format="hdf5",
                  workers=1, progress=False)
    return out


def _items(ds: ShardDataset, indices) -> list:
    return [ds[i] for i in indices]


def _same_views(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y)
                                    for x, y in zip(a, b))


def test_each_view_is_the_single_view_recipe_from_its_rng_state_and_one_decode(
        stores, monkeypatch):
    square = [v for v in VIEWS if v.size[0] == v.size[1]]
    ds = ShardDataset(stores["lmdb"], views=square)
    singles = [ShardDataset(stores["lmdb"], crop=v.size[0], crop_mode="random_resized",
                            scale=v.scale, ratio=v.ratio, flip=v.flip, dct_scale=False)
               for v in square]
    n = len(ds)
    torch.manual_seed(7)
    expected = [[single[i][0] for single in singles] for i in range(n)]  # view after view

    decodes = []
    real = cut.decode_boxes

    def counting(data, *args, **kwargs):
        decodes.append(bytes(data[:0]))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(cut, "decode_boxes", counting)
    torch.manual_seed(7)
    items = _items(ds, range(n))
    assert len(decodes) == n  # one decode per record for all five... four views
    torch.manual_seed(7)
    batch = ds.__getitems__(list(range(n)))
    assert len(decodes) == 2 * n
    images, labels = shardkit.collate(batch)
    assert [tuple(t.shape) for t in images] == [(n, 3, 40, 40)] * 2 + [(n, 3, 16, 16)] * 2
    assert all(t.dtype == torch.uint8 for t in images)
    assert labels.tolist() == [int(x) for x in ds.targets]
    for i in range(n):
        assert _same_views(items[i][0], expected[i]), i
        assert _same_views([images[v][i] for v in range(len(square))], expected[i]), i
        assert items[i][1] == labels[i]
    # the views differ from each other (no box reused for another view)
    assert not torch.equal(images[0], images[1]) and not torch.equal(images[2], images[3])


def test_batches_threads_subsets_and_numpy_equal_items(stores):
    ds = ShardDataset(stores["shards"], views=VIEWS)
    threaded = ShardDataset(stores["shards"], views=VIEWS, threads=2)
    sub = ds.subset([5, 0, 17, 9, 12])
    as_numpy = ShardDataset(stores["shards"], views=VIEWS, output="numpy")
    indices = [3, 19, 0, 8, 11, 2]
    torch.manual_seed(1)
    items = _items(ds, indices)
    for other in (ds, threaded):
        torch.manual_seed(1)
        images, _ = shardkit.collate(other.__getitems__(indices))
        for k, (views, _) in enumerate(items):
            assert _same_views([images[v][k] for v in range(len(VIEWS))], views)
    assert [tuple(t.shape) for t in images][-1] == (len(indices), 3, 20, 12)
    torch.manual_seed(1)
    numpy_batch = shardkit.collate(as_numpy.__getitems__(indices))[0]
    assert all(torch.equal(a.permute(0, 3, 1, 2), b) for a, b in zip(numpy_batch, images))
    torch.manual_seed(2)
    sub_items = _items(sub, range(len(sub)))
    torch.manual_seed(2)
    plain = _items(ds, [5, 0, 17, 9, 12])
    assert all(_same_views(a[0], b[0]) and a[1] == b[1] for a, b in zip(sub_items, plain))


@pytest.mark.parametrize("store, context", [("shards", "fork"), ("hdf5", "spawn")])
def test_loader_workers_give_the_per_item_views_under_each_samples_seed(stores, store, context):
    """Two workers, a shuffled ShardSampler: the sample at place ``p`` of the epoch is the item
    read here after ``torch.manual_seed(shardkit.sample_seed(seed, epoch, p))``, whichever
    worker read it."""
    ds = ShardDataset(stores[store], views=VIEWS)
    sampler = ShardSampler(ds, num_replicas=1, rank=0, seed=3)
    order = list(sampler)
    first, step = sampler.global_places()
    batch = 4
    loader = ds.loader(batch_size=batch, sampler=sampler, num_workers=2,
                       generator=torch.Generator().manual_seed(11),
                       multiprocessing_context=context, persistent_workers=False)
    got = [([t.clone() for t in images], labels.clone()) for images, labels in loader]
    assert len(got) == -(-len(order) // batch)
    for b, (images, labels) in enumerate(got):
        items = []
        for k in range(b * batch, min(b * batch + batch, len(order))):
            torch.manual_seed(shardkit.sample_seed(11, 0, first + k * step))
            items.append(ds[order[k]])
        assert labels.tolist() == [label for _, label in items]
        for v, view in enumerate(VIEWS):
            assert images[v].shape == (len(items), 3, *view.size)
            assert torch.equal(images[v], torch.stack([views[v] for views, _ in items]))


def test_fields_follow_every_view(tmp_path):
    """Per view: a box covering the whole image becomes the whole view (flipped or not), and
    the batched targets are the items' targets, list per view."""
    from shardkit import fields as F

    rng = np.random.default_rng(4)
    path = str(tmp_path / "f.lmdb")
    with shardkit.StoreWriter(path, ["a"], schema=[F.Boxes("boxes"), F.PerBox("labels")],
                              encoding="raw") as w:
        for h, wd in [(30, 41), (37, 29), (45, 45)]:
            w.add(rng.integers(0, 255, (h, wd, 3), dtype=np.uint8), 0,
                  boxes=np.array([[0, 0, wd, h], [1, 1, 2.5, 3]], np.float32),
                  labels=np.array([1, 2]))
    views = [View(24, scale=(0.3, 1.0)), View(12, scale=(0.05, 0.3), flip=1.0),
             View((10, 18), scale=(0.3, 1.0))]  # (height, width): boxes scale per axis
    ds = ShardDataset(path, views=views, fields=["boxes", "labels"], tv_tensors=False)
    torch.manual_seed(0)
    items = _items(ds, range(3))
    torch.manual_seed(0)
    images, targets = shardkit.collate(ds.__getitems__([0, 1, 2]))
    assert len(targets) == 3 and [tuple(t.shape) for t in images] == [
        (3, 3, 24, 24), (3, 3, 12, 12), (3, 3, 10, 18)]
    for i, (views_i, per_view) in enumerate(items):
        assert len(per_view) == 3
        for v, view in enumerate(views):
            height, width = view.size
            # (float32 arithmetic as v2's: the exact bits are checked against v2 itself in
            # test_torchvision_parity.py)
            assert torch.allclose(per_view[v]["boxes"][0],
                                  torch.tensor([0., 0., width, height]), atol=1e-4)
            assert torch.equal(targets[v]["boxes"][i], per_view[v]["boxes"])
            assert torch.equal(targets[v]["labels"][i], per_view[v]["labels"])
            assert torch.equal(images[v][i], views_i[v])


def test_bad_views_are_option_errors_naming_the_parameter(stores):
    for kwargs, word in [(dict(size=0), "View size"), (dict(size=(3, True)), "View size"),
                         (dict(size=8, scale=(0.5, 0.1)), "View scale"),
                         (dict(size=8, ratio="x"), "View ratio"),
                         (dict(size=8, flip=1.5), "View flip")]:
        with pytest.raises(OptionError, match=word):
            View(**kwargs)
    with pytest.raises(OptionError, match="views"):
        ShardDataset(stores["lmdb"], views=View(8))
    with pytest.raises(OptionError, match="views"):
        ShardDataset(stores["lmdb"], views=[])
    for kwargs in (dict(crop=8), dict(crop_mode="random_resized"), dict(flip=0.5),
                   dict(scale=(0.5, 1.0)), dict(output="bytes")):
        with pytest.raises(OptionError, match="views cannot be used with"):
            ShardDataset(stores["lmdb"], views=[View(8)], **kwargs)
    ds = ShardDataset(stores["lmdb"], views=[View(8)])
    with pytest.raises(OptionError, match="views"):
        ds.transform = lambda x: x
    assert View(8) == View((8, 8)) and hash(View(8)) == hash(View((8, 8)))
    with pytest.raises(AttributeError):
        View(8).flip = 0.1  # frozen


def test_views_through_mix_sampler_lightning_and_normalize(stores):
    """A Mix of two view stores under MixSampler, Lightning's ShardDataModule, and
    ``normalize=``: every view batch comes out, each one normalised."""
    from shardkit.lightning import ShardDataModule

    views = [View(24), View(16, flip=1.0)]
    a, b = ShardDataset(stores["lmdb"], views=views), ShardDataset(stores["hdf5"], views=views)
    mix = shardkit.Mix([a, b])
    sampler = shardkit.MixSampler(mix, proportion=[0.5, 0.5], epoch_size=16, seed=1,
                                  num_replicas=1, rank=0)
    batches = list(mix.loader(batch_size=8, sampler=sampler))
    assert len(batches) == 2
    targets = np.concatenate([a.targets, b.targets])
    for (images, labels), k in zip(batches, (0, 8)):
        assert [tuple(v.shape) for v in images] == [(8, 3, 24, 24), (8, 3, 16, 16)]
        assert labels.tolist() == targets[list(sampler)[k:k + 8]].tolist()

    dm = ShardDataModule(ShardDataset(stores["shards"], views=views), batch_size=4,
                         normalize=([0.5] * 3, [0.25] * 3))
    raw, labels = next(iter(dm.train_dataloader()))
    assert [tuple(v.shape) for v in raw] == [(4, 3, 24, 24), (4, 3, 16, 16)]
    images, _ = dm.on_after_batch_transfer([raw, labels], 0)
    for view, uint8 in zip(images, raw):
        assert view.dtype == torch.float32 and view.is_contiguous()
        assert torch.equal(view, (uint8.float().div(255) - 0.5) / 0.25)


@pytest.mark.parametrize("engine, workers", [("processes", 0), ("processes", 2), ("threads", 0)])
def test_normalize_gives_float_views_made_where_the_batch_is_made(stores, engine, workers):
    """``ds.loader(normalize=...)`` over views: each view equals the uint8 view normalised in
    the loop (``shardkit.normalize``), in the layout asked for; with workers the float views are
    made there (they arrive in shared memory, as a worker's batch does)."""
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    ds = ShardDataset(stores["shards"], views=VIEWS)
    common = dict(batch_size=8, sampler=range(len(ds)), engine=engine, num_workers=workers,
                  generator=torch.Generator().manual_seed(11))
    if workers:
        common.update(multiprocessing_context="fork", persistent_workers=False)
    raw = [([v.clone() for v in views], labels.clone()) for views, labels in ds.loader(**common)]
    fmt = torch.channels_last if workers else torch.contiguous_format
    got = list(ds.loader(**common, normalize=(mean, std), memory_format=fmt))
    assert len(got) == len(raw) == 3
    for (views, labels), (uint8, raw_labels) in zip(got, raw):
        assert torch.equal(labels, raw_labels) and len(views) == len(VIEWS)
        for view, want in zip(views, uint8):
            assert view.dtype == torch.float32 and view.is_contiguous(memory_format=fmt)
            assert torch.equal(view, shardkit.normalize(want, mean, std))
            assert view.untyped_storage().is_shared() == bool(workers)
