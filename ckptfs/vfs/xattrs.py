"""Stored extended attributes (``user.*``, ``trusted.*``, ``security.*``): catalog rows
of their inode, checked as Linux checks them. ckptfs's own ``user.ckptfs.*`` names are
never stored: vfs/control.py answers them."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Awaitable, Callable, Mapping

from ..catalog import Inode
from ..catalog.protocols import NamespaceCatalog
from ..errors import CkptfsError, NoAttribute, NotPermitted, NotSupported, PermissionDenied
from .context import RequestContext
from .openfile import OpenFile
from .openrows import Db

XATTR_STORED_PREFIXES = (b"user.", b"trusted.", b"security.")
XATTR_NAME_MAX = 255  # as Linux: longer names give ERANGE
XATTR_SIZE_MAX = 65536  # as Linux: larger values give E2BIG
# The names and values of one inode's stored xattrs together: room for a value of the
# largest size and as much again; past it ENOSPC, as ext4 when an inode's xattr space is
# full. Every one is a catalog row, read back whole and carried by the catalog snapshot.
XATTR_TOTAL_MAX = 2 * XATTR_SIZE_MAX


class StoredXattrs:
    """``db``: a catalog call; ``db_dirs_changed``: one that changes an inode's row (its
    ctime); ``getattr``: an inode's attributes as the filesystem answers them;
    ``open_files``: whose open file takes the new ctime."""

    def __init__(
        self, catalog: NamespaceCatalog, db: Db, db_dirs_changed: Db,
        getattr: Callable[[int], Awaitable[Inode]], open_files: Mapping[int, OpenFile],
    ) -> None:
        self.catalog = catalog
        self.db = db
        self._db_dirs_changed = db_dirs_changed
        self.getattr = getattr
        self.open_files = open_files
        # Inodes with stored xattrs (loaded at first use): the kernel asks for
        # security.capability before buffered writes, and the answer for the others
        # must not cost a catalog round trip.
        self._xattr_inos: set[int] | None = None

    def forget(self, ino: int) -> None:
        """``ino`` was deleted (its rows with it)."""
        if self._xattr_inos is not None:
            self._xattr_inos.discard(ino)

    async def _xattr_index(self) -> set[int]:
        if self._xattr_inos is None:
            self._xattr_inos = await self.db(self.catalog.xattr_inodes)
        return self._xattr_inos

    async def get(self, ino: int, name: bytes) -> bytes | None:
        if ino not in await self._xattr_index():
            return None
        return await self.db(self.catalog.get_xattr, ino, name)

    async def names(self, ino: int, ctx: RequestContext) -> list[bytes]:
        names = []
        if ino in await self._xattr_index():
            # trusted.* is for root only (the kernel leaves the listing to us).
            names = [n for n in await self.db(self.catalog.list_xattrs, ino)
                     if ctx.is_root or not n.startswith(b"trusted.")]
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

    async def set(self, ino: int, name: bytes, value: bytes, ctx: RequestContext,
                  flags: int) -> None:
        await self._check_xattr_write(ino, name, ctx)
        if len(value) > XATTR_SIZE_MAX:
            raise CkptfsError(f"xattr value of {len(value)} bytes", errno=errno.E2BIG)
        inode = await self._db_dirs_changed(lambda: self.catalog.set_xattr(
            ino, name, value, create=bool(flags & os.XATTR_CREATE),
            replace_only=bool(flags & os.XATTR_REPLACE), total_max=XATTR_TOTAL_MAX))
        (await self._xattr_index()).add(ino)
        self._new_ctime(inode)

    async def remove(self, ino: int, name: bytes, ctx: RequestContext) -> None:
        await self._check_xattr_write(ino, name, ctx)
        if ino not in await self._xattr_index():
            raise NoAttribute(name.decode(errors="replace"))
        self._new_ctime(await self._db_dirs_changed(self.catalog.remove_xattr, ino, name))

    def _new_ctime(self, inode: Inode) -> None:
        f = self.open_files.get(inode.ino)
        if f is not None:
            f.ctime_ns = inode.ctime_ns
