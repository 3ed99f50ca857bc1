"""A record decoded once for a sample's boxes, each box cut, resized as torchvision v2 resizes
uint8 tensors and flipped, straight into its output (``decode_views``; one view:
``decode_into``). The boxes and flips are drawn by :mod:`shardkit.read.augment`.

``decode_views`` works in three steps: every view's box is known first, the record is decoded
once for all of them (``decode_boxes``: the one function that maps a record and its boxes to
pixels, where a decode of only the rows the boxes cover plugs in), then each view is cut,
resized and flipped from it (``cut_into``).
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np
import torch

from .. import codec
from . import partial

if TYPE_CHECKING:
    from .augment import Plan


#: The resize kernel: None decides from the CPU at first use (:func:`_uint8_kernel`); True or
#: False forces torch's uint8 kernel or the float32 one (the tests compare both).
native_uint8: bool | None = None


def _uint8_kernel() -> bool:
    """torchvision v2's rule (``_do_native_uint8_resize_on_cpu``): bilinear uint8 stays uint8
    only where torch has the vectorised kernel; elsewhere it goes through float32."""
    global native_uint8
    if native_uint8 is None:
        native_uint8 = (torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
                         or platform.machine() in ("aarch64", "arm64"))
    return native_uint8


def resize_into(out: np.ndarray, src: np.ndarray, interpolation: str = "bilinear") -> None:
    """Resize HxWx3 uint8 ``src`` into ``out`` as torchvision v2 resizes uint8 tensors with
    ``antialias=True``: anti-aliased bilinear (the default) or bicubic, or nearest."""
    if not src.flags.c_contiguous or not src.flags.writeable:
        # A crop (or a raw record's read-only memory): copy it here, in this thread, rather than
        # let torch copy it with its intra-op threads, which costs far more than the copy.
        dense = codec.scratch(src.nbytes, slot="box")[:src.nbytes].reshape(src.shape)
        np.copyto(dense, src)
        src = dense
    size = out.shape[:2]
    # 1x3xHxW views of the HxWx3 memory (channels-last, the layout the kernel is fastest on).
    source = torch.from_numpy(src[None].transpose(0, 3, 1, 2))
    target = torch.from_numpy(out[None].transpose(0, 3, 1, 2))
    if interpolation == "bicubic":  # uint8 on every CPU (v2 keeps it uint8)
        # F.interpolate's own kernel written straight into ``out``: through F.interpolate (a new
        # tensor, then a copy) the same pixels cost 2.5-3x as much CPU.
        torch._C._nn._upsample_bicubic2d_aa(source, size, False, out=target)
        return
    if interpolation != "bilinear":  # nearest: uint8 on every CPU
        target.copy_(torch.nn.functional.interpolate(source, size=size, mode=interpolation))
        return
    if _uint8_kernel():
        # F.interpolate's own call, without its Python (the same kernel, a few µs less per image)
        torch._C._nn._upsample_bilinear2d_aa(source, size, False, out=target)
        return
    resized = torch.nn.functional.interpolate(source.float(), size=size, mode="bilinear",
                                              align_corners=False, antialias=True)
    target.copy_(resized.round_())


class Decoded(NamedTuple):
    """A record decoded for its boxes: ``pixels`` are rows ``row0`` .. of the image decoded at
    1/``scale`` (``height`` x ``width`` at that scale), RGB, or BGR when ``bgr``."""

    pixels: np.ndarray
    scale: int
    height: int
    width: int
    bgr: bool = False
    row0: int = 0


def decode_boxes(data, encoding: str, height: int, width: int, plans: Sequence[Plan],
                 fast: bool = False, bgr: bool = False, rows: np.ndarray | None = None) -> Decoded:
    """Decode one record once for all of a sample's ``plans``: with ``rows`` (a record with row
    markers) and no DCT scaling, only the MCU rows their boxes cover (:mod:`.partial`); else
    whole, DCT-scaled by the smallest scale any plan allows. In this thread's scratch buffer."""
    k = min(p.dct for p in plans) if encoding == "jpeg" else 1
    sh, sw = -(-height // k), -(-width // k)
    buffer = codec.scratch(sh * sw * 3) if encoding == "jpeg" else None
    # a record with row markers: only the rows the boxes cover, unless that is (nearly) all
    top, bottom = partial.box_rows(plans, height) if rows is not None else (0, height)
    if rows is not None and k == 1 and not partial.whole(top, bottom, height, rows, fast):
        img, row0 = partial.decode_rows(data, rows, top, bottom, fast, buffer, bgr,
                                        (height, width))
        return Decoded(img, 1, height, width, bgr, row0)
    img = codec.decode(data, encoding, height, width, fast, buffer, scale=k, bgr=bgr)
    return Decoded(img, k, sh, sw, bgr)


def cut_into(out: np.ndarray, src: Decoded, plan: Plan) -> None:
    """``plan``'s box of the decoded ``src``, resized to ``out``'s size and flipped as planned
    (a BGR ``src``: only for flipped plans, the row reversal turning it into RGB)."""
    top, left, h, w, flip = plan[:5]
    img, k = src.pixels, src.scale
    if (h, w) == out.shape[:2]:  # nothing to resize (torchvision returns the crop as it is)
        if src.bgr:
            raise ValueError("a crop that is not resized needs an RGB decode")
        codec.crop_into(out, img, top - src.row0, left)  # outside the image: zeros
        if flip:
            mirror(out)
        return
    if k > 1:  # the box on the scaled image, edges rounded to the nearest scaled pixel
        y0, x0 = int(top / k + 0.5), int(left / k + 0.5)
        y1, x1 = min(int((top + h) / k + 0.5), src.height), min(int((left + w) / k + 0.5),
                                                                  src.width)
        top, left, h, w = y0, x0, y1 - y0, x1 - x0
    box = img[top - src.row0:top - src.row0 + h, left:left + w]
    if src.bgr:
        if not flip:
            raise ValueError("a BGR decode serves flipped plans only")
        # Resized BGR, then each row's bytes reversed into ``out``: the mirror image in RGB
        # (the kernel treats channels alike).
        resized = codec.scratch(out.nbytes, slot="resized")[:out.nbytes].reshape(out.shape)
        resize_into(resized, box, plan.interpolation)
        _reverse_rows(out, resized)
        return
    resize_into(out, box, plan.interpolation)
    if flip:
        mirror(out)


def decode_views(outs: Sequence[np.ndarray], data, encoding: str, height: int, width: int,
                 plans: Sequence[Plan | None], fast: bool = False,
                 rows: np.ndarray | None = None) -> int:
    """Decode one record once and cut every view from it: ``plans[i]``'s box resized to
    ``outs[i]``'s size and flipped as planned (``[None]``: one plain centre crop).

    Every box is known before the decode (``decode_boxes``, looked up here at each call).
    ``rows``: a JPEG record's row starts (``partial.record_rows``; None: decoded whole).
    Returns the DCT scale-down used (1: full size).
    """
    if plans[0] is None:
        if rows is not None:
            partial.crop_into(outs[0], data, rows, height, width, None, fast)
        else:
            codec.decode_crop_into(outs[0], data, encoding, height, width, None, fast)
        return 1
    # A JPEG whose every view flips is decoded BGR (see ``cut_into``).
    bgr = encoding == "jpeg" and all(
        p.flip and (p.height, p.width) != o.shape[:2] and o.flags.c_contiguous
        for p, o in zip(plans, outs))
    src = decode_boxes(data, encoding, height, width, plans, fast, bgr, rows)
    for out, plan in zip(outs, plans):
        cut_into(out, src, plan)
    return src.scale


def decode_into(out: np.ndarray, data, encoding: str, height: int, width: int,
                plan: Plan | None, fast: bool = False) -> int:
    """Decode one record, crop ``plan``'s box, resize it to ``out``'s size and flip it as planned
    (``decode_views`` of one view). ``plan`` None is a centre crop. Returns the DCT scale-down
    used (1: full size)."""
    return decode_views((out,), data, encoding, height, width, (plan,), fast)


GRAIN = 32768  # elements: torch runs an op on one thread below this (at::internal::GRAIN_SIZE)


def _slices(out: np.ndarray) -> range:
    """Row starts to flip ``out`` in. Where torch runs several threads (not in DataLoader
    workers), slices too small for it to use them: opening a parallel region for each image
    costs more than the flip, up to milliseconds on a busy machine."""
    rows = len(out) if torch.get_num_threads() == 1 else max(1, GRAIN // out[0].size)
    return range(0, len(out), rows)


def mirror(out: np.ndarray) -> None:
    """Flip HxWx3 ``out`` left-right in place."""
    pixels = torch.from_numpy(out)
    rows = _slices(out)
    for start in rows:
        part = pixels[start:start + rows.step]
        part.copy_(part.flip(1))


def _reverse_rows(out: np.ndarray, src: np.ndarray) -> None:
    """Each row of HxWx3 ``src`` into ``out`` with its bytes in reverse order: pixels mirrored,
    channels swapped (BGR to RGB). Read as little-endian words back to front and stored
    big-endian, a row's bytes reverse in one numpy pass (faster than torch's flip)."""
    row = src[0].size
    word = next(k for k in (8, 4, 2, 1) if row % k == 0)
    if word > 1:
        np.copyto(out.reshape(len(out), -1).view(f">u{word}"),
                  src.reshape(len(src), -1).view(f"<u{word}")[:, ::-1])
        return
    source = torch.from_numpy(src.reshape(len(src), -1))
    target = torch.from_numpy(out.reshape(len(out), -1))
    rows = _slices(out)
    for start in rows:
        end = start + rows.step
        target[start:end].copy_(source[start:end].flip(1))
