"""One pack per URL prefix, wherever it runs: the lock object a pack takes in the store itself
(``shardkit.remote.packlock``), against a real moto S3 server reached through two endpoint
strings (``127.0.0.1`` and ``localhost``: two staging folders, two local locks, one store)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import boto3
import pytest

import shardkit
from helpers import one_line_error, run_cli
from helpers.s3server import S3Server, bucket_objects
from helpers.s3server import folder_files as files
from shardkit.errors import PackError
from shardkit.remote import packlock
from shardkit.remote.packlock import LOCK_NAME, PackLock

SOURCE = {"classes": 2, "per_class": 3, "seed": 11}  # src and local: tests/remote/conftest.py
SHARDS = 2


@pytest.fixture(scope="module")
def server(s3_env, tmp_path_factory):
    s3_env.setenv("SHARDKIT_CACHE_DIR", str(tmp_path_factory.mktemp("pack-lock-cache")))
    with S3Server() as s3:
        s3_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # inherited by the CLI
        s3.other = s3.endpoint.replace("127.0.0.1", "localhost")  # the same server
        yield s3


def path_of(url: str, name: str) -> str:
    return "/" + url.removeprefix("s3://") + "/" + name


def plant_lock(url: str, heartbeat_age: float, host: str = "elsewhere", pid: int = 4242) -> bytes:
    """A lock object as another pack writes it, its heartbeat ``heartbeat_age`` s old."""
    now = time.time()
    body = json.dumps({"kind": "shardkit pack lock", "url": url, "host": host, "pid": pid,
                       "token": "f" * 32, "started": now - heartbeat_age - 60,
                       "heartbeat": now - heartbeat_age}).encode()
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/{LOCK_NAME}", Body=body)
    return body


def held_pack(server: S3Server, url: str, src: str, shard: str):
    """A CLI pack to ``url`` (through 127.0.0.1) that waits in the PUT of ``shard``: returns
    (process, go); ``go.set()`` lets the PUT through."""
    reached, go = threading.Event(), threading.Event()

    def hold(path: str) -> None:
        if path == path_of(url, shard) and not reached.is_set():
            reached.set()
            go.wait()

    server.put_hooks.append(hold)
    proc = subprocess.Popen([sys.executable, "-m", "shardkit.cli", "pack", src, url,
                             "--num-shards", str(SHARDS), "-q", "--workers", "1"],
                            stderr=subprocess.PIPE, text=True)
    if not reached.wait(300):
        proc.kill()
        raise AssertionError(f"the pack never uploaded {shard}: {proc.communicate()[1]}")
    return proc, go, hold


def test_a_second_pack_through_another_endpoint_string_is_refused(server, src, local, tmp_path):
    url = f"s3://{server.new_bucket()}/train"
    first = sorted(n for n in files(local) if n.startswith("shard-"))[0]
    proc, go, hold = held_pack(server, url, src, first)
    try:
        owner = json.loads(bucket_objects(url)[LOCK_NAME])
        assert owner["pid"] == proc.pid and owner["kind"] == "shardkit pack lock"
        before = len(server.requests)
        second = run_cli("pack", src, url, "--num-shards", str(SHARDS), "-q",
                         env={"AWS_ENDPOINT_URL": server.other})
        assert second.returncode == 1 and one_line_error(second.stderr), second.stderr
        assert f"error: another pack is writing {url} (host " in second.stderr
        assert f"pid {proc.pid}, last heartbeat" in second.stderr and "--resume" in second.stderr
        assert not [p for m, p in server.requests[before:] if m in ("PUT", "DELETE")]
    finally:
        server.put_hooks.remove(hold)
        go.set()
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert bucket_objects(url) == files(local)  # every object the first pack's; no lock left
    check = run_cli("verify", url, "-q", "--cache-dir", str(tmp_path / "cache"))
    assert check.returncode == 0, check.stderr


def test_every_install_checks_the_lock_and_only_the_packs_own_is_deleted(server, src, local):
    url = f"s3://{server.new_bucket()}/train"
    first = sorted(n for n in files(local) if n.startswith("shard-"))[0]
    proc, go, hold = held_pack(server, url, src, first)
    try:  # another pack takes the prefix over while this one uploads its first shard
        planted = plant_lock(url, heartbeat_age=0)
    finally:
        server.put_hooks.remove(hold)
        go.set()
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and one_line_error(err), err
    assert (f"error: {url}: this pack no longer holds its lock {LOCK_NAME} (it is held by host "
            "elsewhere, pid 4242") in err and "stopped before writing shard-00001" in err
    left = bucket_objects(url)
    assert left[LOCK_NAME] == planted and "manifest.json" not in left


def test_an_interrupted_pack_gives_its_lock_back(server, src, local):
    url = f"s3://{server.new_bucket()}/train"
    first = sorted(n for n in files(local) if n.startswith("shard-"))[0]
    proc, go, hold = held_pack(server, url, src, first)
    try:
        assert LOCK_NAME in bucket_objects(url)
        proc.send_signal(signal.SIGINT)  # Ctrl-C while a shard is uploaded
        _, err = proc.communicate(timeout=300)
    finally:
        server.put_hooks.remove(hold)
        go.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "interrupted" in err, err
    assert LOCK_NAME not in bucket_objects(url)


def wait_for_gets(server: S3Server, path: str, count: int) -> None:
    deadline = time.monotonic() + 60  # a safety net: the GETs come within a second or two
    while server.count("GET", path) < count:
        assert time.monotonic() < deadline, f"no GET {count} of {path}"
        time.sleep(0.01)


def _acquire(lock: PackLock, errors: dict) -> None:
    try:
        lock.acquire()
    except PackError as exc:
        errors[id(lock)] = str(exc)


def test_racing_packs_one_wins_with_and_without_if_none_match(server):
    """Two packs that both found no lock and write theirs at the same moment: with a server that
    honours If-None-Match the first PUT wins; with one that ignores it (found out by the probe:
    the header is not trusted) the last writer wins once both read the lock back."""
    for ignore in (False, True):
        url = f"s3://{server.new_bucket()}/train"
        lock_path = path_of(url, LOCK_NAME)
        reached = [threading.Event(), threading.Event()]
        go = [threading.Event(), threading.Event()]
        seen = []

        def hold(path: str) -> None:
            if path == lock_path and len(seen) < 2:
                k = len(seen)
                seen.append(path)
                reached[k].set()
                go[k].wait()

        server.ignore_if_none_match = ignore
        server.put_hooks.append(hold)
        x = PackLock(url, {"endpoint_url": server.endpoint})
        y = PackLock(url, {"endpoint_url": server.other})
        errors: dict = {}
        threads = [threading.Thread(target=_acquire, args=(lock, errors)) for lock in (x, y)]
        try:
            threads[0].start()
            assert reached[0].wait(60)  # x's PUT of the lock waits; y finds no lock yet
            threads[1].start()
            assert reached[1].wait(60)
            if ignore:  # both read the lock back once both PUTs are in
                server.hold(lock_path)
                gets = server.count("GET", lock_path)
            go[0].set()  # x's PUT is served before y's
            if ignore:
                wait_for_gets(server, lock_path, gets + 1)
            else:
                threads[0].join(60)
            go[1].set()
            if ignore:
                wait_for_gets(server, lock_path, gets + 2)
                server.release()
            for t in threads:
                t.join(60)
        finally:
            server.put_hooks.remove(hold)
            server.ignore_if_none_match = False
            for e in go:
                e.set()
            server.release()
        winner, loser = (y, x) if ignore else (x, y)
        assert x.conditional is (not ignore) and y.conditional is (not ignore)
        assert winner.held and not loser.held and list(errors) == [id(loser)], errors
        assert errors[id(loser)].startswith(f"another pack is writing {url} (host ")
        assert json.loads(bucket_objects(url)[LOCK_NAME])["token"] == winner.token
        loser.release()  # not its lock: left alone
        assert LOCK_NAME in bucket_objects(url)
        winner.release()
        assert bucket_objects(url) == {}


def test_stale_live_and_foreign_locks(server, src, local):
    url = f"s3://{server.new_bucket()}/train"
    plant_lock(url, heartbeat_age=packlock.STALE_SECONDS + 60)
    with pytest.raises(PackError, match=f"^{url} is locked by a pack that stopped sending "
                                        "heartbeats .* s ago \\(host elsewhere, pid 4242, .*; "
                                        "if that pack is dead, rerun with `resume=True` to "
                                        "continue it or `overwrite=True` to start over$"):
        shardkit.pack(src, url, num_shards=SHARDS, workers=1, progress=False)
    # A live lock is never taken over, whatever the options.
    live = plant_lock(url, heartbeat_age=5)
    for options in ({"resume": True}, {"overwrite": True}):
        with pytest.raises(PackError, match=f"^another pack is writing {url} "):
            PackLock(url).check_free(**options)
        with pytest.raises(PackError, match=f"^another pack is writing {url} "):
            PackLock(url).acquire(**options)
    assert bucket_objects(url) == {LOCK_NAME: live}
    # An object at the lock's name that is not a lock: refused, never deleted.
    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    boto3.client("s3").put_object(Bucket=bucket, Key=f"{prefix}/{LOCK_NAME}", Body=b"mine")
    with pytest.raises(PackError, match=f"^{url}/{LOCK_NAME} is not a pack lock shardkit can "
                                        "read; if no pack is writing"):
        PackLock(url).acquire(resume=True)
    assert bucket_objects(url) == {LOCK_NAME: b"mine"}
    # A stale lock is taken over by a resume; the pack's own lock is gone when it ends.
    plant_lock(url, heartbeat_age=packlock.STALE_SECONDS + 60)
    shardkit.pack(src, url, num_shards=SHARDS, workers=1, progress=False, resume=True)
    assert bucket_objects(url) == files(local)


def test_the_holder_keeps_its_heartbeat_fresh(server, monkeypatch):
    monkeypatch.setattr(packlock, "HEARTBEAT_SECONDS", 0.05)
    url = f"s3://{server.new_bucket()}/train"
    lock = PackLock(url)
    lock.acquire()
    try:
        first = json.loads(bucket_objects(url)[LOCK_NAME])
        deadline = time.monotonic() + 60
        while json.loads(bucket_objects(url)[LOCK_NAME])["heartbeat"] <= first["heartbeat"]:
            assert time.monotonic() < deadline, "the heartbeat was never rewritten"
            time.sleep(0.05)
        assert json.loads(bucket_objects(url)[LOCK_NAME])["token"] == lock.token
    finally:
        lock.release()
    assert bucket_objects(url) == {}
