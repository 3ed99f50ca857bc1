"""Peak memory of a Dask pack, client and workers, per source (issue 28's target: <= ~45 bytes
a source on each; the plan in Python objects cost 328 on the client, 257 on each worker).

For each size N (default 20,000 and 200,000) the script writes an ImageFolder tree of N tiny
JPEGs (hard links of one 8x8 file: real files the packer opens, decodes and re-encodes, at no
disk cost), starts a real cluster on 127.0.0.1 (``dask scheduler`` + ``dask worker --nworkers
W --nthreads 1``, fresh for each run, so every high-water mark is that run's), and packs the tree
into shards of 1,000 sources from a separate client process (``shardkit.pack(engine='dask',
scheduler=...)``). Memory is each process's ``VmHWM`` (peak resident set, /proc/PID/status)
at the end of the pack. Bytes per source = (peak at the large N - peak at the small N) / (the
difference in N), extrapolated to 10^9 sources. Per shard: the same peak growth over the
difference in shards, and the client's growth while packing (its resident set sampled every
5 ms after ``startup_seconds``, over its value then: what it holds for the shards, apart from
the planning); ``--memory-only`` runs only these, ``--same-sources`` only these with the
smaller tree both times (the larger size's shard count: per shard alone). Throughput: the same pack with the local engine
and W encoding workers (the same cores), images/s of the encoding phase (PackResult's: both
engines import the packing code before it starts), and of the whole call;
the load average after each size (the machine may be shared).

Throughput is then measured again, ``--repeat`` rounds on each tree, in two shapes:

- **shared**: everything on the same cores, as a LocalCluster on one machine: three packs a
  round in rotating order, dask on workers as ``dask worker`` starts them, dask on workers with
  the packing settings (``QUIET_WORKERS`` as environment variables: the setting docs/cluster.md
  recommends, and the one shardkit's own LocalCluster uses), and the local engine;
- **workers' cores** (a cluster's shape: its scheduler and client run on a login node or their
  own pod, not on the workers' cores): the first CPU of this process's set runs the scheduler
  and the client, the others (``taskset``) run one ``dask worker`` process each, with the
  packing settings; the local engine runs on those same other CPUs with as many encoders.
  Two packs a round, alternating.

A fresh cluster for each dask pack, fresh stores; on two trees: the large N tiny images
(packing's fixed costs per image and per shard at their largest share: the worst case for a
cluster) and ``--photos`` photo-like images (:mod:`shardkit.bench.sample`, mean about 500x375,
resized to 256 as by default, shards of ``--photo-shard``): the median ratio of each is the
target's figure.

    python benchmarks/cluster_memory.py [--sizes 20000 200000] [--workers 2] [--repeat 5]
        [--photos 6000] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CLIENT = r"""
import json, os, sys, threading, time
from array import array
import shardkit
src, out, engine, scheduler, workers, shards, size = sys.argv[1:8]
# (seconds since the call, VmRSS kB), every 5 ms: the packing phase's own peak. In arrays
# allocated and written before the call (0.9 MiB, in every client peak): a list of samples
# grew the resident set 25 KB a second of packing, which a longer pack (more shards) counted
# as its own.
MOST = 120_000  # the first 10 minutes
times, kbs, taken = array("f", [0.0]) * MOST, array("i", [0]) * MOST, [0]
def rss():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmRSS")).split()[1])
def sample(stop=threading.Event()):
    while not stop.wait(0.005) and taken[0] < MOST:
        times[taken[0]], kbs[taken[0]] = time.perf_counter() - t0, rss()
        taken[0] += 1
    return stop
kw = dict(size=int(size), num_shards=int(shards), progress=False)
if engine == "dask":  # the cluster's workers pack
    kw.update(engine="dask", scheduler=scheduler)
else:
    kw.update(workers=int(workers))
t0 = time.perf_counter()
if engine == "dask":  # the local engine forks its encoders only with no other thread running
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
r = shardkit.pack(src, out, **kw)
samples = list(zip(times[:taken[0]], kbs[:taken[0]]))
at_start = [kb for t, kb in samples if t <= r.startup_seconds][-1:] or [0]
during = [kb for t, kb in samples if t > r.startup_seconds] or [0]
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"count": r.count, "seconds": r.seconds, "startup": r.startup_seconds,
                  "whole_images_per_second": r.count / r.seconds,
                  "images_per_second": r.count / max(1e-9, r.seconds - r.startup_seconds),
                  "client_hwm_kb": int(status["VmHWM"].split()[0]),
                  "client_packing_growth_kb": max(during) - at_start[0]}))
"""


def hwm_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1])


def tree(root: str, n: int, classes: int = 100) -> None:
    """``root/cNNN/iNNNNNNN.jpg``: ``n`` hard links of one 8x8 JPEG (a copy per class),
    ``classes`` classes."""
    import numpy as np
    from PIL import Image

    os.makedirs(root)
    one = os.path.join(root, "one.jpeg.src")
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(
        one, "JPEG", quality=90)
    for c in range(classes):  # one file per class to link to (a file takes 65,000 links at most)
        os.makedirs(os.path.join(root, f"c{c:03d}"))
        shutil.copy(one, os.path.join(root, f"c{c:03d}.src"))
    for i in range(n):
        c = i % classes
        os.link(os.path.join(root, f"c{c:03d}.src"), os.path.join(root, f"c{c:03d}", f"i{i:08d}.jpg"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dask_env(config: dict) -> dict[str, str]:
    """Dask config keys as the environment variables that set them in a ``dask worker``."""
    return {"DASK_" + key.upper().replace(".", "__").replace("-", "_"): str(value)
            for key, value in config.items()}


def packing_env() -> dict[str, str]:
    """The packing workers' recommended settings (docs/cluster.md) as environment variables."""
    from shardkit.packing.dask_engine import QUIET_WORKERS

    return dask_env(QUIET_WORKERS)


def pinned(cpus: list[int] | None) -> list[str]:
    """``taskset`` for ``cpus`` (nothing for None: any CPU)."""
    return [] if cpus is None else ["taskset", "-c", ",".join(map(str, cpus))]


@contextlib.contextmanager
def cluster(nworkers: int, env: dict[str, str] | None = None, worker_cpus: list[int] | None = None,
            scheduler_cpus: list[int] | None = None):
    """A ``dask scheduler`` and ``dask worker --nworkers N --nthreads 1`` on 127.0.0.1 (with
    ``env`` added to their environment; each on its CPUs if given): (address, the worker
    processes' pids)."""
    from dask.distributed import Client

    bindir = os.path.dirname(sys.executable)
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
             "start_new_session": True, "env": {**os.environ, **(env or {})}}
    procs = [subprocess.Popen(pinned(scheduler_cpus) + [
        os.path.join(bindir, "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
        "--no-dashboard"], **quiet)]
    try:
        procs.append(subprocess.Popen(pinned(worker_cpus) + [
                                      os.path.join(bindir, "dask"), "worker", address,
                                       "--nworkers", str(nworkers), "--nthreads", "1",
                                       "--no-dashboard", "--host", "127.0.0.1"], **quiet))
        for _ in range(600):
            try:
                with Client(address, timeout=5) as client:
                    client.wait_for_workers(nworkers, timeout=120)
                    pids = list(client.run(os.getpid).values())
                break
            except OSError:
                time.sleep(0.2)
        yield address, pids
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)


def run(src: str, out: str, engine: str, scheduler: str, workers: int, shards: int,
        size: int = 8, cpus: list[int] | None = None) -> dict:
    proc = subprocess.run(pinned(cpus) + [sys.executable, "-c", CLIENT, src, out, engine,
                                          scheduler, str(workers), str(shards), str(size)],
                          capture_output=True, text=True)
    subprocess.run(["rm", "-rf", out], check=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.splitlines()[-1])


def alternate(src: str, tmp: str, kinds: dict[str, dict[str, str] | None], workers: int,
              shards: int, size: int, repeat: int, worker_cpus: list[int] | None = None,
              control_cpus: list[int] | None = None) -> list[tuple[float, ...]]:
    """``repeat`` rounds of one pack of ``src`` per kind, the order rotating from round to round
    (two kinds: alternating): each one's encoding-phase images/s, in ``kinds``' order. A kind is
    the Dask workers' added environment (``{}``: as ``dask worker`` starts them), or None for
    the local engine. ``workers`` worker processes or encoders, on ``worker_cpus``; the
    scheduler and the client on ``control_cpus`` (None: any CPU). A fresh cluster for each dask
    pack, running only during it (idle, its processes still take CPU)."""
    names = list(kinds)
    rounds = []
    for r in range(repeat):
        got = {}
        for kind in names[r % len(names):] + names[:r % len(names)]:
            out = os.path.join(tmp, f"{kind}-r{r}")
            env = kinds[kind]
            if env is None:
                got[kind] = run(src, out, "local", "", workers, shards, size, worker_cpus)
                continue
            with cluster(workers, env, worker_cpus, control_cpus) as (address, _):
                got[kind] = run(src, out, "dask", address, workers, shards, size, control_cpus)
        rounds.append(tuple(got[k]["images_per_second"] for k in names))
    return rounds


def shared(src: str, tmp: str, shards: int, size: int,
           args: argparse.Namespace) -> list[tuple[float, ...]]:
    """The shared cores rounds: (dask as started by default, dask with the packing settings,
    local) images/s, ``args.workers`` of each."""
    return alternate(src, tmp, {"dask": {}, "quiet": packing_env(), "local": None},
                     args.workers, shards, size, args.repeat)


def ratios_line(label: str, ratios: list[float]) -> str:
    ratios = sorted(ratios)
    return (f"  dask/local, {label}: ratios {', '.join(f'{x:.2f}' for x in ratios)}; "
            f"median {statistics.median(ratios):.2f} (target >= 0.9)")


def describe(name: str, rounds: list[tuple[float, ...]],
             cluster_shape: tuple[list[tuple[float, ...]], int] | None) -> str:
    lines = [f"{name}, shared cores: dask (default workers) / dask (packing settings) / local "
             "img/s " + ", ".join(f"{d:.0f}/{n:.0f}/{loc:.0f}" for d, n, loc in rounds)]
    for label, i in (("default workers", 0), ("packing settings", 1)):
        lines.append(ratios_line(f"shared, {label}", [r[i] / max(1e-9, r[2]) for r in rounds]))
    if cluster_shape:
        pairs, workers = cluster_shape
        lines.append(f"{name}, workers' cores ({workers} for the workers or the local engine's "
                     "encoders, 1 for the scheduler and client): dask (packing settings) / local "
                     "img/s " + ", ".join(f"{d:.0f}/{loc:.0f}" for d, loc in pairs))
        lines.append(ratios_line("workers' cores", [d / max(1e-9, loc) for d, loc in pairs]))
    lines[-1] += f"; load {os.getloadavg()[0]:.2f}"
    return "\n".join(lines)


def shape(src: str, tmp: str, shards: int, size: int,
          args: argparse.Namespace) -> tuple[list[tuple[float, ...]], int] | None:
    """The workers' cores rounds, unless skipped or there is a single CPU: the scheduler and
    the client on the first CPU of this process's set, one worker process (packing settings) on
    each other CPU, against the local engine with as many encoders on those other CPUs:
    ([(dask, local) images/s], workers)."""
    cpus = sorted(os.sched_getaffinity(0))
    if args.no_cluster_shape or len(cpus) < 2:
        return None
    control, workers = cpus[:1], cpus[1:]
    return alternate(src, tmp, {"quiet": packing_env(), "local": None}, len(workers), shards,
                     size, args.repeat, workers, control), len(workers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs=2, default=[20_000, 200_000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--same-sources", action="store_true",
                    help="the memory runs only, both on the smaller tree: the shards' counts "
                         "of the two sizes, the sources the same (per shard only)")
    ap.add_argument("--memory-only", action="store_true",
                    help="only the memory runs: no local engine packs, no throughput rounds")
    ap.add_argument("--repeat", type=int, default=5,
                    help="rounds of alternating throughput runs (dask default, dask with the "
                         "packing settings, local; then the workers' cores shape) on each tree "
                         "(0: none)")
    ap.add_argument("--no-cluster-shape", action="store_true",
                    help="skip the rounds with the scheduler and client on a CPU of their own")
    ap.add_argument("--photos", type=int, default=6000,
                    help="photo-like images for the throughput runs (0: none)")
    ap.add_argument("--photo-shard", type=int, default=200, help="photos per shard")
    ap.add_argument("--tmp", default=None, help="where the trees and stores go")
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args()
    args.memory_only = args.memory_only or args.same_sources
    lines = [f"# python {' '.join(shlex.quote(a) for a in sys.argv)}",
             f"# {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at start; "
             f"{time.strftime('%Y-%m-%d %H:%M')}"]
    rows = {}
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="cluster-memory-") as tmp:
        for n in args.sizes:
            src = os.path.join(tmp, f"src{n}")
            tree(src, args.sizes[0] if args.same_sources else n)
            shards = max(2, n // args.per_shard)
            with cluster(args.workers) as (address, pids):
                got = run(src, os.path.join(tmp, f"dask{n}"), "dask", address, args.workers,
                          shards)
                got["worker_hwm_kb"] = [hwm_kb(p) for p in pids]
            got["shards"] = shards
            rows[n] = got
            line = (f"N={args.sizes[0] if args.same_sources else n:>9,}: client peak {got['client_hwm_kb'] / 1024:7.1f} MiB (while "
                    f"packing +{got['client_packing_growth_kb'] / 1024:.2f} MiB over its start), "
                    f"workers {[round(k / 1024, 1) for k in got['worker_hwm_kb']]} MiB; "
                    f"{shards} shards")
            if args.memory_only:
                lines.append(line + f"; load {os.getloadavg()[0]:.2f}")
                subprocess.run(["rm", "-rf", src], check=True)
                continue
            local = run(src, os.path.join(tmp, f"local{n}"), "local", "", args.workers, shards)
            got["local_images_per_second"] = local["images_per_second"]
            got["local_whole_images_per_second"] = local["whole_images_per_second"]
            lines.append(f"{line}; "
                         f"dask {got['images_per_second']:7.0f} img/s, local "
                         f"{local['images_per_second']:7.0f} img/s (ratio "
                         f"{got['images_per_second'] / local['images_per_second']:.2f}; whole "
                         f"call {got['whole_images_per_second']:.0f} vs "
                         f"{local['whole_images_per_second']:.0f}); {got['count']} records; "
                         f"load {os.getloadavg()[0]:.2f}")
            if n == args.sizes[1] and args.repeat:
                tiny = shared(src, tmp, shards, 8, args)
                tiny_shape = shape(src, tmp, shards, 8, args)
            subprocess.run(["rm", "-rf", src], check=True)
        if args.photos and args.repeat and not args.memory_only:
            from shardkit.bench.sample import make_sample

            src = os.path.join(tmp, "photos")
            make_sample(src, args.photos, classes=10)
            shards = max(2, args.photos // args.photo_shard)
            photos = shared(src, tmp, shards, 256, args)
            photos_shape = shape(src, tmp, shards, 256, args)
    small, large = args.sizes
    dn = large - small
    client = (rows[large]["client_hwm_kb"] - rows[small]["client_hwm_kb"]) * 1024 / dn
    worker = max(b - a for a, b in zip(rows[small]["worker_hwm_kb"],
                                       rows[large]["worker_hwm_kb"])) * 1024 / dn
    if not args.same_sources:
        lines.append(f"bytes per source (peak growth {small:,} -> {large:,}): client "
                     f"{client:.1f}, worst worker {worker:.1f} (target <= ~45; before: 328 and "
                     "257)")
        lines.append(f"extrapolated to 10^9 sources: client +{client * 1e9 / 2**30:.1f} GiB, "
                     f"each worker +{worker * 1e9 / 2**30:.1f} GiB")
    ds = rows[large]["shards"] - rows[small]["shards"]
    packing = (rows[large]["client_packing_growth_kb"] -
               rows[small]["client_packing_growth_kb"]) * 1024 / ds
    lines.append(f"client bytes per shard ({rows[small]['shards']:,} -> "
                 f"{rows[large]['shards']:,} shards): peak {client * dn / ds:.0f}, while packing "
                 f"{packing:.0f} (target <= 1,024)")
    if args.memory_only:
        print("\n".join(lines))
        return
    lines.append(f"throughput dask/local at N={large:,} (the memory runs): "
                 f"{rows[large]['images_per_second'] / rows[large]['local_images_per_second']:.2f}")
    if args.repeat:
        lines.append(describe(f"{large:,} tiny images (8x8 -> 8), {large // args.per_shard} "
                              f"shards, {args.repeat} rounds", tiny, tiny_shape))
    if args.photos and args.repeat:
        lines.append(describe(f"{args.photos:,} photo-like images (-> 256), {shards} shards, "
                              f"{args.repeat} rounds", photos, photos_shape))
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
