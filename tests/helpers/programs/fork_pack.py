"""Pack with two workers from a fresh single-threaded process, which must fork them
(test_pack_with_another_thread_running_spawns_workers_and_same_records).

argv: SRC, OUT.
"""

import sys


def main(argv: list[str]) -> None:
    from shardkit.packing.api import pack
    from shardkit.packing.workers import start_method

    assert start_method() == "fork"
    pack(argv[0], argv[1], workers=2, progress=False)


if __name__ == "__main__":
    main(sys.argv[1:])
