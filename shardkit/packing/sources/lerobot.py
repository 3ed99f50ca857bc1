"""LeRobot datasets (``shardkit.sources.LeRobot``; detected from ``meta/info.json``): one record
per frame row and camera, the frame decoded from the camera's MP4 at the row's timestamp, the
row's columns as typed fields.

Records: episode by episode, and in each the frames of one camera after another, in frame
order, so a camera's episode is one run of records (clips read one region; shard boundaries
snap to those runs). A frame is the video frame whose timestamp is nearest the row's
``timestamp`` (plus, in v3.0, the time the episode starts at in the file), as LeRobot's own
``LeRobotDataset`` picks it, compared in float32 as it compares; one farther than
``tolerance_s`` (LeRobot's default: 1e-4 s) is not packed and is named in the skip list, where
LeRobot raises ``FrameTimestampError`` for that item. Frames are decoded as the video source
decodes them (:mod:`.video_decode`: PyAV, ``to_ndarray('rgb24')``).

Fields of each record: ``episode_index``, ``frame_index``, ``timestamp``, ``index``,
``task_index``, ``task`` (the text meta/tasks gives that index), every other feature of the
rows (``observation.state``, ``action``... as float arrays of the feature's dtype; names with
the dots as underscores: ``observation_state``), ``camera`` (the feature name, e.g.
``observation.images.top``), ``video`` (``<camera>/episode_<N>``: one run of a camera's frames)
and ``pts_seconds`` (the frame's time in its video file).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import numpy as np

from ...errors import PackError, PackOptionError
from .base import ContainerIndex, Scan, Source, SourceOptions
from .fields import ContainerFields
from .lerobot_meta import Episode, Layout, is_lerobot, read_layout
from .video import VideoSource

#: LeRobotDataset's default ``tolerance_s``
TOLERANCE_S = 1e-4


def field_name(feature: str) -> str:
    """The field a LeRobot feature becomes (``observation.state`` -> ``observation_state``)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", feature)


class LeRobotSource(Source):
    name = "lerobot"
    summary = "a LeRobot dataset (meta/info.json): each camera's frames with the episode's columns"

    def detect(self, src: str) -> bool:
        return is_lerobot(src)

    def check(self, options: SourceOptions) -> None:
        super().check(options)
        for name in ("frames", "coco", "metadata_file", "file_list", "image_key", "label_key"):
            if getattr(options, name) is not None:
                raise PackOptionError(f"`{name}` does not apply to a LeRobot dataset (its "
                                      "frames are its rows' timestamps)")
        if options.captions:
            raise PackOptionError("`captions` does not apply to a LeRobot dataset")
        tol = options.tolerance_s
        if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float))
                                or not math.isfinite(tol) or tol <= 0):
            raise PackOptionError(f"`tolerance_s` must be a number of seconds > 0, not {tol!r}")

    def scan(self, options: SourceOptions) -> Scan:
        from .video_decode import close_all, probe

        close_all()  # decoders left open by an earlier pack in this process
        layout = read_layout(options.src)
        cameras = _cameras(layout, options.cameras)
        tol = np.float32(TOLERANCE_S if options.tolerance_s is None else options.tolerance_s)
        skipped = [{"path": os.path.join(layout.root, "meta", "info.json"),
                    "reason": f"camera {c!r} is stored as images in the parquet files: only "
                    "video cameras are read"} for c in layout.image_features]
        probes: dict[str, Any] = {}
        samples: list[tuple[str, int]] = []
        rows: dict[str, dict[str, Any]] = {}
        files: list[str] = []
        file_no: dict[str, int] = {}
        shard_col: list[int] = []
        refs: list[tuple[int, int]] = []
        starts = [0]
        for ep in layout.episodes:
            values = _row_fields(layout, ep)
            for cam in cameras:
                if cam not in ep.videos:
                    raise PackError(f"{layout.root}: episode {ep.index} has no video of {cam}")
                path, start = ep.videos[cam]
                found = probes.get(path)
                if found is None:
                    found = probes[path] = probe(path)
                    if found.damage is not None:
                        skipped.append({"path": path, "reason": found.damage})
                if found.empty is not None:
                    skipped.append({"path": path, "reason": f"episode {ep.index}: "
                                    f"{found.empty}"})
                    continue
                picked, far = _align(found, start, ep.rows["timestamp"], tol)
                for r, nearest in far:
                    t = start + ep.rows["timestamp"][r]
                    skipped.append({"path": path, "reason": (
                        f"episode {ep.index} frame {ep.rows['frame_index'][r]}: {cam}'s nearest "
                        f"frame is at {nearest:.6f} s, {abs(nearest - t):.6f} s from the row's "
                        f"{t:.6f} s (tolerance_s {float(tol):g}): not packed")})
                k = file_no.setdefault(path, len(files))
                if k == len(files):
                    files.append(path)
                video = f"{cam}/episode_{ep.index:06d}"
                for r, i in picked:
                    # named under SRC: the store keeps it relative (<camera>/episode_<N>#<frame>)
                    record = f"{os.path.join(layout.root, video)}#{ep.rows['frame_index'][r]}"
                    samples.append((record, -1))
                    rows[record] = {**values[r], "camera": cam, "video": video,
                                    "pts_seconds": float(found.pts[i] * found.time_base)}
                    shard_col.append(k)
                    refs.append(found.ref(i))
                if len(samples) > starts[-1]:
                    starts.append(len(samples))
        if not samples:
            first = f"; first: {skipped[0]['path']}: {skipped[0]['reason']}" if skipped else ""
            raise PackError(f"{options.src}: no LeRobot frames to pack ({len(layout.episodes)} "
                            f"episodes, cameras {', '.join(cameras) or 'none'}{first})")
        index = ContainerIndex(self.name, files, np.asarray(shard_col, dtype=np.int32),
                               np.asarray(refs, dtype=np.int64).reshape(-1, 2), starts)
        return Scan(layout.root, [], {}, samples, skipped,
                    fields=ContainerFields(rows, layout.root, len(samples)), index=index)

    read = staticmethod(VideoSource.read)


def _cameras(layout: Layout, asked: Any) -> list[str]:
    if asked is None:
        if not layout.cameras:
            raise PackError(f"{layout.root}: no video cameras in meta/info.json's features"
                            + (f" ({', '.join(layout.image_features)} are stored as images)"
                               if layout.image_features else ""))
        return layout.cameras
    names = [asked] if isinstance(asked, str) else list(asked)
    unknown = [n for n in names if n not in layout.cameras]
    if unknown or not names:
        raise PackOptionError(f"`cameras` must name the dataset's video cameras "
                              f"({', '.join(layout.cameras) or 'none'}), not {unknown or names}")
    return names


def _row_fields(layout: Layout, ep: Episode) -> list[dict[str, Any]]:
    """Each row of ``ep`` as typed field values."""
    out: list[dict[str, Any]] = [{} for _ in ep.rows["frame_index"]]
    taken: dict[str, str] = {}
    for name, feature in layout.features.items():
        field = field_name(name)
        if taken.setdefault(field, name) != name:
            raise PackError(f"{layout.root}: features {taken[field]!r} and {name!r} both "
                            f"become the field {field!r}")
        dtype = str(feature.get("dtype"))
        for r, value in enumerate(ep.rows[name]):
            out[r][field] = _value(value, dtype)
    for r, t in enumerate(ep.rows["task_index"]):
        if int(t) not in layout.tasks:
            raise PackError(f"{layout.root}: episode {ep.index} frame "
                            f"{ep.rows['frame_index'][r]}: task_index {t} is not in meta/tasks")
        out[r]["task"] = layout.tasks[int(t)]
    return out


def _value(value: Any, dtype: str) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        kind = np.dtype(dtype).kind if dtype not in ("string", "str") else "U"
        return np.asarray(value, dtype=dtype) if kind in "iufb" else value
    if dtype.startswith(("int", "uint")):
        return int(value)
    if dtype.startswith("float"):
        return float(value)
    if dtype == "bool":
        return bool(value)
    return value


def _align(found: Any, start: float, timestamps: list[float], tol: np.float32
           ) -> tuple[list[tuple[int, int]], list[tuple[int, float]]]:
    """(row, frame) pairs: each row's nearest frame by timestamp, as LeRobot compares them
    (float32 seconds, the first of equal distances, strictly within ``tol``), and the rows
    whose nearest frame is farther (with that frame's time)."""
    seconds = np.asarray([float(p * found.time_base) for p in found.pts], dtype=np.float32)
    query = np.asarray([start + t for t in timestamps], dtype=np.float32)
    j = np.searchsorted(seconds, query)
    lo = np.clip(j - 1, 0, len(seconds) - 1)
    hi = np.clip(j, 0, len(seconds) - 1)
    d_lo, d_hi = np.abs(seconds[lo] - query), np.abs(seconds[hi] - query)
    best = np.where(d_hi < d_lo, hi, lo)
    dist = np.minimum(d_lo, d_hi)
    near = dist < tol
    return ([(r, int(best[r])) for r in np.flatnonzero(near)],
            [(int(r), float(seconds[best[r]])) for r in np.flatnonzero(~near)])

