"""Clips at read time (``shardkit.Clips``, ``shardkit.ClipSampler``) from a store packed from
small real videos written here with PyAV: windows of one video only, every window once per
epoch across ranks, one crop and flip per clip (pixels against the dataset's own single-frame
reads under the clip's seed), resume mid-epoch, fork workers, LeRobot's ``delta_timestamps``."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from helpers.videos import write_video

import shardkit
from shardkit.errors import OptionError
from shardkit.read import draws

pytest.importorskip("av")

CROP = dict(crop=24, crop_mode="random_resized", flip=0.5)
#: frames of each video (walk/b is shorter than a 4-frame clip at stride 2 spans; run/d is
#: shorter than any clip of more than 3 frames)
LENGTHS = {"run/c.mp4": 20, "run/d.mp4": 3, "walk/a.mp4": 30, "walk/b.mkv": 9}


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """The four videos, every frame a raw record, in two shards (split between videos)."""
    base = tmp_path_factory.mktemp("clips")
    for tint, (rel, n) in enumerate(LENGTHS.items()):
        os.makedirs(base / "src" / os.path.dirname(rel), exist_ok=True)
        write_video(str(base / "src" / rel), n, tint=40 * tint)
    out = str(base / "frames")
    shardkit.pack(str(base / "src"), out, frames="all", size=0, encoding="raw", num_shards=2,
                  workers=1, progress=False)
    return out


def frame_keys(ds) -> list[tuple[str, int]]:
    """(video, frame number) of every record, from its key ``video#frame``."""
    return [(k.split("#")[0], int(k.split("#")[1])) for k in map(ds.key, range(len(ds)))]


def expected_windows(ds, frames: int, stride: int) -> set[tuple[tuple[str, int], ...]]:
    """Every window of ``frames`` frames ``stride`` apart inside one video."""
    have = set(frame_keys(ds))
    return {tuple((v, i + k * stride) for k in range(frames)) for v, i in have
            if all((v, i + k * stride) in have for k in range(frames))}


def test_windows_stay_in_one_video_and_every_one_comes_once_across_two_ranks(store):
    ds = shardkit.ShardDataset(store)
    keys = frame_keys(ds)
    want = expected_windows(ds, 4, 2)
    assert len(want) == (20 - 6) + (30 - 6) + (9 - 6)  # run/d holds none
    seen, per_rank, orders = [], [], []
    for rank in (0, 1):
        sampler = shardkit.ClipSampler(ds, frames=4, stride=2, num_replicas=2, rank=rank,
                                       seed=3)
        clips = sampler.dataset
        assert len(clips) == len(want)
        mine = list(sampler)
        assert len(mine) == len(sampler) == (len(want) + 1) // 2
        per_rank.append(mine)
        seen += [tuple(keys[f] for f in clips.frame_indices(j)) for j in mine]
        sampler.set_epoch(1)
        orders.append((mine, list(sampler)))
    # one padding sample (odd count), every window at least once, nothing else
    assert set(seen) == want and len(seen) == len(want) + 1
    assert orders[0][0] != orders[0][1]  # reshuffled per epoch
    assert sorted(orders[0][0]) != orders[0][0]  # shuffled


def test_clip_pixels_fields_and_one_draw_per_clip(store):
    """Each frame of a clip is the dataset's own read of that frame under the clip's seed: the
    same box and flip on every frame. Another seed gives other pixels (the check can fail)."""
    ds = shardkit.ShardDataset(store, **CROP)
    clips = shardkit.Clips(ds, frames=3, stride=5, fields=["frame_index", "pts_seconds",
                                                           "label"])
    keys = frame_keys(ds)
    flips = set()
    for j, seed in ((0, 11), (7, 12), (len(clips) - 1, 13), (20, 14), (21, 15), (22, 16)):
        images, target = clips[draws.KeyedIndex(j, seed)]
        assert images.shape == (3, 3, 24, 24) and images.dtype == torch.uint8
        frames = clips.frame_indices(j)
        video, first = keys[frames[0]]
        assert [keys[f] for f in frames] == [(video, first + 5 * k) for k in range(3)]
        assert target["frame_index"].tolist() == [first, first + 5, first + 10]
        assert target["pts_seconds"].tolist() == pytest.approx(
            [first / 25, (first + 5) / 25, (first + 10) / 25], abs=1e-6)
        assert target["label"] == ds.targets[frames[0]]
        for t, f in enumerate(frames):
            torch.manual_seed(seed)
            assert torch.equal(images[t], ds[f][0]), (j, t)
        torch.manual_seed(seed + 1000)
        assert not torch.equal(images[0], ds[frames[0]][0])
        # the flip drawn once: frame 0 of the clip against the unflipped draw of its box
        plain = shardkit.ShardDataset(store, crop=24, crop_mode="random_resized")
        torch.manual_seed(seed)
        unflipped = plain[frames[0]][0]
        flipped = torch.equal(images[0], unflipped.flip(-1))
        assert flipped or torch.equal(images[0], unflipped)
        flips.add(flipped)
    assert flips == {True, False}


def loader_batches(store, seed, resume=None, stop=None, workers=0):
    """Batches of one epoch of a 2-clips-a-batch loader under a ClipSampler (epoch 1)."""
    ds = shardkit.ShardDataset(store, **CROP)
    sampler = shardkit.ClipSampler(ds, frames=2, stride=3, fields=["frame_index"], seed=5)
    sampler.set_epoch(1)
    loader = sampler.dataset.loader(2, sampler=sampler, num_workers=workers,
                                    multiprocessing_context="fork" if workers else None,
                                    generator=torch.Generator().manual_seed(seed))
    if resume is not None:
        loader.load_state_dict(resume)
    out = []
    for images, target in loader:
        out.append((images.clone(), target["frame_index"].clone()))
        if stop is not None and len(out) == stop:
            return out, loader.state_dict()
    return out, None


def test_resume_mid_epoch_and_fork_workers_give_the_uninterrupted_batches(store):
    whole, _ = loader_batches(store, seed=21)
    assert whole[0][0].shape == (2, 2, 3, 24, 24)
    ds = shardkit.ShardDataset(store)
    n = len(expected_windows(ds, 2, 3))
    assert sum(len(b[1]) for b in whole) == n
    # every clip of the epoch once, its frames 3 apart
    starts = [tuple(r) for b in whole for r in b[1].tolist()]
    assert all(b - a == 3 for a, b in starts)
    # a batch is its clips as read one by one under their seeds (the loader's seed 21, epoch 1,
    # the clip's place in the epoch)
    ds_crop = shardkit.ShardDataset(store, **CROP)
    sampler = shardkit.ClipSampler(ds_crop, frames=2, stride=3, fields=["frame_index"], seed=5)
    sampler.set_epoch(1)
    order = list(sampler)
    for place in (0, 1, 2, 3):
        one, target = sampler.dataset[draws.KeyedIndex(order[place],
                                                       shardkit.sample_seed(21, 1, place))]
        assert torch.equal(whole[place // 2][0][place % 2], one)
        assert torch.equal(whole[place // 2][1][place % 2], target["frame_index"])
    head, state = loader_batches(store, seed=21, stop=4)
    torch.manual_seed(999)  # a resumed run's own RNG does not matter: the state pins the draws
    tail, _ = loader_batches(store, seed=77, resume=state)
    forked, _ = loader_batches(store, seed=21, workers=2)
    for got in (head + tail, forked):
        assert len(got) == len(whole)
        for (a, fa), (b, fb) in zip(got, whole):
            assert torch.equal(fa, fb) and torch.equal(a, b)


def test_state_resumes_at_another_world_size(store):
    ds = shardkit.ShardDataset(store)
    two = [shardkit.ClipSampler(ds, frames=3, num_replicas=2, rank=r, seed=1) for r in (0, 1)]
    lists = [list(s) for s in two]
    state = two[0].state_dict(consumed=5)
    one = shardkit.ClipSampler(ds, frames=3, num_replicas=1, rank=0, seed=1)
    one.load_state_dict(state)
    global_order = [x for pair in zip(*lists) for x in pair]
    assert list(one) == global_order[10:len(one.dataset)]
    # the same windows asked for in seconds: the same clips, so the state applies
    same = shardkit.ClipSampler(ds, delta_timestamps={"cam": [0.0, 0.04, 0.08]},
                                num_replicas=1, rank=0, seed=1)
    same.load_state_dict(state)
    assert list(same) == list(one)
    other = shardkit.ClipSampler(ds, frames=4, num_replicas=1, rank=0, seed=1)
    with pytest.raises(OptionError, match="cannot resume: saved dataset_len=54, this sampler "
                                          "has 50"):
        other.load_state_dict(state)


def test_delta_timestamps_as_lerobot_gives_them(store):
    """At 25 fps: the image 0.08 s before and now, frame_index now and the next two frames;
    anchors are the frames whose every offset lies inside their video."""
    ds = shardkit.ShardDataset(store)
    keys = frame_keys(ds)
    clips = shardkit.Clips(ds, delta_timestamps={"observation.image": [-0.08, 0.0],
                                                 "frame_index": [0.0, 0.04, 0.08]})
    want = {(v, i) for v, i in keys if i >= 2 and i + 2 < LENGTHS[v]}
    got = set()
    for j in range(len(clips)):
        images, target = clips[j]
        frames = clips.frame_indices(j)
        video, now = keys[frames[1]]
        assert keys[frames[0]] == (video, now - 2)
        assert target["frame_index"].tolist() == [now, now + 1, now + 2]
        assert torch.equal(images[1], ds[frames[1]][0]) and images.shape[0] == 2
        got.add((video, now))
    assert got == want and len(clips) == len(want)
    with pytest.raises(OptionError, match=r"0.05 s is not a whole number of frames at 25 fps"):
        shardkit.Clips(ds, delta_timestamps={"observation.image": [0.0, 0.05]})
    # within LeRobot's tolerance (1e-4 s) of a whole frame: accepted
    near = shardkit.Clips(ds, delta_timestamps={"cam": [-0.04 + 5e-5, 0.0]})
    assert len(near) == len(ds) - len(LENGTHS)


def test_refusals(store, tmp_path):
    ds = shardkit.ShardDataset(store)
    with pytest.raises(OptionError, match="frames must be an integer >= 1"):
        shardkit.ClipSampler(ds, frames=0)
    with pytest.raises(OptionError, match="no clip fits in any of the 4 videos"):
        shardkit.Clips(ds, frames=31)
    with pytest.raises(OptionError, match="'speed' is not a field of this store"):
        shardkit.Clips(ds, frames=2, fields=["speed"])
    with pytest.raises(OptionError, match="pass it without frames"):
        shardkit.Clips(ds, frames=2, delta_timestamps={"cam": [0.0]})
    with pytest.raises(OptionError, match="'a' and 'b' are not fields of this store"):
        shardkit.Clips(ds, delta_timestamps={"a": [0.0], "b": [0.0]})
    with pytest.raises(OptionError, match="output='tensor'"):
        shardkit.Clips(shardkit.ShardDataset(store, output="numpy"), frames=2)
    images = tmp_path / "img" / "c"
    images.mkdir(parents=True)
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(images / "x.png")
    shardkit.pack(str(tmp_path / "img"), str(tmp_path / "i.lmdb"), workers=1, progress=False)
    with pytest.raises(OptionError, match="clips need a store of video frames"):
        shardkit.Clips(shardkit.ShardDataset(str(tmp_path / "i.lmdb")), frames=2)


def test_delta_timestamps_over_a_lerobot_shaped_store(tmp_path):
    """A store laid out as the LeRobot source packs one (each row a record per camera, fields
    `camera`, `video` `<camera>/episode_<N>`, `observation_state`, `action`; no `video_fps`):
    the camera key picks that camera's frames, `observation.state` names `observation_state`,
    the dataset's fps converts the seconds."""
    from shardkit import fields as F

    path = str(tmp_path / "robot.lmdb")
    schema = [F.Text("video"), F.Int("frame_index"), F.Text("camera"),
              F.Array("observation_state", [2]), F.Array("action", [3])]
    rng = np.random.default_rng(0)
    lengths = {0: 7, 1: 5}
    with shardkit.StoreWriter(path, ["task"], size=0, encoding="raw", schema=schema) as w:
        for episode, n in lengths.items():
            for camera in ("observation.images.top", "observation.images.wrist"):
                for i in range(n):
                    w.add(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), 0,
                          video=f"{camera}/episode_{episode}", frame_index=i, camera=camera,
                          observation_state=np.array([episode, i], np.float32),
                          action=np.array([episode, i, 1], np.float32))
    ds = shardkit.ShardDataset(path)
    deltas = {"observation.images.wrist": [-0.2, 0.0], "observation.state": [0.0],
              "action": [0.0, 0.1, 0.2]}
    with pytest.raises(OptionError, match="pass fps"):
        shardkit.Clips(ds, delta_timestamps=deltas)
    clips = shardkit.Clips(ds, delta_timestamps=deltas, fps=10)
    # anchors i in 2..n-3 of each episode, wrist frames only
    assert len(clips) == sum(n - 4 for n in lengths.values())
    got = set()
    for j in range(len(clips)):
        images, target = clips[j]
        frames = clips.frame_indices(j)
        episode, now = (int(v) for v in target["observation_state"][0].tolist())
        assert target["action"].tolist() == [[episode, now + k, 1] for k in range(3)]
        # records: episode 0 top, episode 0 wrist, episode 1 top, episode 1 wrist
        first_wrist = lengths[0] if episode == 0 else 2 * lengths[0] + lengths[1]
        assert frames == [first_wrist + now - 2, first_wrist + now]
        assert torch.equal(images[1], ds[first_wrist + now][0])
        got.add((episode, now))
    assert got == {(e, i) for e, n in lengths.items() for i in range(2, n - 2)}
    with pytest.raises(OptionError, match="'observation.images.side' is neither a field nor a "
                                          "camera of this store"):
        shardkit.Clips(ds, delta_timestamps={"observation.images.side": [0.0]}, fps=10)
