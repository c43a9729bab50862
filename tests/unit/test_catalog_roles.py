"""No component is typed against the whole catalog (issue 34): each parameter or attribute
that holds the catalog names the role Protocols it uses (ckptfs/catalog/protocols.py).
Only the catalog package itself and the composition root (which opens the catalog and hands
each component its roles) may hold the whole ``Catalog``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The composition root and the lifecycle that opens the catalog.
ALLOWED = ("ckptfs/catalog/", "ckptfs/daemon/build.py", "ckptfs/mount.py")
WHOLE = re.compile(r"\bCatalog\b")


def _names(node: ast.expr | None) -> str:
    return "" if node is None else ast.unparse(node)


def whole_catalog_annotations(source: str, rel: str) -> list[str]:
    tree = ast.parse(source)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if a is not None and WHOLE.search(_names(a.annotation)):
                    found.append(f"{rel}:{a.lineno} {node.name}({a.arg}: {_names(a.annotation)})")
        elif isinstance(node, ast.AnnAssign) and WHOLE.search(_names(node.annotation)):
            found.append(f"{rel}:{node.lineno} {_names(node.target)}: {_names(node.annotation)}")
    return found


def test_no_component_takes_the_whole_catalog() -> None:
    offenders: list[str] = []
    for path in sorted((REPO / "ckptfs").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if not rel.startswith(ALLOWED):
            offenders += whole_catalog_annotations(path.read_text(), rel)
    assert not offenders, "typed against the whole Catalog:\n" + "\n".join(offenders)


def test_the_check_sees_a_whole_catalog_parameter() -> None:
    # The scan is not vacuous: a parameter and an attribute of the whole Catalog are found,
    # a role is not.
    source = (
        "from ckptfs.catalog.protocols import Catalog, MetaCatalog\n"
        "class C:\n    cat: Catalog\n    meta: MetaCatalog\n"
        "def f(catalog: 'Catalog | None', meta: MetaCatalog) -> None: ...\n"
    )
    found = whole_catalog_annotations(source, "probe.py")
    assert sorted(found) == ["probe.py:3 cat: Catalog", "probe.py:5 f(catalog: 'Catalog | None')"]
