"""ChunkStore: writes chunks to the local tiers in parallel, reads them back verified.

* ``write`` hashes, frames, places the frame on the least busy tier with room, and reads it
  back to verify it before returning: a ChunkRef the caller holds names bytes that were
  checked on the device. The digest stays *pinned* until the caller commits or drops it, so
  garbage collection never deletes a chunk a pending commit is about to reference.
* ``read`` tries the tiers that hold a chunk, verifies the digest, falls back on a miss or a
  mismatch, and never returns unverified bytes. Concurrent reads of one chunk are merged,
  and decoded chunks are kept in a small LRU cache.

All blocking work runs in worker threads under one CapacityLimiter.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from .. import threads
from ..catalog import Catalog, ChunkRef
from ..catalog.audit import AuditRecord
from ..catalog.catalog import Backlog
from ..codec import frame
from ..codec.seal import KEYRING, KeyUnavailable, SealKey
from ..codec.staged import Staged
from ..config.model import WriteBehind
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
from ..stats import Stats
from ..supervise import contained, supervised
from ..tiers.base import Tier
from .bufpool import FramePool
from .guard import ChunkGuard
from .moves import MoveMarks
from .priority import PriorityLimiter, Ticket
from .residency import Locations, Residency, no_residency
from .room import Room


class LocalDeleter(Protocol):
    """What eviction needs of the deletion queue: delete queued local frames now."""

    async def delete_local(self, pairs: list[tuple[bytes, str]]) -> int: ...


def stats_for(tiers: Sequence[Tier]) -> Stats:
    """The live statistics of a tier set (shared by the store, the uploader, the deleter)."""
    stats = Stats()
    for t in tiers:
        stats.add_tier(t.name, t.kind)
    return stats

# A local copy dropped because a remote holds the chunk (the daemon's own work).
_EVICT = AuditRecord("evict", "")

log = logging.getLogger("ckptfs.chunks")

_UNHEALTHY_RETRY_S = 5.0
SPILL_RETRY_S = 5.0  # after a failed move of uncommitted chunks to a remote
# Writers waiting for room are woken by every upload, move and deletion (events); they also
# look again this often: room freed outside ckptfs sends no event (a real period).
ROOM_RECHECK_S = 5.0
# Without a remote only deletions free room: a writer waits this long at most for local
# frames in the deletion queue (an `rm` of the previous checkpoint just before this save).
LOCAL_DELETION_WAIT_S = 30.0
COPY_BACK_BUFFER = 256 * 1024 * 1024  # decoded chunks held for copy-back
# Chunks read to their end by sequential readers that stay cached (a late request of the
# kernel for a piece of one is still served from memory); older ones leave the cache.
CONSUMED_KEEP = 64 * 1024 * 1024
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
# fsyncs in flight at once: each waits for the device, and concurrent ones share a flush.
SYNC_THREADS = 16


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


# Uploads an uncommitted chunk (digest, length, local tiers holding it, remote tier) to a
# remote tier, verified, in a worker thread under the uploader's limiter.
SpillCopy = Callable[[bytes, int, Sequence[str], str], Awaitable[None]]


class ChunkStore:
    def __init__(
        self, tiers: Sequence[Tier], io_threads: int, cache_bytes: int, catalog: Catalog,
        db_limiter: trio.CapacityLimiter, on_local_full: str = "block",
        local_full_timeout_s: float = 600.0, *,
        guard: ChunkGuard | None = None,
        stats: Stats | None = None,
        room: Room | None = None,
        synced: set[bytes] | None = None,
        deleter: LocalDeleter | None = None,
        spill_copy: SpillCopy | None = None,
        on_requeue: Callable[[], None] | None = None,
        on_deletions: Callable[[], None] | None = None,
        remote_copies: int = 1,
        remote_reads: int | None = None,
        peer_wait_s: float = 0.0,
        write_behind: WriteBehind = "never",
        node: str = "",
        residency: Residency | None = None,
    ) -> None:
        """``guard``, ``stats``, ``room`` and ``synced`` are shared with the uploader and
        the deleter (mount.py builds them first); ``deleter`` deletes local frames at once
        (eviction), ``spill_copy`` moves uncommitted chunks to a remote (the uploader's),
        ``on_requeue`` tells the uploader of new upload jobs (a heal, a commit),
        ``on_deletions`` wakes the deleter; ``remote_reads`` GETs from remote tiers run at
        once (remote_read_concurrency; default ``io_threads``); ``peer_wait_s``: with a
        shared catalog, how long a read of a chunk only other nodes hold waits for their
        upload (peer_chunk_wait); ``node``: this node's name (it names this store's
        wants of such chunks in the catalog); ``residency``: where copies of each chunk
        may be (chunks/residency.py; None: anywhere)."""
        self.residency = residency if residency is not None else no_residency()
        self.peer_wait_s = peer_wait_s
        # Per other node (trio time): when the wait for its chunks now going on began (the
        # waits on one node share one deadline), and when such a wait last gave up (reads
        # of its chunks then fail at once for PEER_QUIET_S): a file read waits once for a
        # node that uploads nothing, not once per chunk.
        self._peer_waits: dict[str, float] = {}
        self._peer_gave_up: dict[str, float] = {}
        # Who waits, in the catalog's wants: the node, and this daemon's run of it.
        self.waiter = f"{node or 'node'}:{uuid.uuid4().hex[:8]}"
        self.tiers = {t.name: t for t in tiers}  # every tier: reads, fsync, deletion
        # New chunks land on local tiers only; remote tiers get copies from the uploader.
        self.local = {t.name: t for t in tiers if t.kind == "local"}
        self.remotes = sorted((t for t in tiers if t.kind != "local"), key=lambda t: t.name)
        if not self.local:
            raise ValueError("a ChunkStore needs at least one local tier")
        self.io = trio.CapacityLimiter(io_threads)  # local tier I/O: writes, reads
        # fsyncs wait for the device's flush, not for a core: under the writes' limiter,
        # four files fsyncing at once held every slot and the chunk writes of the other
        # files (the rest of the save) waited behind them.
        self.sync_io = trio.CapacityLimiter(max(SYNC_THREADS, io_threads))
        # GETs from remote tiers (reads, heals, prefetch staging): their own threads, so a
        # slow or hung object store cannot take the ones local I/O needs. As many as fill
        # the link (a GET's latency hides behind the others'), not as many as the disks want.
        # The chunk a reader is blocked on goes before readahead (chunks/priority.py).
        self.remote_io = PriorityLimiter(remote_reads or io_threads)
        self.catalog = catalog
        self.db_limiter = db_limiter
        self._inflight_bytes = {t.name: 0 for t in tiers}
        self._pass = {t.name: 0.0 for t in tiers}
        self._place_lock = threading.Lock()
        self._unhealthy: dict[str, float] = {}
        self._full: dict[str, float] = {}
        # Pins, deletions in flight and where uncommitted chunks are, under one lock held
        # for dict operations only (chunks/guard.py).
        self.guard = guard if guard is not None else ChunkGuard(self.local)
        self.deleter = deleter
        self.spill_copy = spill_copy
        self.remote_copies = remote_copies
        self.spilled_bytes = 0
        # The catalog's record of this node's moves (any node's deletion of a moved
        # object waits for the record's end: chunks/moves.py).
        self.room = room if room is not None else Room()
        self.moves = MoveMarks(catalog, db_limiter, self.guard, node, self.deletions_queued,
                               on_ended=self.room.hold_ended)  # a held move may go on
        self._spill_running = False
        self._spill_retry_at = -1e9  # after a failed round: a deadline
        # After a round a claimed deletion held back: the Room's ``holds_ended`` then; the
        # next round starts once it changed (an event: the claim's end, on any node).
        self._held_at: int | None = None
        self._synced: set[bytes] = synced if synced is not None else set()  # frames fsynced
        # Write-behind fsyncs in flight, and the ones that failed (not reported yet).
        self.write_behind = write_behind
        self._fsyncs_expected = False
        self._behind: dict[bytes, trio.Event] = {}
        self._behind_failed: dict[bytes, CkptfsError] = {}
        self._flights: dict[bytes, _Flight] = {}
        self._cache: OrderedDict[bytes, frame.Buffer] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        # Cached chunks a sequential reader read to their end, oldest first, with lengths.
        self._consumed: OrderedDict[bytes, int] = OrderedDict()
        self._consumed_bytes = 0
        # Chunks fetched (or being fetched) ahead of a reader and not read yet, with their
        # lengths: readahead stops at half the cache, so what it fetched is not evicted
        # unread (and fetched again) when many files are read at once.
        self._ahead: dict[bytes, int] = {}
        self._ahead_bytes = 0
        self.on_local_full = on_local_full
        self.local_full_timeout_s = local_full_timeout_s
        self.evicted_bytes = 0
        self.stats = stats if stats is not None else stats_for(tiers)
        # Receive buffers of remote GETs and of local O_DIRECT reads, reused when their
        # chunks leave the cache (chunks/bufpool.py); as many idle as GETs run at once,
        # and more while the cache has room for them: when several readers' files end
        # together, 9-10 chunks left the cache at once, and the buffers beyond 8 were
        # unmapped and made again a moment later (performance-history.md, "Cold reads on a quiet
        # VM (session 22)").
        self.frames = FramePool(keep=self.remote_io.total_tokens, count=self.stats.count,
                                room=self._cache_room)
        self._nursery: trio.Nursery | None = None
        self._healing: set[bytes] = set()
        self._bg = trio.CapacityLimiter(2)  # heals and copy-backs, besides reads and writes
        self.on_requeue = on_requeue
        self._on_deletions = on_deletions
        # Chunks to write to a local tier when reads pause, with their bad local copies.
        self._copy_backs: OrderedDict[
            bytes, tuple[ChunkRef, frame.Buffer, list[tuple[str, str]]]
        ] = OrderedDict()
        self._copy_back_bytes = 0
        self._copy_back_wake = trio.Event()
        self._last_read = -1e9  # trio time a read last asked for a chunk (cached or not)
        self._reads_done = trio.Event()  # set (and replaced) when the last fetch in flight ends

    # -- placement ---------------------------------------------------------------------------

    def _candidates(self, bound: Locations = None) -> list[Tier]:
        """Tiers in placement order: healthy first, least queued bytes per unit of weight;
        only those in the ``bound`` locations (residency)."""
        now = time.monotonic()
        local = [t for t in self.local.values() if bound is None or t.location in bound]
        usable = [
            t for t in local
            if now - self._unhealthy.get(t.name, -1e9) > _UNHEALTHY_RETRY_S
            and now - self._full.get(t.name, -1e9) > 1.0
            and not self.stats.is_degraded(t.name)  # reads failed there: a device going bad
        ]
        # Ties (nothing queued) go round-robin by weight: each placement advances the
        # chosen tier's pass by size/weight (stride scheduling).
        usable.sort(key=lambda t: (self._inflight_bytes[t.name] / t.weight, self._pass[t.name]))
        # Tiers marked bad or full are still tried last: they may have recovered.
        rest = [t for t in local if t not in usable]
        return usable + rest

    def _put_somewhere(
        self, digest: bytes, parts: Sequence[frame.Buffer], size: int, bound: Locations = None,
        what: str = "write",
    ) -> str:
        """Blocking: put the frame on the first tier (in the ``bound`` locations) that takes
        it; return the tier name. ResidencyRefused if no local tier is in them."""
        key = digest.hex()
        errors: list[CkptfsError] = []
        with self._place_lock:
            order = self._candidates(bound)
            if not order:
                self.residency.refuse(what, None, digest)
                raise ResidencyRefused(
                    f"chunk {key[:16]} may be stored only in {sorted(bound or ())}, where no "
                    f"local tier is (locations: "
                    f"{', '.join(sorted({f'{t.name}={t.location}' for t in self.local.values()}))})"
                )
            self._pass[order[0].name] += size / order[0].weight
        for tier in order:
            with self._place_lock:
                self._inflight_bytes[tier.name] += size
            try:
                tier.put(key, parts)
                if not tier.verified_put:
                    tier.verify(key, digest)  # check what the device holds, not what we sent
            except NoSpace as exc:
                self._full[tier.name] = time.monotonic()
                errors.append(exc)
                continue
            except (TierError, CorruptChunk, ChunkMissing) as exc:
                if tier.name not in self._unhealthy:
                    log.error("tier %s failed, placing chunks elsewhere: %s", tier.name, exc)
                self._unhealthy[tier.name] = time.monotonic()
                errors.append(exc)
                continue
            finally:
                with self._place_lock:
                    self._inflight_bytes[tier.name] -= size
            self._unhealthy.pop(tier.name, None)
            self._full.pop(tier.name, None)
            self.stats.record_write(tier.name, size - frame.HEADER_SIZE)
            return tier.name
        if errors and all(isinstance(e, NoSpace) for e in errors):
            raise NoSpace("no tier has room for a chunk: " + "; ".join(str(e) for e in errors))
        raise TierError("no tier could store a chunk: " + "; ".join(str(e) for e in errors))

    def remote_targets(self, digest: bytes, copies: int) -> list[str]:
        """The remote tiers that should hold a chunk: striped by digest over the remotes
        its residency allows (none: it stays on the local tiers, and is never evicted)."""
        names = [t.name for t in self.remotes]
        if self.residency.enabled:
            names = self.residency.tiers_for(digest, names)
            if not names and self.remotes:
                self.residency.refuse("upload", None, digest,
                                      "no remote tier is allowed; it stays on the local tiers")
        n = len(names)
        if n == 0:
            return []
        start = int.from_bytes(digest[:4], "big") % n
        return [names[(start + i) % n] for i in range(min(copies, n))]

    # -- room on the local tiers -----------------------------------------------------------

    def room_may_have_freed(self) -> None:
        """An upload finished or chunks were deleted: writers waiting for room look again."""
        self.room.freed()

    @property
    def waiting_for_room(self) -> int:
        """Writers blocked until uploads free local space."""
        return self.room.waiting

    @waiting_for_room.setter
    def waiting_for_room(self, n: int) -> None:
        self.room.waiting = n

    async def _make_room(self, need: int, exc: NoSpace, waited_since: float | None) -> float | None:
        """Free local space for a chunk of ``need`` bytes, or raise NoSpace. Returns when
        the caller first had to wait (None if eviction alone made room)."""
        batch = max(2 * need, 64 * 1024 * 1024)  # evict in batches: fewer catalog scans
        gen = self.room.gen
        freed = await self.evict(batch)
        if freed or self.room.gen != gen:
            self._full.clear()
            self.room_may_have_freed()  # other writers waiting for room try again too
            return waited_since
        if not self.remotes:
            if await self._wait_local_deletions(gen):
                return waited_since
            raise exc  # nothing would ever free room but a deletion by the user
        if self.on_local_full == "enospc":
            backlog = await trio.to_thread.run_sync(self.catalog.backlog, limiter=self.db_limiter)
            log.error("local tiers full and %d bytes (%d chunks) not yet on a remote: ENOSPC "
                      "(on_local_full = \"enospc\")", backlog.bytes, backlog.chunks)
            raise exc
        # The writers' own uncommitted chunks: move them to their remote tiers (a round
        # in the background, which wakes us when done), so the remote serves them and
        # their local frames make room.
        moving = self._start_spill(batch)
        backlog, deleting = await trio.to_thread.run_sync(self._outlook, limiter=self.db_limiter)
        if moving == "none" and not backlog.chunks and not deleting and self.room.gen == gen:
            # No upload job, nothing evictable, no uncommitted chunk to move, no local
            # frame queued for deletion: no event could ever free room, so waiting would
            # only delay the error.
            log.error("local tiers full and nothing can free room (no upload pending, nothing "
                      "evictable, no uncommitted chunk to move to a remote): ENOSPC")
            raise exc
        now = time.monotonic()
        if waited_since is None:
            waited_since = now
            log.warning("local tiers full; writers wait for %d bytes (%d chunks) of upload "
                        "jobs and %d bytes of uncommitted chunks to reach a remote "
                        "(on_local_full = \"block\", at most %.0f s)",
                        backlog.bytes, backlog.chunks, self.guard.movable_bytes(frame.HEADER_SIZE),
                        self.local_full_timeout_s)
        left = waited_since + self.local_full_timeout_s - now
        if left <= 0:
            log.error("local tiers still full after %.0f s of waiting for uploads: ENOSPC",
                      self.local_full_timeout_s)
            raise NoSpace(f"local tiers full, uploads did not free room in time: {exc}")
        # Woken by each finished upload, move or deletion; the deadline is the retry of
        # a move that failed, or the look for room freed outside ckptfs.
        wait = min(left, ROOM_RECHECK_S)
        if moving == "retry" and self._spill_retry_at > now:
            wait = min(wait, self._spill_retry_at - now)
        self.room.waiting += 1
        try:
            with trio.move_on_after(wait):
                await self.room.event.wait()
        finally:
            self.room.waiting -= 1
        self._full.clear()
        return waited_since

    async def _wait_local_deletions(self, gen: int) -> bool:
        """No remote tier: room comes only from deletions. While local frames wait in the
        deletion queue (the deleter drains them at once and wakes the writers), wait for
        that, at most LOCAL_DELETION_WAIT_S. True if room may have been freed."""
        with trio.move_on_after(LOCAL_DELETION_WAIT_S):
            while self.room.gen == gen:
                room = self.room.event  # taken before the look, so no wake-up is missed
                _, deleting = await trio.to_thread.run_sync(self._outlook, limiter=self.db_limiter)
                if not deleting:
                    return self.room.gen != gen
                self.room.waiting += 1
                try:
                    await room.wait()
                finally:
                    self.room.waiting -= 1
        if self.room.gen != gen:
            self._full.clear()
            return True
        log.error("local tiers full; frames in the deletion queue were not freed within %.0f s",
                  LOCAL_DELETION_WAIT_S)
        return False

    def _outlook(self) -> tuple[Backlog, bool]:
        """Blocking: the upload backlog, and whether local frames wait in the deletion
        queue (the deleter frees them and wakes the writers)."""
        local = any(b.chunks for b in self.catalog.deletion_backlog() if b.tier in self.local)
        return self.catalog.backlog(), local

    def _start_spill(self, want: int) -> str:
        """Start a round of moves unless one runs: "running", "retry" (candidates, but the
        last round failed or a deletion holds them back: the next look tries again) or
        "none" (nothing to move)."""
        if self._spill_running:
            return "running"
        if self.spill_copy is None or self._nursery is None:
            return "none"
        start = time.monotonic() >= self._spill_retry_at or (
            self._held_at is not None and self.room.holds_ended != self._held_at)
        picked, blocked = self.guard.start_moves(
            want, frame.HEADER_SIZE, lambda d: self.remote_targets(d, self.remote_copies), start
        )
        if start and self.residency.enabled:
            # A chunk no remote tier may hold keeps its local frame.
            stuck = [m for m in picked if not self.remote_targets(m[0], self.remote_copies)]
            if stuck:
                self.residency.refuse("move", None, stuck[0][0])
                self.guard.stay(d for d, _, _ in stuck)
                self.guard.end_moves(d for d, _, _ in stuck)
                picked = [m for m in picked if m not in stuck]
                if not picked:
                    return "retry" if blocked else "none"
        if not picked:
            return "retry" if blocked else "none"
        if not start:
            return "retry"
        self._spill_running = True
        self._nursery.start_soon(contained, self.stats, "spill", self._spill, picked)
        return "running"

    async def _spill(self, picked: list[tuple[bytes, int, tuple[str, ...]]]) -> None:
        """Upload uncommitted chunks (the writers' own, pinned) to their remote tiers, then
        drop their local frames; wake the writers waiting for room. Each move is recorded
        in the catalog before its PUT (chunks/moves.py); one a claimed deletion of its
        object holds back keeps its local frame until the next round."""
        freed = 0
        failed = held = False
        holds = self.room.holds_ended  # before any look: no claim's end is missed

        async def one(digest: bytes, length: int, sources: tuple[str, ...]) -> None:
            nonlocal freed, failed, held
            targets = self.remote_targets(digest, self.remote_copies)
            assert self.spill_copy is not None
            try:
                if self.moves.ending(digest) or not await self.moves.begin(
                    digest, length, targets
                ):
                    # A node deletes that object now: a PUT could land before its DELETE.
                    if not held:
                        log.info("move of uncommitted chunk %s waits for a deletion of its "
                                 "remote object in progress (until that claim ends)",
                                 digest.hex()[:16])
                    held = True
                    self.stats.count("moves_held")
                    return
                for target in targets:
                    await self.spill_copy(digest, length, sources, target)
            except CkptfsError as exc:
                if not failed:
                    log.warning("could not move uncommitted chunk %s to a remote tier (retry "
                                "in %.0f s): %s", digest.hex()[:16], SPILL_RETRY_S, exc)
                failed = True
                return
            drop = await trio.to_thread.run_sync(
                self._after_spill, digest, sources, targets, limiter=self.db_limiter
            )
            if drop:
                freed += await self._drop_moved(drop)

        def unknown(digests: list[bytes]) -> set[bytes]:
            # A chunk a committed file names too (same content) keeps its local copy.
            return {d for d in digests if not self.catalog.has_chunk(d)}

        try:
            fresh = await trio.to_thread.run_sync(
                unknown, [d for d, _, _ in picked], limiter=self.db_limiter
            )
            self.guard.stay(d for d, _, _ in picked if d not in fresh)
            async with trio.open_nursery() as n:
                for digest, length, sources in picked:
                    if digest in fresh:
                        n.start_soon(one, digest, length, sources)
        finally:
            self.guard.end_moves(d for d, _, _ in picked)
            self._spill_running = False
            self._spill_retry_at = time.monotonic() + SPILL_RETRY_S if failed else -1e9
            self._held_at = holds if held and not failed else None
            self.moves.settle()  # chunks dropped while they moved: their records end
        if freed:
            self.spilled_bytes += freed
            log.info("moved %d bytes of uncommitted chunks to the remote tiers to make room "
                     "on the local ones", freed)
            self._full.clear()
        self.room_may_have_freed()  # moved, or nothing to move: the writers look again

    def _after_spill(
        self, digest: bytes, sources: tuple[str, ...], targets: list[str]
    ) -> list[tuple[bytes, str]]:
        """Blocking (under the catalog limiter, which commits take too, so no commit of
        this chunk runs meanwhile): the remote copies of an uncommitted chunk are stored.
        Record them where the writers find them, and return its local frames, marked as
        being deleted, to drop. A chunk dropped while it moved keeps nothing: the end of
        its move's record (after the round) queues the copies for deletion unless
        something wants them (a commit of the same bytes: its upload job writes the same
        objects again)."""
        committed = self.catalog.has_chunk(digest)
        known = set(self.catalog.replica_tiers(digest)) if committed else set()
        _, drop = self.guard.moved(digest, sources, targets, known)
        return drop

    async def _drop_moved(self, drop: list[tuple[bytes, str]]) -> int:
        """Delete the local frames of a moved uncommitted chunk (no catalog row names them;
        the guard marks them as being deleted, so a writer of the same bytes waits or
        shares the remote copy). A frame that will not go is queued for the deleter."""
        failed: list[tuple[bytes, str]] = []

        def work() -> int:
            freed = 0
            for digest, name in drop:
                try:
                    freed += self.local[name].delete(digest.hex())
                except TierError as exc:
                    log.warning("could not delete moved chunk %s: %s", digest.hex()[:16], exc)
                    failed.append((digest, name))
            return freed

        try:
            freed = await trio.to_thread.run_sync(work, limiter=self.io)
        finally:
            self.forget_frames(d for d, _ in drop)  # before a waiting writer puts it again
            self.guard.end_delete(drop)
        if failed:
            await trio.to_thread.run_sync(
                self.catalog.queue_deletions, failed, limiter=self.db_limiter
            )
            self.deletions_queued()
        return freed

    def current(self, ref: ChunkRef) -> ChunkRef:
        """``ref`` with the tiers that hold it now, if it is an uncommitted chunk."""
        tiers = self.guard.current(ref.digest)
        if tiers is None or tiers == ref.tiers:
            return ref
        return ChunkRef(ref.digest, ref.length, tiers)

    def _evict(self, want: int) -> list[tuple[bytes, str, int]]:
        """Blocking (catalog only): turn local replicas of chunks a remote tier holds into
        deletion rows, oldest files first, about ``want`` bytes' worth. Never a chunk still
        to upload. Returns the rows queued (digest, tier, frame bytes)."""
        remote_names = [t.name for t in self.remotes]
        if not remote_names:
            return []
        queued: list[tuple[bytes, str, int]] = []
        total = 0
        candidates = self.catalog.eviction_candidates(
            list(self.local), remote_names, limit=max(1, want // 65536)
        )
        for digest, tier_name, length in candidates:
            if total >= want:
                break
            if self.guard.pinned(digest):
                continue  # a writer is about to commit it here (the deleter would hold it)
            # Only a copy on a remote its residency allows counts (reads skip the others).
            remotes = self._allowed_remotes(digest, remote_names)
            if remotes and self.catalog.forget_local_replica(digest, tier_name, remotes,
                                                                      audit=_EVICT):
                queued.append((digest, tier_name, length + frame.HEADER_SIZE))
                total += length + frame.HEADER_SIZE
        return queued

    async def evict(self, want: int) -> int:
        """Evict about ``want`` bytes of local copies a remote holds, now: queue their
        deletion and delete the local frames at once. Returns the bytes freed."""
        queued = await trio.to_thread.run_sync(self._evict, want, limiter=self.db_limiter)
        if not queued or self.deleter is None:
            return 0
        freed = await self.deleter.delete_local([(d, t) for d, t, _ in queued])
        if freed:
            self.evicted_bytes += freed
            log.info("evicted %d bytes of chunks held by a remote tier from the local tiers",
                     freed)
        return freed

    def evict_digests(self, digests: Iterable[bytes]) -> int:
        """Blocking (under the catalog limiter): queue the deletion of the local copies of
        these chunks where a remote tier holds them and no upload needs them. Returns the
        bytes queued (the deleter frees them)."""
        remote_names = [t.name for t in self.remotes]
        if not remote_names:
            return 0
        queued = 0
        for digest in digests:
            if self.guard.pinned(digest):
                continue
            remotes = self._allowed_remotes(digest, remote_names)
            for name in self.catalog.replica_tiers(digest):
                if name in self.local and remotes and self.catalog.forget_local_replica(
                    digest, name, remotes, audit=_EVICT
                ):
                    queued += self.catalog.chunk_length(digest) + frame.HEADER_SIZE
        self.evicted_bytes += queued
        return queued

    def _allowed_remotes(self, digest: bytes, remote_names: list[str]) -> list[str]:
        remotes = self.residency.tiers_for(digest, remote_names)
        if not remotes:
            self.residency.refuse("evict", None, digest, "no allowed remote tier holds it")
        return remotes

    def deletions_queued(self) -> None:
        """Rows were added to the deletion queue: wake the deleter."""
        if self._on_deletions is not None:
            self._on_deletions()

    def forget_frames(self, digests: Iterable[bytes]) -> None:
        """These frames were deleted: a frame put again later is not known synced."""
        for d in digests:
            self._synced.discard(d)
            self._behind_failed.pop(d, None)

    def local_fill(self) -> tuple[int, int]:
        """Blocking: (bytes in use, bytes in all) over the local tiers: a capped tier counts
        its cap, an uncapped one its device (once per device, whoever fills it)."""
        used = total = 0
        seen: set[int] = set()
        for t in self.local.values():
            try:
                u = t.usage()
            except CkptfsError:
                continue
            if u.capped or u.device not in seen:
                used += u.total - u.free
                total += u.total
                seen.add(u.device)
        return used, total

    # -- pins --------------------------------------------------------------------------------

    def _pin(self, digest: bytes) -> None:
        self.guard.pin(digest)

    def unpin(self, digests: Iterable[bytes]) -> None:
        """On the trio thread (worker threads call the guard's)."""
        self.guard.unpin(digests)
        self.moves.settle()

    def release(self, refs: Iterable[ChunkRef]) -> list[ChunkRef]:
        """Unpin these chunks; returns them with the tiers holding them as the pins went
        (a chunk a full local tier moved to a remote: its remote copies), for ``collect``."""
        refs = list(refs)
        now = self.guard.unpin(r.digest for r in refs)
        # Moved chunks no longer uncommitted: committed (their replica rows protect the
        # objects now) or dropped (the objects are queued for deletion).
        self.moves.settle()
        return [
            r if not now.get(r.digest) or now[r.digest] == r.tiers
            else ChunkRef(r.digest, r.length, now[r.digest])
            for r in refs
        ]

    # -- write -------------------------------------------------------------------------------

    async def write(
        self, data: Sequence[frame.Buffer] | Staged, allowed: Locations = None,
        namespace: str | None = None,
    ) -> ChunkRef:
        """Store one chunk (given as parts, or staged in place: its frame is written from
        where it lies) and return a verified, pinned reference to it. ``allowed``: the
        locations the writer's namespace allows (residency); ResidencyRefused (EIO) if
        no local tier is in them and those of the chunk's other namespaces. ``namespace``:
        an encrypted namespace's path: the chunk is sealed with its newest key (its id is
        keyed, codec/seal.py); None: a plain frame, as always.
        When every local tier is full, make room (evict chunks a remote holds, or wait for
        uploads per ``on_local_full``) and try again; NoSpace when that fails."""
        waited_since: float | None = None
        while True:
            gen = self.room.gen
            try:
                ref = await self._write_once(data, allowed, namespace)
            except NoSpace as exc:
                if self.room.gen != gen:
                    continue  # room was freed meanwhile (another writer evicted): try again
                n = data.length if isinstance(data, Staged) else sum(len(p) for p in data)
                waited_since = await self._make_room(n + frame.HEADER_SIZE, exc, waited_since)
                continue
            if waited_since is not None:
                log.warning("local tiers have room again after %.1f s",
                            time.monotonic() - waited_since)
            if self._write_behind_now():
                self._start_sync_behind(ref)
            return ref

    # -- write-behind fsync ------------------------------------------------------------------

    def _write_behind_now(self) -> bool:
        mode = self.write_behind
        return self._nursery is not None and (
            mode == "always" or (mode == "auto" and self._fsyncs_expected)
        )

    def note_commit(self, synced: bool, new_chunks: bool) -> None:
        """A file committed new chunks, by an fsync or by a close alone: saves that fsync
        their files get their frames fsynced as each one is written (``write_behind =
        "auto"``); saves that only close do not pay for flushes nobody asked for."""
        if new_chunks:
            self._fsyncs_expected = synced

    def _start_sync_behind(self, ref: ChunkRef) -> None:
        if ref.digest in self._synced or ref.digest in self._behind:
            return
        local = [self.local[t] for t in ref.tiers if t in self.local]
        if not local:
            return
        done = trio.Event()
        self._behind[ref.digest] = done
        assert self._nursery is not None
        self._nursery.start_soon(contained, self.stats, "sync-behind", self._sync_behind,
                                 ref.digest, ref.key, local, done)

    async def _sync_behind(
        self, digest: bytes, key: str, tiers: list[Tier], done: trio.Event
    ) -> None:
        """fsync one frame just written, in the background (the save goes on), so the
        file's own fsync finds little left to flush. A failure is kept for that fsync to
        report: the kernel reports a writeback error to one fsync only, so trying again
        there could succeed although the frame was not synced."""
        try:
            for tier in tiers:
                await trio.to_thread.run_sync(tier.sync, [key], limiter=self.sync_io)
        except CkptfsError as exc:
            log.error("fsync on tier %s failed: %s", tier.name, exc)
            self._behind_failed[digest] = exc
        else:
            self._synced.add(digest)
            self.stats.count("write_behind_syncs")
        finally:
            del self._behind[digest]
            done.set()

    async def _write_once(
        self, data: Sequence[frame.Buffer] | Staged, allowed: Locations = None,
        namespace: str | None = None,
    ) -> ChunkRef:
        key = None
        if namespace is not None:
            key = KEYRING.current(namespace)
            if key is None:
                raise KeyUnavailable(f"no key of encrypted namespace {namespace} is loaded")

        def work() -> ChunkRef:
            staged: Staged | None = None
            parts: Sequence[frame.Buffer]
            if isinstance(data, Staged):
                staged, parts = data, (data.body(),)
            else:
                parts = data
            # An encrypted namespace's chunk id is keyed (codec/seal.py).
            digest = frame.digest_of_parts(parts) if key is None else key.chunk_id(parts)
            # Noted before the put: another file's copy of the same bytes obeys it too.
            # Not a write that is refused (no local tier where the chunk's namespaces all
            # allow): it commits nothing, and must not make the others' copies unreadable.
            bound = self.residency.allowed(digest, allowed)
            if bound is None or any(t.location in bound for t in self.local.values()):
                self.residency.note([digest], allowed)
            # Pinned before the put, and never put while a local deletion of the same
            # frame is in flight (it would remove the frame after our put), unless another
            # open file stored the same bytes and has not committed: then share its copy
            # (which a full local tier may move to a remote).
            within = None if bound is None else frozenset(
                self.residency.tiers_for(digest, list(self.tiers), bound)
            )
            shared = self.guard.pin_for_put(digest, within)
            if shared is not None:
                return ChunkRef(digest, shared.length, shared.tiers)
            if key is not None:
                return self._put_sealed(parts, digest, key, bound)
            try:
                # A staged chunk's frame is the buffer it lies in (the header goes before
                # it): the bytes just hashed are the ones the tier writes.
                framed = frame.encode(parts, digest) if staged is None else [staged.frame(digest)]
                size = sum(len(p) for p in framed)
                tier = self._put_somewhere(digest, framed, size, bound)
            except BaseException:
                self.guard.put_done(digest, None, 0)
                # The guard's own: this is a worker thread (the moves' records are the
                # trio thread's; the next unpin there ends any this leaves).
                self.guard.unpin([digest])
                raise
            self.guard.put_done(digest, tier, size - frame.HEADER_SIZE)
            return ChunkRef(digest, size - frame.HEADER_SIZE, (tier,))

        # The lighter thread call (ckptfs/threads.py): a small file's close makes this one
        # and its commit, each a thread hop.
        return await threads.run_sync(work, limiter=self.io)

    def _put_sealed(self, parts: Sequence[frame.Buffer], digest: bytes, key: SealKey,
                    bound: Locations) -> ChunkRef:
        """Blocking, pinned: the put of ``_write_once`` for a chunk of an encrypted
        namespace: its frame sealed into a reused page-aligned buffer (O_DIRECT writes it as
        it lies) and placed like any frame, where its residency allows (the tier compares
        what it wrote with that buffer)."""
        n = sum(len(p) for p in parts)
        buf = self.frames.take(frame.sealed_size(n))
        try:
            framed = [frame.seal(parts, digest, key, buf)]
            size = len(framed[0])
            tier = self._put_somewhere(digest, framed, size, bound)
        except BaseException:
            self.guard.put_done(digest, None, 0)
            self.guard.unpin([digest])  # a worker thread: as in _write_once
            raise
        finally:
            framed = []
            if buf is not None:
                self.frames.give(buf)
        self.guard.put_done(digest, tier, n)
        return ChunkRef(digest, n, (tier,))

    def forget_keys(self, key_ids: set[int]) -> None:
        """Keys were shredded: cached plaintext they sealed leaves the cache (reads of it
        go to the tiers, where its frames no longer open)."""
        for digest, data in list(self._cache.items()):
            if frame.opened_key_id(data) in key_ids:
                self._uncache(digest)

    async def sync_catalog(self) -> None:
        """fsync the catalog (after the chunk frames it names)."""
        await trio.to_thread.run_sync(self.catalog.sync, limiter=self.db_limiter)

    async def sync(self, refs: Iterable[ChunkRef]) -> None:
        """fsync chunk frames not yet known to be synced: every frame in its own thread,
        all at once (up to ``sync_io``). Concurrent fsyncs on one filesystem share its
        journal commits and cache flushes (ext4, XFS); one after the other, each frame of
        each file paid a flush of its own, and four files fsyncing at once queued up."""
        refs = list(refs)
        for ref in refs:
            behind = self._behind.get(ref.digest)
            if behind is not None:
                await behind.wait()
        failed = [self._behind_failed.pop(r.digest) for r in refs if r.digest in self._behind_failed]
        if failed:
            raise failed[0]
        pairs: list[tuple[Tier, str]] = []
        todo = []
        for ref in map(self.current, refs):
            if ref.digest in self._synced:
                continue
            todo.append(ref.digest)
            pairs += [(self.tiers[t], ref.key) for t in ref.tiers if t in self.tiers]
        if not pairs:
            return
        errors: list[CkptfsError] = []

        async def one(tier: Tier, key: str) -> None:
            try:
                await trio.to_thread.run_sync(tier.sync, [key], limiter=self.sync_io)
            except CkptfsError as exc:
                log.error("fsync on tier %s failed: %s", tier.name, exc)
                errors.append(exc)

        async with trio.open_nursery() as n:
            for tier, key in pairs:
                n.start_soon(one, tier, key)
        if errors:
            raise errors[0]
        self._synced.update(todo)

    # -- read --------------------------------------------------------------------------------

    def _cache_room(self) -> int:
        """Bytes the read cache could still take: what idle receive buffers may hold."""
        return max(0, self._cache_limit - self._cache_bytes)

    def _cache_put(self, digest: bytes, data: frame.Buffer) -> None:
        if len(data) > self._cache_limit:
            return
        if digest in self._cache:
            self._cache.move_to_end(digest)
            return
        self._cache[digest] = data
        self._cache_bytes += len(data)
        while self._cache_bytes > self._cache_limit:
            self._uncache(next(iter(self._cache)))

    def _uncache(self, digest: bytes) -> None:
        """The chunk leaves the cache; its receive buffer goes back to the pool."""
        data = self._cache.pop(digest, None)
        if data is None:
            return
        self._cache_bytes -= len(data)
        self._unconsume(digest)
        self.forget_ahead([digest])
        self._recycle(data)

    def consumed(self, digest: bytes) -> None:
        """A sequential reader read this chunk to its end: it is the first to go when the
        cache is full, before the chunks the readahead fetched for what comes next (plain
        LRU evicted those, unread, and they were fetched again). Beyond CONSUMED_KEEP bytes
        of such chunks the oldest leave the cache at once, so their receive buffers are
        reused by the next reads: a restore otherwise filled the whole cache with chunks
        read to their end before any buffer came back, and every read until then faulted
        in fresh pages (the kernel zeroing 16 MiB per chunk)."""
        data = self._cache.get(digest)
        if data is None:
            return
        self._cache.move_to_end(digest, last=False)
        if digest not in self._consumed:
            self._consumed[digest] = len(data)
            self._consumed_bytes += len(data)
        while self._consumed_bytes > CONSUMED_KEEP:
            self._uncache(next(iter(self._consumed)))

    def _read_again(self, digest: bytes) -> None:
        """A cached chunk is read again. One read to its end stays among the consumed
        chunks, as the newest: the usual cause is a late request of the kernel for an
        earlier piece of it (pyfuse3 runs requests concurrently, so the last MiB of a chunk
        is often answered before the one before it). Taking it out of them, as before, kept
        it and its receive buffer in the cache until the LRU limit: a 1 GiB cold read grew
        the cache to 19 chunks and read 42 % of its chunks into fresh buffers (profile,
        performance-history.md "Cold read profile (session 21)"). A reader that really comes back
        to it keeps it for another CONSUMED_KEEP bytes of consumed chunks."""
        if digest in self._consumed:
            self._consumed.move_to_end(digest)

    def _unconsume(self, digest: bytes) -> None:
        n = self._consumed.pop(digest, None)
        if n is not None:
            self._consumed_bytes -= n

    def _recycle(self, data: frame.Buffer) -> None:
        """A chunk left the cache: its receive buffer (if a GET read it into one of the
        pool's) is reused once no reply or copy-back views it any more."""
        if isinstance(data, memoryview):
            self.frames.give(data.obj)

    def reserve_ahead(self, ref: ChunkRef) -> bool:
        """Room to fetch this chunk ahead of its reader: True (and counted until it is
        read, evicted or forgotten) if the chunks fetched ahead and not read yet stay
        within half the cache."""
        if ref.digest in self._ahead:
            return True
        if self._ahead and self._ahead_bytes + ref.length > self._cache_limit // 2:
            return False
        self._ahead[ref.digest] = ref.length
        self._ahead_bytes += ref.length
        return True

    def forget_ahead(self, digests: Iterable[bytes]) -> None:
        """These chunks no longer count as fetched ahead (read, evicted, or their
        readahead ended without them)."""
        for d in digests:
            n = self._ahead.pop(d, None)
            if n is not None:
                self._ahead_bytes -= n

    def cached(self, digest: bytes) -> bool:
        """True if reading this chunk costs no new device read (cached or being fetched)."""
        return digest in self._cache or digest in self._flights

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
            self.forget_ahead([ref.digest])
        while True:
            data = self._cache.get(ref.digest)
            if data is not None:
                self._cache.move_to_end(ref.digest)
                self._read_again(ref.digest)
                return data
            ref = self.current(ref)
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
                tiers = self.current(ref).tiers
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
            if got.data is None and self.catalog.shared:
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
            self._cache_put(ref.digest, got.data)
            self._after_read(ref, got, copy_back)
        except CkptfsError as exc:
            if log_missing or not isinstance(exc, ChunkMissing):
                log.error("%s", exc)
            flight.error = exc
        finally:
            # Cancelled (a readahead whose file was released): neither data nor error,
            # and the readers that joined fetch the chunk themselves.
            del self._flights[ref.digest]
            if ref.digest not in self._cache:
                self.forget_ahead([ref.digest])  # not fetched (or not kept): nothing ahead
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

    # -- healing and copy-back ---------------------------------------------------------------

    def attach(self, nursery: trio.Nursery) -> None:
        """Where background heals and copy-backs run (the mount's nursery)."""
        self._nursery = nursery
        self.moves.attach(nursery)
        nursery.start_soon(supervised, self.stats, "copy-backs", self.run_copy_backs)

    def _after_read(self, ref: ChunkRef, got: _Fetched, copy_back: bool) -> None:
        if self._nursery is None or got.data is None or got.source is None:
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
            self._nursery.start_soon(contained, self.stats, "heal", self._heal, ref, got.data,
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
                self._nursery.start_soon(contained, self.stats, "mark-bad", self._mark_bad,
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
        self._pin(ref.digest)
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
                self.deletions_queued()  # the copy just made is queued for deletion
                return True  # the chunk is gone: nothing to stage
        finally:
            self.unpin([ref.digest])
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
                self._pin(ref.digest)  # garbage collection must not drop the chunk under us
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
                        self.deletions_queued()
                        placed = None
                finally:
                    self.unpin([ref.digest])
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
                    if self.on_requeue is not None:
                        self.on_requeue()
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
            return self._put_somewhere(digest, framed, size, bound, "copy_back")
        except (NoSpace, TierError, ResidencyRefused):
            return None  # no room: the chunk stays on the remote, reads still work

    # -- garbage collection ------------------------------------------------------------------

    async def collect(self, refs: Iterable[ChunkRef]) -> None:
        """Drop the chunks among ``refs`` that nothing references any more: one catalog
        transaction moves their rows to the deletion queue; the deleter removes the frames
        (never one a pin or a new reference wants)."""
        by_digest: dict[bytes, set[str]] = {}
        for ref in map(self.current, refs):
            by_digest.setdefault(ref.digest, set()).update(
                t for t in ref.tiers if t in self.tiers
            )
        if not by_digest:
            return
        # A pinned digest is about to be committed again: leave its rows (its pinner
        # collects it if that commit does not happen).
        candidates = {d: t for d, t in by_digest.items() if not self.guard.pinned(d)}
        if not candidates:
            return
        gone = await trio.to_thread.run_sync(
            self.catalog.drop_unreferenced, list(candidates), candidates, limiter=self.db_limiter
        )
        self.collected(gone)

    def collect_digests_blocking(self, digests: Iterable[bytes]) -> dict[bytes, list[str]]:
        """``collect`` of chunks that lost a reference (no tiers of the caller's), for a
        caller already in the catalog thread (under the catalog limiter): one thread hop
        less per unlink. The caller passes the result to ``collected`` on the trio thread."""
        candidates = [d for d in set(digests) if not self.guard.pinned(d)]  # guard: a lock
        return self.catalog.drop_unreferenced(candidates) if candidates else {}

    def collected(self, gone: dict[bytes, list[str]]) -> None:
        """On the trio thread, after the catalog moved these chunks to the deletion queue."""
        if gone:
            self.stats.count("chunks_deleted", len(gone))
            self.deletions_queued()
        self.forget_ahead(gone)
        for digest in gone:
            self._uncache(digest)
