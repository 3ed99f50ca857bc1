"""Accept or refuse each file exactly as ImageFolder's loader does; refuse bombs without decoding.

ImageFolder loads a sample with ``Image.open(f).convert("RGB")`` under Pillow's defaults. shardkit
must pack exactly the files that call accepts, and skip (with ``strict``: stop on) exactly those
it refuses. :func:`parity_mismatches` checks that for any list of files; the corpus here is made
by the tests (damaged PNG, APNG, JPEG, GIF, WebP, BMP, TIFF, PPM, ICO files and seeded
single-byte corruptions). To run the same check on a corpus of your own:

    .venv/bin/python tests/packing/test_acceptance.py DIR [DIR ...]
"""

from __future__ import annotations

import io
import json
import os
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageFile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # helpers, as a script

from helpers import noise, run_program  # noqa: E402
from shardkit.errors import PackError  # noqa: E402
from shardkit.packing.imaging import ImageRejected, load_rgb  # noqa: E402
from shardkit.packing.api import pack  # noqa: E402

def imagefolder_verdicts(paths: list[str]) -> list[str | None]:
    """None where ImageFolder's loader accepts the file, else its error (in a fresh interpreter:
    Pillow's defaults, whatever this process has changed)."""
    proc = run_program("imagefolder_loader", input=json.dumps(paths), capture_output=True,
                       text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def parity_mismatches(paths: list[str], size: int = 256, strict: bool = True) -> list[str]:
    """Every disagreement between ImageFolder's loader and shardkit on ``paths``: for
    ``load_rgb``, for a real pack (which files it skips) and, with ``strict``, for strict packs
    (the accepted files pack; each refused file alone stops the pack, naming it)."""
    # load_rgb runs here, so this process must have Pillow's defaults too.
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False and Image.MAX_IMAGE_PIXELS == 89_478_485
    reference = dict(zip(paths, imagefolder_verdicts(paths)))
    problems = []

    def check(path: str, accepted: bool, by: str, detail: object = "") -> None:
        if accepted != (reference[path] is None):
            problems.append(f"{path}: ImageFolder {'refuses' if accepted else 'accepts'} "
                            f"({reference[path]}) but {by} {'accepts' if accepted else 'refuses'}"
                            f" it ({detail})")

    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        try:
            load_rgb(data, size)
            check(path, True, "load_rgb")
        except ImageRejected as exc:
            check(path, False, "load_rgb", exc)

    def folder(name: str, files: list[str]) -> str:
        """A class folder of links to ``files`` under image names (decoding ignores names)."""
        os.makedirs(os.path.join(tmp, name, "c"))
        for i, path in enumerate(files):
            os.symlink(os.path.abspath(path), os.path.join(tmp, name, "c", f"{i:06d}.png"))
        return os.path.join(tmp, name)

    with tempfile.TemporaryDirectory() as tmp:
        result = pack(folder("all", paths), os.path.join(tmp, "all.lmdb"), size=size, workers=2,
                      progress=False)
        skipped = {s["path"]: s["reason"] for s in result.skipped}
        for i, path in enumerate(paths):
            link = os.path.join(tmp, "all", "c", f"{i:06d}.png")
            check(path, link not in skipped, "pack", skipped.get(link, ""))
        if not strict:
            return problems
        accepted = [p for p in paths if reference[p] is None]
        for i, path in enumerate(p for p in paths if reference[p] is not None):
            try:
                pack(folder(f"refused{i}", [path]), os.path.join(tmp, f"refused{i}.lmdb"),
                     size=size, strict=True, workers=0, progress=False)
                check(path, True, "a strict pack")
            except PackError as exc:
                if "000000.png" not in str(exc):
                    problems.append(f"{path}: the strict pack's error does not name it: {exc}")
        if accepted:
            try:
                count = pack(folder("accepted", accepted), os.path.join(tmp, "accepted.lmdb"),
                             size=size, strict=True, workers=2, progress=False).count
                if count != len(accepted):
                    problems.append(f"a strict pack of the {len(accepted)} files ImageFolder "
                                    f"accepts packed {count}")
            except PackError as exc:
                problems.append(f"a strict pack of the files ImageFolder accepts failed: {exc}")
    return problems


# -- the corpus -----------------------------------------------------------------------------------

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    out, pos = [], len(PNG_MAGIC)
    while pos + 8 <= len(png):
        n = int.from_bytes(png[pos:pos + 4], "big")
        out.append((png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]))
        pos += 12 + n
    return out


def png_from_chunks(chunks: list[tuple[bytes, bytes]], bad_crc: tuple[bytes, ...] = ()) -> bytes:
    parts = [PNG_MAGIC]
    for kind, body in chunks:
        crc = zlib.crc32(kind + body) ^ (1 if kind in bad_crc else 0)
        parts.append(len(body).to_bytes(4, "big") + kind + body + crc.to_bytes(4, "big"))
    return b"".join(parts)


def _replace(chunks, index, body):
    return chunks[:index] + ([(chunks[index][0], body)] if body is not None else []) \
        + chunks[index + 1:]


def _encoded(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _scribble(data: bytes, at: float, n: int = 24) -> bytes:
    """``n`` bytes of a fixed pattern written over ``data`` at fraction ``at`` of its length."""
    b = bytearray(data)
    i = int(len(b) * at)
    b[i:i + n] = bytes((k * 37 + 11) % 256 for k in range(n))[:len(b) - i]
    return bytes(b)


def damaged_corpus(seed: int = 0) -> dict[str, bytes]:
    """name -> file bytes: intact files and damaged ones of every format ImageFolder reads."""
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(noise(rng, 48, 64))
    files: dict[str, bytes] = {}

    png = _encoded(rgb, "PNG")
    ch = png_chunks(png)
    idat = [k for k, _ in ch].index(b"IDAT")
    body = ch[idat][1]
    files["png-ok"] = png
    files["png-idat-crc"] = png_from_chunks(ch, bad_crc=(b"IDAT",))
    files["png-zlib-garbage"] = png_from_chunks(_replace(ch, idat, _scribble(body, 0.5, 16)))
    files["png-zlib-short-then-iend"] = png_from_chunks(_replace(ch, idat, body[:len(body) // 2]))
    files["png-cut-half"] = png[:len(png) // 2]
    files["png-no-iend"] = png[:-12]
    files["png-trailing-bytes"] = png + b"garbage" * 10
    files["png-text-crc-before-idat"] = png_from_chunks(ch[:1] + [(b"tEXt", b"k\0v")] + ch[1:],
                                                        bad_crc=(b"tEXt",))
    files["png-text-crc-after-idat"] = png_from_chunks(ch[:-1] + [(b"tEXt", b"k\0v")] + ch[-1:],
                                                       bad_crc=(b"tEXt",))
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = _encoded(rgb, "PNG", exif=exif)  # eXIf after IDAT: reading it loads the pixels
    rch = png_chunks(rotated)
    ridat = [k for k, _ in rch].index(b"IDAT")
    files["png-exif-zlib-garbage"] = png_from_chunks(
        _replace(rch, ridat, _scribble(rch[ridat][1], 0.5, 16)))
    files["png-exif-cut"] = rotated[:len(rotated) * 2 // 3]
    files["png-exif-idat-dropped"] = png_from_chunks(_replace(rch, ridat, None))
    grey_png = _encoded(rgb.convert("L"), "PNG")
    files["png-grey-cut"] = grey_png[:len(grey_png) * 2 // 3]
    deep = _encoded(Image.fromarray(np.asarray(rgb)[..., 0].astype(np.uint16) * 257), "PNG")
    files["png-16bit-ok"] = deep
    files["png-16bit-cut"] = deep[:len(deep) * 2 // 3]
    files["png-16bit-zlib-garbage"] = _scribble(deep, 0.6)
    pal = _encoded(rgb.quantize(16), "PNG")
    files["png-palette-cut"] = pal[:len(pal) * 2 // 3]

    frames = [Image.fromarray(noise(rng, 48, 64)) for _ in range(3)]
    apng = _encoded(frames[0], "PNG", save_all=True, append_images=frames[1:])
    ach = png_chunks(apng)
    kinds = [k for k, _ in ach]
    fdat, fctl = kinds.index(b"fdAT"), [i for i, k in enumerate(kinds) if k == b"fcTL"]
    files["apng-ok"] = apng
    files["apng-idat-zlib-garbage"] = png_from_chunks(
        _replace(ach, kinds.index(b"IDAT"), _scribble(ach[kinds.index(b"IDAT")][1], 0.5, 16)))
    files["apng-frame2-crc"] = png_from_chunks(ach, bad_crc=(b"fdAT",))
    files["apng-frame2-zlib-garbage"] = png_from_chunks(
        _replace(ach, fdat, _scribble(ach[fdat][1], 0.5, 16)))
    files["apng-cut-in-frame2"] = apng[:apng.index(b"fdAT") + 200]
    files["apng-frame2-fctl-missing"] = png_from_chunks(_replace(ach, fctl[1], None))
    files["apng-frame2-fdat-truncated"] = png_from_chunks(_replace(ach, fdat, b"\0\0"))
    wide = bytearray(ach[fctl[0]][1])
    wide[4:8] = (1000).to_bytes(4, "big")
    files["apng-frame1-wider-than-canvas"] = png_from_chunks(_replace(ach, fctl[0], bytes(wide)))
    actl = kinds.index(b"acTL")
    files["apng-frame-count-wrong"] = png_from_chunks(
        _replace(ach, actl, (5).to_bytes(4, "big") + ach[actl][1][4:]))

    jpg = _encoded(rgb, "JPEG", quality=90)
    files["jpg-ok"] = jpg
    files["jpg-cut-half"] = jpg[:len(jpg) // 2]
    files["jpg-no-eoi"] = jpg[:-2]
    files["jpg-garbage-after-eoi"] = jpg + b"\0garbage" * 5
    files["jpg-extraneous-bytes"] = jpg[:-2] + b"\0\1\2" + jpg[-2:]
    files["jpg-entropy-garbage"] = _scribble(jpg, 2 / 3, 8)
    files["jpg-header-only"] = jpg[:jpg.index(b"\xff\xda")]
    prog = _encoded(rgb, "JPEG", quality=90, progressive=True)
    files["jpg-progressive-cut"] = prog[:len(prog) * 2 // 3]
    files["jpg-progressive-no-eoi"] = prog[:-2]
    files["jpg-progressive-entropy-garbage"] = _scribble(prog, 0.8, 8)
    cmyk = _encoded(rgb.convert("CMYK"), "JPEG", quality=90)
    files["jpg-cmyk-cut"] = cmyk[:len(cmyk) // 2]
    files["jpg-cmyk-entropy-garbage"] = _scribble(cmyk, 0.7, 8)
    grey = _encoded(rgb.convert("L"), "JPEG", quality=90)
    files["jpg-grey-cut"] = grey[:len(grey) * 3 // 4]
    sof = jpg.index(b"\xff\xc0") + 5  # SOF0: precision, then height and width
    for name, value in (("taller", 96), ("wider", 128), ("zero-height", 0)):
        at = sof + (2 if name == "wider" else 0)
        files[f"jpg-sof-{name}"] = jpg[:at] + value.to_bytes(2, "big") + jpg[at + 2:]
    dht = jpg.index(b"\xff\xc4") + 5  # first Huffman table: class/id, then 16 code counts
    files["jpg-huffman-table-bogus"] = jpg[:dht] + b"\xff" * 16 + jpg[dht + 16:]
    sos = jpg.index(b"\xff\xda") + 5  # start of scan: component count
    files["jpg-scan-component-bogus"] = jpg[:sos] + b"\x07" + jpg[sos + 1:]

    for name, fmt, kw in [("gif", "GIF", {}), ("webp", "WEBP", {"quality": 80}),
                          ("webp-lossless", "WEBP", {"lossless": True}), ("bmp", "BMP", {}),
                          ("tiff", "TIFF", {}), ("tiff-lzw", "TIFF", {"compression": "tiff_lzw"}),
                          ("tiff-deflate", "TIFF", {"compression": "tiff_adobe_deflate"}),
                          ("tiff-jpeg", "TIFF", {"compression": "jpeg"}),
                          ("tiff-packbits", "TIFF", {"compression": "packbits"}),
                          ("ppm", "PPM", {}), ("ico", "ICO", {})]:
        data = _encoded(rgb, fmt, **kw)
        files[f"{name}-ok"] = data
        files[f"{name}-cut"] = data[:len(data) * 2 // 3]
        files[f"{name}-cut-in-header"] = data[:40]
        if fmt == "TIFF":
            tags = Image.open(io.BytesIO(data)).tag_v2
            offset, count = tags[273][0], tags[279][0]  # first strip
            files[f"{name}-strip-garbage"] = (data[:offset + count // 3] + b"\xff" * 24
                                              + data[offset + count // 3 + 24:])
        else:
            files[f"{name}-garbage"] = _scribble(data, 0.6)
    # Seeded single-byte corruptions, headers included (dimensions, tables, chunk lengths).
    for base in ("jpg-ok", "png-ok", "gif-ok", "webp-ok"):
        for k in range(12):
            b = bytearray(files[base])
            i = int(rng.integers(2, len(b)))
            b[i] ^= int(rng.integers(1, 256))
            files[f"{base[:-3]}-flip{k}-at{i}"] = bytes(b)
    return files


def write_corpus(root: Path, files: dict[str, bytes]) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in files.items():
        (root / name).write_bytes(data)
        paths.append(str(root / name))
    return paths


# -- tests ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    files = damaged_corpus()
    return dict(zip(files, write_corpus(tmp_path_factory.mktemp("corpus"), files)))


def test_every_file_is_accepted_or_refused_as_imagefolder_does(corpus):
    assert parity_mismatches(list(corpus.values())) == []


def test_the_corpus_holds_what_shardkit_used_to_get_wrong(corpus):
    """The damaged files behind the parity check: ImageFolder refuses a broken data stream in a
    PNG (rotated by EXIF or not) and an APNG frame sequence error, while it accepts bytes after
    the end of an image and a JPEG with libjpeg warnings."""
    names = list(corpus)
    verdicts = dict(zip(names, imagefolder_verdicts(list(corpus.values()))))
    for refused in ("png-zlib-garbage", "png-exif-zlib-garbage", "png-16bit-zlib-garbage",
                    "apng-frame2-fctl-missing", "png-cut-half", "jpg-cut-half", "jpg-no-eoi",
                    "gif-cut", "tiff-cut", "bmp-cut"):
        assert verdicts[refused] is not None, refused
    for accepted in ("png-trailing-bytes", "png-no-iend",
                     "jpg-garbage-after-eoi", "jpg-extraneous-bytes", "jpg-entropy-garbage",
                     "apng-frame2-zlib-garbage"):
        assert verdicts[accepted] is None, accepted
    assert sum(v is None for v in verdicts.values()) > 30
    assert sum(v is not None for v in verdicts.values()) > 30


def test_jpeg_fast_path_takes_only_files_pillow_accepts(corpus):
    """libjpeg-turbo (simplejpeg, strict) decodes a JPEG only when it reports no warning at all;
    every such file is one Pillow accepts. The rest go to Pillow, which accepts some of them."""
    jpegs = {n: p for n, p in corpus.items()
             if Path(p).read_bytes()[:3] == b"\xff\xd8\xff"}
    verdicts = dict(zip(jpegs, imagefolder_verdicts(list(jpegs.values()))))
    fast, slow = [], []
    for name, path in jpegs.items():
        try:
            simplejpeg.decode_jpeg(Path(path).read_bytes(), "RGB")
            fast.append(name)
        except ValueError:
            slow.append(name)
    assert fast and all(verdicts[n] is None for n in fast), [(n, verdicts[n]) for n in fast]
    assert {verdicts[n] is None for n in slow} == {True, False}  # the fallback decides both ways


# -- decompression bombs --------------------------------------------------------------------------

def _chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")


def png_bomb(width: int, height: int, rows: int) -> bytes:
    """An RGB PNG declaring width x height whose data inflates to ``rows`` rows of zeros."""
    z = zlib.compressobj(9)
    row = bytes(1 + 3 * width)
    idat = b"".join(z.compress(row) for _ in range(rows)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return PNG_MAGIC + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def ico_with(png: bytes) -> bytes:
    """An ICO whose one entry says 256x256 and holds ``png``."""
    return struct.pack("<HHH", 0, 1, 1) + struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png),
                                                      22) + png


def icns_with(png: bytes) -> bytes:
    """An ICNS whose one entry is the 1024x1024 icon ('ic10'), holding ``png``."""
    entry = b"ic10" + struct.pack(">I", 8 + len(png)) + png
    return b"icns" + struct.pack(">I", 8 + len(entry)) + entry


def tiff_bomb(width: int, height: int, tile: int) -> bytes:
    """An RGB deflate TIFF declaring width x height pixels in tile x tile tiles (no real data)."""
    data = zlib.compress(bytes(3 * 64))
    entries = [(256, 4, width), (257, 4, height), (258, 3, None), (259, 3, 8), (262, 3, 2),
               (277, 3, 3), (284, 3, 1), (322, 4, tile), (323, 4, tile), (324, 4, None),
               (325, 4, len(data))]
    bits_at = 8 + 2 + 12 * len(entries) + 4
    out = [b"II*\0", struct.pack("<IH", 8, len(entries))]
    for tag, kind, value in entries:
        if tag == 258:
            out.append(struct.pack("<HHII", tag, kind, 3, bits_at))
        elif tag == 324:
            out.append(struct.pack("<HHII", tag, kind, 1, bits_at + 6))
        else:
            out.append(struct.pack("<HHI" + ("HH" if kind == 3 else "I"), tag, kind, 1, value,
                                   *((0,) if kind == 3 else ())))
    return b"".join(out + [struct.pack("<I", 0), struct.pack("<HHH", 8, 8, 8), data])


def test_sub_image_and_tile_bombs_are_refused_without_growing_memory(tmp_path):
    """Icons whose embedded PNG declares 400 Mpixel (4000 rows of it really inflate: 320 MB of
    pixels) and TIFFs declaring billions of pixels by size or by tile: refused as ImageFolder
    refuses them, before their pixels are decoded, whatever ``max_pixels`` says."""
    png = png_bomb(20_000, 20_000, 4_000)
    bombs = {"icon.ico": ico_with(png), "icon.icns": icns_with(png),
             "huge.tiff": tiff_bomb(100_000, 100_000, 256),
             "huge-tile.tiff": tiff_bomb(64, 64, 1 << 20)}
    paths = write_corpus(tmp_path, bombs)
    assert all(v is not None for v in imagefolder_verdicts(paths))
    runs = [(path, max_pixels) for path in paths
            for max_pixels in (178_956_970, 0, 10**12)]  # default, "no limit", above Pillow's
    proc = run_program("bomb_probe", input=json.dumps(runs), capture_output=True, text=True,
                       timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for (path, max_pixels), (reason, growth_kb) in zip(runs, json.loads(proc.stdout)):
        assert reason is not None, (path, max_pixels)
        assert growth_kb < 32 * 1024, (path, max_pixels, growth_kb, reason)
        if path.endswith("icon.ico") and max_pixels != 178_956_970:
            assert "cannot raise" in reason, reason  # the reason names Pillow's limit


def test_importing_shardkit_leaves_pillow_limits_alone(tmp_path):
    """Pillow's bomb limit stays as the program set it, and an image between Pillow's warning
    limit (89 Mpixel) and its error limit still packs, even with warnings turned into errors."""
    big = tmp_path / "big.jpg"
    big.write_bytes(simplejpeg.encode_jpeg(np.zeros((10_000, 10_000, 3), np.uint8), quality=50,
                                           colorsubsampling="420"))
    proc = run_program("pillow_defaults_load", str(big), capture_output=True, text=True,
                       timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "(256, 256, 3)"


def main(argv: list[str]) -> int:
    paths = sorted(str(p) for root in argv for p in Path(root).rglob("*") if p.is_file())
    problems = parity_mismatches(paths)
    print("\n".join(problems) or f"{len(paths)} files: shardkit agrees with ImageFolder on all")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
