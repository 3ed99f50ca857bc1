"""Read-ahead keeps the link busy: a download that has all its bytes frees its place for the next
one while it is checked and stored (SHA-256, fsync), places go in the order the shards are read;
and the fault proxy's shaped-link timeline, which ``benchmarks/remote_latency.py`` accounts an
epoch's time with.

Real moto S3 server behind ``helpers.faultproxy``; synchronised on the proxy's request log.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading

import pytest

import shardkit.remote.cache
from helpers.faultproxy import FaultProxy
from helpers.s3server import S3Server
from shardkit import metadata
from shardkit.fileutil import sha256_file
from shardkit.remote import RemoteFolder, ShardCache, upload_folder_store
from shardkit.remote.slots import Slots

SOURCE = {"classes": 3, "per_class": 6, "seed": 41}  # src and local: tests/remote/conftest.py
SHARDS = 3


@pytest.fixture(scope="module")
def server(s3_env):
    with S3Server() as s3:
        yield s3


@pytest.fixture(scope="module")
def url(server, local, s3_env) -> str:
    s3_env.setenv("AWS_ENDPOINT_URL", server.endpoint)
    url = f"s3://{server.new_bucket()}/train"
    upload_folder_store(local, url)
    return url


@pytest.fixture
def proxy(server, url, monkeypatch):
    """The proxy in front of the server; every client of the test goes through it."""
    with FaultProxy(server.endpoint) as p:
        monkeypatch.setenv("AWS_ENDPOINT_URL", p.endpoint)
        yield p


def shard_files(folder: str) -> list[str]:
    with open(os.path.join(folder, metadata.MANIFEST_NAME), "rb") as f:
        return [e["file"] for e in metadata.parse_manifest_layout(f.read(), folder)["shards"]]


def key(url: str, name: str) -> str:
    return "/" + url.removeprefix("s3://") + "/" + name


def test_a_download_being_checked_does_not_hold_back_the_next(proxy, url, local, tmp_path,
                                                              monkeypatch):
    """One download at a time (depth 1), the reader moving on to shards 1 and 2 (as a sampler
    does) while shard 0 downloads: shard 0's SHA-256 check waits until shard 1's GET has reached
    the proxy. A read-ahead that checks inside the download's place never sends that GET (the
    check would wait out its 60 s guard, and this fails)."""
    names = shard_files(local)
    cache = ShardCache(RemoteFolder(url), tmp_path / "cache")
    cache.read_ahead_depth = 1
    real, seen = shardkit.remote.cache.sha256_file, []

    def check(path: str) -> str:
        if os.path.basename(path).startswith(f".{names[0]}."):  # shard 0's .part
            seen.append(proxy.wait_for(lambda log: ("GET", key(url, names[1])) in log))
        return real(path)

    monkeypatch.setattr(shardkit.remote.cache, "sha256_file", check)
    for k in range(SHARDS):
        cache.read_ahead(range(k, SHARDS))
    cache.wait_read_ahead()
    assert seen == [True]
    for k, name in enumerate(names):  # each downloaded once, in reading order, and intact
        assert sha256_file(cache.path(k)) == sha256_file(os.path.join(local, name))
    shards = [key(url, n) for n in names]
    assert [p for m, p in proxy.requests if m == "GET" and p in shards] == shards
    assert not [n for n in os.listdir(cache.folder) if n.endswith(".part")]
    cache.close()


def test_the_shaped_link_timeline_accounts_every_byte(server, url, local, tmp_path,
                                                      monkeypatch):
    """``busy`` holds exactly bytes / rate of sending; each transfer is logged with its body's
    bytes; no stretch of the link sends faster than ``rate`` beyond one ``burst``."""
    rate = 4e6
    with FaultProxy(server.endpoint, rate=rate) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        cache = ShardCache(RemoteFolder(url), tmp_path / "cache")
        for k in range(SHARDS):
            cache.fetch(k)
        cache.close()
    names = shard_files(local)
    gets = {t.path: t for t in proxy.transfers if t.method == "GET"}
    for name in names:
        t = gets[key(url, name)]
        assert t.bytes == os.path.getsize(os.path.join(local, name))
        assert t.requested <= t.started <= t.done
    sent = sum(t.bytes for t in proxy.transfers)
    assert sum(b - a for a, b in proxy.busy) * rate == pytest.approx(sent, rel=1e-6)
    first = min(t.started for t in proxy.transfers if t.bytes)
    last = max(t.done for t in proxy.transfers)
    assert sent <= rate * (last - first) + proxy.burst + 1  # + 1: float rounding


def test_places_go_in_ticket_order_and_a_closed_ticket_lets_the_next_go():
    """A later ticket waiting first still gets its place after the earlier one (extra threads
    never overtake the shard read first); a ticket closed without a place frees its turn; a
    retry of a ticket that had its place waits only for a free one."""
    slots = Slots(1)
    first, second, third = slots.place(), slots.place(), slots.place()
    order, trying = [], threading.Event()

    def later() -> None:
        trying.set()
        second.take()
        order.append("second")
        second.give()

    waiter = threading.Thread(target=later)
    waiter.start()
    assert trying.wait(30)
    first.take()
    order.append("first")
    first.give()
    waiter.join(30)
    assert order == ["first", "second"]
    second.close()
    first.take()  # a retry: its turn is past
    order.append("first again")
    first.close()
    third.close()  # needed no place
    fourth = slots.place()
    fourth.take()  # every earlier ticket resolved, the one place free
    assert order == ["first", "second", "first again"]
    fourth.close()
    with pytest.raises(ValueError, match="read_ahead_depth must be a positive integer, got 0"):
        Slots(0)


def test_targets_judge_the_remote_latency_report():
    """``benchmarks/targets.py`` judges this tree's rows of ``remote_latency.py``'s JSON (not a
    ``--baseline``'s): the +100 ms / +0 ms ratio (<= 1.5) and the link's share (>= 0.9)."""
    spec = importlib.util.spec_from_file_location("targets", os.path.join(
        os.path.dirname(__file__), "..", "..", "benchmarks", "targets.py"))
    targets = importlib.util.module_from_spec(spec)
    sys.modules["targets"] = targets  # its dataclass looks its module up by name
    spec.loader.exec_module(targets)

    def row(name, code, seconds, rtt=0.0, rate=None, share=None):
        return {"row": name, "code": code, "seconds": seconds, "rtt": rtt, "rate": rate,
                "link_share": share}

    rows = [row("RTT +0 ms, read-ahead default", "this tree", 4.0),
            row("RTT +100 ms, read-ahead default", "this tree", 6.2, rtt=0.1),
            row("link 2 MB/s, RTT +0 ms", "HEAD~1", 17.6, rate=2e6, share=0.81),
            row("link 2 MB/s, RTT +0 ms", "this tree", 15.1, rate=2e6, share=0.95),
            row("link 2 MB/s, RTT +20 ms", "this tree", 15.5, rtt=0.02, rate=2e6, share=0.89)]
    assert targets.judge({"remote_latency": {"rows": rows}}) == [
        "target: cold epoch at +100 ms RTT = 1.55 x at +0 ms (default read-ahead) (<= 1.5: NOT "
        "met)",
        "target: shaped link 2 MB/s, +0 ms: shard bytes / epoch seconds = 0.95 of the link rate "
        "(>= 0.9: met)"]


def test_read_ahead_depth_follows_the_shard_size():
    """Small shards: more downloads in flight (round trips dominate); large ones: a few, so what
    is fetched ahead stays within READ_AHEAD_BYTES."""
    from shardkit.remote.readahead import (READ_AHEAD_BYTES, READ_AHEAD_MAX, READ_AHEAD_MIN,
                                           default_read_ahead)

    assert default_read_ahead([900_000, 1_000_000]) == READ_AHEAD_MAX
    assert default_read_ahead([256 << 20]) == READ_AHEAD_MIN
    assert default_read_ahead([READ_AHEAD_BYTES // 8]) == 8
    assert default_read_ahead([]) == READ_AHEAD_MAX


def test_more_downloads_in_flight_than_botocore_pools(server, src, proxy, tmp_path, monkeypatch):
    """A read-ahead of 16 shards has 16 GETs at the server at once: every response is held at
    the proxy until all 16 requests have arrived. With botocore's default pool of 10 connections
    the 11th request waits for a connection until a held one times out (read_timeout 300 s
    here), so this fails at the 30 s guard."""
    import shardkit

    many = 16
    folder = str(tmp_path / "many")
    shardkit.pack(src, folder, num_shards=many, workers=1, progress=False)
    url = f"s3://{server.new_bucket()}/many"
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    upload_folder_store(folder, url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    names = shard_files(folder)
    for name in names:
        proxy.add("GET", key(url, name), "stall")
    remote = RemoteFolder(url, {"config_kwargs": {"read_timeout": 300}})
    cache = ShardCache(remote, tmp_path / "cache")
    cache.read_ahead_depth = many
    cache.read_ahead(range(many))
    try:
        assert proxy.wait_for(lambda log: all(("GET", key(url, n)) in log for n in names), 30)
    finally:
        proxy.release()
        cache.wait_read_ahead()
    for k in range(many):  # the held downloads are retried: every shard ends up cached, whole
        assert sha256_file(cache.fetch(k)) == cache.remote.meta["shards"][k]["sha256"]
    cache.close()
