"""The deletion queue's ordering rules (chunks/guard.py, upload/deleter.py), at the catalog,
guard and filesystem level (in-memory tiers), and a failed fsync retiring its handle."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.store.test_janitor import POLICY, state
from tests.store.test_local_full import wait_for
from tests.vfs.test_vfs import (
    CS,
    RW,
    deletions_done,
    make_daemon,
    make_fs,
    read_file,
    store_of,
    write_file,
)

from ckptfs.catalog import ChunkRef, SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.checkpoints.tracker import CheckpointTracker
from ckptfs.chunks.guard import ChunkGuard
from ckptfs.config import CheckpointConfig, RetentionConfig
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.vfs.context import ROOT
from ckptfs.vfs.filesystem import Filesystem

F = 0o100644
D = b"\x07" * 32


def test_a_deletion_row_is_cancelled_when_the_chunk_is_wanted_again(tmp_path: Path) -> None:
    cat = SqliteCatalog(tmp_path / "c.sqlite")
    try:
        ref = ChunkRef(D, 10, ("l",))
        a = cat.create(ROOT_INODE, b"a", F, 0, 0)
        cat.commit_file(a.ino, 10, 1, 1, 10, {0: ref}, uploads={D: ["r"]})
        cat.unlink(ROOT_INODE, b"a")
        cat.delete_inode(a.ino)
        assert cat.drop_unreferenced([D]) == {D: ["l"]}
        # The local frame and the remote copy an upload job may have made are queued.
        assert {(b.tier, b.chunks) for b in cat.deletion_backlog()} == {("l", 1), ("r", 1)}
        # Same content committed again by another file, uploaded again: both cancelled.
        b = cat.create(ROOT_INODE, b"b", F, 0, 0)
        cat.commit_file(b.ino, 10, 1, 1, 10, {0: ref}, uploads={D: ["r"]})
        assert cat.claim_deletions([(D, "l"), (D, "r")]) == []
        assert cat.deletion_backlog() == []
        # An upload that finishes after its job was cancelled leaves a deletion row.
        assert not cat.finish_upload(b"\x08" * 32, "r")
        assert cat.claim_deletions([(b"\x08" * 32, "r")]) == [(b"\x08" * 32, "r")]
    finally:
        cat.close()


def test_a_writer_waits_for_a_local_deletion_of_the_same_frame() -> None:
    released: list[int] = []
    guard = ChunkGuard(["l"], on_release=lambda: released.append(1))
    marked, held = guard.begin_delete([(D, "l")])
    assert marked == [(D, "l")] and held == []
    done = threading.Event()

    def writer() -> None:
        guard.pin_for_put(D)
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not guard.pinned(D) and time.monotonic() < deadline:
            time.sleep(0.005)  # polling for the pin, with a deadline
        assert guard.pinned(D)
        # Pinned, but the put must not happen while the deletion is in flight.
        assert not done.is_set()
        # A deleter coming now holds the pinned digest back instead of deleting it.
        assert guard.begin_delete([(D, "l")]) == ([], [(D, "l")])
        guard.end_delete(marked)
        assert done.wait(10)
    finally:
        guard.end_delete(marked)
        t.join(10)
    assert D in guard.held_digests()
    assert released == []
    guard.unpin([D])
    assert released == [1] and not guard.held_digests()


def test_a_moved_chunks_local_frame_is_shared_or_waited_for_never_put_under_the_delete() -> None:
    """An uncommitted chunk moved to a remote: its local frame is marked as being deleted.
    A writer of the same bytes shares the remote copy meanwhile; once the last pin went, a
    new writer waits for the delete; the deleter's row of that frame is held until done."""
    released: list[int] = []
    guard = ChunkGuard(["l"], on_release=lambda: released.append(1))
    assert guard.pin_for_put(D) is None  # nothing to share: the caller puts
    guard.put_done(D, "l", 10)
    assert guard.current(D) == ("l",)
    picked, blocked = guard.start_moves(1 << 30, 0, lambda d: ["r"], True)
    assert picked == [(D, 10, ("l",))] and not blocked
    state, drop = guard.moved(D, ("l",), ["r"], set())
    assert state == "moved" and drop == [(D, "l")]
    assert guard.current(D) == ("r",)
    shared = guard.pin_for_put(D)  # another open file, same bytes: no wait, no put
    assert shared is not None and shared.tiers == ("r",)
    guard.unpin([D])
    assert guard.unpin([D]) == {D: ("r",)}  # the tiers as the last pin went
    assert not guard.uncommitted(D)
    assert guard.begin_delete([(D, "l")]) == ([], [(D, "l")])  # in flight: held back
    done = threading.Event()
    got: list[object] = []

    def writer() -> None:
        got.append(guard.pin_for_put(D))
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not guard.pinned(D) and time.monotonic() < deadline:
            time.sleep(0.005)  # polling for the pin, with a deadline
        assert guard.pinned(D) and not done.is_set()  # no put while the frame is deleted
        guard.end_delete(drop)
        assert done.wait(10) and got == [None]  # then it puts a fresh frame
    finally:
        guard.end_delete(drop)
        t.join(10)
    guard.end_moves([D])
    released.clear()  # (ends of deletions above released too)
    guard.put_done(D, "l", 10)
    guard.unpin([D])
    assert released == [1] and not guard.held_digests()


def test_no_move_onto_a_remote_object_being_deleted() -> None:
    """A deletion of the remote object marked before the writer pinned (an older version
    of the same bytes): the move waits for it, and a copy that finished meanwhile does not
    let the local frame go."""
    guard = ChunkGuard(["l"])
    marked, _ = guard.begin_delete([(D, "r")])
    assert guard.pin_for_put(D) is None  # a remote deletion does not hold a local put
    guard.put_done(D, "l", 10)
    assert guard.start_moves(1 << 30, 0, lambda d: ["r"], True) == ([], True)
    assert guard.moved(D, ("l",), ["r"], set()) == ("kept", [])
    assert guard.current(D) == ("l",)
    guard.end_delete(marked)
    assert guard.start_moves(1 << 30, 0, lambda d: ["r"], True) == ([(D, 10, ("l",))], False)
    # A committed file names the local frame too: it stays, the remote copy is added.
    assert guard.moved(D, ("l",), ["r"], {"l"}) == ("kept", [])
    assert guard.current(D) == ("l", "r")
    guard.end_moves([D])
    assert guard.start_moves(1 << 30, 0, lambda d: ["r"], True) == ([], False)
    guard.unpin([D])
    assert guard.current(D) is None


async def save(fs: Filesystem, run: int, step: int, model: bytes) -> None:
    d = await fs.mkdir(run, f"checkpoint-{step}".encode(), 0o755, ROOT)
    for name, data in ((b"model.bin", model), (b"trainer_state.json", json.dumps({"step": step}).encode())):
        fh, _ = await fs.create(d.ino, name, 0o644, RW, ROOT)
        await fs.write(fh, 0, data)
        await fs.flush(fh)
        await fs.release(fh)


async def test_retention_never_deletes_chunks_an_open_file_is_about_to_commit(tmp_path: Path) -> None:
    local = MemoryTier("l")
    x = os.urandom(3 * CS)
    async with make_daemon(tmp_path, [local], checkpoints=CheckpointConfig(),
                           retention=RetentionConfig(POLICY)) as d:
        fs = d.fs
        run = await fs.mkdir(ROOT_INODE, b"run", 0o755, ROOT)
        await save(fs, run.ino, 1, x)
        fh, inode = await fs.create(ROOT_INODE, b"copy.bin", 0o644, RW, ROOT)
        await fs.write(fh, 0, x)  # three whole chunks: stored and pinned, not committed
        f = fs.open_files[inode.ino]
        await wait_for(lambda: not f._running and len(f.written) == 3)
        await save(fs, run.ino, 2, os.urandom(3 * CS))
        await wait_for(lambda: isinstance(fs.tracker, CheckpointTracker) and fs.tracker.commits >= 2)
        await d.janitor.run_now()
        assert await state(fs, "/run/checkpoint-1") == "expired"  # its chunks are pinned
        await fs.flush(fh)
        await fs.release(fh)
        await d.janitor.run_now()  # copy.bin references them now: kept, checkpoint deleted
        assert await state(fs, "/run/checkpoint-1") == "deleted"
        await deletions_done(fs)
        store_of(fs).cache.entries.clear()
        assert await read_file(fs, b"copy.bin") == x


@pytest.mark.allow_log_errors
async def test_a_failed_fsync_retires_the_handle_and_close_commits_nothing(tmp_path: Path) -> None:
    tier = FaultyTier(MemoryTier("l"))
    old, new = os.urandom(CS + 10), os.urandom(2 * CS)
    async with make_fs(tmp_path, [tier]) as fs:
        ino = await write_file(fs, b"f", old)
        fh = await fs.open(ino, RW)
        await fs.write(fh, 0, new)
        tier.fail_syncs = True
        with pytest.raises(CkptfsError) as info:
            await fs.fsync(fh)
        assert info.value.errno == errno.EIO
        tier.fail_syncs = False
        assert await read_file(fs, b"f") == old  # a new open: the last committed content
        with pytest.raises(CkptfsError):
            await fs.flush(fh)  # close reports the error and commits nothing
        await fs.release(fh)
        assert await read_file(fs, b"f") == old
        assert (await fs.getattr(ino)).size == len(old)
