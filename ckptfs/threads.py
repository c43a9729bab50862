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

``CallQueue`` is the same call for the catalog's limiter, where concurrent requests queue
for one slot: a call that would wait joins the visit under way instead of making a hop
of its own.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

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


_QUEUED, _TAKEN, _PROMOTED, _ABORTED = range(4)
_START = object()  # what a queued call's task is woken with when it is to start a visit


class _Call:
    __slots__ = ("fn", "task", "state")

    def __init__(self, fn: Callable[[], Any], task: trio.lowlevel.Task) -> None:
        self.fn = fn
        self.task = task
        self.state = _QUEUED


class CallQueue:
    """Worker-thread calls under ``limiter`` (the catalog's) that share thread hops when
    they queue.

    A call that finds every slot of the limiter taken while one of this queue's visits is
    under way does not wait for a slot of its own: it joins the queue, and a visit runs it
    after its current call, in the same worker thread, under that visit's slot. Calls stay
    one at a time per slot, each what it was (its own transaction: the commit rules do not
    change); concurrent requests (several ranks creating files) then cost one hop to the
    thread and back per visit instead of one per call. A visit takes at most
    ``drain_max`` calls, then gives its slot back, so that the limiter's other users (the
    deleter, the tracker, the session heartbeat) get their turn in its FIFO order; the
    head of the queue then starts the next visit. With one slot and no concurrency this
    is ``run_sync``: one visit per call.

    What ``run_sync`` promises holds for each call: cancellation is checked before it; a
    queued call that is cancelled is taken out of the queue and never runs; a started one
    is waited for, never abandoned; its result or exception is delivered on the trio
    thread. The lock is held only around the queue's bookkeeping, never across a call.
    """

    def __init__(self, limiter: trio.CapacityLimiter, drain_max: int = 16) -> None:
        self.limiter = limiter
        self.drain_max = drain_max
        self._lock = threading.Lock()
        self._queue: collections.deque[_Call] = collections.deque()
        self._open = 0  # visits that will still take calls from the queue
        self.visits = 0  # visits started, and calls that joined one (tests, counters)
        self.joined = 0

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread under the limiter, maybe in another call's visit."""
        await trio.lowlevel.checkpoint_if_cancelled()
        call = _Call(functools.partial(fn, *args), trio.lowlevel.current_task())
        with self._lock:
            join = self._open > 0 and self.limiter.available_tokens == 0
            if join:
                self._queue.append(call)
                self.joined += 1
        if join:
            got = await trio.lowlevel.wait_task_rescheduled(functools.partial(self._abort, call))
            if got is not _START:
                return cast(T, got)
        return cast(T, await self._visit(call))

    def _abort(self, call: _Call, _: Any) -> trio.lowlevel.Abort:
        with self._lock:
            if call.state == _QUEUED:
                self._queue.remove(call)
                call.state = _ABORTED
                return trio.lowlevel.Abort.SUCCEEDED
        return trio.lowlevel.Abort.FAILED  # running or run: waited for; or told to start

    async def _visit(self, call: _Call) -> Any:
        token = trio.lowlevel.current_trio_token()
        borrower = object()
        try:
            await self.limiter.acquire_on_behalf_of(borrower)
        except BaseException:
            self._start_next()  # cancelled: the calls queued behind this one need a visit
            raise
        with self._lock:
            self._open += 1
            self.visits += 1
            call.state = _TAKEN

        def deliver(c: _Call, result: outcome.Outcome[Any]) -> None:  # in the worker thread
            token.run_sync_soon(trio.lowlevel.reschedule, c.task, result)

        def ended(last: _Call, result: outcome.Outcome[Any], start: _Call | None) -> None:
            token.run_sync_soon(self._ended, borrower, last, result, start)

        try:
            trio.lowlevel.start_thread_soon(
                functools.partial(self._drain, call, deliver, ended), _ignore)
        except BaseException:
            with self._lock:
                self._open -= 1
            self.limiter.release_on_behalf_of(borrower)
            self._start_next()
            raise
        return await trio.lowlevel.wait_task_rescheduled(_not_abandoned)

    def _drain(self, call: _Call, deliver: Callable[[_Call, outcome.Outcome[Any]], None],
               ended: Callable[[_Call, outcome.Outcome[Any], _Call | None], None]) -> None:
        """In the worker thread: ``call``, then queued ones, each delivered as it ends;
        the last one's with the slot's release."""
        ran = 0
        while True:
            result = outcome.capture(call.fn)
            ran += 1
            start: _Call | None = None
            after: _Call | None = None
            with self._lock:
                if self._queue and ran < self.drain_max:
                    after = self._queue.popleft()
                    after.state = _TAKEN
                else:
                    self._open -= 1
                    if self._queue:  # left for the next visit, which its head starts
                        start = self._queue.popleft()
                        start.state = _PROMOTED
            if after is None:
                ended(call, result, start)
                return
            deliver(call, result)
            call = after

    def _ended(self, borrower: object, last: _Call, result: outcome.Outcome[Any],
               start: _Call | None) -> None:
        """On the trio thread: a visit gives its slot back (before its last caller goes
        on, as ``run_sync``'s callers find it; and before the next visit, so that the
        limiter's waiters go first), and the head of the queue starts the next one."""
        self.limiter.release_on_behalf_of(borrower)
        trio.lowlevel.reschedule(last.task, result)
        if start is not None:
            trio.lowlevel.reschedule(start.task, outcome.Value(_START))

    def _start_next(self) -> None:
        """On the trio thread: a visit did not start; if no visit is left to take the
        queued calls, the head of the queue starts one."""
        with self._lock:
            if self._open > 0 or not self._queue:
                return
            start = self._queue.popleft()
            start.state = _PROMOTED
        trio.lowlevel.reschedule(start.task, outcome.Value(_START))


def _ignore(_: Any) -> None:
    """The thread's own outcome: ``_drain`` delivers every call's (each captured), so it
    raises only if the trio run is over, when no one is waiting."""
