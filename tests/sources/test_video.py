"""Packing video frames (``frames``): small real videos written here with PyAV, each packed
record compared with PyAV's own frame at its index (``container.decode``, ``to_ndarray
('rgb24')``, turned upright by the display matrix) and with its fields."""

from __future__ import annotations

import os
import shutil
from fractions import Fraction

import numpy as np
import pytest
import torch
from conftest import store_fields, store_records

import shardkit
from shardkit.cli import main as cli_main
from shardkit.errors import PackOptionError
from shardkit.packing.sources import SOURCES, SourceOptions
from shardkit.read.store import Store
from shardkit.sources import FileList, Frames, Video

av = pytest.importorskip("av")


def _pixels(i: int, h: int, w: int) -> np.ndarray:
    """Frame ``i``: a colour ramp, a moving bar and a corner mark (distinct frames, orientation
    visible)."""
    a = np.zeros((h, w, 3), np.uint8)
    a[..., 0] = (i * 7) % 256
    a[:, (3 * i) % w, 1] = 255
    a[: h // 4, : w // 3, 2] = 200
    a[(2 * i) % h, :, :] = 128
    return a


def write_video(path: str, n: int = 40, w: int = 64, h: int = 48, rate: int = 25, pts=None,
                rotation: int | None = None, codec: str = "libx264", pix: str = "yuv420p",
                options: dict | None = None) -> None:
    c = av.open(path, "w")
    s = c.add_stream(codec, rate=rate, options=options or {})
    s.width, s.height, s.pix_fmt = w, h, pix
    if pts is not None:
        s.codec_context.time_base = s.time_base = Fraction(1, 1000)
    if rotation is not None:
        s.set_display_rotation(rotation)
    for i in range(n):
        frame = av.VideoFrame.from_ndarray(_pixels(i, h, w), format="rgb24")
        if pts is not None:
            frame.pts, frame.time_base = pts[i], Fraction(1, 1000)
        for p in s.encode(frame):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()


VFR_PTS = [0, 40, 100, 110, 120, 400, 430, 1000, 1033, 1066, 1600, 1610, 2300, 2340, 2380, 2900]


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> str:
    """SRC with two class folders: walk/ (B-frames with a keyframe every 10 frames; variable
    frame rate; odd size) and run/ (rotations; damaged, truncated, audio-only, zero-frame and
    not-a-video files)."""
    root = tmp_path_factory.mktemp("videos") / "src"
    walk, run = root / "walk", root / "run"
    walk.mkdir(parents=True)
    run.mkdir()
    write_video(str(walk / "cfr.mp4"), n=40, options={"g": "10", "bf": "2"})
    write_video(str(walk / "vfr.mkv"), n=len(VFR_PTS), pts=VFR_PTS)
    write_video(str(walk / "odd.mkv"), n=12, w=63, h=47, rate=10, pix="yuv444p")
    write_video(str(run / "rot90.mp4"), n=10, rotation=90)
    write_video(str(run / "rot180.mov"), n=10, rotation=180, w=40, h=30)
    write_video(str(run / "rot270.mp4"), n=10, rotation=-90, w=36, h=20)
    write_video(str(run / "long.mkv"), n=60)
    data = (run / "long.mkv").read_bytes()
    (run / "truncated.mkv").write_bytes(data[: len(data) * 6 // 10])
    write_video(str(run / "damaged.mp4"), n=60)
    damaged = bytearray((run / "damaged.mp4").read_bytes())
    mid = len(damaged) // 2
    damaged[mid:mid + 300] = np.random.default_rng(0).integers(0, 256, 300, np.uint8).tobytes()
    (run / "damaged.mp4").write_bytes(bytes(damaged))
    (run / "long.mkv").unlink()
    for name in ("audio.mp4", "empty.mkv"):  # audio only; a video track with no frame
        c = av.open(str(run / name), "w")
        if name == "empty.mkv":
            s = c.add_stream("libx264", rate=25)
            s.width, s.height = 64, 48
        a = c.add_stream("aac", rate=8000)
        samples = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp",
                                             layout="mono")
        samples.sample_rate = 8000
        for p in [*a.encode(samples), *a.encode()]:
            c.mux(p)
        c.close()
    (run / "noise.mp4").write_bytes(np.random.default_rng(1).integers(0, 256, 4000, np.uint8)
                                    .tobytes())
    return str(root)


def library_frames(path: str) -> tuple[list[np.ndarray], list, Fraction, list[bool]]:
    """PyAV's own frames of ``path`` upright (as far as it decodes), their pts, the time base
    and keyframe flags."""
    c = av.open(path)
    stream = c.streams.video[0]
    frames, pts, keys = [], [], []
    try:
        for f in c.decode(stream):
            assert f.rotation % 90 == 0
            frames.append(np.rot90(f.to_ndarray(format="rgb24"), f.rotation // 90))
            pts.append(f.pts)
            keys.append(f.key_frame)
    except av.FFmpegError:
        pass
    c.close()
    return frames, pts, stream.time_base, keys


def pixels_of(record: tuple) -> torch.Tensor:
    data, _, h, w, _ = record
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(h, w, 3)


def _skips(result) -> dict[str, str]:
    return {os.path.basename(s["path"]): s["reason"] for s in result.skipped}


@pytest.fixture(scope="module")
def all_frames(videos, tmp_path_factory) -> tuple[str, object]:
    """Every frame of ``videos``, at their own size, raw: two encoding workers."""
    out = str(tmp_path_factory.mktemp("video-stores") / "all.lmdb")
    result = shardkit.pack(videos, out, source=Video(frames="all"), size=0, encoding="raw",
                           workers=2, progress=False)
    return out, result


def test_every_frame_is_pyav_s_own_frame(videos, all_frames):
    out, result = all_frames
    records = store_records(out)
    fields = {n: store_fields(out, n) for n in ("video", "frame_index", "pts_seconds",
                                                "video_fps")}
    ds = shardkit.ShardDataset(out)
    assert ds.classes == ["run", "walk"]
    by_video: dict[str, list[int]] = {}
    for k, record in enumerate(records):
        rel, index = record[4].split("#")
        assert fields["video"][k] == rel and fields["frame_index"][k] == int(index)
        by_video.setdefault(rel, []).append(k)
    # the frames of a video are consecutive records, in frame order, videos in folder order
    assert list(by_video) == ["run/damaged.mp4", "run/rot180.mov", "run/rot270.mp4",
                              "run/rot90.mp4", "run/truncated.mkv", "walk/cfr.mp4",
                              "walk/odd.mkv", "walk/vfr.mkv"]
    for rel, ks in by_video.items():
        assert ks == list(range(ks[0], ks[0] + len(ks)))
        theirs, pts, tb, _ = library_frames(os.path.join(videos, rel))
        got = [fields["frame_index"][k] for k in ks]
        assert got == list(range(len(theirs))), rel  # damaged/truncated: as far as PyAV decodes
        c = av.open(os.path.join(videos, rel))
        fps = float(c.streams.video[0].average_rate)
        c.close()
        for k, frame, p in zip(ks, theirs, pts):
            assert torch.equal(pixels_of(records[k]), torch.from_numpy(frame.copy())), (rel, k)
            assert fields["pts_seconds"][k] == float(p * tb)
            assert fields["video_fps"][k] == fps
            assert records[k][1] == (0 if rel.startswith("run/") else 1)
    assert pixels_of(records[by_video["walk/odd.mkv"][0]]).shape == (47, 63, 3)
    assert pixels_of(records[by_video["run/rot90.mp4"][0]]).shape == (64, 48, 3)
    assert pixels_of(records[by_video["run/rot270.mp4"][0]]).shape == (36, 20, 3)
    # turned: not the frame as stored
    stored = av.open(os.path.join(videos, "run/rot90.mp4"))
    first = next(stored.decode(video=0)).to_ndarray(format="rgb24")
    stored.close()
    assert first.shape == (48, 64, 3)
    skips = _skips(result)
    assert "truncated" in skips["truncated.mkv"] and "frames before that are packed" in \
        skips["truncated.mkv"]
    assert skips["audio.mp4"] == "no video stream (only audio)"
    assert skips["empty.mkv"] == "no video frames"
    assert skips["noise.mp4"].startswith("cannot open as a video: ")
    damaged = [s for s in result.skipped if "damaged.mp4#" in s["path"]]
    assert damaged and all("cannot decode frame" in s["reason"] for s in damaged)
    assert len(by_video["run/damaged.mp4"]) + len(damaged) == 60


def test_fps_picks_the_frame_on_screen_and_keeps_frame_order(videos, tmp_path):
    """The keyframe seek path (every 15th frame, keyframes every 10) gives PyAV's frames; fps=4
    over a variable frame rate: at each 1/4 s the last frame shown by then, each frame once;
    sharded, the frames of a video stay together and in order, the store's order being video
    order."""
    # first in this process (workers=1): the decoders it leaves open must not hang the forked
    # workers of the next pack
    out2 = str(tmp_path / "every.lmdb")
    shardkit.pack(os.path.join(videos, "walk", "cfr.mp4"), out2, frames=Frames(every=15),
                  size=0, encoding="raw", workers=1, progress=False)
    theirs, _, _, _ = library_frames(os.path.join(videos, "walk", "cfr.mp4"))
    records = store_records(out2)
    assert [r[4] for r in records] == ["cfr.mp4#0", "cfr.mp4#15", "cfr.mp4#30"]
    for r, i in zip(records, (0, 15, 30)):
        assert torch.equal(pixels_of(r), torch.from_numpy(theirs[i]))
    out = str(tmp_path / "fps")
    result = shardkit.pack(os.path.join(videos, "walk"), out, frames="fps=4", size=0,
                           encoding="raw", num_shards=2, workers=2, progress=False)
    assert result.skipped == []
    records = store_records(out)
    names = [r[4] for r in records]
    _, pts, tb, _ = library_frames(os.path.join(videos, "walk", "vfr.mkv"))
    seconds = [p * tb for p in pts]
    want, t = [], seconds[0]
    while t <= seconds[-1]:
        i = max(j for j, s in enumerate(seconds) if s <= t)
        if i not in want:
            want.append(i)
        t += Fraction(1, 4)
    assert [int(n.split("#")[1]) for n in names if n.startswith("vfr.mkv#")] == want
    store = Store(out)
    try:
        assert len(store.shards) == 2
        per_shard = [[store.shard(k).source_path(j) for j in range(e.count)]
                     for k, e in enumerate(store.shards)]
    finally:
        store.close()
    assert [n for part in per_shard for n in part] == names  # physical order = logical order
    # the shard boundary falls between videos: no video is split
    videos_of = [{n.split("#")[0] for n in part} for part in per_shard]
    assert not videos_of[0] & videos_of[1]


def test_frames_read_out_of_order_are_the_same(videos):
    """A worker asked for frames behind its decoder (or after a keyframe) seeks and decodes
    forward: the same pixels as decoding in order."""
    source = SOURCES["video"]
    scan = source.scan(SourceOptions(src=os.path.join(videos, "walk", "cfr.mp4"), frames="all"))
    items = [scan.index.item(i) for i in range(len(scan.samples))]
    theirs, _, _, _ = library_frames(os.path.join(videos, "walk", "cfr.mp4"))
    order = [39, 5, 0, 21, 20, 38, 11, 10, 9, 30]
    for i in order:
        data = source.read(items[i].file, items[i].a, items[i].b, None)
        header, pixels = data[:data.index(b"255\n") + 4], data[data.index(b"255\n") + 4:]
        assert header == b"P6\n64 48\n255\n"
        assert pixels == theirs[i].tobytes(), i


def test_resized_frames_match_the_image_pipeline(videos, tmp_path):
    """A resized JPEG frame record is the record packing that frame as a PNG image gives."""
    frames_dir = tmp_path / "frames" / "walk"
    frames_dir.mkdir(parents=True)
    theirs, _, _, _ = library_frames(os.path.join(videos, "walk", "cfr.mp4"))
    from PIL import Image

    for i in (0, 12, 25, 37):
        Image.fromarray(theirs[i]).save(frames_dir / f"f{i:02d}.png")
    video_store, image_store = str(tmp_path / "v.lmdb"), str(tmp_path / "i.lmdb")
    src = tmp_path / "one" / "walk"
    src.mkdir(parents=True)
    shutil.copy(os.path.join(videos, "walk", "cfr.mp4"), src)
    assert cli_main(["pack", str(src.parent), video_store, "--frames", "fps=2", "--size", "32",
                     "--workers", "1", "-q"]) == 0
    shardkit.pack(str(tmp_path / "frames"), image_store, size=32, workers=1, progress=False)
    assert [r[4] for r in store_records(video_store)] == [
        "walk/cfr.mp4#0", "walk/cfr.mp4#12", "walk/cfr.mp4#25", "walk/cfr.mp4#37"]
    assert [r[:4] for r in store_records(video_store)] == \
        [r[:4] for r in store_records(image_store)]


def test_keyframes_file_list_and_refusals(videos, tmp_path):
    listing = tmp_path / "list.csv"
    listing.write_text("walk/cfr.mp4,moving\nrun/rot90.mp4,turned\n")
    out = str(tmp_path / "kf.lmdb")
    shardkit.pack(videos, out, source=(Video("keyframes"), FileList(str(listing))), size=0,
                  encoding="raw", workers=1, progress=False)
    _, _, _, keys = library_frames(os.path.join(videos, "walk", "cfr.mp4"))
    picked = [int(r[4].split("#")[1]) for r in store_records(out) if "cfr" in r[4]]
    assert picked == [i for i, k in enumerate(keys) if k] and 1 < len(picked) < len(keys)
    assert shardkit.ShardDataset(out).classes == ["moving", "turned"]
    with pytest.raises(PackOptionError, match=r"holds video files: pass `frames`"):
        shardkit.pack(videos, str(tmp_path / "x.lmdb"), progress=False)
    with pytest.raises(PackOptionError, match=r"`Video.frames` is needed"):
        Video()
    with pytest.raises(PackOptionError, match=r"`Video.frames` must be 'fps=F'"):
        Video("fps=0")
    with pytest.raises(PackOptionError, match=r"`Frames.fps` give exactly one"):
        Frames(fps=2, every=3)
    with pytest.raises(PackOptionError, match=r"`frames` must be 'fps=F'"):
        shardkit.pack(videos, str(tmp_path / "x.lmdb"), frames="every=two", progress=False)
    with pytest.raises(PackOptionError, match=r"`captions` does not apply to videos"):
        shardkit.pack(videos, str(tmp_path / "x.lmdb"), frames="all", captions=True,
                      progress=False)
    assert not os.path.exists(tmp_path / "x.lmdb")


def test_work_chunks_end_at_video_starts():
    """Encoding workers are handed whole videos where the chunk size allows (no two workers
    seeking into one short video); a long video is cut within the largest chunk; image paths
    keep their chunks."""
    from shardkit.packing.sources import Item
    from shardkit.packing.stream import chunk_bounds, file_bounds

    guided = chunk_bounds(96, 2, 128)
    short = [Item("video", f"v{i // 12}", i, 0) for i in range(96)]
    assert file_bounds(short, guided, 128) == list(range(0, 97, 12))
    long = [Item("video", f"v{i // 400}", i, 0) for i in range(1000)]
    bounds = file_bounds(long, chunk_bounds(1000, 2, 128), 128)
    assert {400, 800} <= set(bounds) and max(b - a for a, b in zip(bounds, bounds[1:])) <= 128
    paths = [f"img{i}.jpg" for i in range(96)]
    assert file_bounds(paths, guided, 128) == guided
