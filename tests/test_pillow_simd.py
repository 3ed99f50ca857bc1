"""shardkit on pillow-simd: installed beside it without replacing it, and packing the same images.

Runs in the pillow-simd environment (``scripts/pillow_simd_venv.sh`` makes ``.venv-simd``; skipped
where it is missing, failed under CI, which builds it) or where ``SHARDKIT_SIMD_PYTHON`` points.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import run_program
from PIL import Image


def _make_folder(root: Path) -> None:
    rng = np.random.default_rng(7)
    (root / "a").mkdir(parents=True)
    (root / "b" / "nested").mkdir(parents=True)
    (root / "c").mkdir()
    yy, xx = np.mgrid[0:480, 0:640]
    base = np.stack([xx % 256, yy % 256, (xx + yy) % 256], axis=-1).astype(np.uint8)
    Image.fromarray(base).save(root / "a" / "photo.jpg", quality=92)
    Image.fromarray(base).convert("CMYK").save(root / "a" / "cmyk.jpg")
    rgba = np.dstack([base[:300, :300], rng.integers(0, 256, (300, 300), dtype=np.uint8)])
    Image.fromarray(rgba, "RGBA").save(root / "b" / "alpha.png")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(base[:400, :600]).save(root / "b" / "nested" / "rot.jpg", exif=exif)
    Image.fromarray(base[:100, :120]).save(root / "b" / "small.png")
    (root / "b" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    # Every other path through Pillow: modes, transparency keys, formats, the JPEG fallback.
    im = Image.fromarray(base)
    im.quantize(64).save(root / "c" / "palette-key.png", transparency=3)
    im.convert("L").save(root / "c" / "grey-key.png", transparency=7)
    im.save(root / "c" / "rgb-key.png", transparency=(0, 0, 0))
    im.convert("1").save(root / "c" / "bilevel-key.png", transparency=0)
    Image.fromarray(base[..., 0].astype(np.uint16) * 250).save(root / "c" / "deep.png")
    im.save(root / "c" / "gif-inside.png", "GIF")  # .gif is not an ImageFolder extension
    im.save(root / "c" / "a.tiff")
    im.transpose(Image.Transpose.FLIP_TOP_BOTTOM).convert("CMYK").save(root / "c" / "cmyk.tiff")
    im.convert("L").save(root / "c" / "grey.jpg")
    im.save(root / "c" / "progressive.jpg", progressive=True)
    buf = io.BytesIO()
    Image.fromarray(np.tile(base, (4, 4, 1))).save(buf, "JPEG", quality=90)
    data = buf.getvalue()  # extraneous bytes: libjpeg warns, Pillow decodes (with draft)
    (root / "c" / "warned.jpg").write_bytes(data[:-2] + b"\0\1\2" + data[-2:])


def _run(python: str, src: Path, out: Path, encoding: str) -> dict:
    proc = run_program("simd_probe", str(src), str(out), encoding, python=python,
                       capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_shardkit_runs_on_pillow_simd_like_on_pillow(simd_python: str, tmp_path: Path,
                                                    encoding: str) -> None:
    """The same records, byte for byte (raw records are the pixels), whichever Pillow decodes."""
    src = tmp_path / "src"
    _make_folder(src)
    simd = _run(simd_python, src, tmp_path / "simd.lmdb", encoding)
    plain = _run(sys.executable, src, tmp_path / "plain.lmdb", encoding)

    assert simd["dists"] == ["pillow-simd"], "installing shardkit must leave pillow-simd in place"
    assert ".post" in simd["pil_version"]
    assert plain["dists"] == ["pillow"]
    assert plain["count"] == 16 and plain["skipped"] == ["/b/broken.jpg"]
    for key in ("count", "skipped", "labels", "sources", "digests"):
        assert simd[key] == plain[key], key
    assert len(set(plain["digests"])) == plain["count"]  # the digests do tell images apart
