"""Open and fully read (``verify=True``) each store given (test_reliability_corrupt).

argv: STORE... Prints a JSON object ``{store: "ok" or "refused: <ShardkitError message>"}``.
"""

import json
import sys


def main(argv: list[str]) -> None:
    from shardkit import ShardDataset, ShardkitError

    out = {}
    for path in argv:
        try:
            ds = ShardDataset(path, verify=True)
            [ds[i] for i in range(len(ds))]
            ds.targets
            out[path] = "ok"
        except ShardkitError as e:
            out[path] = f"refused: {e}"
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
