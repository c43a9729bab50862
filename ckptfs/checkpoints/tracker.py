"""The daemon side of checkpoint awareness: filesystem events in, checkpoint rows out.

The filesystem pushes an ``FsEvent`` after each operation that took effect (never
blocking: an unbounded channel, drained by one task). The tracker runs the detectors in a
worker thread under the catalog limiter (their namespace questions are catalog queries)
and records each Detection in the ``checkpoints`` table. Once a second it also ticks the
detectors (quiescence patterns) and marks as *partial* a checkpoint that began but did not
commit while nothing under it was open for writing for ``partial_after_s``.

With a shared catalog (several nodes, docs/multinode.md "Checkpoints across nodes") each
node runs its own tracker over its own events, and two things change:

* **Writers** are every node's: a file counts as open for writing under a root if this
  node's VFS has a writing handle of it, or any session's open-handle rows say so (asked of
  the catalog once per batch or tick, and only when a detector or the partial marking asks).
  So a commit signal on node a is held while node b still writes a shard, the tick releases
  it once the last writer on any node closed, and no node marks partial a checkpoint that
  another node still writes.
* **Times** go to the catalog on the database's clock: the tracker measures this node's
  offset to it at each tick (``database_now_ns``, corrected by half the round trip) and
  adds it to every recorded time, so begin and commit times of different nodes compare.
  A "begin" whose time is not after the row's commit (a batch of node b that lands after
  node a committed the checkpoint that write belonged to) leaves the commit alone.

**Crashes** (docs/semantics.md, "The commit protocol"): the events are in memory, but the
catalog has a record of every close's commit and every rename in the audit log, written in
the same transaction. At each tick the tracker persists its *replay point* (``fence.py``):
every record older than it has had its event recorded here. At the next mount the
filesystem replays the records from that point (``replayed`` events) before it serves. A
replayed event may have been recorded already: its detections only add what is missing (a
begin of a root without a row; a commit of a root that is not committed, expired or
deleted), never reopen or move back a row.
"""

from __future__ import annotations

import logging
import math
import stat
import time
from collections.abc import Callable
from typing import Protocol

import trio

from .. import crashpoint
from ..catalog.audit import AuditRecord
from ..catalog.protocols import CheckpointCatalog, NamespaceCatalog
from ..catalog.rows import FINISHED_STATES, CheckpointRow, CheckpointState
from ..errors import CatalogUnavailable, CkptfsError
from .detectors import DetectorSet
from .events import RELEASE, RENAME, Detection, Detector, FsEvent
from .fence import SignalFence

log = logging.getLogger("ckptfs.checkpoints")

TICK_S = 1.0
# After the first event of a burst, wait this long for the rest: a save of many small files
# then costs one catalog thread hop per batch of events, not three per file.
BATCH_S = 0.02
# The meta key of a node's replay point (ns, this node's clock: the audit records' times).
REPLAY_KEY = "checkpoint_replay_ns:"


def replay_key(node: str) -> str:
    return REPLAY_KEY + node


class TrackerCatalog(NamespaceCatalog, CheckpointCatalog, Protocol):
    """What the tracker asks of the catalog: paths, the checkpoint rows, and (shared
    catalog) every node's writers and the database's clock."""

    def open_writer_paths(self) -> list[str]: ...

    def database_now_ns(self) -> int: ...

    def set_meta(self, key: str, value: str) -> None: ...


class CatalogView:
    """NamespaceView over the catalog (blocking: call under the catalog limiter).

    ``writing``: the paths of this node's files open for writing; ``elsewhere``: with a
    shared catalog, the paths every node's sessions hold open for writing (a catalog
    query, run at the first question and kept for this view's batch or tick)."""

    def __init__(self, catalog: NamespaceCatalog, writing: list[str],
                 elsewhere: Callable[[], list[str]] | None = None) -> None:
        self.catalog = catalog
        self.writing = writing  # paths of files open for writing now
        self._elsewhere = elsewhere
        self._all: set[str] | None = None

    def exists(self, path: str) -> bool:
        return self.catalog.resolve(path) is not None

    def is_dir(self, path: str) -> bool:
        inode = self.catalog.resolve(path)
        return inode is not None and stat.S_ISDIR(inode.mode)

    def listdir(self, path: str) -> list[str]:
        inode = self.catalog.resolve(path)
        if inode is None or not stat.S_ISDIR(inode.mode):
            return []
        return self.catalog.list_names(inode.ino)

    def open_writers_under(self, path: str) -> int:
        if self._all is None:
            self._all = set(self.writing)
            if self._elsewhere is not None:
                self._all.update(self._elsewhere())
        root = path.rstrip("/")
        return sum(1 for p in self._all if p == root or p.startswith(root + "/"))


class CheckpointTracker:
    def __init__(
        self,
        catalog: TrackerCatalog,
        db_limiter: trio.CapacityLimiter,
        detectors: Detector,  # a DetectorSet
        writing_inos: Callable[[], list[int]],
        partial_after_s: float = 600.0,
        on_commit: Callable[[], None] | None = None,
        shared: bool = False,
        node: str = "",
    ) -> None:
        """``writing_inos``: the inodes open for writing now (the VFS's handles);
        ``on_commit``: a checkpoint committed (retention may run: GcRequests.kick);
        ``shared``: the catalog is shared by several nodes (module docstring);
        ``node``: this node's name in the audit records (its replay point's key)."""
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.detectors = detectors
        self.writing_inos = writing_inos
        self.partial_after_s = partial_after_s
        self._send, self._recv = trio.open_memory_channel[FsEvent](math.inf)
        self.commits = 0  # commits seen, counted on the trio thread
        self._new_commits = 0  # counted in the worker thread of the current batch
        self.on_commit = on_commit  # retention runs after a commit
        self._quiet_since: dict[str, float] = {}  # writing checkpoints with no open writer
        self.shared = shared
        # Shared catalog: the database's clock minus this node's (ns), measured at each
        # tick; recorded times are on the database's clock.
        self.clock_offset_ns = 0
        self._clock_measured = False
        # Crashes: the filesystem fences its signals here; the replay point is persisted
        # at a tick after events were recorded (module docstring).
        self.fence = SignalFence()
        self.node = node
        self._recorded_since_persist = False
        self.replay_point_ns = 0  # the last one persisted (0: none yet)
        self._unrecorded: list[FsEvent] = []  # the batch being recorded (run)

    def push(self, ev: FsEvent) -> None:
        """Called by the filesystem after an operation; never blocks."""
        self._send.send_nowait(ev)

    async def run(self) -> None:
        if self.shared:  # before the first batch records a time
            await trio.to_thread.run_sync(self._measure_clock, limiter=self.db_limiter)
        next_tick = time.monotonic() + TICK_S
        while True:
            # A batch an outage interrupted (the service restarted this run) goes first.
            batch, self._unrecorded = self._unrecorded, []
            if not batch:
                with trio.move_on_at(
                        trio.current_time() + max(0.0, next_tick - time.monotonic())):
                    batch.append(await self._recv.receive())
                if batch:
                    # A deadline after an event: the burst's other events join this batch.
                    # The tick (TICK_S) is a real period: quiescence and settle times are time.
                    await trio.sleep(BATCH_S)
                    while True:  # drain what is queued: one thread hop per batch
                        try:
                            batch.append(self._recv.receive_nowait())
                        except trio.WouldBlock:
                            break
            if batch:
                if crashpoint.ARMED:
                    for ev in batch:
                        if ev.kind in (RELEASE, RENAME):
                            crashpoint.reached("tracker-received", ev.path)
                inos = self.writing_inos()  # read on the trio thread, which owns the handles
                # Kept until recorded: a catalog outage ends this run (the service pauses
                # and starts it again) and the next run records the batch first.
                self._unrecorded = batch
                await trio.to_thread.run_sync(self._observe, batch, inos, limiter=self.db_limiter)
                self._unrecorded = []
                if crashpoint.ARMED:
                    for ev in batch:
                        if ev.kind in (RELEASE, RENAME):
                            crashpoint.reached("tracker-recorded", ev.path)
                self._recorded_since_persist = True
                self._publish_commits()
                continue
            next_tick = time.monotonic() + TICK_S
            inos = self.writing_inos()
            # Taken here, on the trio thread: every event not yet received is stamped later.
            now_ns = time.time_ns()
            # No event is queued now (the receive above timed out with no checkpoint since):
            # every record older than the oldest fenced operation has been recorded.
            point = self._replay_point(now_ns)
            await trio.to_thread.run_sync(self._tick, inos, now_ns, point, limiter=self.db_limiter)
            self._publish_commits()

    async def drain(self) -> None:
        """At a clean unmount, once ``run`` is stopped (FUSE has stopped, the files are
        committed): record what is still queued and move the replay point to now, so the
        next mount replays nothing (a commit still held in memory keeps it where it is)."""
        batch, self._unrecorded = self._unrecorded, []
        while True:
            try:
                batch.append(self._recv.receive_nowait())
            except trio.WouldBlock:
                break
        try:
            if batch:
                inos = self.writing_inos()
                await trio.to_thread.run_sync(self._observe, batch, inos, limiter=self.db_limiter)
                self._recorded_since_persist = True
                self._publish_commits()
            point = self._replay_point(time.time_ns())
            if point is not None:
                await trio.to_thread.run_sync(self.catalog.set_meta, replay_key(self.node),
                                              str(point), limiter=self.db_limiter)
                self.replay_point_ns = point
        except CatalogUnavailable as exc:  # the next mount replays them from the catalog
            log.warning("checkpoint events not recorded at unmount (%s): the next mount "
                        "replays them", exc)

    def _replay_point(self, now_ns: int) -> int | None:
        """The replay point to persist at this tick, or None (unchanged). Held while a
        commit waits in the detectors' memory (held for writers, a Lightning file settling,
        a quiescence pattern): a crash would lose it, and a replay brings it back."""
        if not self._recorded_since_persist:
            return None
        if isinstance(self.detectors, DetectorSet) and self.detectors.pending():
            return None
        oldest = self.fence.oldest()
        point = now_ns if oldest is None else min(now_ns, oldest)
        return point if point > self.replay_point_ns else None

    def _publish_commits(self) -> None:
        """On the trio thread, after a batch: count its commits and tell retention in one
        step, so whoever sees ``commits`` grow also finds the janitor already asked."""
        n, self._new_commits = self._new_commits, 0
        self.commits += n
        if n and self.on_commit is not None:
            self.on_commit()  # retention may run now

    def _view(self, inos: list[int]) -> CatalogView:
        return CatalogView(self.catalog, [self.catalog.path_of(i) for i in inos],
                           self.catalog.open_writer_paths if self.shared else None)

    def _measure_clock(self) -> None:
        """This node's offset to the database's clock (shared catalog). The database read
        its clock between ``before`` and ``after``, so the offset lies within half the
        round trip of the midpoint's; the last offset stays while it still does (no
        jitter between ticks: one node's times keep their order), else the midpoint's is
        taken. A failed sample keeps the last one (the database may be away; the
        tracker's next catalog call says so)."""
        before = time.time_ns()
        try:
            db_now = self.catalog.database_now_ns()
        except CkptfsError:
            log.debug("database clock not measured", exc_info=True)
            return
        after = time.time_ns()
        mid = db_now - (before + after) // 2
        if self._clock_measured and abs(mid - self.clock_offset_ns) <= (after - before) // 2:
            return
        self.clock_offset_ns = mid
        self._clock_measured = True

    def _observe(self, batch: list[FsEvent], inos: list[int]) -> None:
        view = self._view(inos)
        for ev in batch:
            try:
                self._observe_one(ev, view)
            except CatalogUnavailable:
                raise  # not a bug: the service pauses and retries the batch (run)
            except Exception:  # a bug must cost this event's detection, not the others'
                log.exception("checkpoint tracker failed on %s %s", ev.kind, ev.path)

    def _observe_one(self, ev: FsEvent, view: CatalogView) -> None:
        # A replayed rename may have moved the rows already; its source then names
        # nothing, unless something new took the name (whose rows must stay).
        if ev.kind == "rename" and ev.src is not None and not (
                ev.replayed and view.exists(ev.src)):
            self.catalog.rename_checkpoints(ev.src, ev.path)
        if ev.kind in ("unlink", "rmdir"):
            self._removed(ev.path)
        try:
            found = self.detectors.observe(ev, view)
        except CatalogUnavailable:
            raise
        except Exception:  # a detector bug must not stop the filesystem
            log.exception("checkpoint detectors failed on %s %s", ev.kind, ev.path)
            return
        for d in found:
            if ev.replayed:
                self._record_replayed(d)
            else:
                self._record(d)

    def _removed(self, path: str) -> None:
        """The application deleted a checkpoint's root (rotation by the framework): it is
        deleted. (Retention's own deletions are already "expired" and finish themselves.)"""
        for row in self.catalog.checkpoint_rows(path):
            if row.root == path and row.state not in FINISHED_STATES:
                self.catalog.checkpoint_set_state(
                    path, CheckpointState.DELETED, "removed by the application",
                    audit=AuditRecord("checkpoint_deleted"),
                )
                log.info("checkpoint %s deleted by the application", path)

    def _tick(self, inos: list[int], now_ns: int, point: int | None = None) -> None:
        if point is not None:
            # Before the tick's own detections: a crash after them replays from here again.
            self.catalog.set_meta(replay_key(self.node), str(point))
            self.replay_point_ns = point
            self._recorded_since_persist = False
        if self.shared:
            self._measure_clock()
        view = self._view(inos)
        try:
            found = self.detectors.tick(now_ns, view)
        except CatalogUnavailable:
            raise
        except Exception:
            log.exception("checkpoint detectors failed on tick")
            found = []
        for d in found:
            self._record(d)
        rows = self.catalog.checkpoint_rows("/")
        self._mark_partial(view, rows)
        if self.shared and isinstance(self.detectors, DetectorSet):
            # Roots this node saw begin and another node committed: closed here too, so
            # that this node's next write under one begins it again.
            committed = {r.root for r in rows if r.state is CheckpointState.COMMITTED}
            for root in committed.intersection(self.detectors.open_roots()):
                self.detectors.committed_elsewhere(root)

    def _record(self, d: Detection) -> None:
        t_ns = d.time_ns + self.clock_offset_ns  # the database's clock (0: the embedded one)
        if d.kind == "begin":
            if self.catalog.checkpoint_begin(d.root, d.framework, d.step, t_ns,
                                             keep_newer_commit=self.shared):
                log.info("checkpoint %s (%s, step %s): writing", d.root, d.framework, d.step)
        elif d.kind == "commit":
            self.catalog.checkpoint_commit(d.root, d.framework, d.step, t_ns, d.reason,
                                           audit=AuditRecord("checkpoint_commit"))
            self._new_commits += 1  # published on the trio thread (_publish_commits)
            log.info("checkpoint %s (%s, step %s) committed: %s", d.root, d.framework, d.step,
                     d.reason)

    def _record_replayed(self, d: Detection) -> None:
        """A detection of a replayed event: only what the crash may have lost."""
        rows = [r for r in self.catalog.checkpoint_rows(d.root) if r.root == d.root]
        state = rows[0].state if rows else None
        if d.kind == "begin":
            if state is None:
                self._record(d)
        elif state not in (CheckpointState.COMMITTED, *FINISHED_STATES):
            log.warning("checkpoint %s: its commit signal was replayed after a restart", d.root)
            self._record(d)

    def _mark_partial(self, view: CatalogView, rows: list[CheckpointRow]) -> None:
        """A checkpoint still "writing" with no writer open under it for partial_after_s
        (its writer died, or the save was abandoned) is partial: never the latest."""
        now = time.monotonic()
        writing = [c for c in rows if c.state is CheckpointState.WRITING]
        live = set()
        for c in writing:
            root = c.root
            live.add(root)
            if view.open_writers_under(root):
                self._quiet_since.pop(root, None)
                continue
            since = self._quiet_since.setdefault(root, now)
            if now - since >= self.partial_after_s:
                marked = self.catalog.checkpoint_set_state(
                    root, CheckpointState.PARTIAL,
                    f"no commit, no writer for {self.partial_after_s:.0f} s",
                    only_from=CheckpointState.WRITING,  # another node may have committed it
                    audit=AuditRecord("checkpoint_partial"),
                )
                self._quiet_since.pop(root, None)
                if marked:
                    log.warning("checkpoint %s is partial: it began but never committed", root)
        for root in list(self._quiet_since):
            if root not in live:
                del self._quiet_since[root]
