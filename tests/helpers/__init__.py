"""Plain helper functions shared by the test modules (no pytest fixtures here; see conftest.py).

Everything here writes real files: JPEG/PNG/... images with Pillow or simplejpeg, and stores through
shardkit's own writer. The ImageFolder rules and torchvision's Resize/CenterCrop arithmetic are
restated here independently of shardkit, so tests compare shardkit against them, not against itself.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, NoReturn, Sequence

import numpy as np
from PIL import Image

# -- torchvision's rules, restated ----------------------------------------------------------------

#: torchvision.datasets.folder.IMG_EXTENSIONS
IMAGEFOLDER_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def imagefolder_reference(root: str, allow_empty: bool = False
                          ) -> tuple[list[str], dict[str, int], list[tuple[str, int]]]:
    """``(classes, class_to_idx, samples)`` as torchvision's ImageFolder computes them.

    A line-by-line restatement of ``find_classes`` and ``make_dataset`` from torchvision's
    ``datasets/folder.py``: classes are the sorted immediate subfolders (``os.scandir`` +
    ``is_dir()``, so symlinked folders count); per class, ``sorted(os.walk(dir, followlinks=True))``
    and sorted file names; a file counts when its name ends with an IMG_EXTENSION in any case.
    A class without files raises FileNotFoundError unless ``allow_empty``.
    """
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
    class_to_idx = {name: i for i, name in enumerate(classes)}
    samples: list[tuple[str, int]] = []
    available: set[str] = set()
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(root, target_class)
        if not os.path.isdir(target_dir):
            continue
        for dirpath, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(dirpath, fname)
                if path.lower().endswith(IMAGEFOLDER_EXTENSIONS):
                    samples.append((path, class_index))
                    available.add(target_class)
    empty = set(class_to_idx) - available
    if empty and not allow_empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}.")
    return classes, class_to_idx, samples


def resized_shape(height: int, width: int, size: int) -> tuple[int, int]:
    """(H, W) after torchvision ``Resize(size)`` (int: shorter side), except never upscaling.

    torchvision: ``short, long = (w, h) if w <= h else (h, w)``; the long side becomes
    ``int(size * long / short)``. shardkit additionally keeps images whose shorter side is
    already ``<= size`` unchanged, and ``size == 0`` keeps every image unchanged.
    """
    short, long = (width, height) if width <= height else (height, width)
    if size == 0 or short <= size:
        return height, width
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    return new_h, new_w


def reference_center_crop(img: np.ndarray, size: int) -> np.ndarray:
    """torchvision ``F.center_crop`` on an HxWxC array: zero-pad when smaller, then crop.

    Restated from torchvision/transforms/functional.py (``center_crop``).
    """
    image_height, image_width = img.shape[:2]
    crop_height = crop_width = size
    if crop_width > image_width or crop_height > image_height:
        padding_ltrb = [
            (crop_width - image_width) // 2 if crop_width > image_width else 0,
            (crop_height - image_height) // 2 if crop_height > image_height else 0,
            (crop_width - image_width + 1) // 2 if crop_width > image_width else 0,
            (crop_height - image_height + 1) // 2 if crop_height > image_height else 0,
        ]
        left, top, right, bottom = padding_ltrb
        img = np.pad(img, ((top, bottom), (left, right), (0, 0)), constant_values=0)
        image_height, image_width = img.shape[:2]
        if crop_width == image_width and crop_height == image_height:
            return img
    crop_top = int(round((image_height - crop_height) / 2.0))
    crop_left = int(round((image_width - crop_width) / 2.0))
    return img[crop_top:crop_top + crop_height, crop_left:crop_left + crop_width]


# -- writing images -------------------------------------------------------------------------------

RED, GREEN, BLUE, WHITE, BLACK = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0)
YELLOW, CYAN = (255, 255, 0), (0, 255, 255)


def noise(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """HxWx3 uint8 smooth-ish noise: every image distinct, JPEG-friendly enough to stay small."""
    small = rng.integers(0, 256, size=(max(2, height // 4), max(2, width // 4), 3), dtype=np.uint8)
    big = np.asarray(Image.fromarray(small).resize((width, height), Image.Resampling.BILINEAR))
    return np.ascontiguousarray(big)


def quadrants(height: int, width: int, tl, tr, bl, br) -> np.ndarray:
    """An HxWx3 image made of four flat quadrants."""
    img = np.empty((height, width, 3), np.uint8)
    h2, w2 = height // 2, width // 2
    img[:h2, :w2], img[:h2, w2:], img[h2:, :w2], img[h2:, w2:] = tl, tr, bl, br
    return img


def save(img: Image.Image, path: str, fmt: str, **kw) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img.save(path, fmt, **kw)


def jpeg_bytes(arr: np.ndarray, quality: int = 95, exif_orientation: int | None = None) -> bytes:
    buf = io.BytesIO()
    kw = {}
    if exif_orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        kw["exif"] = exif.tobytes()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality, **kw)
    return buf.getvalue()


def write_bytes(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


# -- the quirky ImageFolder -----------------------------------------------------------------------

Region = tuple[float, float, float, float, tuple[int, int, int]]  # y0, y1, x0, x1 (fractions), rgb


@dataclass
class Expect:
    """What one packable source should become: displayed (oriented) size and colour regions."""

    height: int
    width: int
    regions: list[Region] = field(default_factory=list)
    exact: np.ndarray | None = None  # exact RGB pixels (lossless source, not resized)


@dataclass
class QuirkyFolder:
    """A generated ImageFolder tree and what shardkit should make of it."""

    root: str
    expect: dict[str, Expect]       # relpath -> expectation, for every file that should pack
    skipped: dict[str, str]         # relpath -> a word the skip reason should contain ("" = any)
    ignored: list[str]              # relpaths present on disk that are not images by extension
    empty_class: str
    classes: list[str]

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)


def _halves(width: int, height: int, mode: str, left, right) -> Image.Image:
    im = Image.new(mode, (width, height), left)
    im.paste(right, (width // 2, 0, width, height))
    return im


LEFT_RIGHT = lambda left, right: [(0.2, 0.8, 0.1, 0.4, left), (0.2, 0.8, 0.6, 0.9, right)]  # noqa: E731


def make_quirky_folder(root: str, seed: int = 0) -> QuirkyFolder:
    """Write an ImageFolder tree with every quirk shardkit must handle; return expectations.

    Classes: ``alpha`` (colour modes, names, nesting), ``beta`` (orientation, sizes, unusable
    files), ``delta`` (empty: only a .txt and an empty subfolder) and ``gamma`` (a symlinked
    folder, a hidden file). ``delta`` sorts between the others, so dropping it would shift
    ``gamma``'s index. A file at the root is not a class and must be ignored.
    """
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    expect: dict[str, Expect] = {}
    skipped: dict[str, str] = {}
    ignored: list[str] = []
    P = lambda rel: os.path.join(root, rel)  # noqa: E731

    # alpha: colour modes
    save(Image.new("CMYK", (64, 48), (255, 0, 0, 0)), P("alpha/a_cmyk.jpg"), "JPEG", quality=95)
    expect["alpha/a_cmyk.jpg"] = Expect(48, 64, [(0.1, 0.9, 0.1, 0.9, CYAN)])
    save(Image.new("L", (50, 40), 200), P("alpha/b_gray.JPG"), "JPEG", quality=95)
    expect["alpha/b_gray.JPG"] = Expect(40, 50, [(0.1, 0.9, 0.1, 0.9, (200, 200, 200))])
    pal = Image.new("P", (40, 30), 1)
    pal.putpalette([0, 0, 0, 255, 255, 0, 0, 0, 255] + [0] * (256 * 3 - 9))
    save(pal, P("alpha/c_palette.png"), "PNG")
    expect["alpha/c_palette.png"] = Expect(30, 40, [(0.1, 0.9, 0.1, 0.9, YELLOW)],
                                           exact=np.full((30, 40, 3), YELLOW, np.uint8))
    palt = _halves(60, 40, "P", 0, 2)  # index 0 transparent (its colour is black), 2 is blue
    palt.putpalette([0, 0, 0, 255, 255, 0, 0, 0, 255] + [0] * (256 * 3 - 9))
    save(palt, P("alpha/d_palette_t.png"), "PNG", transparency=0)
    expect["alpha/d_palette_t.png"] = Expect(40, 60, LEFT_RIGHT(WHITE, BLUE))
    save(_halves(60, 40, "RGBA", (0, 0, 0, 0), (0, 0, 255, 255)), P("alpha/e_rgba.PNG"), "PNG")
    expect["alpha/e_rgba.PNG"] = Expect(40, 60, LEFT_RIGHT(WHITE, BLUE))
    save(_halves(60, 40, "LA", (0, 0), (0, 255)), P("alpha/f_la.png"), "PNG")
    expect["alpha/f_la.png"] = Expect(40, 60, LEFT_RIGHT(WHITE, BLACK))
    i16 = np.zeros((40, 60), np.uint16)
    i16[:, 30:] = 65535
    i16[:20, :30] = 128 * 257  # top-left quarter mid grey
    im16 = Image.fromarray(i16)
    assert im16.mode == "I;16"
    save(im16, P("alpha/g_i16.png"), "PNG")
    expect["alpha/g_i16.png"] = Expect(40, 60, [(0.6, 0.9, 0.1, 0.4, BLACK),
                                                (0.1, 0.9, 0.6, 0.9, WHITE),
                                                (0.1, 0.4, 0.1, 0.4, (128, 128, 128))])
    save(_halves(60, 40, "1", 0, 1), P("alpha/h_bilevel.png"), "PNG")
    expect["alpha/h_bilevel.png"] = Expect(40, 60, LEFT_RIGHT(BLACK, WHITE))
    save(Image.new("RGB", (40, 30), GREEN), P("alpha/i_png_named.JPEG"), "PNG")
    expect["alpha/i_png_named.JPEG"] = Expect(30, 40, [(0.1, 0.9, 0.1, 0.9, GREEN)],
                                              exact=np.full((30, 40, 3), GREEN, np.uint8))
    write_bytes(P("alpha/notes.txt"), b"not an image, and not an image extension\n")
    ignored.append("alpha/notes.txt")
    write_bytes(P("alpha/archive.JPG.txt"), b"x")
    ignored.append("alpha/archive.JPG.txt")
    write_bytes(P("alpha/résumé_图像.jpg"), jpeg_bytes(noise(rng, 50, 50)))
    expect["alpha/résumé_图像.jpg"] = Expect(50, 50)
    write_bytes(P("alpha/nested/deeper/inner.jpg"), jpeg_bytes(noise(rng, 40, 44)))
    expect["alpha/nested/deeper/inner.jpg"] = Expect(40, 44)
    write_bytes(P("alpha/nested/z_top.jpeg"), jpeg_bytes(noise(rng, 20, 22)))
    expect["alpha/nested/z_top.jpeg"] = Expect(20, 22)
    save(Image.fromarray(noise(rng, 24, 26)), P("alpha/folder.jpg/x.png"), "PNG")  # a dir named .jpg
    expect["alpha/folder.jpg/x.png"] = Expect(24, 26)

    # beta: orientation, sizes, unusable files
    write_bytes(P("beta/exif3.jpg"),
                jpeg_bytes(quadrants(48, 96, RED, GREEN, BLUE, WHITE), exif_orientation=3))
    # 180 degrees: stored top-left (red) ends at the bottom right
    expect["beta/exif3.jpg"] = Expect(48, 96, [(0.1, 0.4, 0.1, 0.4, WHITE), (0.1, 0.4, 0.6, 0.9, BLUE),
                                               (0.6, 0.9, 0.1, 0.4, GREEN), (0.6, 0.9, 0.6, 0.9, RED)])
    write_bytes(P("beta/exif6.jpg"),
                jpeg_bytes(quadrants(320, 640, RED, GREEN, BLUE, WHITE), exif_orientation=6))
    # orientation 6 = rotate 90 degrees clockwise for display: 640x320 stored -> 320 wide, 640 high;
    # stored top-left (red) ends at the top right
    expect["beta/exif6.jpg"] = Expect(640, 320, [(0.1, 0.4, 0.1, 0.4, BLUE), (0.1, 0.4, 0.6, 0.9, RED),
                                                 (0.6, 0.9, 0.1, 0.4, WHITE), (0.6, 0.9, 0.6, 0.9, GREEN)])
    write_bytes(P("beta/red.jpg"), jpeg_bytes(np.full((400, 600, 3), RED, np.uint8)))
    expect["beta/red.jpg"] = Expect(400, 600, [(0.05, 0.95, 0.05, 0.95, RED)])
    small = noise(rng, 61, 101)
    save(Image.fromarray(small), P("beta/small.png"), "PNG")
    expect["beta/small.png"] = Expect(61, 101, exact=small)
    tall = noise(rng, 703, 300)  # 256 * 703 / 300 = 599.89: int() gives 599, round() 600
    save(Image.fromarray(tall), P("beta/tall.png"), "PNG")
    expect["beta/tall.png"] = Expect(703, 300)
    exact256 = noise(rng, 256, 300)
    save(Image.fromarray(exact256), P("beta/short256.bmp"), "BMP")
    expect["beta/short256.bmp"] = Expect(256, 300, exact=exact256)
    save(Image.fromarray(noise(rng, 20, 30)), P("beta/upper.TIFF"), "TIFF")
    expect["beta/upper.TIFF"] = Expect(20, 30)
    save(Image.fromarray(noise(rng, 18, 16)), P("beta/lossless.WebP"), "WEBP", lossless=True)
    expect["beta/lossless.WebP"] = Expect(18, 16)
    save(Image.fromarray(noise(rng, 12, 14)), P("beta/pixmap.ppm"), "PPM")
    expect["beta/pixmap.ppm"] = Expect(12, 14)
    save(Image.new("L", (14, 12), 77), P("beta/graymap.pgm"), "PPM")
    expect["beta/graymap.pgm"] = Expect(12, 14, [(0, 1, 0, 1, (77, 77, 77))])
    full = jpeg_bytes(noise(rng, 150, 200), quality=90)
    write_bytes(P("beta/truncated.jpg"), full[: len(full) // 2])
    skipped["beta/truncated.jpg"] = ""
    write_bytes(P("beta/zero.jpg"), b"")
    skipped["beta/zero.jpg"] = "empty"
    write_bytes(P("beta/text.jpg"), b"hello, I am a text file with a .jpg name\n" * 20)
    skipped["beta/text.jpg"] = "not a recognised image"

    # delta: empty class
    write_bytes(P("delta/readme.txt"), b"no images here\n")
    ignored.append("delta/readme.txt")
    os.makedirs(P("delta/empty_sub"), exist_ok=True)

    # gamma: symlinked folder (followed), hidden file
    save(Image.fromarray(noise(rng, 33, 35)), P("gamma/g1.png"), "PNG")
    expect["gamma/g1.png"] = Expect(33, 35)
    save(Image.fromarray(noise(rng, 9, 11)), P("gamma/.hidden.png"), "PNG")
    expect["gamma/.hidden.png"] = Expect(9, 11)
    os.symlink(os.path.join("..", "alpha", "nested"), P("gamma/link"))
    expect["gamma/link/deeper/inner.jpg"] = expect["alpha/nested/deeper/inner.jpg"]
    expect["gamma/link/z_top.jpeg"] = expect["alpha/nested/z_top.jpeg"]

    write_bytes(P("stray.jpg"), jpeg_bytes(noise(rng, 10, 10)))  # not in a class: ignored
    ignored.append("stray.jpg")
    return QuirkyFolder(root, expect, skipped, ignored, "delta", ["alpha", "beta", "delta", "gamma"])


def region_mean(img: np.ndarray, region: Region) -> np.ndarray:
    y0, y1, x0, x1, _ = region
    h, w = img.shape[:2]
    ys, ye = int(y0 * h), max(int(y0 * h) + 1, int(y1 * h))
    xs, xe = int(x0 * w), max(int(x0 * w) + 1, int(x1 * w))
    return img[ys:ye, xs:xe].reshape(-1, 3).astype(np.float64).mean(axis=0)


# -- an ImageFolder tree of distinct photo-like images --------------------------------------------

def random_photo(rng: np.random.Generator, sides: tuple[int, int] = (24, 80)) -> np.ndarray:
    """An HxWx3 ``noise`` image, each side drawn from ``sides`` (inclusive)."""
    h, w = (int(v) for v in rng.integers(sides[0], sides[1] + 1, size=2))
    return noise(rng, h, w)


def image_tree(root: str, classes: int = 4, per_class: int = 16, seed: int = 0, *, pngs: int = 0,
               sides: tuple[int, int] = (24, 80), quality: int = 90) -> list[tuple[str, int]]:
    """Write the ImageFolder tree ``root/c<k>/img<i:03d>.jpg`` of distinct ``random_photo`` JPEGs;
    return ``(relpath, label)`` in ImageFolder order.

    Every image differs from every other, so a record's bytes or pixels identify it; the same
    arguments write the same bytes. Images are drawn class by class in turn (image 0 of every
    class, then image 1, ...). The last ``pngs`` images of each class are PNGs (``.png``).
    """
    rng = np.random.default_rng(seed)
    out = []
    for i in range(classes * per_class):
        label, k = i % classes, i // classes
        png = k >= per_class - pngs
        rel = os.path.join(f"c{label}", f"img{k:03d}.{'png' if png else 'jpg'}")
        path = os.path.join(root, rel)
        arr = random_photo(rng, sides)
        if png:
            save(Image.fromarray(arr), path, "PNG")
        else:
            write_bytes(path, jpeg_bytes(arr, quality=quality))
        out.append((rel, label))
    return sorted(out, key=lambda t: (t[1], t[0]))


# -- stores written fast through shardkit's own builder -------------------------------------------

def build_store_fast(out: str, count: int, fmt: str | None = None, classes: int = 10,
                     side: int = 8, variants: int = 64, seed: int = 0) -> list[bytes]:
    """A real single-file store of ``count`` tiny JPEG records, written through StoreWriter.

    Skips decoding source files (the slow part of ``pack``) but writes through the same
    writer as ``pack``: the result is an ordinary store.
    Returns the distinct record payloads (record i is ``payloads[i % variants]``).
    """
    import simplejpeg

    from shardkit.packing import StoreWriter

    rng = np.random.default_rng(seed)
    payloads = [simplejpeg.encode_jpeg(rng.integers(0, 256, (side, side, 3), dtype=np.uint8),
                                       quality=90, colorspace="RGB") for _ in range(variants)]
    root = os.path.join(os.path.dirname(os.path.abspath(out)), "virtual-src")
    names = [f"c{c}" for c in range(classes)]
    with StoreWriter(out, names, format=fmt, encoding="jpeg", size=0, source_root=root) as w:
        for i in range(count):
            w.add_encoded(payloads[i % variants], i % classes, side, side,
                          os.path.join(root, names[i % classes], f"{i:07d}.jpg"))
    return payloads


# -- processes ------------------------------------------------------------------------------------

#: The tests folder: on a child's PYTHONPATH, ``helpers.programs.NAME`` imports in any interpreter.
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def program_env(env: dict | None = None) -> dict:
    """``os.environ`` updated with ``env``, the tests folder first on ``PYTHONPATH``."""
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, full.get("PYTHONPATH")) if p)
    return full


def program_cmd(name: str, python: str = sys.executable) -> list[str]:
    """The command running ``tests/helpers/programs/NAME.py`` (pass ``env=program_env()``)."""
    return [python, "-m", f"helpers.programs.{name}"]


def rank_outputs(out: str, world: int) -> list[dict]:
    """The JSON that each rank of a torchrun program wrote to ``OUT.RANK``, in rank order.

    Each rank writes its own file rather than rank 0 gathering them: a gloo collective on tensors
    that Python made (``all_gather_object``'s) is released by gloo's own thread a moment after
    the call returns, and a rank whose interpreter is already exiting then aborts ("terminate
    called without an active exception"; torch 2.13, 2 runs in 22 here; a barrier after it
    does not help, it holds the earlier collective until its own release). See ``end_rank``.
    """
    got = []
    for rank in range(world):
        with open(f"{out}.{rank}") as f:
            got.append(json.load(f))
    assert [g["rank"] for g in got] == list(range(world))
    return got


def end_rank() -> NoReturn:
    """End a gloo rank that has written its output: ``os._exit(0)``, no interpreter teardown.

    With DDP the process group outlives ``destroy_process_group`` (the model's reducer holds it),
    so gloo's threads are still there while the interpreter finalizes. One that drops the last
    reference to a tensor Python made must take the GIL, and in a finalizing interpreter that
    ends the thread inside a C++ destructor: the rank aborts after its work is done (torch 2.13;
    a core dump showed it for ``all_gather_object``'s tensors). Without any collective of ours
    the DDP program still aborted in CI (its own broadcast and all-reduce remain): 2 of 23 runs
    of its test under pytest here, 0 of 140 runs of torchrun alone. Skipping the teardown is the
    one sure way out (0 of 40 under pytest), and loses nothing: the caller has closed its
    output, and the buffers are flushed here.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_program(name: str, *args: str, python: str = sys.executable, env: dict | None = None,
                **kw) -> subprocess.CompletedProcess:
    """``subprocess.run`` of the program ``name`` with ``args``, under ``python``."""
    return subprocess.run([*program_cmd(name, python), *args], env=program_env(env), **kw)


def run_cli(*args: str, timeout: float = 120, cwd: str | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m shardkit.cli ARGS`` in a subprocess; text stdout/stderr captured."""
    full_env = dict(os.environ, PYTHONIOENCODING="utf-8")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "shardkit.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=full_env)


def private_dirty_kb(pid: int) -> int:
    """``Private_Dirty`` of a process in kB, from ``/proc/PID/smaps_rollup``."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    raise RuntimeError(f"no Private_Dirty in /proc/{pid}/smaps_rollup")


# -- tampering with stores ------------------------------------------------------------------------

def rewrite_metadata(path: str, edit: Callable[[dict], None], reseal: bool = True) -> None:
    """Load a single-file store's metadata JSON, apply ``edit`` to it, write it back in place.

    Uses the lmdb / h5py packages directly, as an outside tool would. With ``reseal``, a metadata
    checksum (if the store has one) is recomputed, so only the edited content is "wrong".
    Call it before this process opens the store through shardkit (lmdb refuses a second open).
    """
    import json

    inner = edit

    def edit(meta: dict) -> None:  # noqa: F811
        inner(meta)
        if reseal and "meta_crc32" in meta:
            from shardkit.metadata import seal

            meta.update(seal(meta))

    with open(path, "rb") as f:
        head = f.read(8)
    if head == b"\x89HDF\r\n\x1a\n":
        import h5py

        with h5py.File(path, "r+") as h:
            meta = json.loads(bytes(h.attrs["shardkit_meta"]))
            edit(meta)
            h.attrs["shardkit_meta"] = np.bytes_(json.dumps(meta).encode())
        return
    import lmdb

    env = lmdb.open(path, subdir=False, lock=False, map_size=os.path.getsize(path) + (16 << 20))
    try:
        with env.begin(write=True) as txn:
            meta = json.loads(bytes(txn.get(b"__meta__")))
            edit(meta)
            txn.put(b"__meta__", json.dumps(meta).encode())
    finally:
        env.close()


def flip_byte_in_file(path: str, needle: bytes, offset_in_needle: int) -> None:
    """Find ``needle`` (e.g. one record's bytes) in the file and invert one byte of it."""
    with open(path, "r+b") as f:
        data = f.read()
        pos = data.find(needle)
        assert pos >= 0 and data.find(needle, pos + 1) < 0, "needle must occur exactly once"
        f.seek(pos + offset_in_needle)
        f.write(bytes([data[pos + offset_in_needle] ^ 0xFF]))


def one_line_error(stderr: str) -> bool:
    """True when stderr is exactly one non-empty line without a Python traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    return len(lines) == 1 and "Traceback" not in stderr


def all_records(path: str, output: str = "numpy") -> list:
    """Every (image, label) of a store, read in index order."""
    from shardkit import ShardDataset

    ds = ShardDataset(path, output=output)
    try:
        return [ds[i] for i in range(len(ds))]
    finally:
        ds.close()


def sources_of(path: str) -> list[str]:
    """Source path (relative to SRC) of every record."""
    from shardkit import ShardDataset

    ds = ShardDataset(path, output="bytes")
    try:
        return [ds.source_path(i) for i in range(len(ds))]
    finally:
        ds.close()


def relpaths(samples: Sequence[tuple[str, int]], root: str) -> list[tuple[str, int]]:
    return [(os.path.relpath(p, root), t) for p, t in samples]
