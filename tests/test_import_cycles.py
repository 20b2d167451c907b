"""No import cycles between qlabench's modules at module level.

The graph is built from the source (ast), without importing anything: an edge A -> B for every
``import B`` / ``from B import x`` / ``from . import B`` that runs when A is imported, i.e. at module
level, including inside module-level ``try`` / ``if`` / ``with`` / class bodies. Left out: imports inside
functions (they run at call time, after every module has loaded: the sanctioned way to break a cycle)
and ``if TYPE_CHECKING:`` blocks (never run). ``from P import name`` is an edge to the submodule
``P.name`` when that is a module of the package, else to ``P``. A package's ``__init__`` that Python
imports on the way to a submodule is not an edge of its own: such an import finds the parent already
importing (or imported) and is no cycle unless the modules' own edges make one, which this test sees.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "qlabench"


def modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package __init__) for every .py under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        out[".".join(parts)] = (path, is_pkg)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_level_imports(body: list[ast.stmt]):
    """The Import / ImportFrom statements that run when the module is imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from module_level_imports(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                sub = getattr(node, field, None)
                if isinstance(sub, list):
                    yield from module_level_imports([s for s in sub if isinstance(s, ast.AST)])


def import_graph(root: Path) -> dict[str, set[str]]:
    mods = modules(root)
    graph = {}
    for name, (path, is_pkg) in mods.items():
        package = name.split(".") if is_pkg else name.split(".")[:-1]
        edges = set()
        for node in module_level_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in mods)
                continue
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            target = ".".join(x for x in (base, node.module) if x)
            for alias in node.names:
                if f"{target}.{alias.name}" in mods:
                    edges.add(f"{target}.{alias.name}")
                elif target in mods:
                    edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted, plus self loops."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _path(graph, comp):
    """A shortest cycle through the component's first module, for the failure message: a -> b -> a."""
    members, start = set(comp), comp[0]
    came_from, frontier = {}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return " -> ".join([start, *reversed(path[:-1]), start]) if v != start else f"{start} -> {start}"
                if w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    return " / ".join(comp)


def test_qlabench_has_no_module_level_import_cycle():
    graph = import_graph(PKG)
    assert "qlabench.cli" in graph and "qlabench.kernels.forward" in graph and len(graph) > 50
    found = cycles(graph)
    assert not found, "module-level import cycles:\n" + "\n".join(_path(graph, c) for c in found)


def test_the_detector_finds_a_cycle_and_ignores_function_level_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .c import C\n")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("try:\n    from .sub.c import C\nexcept ImportError:\n    C = None\n")
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n"
        "def f():\n    import pkg.a\nclass C:\n    import pkg.a as _a\n")
    (pkg / "d.py").write_text("from .sub import c\n")
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub"] == {"pkg.sub.c"} and graph["pkg.d"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"}  # the class body's import; not f's, not TYPE_CHECKING's
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert _path(graph, found[0]) == "pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"
    (pkg / "sub" / "c.py").write_text("def f():\n    import pkg.a\n")
    assert cycles(import_graph(pkg)) == []
