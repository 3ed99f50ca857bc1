"""Which windows of frames a store of video frames holds: the records of each video, by
``frame_index``, and the offsets a clip asks for (``frames``/``stride``, or LeRobot's
``delta_timestamps`` turned into frame offsets at each video's rate).

A window is an anchor record and, for the images and for each requested field, the records of
the same ``video`` whose ``frame_index`` is the anchor's plus each offset. A window exists only
where every one of those records is in the store: never across a video's end, a gap the pack
left (a damaged stretch) or into another video.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import OptionError
from .targets import store_schema

#: LeRobot's default ``tolerance_s``: a delta must be a whole number of frames within it.
TOLERANCE_S = 1e-4
VIDEO_FIELDS = ("video", "frame_index")


def check_count(value: Any, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise OptionError(f"{name} must be an integer >= {least}, got {value!r}")
    return int(value)


def frame_columns(dataset: Any, rate: bool, fps: float | None = None,
                  camera: bool = False) -> dict[str, np.ndarray]:
    """Each record's ``video`` (as a number, in order of first appearance), ``frame_index``,
    with ``rate`` its ``video_fps`` (``fps`` where given, else the field) and with ``camera``
    its ``camera`` field (a LeRobot store's; None where the store has none), in the dataset's
    index order."""
    store = dataset.store
    schema = store_schema(store)
    have = [] if schema is None else schema.names
    missing = [n for n in VIDEO_FIELDS if n not in have]
    if missing:
        raise OptionError(f"dataset: clips need a store of video frames, whose records have the "
                          f"fields {', '.join(VIDEO_FIELDS)} (shardkit.pack(..., frames=...)); "
                          f"this store lacks {', '.join(missing)}")
    read_rate = rate and fps is None
    if read_rate and "video_fps" not in have:
        raise OptionError("delta_timestamps needs the frames' rate: this store's records have no "
                          "video_fps field; pass fps (a LeRobot dataset's meta/info.json fps)")
    read_camera = camera and "camera" in have
    n = len(dataset)
    shards, local = store.locate_many(np.arange(n, dtype=np.int64))
    videos: dict[Any, int] = {}
    video = np.empty(n, np.int64)
    frame = np.empty(n, np.int64)
    rates = np.full(n, np.nan if fps is None else float(fps), np.float64)
    cameras = np.empty(n, object) if read_camera else None
    for k in np.unique(shards).tolist():
        at = np.flatnonzero(shards == k)
        fields = store.shard(k).fields
        for pos, i in zip(at.tolist(), local[at].tolist()):
            name = fields.value("video", i)
            video[pos] = videos.setdefault(name, len(videos))
            frame[pos] = fields.value("frame_index", i)
            if read_rate:
                rates[pos] = fields.value("video_fps", i)
            if cameras is not None:
                cameras[pos] = fields.value("camera", i)
    return {"video": video, "frame_index": frame, "video_fps": rates, "camera": cameras,
            "names": np.asarray(list(videos), dtype=object)}


def frame_offsets(deltas: Sequence[Any], fps: float, key: str, tolerance_s: float) -> list[int]:
    """LeRobot's ``get_delta_indices``: each delta (seconds) as ``round(delta * fps)`` frames,
    refused (as ``check_delta_timestamps`` does) unless it is within ``tolerance_s`` of a whole
    number of frames."""
    if not math.isfinite(fps) or fps <= 0:
        raise OptionError(f"delta_timestamps: a video's frame rate is {fps!r}, so seconds do "
                          "not convert to frames")
    out = []
    for d in deltas:
        if isinstance(d, bool) or not isinstance(d, (int, float, np.integer, np.floating)) \
                or not math.isfinite(d):
            raise OptionError(f"delta_timestamps[{key!r}] must be a list of seconds, got {d!r}")
        if abs(d * fps - round(d * fps)) / fps > tolerance_s:
            raise OptionError(f"delta_timestamps[{key!r}]: {d} s is not a whole number of frames "
                              f"at {fps:g} fps (within tolerance_s={tolerance_s}): use "
                              f"multiples of 1/{fps:g} s")
        out.append(int(round(d * fps)))
    return out


def split_deltas(delta_timestamps: Mapping[str, Sequence[Any]], field_names: Sequence[str]
                 ) -> tuple[str | None, dict[str, Sequence[Any]]]:
    """``(image key, {field: deltas})``: keys naming a store field are fields (LeRobot's
    ``observation.state`` naming ``observation_state``, as a LeRobot store holds it), the one
    other key (a camera, e.g. ``observation.image``) is the image's."""
    if not isinstance(delta_timestamps, Mapping) or not delta_timestamps:
        raise OptionError("delta_timestamps must be a dict of {key: [seconds, ...]}, got "
                          f"{delta_timestamps!r}")

    def field(key: str) -> str | None:
        if key in field_names:
            return key
        return key.replace(".", "_") if key.replace(".", "_") in field_names else None

    others = [k for k in delta_timestamps if field(k) is None]
    if len(others) > 1:
        raise OptionError(f"delta_timestamps: {others[0]!r} and {others[1]!r} are not fields of "
                          "this store; only one key (the camera: the store's images) may be")
    for key, deltas in delta_timestamps.items():
        if isinstance(deltas, (str, bytes)) or not isinstance(deltas, Sequence) or not deltas:
            raise OptionError(f"delta_timestamps[{key!r}] must be a non-empty list of seconds, "
                              f"got {deltas!r}")
    return (others[0] if others else None), {field(k): v for k, v in delta_timestamps.items()
                                             if k not in others}


class Windows:
    """Every window of a dataset of video frames, anchors in index order.

    ``images``: ``[W, K]`` dataset indices of each window's images; ``fields[name]``: ``[W, K_f]``
    indices of the records each field is read from; ``anchors``: ``[W]``.
    """

    def __init__(self, image_offsets: Any, field_offsets: Mapping[str, Any],
                 cols: dict[str, np.ndarray], only: np.ndarray | None = None) -> None:
        """``image_offsets``/``field_offsets[name]``: a list of frame offsets, or a function of
        a video's fps giving one (``delta_timestamps``); ``only``: the records that may anchor
        a window (None: all)."""
        video, frame = cols["video"], cols["frame_index"]
        n = len(frame)
        key = video * (1 << 32) + frame
        order = np.argsort(key, kind="stable")
        sorted_keys = key[order]
        twice = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
        if len(twice):
            a, b = order[twice[0]], order[twice[0] + 1]
            raise OptionError(f"dataset: records {a} and {b} are both frame {frame[a]} of video "
                              f"{cols['names'][video[a]]!r}: clips need each frame once")
        groups: dict[float, np.ndarray]
        if callable(image_offsets) or any(callable(o) for o in field_offsets.values()):
            rates = cols["video_fps"]
            groups = {float(r): np.flatnonzero(rates == r) for r in np.unique(rates).tolist()}
        else:
            groups = {0.0: np.arange(n, dtype=np.int64)}
        if only is not None:
            groups = {r: a[only[a]] for r, a in groups.items()}
        parts: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]] = []
        for rate, anchors in groups.items():
            wanted = {"": image_offsets, **field_offsets}
            offsets = {name: np.asarray(o(rate) if callable(o) else o, np.int64)
                       for name, o in wanted.items()}
            found = {name: np.empty((len(anchors), len(o)), np.int64)
                     for name, o in offsets.items()}
            ok = np.ones(len(anchors), bool)
            for name, offs in offsets.items():
                for j, o in enumerate(offs.tolist()):
                    target = frame[anchors] + o
                    want = video[anchors] * (1 << 32) + target
                    at = np.minimum(np.searchsorted(sorted_keys, want), n - 1)
                    hit = (sorted_keys[at] == want) & (target >= 0)
                    ok &= hit
                    found[name][:, j] = order[at]
            keep = anchors[ok]
            parts.append((keep, found.pop("")[ok], {k: v[ok] for k, v in found.items()}))
        anchors = np.concatenate([p[0] for p in parts])
        by_index = np.argsort(anchors, kind="stable")
        self.anchors = anchors[by_index]
        self.images = np.concatenate([p[1] for p in parts])[by_index]
        self.fields = {name: np.concatenate([p[2][name] for p in parts])[by_index]
                       for name in field_offsets}

    def __len__(self) -> int:
        return len(self.anchors)

    def digest_parts(self) -> list[bytes]:
        """What names these windows' images, the clips a sampler orders (its saved state is
        checked against it; the fields stacked beside them change no order)."""
        return [np.ascontiguousarray(self.images, dtype="<i8").tobytes()]
