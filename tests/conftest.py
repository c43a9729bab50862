"""Shared fixtures for tests that need a real ckptfs mount.

``ckpt``          a live mount (two local tiers, 256 KiB chunks) for one test.
``ckpt_factory``  make mounts that a test can unmount and mount again with the same state.

After every test that used a mount, the daemon log must hold no ``ERROR`` or
``Traceback`` line, unless the test is marked ``@pytest.mark.allow_log_errors``.
Mounts are always unmounted and their daemons stopped, also when the test fails.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mountutil  # noqa: E402
from mountutil import Mount  # noqa: E402

# The real S3 server fixtures, here so that one SeaweedFS serves the whole session.
from s3fixtures import s3_tier, s3_tier_factory, seaweed  # noqa: E402, F401

# Small chunks so that multi-chunk files, chunk boundaries and partial chunks are cheap.
TEST_CHUNK_SIZE = 256 * 1024
TEST_MOUNT_ARGS: tuple[str, ...] = ("--chunk-size", "256KiB")

_LOG_BAD_MARKERS = ("ERROR", "Traceback")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The framework suite trains real models: all of it is slow (`-m 'not slow'` skips it).
    compat = Path(__file__).resolve().parent / "compat"
    for item in items:
        if compat in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slow)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "allow_log_errors: the test provokes errors on purpose; do not fail it on ERROR or "
        "Traceback lines in the ckptfs daemon log",
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    # Remember each phase's report on the item, so fixtures can tell whether the test failed.
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def bad_log_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if any(m in line for m in _LOG_BAD_MARKERS)]


def _finish_mount(request: pytest.FixtureRequest, mounts: Sequence[Mount]) -> None:
    """After the mounts are gone: show logs of failed tests, enforce a clean log."""
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        # The test already failed: show the daemon's side instead of reporting it twice.
        for m in mounts:
            tail = "\n".join(m.log.splitlines()[-80:])
            print(f"--- ckptfs log tail ({m.state_dir}) ---\n{tail}")
        return
    if request.node.get_closest_marker("allow_log_errors"):
        return
    problems = []
    for m in mounts:
        bad = bad_log_lines(m.log)
        if bad:
            problems.append(f"{m.state_dir / 'ckptfs.log'}:\n" + "\n".join(bad[:40]))
    assert not problems, "ckptfs daemon logged errors:\n" + "\n".join(problems)


def _require_fuse() -> None:
    if not mountutil.FUSE_AVAILABLE:
        pytest.skip(mountutil.SKIP_REASON)


@pytest.fixture
def ckpt(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Mount]:
    """A live ckptfs mount with two local tiers and 256 KiB chunks."""
    _require_fuse()
    holder: list[Mount] = []
    try:
        with mountutil.mounted(tmp_path, n_local=2, extra_args=TEST_MOUNT_ARGS) as m:
            holder.append(m)
            yield m
    finally:
        _finish_mount(request, holder)


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
def ckpt_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[CkptFactory]:
    _require_fuse()
    factory: CkptFactory | None = None
    try:
        with contextlib.ExitStack() as stack:
            factory = CkptFactory(tmp_path, stack)
            yield factory
    finally:
        _finish_mount(request, factory.mounts if factory else [])
