"""The remote GET slots (chunks/priority.py) and the receive-buffer pool (chunks/bufpool.py)."""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

import trio
import trio.testing

from ckptfs.chunks.bufpool import FrameBuffer, FramePool, MiB, unviewed
from ckptfs.chunks.priority import PriorityLimiter, Ticket


async def _queue(lim: PriorityLimiter, tickets: list[tuple[str, Ticket]],
                 order: list[str], nursery: trio.Nursery) -> None:
    async def one(name: str, t: Ticket) -> None:
        await lim.acquire(t)
        order.append(name)

    for name, t in tickets:
        nursery.start_soon(one, name, t)
        await trio.testing.wait_all_tasks_blocked()


async def test_urgent_waiters_go_before_readahead_fifo_within_each() -> None:
    lim = PriorityLimiter(1)
    await lim.acquire(Ticket(urgent=False))  # the one slot is taken
    order: list[str] = []
    async with trio.open_nursery() as n:
        await _queue(lim, [("ahead1", Ticket(False)), ("ahead2", Ticket(False)),
                           ("need1", Ticket(True)), ("need2", Ticket(True))], order, n)
        assert lim.waiting == 4 and not order
        for _ in range(4):
            lim.release()
            await trio.testing.wait_all_tasks_blocked()
    assert order == ["need1", "need2", "ahead1", "ahead2"]
    assert lim.borrowed_tokens == 1  # the last one still holds its slot
    lim.release()
    assert lim.borrowed_tokens == 0


async def test_a_promoted_readahead_goes_with_the_urgent_ones() -> None:
    lim = PriorityLimiter(1)
    await lim.acquire(Ticket(urgent=True))
    order: list[str] = []
    late = Ticket(False)
    async with trio.open_nursery() as n:
        await _queue(lim, [("ahead1", Ticket(False)), ("late", late),
                           ("need", Ticket(True))], order, n)
        lim.promote(late)  # a reader now waits for the chunk this ticket fetches
        for _ in range(3):
            lim.release()
            await trio.testing.wait_all_tasks_blocked()
    assert order == ["need", "late", "ahead1"]


async def test_a_cancelled_waiter_leaves_the_queue_and_the_slot_passes_on() -> None:
    lim = PriorityLimiter(1)
    await lim.acquire(Ticket(True))
    order: list[str] = []
    async with trio.open_nursery() as n:
        gone = trio.CancelScope()

        async def cancelled() -> None:
            with gone:
                await lim.acquire(Ticket(True))
                order.append("cancelled")

        n.start_soon(cancelled)
        await trio.testing.wait_all_tasks_blocked()
        await _queue(lim, [("next", Ticket(False))], order, n)
        gone.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert lim.waiting == 1
        lim.release()
    assert order == ["next"] and lim.borrowed_tokens == 1


async def test_a_slot_is_held_by_the_thread_until_it_ends() -> None:
    lim = PriorityLimiter(2)
    seen: list[int] = []

    def work() -> None:
        seen.append(lim.borrowed_tokens)

    async def one() -> None:
        slot: Any = lim.slot(Ticket(True))  # trio's stub names CapacityLimiter only
        await trio.to_thread.run_sync(work, limiter=slot)

    async with trio.open_nursery() as n:
        for _ in range(4):
            n.start_soon(one)
    assert len(seen) == 4 and max(seen) <= 2 and lim.borrowed_tokens == 0


def test_a_viewed_buffer_is_never_handed_out_again() -> None:
    pool = FramePool(keep=4)
    a = pool.take(16 * MiB + 64)
    assert isinstance(a, FrameBuffer) and len(a) == 17 * MiB
    view = memoryview(a)[64:]  # a reply (or a copy-back) still holds the chunk
    a[100] = 7
    pool.give(a)
    b = pool.take(16 * MiB + 64)
    assert b is not a and pool.reused == 0
    assert view[36] == 7  # untouched
    del view
    pool.give(b)
    c = pool.take(16 * MiB + 64)  # a's last view is gone: a is reused (the oldest first)
    assert c is a and pool.reused == 1


def test_the_pool_keeps_few_buffers_and_skips_odd_sizes() -> None:
    pool = FramePool(keep=2)
    assert pool.take(1000) is None  # small bodies are read into plain bytes
    bufs = [pool.take(4 * MiB) for _ in range(3)]
    for b in bufs:
        pool.give(b)
    pool.give(bytearray(4 * MiB))  # not the pool's: ignored
    pool.give(mmap.mmap(-1, 4 * MiB))
    big = pool.take(64 * MiB)  # too big for any idle one: a new buffer
    assert all(big is not b for b in bufs) and pool.reused == 0
    again = pool.take(4 * MiB)
    assert again is bufs[1] or again is bufs[2]
    assert again is not bufs[0]  # beyond ``keep``: let go


def test_unviewed_tells_live_exports() -> None:
    buf = FrameBuffer(-1, MiB)
    assert unviewed(buf) and len(buf) == MiB
    view = memoryview(buf)[2:4]
    assert not unviewed(buf)
    view.release()
    assert unviewed(buf)



def test_new_receive_buffers_are_private_memory_not_shared_memory() -> None:
    """A pool buffer is a private anonymous mapping: mmap's default (MAP_SHARED) is shmem,
    whose pages fault in more slowly (chunks/bufpool.py, ``new_buffer``)."""
    buf = FramePool(keep=1).take(4 * MiB)
    assert buf is not None
    holder = ctypes.c_char.from_buffer(buf)
    start = ctypes.addressof(holder)
    del holder
    with open("/proc/self/maps") as f:
        rows = [ln.split() for ln in f]
    row = next(r for r in rows if int(r[0].split("-")[0], 16) <= start < int(r[0].split("-")[1], 16))
    assert row[1].endswith("p"), row  # private ("s": shared)
    assert len(row) < 6 or not row[5].startswith("/dev/zero"), row  # not a shmem file
