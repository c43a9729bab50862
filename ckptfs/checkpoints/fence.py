"""How far back a restart must replay commit signals (docs/semantics.md, "The commit
protocol").

A framework's commit signal (the close of ``trainer_state.json``, the rename of
``.metadata.tmp``...) reaches the catalog in the transaction of that close or rename: the
audit record of the commit or rename is written with it. The tracker turns it into a
checkpoint row a little later, from an in-memory event. A crash in between loses the
event, not the record: the next mount replays the records from the *replay point* on.

The fence tells the tracker which records may still be needed: every operation that can
carry a signal enters the fence (with the time taken before its transaction) and leaves
it once its event is in the tracker's queue. A file's commits are fenced from the first
commit of a handle open for writing until the release event of its last writer is
queued, because the kernel's RELEASE (which makes the event) comes after the close
returned. The replay point is the oldest time still fenced, or now.
"""

from __future__ import annotations

import itertools
import time


class SignalFence:
    """Start times of operations whose commit signal has not reached the tracker yet.

    Used on the trio thread only (no lock)."""

    def __init__(self) -> None:
        self._open: dict[int, int] = {}  # token -> start time (ns)
        self._files: dict[int, int] = {}  # ino -> token of its first commit not yet released
        self._tokens = itertools.count(1)

    def enter(self) -> int:
        """An operation that may carry a signal starts: its token (leave() it)."""
        token = next(self._tokens)
        self._open[token] = time.time_ns()
        return token

    def leave(self, token: int) -> None:
        self._open.pop(token, None)

    def file_committing(self, ino: int) -> None:
        """A handle open for writing commits ``ino``: fenced until ``file_released``."""
        if ino not in self._files:
            self._files[ino] = self.enter()

    def file_released(self, ino: int) -> None:
        """The release event of the last writer of ``ino`` is queued (or none will be)."""
        token = self._files.pop(ino, None)
        if token is not None:
            self.leave(token)

    def oldest(self) -> int | None:
        """The earliest start time still fenced (None: nothing is)."""
        return min(self._open.values(), default=None)
