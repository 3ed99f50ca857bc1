"""``shardkit log`` and ``shardkit gc``: a folder store's versions (:mod:`shardkit.versions`),
listed and pruned."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("log", help="list a folder store's versions (time, records, change)")
    p.add_argument("store", metavar="STORE",
                   help="a folder store, local or at a URL (s3://bucket/prefix)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("update", help="a folder store's next version with records deleted, "
                       "relabelled or replaced (no shard rewritten)")
    p.add_argument("store", metavar="STORE",
                   help="a folder store, local or at a URL (s3://bucket/prefix)")
    p.add_argument("--delete", metavar="FILE", help="keys to remove, one per line")
    p.add_argument("--set-labels", metavar="FILE",
                   help="CSV (TSV: .tsv) of key,label rows: new class names for those records")
    p.add_argument("--replace", metavar="SRC",
                   help="a source folder: its files with the store's keys replace those records")
    p.add_argument("--relabel", action="store_true",
                   help="number the classes as a fresh pack would (sorted by name, as "
                   "ImageFolder): an append adds new classes after the store's")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p = sub.add_parser("map", help="add a field computed from a folder store's records as its "
                       "next version", description="Compute field NAME with FN (module:function, "
                       "called with each batch; one value per record) and install it as the "
                       "store's next version (shardkit.add_field).")
    p.add_argument("store", metavar="STORE",
                   help="a folder store, local or at a URL (s3://bucket/prefix)")
    p.add_argument("name", metavar="NAME", help="the new field's name")
    p.add_argument("fn", metavar="FN", help="module:function, e.g. mymodels:embed")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="records a batch [64]")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="loader worker processes [0]")
    p.add_argument("--crop", type=int, default=None, metavar="PX",
                   help="centre crop the images to PX x PX before FN sees them")
    p.add_argument("--overwrite", action="store_true",
                   help="compute every record again (else only those without a value)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p = sub.add_parser("compact", help="rewrite a folder store's live records into new shards "
                       "as its next version (deleted and replaced records dropped)")
    p.add_argument("store", metavar="STORE",
                   help="a folder store, local or at a URL (s3://bucket/prefix)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p = sub.add_parser("gc", help="drop a folder store's old versions and the files only they "
                       "use", description="Keep the newest K versions (the current one always) "
                       "and delete the files no kept version names, once no reader holds them. "
                       "At a URL: under the prefix's lock (refused while another writer holds "
                       "it), only objects that a dropped version names; a reader of a dropped "
                       "version there loses its files at once.")
    p.add_argument("store", metavar="STORE",
                   help="a folder store, local or at a URL (s3://bucket/prefix)")
    p.add_argument("--keep", type=int, required=True, metavar="K",
                   help="how many of the newest versions to keep (>= 1)")


def _change(change: dict[str, Any]) -> str:
    kind = change.get("kind", "pack")
    rest = ", ".join(f"{k} {v}" for k, v in sorted(change.items()) if k != "kind")
    return f"{kind} ({rest})" if rest else kind


def cmd_log(args: argparse.Namespace) -> int:
    from .storelog import history

    kept = history(args.store)
    if args.json:
        print(json.dumps([v.__dict__ for v in kept], indent=2))
        return 0
    for v in kept:
        print(f"{v.number:>4}  {v.time or '-':20}  {v.count:>10} records  {v.shards:>6} shards  "
              f"{_change(v.change)}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from .errors import OptionError
    from .storelog import gc

    try:
        dropped = gc(args.store, args.keep)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    print(f"dropped {len(dropped)} version{'s' if len(dropped) != 1 else ''}"
          + (f" ({', '.join(map(str, dropped))})" if dropped else ""), file=sys.stderr)
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    from .packing.update import update

    done = update(args.store, delete=args.delete, set_labels=args.set_labels,
                  replace=args.replace, relabel=args.relabel,
                  **({"progress": False} if args.quiet else {}))
    print(f"{done.out}: version {done.version}, {done.count} records ({done.deleted} deleted, "
          f"{done.relabelled} relabelled, {done.replaced} replaced"
          + (f", {done.reordered} classes renumbered" if args.relabel else "") + ")",
          file=sys.stderr)
    return 0


def check_relabel(args: argparse.Namespace) -> None:
    """``shardkit pack --relabel`` comes with ``--append`` (before any work)."""
    if args.relabel and not args.append:
        from .errors import OptionError

        raise OptionError("--relabel numbers an appended store's classes afresh: give it with "
                          "--append (or run `shardkit update OUT --relabel`)")


def relabel_after_append(out: str) -> None:
    """``shardkit pack --append --relabel``: the appended store's classes numbered as a fresh
    pack would, as its next version (nothing to do when they already are)."""
    from .packing.update import update

    done = update(out, relabel=True)
    print(f"{done.out}: " + (f"version {done.version}, {done.reordered} classes renumbered in "
                             "name order" if done.reordered else "classes already in name order"),
          file=sys.stderr)


def cmd_map(args: argparse.Namespace) -> int:
    import importlib

    from .errors import OptionError
    from .mapping import add_field

    module, _, name = args.fn.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise OptionError(f"fn: cannot load {args.fn!r} (module:function): {exc}") from None
    done = add_field(args.store, args.name, fn, batch_size=args.batch_size,
                     workers=args.workers, overwrite=args.overwrite, progress=not args.quiet,
                     **({"crop": args.crop} if args.crop else {}))
    print(f"{done.out}: version {done.version}, field {done.field!r} ({done.computed} records "
          f"computed{f', {done.resumed} kept from an interrupted run' if done.resumed else ''})",
          file=sys.stderr)
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from .compaction import compact

    done = compact(args.store, progress=not args.quiet)
    print(f"{done.out}: version {done.version}, {done.count} records in {done.shards} shards "
          f"({done.dropped} dropped)", file=sys.stderr)
    return 0


COMMANDS = {"log": cmd_log, "gc": cmd_gc, "update": cmd_update, "map": cmd_map,
            "compact": cmd_compact}
