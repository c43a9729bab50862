"""The open-file lifecycle: which OpenFile serves an inode, the handles on it, and what
happens when its last handle closes (the inode dropped if it has no name left, its row
released in a shared catalog, its attributes left in the directory cache).

The Filesystem checks the caller and changes the namespace; this class counts the opens.
It shares with the Filesystem the caches whose entries an open or a last close changes:
the directory attributes (vfs/dirattrs.py: each change here is one stamp-and-put on the
trio thread, no await between) and the namespace generation (vfs/pathgen.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from ..catalog import ChunkRef, Inode
from ..catalog.audit import AuditRecord
from ..catalog.protocols import AuditCatalog, ContentsCatalog, NamespaceCatalog, QuotaCatalog
from ..errors import CatalogUnavailable, CkptfsError, IsADirectory
from .context import ROOT, RequestContext
from .dirattrs import DirAttrs
from .fileservices import Services
from .handles import Handle, HandleTable
from .openfile import OpenFile, OpenFiles
from .openrows import Db, OpenRows
from .pathgen import PathGeneration
from .quota import Quotas

# Files whose cached version a node remembers (shared catalog); older ones drop their pages.
CACHED_VERSIONS_MAX = 1 << 16


class OpensCatalog(NamespaceCatalog, ContentsCatalog, QuotaCatalog, AuditCatalog, Protocol):
    """What opens read: the inode and its extents, its path and namespace's usage (quotas),
    and the audit note of a read open."""


class Opens:
    def __init__(
        self, catalog: OpensCatalog, db: Db, *, open_files: OpenFiles, handles: HandleTable,
        rows: OpenRows, dirs: DirAttrs, paths: PathGeneration,
        services: Callable[[], Services], delete_inode: Callable[[int], Awaitable[None]],
        quotas: Quotas | None, invalidate: Callable[[int], None] | None, shared: bool,
    ) -> None:
        """``services``: what a new OpenFile is given (Filesystem._services);
        ``delete_inode``: drops an inode with no name left and its chunks."""
        self.catalog = catalog
        self.db = db
        self.open_files = open_files
        self.handles = handles
        self.rows = rows
        self._dirs = dirs
        self.paths = paths
        self._services = services
        self._delete_inode = delete_inode
        self.quotas = quotas
        self.invalidate = invalidate
        self.shared = shared
        # Opens between their catalog read and their entry in open_files: an unlink must
        # not drop such an inode in its own catalog call (Filesystem.unlink).
        self.opening: dict[int, int] = {}
        # Files created by this mount whose every handle so far was write-only: the kernel
        # cannot hold a page of them (nothing could read or map one), so their direct-I/O
        # writes need no invalidation of its page cache at commit (a round trip to it).
        self.uncached: set[OpenFile] = set()
        # Shared catalog: the version (size, mtime) of each file whose pages this kernel
        # may cache, and the files whose next handle must drop them (close-to-open).
        self._cached_versions: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._drop_cache: set[int] = set()
        self._next_fh = 1

    def held_here(self, ino: int) -> bool:
        return (ino in self.open_files or ino in self.opening
                or any(h.file.ino == ino for h in self.handles.values()))

    def _done_opening(self, ino: int) -> None:
        left = self.opening.pop(ino) - 1
        if left:
            self.opening[ino] = left

    async def _open_failed(self, ino: int) -> None:
        """An open of ``ino`` failed: a last close meanwhile left the inode's row to it (it
        was held here, in opening); released now if nothing else holds it."""
        self._done_opening(ino)
        await self.rows.release(ino)

    async def open_file(self, ino: int, writing: bool = False) -> OpenFile:
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

        self.opening[ino] = self.opening.get(ino, 0) + 1
        token = self.paths.token()
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
        self.opening[ino] = self.opening.get(ino, 0) + 1
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

    async def created(
        self, inode: Inode, token: int | None, path: str, bound: bool, flags: int,
        ctx: RequestContext,
    ) -> int:
        """A handle on a file this mount just created (at ``path``, as the catalog spells
        it, resolved at namespace generation ``token``); ``bound``: residency places it by
        its path now."""
        # A new inode (numbers are never reused): nothing has it open, it has no extents.
        f = OpenFile(inode, {}, self._services())
        f.ns_gen = -1 if token is None else token
        if self.quotas is not None:
            f.account = self.quotas.account(path, 0)
            f.account_known = True
        if bound:
            f.placed_in(path)
        f.handles = 1
        if (flags & os.O_ACCMODE) != os.O_RDONLY:
            await f.hold_pushes()  # new: nothing in flight; none starts while it is open
        self.open_files[inode.ino] = f
        self.uncached.add(f)
        return self.new_handle(f, flags, ctx)

    async def drop_handle_ref(self, f: OpenFile) -> None:
        f.handles -= 1
        if f.handles > 0:
            return
        clean = not f.is_dirty() and f.failed is None and not f.written
        await f.release_all()
        if f.handles > 0:
            f.allow_pushes()  # release_all held them
            return  # reopened while we waited
        self.uncached.discard(f)
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
            elif clean and self.paths.current(f.ns_gen):
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

    def new_handle(self, f: OpenFile, flags: int, ctx: RequestContext = ROOT) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self.handles[fh] = Handle(f, flags, caller_uid=ctx.uid, caller_pid=ctx.pid)
        if (flags & os.O_ACCMODE) != os.O_WRONLY:
            self.uncached.discard(f)  # a handle that may read or map: pages may come
        return fh

    def handle(self, fh: int) -> Handle:
        h = self.handles.get(fh)
        if h is None:
            raise CkptfsError(f"bad file handle {fh}", errno=errno.EBADF)
        return h

    def has_writer(self, f: OpenFile, besides: int | None = None) -> bool:
        return any(h.file is f and h.writable for n, h in self.handles.items() if n != besides)

    def keep_cache(self, fh: int) -> bool:
        """May the kernel keep its cached pages of this handle's file (FOPEN_KEEP_CACHE)?
        Always with one node; with a shared catalog, not on the first open after another
        node committed a version this kernel did not see."""
        ino = self.handle(fh).file.ino
        if ino in self._drop_cache:
            self._drop_cache.discard(ino)
            return False
        return True

    async def open(self, ino: int, flags: int, ctx: RequestContext = ROOT) -> int:
        """A handle on ``ino`` (the caller was checked): its OpenFile, charged to its
        namespace and truncated (O_TRUNC) if it is opened for writing."""
        writing = (flags & os.O_ACCMODE) != os.O_RDONLY
        f = await self.open_file(ino, writing=writing)
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
                await self.account(f)
                if flags & os.O_TRUNC:
                    await f.truncate(0)
        except BaseException:
            if held:
                f.allow_pushes()
            await self.drop_handle_ref(f)
            raise
        return self.new_handle(f, flags, ctx)

    async def account(self, f: OpenFile) -> None:
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
