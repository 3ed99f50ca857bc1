"""Packing video frames at ``frames='fps=2'`` vs decoding the same videos once with PyAV.

Videos (H.264 in MP4, made here with PyAV: moving gradients with noise, so the encoder works as
on camera footage) sit in class folders. The baseline decodes every frame of every video once
(``for frame in container.decode(stream)``, nothing converted), the videos spread over as many
processes as the pack has workers; the pack is the whole ``shardkit.pack`` call (scan, decode,
RGB, resize 256, JPEG, write). Both are run interleaved ``--rounds`` times; best of each
reported, in wall time and in CPU seconds (this process and its workers: a shared machine's
other load does not count). Target: pack throughput >= 0.8x the decode's (``decode time / pack time``).

    .venv/bin/python benchmarks/video_pack.py --videos 16 --seconds 8 --workers 2 --rounds 3 \
        --out benchmarks/results/video_pack.txt
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import resource
import tempfile
import time

from reports import emit, make_video  # beside this script

CLASSES = 4


def decode_all(path: str) -> int:
    import av

    with av.open(path) as c:
        return sum(1 for _ in c.decode(c.streams.video[0]))


def cpu_seconds() -> float:
    """CPU time of this process and its ended children (workers), user and system."""
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                 resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def decode_once(paths: list[str], workers: int) -> tuple[float, float, int]:
    """Seconds (wall, CPU) to decode every frame of ``paths`` once over ``workers`` processes
    (the CPU time includes the pool's start)."""
    ctx = multiprocessing.get_context("fork")
    c0 = cpu_seconds()
    pool = ctx.Pool(workers)
    pool.map(abs, range(workers))  # started before the clock
    t0 = time.perf_counter()
    frames = sum(pool.map(decode_all, paths, chunksize=1))
    wall = time.perf_counter() - t0
    pool.close()
    pool.join()
    return wall, cpu_seconds() - c0, frames


def main() -> None:
    import shardkit

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--videos", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--fps", type=int, default=25)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=360)
    ap.add_argument("--gop", type=int, default=50, help="frames between keyframes")
    ap.add_argument("--frames", default="fps=2")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="also write the report here")
    args = ap.parse_args()
    lines = []
    with tempfile.TemporaryDirectory() as root:
        src = os.path.join(root, "videos")
        paths = []
        for k in range(args.videos):
            folder = os.path.join(src, f"class{k % CLASSES}")
            os.makedirs(folder, exist_ok=True)
            paths.append(os.path.join(folder, f"video{k:03d}.mp4"))
            make_video(paths[-1], k, args.seconds, args.fps, args.width, args.height, args.gop)
        paths.sort()
        # warm-up: imports, codecs, the page cache
        decode_once(paths[:2], args.workers)
        shardkit.pack(paths[0], os.path.join(root, "warm.lmdb"), frames=args.frames,
                      workers=args.workers, progress=False)
        decode_t, pack_t, decode_cpu, pack_cpu = [], [], [], []
        frames = records = 0
        for round_ in range(args.rounds):
            t, c, frames = decode_once(paths, args.workers)
            decode_t.append(t)
            decode_cpu.append(c)
            out = os.path.join(root, f"pack-{round_}.lmdb")
            c0, t0 = cpu_seconds(), time.perf_counter()
            result = shardkit.pack(src, out, frames=args.frames, workers=args.workers,
                                   progress=False)
            pack_t.append(time.perf_counter() - t0)
            pack_cpu.append(cpu_seconds() - c0)
            records = result.count
            assert not result.skipped, result.skipped[:3]
            os.remove(out)
        d, p = min(decode_t), min(pack_t)
        lines.append(f"decode once: {frames} frames in best {d:.2f} s = {frames / d:.0f} "
                     f"frames/s; runs " + ", ".join(f"{x:.2f}" for x in decode_t) + " s")
        lines.append(f"pack {args.frames}: {records} records from the same {frames} frames in "
                     f"best {p:.2f} s = {frames / p:.0f} video frames/s; runs "
                     + ", ".join(f"{x:.2f}" for x in pack_t) + " s")
        lines.append(f"CPU seconds, best: decode {min(decode_cpu):.2f}, pack {min(pack_cpu):.2f} "
                     f"(pack / decode throughput per CPU-second: "
                     f"{min(decode_cpu) / min(pack_cpu):.2f}x)")
        lines.append(f"pack / decode throughput (wall, best of {args.rounds}): {d / p:.2f}x "
                     "(target >= 0.8x)")
    import av

    header = (f"video_pack: {args.videos} H.264 videos {args.width}x{args.height}, "
              f"{args.seconds:g} s at {args.fps} fps, keyframe every {args.gop} frames -> "
              f"{args.frames}, size 256 JPEG; workers {args.workers}, {os.cpu_count()} CPUs, "
              f"Python {platform.python_version()}, PyAV {av.__version__} (FFmpeg "
              f"{av.ffmpeg_version_info}), shardkit {shardkit.__version__}")
    emit([header, *lines], args.out)


if __name__ == "__main__":
    main()
