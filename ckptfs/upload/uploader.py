"""The upload queue: copies committed chunks from a local tier to their remote tiers.

Jobs are catalog rows written in the same transaction as the commit that makes a file name
the chunk, so a restart replays them. Oldest commit first, after the chunks someone waits
for (a durability wait here; with a shared catalog, a reader on another node: its want,
heard by LISTEN, catalog/wants.py), a bounded number at once (worker threads under a
limiter), transient errors retried with exponential backoff and jitter, permanent ones
(access denied, no bucket) reported once and retried rarely; the data stays local
meanwhile. A finished copy becomes a replica row; a copy whose job was cancelled (the
chunk was deleted while it uploaded) becomes a deletion row (deleter.py).

A job whose remote object a deleter claimed (sql._CLAIMED) waits for the claim's end: an
event, never a poll. This node's deleter kicks the queue; with a shared catalog another
node's claim ends with a NOTIFY this queue hears (catalog/deletion_events.py); a claim
whose node died ends with its lease, a deadline.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import trio

from ..catalog.catalog import UploadJob
from ..catalog.deletion_events import Listener
from ..catalog.protocols import MetaCatalog, ReplicaCatalog, UploadQueue, WantCatalog
from ..chunks.bufpool import FramePool
from ..chunks.guard import ChunkGuard
from ..chunks.residency import Residency, no_residency
from ..chunks.room import Room
from ..codec import frame
from ..codec.compress import RemoteCompressor
from ..config.model import UploadConfig
from ..errors import (
    ChunkMissing,
    CorruptChunk,
    PermanentTierError,
    TierError,
)
from ..stats import Stats
from ..tiers.base import Tier
from ..tiers.health import state_of
from ..wakeup import ThreadWakeup, Wakeup
from .commits import CommitStream
from .cpuidle import IdleCores
from .hearing import hear

log = logging.getLogger("ckptfs.upload")

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 60.0
BLOCKED_RETRY_S = 300.0
SNAPSHOT_NAME = "catalog.snapshot"
RATE_WINDOW_S = 2.0
# Under a steady stream of commits the backlog is never empty; the snapshot is then
# retaken this often, so a new node can recover everything uploaded until shortly before.
SNAPSHOT_INTERVAL_S = 10.0
# A change of the catalog that queues no upload (a rename, a symlink, a checkpoint state)
# is snapshotted this long after the first one since the last look: one look per burst.
SNAPSHOT_RECHECK_S = 1.0
# Snapshots nobody waits for are this far apart at least: a stream of small files empties
# the backlog after each one, and a snapshot per file (a full copy of the catalog, of every
# node's with a shared one) would cost more than the files. `ckptfs sync` does not wait.
SNAPSHOT_MIN_SPACING_S = 2.0
# While a save is running, uploads wait, so they do not take the CPU and disk from the save
# (its stall); they start when it has committed, `concurrency` at once. A save longer than
# MAX_DEFER_S (or a stream of back-to-back saves) gets one upload at a time meanwhile, so
# the backlog cannot grow without bound.
MAX_DEFER_S = 30.0
# With "auto", while uploads wait for a save: how often the idle cores are measured (a
# real period: idleness sends no event). The save's end and its age are an event and a
# deadline.
SAVE_RECHECK_S = 0.2


def backoff_s(attempts: int, rnd: Callable[[], float] = random.random) -> float:
    """Exponential backoff with full jitter: uniform in [d/2, d], d = base * 2**attempts."""
    d = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2 ** min(attempts, 30)))
    return d * (0.5 + 0.5 * rnd())


async def _first(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return when the first of these waits returns (the others are cancelled)."""
    async with trio.open_nursery() as n:
        async def one(wait: Callable[[], Awaitable[object]]) -> None:
            await wait()
            n.cancel_scope.cancel()

        for w in waits:
            n.start_soon(one, w)


class UploaderCatalog(UploadQueue, ReplicaCatalog, MetaCatalog, WantCatalog, Protocol):
    """What the upload queue uses: its jobs (UploadQueue) and the replica rows, the
    snapshot's meta, other nodes' wants."""

    shared: bool  # several nodes use the catalog (their wants are heard)


class DeletionQueue(Protocol):
    """What the uploader tells the deleter (upload/deleter.py)."""

    def kick(self) -> None: ...  # rows were queued (a cancelled job's copy)

    def tier_works(self, tier: str) -> None: ...  # postponed deletions there: retry now


@dataclass
class _Records:
    """Finished uploads whose replica rows one transaction writes (Uploader._recorded)."""

    jobs: list[tuple[UploadJob, tuple[float, float] | None]] = field(default_factory=list)
    kept: dict[tuple[bytes, str], bool] | None = None  # written: which jobs were still queued
    error: Exception | None = None  # the transaction failed


class Uploader:
    def __init__(
        self,
        catalog: UploaderCatalog,
        tiers: Sequence[Tier],
        db_limiter: trio.CapacityLimiter,
        config: UploadConfig = UploadConfig(),
        *,
        guard: ChunkGuard,
        stats: Stats,
        room: Room,
        deleter: DeletionQueue | None = None,
        wake: Wakeup | None = None,
        touches: ThreadWakeup | None = None,
        clock: Callable[[], int] = time.time_ns,
        saving: Callable[[], bool] = lambda: False,
        save_over: Callable[[], Awaitable[None]] | None = None,
        idle_cores: Callable[[], float | None] | None = None,
        residency: Residency | None = None,
        commits: CommitStream | None = None,
        held: Listener | None = None,
    ) -> None:
        """``guard``, ``stats`` and ``room`` are the store's (shared, built first: the store
        in turn gets ``copy_uncommitted`` and ``kick``); ``wake``: who wakes this queue;
        ``touches``: set by the catalog's on_touch hook (any thread): the snapshot is due;
        ``config``: concurrency, uploads during a save, compression (config.UploadConfig);
        ``saving``: a save is buffering data; ``save_over``: returns when none does (an
        event); ``commits``: new jobs (commits, heals), whose stream counts as a save too;
        ``residency``: which remote tiers may hold each chunk, and the catalog snapshot;
        ``held``: where other nodes' claims' ends are heard (a shared catalog; this task
        closes it)."""
        self.residency = residency if residency is not None else no_residency()
        self.catalog = catalog
        self.tiers = {t.name: t for t in tiers}
        self.local = {t.name: t for t in tiers if t.kind == "local"}
        self.remotes = sorted((t for t in tiers if t.kind != "local"), key=lambda t: t.name)
        self.guard = guard
        self.stats = stats
        self.room = room
        self.deleter = deleter
        self.db_limiter = db_limiter
        self.concurrency = config.concurrency
        self.clock = clock
        self.limiter = trio.CapacityLimiter(config.concurrency)
        self._wake = wake if wake is not None else Wakeup()
        self._buffering = saving  # a save holds chunk buffers: defer uploads (_limit)
        self._buffers_freed = save_over
        self.commits = commits if commits is not None else CommitStream()
        self._init_run_state()
        self._init_save_state(config, idle_cores)
        self._held = held
        self._touches = touches
        self._init_snapshot_state()
        # lz4 for the remote copy, per chunk, when it pays; also the per-put network rate.
        self.compressor = RemoteCompressor(config.compression)
        # Frames are read from the local tier into these for their upload (one per upload
        # running): no fresh pages per chunk. Let go when the queue is idle (``_pass``).
        self.frames = FramePool(config.concurrency)

    def _init_run_state(self) -> None:
        """The uploads running, their records, the failing tiers."""
        self.running: set[tuple[bytes, str]] = set()
        self.uploaded_bytes = 0
        self._failing: set[str] = set()  # tiers whose last upload failed (log once per streak)
        self._rate_mark: tuple[float, int] | None = None
        # Finished uploads join the open batch of records; the first of a batch to take
        # the lock writes the whole batch (one transaction), the others find it written.
        self._records = _Records()
        self._finish_lock = trio.Lock()
        self._sleeping = False  # between passes, waiting for an event or a deadline

    def _init_save_state(
        self, config: UploadConfig, idle_cores: Callable[[], float | None] | None
    ) -> None:
        """What decides how many uploads run while a save runs, and which go first."""
        self._saving_since: float | None = None
        # While a save runs: "defer" (wait for it), "overlap" (upload at once), "auto"
        # (upload on the cores the save leaves idle, measured by ``idle_cores``, blocking).
        self.during_save = config.during_save
        self.idle_cores = idle_cores if idle_cores is not None else IdleCores().sample
        self._spare = 0  # uploads the idle cores allow during a save (auto), last measured
        self._urgent: dict[bytes, int] = {}  # chunks someone waits for (count of waiters)
        # With a shared catalog: chunks a reader on another node waits for (their wants,
        # catalog/wants.py) that this node uploads, the longest wanted first; looked up
        # again when a notification says a want came (``_want_news``) and while any is left.
        self._wanted: list[bytes] = []
        self._want_news = self.catalog.shared  # wants left by an earlier run: look at once

    def _init_snapshot_state(self) -> None:
        """The catalog snapshot's state: when it was last taken, who waits for one."""
        self._snapshot_wanted = 0  # waiters for a snapshot newer than their uploads
        self._snapshot_at = -math.inf  # trio time of the last snapshot
        self._snapshot_retry_at = -math.inf  # after a failed snapshot: not before then
        self._snapshot_failures = 0
        self._snapshot_skip_logged = False
        self.snapshot_of_ns = self.catalog.snapshot_of_ns() or 0
        self._progress = trio.Event()  # set (and replaced) after each upload and snapshot
        # When a catalog change that queues no upload was first seen since the last look
        # (trio clock; None: none). Set from Catalog.on_touch, any thread, via ``touches``.
        self._dirty_since: float | None = None
        self._dirty = trio.Event()  # set (and replaced) when ``_dirty_since`` is set

    def kick(self) -> None:
        """Something changed (a commit, a finished upload): look at the queue again."""
        self._wake.set()

    def _touched(self) -> None:
        """On the loop: the catalog changed (Catalog.on_touch). The first change since the
        last look sets the snapshot's deadline; the uploader sleeps on until then."""
        if self._dirty_since is None:
            self._dirty_since = trio.current_time()
            self._dirty.set()  # the wait takes the new deadline
            self._dirty = trio.Event()

    def saving(self) -> bool:
        """A save runs: one buffering data, or a stream of commits (commits.py)."""
        return self._buffering() or self.commits.running()

    async def wait_save_over(self) -> None:
        """Until no save runs (``saving``): a restore drill yields to saves (ckptfs/drill)."""
        await self._save_over()

    async def _save_over(self) -> None:
        """Return when no save runs: the buffers freed (an event) and the stream of
        commits quiet (a deadline that each commit moves)."""
        while True:
            if self._buffers_freed is not None:
                await self._buffers_freed()
            await self.commits.wait_quiet()
            if not self.saving():
                return

    def _limit(self) -> int:
        """How many uploads may run now. While a save runs: with "defer" none (one once it
        has run for MAX_DEFER_S); with "auto" one per idle core beyond the first, as last
        measured (at least what "defer" allows); with "overlap" all. Always all when a
        writer or a durability policy waits for uploads."""
        if not self.saving():
            self._saving_since = None
            return self.concurrency
        now = trio.current_time()  # trio's clock: tests drive it with trio.testing.MockClock
        if self._saving_since is None:
            self._saving_since = now
        if self._urgent or self.room.waiting or self.during_save == "overlap":
            return self.concurrency
        deferred = 0 if now - self._saving_since < MAX_DEFER_S else 1
        if self.during_save == "auto":
            return max(deferred, min(self.concurrency, self._spare))
        return deferred

    async def _measure_spare(self) -> None:
        """During a save with "auto": how many uploads the idle cores leave room for."""
        if self.during_save != "auto" or not self.saving():
            return
        idle = await trio.to_thread.run_sync(self.idle_cores)
        # Keep one idle core for the save itself; uploads already running use some of
        # what was measured busy, so they count as placed.
        self._spare = 0 if idle is None else len(self.running) + max(0, int(idle - 1.0))

    async def run(self) -> None:
        if not self.remotes:
            if self._held is not None:  # nothing to upload: nothing held either
                await trio.to_thread.run_sync(self._held.close)
            return
        async with trio.open_nursery() as nursery:
            if self._touches is not None:
                nursery.start_soon(self._hear_touches, self._touches)
            if self.catalog.shared:
                nursery.start_soon(self._hear_wants)
            if self._held is not None:
                # Another node's claim ended: its held jobs may run (a pass finds them).
                nursery.start_soon(hear, self._held, self.kick,
                                   "the ends of other nodes' remote deletions", log)
            while True:
                self._wake.clear()
                self.commits.wake.clear()
                deadline, deferred = await self._pass(nursery)
                await self._sleep(deadline, deferred)

    async def _hear_touches(self, touches: ThreadWakeup) -> None:
        """The catalog changed (its on_touch hook sets ``touches``, in a worker thread)."""
        while True:
            await touches.wait()
            touches.clear()
            self._touched()

    async def _pass(self, nursery: trio.Nursery) -> tuple[float, bool]:
        """Take a snapshot if due, start the uploads allowed now. Returns the trio time of
        the next look that no event announces (inf: none), and whether uploads wait for
        a save (its end is then an event to wait for)."""
        now = trio.current_time()
        deadline = now + await self._maybe_snapshot()
        await self._measure_spare()
        await self._refresh_wanted()
        limit = self._limit()
        free = limit - len(self.running)
        # A chunk a reader on another node is blocked on outranks this node's save: its
        # uploads take every slot, deferral or not (the others keep the limit).
        head_free = (self.concurrency if self._wanted else limit) - len(self.running)
        # No upload of a pair whose frame the deleter is removing right now (it
        # would delete the new copy): it kicks us when done.
        busy = self.running | self.guard.deleting_pairs()
        if head_free > 0:
            jobs = await trio.to_thread.run_sync(
                self._due_jobs, self._head(), self.clock(), head_free, free, set(busy),
                limiter=self.db_limiter,
            )
            refused = [j for j in jobs if not self.residency.permits(j.digest, j.tier)]
            for job in refused:
                # A job made before its chunk was bound (a file of another namespace
                # committed the same bytes first, or a restart with a narrower bound).
                self.residency.refuse("upload", job.tier, job.digest)
                await trio.to_thread.run_sync(
                    self.catalog.drop_upload_jobs, [job.digest], job.tier, limiter=self.db_limiter
                )
            if refused:
                self._progressed()  # a durability wait may have waited for these
            for job in jobs:
                if job in refused or self.guard.deleting(job.digest, job.tier):
                    continue  # marked while we asked the catalog
                self.running.add((job.digest, job.tier))
                nursery.start_soon(self._upload, job)
        if not self.running:
            self.frames.clear()  # the queue is idle: its read buffers go back to the system
        due_ns = await trio.to_thread.run_sync(
            self.catalog.next_upload_due_ns, busy | self.running, self._sources,
            limiter=self.db_limiter,
        )
        # A postponed job's backoff: a deadline. Due now but no slot free: a finishing
        # upload kicks us (it ends in this nursery).
        delay = math.inf if due_ns is None else max(0.0, (due_ns - self.clock()) / 1e9)
        if free <= 0:
            # No slot (or uploads wait for a save): a finishing upload kicks us, and the
            # deferral's end is a deadline of its own (below). Due now here was a busy loop.
            delay = math.inf
        elif delay == 0.0:
            delay = math.inf if self.running else delay
        deadline = min(deadline, now + delay)
        # The limit as computed above: a save that ended since is seen by the sleep.
        deferred = free <= 0 and limit < self.concurrency
        if deferred:
            deadline = min(deadline, self._deferral_ends(now))
        return deadline, deferred

    def _deferral_ends(self, now: float) -> float:
        """Uploads wait for a save: when the limit rises without an event. The save's end
        is an event (``save_over``), a writer waiting for room or a durability wait
        kicks; the save's age is a deadline; idle cores ("auto") are sampled."""
        if self._buffers_freed is None:
            return now + SAVE_RECHECK_S  # nobody tells us when the save ends: look again
        ends = math.inf
        if self._saving_since is not None and now - self._saving_since < MAX_DEFER_S:
            ends = self._saving_since + MAX_DEFER_S
        if self.during_save == "auto":
            ends = min(ends, now + SAVE_RECHECK_S)
        return ends

    async def _sleep(self, deadline: float, deferred: bool) -> None:
        """Until a kick, ``deadline``, the snapshot deadline of a catalog change, new jobs,
        or (when uploads are ``deferred``) the end of the save: then new jobs wait for it."""
        self._sleeping = True
        try:
            await self._sleep_until(deadline, deferred)
        finally:
            self._sleeping = False

    async def _sleep_until(self, deadline: float, deferred: bool) -> None:
        while True:
            at = deadline
            waits: list[Callable[[], Awaitable[object]]] = [self._wake.wait]
            if self._dirty_since is not None:
                at = min(at, self._dirty_since + SNAPSHOT_RECHECK_S)
            else:
                waits.append(self._dirty.wait)  # a first change brings a deadline
            if deferred and not self.saving():
                return  # the save ended since the pass looked: look again
            saving = deferred and self._buffers_freed is not None
            if saving:
                waits.append(self._save_over)
            elif not deferred:
                waits.append(self.commits.wake.wait)
            with trio.move_on_at(at) as timer:
                await _first(*waits)
            if (timer.cancelled_caught or self._wake.is_set() or (saving and not self.saving())
                    or (not deferred and self.commits.wake.is_set())):
                return  # a deadline, a kick, the save's end, or new jobs
            # Only a catalog change: its deadline is part of the next wait.

    def _due_jobs(
        self, head: list[bytes], now: int, head_limit: int, limit: int,
        skip: set[tuple[bytes, str]],
    ) -> list[UploadJob]:
        """Blocking: the jobs to start: of the ``head`` chunks (someone waits for them)
        up to ``head_limit``, then the others oldest first up to ``limit`` in all."""
        jobs = self.catalog.due_uploads_of(head, now, head_limit, skip, self._sources) if head else []
        skip |= {(j.digest, j.tier) for j in jobs}
        rest = limit - len(jobs)
        return jobs + (self.catalog.due_uploads(now, rest, skip, self._sources) if rest > 0 else [])

    def _head(self) -> list[bytes]:
        """The chunks whose uploads go first: this node's waiters' (a durability wait),
        then those other nodes' readers wait for."""
        return list(self._urgent) + [d for d in self._wanted if d not in self._urgent]

    async def _refresh_wanted(self) -> None:
        """With a shared catalog: which chunks other nodes' readers wait for that this node
        uploads. Asked when a want was announced, and while some are left (a finished
        upload drops its chunk from the answer)."""
        if not (self._want_news or self._wanted):
            return
        self._want_news = False
        wanted = await trio.to_thread.run_sync(
            self.catalog.wanted_uploads, self._sources, limiter=self.db_limiter
        )
        new = set(wanted).difference(self._wanted)
        if new:
            log.debug("%d chunk(s) another node waits for go to the head of the upload queue",
                      len(new))
        self._wanted = wanted

    async def _hear_wants(self) -> None:
        """With a shared catalog: listen for other nodes' wants (PostgreSQL NOTIFY on a
        connection of its own) and kick the queue at each (hearing.py: a (re)connection
        counts, since what was announced meanwhile was not heard)."""
        listener = self.catalog.listen_wants()
        if listener is not None:
            await hear(listener, self._want_heard, "other nodes' waits for chunks", log)

    def _want_heard(self) -> None:
        self._want_news = True
        self.kick()

    @property
    def _sources(self) -> list[str] | None:
        """With a shared catalog, the jobs this node can run: chunks its local tiers hold
        (the other nodes upload theirs). One node: every job (a job without a local copy
        is an error to report, not another node's)."""
        return list(self.local) if self.catalog.shared else None

    async def wait_durable(self, digests: set[bytes], timeout_s: float) -> bool:
        """Upload these chunks before others, then wait until they are on the remote tiers
        and a catalog snapshot naming them is stored there (recoverable by a new node).
        False on timeout."""
        if not self.remotes:
            return True
        for d in digests:
            self._urgent[d] = self._urgent.get(d, 0) + 1
        self.kick()
        try:
            with trio.move_on_after(timeout_s):
                while True:
                    progress = self._progress
                    left = await trio.to_thread.run_sync(
                        self.catalog.pending_digests, digests, limiter=self.db_limiter
                    )
                    if left == 0:
                        break
                    await progress.wait()
                uploaded_ns = time.time_ns()
                self._snapshot_wanted += 1
                try:
                    self.kick()
                    while self.snapshot_of_ns < uploaded_ns:
                        progress = self._progress
                        if await trio.to_thread.run_sync(
                            self.catalog.snapshot_is_current, limiter=self.db_limiter
                        ):
                            break  # nothing changed since the last snapshot
                        await progress.wait()
                finally:
                    self._snapshot_wanted -= 1
                return True
            return False
        finally:
            for d in digests:
                n = self._urgent.get(d, 0) - 1
                if n > 0:
                    self._urgent[d] = n
                else:
                    self._urgent.pop(d, None)

    def _progressed(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def _upload(self, job: UploadJob) -> None:
        key = (job.digest, job.tier)
        if self._rate_mark is None:  # the rate's window opens with the first upload
            self._rate_mark = (time.monotonic(), self.uploaded_bytes)
        try:
            await trio.to_thread.run_sync(self._copy, job, limiter=self.limiter)
        except PermanentTierError as exc:
            log.error("upload to tier %s refused: %s; chunks stay local, retry in %.0f s",
                      job.tier, exc, BLOCKED_RETRY_S)
            self.stats.record_upload_failure(job.tier, str(exc), state_of(exc),
                                                   BLOCKED_RETRY_S)
            await self._postpone(job, BLOCKED_RETRY_S, str(exc), blocked=True)
        except (ChunkMissing, CorruptChunk) as exc:
            log.error("chunk %s has no valid local copy to upload: %s", job.digest.hex()[:16], exc)
            await self._postpone(job, BLOCKED_RETRY_S, str(exc), blocked=True)
        except TierError as exc:  # transient: throttling, 5xx, resets, timeouts, outage
            if job.tier not in self._failing:
                log.warning("upload to tier %s failed, will retry with backoff: %s", job.tier, exc)
                self._failing.add(job.tier)
            delay = backoff_s(job.attempts)
            self.stats.record_upload_failure(job.tier, str(exc), state_of(exc), delay)
            await self._postpone(job, delay, str(exc), blocked=False)
        else:
            self.stats.record_upload_ok(job.tier)
            await self._tier_works(job.tier)
            if self.deleter is not None:
                self.deleter.tier_works(job.tier)  # postponed deletions: retry now
            rate = self._rate_due(job.length)
            kept = await self._recorded(job, rate)
            if kept:
                self.uploaded_bytes += job.length
                if rate is not None:
                    self._rate_mark = (rate[0], self.uploaded_bytes)
                self.stats.record_write(job.tier, job.length)
                self.room.freed()  # its local copy may be evicted now
            else:
                if self.deleter is not None:
                    self.deleter.kick()  # the cancelled job's copy: queued for deletion
        finally:
            self.running.discard(key)
            self._progressed()
            self.kick()

    async def copy_uncommitted(
        self, digest: bytes, length: int, sources: Sequence[str], tier: str
    ) -> None:
        """Put a chunk no commit names yet on a remote tier, verified like a queued upload
        and under the same limiter (the local tiers are full: ChunkStore._spill). Raises
        TierError; there is no job to retry, the writer looks again."""
        job = UploadJob(digest, tier, length, 0, 0, tuple(sources))
        await trio.to_thread.run_sync(self._copy, job, limiter=self.limiter)
        self.uploaded_bytes += length
        self.stats.record_write(tier, length)

    async def _maybe_snapshot(self) -> float:
        """When the catalog changed since the last snapshot and nothing is pending (or
        someone waits for one, or the last is SNAPSHOT_INTERVAL_S old), put a verified copy
        of the catalog on every remote tier: what a fresh node restores. Returns seconds
        until the next look is due (a failed snapshot's retry, the next interval)."""
        now = trio.current_time()
        self._dirty_since = None  # this look (or the retry after a failure) covers them
        if now < self._snapshot_retry_at:  # a failed snapshot waits out its backoff
            return self._snapshot_retry_at - now
        targets = self._snapshot_targets()
        if not targets:
            return math.inf  # residency: no remote may hold the catalog
        overdue = now - self._snapshot_at >= SNAPSHOT_INTERVAL_S
        wanted = self._snapshot_wanted > 0
        if not wanted and now - self._snapshot_at < SNAPSHOT_MIN_SPACING_S:
            return SNAPSHOT_MIN_SPACING_S - (now - self._snapshot_at)

        def backup() -> tuple[int, bytes] | bool:
            if self.catalog.snapshot_is_current():
                return False
            if not (wanted or overdue) and self.catalog.backlog().chunks:
                return True
            return time.time_ns(), self.catalog.backup_bytes()

        taken = await trio.to_thread.run_sync(backup, limiter=self.db_limiter)
        if taken is False:
            return math.inf  # nothing to take: the next catalog change or kick says when
        if taken is True:
            # Uploads pending: each finished one kicks us, and the snapshot is taken when
            # they are done, or at SNAPSHOT_INTERVAL_S under a stream of commits.
            return max(SNAPSHOT_RECHECK_S, SNAPSHOT_INTERVAL_S - (now - self._snapshot_at))
        assert not isinstance(taken, bool)
        return await self._store_snapshot(targets, *taken)

    async def _store_snapshot(self, targets: list[Tier], of_ns: int, data: bytes) -> float:
        """Put a framed copy of ``data`` (the catalog as of ``of_ns``) on ``targets``;
        record it, or back off after a failure. Returns seconds until the next look."""

        def framed_copy() -> bytes:  # hashing a large catalog takes a while: not on the loop
            digest = frame.digest_of(data)
            return b"".join(bytes(p) for p in frame.encode([data], digest))

        framed = await trio.to_thread.run_sync(framed_copy, limiter=self.limiter)
        try:
            for remote in targets:
                await trio.to_thread.run_sync(
                    remote.put_meta, SNAPSHOT_NAME, framed, limiter=self.limiter  # type: ignore[attr-defined]
                )
        except TierError as exc:
            self._snapshot_failures += 1
            delay = backoff_s(self._snapshot_failures)
            log.warning("catalog snapshot upload failed (retry in %.1f s): %s", delay, exc)
            self._snapshot_retry_at = trio.current_time() + delay
            return delay
        self._snapshot_failures = 0
        self._snapshot_at = trio.current_time()
        for remote in targets:
            await self._tier_works(remote.name)
            if self.deleter is not None:
                self.deleter.tier_works(remote.name)  # postponed deletions: retry now
        await trio.to_thread.run_sync(
            self.catalog.set_meta, "snapshot_of_ns", str(of_ns), limiter=self.db_limiter
        )
        self.snapshot_of_ns = of_ns
        self._progressed()
        log.info("catalog snapshot (%d bytes) stored on %d remote tier(s)",
                 len(data), len(targets))
        return math.inf

    def _snapshot_targets(self) -> list[Tier]:
        """The remotes a snapshot goes to: the catalog holds every namespace's metadata,
        so only those every residency-bound namespace allows (logged once if none)."""
        if not self.residency.enabled:
            return self.remotes
        names = set(self.residency.snapshot_targets([t.name for t in self.remotes]))
        targets = [t for t in self.remotes if t.name in names]
        skipped = [t.name for t in self.remotes if t.name not in names]
        if skipped and not self._snapshot_skip_logged:
            self._snapshot_skip_logged = True
            # Expected where another remote takes them (INFO); a warning when none does.
            log.log(logging.INFO if targets else logging.WARNING,
                    "residency: catalog snapshots are not stored on remote tier(s) %s "
                    "(a namespace's allowed_locations excludes them)%s", ", ".join(skipped),
                    "; no remote tier receives snapshots: a new node cannot restore "
                    "this catalog from the bucket" if not targets else "")
        self.residency.snapshot_tiers = [t.name for t in targets]
        return targets

    async def tier_writable(self, tier: str) -> None:
        """The writer lease of ``tier`` is held again (its fence lifted, upload/lease.py):
        the uploads postponed while it was fenced are due now, not at their backoff."""
        self._failing.add(tier)
        await self._tier_works(tier)

    async def _tier_works(self, tier: str) -> None:
        """A put on ``tier`` succeeded: if its uploads were failing, the ones postponed by
        backoff are due now (an event, not their backoff timers)."""
        if tier not in self._failing:
            return
        log.info("uploads to tier %s work again", tier)
        self._failing.discard(tier)
        await trio.to_thread.run_sync(self.catalog.retry_uploads_now, tier, limiter=self.db_limiter)
        self.kick()

    def _rate_due(self, length: int) -> tuple[float, float] | None:
        """(now, bytes/s) if this upload closes a rate window of RATE_WINDOW_S, else None."""
        now = time.monotonic()
        if self._rate_mark is None:
            return None
        t0, b0 = self._rate_mark
        if now - t0 < RATE_WINDOW_S or now <= t0:
            return None
        return now, (self.uploaded_bytes + length - b0) / (now - t0)

    async def _recorded(self, job: UploadJob, rate: tuple[float, float] | None) -> bool:
        """Record the remote copy of ``job`` in the catalog; False if its job was
        cancelled meanwhile (the copy is queued for deletion). Uploads that finish while
        another one's record is being written are recorded together, in one transaction,
        by the next to take the lock (small chunks finish many at a time). A failed
        transaction fails every upload of it, as each one's own would have."""
        batch = self._records
        batch.jobs.append((job, rate))
        async with self._finish_lock:
            if batch.kept is None and batch.error is None:  # nobody wrote it yet
                self._records = _Records()  # uploads finishing from now on: the next one
                try:
                    batch.kept = await trio.to_thread.run_sync(
                        self._finish, batch.jobs, limiter=self.db_limiter)
                except Exception as exc:
                    batch.error = exc
        if batch.error is not None:
            raise batch.error
        assert batch.kept is not None
        return batch.kept[(job.digest, job.tier)]

    def _finish(self, todo: list[tuple[UploadJob, tuple[float, float] | None]],
                ) -> dict[tuple[bytes, str], bool]:
        """Blocking: record the remote copies (one transaction) and the upload rate
        `ckptfs status` shows (rate and ETA), so a backlog that shrank has its rate."""
        kept = self.catalog.finish_uploads([(j.digest, j.tier) for j, _ in todo],
                                           {(j.digest, j.tier): j.enqueued_ns for j, _ in todo})
        rates = [r for (j, r) in todo if r is not None and kept[(j.digest, j.tier)]]
        if rates:
            self.catalog.set_meta("upload_rate", f"{rates[-1][1]:.0f} {time.time_ns()}")
        return kept

    async def _postpone(self, job: UploadJob, delay_s: float, error: str, blocked: bool) -> None:
        await trio.to_thread.run_sync(
            self.catalog.postpone_upload, job.digest, job.tier,
            self.clock() + int(delay_s * 1e9), error[:500], blocked, limiter=self.db_limiter,
        )

    def _copy(self, job: UploadJob) -> None:
        """Blocking: read a verified local copy and put it on the remote tier."""
        remote = self.tiers.get(job.tier)
        if remote is None:
            raise PermanentTierError(f"tier {job.tier} is not configured")
        sources = [t for name in job.sources if (t := self.local.get(name)) is not None]
        copy_frame(job.digest, sources, remote, self.compressor, self.frames,
                   permitted=lambda name: self.residency.permits(job.digest, name))


def copy_frame(
    digest: bytes,
    sources: Sequence[Tier],
    remote: Tier,
    compressor: RemoteCompressor,
    frames: FramePool,
    permitted: Callable[[str], bool] = lambda name: True,
) -> None:
    """Blocking: put chunk ``digest`` on ``remote`` from the first of the local ``sources``
    holding a valid copy (and ``permitted`` to serve it: residency). The frame is read into
    a buffer of ``frames``, blake3-checked, maybe sent as lz4 (``compressor``), with the
    SHA-256 the server checks the body against. ChunkMissing if no source has it."""
    key = digest.hex()
    problems = []
    for tier in sources:
        name = tier.name
        if not permitted(name):
            problems.append(f"{name}: outside the chunk's allowed locations")
            continue  # as reads: a copy out of residency is no source
        # Into a reused buffer where the tier can (no fresh pages per chunk).
        get_into = getattr(tier, "get_into", None)
        raw = tier.get(key) if get_into is None else get_into(key, frames.take)
        if raw is None:
            problems.append(f"{name}: missing")
            continue
        try:
            try:
                frame.verify(raw, digest)  # never upload bytes we cannot vouch for
            except CorruptChunk as exc:
                problems.append(f"{name}: {exc}")
                continue
            # The raw frame, or a verified LZ4 frame of it when that pays
            # (codec/compress.py).
            body, choice = compressor.frame_for(raw, digest)
            # The server checks what arrives against the checksum of the bytes we send.
            sha = base64.b64encode(hashlib.sha256(body).digest()).decode()
            started = time.monotonic()
            remote.put(key, [body], expected_sha256=sha)
            compressor.sent(choice, time.monotonic() - started)
            return
        finally:
            if isinstance(raw, memoryview):
                frames.give(raw.obj)  # reused once no view of it is left
    raise ChunkMissing("; ".join(problems) or "no local replica recorded")
