"""Killed and interrupted packs, and a full disk: never a store that looks complete but is not.

* SIGKILL ``shardkit pack`` at random moments (both formats, one file and three shards): no
  output that ``ShardDataset`` or ``shardkit verify`` accepts unless it is the complete store, the
  pool workers die with it, and a rerun (``--resume`` for most sharded trials, reusing the shards
  that were finished) succeeds, leaves no temporary file, and yields the same store.
* SIGINT (Ctrl-C, sent to the whole process group as a terminal does): exit status 130 within a
  few seconds, one line on stderr, every child process gone, no OUT.
* A full disk (a 1 MiB tmpfs when this machine lets us mount one, else a writer that fails
  with ENOSPC): exit status 1, one clear line, no OUT, and an existing OUT left intact.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
from PIL import Image

from shardkit.errors import StoreError
from shardkit.packer import partial_path
from shardkit.store import Store

TRIALS_PER_CONFIG = int(os.environ.get("SHARDKIT_KILL_TRIALS", "5"))
SEED = int(os.environ.get("SHARDKIT_KILL_SEED", "7"))
CONFIGS = [("lmdb", None), ("hdf5", None), ("lmdb", 3), ("hdf5", 3)]

CHECK = textwrap.dedent(r'''
    import contextlib, hashlib, io, json, sys
    import numpy as np
    from shardkit import ShardDataset, ShardkitError
    from shardkit.cli import main as cli_main
    for line in sys.stdin:
        path = line.rstrip("\n")
        res = {"path": path}
        try:
            ds = ShardDataset(path, output="numpy", verify=True)
            h = hashlib.sha256(json.dumps([ds.classes, [int(t) for t in ds.targets]]).encode())
            for i in range(len(ds)):
                img, label = ds[i]
                h.update(np.ascontiguousarray(img).tobytes() + str(int(label)).encode())
            res["digest"] = h.hexdigest()
            ds.close()
        except ShardkitError as exc:
            res["error"] = str(exc)[:300]
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            res["verify_rc"] = cli_main(["verify", "--quiet", path])
        print(json.dumps(res), flush=True)
''')


def check_stores(paths: list[str], tmp: str) -> dict[str, dict]:
    """Open and fully read each store in one child process (which must not die)."""
    script = os.path.join(tmp, "check.py")
    with open(script, "w") as f:
        f.write(CHECK)
    proc = subprocess.run([sys.executable, script], input="\n".join(paths) + "\n",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    return {r["path"]: r for r in results}


def pack_cmd(src: str, out: str, fmt: str, shards: int | None, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "shardkit.cli", "pack", src, out, "--format", fmt,
           "--size", "64", "--workers", "2", "--quiet", *extra]
    return cmd + (["--num-shards", str(shards)] if shards else [])


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    """30 photo-sized JPEGs (800x600) in 3 classes: packing takes long enough to interrupt."""
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


def _descendants(pid: int) -> set[psutil.Process]:
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return set()


def _alive(procs: set[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie has exited; only its parent has not collected it yet)."""
    out = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _gone(procs: set[psutil.Process], timeout: float) -> list[psutil.Process]:
    """The processes still alive after ``timeout`` seconds (then killed, so tests can go on)."""
    deadline = time.monotonic() + timeout
    while _alive(procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    alive = _alive(procs)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return alive


def _leftovers(folder: str, keep: str) -> list[str]:
    """Everything in ``folder`` (and in the store folder ``keep``) that is not part of a store."""
    extra = [n for n in os.listdir(folder) if n != keep]
    store = os.path.join(folder, keep)
    if os.path.isdir(store):
        extra += [f"{keep}/{n}" for n in os.listdir(store)
                  if not (n == "manifest.json" or n.startswith("shard-") and
                          n.endswith((".lmdb", ".h5")) or n.startswith("labels"))]
    return extra


@pytest.mark.slow
def test_sigkill_at_random_moments_then_rerun(src, tmp_path):
    rng = random.Random(SEED)
    # Reference stores, and when a pack starts writing / ends (to spread the kills over it).
    ref_paths, timing = {}, {}
    for fmt, shards in CONFIGS:
        out = str(tmp_path / "ref" / f"{fmt}-{shards}")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(pack_cmd(src, out, fmt, shards), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        started = None
        while proc.poll() is None:
            if started is None and os.path.lexists(partial_path(out)):
                started = time.monotonic() - t0
            time.sleep(0.005)
        assert proc.returncode == 0
        total = time.monotonic() - t0
        timing[fmt, shards] = (started or total / 2, total)
        ref_paths[fmt, shards] = out

    snapshots: list[tuple[str, tuple, str]] = []  # (copied path, config, what it was)
    finals: list[tuple[str, tuple]] = []
    failures: list[str] = []
    reused = resumed = 0
    phases = {"before partial": 0, "while packing": 0, "after OUT": 0}
    n = 0
    for fmt, shards in CONFIGS:
        for t in range(TRIALS_PER_CONFIG):
            n += 1
            trial = tmp_path / f"trial{n:02d}"
            trial.mkdir()
            out = str(trial / ("out" if shards else f"out.{fmt}"))
            partial = partial_path(out)
            started, total = timing[fmt, shards]
            # When to kill: mostly at a random moment while the pack writes; sometimes during
            # start-up; once per sharded config just after the first shard is finished.
            if shards and t == 0:
                ready = lambda: os.path.isdir(partial) and any(  # noqa: E731
                    n.endswith(".done.json") for n in os.listdir(partial))
                delay = rng.uniform(0, 0.05)
            elif rng.random() < 0.15:
                ready, delay = (lambda: True), rng.uniform(0, started)
            else:
                ready = lambda: os.path.lexists(partial)  # noqa: E731
                delay = rng.uniform(0, (total - started) * 1.15)
            proc = subprocess.Popen(pack_cmd(src, out, fmt, shards), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            seen: set[psutil.Process] = set()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None and not ready():
                seen |= _descendants(proc.pid)
                time.sleep(0.002)
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and proc.poll() is None:
                seen |= _descendants(proc.pid)
                time.sleep(0.005)
            seen |= _descendants(proc.pid)
            proc.send_signal(signal.SIGKILL)  # the main process only, as `kill -9 PID`
            proc.wait(timeout=30)
            phase = ("after OUT" if os.path.lexists(out) else
                     "while packing" if os.path.lexists(partial) else "before partial")
            phases[phase] += 1
            orphans = _gone(seen, timeout=15)
            if orphans:
                failures.append(f"trial {n}: {len(orphans)} worker processes outlived the "
                                "killed pack by 15 s")
            # Keep what the kill left, to read later: it must be refused, or be the full store.
            for what, path in (("OUT", out), ("partial", partial)):
                if os.path.lexists(path):
                    snap = str(trial / f"snapshot-{what}")
                    (shutil.copytree if os.path.isdir(path) else shutil.copyfile)(path, snap)
                    snapshots.append((snap, (fmt, shards), what))
            # Rerun: resume most sharded trials; shards recorded as finished must be reused.
            resume = bool(shards) and (t == 0 or rng.random() < 0.7)
            finished = {}
            if resume and os.path.isdir(partial):
                for name in os.listdir(partial):
                    if name.endswith(".done.json"):
                        with open(os.path.join(partial, name)) as f:
                            entry = json.load(f)
                        shard = os.path.join(partial, entry["file"])
                        if os.path.exists(shard):
                            finished[entry["sha256"]] = os.stat(shard).st_ino
            extra = (["--resume"] if resume else []) + (["--overwrite"] if os.path.lexists(out) else [])
            rerun = subprocess.run(pack_cmd(src, out, fmt, shards, *extra), capture_output=True,
                                   text=True, timeout=300)
            resumed += resume
            if rerun.returncode != 0:
                failures.append(f"trial {n} ({fmt}, {shards}, {phase}): rerun failed: "
                                f"{rerun.stderr[-500:]}")
                continue
            left = _leftovers(str(trial), os.path.basename(out))
            left = [x for x in left if not x.startswith("snapshot-")]
            if left:
                failures.append(f"trial {n} ({fmt}, {shards}, {phase}): left behind {left}")
            if finished:
                with open(os.path.join(out, "manifest.json")) as f:
                    manifest = json.load(f)
                inodes = {e["sha256"]: os.stat(os.path.join(out, e["file"])).st_ino
                          for e in manifest["shards"]}
                for sha, ino in finished.items():
                    if inodes.get(sha) != ino:
                        failures.append(f"trial {n}: --resume repacked a finished shard")
                    reused += 1
            finals.append((out, (fmt, shards)))

    results = check_stores([p for p in ref_paths.values()] + [s for s, _, _ in snapshots]
                           + [f for f, _ in finals], str(tmp_path))
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
    print(f"SIGKILL trials: {n}, kill moments {phases}, resumed {resumed}, "
          f"finished shards reused {reused}, snapshots read {len(snapshots)}, "
          f"failures {len(failures)}")
    assert n >= 20
    assert phases["while packing"] >= 5  # the kills did land mid-pack
    assert reused >= 1  # and --resume kept finished shards
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("fmt,shards", [("lmdb", None), ("hdf5", 3)])
def test_ctrl_c_stops_workers_promptly(src, tmp_path, fmt, shards):
    """Ctrl-C at several moments: as the pool starts, and while it packs."""
    interrupted = 0
    for delay in (0.0, 0.03, 0.1, 0.4):
        folder = tmp_path / f"delay{delay}"
        folder.mkdir()
        out = str(folder / ("out" if shards else f"out.{fmt}"))
        partial = partial_path(out)
        proc = subprocess.Popen(pack_cmd(src, out, fmt, shards), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        seen: set[psutil.Process] = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and \
                not os.path.lexists(partial):
            seen |= _descendants(proc.pid)
            time.sleep(0.002)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and proc.poll() is None:
            seen |= _descendants(proc.pid)
            time.sleep(0.002)
        assert proc.poll() is None, "pack finished before it could be interrupted"
        seen |= _descendants(proc.pid)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, stderr = proc.communicate(timeout=30)
        elapsed = time.monotonic() - t0
        if proc.returncode != 130 and stderr.startswith("packed ") and os.path.exists(out):
            # The pack finished between the last poll and the signal: OUT must be complete.
            Store(out)
            continue
        interrupted += 1
        assert proc.returncode == 130, (delay, stderr)
        assert elapsed < 5, f"took {elapsed:.1f} s to stop"
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "interrupted" in lines[0] and "Traceback" not in stderr, \
            (delay, stderr)
        alive = _gone(seen | _descendants(proc.pid), timeout=5)
        assert not alive, f"{len(alive)} child processes still running after Ctrl-C"
        assert not os.path.lexists(out)
        assert lines[0].startswith("shardkit pack: interrupted"), lines
        if shards:  # finished shards are kept for --resume, but nothing there opens as a store
            if os.path.lexists(partial):
                with pytest.raises(StoreError):
                    Store(partial)
        else:
            assert not os.path.lexists(partial)
            assert os.listdir(folder) == []
    assert interrupted >= 3, f"only {interrupted} of 4 packs were still running at the signal"


# -- full disk ------------------------------------------------------------------------------------

DISK_DRIVER = textwrap.dedent(r'''
    """Runs inside the small filesystem (or with an ENOSPC writer): packs, reports as JSON."""
    import json, os, subprocess, sys
    big, small, disk, inject = sys.argv[1:5]
    prefix = [sys.executable, "-c", INJECT] if inject == "1" else [sys.executable, "-m", "shardkit.cli"]
    report = {}

    def pack(src, out, fmt, *extra):
        cmd = prefix + ["pack", src, out, "--format", fmt, "--size", "0", "--encoding", "raw",
                        "--workers", "2", "-q", *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return p.returncode, p.stderr

    def listing():
        return sorted(os.listdir(disk))

    from shardkit import ShardkitError
    from shardkit.inspection import verify
    for fmt in ("lmdb", "hdf5"):
        for shards in ([], ["--num-shards", "3"]):
            out = os.path.join(disk, "out")
            rc, err = pack(big, out, fmt, *shards)
            partial = os.path.join(disk, ".out.partial")
            try:
                from shardkit import ShardDataset
                ShardDataset(partial)
                partial_opens = True
            except ShardkitError:
                partial_opens = False
            report[f"{fmt}{shards}"] = {"rc": rc, "stderr": err, "listing": listing(),
                                        "partial_opens": partial_opens}
            subprocess.run(["rm", "-rf", out, partial])
        # An existing store survives a failed --overwrite.
        rc0, err0 = pack(small, os.path.join(disk, "old"), fmt)
        rc, err = pack(big, os.path.join(disk, "old"), fmt, "--overwrite")
        rep = verify(os.path.join(disk, "old"))
        report[f"{fmt}-overwrite"] = {"rc0": rc0, "err0": err0, "rc": rc, "stderr": err,
                                      "old_ok": rep.ok, "old_records": rep.records,
                                      "listing": listing()}
        subprocess.run(["rm", "-rf", os.path.join(disk, "old")])
    print(json.dumps(report))
''')

# A writer that fails like a full disk once ~1 MiB is written: the fallback where no small
# filesystem can be mounted. It patches the format writers' append, nothing else.
INJECT = textwrap.dedent(r'''
    import errno, sys
    from shardkit.formats import base, WRITERS
    LIMIT = 1 << 20
    for cls in WRITERS.values():
        def make(orig):
            def append(self, data):
                self._written = getattr(self, "_written", 0) + len(data)
                if self._written > LIMIT:
                    raise OSError(errno.ENOSPC, "No space left on device")
                return orig(self, data)
            return append
        cls.append = make(cls.append)
    from shardkit.cli import main
    sys.argv[0] = "shardkit"
    sys.exit(main(sys.argv[1:]))
''')


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


def test_full_disk_fails_cleanly(src, tmp_path):
    small = str(tmp_path / "small")
    os.makedirs(os.path.join(small, "a"))
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(os.path.join(small, "a", "x.png"))
    disk = str(tmp_path / "disk")
    os.makedirs(disk)
    driver = str(tmp_path / "driver.py")
    with open(driver, "w") as f:
        f.write(f"INJECT = {INJECT!r}\n" + DISK_DRIVER)
    mounted, prefix = (False, None) if os.environ.get("SHARDKIT_TEST_NO_MOUNT") \
        else _mount_small(disk)
    try:
        inject = "0" if mounted or prefix else "1"
        cmd = (prefix or []) + [sys.executable, driver, src, small, disk, inject]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    finally:
        if mounted:
            subprocess.run(["umount", disk], capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    print("full disk via", "an ENOSPC-raising writer" if inject == "1" else "a 1 MiB tmpfs")
    for key, r in report.items():
        if key.endswith("overwrite"):
            assert r["rc0"] == 0, r
            assert r["rc"] == 1 and "No space left on device" in r["stderr"], r
            assert r["old_ok"] and r["old_records"] == 1, r  # the old store is untouched
            assert r["listing"] == ["old"], r
            continue
        lines = [line for line in r["stderr"].splitlines() if line.strip()]
        assert r["rc"] == 1 and len(lines) == 1, (key, r)
        assert "No space left on device" in lines[0], (key, r)
        assert "out" not in r["listing"], (key, r)
        assert not r["partial_opens"], (key, r)
        if "num-shards" in key:  # finished shards kept for --resume (the message says so)
            assert "--resume" in lines[0], (key, r)
        else:
            assert r["listing"] == [], (key, r)
    assert errno.ENOSPC  # the errno the messages stand for
