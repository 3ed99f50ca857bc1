"""Hugging Face's ``imagefolder`` layout, listed by the rules of ``datasets``
(``load_dataset("imagefolder", data_dir=SRC)``: ``data_files.py`` and
``packaged_modules/folder_based_builder``), so a pack holds exactly the records it loads.

* **Files**: every file under SRC except hidden ones (a part of the path starting with ``.``),
  files in folders starting with ``__`` and ``README.md``-like names (:data:`IGNORED`);
  symlinks are followed.
* **Splits** (:func:`split_files`): the first of these that matches any file decides:
  ``data/<split>-NNNNN-of-NNNNN*.*`` names; then ``*.eval`` files (a ``logs`` split); then
  ``task.toml``/``instruction.md`` (a ``test`` split); then folder names (``train``,
  ``training``; ``validation``, ``valid``, ``dev``, ``val``; ``test``, ``testing``, ``eval``,
  ``evaluation``, alone or set off by ``-._ `` or digits: ``train/``, ``my-train_2/``); then
  file names likewise (``train_001.jpg``); else every file is ``train``. A split's files are,
  for each of its patterns in turn, the matching files in sorted path order (a file that two
  patterns match comes twice, as there).
* **Images**: files whose extension (any case), or the one before it (``x.jpg.gz``), is one of
  :data:`IMAGE_EXTENSIONS`; ``metadata.csv``/``.jsonl``/``.parquet`` are metadata files.
* **With metadata files** in any split, a split's records are its metadata files' rows (files
  in path order, rows in order), each naming its image by ``file_name`` relative to that
  file's folder; there are no folder labels. Without: every image, and a label (the name of the
  image's folder, class names sorted) only when there are several such names and every image
  sits at the same depth.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import PackError
from ..fileutil import read_bounded
from .discovery import enter_folder

#: datasets' ``ImageFolder.EXTENSIONS`` (the extensions Pillow opens, fixed)
IMAGE_EXTENSIONS = frozenset(
    ".blp .bmp .dib .bufr .cur .pcx .dcx .dds .ps .eps .fit .fits .fli .flc .ftc .ftu .gbr .gif "
    ".grib .png .apng .jp2 .j2k .jpc .jpf .jpx .j2c .icns .ico .im .iim .tif .tiff .jfif .jpe "
    ".jpg .jpeg .mpg .mpeg .msp .pcd .pxr .pbm .pgm .ppm .pnm .psd .bw .rgb .rgba .sgi .ras "
    ".tga .icb .vda .vst .webp .wmf .emf .xbm .xpm".split())
METADATA_FILENAMES = ("metadata.csv", "metadata.jsonl", "metadata.parquet")
IGNORED = frozenset({"README.md", "config.json", "dataset_info.json", "dataset_infos.json",
                     "dummy_data.zip", "dataset_dict.json"})
MAX_METADATA_BYTES = 1 << 30

_SEP = "[-._ 0-9]"
_KEYWORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "dev", "val"),
             "test": ("test", "testing", "eval", "evaluation")}
_IN_DIR = ("**/{k}/**", "**/{k}{s}*/**", "**/*{s}{k}/**", "**/*{s}{k}{s}*/**")
_IN_NAME = ("**/{k}{s}*", "**/*{s}{k}{s}*")
_SHARDED = "data/{split}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*"
_SPLIT_NAME = re.compile(r"\w+(\.\w+)*")
#: datasets' default patterns after the sharded names, tried in this order
_PATTERN_GROUPS: tuple[dict[str, list[str]], ...] = (
    {"logs": ["**/*.eval"]},
    {"test": ["**/task.toml", "**/instruction.md"]},
    {s: [p.format(k=k, s=_SEP) for k in ks for p in _IN_DIR] for s, ks in _KEYWORDS.items()},
    {s: [p.format(k=k, s=_SEP) for k in ks for p in _IN_NAME] for s, ks in _KEYWORDS.items()},
    {"train": ["**"]},
)


def glob_regex(pattern: str) -> re.Pattern:
    """A relative glob pattern as fsspec matches it (``**/`` any folders or none, a final
    ``**`` anything, ``*`` within one name, ``[...]`` a class)."""
    parts = pattern.split("/")
    out = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(".*" if last else "(?:.+/)?")
            continue
        text = ""
        for token in re.findall(r"\[[^\]]*\]|\*|[^\[*]+", part):
            text += "[^/]*" if token == "*" else token if token[0] == "[" else re.escape(token)
        out.append(text if last else text + "/")
    return re.compile("".join(out) + r"\Z", re.S)


def list_files(root: str, skipped: list[dict[str, str]]) -> list[str]:
    """Every file datasets sees under ``root``, as sorted relative ``/`` paths."""
    out: list[str] = []

    def walk(path: str, rel: str, ancestors: frozenset) -> None:
        key = enter_folder(path, ancestors, skipped)
        if key is None:
            return
        try:
            with os.scandir(path) as it:
                entries = [(e.name, _is_dir(e), _is_file(e)) for e in it]
        except OSError as exc:
            skipped.append({"path": path, "reason": f"cannot list folder: {exc.strerror}"})
            return
        for name, is_dir, is_file in entries:
            if name.startswith(".") and set(name) != {"."}:
                continue  # hidden, as datasets leaves them out
            sub = f"{rel}{name}"
            if is_dir:
                if not name.startswith("__"):
                    walk(os.path.join(path, name), sub + "/", ancestors | {key})
            elif is_file and name not in IGNORED:
                out.append(sub)

    walk(root, "", frozenset())
    return sorted(out)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def split_files(files: list[str]) -> dict[str, list[str]]:
    """{split: its files, in datasets' order}, from the sorted relative paths ``files``."""
    sharded = glob_regex(_SHARDED.replace("{split}", "*"))
    names = {re.match(r"(.+)-[0-9]{5}-of-[0-9]{5}", f.rsplit("/", 1)[-1]).group(1)
             for f in files if sharded.match(f)}
    if names:
        bad = sorted(n for n in names if not _SPLIT_NAME.fullmatch(n))
        if bad:
            raise PackError(f"split names must be words (datasets' rule), got {bad}")
        order = [s for s in _KEYWORDS if s in names] + sorted(names - set(_KEYWORDS))
        groups: tuple[dict[str, list[str]], ...] = (
            {s: [_SHARDED.replace("{split}", s)] for s in order},)
    else:
        groups = _PATTERN_GROUPS
    for group in groups:
        found = {}
        for split, patterns in group.items():
            matched = [[f for f in files if rx.match(f)]
                       for rx in (glob_regex(p) for p in patterns)]
            if any(matched):
                found[split] = [f for m in matched for f in m]
        if found:
            return found
    return {}


def is_image(rel: str) -> bool:
    """Whether datasets takes the file for an image: its extension or the one before it."""
    root, ext = os.path.splitext(rel)
    return ext.lower() in IMAGE_EXTENSIONS or os.path.splitext(root)[1].lower() in IMAGE_EXTENSIONS


def is_metadata(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1] in METADATA_FILENAMES


@dataclass
class Layout:
    """SRC as datasets' imagefolder reads it: the splits' files, and whether records come from
    metadata files (then there are no folder labels) or are the images (``classes``: the
    folder labels, empty when there are none)."""

    root: str
    splits: dict[str, list[str]]
    metadata: bool
    classes: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)

    def images(self, split: str) -> list[str]:
        return [f for f in self.splits[split] if is_image(f) and not is_metadata(f)]

    def metadata_files(self, split: str) -> list[str]:
        return sorted({f for f in self.splits[split] if is_metadata(f)})

    def label(self, rel: str) -> str:
        """The folder label of image ``rel`` (its folder's name; SRC's own for a top file)."""
        folder = os.path.dirname(rel)
        return os.path.basename(folder) if folder else os.path.basename(self.real_root)

    @property
    def real_root(self) -> str:
        return os.path.realpath(self.root)


def read_layout(root: str) -> Layout:
    """List ``root`` by datasets' rules (see the module docstring); PackError (one line) for a
    layout datasets refuses or that shardkit cannot read the same way."""
    skipped: list[dict[str, str]] = []
    splits = split_files(list_files(root, skipped))
    every = [f for files in splits.values() for f in files]
    archives = [f for f in every if os.path.splitext(f)[1].lower() == ".zip"]
    if archives:
        raise PackError(f"{os.path.join(root, archives[0])}: zip archives in an imagefolder are "
                        "not read; extract them")
    metas = sorted({f for f in every if is_metadata(f)})
    kinds = sorted({os.path.splitext(f)[1] for f in metas})
    if len(kinds) > 1:
        raise PackError(f"{root}: metadata files with different extensions ({', '.join(kinds)}); "
                        "datasets refuses this layout")
    layout = Layout(root, splits, bool(metas), skipped=skipped)
    if not metas:
        # Labels from the images' own extension only, over every split (datasets' analysis).
        labelled = [f for f in every if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS]
        names = {layout.label(f) for f in labelled}
        if len(names) > 1 and len({f.count("/") for f in labelled}) == 1:
            layout.classes = sorted(names)
    return layout


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a metadata file (``.jsonl``: JSON objects, ``.csv``: a header row, each
    column typed as a whole, ``.parquet``: pyarrow), in order; PackError (one line)."""
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise PackError(f"{path}: reading metadata.parquet needs pyarrow (pip install "
                            "'shardkit[parquet]')") from None
        try:
            return pq.read_table(path).to_pylist()
        except (OSError, ValueError) as exc:
            raise PackError(f"{path}: not a readable parquet file ({exc})") from None
    data = read_bounded(path, MAX_METADATA_BYTES, "metadata")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PackError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if path.endswith(".jsonl"):
        return json_lines(path, text)
    table = [r for r in csv.reader(io.StringIO(text, newline="")) if r]
    if not table:
        return []
    header = table[0]
    for n, r in enumerate(table[1:], 2):
        if len(r) != len(header):
            raise PackError(f"{path} row {n}: {len(r)} cells, the header has {len(header)}")
    columns = [_column([r[i] for r in table[1:]], name.endswith("file_name"))
               for i, name in enumerate(header)]
    return [{name: col[k] for name, col in zip(header, columns)} for k in range(len(table) - 1)]


def json_lines(path: str, text: str) -> list[dict[str, Any]]:
    """The rows of JSON Lines ``text`` read from ``path``: one JSON object a line, blank lines
    skipped."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise PackError(f"{path} line {n}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise PackError(f"{path} line {n}: not a JSON object")
        rows.append(row)
    return rows


def _column(cells: list[str], text: bool) -> list[Any]:
    """A CSV column typed as a whole, as pandas types one: integers, else numbers, else (as
    shardkit types metadata cells) JSON arrays/objects, else the text; an empty cell is None."""
    present = [c for c in cells if c.strip()]
    if not text and present:
        for convert in (int, _number, _json):
            try:
                values = {c: convert(c) for c in present}
            except (ValueError, RecursionError):
                continue
            return [values.get(c) if c.strip() else None for c in cells]
    return [c if c.strip() else None for c in cells]


def _number(cell: str) -> float:
    if cell.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity", "+inf"):
        raise ValueError(cell)
    return float(cell)


def _json(cell: str) -> Any:
    if cell.strip()[:1] not in ("[", "{"):
        raise ValueError(cell)
    return json.loads(cell)


def image_path(meta_dir: str, name: Any, where: str) -> str:
    """The image a row's ``file_name`` names, relative to SRC (``meta_dir``: the metadata file's
    folder, relative to SRC); PackError for a name datasets refuses (a URL, an absolute path,
    one leading out of the metadata file's folder)."""
    if not isinstance(name, str) or not name:
        raise PackError(f"{where}: no 'file_name'")
    rel = os.path.normpath(name).replace("\\", "/")
    if "://" in name or os.path.isabs(name) or os.path.isabs(rel) or rel == ".." \
            or rel.startswith("../"):
        raise PackError(f"{where}: file_name {name!r} must be a relative path inside the "
                        "metadata file's folder")
    return os.path.normpath(os.path.join(meta_dir, rel)).replace("\\", "/")


__all__ = ["IMAGE_EXTENSIONS", "METADATA_FILENAMES", "Layout", "glob_regex", "image_path",
           "is_image", "is_metadata", "list_files", "read_layout", "read_rows", "split_files"]
