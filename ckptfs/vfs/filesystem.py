"""The filesystem without the kernel: typed async methods that raise CkptfsError.

The FUSE adapter (``ckptfs.fuse.ops``) only converts types and errors; tests can call this
class directly. Catalog work runs in one worker thread at a time (``db_limiter``), chunk
work in the ChunkStore's threads; nothing here blocks the trio loop.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import stat
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

import trio

from .. import crashpoint, threads
from ..catalog import Around, ChunkRef, Inode
from ..catalog.audit import AuditRecord
from ..catalog.protocols import QuotaCatalog
from ..checkpoints.events import FsEvent
from ..chunks.service import FrontEndChunks
from ..codec.frame import Buffer
from ..codec.staged import Staged, StagePool
from ..errors import (
    InvalidArgument,
    IsADirectory,
    NameTooLong,
    NotADirectory,
    NotFound,
    NotPermitted,
)
from .context import ROOT, RequestContext
from .control import XATTR_RESERVED, ControlCatalog, ControlXattrs
from .dirattrs import DirAttrs
from .fileio import FileIO
from .fileservices import MemoryBudget, Services
from .handles import NAME_MAX, FsStats, Handle, HandleTable, uses_direct_io
from .names import KnownNames
from .openfile import OpenFiles
from .openrows import OpenRows
from .opens import Opens
from .options import FsGovernance, FsKernel, FsOptions, FsPeers
from .pathgen import PathGeneration
from .removal import TreeRemoval
from .setid import SetidRules, check_sticky, owner_rules
from .signals import CommitSignals
from .xattrs import XATTR_TOTAL_MAX, StoredXattrs

# Handle, HandleTable and uses_direct_io live in vfs/handles.py: imported from here too.
__all__ = ["XATTR_TOTAL_MAX", "Filesystem", "FsCatalog", "FsStats", "Handle", "HandleTable",
           "uses_direct_io"]

log = logging.getLogger("ckptfs.vfs")

T = TypeVar("T")


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
        self._init_caches()
        self.setid = SetidRules(self.getattr, self._chmod)
        self.signals = CommitSignals(catalog, self.db, self.tracker, self.chunk_size,
                                     self._read_committed)
        # The open files and their handles; their data path.
        self.opens = Opens(
            catalog, self.db, open_files=open_files, handles=handles, rows=self.rows,
            dirs=self._dirs, paths=self.paths, services=self._services,
            delete_inode=self._delete_inode, quotas=self.quotas, invalidate=self.invalidate,
            shared=self.shared)
        self.io = FileIO(
            catalog, self.db, self.opens, options=options, store=store, tiers=self.tier_view,
            uploader=self.uploader, tracker=self.tracker, dirs=self._dirs, paths=self.paths,
            setid=self.setid, signals=self.signals, invalidate=self.invalidate)
        # ckptfs's own xattrs: checkpoint state and the control commands.
        self.control = ControlXattrs(catalog, self.db, peers.gc, self.access, self.getattr,
                                     self.stage_file, peers.scrub, peers.drill)
        self.xattrs = StoredXattrs(catalog, self.db, self._db_dirs_changed, self.getattr,
                                   open_files)
        self.removal = TreeRemoval(self, self.invalidate_entry)

    def _init_caches(self) -> None:
        """What this mount knows without asking the catalog (the open files' state: opens)."""
        # Paths cached for checkpoint events, valid while the namespace generation holds.
        self.paths = PathGeneration()
        # Directory attributes for the kernel's GETATTR after each change in a directory.
        self._dirs = DirAttrs(enabled=not self.shared)
        # The names of directories this mount created: missing names answered from memory.
        self._names = KnownNames(enabled=not self.shared)
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

    async def _event(self, kind: str, parent: int, name: bytes, **kw: Any) -> None:
        """Tell the checkpoint tracker what just happened (after it took effect)."""
        if self.tracker is None:
            return
        path = await self._path(parent, name)
        self.tracker.push(FsEvent(kind, path, time.time_ns(), **kw))

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
            await self.io.truncate(ino, size, ctx)
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

    async def readlink(self, ino: int, ctx: RequestContext = ROOT) -> bytes:
        await self.access.inode(ctx, ino, "readlink")
        inode = await self.db(self.catalog.get_inode, ino)
        if not stat.S_ISLNK(inode.mode) or inode.target is None:
            raise InvalidArgument("not a symlink")
        return inode.target

    async def link(self, ino: int, parent: int, name: bytes, ctx: RequestContext = ROOT) -> Inode:
        await self.access.link(ctx, ino, parent, name)
        with self.paths.changing(), self._naming(parent):
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
        busy = frozenset(self.open_files) | frozenset(self.opens.opening)
        tracked = self.tracker is not None

        def work() -> tuple[Inode, dict[bytes, list[str]] | None, str, Inode, int]:
            if not ctx.is_root:
                check_sticky(self.catalog, parent, [name], ctx)
            around = Around(paths=tracked)
            inode = self.catalog.unlink(parent, name, audit=_audit("unlink", ctx), around=around)
            gone = None
            if inode.nlink <= 0 and inode.ino not in busy:
                gone = self.store.collect_digests_blocking(self.catalog.delete_inode(inode.ino))
            return (inode, gone, around.dir_paths.get(parent, ""), around.dirs[parent],
                    self._dirs.stamp())

        with self.paths.changing(), self._naming(parent):
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
            await self.db(check_sticky, self.catalog, parent, [name], ctx)
        with self.paths.changing(), self._naming(parent):
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
                check_sticky(self.catalog, old_parent, [old_name], ctx)
                check_sticky(self.catalog, new_parent, [new_name], ctx)
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
        with self.paths.changing(), self._naming(old_parent, new_parent):
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
        unlink and rmdir would (vfs/removal.py)."""
        await self.removal.remove_tree(path)

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

    # -- open files: their handles (vfs/opens.py), their data (vfs/fileio.py) ----------------

    def _held_here(self, ino: int) -> bool:
        return self.opens.held_here(ino)

    async def sync_open_rows(self) -> None:
        """After a heartbeat (the catalog answers again): the open-handle rows made to match
        what this node holds open (vfs/openrows.py)."""
        await self.rows.sync()

    def keep_cache(self, fh: int) -> bool:
        return self.opens.keep_cache(fh)

    async def open(self, ino: int, flags: int, ctx: RequestContext = ROOT) -> int:
        await self.access.inode(ctx, ino, "open")
        return await self.opens.open(ino, flags, ctx)
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

        def work() -> tuple[Inode, str, Inode, int, str]:
            # One catalog transaction: the new inode, its directory's new attributes (the
            # kernel asks for them next), for the event the directory's path, and (shared
            # catalog) the inode noted open here, so that another node's unlink keeps it
            # while it is open. No row lock: nothing else notes or releases a new inode
            # before this create returns.
            around = Around(paths=tracked or counted or bound)
            sid = self.rows.note_sid()
            inode = self.catalog.create(parent, name, mode, ctx.uid, ctx.gid,
                                        audit=_audit("create", ctx), around=around,
                                        open_for=sid)
            return (inode, around.dir_paths.get(parent, ""), around.dirs[parent],
                    self._dirs.stamp(), sid)

        token = self.paths.token()
        with self._naming(parent):
            inode, base, pdir, seq, sid = await self._db_refreshing(work)
        self._names.added(parent, name, inode.ino)
        self.access.learn(parent, name, inode.ino)
        self.rows.noted_now(inode.ino, True, sid)
        self._dirs.put(seq, pdir)
        path = base.rstrip("/") + "/" + name.decode(errors="surrogateescape")
        fh = await self.opens.created(inode, token, path, bound, flags, ctx)
        if self.tracker is not None:
            self.paths.cache(self.handles[fh], path, token)  # as path_of spells it
            self.tracker.push(FsEvent("create", path, time.time_ns(), mode=inode.mode))
        return fh, self.handles[fh].file.attrs()

    async def read(self, fh: int, off: int, size: int) -> Buffer:
        return await self.io.read(fh, off, size)

    async def write(self, fh: int, off: int, data: bytes) -> int:
        return await self.io.write(fh, off, data)

    async def write_chunk(
        self, fh: int, idx: int, fill: Callable[[Staged], Awaitable[None]]
    ) -> bool:
        return await self.io.write_chunk(fh, idx, fill)

    async def flush(self, fh: int) -> None:
        await self.io.flush(fh)

    async def fsync(self, fh: int) -> None:
        await self.io.fsync(fh)

    async def release(self, fh: int) -> None:
        await self.io.release(fh)

    async def shutdown(self) -> None:
        await self.io.shutdown()

    async def statfs(self) -> FsStats:
        return await self.io.statfs()

    async def stage_file(self, ino: int) -> None:
        await self.io.stage_file(ino)

    async def _chmod(self, ino: int, mode: int) -> None:
        await self.setattr(ino, mode=mode)

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
        file on the local tiers; ``user.ckptfs.drill`` asks for a restore drill (``ckptfs drill``;
        a getxattr of it waits for the report). The other ``user.ckptfs.*`` names are
        reserved: EPERM."""
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

