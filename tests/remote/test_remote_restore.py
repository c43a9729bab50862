"""Restore from the bucket: GETs in flight, the cache under readahead, copy-back timing."""

import os
import threading
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.testing

from tests.faults.test_loop_rules import until_real
from tests.store.test_local_full import wait_for
from tests.store.test_upload import wait_backlog_empty
from tests.vfs.test_vfs import CS, make_fs, store_of, write_file

from ckptfs.catalog import Catalog, ChunkRef, SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.chunks import cache as cache_mod
from ckptfs.chunks.bufpool import FrameBuffer, MiB
from ckptfs.chunks.reader import COPY_BACK_IDLE_S
from ckptfs.chunks.store import ChunkStore, StorePolicy
from ckptfs.codec import frame
from ckptfs.config import ReadConfig
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers.base import Buffer
from ckptfs.tiers.s3 import S3Tier


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
        assert await store_of(fs).evict(1 << 30) > 0
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
        assert store_of(fs).cache.limit == 4 * CS
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
        store = ChunkStore([MemoryTier("l")], cat, trio.CapacityLimiter(1),
                           StorePolicy(io_threads=1, cache_bytes=3000))
        a, b, c, d = (bytes([i]) * 1000 for i in range(4))
        for x in (a, b, c):
            store.cache.put(frame.digest_of(x), x)
        store.consumed(frame.digest_of(c))  # the newest, but read to its end
        store.consumed(b"\0" * 32)  # not cached: nothing happens
        store.cache.put(frame.digest_of(d), d)
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
    store = ChunkStore([local, remote], cat, trio.CapacityLimiter(1),
                       StorePolicy(io_threads=1, cache_bytes=1 << 20))
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
        assert ref.digest in store.reader._copy_backs and local.puts == 0
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
            assert store.reader._copy_backs[ref.digest][2] == [("l", "missing")]
            await _reads_hold_the_copy_back(store, ref, data, local)
            frame.verify(local.frames[digest.hex()], digest)
            n.cancel_scope.cancel()
    finally:
        cat.close()


async def test_readahead_of_many_files_stops_at_half_the_cache(tmp_path: Path) -> None:
    """Two files read at once, each asking for 3 chunks of readahead into a cache of 4
    chunks: readahead stops at half the cache, so what it fetched is read before it is
    evicted, and every chunk is fetched exactly once (before: 6 chunks fetched ahead
    into a 4-chunk cache that also holds the chunks being read: evicted unread and
    fetched again)."""
    local, remote = MemoryTier("l"), CountingRemote("r")
    files = {f"f{i}".encode(): os.urandom(6 * CS) for i in range(2)}
    async with make_fs(tmp_path, [local, remote]) as fs:
        for name, data in files.items():
            await write_file(fs, name, data)
        await wait_backlog_empty(fs)
        assert await store_of(fs).evict(1 << 30) > 0
        assert not local.frames
    remote.gets.clear()
    reads = ReadConfig(readahead=3 * CS, copy_back="never")
    async with make_fs(tmp_path, [local, remote], reads=reads, memory_budget=8 * CS) as fs:
        assert store_of(fs).cache.limit == 4 * CS
        handles = []
        for name in files:
            inode = await fs.lookup(ROOT_INODE, name)
            handles.append((await fs.open(inode.ino, os.O_RDONLY), inode.ino))
        got = {name: bytearray() for name in files}

        async def settled() -> None:  # every readahead started so far has landed
            await wait_for(lambda: not any(fs.open_files[ino].readahead_running
                                           for _, ino in handles))

        for off in range(0, 6 * CS, CS // 4):  # the readers take turns, a quarter chunk each
            for (fh, _), name in zip(handles, files, strict=True):
                got[name] += await fs.read(fh, off, CS // 4)
                await settled()
        for fh, _ in handles:
            await fs.release(fh)
    assert all(bytes(got[n]) == files[n] for n in files)
    assert len(remote.gets) == 12 and set(remote.gets.values()) == {1}, remote.gets


class OrderedRemote(FaultyTier):
    """A remote tier that holds GETs at a gate and records the order they ran in."""

    def __init__(self) -> None:
        super().__init__(MemoryTier("r", kind="remote"))
        self.order: list[str] = []

    def get(self, key: str) -> Buffer | None:
        self._hold_get(key)
        self.order.append(key)
        return self.inner.get(key)


def _remote_chunks(remote: OrderedRemote, n: int) -> list[tuple[ChunkRef, bytes]]:
    out = []
    for _ in range(n):
        data = os.urandom(1000)
        digest = frame.digest_of(data)
        remote.inner.put(digest.hex(), frame.encode([data], digest))
        out.append((ChunkRef(digest, len(data), ("r",)), data))
    return out


async def _with_one_get_slot(tmp_path: Path, remote: OrderedRemote, body: Any) -> None:
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        store = ChunkStore([MemoryTier("l"), remote], cat, trio.CapacityLimiter(1),
                           StorePolicy(io_threads=1, cache_bytes=1 << 20, remote_reads=1))
        await body(store)
    finally:
        cat.close()


async def test_a_chunk_a_reader_waits_for_is_fetched_before_readahead(tmp_path: Path) -> None:
    """One GET slot, held; two readahead GETs queue, then a reader's own chunk: the
    reader's goes next (a FIFO limiter served it after every readahead queued before)."""
    remote = OrderedRemote()
    (held, _), (ahead1, _), (ahead2, _), (need, need_data) = _remote_chunks(remote, 4)
    remote.get_gate = threading.Event()

    async def body(store: ChunkStore) -> None:
        async with trio.open_nursery() as n:
            n.start_soon(partial(store.read, held, ahead=True))
            await until_real(lambda: remote.gets_held == 1)
            for ref in (ahead1, ahead2):
                n.start_soon(partial(store.read, ref, ahead=True))
                await trio.testing.wait_all_tasks_blocked()
            results: list[bytes] = []

            async def reader() -> None:
                results.append(bytes(await store.read(need)))

            n.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert store.limiters.remote_io.waiting == 3
            remote.get_gate.set()  # type: ignore[union-attr]
        assert results == [need_data]

    await _with_one_get_slot(tmp_path, remote, body)
    assert remote.order == [r.key for r in (held, need, ahead1, ahead2)]


async def test_a_readahead_a_reader_joins_is_promoted(tmp_path: Path) -> None:
    """A reader comes to wait for a chunk whose readahead GET is still queued: that GET
    goes before the other readahead, and the reader shares it (one GET)."""
    remote = OrderedRemote()
    (held, _), (ahead1, _), (joined, joined_data) = _remote_chunks(remote, 3)
    remote.get_gate = threading.Event()

    async def body(store: ChunkStore) -> None:
        results: list[bytes] = []
        async with trio.open_nursery() as n:
            n.start_soon(partial(store.read, held, ahead=True))
            await until_real(lambda: remote.gets_held == 1)
            for ref in (ahead1, joined):
                n.start_soon(partial(store.read, ref, ahead=True))
                await trio.testing.wait_all_tasks_blocked()

            async def reader() -> None:
                results.append(bytes(await store.read(joined)))

            n.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            remote.get_gate.set()  # type: ignore[union-attr]
        assert results == [joined_data]

    await _with_one_get_slot(tmp_path, remote, body)
    assert remote.order == [r.key for r in (held, joined, ahead1)]


async def test_concurrent_readers_of_one_chunk_share_one_get(tmp_path: Path) -> None:
    """Eight readers (and a readahead) of the same chunk while its GET is held: one GET,
    every reader gets the verified bytes."""
    remote = OrderedRemote()
    ((ref, data),) = _remote_chunks(remote, 1)
    remote.get_gate = threading.Event()

    async def body(store: ChunkStore) -> None:
        results: list[bytes] = []

        async def reader() -> None:
            results.append(bytes(await store.read(ref)))

        async with trio.open_nursery() as n:
            n.start_soon(partial(store.read, ref, ahead=True))
            await until_real(lambda: remote.gets_held == 1)
            for _ in range(8):
                n.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            remote.get_gate.set()  # type: ignore[union-attr]
        assert results == [data] * 8

    await _with_one_get_slot(tmp_path, remote, body)
    assert remote.order == [ref.key]


async def test_a_receive_buffer_is_reused_only_once_nothing_views_it(
    tmp_path: Path, s3_tier: S3Tier,
) -> None:
    """Real SeaweedFS, a cache of one 2 MiB chunk: each chunk's GET reads into a pooled
    buffer, a chunk leaving the cache gives it back, and the next GET reuses it; a chunk
    a reader still holds (a view, as a FUSE reply or a copy-back does) keeps its bytes."""
    chunks = []
    for _ in range(5):
        data = os.urandom(2 * 1024 * 1024)
        digest = frame.digest_of(data)
        s3_tier.put(digest.hex(), frame.encode([data], digest))
        chunks.append((ChunkRef(digest, len(data), (s3_tier.name,)), data))
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        store = ChunkStore([MemoryTier("l"), s3_tier], cat, trio.CapacityLimiter(1),
                           StorePolicy(io_threads=1, cache_bytes=3 << 20, remote_reads=2))
        (first_ref, first), *rest = chunks
        held = await store.read(first_ref)
        assert isinstance(held, memoryview) and isinstance(held.obj, FrameBuffer)
        buffers = []
        for ref, data in rest:
            got = await store.read(ref)  # the previous chunk leaves the cache
            assert isinstance(got, memoryview) and bytes(got) == data
            buffers.append(got.obj)
            del got
        assert bytes(held) == first  # evicted long ago, still viewed: never read into
        assert all(b is not held.obj for b in buffers)
        assert store.frames.reused >= 2 and store.stats.get("frame_buffers_reused") >= 2
    finally:
        cat.close()


async def test_chunks_read_to_their_end_leave_the_cache_beyond_the_keep_and_their_buffers_return(
    tmp_path: Path, monkeypatch: Any,
) -> None:
    """A restore reads each chunk to its end once: beyond CONSUMED_KEEP bytes of such
    chunks the oldest leave the cache at once and their receive buffers are reused by the
    next reads (before, the whole cache filled with them first and every read until then
    faulted in a fresh buffer); a chunk read again stays among them, as the newest."""
    monkeypatch.setattr(cache_mod, "CONSUMED_KEEP", 2 * MiB)
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        store = ChunkStore([MemoryTier("l")], cat, trio.CapacityLimiter(1),
                           StorePolicy(io_threads=1, cache_bytes=8 * MiB))
        bufs = [store.frames.take(MiB) for _ in range(5)]
        digests = [bytes([i]) * 32 for i in range(5)]
        for d, b in zip(digests, bufs, strict=True):
            assert b is not None
            store.cache.put(d, memoryview(b)[:MiB])
        store.consumed(digests[0])
        store.consumed(digests[1])
        assert all(store.cached(d) for d in digests)  # within the keep
        store.consumed(digests[2])
        assert not store.cached(digests[0])
        assert all(store.cached(d) for d in digests[1:])
        assert store.frames.take(MiB) is bufs[0]  # its buffer at once, not a fresh one
        # Read again (a late request for a piece of it): still done with, now the newest
        # of them, so it goes after the keep's worth of chunks consumed after it, not at
        # the LRU limit (which held its buffer and made the next reads fault fresh ones).
        await store.read(ChunkRef(digests[1], MiB, ("l",)))
        store.consumed(digests[3])
        assert store.cached(digests[1]) and not store.cached(digests[2])
        store.consumed(digests[4])
        assert not store.cached(digests[1])
        assert all(store.cached(d) for d in digests[3:])
        assert store.cache.bytes == 2 * MiB
    finally:
        cat.close()
