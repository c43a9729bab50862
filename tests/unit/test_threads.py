"""ckptfs/threads.py: the lighter worker-thread call keeps what trio.to_thread.run_sync's
callers rely on: results and errors delivered, cancellation checked before the call, a
started call waited for (never abandoned), the limiter slot held until it returned."""

import threading

import pytest
import trio
import trio.testing

from ckptfs import threads
from ckptfs.errors import NotFound


async def test_result_and_error_come_back_from_the_thread() -> None:
    lim = trio.CapacityLimiter(1)
    main = threading.get_ident()
    assert await threads.run_sync(lambda a, b: (a + b, threading.get_ident() != main),
                                  2, 3, limiter=lim) == (5, True)

    def fails() -> None:
        raise NotFound("inode 7")

    with pytest.raises(NotFound, match="inode 7"):
        await threads.run_sync(fails, limiter=lim)
    assert lim.borrowed_tokens == 0


async def test_cancelled_before_the_call_runs_nothing() -> None:
    ran: list[int] = []
    with trio.CancelScope() as cs:
        cs.cancel()
        await threads.run_sync(ran.append, 1, limiter=trio.CapacityLimiter(1))
    assert cs.cancelled_caught and ran == []


async def test_a_started_call_is_waited_for_and_holds_its_slot() -> None:
    lim = trio.CapacityLimiter(1)
    gate, started = threading.Event(), threading.Event()
    got: list[object] = []
    scopes: list[trio.CancelScope] = []

    def work(n: int) -> int:
        started.set()
        assert gate.wait(10)
        return n

    async def caller() -> None:
        with trio.CancelScope() as cs:
            scopes.append(cs)
            got.append(await threads.run_sync(work, 7, limiter=lim))
            await trio.lowlevel.checkpoint()  # the cancellation lands here, after the call
            got.append("not reached")

    async def second() -> None:
        got.append(await threads.run_sync(lambda: "second", limiter=lim))

    async with trio.open_nursery() as n:
        n.start_soon(caller)
        await trio.to_thread.run_sync(started.wait)
        n.start_soon(second)
        scopes[0].cancel()
        await trio.testing.wait_all_tasks_blocked()
        # Still running in its thread: not abandoned, the slot still held, the second
        # call waits for it.
        assert got == [] and lim.borrowed_tokens == 1 and lim.statistics().tasks_waiting == 1
        gate.set()
    assert got == [7, "second"] and scopes[0].cancelled_caught
    assert lim.borrowed_tokens == 0
