"""ThreadWakeup (wakeup.py): set from worker threads, or before the loop runs."""

import threading

import trio
import trio.testing

from ckptfs.wakeup import ThreadWakeup


def test_a_set_before_the_loop_runs_wakes_the_first_wait() -> None:
    w = ThreadWakeup()
    w.set()  # the catalog's hook, called before the owner's loop started

    async def owner() -> bool:
        with trio.fail_after(10):
            await w.wait()
        w.clear()
        return w.is_set()

    assert trio.run(owner) is False


async def test_a_set_from_a_worker_thread_wakes_the_waiting_owner() -> None:
    w = ThreadWakeup()
    woke = trio.Event()

    async def wait() -> None:
        await w.wait()
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert not woke.is_set()
        await trio.to_thread.run_sync(w.set)
        with trio.fail_after(10):
            await woke.wait()
    assert woke.is_set()


async def test_sets_between_two_clears_wake_once_and_a_later_set_wakes_again() -> None:
    w = ThreadWakeup()
    with trio.fail_after(10):
        threads = [threading.Thread(target=w.set) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        await w.wait()
        w.clear()
        assert not w.is_set()
        await trio.to_thread.run_sync(w.set)
        await w.wait()
        assert w.is_set()


def test_a_set_after_the_loop_ended_is_kept_for_the_next_wait() -> None:
    w = ThreadWakeup()

    async def first() -> None:
        w.set()
        await w.wait()
        w.clear()

    trio.run(first)
    w.set()  # the loop of the last wait is gone: kept, not lost

    async def second() -> bool:
        with trio.fail_after(10):
            await w.wait()
        return True

    assert trio.run(second)
