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

from ..errors import PackError

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


def _walk(top: str, skipped: list[dict[str, str]]):
    """``os.walk(top, followlinks=True)`` that visits each real directory once.

    torchvision follows symlink loops until paths grow too long; we stop at the first repeat of a
    (device, inode) pair on the current path and report it, so a loop never runs forever.
    """
    def walk(path: str, ancestors: frozenset):
        try:
            st = os.stat(path)
        except OSError as exc:
            skipped.append({"path": path, "reason": f"cannot open folder: {exc.strerror}"})
            return
        key = (st.st_dev, st.st_ino)
        if key in ancestors:
            skipped.append({"path": path, "reason": "symlink loop: folder already on this path"})
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
        yield path, dirs, files
        for name in dirs:
            yield from walk(os.path.join(path, name), ancestors)

    yield from walk(top, frozenset())


def make_dataset(root: str, class_to_idx: dict[str, int], allow_empty: bool = False,
                 skipped: list[dict[str, str]] | None = None) -> list[tuple[str, int]]:
    """(path, class index) for every image file, in ImageFolder's order."""
    skipped = [] if skipped is None else skipped
    samples: list[tuple[str, int]] = []
    empty: list[str] = []
    for target_class in sorted(class_to_idx):
        label = class_to_idx[target_class]
        target_dir = os.path.join(root, target_class)
        found = 0
        for dirpath, _, fnames in sorted(_walk(target_dir, skipped)):
            for fname in sorted(fnames):
                if has_image_extension(fname):
                    samples.append((os.path.join(dirpath, fname), label))
                    found += 1
        if not found:
            empty.append(target_class)
    if empty and not allow_empty:
        raise PackError(
            f"found no image files for the classes {', '.join(sorted(empty))} "
            f"(supported extensions: {', '.join(IMG_EXTENSIONS)}); "
            "pass `allow_empty=True` to keep them as classes with no images")
    return samples


def discover(root: str, allow_empty: bool = False) -> Discovery:
    """Discover an ImageFolder-layout source folder."""
    root = os.fspath(root)
    classes, class_to_idx = find_classes(root)
    skipped: list[dict[str, str]] = []
    samples = make_dataset(root, class_to_idx, allow_empty, skipped)
    return Discovery(root, classes, class_to_idx, samples, skipped)


def read_file_list(list_path: str, root: str) -> Discovery:
    """Discover from a CSV/TSV of ``path,label`` (integer) or ``path,class-name`` rows.

    Paths are relative to ``root`` (or absolute). With class names, classes are the sorted set of
    names, as ImageFolder would number them; with integers, classes are their decimal strings
    ``0..max`` (never renumbered), and each must be below ``max(number of rows,
    MAX_SPARSE_LABEL)`` (65,536): a label above both is refused, before any class is made. The
    list is UTF-8, with or without a BOM (Excel's "CSV UTF-8").
    The first row is a header when its label is not an integer and its path names no file.
    """
    text = read_list_text(list_path)
    dialect = "excel-tab" if "\t" in text.split("\n", 1)[0] else "excel"
    rows = [r for r in csv.reader(io.StringIO(text, newline=""), dialect=dialect)
            if r and any(c.strip() for c in r)]
    if rows and len(rows[0]) >= 2 and not _INT_LABEL.fullmatch(rows[0][1].strip()) \
            and not os.path.lexists(os.path.join(root, rows[0][0].strip())):
        rows = rows[1:]
    if not rows:
        raise PackError(f"file list {list_path} has no rows")
    for n, row in enumerate(rows, 1):
        if len(row) < 2:
            raise PackError(f"file list {list_path} row {n}: expected 'path,label', got {row!r}")
    labels = [row[1].strip() for row in rows]
    is_int = [bool(_INT_LABEL.fullmatch(lab)) for lab in labels]
    if all(is_int):
        ints = _integer_labels(labels, list_path)
        classes = [str(i) for i in range(max(ints) + 1)]
        targets = ints
    elif any(is_int):  # sorting "10" before "2" as names would silently renumber classes
        n = is_int.index(True) + 1
        raise PackError(f"file list {list_path} mixes integer labels and class names (row {n}: "
                        f"{labels[n - 1]!r}); use one or the other")
    else:
        classes = sorted(set(labels))
        index = {c: i for i, c in enumerate(classes)}
        targets = [index[lab] for lab in labels]
    samples = [(os.path.join(root, row[0].strip()), t) for row, t in zip(rows, targets)]
    return Discovery(os.fspath(root), classes, {c: i for i, c in enumerate(classes)}, samples)


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


def _integer_labels(labels: list[str], list_path: str) -> list[int]:
    """The labels as integers, each in ``0 <= label < max(len(labels), MAX_SPARSE_LABEL)``."""
    bound = max(len(labels), MAX_SPARSE_LABEL)
    ints = []
    for n, text in enumerate(labels, 1):
        digits = text.lstrip("-").lstrip("0") or "0"
        if text.startswith("-") and digits != "0":
            raise PackError(f"file list {list_path} row {n}: negative label {text}")
        # Compared as digits first: int() of a 5,000-digit label raises, and needs no doing.
        if len(digits) > len(str(bound)) or int(digits) >= bound:
            shown = text if len(text) <= 30 else f"{text[:12]}...({len(text)} digits)"
            raise PackError(f"file list {list_path} row {n}: label {shown} is too large: integer "
                            f"labels number the classes 0..max, and must be below {bound:,} "
                            f"(the larger of the {len(labels):,} rows and {MAX_SPARSE_LABEL:,}); "
                            "write class names to use sparse ids")
        ints.append(int(digits))
    return ints
