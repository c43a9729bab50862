"""A connection to a ckptfs daemon's direct path (docs/direct-path.md): one socket, one
memfd passed once, requests one at a time. Bytes are staged in the memfd; the daemon copies
them out before it hashes them, so nothing this process does to its memory afterwards can
change what was stored."""

from __future__ import annotations

import mmap
import os
import socket
import struct
import threading
import weakref
from pathlib import Path

from . import wire

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Refused(Exception):
    """The socket is not the daemon of this mount (another device, another protocol)."""


def _umask() -> int:
    """This process's umask, from /proc (os.umask would change it, racing other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _release(sock: socket.socket, mem: mmap.mmap, memfd: int) -> None:
    sock.close()
    mem.close()
    os.close(memfd)


class DirectClient:
    def __init__(self, sock: socket.socket, root: Path, memory: int) -> None:
        self.sock, self.root = sock, root
        self.memfd = os.memfd_create("ckptfs-direct", os.MFD_CLOEXEC)
        os.ftruncate(self.memfd, memory)
        self.mem = mmap.mmap(self.memfd, memory)
        self.memory = memory
        # A client dropped without close_connection() (a plugin's thread-local one) still
        # gives its socket, mapping and memfd back.
        self._finalizer = weakref.finalize(self, _release, sock, self.mem, self.memfd)
        self._lock = threading.Lock()  # one request at a time on the socket and memfd
        self._rid = 0

    @classmethod
    def connect(
        cls, path: Path, root: Path, st_dev: int, memory: int, server_uid: int | None = None
    ) -> DirectClient:
        """``server_uid``: the server must run as it (or as root): the owner of the
        socket's directory (discover.py ``trusted_owner``)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            _pid, uid, _gid = _UCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
            if server_uid is not None and uid not in (0, server_uid):
                raise Refused(f"served by uid {uid}, not by the owner of {path.parent}")
            client = cls(sock, root, memory)
        except BaseException:
            sock.close()
            raise
        try:
            version, dev = wire.HELLO_REPLY.unpack(
                client._call(wire.HELLO, wire.U32.pack(wire.VERSION)))
            if dev != st_dev:
                raise Refused(f"serves device {dev:#x}, not {st_dev:#x}")
            client._call(wire.MAP, wire.U64.pack(memory), fds=[client.memfd])
        except BaseException:
            client.close_connection()
            raise
        return client

    def close_connection(self) -> None:
        """End the connection: files not closed are released uncommitted by the daemon."""
        self._finalizer()

    def __enter__(self) -> DirectClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_connection()

    # ------------------------------------------------------------------ the wire

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            part = self.sock.recv(n - len(buf))
            if not part:
                raise ConnectionResetError("the ckptfs daemon closed the direct connection")
            buf += part
        return bytes(buf)

    def _call(self, op: int, body: bytes, fds: list[int] | None = None) -> bytes:
        with self._lock:
            self._rid = (self._rid + 1) & 0xFFFFFFFF
            msg = wire.REQUEST.pack(len(body), op, self._rid) + body
            if fds:
                socket.send_fds(self.sock, [msg], fds)
            else:
                self.sock.sendall(msg)
            length, status, rid, err = wire.REPLY.unpack(self._recv_exact(wire.REPLY.size))
            out = self._recv_exact(length)
        if rid != self._rid:
            raise Refused(f"reply {rid} to request {self._rid}")
        if status:
            raise OSError(err, os.strerror(err))
        return out

    def _rel(self, path: str | os.PathLike[str]) -> bytes:
        p = Path(os.path.abspath(path))
        return os.fsencode(str(p.relative_to(self.root)))

    # ------------------------------------------------------------------ files

    def open(self, path: str | os.PathLike[str], flags: int = os.O_RDONLY) -> tuple[int, int]:
        """(handle, size) of an existing file."""
        out = self._call(wire.OPEN, wire.OPEN_REQ.pack(flags) + self._rel(path))
        return wire.OPEN_REPLY.unpack(out)

    def create(
        self, path: str | os.PathLike[str], mode: int = 0o666,
        flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    ) -> int:
        body = wire.CREATE_REQ.pack(flags, mode & ~_umask() & 0o7777) + self._rel(path)
        return wire.OPEN_REPLY.unpack(self._call(wire.CREATE, body))[0]

    def pwrite(self, handle: int, data: bytes | bytearray | memoryview, offset: int) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            n = min(self.memory, len(view) - done)
            os.pwritev(self.memfd, [view[done: done + n]], 0)  # a kernel copy, no GIL
            out = self._call(wire.WRITE, wire.IO_REQ.pack(handle, offset + done, 0, n))
            done += wire.U64.unpack(out)[0]
        return done

    def write_staged(self, handle: int, offset: int, length: int) -> int:
        """WRITE the first ``length`` bytes of the shared memory at ``offset`` (a writer
        that filled ``self.mem`` itself: no copy here)."""
        return wire.U64.unpack(
            self._call(wire.WRITE, wire.IO_REQ.pack(handle, offset, 0, length)))[0]

    def preadinto(self, handle: int, buf: bytearray | memoryview, offset: int) -> int:
        view = memoryview(buf).cast("B")
        done = 0
        while done < len(view):
            n = min(self.memory, len(view) - done)
            got = wire.U64.unpack(
                self._call(wire.READ, wire.IO_REQ.pack(handle, offset + done, 0, n)))[0]
            if got:  # a kernel copy straight into the caller's buffer (no slice of the map)
                os.preadv(self.memfd, [view[done: done + got]], 0)
            done += got
            if got < n:
                break
        return done

    def fsync(self, handle: int) -> None:
        self._call(wire.FSYNC, wire.U64.pack(handle))

    def close(self, handle: int) -> None:
        """The commit (a FUSE close's): its errors are raised here."""
        self._call(wire.CLOSE, wire.U64.pack(handle))

    def stat(self, path: str | os.PathLike[str]) -> tuple[int, int, int, int, int]:
        """(size, mode, uid, gid, mtime_ns)."""
        return wire.STAT_REPLY.unpack(self._call(wire.STAT, self._rel(path)))

    # ------------------------------------------------------------------ whole files

    def write_file(self, path: str | os.PathLike[str], data: bytes | memoryview,
                   mode: int = 0o666) -> None:
        handle = self.create(path, mode)
        try:
            self.pwrite(handle, data, 0)
        finally:
            self.close(handle)

    def read_file(self, path: str | os.PathLike[str]) -> bytearray:
        handle, size = self.open(path)
        try:
            buf = bytearray(size)
            del buf[self.preadinto(handle, buf, 0):]  # no copy of what was read
            return buf
        finally:
            self.close(handle)

