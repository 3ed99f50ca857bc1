"""The ``shardkit`` command: a thin argparse layer over the Python API."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Sequence

from . import cli_dedup, cli_exit, cli_versions, formats
from ._version import __version__
from .codec import ENCODINGS
from .errors import Interrupted, ShardkitError
from .packing.imaging import PILLOW_PIXEL_LIMIT
from .packing.sources import SOURCE_FORMATS
from .export import DEFAULT_SHARD_SIZE as EXPORT_SHARD_SIZE, TARGETS as EXPORT_TARGETS
from .packing.settings import ENGINES, ORDERS

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
          "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4,
          "tb": 1000**4, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """'1GiB', '500MB', '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 512MiB, 1GiB, 2GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text}")
    return value


def _buckets(text: str) -> int | str | list[tuple[int, int]]:
    """'1024' -> 1024; 'sdxl', 'kohya': the rule; '768x1344,1024x1024' -> [(768, 1344),
    (1024, 1024)] (height x width)."""
    if re.fullmatch(r"\s*\d+\s*", text):
        return int(text)
    if text.strip() in ("sdxl", "kohya"):
        return text.strip()
    sizes = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", part)
        if not m:
            raise argparse.ArgumentTypeError(f"not a side, a rule or a HEIGHTxWIDTH list: "
                                             f"{text!r} (examples: 1024, sdxl, kohya, "
                                             "768x1344,1024x1024)")
        sizes.append((int(m.group(1)), int(m.group(2))))
    return sizes


_SUFFIXES = " / ".join(formats.SUFFIXES.values())
_LABELS = "/".join(formats.backend(f).label for f in formats.FORMATS)
_SUFFIX_HELP = ", ".join(f"{'/'.join(formats.backend(f).suffixes)} is {formats.backend(f).label}"
                         for f in formats.FORMATS if f != formats.DEFAULT_FORMAT) + \
    f", else {formats.backend(formats.DEFAULT_FORMAT).label}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardkit",
        description=f"Pack image folders into {_LABELS} shards for fast PyTorch data loading.")
    parser.add_argument("--version", action="version", version=f"shardkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("pack", help="pack an image folder (or WebDataset tars, Hugging Face "
                       "parquet, MDS) into a store",
                       description="Decode, resize and re-encode every image in SRC "
                       "(SRC/<class>/<file>, as torchvision's ImageFolder; or WebDataset tars, "
                       "Hugging Face parquet/Arrow, MosaicML MDS: --source-format) into the "
                       "store OUT.")
    p.add_argument("src", metavar="SRC", help="source folder (or root of --file-list paths); a "
                   "tar, brace pattern or folder of tars (also a URL), parquet, MDS folder")
    p.add_argument("out", metavar="OUT", help=f"output store ({_SUFFIXES} file, or a folder "
                   "when sharded; a URL such as s3://bucket/prefix when sharded)")
    p.add_argument("--format", choices=formats.FORMATS,
                   help=f"store format (default: from OUT's suffix; {_SUFFIX_HELP})")
    p.add_argument("--size", type=_positive_int, default=None,
                   help="resize the shorter side to this (never upscale; 0 keeps size) [256]")
    p.add_argument("--buckets", type=_buckets, metavar="SIDE|sdxl|kohya|HxW,...",
                   help="aspect-ratio buckets instead of --size: sides in steps of --bucket-step, "
                   "area at most SIDE x SIDE, ratios within 1:4..4:1 (1024: kohya's "
                   "make_bucket_resolutions with min 512, max 2048, step 64; 33 of SDXL's "
                   "40 sizes); sdxl: SDXL's 40 sizes; kohya: sd-scripts' BucketManager with "
                   "its defaults (resolution 1024, min 256, max 1024); or a list of "
                   "HEIGHTxWIDTH sizes; each image is resized to cover its nearest bucket and "
                   "centre-cropped to it (docs/buckets.md)")
    p.add_argument("--bucket-step", type=_positive_int, default=None, metavar="N",
                   help="bucket sides in steps of N [64]")
    upscale = p.add_mutually_exclusive_group()
    upscale.add_argument("--bucket-upscale", action="store_const", const=True, default=None,
                         help="upscale an image smaller than its bucket (default for SIDE and "
                         "lists: keep its own size cut to multiples of the step, a bucket of "
                         "its own; kohya and sdxl upscale)")
    upscale.add_argument("--bucket-no-upscale", dest="bucket_upscale", action="store_const",
                         const=False, help="never upscale (kohya: sd-scripts' "
                         "--bucket_no_upscale, a bucket per image size)")
    p.add_argument("--min-bucket-count", type=_positive_int, default=None, metavar="N",
                   help="merge each bucket that would hold fewer than N records into its "
                   "nearest bucket (reads every image's header first)")
    p.add_argument("--quality", type=_positive_int, default=None, help="JPEG quality [90]")
    p.add_argument("--encoding", choices=ENCODINGS, default=None,
                   help=f"record encoding: %(choices)s [{ENCODINGS[0]}]")
    p.add_argument("--workers", type=_positive_int, default=None,
                   help="worker processes (default: the CPUs this process may use; 0 or 1 "
                   "packs in-process)")
    p.add_argument("--strict", action="store_true",
                   help="fail (and write nothing) on the first unusable image")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.add_argument("--max-pixels", type=_positive_int, default=PILLOW_PIXEL_LIMIT,
                   help="refuse images declaring more pixels (0: only Pillow's own limit, which "
                   f"this cannot raise) [{PILLOW_PIXEL_LIMIT}]")
    p.add_argument("--allow-empty", action="store_true",
                   help="keep class folders with no images as classes (indices never shift), "
                   "and write a store even when no image could be packed (else an error)")
    p.add_argument("--source-format", choices=SOURCE_FORMATS, default=None,
                   help="what SRC is: %(choices)s (default: detected from its content)")
    p.add_argument("--image-key", metavar="KEYS",
                   help="member suffixes or column of the image, first present wins "
                   "(e.g. 'jpg;png'; default: the format's conventions)")
    p.add_argument("--label-key", metavar="KEY", help="member suffix or column of the label (cls)")
    p.add_argument("--id-key", metavar="KEY", help="column or member whose value keys each record")
    p.add_argument("--file-list", metavar="LIST",
                   help="CSV/TSV of path,label or path,class-name instead of class folders "
                   "(with a header row, further columns become typed fields)")
    p.add_argument("--coco", metavar="JSON",
                   help="COCO instances file (file_names relative to SRC): boxes, labels, "
                   "iscrowd, area, image_id and masks as typed fields")
    p.add_argument("--no-coco-masks", dest="coco_masks", action="store_const", const=False,
                   default=None, help="with --coco: do not pack segmentations as masks")
    p.add_argument("--metadata", metavar="FILE",
                   help="JSON Lines or CSV with a file_name column (relative to SRC): its other "
                   "columns become typed fields")
    p.add_argument("--captions", action="store_true",
                   help="pack <stem>.txt (or <stem>.caption) beside each image as the text "
                   "field 'caption'")
    p.add_argument("--schema", metavar="JSON",
                   help="schema file declaring the fields (default: inferred and printed)")
    p.add_argument("--split", metavar="NAME",
                   help="the split of a Hugging Face imagefolder layout to pack (train/, test/ "
                   "folders...) [train]")
    p.add_argument("--frames", metavar="SPEC", help="SRC holds videos: pack the frames SPEC "
                   "picks ('fps=F', 'every=N', 'keyframes', 'all'), docs/video.md")
    p.add_argument("--shard-size", type=parse_bytes, metavar="BYTES",
                   help="write OUT as a folder of shards of about this size (e.g. 1GiB)")
    p.add_argument("--num-shards", type=_positive_int, metavar="N",
                   help="write OUT as a folder of N shards")
    p.add_argument("--order", choices=ORDERS, default=ORDERS[0],
                   help="record layout of a sharded OUT: mixed (every shard a uniform class "
                   "mix; ds[i] keeps the source order) or source (shards in source order) "
                   "[mixed]")
    p.add_argument("--layout-seed", type=_positive_int, default=0, metavar="N",
                   help="seed of the mixed layout [0]")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted sharded pack, keeping finished shards")
    p.add_argument("--append", action="store_true",
                   help="add the images the folder store OUT lacks (by key: path relative to "
                   "SRC) as its next version")
    p.add_argument("--relabel", action="store_true",
                   help="with --append: then number the classes as a fresh pack would (sorted "
                   "by name), as one more version")
    p.add_argument("--engine", choices=ENGINES, default=ENGINES[0],
                   help="local process pool, or shards as tasks on a Dask cluster [local]")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="Dask scheduler address (default: start a local cluster)")
    p.add_argument("--retries", type=_positive_int, default=None, metavar="N",
                   help="--engine dask: run a shard whose task failed again, up to N times, "
                   "before stopping [3]")
    p.add_argument("--num-nodes", type=_positive_int, default=1,
                   help="static split over N nodes: this run packs its share of the shards")
    p.add_argument("--node-rank", type=_positive_int, default=0, help="this node's rank")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    cache_help = ("local cache of a remote STORE (default: $SHARDKIT_CACHE_DIR, else "
                  "~/.cache/shardkit)")
    p = sub.add_parser("info", help="describe a store")
    p.add_argument("store", metavar="STORE", help="a store file or folder, or a URL")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--cache-dir", metavar="DIR", help=cache_help)

    p = sub.add_parser("verify", help="read and decode every record; exit 1 on any fault")
    p.add_argument("store", metavar="STORE", help="a store file or folder, or a URL")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.add_argument("--cache-dir", metavar="DIR", help=cache_help)

    p = sub.add_parser("merge", help="finish a multi-node pack once every node is done")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")

    p = sub.add_parser("export", help="write a store out as WebDataset tars or Hugging Face "
                       "parquet", description="Write every record of STORE, in the dataset's order, into "
                       "numbered files: WebDataset tars (KEY.jpg + KEY.cls, JPEG records byte "
                       "for byte) or parquet with the Hugging Face Image struct and ClassLabel.")
    p.add_argument("store", metavar="STORE", help="a store file or folder")
    p.add_argument("pattern", metavar="PATTERN",
                   help="output files with the file number as a printf field, e.g. "
                   "'out/train-%%06d.tar'")
    p.add_argument("--to", choices=EXPORT_TARGETS, default="webdataset",
                   help="output format: %(choices)s [%(default)s]")
    p.add_argument("--shard-size", type=parse_bytes, default=EXPORT_SHARD_SIZE, metavar="BYTES",
                   help="start a new file at about this size [1GiB]")
    p.add_argument("--overwrite", action="store_true", help="replace output files that exist")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")

    p = sub.add_parser("bench", help="ImageFolder vs shardkit: images/s, data-wait share, "
                       "memory; --recommend",
                       add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    cli_versions.add_parsers(sub)
    cli_dedup.add_parsers(sub)
    return parser


def _cmd_pack(args: argparse.Namespace) -> int:
    from .packing.api import pack
    from .packing.shortcuts import records
    from .packing.sources.imagefolder import has_layout

    cli_versions.check_relabel(args)
    # The flags build the records pack takes (shardkit.Resize, Shards, Local...); an append
    # takes the image flags given and the store's settings for the rest.
    image = {k: v for k, v in (("size", args.size), ("quality", args.quality),
                               ("encoding", args.encoding), ("buckets", args.buckets),
                               ("bucket_step", args.bucket_step),
                               ("bucket_upscale", args.bucket_upscale),
                               ("min_bucket_count", args.min_bucket_count)) if v is not None}
    asked = records(
        **image, shard_size=args.shard_size,
        num_shards=args.num_shards, order=args.order, layout_seed=args.layout_seed,
        engine=args.engine, workers=args.workers, scheduler=args.scheduler,
        retries=args.retries, num_nodes=args.num_nodes, node_rank=args.node_rank,
        file_list=args.file_list, coco=args.coco, coco_masks=args.coco_masks,
        metadata_file=args.metadata, captions=args.captions,
        source_format=args.source_format, image_key=args.image_key, label_key=args.label_key,
        id_key=args.id_key, split=args.split, frames=args.frames)
    result = pack(args.src, args.out, source=asked.source,
                  **({"image": asked.image} if not args.append else image),
                  shards=asked.shards, engine=asked.engine, format=args.format,
                  schema=args.schema, max_pixels=args.max_pixels, strict=args.strict,
                  overwrite=args.overwrite, allow_empty=args.allow_empty,
                  resume=args.resume, progress=not args.quiet, **cli_dedup.pack_options(args),
                  **({"append": True} if args.append else {}))
    if args.num_nodes > 1:
        print(f"node {args.node_rank}/{args.num_nodes}: packed {result.count} images; run "
              f"'shardkit merge {args.out}' when every node is done", file=sys.stderr)
        return EXIT_OK
    kept = (f", {result.kept_shards} kept from the earlier run" if result.kept_shards else "")
    print(f"packed {result.count} images into {result.out} ({result.shards} shard"
          f"{'s' if result.shards != 1 else ''}{kept}) in {result.seconds:.1f} s: "
          f"{result.startup_seconds:.1f} s start-up (first record at "
          f"{result.first_record_seconds:.1f} s), then {result.images_per_second:.0f} "
          "images/s", file=sys.stderr)
    cli_dedup.report_left_out(result)
    if args.relabel:
        cli_versions.relabel_after_append(result.out)
    if not args.schema and (args.metadata or args.captions or args.file_list or args.split
                            or args.source_format == "imagefolder" or has_layout(args.src)):
        _report_fields(result.out)
    return EXIT_OK


def _report_fields(out: str) -> None:
    """Print the fields a pack inferred (the schema to pass as --schema to pin them)."""
    from .fields import Schema
    from .read.store import Store

    fields = Store(out).meta.get("fields")
    if fields:
        print("fields (inferred; save `shardkit info --json OUT`'s \"fields\" as a --schema file "
              "to fix them):\n" + Schema.from_json(fields).describe(), file=sys.stderr)


def _cmd_info(args: argparse.Namespace) -> int:
    from .read.inspect import info
    from .read.store import Store

    summary = info(args.store, cache_dir=args.cache_dir)
    if args.json:
        summary["skipped_files"] = Store(args.store, cache_dir=args.cache_dir).skipped
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    def shown(names: list[str]) -> str:
        more = f", ... ({len(names)} in all)" if len(names) > 10 else ""
        return f"{len(names)}: " + ", ".join(names[:10]) + more

    # Class folders' names; a COCO store's categories (id and name); neither: no line.
    labels = ""
    if summary["classes"]:
        labels += f"classes:    {shown(summary['classes'])}\n"
    if summary["categories"]:
        ids = [f"{c['id']} {c['name']}" for c in summary["categories"]]
        labels += f"categories: {shown(ids)}\n"
    print(f"store:      {summary['path']}\n"
          f"format:     {summary['format']} ({summary['kind']}, {summary['shards']} shard(s), "
          f"format version {summary['format_version']})\n"
          f"records:    {summary['count']} (keys: {summary['keys']})\n"
          f"version:    {summary['version']}\n"
          f"{labels}"
          f"encoding:   {summary['encoding']} ("
          f"{'bucketed' if summary.get('buckets') else 'size ' + str(summary['size'])}, "
          f"quality {summary['quality']})\n"
          f"on disk:    {summary['bytes_on_disk']} bytes\n"
          f"skipped:    {summary['skipped']} source file(s)")
    if summary["encoding"] == "jpeg":  # records decoded row by row where a crop needs fewer
        marked, count = summary["row_markers"], summary["count"]
        print("row markers: " + ("none (records decoded whole)" if not marked else
                                 f"all {count} records" if marked == count else
                                 f"{marked} of {count} records"))
    if summary.get("fields"):
        from .fields import Schema

        print("fields:\n" + Schema.from_json(summary["fields"]).describe())
    if summary.get("buckets"):
        _report_buckets(summary["buckets"], summary["small_buckets"])
    return EXIT_OK


def _report_buckets(buckets: dict, small: dict) -> None:
    """The bucket histogram: one line per bucket (height x width: records), the fullest first
    past 40 buckets; and the records in buckets too small to batch."""
    from .bucketing import from_meta

    rows = list(zip(buckets["sizes"], buckets["counts"]))
    shown = rows if len(rows) <= 40 else sorted(rows, key=lambda r: -r[1])[:40]
    made = from_meta({k: v for k, v in buckets.items() if k not in ("sizes", "counts")})
    rule = {"area": lambda: f"area {made.side}x{made.side}",
            "list": lambda: f"{len(made.sizes)} listed sizes",
            "sdxl": lambda: "SDXL's 40 sizes",
            "kohya": lambda: "sd-scripts' BucketManager, resolution {}x{}, {}".format(
                *made.resolution, f"min {made.min_bucket_reso}, max {made.max_bucket_reso}"
                if made.upscale else "bucket_no_upscale")}[made.name]()
    print(f"buckets:    {len(rows)} ({rule}, step {made.step}, "
          f"{'upscaled' if made.upscale else 'no upscaling'}); height x width: records")
    merged = (f"; {small['merged']} merged into their nearest at pack time" if
              made.min_bucket_count else "")
    print(f"small:      {small['records']} records in {small['buckets']} buckets of fewer than "
          f"{small['under']}{merged}")
    for (h, w), n in shown:
        print(f"  {h}x{w}: {n}")
    if len(shown) < len(rows):
        print(f"  ... and {len(rows) - len(shown)} more buckets ('shardkit info --json' lists "
              "them)")


def _cmd_verify(args: argparse.Namespace) -> int:
    from .read.inspect import verify

    report = verify(args.store, progress=not args.quiet, cache_dir=args.cache_dir)
    if report.ok:
        print(f"ok: {report.records} records verified in {report.path}")
        return EXIT_OK
    for fault in report.faults:
        print(f"fault: {fault}", file=sys.stderr)
    print(f"shardkit verify: {len(report.faults)} fault(s) in {report.path}", file=sys.stderr)
    return EXIT_FAIL


def _cmd_merge(args: argparse.Namespace) -> int:
    from .packing.api import merge

    result = merge(args.out, overwrite=args.overwrite)
    print(f"merged {result.shards} shards, {result.count} images into {result.out}",
          file=sys.stderr)
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export

    result = export(args.store, args.pattern, to=args.to, shard_size=args.shard_size,
                    overwrite=args.overwrite, progress=not args.quiet)
    print(f"exported {result.count} records into {len(result.files)} {args.to} file"
          f"{'s' if len(result.files) != 1 else ''} ({result.bytes} bytes)", file=sys.stderr)
    return EXIT_OK


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import main as bench_main

    return bench_main(args.bench_args)


COMMANDS = {"pack": _cmd_pack, "info": _cmd_info, "verify": _cmd_verify, "merge": _cmd_merge,
            "bench": _cmd_bench, "export": _cmd_export, **cli_versions.COMMANDS,
            **cli_dedup.COMMANDS}


def _one_line(exc: BaseException) -> str:
    """An error message on one line, whatever odd file names it quotes (newlines escaped)."""
    return str(exc).replace("\r", "\\r").replace("\n", "\\n")


# Library errors name parameters as `name` or `name=value`; the command's users see flags.
_PARAMETER = re.compile(r"`(size|quality|encoding|format|workers|strict|overwrite|max_pixels|"
                        r"allow_empty|file_list|source_format|image_key|label_key|id_key|to|shard_size|num_shards|resume|engine|scheduler|retries|"
                        r"num_nodes|node_rank|order|layout_seed|buckets|bucket_step|bucket_upscale|min_bucket_count|split|frames|append)(?:=('[^'`]*'|True))?`")


def _as_flags(message: str) -> str:
    """``shard_size`` -> ``--shard-size``, ``engine='dask'`` -> ``--engine dask``."""
    def flag(m: re.Match) -> str:
        name, value = "--" + m.group(1).replace("_", "-"), m.group(2)
        return name if value in (None, "True") else f"{name} {value.strip(chr(39))}"

    message = _PARAMETER.sub(flag, message)
    return message.replace("`src`", "SRC").replace("`out`", "OUT")  # the positional arguments


def main(argv: Sequence[str] | None = None) -> int:
    # File and class names may be any bytes (non-UTF-8 names arrive as surrogates): print them
    # escaped instead of failing with UnicodeEncodeError.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        # Passed through untouched: argparse's REMAINDER rejects a leading option (bench --help).
        args = argparse.Namespace(command="bench", bench_args=argv[1:])
    else:
        args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except Interrupted as exc:
        print(f"shardkit {args.command}: {_as_flags(_one_line(exc))}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ShardkitError as exc:
        print(f"shardkit {args.command}: error: {_as_flags(_one_line(exc))}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print(f"shardkit {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_FAIL


if __name__ == "__main__":
    cli_exit.end(main())
