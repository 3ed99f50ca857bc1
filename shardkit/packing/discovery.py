"""Find images and labels in a folder, following torchvision's ``ImageFolder`` rules exactly.

Classes are the source folder's immediate subfolders (symlinks followed) in sorted order; each
class's files are found recursively, by extension (any case), in the order torchvision produces:
``sorted(os.walk(class_dir, followlinks=True))`` and then sorted file names per folder.
A label file (``--file-list``) is the alternative for datasets whose labels are not folders.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import PackError
from ..fileutil import remove

IMG_EXTENSIONS: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
)
_INT_LABEL = re.compile(r"-?[0-9]+")
#: Integer labels of a file list number the classes ``0..max(label)``, so one huge label (an id
#: column, a typo) would make that many class names: a label must be below
#: ``max(number of rows, MAX_SPARSE_LABEL)``.
MAX_SPARSE_LABEL = 1 << 16


@dataclass
class Discovery:
    """What a source folder holds: classes, and (path, label) per image in ImageFolder order."""

    root: str
    classes: list[str]
    class_to_idx: dict[str, int]
    samples: list[tuple[str, int]]
    skipped: list[dict[str, str]] = field(default_factory=list)
    #: sources listed into a plan folder instead of ``samples`` (:mod:`.plan_store`); None:
    #: they are in ``samples``
    count: int | None = None


def has_image_extension(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """Immediate subfolders of ``root`` (following symlinks), sorted, mapped to 0..n-1."""
    try:
        with os.scandir(root) as it:
            classes = sorted(entry.name for entry in it if _is_dir(entry))
    except FileNotFoundError:
        raise PackError(f"source folder not found: {root}") from None
    except NotADirectoryError:
        raise PackError(f"source is not a folder: {root}") from None
    except PermissionError as exc:
        raise PackError(f"cannot read source folder {root}: {exc.strerror}") from None
    if not classes:
        raise PackError(f"no class folders found in {root} (expected {root}/<class>/<image>)")
    return classes, {name: i for i, name in enumerate(classes)}


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def enter_folder(path: str, ancestors: frozenset,
                 skipped: list[dict[str, str]]) -> tuple[int, int] | None:
    """The (device, inode) of the folder ``path``, or None, with the reason added to
    ``skipped``, when it cannot be opened or is already in ``ancestors`` (a symlink loop)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        skipped.append({"path": path, "reason": f"cannot open folder: {exc.strerror}"})
        return None
    key = (st.st_dev, st.st_ino)
    if key in ancestors:
        skipped.append({"path": path, "reason": "symlink loop: folder already on this path"})
        return None
    return key


def _walk(top: str, skipped: list[dict[str, str]], ancestors: frozenset = frozenset(),
          split: int | None = None):
    """``os.walk(top, followlinks=True)`` that visits each real directory once, yielding
    ``(path, dirs, files, None)``.

    torchvision follows symlink loops until paths grow too long; we stop at the first repeat of a
    (device, inode) pair on the current path and report it, so a loop never runs forever.
    ``split``: a ``top`` with that many subfolders or more is yielded alone, with its (device,
    inode) as the last item, and not walked into (its subfolders are listed elsewhere).
    """
    def walk(path: str, ancestors: frozenset, split: int | None):
        key = enter_folder(path, ancestors, skipped)
        if key is None:
            return
        ancestors = ancestors | {key}
        dirs, files = [], []
        try:
            with os.scandir(path) as it:
                for entry in it:
                    (dirs if _is_dir(entry) else files).append(entry.name)
        except OSError as exc:
            skipped.append({"path": path, "reason": f"cannot list folder: {exc.strerror}"})
            return
        if split is not None and len(dirs) >= split:
            yield path, dirs, files, key
            return
        yield path, dirs, files, None
        for name in dirs:
            yield from walk(os.path.join(path, name), ancestors, None)

    yield from walk(top, ancestors, split)


# A class folder with this many subfolders is listed by several tasks, CHUNK_DIRS subfolders each.
SPLIT_DIRS = 16
CHUNK_DIRS = 8

Lister = Callable[[Callable[..., Any], list[tuple[Any, ...]]], list[Any]]


def serial(fn: Callable[..., Any], args: list[tuple[Any, ...]]) -> list[Any]:
    """A :data:`Lister` that runs every task here, in order."""
    return [fn(*a) for a in args]


@dataclass
class WalkPart:
    """What one listing task walked: each folder's images (sorted, by extension) written to
    ``file`` (paths back to back, then int64 ends in ``file + '.off'``), as ``(folder, first,
    count)``; the skips, in walk order; and, for a class folder with many subfolders, the
    subfolders left to other tasks (in scandir order) with the class folder's (dev, inode)."""

    file: str
    dirs: list[tuple[str, int, int]]
    skipped: list[dict[str, str]]
    pending: list[str] = field(default_factory=list)
    key: tuple[int, int] | None = None


def walk_part(tops: list[str], file: str, ancestors: tuple[tuple[int, int], ...] = (),
              split: bool = False) -> WalkPart:
    """A listing task: walk each of ``tops`` (torchvision's ``os.walk(followlinks=True)``, in
    :func:`_walk`'s order) into ``file``. ``split``: ``tops`` is one class folder, and if it has
    :data:`SPLIT_DIRS` subfolders or more only its own files are listed here (the subfolders
    come back in ``pending``)."""
    from .plan_store import encode_path

    skipped: list[dict[str, str]] = []
    dirs: list[tuple[str, int, int]] = []
    part = WalkPart(file, dirs, skipped)
    count = 0
    with open(file, "wb") as paths, open(file + ".off", "wb") as ends:
        end = 0
        ends.write(np.zeros(1, "<i8").tobytes())
        for top in tops:
            for dirpath, subdirs, fnames, key in _walk(top, skipped, frozenset(ancestors),
                                                       SPLIT_DIRS if split else None):
                if key is not None:  # a big class folder: its subfolders go to other tasks
                    part.pending, part.key = subdirs, key
                names = [os.path.join(dirpath, f) for f in sorted(fnames)
                         if has_image_extension(f)]
                if names:
                    encoded = [encode_path(n) for n in names]
                    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
                    paths.write(b"".join(encoded))
                    ends.write((np.cumsum(lengths) + end).astype("<i8").tobytes())
                    end += int(lengths.sum())
                dirs.append((dirpath, count, len(names)))
                count += len(names)
    return part


def list_folder(root: str, folder: str, allow_empty: bool = False,
                lister: Lister | None = None) -> Discovery:
    """List an ImageFolder-layout ``root`` into the plan folder ``folder`` (its sources' arrays,
    :mod:`.plan_store`), in ImageFolder's order: one task per class folder, then one per
    :data:`CHUNK_DIRS` subfolders of a class folder with many (``lister`` runs them: a Dask
    cluster's, or :func:`serial`). Only per-folder records (never per-image ones) come back
    here; the images' paths are copied from the tasks' files in chunks."""
    from .plan_store import INDEX_DTYPE, SourceWriter

    root = os.fspath(root)
    lister = lister or serial
    classes, class_to_idx = find_classes(root)
    work = os.path.join(folder, "listing")
    os.makedirs(work, exist_ok=True)
    parts = lister(walk_part, [([os.path.join(root, c)], os.path.join(work, f"{k}"), (), True)
                               for k, c in enumerate(classes)])
    more = [(k, j, names) for k, part in enumerate(parts)
            for j, names in enumerate(part.pending[i:i + CHUNK_DIRS]
                                      for i in range(0, len(part.pending), CHUNK_DIRS))]
    subparts = lister(walk_part, [
        ([os.path.join(parts[k].dirs[0][0], name) for name in names],
         os.path.join(work, f"{k}-{j}"), (parts[k].key,)) for k, j, names in more])
    by_class: list[list[WalkPart]] = [[part] for part in parts]
    for (k, _, _), part in zip(more, subparts):
        by_class[k].append(part)
    writer = SourceWriter(folder)
    skipped: list[dict[str, str]] = []
    empty: list[str] = []
    try:
        for k, (name, group) in enumerate(zip(classes, by_class)):
            found = 0
            offsets = {part.file: np.fromfile(part.file + ".off", INDEX_DTYPE) for part in group}
            for dirpath, part, first, n in sorted(
                    (d, part, first, n) for part in group for d, first, n in part.dirs):
                if n:
                    writer.copy_from(part.file, offsets[part.file][first:first + n + 1], k)
                found += n
            for part in group:
                skipped.extend(part.skipped)
            if not found:
                empty.append(name)
    finally:
        writer.close()
        remove(work)
    if empty and not allow_empty:
        raise PackError(
            f"found no image files for the classes {', '.join(sorted(empty))} "
            f"(supported extensions: {', '.join(IMG_EXTENSIONS)}); "
            "pass `allow_empty=True` to keep them as classes with no images")
    return Discovery(root, classes, class_to_idx, [], skipped, writer.count)


def read_back(found: Discovery, folder: str) -> Discovery:
    """``found`` with the sources a listing wrote into ``folder`` read back into ``samples``."""
    from .plan_store import INDEX_DTYPE, LABEL_DTYPE, LABELS, OFFSETS, PATHS, read_array

    n = found.count or 0
    ends = read_array(folder, OFFSETS, INDEX_DTYPE, n + 1)
    labels = read_array(folder, LABELS, LABEL_DTYPE, n).tolist()
    with open(os.path.join(folder, PATHS), "rb") as f:
        blob = f.read()
    samples = [(os.fsdecode(blob[a:b]), t) for a, b, t in zip(ends[:-1].tolist(),
                                                             ends[1:].tolist(), labels)]
    return Discovery(found.root, found.classes, found.class_to_idx, samples, found.skipped)


def make_dataset(root: str, class_to_idx: dict[str, int], allow_empty: bool = False,
                 skipped: list[dict[str, str]] | None = None) -> list[tuple[str, int]]:
    """(path, class index) for every image file, in ImageFolder's order."""
    found = discover(root, allow_empty)
    if skipped is not None:
        skipped.extend(found.skipped)
    return found.samples


def discover(root: str, allow_empty: bool = False) -> Discovery:
    """Discover an ImageFolder-layout source folder (in memory: :func:`list_folder` keeps the
    sources on disk)."""
    import tempfile

    root = os.fspath(root)
    with tempfile.TemporaryDirectory(prefix="shardkit-list-") as folder:
        return read_back(list_folder(root, folder, allow_empty), folder)


def read_file_list(list_path: str, root: str) -> Discovery:
    """:func:`list_file_list` in memory (its sources in ``samples``)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="shardkit-list-") as folder:
        return read_back(list_file_list(list_path, root, folder), folder)


def list_file_list(list_path: str, root: str, folder: str) -> Discovery:
    """Discover from a CSV/TSV of ``path,label`` (integer) or ``path,class-name`` rows, read as
    a stream into the plan folder ``folder`` (:mod:`.plan_store`): memory O(classes).

    Paths are relative to ``root`` (or absolute). With class names, classes are the sorted set of
    names, as ImageFolder would number them; with integers, classes are their decimal strings
    ``0..max`` (never renumbered), and each must be below ``max(number of rows,
    MAX_SPARSE_LABEL)`` (65,536): a label above both is refused, before any class is made. The
    list is UTF-8, with or without a BOM (Excel's "CSV UTF-8").
    The first row is a header when its label is not an integer and its path names no file.
    """
    from .plan_store import LABEL_DTYPE, LABELS, SourceWriter, read_chunks, remap_labels

    try:
        f = open(list_path, "rb")
    except OSError as exc:
        raise PackError(f"cannot read file list {list_path}: {exc.strerror}") from None
    writer = SourceWriter(folder)
    names: dict[str, int] = {}  # class name -> number in order of first appearance
    first_int = first_name = first_negative = None
    big: int | None = None  # the largest integer label (digits beyond int64: refused anyway)
    n = 0
    try:
        text = io.TextIOWrapper(f, encoding="utf-8-sig", newline="")
        try:
            head = ""  # the first line, up to its "\n" (dialect sniffing, as before)
            while True:
                line = text.readline()
                head += line
                if not line or line.endswith("\n"):
                    break
            dialect = "excel-tab" if "\t" in head.split("\n", 1)[0] else "excel"
            lines = _chain_lines(head, text)
            rows = (r for r in csv.reader(lines, dialect=dialect) if r and any(c.strip() for c in r))
            batch_paths: list[str] = []
            batch_labels: list[int] = []
            first = True
            for row in rows:
                if first:
                    first = False
                    if len(row) >= 2 and not _INT_LABEL.fullmatch(row[1].strip()) \
                            and not os.path.lexists(os.path.join(root, row[0].strip())):
                        continue  # a header row
                n += 1
                if len(row) < 2:
                    raise PackError(f"file list {list_path} row {n}: expected 'path,label', "
                                    f"got {row!r}")
                label = row[1].strip()
                if _INT_LABEL.fullmatch(label):
                    first_int = first_int or n
                    digits = label.lstrip("-").lstrip("0") or "0"
                    if label.startswith("-") and digits != "0":
                        first_negative = first_negative or n
                        value = -1
                    else:
                        value = int(digits) if len(digits) <= 10 else 1 << 40
                    big = value if big is None else max(big, value)
                else:
                    first_name = first_name or n
                    value = names.setdefault(label, len(names))
                batch_paths.append(os.path.join(root, row[0].strip()))
                batch_labels.append(min(value, (1 << 31) - 1))
                if len(batch_paths) >= 1 << 16:
                    writer.add(batch_paths, batch_labels)
                    batch_paths, batch_labels = [], []
            writer.add(batch_paths, batch_labels)
        except UnicodeDecodeError:
            read_list_text(list_path)  # raises the one-line message naming the line and byte
            raise
    finally:
        writer.close()
        f.close()
    if not n:
        raise PackError(f"file list {list_path} has no rows")
    if first_int and first_name:  # sorting "10" before "2" as names would silently renumber
        raise PackError(f"file list {list_path} mixes integer labels and class names (row "
                        f"{first_int}: {_row_label(list_path, root, first_int)!r}); use one or "
                        "the other")
    if first_name:
        classes = sorted(names)
        rank = {c: i for i, c in enumerate(classes)}
        remap_labels(folder, n, np.array([rank[c] for c in names], LABEL_DTYPE))
    else:
        bound = max(n, MAX_SPARSE_LABEL)
        first_large = None
        if big is not None and big >= bound:
            seen = 0
            for chunk in read_chunks(folder, LABELS, LABEL_DTYPE, n):
                hits = np.flatnonzero(chunk >= bound)
                if len(hits):
                    first_large = seen + int(hits[0]) + 1
                    break
                seen += len(chunk)
        bad = min(r for r in (first_negative, first_large) if r is not None) \
            if first_negative or first_large else None
        if bad is not None:
            text = _row_label(list_path, root, bad)
            if bad == first_negative:
                raise PackError(f"file list {list_path} row {bad}: negative label {text}")
            shown = text if len(text) <= 30 else f"{text[:12]}...({len(text)} digits)"
            raise PackError(f"file list {list_path} row {bad}: label {shown} is too large: integer "
                            f"labels number the classes 0..max, and must be below {bound:,} "
                            f"(the larger of the {n:,} rows and {MAX_SPARSE_LABEL:,}); "
                            "write class names to use sparse ids")
        classes = [str(i) for i in range(big + 1)]
    return Discovery(os.fspath(root), classes, {c: i for i, c in enumerate(classes)}, [], [],
                     writer.count)


def _chain_lines(head: str, rest: Any) -> Any:
    """The lines of ``head`` (already read) and then of ``rest``, as csv.reader reads them."""
    yield from io.StringIO(head, newline="")
    yield from rest


def _row_label(list_path: str, root: str, n: int) -> str:
    """The label text of row ``n`` (numbered as :func:`list_file_list` numbers them), read
    again: only an error message needs it."""
    text = read_list_text(list_path)
    dialect = "excel-tab" if "\t" in text.split("\n", 1)[0] else "excel"
    rows = [r for r in csv.reader(io.StringIO(text, newline=""), dialect=dialect)
            if r and any(c.strip() for c in r)]
    if rows and len(rows[0]) >= 2 and not _INT_LABEL.fullmatch(rows[0][1].strip()) \
            and not os.path.lexists(os.path.join(root, rows[0][0].strip())):
        rows = rows[1:]
    return rows[n - 1][1].strip()


def read_list_text(list_path: str) -> str:
    """The text of a file list (UTF-8, a BOM dropped); one-line PackErrors naming the line and
    byte that is not UTF-8, or why the file cannot be read."""
    try:
        with open(list_path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise PackError(f"cannot read file list {list_path}: {exc.strerror}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PackError(f"file list {list_path} is not UTF-8 text (line {line}, byte "
                        f"{exc.start}: {data[exc.start:exc.start + 1]!r}); save it as UTF-8"
                        ) from None
