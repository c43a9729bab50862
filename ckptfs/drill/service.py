"""DrillService: restore drills inside the daemon (docs/operations.md "Restore drills").

A drill restores the latest committed checkpoint of a run as a new node would: every
chunk from the remote tiers alone (the local tiers, the read cache and the page cache are
never read), verified against its digest and opened with its namespace's key, into the
scratch directory; then the format checks (checkpoints/formats) read the restored files,
which are removed. On a single-node (SQLite) mount the checkpoint, its files and its
extents come from the bucket's catalog snapshot (drill/snapshot.py), as a new node would
restore them, not from the live catalog; a shared catalog a new node reads itself. The
files are read with the access rules of the namespace's principal
(drill/principal.py): the namespace rules the mount enforces (``check_access``, the VFS's
Access) and the mode bits of every file and directory on the way.

A drill never disturbs a save: before it picks the checkpoint and before each chunk, it
waits while checkpoints are being written (``SaveGate``: the memory budget's event, no
polling), and its reads are paced to ``[drill] bandwidth``. Drills run one at a time, in
the order asked (``ckptfs drill`` through the ``user.ckptfs.drill`` control xattr, or the
``[drill] interval`` schedule). Each is recorded in the catalog with its audit record (one
transaction), reported to its sink (the metrics) and logged: a failure as a WARNING.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import trio

from ..catalog import CheckpointRow, CheckpointState, ChunkRef, Inode
from ..catalog.audit import AuditRecord
from ..catalog.drills import DrillCatalog, DrillRow
from ..catalog.protocols import AuditCatalog, CheckpointCatalog, ContentsCatalog, NamespaceCatalog
from ..checkpoints.formats import DirFiles, check_checkpoint
from ..codec.seal import KEYRING
from ..config.model import DrillConfig, GovernanceConfig
from ..errors import CkptfsError, InvalidArgument, NotFound
from ..tiers.base import Tier
from .principal import Principal, choose_principal, parse_asked
from .restore import restore_chunk
from .snapshot import SnapshotFetch, SnapshotView, open_snapshot

log = logging.getLogger("ckptfs.drill")

T = TypeVar("T")
QUEUE_MAX = 64  # drills asked and not yet run
REPORTS_KEPT = 256  # reports of served tickets (a getxattr may come twice: ERANGE, retry)
PROBLEMS_SHOWN = 20
SCRATCH_NAME = re.compile(r"[0-9]+-[0-9]+")  # a drill's directory in the scratch directory
# A live checkpoint not yet in the bucket's catalog snapshot fails the drill once it
# committed this long before the drill began: the uploader retakes the snapshot every 10 s
# under load and as soon as the uploads drain, so ten minutes is a snapshot that is stuck
# (failing, or a remote refusing it), not one that is merely behind a large upload.
SNAPSHOT_STALE_NS = 600 * 10**9


class DrillServiceCatalog(CheckpointCatalog, NamespaceCatalog, ContentsCatalog, DrillCatalog,
                          AuditCatalog, Protocol):
    """What a drill reads (checkpoints, files, extents) and records (its row, the audit)."""


@dataclass(frozen=True)
class SaveGate:
    """Is a save writing now (chunk buffers in memory), and the wait until it is over."""

    saving: Callable[[], bool]
    save_over: Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class DrillJob:
    run: str
    principal: Principal
    requester: Principal
    pid: int


@dataclass
class Outcome:
    """One drill, being run: what it read and found."""

    job: DrillJob
    checkpoint: CheckpointRow | None = None
    bytes: int = 0
    total: int = 0
    files: int = 0
    waited_s: float = 0.0
    waited: bool = False
    problems: list[str] = field(default_factory=list)
    row: DrillRow | None = None  # as recorded
    source: str = ""  # where the checkpoint and its extents were read: the snapshot's remote
    not_in_snapshot: str = ""  # the live catalog's newer checkpoint the snapshot lacks


class DrillSink(Protocol):
    """Where drills are reported besides the catalog (the metrics: metrics/drills.py)."""

    def observe(self, row: DrillRow) -> None: ...

    def seed(self, last: list[DrillRow], last_passed: list[DrillRow]) -> None: ...


@dataclass(frozen=True)
class _Source:
    """The catalog a drill reads the checkpoint, its files and extents from (the live one,
    or the bucket's snapshot), the limiter of its connection, and each extent as a node
    that restored that catalog records it."""

    catalog: DrillServiceCatalog
    limiter: trio.CapacityLimiter
    as_restored: Callable[[ChunkRef], ChunkRef]

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(lambda: fn(*args), limiter=self.limiter)


# A namespace check of one inode for a principal: None, or why it is refused.
AccessCheck = Callable[[Principal, int], Awaitable[str | None]]


def mode_allows(inode: Inode, who: Principal, bits: int) -> bool:
    """The mode bits (owner, group, other) give ``who`` ``bits`` (4 read, 1 search), as the
    kernel checks them (primary group only: a drill has no process to read groups from)."""
    if who.uid == 0:
        return True
    if who.uid == inode.uid:
        have = inode.mode >> 6
    elif who.gid == inode.gid:
        have = inode.mode >> 3
    else:
        have = inode.mode
    return (have & bits) == bits


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: alive
    return True


def ancestors(path: str) -> list[str]:
    """"/", "/a", "/a/b" for "/a/b/c"."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts))]


class DrillService:
    def __init__(
        self, catalog: DrillServiceCatalog, db_limiter: trio.CapacityLimiter,
        remotes: Sequence[Tier], cfg: DrillConfig, scratch: Path, chunk_size: int,
        gov: GovernanceConfig, check_access: AccessCheck, gate: SaveGate, *,
        sink: DrillSink | None = None, node: str = "", snapshot: SnapshotFetch | None = None,
    ) -> None:
        """``snapshot``: how to fetch the bucket's catalog snapshot (daemon/restore.py
        fetch_snapshot), for a catalog a new node restores from it (SQLite); None: a new
        node reads this catalog itself (shared, PostgreSQL), and so does the drill."""
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.remotes = list(remotes)
        self.cfg = cfg
        self.scratch = scratch
        self.chunk_size = chunk_size
        self.gov = gov
        self.check_access = check_access
        self.gate = gate
        self.sink = sink
        self.node = node
        self.snapshot = snapshot
        self._snap_db = trio.CapacityLimiter(1)  # the snapshot's catalog: one connection
        self._io = trio.CapacityLimiter(1)  # one chunk in flight: a drill is a background read
        self._send, self._receive = trio.open_memory_channel[tuple[int, DrillJob]](QUEUE_MAX)
        self._next = 0
        self._served = 0
        self._reports: dict[int, bytes] = {}
        self._done = trio.Event()  # set (and replaced) when a drill ends
        self._scheduled: set[str] = set()  # runs the schedule queued, not yet started

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(lambda: fn(*args), limiter=self.db_limiter)

    # -- requests ----------------------------------------------------------------------

    async def request(self, ino: int, caller_ids: tuple[int, int], pid: int, value: bytes) -> int:
        """A drill of the run (or checkpoint) at ``ino``, asked by ``caller_ids`` (uid, gid;
        the control xattr checked it owns the inode); its ticket for ``wait``."""
        caller = Principal(*caller_ids)
        asked = parse_asked(value)
        path = await self._db(self.catalog.path_of, ino)
        if asked.run is not None:
            if path != "/":
                raise InvalidArgument('user.ckptfs.drill: "run" is for the mount\'s root')
            path = "/" + "/".join(p for p in asked.run.split("/") if p)
            inode = await self._db(self.catalog.resolve, path)
            if inode is None:
                raise NotFound(f"drill: {path}: no such directory")
        else:
            inode = await self._db(self.catalog.get_inode, ino)
        who = choose_principal(self.gov.namespace_for(path), Principal(inode.uid, inode.gid),
                               caller, asked.principal)
        return self.enqueue(DrillJob(path, who, caller, pid))

    def enqueue(self, job: DrillJob) -> int:
        self._next += 1
        try:
            self._send.send_nowait((self._next, job))
        except trio.WouldBlock:
            self._next -= 1
            raise CkptfsError(f"{QUEUE_MAX} drills are waiting already; ask again later",
                              errno=errno.EBUSY) from None
        return self._next

    def served_ticket(self, ticket: int) -> bool:
        return ticket <= self._served

    async def wait(self, ticket: int) -> bytes:
        """The report (JSON) of drill ``ticket``, once it has run."""
        while ticket > self._served:
            await self._done.wait()
        return self._reports.get(ticket, b'{"result": "unknown", "problem": "report dropped"}')

    # -- the service -------------------------------------------------------------------

    async def run(self) -> None:
        """Serve drills one at a time; every ``[drill] interval`` drill the configured runs."""
        started = trio.current_time()  # the schedule counts from the daemon's start
        await trio.to_thread.run_sync(self._clear_scratch)
        if self.sink is not None:  # the metrics of drills before this mount
            last = await self._db(self.catalog.last_drills)
            self.sink.seed(last, await self._db(self.catalog.last_drills, "passed"))
        async with trio.open_nursery() as nursery:
            if self.cfg.interval_s > 0 and self.cfg.runs:
                nursery.start_soon(self._schedule, started)
            async for ticket, job in self._receive:
                self._scheduled.discard(job.run)  # out of the queue: the next may be queued
                outcome = await self.drill(job)
                self._reports[ticket] = json.dumps(self.report(outcome), sort_keys=True).encode()
                for old in [t for t in self._reports if t <= ticket - REPORTS_KEPT]:
                    del self._reports[old]
                self._served = ticket
                self._done.set()
                self._done = trio.Event()

    async def _schedule(self, started: float) -> None:
        due = started
        while True:
            due += self.cfg.interval_s  # no drift: a long drill does not push the next one
            await trio.sleep_until(due)
            for run in self.cfg.runs:
                if run in self._scheduled:
                    log.info("drill of %s: the last one asked is still waiting", run)
                    continue
                inode = await self._db(self.catalog.resolve, run)
                if inode is None:
                    log.warning("drill: run directory %s does not exist ([drill] runs)", run)
                    continue
                root = Principal(0, 0)
                who = choose_principal(self.gov.namespace_for(run),
                                       Principal(inode.uid, inode.gid), root, None)
                try:
                    self.enqueue(DrillJob(run, who, root, 0))
                    self._scheduled.add(run)
                except CkptfsError as exc:
                    log.warning("drill of %s not scheduled: %s", run, exc)

    # -- one drill ---------------------------------------------------------------------

    async def drill(self, job: DrillJob) -> Outcome:
        """Run one drill and record it (never raises for what it finds)."""
        out = Outcome(job)
        started_ns = time.time_ns()
        t0 = time.perf_counter()
        try:
            await self._yield(out)  # the checkpoint is picked once no save is writing
            await self._restore(out)
        except (CkptfsError, OSError) as exc:  # the scratch directory full, say
            out.problems.append(f"drill stopped: {exc}")
        busy_ns = int((time.perf_counter() - t0 - out.waited_s) * 1e9)
        await self._record(out, started_ns, max(busy_ns, 1))
        return out

    async def _yield(self, out: Outcome) -> None:
        """Wait while a save writes (an event, no polling); the time is not the drill's."""
        if not self.gate.saving():
            return
        if not out.waited:
            log.info("drill of %s waits for a save in progress", out.job.run)
        out.waited = True
        t = time.perf_counter()
        await self.gate.save_over()
        out.waited_s += time.perf_counter() - t

    @staticmethod
    def _latest(catalog: DrillServiceCatalog, run: str) -> CheckpointRow | None:
        """The newest committed checkpoint under ``run`` in ``catalog`` (blocking). A
        symbolic link that is a checkpoint's name (Lightning's ``last.ckpt``) is skipped:
        what it names is a checkpoint of its own, and that one is drilled."""
        rows = sorted((r for r in catalog.checkpoint_rows(run)
                       if r.state == CheckpointState.COMMITTED),
                      key=lambda r: (r.commit_ns or 0, r.id), reverse=True)
        for r in rows:
            inode = catalog.resolve(r.root)
            if inode is not None and not stat.S_ISLNK(inode.mode):
                return r
        return None

    async def _restore(self, out: Outcome) -> None:
        if not self.remotes:
            out.problems.append("no remote tier: a new node would have nothing to restore from")
            return
        where = self.scratch / f"{time.time_ns()}-{os.getpid()}"
        await trio.to_thread.run_sync(self._mkdir, where)
        view: SnapshotView | None = None
        try:
            if self.snapshot is not None:  # what a new node of this mount restores
                t0 = time.perf_counter()
                view = await trio.to_thread.run_sync(
                    open_snapshot, self.remotes, self.snapshot, where, limiter=self._io)
                await self._pace(t0, view.nbytes)  # a large catalog keeps to the cap too
                out.problems += view.problems
                if view.catalog is None:
                    return
                out.source = f"catalog snapshot on {view.tier}"
            src = self._live() if view is None or view.catalog is None else _Source(
                view.catalog, self._snap_db, view.as_restored)
            ckpt = await self._pick(out, src, view)
            if ckpt is not None:
                await self._drill_checkpoint(out, src, ckpt, where / "restored")
        finally:
            if view is not None:
                await trio.to_thread.run_sync(view.close, limiter=self._snap_db)
            await trio.to_thread.run_sync(shutil.rmtree, where, True)

    def _live(self) -> _Source:
        return _Source(self.catalog, self.db_limiter, lambda ref: ref)

    async def _pick(self, out: Outcome, src: _Source,
                    view: SnapshotView | None) -> CheckpointRow | None:
        """The checkpoint to drill: the newest committed one of the catalog read (with a
        snapshot, measured against the live catalog's newest)."""
        run = out.job.run
        ckpt = await src.call(self._latest, src.catalog, run)
        if view is None:
            if ckpt is None:
                out.problems.append(f"{run}: no committed checkpoint to drill")
            return ckpt
        live = await self._db(self._latest, self.catalog, run)
        if ckpt is None:
            out.problems.append(
                f"{run}: no committed checkpoint in the bucket's catalog snapshot (on "
                f"{view.tier}): a new node would find none"
                + ("" if live is None else f" (the live catalog's newest: {live.root})"))
            return None
        if live is not None and live.root != ckpt.root \
                and (live.commit_ns or 0) > (ckpt.commit_ns or 0):
            out.not_in_snapshot = live.root
            age_s = (time.time_ns() - (live.commit_ns or 0)) / 1e9
            log.info("drill of %s: %s (committed %.0f s ago) is not yet in the bucket's "
                     "catalog snapshot; drilling %s, the newest there", run, live.root,
                     age_s, ckpt.root)
            if age_s * 1e9 > SNAPSHOT_STALE_NS:
                out.problems.append(
                    f"{live.root}: committed {age_s:.0f} s ago and still not in the bucket's "
                    f"catalog snapshot (on {view.tier}; its newest checkpoint of {run} is "
                    f"{ckpt.root}): a new node would not see it")
        return ckpt

    async def _drill_checkpoint(self, out: Outcome, src: _Source, ckpt: CheckpointRow,
                                where: Path) -> None:
        out.checkpoint = ckpt
        before = len(out.problems)  # the snapshot's: the checkpoint is still drilled
        files = await src.call(src.catalog.files_under, ckpt.root)
        out.files, out.total = len(files), sum(f.size for f in files)
        if not files:
            out.problems.append(f"{ckpt.root}: the checkpoint holds no file")
            return
        ns = self.gov.namespace_for(ckpt.root)
        sealed = ns.path if ns.encrypt else None
        if sealed is not None and KEYRING.current(sealed) is None:
            out.problems.append(f"namespace {sealed}: its key is missing or revoked "
                                "(no live key version loaded)")
            return
        paths = {f.ino: await src.call(src.catalog.path_of, f.ino) for f in files}
        await self._check_access(out, src, ckpt.root, files, paths)
        if len(out.problems) > before:
            return  # what the principal may not read is not read
        await self._restore_files(out, src, ckpt.root, files, paths, where, sealed)
        if len(out.problems) == before:
            top = where / Path(ckpt.root).name if any(p == ckpt.root for p in paths.values()) \
                else where
            found = await trio.to_thread.run_sync(
                lambda: check_checkpoint(DirFiles(top), ckpt.framework))
            out.problems += [f"{p.file}: {p.what}" for p in found]

    def _clear_scratch(self) -> None:
        """What a drill killed with its daemon left in the scratch directory: only the
        directories drills make (TIME-PID), of daemons no longer running (a scratch
        directory may be shared)."""
        try:
            left = [p for p in self.scratch.iterdir()
                    if SCRATCH_NAME.fullmatch(p.name) and not _alive(int(p.name.split("-")[1]))]
        except OSError:
            return  # none yet
        for p in left:
            log.info("drill: removing %s, left by an earlier drill", p)
            shutil.rmtree(p, ignore_errors=True)

    def _mkdir(self, where: Path) -> None:
        self.scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        where.mkdir(mode=0o700)

    async def _check_access(self, out: Outcome, src: _Source, root: str, files: list[Inode],
                            paths: dict[int, str]) -> None:
        """May the principal reach and read every file (the mount's namespace rules, the
        mode bits the catalog read records)?"""
        who = out.job.principal
        dirs = sorted({d for p in paths.values() for d in ancestors(p)})
        for d in dirs:
            inode = await src.call(src.catalog.resolve, d)
            if inode is None:
                continue  # removed since: its files' reads find that
            inside = d == root or d.startswith(root.rstrip("/") + "/")
            if not mode_allows(inode, who, 5 if inside else 1):
                out.problems.append(f"{d}: uid {who.uid} gid {who.gid} may not "
                                    f"{'list' if inside else 'search'} it (mode "
                                    f"{stat.filemode(inode.mode)})")
                return
        for f in files:
            try:
                refused = await self.check_access(who, f.ino)
            except NotFound:  # removed from the mount since the snapshot: its mode bits
                refused = None
            if refused is None and not mode_allows(f, who, 4):
                refused = f"mode {stat.filemode(f.mode)} does not let it read"
            if refused is not None:
                out.problems.append(f"{paths[f.ino]}: uid {who.uid} gid {who.gid} may not "
                                    f"read it: {refused}")
                return

    async def _restore_files(self, out: Outcome, src: _Source, root: str, files: list[Inode],
                             paths: dict[int, str], where: Path, sealed: str | None) -> None:
        paced_from = time.perf_counter()
        for f in sorted(files, key=lambda i: paths[i.ino]):
            path = paths[f.ino]
            rel = Path(path).name if path == root else os.path.relpath(path, root)
            extents = await src.call(src.catalog.extents, f.ino)
            fd = await trio.to_thread.run_sync(self._create, where / rel)
            try:
                for idx in sorted(extents):
                    before = out.waited_s
                    await self._yield(out)
                    paced_from += out.waited_s - before
                    got = await trio.to_thread.run_sync(
                        restore_chunk, self.remotes, src.as_restored(extents[idx]), fd,
                        idx * self.chunk_size, f"{path} chunk {idx}", sealed, limiter=self._io)
                    out.bytes += got.written
                    out.problems += got.problems
                    await self._pace(paced_from, out.bytes)
                await trio.to_thread.run_sync(os.ftruncate, fd, f.size)
            finally:
                await trio.to_thread.run_sync(os.close, fd)

    @staticmethod
    def _create(path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)

    async def _pace(self, since: float, nbytes: int) -> None:
        """Keep to ``[drill] bandwidth`` bytes/s since ``since`` (0: no cap)."""
        if self.cfg.bandwidth <= 0:
            return
        due = since + nbytes / self.cfg.bandwidth
        now = time.perf_counter()
        if due > now:
            await trio.sleep(due - now)

    # -- the record --------------------------------------------------------------------

    async def _record(self, out: Outcome, started_ns: int, duration_ns: int) -> None:
        job, ckpt = out.job, out.checkpoint
        first = out.problems[0] if out.problems else ""
        row = DrillRow(job.run, "" if ckpt is None else ckpt.root, self.node,
                       job.principal.uid, job.principal.gid, started_ns, duration_ns,
                       out.bytes, out.total, "failed" if out.problems else "passed", first)
        audit = AuditRecord("drill", row.checkpoint or row.run, job.requester.uid, job.pid,
                            detail={"run": row.run, "result": row.result, "bytes": row.bytes,
                                    "duration_ns": duration_ns, "problem": first,
                                    "as_uid": row.uid, "as_gid": row.gid})
        try:
            row = DrillRow(**{**vars(row), "id": await self._db(
                lambda: self.catalog.record_drill(row, audit=audit))})
        except CkptfsError as exc:
            log.warning("drill of %s: could not record it in the catalog: %s", job.run, exc)
        out.row = row
        if self.sink is not None:
            self.sink.observe(row)
        if row.passed:
            log.info("restore drill of %s passed: %s, %d file(s), %d bytes from the remote "
                     "in %.2f s (%.1f MB/s; checkpoint from the %s)", job.run, row.checkpoint,
                     out.files, row.bytes, duration_ns / 1e9, row.mb_per_s,
                     out.source or "live catalog")
        else:
            log.warning("restore drill of %s FAILED (checkpoint %s, %d problem(s)): %s",
                        job.run, row.checkpoint or "-", len(out.problems), first)

    @staticmethod
    def report(out: Outcome) -> dict[str, Any]:
        """What ``ckptfs drill`` prints (the getxattr of ``user.ckptfs.drill``)."""
        ckpt, row = out.checkpoint, out.row
        timing = {} if row is None else {
            "id": row.id, "duration_s": row.duration_ns / 1e9, "mb_per_s": round(row.mb_per_s, 3),
            "implied_restore_s": None if row.implied_s is None else round(row.implied_s, 3)}
        return timing | {"run": out.job.run, "checkpoint": "" if ckpt is None else ckpt.root,
                "framework": "" if ckpt is None else ckpt.framework,
                "as": [out.job.principal.uid, out.job.principal.gid], "files": out.files,
                "bytes": out.bytes, "total_bytes": out.total, "waited_for_save": out.waited,
                "result": "failed" if out.problems else "passed",
                "source": out.source or "live catalog", "not_in_snapshot": out.not_in_snapshot,
                "problems": out.problems[:PROBLEMS_SHOWN], "problem_count": len(out.problems)}
