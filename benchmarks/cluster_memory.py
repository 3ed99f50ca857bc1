"""Peak memory of a Dask pack, client and workers, per source (issue 28's target: <= ~45 bytes
a source on each; the plan in Python objects cost 328 on the client, 257 on each worker).

For each size N (default 20,000 and 200,000) the script writes an ImageFolder tree of N tiny
JPEGs (hard links of one 8x8 file: real files the packer opens, decodes and re-encodes, at no
disk cost), starts a real cluster on 127.0.0.1 (``dask scheduler`` + ``dask worker --nworkers
W --nthreads 1``, fresh for each run, so every high-water mark is that run's), and packs the tree
into shards of 1,000 sources from a separate client process (``shardkit.pack(engine='dask',
scheduler=...)``). Memory is each process's ``VmHWM`` (peak resident set, /proc/PID/status)
at the end of the pack. Bytes per source = (peak at the large N - peak at the small N) / (the
difference in N), extrapolated to 10^9 sources. Throughput: the same pack with the local engine
and W encoding workers (the same cores), images/s of the encoding phase (PackResult's: both
engines import the packing code before it starts), and of the whole call;
the load average after each size (the machine may be shared).

Throughput is then measured again, ``--repeat`` rounds on each tree, three packs a round in
rotating order: dask on workers as ``dask worker`` starts them, dask on workers with the
profiler off (``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False``, the setting docs/cluster.md
recommends for packing workers, and the one shardkit's own LocalCluster uses), and the local
engine (a fresh cluster for each dask pack, fresh stores), on two trees: the large N tiny images
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
import json, os, sys, time
import shardkit
src, out, engine, scheduler, workers, shards, size = sys.argv[1:8]
kw = dict(size=int(size), num_shards=int(shards), progress=False, workers=int(workers))
if engine == "dask":
    kw.update(engine="dask", scheduler=scheduler)
t0 = time.perf_counter()
r = shardkit.pack(src, out, **kw)
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"count": r.count, "seconds": r.seconds, "startup": r.startup_seconds,
                  "whole_images_per_second": r.count / r.seconds,
                  "images_per_second": r.count / max(1e-9, r.seconds - r.startup_seconds),
                  "client_hwm_kb": int(status["VmHWM"].split()[0])}))
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


#: The packing workers' recommended setting (docs/cluster.md): Dask's statistical profiler off.
NO_PROFILER = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False"}
#: A throughput round's packs: dask on default workers, on workers without the profiler, local.
KINDS = ("dask", "noprof", "local")


@contextlib.contextmanager
def cluster(nworkers: int, env: dict[str, str] | None = None):
    """A ``dask scheduler`` and ``dask worker --nworkers N --nthreads 1`` on 127.0.0.1 (with
    ``env`` added to their environment): (address, the worker processes' pids)."""
    from dask.distributed import Client

    bindir = os.path.dirname(sys.executable)
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
             "start_new_session": True, "env": {**os.environ, **(env or {})}}
    procs = [subprocess.Popen([os.path.join(bindir, "dask"), "scheduler", "--host", "127.0.0.1",
                               "--port", str(port), "--no-dashboard"], **quiet)]
    try:
        procs.append(subprocess.Popen([os.path.join(bindir, "dask"), "worker", address,
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
        size: int = 8) -> dict:
    proc = subprocess.run([sys.executable, "-c", CLIENT, src, out, engine, scheduler,
                           str(workers), str(shards), str(size)], capture_output=True, text=True)
    subprocess.run(["rm", "-rf", out], check=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    return json.loads(proc.stdout.splitlines()[-1])


def alternate(src: str, tmp: str, workers: int, shards: int, size: int,
              repeat: int) -> list[tuple[float, float, float]]:
    """``repeat`` rounds of three packs of ``src`` (dask workers as started by default, dask
    workers without the profiler, the local engine; the order rotates from round to round):
    each one's encoding-phase images/s. A fresh cluster for each dask pack, running only
    during it (idle, its processes still take CPU)."""
    rounds = []
    for r in range(repeat):
        got = {}
        for kind in KINDS[r % 3:] + KINDS[:r % 3]:
            out = os.path.join(tmp, f"{kind}-r{r}")
            if kind == "local":
                got[kind] = run(src, out, "local", "", workers, shards, size)
                continue
            with cluster(workers, NO_PROFILER if kind == "noprof" else None) as (address, _):
                got[kind] = run(src, out, "dask", address, workers, shards, size)
        rounds.append(tuple(got[k]["images_per_second"] for k in KINDS))
    return rounds


def describe(name: str, rounds: list[tuple[float, float, float]]) -> str:
    lines = [f"{name}: dask (default workers) / dask (profiler off) / local img/s "
             + ", ".join(f"{d:.0f}/{n:.0f}/{loc:.0f}" for d, n, loc in rounds)]
    for label, i in (("default workers", 0), ("profiler off", 1)):
        ratios = sorted(r[i] / max(1e-9, r[2]) for r in rounds)
        lines.append(f"  dask/local, {label}: ratios {', '.join(f'{x:.2f}' for x in ratios)}; "
                     f"median {statistics.median(ratios):.2f} (target >= 0.9)")
    lines[-1] += f"; load {os.getloadavg()[0]:.2f}"
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs=2, default=[20_000, 200_000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--per-shard", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5,
                    help="rounds of alternating throughput runs (dask default, dask without "
                         "the profiler, local) on each tree (0: none)")
    ap.add_argument("--photos", type=int, default=6000,
                    help="photo-like images for the throughput runs (0: none)")
    ap.add_argument("--photo-shard", type=int, default=200, help="photos per shard")
    ap.add_argument("--tmp", default=None, help="where the trees and stores go")
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args()
    lines = [f"# python {' '.join(shlex.quote(a) for a in sys.argv)}",
             f"# {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} at start; "
             f"{time.strftime('%Y-%m-%d %H:%M')}"]
    rows = {}
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="cluster-memory-") as tmp:
        for n in args.sizes:
            src = os.path.join(tmp, f"src{n}")
            tree(src, n)
            shards = max(2, n // args.per_shard)
            with cluster(args.workers) as (address, pids):
                got = run(src, os.path.join(tmp, f"dask{n}"), "dask", address, args.workers,
                          shards)
                got["worker_hwm_kb"] = [hwm_kb(p) for p in pids]
            local = run(src, os.path.join(tmp, f"local{n}"), "local", "", args.workers, shards)
            got["local_images_per_second"] = local["images_per_second"]
            got["local_whole_images_per_second"] = local["whole_images_per_second"]
            rows[n] = got
            lines.append(f"N={n:>9,}: client peak {got['client_hwm_kb'] / 1024:7.1f} MiB, "
                         f"workers {[round(k / 1024, 1) for k in got['worker_hwm_kb']]} MiB; "
                         f"dask {got['images_per_second']:7.0f} img/s, local "
                         f"{local['images_per_second']:7.0f} img/s (ratio "
                         f"{got['images_per_second'] / local['images_per_second']:.2f}; whole "
                         f"call {got['whole_images_per_second']:.0f} vs "
                         f"{local['whole_images_per_second']:.0f}); {got['count']} records, "
                         f"{shards} shards; load {os.getloadavg()[0]:.2f}")
            if n == args.sizes[1] and args.repeat:
                tiny = alternate(src, tmp, args.workers, shards, 8, args.repeat)
            subprocess.run(["rm", "-rf", src], check=True)
        if args.photos and args.repeat:
            from shardkit.bench.sample import make_sample

            src = os.path.join(tmp, "photos")
            make_sample(src, args.photos, classes=10)
            shards = max(2, args.photos // args.photo_shard)
            photos = alternate(src, tmp, args.workers, shards, 256, args.repeat)
    small, large = args.sizes
    dn = large - small
    client = (rows[large]["client_hwm_kb"] - rows[small]["client_hwm_kb"]) * 1024 / dn
    worker = max(b - a for a, b in zip(rows[small]["worker_hwm_kb"],
                                       rows[large]["worker_hwm_kb"])) * 1024 / dn
    lines.append(f"bytes per source (peak growth {small:,} -> {large:,}): client {client:.1f}, "
                 f"worst worker {worker:.1f} (target <= ~45; before: 328 and 257)")
    lines.append(f"extrapolated to 10^9 sources: client +{client * 1e9 / 2**30:.1f} GiB, each "
                 f"worker +{worker * 1e9 / 2**30:.1f} GiB")
    lines.append(f"throughput dask/local at N={large:,} (the memory runs): "
                 f"{rows[large]['images_per_second'] / rows[large]['local_images_per_second']:.2f}")
    if args.repeat:
        lines.append(describe(f"{large:,} tiny images (8x8 -> 8), {large // args.per_shard} "
                              f"shards, {args.repeat} rounds", tiny))
    if args.photos and args.repeat:
        lines.append(describe(f"{args.photos:,} photo-like images (-> 256), {shards} shards, "
                              f"{args.repeat} rounds", photos))
    report = "\n".join(lines)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


if __name__ == "__main__":
    main()
