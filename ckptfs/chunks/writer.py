"""The chunk writer: places each new chunk on a local tier (verified, pinned), makes room
when the local tiers are full (eviction, waiting for uploads, moving the writers' own
uncommitted chunks to a remote tier), fsyncs frames behind the writes (write-behind) and
on request, and names the remote tiers a committed chunk is uploaded to."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from .. import threads
from ..catalog import ChunkRef
from ..catalog.catalog import Backlog
from ..catalog.protocols import ContentsCatalog, DeletionQueue, ReplicaCatalog, UploadQueue
from ..codec import frame
from ..codec.seal import KEYRING, KeyUnavailable, SealKey
from ..codec.staged import Staged
from ..errors import CkptfsError, NoSpace, TierError
from ..supervise import contained
from ..tiers.base import Tier
from .bufpool import FramePool
from .parts import Background, Limiters, Pins, SpillCopy, StoreHooks, StorePolicy, TierSet
from .placement import Placement
from .residency import Locations
from .room import Room

log = logging.getLogger("ckptfs.chunks")

SPILL_RETRY_S = 5.0  # after a failed move of uncommitted chunks to a remote
# Writers waiting for room are woken by every upload, move and deletion (events); they also
# look again this often: room freed outside ckptfs sends no event (a real period).
ROOM_RECHECK_S = 5.0
# Without a remote only deletions free room: a writer waits this long at most for local
# frames in the deletion queue (an `rm` of the previous checkpoint just before this save).
LOCAL_DELETION_WAIT_S = 30.0


@dataclass
class _SpillRound:
    """What the concurrent moves of one spill round report back to it."""

    freed: int = 0  # bytes of local frames dropped
    failed: bool = False  # a move failed: the next round waits SPILL_RETRY_S
    held: bool = False  # a claimed deletion of a remote object held a move back


class WriterCatalog(ContentsCatalog, ReplicaCatalog, UploadQueue, DeletionQueue, Protocol):
    """What the writer asks of the catalog: the backlogs (is waiting for room useful?),
    whether a moved chunk is committed, where its copies are, the deletion of moved frames
    that would not go."""


class ChunkWriter:
    def __init__(
        self, tiers: TierSet, catalog: WriterCatalog, limiters: Limiters, policy: StorePolicy,
        *, placement: Placement, pins: Pins, room: Room, synced: set[bytes],
        frames: FramePool, evict: Callable[[int], Awaitable[int]],
        spill_copy: SpillCopy | None, hooks: StoreHooks, background: Background,
    ) -> None:
        """``synced``: frames known fsynced (shared with the deleter, which forgets deleted
        ones); ``frames``: the reused buffers encrypted frames are sealed into; ``evict``:
        drops local copies a remote holds (chunks/gc.py); ``spill_copy`` moves uncommitted
        chunks to a remote (the uploader's)."""
        self.tiers = tiers.tiers
        self.local = tiers.local
        self.remotes = tiers.remotes
        self.residency = tiers.residency
        self.stats = tiers.stats
        self.remote_targets = tiers.remote_targets
        self.catalog = catalog
        self.io, self.sync_io, self.db_limiter = limiters.io, limiters.sync_io, limiters.db
        self.placement = placement
        self.pins = pins
        self.guard = pins.guard
        self.moves = pins.moves
        self.room = room
        self.frames = frames
        self._evict = evict
        self.hooks = hooks
        self.background = background
        self.spill_copy = spill_copy
        self.remote_copies = policy.remote_copies
        self.on_local_full = policy.on_local_full
        self.local_full_timeout_s = policy.local_full_timeout_s
        self.spilled_bytes = 0
        self._spill_running = False
        self._spill_retry_at = -1e9  # after a failed round: a deadline
        # After a round a claimed deletion held back: the Room's ``holds_ended`` then; the
        # next round starts once it changed (an event: the claim's end, on any node).
        self._held_at: int | None = None
        self._synced = synced  # frames fsynced
        # Write-behind fsyncs in flight, and the ones that failed (not reported yet).
        self.write_behind = policy.write_behind
        self._fsyncs_expected = False
        self._behind: dict[bytes, trio.Event] = {}
        self._behind_failed: dict[bytes, CkptfsError] = {}

    def upload_targets(self, digests: Iterable[bytes]) -> dict[bytes, list[str]] | None:
        """The remote tiers each of these chunks is to be uploaded to (a commit's upload
        jobs); None without a remote tier."""
        if not self.remotes:
            return None
        return {d: self.remote_targets(d, self.remote_copies) for d in digests}

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
                tier = self.placement.put_somewhere(digest, framed, size, bound)
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
            tier = self.placement.put_somewhere(digest, framed, size, bound)
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

    def _write_behind_now(self) -> bool:
        mode = self.write_behind
        return self.background.nursery is not None and (
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
        assert self.background.nursery is not None
        self.background.nursery.start_soon(contained, self.stats, "sync-behind", self._sync_behind,
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
        for ref in map(self.pins.current, refs):
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

    def forget_frames(self, digests: Iterable[bytes]) -> None:
        """These frames were deleted: a frame put again later is not known synced."""
        for d in digests:
            self._synced.discard(d)
            self._behind_failed.pop(d, None)

    def room_may_have_freed(self) -> None:
        """An upload finished or chunks were deleted: writers waiting for room look again."""
        self.room.freed()

    async def _make_room(self, need: int, exc: NoSpace, waited_since: float | None) -> float | None:
        """Free local space for a chunk of ``need`` bytes, or raise NoSpace. Returns when
        the caller first had to wait (None if eviction alone made room)."""
        batch = max(2 * need, 64 * 1024 * 1024)  # evict in batches: fewer catalog scans
        gen = self.room.gen
        freed = await self._evict(batch)
        if freed or self.room.gen != gen:
            self.placement.clear_full()
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
        self.placement.clear_full()
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
            self.placement.clear_full()
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
        if self.spill_copy is None or self.background.nursery is None:
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
        self.background.nursery.start_soon(contained, self.stats, "spill", self._spill, picked)
        return "running"

    async def _spill(self, picked: list[tuple[bytes, int, tuple[str, ...]]]) -> None:
        """Upload uncommitted chunks (the writers' own, pinned) to their remote tiers, then
        drop their local frames; wake the writers waiting for room. Each move is recorded
        in the catalog before its PUT (chunks/moves.py); one a claimed deletion of its
        object holds back keeps its local frame until the next round."""
        spill = _SpillRound()
        holds = self.room.holds_ended  # before any look: no claim's end is missed
        try:
            fresh = await trio.to_thread.run_sync(
                self._unknown_chunks, [d for d, _, _ in picked], limiter=self.db_limiter
            )
            self.guard.stay(d for d, _, _ in picked if d not in fresh)
            async with trio.open_nursery() as n:
                for digest, length, sources in picked:
                    if digest in fresh:
                        n.start_soon(self._spill_one, spill, digest, length, sources)
        finally:
            self.guard.end_moves(d for d, _, _ in picked)
            self._spill_running = False
            self._spill_retry_at = time.monotonic() + SPILL_RETRY_S if spill.failed else -1e9
            self._held_at = holds if spill.held and not spill.failed else None
            self.moves.settle()  # chunks dropped while they moved: their records end
        if spill.freed:
            self.spilled_bytes += spill.freed
            log.info("moved %d bytes of uncommitted chunks to the remote tiers to make room "
                     "on the local ones", spill.freed)
            self.placement.clear_full()
        self.room_may_have_freed()  # moved, or nothing to move: the writers look again

    async def _spill_one(
        self, spill: _SpillRound, digest: bytes, length: int, sources: tuple[str, ...]
    ) -> None:
        """One chunk of a spill round: record the move, PUT it, drop its local frames."""
        targets = self.remote_targets(digest, self.remote_copies)
        assert self.spill_copy is not None
        try:
            if self.moves.ending(digest) or not await self.moves.begin(
                digest, length, targets
            ):
                # A node deletes that object now: a PUT could land before its DELETE.
                if not spill.held:
                    log.info("move of uncommitted chunk %s waits for a deletion of its "
                             "remote object in progress (until that claim ends)",
                             digest.hex()[:16])
                spill.held = True
                self.stats.count("moves_held")
                return
            for target in targets:
                await self.spill_copy(digest, length, sources, target)
        except CkptfsError as exc:
            if not spill.failed:
                log.warning("could not move uncommitted chunk %s to a remote tier (retry "
                            "in %.0f s): %s", digest.hex()[:16], SPILL_RETRY_S, exc)
            spill.failed = True
            return
        drop = await trio.to_thread.run_sync(
            self._after_spill, digest, sources, targets, limiter=self.db_limiter
        )
        if drop:
            # Awaited first: ``spill.freed += await ...`` reads the total before the await,
            # and the round's other chunks add to it meanwhile (their bytes were lost).
            freed = await self._drop_moved(drop)
            spill.freed += freed

    def _unknown_chunks(self, digests: list[bytes]) -> set[bytes]:
        # A chunk a committed file names too (same content) keeps its local copy.
        return {d for d in digests if not self.catalog.has_chunk(d)}

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
            self.hooks.deletions_queued()
        return freed
