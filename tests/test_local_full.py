"""Local tiers as a budget in front of the remote: eviction, backpressure or ENOSPC, and the
per-directory ``durability = "remote"`` policy (filesystem level, in-memory tiers)."""

import errno
import os
import threading
from pathlib import Path

import pytest
import trio
from test_upload import skip_backoff, wait_backlog_empty
from test_vfs import CS, RW, make_fs, read_file, write_file

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.chunks import frame
from ckptfs.config import DurabilityPolicy
from ckptfs.errors import CkptfsError, NoSpace
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.vfs.context import ROOT
from ckptfs.vfs.filesystem import Filesystem

FRAME = CS + frame.HEADER_SIZE


def small_local(chunks: int) -> MemoryTier:
    return MemoryTier("l", capacity=chunks * FRAME)


def gated_remote() -> FaultyTier:
    remote = FaultyTier(MemoryTier("r", kind="remote"))
    remote.put_gate = threading.Event()
    return remote


async def wait_for(predicate, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)  # polling a condition, with a deadline


async def test_full_local_tier_evicts_chunks_the_remote_holds(tmp_path: Path) -> None:
    local, remote = small_local(4), MemoryTier("r", kind="remote")
    a, b = os.urandom(3 * CS), os.urandom(3 * CS)
    async with make_fs(tmp_path, [local, remote]) as fs:
        await write_file(fs, b"a", a)
        await wait_backlog_empty(fs)
        await write_file(fs, b"b", b)  # room only by evicting a's uploaded chunks
        assert len(local.frames) <= 4
        assert fs.store.evicted_bytes >= 2 * FRAME
        assert await read_file(fs, b"a") == a  # from the remote, verified
        assert await read_file(fs, b"b") == b


async def test_an_open_reader_follows_an_evicted_chunk_to_the_remote(tmp_path: Path) -> None:
    local, remote = small_local(3), MemoryTier("r", kind="remote")
    a = os.urandom(3 * CS)
    async with make_fs(tmp_path, [local, remote]) as fs:
        ino = await write_file(fs, b"a", a)
        fh = await fs.open(ino, os.O_RDONLY)  # its extents name the local tier only
        try:
            await wait_backlog_empty(fs)
            await write_file(fs, b"b", os.urandom(3 * CS))  # evicts all of a
            assert not {r.key for r in (await fs.db(fs.catalog.extents, ino)).values()} & set(
                local.frames
            )  # every chunk of a now lives on the remote only
            assert await fs.read(fh, 0, 3 * CS) == a
        finally:
            await fs.release(fh)


async def test_block_waits_for_uploads_then_the_save_goes_on(tmp_path: Path) -> None:
    local, remote = small_local(4), gated_remote()
    a, b = os.urandom(3 * CS), os.urandom(3 * CS)
    assert remote.put_gate is not None
    try:
        async with make_fs(tmp_path, [local, remote]) as fs:
            await write_file(fs, b"a", a)  # its uploads are held at the gate
            done = trio.Event()

            async def save_b() -> None:
                await write_file(fs, b"b", b)
                done.set()

            async with trio.open_nursery() as n:
                n.start_soon(save_b)
                await wait_for(lambda: fs.store.waiting_for_room > 0)
                assert not done.is_set()  # backpressure: the writer waits, nothing is lost
                remote.put_gate.set()
            assert done.is_set()
            assert await read_file(fs, b"a") == a
            assert await read_file(fs, b"b") == b
    finally:
        remote.put_gate.set()


@pytest.mark.allow_log_errors
async def test_enospc_policy_fails_the_write_and_keeps_the_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local, remote = small_local(4), gated_remote()
    a = os.urandom(3 * CS)
    assert remote.put_gate is not None
    try:
        async with make_fs(tmp_path, [local, remote], on_local_full="enospc") as fs:
            await write_file(fs, b"a", a)
            with pytest.raises(NoSpace) as exc:
                await write_file(fs, b"b", os.urandom(3 * CS))
            assert exc.value.errno == errno.ENOSPC
            assert 'on_local_full = "enospc"' in caplog.text
            assert await read_file(fs, b"a") == a
            remote.put_gate.set()  # let held uploads finish before the filesystem stops
    finally:
        remote.put_gate.set()


@pytest.mark.allow_log_errors
async def test_block_gives_enospc_after_its_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local, remote = small_local(4), gated_remote()
    assert remote.put_gate is not None
    try:
        async with make_fs(tmp_path, [local, remote], local_full_timeout_s=0.3) as fs:
            await write_file(fs, b"a", os.urandom(3 * CS))
            with trio.fail_after(10), pytest.raises(NoSpace):
                await write_file(fs, b"b", os.urandom(3 * CS))
            assert "still full after" in caplog.text
            remote.put_gate.set()
    finally:
        remote.put_gate.set()


@pytest.mark.allow_log_errors
async def test_without_a_remote_a_full_tier_is_enospc_at_once(tmp_path: Path) -> None:
    async with make_fs(tmp_path, [small_local(2)]) as fs:
        with trio.fail_after(5), pytest.raises(NoSpace):
            await write_file(fs, b"a", os.urandom(3 * CS))


# -- durability = "remote" -------------------------------------------------------------------

REMOTE_UNDER_FINAL = (DurabilityPolicy("/final", "remote", 30.0),)


async def mkfile(fs: Filesystem, parent: int, name: bytes) -> int:
    fh, _ = await fs.create(parent, name, 0o644, RW, ROOT)
    return fh


async def test_close_under_a_remote_policy_waits_for_the_remote(tmp_path: Path) -> None:
    remote = gated_remote()
    assert remote.put_gate is not None
    data = os.urandom(2 * CS + 7)
    try:
        async with make_fs(tmp_path, [MemoryTier("l"), remote], policies=REMOTE_UNDER_FINAL) as fs:
            final = await fs.mkdir(ROOT_INODE, b"final", 0o755, ROOT)
            # Outside the policy: close returns while the upload is still held.
            await write_file(fs, b"scratch", os.urandom(CS))
            assert (await fs.db(fs.catalog.backlog)).chunks == 1
            closed = trio.Event()

            async def save() -> None:
                fh = await mkfile(fs, final.ino, b"model.pt")
                await fs.write(fh, 0, data)
                await fs.flush(fh)
                await fs.release(fh)
                closed.set()

            async with trio.open_nursery() as n:
                n.start_soon(save)
                await wait_for(remote.put_entered.is_set)
                await wait_for(lambda: fs.budget.used == 0)  # the save's data is committed
                assert not closed.is_set()  # close waits for the remote copy
                remote.put_gate.set()
            # Once close returned: the chunks are on the remote and so is a catalog
            # snapshot that names the file (what a new node restores).
            inode = await fs.lookup(final.ino, b"model.pt")
            refs = await fs.db(fs.catalog.extents, inode.ino)
            inner = remote.inner
            assert isinstance(inner, MemoryTier)
            assert {r.key for r in refs.values()} <= set(inner.frames)
            assert fs.uploader.snapshot_of_ns >= inode.mtime_ns
            assert "catalog.snapshot" in inner.metas
    finally:
        remote.put_gate.set()


@pytest.mark.allow_log_errors
async def test_remote_policy_times_out_with_eio_and_keeps_the_file(tmp_path: Path) -> None:
    remote = FaultyTier(MemoryTier("r", kind="remote"))
    remote.fail_puts = True
    policy = (DurabilityPolicy("/", "remote", 0.3),)
    data = os.urandom(CS + 3)
    async with make_fs(tmp_path, [MemoryTier("l"), remote], policies=policy) as fs:
        fh = await mkfile(fs, ROOT_INODE, b"f")
        await fs.write(fh, 0, data)
        with trio.fail_after(10), pytest.raises(CkptfsError) as exc:
            await fs.fsync(fh)
        assert exc.value.errno == errno.EIO
        await fs.release(fh)
        assert await read_file(fs, b"f") == data  # committed locally all the same
        remote.fail_puts = False
        fs.uploader.clock = skip_backoff
        fs.uploader.kick()
        await wait_backlog_empty(fs)


async def test_uploads_wait_while_a_save_is_buffering_and_start_after_it(tmp_path: Path) -> None:
    remote = MemoryTier("r", kind="remote")
    async with make_fs(tmp_path, [MemoryTier("l"), remote]) as fs:
        await write_file(fs, b"done", os.urandom(2 * CS))
        fh = await mkfile(fs, ROOT_INODE, b"saving")
        await fs.write(fh, 0, os.urandom(CS // 2))  # a save in progress: a buffer in memory
        assert fs.uploader.saving()
        assert fs.uploader._limit() == 0  # no upload competes with the save
        fs.store.waiting_for_room += 1  # ... unless a writer waits for uploads to free room
        assert fs.uploader._limit() == fs.uploader.concurrency
        fs.store.waiting_for_room -= 1
        await fs.flush(fh)
        await fs.release(fh)
        assert not fs.uploader.saving()
        await wait_backlog_empty(fs)  # once the save committed, everything goes up
        assert len(remote.frames) == 3
