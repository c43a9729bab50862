"""The thin pyfuse3 adapter: converts types, maps CkptfsError to FUSEError(errno).

No logic lives here. Any other exception escaping a handler is a bug: it is logged with its
traceback and the caller gets EIO (pyfuse3 would otherwise stop the whole filesystem: no
user may stop the daemon, docs/concurrency.md).
"""

from __future__ import annotations

import errno
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import pyfuse3
import trio

from ..catalog import Inode
from ..codec.frame import Buffer
from ..errors import CkptfsError
from ..metrics.requests import APP, count_op_error, op_observer
from ..supervise import inject
from ..vfs.context import RequestContext, read_groups
from ..vfs.filesystem import Filesystem, uses_direct_io

log = logging.getLogger("ckptfs.fuse")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

# The kernel may cache names and attributes this long. Every change goes through this
# kernel, which updates its caches itself (the daemon's own deletions, by retention,
# invalidate the names: Filesystem.invalidate_entry). Names are kept longer: a rotation
# that lists a directory and then renames or deletes its files needs no LOOKUP per file.
# Attributes stay short: a write invalidates the size and times in the kernel anyway.
ENTRY_TIMEOUT = 10.0
ATTR_TIMEOUT = 1.0
# A shared catalog (several nodes, docs/multinode.md): another node's change reaches this
# kernel only when its caches expire, so names are kept no longer than attributes.
SHARED_ENTRY_TIMEOUT = 1.0


@dataclass(frozen=True)
class Timeouts:
    """How long the kernel may cache a name (entry) and attributes (attr), in seconds."""

    entry: float = ENTRY_TIMEOUT
    attr: float = ATTR_TIMEOUT


SINGLE_NODE = Timeouts()
SHARED = Timeouts(SHARED_ENTRY_TIMEOUT, ATTR_TIMEOUT)


def boundary(fn: F) -> F:
    # Every request is timed as the application waits for it (ckptfs_fuse_op_seconds).
    op = fn.__name__
    observe = op_observer(op)
    fault = "fuse." + op

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            inject(fault)  # tests only (supervise.py)
            return await fn(*args, **kwargs)
        except pyfuse3.FUSEError as exc:
            count_op_error(op, errno.errorcode.get(exc.errno, str(exc.errno)))
            raise
        except CkptfsError as exc:
            if exc.errno not in (errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.ENODATA):
                log.debug("%s -> %s: %s", fn.__name__, errno.errorcode.get(exc.errno), exc)
            count_op_error(op, errno.errorcode.get(exc.errno, str(exc.errno)))
            raise pyfuse3.FUSEError(exc.errno) from None
        except ExceptionGroup as group:
            # A nursery's errors: if every one is ours, answer with the first one's errno.
            if group.split(CkptfsError)[1] is not None:
                log.exception("unexpected error in %s", fn.__name__)
                count_op_error(op, "EIO")
                raise pyfuse3.FUSEError(errno.EIO) from None
            first: BaseException = group
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            code = first.errno if isinstance(first, CkptfsError) else errno.EIO
            count_op_error(op, errno.errorcode.get(code, str(code)))
            raise pyfuse3.FUSEError(code) from None
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            count_op_error(op, "EIO")
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            observe(time.perf_counter() - started)

    return cast(F, wrapper)


async def context(ctx: Any, groups: bool = False) -> RequestContext:
    """The caller of a request. ``groups``: also its supplementary groups (a read of
    /proc/PID/status; only requests that decide by group membership ask, never for root)."""
    uid, gid, pid = int(ctx.uid), int(ctx.gid), int(ctx.pid)
    found: tuple[int, ...] = ()
    if groups and uid != 0 and pid > 0:
        found = await trio.to_thread.run_sync(read_groups, pid)
    return RequestContext(uid=uid, gid=gid, pid=pid, groups=found)


def entry(inode: Inode, timeouts: Timeouts = SINGLE_NODE) -> pyfuse3.EntryAttributes:
    e = pyfuse3.EntryAttributes()
    e.st_ino = pyfuse3.InodeT(inode.ino)
    e.generation = 0
    e.entry_timeout = timeouts.entry
    e.attr_timeout = timeouts.attr
    e.st_mode = pyfuse3.ModeT(inode.mode)
    e.st_nlink = inode.nlink
    e.st_uid = inode.uid
    e.st_gid = inode.gid
    e.st_rdev = inode.rdev
    e.st_size = inode.size
    e.st_blksize = 1 << 20
    e.st_blocks = (inode.size + 511) // 512
    e.st_atime_ns = inode.atime_ns
    e.st_mtime_ns = inode.mtime_ns
    e.st_ctime_ns = inode.ctime_ns
    return e


class FuseOps(pyfuse3.Operations):
    supports_dot_lookup = False
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, fs: Filesystem, timeouts: Timeouts = SINGLE_NODE) -> None:
        super().__init__()
        self.fs = fs
        self.timeouts = timeouts
        # Names inside a namespace: the kernel asks again at every path walk (its dentry
        # cache is shared by all users; vfs/access.py checks the caller at each LOOKUP).
        self.guarded = Timeouts(0.0, timeouts.attr)

    def _entry(self, inode: Inode, parent: int) -> pyfuse3.EntryAttributes:
        return entry(inode, self.guarded if self.fs.access.guarded(parent) else self.timeouts)

    @boundary
    async def lookup(self, parent_inode: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        inode = await self.fs.lookup(parent_inode, name, await context(ctx))
        return self._entry(inode, parent_inode)

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        return None  # inodes are dropped by link and handle counts, not lookup counts

    @boundary
    async def getattr(self, inode: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return entry(await self.fs.getattr(inode, await context(ctx)), self.timeouts)

    @boundary
    async def setattr(
        self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields, fh: Any, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        # Group membership decides chown, setgid and (times) write permission.
        who = await context(ctx, groups=bool(fields.update_gid or fields.update_mode
                                             or fields.update_atime or fields.update_mtime))
        return entry(
            await self.fs.setattr(
                inode,
                size=attr.st_size if fields.update_size else None,
                mode=attr.st_mode if fields.update_mode else None,
                uid=attr.st_uid if fields.update_uid else None,
                gid=attr.st_gid if fields.update_gid else None,
                atime_ns=attr.st_atime_ns if fields.update_atime else None,
                mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
                ctx=who,
            )
        , self.timeouts)

    @boundary
    async def readlink(self, inode: int, ctx: Any) -> bytes:
        return await self.fs.readlink(inode, await context(ctx))

    @boundary
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Any) -> pyfuse3.EntryAttributes:
        who = await context(ctx, groups=bool(mode & 0o2000))
        return self._entry(await self.fs.mknod(parent_inode, name, mode & ~ctx.umask, rdev, who),
                           parent_inode)

    @boundary
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> pyfuse3.EntryAttributes:
        return self._entry(await self.fs.mkdir(parent_inode, name, mode & ~ctx.umask,
                                               await context(ctx)), parent_inode)

    @boundary
    async def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.unlink(parent_inode, name, await context(ctx))

    @boundary
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.rmdir(parent_inode, name, await context(ctx))

    @boundary
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        return self._entry(await self.fs.symlink(parent_inode, name, target, await context(ctx)),
                           parent_inode)

    @boundary
    async def rename(
        self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes, flags: int, ctx: Any
    ) -> None:
        await self.fs.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags,
                             await context(ctx))

    @boundary
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Any) -> pyfuse3.EntryAttributes:
        return self._entry(await self.fs.link(inode, new_parent_inode, new_name, await context(ctx)),
                           new_parent_inode)

    @boundary
    async def open(self, inode: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        fh = await self.fs.open(inode, flags, await context(ctx))
        # The kernel page cache stays valid across opens: every change to a file goes
        # through this kernel (direct-I/O writes invalidate it at commit), so it can serve
        # repeat reads (warm restore) by itself; with a shared catalog, unless another node
        # committed a new version since this kernel cached it (close-to-open).
        return pyfuse3.FileInfo(fh=fh, keep_cache=self.fs.keep_cache(fh),
                                direct_io=uses_direct_io(flags))

    @boundary
    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        who = await context(ctx, groups=bool(mode & 0o2000))
        fh, inode = await self.fs.create(parent_inode, name, mode & ~ctx.umask, flags, who)
        info = pyfuse3.FileInfo(fh=fh, keep_cache=True, direct_io=uses_direct_io(flags))
        return info, self._entry(inode, parent_inode)

    @boundary
    async def read(self, fh: int, off: int, size: int) -> Buffer:  # type: ignore[override]
        # Any contiguous buffer (pyfuse3 replies via PyObject_GetBuffer; its stub says
        # bytes): a view into the verified chunk, no copy on the trio thread.
        data = await self.fs.read(fh, off, size)
        APP.read += len(data)
        return data

    @boundary
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        n = await self.fs.write(fh, off, buf)
        APP.written += n
        return n

    @boundary
    async def flush(self, fh: int) -> None:
        await self.fs.flush(fh)

    @boundary
    async def release(self, fh: int) -> None:
        await self.fs.release(fh)

    @boundary
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.fs.fsync(fh)

    @boundary
    async def opendir(self, inode: int, ctx: Any) -> int:
        await self.fs.opendir(inode, await context(ctx))
        return inode

    @boundary
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        after = start_id
        while True:
            batch = await self.fs.readdir(fh, after)
            if not batch:
                return
            for dentry_id, name, inode in batch:
                if not pyfuse3.readdir_reply(token, name, self._entry(inode, fh), dentry_id):
                    return
                after = dentry_id

    @boundary
    async def releasedir(self, fh: int) -> None:
        return None

    @boundary
    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        await self.fs.fsyncdir()

    @boundary
    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        s = await self.fs.statfs()
        out = pyfuse3.StatvfsData()
        out.f_bsize = s.block_size
        out.f_frsize = s.block_size
        out.f_blocks = s.blocks
        out.f_bfree = s.blocks_free
        out.f_bavail = s.blocks_avail
        out.f_files = s.files
        out.f_ffree = s.files_free
        out.f_favail = s.files_free
        out.f_namemax = s.name_max
        return out

    # Extended attributes: stored ones, and ckptfs's own (``user.ckptfs.*``). pyfuse3 turns
    # XATTR_CREATE / XATTR_REPLACE into a getxattr first and answers ERANGE itself.
    @boundary
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Any) -> None:
        await self.fs.setxattr(inode, name, value, await context(ctx, groups=True))

    @boundary
    async def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
        value = await self.fs.getxattr(inode, name, await context(ctx))
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @boundary
    async def listxattr(self, inode: int, ctx: Any) -> list[bytes]:
        return await self.fs.listxattr(inode, await context(ctx))

    @boundary
    async def removexattr(self, inode: int, name: bytes, ctx: Any) -> None:
        await self.fs.removexattr(inode, name, await context(ctx, groups=True))
