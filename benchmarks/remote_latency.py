#!/usr/bin/env python
"""Cold epochs of a remote store over a slow link: added round-trip time and a bandwidth cap.

    python benchmarks/remote_latency.py                       # 32 shards, RTT +0/20/100 ms
    python benchmarks/remote_latency.py --rows link --rate 2e6 --baseline HEAD~1

One run: a photo-like sample (``shardkit.bench.sample``) packed into ``--shards`` shards and
uploaded to a moto S3 server on 127.0.0.1; every client request then goes through the fault
proxy of the test suite (``tests/helpers/faultproxy.py``), which adds ``RTT`` seconds to every
request (and to each new connection) and, for the bandwidth rows, paces all bodies on one link of
``--rate`` bytes/s (a token bucket holding ``--burst`` bytes). Each epoch runs in a process of its
own (the server and the proxy stay in this one; it reads the local store once first, to warm
its imports and decoders), starts from an empty cache and reads the whole
store through a real DataLoader (``--workers`` fork workers, ``ShardSampler`` of one rank, which
reads ahead ``read_ahead_depth`` shards of its order), decoding at read (``crop=64``), and must
deliver the same labels and pixels as the local store.

Rows: RTT 0 / 20 / 100 ms with the default read-ahead and with a depth of 1 (one shard ahead,
what shardkit did before); a shaped link with and without added RTT. ``--baseline REF`` runs
every epoch a second time, alternating, with the ``shardkit`` package of git commit ``REF``
(old against new under the same load).

The link's share: the store's shard bytes (what an epoch must move; the manifest and labels come
when the dataset is made) / epoch seconds / ``--rate``. Epoch seconds run from ``iter(loader)``
(workers start) to the loop's end. Each link epoch's time is also split from the proxy's
timeline: link busy, and idle before the first shard's GET, with no GET in flight, with a GET in
flight, after the last byte (the decode that waits for it). Targets, judged by
``benchmarks/targets.py`` from the JSON report: cold epoch at +100 ms within 1.5x of +0 ms;
a bandwidth-bound epoch within 10 % of the link rate (share >= 0.9).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))  # helpers.faultproxy
sys.path.insert(0, HERE)  # targets
sys.path.append(REPO)  # shardkit from a source checkout that is not installed


def epoch(url: str, cache: str, workers: int, depth: int | None) -> dict[str, Any]:
    """One cold epoch in this process: its seconds, a digest of every label and pixel
    delivered, and when it started and the last batch came (``time.monotonic()``, the proxy's
    clock: one per machine)."""
    import shardkit
    from torch.utils.data import DataLoader

    ds = shardkit.ShardDataset(url, crop=64, cache_dir=cache)
    if depth is not None:
        ds.store.cache.read_ahead_depth = depth
    sampler = shardkit.ShardSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=workers,
                        multiprocessing_context="fork", collate_fn=shardkit.collate,
                        worker_init_fn=shardkit.worker_init_fn)
    digest = hashlib.sha256()
    start = last = time.monotonic()
    for images, labels in loader:
        digest.update(images.numpy().tobytes())
        digest.update(labels.numpy().tobytes())
        last = time.monotonic()
    seconds = time.monotonic() - start
    ds.close()
    return {"seconds": seconds, "digest": digest.hexdigest(), "start": start,
            "last_batch": last, "shardkit": os.path.dirname(shardkit.__file__)}


def warm_epoch(local: str, url: str, cache: str, workers: int,
               depth: int | None) -> dict[str, Any]:
    """An epoch of the local store first (this process's imports and decoders warm, as in a
    training process past its first steps), then the cold-cache epoch of ``url``."""
    epoch(local, cache + "-unused", workers, None)
    return epoch(url, cache, workers, depth)


def epoch_in(code: str, local: str, url: str, cache: str, workers: int,
             depth: int | None) -> dict[str, Any]:
    """:func:`warm_epoch` in a child process importing the ``shardkit`` package under ``code``."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([code, os.environ.get("PYTHONPATH", "")])}
    job = json.dumps([local, url, cache, workers, depth])
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--epoch", job], env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"epoch with {code} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@dataclass
class Link:
    """Where one epoch's time on the shaped link went (seconds, from the proxy's timeline)."""

    wire: int = 0  # response body bytes sent during the epoch
    busy: float = 0.0  # the link sending: wire / rate
    before: float = 0.0  # idle: epoch start to the first shard's GET
    no_request: float = 0.0  # idle: no shard GET in flight (between the first and the last)
    in_flight: float = 0.0  # idle although a GET was in flight (server, proxy or client slow)
    after: float = 0.0  # idle: the last shard's body sent, epoch not over (decode, the tail)
    most: int = 0  # the most shard GETs in flight at once

    def text(self) -> str:
        return (f"link busy {self.busy:5.2f} s; idle {self.before:4.2f} before the first GET, "
                f"{self.no_request:4.2f} with no GET in flight, {self.in_flight:4.2f} with one "
                f"in flight, {self.after:4.2f} after the last byte; <= {self.most} GETs at once")


def _overlap(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by the union of ``spans``."""
    total, reach = 0.0, lo
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def link_use(proxy: Any, start: float, seconds: float, prefix: str) -> Link:
    """Account the shaped link's time over one epoch: busy, and each idle stretch by cause."""
    end = start + seconds
    mine = [t for t in proxy.transfers if start <= t.requested <= end]
    gets = [(t.requested, t.done if t.done is not None else end) for t in mine
            if t.method == "GET" and t.path.startswith(prefix)]
    busy = [(a, b) for a, b in proxy.busy if b > start and a < end]
    link = Link(wire=sum(t.bytes for t in mine), busy=_overlap(busy, start, end))
    if not gets:
        return link
    first, last = min(a for a, _ in gets), max(b for _, b in gets)
    link.before = first - start - _overlap(busy, start, first)
    link.after = end - last - _overlap(busy, last, end)
    gaps, reach = [], first  # the link's idle stretches inside [first, last]
    for a, b in sorted(busy):
        if a > reach:
            gaps.append((reach, min(a, last)))
        reach = max(reach, b)
    if reach < last:
        gaps.append((reach, last))
    link.in_flight = sum(_overlap(gets, a, b) for a, b in gaps if b > a)
    link.no_request = sum(b - a for a, b in gaps if b > a) - link.in_flight
    now = 0
    for _, step in sorted([(a, 1) for a, _ in gets] + [(b, -1) for _, b in gets]):
        now += step
        link.most = max(link.most, now)
    return link


def _io_load(folder: str) -> subprocess.Popen:
    """Another job's disk writes beside the epoch: 32 MiB written and fsynced, over and over."""
    code = ("import os, sys\nblock = os.urandom(1 << 20)\nwhile True:\n"
            "    with open(sys.argv[1], 'wb') as f:\n        for _ in range(32):\n"
            "            f.write(block)\n        f.flush()\n        os.fsync(f.fileno())\n")
    return subprocess.Popen([sys.executable, "-c", code, os.path.join(folder, "io-load")])


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _checkout(ref: str, into: str) -> str:
    """The ``shardkit`` package of git commit ``ref``, extracted under ``into`` (or ``ref``
    itself: a folder holding a ``shardkit`` package)."""
    if os.path.isdir(os.path.join(ref, "shardkit")):
        return ref
    os.makedirs(into)
    archive = subprocess.run(["git", "-C", REPO, "archive", ref, "shardkit"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=3200, help="sample images [3200]")
    parser.add_argument("--shards", type=int, default=32, help="shards [32]")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers [2]")
    parser.add_argument("--rate", type=float, default=2e6, help="shaped link, bytes/s [2e6]")
    parser.add_argument("--burst", type=int, default=None,
                        help="shaped link's burst, bytes [the proxy's BURST]; 0: none")
    parser.add_argument("--repeat", type=int, default=2, help="epochs per row (median) [2]")
    parser.add_argument("--rows", default="latency,link",
                        help="which rows: latency, link or both [latency,link]")
    parser.add_argument("--baseline", metavar="REF",
                        help="also run each epoch with the shardkit of git commit REF (or of "
                             "folder REF)")
    parser.add_argument("--rtts", type=lambda v: [int(x) for x in v.split(",")],
                        default=[0, 20, 100], help="latency rows' added RTTs, ms [0,20,100]")
    parser.add_argument("--default-only", action="store_true",
                        help="latency rows with the default read-ahead only (no depth 1)")
    parser.add_argument("--io-load", action="store_true",
                        help="write and fsync 32 MiB over and over beside each epoch (other "
                             "jobs' disk writes)")
    parser.add_argument("--out", help="also write the report to this file, and JSON beside it")
    parser.add_argument("--epoch", help=argparse.SUPPRESS)  # a child: one epoch, JSON out
    args = parser.parse_args(argv)
    if args.epoch:
        print(json.dumps(warm_epoch(*json.loads(args.epoch))))
        return 0
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    import shardkit
    from helpers.faultproxy import BURST, FaultProxy
    from helpers.s3server import DUMMY_ENV, S3Server
    from shardkit import metadata
    from shardkit.bench.sample import make_sample
    from shardkit.remote import upload_folder_store
    from targets import judge

    os.environ.update(DUMMY_ENV)
    burst = BURST if args.burst is None else args.burst
    load0, lines, rows_out = _load(), [], []
    with tempfile.TemporaryDirectory(prefix="shardkit-latency-") as work, S3Server() as s3:
        codes = {"": REPO}
        if args.baseline:
            codes = {f" [{args.baseline}]": _checkout(args.baseline, os.path.join(work, "old")),
                     " [this tree]": REPO}
        src, local = os.path.join(work, "sample"), os.path.join(work, "local")
        make_sample(src, args.sample, classes=10, seed=0)
        shardkit.pack(src, local, num_shards=args.shards, workers=2, progress=False)
        url = f"s3://{s3.new_bucket()}/train"
        os.environ["AWS_ENDPOINT_URL"] = s3.endpoint
        upload_folder_store(local, url)
        manifest = os.path.join(local, metadata.MANIFEST_NAME)
        with open(manifest, "rb") as f:
            shard_bytes = sum(e["bytes"] for e in
                              metadata.parse_manifest_layout(f.read(), manifest)["shards"])
        prefix = "/" + url.removeprefix("s3://") + "/"
        want = epoch(local, os.path.join(work, "unused"), args.workers, None)["digest"]
        rows = []
        if "latency" in args.rows:
            rows += [(f"RTT +{ms} ms, read-ahead {name}", ms / 1000, None, depth)
                     for ms in args.rtts for name, depth in (("default", None), ("1", 1))
                     if depth is None or not args.default_only]
        if "link" in args.rows:
            rows += [(f"link {args.rate / 1e6:g} MB/s, RTT +{ms} ms", ms / 1000, args.rate, None)
                     for ms in (0, 20)]
        same = True
        for n, (name, rtt, rate, depth) in enumerate(rows):
            runs: dict[str, list[tuple[dict[str, Any], Link | None, str]]] = {c: [] for c in codes}
            for r in range(args.repeat):
                for i, (c, code) in enumerate(codes.items()):  # alternating: the same load
                    writer = _io_load(work) if args.io_load else None
                    try:
                        with FaultProxy(s3.endpoint, rtt=rtt, rate=rate, burst=burst) as proxy:
                            os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
                            got = epoch_in(code, local, url,
                                           os.path.join(work, f"cache-{n}-{r}-{i}"),
                                           args.workers, depth)
                    finally:
                        if writer is not None:
                            writer.kill()
                            writer.wait()
                    same &= got["digest"] == want
                    if not os.path.samefile(os.path.dirname(got["shardkit"]), code):
                        raise SystemExit(f"the epoch imported {got['shardkit']}, not {code}")
                    use = link_use(proxy, got["start"], got["seconds"], prefix) if rate else None
                    if use is not None and use.wire < shard_bytes:
                        raise SystemExit(f"{name}{c}: a cold epoch moved {use.wire} bytes, less "
                                         f"than the shards' {shard_bytes}")
                    runs[c].append((got, use, _load()))
            for c, done in runs.items():
                seconds = statistics.median(g["seconds"] for g, _, _ in done)
                share = shard_bytes / seconds / rate if rate else None
                line = (f"{name + c:46s} {seconds:6.2f} s  {args.sample / seconds:5.0f} img/s"
                        f"  {shard_bytes / seconds / 1e6:5.2f} MB/s"
                        + (f" = {share:.2f} of the link" if rate else ""))
                lines.append(line)
                print(line, flush=True)
                for r, (got, use, load) in enumerate(done):
                    if use is not None:
                        detail = (f"    epoch {r + 1}: {got['seconds']:6.2f} s, "
                                  f"{use.wire / 1e6:.1f} MB sent; {use.text()}; load {load}")
                        lines.append(detail)
                        print(detail, flush=True)
                rows_out.append({"row": name, "code": c.strip(" []") or "this tree", "rtt": rtt,
                                 "rate": rate, "depth": depth, "seconds": seconds,
                                 "link_share": share,
                                 "epochs": [{"seconds": g["seconds"], "load": load,
                                             "link": asdict(u) if u else None}
                                            for g, u, load in done]})

    report = {"remote_latency": {"sample": args.sample, "shards": args.shards,
                                 "io_load": args.io_load,
                                 "shard_bytes": shard_bytes, "rate": args.rate, "burst": burst,
                                 "workers": args.workers, "repeat": args.repeat,
                                 "same_pixels": same, "rows": rows_out}}
    footer = judge(report) + ["same labels and pixels as the local store in every epoch: "
                              f"{'yes' if same else 'NO'}"]
    header = [f"$ python benchmarks/remote_latency.py {' '.join(argv or sys.argv[1:])}   "
              f"# {time.strftime('%Y-%m-%d %H:%M')}, 2-core VM shared with other jobs, load "
              f"average before: {load0}",
              f"{args.sample} images in {args.shards} shards ({shard_bytes / 1e6:.1f} MB of "
              f"shards), cold cache each epoch, DataLoader {args.workers} fork workers, "
              f"ShardSampler, crop 64; moto S3 on 127.0.0.1 behind tests/helpers/faultproxy.py "
              f"(link burst {burst} bytes); median of {args.repeat} epochs; MB/s: shard bytes / "
              "epoch seconds" + ("; beside each epoch a writer fsyncs 32 MiB over and over"
                                 if args.io_load else "")]
    print("\n".join(footer))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(header + lines + footer) + "\n")
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(report, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
