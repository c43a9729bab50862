"""Finding the daemon behind a path (docs/direct-path.md, "Discovery and handshake"): the
mount's device number names the socket; the daemon's HELLO repeats it, so a socket left by
an earlier mount is never taken for this one's."""

from __future__ import annotations

import glob
import logging
import os
from pathlib import Path

from .session import DirectClient, Refused

log = logging.getLogger("ckptfs.client")

SOCKET_ENV = "CKPTFS_DIRECT_SOCKET"  # an explicit socket (a container's bind mount)
RUNTIME_ENV = "CKPTFS_RUNTIME_DIR"
_said: set[str] = set()  # the fallback is said once per process and reason


def socket_name(st_dev: int) -> str:
    return f"dev-{os.major(st_dev)}-{os.minor(st_dev)}.sock"


def mount_root(path: str | os.PathLike[str]) -> tuple[Path, int]:
    """The root of the filesystem holding ``path`` (or its nearest existing ancestor) and
    its device: walk up while the device stays the same."""
    p = Path(os.path.abspath(path))
    while not p.exists():
        p = p.parent
    dev = p.stat().st_dev
    while p != p.parent and p.parent.stat().st_dev == dev:
        p = p.parent
    return p, dev


def candidates(st_dev: int) -> list[Path]:
    """Where a daemon may have put the socket (server.py ``runtime_dir`` for its user)."""
    if os.environ.get(SOCKET_ENV):
        return [Path(os.environ[SOCKET_ENV])]
    name = socket_name(st_dev)
    dirs = [os.environ.get(RUNTIME_ENV, ""), "/run/ckptfs"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        dirs.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "ckptfs"))
    dirs += sorted(glob.glob("/tmp/ckptfs-*"))
    return [Path(d) / name for d in dirs if d]


def find_socket(path: str | os.PathLike[str]) -> tuple[Path, Path, int] | None:
    """(socket, mount root, device) for ``path``; None if no socket is there."""
    root, dev = mount_root(path)
    for sock in candidates(dev):
        if sock.exists():
            return sock, root, dev
    return None


def _say_once(reason: str) -> None:
    if reason not in _said:
        _said.add(reason)
        log.warning("ckptfs: direct path unavailable (%s), using the mount", reason)


def connect(path: str | os.PathLike[str], memory: int = 64 << 20) -> DirectClient | None:
    """A client of the daemon serving ``path``, with ``memory`` bytes of shared memory;
    None (said once) where there is none."""
    found = find_socket(path)
    if found is None:
        _say_once("no socket for this mount")
        return None
    sock, root, dev = found
    try:
        return DirectClient.connect(sock, root, dev, memory)
    except (OSError, Refused) as exc:
        _say_once(f"{sock}: {exc}")
        return None
