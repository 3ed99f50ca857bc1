"""``ds.loader(engine="threads")`` (issue 26, points 1-2): batches made by threads of the
training process, ahead of the loop, with no worker process, no shared memory and no pickling.

Every read path gives, on the thread engine with 1 and with 3 threads, the very batches the
process engine gives with two worker processes and with ``num_workers=0`` (the same index lists
through the same ``__getitems__``), random crops, flips and views included (their draws are
keyed per sample: ``tests/read/test_draws.py``). The proofs: no child process during an epoch, every sample
once, a damaged record's ``StoreError`` raised in the caller, no thread left behind after a
``break``, a dropped loader or at interpreter exit, prefetching bounded by ``prefetch``, a
mid-epoch ``state_dict`` resumed on a new loader, and a 64 MB ``/dev/shm``.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import subprocess
import threading
import warnings

import numpy as np
import pytest
import torch
from helpers import build_store_fast, flip_byte_in_file, image_tree, program_cmd, program_env
from helpers.coco import make_coco
from helpers.programs import shm_loader
from helpers.small_shm import namespace_or_skip, run_in_small_shm
from PIL import Image

import shardkit
from shardkit import ShardDataset, ShardSampler
from shardkit.errors import OptionError, StoreError
from shardkit.integrations.thread_engine import ThreadLoader, default_prefetch, default_threads
from shardkit.read.augment import View
from shardkit.read.mix import Mix, MixSampler

FIELDS = ["boxes", "labels", "masks", "image_id", "iscrowd", "area"]
pytestmark = pytest.mark.filterwarnings(
    "ignore:'pin_memory' argument is set as true but no accelerator:UserWarning")


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    """A single-file LMDB and HDF5 store (every record distinct), a 4-shard folder store, the
    same folder store again behind a ``file://`` URL (read through the remote cache), and a
    3-shard COCO store with boxes and masks."""
    base = tmp_path_factory.mktemp("thread-engine")
    found = {"lmdb": str(base / "s.lmdb"), "hdf5": str(base / "s.h5"),
             "folder": str(base / "folder"), "remote": f"file://{base / 'remote'}",
             "cache": str(base / "cache"), "coco": str(base / "coco-store")}
    build_store_fast(found["lmdb"], 96, side=40, variants=96, seed=1)
    build_store_fast(found["hdf5"], 40, fmt="hdf5", side=40, variants=40, seed=2)
    image_tree(str(base / "src"), classes=4, per_class=12, seed=3, sides=(28, 56))
    for name in ("folder", "remote"):
        shardkit.pack(str(base / "src"), found[name], num_shards=4, workers=1, progress=False)
    images, annotations = make_coco(str(base / "coco"), 9, seed=7)
    shardkit.pack(images, found["coco"], coco=annotations, num_shards=3, workers=1,
                  progress=False)
    return found


def same(a, b) -> bool:
    """Equal batches: tensors (dtype and values), arrays, PIL images, bytes, numbers, nested."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) \
            and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, Image.Image):
        return isinstance(b, Image.Image) and np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) \
            and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def shapes_and_labels(batches) -> list:
    """What a batch of random crops must match on every engine: image shapes and labels."""
    out = []
    for images, labels in batches:
        images = images if isinstance(images, list) else [images]
        out.append(([tuple(x.shape) for x in images], labels.tolist()))
    return out


def to_float(img):
    return img.float().div_(255)


def seeded(kwargs: dict) -> dict:
    """The loader arguments with a fresh generator of the same seed (the same shuffled order)."""
    return {**kwargs, "generator": torch.Generator().manual_seed(5)} \
        if kwargs.get("shuffle") else dict(kwargs)


def test_every_path_gives_the_process_engines_batches(stores):
    """One matrix over the module's stores: each case read on the process engine with two
    worker processes (the reference), and compared with the thread engine with 1 and with 3
    threads (``prefetch=2``: batches finish out of order) and with ``num_workers=0`` ("0
    threads" below)."""
    lmdb, hdf5, folder = stores["lmdb"], stores["hdf5"], stores["folder"]
    remote = ShardDataset(stores["remote"], crop=32, cache_dir=stores["cache"])
    cropped = ShardDataset(folder, crop=32)
    mix = Mix([ShardDataset(lmdb, crop=32), ShardDataset(hdf5, crop=32)])
    cases = [  # name, dataset, loader arguments, pixels exact (random draws too: keyed per sample)
        ("lmdb centre crop, shuffled, pin_memory", ShardDataset(lmdb, crop=32),
         dict(batch_size=16, shuffle=True, pin_memory=True), True),
        ("hdf5 drop_last", ShardDataset(hdf5, crop=32), dict(batch_size=16, drop_last=True),
         True),
        ("4 shards, one open at a time", ShardDataset(folder, crop=32, max_open_shards=1),
         dict(batch_size=4, shuffle=True), True),
        ("4 shards, numpy output", ShardDataset(folder, crop=32, output="numpy"),
         dict(batch_size=8, shuffle=True), True),
        ("subset", cropped.subset(fraction=0.5, seed=1), dict(batch_size=8, shuffle=True), True),
        ("ShardSampler", cropped,
         dict(batch_size=8, sampler=ShardSampler(cropped, num_replicas=1, rank=0, seed=3)),
         True),
        ("Mix + MixSampler", mix,
         dict(batch_size=8, sampler=MixSampler(mix, proportion=[0.5, 0.5], epoch_size=60,
                                               num_replicas=1, rank=0)), True),
        ("batch_size=None", ShardDataset(hdf5, crop=32), dict(batch_size=None), True),
        ("pil output, batch_size=None", ShardDataset(hdf5, output="pil"),
         dict(batch_size=None), True),
        ("bytes output", ShardDataset(lmdb, output="bytes"), dict(batch_size=8), True),
        ("per-sample transform", ShardDataset(lmdb, crop=32, transform=to_float),
         dict(batch_size=16), True),
        ("fields: boxes, masks", ShardDataset(stores["coco"], fields=FIELDS, crop=48,
                                              ragged="padded"), dict(batch_size=3), True),
        ("fields, per-sample lists", ShardDataset(stores["coco"], fields=FIELDS, crop=48),
         dict(batch_size=2), True),
        ("normalize, device", ShardDataset(lmdb, crop=32),
         dict(batch_size=16, normalize=((0.5,) * 3, (0.25,) * 3), device="cpu"), True),
        ("remote, read-ahead", remote,
         dict(batch_size=8, sampler=ShardSampler(remote, num_replicas=1, rank=0, seed=4)), True),
        ("random crop + flip", ShardDataset(lmdb, crop=24, crop_mode="random", flip=0.5),
         dict(batch_size=16, shuffle=True), True),
        ("random_resized crop", ShardDataset(folder, crop=24, crop_mode="random_resized"),
         dict(batch_size=8), True),
        ("views", ShardDataset(lmdb, views=[View(24), View((16, 12))]), dict(batch_size=16),
         True),
    ]
    failures = []
    for name, ds, kwargs, exact in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the per-sample transform's note
            ref = list(ds.loader(num_workers=2, **seeded(kwargs)))  # real worker processes
            got = {n: list(ds.loader(engine="threads", num_threads=n, prefetch=2,
                                     **seeded(kwargs))) for n in (1, 3)}
            got[0] = list(ds.loader(**seeded(kwargs)))  # the process engine in this process
        for n, batches in got.items():
            if len(batches) != len(ref) or not ref:
                failures.append(f"{name}, {n} threads: {len(batches)} batches, the process "
                                f"engine {len(ref)}")
            elif exact and not same(batches, ref):
                failures.append(f"{name}, {n} threads: batches differ from the process engine's")
            elif not exact and shapes_and_labels(batches) != shapes_and_labels(ref):
                failures.append(f"{name}, {n} threads: shapes or records differ")
    assert not failures, "\n".join(failures)


def test_a_remote_stores_read_ahead_goes_out_from_the_engine(stores, tmp_path):
    """``ShardSampler`` hints the remote cache as its indices are drawn: on the thread engine
    that is the calling thread, ahead of the reads, so downloads start before the threads ask."""
    remote = ShardDataset(stores["remote"], crop=32, cache_dir=str(tmp_path / "cache"))
    sampler = ShardSampler(remote, num_replicas=1, rank=0, seed=4)
    assert remote.store.prefetch_next is False  # the sampler's order, not k + 1
    loader = remote.loader(batch_size=8, sampler=sampler, engine="threads", num_threads=2)
    batches = list(loader)
    assert remote.store.cache._pool is not None  # the read-ahead downloads ran
    local = ShardDataset(stores["folder"], crop=32)
    assert same(batches, list(local.loader(batch_size=8, sampler=ShardSampler(
        local, num_replicas=1, rank=0, seed=4))))


def test_options_are_checked_by_name(stores):
    ds = ShardDataset(stores["lmdb"], crop=32)
    refused = [(dict(engine="gpu"), "engine must be one of"),
               (dict(engine="threads", num_workers=2), "num_workers=2 cannot be used"),
               (dict(engine="threads", multiprocessing_context="spawn"), "multiprocessing_context"),
               (dict(engine="threads", prefetch_factor=4), "prefetch_factor"),
               (dict(engine="threads", worker_init_fn=print), "worker_init_fn"),
               (dict(engine="threads", num_threads=0), "num_threads must be an integer >= 1"),
               (dict(engine="threads", prefetch=True), "prefetch must be an integer >= 1"),
               (dict(num_threads=2), "num_threads is an option of engine='threads'")]
    for kwargs, message in refused:
        with pytest.raises(OptionError, match=message):
            ds.loader(batch_size=4, **kwargs)
    loader = ds.loader(batch_size=4, engine="threads")
    assert isinstance(loader, ThreadLoader) and loader.num_workers == 0
    assert loader.threads == default_threads() == len(os.sched_getaffinity(0))
    assert loader.depth == default_prefetch(loader.threads) == 2 * loader.threads
    assert type(ds.loader(batch_size=4)) is shardkit.ShardLoader


def test_engine_objects_make_the_loaders_their_shortcuts_make(stores):
    """``engine=shardkit.Threads(n, prefetch)`` / ``shardkit.Processes(n, ...)`` are what
    ``engine="threads"`` / ``"processes"`` build: the same loaders and the same batches
    (random crops and flips included); each option is given in one place."""
    ds = ShardDataset(stores["lmdb"], crop=24, crop_mode="random", flip=0.5)
    kwargs = dict(batch_size=16, shuffle=True)
    processes = ds.loader(engine=shardkit.Processes(2, prefetch_factor=3), **seeded(kwargs))
    assert type(processes) is shardkit.ShardLoader
    assert (processes.num_workers, processes.prefetch_factor) == (2, 3)
    assert processes.persistent_workers
    threads = ds.loader(engine=shardkit.Threads(2, prefetch=3), **seeded(kwargs))
    assert isinstance(threads, ThreadLoader) and (threads.threads, threads.depth) == (2, 3)
    ref = list(ds.loader(**seeded(kwargs)))  # engine="processes" in this process
    assert same(list(processes), ref) and same(list(threads), ref)
    refused = [(dict(engine=shardkit.Threads(2), num_threads=2), "num_threads is given with"),
               (dict(engine=shardkit.Processes(2), num_workers=2), "num_workers is given twice"),
               (dict(engine=shardkit.Threads(), num_workers=2), "num_workers=2 cannot be used"),
               (dict(engine=shardkit.Processes(), prefetch=2), "prefetch is given with")]
    for options, message in refused:
        with pytest.raises(OptionError, match=message):
            ds.loader(batch_size=4, **options)
    with pytest.raises(OptionError, match="num_threads must be an integer >= 1"):
        shardkit.Threads(0)
    with pytest.raises(OptionError, match="Processes: pin_memory is not a worker-process"):
        shardkit.Processes(2, pin_memory=True)


def test_a_per_sample_transform_is_named_once():
    def jitter_in_threads(img):
        return img

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            ThreadLoader(_Transformed(jitter_in_threads), batch_size=2)
    named = [w for w in caught if "jitter_in_threads" in str(w.message)]
    assert len(named) == 1 and issubclass(named[0].category, UserWarning)
    assert "torch's global RNG" in str(named[0].message)


class _Transformed(torch.utils.data.Dataset):
    """A map-style dataset with a per-sample transform, as the engine sees a ShardDataset's."""

    def __init__(self, transform) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return self.transform(torch.tensor(i))


def _children() -> list[int]:
    """Child processes of this process, from /proc (every thread's children)."""
    found = []
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
            found += [int(p) for p in f.read().split()]
    return found


def test_an_epoch_runs_in_threads_only_and_reads_every_sample_once(stores):
    ds = ShardDataset(stores["lmdb"], crop=40)  # the whole 40 x 40 image: pixels name a record
    record_of = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    assert len(record_of) == len(ds)
    before = _children()
    loader = ds.loader(batch_size=7, shuffle=True, engine="threads", num_threads=3)
    seen, during = [], []
    for images, labels in loader:
        during.append((multiprocessing.active_children(), _children(),
                       sorted(t.name for t in threading.enumerate()
                              if t.name.startswith("shardkit-loader"))))
        for image, label in zip(images, labels.tolist()):
            i = record_of[image.numpy().tobytes()]
            assert label == int(ds.targets[i])
            seen.append(i)
    assert sorted(seen) == list(range(len(ds)))  # every sample exactly once
    assert all(active == [] and children == before for active, children, _ in during)
    assert during[0][2] == [f"shardkit-loader-{i}" for i in range(3)]


def _wait_for(pipeline, count: int) -> None:
    """Block until ``count`` results are ready (a bound for a loaded machine, not a timing)."""
    with pipeline.ready:
        assert pipeline.ready.wait_for(lambda: len(pipeline.results) >= count, timeout=120)


def test_prefetch_runs_ahead_of_the_loop_and_is_bounded(stores):
    ds = ShardDataset(stores["lmdb"], crop=32)
    loader = ds.loader(batch_size=8, engine="threads", num_threads=2, prefetch=3)
    it = iter(loader)
    first = next(it)
    engine = loader._current()
    _wait_for(engine._pipeline, 3)  # while the loop holds batch 0, batches 1-3 were made
    assert sorted(engine._pipeline.results) == [1, 2, 3]
    assert engine._sent == 4  # and no more were asked for
    assert same(first, next(iter(ds.loader(batch_size=8))))
    del it, engine


def test_break_dropped_loaders_and_errors_leave_no_thread(stores, tmp_path):
    def engine_threads() -> set:
        # By name: threads an earlier test started (a remote store's read-ahead) may end
        # during this one, so the whole thread list is no baseline.
        return {t for t in threading.enumerate() if t.name.startswith("shardkit-loader-")}

    assert engine_threads() == set()
    ds = ShardDataset(stores["lmdb"], crop=32)
    loader = ds.loader(batch_size=8, engine="threads", num_threads=3, prefetch=4)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    gc.collect()
    assert engine_threads() == set()  # the break dropped the epoch's threads
    it = iter(loader)
    next(it)
    assert len(engine_threads()) == 3
    del it, loader
    gc.collect()
    assert engine_threads() == set()

    # A damaged record: the batches before it arrive, then its StoreError, in the caller.
    path = str(tmp_path / "damaged.lmdb")
    payloads = build_store_fast(path, 48, side=16, variants=48, seed=9)
    flip_byte_in_file(path, payloads[37], len(payloads[37]) // 2)
    damaged = ShardDataset(path, crop=16, verify=True)
    got = []
    with pytest.raises(StoreError, match=r"shard 0 \(.*damaged\.lmdb\), record 37: checksum"):
        for _, labels in damaged.loader(batch_size=8, engine="threads", num_threads=3):
            got.append(labels)
    assert len(got) == 4  # records 0-31; record 37 is in batch 4
    gc.collect()
    assert engine_threads() == set()


def test_interpreter_exit_mid_epoch_ends_cleanly(stores):
    """A script that leaves the loop mid-epoch (threads busy on the next batches) and exits,
    keeping the iterator or dropping the loader, ends, with nothing on stderr (both scripts run
    at once; the timeout catches a hang)."""
    modes = {"exit-mid-epoch": 3, "drop-then-exit": 0}  # loader threads alive at the end
    runs = {mode: subprocess.Popen([*program_cmd("thread_exit"), stores["lmdb"], mode],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=program_env()) for mode in modes}
    for mode, threads in modes.items():
        out, err = runs[mode].communicate(timeout=120)
        assert runs[mode].returncode == 0 and err == "", f"{mode}: {err[-3000:]}"
        report = json.loads(out)
        assert report["busy"]  # a thread was inside a batch when the loop left
        assert report["threads"] == threads, mode


def test_state_dict_mid_epoch_resumes_on_a_new_loader(stores):
    """The state counts the batches the loop received, not the ones prefetched: a new loader
    resumed from it yields exactly the rest of the epoch (records and pixels: centre crops)."""
    ds = ShardDataset(stores["folder"], crop=32)
    for make in (lambda: dict(sampler=ShardSampler(ds, num_replicas=1, rank=0, seed=2)),
                 lambda: dict(shuffle=True, generator=torch.Generator().manual_seed(3))):
        full = list(ds.loader(batch_size=5, engine="threads", num_threads=2, **make()))
        loader = ds.loader(batch_size=5, engine="threads", num_threads=2, prefetch=4, **make())
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        _wait_for(loader._current()._pipeline, 4)  # four more batches made, not received
        state = loader.state_dict()
        assert state["batches"] == 3
        del it
        resumed = ds.loader(batch_size=5, engine="threads", num_threads=2, **make())
        resumed.load_state_dict(state)
        assert same(head + list(resumed), full)


def test_a_64_mb_dev_shm_is_enough(tmp_path):
    """The per-sample float transform's batches (77 MB) never touch /dev/shm on threads."""
    namespace_or_skip()
    store = str(tmp_path / "shm.lmdb")
    build_store_fast(store, 256, side=64, variants=16, seed=3)  # padded to 224: 77 MB batches
    got = run_in_small_shm(store, "fork", ["threads"])["threads"]
    assert "error" not in got, got["error"][-3000:]
    ds, batch_size = shm_loader.setup(store, "threads")
    assert got["batches"] == shm_loader.describe(ds.loader(batch_size=batch_size))
    assert len(got["batches"]) == 2


def test_lightning_trains_on_the_thread_engine(stores):
    pl = pytest.importorskip("lightning.pytorch")
    from shardkit.lightning import ShardDataModule

    seen = []

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 4)

        def training_step(self, batch, _):
            images, labels = batch
            seen.extend(labels.tolist())
            return self.layer(images.float().mean((2, 3))).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = ShardDataModule(stores["folder"], batch_size=8, engine="threads", num_threads=2,
                         train_options=dict(crop=32))
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's "few workers" hint
        trainer.fit(Model(), dm)
    assert isinstance(trainer.train_dataloader, ThreadLoader)
    assert sorted(seen) == sorted(ShardDataset(stores["folder"]).targets.tolist())
    with pytest.raises(OptionError, match="num_workers=2 cannot be used"):
        ShardDataModule(stores["folder"], engine="threads", num_workers=2)


def test_timm_create_loader_picks_the_engine(stores, tv_python, tmp_path):
    """``shardkit.timm.create_loader(engine="threads")`` and ``SHARDKIT_TIMM_ENGINE=threads``
    (what ``train.py`` can use) give a thread-engine loader behind timm's PrefetchLoader."""
    os.symlink(stores["lmdb"], tmp_path / "train.lmdb")
    script = (
        "import json, sys, torch\n"
        "from shardkit.timm import create_dataset, create_loader\n"
        "ds = create_dataset('shardkit', root=sys.argv[1], split='train')\n"
        "out = {}\n"
        "for key, extra in (('argument', dict(engine='threads')), ('variable', {})):\n"
        "    loader = create_loader(ds, (3, 32, 32), 8, is_training=True, num_workers=2,\n"
        "                           device=torch.device('cpu'), interpolation='bilinear',\n"
        "                           **extra)\n"
        "    images, target = next(iter(loader))\n"
        "    inner = loader.loader\n"
        "    out[key] = [type(inner).__name__, inner.threads, list(images.shape)]\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([tv_python, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "SHARDKIT_TIMM_ENGINE": "threads"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out == {"argument": ["ThreadLoader", 2, [8, 3, 32, 32]],
                   "variable": ["ThreadLoader", 2, [8, 3, 32, 32]]}


def test_pinning_threads_decode_into_page_locked_buffers(stores):
    """A thread that pins (an engine thread with ``pin_memory=True`` and CUDA) has its batches
    decoded into torch's page-locked memory, in that thread only. Without an accelerator torch
    refuses page-locked memory, so here the check is that the decode asks for it (the refusal
    comes from the pinned pool's allocation) while another thread gets the private pool; only
    with CUDA are the engine's batches checked to be pinned, decoded in place (``pin_memory``
    kept the batch buffer's channels-last strides: no copy) and equal to the process engine's."""
    from shardkit.read import batchpool

    ds = ShardDataset(stores["lmdb"], crop=32)
    assert isinstance(batchpool.pool(False), batchpool.BatchPool)
    elsewhere = []
    with batchpool.pinned():
        assert isinstance(batchpool.pool(False), batchpool.PinnedPool)
        assert isinstance(batchpool.pool(True), batchpool.BatchPool)  # a worker's: shared
        other = threading.Thread(target=lambda: elsewhere.append(type(batchpool.pool(False))))
        other.start()
        other.join()
        if not torch.cuda.is_available():
            with pytest.raises(RuntimeError) as refused:  # torch: no pinned allocator
                ds.__getitems__(list(range(8)))
            asked = [type(entry.locals.get("self")).__name__ for entry in refused.traceback]
            assert "PinnedPool" in asked  # the batch buffer was asked of the pinned pool
        else:
            batch = ds.__getitems__(list(range(8)))
            assert batch.images.is_pinned()
    assert elsewhere == [batchpool.BatchPool]  # pinning is the pinning thread's only
    assert isinstance(batchpool.pool(False), batchpool.BatchPool)
    if torch.cuda.is_available():
        loader = ds.loader(batch_size=8, engine="threads", num_threads=2, pin_memory=True)
        got = list(loader)
        assert all(images.is_pinned() and labels.is_pinned() for images, labels in got)
        assert all(images.stride() == (32 * 32 * 3, 1, 32 * 3, 3) for images, _ in got)
        assert same(got, list(ds.loader(batch_size=8)))


def test_a_stopped_epoch_starts_none_of_its_queued_batches(stores, monkeypatch):
    """One thread, six batches queued: the loop drops the iterator while the thread is inside
    batch 1 (held there; the stop leaves it behind after ``STOP_WAIT``). Let go, it finishes
    batch 1 and starts none of batches 2-6."""
    from shardkit.read.loading import thread_engine

    monkeypatch.setattr(thread_engine, "STOP_WAIT", 0.1)
    inside, gate = threading.Event(), threading.Event()
    calls = []

    def hold_batch_1(img):  # batch_size=2 on one thread: calls 2k and 2k + 1 are batch k's
        calls.append(len(calls))
        if len(calls) == 3:
            inside.set()
            assert gate.wait(60)
        return img

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the per-sample transform's note
        ds = ShardDataset(stores["lmdb"], crop=32, transform=hold_batch_1)
        it = iter(ds.loader(batch_size=2, engine="threads", num_threads=1, prefetch=6))
    next(it)
    assert inside.wait(60)
    engine = [t for t in threading.enumerate() if t.name.startswith("shardkit-loader-")]
    assert len(engine) == 1
    del it  # stops the epoch
    gate.set()
    engine[0].join(60)
    assert not engine[0].is_alive() and calls == [0, 1, 2, 3]
