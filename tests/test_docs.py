"""The documentation is checked like code: README.md, docs/*.md and benchmarks/README.md.

- every relative link and image resolves to a file, and an ``#anchor`` to a heading of the
  target page (GitHub's slug rules); repository paths quoted in code spans and shell blocks exist;
- every fenced ```python block compiles, its calls into shardkit name real functions with
  arguments their signatures accept, and it runs against small real stores (in a folder holding
  ``STORES``), as written or as the HTML comment above it says (a setup first, the torchvision
  environment, CUDA calls on the CPU), unless that comment says why it is not run
  (``<!-- not run: REASON -->``: a GPU cluster, a bucket); those are counted and shown;
- every ```bash block parses with ``bash -n``, and every ``shardkit ...`` (or
  ``benchmarks/throughput.py``) command line in it parses with the real CLI's argparse parser,
  without running the work;
- every ```diff block's added lines call shardkit as its signatures accept, and a diff with file
  headers applies to this repository (``git apply --check``).

``test_the_checks_catch_broken_docs`` shows each check failing on a broken page.
"""

from __future__ import annotations

import ast
import os
import re
import textwrap
import warnings

import pytest
from helpers.doccheck import (PAGES, ROOT, SETUPS, SHELL, STORES, Block, RunNote, block_job,
                              bash_problems, blocks, diff_problems, free_names, github_slug,
                              headings, link_problems, python_problems, read_text, run_blocks,
                              run_note, shell_commands, store_paths)

import shardkit

ALL_BLOCKS = [b for page in PAGES for b in blocks(page, read_text(os.path.join(ROOT, page)))]


def _of(langs):
    found = [b for b in ALL_BLOCKS if b.lang in langs]
    return pytest.mark.parametrize("block", found, ids=[str(b) for b in found])


@pytest.mark.parametrize("page", PAGES)
def test_links_anchors_and_paths_resolve(page):
    assert link_problems(page) == []


def test_every_docs_page_is_linked_from_the_readme_or_the_index():
    linked = {os.path.normpath(os.path.join(os.path.dirname(p), t.partition("#")[0]))
              for p in ("README.md", "docs/index.md")
              for t in re.findall(r"\]\(([^)#\s]+)", read_text(os.path.join(ROOT, p)))}
    assert sorted(p for p in PAGES if p.startswith("docs/") and p not in linked) == []


def test_fenced_blocks_name_a_known_language():
    unknown = [f"{b}: {b.lang}" for b in ALL_BLOCKS if b.lang not in
               SHELL | {"python", "diff", "", "text", "toml", "json"}]
    assert unknown == []


@_of({"python"})
def test_python_block_compiles_and_calls_the_real_api(block):
    assert python_problems(block) == []


@_of(SHELL)
def test_bash_block_parses_and_uses_real_cli_options(block):
    assert bash_problems(block) == []


@_of({"diff"})
def test_diff_block_applies_and_calls_the_real_api(block):
    assert diff_problems(block) == []


PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "python"]


def test_every_python_block_runs_or_says_why_not():
    """Each block's note parses; a block that runs binds every name it reads (itself or through
    its setup); the blocks not run are counted and shown, each with its reason."""
    problems, not_run = [], []
    for block in PYTHON_BLOCKS:
        try:
            note = run_note(block)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if note.reason is not None:
            not_run.append(f"{block}: {note.reason}")
            continue
        bound = set().union(*(_binds(SETUPS[n]) for n in note.setup))
        if unbound := sorted(free_names(block.text) - bound):
            problems.append(f"{block}: reads {', '.join(unbound)} without binding it: add the "
                            "lines, or a <!-- run: setup=NAME --> that binds it")
    assert problems == []
    assert len(not_run) < len(PYTHON_BLOCKS) / 2, not_run  # most blocks run
    warnings.warn(f"{len(not_run)} of {len(PYTHON_BLOCKS)} python blocks of the docs are not "
                  "run: " + "; ".join(not_run))


def _binds(code: str) -> set[str]:
    """Names a setup binds (its imports and assignments)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.fixture(scope="module")
def doc_stores(tmp_path_factory):
    """The files the blocks name (``STORES``): an ImageFolder ``imgs/`` and stores packed from
    it, an aspect-ratio bucketed store with captions (a folder and a file), a COCO store."""
    from helpers import image_tree
    from helpers.buckets import write_sources
    from helpers.coco import make_coco

    base = tmp_path_factory.mktemp("doc-stores")
    imgs = str(base / "imgs")
    image_tree(imgs, classes=2, per_class=4, seed=3)
    for name, kw in [("train.lmdb", {}), ("val.lmdb", {}), ("train.h5", {}),
                     ("train-shards", {"num_shards": 2})]:
        shardkit.pack(imgs, str(base / name), workers=1, progress=False, **kw)
    photos = base / "photos"
    write_sources(str(photos), seed=3, captions=True)
    for extra in photos.glob("*/*"):  # 16 photos (8 a class) and their captions are enough
        if int(extra.stem) >= 16:
            extra.unlink()
    for name, kw in [("train-1024", {"buckets": 1024, "num_shards": 2}),
                     ("train-kohya", {"buckets": "kohya"}), ("sdxl.lmdb", {"buckets": 1024})]:
        shardkit.pack(str(photos), str(base / name), captions=True, workers=1, progress=False,
                      **kw)
    images, annotations = make_coco(str(base / "coco"), count=4, empty_every=0)
    shardkit.pack(images, str(base / "coco-train.lmdb"), coco=annotations, workers=1,
                  progress=False)
    assert sorted(STORES) == sorted(p.name for p in base.iterdir()
                                    if p.name not in ("photos", "coco"))
    return base


def _jobs(env: str, doc_stores, tmp_path) -> list:
    """Each block of ``env`` that runs, in a folder of its own holding ``STORES`` (links to the
    shared ones, except a path the block writes)."""
    jobs = []
    for k, block in enumerate(PYTHON_BLOCKS):
        note = run_note(block)
        if note.reason is not None or note.env != env:
            continue
        cwd = tmp_path / f"block{k}"
        cwd.mkdir()
        written = store_paths(block.text, written=True)
        for name in STORES:
            if name not in written:
                os.symlink(doc_stores / name, cwd / name)
        jobs.append(block_job(str(cwd), block))
    return jobs


@pytest.mark.timeout(300)
def test_python_blocks_run(doc_stores, tmp_path):
    jobs = _jobs("", doc_stores, tmp_path)
    assert len(jobs) > len(PYTHON_BLOCKS) / 2
    assert run_blocks(jobs) == ([], [])  # none raised, none needs a package not installed


@pytest.mark.timeout(300)
def test_python_blocks_of_the_torchvision_environment_run(doc_stores, tmp_path, tv_python):
    jobs = _jobs("torchvision", doc_stores, tmp_path)
    assert jobs, "no block runs in the torchvision environment: the check would pass vacuously"
    assert run_blocks(jobs, python=tv_python) == ([], [])


def test_the_checks_catch_broken_docs(tmp_path):
    """Each check fails on a page broken the way a stale doc breaks."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## A section\n")
    (tmp_path / "README.md").write_text(textwrap.dedent("""\
        # Title

        [ok](docs/page.md#a-section) [gone](docs/missing.md) [bad anchor](docs/page.md#nope)
        [self](#title) [self bad](#other) `tests/no_such_test.py`
        """))
    assert link_problems("README.md", root=str(tmp_path)) == [
        "README.md:3: names a missing file: tests/no_such_test.py",
        "README.md:3: link to a missing file: docs/missing.md",
        "README.md:3: no heading #nope in docs/page.md",
        "README.md:3: no heading #other in README.md",
    ]
    assert github_slug("Training recipe (RandomResizedCrop + flip at decode)") == \
        "training-recipe-randomresizedcrop--flip-at-decode"
    assert headings("## `x` y\n\n## x y\n") == {"x-y", "x-y-1"}

    def bash(text):
        return bash_problems(Block("t.md", 1, "bash", text))

    assert bash("shardkit pack a b --shard-size 1GiB --resume\nshardkit bench --sample 20\n"
                "RANK=1 shardkit pack a b --num-shards 2 --node-rank $RANK > log\n") == []
    assert bash("shardkit pack a b --no-such-flag") == [
        "t.md:1: shardkit pack a b --no-such-flag: "
        "shardkit: error: unrecognized arguments: --no-such-flag"]
    assert "invalid choice: 'pak'" in bash("shardkit pak a b")[0]
    assert "required: OUT" in bash("shardkit pack a")[0]
    assert "--no-flag" in bash("python benchmarks/throughput.py --sample 2 --no-flag")[0]
    assert "bash -n" in bash("if true; then echo\n")[0]
    assert "does not compile" in bash("python - <<'EOF'\nprint(\nEOF\n")[0]
    assert bash("cat <<'X'\nnot python (\nX\npython - <<'EOF'\nprint(1)\nEOF\n") == []
    assert [c.argv for c in shell_commands(
        "A=1 shardkit info s --json > out  # note\nx && shardkit verify \\\n  s\n")] == [
        ["shardkit", "info", "s", "--json"], ["x"], ["shardkit", "verify", "s"]]

    def py(text):
        return python_problems(Block("t.md", 1, "python", text))

    assert py("import shardkit\nds = shardkit.ShardDataset('x', crop=2)\nds.loader(batch_size=2)\n"
              "with shardkit.StoreWriter('o', ['a']) as w:\n    w.add(1, 0)\n") == []
    assert "does not compile" in py("print(")[0]
    assert "unexpected keyword argument 'crop_size'" in \
        py("import shardkit\nshardkit.ShardDataset('x', crop_size=2)")[0]
    assert py("import shardkit\nshardkit.Nope()") == ["t.md:1: shardkit has no Nope"]
    assert py("from shardkit import Nope") == ["t.md:1: shardkit has no Nope"]
    assert "ShardDataset has no lodaer" in \
        py("import shardkit\nds = shardkit.ShardDataset('x')\nds.lodaer()")[0]
    assert "StoreWriter.add(...): too many positional arguments" in \
        py("import shardkit\nwith shardkit.StoreWriter('o', []) as w:\n    w.add(1, 2, 3, 4)")[0]
    assert store_paths("import shardkit\nshardkit.pack('imgs/', 'o/')", written=True) == {"o"}

    page = textwrap.dedent("""\
        <!-- not run: needs 8 GPUs -->
        ```python
        a = 1
        ```
        Text.
        <!-- run: setup=ds cuda=cpu -->

        ```python
        ds.loader(batch_size=2)
        ```

        ```python
        b = 2
        ```
        <!-- not run: -->
        ```python
        c = 3
        ```
        <!-- run: setup=nope -->
        ```python
        d = 4
        ```
        """)
    found = blocks("t.md", page)
    assert [b.note for b in found[:3]] == ["<!-- not run: needs 8 GPUs -->",
                                           "<!-- run: setup=ds cuda=cpu -->", ""]
    assert [run_note(b) for b in found[:3]] == [
        RunNote(reason="needs 8 GPUs"), RunNote(setup=("ds",), cuda_cpu=True), RunNote()]
    with pytest.raises(ValueError, match="'not run' needs a reason"):
        run_note(found[3])
    with pytest.raises(ValueError, match="unknown run option 'setup=nope'"):
        run_note(found[4])

    def job(name, code, setup="", cuda_cpu=False):
        return (str(tmp_path), name, setup, code, cuda_cpu)

    assert run_blocks([job("ok", "print('fine')"),
                       job("bad", "open('no-such-store.lmdb')"),
                       job("needs", "import no_such_package_here"),
                       job("ours", "import shardkit.no_such_module"),
                       job("fragment", "print(x + 1)"),
                       job("set up", "assert x + 1 == 2", setup="x = 1"),
                       job("on the cpu", "import torch\nassert torch.ones(1).cuda().sum() == 1",
                           cuda_cpu=True)]) == (
        ["bad: FileNotFoundError: [Errno 2] No such file or directory: 'no-such-store.lmdb'",
         "ours: ModuleNotFoundError: No module named 'shardkit.no_such_module'",
         "fragment: NameError: name 'x' is not defined"],
        ["needs: needs no_such_package_here"])

    diff = "+import shardkit\n-old()\n+    ds = shardkit.ShardDataset(d, crop=1, flipp=0.5)\n"
    assert "unexpected keyword argument 'flipp'" in diff_problems(Block("t.md", 1, "diff", diff))[0]
    (tmp_path / "f.txt").write_text("one\n")
    bad = "--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-two\n+three\n"
    good = bad.replace("-two", "-one")
    assert "does not apply" in diff_problems(Block("t.md", 1, "diff", bad), root=str(tmp_path))[0]
    assert diff_problems(Block("t.md", 1, "diff", good), root=str(tmp_path)) == []


def test_the_readme_stays_a_front_door():
    """README.md says what shardkit is, how to start and where to read on; the rest lives in docs/."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) < 180, f"README.md has {len(lines)} lines; move detail into docs/"
    assert "./scripts/demo.sh" in "\n".join(lines) and "./scripts/test.sh" in "\n".join(lines)
