"""Leave a thread-engine epoch mid-way and exit (``tests/integrations/test_thread_engine.py``).

argv: STORE MODE. MODE ``exit-mid-epoch``: keep the iterator (its threads busy on the next
batches) and end the script; ``drop-then-exit``: drop the loader first. A slow per-sample
transform keeps the threads inside batches. Prints one JSON line: whether a thread was inside
a batch when the loop left, and how many loader threads were alive at the end of the script.
"""

import json
import sys
import threading
import time
import warnings

STARTED = threading.Event()


def slow(img):
    if threading.current_thread().name.startswith("shardkit-loader"):
        STARTED.set()
    time.sleep(0.01)  # keeps the threads busy when the script ends (no timing is asserted)
    return img


def main(path: str, mode: str) -> None:
    import shardkit

    warnings.simplefilter("ignore")  # the per-sample transform's note
    ds = shardkit.ShardDataset(path, crop=32, transform=slow)
    loader = ds.loader(batch_size=8, engine="threads", num_threads=3, prefetch=6)
    it = iter(loader)
    next(it)
    busy = STARTED.wait(60)
    if mode == "drop-then-exit":
        del it, loader
    alive = sum(t.name.startswith("shardkit-loader") for t in threading.enumerate())
    print(json.dumps({"busy": busy, "threads": alive}), flush=True)
    globals()["kept"] = locals().get("it")  # exit-mid-epoch: alive until interpreter exit


if __name__ == "__main__":
    main(*sys.argv[1:])
