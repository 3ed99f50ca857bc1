"""The steps every export shares: open the store, read each record (bytes, label, fields) in
the dataset's order (``ds[i]``), cut the output into numbered files of about ``shard_size`` bytes, write each file
under a hidden partial name and rename it when complete."""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple

import numpy as np

from ..errors import OptionError, ShardkitError
from ..fileutil import check_parent, make_parent, remove

DEFAULT_SHARD_SIZE = 1 << 30


class Record(NamedTuple):
    """One stored record as an export writes it."""

    index: int
    data: bytes          # the record's bytes as stored
    encoding: str        # the store's record encoding (jpeg, raw)
    height: int
    width: int
    label: int
    source: str          # the source path the store recorded
    fields: dict[str, Any]


@dataclass
class ExportResult:
    """What an export wrote: the files in order, the records and the bytes in them."""

    files: list[str] = field(default_factory=list)
    count: int = 0
    bytes: int = 0


def check_pattern(pattern: str) -> None:
    try:
        a, b = pattern % 0, pattern % 1
    except (TypeError, ValueError):
        raise OptionError(f"`pattern` {pattern!r} must hold one integer field such as %06d "
                          "(the file number)") from None
    if a == b:
        raise OptionError(f"`pattern` {pattern!r} must hold one integer field such as %06d")
    check_parent(a, OptionError)  # missing folders are created when the first file is opened


def as_png(record: Record) -> bytes:
    """A raw record's pixels as a lossless PNG."""
    from PIL import Image

    pixels = np.frombuffer(record.data, np.uint8).reshape(record.height, record.width, 3)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, "PNG")
    return out.getvalue()


class Exporter:
    """Subclasses open a file (:meth:`open_file`), add records (:meth:`add`) and close it
    (:meth:`close_file`, returning its size); the base class does the rest."""

    summary = ""

    def __init__(self, store: str, pattern: str, shard_size: int, overwrite: bool,
                 progress: bool) -> None:
        from ..read.store import Store

        check_pattern(pattern)
        self.store = Store(store)
        self.pattern, self.shard_size = pattern, shard_size
        self.overwrite, self.progress = overwrite, progress
        self.classes: list[str] = list(self.store.classes)
        self.schema = None
        fields_meta = self.store.meta.get("fields")
        if fields_meta:
            from ..fields import Schema

            self.schema = Schema.from_json(fields_meta)

    # -- hooks --------------------------------------------------------------------------------

    def open_file(self, file: Any) -> None:
        """Start an output file in ``file``, a binary file object opened for writing (closed
        by the caller after :meth:`close_file`)."""
        raise NotImplementedError

    def add(self, record: Record) -> int:
        """Write one record; returns about how many bytes it added."""
        raise NotImplementedError

    def close_file(self) -> None:
        raise NotImplementedError

    def finish(self, result: ExportResult) -> None:
        """After the last file (side files such as ``classes.json``)."""

    # -- shared steps -------------------------------------------------------------------------

    def records(self) -> Iterator[Record]:
        """Every record in the dataset's order (``ds[i]``: through a mixed layout, if any)."""
        from ..read.storeview import open_layout

        store = self.store
        view = open_layout(store)
        if view is store:  # physical order is the order: one read transaction per shard
            for k, entry in enumerate(store.shards):
                shard = store.shard(k)
                with shard.reader.records() as get:
                    for local in range(entry.count):
                        yield self._record(entry.start + local, shard, local, get)
            return
        for i in range(store.count):
            k, local = view.locate(i)
            shard = store.shard(k)
            with shard.reader.records() as get:
                yield self._record(i, shard, local, get)

    def _record(self, index: int, shard: Any, local: int, get: Any) -> Record:
        fields = ({} if shard.fields is None else
                  {f.name: shard.fields.value(f.name, local) for f in self.schema})
        return Record(index, bytes(get(local)), self.store.encoding, int(shard.heights[local]),
                      int(shard.widths[local]), int(shard.labels[local]),
                      shard.source_path(local), fields)

    def run(self) -> ExportResult:
        from ..progress import progress as progress_bar

        result = ExportResult()
        bar = progress_bar(self.store.count, self.progress, "export")
        current: str | None = None
        size = 0
        try:
            for record in self.records():
                if current is None or size >= self.shard_size:
                    if current is not None:
                        self._close(current, result)
                    current = self._open(len(result.files))
                    size = 0
                size += self.add(record)
                result.count += 1
                bar.update(1)
            if current is not None:
                self._close(current, result)
                current = None
            self.finish(result)
        except BaseException:
            if current is not None:
                if getattr(self, "_file", None) is not None:
                    self._file.close()
                remove(self._partial(current))
            raise
        finally:
            bar.close()
            self.store.close()
        return result

    def _open(self, n: int) -> str:
        path = self.pattern % n
        if os.path.lexists(path) and not self.overwrite:
            raise ShardkitError(f"{path} already exists (use `overwrite=True` to replace it)")
        make_parent(path, OptionError)  # `mkdir -p` its folder
        self._file = _create_partial(self._partial(path))
        self.open_file(self._file)
        return path

    def _close(self, path: str, result: ExportResult) -> None:
        self.close_file()
        self._file.close()
        os.replace(self._partial(path), path)
        result.files.append(path)
        result.bytes += os.path.getsize(path)

    @staticmethod
    def _partial(path: str) -> str:
        folder, name = os.path.split(path)
        return os.path.join(folder, f".{name}.partial")


def _create_partial(partial: str) -> Any:
    """A new file at ``partial``, opened for writing: created here (``O_EXCL``), never through a
    symbolic link planted at its name. One left by a killed export (a regular file) is replaced;
    anything else there is refused."""
    try:
        st = os.lstat(partial)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise ShardkitError(f"{partial} is in the way of the export's partial file and is "
                                "not one (a symbolic link or other non-file): remove it")
        os.unlink(partial)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | getattr(os, "O_CLOEXEC", 0), 0o644)
    except FileExistsError:
        raise ShardkitError(f"{partial} appeared while the export was creating it (another "
                            "export writing the same files?)") from None
    return os.fdopen(fd, "wb")
