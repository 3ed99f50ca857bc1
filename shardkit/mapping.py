"""``shardkit.add_field(out, name, fn)``: a typed field computed from a folder store's records
(a model's embedding, VAE latents, a caption) and installed as the store's next version, no
shard rewritten (:mod:`shardkit.fields.added`).

The records are read with ``ShardDataset(out, **dataset_options)`` through its loader
(``batch_size``, ``num_workers=workers``), in the store's order; ``fn(batch)`` returns one value
per record of the batch (a sequence, or an array whose first axis is the batch). Each batch's
values are kept in a work folder beside OUT (``.OUT.field-NAME.partial``; for a store at a URL,
beside the pack staging folders under ``$SHARDKIT_CACHE_DIR``) as soon as they are computed, so a
run that is killed resumes where it stopped (the same call again); the version is installed once
every record has its value. A field already added is computed again only for the records packed
after it (``append``), unless ``overwrite``. At a URL the column files are uploaded under names
no version uses and the version switched in as an ``update`` there switches its own
(:func:`shardkit.packing.nextversion.install`): under the prefix's lock, only if the manifest is
still the one read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import metadata
from .errors import OptionError, PackError
from .fields import DTYPES, Field, FieldError, Ragged, Schema, ShardFields, added
from .fileutil import remove, replace_atomic
from .packing import nextversion
from .packing.append import load_base, write_array
from .packing.append_remote import load_remote_base
from .packing.install import partial_path
from .packing.staging import staging_path
from .progress import progress as progress_bar
from .read.dataset import ShardDataset
from .urls import is_url
from .versionmeta import number_of


@dataclass(frozen=True)
class AddFieldResult:
    """The version :func:`add_field` installed, the field, and how many records it computed
    now (``resumed``: how many a killed run had computed)."""

    out: str
    version: int
    field: Field
    computed: int
    resumed: int


def add_field(out: str | os.PathLike, name: str, fn: Callable[[Any], Any], *,
              field: Field | None = None, batch_size: int = 64, workers: int = 0,
              overwrite: bool = False, progress: bool = True,
              storage_options: dict[str, Any] | None = None,
              **dataset_options: Any) -> AddFieldResult:
    """Compute field ``name`` for every record of the folder store ``out`` with ``fn`` and
    install it as the store's next version; readers then ask for it like any field
    (``ShardDataset(out, fields=[name])``).

    Args:
        out: a folder store, local or at a URL (``s3://bucket/prefix``: the records are read
            through the local cache, the batches kept under ``$SHARDKIT_CACHE_DIR`` and the
            column uploaded, no shard written).
        name: the field's name (not one the store has, unless it was added before).
        fn: ``fn(batch) -> values``, one value per record of the batch, in order.
        field: its declaration (``shardkit.fields.Array(name, shape, dtype)``, ``Text(name)``,
            ...); None: inferred from the first batch's values as ``Schema.infer`` does.
        batch_size, workers: the loader's batch size and worker processes.
        overwrite: compute every record again (else only those without a value).
        progress: show a progress bar on stderr.
        storage_options: options of the fsspec filesystem of a URL ``out``.
        **dataset_options: for ``ShardDataset`` (``crop=``, ``output=``, ``fields=``...).
    """
    out = os.fspath(out).rstrip("/") or "/"
    remote = is_url(out)
    base = load_remote_base(out, storage_options, keys=False) if remote else load_base(out)
    old = [e for e in added.entries(base.manifest) if e["field"]["name"] == name]
    packed = Schema.from_json(base.manifest["fields"]) if base.manifest.get("fields") else []
    if name == "label" or name in [f.name for f in packed]:
        raise OptionError(f"add_field: the store already has a packed field {name!r}")
    if field is not None and (not isinstance(field, Field) or field.name != name):
        raise OptionError(f"add_field: field must be a shardkit.fields kind named {name!r}, "
                          f"got {field!r}")
    if old and not overwrite:
        declared = Schema.from_json([old[0]["field"]])[name]
        if field is not None and field != declared:
            raise OptionError(f"add_field: {name!r} was added as {declared!r}; pass "
                              "overwrite=True to add it as {field!r}")
        field, done_rows = declared, old[0]["rows"]
    else:
        done_rows = 0
    if remote:
        dataset_options["storage_options"] = storage_options
    ds = ShardDataset(out, version=number_of(base.manifest), **dataset_options)
    places = _places(ds)
    todo = np.flatnonzero(places >= done_rows)
    work = _Work(f"{staging_path(out, storage_options)}.field-{name}.partial" if remote else
                 _beside(out, name), number_of(base.manifest), field)
    # Each computed value by physical place: those a killed run kept, then this run's.
    got = {p: v for where, values in work.load().values()
           for p, v in zip(where.tolist(), values)}
    if got:
        field = work.field
    resumed = len(got)
    todo = np.array([i for i in todo.tolist() if int(places[i]) not in got], dtype=np.int64)
    computed = 0
    if len(todo):
        loader = ds.loader(batch_size, sampler=todo.tolist(), num_workers=workers)
        bar = progress_bar(len(todo), progress, f"add_field {name}", unit="rec")
        at = 0
        try:
            for batch in loader:
                values = list(fn(batch))
                n = len(values)
                if n != min(batch_size, len(todo) - at):
                    raise OptionError(f"add_field: fn returned {n} values for a batch of "
                                      f"{min(batch_size, len(todo) - at)} records")
                field = work.field = field or Schema.infer({name: v} for v in values)[name]
                where, checked = places[todo[at:at + n]], [_checked(field, v) for v in values]
                work.save(where, checked)
                got.update(zip(where.tolist(), checked))
                at, computed = at + n, computed + n
                bar.update(n)
        finally:
            bar.close()
    if field is None:
        raise PackError(f"add_field: {out} has no record to compute {name!r} for")
    version = _install(base, ds, field, old[0] if old and not overwrite else None, got)
    work.remove()
    return AddFieldResult(out, version, field, computed, resumed)


def _places(ds: ShardDataset) -> np.ndarray:
    """Each of ``ds``'s records' physical place in the shards."""
    store = ds.store
    every = np.arange(len(ds), dtype=np.int64)
    return np.asarray(store.physical(every)) if hasattr(store, "physical") else every


def _checked(field: Field, value: Any) -> Any:
    try:
        return field.check(value, {"height": 0, "width": 0})
    except FieldError as exc:
        raise OptionError(f"add_field: {exc}") from None


def _filler(field: Field) -> Any:
    """The value of a record no version reads (deleted): never returned."""
    if isinstance(field, Ragged):
        return np.empty((0, *field.inner), DTYPES[field.dtype])
    return field.null_value()


class _Work:
    """The computed batches of one field, kept beside OUT until the version is installed."""

    def __init__(self, folder: str, version: int, field: Field | None) -> None:
        self.folder, self.version, self.field = folder, version, field

    def load(self) -> dict[str, tuple[np.ndarray, list[Any]]]:
        """The batches a killed run kept, if it read this same version (else started over)."""
        try:
            with open(os.path.join(self.folder, "work.json"), "rb") as f:
                info = json.loads(f.read())
        except (OSError, ValueError):
            self.remove()
            return {}
        if info.get("version") != self.version or (self.field is not None and
                                                   info.get("field") != self.field.as_json()):
            self.remove()
            return {}
        self.field = Schema.from_json([info["field"]])[info["field"]["name"]]
        out = {}
        for entry in sorted(os.listdir(self.folder)):
            if entry.startswith("batch-") and entry.endswith(".npz"):
                with np.load(os.path.join(self.folder, entry), allow_pickle=False) as z:
                    cols = {k: z[k] for k in z.files if k != "places"}
                    where = z["places"]
                fields = ShardFields(Schema([self.field]), cols, np.zeros(len(where), np.int32),
                                     np.zeros(len(where), np.int32), entry)
                out[entry] = (where, [fields.value(self.field.name, j) for j in range(len(where))])
        return out

    def save(self, places: np.ndarray, values: list[Any]) -> None:
        os.makedirs(self.folder, exist_ok=True)
        info = os.path.join(self.folder, "work.json")
        if not os.path.exists(info):
            replace_atomic(info, metadata.dumps({"version": self.version,
                                                 "field": self.field.as_json()}))
        n = len([e for e in os.listdir(self.folder) if e.startswith("batch-")])
        path = os.path.join(self.folder, f"batch-{n:08d}.npz")
        with open(path + ".tmp", "wb") as f:
            np.savez(f, places=np.asarray(places, "<i8"), **self.field.columns(values))
        os.replace(path + ".tmp", path)

    def remove(self) -> None:
        remove(self.folder)


def _beside(out: str, name: str) -> str:
    """The work folder of field ``name`` of the local store ``out``."""
    head, tail = os.path.split(partial_path(out))
    return os.path.join(head, f"{tail.removesuffix('.partial')}.field-{name}.partial")


def _install(base: Any, ds: ShardDataset, field: Field, old: dict[str, Any] | None,
             got: dict[int, Any]) -> int:
    """The version with ``field``'s column over every physical record: the values it had
    (``old``), then ``got`` (physical place -> value)."""
    count = base.manifest["count"]
    values: list[Any] = [None] * count
    if old is not None:  # the values it had (the records packed before it was added)
        cols = {k: ds.store.side_array(v["file"], v["sha256"])  # checked, local or fetched
                for k, v in old["columns"].items()}
        rows = np.zeros(old["rows"], np.int32)
        kept = ShardFields(Schema([field]), cols, rows, rows, base.out)
        values[:old["rows"]] = [kept.value(field.name, i) for i in range(old["rows"])]
    for p, v in got.items():
        values[p] = _checked(field, v)
    values = [_filler(field) if v is None else v for v in values]
    with nextversion.work_folder(base) as partial:
        columns = {col: write_array(partial, f"column-{col[2:]}.npy", arr)
                   for col, arr in field.columns(values).items()}
        manifest = nextversion.carried(base)
        others = [e for e in added.entries(manifest) if e["field"]["name"] != field.name]
        manifest[added.KEY] = others + [{"field": field.as_json(), "rows": count,
                                         "columns": columns}]
        return nextversion.install(base, partial, manifest,
                                   {"kind": "add_field", "field": field.name})


__all__ = ["AddFieldResult", "add_field"]
