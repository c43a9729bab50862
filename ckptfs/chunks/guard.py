"""Pins, uncommitted copies and deletions in flight: what keeps the deletion queue (and a
full local tier's moves) from removing a frame that a pending commit, a heal, an upload or
another writer is about to rely on.

One small lock guards these maps. It is held only for dict and set operations: never
across I/O, never while calling out of this module (no callback, no logging). Worker
threads take it only for O(1) steps (``pin_for_put``, ``put_done``, ``pinned``, ``moved``;
their waits on the condition release it), so the trio thread, which takes it for the rest, never waits
for a thread's I/O or for a thread's long loop (tests/faults/test_loop_rules.py). Who calls what:

* worker threads: ``pin_for_put``, ``put_done``, ``wait_local_deletion``, ``pinned``
  (inside catalog calls), ``moved`` (inside the catalog step after a move);
* the trio thread: everything else (pins of heals and stages, ``unpin``, ``current``, the
  deleter's ``begin_delete``/``end_delete``, the moves' ``start_moves``/``moved``, ...);
* ``on_release`` is called after the lock is released.

The maps:

* ``pins``: digest -> count. A writer pins a digest before it puts a frame of it and keeps
  the pin until its commit is in the catalog (or its changes are dropped).
* ``deleting``: digest -> tiers whose frame is being removed right now (by the deleter, or
  the local frame of an uncommitted chunk just moved to a remote).
* ``where``: digest -> the tiers holding a pinned chunk no commit names yet, and its length.
  A commit records these tiers (a full local tier may have moved the chunk to a remote);
  a second open file writing the same bytes shares the copy. Cleared on the last unpin.
* ``putting``: digest -> puts in progress; ``moving``: uncommitted chunks being copied to
  a remote; ``stay``: uncommitted chunks a committed file names too (never moved).

The rules (docs/concurrency.md): the deleter holds back a pinned digest and otherwise marks
it as being deleted, both under the lock; a writer that pins a digest while a *local*
deletion of it is in flight waits (in its worker thread) until that deletion is done,
and only then puts its frame, unless it shares an uncommitted copy none of whose tiers is
being deleted; the uploader starts no upload, and a move no copy, of a (digest, tier) pair
being deleted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..errors import TierError

DELETE_WAIT_S = 60.0  # a local deletion takes milliseconds; this only bounds a bug

Pair = tuple[bytes, str]
Move = tuple[bytes, int, tuple[str, ...]]  # digest, length, local tiers holding it


@dataclass(frozen=True)
class Where:
    """Where an uncommitted (pinned) chunk is: replaced, never changed in place."""

    length: int
    tiers: tuple[str, ...]


class ChunkGuard:
    def __init__(
        self, local_tiers: Iterable[str], on_release: Callable[[], None] | None = None
    ) -> None:
        self.local = frozenset(local_tiers)
        self._cond = threading.Condition(threading.Lock())
        self._pins: dict[bytes, int] = {}
        self._deleting: dict[bytes, set[str]] = {}
        self._held: set[bytes] = set()  # digests the deleter skipped: pinned, or in flight
        self._where: dict[bytes, Where] = {}
        self._putting: dict[bytes, int] = {}
        self._moving: set[bytes] = set()
        self._stay: set[bytes] = set()
        # Called (from any thread) when the last pin of a held-back digest goes, or its
        # deletion in flight ends: the deleter may go on with it. Must be thread-safe
        # (TrioToken.run_sync_soon; the daemon gives the deleter's ThreadWakeup.set).
        self.on_release = on_release

    # -- pins ---------------------------------------------------------------------------------

    def pin(self, digest: bytes) -> None:
        with self._cond:
            self._pins[digest] = self._pins.get(digest, 0) + 1

    def pin_for_put(self, digest: bytes, within: frozenset[str] | None = None) -> Where | None:
        """Blocking (a worker thread): pin, then either share the uncommitted copy another
        open file stored (returned; nothing to put) or wait until no local deletion of this
        digest is in flight, so the frame about to be put cannot be deleted after the put
        (None: the caller puts, then calls ``put_done``). ``within``: share only a copy on
        these tiers (residency: the other file's copy may be where this one's may not)."""
        with self._cond:
            self._pins[digest] = self._pins.get(digest, 0) + 1
            ok = self._cond.wait_for(
                lambda: self._shareable(digest, within) is not None
                or not self._local_deleting(digest),
                DELETE_WAIT_S,
            )
            if ok:
                shared = self._shareable(digest, within)
                if shared is None:
                    self._putting[digest] = self._putting.get(digest, 0) + 1
                return shared
        self.unpin([digest])
        raise TierError(f"local deletion of chunk {digest.hex()[:16]} did not finish")

    def _local_deleting(self, digest: bytes) -> bool:
        return bool(self._deleting.get(digest, set()) & self.local)

    def _shareable(self, digest: bytes, within: frozenset[str] | None = None) -> Where | None:
        where = self._where.get(digest)
        if where is None or not where.tiers:
            return None
        if within is not None and not within.issuperset(where.tiers):
            return None
        if set(where.tiers) & self._deleting.get(digest, set()):
            return None
        return where

    def put_done(self, digest: bytes, tier: str | None, length: int) -> None:
        """A put that ``pin_for_put`` allowed ended, on ``tier`` (None: it failed)."""
        with self._cond:
            n = self._putting.get(digest, 0) - 1
            if n > 0:
                self._putting[digest] = n
            else:
                self._putting.pop(digest, None)
            if tier is not None:
                old = self._where.get(digest)
                tiers = set(old.tiers) if old is not None else set()
                self._where[digest] = Where(length, tuple(sorted(tiers | {tier})))
            self._cond.notify_all()  # a writer waiting on a deletion may share this copy

    def wait_local_deletion(self, digest: bytes) -> None:
        """Blocking: wait until no local deletion of a digest the caller pinned is in flight."""
        with self._cond:
            self._cond.wait_for(lambda: not self._local_deleting(digest), DELETE_WAIT_S)

    def unpin(self, digests: Iterable[bytes]) -> dict[bytes, tuple[str, ...]]:
        """Drop one pin per digest. Returns, for uncommitted ones, the tiers holding them as
        the pin went (read in the same lock, so a move cannot slip in between)."""
        released = False
        seen: dict[bytes, tuple[str, ...]] = {}
        with self._cond:
            for d in digests:
                where = self._where.get(d)
                if where is not None:
                    seen.setdefault(d, where.tiers)
                n = self._pins.get(d, 0) - 1
                if n > 0:
                    self._pins[d] = n
                    continue
                self._pins.pop(d, None)
                self._where.pop(d, None)
                self._stay.discard(d)
                if d in self._held and d not in self._deleting:
                    self._held.discard(d)
                    released = True
        if released and self.on_release is not None:
            self.on_release()
        return seen

    def pinned(self, digest: bytes) -> bool:
        with self._cond:
            return digest in self._pins

    # -- uncommitted copies -------------------------------------------------------------------

    def current(self, digest: bytes) -> tuple[str, ...] | None:
        """The tiers holding an uncommitted chunk now (None: not one, or not stored yet)."""
        with self._cond:
            where = self._where.get(digest)
            return where.tiers if where is not None and where.tiers else None

    def uncommitted(self, digest: bytes) -> bool:
        with self._cond:
            return digest in self._where

    def movable_bytes(self, header: int) -> int:
        """Bytes of uncommitted chunks with a local frame (being moved, or to move)."""
        with self._cond:
            return sum(w.length + header for w in self._where.values()
                       if self.local.intersection(w.tiers))

    def start_moves(
        self, want: int, header: int, targets: Callable[[bytes], Sequence[str]], start: bool
    ) -> tuple[list[Move], bool]:
        """Uncommitted chunks with a local frame to move to their remote ``targets``, about
        ``want`` bytes, marked as moving when ``start``. Not one being moved or put, one a
        committed file names too, or one with a deletion of a target in flight (marked
        before the pin: the copy would not survive it). Returns (moves, blocked): blocked
        when a deletion held some back (it ends soon: worth looking again)."""
        def free(digest: bytes, where: Where) -> bool:
            return (bool(self.local.intersection(where.tiers)) and digest not in self._moving
                    and digest not in self._stay and not self._putting.get(digest))

        with self._cond:
            candidates = [(d, w) for d, w in self._where.items() if free(d, w)]
        # The caller's function runs outside the lock (the lock never calls out).
        aims = {d: frozenset(targets(d)) for d, _ in candidates}
        picked: list[Move] = []
        blocked = False
        total = 0
        with self._cond:
            for digest, _ in candidates:
                if total >= want:
                    break
                where = self._where.get(digest)
                if where is None or not free(digest, where):
                    continue  # changed meanwhile
                if self._deleting.get(digest, set()) & aims[digest]:
                    blocked = True
                    continue
                sources = tuple(t for t in where.tiers if t in self.local)
                picked.append((digest, where.length, sources))
                total += where.length + header
            if start:
                self._moving.update(d for d, _, _ in picked)
        return picked, blocked

    def end_moves(self, digests: Iterable[bytes]) -> None:
        with self._cond:
            self._moving.difference_update(digests)

    def moving(self) -> set[bytes]:
        with self._cond:
            return set(self._moving)

    def stay(self, digests: Iterable[bytes]) -> None:
        """These uncommitted chunks keep their local frames (a committed file names them)."""
        with self._cond:
            self._stay.update(d for d in digests if d in self._where)

    def moved(
        self, digest: bytes, sources: Sequence[str], targets: Sequence[str], known: set[str]
    ) -> tuple[str, list[Pair]]:
        """The copies of an uncommitted chunk on ``targets`` are stored; ``known`` are the
        tiers the catalog records for it (a committed file names it). Returns
        ("gone", []): no longer uncommitted (committed or dropped meanwhile); ("kept", []):
        its local frames stay; ("moved", pairs): the remote copies serve it now and these
        local frames are marked as being deleted: the caller deletes them outside every
        lock, then calls ``end_delete`` (a writer of the same bytes waits until then, or
        shares the remote copy)."""
        with self._cond:
            where = self._where.get(digest)
            if where is None:
                return "gone", []
            if self._deleting.get(digest, set()).intersection(targets):
                return "kept", []  # an older deletion of the remote object runs: keep local
            src = set(sources)
            keep = {t for t in where.tiers if t not in src}
            self._where[digest] = Where(
                where.length, tuple(sorted(keep | set(targets) | (known & src)))
            )
            if known & src or self._putting.get(digest):
                self._stay.add(digest)  # a committed file names the local copy too
                return "kept", []
            self._deleting.setdefault(digest, set()).update(src)
            return "moved", [(digest, t) for t in sorted(src)]

    # -- deletions ----------------------------------------------------------------------------

    def begin_delete(self, pairs: Iterable[Pair]) -> tuple[list[Pair], list[Pair]]:
        """Mark the pairs the deleter may go on with as being deleted: not those of a pinned
        digest or already in flight (a moved chunk's local frame), which are held back
        until unpinned or done. Returns (marked, held)."""
        marked = []
        held = []
        with self._cond:
            for d, tier in pairs:
                tiers = self._deleting.setdefault(d, set())
                if d in self._pins or tier in tiers:
                    if not tiers:
                        del self._deleting[d]
                    self._held.add(d)
                    held.append((d, tier))
                    continue
                tiers.add(tier)
                marked.append((d, tier))
        return marked, held

    def end_delete(self, pairs: Iterable[Pair]) -> None:
        released = False
        with self._cond:
            for d, tier in pairs:
                tiers = self._deleting.get(d)
                if tiers is None:
                    continue
                tiers.discard(tier)
                if not tiers:
                    del self._deleting[d]
                    if d in self._held and d not in self._pins:
                        self._held.discard(d)
                        released = True
            self._cond.notify_all()
        if released and self.on_release is not None:
            self.on_release()

    def deleting(self, digest: bytes, tier: str) -> bool:
        with self._cond:
            return tier in self._deleting.get(digest, ())

    def deleting_pairs(self) -> set[Pair]:
        with self._cond:
            return {(d, t) for d, tiers in self._deleting.items() for t in tiers}

    def held_digests(self) -> set[bytes]:
        with self._cond:
            return set(self._held)
