"""Damaged and foreign stores: never a crash, a hang or silently different data.

Small real stores (LMDB and HDF5; one file, and a folder of two shards) are packed once, then
copied and damaged many times with a seeded generator: truncation at a random point, zero-filled
ranges, bit flips, random bytes -- half of them aimed at the bytes that matter most (the metadata
JSON, every index array, record bytes), half anywhere in the file. Foreign inputs are added (random
bytes, a PNG, an empty file, LMDB/HDF5 files that shardkit did not write, folders with bogus
manifests, FIFOs). Each damaged store is opened and fully read in a child process -- every index
through ``ShardDataset(verify=True)`` one by one and as one batch, ``targets``, ``source_path``,
every index again without ``verify`` (decoded, and cropped in a batch: damaged bytes reach the
decoder), and ``shardkit verify`` -- under a 2 GiB address-space limit; the test fails if the
child dies by a signal, hangs or runs out of memory, raises anything but ``StoreError`` (the
README's promise), or returns data that differs from the undamaged store's (pixels, labels,
classes, source paths): with ``verify=True`` no change to the bytes a read returns may go
unnoticed, and ``shardkit verify`` may pass only intact data.

Attacks on one backend's own structures live with that backend's tests (tests/formats/).

Set SHARDKIT_FUZZ_SEED / SHARDKIT_FUZZ_N to explore further (the defaults are what CI runs).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

import shardkit
from shardkit.errors import StoreError
from shardkit.formats import FORMATS
from shardkit.metadata import seal
from shardkit.read.store import Store

from helpers import run_program
from helpers.damage import STORES, pack_pristine, run_batch, source_tree, vouch_for_labels

SEED = int(os.environ.get("SHARDKIT_FUZZ_SEED", "20240501"))
N_SINGLE = int(os.environ.get("SHARDKIT_FUZZ_N", "40"))  # per format, single-file stores
N_SHARDED = max(1, N_SINGLE * 3 // 4)  # per format, two-shard folder stores
BATCH = 50  # damaged stores per child process (one interpreter start per batch)


# -- the stores ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, str]:
    return pack_pristine(str(tmp_path_factory.mktemp("pristine")))


def _hot_ranges(path: str) -> list[tuple[int, int]]:
    """Where the bytes that matter lie in one store file: metadata JSON, index arrays, records."""
    with open(path, "rb") as f:
        data = f.read()
    needles: list[bytes] = []
    if path.endswith(".json"):
        return [(0, len(data))]
    if path.endswith(".npy"):
        return [(0, len(data))]
    from shardkit.formats import open_reader
    from shardkit import metadata

    reader = open_reader(path)
    try:
        meta = metadata.parse_shard_meta(reader.meta_json(), path)
        needles.append(bytes(reader.meta_json()))
        for name, desc in meta["arrays"].items():
            needles.append(bytes(np.ascontiguousarray(
                reader.array(name, desc["dtype"], tuple(desc["shape"])))))
        with reader.records() as get:
            needles += [bytes(get(i)) for i in range(min(3, meta["count"]))]
    finally:
        reader.close()
    ranges = []
    for needle in needles:
        pos = data.find(needle) if len(needle) >= 8 else -1
        if pos >= 0:
            ranges.append((pos, pos + len(needle)))
    assert len(ranges) >= 4, f"could not locate the metadata and index arrays in {path}"
    return ranges


def _damage(rng: random.Random, data: bytes, hot: list[tuple[int, int]]) -> tuple[str, bytes]:
    """One random corruption of ``data``; half of them inside a ``hot`` range."""
    b = bytearray(data)
    if rng.random() < 0.5 and hot:
        lo, hi = rng.choice(hot)
    else:
        lo, hi = 0, len(b)
    kind = rng.choice(["truncate", "zeros", "flip", "flip", "random"])
    if kind == "truncate":
        cut = rng.randrange(lo, hi) if rng.random() < 0.7 else rng.randrange(0, len(b))
        return f"truncate at {cut} of {len(b)}", bytes(b[:cut])
    at = rng.randrange(lo, hi)
    if kind == "zeros":
        n = rng.choice([1, 4, 16, 100, 512, 4096])
        b[at:at + n] = bytes(len(b[at:at + n]))
        return f"zero {n} bytes at {at}", bytes(b)
    if kind == "flip":
        spots = [at] + [rng.randrange(lo, hi) for _ in range(rng.choice([0, 0, 1, 7]))]
        for p in spots:
            b[p] ^= 1 << rng.randrange(8)
        return f"flip bits at {spots}", bytes(b)
    n = rng.choice([2, 8, 64, 300])
    b[at:at + n] = bytes(rng.randrange(256) for _ in range(len(b[at:at + n])))
    return f"random {n} bytes at {at}", bytes(b)


def _copy(src: str, dst: str) -> None:
    if os.path.isdir(src):
        shutil.copytree(src, dst)
    else:
        shutil.copyfile(src, dst)


def _damaged_copies(pristine: dict[str, str], work: str) -> list[tuple[str, str, str]]:
    """[(damaged store path, pristine name, description)], seeded."""
    rng = random.Random(SEED)
    cases = []
    for name, path in pristine.items():
        n = N_SHARDED if os.path.isdir(path) else N_SINGLE
        files = sorted(os.listdir(path)) if os.path.isdir(path) else [""]
        hot = {f: _hot_ranges(os.path.join(path, f) if f else path) for f in files}
        for i in range(n):
            dst = os.path.join(work, f"{name}-{i:03d}")
            _copy(path, dst)
            # Folder stores: mostly the shards, sometimes the manifest or labels.npy.
            f = rng.choice([x for x in files if x.startswith("shard")] * 3 + files) if files != [""] else ""
            target = os.path.join(dst, f) if f else dst
            with open(target, "rb") as fh:
                data = fh.read()
            what, new = _damage(rng, data, hot[f])
            with open(target, "wb") as fh:
                fh.write(new)
            cases.append((dst, name, f"{f or name}: {what}"))
    return cases


# -- foreign inputs -------------------------------------------------------------------------------

def _foreign(pristine: dict[str, str], work: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Inputs that are not shardkit stores at all (must be refused); and copies of the LMDB
    folder store with bogus manifests or files, as damaged-store cases (refused, or read intact).
    """
    import h5py
    import lmdb

    made: list[str] = []
    bogus_cases: list[tuple[str, str, str]] = []

    def path(name: str) -> str:
        p = os.path.join(work, "foreign-" + name)
        made.append(p)
        return p

    rng = np.random.default_rng(SEED)
    for size in (1, 100, 4096, 70000):
        with open(path(f"random-{size}"), "wb") as f:
            f.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(path("image.png"), "PNG")
    open(path("empty"), "wb").close()
    # LMDB header magic followed by garbage: passes the format sniff, nothing else.
    head = bytearray(rng.integers(0, 256, 8192, dtype=np.uint8).tobytes())
    struct.pack_into("<I", head, 16, 0xBEEFC0DE)
    with open(path("lmdb-magic-garbage"), "wb") as f:
        f.write(head)
    with open(path("hdf5-signature-garbage"), "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + rng.integers(0, 256, 3000, dtype=np.uint8).tobytes())
    env = lmdb.open(path("other.lmdb"), subdir=False, map_size=1 << 20)
    with env.begin(write=True) as txn:
        for i in range(50):
            txn.put(f"key{i}".encode(), os.urandom(100))
        txn.put(b"__meta__", b'{"format": "somebody-else"}')
    env.close()
    env = lmdb.open(path("lmdb-folder"), map_size=1 << 20)  # classic LMDB: a folder of data.mdb
    with env.begin(write=True) as txn:
        txn.put(b"a", b"b")
    env.close()
    with h5py.File(path("other.h5"), "w") as f:
        f.create_dataset("data", data=np.arange(100))
        f.attrs["shardkit_meta"] = np.bytes_(b"not json {")
    with h5py.File(path("other2.h5"), "w") as f:
        f.create_dataset("images", data=np.zeros((4, 8, 8, 3), np.uint8), chunks=(1, 8, 8, 3),
                         compression="gzip")
    os.mkfifo(path("fifo"))
    os.mkdir(path("dir.lmdb"))
    os.symlink("/nonexistent/store", path("dangling"))

    # Folder stores with a bogus manifest (copies of the LMDB folder store).
    folder = pristine["lmdb-sharded"]
    with open(os.path.join(folder, "manifest.json"), "rb") as f:
        manifest = json.loads(f.read())

    def bogus(name: str, edit=None, text: bytes | None = None, keep_seal: bool = False) -> str:
        p = os.path.join(work, "bogus-" + name)
        bogus_cases.append((p, "lmdb-sharded", f"bogus folder store: {name}"))
        shutil.copytree(folder, p)
        if text is None:
            m = json.loads(json.dumps(manifest))
            edit(m)
            text = json.dumps(m if keep_seal else seal(m)).encode()
        with open(os.path.join(p, "manifest.json"), "wb") as f:
            f.write(text)
        return p

    bogus("not-json", text=b"\x80\x04\x95 not json at all")
    bogus("empty-manifest", text=b"")
    bogus("json-list", text=b"[1, 2, 3]")
    bogus("nan", text=json.dumps(manifest).replace('"count": 12', '"count": NaN').encode())
    bogus("stale-seal", lambda m: m.update(classes=["x", "y"], class_to_idx={"x": 0, "y": 1}),
          keep_seal=True)
    bogus("other-classes", lambda m: m.update(classes=["x", "y"], class_to_idx={"x": 0, "y": 1}))
    bogus("escape-path", lambda m: m["shards"][0].update(file="../../../../etc/passwd"))
    bogus("labels-escape", lambda m: m["labels"].update(file="/etc/passwd"))
    bogus("swapped-shards", lambda m: m["shards"].reverse())
    bogus("wrong-count", lambda m: m["shards"][0].update(count=m["shards"][0]["count"] + 1))
    bogus("huge-count", lambda m: (m.update(count=10**12), m["shards"][1].update(count=10**12)))
    bogus("negative", lambda m: (m["shards"][0].update(count=-5), m["shards"][1].update(start=-5)))
    bogus("wrong-bytes", lambda m: m["shards"][1].update(bytes=123))
    bogus("wrong-sha", lambda m: m["shards"][1].update(sha256="0" * 64))
    bogus("wrong-labels-sha", lambda m: m["labels"].update(sha256="0" * 64))
    bogus("wrong-format", lambda m: m["shards"][0].update(format="hdf5"))
    bogus("string-count", lambda m: m.update(count="12"))
    p = bogus("fifo-shard", lambda m: m["shards"][0].update(file="fifo", bytes=0))
    os.mkfifo(os.path.join(p, "fifo"))
    p = bogus("fifo-manifest", text=b"{}")
    os.unlink(os.path.join(p, "manifest.json"))
    os.mkfifo(os.path.join(p, "manifest.json"))
    p = bogus("shard-is-dir", lambda m: m["shards"][0].update(file="sub", bytes=4096))
    os.mkdir(os.path.join(p, "sub"))
    p = bogus("missing-shard", lambda m: None)
    os.unlink(os.path.join(p, manifest["shards"][1]["file"]))
    p = bogus("no-manifest", lambda m: None)
    os.unlink(os.path.join(p, "manifest.json"))
    # A folder store whose shard is the other format's valid shard of the same data.
    p = bogus("foreign-shard", lambda m: None)
    shutil.copyfile(os.path.join(pristine["hdf5-sharded"], "shard-00000.h5"),
                    os.path.join(p, manifest["shards"][0]["file"]))
    # A single-file path that is one shard of a folder store.
    made.append(os.path.join(pristine["hdf5-sharded"], "shard-00001.h5"))
    return made, bogus_cases


# -- the test -------------------------------------------------------------------------------------

def test_damaged_and_foreign_stores_fail_cleanly(pristine, tmp_path):
    work = str(tmp_path / "work")
    os.makedirs(work)
    reference, fatal = run_batch(list(pristine.values()), str(tmp_path))
    assert not fatal, fatal
    for name, path in pristine.items():
        assert "digest" in reference[path] and reference[path]["verify_rc"] == 0, reference[path]
    expected = {name: reference[path]["digest"] for name, path in pristine.items()}

    cases = _damaged_copies(pristine, work)
    foreign, bogus = _foreign(pristine, work)
    cases += bogus
    describe = {path: (name, what) for path, name, what in cases}
    paths = [c[0] for c in cases] + foreign
    results: dict[str, dict] = {}
    with ThreadPoolExecutor(2) as pool:  # two children at a time
        batches = [paths[i:i + BATCH] for i in range(0, len(paths), BATCH)]
        for got, died in pool.map(lambda batch: run_batch(batch, str(tmp_path)), batches):
            results.update(got)
            fatal.update(died)

    failures = [f"{describe.get(p, ('foreign', p))}: {why}" for p, why in fatal.items()]
    counts = {"error": 0, "intact": 0}
    per_format = dict.fromkeys(FORMATS, 0)
    for path, res in results.items():
        name, what = describe.get(path, (None, os.path.basename(path)))
        if name is not None and not what.startswith("bogus"):
            per_format[STORES[name][0]] += 1
        if "bad" in res:
            failures.append(f"{what}: unexpected failure: {res['bad']}")
            continue
        if res.get("verify_rc") not in (0, 1):
            failures.append(f"{what}: shardkit verify exit status {res.get('verify_rc')}")
        if res.get("verify_rc") == 1 and not res.get("verify_msg", "").strip():
            failures.append(f"{what}: shardkit verify failed without a message")
        if name is None:  # foreign input: must be refused, by the Dataset and by verify
            if "digest" in res or res.get("verify_rc") != 1:
                failures.append(f"foreign input {what} was accepted: {res}")
            continue
        if "digest" in res:
            if res["digest"] != expected[name]:
                failures.append(f"{name} {what}: SILENTLY DIFFERENT DATA with verify=True")
            else:
                counts["intact"] += 1
        else:
            counts["error"] += 1
        if res.get("verify_rc") == 0 and res.get("digest") != expected[name]:
            failures.append(f"{name} {what}: shardkit verify passed a store that reads "
                            f"differently: {res.get('error')}")
    print(f"damaged stores: {per_format} (+{len(bogus)} bogus folder stores, {len(foreign)} "
          f"foreign inputs); "
          f"refused {counts['error']}, read intact {counts['intact']}, failures {len(failures)}")
    assert min(per_format.values()) >= 50
    assert not failures, "\n\n".join(failures[:20])
    assert counts["error"] > len(cases) // 2  # the damage was real


# -- a record whose JPEG header lies about its size ----------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_record_claiming_a_huge_image_is_refused_without_allocating_it(pristine, tmp_path, fmt):
    """Record 0's JPEG header is changed to claim 65280 x 65280 pixels (same length, so the store
    stays well-formed). simplejpeg sizes its output from the header: 12 GB, then a "premature
    end" error. Every read path must refuse it with StoreError naming the shard and the record,
    within a 2 GiB address space, and ``shardkit verify`` must report it."""
    from shardkit.formats import open_reader

    store = str(tmp_path / f"single-{fmt}")
    shutil.copyfile(pristine[f"{fmt}-single"], store)
    reader = open_reader(store)
    with reader.records() as get:
        record = bytes(get(0))
    reader.close()
    sof = record.index(b"\xff\xc0")  # baseline SOF0: length, precision, height, width
    assert struct.unpack_from(">HH", record, sof + 5) == (30, 41)
    damaged = record[:sof + 5] + struct.pack(">HH", 0xFF00, 0xFF00) + record[sof + 9:]
    with open(store, "rb") as f:
        data = f.read()
    assert data.count(record) == 1
    with open(store, "r+b") as f:
        f.seek(data.index(record))
        f.write(damaged)

    res = run_program("huge_header_reader", store, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    outcomes = json.loads(res.stdout.splitlines()[-1])
    assert len(outcomes) == 8
    for msg in outcomes:
        assert "shard 0" in msg and "record 0" in msg and "does not decode" in msg, outcomes
    cli = subprocess.run([sys.executable, "-m", "shardkit.cli", "verify", store],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and "record 0" in cli.stderr + cli.stdout, cli


# -- labels.npy that agrees with its manifest but not with the shards ----------------------------

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shards", [1, 2])
def test_verify_compares_labels_npy_with_the_shards(tmp_path, fmt, shards):
    """labels.npy rewritten with every label wrong, and its SHA-256 in the (resealed) manifest
    updated to match: only comparing it with the labels inside the shards can tell."""
    out = str(tmp_path / "store")
    shardkit.pack(source_tree(str(tmp_path / "src")), out, format=fmt, size=32, workers=1,
                  num_shards=shards, progress=False)
    assert shardkit.verify(out).ok
    labels_path = os.path.join(out, "labels.npy")
    labels = np.load(labels_path, allow_pickle=False)
    assert sorted(set(labels.tolist())) == [0, 1]
    np.save(labels_path, 1 - labels, allow_pickle=False)
    vouch_for_labels(out)
    assert shardkit.ShardDataset(out).targets.tolist() == (1 - labels).tolist()  # accepted

    report = shardkit.verify(out)
    assert report.faults == ["labels.npy disagrees with the labels stored in the shards"]
    cli = subprocess.run([sys.executable, "-m", "shardkit.cli", "verify", out],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and "labels.npy disagrees" in cli.stdout + cli.stderr, cli


# -- no code execution from a store, and version refusal -----------------------------------------

class _Payload:
    """Unpickling this creates the marker file: proof that a pickle was executed."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _set_meta_raw(path: str, raw: bytes) -> None:
    """Replace a single-file store's metadata bytes, as an outside tool would."""
    with open(path, "rb") as f:
        is_hdf5 = f.read(8) == b"\x89HDF\r\n\x1a\n"
    if is_hdf5:
        import h5py

        with h5py.File(path, "r+") as h:
            h.attrs["shardkit_meta"] = np.void(raw)
        return
    import lmdb

    env = lmdb.open(path, subdir=False, lock=False, map_size=os.path.getsize(path) + (16 << 20))
    with env.begin(write=True) as txn:
        txn.put(b"__meta__", raw)
    env.close()


def _read_in_children(paths: list[str]) -> dict[str, str]:
    """Open and read each store in one child process: {path: "ok" or "refused: <message>"}."""
    res = run_program("read_stores", *paths, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.splitlines()[-1])


@pytest.mark.parametrize("fmt", FORMATS)
def test_pickle_in_metadata_is_refused_and_never_executed(pristine, tmp_path, fmt):
    marker = str(tmp_path / "pwned")
    payload = pickle.dumps(_Payload(marker), protocol=2)
    assert b"system" in payload
    # The unpickler would run it (sanity check of the payload, in a child process).
    sanity = tmp_path / "sanity"
    run_program("unpickle_stdin", input=pickle.dumps(_Payload(str(sanity)), protocol=2),
                check=True, timeout=60)
    assert sanity.exists()

    store = str(tmp_path / f"single.{fmt}")
    shutil.copyfile(pristine[f"{fmt}-single"], store)
    _set_meta_raw(store, payload)
    # labels.npy of a folder store replaced by a pickled object array whose checksum the
    # manifest even agrees with: numpy must refuse to unpickle it.
    folder = str(tmp_path / f"folder-{fmt}")
    shutil.copytree(pristine[f"{fmt}-sharded"], folder)
    labels = os.path.join(folder, "labels.npy")
    np.save(labels, np.array([_Payload(marker)] * 12, dtype=object), allow_pickle=True)
    vouch_for_labels(folder)
    # manifest.json itself replaced by a pickle
    folder2 = str(tmp_path / f"folder2-{fmt}")
    shutil.copytree(pristine[f"{fmt}-sharded"], folder2)
    with open(os.path.join(folder2, "manifest.json"), "wb") as f:
        f.write(payload)

    got = _read_in_children([store, folder, folder2])
    assert got[store].startswith("refused") and "metadata is not valid JSON" in got[store], got
    assert got[folder].startswith("refused") and "labels" in got[folder], got
    assert got[folder2].startswith("refused") and "not valid JSON" in got[folder2], got
    cli = subprocess.run([sys.executable, "-m", "shardkit.cli", "verify", store],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and "Traceback" not in cli.stderr
    assert not os.path.exists(marker)


@pytest.mark.parametrize("fmt", FORMATS)
def test_future_format_version_is_refused_with_both_versions_named(pristine, tmp_path, fmt):
    store = str(tmp_path / f"single.{fmt}")
    shutil.copyfile(pristine[f"{fmt}-single"], store)
    reader_meta = Store(store).meta
    _set_meta_raw(store, json.dumps(seal(dict(reader_meta, format_version=7))).encode())
    with pytest.raises(StoreError) as err:
        Store(store)
    msg = str(err.value)
    assert "version 7" in msg and "supports version 1" in msg, msg
    res = subprocess.run([sys.executable, "-m", "shardkit.cli", "info", store],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "version 7" in res.stderr and "1" in res.stderr, res

    folder = str(tmp_path / f"folder-{fmt}")
    shutil.copytree(pristine[f"{fmt}-sharded"], folder)
    manifest_path = os.path.join(folder, "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    with open(manifest_path, "w") as f:
        json.dump(seal(dict(manifest, format_version=9)), f)  # 2 (fields), 3 (layout) exist
    with pytest.raises(StoreError, match=r"version 9 .*supports version 1, 2, 3"):
        shardkit.ShardDataset(folder)
