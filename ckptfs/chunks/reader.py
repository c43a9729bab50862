"""The chunk reader: returns the verified plaintext of a chunk. It tries the tiers that
hold it (the fastest first), verifies the digest, falls back on a miss or a mismatch and
never returns unverified bytes; concurrent reads of one chunk are merged, and decoded
chunks are kept in the read cache (chunks/cache.py). A chunk only another node holds is
waited for (a shared catalog); copies found missing or corrupt are healed, and chunks
read from a remote only are copied back to a local tier when reads pause."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Protocol

import trio

from ..catalog import ChunkRef
from ..catalog.protocols import UploadQueue
from ..codec import frame
from ..codec.seal import KEYRING
from ..errors import (
    ChunkMissing,
    CkptfsError,
    CorruptChunk,
    NoSpace,
    ResidencyRefused,
    TierError,
)
from ..supervise import contained
from .cache import ReadCache
from .fetch import Fetched, TierFetcher
from .guard import ChunkGuard
from .parts import Background, Limiters, Pins, StoreHooks, TierSet
from .peers import PeerCatalog, PeerWaits
from .placement import Placement
from .priority import Ticket

log = logging.getLogger("ckptfs.chunks")

COPY_BACK_BUFFER = 256 * 1024 * 1024  # decoded chunks held for copy-back
COPY_BACK_IDLE_S = 0.2  # copy-backs wait for reads to pause this long


class ReaderCatalog(PeerCatalog, UploadQueue, Protocol):
    """What the reader asks of the catalog: where a chunk's copies are (and which are bad),
    other nodes' sessions and wants, and the upload jobs of healed remote copies."""


class _Flight:
    """One in-progress fetch of a chunk that other readers can wait on."""

    def __init__(self, urgent: bool) -> None:
        self.done = trio.Event()
        self.data: frame.Buffer | None = None
        self.error: CkptfsError | None = None
        # Its place in the queue for a remote GET: a readahead's is promoted when a
        # reader comes to wait for the chunk.
        self.ticket = Ticket(urgent)


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
        self.fetcher = TierFetcher(tiers, limiters, cache.frames)
        self.peers = PeerWaits(catalog, limiters.db, self.tiers, peer_wait_s, node)
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
            got = await self.fetcher.fetch(ref, abandon, flight.ticket)
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
                    again = await self.fetcher.fetch(fresh, abandon, flight.ticket)
                    again.failures[:0] = got.failures
                    again.problems[:0] = got.problems
                    got = again
            if got.data is None and self.shared:
                got = await self.peers.await_peer(ref, got, abandon, flight.ticket, self.fetcher.fetch)
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

    def _after_read(self, ref: ChunkRef, got: Fetched, copy_back: bool) -> None:
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
        self, ref: ChunkRef, got: Fetched, abandon: bool, ticket: Ticket
    ) -> Fetched:
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
            again = await self.fetcher.fetch(ChunkRef(ref.digest, ref.length, names), abandon, ticket)
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

    async def _record_lost(self, ref: ChunkRef, got: Fetched) -> None:
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
            await self._repair(ref, data, bad, copy_back)
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

    async def heal_copies(self, ref: ChunkRef, data: frame.Buffer, bad: list[tuple[str, str]]) -> bool:
        """Heal copies found missing or corrupt elsewhere than in a read (the scrubber,
        scrub/service.py) from the verified plaintext ``data``, as a read heals them. True
        if each of them the catalog still lists was written again (local) or its upload
        queued again (remote); False if one was not, or a heal of the chunk is under way."""
        if ref.digest in self._healing:
            return False
        self._healing.add(ref.digest)
        try:
            return await self._repair(ref, data, bad, False, include_bad=True)
        finally:
            self._healing.discard(ref.digest)

    async def _repair(
        self, ref: ChunkRef, data: frame.Buffer, bad: list[tuple[str, str]], copy_back: bool,
        include_bad: bool = False,
    ) -> bool:
        """The heal's steps: mark, write again, queue the uploads again (see ``_heal``);
        ``include_bad``: copies already recorded bad are healed too."""
        bad, copy_back, usable = await self._damage_to_heal(ref, bad, copy_back, include_bad)
        if not bad and not copy_back:
            return True
        await self._record_heal_bad(ref, bad)
        local_bad = [n for n, _ in bad if n in self.local]
        remote_bad = [n for n, _ in bad if n not in self.local]
        # The upload of a remote copy reads a local one: written first (a read's heal
        # always does; the scrubber's only where no valid local copy is left).
        has_local = include_bad and any(n in self.local for n in usable)
        placed = None
        if local_bad or copy_back or (remote_bad and not has_local):
            placed = await self._rewrite_local(ref, data, local_bad, copy_back)
        queued = await self._requeue_remote(ref, remote_bad)
        return (placed is not None or not local_bad) and queued == len(remote_bad)

    async def _damage_to_heal(
        self, ref: ChunkRef, bad: list[tuple[str, str]], copy_back: bool,
        include_bad: bool = False,
    ) -> tuple[list[tuple[str, str]], bool, set[str]]:
        """``bad`` and ``copy_back`` narrowed to what needs doing now (heal's first step),
        and the valid copies left to read."""
        # Only copies the catalog still lists are damage: a copy evicted (or a chunk
        # deleted) since the caller looked up the chunk is simply gone.
        valid = set(await trio.to_thread.run_sync(
            self.catalog.replica_tiers, ref.digest, limiter=self.db_limiter
        ))
        listed = valid
        if include_bad:
            listed = valid | set(await trio.to_thread.run_sync(
                self.catalog.bad_replica_tiers, ref.digest, limiter=self.db_limiter))
        bad = [(n, why) for n, why in bad if n in listed]
        usable = {n for n in valid - {b for b, _ in bad}
                  if not self.stats.is_degraded(n) and self.residency.permits(ref.digest, n)}
        copy_back = copy_back and not any(n in self.local for n in usable)
        return bad, copy_back, usable

    async def _record_heal_bad(self, ref: ChunkRef, bad: list[tuple[str, str]]) -> None:
        """Record the bad copies in the catalog before healing them (readers skip them)."""
        for name, why in bad:
            await trio.to_thread.run_sync(
                self.catalog.mark_replica_bad, ref.digest, name, limiter=self.db_limiter
            )
            log.warning("chunk %s: copy on tier %s %s; healing it", ref.key[:16], name, why)

    async def _rewrite_local(
        self, ref: ChunkRef, data: frame.Buffer, local_bad: list[str], copy_back: bool
    ) -> str | None:
        """Write a verified local copy (heal or copy-back) and record it, pinned meanwhile;
        the tier written (None: none)."""
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
        return placed

    async def _requeue_remote(self, ref: ChunkRef, remote_bad: list[str]) -> int:
        """Queue the upload of each bad remote copy again (where residency permits); how
        many were."""
        queued = 0
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
                queued += 1
        return queued

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
