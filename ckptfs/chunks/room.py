"""Room on the local tiers: writers that found them full wait here; uploads, moves and
deletions say that room may have been freed, and the deleter that a claim holding a move
back ended. Shared by the chunk writer (the waiting side), the uploader and the deleter
(they free room), built before all three. Trio thread only."""

from __future__ import annotations

from collections.abc import Callable

import trio


class Room:
    def __init__(self, on_wait: Callable[[], None] | None = None) -> None:
        """``on_wait``: a writer began to wait (the uploader stops deferring to a save)."""
        self.gen = 0  # bumped whenever room may have been freed
        self._waiting = 0  # writers blocked until uploads or deletions free local space
        self.event = trio.Event()  # set (and replaced) by every ``freed``
        # Bumped when something that holds a move back ended (writer.py ``_spill``): a
        # deletion claim of a remote object (any node's) or the end of a move's record.
        self.holds_ended = 0
        self._on_wait = on_wait

    @property
    def waiting(self) -> int:
        return self._waiting

    @waiting.setter
    def waiting(self, n: int) -> None:
        more = n > self._waiting
        self._waiting = n
        if more and self._on_wait is not None:
            self._on_wait()

    def hold_ended(self) -> None:
        """A deletion claim ended (this node's, or another's heard through the catalog), or
        the end of a move's record: a move it held back may go on; writers look again."""
        self.holds_ended += 1
        self.freed()

    def freed(self) -> None:
        """An upload finished or chunks were deleted: writers waiting for room look again."""
        self.gen += 1
        self.event.set()
        self.event = trio.Event()
