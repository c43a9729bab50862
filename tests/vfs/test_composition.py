"""The composition root (daemon/build.py, daemon/services.py running) and the chunk layer's commit call."""

import logging
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.support.daemons import build_daemon, hooked_sqlite
from tests.vfs.test_vfs import until_real

from ckptfs.catalog import Catalog, SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.chunks.commit import FileVersion
from ckptfs.config import CheckpointConfig, config_from_dict
from ckptfs.daemon.build import Daemon, Wakeups, build_for_config
from ckptfs.daemon.restore import reconcile_catalog
from ckptfs.daemon.services import running
from ckptfs.mount import pool_size
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs.context import ROOT

CS = 64 * 1024


def daemon_on(cat: Catalog, remote: bool = True, wakeups: Wakeups | None = None) -> Daemon:
    tiers = [MemoryTier("l")] + ([MemoryTier("r", kind="remote")] if remote else [])
    return build_daemon(cat, tiers, wakeups, chunk_size=CS, memory_budget=8 * CS, io_threads=2,
                        checkpoints=CheckpointConfig())


async def test_every_hook_is_given_at_construction(tmp_path: Path) -> None:
    """The catalog's hooks and the guard's release are the wake-ups made before the
    catalog was opened; running the services assigns none of them."""
    cat, wakeups = hooked_sqlite(tmp_path / "catalog.sqlite")
    try:
        d = daemon_on(cat, wakeups=wakeups)
        hooks = (cat.on_touch, cat.on_audit_note, cat.audit_node, d.store.guard.on_release)
        assert hooks == (wakeups.touched.set, wakeups.audit_noted.set, wakeups.node,
                         wakeups.released.set)
        async with running(d, drain=False):
            await d.fs.mkdir(ROOT_INODE, b"d", 0o755, ROOT)  # a change: the snapshot is due
            await until_real(lambda: d.uploader.snapshot_of_ns > 0)
            assert (cat.on_touch, cat.on_audit_note, cat.audit_node,
                    d.store.guard.on_release) == hooks
        assert (cat.on_touch, d.store.guard.on_release) == hooks[::3]
    finally:
        cat.close()


def test_no_component_is_handed_the_filesystem(tmp_path: Path) -> None:
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        d = daemon_on(cat)
        for part in (d.store, d.uploader, d.deleter, d.tracker, d.gc, d.janitor, d.telemetry):
            assert not any(v is d.fs for v in vars(part).values()), type(part).__name__
        # What the store wakes and the queues share was given at construction.
        assert d.store.deleter is d.deleter and d.uploader.deleter is d.deleter
        assert d.store.guard is d.uploader.guard is d.deleter.guard
        assert d.store.room is d.uploader.room is d.deleter.room
        assert d.store.writer.spill_copy == d.uploader.copy_uncommitted
    finally:
        cat.close()


def test_each_component_gets_its_part_of_the_config(tmp_path: Path) -> None:
    cfg = config_from_dict({
        "chunk_size": "1MiB", "memory_budget": "4MiB", "io_threads": 3, "remote_copies": 2, "on_local_full": "enospc",
        "local_full_timeout": 7, "upload_concurrency": 5, "upload_during_save": "overlap",
        "remote_compression": "off", "readahead": "1MiB", "copy_back": "never",
        "remote_read_concurrency": 11, "checkpoint_partial_after": 9, "local_high_watermark": 0.7,
        "retention": [{"path": "/runs/*", "keep": 2}],
        "policy": [{"path": "/final", "durability": "remote"}],
    })
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        d = build_for_config(cfg, cat, [MemoryTier("l"), MemoryTier("r", kind="remote")], CS)
        assert (d.uploader.concurrency, d.uploader.during_save, d.uploader.compressor.mode) == (
            5, "overlap", "off")
        assert (d.store.limiters.io.total_tokens, d.store.policy.remote_copies,
                d.store.policy.on_local_full, d.store.policy.local_full_timeout_s) == (
            3, 2, "enospc", 7.0)
        # Remote GETs: as many as remote_read_concurrency, beside the 3 local I/O threads;
        # the S3 pool holds them and the uploads.
        assert d.store.limiters.remote_io.total_tokens == 11
        assert pool_size(cfg) == 32 and pool_size(config_from_dict(
            {"remote_read_concurrency": 40, "upload_concurrency": 8})) == 52
        assert d.budget.limit == 4 * 1024 * 1024
        opts = d.fs.options
        assert (opts.readahead, opts.copy_back, opts.policies) == (1024 * 1024, "never",
                                                                   cfg.policies)
        assert d.tracker is not None and d.tracker.partial_after_s == 9.0
        assert (d.janitor.policies, d.janitor.high) == (cfg.retention.policies, 0.7)
        # checkpoints = false: no detectors, no tracker.
        off = config_from_dict({"checkpoints": False})
        assert build_for_config(off, cat, [MemoryTier("l")], CS).tracker is None
    finally:
        cat.close()


async def test_running_drains_writers_then_stops_producers_then_queues(tmp_path: Path) -> None:
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    events: list[str] = []
    try:
        d = daemon_on(cat)
        for name in ("tracker", "janitor", "uploader", "deleter"):
            part = getattr(d, name)

            def recording(run: Callable[[], Awaitable[None]], name: str = name
                          ) -> Callable[[], Awaitable[None]]:
                async def wrapped() -> None:
                    try:
                        await run()
                    finally:
                        events.append(f"{name} ended")
                return wrapped

            part.run = recording(part.run)
        shutdown = d.fs.shutdown

        async def drained() -> None:
            await shutdown()
            events.append("drained")

        d.fs.shutdown = drained  # type: ignore[method-assign]
        async with running(d):
            fh, inode = await d.fs.create(ROOT_INODE, b"f", 0o644, os.O_RDWR, ROOT)
            await d.fs.write(fh, 0, b"x" * 100)  # never closed: the unmount commits it
        assert events[0] == "drained"
        assert sorted(events[1:3]) == ["janitor ended", "tracker ended"]
        assert sorted(events[3:5]) == ["deleter ended", "uploader ended"]
        assert cat.get_inode(inode.ino).size == 100
        assert [r.length for r in cat.extents(inode.ino).values()] == [100]
    finally:
        cat.close()


async def test_a_file_version_commits_in_one_call_of_the_chunk_layer(tmp_path: Path) -> None:
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        d = daemon_on(cat)
        store = d.store
        # No background services: the upload job and the deletion row stay for us to see.
        inode = cat.create(ROOT_INODE, b"f", stat.S_IFREG | 0o644, 0, 0)
        first = await store.write([os.urandom(CS)])
        assert store.guard.pinned(first.digest)
        v1 = FileVersion(inode.ino, CS, 1, 1, CS, {}, {0: first}, [first])
        committed = await store.commit(v1, synced=True)
        assert committed is not None and committed[0].digest == first.digest
        assert cat.extents(inode.ino)[0].digest == first.digest
        assert cat.get_inode(inode.ino).size == CS
        assert not store.guard.pinned(first.digest)  # pins released
        assert [j.tier for j in cat.due_uploads(2**62, 10, set())] == ["r"]  # same transaction
        assert d.uploader.commits.running()  # the uploader was told: a stream of commits
        second = await store.write([os.urandom(CS // 2)])
        v2 = FileVersion(inode.ino, CS // 2, 2, 2, CS, committed, {0: second}, [second])
        committed = await store.commit(v2, synced=False)
        assert committed is not None and committed[0].digest == second.digest
        assert not cat.has_chunk(first.digest)  # the replaced chunk was collected ...
        assert {q.tier for q in cat.deletion_backlog()} >= {"l"}  # ... into the deletion queue
        # Nothing changed: nothing to commit, the caller keeps its state.
        same = FileVersion(inode.ino, CS // 2, 2, 2, CS, committed, {}, [])
        assert await store.commit(same, synced=True) is None
    finally:
        cat.close()


@pytest.mark.allow_log_warnings("in the config differs from")
def test_a_catalog_keeps_its_chunk_size_and_warns_only_when_another_was_asked_for(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        first = config_from_dict({"state_dir": str(tmp_path), "chunk_size": "256KiB"})
        assert reconcile_catalog(cat, first) == 256 * 1024
        with caplog.at_level(logging.WARNING, logger="ckptfs.mount"):
            # A remount from the state dir alone: the default is not a request.
            assert reconcile_catalog(cat, config_from_dict({"state_dir": str(tmp_path)})) \
                == 256 * 1024
            assert "differs" not in caplog.text
            asked = config_from_dict({"state_dir": str(tmp_path), "chunk_size": "1MiB"})
            assert reconcile_catalog(cat, asked) == 256 * 1024
        assert "chunk_size 1048576 in the config differs from 262144" in caplog.text
    finally:
        cat.close()
