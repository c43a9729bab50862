"""Applies retention in the daemon, in the background, with the safety rules.

After each checkpoint commit, the janitor plans retention per run (retention.py) and
carries it out; `ckptfs gc PATH` (the ``user.ckptfs.gc`` xattr) does the same for the
checkpoints under PATH only (each run is still planned whole, so what stays protected does):

* **skip_upload**: drop pending uploads of chunks only superseded checkpoints name;
* **evict_local**: drop local copies of chunks a remote holds and no upload needs, except
  chunks a checkpoint kept local also names (never evict data not yet uploaded);
* **expire**: delete the checkpoint's files and directories (their chunks go from every
  tier through the deletion queue, upload/deleter.py), unless a file under it is open
  (never delete a checkpoint being read); then, once the queue has no row left for its
  chunks, check on every tier (outside every lock) that they are gone, queueing again what
  is still there, before calling it deleted. A chunk another file references again (same
  content) is kept.

Every few seconds it also keeps the local tiers under a high watermark by evicting the
oldest chunks a remote already holds.

With a shared catalog every node runs a janitor, but a retention pass (and the retry of
leftovers) runs on one node at a time: it holds the catalog's cluster-wide lock
``RETENTION_LOCK`` (``catalog.try_exclusive``). A node that finds it taken runs its pass
LOCK_RETRY_S later (whoever asked for it, `ckptfs gc`, keeps waiting); a pass that loses
the lock (the database restarted) stops before its next expiry. The watermark eviction
runs on every node: it touches only this node's local tiers.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import trio

from ..catalog import CheckpointState
from ..catalog.audit import AuditRecord
from ..catalog.protocols import (
    CheckpointCatalog,
    ContentsCatalog,
    DeletionQueue,
    ExclusiveLock,
    NamespaceCatalog,
    ReplicaCatalog,
    SessionCatalog,
    UploadQueue,
    WantCatalog,
)
from ..errors import CatalogUnavailable, CkptfsError
from ..tiers.base import Tier
from .retention import Plan, RetentionPolicy, plan_all, to_ckpts, under

log = logging.getLogger("ckptfs.retention")

T = TypeVar("T")

WATERMARK_CHECK_S = 5.0
LEFTOVER_RETRY_S = 30.0  # expired checkpoints not yet verified gone are looked at this often
SETTLE_S = 10.0  # how long a pass waits for the deletion queue to try a checkpoint's chunks
RETENTION_LOCK = "retention"  # the cluster-wide lock of retention passes (one node at a time)
LOCK_RETRY_S = 1.0  # a pass another node's janitor held off runs again this soon


@dataclass
class JanitorReport:
    skipped_upload_jobs: int = 0
    evicted_bytes: int = 0
    expired: int = 0
    deleted: int = 0
    busy: int = 0  # expiries postponed: a file under the checkpoint is open



class GcRequests:
    """Requests for retention passes, and their completion: the tracker asks after each
    checkpoint commit (``kick``), `ckptfs gc PATH` through the filesystem (``run_now``); the
    Janitor serves them. Built before all three (mount.py), so none is wired to another."""

    def __init__(self, retry_deletions: Callable[[], Awaitable[None]] | None = None) -> None:
        self._retry_deletions = retry_deletions  # postponed deletions: due now (gc)
        self._wake = trio.Event()
        self._everything = False  # a commit asked for a pass over every run
        self._scopes: set[str] = set()  # subtrees `ckptfs gc PATH` asked for
        self._done = trio.Event()  # set (and replaced) after each retention pass
        self._postponed = False  # a pass waits for another node's to end
        self.started = self.finished = 0  # janitor loop iterations begun and ended
        self.last = JanitorReport()

    def kick(self) -> None:
        self._everything = True
        self._wake.set()

    async def request(self, scope: str = "/") -> int:
        """Ask for a pass over the checkpoints under ``scope``; postponed deletions are
        tried again at once. Returns the ticket to ``wait`` for: the pass that starts
        next, after this call. Returns without waiting for any pass (`ckptfs gc PATH`
        asks with a setxattr, during which the kernel holds PATH's inode locked)."""
        ticket = self.started + 1
        # The scope and the wake-up go in before any await, so the pass this call waits for
        # (the next one to start) covers the scope, and no second pass is asked for.
        self._scopes.add(scope)
        self._wake.set()
        if self._retry_deletions is not None:
            await self._retry_deletions()
        return ticket

    def served_ticket(self, ticket: int) -> bool:
        return self.finished >= ticket

    async def wait(self, ticket: int) -> JanitorReport:
        """Wait until the pass of ``ticket`` (from ``request``) has ended; its report."""
        while self.finished < ticket:
            await self._done.wait()
        return self.last

    async def run_now(self, scope: str = "/") -> JanitorReport:
        """Ask for a pass over the checkpoints under ``scope`` and wait for one that started
        after this call."""
        return await self.wait(await self.request(scope))

    async def next(self, timeout_s: float) -> tuple[bool, set[str] | None]:
        """The janitor waits for a request (at most ``timeout_s``) and takes it: whether
        one came, and its scopes (None: every run)."""
        if self._postponed:
            timeout_s = min(timeout_s, LOCK_RETRY_S)
        with trio.move_on_after(timeout_s):
            await self._wake.wait()
        woken = self._wake.is_set() or self._postponed
        self._wake = trio.Event()
        self._postponed = False
        scopes = None if self._everything else self._scopes
        self._everything, self._scopes = False, set()
        self.started += 1
        return woken, scopes

    def postpone(self, scopes: set[str] | None) -> None:
        """The pass just taken cannot run now (another node's janitor holds the retention
        lock): ask for it again LOCK_RETRY_S from now; whoever waits for it keeps waiting."""
        if scopes is None:
            self._everything = True
        else:
            self._scopes |= scopes
        self._postponed = True

    def served(self) -> None:
        self.finished = self.started
        done, self._done = self._done, trio.Event()
        done.set()


class JanitorStore(Protocol):
    """What the janitor needs of the chunk store (chunks/store.py)."""

    remotes: list[Tier]
    tiers: dict[str, Tier]

    def local_fill(self) -> tuple[int, int]: ...

    async def evict(self, want: int) -> int: ...

    def evict_digests(self, digests: Iterable[bytes]) -> int: ...

    def deletions_queued(self) -> None: ...


class JanitorDeleter(Protocol):
    """What the janitor needs of the deletion queue (upload/deleter.py)."""

    remote_limiter: trio.CapacityLimiter

    async def settle(self, digests: Iterable[bytes], timeout_s: float) -> None: ...


class JanitorCatalog(
    CheckpointCatalog, ContentsCatalog, NamespaceCatalog, DeletionQueue, ReplicaCatalog,
    UploadQueue, SessionCatalog, WantCatalog, Protocol,
):
    """What retention reads and changes: the checkpoint rows, the chunks under them, the
    deletion queue, upload jobs to skip (ReplicaCatalog), every node's open inodes and
    the cluster-wide lock of a pass (WantCatalog.try_exclusive)."""

    shared: bool  # several nodes use the catalog


class Janitor:
    def __init__(
        self, catalog: JanitorCatalog, db_limiter: trio.CapacityLimiter, store: JanitorStore,
        deleter: JanitorDeleter, requests: GcRequests,
        remove_tree: Callable[[str], Awaitable[None]], open_inos: Callable[[], list[int]],
        policies: tuple[RetentionPolicy, ...],
        high_watermark: float = 0.9, low_watermark: float = 0.8,
    ) -> None:
        """``remove_tree`` deletes a checkpoint as unlink and rmdir would (the VFS's);
        ``open_inos``: the inodes open now (never expire a checkpoint being read); with a
        shared catalog, also those any node's session holds open (catalog.open_inodes)."""
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.store = store
        self.deleter = deleter
        self.requests = requests
        self.remove_tree = remove_tree
        self.open_inos = open_inos
        self.policies = policies
        self.high = high_watermark
        self.low = low_watermark
        self.passes = 0
        self.postponed = 0  # passes held off by another node's janitor
        self._leftovers_at = time.monotonic()
        self._lock: ExclusiveLock | None = None  # the retention lock, during a pass

    @property
    def last(self) -> JanitorReport:
        return self.requests.last

    def kick(self) -> None:
        self.requests.kick()

    async def run_now(self, scope: str = "/") -> JanitorReport:
        return await self.requests.run_now(scope)

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.db_limiter)

    async def run(self) -> None:
        while True:
            # A request is an event; WATERMARK_CHECK_S is a real period: space used
            # outside ckptfs sends none.
            woken, scopes = await self.requests.next(WATERMARK_CHECK_S)
            if woken and self.policies:
                try:
                    async with self._exclusive() as granted:
                        if granted:
                            self.requests.last = await self.retention_pass(scopes)
                            await self.retry_leftovers()
                except CkptfsError as exc:
                    granted = True
                    log.error("retention pass failed: %s", exc)
                if not granted:  # another node's janitor is in a pass: ours comes after it
                    self.postponed += 1
                    self.requests.postpone(scopes)
                    await self._watermark()
                    continue
                self.passes += 1
            elif time.monotonic() - self._leftovers_at > LEFTOVER_RETRY_S:
                self._leftovers_at = time.monotonic()
                try:
                    async with self._exclusive() as granted:
                        if granted:  # else another node's pass looks at them
                            await self.retry_leftovers()
                except CkptfsError as exc:
                    log.warning("retrying deletions failed: %s", exc)
            self.requests.served()
            await self._watermark()

    @asynccontextmanager
    async def _exclusive(self) -> AsyncIterator[bool]:
        """Hold the retention lock (one node's janitor at a time) for the body; False: it
        is held elsewhere, the body must not act."""
        lock = await self.db(self.catalog.try_exclusive, RETENTION_LOCK)
        if lock is None:
            yield False
            return
        self._lock = lock
        try:
            yield True
        finally:
            self._lock = None
            lock.release()  # no round trip (the connection closes): also at cancellation

    async def _still_exclusive(self) -> None:
        """Before an expiry: the pass still holds the retention lock (a database restart
        ends it, and another node's janitor may have begun a pass of its own)."""
        if self._lock is not None and not await self.db(self._lock.held):
            raise CatalogUnavailable("the retention lock was lost (the catalog's connection "
                                     "ended): the pass stops; the next one goes on")

    async def _watermark(self) -> None:
        store = self.store
        if not store.remotes:
            return
        used, total = await trio.to_thread.run_sync(store.local_fill)
        if total <= 0 or used / total <= self.high:
            return
        want = int(used - self.low * total)
        freed = await store.evict(want)
        log.info("local tiers at %.0f%% (high watermark %.0f%%): evicted %d bytes held by a "
                 "remote tier", 100 * used / total, 100 * self.high, freed)

    async def retention_pass(self, scopes: set[str] | None = None) -> JanitorReport:
        """Plan every run; act on the checkpoints under one of ``scopes`` (None: all)."""
        rows = await self.db(self.catalog.checkpoint_rows, "/")
        plans = plan_all(to_ckpts(rows), self.policies, time.time_ns())
        report = JanitorReport()
        for run, plan in plans.items():
            await self._apply(run, plan, report, scopes)
        if report.expired or report.evicted_bytes or report.skipped_upload_jobs:
            log.info("retention: %d upload job(s) skipped, %d bytes evicted from local tiers, "
                     "%d checkpoint(s) expired, %d deleted, %d postponed (open)",
                     report.skipped_upload_jobs, report.evicted_bytes, report.expired,
                     report.deleted, report.busy)
        return report

    async def _apply(
        self, run: str, plan: Plan, report: JanitorReport, scopes: set[str] | None = None
    ) -> None:
        """Carry out ``plan``; with ``scopes``, act only on checkpoints under one of them
        (the run is planned whole: what it keeps still protects their shared chunks)."""
        def acts(root: str) -> bool:
            return scopes is None or any(under(root, s) for s in scopes)

        kept_local = await self.db(self.catalog.digests_under, plan.keep_local)
        skipping = [r for r in plan.skip_upload if acts(r)]
        if skipping:
            skip = await self.db(self.catalog.digests_under, skipping)
            living = [r for r in plan.keep_local + plan.evict_local if r not in skipping]
            needed = await self.db(self.catalog.digests_under, living)
            drop = [d for d in skip if d not in needed]
            if drop:
                report.skipped_upload_jobs += await self.db(self.catalog.drop_upload_jobs, drop)
        evicting = [r for r in plan.evict_local if acts(r)]
        if evicting and self.store.remotes:
            victims = await self.db(self.catalog.digests_under, evicting)
            report.evicted_bytes += await self.db(
                self.store.evict_digests, [d for d in victims if d not in kept_local]
            )
            self.store.deletions_queued()
        for root in plan.expire:
            if acts(root):
                await self._expire(root, plan.why.get(root, ""), report)

    async def _expire(self, root: str, why: str, report: JanitorReport) -> None:
        await self._still_exclusive()
        if await self._open_under(root):
            report.busy += 1
            return
        digests = await self.db(self.catalog.digests_under, [root])
        await self.db(functools.partial(self.catalog.checkpoint_set_state,
                                        audit=AuditRecord("expire")),
                      root, CheckpointState.EXPIRED, why)
        report.expired += 1
        log.info("checkpoint %s expired (%s): deleting it", root, why)
        # Remembered before the files go: the chunks to verify gone (or delete again).
        await self.db(self.catalog.checkpoint_leftover, root, list(digests))
        try:
            await self.remove_tree(root)
        except CkptfsError as exc:
            log.warning("could not delete expired checkpoint %s: %s", root, exc)
            return
        if await self._finish(root, list(digests)):
            report.deleted += 1

    async def _finish(self, root: str, digests: list[bytes]) -> bool:
        """Verify that no tier holds the chunks of an expired checkpoint; then it is
        *deleted*. The deletion queue does the deleting: this waits a little for it, then
        looks (``tier.has``, outside every lock and limiter the file system needs) and
        queues again whatever is still there. False: not yet, look again later."""
        await self.deleter.settle(digests, SETTLE_S)
        referenced = await self.db(self.catalog.referenced_digests)
        candidates = [d for d in digests if d not in referenced]  # shared ones are kept
        queued = await self.db(self.catalog.deletions_pending, candidates)
        present, unknown = await trio.to_thread.run_sync(
            self._still_there, [d for d in candidates if d not in queued],
            limiter=self.deleter.remote_limiter,
        )
        if present:
            await self.db(self.catalog.queue_deletions, present)
            self.store.deletions_queued()
        left = sorted(queued | {d for d, _ in present} | unknown)
        await self.db(self.catalog.checkpoint_leftover, root, left)
        if left:
            log.info("checkpoint %s: %d chunk(s) not yet verified gone from every tier "
                     "(queued for deletion, or held by a file being written); looking again "
                     "later", root, len(left))
            return False
        await self.db(functools.partial(self.catalog.checkpoint_set_state,
                                        audit=AuditRecord("checkpoint_deleted")),
                      root, CheckpointState.DELETED, None)
        log.info("checkpoint %s deleted: verified gone from every tier", root)
        return True

    def _still_there(self, digests: list[bytes]) -> tuple[list[tuple[bytes, str]], set[bytes]]:
        """Blocking (no lock, no catalog): the (chunk, tier) pairs still holding a frame, and
        the chunks a tier could not answer for."""
        present: list[tuple[bytes, str]] = []
        unknown: set[bytes] = set()
        failed: dict[str, str] = {}  # tiers that could not answer: not asked again now
        for d in digests:
            for tier in self.store.tiers.values():
                if tier.name in failed:
                    unknown.add(d)
                    continue
                try:
                    if tier.has(d.hex()):
                        present.append((d, tier.name))
                except CkptfsError as exc:
                    failed[tier.name] = str(exc)
                    unknown.add(d)
        for name, err in failed.items():
            log.warning("tier %s cannot say whether expired chunks are gone: %s", name, err)
        return present, unknown

    async def retry_leftovers(self) -> None:
        for root, digests in (await self.db(self.catalog.expired_leftovers)).items():
            await self._finish(root, digests)

    async def _open_under(self, root: str) -> bool:
        held = set(self.open_inos())
        if self.catalog.shared:  # and what every node's session holds open
            held |= await self.db(self.catalog.open_inodes)
        inos = sorted(held)
        for ino in inos:
            path = await self.db(self.catalog.path_of, ino)
            if path == root or path.startswith(root.rstrip("/") + "/"):
                return True
        return False
