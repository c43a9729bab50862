"""This node's session in a shared catalog (docs/multinode.md "Node sessions").

The mount registers it before serving (``register``: refused, naming the node, while
another daemon of the same node name has a live session); ``run`` is its heartbeat, a task
of the mount's nursery: every fifth of ``session_timeout`` it extends the session's expiry
(the database's clock) and then ends the sessions of dead nodes (expired: no heartbeat for
``session_timeout``) if this node wins the cleanup; ``close`` ends it at unmount, after the
last commit. The SQL runs in worker threads under the catalog limiter, never on the loop.

* A restart on the same state dir (after a SIGKILL, crash or OOM kill): each registration
  first records its id in the state dir (statedir.SESSION_FILE, fsynced, under the state
  lock). The next daemon holds that lock, so the daemon that recorded the id is dead: its
  live session is ended at registration (as an expired one is), not waited for; an attempt
  it left unanswered is retried with its id, like a lost reply in this process.
* The database unreachable: the heartbeat logs once and keeps trying each period; if the
  outage outlasts the timeout, another node may clean up after this one (below).
* The session gone (this node was paused or cut off longer than the timeout, and a live
  node cleaned up after it): logged as an error; the heartbeat registers again, and its
  ``after_beat`` (the VFS's sync_open_rows) notes the inodes this node holds open anew
  under the new session id, ordered with the opens and closes running meanwhile (the VFS
  owns that order: vfs/rowlocks.py). Meanwhile another node may have dropped an unlinked
  inode this node still reads.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import trio

from . import statedir
from .catalog.protocols import SessionCatalog
from .catalog.rows import SessionEnd
from .errors import CkptfsError

__all__ = ["NodeSession"]

log = logging.getLogger("ckptfs.session")

T = TypeVar("T")

# Collect the chunks of dropped inodes (the store's collect of these digests).
Collect = Callable[[Sequence[bytes]], Awaitable[None]]


class NodeSession:
    """``state_dir``: the state dir this daemon holds the lock of (None: nothing recorded,
    so nothing of an earlier daemon is known; tests of the catalog alone)."""

    def __init__(self, catalog: SessionCatalog, node: str, timeout_s: float, info: str = "",
                 state_dir: Path | None = None) -> None:
        self.catalog = catalog
        self.node = node
        self.timeout_s = timeout_s
        self.period_s = timeout_s / 5
        self.info = info
        self.sid = ""  # the VFS reads it at each open and close (it changes on a re-register)
        self.closed = False
        self.beats = 0  # heartbeats that found the session (tests, status)
        self._pending: list[bytes] = []  # digests of inodes the registration dropped
        # The id of a registration not known to have committed: tried again with the same
        # id, so a lost reply is not a live session that refuses this node until it expires.
        # The ids the state dir records (an earlier daemon's, dead: this one holds the lock):
        # its last session, ended at registration if still live, and its unanswered attempt,
        # taken up as this daemon's own.
        self.state_dir = state_dir
        self._earlier, self._attempt = ("", "") if state_dir is None else \
            statedir.read_session_ids(state_dir)

    # -- registration (before serving: not on a trio loop) ---------------------------------

    def register(self) -> None:
        """Register (blocking: the mount calls it before it serves, the heartbeat in a
        worker thread). UsageError if the node has a live session that is not this state
        dir's; its own earlier session (expired, or of this state dir) is ended on the way."""
        self._attempt = self._attempt or uuid.uuid4().hex
        self._record(self._earlier, self._attempt)  # on disk before the transaction
        earlier = self._earlier
        reg = self.catalog.register_session(self.node, self.timeout_s, self.info,
                                            self._attempt, earlier)
        self._attempt = ""
        self.sid = self._earlier = reg.sid
        if reg.previous is not None:
            self._ended_own(reg.previous, reg.previous.sid == earlier)
        self._record(reg.sid, "")
        log.info("node %s: session registered (timeout %.1f s, heartbeat every %.1f s)",
                 self.node, self.timeout_s, self.period_s)

    def _record(self, sid: str, attempt: str) -> None:
        if self.state_dir is None:
            return
        try:
            statedir.write_session_ids(self.state_dir, sid, attempt)
        except OSError as exc:
            raise CkptfsError(f"state dir {self.state_dir}: cannot record the session id "
                              f"({exc.strerror or exc})") from exc

    def _ended_own(self, end: SessionEnd, this_state_dir: bool) -> None:
        log.warning("node %s restarted: its previous session ended now (%s); %d open handle(s) "
                    "released, %d unlinked inode(s) dropped%s", self.node,
                    "its daemon had this state dir and is gone: its lock is free"
                    if this_state_dir else "it had expired: the daemon died or was stopped "
                    "without unmounting", end.handles, len(end.dropped),
                    f", partial: {', '.join(end.partial)}" if end.partial else "")
        self._pending += end.digests

    def close_blocking(self) -> None:
        """End the session if ``close`` did not (a mount that failed after registering);
        best effort: the session expires by itself otherwise."""
        if self.closed or not self.sid:
            return
        self.closed = True
        try:
            self.catalog.close_session(self.sid)
        except CkptfsError as exc:
            log.warning("node %s: could not end its session (%s); it expires in %.0f s",
                        self.node, exc, self.timeout_s)

    # -- the heartbeat ---------------------------------------------------------------------

    async def run(self, limiter: trio.CapacityLimiter, collect: Collect,
                  after_beat: Callable[[], Awaitable[None]] | None = None) -> None:
        """The heartbeat, until cancelled: a true period (deadlines on trio's clock, not
        sleeps after each beat), one heartbeat and one cleanup attempt per period;
        ``after_beat`` runs after each that reached the catalog (the VFS notes what it
        holds open under a new session id, and the closes an outage kept from it)."""
        if self._pending:
            pending, self._pending = self._pending, []
            await collect(pending)
        deadline = trio.current_time()
        down = False
        while True:
            deadline = max(deadline + self.period_s, trio.current_time())
            await trio.sleep_until(deadline)
            try:
                if await self._db(limiter, self.catalog.heartbeat_session, self.sid, self.timeout_s):
                    self.beats += 1
                else:
                    await self._register_again(limiter)
                ended = await self._db(limiter, self.catalog.cleanup_expired_sessions)
            except CkptfsError as exc:
                if not down:
                    log.warning("node %s: session heartbeat failed (%s); retrying every %.1f s "
                                "(the session expires %.0f s after its last heartbeat)",
                                self.node, exc, self.period_s, self.timeout_s)
                down = True
                continue
            if down:
                log.info("node %s: session heartbeat works again", self.node)
                down = False
            for end in ended:
                log.warning("node %s's session expired: cleaned up after it (%d open handle(s) "
                            "released, %d unlinked inode(s) dropped%s)", end.node, end.handles,
                            len(end.dropped),
                            f", partial: {', '.join(end.partial)}" if end.partial else "")
                if end.digests:
                    await collect(end.digests)
            if after_beat is not None:
                try:
                    await after_beat()
                except CkptfsError as exc:  # the next beat tries again
                    log.debug("node %s: after the heartbeat: %s", self.node, exc)

    async def _register_again(self, limiter: trio.CapacityLimiter) -> None:
        log.error("node %s: its session was gone (this node was paused or cut off from the "
                  "catalog longer than session_timeout = %.0f s, and another node cleaned up "
                  "after it): registering again; unlinked files it had open may be gone",
                  self.node, self.timeout_s)
        # The open inodes are noted anew by after_beat (not here: a note here would race
        # the VFS's opens and closes of the same inodes on other pooled connections).
        await self._db(limiter, self.register)

    async def close(self, limiter: trio.CapacityLimiter, collect: Collect) -> None:
        """End the session at unmount (after the last commit): its handles are released,
        inodes only it held with no name left are dropped."""
        if self.closed or not self.sid:
            return
        self.closed = True
        try:
            end = await self._db(limiter, self.catalog.close_session, self.sid)
        except CkptfsError as exc:
            log.warning("node %s: could not end its session (%s); it expires in %.0f s and a "
                        "live node cleans up after it", self.node, exc, self.timeout_s)
            return
        if end.digests:
            await collect(end.digests)

    @staticmethod
    async def _db(limiter: trio.CapacityLimiter, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter)
