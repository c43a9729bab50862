"""A catalog outage in the middle of the tracker's batch (a shared catalog's database went
away): the service pauses and starts the tracker again, and the batch it was recording is
recorded first, so the commit signal in it is not lost (docs/semantics.md, "The commit
protocol"). A bug on one event costs that event only."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from ckptfs.catalog import SqliteCatalog
from ckptfs.catalog.rows import CheckpointState
from ckptfs.checkpoints.detectors import DetectorSet
from ckptfs.checkpoints.events import FsEvent
from ckptfs.checkpoints.tracker import CheckpointTracker, replay_key
from ckptfs.errors import CatalogUnavailable


class FlakyCatalog(SqliteCatalog):
    """The first ``checkpoint_commit`` finds the database away; ``rename_checkpoints`` of
    ``/bad`` has a bug."""

    outages = 1

    def checkpoint_commit(self, *args: Any, **kw: Any) -> None:
        if self.outages:
            self.outages -= 1
            raise CatalogUnavailable("database away (test)")
        super().checkpoint_commit(*args, **kw)

    def rename_checkpoints(self, old: str, new: str) -> None:
        if old == "/bad":
            raise RuntimeError("a bug (test)")
        super().rename_checkpoints(old, new)


def committed(cat: SqliteCatalog, root: str) -> bool:
    return any(r.root == root and r.state is CheckpointState.COMMITTED
               for r in cat.checkpoint_rows(root))


@pytest.mark.allow_log_errors("checkpoint tracker failed on rename /elsewhere")
async def test_a_batch_an_outage_interrupted_is_recorded_when_the_tracker_starts_again(
    tmp_path: Path,
) -> None:
    cat = FlakyCatalog(tmp_path / "catalog.sqlite")
    tracker = CheckpointTracker(cat, trio.CapacityLimiter(1), DetectorSet.default(), lambda: [])
    now = time.time_ns()
    tracker.push(FsEvent("mkdir", "/run/checkpoint-1", now, is_dir=True))
    tracker.push(FsEvent("rename", "/elsewhere", now + 1, src="/bad", is_dir=True))
    tracker.push(FsEvent("release", "/run/checkpoint-1/trainer_state.json", now + 2,
                         size=2, last_writer=True, content=b"{}"))
    runs = 0
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def service() -> None:  # as mount._Services runs it: again after an outage
                nonlocal runs
                while True:
                    runs += 1
                    try:
                        await tracker.run()
                    except CatalogUnavailable:
                        continue

            nursery.start_soon(service)
            while not await trio.to_thread.run_sync(committed, cat, "/run/checkpoint-1"):
                await trio.sleep(0.02)  # the tracker's thread records it: poll, with a deadline
            nursery.cancel_scope.cancel()
    assert runs == 2  # the outage ended the first run; the second recorded the batch
    assert tracker.commits == 1
    cat.close()


async def test_the_drain_at_a_clean_unmount_records_what_is_queued_and_moves_the_point(
    tmp_path: Path,
) -> None:
    """At a clean unmount the tracker is stopped with events still queued (a RELEASE the
    kernel sent last): drain() records them and moves the replay point to now, so the
    next mount has nothing to replay."""
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    tracker = CheckpointTracker(cat, trio.CapacityLimiter(1), DetectorSet.default(), lambda: [],
                                node="n1")
    now = time.time_ns()
    tracker.push(FsEvent("release", "/run/checkpoint-2/trainer_state.json", now,
                         size=2, last_writer=True, content=b"{}"))
    await tracker.drain()
    assert committed(cat, "/run/checkpoint-2")
    point = cat.get_meta(replay_key("n1"))
    assert point is not None and int(point) > now
    cat.close()
