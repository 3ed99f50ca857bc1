"""``shardkit`` CLI in which reading one source blocks forever: a frozen pack, stopped on cue.

The source whose path ends with ``$SHARDKIT_TEST_BLOCK`` never finishes encoding, so a test can
kill or interrupt the pack at a known point without timing races. The patch sits at module level:
the packer's forkserver preloads ``__main__``, so pool workers get it too.
"""

import os
import sys
import time

import shardkit.packer as packer

_BLOCK = os.environ["SHARDKIT_TEST_BLOCK"]
_encode_file = packer.encode_file


def _blocking_encode_file(path, settings):
    while path.endswith(_BLOCK):
        time.sleep(0.05)
    return _encode_file(path, settings)


packer.encode_file = _blocking_encode_file

if __name__ == "__main__":
    from shardkit.cli import main

    sys.exit(main(sys.argv[1:]))
