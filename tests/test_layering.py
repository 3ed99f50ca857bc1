"""The package's drawing: no import circles between shardkit's modules, the pack side and the
read side never import each other, and no module reaches for another module's private names.

Read from the source with ``ast`` (every import, at module level or inside a function, except
under ``if TYPE_CHECKING:``), so a lazy import cannot hide a circle.
"""

from __future__ import annotations

import ast
import os

import shardkit

PACKAGE = os.path.dirname(os.path.abspath(shardkit.__file__))


def _modules() -> dict[str, str]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), os.path.dirname(PACKAGE))
                dotted = rel[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = os.path.join(folder, name)
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(tree: ast.AST):
    """Every node, skipping the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].endswith("__init__.py")
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for each import in ``module``."""
    with open(MODULES[module], encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out = []
    for node in _walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, None) if sub in MODULES else (target, alias.name))
    return [(t, n) for t, n in out if t.split(".")[0] == "shardkit" and t in MODULES]


def _graph() -> dict[str, set[str]]:
    """Module -> the shardkit modules it imports (a package's own ``__init__`` excluded: importing
    ``a.b`` runs ``a/__init__`` first, which is not a dependency of ``a.b``'s code)."""
    return {m: {t for t, _ in _imports(m) if t != m} for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package_edges_removed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop a submodule's edges into its own ancestor packages' ``__init__`` (``from . import
    name``): the package re-exporting its submodules is not a circle with them."""
    return {m: {d for d in deps if not (MODULES[d].endswith("__init__.py")
                                         and m.startswith(d + "."))}
            for m, deps in graph.items()}


def test_no_import_circles():
    cycles = _cycles(_package_edges_removed(_graph()))
    assert cycles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_pack_and_read_never_import_each_other():
    bad = sorted((m, t) for m, deps in _graph().items() for t in deps
                 for a, b in (("shardkit.packing", "shardkit.read"),
                              ("shardkit.read", "shardkit.packing"))
                 if (m == a or m.startswith(a + ".")) and (t == b or t.startswith(b + ".")))
    assert bad == []


def test_read_never_imports_integrations():
    """``shardkit.integrations`` (Lightning, timm, accelerate) builds on the read side's loaders
    and engines (``shardkit.read.loading``); the read side never reaches up to it."""
    bad = sorted((m, t) for m, deps in _graph().items() for t in deps
                 if m.startswith("shardkit.read.") and t.startswith("shardkit.integrations"))
    assert bad == []


def _private_uses(module: str) -> list[str]:
    """Private names of other shardkit modules used here: ``from x import _y`` and ``x._y``."""
    with open(MODULES[module], encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = [f"{t}.{n}" for t, n in _imports(module)
             if n and n.startswith("_") and not n.startswith("__") and t != module]
    aliases = {}
    for node in _walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in _walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__") and aliases[node.value.id] != module):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_no_private_name_crosses_modules():
    bad = {m: sorted(set(uses)) for m in MODULES if (uses := _private_uses(m))}
    assert bad == {}


def _test_private_uses(path: str) -> list[str]:
    """shardkit's private names a test uses: ``from shardkit.x import _y``, ``x._y`` and
    ``monkeypatch.setattr(x, "_y", ...)`` of a module ``x`` imported from shardkit."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "shardkit":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in MODULES:
                    aliases[alias.asname or alias.name] = full
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(full)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0])

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                dotted = ".".join([aliases[value.id], *reversed(chain)])
                if dotted in MODULES:  # a module's own private name, not an object's
                    found.append(f"{dotted}.{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "setattr" and len(node.args) >= 2
              and isinstance(node.args[0], ast.Name) and node.args[0].id in aliases
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and private(node.args[1].value)):
            found.append(f"{aliases[node.args[0].id]}.{node.args[1].value}")
    return found


def test_tests_use_only_the_public_surface():
    tests = os.path.dirname(os.path.abspath(__file__))
    bad = {}
    for folder, _, files in os.walk(tests):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                if uses := _test_private_uses(path):
                    bad[os.path.relpath(path, tests)] = sorted(set(uses))
    assert bad == {}


def test_the_tests_check_catches_private_uses(tmp_path):
    case = tmp_path / "case.py"
    case.write_text("from shardkit.packing.dask_engine import _dashboard\n"
                    "from shardkit.read import augment\n"
                    "import shardkit.metadata as md\n"
                    "x = augment._DRAWS\n"
                    "y = md._plain_name\n"
                    "def t(monkeypatch):\n"
                    "    monkeypatch.setattr(augment, '_native_uint8', True)\n"
                    "    monkeypatch.setattr(augment, 'native_uint8', True)\n"
                    "    z = augment.DRAWS._private_of_an_object\n")
    assert sorted(_test_private_uses(str(case))) == [
        "shardkit.metadata._plain_name", "shardkit.packing.dask_engine._dashboard",
        "shardkit.read.augment._DRAWS", "shardkit.read.augment._native_uint8"]


MAX_LINES = 450
#: Read-side modules still over MAX_LINES while they are being split. This list must only
#: shrink: remove a module once it is under the bar (the test says so), never add one.
OVER_THE_BAR: set[str] = set()


def _lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return len(f.read().splitlines())


def test_no_module_is_over_the_line_bar():
    root = os.path.dirname(PACKAGE)
    sizes = {os.path.relpath(path, root).replace(os.sep, "/"): _lines(path)
             for path in MODULES.values()}
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert sorted(set(over) - OVER_THE_BAR) == [], f"modules over {MAX_LINES} lines: {over}"
    assert sorted(n for n in OVER_THE_BAR if sizes.get(n, 0) <= MAX_LINES) == [], \
        "under the bar (or gone) now: remove from OVER_THE_BAR"
