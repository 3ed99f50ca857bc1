"""Read a store over and over while another process replaces it (test_reliability_readers).

argv: STORE, REFS (JSON ``{"A": [sha256 per record], "B": [...]}``), STOP. Loops until the file
STOP exists; creates ``STOP.ready`` after the first full read. Prints JSON counts of reads that
matched version A, version B, a mix ("mixed"), stores refused as replaced since creation, and the
messages of any other ShardkitError.
"""

import hashlib
import json
import os
import sys


def main(argv: list[str]) -> None:
    from shardkit import ShardDataset, ShardkitError

    path, refs, stop = argv[0], json.loads(argv[1]), argv[2]
    counts = {"A": 0, "B": 0, "mixed": 0, "replaced": 0, "errors": []}
    ready = False
    while not os.path.exists(stop):
        try:
            ds = ShardDataset(path, output="bytes")
            try:
                ds.open()  # the first use pins the store, or refuses one replaced since creation
            except ShardkitError as exc:
                if "was replaced" not in str(exc):
                    raise
                counts["replaced"] += 1
                continue
            got = [hashlib.sha256(ds[i][0]).hexdigest() for i in range(len(ds))]
            ds.close()
        except ShardkitError as exc:
            counts["errors"].append(str(exc))
            continue
        for v in ("A", "B"):
            if got == refs[v]:
                counts[v] += 1
                break
        else:
            counts["mixed"] += 1
        if not ready:
            ready = True
            open(stop + ".ready", "w").close()
    print(json.dumps(counts))


if __name__ == "__main__":
    main(sys.argv[1:])
