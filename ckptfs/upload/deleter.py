"""The deletion queue: removes chunk frames from local and remote tiers, off every hot path.

Garbage collection, eviction, retention and cancelled uploads only write ``deletions``
rows (in the catalog transaction that makes a frame garbage); this task drains them. Local
rows go in batches at once; remote rows run in worker threads under the deleter's own
limiter, so a remote that hangs stalls only these threads: never the catalog limiter, the
store's I/O limiter or the pin lock. A failure postpones the row with exponential backoff
(its last error kept for `ckptfs status`); a tier that works again (an upload or deletion
succeeded) gets its postponed rows retried at once. Rows survive restarts.

Safety against content addressing (chunks/guard.py, docs/concurrency.md): a row of a pinned
digest is held back until the pin goes; otherwise the pair is marked as being deleted, one
catalog transaction cancels it if the chunk is wanted on that tier again (a valid replica
row or an upload job for the pair), and only then is the frame deleted, outside every lock.
A remote row is also claimed in the catalog (a lease, sql.CLAIM_LEASE_NS): another node
may commit and upload the same bytes meanwhile, and no node starts or records an upload of
a claimed pair, so no DELETE lands after a PUT that was recorded.

At a stop (unmount) the remote DELETEs in flight get STOP_GRACE_S to return and write
their ends; a hung one is abandoned then, and its claim runs out with its lease (the row is
tried again by the next mount after that). Cut short at once, every DELETE in flight at an
unmount would hold its row, and the pair's uploads, for the lease's whole length.

A failed remote DELETE whose request may still land keeps its claim until it no longer
can. A failure the server answered (any status: 403, 404, a 5xx read back) or one where
nothing was sent (no connection made) ends the claim at once: the row is postponed with
its backoff. A failure in doubt (``TierError.in_doubt``: a read timeout, a connection reset
or closed mid-request, an unknown error) may leave the DELETE queued at the server, to land
after another node's PUT of the same digest. Its row is postponed with the claim kept: a
new lease until the later of its backoff and the tier's ``request_grace_s`` (S3: from its
connect and read timeouts), written in the same transaction that counts the attempt and
keeps the error (``ckptfs status``). Uploads of the pair stay held. The lease's end is a
deadline of this queue (``_graced``): then the claim is released (the DELETE can no longer
land), which tells the uploads it held, here and on other nodes, and makes the row due:
tried again, or cancelled when the chunk is wanted on that tier again. Should this node
die first, the lease runs out as any claim's does.

A database outage (a shared catalog) does not end this task: a pass that cannot reach
the catalog waits and tries again, so the remote DELETEs in flight finish in their
threads, never abandoned. A claim whose end (done, failed, or not known to have been
made) could not be written is kept here and written first once the catalog answers:
otherwise the lease would hold every node's uploads of the pair for its whole length.

With a shared catalog another node may queue rows for this node's local tiers (its
retention expired a checkpoint this node had copies of; it unlinked a file whose chunks
this node holds), queue remote rows any node may take, and end rows a settle waits for
(done, or its claim ended). Each such transaction sends a NOTIFY that ``listener`` hears
(catalog/deletion_events.py): the queue looks again then, and after the listener
(re)connects (what was sent meanwhile is unknown). No timer: a claim whose node died ends
with its lease, a deadline of next_deletion_due_ns.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Sequence

import trio

from ..catalog.catalog import Deletion
from ..catalog.deletion_events import Listener
from ..catalog.protocols import DeletionQueue
from ..catalog.sql import CLAIM_LEASE_NS
from ..chunks.guard import ChunkGuard
from ..chunks.room import Room
from ..errors import CatalogUnavailable, CkptfsError, TierError
from ..stats import Stats
from ..tiers.base import Tier
from ..wakeup import ThreadWakeup, Wakeup
from .hearing import hear
from .uploader import backoff_s

log = logging.getLogger("ckptfs.deleter")

LOCAL_BATCH = 256  # local rows claimed and deleted per catalog transaction
# After a kick, wait this long for more rows: a rotation's stream of unlinks is then
# deleted in batches (a few catalog round trips per batch, not per file).
BATCH_S = 0.02
REMOTE_CONCURRENCY = 4
OUTAGE_RETRY_MIN_S = 0.5  # the catalog is unreachable: look again after this, doubling
OUTAGE_RETRY_MAX_S = 10.0
# At a stop, how long the remote deletions in flight may go on to return and end their
# claims (a bounded wait: a hung object store delays the unmount by this, no more).
STOP_GRACE_S = 2.0

Pair = tuple[bytes, str]
# A claim's end not yet written, (how, next try, error, claim kept): "finish" the DELETE
# succeeded; "postpone" it failed (retry then; kept: in doubt, the claim runs until then);
# "release" the claim may or may not have committed.
Ending = tuple[str, int, str, bool]


class Deleter:
    def __init__(
        self, catalog: DeletionQueue, tiers: Sequence[Tier], db_limiter: trio.CapacityLimiter, *,
        guard: ChunkGuard, stats: Stats, room: Room,
        forget_frames: Callable[[Iterable[bytes]], None] = lambda digests: None,
        wake: Wakeup | None = None, released: ThreadWakeup | None = None,
        on_done: Callable[[], None] | None = None, concurrency: int = REMOTE_CONCURRENCY,
        clock: Callable[[], int] = time.time_ns, listener: Listener | None = None,
        owner: Callable[[], tuple[str, str]] | None = None, one_daemon: bool = True,
    ) -> None:
        """``guard``, ``stats`` and ``room`` are the store's (shared, built first);
        ``forget_frames``: these frames were deleted (a frame put again is not known
        durable); ``wake``: who wakes this queue (the store, the uploader, GC);
        ``released``: set by ``guard``'s on_release (any thread): a held-back digest's pin
        went, or its deletion in flight ended (given to the guard first); ``on_done``:
        a batch or row finished (the uploader may wait for a deletion); ``listener``:
        where other nodes' changes of the queue are heard (a shared catalog; this task
        closes it); ``owner``: (node, session) of this daemon, recorded with its claims
        (None: a daemon id of its own, no node); ``one_daemon``: only one daemon uses the
        catalog at a time (SQLite), so every claim found at the start is a dead one's."""
        self.catalog = catalog
        self.tiers = {t.name: t for t in tiers}
        self.local = sorted(t.name for t in tiers if t.kind == "local")
        self.remote = sorted(t.name for t in tiers if t.kind != "local")
        self.stats = stats
        self.room = room
        self.forget_frames = forget_frames
        self.guard = guard
        self.db_limiter = db_limiter
        self.clock = clock
        self.concurrency = concurrency
        self._listener = listener
        self._init_state()
        self._wake = wake if wake is not None else Wakeup()
        self._released_wake = released
        self._progress = trio.Event()  # set (and replaced) after each batch or row
        self.deleted = 0
        self.deleted_bytes = 0
        self.failures = 0
        self.on_done = on_done
        run_id = uuid.uuid4().hex
        self.owner: Callable[[], tuple[str, str]] = owner or (lambda: ("", run_id))
        self.one_daemon = one_daemon
        # The claims a dead daemon of this node left: taken back once (not known without a
        # node of its own on a catalog several daemons share).
        self._adopted = owner is None and not one_daemon
        self.adopted: list[Pair] = []  # (tests, status)

    def _init_state(self) -> None:
        """The queue's state while it runs: limiters, rows in flight, claims."""
        self.local_limiter = trio.CapacityLimiter(2)
        self.remote_limiter = trio.CapacityLimiter(self.concurrency)
        self.running: set[Pair] = set()
        self._held: set[Pair] = set()  # pairs of pinned digests, retried when unpinned
        self._local_busy = False
        self._remote_running = 0
        self._failing: set[str] = set()  # tiers whose last deletion failed
        self._recovered: set[str] = set()  # tiers that work again: retry their rows now
        # Remote claims whose end could not be written (the catalog was unreachable):
        # pair -> (its lease value, how it ended). Written first at the next pass.
        self._unwritten: dict[Pair, tuple[int, Ending]] = {}
        # Claims kept after a DELETE in doubt: pair -> the lease value (this queue's clock)
        # at which this queue releases it (_end_graces): a deadline of the run loop.
        self._graced: dict[Pair, int] = {}
        self._outage_logged = False
        # The remote deletions' shields against a stop, and the trio time they end at
        # once the queue is stopping (inf before): see _remote_one.
        self._stop_shields: set[trio.CancelScope] = set()
        self._stop_deadline = math.inf

    def kick(self) -> None:
        self._wake.set()

    def tier_works(self, tier: str) -> None:
        """Something succeeded on this tier (an upload): retry its postponed rows now."""
        if tier in self._failing:
            self._failing.discard(tier)
            self._recovered.add(tier)
            self.kick()

    async def retry_now(self) -> None:
        """Make every postponed row due now (``ckptfs gc``)."""
        await trio.to_thread.run_sync(
            self.catalog.retry_deletions_now, None, limiter=self.db_limiter
        )
        self.kick()

    def _released(self) -> None:
        """On the trio thread: some pin of a held-back digest went."""
        held = self.guard.held_digests()
        self._held = {p for p in self._held if p[0] in held}
        self.kick()

    async def _hear_releases(self, released: ThreadWakeup) -> None:
        while True:
            await released.wait()
            released.clear()
            self._released()

    async def run(self) -> None:
        local, remote = self.local, self.remote
        known = local + remote
        self._stop_deadline = math.inf  # (run again after an outage: not stopping)
        async with trio.open_nursery() as nursery:
            if self._released_wake is not None:
                nursery.start_soon(self._hear_releases, self._released_wake)
            if self._listener is not None:
                nursery.start_soon(hear, self._listener, self._heard,
                                   "other nodes' changes of the deletion queue", log)
            try:
                await self._loop(nursery, local, remote, known)
            finally:
                # Stopped: the remote deletions in flight get STOP_GRACE_S (module doc).
                self._stop_deadline = trio.current_time() + STOP_GRACE_S
                for shield in self._stop_shields:
                    shield.deadline = self._stop_deadline

    async def _loop(
        self, nursery: trio.Nursery, local: list[str], remote: list[str], known: list[str]
    ) -> None:
        outage_wait = OUTAGE_RETRY_MIN_S
        while True:
            self._wake.clear()
            try:
                if not self._adopted:
                    await self._adopt_dead_claims()
                await self._write_endings()
                await self._end_graces()
                if self._recovered:
                    tiers, self._recovered = self._recovered, set()
                    for name in sorted(tiers):
                        await trio.to_thread.run_sync(
                            self.catalog.retry_deletions_now, name, limiter=self.db_limiter
                        )
                skip = self.running | self._held | set(self._unwritten) | set(self._graced)
                now = self.clock()
                rows, remote_rows, due_ns = await trio.to_thread.run_sync(
                    self._plan, now, skip, not self._local_busy,
                    self.concurrency - self._remote_running if remote else 0, local, remote,
                    known, limiter=self.db_limiter,
                )
            except CatalogUnavailable as exc:
                # No database event tells it came back: look again with backoff. The
                # deletions in flight go on meanwhile (their ends are kept).
                self._outage(exc)
                await trio.sleep(outage_wait)
                outage_wait = min(2 * outage_wait, OUTAGE_RETRY_MAX_S)
                continue
            if self._outage_logged:
                log.info("deletion queue: the catalog answers again")
                self._outage_logged = False
            outage_wait = OUTAGE_RETRY_MIN_S
            if rows:
                self._local_busy = True
                nursery.start_soon(self._local_task, rows)
            for row in remote_rows:
                self._remote_running += 1
                self.running.add((row.digest, row.tier))
                nursery.start_soon(self._remote_one, row)
            # The kept claims were skipped above: their ends are deadlines of ours.
            ends = [*self._graced.values(), *(() if due_ns is None else (due_ns,))]
            due_ns = min(ends, default=None)
            delay = math.inf if due_ns is None else max(0.0, (due_ns - self.clock()) / 1e9)
            if delay == 0.0:
                # Due rows that found no free worker: a finishing one kicks us.
                delay = math.inf if (self._local_busy or self._remote_running) else 0.0
            with trio.move_on_after(delay):
                await self._wake.wait()
            if self._wake.is_set():
                await trio.sleep(BATCH_S)  # a burst: let its rows gather into one batch

    def _heard(self) -> None:
        """Another node changed the queue (or the listener reconnected): plan again, let a
        settle look again (a row it waits for may have ended there), and a move held back
        by another node's claim (store.py ``_spill``: the claim may have ended)."""
        self._progress.set()
        self._progress = trio.Event()
        self.kick()
        self.room.hold_ended()

    def _outage(self, exc: CatalogUnavailable) -> None:
        if not self._outage_logged:
            log.warning("deletion queue paused, the catalog is unreachable: %s", exc)
            self._outage_logged = True

    async def _write_endings(self) -> None:
        """Write the claims' ends kept during an outage (CatalogUnavailable if it lasts)."""
        for pair, (until, (how, next_try, error, kept)) in list(self._unwritten.items()):
            if how == "finish":
                await trio.to_thread.run_sync(
                    self.catalog.finish_deletions, [pair], until, limiter=self.db_limiter
                )
            elif how == "postpone":
                await self._postpone_claimed(pair, next_try, error, until, kept)
            else:
                await trio.to_thread.run_sync(
                    self.catalog.release_deletion_claims, [pair], until, limiter=self.db_limiter
                )
            del self._unwritten[pair]
            self.room.hold_ended()  # that claim ended: a move it held back may go on
            if how == "finish":
                self.deleted += 1
                self.stats.count("deletions")
            self._finished()

    async def _adopt_dead_claims(self) -> None:
        """At the start: take back the remote claims a dead daemon of this node left
        (killed mid-delete: catalog/claims.py), instead of waiting out their lease. Its
        DELETEs were sent at the latest when it died, so each may still land for its
        tier's request grace: the claim is kept that long, as after a DELETE in doubt,
        then released (``_end_graces``) and the row tried again. CatalogUnavailable if the
        catalog does not answer (tried again at the next pass)."""
        now = self.clock()
        until = {name: now + int(self.tiers[name].request_grace_s * 1e9) for name in self.remote}
        node, sid = self.owner()
        taken = await trio.to_thread.run_sync(
            functools.partial(self.catalog.adopt_deletion_claims, node, sid, until,
                              every=self.one_daemon),
            limiter=self.db_limiter,
        ) if until else []
        self._adopted = True
        for digest, tier, lease in taken:
            self._graced[(digest, tier)] = lease
            self.adopted.append((digest, tier))
        if taken:
            log.info("took back %d deletion claim(s) a dead daemon of this node left: "
                     "tried again after their tiers' request grace (%s), not their lease",
                     len(taken), ", ".join(f"{t} {(u - now) / 1e9:.0f} s"
                                           for t, u in sorted(until.items())))

    async def _end_graces(self) -> None:
        """Release the claims kept after a DELETE in doubt whose lease is over (the DELETE
        can no longer land; its backoff is over too): the rows are due now, and the uploads
        they held go on (a kick here, a NOTIFY to other nodes). CatalogUnavailable if the
        catalog does not answer; the claims not released are kept for the next pass."""
        now = self.clock()
        for pair, until in sorted(self._graced.items(), key=lambda item: item[1]):
            if until > now:
                continue
            # 0 released: another deleter took the row (its lease had run out there).
            await trio.to_thread.run_sync(
                self.catalog.release_deletion_claims, [pair], until, limiter=self.db_limiter
            )
            del self._graced[pair]
            self.room.hold_ended()  # a move held back by the claim may go on
            self._finished()

    async def _postpone_claimed(
        self, pair: Pair, next_try: int, error: str, until: int, kept: bool
    ) -> None:
        """Write a claimed row's failure (the claim made with ``until``); ``kept``: the
        claim goes on until ``next_try`` (a DELETE in doubt), and this queue ends it then."""
        await trio.to_thread.run_sync(
            functools.partial(self.catalog.postpone_deletion, *pair, next_try, error, until,
                              keep_claim=kept),
            limiter=self.db_limiter,
        )
        if kept:
            self._graced[pair] = next_try

    def _plan(
        self, now: int, skip: set[Pair], take_local: bool, free: int, local: list[str],
        remote: list[str], known: list[str],
    ) -> tuple[list[Deletion], list[Deletion], int | None]:
        """Blocking: one catalog round trip per pass: the due local rows (a batch), the due
        remote rows (``free`` of them) and the next due time of the others."""
        mine = self.catalog.due_deletions(now, LOCAL_BATCH, skip, local) if take_local else []
        theirs = self.catalog.due_deletions(now, free, skip, remote) if free > 0 else []
        taken = skip | {(r.digest, r.tier) for r in mine + theirs}
        return mine, theirs, self.catalog.next_deletion_due_ns(taken, known)

    def _finished(self) -> None:
        self._progress.set()
        self._progress = trio.Event()
        self.kick()
        if self.on_done is not None:
            self.on_done()

    # -- local --------------------------------------------------------------------------------

    async def _local_task(self, rows: list[Deletion]) -> None:
        try:
            await self.delete_local(
                [(r.digest, r.tier) for r in rows], {(r.digest, r.tier): r.attempts for r in rows}
            )
        except CatalogUnavailable as exc:
            # Local rows are not leased: one whose end was not written is due again, and
            # deleting a frame twice is harmless.
            self._outage(exc)
        finally:
            self._local_busy = False

    async def delete_local(self, pairs: list[Pair], attempts: dict[Pair, int] | None = None) -> int:
        """Delete these local rows now (also called by a writer that needs room). Returns
        the bytes freed."""
        pairs = [p for p in pairs if p not in self.running]
        if not pairs:
            return 0
        self.running.update(pairs)
        freed = 0
        try:
            marked, held = self.guard.begin_delete(pairs)
            self._held.update(held)
            done: list[Pair] = []
            try:
                ok = await trio.to_thread.run_sync(
                    self.catalog.claim_deletions, marked, limiter=self.db_limiter
                ) if marked else []
                results = await trio.to_thread.run_sync(
                    self._delete_frames, ok, limiter=self.local_limiter
                ) if ok else []
                failed = []
                for pair, size, err in results:
                    if err is None:
                        done.append(pair)
                        freed += size
                    else:
                        failed.append((pair, err))
                if done:
                    await trio.to_thread.run_sync(
                        self.catalog.finish_deletions, done, limiter=self.db_limiter
                    )
                for pair, err in failed:
                    await self._postpone(*pair, (attempts or {}).get(pair, 0), err)
            finally:
                # Before a waiting writer puts its frame again: it is not known synced.
                self.forget_frames(d for d, _ in done)
                self.guard.end_delete(marked)
            if done:
                self.deleted += len(done)
                self.deleted_bytes += freed
                self.stats.count("deletions", len(done))
                self.room.freed()
                for name in {t for _, t in done} & self._failing:
                    log.info("deletions on tier %s work again", name)
                    self.tier_works(name)
        finally:
            self.running.difference_update(pairs)
            self._finished()
        return freed

    def _delete_frames(self, pairs: list[Pair]) -> list[tuple[Pair, int, str | None]]:
        """Blocking: delete local frames (idempotent); (pair, bytes freed, error or None)."""
        out: list[tuple[Pair, int, str | None]] = []
        for d, name in pairs:
            tier = self.tiers[name]
            try:
                out.append(((d, name), tier.delete(d.hex()), None))
            except CkptfsError as exc:
                out.append(((d, name), 0, str(exc)))
        return out

    # -- remote -------------------------------------------------------------------------------

    async def _remote_one(self, row: Deletion) -> None:
        pair = (row.digest, row.tier)
        try:
            marked, held = self.guard.begin_delete([pair])
            self._held.update(held)
            if not marked:
                return
            # Shielded from a stop until its grace ends (module doc; run sets the deadline).
            shield = trio.CancelScope(shield=True, deadline=self._stop_deadline)
            self._stop_shields.add(shield)
            try:
                with shield:
                    await self._remote_claimed(row, marked)
                if shield.cancelled_caught:
                    log.info("deletion of chunk %s on tier %s abandoned at the stop: its claim "
                             "runs out with its lease", row.digest.hex()[:16], row.tier)
            finally:
                self._stop_shields.discard(shield)
                self.guard.end_delete(marked)
        finally:
            self.running.discard(pair)
            self._remote_running -= 1
            self._finished()
            self.room.hold_ended()  # a claim of this pair may have ended: a held move goes on

    async def _remote_claimed(self, row: Deletion, marked: list[Pair]) -> None:
        pair = (row.digest, row.tier)
        # Leased in the catalog: other nodes start or record no upload of the pair until
        # this row is done (they may hold the same bytes). The lease value names this claim.
        # It outlasts the call (a HEAD and a DELETE, each within the tier's timeouts: about
        # its request grace) and a grace after it, should this node die or its end go
        # unwritten in an outage: the DELETE cannot land once the lease runs out.
        tier = self.tiers[row.tier]
        until = time.time_ns() + max(CLAIM_LEASE_NS, int(2e9 * tier.request_grace_s))
        ending: Ending = ("release", 0, "", False)
        try:
            ok = await trio.to_thread.run_sync(
                self.catalog.claim_deletions, marked, until, self.owner(),
                limiter=self.db_limiter,
            )
            if not ok:
                return
            try:
                # A hung server holds only this thread; at unmount it is abandoned
                # (the row stays and is retried at the next mount).
                await trio.to_thread.run_sync(
                    tier.delete, row.digest.hex(), limiter=self.remote_limiter,
                    abandon_on_cancel=True,
                )
            except CkptfsError as exc:
                next_try = self._count_failure(row.tier, str(exc), row.attempts)
                # In doubt: the DELETE may still land, for the tier's grace (module doc).
                grace_s = tier.request_grace_s if isinstance(exc, TierError) and exc.in_doubt else 0.0
                if grace_s > 0:
                    next_try = max(next_try, self.clock() + int(grace_s * 1e9))
                ending = ("postpone", next_try, str(exc)[:500], grace_s > 0)
                await self._postpone_claimed(pair, next_try, ending[2], until, ending[3])
                return
            ending = ("finish", 0, "", False)
            await trio.to_thread.run_sync(
                self.catalog.finish_deletions, ok, until, limiter=self.db_limiter
            )
        except CatalogUnavailable as exc:
            # The end is written once the catalog answers (run's next pass).
            self._outage(exc)
            self._unwritten[pair] = (until, ending)
            return
        self.deleted += 1
        self.stats.count("deletions")
        if row.tier in self._failing:
            log.info("deletions on tier %s work again", row.tier)
            self.tier_works(row.tier)

    def _count_failure(self, tier: str, error: str, attempts: int) -> int:
        """A deletion failed: count and log it; the time of its retry."""
        self.failures += 1
        self.stats.count("deletion_failures")
        if tier not in self._failing:
            log.warning("deleting chunks on tier %s failed, will retry with backoff: %s",
                        tier, error)
            self._failing.add(tier)
        return self.clock() + int(backoff_s(attempts) * 1e9)

    async def _postpone(self, digest: bytes, tier: str, attempts: int, error: str) -> None:
        next_try = self._count_failure(tier, error, attempts)
        await trio.to_thread.run_sync(
            self.catalog.postpone_deletion, digest, tier, next_try, error[:500],
            limiter=self.db_limiter,
        )

    # -- waiting ------------------------------------------------------------------------------

    async def settle(self, digests: Iterable[bytes], timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until every due deletion row of these chunks has
        been tried: done, cancelled, postponed after a failure, or held back by a pin."""
        digests = set(digests)
        if not digests:
            return
        with trio.move_on_after(timeout_s):
            while True:
                progress = self._progress
                pending = await trio.to_thread.run_sync(
                    self.catalog.deletions_pending, digests, self.clock(), limiter=self.db_limiter
                )
                # Held back by a pin, or tried and postponed with the claim kept (in doubt).
                held = {d for d, _ in self._held | set(self._graced)}
                if not pending - held:
                    return
                self.kick()
                # A row this node ends sets it (_finished), one another node ends too
                # (_heard, a shared catalog).
                await progress.wait()
