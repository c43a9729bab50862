"""The filesystem without the kernel: typed async methods that raise CkptfsError.

The FUSE adapter (``ckptfs.fuse.ops``) only converts types and errors; tests can call this
class directly. Catalog work runs in one worker thread at a time (``db_limiter``), chunk
work in the ChunkStore's threads; nothing here blocks the trio loop.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import trio

from .. import crashpoint, threads
from ..catalog import Around, ChunkRef, Inode
from ..catalog.audit import AuditRecord
from ..catalog.catalog import ROOT_INODE
from ..catalog.protocols import QuotaCatalog
from ..checkpoints.events import FsEvent
from ..chunks.service import FrontEndChunks
from ..codec.frame import Buffer
from ..codec.staged import StagePool
from ..config import policy_for
from ..errors import (
    CatalogUnavailable,
    CkptfsError,
    InvalidArgument,
    IsADirectory,
    NameTooLong,
    NoSpace,
    NotADirectory,
    NotFound,
    NotPermitted,
)
from ..service import syncfs_all
from .context import ROOT, RequestContext
from .control import XATTR_RESERVED, ControlCatalog, ControlXattrs
from .dirattrs import DirAttrs
from .handles import FsStats, Handle, HandleTable, uses_direct_io
from .names import KnownNames
from .openfile import MemoryBudget, OpenFile, OpenFiles, Services
from .openrows import OpenRows
from .options import FsGovernance, FsKernel, FsOptions, FsPeers
from .setid import SETID, SetidRules, owner_rules
from .signals import CommitSignals
from .xattrs import XATTR_TOTAL_MAX, StoredXattrs

# Handle, HandleTable and uses_direct_io live in vfs/handles.py: imported from here too.
__all__ = ["XATTR_TOTAL_MAX", "Filesystem", "FsCatalog", "FsStats", "Handle", "HandleTable",
           "uses_direct_io"]

log = logging.getLogger("ckptfs.vfs")

T = TypeVar("T")

NAME_MAX = 255
# Files whose cached version a node remembers (shared catalog); older ones drop their pages.
CACHED_VERSIONS_MAX = 1 << 16
STAGE_PARALLEL = 4  # chunks of one file fetched and written at once by a prefetch


def _check_name(name: bytes) -> bytes:
    if len(name) > NAME_MAX:
        raise NameTooLong(f"name of {len(name)} bytes (at most {NAME_MAX})")
    return name


def _audit(action: str, ctx: RequestContext, **detail: Any) -> AuditRecord:
    """The audit record of a change ``ctx`` asks for (its path: the catalog's, in the
    change's transaction)."""
    return AuditRecord(action, uid=ctx.uid, pid=ctx.pid, detail=detail)


class FsCatalog(ControlCatalog, QuotaCatalog, Protocol):
    """The catalog roles the filesystem uses: the namespace, the files' contents, meta, the
    open-handle rows (SessionCatalog), the checkpoint rows and the audit records (both in
    ControlCatalog), the namespaces' usage."""


class Filesystem:
    def __init__(
        self, catalog: FsCatalog, store: FrontEndChunks, options: FsOptions, *,
        db_limiter: trio.CapacityLimiter, budget: MemoryBudget, open_files: OpenFiles,
        handles: HandleTable, peers: FsPeers, kernel: FsKernel | None = None,
        governance: FsGovernance | None = None,
    ) -> None:
        """Built by the composition root (mount.py ``build``), which also builds what it is
        given: ``store`` (chunks and the commit of a file), ``budget`` (whose spill writes
        out the partial chunks of ``open_files``), ``handles`` (shared with the tracker and
        the janitor); ``options``, ``peers`` (the daemon's services), ``kernel`` (its
        callbacks; None: no kernel) and ``governance`` (None: no namespace): vfs/options.py."""
        kernel = kernel if kernel is not None else FsKernel()
        governance = governance if governance is not None else FsGovernance()
        self.catalog = catalog
        self.options = options
        self.quotas = governance.quotas
        self.access = governance.access
        self.invalidate = kernel.invalidate
        self.invalidate_entry = kernel.invalidate_entry
        # The encrypted namespace of a path (docs/governance.md), None: none is encrypted.
        self.sealed_namespace = governance.sealed_namespace
        self.chunk_size = options.chunk_size
        self.db_limiter = db_limiter
        self.store = store
        self.tier_view = peers.tiers  # the local tiers' roots and usage, any remote tier
        self.budget = budget
        # Buffers a save's chunks are assembled in, reused (codec/staged.py): as many as
        # the memory budget lets be in memory at once.
        self.stages = StagePool(self.chunk_size, keep=max(1, budget.limit // self.chunk_size))
        self.uploader = peers.uploader
        # Checkpoint awareness: operations become events for the detectors (None: off).
        self.tracker = peers.tracker
        self.open_files = open_files
        self.handles = handles
        self.shared = options.shared
        self.page_push = None if self.shared else kernel.page_push
        # Shared catalog: the inodes held open, noted under this node's session.
        self.rows = OpenRows(catalog, peers.session if self.shared else None, self.db,
                             self._db_dirs_changed, self._held_here, self._collect_dropped)
        # ckptfs's own xattrs: checkpoint state and the control commands.
        self.control = ControlXattrs(catalog, self.db, peers.gc, self.access, self.getattr,
                                     self.stage_file)
        self.xattrs = StoredXattrs(catalog, self.db, self._db_dirs_changed, self.getattr,
                                   open_files)
        self.setid = SetidRules(self.getattr, self._chmod)
        self.signals = CommitSignals(catalog, self.db, self.tracker, self.chunk_size,
                                     self._read_committed)
        self._init_caches()

    def _init_caches(self) -> None:
        """What this mount knows without asking the catalog, and the state of its opens."""
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
        # Directory attributes for the kernel's GETATTR after each change in a directory.
        self._dirs = DirAttrs(enabled=not self.shared)
        # The names of directories this mount created: missing names answered from memory.
        self._names = KnownNames(enabled=not self.shared)
        # Shared catalog: the version (size, mtime) of each file whose pages this kernel
        # may cache, and the files whose next handle must drop them (close-to-open).
        self._cached_versions: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._drop_cache: set[int] = set()
        self._next_fh = 1
        self._nursery: trio.Nursery | None = None

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

    async def replay_signals(self) -> int:
        """At start, before serving: the commit signals a crash may have kept from the
        tracker, replayed (vfs/signals.py). Returns how many were queued."""
        return await self.signals.replay()

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
            readahead=self.options.readahead, copy_back=self.options.copy_back,
            stages=self.stages,
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
                mode = owner_rules(await self.getattr(ino), mode, uid, gid,
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
        mode = await self.setid.new_mode(parent, kind | stat.S_IMODE(mode), ctx)
        with self._naming(parent):
            inode = await self._db_dirs_changed(
                functools.partial(self.catalog.create, audit=_audit("create", ctx)), parent,
                _check_name(name), mode, ctx.uid, ctx.gid, None, rdev)
        self._names.added(parent, name, inode.ino)
        if kind == stat.S_IFREG:
            await self._event("create", parent, name, mode=inode.mode)
        return inode

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
            self.xattrs.forget(inode.ino)
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
        self.xattrs.forget(ino)
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

    def _held_here(self, ino: int) -> bool:
        return (ino in self.open_files or ino in self._opening
                or any(h.file.ino == ino for h in self.handles.values()))

    async def sync_open_rows(self) -> None:
        """After a heartbeat (the catalog answers again): the open-handle rows made to match
        what this node holds open (vfs/openrows.py)."""
        await self.rows.sync()

    def _done_opening(self, ino: int) -> None:
        left = self._opening.pop(ino) - 1
        if left:
            self._opening[ino] = left

    async def _open_failed(self, ino: int) -> None:
        """An open of ``ino`` failed: a last close meanwhile left the inode's row to it (it
        was held here, in _opening); released now if nothing else holds it."""
        self._done_opening(ino)
        await self.rows.release(ino)

    async def _open_file(self, ino: int, writing: bool = False) -> OpenFile:
        f = self.open_files.get(ino)
        if f is not None:
            if self.rows.needs_note(ino, writing):
                await self._note_held(ino, writing)
            f.handles += 1
            return f
        note = self.rows.needs_note(ino, writing)

        def read() -> tuple[Inode, dict[int, ChunkRef], str]:
            inode = self.catalog.get_inode(ino)
            if inode.is_dir:
                raise IsADirectory("is a directory")
            # Before its extents are read: an unlink on another node keeps it.
            sid = self.rows.note(ino, writing) if note else ""
            return inode, self.catalog.extents(ino), sid

        self._opening[ino] = self._opening.get(ino, 0) + 1
        token = self._path_token()
        try:
            # The note after a release decided before (a close of this inode meanwhile).
            async with self.rows.hold(ino) if note else contextlib.nullcontext():
                inode, extents, sid = await self.db(read)
                if note:
                    self.rows.noted_now(ino, writing, sid)
        except BaseException as exc:
            if note and isinstance(exc, CatalogUnavailable):
                self.rows.unsure(ino)  # the note may have gone in before the failure
            await self._open_failed(ino)
            raise
        self._done_opening(ino)
        f = self.open_files.get(ino)  # another open may have raced us during the await
        if f is not None:
            f.handles += 1
            return f
        return await self._first_open(inode, extents, token)

    async def _note_held(self, ino: int, writing: bool) -> None:
        """An open of a file open here already needs a (writing) note of its row."""
        # Held meanwhile: a last close of the other handles leaves the row to this one.
        self._opening[ino] = self._opening.get(ino, 0) + 1
        try:
            async with self.rows.hold(ino):  # after a release decided before
                sid = await self.db(self.rows.note, ino, writing)
                self.rows.noted_now(ino, writing, sid)
        except BaseException:
            await self._open_failed(ino)
            raise
        self._done_opening(ino)

    async def _first_open(
        self, inode: Inode, extents: dict[int, ChunkRef], token: int | None
    ) -> OpenFile:
        """The OpenFile of an inode nothing here has open, as the catalog read it (at
        namespace generation ``token``), with its first handle counted."""
        ino = inode.ino
        stale = False
        if self.shared and self._cached_versions.pop(ino, None) != (inode.size, inode.mtime_ns):
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
            if self.rows.session is not None:
                await self.rows.release(f.ino)  # the catalog knows its link count
            elif f.inode.nlink <= 0:
                await self._delete_inode(f.ino)
            elif clean and self._ns_busy == 0 and f.ns_gen == self._ns_gen:
                # What its last commit wrote (nothing since): the next stat needs no
                # catalog read. Taken now, after every catalog call that changed the row.
                self._dirs.put_file(self._dirs.stamp(), f.attrs())
            else:
                self._dirs.forget(self._dirs.stamp(), f.ino)
        elif f.ino not in self.open_files:
            if self.rows.session is not None:
                await self.rows.release(f.ino)
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
        mode = await self.setid.new_mode(parent, stat.S_IFREG | stat.S_IMODE(mode), ctx)
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
            sid = self.rows.note(inode.ino, True)
            return (inode, around.dir_paths.get(parent, ""), around.dirs[parent],
                    self._dirs.stamp(), sid)

        token = self._path_token()
        try:
            with self._naming(parent):
                inode, base, pdir, seq, sid = await self._db_refreshing(work)
        except CatalogUnavailable:
            if created:  # created, maybe noted: released later
                self.rows.unsure(created[0])
            raise
        self._names.added(parent, name, inode.ino)
        self.access.learn(parent, name, inode.ino)
        self.rows.noted_now(inode.ino, True, sid)
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

    async def _chmod(self, ino: int, mode: int) -> None:
        await self.setattr(ino, mode=mode)

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
            await self.setid.written(h.file.ino, h.file.inode.mode)
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
        if not self.options.policies or not self.tier_view.has_remotes:
            return
        path = await self.db(self.catalog.path_of, f.ino)
        policy = policy_for(self.options.policies, path)
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
                await self.signals.released(h.file, last, known)
            finally:
                if last:
                    self.tracker.fence.file_released(h.file.ino)

    async def fsyncdir(self) -> None:
        await self.db(self.catalog.sync)

    # -- extended attributes: stored (vfs/xattrs.py) and ckptfs's own (vfs/control.py) --------

    async def getxattr(self, ino: int, name: bytes, ctx: RequestContext = ROOT) -> bytes | None:
        """A stored attribute, or ckptfs's own: ``user.ckptfs.state`` (writing, committed,
        partial, ...) and ``user.ckptfs.checkpoint`` (the whole record, JSON) on a
        checkpoint's root. None: no such attribute."""
        if not name.startswith(b"security."):  # asked before buffered writes: kept free
            await self.access.inode(ctx, ino, "getxattr")
        if name.startswith(XATTR_RESERVED):
            return await self.control.get(ino, name, ctx)
        return await self.xattrs.get(ino, name)

    async def listxattr(self, ino: int, ctx: RequestContext = ROOT) -> list[bytes]:
        await self.access.inode(ctx, ino, "listxattr")
        return await self.xattrs.names(ino, ctx) + await self.control.names(ino)

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
            await self.control.set(ino, name, value, ctx)
            return
        await self.xattrs.set(ino, name, value, ctx, flags)

    async def removexattr(self, ino: int, name: bytes, ctx: RequestContext = ROOT) -> None:
        await self.access.inode(ctx, ino, "removexattr")
        if name.startswith(XATTR_RESERVED):
            raise NotPermitted(f"{name.decode(errors='replace')} is reserved for ckptfs")
        await self.xattrs.remove(ino, name, ctx)

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

