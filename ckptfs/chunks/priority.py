"""A capacity limiter with two classes of waiters: a chunk a reader is blocked on goes
before speculative readahead.

With a plain FIFO limiter, the chunk a reader needs now waited behind every other
reader's readahead GETs (up to 6 each at the start of a restore). Here a waiter is a
``Ticket``: urgent tickets are served first (FIFO among themselves), and a readahead
ticket is promoted when a reader comes to wait for the same chunk. A slot is handed to
``trio.to_thread.run_sync`` as its limiter (``slot``), so it stays taken until the thread
ends, even when the call was abandoned on cancel (as with trio's own limiters).
"""

from __future__ import annotations

from collections import deque

import trio


class Ticket:
    """One acquisition of a slot: urgent or not, promotable while it waits."""

    __slots__ = ("urgent", "granted", "_event")

    def __init__(self, urgent: bool) -> None:
        self.urgent = urgent
        self.granted = False
        self._event = trio.Event()


class PriorityLimiter:
    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("a PriorityLimiter needs at least one slot")
        self.total_tokens = total
        self.borrowed_tokens = 0
        self._urgent: deque[Ticket] = deque()
        self._normal: deque[Ticket] = deque()

    @property
    def waiting(self) -> int:
        return len(self._urgent) + len(self._normal)

    async def acquire(self, ticket: Ticket) -> None:
        ticket.granted = False  # a ticket may be used again (one flight, a second fetch)
        ticket._event = trio.Event()
        if self.borrowed_tokens < self.total_tokens and not self.waiting:
            self.borrowed_tokens += 1
            ticket.granted = True
            await trio.lowlevel.checkpoint()  # a checkpoint, like CapacityLimiter.acquire
            return
        (self._urgent if ticket.urgent else self._normal).append(ticket)
        try:
            await ticket._event.wait()
        except BaseException:
            if ticket.granted:
                self.release()  # granted as we were cancelled: pass the slot on
            else:
                (self._urgent if ticket.urgent else self._normal).remove(ticket)
            raise

    def promote(self, ticket: Ticket) -> None:
        """A reader now waits for what this ticket fetches: serve it with the urgent ones."""
        if ticket.urgent:
            return
        ticket.urgent = True
        if not ticket.granted and ticket in self._normal:
            self._normal.remove(ticket)
            self._urgent.append(ticket)

    def release(self) -> None:
        self.borrowed_tokens -= 1
        while self.borrowed_tokens < self.total_tokens and self.waiting:
            nxt = self._urgent.popleft() if self._urgent else self._normal.popleft()
            self.borrowed_tokens += 1
            nxt.granted = True
            nxt._event.set()

    def slot(self, ticket: Ticket) -> _Slot:
        """A limiter for one ``trio.to_thread.run_sync`` call, taking a slot for ``ticket``."""
        return _Slot(self, ticket)


class _Slot:
    """trio's limiter protocol for one thread call (acquire/release on behalf of)."""

    __slots__ = ("_limiter", "_ticket")

    def __init__(self, limiter: PriorityLimiter, ticket: Ticket) -> None:
        self._limiter = limiter
        self._ticket = ticket

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        await self._limiter.acquire(self._ticket)

    def release_on_behalf_of(self, borrower: object) -> None:
        self._limiter.release()
