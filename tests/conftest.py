"""Shared fixtures for tests that need a real ckptfs mount.

``ckpt``          a live mount (two local tiers, 256 KiB chunks) for one test.
``ckpt_factory``  make mounts that a test can unmount and mount again with the same state.

The daemon-log check (``daemon_log_check``, autouse) covers every test that starts a
daemon, however it does: every ``ckptfs mount`` built by mountutil registers its log, and
the records of the ``ckptfs`` loggers in the test process (daemons built in-process:
``make_daemon``, ``make_fs``, ``daemon.build``) are collected while the test runs. The
lines a test's daemons logged must hold no ``ERROR``, ``CRITICAL`` or ``Traceback`` line
unless the test is marked ``@pytest.mark.allow_log_errors``, and no ``WARNING`` line unless
it is marked ``@pytest.mark.allow_log_warnings`` (with arguments: only warnings that contain
one of them). Mounts are always unmounted and their daemons stopped, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.support import mountutil

# A catalog on each engine (SQLite, the session's PostgreSQL) for the catalog tests.
from tests.support.catalogs import cat  # noqa: F401
from tests.support.mountutil import Mount

# The real PostgreSQL fixtures, likewise one server for the session.
from tests.support.pgfixtures import nodes, pg_url, postgres  # noqa: F401

# The real S3 server fixtures, here so that one SeaweedFS serves the whole session.
from tests.support.s3fixtures import (  # noqa: F401
    own_seaweed,
    remote,
    s3_tier,
    s3_tier_factory,
    seaweed,
)

# Small chunks so that multi-chunk files, chunk boundaries and partial chunks are cheap.
TEST_CHUNK_SIZE = 256 * 1024
TEST_MOUNT_ARGS: tuple[str, ...] = ("--chunk-size", "256KiB")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every test module sits in the directory of its layer (tests/README.md), also one a
    # branch added while the suite was flat.
    tests = Path(__file__).resolve().parent
    flat = sorted({str(item.path) for item in items if item.path.resolve().parent == tests})
    if flat:
        raise pytest.UsageError(
            "test modules belong in a layer directory (tests/README.md): " + ", ".join(flat)
        )
    # The framework suite trains real models: all of it is slow (`-m 'not slow'` skips it).
    compat = tests / "compat"
    for item in items:
        if compat in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slow)


_PYCACHE_PREFIX: list[str] = []  # the bytecode cache this session made (removed at its end)


def _cache_bytecode_of_children() -> None:
    """Where the environment asks Python to write no bytecode (PYTHONDONTWRITEBYTECODE),
    every daemon and CLI call a test starts would compile ckptfs anew (~0.1 s for a CLI
    call, ~0.3 s for a daemon): they keep it in a cache of this session's own instead,
    outside the source tree (PYTHONPYCACHEPREFIX; this process goes on writing none)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = tempfile.mkdtemp(prefix="ckptfs-test-pycache-")
    _PYCACHE_PREFIX.append(prefix)
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = prefix


def pytest_unconfigure(config: pytest.Config) -> None:
    for prefix in _PYCACHE_PREFIX:
        shutil.rmtree(prefix, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    _cache_bytecode_of_children()
    config.addinivalue_line(
        "markers",
        "allow_log_errors: the test provokes errors on purpose; do not fail it on ERROR or "
        "Traceback lines in the ckptfs daemon log or the in-process ckptfs loggers",
    )
    config.addinivalue_line(
        "markers",
        "allow_log_warnings(*substrings): the test provokes daemon warnings on purpose; do "
        "not fail it on WARNING lines in the ckptfs daemon log or loggers (with arguments: "
        "only on warnings that contain none of them)",
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    # Remember each phase's report on the item, so fixtures can tell whether the test failed.
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def bad_log_lines(lines: Sequence[str], item: pytest.Item) -> list[str]:
    """The lines of a daemon log that ``item``'s markers do not allow."""
    # Every allow_log_warnings marker counts (test, class, module, or added by a fixture);
    # one without arguments allows any warning.
    warn_markers = list(item.iter_markers("allow_log_warnings"))
    allowed: tuple[str, ...] | None = None
    if warn_markers:
        allowed = () if any(not m.args for m in warn_markers) else tuple(
            a for m in warn_markers for a in m.args
        )
    return mountutil.disallowed_log_lines(
        lines,
        allow_errors=item.get_closest_marker("allow_log_errors") is not None,
        allowed_warnings=allowed,
    )


@pytest.fixture(autouse=True)
def daemon_log_check(request: pytest.FixtureRequest) -> Iterator[None]:
    """After the test and its mounts are gone: show the daemon logs of a failed test, else
    fail on log lines its markers do not allow. Autouse and set up first, so it is torn
    down after every mount fixture of the test."""
    in_process = mountutil.InProcessLog()
    in_process.attach()
    try:
        yield
    finally:
        in_process.detach()
    new: dict[str, list[str]] = {
        str(log): lines for log, lines in mountutil.DAEMON_LOGS.take_new().items()
    }
    if in_process.lines:
        new[in_process.LABEL] = in_process.lines
    node = request.node
    failed = any(
        (rep := getattr(node, f"rep_{when}", None)) is not None and rep.failed
        for when in ("setup", "call")
    )
    if failed:
        # The test already failed: show the daemon's side instead of reporting it twice.
        for log, lines in new.items():
            if log == in_process.LABEL:
                continue  # pytest shows the test's captured log records itself
            tail = "\n".join(lines[-80:])
            print(f"--- ckptfs log tail ({log}) ---\n{tail}")
        return
    problems = []
    for log, lines in new.items():
        bad = bad_log_lines(lines, node)
        if bad:
            problems.append(f"{log}:\n" + "\n".join(bad[:40]))
    assert not problems, (
        "ckptfs daemon logged lines the test does not allow (mark it allow_log_errors / "
        "allow_log_warnings if it provokes them):\n" + "\n".join(problems)
    )


def _require_fuse() -> None:
    if not mountutil.FUSE_AVAILABLE:
        pytest.skip(mountutil.SKIP_REASON)


@pytest.fixture
def ckpt(tmp_path: Path) -> Iterator[Mount]:
    """A live ckptfs mount with two local tiers and 256 KiB chunks."""
    _require_fuse()
    with mountutil.mounted(tmp_path, n_local=2, extra_args=TEST_MOUNT_ARGS) as m:
        yield m


class CkptFactory:
    """Makes ckptfs mounts, each with its own state and tiers under ``base``.

    ``m = factory.mount()`` returns a live mount; ``m.stop()`` / ``m.start()`` (or
    ``factory.remount(m)``) unmount it and mount it again with the same state dir and tiers.
    Everything is unmounted at the end of the test.
    """

    def __init__(self, base: Path, stack: contextlib.ExitStack) -> None:
        self.base = base
        self._stack = stack
        self.mounts: list[Mount] = []

    def mount(
        self, n_local: int = 2, extra_args: Sequence[str] = TEST_MOUNT_ARGS, name: str | None = None
    ) -> Mount:
        name = name or f"fs{len(self.mounts)}"
        m = self._stack.enter_context(
            mountutil.mounted(self.base / name, n_local=n_local, extra_args=extra_args)
        )
        self.mounts.append(m)
        return m

    @staticmethod
    def remount(m: Mount) -> None:
        m.stop()
        assert not mountutil.is_mounted(m.mountpoint), "still mounted after ckptfs umount"
        m.start()


@pytest.fixture
def ckpt_factory(tmp_path: Path) -> Iterator[CkptFactory]:
    _require_fuse()
    with contextlib.ExitStack() as stack:
        yield CkptFactory(tmp_path, stack)
