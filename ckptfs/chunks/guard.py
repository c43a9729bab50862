"""Pins and deletions in flight: what keeps the deletion queue from removing a frame that a
pending commit, a heal or an upload is about to rely on.

One small lock guards two maps and is held only for dict operations, never across I/O, so
the trio thread may take it (``unpin`` after a commit):

* ``pins``: digest -> count. A writer pins a digest before it puts a frame of it and keeps
  the pin until its commit is in the catalog (or its changes are dropped).
* ``deleting``: digest -> tiers whose frame the deleter is removing right now.

The rules (docs/concurrency.md): the deleter holds back a pinned digest and otherwise marks
it as being deleted, both under the lock; a writer that pins a digest while a *local*
deletion of it is in flight waits (in its worker thread) until that deletion is done,
and only then puts its frame; the uploader starts no upload of a (digest, tier) pair
being deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ..errors import TierError

DELETE_WAIT_S = 60.0  # a local deletion takes milliseconds; this only bounds a bug


class ChunkGuard:
    def __init__(self, local_tiers: Iterable[str]) -> None:
        self.local = frozenset(local_tiers)
        self._cond = threading.Condition(threading.Lock())
        self._pins: dict[bytes, int] = {}
        self._deleting: dict[bytes, set[str]] = {}
        self._held: set[bytes] = set()  # digests the deleter skipped because of a pin
        # Called (from any thread) when the last pin of a held-back digest goes: the
        # deleter may go on with it. Must be thread-safe (TrioToken.run_sync_soon).
        self.on_release: Callable[[], None] | None = None

    # -- pins ---------------------------------------------------------------------------------

    def pin(self, digest: bytes) -> None:
        with self._cond:
            self._pins[digest] = self._pins.get(digest, 0) + 1

    def pin_for_put(self, digest: bytes) -> None:
        """Blocking (a worker thread): pin, then wait until no local deletion of this digest
        is in flight, so the frame about to be put cannot be deleted after the put."""
        with self._cond:
            self._pins[digest] = self._pins.get(digest, 0) + 1
            ok = self._cond.wait_for(
                lambda: not (self._deleting.get(digest, set()) & self.local), DELETE_WAIT_S
            )
        if not ok:
            self.unpin([digest])
            raise TierError(f"local deletion of chunk {digest.hex()[:16]} did not finish")

    def wait_local_deletion(self, digest: bytes) -> None:
        """Blocking: wait until no local deletion of a digest the caller pinned is in flight."""
        with self._cond:
            self._cond.wait_for(
                lambda: not (self._deleting.get(digest, set()) & self.local), DELETE_WAIT_S
            )

    def unpin(self, digests: Iterable[bytes]) -> None:
        released = False
        with self._cond:
            for d in digests:
                n = self._pins.get(d, 0) - 1
                if n > 0:
                    self._pins[d] = n
                    continue
                self._pins.pop(d, None)
                if d in self._held:
                    self._held.discard(d)
                    released = True
        if released and self.on_release is not None:
            self.on_release()

    def pinned(self, digest: bytes) -> bool:
        with self._cond:
            return digest in self._pins

    # -- deletions ----------------------------------------------------------------------------

    def begin_delete(
        self, pairs: Iterable[tuple[bytes, str]]
    ) -> tuple[list[tuple[bytes, str]], list[tuple[bytes, str]]]:
        """Mark the pairs the deleter may go on with as being deleted: not those of a pinned
        digest (held back until unpinned) or already in flight. Returns (marked, held)."""
        marked = []
        held = []
        with self._cond:
            for d, tier in pairs:
                if d in self._pins:
                    self._held.add(d)
                    held.append((d, tier))
                    continue
                tiers = self._deleting.setdefault(d, set())
                if tier in tiers:
                    continue
                tiers.add(tier)
                marked.append((d, tier))
        return marked, held

    def end_delete(self, pairs: Iterable[tuple[bytes, str]]) -> None:
        with self._cond:
            for d, tier in pairs:
                tiers = self._deleting.get(d)
                if tiers is None:
                    continue
                tiers.discard(tier)
                if not tiers:
                    del self._deleting[d]
            self._cond.notify_all()

    def deleting(self, digest: bytes, tier: str) -> bool:
        with self._cond:
            return tier in self._deleting.get(digest, ())

    def deleting_pairs(self) -> set[tuple[bytes, str]]:
        with self._cond:
            return {(d, t) for d, tiers in self._deleting.items() for t in tiers}

    def held_digests(self) -> set[bytes]:
        with self._cond:
            return set(self._held)
