"""torchvision v2's colour kernels on a uint8 batch ``[B, 3, H, W]`` (any memory layout), in
place on the samples ``idx``, each with its own factor: ``adjust_brightness``,
``adjust_contrast``, ``adjust_saturation``, ``adjust_hue``, ``rgb_to_grayscale``, ``solarize``,
``gaussian_blur`` and ``to_dtype(scale=True)`` + ``normalize``, every pixel theirs.

Each step works through the batch in pieces of about ``CHUNK`` pixels (a few samples, or rows
of one) whose float planes stay in the CPU's cache, instead of passes over the whole batch in
float. An operation on one element gives the same number whatever else the tensor holds, so the
pieces change no pixel. What must stay whole stays whole: the blend of contrast and saturation
runs one sample at a time with its factor as a number (``x * f + other * (1 - f)``, which torch
computes as one fused multiply-add where the CPU has one: a per-sample ``f`` as a tensor would be
two roundings), contrast's mean is a reduction over the sample (its summation order is the
kernel's), and the blur's every output row sums its whole ``size`` x ``size`` window (below).
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ... import codec

CHUNK = 1 << 16
"""Pixels one piece holds: a 224 x 224 sample, or seven 96 x 96 ones."""


def _pieces(idx: Sequence[int], most: int) -> Iterator[tuple[int, list[int]]]:
    """``(k, ids)``: ``ids = idx[k:k + len(ids)]``, at most ``most`` samples (at least one)."""
    most = max(1, most)
    for k in range(0, len(idx), most):
        yield k, list(idx[k:k + most])


def _runs(idx: Sequence[int], most: int) -> Iterator[tuple[int, list[int]]]:
    """As ``_pieces``, each piece consecutive samples: for the steps too cheap to pay for a
    gather."""
    most, k = max(1, most), 0
    while k < len(idx):
        n = 1
        while n < most and k + n < len(idx) and idx[k + n] == idx[k] + n:
            n += 1
        yield k, list(idx[k:k + n])
        k += n


def _take(x: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """Samples ``ids`` of ``x``: a view where they are consecutive, else gathered (a small
    uint8 copy that lets one piece hold samples the step chose here and there; by
    ``index_select``, a copy per sample: indexing with a tensor of ids computes every element's
    address, 20x slower)."""
    a = ids[0]
    if ids == list(range(a, a + len(ids))):
        return x[a:a + len(ids)]
    return torch.index_select(x, 0, torch.tensor(ids))


def _bytes(y: torch.Tensor) -> torch.Tensor:
    """Float ``y`` (every value in [0, 256)) ready to be copied into uint8: through int32, two
    vectorised casts that truncate as the one cast to uint8 does, 3-4x faster than it."""
    return y.to(torch.int32) if y.is_floating_point() else y


def _put(x: torch.Tensor, ids: list[int], y: torch.Tensor) -> None:
    """``x[ids] = y`` (cast to uint8 as ``Tensor.to`` casts; float values in [0, 256))."""
    y = _bytes(y)
    a = ids[0]
    if ids == list(range(a, a + len(ids))):
        x[a:a + len(ids)].copy_(y)
    else:  # sample by sample: index_copy_ computes every element's address, 10-20x slower
        for j, i in enumerate(ids):
            x[i].copy_(y[j])


def _factors(factors: Sequence[float], k: int, n: int) -> torch.Tensor:
    return torch.tensor([float(f) for f in factors[k:k + n]],
                        dtype=torch.float32).view(-1, 1, 1, 1)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma as float32 ``[..., 1, H, W]``, unrounded (v2's
    ``_rgb_to_grayscale_image``)."""
    r, g, b = x.unbind(dim=-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(dim=-3)


def _blend(x: torch.Tensor, other: torch.Tensor, f: float) -> None:
    """v2's ``_blend(x, other, f)`` for one sample, written back into ``x``."""
    f = float(f)
    x.copy_(_bytes(x.mul(f).add_(other, alpha=1.0 - f).clamp_(0, 255)))


def brightness(x: torch.Tensor, idx: Sequence[int], factors: Sequence[float]) -> None:
    for k, ids in _runs(idx, CHUNK // (x.shape[-2] * x.shape[-1])):
        _put(x, ids, _take(x, ids).mul(_factors(factors, k, len(ids))).clamp_(0, 255))


def _grays(x: torch.Tensor, idx: Sequence[int]) -> Iterator[tuple[int, torch.Tensor]]:
    """``(k, gray)``: sample ``idx[k]``'s floored luma ``[1, H, W]``, computed a piece of
    samples at a time (elementwise: each sample's values are its own)."""
    for k, ids in _pieces(idx, CHUNK // (x.shape[-2] * x.shape[-1])):
        gray = _gray(_take(x, ids)).floor_()
        for j in range(len(ids)):
            yield k + j, gray[j]


def contrast(x: torch.Tensor, idx: Sequence[int], factors: Sequence[float]) -> None:
    for k, gray in _grays(x, idx):
        _blend(x[idx[k]], torch.mean(gray, dim=(-3, -2, -1), keepdim=True), factors[k])


def saturation(x: torch.Tensor, idx: Sequence[int], factors: Sequence[float]) -> None:
    for k, gray in _grays(x, idx):
        _blend(x[idx[k]], gray, factors[k])


def grayscale(x: torch.Tensor, idx: Sequence[int]) -> None:
    """``rgb_to_grayscale(x, num_output_channels=3)``."""
    for _, ids in _runs(idx, CHUNK // (x.shape[-2] * x.shape[-1])):
        xs = _take(x, ids)
        _put(x, ids, _bytes(_gray(xs)).expand(xs.shape))


def solarize(x: torch.Tensor, idx: Sequence[int], threshold: float) -> None:
    for _, ids in _runs(idx, CHUNK // (x.shape[-2] * x.shape[-1])):
        xs = _take(x, ids)
        _put(x, ids, torch.where(xs >= threshold, xs.bitwise_not(), xs))


# adjust_hue. v2's HSV round trip, each arithmetic operation as v2 does it in float32, with
# exact rewrites that spare its slow passes (the reduction over channels, the int64 gather,
# fmod / remainder):
# - max / min of three channels by torch.maximum / torch.minimum (the same values);
# - v2's masks (bool tensors multiplied in) by 0 / 1 float masks: a value times 1 is itself,
#   times 0 is 0, and a sum with only zeros beside one value is that value; the masks are the
#   sign of max - channel, a difference that is +0 (x - x) or positive;
# - v2's divisions by ``where(max == min, 1, d)`` as divisions by ``max(d, _TINY)``: where they
#   differ the numerator is 0, and 0 divided by either is 0;
# - ``fmod(y, 1)`` (y in [5/6, 11/6]) and ``remainder(z, 1)`` (z in [-1/2, 3/2)) as
#   ``y - floor(y)``: exact by Sterbenz's lemma, or y itself, or z + 1 where remainder is too;
# - the final gather (v, p, q or t per channel, by sector) by min / max with 0 / 1 masks, which
#   pick exactly one of them because 0 <= p <= q, t <= v <= 1 (below).
# tests/read/test_photometric_tv.py compares every colour of uint8 RGB with v2's.
# Why 0 <= p <= q, t <= v <= 1 in float32 (each clamped to [0, 1]; s, f in [0, 1]): sxf =
# fl(s * f) <= s, so fl(1 - sxf) >= fl(1 - s) = oms and fl(sxf + oms) >= oms: p <= q and p <= t
# (rounding is monotonic); fl(1 - sxf) <= 1: q <= v. And fl(sxf + oms) <= 1: for s >= 1/2, 1 - s
# is exact and sxf + oms <= 1; below, fl(1 - s) <= 1 - s + 2**-25, so sxf + oms <= 1 + 2**-25,
# which rounds to 1 (the next float is 1 + 2**-23): t <= v.
_TINY = 1e-30
_ONE = torch.ones(())  # 1 - x as one operation: torch.sub(_ONE, x, out=...)
_PLANES = 18


def _hue_piece(x: torch.Tensor, factor: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """``adjust_hue`` of uint8 ``x`` ``[b, 3, h, w]`` as float ``rgb * (256 - 1e-3)`` in
    ``work`` (``_PLANES`` planes of ``b * h * w`` floats); ``factor``: ``[b, 1, 1]``."""
    b_, _, h_, w_ = x.shape
    m = b_ * h_ * w_
    X = work[:3 * m].view(b_, 3, h_, w_)
    D = work[3 * m:6 * m].view(b_, 3, h_, w_)
    v, cr, s, nr, nb, h, i, s5, s6, m1, m2, m3 = (work[(6 + k) * m:(7 + k) * m].view(b_, h_, w_)
                                                  for k in range(12))
    X.copy_(x)
    X.mul_(1.0 / 255)
    r, g, b = X.unbind(dim=1)
    torch.maximum(torch.maximum(r, g, out=v), b, out=v)
    torch.minimum(torch.minimum(r, g, out=cr), b, out=cr)
    torch.sub(v, cr, out=cr)
    torch.div(cr, torch.clamp(v, min=_TINY, out=s), out=s)
    torch.sub(v.unsqueeze(1), X, out=D)
    torch.div(D, cr.clamp_(min=_TINY).unsqueeze(1), out=X)
    rc, gc, bc = X.unbind(dim=1)
    d0, d1, _ = D.unbind(dim=1)
    torch.sign(d0, out=nr)  # max != r
    torch.sign(d1, out=nb).mul_(nr)  # max != r and max != g
    torch.sub(_ONE, nr, out=i)
    nr.sub_(nb)  # max != r and max == g
    torch.sub(bc, gc, out=h).mul_(i)
    h.addcmul_(torch.add(rc, 2.0, out=d0).sub_(bc), nr)  # h is 0 where nr is 1
    h.addcmul_(gc.add_(4.0).sub_(rc), nb)
    h.mul_(1.0 / 6.0).add_(1.0)
    h.sub_(torch.floor(h, out=i))
    h.add_(factor)
    h.sub_(torch.floor(h, out=i))
    # HSV to RGB
    h.mul_(6)
    torch.floor(h, out=i)
    f = h.sub_(i)
    sxf, oms = nr, nb
    torch.mul(s, f, out=sxf)
    torch.sub(_ONE, s, out=oms)
    q = torch.sub(_ONE, sxf, out=f).mul_(v).clamp_(0.0, 1.0)
    t = sxf.add_(oms).mul_(v).clamp_(0.0, 1.0)
    p = oms.mul_(v).clamp_(0.0, 1.0)
    # the sector i in 0..6 (6 is 0) as steps s_k = [i >= k]
    s1, s2, s3, s4, s5, s6 = (torch.sub(i, k - 1, out=o).clamp_(0.0, 1.0) for k, o in
                              zip(range(1, 7), (cr, s, *D.unbind(dim=1), s5, s6)))
    odd = torch.sub(s1, s2, out=m1).add_(s3).sub_(s4).add_(s5).sub_(s6)
    mid = q.mul_(odd).addcmul_(t, torch.sub(_ONE, odd, out=odd))  # q in odd sectors, t in even
    # Channel c is v in the sectors [v_from, v_to) (mod 6), p in [p_from, p_to), else mid:
    # min(max(mid, min(v, is_v)), max(p, 1 - is_p)), exact since 0 <= p <= mid <= v <= 1.
    for c, (va, vb, v_wrap, pa, pb, p_wrap) in enumerate(((s5, s1, 1, s4, s2, 1),
                                                          (s1, s3, 0, s6, s4, 1),
                                                          (s3, s5, 0, s2, s6, 0))):
        is_v, not_p = torch.sub(va, vb, out=m2), torch.sub(pa, pb, out=m3)
        if v_wrap:
            is_v.add_(1.0)
        if p_wrap:
            not_p.add_(1.0)
        torch.maximum(mid, torch.minimum(v, is_v, out=is_v), out=X[:, c])
        torch.minimum(X[:, c], torch.maximum(p, not_p, out=not_p), out=X[:, c])
    return X.mul_(255 + 1.0 - 1e-3)


def hue(x: torch.Tensor, idx: Sequence[int], factors: Sequence[float]) -> None:
    """``adjust_hue`` (HSV round trip in float32) with each sample's factor."""
    height, width = x.shape[-2:]
    if height * width > CHUNK:  # rows of one sample
        rows = max(1, CHUNK // width)
        pieces = [(k, [i], r, min(height, r + rows))
                  for k, i in enumerate(idx) for r in range(0, height, rows)]
    else:
        pieces = [(k, ids, 0, height) for k, ids in _pieces(idx, CHUNK // (height * width))]
    most = max(len(ids) * (r1 - r0) for _, ids, r0, r1 in pieces) * width
    # this thread's scratch memory: a fresh buffer for each call costs its page faults again
    work = torch.from_numpy(codec.scratch(_PLANES * most * 4, slot="hue")).view(torch.float32)
    for k, ids, r0, r1 in pieces:
        if r1 - r0 < height:
            xs = x[ids[0]:ids[0] + 1, :, r0:r1]
            xs.copy_(_bytes(_hue_piece(xs, _factors(factors, k, 1).view(-1, 1, 1), work)))
        else:
            _put(x, ids, _hue_piece(_take(x, ids), _factors(factors, k, len(ids)).view(-1, 1, 1),
                                    work))


def gaussian_kernel(size: int, sigma: float) -> torch.Tensor:
    """v2's 2D kernel: a softmax over ``-(x / sigma)**2``, ``x`` spaced ``1 / sqrt(2)``."""
    lim = (size - 1) / (2.0 * math.sqrt(2.0))
    x = torch.linspace(-lim, lim, steps=size, dtype=torch.float32)
    k1 = torch.softmax(x.div(sigma).pow(2).neg(), dim=0)
    return k1.unsqueeze(-1) * k1


BLUR_GROUP = 16
"""Samples one convolution blurs: 48 channels, whole 16-wide vector blocks."""

BLUR_BAND = 1 << 19
"""Floats one convolution reads at most: a band of rows of ``BLUR_GROUP`` samples (2 MiB)."""


def _channels_last(image: torch.Tensor) -> torch.Tensor:
    """uint8 ``[1, C, H, W]`` copied channels-last, by numpy's strided copy: about 2x faster than
    ``contiguous(memory_format=torch.channels_last)`` for dozens of channels."""
    _, c, height, width = image.shape
    out = torch.empty((1, height, width, c), dtype=torch.uint8)
    np.copyto(out.numpy()[0], image.numpy()[0].transpose(1, 2, 0))
    return out.permute(0, 3, 1, 2)


def blur(x: torch.Tensor, idx: Sequence[int], size: int, sigmas: Sequence[float]) -> None:
    """``gaussian_blur(x[i], [size, size], [sigma, sigma])`` for each sample (reflect padding).

    v2 convolves one image's three channels as three groups; here ``BLUR_GROUP`` samples'
    channels go into one grouped convolution, each channel with its sample's kernel. A grouped
    (depthwise) convolution computes each output channel from its own input channel alone, in the
    same order of kernel taps, so the pixels are v2's; three channels fill 3 of the CPU's 8 or 16
    vector lanes, 48 fill them all (about four times the speed). The padding is done on the uint8
    pixels (the same values v2 pads in float), and the convolution runs on bands of rows (each
    output row from the same ``size`` input rows and taps as over the whole image): float
    buffers of a few MiB instead of three copies of the whole group, which cost more in page
    faults and cache misses than the convolution saves. The bands are channels-last (each
    pixel's channels side by side), the layout the depthwise kernel computes in: 1.5x faster
    than planar bands, which it converts there and back; each output is the same sum."""
    half = size // 2
    height, width = x.shape[-2:]
    weights = torch.stack([gaussian_kernel(size, float(s)) for s in sigmas])
    for k, ids in _pieces(idx, BLUR_GROUP):
        n = len(ids)
        image = _take(x, ids).reshape(1, 3 * n, height, width)
        image = _channels_last(F.pad(image, [half] * 4, mode="reflect"))
        weight = weights[k:k + n].repeat_interleave(3, dim=0).unsqueeze(1)
        out = torch.empty((n, 3, height, width), dtype=torch.uint8)
        rows = max(1, BLUR_BAND // (3 * n * (width + 2 * half)) - 2 * half)
        for r in range(0, height, rows):
            band = image[:, :, r:r + rows + 2 * half].to(torch.float32)
            done = F.conv2d(band, weight, groups=3 * n).round_()
            out[:, :, r:r + rows].copy_(_bytes(done.view(n, 3, -1, width)))
        _put(x, ids, out)


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float],
              out: torch.Tensor | None = None) -> torch.Tensor:
    """``to_dtype(x, float32, scale=True)`` then ``normalize(mean, std)``: float32 NCHW,
    contiguous (in ``out`` where given: contiguous float32 of ``x``'s shape)."""
    m = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1)
    x4 = x.reshape(-1, *x.shape[-3:])
    out = torch.empty(x4.shape, dtype=torch.float32) if out is None else out.view(x4.shape)
    for a in range(0, len(x4), max(1, CHUNK // (x.shape[-2] * x.shape[-1]))):
        b = a + max(1, CHUNK // (x.shape[-2] * x.shape[-1]))
        out[a:b].copy_(x4[a:b]).mul_(1.0 / 255).sub_(m).div_(s)
    return out.view(x.shape)
