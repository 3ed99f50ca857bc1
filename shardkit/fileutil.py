"""File helpers shared by packing, reading and inspection: one copy of each.

Only regular files are ever read as stores or sources: opening a FIFO blocks until a writer
comes, and a device (``/dev/zero``) never ends, so both are refused before any ``read``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import uuid

from .errors import PackError, ShardkitError, StoreError

# Non-blocking: an open() of a FIFO returns at once instead of waiting for a writer.
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class NotRegularFile(StoreError):
    """The path is a FIFO, device, socket or folder where a regular file is needed."""


def file_size(path: str) -> int:
    """Size of the regular file at ``path``; ``StoreError`` when it is missing or anything else
    (a FIFO, a device, a folder)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise StoreError(f"store file not found: {path}") from None
    except OSError as exc:
        raise StoreError(f"cannot stat {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise NotRegularFile(f"{path} is {kind}, not a store file")
    return st.st_size


def has_size(path: str, size: int | None) -> bool:
    """True when ``path`` is a regular file of ``size`` bytes (any size when None)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (size is None or st.st_size == size)


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """``(descriptor, stat)`` of the regular file at ``path``, opened read-only without blocking.

    Raises ``OSError`` when it cannot be opened and ``NotRegularFile`` (closing the descriptor)
    when it is not a regular file.
    """
    fd = os.open(path, READ_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
    """SHA-256 of a regular file (a FIFO or device is refused: reading it could block), read
    into one buffer of ``chunk`` bytes: the memory does not follow the file's size."""
    file_size(path)
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def read_bounded(path: str, max_bytes: int, what: str, *, folder: str | None = None,
                 error: type[ShardkitError] = PackError) -> bytes:
    """The bytes of the file at ``path``, refused with ``error`` before any read when it is
    larger than ``max_bytes``. ``what`` names the file in messages ("COCO": "COCO file not
    found: ..."); ``folder`` is what a folder at ``path`` is told (default "the <what> must be
    a file"). Reads at most ``max_bytes + 1`` bytes, so a file growing meanwhile stays bounded."""
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            raise error(f"{path}: {what} file of {size} bytes is larger than the "
                        f"{max_bytes}-byte limit")
        with open(path, "rb") as f:
            return f.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{what} file not found: {path}") from None
    except IsADirectoryError:
        raise error(f"{path}: {folder or f'the {what} must be a file'}, not a folder") from None
    except OSError as exc:
        raise error(f"cannot read {what} file {path}: {exc.strerror}") from None


def write_synced(path: str, data: bytes) -> None:
    """Write ``data`` to a new file at ``path`` and flush it to disk."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def replace_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` by ``data``, synced: readers see the old or the new file whole."""
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"  # unique: several nodes may write one file at once
    write_synced(tmp, data)
    os.replace(tmp, path)


def fsync_dir(folder: str) -> None:
    """Make a folder's entries (renames, new files) durable; best effort where unsupported."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def unlink(path: str) -> None:
    """Delete a file; one already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove(path: str) -> None:
    """Delete a file or a whole folder (not following a symlink to one); missing is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        unlink(path)


def check_parent(path: str, error: type[Exception]) -> str:
    """The folder ``path`` goes in. When it is missing, the folders :func:`make_parent` will create
    must go under an existing, writable folder: else ``error`` names that nearest ancestor."""
    folder = os.path.dirname(os.path.abspath(path))
    ancestor = folder
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise error(f"cannot write {path}: {ancestor} is not a folder; no output written")
    if ancestor == folder:
        return folder
    if not os.access(ancestor, os.W_OK | os.X_OK):  # EROFS for root too
        raise error(f"cannot write {path}: folder {folder} does not exist and cannot be created "
                    f"in {ancestor} (not writable); no output written")
    return folder


def make_parent(path: str, error: type[Exception]) -> str:
    """The folder ``path`` goes in, created with any missing folders above it (``mkdir -p``),
    never under an existing ancestor this process cannot write (``error`` names it)."""
    folder = check_parent(path, error)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise error(f"cannot write {path}: cannot create folder {folder}: "
                    f"{e.strerror or e}; no output written") from None
    return folder
