"""The size of the code a newcomer must read at once (issue 34): no function in ckptfs/ over
MAX_FUNCTION_LINES lines and no module over MAX_MODULE_LINES. Each test names every
offender, not just the first. The guide is about 600 lines a module; the limit here is
where a module must be split even when a split would scatter one idea."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "ckptfs"

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 900


def modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def long_functions(path: Path, limit: int) -> list[str]:
    """``path:line name (N lines)`` for each function or method over ``limit`` lines
    (from its ``def`` to its last line; decorators not counted)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    shown = path.relative_to(PKG.parent) if path.is_relative_to(PKG.parent) else path
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{shown}:{node.lineno} {node.name} "
                           f"({lines} lines)")
    return out


def test_the_measure_counts_a_function_from_def_to_its_last_line(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    body = "".join(f"    x{i} = {i}\n" for i in range(4))
    src.write_text(f"@staticmethod\ndef short():\n{body}\n\nclass C:\n    def m(self):\n"
                   + body.replace("    ", "        "))
    assert long_functions(src, 5) == []
    assert [s.split(" ", 1)[1] for s in long_functions(src, 4)] == ["short (5 lines)",
                                                                   "m (5 lines)"]


def test_no_function_is_over_the_limit() -> None:
    offenders = [f for path in modules() for f in long_functions(path, MAX_FUNCTION_LINES)]
    assert not offenders, (f"{len(offenders)} function(s) over {MAX_FUNCTION_LINES} lines:\n"
                           + "\n".join(offenders))


def test_no_module_is_over_the_limit() -> None:
    offenders = []
    for path in modules():
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{path.relative_to(PKG.parent)} ({lines} lines)")
    assert not offenders, (f"{len(offenders)} module(s) over {MAX_MODULE_LINES} lines:\n"
                           + "\n".join(offenders))
