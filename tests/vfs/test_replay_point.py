"""The tracker's replay point (checkpoints/fence.py, docs/semantics.md "The commit
protocol"): it never passes a commit whose close has not reached the tracker, and it moves
on once it has, so a restart replays only what a crash may have lost."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from tests.vfs.test_vfs import RW, make_daemon

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.checkpoints.tracker import replay_key
from ckptfs.config import CheckpointConfig
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs.context import ROOT


async def test_the_replay_point_waits_for_the_last_writers_release(tmp_path: Path) -> None:
    async with make_daemon(tmp_path, [MemoryTier("m0")], checkpoints=CheckpointConfig()) as d:
        fs, tracker = d.fs, d.tracker
        assert tracker is not None
        key = replay_key(tracker.node)

        async def point() -> int:
            raw = await fs.db(d.catalog.get_meta, key)
            return 0 if raw is None else int(raw)

        async def until_point(above: int) -> int:
            with trio.fail_after(20):
                while (p := await point()) <= above:
                    await trio.sleep(0.05)  # ticks are a second apart: poll, with a deadline
            return p

        fh, inode = await fs.create(ROOT_INODE, b"model.pt", 0o644, RW, ROOT)
        await fs.write(fh, 0, os.urandom(5000))
        await fs.fsync(fh)  # a commit (its audit record), the handle still open
        commit = [e for e in await fs.db(d.catalog.audit_entries) if e.action == "commit"][-1]
        fenced = tracker.fence.oldest()
        assert fenced is not None and fenced <= commit.time_ns
        # The create and write events are recorded; ticks go by; the point stays before
        # the commit while its close has not reached the tracker.
        # An event after the commit (another file's create) and the ticks after it: the
        # point goes as far as the fence and no further, while the close has not come.
        other, _ = await fs.create(ROOT_INODE, b"log.txt", 0o644, RW, ROOT)
        await fs.release(other)
        with trio.fail_after(20):
            while await point() != fenced:
                await trio.sleep(0.05)  # ticks are a second apart: poll, with a deadline
        assert fenced <= commit.time_ns
        await fs.flush(fh)
        await fs.release(fh)  # the last writer: its event is queued, the fence opens
        assert tracker.fence.oldest() is None
        await until_point(commit.time_ns)
