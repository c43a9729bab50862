"""The scrubber service: passes over the copies this node scrubs, oldest check first.

* **Which copies**: this node's local tiers, and the remotes while it holds the remote's
  lease (a shared catalog: one node at a time, a ``meta`` row with an expiry renewed as it
  goes, catalog/checks.py; one node: always).
* **When**: in the background, a copy is due once ``[scrub] interval`` has passed since
  its last check (its write counts as one); ``request`` asks for a pass now (``ckptfs
  scrub``: every copy last checked before the pass began), ``wait`` returns its report.
  Between rounds it sleeps until the oldest check comes due or a pass is asked for (a
  deadline and an event, no polling).
* **How fast**: at most ``rate`` bytes/s (a deadline after each copy: the bucket of one
  chunk); while a save's chunks are in memory it waits for them to drain (an event:
  ``save_over``), with ``pause_while_writing``.
* **A bad copy** (missing, corrupt, an unreadable object) is recorded bad and healed from
  a valid copy by the reader's heal (chunks/reader.py ``heal_copies``): a local copy
  written again, a remote one uploaded again by the uploader.

Reads run in worker threads: local tiers under the store's background limiter (heals and
copy-backs), remotes under the remote-read limiter behind every reader's GET.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import trio

from ..catalog import ChunkRef
from ..catalog.checks import ReplicaCheck, ReplicaChecks
from ..catalog.protocols import ReplicaCatalog
from ..chunks.priority import Ticket
from ..chunks.store import ChunkStore
from ..config.model import ScrubConfig
from ..errors import CatalogUnavailable, CkptfsError
from .progress import DISABLED, IDLE, PAUSED, SCRUBBING, PassReport, Progress
from .verify import DAMAGE, ERROR, check_copy

log = logging.getLogger("ckptfs.scrub")

BATCH = 64  # copies asked of the catalog at once
LEASE_TTL_S = 60.0  # the remote's lease, renewed every third of it while scrubbing
RETRY_S = 60.0  # a round that skipped a failing tier, or a lease another node holds
# The catalog's side of the progress (a scan of every replica row) at most this often
# while scrubbing; SQLite has one connection, which requests wait for meanwhile.
PROGRESS_EVERY_S = 30.0


class ScrubCatalog(ReplicaChecks, ReplicaCatalog, Protocol):
    """What the scrubber reads and records: copies due, their checks, the lease, and where
    a chunk's valid and bad copies are."""


class Scrubber:
    def __init__(
        self, catalog: ScrubCatalog, db_limiter: trio.CapacityLimiter, store: ChunkStore,
        cfg: ScrubConfig, *, node: str, shared: bool,
        saving: Callable[[], bool], save_over: Callable[[], Awaitable[None]],
    ) -> None:
        """``node``: this node's name (the lease's holder); ``shared``: a shared catalog
        (the remote's scrub is leased); ``saving``/``save_over``: a save's chunks are in
        memory / wait until they are not."""
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.store = store
        self.cfg = cfg
        self.node = node
        self.shared = shared
        self._saving, self._save_over = saving, save_over
        self.local = sorted(store.tier_set.local)
        self.remotes = [t.name for t in store.remotes]
        self.progress = Progress(cfg.rate)
        self.progress.state = IDLE if cfg.enabled else DISABLED
        self._wake = trio.Event()
        self._asked = 0  # the last pass asked for (a ticket)
        self._served = 0  # the last pass done
        self._reports: dict[int, PassReport] = {}
        self._served_event = trio.Event()
        self._lease_at = -math.inf  # trio time of the last renewal
        self._next_at = 0.0  # the pace's deadline (trio time)
        self._refreshed = -math.inf  # trio time of the last _refresh

    # -- requests (``ckptfs scrub``: vfs/control.py) --------------------------------------

    def request(self) -> int:
        """Ask for a pass now; its ticket (``wait`` returns its report)."""
        self._asked += 1
        self._wake.set()
        return self._asked

    def served_ticket(self, ticket: int) -> bool:
        return ticket <= self._served

    async def wait(self, ticket: int) -> dict[str, Any]:
        """The report of the pass that served ``ticket`` (waits for it)."""
        while self._served < ticket:
            await self._served_event.wait()
        report = self._reports.get(ticket) or self._reports[max(self._reports)]
        return report.as_dict()

    def snapshot(self) -> dict[str, Any]:
        """For the telemetry (status, /metrics): replaced whole, read without a lock."""
        return self.progress.snapshot

    # -- the service ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._loop()
        finally:
            if self.shared and self.progress.lease_holder == self.node:
                with trio.move_on_after(5) as scope:
                    scope.shield = True
                    await self._release_lease()

    async def _loop(self) -> None:
        await self._refresh()
        while True:
            if self._asked > self._served:
                ticket = self._asked
                report = await self._pass(time.time_ns(), requested=True)
                self._reports = {ticket: report}
                self._served = ticket
                self._served_event.set()
                self._served_event = trio.Event()
                continue
            retry = False
            if self.cfg.enabled:
                due_before = time.time_ns() - int(self.cfg.interval_s * 1e9)
                report = await self._pass(due_before, requested=False)
                retry = bool(report.skipped_tiers) or (
                    bool(self.remotes) and report.remote != self.node)
            if self._asked > self._served:
                continue
            await self._idle(retry)

    async def _idle(self, retry: bool) -> None:
        """Sleep until the oldest check comes due (or RETRY_S: a failing tier, another
        node's lease), or until a pass is asked for."""
        self.progress.state = IDLE if self.cfg.enabled else DISABLED
        self.progress.current = None
        if trio.current_time() - self._refreshed >= PROGRESS_EVERY_S:
            await self._refresh()
        else:
            self.progress.publish()
        deadline = math.inf
        if self.cfg.enabled:
            # No copy yet: a copy written from now on comes due an interval after its write.
            due_s = self.cfg.interval_s
            oldest = await self._db(self.catalog.next_check_due_ns, self._tiers())
            if oldest is not None:
                due_s = (oldest / 1e9 + self.cfg.interval_s) - time.time()
            deadline = trio.current_time() + max(1.0, due_s)
            if retry:
                # The copies due are those of a failing tier or of the remote another node
                # scrubs: come back in RETRY_S, not each second (a loop of failures, and of
                # WARNINGs, while the bucket is down).
                deadline = trio.current_time() + RETRY_S
        self._wake = trio.Event()
        with trio.move_on_at(deadline):
            await self._wake.wait()

    async def _pass(self, before_ns: int, *, requested: bool) -> PassReport:
        """Check every copy on this node's tiers last checked before ``before_ns``, oldest
        first; a background pass gives way to a pass asked for."""
        report = PassReport(started=time.time())
        self.progress.current = report
        failing: set[str] = set()
        checked: set[str] = set()
        complete = True
        while True:
            if not requested and self._asked > self._served:
                complete = False
                break  # a pass was asked for: it covers this one
            tiers = [t for t in self._tiers() if t not in failing]
            report.remote = await self._remote_state()
            if report.remote != self.node:
                tiers = [t for t in tiers if t not in self.remotes]
            rows = await self._db(self.catalog.replicas_to_check, tiers, before_ns, BATCH)
            if not rows:
                break
            await self._batch(rows, failing, checked)
        report.remote_here = report.remote == self.node
        report.tiers = sorted(set(self._tiers()) - failing
                              - (set(self.remotes) if report.remote != self.node else set()))
        report.skipped_tiers = sorted(failing)
        report.finished = time.time()
        if complete and (requested or checked):
            done = [t for t in report.tiers if requested or t in checked]
            await self._db(self.catalog.record_scrub_pass, done, time.time_ns())
        self.progress.last = report
        if requested or report.copies:
            await self._refresh()
        if requested or report.copies:
            log.info("scrub: pass done: %d cop%s (%d bytes) checked, %d bad, %d healed%s",
                     report.copies, "y" if report.copies == 1 else "ies", report.bytes,
                     report.bad, report.healed,
                     f"; skipped (failing): {', '.join(failing)}" if failing else "")
        return report

    async def _batch(self, rows: Sequence[ReplicaCheck], failing: set[str],
                     checked: set[str]) -> None:
        """Check these copies one by one, at the pace; record their checks together."""
        done: list[tuple[bytes, str]] = []
        for row in rows:
            if row.tier in failing:
                continue
            if row.tier in self.remotes and self.shared and not await self._renew_lease():
                continue  # another node scrubs the remote now
            await self._pause_for_saves()
            self.progress.state = SCRUBBING
            verdict, why = await self._check(row)
            if verdict == ERROR:
                failing.add(row.tier)
                # INFO: the remote's health already says so (one WARNING per outage)
                log.info("scrub: tier %s failed (%s); skipped until the next pass",
                         row.tier, why)
                continue
            self.progress.checked(row.tier, row.length)
            checked.add(row.tier)
            if verdict in DAMAGE:
                await self._damaged(row, verdict, why)
            done.append((row.digest, row.tier))
            await self._pace(row.length)
        await self._db(self.catalog.record_checked, done, time.time_ns())
        if trio.current_time() - self._refreshed >= PROGRESS_EVERY_S:
            await self._refresh()
        else:
            self.progress.publish()

    async def _check(self, row: ReplicaCheck) -> tuple[str, str]:
        tier = self.store.tiers.get(row.tier)
        if tier is None:
            return ERROR, "tier not configured"
        limits = self.store.limiters
        limiter: Any = limits.bg if row.tier in self.local else limits.remote_io.slot(
            Ticket(False))  # behind every reader's GET
        return await trio.to_thread.run_sync(check_copy, tier, row, limiter=limiter)

    async def _damaged(self, row: ReplicaCheck, verdict: str, why: str) -> None:
        """A bad copy: healed from a valid one, or recorded bad when none is left."""
        valid = await self._db(self.catalog.replica_tiers, row.digest)
        bad = await self._db(self.catalog.bad_replica_tiers, row.digest)
        if row.tier not in valid and row.tier not in bad:
            return  # evicted or deleted since it was listed: gone, not damaged
        log.warning("scrub: chunk %s: copy on tier %s %s (%s)", row.digest.hex()[:16],
                    row.tier, verdict, why)
        sources = tuple(t for t in valid if t != row.tier and t in self.store.tiers)
        healed = False
        try:
            if sources:
                data = await self.store.reader.read(
                    ChunkRef(row.digest, row.length, sources), log_missing=False)
                healed = await self.store.reader.heal_copies(
                    ChunkRef(row.digest, row.length, tuple(valid)), data, [(row.tier, verdict)])
            elif row.tier in valid:
                await self._db(self.catalog.mark_replica_bad, row.digest, row.tier)
        except CatalogUnavailable:
            raise
        except CkptfsError as exc:
            log.warning("scrub: chunk %s: no valid copy to heal from: %s",
                        row.digest.hex()[:16], exc)
        if not healed:
            log.warning("scrub: chunk %s: copy on tier %s recorded bad, not healed",
                        row.digest.hex()[:16], row.tier)
        self.progress.found_bad(row.tier, healed)

    async def _pause_for_saves(self) -> None:
        if not self.cfg.pause_while_writing or not self._saving():
            return
        self.progress.state = PAUSED
        self.progress.publish()
        await self._save_over()

    async def _pace(self, n: int) -> None:
        """At most ``rate`` bytes/s: each copy moves the next one's start."""
        now = trio.current_time()
        self._next_at = max(self._next_at, now) + n / self.cfg.rate
        await trio.sleep_until(self._next_at)

    # -- the remote's lease -----------------------------------------------------------------

    async def _remote_state(self) -> str:
        """Who scrubs the remotes: this node's name, another's (its lease), "" (none)."""
        if not self.remotes:
            return ""
        if not self.shared:
            return self.node
        await self._renew_lease()
        return self.progress.lease_holder or ""

    async def _renew_lease(self) -> bool:
        """Hold the remote's lease (renewed every third of its time); True if held."""
        if trio.current_time() - self._lease_at < LEASE_TTL_S / 3:
            return self.progress.lease_holder == self.node
        holder = await self._db(self.catalog.take_scrub_lease, self.node, LEASE_TTL_S)
        if holder != self.progress.lease_holder:
            log.info("scrub: the remote's scrub lease is held by %s", holder)
        self.progress.lease_holder = holder
        self._lease_at = trio.current_time() if holder == self.node else -math.inf
        return holder == self.node

    async def _release_lease(self) -> None:
        try:
            await self._db(self.catalog.release_scrub_lease, self.node)
        except CkptfsError as exc:
            log.info("scrub: lease not released (it expires): %s", exc)

    # -- helpers ----------------------------------------------------------------------------

    def _tiers(self) -> list[str]:
        return self.local + self.remotes

    async def _refresh(self) -> None:
        """The catalog's side of the progress (each tier's copies, oldest check, passes)."""
        since = time.time_ns() - int(86400 * 1e9)
        self.progress.catalog = await self._db(self.catalog.check_progress, self._tiers(), since)
        self.progress.passes = await self._db(self.catalog.scrub_passes)
        self._refreshed = trio.current_time()
        self.progress.publish()

    async def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A catalog call in a worker thread under the catalog's limiter, through a method
        of the scrubber (what a count of a request's catalog calls leaves out)."""
        return await trio.to_thread.run_sync(self._call, fn, args, limiter=self.db_limiter)

    def _call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        return fn(*args)
