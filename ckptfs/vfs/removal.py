"""Retention's delete of a checkpoint by its path (checkpoints/janitor.py): a file, or a
directory tree read in readdir's pages, removed through the Filesystem's own unlink and
rmdir (so every cache and checkpoint event follows as for a caller's), and the kernel
told to forget each name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

from ..catalog import Inode
from ..catalog.catalog import ROOT_INODE
from ..errors import InvalidArgument
from .context import RequestContext


class Namespace(Protocol):
    """The Filesystem's operations a removal uses (as root)."""

    async def lookup(self, parent: int, name: bytes, ctx: RequestContext = ...) -> Inode: ...

    async def readdir(self, ino: int, after_id: int) -> list[tuple[int, bytes, Inode]]: ...

    async def rmdir(self, parent: int, name: bytes, ctx: RequestContext = ...) -> None: ...

    async def unlink(self, parent: int, name: bytes, ctx: RequestContext = ...) -> None: ...


class TreeRemoval:
    """``invalidate_entry``: tells the kernel to forget a name (None: no kernel)."""

    def __init__(
        self, fs: Namespace, invalidate_entry: Callable[[int, bytes], None] | None
    ) -> None:
        self.fs = fs
        self.invalidate_entry = invalidate_entry

    async def remove_tree(self, path: str) -> None:
        """Delete a file or a directory tree by its path inside the mount (retention), as
        unlink and rmdir would, and tell the kernel to forget the names."""
        parts = [p.encode(errors="surrogateescape") for p in path.split("/") if p]
        if not parts:
            raise InvalidArgument("refusing to delete the root")
        parent = ROOT_INODE
        for name in parts[:-1]:
            parent = (await self.fs.lookup(parent, name)).ino
        await self._remove(parent, parts[-1])

    async def _remove(self, parent: int, name: bytes) -> None:
        inode = await self.fs.lookup(parent, name)
        if inode.is_dir:
            after = 0
            while True:
                batch = await self.fs.readdir(inode.ino, after)
                if not batch:
                    break
                for _, child, _ in batch:
                    await self._remove(inode.ino, child)
                after = batch[-1][0]
            await self.fs.rmdir(parent, name)
        else:
            await self.fs.unlink(parent, name)
        if self.invalidate_entry is not None:
            await trio.to_thread.run_sync(self.invalidate_entry, parent, name)
