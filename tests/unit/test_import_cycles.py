"""No import circle in ckptfs/: the graph of every import, read from the source (the
layers contract checks the arrows between packages; this checks every module, with the
imports under ``if TYPE_CHECKING:`` and those inside functions, which lint-imports also
reads but a circle inside one package does not break)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "ckptfs"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def _absolute(mod: str, is_package: bool, level: int, target: str | None) -> str:
    """The module a relative ``from`` names, seen from ``mod``."""
    if level == 0:
        return target or ""
    base = mod.split(".") if is_package else mod.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(mod: str, path: Path, modules: set[str]) -> set[str]:
    """The ckptfs modules ``mod`` imports: every ``import`` and ``from ... import``
    anywhere in it; ``from pkg import name`` is an arrow to ``pkg.name`` when that is a
    module, else to ``pkg``."""
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            src = _absolute(mod, is_package, node.level, node.module)
            for a in node.names:
                sub = f"{src}.{a.name}"
                out.add(sub if sub in modules else src)
    return {m for m in out if m in modules and m != mod}


def import_graph() -> dict[str, set[str]]:
    mods = all_modules()
    names = set(mods)
    return {m: imports_of(m, p, names) for m, p in mods.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of ``graph`` (its modules in order, the
    first again at the end); empty if there is none."""
    return [_circle(graph, g) for g in strong_groups(graph)]


def strong_groups(graph: dict[str, set[str]]) -> list[set[str]]:
    """The groups of two or more modules that each reach every other one of the group."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def connect(m: str) -> None:  # Tarjan's algorithm (the graph is a few hundred modules)
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in sorted(graph[m]):
            if n not in index:
                connect(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group: set[str] = set()
            while True:
                n = stack.pop()
                group.add(n)
                if n == m:
                    break
            if len(group) > 1:
                groups.append(group)

    for m in sorted(graph):
        if m not in index:
            connect(m)
    return groups


def _circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A circle through the first module of a strongly connected ``group``: the shortest
    way back to it (breadth first, inside the group)."""
    first = min(group)
    came: dict[str, str] = {}
    todo = [first]
    while todo:
        m = todo.pop(0)
        for n in sorted(graph[m] & group):
            if n == first:
                path = [m]
                while path[-1] != first:
                    path.append(came[path[-1]])
                return [first, *reversed(path[:-1]), first] if m != first else [first, first]
            if n not in came:
                came[n] = m
                todo.append(n)
    raise AssertionError(f"not a strongly connected group: {sorted(group)}")


def test_the_graph_is_read_right() -> None:
    graph = import_graph()
    # A relative ``from . import module`` is an arrow to the module, not to the package.
    assert "ckptfs.catalog.protocols" in graph["ckptfs.catalog"]
    assert "ckptfs.catalog.engines" in graph["ckptfs.catalog.catalog"]


def test_the_cycle_finder_finds_each_circle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}}) == [
        ["c", "d", "c"], ["a", "b", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    graph = import_graph()
    groups = strong_groups(graph)
    assert not groups, "import cycles:\n" + "\n".join(
        " -> ".join(_circle(graph, g)) + f"\n  (its group: {', '.join(sorted(g))})"
        for g in groups)
