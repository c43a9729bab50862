"""One blocking call in a worker thread under a limiter: ``trio.to_thread.run_sync`` with
less of its per-call machinery, for the hot small calls (catalog requests, a file's commit,
a small chunk's write).

Why: a create + write + close makes three such calls, a rename or unlink one, and each
cost about 0.2 ms of CPU in ``to_thread.run_sync`` on the development machine, more than
the SQL it ran. This keeps what the callers rely on (cancellation checked before the
call; once started, the call is waited for, never abandoned; the limiter slot held until
the call has returned; its result or exception delivered on the trio thread) and leaves
out what they do not use: the copy of the context into the thread, the thread names set
per call (two system calls), ``trio.from_thread`` support (the thread-local data it needs)
and the thread counting for ``trio.testing``. Functions run here must not call
``trio.from_thread``; use ``trio.to_thread.run_sync`` for those.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

T = TypeVar("T")


def _not_abandoned(_: Any) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED  # a started call is waited for (no abandon_on_cancel)


async def run_sync(fn: Callable[..., T], *args: Any, limiter: trio.CapacityLimiter) -> T:
    """``fn(*args)`` in a worker thread (trio's thread cache) under ``limiter``."""
    await trio.lowlevel.checkpoint_if_cancelled()
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    borrower = object()  # the slot's holder: this call, not the task (as to_thread does)
    await limiter.acquire_on_behalf_of(borrower)

    def deliver(result: outcome.Outcome[T]) -> None:  # in the worker thread
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    try:
        trio.lowlevel.start_thread_soon(functools.partial(fn, *args), deliver)
    except BaseException:
        limiter.release_on_behalf_of(borrower)
        raise
    try:
        value: T = await trio.lowlevel.wait_task_rescheduled(_not_abandoned)
    finally:
        limiter.release_on_behalf_of(borrower)
    return value


class CatalogSlot:
    """The one slot of the embedded SQLite catalog (one connection, one transaction at a
    time): a one-token limiter that trio tasks use as they use a ``trio.CapacityLimiter``
    (``acquire_on_behalf_of`` / ``release_on_behalf_of``, as ``trio.to_thread.run_sync``
    and ``run_sync`` call them), and that a worker thread may also **take without waiting**
    (``try_take_in_thread``), only when it is free and no task waits for it.

    Why: a small file's close stores its chunk in an I/O worker and then commits in the
    catalog thread, two thread hops. The I/O worker, once the chunk is stored and read back,
    commits itself if the catalog is idle right then (chunks/commit.py ``fold_commit``): one
    hop. It never waits for the slot (a worker holding a tier's I/O slot must not queue
    behind the catalog), and never holds it during tier I/O (a hung device must not stop
    namespace requests): it takes the slot after the put and gives it back after the one
    transaction. A task waiting for the slot is never passed over by a thread.

    Not a CapacityLimiter (trio forbids subclassing it): typed as one where it is passed
    on (mount.py), it provides what trio and ckptfs use of one. Waiters are woken all at
    once on a release and race for the slot (a few at most: the catalog's users)."""

    total_tokens = 1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: object | None = None
        self._waiting = 0  # tasks parked for the slot (under _lock)
        self._lot = trio.lowlevel.ParkingLot()
        self._token: trio.lowlevel.TrioToken | None = None

    @property
    def borrowed_tokens(self) -> int:
        return 0 if self._holder is None else 1

    @property
    def available_tokens(self) -> int:
        return 1 - self.borrowed_tokens

    def _take(self, borrower: object, waiter: bool) -> bool:
        """Under the lock: the slot for ``borrower`` if free; a new arrival (not ``waiter``)
        also lets parked tasks go first."""
        if self._holder is borrower:
            raise RuntimeError("this borrower already holds the catalog slot")
        if self._holder is None and (waiter or self._waiting == 0):
            self._holder = borrower
            return True
        return False

    def acquire_on_behalf_of_nowait(self, borrower: object) -> None:
        with self._lock:
            if not self._take(borrower, waiter=False):
                raise trio.WouldBlock

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._token = trio.lowlevel.current_trio_token()
        waiter = False
        while True:
            with self._lock:
                if self._take(borrower, waiter):
                    break
                self._waiting += 1
            waiter = True
            try:
                await self._lot.park()  # woken by every release while tasks wait
            except BaseException:
                with self._lock:
                    self._waiting -= 1
                    free = self._holder is None
                if free:
                    self._lot.unpark_all()  # the wake-up this task took goes to the others
                raise
            with self._lock:
                self._waiting -= 1
        if not waiter:
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def acquire(self) -> None:
        await self.acquire_on_behalf_of(trio.lowlevel.current_task())

    def release_on_behalf_of(self, borrower: object) -> None:
        with self._lock:
            if self._holder is not borrower:
                raise RuntimeError("this borrower does not hold the catalog slot")
            self._holder = None
            wake = self._waiting > 0
        if wake:
            self._lot.unpark_all()

    def release(self) -> None:
        self.release_on_behalf_of(trio.lowlevel.current_task())

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    # -- from a worker thread ----------------------------------------------------------------

    def try_take_in_thread(self, borrower: object) -> bool:
        """In a worker thread: the slot for ``borrower`` if it is free and no task waits
        for it; never waits."""
        with self._lock:
            return self._take(borrower, waiter=False)

    def give_back_in_thread(self, borrower: object) -> None:
        """In a worker thread: give back what ``try_take_in_thread`` took; tasks that
        started waiting meanwhile are woken on the trio thread."""
        with self._lock:
            if self._holder is not borrower:
                raise RuntimeError("this borrower does not hold the catalog slot")
            self._holder = None
            wake = self._waiting > 0
            token = self._token
        if wake and token is not None:
            token.run_sync_soon(self._wake)

    def _wake(self) -> None:
        self._lot.unpark_all()
