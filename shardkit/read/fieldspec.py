"""``Fields``: which typed fields of a store an item carries, and how (public as
``shardkit.Fields``). ``ShardDataset(path, fields=Fields(["boxes", "labels"], sanitize=True))``;
``fields=[...]`` with the ``sanitize``/``tv_tensors``/``multi_hot``/``ragged`` options is the
shortcut that builds one (``ds.fields``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import OptionError
from . import targets as targetmod
from .conditioning import Conditioning

_DEFAULTS = {"sanitize": False, "tv_tensors": None, "multi_hot": False, "ragged": "list"}


@dataclass(frozen=True, eq=True)
class Fields:
    """The target an item carries: a dict of these typed fields (``"label"``: the class
    label), boxes and masks moved by the crop as torchvision v2 moves them.

    ``sanitize``: drop boxes as ``v2.SanitizeBoundingBoxes()`` does after the crop;
    ``tv_tensors``: boxes and masks as torchvision's tv_tensors (None: when installed);
    ``multi_hot``: multi-label fields (True: all) as float32 multi-hot vectors; ``ragged``:
    how batches carry ragged fields, ``"list"``, ``"padded"``, ``"packed"`` or a dict of those
    per field (:mod:`shardkit.read.targets`)."""

    names: Sequence[str]
    sanitize: bool = False
    tv_tensors: bool | None = None
    multi_hot: bool | Sequence[str] = False
    ragged: targetmod.RaggedMode | Mapping[str, targetmod.RaggedMode] = "list"

    def __post_init__(self) -> None:
        names = self.names
        try:
            kept = None if isinstance(names, str) else tuple(names)
        except TypeError:
            kept = None
        if kept is None or not all(isinstance(n, str) for n in kept):
            raise OptionError(f"fields must be a list of field names, got {names!r}")
        object.__setattr__(self, "names", kept)
        if not isinstance(self.multi_hot, bool):
            object.__setattr__(self, "multi_hot", tuple(self.multi_hot or ()))

    @classmethod
    def of(cls, fields: Any, **options: Any) -> "Fields | None":
        """``ShardDataset``'s ``fields`` with its options as one ``Fields`` (None: no fields):
        a ``Fields`` object next to an option set away from its default is refused."""
        if isinstance(fields, Fields):
            given = [k for k, v in options.items() if v != _DEFAULTS[k]]
            if given:
                raise OptionError(f"fields=Fields(...) and {given[0]} both shape each sample's "
                                  f"targets; pass {given[0]} inside Fields(...)")
            return fields
        return None if fields is None else cls(fields, **options)

    def targets(self, store: Any) -> targetmod.Targets:
        """What builds each sample's target from ``store``'s fields."""
        return targetmod.Targets(targetmod.store_schema(store), list(self.names),
                                 sanitize=self.sanitize, tv_tensors=self.tv_tensors,
                                 multi_hot=(self.multi_hot if isinstance(self.multi_hot, bool)
                                            else list(self.multi_hot)),
                                 ragged=self.ragged, conditioning=Conditioning.of(store))
