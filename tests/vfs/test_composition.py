"""The composition root (mount.build, mount.running) and the chunk layer's commit call."""

import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

from ckptfs.catalog import Catalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.checkpoints.detectors import DetectorSet
from ckptfs.chunks.commit import FileVersion, commit_version
from ckptfs.mount import Daemon, build, running
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs.context import ROOT

CS = 64 * 1024


def daemon_on(cat: Catalog, remote: bool = True) -> Daemon:
    tiers = [MemoryTier("l")] + ([MemoryTier("r", kind="remote")] if remote else [])
    return build(cat, tiers, chunk_size=CS, memory_budget=8 * CS, io_threads=2,
                 detectors=DetectorSet.default())


def test_no_component_is_handed_the_filesystem(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "catalog.sqlite")
    try:
        d = daemon_on(cat)
        for part in (d.store, d.uploader, d.deleter, d.tracker, d.gc, d.janitor, d.telemetry):
            assert not any(v is d.fs for v in vars(part).values()), type(part).__name__
        # What the store wakes and the queues share was given at construction.
        assert d.store.deleter is d.deleter and d.uploader.deleter is d.deleter
        assert d.store.guard is d.uploader.guard is d.deleter.guard
        assert d.store.room is d.uploader.room is d.deleter.room
        assert d.store.spill_copy == d.uploader.copy_uncommitted
    finally:
        cat.close()


async def test_running_drains_writers_then_stops_producers_then_queues(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "catalog.sqlite")
    events: list[str] = []
    try:
        d = daemon_on(cat)
        for name in ("tracker", "janitor", "uploader", "deleter"):
            part = getattr(d, name)

            def recording(run: Callable[[], Awaitable[None]], name: str = name
                          ) -> Callable[[], Awaitable[None]]:
                async def wrapped() -> None:
                    try:
                        await run()
                    finally:
                        events.append(f"{name} ended")
                return wrapped

            part.run = recording(part.run)
        shutdown = d.fs.shutdown

        async def drained() -> None:
            await shutdown()
            events.append("drained")

        d.fs.shutdown = drained  # type: ignore[method-assign]
        async with running(d):
            fh, inode = await d.fs.create(ROOT_INODE, b"f", 0o644, os.O_RDWR, ROOT)
            await d.fs.write(fh, 0, b"x" * 100)  # never closed: the unmount commits it
        assert events[0] == "drained"
        assert sorted(events[1:3]) == ["janitor ended", "tracker ended"]
        assert sorted(events[3:5]) == ["deleter ended", "uploader ended"]
        assert cat.get_inode(inode.ino).size == 100
        assert [r.length for r in cat.extents(inode.ino).values()] == [100]
    finally:
        cat.close()


async def test_a_file_version_commits_in_one_call_of_the_chunk_layer(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "catalog.sqlite")
    try:
        d = daemon_on(cat)
        store = d.store
        # No background services: the upload job and the deletion row stay for us to see.
        inode = cat.create(ROOT_INODE, b"f", stat.S_IFREG | 0o644, 0, 0)
        first = await store.write([os.urandom(CS)])
        assert store.guard.pinned(first.digest)
        v1 = FileVersion(inode.ino, CS, 1, 1, CS, {}, {0: first}, [first])
        committed = await commit_version(store, v1, synced=True)
        assert committed is not None and committed[0].digest == first.digest
        assert cat.extents(inode.ino)[0].digest == first.digest
        assert cat.get_inode(inode.ino).size == CS
        assert not store.guard.pinned(first.digest)  # pins released
        assert [j.tier for j in cat.due_uploads(2**62, 10, set())] == ["r"]  # same transaction
        assert d.uploader._wake.is_set()  # the uploader was told
        second = await store.write([os.urandom(CS // 2)])
        v2 = FileVersion(inode.ino, CS // 2, 2, 2, CS, committed, {0: second}, [second])
        committed = await commit_version(store, v2, synced=False)
        assert committed is not None and committed[0].digest == second.digest
        assert not cat.has_chunk(first.digest)  # the replaced chunk was collected ...
        assert {q.tier for q in cat.deletion_backlog()} >= {"l"}  # ... into the deletion queue
        # Nothing changed: nothing to commit, the caller keeps its state.
        same = FileVersion(inode.ino, CS // 2, 2, 2, CS, committed, {}, [])
        assert await commit_version(store, same, synced=True) is None
    finally:
        cat.close()
