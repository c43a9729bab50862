"""Room on the local tiers: writers that found them full wait here; uploads, moves and
deletions say that room may have been freed. Shared by the ChunkStore (the waiting side),
the uploader and the deleter (they free room), built before all three. Trio thread only."""

from __future__ import annotations

import trio


class Room:
    def __init__(self) -> None:
        self.gen = 0  # bumped whenever room may have been freed
        self.waiting = 0  # writers blocked until uploads or deletions free local space
        self.event = trio.Event()  # set (and replaced) by every ``freed``

    def freed(self) -> None:
        """An upload finished or chunks were deleted: writers waiting for room look again."""
        self.gen += 1
        self.event.set()
        self.event = trio.Event()
