"""The write hot path: a request into a chunk being assembled takes no trip through the
trio scheduler (no lock round trip), and still never interleaves with a commit or a
truncate, which hold the file's lock across their awaits."""

import os
from pathlib import Path

import trio
import trio.testing

from tests.vfs.test_staged_writes import local_tiers
from tests.vfs.test_vfs import CS, RW, make_fs, read_file

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.vfs.context import ROOT


async def test_a_write_into_an_assembled_chunk_does_not_schedule(tmp_path: Path) -> None:
    async with make_fs(tmp_path, local_tiers(tmp_path)) as fs:
        fh, _ = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        data = os.urandom(2 * CS)
        await fs.write(fh, 0, data[: CS // 4])  # makes the chunk's buffer (budget, event)
        with trio.testing.assert_no_checkpoints():
            await fs.write(fh, CS // 4, data[CS // 4 : CS // 2])
            await fs.write(fh, CS // 2, data[CS // 2 : CS])  # fills it: dispatched
        await fs.write(fh, CS, data[CS:])
        await fs.flush(fh)
        await fs.release(fh)
        assert await read_file(fs, b"f") == data


async def test_a_write_waits_for_a_commit_that_holds_the_lock(tmp_path: Path) -> None:
    async with make_fs(tmp_path, local_tiers(tmp_path)) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        first = os.urandom(CS // 2)
        await fs.write(fh, 0, first)
        f = fs.open_files[inode.ino]
        release, wrote = trio.Event(), trio.Event()

        async def hold_lock(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with f.lock:  # as a commit or a truncate in progress holds it
                task_status.started()
                await release.wait()

        async def write_more() -> None:
            await fs.write(fh, CS // 2, b"x" * 100)  # into the chunk being assembled
            wrote.set()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(hold_lock)
                nursery.start_soon(write_more)
                await trio.testing.wait_all_tasks_blocked()
                assert not wrote.is_set()  # it waits for the lock instead of writing
                assert f.size == CS // 2
                release.set()
        assert wrote.is_set() and f.size == CS // 2 + 100
        await fs.flush(fh)
        await fs.release(fh)
        assert await read_file(fs, b"f") == first + b"x" * 100
