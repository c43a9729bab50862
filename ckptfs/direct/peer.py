"""Who is at the other end of a direct connection: SO_PEERCRED (pid, uid, gid as the
daemon's namespaces see them; the kernel translates a container's) and the supplementary
groups of that pid, as the RequestContext a FUSE request of that process gets."""

from __future__ import annotations

import socket
import struct

import trio

from ..vfs.context import RequestContext, read_groups

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def credentials(sock: trio.socket.SocketType) -> tuple[int, int, int]:
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid, gid


async def peer_context(sock: trio.socket.SocketType) -> RequestContext:
    """The caller's context, taken once at accept: the connecting process's identity."""
    pid, uid, gid = credentials(sock)
    groups: tuple[int, ...] = ()
    if uid != 0 and pid > 0:
        groups = await trio.to_thread.run_sync(read_groups, pid)
    return RequestContext(uid=uid, gid=gid, pid=pid, groups=groups)
