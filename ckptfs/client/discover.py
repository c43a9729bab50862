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
    name = socket_name(st_dev)
    dirs = [os.environ.get(RUNTIME_ENV, ""), "/run/ckptfs"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        dirs.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "ckptfs"))
    dirs += sorted(glob.glob("/tmp/ckptfs-*"))
    return [Path(d) / name for d in dirs if d]


def trusted_owner(sock: Path) -> int | None:
    """The owner of the socket's directory if a client may trust it: root's or this
    user's, writable by no one else (as ssh-agent's checks). Any user can make a
    /tmp/ckptfs-X/dev-M-N.sock and answer HELLO with the right device: such a socket must
    never receive a checkpoint's bytes. None: not trusted."""
    try:
        st = sock.parent.stat()
    except OSError:
        return None
    if st.st_uid not in (0, os.getuid()) or st.st_mode & 0o022:
        return None
    return st.st_uid


def find_socket(path: str | os.PathLike[str]) -> tuple[Path, Path, int, int | None] | None:
    """(socket, mount root, device, the uid its server must run as (None: a socket named
    by CKPTFS_DIRECT_SOCKET, trusted as named)) for ``path``; None if no trusted socket."""
    root, dev = mount_root(path)
    if os.environ.get(SOCKET_ENV):
        sock = Path(os.environ[SOCKET_ENV])
        return (sock, root, dev, None) if sock.exists() else None
    for sock in candidates(dev):
        owner = trusted_owner(sock)
        if owner is not None and sock.exists():
            return sock, root, dev, owner
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
    sock, root, dev, owner = found
    try:
        return DirectClient.connect(sock, root, dev, memory, server_uid=owner)
    except (OSError, Refused) as exc:
        _say_once(f"{sock}: {exc}")
        return None
