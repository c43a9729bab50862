"""The setuid/setgid rules, as Linux applies them: what chmod, chown and utimens may do
(and which bits they clear), the setgid bit of a file created in a setgid directory, and
the bits a write by a non-root caller clears; and the sticky directory's rule on who may
remove or replace an entry.

The filesystem asks these at each change of a mode; the kernel (default_permissions)
checks access before asking, and clears the bits itself for cached writes, not for direct
I/O ones, nor for a truncate or chown it forwards.
"""

from __future__ import annotations

import stat
from collections.abc import Awaitable, Callable, Sequence

from ..catalog import Inode
from ..catalog.protocols import NamespaceCatalog
from ..errors import CkptfsError, NotPermitted, PermissionDenied
from .context import RequestContext

SETID = stat.S_ISUID | stat.S_ISGID


def owner_rules(
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


def written_mode(mode: int) -> int:
    """The mode after a write by a non-root caller: setuid cleared, and setgid with group
    execute (as Linux)."""
    mode &= ~stat.S_ISUID
    if mode & stat.S_IXGRP:
        mode &= ~stat.S_ISGID
    return mode


class SetidRules:
    """The rules that need the filesystem: ``getattr`` reads an inode's attributes (as
    the filesystem answers them), ``chmod`` stores a new mode (its setattr)."""

    def __init__(self, getattr: Callable[[int], Awaitable[Inode]],
                 chmod: Callable[[int, int], Awaitable[object]]) -> None:
        self._getattr = getattr
        self._chmod = chmod

    async def new_mode(self, parent: int, mode: int, ctx: RequestContext) -> int:
        """A non-member creating a setgid file in a setgid directory (whose group it gets)
        loses the setgid bit, as on Linux."""
        if not mode & stat.S_ISGID or stat.S_ISDIR(mode) or ctx.is_root:
            return mode
        pdir = await self._getattr(parent)
        if not ctx.in_group(pdir.gid if pdir.mode & stat.S_ISGID else ctx.gid):
            mode &= ~stat.S_ISGID
        return mode

    async def written(self, ino: int, mode: int) -> None:
        """A write by a non-root caller clears setuid, and setgid with group execute (as
        Linux; the kernel does it for cached writes, not for direct I/O ones)."""
        new = written_mode(mode)
        if new != mode:
            await self._chmod(ino, new)


def check_sticky(
    catalog: NamespaceCatalog, parent: int, names: Sequence[bytes], ctx: RequestContext
) -> None:
    """In a sticky directory only root, the directory's owner and an entry's owner may
    remove or rename (or replace) that entry: EPERM. Runs in the catalog thread."""
    if ctx.is_root:
        return
    pdir = catalog.get_inode(parent)
    if not pdir.mode & stat.S_ISVTX or pdir.uid == ctx.uid:
        return
    for name in names:
        try:
            inode = catalog.lookup(parent, name)
        except CkptfsError:
            continue  # the operation itself reports a missing name
        if inode.uid != ctx.uid:
            raise NotPermitted("sticky directory: not the owner of the entry or the directory")
