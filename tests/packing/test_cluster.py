"""Packing at cluster scale, on a real ``dask scheduler`` + ``dask worker --nworkers 2`` started on
127.0.0.1 (``helpers.dask_cluster``) and a real S3 server (moto) behind the fault proxy:

* loose images under a bucket prefix pack as the same local folder (listing paginated past
  moto's 1,000 keys a page; dropped connections retried), with the local and the Dask engine;
* a worker SIGKILLed mid-shard costs time only: the store is byte-identical;
* a task that fails twice is run again and succeeds; one that always fails stops the pack with
  one line naming the shard (after a slow-shard line names it), keeps the finished shards, and
  ``--resume`` completes the same store;
* a refused GET of an image (an expired session token) fails the pack naming the shard and the
  object after the shard's retries, never a skipped image; ``--resume`` completes the store.

Faults inside the worker processes come from ``SHARDKIT_FAULTS`` (:mod:`shardkit.packing.faults`),
set in the cluster's environment; each test writes the spec file it needs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time

import fsspec
import numpy as np
import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends

import shardkit
import shardkit.remote.access
from shardkit.cli import main as cli_main
from shardkit.packing import dask_watch, grain

from helpers import image_tree, jpeg_bytes, random_photo, write_bytes
from helpers.dask_cluster import dask_cluster
from helpers.faultproxy import FaultProxy
from helpers.s3server import DUMMY_ENV, S3Server
from helpers.scaleout import manifest, partial_of, records, store_files

distributed = pytest.importorskip("dask.distributed")

OPTIONS = {"num_shards": 4, "size": 32}
ARGS = ["--num-shards", "4", "--size", "32", "-q"]
PAD = 1005  # non-image keys sorted before c0's images: they are on the listing's second page


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("cluster") / "src")
    image_tree(root, classes=3, per_class=6, seed=5)
    rng = np.random.default_rng(9)
    write_bytes(os.path.join(root, "c0", "sub", "deep.jpg"), jpeg_bytes(random_photo(rng)))
    write_bytes(os.path.join(root, "c1", "broken.jpg"), b"\xff\xd8\xff not a jpeg")
    write_bytes(os.path.join(root, "c2", "notes.txt"), b"not an image")
    return root


@pytest.fixture(scope="module")
def local(src, tmp_path_factory) -> str:
    """``src`` packed by the local engine: the reference."""
    out = str(tmp_path_factory.mktemp("cluster-local") / "train")
    shardkit.pack(src, out, workers=1, progress=False, **OPTIONS)
    return out


@pytest.fixture(scope="module")
def s3(src):
    """(server, proxy, url): ``src`` uploaded under ``url`` with PAD filler keys; every client of
    this process and of the cluster reaches the server through the proxy."""
    with pytest.MonkeyPatch.context() as mp, S3Server() as server, \
            FaultProxy(server.endpoint) as proxy:
        for key, value in DUMMY_ENV.items():
            mp.setenv(key, value)
        mp.setenv("AWS_ENDPOINT_URL", server.endpoint)
        bucket = server.new_bucket()
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.put(src + "/", f"{bucket}/train/", recursive=True)
        # Straight into the server's own store: 1,005 PUTs to moto take about 20 s here.
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
        for i in range(PAD):
            backend.put_object(bucket, f"train/c0/_pad/{i:04d}.txt", b"x")
        mp.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        mp.setattr(shardkit.remote.access, "RETRY_DELAYS", (0.05, 0.05))  # this process only
        yield server, proxy, f"s3://{bucket}/train"


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("faults") / "faults.json")


@pytest.fixture(scope="module")
def cluster(s3, faults) -> str:
    """The scheduler's address; its workers reach the S3 server through the proxy and read
    ``faults``."""
    env = {"SHARDKIT_FAULTS": faults, "AWS_ENDPOINT_URL": s3[1].endpoint, **DUMMY_ENV}
    with dask_cluster(nworkers=2, env=env) as (address, _):
        yield address


def worker_pids(address: str, wait_for: int = 0) -> set[int]:
    """The process ids of the cluster's workers (after ``wait_for`` of them are up)."""
    with distributed.Client(address, timeout="60s") as client:
        if wait_for:
            client.wait_for_workers(wait_for, timeout=120)
        return set(client.run(os.getpid).values())


def set_faults(path: str, spec: dict) -> None:
    for name in os.listdir(os.path.dirname(path)):
        os.remove(os.path.join(os.path.dirname(path), name))
    with open(path, "w") as f:
        json.dump(spec, f)


def attempts(path: str) -> list[int]:
    with open(f"{path}.attempts") as f:
        return [int(n) for n in f.read().split()]


def same_but_root(a: str, root_a: str, b: str, root_b: str) -> None:
    """Stores ``a`` and ``b`` hold the same records, labels, layout, classes and skip list;
    only the recorded source root differs (and with it each shard file's checksum)."""
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    for name in ("labels.npy", "layout.npy"):
        assert store_files(a)[name] == store_files(b)[name]
    assert records(a) == records(b)

    def plain(store: str, root: str) -> dict:
        m = json.loads(json.dumps(manifest(store)).replace(root, "<ROOT>"))
        for shard in m["shards"]:
            del shard["sha256"], shard["bytes"]
        del m["meta_crc32"]  # the seal of the text that holds the root
        return m

    assert plain(a, root_a) == plain(b, root_b)


@pytest.fixture(scope="module")
def from_bucket(s3, tmp_path_factory) -> dict:
    """The bucket's images packed by the local engine, two GETs cut once mid-body: the store,
    the pack's result, and how often each cut object was asked for."""
    server, proxy, url = s3
    bucket_path = "/" + url.removeprefix("s3://")
    dropped = [f"{bucket_path}/c1/img002.jpg", f"{bucket_path}/c0/sub/deep.jpg"]
    for path in dropped:  # each GET of these is cut once mid-body: retried
        proxy.add("GET", path, "reset", at=100)
    out = str(tmp_path_factory.mktemp("from-bucket") / "store")
    result = shardkit.pack(url + "/", out, workers=0, progress=False, **OPTIONS)
    return {"store": out, "result": result, "gets": [proxy.count("GET", p) for p in dropped]}


def test_bucket_folder_packs_as_the_local_folder(s3, src, local, from_bucket):
    server, _, url = s3
    bucket_path = "/" + url.removeprefix("s3://")
    out, result = from_bucket["store"], from_bucket["result"]
    assert result.count == 19 and [s["path"] for s in result.skipped] == [f"{url}/c1/broken.jpg"]
    assert from_bucket["gets"] == [2, 2]
    assert manifest(out)["source_root"] == url
    same_but_root(out, url, local, src)
    # one listing of the classes, two pages for c0 (PAD + its images), one each for c1 and c2
    assert server.count("GET", bucket_path.split("/train")[0]) >= 5


def test_bucket_on_the_cluster_with_a_worker_killed_mid_shard(s3, cluster, faults, from_bucket,
                                                              tmp_path):
    """Shard 1's first attempt holds; its worker is SIGKILLed; Dask runs it again on the other
    worker (the nanny restarts the killed one) and the store is byte-identical."""
    _, _, url = s3
    reference = from_bucket["store"]
    set_faults(faults, {"1": {"hold": str(tmp_path / "never")}})
    out = str(tmp_path / "killed")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            shardkit.pack(url, out, engine="dask", scheduler=cluster, progress=False, **OPTIONS)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    packer = threading.Thread(target=run)
    packer.start()
    held = f"{faults}.held-1"
    deadline = time.monotonic() + 120
    while not os.path.exists(held) and packer.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(held) as f:
        pid = int(f.read())
    assert pid in worker_pids(cluster)
    os.kill(pid, signal.SIGKILL)
    packer.join(300)
    assert not packer.is_alive() and not errors, errors
    assert attempts(faults) == [1, 1]  # the killed attempt and the one that finished
    assert store_files(out) == store_files(reference)
    assert pid not in worker_pids(cluster, wait_for=2)  # the nanny started a new one


def test_a_refused_get_on_the_cluster_fails_the_pack_and_resume_completes(s3, cluster, faults,
                                                                          from_bucket, tmp_path):
    """The session token expires after the 6th GET of an image: every later one is refused (403
    ExpiredToken). A task's reads are retried, its shard run again (`retries=1`), then the pack
    fails naming the shard and a refused object, never skipping it; a resume with a fresh token
    completes the local engine's store."""
    _, proxy, url = s3
    set_faults(faults, {})
    proxy.answer("GET", "/" + url.removeprefix("s3://") + "/*", 403, "ExpiredToken",
                 times=None, after=6)
    out = str(tmp_path / "refused")
    try:
        with pytest.raises(shardkit.PackError) as info:
            shardkit.pack(url, out, engine="dask", scheduler=cluster, retries=1, progress=False,
                          **OPTIONS)
    finally:
        proxy.clear()
    assert re.fullmatch(
        r"shard \d failed after 2 attempts \(`retries` is 1\); last: TransferFailed: "
        + re.escape(url) + r"/c\d/\S+\.jpg: access denied by the server \(HTTP 403 ExpiredToken: "
        r"injected ExpiredToken\); refresh the session token \(AWS_SESSION_TOKEN\) \(gave up "
        r"after 3 attempts\); finished shards are kept: rerun with `resume=True` to continue",
        str(info.value)), info.value
    shardkit.pack(url, out, engine="dask", scheduler=cluster, resume=True, progress=False,
                  **OPTIONS)
    assert store_files(out) == store_files(from_bucket["store"])


def test_a_task_that_fails_twice_then_succeeds(src, local, cluster, faults, tmp_path, capsys):
    set_faults(faults, {"2": {"fail": 2}})
    out = str(tmp_path / "twice")
    assert cli_main(["pack", src, out, *ARGS, "--engine", "dask", "--scheduler",
                     cluster, "--retries", "2"]) == 0
    assert attempts(faults) == [2, 2, 2]
    assert store_files(out) == store_files(local)
    err = capsys.readouterr().err
    assert err.count("shardkit: shard 2 failed (OSError: [Errno 5] injected fault") == 2, err
    assert "running it again (2 of 2)" in err


def test_a_task_that_always_fails_stops_with_one_line_and_resume_completes(
        src, local, cluster, faults, tmp_path, capsys, monkeypatch):
    """Shard 3 holds until every other shard is done (and is named as slow meanwhile), then
    fails on every attempt: one line naming it, the other shards kept; --resume finishes."""
    monkeypatch.setattr(dask_watch, "STRAGGLER_MIN_SECONDS", 0.5)  # the floor for real shards
    go = str(tmp_path / "go")
    set_faults(faults, {"3": {"fail": -1, "hold": go}})
    out = str(tmp_path / "always")
    partial = partial_of(out)
    code: list[int] = []
    packer = threading.Thread(target=lambda: code.append(cli_main(
        ["pack", src, out, *ARGS, "--engine", "dask", "--scheduler", cluster,
         "--retries", "1"])))
    packer.start()
    done = [os.path.join(partial, f"shard-{k:05d}.done.json") for k in range(3)]
    err = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and packer.is_alive() and not (
            all(map(os.path.exists, done)) and "shard 3 is slow" in err):
        err += capsys.readouterr().err
        time.sleep(0.1)
    assert "shardkit: shard 3 is slow: running" in err, err
    typical = re.search(r"over 4x the median shard time \(([0-9.e-]+) s\)", err)
    assert typical and float(typical.group(1)) > 0, err  # small shards: 0.012 s, not 0.0 s
    kept = {k: os.stat(os.path.join(partial, f"shard-{k:05d}.lmdb")).st_ino for k in range(3)}
    open(go, "w").close()
    packer.join(120)
    err += capsys.readouterr().err
    assert code == [1] and attempts(faults) == [3, 3]
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and all(line.startswith("shardkit: ") for line in lines[:-1])
    assert lines[-1].startswith("shardkit pack: error: shard 3 failed after 2 attempts "
                                "(--retries is 1)"
                                "; last: OSError: [Errno 5] injected fault at shard 3, attempt 2"
                                ), lines[-1]
    assert "--resume" in lines[-1] and not os.path.exists(out)
    set_faults(faults, {})
    assert cli_main(["pack", src, out, *ARGS, "--engine", "dask", "--scheduler",
                     cluster, "--resume"]) == 0
    assert store_files(out) == store_files(local)
    # the finished shards were kept, not packed again (the same files, moved into OUT)
    assert {k: os.stat(os.path.join(out, f"shard-{k:05d}.lmdb")).st_ino for k in range(3)} == kept


def test_short_shards_share_tasks_and_a_shard_that_fails_is_run_again_alone(
        src, cluster, faults, tmp_path, capsys, monkeypatch):
    """19 shards of one image: once the first have finished, the next ones share tasks (two
    worker threads: five single-shard tasks, then [5, 6], then [7, 8, 9]; the held shard 10 is
    named as slow with its task's other shard). Shard 6 fails once in a task with shard 5:
    shard 5 is recorded, not run again; shard 6 runs again alone. Shard 7 fails once before
    shard 8 of its task ran: shard 8 goes back in line with no attempt counted, so that its own
    failure later still has its retry (`--retries 1`)."""
    monkeypatch.setattr(dask_watch, "STRAGGLER_MIN_SECONDS", 0.5)
    # Only the caps shape these tasks, not how long a one-image shard took on a busy machine
    monkeypatch.setattr(grain, "TASK_SECONDS", 3600.0)
    reference = str(tmp_path / "local")
    shardkit.pack(src, reference, workers=1, progress=False, num_shards=19, size=32)
    go = str(tmp_path / "go")
    set_faults(faults, {"5": {"fail": 0}, "6": {"fail": 1}, "7": {"fail": 1}, "8": {"fail": 1},
                        "10": {"hold": go}})
    out = str(tmp_path / "grouped")
    code: list[int] = []
    packer = threading.Thread(target=lambda: code.append(cli_main(
        ["pack", src, out, "--num-shards", "19", "--size", "32", "-q", "--engine", "dask",
         "--scheduler", cluster, "--retries", "1"])))
    with distributed.Client(cluster) as client, distributed.get_task_stream(client) as stream:
        packer.start()
        err = ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and packer.is_alive() and \
                not re.search(r" (is|are) slow: ", err):
            err += capsys.readouterr().err
            time.sleep(0.1)
        open(go, "w").close()
        packer.join(120)
    err += capsys.readouterr().err
    assert code == [0], err
    # shardkit-shard-FIRST-LAST-...: the shards of each task that ran, in the order they started
    spans = [tuple(map(int, m.groups())) for m in
             (re.match(r"shardkit-shard-(\d+)-(\d+)-", str(t["key"])) for t in
              sorted(stream.data, key=lambda t: t["startstops"][0]["start"])) if m]
    assert sorted({k for a, b in spans for k in range(a, b + 1)}) == list(range(19)), spans
    assert (5, 6) in spans and (6, 6) in spans  # shard 6 run again alone, shard 5 not
    assert (7, 9) in spans and (7, 7) in spans
    assert [span for span in spans if span[0] <= 8 <= span[1]][0] == (7, 9)  # 8 first with 7
    slow = re.findall(r"shardkit: shards (\d+)-(\d+) are slow: running \d+ s on \S+, over 4x "
                      r"the median shard time \(\S+ s\) times its (\d+) shards", err)
    assert any(int(a) <= 10 <= int(b) and int(n) == int(b) - int(a) + 1 >= 2
               for a, b, n in slow), err
    for k in (6, 7, 8):
        assert err.count(f"shardkit: shard {k} failed (OSError: [Errno 5] injected fault at "
                         f"shard {k}, attempt 1") == 1, err
    assert sorted(attempts(faults)) == [5, 6, 6, 7, 7, 8, 8, 10]  # shard 5 not packed again
    assert store_files(out) == store_files(reference)


def test_a_task_that_fails_as_a_whole_runs_each_of_its_shards_again_alone(
        src, cluster, faults, tmp_path, capsys, monkeypatch):
    """The task [7, 8, 9] raises before any of its shards runs (not one shard's failure): each
    of its shards runs again alone, that attempt not counted, so shard 8, failing once alone
    after it, still has its one retry (`--retries 1`); the store is the local engine's."""
    monkeypatch.setattr(grain, "TASK_SECONDS", 3600.0)  # the caps alone shape the tasks
    reference = str(tmp_path / "local")
    shardkit.pack(src, reference, workers=1, progress=False, num_shards=19, size=32)
    set_faults(faults, {"7": {"task": 1}, "8": {"fail": 1}})
    out = str(tmp_path / "whole")
    with distributed.Client(cluster) as client, distributed.get_task_stream(client) as stream:
        assert cli_main(["pack", src, out, "--num-shards", "19", "--size", "32", "-q",
                         "--engine", "dask", "--scheduler", cluster, "--retries", "1"]) == 0
    err = capsys.readouterr().err
    spans = [tuple(map(int, m.groups())) for m in
             (re.match(r"shardkit-shard-(\d+)-(\d+)-", str(t["key"])) for t in
              sorted(stream.data, key=lambda t: t["startstops"][0]["start"])) if m]
    assert [span for span in spans if span[0] <= 7 <= span[1]] == [(7, 9), (7, 7)], spans
    assert spans.count((8, 8)) == 2 and spans.count((9, 9)) == 1, spans
    assert err.count("shardkit: the task packing shards 7-9 failed (OSError: [Errno 5] injected "
                     "task fault at shard 7, task 1") == 1, err
    assert "running them again one shard a task" in err, err
    assert err.count("shardkit: shard 8 failed (OSError: [Errno 5] injected fault at shard 8, "
                     "attempt 1") == 1 and "running it again (1 of 1)" in err, err
    assert store_files(out) == store_files(reference)


def test_a_running_task_stops_once_its_pack_stopped(src, cluster, faults, tmp_path,
                                                    monkeypatch):
    """Dask cannot stop a running task: the task [7, 8, 9] is held as shard 8 starts while
    shard 12 fails (`--retries 0`) and the pack stops; released, it writes no record of shard 8
    (its partial file deleted) and does not start shard 9: it holds no worker from the next
    pack, and a `--resume` run meanwhile is the only writer of those files."""
    monkeypatch.setattr(grain, "TASK_SECONDS", 3600.0)  # the caps alone shape the tasks
    go = str(tmp_path / "go")
    # shard 12 fails only once shard 8 is held (its attempt writes faults.held-8 first)
    set_faults(faults, {"8": {"hold": go}, "9": {"fail": 0},
                        "12": {"fail": -1, "hold": f"{faults}.held-8"}})
    out = str(tmp_path / "stopped")
    with distributed.Client(cluster) as client:
        assert cli_main(["pack", src, out, "--num-shards", "19", "--size", "32", "-q",
                         "--engine", "dask", "--scheduler", cluster, "--retries", "0"]) == 1
        assert os.path.exists(f"{faults}.held-8")  # still held: the pack stopped meanwhile
        open(go, "w").close()
        deadline = time.monotonic() + 60
        # executing_tasks lists a cancelled task too while its thread still runs it
        while time.monotonic() < deadline and any(
                client.run(dask_watch.executing_tasks).values()):
            time.sleep(0.05)
        assert not any(client.run(dask_watch.executing_tasks).values())
    assert sorted(attempts(faults)) == [8, 12]  # shard 9 never started
    partial = partial_of(out)
    assert os.path.exists(os.path.join(partial, "shard-00007.lmdb"))  # finished before
    assert not [name for name in os.listdir(partial) if name.startswith("shard-00008")]


def test_the_slow_shard_watch_asks_only_while_a_task_may_be_slow(cluster, tmp_path,
                                                                  monkeypatch):
    """The watch asks the workers what they run (a round trip through the scheduler to each,
    taking the GIL from their tasks, a log line on each) only while a task has been in flight
    longer than its limit, and then at most once per POLL_SECONDS; the limit is the median shard
    time times the task's shards. A real task held on a worker: named as one shard, not as 30."""
    monkeypatch.setattr(dask_watch, "STRAGGLER_MIN_SECONDS", 0.0)
    asked, said = [], []
    go = tmp_path / "go"

    def hold(path: str) -> None:
        while not os.path.exists(path):
            time.sleep(0.01)

    with distributed.Client(cluster) as client:
        real = client.run
        monkeypatch.setattr(client, "run", lambda *a, **k: asked.append(a[0]) or real(*a, **k))
        future = client.submit(hold, str(go), key="held-task", pure=False)
        try:
            deadline = time.monotonic() + 60  # until it runs (the ask here is not the watch's)
            while not any(real(dask_watch.executing_tasks).values()):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            monkeypatch.setattr(dask_watch, "POLL_SECONDS", 3600.0)  # one ask in this phase
            watch = dask_watch.Stragglers(said.append)
            watch.asked = float("-inf")
            watch.times = [0.1] * dask_watch.STRAGGLER_MIN_DONE  # a limit of 0.4 s a shard
            for _ in range(20):  # submitted just now: cannot have run 0.4 s yet
                watch.running(client, {"held-task": (future, [7], time.monotonic())})
            assert asked == []
            long_ago = time.monotonic() - 100
            time.sleep(0.5)  # the task has now run over 0.4 s, and under 30 x 0.4 s = 12 s
            for _ in range(20):
                watch.running(client, {"held-task": (future, list(range(7, 37)), long_ago)})
            assert asked == [dask_watch.executing_tasks] and said == []  # asked once a poll
            monkeypatch.setattr(dask_watch, "POLL_SECONDS", 0.0)
            watch.running(client, {"held-task": (future, [7], long_ago)})
            assert len(asked) == 2
            assert len(said) == 1 and said[0].startswith("shardkit: shard 7 is slow: running "), \
                said
            # named once: nothing left to ask about
            watch.running(client, {"held-task": (future, [7], long_ago)})
            assert len(asked) == 2 and len(said) == 1
        finally:
            go.touch()
            future.result(timeout=60)
