"""Open and fully read each store named on stdin, as a user would (test_reliability_kill).

Prints one JSON line per store as soon as it is read: ``digest`` (classes, labels and every
pixel, read with ``verify=True``) or ``error`` (the ShardkitError), and ``verify_rc`` (the exit
status of ``shardkit verify``).
"""

import contextlib
import hashlib
import io
import json
import sys


def main(argv: list[str]) -> None:
    import numpy as np

    from shardkit import ShardDataset, ShardkitError
    from shardkit.cli import main as cli_main

    for line in sys.stdin:
        path = line.rstrip("\n")
        res = {"path": path}
        try:
            ds = ShardDataset(path, output="numpy", verify=True)
            h = hashlib.sha256(json.dumps([ds.classes, [int(t) for t in ds.targets]]).encode())
            for i in range(len(ds)):
                img, label = ds[i]
                h.update(np.ascontiguousarray(img).tobytes() + str(int(label)).encode())
            res["digest"] = h.hexdigest()
            ds.close()
        except ShardkitError as exc:
            res["error"] = str(exc)[:300]
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            res["verify_rc"] = cli_main(["verify", "--quiet", path])
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
