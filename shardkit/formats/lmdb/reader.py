"""Reads one LMDB shard, after :mod:`.validate` has checked the file LMDB will map."""

from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from typing import Iterator

import lmdb

from ...errors import StoreError
from ...forklock import ForkLock
from ..base import RecordFetch, ShardReader
from .validate import ARRAY_PREFIX, META_KEY, check_pages, layout, record_key, side_key

MAX_READERS = 2048


# lmdb refuses to open one file twice in a process (a forked child inherits the parent's handle
# too), so each process keeps one environment per file and shares it between readers. Files are
# told apart by inode, not name: a store replaced under the same name is a different file.
_ENVS: dict[tuple[int, int], tuple[int, lmdb.Environment, int]] = {}
# Threads of one process open and close readers at once (``ds.loader(engine="threads")``): two
# opening one file must share its environment. Made again in a forked child.
_ENVS_LOCK = ForkLock(reentrant=True)  # re-entrant: a finalizer may release a reader mid-open


def _env_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _acquire_env(path: str) -> lmdb.Environment:
    with _ENVS_LOCK:
        return _acquire_env_locked(path)


def _acquire_env_locked(path: str) -> lmdb.Environment:
    key = _env_key(path)
    pid = os.getpid()
    for other, (owner, env, _) in list(_ENVS.items()):
        if owner != pid:  # inherited over fork: unusable here, holds a descriptor, blocks an open
            env.close()
            del _ENVS[other]
    entry = _ENVS.get(key)
    if entry is not None:
        owner, env, refs = entry
        _ENVS[key] = (owner, env, refs + 1)
        return env
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False,
                    meminit=False, max_readers=MAX_READERS, max_dbs=0,
                    map_size=os.stat(path).st_size)
    _ENVS[key] = (pid, env, 1)
    return env


def _release_env(env: lmdb.Environment) -> None:
    with _ENVS_LOCK:
        _release_env_locked(env)


def _release_env_locked(env: lmdb.Environment) -> None:
    key = next((k for k, v in _ENVS.items() if v[1] is env), None)
    entry = _ENVS.get(key) if key is not None else None
    if entry is None:
        return
    owner, _, refs = entry
    if refs > 1:
        _ENVS[key] = (owner, env, refs - 1)
    else:
        del _ENVS[key]
        env.close()


class LmdbShardReader(ShardReader):
    format_name = "lmdb"
    library_errors = (lmdb.Error,)

    def _open(self) -> None:
        psize, need = layout(self.path)
        if self.file_size < need:
            raise StoreError(f"{self.path}: LMDB file is truncated ({self.file_size} bytes, "
                             f"header needs {need})")
        check_pages(self.path, psize, need, self.file_size)
        env = _acquire_env(self.path)
        try:
            # Index arrays are views into this long-lived read transaction's map: no copies.
            txn = env.begin(buffers=True)
        except BaseException:
            _release_env(env)
            raise
        self._env, self._array_txn = env, txn
        # A reader dropped without close() must still give its environment back, or a later open
        # of the same file in this process would be refused as "already open".
        self._release = weakref.finalize(self, _release_reader, env, txn)

    def _meta(self) -> bytes | None:
        with self._env.begin() as txn:
            return txn.get(META_KEY)

    def _array(self, name: str, dtype: str, shape: tuple[int, ...]) -> memoryview | None:
        return self._array_txn.get(ARRAY_PREFIX + name.encode())

    @contextmanager
    def _records(self) -> Iterator[RecordFetch]:
        txn = self._env.begin(buffers=True)
        get = txn.get
        try:
            yield lambda i: get(record_key(i))
        finally:
            txn.abort()

    @contextmanager
    def _side_records(self, stream: str) -> Iterator[RecordFetch]:
        txn = self._env.begin(buffers=True)
        get = txn.get
        try:
            yield lambda i: get(side_key(i, stream)) if i >= 0 else None
        finally:
            txn.abort()

    def close(self) -> None:
        self._env = None
        release = getattr(self, "_release", None)
        if release is not None:
            release()


def _release_reader(env: lmdb.Environment, txn: lmdb.Transaction) -> None:
    txn.abort()
    _release_env(env)
