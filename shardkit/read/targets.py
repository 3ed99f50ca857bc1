"""A sample's ``target`` dict from the store's typed fields, and its collation into batches.

``Targets`` turns the requested fields of one record into what torchvision's wrapped
``CocoDetection`` returns: boxes as ``tv_tensors.BoundingBoxes`` (XYXY, ``canvas_size``) and
masks as ``tv_tensors.Mask`` when torchvision is installed (plain tensors otherwise, or on
request), per-box and ragged fields as tensors, scalars as Python numbers, text as ``str``,
JSON parsed. Geometric fields follow the sample's crop and flip (:mod:`.geometry`).

Collation (``collate_targets``): fixed-shape fields stack; ragged ones are, per field, a list of
tensors (default), ``"padded"`` (``name`` padded with zeros, ``name_lengths``, ``name_mask``) or
``"packed"`` (``name`` concatenated, ``name_batch``: each row's sample number). A field with a
None (an optional field some samples lack) is a list.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

import numpy as np
import torch

from ..errors import OptionError
from ..fields import kinds
from ..fields import geometry
from .conditioning import DERIVED, STORED

RaggedMode = Literal["list", "padded", "packed"]
RAGGED_MODES: tuple[str, ...] = ("list", "padded", "packed")
LABEL = "label"  # the store's class label, requested like a field

_TV: Any = None


def _tv_tensors() -> Any:
    """torchvision's tv_tensors, or False when torchvision is not installed."""
    global _TV
    if _TV is None:
        try:
            from torchvision import tv_tensors
        except ImportError:  # shardkit does not need torchvision
            tv_tensors = False
        _TV = tv_tensors
    return _TV


class Targets:
    """What one dataset returns as each sample's target (see the module docstring)."""

    def __init__(self, schema: Any, names: Sequence[str], *, sanitize: bool = False,
                 tv_tensors: bool | None = None, multi_hot: bool | Sequence[str] = False,
                 ragged: RaggedMode | Mapping[str, RaggedMode] = "list",
                 conditioning: Any = None) -> None:
        if isinstance(names, str) or not all(isinstance(n, str) for n in names):
            raise OptionError(f"fields must be a list of field names, got {names!r}")
        declared = [] if schema is None else schema.names
        #: A bucketed store's crop conditioning (:mod:`.conditioning`), its derived fields.
        self.conditioning = conditioning
        self.derived = [n for n in names if n in DERIVED] if conditioning is not None else []
        if conditioning is not None:
            declared = declared + list(DERIVED)
        unknown = [n for n in names if n != LABEL and n not in declared]
        if unknown:
            raise OptionError(f"fields: {unknown[0]!r} is not a field of this store (it has "
                              f"{', '.join(declared) or 'none'}; 'label' is the class label)")
        self.schema, self.names = schema, list(names)
        self.fields = {n: schema[n] for n in names if n != LABEL and n not in self.derived}
        wanted = tv_tensors if tv_tensors is not None else True
        self.tv = _tv_tensors() if wanted else False
        if tv_tensors and not self.tv:
            raise OptionError("tv_tensors=True needs torchvision installed")
        self.sanitize = bool(sanitize)
        boxes = [n for n, f in self.fields.items() if f.kind == "boxes"]
        if self.sanitize and not boxes:
            raise OptionError("sanitize=True needs a boxes field among `fields`")
        hot = list(self.fields) if multi_hot is True else list(multi_hot or ())
        bad = [n for n in hot if n not in self.fields or self.fields[n].kind != "multilabel"]
        if multi_hot is not True and bad:
            raise OptionError(f"multi_hot: {bad[0]!r} is not a requested multi-label field")
        self.multi_hot = {n for n in hot if self.fields.get(n) is not None
                          and self.fields[n].kind == "multilabel"}
        self.ragged = _ragged_modes(ragged)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["tv"] = bool(self.tv)  # a module does not pickle (spawned DataLoader workers)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.tv:
            self.tv = _tv_tensors()

    @property
    def geometric(self) -> bool:
        return any(f.geometric for f in self.fields.values())

    def build(self, shard: Any, local: int, move: geometry.Move | None,
              moved: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
        """Record ``local`` of ``shard``'s target, moved by ``move`` (None: as stored);
        ``moved``: its boxes fields already moved (:meth:`build_batch`)."""
        height, width = int(shard.heights[local]), int(shard.widths[local])
        canvas = move.out_size if move is not None else (height, width)
        moved = moved or {}
        raw = {n: moved[n] if n in moved else shard.fields.value(n, local) for n in self.fields}
        if self.conditioning is not None and (self.derived or (
                "crop_top_left" in raw and move is not None and move.flip and not move.clamp)):
            raw.update(self._conditioning(shard, local, move))
        out: dict[str, Any] = {}
        for name in self.names:
            if name == LABEL:
                out[name] = int(shard.labels[local])
                continue
            out[name] = (torch.from_numpy(raw[name]) if name in moved or name in self.derived
                         else self._convert(self.fields[name], raw[name], move))
        if self.sanitize:
            self._sanitize(out, canvas)
        return self._wrap(out, canvas)

    def _conditioning(self, shard: Any, local: int, move: Any) -> dict[str, np.ndarray]:
        """The derived crop conditioning and, on a whole-record flip, ``crop_top_left``
        moved (a decode crop is not a whole-record flip: the values stay the stored ones)."""
        flipped = move is not None and move.flip and not move.clamp
        stored = {n: shard.fields.value(n, local) for n in STORED}
        names = self.derived + (["crop_top_left"] if "crop_top_left" in self.fields else [])
        return self.conditioning.values(names, stored, flipped)

    def _wrap(self, out: dict[str, Any], canvas: tuple[int, int]) -> dict[str, Any]:
        """Boxes as ``BoundingBoxes`` on ``canvas`` and masks as ``Mask`` (with torchvision)."""
        if self.tv:
            for name, f in self.fields.items():
                if f.kind == "boxes":
                    out[name] = self.tv.BoundingBoxes(out[name], format="XYXY",
                                                      canvas_size=canvas)
                elif f.kind in ("masks", "semantic"):
                    out[name] = self.tv.Mask(out[name])
        return out

    def build_batch(self, shard: Any, locals_: list[int], plans: list[Any], mode: str,
                    crop: int | None) -> list[dict[str, Any]]:
        """:meth:`build` for records ``locals_`` of one shard with their decode plans, the
        ragged fields of all of them read, moved and sanitized together (the same values as
        :meth:`build` one by one, without its per-sample cost)."""
        moves = [move_for(p, mode, crop, int(shard.heights[i]), int(shard.widths[i]))
                 for p, i in zip(plans, locals_)]
        if not locals_ or any(m is None for m in moves) or self.multi_hot or self.derived:
            return [self.build(shard, i, m) for i, m in zip(locals_, moves)]
        n, idx = len(locals_), np.asarray(locals_, dtype=np.int64)
        ragged = {name: f for name, f in self.fields.items() if isinstance(f, kinds.Ragged)}
        flat, counts = {}, {}
        for name, f in ragged.items():
            parts = shard.fields.gather(name, idx)
            counts[name] = [len(p) for p in parts]
            flat[name] = (geometry.move_boxes_cat(parts, moves) if f.kind == "boxes"
                          else np.concatenate(parts))
        canvas = (crop, crop) if isinstance(crop, int) else tuple(crop)  # the output's (h, w)
        keeps: dict[str, list[torch.Tensor]] = {}  # boxes field -> each sample's kept boxes
        if self.sanitize:
            for name, f in ragged.items():
                if f.kind != "boxes":
                    continue
                keep = geometry.sanitize_keep(torch.from_numpy(flat[name]), canvas).numpy()
                if keep.all():
                    continue
                keeps[name] = list(torch.from_numpy(keep).split(counts[name]))
                kept = np.bincount(np.repeat(np.arange(n), counts[name])[keep],
                                   minlength=n).tolist()
                for other, g in ragged.items():
                    if other == name or getattr(g, "of", None) == name:
                        flat[other], counts[other] = flat[other][keep], kept
        parts_t = {name: torch.from_numpy(flat[name]).split(counts[name]) for name in ragged}
        out = []
        for j, (i, move) in enumerate(zip(locals_, moves)):
            target: dict[str, Any] = {}
            for name in self.names:
                if name == LABEL:
                    target[name] = int(shard.labels[i])
                    continue
                if name in parts_t:
                    target[name] = parts_t[name][j]
                    continue
                f = self.fields[name]
                value = self._convert(f, shard.fields.value(name, i), move)
                of = getattr(f, "of", None)
                target[name] = value[keeps[of][j]] if of in keeps else value
            out.append(self._wrap(target, canvas))
        return out

    def _convert(self, f: kinds.Field, value: Any, move: geometry.Move | None) -> Any:
        if f.kind == "boxes":
            return torch.from_numpy(geometry.move_boxes(value, move) if move is not None
                                    else value)
        if f.kind in ("masks", "semantic"):
            masks = torch.from_numpy(value)
            return geometry.move_masks(masks, move) if move is not None else masks
        if f.kind == "multilabel" and f.name in self.multi_hot:
            hot = torch.zeros(f.num_classes, dtype=torch.float32)
            hot[torch.from_numpy(value)] = 1.0
            return hot
        if isinstance(value, np.ndarray):
            return torch.from_numpy(value)
        return value

    def _sanitize(self, out: dict[str, Any], canvas: tuple[int, int]) -> None:
        """Drop boxes as ``v2.SanitizeBoundingBoxes`` does, with their per-box values and masks."""
        for name, f in self.fields.items():
            if f.kind != "boxes":
                continue
            keep = geometry.sanitize_keep(out[name], canvas)
            if bool(keep.all()):
                continue
            out[name] = out[name][keep]
            for other, g in self.fields.items():
                if getattr(g, "of", None) == name:
                    out[other] = out[other][keep]

    def collate(self, targets: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return TargetBatch(collate_targets(targets, self.ragged, self.fields))


def _ragged_modes(ragged: Any) -> dict[str, str] | str:
    if isinstance(ragged, str):
        if ragged not in RAGGED_MODES:
            raise OptionError(f"ragged must be one of {RAGGED_MODES} or a dict of them per "
                              f"field, got {ragged!r}")
        return ragged
    if not isinstance(ragged, Mapping) or not all(v in RAGGED_MODES for v in ragged.values()):
        raise OptionError(f"ragged must be one of {RAGGED_MODES} or a dict of them per field, "
                          f"got {ragged!r}")
    return dict(ragged)


def collate_targets(targets: Sequence[dict[str, Any]], ragged: Any = "list",
                    fields: Mapping[str, kinds.Field] | None = None) -> dict[str, Any]:
    """A batch's targets as one dict: numbers and same-shape tensors stacked, ragged fields by
    ``ragged`` (a mode, or ``{field: mode}``; see the module docstring), other values as lists."""
    if not targets:
        return {}
    out: dict[str, Any] = {}
    for name in targets[0]:
        values = [t[name] for t in targets]
        f = (fields or {}).get(name)
        mode = ragged if isinstance(ragged, str) else ragged.get(name, "list")
        first = values[0]
        if any(v is None for v in values):  # an optional field some samples lack: a list
            out[name] = values
        elif isinstance(first, bool) or isinstance(first, (int, float)):
            out[name] = torch.tensor(values)
        elif isinstance(first, torch.Tensor) and (f is None or not _is_ragged(f)) and all(
                v.shape == first.shape for v in values):
            out[name] = torch.stack([v.as_subclass(torch.Tensor) for v in values])
        elif isinstance(first, torch.Tensor) and mode == "padded":
            lengths = torch.tensor([len(v) for v in values], dtype=torch.int64)
            longest = int(lengths.max()) if len(lengths) else 0
            padded = first.new_zeros((len(values), longest, *first.shape[1:]))
            for i, v in enumerate(values):
                padded[i, :len(v)] = v
            out[name] = padded.as_subclass(torch.Tensor)
            out[f"{name}_lengths"] = lengths
            out[f"{name}_mask"] = torch.arange(longest)[None, :] < lengths[:, None]
        elif isinstance(first, torch.Tensor) and mode == "packed":
            out[name] = torch.cat([v.as_subclass(torch.Tensor) for v in values])
            out[f"{name}_batch"] = torch.repeat_interleave(
                torch.arange(len(values)), torch.tensor([len(v) for v in values]))
        else:
            out[name] = values
    return out


def _is_ragged(f: kinds.Field) -> bool:
    return isinstance(f, (kinds.Ragged, kinds.Masks))


def split_targets(targets: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """A collated ``"list"``-mode target dict back to one dict per sample (what torchvision's
    detection models take)."""
    return [{k: (v[i] if isinstance(v, (list, torch.Tensor)) else v) for k, v in targets.items()}
            for i in range(count)]


def move_for(plan: Any, mode: str, crop: int | tuple[int, int] | None, height: int, width: int
             ) -> geometry.Move | None:
    """The geometry of one sample from its decode plan (:class:`shardkit.read.augment.Plan`, or
    None for a plain centre crop), or None when the image is returned whole; ``crop`` is the
    output size (a view's may be (height, width))."""
    if crop is None:  # the whole record, flipped where its plan says (a bucketed store)
        if plan is None or not plan.flip:
            return None
        return geometry.Move(0, 0, height, width, (height, width), True, (0, 0), False)
    if plan is None:  # a plain centre crop
        from ..codec import center_origin

        top, left = center_origin(height, width, crop)
        return geometry.Move(top, left, crop, crop, crop, False,
                             geometry.center_anchor(height, width, crop))
    origin = (geometry.center_anchor(height, width, crop) if mode == "center"
              else (plan.top, plan.left))
    # RandomCrop of an image exactly the crop size does not crop: its boxes are not clamped.
    whole = mode == "random" and (height, width) == (crop, crop)
    return geometry.Move(plan.top, plan.left, plan.height, plan.width, crop, plan.flip, origin,
                         not whole)


def collate_samples(batch: Sequence[Any], ragged: Any = "list") -> list[Any]:
    """``[images, targets]`` from a list of ``(image, target dict)`` samples: images stacked
    (``default_collate``, in memfd memory inside a worker: no ``/dev/shm``) when they share a
    shape, else a list; targets by ``collate_targets``."""
    from .shipping import default_collate

    images = [sample[0] for sample in batch]
    same = all(isinstance(i, torch.Tensor) and i.shape == images[0].shape for i in images) or all(
        isinstance(i, np.ndarray) and i.shape == images[0].shape for i in images)
    return [default_collate(images) if same else images,
            TargetBatch(collate_targets([sample[1] for sample in batch], ragged))]


def store_schema(store: Any) -> Any:
    """The :class:`shardkit.fields.Schema` a store declares (None: a store without fields)."""
    from ..fields import Schema

    from ..fields import added

    raw, later = store.meta.get("fields"), added.schema_of(store.meta)
    if raw is None and not len(later):
        return None
    packed = list(Schema.from_json(raw, store.path)) if raw is not None else []
    return Schema(packed + list(later))


class TargetBatch(dict):
    """A batch's collated targets: a plain dict here; pickled (from a DataLoader worker to the
    main process) as one numpy array per field, not as one shared-memory tensor per sample and
    field (what torch sends a dict of tensors as: a file per tensor, milliseconds a batch), and
    received as a plain dict with the same tensors (``BoundingBoxes``/``Mask`` kept)."""

    def __reduce__(self) -> tuple:
        return (_restore, ([(name, *_to_wire(value)) for name, value in self.items()],))


def _tensor_meta(t: torch.Tensor) -> tuple | None:
    tv = _tv_tensors()
    if tv and isinstance(t, tv.BoundingBoxes):
        return ("boxes", t.format.name, tuple(t.canvas_size))
    if tv and isinstance(t, tv.Mask):
        return ("mask",)
    return None


def _wrap(t: torch.Tensor, meta: tuple | None) -> torch.Tensor:
    if meta is None:
        return t
    tv = _tv_tensors()
    if meta[0] == "boxes":
        return tv.BoundingBoxes(t, format=meta[1], canvas_size=meta[2])
    return tv.Mask(t)


def _to_wire(value: Any) -> tuple:
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        return ("tensor", _tensor_meta(value), value.as_subclass(torch.Tensor).numpy())
    if isinstance(value, list) and value and all(
            isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.ndim >= 1
            and v.dtype == value[0].dtype and v.shape[1:] == value[0].shape[1:] for v in value):
        flat = np.concatenate([v.as_subclass(torch.Tensor).numpy() for v in value])
        return ("list", [_tensor_meta(v) for v in value], flat, [len(v) for v in value])
    return ("object", value)


def _restore(entries: list[tuple]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind, *rest in entries:
        if kind == "tensor":
            meta, arr = rest
            out[name] = _wrap(torch.from_numpy(arr), meta)
        elif kind == "list":
            metas, flat, lengths = rest
            parts = torch.from_numpy(flat).split(lengths)
            out[name] = [_wrap(p, m) for p, m in zip(parts, metas)]
        else:
            out[name] = rest[0]
    return out
