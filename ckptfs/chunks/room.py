"""Room on the local tiers: writers that found them full wait here; uploads, moves and
deletions say that room may have been freed. Shared by the ChunkStore (the waiting side),
the uploader and the deleter (they free room), built before all three. Trio thread only."""

from __future__ import annotations

from collections.abc import Callable

import trio


class Room:
    def __init__(self, on_wait: Callable[[], None] | None = None) -> None:
        """``on_wait``: a writer began to wait (the uploader stops deferring to a save)."""
        self.gen = 0  # bumped whenever room may have been freed
        self._waiting = 0  # writers blocked until uploads or deletions free local space
        self.event = trio.Event()  # set (and replaced) by every ``freed``
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

    def freed(self) -> None:
        """An upload finished or chunks were deleted: writers waiting for room look again."""
        self.gen += 1
        self.event.set()
        self.event = trio.Event()
