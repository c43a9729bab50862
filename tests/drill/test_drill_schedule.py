"""The daemon's own drills (``[drill] interval``), built in the test process with trio's
clock frozen: nothing is drilled before the interval has passed, then each configured run
once per interval, each drill recorded (a run without a committed checkpoint fails); and
the control xattr asked in-process, on a daemon without a remote tier."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.vfs.test_vfs import catalog_of, make_daemon

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.config.model import DrillConfig
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs.context import ROOT


@pytest.mark.allow_log_warnings("restore drill of /run FAILED")
async def test_the_daemon_drills_its_runs_every_interval(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    drill = DrillConfig(interval_s=3600, runs=("/run",), scratch=tmp_path / "scratch")
    remote = MemoryTier("r", kind="remote")
    async with make_daemon(tmp_path, [MemoryTier("l"), remote], drill=drill) as daemon:
        fs = daemon.fs
        cat = catalog_of(fs)
        await fs.mkdir(ROOT_INODE, b"run", 0o755, ROOT)

        async def snapshotted() -> None:
            """Until the bucket's catalog snapshot holds the run directory (what a drill of
            a SQLite mount reads), in real time: the uploader takes it in a thread."""
            deadline = time.monotonic() + 10
            while remote.get_meta("catalog.snapshot") is None \
                    or not await fs.db(cat.snapshot_is_current):
                assert time.monotonic() < deadline, "no catalog snapshot taken"
                await trio.to_thread.run_sync(time.sleep, 0.005)

        async def drilled(n: int) -> None:
            """Until ``n`` drills are recorded, in real time (trio's clock is frozen), the
            catalog asked under its limiter."""
            deadline = time.monotonic() + 10
            while len(await fs.db(cat.drill_rows)) < n:
                assert time.monotonic() < deadline, f"{n} drill(s) not recorded"
                await trio.to_thread.run_sync(time.sleep, 0.005)

        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(2)  # the uploader's spacing of snapshots nobody waits for
        await snapshotted()
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(3597)
        await trio.testing.wait_all_tasks_blocked()
        assert await fs.db(cat.drill_rows) == []  # not before the interval
        mock_clock.jump(1)
        await drilled(1)
        mock_clock.jump(3600)
        await drilled(2)
        rows = await fs.db(cat.drill_rows)
    assert [(r.run, r.result) for r in rows] == [("/run", "failed")] * 2
    assert all(r.problem.startswith("/run: no committed checkpoint in the bucket's catalog "
                                    "snapshot") for r in rows)


@pytest.mark.allow_log_warnings("restore drill of /run FAILED")
async def test_a_drill_without_a_remote_tier_fails_through_the_control_xattr(
    tmp_path: Path,
) -> None:
    """The control xattr in the daemon built in-process: root asks on the mount's root,
    naming the run; the getxattr waits for the report. Without a remote tier a new node
    could restore nothing: the drill fails saying so."""
    drill = DrillConfig(scratch=tmp_path / "scratch")
    async with make_daemon(tmp_path, [MemoryTier("l")], drill=drill) as daemon:
        fs = daemon.fs
        await fs.mkdir(ROOT_INODE, b"run", 0o755, ROOT)
        await fs.setxattr(ROOT_INODE, b"user.ckptfs.drill", b'{"run": "/run"}', ROOT)
        report = json.loads(await fs.getxattr(ROOT_INODE, b"user.ckptfs.drill", ROOT) or b"")
        again = await fs.getxattr(ROOT_INODE, b"user.ckptfs.drill", ROOT)  # a retry (ERANGE)
    assert report["result"] == "failed" and "no remote tier" in report["problems"][0]
    assert json.loads(again or b"") == report
