"""The fsync path of the chunk store (chunks/store.py): the frames of a file are fsynced
all at once and apart from the chunk writes, and with write-behind each frame is fsynced
as soon as it is written, its failure kept for the file's own fsync to report."""

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from ckptfs.catalog import Catalog, SqliteCatalog
from ckptfs.chunks.store import ChunkStore, StorePolicy
from ckptfs.errors import TierError
from ckptfs.testing.tiers import FaultyTier, MemoryTier


class SyncLog(MemoryTier):
    """A memory tier that records the keys of every sync call and can hold them."""

    def __init__(self, name: str = "l") -> None:
        super().__init__(name)
        self.sync_calls: list[list[str]] = []
        self.barrier: threading.Barrier | None = None  # every sync waits at it
        self.gate: threading.Event | None = None  # every sync waits for it
        self.held = 0
        self._lock = threading.Lock()

    def sync(self, keys: Sequence[str]) -> None:
        with self._lock:
            self.sync_calls.append(list(keys))
            self.held += 1
        try:
            if self.barrier is not None:
                self.barrier.wait()  # BrokenBarrierError if the others never come
            if self.gate is not None and not self.gate.wait(timeout=30):
                raise TierError("sync gate never opened")
        finally:
            with self._lock:
                self.held -= 1

    def synced_keys(self) -> set[str]:
        with self._lock:
            return {k for call in self.sync_calls for k in call}


async def until(cond: Any, timeout: float = 10) -> None:
    """Wait for a condition a worker thread sets (no event crosses the thread)."""
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.005)


def make_store(tmp_path: Path, tier: Any, io_threads: int = 2, **kw: Any) -> tuple[ChunkStore, Catalog]:
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    store = ChunkStore([tier], cat, trio.CapacityLimiter(1),
                       StorePolicy(io_threads=io_threads, cache_bytes=1 << 20, **kw))
    return store, cat


async def test_the_frames_of_a_file_are_fsynced_at_once(tmp_path: Path) -> None:
    """Four frames, four fsyncs in flight together (concurrent fsyncs share a journal
    commit and a flush); one after the other, each paid its own flush."""
    tier = SyncLog()
    store, cat = make_store(tmp_path, tier, write_behind="never")
    try:
        refs = [await store.write([os.urandom(3000)]) for _ in range(4)]
        tier.barrier = threading.Barrier(4, timeout=10)
        with trio.fail_after(20):
            await store.sync(refs)
        assert tier.synced_keys() == {r.key for r in refs}
        calls = len(tier.sync_calls)
        await store.sync(refs)  # known synced: nothing to do
        assert len(tier.sync_calls) == calls
    finally:
        cat.close()


async def test_a_waiting_fsync_leaves_the_write_threads_alone(tmp_path: Path) -> None:
    """An fsync waiting for the device does not hold a thread that chunk writes need:
    with one I/O thread, a chunk write completes while two fsyncs wait."""
    tier = SyncLog()
    store, cat = make_store(tmp_path, tier, io_threads=1, write_behind="never")
    gate = threading.Event()
    try:
        refs = [await store.write([os.urandom(3000)]) for _ in range(2)]
        tier.gate = gate
        async with trio.open_nursery() as n:
            n.start_soon(store.sync, refs)
            await until(lambda: tier.held == 2)
            with trio.fail_after(10):
                ref = await store.write([b"written meanwhile" * 100])
            assert ref.tiers == ("l",)
            assert tier.held == 2  # the fsyncs are still waiting
            gate.set()
    finally:
        gate.set()
        cat.close()


async def test_write_behind_follows_whether_saves_fsync(tmp_path: Path) -> None:
    """``auto``: after a commit by fsync, each new frame is fsynced as it is written (the
    file's fsync then has nothing left); after a commit by close alone, not."""
    tier = SyncLog()
    store, cat = make_store(tmp_path, tier, write_behind="auto")
    try:
        async with trio.open_nursery() as n:
            store.attach(n)
            first = await store.write([os.urandom(3000)])
            await trio.testing.wait_all_tasks_blocked()
            assert tier.sync_calls == []  # nothing says the saves fsync yet
            store.writer.note_commit(synced=True, new_chunks=True)
            ref = await store.write([os.urandom(3000)])
            await until(lambda: ref.key in tier.synced_keys())
            await until(lambda: not store.writer._behind)
            calls = len(tier.sync_calls)
            await store.sync([ref])
            assert len(tier.sync_calls) == calls  # already synced by the write-behind
            assert store.stats.get("write_behind_syncs") == 1
            store.writer.note_commit(synced=False, new_chunks=True)
            late = await store.write([os.urandom(3000)])
            await trio.testing.wait_all_tasks_blocked()
            assert late.key not in tier.synced_keys()
            assert first.key not in tier.synced_keys()
            n.cancel_scope.cancel()
    finally:
        cat.close()


@pytest.mark.allow_log_errors
async def test_a_failed_write_behind_fsync_fails_the_files_fsync(tmp_path: Path) -> None:
    """The kernel reports a writeback error to one fsync only: a failed write-behind fsync
    is kept and reported by the file's fsync, which must not succeed by trying again."""
    tier = FaultyTier(MemoryTier("l"))
    store, cat = make_store(tmp_path, tier, write_behind="always")
    try:
        async with trio.open_nursery() as n:
            store.attach(n)
            tier.fail_syncs = True
            ref = await store.write([os.urandom(3000)])
            await until(lambda: not store.writer._behind)
            tier.fail_syncs = False  # a retry would succeed now
            with pytest.raises(TierError, match="injected EIO on fsync"):
                await store.sync([ref])
            await store.sync([ref])  # reported once; a later fsync syncs the frame anew
            n.cancel_scope.cancel()
    finally:
        cat.close()


async def test_an_fsync_waits_for_the_write_behind_of_its_frames(tmp_path: Path) -> None:
    """A file's fsync joins the write-behind fsync of its frame in flight rather than
    returning before it (or fsyncing again beside it)."""
    tier = SyncLog()
    store, cat = make_store(tmp_path, tier, write_behind="always")
    gate = threading.Event()
    try:
        async with trio.open_nursery() as n:
            store.attach(n)
            tier.gate = gate
            ref = await store.write([os.urandom(3000)])
            await until(lambda: tier.held == 1)
            done = trio.Event()

            async def fsync() -> None:
                await store.sync([ref])
                done.set()

            n.start_soon(fsync)
            await trio.testing.wait_all_tasks_blocked()
            assert not done.is_set()
            gate.set()
            with trio.fail_after(10):
                await done.wait()
            assert tier.sync_calls == [[ref.key]]
            n.cancel_scope.cancel()
    finally:
        gate.set()
        cat.close()
