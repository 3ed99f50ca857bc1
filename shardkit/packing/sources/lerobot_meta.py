"""A LeRobot dataset's layout as :mod:`.lerobot` reads it: ``meta/info.json`` (the codebase
version, fps, features, the ``data_path``/``video_path`` patterns), the tasks, every frame row
of ``data/`` grouped by episode, and where each episode's video of each camera lives.

* v2.x: ``meta/tasks.jsonl``; one parquet file and one MP4 per camera per episode
  (``data/chunk-*/episode_*.parquet``, ``videos/chunk-*/<camera>/episode_*.mp4``), each video
  starting at the episode's first frame.
* v3.0: ``meta/tasks.parquet``; many episodes per parquet file and per MP4
  (``data/chunk-*/file-*.parquet``, ``videos/<camera>/chunk-*/file-*.mp4``); the episode
  table (``meta/episodes/chunk-*/file-*.parquet``) names each episode's video file and the
  time it starts at in it (``videos/<camera>/from_timestamp``).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import PackError

#: the columns every LeRobot frame row has, and their field kinds
INDEX_COLUMNS = ("episode_index", "frame_index", "timestamp", "index", "task_index")


@dataclass
class Episode:
    """One episode: its rows (column -> values, in frame order) and per camera the video file
    and the time the episode starts at in it."""

    index: int
    rows: dict[str, list[Any]] = field(default_factory=dict)
    videos: dict[str, tuple[str, float]] = field(default_factory=dict)


@dataclass
class Layout:
    root: str
    version: str
    fps: float
    #: feature name -> its info.json entry, the cameras (dtype video) apart
    features: dict[str, dict[str, Any]]
    cameras: list[str]
    #: features stored as images in the parquet files (not read)
    image_features: list[str]
    tasks: dict[int, str]
    episodes: list[Episode]


def is_lerobot(src: str) -> bool:
    path = os.path.join(src, "meta", "info.json")
    if not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and "features" in info and "codebase_version" in info


def read_layout(src: str) -> Layout:
    """The dataset at ``src`` (PackError, one line, for a layout it cannot read)."""
    import pyarrow.parquet as pq

    root = os.path.abspath(src)
    info = _json(os.path.join(root, "meta", "info.json"))
    version = str(info.get("codebase_version", ""))
    if not version.startswith(("v2", "v3")):
        raise PackError(f"{src}: LeRobot codebase_version {version!r} is not read (v2.x and "
                        "v3.0 are)")
    features = info.get("features")
    if not isinstance(features, dict) or not isinstance(info.get("fps"), (int, float)):
        raise PackError(f"{src}: meta/info.json lacks `features` or `fps`")
    cameras = [k for k, v in features.items() if v.get("dtype") == "video"]
    images = [k for k, v in features.items() if v.get("dtype") == "image"]
    others = {k: v for k, v in features.items() if v.get("dtype") not in ("video", "image")}
    missing = [c for c in INDEX_COLUMNS if c not in others]
    if missing:
        raise PackError(f"{src}: meta/info.json features lack {', '.join(missing)}")
    v3 = version.startswith("v3")
    tasks = _tasks_v3(root) if v3 else _tasks_v2(root)
    files = sorted(glob.glob(os.path.join(root, "data", "**", "*.parquet"), recursive=True))
    if not files:
        raise PackError(f"{src}: no parquet files under data/")
    episodes: dict[int, Episode] = {}
    for path in files:
        try:
            table = pq.read_table(path, columns=list(others))
        except Exception as exc:  # noqa: BLE001 - pyarrow's reason, one line
            raise PackError(f"{path}: cannot read as LeRobot frames: "
                            f"{str(exc).splitlines()[0]}") from None
        columns = {name: table.column(name).to_pylist() for name in others}
        for row in range(table.num_rows):
            ep = episodes.setdefault(int(columns["episode_index"][row]),
                                     Episode(int(columns["episode_index"][row])))
            for name, values in columns.items():
                ep.rows.setdefault(name, []).append(values[row])
    for ep in episodes.values():  # frame order (files hold them so; never trusted blindly)
        order = np.argsort(np.asarray(ep.rows["frame_index"], dtype=np.int64), kind="stable")
        ep.rows = {n: [v[i] for i in order] for n, v in ep.rows.items()}
    if v3:
        _videos_v3(root, info, cameras, episodes)
    else:
        chunk = int(info.get("chunks_size") or 1000)
        for ep in episodes.values():
            for cam in cameras:
                rel = info["video_path"].format(episode_chunk=ep.index // chunk, video_key=cam,
                                                episode_index=ep.index)
                ep.videos[cam] = (os.path.join(root, rel), 0.0)
    return Layout(root, version, float(info["fps"]), others, cameras, images, tasks,
                  [episodes[i] for i in sorted(episodes)])


def _json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise PackError(f"{path}: cannot read: {exc}") from None


def _tasks_v2(root: str) -> dict[int, str]:
    path = os.path.join(root, "meta", "tasks.jsonl")
    out: dict[int, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    out[int(row["task_index"])] = str(row["task"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PackError(f"{path}: cannot read the tasks: {exc}") from None
    return out


def _tasks_v3(root: str) -> dict[int, str]:
    """meta/tasks.parquet: the task strings are the (pandas) index, ``task_index`` a column."""
    import pyarrow.parquet as pq

    path = os.path.join(root, "meta", "tasks.parquet")
    try:
        table = pq.read_table(path)
        text = next(n for n in table.column_names if n != "task_index"
                    and str(table.schema.field(n).type) in ("string", "large_string"))
        return {int(i): str(t) for i, t in zip(table.column("task_index").to_pylist(),
                                               table.column(text).to_pylist())}
    except (OSError, StopIteration, KeyError, ValueError) as exc:
        raise PackError(f"{path}: cannot read the tasks: {exc or 'no task column'}") from None


def _videos_v3(root: str, info: dict[str, Any], cameras: list[str],
               episodes: dict[int, Episode]) -> None:
    import pyarrow.parquet as pq

    files = sorted(glob.glob(os.path.join(root, "meta", "episodes", "**", "*.parquet"),
                             recursive=True))
    if cameras and not files:
        raise PackError(f"{root}: no episode table under meta/episodes/ (v3.0 names each "
                        "episode's video file there)")
    for path in files:
        table = pq.read_table(path)
        cols = set(table.column_names)
        rows = table.to_pylist()
        for row in rows:
            ep = episodes.get(int(row["episode_index"]))
            if ep is None:
                continue
            for cam in cameras:
                names = [f"videos/{cam}/{n}" for n in ("chunk_index", "file_index",
                                                        "from_timestamp")]
                if not set(names) <= cols:
                    raise PackError(f"{path}: the episode table lacks {names[0]}, ...")
                rel = info["video_path"].format(video_key=cam, chunk_index=row[names[0]],
                                                file_index=row[names[1]])
                ep.videos[cam] = (os.path.join(root, rel), float(row[names[2]]))
