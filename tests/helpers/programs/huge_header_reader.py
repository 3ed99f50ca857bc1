"""Read record 0 of a store every way within a 2 GiB address space (test_reliability_corrupt).

argv: STORE. Prints a JSON list: for each of four dataset settings, reading ``ds[0]`` and the
batch ``[1, 0]``, either ``"read"`` or the StoreError message.
"""

import json
import resource
import sys


def main(argv: list[str]) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.RLIM_INFINITY))
    from shardkit import ShardDataset, StoreError

    out = []
    for kwargs in ({}, {"output": "numpy"}, {"output": "pil"}, {"crop": 16}):
        ds = ShardDataset(argv[0], **kwargs)
        for read in (lambda: ds[0], lambda: ds.__getitems__([1, 0])):
            try:
                read()
                out.append("read")
            except StoreError as exc:
                out.append(str(exc))
        ds.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
