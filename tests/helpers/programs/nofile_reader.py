"""Read a store fully under a descriptor limit and report what it held (test_open_files).

argv: STORE, max_open_shards (or ``default``), the RLIMIT_NOFILE to set. Prints one JSON object:
descriptors after creation and at peak, open shards, digests of every sample read one by one and
as one batch, what ``close()`` leaves, and what forked DataLoader workers read and held.
"""

import json
import os
import resource
import sys


def main(argv: list[str]) -> None:
    path, limit, nofile = argv
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(nofile), int(nofile)))
    from torch.utils.data import DataLoader, Dataset

    import shardkit
    from helpers.digests import digest

    inside = os.path.realpath(path) + os.sep

    def fds():
        return len(os.listdir("/proc/self/fd"))

    def store_fds():
        """Descriptors of files inside the store (the process's own pipes etc. not counted)."""
        n = 0
        for fd in os.listdir("/proc/self/fd"):
            try:
                n += os.readlink(f"/proc/self/fd/{fd}").startswith(inside)
            except OSError:
                pass
        return n

    class Probe(Dataset):
        """(index, digest, label, store descriptors open in this worker) per sample."""
        def __init__(self, dataset):
            self.dataset = dataset  # where shardkit.worker_init_fn finds it

        def __len__(self):
            return len(self.dataset)

        def __getitem__(self, i):
            img, label = self.dataset[i]
            return i, digest(img), int(label), store_fds()

    out = {}
    base = fds()
    kwargs = {} if limit == "default" else {"max_open_shards": int(limit)}
    ds = shardkit.ShardDataset(path, output="numpy", **kwargs)
    out["after_create"] = fds() - base
    kept, peak = [], 0
    for i in range(len(ds)):
        kept.append(ds[i])  # kept while later reads close this sample's shard
        peak = max(peak, fds() - base)
    batch = ds.__getitems__(list(range(len(ds)))[::-1])  # one batch over every shard
    peak = max(peak, fds() - base)
    out["targets"] = ds.targets.tolist()
    out["peak"] = max(peak, fds() - base)
    out["open_shards"] = len(ds.store.open_shards)
    out["single"] = [[digest(img), int(label)] for img, label in kept]
    out["batch"] = [[digest(img), int(label)] for img, label in reversed(batch)]
    ds.close()
    out["after_close"] = fds() - base  # the samples read are still alive: they are no views
    # Forked workers, from a parent that holds open shards again.
    reread = [digest(ds[i][0]) for i in range(len(ds))]
    out["reread"] = reread == [d for d, _ in out["single"]]
    loader = DataLoader(Probe(ds), batch_size=16, shuffle=True, num_workers=2,
                        multiprocessing_context="fork", worker_init_fn=shardkit.worker_init_fn,
                        collate_fn=lambda b: b)
    out["workers"] = [s for b in loader for s in b]
    ds.close()
    out["store_fds_after_close"] = store_fds()  # total: the loader's pipes close asynchronously
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
