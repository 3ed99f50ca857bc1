#!/usr/bin/env python
"""A lost Dask worker costs time, not the pack: the same store, and how much time it costs.

    python benchmarks/cluster_failures.py                          # 100,000 sources, 200 shards
    python benchmarks/cluster_failures.py --sources 5000 --shards 20 --out /tmp/cf.txt

On a real cluster on 127.0.0.1 (``dask scheduler`` and ``dask worker --nworkers 2 --nthreads 1``
as separate processes: ``tests/helpers/dask_cluster.py``), a folder of ``--sources`` tiny JPEGs
(``--classes`` classes; written once into ``--src-dir``) is packed three times:

1. by the local engine (``--workers`` encoding processes): the reference store;
2. on the cluster, undisturbed;
3. on the cluster, with one worker process SIGKILLed once half the shards are finished (the
   worker is busy packing a shard then: its work on that shard is lost, Dask runs the shard again
   on the other worker, and the nanny starts a new worker process meanwhile).

Both cluster stores must be byte-identical to the reference (every file); the pack with the
kill must exit normally. Reported: each run's seconds and images/s, and the kill's cost (run 3
minus run 2). The cluster runs time ``shardkit.pack`` from the call to its return (listing and
planning included: the same in both).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))  # helpers.dask_cluster
sys.path.insert(0, HERE)  # reports
sys.path.append(REPO)  # shardkit from a source checkout that is not installed


def make_source(root: str, sources: int, classes: int) -> None:
    """``root/c<k>/<i>.jpg``: ``sources`` distinct 16x16 JPEGs (written once; reused after)."""
    import numpy as np
    from PIL import Image
    import io

    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        with open(done) as f:
            if f.read() == f"{sources} {classes}":
                return
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    for k in range(classes):
        os.makedirs(os.path.join(root, f"c{k:03d}"))
    for i in range(sources):
        img = base.copy()
        img[0, :4] = np.frombuffer(i.to_bytes(12, "little"), np.uint8).reshape(4, 3)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        with open(os.path.join(root, f"c{i % classes:03d}", f"{i:07d}.jpg"), "wb") as f:
            f.write(buf.getvalue())
    with open(done, "w") as f:
        f.write(f"{sources} {classes}")


def digests(store: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(store)):
        with open(os.path.join(store, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2,
                        help="local engine processes, and Dask worker processes")
    parser.add_argument("--src-dir", default=os.path.join(tempfile.gettempdir(),
                                                          "shardkit-cluster-failures-src"))
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()

    import shardkit
    from distributed import Client
    from helpers.dask_cluster import dask_cluster
    from reports import command_line, emit

    command = command_line()
    print(f"$ {command}", flush=True)
    t = time.perf_counter()
    make_source(args.src_dir, args.sources, args.classes)
    print(f"source folder ready in {time.perf_counter() - t:.0f} s: {args.src_dir}", flush=True)
    options = dict(num_shards=args.shards, size=args.size, progress=False)
    work = tempfile.mkdtemp(prefix="shardkit-cluster-failures-")
    try:
        rows = []
        t = time.perf_counter()
        local = shardkit.pack(args.src_dir, os.path.join(work, "local"), workers=args.workers,
                              **options)
        rows.append(("local engine", time.perf_counter() - t, ""))
        want = digests(local.out)
        with dask_cluster(nworkers=args.workers) as (address, _), \
                Client(address, timeout="60s") as client:
            for killed in (False, True):
                out = os.path.join(work, "killed" if killed else "dask")
                partial = os.path.join(work, f".{os.path.basename(out)}.partial")
                note: list[str] = []
                stop = threading.Event()

                def killer() -> None:
                    while not stop.is_set():
                        done = (len([n for n in os.listdir(partial) if n.endswith(".done.json")])
                                if os.path.isdir(partial) else 0)
                        if done >= args.shards // 2:
                            worker, pid = sorted(client.run(os.getpid).items())[0]
                            os.kill(pid, signal.SIGKILL)
                            note.append(f"SIGKILL to worker {worker} (pid {pid}) after {done} "
                                        f"of {args.shards} shards")
                            return
                        time.sleep(0.05)

                watcher = threading.Thread(target=killer, daemon=True)
                if killed:
                    watcher.start()
                t = time.perf_counter()
                shardkit.pack(args.src_dir, out, engine="dask", scheduler=address, **options)
                seconds = time.perf_counter() - t
                stop.set()
                same = digests(out) == want
                if not same:
                    raise SystemExit(f"{out}: the store differs from the local engine's")
                rows.append(("dask, one worker killed" if killed else "dask", seconds,
                             "; ".join(note)))
                client.wait_for_workers(args.workers, timeout=120)
        lines = [f"{args.sources:,} sources ({args.size}-px JPEGs), {args.shards} shards; "
                 f"local engine {args.workers} processes; dask scheduler + dask worker "
                 f"--nworkers {args.workers} --nthreads 1 on 127.0.0.1; {os.cpu_count()} CPUs",
                 f"{'run':<26} {'seconds':>8} {'images/s':>9}  store"]
        for name, seconds, note in rows:
            lines.append(f"{name:<26} {seconds:8.1f} {args.sources / seconds:9.0f}  "
                         f"{'reference' if name == 'local engine' else 'byte-identical'}"
                         + (f"  ({note})" if note else ""))
        cost = rows[2][1] - rows[1][1]
        lines.append(f"the kill cost {cost:+.1f} s ({cost / rows[1][1]:+.0%} of the undisturbed "
                     f"cluster run); every run exited normally")
        emit(lines, args.out, command)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
