"""Read a store through DataLoader workers and print what the batches held (test_shm runs this
inside a mount namespace whose /dev/shm is a 64 MB tmpfs, as in a Docker container).

argv: STORE CONTEXT CASE... (CONTEXT: the workers' start method). Each CASE is read in turn, in
this one process: ``plain-*`` is a plain ``DataLoader`` (torch's default collate); the others are
``ds.loader``: ``transform`` (a per-sample float transform), ``crop`` (the batched decode-crop
path), ``numpy`` (``output="numpy"``), ``target`` (with a ``target_transform``), ``single``
(``batch_size=None``), ``threads`` (the per-sample float transform on
``engine="threads"``: no worker process). Prints one JSON line per case as soon as it is read:
``{"case": CASE, "batches": [[pixel sum, [labels]], ...]}``, or ``{"case": CASE, "error": ...}``
where its loader raised (the next case is read all the same).
"""

import json
import sys
import traceback

CROP, BATCH = 224, 128


def to_float(img):
    """The per-sample transform: uint8 C x H x W -> float32 in [0, 1] (four times the bytes)."""
    return img.float().div_(255)


def shifted(label):
    return label + 1000


def setup(path: str, case: str):
    from shardkit import ShardDataset

    kind = case.removeprefix("plain-")
    kwargs = {"crop": CROP}
    if kind in ("transform", "single", "threads"):
        kwargs["transform"] = to_float
    if kind == "numpy":
        kwargs["output"] = "numpy"
    if kind == "target":
        kwargs["target_transform"] = shifted
    return ShardDataset(path, **kwargs), None if kind == "single" else BATCH


def describe(batches) -> list:
    """What each batch held: (sum of its pixels, its labels), enough to tell batches apart."""
    import torch

    out = []
    for item in batches:
        images, labels = item
        out.append([float(images.double().sum()), torch.as_tensor(labels).reshape(-1).tolist()])
    return out


def read(path: str, case: str, context: str) -> list:
    import shardkit
    from torch.utils.data import DataLoader

    ds, batch_size = setup(path, case)
    kwargs = dict(batch_size=batch_size, num_workers=2, multiprocessing_context=context)
    if case == "threads":
        loader = ds.loader(batch_size=batch_size, engine="threads", num_threads=2)
    elif case.startswith("plain-"):
        loader = DataLoader(ds, worker_init_fn=shardkit.worker_init_fn, **kwargs)
    else:
        loader = ds.loader(**kwargs)
    return describe(loader)


def main(argv: list[str]) -> None:
    path, context, *cases = argv
    for case in cases:
        try:
            line = {"case": case, "batches": read(path, case, context)}
        except Exception:
            line = {"case": case, "error": traceback.format_exc()}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
