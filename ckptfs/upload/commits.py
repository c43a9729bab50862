"""A stream of commits: upload jobs queued one after another, less than QUIET_S apart.

A checkpoint of many small files (sharded state: Megatron's and Orbax's hundreds to
thousands of files per step) holds no chunk buffer between its files, so the memory budget
does not show it as a save; yet each of its closes queues upload jobs. Started between
its files, those uploads of a few KiB each would take the catalog (one transaction at a
time with SQLite) and the CPU from the next create and close: through FUSE, creates with
a remote tier ran at 0.72-0.76x of those without (docs/performance-history.md, "Many small files
with a remote tier"). So the upload queue treats such a stream as a save
(``upload_during_save``): it ends when no job was queued for QUIET_S.
"""

from __future__ import annotations

import math

import trio

from ..wakeup import Wakeup

# Small files come a few ms apart; a save's files written one by one by a framework come
# closer than this, and a pause this long costs the uploads no more than the pause.
QUIET_S = 0.1


class CommitStream:
    """When upload jobs were last queued, and ``wake``, set at each queueing for the
    upload queue (which clears it before each look). Trio thread."""

    def __init__(self, quiet_s: float = QUIET_S) -> None:
        self.quiet_s = quiet_s
        self._last = -math.inf  # trio time of the last queueing
        self.wake = Wakeup()

    def queued(self) -> None:
        """New upload jobs (a commit, a heal): the stream goes on; wakes the queue."""
        self._last = trio.current_time()
        self.wake.set()

    def running(self) -> bool:
        return trio.current_time() < self._last + self.quiet_s  # as wait_quiet compares

    async def wait_quiet(self) -> None:
        """Return once no job was queued for ``quiet_s`` (at once if none was)."""
        while self.running():
            await trio.sleep_until(self._last + self.quiet_s)  # moves with each queueing
