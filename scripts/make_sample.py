#!/usr/bin/env python
"""Make a sample ImageFolder tree of photo-like JPEGs (ImageNet-like sizes and encodings).

The generator lives in ``shardkit.bench.sample`` (see its docstring for what the images look like).
Without ``--seed``, the seed comes from OUT_DIR's absolute path, so two folders (train, val) get
different images and remaking one folder gives the same images.

    python scripts/make_sample.py OUT_DIR --count 2000 --classes 10
"""

from __future__ import annotations

import argparse
import os
import sys

try:
    from shardkit.bench.sample import image_size, make_sample, path_seed, photo_like  # noqa: F401
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from shardkit.bench.sample import image_size, make_sample, path_seed, photo_like  # noqa: F401

__all__ = ["image_size", "main", "make_sample", "photo_like"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder to create (OUT/<class>/<image>.JPEG)")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None,
                        help="random seed (default: derived from OUT's absolute path, so "
                             "different folders get different images and the same folder the "
                             "same images)")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    args = parser.parse_args(argv)
    seed = path_seed(args.out) if args.seed is None else args.seed
    make_sample(args.out, args.count, args.classes, seed, args.workers)
    print(f"wrote {args.count} images in {args.classes} classes to {args.out} (seed {seed})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
