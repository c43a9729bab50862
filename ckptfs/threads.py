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
