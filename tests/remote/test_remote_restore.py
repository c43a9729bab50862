"""Restore from the bucket: GETs in flight, the cache under readahead, copy-back timing."""

import os
from collections.abc import Sequence
from pathlib import Path

import trio
import trio.testing

from tests.faults.test_loop_rules import until_real
from tests.store.test_local_full import wait_for
from tests.store.test_upload import wait_backlog_empty
from tests.vfs.test_vfs import CS, make_fs, write_file

from ckptfs.catalog import Catalog, ChunkRef, SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.chunks.store import COPY_BACK_IDLE_S, ChunkStore
from ckptfs.codec import frame
from ckptfs.config import ReadConfig
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers.base import Buffer


class CountingRemote(MemoryTier):
    """A remote MemoryTier that counts the GETs of each chunk."""

    def __init__(self, name: str) -> None:
        super().__init__(name, kind="remote")
        self.gets: dict[str, int] = {}

    def get(self, key: str) -> bytes | None:
        self.gets[key] = self.gets.get(key, 0) + 1
        return super().get(key)


async def _remote_only_file(tmp_path: Path, local: MemoryTier, remote: MemoryTier,
                            data: bytes) -> None:
    async with make_fs(tmp_path, [local, remote]) as fs:
        await write_file(fs, b"f", data)
        await wait_backlog_empty(fs)
        assert await fs.store.evict(1 << 30) > 0
        assert not local.frames


async def test_a_sequential_reader_fetches_each_chunk_once_when_the_cache_is_tight(
    tmp_path: Path,
) -> None:
    """The cache holds the chunk being read and the readahead (4 chunks): a chunk read to
    its end goes first, so the chunks fetched ahead are not evicted unread and fetched
    again (plain LRU kept the chunk just read and dropped the next one)."""
    local, remote = MemoryTier("l"), CountingRemote("r")
    data = os.urandom(10 * CS)
    await _remote_only_file(tmp_path, local, remote, data)
    remote.gets.clear()
    reads = ReadConfig(readahead=3 * CS, copy_back="never")
    async with make_fs(tmp_path, [local, remote], reads=reads, memory_budget=8 * CS) as fs:
        assert fs.store._cache_limit == 4 * CS
        inode = await fs.lookup(ROOT_INODE, b"f")
        fh = await fs.open(inode.ino, os.O_RDONLY)
        got = bytearray()
        for off in range(0, len(data), CS // 4):
            got += await fs.read(fh, off, CS // 4)
            if off % CS == 0:  # each readahead has landed before the reader goes on
                await wait_for(lambda: not fs.open_files[inode.ino].readahead_running)
        await fs.release(fh)
    assert bytes(got) == data
    assert len(remote.gets) == 10 and set(remote.gets.values()) == {1}, remote.gets


def test_consumed_chunks_are_evicted_first(tmp_path: Path) -> None:
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        store = ChunkStore([MemoryTier("l")], io_threads=1, cache_bytes=3000, catalog=cat,
                           db_limiter=trio.CapacityLimiter(1))
        a, b, c, d = (bytes([i]) * 1000 for i in range(4))
        for x in (a, b, c):
            store._cache_put(frame.digest_of(x), x)
        store.consumed(frame.digest_of(c))  # the newest, but read to its end
        store.consumed(b"\0" * 32)  # not cached: nothing happens
        store._cache_put(frame.digest_of(d), d)
        assert not store.cached(frame.digest_of(c))
        assert all(store.cached(frame.digest_of(x)) for x in (a, b, d))
    finally:
        cat.close()


class SlowPut(MemoryTier):
    """A local MemoryTier counting its puts."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.puts = 0

    def put(self, key: str, parts: Sequence[Buffer], expected_sha256: str | None = None) -> int:
        self.puts += 1
        return super().put(key, parts, expected_sha256)


def _store(tmp_path: Path, local: MemoryTier, remote: MemoryTier) -> tuple[ChunkStore, Catalog]:
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    store = ChunkStore([local, remote], io_threads=1, cache_bytes=1 << 20, catalog=cat,
                       db_limiter=trio.CapacityLimiter(1))
    return store, cat


async def _reads_hold_the_copy_back(store: ChunkStore, ref: ChunkRef, data: bytes,
                                    local: SlowPut) -> None:
    """Reads served from the cache, each a bit less than COPY_BACK_IDLE_S after the last
    (trio's clock, moved by hand): the copy-back stays queued, nothing is written; once
    they stop, it runs."""
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock)
    for _ in range(10):  # 9 idle periods in all, never one without a read
        clock.jump(COPY_BACK_IDLE_S * 0.9)
        assert bytes(await store.read(ref)) == data
        await trio.testing.wait_all_tasks_blocked()
        assert ref.digest in store._copy_backs and local.puts == 0
    clock.jump(COPY_BACK_IDLE_S * 1.1)
    await until_real(lambda: local.puts == 1)


async def test_copy_back_waits_while_a_reader_is_served_from_the_cache(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    """A restore whose readahead is ahead of the reader fetches nothing for a while, yet
    the reader is still restoring: the copy-back (disk writes and compares on the cores
    the reader needs) waits until reads stop, not until fetches stop."""
    local, remote = SlowPut("l"), MemoryTier("r", kind="remote")
    data = os.urandom(1000)
    digest = frame.digest_of(data)
    remote.put(digest.hex(), frame.encode([data], digest))
    store, cat = _store(tmp_path, local, remote)
    try:
        ref = ChunkRef(digest, len(data), ("r",))
        async with trio.open_nursery() as n:
            store.attach(n)
            assert bytes(await store.read(ref, copy_back=True)) == data
            await _reads_hold_the_copy_back(store, ref, data, local)
            n.cancel_scope.cancel()
    finally:
        cat.close()


async def test_a_missing_local_copy_is_rewritten_when_the_restore_pauses(
    tmp_path: Path, mock_clock: trio.testing.MockClock,
) -> None:
    """Local tiers wiped, catalog kept: the chunk's local copy is missing and the remote
    serves it. The local copy is written again only once reads stop, not in step with
    the reader (a heal there took the cores the restore needed)."""
    local, remote = SlowPut("l"), MemoryTier("r", kind="remote")
    data = os.urandom(1000)
    digest = frame.digest_of(data)
    remote.put(digest.hex(), frame.encode([data], digest))
    store, cat = _store(tmp_path, local, remote)
    try:
        ref = ChunkRef(digest, len(data), ("l", "r"))  # listed on l, which lost it
        async with trio.open_nursery() as n:
            store.attach(n)
            assert bytes(await store.read(ref)) == data  # no copy_back asked: a heal
            assert store._copy_backs[ref.digest][2] == [("l", "missing")]
            await _reads_hold_the_copy_back(store, ref, data, local)
            frame.verify(local.frames[digest.hex()], digest)
            n.cancel_scope.cancel()
    finally:
        cat.close()
