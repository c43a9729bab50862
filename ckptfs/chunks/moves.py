"""The catalog's record of this node's moves of uncommitted chunks to remote tiers
(catalog/moves.py; docs/multinode.md "One chunk, two nodes"), kept by the store.

A full local tier moves a writer's uncommitted chunk to its remote tiers (writer.py
``_spill``). Chunk objects are keyed by digest, so with a shared catalog another node's
deletion of the same digest there could remove the object the writer will commit. So:

* before the PUT, ``begin`` records the move in the catalog, which no deletion claim of the
  pair gets past; refused while such a deletion is claimed (the move waits for it);
* once the chunk is no longer uncommitted here (its last pin went: committed, or
  dropped), ``settle`` ends the move in the background: a committed chunk's replica row
  protects the object from then on; a dropped one's object is queued for deletion;
* no new move of a digest starts while the end of its previous one is in flight (the end
  would remove the new record).

Everything runs on the trio thread; catalog calls in worker threads under the catalog
limiter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio

from ..catalog.protocols import MoveCatalog
from ..errors import CkptfsError
from ..supervise import contained
from .guard import ChunkGuard

log = logging.getLogger("ckptfs.chunks")


class MoveMarks:
    def __init__(
        self, catalog: MoveCatalog, db_limiter: trio.CapacityLimiter, guard: ChunkGuard,
        node: str, on_deletions: Callable[[], None],
        on_ended: Callable[[], None] = lambda: None,
    ) -> None:
        """``node``: who moves (the catalog's rows name it; its session's end releases
        them); ``on_deletions``: deletion rows were queued (wake the deleter);
        ``on_ended``: an end finished (a move of its digest held back may go on)."""
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.guard = guard
        self.node = node
        self.on_deletions = on_deletions
        self.on_ended = on_ended
        self._marks: dict[bytes, set[str]] = {}  # digest -> tiers with a recorded move
        self._ending: set[bytes] = set()  # ends in flight
        self._ended = trio.Event()  # set (and replaced) when an end finishes
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        """Where the ends run (the mount's nursery)."""
        self._nursery = nursery

    def ending(self, digest: bytes) -> bool:
        """The end of an earlier move of this digest is in flight: no move of it now."""
        return digest in self._ending

    async def begin(self, digest: bytes, length: int, targets: Sequence[str]) -> bool:
        """Record the move of ``digest`` to ``targets`` before its PUT. False: a deletion
        of one of the pairs is claimed (by any node): no PUT now."""
        # Noted before the call: if the row is written and this task is cancelled (or the
        # call fails after its commit), the end still removes it, or finds it gone.
        marks = self._marks.setdefault(digest, set())
        new = set(targets) - marks
        marks.update(targets)
        ok = await trio.to_thread.run_sync(
            self.catalog.begin_move, digest, length, list(targets), self.node,
            limiter=self.db_limiter,
        )
        if not ok:
            # (No settle took the digest meanwhile: it skips the ones being moved.)
            marks.difference_update(new)
            if not marks:
                self._marks.pop(digest, None)
        return ok

    def settle(self) -> None:
        """Pins went (or a move round ended): end, in the background, the moves of the
        chunks no longer uncommitted here and not being moved."""
        if self._nursery is None or not self._marks:
            return
        moving = self.guard.moving()
        done = {d: t for d, t in self._marks.items()
                if d not in moving and d not in self._ending and not self.guard.uncommitted(d)}
        if not done:
            return
        for d in done:
            del self._marks[d]
        self._ending.update(done)
        self._nursery.start_soon(contained, None, "move-records", self._end, done)

    async def _end(self, done: dict[bytes, set[str]]) -> None:
        pairs = [(d, t) for d, tiers in done.items() for t in sorted(tiers)]
        try:
            queued = await trio.to_thread.run_sync(
                self.catalog.end_moves, pairs, self.node, limiter=self.db_limiter
            )
        except CkptfsError as exc:
            # Kept: the next settle tries again; a session's end releases them anyway.
            log.warning("could not end the record of %d moved chunk(s): %s", len(done), exc)
            for d, tiers in done.items():
                self._marks.setdefault(d, set()).update(tiers)
            queued = 0
        finally:
            self._ending.difference_update(done)
            self._ended.set()
            self._ended = trio.Event()
            self.on_ended()
        if queued:
            self.on_deletions()

    async def end_now(self) -> None:
        """End every move that ``settle`` would end, and wait for the ends in flight
        (tests; an unmount's drain)."""
        self.settle()
        while self._ending:
            await self._ended.wait()
