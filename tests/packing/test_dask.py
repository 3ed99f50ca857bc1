"""The Dask engine (a LocalCluster of 2 worker processes on 127.0.0.1) and the static multi-node
split with ``shardkit merge``: both must give the local engine's store, shard for shard."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import shardkit
from shardkit.cli import main as cli_main
from shardkit.errors import PackError
from shardkit.packing.layout import mixed_slots
from shardkit.read.inspect import verify

from helpers import image_tree, program_cmd, program_env, run_program
from helpers.scaleout import manifest, partial_of, shard_digests, store_files

distributed = pytest.importorskip("dask.distributed")

ARGS = ["--num-shards", "5", "--size", "32", "-q"]


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("src"))
    image_tree(root, classes=3, per_class=10, seed=3, pngs=1)
    return root


@pytest.fixture(scope="module")
def local(src, tmp_path_factory):
    """fmt -> the local engine's store of ``src``."""
    base = tmp_path_factory.mktemp("local")
    stores = {}
    for fmt in ("lmdb", "hdf5"):
        stores[fmt] = str(base / fmt)
        assert cli_main(["pack", src, stores[fmt], *ARGS, "--format", fmt, "--workers", "2"]) == 0
    return stores


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None,
                                  silence_logs=logging.ERROR) as c:
        yield c


def test_dask_local_cluster_from_the_cli(src, local, tmp_path):
    """``--engine dask`` without a scheduler starts its own 2-process LocalCluster."""
    out = str(tmp_path / "dask")
    assert cli_main(["pack", src, out, *ARGS, "--engine", "dask", "--workers", "2"]) == 0
    assert shard_digests(out) == shard_digests(local["lmdb"])
    assert store_files(out) == store_files(local["lmdb"])
    assert not os.path.exists(partial_of(out))


def test_own_local_cluster_runs_quiet_workers():
    """The LocalCluster shardkit starts runs its workers with the packing settings
    (QUIET_WORKERS): no statistical profiler (it samples the task thread 100 times a second),
    the event-loop check once a second (not 50 times), the system monitor every 2 s (not
    twice a second); the caller's own Dask config is untouched."""
    import dask

    from shardkit.packing.dask_engine import QUIET_WORKERS, DaskSession

    before = {key: dask.config.get(key) for key in QUIET_WORKERS}
    with DaskSession(None, 1) as session:
        periods = session.client.run(lambda dask_worker: {
            name: pc.callback_time for name, pc in dask_worker.periodic_callbacks.items()})
    assert before == {"distributed.worker.profile.enabled": True,
                      "distributed.admin.tick.interval": "20ms",
                      "distributed.admin.system-monitor.interval": "500ms"}
    assert {key: dask.config.get(key) for key in QUIET_WORKERS} == before
    (ms,) = periods.values()
    assert "heartbeat" in ms and "profile" not in ms
    assert ms["tick"] == 1000 and ms["monitor"] == 2000


def test_unguarded_script_is_told_to_guard_its_pack_call(src, tmp_path):
    """A script that calls pack(engine='dask') without a scheduler and without an
    ``if __name__ == "__main__":`` guard cannot work (Dask starts its workers by running the
    script again): pack says so in one line, naming the guard, and leaves no OUT. The same
    script with the guard packs."""
    call = (f"shardkit.pack({src!r}, 'out', engine='dask', workers=1, num_shards=2, "
            "size=32, progress=False)")
    script = tmp_path / "train.py"
    script.write_text(f"import shardkit\n{call}\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("shardkit.errors.PackError: could not start Dask's local worker "
                           "processes (RuntimeError: Nanny failed to start.)"), proc.stderr
    assert 'under `if __name__ == "__main__":`' in last
    assert sorted(os.listdir(tmp_path)) == ["train.py"]
    script.write_text(f"import shardkit\nif __name__ == '__main__':\n    {call}\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert verify(str(tmp_path / "out")).ok


def test_own_local_cluster_leaves_port_8787_alone():
    """shardkit's LocalCluster serves no dashboard, and its scheduler's HTTP server listens on
    a free port of 127.0.0.1: not on Dask's 8787, where a user's own cluster's dashboard may
    be (Dask would warn that the port is taken and move)."""
    import socket
    import warnings

    from shardkit.packing.dask_engine import DaskSession

    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 8787))
        held.listen()
    except OSError:  # another program has it: the same situation
        pass
    with warnings.catch_warnings(record=True) as caught, DaskSession(None, 1) as session:
        warnings.simplefilter("always")
        port = session.client.scheduler_info()["services"]["dashboard"]
    held.close()
    assert port != 8787
    assert not [w for w in caught if "8787" in str(w.message)], [str(w.message) for w in caught]
    assert session.cluster.dashboard_link is None or "8787" not in session.cluster.dashboard_link


def test_a_dashboard_is_named_only_where_the_scheduler_serves_one(src, tmp_path, capfd):
    """A scheduler's HTTP server answers its dashboard's address without bokeh too, with a page
    asking for bokeh: a pack on it names no dashboard then (a user would open a page that is
    not one); with bokeh, it names the page."""
    import importlib.util

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                  silence_logs=logging.ERROR) as cluster, \
            distributed.Client(cluster) as client:
        assert "dashboard" in client.scheduler_info()["services"]  # its HTTP server runs
        capfd.readouterr()
        shardkit.pack(src, str(tmp_path / "out"), engine="dask",
                      scheduler=cluster.scheduler_address, num_shards=1, size=32,
                      progress=True)
        err = capfd.readouterr().err
        link = cluster.dashboard_link
    assert "pack (dask): 100%" in err  # the pack showed its progress, where the line goes
    named = f"shardkit: Dask dashboard at {link}" in err
    assert named == (importlib.util.find_spec("bokeh") is not None), err[-2000:]


def test_docs_recommend_exactly_the_packing_settings():
    """Every ``DASK_...=`` variable docs/cluster.md tells users to set (the plain workers'
    exports, dask-jobqueue's prologue) is one of QUIET_WORKERS with its value, and each of
    them is there: the page and shardkit's own LocalCluster cannot drift apart."""
    import re

    import dask

    from shardkit.packing.dask_engine import QUIET_WORKERS

    page = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cluster.md")
    with open(page) as f:
        found = set(re.findall(r"export (DASK_[A-Z_]+)=([^\s\"]+)", f.read()))
    config = dask.config.collect_env(dict(found))
    assert len(found) == len(QUIET_WORKERS)
    assert {key: dask.config.get(key, config=config) for key in QUIET_WORKERS} == QUIET_WORKERS


def test_dask_scheduler_address(src, local, cluster, tmp_path):
    out = str(tmp_path / "dask-h5")
    pids = set(cluster.scheduler_info["workers"])
    assert len(pids) == 2 and all(a.startswith("tcp://127.0.0.1:") for a in pids)
    with distributed.Client(cluster.scheduler_address) as client:
        with distributed.get_task_stream(client) as stream:
            result = shardkit.pack(src, out, format="hdf5", size=32, num_shards=5,
                                   engine="dask", scheduler=cluster.scheduler_address,
                                   progress=False)
            assert result.count == 30 and result.shards == 5
        # The shards really were written by both worker processes, not by this one.
        counts = client.run(lambda dask_worker: dask_worker.state.executed_count)
        assert all(n > 0 for n in counts.values()), counts
    assert store_files(out) == store_files(local["hdf5"])
    assert verify(out).ok
    # Each worker ran a warm-up task (imports, the plan opened: startup, not the first shard's
    # time) that ended before its first shard task started.
    spans: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for task in stream.data:
        kind = "warm" if str(task["key"]).startswith("warm_up") else \
            "shard" if str(task["key"]).startswith("shardkit-shard") else None
        for span in task["startstops"]:
            if kind and span["action"] == "compute":
                spans.setdefault(task["worker"], {}).setdefault(kind, []).append(
                    (span["start"], span["stop"]))
    assert set(spans) == pids, spans
    for worker, kinds in spans.items():
        assert len(kinds["warm"]) == 1, (worker, kinds)
        assert kinds["warm"][0][1] <= min(start for start, _ in kinds["shard"]), (worker, kinds)


def test_dask_strict_failure_keeps_finished_shards(src, cluster, tmp_path):
    bad_src = str(tmp_path / "src")
    image_tree(bad_src, classes=3, per_class=10, seed=3, pngs=1)
    with open(os.path.join(bad_src, "c2", "img004.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff not a jpeg")
    out = str(tmp_path / "out")
    with pytest.raises(PackError, match="img004"):
        shardkit.pack(bad_src, out, size=32, num_shards=5, engine="dask", strict=True,
                      scheduler=cluster.scheduler_address, progress=False)
    assert not os.path.exists(out)
    done = [n for n in os.listdir(partial_of(out)) if n.endswith(".done.json")]
    # the shard with the bad image (source 24 of 30; the default layout mixes the classes)
    slot = int(np.flatnonzero(mixed_slots([c for c in range(3) for _ in range(10)], 0) == 24)[0])
    assert f"shard-{slot // 6:05d}.done.json" not in done
    # Without --strict the bad image is skipped, and --resume reuses the finished shards.
    result = shardkit.pack(bad_src, out, size=32, num_shards=5, engine="dask", resume=True,
                           scheduler=cluster.scheduler_address, progress=False)
    assert result.count == 29 and [s["path"] for s in result.skipped] == \
        [os.path.join(bad_src, "c2", "img004.jpg")]
    # the kept shards count in the store, not in this run's rate (6 sources a shard)
    assert (result.kept_shards, result.kept_sources) == (len(done), 6 * len(done))
    assert result.images_per_second == pytest.approx(
        (30 - 6 * len(done)) / result.packing_seconds)


def test_dask_not_installed_message(src, tmp_path):
    proc = run_program("cli_without_dask", "pack", src, str(tmp_path / "o"), "--num-shards", "2",
                       "--engine", "dask", "-q", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "pip install 'dask[distributed]'" in proc.stderr and "Traceback" not in proc.stderr


def test_static_split_then_merge(src, local, tmp_path, capsys):
    out = str(tmp_path / "split")
    assert cli_main(["pack", src, out, *ARGS, "--num-nodes", "2", "--node-rank", "0"]) == 0
    partial = partial_of(out)
    assert sorted(n for n in os.listdir(partial) if n.endswith(".lmdb")) == \
        ["shard-00000.lmdb", "shard-00002.lmdb", "shard-00004.lmdb"]
    capsys.readouterr()
    assert cli_main(["merge", out]) == 1  # node 1 has not run yet
    assert "not finished" in capsys.readouterr().err
    assert not os.path.exists(out)
    with pytest.raises(Exception):
        shardkit.ShardDataset(partial)
    assert cli_main(["pack", src, out, *ARGS, "--num-nodes", "2", "--node-rank", "1"]) == 0
    assert cli_main(["merge", out]) == 0
    assert not os.path.exists(partial)
    assert store_files(out) == store_files(local["lmdb"])
    assert manifest(out) == manifest(local["lmdb"])


def test_static_split_nodes_run_concurrently(src, local, tmp_path):
    out = str(tmp_path / "split-h5")
    nodes = [subprocess.Popen([sys.executable, "-m", "shardkit.cli", "pack", src, out, *ARGS,
                               "--format", "hdf5", "--workers", "1", "--num-nodes", "3",
                               "--node-rank", str(r)], stderr=subprocess.PIPE, text=True)
             for r in range(3)]
    for node in nodes:
        _, err = node.communicate(timeout=120)
        assert node.returncode == 0, err
    assert cli_main(["merge", out]) == 0
    assert store_files(out) == store_files(local["hdf5"])
    assert verify(out).ok


def first_line(proc: subprocess.Popen) -> str:
    """The first line a pack printed on stderr, past a connecting notice (a slow moment)."""
    line = proc.stderr.readline()
    return proc.stderr.readline() if line.startswith("shardkit: connecting to") else line


def test_an_unreachable_scheduler_is_said_while_tried_then_named(monkeypatch, capsys):
    """Dask tries an address for the whole timeout: after a moment the pack says it is
    connecting (it was silent for 60 s), then stops with one line naming the address."""
    from helpers.dask_cluster import free_port
    from shardkit.packing import dask_session

    monkeypatch.setattr(dask_session, "CONNECT_SECONDS", 2)
    monkeypatch.setattr(dask_session, "CONNECT_NOTICE_SECONDS", 0.2)
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(PackError, match=f"^cannot reach the Dask scheduler at {address}: "):
        dask_session.DaskSession(address)
    assert capsys.readouterr().err == (f"shardkit: connecting to the Dask scheduler at "
                                       f"{address} (up to 2 s)\n")


def test_a_scheduler_without_workers_is_said_then_waited_for(src, local, tmp_path):
    """A pack on a scheduler with no worker yet says so at once (it would wait in silence);
    Ctrl-C while its listing tasks wait is one line, exit 130 (client.gather's waiters had
    printed asyncio tracebacks), and ``shardkit.pack`` raises Interrupted there (it raised
    KeyboardInterrupt before packing began); a worker that joins later packs the same store."""
    import signal

    from helpers.dask_cluster import dask_cluster, worker_command

    out = str(tmp_path / "late")
    with dask_cluster(0) as (address, _), distributed.Client(address) as client:
        waiting = (f"shardkit: the Dask scheduler at {address} has no workers yet; waiting for "
                   "one to join\n")
        cmd = [sys.executable, "-m", "shardkit.cli", "pack", src, out, *ARGS, "--engine",
               "dask", "--scheduler", address]
        api = [sys.executable, "-c", "import sys, shardkit\ntry:\n    shardkit.pack(sys.argv[1], "
               "sys.argv[2], num_shards=5, size=32, progress=False, engine='dask', "
               "scheduler=sys.argv[3])\nexcept BaseException as exc:\n    print(type(exc), exc, "
               "file=sys.stderr)\n", src, out, address]
        said = {"cli": ("shardkit pack: interrupted; no output written\n", 130),
                "api": ("<class 'shardkit.errors.Interrupted'> interrupted; no output "
                        "written\n", 0)}
        for name, command in (("cli", cmd), ("api", api)):  # the CLI first: a fresh scheduler
            proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
            try:
                assert first_line(proc) == waiting
                # until its listing tasks are on the scheduler, waiting for a worker
                deadline = time.monotonic() + 120
                while not client.run_on_scheduler(
                        lambda dask_scheduler: len(dask_scheduler.tasks)):
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.05)
                proc.send_signal(signal.SIGINT)
                assert (proc.stderr.read(), proc.wait(timeout=120)) == said[name]
            finally:
                proc.kill()
        assert not os.path.exists(out)

        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        worker = None
        try:
            assert first_line(proc) == waiting
            worker = subprocess.Popen(worker_command(address), start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rest = proc.stderr.read()
            assert proc.wait(timeout=300) == 0 and rest.startswith("packed 30 images"), rest
        finally:
            proc.kill()
            if worker is not None:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=60)
    assert store_files(out) == store_files(local["lmdb"])


def test_ctrl_c_while_the_workers_pack_is_one_line(src, tmp_path):
    """A terminal's Ctrl-C (SIGINT to the whole process group) while the LocalCluster's workers
    run the pack's tasks, one frozen on an image: the pack's one line and exit 130 (each worker
    process printed its KeyboardInterrupt's traceback, 30 lines, before it)."""
    import signal

    out, events = str(tmp_path / "out"), str(tmp_path / "events")
    first = sorted(os.listdir(src))[0]
    block = os.path.join(first, sorted(os.listdir(os.path.join(src, first)))[0])
    proc = subprocess.Popen(
        [*program_cmd("blocking_pack"), "pack", src, out, *ARGS, "--engine", "dask",
         "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
        env=program_env({"SHARDKIT_TEST_BLOCK": block, "SHARDKIT_TEST_EVENTS": events,
                         # runpy's note on the test hook imported twice (sitecustomize, -m)
                         "PYTHONWARNINGS": "ignore::RuntimeWarning"}))
    try:
        deadline = time.monotonic() + 120  # only against a hang
        while not (os.path.exists(events) and "\nblock " in "\n" + open(events).read()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    lines = err.splitlines()
    assert proc.returncode == 130 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("shardkit pack: interrupted; ")
