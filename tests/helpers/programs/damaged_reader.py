"""Reads every store named on stdin, as a user would, and prints one JSON line per store.

Run by the damaged-store tests (``helpers.damage.run_batch``), with the per-store time limit in
seconds as its argument. Each line is printed *before* the next store is read, so
when this process dies the parent knows exactly which store killed it.
"""

import contextlib
import hashlib
import io
import json
import resource
import signal
import sys
import traceback


from helpers.digests import digest as image_digest
from shardkit import ShardDataset, StoreError
from shardkit.cli import main as cli_main


def digest(path):
    ds = ShardDataset(path, output="numpy", verify=True)
    try:
        h = hashlib.sha256()
        h.update(json.dumps([ds.classes, sorted(ds.class_to_idx.items()), len(ds),
                             [int(t) for t in ds.targets]]).encode())
        singles = []
        for i in range(len(ds)):
            img, label = ds[i]
            d = image_digest(img)
            singles.append(d)
            h.update(json.dumps([i, d, list(img.shape), int(label),
                                 ds.source_path(i)]).encode())
        batch = ds.__getitems__(list(range(len(ds))))
        for i, (img, label) in enumerate(batch):
            d = image_digest(img)
            if d != singles[i]:
                return None, f"batch read of {i} differs from single read"
        return h.hexdigest(), None
    finally:
        ds.close()


def unverified(path):
    """verify=False: damaged bytes may decode to other pixels (the README says so), but each
    read returns an image or raises StoreError, on the single and the batched path."""
    for crop in (None, 16):
        ds = ShardDataset(path, output="numpy", crop=crop)
        try:
            for i in range(len(ds)):
                try:
                    ds[i]
                except StoreError:
                    pass
            try:
                ds.__getitems__(list(range(len(ds))))
            except StoreError:
                pass
        finally:
            ds.close()


def main(argv: list[str]) -> None:
    # A damaged record must be refused, not decoded into gigabytes: such a request fails here.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.RLIM_INFINITY))
    for line in sys.stdin:
        path = line.rstrip("\n")
        res = {"path": path}
        # A store that hangs the reader ends this process by SIGALRM (even inside C code).
        signal.alarm(int(argv[0]))
        try:
            res["digest"], problem = digest(path)
            if problem:
                res["bad"] = problem
        except StoreError as exc:  # nothing else: the README promises StoreError
            res["error"] = f"{type(exc).__name__}: {exc}"[:400]
        except BaseException:
            res["bad"] = "ShardDataset: " + traceback.format_exc()[-2000:]
        try:
            unverified(path)
        except StoreError:
            pass
        except BaseException:
            res["bad"] = "ShardDataset(verify=False): " + traceback.format_exc()[-2000:]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                res["verify_rc"] = cli_main(["verify", "--quiet", path])
            res["verify_msg"] = err.getvalue()[-400:]
        except BaseException:
            res["bad"] = "shardkit verify: " + traceback.format_exc()[-2000:]
        signal.alarm(0)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
