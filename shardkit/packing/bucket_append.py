"""``pack(src, out, append=True)`` to a folder store packed with aspect-ratio buckets.

The new images are placed by the rule the store records in ``settings["buckets"]``
(:func:`shardkit.bucketing.from_meta`): the same rule and parameters and, for a store packed
with ``min_bucket_count``, the merges that pack made (``merged``), kept as they are. Merging
again over the union could move buckets the store's records were cut to, so an append never
merges: a bucket the store merged away stays merged however many new images it gets (a repack
of the union merges afresh). The new version's ``buckets`` entry counts the union's records.

Bucket options given with the append must be the store's (they are then replaced by the store's
rule, merges included); an append without them takes the store's. ``update``'s replace places
its images the same way; the ``buckets`` entry of a version that drops records is
:mod:`.bucket_update`'s. A bucketed store at a URL takes appends only.
"""

from __future__ import annotations

from typing import Any

from .. import bucketmeta
from ..bucketing import BucketRule
from ..errors import PackOptionError

#: The ``pack`` option each recorded rule parameter comes from (else ``buckets``); ``area``
#: follows from the others and ``merged`` is the store's to keep.
OPTION_OF = {"step": "bucket_step", "bucket_reso_steps": "bucket_step",
             "upscale": "bucket_upscale", "bucket_no_upscale": "bucket_upscale",
             "min_bucket_count": "min_bucket_count"}
_UNNAMED = ("area", "merged")


def refuse(out: str, manifest: dict[str, Any]) -> None:
    """PackOptionError for a bucketed store at a URL asked for anything but an append."""
    if manifest["settings"].get(bucketmeta.KEY) is not None:
        raise PackOptionError(f"{out}: a store at a URL packed with buckets takes `pack(..., "
                              "append=True)` but not `update`, `append='replace'`, `add_field` "
                              "or `compact`: copy it to a local folder for those")


def store_rule(out: str, manifest: dict[str, Any]) -> BucketRule | None:
    """The rule a bucketed store was packed with, its merges included (None: not bucketed).
    PackOptionError where its metadata does not record the rule as a pack records it now (an
    earlier form: the merges a ``min_bucket_count`` made could not be told)."""
    spec = manifest["settings"].get(bucketmeta.KEY)
    if spec is None:
        return None
    rule = bucketmeta.rule(spec, out)
    if rule.as_meta() != spec or ("min_bucket_count" in spec and "merged" not in spec):
        raise PackOptionError(f"{out}: `append` needs the store's bucket rule as packs record "
                              f"it now (with its merged buckets); this store records "
                              f"{spec!r}: repack the union")
    return rule


def rule_for_append(out: str, manifest: dict[str, Any], given: BucketRule) -> BucketRule:
    """The store's rule where ``given`` (the append's bucket options) is the store's rule
    before merging; else PackOptionError naming the options that differ."""
    have = store_rule(out, manifest)
    if have is None:  # check_settings names buckets among the settings that differ
        return given
    mine = {k: v for k, v in have.as_meta().items() if k not in _UNNAMED}
    asked = {k: v for k, v in given.as_meta().items() if k not in _UNNAMED}
    differ = [k for k in sorted(set(mine) | set(asked)) if mine.get(k) != asked.get(k)]
    if "rule" in differ:  # another rule: its parameters are beside the point
        differ = ["rule"]
    if differ:
        shown = []
        for option in dict.fromkeys(OPTION_OF.get(k, "buckets") for k in differ):
            keys = [k for k in differ if OPTION_OF.get(k, "buckets") == option]
            if option != "buckets":
                shown.append(f"`{option}` {asked.get(keys[0])!r} (the store: "
                             f"{mine.get(keys[0])!r})")
            else:
                shown.append(f"`buckets` {_pairs(asked, keys)} (the store: {_pairs(mine, keys)})")
        raise PackOptionError(f"`append`: the store was packed with other bucket options: "
                              f"{', '.join(shown)}; give the store's, or leave them out")
    return have


def _pairs(meta: dict[str, Any], keys: list[str]) -> str:
    return " ".join(f"{k}={meta.get(k)!r}" for k in keys)


def union(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The ``buckets`` entry of the version that adds ``new``'s records to ``old``'s."""
    spec = old["settings"][bucketmeta.KEY]
    return bucketmeta.merge(spec, (old.get(bucketmeta.KEY), new.get(bucketmeta.KEY)))


__all__ = ["refuse", "rule_for_append", "store_rule", "union"]
