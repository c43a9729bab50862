#!/usr/bin/env python3
"""nullfs: the smallest useful pyfuse3 + trio filesystem, used as a benchmark ceiling.

It keeps a tree of directories and files in memory but stores no data: ``write`` only
records the new file size, ``read`` returns zeros up to that size. Whatever ckptfs does on
top of the FUSE round trip (copying, hashing, writing chunks, the catalog) shows up as the
gap between nullfs and ckptfs in ``scripts/bench.py``; the gap between nullfs and a plain
directory is the price of a Python FUSE daemon itself.

Run in the foreground until unmounted (``fusermount3 -u MOUNTPOINT``) or interrupted::

    python scripts/nullfs.py MOUNTPOINT [--debug] [--read-ahead-kb N]

Like ckptfs (mount.py, ``tune_read_ahead``) it raises the kernel read-ahead of its mount to
8 MiB (root only; ``--read-ahead-kb 0`` keeps the kernel's 128 KiB), so sequential reads
arrive as 1 MiB requests, as they do at ckptfs: the ceiling is measured on the same
request sizes. Replies are views of one buffer of zeros (no copy), as ckptfs replies with
views of its verified chunks.

Importable too: ``NullFS`` is the ``pyfuse3.Operations`` subclass, ``serve(mountpoint)``
mounts it and runs the trio loop until the filesystem is unmounted.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import signal
import stat
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyfuse3
import trio

log = logging.getLogger("nullfs")

# The kernel never asks for more than max_pages (256 x 4 KiB) per read; keep one buffer of
# zeros and hand out slices of it.
_ZEROS = memoryview(bytes(4 * 1024 * 1024))
READ_AHEAD_KB = 8192  # what ckptfs sets (ckptfs/mount.py)


@dataclass
class Node:
    inode: int
    mode: int
    parent: int
    size: int = 0
    nlink: int = 1
    atime_ns: int = field(default_factory=time.time_ns)
    mtime_ns: int = field(default_factory=time.time_ns)
    ctime_ns: int = field(default_factory=time.time_ns)
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    children: dict[bytes, int] = field(default_factory=dict)  # directories only
    lookups: int = 0
    unlinked: bool = False

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


class NullFS(pyfuse3.Operations):
    """In-memory namespace, no data: writes are discarded, reads return zeros."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, cached_writes: bool = False) -> None:
        super().__init__()
        # Write-only handles bypass the page cache as ckptfs's do (vfs/handles.py
        # uses_direct_io): the ceiling is then measured on the requests ckptfs gets. A 1 MiB
        # write from a buffer that is not page-aligned (a tensor's storage) arrives as two
        # requests that way; through the page cache it would be one.
        self.cached_writes = cached_writes
        root = Node(pyfuse3.ROOT_INODE, stat.S_IFDIR | 0o755, pyfuse3.ROOT_INODE, nlink=2)
        self.nodes: dict[int, Node] = {root.inode: root}
        self._next_inode = pyfuse3.ROOT_INODE + 1
        self._open_count: dict[int, int] = {}

    # -- helpers -------------------------------------------------------------------------

    def _node(self, inode: int) -> Node:
        try:
            return self.nodes[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _attr(self, node: Node) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.inode
        a.generation = 0
        a.entry_timeout = 300
        a.attr_timeout = 300
        a.st_mode = node.mode
        a.st_nlink = node.nlink
        a.st_uid = node.uid
        a.st_gid = node.gid
        a.st_rdev = 0
        a.st_size = node.size
        a.st_blksize = 128 * 1024
        a.st_blocks = (node.size + 511) // 512
        a.st_atime_ns = node.atime_ns
        a.st_mtime_ns = node.mtime_ns
        a.st_ctime_ns = node.ctime_ns
        return a

    def _new_node(self, parent: Node, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> Node:
        if not parent.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if name in parent.children:
            raise pyfuse3.FUSEError(errno.EEXIST)
        node = Node(self._next_inode, mode, parent.inode, uid=ctx.uid, gid=ctx.gid)
        self._next_inode += 1
        if node.is_dir:
            node.nlink = 2
            parent.nlink += 1
        self.nodes[node.inode] = node
        parent.children[name] = node.inode
        parent.mtime_ns = parent.ctime_ns = time.time_ns()
        node.lookups += 1
        return node

    def _maybe_drop(self, node: Node) -> None:
        if node.unlinked and node.lookups <= 0 and not self._open_count.get(node.inode):
            self.nodes.pop(node.inode, None)

    # -- namespace -----------------------------------------------------------------------

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        parent = self._node(parent_inode)
        if name == b".":
            node = parent
        elif name == b"..":
            node = self._node(parent.parent)
        else:
            inode = parent.children.get(name)
            if inode is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            node = self.nodes[inode]
        node.lookups += 1
        return self._attr(node)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, nlookup in inode_list:
            node = self.nodes.get(inode)
            if node is not None and inode != pyfuse3.ROOT_INODE:
                node.lookups -= nlookup
                self._maybe_drop(node)

    async def getattr(
        self, inode: int, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        return self._attr(self._node(inode))

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        node = self._node(inode)
        now = time.time_ns()
        if fields.update_size:
            if node.is_dir:
                raise pyfuse3.FUSEError(errno.EISDIR)
            node.size = attr.st_size
            node.mtime_ns = now
        if fields.update_mode:
            node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(attr.st_mode)
        if fields.update_uid:
            node.uid = attr.st_uid
        if fields.update_gid:
            node.gid = attr.st_gid
        if fields.update_atime:
            node.atime_ns = attr.st_atime_ns
        if fields.update_mtime:
            node.mtime_ns = attr.st_mtime_ns
        node.ctime_ns = now
        return self._attr(node)

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        node = self._new_node(self._node(parent_inode), name, stat.S_IFDIR | (mode & 0o7777), ctx)
        return self._attr(node)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        parent = self._node(parent_inode)
        inode = parent.children.get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        node = self.nodes[inode]
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        del parent.children[name]
        node.unlinked = True
        node.nlink = 0
        self._maybe_drop(node)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        parent = self._node(parent_inode)
        inode = parent.children.get(name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        node = self.nodes[inode]
        if not node.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        if node.children:
            raise pyfuse3.FUSEError(errno.ENOTEMPTY)
        del parent.children[name]
        parent.nlink -= 1
        node.unlinked = True
        node.nlink = 0
        self._maybe_drop(node)

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        old_parent = self._node(parent_inode_old)
        new_parent = self._node(parent_inode_new)
        inode = old_parent.children.get(name_old)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        target = new_parent.children.get(name_new)
        if target is not None:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise pyfuse3.FUSEError(errno.EEXIST)
            tnode = self.nodes[target]
            if tnode.is_dir and tnode.children:
                raise pyfuse3.FUSEError(errno.ENOTEMPTY)
            tnode.unlinked = True
            tnode.nlink = 0
            self._maybe_drop(tnode)
        del old_parent.children[name_old]
        new_parent.children[name_new] = inode
        node = self.nodes[inode]
        if node.is_dir and old_parent is not new_parent:
            old_parent.nlink -= 1
            new_parent.nlink += 1
        node.parent = new_parent.inode

    # -- directories ---------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if not self._node(inode).is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        node = self._node(fh)
        # Entries are numbered by position; start_id is the number of entries already sent.
        entries = sorted(node.children.items())
        for i, (name, inode) in enumerate(entries[start_id:], start=start_id):
            child = self.nodes[inode]
            if not pyfuse3.readdir_reply(token, name, self._attr(child), i + 1):
                break
            child.lookups += 1

    async def releasedir(self, fh: int) -> None:
        return None

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        return None

    # -- files ---------------------------------------------------------------------------

    async def create(
        self,
        parent_inode: int,
        name: bytes,
        mode: int,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        node = self._new_node(self._node(parent_inode), name, stat.S_IFREG | (mode & 0o7777), ctx)
        self._open_count[node.inode] = self._open_count.get(node.inode, 0) + 1
        return pyfuse3.FileInfo(fh=node.inode, direct_io=self._direct_io(flags)), self._attr(node)

    def _direct_io(self, flags: int) -> bool:
        if self.cached_writes:
            return False
        return bool(flags & os.O_DIRECT) or (flags & os.O_ACCMODE) == os.O_WRONLY

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        node = self._node(inode)
        if node.is_dir:
            raise pyfuse3.FUSEError(errno.EISDIR)
        if flags & os.O_TRUNC:
            node.size = 0
        self._open_count[inode] = self._open_count.get(inode, 0) + 1
        # keep_cache: data never changes behind the kernel's back, like committed ckptfs files.
        return pyfuse3.FileInfo(fh=inode, keep_cache=True, direct_io=self._direct_io(flags))

    async def read(self, fh: int, off: int, size: int) -> bytes:
        node = self._node(fh)
        n = max(0, min(size, node.size - off))
        if n <= len(_ZEROS):
            return _ZEROS[:n]  # type: ignore[return-value]  # pyfuse3 takes any buffer
        return bytes(n)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        node = self._node(fh)
        end = off + len(buf)
        if end > node.size:
            node.size = end
        return len(buf)

    async def flush(self, fh: int) -> None:
        return None

    async def fsync(self, fh: int, datasync: bool) -> None:
        return None

    async def release(self, fh: int) -> None:
        left = self._open_count.get(fh, 0) - 1
        if left > 0:
            self._open_count[fh] = left
        else:
            self._open_count.pop(fh, None)
            node = self.nodes.get(fh)
            if node is not None:
                self._maybe_drop(node)

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_blocks = s.f_bfree = s.f_bavail = 1 << 40
        s.f_files = s.f_ffree = s.f_favail = 1 << 32
        s.f_namemax = 255
        return s


def _unescape(field_: str) -> str:
    """A mountinfo path field: octal escapes (\\040 for a space) back to characters."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field_)


def tune_read_ahead(real: str, kb: int) -> None:
    """Set the read-ahead of our mount at ``real`` (its path resolved before the mount: a
    stat of our own mountpoint here would wait for the loop that serves it), as ckptfs
    does; best effort."""
    try:
        with open("/proc/self/mountinfo") as f:
            devs = [ln.split()[2] for ln in f if _unescape(ln.split()[4]) == real]
        if devs:
            with open(f"/sys/class/bdi/{devs[-1]}/read_ahead_kb", "w") as f:
                f.write(f"{kb}\n")
    except OSError as exc:
        log.info("could not set read-ahead for %s: %s", real, exc.strerror)


def serve(
    mountpoint: str, debug: bool = False, fsname: str = "nullfs",
    read_ahead_kb: int = READ_AHEAD_KB, cached_writes: bool = False,
) -> None:
    """Mount NullFS at ``mountpoint`` and serve requests until it is unmounted."""
    ops = NullFS(cached_writes)
    real = os.path.realpath(mountpoint)
    options = set(pyfuse3.default_options)
    options.add(f"fsname={fsname}")
    if debug:
        options.add("debug")
    pyfuse3.init(ops, mountpoint, options)

    async def main() -> None:
        # SIGTERM/SIGINT end the loop; pyfuse3.close() then unmounts.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    async for _ in signals:
                        pyfuse3.terminate()
                        return

                async def tune() -> None:
                    # After INIT (a statvfs of the mount waits for it), as ckptfs does.
                    await trio.to_thread.run_sync(os.statvfs, mountpoint)
                    tune_read_ahead(real, read_ahead_kb)

                nursery.start_soon(watch)
                if read_ahead_kb > 0:
                    nursery.start_soon(tune)
                await pyfuse3.main()
                nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    finally:
        pyfuse3.close(unmount=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mountpoint")
    p.add_argument("--debug", action="store_true", help="log every FUSE request (slow)")
    p.add_argument("--read-ahead-kb", type=int, default=READ_AHEAD_KB,
                   help="kernel read-ahead of the mount, as ckptfs sets it (0: the kernel's)")
    p.add_argument("--cached-writes", action="store_true",
                   help="write-only handles through the page cache (before 2026-12-08: "
                        "ckptfs gives them direct_io, and so does nullfs by default)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO)
    if not os.path.isdir(args.mountpoint):
        print(f"nullfs: {args.mountpoint}: not a directory", file=sys.stderr)
        return 2
    serve(args.mountpoint, debug=args.debug, read_ahead_kb=args.read_ahead_kb,
          cached_writes=args.cached_writes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
