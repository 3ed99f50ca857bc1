"""Read a remote store whose shard downloads stall, until Ctrl-C
(``tests/remote/test_interrupt.py``).

argv: URL CACHE_DIR ENGINE, ENGINE one of ``threads`` (``engine="threads"``), ``main`` (the
process engine, ``num_workers=0``: the read waits in this thread) and ``workers`` (two worker
processes). A ``ShardSampler`` reads ahead, so downloads wait in the read-ahead's threads too.
A stalled read gives up only after 600 s here: the loop gets no batch before the test's SIGINT.
"""

import sys

PATIENT = {"config_kwargs": {"read_timeout": 600, "retries": {"total_max_attempts": 1}}}


def main(url: str, cache_dir: str, engine: str) -> None:
    import shardkit

    ds = shardkit.ShardDataset(url, crop=16, cache_dir=cache_dir, storage_options=PATIENT)
    options = {"threads": dict(engine="threads", num_threads=2),
               "main": dict(num_workers=0),
               "workers": dict(num_workers=2)}[engine]
    sampler = shardkit.ShardSampler(ds, num_replicas=1, rank=0)
    for _ in ds.loader(batch_size=4, sampler=sampler, **options):
        print("a batch arrived", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
