#!/usr/bin/env python
"""Cold epochs of a remote store over a slow link: added round-trip time and a bandwidth cap.

    python benchmarks/remote_latency.py                       # 32 shards, RTT +0/20/100 ms
    python benchmarks/remote_latency.py --out benchmarks/results/remote_latency.txt

One run: a photo-like sample (``shardkit.bench.sample``) packed into ``--shards`` shards and
uploaded to a moto S3 server on 127.0.0.1; every client request then goes through the fault
proxy of the test suite (``tests/helpers/faultproxy.py``), which adds ``RTT`` seconds to every
request (and to each new connection) and, for the bandwidth rows, paces all bodies on one link of
``--rate`` bytes/s. Each epoch starts from an empty cache and reads the whole store through a
real DataLoader (``--workers`` fork workers, ``ShardSampler`` of one rank, which reads ahead
``read_ahead_depth`` shards of its order), decoding at read (``crop=64``), and must deliver the
same labels and pixels as the local store.

Rows: RTT 0 / 20 / 100 ms with the default read-ahead and with a depth of 1 (one shard ahead,
what shardkit did before); a shaped link with and without added RTT. Targets (judged here):
cold epoch at +100 ms within 1.5x of +0 ms; a bandwidth-bound epoch within 10 % of the link rate
(store bytes / epoch seconds >= 0.9 x rate).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # helpers.faultproxy
try:
    import shardkit
except ImportError:  # a source checkout without installing
    sys.path.insert(0, os.path.join(HERE, ".."))
    import shardkit

LATENCY_TARGET = 1.5  # cold epoch at +100 ms RTT / at +0 ms
RATE_TARGET = 0.90  # store bytes / epoch time, as a share of the link rate


def epoch(url: str, cache: str, workers: int, depth: int | None) -> tuple[float, str]:
    """Seconds of one cold epoch, and a digest of every label and pixel delivered."""
    from torch.utils.data import DataLoader

    ds = shardkit.ShardDataset(url, crop=64, cache_dir=cache)
    if depth is not None:
        ds.store.cache.read_ahead_depth = depth
    sampler = shardkit.ShardSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=workers,
                        multiprocessing_context="fork", collate_fn=shardkit.collate,
                        worker_init_fn=shardkit.worker_init_fn)
    digest = hashlib.sha256()
    start = time.perf_counter()
    for images, labels in loader:
        digest.update(images.numpy().tobytes())
        digest.update(labels.numpy().tobytes())
    seconds = time.perf_counter() - start
    ds.close()
    return seconds, digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=3200, help="sample images [3200]")
    parser.add_argument("--shards", type=int, default=32, help="shards [32]")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers [2]")
    parser.add_argument("--rate", type=float, default=2e6, help="shaped link, bytes/s [2e6]")
    parser.add_argument("--repeat", type=int, default=2, help="epochs per row (median) [2]")
    parser.add_argument("--rows", default="latency,link",
                        help="which rows: latency, link or both [latency,link]")
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    from helpers.faultproxy import FaultProxy
    from helpers.s3server import DUMMY_ENV, S3Server
    from shardkit.bench.sample import make_sample
    from shardkit.remote import upload_folder_store

    os.environ.update(DUMMY_ENV)
    lines = []
    with tempfile.TemporaryDirectory(prefix="shardkit-latency-") as work, S3Server() as s3:
        src, local = os.path.join(work, "sample"), os.path.join(work, "local")
        make_sample(src, args.sample, classes=10, seed=0)
        shardkit.pack(src, local, num_shards=args.shards, workers=2, progress=False)
        url = f"s3://{s3.new_bucket()}/train"
        os.environ["AWS_ENDPOINT_URL"] = s3.endpoint
        upload_folder_store(local, url)
        store_bytes = sum(os.path.getsize(os.path.join(local, n)) for n in os.listdir(local))
        want = epoch(local, os.path.join(work, "unused"), args.workers, None)[1]
        rows = []
        if "latency" in args.rows:
            rows += [(f"RTT +{ms} ms, read-ahead {name}", ms / 1000, None, depth)
                     for ms in (0, 20, 100) for name, depth in (("default", None), ("1", 1))]
        if "link" in args.rows:
            rows += [(f"link {args.rate / 1e6:g} MB/s, RTT +{ms} ms", ms / 1000, args.rate, None)
                     for ms in (0, 20)]
        results: dict[str, float] = {}
        same = True
        for n, (name, rtt, rate, depth) in enumerate(rows):
            times = []
            for r in range(args.repeat):
                with FaultProxy(s3.endpoint, rtt=rtt, rate=rate) as proxy:
                    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
                    seconds, digest = epoch(url, os.path.join(work, f"cache-{n}-{r}"),
                                            args.workers, depth)
                same &= digest == want
                times.append(seconds)
            results[name] = statistics.median(times)
            line = (f"{name:34s} {results[name]:6.2f} s  {args.sample / results[name]:7.0f} img/s"
                    f"  {store_bytes / results[name] / 1e6:6.1f} MB/s")
            print(line, flush=True)
            lines.append(line)

    footer = []
    if "latency" in args.rows:
        ratio = (results["RTT +100 ms, read-ahead default"]
                 / results["RTT +0 ms, read-ahead default"])
        footer.append(f"+100 ms / +0 ms (default read-ahead): {ratio:.2f} (target <= "
                      f"{LATENCY_TARGET}: {'met' if ratio <= LATENCY_TARGET else 'NOT met'})")
    if "link" in args.rows:
        link = store_bytes / results[f"link {args.rate / 1e6:g} MB/s, RTT +0 ms"] / args.rate
        footer.append(f"shaped link, no added RTT: {link:.2f} of the link rate (target >= "
                      f"{RATE_TARGET}: {'met' if link >= RATE_TARGET else 'NOT met'})")
    footer.append("same labels and pixels as the local store in every epoch: "
                  f"{'yes' if same else 'NO'}")
    header = [f"$ python benchmarks/remote_latency.py {' '.join(argv or sys.argv[1:])}   "
              f"# {time.strftime('%Y-%m-%d')}, 2-core VM shared with other jobs",
              f"{args.sample} images in {args.shards} shards ({store_bytes / 1e6:.1f} MB), cold "
              f"cache each epoch, DataLoader {args.workers} fork workers, ShardSampler, crop 64; "
              f"moto S3 on 127.0.0.1 behind tests/helpers/faultproxy.py; median of "
              f"{args.repeat} epochs"]
    report = "\n".join(header + lines + footer)
    print("\n".join(footer))
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
