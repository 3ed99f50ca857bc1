"""Pack a folder and report what came out, under any interpreter with shardkit (test_pillow_simd:
run under pillow-simd's and under this environment's, then compared).

argv: SRC, OUT, encoding. Prints one JSON object: Pillow's version, which of pillow/pillow-simd
is installed, the record count, skipped paths (relative to SRC), labels, source paths and a
digest of every record's pixels.
"""

import hashlib
import importlib.metadata as md
import json
import sys


def main(argv: list[str]) -> None:
    import PIL

    import shardkit
    from shardkit import ShardDataset

    names = {d.metadata["Name"].lower() for d in md.distributions()}
    src, out, encoding = argv
    result = shardkit.pack(src, out, workers=2, progress=False, encoding=encoding)
    ds = ShardDataset(out, output="numpy")
    items = [ds[i] for i in range(len(ds))]
    print(json.dumps({
        "pil_version": PIL.__version__,
        "dists": sorted(names & {"pillow", "pillow-simd"}),
        "count": result.count,
        "skipped": sorted(s["path"][len(src):] for s in result.skipped),
        "labels": [int(label) for _, label in items],
        "sources": [ds.source_path(i) for i in range(len(ds))],
        "digests": [hashlib.sha256(img.tobytes()).hexdigest() for img, _ in items],
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
