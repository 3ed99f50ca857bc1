"""The pack-time decisions: which records are duplicates of one already kept (:class:`Deduper`),
and the report of every pair (written as JSON beside the store).

The packing process asks for each record in the order it writes them (the sources' order for a
single-file store and for ``order="source"``; a mixed folder store's shuffled write order
otherwise, fixed by its ``layout_seed``), so the record kept is the first written and the
decisions are the same on every run.
"""

from __future__ import annotations

import json
from typing import Any

from .hashing import MODES
from .search import DEFAULT_THRESHOLD, HammingIndex, check_threshold

#: The skip reason of a duplicate begins so; the kept record's path follows.
DUPLICATE = "duplicate of "
HASHES = {"exact": "sha256 of the packed RGB pixels and their shape",
          "near": "pHash 64-bit: 32x32 bilinear antialiased resize, ITU-R 601 luma, DCT-II, "
                  "8x8 low frequencies above their median"}


class Deduper:
    """Kept records' hashes; ``mode`` ``"exact"`` or ``"near"`` (within ``threshold`` bits)."""

    def __init__(self, mode: str, threshold: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"`dedup` must be one of {', '.join(map(repr, MODES))}, "
                             f"not {mode!r}")
        if threshold is not None and mode != "near":
            raise ValueError("`dedup_threshold` needs `dedup='near'`")
        self.mode = mode
        self.threshold = check_threshold(DEFAULT_THRESHOLD if threshold is None else threshold)
        self._paths: list[str] = []
        self._digests: list[Any] = []
        self._exact: dict[str, int] = {}
        self._near = HammingIndex()
        self.pairs: list[dict[str, Any]] = []

    def duplicate_of(self, path: str, digest: Any) -> str | None:
        """The kept path ``path``'s record duplicates (recording the pair), or None: then
        call :meth:`keep` once the record is written."""
        if digest is None:  # a record no worker hashed: deciding on it would pair it wrongly
            raise ValueError(f"{path}: no hash to look for duplicates with")
        if self.mode == "exact":
            found = self._exact.get(digest)
            hit = None if found is None else (found, 0)
        else:
            hit = self._near.nearest(digest, self.threshold)
        if hit is None:
            return None
        kept = self._paths[hit[0]]
        self.pairs.append({"kept": kept, "dropped": path, "distance": hit[1]})
        return kept

    def keep(self, path: str, digest: Any) -> None:
        if self.mode == "exact":
            self._exact.setdefault(digest, len(self._paths))
        else:
            self._near.add(digest)
        self._paths.append(path)
        self._digests.append(digest)

    def kept(self) -> dict[str, Any]:
        """Each kept record's path -> its hash (the records a store holds, for a later append
        to compare new ones with)."""
        return dict(zip(self._paths, self._digests))

    def report(self) -> dict[str, Any]:
        """What the report file holds: the settings, counts, and every pair."""
        out: dict[str, Any] = {"mode": self.mode, "hash": HASHES[self.mode]}
        if self.mode == "near":
            out["threshold"] = self.threshold
        return out | {"kept": len(self._paths), "dropped": len(self.pairs),
                      "pairs": self.pairs}

    def dumps(self) -> bytes:
        return (json.dumps(self.report(), indent=1, ensure_ascii=False) + "\n").encode(
            "utf-8", "surrogateescape")
