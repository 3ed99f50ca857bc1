"""Packing rate from WebDataset tars and Hugging Face parquet vs the same images in a folder.

The same JPEGs (photo-like, 640x480 by default) are written three ways: an ImageFolder tree,
WebDataset tar shards (``KEY.jpg`` + ``KEY.cls``, stdlib ``tarfile``) and parquet with the
Hugging Face ``Image`` struct and ``ClassLabel`` metadata (pyarrow, row groups of 100). Each is
packed with the same settings, the three interleaved, ``--rounds`` times (best time of each
reported: a shared machine's load hits them alike); the rate counts the whole call (scanning
the container included), so a slow container reader shows. Target: tars and parquet >= 0.9x
the folder.

    .venv/bin/python benchmarks/pack_sources.py --images 1000 --workers 2 --rounds 3 \
        --out benchmarks/results/pack_sources.txt
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import tarfile
import tempfile
import time

import numpy as np
from PIL import Image
from reports import emit  # beside this script

CLASSES = 10


def photo(rng: np.random.Generator, width: int, height: int) -> bytes:
    """A smooth gradient with noise: JPEG sizes and decode costs like a photo's."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([x / width, y / height, (x + y) / (width + height)], -1)
    tint = rng.uniform(60, 200, 3)
    pixels = base * tint + rng.normal(0, 12, (height, width, 3))
    out = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def make_sources(root: str, images: int, width: int, height: int, per_tar: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    data = [(photo(rng, width, height), i % CLASSES) for i in range(images)]
    folder = os.path.join(root, "folder")
    order = []  # the folder's ImageFolder order, so every source holds the same sequence
    for c in range(CLASSES):
        os.makedirs(os.path.join(folder, f"class{c}"))
    for i, (jpg, label) in enumerate(data):
        rel = f"class{label}/img{i:06d}.jpg"
        with open(os.path.join(folder, rel), "wb") as f:
            f.write(jpg)
        order.append((rel, jpg, label))
    order.sort(key=lambda t: (t[2], t[0]))
    tars = os.path.join(root, "tars")
    os.makedirs(tars)
    for k in range(0, len(order), per_tar):
        with tarfile.open(os.path.join(tars, f"train-{k // per_tar:06d}.tar"), "w") as tar:
            for rel, jpg, label in order[k:k + per_tar]:
                key = rel.replace("/", "_").rsplit(".", 1)[0]
                for suffix, payload in (("jpg", jpg), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{key}.{suffix}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    with open(os.path.join(tars, "classes.json"), "w") as f:
        json.dump([f"class{c}" for c in range(CLASSES)], f)
    features = {"image": {"_type": "Image"},
                "label": {"names": [f"class{c}" for c in range(CLASSES)], "_type": "ClassLabel"}}
    schema = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("label", pa.int64())],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    parquet = os.path.join(root, "train.parquet")
    table = pa.table({"image": [{"bytes": jpg, "path": None} for _, jpg, _ in order],
                      "label": [label for _, _, label in order]}, schema=schema)
    pq.write_table(table, parquet, row_group_size=100)
    return {"folder": folder, "webdataset": tars, "parquet": parquet}


def _warm_list(root: str, sources: dict) -> str:
    """A file list of the folder's first 20 images."""
    path = os.path.join(root, "warm.csv")
    names = sorted(os.listdir(os.path.join(sources["folder"], "class0")))[:20]
    with open(path, "w") as f:
        f.writelines(f"class0/{n},0\n" for n in names)
    return path


def main() -> None:
    import shardkit

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--per-tar", type=int, default=500)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved runs of each source")
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args()
    lines = []
    with tempfile.TemporaryDirectory() as root:
        sources = make_sources(root, args.images, args.width, args.height, args.per_tar)
        # Warm-up: the first pack of a process imports the resize kernel (torch) and the codecs;
        # none of the timed runs may pay for that.
        shardkit.pack(sources["folder"], os.path.join(root, "warm.lmdb"), size=args.size,
                      workers=args.workers, progress=False, file_list=_warm_list(root, sources))
        times: dict[str, list[float]] = {name: [] for name in sources}
        for round_ in range(args.rounds):  # interleaved, so load from elsewhere hits all alike
            for name, src in sources.items():
                out = os.path.join(root, f"{name}-{round_}.lmdb")
                t0 = time.perf_counter()
                result = shardkit.pack(src, out, size=args.size, workers=args.workers,
                                       progress=False)
                times[name].append(time.perf_counter() - t0)
                assert result.count == args.images, (name, result.count, result.skipped[:3])
                os.remove(out)  # single-file stores: keep the disk's page cache for the sources
        best = {name: min(t) for name, t in times.items()}
        for name, t in times.items():
            lines.append(f"{name:10s} {args.images} images: best {best[name]:6.2f} s = "
                         f"{args.images / best[name]:7.1f} images/s (whole call); runs "
                         + ", ".join(f"{x:.2f}" for x in t) + " s")
        for name in ("webdataset", "parquet"):
            lines.append(f"{name} / folder (best of {args.rounds}): "
                         f"{best['folder'] / best[name]:.2f}x (target >= 0.9x)")
    header = (f"pack_sources: {args.images} JPEGs {args.width}x{args.height} -> size "
              f"{args.size}, workers {args.workers or 'default'}, {os.cpu_count()} CPUs, "
              f"{platform.python_version()}, shardkit {shardkit.__version__}")
    emit([header, *lines], args.out)


if __name__ == "__main__":
    main()
