"""Read a store one step at a time, as told over stdin (test_reliability_readers).

argv: STORE. Each stdin line is a command; each gets exactly one JSON line on stdout, sent once
the step is done, so the test knows where the reader stands before it replaces the store:

* ``create``: a new ``ShardDataset(STORE, output="bytes")`` (metadata only; the last is closed)
* ``open``: its first use (pins the store) -> ``{"ok": true}`` or ``{"refused": message}``
* ``read A B``: records ``A..B-1`` -> ``{"sha256": [...], "labels": [...]}``
* ``close``: closes it; ``exit``: ends the program
Any ShardkitError is answered ``{"error": message}``.
"""

import hashlib
import json
import sys


def main(argv: list[str]) -> None:
    from shardkit import ShardDataset, ShardkitError

    path = argv[0]
    ds = None

    def answer(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        command, *args = line.split()
        try:
            if command == "create":
                if ds is not None:
                    ds.close()
                ds = ShardDataset(path, output="bytes")
                answer({"ok": True, "len": len(ds)})
            elif command == "open":
                try:
                    ds.open()
                except ShardkitError as exc:
                    answer({"refused": str(exc)})
                    continue
                answer({"ok": True})
            elif command == "read":
                items = [ds[i] for i in range(int(args[0]), int(args[1]))]
                answer({"sha256": [hashlib.sha256(data).hexdigest() for data, _ in items],
                        "labels": [int(label) for _, label in items]})
            elif command == "close":
                ds.close()
                ds = None
                answer({"ok": True})
            elif command == "exit":
                answer({"ok": True})
                return
            else:
                answer({"error": f"unknown command {command!r}"})
        except ShardkitError as exc:
            answer({"error": str(exc)})


if __name__ == "__main__":
    main(sys.argv[1:])
