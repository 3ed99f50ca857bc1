"""Each photometric kernel of ``shardkit.recipes`` (brightness, contrast, saturation, hue,
grayscale, solarize, blur, normalize) is torchvision v2's functional kernel pixel for pixel
(``torch.equal``) on batches of odd sizes, channels-last and NCHW, on every sample and on a
scattered subset (the rest untouched), blur kernels 1 to 23 over more than one convolution group
and in bands of rows down to one;
hue on every one of the 2**24 uint8 colours. The probe ``tests/helpers/programs/tv_kernels.py``
runs in ``.venv-tv``."""

from __future__ import annotations

import json

from helpers import run_program


def test_kernels_equal_torchvision_v2(tv_python):
    done = run_program("tv_kernels", python=tv_python, capture_output=True, text=True,
                       timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    per_step = [79, 0]
    assert got == {"brightness": per_step, "contrast": per_step, "saturation": per_step,
                   "hue": per_step, "grayscale": per_step, "solarize": per_step,
                   "blur": [395, 0], "blur_rows": per_step, "normalize": per_step,
                   "hue_colours": [8, 0]}
