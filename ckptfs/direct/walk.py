"""Path resolution for the direct path, with the checks the kernel makes for a FUSE
mount (``default_permissions``): the kernel checks mode bits before it asks the daemon,
so a request that does not come through the kernel checks them here. Namespace access,
setid and quotas stay the Filesystem's (the same code as a FUSE request's)."""

from __future__ import annotations

import errno
import os
import stat
from typing import Protocol

from ..catalog import Inode
from ..errors import CkptfsError, InvalidArgument, NotADirectory, PermissionDenied
from ..vfs.context import RequestContext

ROOT_INO = 1  # pyfuse3.ROOT_INODE
R, W, X = 4, 2, 1


class Lookups(Protocol):
    async def getattr(self, ino: int, ctx: RequestContext = ...) -> Inode: ...

    async def lookup(self, parent: int, name: bytes, ctx: RequestContext = ...) -> Inode: ...


def allowed(ctx: RequestContext, inode: Inode, want: int) -> bool:
    """generic_permission(): the class of the caller (owner, group, other) decides; root
    passes, except execute of a file no one may execute."""
    if ctx.is_root:
        return not (want & X) or inode.is_dir or bool(inode.mode & 0o111)
    if ctx.uid == inode.uid:
        bits = (inode.mode >> 6) & 7
    elif ctx.in_group(inode.gid):
        bits = (inode.mode >> 3) & 7
    else:
        bits = inode.mode & 7
    return bits & want == want


def check(ctx: RequestContext, inode: Inode, want: int, path: str) -> None:
    if not allowed(ctx, inode, want):
        raise PermissionDenied(f"{path}: uid {ctx.uid} may not access it")


def split(path: bytes) -> list[bytes]:
    """The names of a path relative to the mount root; no '..' (a client names files
    inside the mount, and the kernel's walk is not ours to redo)."""
    names = [n for n in path.split(b"/") if n and n != b"."]
    if b".." in names:
        raise InvalidArgument("'..' in a direct path")
    return names


async def walk_dir(fs: Lookups, ctx: RequestContext, names: list[bytes]) -> Inode:
    """The directory named by ``names``, searched (x) at every step like the kernel's walk.
    Symbolic links are not followed (ELOOP): the client resolves them before it asks."""
    inode = await fs.getattr(ROOT_INO, ctx)
    for i, name in enumerate(names):
        shown = os.fsdecode(b"/".join(names[: i + 1]))
        if not inode.is_dir:
            raise NotADirectory(shown)
        check(ctx, inode, X, shown)
        inode = await fs.lookup(inode.ino, name, ctx)
        if stat.S_ISLNK(inode.mode):
            raise CkptfsError(f"{shown}: a symbolic link (the direct path does not follow)",
                              errno=errno.ELOOP)
    if not inode.is_dir:
        raise NotADirectory(os.fsdecode(b"/".join(names)))
    return inode


def open_access(flags: int) -> int:
    acc = flags & os.O_ACCMODE
    return {os.O_RDONLY: R, os.O_WRONLY: W}.get(acc, R | W)
