"""Finish a sharded pack on a small disk filled to a few free pages (test_pack_errors'
test_disk_full_while_finishing_a_sharded_pack). Runs with a small tmpfs mounted on DISK.

Shards finished by two "nodes" (PRISTINE/partial) are copied there, the disk is filled up to
0-3 free pages, then the pack is finished (pack --resume, or merge; over an existing store
PRISTINE/old, or installing a finalized one): it fails with one line, or succeeds; once space is
freed the same call must succeed. argv: SRC, DISK, PRISTINE. Prints a JSON list of trials.
"""

import errno
import json
import os
import shutil
import subprocess
import sys


def main(argv: list[str]) -> None:
    from shardkit import PackError
    from shardkit.packing.api import merge, pack
    from shardkit.packing.staging import finalize_sharded
    from shardkit.read.inspect import verify

    src, disk, pristine = argv
    out, partial, filler = (os.path.join(disk, n) for n in ("out", ".out.partial", "filler"))
    KW = dict(num_shards=3, size=0, encoding="raw", workers=1, progress=False)
    PAGE = os.sysconf("SC_PAGE_SIZE")

    def reset(mode):
        for path in (out, partial, filler):
            subprocess.run(["rm", "-rf", path], check=True)
        shutil.copytree(os.path.join(pristine, "partial"), partial)
        if mode in ("pack-overwrite", "install"):
            shutil.copytree(os.path.join(pristine, "old"), out)
        if mode == "install":  # finalized by a run whose install failed: merge installs it
            finalize_sharded(partial)

    def fill(free_pages):
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * PAGE)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - free_pages * PAGE))
        os.close(fd)

    def finish(mode):
        overwrite = mode != "pack" and mode != "merge"
        if mode.startswith("pack"):
            return pack(src, out, resume=True, overwrite=overwrite, **KW)
        return merge(out, overwrite=overwrite)

    def cli(mode):
        cmd = [sys.executable, "-m", "shardkit.cli"]
        cmd += (["pack", src, out, "--num-shards", "3", "--size", "0", "--encoding", "raw",
                 "--workers", "1", "-q", "--resume"] if mode == "pack" else ["merge", out])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        return {"rc": proc.returncode, "stderr": proc.stderr}

    def state():
        if not os.path.exists(out):
            return None
        report = verify(out)
        return {"ok": report.ok, "records": report.records,
                "shards": [[e["file"], e["sha256"]] for e in json.load(
                    open(os.path.join(out, "manifest.json")))["shards"]]}

    trials = []
    for mode in ("pack", "pack-overwrite", "merge", "install"):
        for free in range(4):
            reset(mode)
            fill(free)
            trial = {"mode": mode, "free": free, "error": None}
            try:
                finish(mode)
            except PackError as exc:
                trial["error"] = str(exc)
            trial["after_error"] = state()
            if free == 0 and mode in ("pack", "merge"):
                reset(mode)
                fill(free)
                trial["cli"] = cli(mode)
            os.unlink(filler)
            if trial["error"] is not None or "cli" in trial:
                finish(mode)  # with space again: completes from what the failed run left
            trial["final"] = state()
            trials.append(trial)
    print(json.dumps(trials))


if __name__ == "__main__":
    main(sys.argv[1:])
