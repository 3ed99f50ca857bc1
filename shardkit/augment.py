"""Training augmentation at decode time: torchvision v2's ``RandomResizedCrop`` and
``RandomHorizontalFlip``, drawn and resized exactly as torchvision does it, into the batch buffer.

``Recipe.draw`` makes the same torch global-RNG calls in the same order as
``v2.Compose([v2.RandomResizedCrop(size), v2.RandomHorizontalFlip(p)])`` (or ``CenterCrop`` /
``RandomCrop`` in place of the first), so under one ``torch.manual_seed`` both draw the same box and
flip for every sample. ``decode_into`` then decodes the record, resizes the box with the kernel
torchvision v2 uses on uint8 tensors (anti-aliased bilinear; uint8 where the CPU has the vectorised
kernel, float32 and rounding elsewhere) straight into ``out`` and flips it.

A JPEG whose box is at least twice the output size on both sides is decoded DCT-scaled (1/2, 1/4
or 1/8: the factors libjpeg-turbo decodes faster than full size), the box mapped onto the smaller
image, unless the recipe says ``dct_scale=False``. The pixels then differ slightly from
torchvision's; with stores packed at 256 (the default) a 224 crop never qualifies.
"""

from __future__ import annotations

import math
import platform
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from . import codec

DCT_FACTORS = (8, 4, 2)  # libjpeg-turbo's fast scaled decodes (3/8, 5/8, ... are slower than 1)


class Plan(NamedTuple):
    """One sample's crop box in the stored image (may reach outside it: zero padding), its flip,
    and the DCT scale-down a JPEG may be decoded at (1: full size)."""

    top: int
    left: int
    height: int
    width: int
    flip: bool
    dct: int = 1


class _TorchIntegers:
    """The ``integers(low, high)`` that ``codec.random_origin`` needs, from torch's global RNG."""

    @staticmethod
    def integers(low: int, high: int) -> int:
        return int(torch.randint(low, high, ()).item())


_TORCH_INTEGERS = _TorchIntegers()


def _pair(value: Any, name: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (min, max) of numbers, got {value!r}") from None
    if not 0 < low <= high or not math.isfinite(high):
        raise ValueError(f"{name} must be (min, max) with 0 < min <= max, got {value!r}")
    return low, high


class Recipe:
    """How a dataset draws each sample's crop box and flip (torch's global RNG, in the calling
    thread: DataLoader workers each have their own seed, ``torch.manual_seed`` reproduces them)."""

    def __init__(self, size: int, mode: str, scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0), flip: float = 0.0,
                 dct_scale: bool = True) -> None:
        self.size = size
        self.mode = mode
        self.dct_scale = dct_scale
        self.scale = _pair(scale, "scale")
        self.ratio = _pair(ratio, "ratio")
        self.flip = float(flip)
        self._flip32 = float(np.float32(self.flip))  # torch compares ``rand >= p`` in float32
        # torchvision draws the aspect ratio between these float32 logs.
        self.log_ratio = tuple(torch.log(torch.tensor(self.ratio)).tolist())

    def draw(self, height: int, width: int) -> Plan:
        if self.mode == "random_resized":
            box = self._resized_crop_box(height, width)
        else:
            size = self.size
            origin = (codec.center_origin(height, width, size) if self.mode == "center"
                      else codec.random_origin(height, width, size, _TORCH_INTEGERS))
            box = (*origin, size, size)
        # RandomHorizontalFlip: ``if torch.rand(1) >= p: return inputs`` (p == 0 draws nothing
        # here, so a dataset without flip draws exactly what it drew before flip existed).
        flip = self.flip > 0 and not torch.rand(1).item() >= self._flip32
        dct = dct_factor(box[2], box[3], self.size) if self.dct_scale else 1
        return Plan(*box, flip, dct)

    def _resized_crop_box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """``v2.RandomResizedCrop.make_params``, call for call."""
        area = height * width
        scale, log_ratio = self.scale, self.log_ratio
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
            aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1])).item()
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                i = int(torch.randint(0, height - h + 1, size=(1,)).item())
                j = int(torch.randint(0, width - w + 1, size=(1,)).item())
                return i, j, h, w
        in_ratio = float(width) / float(height)  # fallback: central crop
        if in_ratio < min(self.ratio):
            w = width
            h = int(round(w / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h = height
            w = int(round(h * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w


def recipe(crop: int | None, mode: str, scale: Sequence[float], ratio: Sequence[float],
           flip: float, dct_scale: bool = True) -> Recipe | None:
    """A dataset's ``Recipe``, or None for a plain centre crop (the fast path draws nothing)."""
    if mode not in codec.CROP_MODES:
        raise ValueError(f"crop_mode must be one of {codec.CROP_MODES}, got {mode!r}")
    if isinstance(flip, bool) or not isinstance(flip, (int, float)) or not 0 <= flip <= 1:
        raise ValueError(f"flip must be a probability between 0 and 1, got {flip!r}")
    made = Recipe(crop or 0, mode, scale, ratio, flip, dct_scale)  # validates scale and ratio
    if crop is None:
        if mode == "random_resized" or flip:
            what = "crop_mode='random_resized'" if mode == "random_resized" else "flip"
            raise ValueError(f"{what} needs crop (the output size)")
        return None
    return None if mode == "center" and not flip else made


def dct_factor(box_height: int, box_width: int, size: int) -> int:
    """Largest DCT scale-down (8, 4, 2 or 1) that keeps a box at least ``size`` on both sides."""
    for k in DCT_FACTORS:
        if box_height >= k * size and box_width >= k * size:
            return k
    return 1


_native_uint8: bool | None = None


def _uint8_kernel() -> bool:
    """torchvision v2's rule (``_do_native_uint8_resize_on_cpu``): bilinear uint8 stays uint8
    only where torch has the vectorised kernel; elsewhere it goes through float32."""
    global _native_uint8
    if _native_uint8 is None:
        _native_uint8 = (torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
                         or platform.machine() in ("aarch64", "arm64"))
    return _native_uint8


def resize_into(out: np.ndarray, src: np.ndarray) -> None:
    """Resize HxWx3 uint8 ``src`` into ``out`` (anti-aliased bilinear, as torchvision v2)."""
    if not src.flags.c_contiguous or not src.flags.writeable:
        # A crop (or a raw record's read-only memory): copy it here, in this thread, rather than
        # let torch copy it with its intra-op threads, which costs far more than the copy.
        dense = codec.scratch(src.nbytes, slot=1)[:src.nbytes].reshape(src.shape)
        np.copyto(dense, src)
        src = dense
    size = list(out.shape[:2])
    source = torch.from_numpy(src).permute(2, 0, 1).unsqueeze(0)
    target = torch.from_numpy(out).permute(2, 0, 1).unsqueeze(0)
    if _uint8_kernel():
        torch.ops.aten._upsample_bilinear2d_aa.out(source, size, False, None, None, out=target)
        return
    resized = torch.nn.functional.interpolate(source.float(), size=size, mode="bilinear",
                                              align_corners=False, antialias=True)
    target.copy_(resized.round_())


def decode_into(out: np.ndarray, data, encoding: str, height: int, width: int,
                plan: Plan | None, fast: bool = False) -> int:
    """Decode one record, crop ``plan``'s box, resize it to ``out``'s size and flip it as planned.

    ``plan`` None is a centre crop. Returns the DCT scale-down used (1: full size).
    """
    if plan is None:
        codec.decode_crop_into(out, data, encoding, height, width, None, fast)
        return 1
    top, left, h, w, flip, dct = plan
    if (h, w) == out.shape[:2]:  # nothing to resize (torchvision returns the crop as it is)
        k = 1
        codec.decode_crop_into(out, data, encoding, height, width, (top, left), fast)
    else:
        k = dct if encoding == "jpeg" else 1
        sh, sw = -(-height // k), -(-width // k)
        buffer = codec.scratch(sh * sw * 3) if encoding == "jpeg" else None
        img = codec.decode(data, encoding, height, width, fast, buffer, scale=k)
        if k > 1:  # the box on the scaled image, edges rounded to the nearest scaled pixel
            y0, x0 = int(top / k + 0.5), int(left / k + 0.5)
            y1, x1 = min(int((top + h) / k + 0.5), sh), min(int((left + w) / k + 0.5), sw)
            top, left, h, w = y0, x0, y1 - y0, x1 - x0
        resize_into(out, img[top:top + h, left:left + w])
    if flip:
        mirror(out)
    return k


GRAIN = 32768  # elements: torch runs an op on one thread below this (at::internal::GRAIN_SIZE)


def mirror(out: np.ndarray) -> None:
    """Flip HxWx3 ``out`` left-right in place. Where torch runs several threads (not in
    DataLoader workers), in slices too small for it to use them: opening a parallel region for
    each image costs more than the flip, up to milliseconds on a busy machine."""
    pixels = torch.from_numpy(out)
    rows = len(out) if torch.get_num_threads() == 1 else max(1, GRAIN // out[0].size)
    for start in range(0, len(out), rows):
        part = pixels[start:start + rows]
        part.copy_(part.flip(1))


def normalize(images: torch.Tensor, mean: Sequence[float], std: Sequence[float],
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 ``[B, 3, H, W]`` (on the GPU, typically) to normalised floats, ``(x / 255 - mean) /
    std`` per channel: exactly ``images.float().div_(255)`` then ``v2.Normalize(mean, std)``."""
    if images.dtype != torch.uint8:
        raise ValueError(f"images must be uint8 (as shardkit delivers them), got {images.dtype}")
    mean_t = torch.as_tensor(mean, dtype=dtype, device=images.device).view(-1, 1, 1)
    std_t = torch.as_tensor(std, dtype=dtype, device=images.device).view(-1, 1, 1)
    return images.to(dtype).div_(255).sub_(mean_t).div_(std_t)
