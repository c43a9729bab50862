"""The daemon's session heartbeat (ckptfs/session.py) in-process on the real PostgreSQL: a
true period that never blocks the trio loop, one warning while the database is down and
recovery when it is back, and a new registration when the session was cleaned up while
this node was paused, followed by ``after_beat`` under the new session id (where the VFS
notes its open inodes anew: tests/vfs/test_open_rows.py)."""

from __future__ import annotations

import logging
import stat
from collections.abc import Sequence

import pytest
import trio

from tests.support.mountutil import wait_until
from tests.support.pgserver import PgServer

from ckptfs.catalog import ROOT_INODE, PostgresCatalog
from ckptfs.session import NodeSession

F = stat.S_IFREG | 0o644
TIMEOUT = 1.0  # s; the heartbeat every 0.2 s


@pytest.mark.slow
@pytest.mark.allow_log_errors  # the re-registration's error, the pool's lost connections
@pytest.mark.allow_log_warnings
def test_the_heartbeat_rides_out_an_outage_and_registers_again_after_a_cleanup(
    postgres: PgServer, pg_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ckptfs.session")
    cat, other = PostgresCatalog(pg_url, pool_size=2), PostgresCatalog(pg_url, pool_size=2)
    try:
        session = NodeSession(cat, "a", TIMEOUT)
        session.register()
        ino = cat.create(ROOT_INODE, b"f", F, 0, 0).ino
        cat.note_open(session.sid, ino)
        collected: list[bytes] = []
        after: list[str] = []  # the session id at each after_beat

        async def after_beat() -> None:
            after.append(session.sid)

        async def collect(digests: Sequence[bytes]) -> None:
            collected.extend(digests)

        def messages(level: int) -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.name == "ckptfs.session" and r.levelno == level]

        async def main() -> None:
            limiter = trio.CapacityLimiter(2)
            gaps: list[float] = []

            async def ticker() -> None:  # the loop stays responsive throughout
                last = trio.current_time()
                while True:
                    await trio.sleep(0.02)
                    now = trio.current_time()
                    gaps.append(now - last)
                    last = now

            async with trio.open_nursery() as n:
                n.start_soon(ticker)
                beat = trio.CancelScope()

                async def heartbeat() -> None:
                    with beat:
                        await session.run(limiter, collect, after_beat)

                n.start_soon(heartbeat)
                start = trio.current_time()
                while session.beats < 5:
                    await trio.sleep(0.01)
                took = trio.current_time() - start
                assert 5 * TIMEOUT / 5 - 0.05 <= took < 5 * TIMEOUT / 5 + 1.5, took  # a period

                # The database goes away for longer than a few periods.
                await trio.to_thread.run_sync(postgres.stop)
                try:
                    while len(messages(logging.WARNING)) < 1:
                        await trio.sleep(0.05)
                    before = session.beats
                    await trio.sleep(4 * TIMEOUT / 5)  # several failed beats: logged once
                    assert session.beats == before
                    assert len(messages(logging.WARNING)) == 1, messages(logging.WARNING)
                finally:
                    await trio.to_thread.run_sync(postgres.start)
                while session.beats < before + 2:
                    await trio.sleep(0.05)
                assert any("works again" in m for m in messages(logging.INFO))
                assert max(gaps) < 0.5, max(gaps)

                # This node "pauses" longer than the timeout: another node cleans up after it.
                beat.cancel()
                first = session.sid
                await trio.to_thread.run_sync(wait_until, lambda: other.cleanup_expired_sessions(),
                                              10, "the other node cleans up")
                assert other.sessions() == [] and other.open_inodes() == set()
                beat = trio.CancelScope()
                n.start_soon(heartbeat)
                while session.sid == first or session.sid not in after:
                    await trio.sleep(0.05)
                assert [s.node for s in other.sessions()] == ["a"]
                assert any("its session was gone" in m for m in messages(logging.ERROR))
                n.cancel_scope.cancel()

        trio.run(main)
    finally:
        postgres.start()
        cat.close()
        other.close()
