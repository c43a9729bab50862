"""ckptfs/threads.py: the lighter worker-thread call keeps what trio.to_thread.run_sync's
callers rely on: results and errors delivered, cancellation checked before the call, a
started call waited for (never abandoned), the limiter slot held until it returned."""

import functools
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


# -- CallQueue: concurrent calls share worker-thread visits ---------------------------------


class Gate:
    """A first call that holds its visit (and the slot) until the test opens the gate."""

    def __init__(self) -> None:
        self.started, self.open = threading.Event(), threading.Event()

    def hold(self, log: list[str], name: str) -> str:
        self.started.set()
        assert self.open.wait(10)
        log.append(name)
        return name


async def until_blocked(q: threads.CallQueue, joined: int) -> None:
    await trio.testing.wait_all_tasks_blocked()
    assert q.joined == joined


async def test_queued_calls_run_in_the_visit_under_way_in_order() -> None:
    lim = trio.CapacityLimiter(1)
    q = threads.CallQueue(lim)
    gate, log, got = Gate(), list[str](), dict[str, str]()
    workers: set[int] = set()

    def work(name: str) -> str:
        workers.add(threading.get_ident())
        log.append(name)
        return name.upper()

    async def call(name: str) -> None:
        got[name] = await q.run_sync(work, name)

    async def first() -> None:
        got["a"] = await q.run_sync(gate.hold, log, "a")

    async with trio.open_nursery() as n:
        n.start_soon(first)
        await trio.to_thread.run_sync(gate.started.wait)
        for name in "bcde":
            n.start_soon(call, name)
            await until_blocked(q, "bcde".index(name) + 1)
        assert log == [] and lim.borrowed_tokens == 1
        gate.open.set()
    assert log == ["a", "b", "c", "d", "e"]
    assert got == {"a": "a", "b": "B", "c": "C", "d": "D", "e": "E"}
    assert q.visits == 1 and q.joined == 4 and len(workers) == 1
    assert lim.borrowed_tokens == 0


async def test_each_queued_call_gets_its_own_result_or_error() -> None:
    lim = trio.CapacityLimiter(1)
    q = threads.CallQueue(lim)
    gate, log = Gate(), list[str]()
    results: dict[str, object] = {}

    def fails() -> None:
        raise NotFound("inode 9")

    async def call(name: str, fn: object) -> None:
        try:
            results[name] = await q.run_sync(fn)  # type: ignore[arg-type]
        except NotFound as exc:
            results[name] = exc

    async with trio.open_nursery() as n:
        n.start_soon(q.run_sync, gate.hold, log, "a")
        await trio.to_thread.run_sync(gate.started.wait)
        n.start_soon(call, "bad", fails)
        await until_blocked(q, 1)
        n.start_soon(call, "good", lambda: 42)
        await until_blocked(q, 2)
        gate.open.set()
    assert isinstance(results["bad"], NotFound) and results["good"] == 42
    assert q.visits == 1 and lim.borrowed_tokens == 0


async def test_a_full_visit_gives_the_slot_to_other_waiters_before_the_next() -> None:
    """drain_max: a visit gives its slot back; the limiter's other users (FIFO) go before
    the next visit, which the head of the queue starts."""
    lim = trio.CapacityLimiter(1)
    q = threads.CallQueue(lim, drain_max=2)
    gate, log = Gate(), list[str]()

    async with trio.open_nursery() as n:
        n.start_soon(q.run_sync, gate.hold, log, "a")
        await trio.to_thread.run_sync(gate.started.wait)
        for i, name in enumerate("bcd"):
            n.start_soon(q.run_sync, log.append, name)
            await until_blocked(q, i + 1)
        n.start_soon(functools.partial(trio.to_thread.run_sync, log.append, "other", limiter=lim))
        await trio.testing.wait_all_tasks_blocked()
        assert lim.statistics().tasks_waiting == 1
        gate.open.set()
    assert log == ["a", "b", "other", "c", "d"]
    assert q.visits == 2 and lim.borrowed_tokens == 0


async def test_a_cancelled_queued_call_never_runs_and_the_others_do() -> None:
    lim = trio.CapacityLimiter(1)
    q = threads.CallQueue(lim)
    gate, log = Gate(), list[str]()
    scope = trio.CancelScope()

    async def cancelled() -> None:
        with scope:
            await q.run_sync(log.append, "b")
            log.append("b returned")

    async with trio.open_nursery() as n:
        n.start_soon(q.run_sync, gate.hold, log, "a")
        await trio.to_thread.run_sync(gate.started.wait)
        n.start_soon(cancelled)
        await until_blocked(q, 1)
        n.start_soon(q.run_sync, log.append, "c")
        await until_blocked(q, 2)
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        gate.open.set()
    assert log == ["a", "c"] and scope.cancelled_caught
    assert lim.borrowed_tokens == 0


async def test_a_head_cancelled_while_waiting_for_the_slot_hands_the_queue_on() -> None:
    """The head of the queue, told to start the next visit, is cancelled while another
    user holds the slot: the call behind it starts the visit instead; nothing is lost."""
    lim = trio.CapacityLimiter(1)
    q = threads.CallQueue(lim, drain_max=1)
    gate, log = Gate(), list[str]()
    scope = trio.CancelScope()
    outsider_in, outsider_out = trio.Event(), trio.Event()

    async def outsider() -> None:
        async with lim:
            outsider_in.set()
            await outsider_out.wait()

    async def head() -> None:
        with scope:
            await q.run_sync(log.append, "b")

    async with trio.open_nursery() as n:
        n.start_soon(q.run_sync, gate.hold, log, "a")
        await trio.to_thread.run_sync(gate.started.wait)
        n.start_soon(head)
        await until_blocked(q, 1)
        n.start_soon(q.run_sync, log.append, "c")
        await until_blocked(q, 2)
        n.start_soon(outsider)
        await trio.testing.wait_all_tasks_blocked()
        gate.open.set()  # a's visit ends (drain_max 1): the outsider, then b's visit
        await outsider_in.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert lim.statistics().tasks_waiting == 1  # b, told to start a visit
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        outsider_out.set()
    assert log == ["a", "c"] and scope.cancelled_caught
    assert q.visits == 2 and lim.borrowed_tokens == 0


async def test_a_started_queued_call_is_waited_for_when_cancelled() -> None:
    lim = trio.CapacityLimiter(1)
    q = threads.CallQueue(lim)
    first, second = Gate(), Gate()
    log: list[str] = []
    got: list[str] = []
    scope = trio.CancelScope()

    async def joined() -> None:
        with scope:
            got.append(await q.run_sync(second.hold, log, "b"))
            await trio.lowlevel.checkpoint()
            got.append("not reached")

    async with trio.open_nursery() as n:
        n.start_soon(q.run_sync, first.hold, log, "a")
        await trio.to_thread.run_sync(first.started.wait)
        n.start_soon(joined)
        await until_blocked(q, 1)
        first.open.set()
        await trio.to_thread.run_sync(second.started.wait)  # b runs in a's visit
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and lim.borrowed_tokens == 1
        second.open.set()
    assert got == ["b"] and log == ["a", "b"] and scope.cancelled_caught
    assert lim.borrowed_tokens == 0


async def test_without_concurrency_every_call_is_a_visit_of_its_own() -> None:
    lim = trio.CapacityLimiter(1)
    q = threads.CallQueue(lim)
    assert [await q.run_sync(lambda i=i: i * 2) for i in range(5)] == [0, 2, 4, 6, 8]
    assert q.visits == 5 and q.joined == 0 and lim.borrowed_tokens == 0
