"""``shardkit`` CLI in a 2 GiB address space (test_bomb_is_refused_before_decoding): a check
that decoded a bomb before refusing it would run out of memory here.

argv: the CLI's arguments.
"""

import resource
import sys


def main(argv: list[str]) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
    from shardkit.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
