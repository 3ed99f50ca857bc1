#!/usr/bin/env python
"""Remote-store throughput: a local store against the same store read from S3 through the cache.

    python benchmarks/remote_throughput.py                  # 4000 sample images, 8 MiB shards
    python benchmarks/remote_throughput.py --sample 2000 --shard-size 4MiB

In one run: starts a local S3-protocol server (moto, 127.0.0.1), writes a photo-like sample
(``shardkit.bench.sample``), packs it to a local folder store and to ``s3://bench/train`` with
``shardkit.pack``, then reads it through a real DataLoader (``--workers`` fork workers, batch
``--batch-size``, ``ShardDataset(crop=224)``, ``shardkit.collate``):

- ``remote cold``: the first epoch from the URL with an empty ``cache_dir`` (every shard
  downloaded once, the next one prefetched while the current is read);
- ``local`` and ``remote warm`` (the same dataset's later epochs, served from the cache),
  alternated ``--epochs`` times each so that drift of the machine's speed hits both alike.

Reports images/s (median of the epochs) and the bytes the server sent per epoch (GETs of shard
objects, counted on the server's side), and checks that every epoch delivered the same labels and
pixels as the local store (exit 1 if not). The S3 server runs in this process on the same cores:
the cold epoch measures shardkit's download path against a local endpoint, not a cloud link.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import statistics
import sys
import tempfile
import threading
import time

try:
    import shardkit
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import shardkit

TARGET = 0.90  # warm-cache epoch: at least 90 % of the local store's images/s


class Server:
    """moto's S3 server on 127.0.0.1 that counts the bytes of each GET of an object."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._lock = threading.Lock()
        self.sent: dict[str, int] = {}  # path -> bytes sent in GET answers

    def start(self) -> str:
        self._moto.start()
        wsgi = self._moto._server
        inner = wsgi.app

        def app(environ, start_response):
            path, method = environ["PATH_INFO"], environ["REQUEST_METHOD"]
            body = inner(environ, start_response)
            if method != "GET":
                return body
            chunks = list(body)
            with self._lock:
                self.sent[path] = self.sent.get(path, 0) + sum(len(c) for c in chunks)
            return chunks

        wsgi.app = app
        host, port = self._moto.get_host_and_port()
        return f"http://{host}:{port}"

    def shard_bytes(self) -> int:
        with self._lock:
            return sum(n for path, n in self.sent.items() if "/shard-" in path)

    def stop(self) -> None:
        self._moto.stop()


def epoch(ds, workers: int, batch_size: int) -> tuple[float, int, str]:
    """One epoch through a DataLoader: (images/s, images, digest of labels and pixels)."""
    from torch.utils.data import DataLoader

    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers,
                        multiprocessing_context="fork" if workers else None,
                        worker_init_fn=shardkit.worker_init_fn, collate_fn=shardkit.collate)
    digest, n = hashlib.sha256(), 0
    t0 = time.perf_counter()
    for images, labels in loader:
        n += len(labels)
        # Every 8th image and every label: proof of identical output, cheap next to decoding.
        digest.update(images[::8].numpy().tobytes())
        digest.update(labels.numpy().tobytes())
    return n / (time.perf_counter() - t0), n, digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    from shardkit.cli import parse_bytes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=4000, help="sample images [4000]")
    parser.add_argument("--shard-size", type=parse_bytes, default=8 << 20,
                        help="shard size [8MiB]")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers [2]")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size [64]")
    parser.add_argument("--epochs", type=int, default=3,
                        help="timed local and warm epochs each, alternated [3]")
    parser.add_argument("--work-dir", help="where the sample and stores go (default: a temp dir)")
    args = parser.parse_args(argv)

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    work = args.work_dir or tempfile.mkdtemp(prefix="shardkit-remote-bench-")
    os.makedirs(work, exist_ok=True)
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                       "SHARDKIT_CACHE_DIR": os.path.join(work, "staging")})
    server = Server()
    os.environ["AWS_ENDPOINT_URL"] = server.start()
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket="bench")
        src = os.path.join(work, "sample")
        if not os.path.isdir(src):
            from shardkit.bench.sample import make_sample

            make_sample(src, args.sample, classes=10, seed=0)
        local, url = os.path.join(work, "local"), "s3://bench/train"
        packs = {}
        for out in (local, url):
            t0 = time.perf_counter()
            result = shardkit.pack(src, out, shard_size=args.shard_size, overwrite=True,
                                   progress=False)
            packs[out] = (time.perf_counter() - t0, result.shards)
        crop = dict(crop=224, fast_decode=True)
        local_ds = shardkit.ShardDataset(local, **crop)
        cache = tempfile.mkdtemp(prefix="cache-", dir=work)
        remote_ds = shardkit.ShardDataset(url, cache_dir=cache, **crop)
        store_bytes = sum(e.bytes for e in remote_ds.store.shards)

        epoch(local_ds, args.workers, args.batch_size)  # warm-up: page cache, imports
        sent = server.shard_bytes()
        cold, n, want = epoch(remote_ds, args.workers, args.batch_size)
        cold_bytes = server.shard_bytes() - sent
        rates: dict[str, list[float]] = {"local": [], "warm": []}
        warm_bytes, same = [], True
        for _ in range(args.epochs):
            for name, ds in (("local", local_ds), ("warm", remote_ds)):
                sent = server.shard_bytes()
                rate, count, digest = epoch(ds, args.workers, args.batch_size)
                if name == "warm":
                    warm_bytes.append(server.shard_bytes() - sent)
                rates[name].append(rate)
                same = same and digest == want and count == n
    finally:
        server.stop()

    local_rate, warm_rate = (statistics.median(rates[k]) for k in ("local", "warm"))
    mib = 1 << 20
    lines = [
        f"remote-store throughput: {n} images, {packs[url][1]} shards of about "
        f"{args.shard_size / mib:.0f} MiB ({store_bytes / mib:.1f} MiB), DataLoader "
        f"{args.workers} fork workers, batch {args.batch_size}, crop 224 (fast decode), "
        "shardkit.collate; S3: moto on 127.0.0.1 in the same process",
        f"pack: local {packs[local][0]:.1f} s, to s3:// {packs[url][0]:.1f} s",
        f"{'epoch':<24}{'images/s':>10}{'MiB from server':>18}",
        f"{'local store':<24}{local_rate:>10.0f}{0:>18.1f}",
        f"{'remote, cold cache':<24}{cold:>10.0f}{cold_bytes / mib:>18.1f}",
        f"{'remote, warm cache':<24}{warm_rate:>10.0f}"
        f"{statistics.median(warm_bytes) / mib:>18.1f}",
        f"epochs (images/s): local {', '.join(f'{r:.0f}' for r in rates['local'])}; "
        f"warm {', '.join(f'{r:.0f}' for r in rates['warm'])}",
        f"warm / local: {warm_rate / local_rate:.3f} (target >= {TARGET:.2f}: "
        f"{'met' if warm_rate >= TARGET * local_rate else 'NOT met'})",
        f"cold / local: {cold / local_rate:.3f}; cold epoch downloaded each shard "
        f"{cold_bytes / store_bytes:.2f} times",
        f"same labels and pixels in every epoch: {'yes' if same else 'NO'}",
    ]
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
