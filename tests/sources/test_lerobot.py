"""Packing LeRobot datasets: small datasets written here in LeRobot's layouts (robot_data.py),
each packed record compared with LeRobot's own ``LeRobotDataset`` item at the same index (run
in .venv-lerobot: frames as it decodes them, every column, the task), and with expectations
computed here from what the dataset was written with (v2.1, v3.0)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import robot_data
import torch
from conftest import run_side, store_fields, store_records

import shardkit
from shardkit.errors import PackError, PackOptionError
from shardkit.sources import Coco, LeRobot

av = pytest.importorskip("av")

LENGTHS = [6, 9]
# episode 0 frame 2 a little late (within LeRobot's 1e-4 s), episode 1 frame 3 between frames
JITTER = {(0, 2): 4e-5, (1, 3): 0.02}
FIELDS = ("episode_index", "frame_index", "timestamp", "index", "task_index", "task",
          "observation_state", "action", "next_reward", "camera", "video", "pts_seconds")


def _records(out: str) -> dict[tuple[int, int, str], dict]:
    """(episode, frame, camera) -> the record's pixels and fields."""
    records = store_records(out)
    fields = {n: store_fields(out, n) for n in FIELDS}
    got = {}
    for k, (data, label, h, w, path) in enumerate(records):
        row = {n: fields[n][k] for n in FIELDS}
        assert label == -1 and path == f"{row['video']}#{row['frame_index']}"
        row["pixels"] = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(h, w, 3)
        got[row["episode_index"], row["frame_index"], row["camera"]] = row
    assert len(got) == len(records)
    return got


@pytest.fixture(scope="module")
def v3(tmp_path_factory) -> tuple[str, str, object]:
    root = str(tmp_path_factory.mktemp("lerobot") / "v3")
    robot_data.write_v3(root, LENGTHS, JITTER)
    out = root + ".lmdb"
    result = shardkit.pack(root, out, size=0, encoding="raw", workers=2, progress=False)
    return root, out, result


LEROBOT_ITEMS = r"""
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.datasets.video_utils import FrameTimestampError

root, out = sys.argv[1], sys.argv[2]
ds = LeRobotDataset("local/test", root=root)
meta, arrays = [], {}
for i in range(len(ds)):
    try:
        item = ds[i]
    except FrameTimestampError as exc:
        meta.append({"error": str(exc).splitlines()[0]})
        continue
    row = {}
    for key, value in item.items():
        if isinstance(value, str):
            row[key] = value
        else:
            arrays[f"{i}/{key}"] = value.numpy()
    meta.append(row)
np.savez(out + ".npz", **arrays)
with open(out + ".json", "w") as f:
    json.dump({"meta": meta, "cameras": ds.meta.video_keys, "tolerance_s": ds.tolerance_s}, f)
"""


def test_every_frame_and_field_equal_lerobot_s_dataset(v3, lerobot_env, tmp_path):
    root, out, result = v3
    theirs = str(tmp_path / "lerobot")
    python, env = lerobot_env  # offline, its caches under tmp_path
    run_side((python, dict(env, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")),
             LEROBOT_ITEMS, root, theirs)
    with open(theirs + ".json") as f:
        side = json.load(f)
    arrays = np.load(theirs + ".npz", allow_pickle=False)
    cameras = side["cameras"]
    assert cameras == list(robot_data.CAMERAS) and side["tolerance_s"] == 1e-4
    got = _records(out)
    errors = [i for i, row in enumerate(side["meta"]) if "error" in row]
    assert errors == [LENGTHS[0] + 3]  # the row 0.02 s off the frames: LeRobot refuses it too
    assert len(got) == (sum(LENGTHS) - len(errors)) * len(cameras)
    for i, row in enumerate(side["meta"]):
        if "error" in row:
            assert not [k for k in got if k[:2] == (1, 3)]
            continue
        ep = int(arrays[f"{i}/episode_index"])
        frame = int(arrays[f"{i}/frame_index"])
        for cam in cameras:
            ours = got[ep, frame, cam]
            # LeRobot's frame: float32 in [0, 1], channels first, from the uint8 frame / 255
            assert torch.equal(torch.from_numpy(arrays[f"{i}/{cam}"]),
                               ours["pixels"].permute(2, 0, 1).to(torch.float32) / 255), (i, cam)
            assert ours["video"] == f"{cam}/episode_{ep:06d}"
            for name in ("episode_index", "frame_index", "index", "task_index"):
                assert ours[name] == arrays[f"{i}/{name}"].item(), (i, name)
            for name, field in (("timestamp", "timestamp"), ("next.reward", "next_reward")):
                assert np.float32(ours[field]) == arrays[f"{i}/{name}"], (i, name)
            for name, field in (("observation.state", "observation_state"),
                                ("action", "action")):
                value = arrays[f"{i}/{name}"]
                assert ours[field].dtype == value.dtype == np.float32
                assert np.array_equal(ours[field], value), (i, name)
            assert ours["task"] == row["task"]
    skips = [s["reason"] for s in result.skipped]
    assert len(skips) == len(cameras) and all(
        s.startswith("episode 1 frame 3: ") and "tolerance_s 0.0001" in s for s in skips)


def test_v21_layout_and_nearest_frame(tmp_path):
    """v2.1 (an MP4 per episode), against the frames PyAV decodes and the values written: a
    row 0.04 s after a frame (10 fps) takes that frame, 0.06 s after it the next one, with a
    tolerance that admits both; without it they are not packed."""
    root = robot_data.write_v21(str(tmp_path / "v21"), [5, 4],
                                jitter={(0, 1): 0.04, (1, 2): 0.06})
    out = str(tmp_path / "v21.lmdb")
    result = shardkit.pack(root, out, source=LeRobot(tolerance_s=0.05), size=0, encoding="raw",
                           progress=False)
    assert result.skipped == []
    got = _records(out)
    decoded = {}
    for (ep, frame, cam), row in got.items():
        path = os.path.join(root, f"videos/chunk-000/{cam}/episode_{ep:06d}.mp4")
        if path not in decoded:
            with av.open(path) as c:
                decoded[path] = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        shown = frame + 1 if (ep, frame) == (1, 2) else frame  # 0.26 s: nearer frame 3
        assert torch.equal(row["pixels"], torch.from_numpy(decoded[path][shown])), (ep, frame)
        assert row["pts_seconds"] == pytest.approx(shown / robot_data.FPS)
        assert np.array_equal(row["observation_state"],
                              np.asarray(robot_data.state(ep, frame), np.float32))
        assert np.array_equal(row["action"], np.asarray(robot_data.action(ep, frame), np.float32))
        assert row["task"] == robot_data.TASKS[ep % 2] and row["task_index"] == ep % 2
        assert row["index"] == [0, 5][ep] + frame
    assert len(got) == 9 * 2
    # records: episode by episode, each camera's frames a run in frame order
    order = [path for *_, path in store_records(out)]
    assert order[:5] == [f"observation.images.top/episode_000000#{f}" for f in range(5)]
    assert order[5] == "observation.images.wrist/episode_000000#0"
    # LeRobot's own tolerance: the two rows between frames are not packed, and say so
    strict = shardkit.pack(root, str(tmp_path / "strict.lmdb"), size=0, encoding="raw",
                           source=LeRobot(cameras="observation.images.wrist"), progress=False)
    assert strict.count == 9 - 2
    assert sorted(s["reason"].split(":")[0] for s in strict.skipped) == [
        "episode 0 frame 1", "episode 1 frame 2"]


def test_refusals(tmp_path):
    root = robot_data.write_v21(str(tmp_path / "ds"), [2], cameras={
        "observation.images.top": (16, 16)})
    with pytest.raises(PackOptionError, match=r"`cameras` must name the dataset's video cameras "
                       r"\(observation.images.top\)"):
        shardkit.pack(root, str(tmp_path / "a.lmdb"), source=LeRobot(cameras="front"),
                      progress=False)
    with pytest.raises(PackOptionError, match="`LeRobot.tolerance_s` must be a number"):
        LeRobot(tolerance_s=0)
    with pytest.raises(PackOptionError, match="`cameras` applies to a LeRobot dataset, and SRC "
                       "is read as 'coco'"):
        shardkit.pack(root, str(tmp_path / "b.lmdb"), progress=False,
                      source=(LeRobot(cameras="observation.images.top"), Coco("ann.json")))
    info = os.path.join(root, "meta", "info.json")
    with open(info) as f:
        meta = json.load(f)
    meta["codebase_version"] = "v1.6"
    with open(info, "w") as f:
        json.dump(meta, f)
    with pytest.raises(PackError, match=r"LeRobot codebase_version 'v1.6' is not read"):
        shardkit.pack(root, str(tmp_path / "c.lmdb"), progress=False)


def test_unreadable_video_skips_its_rows_with_the_reason(tmp_path):
    root = robot_data.write_v21(str(tmp_path / "ds"), [3, 2])
    cut = os.path.join(root, "videos/chunk-000/observation.images.wrist/episode_000001.mp4")
    with open(cut, "r+b") as f:
        f.truncate(os.path.getsize(cut) // 3)  # MP4 index (moov) at the end: gone
    result = shardkit.pack(root, str(tmp_path / "out.lmdb"), size=0, encoding="raw",
                           progress=False)
    assert result.count == 5 + 3  # every top frame, the wrist frames of episode 0
    assert [(s["path"], s["reason"].split(":")[0]) for s in result.skipped] == [
        (cut, "episode 1")]
    assert "cannot open as a video" in result.skipped[0]["reason"]
