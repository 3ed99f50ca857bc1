"""Hostile source folders: every odd file is packed or skipped with a reason; nothing hangs.

One folder holds them all: decompression bombs (tiny PNG/JPEG files whose headers declare
billions of pixels, crafted byte by byte), absurd EXIF (orientation 99, a 60 KB garbage EXIF
block, an EXIF directory claiming 65535 entries), symlink loops inside a class folder, file and
class names with newlines, non-UTF-8 bytes and leading dashes, a FIFO, a dangling symlink, a
symlink to /dev/zero and a directory named like an image, and a class folder that is a symlink to
another class folder. ``shardkit pack`` runs in a child process with a timeout (a hang fails the
test), with the default worker pool, for both formats; then ``info``, ``verify`` and the dataset
must handle the store, and ``--strict`` must fail with one line. Files unreadable by permission are
tested by packing as an unprivileged user (root reads everything), where that is possible.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from helpers import run_program
from PIL import Image

from shardkit import ShardDataset
from shardkit.packing.install import partial_path
from shardkit.formats import FORMATS
from shardkit.read.store import Store

PACK_TIMEOUT = 90
RNG = np.random.default_rng(11)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(width: int, height: int) -> bytes:
    """A valid-looking PNG of a few dozen bytes whose IHDR declares ``width`` x ``height``."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def jpeg_with_size(width: int, height: int) -> bytes:
    """A real small JPEG whose SOF0 header is patched to declare ``width`` x ``height``."""
    data = bytearray(_jpeg(np.zeros((16, 16, 3), np.uint8)))
    sof = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def _jpeg(arr: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=95, **kw)
    return buf.getvalue()


def jpeg_with_app1(arr: np.ndarray, payload: bytes) -> bytes:
    """A JPEG with an APP1 (EXIF) segment holding ``payload`` right after SOI."""
    data = _jpeg(arr)
    assert len(payload) + 2 <= 0xFFFF
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + data[2:]


def exif_orientation(value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def _write(path: bytes, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _image(h: int, w: int) -> np.ndarray:
    """Left half dark, right half bright: a 90-degree turn would be visible."""
    arr = RNG.integers(0, 40, (h, w, 3), dtype=np.uint8)
    arr[:, w // 2:] += 200
    return arr


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict:
    """Build the hostile folder; returns {"root": str, "expect": {relpath-bytes: spec}}."""
    root = os.fsencode(str(tmp_path_factory.mktemp("hostile") / "src"))
    expect: dict[bytes, object] = {}  # relpath -> (h, w) packed, or a reason fragment (skipped)

    def mk(*parts: bytes) -> bytes:
        path = os.path.join(root, *parts)
        os.makedirs(path, exist_ok=True)
        return path

    good = mk(b"good")
    for name in (b"plain.jpg", b"line\nbreak.jpg", b"\xff\xfe-not-utf8.jpg", b"-rf.jpg",
                 b"--help.png", b" spaced .JPG"):
        arr = _image(30, 40)
        if name.endswith(b".png"):
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, "PNG")
            _write(os.path.join(good, name), buf.getvalue())
        else:
            _write(os.path.join(good, name), _jpeg(arr))
        expect[b"good/" + name] = (30, 40)
    # Absurd EXIF: the image is used as decoded (not rotated), never refused for its EXIF.
    _write(os.path.join(good, b"exif-orientation-99.jpg"),
           _jpeg(_image(20, 50), exif=exif_orientation(99)))
    expect[b"good/exif-orientation-99.jpg"] = (20, 50)
    _write(os.path.join(good, b"exif-garbage.jpg"),
           jpeg_with_app1(_image(20, 50), b"Exif\x00\x00" + RNG.bytes(60000)))
    expect[b"good/exif-garbage.jpg"] = (20, 50)
    huge_ifd = b"Exif\x00\x00II*\x00" + struct.pack("<IH", 8, 0xFFFF) + b"\x12\x01" * 100
    _write(os.path.join(good, b"exif-huge-ifd.jpg"), jpeg_with_app1(_image(20, 50), huge_ifd))
    expect[b"good/exif-huge-ifd.jpg"] = (20, 50)
    exif_loop = b"Exif\x00\x00MM\x00*" + struct.pack(">I", 8) + struct.pack(">H", 1) + \
        struct.pack(">HHII", 0x8769, 4, 1, 8) + struct.pack(">I", 8)  # IFD pointing at itself
    _write(os.path.join(good, b"exif-ifd-loop.jpg"), jpeg_with_app1(_image(20, 50), exif_loop))
    expect[b"good/exif-ifd-loop.jpg"] = (20, 50)

    bombs = mk(b"bombs")
    for name, data in ((b"png-100k-square.png", png_bomb(100_000, 100_000)),
                       (b"png-wide.png", png_bomb(2**31 - 1, 2)),
                       (b"jpeg-65500-square.jpg", jpeg_with_size(65500, 65500)),
                       (b"png-zero-width.png", png_bomb(0, 10))):
        _write(os.path.join(bombs, name), data)
        expect[b"bombs/" + name] = "" if b"zero" in name else "pixels"
    _write(os.path.join(bombs, b"ok.png"), png_bytes(_image(8, 8)))
    expect[b"bombs/ok.png"] = (8, 8)

    mk(b"loops", b"sub")
    loops = mk(b"loops")
    os.symlink(b".", os.path.join(loops, b"self"))
    os.symlink(b"..", os.path.join(loops, b"sub", b"up"))
    os.symlink(b"../../loops", os.path.join(loops, b"sub", b"again"))
    _write(os.path.join(loops, b"ok.jpg"), _jpeg(_image(10, 12)))
    expect[b"loops/ok.jpg"] = (10, 12)

    special = mk(b"special")
    os.mkfifo(os.path.join(special, b"fifo.jpg"))
    expect[b"special/fifo.jpg"] = "regular file"
    os.symlink(b"/nonexistent/x.jpg", os.path.join(special, b"dangling.jpg"))
    expect[b"special/dangling.jpg"] = "cannot read"
    os.symlink(b"/dev/zero", os.path.join(special, b"devzero.jpg"))
    expect[b"special/devzero.jpg"] = "regular file"
    inner = mk(b"special", b"dir.jpg")
    _write(os.path.join(inner, b"inner.png"), png_bytes(_image(9, 9)))
    expect[b"special/dir.jpg/inner.png"] = (9, 9)
    _write(os.path.join(special, b"empty.jpg"), b"")
    expect[b"special/empty.jpg"] = "empty"
    _write(os.path.join(special, b"text.jpg"), b"this is not an image\n" * 10)
    expect[b"special/text.jpg"] = "not a recognised image"
    _write(os.path.join(special, b"truncated.jpg"), _jpeg(_image(40, 40))[:300])
    expect[b"special/truncated.jpg"] = ""

    for cls in (b"-dash-class", b"new\nline class", b"\xfe\xff-bytes-class"):
        _write(os.path.join(mk(cls), b"x.png"), png_bytes(_image(6, 7)))
        expect[cls + b"/x.png"] = (6, 7)

    os.symlink(b"good", os.path.join(root, b"zz-alias-of-good"))
    for rel, spec in list(expect.items()):
        if rel.startswith(b"good/"):
            expect[b"zz-alias-of-good/" + rel[5:]] = spec
    return {"root": os.fsdecode(root), "expect": expect}


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def run_cli(*args: str, timeout: float = PACK_TIMEOUT, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "shardkit.cli", *args], capture_output=True,
                          timeout=timeout, env=env, **kw)


@pytest.mark.parametrize("fmt", FORMATS)
def test_hostile_folder_packs_with_reasons(hostile, tmp_path, fmt):
    root, expect = hostile["root"], hostile["expect"]
    out = str(tmp_path / f"out.{fmt}")
    res = run_cli("pack", root, out, "--format", fmt, "--size", "0", "--encoding", "raw",
                  "--workers", "2", "--quiet")
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, err
    assert "Traceback" not in err

    ds = ShardDataset(out, output="numpy")
    # Classes: ImageFolder's (sorted subfolders, symlinked ones included), names kept exactly.
    names = sorted(os.fsdecode(e) for e in os.listdir(os.fsencode(root)))
    assert ds.classes == names
    packed = {os.fsencode(ds.source_path(i)): i for i in range(len(ds))}
    skipped = {os.fsencode(os.path.relpath(s["path"], root)): s["reason"]
               for s in ds.store.skipped}
    problems = []
    for rel, spec in expect.items():
        if isinstance(spec, tuple):
            if rel not in packed:
                problems.append(f"{rel!r} was not packed ({skipped.get(rel)})")
                continue
            img, label = ds[packed[rel]]
            if img.shape[:2] != spec:
                problems.append(f"{rel!r}: shape {img.shape[:2]}, expected {spec} (not rotated)")
            if ds.classes[label] != os.fsdecode(rel.split(b"/")[0]):
                problems.append(f"{rel!r}: label {ds.classes[label]!r}")
        elif rel not in skipped:
            problems.append(f"{rel!r} should be skipped with a reason, got "
                            f"{'packed' if rel in packed else 'nothing'}")
        elif spec not in skipped[rel]:
            problems.append(f"{rel!r}: reason {skipped[rel]!r} lacks {spec!r}")
    # The symlink loops: reported, each real file packed once per path that reaches it.
    loop_reasons = [r for p, r in skipped.items() if p.startswith(b"loops/")]
    assert any("loop" in r for r in loop_reasons), skipped
    assert not problems, "\n".join(problems)
    assert [p for p in packed if p.startswith(b"loops/")] == [b"loops/ok.jpg"]
    img, _ = ds[packed[b"good/exif-orientation-99.jpg"]]
    assert img[:, :20].mean() < 80 < img[:, 30:].mean()  # dark left, bright right: as stored
    ds.close()

    # The store is fine for every command, whatever the names in it.
    for args in (["info", out], ["info", "--json", out], ["verify", "--quiet", out]):
        res = run_cli(*args, timeout=120)
        assert res.returncode == 0, (args, res.stderr.decode("utf-8", "replace"))
    assert not os.path.lexists(partial_path(out))


def test_strict_fails_on_first_bad_file_with_one_line(hostile, tmp_path):
    out = str(tmp_path / "strict.lmdb")
    res = run_cli("pack", hostile["root"], out, "--strict", "--workers", "2", "--quiet")
    err = res.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert res.returncode == 1 and len(lines) == 1 and "--strict" in lines[0], err
    assert not os.path.lexists(out) and not os.path.lexists(partial_path(out))


def test_strict_error_names_an_odd_file_on_one_line(tmp_path):
    root = os.fsencode(str(tmp_path / "src" / "c"))
    os.makedirs(root)
    _write(os.path.join(root, b"bad\nname\xff.jpg"), b"not an image")
    out = str(tmp_path / "o.lmdb")
    res = run_cli("pack", str(tmp_path / "src"), out, "--strict", "--quiet", timeout=120)
    err = res.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.strip()]
    assert res.returncode == 1 and len(lines) == 1, err
    assert "bad\\nname" in lines[0] and "not a recognised image" in lines[0], err
    assert not os.path.lexists(out)


def test_bomb_is_refused_before_decoding(tmp_path):
    """The bomb check happens on the header: a 100000 x 100000 PNG costs no memory to refuse."""
    root = tmp_path / "src" / "c"
    root.mkdir(parents=True)
    _write(os.fsencode(str(root / "bomb.png")), png_bomb(100_000, 100_000))
    _write(os.fsencode(str(root / "ok.png")), png_bytes(_image(5, 5)))
    out = str(tmp_path / "o.lmdb")
    res = run_program("limited_cli", "pack", str(tmp_path / "src"), out, "--workers", "0",
                      "--quiet", capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    store = Store(out)
    assert store.count == 1
    assert "exceeds --max-pixels" in store.skipped[0]["reason"]


def _drop_root_file_powers() -> None:
    """In a child about to exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding
    set, so the program (and its workers) obeys file permissions even as root."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def test_unreadable_files_are_skipped(tmp_path):
    """Permission denied on a file and on a subfolder: skipped with a reason. Root ignores file
    permissions, so as root the packer runs without the capabilities that let it."""
    src = tmp_path / "src"
    (src / "c" / "locked").mkdir(parents=True)
    for name in ("ok.png", "secret.png"):
        _write(os.fsencode(str(src / "c" / name)), png_bytes(_image(5, 5)))
    _write(os.fsencode(str(src / "c" / "locked" / "x.png")), png_bytes(_image(5, 5)))
    os.chmod(src / "c" / "secret.png", 0)
    os.chmod(src / "c" / "locked", 0)
    out = str(tmp_path / "o.lmdb")
    preexec = _drop_root_file_powers if os.geteuid() == 0 and sys.platform == "linux" else None
    try:
        res = subprocess.run([sys.executable, "-m", "shardkit.cli", "pack", str(src), out,
                              "--workers", "2", "--quiet"], capture_output=True, text=True,
                             timeout=PACK_TIMEOUT, preexec_fn=preexec)
    finally:
        os.chmod(src / "c" / "locked", 0o755)
    if os.geteuid() == 0 and preexec is None:
        pytest.skip("root reads every file here; cannot drop that power on this platform")
    assert res.returncode == 0, res.stderr
    store = Store(out)
    reasons = {os.path.relpath(s["path"], str(src)): s["reason"] for s in store.skipped}
    assert store.count == 1
    assert "Permission denied" in reasons[os.path.join("c", "secret.png")], reasons
    assert "Permission denied" in reasons[os.path.join("c", "locked")], reasons
