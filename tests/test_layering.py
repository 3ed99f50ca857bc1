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
