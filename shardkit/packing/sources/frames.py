"""Which frames of a video become records: :class:`Frames` (``shardkit.sources.Frames``) and its
string form (``'fps=2'``, ``'every=5'``, ``'keyframes'``, ``'all'``), which ``--frames`` takes.

* ``fps=F``      the frame on screen at each ``1/F`` seconds from the first frame: for each time
  ``t0 + k/F`` (``t0`` the first frame's timestamp) the last frame whose timestamp is at or
  before it, each frame once. Timestamps are compared exactly (integers of the stream's time
  base against rational times), so a variable frame rate picks what a player shows then.
* ``every=N``    frames ``0, N, 2N, ...`` of the decoded order.
* ``keyframes``  the frames whose packet is a keyframe.
* ``all``        every frame.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

from ...errors import PackOptionError

FORMS = "'fps=F', 'every=N', 'keyframes' or 'all'"


@dataclass(frozen=True)
class Frames:
    """The frames of each video to pack: exactly one of ``fps`` (frames a second, > 0: a number
    or a fraction string such as ``'30000/1001'``), ``every`` (every N-th frame),
    ``keyframes=True`` or ``all=True``. ``Frames.parse('fps=2')`` reads the string form."""

    fps: Any = None
    every: int | None = None
    keyframes: bool = False
    all: bool = False

    def __post_init__(self) -> None:
        chosen = [n for n, v in (("fps", self.fps is not None), ("every", self.every is not None),
                                 ("keyframes", self.keyframes is True),
                                 ("all", self.all is True)) if v]
        for name in ("keyframes", "all"):
            if not isinstance(getattr(self, name), bool):
                self._refuse(name, f"must be True or False, not {getattr(self, name)!r}")
        if len(chosen) != 1:
            self._refuse("fps", f"give exactly one of fps, every, keyframes, all (got "
                         f"{', '.join(chosen) or 'none'})")
        if self.fps is not None:
            object.__setattr__(self, "fps", _rate(self.fps))
        if self.every is not None and (isinstance(self.every, bool) or
                                       not isinstance(self.every, int) or self.every < 1):
            self._refuse("every", f"must be an integer >= 1, not {self.every!r}")

    @staticmethod
    def _refuse(name: str, message: str) -> None:
        raise PackOptionError(f"`Frames.{name}` {message}")

    @classmethod
    def parse(cls, text: Any) -> Frames:
        """A :class:`Frames` from itself or its string form (PackOptionError naming ``frames``
        for anything else)."""
        if isinstance(text, Frames):
            return text
        if not isinstance(text, str):
            raise PackOptionError(f"`frames` must be {FORMS} (or a shardkit.sources.Frames), "
                                  f"not {text!r}")
        spec = text.strip().lower()
        if spec in ("keyframes", "all"):
            return cls(**{spec: True})
        name, _, value = spec.partition("=")
        try:
            if name.strip() == "fps":
                return cls(fps=value.strip())
            if name.strip() == "every" and value.strip().isdigit():
                return cls(every=int(value))
        except PackOptionError:
            pass
        raise PackOptionError(f"`frames` must be {FORMS}, not {text!r}")

    def __str__(self) -> str:
        if self.fps is not None:
            return f"fps={self.fps}"
        if self.every is not None:
            return f"every={self.every}"
        return "keyframes" if self.keyframes else "all"

    def select(self, pts: Sequence[int], time_base: Fraction, keyframe: Sequence[bool]
               ) -> list[int]:
        """The indices (in presentation order) of the frames to pack, from each frame's
        timestamp ``pts`` (ascending integers, in ``time_base`` seconds) and keyframe flag."""
        n = len(pts)
        if self.all:
            return list(range(n))
        if self.every is not None:
            return list(range(0, n, self.every))
        if self.keyframes:
            return [i for i in range(n) if keyframe[i]]
        if not n:
            return []
        step = 1 / (self.fps * time_base)  # 1/F seconds, in time-base units (exact)
        out: list[int] = []
        k = 0
        while True:
            at = pts[0] + k * step
            if at > pts[-1]:
                return out
            i = bisect_right(pts, at) - 1  # the last frame at or before time ``at``
            if not out or i != out[-1]:
                out.append(i)
            if i + 1 >= n:  # later times all show the last frame, packed already
                return out
            # the first later time that reaches the next frame (the times before it show i)
            k = max(k + 1, math.ceil((pts[i + 1] - pts[0]) / step))


def _rate(value: Any) -> Fraction:
    """frames a second (> 0) as an exact fraction, from a number or a string."""
    try:
        if isinstance(value, bool):
            raise ValueError
        rate = Fraction(value) if not isinstance(value, float) else Fraction(str(value))
    except (ValueError, TypeError, ZeroDivisionError):
        Frames._refuse("fps", f"must be a number of frames a second > 0, not {value!r}")
    if rate <= 0:
        Frames._refuse("fps", f"must be > 0, not {value!r}")
    return rate
