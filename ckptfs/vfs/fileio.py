"""The data path of open files: read, write, truncate, the commit at close (flush) and
fsync with the durability wait of a ``durability = "remote"`` policy, release, a prefetch
to the local tiers (stage_file), statfs and the commit-and-sync at shutdown.

Given the handles (vfs/opens.py) and the narrow things it uses; the Filesystem delegates
its FUSE-facing methods here in one line. It changes no name: of the namespace caches it
only reads the namespace generation (vfs/pathgen.py) and, when a failed file is retired,
forgets one inode's attributes (one stamp-and-forget, vfs/dirattrs.py).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from .. import crashpoint
from ..catalog import ChunkRef, Inode
from ..catalog.audit import AuditRecord
from ..catalog.protocols import ContentsCatalog, MetaCatalog, NamespaceCatalog
from ..checkpoints.events import FsEvent
from ..chunks.service import FrontEndChunks
from ..chunks.tierview import TierView
from ..codec.frame import Buffer
from ..codec.staged import Staged
from ..config import policy_for
from ..errors import CkptfsError, NoSpace
from ..service import syncfs_all
from .context import RequestContext
from .dirattrs import DirAttrs
from .handles import NAME_MAX, FsStats, Handle
from .openfile import OpenFile
from .openrows import Db
from .opens import Opens
from .options import DurableWaiter, EventSink, FsOptions
from .pathgen import PathGeneration
from .setid import SETID, SetidRules
from .signals import CommitSignals

log = logging.getLogger("ckptfs.vfs")

STAGE_PARALLEL = 4  # chunks of one file fetched and written at once by a prefetch


class IoCatalog(NamespaceCatalog, ContentsCatalog, MetaCatalog, Protocol):
    """What the data path reads: a file's path and extents; the catalog's sync."""


class FileIO:
    def __init__(
        self, catalog: IoCatalog, db: Db, opens: Opens, *, options: FsOptions,
        store: FrontEndChunks, tiers: TierView, uploader: DurableWaiter,
        tracker: EventSink | None, dirs: DirAttrs, paths: PathGeneration, setid: SetidRules,
        signals: CommitSignals, invalidate: Callable[[int], None] | None,
    ) -> None:
        self.catalog = catalog
        self.db = db
        self.opens = opens
        self.open_files = opens.open_files
        self.handles = opens.handles
        self.options = options
        self.store = store
        self.tier_view = tiers
        self.uploader = uploader
        self.tracker = tracker
        self._dirs = dirs
        self.paths = paths
        self.setid = setid
        self.signals = signals
        self.invalidate = invalidate

    async def file_path(self, h: Handle) -> str:
        """The path of a handle's file, as ``catalog.path_of`` gives it."""
        cached = self.paths.cached(h)
        if cached is not None:
            return cached
        token = self.paths.token()
        path = await self.db(self.catalog.path_of, h.file.ino)
        self.paths.cache(h, path, token)
        return path

    def _committed_state(self, h: Handle) -> tuple[str, Inode, dict[int, ChunkRef]] | None:
        """What the catalog holds for a handle's file, known without asking it: the open
        file is the inode's current one and has nothing uncommitted (its attributes and
        extents are then those its last commit wrote), and the cached path is current.
        Taken synchronously, before anything else can change the file."""
        f = h.file
        if (self.open_files.get(f.ino) is not f or f.is_dirty() or f.failed is not None
                or f.written or h.path is None or not self.paths.current(h.path_gen)):
            return None
        return h.path, f.attrs(), dict(f.committed)

    async def truncate(self, ino: int, size: int, ctx: RequestContext) -> None:
        """setattr's new size of a regular file (checked by the Filesystem)."""
        f = self.open_files.get(ino)
        if f is not None and self.opens.has_writer(f):
            # Joins the version the writers are making (every handle sees it at
            # once) and is synced with its next commit, their close or fsync.
            await f.truncate(size)
        else:
            # Nobody open for writing would commit it: apply and commit at once.
            f = await self.opens.open_file(ino)
            try:
                async with f.pushes_held():  # a reader's page-cache pushes end first
                    await self.opens.account(f)
                    await f.truncate(size)
                    await f.commit(audit=AuditRecord("commit", uid=ctx.uid, pid=ctx.pid,
                                                     ino=ino, detail={"truncate": size}))
            finally:
                await self.opens.drop_handle_ref(f)

    async def read(self, fh: int, off: int, size: int) -> Buffer:
        h = self.opens.handle(fh)
        return await h.file.read(off, size, cached=not h.direct_io, stream=fh)

    async def write(self, fh: int, off: int, data: bytes) -> int:
        h = await self._writing(fh)
        n = await h.file.write(off, data)
        await self._wrote(h)
        return n

    async def write_chunk(
        self, fh: int, idx: int, fill: Callable[[Staged], Awaitable[None]]
    ) -> bool:
        """A write of one whole chunk that ``fill`` stages (the direct path): the same
        checks, events and chunk write as ``write`` (OpenFile.write_whole). False:
        nothing is staged here, nothing was written."""
        h = await self._writing(fh)
        if not await h.file.write_whole(idx, fill):
            return False
        await self._wrote(h)
        return True

    async def _writing(self, fh: int) -> Handle:
        """A handle about to write: open for writing, its file's setid bits dropped."""
        h = self.opens.handle(fh)
        if (h.flags & os.O_ACCMODE) == os.O_RDONLY:
            raise CkptfsError("file not open for writing", errno=errno.EBADF)
        if h.direct_io and h.file not in self.opens.uncached:
            h.file.bypassed_cache = True
        if h.caller_uid != 0 and h.file.inode.mode & SETID:
            await self.setid.written(h.file.ino, h.file.inode.mode)
        h.file.writer = (h.caller_uid, h.caller_pid)
        return h

    async def _wrote(self, h: Handle) -> None:
        if not h.wrote:
            h.wrote = True  # one event per handle, not per write
            if self.tracker is not None:
                path = await self.file_path(h)
                self.tracker.push(FsEvent("write", path, time.time_ns(), size=h.file.size))

    async def flush(self, fh: int) -> None:
        """close(2) of a handle that changed the file (wrote, or opened it with O_TRUNC),
        or of its last handle open for writing: commit what the file has, so the caller
        sees any error now. Other closes commit nothing: a rewrite in progress (O_TRUNC,
        then writes) must not become the file's content because someone peeked (a reader)
        or touched it (a writer that wrote nothing); the rewriter's close commits it."""
        h = self.opens.handle(fh)
        f = h.file
        if not h.writable:
            return
        if f.failed is not None or (f.is_dirty() and (
            h.wrote or h.flags & os.O_TRUNC or not self.opens.has_writer(f, besides=fh)
        )):
            await self._commit(f, synced=False, h=h)
            if crashpoint.ARMED:
                crashpoint.reached("close-committed", await self.file_path(h))
            await self._apply_durability(f)

    async def fsync(self, fh: int) -> None:
        h = self.opens.handle(fh)
        if not h.writable:
            await h.file.sync_committed()  # a reader syncs the committed content
            return
        await self._commit(h.file, synced=True, h=h)
        await self._apply_durability(h.file)

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
        await self.opens.drop_handle_ref(h.file)
        if self.tracker is not None and h.writable:
            try:
                await self.signals.released(h.file, last, known)
            finally:
                if last:
                    self.tracker.fence.file_released(h.file.ino)
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
