"""LMDB's page structure attacked directly (node offsets, key counts, key and record sizes, child
page numbers, meta pages of the live B-tree): the fields LMDB trusts blindly, which without
shardkit's checks (``shardkit.formats.lmdb.validate``) crash the reader (SIGBUS/SIGSEGV).
"""

from __future__ import annotations

import os
import shutil
import struct

import pytest

from helpers.damage import pack_pristine, run_batch


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, str]:
    return pack_pristine(str(tmp_path_factory.mktemp("pristine")))


def _lmdb_attacks(path: str, work: str, tag: str) -> list[str]:
    """Copies of an LMDB shard with the fields LMDB trusts blindly set to extreme values: a node
    offset, the key count, a key size, a record's size (inline or on overflow pages), a child
    page number. Unguarded, several of these make LMDB or the reader touch memory past the end of
    the file (SIGBUS) -- found by a byte-by-byte sweep during development."""
    with open(path, "rb") as f:
        data = f.read()
    psize = struct.unpack_from("<I", data, 40)[0]
    last_pg = max(struct.unpack_from("<Q", data, off + 136)[0] for off in (0, psize))
    made = []

    def variant(name: str, edits: list[tuple[int, bytes]]) -> None:
        b = bytearray(data)
        for pos, raw in edits:
            b[pos:pos + len(raw)] = raw
        p = os.path.join(work, f"lmdb-attack-{tag}-{name}")
        with open(p, "wb") as f:
            f.write(b)
        made.append(p)

    # The live B-tree: from the root of the newest meta page down through branch pages (older
    # copies of pages, left by copy-on-write, are never read and not worth attacking).
    newest = max((0, psize), key=lambda off: struct.unpack_from("<Q", data, off + 144)[0])
    todo, leaves, branches = [struct.unpack_from("<Q", data, newest + 128)[0]], [], []
    while todo:
        pg = todo.pop(0)
        start = pg * psize
        flags, lower = struct.unpack_from("<HH", data, start + 10)
        ptrs = struct.unpack_from(f"<{(lower - 16) // 2}H", data, start + 16)
        if flags & 0x01:
            branches.append(pg)
            todo += [int.from_bytes(data[start + off:start + off + 6], "little") for off in ptrs]
        elif flags & 0x02:
            leaves.append(pg)
    assert leaves, "no leaf page found"
    for pg in sorted({leaves[0], leaves[len(leaves) // 2], leaves[-1]}):
        start = pg * psize
        lower = struct.unpack_from("<H", data, start + 12)[0]
        ptrs = struct.unpack_from(f"<{(lower - 16) // 2}H", data, start + 16)
        variant(f"p{pg}-offset-high", [(start + 17, bytes([data[start + 17] | 0x80]))])
        variant(f"p{pg}-offset-max", [(start + 16, b"\xff\xff")])
        variant(f"p{pg}-keycount-max", [(start + 12, b"\xff\xff")])
        variant(f"p{pg}-keycount-zero", [(start + 12, b"\x00\x00")])
        variant(f"p{pg}-leaf2-flag", [(start + 10, b"\x22\x00")])
        for j, off in enumerate(ptrs[:3]):
            node = start + off
            variant(f"p{pg}-n{j}-ksize-max", [(node + 6, b"\xff\xff")])
            variant(f"p{pg}-n{j}-size-huge", [(node + 2, b"\xff\x7f")])
            variant(f"p{pg}-n{j}-size-past-end", [(node + 2, b"\x10\x00")])
            variant(f"p{pg}-n{j}-bigdata-flag", [(node + 4, b"\x01\x00")])
            variant(f"p{pg}-n{j}-dupdata-flag", [(node + 4, b"\x04\x00")])
    for pg in branches[:2]:
        start = pg * psize
        lower = struct.unpack_from("<H", data, start + 12)[0]
        off = struct.unpack_from("<H", data, start + 16)[0]
        variant(f"b{pg}-child-past-end", [(start + off, struct.pack("<HH", 0xFFFF, 0x00FF))])
        variant(f"b{pg}-child-meta", [(start + off, b"\x00\x00\x00\x00")])
        variant(f"b{pg}-keycount-max", [(start + 12, b"\xff\xff")])
    # The meta pages: page size, last page, root.
    for meta in (0, psize):
        variant(f"m{meta}-last-page-huge", [(meta + 136, struct.pack("<Q", 1 << 50))])
        variant(f"m{meta}-root-past-end", [(meta + 128, struct.pack("<Q", last_pg + 5))])
        variant(f"m{meta}-psize-odd", [(meta + 40, struct.pack("<I", 4097))])
    return made


def test_lmdb_page_structure_attacks_fail_cleanly(pristine, tmp_path):
    work = str(tmp_path / "work")
    os.makedirs(work)
    folder = pristine["lmdb-sharded"]  # raw records: stored on overflow pages
    shard = next(os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".lmdb"))
    paths = _lmdb_attacks(pristine["lmdb-single"], work, "single")
    # The shard file is read as a folder store: copy the folder around each damaged shard.
    for p in _lmdb_attacks(shard, work, "shard"):
        dst = p + "-store"
        shutil.copytree(folder, dst)
        shutil.copyfile(p, os.path.join(dst, os.path.basename(shard)))
        paths.append(dst)
    reference, _ = run_batch(list(pristine.values()), str(tmp_path))
    expected = {path: reference[path]["digest"] for path in pristine.values()}
    results, fatal = run_batch(paths, str(tmp_path))
    failures = [f"{os.path.basename(p)}: {why}" for p, why in fatal.items()]
    for path, res in results.items():
        original = pristine["lmdb-single"] if "-single-" in path else folder
        if "bad" in res:
            failures.append(f"{os.path.basename(path)}: {res['bad']}")
        elif "digest" in res and res["digest"] != expected[original]:
            failures.append(f"{os.path.basename(path)}: silently different data")
        elif res.get("verify_rc") == 0 and res.get("digest") != expected[original]:
            failures.append(f"{os.path.basename(path)}: verify passed a damaged store")
    print(f"LMDB structure attacks: {len(paths)}, refused "
          f"{sum('error' in r for r in results.values())}, failures {len(failures)}")
    assert len(paths) >= 30
    assert not failures, "\n".join(failures)
