"""Small LeRobot datasets written here as LeRobot lays them out (v2.1 and v3.0): meta/info.json,
the tasks, frame rows in parquet, one H.264 MP4 per camera (PyAV, at the dataset's fps)."""

from __future__ import annotations

import json
import os
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CAMERAS = {"observation.images.top": (40, 32), "observation.images.wrist": (24, 16)}  # w, h
TASKS = ["pick the cube", "place the cube"]
FPS = 10


def pixels(camera: int, episode: int, frame: int, h: int, w: int) -> np.ndarray:
    """A frame that differs from every other frame of the dataset (a ramp, a moving bar)."""
    a = np.zeros((h, w, 3), np.uint8)
    a[..., 0] = (frame * 13 + episode * 60) % 256
    a[..., 1] = camera * 120
    a[:, (3 * frame) % w, 2] = 255
    a[(2 * frame + episode) % h, :, 1] = 200
    return a


def state(episode: int, frame: int) -> list[float]:
    return [episode + frame / 8, -frame / 3, 0.25 * frame * frame, 1e-3 * episode]


def action(episode: int, frame: int) -> list[float]:
    return [frame / 7 - episode, 2.0 * episode + frame / 9]


def _write_video(path: str, frames: list[np.ndarray], fps: int = FPS) -> None:
    import av

    os.makedirs(os.path.dirname(path), exist_ok=True)
    c = av.open(path, "w")
    s = c.add_stream("libx264", rate=fps, options={"g": "4"})  # several keyframes an episode
    s.height, s.width = frames[0].shape[:2]
    s.pix_fmt = "yuv420p"
    for i, a in enumerate(frames):
        f = av.VideoFrame.from_ndarray(a, format="rgb24")
        f.pts, f.time_base = i, Fraction(1, fps)
        for p in s.encode(f):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()


def _features(cameras: dict[str, tuple[int, int]]) -> dict:
    out = {cam: {"dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
                 "info": {"video.fps": FPS, "video.codec": "h264", "video.pix_fmt": "yuv420p",
                          "video.is_depth_map": False, "has_audio": False}}
           for cam, (w, h) in cameras.items()}
    out["observation.state"] = {"dtype": "float32", "shape": [4], "names": None}
    out["action"] = {"dtype": "float32", "shape": [2], "names": None}
    out["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
    for name in ("frame_index", "episode_index", "index", "task_index"):
        out[name] = {"dtype": "int64", "shape": [1], "names": None}
    out["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    return out


def _rows(lengths: list[int], jitter: dict[tuple[int, int], float]) -> list[pa.Table]:
    """One table per episode; ``jitter[(episode, frame)]`` seconds added to a timestamp."""
    out, index = [], 0
    for ep, n in enumerate(lengths):
        ts = [np.float32(f / FPS + jitter.get((ep, f), 0.0)) for f in range(n)]
        out.append(pa.table({
            "observation.state": pa.array([state(ep, f) for f in range(n)],
                                          pa.list_(pa.float32(), 4)),
            "action": pa.array([action(ep, f) for f in range(n)], pa.list_(pa.float32(), 2)),
            "next.reward": pa.array([f / 4 for f in range(n)], pa.float32()),
            "timestamp": pa.array(ts, pa.float32()),
            "frame_index": pa.array(range(n), pa.int64()),
            "episode_index": pa.array([ep] * n, pa.int64()),
            "index": pa.array(range(index, index + n), pa.int64()),
            "task_index": pa.array([ep % len(TASKS)] * n, pa.int64())}))
        index += n
    return out


def _info(version: str, lengths: list[int], cameras: dict, data_path: str, video_path: str
          ) -> dict:
    return {"codebase_version": version, "robot_type": "test", "total_episodes": len(lengths),
            "total_frames": sum(lengths), "total_tasks": len(TASKS), "chunks_size": 1000,
            "data_files_size_in_mb": 100, "video_files_size_in_mb": 500, "fps": FPS,
            "splits": {"train": f"0:{len(lengths)}"}, "data_path": data_path,
            "video_path": video_path, "features": _features(cameras)}


def write_v3(root: str, lengths: list[int], jitter: dict | None = None,
             cameras: dict | None = None) -> str:
    """LeRobot v3.0: every episode in one parquet file and, per camera, one MP4 (episodes one
    after another: episode ``e`` starts at ``from_timestamp`` = its first frame's time)."""
    cameras = CAMERAS if cameras is None else cameras
    os.makedirs(os.path.join(root, "meta"), exist_ok=True)
    info = _info("v3.0", lengths, cameras,
                 "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
                 "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4")
    with open(os.path.join(root, "meta", "info.json"), "w") as f:
        json.dump(info, f, indent=2)
    os.makedirs(os.path.join(root, "data", "chunk-000"))
    pq.write_table(pa.concat_tables(_rows(lengths, jitter or {})),
                   os.path.join(root, "data", "chunk-000", "file-000.parquet"))
    import pandas as pd  # LeRobot reads the tasks as a pandas frame indexed by the task text

    pd.DataFrame({"task_index": range(len(TASKS))}, index=pd.Index(TASKS, name="task")
                 ).to_parquet(os.path.join(root, "meta", "tasks.parquet"))
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    episodes: dict[str, list] = {
        "episode_index": list(range(len(lengths))),
        "tasks": [[TASKS[e % len(TASKS)]] for e in range(len(lengths))],
        "length": lengths, "data/chunk_index": [0] * len(lengths),
        "data/file_index": [0] * len(lengths), "dataset_from_index": starts[:-1],
        "dataset_to_index": starts[1:], "meta/episodes/chunk_index": [0] * len(lengths),
        "meta/episodes/file_index": [0] * len(lengths)}
    for c, (cam, (w, h)) in enumerate(cameras.items()):
        _write_video(os.path.join(root, info["video_path"].format(
            video_key=cam, chunk_index=0, file_index=0)),
            [pixels(c, e, f, h, w) for e, n in enumerate(lengths) for f in range(n)])
        episodes[f"videos/{cam}/chunk_index"] = [0] * len(lengths)
        episodes[f"videos/{cam}/file_index"] = [0] * len(lengths)
        episodes[f"videos/{cam}/from_timestamp"] = [s / FPS for s in starts[:-1]]
        episodes[f"videos/{cam}/to_timestamp"] = [s / FPS for s in starts[1:]]
    os.makedirs(os.path.join(root, "meta", "episodes", "chunk-000"))
    pq.write_table(pa.table(episodes),
                   os.path.join(root, "meta", "episodes", "chunk-000", "file-000.parquet"))
    return root


def write_v21(root: str, lengths: list[int], jitter: dict | None = None,
              cameras: dict | None = None) -> str:
    """LeRobot v2.1: a parquet file and, per camera, an MP4 per episode."""
    cameras = CAMERAS if cameras is None else cameras
    os.makedirs(os.path.join(root, "meta"), exist_ok=True)
    info = _info("v2.1", lengths, cameras,
                 "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
                 "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4")
    with open(os.path.join(root, "meta", "info.json"), "w") as f:
        json.dump(info, f, indent=2)
    with open(os.path.join(root, "meta", "tasks.jsonl"), "w") as f:
        f.writelines(json.dumps({"task_index": i, "task": t}) + "\n" for i, t in enumerate(TASKS))
    with open(os.path.join(root, "meta", "episodes.jsonl"), "w") as f:
        f.writelines(json.dumps({"episode_index": e, "tasks": [TASKS[e % len(TASKS)]],
                                "length": n}) + "\n" for e, n in enumerate(lengths))
    for e, table in enumerate(_rows(lengths, jitter or {})):
        path = os.path.join(root, info["data_path"].format(episode_chunk=0, episode_index=e))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(table, path)
        for c, (cam, (w, h)) in enumerate(cameras.items()):
            _write_video(os.path.join(root, info["video_path"].format(
                episode_chunk=0, video_key=cam, episode_index=e)),
                [pixels(c, e, f, h, w) for f in range(lengths[e])])
    return root
