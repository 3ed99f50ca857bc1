"""Video files through PyAV (FFmpeg): what the scan learns of one (:func:`probe`, packets only,
nothing decoded) and one frame as an encoding worker decodes it (:func:`frame_file`).

A frame's index is its place in PyAV's decoded order (``container.decode(stream)``: presentation
order), its pixels ``frame.to_ndarray(format='rgb24')`` turned upright by the stream's display
matrix as FFmpeg's own player does (:func:`upright`). Each worker keeps the videos it is reading
open (a few) and decodes forward: the frames of a video come to it in order, so a video is
decoded at most once, less the frames nothing refers to that no record needs. A frame behind
the decoder, or past the next keyframe, is reached by seeking to the keyframe at or before it and
decoding forward; where that passes it by, the video is decoded again from its start. A frame is
found by the timestamp the scan listed at its index: one the decoder never gives (a damaged
stream) is refused, never replaced by its neighbour. A video at a URL is decoded from a local
temporary copy (:func:`.url_videos.local_copy`), held while the video is open.
"""

from __future__ import annotations

import os
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from ...urls import is_url
from .base import MemberError, TransferFailed

OPEN_VIDEOS = 4  # per worker: the videos it is reading now, and a few before
NO_PTS = -(1 << 63)  # a frame without a timestamp: found by counting only


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise MemberError("reading video needs PyAV: pip install 'shardkit[video]'") from None
    av.logging.set_level(None)  # FFmpeg's console messages: the reasons travel as skips
    return av


#: the ``a`` of a frame's Item: its index in the low bits, its keyframe's index above
KEY_SHIFT = 32


@dataclass
class Probe:
    """One video as the scan sees it: each frame's timestamp and keyframe flag in presentation
    order, the stream's time base and average rate, and the damage found (or None)."""

    pts: list[int] = field(default_factory=list)
    keyframe: list[bool] = field(default_factory=list)
    time_base: Fraction = Fraction(1)
    fps: float = 0.0
    damage: str | None = None
    #: why the video has no usable frame (no video stream, zero frames...), or None
    empty: str | None = None
    _before: list[int] | None = field(default=None, repr=False)

    def ref(self, i: int) -> tuple[int, int]:
        """How a worker finds frame ``i``: the keyframe at or before it (``<< KEY_SHIFT``)
        with ``i`` itself, and its timestamp (a record's two read numbers)."""
        if self._before is None:
            key, self._before = 0, []
            for j, is_key in enumerate(self.keyframe):
                key = j if is_key else key
                self._before.append(key)
        return (self._before[i] << KEY_SHIFT) | i, self.pts[i]


def probe(path: str | Any) -> Probe:
    """Demux the first video stream of ``path`` (a file name or an open file; no decoding): its
    frames' timestamps. Packets
    stop at the first corrupt one or read error; a file that ends before the frames or the
    duration its header declares is reported as damaged (``damage``), its frames before kept."""
    av = _av()
    out = Probe()
    try:
        container = av.open(path)
    except Exception as exc:  # noqa: BLE001 - FFmpeg's error is the reason
        out.empty = f"cannot open as a video: {_reason(exc)}"
        return out
    try:
        if not container.streams.video:
            kinds = sorted({s.type for s in container.streams})
            out.empty = "no video stream" + (f" (only {', '.join(kinds)})" if kinds else "")
            return out
        stream = container.streams.video[0]
        out.time_base = stream.time_base or Fraction(1, 1)
        rate = stream.average_rate or stream.guessed_rate
        packets: list[tuple[int, bool]] = []
        timeless = False
        try:
            for packet in container.demux(stream):
                if packet.size == 0:  # the demuxer's end-of-stream marker
                    continue
                if packet.is_corrupt:
                    out.damage = f"corrupt packet after frame {len(packets)}"
                    break
                timeless = timeless or packet.pts is None
                packets.append((packet.pts if packet.pts is not None else len(packets),
                                bool(packet.is_keyframe)))
        except Exception as exc:  # noqa: BLE001 - a read error: the frames before are kept
            out.damage = f"read error after frame {len(packets)}: {_reason(exc)}"
        if timeless:  # frames without timestamps: their order is the decoded one
            rate_f = Fraction(rate) if rate else Fraction(1)
            out.time_base = 1 / rate_f
            packets = [(i, key) for i, (_, key) in enumerate(packets)]
        packets.sort(key=lambda p: p[0])
        out.pts = [p for p, _ in packets]
        out.keyframe = [k for _, k in packets]
        if len(set(out.pts)) != len(out.pts):
            out.empty = "frames with the same timestamp: their order is not defined"
            out.pts, out.keyframe = [], []
            return out
        out.fps = float(rate) if rate else (
            float((len(packets) - 1) / ((out.pts[-1] - out.pts[0]) * out.time_base))
            if len(packets) > 1 and out.pts[-1] > out.pts[0] else 0.0)
        if not packets:
            out.empty = out.damage or "no video frames"
        elif out.damage is None:
            out.damage = _short(stream, container, out, rate)
    finally:
        container.close()
    return out


def _short(stream: Any, container: Any, out: Probe, rate: Any) -> str | None:
    """Damage of a file that ends early: fewer frames than its header counts, or its last frame
    ends more than two frames before the duration the header declares (MKV, MP4)."""
    n = len(out.pts)
    if stream.frames and n < stream.frames:
        return f"has {n} of the {stream.frames} frames its header lists (truncated)"
    declared = None
    if stream.duration:
        declared = (stream.start_time or 0) + stream.duration
    else:
        text = (stream.metadata or {}).get("DURATION")  # Matroska's per-track tag
        seconds = _clock(text) if text else None
        if seconds is not None:
            declared = seconds / out.time_base
    if declared is None or not rate:
        return None
    frame = 1 / (Fraction(rate) * out.time_base)
    if out.pts[-1] + 3 * frame < declared:
        end = float(out.pts[-1] * out.time_base)
        total = float(declared * out.time_base)
        return f"ends at {end:.3f} s of the {total:.3f} s its header declares (truncated)"
    return None


def _clock(text: str) -> Fraction | None:
    """``HH:MM:SS.fraction`` in seconds."""
    try:
        h, m, s = text.strip().split(":")
        return int(h) * 3600 + int(m) * 60 + Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _reason(exc: BaseException) -> str:
    # FFmpeg's words without the file's name: the skip list names the file (a local copy of a
    # video at a URL has none)
    if getattr(exc, "filename", None) is not None and getattr(exc, "strerror", None):
        return str(getattr(exc, "strerror"))
    text = str(exc).split("\n")[0]
    return text or type(exc).__name__


def upright(pixels: np.ndarray, matrix: Any) -> np.ndarray:
    """A frame turned as its display matrix says, as FFmpeg's player does (``autorotate``:
    quarter turns, transposes and flips); None: as decoded. MemberError for a rotation that is
    not a quarter turn."""
    if matrix is None:
        return pixels
    m = np.frombuffer(bytes(matrix), "<i4").astype(np.float64) / 65536.0
    scale0, scale1 = np.hypot(m[0], m[3]), np.hypot(m[1], m[4])
    if not (scale0 and scale1):
        return pixels
    # FFmpeg's get_rotation(): minus av_display_rotation_get(), in [0, 360)
    theta = round(float(np.degrees(np.arctan2(m[1] / scale1, m[0] / scale0))))
    theta -= 360 * np.floor(theta / 360 + 0.9 / 360)
    if abs(theta - 90) < 1:
        return pixels.transpose(1, 0, 2) if m[3] > 0 else np.rot90(pixels, -1)
    if abs(theta - 180) < 1:
        out = pixels[:, ::-1] if m[0] < 0 else pixels
        return out[::-1] if m[4] < 0 else out
    if abs(theta - 270) < 1:
        return np.rot90(pixels, -1)[::-1] if m[3] < 0 else np.rot90(pixels, 1)
    if abs(theta) < 1:
        return pixels[::-1] if m[4] < 0 else pixels
    raise MemberError(f"display matrix rotates by {theta:.0f} degrees (not a quarter turn)")


class _Reader:
    """One open video in a worker: its demuxer and decoder, and the index of the frame it gave
    last. Frames are found by their timestamp; on the way to one, the frames before it that
    no other frame refers to (FFmpeg's ``skip_frame='NONREF'``) are not decoded: they cannot
    be asked for later (a worker is asked for a video's frames in order) and no frame decoded
    after them depends on them."""

    def __init__(self, path: str, file: Any = None) -> None:
        av = _av()
        #: the local copy of a video at a URL (``file``: one fetched already), else None
        self.file = file if file is not None or not is_url(path) else _local_copy(path)
        if self.file is not None:
            self.file.seek(0)
        self.container = av.open(self.file if self.file is not None else path)
        self.stream = self.container.streams.video[0]
        # No FFmpeg threads (the workers are the parallelism): a decoder or scaler whose threads
        # a forked worker inherits only as memory cannot be freed there (its free waits forever)
        self.stream.codec_context.thread_count = 1
        self.packets = self.container.demux(self.stream)
        self.queue: deque[Any] = deque()  # decoded frames not yet asked for, in order
        self.last = -1       # index of the frame given last
        self.count = 0       # frames given by the decoder so far (frames without timestamps)
        self.failed: str | None = None  # the decoder's error: later frames are refused with it

    def close(self, keep_file: bool = False) -> None:
        self.container.close()
        if self.file is not None and not keep_file:
            self.file.close()

    def seek(self, pts: int) -> None:
        """Go to the keyframe at or before ``pts``."""
        self.container.seek(pts, stream=self.stream, backward=True, any_frame=False)
        self.stream.codec_context.flush_buffers()
        self.packets = self.container.demux(self.stream)
        self.queue.clear()

    def _more(self, before: int | None) -> bool:
        """Decode the next packet into the queue (False: none left); a frame no other refers to
        is skipped when it shows before timestamp ``before``."""
        ctx = self.stream.codec_context
        for packet in self.packets:
            skip = before is not None and packet.pts is not None and packet.pts < before
            ctx.skip_frame = "NONREF" if skip else "DEFAULT"
            self.queue.extend(ctx.decode(packet))
            return True
        return False

    def find(self, pts: int) -> Any:
        """The frame at timestamp ``pts``, or None where the decoder passes it by."""
        while True:
            while self.queue:
                frame = self.queue.popleft()
                if frame.pts == pts:
                    return frame
                if frame.pts is None or frame.pts > pts:
                    return None
            if not self._more(pts):
                return None

    def nth(self, index: int) -> Any:
        """Frame ``index`` counted from the start (frames without timestamps), or None."""
        while True:
            while self.queue:
                frame = self.queue.popleft()
                self.count += 1
                if self.count - 1 == index:
                    return frame
            if not self._more(None):
                return None


_open: "OrderedDict[str, _Reader]" = OrderedDict()
_pid = os.getpid()


def _local_copy(url: str) -> Any:
    from .url_videos import local_copy

    return local_copy(url)


def _reader(path: str, file: Any = None) -> _Reader:
    global _pid
    if _pid != os.getpid():  # a forked child: the inherited decoders are the parent's
        _open.clear()
        _pid = os.getpid()
    reader = _open.pop(path, None)
    if reader is None:
        reader = _Reader(path, file)
    _open[path] = reader
    while len(_open) > OPEN_VIDEOS:
        _open.popitem(last=False)[1].close()
    return reader


def close_all() -> None:
    """Close the videos this process has open: a new pack's frames are read from the videos as
    they are now (a file replaced or an object uploaded again since), never from an earlier
    pack's open file or copy."""
    if _pid != os.getpid():  # a forked child: the parent's decoders are not closed here
        _open.clear()
    while _open:
        _open.popitem()[1].close()


def _drop(path: str) -> None:
    reader = _open.pop(path, None)
    if reader is not None:
        reader.close()


def decoded_frame(path: str, index: int, key: int, pts: int) -> np.ndarray:
    """Frame ``index`` of the video ``path`` (its keyframe at or before it is frame ``key``,
    its timestamp ``pts``) as upright RGB pixels (MemberError with the reason)."""
    av = _av()
    try:
        reader = _reader(path)
        if reader.failed is not None:
            raise MemberError(reader.failed)
        if pts == NO_PTS:
            if index <= reader.last:
                reader = _reopen(path)
            frame = reader.nth(index)
        else:
            # behind the last frame given, or past the next keyframe: seek
            sought = index <= reader.last or key > reader.last + 1
            if sought:
                reader.seek(pts)
            frame = reader.find(pts)
            if frame is None and sought:  # the seek landed past it: from the start
                reader = _reopen(path)
                frame = reader.find(pts)
        if frame is None:
            raise MemberError(f"frame {index} (timestamp {pts}) is not among the frames the "
                              "decoder gives (a damaged stream)")
        reader.last = index
        if frame.is_corrupt:
            raise MemberError(f"frame {index} decodes with errors (damaged data)")
        matrix = frame.side_data.get("DISPLAYMATRIX")
        return upright(frame.to_ndarray(format="rgb24", threads=1), matrix)
    except (MemberError, TransferFailed):  # a failed GET fails the pack, never a skip
        raise
    except av.FFmpegError as exc:
        reason = f"cannot decode frame {index}: {_reason(exc)}"
        reader = _open.get(path)
        if reader is not None:
            reader.failed = reason
        raise MemberError(reason) from None
    except Exception as exc:  # noqa: BLE001 - any other fault of the file: its reason
        _drop(path)
        raise MemberError(f"cannot decode frame {index}: {_reason(exc)}") from None


def _reopen(path: str) -> _Reader:
    """``path`` opened afresh (a video at a URL: from the copy it has)."""
    reader = _open.pop(path, None)
    if reader is not None:
        reader.close(keep_file=True)
    return _reader(path, reader.file if reader is not None else None)


def frame_file(path: str, index: int, key: int, pts: int, limit: int | None) -> bytes:
    """:func:`decoded_frame` as a binary PPM file, what the image pipeline reads."""
    pixels = decoded_frame(path, index, key, pts)
    height, width = pixels.shape[:2]
    if limit is not None and height * width * 3 > limit:
        raise MemberError(f"frame of {width}x{height} is larger than --max-pixels allows")
    return b"P6\n%d %d\n255\n" % (width, height) + np.ascontiguousarray(pixels).tobytes()
