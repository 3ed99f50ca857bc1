"""``shardkit`` CLI whose format writers fail like a full disk once ~1 MiB is written
(test_full_disk_injected_enospc). It patches the writers' ``append``, nothing else.

argv: the CLI's arguments.
"""

import errno
import sys

LIMIT = 1 << 20


def main(argv: list[str]) -> int:
    from shardkit.cli import main as cli_main
    from shardkit.formats import WRITERS

    for cls in WRITERS.values():
        def make(orig):
            def append(self, data):
                self._written = getattr(self, "_written", 0) + len(data)
                if self._written > LIMIT:
                    raise OSError(errno.ENOSPC, "No space left on device")
                return orig(self, data)
            return append
        cls.append = make(cls.append)
    sys.argv[0] = "shardkit"
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
