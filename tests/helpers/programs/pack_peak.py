"""Pack with two forked workers and report the workers' peak memory (test_workers).

argv: SRC, OUT, max_pixels. Prints JSON: ``skipped`` (the pack's skipped files) and ``peak``,
the largest peak RSS of the workers in bytes (reaped by now; each started at this process's RSS;
a process's own figure would include its parent's peak: exec keeps it).
"""

import json
import resource
import sys


def main(argv: list[str]) -> None:
    import shardkit

    r = shardkit.pack(argv[0], argv[1], workers=2, max_pixels=int(argv[2]), progress=False)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"skipped": r.skipped, "peak": peak}))


if __name__ == "__main__":
    main(sys.argv[1:])
