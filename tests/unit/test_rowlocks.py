"""RowLocks (ckptfs/vfs/rowlocks.py): the calls on one inode's row run in the order the
tasks entered ``hold``, one at a time; other inodes do not wait; nothing is kept after."""

from __future__ import annotations

import trio
import trio.testing

from ckptfs.vfs.rowlocks import RowLocks


async def test_one_inode_runs_its_holders_in_the_order_they_came() -> None:
    locks = RowLocks()
    order: list[str] = []
    running: list[str] = []
    first_in = trio.Event()
    go = trio.Event()

    async def call(name: str, ino: int) -> None:
        async with locks.hold(ino):
            running.append(name)
            assert [r for r in running if r.startswith(str(ino))] == [name]  # alone on ino
            if name == "1a":
                first_in.set()
                await go.wait()
            await trio.sleep(0)
            order.append(name)
            running.remove(name)

    async with trio.open_nursery() as n:
        n.start_soon(call, "1a", 1)
        await first_in.wait()
        for name in ("1b", "1c", "1d"):  # queued one after another
            n.start_soon(call, name, 1)
            await trio.testing.wait_all_tasks_blocked()
        n.start_soon(call, "2a", 2)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["2a"]  # another inode does not wait for inode 1
        go.set()
    assert order == ["2a", "1a", "1b", "1c", "1d"]
    assert len(locks) == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_nothing_behind() -> None:
    locks = RowLocks()
    held = trio.Event()
    go = trio.Event()

    async def holder() -> None:
        async with locks.hold(7):
            held.set()
            await go.wait()

    async with trio.open_nursery() as n:
        n.start_soon(holder)
        await held.wait()
        with trio.move_on_after(0.01):
            async with locks.hold(7):
                raise AssertionError("got the lock while it was held")
        async with locks.hold_all([8, 9]):
            assert len(locks) == 3
        go.set()
    assert len(locks) == 0
