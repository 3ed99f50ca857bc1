"""Killed and interrupted packs, and a full disk: never a store that looks complete but is not.

* SIGKILL ``shardkit pack`` at chosen points (both formats, one file and three shards): while it
  starts its workers, while it packs (frozen on a random source), just after a shard is finished,
  and once OUT exists. No output that ``ShardDataset`` or ``shardkit verify`` accepts unless it is
  the complete store, the encoding workers die with it, and a rerun (``--resume`` for most
  sharded trials, reusing the shards that were finished) succeeds, leaves no temporary file, and
  yields the same store.
* SIGINT (Ctrl-C, sent to the whole process group as a terminal does) while the workers start and
  while it packs: exit status 130, one line on stderr, every child process gone, no OUT.
* A full disk (a 1 MiB tmpfs, where this machine lets us mount one; and, as a separate test,
  format writers that fail with ENOSPC): exit status 1, one clear line, no OUT, and an existing
  OUT left intact.

Packs are stopped on events, not after a delay: they run under
tests/helpers/programs/blocking_pack.py, whose encoders report to a file and freeze on a chosen
source (see there). Timeouts below only keep a broken pack from hanging the suite.
"""
from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
from helpers import program_cmd, program_env, run_program
from PIL import Image

from shardkit.errors import StoreError
from shardkit.packing.install import partial_path
from shardkit.read.store import Store

# Trials per config: at least one per kill point (3 for one file, 4 with shards; the default).
TRIALS_PER_CONFIG = int(os.environ.get("SHARDKIT_KILL_TRIALS", "0"))
SEED = int(os.environ.get("SHARDKIT_KILL_SEED", "7"))
# Where a kill lands (staging, shard entries, install) does not depend on the format, so the
# suite runs each format once and each layout once; SHARDKIT_KILL_CONFIGS=all adds the other two.
CONFIGS = [("lmdb", None), ("hdf5", 3)] + (
    [("hdf5", None), ("lmdb", 3)] if os.environ.get("SHARDKIT_KILL_CONFIGS") == "all" else [])

def check_stores(paths: list[str]) -> dict[str, dict]:
    """Open and fully read each store in one child process (which must not die)."""
    proc = run_program("check_stores", input="\n".join(paths) + "\n", capture_output=True,
                       text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    return {r["path"]: r for r in results}


HANG = 300  # s: only so that a broken pack cannot hang the suite


def pack_cmd(src: str, out: str, fmt: str, shards: int | None, *extra: str,
             blocking: bool = False) -> list[str]:
    """The CLI command; with ``blocking``, under helpers/programs/blocking_pack.py (same output;
    run it with ``env=program_env(...)``)."""
    prog = program_cmd("blocking_pack") if blocking else [sys.executable, "-m", "shardkit.cli"]
    cmd = [*prog, "pack", src, out, "--format", fmt, "--size", "64",
           "--workers", "2", "--quiet", *extra]
    return cmd + (["--num-shards", str(shards)] if shards else [])


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    """30 photo-sized JPEGs (800x600) in 3 classes."""
    root = str(tmp_path_factory.mktemp("kill-src") / "src")
    rng = np.random.default_rng(3)
    for c in range(3):
        os.makedirs(os.path.join(root, f"class{c}"))
        for i in range(10):
            base = Image.fromarray(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
            arr = np.asarray(base.resize((800, 600), Image.Resampling.BICUBIC), dtype=np.int16)
            arr = (arr + rng.integers(-16, 16, arr.shape)).clip(0, 255).astype(np.uint8)
            Image.fromarray(arr).save(os.path.join(root, f"class{c}", f"{i}.jpg"), quality=90)
    return root


SOURCES = [os.path.join(f"class{c}", f"{i}.jpg") for c in range(3) for i in range(10)]


def _descendants(pid: int) -> set[psutil.Process]:
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return set()


def _still_running(procs: set[psutil.Process], timeout: float = 60) -> list[psutil.Process]:
    """Those of ``procs`` that do not exit (waiting at most ``timeout`` s: they exit as soon as
    they notice, far sooner; then they are killed)."""
    _, alive = psutil.wait_procs(list(procs), timeout=timeout)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return alive


def _wait_until(ready, proc: subprocess.Popen, what: str) -> None:
    """Poll ``ready()`` (an event the pack leaves: a file, a line) while the pack runs."""
    deadline = time.monotonic() + HANG
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the pack exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the pack hung before {what}")
        time.sleep(0.01)


def _has_event(events: str, kind: str):
    def ready() -> bool:
        try:
            with open(events) as f:
                return any(line.split()[:1] == [kind] for line in f)
        except FileNotFoundError:
            return False
    return ready


def _partial_exists(partial: str) -> bool:
    """The partial output or a side file of it (an HDF5 spool) exists."""
    folder, name = os.path.split(partial)
    return any(n.startswith(name) for n in os.listdir(folder))


def _leftovers(folder: str, keep: str) -> list[str]:
    """Everything in ``folder`` (and in the store folder ``keep``) that is not part of a store."""
    extra = [n for n in os.listdir(folder) if n != keep]
    store = os.path.join(folder, keep)
    if os.path.isdir(store):
        extra += [f"{keep}/{n}" for n in os.listdir(store)
                  if not (n == "manifest.json" or n.startswith("shard-") and
                          n.endswith((".lmdb", ".h5")) or n.startswith("labels")
                          or n == "layout.npy")]  # the mixed record layout's
    return extra


def _kill_points(shards: int | None) -> list[str]:
    """Where each trial of a config kills the pack: every kind once (as the workers start; once
    shards 0 and 1 are finished, sharded only; frozen on a random source mid-pack; once OUT
    exists), then more random mid-pack kills up to ``TRIALS_PER_CONFIG``."""
    kinds = ["starting workers"] + (["after a shard"] if shards else []) + ["while packing"]
    extra = max(0, TRIALS_PER_CONFIG - len(kinds) - 1)
    return kinds + ["while packing"] * extra + ["after OUT"]


def _kill_trials(src: str, base, fmt: str, shards: int | None) -> dict:
    """SIGKILL ``shardkit pack`` at each of ``_kill_points`` for one config, then rerun it: what
    the kills left, the reruns' stores, and what went wrong (read and compared by the caller)."""
    rng = random.Random(f"{SEED}-{fmt}-{shards}")
    got = {"snapshots": [], "finals": [], "failures": [], "points": {}, "reused": 0, "resumed": 0}
    failures = got["failures"]
    for t, point in enumerate(_kill_points(shards)):
        trial = base / f"{fmt}-{shards}-trial{t:02d}"
        trial.mkdir()
        name = f"{fmt}, {shards}, trial {t} ({point})"
        out = str(trial / ("out" if shards else f"out.{fmt}"))
        partial = partial_path(out)
        events = str(trial / "events")
        env = program_env({"SHARDKIT_TEST_EVENTS": events})
        if point == "starting workers":
            env["SHARDKIT_TEST_HOLD"] = str(trial / "never")
            ready = _has_event(events, "starting")
        elif point == "after a shard":
            # Frozen on the last shard's first source: a chunk of sources may straddle a shard
            # boundary, but not there.
            env["SHARDKIT_TEST_BLOCK"] = SOURCES[len(SOURCES) * (shards - 1) // shards]
            block = _has_event(events, "block")
            done = os.path.join(partial, f"shard-{shards - 2:05d}.done.json")
            ready = lambda: block() and os.path.exists(done)  # noqa: E731
        elif point == "after OUT":
            ready = lambda: os.path.lexists(out)  # noqa: E731
        else:
            env["SHARDKIT_TEST_BLOCK"] = rng.choice(SOURCES)
            block = _has_event(events, "block")
            ready = lambda: block() and _partial_exists(partial)  # noqa: E731
        got["points"][point] = got["points"].get(point, 0) + 1
        proc = subprocess.Popen(pack_cmd(src, out, fmt, shards, blocking=True),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        if point == "after OUT":  # it may finish before the kill: OUT must then be whole
            deadline = time.monotonic() + HANG
            while proc.poll() is None and not ready() and time.monotonic() < deadline:
                time.sleep(0.002)
        else:
            try:
                _wait_until(ready, proc, point)
            except AssertionError as exc:
                failures.append(f"{name}: {exc}")
                proc.kill()
                proc.wait(timeout=HANG)
                continue
        seen = _descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)  # the main process only, as `kill -9 PID`
        proc.wait(timeout=HANG)
        if point in ("while packing", "after a shard") and \
                (os.path.lexists(out) or not _partial_exists(partial)):
            failures.append(f"{name}: OUT exists or no partial output after the kill")
        orphans = _still_running(seen)
        if orphans:
            failures.append(f"{name}: {len(orphans)} worker processes outlived the killed pack")
        # Keep what the kill left, to read later: it must be refused, or be the full store.
        for what, path in (("OUT", out), ("partial", partial)):
            if os.path.lexists(path):
                snap = str(trial / f"snapshot-{what}")
                (shutil.copytree if os.path.isdir(path) else shutil.copyfile)(path, snap)
                got["snapshots"].append((snap, (fmt, shards), what))
        # Rerun: with --resume after a shard and after OUT; mid-pack, the first such trial
        # resumes for LMDB and starts afresh for HDF5 (more trials: 70 % resume); as the
        # workers start, afresh. Shards recorded as finished must be reused.
        first = got["points"][point] == 1
        resume = bool(shards) and (
            point in ("after a shard", "after OUT") or point == "while packing" and (
                fmt == "lmdb" if first else rng.random() < 0.7))
        finished = {}
        if resume and os.path.isdir(partial):
            for entry_name in os.listdir(partial):
                if entry_name.endswith(".done.json"):
                    with open(os.path.join(partial, entry_name)) as f:
                        entry = json.load(f)
                    shard = os.path.join(partial, entry["file"])
                    if os.path.exists(shard):
                        finished[entry["sha256"]] = os.stat(shard).st_ino
        extra = (["--resume"] if resume else []) + (["--overwrite"] if os.path.lexists(out) else [])
        rerun = subprocess.run(pack_cmd(src, out, fmt, shards, *extra), capture_output=True,
                               text=True, timeout=HANG)
        got["resumed"] += resume
        if rerun.returncode != 0:
            failures.append(f"{name}: rerun failed: {rerun.stderr[-500:]}")
            continue
        left = _leftovers(str(trial), os.path.basename(out))
        left = [x for x in left if not x.startswith("snapshot-") and x != "events"]
        if left:
            failures.append(f"{name}: left behind {left}")
        if finished:
            with open(os.path.join(out, "manifest.json")) as f:
                manifest = json.load(f)
            inodes = {e["sha256"]: os.stat(os.path.join(out, e["file"])).st_ino
                      for e in manifest["shards"]}
            for sha, ino in finished.items():
                if inodes.get(sha) != ino:
                    failures.append(f"{name}: --resume repacked a finished shard")
                got["reused"] += 1
        got["finals"].append((out, (fmt, shards)))
    return got


@pytest.mark.slow
def test_sigkill_at_random_points_then_rerun(src, tmp_path):
    """Every kill point for every config (SHARDKIT_KILL_TRIALS adds random mid-pack kills); two
    configs at a time (each pack is mostly one busy process starting up)."""
    ref_paths = {}
    for fmt, shards in CONFIGS:
        out = str(tmp_path / "ref" / f"{fmt}-{shards}")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        subprocess.run(pack_cmd(src, out, fmt, shards), check=True, capture_output=True,
                       timeout=HANG)
        ref_paths[fmt, shards] = out

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda config: _kill_trials(src, tmp_path, *config), CONFIGS))
    snapshots = [s for run in runs for s in run["snapshots"]]
    finals = [f for run in runs for f in run["finals"]]
    failures = [f for run in runs for f in run["failures"]]
    points: dict[str, int] = {}
    for run in runs:
        for point, count in run["points"].items():
            points[point] = points.get(point, 0) + count
    reused = sum(run["reused"] for run in runs)
    resumed = sum(run["resumed"] for run in runs)
    n = sum(points.values())

    results = check_stores([p for p in ref_paths.values()] + [s for s, _, _ in snapshots]
                           + [f for f, _ in finals])
    expected = {}
    for config, path in ref_paths.items():
        assert "digest" in results[path] and results[path]["verify_rc"] == 0, results[path]
        expected[config] = results[path]["digest"]
    for snap, config, what in snapshots:
        res = results[snap]
        if "digest" in res and res["digest"] != expected[config]:
            failures.append(f"{snap}: a killed pack's {what} reads as a different store")
        if res["verify_rc"] == 0 and res.get("digest") != expected[config]:
            failures.append(f"{snap}: verify accepts a killed pack's incomplete {what}")
        if what == "OUT" and res.get("digest") != expected[config]:
            failures.append(f"{snap}: OUT exists after a kill but is not the complete store")
    for out, config in finals:
        res = results[out]
        if res.get("digest") != expected[config] or res["verify_rc"] != 0:
            failures.append(f"{out}: rerun produced a different or unverifiable store: {res}")
    print(f"SIGKILL trials: {n}, kill points {points}, resumed {resumed}, "
          f"finished shards reused {reused}, snapshots read {len(snapshots)}, "
          f"failures {len(failures)}")
    assert not failures, "\n".join(failures)
    assert n == sum(len(_kill_points(shards)) for _, shards in CONFIGS)
    assert reused >= 1  # --resume kept the shards finished before the kill


@pytest.mark.parametrize("fmt,shards", [("lmdb", None), ("hdf5", 3)])
@pytest.mark.parametrize("point", ["starting workers", "while packing"])
def test_ctrl_c_stops_the_workers(src, tmp_path, fmt, shards, point):
    """Ctrl-C while the workers start (it is deferred until they are up, then honoured) and
    while they pack."""
    out = str(tmp_path / ("out" if shards else f"out.{fmt}"))
    partial = partial_path(out)
    events, release = str(tmp_path / "events"), str(tmp_path / "release")
    env = program_env({"SHARDKIT_TEST_EVENTS": events})
    if point == "starting workers":
        env["SHARDKIT_TEST_HOLD"] = release
        ready = _has_event(events, "starting")
    else:
        env["SHARDKIT_TEST_BLOCK"] = SOURCES[12]
        ready = _has_event(events, "block")
    proc = subprocess.Popen(pack_cmd(src, out, fmt, shards, blocking=True), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        _wait_until(ready, proc, point)
        seen = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        with open(release, "w"):  # lets a held start go on
            pass
        _, stderr = proc.communicate(timeout=HANG)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith("shardkit pack: interrupted"), lines
    alive = _still_running(seen | _descendants(proc.pid))
    assert not alive, f"{len(alive)} child processes still running after Ctrl-C"
    assert not os.path.lexists(out)
    if shards:  # finished shards are kept for --resume, but nothing there opens as a store
        if os.path.lexists(partial):
            with pytest.raises(StoreError):
                Store(partial)
        # The message claims exactly the finished shards there are (none: nothing to resume).
        done = len([n for n in os.listdir(partial) if n.endswith(".done.json")]) \
            if os.path.isdir(partial) else 0
        if done:
            assert lines[0] == (f"shardkit pack: interrupted; {done} finished shard"
                                f"{'s' if done != 1 else ''} kept in {partial} (rerun with "
                                "--resume to continue)"), lines
        else:
            assert lines[0] == ("shardkit pack: interrupted; no shard was finished, nothing to "
                                "resume"), lines
        if point == "starting workers":
            assert done == 0
    else:
        assert not os.path.lexists(partial)
        assert sorted(os.listdir(tmp_path)) == ["events", "release"]


# -- full disk ------------------------------------------------------------------------------------

def _mount_small(folder: str) -> tuple[bool, list[str] | None]:
    """Mount a 1 MiB tmpfs on ``folder`` (root), or find a prefix that runs a command with one
    mounted in a private namespace (``unshare -rm``); (mounted here, prefix or None)."""
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", folder],
                      capture_output=True).returncode == 0:
        return True, None
    script = f"mount -t tmpfs -o size=1m tmpfs {shlex.quote(folder)} && exec \"$@\""
    prefix = ["unshare", "-rm", "sh", "-c", script, "sh"]
    if shutil.which("unshare"):
        try:
            if subprocess.run(prefix + ["true"], capture_output=True, timeout=30).returncode == 0:
                return False, prefix
        except (OSError, subprocess.TimeoutExpired):
            pass
    return False, None


def _start_disk_driver(src: str, base, prefix: list[str], inject: bool) -> subprocess.Popen:
    """Start ``helpers.programs.disk_driver`` (under ``prefix``) on ``base/disk``."""
    small = str(base / "small")
    os.makedirs(os.path.join(small, "a"))
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(os.path.join(small, "a", "x.png"))
    cmd = prefix + [*program_cmd("disk_driver"), src, small, str(base / "disk"),
                    "1" if inject else "0"]
    return subprocess.Popen(cmd, env=program_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _disk_report(proc: subprocess.Popen) -> dict[str, dict]:
    """The driver's report, once it has finished."""
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    return json.loads(stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def disk_drivers(src, tmp_path_factory):
    """Both full-disk drivers, started together (each pack is mostly one busy process starting
    up): on a real 1 MiB tmpfs where one can be mounted (mounted here as root, or in a private
    user and mount namespace with ``unshare -rm``), and with writers that raise ENOSPC."""
    real = tmp_path_factory.mktemp("real-disk")
    disk = str(real / "disk")
    os.makedirs(disk)
    mounted, prefix = _mount_small(disk)
    drivers = {"mounted": mounted, "disk": disk, "real": None}
    injected = tmp_path_factory.mktemp("injected-disk")
    os.makedirs(injected / "disk")
    try:
        if mounted or prefix is not None:
            drivers["real"] = _start_disk_driver(src, real, prefix or [], inject=False)
        drivers["injected"] = _start_disk_driver(src, injected, [], inject=True)
        yield drivers
    finally:
        for key in ("real", "injected"):
            if drivers.get(key) is not None:
                drivers[key].kill()
                drivers[key].wait()
        if mounted:
            subprocess.run(["umount", disk], capture_output=True)


def _check_disk_report(report: dict[str, dict]) -> None:
    assert len(report) == 6  # 2 formats x (single file, 3 shards, --overwrite of a store)
    for key, r in report.items():
        if key.endswith("overwrite"):
            assert r["rc0"] == 0, r
            lines = [line for line in r["stderr"].splitlines() if line.strip()]
            assert r["rc"] == 1 and len(lines) == 1, r
            assert "No space left on device" in lines[0], r
            assert r["old_ok"] and r["old_records"] == 1, r  # the old store is untouched
            assert r["listing"] == ["old"], r
            continue
        lines = [line for line in r["stderr"].splitlines() if line.strip()]
        assert r["rc"] == 1 and len(lines) == 1, (key, r)
        assert "No space left on device" in lines[0], (key, r)
        assert "out" not in r["listing"], (key, r)
        assert not r["partial_opens"], (key, r)
        if "num-shards" in key:  # finished shards kept for --resume, if any (the message says)
            if r["done"]:
                assert f"{r['done']} finished shard" in lines[0] and "--resume" in lines[0], r
            else:
                assert "no shard was finished, nothing to resume" in lines[0], (key, r)
                assert "--resume" not in lines[0], (key, r)
        else:
            assert r["listing"] == [], (key, r)


def test_full_disk_on_a_real_small_filesystem(disk_drivers):
    """The filesystem really fills up: a 1 MiB tmpfs, mounted here (as root) or in a private
    user and mount namespace (``unshare -rm``)."""
    if disk_drivers["real"] is None:
        pytest.skip("cannot mount a 1 MiB tmpfs here (needs root or unprivileged user "
                    "namespaces); test_full_disk_injected_enospc runs the same checks with "
                    "writers that raise ENOSPC")
    if disk_drivers["mounted"]:  # the premise: this disk really is that small
        st = os.statvfs(disk_drivers["disk"])
        assert st.f_blocks * st.f_frsize == 1 << 20
    _check_disk_report(_disk_report(disk_drivers["real"]))


def test_full_disk_injected_enospc(disk_drivers):
    """No real filesystem fills up here: the format writers raise ENOSPC once 1 MiB is written,
    the only change (the rest of the pack, and every other write, is real)."""
    _check_disk_report(_disk_report(disk_drivers["injected"]))
