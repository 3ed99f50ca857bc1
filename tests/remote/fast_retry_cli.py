"""``shardkit`` CLI whose remote calls retry 50 ms apart (``access.RETRY_DELAYS``, 1 s and 2 s
by default), for tests of what a call that fails every attempt reports: the same attempts and
messages, without the waits. argv: the CLI's arguments."""

import sys

from shardkit.remote import access

access.RETRY_DELAYS = (0.05, 0.05)

if __name__ == "__main__":
    from shardkit.cli import main

    sys.exit(main(sys.argv[1:]))
