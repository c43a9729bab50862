"""Chunks fetched ahead of a reader, pushed into the kernel's page cache (vfs/pagepush.py),
without a kernel: the daemon as mount.py builds it, with a recording ``store_pages``."""

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.vfs.test_vfs import CS, make_fs, write_file

from ckptfs.codec.frame import Buffer
from ckptfs.config import ReadConfig
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.vfs.filesystem import Filesystem
from ckptfs.vfs.pagepush import PAGE, PagePush

Pushed = list[tuple[int, int, bytes]]


def recorder(pushed: Pushed, before: Callable[[], None] = lambda: None
             ) -> Callable[[int, int, Buffer], None]:
    def store_pages(ino: int, off: int, data: Buffer) -> None:
        before()
        pushed.append((ino, off, bytes(data)))
    return store_pages


async def read_through(fs: Filesystem, fh: int, size: int, step: int = CS // 2, start: int = 0
                       ) -> bytes:
    out = bytearray()
    for off in range(start, size, step):
        out += await fs.read(fh, off, step)
    return bytes(out)


async def stored(tmp_path: Path, size: int, n_tiers: int = 1) -> tuple[list[Tier], int, bytes]:
    """A file of ``size`` random bytes written by one daemon (stopped again): its tiers,
    its inode and its bytes. The next daemon on them has nothing of it cached."""
    tiers: list[Tier] = [MemoryTier(n) for n in "ab"[:n_tiers]]
    data = os.urandom(size)
    async with make_fs(tmp_path, list(tiers)) as fs:
        ino = await write_file(fs, b"f", data)
    return tiers, ino, data


async def peek(fs: Filesystem, ino: int, data: bytes, flags: int) -> None:
    """Open with ``flags``, read the first pages and let every task run (a push of the
    rest of that first chunk, if one is allowed, starts now and the release waits for
    it), then close."""
    fh = await fs.open(ino, flags)
    assert bytes(await fs.read(fh, 0, 4 * PAGE)) == data[:4 * PAGE]
    await trio.testing.wait_all_tasks_blocked()
    await fs.release(fh)


def test_span_leaves_the_tail_and_stays_in_the_file() -> None:
    cs = 16 << 20
    assert PagePush.span(0, cs, 10 * cs) == cs - 256 * 1024
    assert PagePush.span(cs, 5 * PAGE + 7, cs + 5 * PAGE + 7) == 4 * PAGE  # the last chunk
    assert PagePush.span(cs, cs, cs + 5 * PAGE + 7) == 0  # never past the size
    assert PagePush.span(0, 64 * 1024, 1 << 30) == 48 * 1024  # a small chunk: a quarter left
    assert PagePush.span(0, 3000, 3000) == 0  # less than a page: nothing


async def test_chunks_read_ahead_are_pushed_with_exactly_the_files_bytes(tmp_path: Path) -> None:
    tiers, ino, data = await stored(tmp_path, 12 * CS + 5000, n_tiers=2)
    pushed: Pushed = []
    one = threading.Event()
    async with make_fs(tmp_path, list(tiers), store_pages=recorder(pushed, one.set)) as fs:
        fh = await fs.open(ino, os.O_RDONLY)
        head = bytes(await fs.read(fh, 0, CS))  # chunk 0 read: the readahead starts
        # Without a kernel the reader could pass every push; wait for the first one.
        await trio.to_thread.run_sync(one.wait, 30)
        assert head + await read_through(fs, fh, len(data) + CS, start=CS) == data
        await fs.release(fh)  # waits for the readahead, and so for every push
        assert fs.store.stats.get("page_cache_pushed_bytes") == sum(len(b) for *_, b in pushed)
    assert pushed, "a sequential read pushed nothing"
    for i, off, got in pushed:
        base = off // CS * CS
        assert i == ino and base > 0  # chunk 0 was read whole: nothing of it left to push
        assert off % PAGE == 0 and len(got) % PAGE == 0 and got
        # Within the chunk's span: below the file's size, its tail left to the kernel.
        assert off + len(got) <= base + PagePush.span(base, min(CS, len(data) - base), len(data))
        assert got == data[off:off + len(got)]


async def test_a_direct_io_reader_gets_no_pushes(tmp_path: Path) -> None:
    tiers, ino, data = await stored(tmp_path, 8 * CS)
    pushed: Pushed = []
    async with make_fs(tmp_path, list(tiers), store_pages=recorder(pushed)) as fs:
        await peek(fs, ino, data, os.O_RDONLY | os.O_DIRECT)
        await peek(fs, ino, data, os.O_RDONLY)  # the same through the cache: pushed
    assert pushed and all(off > 0 for _, off, _ in pushed), pushed
    n = len(pushed)
    async with make_fs(tmp_path, list(tiers), store_pages=recorder(pushed)) as fs:
        await peek(fs, ino, data, os.O_RDONLY | os.O_DIRECT)
    assert len(pushed) == n


@pytest.mark.parametrize("change", ["open for writing", "truncate"])
async def test_a_change_waits_for_the_pushes_in_flight_and_none_start_during_it(
    tmp_path: Path, change: str
) -> None:
    """A push of the committed bytes must not land after a write changed them: the open
    for writing (or a truncate) returns only once the pushes in flight have ended, and
    none starts while a handle open for writing exists."""
    tiers, ino, data = await stored(tmp_path, 12 * CS, n_tiers=2)
    entered, go = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        go.wait(30)

    pushed: Pushed = []
    async with make_fs(tmp_path, list(tiers), store_pages=recorder(pushed, hold)) as fs:
        fh = await fs.open(ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, 0, CS // 2)) == data[:CS // 2]  # starts the readahead
        await trio.to_thread.run_sync(entered.wait, 30)  # a push is in flight, held
        done = trio.Event()
        writer: list[int] = []

        async def make_change() -> None:
            if change == "truncate":
                await fs.setattr(ino, size=len(data))  # same size: still a change
            else:
                writer.append(await fs.open(ino, os.O_RDWR))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(make_change)
            await trio.testing.wait_all_tasks_blocked()
            # The change may pass through catalog threads first: give it a bounded while
            # to finish (it must not; with the push held it would wait forever).
            with trio.move_on_after(1.5):
                await done.wait()
            assert not done.is_set(), f"the {change} did not wait for the push in flight"
            go.set()
            with trio.fail_after(30):
                await done.wait()
        in_flight_before = len(pushed)
        assert in_flight_before >= 1
        if writer:  # while it is open, no push starts
            assert await read_through(fs, fh, len(data)) == data
            await fs.release(writer[0])
            await fs.release(fh)
            assert len(pushed) == in_flight_before
        else:
            await fs.release(fh)
    for _, off, got in pushed:
        assert got == data[off:off + len(got)]


async def test_page_cache_push_false_pushes_nothing(tmp_path: Path) -> None:
    tiers, ino, data = await stored(tmp_path, 8 * CS)
    pushed: Pushed = []
    async with make_fs(tmp_path, list(tiers), store_pages=recorder(pushed),
                       reads=ReadConfig(page_cache_push=False)) as fs:
        assert fs.page_push is None
        await peek(fs, ino, data, os.O_RDONLY)
        fh = await fs.open(ino, os.O_RDONLY)
        assert await read_through(fs, fh, len(data)) == data
        await fs.release(fh)
    assert pushed == []


async def test_the_first_chunk_is_pushed_beyond_what_the_reader_asked_for(
    tmp_path: Path,
) -> None:
    """A chunk the reader entered before any readahead fetched it (the first of a file):
    its back is pushed, from the end of what the reader had asked for."""
    tiers, ino, data = await stored(tmp_path, 4 * CS)
    pushed: Pushed = []
    one = threading.Event()
    async with make_fs(tmp_path, list(tiers), store_pages=recorder(pushed, one.set)) as fs:
        fh = await fs.open(ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, 0, 4 * PAGE)) == data[:4 * PAGE]
        await trio.to_thread.run_sync(one.wait, 30)
        await fs.release(fh)  # waits for the pushes in flight
    first = [(off, got) for _, off, got in pushed if off < CS]
    assert first, pushed
    for off, got in first:
        assert off >= 4 * PAGE and off % PAGE == 0  # not what the reader had asked for
        assert off + len(got) <= PagePush.span(0, CS, len(data))
        assert got == data[off:off + len(got)]


async def test_a_shared_catalog_turns_pushes_off(tmp_path: Path) -> None:
    """With several nodes another node's commit is only seen at the next open here; a
    push in flight for a reader of the old version could land after that open dropped
    the cached pages, so there are none (vfs/pagepush.py)."""
    store_pages = recorder([])
    async with make_fs(tmp_path, [MemoryTier("a")], shared=True, store_pages=store_pages) as fs:
        assert fs.page_push is None
    async with make_fs(tmp_path, [MemoryTier("a")], store_pages=store_pages) as fs:
        assert fs.page_push is not None


def chunk_reads(fs: Filesystem) -> int:
    """Chunks read from the tiers so far (each fetch reads one copy)."""
    return sum(t.reads for t in fs.store.stats.tiers.values())


async def test_a_warm_reader_refilling_lost_pages_gets_no_readahead_and_no_pushes(
    tmp_path: Path,
) -> None:
    """A reader whose kernel still caches most of the file asks only for the pages the
    kernel reclaimed: requests that jump forward over bytes nobody here served or pushed.
    Each fetches its own chunk and nothing more: the chunks after such a hole are cached
    already, and fetching, verifying and pushing them would cost more than the read. Once
    the requests run on without a gap to a chunk's end, the reader is cold again and the
    readahead resumes, with its pushes."""
    tiers, ino, data = await stored(tmp_path, 12 * CS, n_tiers=2)
    pushed: Pushed = []
    ahead = threading.Event()  # a chunk after 7 was pushed

    def store_pages(ino: int, off: int, got: Buffer) -> None:
        pushed.append((ino, off, bytes(got)))
        if off >= 8 * CS:
            ahead.set()

    async with make_fs(tmp_path, list(tiers), store_pages=store_pages) as fs:
        fh = await fs.open(ino, os.O_RDONLY)
        before = chunk_reads(fs)

        async def read(off: int, size: int, warm: bool = True) -> None:
            assert bytes(await fs.read(fh, off, size)) == data[off:off + size]
            if warm:
                assert fs.open_files[ino].readahead_running == 0
                await trio.testing.wait_all_tasks_blocked()
                assert pushed == []

        # Holes: two requests in a row in chunk 3, then chunk 4's middle, chunk 5's start
        # (next to each other, as the sequential pattern counts them).
        hole = 3 * CS + CS // 4
        await read(hole, 2 * PAGE)
        await read(hole + 2 * PAGE, 2 * PAGE)
        await read(4 * CS + CS // 2, 2 * PAGE)
        await read(5 * CS, 2 * PAGE)
        assert chunk_reads(fs) - before == 3  # chunks 3, 4 and 5, nothing ahead
        # A stretch the kernel does not hold: chunk 6 to its end without a gap. The
        # request that reaches its end reads ahead again, and pushes.
        for off in range(6 * CS, 7 * CS - CS // 4, CS // 4):
            await read(off, CS // 4)
        assert chunk_reads(fs) - before == 4
        await read(7 * CS - CS // 4, CS // 4, warm=False)
        await trio.to_thread.run_sync(ahead.wait, 30)
        assert chunk_reads(fs) - before >= 5  # 6, and 8 ahead of it (7 may be on its way)
        await fs.release(fh)
    for _, off, got in pushed:  # only chunks ahead of the cold stretch, with their bytes
        assert off >= 7 * CS and got == data[off:off + len(got)]


async def test_a_reader_that_read_the_end_first_still_gets_its_chunks_pushed(
    tmp_path: Path,
) -> None:
    """torch.load reads a zip's directory at the file's end before the tensors from the
    start: the pushes stop where the reader's requests are, and that is where it went
    back to, not the end it read first."""
    tiers, ino, data = await stored(tmp_path, 12 * CS, n_tiers=2)
    pushed: Pushed = []
    one = threading.Event()
    async with make_fs(tmp_path, list(tiers), store_pages=recorder(pushed, one.set)) as fs:
        fh = await fs.open(ino, os.O_RDONLY)
        tail = len(data) - 2 * PAGE
        assert bytes(await fs.read(fh, tail, 2 * PAGE)) == data[tail:]
        # Back to the start: chunk 0 read whole, and the readahead it starts pushes.
        assert await read_through(fs, fh, CS) == data[:CS]
        await trio.to_thread.run_sync(one.wait, 30)
        assert await read_through(fs, fh, len(data), start=CS) == data[CS:]
        await fs.release(fh)
    assert {off // CS for _, off, _ in pushed} - {0}, pushed  # chunks ahead were pushed
    for _, off, got in pushed:
        assert got == data[off:off + len(got)]
