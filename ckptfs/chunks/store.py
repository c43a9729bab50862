"""ChunkStore: the chunk service (chunks/service.py), built from its parts.

* the writer (chunks/writer.py) hashes, frames, places the frame on the least busy tier
  with room, and reads it back to verify it before returning: a ChunkRef the caller holds
  names bytes that were checked on the device. The digest stays *pinned* until the caller
  commits or drops it, so garbage collection never deletes a chunk a pending commit is
  about to reference. It makes room when the local tiers are full.
* the reader (chunks/reader.py) tries the tiers that hold a chunk, verifies the digest,
  falls back on a miss or a mismatch, and never returns unverified bytes. Concurrent reads
  of one chunk are merged, and decoded chunks are kept in a small LRU cache
  (chunks/cache.py). It heals the copies it found bad and copies chunks back.
* garbage collection (chunks/gc.py) collects unreferenced chunks and evicts local copies.
* the committer (chunks/commit.py) commits a file's version.

They share what they must through small objects built here (chunks/parts.py). All
blocking work runs in worker threads under the limiters there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import trio

from ..catalog import ChunkRef
from ..codec import frame
from ..codec.staged import Staged
from ..errors import CkptfsError
from ..supervise import supervised
from ..tiers.base import Tier
from .cache import ReadCache
from .commit import Committer, FileVersion
from .gc import ChunkCollector
from .guard import ChunkGuard
from .moves import MoveMarks
from .parts import (
    Background,
    Limiters,
    LocalDeleter,
    Pins,
    SharedState,
    SpillCopy,
    StoreCatalog,
    StoreHooks,
    StorePolicy,
    TierSet,
    stats_for,
)
from .placement import Placement
from .reader import ChunkReader
from .residency import Locations, Residency, no_residency
from .room import Room
from .tierview import TierView
from .writer import ChunkWriter

_OWN = SharedState()  # nothing shared: the store makes its own
_NO_HOOKS = StoreHooks()

__all__ = ["ChunkStore", "LocalDeleter", "SharedState", "StoreHooks", "StorePolicy", "stats_for"]


class ChunkStore:
    def __init__(
        self, tiers: Sequence[Tier], catalog: StoreCatalog, db_limiter: trio.CapacityLimiter,
        policy: StorePolicy, *,
        shared: SharedState = _OWN,
        deleter: LocalDeleter | None = None,
        spill_copy: SpillCopy | None = None,
        hooks: StoreHooks = _NO_HOOKS,
        node: str = "",
        residency: Residency | None = None,
    ) -> None:
        """``shared``: the guard, stats, room and synced frames shared with the uploader
        and the deleter (the composition root builds them first); ``deleter`` deletes local
        frames at once (eviction), ``spill_copy`` moves uncommitted chunks to a remote (the
        uploader's); ``hooks``: what the store wakes (chunks/parts.py); ``node``: this
        node's name (its wants of other nodes' chunks, its moves, name it in the catalog);
        ``residency``: where copies of each chunk may be (chunks/residency.py; None:
        anywhere)."""
        self.policy = policy
        self.residency = residency if residency is not None else no_residency()
        self.stats = shared.stats if shared.stats is not None else stats_for(tiers)
        self.tier_set = TierSet(tiers, self.residency, self.stats)
        self.tiers, self.remotes = self.tier_set.tiers, self.tier_set.remotes
        self.limiters = Limiters(policy, db_limiter)
        self.view = TierView(tiers, self.limiters.io)
        self.hooks = hooks
        self.background = Background()
        # Pins, deletions in flight and where uncommitted chunks are, under one lock held
        # for dict operations only (chunks/guard.py).
        self.guard = shared.guard if shared.guard is not None else ChunkGuard(self.tier_set.local)
        self.room = shared.room if shared.room is not None else Room()
        # The catalog's record of this node's moves (any node's deletion of a moved
        # object waits for the record's end: chunks/moves.py).
        self.moves = MoveMarks(catalog, db_limiter, self.guard, node, hooks.deletions_queued,
                               on_ended=self.room.hold_ended)  # a held move may go on
        self.pins = Pins(self.guard, self.moves)
        self.deleter = deleter
        self.cache = ReadCache(policy.cache_bytes, self.limiters.remote_io.total_tokens,
                               self.stats.count)
        self.frames = self.cache.frames
        placement = Placement(self.tier_set)
        self.gc = ChunkCollector(self.tier_set, catalog, self.limiters, pins=self.pins,
                                 cache=self.cache, deleter=deleter, hooks=hooks)
        self.writer = ChunkWriter(
            self.tier_set, catalog, self.limiters, policy, placement=placement, pins=self.pins,
            room=self.room, synced=shared.synced if shared.synced is not None else set(),
            frames=self.frames, evict=self.gc.evict, spill_copy=spill_copy, hooks=hooks,
            background=self.background,
        )
        self.reader = ChunkReader(
            self.tier_set, catalog, self.limiters, shared=catalog.shared, cache=self.cache,
            placement=placement, pins=self.pins, hooks=hooks, background=self.background,
            peer_wait_s=policy.peer_wait_s, node=node,
        )
        self.committer = Committer(catalog, db_limiter, self.writer, self.pins, self.gc.collect,
                                   hooks.on_requeue)

    def attach(self, nursery: trio.Nursery) -> None:
        """Where background heals and copy-backs run (the mount's nursery)."""
        self.background.nursery = nursery
        self.moves.attach(nursery)
        nursery.start_soon(supervised, self.stats, "copy-backs", self.reader.run_copy_backs)

    # -- the chunk service (chunks/service.py) -----------------------------------------------

    async def write(
        self, data: Sequence[frame.Buffer] | Staged, allowed: Locations = None,
        namespace: str | None = None,
    ) -> ChunkRef:
        return await self.writer.write(data, allowed, namespace)

    async def read(
        self, ref: ChunkRef, copy_back: bool = False, log_missing: bool = True,
        abandon_on_cancel: bool = False, ahead: bool = False,
    ) -> frame.Buffer:
        return await self.reader.read(ref, copy_back, log_missing, abandon_on_cancel, ahead)

    def release(self, refs: Iterable[ChunkRef]) -> list[ChunkRef]:
        return self.pins.release(refs)

    async def collect(self, refs: Iterable[ChunkRef]) -> None:
        await self.gc.collect(refs)

    async def sync(self, refs: Iterable[ChunkRef]) -> None:
        await self.writer.sync(refs)

    async def sync_catalog(self) -> None:
        await self.committer.sync_catalog()

    async def commit(
        self, v: FileVersion, synced: bool,
        sync_failed: Callable[[CkptfsError], None] | None = None,
    ) -> dict[int, ChunkRef] | None:
        return await self.committer.commit(v, synced, sync_failed)

    async def stage(self, ref: ChunkRef) -> bool:
        return await self.reader.stage(ref)

    # readahead hints (ReadAhead)

    def cached(self, digest: bytes) -> bool:
        return self.reader.cached(digest)

    def reserve_ahead(self, ref: ChunkRef) -> bool:
        return self.cache.reserve_ahead(ref)

    def forget_ahead(self, digests: Iterable[bytes]) -> None:
        self.cache.forget_ahead(digests)

    def consumed(self, digest: bytes) -> None:
        self.cache.consumed(digest)

    # an unlink's collection (UnlinkCollect)

    def collect_digests_blocking(self, digests: Iterable[bytes]) -> dict[bytes, list[str]]:
        return self.gc.collect_digests_blocking(digests)

    def collected(self, gone: dict[bytes, list[str]]) -> None:
        self.gc.collected(gone)

    # -- the daemon's other users: the janitor, the telemetry, the key follower ---------------

    def local_fill(self) -> tuple[int, int]:
        return self.view.fill()

    async def evict(self, want: int) -> int:
        return await self.gc.evict(want)

    def evict_digests(self, digests: Iterable[bytes]) -> int:
        return self.gc.evict_digests(digests)

    def deletions_queued(self) -> None:
        self.hooks.deletions_queued()

    def forget_keys(self, key_ids: set[int]) -> None:
        self.cache.forget_keys(key_ids)

    @property
    def evicted_bytes(self) -> int:
        return self.gc.evicted_bytes

    @evicted_bytes.setter
    def evicted_bytes(self, n: int) -> None:
        self.gc.evicted_bytes = n

    @property
    def spilled_bytes(self) -> int:
        return self.writer.spilled_bytes

    @property
    def waiting_for_room(self) -> int:
        """Writers blocked until uploads free local space."""
        return self.room.waiting

    @waiting_for_room.setter
    def waiting_for_room(self, n: int) -> None:
        self.room.waiting = n
