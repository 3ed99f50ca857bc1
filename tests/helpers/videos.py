"""Small real videos written with PyAV for the tests that read frames packed from them."""

from __future__ import annotations

import numpy as np


def frame_pixels(i: int, h: int, w: int, tint: int = 0) -> np.ndarray:
    """Frame ``i``: a colour ramp, a moving bar and a corner mark (frames differ from each
    other, and from the same frame turned or flipped); ``tint`` tells videos apart."""
    a = np.zeros((h, w, 3), np.uint8)
    a[..., 0] = (i * 7 + tint) % 256
    a[:, (3 * i) % w, 1] = 255
    a[: h // 4, : w // 3, 2] = 200
    a[(2 * i) % h, :, :] = 128
    return a


def write_video(path: str, n: int, w: int = 64, h: int = 48, rate: int = 25,
                tint: int = 0) -> None:
    """An H.264 video of ``n`` frames of :func:`frame_pixels` at ``rate`` frames a second."""
    import av

    c = av.open(path, "w")
    s = c.add_stream("libx264", rate=rate)
    s.width, s.height, s.pix_fmt = w, h, "yuv420p"
    for i in range(n):
        for p in s.encode(av.VideoFrame.from_ndarray(frame_pixels(i, h, w, tint),
                                                     format="rgb24")):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()
