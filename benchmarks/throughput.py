#!/usr/bin/env python
"""DataLoader throughput benchmark: ImageFolder+PIL against ShardDataset (``shardkit bench``).

    python benchmarks/throughput.py --sample 2000            # generate photo-like images
    python benchmarks/throughput.py /data/imagenet-subset --recommend
    python benchmarks/throughput.py --memory-records 1000000 # worker memory over a big store

The benchmark is :mod:`shardkit.bench` (``--help`` lists the options), which reports numbers;
this script then judges the project's acceptance targets from the report it wrote
(``benchmarks/targets.py``: "target: ... met"), printed and added to ``throughput.txt``.
"""

from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    from shardkit.bench import build_parser, main
except ImportError:  # run from a source checkout without installing
    sys.path.insert(0, os.path.join(HERE, ".."))
    from shardkit.bench import build_parser, main
sys.path.insert(0, HERE)
from targets import judge  # noqa: E402  (beside this script)


def run(argv: list[str]) -> int:
    started = time.time()
    rc = main(argv, prog="python benchmarks/throughput.py")
    args = build_parser().parse_args(argv)
    name = "memory" if args.memory_records is not None else "throughput"
    report = os.path.join(args.out_dir, f"{name}.json")
    if not os.path.exists(report) or os.path.getmtime(report) < started:
        return rc  # the benchmark stopped before writing its report
    with open(report) as f:
        lines = judge(json.load(f))
    if lines:
        print("\n".join(lines))
        if name == "throughput":
            with open(os.path.join(args.out_dir, "throughput.txt"), "a") as f:
                f.write("\n".join(lines) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
