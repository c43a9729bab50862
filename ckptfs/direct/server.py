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
                    conn, _addr = await sock.accept()
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
            await Connection(sock, self.fs, ctx, st_dev, self.io).serve()
