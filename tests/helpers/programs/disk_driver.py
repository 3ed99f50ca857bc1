"""Pack onto a small disk and report what is left (test_reliability_kill's full-disk tests).

Runs inside the small filesystem (or with writers that raise ENOSPC). argv: BIG source, SMALL
source, DISK folder, ``1`` to use ``helpers.programs.enospc_cli`` instead of the real CLI. For
each format, packs BIG as one file and as 3 shards, then packs SMALL (in this process) and
overwrites it with BIG;
prints JSON per case: exit status, stderr, the disk's listing, whether the partial output opens,
how many shards it holds finished, and (overwrite) whether the old store still verifies.
"""

import json
import os
import subprocess
import sys


def main(argv: list[str]) -> None:
    big, small, disk, inject = argv
    module = "helpers.programs.enospc_cli" if inject == "1" else "shardkit.cli"
    prefix = [sys.executable, "-m", module]
    report = {}

    def pack(src, out, fmt, *extra):
        cmd = prefix + ["pack", src, out, "--format", fmt, "--size", "0", "--encoding", "raw",
                        "--workers", "2", "-q", *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return p.returncode, p.stderr

    def listing():
        return sorted(os.listdir(disk))

    import shardkit
    from shardkit import ShardDataset, ShardkitError
    from shardkit.read.inspect import verify
    for fmt in ("lmdb", "hdf5"):
        for shards in ([], ["--num-shards", "3"]):
            out = os.path.join(disk, "out")
            rc, err = pack(big, out, fmt, *shards)
            partial = os.path.join(disk, ".out.partial")
            try:
                ShardDataset(partial)
                partial_opens = True
            except ShardkitError:
                partial_opens = False
            done = sorted(n for n in os.listdir(partial) if n.endswith(".done.json")) \
                if os.path.isdir(partial) else []
            report[f"{fmt}{shards}"] = {"rc": rc, "stderr": err, "listing": listing(),
                                        "partial_opens": partial_opens, "done": len(done)}
            subprocess.run(["rm", "-rf", out, partial])
        # An existing store survives a failed --overwrite.
        try:  # the old store, packed here (no CLI start: it is not what is tested)
            shardkit.pack(small, os.path.join(disk, "old"), format=fmt, size=0, encoding="raw",
                          workers=1, progress=False)
            rc0, err0 = 0, ""
        except ShardkitError as exc:
            rc0, err0 = 1, str(exc)
        rc, err = pack(big, os.path.join(disk, "old"), fmt, "--overwrite")
        rep = verify(os.path.join(disk, "old"))
        report[f"{fmt}-overwrite"] = {"rc0": rc0, "err0": err0, "rc": rc, "stderr": err,
                                      "old_ok": rep.ok, "old_records": rep.records,
                                      "listing": listing()}
        subprocess.run(["rm", "-rf", os.path.join(disk, "old")])
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
