"""One direct connection (docs/direct-path.md): its caller, its memfd, its handles, and
the request loop. Each request runs the Filesystem's own methods with the caller's
RequestContext; the bytes of a WRITE are copied out of the shared memory into a private
buffer in a worker thread before the VFS sees them (the integrity rule), and a READ's
verified bytes are copied into it the same way. The loop itself handles headers only."""

from __future__ import annotations

import array
import errno
import fcntl
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from .. import threads
from ..catalog import Inode
from ..codec.frame import HEADER_SIZE, Buffer
from ..codec.staged import Staged
from ..errors import AlreadyExists, CkptfsError, InvalidArgument, IsADirectory, NotFound
from ..vfs.context import RequestContext
from . import wire
from .walk import Lookups, W, X, check, open_access, split, walk_dir

log = logging.getLogger("ckptfs.direct")

PIECE = 1 << 20  # what is not whole chunks goes to the VFS's write in pieces of this size
READ_PARALLEL = 8  # chunks of one READ in flight at once
WRITE_PARALLEL = 4  # whole chunks of one WRITE copied out of the memfd at once
# Resource limits of one connection: no request of an unprivileged client may exhaust the
# daemon's descriptors or memory (a descriptor passed over the socket costs the sender
# nothing once it closes its own copy; a handle here costs no descriptor of the client).
MAX_FDS = 4  # descriptors received and not yet taken by a MAP; more are closed at once
MAX_HANDLES = 4096  # open handles of one connection (EMFILE beyond)


class DirectFs(Lookups, Protocol):
    """What a connection uses of the Filesystem (vfs/filesystem.py)."""

    chunk_size: int

    async def create(
        self, parent: int, name: bytes, mode: int, flags: int, ctx: RequestContext
    ) -> tuple[int, Inode]: ...

    async def open(self, ino: int, flags: int, ctx: RequestContext = ...) -> int: ...

    async def read(self, fh: int, off: int, size: int) -> Buffer: ...

    async def write(self, fh: int, off: int, data: bytes) -> int: ...

    async def write_chunk(
        self, fh: int, idx: int, fill: Callable[[Staged], Awaitable[None]]
    ) -> bool: ...

    async def flush(self, fh: int) -> None: ...

    async def fsync(self, fh: int) -> None: ...

    async def release(self, fh: int) -> None: ...


class Closed(Exception):
    """The peer closed the connection (or died)."""


class Connection:
    def __init__(
        self, sock: trio.socket.SocketType, fs: DirectFs, ctx: RequestContext, st_dev: int,
        io: trio.CapacityLimiter,
    ) -> None:
        self.sock, self.fs, self.ctx, self.st_dev, self.io = sock, fs, ctx, st_dev, io
        self.memfd: int | None = None
        self.memfd_size = 0
        # Open handles and their access mode (O_RDONLY, O_WRONLY, O_RDWR).
        self.handles: dict[int, int] = {}
        self._buf = bytearray()
        self._fds: list[int] = []  # descriptors received and not yet taken by a MAP
        self._ops: dict[int, Callable[[bytes], Awaitable[bytes]]] = {
            wire.HELLO: self._hello, wire.MAP: self._map, wire.OPEN: self._open,
            wire.CREATE: self._create, wire.WRITE: self._write, wire.READ: self._read,
            wire.FSYNC: self._fsync, wire.CLOSE: self._close, wire.STAT: self._stat,
        }

    async def serve(self) -> None:
        try:
            while True:
                try:
                    op, rid, body = await self._request()
                except Closed:
                    return
                status, err, out = 0, 0, b""
                try:
                    out = await self._dispatch(op, body)
                except CkptfsError as exc:
                    status, err = 1, exc.errno
                except OSError as exc:
                    status, err = 1, exc.errno or errno.EIO
                await self._send(wire.REPLY.pack(len(out), status, rid, err) + out)
        except OSError as exc:  # the peer vanished mid-reply
            log.debug("direct connection of pid %d ended: %s", self.ctx.pid, exc)
        finally:
            with trio.CancelScope(shield=True):
                await self._abandon()

    async def _dispatch(self, op: int, body: bytes) -> bytes:
        fn = self._ops.get(op)
        if fn is None:
            raise CkptfsError(f"unknown direct op {op}", errno=errno.ENOSYS)
        try:
            return await fn(body)
        except (CkptfsError, OSError):
            raise
        except Exception:  # a bug: that request's EIO, as in the FUSE adapter
            log.exception("direct request %d of pid %d failed", op, self.ctx.pid)
            raise CkptfsError("internal error", errno=errno.EIO) from None

    async def _abandon(self) -> None:
        """A client gone without CLOSE (killed mid-write): each handle is released with no
        commit. The OpenFile's last release drops its uncommitted chunks, as for a FUSE
        file whose last handle goes; nothing the client wrote since its last FSYNC or CLOSE
        becomes the file's content."""
        if self.handles:
            log.info("direct connection of pid %d ended: %d handle(s) released uncommitted",
                     self.ctx.pid, len(self.handles))
        for fh in sorted(self.handles):
            try:
                await self.fs.release(fh)
            except CkptfsError as exc:
                log.warning("direct handle %d of pid %d: release failed: %s",
                            fh, self.ctx.pid, exc)
        self.handles.clear()
        for fd in [*self._fds, *([self.memfd] if self.memfd is not None else [])]:
            os.close(fd)
        self._fds.clear()
        self.memfd = None

    # ------------------------------------------------------------------ framing

    async def _fill(self, n: int) -> None:
        while len(self._buf) < n:
            data, anc, _flags, _addr = await self.sock.recvmsg(
                max(n - len(self._buf), 4096), socket.CMSG_SPACE(4 * 4))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                    self._keep_fds(list(fds))
            if not data:
                raise Closed()
            self._buf += data

    def _keep_fds(self, fds: list[int]) -> None:
        """Keep descriptors for the next MAPs, up to MAX_FDS; close the rest now."""
        room = max(0, MAX_FDS - len(self._fds))
        self._fds.extend(fds[:room])
        for fd in fds[room:]:
            os.close(fd)

    async def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[await self.sock.send(view):]

    async def _request(self) -> tuple[int, int, bytes]:
        await self._fill(wire.REQUEST.size)
        length, op, rid = wire.REQUEST.unpack_from(self._buf)
        if length > wire.MAX_BODY:
            raise Closed()  # not our client: drop it
        await self._fill(wire.REQUEST.size + length)
        body = bytes(self._buf[wire.REQUEST.size: wire.REQUEST.size + length])
        del self._buf[: wire.REQUEST.size + length]
        return op, rid, body

    # ------------------------------------------------------------------ requests

    async def _hello(self, body: bytes) -> bytes:
        (version,) = wire.U32.unpack_from(body)
        if version != wire.VERSION:
            raise CkptfsError(f"direct protocol {version} (this daemon: {wire.VERSION})",
                              errno=errno.EPROTO)
        return wire.HELLO_REPLY.pack(wire.VERSION, self.st_dev)

    async def _map(self, body: bytes) -> bytes:
        if not self._fds:
            raise InvalidArgument("MAP without a descriptor")
        fd = self._fds.pop(0)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _in_memory(fd):
            os.close(fd)
            raise InvalidArgument("MAP: not a memory file")
        if self.memfd is not None:
            os.close(self.memfd)
        self.memfd, self.memfd_size = fd, st.st_size
        return b""

    async def _lookup_path(self, path: bytes) -> tuple[Inode, bytes, Inode | None]:
        """The parent directory (searched), the last name and its inode (None: absent)."""
        names = split(path)
        if not names:
            raise IsADirectory("/")
        parent = await walk_dir(self.fs, self.ctx, names[:-1])
        check(self.ctx, parent, X, os.fsdecode(path))
        try:
            return parent, names[-1], await self.fs.lookup(parent.ino, names[-1], self.ctx)
        except NotFound:
            return parent, names[-1], None

    async def _open_inode(self, inode: Inode, flags: int, path: bytes) -> int:
        if flags & os.O_TRUNC and flags & os.O_ACCMODE == os.O_RDONLY:
            # The kernel would truncate (with write permission); the VFS truncates only a
            # handle opened for writing: refused rather than answered with a size of 0.
            raise InvalidArgument(f"{os.fsdecode(path)}: O_TRUNC needs O_WRONLY or O_RDWR "
                                  "on the direct path")
        if inode.is_dir:
            raise IsADirectory(os.fsdecode(path))
        if not inode.is_reg:
            raise InvalidArgument(f"{os.fsdecode(path)}: not a regular file")
        check(self.ctx, inode, open_access(flags), os.fsdecode(path))
        self._room_for_handle()
        fh = await self.fs.open(inode.ino, _handle_flags(flags), self.ctx)
        self.handles[fh] = flags & os.O_ACCMODE
        return fh

    def _room_for_handle(self) -> None:
        if len(self.handles) >= MAX_HANDLES:
            raise CkptfsError(f"{MAX_HANDLES} handles open on this connection",
                              errno=errno.EMFILE)

    async def _open(self, body: bytes) -> bytes:
        (flags,) = wire.OPEN_REQ.unpack_from(body)
        path = body[wire.OPEN_REQ.size:]
        _parent, _name, inode = await self._lookup_path(path)
        if inode is None:
            raise NotFound(os.fsdecode(path))
        fh = await self._open_inode(inode, flags & ~(os.O_CREAT | os.O_EXCL), path)
        return wire.OPEN_REPLY.pack(fh, inode.size if not flags & os.O_TRUNC else 0)

    async def _create(self, body: bytes) -> bytes:
        flags, mode = wire.CREATE_REQ.unpack_from(body)
        path = body[wire.CREATE_REQ.size:]
        parent, name, inode = await self._lookup_path(path)
        if inode is not None:
            if flags & os.O_EXCL:
                raise AlreadyExists(os.fsdecode(path))
            fh = await self._open_inode(inode, flags & ~(os.O_CREAT | os.O_EXCL), path)
            return wire.OPEN_REPLY.pack(fh, 0 if flags & os.O_TRUNC else inode.size)
        check(self.ctx, parent, W | X, os.fsdecode(path))
        self._room_for_handle()
        fh, _attrs = await self.fs.create(parent.ino, name, stat.S_IFREG | (mode & 0o7777),
                                          _handle_flags(flags), self.ctx)
        self.handles[fh] = flags & os.O_ACCMODE
        return wire.OPEN_REPLY.pack(fh, 0)

    def _io_args(self, body: bytes, refused: int) -> tuple[int, int, int, int]:
        """A READ's or WRITE's fields; EBADF for a handle not open here or open with the
        access mode ``refused`` (as read(2) of a write-only descriptor: the VFS trusts the
        kernel to have checked, and its mode-bit check at OPEN was for that access only)."""
        fh, off, moff, length = wire.IO_REQ.unpack_from(body)
        if self.handles.get(fh, refused) == refused:
            raise CkptfsError(f"handle {fh}: not open on this connection for this access",
                              errno=errno.EBADF)
        if self.memfd is None or moff + length > self.memfd_size:
            raise CkptfsError("range outside the mapped memory", errno=errno.EFAULT)
        return fh, off, moff, length

    async def _write(self, body: bytes) -> bytes:
        """The whole chunks of the range go straight to the chunk service (``_chunks``);
        a head or tail that is not a whole chunk goes through the VFS's write."""
        fh, off, moff, length = self._io_args(body, os.O_RDONLY)
        cs = self.fs.chunk_size
        lo, hi = -(-off // cs) * cs, (off + length) // cs * cs
        if hi <= lo:
            lo = hi = off + length
        done = await self._pieces(fh, off, moff, lo - off)
        done += await self._chunks(fh, lo, moff + lo - off, hi - lo)
        done += await self._pieces(fh, hi, moff + hi - off, off + length - hi)
        return wire.U64.pack(done)

    async def _pieces(self, fh: int, off: int, moff: int, length: int) -> int:
        assert self.memfd is not None
        done = 0
        while done < length:
            n = min(PIECE, length - done)
            # The integrity rule: the VFS hashes and stores a private copy (a kernel copy
            # out of the memfd, GIL released), never the client's pages.
            data = await threads.run_sync(os.pread, self.memfd, n, moff + done, limiter=self.io)
            if len(data) != n:  # the client shrank its memfd under us
                raise CkptfsError("mapped memory shrank", errno=errno.EFAULT)
            done += await self.fs.write(fh, off + done, data)
        return done

    async def _chunks(self, fh: int, off: int, moff: int, length: int) -> int:
        """Whole chunks [off, off + length), several at once: each is copied by a worker
        thread out of the memfd into a staged buffer of the daemon's own (the integrity
        rule: only that private copy is hashed, framed and written), and handed to the
        open file, whose chunk write (ChunkService.write) and commit are the FUSE path's.
        The trio thread touches no byte of it."""
        memfd = self.memfd
        assert memfd is not None
        cs = self.fs.chunk_size
        slots = trio.Semaphore(WRITE_PARALLEL)
        failed: list[CkptfsError | OSError] = []

        async def chunk(start: int) -> None:
            async def fill(staged: Staged) -> None:
                await threads.run_sync(_fill, staged, memfd, moff + start, cs, limiter=self.io)

            try:
                if not await self.fs.write_chunk(fh, (off + start) // cs, fill):
                    await self._pieces(fh, off + start, moff + start, cs)
            except (CkptfsError, OSError) as exc:
                failed.append(exc)
            finally:
                slots.release()

        async with trio.open_nursery() as nursery:
            # Started as slots free up, not all at once: a huge length costs tasks in
            # proportion to WRITE_PARALLEL, not to itself; a failure starts no more.
            for start in range(0, length, cs):
                await slots.acquire()
                if failed:
                    slots.release()
                    break
                nursery.start_soon(chunk, start)
        if failed:
            raise failed[0]
        return length

    async def _read(self, body: bytes) -> bytes:
        """A READ's pieces are its chunks (the first and last may be parts of one), read
        and copied out concurrently (READ_PARALLEL at once): each is ChunkService.read's
        verified plaintext in the daemon's own buffer (through the open file, which
        serves what a writer has not committed yet and reads ahead for a sequential
        reader), handed over as a view, not a copy, and written into the memfd by a
        worker thread. The reply counts the bytes up to the first short piece (the end
        of the file)."""
        fh, off, moff, length = self._io_args(body, os.O_WRONLY)
        memfd = self.memfd
        assert memfd is not None
        cs = self.fs.chunk_size
        first = min(length, (off // cs + 1) * cs - off)  # up to the first chunk's end
        got: dict[int, int] = {}  # bytes each piece read, by its start
        short: list[int] = []  # starts of pieces that came back short: the end of the file
        slots = trio.Semaphore(READ_PARALLEL)
        failed: list[CkptfsError | OSError] = []  # the request's errno, not a group

        async def piece(start: int, n: int) -> None:
            try:
                data = await self.fs.read(fh, off + start, n)  # verified by the store
                if data:
                    await threads.run_sync(os.pwrite, memfd, data, moff + start,
                                           limiter=self.io)
                got[start] = len(data)
                if len(data) < n:
                    short.append(start)
            except (CkptfsError, OSError) as exc:
                failed.append(exc)
            finally:
                slots.release()

        async with trio.open_nursery() as nursery:
            # Started as slots free up, and none past a piece that met the end of the file
            # or failed: a READ of a huge length (past EOF) costs what the file holds.
            start = 0
            while start < length:
                await slots.acquire()
                if failed or (short and start > min(short)):
                    slots.release()
                    break
                end = first if start == 0 else min(length, start + cs)
                nursery.start_soon(piece, start, end - start)
                start = end
        if failed:
            raise failed[0]
        done = 0
        for start in sorted(got):
            if start != done:  # a piece before it was not read (past the end)
                break
            done += got[start]
            if start in short:
                break
        return wire.U64.pack(done)

    def _take(self, body: bytes) -> int:
        (fh,) = wire.U64.unpack_from(body)
        if fh not in self.handles:
            raise CkptfsError(f"handle {fh} is not open on this connection", errno=errno.EBADF)
        return fh

    async def _fsync(self, body: bytes) -> bytes:
        await self.fs.fsync(self._take(body))
        return b""

    async def _close(self, body: bytes) -> bytes:
        """The commit, as close(2) of a FUSE file: FLUSH (its errors are CLOSE's), then
        the release (tracker event, last-close drop)."""
        fh = self._take(body)
        self.handles.pop(fh, None)
        try:
            await self.fs.flush(fh)
        finally:
            await self.fs.release(fh)
        return b""

    async def _stat(self, body: bytes) -> bytes:
        _parent, _name, inode = await self._lookup_path(body)
        if inode is None:
            raise NotFound(os.fsdecode(body))
        return wire.STAT_REPLY.pack(inode.size, inode.mode, inode.uid, inode.gid,
                                    inode.mtime_ns)


def _fill(staged: Staged, memfd: int, moff: int, n: int) -> None:
    """``n`` bytes of the memfd at ``moff`` into the staged buffer, behind the room for
    the frame header: one kernel copy (GIL released) into memory the client cannot
    reach. Whatever the client does to its pages meanwhile changes only which bytes it
    wrote; the digest is computed later over this copy."""
    with memoryview(staged.buf) as whole, whole[HEADER_SIZE: HEADER_SIZE + n] as room:
        got = os.preadv(memfd, [room], moff)
    if got != n:  # the client shrank its memfd under us
        raise CkptfsError("mapped memory shrank", errno=errno.EFAULT)
    staged.length = n


def _in_memory(fd: int) -> bool:
    """A memfd (or another shmem file): only those take seals. Why it matters: the
    memfd's copies run under the store's I/O limiter, and a file of a filesystem that
    does not answer (a FUSE mount of the client's own, stopped) would hold its slots, and
    so every user's chunk writes and reads, for ever. Memory never blocks."""
    try:
        fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError:
        return False
    return True


def _handle_flags(flags: int) -> int:
    """A direct handle is a direct_io handle of the VFS (O_DIRECT): a writer's commit drops
    the pages the kernel cached of the file, so FUSE readers see the new bytes; a reader's
    chunks are not pushed into the kernel's page cache (no FUSE reader asked for them)."""
    return (flags & (os.O_ACCMODE | os.O_TRUNC)) | os.O_DIRECT  # offsets are the client's

