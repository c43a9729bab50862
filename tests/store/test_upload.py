"""The upload queue against in-memory remote tiers (fault injection by wrapper tiers)."""

import os
import threading
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.vfs.test_vfs import (
    CS,
    RW,
    catalog_of,
    deletions_done,
    make_fs,
    read_file,
    until_backlog_empty,
    until_real,
    uploader_of,
    write_file,
)

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.codec import frame
from ckptfs.config import UPLOAD_DURING_SAVE, UploadConfig
from ckptfs.errors import CatalogUnavailable
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.upload.commits import QUIET_S
from ckptfs.upload.cpuidle import IdleCores
from ckptfs.upload.uploader import MAX_DEFER_S, backoff_s
from ckptfs.vfs.context import ROOT


def skip_backoff() -> int:
    """A clock 1000 s ahead: retries scheduled before now are due at once."""
    return time.time_ns() + 10**12


async def wait_backlog_empty(fs, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(timeout):
        while (await fs.db(catalog_of(fs).backlog)).chunks:
            await trio.sleep(0.01)  # polling the catalog for the condition, with a deadline


@pytest.mark.allow_log_warnings("copy on tier l missing; healing it")
async def test_committed_chunks_reach_the_remote_verified(tmp_path: Path) -> None:
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    data = os.urandom(3 * CS + 5)
    async with make_fs(tmp_path, [local, remote]) as fs:
        await write_file(fs, b"f", data)
        await wait_backlog_empty(fs)
        assert set(remote.frames) == set(local.frames)
        for key, raw in remote.frames.items():
            frame.verify(raw, bytes.fromhex(key))
        # The local copies vanish: reads come from the remote, verified.
        local.frames.clear()
    async with make_fs(tmp_path, [local, remote]) as fs:
        assert await read_file(fs, b"f") == data


@pytest.mark.allow_log_warnings(
    "catalog snapshot upload failed", "upload to tier r failed, will retry",
)
async def test_outage_grows_backlog_then_drains(tmp_path: Path) -> None:
    remote = FaultyTier(MemoryTier("r", kind="remote"))
    remote.kind = "remote"
    remote.fail_puts = True
    async with make_fs(tmp_path, [MemoryTier("l"), remote]) as fs:
        await write_file(fs, b"a", os.urandom(2 * CS))
        await write_file(fs, b"b", os.urandom(2 * CS))  # writes go on during the outage
        with trio.fail_after(10):
            while (await fs.db(catalog_of(fs).backlog)).last_error is None:
                await trio.sleep(0.01)
        backlog = await fs.db(catalog_of(fs).backlog)
        assert backlog.chunks == 4 and backlog.bytes == 4 * CS
        remote.fail_puts = False
        uploader_of(fs).clock = skip_backoff
        uploader_of(fs).kick()
        await wait_backlog_empty(fs)
        assert len(remote.inner.frames) == 4  # type: ignore[attr-defined]


async def test_restart_replays_pending_uploads(tmp_path: Path) -> None:
    local = MemoryTier("l")
    dead = FaultyTier(MemoryTier("r", kind="remote"))
    dead.kind = "remote"
    dead.fail_puts = True
    async with make_fs(tmp_path, [local, dead]) as fs:
        await write_file(fs, b"f", os.urandom(2 * CS))
        assert (await fs.db(catalog_of(fs).backlog)).chunks == 2
    healthy: list[Tier] = [local, MemoryTier("r", kind="remote")]
    async with make_fs(tmp_path, healthy) as fs:
        uploader_of(fs).clock = skip_backoff
        uploader_of(fs).kick()
        await wait_backlog_empty(fs)
        assert len(healthy[1].frames) == 2  # type: ignore[attr-defined]


async def test_deleted_file_removes_remote_copies_and_jobs(tmp_path: Path) -> None:
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    async with make_fs(tmp_path, [local, remote]) as fs:
        await write_file(fs, b"f", os.urandom(2 * CS))
        await wait_backlog_empty(fs)
        assert len(remote.frames) == 2
        await fs.unlink(ROOT_INODE, b"f")
        await deletions_done(fs)
        assert remote.frames == {} and local.frames == {}
        assert (await fs.db(catalog_of(fs).backlog)).chunks == 0


async def test_chunks_are_striped_over_remotes(tmp_path: Path) -> None:
    r0, r1 = MemoryTier("r0", kind="remote"), MemoryTier("r1", kind="remote")
    async with make_fs(tmp_path, [MemoryTier("l"), r0, r1]) as fs:
        await write_file(fs, b"f", os.urandom(16 * CS))
        await wait_backlog_empty(fs)
    assert len(r0.frames) + len(r1.frames) == 16
    assert r0.frames and r1.frames
    assert not set(r0.frames) & set(r1.frames)  # remote_copies = 1


def test_backoff_grows_and_is_jittered() -> None:
    assert 0.25 <= backoff_s(0, lambda: 0.0) <= backoff_s(0, lambda: 1.0) == 0.5
    assert backoff_s(3, lambda: 1.0) == 4.0
    assert backoff_s(50, lambda: 1.0) == 60.0


@pytest.mark.allow_log_warnings("BadDigest (body changed in transit)")
async def test_bytes_corrupted_in_transit_are_refused_and_retried(tmp_path: Path) -> None:
    inner = MemoryTier("r", kind="remote")
    remote = FaultyTier(inner)
    remote.corrupt_puts = True
    async with make_fs(tmp_path, [MemoryTier("l"), remote]) as fs:
        await write_file(fs, b"f", os.urandom(2 * CS))
        with trio.fail_after(10):
            while remote.corrupted < 2:
                await trio.sleep(0.01)
        assert inner.frames == {}  # the receiving end refused every damaged body
        remote.corrupt_puts = False
        uploader_of(fs).clock = skip_backoff
        uploader_of(fs).kick()
        await wait_backlog_empty(fs)
    assert len(inner.frames) == 2
    for key, raw in inner.frames.items():
        frame.verify(raw, bytes.fromhex(key))


async def test_upload_rate_is_published_for_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptfs.commands import live, sync
    from ckptfs.upload import uploader

    monkeypatch.setattr(uploader, "RATE_WINDOW_S", 0.0)
    async with make_fs(tmp_path, [MemoryTier("l"), MemoryTier("r", kind="remote")]) as fs:
        await write_file(fs, b"f", os.urandom(4 * CS))
        await wait_backlog_empty(fs)
        rate = live.upload_rate(catalog_of(fs))
        assert rate is not None and rate[0] > 0 and rate[1] < 60
        backlog = catalog_of(fs).backlog()
        pending = type(backlog)(3, 3 * CS, 0, 0, None)
        assert "ETA" in sync.backlog_line(pending, rate)


def test_idle_cores_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal (jiffies, all cpus together)
    stat.write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n")
    idle = IdleCores(str(stat), cores=4)
    assert idle.sample() is None  # nothing to compare with yet
    # 1000 jiffies later: 600 idle + 150 iowait of them
    stat.write_text("cpu  300 0 150 1300 250 0 0 0 0 0\n")
    assert idle.sample() == pytest.approx(4 * 750 / 1000)
    stat.write_text("garbage\n")
    assert idle.sample() is None
    assert IdleCores(str(tmp_path / "missing")).sample() is None


async def _open_save(fs, name: bytes) -> int:  # type: ignore[no-untyped-def]
    """A save in progress: a file with a partial chunk in memory (the budget is in use)."""
    fh, _ = await fs.create(ROOT_INODE, name, 0o644, RW, ROOT)
    await fs.write(fh, 0, os.urandom(CS // 2))
    assert fs.uploader.saving()
    return int(fh)


@pytest.mark.parametrize("mode", ["defer", "auto-busy", "auto-idle", "overlap"])
async def test_uploads_during_a_save_follow_upload_during_save(tmp_path: Path, mode: str) -> None:
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    during = next(m for m in UPLOAD_DURING_SAVE if mode.split("-")[0] == m)
    async with make_fs(tmp_path, [local, remote], upload=UploadConfig(during_save=during)) as fs:
        up = uploader_of(fs)
        up.idle_cores = lambda: 0.6 if mode == "auto-busy" else 7.0
        fh = await _open_save(fs, b"saving")  # before the first file: nothing may slip out
        await write_file(fs, b"done", os.urandom(2 * CS))  # committed, upload jobs queued
        up.kick()
        if mode in ("defer", "auto-busy"):
            await up._measure_spare()
            assert up._limit() == 0  # nothing starts while the save runs
            assert (await fs.db(catalog_of(fs).backlog)).chunks == 2
            assert not remote.frames
        else:
            await wait_backlog_empty(fs)  # uploaded while the save still runs
            assert uploader_of(fs).saving()
            assert len(remote.frames) == 2
            if mode == "auto-idle":
                assert not up.running
                await up._measure_spare()
                assert up._limit() == min(up.concurrency, 6)  # one per idle core but one
        await fs.flush(fh)
        await fs.release(fh)
        await wait_backlog_empty(fs)  # the save's end lets every mode upload
        assert len(remote.frames) == 3


async def test_a_long_save_lets_one_upload_through_after_max_defer(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    async with make_fs(tmp_path, [local, remote],
                       upload=UploadConfig(during_save="defer")) as fs:
        up = uploader_of(fs)
        fh = await _open_save(fs, b"saving")
        assert up._limit() == 0  # the save just began: uploads wait for it
        mock_clock.jump(MAX_DEFER_S - 1)
        assert up._limit() == 0
        mock_clock.jump(2)
        assert up._limit() == 1  # a save older than MAX_DEFER_S: one upload at a time
        await fs.flush(fh)
        await fs.release(fh)
        assert up.saving()  # its commit: a stream of commits until QUIET_S without one
        mock_clock.jump(2 * QUIET_S)
        assert not up.saving()
        assert up._limit() == up.concurrency


async def test_uploads_deferred_to_a_save_wait_for_an_event_not_in_a_loop(tmp_path: Path) -> None:
    """A job due while uploads wait for a save: the uploader sleeps until the save ends
    (an event), a kick or the deferral's deadline; it does not ask the catalog again and
    again meanwhile (it did: "due now" with no slot free was a deadline of now)."""
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    async with make_fs(tmp_path, [local, remote], upload=UploadConfig(during_save="defer")) as fs:
        up = uploader_of(fs)
        looks = 0
        real = up.catalog.next_upload_due_ns

        def counted(*args, **kw):  # type: ignore[no-untyped-def]
            nonlocal looks
            looks += 1
            return real(*args, **kw)

        up.catalog.next_upload_due_ns = counted  # type: ignore[method-assign]
        fh = await _open_save(fs, b"saving")
        await write_file(fs, b"done", os.urandom(2 * CS))  # due now, deferred
        up.kick()
        with trio.fail_after(10):
            while looks == 0 or not up._sleeping:
                await trio.sleep(0.01)
        before = looks
        await trio.sleep(0.5)  # a busy loop would look hundreds of times meanwhile
        assert looks - before <= 2 and not remote.frames
        await fs.flush(fh)
        await fs.release(fh)
        await wait_backlog_empty(fs)  # the save's end wakes it
        assert len(remote.frames) == 3


@pytest.mark.parametrize("mode", ["defer", "auto-busy", "overlap"])
async def test_a_stream_of_small_files_is_a_save_for_the_uploads(
    tmp_path: Path, mock_clock: trio.testing.MockClock, mode: str
) -> None:
    """Small files closed one after another hold no chunk buffer between them, but their
    commits are a stream (upload/commits.py): with "defer" and a busy "auto" no upload
    starts until no commit came for QUIET_S (trio's clock stands still meanwhile); with
    "overlap" they go at once. A durability wait does not wait for the stream's end."""
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    during = next(m for m in UPLOAD_DURING_SAVE if mode.split("-")[0] == m)
    async with make_fs(tmp_path, [local, remote], upload=UploadConfig(during_save=during)) as fs:
        up = uploader_of(fs)
        up.idle_cores = lambda: 0.6  # "auto": no idle core beyond the save's own
        for i in range(4):
            await write_file(fs, b"small%d" % i, os.urandom(4096))
        assert fs.budget.used == 0 and up.saving()  # no buffer held, yet a save runs
        if mode == "overlap":
            await until_real(lambda: len(remote.frames) == 4)
            return
        await until_real(lambda: up._sleeping and not up.running)
        assert not remote.frames and (await fs.db(catalog_of(fs).backlog)).chunks == 4
        # A durability wait (a policy, `ckptfs sync`) takes every slot during the stream.
        digest = frame.digest_of(await read_file(fs, b"small0"))
        with trio.fail_after(10):
            assert await up.wait_durable({digest}, 10)
        assert digest.hex() in remote.frames
        mock_clock.jump(2 * QUIET_S)  # the stream pauses: its end is a deadline, not a look
        await until_real(lambda: len(remote.frames) == 4)
        await until_backlog_empty(fs)


async def test_uploads_finishing_together_are_recorded_in_one_transaction(
    tmp_path: Path,
) -> None:
    """Each finished upload's replica row is written by whichever upload takes the record
    lock first, for every upload finished by then: four uploads held until they all
    finish are recorded in at most two transactions (the first one's, with whatever had
    finished when it began, then the rest, which finished while it ran), and every one
    learns its own result."""
    local, remote = MemoryTier("l"), FaultyTier(MemoryTier("r", kind="remote"))
    async with make_fs(tmp_path, [local, remote]) as fs:
        up = uploader_of(fs)
        await write_file(fs, b"first", os.urandom(1000))  # and the first (overdue) snapshot
        await wait_backlog_empty(fs)
        await until_real(lambda: up.snapshot_of_ns > 0)
        gate = remote.put_gate = threading.Event()  # the next snapshot waits for the backlog
        batches: list[int] = []
        real = up.catalog.finish_uploads

        def counted(done, jobs=None):  # type: ignore[no-untyped-def]
            batches.append(len(done))
            if len(batches) == 1:  # hold the first until all four are finished
                deadline = time.monotonic() + 10
                while len(done) + len(up._records.jobs) < 4 and time.monotonic() < deadline:
                    time.sleep(0.002)
            return real(done, jobs)

        up.catalog.finish_uploads = counted  # type: ignore[method-assign]
        for i in range(4):
            await write_file(fs, b"f%d" % i, os.urandom(CS // 4))
        await until_real(lambda: len(up.running) == 4)  # all four in their puts
        gate.set()
        await wait_backlog_empty(fs)
        assert sum(batches) == 4 and len(batches) <= 2, batches
        for i in range(4):
            digest = frame.digest_of(await read_file(fs, b"f%d" % i))
            assert "r" in await fs.db(catalog_of(fs).replica_tiers, digest)
        assert not up._records.jobs


async def test_a_failed_record_transaction_fails_every_upload_of_it(tmp_path: Path) -> None:
    """The uploads recorded together share their transaction's fate: when it fails, each
    one's record call raises the error (as its own transaction's would have), and the
    jobs stay queued for a later upload."""
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    async with make_fs(tmp_path, [local, remote], upload=UploadConfig(during_save="defer")) as fs:
        up = uploader_of(fs)
        fh = await _open_save(fs, b"saving")  # uploads wait: we record the jobs ourselves
        for i in range(3):
            await write_file(fs, b"f%d" % i, os.urandom(1000))
        jobs = await fs.db(catalog_of(fs).due_uploads, skip_backoff(), 10, set())
        assert len(jobs) == 3
        entered, release = threading.Event(), threading.Event()

        def failing(done, jobs=None):  # type: ignore[no-untyped-def]
            entered.set()
            release.wait(10)
            raise CatalogUnavailable("catalog down")

        up.catalog.finish_uploads = failing  # type: ignore[method-assign]
        errors: list[BaseException] = []

        async def record(job):  # type: ignore[no-untyped-def]
            try:
                await up._recorded(job, None)
            except CatalogUnavailable as exc:
                errors.append(exc)

        async with trio.open_nursery() as n:
            n.start_soon(record, jobs[0])
            await trio.to_thread.run_sync(entered.wait, 10)
            n.start_soon(record, jobs[1])
            n.start_soon(record, jobs[2])
            await trio.testing.wait_all_tasks_blocked()
            release.set()  # the first batch fails; then the batch of the other two
        assert len(errors) == 3
        assert not up._records.jobs
        assert (await fs.db(catalog_of(fs).backlog)).chunks == 3  # nothing recorded
        await fs.flush(fh)
        await fs.release(fh)
