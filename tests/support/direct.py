"""A mount whose direct socket (ckptfs/direct, docs/direct-path.md) lives in a runtime dir
of the test: the daemon and the test's clients find it through ``CKPTFS_RUNTIME_DIR``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.mountutil import Mount, mounted, wait_until

from ckptfs.client import find_socket


@contextlib.contextmanager
def direct_mounted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n_local: int,
                   extra_args: Sequence[str]) -> Iterator[Mount]:
    """A live mount under ``tmp_path`` once its direct socket answers."""
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    monkeypatch.setenv("CKPTFS_RUNTIME_DIR", str(run))
    with mounted(tmp_path, n_local, extra_args) as m:
        wait_until(lambda: find_socket(m.mountpoint), what="the direct socket")
        yield m
