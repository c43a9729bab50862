"""What the chunk service's parts share (chunks/writer.py, reader.py, gc.py), as small
explicit objects given to each at construction: its policy knobs, the tiers, the limiters,
the callbacks into the daemon, the pins, the mount's nursery. No part reaches into
another's attributes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from ..catalog import ChunkRef
from ..catalog.protocols import (
    ContentsCatalog,
    DeletionQueue,
    MetaCatalog,
    MoveCatalog,
    ReplicaCatalog,
    SessionCatalog,
    UploadQueue,
    WantCatalog,
)
from ..config.model import WriteBehind
from ..stats import Stats
from ..tiers.base import Tier
from .guard import ChunkGuard
from .moves import MoveMarks
from .priority import PriorityLimiter
from .residency import Residency
from .room import Room

# fsyncs in flight at once: each waits for the device, and concurrent ones share a flush.
SYNC_THREADS = 16

# Uploads an uncommitted chunk (digest, length, local tiers holding it, remote tier) to a
# remote tier, verified, in a worker thread under the uploader's limiter.
SpillCopy = Callable[[bytes, int, Sequence[str], str], Awaitable[None]]


class StoreCatalog(
    ContentsCatalog, ReplicaCatalog, UploadQueue, DeletionQueue, MetaCatalog, SessionCatalog,
    WantCatalog, MoveCatalog, Protocol,
):
    """The catalog roles of the chunk service (its parts each take fewer)."""

    shared: bool  # other nodes share it: a chunk may be only on another node's tiers


class LocalDeleter(Protocol):
    """What eviction needs of the deletion queue: delete queued local frames now."""

    async def delete_local(self, pairs: list[tuple[bytes, str]]) -> int: ...


def stats_for(tiers: Sequence[Tier]) -> Stats:
    """The live statistics of a tier set (shared by the store, the uploader, the deleter)."""
    stats = Stats()
    for t in tiers:
        stats.add_tier(t.name, t.kind)
    return stats


@dataclass(frozen=True)
class StorePolicy:
    """The chunk service's knobs (the config's [store] and [reads] sections).
    ``remote_reads``: GETs from remote tiers at once (remote_read_concurrency; None:
    ``io_threads``); ``peer_wait_s``: with a shared catalog, how long a read of a chunk
    only other nodes hold waits for their upload (peer_chunk_wait)."""

    io_threads: int
    cache_bytes: int
    on_local_full: str = "block"
    local_full_timeout_s: float = 600.0
    remote_copies: int = 1
    remote_reads: int | None = None
    peer_wait_s: float = 0.0
    write_behind: WriteBehind = "never"


@dataclass(frozen=True)
class SharedState:
    """State the store shares with the uploader and the deleter (the composition root
    builds it first); None: the store's own."""

    guard: ChunkGuard | None = None
    stats: Stats | None = None
    room: Room | None = None
    synced: set[bytes] | None = None  # frames known fsynced


@dataclass(frozen=True)
class StoreHooks:
    """What the store wakes: ``on_requeue`` tells the uploader of new upload jobs (a heal,
    a commit), ``on_deletions`` wakes the deleter."""

    on_requeue: Callable[[], None] | None = None
    on_deletions: Callable[[], None] | None = None

    def requeued(self) -> None:
        if self.on_requeue is not None:
            self.on_requeue()

    def deletions_queued(self) -> None:
        """Rows were added to the deletion queue: wake the deleter."""
        if self.on_deletions is not None:
            self.on_deletions()


class TierSet:
    """The tiers and where each chunk's copies may be: every tier (reads, fsync,
    deletion), the local ones (new chunks land there only; remote tiers get copies from
    the uploader), the remote ones."""

    def __init__(self, tiers: Sequence[Tier], residency: Residency, stats: Stats) -> None:
        self.tiers = {t.name: t for t in tiers}
        self.local = {t.name: t for t in tiers if t.kind == "local"}
        self.remotes = sorted((t for t in tiers if t.kind != "local"), key=lambda t: t.name)
        if not self.local:
            raise ValueError("a ChunkStore needs at least one local tier")
        self.residency = residency
        self.stats = stats

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


class Limiters:
    """The worker-thread limiters of the chunk service."""

    def __init__(self, policy: StorePolicy, db: trio.CapacityLimiter) -> None:
        self.io = trio.CapacityLimiter(policy.io_threads)  # local tier I/O: writes, reads
        # fsyncs wait for the device's flush, not for a core: under the writes' limiter,
        # four files fsyncing at once held every slot and the chunk writes of the other
        # files (the rest of the save) waited behind them.
        self.sync_io = trio.CapacityLimiter(max(SYNC_THREADS, policy.io_threads))
        # GETs from remote tiers (reads, heals, prefetch staging): their own threads, so a
        # slow or hung object store cannot take the ones local I/O needs. As many as fill
        # the link (a GET's latency hides behind the others'), not as many as the disks want.
        # The chunk a reader is blocked on goes before readahead (chunks/priority.py).
        self.remote_io = PriorityLimiter(policy.remote_reads or policy.io_threads)
        self.db = db  # catalog calls
        self.bg = trio.CapacityLimiter(2)  # heals and copy-backs, besides reads and writes


class Background:
    """Where background work (write-behind, moves, heals, copy-backs) runs: the mount's
    nursery, once attached (before: none runs)."""

    def __init__(self) -> None:
        self.nursery: trio.Nursery | None = None


class Pins:
    """The pins of uncommitted chunks (chunks/guard.py) and the catalog's records of their
    moves (chunks/moves.py), which end when a chunk's last pin goes."""

    def __init__(self, guard: ChunkGuard, moves: MoveMarks) -> None:
        self.guard = guard
        self.moves = moves

    def pin(self, digest: bytes) -> None:
        self.guard.pin(digest)

    def unpin(self, digests: Iterable[bytes]) -> None:
        """On the trio thread (worker threads call the guard's)."""
        self.guard.unpin(digests)
        self.moves.settle()

    def current(self, ref: ChunkRef) -> ChunkRef:
        """``ref`` with the tiers that hold it now, if it is an uncommitted chunk."""
        tiers = self.guard.current(ref.digest)
        if tiers is None or tiers == ref.tiers:
            return ref
        return ChunkRef(ref.digest, ref.length, tiers)

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
