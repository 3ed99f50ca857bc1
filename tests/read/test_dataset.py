"""``ShardDataset``: outputs, crops, batches, pickling, and real DataLoader worker processes."""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler

import shardkit
from helpers import flip_byte_in_file, reference_center_crop
from shardkit import Batch, ShardDataset
from shardkit.errors import OptionError, ShardkitError, StoreError

pytestmark = pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")


def list_collate(batch):
    """A collate function that keeps samples as they are (images of different sizes)."""
    return list(batch)


def digest(img) -> str:
    arr = img.numpy() if isinstance(img, torch.Tensor) else np.asarray(img)
    return hashlib.sha1(np.ascontiguousarray(arr).tobytes()).hexdigest()


def same_sample(a, b) -> bool:
    (x, ya), (y, yb) = a, b
    if isinstance(x, Image.Image):
        x, y = np.asarray(x), np.asarray(y)
    if isinstance(x, torch.Tensor):
        return torch.equal(x, y) and ya == yb
    if isinstance(x, np.ndarray):
        return np.array_equal(x, y) and ya == yb
    return x == y and ya == yb


# -- outputs and attributes -----------------------------------------------------------------------

def test_output_modes_agree(quirky_store):
    tensor = ShardDataset(quirky_store)
    numpy_ = ShardDataset(quirky_store, output="numpy")
    pil = ShardDataset(quirky_store, output="pil")
    raw = ShardDataset(quirky_store, output="bytes")
    for i in range(len(tensor)):
        t, label = tensor[i]
        n, l2 = numpy_[i]
        p, l3 = pil[i]
        b, l4 = raw[i]
        assert label == l2 == l3 == l4 == int(tensor.targets[i])
        assert isinstance(label, int)
        assert t.dtype == torch.uint8 and t.ndim == 3 and t.shape[0] == 3
        assert n.dtype == np.uint8 and n.shape == (t.shape[1], t.shape[2], 3)
        assert torch.equal(t, torch.from_numpy(n).permute(2, 0, 1))
        assert p.mode == "RGB" and p.size == (n.shape[1], n.shape[0])
        assert np.array_equal(np.asarray(p), n)
        assert isinstance(b, bytes)
        if tensor.encoding == "jpeg":
            assert b[:2] == b"\xff\xd8"
            assert np.array_equal(simplejpeg.decode_jpeg(b, colorspace="RGB"), n)
        else:
            assert b == n.tobytes()


def test_numpy_output_is_writable_and_owned(photo_store):
    """The caller may modify what it gets without damaging the store or later reads."""
    ds = ShardDataset(photo_store, output="numpy")
    first, _ = ds[0]
    expected = first.copy()
    first[:] = 0
    assert np.array_equal(ds[0][0], expected)


def test_imagefolder_attributes(photo_src, photo_store):
    ds = ShardDataset(photo_store)
    classes = sorted({rel.split(os.sep)[0] for rel, _ in photo_src[1]})
    assert ds.classes == classes
    assert ds.class_to_idx == {c: i for i, c in enumerate(classes)}
    assert len(ds) == len(photo_src[1])
    assert ds.targets.tolist() == [label for _, label in photo_src[1]]
    assert [ds.source_path(i) for i in range(len(ds))] == [rel for rel, _ in photo_src[1]]
    with pytest.raises(IndexError):
        ds[len(ds)]
    assert same_sample(ds[-1], ds[len(ds) - 1])


def test_transform_and_target_transform(photo_store):
    plain = ShardDataset(photo_store)
    ds = ShardDataset(photo_store, transform=lambda t: t.float().mean(),
                      target_transform=lambda y: f"class-{y}")
    for i in (0, 5, 63):
        img, label = ds[i]
        ref, ref_label = plain[i]
        assert img.item() == pytest.approx(ref.float().mean().item())
        assert label == f"class-{ref_label}"
    batch = ds.__getitems__([3, 1])
    assert [label for _, label in batch] == [f"class-{plain[3][1]}", f"class-{plain[1][1]}"]
    cropped = ShardDataset(photo_store, crop=16, output="numpy", target_transform=lambda y: y + 100)
    assert [label for _, label in cropped.__getitems__([0, 1])] == [plain[0][1] + 100,
                                                                    plain[1][1] + 100]


def test_bad_arguments():
    with pytest.raises(ValueError):
        ShardDataset("x", output="jpeg")
    with pytest.raises(ValueError):
        ShardDataset("x", crop_mode="top")
    with pytest.raises(StoreError):
        ShardDataset("/nonexistent/store.lmdb")


def test_arguments_that_could_only_fail_later_are_refused_up_front(photo_store, tmp_path,
                                                                   monkeypatch):
    with pytest.raises(ValueError, match=r"crop_mode='random' needs crop\b"):
        ShardDataset(photo_store, crop_mode="random")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_open_shards must be a positive integer"):
            ShardDataset(photo_store, max_open_shards=bad)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path / "cache"))
    # A URL is a remote store (tests/test_remote_store.py), never a local folder named "s3:".
    for url, error, expected in (
            ("nosuch://b/store/", ShardkitError, "nosuch://b/store: ValueError: Protocol not "
             "known: nosuch (remote stores need fsspec and the package for this protocol)"),
            (f"file://{tmp_path}/none", StoreError, f"file://{tmp_path}/none has no "
             "manifest.json: not a shardkit store, or a pack that did not finish")):
        with pytest.raises(error, match=f"^{re.escape(expected)}$"):
            ShardDataset(url)
    assert os.listdir(tmp_path) == []


# -- crops ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [33, 80, 224])
def test_center_crop_matches_torchvision(quirky_store, size):
    """Centre crop at decode time == torchvision CenterCrop (zero padding for small images)."""
    full = ShardDataset(quirky_store, output="numpy")
    crop = ShardDataset(quirky_store, output="numpy", crop=size)
    tensor = ShardDataset(quirky_store, crop=size)
    padded = 0
    for i in range(len(full)):
        ref = reference_center_crop(full[i][0], size)
        got = crop[i][0]
        assert got.shape == (size, size, 3)
        assert np.array_equal(got, ref), (i, full[i][0].shape)
        assert np.array_equal(tensor[i][0].permute(1, 2, 0).numpy(), ref)
        padded += min(full[i][0].shape[:2]) < size
    batch = crop.__getitems__(list(range(len(crop))))
    for i, (img, label) in enumerate(batch):
        assert np.array_equal(img, reference_center_crop(full[i][0], size))
        assert label == full[i][1]
    if size > 33:
        assert padded > 0


def _crop_offsets(full: np.ndarray, crop: np.ndarray) -> list[tuple[int, int]]:
    """Every (top, left) of ``full`` (zero-padded centrally on too-small sides) giving ``crop``."""
    c = crop.shape[0]
    h, w = full.shape[:2]
    tops = range(0, h - c + 1) if h >= c else [-((c - h) // 2)]
    lefts = range(0, w - c + 1) if w >= c else [-((c - w) // 2)]
    pad_y, pad_x = max(0, c - h), max(0, c - w)
    padded = np.pad(full, ((pad_y, pad_y), (pad_x, pad_x), (0, 0)))
    return [(t, l) for t in tops for l in lefts
            if np.array_equal(padded[t + pad_y:t + pad_y + c, l + pad_x:l + pad_x + c], crop)]


def test_random_crop_within_bounds_seeded_and_reproducible(photo_store):
    size = 32  # the photos' sides are 24..80: some sides need padding, most have room to move
    full = ShardDataset(photo_store, output="numpy")
    ds = ShardDataset(photo_store, output="numpy", crop=size, crop_mode="random")
    n = len(ds)

    def epoch(seed: int, dataset=ds) -> list[np.ndarray]:
        torch.manual_seed(seed)
        return [dataset[i][0] for i in range(n)]

    a = epoch(0)
    origins = set()
    for i, img in enumerate(a):
        found = _crop_offsets(full[i][0], img)
        assert found, f"record {i}: crop is not a window of the image"
        origins.add(found[0])
    assert len(origins) > n // 2  # really random, not always the same corner
    assert all(np.array_equal(x, y) for x, y in zip(a, epoch(0)))  # same instance, reseeded
    fresh = ShardDataset(photo_store, output="numpy", crop=size, crop_mode="random")
    assert all(np.array_equal(x, y) for x, y in zip(a, epoch(0, fresh)))
    b = epoch(1)
    assert sum(not np.array_equal(x, y) for x, y in zip(a, b)) > n // 2
    torch.manual_seed(0)
    batch = ds.__getitems__(list(range(n)))
    assert all(np.array_equal(x, y) for x, (y, _) in zip(a, batch))


# -- batches and threads --------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{}, {"output": "numpy"}, {"output": "pil"}, {"output": "bytes"},
                                    {"crop": 40}, {"crop": 40, "output": "numpy"},
                                    {"crop": 40, "threads": 2}, {"threads": 2, "output": "numpy"}],
                         ids=lambda k: "-".join(f"{a}={b}" for a, b in k.items()) or "tensor")
def test_getitems_equals_getitem(photo_store, kwargs):
    ds = ShardDataset(photo_store, **kwargs)
    indices = [5, 0, 63, 5, 17, 2, 40, 40]
    batch = ds.__getitems__(indices)
    assert len(batch) == len(indices)
    for index, sample in zip(indices, batch):
        assert same_sample(sample, ds[index])
    if "crop" in kwargs:
        assert isinstance(batch, Batch)
        images, labels = shardkit.collate(batch)
        assert labels.tolist() == [ds[i][1] for i in indices]
        assert images.shape[0] == len(indices)


@pytest.mark.parametrize("crop", [None, 48])
def test_threads_give_identical_pixels(quirky_store, crop):
    one = ShardDataset(quirky_store, output="numpy", crop=crop)
    two = ShardDataset(quirky_store, output="numpy", crop=crop, threads=2)
    indices = list(range(len(one))) * 2
    for a, b in zip(one.__getitems__(indices), two.__getitems__(indices)):
        assert same_sample(a, b)
    two.close()


def test_verify_detects_damaged_record(photo_src, tmp_path):
    path = str(tmp_path / "s.h5")
    shardkit.pack(photo_src[0], path, workers=1, progress=False)
    record = ShardDataset(path, output="bytes")[7][0]
    flip_byte_in_file(path, record, len(record) // 2)
    ds = ShardDataset(path, verify=True)
    ds[6]
    with pytest.raises(StoreError, match="checksum"):
        ds[7]


def test_two_datasets_on_one_lmdb_file(pack_photos):
    """lmdb 3 refuses a second open of one file: datasets on it share one environment."""
    path = pack_photos("lmdb")
    a, b = ShardDataset(path), ShardDataset(path)
    assert same_sample(a[3], b[3])
    a.close()
    assert same_sample(b[4], ShardDataset(path)[4])
    b.close()


# -- pickling -------------------------------------------------------------------------------------

HANDLE_MARKERS = (b"Environment", b"h5py", b"memmap", b"OpenShard", b"ShardReader", b"Thread")


@pytest.mark.parametrize("kwargs", [{}, {"crop": 24, "crop_mode": "random", "threads": 2}])
def test_pickle_before_and_after_use(photo_store, kwargs):
    ds = ShardDataset(photo_store, **kwargs)
    before = pickle.dumps(ds)
    torch.manual_seed(0)
    samples = [ds[i] for i in range(len(ds))]
    ds.__getitems__([1, 2, 3])
    assert len(ds.targets) == len(ds)
    ds.source_path(3)
    after = pickle.dumps(ds)
    assert len(after) <= len(before), "pickled dataset grew with use"
    assert len(after) < 16_000
    for marker in HANDLE_MARKERS:
        assert marker not in before and marker not in after, marker
    copy = pickle.loads(after)
    torch.manual_seed(0)
    assert all(same_sample(s, copy[i]) for i, s in enumerate(samples))
    torch.manual_seed(1)  # random crops: the same draws for both
    unpickled = pickle.loads(before)[5]
    torch.manual_seed(1)
    assert same_sample(unpickled, ds[5])
    copy.close()
    ds.close()


# -- DataLoader workers ---------------------------------------------------------------------------

def _identify(ds: ShardDataset) -> dict[str, int]:
    """Digest of each record's (decoded, cropped) pixels -> index, from the main process."""
    ident = {digest(ds[i][0]): i for i in range(len(ds))}
    assert len(ident) == len(ds), "records must be distinguishable"
    return ident


LOADER_CASES = [
    # (format, start method, worker_init_fn, persistent, crop)
    ("lmdb", "fork", True, True, 32),
    ("hdf5", "fork", False, False, None),
    ("lmdb", "fork", False, True, None),
    ("hdf5", "spawn", True, True, 32),
    ("lmdb", "spawn", False, True, None),
]


@pytest.mark.parametrize("fmt,method,init,persistent,crop", LOADER_CASES,
                         ids=["-".join(map(str, c)) for c in LOADER_CASES])
def test_dataloader_workers(pack_photos, fmt, method, init, persistent, crop):
    """2 workers: every index exactly once per epoch, labels match targets, shuffled, 3 epochs.

    The dataset is used in the parent first, so a handle exists there before workers fork.
    """
    ds = ShardDataset(pack_photos(fmt), crop=crop)
    ident = _identify(ds)  # opens the store in this (parent) process
    targets = ds.targets.tolist()
    loader = DataLoader(
        ds, batch_size=7, shuffle=True, num_workers=2, multiprocessing_context=method,
        persistent_workers=persistent, pin_memory=True, prefetch_factor=3,
        worker_init_fn=shardkit.worker_init_fn if init else None,
        collate_fn=shardkit.collate if crop else list_collate,
        generator=torch.Generator().manual_seed(0))
    orders = []
    for _ in range(3):
        seen = []
        for batch in loader:
            if crop:
                images, labels = batch
                assert images.shape[1:] == (3, crop, crop) and images.dtype == torch.uint8
                pairs = zip(images, labels.tolist())
            else:
                pairs = batch
            for img, label in pairs:
                index = ident[digest(img)]
                assert label == targets[index]
                seen.append(index)
        assert sorted(seen) == list(range(len(ds)))
        orders.append(seen)
    assert orders[0] != list(range(len(ds))) and orders[0] != orders[1]
    assert same_sample(ds[0], ShardDataset(pack_photos(fmt), crop=crop)[0])  # parent still fine
    ds.close()


def test_fork_after_parent_use_reopens_in_child(pack_photos):
    """The parent's LMDB environment, inherited over fork, is not used by the child (lmdb 3 would
    refuse to reopen the file); the child opens its own and the parent keeps working."""
    ds = ShardDataset(pack_photos("lmdb"), output="bytes")
    expected = [ds[i] for i in range(len(ds))]
    for init in (None, shardkit.worker_init_fn):
        loader = DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="fork",
                            worker_init_fn=init, collate_fn=list_collate)
        assert [s for batch in loader for s in batch] == expected
        assert ds[3] == expected[3]


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
@pytest.mark.parametrize("init", [None, shardkit.worker_init_fn], ids=["lazy", "init_fn"])
def test_forked_child_never_uses_parents_handle(pack_photos, tmp_path, fmt, init):
    """The parent opens the store, then the file is replaced by a copy with one record changed.
    Forked workers must not use the inherited handle: each opens its own, of the file the store
    pinned when it was first opened, so they read the old contents (never a mix of the two)."""
    path = str(tmp_path / f"s{'.lmdb' if fmt == 'lmdb' else '.h5'}")
    shutil.copyfile(pack_photos(fmt), path)
    ds = ShardDataset(path, output="bytes")
    old = [ds[i] for i in range(len(ds))]  # the parent now holds an open handle
    inherited = ds.store.shard(0)
    shutil.copyfile(path, path + ".new")
    flip_byte_in_file(path + ".new", old[5][0], len(old[5][0]) // 2)
    os.replace(path + ".new", path)
    assert ds[5] == old[5]  # this process keeps reading through its own (old) handle

    class Probe(torch.utils.data.Dataset):
        dataset = ds  # where shardkit.worker_init_fn finds it

        def __len__(self):
            return len(ds)

        def __getitem__(self, i):
            sample = ds[i]
            # open_shards lists only shards this process opened itself (never inherited ones)
            return sample, ds.store.shard(0) is inherited, ds.store.open_shards == [0]

    loader = DataLoader(Probe(), batch_size=4, num_workers=2, multiprocessing_context="fork",
                        worker_init_fn=init, collate_fn=list_collate)
    got = [s for batch in loader for s in batch]
    assert [sample for sample, _, _ in got] == old
    assert not any(reused for _, reused, _ in got)
    assert all(owned for _, _, owned in got)
    ds.close()


def test_num_workers_zero(photo_store):
    ds = ShardDataset(photo_store, crop=24)
    loader = DataLoader(ds, batch_size=10, num_workers=0, collate_fn=shardkit.collate)
    images, labels = next(iter(loader))
    assert images.shape == (10, 3, 24, 24)
    assert labels.tolist() == ds.targets[:10].tolist()


def test_distributed_sampler_covers_every_index_once(photo_store):
    """Two ranks (simulated in one process): together, every index exactly once per epoch."""
    ds = ShardDataset(photo_store, output="bytes")
    ident = {ds[i][0]: i for i in range(len(ds))}
    targets = ds.targets.tolist()
    samplers = [DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=3)
                for r in range(2)]
    loaders = [DataLoader(ds, batch_size=4, sampler=samplers[0], num_workers=0,
                          collate_fn=list_collate),
               DataLoader(ds, batch_size=4, sampler=samplers[1], num_workers=2,
                          multiprocessing_context="fork", worker_init_fn=shardkit.worker_init_fn,
                          collate_fn=list_collate)]
    epochs = []
    for epoch in range(2):
        per_rank = []
        for sampler, loader in zip(samplers, loaders):
            sampler.set_epoch(epoch)
            got = []
            for batch in loader:
                for data, label in batch:
                    assert label == targets[ident[data]]
                    got.append(ident[data])
            assert got == list(sampler)
            per_rank.append(got)
        assert len(per_rank[0]) == len(per_rank[1]) == len(ds) // 2
        assert sorted(per_rank[0] + per_rank[1]) == list(range(len(ds)))
        epochs.append(per_rank)
    assert epochs[0] != epochs[1]


def test_dropped_dataset_gives_its_lmdb_environment_back(pack_photos, tmp_path):
    """lmdb refuses a second open of a file in one process: a dataset garbage-collected without
    close() must not leave its environment registered."""
    import gc

    import lmdb

    path = str(tmp_path / "copy.lmdb")
    shutil.copyfile(pack_photos("lmdb"), path)
    ds = ShardDataset(path)
    ds[0]
    del ds
    gc.collect()
    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    assert env.stat()["entries"] > 0
    env.close()


# -- indices, batch types and option errors (issue 15: 3, 4, 10) ----------------------------------

def _list_error(items: list, index) -> type[BaseException] | None:
    """The exception a Python list of ``items`` raises for ``items[index]`` (None: none)."""
    try:
        items[index]
    except (TypeError, IndexError) as exc:
        return type(exc)
    return None


BAD_INDICES = [1.9, 1.0, "3", b"3", np.float64(2.0), np.float32(1.0), 2**63, -2**63, 2**64,
               -(2**64), 10**30, 64, -65, None, 1j]


@pytest.mark.parametrize("index", BAD_INDICES, ids=repr)
def test_an_index_is_checked_as_a_list_checks_it(photo_store, index):
    """The error a list of as many records raises, for ``ds[i]`` and for a batch holding it."""
    ds = ShardDataset(photo_store, crop=16)
    expected = _list_error(list(range(len(ds))), index)
    assert expected is not None
    with pytest.raises(expected):
        ds[index]
    with pytest.raises(expected):
        ds.__getitems__([0, index])
    with pytest.raises(expected):
        ds.source_path(index)


def test_integer_indices_of_every_kind_read_the_record(photo_store):
    ds = ShardDataset(photo_store, crop=16)
    n = len(ds)
    for index in (3, np.int64(3), np.int32(3), np.uint8(3), torch.tensor(3), 3 - n):
        assert same_sample(ds[index], ds[3])
    assert same_sample(ds[True], ds[1])  # a list takes a bool as 0/1 too
    indices = [0, n - 1, -1, 5]
    for form in (indices, np.array(indices), np.array(indices, np.int32), torch.tensor(indices),
                 tuple(indices)):
        got = ds.__getitems__(form)
        assert all(same_sample(a, ds[i]) for a, i in zip(got, indices))
    assert list(ds.__getitems__(np.array([], np.int64))) == []
    assert list(ds.__getitems__(np.array([n - 1], np.uint64)))[0][1] == ds[n - 1][1]
    with pytest.raises(IndexError):
        ds.__getitems__(np.array([n], np.uint64))


@pytest.mark.parametrize("context, workers", [(None, 0), ("fork", 2), ("spawn", 2)],
                         ids=["main-process", "fork", "spawn"])
def test_numpy_output_batches_are_one_type_for_either_collate(photo_store, context, workers):
    """``output="numpy"`` with ``crop``: numpy H x W x C samples; the batch is what torch's
    default collate makes of them (a uint8 N x H x W x C tensor), with ``shardkit.collate`` too."""
    ds = ShardDataset(photo_store, crop=24, output="numpy")
    sample = ds[0][0]
    assert isinstance(sample, np.ndarray) and sample.shape == (24, 24, 3)
    kwargs = dict(batch_size=8, num_workers=workers, multiprocessing_context=context,
                  worker_init_fn=shardkit.worker_init_fn)
    default = [(x.clone(), y) for x, y in DataLoader(ds, **kwargs)]
    ours = [(x.clone(), y) for x, y in DataLoader(ds, collate_fn=shardkit.collate, **kwargs)]
    from_loader = [(x.clone(), y) for x, y in ds.loader(**kwargs)]
    assert len(default) == len(ours) == len(from_loader) == len(ds) // 8
    for (a, la), (b, lb), (c, lc) in zip(default, ours, from_loader):
        assert type(a) is type(b) is type(c) is torch.Tensor
        assert a.dtype == b.dtype == torch.uint8 and a.shape == b.shape == (8, 24, 24, 3)
        assert torch.equal(a, b) and torch.equal(a, c)
        assert torch.equal(la, lb) and torch.equal(la, lc)
    assert np.array_equal(default[0][0][0].numpy(), sample)


OPTION_CASES = [
    ({"output": "jpeg"}, "output"), ({"crop_mode": "top"}, "crop_mode"),
    ({"crop_mode": "random"}, "crop_mode='random' needs crop"), ({"crop": 0}, "crop"),
    ({"crop": 2.5}, "crop"), ({"crop": "224"}, "crop"), ({"crop": True}, "crop"),
    ({"crop": 16, "output": "bytes"}, "crop"), ({"threads": -1}, "threads"),
    ({"threads": 1.5}, "threads"), ({"max_open_shards": 0}, "max_open_shards"),
    ({"crop": 16, "flip": 2}, "flip"), ({"crop": 16, "crop_mode": "random_resized",
                                         "scale": (0.5, 0.1)}, "scale"),
    ({"crop": 16, "crop_mode": "random_resized", "ratio": "wide"}, "ratio"),
    ({"flip": 0.5}, "flip needs crop"),
]


@pytest.mark.parametrize("kwargs, named", OPTION_CASES,
                         ids=lambda v: "-".join(f"{a}={b}" for a, b in v.items())
                         if isinstance(v, dict) else None)
def test_an_invalid_option_is_a_shardkit_error_and_a_value_error(photo_store, kwargs, named):
    """``except ValueError`` (Python's convention for bad arguments) and ``except ShardkitError``
    (the CLI's one-line errors) both catch it; the message names the parameter."""
    with pytest.raises(OptionError) as caught:
        ShardDataset(photo_store, **kwargs)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ShardkitError)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_threads_wait_for_the_helpers_when_the_callers_share_fails(pack_photos):
    """``threads=2``: the calling thread's own record raises while a helper thread still decodes
    another one; the batch's error reaches the caller only once the helper is done (its records
    live only inside the caller's read transaction). The helper waits up to 2 s for the caller
    to have returned: it must not see that."""
    import threading

    started, returned = threading.Event(), threading.Event()
    seen = {}

    def transform(img):
        if threading.current_thread() is threading.main_thread():
            assert started.wait(60)  # the helper is inside its record
            raise RuntimeError("the caller's record failed")
        started.set()
        seen["caller returned"] = returned.wait(2)
        return img

    ds = ShardDataset(pack_photos("lmdb"), transform=transform, threads=2)
    with pytest.raises(RuntimeError, match="the caller's record failed"):
        ds.__getitems__([0, 1])
    returned.set()
    assert seen == {"caller returned": False}
    ds.close()
