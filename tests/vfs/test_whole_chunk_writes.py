"""Whole-chunk writes of the direct path (OpenFile.write_whole) beside FUSE writes of the
same file, at the filesystem level: the order of events is the test's (each ``fill`` waits
for the test's word), so no verdict depends on who wins a race."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
import trio.testing

from tests.vfs.test_vfs import CS, RW, make_fs, read_file

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.codec.frame import HEADER_SIZE
from ckptfs.codec.staged import Staged
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs.context import ROOT


async def test_whole_chunk_writes_waiting_for_the_file_do_not_starve_its_fuse_writer(
    tmp_path: Path,
) -> None:
    """Two whole-chunk writes (two clients on one file) hold the whole memory budget
    while their bytes are copied in; meanwhile a FUSE write of the same file takes the
    file's lock and waits for budget. The whole-chunk writes must not then wait for that
    lock while they hold the budget the FUSE write waits for: that was a deadlock (the
    file and both clients hung for ever; nothing in flight, nothing to spill)."""
    chunks = [os.urandom(CS), os.urandom(CS)]
    tail = os.urandom(1000)
    async with make_fs(tmp_path, [MemoryTier("l")], memory_budget=2 * CS) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        go = trio.Event()

        def filler(data: bytes) -> Callable[[Staged], Awaitable[None]]:
            async def fill(staged: Staged) -> None:
                await go.wait()  # the copy out of the client's memory, held up
                staged.buf[HEADER_SIZE: HEADER_SIZE + len(data)] = data
                staged.length = len(data)
            return fill

        with trio.fail_after(30):  # a deadline for a deadlock, not a timing
            async with trio.open_nursery() as nursery:
                for idx, data in enumerate(chunks):
                    nursery.start_soon(fs.write_chunk, fh, idx, filler(data))
                await trio.testing.wait_all_tasks_blocked()
                # The budget is full: this FUSE write holds the lock, waiting for room.
                nursery.start_soon(fs.write, fh, 2 * CS, tail)
                await trio.testing.wait_all_tasks_blocked()
                go.set()
            await fs.flush(fh)
            await fs.release(fh)
        assert await read_file(fs, b"f") == b"".join(chunks) + tail
