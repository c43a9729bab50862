"""The daemon's background services, run in one nursery around a front end's serving and
stopped in order (``running``); no service's error ends the daemon (supervise.py)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import trio

from ..catalog.rows import ChunkRef
from ..errors import CatalogUnavailable
from ..stats import Stats
from ..supervise import supervised
from .build import Daemon

log = logging.getLogger("ckptfs.mount")


class _Services:
    """Background services started together and stopped together, in their own cancel
    scopes inside the mount's nursery; ``stop`` returns once every one has ended. No
    service's error ends the daemon (supervise.py): an outage of the catalog pauses it, an
    unexpected error is logged, counted in ``stats`` (status: degraded) and it starts again,
    both after a backoff."""

    def __init__(self, nursery: trio.Nursery, stats: Stats | None = None) -> None:
        self._nursery = nursery
        self._stats = stats
        self._scopes: list[trio.CancelScope] = []
        self._running = 0
        self._ended = trio.Event()

    def start(self, name: str, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        scope = trio.CancelScope()
        self._scopes.append(scope)
        self._running += 1
        self._nursery.start_soon(self._run, scope, name, fn, args)

    async def _run(
        self, scope: trio.CancelScope, name: str, fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
    ) -> None:
        try:
            with scope:
                await supervised(self._stats, name, fn, *args)
        finally:
            self._running -= 1
            if self._running == 0:
                self._ended.set()

    async def stop(self) -> None:
        for scope in self._scopes:
            scope.cancel()
        if self._running:
            await self._ended.wait()



@contextlib.asynccontextmanager
async def running(daemon: Daemon, *, drain: bool = True) -> AsyncIterator[trio.Nursery]:
    """Run the daemon's background services in one nursery around the body (which serves
    FUSE, or a test's requests). The shutdown order, once the body returns:

    1. the body ends: FUSE has stopped (the kernel sends no more requests);
    2. writers drain: open files are committed and synced (``Filesystem.shutdown``;
       ``drain=False``, as in tests that stop as a crash would, skips it);
    3. the tracker and the janitor stop (no new retention, evictions or deletions); the
       node's session (shared catalog) stops its heartbeat and is closed (after the last
       commit: what only this node held open and has no name left is dropped); then the
       upload and deletion queues and the statistics;
    4. the nursery's remaining tasks (chunk writes, heals, copy-backs, readahead) are
       cancelled; the caller closes the catalog last, after ``running`` returned.
    """
    d = daemon

    async def collect(digests: Sequence[bytes]) -> None:  # chunks of inodes a session dropped
        await d.store.collect(ChunkRef(x, 0, ()) for x in digests)

    async with trio.open_nursery() as nursery:
        producers, queues, heartbeat = await _start(d, nursery, collect)
        await d.fs.replay_signals()  # commit signals a crash kept from the tracker
        await d.fs.recover()
        yield nursery
        if drain:
            await d.fs.shutdown()
            await d.store.moves.end_now()  # the files are closed: their moves' records end
        await producers.stop()
        if drain and d.tracker is not None:
            await d.tracker.drain()  # what is queued is recorded; the next mount replays nothing
        if drain:  # (a crash, drain=False, loses the noted opens)
            await _last_audit(d)
        await heartbeat.stop()
        if d.session is not None and drain:
            await d.session.close(d.db_limiter, collect)
        await queues.stop()
        nursery.cancel_scope.cancel()


async def _start(
    d: Daemon, nursery: trio.Nursery, collect: Callable[[Sequence[bytes]], Awaitable[None]],
) -> tuple[_Services, _Services, _Services]:
    """Start the services: those that produce work, the queues that drain it, and the
    node's heartbeat (stopped in that order, after the queues' producers)."""
    if not d.catalog.shared:
        # One node: every move of an uncommitted chunk still recorded is an earlier
        # run's that died before its end (a shared catalog ends a node's with its session).
        await trio.to_thread.run_sync(d.catalog.release_moves, None, limiter=d.db_limiter)
    d.store.attach(nursery)  # heals and copy-backs
    d.fs.attach(nursery)  # the open files' chunk writes and readahead
    stats = d.store.stats  # where a service's unexpected errors are counted
    producers, queues = _Services(nursery, stats), _Services(nursery, stats)
    queues.start("uploader", d.uploader.run)  # replays the jobs left by an earlier run
    queues.start("deleter", d.deleter.run)  # drains rows left by an earlier run at once
    queues.start("auditor", d.auditor.run)  # the opens' records
    if d.refusals is not None:
        queues.start("refusals", d.refusals.run)  # refused access, one record per window
    if d.sealer is not None:
        queues.start("sealer", d.sealer.run)
    if d.tracker is not None:
        producers.start("tracker", d.tracker.run)
    producers.start("janitor", d.janitor.run)
    if d.drill is not None:
        producers.start("drill", d.drill.run)  # restore drills: asked, or on a schedule
    if d.stats_path is not None:
        queues.start("telemetry", d.telemetry.publish, d.stats_path)
    if d.keys is not None:
        producers.start("keys", d.keys.run, d.db_limiter, d.store.forget_keys)
    if d.scrubber is not None:
        producers.start("scrubber", d.scrubber.run)  # reads copies: stops before the queues
    heartbeat = _Services(nursery, stats)
    if d.session is not None:
        heartbeat.start("session", d.session.run, d.db_limiter, collect,
                        d.fs.sync_open_rows)
    return producers, queues, heartbeat


async def _last_audit(d: Daemon) -> None:
    """At shutdown, FUSE stopped: close the windows of refused access, write the records
    still noted, and seal the head."""
    if d.refusals is not None:
        d.refusals.close()
    try:
        await d.auditor.flush_now()
    except CatalogUnavailable as exc:
        log.warning("audit: %d open record(s) lost at shutdown: %s",
                    d.catalog.audit_pending(), exc)
        return
    if d.sealer is not None:
        await d.sealer.seal_once()
