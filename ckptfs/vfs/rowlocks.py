"""One catalog call at a time per inode for its open-handle row (shared catalog).

The VFS notes an inode open under the node's session and releases it at the last close;
an open and a close of one inode can overlap (the kernel sends RELEASE without waiting, and
the next open may come at once). Their catalog calls run in worker threads on different
pooled connections and may commit in either order: a release that commits after the next
open's note deletes that note, a note that commits after the next close's release leaves a
row that nothing releases (the catalog keeps the inode "open" on this node for retention
and for the drop of unlinked files, until the session ends).

``RowLocks.hold(ino)`` is a trio.Lock per inode, kept only while a task holds or waits for
it. trio's locks are fair (FIFO), and a task takes a free one or joins its queue before
its first yield: tasks that decide a note or a release and then, without an await in
between, enter ``hold`` make their calls, and so commit them, in the order of the decisions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

import trio

__all__ = ["RowLocks"]


class _Slot:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = trio.Lock()
        self.users = 0  # tasks holding or waiting for the lock


class RowLocks:
    def __init__(self) -> None:
        self._slots: dict[int, _Slot] = {}

    def __len__(self) -> int:
        return len(self._slots)

    @asynccontextmanager
    async def hold(self, ino: int) -> AsyncIterator[None]:
        slot = self._slots.get(ino)
        if slot is None:
            slot = self._slots[ino] = _Slot()
        slot.users += 1
        try:
            async with slot.lock:
                yield
        finally:
            slot.users -= 1
            if not slot.users:
                del self._slots[ino]

    @asynccontextmanager
    async def hold_all(self, inos: Iterable[int]) -> AsyncIterator[None]:
        """Several inodes' locks, taken in ascending order (no deadlock: every other holder
        takes one lock only)."""
        async with AsyncExitStack() as stack:
            for ino in sorted(set(inos)):
                await stack.enter_async_context(self.hold(ino))
            yield
