"""Remote stores end to end: ``pack`` to a URL, ``ShardDataset(url)`` in DataLoader workers,
``info``/``verify`` on a URL, against a real S3-protocol server (moto) on 127.0.0.1.

Downloads and uploads are counted on the server's side (``tests/s3server.py``). Every read is
compared with a local pack of the same folder: the same records, labels and manifest.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading

import boto3
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardkit
import shardkit.remote.access
from helpers import one_line_error, run_cli
from helpers.s3server import S3Server, kill_at_put, use_dummy_credentials
from helpers.s3server import bucket_objects as objects
from helpers.s3server import folder_files as files
from shardkit import ShardDataset, metadata
from shardkit.errors import PackError, StoreError
from shardkit.packing.staging import staging_path
from shardkit.remote import RemoteFolder, upload_folder_store
from shardkit.remote.limit import part_name
from shardkit.remote.locks import close as close_lock
from shardkit.remote.locks import open_lock

SOURCE = {"classes": 4, "per_class": 8, "seed": 11}  # src and local: tests/remote/conftest.py
SHARDS = 8
# Fail fast once the server is gone: one botocore attempt per call (shardkit still retries),
# and short timeouts (a stopped moto server leaves kept-alive connections open, unanswered).
FAST = {"config_kwargs": {"connect_timeout": 1, "read_timeout": 1,
                          "retries": {"total_max_attempts": 1}}}


def _serve(mp: pytest.MonkeyPatch, cache: str):
    use_dummy_credentials(mp)
    mp.setenv("SHARDKIT_CACHE_DIR", cache)  # pack staging, and any default cache
    server = S3Server().start()
    mp.setenv("AWS_ENDPOINT_URL", server.endpoint)  # inherited by workers and the CLI
    return server


@pytest.fixture(scope="module")
def packed(src, local, tmp_path_factory):
    """(server, url, staging listings): ``src`` packed to a bucket with ``pack(..., url)``.

    At each shard's upload the staging folder is listed (the packer waits on that PUT)."""
    with pytest.MonkeyPatch.context() as mp:
        server = _serve(mp, str(tmp_path_factory.mktemp("remote-store-cache")))
        try:
            url = f"s3://{server.new_bucket()}/train"
            staging = staging_path(url)
            listings: dict[str, list[str]] = {}

            def look(path: str) -> None:
                name = path.rsplit("/", 1)[-1]
                if path.startswith(key(url, "shard-")):
                    listings[name] = sorted(os.listdir(staging))

            server.put_hooks.append(look)
            result = shardkit.pack(src, url, num_shards=SHARDS, workers=2, progress=False)
            server.put_hooks.remove(look)
            assert result.out == url and result.count == 32 and result.shards == SHARDS
            yield server, url, listings, staging
        finally:
            server.stop()


@pytest.fixture
def s3(monkeypatch, tmp_path):
    server = _serve(monkeypatch, str(tmp_path / "default-cache"))
    yield server
    server.stop()


def key(url: str, name: str) -> str:
    """The server-side request path of object ``name`` under ``url``."""
    return "/" + url.removeprefix("s3://") + "/" + name


def shard_names(folder: str) -> list[str]:
    with open(os.path.join(folder, metadata.MANIFEST_NAME), "rb") as f:
        return [e["file"] for e in metadata.parse_manifest_layout(f.read(), folder)["shards"]]


def gets(server: S3Server, url: str, names: list[str]) -> list[int]:
    return [server.count("GET", key(url, name)) for name in names]


def read_epoch(ds: ShardDataset, method: str | None, order=None, workers: int = 2) -> list:
    """Every (record bytes, label) a DataLoader delivers, in order."""
    loader = DataLoader(ds, batch_size=2, sampler=order, num_workers=workers,
                        multiprocessing_context=method if workers else None,
                        worker_init_fn=shardkit.worker_init_fn)
    return [(bytes(b), int(t)) for images, labels in loader for b, t in zip(images, labels)]


def cached_bytes(ds: ShardDataset) -> int:
    folder = ds.store.cache.folder
    return sum(os.path.getsize(e.path) for e in ds.store.shards if os.path.exists(e.path)) \
        if os.path.isdir(folder) else 0


def run_fast_cli(*args: str) -> subprocess.CompletedProcess:
    """``run_cli`` with remote retries 50 ms apart (fast_retry_cli.py): for calls that fail."""
    return subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__),
                                                        "fast_retry_cli.py"), *args],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONIOENCODING="utf-8"))


def damage(url: str, name: str) -> None:
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    client = boto3.client("s3")
    body = bytearray(client.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read())
    body[len(body) // 2] ^= 0xFF  # same size, one byte different
    client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=bytes(body))


# -- pack to a URL ----------------------------------------------------------------------------

def test_pack_to_url_uploads_the_local_pack_byte_for_byte(packed, local):
    server, url, listings, staging = packed
    assert objects(url) == files(local)  # same shards, labels and manifest; no records left
    puts = [path for method, path in server.requests if method == "PUT"]
    assert puts[-1] == key(url, "manifest.json")  # the manifest goes up last
    # Staging is bounded: when a shard is uploaded, no other shard file is left there.
    names = shard_names(local)
    assert sorted(listings) == names
    for name in names:
        assert [n for n in listings[name] if n.startswith("shard-") and
                not n.endswith(".json")] == [name]
    assert not os.path.exists(staging)


def test_pack_refuses_a_prefix_holding_a_store_before_any_work(packed, src):
    server, url, _, _ = packed
    before = len(server.requests)
    with pytest.raises(PackError, match=f"^{url} already holds a store .*`overwrite=True`"):
        shardkit.pack(src, url, num_shards=SHARDS, workers=1, progress=False)
    assert [m for m, _ in server.requests[before:]] == ["HEAD"]  # looked, changed nothing
    assert not os.path.exists(staging_path(url))


def test_pack_with_dask_workers_uploading_their_shards(s3, src, local):
    """Each Dask task uploads its own shard, and a worker packs its next shard while one
    uploads: with one single-threaded worker, shard 0's upload is held until shard 1's
    arrives (it never would if the upload kept the worker's only thread)."""
    url = f"s3://{s3.new_bucket()}/train"
    first, second = threading.Event(), threading.Event()  # shard 0's, shard 1's first PUT
    holding, overlapped = [], []

    def hook(path: str) -> None:
        name = os.path.basename(path)
        if name.startswith("shard-00001"):
            second.set()
        elif name.startswith("shard-00000") and not first.is_set():
            first.set()
            holding.append(path)
            came = second.wait(timeout=60)
            # and not after the client gave this PUT up and sent it again (a timeout)
            overlapped.append(came and holding == [path])
            holding.clear()
        elif name.startswith("shard-00000") and holding:
            holding.append(path)

    s3.put_hooks.append(hook)
    try:
        shardkit.pack(src, url, num_shards=SHARDS, workers=1, engine="dask", progress=False)
    finally:
        s3.put_hooks.remove(hook)
    assert overlapped == [True]
    assert objects(url) == files(local)
    assert not os.path.exists(staging_path(url))


def test_pack_to_a_file_url_is_a_folder_store(src, local, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDKIT_CACHE_DIR", str(tmp_path / "cache"))
    shardkit.pack(src, f"file://{tmp_path}/out", num_shards=SHARDS, workers=1, progress=False)
    assert files(str(tmp_path / "out")) == files(local)
    ds = ShardDataset(f"file://{tmp_path}/out", output="bytes")
    assert read_epoch(ds, None, workers=0) == read_epoch(ShardDataset(local, output="bytes"),
                                                         None, workers=0)


# -- reading in DataLoader workers ------------------------------------------------------------

@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_read_the_local_records_and_download_each_shard_once(packed, local, tmp_path,
                                                                     method):
    server, url, _, _ = packed
    names = shard_names(local)
    before = gets(server, url, names)
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache")
    assert len(ds) == 32 and ds.classes == ShardDataset(local).classes
    assert np.array_equal(ds.targets, ShardDataset(local).targets)
    assert gets(server, url, names) == before  # len, classes, targets: no shard downloaded
    want = read_epoch(ShardDataset(local, output="bytes"), None, workers=0)
    assert read_epoch(ds, method) == want
    # Both workers read every shard; each was downloaded once, into the shared cache.
    assert [a - b for a, b in zip(gets(server, url, names), before)] == [1] * SHARDS
    assert read_epoch(ds, method) == want  # the second epoch: from the cache
    assert [a - b for a, b in zip(gets(server, url, names), before)] == [1] * SHARDS


def _join_prefetches(ds: ShardDataset) -> None:
    ds.store.cache.wait_read_ahead()


def test_sampler_prefetches_the_next_shard_of_its_rank(packed, local, tmp_path):
    """Under ``ShardSampler``, handing out the first index of a rank's shard starts the downloads
    of the rank's next ``read_ahead_depth`` shards (nothing read yet), and an epoch downloads the
    rank's shards only: never the store's k+1 of a shard, which another rank reads."""
    server, url, _, _ = packed
    names = shard_names(local)
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache")
    ds.store.cache.read_ahead_depth = 2
    sampler = shardkit.ShardSampler(ds, num_replicas=2, rank=1, seed=3)
    mine = sampler.shards_of_rank()
    order = list(dict.fromkeys(ds.store.locate_many(sampler.indices())[0].tolist()))
    assert len(order) >= 3 and any(k + 1 < SHARDS and k + 1 not in mine for k in mine)
    before = gets(server, url, names)
    first = next(iter(sampler))
    _join_prefetches(ds)
    assert ds.store.locate(first)[0] == order[0]
    downloaded = [a - b for a, b in zip(gets(server, url, names), before)]
    assert downloaded == [int(k in order[:2]) for k in range(SHARDS)]
    want = ShardDataset(local, output="bytes")
    got = [(bytes(b), int(t)) for images, labels in ds.loader(batch_size=2, sampler=sampler)
           for b, t in zip(images, labels)]
    assert got == [want[i] for i in sampler.indices().tolist()]
    _join_prefetches(ds)
    downloaded = [a - b for a, b in zip(gets(server, url, names), before)]
    assert downloaded == [int(k in mine) for k in range(SHARDS)]
    ds.close()


def _tight_cache(local: str, tmp_path, url: str) -> tuple[ShardDataset, int]:
    """A dataset of ``url`` whose cache holds two and a half of its largest shards."""
    largest = max(os.path.getsize(os.path.join(local, n)) for n in shard_names(local))
    limit = 2 * largest + largest // 2
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache", cache_limit=limit)
    assert ds.store.max_open_shards == 2  # a process holds open no more shards than fit
    return ds, limit


def _shard_order(ds: ShardDataset) -> list[int]:
    # Shard by shard (the records of a mixed layout lie in every shard: logical order would
    # reopen every shard for every batch, a cache this small cannot hold that).
    return np.argsort(ds.store.locate_many(np.arange(len(ds)))[0], kind="stable").tolist()


def test_cache_limit_smaller_than_the_store(packed, local, tmp_path):
    """Two fork workers read two epochs through a cache smaller than the store: every record is
    right, shards are evicted and downloaded again, and the cache ends under its limit. (How
    often a shard is downloaded in an epoch depends on how far one worker runs ahead of the
    other; the exact count is checked in one process below.)"""
    server, url, _, _ = packed
    names = shard_names(local)
    ds, limit = _tight_cache(local, tmp_path, url)
    before = gets(server, url, names)
    order = _shard_order(ds)
    want = read_epoch(ShardDataset(local, output="bytes"), None, order=order, workers=0)
    for _ in range(2):
        assert read_epoch(ds, "fork", order=order) == want
    downloads = [a - b for a, b in zip(gets(server, url, names), before)]
    # Shard 0 was evicted in epoch 1 (the cache holds under three shards) and read again.
    assert SHARDS < sum(downloads) and downloads[0] >= 2 and min(downloads) >= 1
    missing = next(k for k in range(SHARDS) if not os.path.exists(ds.store.shards[k].path))
    ds.store.shard(missing)  # a download with no other shard in use: the cache fits the limit
    assert cached_bytes(ds) <= limit
    ds.close()


def test_a_tight_cache_downloads_each_shard_once_an_epoch(packed, local, tmp_path):
    """One reader, the read-ahead at its default depth, a cache of 2.5 shards: each epoch
    downloads every shard exactly once. Read-ahead never takes room out of reading order, so a
    shard downloaded ahead is never evicted to make room for the one before it."""
    server, url, _, _ = packed
    names = shard_names(local)
    ds, limit = _tight_cache(local, tmp_path, url)
    order = _shard_order(ds)
    want = read_epoch(ShardDataset(local, output="bytes"), None, order=order, workers=0)
    before = gets(server, url, names)
    for epoch in range(1, 3):
        assert read_epoch(ds, None, order=order, workers=0) == want
        _join_prefetches(ds)
        assert [a - b for a, b in zip(gets(server, url, names), before)] == [epoch] * SHARDS
    assert cached_bytes(ds) <= limit
    ds.close()


def test_read_ahead_gives_room_in_reading_order(packed, local, tmp_path):
    """A window [large, small] when only the small shard would fit: neither is downloaded
    ahead (the small one's room would be taken back by the fetch of the large one)."""
    server, url, _, _ = packed
    names = shard_names(local)
    sizes = [os.path.getsize(os.path.join(local, n)) for n in names]
    large, small = int(np.argmax(sizes)), int(np.argmin(sizes))
    held = next(k for k in range(SHARDS) if k not in (large, small))
    assert sizes[large] > sizes[small] and sizes[held] + sizes[small] >= sizes[large]
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache",
                      cache_limit=sizes[held] + sizes[small])
    ds.store.prefetch_next = False
    ds.store.shard(held)  # in use: room for the small shard only
    before = gets(server, url, names)
    ds.store.read_ahead([large, small])
    _join_prefetches(ds)
    assert [a - b for a, b in zip(gets(server, url, names), before)] == [0] * SHARDS
    ds.store.read_ahead([small, large])  # in order, the small one fits
    _join_prefetches(ds)
    assert [a - b for a, b in zip(gets(server, url, names), before)] == \
        [int(k == small) for k in range(SHARDS)]
    ds.close()


def test_read_ahead_waits_for_the_room_of_a_download_under_way(packed, local, tmp_path,
                                                               monkeypatch):
    """The first shard of a window is being downloaded by another reader that has not made its
    room yet: the window's later shards wait for that room (taking it first, they would be
    evicted by that download and fetched twice). Once the other download's ``.part`` is there
    they go on; a holder that never makes room leaves the window without any."""
    server, url, _, _ = packed
    names = shard_names(local)
    monkeypatch.setenv("SHARDKIT_TRANSFER_TIMEOUT", "0.3")  # a holder stopped for one deadline
    monkeypatch.setenv("SHARDKIT_TRANSFER_MIN_RATE", "1e12")
    ds, _ = _tight_cache(local, tmp_path, url)
    ds.store.prefetch_next = False
    cache = ds.store.cache
    before = gets(server, url, names)
    dl = open_lock(cache.side_file(names[0], "dl"), fcntl.LOCK_EX)  # the other reader's
    try:
        ds.store.read_ahead([0, 1, 2])
        _join_prefetches(ds)
        assert [a - b for a, b in zip(gets(server, url, names), before)] == [0] * SHARDS
        part = os.path.join(cache.folder, part_name(names[0], ds.store.shards[0].bytes, "other"))
        ds.store.read_ahead([0, 1])
        room = open_lock(part, fcntl.LOCK_EX, new=True)  # the other reader made its room
        try:
            _join_prefetches(ds)
        finally:
            os.unlink(part)
            close_lock(room)
    finally:
        close_lock(dl)
    assert [a - b for a, b in zip(gets(server, url, names), before)] == \
        [int(k == 1) for k in range(SHARDS)]
    ds.close()


def test_eviction_under_load_never_breaks_a_read(packed, local, tmp_path):
    """Shuffled batches touch many shards; two spawned workers open and close shards while
    the cache evicts: every image is still the local store's."""
    server, url, _, _ = packed
    names = shard_names(local)
    largest = max(os.path.getsize(os.path.join(local, n)) for n in names)
    order = np.random.default_rng(5).permutation(32).tolist() * 2
    before = gets(server, url, names)
    ds = ShardDataset(url, crop=32, cache_dir=tmp_path / "cache", cache_limit=2 * largest)
    loader = DataLoader(ds, batch_size=4, sampler=order, num_workers=2,
                        multiprocessing_context="spawn", worker_init_fn=shardkit.worker_init_fn,
                        collate_fn=shardkit.collate)
    got = [(images.clone(), labels.clone()) for images, labels in loader]
    reference = ShardDataset(local, crop=32)
    want = [reference.__getitems__(order[i:i + 4]) for i in range(0, len(order), 4)]
    assert len(got) == len(want)
    for (images, labels), batch in zip(got, want):
        assert torch.equal(images, batch.images) and torch.equal(labels, batch.labels)
    assert sum(gets(server, url, names)) - sum(before) > SHARDS  # evicted, downloaded again


# -- failures ---------------------------------------------------------------------------------

def test_server_stopped_mid_epoch_raises_store_error(s3, local, tmp_path, monkeypatch):
    monkeypatch.setattr(shardkit.remote.access, "RETRY_DELAYS", (0.1, 0.1))  # inherited by forks
    url = f"s3://{s3.new_bucket()}/train"
    upload_folder_store(local, url)
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache", storage_options=FAST)
    ds.store.cache.read_ahead_depth = 2  # the forked workers' too: the last shard stays remote
    # Shard after shard (the store's order: a class-mixed store read in index order would need
    # every shard, the last one included, in its first batches).
    loader = ds.loader(batch_size=2, shuffle=False, num_workers=2, collate_fn=list,
                       multiprocessing_context="fork")
    batches = iter(loader)
    next(batches)  # shard 0 is read; at most 2 batches per worker were asked for since
    s3.stop()
    last = shard_names(local)[-1]
    with pytest.raises(StoreError, match=f"{url}/shard-0000[0-7].lmdb: .*gave up after 3") \
            as info:
        for _ in batches:
            pass
    failed = str(info.value).split(f"{url}/", 1)[1].split(":", 1)[0]
    cached = os.listdir(ds.store.cache.folder)
    assert failed not in cached and last not in cached


@pytest.mark.parametrize("method", ["spawn"])
def test_second_epoch_with_the_server_gone_is_served_from_the_cache(s3, local, tmp_path,
                                                                    method, monkeypatch):
    monkeypatch.setattr(shardkit.remote.access, "RETRY_DELAYS", (0.1, 0.1))
    url = f"s3://{s3.new_bucket()}/train"
    upload_folder_store(local, url)
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache", storage_options=FAST)
    # The cache filled in this process (workers filling it: the test above); the workers of
    # the next epoch, fresh processes, find every shard in it.
    first = read_epoch(ds, None, workers=0)
    s3.stop()
    assert read_epoch(ds, method) == first == read_epoch(ShardDataset(local, output="bytes"),
                                                         None, workers=0)
    with pytest.raises(StoreError, match=f"{url}/manifest.json: .*gave up after 3"):
        ShardDataset(url, cache_dir=tmp_path / "cache", storage_options=FAST)


def test_damaged_or_missing_object(s3, local, tmp_path, monkeypatch):
    monkeypatch.setattr(shardkit.remote.access, "RETRY_DELAYS", (0.05, 0.05))
    url = f"s3://{s3.new_bucket()}/train"
    upload_folder_store(local, url)
    names = shard_names(local)
    damage(url, names[2])
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache")
    with pytest.raises(StoreError, match=f"^{url}/{names[2]}: object is damaged or replaced"):
        ds.store.shard(2)
    want = ShardDataset(local).store.shard(0)
    assert np.array_equal(ds.store.shard(0).labels, want.labels)  # the others read as before
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    boto3.client("s3").delete_object(Bucket=bucket, Key=f"{prefix}/{names[5]}")
    proc = run_fast_cli("verify", url, "-q", "--cache-dir", str(tmp_path / "cli-cache"))
    assert proc.returncode == 1, proc.stderr
    faults = [line for line in proc.stderr.splitlines() if line.startswith("fault:")]
    assert faults == [f"fault: {url}/{names[2]}: object is damaged or replaced: its size or "
                      "SHA-256 differs from the manifest (3 downloads)",
                      f"fault: {url}/{names[5]}: object not found (HTTP 404 NoSuchKey: The "
                      "specified key does not exist.)"]
    assert "Traceback" not in proc.stderr


def test_unreachable_endpoint_is_one_line(s3, src, tmp_path):
    url = f"s3://{s3.new_bucket()}/train"
    s3.stop()  # nothing listens on that port now
    for args in (("info", url, "--cache-dir", str(tmp_path / "cache")),
                 ("pack", src, url, "--num-shards", "2", "-q")):
        proc = run_fast_cli(*args)
        assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
        assert f"{url}/manifest.json: " in proc.stderr and "gave up after 3 attempts" \
            in proc.stderr
    assert not os.path.exists(staging_path(url))


# -- the command line -------------------------------------------------------------------------

def test_cli_pack_info_verify_with_a_url(s3, src, local, tmp_path, capsys):
    from shardkit.cli import main as cli_main

    url = f"s3://{s3.new_bucket()}/train"
    proc = run_cli("pack", src, url, "--shard-size", "60KB", "-q")
    assert proc.returncode == 0, proc.stderr
    assert f"packed 32 images into {url} (" in proc.stderr
    remote = RemoteFolder(url)
    assert len(remote.meta["shards"]) > 1
    # info and verify in this process (the packs in a fresh one each, where stderr shows any
    # stray log line): the same command line without an interpreter starting for each
    capsys.readouterr()
    assert cli_main(["info", url, "--json", "--cache-dir", str(tmp_path / "cache")]) == 0
    import json

    summary = json.loads(capsys.readouterr().out)
    assert summary["count"] == 32 and summary["path"] == url
    assert summary["bytes_on_disk"] == sum(len(v) for v in objects(url).values())
    assert cli_main(["verify", url, "-q", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert capsys.readouterr().out.strip() == f"ok: 32 records verified in {url}"
    proc = run_cli("pack", src, url, "--shard-size", "60KB", "-q")
    assert proc.returncode == 1 and one_line_error(proc.stderr)
    assert f"{url} already holds a store (manifest.json); pass --overwrite to replace it" \
        in proc.stderr
    proc = run_cli("pack", src, url, "--num-shards", str(SHARDS), "--overwrite", "-q")
    assert proc.returncode == 0, proc.stderr
    assert objects(url) == files(local)


def test_killed_pack_leaves_no_store_and_resume_finishes_it(s3, src, local):
    url = f"s3://{s3.new_bucket()}/train"
    names = shard_names(local)
    kill_at_put(s3, lambda path: path == key(url, names[1]),  # shard 0 being uploaded
                ["pack", src, url, "--num-shards", str(SHARDS), "-q", "--workers", "2"],
                "the upload of the pack's second shard")
    with pytest.raises(StoreError, match=f"{url} has no manifest.json"):
        RemoteFolder(url)
    assert s3.count("PUT", key(url, names[0])) == 1
    proc = run_cli("pack", src, url, "--num-shards", str(SHARDS), "-q", "--resume")
    assert proc.returncode == 0, proc.stderr
    assert s3.count("PUT", key(url, names[0])) == 1  # kept, not packed or uploaded again
    assert objects(url) == files(local)
    assert not os.path.exists(staging_path(url))


def test_views_from_a_remote_store_equal_the_local_stores(packed, local, tmp_path):
    """Several views per record (decoded once, by rows where the record has row markers) read
    from the bucket are the local store's, under the same RNG."""
    from shardkit import View

    _, url, _, _ = packed
    views = [View(24), View(12, scale=(0.05, 0.3), flip=1.0)]
    remote = ShardDataset(url, views=views, cache_dir=tmp_path / "cache")
    here = ShardDataset(local, views=views)
    torch.manual_seed(5)
    got = remote.__getitems__(list(range(0, len(here), 3)))
    torch.manual_seed(5)
    want = here.__getitems__(list(range(0, len(here), 3)))
    assert len(got) == len(want) > 0
    for (g, gl), (w, wl) in zip(got, want):
        assert gl == wl and all(torch.equal(a, b) for a, b in zip(g, w))
