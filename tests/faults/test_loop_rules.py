"""The loop's rules (docs/concurrency.md): nothing on the trio loop waits for the network or
for a lock a thread holds across I/O, and background tasks end with whoever started them.
Each test holds a tier call in a worker thread on a gate and shows what must still work."""

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.vfs.test_vfs import CS, catalog_of, make_daemon, until_backlog_empty, until_real

from ckptfs.catalog import ChunkRef, SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.chunks.guard import ChunkGuard
from ckptfs.chunks.room import Room
from ckptfs.chunks.store import ChunkStore, StorePolicy, stats_for
from ckptfs.codec import frame
from ckptfs.config import ReadConfig, UploadConfig
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.upload import deleter as deleter_module
from ckptfs.upload import uploader as uploader_module
from ckptfs.upload.commits import QUIET_S
from ckptfs.upload.deleter import STOP_GRACE_S, Deleter
from ckptfs.upload.uploader import SNAPSHOT_MIN_SPACING_S, SNAPSHOT_NAME, SNAPSHOT_RECHECK_S
from ckptfs.vfs.context import ROOT


async def until(cond: Any, timeout: float = 10) -> None:
    """Wait for a condition set by a worker thread (no event crosses the thread)."""
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.005)


def remote_only_chunks(remote: MemoryTier, n: int) -> list[ChunkRef]:
    refs = []
    for _ in range(n):
        data = os.urandom(1000)
        digest = frame.digest_of(data)
        remote.put(digest.hex(), frame.encode([data], digest))
        refs.append(ChunkRef(digest, len(data), (remote.name,)))
    return refs


async def test_hung_remote_gets_leave_local_reads_and_writes_alone(tmp_path: Path) -> None:
    """Reads from an object store that hangs take only the remote-read threads: a chunk
    write and a read of a local chunk still complete (they once waited for the same
    limiter as the hung GETs)."""
    local, inner = MemoryTier("l"), MemoryTier("r", kind="remote")
    remote = FaultyTier(inner)
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    store = ChunkStore([local, remote], cat, trio.CapacityLimiter(1),
                       StorePolicy(io_threads=2, cache_bytes=1 << 20))
    remote.get_gate = threading.Event()
    try:
        async with trio.open_nursery() as n:
            for ref in remote_only_chunks(inner, 4):  # more than the threads there are
                n.start_soon(store.read, ref)
            await until(lambda: remote.gets_held == 2)
            with trio.fail_after(10):
                ref = await store.write([b"local bytes" * 100])
                assert ref.tiers == ("l",)
                store.cache.entries.clear()
                assert bytes(await store.read(ref)) == b"local bytes" * 100
            assert remote.gets_held == 2  # still hung: the local I/O did not wait for them
            remote.get_gate.set()
    finally:
        remote.get_gate.set()
        cat.close()


async def test_readahead_ends_with_its_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Readahead against a slow tier is cancelled when the file's last handle closes:
    the release does not wait for the slow reads, no prefetch task is left in the mount's
    nursery, and nothing is logged as an error."""
    tier = FaultyTier(MemoryTier("l"))
    # A cache of 8 chunks: the readahead (capped at half the cache) fetches all 3 ahead.
    async with make_daemon(tmp_path, [tier], reads=ReadConfig(readahead=3 * CS),
                           memory_budget=16 * CS) as daemon:
        fs = daemon.fs
        data = os.urandom(4 * CS)
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, os.O_RDWR, ROOT)
        await fs.write(fh, 0, data)
        await fs.flush(fh)
        await fs.release(fh)
        extents = await fs.db(fs.catalog.extents, inode.ino)
        tier.gate_keys = {ref.key for idx, ref in extents.items() if idx > 0}
        tier.get_gate = threading.Event()
        try:
            fh = await fs.open(inode.ino, os.O_RDONLY)
            f = fs.open_files[inode.ino]
            assert bytes(await fs.read(fh, 0, CS)) == data[:CS]  # chunk 0: not held
            nursery = fs._nursery
            assert nursery is not None

            def prefetches() -> int:
                return sum("_prefetch" in t.name for t in nursery.child_tasks)

            assert prefetches() == 3  # chunks 1-3, held in the tier
            await until(lambda: tier.gets_held == 2)  # io_threads: the others wait for one
            with trio.fail_after(10):
                await fs.release(fh)
            assert prefetches() == 0
            assert f.readahead_running == 0
            assert tier.gets_held == 2  # abandoned in their threads, not waited for
        finally:
            tier.get_gate.set()
        await until(lambda: tier.gets_held == 0)
        # The file reads whole afterwards (the abandoned fetches left nothing behind).
        fh = await fs.open(inode.ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, 0, 4 * CS)) == data
        await fs.release(fh)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


class CountingTier(MemoryTier):
    """A remote MemoryTier that counts the catalog snapshots put on it."""

    def __init__(self, name: str) -> None:
        super().__init__(name, kind="remote")
        self.snapshots = 0

    def put_meta(self, name: str, data: bytes) -> None:
        super().put_meta(name, data)
        self.snapshots += name == SNAPSHOT_NAME


async def _save_in_progress(fs: Any, name: bytes) -> int:
    """A save running: a file with a partial chunk in memory (the budget is in use)."""
    fh, _ = await fs.create(ROOT_INODE, name, 0o644, os.O_RDWR, ROOT)
    await fs.write(fh, 0, os.urandom(CS // 2))
    return int(fh)


async def _write(fs: Any, name: bytes, data: bytes) -> None:
    fh, _ = await fs.create(ROOT_INODE, name, 0o644, os.O_RDWR, ROOT)
    await fs.write(fh, 0, data)
    await fs.flush(fh)
    await fs.release(fh)


async def test_deferred_uploads_start_when_the_save_ends(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """Uploads that wait for a save start when it ends (an event), with trio's clock
    frozen: no timer wakes the uploader to notice (it once looked every 0.2 s)."""
    local, remote = MemoryTier("l"), CountingTier("r")
    async with make_daemon(tmp_path, [local, remote], upload=UploadConfig(during_save="defer")) as daemon:
        fs, up = daemon.fs, daemon.uploader
        fh = await _save_in_progress(fs, b"saving")
        await _write(fs, b"done", os.urandom(2 * CS))  # committed: two upload jobs
        await trio.testing.wait_all_tasks_blocked()
        await until_real(lambda: up._sleeping and not up.running)
        assert not remote.frames  # deferred while the save runs
        await fs.release(fh)  # the save ends without a commit (nothing kicks the uploader)
        await trio.testing.wait_all_tasks_blocked()
        assert not remote.frames  # the commit's stream is not over yet
        mock_clock.jump(1.5 * QUIET_S)  # ... now it is (a deadline, not a look every 0.2 s)
        await until_real(lambda: len(remote.frames) == 2)


async def test_an_idle_uploader_has_no_timer_and_a_rename_is_snapshotted(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """With nothing to do the uploader sleeps until an event (an hour of trio time passes
    without a look); a change that queues no upload (a rename) is snapshotted
    SNAPSHOT_RECHECK_S after the first change of its burst, once for the burst."""
    local, remote = MemoryTier("l"), CountingTier("r")
    async with make_daemon(tmp_path, [local, remote]) as daemon:
        fs, up = daemon.fs, daemon.uploader
        passes: list[float] = []
        real_pass = up._pass

        async def counted(nursery: trio.Nursery) -> tuple[float, bool]:
            passes.append(trio.current_time())
            return await real_pass(nursery)

        up._pass = counted  # type: ignore[method-assign]

        async def quiet() -> None:
            """Until the uploader sleeps with nothing to upload and the snapshot current."""
            deadline = time.monotonic() + 10
            while True:
                await trio.testing.wait_all_tasks_blocked()
                if up._sleeping and not up.running and up._dirty_since is None:
                    if (await fs.db(fs.catalog.snapshot_is_current)
                            and not (await fs.db(catalog_of(fs).backlog)).chunks and up._sleeping):
                        return
                    # A snapshot right after the last one waits SNAPSHOT_MIN_SPACING_S,
                    # uploads wait for the stream of commits to pause (QUIET_S).
                    mock_clock.jump(SNAPSHOT_MIN_SPACING_S)
                assert time.monotonic() < deadline, "the uploader did not settle"
                await trio.to_thread.run_sync(time.sleep, 0.005)

        await _write(fs, b"a", os.urandom(CS))
        await quiet()
        n, snapshots = len(passes), remote.snapshots
        assert snapshots >= 1
        mock_clock.jump(3600)
        await trio.testing.wait_all_tasks_blocked()
        assert len(passes) == n  # no timer: not one look in an hour
        for i in range(3):  # a burst of namespace-only changes
            await fs.rename(ROOT_INODE, b"a" if i == 0 else b"b%d" % (i - 1), ROOT_INODE,
                            b"b%d" % i, 0, ROOT)
        await trio.testing.wait_all_tasks_blocked()
        assert up._dirty_since is not None  # the first rename set the snapshot's deadline
        assert remote.snapshots == snapshots and len(passes) == n  # which has not come
        mock_clock.jump(SNAPSHOT_RECHECK_S)
        await until_real(lambda: remote.snapshots == snapshots + 1)
        await quiet()
        assert len(passes) == n + 1  # one look for the burst


async def test_a_stream_of_small_files_is_snapshotted_once_per_spacing(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """Each small file's upload empties the backlog; the snapshots nobody waits for stay
    SNAPSHOT_MIN_SPACING_S apart (one per file cost more than the files)."""
    local, remote = MemoryTier("l"), CountingTier("r")
    async with make_daemon(tmp_path, [local, remote]) as daemon:
        fs = daemon.fs
        await _write(fs, b"first", os.urandom(1000))
        await until_real(lambda: remote.snapshots == 1)
        for i in range(5):
            await _write(fs, b"f%d" % i, os.urandom(1000))
            mock_clock.jump(2 * QUIET_S)  # a pause in the stream of commits: uploads go
            await until_backlog_empty(fs)  # uploaded
            await trio.testing.wait_all_tasks_blocked()
        assert remote.snapshots == 1  # none of the five within the spacing
        mock_clock.jump(SNAPSHOT_MIN_SPACING_S)
        await until_real(lambda: remote.snapshots == 2)  # one for all five
        assert await fs.db(fs.catalog.snapshot_is_current)


async def test_the_guard_lock_is_free_while_threads_delete_and_put(tmp_path: Path) -> None:
    """The pin bookkeeping is never locked across I/O: while a deletion batch is inside
    the tier's delete and a chunk write inside its put (both in worker threads, held on
    gates), the guard's lock is free and the trio thread pins, unpins and reads it."""
    inner = MemoryTier("l")
    tier = FaultyTier(inner)
    async with make_daemon(tmp_path, [tier]) as daemon:
        fs, guard = daemon.fs, daemon.store.guard
        data = os.urandom(CS)
        await _write(fs, b"a", data)
        digest = frame.digest_of(data)
        deletes = tier.hold_deletes = threading.Event()
        puts = tier.put_gate = threading.Event()
        try:
            await fs.unlink(ROOT_INODE, b"a", ROOT)  # the deleter's batch: held in delete
            await until(tier.delete_held.is_set)
            assert guard.deleting_pairs() == {(digest, "l")}
            async with trio.open_nursery() as n:
                n.start_soon(_write, fs, b"b", os.urandom(CS))  # held in put, pinned
                await until(tier.put_entered.is_set)
                assert guard._cond.acquire(blocking=False)  # nobody holds it across I/O
                guard._cond.release()
                with trio.fail_after(5):  # the loop would hang, not time out, if it waited
                    guard.pin(digest)
                    assert guard.pinned(digest) and guard.current(digest) is None
                    assert guard.unpin([digest]) == {}
                    assert guard.start_moves(1 << 30, 0, lambda d: [], False) == ([], False)
                puts.set()
            deletes.set()
            await until(lambda: not guard.deleting_pairs())
        finally:
            puts.set()
            deletes.set()
        assert inner.frames.keys() == {ref.key for ref in (
            await fs.db(fs.catalog.extents, (await fs.lookup(ROOT_INODE, b"b")).ino)).values()}


@pytest.mark.allow_log_warnings(
    "catalog snapshot upload failed", "upload to tier r failed, will retry"
)
async def test_uploads_postponed_by_an_outage_go_when_the_tier_works_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first upload that succeeds after an outage makes the tier's other postponed
    uploads due at once: they do not each wait out their backoff (60 s here)."""
    monkeypatch.setattr(uploader_module, "backoff_s", lambda attempts: 60.0)
    local, inner = MemoryTier("l"), MemoryTier("r", kind="remote")
    remote = FaultyTier(inner)
    remote.fail_puts = True
    async with make_daemon(tmp_path, [local, remote]) as daemon:
        fs, up = daemon.fs, daemon.uploader
        for name in (b"a", b"b", b"c"):
            await _write(fs, name, os.urandom(CS))

        async def postponed() -> int:
            jobs = await fs.db(catalog_of(fs).due_uploads, 2**62, 10, set())
            return sum(j.attempts > 0 for j in jobs)

        with trio.fail_after(10):
            while await postponed() < 3 or up.running:
                await trio.sleep(0.01)  # polling the catalog for the condition
        assert up._failing == {"r"}
        remote.fail_puts = False
        [first, *_] = await fs.db(catalog_of(fs).due_uploads, 2**62, 1, set())
        await fs.db(catalog_of(fs).postpone_upload, first.digest, "r", 0, "", False)
        up.kick()  # one job is due: it succeeds, and the tier works again
        await until(lambda: len(inner.frames) == 3)
        assert not up._failing


class TimedDeletes(FaultyTier):
    """Records the trio time of each delete and fails the first ``failures`` of them."""

    def __init__(self, inner: Tier, failures: int) -> None:
        super().__init__(inner)
        self.failures = failures
        self.times: list[float] = []

    def delete(self, key: str) -> int:
        self.times.append(trio.from_thread.run_sync(trio.current_time))
        self.fail_deletes = len(self.times) <= self.failures
        return super().delete(key)


@pytest.mark.allow_log_warnings("deleting chunks on tier r failed, will retry")
async def test_failed_deletions_are_retried_on_their_backoff(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote deletion that fails is retried when its backoff ends, not sooner and not
    by a poll: trio's clock jumps from deadline to deadline (MockClock autojump)."""
    monkeypatch.setattr(deleter_module, "backoff_s", lambda attempts: 0.5 * 2**attempts)
    local, remote = MemoryTier("l"), TimedDeletes(MemoryTier("r", kind="remote"), failures=3)
    tiers: list[Tier] = [local, remote]
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        deleter = Deleter(cat, tiers, trio.CapacityLimiter(1), guard=ChunkGuard(["l"]),
                          stats=stats_for(tiers), room=Room(),
                          clock=lambda: int(trio.current_time() * 1e9))
        cat.queue_deletions([(b"\x07" * 32, "r")])
        async with trio.open_nursery() as n:
            n.start_soon(deleter.run)
            deleter.kick()
            while deleter.deleted < 1:
                await deleter._progress.wait()  # set after each row: no poll of ours
            n.cancel_scope.cancel()
        assert len(remote.times) == 4
        gaps = [b - a for a, b in zip(remote.times, remote.times[1:], strict=False)]
        for gap, backoff in zip(gaps, (0.5, 1.0, 2.0), strict=True):
            assert backoff <= gap < backoff + 0.1  # its backoff, then the batching window
        assert deleter.failures == 3 and deleter.deleted == 1
    finally:
        cat.close()


def held_remote_deletion(tmp_path: Path) -> tuple[SqliteCatalog, MemoryTier, FaultyTier,
                                                   threading.Event, Deleter, bytes]:
    """A deleter with one queued remote row whose DELETE will be held on a gate."""
    local, inner = MemoryTier("l"), MemoryTier("r", kind="remote")
    remote = FaultyTier(inner)
    remote.hold_deletes = gate = threading.Event()
    [ref] = remote_only_chunks(inner, 1)
    tiers: list[Tier] = [local, remote]
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    deleter = Deleter(cat, tiers, trio.CapacityLimiter(1), guard=ChunkGuard(["l"]),
                      stats=stats_for(tiers), room=Room())
    cat.queue_deletions([(ref.digest, "r")])
    return cat, inner, remote, gate, deleter, ref.digest


async def test_a_remote_deletion_in_flight_at_a_stop_still_ends_its_claim(tmp_path: Path) -> None:
    """The queue is stopped (an unmount) while a remote DELETE is in flight: the DELETE
    returns within the stop's grace, and its end is written. Cut short, the row stayed
    claimed for the claim's whole lease (600 s), so the next mount could not retry it and
    the pair's uploads waited as long (seen in tests/remote/test_deletion_queue.py)."""
    cat, inner, remote, gate, deleter, digest = held_remote_deletion(tmp_path)
    try:
        async with trio.open_nursery() as n:
            n.start_soon(deleter.run)
            deleter.kick()
            await trio.to_thread.run_sync(remote.delete_held.wait, 30)
            n.cancel_scope.cancel()  # the stop, with the DELETE held
            gate.set()  # it answers within the grace
        assert deleter.deleted == 1 and not inner.frames
        assert cat.deletion_keys("r") == set()  # done: no claim left behind
    finally:
        gate.set()
        cat.close()


async def test_a_hung_remote_deletion_delays_a_stop_only_by_the_grace(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A DELETE that hangs past the stop's grace is abandoned then: the stop takes the
    grace (trio's clock jumps to it), and the row keeps its claim, since the DELETE may
    still land; the lease that ends it lies ahead."""
    cat, inner, remote, gate, deleter, digest = held_remote_deletion(tmp_path)
    try:
        async with trio.open_nursery() as n:
            n.start_soon(deleter.run)
            deleter.kick()
            await trio.to_thread.run_sync(remote.delete_held.wait, 30)
            stopped_at = trio.current_time()
            n.cancel_scope.cancel()
        assert trio.current_time() - stopped_at == pytest.approx(STOP_GRACE_S)
        assert deleter.deleted == 0 and inner.frames
        assert cat.deletion_keys("r") == {digest}
        lease_end = cat.next_deletion_due_ns(set(), ["r"])
        assert lease_end is not None and lease_end > time.time_ns() + 60 * 10**9
    finally:
        gate.set()
        cat.close()


async def test_a_reader_that_joined_a_cancelled_readahead_fetches_the_chunk_itself(
    tmp_path: Path,
) -> None:
    """A read that joined a readahead's fetch is not left without data when the readahead
    is cancelled (its file was released): it fetches the chunk itself."""
    tier = FaultyTier(MemoryTier("l"))
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    store = ChunkStore([tier], cat, trio.CapacityLimiter(1),
                       StorePolicy(io_threads=2, cache_bytes=1 << 20))
    data = os.urandom(5000)
    gate = threading.Event()
    try:
        ref = await store.write([data])
        tier.get_gate = gate
        got: list[bytes] = []
        async with trio.open_nursery() as n:
            ahead = trio.CancelScope()

            async def readahead() -> None:
                with ahead:
                    await store.read(ref, abandon_on_cancel=True)

            async def reader() -> None:
                got.append(bytes(await store.read(ref)))

            n.start_soon(readahead)
            await until(lambda: tier.gets_held == 1)
            n.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()  # joined the readahead's fetch
            assert tier.gets_held == 1
            ahead.cancel()
            await until(lambda: tier.gets_held == 2)  # its own fetch; the other abandoned
            gate.set()
        assert got == [data]
    finally:
        gate.set()
        cat.close()
