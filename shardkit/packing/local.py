"""The local engine: shards written in this process from local encoding workers, and
:func:`pack_shard`, one shard packed in this process (the unit of work of Dask and of nodes)."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator


from ..dedup import DUPLICATE
from ..errors import PackError
from ..fields import FieldError
from . import stream
from . import workers as encoders
from ..progress import progress as progress_bar
from .plan import PackPlan
from .encoding import Encoded
from .writer import StoreWriter, remove_store_files

ShardDone = Callable[[int, dict[str, Any]], None]
#: :func:`pack_shard` encodes up to this many records, or this many bytes of them, before it
#: writes them. Encoding and writing one record at a time took 9-10 % more CPU an image (8x8
#: images: 84-89 µs against 76-80, alternating runs on one CPU): the decoder's and the store's
#: code and data take turns in the core's caches; the local engine's encoders and writer are
#: apart by design.
BATCH_RECORDS, BATCH_BYTES = 64, 8 << 20


class ShardStopped(Exception):
    """A shard's packing stopped because its ``stop`` check said so (its pack stopped)."""


def add_source(writer: StoreWriter, plan: PackPlan, source: int, path: str, label: int,
               result: Encoded, crc: int | None, strict: bool) -> None:
    """Append the record of ``source`` (its index in the sources' order; ``path``, ``label``:
    from :meth:`PackPlan.rows`), or record why it was skipped; ``crc`` if already known."""
    if result.data is None:
        if strict:
            raise PackError(f"{path}: {result.reason} (`strict=True`: no output written)")
        writer.skip(path, result.reason or "unknown error")
        return
    fields = {}
    try:
        if plan.fields is not None:  # the record's typed fields, on its stored pixels
            fields = plan.fields.record_at(source, path, result)
        writer.add_encoded(result.data, label, result.height, result.width, path, crc,
                           **fields)
    except FieldError as exc:  # checked before anything is appended
        if strict:
            raise PackError(f"{path}: annotation: {exc} (`strict=True`: no output written)"
                            ) from None
        writer.skip(path, f"annotation: {exc}")


def add_unique(writer: StoreWriter, plan: PackPlan, dedup: Any, row: tuple[int, str, int],
               result: Encoded, crc: int | None, strict: bool) -> None:
    """:func:`add_source`, unless the record duplicates one already written: then it is skipped
    with the reason ``duplicate of <kept path>``."""
    source, path, label = row
    name = plan.relpath(path)
    kept = dedup.duplicate_of(name, result.digest)
    if kept is not None:
        writer.skip(path, DUPLICATE + kept)
        return
    before = writer.count
    add_source(writer, plan, source, path, label, result, crc, strict)
    if writer.count > before:  # not refused for its fields
        dedup.keep(name, result.digest)


def run_local(plan: PackPlan, shards: list[int], dest: dict[int, str], *, workers: int,
              strict: bool, progress: bool, on_shard_done: ShardDone,
              on_start: Callable[[], None] = lambda: None,
              on_record: Callable[[], None] = lambda: None, dedup: Any = None) -> None:
    """Encode the given shards with local encoding workers, writing each through a StoreWriter.

    ``on_start`` is called once the encoders are up, as encoding begins; ``on_record`` once the
    first record is written. ``dedup`` (a :class:`shardkit.dedup.Deduper`) skips each record
    that duplicates one written before it, whatever ``strict`` says (it is not unusable).
    """
    rows = [plan.rows(k) for k in shards]
    records = stream.encoded_stream([item for _, items in rows for item in items],
                                    plan.settings, workers)
    on_start()
    bar = progress_bar(sum(len(items) for _, items in rows), progress, "pack")
    try:
        for k, (row, _) in zip(shards, rows):
            with plan.shard_writer(k, dest[k]) as writer:
                for source, path, label in zip(*row):
                    result, crc = next(records)
                    if dedup is not None and result.data is not None:
                        add_unique(writer, plan, dedup, (source, path, label), result, crc,
                                   strict)
                    else:
                        add_source(writer, plan, source, path, label, result, crc, strict)
                    on_record()
                    bar.update(1)
            on_shard_done(k, writer.entry)
    finally:
        bar.close()
        records.close()


def pack_shard(plan: PackPlan, k: int, dest: str, strict: bool = False, upload: Any = None,
               encoded: Callable[[], Any] | None = None,
               stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Pack shard ``k`` of ``plan`` in this process into ``dest``; returns its manifest entry.

    With ``upload`` (a :class:`shardkit.remote.Uploader`) the shard is uploaded from here and
    its local file deleted (see :func:`upload_shard`). ``encoded`` is called once every record
    is in, before the file is finished (index, fsync, checksum) and uploaded: what is left is
    mostly waiting on the disk and the network (the Dask engine hands the core on there when
    it uploads). ``stop`` is asked before each batch of records (:data:`BATCH_RECORDS`): when
    it says True the partial file is deleted and :class:`ShardStopped` raised
    (the Dask engine's task whose pack stopped: Dask cannot stop a running task).
    """
    if upload is not None:  # a staging folder on this worker's own disk
        os.makedirs(os.path.dirname(dest), exist_ok=True)
    # Left by an attempt that was killed (a lost Dask worker, say).
    remove_store_files([dest], plan.settings.format)
    rows, items = plan.rows(k)
    batches = _batches(zip(*rows, encoders.encode_many(items, plan.settings)), strict)
    with plan.shard_writer(k, dest) as writer:
        while True:
            if stop is not None and stop():
                raise ShardStopped(f"shard {k}: its pack stopped")
            batch = next(batches, None)  # encoded here, after the check
            if batch is None:
                break
            for source, path, label, record in batch:
                add_source(writer, plan, source, path, label, record, None, strict)
        if encoded is not None:
            encoded()
    return writer.entry if upload is None else upload_shard(upload, dest, writer.entry)


def _batches(records: Iterator[tuple[int, str, int, Encoded]], strict: bool
             ) -> Iterator[list[tuple[int, str, int, Encoded]]]:
    """``records`` encoded a batch at a time: up to :data:`BATCH_RECORDS`, or fewer holding
    :data:`BATCH_BYTES`. What happens is what one record at a time did: an error while a
    record is read or encoded (a URL's read out of retries) comes after the records before it
    are handed on, and with ``strict`` a rejected record ends its batch (its PackError first,
    no record after it decoded for nothing)."""
    batch, size = [], 0
    try:
        for row in records:
            batch.append(row)
            size += len(row[3].data or b"")
            if len(batch) >= BATCH_RECORDS or size >= BATCH_BYTES or \
                    (strict and row[3].data is None):
                yield batch
                batch, size = [], 0
    except Exception:
        if batch:
            yield batch
        raise
    if batch:
        yield batch


def upload_shard(uploader: Any, path: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Upload a finished shard file and delete it (staging then holds only shards in progress).

    The returned entry says so (``uploaded``): the manifest is merged without the file (its
    labels come from the plan, :mod:`.merging`)."""
    uploader.put_shard(path, entry["file"], entry["sha256"], entry["bytes"])
    remove_store_files([path], entry["format"])
    return entry | {"uploaded": True}
