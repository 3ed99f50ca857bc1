"""``shardkit pack --dedup`` (its flags and summary) and ``shardkit dedup A B`` (near-duplicates
between two stores: train/test leakage), over :mod:`shardkit.dedup`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .dedup import DEFAULT_THRESHOLD, DUPLICATE, MODES


def pack_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"dedup": args.dedup, "dedup_threshold": args.dedup_threshold}


def add_pack_flags(p: Any) -> None:
    p.add_argument("--dedup", choices=MODES, default=None,
                   help="skip duplicates of a record already packed: exact (same pixels) or "
                   "near (perceptual hash); every pair listed in OUT.dedup.json")
    p.add_argument("--dedup-threshold", type=int, default=None, metavar="BITS",
                   help=f"--dedup near: the largest Hamming distance of a pair "
                   f"[{DEFAULT_THRESHOLD}]")


def report_left_out(result: Any) -> None:
    """Print what a pack left out: unusable files (the first 20), then its duplicates' count."""
    found = result.dedup
    dropped = found["dropped"] if found is not None else 0
    skipped = [s for s in result.skipped if not (found and s["reason"].startswith(DUPLICATE))]
    if skipped:
        print(f"skipped {len(skipped)} unusable file{'s' if len(skipped) != 1 else ''} "
              "(listed in the store's metadata):", file=sys.stderr)
        for item in skipped[:20]:
            print(f"  {item['path']!r}: {item['reason']}", file=sys.stderr)
        if len(skipped) > 20:
            print(f"  ... and {len(skipped) - 20} more ('shardkit info --json' lists them)",
                  file=sys.stderr)
    if found is not None:
        within = f" within {found['threshold']} bits" if "threshold" in found else ""
        print(f"dedup {found['mode']}: {dropped} duplicate{'s' if dropped != 1 else ''}"
              f"{within} skipped (listed in the store's metadata), each pair in "
              f"{found['report']}", file=sys.stderr)


def add_parsers(sub: Any) -> None:
    add_pack_flags(sub.choices["pack"])
    p = sub.add_parser("dedup", help="list near-duplicates between two stores (train/test "
                       "leakage)", description="Decode every record of A and B, hash each "
                       "(pHash) and print each pair of a record of A and one of B within the "
                       "threshold: path in A, path in B, distance.")
    p.add_argument("a", metavar="A", help="a store (e.g. the training set)")
    p.add_argument("b", metavar="B", help="another store (e.g. the validation set)")
    p.add_argument("--threshold", type=int, default=DEFAULT_THRESHOLD, metavar="BITS",
                   help=f"the largest Hamming distance of a pair [{DEFAULT_THRESHOLD}]")
    p.add_argument("--json", action="store_true", help="print JSON")


def cmd_dedup(args: argparse.Namespace) -> int:
    from .dedup.leaks import leaks
    from .errors import OptionError

    try:
        pairs = leaks(args.a, args.b, args.threshold)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    if args.json:
        print(json.dumps(pairs, indent=1, ensure_ascii=False))
    else:
        for pair in pairs:
            print(f"{pair['a']}\t{pair['b']}\t{pair['distance']}")
    print(f"{len(pairs)} pair{'s' if len(pairs) != 1 else ''} within {args.threshold} bits",
          file=sys.stderr)
    return 0


COMMANDS = {"dedup": cmd_dedup}
