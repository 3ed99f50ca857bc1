"""Probe run under the torchvision environment (``.venv-tv``) by
tests/read/test_photometric_tv.py.

Prints one JSON object: for each of ``shardkit.recipes.kernels``' steps, how many samples it
compared with torchvision v2's functional kernel on the same uint8 image and how many differ
(``torch.equal``). The batches: 19 samples of odd sizes (more than one blur group), channels-last
as a decoded batch is and NCHW, the step on every sample and on a scattered subset (the others
must stay as they were), factors across v2's whole range; blur kernels 1 to 23, and 13 convolved
one output row at a time (``blur_rows``: bands of rows give the whole image's pixels).
``hue_colours``: every one of the 2**24 uint8 RGB colours, in 8 samples with hue factors from
-0.5 to 0.5.
"""

from __future__ import annotations

import json

import torch
from torchvision.transforms.v2 import functional as TF

from shardkit.read.recipes import kernels as K

SIZES = ((37, 53), (96, 96), (61, 45), (17, 250), (300, 301))
SUBSET = [0, 2, 3, 4, 9, 10, 11, 12, 17, 18]


def tally(out: dict, name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    n, bad = out.get(name, [0, 0])
    out[name] = [n + len(ref), bad + sum(not torch.equal(a, b) for a, b in zip(got, ref))]


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(3)
    out: dict = {}
    for case, (h, w) in enumerate(SIZES):
        b = 19 if h * w < 30000 else 3
        x = torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8, generator=g)
        if case % 2 == 0:  # a decoded batch: N x H x W x 3 seen as N x 3 x H x W
            x = x.contiguous(memory_format=torch.channels_last)
        x[0, :, : h // 2] = x[0, :1, : h // 2]  # grays
        x[1] //= 64  # few levels: many channels tied for max or min
        idx = list(range(b)) if case % 2 else [i for i in SUBSET if i < b]
        unit = torch.rand(b, generator=g).tolist()

        def check(name, apply, ref_one):
            y = x.clone()
            apply(y)
            ref = x.clone()
            for i in idx:
                ref[i] = ref_one(x[i], i)
            tally(out, name, y, ref)

        fac = [2.0 * u for u in unit]
        check("brightness", lambda y: K.brightness(y, idx, [fac[i] for i in idx]),
              lambda im, i: TF.adjust_brightness(im, fac[i]))
        check("contrast", lambda y: K.contrast(y, idx, [fac[i] for i in idx]),
              lambda im, i: TF.adjust_contrast(im, fac[i]))
        check("saturation", lambda y: K.saturation(y, idx, [fac[i] for i in idx]),
              lambda im, i: TF.adjust_saturation(im, fac[i]))
        hue = [u - 0.5 for u in unit]
        hue[0], hue[-1] = 0.5, -0.5
        check("hue", lambda y: K.hue(y, idx, [hue[i] for i in idx]),
              lambda im, i: TF.adjust_hue(im, hue[i]))
        check("grayscale", lambda y: K.grayscale(y, idx),
              lambda im, i: TF.rgb_to_grayscale(im, num_output_channels=3))
        check("solarize", lambda y: K.solarize(y, idx, 128),
              lambda im, i: TF.solarize(im, 128))
        sigma = [0.1 + 2.9 * u for u in unit]
        for size in (1, 3, 5, 13, 23):
            if size // 2 < min(h, w):
                check("blur", lambda y: K.blur(y, idx, size, [sigma[i] for i in idx]),
                      lambda im, i: TF.gaussian_blur(im, [size, size], [sigma[i], sigma[i]]))
        band, K.BLUR_BAND = K.BLUR_BAND, 1  # one output row per convolution
        check("blur_rows", lambda y: K.blur(y, idx, 13, [sigma[i] for i in idx]),
              lambda im, i: TF.gaussian_blur(im, [13, 13], [sigma[i], sigma[i]]))
        K.BLUR_BAND = band
        mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
        ref = torch.stack([TF.normalize(TF.to_dtype(im, torch.float32, scale=True), mean, std)
                           for im in x])
        tally(out, "normalize", K.normalize(x, mean, std), ref)
    colours = torch.arange(1 << 24)
    rgb = torch.stack([colours >> 16, (colours >> 8) & 255, colours & 255]).to(torch.uint8)
    x = rgb.view(3, 8, 512, 4096).transpose(0, 1).contiguous(memory_format=torch.channels_last)
    factors = [-0.5, -0.4213, -0.1, 0.0, 0.0371, 0.1, 0.25, 0.5]
    ref = torch.stack([TF.adjust_hue(im, f) for im, f in zip(x, factors)])
    K.hue(x, list(range(8)), factors)
    tally(out, "hue_colours", x, ref)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
