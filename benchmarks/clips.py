"""Reading clips from a store of video frames vs decoding the same clips from the MP4s.

Videos (H.264 in MP4, made here with PyAV: moving gradients with noise, so the encoder works
as on camera footage, a keyframe every ``--gop`` frames) are packed once with ``frames='all'`` at
``--size`` (JPEG). Then, per CPU-second of the reading process (``num_workers=0``, so every
decode is counted; CPU seconds, not wall seconds, as the machine is shared):

- **store clips**: ``shardkit.Clips(ds, frames=T, stride=S)`` through ``clips.loader`` and a
  ``ClipSampler``, ``ds`` cropping each clip at decode (``random_resized``, flip 0.5, one draw
  per clip);
- **MP4 clips**: a DataLoader whose dataset decodes each clip from its MP4 per sample with PyAV
  (open, seek to the keyframe before the clip, decode forward, each frame of the clip converted
  to RGB at the store's size by FFmpeg's scaler, then the same random crop cut out, uncopied:
  less work than the store's resize of the crop). torchcodec needs the system's FFmpeg
  libraries, which are not installed here; PyAV decodes with the same FFmpeg.
- **store frames**: the same frames read as single images from the same store, shuffled
  (``ShardSampler``), with the same crop: what a clip's frame is compared with;
- **clips of 1 and 2 frames**: what a clip costs as it grows.

Rounds are interleaved; the best of each is reported.

    .venv/bin/python benchmarks/clips.py --videos 8 --seconds 12 --rounds 3 \
        --out benchmarks/results/clips.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import numpy as np
import torch
from reports import command_line, emit, make_video  # beside this script
from torch.utils.data import DataLoader, Dataset

import shardkit


class Mp4Clips(Dataset):
    """Clip ``j``: frames ``start, start + stride, ...`` of its video, decoded from the MP4."""

    def __init__(self, clips: list[tuple[str, int]], frames: int, stride: int, fps: int,
                 size: tuple[int, int], crop: int) -> None:
        self.clips, self.frames, self.stride, self.fps = clips, frames, stride, fps
        self.size, self.crop = size, crop

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, j: int) -> torch.Tensor:
        import av

        path, start = self.clips[j]
        wanted = set(range(start, start + self.frames * self.stride, self.stride))
        h, w = self.size
        y, x = np.random.randint(0, h - self.crop + 1), np.random.randint(0, w - self.crop + 1)
        out = []
        with av.open(path) as c:
            stream = c.streams.video[0]
            c.seek(int(start / self.fps / stream.time_base), stream=stream, backward=True)
            for frame in c.decode(stream):
                i = round(frame.pts * stream.time_base * self.fps)
                if i in wanted:
                    rgb = frame.to_ndarray(format="rgb24", width=w, height=h)
                    out.append(torch.from_numpy(rgb[y:y + self.crop, x:x + self.crop])
                               .permute(2, 0, 1))
                    if len(out) == self.frames:
                        break
        return torch.stack(out)


def cpu_epoch(loader) -> tuple[float, int]:
    """(CPU seconds of this process, samples) of one pass over ``loader``."""
    c0, n = time.process_time(), 0
    for batch in loader:
        n += len(batch[0]) if isinstance(batch, (list, tuple)) else len(batch)
    return time.process_time() - c0, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--fps", type=int, default=25)
    parser.add_argument("--width", type=int, default=480)
    parser.add_argument("--height", type=int, default=272)
    parser.add_argument("--gop", type=int, default=50)
    parser.add_argument("--size", type=int, default=144, help="the store's short side")
    parser.add_argument("--crop", type=int, default=128)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--stride", type=int, default=2)
    parser.add_argument("--clips", type=int, default=160, help="clips read per pass")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    work = args.work_dir or tempfile.mkdtemp(prefix="shardkit-clips-")
    src, store = os.path.join(work, "videos"), os.path.join(work, "frames")
    paths = []
    for v in range(args.videos):
        path = os.path.join(src, f"c{v % 2}", f"v{v:02d}.mp4")
        paths.append(path)
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            make_video(path, v, args.seconds, args.fps, args.width, args.height, args.gop)
    if not os.path.exists(store):
        shardkit.pack(src, store, frames="all", size=args.size, workers=2, progress=False)

    crop = dict(crop=args.crop, crop_mode="random_resized", flip=0.5)
    ds = shardkit.ShardDataset(store, **crop)
    t, s = args.frames, args.stride
    samplers = {n: shardkit.ClipSampler(ds, frames=n, stride=s, seed=1) for n in (1, 2, t)}
    # the same clips from the MP4s: the first --clips of the T-frame sampler's epoch
    picked = list(samplers[t])[:args.clips]
    clips = samplers[t].dataset
    keys = [ds.key(clips.frame_indices(j)[0]).split("#") for j in picked]
    mp4 = Mp4Clips([(os.path.join(src, v), int(i)) for v, i in keys], t, s, args.fps,
                   (args.size, round(args.size * args.width / args.height)), args.crop)
    frames_sampler = shardkit.ShardSampler(ds, seed=1)

    def store_clips(n: int):
        sampler = samplers[n]
        count = args.clips * t // n  # as many frames as the T-frame pass reads
        return sampler.dataset.loader(args.batch, sampler=list(sampler)[:count])

    loaders = {
        "MP4 clips (PyAV per sample)": lambda: DataLoader(mp4, args.batch),
        f"store clips, {t} frames": lambda: store_clips(t),
        "store clips, 2 frames": lambda: store_clips(2),
        "store clips, 1 frame": lambda: store_clips(1),
        "store frames (single images)": lambda: ds.loader(
            args.batch * t, sampler=list(frames_sampler)[:args.clips * t]),
    }
    for make in loaders.values():  # warm up: page cache, imports, buffers
        cpu_epoch(make())
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, make in loaders.items():
            seconds, n = cpu_epoch(make())
            best[name] = max(best.get(name, 0.0), n / seconds)
    per_frame = {name: rate * (t if "MP4" in name or f"{t} frames" in name else
                               2 if "2 frames" in name else 1) for name, rate in best.items()}
    base = best["MP4 clips (PyAV per sample)"]
    clip, single = f"store clips, {t} frames", "store frames (single images)"
    lines = [f"Clips of {t} frames (stride {s}) from {args.videos} MP4s of {args.seconds:g} s at "
             f"{args.fps} fps, {args.width}x{args.height}, keyframe every {args.gop}; store "
             f"packed frames='all' at {args.size} (JPEG); crop {args.crop} random_resized + "
             f"flip; batch {args.batch}; num_workers=0; best of {args.rounds} rounds",
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
             f"torch {torch.__version__}", "",
             f"{'':32} {'samples/CPU-s':>14} {'frames/CPU-s':>13}"]
    for name, rate in best.items():
        lines.append(f"{name:32} {rate:14.1f} {per_frame[name]:13.1f}")
    ratio = best["store clips, 1 frame"] / best["store clips, 2 frames"]
    lines += ["",
              f"store clips vs MP4 clips, per CPU-second: {best[clip] / base:.1f}x",
              f"store clip frames vs single images, per frame: "
              f"{per_frame[clip] / per_frame[single]:.2f}x",
              f"a 2-frame clip costs {ratio:.2f}x a 1-frame clip"]
    emit(lines, args.out, command_line())


if __name__ == "__main__":
    main()
