"""Issue 28, points 1, 2 and 5 on a real cluster (``dask scheduler`` + ``dask worker`` processes
on 127.0.0.1, one for the module): the plan on disk (a task's payload is its shard number and
the plan folder, O(1) in sources), listing in tasks in ImageFolder's order, labels and layout
merged from the plan; every store byte-identical to the local engine's."""

from __future__ import annotations

import os
import pickle
import tarfile

import numpy as np
import pytest

import shardkit
from shardkit.errors import PackError
from shardkit.packing import discovery
from shardkit.packing.plan import make_plan
from shardkit.packing.settings import PackSettings
from shardkit.packing.sources import SourceOptions, resolve

from helpers import image_tree, imagefolder_reference, jpeg_bytes, noise, write_bytes
from helpers.scaleout import store_files

distributed = pytest.importorskip("dask.distributed")
from helpers.dask_cluster import dask_cluster  # noqa: E402

ARGS = {"size": 16, "num_shards": 4, "progress": False}


@pytest.fixture(scope="module")
def scheduler():
    with dask_cluster(2) as (address, _):
        yield address


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("src"))
    image_tree(root, classes=3, per_class=8, seed=5, pngs=1, sides=(16, 24))
    return root


def _lists(src: str, folder: str) -> dict[str, str]:
    """File lists over ``src``: integer labels and class names (with a header row)."""
    rels = sorted(os.path.relpath(os.path.join(d, f), src)
                  for d, _, fs in os.walk(src) for f in fs)
    ints, names = os.path.join(folder, "ints.csv"), os.path.join(folder, "names.tsv")
    with open(ints, "w") as f:
        f.writelines(f"{rel},{(7 * i) % 5}\n" for i, rel in enumerate(rels))
    with open(names, "w") as f:
        f.write("path\tclass\n")
        f.writelines(f"{rel}\t{['moth', 'ant', 'bee'][i % 3]}\n" for i, rel in enumerate(rels))
    return {"ints": ints, "names": names}


def _tars(src: str, folder: str) -> str:
    """The folder's images as two WebDataset tars (``key.jpg``/``.png`` + ``key.cls``)."""
    out = os.path.join(folder, "tars")
    os.makedirs(out)
    found = discovery.discover(src)
    for t in range(2):
        with tarfile.open(os.path.join(out, f"part-{t}.tar"), "w") as tar:
            for n, (path, label) in enumerate(found.samples[t::2]):
                key = f"s{t}{n:03d}"
                tar.add(path, f"{key}{os.path.splitext(path)[1]}")
                cls = os.path.join(folder, "cls")
                with open(cls, "w") as f:
                    f.write(str(label))
                tar.add(cls, f"{key}.cls")
    return out


def test_stores_equal_the_local_engines(src, scheduler, tmp_path):
    """Folder, file lists (integer and name labels), COCO and tars: the cluster's store is the
    local engine's, file for file (manifest, labels.npy, layout.npy, shards)."""
    from helpers.coco import make_coco

    lists = _lists(src, str(tmp_path))
    images, coco = make_coco(str(tmp_path / "coco"), count=8, seed=2)
    cases = {"folder": (src, {}), "ints": (src, {"file_list": lists["ints"]}),
             "names": (src, {"file_list": lists["names"]}),
             "coco": (images, {"coco": coco, "coco_masks": False}),
             "tars": (_tars(src, str(tmp_path)), {"num_shards": 2})}
    for name, (root, extra) in cases.items():
        local, dask = str(tmp_path / f"{name}-local"), str(tmp_path / f"{name}-dask")
        kwargs = ARGS | extra
        shardkit.pack(root, local, workers=1, **kwargs)
        shardkit.pack(root, dask, engine="dask", scheduler=scheduler, **kwargs)
        assert store_files(dask) == store_files(local), name
        if name in ("folder", "ints"):  # several shards: the mixed layout was merged
            assert "layout.npy" in store_files(dask)
    ds = shardkit.ShardDataset(str(tmp_path / "names-dask"))
    assert ds.classes == ["ant", "bee", "moth"]
    assert ds.targets.tolist() == [[2, 0, 1][i % 3] for i in range(len(ds))]


def test_skipped_sources_leave_the_merge_exact(src, scheduler, tmp_path):
    """Unreadable images skipped by the shards: labels.npy and layout.npy (merged from the plan
    and the entries' skipped slots, not read from the shards) still equal the local engine's."""
    bad = str(tmp_path / "src")
    image_tree(bad, classes=3, per_class=8, seed=5, pngs=1, sides=(16, 24))
    for rel in ("c0/img002.jpg", "c2/img005.jpg", "c2/img000.jpg"):
        write_bytes(os.path.join(bad, rel), b"\xff\xd8\xff not a jpeg")
    local, dask = str(tmp_path / "local"), str(tmp_path / "dask")
    assert shardkit.pack(bad, local, workers=1, **ARGS).count == 21
    assert shardkit.pack(bad, dask, engine="dask", scheduler=scheduler, **ARGS).count == 21
    assert store_files(dask) == store_files(local)
    # ...and they are right: record i is the i-th source that was packed, with its label.
    broken = {"c0/img002.jpg", "c2/img005.jpg", "c2/img000.jpg"}
    kept = [(os.path.relpath(p, bad), t) for p, t in discovery.discover(bad).samples
            if os.path.relpath(p, bad) not in broken]
    ds = shardkit.ShardDataset(dask)
    assert [ds.source_path(i) for i in range(len(ds))] == [p for p, _ in kept]
    assert ds.targets.tolist() == [t for _, t in kept]


def _plan(root: str, folder: str, file_list: str | None = None, **kw):
    options = SourceOptions(root, file_list=file_list)
    scan = resolve(options).scan_into(options, folder)
    return make_plan(scan, PackSettings(size=16), folder, **kw)


def test_a_task_payload_is_o1_in_sources(src, tmp_path):
    """A 5,000-source plan pickles (as a Dask task's argument) to under 2 KB, the same as a
    50-source one: no path or label travels; the task reads its slice from the plan folder."""
    sizes = {}
    for n in (50, 5000):
        listing = str(tmp_path / f"list{n}.csv")
        rels = [os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs]
        with open(listing, "w") as f:
            f.writelines(f"{rels[i % len(rels)]},{i % 7}\n" for i in range(n))
        plan = _plan(src, str(tmp_path / f"plan{n}"), listing, num_shards=10)
        payload = pickle.dumps((plan, 3, "/x/shard-00003.lmdb"))
        sizes[n] = len(payload)
        again = pickle.loads(payload)[0]
        first, end = plan.bounds[3], plan.bounds[4]
        assert again.rows(3) == plan.rows(3)  # sources, paths, labels and items
        assert [again.labels[i] for i in range(first, end)] == \
            [plan.labels[i] for i in range(first, end)]
        # Nothing per source held by the plan object itself.
        assert not any(isinstance(v, (list, tuple, np.ndarray)) and len(v) >= n
                       for v in vars(plan).values())
    assert sizes[5000] < 2048 and sizes[5000] - sizes[50] < 64, sizes


def test_a_shards_rows_are_read_at_once_as_its_slots(tree, tmp_path):
    """``PackPlan.rows(k)`` (what a shard task reads, in a few reads) gives each slot's source,
    path, label and item exactly as the per-slot accessors do, in the mixed layout (scattered
    sources) and in the sources' order (one contiguous range), odd and non-UTF-8 names too."""
    odd = os.path.join(tree, "big", os.fsdecode(b"bad-\xff-name.jpg"))
    with open(os.path.join(tree, "big", "x", "a.jpg"), "rb") as f, open(odd, "wb") as g:
        g.write(f.read())
    try:
        for order in ("mixed", "source"):
            plan = _plan(tree, str(tmp_path / order), num_shards=5, order=order)
            assert plan.table.mixed == (order == "mixed")
            seen = []
            for k in range(plan.num_shards):
                rows, items = plan.rows(k)
                slots = range(plan.bounds[k], plan.bounds[k + 1])
                assert rows.sources == [plan.source_index(i) for i in slots]
                assert rows.paths == [plan.paths[i] for i in slots] == items  # files: paths
                assert rows.labels == [plan.labels[i] for i in slots]
                seen += rows.paths
            assert odd in seen and len(seen) == len(set(seen)) == plan.count
    finally:
        os.remove(odd)


def test_resume_refuses_a_changed_plan(src, scheduler, tmp_path):
    """The fingerprint, read from the plan's files in chunks, refuses a resume after one label
    changed, and accepts the same sources again (node 0 of 2 leaves the partial folder)."""
    lists = _lists(src, str(tmp_path))
    out = str(tmp_path / "out")
    kw = ARGS | {"engine": "dask", "scheduler": scheduler, "file_list": lists["ints"]}
    shardkit.pack(src, out, num_nodes=2, node_rank=0, **kw)
    with open(lists["ints"]) as f:
        rows = f.read().splitlines()
    path, label = rows[-1].rsplit(",", 1)
    changed = str(tmp_path / "changed.csv")
    with open(changed, "w") as f:
        f.write("\n".join(rows[:-1] + [f"{path},{(int(label) + 1) % 5}"]) + "\n")
    with pytest.raises(PackError, match="cannot resume"):
        shardkit.pack(src, out, resume=True, **(kw | {"file_list": changed}))
    result = shardkit.pack(src, out, resume=True, **kw)  # the same plan: node 1's shards added
    assert result.count == 24 and os.path.isdir(out)


def test_a_damaged_plan_stops_the_pack_at_its_first_attempt(src, scheduler, tmp_path, capsys):
    """A plan file damaged after the client made the plan (``labels.bin`` cut short): each
    worker checks the plan against its seal before reading it, and the pack stops with the
    plan's one line at the first attempt, no shard run again (a read error would have been
    retried, then sent the user to a resume that fails the same way)."""
    from shardkit.packing.dask_engine import run_dask

    plan = _plan(src, str(tmp_path / "plan"), num_shards=4)
    labels = os.path.join(plan.folder, "labels.bin")
    os.truncate(labels, os.path.getsize(labels) - 4)
    done: dict = {}
    capsys.readouterr()
    with pytest.raises(PackError, match=rf"^the pack's plan in {plan.folder} is damaged "
                       r"\(labels.bin does not match .*\); pack again with `overwrite=True` "
                       "to start over$"):
        run_dask(plan, list(range(4)), {k: str(tmp_path / f"s{k}.lmdb") for k in range(4)},
                 scheduler=scheduler, progress=False, on_shard_done=done.__setitem__)
    assert done == {}
    assert "running it again" not in capsys.readouterr().err


def test_fingerprint_is_the_sources_relative_to_the_root(src, tmp_path):
    """As before: the same tree under another root has the same fingerprint (a moved folder
    resumes); another order of the same files does not."""
    import shutil

    moved = str(tmp_path / "moved")
    shutil.copytree(src, moved)
    a = _plan(src, str(tmp_path / "a"), num_shards=3)
    b = _plan(moved, str(tmp_path / "b"), num_shards=3)
    assert a.plan_id() == b.plan_id()
    c = _plan(src, str(tmp_path / "c"), num_shards=3, layout_seed=1)
    assert c.plan_id() != a.plan_id()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> str:
    """Nested folders, names that sort across levels ('x', 'x-y', 'x/z': '-' < '/'), odd names,
    files that are not images, and a class with enough subfolders to be listed by several
    tasks."""
    root = str(tmp_path_factory.mktemp("tree") / "src")
    data = jpeg_bytes(noise(np.random.default_rng(0), 8, 8))
    names = ["x/a.jpg", "x-y/b.JPG", "x/z/c.png", "x/z/d.txt", "x.y/e.jpeg", "é 图/f.webp",
             "top.jpg", ".hidden.png", "deep/1/2/3/g.jpg"]
    for k in range(discovery.SPLIT_DIRS + 5):
        names += [f"s{k:02d}/h{k}.jpg", f"s{k:02d}-b/i{k}.jpg"]
        if k % 4 == 0:
            names.append(f"s{k:02d}/n/j{k}.png")
    for cls in ("big", "small"):
        for name in (names if cls == "big" else names[:6]):
            write_bytes(os.path.join(root, cls, name), data)
    write_bytes(os.path.join(root, "small", "notes.txt"), b"not an image")
    return root


def test_listing_in_tasks_is_imagefolders_order(tree, scheduler, tmp_path):
    """The cluster's listing (a task per class, then per CHUNK_DIRS subfolders of the big class)
    gives torchvision's ImageFolder samples exactly; a symlink loop inside a subfolder listed
    by another task is caught at its first repeat, as a serial walk catches it."""
    from shardkit.packing.dask_engine import DaskSession

    classes, class_to_idx, samples = imagefolder_reference(tree)
    loopy = str(tmp_path / "loopy")
    for k in range(discovery.SPLIT_DIRS):
        write_bytes(os.path.join(loopy, "cls", f"s{k:02d}", "a.jpg"), b"x")
    os.symlink(os.path.join(loopy, "cls"), os.path.join(loopy, "cls", "s03", "back"))
    with DaskSession(scheduler) as session:
        tasks = []

        def counting(fn, args):
            tasks.append(len(args))
            return session.lister(fn, args)

        found = discovery.list_folder(tree, str(tmp_path / "plan"), lister=counting)
        looped = discovery.list_folder(loopy, str(tmp_path / "plan2"), lister=session.lister)
    assert tasks[0] == 2 and tasks[1] >= 3  # the big class's subfolders: several tasks
    assert found.classes == classes and found.class_to_idx == class_to_idx
    assert discovery.read_back(found, str(tmp_path / "plan")).samples == samples
    assert found.skipped == []
    back = os.path.join(loopy, "cls", "s03", "back")
    assert looped.skipped == [{"path": back, "reason": "symlink loop: folder already on this path"}]
    assert looped.count == discovery.SPLIT_DIRS
