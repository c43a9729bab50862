"""The filesystem without the kernel: typed async methods that raise CkptfsError.

The FUSE adapter (``ckptfs.fuse.ops``) only converts types and errors; tests can call this
class directly. Catalog work runs in one worker thread at a time (``db_limiter``), chunk
work in the ChunkStore's threads; nothing here blocks the trio loop.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import trio

from .. import crashpoint, threads
from ..catalog import Around, Catalog, CheckpointRow, ChunkRef, Inode
from ..catalog.audit import AuditRecord
from ..catalog.catalog import ROOT_INODE
from ..checkpoints.events import SMALL_FILE, TAIL, FsEvent
from ..checkpoints.fence import SignalFence
from ..checkpoints.tracker import replay_key
from ..chunks.service import FrontEndChunks
from ..chunks.tierview import TierView
from ..codec.frame import Buffer
from ..codec.staged import StagePool
from ..config import DEFAULT_READAHEAD, DurabilityPolicy, GovernanceConfig, policy_for
from ..errors import (
    CatalogUnavailable,
    CkptfsError,
    InvalidArgument,
    IsADirectory,
    NameTooLong,
    NoAttribute,
    NoSpace,
    NotADirectory,
    NotFound,
    NotPermitted,
    NotSupported,
    PermissionDenied,
)
from ..service import syncfs_all
from .access import Access
from .context import ROOT, RequestContext
from .control import XATTR_GC, XATTR_PREFETCH, XATTR_TAG, check_control, is_control
from .dirattrs import DirAttrs
from .listing import listing, page_after
from .names import KnownNames
from .openfile import MemoryBudget, OpenFile, OpenFiles, Services
from .pagepush import PagePush
from .quota import Quotas
from .rowlocks import RowLocks

log = logging.getLogger("ckptfs.vfs")

T = TypeVar("T")

NAME_MAX = 255
XATTR_STATE = b"user.ckptfs.state"
XATTR_RECORD = b"user.ckptfs.checkpoint"
# Files whose cached version a node remembers (shared catalog); older ones drop their pages.
CACHED_VERSIONS_MAX = 1 << 16
STAGE_PARALLEL = 4  # chunks of one file fetched and written at once by a prefetch
XATTRS = (XATTR_STATE, XATTR_RECORD)
XATTR_RESERVED = b"user.ckptfs."  # ckptfs's own names: never stored
XATTR_STORED_PREFIXES = (b"user.", b"trusted.", b"security.")
XATTR_NAME_MAX = 255  # as Linux: longer names give ERANGE
XATTR_SIZE_MAX = 65536  # as Linux: larger values give E2BIG
# The names and values of one inode's stored xattrs together: room for a value of the
# largest size and as much again; past it ENOSPC, as ext4 when an inode's xattr space is
# full. Every one is a catalog row, read back whole and carried by the catalog snapshot.
XATTR_TOTAL_MAX = 2 * XATTR_SIZE_MAX
SETID = stat.S_ISUID | stat.S_ISGID


def _check_name(name: bytes) -> bytes:
    if len(name) > NAME_MAX:
        raise NameTooLong(f"name of {len(name)} bytes (at most {NAME_MAX})")
    return name


def _owner_rules(
    inode: Inode, mode: int | None, uid: int | None, gid: int | None, times: bool,
    ctx: RequestContext,
) -> int | None:
    """What chmod, chown and utimens may do (as Linux): EPERM for what only the owner or
    root may change; returns the mode to store (setuid/setgid cleared where Linux does)."""
    owner = ctx.owns(inode.uid)
    if uid is not None and uid != inode.uid and not ctx.is_root:
        raise NotPermitted("only root may give a file away")
    if gid is not None and gid != inode.gid and not (ctx.is_root or (owner and ctx.in_group(gid))):
        raise NotPermitted("only the owner may change the group, to one of its own")
    if times and not owner and not ctx.may_write(inode.mode, inode.uid, inode.gid):
        # Setting explicit times needs ownership; the kernel (default_permissions) answers
        # that with EPERM before asking us, since only it knows "now" from explicit times.
        raise PermissionDenied("times: not the owner and no write permission")
    if mode is not None and not owner:
        # The kernel clears setuid/setgid as the writer of a file (before a write, truncate
        # or chown): a non-owner may drop those bits, nothing else.
        new, cur = stat.S_IMODE(mode), stat.S_IMODE(inode.mode)
        if (new ^ cur) & ~SETID or new & ~cur:
            raise NotPermitted("only the owner may change the mode")
    if (mode is not None and owner and not ctx.is_root and mode & stat.S_ISGID
            and not ctx.in_group(inode.gid if gid is None else gid)):
        mode &= ~stat.S_ISGID  # as Linux: a non-member cannot set setgid; silently
    if (uid is not None or gid is not None) and not inode.is_dir:
        # chown clears setuid, and setgid with group execute (as Linux, also for root).
        cur = inode.mode if mode is None else mode
        cleared = cur & ~stat.S_ISUID
        if cur & stat.S_IXGRP:
            cleared &= ~stat.S_ISGID
        if cleared != cur:
            mode = cleared
    return mode


def _audit(action: str, ctx: RequestContext, **detail: Any) -> AuditRecord:
    """The audit record of a change ``ctx`` asks for (its path: the catalog's, in the
    change's transaction)."""
    return AuditRecord(action, uid=ctx.uid, pid=ctx.pid, detail=detail)


def uses_direct_io(flags: int) -> bool:
    """Write-only handles bypass the kernel page cache: a checkpoint save then costs one
    copy less and does not double-cache the checkpoint in RAM, and nothing can mmap a
    write-only handle. O_DIRECT asks for it explicitly."""
    return bool(flags & os.O_DIRECT) or (flags & os.O_ACCMODE) == os.O_WRONLY


@dataclass
class Handle:
    file: OpenFile
    flags: int
    wrote: bool = False
    caller_uid: int = 0  # who opened it: a write by non-root clears setuid/setgid
    caller_pid: int = 0  # and its process (the audit record of its commit)
    # The file's path for checkpoint events, valid while the namespace generation it was
    # resolved at is current (Filesystem._cached_path): no catalog round trip per event.
    path: str | None = None
    path_gen: int = -1

    @property
    def writable(self) -> bool:
        return (self.flags & os.O_ACCMODE) != os.O_RDONLY

    @property
    def direct_io(self) -> bool:
        return uses_direct_io(self.flags)


@dataclass(frozen=True)
class FsStats:
    block_size: int
    blocks: int
    blocks_free: int
    blocks_avail: int
    files: int
    files_free: int
    name_max: int


class HandleTable(dict[int, Handle]):
    """The open handles by number. Built by the composition root and shared with the
    checkpoint tracker (files open for writing) and the janitor (files open at all)."""

    def writing_inos(self) -> list[int]:
        return sorted({h.file.ino for h in self.values() if h.writable})

    def open_inos(self) -> list[int]:
        return sorted({h.file.ino for h in self.values()})


class SessionId(Protocol):
    """This node's session in a shared catalog (session.NodeSession): its current id."""

    sid: str


class EventSink(Protocol):
    """Where filesystem events go (checkpoints/tracker.py); never blocks. ``fence``: the
    signals not yet queued; ``node``: whose records a restart replays (tracker.py)."""

    fence: SignalFence
    node: str

    def push(self, ev: FsEvent) -> None: ...


class DurableWaiter(Protocol):
    """The upload queue, for ``durability = "remote"`` (upload/uploader.py)."""

    async def wait_durable(self, digests: set[bytes], timeout_s: float) -> bool: ...


class GcRunner(Protocol):
    """Retention on request (``user.ckptfs.gc``; checkpoints/janitor.py GcRequests)."""

    async def request(self, scope: str = "/") -> int: ...

    def served_ticket(self, ticket: int) -> bool: ...

    async def wait(self, ticket: int) -> object: ...


class Filesystem:
    def __init__(
        self,
        catalog: Catalog,
        store: FrontEndChunks,
        *,
        tier_view: TierView,
        db_limiter: trio.CapacityLimiter,
        budget: MemoryBudget,
        open_files: OpenFiles,
        handles: HandleTable,
        chunk_size: int,
        uploader: DurableWaiter,
        gc: GcRunner,
        tracker: EventSink | None = None,
        invalidate: Callable[[int], None] | None = None,
        invalidate_entry: Callable[[int, bytes], None] | None = None,
        policies: tuple[DurabilityPolicy, ...] = (),
        readahead: int = DEFAULT_READAHEAD,
        copy_back: str = "sequential",
        shared: bool = False,
        session: SessionId | None = None,
        quotas: Quotas | None = None,
        access: Access | None = None,
        sealed_namespace: Callable[[str], str | None] | None = None,
        page_push: PagePush | None = None,
    ) -> None:
        """Built by the composition root (mount.py ``build``), which also builds what it is
        given: ``store`` (chunks and the commit of a file), ``budget`` (whose spill writes
        out the partial chunks of ``open_files``), ``handles`` (shared with the tracker and
        the janitor), ``uploader`` (waits for remote durability), ``gc`` (retention now),
        ``tracker`` (checkpoint events; None: off). ``shared``: the catalog is shared with
        other nodes (docs/multinode.md), whose changes no cache of this node sees: the
        caches that assume one writer are off, and an open drops the kernel's cached pages
        of a file another node changed. ``session``: this node's session in the shared
        catalog, under which the inodes it holds open are noted (an inode with no name left
        is dropped by the last closer on any node). ``access``: the namespace rules (vfs/
        access.py), asked at each operation that reaches a name or an inode (None: none);
        ``quotas``: the namespaces, whose files are charged to them (vfs/quota.py; None: no
        namespace). ``page_push``: hands chunks fetched ahead of a reader to the kernel's
        page cache (vfs/pagepush.py; None, and always with a shared catalog: off)."""
        self.catalog = catalog
        self.quotas = quotas
        self.access = access if access is not None else Access(GovernanceConfig())
        self.invalidate = invalidate
        # The encrypted namespace of a path (docs/governance.md), None: none is encrypted.
        self.sealed_namespace = sealed_namespace
        self.chunk_size = chunk_size
        self.db_limiter = db_limiter
        self.store = store
        self.tier_view = tier_view  # the local tiers' roots and usage, any remote tier
        self.budget = budget
        # Buffers a save's chunks are assembled in, reused (codec/staged.py): as many as
        # the memory budget lets be in memory at once.
        self.stages = StagePool(chunk_size, keep=max(1, budget.limit // chunk_size))
        self.uploader = uploader
        self.gc = gc
        # The gc pass each directory last asked for (``user.ckptfs.gc``): set returns at
        # once, a getxattr of the same name waits for the pass (no kernel lock held).
        self._gc_tickets: dict[int, int] = {}
        self.policies = policies
        self.readahead = readahead
        self.copy_back = copy_back
        self.invalidate_entry = invalidate_entry
        # Checkpoint awareness: operations become events for the detectors (None: off).
        self.tracker = tracker
        self.open_files = open_files
        self.handles = handles
        # Opens between their catalog read and their entry in open_files: an unlink must
        # not drop such an inode in its own catalog call (_unlinked).
        self._opening: dict[int, int] = {}
        # Paths cached for checkpoint events stay valid while no rename, unlink, rmdir or
        # link ran or runs: every one bumps the generation when it finishes.
        self._ns_gen = 0
        self._ns_busy = 0
        # Files created by this mount whose every handle so far was write-only: the kernel
        # cannot hold a page of them (nothing could read or map one), so their direct-I/O
        # writes need no invalidation of its page cache at commit (a round trip to it).
        self._uncached: set[OpenFile] = set()
        self.shared = shared
        self.page_push = None if shared else page_push
        self.session = session if shared else None
        # Shared catalog: the inodes noted open under the session (ino -> noted for writing).
        self._noted: dict[int, bool] = {}
        # One note or release of an inode's open-handle row at a time, in the order they
        # were decided (vfs/rowlocks.py): else a note could commit after the release of the
        # close that followed it (a stale row), or a release after the next open's note.
        self._rows = RowLocks()
        # Inodes of _noted whose note went to a session that has ended (this node registered
        # again): noted anew under the new one after the next heartbeat (sync_open_rows);
        # _rows_sid is the session id the rest of _noted is noted under.
        self._stale: set[int] = set()
        self._rows_sid = self.session.sid if self.session is not None else ""
        # Last closes the catalog did not take (it was unreachable): released again after
        # the next heartbeat (``sync_open_rows``), else the rows would keep them "open" on
        # this node for retention and the last-closer drop until the session ends.
        self._unreleased: set[int] = set()
        # Directory attributes for the kernel's GETATTR after each change in a directory.
        self._dirs = DirAttrs(enabled=not shared)
        # The names of directories this mount created: missing names answered from memory.
        self._names = KnownNames(enabled=not shared)
        # Shared catalog: the version (size, mtime) of each file whose pages this kernel
        # may cache, and the files whose next handle must drop them (close-to-open).
        self._cached_versions: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._drop_cache: set[int] = set()
        self._next_fh = 1
        self._nursery: trio.Nursery | None = None
        # Inodes with stored xattrs (loaded at first use): the kernel asks for
        # security.capability before buffered writes, and the answer for the others
        # must not cost a catalog round trip.
        self._xattr_inos: set[int] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def attach(self, nursery: trio.Nursery) -> None:
        """The mount's nursery, where the open files' chunk writes and readahead run
        (mount.py ``running``; the background services run there too, not started here)."""
        self._nursery = nursery

    async def _path(self, parent: int, name: bytes) -> str:
        base = await self.db(self.catalog.path_of, parent)
        return base.rstrip("/") + "/" + name.decode(errors="surrogateescape")

    @contextlib.contextmanager
    def _naming(self, *parents: int) -> Iterator[None]:
        """Around a catalog call that adds or removes names in ``parents``; the caller
        records its change in ``_names`` right after, with no await in between. If the
        call fails, what is known of those directories is forgotten."""
        try:
            yield
        except BaseException:
            self._names.forget(*parents)
            raise

    @contextlib.contextmanager
    def _changing_paths(self) -> Iterator[None]:
        """Around a catalog change that may change the path of existing inodes."""
        self._ns_busy += 1
        try:
            yield
        finally:
            self._ns_busy -= 1
            self._ns_gen += 1

    def _path_token(self) -> int | None:
        """Taken before a catalog call resolves a path: the generation the path may be
        cached at (None: a path change is under way, do not cache)."""
        return self._ns_gen if self._ns_busy == 0 else None

    def _cache_path(self, h: Handle, path: str, token: int | None) -> None:
        if token is not None and not path.startswith("<unlinked>"):
            h.path, h.path_gen = path, token

    async def _file_path(self, h: Handle) -> str:
        """The path of a handle's file, as ``catalog.path_of`` gives it."""
        if h.path is not None and self._ns_busy == 0 and h.path_gen == self._ns_gen:
            return h.path
        token = self._path_token()
        path = await self.db(self.catalog.path_of, h.file.ino)
        self._cache_path(h, path, token)
        return path

    async def _event(self, kind: str, parent: int, name: bytes, **kw: Any) -> None:
        """Tell the checkpoint tracker what just happened (after it took effect)."""
        if self.tracker is None:
            return
        path = await self._path(parent, name)
        self.tracker.push(FsEvent(kind, path, time.time_ns(), **kw))

    def _committed_state(self, h: Handle) -> tuple[str, Inode, dict[int, ChunkRef]] | None:
        """What the catalog holds for a handle's file, known without asking it: the open
        file is the inode's current one and has nothing uncommitted (its attributes and
        extents are then those its last commit wrote), and the cached path is current.
        Taken synchronously, before anything else can change the file."""
        f = h.file
        if (self.open_files.get(f.ino) is not f or f.is_dirty() or f.failed is not None
                or f.written or h.path is None or self._ns_busy or h.path_gen != self._ns_gen):
            return None
        return h.path, f.attrs(), dict(f.committed)

    async def _release_event(
        self, h: Handle, last: bool,
        known: tuple[str, Inode, dict[int, ChunkRef]] | None = None,
    ) -> None:
        """After a writing handle closed: the committed size, mode, tail (and content of a
        small file) as the catalog has them (``known``: taken from a clean open file before
        the release, see _committed_state), and the chunks; never from the open file's
        later state, which a concurrent request (the kernel sends RELEASE asynchronously)
        may change."""
        ev = await self._committed_event(h.file.ino, last, h.file, known)
        if ev is not None:
            assert self.tracker is not None
            self.tracker.push(ev)

    async def _committed_event(
        self, ino: int, last: bool, f: OpenFile | None = None,
        known: tuple[str, Inode, dict[int, ChunkRef]] | None = None, *,
        time_ns: int | None = None, replayed: bool = False,
    ) -> FsEvent | None:
        """The release event of ``ino`` as committed (``_release_event``; ``f``: the open
        file whose stored end may save a read). None: the file is gone."""

        def committed() -> tuple[str, Inode, dict[int, ChunkRef]]:
            return (self.catalog.path_of(ino), self.catalog.get_inode(ino),
                    self.catalog.extents(ino))

        if known is not None:
            path, inode, refs = known
        else:
            try:
                path, inode, refs = await self.db(committed)
            except CkptfsError:
                return None  # deleted meanwhile
        if inode.nlink <= 0 or not inode.is_reg:
            return None  # unlinked before its last close: no checkpoint to detect
        content = tail = None
        lo = 0 if inode.size <= SMALL_FILE else inode.size - TAIL
        data = None if f is None else self._known_end(f, refs, lo, inode.size)
        try:
            if data is None:  # not what this open file stored last: read it back
                data = await self._read_committed(refs, lo, inode.size)
            content = data if inode.size <= SMALL_FILE else None
            tail = data[-TAIL:]
        except CkptfsError:
            pass  # the read logged it; the event goes without the bytes
        return FsEvent(
            "release", path, time.time_ns() if time_ns is None else time_ns, size=inode.size,
            mode=inode.mode, last_writer=last, content=content, tail=tail, replayed=replayed,
        )

    async def replay_signals(self) -> int:
        """At start, before serving: the commit signals a crash may have kept from the
        tracker, replayed from the catalog's records (checkpoints/tracker.py, "Crashes"):
        each close's commit and each rename of this node from its replay point on, in
        their order, as events marked ``replayed``. Returns how many were queued."""
        if self.tracker is None:
            return 0
        key = replay_key(self.tracker.node)
        raw = await self.db(self.catalog.get_meta, key)
        if raw is None:  # the first mount that replays: from here on
            await self.db(self.catalog.set_meta, key, str(time.time_ns()))
            return 0
        since = int(raw)
        node = self.tracker.node
        entries = [e for e in await self.db(self.catalog.audit_entries, 0, since)
                   if e.node == node and e.action in ("commit", "rename")]
        # A file's last commit stands for its earlier ones (the event reads it as it is now).
        last_commit: dict[int, int] = {}
        details = [json.loads(e.detail) for e in entries]
        for i, (e, d) in enumerate(zip(entries, details, strict=True)):
            if e.action == "commit" and isinstance(d.get("ino"), int):
                last_commit[d["ino"]] = i
        events: list[FsEvent] = []
        for i, (e, d) in enumerate(zip(entries, details, strict=True)):
            ino = d.get("ino")
            if not isinstance(ino, int):
                continue
            if e.action == "commit":
                if last_commit.get(ino) == i:
                    ev = await self._committed_event(ino, True, time_ns=e.time_ns, replayed=True)
                    if ev is not None:
                        events.append(ev)
                continue
            src = d.get("src")
            # Paths of names that are not UTF-8 are stored escaped: not to be trusted here.
            if not isinstance(src, str) or "\\" in src or "\\" in e.path:
                continue
            try:
                moved = await self.db(self.catalog.get_inode, ino)
            except CkptfsError:
                continue  # gone since: nothing of it to detect
            events.append(FsEvent("rename", e.path, e.time_ns, src=src, is_dir=moved.is_dir,
                                  size=moved.size, mode=moved.mode, replayed=True))
        for ev in events:
            self.tracker.push(ev)
        if events:
            log.info("replaying %d commit and rename record(s) since the replay point",
                     len(events))
        return len(events)

    def _known_end(self, f: OpenFile, refs: dict[int, ChunkRef], lo: int, hi: int) -> bytes | None:
        """Bytes [lo, hi) of the committed file from what the open file stored last, if
        that chunk is the one the catalog names at the end and the range is in memory."""
        if f.chunk_end is None or hi == 0:
            return None
        idx, digest, end = f.chunk_end
        ref = refs.get(idx)
        base = idx * self.chunk_size
        if ref is None or ref.digest != digest or (hi - 1) // self.chunk_size != idx:
            return None
        start = base + ref.length - len(end)  # file offset of end[0]
        if base + ref.length != hi or lo < start:
            return None
        return end[lo - start:]

    async def _read_committed(self, refs: dict[int, ChunkRef], lo: int, hi: int) -> bytes:
        out = bytearray()
        for idx in range(lo // self.chunk_size, (hi - 1) // self.chunk_size + 1 if hi else 0):
            base = idx * self.chunk_size
            ref = refs.get(idx)
            a, b = max(lo, base) - base, min(hi, base + self.chunk_size) - base
            # A file deleted right after its close loses its chunks: not worth an ERROR here.
            data = None if ref is None else await self.store.read(ref, log_missing=False)
            piece = b"" if data is None else bytes(memoryview(data)[a:b])
            out += piece + bytes(b - a - len(piece))
        return bytes(out)

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        # The lighter thread call (ckptfs/threads.py): most requests make one of these.
        return await threads.run_sync(fn, *args, limiter=self.db_limiter)

    async def _db_dirs_changed(self, fn: Callable[..., T], *args: Any) -> T:
        """``db`` for a catalog call that may change directory rows (attributes, link
        counts, times) other than those its caller refreshes: the directory cache is
        cleared, in the catalog's order of calls."""
        seq: list[int] = []

        def run() -> T:
            try:
                return fn(*args)
            finally:
                seq.append(self._dirs.stamp())

        try:
            return await self.db(run)
        finally:
            if seq:
                self._dirs.clear(seq[0])

    async def _db_refreshing(self, work: Callable[[], T]) -> T:
        """``db`` for a combined call that returns the directories it changed (with a
        ``stamp``) for the caller to put in the cache; if it fails part-way, the cache is
        cleared instead."""
        seq: list[int] = []

        def run() -> T:
            try:
                return work()
            except BaseException:
                seq.append(self._dirs.stamp())
                raise

        try:
            return await self.db(run)
        finally:
            if seq:
                self._dirs.clear(seq[0])

    async def recover(self) -> None:
        """At start: drop inodes that were unlinked while open when the daemon stopped.
        With a shared catalog, only those no node's session holds open (the catalog's
        delete_inode keeps the others, for their last closer)."""
        for ino in await self.db(self.catalog.unlinked_inodes):
            await self._delete_inode(ino)

    async def shutdown(self) -> None:
        """Commit every open file that still has data (the kernel sends no more requests)."""
        for f in list(self.open_files.values()):
            if f.is_dirty():
                try:
                    await f.commit(synced=True)
                except CkptfsError as exc:
                    log.error("inode %d: could not commit at shutdown: %s", f.ino, exc)
        # Every file closed earlier is synced too: its frames reach the devices
        # before the catalog that names them is synced.
        roots = self.tier_view.roots()
        await trio.to_thread.run_sync(syncfs_all, roots)
        await self.db(self.catalog.sync)

    def _services(self) -> Services:
        assert self._nursery is not None, "Filesystem.attach() was not called"
        return Services(
            store=self.store, budget=self.budget, nursery=self._nursery,
            chunk_size=self.chunk_size, path_of=self._path_of, invalidate=self.invalidate,
            readahead=self.readahead, copy_back=self.copy_back, stages=self.stages,
            namespace_of=None if self.sealed_namespace is None else self._namespace_of,
            page_push=self.page_push, audit=self.catalog,
        )

    async def _path_of(self, ino: int) -> str:
        return await self.db(self.catalog.path_of, ino)

    async def _namespace_of(self, ino: int) -> str | None:
        """The encrypted namespace whose key seals this inode's new chunks (None: plain)."""
        assert self.sealed_namespace is not None
        return self.sealed_namespace(await self._path_of(ino))

    # -- attributes --------------------------------------------------------------------------

    async def getattr(self, ino: int, ctx: RequestContext = ROOT) -> Inode:
        if ctx is not ROOT:
            await self.access.inode(ctx, ino, "stat", root_visible=True)
        f = self.open_files.get(ino)
        if f is not None:
            return f.attrs()
        cached = self._dirs.get(ino)
        if cached is not None:
            return cached

        def read() -> tuple[Inode, int]:
            return self.catalog.get_inode(ino), self._dirs.stamp()

        inode, seq = await self.db(read)
        self._dirs.put(seq, inode)
        return inode

    async def setattr(
        self,
        ino: int,
        *,
        size: int | None = None,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
        ctx: RequestContext = ROOT,
    ) -> Inode:
        await self.access.inode(ctx, ino, "setattr")
        if size is not None:
            inode = await self.getattr(ino)
            if inode.is_dir:
                raise IsADirectory("cannot truncate a directory")
            if not inode.is_reg:
                raise InvalidArgument("can only truncate regular files")
            if size < 0:
                raise InvalidArgument("negative size")
            f = self.open_files.get(ino)
            if f is not None and self._has_writer(f):
                # Joins the version the writers are making (every handle sees it at
                # once) and is synced with its next commit, their close or fsync.
                await f.truncate(size)
            else:
                # Nobody open for writing would commit it: apply and commit at once.
                f = await self._open_file(ino)
                try:
                    async with f.pushes_held():  # a reader's page-cache pushes end first
                        await self._account(f)
                        await f.truncate(size)
                        await f.commit(audit=AuditRecord("commit", uid=ctx.uid, pid=ctx.pid,
                                                         ino=ino, detail={"truncate": size}))
                finally:
                    await self._drop_handle_ref(f)
        if any(v is not None for v in (mode, uid, gid, atime_ns, mtime_ns)):
            if not ctx.is_root or uid is not None or gid is not None:  # root's chmod: no rules
                mode = _owner_rules(await self.getattr(ino), mode, uid, gid,
                                    atime_ns is not None or mtime_ns is not None, ctx)
            new = await self._db_dirs_changed(
                lambda: self.catalog.setattr(
                    ino, mode=mode, uid=uid, gid=gid, atime_ns=atime_ns, mtime_ns=mtime_ns
                )
            )
            f = self.open_files.get(ino)
            if f is not None:
                f.inode = new
                if mtime_ns is not None:
                    f.mtime_ns = mtime_ns
                f.ctime_ns = new.ctime_ns
            if mode is not None and self.tracker is not None:
                path = await self.db(self.catalog.path_of, ino)
                self.tracker.push(FsEvent("chmod", path, time.time_ns(), mode=new.mode,
                                          size=new.size, is_dir=new.is_dir))
        return await self.getattr(ino)

    # -- namespace ---------------------------------------------------------------------------

    async def lookup(self, parent: int, name: bytes, ctx: RequestContext = ROOT) -> Inode:
        await self.access.lookup(ctx, parent, name)
        inode = await self._lookup(parent, name)
        self.access.learn(parent, name, inode.ino)
        return inode

    async def _lookup(self, parent: int, name: bytes) -> Inode:
        if self._names.absent(parent, _check_name(name)):
            raise NotFound(name.decode(errors="replace"))  # a new directory of this mount
        known = self._names.ino(parent, name)
        if known is not None:
            f = self.open_files.get(known)
            attrs = f.attrs() if f is not None else self._dirs.get(known)
            if attrs is not None:
                return attrs
        inode = await self.db(self.catalog.lookup, parent, name)
        f = self.open_files.get(inode.ino)
        return f.attrs() if f is not None else inode

    async def mkdir(self, parent: int, name: bytes, mode: int, ctx: RequestContext) -> Inode:
        await self.access.create(ctx, parent, name, "mkdir")
        with self._naming(parent):
            inode = await self._db_dirs_changed(
                functools.partial(self.catalog.create, audit=_audit("mkdir", ctx)), parent,
                _check_name(name), stat.S_IFDIR | stat.S_IMODE(mode), ctx.uid, ctx.gid)
        self._names.added(parent, name, inode.ino)
        self._names.new_dir(inode.ino)
        self.access.learn(parent, name, inode.ino)
        await self._event("mkdir", parent, name, is_dir=True, mode=inode.mode)
        return inode

    async def symlink(self, parent: int, name: bytes, target: bytes, ctx: RequestContext) -> Inode:
        await self.access.create(ctx, parent, name, "symlink")
        with self._naming(parent):
            inode = await self._db_dirs_changed(
                functools.partial(self.catalog.create, audit=_audit("symlink", ctx)), parent,
                _check_name(name), stat.S_IFLNK | 0o777, ctx.uid, ctx.gid, target)
        self._names.added(parent, name, inode.ino)
        await self._event("symlink", parent, name, target=target.decode(errors="surrogateescape"))
        return inode

    async def mknod(self, parent: int, name: bytes, mode: int, rdev: int, ctx: RequestContext) -> Inode:
        """A FIFO, socket or device node: an inode with its type and device number (the
        kernel serves FIFOs and devices itself; their data never reaches us)."""
        kind = stat.S_IFMT(mode) or stat.S_IFREG
        if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK):
            raise InvalidArgument(f"mknod of file type {kind:o}")
        await self.access.create(ctx, parent, name, "mknod")
        if kind not in (stat.S_IFCHR, stat.S_IFBLK):
            rdev = 0
        mode = await self._new_mode(parent, kind | stat.S_IMODE(mode), ctx)
        with self._naming(parent):
            inode = await self._db_dirs_changed(
                functools.partial(self.catalog.create, audit=_audit("create", ctx)), parent,
                _check_name(name), mode, ctx.uid, ctx.gid, None, rdev)
        self._names.added(parent, name, inode.ino)
        if kind == stat.S_IFREG:
            await self._event("create", parent, name, mode=inode.mode)
        return inode

    async def _new_mode(self, parent: int, mode: int, ctx: RequestContext) -> int:
        """A non-member creating a setgid file in a setgid directory (whose group it gets)
        loses the setgid bit, as on Linux."""
        if not mode & stat.S_ISGID or stat.S_ISDIR(mode) or ctx.is_root:
            return mode
        pdir = await self.getattr(parent)
        if not ctx.in_group(pdir.gid if pdir.mode & stat.S_ISGID else ctx.gid):
            mode &= ~stat.S_ISGID
        return mode

    def _check_sticky(self, parent: int, names: Sequence[bytes], ctx: RequestContext) -> None:
        """In a sticky directory only root, the directory's owner and an entry's owner may
        remove or rename (or replace) that entry: EPERM. Runs in the catalog thread."""
        if ctx.is_root:
            return
        pdir = self.catalog.get_inode(parent)
        if not pdir.mode & stat.S_ISVTX or pdir.uid == ctx.uid:
            return
        for name in names:
            try:
                inode = self.catalog.lookup(parent, name)
            except CkptfsError:
                continue  # the operation itself reports a missing name
            if inode.uid != ctx.uid:
                raise NotPermitted("sticky directory: not the owner of the entry or the directory")

    async def readlink(self, ino: int, ctx: RequestContext = ROOT) -> bytes:
        await self.access.inode(ctx, ino, "readlink")
        inode = await self.db(self.catalog.get_inode, ino)
        if not stat.S_ISLNK(inode.mode) or inode.target is None:
            raise InvalidArgument("not a symlink")
        return inode.target

    async def link(self, ino: int, parent: int, name: bytes, ctx: RequestContext = ROOT) -> Inode:
        await self.access.link(ctx, ino, parent, name)
        with self._changing_paths(), self._naming(parent):
            inode = await self._db_dirs_changed(self.catalog.link, ino, parent, _check_name(name))
        self._names.added(parent, name, ino)
        f = self.open_files.get(ino)
        if f is not None:
            f.inode = inode
            return f.attrs()
        return inode

    async def unlink(self, parent: int, name: bytes, ctx: RequestContext = ROOT) -> None:
        await self.access.remove(ctx, parent, name, "unlink")
        # One catalog call: the sticky rule, the unlink, the drop of an inode nothing has
        # open (and of its chunks' rows) and the event's path.
        busy = frozenset(self.open_files) | frozenset(self._opening)
        tracked = self.tracker is not None

        def work() -> tuple[Inode, dict[bytes, list[str]] | None, str, Inode, int]:
            if not ctx.is_root:
                self._check_sticky(parent, [name], ctx)
            around = Around(paths=tracked)
            inode = self.catalog.unlink(parent, name, audit=_audit("unlink", ctx), around=around)
            gone = None
            if inode.nlink <= 0 and inode.ino not in busy:
                gone = self.store.collect_digests_blocking(self.catalog.delete_inode(inode.ino))
            return (inode, gone, around.dir_paths.get(parent, ""), around.dirs[parent],
                    self._dirs.stamp())

        with self._changing_paths(), self._naming(parent):
            inode, gone, base, pdir, seq = await self._db_refreshing(work)
        self._names.removed(parent, name)
        self._dirs.put(seq, pdir)  # the kernel asks for the directory's new times next
        self._dirs.forget(seq, inode.ino)  # its link count and ctime changed
        if gone is None:
            await self._maybe_delete(inode)
        else:
            if self._xattr_inos is not None:
                self._xattr_inos.discard(inode.ino)
            self.store.collected(gone)
        if self.tracker is not None:
            path = base.rstrip("/") + "/" + name.decode(errors="surrogateescape")
            self.tracker.push(FsEvent("unlink", path, time.time_ns()))

    async def rmdir(self, parent: int, name: bytes, ctx: RequestContext = ROOT) -> None:
        await self.access.remove(ctx, parent, name, "rmdir")
        if not ctx.is_root:
            await self.db(self._check_sticky, parent, [name], ctx)
        with self._changing_paths(), self._naming(parent):
            inode = await self._db_dirs_changed(
                functools.partial(self.catalog.rmdir, audit=_audit("rmdir", ctx)), parent, name)
        self._names.removed(parent, name)
        self._names.forget(inode.ino)
        await self._delete_inode(inode.ino)
        await self._event("rmdir", parent, name, is_dir=True)

    async def rename(
        self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, flags: int,
        ctx: RequestContext = ROOT,
    ) -> None:
        noreplace = bool(flags & 1)  # RENAME_NOREPLACE
        if flags & ~1:
            raise InvalidArgument("RENAME_EXCHANGE and RENAME_WHITEOUT are not supported")
        _check_name(new_name)
        await self.access.rename(ctx, old_parent, old_name, new_parent, new_name)
        tracked = self.tracker is not None

        def work() -> tuple[Inode | None, tuple[str, str, Inode] | None, list[Inode], Inode, int]:
            # One catalog call: the sticky rules, the rename, the directories' new
            # attributes and what the event needs.
            if not ctx.is_root:
                self._check_sticky(old_parent, [old_name], ctx)
                self._check_sticky(new_parent, [new_name], ctx)
            # The directories' new attributes (none if a directory moved or went: its own
            # row changed too), the moved inode and the event's paths come with the rename.
            around = Around(paths=tracked)
            replaced = self.catalog.rename(old_parent, old_name, new_parent, new_name, noreplace,
                                           audit=_audit("rename", ctx), around=around)
            moved = around.moved
            assert moved is not None
            if known_old:  # both names of one inode: POSIX leaves both in place
                with contextlib.suppress(NotFound):
                    self.catalog.lookup(old_parent, old_name)
                    kept.append(True)
            dirs = list(around.dirs.values())
            seen = None if not tracked else (
                around.dir_paths[old_parent], around.dir_paths[new_parent], moved)
            return replaced, seen, dirs, moved, self._dirs.stamp()

        # Whether the old name stays (both names link one inode: POSIX does nothing) matters
        # only if its directory is known; known from memory if the new one's is too.
        known_old = self._names.known(old_parent) and not self._names.known(new_parent)
        old_ino = self._names.ino(old_parent, old_name)
        if old_ino is not None and old_ino == self._names.ino(new_parent, new_name):
            known_old = True  # the no-op: let the catalog say whether the old name stays
        kept: list[bool] = []
        # The rename's audit record carries a commit signal until its event is queued.
        fence = None if self.tracker is None else self.tracker.fence
        token = None if fence is None else fence.enter()
        try:
            await self._renamed(work, old_parent, old_name, new_parent, new_name, kept)
        finally:
            if fence is not None and token is not None:
                fence.leave(token)

    async def _renamed(
        self, work: Callable[[], tuple[Inode | None, tuple[str, str, Inode] | None, list[Inode],
                                       Inode, int]],
        old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, kept: list[bool],
    ) -> None:
        """The rename's catalog call (``work``), then its effects on the caches and the
        tracker's event."""
        with self._changing_paths(), self._naming(old_parent, new_parent):
            replaced, seen, dirs, moved, seq = await self._db_refreshing(work)
        if not kept:
            self._names.removed(old_parent, old_name)
        self._names.added(new_parent, new_name, moved.ino)
        if not dirs:
            self._dirs.clear(seq)
        for d in dirs:
            self._dirs.put(seq, d)
        if moved.is_reg and moved.ino not in self.open_files:
            self._dirs.put_file(seq, moved)  # its new ctime, as read in the rename's call
        else:
            self._dirs.forget(seq, moved.ino)
        if replaced is not None:
            self._dirs.forget(seq, replaced.ino)
            await self._maybe_delete(replaced)
        if self.tracker is not None and seen is not None:
            src_base, dst_base, moved = seen

            def join(base: str, n: bytes) -> str:
                return base.rstrip("/") + "/" + n.decode(errors="surrogateescape")

            crashpoint.reached("rename-committed", join(dst_base, new_name))
            self.tracker.push(FsEvent(
                "rename", join(dst_base, new_name), time.time_ns(), src=join(src_base, old_name),
                is_dir=moved.is_dir, size=moved.size, mode=moved.mode,
            ))

    async def remove_tree(self, path: str) -> None:
        """Delete a file or a directory tree by its path inside the mount (retention), as
        unlink and rmdir would, and tell the kernel to forget the names."""
        parts = [p.encode(errors="surrogateescape") for p in path.split("/") if p]
        if not parts:
            raise InvalidArgument("refusing to delete the root")
        parent = ROOT_INODE
        for name in parts[:-1]:
            parent = (await self.lookup(parent, name)).ino
        await self._remove(parent, parts[-1])

    async def _remove(self, parent: int, name: bytes) -> None:
        inode = await self.lookup(parent, name)
        if inode.is_dir:
            after = 0
            while True:
                batch = await self.readdir(inode.ino, after)
                if not batch:
                    break
                for _, child, _ in batch:
                    await self._remove(inode.ino, child)
                after = batch[-1][0]
            await self.rmdir(parent, name)
        else:
            await self.unlink(parent, name)
        if self.invalidate_entry is not None:
            await trio.to_thread.run_sync(self.invalidate_entry, parent, name)

    async def _maybe_delete(self, inode: Inode) -> None:
        f = self.open_files.get(inode.ino)
        if f is not None:
            f.inode = Inode(**{**f.inode.__dict__, "nlink": inode.nlink})
            return  # deleted when the last handle closes
        if inode.nlink <= 0:
            await self._delete_inode(inode.ino)

    async def _delete_inode(self, ino: int) -> None:
        digests = await self._db_dirs_changed(self.catalog.delete_inode, ino)
        await self._collect_dropped(ino, digests)

    async def _collect_dropped(self, ino: int, digests: Sequence[bytes]) -> None:
        if self._xattr_inos is not None:
            self._xattr_inos.discard(ino)
        if digests:
            # The catalog knows the tiers of these chunks; refs only need the digests here.
            await self.store.collect(ChunkRef(d, 0, ()) for d in digests)

    async def opendir(self, ino: int, ctx: RequestContext = ROOT) -> None:
        """A listing starts (the kernel's OPENDIR): the caller is checked here, not per
        READDIR batch."""
        await self.access.inode(ctx, ino, "list")
        if not (await self.getattr(ino)).is_dir:
            raise NotADirectory("not a directory")

    async def readdir(self, ino: int, after_id: int) -> list[tuple[int, bytes, Inode]]:
        inode = await self.db(self.catalog.get_inode, ino)
        if not inode.is_dir:
            raise NotADirectory("not a directory")
        entries = await self.db(self.catalog.readdir, ino, after_id)
        if self.access.enabled:
            for _, n, x in entries:
                self.access.learn(ino, n, x.ino)
        return [(i, n, self.open_files[x.ino].attrs() if x.ino in self.open_files else x) for i, n, x in entries]

    # -- open files --------------------------------------------------------------------------

    def _needs_note(self, ino: int, writing: bool) -> bool:
        return self.session is not None and (ino not in self._noted or writing > self._noted[ino])

    def _note(self, ino: int, writing: bool) -> str:
        """In the worker thread of an open's catalog call: note ``ino`` open under the
        session (NotFound if another node dropped it meanwhile); the session id it went
        under. The caller records it (``_noted_now``) on the trio thread after the call,
        still under the inode's row lock."""
        if self.session is None:
            return ""
        sid = self.session.sid  # read once: a re-registration may change it meanwhile
        self.catalog.note_open(sid, ino, writing)
        return sid

    def _noted_now(self, ino: int, writing: bool, sid: str) -> None:
        if self.session is not None:
            self._noted[ino] = self._noted.get(ino, False) or writing
            if sid != self.session.sid:  # under the session that ended: noted anew later
                self._stale.add(ino)

    def _held_here(self, ino: int) -> bool:
        return (ino in self.open_files or ino in self._opening
                or any(h.file.ino == ino for h in self.handles.values()))

    async def _release_noted(self, ino: int) -> None:
        """This node's last handle of ``ino`` closed (shared catalog): release it under the
        session; the catalog drops the inode if it has no name left and no other node
        holds it open."""
        if self.session is None or ino not in self._noted or self._held_here(ino):
            return
        del self._noted[ino]
        self._stale.discard(ino)
        try:
            # After the notes decided before (an open meanwhile notes after this release).
            async with self._rows.hold(ino):
                digests = await self._db_dirs_changed(self.catalog.release_inode,
                                                      self.session.sid, ino)
        except CatalogUnavailable as exc:
            if not self._unreleased:
                log.warning("the catalog did not take the close of inode %d (%s): closes are "
                            "noted again after the next heartbeat", ino, exc)
            self._unreleased.add(ino)
            return
        except BaseException:  # cancelled, maybe before the call: after the next heartbeat
            self._unreleased.add(ino)
            raise
        if digests is not None:
            await self._collect_dropped(ino, digests)

    async def sync_open_rows(self) -> None:
        """After a heartbeat (the catalog answers again): the open-handle rows made to match
        what this node holds open. A session registered again has none: every inode held
        is noted anew; then the closes the catalog missed (and the notes of opens that
        failed half-way) are released."""
        if self.session is None:
            return
        if self.session.sid != self._rows_sid:
            self._rows_sid = self.session.sid
            self._stale.update(self._noted)
        if self._stale:
            await self._note_stale()
        pending, self._unreleased = self._unreleased, set()
        for ino in sorted(pending):
            if ino in self._noted or self._held_here(ino):
                continue  # opened again meanwhile: its next last close releases it
            self._noted[ino] = False
            await self._release_noted(ino)  # back in the set if it fails again

    async def _note_stale(self) -> None:
        """Note the inodes of _stale under the current session, in one catalog call under
        their row locks (a close meanwhile has taken its inode out of _noted: not noted)."""
        assert self.session is not None
        stale = sorted(self._stale)
        async with self._rows.hold_all(stale):
            notes = [(ino, self._noted[ino]) for ino in stale
                     if ino in self._stale and ino in self._noted]
            # An inode another node dropped meanwhile (unlinked) is skipped: it reads on here.
            await self.db(self.catalog.note_open_many, self.session.sid, notes)
            self._stale.difference_update(ino for ino, _ in notes)

    def _done_opening(self, ino: int) -> None:
        left = self._opening.pop(ino) - 1
        if left:
            self._opening[ino] = left

    async def _open_failed(self, ino: int) -> None:
        """An open of ``ino`` failed: a last close meanwhile left the inode's row to it (it
        was held here, in _opening); released now if nothing else holds it."""
        self._done_opening(ino)
        await self._release_noted(ino)

    async def _open_file(self, ino: int, writing: bool = False) -> OpenFile:
        f = self.open_files.get(ino)
        if f is not None and self._needs_note(ino, writing):
            # Held meanwhile: a last close of the other handles leaves the row to this one.
            self._opening[ino] = self._opening.get(ino, 0) + 1
            try:
                async with self._rows.hold(ino):  # after a release decided before
                    sid = await self.db(self._note, ino, writing)
                    self._noted_now(ino, writing, sid)
            except BaseException:
                await self._open_failed(ino)
                raise
            self._done_opening(ino)
        if f is None:
            note = self._needs_note(ino, writing)

            def read() -> tuple[Inode, dict[int, ChunkRef], str]:
                inode = self.catalog.get_inode(ino)
                if inode.is_dir:
                    raise IsADirectory("is a directory")
                # Before its extents are read: an unlink on another node keeps it.
                sid = self._note(ino, writing) if note else ""
                return inode, self.catalog.extents(ino), sid

            self._opening[ino] = self._opening.get(ino, 0) + 1
            token = self._path_token()
            try:
                # The note after a release decided before (a close of this inode meanwhile).
                async with self._rows.hold(ino) if note else contextlib.nullcontext():
                    inode, extents, sid = await self.db(read)
                    if note:
                        self._noted_now(ino, writing, sid)
            except BaseException as exc:
                if note and isinstance(exc, CatalogUnavailable):
                    self._unreleased.add(ino)  # the note may have gone in before the failure
                await self._open_failed(ino)
                raise
            self._done_opening(ino)
            f = self.open_files.get(ino)  # another open may have raced us during the await
            stale = False
            if f is None:
                if self.shared and self._cached_versions.pop(ino, None) != (
                    inode.size, inode.mtime_ns
                ):
                    self._drop_cache.add(ino)  # another node's version, or not known
                    stale = True
                f = OpenFile(inode, extents, self._services())
                f.ns_gen = -1 if token is None else token
                self.open_files[ino] = f
                # Its commits change the row: the attributes come from f until it closes.
                self._dirs.forget(self._dirs.stamp(), ino)
            f.handles += 1
            if stale and self.invalidate is not None:
                # The kernel may hold attributes of an older version (a lookup or stat up
                # to the attribute timeout ago, e.g. of the file while another node was
                # still writing it), and its cached size bounds this open's reads: dropped
                # before the open returns, so the first read asks for the new ones
                # (close-to-open). Shielded: the handle is counted already.
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self.invalidate, ino)
            return f
        f.handles += 1
        return f

    async def _drop_handle_ref(self, f: OpenFile) -> None:
        f.handles -= 1
        if f.handles > 0:
            return
        clean = not f.is_dirty() and f.failed is None and not f.written
        await f.release_all()
        if f.handles > 0:
            f.allow_pushes()  # release_all held them
            return  # reopened while we waited
        self._uncached.discard(f)
        if self.open_files.get(f.ino) is f:
            del self.open_files[f.ino]
            if self.shared:  # the version the kernel may now cache: this node's last
                self._cached_versions[f.ino] = (f.size, f.mtime_ns)
                while len(self._cached_versions) > CACHED_VERSIONS_MAX:
                    self._cached_versions.popitem(last=False)
            if self.session is not None:
                await self._release_noted(f.ino)  # the catalog knows its link count
            elif f.inode.nlink <= 0:
                await self._delete_inode(f.ino)
            elif clean and self._ns_busy == 0 and f.ns_gen == self._ns_gen:
                # What its last commit wrote (nothing since): the next stat needs no
                # catalog read. Taken now, after every catalog call that changed the row.
                self._dirs.put_file(self._dirs.stamp(), f.attrs())
            else:
                self._dirs.forget(self._dirs.stamp(), f.ino)
        elif f.ino not in self.open_files:
            if self.session is not None:
                await self._release_noted(f.ino)
                return
            # A retired file does not follow link counts: ask the catalog.
            try:
                inode = await self.db(self.catalog.get_inode, f.ino)
            except CkptfsError:
                return
            if inode.nlink <= 0:
                await self._delete_inode(f.ino)

    def _new_handle(self, f: OpenFile, flags: int, ctx: RequestContext = ROOT) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = Handle(f, flags, caller_uid=ctx.uid, caller_pid=ctx.pid)
        if (flags & os.O_ACCMODE) != os.O_WRONLY:
            self._uncached.discard(f)  # a handle that may read or map: pages may come
        return fh

    def _handle(self, fh: int) -> Handle:
        h = self.handles.get(fh)
        if h is None:
            raise CkptfsError(f"bad file handle {fh}", errno=errno.EBADF)
        return h

    def keep_cache(self, fh: int) -> bool:
        """May the kernel keep its cached pages of this handle's file (FOPEN_KEEP_CACHE)?
        Always with one node; with a shared catalog, not on the first open after another
        node committed a version this kernel did not see."""
        ino = self._handle(fh).file.ino
        if ino in self._drop_cache:
            self._drop_cache.discard(ino)
            return False
        return True

    async def open(self, ino: int, flags: int, ctx: RequestContext = ROOT) -> int:
        await self.access.inode(ctx, ino, "open")
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY
        f = await self._open_file(ino, writing=writing)
        if (flags & os.O_ACCMODE) != os.O_WRONLY:
            # Once per open, not per read: noted in memory, written by the audit flusher.
            self.catalog.audit_note(AuditRecord(
                "open", uid=ctx.uid, pid=ctx.pid, ino=ino, time_ns=time.time_ns(),
                detail={"access": "r" if (flags & os.O_ACCMODE) == os.O_RDONLY else "rw"}))
        held = False
        try:
            if writing:
                # Until this handle closes no page-cache push starts; those in flight end
                # before the caller may write (vfs/pagepush.py).
                await f.hold_pushes()
                held = True
                await self._account(f)
                if flags & os.O_TRUNC:
                    await f.truncate(0)
        except BaseException:
            if held:
                f.allow_pushes()
            await self._drop_handle_ref(f)
            raise
        return self._new_handle(f, flags, ctx)

    async def create(
        self, parent: int, name: bytes, mode: int, flags: int, ctx: RequestContext
    ) -> tuple[int, Inode]:
        await self.access.create(ctx, parent, name, "create")
        mode = await self._new_mode(parent, stat.S_IFREG | stat.S_IMODE(mode), ctx)
        _check_name(name)
        tracked = self.tracker is not None
        counted = self.quotas is not None  # its namespace is known from the path
        # Residency: the new file's namespace is known now, also if it is unlinked before
        # its first write (a temporary file).
        bound = self.store.residency.enabled

        created: list[int] = []

        def work() -> tuple[Inode, str, Inode, int, str]:
            # One catalog transaction: the new inode, its directory's new attributes (the
            # kernel asks for them next) and, for the event, the directory's path.
            around = Around(paths=tracked or counted or bound)
            inode = self.catalog.create(parent, name, mode, ctx.uid, ctx.gid,
                                        audit=_audit("create", ctx), around=around)
            created.append(inode.ino)
            # Another node's unlink keeps it while it is open here. No row lock: nothing
            # else notes or releases a new inode before this create returns.
            sid = self._note(inode.ino, True)
            return (inode, around.dir_paths.get(parent, ""), around.dirs[parent],
                    self._dirs.stamp(), sid)

        token = self._path_token()
        try:
            with self._naming(parent):
                inode, base, pdir, seq, sid = await self._db_refreshing(work)
        except CatalogUnavailable:
            if created and self.session is not None:  # created, maybe noted: released later
                self._unreleased.add(created[0])
            raise
        self._names.added(parent, name, inode.ino)
        self.access.learn(parent, name, inode.ino)
        self._noted_now(inode.ino, True, sid)
        self._dirs.put(seq, pdir)
        # A new inode (numbers are never reused): nothing has it open, it has no extents.
        f = OpenFile(inode, {}, self._services())
        f.ns_gen = -1 if token is None else token
        if self.quotas is not None:
            f.account = self.quotas.account(
                base.rstrip("/") + "/" + name.decode(errors="surrogateescape"), 0)
            f.account_known = True
        if bound:
            f.placed_in(base.rstrip("/") + "/" + name.decode(errors="surrogateescape"))
        f.handles = 1
        if (flags & os.O_ACCMODE) != os.O_RDONLY:
            await f.hold_pushes()  # new: nothing in flight; none starts while it is open
        self.open_files[inode.ino] = f
        self._uncached.add(f)
        fh = self._new_handle(f, flags, ctx)
        if self.tracker is not None:
            path = base.rstrip("/") + "/" + name.decode(errors="surrogateescape")
            self._cache_path(self.handles[fh], path, token)  # as path_of spells it
            self.tracker.push(FsEvent("create", path, time.time_ns(), mode=inode.mode))
        return fh, f.attrs()

    async def _account(self, f: OpenFile) -> None:
        """Before a file may be written: charge it to its namespace (once per open file;
        the namespace of a file never changes: Access.rename and link refuse a crossing)."""
        quotas = self.quotas
        if quotas is None or f.account_known:
            return

        def read() -> tuple[str, int | None]:
            # With the namespace's usage now: other nodes' commits (or deletions here)
            # changed it since this node last knew.
            path = self.catalog.path_of(f.ino)
            ns = quotas.namespace_of(path)
            used = None if ns is None or ns.quota is None else self.catalog.namespace_used(ns.path)
            return path, used

        before = quotas.generations()
        path, used = await self.db(read)
        if not f.account_known:  # another open may have decided meanwhile
            f.account = quotas.account(path, f.committed_size)
            f.account_known = True
        if f.account is not None and used is not None:
            quotas.note_used(f.account.ns, used, before)

    async def _kill_setid(self, f: OpenFile) -> None:
        """A write by a non-root caller clears setuid, and setgid with group execute (as
        Linux; the kernel does it for cached writes, not for direct I/O ones)."""
        mode = f.inode.mode & ~stat.S_ISUID
        if mode & stat.S_IXGRP:
            mode &= ~stat.S_ISGID
        if mode != f.inode.mode:
            await self.setattr(f.ino, mode=mode)

    async def read(self, fh: int, off: int, size: int) -> Buffer:
        h = self._handle(fh)
        return await h.file.read(off, size, cached=not h.direct_io)

    async def write(self, fh: int, off: int, data: bytes) -> int:
        h = self._handle(fh)
        if (h.flags & os.O_ACCMODE) == os.O_RDONLY:
            raise CkptfsError("file not open for writing", errno=errno.EBADF)
        if h.direct_io and h.file not in self._uncached:
            h.file.bypassed_cache = True
        if h.caller_uid != 0 and h.file.inode.mode & SETID:
            await self._kill_setid(h.file)
        h.file.writer = (h.caller_uid, h.caller_pid)
        n = await h.file.write(off, data)
        if not h.wrote:
            h.wrote = True  # one event per handle, not per write
            if self.tracker is not None:
                path = await self._file_path(h)
                self.tracker.push(FsEvent("write", path, time.time_ns(), size=h.file.size))
        return n

    async def flush(self, fh: int) -> None:
        """close(2) of a handle that changed the file (wrote, or opened it with O_TRUNC),
        or of its last handle open for writing: commit what the file has, so the caller
        sees any error now. Other closes commit nothing: a rewrite in progress (O_TRUNC,
        then writes) must not become the file's content because someone peeked (a reader)
        or touched it (a writer that wrote nothing); the rewriter's close commits it."""
        h = self._handle(fh)
        f = h.file
        if not h.writable:
            return
        if f.failed is not None or (f.is_dirty() and (
            h.wrote or h.flags & os.O_TRUNC or not self._has_writer(f, besides=fh)
        )):
            await self._commit(f, synced=False, h=h)
            if crashpoint.ARMED:
                crashpoint.reached("close-committed", await self._file_path(h))
            await self._apply_durability(f)

    async def fsync(self, fh: int) -> None:
        h = self._handle(fh)
        if not h.writable:
            await h.file.sync_committed()  # a reader syncs the committed content
            return
        await self._commit(h.file, synced=True, h=h)
        await self._apply_durability(h.file)

    def _has_writer(self, f: OpenFile, besides: int | None = None) -> bool:
        return any(h.file is f and h.writable for n, h in self.handles.items() if n != besides)

    async def _apply_durability(self, f: OpenFile) -> None:
        """Under a ``durability = "remote"`` policy, return only once the file's chunks and
        a catalog snapshot naming them are on the remote tiers; EIO after the timeout (the
        file stays committed locally and its upload goes on)."""
        if not self.policies or not self.tier_view.has_remotes:
            return
        path = await self.db(self.catalog.path_of, f.ino)
        policy = policy_for(self.policies, path)
        if policy is None or policy.durability != "remote":
            return
        digests = {r.digest for r in f.committed.values()}
        if not await self.uploader.wait_durable(digests, policy.timeout_s):
            log.error('%s: not durable on the remote after %.0f s (durability = "remote" '
                      "under %s); it is committed locally and its upload goes on",
                      path, policy.timeout_s, policy.path)
            raise CkptfsError(f"{path}: not durable on the remote in time", errno=errno.EIO)

    async def _commit(self, f: OpenFile, synced: bool, h: Handle | None = None) -> None:
        who = None if h is None else AuditRecord("commit", uid=h.caller_uid, pid=h.caller_pid,
                                                  ino=f.ino)
        if h is not None and h.writable and self.tracker is not None:
            # Its record may carry a commit signal until the last writer's release event
            # is queued (checkpoints/fence.py).
            self.tracker.fence.file_committing(f.ino)
        try:
            await f.commit(synced=synced, audit=who)
        except CkptfsError:
            if f.failed is not None:
                await self._retire(f)
            raise

    async def _retire(self, f: OpenFile) -> None:
        """A write of this file failed and was reported. The handles that made it keep
        failing until they close, but new opens must see the last committed content now,
        not when the kernel gets round to RELEASE: give them a fresh OpenFile."""
        if self.open_files.get(f.ino) is f:
            # Its readers may go on reading, but never push again: a new OpenFile of the
            # inode may be written meanwhile, which this one would not know of.
            await f.hold_pushes()
            if self.open_files.get(f.ino) is f:
                del self.open_files[f.ino]
            self._dirs.forget(self._dirs.stamp(), f.ino)  # its earlier commits changed the row
            if self.invalidate is not None:
                await trio.to_thread.run_sync(self.invalidate, f.ino)

    async def release(self, fh: int) -> None:
        h = self.handles.pop(fh, None)
        if h is None:
            return
        last = h.writable and not any(
            o.file is h.file and o.writable for o in self.handles.values()
        )
        known = self._committed_state(h) if self.tracker is not None and h.writable else None
        if h.writable:
            h.file.allow_pushes()
        await self._drop_handle_ref(h.file)
        if self.tracker is not None and h.writable:
            try:
                await self._release_event(h, last, known)
            finally:
                if last:
                    self.tracker.fence.file_released(h.file.ino)

    async def fsyncdir(self) -> None:
        await self.db(self.catalog.sync)

    # -- checkpoint state as extended attributes -----------------------------------------

    async def _checkpoint_of(self, ino: int) -> CheckpointRow | None:
        path = await self.db(self.catalog.path_of, ino)
        rows = [c for c in await self.db(self.catalog.checkpoint_rows, path) if c.root == path]
        return rows[0] if rows else None

    async def _xattr_index(self) -> set[int]:
        if self._xattr_inos is None:
            self._xattr_inos = await self.db(self.catalog.xattr_inodes)
        return self._xattr_inos

    async def getxattr(self, ino: int, name: bytes, ctx: RequestContext = ROOT) -> bytes | None:
        """A stored attribute, or ckptfs's own: ``user.ckptfs.state`` (writing, committed,
        partial, ...) and ``user.ckptfs.checkpoint`` (the whole record, JSON) on a
        checkpoint's root. None: no such attribute."""
        if not name.startswith(b"security."):  # asked before buffered writes: kept free
            await self.access.inode(ctx, ino, "getxattr")
        if name == XATTR_GC:
            return await self._gc_done(ino, ctx)
        if name.startswith(XATTR_RESERVED):
            after = page_after(name)
            if after is not None:  # the checkpoints under a directory (vfs/listing.py)
                visible = await self.access.viewer(ctx)
                path = await self.db(self.catalog.path_of, ino)
                return await listing(self.catalog, self.db, path, after, visible)
            if name not in XATTRS:
                return None
            ckpt = await self._checkpoint_of(ino)
            if ckpt is None:
                return None
            if name == XATTR_STATE:
                return ckpt.state.value.encode()
            return json.dumps(ckpt.as_dict(), sort_keys=True).encode()
        if ino not in await self._xattr_index():
            return None
        return await self.db(self.catalog.get_xattr, ino, name)

    async def listxattr(self, ino: int, ctx: RequestContext = ROOT) -> list[bytes]:
        await self.access.inode(ctx, ino, "listxattr")
        names = []
        if ino in await self._xattr_index():
            # trusted.* is for root only (the kernel leaves the listing to us).
            names = [n for n in await self.db(self.catalog.list_xattrs, ino)
                     if ctx.is_root or not n.startswith(b"trusted.")]
        if await self._checkpoint_of(ino) is not None:
            names += XATTRS
        return names

    async def _check_xattr_write(self, ino: int, name: bytes, ctx: RequestContext) -> None:
        """Which attributes may be stored, as on Linux (the kernel checks the same with
        default_permissions): user.* on files and directories by writers, trusted.* by
        root, security.*; system.* (ACLs) and other namespaces are not supported."""
        if len(name) > XATTR_NAME_MAX or not name:
            raise CkptfsError(f"xattr name of {len(name)} bytes", errno=errno.ERANGE)
        if not name.startswith(XATTR_STORED_PREFIXES):
            raise NotSupported(f"xattr namespace of {name!r} is not supported")
        if name.startswith(b"trusted.") and not ctx.is_root:
            raise NotPermitted("trusted.* xattrs are for root")
        inode = await self.getattr(ino)
        if name.startswith(b"user."):
            if not (inode.is_dir or inode.is_reg):
                raise NotPermitted("user.* xattrs only on files and directories")
            if not ctx.may_write(inode.mode, inode.uid, inode.gid):
                raise PermissionDenied("no write permission")
            if inode.is_dir and inode.mode & stat.S_ISVTX and not ctx.owns(inode.uid):
                raise NotPermitted("user.* xattrs of a sticky directory: owner only")

    async def setxattr(
        self, ino: int, name: bytes, value: bytes, ctx: RequestContext = ROOT, flags: int = 0
    ) -> None:
        """Store an attribute (``flags``: os.XATTR_CREATE, os.XATTR_REPLACE). ckptfs's own
        names are commands: ``user.ckptfs.tag`` = TAG adds a tag (e.g. milestone) to a
        checkpoint; ``user.ckptfs.gc`` (any value, on any directory) asks for retention now
        (``ckptfs gc``; a getxattr of it waits for the pass); ``user.ckptfs.prefetch`` stages a
        file on the local tiers. The other ``user.ckptfs.*`` names are reserved: EPERM."""
        await self.access.inode(ctx, ino, "setxattr")
        if name.startswith(XATTR_RESERVED):
            if not is_control(name):
                raise NotPermitted(f"{name.decode(errors='replace')} is reserved for ckptfs")
            await self._control_xattr(ino, name, value, ctx)
            return
        await self._check_xattr_write(ino, name, ctx)
        if len(value) > XATTR_SIZE_MAX:
            raise CkptfsError(f"xattr value of {len(value)} bytes", errno=errno.E2BIG)
        inode = await self._db_dirs_changed(lambda: self.catalog.set_xattr(
            ino, name, value, create=bool(flags & os.XATTR_CREATE),
            replace_only=bool(flags & os.XATTR_REPLACE), total_max=XATTR_TOTAL_MAX))
        (await self._xattr_index()).add(ino)
        self._new_ctime(inode)

    async def removexattr(self, ino: int, name: bytes, ctx: RequestContext = ROOT) -> None:
        await self.access.inode(ctx, ino, "removexattr")
        if name.startswith(XATTR_RESERVED):
            raise NotPermitted(f"{name.decode(errors='replace')} is reserved for ckptfs")
        await self._check_xattr_write(ino, name, ctx)
        if ino not in await self._xattr_index():
            raise NoAttribute(name.decode(errors="replace"))
        self._new_ctime(await self._db_dirs_changed(self.catalog.remove_xattr, ino, name))

    def _new_ctime(self, inode: Inode) -> None:
        f = self.open_files.get(inode.ino)
        if f is not None:
            f.ctime_ns = inode.ctime_ns

    async def _control_xattr(
        self, ino: int, name: bytes, value: bytes, caller: RequestContext
    ) -> None:
        """Control xattrs (vfs/control.py), for the inode's owner or root only:
        ``user.ckptfs.tag`` = TAG adds a tag (e.g. milestone) to a checkpoint;
        ``user.ckptfs.gc`` (any value) asks for retention of the checkpoints under this
        directory now; a getxattr of it returns once that pass is done (``ckptfs gc PATH``);
        ``user.ckptfs.prefetch`` stages a file's chunks on the local tiers."""
        check_control(await self.getattr(ino), name, caller)
        if name == XATTR_GC:
            scope = await self.db(self.catalog.path_of, ino)
            await self.db(self.catalog.audit_append, AuditRecord(
                "gc_request", scope, caller.uid, caller.pid))
            # Asked, not waited for: the kernel holds this directory's inode locked for the
            # whole setxattr, and a pass may wait for the object store (issue 33, item 4).
            ticket = await self.gc.request(scope)
            self._gc_tickets = {i: t for i, t in self._gc_tickets.items()
                                if not self.gc.served_ticket(t)}
            self._gc_tickets[ino] = max(ticket, self._gc_tickets.get(ino, 0))
            return
        if name == XATTR_PREFETCH:
            await self.stage_file(ino)
            # Once staged (what a prefetch changes is replica rows, many transactions).
            await self.db(self.catalog.audit_append, AuditRecord(
                "prefetch", uid=caller.uid, pid=caller.pid, ino=ino))
            return
        assert name == XATTR_TAG
        tag = value.decode(errors="replace").strip()
        if not tag or not all(ch.isalnum() or ch in "-_." for ch in tag) or len(tag) > 64:
            raise InvalidArgument(f"bad tag {tag!r} (1-64 of letters, digits, - _ .)")
        path = await self.db(self.catalog.path_of, ino)
        tagged = functools.partial(self.catalog.checkpoint_tag, audit=AuditRecord(
            "tag", uid=caller.uid, pid=caller.pid))
        if not await self.db(tagged, path, tag):
            raise InvalidArgument(f"{path} is not a known checkpoint")

    async def _gc_done(self, ino: int, caller: RequestContext) -> bytes:
        """``getxattr user.ckptfs.gc``: wait for the pass the last ``setxattr`` of it on
        this directory asked for (none pending: at once); the pass's report (JSON)."""
        ticket = self._gc_tickets.get(ino)
        if ticket is None:
            return b"{}"
        report = await self.gc.wait(ticket)
        path = await self.db(self.catalog.path_of, ino)
        log.info("gc requested under %s done (uid %d): %s", path, caller.uid, report)
        return json.dumps(vars(report), sort_keys=True, default=str).encode()

    async def stage_file(self, ino: int) -> None:
        """Copy every chunk of a file that only a remote holds to a local tier, verified,
        a few in parallel; returns when done. ENOSPC if the local tiers have no room."""
        refs = list((await self.db(self.catalog.extents, ino)).values())
        no_room = 0
        failed: list[CkptfsError] = []
        limiter = trio.CapacityLimiter(STAGE_PARALLEL)

        async def one(ref: ChunkRef) -> None:
            nonlocal no_room
            async with limiter:
                try:
                    if not await self.store.stage(ref):
                        no_room += 1
                except CkptfsError as exc:  # reported below with its errno, not as a group
                    failed.append(exc)

        async with trio.open_nursery() as n:
            for ref in refs:
                n.start_soon(one, ref)
        if failed:
            raise failed[0]
        if no_room:
            raise NoSpace(f"{no_room} chunk(s) could not be staged: no local tier has room")

    # -- statfs ------------------------------------------------------------------------------

    async def statfs(self) -> FsStats:
        usages = await self.tier_view.usage()
        total = free = 0
        seen_devices: set[int] = set()
        for u in usages:
            # Uncapped tiers on one device share its space: count it once.
            if not u.capped:
                if u.device in seen_devices:
                    continue
                seen_devices.add(u.device)
            total += u.total
            free += u.free
        bs = 4096
        return FsStats(bs, total // bs, free // bs, free // bs, 1 << 32, 1 << 31, NAME_MAX)

