"""Retention safety rules at the filesystem level (in-memory tiers): never delete a
checkpoint being read, never evict data not yet uploaded, expired data verified gone."""

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.store.test_local_full import wait_for
from tests.store.test_upload import skip_backoff, wait_backlog_empty
from tests.support.daemons import build_daemon
from tests.vfs.test_vfs import (
    CS,
    RW,
    catalog_of,
    deletions_done,
    make_daemon,
    make_fs,
    store_of,
    uploader_of,
)

from ckptfs.catalog import PostgresCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.checkpoints.retention import RetentionPolicy
from ckptfs.checkpoints.tracker import CheckpointTracker
from ckptfs.config import CheckpointConfig, RetentionConfig
from ckptfs.daemon.build import Wakeups
from ckptfs.daemon.services import running
from ckptfs.session import NodeSession
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.vfs.context import ROOT
from ckptfs.vfs.filesystem import Filesystem

POLICY = (RetentionPolicy("/run", keep_local=1, keep=1, skip_superseded_uploads=False),)


async def save(fs: Filesystem, run: int, step: int) -> int:
    """An HF-style checkpoint-N directory, trainer_state.json last."""
    d = await fs.mkdir(run, f"checkpoint-{step}".encode(), 0o755, ROOT)
    for name, data in ((b"model.safetensors", os.urandom(70_000)),
                       (b"trainer_state.json", json.dumps({"step": step}).encode())):
        fh, _ = await fs.create(d.ino, name, 0o644, RW, ROOT)
        await fs.write(fh, 0, data)
        await fs.flush(fh)
        await fs.release(fh)
    return d.ino


async def state(fs: Filesystem, root: str) -> str | None:
    rows = [c for c in await fs.db(fs.catalog.checkpoint_rows, root) if c.root == root]
    return rows[0].state.value if rows else None


def options() -> dict[str, Any]:
    return {"checkpoints": CheckpointConfig(), "retention": RetentionConfig(POLICY)}


async def test_a_checkpoint_being_read_is_not_deleted_until_closed(tmp_path: Path) -> None:
    async with make_daemon(tmp_path, [MemoryTier("l")], **options()) as d:
        fs = d.fs
        run = await fs.mkdir(ROOT_INODE, b"run", 0o755, ROOT)
        d1 = await save(fs, run.ino, 1)
        model = await fs.lookup(d1, b"model.safetensors")
        fh = await fs.open(model.ino, os.O_RDONLY)  # a restore is reading step 1
        await save(fs, run.ino, 2)
        await wait_for(lambda: isinstance(fs.tracker, CheckpointTracker) and fs.tracker.commits >= 2)
        report = await d.janitor.run_now()
        assert report.busy == 1 and await state(fs, "/run/checkpoint-1") == "committed"
        assert len(await fs.read(fh, 0, 10)) == 10
        await fs.release(fh)
        report = await d.janitor.run_now()
        assert report.expired == 1 and await state(fs, "/run/checkpoint-1") == "deleted"


@pytest.mark.allow_log_warnings(
    "catalog snapshot upload failed", "upload to tier r failed, will retry",
)
async def test_data_not_yet_uploaded_is_never_evicted(tmp_path: Path) -> None:
    local = MemoryTier("l")
    remote = FaultyTier(MemoryTier("r", kind="remote"))
    remote.fail_puts = True  # the remote is down: nothing gets uploaded
    policy = (RetentionPolicy("/run", keep_local=1, keep=5, skip_superseded_uploads=False),)
    async with make_daemon(tmp_path, [local, remote], checkpoints=CheckpointConfig(),
                       retention=RetentionConfig(policy)) as d:
        fs = d.fs
        run = await fs.mkdir(ROOT_INODE, b"run", 0o755, ROOT)
        for step in (1, 2, 3):
            await save(fs, run.ino, step)
        await wait_for(lambda: isinstance(fs.tracker, CheckpointTracker) and fs.tracker.commits >= 3)
        frames = len(local.frames)
        report = await d.janitor.run_now()
        assert report.evicted_bytes == 0 and len(local.frames) == frames  # only copies
        remote.fail_puts = False
        uploader_of(fs).clock = skip_backoff
        uploader_of(fs).kick()
        await wait_backlog_empty(fs)
        await d.janitor.run_now()
        await deletions_done(fs)
        # Now the remote holds them: the local copies of steps 1-2 leave. (Checked on the
        # tier, not in this pass's report: the tracker's kick after the third commit may
        # have started a pass of its own while the uploads were going on.)
        assert len(local.frames) < frames
        with trio.fail_after(5):
            assert await state(fs, "/run/checkpoint-1") == "committed"


@pytest.mark.allow_log_warnings("deleting chunks on tier r failed, will retry")
async def test_expired_data_on_a_down_remote_is_deleted_when_it_returns(tmp_path: Path) -> None:
    local, remote = MemoryTier("l"), FaultyTier(MemoryTier("r", kind="remote"))
    async with make_daemon(tmp_path, [local, remote], **options()) as d:
        fs = d.fs
        run = await fs.mkdir(ROOT_INODE, b"run", 0o755, ROOT)
        await save(fs, run.ino, 1)
        await wait_backlog_empty(fs)
        uploaded = set(remote.inner.frames)  # type: ignore[attr-defined]
        assert uploaded
        remote.fail_gets = remote.fail_deletes = True  # the remote is unreachable now
        await save(fs, run.ino, 2)
        await wait_for(lambda: isinstance(fs.tracker, CheckpointTracker) and fs.tracker.commits >= 2)
        await d.janitor.run_now()
        assert await state(fs, "/run/checkpoint-1") == "expired"  # not verified gone yet
        assert uploaded <= set(remote.inner.frames)  # type: ignore[attr-defined]
        backlog = await fs.db(catalog_of(fs).deletion_backlog)  # the queue keeps them, with why
        assert [(b.tier, b.chunks) for b in backlog] == [("r", len(uploaded))]
        assert backlog[0].last_error and "injected EIO" in backlog[0].last_error
        remote.fail_gets = remote.fail_deletes = False
        await d.janitor.run_now()  # gc: postponed deletions are retried at once
        assert await state(fs, "/run/checkpoint-1") == "deleted"
        assert not uploaded & set(remote.inner.frames)  # type: ignore[attr-defined]
        await deletions_done(fs)


@pytest.mark.allow_log_warnings(
    "catalog snapshot upload failed", "upload to tier r failed, will retry",
)
async def test_a_superseded_checkpoint_leaves_the_upload_backlog(tmp_path: Path) -> None:
    remote = FaultyTier(MemoryTier("r", kind="remote"))
    remote.fail_puts = True  # a slow or absent remote: the backlog would grow
    policy = (RetentionPolicy("/run", keep_local=3, keep=5, milestone_every=4),)
    async with make_daemon(tmp_path, [MemoryTier("l"), remote], checkpoints=CheckpointConfig(),
                       retention=RetentionConfig(policy)) as d:
        fs = d.fs
        run = await fs.mkdir(ROOT_INODE, b"run", 0o755, ROOT)
        for step in (3, 4, 5, 6):
            await save(fs, run.ino, step)
        await wait_for(lambda: isinstance(fs.tracker, CheckpointTracker) and fs.tracker.commits >= 4)
        await d.janitor.run_now()
        pending = await fs.db(fs.catalog.digests_under, ["/run/checkpoint-4", "/run/checkpoint-6"])
        backlog = await fs.db(catalog_of(fs).backlog)
        # Only the newest (6) and the milestone (4) still wait for the remote.
        assert len(pending) == 6 and backlog.chunks == len(pending)


async def test_the_local_high_watermark_evicts_the_oldest_chunks_a_remote_holds(
    tmp_path: Path,
) -> None:
    from tests.vfs.test_vfs import CS, write_file

    from ckptfs.codec import frame

    local = MemoryTier("l", capacity=10 * (CS + frame.HEADER_SIZE))
    remote = MemoryTier("r", kind="remote")
    async with make_daemon(tmp_path, [local, remote],
                           retention=RetentionConfig(local_high_watermark=0.9)) as d:
        fs = d.fs
        for i in range(3):  # 9 of 10 chunks' room: above the 0.9 watermark... almost
            await write_file(fs, f"f{i}".encode(), os.urandom(3 * CS))
        await wait_backlog_empty(fs)
        await d.janitor._watermark()
        assert len(local.frames) == 9  # 0.9 is not above the mark
        await write_file(fs, b"f3", os.urandom(CS))
        await wait_backlog_empty(fs)
        await d.janitor._watermark()
        used, total = store_of(fs).local_fill()
        assert used / total <= 0.8 + 1e-9  # down to the low mark (0.1 below)
        assert set(local.frames) <= set(remote.frames)
        refs = await fs.db(fs.catalog.extents, (await fs.lookup(ROOT_INODE, b"f3")).ino)
        assert all("l" in r.tiers for r in refs.values())  # the newest file stays local


async def test_a_close_reports_the_tail_without_reading_the_chunk_back(tmp_path: Path) -> None:
    """The detectors get a closed file's last bytes from what the open file stored, not from
    a read of its last chunk on the tier (that would be extra I/O on every save)."""
    local = FaultyTier(MemoryTier("l"))
    zip_like = b"PK\x03\x04" + os.urandom(150_000) + b"PK\x05\x06" + bytes(18)
    async with make_fs(tmp_path, [local], checkpoints=CheckpointConfig()) as fs:
        fh, _ = await fs.create(ROOT_INODE, b"step-3.pt", 0o644, RW, ROOT)
        await fs.write(fh, 0, zip_like)
        await fs.flush(fh)
        local.fail_gets = True  # any read of a chunk now fails
        await fs.release(fh)
        await wait_for(lambda: isinstance(fs.tracker, CheckpointTracker) and fs.tracker.commits >= 1)
        assert await state(fs, "/step-3.pt") == "committed"
        local.fail_gets = False


async def test_a_checkpoint_another_node_reads_is_not_deleted_until_it_closes(
    tmp_path: Path, pg_url: str,
) -> None:
    """Shared catalog: node b's retention sees node a's open files (its session's rows)."""
    wakeups = Wakeups()
    cat = PostgresCatalog(pg_url, pool_size=2, hooks=wakeups.catalog_hooks())
    node_a = PostgresCatalog(pg_url, pool_size=1)
    try:
        session = NodeSession(cat, "b", 60)
        session.register()
        daemon = build_daemon(cat, [MemoryTier("b:l")], wakeups, chunk_size=CS,
                              memory_budget=8 * CS, io_threads=2, session=session, **options())
        async with running(daemon, drain=False):
            fs = daemon.fs
            run = await fs.mkdir(ROOT_INODE, b"run", 0o755, ROOT)
            d1 = await save(fs, run.ino, 1)
            model = await fs.lookup(d1, b"model.safetensors")
            sid_a = (await trio.to_thread.run_sync(node_a.register_session, "a", 60)).sid
            await trio.to_thread.run_sync(node_a.note_open, sid_a, model.ino)  # a restores
            await save(fs, run.ino, 2)
            await wait_for(lambda: isinstance(fs.tracker, CheckpointTracker)
                           and fs.tracker.commits >= 2)
            report = await daemon.janitor.run_now()
            assert report.busy == 1 and await state(fs, "/run/checkpoint-1") == "committed"
            await trio.to_thread.run_sync(node_a.release_inode, sid_a, model.ino)
            report = await daemon.janitor.run_now()
            assert report.expired == 1 and await state(fs, "/run/checkpoint-1") == "deleted"
    finally:
        node_a.close()
        cat.close()
