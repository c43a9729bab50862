"""The chunk reader: returns the verified plaintext of a chunk. It tries the tiers that
hold it (the fastest first), verifies the digest, falls back on a miss or a mismatch and
never returns unverified bytes; concurrent reads of one chunk are merged, and decoded
chunks are kept in the read cache (chunks/cache.py). A chunk only another node holds is
waited for (a shared catalog); copies found missing or corrupt are healed, and chunks
read from a remote only are copied back to a local tier when reads pause."""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from ..catalog import ChunkRef
from ..catalog.protocols import ReplicaCatalog, SessionCatalog, WantCatalog
from ..codec import frame
from ..codec.seal import KEYRING
from ..errors import (
    CatalogUnavailable,
    ChunkMissing,
    CkptfsError,
    CorruptChunk,
    NoSpace,
    ObjectUnreadable,
    PeerChunkPending,
    ResidencyRefused,
    TierError,
)
from ..supervise import contained
from .cache import ReadCache
from .guard import ChunkGuard
from .parts import Background, Limiters, Pins, StoreHooks, TierSet
from .placement import Placement
from .priority import Ticket

log = logging.getLogger("ckptfs.chunks")

COPY_BACK_BUFFER = 256 * 1024 * 1024  # decoded chunks held for copy-back
COPY_BACK_IDLE_S = 0.2  # copy-backs wait for reads to pause this long
# A read waiting for another node's upload asks the shared catalog again after this long,
# doubling up to the max (the catalog is the only news of another node's upload).
PEER_POLL_MIN_S = 0.1
PEER_POLL_MAX_S = 1.0
# After a wait for another node's chunk gave up, reads of chunks only that node holds
# fail at once for this long (a read of a file it alone holds waits once, not per chunk).
PEER_QUIET_S = 60.0
# Such a read records a want in the catalog (catalog/wants.py): the holding node uploads the
# chunk first. The want outlives the wait by this much (a stale one expires by itself).
WANT_SLACK_S = 10.0


class ReaderCatalog(ReplicaCatalog, SessionCatalog, WantCatalog, Protocol):
    """What the reader asks of the catalog: where a chunk's copies are (and which are bad),
    other nodes' sessions and wants, and the upload jobs of healed remote copies
    (ReplicaCatalog, until the upload queue is its own role)."""


def _runs(names: Sequence[str], remote: Callable[[str], bool]) -> list[tuple[bool, list[str]]]:
    """``names`` in order, cut into runs of the same kind: [(is_remote, names), ...]."""
    out: list[tuple[bool, list[str]]] = []
    for n in names:
        r = remote(n)
        if out and out[-1][0] == r:
            out[-1][1].append(n)
        else:
            out.append((r, [n]))
    return out


class _Flight:
    """One in-progress fetch of a chunk that other readers can wait on."""

    def __init__(self, urgent: bool) -> None:
        self.done = trio.Event()
        self.data: frame.Buffer | None = None
        self.error: CkptfsError | None = None
        # Its place in the queue for a remote GET: a readahead's is promoted when a
        # reader comes to wait for the chunk.
        self.ticket = Ticket(urgent)


@dataclass
class _Fetched:
    """What a fetch found: the verified plaintext and its tier, and the copies to heal."""

    data: frame.Buffer | None = None
    source: str | None = None
    # (tier, missing|corrupt|unreadable|error): all but "error" are this copy's problem
    failures: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    refresh: bool = False  # nothing valid among the tiers the caller named: ask the catalog


class ChunkReader:
    def __init__(
        self, tiers: TierSet, catalog: ReaderCatalog, limiters: Limiters, *,
        shared: bool, cache: ReadCache, placement: Placement, pins: Pins,
        hooks: StoreHooks, background: Background, peer_wait_s: float = 0.0, node: str = "",
    ) -> None:
        """``shared``: the catalog is shared with other nodes; ``peer_wait_s``: how long a
        read of a chunk only other nodes hold waits for their upload (peer_chunk_wait);
        ``node``: this node's name (it names this reader's wants of such chunks in the
        catalog); ``placement``: where heals and copy-backs write local copies."""
        self.tiers = tiers.tiers
        self.local = tiers.local
        self.residency = tiers.residency
        self.stats = tiers.stats
        self.catalog = catalog
        self.shared = shared
        self.io, self.remote_io, self.db_limiter = limiters.io, limiters.remote_io, limiters.db
        self._bg = limiters.bg
        self.cache = cache
        self.frames = cache.frames
        self.placement = placement
        self.pins = pins
        self.guard: ChunkGuard = pins.guard
        self.hooks = hooks
        self.background = background
        self.peer_wait_s = peer_wait_s
        # Per other node (trio time): when the wait for its chunks now going on began (the
        # waits on one node share one deadline), and when such a wait last gave up (reads
        # of its chunks then fail at once for PEER_QUIET_S): a file read waits once for a
        # node that uploads nothing, not once per chunk.
        self._peer_waits: dict[str, float] = {}
        self._peer_gave_up: dict[str, float] = {}
        # Who waits, in the catalog's wants: the node, and this daemon's run of it.
        self.waiter = f"{node or 'node'}:{uuid.uuid4().hex[:8]}"
        self._flights: dict[bytes, _Flight] = {}
        self._healing: set[bytes] = set()
        # Chunks to write to a local tier when reads pause, with their bad local copies.
        self._copy_backs: OrderedDict[
            bytes, tuple[ChunkRef, frame.Buffer, list[tuple[str, str]]]
        ] = OrderedDict()
        self._copy_back_bytes = 0
        self._copy_back_wake = trio.Event()
        self._last_read = -1e9  # trio time a read last asked for a chunk (cached or not)
        self._reads_done = trio.Event()  # set (and replaced) when the last fetch in flight ends

    def cached(self, digest: bytes) -> bool:
        """True if reading this chunk costs no new device read (cached or being fetched)."""
        return digest in self.cache or digest in self._flights

    async def read(
        self, ref: ChunkRef, copy_back: bool = False, log_missing: bool = True,
        abandon_on_cancel: bool = False, ahead: bool = False,
    ) -> frame.Buffer:
        """Return the verified plaintext of a chunk. EIO (ChunkMissing/CorruptChunk) if no
        tier holds a valid copy. Copies found missing or corrupt on the way are marked bad
        and healed in the background; with ``copy_back``, a chunk read from a remote tier
        only is also written to a local tier (a sequential restore stages the file).
        ``abandon_on_cancel``: a readahead, cancelled when its file is released, leaves a
        device or network call in flight behind instead of waiting for it (the call
        changes nothing but counters; its result is dropped). ``ahead``: a readahead (its
        GET waits behind those of chunks a reader is blocked on)."""
        self._last_read = trio.current_time()
        if not ahead:
            self.cache.forget_ahead([ref.digest])
        while True:
            data = self.cache.get(ref.digest)
            if data is not None:
                return data
            ref = self.pins.current(ref)
            flight = self._flights.get(ref.digest)
            if flight is None:
                return await self._fly(ref, copy_back, log_missing, abandon_on_cancel, ahead)
            if not ahead:
                self.remote_io.promote(flight.ticket)  # a reader waits for it now
            await flight.done.wait()
            if flight.error is not None:
                raise flight.error
            if flight.data is not None:
                return flight.data
            # The fetch we joined was a readahead that was cancelled: fetch it ourselves.

    async def _fly(
        self, ref: ChunkRef, copy_back: bool, log_missing: bool, abandon: bool, ahead: bool
    ) -> frame.Buffer:
        """Fetch a chunk as the one flight other readers of it join."""
        flight = _Flight(urgent=not ahead)
        self._flights[ref.digest] = flight
        try:
            got = await self._fetch(ref, abandon, flight.ticket)
            if got.data is None and got.refresh:
                # The caller's idea of where the chunk lives may be old (an upload added
                # a remote copy, an eviction removed a local one): ask the catalog.
                tiers = self.pins.current(ref).tiers
                if tiers == ref.tiers:
                    tiers = await trio.to_thread.run_sync(
                        self.catalog.replica_tiers, ref.digest, limiter=self.db_limiter
                    )
                if tiers and not set(tiers) <= set(ref.tiers):
                    fresh = ChunkRef(ref.digest, ref.length, tiers)
                    again = await self._fetch(fresh, abandon, flight.ticket)
                    again.failures[:0] = got.failures
                    again.problems[:0] = got.problems
                    got = again
            if got.data is None and self.shared:
                got = await self._await_peer(ref, got, abandon, flight.ticket)
            if got.data is None or not ref.tiers:
                # No valid copy recorded or found: copies recorded bad are tried last.
                got = await self._recheck_bad(ref, got, abandon, flight.ticket)
            if got.data is None:
                await self._record_lost(ref, got)
                raise ChunkMissing(
                    f"no valid copy of chunk {ref.key[:16]} ({'; '.join(got.problems)})"
                )
            flight.data = got.data
            self.cache.put(ref.digest, got.data)
            self._after_read(ref, got, copy_back)
        except CkptfsError as exc:
            if log_missing or not isinstance(exc, ChunkMissing):
                log.error("%s", exc)
            flight.error = exc
        finally:
            # Cancelled (a readahead whose file was released): neither data nor error,
            # and the readers that joined fetch the chunk themselves.
            del self._flights[ref.digest]
            if ref.digest not in self.cache:
                self.cache.forget_ahead([ref.digest])  # not fetched (or not kept): nothing ahead
            flight.done.set()
            if not self._flights:
                self._reads_done.set()
                self._reads_done = trio.Event()
        if flight.error is not None:
            raise flight.error
        assert flight.data is not None
        return flight.data

    async def _await_peer(
        self, ref: ChunkRef, got: _Fetched, abandon: bool, ticket: Ticket
    ) -> _Fetched:
        """A shared catalog: a chunk recorded only on other nodes' local tiers was committed
        there and not uploaded yet. Wait up to ``peer_wait_s`` for a copy on a tier this
        node reads (their uploader puts it on the bucket), asking the catalog with backoff,
        then fetch it. PeerChunkPending (EIO) names the nodes if none came, at once if
        none of them has a live session (dead: nothing will upload it) or a wait on each
        gave up lately (``_peer_deadline``); ``got`` as it was if the chunk is not another
        node's. Meanwhile the chunk is wanted in the catalog: its holder uploads it before
        its other jobs (``_want``)."""
        deadline: float | None = None
        delay = PEER_POLL_MIN_S
        asked = wanted = False
        try:
            while True:
                tiers = await trio.to_thread.run_sync(
                    self.catalog.replica_tiers, ref.digest, limiter=self.db_limiter
                )
                reachable = tuple(t for t in tiers if t in self.tiers)
                holders = tuple(t for t in tiers if t not in self.tiers)
                nodes = tuple(sorted({t.split(":", 1)[0] for t in holders}))
                if reachable and not set(reachable) <= set(ref.tiers):
                    fresh = await self._fetch(
                        ChunkRef(ref.digest, ref.length, reachable), abandon, ticket
                    )
                    if fresh.data is not None:
                        for n in nodes:  # they deliver: the next chunk waits afresh
                            self._peer_waits.pop(n, None)
                            self._peer_gave_up.pop(n, None)
                        return fresh
                if reachable or not holders:
                    return got  # not (only) another node's: missing or damaged as it is
                where = f"node {', '.join(nodes)} ({', '.join(holders)})"
                if await self._peers_gone(nodes):
                    raise PeerChunkPending(
                        f"chunk {ref.key[:16]} is only on {where}, whose session has ended "
                        "(the node is down): nothing will upload it until it is back", nodes)
                if deadline is None:
                    deadline = self._peer_deadline(nodes)
                    if deadline is None:
                        raise PeerChunkPending(
                            f"chunk {ref.key[:16]} is only on {where}; a read waited "
                            f"{self.peer_wait_s:g} s for that node's chunks less than "
                            f"{PEER_QUIET_S:g} s ago: not waiting again", nodes)
                if trio.current_time() >= deadline:
                    now = trio.current_time()
                    for n in nodes:
                        self._peer_waits.pop(n, None)
                        self._peer_gave_up[n] = now
                    raise PeerChunkPending(
                        f"chunk {ref.key[:16]} is only on {where}, not uploaded within "
                        f"{self.peer_wait_s:g} s", nodes)
                if not asked:
                    asked = True
                    wanted = await self._want(ref.digest, deadline - trio.current_time())
                await trio.sleep(min(delay, max(0.0, deadline - trio.current_time())))
                delay = min(delay * 2, PEER_POLL_MAX_S)
        finally:
            if wanted:
                with trio.CancelScope(shield=True):  # also when the read is cancelled
                    await self._unwant(ref.digest)

    def _peer_deadline(self, nodes: tuple[str, ...]) -> float | None:
        """When a wait for a chunk only ``nodes`` hold ends: ``peer_wait_s`` after the
        wait on them now going on began (one deadline for all their chunks); None: do not
        wait, a wait on each of them gave up less than PEER_QUIET_S ago."""
        now = trio.current_time()
        if all(now - self._peer_gave_up.get(n, -math.inf) < PEER_QUIET_S for n in nodes):
            return None
        began = []
        for n in nodes:
            since = self._peer_waits.get(n)
            if since is None or now - since > self.peer_wait_s:  # none, or one abandoned
                since = self._peer_waits[n] = now
            began.append(since)
        return max(began) + self.peer_wait_s

    async def _peers_gone(self, nodes: tuple[str, ...]) -> bool:
        """True if none of ``nodes`` has a live session in the catalog (dead, or cut off
        long enough for its session to expire): waiting for their uploads is useless. A
        catalog that cannot say: False (wait as usual)."""
        try:
            rows = await trio.to_thread.run_sync(self.catalog.sessions, limiter=self.db_limiter)
        except CatalogUnavailable:
            return False
        return not {r.node for r in rows if r.live} & set(nodes)

    async def _want(self, digest: bytes, wait_s: float) -> bool:
        """Record in the catalog that this node waits for ``digest`` (its holder is told at
        the commit). A catalog that cannot take it costs only the expedite: False."""
        try:
            await trio.to_thread.run_sync(
                self.catalog.want_chunks, [digest], self.waiter, wait_s + WANT_SLACK_S,
                limiter=self.db_limiter,
            )
        except CatalogUnavailable as exc:
            log.warning("could not ask for the upload of chunk %s first: %s", digest.hex()[:16], exc)
            return False
        return True

    async def _unwant(self, digest: bytes) -> None:
        # Not removed (the database is away): the want expires by itself (WANT_SLACK_S
        # after the wait would have ended).
        with contextlib.suppress(CatalogUnavailable):
            await trio.to_thread.run_sync(
                self.catalog.unwant_chunks, [digest], self.waiter, limiter=self.db_limiter
            )

    async def _fetch(self, ref: ChunkRef, abandon: bool, ticket: Ticket) -> _Fetched:
        """Try the tiers holding the chunk, the fastest first (measured): local tiers in
        a thread under the store's I/O limiter, remote ones under ``remote_io`` (a hung
        object store holds only those threads, never the ones local writes, fsync and
        reads need)."""
        names = list(ref.tiers) or list(self.local)
        got = _Fetched(refresh=True)
        if self.residency.enabled:
            # A copy outside the chunk's allowed locations (a tier relabelled since it was
            # made) is not read: not a source for this read, nor for a heal or copy-back.
            allowed = [n for n in names
                       if n not in self.tiers or self.residency.permits(ref.digest, n)]
            for name in names:
                if name not in allowed:
                    self.residency.refuse("read", name, ref.digest)
                    got.problems.append(f"{name}: outside the chunk's allowed locations")
            names = allowed
        for remote, run in _runs(self.stats.read_order(names, ref.length),
                                 lambda n: n in self.tiers and n not in self.local):
            # trio takes any object with acquire/release_on_behalf_of as the limiter (its
            # stub names CapacityLimiter only).
            limiter: Any = self.remote_io.slot(ticket) if remote else self.io
            part = await trio.to_thread.run_sync(
                self._fetch_from, ref, run, limiter=limiter, abandon_on_cancel=abandon,
            )
            got.failures += part.failures
            got.problems += part.problems
            if part.data is not None:
                got.data, got.source, got.refresh = part.data, part.source, False
                return got
        return got

    def _fetch_from(self, ref: ChunkRef, names: Sequence[str]) -> _Fetched:
        """Blocking: try these tiers in order; verify; fall back on a miss, damage or an
        I/O error, noting which copies need healing."""
        got = _Fetched()
        for name in names:
            tier = self.tiers.get(name)
            if tier is None:
                got.problems.append(f"{name}: tier not configured")
                continue
            started = time.perf_counter()
            get_into = getattr(tier, "get_into", None)  # GETs, O_DIRECT reads: into our buffers
            try:
                raw = tier.get(ref.key) if get_into is None else get_into(ref.key, self.frames.take)
            except ObjectUnreadable as exc:
                # This copy is bad (the tier answers other requests): heal it, keep the tier.
                log.error("chunk %s on tier %s unreadable: %s", ref.key[:16], name, exc)
                self.stats.count("unreadable_copies")
                self.stats.record_ok(name)
                got.failures.append((name, "unreadable"))
                got.problems.append(f"{name}: {exc}")
                continue
            except TierError as exc:
                log.error("chunk %s on tier %s unreadable: %s", ref.key[:16], name, exc)
                self.stats.record_error(name, str(exc))
                got.failures.append((name, "error"))
                got.problems.append(f"{name}: {exc}")
                continue
            if raw is None:
                self.stats.count("missing_copies")
                got.failures.append((name, "missing"))
                got.problems.append(f"{name}: missing")
                continue
            self.stats.record_read(name, len(raw), time.perf_counter() - started)
            self.stats.record_ok(name)
            try:
                # A sealed frame opens into a new buffer; a plain one is served in place.
                data = frame.decode_view(raw, ref.digest)
                if len(data) != ref.length:
                    raise CorruptChunk(f"length {len(data)} != {ref.length}")
            except CorruptChunk as exc:
                log.error("chunk %s on tier %s is corrupt: %s", ref.key[:16], name, exc)
                self.stats.count("integrity_failures")
                got.failures.append((name, "corrupt"))
                got.problems.append(f"{name}: {exc}")
                self._drop_frame(raw)
                continue
            if not (isinstance(data, memoryview) and isinstance(raw, memoryview)
                    and data.obj is raw.obj):
                self._drop_frame(raw)  # decompressed into new bytes: the frame is done with
            got.data, got.source = data, name
            return got
        return got

    def _drop_frame(self, raw: frame.Buffer) -> None:
        if isinstance(raw, memoryview):
            self.frames.give(raw.obj)

    def _after_read(self, ref: ChunkRef, got: _Fetched, copy_back: bool) -> None:
        if self.background.nursery is None or got.data is None or got.source is None:
            return
        if self.guard.uncommitted(ref.digest):
            return  # uncommitted: the catalog has no copies to heal or to add to
        bad = [(t, why) for t, why in got.failures if t in self.tiers and why != "error"]
        failed = {t for t, _ in got.failures}
        # A local copy out of residency is no copy here (reads skip it).
        remote_only = got.source not in self.local and not any(
            t in self.local and self.residency.permits(ref.digest, t)
            for t in ref.tiers if t not in failed
        )
        if not bad and not (copy_back and remote_only):
            return
        if ref.digest in self._healing:
            return
        if bad and (got.source in self.local or any(t not in self.local for t, _ in bad)):
            # A bad copy with a local source, or a bad remote copy: heal it now.
            self._healing.add(ref.digest)
            self.background.nursery.start_soon(contained, self.stats, "heal", self._heal, ref, got.data,
                                     bad, copy_back and remote_only)
            return
        # Served by a remote with the damage local only (a restore onto wiped or new disks,
        # where every chunk's local copy is missing), or a plain copy-back: the write waits
        # until reads pause, so the reader keeps the CPU and the disk. Beyond the buffer,
        # chunks are left on the remote (`ckptfs prefetch` stages them later); their bad
        # copies are marked at once, so nothing takes them for valid meanwhile.
        if ref.digest in self._copy_backs:
            return
        if self._copy_back_bytes + len(got.data) > COPY_BACK_BUFFER:
            self.stats.count("copy_backs_skipped")
            if bad:
                self._healing.add(ref.digest)  # no heal of it starts while this runs
                self.background.nursery.start_soon(contained, self.stats, "mark-bad", self._mark_bad,
                                         ref, bad)
            return
        self._copy_backs[ref.digest] = (ref, got.data, bad)
        self._copy_back_bytes += len(got.data)
        self._copy_back_wake.set()

    async def _recheck_bad(
        self, ref: ChunkRef, got: _Fetched, abandon: bool, ticket: Ticket
    ) -> _Fetched:
        """A copy recorded bad may be good again: a tier that was away (a disk unmounted,
        an object the server failed for a while) came back. With no valid copy found,
        the copies recorded bad are read (verified) before the read fails; one that
        verifies, or was found by a read of every local tier (the catalog listed no valid
        copy), is recorded valid again."""
        if self.guard.uncommitted(ref.digest):
            return got  # not in the catalog yet: nothing is recorded bad
        bad = await trio.to_thread.run_sync(
            self.catalog.bad_replica_tiers, ref.digest, limiter=self.db_limiter
        )
        if got.data is None:
            tried = {t for t, _ in got.failures}
            names = tuple(t for t in bad if t in self.tiers and t not in tried)
            if not names:
                return got
            again = await self._fetch(ChunkRef(ref.digest, ref.length, names), abandon, ticket)
            again.failures[:0] = got.failures
            again.problems[:0] = got.problems
            got = again
        if got.source is None or got.source not in bad:
            return got
        try:
            await trio.to_thread.run_sync(
                self.catalog.add_replica_if_known, ref.digest, got.source,
                limiter=self.db_limiter,
            )
            log.info("chunk %s: copy on tier %s, recorded bad, is valid: recorded valid again",
                     ref.key[:16], got.source)
        except CkptfsError as exc:
            log.warning("chunk %s: copy on tier %s not recorded valid again: %s",
                        ref.key[:16], got.source, exc)
        return got

    async def _record_lost(self, ref: ChunkRef, got: _Fetched) -> None:
        """No copy was valid: record the ones found missing or corrupt as bad before the
        read fails, so that the catalog stops counting them (``ckptfs latest`` skips the
        checkpoint, ``ls`` counts the chunk missing: checkpoints/reach.py). Only copies
        the catalog still lists: one evicted meanwhile is gone, not damaged. A failure to
        record costs only this: the next read finds the copies bad again."""
        bad = {t for t, why in got.failures if t in self.tiers and why != "error"}
        if not bad or self.guard.uncommitted(ref.digest):
            return
        try:
            listed = set(await trio.to_thread.run_sync(
                self.catalog.replica_tiers, ref.digest, limiter=self.db_limiter
            ))
            for name in sorted(bad & listed):
                await trio.to_thread.run_sync(
                    self.catalog.mark_replica_bad, ref.digest, name, limiter=self.db_limiter
                )
                log.info("chunk %s: copy on tier %s recorded bad; no valid copy is left",
                            ref.key[:16], name)
        except CkptfsError as exc:
            log.warning("chunk %s: bad copies not recorded: %s", ref.key[:16], exc)

    async def _mark_bad(self, ref: ChunkRef, bad: list[tuple[str, str]]) -> None:
        """Record that these copies are missing or corrupt (readers skip them), without
        writing a new one now."""
        try:
            for name, why in bad:
                await trio.to_thread.run_sync(
                    self.catalog.mark_replica_bad, ref.digest, name, limiter=self.db_limiter
                )
                log.warning("chunk %s: copy on tier %s %s; left on the remote until it is "
                            "staged", ref.key[:16], name, why)
        finally:
            self._healing.discard(ref.digest)

    async def stage(self, ref: ChunkRef) -> bool:
        """Make sure a local tier holds a valid copy of this chunk (``ckptfs prefetch``):
        fetch it (verified) and write it locally now. False if no local tier has room."""
        tiers = await trio.to_thread.run_sync(
            self.catalog.replica_tiers, ref.digest, limiter=self.db_limiter
        )
        if any(t in self.local and not self.stats.is_degraded(t)
               and self.residency.permits(ref.digest, t) for t in tiers):
            return True
        data = await self.read(ChunkRef(ref.digest, ref.length, tiers or ref.tiers))
        self.pins.pin(ref.digest)
        try:
            placed = await trio.to_thread.run_sync(
                self._write_local_copy, ref, data, [], limiter=self._bg
            )
            if placed is None:
                self.stats.count("copy_backs_no_room")
                return False
            if not await trio.to_thread.run_sync(
                self.catalog.add_replica_if_known, ref.digest, placed, limiter=self.db_limiter
            ):
                self.hooks.deletions_queued()  # the copy just made is queued for deletion
                return True  # the chunk is gone: nothing to stage
        finally:
            self.pins.unpin([ref.digest])
        self.stats.count("copy_backs")
        return True

    async def run_copy_backs(self) -> None:
        """The copy-back worker: one chunk at a time, only while no read is in progress."""
        while True:
            if not self._copy_backs:
                self._copy_back_wake = trio.Event()
                await self._copy_back_wake.wait()
            # Wait for a pause in reads: no fetch in flight (an event), then no read at all
            # for COPY_BACK_IDLE_S (a deadline that each read moves: readers served from
            # the cache, the readahead ahead of them, are still restoring).
            while True:
                if self._flights:
                    await self._reads_done.wait()
                    continue
                left = self._last_read + COPY_BACK_IDLE_S - trio.current_time()
                if left <= 0:
                    break
                await trio.sleep(left)
            self.frames.clear()  # reads paused: idle receive buffers go back to the system
            digest, (ref, data, bad) = next(iter(self._copy_backs.items()))
            del self._copy_backs[digest]
            self._copy_back_bytes -= len(data)
            if digest in self._healing:
                continue
            self._healing.add(digest)
            await self._heal(ref, data, bad, True)

    async def _heal(
        self, ref: ChunkRef, data: frame.Buffer, bad: list[tuple[str, str]], copy_back: bool
    ) -> None:
        """Repair the copies a read found missing or corrupt from the good bytes it got:
        a local copy is written again (verified), a remote one is uploaded again."""
        try:
            # Only copies the catalog still lists are damage: a copy evicted (or a chunk
            # deleted) since the caller looked up the chunk is simply gone.
            listed = set(await trio.to_thread.run_sync(
                self.catalog.replica_tiers, ref.digest, limiter=self.db_limiter
            ))
            bad = [(n, why) for n, why in bad if n in listed]
            usable = {n for n in listed - {b for b, _ in bad}
                      if not self.stats.is_degraded(n) and self.residency.permits(ref.digest, n)}
            copy_back = copy_back and not any(n in self.local for n in usable)
            if not bad and not copy_back:
                return
            for name, why in bad:
                await trio.to_thread.run_sync(
                    self.catalog.mark_replica_bad, ref.digest, name, limiter=self.db_limiter
                )
                log.warning("chunk %s: copy on tier %s %s; healing it", ref.key[:16], name, why)
            local_bad = [n for n, _ in bad if n in self.local]
            remote_bad = [n for n, _ in bad if n not in self.local]
            if local_bad or copy_back or remote_bad:
                self.pins.pin(ref.digest)  # garbage collection must not drop the chunk under us
                try:
                    placed = await trio.to_thread.run_sync(
                        self._write_local_copy, ref, data, local_bad, limiter=self._bg
                    )
                    if placed is not None and not await trio.to_thread.run_sync(
                        self.catalog.add_replica_if_known, ref.digest, placed,
                        limiter=self.db_limiter,
                    ):
                        # The chunk was deleted meanwhile: the copy just made is queued
                        # for deletion (the deleter respects pins of the same content).
                        self.hooks.deletions_queued()
                        placed = None
                finally:
                    self.pins.unpin([ref.digest])
                if placed is not None:
                    self.stats.count("copy_backs" if copy_back and not local_bad else "heals")
                    log.info("chunk %s: valid copy written to local tier %s", ref.key[:16], placed)
                elif local_bad:
                    self.stats.count("heal_failures")
                else:
                    self.stats.count("copy_backs_no_room")
            for name in remote_bad:
                if not self.residency.permits(ref.digest, name):
                    self.residency.refuse("heal", name, ref.digest)
                    continue
                if await trio.to_thread.run_sync(
                    self.catalog.requeue_upload, ref.digest, name, limiter=self.db_limiter
                ):
                    self.stats.count("heals")
                    log.info("chunk %s: upload to tier %s queued again", ref.key[:16], name)
                    self.hooks.requeued()
        except CkptfsError as exc:
            self.stats.count("heal_failures")
            log.warning("chunk %s: heal failed: %s", ref.key[:16], exc)
        except Exception:
            # A bug: in the mount's nursery it would end the daemon. The copy stays bad
            # (marked, or found again by the next read), so nothing is lost by going on.
            self.stats.count("heal_failures")
            log.exception("chunk %s: heal failed unexpectedly", ref.key[:16])
        finally:
            self._healing.discard(ref.digest)

    def _write_local_copy(
        self, ref: ChunkRef, data: frame.Buffer, prefer: list[str]
    ) -> str | None:
        """Blocking (no catalog access): put a verified frame of ``data`` on a local tier,
        ``prefer``red ones first (the one whose copy was bad); None if none has room."""
        digest = ref.digest
        self.guard.wait_local_deletion(digest)  # the caller pinned it: see _write_once
        framed: list[frame.Buffer]
        key_id = frame.opened_key_id(data)
        if key_id:  # an encrypted chunk: sealed anew, never in clear
            key = KEYRING.get(key_id)
            if key is None:
                return None
            framed = [frame.seal([data], digest, key)]
        else:
            framed = frame.encode([data], digest)
        size = sum(len(p) for p in framed)
        bound = self.residency.allowed(digest)
        for name in prefer:
            tier = self.local[name]
            if self.stats.is_degraded(name):
                continue
            if not self.residency.permits(digest, name):
                self.residency.refuse("heal", name, digest)
                continue
            try:
                tier.put(ref.key, framed)
                if not tier.verified_put:
                    tier.verify(ref.key, digest)
            except (TierError, CorruptChunk, ChunkMissing) as exc:
                log.warning("chunk %s: rewriting on tier %s failed: %s", ref.key[:16], name, exc)
                continue
            self.stats.record_write(name, size - frame.HEADER_SIZE)
            return name
        try:
            return self.placement.put_somewhere(digest, framed, size, bound, "copy_back")
        except (NoSpace, TierError, ResidencyRefused):
            return None  # no room: the chunk stays on the remote, reads still work
