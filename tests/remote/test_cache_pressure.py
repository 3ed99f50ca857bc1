"""The remote cache under pressure: LRU by use, keys, damaged copies, read-ahead, killed and
in-flight downloads, a limit that holds across processes, datasets dropped without close().

Real moto S3 server on 127.0.0.1 (``helpers.s3server``); GETs are counted on the server's side.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import re
import shutil
import signal

import boto3
import numpy as np
import pytest

import shardkit
from helpers.s3server import S3Server
from shardkit import ShardDataset, metadata
from shardkit.errors import StoreError
from shardkit.fileutil import sha256_file
from shardkit.remote import RemoteFolder, ShardCache, upload_folder_store

SOURCE = {"classes": 3, "per_class": 8, "seed": 21}  # src and local: tests/remote/conftest.py
SHARDS = 6


@pytest.fixture(scope="module")
def server(s3_env):
    with S3Server() as s3:
        s3_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # inherited by child processes
        yield s3


@pytest.fixture
def url(server, local) -> str:
    url = f"s3://{server.new_bucket()}/train"
    upload_folder_store(local, url)
    return url


def key(url: str, name: str) -> str:
    return "/" + url.removeprefix("s3://") + "/" + name


def manifest(folder: str) -> dict:
    with open(os.path.join(folder, metadata.MANIFEST_NAME), "rb") as f:
        return metadata.parse_manifest_layout(f.read(), folder)


def largest(folder: str) -> int:
    return max(e["bytes"] for e in manifest(folder)["shards"])


def room_for(folder: str, *shards: int) -> int:
    """A cache limit that holds exactly these shards (and so any one shard of the store)."""
    sizes = [e["bytes"] for e in manifest(folder)["shards"]]
    limit = sum(sizes[k] for k in shards)
    assert limit >= max(sizes)
    return limit


def cached(cache: ShardCache) -> set[int]:
    return {k for k in range(len(cache.remote.meta["shards"])) if os.path.exists(cache.path(k))}


def cache_bytes(root) -> int:
    """Bytes of shard files under the cache root, as ``du`` would count the shards."""
    total = 0
    for folder in os.scandir(root):
        if folder.is_dir():
            total += sum(e.stat().st_size for e in os.scandir(folder.path)
                         if e.name.startswith("shard-"))
    return total


def gets(server: S3Server, url: str, folder: str) -> list[int]:
    return [server.count("GET", key(url, e["file"])) for e in manifest(folder)["shards"]]


# -- children ---------------------------------------------------------------------------------

def _fetch_and_hold(cache: ShardCache, k: int, conn) -> None:
    cache.fetch(k)
    conn.send("fetched")
    conn.recv()


def _held_download(server: S3Server, url: str, cache: ShardCache, k: int):
    """``(process, pipe)``: a fork child started fetching shard ``k`` through ``cache`` while the
    server holds that shard's GET (``server.hold_reached`` once it is in flight)."""
    server.hold(key(url, cache.remote.meta["shards"][k]["file"]))
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_fetch_and_hold, args=(cache, k, child), daemon=True)
    proc.start()
    return proc, parent


def _open_and_hold(url: str, cache_dir: str, limit: int, shards: list[int], conn) -> None:
    ds = ShardDataset(url, output="bytes", cache_dir=cache_dir, cache_limit=limit,
                      max_open_shards=len(shards))
    for k in shards:
        ds.store.shard(k)
    conn.send(ds.store.open_shards)
    conn.recv()
    ds.close()
    conn.send("closed")


# -- tests ------------------------------------------------------------------------------------

def test_eviction_is_least_recently_used_not_least_recently_downloaded(url, local, tmp_path):
    cache = ShardCache(RemoteFolder(url), tmp_path / "cache", cache_limit=room_for(local, 0, 2))
    for k in (0, 1, 0):  # shard 0 downloaded first, but used last
        cache.fetch(k)
        cache.release(k)
    cache.fetch(2)
    assert cached(cache) == {0, 2}  # shard 1, the least recently used, made room


def test_cache_key_holds_the_manifest_hash(server, src, tmp_path):
    """A URL re-packed with other class names (same images in the same order and names of the
    same length, so shards of the same sizes) is never served from the old store's cache."""
    other = str(tmp_path / "renamed")
    shutil.copytree(src, other)
    for name in sorted(os.listdir(other)):
        os.rename(os.path.join(other, name), os.path.join(other, "d" + name[1:]))
    url = f"s3://{server.new_bucket()}/train"
    cache_dir = tmp_path / "cache"
    first = str(tmp_path / "first")
    shardkit.pack(src, first, num_shards=2, workers=1, progress=False)
    upload_folder_store(first, url)
    old = ShardDataset(url, output="bytes", cache_dir=cache_dir)
    assert [old[i][1] for i in range(len(old))] == list(old.targets)
    old.close()
    second = str(tmp_path / "second")
    shardkit.pack(other, second, num_shards=2, workers=1, progress=False)
    upload_folder_store(second, url, overwrite=True)
    assert [e["bytes"] for e in manifest(first)["shards"]] == \
        [e["bytes"] for e in manifest(second)["shards"]]
    want = ShardDataset(second, output="bytes")
    new = ShardDataset(url, output="bytes", cache_dir=cache_dir)
    assert new.classes == want.classes != old.classes
    assert [new[i] for i in range(len(new))] == [want[i] for i in range(len(want))]
    new.close()


def test_a_truncated_cached_shard_is_downloaded_again(server, url, local, tmp_path):
    cache = ShardCache(RemoteFolder(url), tmp_path / "cache")
    path = cache.fetch(1)
    cache.close()
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    before = gets(server, url, local)[1]
    again = ShardCache(RemoteFolder(url), tmp_path / "cache")
    assert sha256_file(again.fetch(1)) == manifest(local)["shards"][1]["sha256"]
    assert gets(server, url, local)[1] == before + 1
    again.close()


def test_a_cached_shard_changed_in_place_is_downloaded_again(server, url, local, tmp_path):
    """One byte of a record in a cached shard flipped in place, its size and mtime kept: a new
    dataset in this process (every open of a shard checks it) serves the right bytes, read with
    ``verify=True`` too, and the shard is downloaded again, once."""
    cache_dir = tmp_path / "cache"
    want = ShardDataset(local, output="bytes")
    ds = ShardDataset(url, output="bytes", cache_dir=cache_dir)
    ds.store.shard(1)
    path = ds.store.cache.path(1)
    ds.close()
    st = os.stat(path)
    with open(path, "r+b") as f:
        data = f.read()
        jpeg = next(r[0] for r in (want[i] for i in range(len(want))) if r[0] in data)
        at = data.index(jpeg) + len(jpeg) // 2  # inside a record's JPEG data
        f.seek(at)
        f.write(bytes([data[at] ^ 0x10]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.path.getsize(path) == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    before = gets(server, url, local)[1]
    again = ShardDataset(url, output="bytes", cache_dir=cache_dir, verify=True)
    assert [again[i] for i in range(len(again))] == [want[i] for i in range(len(want))]
    assert gets(server, url, local)[1] == before + 1
    assert sha256_file(path) == manifest(local)["shards"][1]["sha256"]
    again.close()


def test_side_files_never_follow_a_planted_symlink(server, url, local, tmp_path):
    """A symbolic link planted at each side file's name, to a file that is not there (an open
    that follows it creates it) or to one that holds bytes: after use, no victim is created or
    changed; a lock file that is a link is refused with a message naming it."""
    cache = ShardCache(RemoteFolder(url), tmp_path / "cache")
    names = [e["file"] for e in manifest(local)["shards"]]
    victims = tmp_path / "victims"
    victims.mkdir()

    def plant(k: int, kind: str, content: bytes | None = None) -> str:
        victim = str(victims / f"{k}.{kind}")
        if content is not None:
            with open(victim, "wb") as f:
                f.write(content)
        os.symlink(victim, cache.side_file(names[k], kind))
        return victim

    created = [plant(0, "use"), plant(1, "dl"), plant(2, "ahead"), plant(3, "seal")]
    planted = b'{"time_ns": 4611686018427387904, "message": "planted failure"}'
    kept = {plant(4, "failed", planted): planted, plant(5, "failed", b"victim"): b"victim"}
    for k, kind in ((0, "use"), (1, "dl")):
        side = re.escape(cache.side_file(names[k], kind))
        with pytest.raises(StoreError, match=f"^cache file {side} is a symbolic link"):
            cache.fetch(k)
    cache.read_ahead([2])
    cache.wait_read_ahead()
    boto3.client("s3", endpoint_url=server.endpoint).delete_object(
        Bucket=url.removeprefix("s3://").split("/")[0], Key=f"train/{names[5]}")
    for k in (2, 3, 4):
        assert sha256_file(cache.fetch(k)) == manifest(local)["shards"][k]["sha256"]
    with pytest.raises(StoreError, match="object not found"):
        cache.fetch(5)
    assert not [v for v in created if os.path.lexists(v)]
    for victim, content in kept.items():
        with open(victim, "rb") as f:
            assert f.read() == content
    cache.close()


def test_a_cache_folder_other_users_may_write_or_own_is_refused(url, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(StoreError, match=f"^cache folder {shared} is writable by other users "
                                         r"\(mode 0777\): refused"):
        ShardCache(RemoteFolder(url), shared)
    assert os.listdir(shared) == []
    if os.geteuid() == 0:  # only root can give a folder away
        other = tmp_path / "other"
        other.mkdir(mode=0o755)
        os.chown(other, 4242, 4242)
        with pytest.raises(StoreError, match=f"^cache folder {other} is owned by another user "
                                             r"\(uid 4242\)"):
            ShardCache(RemoteFolder(url), other)


def test_a_damaged_cached_labels_file_is_downloaded_again(url, local, tmp_path):
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache")
    labels = ds.store.cache.labels()
    ds.close()
    data = bytearray(open(labels, "rb").read())
    data[-1] ^= 1
    with open(labels, "wb") as f:
        f.write(data)
    again = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache")
    assert np.array_equal(again.targets, ShardDataset(local).targets)
    again.close()


def test_opening_shard_k_downloads_the_next_shards_in_the_background(server, url, local,
                                                                     tmp_path):
    """Without a sampler, a process reading shard k (its first, or right after k-1) downloads
    k+1.. (``read_ahead_depth`` of them) before it asks for them."""
    ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache")
    ds.store.cache.read_ahead_depth = 2
    before = gets(server, url, local)
    ds.store.shard(0)
    ds.store.cache.wait_read_ahead()
    assert [a - b for a, b in zip(gets(server, url, local), before)] == [1, 1, 1, 0, 0, 0]
    ds.store.shard(1)  # reading on: shard 3 joins the read-ahead
    ds.store.cache.wait_read_ahead()
    assert [a - b for a, b in zip(gets(server, url, local), before)] == [1, 1, 1, 1, 0, 0]
    ds.close()


def test_a_killed_download_leaves_no_reservation(server, url, local, tmp_path):
    """A process killed mid-download leaves its ``.part`` file; the next eviction deletes it
    instead of counting it (else it would evict shards to make room for nothing)."""
    cache = ShardCache(RemoteFolder(url), tmp_path / "cache", cache_limit=room_for(local, 1, 2))
    proc, _ = _held_download(server, url, cache, 0)
    try:
        assert server.hold_reached.wait(60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    finally:
        server.release()
    parts = [n for n in os.listdir(cache.folder) if n.endswith(".part")]
    assert len(parts) == 1  # the killed download's reservation
    for k in (1, 2):
        cache.fetch(k)
        cache.release(k)
    assert cached(cache) == {1, 2}  # both fit: the dead reservation counted nothing
    assert not [n for n in os.listdir(cache.folder) if n.endswith(".part")]


def test_a_download_in_flight_counts_at_its_full_size(server, url, local, tmp_path):
    cache = ShardCache(RemoteFolder(url), tmp_path / "cache", cache_limit=room_for(local, 1, 2))
    cache.fetch(1)
    cache.release(1)
    proc, parent = _held_download(server, url, cache, 0)
    try:
        assert server.hold_reached.wait(60)
        cache.fetch(2)  # room for shard 2 and the download of shard 0: shard 1 goes
        assert cached(cache) == {2}
    finally:
        server.release()
    assert parent.recv() == "fetched"
    assert cached(cache) == {0, 2}
    parent.send("done")
    proc.join()
    cache.close()


def test_the_limit_holds_across_processes(server, url, local, tmp_path):
    """Another process holds the cache full (2 shards, both in use): this one, reading shard 2
    and then 3, keeps only the shard it reads (one shard over the limit, never more), reads
    ahead nothing, and once everyone has closed the cache is back under the limit."""
    limit = room_for(local, 0, 1)
    cache_dir = str(tmp_path / "cache")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_open_and_hold, args=(url, cache_dir, limit, [0, 1], child),
                       daemon=True)
    proc.start()
    try:
        assert sorted(parent.recv()) == [0, 1]
        ds = ShardDataset(url, output="bytes", cache_dir=cache_dir, cache_limit=limit,
                          max_open_shards=2)  # room for two, as far as this process knows
        want = ShardDataset(local, output="bytes")
        shard_of = ds.store.locate_many(np.arange(len(ds)))[0]
        for k in (2, 3):
            i = int(np.flatnonzero(shard_of == k)[0])
            assert ds[i] == want[i]
            ds.store.cache.wait_read_ahead()
            assert ds.store.open_shards == [k]
            assert cache_bytes(cache_dir) <= limit + largest(local)
        assert cached(ds.store.cache) == {0, 1, 3}
        parent.send("close")
        assert parent.recv() == "closed"
        proc.join()
        ds.close()
        assert cache_bytes(cache_dir) <= limit
    finally:
        if proc.is_alive():
            proc.kill()


def test_datasets_dropped_without_close_release_descriptors_and_locks(url, local, tmp_path):
    def fds() -> int:  # descriptors of files in the cache
        def target(fd: str) -> str:
            try:
                return os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                return ""
        return sum(target(fd).startswith(str(tmp_path / "cache")) for fd in os.listdir(
            "/proc/self/fd"))

    def my_flocks() -> int:
        with open("/proc/locks") as f:
            return sum(1 for line in f if " FLOCK " in line and f" {os.getpid()} " in line)

    limit = 3 * largest(local)
    warm = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache", cache_limit=limit)
    warm[0]
    warm.store.cache.wait_read_ahead()
    warm.close()
    del warm
    gc.collect()
    base_fds, base_locks = fds(), my_flocks()
    for _ in range(10):
        ds = ShardDataset(url, output="bytes", cache_dir=tmp_path / "cache", cache_limit=limit)
        for k in range(3):
            ds.store.shard(k)
        ds.store.cache.wait_read_ahead()
        del ds
    gc.collect()
    held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")]
    held = [h for h in held if "cache" in h]
    assert (fds(), my_flocks()) == (base_fds, base_locks) == (0, 0), held
    # Nothing holds the dropped datasets' shards: another process may evict all of them.
    other = ShardCache(RemoteFolder(url), tmp_path / "cache", cache_limit=limit)
    for k in range(3, SHARDS):
        other.fetch(k)
    assert cached(other) == {3, 4, 5}
    other.close()
