"""Video files as frame records (``frames``: ``shardkit.sources.Video``, ``--frames``).

SRC is a folder of videos, one video file, or (with ``file_list``) a CSV/TSV of
``path,label`` rows naming videos, or the same under a URL prefix (:mod:`.url_videos`); a folder holding video files directly is flat (no labels,
every video under it), else its subfolders are classes as in torchvision's ImageFolder. Each
frame that ``frames`` picks (:mod:`.frames`) is a record named ``<video>#<frame index>`` (the
video's path relative to SRC) with the typed fields ``video`` (that path), ``frame_index``,
``pts_seconds`` and ``video_fps``, through the image pipeline (resize, encoding).

A video is a container: the scan demuxes it (no decoding) into its frames' timestamps, the
plan keeps each video's frames together and in order (shard boundaries snap to the start of a
video where one is near), and encoding workers decode the frames (:mod:`.video_decode`).
A damaged file keeps the frames before the damage and is named in the skip list; a file with
no video stream or no frame is skipped with the reason.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ...errors import PackError, PackOptionError
from ...urls import is_url
from ..discovery import read_file_list
from .base import ContainerIndex, Scan, Source, SourceOptions
from .fields import ContainerFields
from .frames import FORMS, Frames
from .video_decode import KEY_SHIFT

VIDEO_EXTENSIONS = (".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts",
                    ".mts", ".m2ts", ".flv", ".wmv", ".ogv", ".3gp", ".y4m")


def has_video_extension(name: str) -> bool:
    return name.lower().endswith(VIDEO_EXTENSIONS)


def holds_videos(src: str) -> bool:
    """Whether the local folder ``src`` holds video files and no images (its first level and
    the level below: where a folder of videos or of class folders keeps them)."""
    from ..discovery import has_image_extension

    if not os.path.isdir(src):
        return False
    names: list[str] = []
    try:
        for entry in sorted(os.scandir(src), key=lambda e: e.name)[:1000]:
            if entry.is_dir():
                with os.scandir(entry.path) as inner:
                    names += [e.name for _, e in zip(range(1000), inner)]
            else:
                names.append(entry.name)
    except OSError:
        return False
    return any(map(has_video_extension, names)) and not any(map(has_image_extension, names))


class VideoSource(Source):
    name = "video"
    summary = "video files, each frame `frames` picks a record"
    option = "frames"
    remote = True  # a URL prefix of videos (:mod:`.url_videos`)

    def check(self, options: SourceOptions) -> None:
        super().check(options)
        Frames.parse(options.frames)
        for name in ("coco", "metadata_file", "image_key", "label_key"):
            if getattr(options, name) is not None:
                raise PackOptionError(f"`{name}` does not apply to videos (`frames` reads "
                                      "video files)")
        if options.captions:
            raise PackOptionError("`captions` does not apply to videos (`frames` reads video "
                                  "files)")
        if options.source_format not in (None, "folder"):
            raise PackOptionError(f"`frames` reads video files, and `source_format` is "
                                  f"{options.source_format!r}")
        if is_url(options.src) and options.file_list is not None:
            raise PackOptionError(f"{options.src}: `file_list` names local videos, and SRC is "
                                  "at a URL (its videos are listed)")

    def scan(self, options: SourceOptions) -> Scan:
        from .video_decode import close_all, probe

        close_all()  # decoders left open by an earlier pack in this process
        frames = Frames.parse(options.frames)
        root, classes, videos, skipped = _list_videos(options)
        samples: list[tuple[str, int]] = []
        rows: dict[str, dict[str, Any]] = {}
        files: list[str] = []
        shard_col: list[int] = []
        refs: list[tuple[int, int]] = []
        starts = [0]
        if is_url(root):
            from .url_videos import probe_all

            probes = probe_all([p for p, _ in videos], probe)
        else:
            probes = map(probe, (p for p, _ in videos))
        for (path, label), found in zip(videos, probes):
            rel = path[len(root) + 1:] if is_url(root) else \
                os.path.relpath(path, root).replace(os.sep, "/")
            if found.empty is not None:
                skipped.append({"path": path, "reason": found.empty})
                continue
            picked = frames.select(found.pts, found.time_base, found.keyframe)
            if found.damage is not None:
                skipped.append({"path": path, "reason": f"{found.damage}; its {len(found.pts)} "
                                f"frames before that are packed ({len(picked)} picked)"})
            k = len(files)
            files.append(path)
            for i in picked:
                record = f"{path}#{i}"
                samples.append((record, label))
                rows[record] = {"video": rel, "frame_index": i,
                                "pts_seconds": float(found.pts[i] * found.time_base),
                                "video_fps": found.fps}
                shard_col.append(k)
                refs.append(found.ref(i))
            starts.append(len(samples))
        if not samples:
            first = f"; first: {skipped[0]['path']}: {skipped[0]['reason']}" if skipped else ""
            raise PackError(f"{options.src}: no video frames to pack ({len(videos)} videos, "
                            f"{len(skipped)} skipped{first})")
        index = ContainerIndex(self.name, files, np.asarray(shard_col, dtype=np.int32),
                               np.asarray(refs, dtype=np.int64).reshape(-1, 2), starts)
        return Scan(root, classes, {c: i for i, c in enumerate(classes)}, samples, skipped,
                    fields=ContainerFields(rows, root, len(samples)), index=index)

    @staticmethod
    def read(file: str, a: int, b: int, limit: int | None) -> bytes:
        from .video_decode import frame_file

        return frame_file(file, a & ((1 << KEY_SHIFT) - 1), a >> KEY_SHIFT, b, limit)


def _list_videos(options: SourceOptions
                 ) -> tuple[str, list[str], list[tuple[str, int]], list[dict[str, str]]]:
    """SRC's root, classes, videos ``(path, label)`` in order and the entries skipped."""
    src = os.fspath(options.src)
    if is_url(src):
        from .url_videos import list_url_videos

        return list_url_videos(src, has_video_extension)
    if options.file_list is not None:
        found = read_file_list(options.file_list, src)
        return found.root, found.classes, list(found.samples), list(found.skipped)
    root = os.path.abspath(src)
    if os.path.isfile(root):
        return os.path.dirname(root), [], [(root, -1)], []
    if not os.path.isdir(root):
        raise PackError(f"source folder not found: {src}")
    skipped: list[dict[str, str]] = []
    top = sorted(os.scandir(root), key=lambda e: e.name)
    if any(not e.is_dir() and has_video_extension(e.name) for e in top):
        return root, [], [(p, -1) for p in _videos_under(root, skipped)], skipped
    classes = [e.name for e in top if e.is_dir()]
    videos = [(p, label) for label, c in enumerate(classes)
              for p in _videos_under(os.path.join(root, c), skipped)]
    if not videos:
        raise PackError(f"{src}: no video files ({', '.join(VIDEO_EXTENSIONS)}) in it or in "
                        "its class folders")
    return root, classes, videos, skipped


def _videos_under(folder: str, skipped: list[dict[str, str]]) -> list[str]:
    """Video files under ``folder``, in sorted order (symlinks followed, loops reported)."""
    out: list[str] = []
    seen: set[tuple[int, int]] = set()

    def walk(path: str) -> None:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) in seen:
            skipped.append({"path": path, "reason": "symlink loop: folder already listed"})
            return
        seen.add((st.st_dev, st.st_ino))
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.is_dir():
                walk(entry.path)
            elif has_video_extension(entry.name):
                out.append(entry.path)

    walk(folder)
    return out


__all__ = ["FORMS", "VideoSource", "has_video_extension", "holds_videos"]
