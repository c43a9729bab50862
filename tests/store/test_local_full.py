"""Local tiers as a budget in front of the remote: eviction, backpressure or ENOSPC, and the
per-directory ``durability = "remote"`` policy (filesystem level, in-memory tiers)."""

import errno
import os
import threading
from pathlib import Path

import pytest
import trio

from tests.store.test_upload import skip_backoff, wait_backlog_empty
from tests.vfs.test_vfs import (
    CS,
    RW,
    catalog_of,
    deletions_done,
    make_daemon,
    make_fs,
    read_file,
    store_of,
    uploader_of,
    write_file,
)

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.codec import frame
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


@pytest.mark.allow_log_warnings("local tiers full; writers wait", "local tiers have room again")
async def test_full_local_tier_evicts_chunks_the_remote_holds(tmp_path: Path) -> None:
    local, remote = small_local(4), MemoryTier("r", kind="remote")
    a, b = os.urandom(3 * CS), os.urandom(3 * CS)
    async with make_fs(tmp_path, [local, remote]) as fs:
        await write_file(fs, b"a", a)
        await wait_backlog_empty(fs)
        await write_file(fs, b"b", b)  # room only by evicting a's uploaded chunks
        assert len(local.frames) <= 4
        assert store_of(fs).evicted_bytes >= 2 * FRAME
        assert await read_file(fs, b"a") == a  # from the remote, verified
        assert await read_file(fs, b"b") == b


@pytest.mark.allow_log_warnings("local tiers full; writers wait", "local tiers have room again")
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


@pytest.mark.allow_log_warnings("local tiers full; writers wait", "local tiers have room again")
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
                await wait_for(lambda: store_of(fs).waiting_for_room > 0)
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
@pytest.mark.allow_log_warnings("local tiers full; writers wait")
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


async def test_without_a_remote_a_writer_waits_for_local_frames_being_deleted(
    tmp_path: Path,
) -> None:
    """Rotation on a full local-only mount: the previous file is deleted and the new one
    written at once. Its frames are still in the deletion queue: the writer waits for the
    deleter instead of failing with ENOSPC."""
    local = DeleteGatedTier(small_local(2))
    new = os.urandom(2 * CS)
    try:
        async with make_fs(tmp_path, [local]) as fs:
            await write_file(fs, b"old", os.urandom(2 * CS))
            await fs.unlink(ROOT_INODE, b"old")  # its frames: deletion rows
            await wait_for(local.delete_entered.is_set)  # the deleter holds at the gate
            try:
                async with trio.open_nursery() as n:
                    n.start_soon(write_file, fs, b"new", new)
                    await wait_for(lambda: store_of(fs).waiting_for_room > 0)  # waits, no ENOSPC
                    local.delete_gate.set()
            finally:
                local.delete_gate.set()  # also when the write failed: let the deleter end
            assert await read_file(fs, b"new") == new
    finally:
        local.delete_gate.set()


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
            assert (await fs.db(catalog_of(fs).backlog)).chunks == 1
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
            assert uploader_of(fs).snapshot_of_ns >= inode.mtime_ns
            assert "catalog.snapshot" in inner.metas
    finally:
        remote.put_gate.set()


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings(
    "catalog snapshot upload failed", "upload to tier r failed, will retry",
)
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
        uploader_of(fs).clock = skip_backoff
        uploader_of(fs).kick()
        await wait_backlog_empty(fs)


async def test_uploads_wait_while_a_save_is_buffering_and_start_after_it(tmp_path: Path) -> None:
    remote = MemoryTier("r", kind="remote")
    async with make_fs(tmp_path, [MemoryTier("l"), remote]) as fs:
        await write_file(fs, b"done", os.urandom(2 * CS))
        fh = await mkfile(fs, ROOT_INODE, b"saving")
        await fs.write(fh, 0, os.urandom(CS // 2))  # a save in progress: a buffer in memory
        assert uploader_of(fs).saving()
        assert uploader_of(fs)._limit() == 0  # no upload competes with the save
        store_of(fs).waiting_for_room += 1  # ... unless a writer waits for uploads to free room
        assert uploader_of(fs)._limit() == uploader_of(fs).concurrency
        store_of(fs).waiting_for_room -= 1
        await fs.flush(fh)
        await fs.release(fh)
        assert uploader_of(fs).saving()  # its commit queued jobs: a stream until quiet
        await uploader_of(fs).commits.wait_quiet()
        assert not uploader_of(fs).saving()
        await wait_backlog_empty(fs)  # once the save committed, everything goes up
        assert len(remote.frames) == 3


# -- a file larger than the local tiers ------------------------------------------------------


@pytest.mark.allow_log_warnings("local tiers full; writers wait", "local tiers have room again")
async def test_block_moves_the_writing_files_own_chunks_to_the_remote(tmp_path: Path) -> None:
    """The only way to make room is the file's own uncommitted chunks: they go to the
    remote, which then serves them (verified), and the commit records them there, with no
    upload job queued for them."""
    local, remote = small_local(2), MemoryTier("r", kind="remote")
    data = os.urandom(6 * CS + 11)
    async with make_fs(tmp_path, [local, remote], local_full_timeout_s=600) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"big", 0o644, RW, ROOT)
        with trio.fail_after(20):  # not the 600 s timeout
            for off in range(0, len(data), 10_000):
                await fs.write(fh, off, data[off : off + 10_000])
            assert await fs.read(fh, 0, len(data)) == data  # before the commit, too
            await fs.flush(fh)
        await fs.release(fh)
        refs = await fs.db(fs.catalog.extents, inode.ino)
        moved = [r for r in refs.values() if r.tiers == ("r",)]
        assert moved, refs  # recorded where they are: on the remote only
        # Every moved chunk's local frame counts once: the concurrent moves of a round
        # add up (each one's bytes used to overwrite the others' total).
        assert store_of(fs).spilled_bytes == sum(len(remote.frames[r.key]) for r in moved)
        assert all(r.key in remote.frames and r.key not in local.frames for r in moved)
        assert all(r.key in local.frames for r in refs.values() if "l" in r.tiers)
        jobs = await fs.db(catalog_of(fs).due_uploads, 1 << 62, 100, set())
        assert not {j.digest for j in jobs} & {r.digest for r in moved}
        assert await read_file(fs, b"big") == data
        await wait_backlog_empty(fs)
    async with make_fs(tmp_path, [local, remote]) as fs:  # after a restart too
        assert await read_file(fs, b"big") == data


@pytest.mark.allow_log_errors
async def test_block_fails_at_once_when_nothing_can_free_room(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A chunk larger than the whole (empty) local tier: no upload, nothing to evict or
    move, so no event could ever make room: ENOSPC now, not after local_full_timeout."""
    local = MemoryTier("l", capacity=FRAME // 2)
    async with make_fs(tmp_path, [local, MemoryTier("r", kind="remote")],
                       local_full_timeout_s=600) as fs:
        with trio.fail_after(10), pytest.raises(NoSpace):
            await write_file(fs, b"a", os.urandom(CS))
        assert "nothing can free room" in caplog.text
        assert "writers wait for 0 bytes" not in caplog.text


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings(
    "local tiers full; writers wait", "could not move uncommitted chunk",
    "catalog snapshot upload failed", "upload to tier r failed, will retry",
)
async def test_a_failing_remote_makes_block_wait_then_enospc(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer's chunks could move, but the remote refuses them: the writer waits (the
    remote may come back) for at most local_full_timeout, and loses nothing committed."""
    local, remote = small_local(2), FaultyTier(MemoryTier("r", kind="remote"))
    remote.fail_puts = True
    async with make_fs(tmp_path, [local, remote], local_full_timeout_s=0.5) as fs:
        with trio.fail_after(10), pytest.raises(NoSpace):
            await write_file(fs, b"a", os.urandom(4 * CS))
        assert "could not move uncommitted chunk" in caplog.text
        assert "still full after" in caplog.text
        ino = (await fs.lookup(ROOT_INODE, b"a")).ino
        assert (await fs.db(fs.catalog.get_inode, ino)).size == 0  # nothing of it committed


class ChunkGatedTier(FaultyTier):
    """Holds chunk puts at the gate, not catalog snapshots (the uploader goes on)."""

    def put_meta(self, name: str, data: bytes) -> None:
        self.inner.put_meta(name, data)  # type: ignore[attr-defined]


@pytest.mark.allow_log_warnings("local tiers full; writers wait", "local tiers have room again")
async def test_a_file_that_commits_while_its_chunks_move_keeps_its_remote_copies(
    tmp_path: Path,
) -> None:
    """A's chunks start moving to the remote (B needs room), A commits meanwhile and its
    upload jobs run too: whichever finishes first, every copy the catalog records on the
    remote is there, and both files read back exact."""
    local, remote = small_local(2), ChunkGatedTier(MemoryTier("r", kind="remote"))
    remote.put_gate = threading.Event()
    a, b = os.urandom(2 * CS), os.urandom(CS)
    try:
        async with make_fs(tmp_path, [local, remote]) as fs:
            fa, ia = await fs.create(ROOT_INODE, b"a", 0o644, RW, ROOT)
            await fs.write(fa, 0, a)
            await wait_for(lambda: len(local.frames) == 2)  # A's chunks fill the local tier
            async with trio.open_nursery() as n:
                n.start_soon(write_file, fs, b"b", b)
                await wait_for(lambda: bool(store_of(fs).guard.moving()))  # A's chunks are moving
                await fs.flush(fa)  # A commits while they move: its upload jobs are queued
                await fs.release(fa)
                await wait_for(lambda: len(uploader_of(fs).running) == 2)  # and its jobs run
                remote.put_gate.set()
            await wait_backlog_empty(fs)
            inner = remote.inner
            assert isinstance(inner, MemoryTier)
            for ino in (ia.ino, (await fs.lookup(ROOT_INODE, b"b")).ino):
                for ref in (await fs.db(fs.catalog.extents, ino)).values():
                    if "r" in ref.tiers:
                        assert ref.key in inner.frames
            assert await read_file(fs, b"a") == a
            assert await read_file(fs, b"b") == b
    finally:
        remote.put_gate.set()


@pytest.mark.allow_log_warnings(
    "local tiers full; writers wait", "local tiers have room again",
    "deleting chunks on tier r failed, will retry",
)
async def test_a_version_dropped_while_its_chunks_move_queues_their_remote_copies(
    tmp_path: Path,
) -> None:
    """A's chunks are being copied to the remote (B needs room) when A's changes are
    dropped: the copies that land afterwards go to the deletion queue (never deleted
    inline on a limiter the read path uses), so a remote that refuses the delete now
    gets it retried, and nothing of A stays on the remote."""
    local, remote = small_local(2), ChunkGatedTier(MemoryTier("r", kind="remote"))
    remote.put_gate = threading.Event()
    a, b = os.urandom(2 * CS), os.urandom(CS)
    keys = {frame.digest_of_parts([a[i : i + CS]]).hex() for i in (0, CS)}
    inner = remote.inner
    assert isinstance(inner, MemoryTier)
    try:
        async with make_daemon(tmp_path, [local, remote]) as d:
            fs = d.fs
            fa, _ = await fs.create(ROOT_INODE, b"a", 0o644, RW, ROOT)
            await fs.write(fa, 0, a)
            await wait_for(lambda: len(local.frames) == 2)  # A's chunks fill the local tier
            async with trio.open_nursery() as n:
                n.start_soon(write_file, fs, b"b", b)
                await wait_for(lambda: store_of(fs).guard.moving() >= {bytes.fromhex(k) for k in keys})
                remote.fail_deletes = True
                await fs.release(fa)  # dropped, never committed, while its chunks move
                remote.put_gate.set()
            await wait_for(lambda: not store_of(fs).guard.moving())
            assert keys <= set(inner.frames)  # the copies landed after the drop ...
            await wait_for_deletions_failing(fs, "r", len(keys))  # ... and are queued
            remote.fail_deletes = False
            await d.deleter.retry_now()
            await deletions_done(fs)
            assert not keys & set(inner.frames)
            assert not keys & set(local.frames)
            assert await read_file(fs, b"b") == b
    finally:
        remote.put_gate.set()


async def wait_for_deletions_failing(fs: Filesystem, tier: str, n: int) -> None:
    with trio.fail_after(10):
        while not any(d.tier == tier and d.failing >= n
                      for d in await fs.db(catalog_of(fs).deletion_backlog)):
            await trio.sleep(0.01)  # polling the catalog for the condition, with a deadline


class DeleteGatedTier(FaultyTier):
    """Holds frame deletions at a gate (the deleter's local batch waits there)."""

    def __init__(self, inner: MemoryTier) -> None:
        super().__init__(inner)
        self.delete_gate = threading.Event()
        self.delete_entered = threading.Event()

    def delete(self, key: str) -> int:
        self.delete_entered.set()
        if not self.delete_gate.wait(timeout=60):
            raise CkptfsError(f"tier {self.name}: delete gate never opened")
        return super().delete(key)


@pytest.mark.allow_log_warnings("local tiers full; writers wait", "local tiers have room again")
async def test_block_waits_for_local_frames_in_the_deletion_queue(tmp_path: Path) -> None:
    """An uploaded file is deleted and a new one written at once: nothing is evictable,
    nothing uploads or moves, but the deleter is about to free the old frames, so the
    writer waits for them instead of failing with ENOSPC at once."""
    local = DeleteGatedTier(small_local(2))
    data, new = os.urandom(2 * CS), os.urandom(CS)
    try:
        async with make_fs(tmp_path, [local, MemoryTier("r", kind="remote")],
                           local_full_timeout_s=600) as fs:
            await write_file(fs, b"old", data)
            await wait_backlog_empty(fs)
            await fs.unlink(ROOT_INODE, b"old")  # its local frames: deletion rows
            await wait_for(local.delete_entered.is_set)  # the deleter holds at the gate
            async with trio.open_nursery() as n:
                n.start_soon(write_file, fs, b"new", new)
                await wait_for(lambda: store_of(fs).waiting_for_room > 0)  # waits, no ENOSPC
                local.delete_gate.set()
            assert await read_file(fs, b"new") == new
    finally:
        local.delete_gate.set()
