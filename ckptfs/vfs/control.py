"""ckptfs's own extended attributes (``user.ckptfs.*``): the checkpoint state of a
checkpoint's root, read-only (``.state``, ``.checkpoint``, the listing ``.checkpoints``:
vfs/listing.py), and the control xattrs (``.gc``, ``.tag``, ``.prefetch``, ``.scrub``: root only): commands, not
data. None is ever stored; the other ``user.ckptfs.*`` names are reserved (EPERM).

On an ``allow_other`` mount every local user reaches them, so each control xattr acts only
for the owner of the inode it is set on (or root), and only on that inode's subtree: a user
who owns one run directory cannot start retention over every run, or tag someone else's
checkpoint.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from ..catalog import ROOT_INODE, CheckpointRow, Inode
from ..catalog.audit import AuditRecord
from ..catalog.protocols import AuditCatalog
from ..errors import InvalidArgument, NotPermitted, NotSupported
from .access import Access
from .context import RequestContext
from .listing import ListingCatalog, listing, page_after
from .openrows import Db

log = logging.getLogger("ckptfs.vfs")

T = TypeVar("T")

XATTR_TAG = b"user.ckptfs.tag"
XATTR_GC = b"user.ckptfs.gc"
XATTR_PREFETCH = b"user.ckptfs.prefetch"  # stage a file's chunks on the local tiers
XATTR_SCRUB = b"user.ckptfs.scrub"  # a scrub pass now: root only, on the mount's root
XATTR_DRILL = b"user.ckptfs.drill"  # a restore drill of a run (ckptfs/drill/)
CONTROL_XATTRS = (XATTR_TAG, XATTR_GC, XATTR_PREFETCH, XATTR_SCRUB, XATTR_DRILL)
DRILL_TICKETS_KEPT = 256  # drills asked, by (inode, pid), whose report may still be read
XATTR_STATE = b"user.ckptfs.state"
XATTR_RECORD = b"user.ckptfs.checkpoint"
XATTRS = (XATTR_STATE, XATTR_RECORD)
XATTR_RESERVED = b"user.ckptfs."  # ckptfs's own names: never stored


def is_control(name: bytes) -> bool:
    return name in CONTROL_XATTRS


def check_control(inode: Inode, name: bytes, caller: RequestContext) -> None:
    """Only the owner of ``inode`` (or root) may set control xattr ``name`` on it."""
    if not caller.owns(inode.uid):
        raise NotPermitted(
            f"{name.decode()}: only the owner (uid {inode.uid}) or root may set it; "
            f"uid {caller.uid} may not"
        )


class ControlCatalog(ListingCatalog, AuditCatalog, Protocol):
    """What the checkpoint xattrs read and change: paths, checkpoint rows and their tags,
    the listing's summaries, the audit records of the commands."""


class GcRunner(Protocol):
    """Retention on request (``user.ckptfs.gc``; checkpoints/janitor.py GcRequests)."""

    async def request(self, scope: str = "/") -> int: ...

    def served_ticket(self, ticket: int) -> bool: ...

    async def wait(self, ticket: int) -> object: ...


class ScrubRunner(Protocol):
    """A scrub pass on request (``user.ckptfs.scrub``; scrub/service.py Scrubber)."""

    def request(self) -> int: ...

    def served_ticket(self, ticket: int) -> bool: ...

    async def wait(self, ticket: int) -> dict[str, object]: ...


class DrillRunner(Protocol):
    """Restore drills on request (``user.ckptfs.drill``; drill/service.py DrillService):
    ``request`` takes the caller's uid and gid, its pid and the xattr's value."""

    async def request(self, ino: int, caller: tuple[int, int], pid: int, value: bytes) -> int: ...

    def served_ticket(self, ticket: int) -> bool: ...

    async def wait(self, ticket: int) -> bytes: ...


class ControlXattrs:
    """The ``user.ckptfs.*`` names of every inode. ``getattr``: an inode's attributes (as
    the filesystem answers them); ``stage``: copies a file's remote-only chunks to a
    local tier (Filesystem.stage_file)."""

    def __init__(
        self, catalog: ControlCatalog, db: Db, gc: GcRunner, access: Access,
        getattr: Callable[[int], Awaitable[Inode]], stage: Callable[[int], Awaitable[None]],
        scrub: ScrubRunner | None = None,
        drill: DrillRunner | None = None,
    ) -> None:
        self.catalog = catalog
        self.db = db
        self.gc = gc
        self.access = access
        self._getattr = getattr
        self._stage = stage
        # The gc pass each directory last asked for (``user.ckptfs.gc``): set returns at
        # once, a getxattr of the same name waits for the pass (no kernel lock held).
        self._gc_tickets: dict[int, int] = {}
        self._scrub = scrub
        self._scrub_ticket = 0  # the last pass asked for through ``user.ckptfs.scrub``
        self.drill = drill
        # The drill each (inode, process) last asked for: root asks for every run on the
        # mount's root, and two commands at once must each get their own report.
        self._drill_tickets: dict[tuple[int, int], int] = {}

    async def _checkpoint_of(self, ino: int) -> CheckpointRow | None:
        path = await self.db(self.catalog.path_of, ino)
        rows = [c for c in await self.db(self.catalog.checkpoint_rows, path) if c.root == path]
        return rows[0] if rows else None

    async def get(self, ino: int, name: bytes, ctx: RequestContext) -> bytes | None:
        """``user.ckptfs.state`` (writing, committed, partial, ...) and
        ``user.ckptfs.checkpoint`` (the whole record, JSON) on a checkpoint's root, the
        listing's pages, the report of a gc pass. None: no such attribute."""
        if name == XATTR_GC:
            return await self._gc_done(ino, ctx)
        if name == XATTR_SCRUB:
            return await self._scrub_done(ino, ctx)
        if name == XATTR_DRILL:
            return await self._drill_done(ino, ctx)
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

    async def names(self, ino: int) -> list[bytes]:
        """The names listed: the state and record of a checkpoint's root."""
        return list(XATTRS) if await self._checkpoint_of(ino) is not None else []

    async def set(self, ino: int, name: bytes, value: bytes, caller: RequestContext) -> None:
        """Control xattrs (vfs/control.py), for the inode's owner or root only:
        ``user.ckptfs.tag`` = TAG adds a tag (e.g. milestone) to a checkpoint;
        ``user.ckptfs.gc`` (any value) asks for retention of the checkpoints under this
        directory now; a getxattr of it returns once that pass is done (``ckptfs gc PATH``);
        ``user.ckptfs.prefetch`` stages a file's chunks on the local tiers."""
        if not is_control(name):
            raise NotPermitted(f"{name.decode(errors='replace')} is reserved for ckptfs")
        if name == XATTR_SCRUB:
            await self._scrub_now(ino, caller)
            return
        check_control(await self._getattr(ino), name, caller)
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
        if name == XATTR_DRILL:
            await self._drill_request(ino, value, caller)
            return
        if name == XATTR_PREFETCH:
            await self._stage(ino)
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

    async def _drill_request(self, ino: int, value: bytes, caller: RequestContext) -> None:
        """``user.ckptfs.drill`` (``ckptfs drill RUN_DIR``): a drill is asked, not waited
        for (the kernel holds the inode locked for the whole setxattr); a getxattr of it
        waits for the report."""
        if self.drill is None:
            raise NotSupported("restore drills are not served by this daemon")
        ticket = await self.drill.request(ino, (caller.uid, caller.gid), caller.pid, value)
        if len(self._drill_tickets) >= DRILL_TICKETS_KEPT:  # the oldest served go first
            served = [k for k, t in sorted(self._drill_tickets.items(), key=lambda kt: kt[1])
                      if self.drill.served_ticket(t)]
            for k in served[:len(served) // 2 + 1]:
                del self._drill_tickets[k]
        self._drill_tickets[(ino, caller.pid)] = ticket

    async def _drill_done(self, ino: int, ctx: RequestContext) -> bytes:
        """``getxattr user.ckptfs.drill``: the report (JSON) of the drill the last setxattr
        of it on this inode by this process asked for, once it has run ({} if none)."""
        ticket = self._drill_tickets.get((ino, ctx.pid))
        if ticket is None or self.drill is None:
            return b"{}"
        return await self.drill.wait(ticket)

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

    async def _scrub_now(self, ino: int, caller: RequestContext) -> None:
        """``setxattr user.ckptfs.scrub`` on the mount's root, by root: a scrub pass of
        every copy this node scrubs, asked for (not waited for: the kernel holds the root's
        inode locked for the whole setxattr); a getxattr of it waits for the pass."""
        if caller.uid != 0:
            raise NotPermitted(f"{XATTR_SCRUB.decode()}: only root may ask for a scrub; "
                               f"uid {caller.uid} may not")
        if ino != ROOT_INODE:
            raise InvalidArgument(f"{XATTR_SCRUB.decode()}: set it on the mount's root")
        if self._scrub is None:
            raise NotSupported("this daemon runs no scrubber")
        await self.db(self.catalog.audit_append, AuditRecord(
            "scrub_request", "/", caller.uid, caller.pid))
        self._scrub_ticket = self._scrub.request()

    async def _scrub_done(self, ino: int, caller: RequestContext) -> bytes | None:
        """``getxattr user.ckptfs.scrub`` on the root: the report (JSON) of the pass the
        last setxattr asked for, once it is done ({} if none was asked for)."""
        if ino != ROOT_INODE or self._scrub is None:
            return None
        if caller.uid != 0:
            raise NotPermitted(f"{XATTR_SCRUB.decode()}: root only")
        if not self._scrub_ticket:
            return b"{}"
        report = await self._scrub.wait(self._scrub_ticket)
        return json.dumps(report, sort_keys=True, default=str).encode()
