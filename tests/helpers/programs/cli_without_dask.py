"""``shardkit`` CLI in a process where ``import dask`` fails, as where dask is not installed
(test_dask_not_installed_message).

argv: the CLI's arguments.
"""

import sys


def main(argv: list[str]) -> int:
    sys.modules["dask"] = None
    sys.modules["dask.distributed"] = None
    from shardkit.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
