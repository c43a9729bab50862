"""Fixtures of the framework compatibility suite (issue 6; see compatkit.py).

tests/conftest.py applies too: it starts the one SeaweedFS of the session (``seaweed``).
``remote`` (credentials in the environment, a fresh bucket prefix) comes from
tests/support/s3fixtures.py; ``nodes`` gives node 1 and its replacement on that prefix.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compat.compatkit import Nodes
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON


@pytest.fixture
def nodes(
    tmp_path: Path, remote: tuple[str, str], request: pytest.FixtureRequest  # noqa: F811
) -> Iterator[Nodes]:
    if not FUSE_AVAILABLE:
        pytest.skip(SKIP_REASON)
    url, _prefix = remote
    # Node 2 restores node 1's catalog with its own tier paths: the daemon says the tiers moved.
    request.node.add_marker(pytest.mark.allow_log_warnings("moved from"))
    n = Nodes(tmp_path, url, request)
    failed = True
    try:
        yield n
        failed = False
    finally:
        rep = getattr(request.node, "rep_call", None)
        n.close(failed=failed or (rep is not None and rep.failed))
