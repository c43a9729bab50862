"""Running under systemd: the sd_notify protocol (READY, STOPPING, STATUS, WATCHDOG) and
making the local tiers durable at stop.

``Type=notify`` units give the daemon a unix datagram socket in ``$NOTIFY_SOCKET``; each
message is ``KEY=VALUE`` lines. Without that variable every call here does nothing, so the
daemon behaves the same outside systemd. No dependency: a few lines over ``socket``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import socket
from collections.abc import Iterable
from pathlib import Path

import trio

log = logging.getLogger("ckptfs.service")


def notify(*lines: str) -> bool:
    """Send ``lines`` (e.g. ``"READY=1"``, ``"STATUS=..."``) to the service manager.
    Returns False when there is none (no ``$NOTIFY_SOCKET``) or the send failed."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr or not lines:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # an abstract socket
    elif not addr.startswith("/"):
        return False  # vsock and the like: not for a FUSE daemon
    message = "\n".join(line.replace("\n", " ") for line in lines).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(message)
    except OSError as exc:
        log.warning("sd_notify to %s failed: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between WATCHDOG=1 pings (half of ``WatchdogSec=``), or None if the
    service manager did not ask for them (or asked another process)."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2e6


async def watchdog() -> None:
    """Ping the service manager's watchdog while the event loop that serves the mount
    runs; a hung loop stops the pings and systemd restarts the service."""
    interval = watchdog_interval()
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1")
        await trio.sleep(interval)  # a real period: liveness pings (no event to wait for)


_libc: ctypes.CDLL | None = None


def _syncfs(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if _libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def syncfs_all(paths: Iterable[Path | None]) -> None:
    """Blocking: flush the filesystem holding each path (once per device) to stable
    storage, so that every chunk written there is durable. Errors are logged."""
    seen: set[int] = set()
    for p in paths:
        if p is None:
            continue
        try:
            fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            log.warning("cannot sync %s: %s", p, exc.strerror)
            continue
        try:
            dev = os.fstat(fd).st_dev
            if dev in seen:
                continue
            seen.add(dev)
            try:
                _syncfs(fd)
            except (OSError, AttributeError) as exc:
                log.warning("syncfs of %s failed (%s); syncing everything", p, exc)
                os.sync()
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
