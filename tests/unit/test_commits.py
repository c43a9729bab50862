"""CommitStream (upload/commits.py): upload jobs queued less than QUIET_S apart are a
stream, which the upload queue treats as a save. Trio's clock is a MockClock here."""

import trio
import trio.testing

from ckptfs.upload.commits import QUIET_S, CommitStream


async def test_a_stream_runs_until_quiet_s_without_a_queueing(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = CommitStream()
    assert not s.running() and not s.wake.is_set()
    s.queued()
    assert s.running() and s.wake.is_set()
    mock_clock.jump(QUIET_S / 2)
    s.queued()  # the stream goes on: its end moves
    mock_clock.jump(QUIET_S * 0.75)
    assert s.running()  # 1.25 QUIET_S after the first, 0.75 after the last
    mock_clock.jump(QUIET_S * 0.5)
    assert not s.running()
    assert s.wake.is_set()  # the wake stays until its owner clears it
    s.wake.clear()
    assert not s.wake.is_set()


async def test_wait_quiet_returns_at_the_deadline_the_last_queueing_set(
    mock_clock: trio.testing.MockClock,
) -> None:
    s = CommitStream()
    with trio.fail_after(1):
        await s.wait_quiet()  # nothing queued: at once, trio time unchanged
    assert trio.current_time() == 0
    returned: list[float] = []

    async def waiter() -> None:
        await s.wait_quiet()
        returned.append(trio.current_time())

    s.queued()
    async with trio.open_nursery() as n:
        n.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(QUIET_S * 0.6)
        s.queued()  # moves the end to 1.6 QUIET_S
        mock_clock.jump(QUIET_S * 0.6)
        await trio.testing.wait_all_tasks_blocked()
        assert not returned  # 1.2 QUIET_S: the second queueing holds it
        mock_clock.jump(QUIET_S)
    assert returned and returned[0] >= 1.6 * QUIET_S and not s.running()


async def test_the_wake_is_set_once_jobs_were_queued() -> None:
    s = CommitStream()
    with trio.fail_after(1):  # a wake that never came fails, not hangs
        async with trio.open_nursery() as n:
            n.start_soon(s.wake.wait)
            await trio.testing.wait_all_tasks_blocked()
            s.queued()
    with trio.fail_after(1):
        await s.wake.wait()  # still set until cleared
