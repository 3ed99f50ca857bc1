"""torchvision v2's colour kernels on a uint8 batch ``[B, 3, H, W]`` (any memory layout), each
sample with its own factor: the same torch operations, in the same order, as
``torchvision.transforms.v2.functional``'s ``adjust_brightness``, ``adjust_contrast``,
``adjust_saturation``, ``adjust_hue``, ``rgb_to_grayscale``, ``solarize``, ``gaussian_blur`` and
``to_dtype(scale=True)`` + ``normalize`` on one image, so every pixel is theirs.

Elementwise steps run on the whole batch at once (an operation on one element gives the same
number whatever else the tensor holds). Three steps run one sample at a time, each still a torch
operation on the whole image: the blend of contrast and saturation (``x * f + other * (1 - f)``,
which torch computes as one fused multiply-add where the CPU has one: a per-sample ``f`` as a
tensor would be two roundings, and other pixels), contrast's mean (a reduction: its summation
order is the kernel's) and the blur's convolution (its accumulation order is the kernel's).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F


def _gray(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma as float32 ``[B, 1, H, W]``, unrounded (v2's ``_rgb_to_grayscale_image``)."""
    r, g, b = x.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(dim=-3)


def _blend_each(x: torch.Tensor, other: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    """v2's ``_blend(image, other, f)`` for each sample, as uint8."""
    out = torch.empty(x.shape, dtype=torch.float32)
    for i, f in enumerate(factors):
        f = float(f)
        torch.add(x[i].mul(f), other[i], alpha=1.0 - f, out=out[i])
    return out.clamp_(0, 255).to(torch.uint8)


def brightness(x: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    f = torch.tensor(factors, dtype=torch.float32).view(-1, 1, 1, 1)
    return x.mul(f).clamp_(0, 255).to(torch.uint8)


def contrast(x: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    gray = _gray(x).floor_()
    means = torch.stack([torch.mean(g, dim=(-3, -2, -1), keepdim=True) for g in gray])
    return _blend_each(x, means, factors)


def saturation(x: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    return _blend_each(x, _gray(x).floor_(), factors)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """``rgb_to_grayscale(x, num_output_channels=3)``."""
    return _gray(x).to(torch.uint8).expand(x.shape)


def solarize(x: torch.Tensor, threshold: float) -> torch.Tensor:
    return torch.where(x >= threshold, x.bitwise_not(), x)


def _rgb_to_hsv(image: torch.Tensor) -> torch.Tensor:
    r, g, _ = image.unbind(dim=-3)
    minc, maxc = torch.aminmax(image, dim=-3)
    eqc = maxc == minc
    channels_range = maxc - minc
    ones = torch.ones_like(maxc)
    s = channels_range / torch.where(eqc, ones, maxc)
    divisor = torch.where(eqc, ones, channels_range).unsqueeze_(dim=-3)
    rc, gc, bc = ((maxc.unsqueeze(dim=-3) - image) / divisor).unbind(dim=-3)
    maxc_neq_r = maxc != r
    maxc_eq_g = maxc == g
    hg = rc.add(2.0).sub_(bc).mul_(maxc_eq_g & maxc_neq_r)
    hr = bc.sub_(gc).mul_(~maxc_neq_r)
    hb = gc.add_(4.0).sub_(rc).mul_(maxc_neq_r.logical_and_(maxc_eq_g.logical_not_()))
    h = hr.add_(hg).add_(hb)
    h = h.mul_(1.0 / 6.0).add_(1.0).fmod_(1.0)
    return torch.stack((h, s, maxc), dim=-3)


_SELECT = torch.tensor([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]])


def _hsv_to_rgb(img: torch.Tensor) -> torch.Tensor:
    h, s, v = img.unbind(dim=-3)
    h6 = h.mul(6)
    i = torch.floor(h6)
    f = h6.sub_(i)
    i = i.to(dtype=torch.int32)
    sxf = s * f
    one_minus_s = 1.0 - s
    q = (1.0 - sxf).mul_(v).clamp_(0.0, 1.0)
    t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0)
    p = one_minus_s.mul_(v).clamp_(0.0, 1.0)
    i.remainder_(6)
    vpqt = torch.stack((v, p, q, t), dim=-3)
    select = _SELECT[:, i].moveaxis(0, -3)
    return vpqt.gather(-3, select)


def hue(x: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    """``adjust_hue`` (HSV round trip in float32) with each sample's factor."""
    image = _rgb_to_hsv(x.to(torch.float32).mul_(1.0 / 255))
    h, s, v = image.unbind(dim=-3)
    h.add_(torch.tensor(factors, dtype=torch.float32).view(-1, 1, 1)).remainder_(1.0)
    rgb = _hsv_to_rgb(torch.stack((h, s, v), dim=-3))
    return rgb.mul(255 + 1.0 - 1e-3).to(torch.uint8)


def gaussian_kernel(size: int, sigma: float) -> torch.Tensor:
    """v2's 2D kernel: a softmax over ``-(x / sigma)**2``, ``x`` spaced ``1 / sqrt(2)``."""
    lim = (size - 1) / (2.0 * math.sqrt(2.0))
    x = torch.linspace(-lim, lim, steps=size, dtype=torch.float32)
    k1 = torch.softmax(x.div(sigma).pow(2).neg(), dim=0)
    return k1.unsqueeze(-1) * k1


def blur(x: torch.Tensor, size: int, sigmas: Sequence[float]) -> torch.Tensor:
    """``gaussian_blur(x[i], [size, size], [sigma, sigma])`` for each sample (reflect padding)."""
    out = torch.empty(x.shape, dtype=torch.uint8)
    pad = [size // 2] * 4
    for i, sigma in enumerate(sigmas):
        kernel = gaussian_kernel(size, float(sigma)).expand(3, 1, size, size)
        image = F.pad(x[i].unsqueeze(0).to(torch.float32), pad, mode="reflect")
        out[i] = F.conv2d(image, kernel, groups=3)[0].round_().to(torch.uint8)
    return out


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``to_dtype(x, float32, scale=True)`` then ``normalize(mean, std)``: float32 NCHW."""
    m = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return x.to(torch.float32).mul_(1.0 / 255).sub_(m).div_(s)
