"""The direct path's listening socket (docs/direct-path.md): one per mount, named after
the mount's device number in the runtime dir, one trio task per connection. Started by
mount.py once the mount answers; the socket file is removed when it stops."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

import trio

from ..vfs.context import RequestContext
from .conn import Connection, DirectFs
from .peer import peer_context

log = logging.getLogger("ckptfs.direct")

RUNTIME_ENV = "CKPTFS_RUNTIME_DIR"
# Open connections one user (not root) may hold: each costs the daemon a socket, a memfd
# and up to a few descriptors passed; 8 ranks with a client per thread need far fewer.
MAX_CONNECTIONS_PER_UID = 128
ACCEPT_RETRY_S = 0.1  # after a failed accept (out of descriptors): a real period


def runtime_dir() -> Path:
    """Where the sockets are: $CKPTFS_RUNTIME_DIR, else /run/ckptfs (root) or
    $XDG_RUNTIME_DIR/ckptfs, else /tmp/ckptfs-UID. ckptfs/client/discover.py computes
    the same (keep them in step)."""
    if os.environ.get(RUNTIME_ENV):
        return Path(os.environ[RUNTIME_ENV])
    if os.geteuid() == 0:
        return Path("/run/ckptfs")
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "ckptfs"
    return Path(f"/tmp/ckptfs-{os.geteuid()}")


def socket_name(st_dev: int) -> str:
    return f"dev-{os.major(st_dev)}-{os.minor(st_dev)}.sock"


class DirectServer:
    def __init__(self, fs: DirectFs, io: trio.CapacityLimiter) -> None:
        self.fs, self.io = fs, io
        self.path: Path | None = None
        self._per_uid: dict[int, int] = {}  # open connections by the caller's uid

    async def serve(self, mountpoint: Path) -> None:
        """Listen until cancelled (the mount's nursery at unmount)."""
        st_dev = (await trio.to_thread.run_sync(os.stat, mountpoint)).st_dev
        path = runtime_dir() / socket_name(st_dev)
        sock = await self._bind(path)
        self.path = path
        log.info("direct path: listening on %s", path)
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        conn, _addr = await sock.accept()
                    except OSError as exc:
                        # Out of descriptors (or memory), for now: the server goes on
                        # (its end would be every client's fallback until a remount).
                        log.warning("direct path: accept failed: %s", exc)
                        await trio.sleep(ACCEPT_RETRY_S)
                        continue
                    nursery.start_soon(self._connection, conn, st_dev)
        finally:
            sock.close()
            with contextlib.suppress(OSError):
                path.unlink()

    async def _bind(self, path: Path) -> trio.socket.SocketType:
        def prepare() -> None:
            if not path.parent.is_dir():
                path.parent.mkdir(parents=True, exist_ok=True)
                # Other users' clients must reach the socket (the daemon's umask is 077).
                path.parent.chmod(0o755)
            if path.exists() and stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()  # an earlier mount's, of a device number reused now

        await trio.to_thread.run_sync(prepare)
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(str(path))
        # Anyone who reaches the mount may connect; each request is decided by the
        # caller's credentials (SO_PEERCRED), as a FUSE request by the kernel's.
        os.chmod(path, 0o666)
        sock.listen(64)
        return sock

    async def _connection(self, sock: trio.socket.SocketType, st_dev: int) -> None:
        with sock:
            try:
                ctx: RequestContext = await peer_context(sock)
            except OSError as exc:
                log.debug("direct connection refused: %s", exc)
                return
            held = self._per_uid.get(ctx.uid, 0)
            if ctx.uid != 0 and held >= MAX_CONNECTIONS_PER_UID:
                # Each costs the daemon descriptors: one user must not exhaust them.
                # The client falls back to the mount.
                log.warning("direct connection of pid %d refused: uid %d holds %d",
                            ctx.pid, ctx.uid, held)
                return
            self._per_uid[ctx.uid] = held + 1
            try:
                await Connection(sock, self.fs, ctx, st_dev, self.io).serve()
            except Exception:  # a bug: it ends this connection, never the daemon
                log.exception("direct connection of pid %d failed", ctx.pid)
            finally:
                self._per_uid[ctx.uid] -= 1
                if not self._per_uid[ctx.uid]:
                    del self._per_uid[ctx.uid]
