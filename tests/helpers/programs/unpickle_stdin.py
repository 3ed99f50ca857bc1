"""Unpickle stdin: shows that a pickled payload really runs when loaded
(test_reliability_corrupt)."""

import pickle
import sys


def main(argv: list[str]) -> None:
    pickle.loads(sys.stdin.buffer.read())


if __name__ == "__main__":
    main(sys.argv[1:])
