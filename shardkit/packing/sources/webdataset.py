"""WebDataset tar shards: one tar, a brace pattern (``train-{000000..000127}.tar``) or a folder
of tars, local or at a URL (fsspec: ``s3://bucket/shards/``), read with the standard library's
``tarfile`` (no dependency on ``webdataset``).

Members group into samples by WebDataset's own key rule: the path up to the first dot of the
basename (directory kept) is the sample key, the rest (lower-cased) the member's suffix;
consecutive members with the same key form one sample; top-level ``__*__`` names are metadata.
The image is the first of ``image_key``'s suffixes the sample has, the label the first of
``label_key``'s (its text, an integer or a class name); ``txt``, ``json`` and ``npy`` members
(``caption.txt``: the field ``caption``) become typed fields. The scan reads headers and label
members only; workers read each image at its offset (uncompressed tars: one ``pread``).

Refused with one line, before anything is packed: member names that are absolute or climb out
(``..``), symlink, hard-link and device members. Pickled members (``.pkl``, ``.pickle``,
``.pyd``, ``.pth``) are never read: each is listed in the skip list.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import zlib
from typing import Any
from pathlib import PurePosixPath

from ...errors import PackError, ShardkitError, StoreError
from ...urls import is_url
from .base import MemberError, SourceOptions, TransferFailed
from .container import ContainerSource, Scanned, Shard, member_name, read_classes_file
from .fields import FIELD_BYTES, FieldRejected, decode_member, wds_field
from .files import open_cached
from .url_objects import RangeFile, object_size, remote, url_target

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff")
LABEL_KEYS = ("cls", "class", "label", "index")
PICKLED = ("pkl", "pickle", "pyd", "pth")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
LABEL_BYTES = 4096  # a label member is a short text; more is not a label
SCAN_BLOCK = 16 << 20  # bytes of a tar at a URL one request of its scan reads
_BRACE = re.compile(r"\{[^{}]*\.\.[^{}]*\}")


def base_plus_ext(path: str) -> tuple[str | None, str | None]:
    """WebDataset's key rule: (``dir/key``, ``suffix``) split at the basename's first dot."""
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", path)
    return (match.group(1), match.group(2)) if match else (None, None)


def is_tar_url(src: str) -> bool:
    """A URL this format reads: a tar, a brace pattern of tars, or a folder (ending in ``/``)."""
    return is_url(src) and (bool(_BRACE.search(src)) or src.endswith("/")
                            or src.lower().endswith(TAR_SUFFIXES))


def expand(src: str) -> list[str]:
    """The shard files of ``src``: a brace pattern expanded, a folder's tars sorted, or ``src``."""
    if is_url(src):
        return _expand_url(src)
    if _BRACE.search(src):
        try:
            from braceexpand import braceexpand
        except ImportError:
            raise PackError("a brace pattern needs braceexpand: pip install braceexpand") from None
        files = list(braceexpand(src))
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise PackError(f"{src}: {len(missing)} of its {len(files)} shards do not exist "
                            f"(first: {missing[0]})")
        return files
    if os.path.isdir(src):
        files = sorted(os.path.join(src, n) for n in os.listdir(src)
                       if n.lower().endswith(TAR_SUFFIXES))
        if not files:
            raise PackError(f"{src}: no tar files ({', '.join(TAR_SUFFIXES)})")
        return files
    if not os.path.isfile(src):
        raise PackError(f"source not found: {src}")
    return [src]


def _expand_url(src: str) -> list[str]:
    if _BRACE.search(src):
        try:
            from braceexpand import braceexpand
        except ImportError:
            raise PackError("a brace pattern needs braceexpand: pip install braceexpand") from None
        return list(braceexpand(src))
    access = remote()
    try:
        if src.endswith("/"):
            from ...remote.listing import list_folder

            target = access.RemoteTarget(src.rstrip("/"))
            scheme = src.split("://", 1)[0]
            names = sorted(n for n in list_folder(target, "")[1]
                           if n.lower().endswith(TAR_SUFFIXES))
            if not names:
                raise PackError(f"{src}: no tar files ({', '.join(TAR_SUFFIXES)})")
            return [f"{scheme}://{n}" for n in names]
        target, name = url_target(src)
        target.retry(name, lambda: target.fs.size(target.path(name)))
    except access.ObjectNotFound:
        raise PackError(f"source not found: {src}") from None
    except (StoreError, ShardkitError) as exc:
        raise PackError(f"{src}: cannot list: {exc}") from None
    return [src]


def _lists_tars(src: str) -> bool:
    """Whether the folder URL ``src`` holds tars (True when it cannot be listed: the scan then
    says why). A filesystem of its own (timeouts bounded, no cached endpoint)."""
    from ...remote.listing import list_folder

    try:
        names = list_folder(remote().RemoteTarget(src.rstrip("/")), "")[1]
    except Exception:  # noqa: BLE001 - any failure to list: the scan reports it
        return True
    return any(n.lower().endswith(TAR_SUFFIXES) for n in names)


def _url_folder(url: str) -> str:
    return url.rstrip("/") if url.endswith("/") else url.rsplit("/", 1)[0]


def _url_classes(folder: str) -> list[str] | None:
    target, name = url_target(folder + "/classes.json")
    try:
        raw = target.bounded(name, lambda timeout: target.fs.cat_file(target.path(name),
                                                                      **timeout), 0)
    except remote().ObjectNotFound:
        return None
    except StoreError as exc:
        raise PackError(str(exc)) from None
    try:
        names = json.loads(raw)
    except ValueError as exc:
        raise PackError(f"{folder}/classes.json: not a JSON list of class names ({exc})"
                        ) from None
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise PackError(f"{folder}/classes.json: not a JSON list of class names")
    return names


class WebDatasetSource(ContainerSource):
    name = "webdataset"
    summary = "WebDataset tar shards (a tar, a brace pattern, or a folder of tars)"
    keyed = True

    def detect(self, src: str) -> bool:
        if is_url(src):  # a folder URL holding no tars is an image folder's (sources.folder)
            return is_tar_url(src) and (not src.endswith("/") or bool(_BRACE.search(src))
                                        or _lists_tars(src))
        if _BRACE.search(src):
            return True
        if os.path.isdir(src):
            return any(n.lower().endswith(TAR_SUFFIXES) for n in os.listdir(src))
        try:
            return os.path.isfile(src) and tarfile.is_tarfile(src)
        except OSError:
            return False

    def check(self, options: SourceOptions) -> None:
        """A URL SRC is read when it names tars (:func:`is_tar_url`); other URLs are refused."""
        if not is_tar_url(options.src):
            super().check(options)

    def scan_shards(self, src: str, options: SourceOptions) -> Scanned:
        image_keys = options.keys(options.image_key, IMAGE_KEYS)
        label_keys = options.keys(options.label_key, LABEL_KEYS)
        files = expand(src)
        if is_url(src):
            root = _url_folder(src if src.endswith("/") else files[0])
            scanned = Scanned(root, [], _url_classes(root))
        else:
            root = src if os.path.isdir(src) else os.path.dirname(os.path.abspath(files[0]))
            root = os.path.abspath(root)
            scanned = Scanned(root, [], read_classes_file(root))
        for path in files:
            try:
                scanned.shards.append(self._scan_tar(
                    path if is_url(path) else os.path.abspath(path), root, image_keys,
                    label_keys, scanned.skipped, options.id_key))
            except TransferFailed as exc:  # a request for a tar at a URL: never a skip
                raise PackError(str(exc)) from None
        return scanned

    def _scan_tar(self, path: str, root: str, image_keys: tuple[str, ...],
                  label_keys: tuple[str, ...], skipped: list[dict[str, str]],
                  id_key: str | None = None) -> Shard:
        rel = path[len(root) + 1:] if is_url(path) and path.startswith(root + "/") else \
            os.path.relpath(path, root)
        shard = Shard(path, rel)
        where = os.path.join(root, rel)

        def skip(member: str, reason: str) -> None:
            skipped.append({"path": member_name(where, member), "reason": reason})

        try:
            if is_url(path):  # every request retried and cut at its deadline; failed: an error
                try:
                    size = object_size(path)
                except TransferFailed as exc:
                    raise PackError(str(exc)) from None
                raw = io.BufferedReader(RangeFile(path, size), SCAN_BLOCK)
            else:
                raw = open(path, "rb")
                size = os.fstat(raw.fileno()).st_size
        except OSError as exc:
            skipped.append({"path": where, "reason": f"cannot read tar: {exc.strerror or exc}"})
            return shard
        with raw:
            try:
                tar = tarfile.open(fileobj=raw, mode="r:*")
            except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
                skipped.append({"path": where, "reason": f"not a readable tar: {exc}"})
                return shard
            compressed = tar.fileobj is not raw
            if compressed and is_url(path):  # members would be read by decompressed offsets
                raise PackError(f"{where}: a compressed tar at a URL cannot be read member by "
                                "member; decompress it, or copy it to a local folder")
            sample: dict[str, tuple[str, int, int]] = {}
            small: dict[str, bytes] = {}  # label and field members, read now
            key = None

            def flush() -> None:
                if key is None:
                    return
                self._add_sample(shard, key, sample, small, image_keys, label_keys, skip, id_key)

            while True:
                try:
                    info = tar.next()
                except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
                    skipped.append({"path": where, "reason": f"corrupt tar after {len(shard.members)}"
                                    f" samples: {exc}; the rest of this tar is not packed"})
                    break
                if info is None:
                    break
                tar.members = []  # headers already seen are not kept (bounded memory)
                name = info.name
                parts = PurePosixPath(name).parts
                if name.startswith("/") or ".." in parts:
                    raise PackError(f"{where}: member {name!r} points outside the archive; "
                                    "refusing this tar")
                if info.issym() or info.islnk():
                    raise PackError(f"{where}: member {name!r} is a link; refusing this tar")
                if info.isdir():
                    continue
                if not info.isreg():
                    raise PackError(f"{where}: member {name!r} is not a regular file; refusing "
                                    "this tar")
                if "/" not in name and name.startswith("__") and name.endswith("__"):
                    continue
                if not compressed and info.offset_data + info.size > size:
                    skip(name, f"truncated member: its header says {info.size} bytes, the tar "
                         f"holds {max(0, size - info.offset_data)} more")
                    break
                prefix, suffix = base_plus_ext(name)
                if prefix is None:
                    continue
                suffix = suffix.lower()
                if prefix != key:
                    flush()
                    key, sample, small = prefix, {}, {}
                if suffix in sample:
                    skip(name, f"duplicate member suffix {suffix!r} in sample {prefix!r}")
                    continue
                sample[suffix] = (name, info.offset_data, info.size)
                if wds_field(suffix) is not None and suffix not in image_keys:
                    if info.size > FIELD_BYTES:
                        skip(name, f"field member of {info.size} bytes (more than {FIELD_BYTES})")
                    else:
                        try:
                            small[suffix] = tar.extractfile(info).read()
                        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
                            skip(name, f"cannot read field member: {exc}")
                if (suffix in label_keys or suffix == id_key) and info.size <= LABEL_BYTES:
                    try:
                        small[suffix] = tar.extractfile(info).read()
                    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
                        skip(name, f"cannot read label member: {exc}")
            flush()
        return shard

    @staticmethod
    def _add_sample(shard: Shard, key: str, sample: dict[str, tuple[str, int, int]],
                    small: dict[str, bytes], image_keys: tuple[str, ...],
                    label_keys: tuple[str, ...], skip, id_key: str | None = None) -> None:
        for suffix, (name, _, _) in sample.items():
            if suffix.rsplit(".", 1)[-1] in PICKLED:
                skip(name, "pickled member refused (never loaded)")
        image = next((k for k in image_keys if k in sample), None)
        if image is None:
            first = next(iter(sample.values()))[0]
            skip(first, f"sample {key!r} has no image member ({';'.join(image_keys)})")
            return
        name, offset, size = sample[image]
        label_key = next((k for k in label_keys if k in sample), None)
        if label_key is None:
            skip(name, f"sample {key!r} has no label member ({';'.join(label_keys)})")
            return
        if label_key not in small:
            skip(name, f"label member {sample[label_key][0]!r} is not a short text")
            return
        try:
            label = small[label_key].decode("utf-8").strip()
        except UnicodeDecodeError:
            skip(name, f"label member {sample[label_key][0]!r} is not UTF-8 text")
            return
        record_key: Any = key
        if id_key not in (None, "__key__"):
            if id_key not in small:
                skip(name, f"sample {key!r} has no short key member {id_key!r} (`id_key`)")
                return
            try:
                record_key = small[id_key].decode("utf-8").strip()
            except UnicodeDecodeError:
                skip(name, f"key member {sample[id_key][0]!r} is not UTF-8 text")
                return
        values = {}
        for suffix, data in small.items():
            field = wds_field(suffix)
            if field is None or suffix == label_key:
                continue
            try:
                values[field] = decode_member(suffix, data)
            except FieldRejected as exc:
                skip(sample[suffix][0], f"field member refused: {exc}")
        shard.members.append(member_name(shard.name, name))
        shard.refs.append((offset, size))
        shard.labels.append(label)
        shard.fields.append(values)
        if id_key is not None:
            shard.keys.append(record_key)

    @staticmethod
    def read(file: str, a: int, b: int, limit: int | None) -> bytes:
        if limit is not None and b > limit:
            raise MemberError(f"member of {b} bytes is larger than any image within "
                              "--max-pixels can be")
        f = open_cached(file)
        try:
            data = f.pread(a, b)
        except (OSError, EOFError, zlib.error) as exc:
            raise MemberError(f"cannot read member: {exc}") from None
        if len(data) != b:
            raise MemberError(f"truncated member: {len(data)} of {b} bytes")
        return data
