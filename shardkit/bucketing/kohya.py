"""The arithmetic of kohya sd-scripts' bucketing (``library/train_util.py``: ``BucketManager``,
``trim_and_resize_if_required``; ``library/model_util.py``: ``make_bucket_resolutions``),
restated with the same floating-point operations in the same order, so every size comes out as
sd-scripts computes it (``tests/packing/test_bucket_peers.py`` compares with sd-scripts' own
outputs on thousands of sizes). Sizes here are (width, height), sd-scripts' order.
"""

from __future__ import annotations

import math

import numpy as np


def adjust_min_max(min_reso: int, max_reso: int, step: int) -> tuple[int, int]:
    """``adjust_min_max_bucket_reso_by_steps``: the minimum cut down to the step, the maximum
    raised to it."""
    if min_reso % step:
        min_reso -= min_reso % step
    if max_reso % step:
        max_reso += step - max_reso % step
    return min_reso, max_reso


def make_resolutions(resolution: tuple[int, int], min_size: int, max_size: int,
                     step: int) -> list[tuple[int, int]]:
    """``make_bucket_resolutions(resolution, min_size, max_size, step)``: (width, height) pairs,
    sorted. The square whose side is the area's root cut down to the step, then for each width
    from ``min_size`` in steps to ``max_size`` the height ``area // width`` cut down to the step
    and capped at ``max_size``, kept both ways if it is at least ``min_size``."""
    area = resolution[0] * resolution[1]
    side = int(math.sqrt(area) // step) * step
    found = {(side, side)}
    for width in range(min_size, max_size + 1, step):
        height = min(max_size, int((area // width) // step) * step)
        if height >= min_size:
            found.update(((width, height), (height, width)))
    return sorted(found)


def round_to_steps(x: float, step: int) -> int:
    """``BucketManager.round_to_steps``: rounded half up, then cut down to the step."""
    x = int(x + 0.5)
    return x - x % step


def select_listed(resos: list[tuple[int, int]], ratios: np.ndarray, listed: frozenset,
                  width: int, height: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``select_bucket`` with predefined resolutions: (bucket, resized), (width, height) each.

    An image exactly a listed size is its own bucket; otherwise the listed size whose
    ``w / h`` is nearest the image's (``np.abs(ratios - aspect).argmin()``: the first of
    ``resos``' order on a tie). The image is then resized by one factor so that the side that
    binds matches the bucket (``int(side * scale + 0.5)`` each side)."""
    aspect = width / height
    reso = (width, height)
    if reso not in listed:
        reso = resos[int(np.abs(ratios - aspect).argmin())]
    return reso, resize_to(reso, width, height)


def resize_to(reso: tuple[int, int], width: int, height: int) -> tuple[int, int]:
    """The size ``select_bucket`` resizes a ``width`` x ``height`` image to for bucket
    ``reso``: the height binds when the image is wider than the bucket, else the width."""
    aspect = width / height
    if aspect > reso[0] / reso[1]:
        scale = reso[1] / height
    else:
        scale = reso[0] / width
    return int(width * scale + 0.5), int(height * scale + 0.5)


def select_no_upscale(max_area: int, step: int, width: int, height: int
                      ) -> tuple[tuple[int, int], tuple[int, int]]:
    """``select_bucket`` under ``bucket_no_upscale``: (bucket, resized), (width, height) each.

    An image of at most ``max_area`` pixels keeps its size; a larger one is resized to the
    area at its own aspect ratio, one side rounded to the step (the width or the height,
    whichever leaves the ratio nearer the image's) and the other following the ratio. The
    bucket is the resized size with each side cut down to the step. A bucket side of 0 (an
    image side under the step) or an extreme ratio that rounds a side to 0 raises
    ZeroDivisionError or gives a 0 side, as in sd-scripts; the caller refuses it."""
    aspect = width / height
    if width * height > max_area:
        resized_width = math.sqrt(max_area * aspect)
        resized_height = max_area / resized_width
        b_width_rounded = round_to_steps(resized_width, step)
        b_height_in_wr = round_to_steps(b_width_rounded / aspect, step)
        ar_width_rounded = b_width_rounded / b_height_in_wr
        b_height_rounded = round_to_steps(resized_height, step)
        b_width_in_hr = round_to_steps(b_height_rounded * aspect, step)
        ar_height_rounded = b_width_in_hr / b_height_rounded
        if abs(ar_width_rounded - aspect) < abs(ar_height_rounded - aspect):
            resized = (b_width_rounded, int(b_width_rounded / aspect + 0.5))
        else:
            resized = (int(b_height_rounded * aspect + 0.5), b_height_rounded)
    else:
        resized = (width, height)
    return (resized[0] - resized[0] % step, resized[1] - resized[1] % step), resized


def trim_offsets(resized: tuple[int, int], reso: tuple[int, int]) -> tuple[int, int]:
    """``trim_and_resize_if_required``'s centre crop (not ``random_crop``): (left, top), each
    half the excess rounded down."""
    return (max(0, resized[0] - reso[0]) // 2, max(0, resized[1] - reso[1]) // 2)


def crop_ltrb(bucket: tuple[int, int], image: tuple[int, int]
              ) -> tuple[float, float, float, float]:
    """``BucketManager.get_crop_ltrb(bucket, image)``: where the image, fitted inside the
    bucket (the side that binds matches, the other centred), lies in it: (left, top, right,
    bottom), floats as sd-scripts returns them."""
    bucket_ar = bucket[0] / bucket[1]
    image_ar = image[0] / image[1]
    if bucket_ar > image_ar:
        resized_width = bucket[1] * image_ar
        resized_height = bucket[1]
    else:
        resized_width = bucket[0]
        resized_height = bucket[0] / image_ar
    left = (bucket[0] - resized_width) // 2
    top = (bucket[1] - resized_height) // 2
    return left, top, left + resized_width, top + resized_height
