"""Discovery and labels follow torchvision's ImageFolder rules (restated in helpers, not imported)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from helpers import (imagefolder_reference, jpeg_bytes, noise, one_line_error, relpaths, run_cli,
                     run_program, sources_of, write_bytes)
from shardkit import ShardDataset
from shardkit.packing.discovery import IMG_EXTENSIONS, discover, read_file_list
from shardkit.errors import PackError
from shardkit.packing.api import pack


def test_extension_list_is_imagefolders():
    assert sorted(IMG_EXTENSIONS) == sorted(
        [".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"])


def test_reference_statement_sees_the_quirks(quirky):
    """The independent rules themselves pick up every quirk (so the comparisons below mean something)."""
    classes, class_to_idx, samples = imagefolder_reference(quirky.root, allow_empty=True)
    rel = dict(relpaths(samples, quirky.root))
    assert classes == quirky.classes
    assert class_to_idx == {"alpha": 0, "beta": 1, "delta": 2, "gamma": 3}
    assert set(rel) == set(quirky.expect) | set(quirky.skipped)
    for name in ("alpha/b_gray.JPG", "alpha/e_rgba.PNG", "beta/upper.TIFF", "beta/lossless.WebP",
                 "alpha/folder.jpg/x.png", "alpha/nested/deeper/inner.jpg",
                 "gamma/link/deeper/inner.jpg", "gamma/.hidden.png", "alpha/résumé_图像.jpg"):
        assert name in rel
    for name in quirky.ignored:
        assert name not in rel
    assert rel["gamma/g1.png"] == 3  # the empty class keeps its index 2


def test_discover_matches_imagefolder(quirky):
    found = discover(quirky.root, allow_empty=True)
    classes, class_to_idx, samples = imagefolder_reference(quirky.root, allow_empty=True)
    assert found.classes == classes
    assert found.class_to_idx == class_to_idx
    assert found.samples == samples  # same paths, same order, same labels


def test_empty_class_is_an_error_by_default(quirky):
    with pytest.raises(FileNotFoundError):
        imagefolder_reference(quirky.root)
    with pytest.raises(PackError, match="delta"):
        discover(quirky.root)


def test_pack_refuses_empty_class_without_allow_empty(quirky, tmp_path):
    out = tmp_path / "out.lmdb"
    with pytest.raises(PackError, match="delta"):
        pack(quirky.root, out, workers=1, progress=False)
    assert not out.exists()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_packed_labels_follow_imagefolder(quirky, pack_quirky, fmt):
    """classes, class_to_idx, and every record's label and source equal ImageFolder's, in order."""
    store = pack_quirky(fmt)
    classes, class_to_idx, samples = imagefolder_reference(quirky.root, allow_empty=True)
    expected = [(p, t) for p, t in relpaths(samples, quirky.root) if p not in quirky.skipped]
    ds = ShardDataset(store, output="bytes")
    assert ds.classes == classes
    assert ds.class_to_idx == class_to_idx
    assert len(ds) == len(expected)
    got = [(ds.source_path(i), ds[i][1]) for i in range(len(ds))]
    assert got == expected
    assert isinstance(ds.targets, np.ndarray)
    assert ds.targets.tolist() == [t for _, t in expected]
    assert sources_of(store) == [p for p, _ in expected]
    ds.close()


def test_allow_empty_keeps_class_without_shifting_indices(quirky, pack_quirky):
    ds = ShardDataset(pack_quirky("lmdb"))
    assert ds.classes[2] == "delta"
    assert 2 not in set(ds.targets.tolist())
    assert {ds.source_path(i) for i in range(len(ds)) if ds.targets[i] == 3} == {
        "gamma/g1.png", "gamma/.hidden.png", "gamma/link/z_top.jpeg",
        "gamma/link/deeper/inner.jpg"}


def test_symlink_loop_terminates_and_is_reported(tmp_path):
    """torchvision would recurse until paths overflow; shardkit stops and reports the loop."""
    src = tmp_path / "src"
    write_bytes(str(src / "a" / "one.jpg"), jpeg_bytes(noise(np.random.default_rng(0), 8, 8)))
    os.symlink("..", src / "a" / "loop")  # a/loop -> a
    found = discover(str(src))
    assert [os.path.relpath(p, src) for p, _ in found.samples] == ["a/one.jpg"]
    assert any("loop" in s["reason"] for s in found.skipped)


def test_class_folder_symlink_is_a_class(tmp_path):
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere"
    rng = np.random.default_rng(0)
    write_bytes(str(elsewhere / "x.jpg"), jpeg_bytes(noise(rng, 8, 8)))
    write_bytes(str(src / "b" / "y.jpg"), jpeg_bytes(noise(rng, 8, 8)))
    os.symlink(elsewhere, src / "a")
    (src / "not_a_class.jpg").write_bytes(b"x")
    classes, _, samples = imagefolder_reference(str(src))
    found = discover(str(src))
    assert found.classes == classes == ["a", "b"]
    assert found.samples == samples


def test_missing_or_classless_source(tmp_path):
    with pytest.raises(PackError, match="not found"):
        discover(str(tmp_path / "nope"))
    (tmp_path / "flat.jpg").write_bytes(b"x")
    with pytest.raises(PackError, match="no class folders"):
        discover(str(tmp_path))


# -- --file-list ----------------------------------------------------------------------------------

def _flat_images(root: str, count: int) -> list[str]:
    """``count`` small JPEGs in one folder; their paths relative to ``root``."""
    rng = np.random.default_rng(4)
    rels = [f"img/{i:03d}.jpg" for i in range(count)]
    for rel in rels:
        write_bytes(os.path.join(root, rel), jpeg_bytes(noise(rng, 12, 12)))
    return rels


def test_file_list_excel_csv_utf8_keeps_integer_labels(tmp_path):
    """Excel's "CSV UTF-8" starts with a BOM, then the header; labels keep their numbers."""
    root = str(tmp_path / "root")
    rels = _flat_images(root, 6)
    labels = [2, 10, 0, 4, 10, 2]  # as strings, "10" would sort before "2"
    listing = tmp_path / "val.csv"
    listing.write_bytes(b"\xef\xbb\xbfpath,label\r\n" + "".join(
        f"{rel},{label}\r\n" for rel, label in zip(rels, labels)).encode())
    out = str(tmp_path / "val.lmdb")
    proc = run_cli("pack", root, out, "--file-list", str(listing), "--workers", "1", "-q")
    assert proc.returncode == 0, proc.stderr
    ds = ShardDataset(out, output="bytes")
    assert ds.classes == [str(i) for i in range(11)]
    assert ds.targets.tolist() == labels
    assert [ds.source_path(i) for i in range(len(ds))] == rels
    ds.close()


@pytest.mark.parametrize("header", ["image_id,category", "Datei\tKlasse", "\ufeffname,class name",
                                    "source,label,notes"])
def test_file_list_header_with_any_names(tmp_path, header):
    root = str(tmp_path / "root")
    rels = _flat_images(root, 3)
    sep = "\t" if "\t" in header else ","
    listing = tmp_path / "list.txt"
    listing.write_text(header + "\n" + "".join(f"{rel}{sep}{name}\n" for rel, name in
                                               zip(rels, ["moth", "ant", "moth"])),
                       encoding="utf-8")
    found = read_file_list(str(listing), root)
    assert found.classes == ["ant", "moth"]
    assert found.samples == [(os.path.join(root, rel), t) for rel, t in zip(rels, [1, 0, 1])]


def test_file_list_first_row_naming_a_file_is_data(tmp_path):
    """A first row whose path exists is a record, even with a class name (no header)."""
    root = str(tmp_path / "root")
    rels = _flat_images(root, 1)
    write_bytes(os.path.join(root, "file"), jpeg_bytes(noise(np.random.default_rng(1), 9, 9)))
    listing = tmp_path / "list.csv"
    listing.write_text(f"file,label\n{rels[0]},cat\n", encoding="utf-8")
    found = read_file_list(str(listing), root)
    assert found.classes == ["cat", "label"]
    assert found.samples == [(os.path.join(root, "file"), 1), (os.path.join(root, rels[0]), 0)]


def test_file_list_mixing_integers_and_names_is_refused(tmp_path):
    root = str(tmp_path / "root")
    rels = _flat_images(root, 3)
    listing = tmp_path / "list.csv"
    listing.write_text(f"{rels[0]},cat\n{rels[1]},10\n{rels[2]},2\n", encoding="utf-8")
    with pytest.raises(PackError, match="mixes integer labels and class names"):
        read_file_list(str(listing), root)


def test_file_list_not_utf8_is_one_line(tmp_path):
    root = str(tmp_path / "root")
    rels = _flat_images(root, 2)
    listing = tmp_path / "latin1.csv"
    listing.write_bytes(f"path,label\n{rels[0]},chat\n{rels[1]},".encode() + "café\n".encode(
        "latin-1"))
    out = tmp_path / "out.lmdb"
    proc = run_cli("pack", root, str(out), "--file-list", str(listing), "--workers", "1", "-q")
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr
    assert str(listing) in proc.stderr and "not UTF-8" in proc.stderr and "line 3" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("label", ["100000000000", "9" * 5000], ids=["1e11", "5000-digits"])
def test_file_list_huge_integer_label_is_refused_before_allocating(tmp_path, label):
    """A label that would make 1e11 class names (an id column, a typo) is one line, in a 2 GiB
    address space: refused before a class name is made."""
    root = str(tmp_path / "root")
    rels = _flat_images(root, 3)
    listing = tmp_path / "list.csv"
    listing.write_text(f"{rels[0]},0\n{rels[1]},{label}\n{rels[2]},1\n", encoding="utf-8")
    out = tmp_path / "out.lmdb"
    proc = run_program("limited_cli", "pack", root, str(out), "--file-list", str(listing),
                       "--workers", "1", "-q", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and one_line_error(proc.stderr), proc.stderr[-2000:]
    assert f"file list {listing} row 2: label " in proc.stderr, proc.stderr
    assert "must be below 65,536 (the larger of the 3 rows and 65,536)" in proc.stderr
    assert len(proc.stderr) < 400 and not out.exists()


def test_file_list_label_bound_is_the_row_count_or_65536(tmp_path):
    """Sparse labels up to 65,535 keep ImageFolder-exact numbering (classes 0..max); above that
    only a list with more rows than the label may use it."""
    from shardkit.packing.discovery import MAX_SPARSE_LABEL

    assert MAX_SPARSE_LABEL == 65536
    root = str(tmp_path / "root")
    rels = _flat_images(root, 2)
    listing = tmp_path / "list.csv"
    listing.write_text(f"{rels[0]},65535\n{rels[1]},007\n", encoding="utf-8")
    found = read_file_list(str(listing), root)
    assert found.classes == [str(i) for i in range(65536)]
    assert [t for _, t in found.samples] == [65535, 7]
    listing.write_text(f"{rels[0]},65536\n{rels[1]},-0\n", encoding="utf-8")
    with pytest.raises(PackError, match=r"row 1: label 65536 is too large.* below 65,536 "):
        read_file_list(str(listing), root)
    listing.write_text(f"{rels[0]},-3\n{rels[1]},1\n", encoding="utf-8")
    with pytest.raises(PackError, match=r"row 1: negative label -3$"):
        read_file_list(str(listing), root)
    # 70,000 rows (of two files): labels up to 69,999 are fine, 70,000 is not.
    lines = [f"{rels[i % 2]},{i}" for i in range(70_000)]
    listing.write_text("\n".join(lines) + "\n", encoding="utf-8")
    found = read_file_list(str(listing), root)
    assert len(found.classes) == 70_000 and found.samples[-1][1] == 69_999
    listing.write_text("\n".join(lines[:-1] + [f"{rels[1]},70000"]) + "\n", encoding="utf-8")
    with pytest.raises(PackError, match=r"row 70000: label 70000 is too large.* below 70,000 "
                                        r"\(the larger of the 70,000 rows and 65,536\)"):
        read_file_list(str(listing), root)
