"""Rules the test suite keeps so that its tests cannot decide each other's verdicts when
they run side by side (scripts/test.sh runs two pytest-xdist workers)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DROP_CACHES = "/proc/sys/vm/drop_caches"


def test_no_test_drops_the_machine_s_page_cache() -> None:
    """A write to /proc/sys/vm/drop_caches empties the page cache of every mount on the
    machine: a test beside it that waits for pages to be cached (the pushed pages of
    mount/test_page_push.py) then sees them requested again, and fails or passes by
    timing. Drop one file's pages instead (mountutil.drop_cached_pages)."""
    offenders = [
        f"{path.relative_to(TESTS)}:{node.lineno}"
        for path in sorted(TESTS.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and node.value.strip() == DROP_CACHES and path != Path(__file__).resolve()
    ]
    assert not offenders, offenders
