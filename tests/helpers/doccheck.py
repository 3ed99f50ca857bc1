"""Checks for the documentation (used by tests/test_docs.py): links, anchors, repository paths,
fenced python / bash / diff blocks against the real code and the real CLI parsers."""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import glob
import inspect
import io
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import urllib.parse
from dataclasses import dataclass

from markdown_it import MarkdownIt

import shardkit
from shardkit import cli
from shardkit.bench import build_parser as bench_parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = sorted(["README.md", "benchmarks/README.md"]
               + [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))])
SHELL = {"bash", "sh", "shell", "console"}
# Words in code spans and shell blocks that name a file of this repository.
REPO_PATH = re.compile(
    r"(?<![\w./~$-])(?:\./)?(?:shardkit|tests|benchmarks|scripts|examples|docs)/[\w./-]*\w")
# What every python block finds in its working folder (see ``doc_stores``): an ImageFolder,
# stores packed from it, an aspect-ratio bucketed store with captions (a folder and a file) and
# a COCO store with masks.
STORES = ("imgs", "train.lmdb", "val.lmdb", "train.h5", "train-shards", "train-1024",
          "train-kohya", "sdxl.lmdb", "coco-train.lmdb")
# How tests/test_docs.py runs a ```python block is said by an HTML comment (invisible on GitHub)
# on the lines right above it; without one the block runs as written:
#   <!-- not run: REASON -->     not run, for REASON (a GPU cluster, a bucket): counted, shown
#   <!-- run: setup=NAME -->     SETUPS[NAME] runs first (binds names a fragment reads)
#   <!-- run: env=torchvision --> in the torchvision environment (.venv-tv: torchvision, timm)
#   <!-- run: cuda=cpu -->       without CUDA, ``x.cuda(...)`` runs as ``x.to("cpu", ...)``
# (``run:`` takes several, space-separated).
NOTE = re.compile(r"<!--\s*(not run|run):(.*?)-->", re.S)
ENVS = ("", "torchvision")
SETUPS = {
    # a folder store that can change (docs/lifecycle.md)
    "grown": ("import shardkit\nshardkit.pack('imgs', 'grow', shard_size=1 << 20, "
              "progress=False)\n"),
    # a dataset as the README's Read section makes it
    "ds": 'import shardkit\nds = shardkit.ShardDataset("train.lmdb", crop=224, crop_mode="random")\n',
    # what StoreWriter's add / add_encoded take: one source image, decoded and as its bytes
    "arrays": ("import glob\nimport numpy as np\nimport shardkit\nfrom PIL import Image\n"
               "source = sorted(glob.glob('imgs/*/*.jpg'))[0]\n"
               "jpeg_bytes = open(source, 'rb').read()\n"
               "pixels = np.asarray(Image.open(source).convert('RGB'))\n"
               "(height, width), label = pixels.shape[:2], 1\n"),
    # what the rest of diffusers' SDXL training script has made by then (a stand-in model)
    "sdxl_script": ("import torch\nunet = torch.nn.Linear(6, 1)\n"
                    "optimizer = torch.optim.SGD(unet.parameters(), lr=0.1)\n"
                    "lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)\n"
                    "first_epoch, num_train_epochs = 0, 1\n"),
    # one sample's draw as the loader keys it (the text above the block names them)
    "sample_seed": ("import torch\nimport shardkit\nfrom torchvision.transforms import v2\n"
                    "path, index, seed, epoch, position = 'train.lmdb', 3, 11, 2, 5\n"),
}

_MD = MarkdownIt("commonmark").enable("table")


@dataclass(frozen=True)
class Block:
    """A fenced code block: the page it is on, its first line (1-based), language and text, and
    the HTML comment right above it (``""`` without one: see ``NOTE``)."""
    page: str
    line: int
    lang: str
    text: str
    note: str = ""

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def github_slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation other than '-' and '_' dropped, each
    space a hyphen (duplicates get -1, -2, ... in ``headings``)."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _inline_text(token) -> str:
    return "".join(c.content for c in token.children or () if c.type in ("text", "code_inline"))


def headings(text: str) -> set[str]:
    tokens = _MD.parse(text)
    seen: dict[str, int] = {}
    out = set()
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            slug = github_slug(_inline_text(tokens[i + 1]))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@functools.lru_cache(maxsize=None)
def _headings_of(path: str) -> set[str]:
    return headings(read_text(path))


def blocks(page: str, text: str) -> list[Block]:
    found, before = [], None
    for tok in _MD.parse(text):
        if tok.type == "fence":
            note = before.content.strip() if before is not None and \
                before.type == "html_block" else ""
            found.append(Block(page, tok.map[0] + 1, tok.info.split()[0] if tok.info else "",
                               tok.content, note))
        if tok.map is not None:  # block-level tokens only (not a paragraph's inline content)
            before = tok
    return found


@dataclass(frozen=True)
class RunNote:
    """How a python block runs (see ``NOTE``)."""
    reason: str | None = None     # not run, and why
    setup: tuple[str, ...] = ()   # SETUPS that run first
    env: str = ""                 # "" (this interpreter's environment) or "torchvision"
    cuda_cpu: bool = False        # .cuda(...) runs on the CPU where CUDA is missing


def run_note(block: Block) -> RunNote:
    """The block's note, read; a malformed one raises ``ValueError`` naming the block."""
    found = NOTE.fullmatch(block.note) if block.note else None
    if block.note and block.note.startswith("<!--") and found is None:
        raise ValueError(f"{block}: not a run note: {block.note!r}")
    if found is None:
        return RunNote()
    kind, body = found.group(1), " ".join(found.group(2).split())
    if kind == "not run":
        if not body:
            raise ValueError(f"{block}: 'not run' needs a reason")
        return RunNote(reason=body)
    setup, env, cuda_cpu = [], "", False
    for word in body.split():
        key, _, value = word.partition("=")
        if key == "setup" and value in SETUPS:
            setup.append(value)
        elif key == "env" and value in ENVS:
            env = value
        elif key == "cuda" and value == "cpu":
            cuda_cpu = True
        else:
            raise ValueError(f"{block}: unknown run option {word!r} (setup=NAME with NAME one "
                             f"of {sorted(SETUPS)}, env=torchvision, cuda=cpu)")
    return RunNote(setup=tuple(setup), env=env, cuda_cpu=cuda_cpu)


def read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def link_problems(page: str, root: str = ROOT) -> list[str]:
    """Broken relative links, images and anchors on ``page``, and repository paths in its code
    spans and shell blocks that do not exist."""
    path = os.path.join(root, page)
    text = read_text(path)
    problems = []
    refs = []
    for tok in _MD.parse(text):
        line = tok.map[0] + 1 if tok.map else 0
        for child in tok.children or ():
            if child.type == "link_open":
                refs.append((line, child.attrs["href"]))
            elif child.type == "image":
                refs.append((line, child.attrs["src"]))
            elif child.type == "code_inline":
                problems += _path_problems(page, line, child.content, root)
        if tok.type == "fence" and tok.info.split()[:1] and tok.info.split()[0] in SHELL:
            problems += _path_problems(page, line, tok.content, root)
    for line, href in refs:
        if re.match(r"[a-z][a-z0-9+.-]*:", href):  # https:, mailto:: not ours to check
            continue
        target, _, anchor = urllib.parse.unquote(href).partition("#")
        file = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        if not os.path.exists(file):
            problems.append(f"{page}:{line}: link to a missing file: {href}")
        elif anchor and file.endswith(".md") and anchor not in _headings_of(file):
            problems.append(f"{page}:{line}: no heading #{anchor} in {os.path.relpath(file, root)}")
    return problems


def _path_problems(page: str, line: int, text: str, root: str) -> list[str]:
    return [f"{page}:{line}: names a missing file: {word}"
            for word in REPO_PATH.findall(text)
            if not os.path.exists(os.path.join(root, word))]


# --- shell blocks ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    """A simple shell command: its words, and the heredoc it reads (None without one)."""
    argv: list[str]
    heredoc: str | None = None


def shell_commands(script: str) -> list[Command]:
    """The simple commands of a shell script: continuation lines joined, comments and
    redirections removed, a heredoc given to the command on its line; ``$VAR`` reads as ``0``."""
    commands = []
    lines = script.replace("\\\n", " ").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        body = None
        here = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if here:
            start = i
            while i < len(lines) and lines[i].strip() != here.group(1):
                i += 1
            body = "\n".join(lines[start:i]) + "\n"
            i += 1
            line = line[:here.start()]
        line = re.sub(r"\$\{?\w+\}?", "0", line)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        argv: list[str] = []
        redirected = False
        for word in list(lexer) + [";"]:
            if word in ("&&", "||", ";", "|", "&", "(", ")"):
                if argv:
                    commands.append(Command(argv, body))
                    body = None  # the heredoc goes to the first command of the line
                argv, redirected = [], False
            elif set(word) <= set("<>&") or redirected:
                redirected = True  # a redirection and its target are not arguments
            elif argv or not re.match(r"\w+=", word):  # leading VAR=value assignments
                argv.append(word)
    return commands


def command_problem(argv: list[str]) -> str | None:
    """Why shardkit's own parsers refuse ``argv`` (a ``shardkit ...`` or ``python
    benchmarks/throughput.py ...`` line), or None; other commands are not ours to check."""
    if argv[0] == "shardkit" or argv[:3] == [argv[0], "-m", "shardkit"]:
        args = argv[1:] if argv[0] == "shardkit" else argv[3:]
        # As cli.main does: ``bench`` hands its arguments to the benchmark's parser.
        parser, args = (bench_parser(), args[1:]) if args[:1] == ["bench"] else \
            (cli.build_parser(), args)
    elif os.path.basename(argv[0]).startswith("python") and len(argv) > 1 \
            and argv[1].endswith("benchmarks/throughput.py"):
        parser, args = bench_parser(), argv[2:]
    else:
        return None
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            if exc.code:
                return err.getvalue().strip().splitlines()[-1]
    return None


def bash_problems(block: Block) -> list[str]:
    run = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
    if run.returncode:
        return [f"{block}: bash -n: {run.stderr.strip()}"]
    problems = []
    for cmd in shell_commands(block.text):
        if why := command_problem(cmd.argv):
            problems.append(f"{block}: {' '.join(cmd.argv)}: {why}")
        if cmd.heredoc is not None and cmd.argv[:2] in (["python", "-"], ["python3", "-"]):
            problems += python_problems(Block(block.page, block.line, "python", cmd.heredoc))
    return problems


# --- python blocks --------------------------------------------------------------------------

class _Placeholder:
    """Stands for any argument when binding a documented call to the real signature."""


def _api_call_problems(tree: ast.AST, where: str) -> list[str]:
    """Calls into shardkit that name a missing attribute or pass arguments the real signature
    refuses. Names bound by ``import shardkit``, ``from shardkit import X`` and ``x =
    shardkit.Class(...)`` (or ``with ... as x``) are followed; anything else is not judged."""
    modules, objects, instances = set(), {}, {}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "shardkit"}
        elif isinstance(node, ast.ImportFrom) and node.module == "shardkit":
            for a in node.names:
                if not hasattr(shardkit, a.name):
                    problems.append(f"{where}: shardkit has no {a.name}")
                else:
                    objects[a.asname or a.name] = getattr(shardkit, a.name)

    def resolve(func):
        if isinstance(func, ast.Name):
            return objects.get(func.id), func.id, None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner in modules:
                if not hasattr(shardkit, func.attr):
                    problems.append(f"{where}: shardkit has no {func.attr}")
                    return None, "", None
                return getattr(shardkit, func.attr), f"shardkit.{func.attr}", None
            cls = instances.get(owner)
            if cls is not None:
                if not hasattr(cls, func.attr):
                    problems.append(f"{where}: {cls.__name__} has no {func.attr}")
                    return None, "", None
                return getattr(cls, func.attr), f"{cls.__name__}.{func.attr}", cls
        return None, "", None

    def bind(call: ast.Call) -> None:
        obj, name, cls = resolve(call.func)
        if obj is None or not callable(obj) or any(
                isinstance(a, ast.Starred) for a in call.args) or any(
                k.arg is None for k in call.keywords):
            return
        # A method looked up on the class takes the instance first, unless static or class.
        method = cls is not None and not isinstance(
            inspect.getattr_static(cls, call.func.attr), (staticmethod, classmethod))
        args = [_Placeholder()] * (len(call.args) + method)  # + self for a method
        try:
            inspect.signature(obj).bind(*args, **{k.arg: _Placeholder() for k in call.keywords})
        except TypeError as exc:
            problems.append(f"{where}: {name}(...): {exc}")
        except ValueError:  # no signature to check (a builtin)
            pass

    for node in ast.walk(tree):  # in source order enough for ``x = shardkit.C(...)``
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            cls = resolve(node.value.func)[0]
            if inspect.isclass(cls):
                instances.update({t.id: cls for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call):
            cls = resolve(node.context_expr.func)[0]
            if inspect.isclass(cls) and isinstance(node.optional_vars, ast.Name):
                instances[node.optional_vars.id] = cls
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            bind(node)
    return list(dict.fromkeys(problems))  # a call resolved twice is reported once


def python_problems(block: Block) -> list[str]:
    try:
        tree = ast.parse(block.text, filename=str(block))
        compile(tree, str(block), "exec")
    except SyntaxError as exc:
        return [f"{block}: does not compile: {exc.msg} (block line {exc.lineno})"]
    return _api_call_problems(tree, str(block))


def free_names(code: str) -> set[str]:
    """Names a block reads that it never binds and that are not builtins."""
    tree = ast.parse(code)
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound - set(dir(builtins))


def store_paths(code: str, written: bool) -> set[str]:
    """The string paths a block's shardkit calls write (``written``: the OUT of ``pack(SRC,
    OUT)`` and ``StoreWriter(OUT)``) or read (the first argument of any other shardkit call,
    and SRC of ``pack``)."""
    out, read = set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if not hasattr(shardkit, name):
                continue
            args = [str(a.value).rstrip("/") if isinstance(a, ast.Constant) and
                    isinstance(a.value, str) else None for a in node.args]
            wrote = {"pack": 1, "StoreWriter": 0}.get(name)
            if wrote is not None and len(args) > wrote and args[wrote]:
                out.add(args[wrote])
            if args and args[0] and name != "StoreWriter":
                read.add(args[0])
    return out if written else read - out


# --- diff blocks ----------------------------------------------------------------------------

def diff_problems(block: Block, root: str = ROOT) -> list[str]:
    """A diff with ``--- a/FILE`` headers must apply here; the added lines of any diff must call
    shardkit as its signatures accept (a diff against another project's file, such as
    pytorch/examples' main.py, cannot be applied here)."""
    problems = []
    if re.search(r"^--- (a/)?\S+\n\+\+\+ ", block.text, re.M):
        run = subprocess.run(["git", "apply", "--check", "-"], input=block.text, cwd=root,
                             capture_output=True, text=True)
        if run.returncode:
            problems.append(f"{block}: does not apply: {run.stderr.strip()}")
    added = [ln[1:] for ln in block.text.splitlines() if ln.startswith("+") and not
             ln.startswith("+++")]
    imports = "\n".join(ln.strip() for ln in added if ln.strip().startswith(("import", "from")))
    for ln in added:
        try:
            tree = ast.parse(imports + "\n" + textwrap.dedent(ln).strip())
        except SyntaxError:
            continue  # a fragment of a longer statement
        problems += _api_call_problems(tree, str(block))
    problems += [f"{block}: shardkit has no {name}" for name in
                 re.findall(r"\bshardkit\.(\w+)", "\n".join(added)) if not hasattr(shardkit, name)]
    return problems


# Runs each block in its own folder, in one fresh interpreter (torch is imported once): its
# setup first, in the same namespace; ``.cuda(`` on the CPU where asked and CUDA is missing.
_RUNNER = """
import json, os, re, sys, traceback
for cwd, name, setup, code, cuda_cpu in json.load(sys.stdin):
    os.chdir(cwd)
    try:
        if cuda_cpu:
            import torch
            if not torch.cuda.is_available():
                code = re.sub(r"[.]cuda[(]", '.to("cpu", ', code)
        namespace = {"__name__": "__main__"}
        exec(compile(setup, name + " (setup)", "exec"), namespace)
        exec(compile(code, name, "exec"), namespace)
    except BaseException as exc:
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing and missing.split(".")[0] != "shardkit":  # an optional package not here
            print("DOC-BLOCK-NEEDS", json.dumps(f"{name}: needs {missing}"))
        else:
            print("DOC-BLOCK-FAILED", json.dumps(
                f"{name}: {traceback.format_exception_only(exc)[-1].strip()}"))
"""


def block_job(folder: str, block: Block) -> tuple[str, str, str, str, bool]:
    """What ``run_blocks`` runs for ``block`` in ``folder``."""
    note = run_note(block)
    return (folder, str(block), "".join(SETUPS[name] for name in note.setup), block.text,
            note.cuda_cpu)


def run_blocks(jobs: list[tuple[str, str, str, str, bool]], python: str = sys.executable,
               ) -> tuple[list[str], list[str]]:
    """Run (folder, name, setup, code, cuda_cpu) jobs in one fresh ``python``: (one line per
    block that raised, one per block that imports a package this environment does not have)."""
    run = subprocess.run([python, "-c", _RUNNER], input=json.dumps(jobs),
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    found: dict[str, list[str]] = {"DOC-BLOCK-FAILED": [], "DOC-BLOCK-NEEDS": []}
    for line in run.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in found:
            found[tag].append(json.loads(rest))
    return found["DOC-BLOCK-FAILED"], found["DOC-BLOCK-NEEDS"]
