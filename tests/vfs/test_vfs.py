"""The filesystem core without the kernel: data path, faults, garbage collection."""

import errno
import os
import stat
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from tests.support.daemons import build_daemon, hooked_sqlite

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.catalog.protocols import Catalog
from ckptfs.chunks.store import ChunkStore
from ckptfs.config import ReadConfig
from ckptfs.daemon.build import Daemon
from ckptfs.daemon.services import running
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.upload.uploader import Uploader
from ckptfs.vfs.context import ROOT
from ckptfs.vfs.filesystem import Filesystem

CS = 64 * 1024
RW = os.O_RDWR


@asynccontextmanager
async def make_daemon(path: Path, tiers: list[Tier], **options: Any) -> AsyncIterator[Daemon]:
    """The daemon's object graph as mount.py builds and runs it (without FUSE). Leaving
    the block stops it as a crash would: open files are not committed (drain=False)."""
    cat, wakeups = hooked_sqlite(path / "catalog.sqlite")
    async with daemon_on(cat, tiers, wakeups=wakeups, **options) as daemon:
        yield daemon


@asynccontextmanager
async def daemon_on(cat: Catalog, tiers: list[Tier], **options: Any) -> AsyncIterator[Daemon]:
    """``make_daemon`` on a catalog of the caller's (closed when the block ends); give
    ``wakeups`` when it was opened with them as its hooks."""
    try:
        daemon = build_daemon(cat, tiers, **options)
        async with running(daemon, drain=False):
            yield daemon
    finally:
        cat.close()


@asynccontextmanager
async def make_fs(path: Path, tiers: list[Tier], **options: Any) -> AsyncIterator[Filesystem]:
    async with make_daemon(path, tiers, **options) as daemon:
        yield daemon.fs


def uploader_of(fs: Filesystem) -> Uploader:
    """The upload queue behind ``fs`` (the filesystem itself only sees a DurableWaiter),
    for tests that drive or inspect it."""
    up = fs.uploader
    assert isinstance(up, Uploader)
    return up


def catalog_of(fs: Filesystem) -> Catalog:
    """The whole catalog behind ``fs`` (the filesystem is typed against the catalog roles
    it uses), for tests that inspect the upload and deletion queues or the replicas."""
    return cast(Catalog, fs.catalog)


def store_of(fs: Filesystem) -> ChunkStore:
    """The chunk store behind ``fs`` (the filesystem itself only sees the chunk service),
    for tests that drive or inspect its parts."""
    store = fs.store
    assert isinstance(store, ChunkStore)
    return store


async def deletions_done(fs: Filesystem, timeout: float = 10) -> None:
    """Wait until the deletion queue is empty (frames are deleted in the background)."""
    with trio.fail_after(timeout):
        while await fs.db(catalog_of(fs).deletion_backlog):
            await trio.sleep(0.01)  # polling the catalog for the condition, with a deadline


async def until_backlog_empty(fs: Filesystem, timeout: float = 10) -> None:
    """Until the upload backlog is empty, in real time, asked under the catalog limiter
    (the trio thread must not use the SQLite connection a worker thread may be using)."""
    deadline = time.monotonic() + timeout
    while (await fs.db(catalog_of(fs).backlog)).chunks:
        assert time.monotonic() < deadline, "the backlog did not empty"
        await trio.to_thread.run_sync(time.sleep, 0.005)


async def until_real(cond: Any, timeout: float = 10) -> None:
    """Until ``cond`` holds, in real time: for tests that freeze trio's clock (MockClock),
    the wait is in a thread."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await trio.to_thread.run_sync(time.sleep, 0.005)


async def write_file(fs: Filesystem, name: bytes, data: bytes, step: int = 10_000) -> int:
    fh, inode = await fs.create(ROOT_INODE, name, 0o644, RW, ROOT)
    for off in range(0, len(data), step):
        await fs.write(fh, off, data[off : off + step])
    await fs.flush(fh)
    await fs.release(fh)
    return inode.ino


async def read_file(fs: Filesystem, name: bytes) -> bytes:
    inode = await fs.lookup(ROOT_INODE, name)
    fh = await fs.open(inode.ino, os.O_RDONLY)
    try:
        return bytes(await fs.read(fh, 0, inode.size + 10))
    finally:
        await fs.release(fh)


async def test_round_trip_across_restart(tmp_path: Path) -> None:
    tiers: list[Tier] = [MemoryTier("a"), MemoryTier("b")]
    data = os.urandom(5 * CS + 123)
    async with make_fs(tmp_path, tiers) as fs:
        await write_file(fs, b"f", data)
        assert await read_file(fs, b"f") == data
    # Both tiers got chunks: the file is striped.
    assert all(len(t.frames) > 0 for t in tiers)  # type: ignore[attr-defined]
    async with make_fs(tmp_path, tiers) as fs:
        assert await read_file(fs, b"f") == data
        assert (await fs.lookup(ROOT_INODE, b"f")).size == len(data)


@pytest.mark.allow_log_errors
async def test_failed_tier_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = FaultyTier(MemoryTier("bad"))
    bad.fail_puts = True
    good = MemoryTier("good")
    data = os.urandom(4 * CS)
    async with make_fs(tmp_path, [bad, good]) as fs:
        await write_file(fs, b"f", data)
        assert await read_file(fs, b"f") == data
    assert len(good.frames) == 4
    assert "tier bad failed" in caplog.text


@pytest.mark.allow_log_errors
async def test_all_tiers_failing_gives_eio_and_keeps_old_content(tmp_path: Path) -> None:
    t = FaultyTier(MemoryTier("only"))
    old = b"old content"
    async with make_fs(tmp_path, [t]) as fs:
        ino = await write_file(fs, b"f", old)
        t.fail_puts = True
        fh = await fs.open(ino, RW | os.O_TRUNC)
        for off in range(0, 3 * CS, CS):
            try:
                await fs.write(fh, off, os.urandom(CS))
            except CkptfsError as exc:
                assert exc.errno == errno.EIO
                break
        with pytest.raises(CkptfsError) as info:
            await fs.flush(fh)
        assert info.value.errno == errno.EIO
        await fs.release(fh)
        t.fail_puts = False
        assert await read_file(fs, b"f") == old


@pytest.mark.allow_log_errors
async def test_full_tiers_give_enospc(tmp_path: Path) -> None:
    tiers: list[Tier] = [MemoryTier("a", capacity=CS), MemoryTier("b", capacity=CS)]
    async with make_fs(tmp_path, tiers) as fs:
        with pytest.raises(CkptfsError) as info:
            await write_file(fs, b"big", os.urandom(4 * CS))
        assert info.value.errno == errno.ENOSPC


@pytest.mark.allow_log_errors
async def test_corrupt_copy_gives_eio_never_wrong_bytes(tmp_path: Path) -> None:
    t = FaultyTier(MemoryTier("m"))
    async with make_fs(tmp_path, [t]) as fs:
        await write_file(fs, b"f", os.urandom(2 * CS))
    t.corrupt_gets = True
    # No readahead: a readahead fetch abandoned when the file is released would log its
    # corrupt chunk from its thread after this test ended (into the next test's log check).
    async with make_fs(tmp_path, [t], reads=ReadConfig(readahead=0)) as fs:
        with pytest.raises(CkptfsError) as info:
            await read_file(fs, b"f")
        assert info.value.errno == errno.EIO


class BuggyGets(MemoryTier):
    """Raises an unexpected exception (not a CkptfsError: a bug, or a library that
    changed under us) on gets of ``bad`` keys."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.bad: set[str] = set()
        self.raised = threading.Event()

    def get(self, key: str) -> bytes | None:
        if key in self.bad:
            self.raised.set()
            raise ValueError("data and buf must not overlap")
        return super().get(key)


@pytest.mark.allow_log_errors
async def test_an_unexpected_error_in_a_readahead_does_not_stop_the_daemon(
    tmp_path: Path,
) -> None:
    # A readahead runs in the mount's nursery: an exception escaping it would end the
    # daemon (every later call ENOTCONN). The reader that needs the chunk sees the error.
    t = BuggyGets("m")
    head, rest = os.urandom(CS), os.urandom(3 * CS)
    async with make_fs(tmp_path, [t], reads=ReadConfig(readahead=3 * CS)) as fs:
        await write_file(fs, b"head", head)
        first = set(t.frames)
        ino = await write_file(fs, b"f", head + rest)
        t.bad = set(t.frames) - first
        store_of(fs).cache.entries.clear()
        fh = await fs.open(ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, 0, CS)) == head  # starts readaheads of chunks 1-3
        assert await trio.to_thread.run_sync(t.raised.wait, 30)  # a readahead met the bug
        await wait_all_tasks_blocked()  # its task ended; the daemon lives on
        with pytest.raises(ValueError):
            await fs.read(fh, CS, CS)  # the reader sees it (the FUSE adapter maps it to EIO)
        t.bad.clear()
        assert bytes(await fs.read(fh, CS, 3 * CS)) == rest
        await fs.release(fh)


async def test_unlinked_open_file_lives_until_release(tmp_path: Path) -> None:
    t = MemoryTier("m")
    data = os.urandom(3 * CS)
    async with make_fs(tmp_path, [t]) as fs:
        ino = await write_file(fs, b"f", data)
        fh = await fs.open(ino, os.O_RDONLY)
        await fs.unlink(ROOT_INODE, b"f")
        assert await fs.read(fh, 0, len(data)) == data
        assert len(t.frames) == 3
        await fs.release(fh)
        await deletions_done(fs)
        assert t.frames == {}
        with pytest.raises(CkptfsError):
            await fs.getattr(ino)


async def test_overwrite_and_truncate_reclaim_old_chunks(tmp_path: Path) -> None:
    t = MemoryTier("m")
    async with make_fs(tmp_path, [t]) as fs:
        ino = await write_file(fs, b"f", os.urandom(4 * CS))
        fh = await fs.open(ino, RW)
        await fs.write(fh, CS + 5, b"patch")  # read-modify-write of chunk 1
        await fs.setattr(ino, size=2 * CS + 7)  # drops chunks 2 and 3, trims nothing
        await fs.flush(fh)
        await fs.release(fh)
        await deletions_done(fs)
        assert len(t.frames) == 3  # chunks 0, new 1, new 2 (7 bytes)
        got = await read_file(fs, b"f")
        assert len(got) == 2 * CS + 7 and got[CS + 5 : CS + 10] == b"patch"


async def test_identical_chunks_are_stored_once(tmp_path: Path) -> None:
    t = MemoryTier("m")
    data = os.urandom(2 * CS)
    async with make_fs(tmp_path, [t]) as fs:
        await write_file(fs, b"a", data)
        await write_file(fs, b"b", data)
        assert len(t.frames) == 2
        await fs.unlink(ROOT_INODE, b"a")
        await deletions_done(fs)
        assert len(t.frames) == 2
        assert await read_file(fs, b"b") == data
        await fs.unlink(ROOT_INODE, b"b")
        await deletions_done(fs)
        assert t.frames == {}


async def test_sparse_file_reads_zeros(tmp_path: Path) -> None:
    async with make_fs(tmp_path, [MemoryTier("m")]) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"s", 0o644, RW, ROOT)
        await fs.write(fh, 3 * CS + 10, b"end")
        await fs.flush(fh)
        await fs.release(fh)
        got = await read_file(fs, b"s")
        assert got == bytes(3 * CS + 10) + b"end"
        assert stat.S_ISREG(inode.mode)


async def test_many_partial_chunks_do_not_deadlock_the_budget(tmp_path: Path) -> None:
    # The budget holds 8 chunks; 12 files each hold a partial chunk at once.
    async with make_fs(tmp_path, [MemoryTier("m")]) as fs:
        handles = []
        with trio.fail_after(20):
            for i in range(12):
                fh, _ = await fs.create(ROOT_INODE, f"f{i}".encode(), 0o644, RW, ROOT)
                await fs.write(fh, 0, bytes([i]) * (CS // 2))
                handles.append(fh)
            for i, fh in enumerate(handles):
                await fs.write(fh, CS // 2, bytes([i]) * CS)
                await fs.flush(fh)
                await fs.release(fh)
        for i in range(12):
            assert await read_file(fs, f"f{i}".encode()) == bytes([i]) * (CS + CS // 2)
