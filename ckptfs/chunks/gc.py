"""Garbage collection of chunks: ``collect`` moves the chunks nothing references any more
to the deletion queue (the deleter removes their frames, never one a pin or a new
reference wants); eviction turns the local copies of chunks a remote tier holds into
deletion rows (the local tiers are full, or the janitor's watermark); the read cache
forgets what was dropped."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

import trio

from ..catalog import ChunkRef
from ..catalog.audit import AuditRecord
from ..catalog.protocols import ContentsCatalog, ReplicaCatalog
from ..codec import frame
from .cache import ReadCache
from .parts import Limiters, LocalDeleter, Pins, StoreHooks, TierSet

log = logging.getLogger("ckptfs.chunks")

# A local copy dropped because a remote holds the chunk (the daemon's own work).
_EVICT = AuditRecord("evict", "")


class CollectorCatalog(ContentsCatalog, ReplicaCatalog, Protocol):
    """What garbage collection asks of the catalog: the drop of unreferenced chunks, the
    local replicas a remote holds too."""


class ChunkCollector:
    def __init__(
        self, tiers: TierSet, catalog: CollectorCatalog, limiters: Limiters, *,
        pins: Pins, cache: ReadCache, deleter: LocalDeleter | None, hooks: StoreHooks,
    ) -> None:
        """``deleter`` deletes local frames at once (eviction); ``cache``: chunks
        collected leave it."""
        self.tiers = tiers.tiers
        self.local = tiers.local
        self.remotes = tiers.remotes
        self.residency = tiers.residency
        self.stats = tiers.stats
        self.catalog = catalog
        self.db_limiter = limiters.db
        self.pins = pins
        self.guard = pins.guard
        self.cache = cache
        self.deleter = deleter
        self.hooks = hooks
        self.evicted_bytes = 0

    async def collect(self, refs: Iterable[ChunkRef]) -> None:
        """Drop the chunks among ``refs`` that nothing references any more: one catalog
        transaction moves their rows to the deletion queue; the deleter removes the frames
        (never one a pin or a new reference wants)."""
        by_digest: dict[bytes, set[str]] = {}
        for ref in map(self.pins.current, refs):
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
            self.hooks.deletions_queued()
        self.cache.forget_ahead(gone)
        for digest in gone:
            self.cache.uncache(digest)

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
