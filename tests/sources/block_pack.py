"""``shardkit`` CLI whose encoding of one container member never finishes, so a test can kill
a pack from tars at a known point: ``BLOCK_TAR`` names the tar; the first of its members an
encoding worker starts on blocks, after appending ``block PID`` to the file ``BLOCK_EVENTS``.
Forked encoding workers inherit the patch. argv: the CLI's arguments."""

import os
import sys
import time

from shardkit.packing import workers

_encode_file = workers.encode_file


def _blocking(item, settings):
    if not isinstance(item, str) and item.file.endswith(os.environ["BLOCK_TAR"]):
        with open(os.environ["BLOCK_EVENTS"], "a") as f:
            f.write(f"block {os.getpid()}\n")
        while True:
            time.sleep(0.05)
    return _encode_file(item, settings)


workers.encode_file = _blocking

if __name__ == "__main__":
    from shardkit.cli import main

    sys.exit(main(sys.argv[1:]))
