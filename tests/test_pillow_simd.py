"""shardkit on pillow-simd: installed beside it without replacing it, and packing the same images.

Runs when the pillow-simd environment exists (``scripts/pillow_simd_venv.sh`` makes ``.venv-simd``;
CI builds it) or ``SHARDKIT_SIMD_PYTHON`` names its interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SIMD_PYTHON = os.environ.get("SHARDKIT_SIMD_PYTHON") or str(ROOT / ".venv-simd" / "bin" / "python")

pytestmark = pytest.mark.skipif(not os.path.exists(SIMD_PYTHON),
                                reason="no pillow-simd environment (run scripts/pillow_simd_venv.sh)")

PROBE = r"""
import importlib.metadata as md, json, sys
import numpy as np
import PIL, shardkit
from shardkit import ShardDataset
names = {d.metadata["Name"].lower() for d in md.distributions()}
src, out = sys.argv[1], sys.argv[2]
result = shardkit.pack(src, out, workers=2, progress=False)
ds = ShardDataset(out, output="numpy")
items = [ds[i] for i in range(len(ds))]
print(json.dumps({
    "pil_version": PIL.__version__,
    "dists": sorted(names & {"pillow", "pillow-simd"}),
    "count": result.count,
    "skipped": len(result.skipped),
    "labels": [int(label) for _, label in items],
    "shapes": [list(img.shape) for img, _ in items],
    "means": [float(img.mean()) for img, _ in items],
    "sources": [ds.source_path(i) for i in range(len(ds))],
    "digests": [__import__("hashlib").sha256(img.tobytes()).hexdigest() for img, _ in items],
}))
"""


def _make_folder(root: Path) -> None:
    rng = np.random.default_rng(7)
    (root / "a").mkdir(parents=True)
    (root / "b" / "nested").mkdir(parents=True)
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


def _run(python: str, src: Path, out: Path) -> dict:
    proc = subprocess.run([python, "-c", PROBE, str(src), str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_shardkit_runs_on_pillow_simd_like_on_pillow(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _make_folder(src)
    simd = _run(SIMD_PYTHON, src, tmp_path / "simd.lmdb")
    plain = _run(sys.executable, src, tmp_path / "plain.lmdb")

    assert simd["dists"] == ["pillow-simd"], "installing shardkit must leave pillow-simd in place"
    assert ".post" in simd["pil_version"]
    assert plain["dists"] == ["pillow"]
    assert simd["count"] == plain["count"] == 5
    assert simd["skipped"] == plain["skipped"] == 1
    assert simd["labels"] == plain["labels"] == [0, 0, 1, 1, 1]
    assert simd["shapes"] == plain["shapes"]
    # Pillow-decoded sources (PNG, CMYK) go through each library's conversions: close.
    assert np.allclose(simd["means"], plain["means"], atol=2.0)
    # YCbCr JPEGs are decoded by libjpeg-turbo and resized by torch in both: identical pixels
    assert simd["sources"] == plain["sources"]
    jpegs = [i for i, p in enumerate(plain["sources"]) if p.endswith(("photo.jpg", "rot.jpg"))]
    assert len(jpegs) == 2
    for i in jpegs:
        assert simd["digests"][i] == plain["digests"][i], plain["sources"][i]
