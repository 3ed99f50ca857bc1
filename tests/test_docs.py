"""The documentation is checked like code: README.md, docs/*.md and benchmarks/README.md.

- every relative link and image resolves to a file, and an ``#anchor`` to a heading of the
  target page (GitHub's slug rules); repository paths quoted in code spans and shell blocks exist;
- every fenced ```python block compiles, its calls into shardkit name real functions with
  arguments their signatures accept, and self-contained blocks run against small real stores;
- every ```bash block parses with ``bash -n``, and every ``shardkit ...`` (or
  ``benchmarks/throughput.py``) command line in it parses with the real CLI's argparse parser,
  without running the work;
- every ```diff block's added lines call shardkit as its signatures accept, and a diff with file
  headers applies to this repository (``git apply --check``).

``test_the_checks_catch_broken_docs`` shows each check failing on a broken page.
"""

from __future__ import annotations

import os
import re
import textwrap

import pytest
from helpers.doccheck import (PAGES, ROOT, SHELL, STORES, Block, read_text, store_paths,
                              bash_problems, blocks, diff_problems, github_slug, headings,
                              link_problems, python_problems, run_blocks, runnable,
                              shell_commands)

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


@pytest.fixture(scope="module")
def doc_stores(tmp_path_factory):
    """The files runnable blocks name: an ImageFolder ``imgs/`` and stores packed from it."""
    from helpers import image_tree

    base = tmp_path_factory.mktemp("doc-stores")
    imgs = str(base / "imgs")
    image_tree(imgs, classes=2, per_class=4, seed=3)
    for name, kw in [("train.lmdb", {}), ("val.lmdb", {}), ("train.h5", {}),
                     ("train-shards", {"num_shards": 2})]:
        shardkit.pack(imgs, str(base / name), workers=1, progress=False, **kw)
    return base




@pytest.mark.timeout(300)
def test_self_contained_python_blocks_run(doc_stores, tmp_path):
    runs = [b for b in ALL_BLOCKS if b.lang == "python" and runnable(b)]
    assert runs, "no runnable block: the check would pass vacuously"
    jobs = []
    for k, block in enumerate(runs):
        cwd = tmp_path / f"block{k}"
        cwd.mkdir()
        written = store_paths(block.text, written=True)
        for name in STORES:
            if name not in written:
                os.symlink(doc_stores / name, cwd / name)
        jobs.append((str(cwd), str(block), block.text))
    failed, cannot_run = run_blocks(jobs)
    assert failed == []
    assert len(cannot_run) < len(jobs), cannot_run  # at least one block really ran


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
    assert not runnable(Block("t.md", 1, "python", "x.cuda()")) and \
        not runnable(Block("t.md", 1, "python", "print(undefined_name)")) and \
        not runnable(Block("t.md", 1, "python", "import shardkit\nshardkit.ShardDataset('c.lmdb')"))
    assert runnable(Block("t.md", 1, "python", "import shardkit\nshardkit.pack('imgs/', 'o.h5')"))
    assert store_paths("import shardkit\nshardkit.pack('imgs/', 'o/')", written=True) == {"o"}

    assert run_blocks([(str(tmp_path), "ok", "print('fine')"),
                       (str(tmp_path), "bad", "open('no-such-store.lmdb')"),
                       (str(tmp_path), "needs", "import no_such_package_here"),
                       (str(tmp_path), "ours", "import shardkit.no_such_module")]) == (
        ["bad: FileNotFoundError: [Errno 2] No such file or directory: 'no-such-store.lmdb'",
         "ours: ModuleNotFoundError: No module named 'shardkit.no_such_module'"],
        ["needs: needs no_such_package_here"])

    diff = "+import shardkit\n-old()\n+    ds = shardkit.ShardDataset(d, crop=1, flipp=0.5)\n"
    assert "unexpected keyword argument 'flipp'" in diff_problems(Block("t.md", 1, "diff", diff))[0]
    (tmp_path / "f.txt").write_text("one\n")
    bad = "--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-two\n+three\n"
    good = bad.replace("-two", "-one")
    assert "does not apply" in diff_problems(Block("t.md", 1, "diff", bad), root=str(tmp_path))[0]
    assert diff_problems(Block("t.md", 1, "diff", good), root=str(tmp_path)) == []
