"""The contract every backend in the format registry keeps, run against each of them.

A shard is written through the backend's writer and read back through ``open_reader``: records,
index arrays and metadata come back byte for byte; what is missing, truncated, foreign or not a
regular file is refused with ``StoreError`` (never a crash, a hang or other data).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from shardkit import formats
from shardkit.errors import StoreError

RECORDS = [bytes([k]) * (1 + 997 * k) for k in range(12)]  # 1 byte .. ~11 KB, all different
ARRAYS = {"labels": np.arange(12, dtype="<i8") * 7 - 3,
          "blob": np.frombuffer(b"some source paths\xff", dtype="|u1")}
META = b'{"anything": "the backend stores opaque bytes", "n": 12}'


def write(path: str, fmt: str) -> str:
    writer = formats.open_writer(path, fmt)
    for data in RECORDS:
        writer.append(data)
    assert writer.count == len(RECORDS)
    writer.finish(ARRAYS, META)
    return path


@pytest.fixture(params=formats.FORMATS)
def shard(request, tmp_path) -> tuple[str, str]:
    """(format, path) of a shard written by that backend."""
    fmt = request.param
    return fmt, write(str(tmp_path / f"shard{formats.SUFFIXES[fmt]}"), fmt)


def test_registry_names_each_backend_once():
    assert formats.FORMATS and formats.DEFAULT_FORMAT == formats.FORMATS[0]
    for fmt in formats.FORMATS:
        b = formats.backend(fmt)
        assert b.name == fmt and b.suffixes[0] == formats.SUFFIXES[fmt]
        assert formats.READERS[fmt] is b.reader and formats.WRITERS[fmt] is b.writer
        for suffix in b.suffixes:
            assert formats.format_for_path(f"/x/out{suffix.upper()}") == fmt
    assert formats.format_for_path("/x/out") == formats.DEFAULT_FORMAT
    with pytest.raises(ValueError, match="unknown format 'zip'"):
        formats.backend("zip")


def test_round_trip(shard):
    fmt, path = shard
    assert formats.detect_format(path) == fmt
    reader = formats.open_reader(path)
    try:
        assert type(reader) is formats.READERS[fmt]
        assert bytes(reader.meta_json()) == META
        arrays = {name: np.array(reader.array(name, arr.dtype.str, arr.shape))
                  for name, arr in ARRAYS.items()}
        reader.release_library_handle()
        with reader.records() as get:
            got = [bytes(get(i)) for i in reversed(range(len(RECORDS)))][::-1]
    finally:
        reader.close()
    assert got == RECORDS
    for name, arr in ARRAYS.items():
        assert arrays[name].dtype == arr.dtype and np.array_equal(arrays[name], arr)


def test_missing_record_and_array_are_store_errors(shard):
    fmt, path = shard
    reader = formats.open_reader(path, fmt)
    try:
        with pytest.raises(StoreError, match="index array 'heights' is missing"):
            reader.array("heights", "<i4", (12,))
        with pytest.raises(StoreError, match=r"index array 'labels' .*\(damaged store\)"):
            reader.array("labels", "<i8", (13,))  # metadata promising another shape
        with reader.records() as get:
            for i in (len(RECORDS), len(RECORDS) + 1000):
                with pytest.raises(StoreError, match=f"record {i} is missing"):
                    get(i)
            assert bytes(get(0)) == RECORDS[0]  # the context survives a refused read
    finally:
        reader.close()


@pytest.mark.parametrize("keep", [0.5, 0.9, 64 / 100_000])
def test_truncated_shard_is_refused(shard, tmp_path, keep):
    fmt, path = shard
    cut = str(tmp_path / f"cut{formats.SUFFIXES[fmt]}")
    shutil.copyfile(path, cut)
    size = os.path.getsize(cut)
    os.truncate(cut, max(64, int(size * keep)))
    with pytest.raises(StoreError):
        reader = formats.open_reader(cut, fmt)
        try:  # a backend may open it and refuse on first read: every read must refuse
            reader.meta_json()
            for name, arr in ARRAYS.items():
                reader.array(name, arr.dtype.str, arr.shape)
            with reader.records() as get:
                for i in range(len(RECORDS)):
                    assert bytes(get(i)) == RECORDS[i]
        finally:
            reader.close()


def test_foreign_files_are_refused(shard, tmp_path):
    fmt, path = shard
    junk = str(tmp_path / "junk")
    with open(junk, "wb") as f:
        f.write(os.urandom(1 << 16))
    with pytest.raises(StoreError, match="is not a shardkit store"):
        formats.detect_format(junk)
    with pytest.raises(StoreError):
        formats.open_reader(junk, fmt)
    for other in formats.FORMATS:  # another backend's shard, opened as this format
        if other != fmt:
            alien = write(str(tmp_path / f"alien{formats.SUFFIXES[other]}"), other)
            with pytest.raises(StoreError):
                formats.open_reader(alien, fmt)


def test_fifo_and_folder_are_refused_without_blocking(shard, tmp_path):
    fmt, _ = shard
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    for target in (fifo, str(tmp_path)):
        with pytest.raises(StoreError, match="not a store file"):
            formats.open_reader(target, fmt)
    with pytest.raises(StoreError, match="not a store file"):
        formats.detect_format(fifo)


def test_discard_removes_the_file_and_its_side_files(tmp_path):
    for fmt in formats.FORMATS:
        path = str(tmp_path / f"aborted{formats.SUFFIXES[fmt]}")
        writer = formats.open_writer(path, fmt)
        for data in RECORDS:
            writer.append(data)
        writer.discard()
        assert os.listdir(tmp_path) == [], fmt
        # What a killed writer leaves: removed by the registry's helper too.
        writer = formats.open_writer(path, fmt)
        writer.append(RECORDS[0])
        left = os.listdir(tmp_path)
        formats.remove_shard_file(path, fmt)
        writer.abort()
        assert os.listdir(tmp_path) == [], (fmt, left)
