"""Read a store as a short script would, then fall off the end without closing anything
(test_exit): the interpreter's exit must print nothing.

argv: STORE CASE. CASE: ``index`` (a few ``ds[i]`` and a batch), ``threads`` (a batch decoded by
two threads), ``fork``/``spawn``/``forkserver`` (two epochs of ``ds.loader`` with two workers of
that start method, per-sample transform), ``break-spawn`` (leaves the loop after one batch, its
persistent spawned workers still running at exit). What it made stays referenced from this module's
globals, as in a script: it is torn down with the modules at exit, not collected before.
"""

import sys


def halve(img):
    """A per-sample transform (module level, so spawned workers can unpickle it)."""
    return img[:, ::2, ::2].contiguous()


def main(argv: list[str]) -> tuple:
    from shardkit import ShardDataset

    path, case = argv
    if case in ("index", "threads"):
        ds = ShardDataset(path, crop=16, threads=2 if case == "threads" else 0)
        ds[0], ds[len(ds) - 1]
        batch = ds.__getitems__(list(range(min(8, len(ds)))))
        return ds, batch
    context = case.split("-")[-1]
    ds = ShardDataset(path, crop=16, transform=halve)
    loader = ds.loader(batch_size=4, num_workers=2, multiprocessing_context=context)
    for _ in range(1 if case.startswith("break") else 2):
        batches = iter(loader)
        for images, labels in batches:
            assert images.shape[1:] == (3, 8, 8)
            if case.startswith("break"):
                break
    return ds, loader, batches, images


if __name__ == "__main__":
    kept = main(sys.argv[1:])
