"""Decode-time augmentation (``crop_mode="random_resized"``, ``flip``): how boxes and flips are
drawn from torch's RNG, the resize kernel, DCT-scaled decoding of large records, DataLoader workers
and threads. The identity with torchvision itself is tested in test_torchvision_parity.py (it
needs the torchvision environment); everything here runs without torchvision.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader

import shardkit
from shardkit import ShardDataset, codec
from shardkit.bench.sample import make_sample, photo_like
from shardkit.read import augment, cut


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, str]:
    """Photo-like JPEGs (300-800 px) packed at 256 (one file, and 3 HDF5 shards), and 1600x1200
    photos packed at full size (``size=0``)."""
    base = tmp_path_factory.mktemp("augment")
    src = str(base / "src")
    make_sample(src, 24, 3, seed=11, workers=1)
    big = base / "big" / "a"
    big.mkdir(parents=True)
    rng = np.random.default_rng(4)
    for i in range(4):
        Image.fromarray(photo_like(rng, 1600, 1200)).save(big / f"{i}.jpg", quality=90)
    out = {"lmdb": str(base / "s.lmdb"), "shards": str(base / "shards"),
           "big": str(base / "big.lmdb")}
    shardkit.pack(src, out["lmdb"], size=256, workers=1, progress=False)
    shardkit.pack(src, out["shards"], size=256, format="hdf5", num_shards=3, workers=1,
                  progress=False)
    shardkit.pack(str(base / "big"), out["big"], size=0, workers=1, progress=False)
    return out


def rng_state_after(fn) -> torch.Tensor:
    torch.manual_seed(123)
    fn()
    return torch.get_rng_state()


# -- arguments ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"crop": 8, "flip": 1.5}, "flip must be a probability"),
    ({"crop": 8, "flip": -0.1}, "flip must be a probability"),
    ({"crop": 8, "flip": "yes"}, "flip must be a probability"),
    ({"crop": 8, "crop_mode": "random_resized", "scale": (0.5, 0.1)}, "scale must be"),
    ({"crop": 8, "crop_mode": "random_resized", "scale": (0.0, 1.0)}, "scale must be"),
    ({"crop": 8, "crop_mode": "random_resized", "scale": 0.5}, "scale must be a pair"),
    ({"crop": 8, "crop_mode": "random_resized", "ratio": (2.0, 1.0)}, "ratio must be"),
    ({"crop": 8, "crop_mode": "random_resized", "ratio": (1.0, float("inf"))}, "ratio must be"),
    ({"crop_mode": "random_resized"}, "crop_mode='random_resized' needs crop"),
    ({"flip": 0.5}, "flip needs crop"),
    ({"crop": 8, "crop_mode": "resized"}, "crop_mode must be one of"),
])
def test_bad_arguments_name_the_parameter(stores, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShardDataset(stores["lmdb"], **kwargs)


# -- drawing the box and the flip -----------------------------------------------------------------

def test_resized_crop_boxes_lie_in_the_image_with_the_drawn_area_and_ratio():
    recipe = augment.Recipe(224, "random_resized")
    torch.manual_seed(0)
    boxes = [recipe.draw(256, 341) for _ in range(2000)]
    assert all(0 <= b.top and b.top + b.height <= 256 and 0 <= b.left
               and b.left + b.width <= 341 for b in boxes)
    areas = np.array([b.height * b.width / (256 * 341) for b in boxes])
    ratios = np.array([b.width / b.height for b in boxes])
    # Rounding each side to whole pixels moves area and ratio a little past the drawn range.
    assert areas.min() > 0.08 * 0.85 and areas.max() <= 1.0
    assert ratios.min() > 0.75 * 0.9 and ratios.max() < 4 / 3 / 0.9
    assert len(set(boxes)) > 1900 and not any(b.flip for b in boxes)
    torch.manual_seed(0)
    assert [recipe.draw(256, 341) for _ in range(2000)] == boxes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("height, width, scale, box", [
    (100, 200, (0.9, 1.0), (0, 33, 100, 133)),   # too wide for any 3:4..4:3 box: h = H
    (200, 100, (0.9, 1.0), (33, 0, 133, 100)),   # too tall: w = W
    (120, 130, (1.5, 2.0), (0, 0, 120, 130)),    # ratio within range: the whole image
])
def test_resized_crop_falls_back_to_a_central_box_after_ten_tries(height, width, scale, box,
                                                                   dtype):
    """torchvision's fallback, and its RNG use: exactly 10 x 2 uniform draws, no randint, in
    torch's default dtype (``torch.empty(1)``'s: a float64 draw takes other random bits)."""
    recipe = augment.Recipe(64, "random_resized", scale=scale)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        recipe.draw(height, width)  # with the previous dtype's draws made in this thread
        assert tuple(recipe.draw(height, width))[:4] == box

        def tries():
            for _ in range(10):
                torch.empty(1).uniform_(0, 1)
                torch.empty(1).uniform_(0, 1)

        assert torch.equal(rng_state_after(lambda: recipe.draw(height, width)),
                           rng_state_after(tries))
    finally:
        torch.set_default_dtype(before)


def reference_resized_crop_box(height: int, width: int, scale, ratio) -> tuple[int, ...]:
    """torchvision v2 ``RandomResizedCrop.make_params``, restated (``transforms/v2/_geometry.py``):
    ten tries of an area in ``scale`` and a log-uniform ratio (the bounds' float32 logs), each side
    rounded to the nearest pixel, then two ``torch.randint`` for the corner; after ten misses the
    central box with the ratio clamped to ``ratio``, its other side rounded likewise."""
    log_low, log_high = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = height * width * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect = torch.exp(torch.empty(1).uniform_(log_low, log_high)).item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = torch.randint(0, height - h + 1, size=(1,)).item()
            left = torch.randint(0, width - w + 1, size=(1,)).item()
            return top, left, h, w
    if width / height < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif width / height > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


# Odd sides, where rounding a side to the nearest pixel and truncating it differ (41 / 0.9 is
# 45.6: 46 pixels, not 45). Portrait sizes reach the fallback's ``w / min(ratio)`` branch,
# landscape ones its ``h * max(ratio)`` branch (the probe's images are all 256 wide there).
ODD_SIZES = ([(int(w * 1.5) + 1, w) for w in range(41, 160, 6)]
             + [(h, int(h * 1.5) + 1) for h in range(41, 160, 6)] + [(77, 77), (255, 341)])


@pytest.mark.parametrize("scale, ratio", [((0.08, 1.0), (3 / 4, 4 / 3)),
                                          ((0.9, 1.0), (0.9, 1.1)),     # every try misses
                                          ((0.3, 0.9), (0.5, 2.0))],
                         ids=["default", "fallback", "wide-ratios"])
def test_resized_crop_boxes_are_torchvisions_box_for_box_on_odd_sizes(scale, ratio):
    """Without torchvision: each box (and the RNG state after it) equals the restated
    ``make_params``, under several seeds, so a box side truncated instead of rounded, in the
    tries or in the central fallback, fails here and not only under ``.venv-tv``."""
    recipe = augment.Recipe(32, "random_resized", scale=scale, ratio=ratio)
    fallbacks = 0
    for seed in range(4):
        torch.manual_seed(seed)
        got = [tuple(plan)[:4] for plan in recipe.draws(ODD_SIZES)]
        after = torch.get_rng_state()
        torch.manual_seed(seed)
        want = [reference_resized_crop_box(h, w, scale, ratio) for h, w in ODD_SIZES]
        assert got == want
        assert torch.equal(after, torch.get_rng_state())
        fallbacks += sum(box[2:] != (h, w) and (box[0], box[1]) == ((h - box[2]) // 2,
                         (w - box[3]) // 2) for box, (h, w) in zip(want, ODD_SIZES))
    if scale == (0.9, 1.0):
        assert fallbacks == 4 * (len(ODD_SIZES) - 1)  # all but the square 77 x 77 clamp a side


def test_flip_draws_one_number_per_sample_and_none_when_off():
    def crops(flip: float):
        recipe = augment.Recipe(32, "random", flip=flip)
        return [recipe.draw(50, 60) for _ in range(400)]

    torch.manual_seed(5)
    plain = crops(0.0)
    torch.manual_seed(5)
    origins = [codec.random_origin(50, 60, 32, augment.DRAWS) for _ in range(400)]
    assert [p[:2] for p in plain] == origins  # flip=0 draws exactly what random crops drew
    torch.manual_seed(5)
    always = crops(1.0)
    assert all(p.flip for p in always) and always[0][:2] == plain[0][:2]
    assert always[1][:2] != plain[1][:2]  # one torch.rand per sample shifts the next crop
    torch.manual_seed(5)
    half = crops(0.5)
    assert 150 < sum(p.flip for p in half) < 250


def test_random_crop_draws_nothing_for_a_side_equal_to_the_crop():
    """As torchvision's RandomCrop: a side with no room to move takes no random number."""
    draws = augment.DRAWS
    assert torch.equal(rng_state_after(lambda: codec.random_origin(32, 40, 32, draws)),
                       rng_state_after(lambda: torch.randint(0, 9, ())))
    assert codec.random_origin(32, 32, 32, draws) == (0, 0)
    assert torch.equal(rng_state_after(lambda: codec.random_origin(32, 32, 32, draws)),
                       rng_state_after(lambda: None))


# -- the resize kernel ----------------------------------------------------------------------------

def reference_resize(src: np.ndarray, size: int, dtype=torch.uint8) -> np.ndarray:
    """What torchvision v2 computes: ``interpolate(bilinear, antialias=True)`` on the CHW tensor
    (uint8 on CPUs with the vectorised kernel, else float32 then rounding)."""
    t = torch.from_numpy(np.ascontiguousarray(src)).permute(2, 0, 1).unsqueeze(0)
    if dtype == torch.uint8:
        out = F.interpolate(t, size=[size, size], mode="bilinear", align_corners=False,
                            antialias=True)
    else:
        out = F.interpolate(t.float(), size=[size, size], mode="bilinear", align_corners=False,
                            antialias=True).round_().to(torch.uint8)
    return out[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("native", [True, False], ids=["uint8-kernel", "float-kernel"])
def test_resize_into_is_torchs_antialiased_bilinear(monkeypatch, native):
    monkeypatch.setattr(cut, "native_uint8", native)
    rng = np.random.default_rng(0)
    img = photo_like(rng, 341, 256)
    readonly = np.frombuffer(img.tobytes(), np.uint8).reshape(img.shape)
    for src in (img[10:200, 30:300], img[:, :], img[100:150, 7:47], readonly[5:250, 0:256]):
        out = np.zeros((64, 64, 3), np.uint8)
        cut.resize_into(out, src)
        expected = reference_resize(src, 64, torch.uint8 if native else torch.float32)
        assert np.array_equal(out, expected)
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        # There the two kernels round differently, so the equalities above tell them apart.
        assert not np.array_equal(reference_resize(img, 64),
                                  reference_resize(img, 64, torch.float32))


@pytest.mark.parametrize("size", [48, 52, 50, 49])  # rows of 8k, 4k, 2k and odd bytes
def test_decode_into_crops_resizes_and_flips(stores, size):
    """A flipped JPEG is decoded BGR, resized and written row by row back to front (word by
    word where the row's length allows): the mirror image of the resized crop, exactly."""
    ds = ShardDataset(stores["lmdb"], output="bytes")
    full = ShardDataset(stores["lmdb"], output="numpy")
    data, img = ds[0][0], full[0][0]
    h, w = img.shape[:2]
    out = np.empty((size, size, 3), np.uint8)
    assert cut.decode_into(out, data, "jpeg", h, w, augment.Plan(10, 20, 100, 90, False)) == 1
    assert np.array_equal(out, reference_resize(img[10:110, 20:110], size))
    for threads in (1, 3):  # several torch threads: the odd rows are flipped in slices
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            cut.decode_into(out, data, "jpeg", h, w, augment.Plan(10, 20, 100, 90, True))
        finally:
            torch.set_num_threads(before)
        assert np.array_equal(out, reference_resize(img[10:110, 20:110], size)[:, ::-1])
    out = np.empty((48, 48, 3), np.uint8)
    # A box of the output's size is cut, not resized; outside the image is zero (centre padding)
    cut.decode_into(out, data, "jpeg", h, w, augment.Plan(-4, 3, 48, 48, True))
    assert np.array_equal(out[4:], img[:44, 3:51][:, ::-1]) and not out[:4].any()


@pytest.mark.parametrize("threads", [1, 3])
def test_mirror_flips_in_place_with_any_number_of_torch_threads(threads):
    """Sliced below torch's parallel grain when torch runs several threads: same result."""
    img = photo_like(np.random.default_rng(1), 224, 224)
    out = img.copy()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cut.mirror(out)
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(out, img[:, ::-1])


# -- the dataset: single items, batches, threads, shards, workers ---------------------------------

@pytest.mark.parametrize("mode", ["random_resized", "random", "center"])
@pytest.mark.parametrize("store", ["lmdb", "shards"])
def test_batch_threads_and_outputs_equal_single_items_under_one_seed(stores, mode, store):
    """Boxes and flips are drawn in batch order in the calling thread: a batch (any output, any
    number of threads, records from several shards) equals the same items read one by one."""
    path = stores[store]
    kwargs = dict(crop=64, crop_mode=mode, flip=0.5)
    one = ShardDataset(path, **kwargs)
    indices = [5, 17, 0, 23, 9, 12, 5, 3, 20, 8, 16, 1]
    torch.manual_seed(7)
    expected = [one[i][0].permute(1, 2, 0).numpy().copy() for i in indices]
    for extra in ({}, {"threads": 3}, {"output": "numpy"}, {"output": "pil"}):
        ds = ShardDataset(path, **kwargs, **extra)
        torch.manual_seed(7)
        got = [np.asarray(img) if not isinstance(img, torch.Tensor) else
               img.permute(1, 2, 0).numpy() for img, _ in ds.__getitems__(indices)]
        assert all(np.array_equal(a, b) for a, b in zip(got, expected)), extra
        ds.close()
    if mode == "center":  # every sample is the centre crop or its mirror image, both occur
        plain = [ShardDataset(path, crop=64)[i][0].permute(1, 2, 0).numpy() for i in indices]
        kinds = ["same" if np.array_equal(e, p) else
                 "mirrored" if np.array_equal(e, p[:, ::-1]) else "other"
                 for e, p in zip(expected, plain)]
        assert "other" not in kinds and kinds.count("same") > 2 and kinds.count("mirrored") > 2


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_draw_from_their_own_seed(stores, method):
    """Worker ``w`` draws from ``base_seed + w`` (DataLoader's seeding of torch's RNG), so a
    batch equals what this process computes under that seed, and a loader seeded alike repeats."""
    ds = ShardDataset(stores["shards"], crop=48, crop_mode="random_resized", flip=0.5)
    batch, workers, n = 5, 2, len(ds)

    def run() -> list[torch.Tensor]:
        loader = DataLoader(ds, batch_size=batch, num_workers=workers,
                            generator=torch.Generator().manual_seed(9),
                            worker_init_fn=shardkit.worker_init_fn, collate_fn=shardkit.collate,
                            multiprocessing_context=method)
        return [images.clone() for images, _ in loader]

    got = run()
    base = int(torch.empty((), dtype=torch.int64).random_(
        generator=torch.Generator().manual_seed(9)).item())
    batches = [list(range(s, min(s + batch, n))) for s in range(0, n, batch)]
    for w in range(workers):
        torch.manual_seed(base + w)
        for b in range(w, len(batches), workers):
            images, _ = shardkit.collate(ds.__getitems__(batches[b]))
            assert torch.equal(got[b], images), (w, b)
    assert all(torch.equal(a, b) for a, b in zip(got, run()))
    assert not torch.equal(got[0][0], got[1][0])


# -- large records: DCT-scaled decoding -----------------------------------------------------------

def test_codec_decodes_at_a_dct_scale_and_checks_the_size(stores):
    ds = ShardDataset(stores["big"], output="bytes")
    data = ds[0][0]
    for k in (2, 4, 8):
        assert codec.decode(data, "jpeg", 1200, 1600, scale=k).shape == (1200 // k, 1600 // k, 3)
    with pytest.raises(codec.RecordDecodeError, match=r"index says 1601x1199 \(1/2: 801x600\)"):
        codec.decode(data, "jpeg", 1199, 1601, scale=2)


def test_codec_decodes_bgr_as_the_same_values_swapped(stores):
    """Flipped samples are decoded BGR (``decode_into``): exactly the RGB values, channels
    swapped, at every DCT scale and with the fast decode too."""
    records = [(ShardDataset(stores["big"], output="bytes")[0][0], 1200, 1600)]
    small = ShardDataset(stores["lmdb"], output="bytes")
    shard = small.store.shard(0)
    records += [(small[i][0], int(shard.heights[i]), int(shard.widths[i]))
                for i in range(len(small))]
    for data, h, w in records:
        for fast in (False, True):
            for k in (1, 2, 4, 8):
                rgb = codec.decode(data, "jpeg", h, w, fast, scale=k)
                bgr = codec.decode(data, "jpeg", h, w, fast, scale=k, bgr=True)
                assert np.array_equal(bgr, rgb[..., ::-1])
    with pytest.raises(ValueError, match="bgr needs a jpeg record"):
        codec.decode(bytes(12), "raw", 2, 2, bgr=True)


def test_dct_factor_keeps_the_box_at_least_the_output_size():
    assert augment.dct_factor(447, 900, 224) == 1
    assert augment.dct_factor(448, 900, 224) == 2
    assert augment.dct_factor(900, 1000, 224) == 4
    assert augment.dct_factor(1792, 1800, 224) == 8
    assert augment.dct_factor(256, 256, 224) == 1  # stores packed at 256: never scaled


def test_small_outputs_decode_at_full_size_unless_dct_scale_is_asked(stores):
    """A 64 px random-resized crop of a store packed at 256: most boxes are at least twice the
    output, which ``dct_scale=True`` decodes at a reduced scale (other pixels). By default every
    sample, item or batch, is the full-size decode's box resized with torchvision's kernel."""
    path, out = stores["lmdb"], 64
    raw = ShardDataset(path, output="bytes")
    shard = raw.store.shard(0)
    sizes = list(zip(shard.heights.tolist(), shard.widths.tolist()))
    kwargs = dict(crop=out, crop_mode="random_resized", flip=0.5)
    ds, scaled = ShardDataset(path, **kwargs), ShardDataset(path, dct_scale=True, **kwargs)
    recipe = augment.Recipe(out, "random_resized", flip=0.5, dct_scale=True)  # which qualify
    qualifying = differing = 0
    for seed in range(2):
        torch.manual_seed(seed)
        plans = [recipe.draw(h, w) for h, w in sizes]
        torch.manual_seed(seed)
        items = [ds[i][0] for i in range(len(sizes))]
        torch.manual_seed(seed)
        batch = ds.__getitems__(range(len(sizes))).images
        torch.manual_seed(seed)
        fast = [scaled[i][0] for i in range(len(sizes))]
        for i, ((h, w), plan) in enumerate(zip(sizes, plans)):
            full = codec.decode(raw[i][0], "jpeg", h, w)
            exact = reference_resize(full[plan.top:plan.top + plan.height,
                                          plan.left:plan.left + plan.width], out)
            exact = torch.from_numpy(np.ascontiguousarray(exact[:, ::-1] if plan.flip
                                                          else exact)).permute(2, 0, 1)
            assert torch.equal(items[i], exact) and torch.equal(batch[i], exact), (seed, i)
            qualifying += plan.dct > 1
            differing += not torch.equal(fast[i], exact)
    # the case is one the option changes: most boxes qualify and most of those come out other
    assert qualifying > len(sizes) and differing > qualifying // 2


def test_large_records_decode_dct_scaled_close_to_full_size(stores):
    """With ``dct_scale=True``, boxes at least twice the output size decode at 1/2, 1/4 or 1/8,
    and the dataset does so; the result stays within the measured distance of the full-size
    decode (the default)."""
    path = stores["big"]
    raw = ShardDataset(path, output="bytes")
    shard = raw.store.shard(0)
    sizes = list(zip(shard.heights.tolist(), shard.widths.tolist()))
    kwargs = dict(crop=224, crop_mode="random_resized", scale=(0.01, 1.0), flip=0.5)
    ds = ShardDataset(path, **kwargs, dct_scale=True)
    full_size = ShardDataset(path, **kwargs)
    recipe = augment.Recipe(224, "random_resized", scale=(0.01, 1.0), flip=0.5, dct_scale=True)
    factors, means, worst = [], [], 0
    for seed in range(24):
        torch.manual_seed(seed)
        batch = ds.__getitems__(range(len(ds)))
        torch.manual_seed(seed)
        exact_batch = full_size.__getitems__(range(len(ds)))
        torch.manual_seed(seed)
        for i, (h, w) in enumerate(sizes):
            plan = recipe.draw(h, w)
            scaled = np.empty((224, 224, 3), np.uint8)
            factors.append(cut.decode_into(scaled, raw[i][0], "jpeg", h, w, plan))
            assert np.array_equal(batch.images[i].permute(1, 2, 0).numpy(), scaled)
            full = codec.decode(raw[i][0], "jpeg", h, w)
            exact = reference_resize(full[plan.top:plan.top + plan.height,
                                          plan.left:plan.left + plan.width], 224)
            exact = exact[:, ::-1] if plan.flip else exact
            assert np.array_equal(exact_batch.images[i].permute(1, 2, 0).numpy(), exact)
            diff = np.abs(scaled.astype(int) - exact)
            means.append(diff.mean())
            worst = max(worst, int(diff.max()))
    assert factors.count(4) > 10 and factors.count(2) > 3 and factors.count(1) > 3
    scaled_means = [m for m, k in zip(means, factors) if k > 1]
    assert all(m == 0 for m, k in zip(means, factors) if k == 1)
    # Measured on these photos: mean 0.63, worst image 1.28, worst pixel 61 (at sharp edges: the
    # box's edges move by up to half a scaled pixel).
    assert 0.4 < np.mean(scaled_means) < 0.75 and max(scaled_means) < 1.5 and worst <= 75


# -- normalisation --------------------------------------------------------------------------------

def test_normalize_is_the_float_div_255_then_normalize_recipe():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (3, 3, 8, 8), dtype=torch.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    got = augment.normalize(images, mean, std)
    m = torch.tensor(mean).view(-1, 1, 1)
    s = torch.tensor(std).view(-1, 1, 1)
    assert got.dtype == torch.float32 and images.dtype == torch.uint8
    assert torch.equal(got, images.float().div_(255).sub_(m).div_(s))
    exact = (images.double() / 255 - torch.tensor(mean).double().view(-1, 1, 1)) / \
        torch.tensor(std).double().view(-1, 1, 1)
    assert torch.allclose(got.double(), exact, atol=1e-6)
    with pytest.raises(ValueError, match="images must be uint8"):
        augment.normalize(got, mean, std)


# -- boxes and masks: torchvision v2's arithmetic, checked against numbers computed by hand ------
# (test_torchvision_parity.py and tests/fields/test_coco_torchvision.py compare with torchvision
# itself; these run without it, so a broken crop, resize, flip or sanitize fails a plain pytest)

def _box_store(path: str, records: list[tuple[int, int, list[list[float]]]]) -> str:
    """Raw-encoded records (height, width, XYXY boxes), labels 1..n per record."""
    from shardkit import fields as F

    with shardkit.StoreWriter(path, ["a"], schema=[F.Boxes("boxes"), F.PerBox("labels")],
                              encoding="raw") as w:
        for h, wd, boxes in records:
            w.add(np.zeros((h, wd, 3), np.uint8), 0, boxes=np.array(boxes, np.float32),
                  labels=np.arange(1, len(boxes) + 1))
    return path


def _items_and_batch(ds):
    """Each record's target read one by one (``build``) and as one batch (``build_batch``)."""
    items = [ds[i][1] for i in range(len(ds))]
    return items, [t for _, t in ds.__getitems__(list(range(len(ds))))]


def test_crop_resize_flip_of_boxes_and_masks_by_hand():
    """Crop box (top 10, left 20, 50x100) resized to 25x25 and flipped: x scales by 1/4, y by
    1/2, then x1, x2 = 25 - x2, 25 - x1 (a flip written W - x1, W - x2 fails)."""
    from shardkit.fields import geometry

    boxes = np.array([[30, 20, 70, 40],     # inside: shifted to (10, 10, 50, 30)
                      [0, 0, 200, 30],      # clamped to (0, 0, 100, 20)
                      [110, 50, 125, 70]],  # clamped to (90, 40, 100, 50)
                     np.float32)
    plain = [[2.5, 5, 12.5, 15], [0, 0, 25, 10], [22.5, 20, 25, 25]]
    flipped = [[12.5, 5, 22.5, 15], [0, 0, 25, 10], [0, 20, 2.5, 25]]
    for flip, want in ((False, plain), (True, flipped)):
        move = geometry.Move(10, 20, 50, 100, 25, flip, (10, 20))
        assert geometry.move_boxes(boxes, move).tolist() == want
        other = geometry.Move(0, 0, 80, 80, 80, False, (0, 0))  # a second sample, unchanged
        a, b = geometry.move_boxes_many([boxes, boxes[:1]], [move, other])
        assert a.tolist() == want and b.tolist() == [[30, 20, 70, 40]]
        steps = geometry.crop_boxes(torch.from_numpy(boxes), 10, 20, 50, 100)
        steps = geometry.resize_boxes(steps, (50, 100), (25, 25))
        if flip:
            steps = geometry.flip_boxes(steps, 25)
        assert steps.tolist() == want
    # A 60x120 mask, ones in rows 10..19 and columns 20..39: cropped to rows 0..9, columns
    # 0..19 of 50x100; nearest to 25x25 takes source row 2i and column 4j: rows 0..4, columns
    # 0..4; flipped: columns 20..24.
    mask = torch.zeros((1, 60, 120), dtype=torch.uint8)
    mask[0, 10:20, 20:40] = 1
    for flip, cols in ((False, slice(0, 5)), (True, slice(20, 25))):
        want = torch.zeros((1, 25, 25), dtype=torch.uint8)
        want[0, 0:5, cols] = 1
        got = geometry.move_masks(mask, geometry.Move(10, 20, 50, 100, 25, flip, (10, 20)))
        assert torch.equal(got, want)


def test_center_crop_and_flip_of_stored_boxes_by_hand(tmp_path):
    """A 300x200 record, CenterCrop(100) (anchor left 100, top 50) and flip=1: every sample
    flipped, read one by one and as a batch."""
    store = _box_store(str(tmp_path / "b.lmdb"), [(200, 300, [
        [110, 60, 150, 90],      # inside: (10, 10, 50, 40), flipped (50, 10, 90, 40)
        [90, 40, 260, 160],      # clamped to the whole crop
        [150, 100, 151, 101]])])  # (50, 50, 51, 51), flipped (49, 50, 50, 51)
    ds = ShardDataset(store, fields=["boxes", "labels"], crop=100, crop_mode="center", flip=1.0)
    want = [[50, 10, 90, 40], [0, 0, 100, 100], [49, 50, 50, 51]]
    for targets in _items_and_batch(ds):
        assert targets[0]["boxes"].tolist() == want
        assert targets[0]["labels"].tolist() == [1, 2, 3]


def test_sanitize_keeps_boxes_on_the_bounds():
    """``SanitizeBoundingBoxes(min_size=1, min_area=1)``: each bound is inclusive (a box on the
    border, 1 px wide, of area 1 is kept); made strict, the kept ones here would be dropped."""
    from shardkit.fields import geometry

    boxes = torch.tensor([[0, 0, 100, 50],           # keep: the whole 100x50 canvas
                          [99, 49, 100, 50],         # keep: 1x1 in the far corner
                          [10, 10, 11, 12],          # keep: exactly 1 wide
                          [0, 0, 100.01, 50],        # drop: x2 past the width
                          [0, 0, 10, 50.01],         # drop: y2 past the height
                          [-0.01, 0, 10, 10],        # drop: x1 negative
                          [0, 0, 0.99, 10],          # drop: under 1 wide
                          [0, 0, 10, 0.99],          # drop: under 1 high
                          [5, 5, 5, 5]])             # drop: empty
    keep = geometry.sanitize_keep(boxes, (50, 100))
    assert keep.tolist() == [True, True, True] + [False] * 6


def test_sanitize_through_the_dataset_keeps_boxes_on_the_bounds(tmp_path):
    """CenterCrop(100) of a 300x200 record: boxes cut to the crop's borders, 1 px wide, and to
    nothing; sanitize keeps exactly the first three with their labels."""
    store = _box_store(str(tmp_path / "s.lmdb"), [(200, 300, [
        [100, 50, 200, 150],     # the whole crop
        [150, 100, 151, 101],    # 1x1
        [50, 20, 101, 51],       # clamped to (0, 0, 1, 1)
        [50, 20, 100.5, 60],     # clamped to (0, 0, 0.5, 10): under 1 wide
        [10, 10, 60, 40]])])     # outside the crop: (0, 0, 0, 0)
    ds = ShardDataset(store, fields=["boxes", "labels"], crop=100, crop_mode="center",
                      sanitize=True)
    for targets in _items_and_batch(ds):
        assert targets[0]["boxes"].tolist() == [[0, 0, 100, 100], [50, 50, 51, 51], [0, 0, 1, 1]]
        assert targets[0]["labels"].tolist() == [1, 2, 3]


def test_fields_object_builds_what_the_field_options_build(tmp_path):
    """``fields=Fields([...], sanitize=True)`` is ``fields=[...]`` with ``sanitize=True``: the
    same object as ``ds.fields``, the same targets; an option given next to a ``Fields`` object
    is refused with one OptionError naming it."""
    store = _box_store(str(tmp_path / "f.lmdb"), [(200, 300, [
        [100, 50, 200, 150], [10, 10, 60, 40]])])  # the second lies outside the crop
    spec = shardkit.Fields(["boxes", "labels"], sanitize=True)
    flags = ShardDataset(store, fields=["boxes", "labels"], crop=100, sanitize=True)
    made = ShardDataset(store, fields=spec, crop=100)
    assert flags.fields == made.fields == spec
    for a, b in zip(_items_and_batch(flags), _items_and_batch(made)):
        assert a[0]["boxes"].tolist() == b[0]["boxes"].tolist() == [[0, 0, 100, 100]]
        assert a[0]["labels"].tolist() == b[0]["labels"].tolist() == [1]
    with pytest.raises(shardkit.OptionError, match="sanitize") as refused:
        ShardDataset(store, fields=spec, sanitize=True)
    assert "\n" not in str(refused.value)
    with pytest.raises(shardkit.OptionError, match="list of field names"):
        shardkit.Fields("boxes")


def test_random_crop_of_an_image_the_crop_size_leaves_boxes_alone(tmp_path):
    """v2 ``RandomCrop`` does not crop an image exactly its size, so a box a rounding error past
    the border (as stored boxes scaled with the image can be) is not clamped, and sanitize drops
    it with its label; a larger image is cropped and clamped."""
    over = float(np.float32(64.0005))
    store = _box_store(str(tmp_path / "r.lmdb"), [
        (64, 64, [[0, 10, 64.0005, 30], [5, 5, 20, 20]]),
        (64, 70, [[0, 10, 70.0005, 30]])])
    ds = ShardDataset(store, fields=["boxes", "labels"], crop=64, crop_mode="random")
    for seed in range(3):
        torch.manual_seed(seed)
        left = ds[1][1]["boxes"][0, 0].item()  # 0 minus the drawn offset, clamped to 0
        torch.manual_seed(seed)
        for targets in _items_and_batch(ds):
            assert targets[0]["boxes"].tolist() == [[0, 10, over, 30], [5, 5, 20, 20]]
            assert targets[1]["boxes"][0].tolist()[1:] == [10, 64, 30] and left == 0
    sane = ShardDataset(store, fields=["boxes", "labels"], crop=64, crop_mode="random",
                        sanitize=True)
    for targets in _items_and_batch(sane):
        assert targets[0]["boxes"].tolist() == [[5, 5, 20, 20]]
        assert targets[0]["labels"].tolist() == [2]
        assert targets[1]["labels"].tolist() == [1]
