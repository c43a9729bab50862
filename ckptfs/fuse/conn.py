"""The kernel's limits on our FUSE connection: how many read requests it keeps in flight.

Why: the kernel sends a page-cache reader's read-ahead as background requests, at most
``max_background`` of them at once per connection (libfuse's INIT leaves 12), and while
``congestion_threshold`` (9) or more are in flight it drops the asynchronous part of every
read-ahead, so each reader then waits for one request at a time. One sequential reader
keeps one or two requests in flight; the ranks of a GPU node each reading their own
files, or a DCP loader's items, pass 9 together, and then every rank's read-ahead waits on
the others'. pyfuse3 does not let the daemon set these at INIT; root can in fusectl
(/sys/fs/fuse/connections/N/, N the mount's device minor), which systemd mounts at boot.
Best effort, like the bdi read-ahead (mount.tune_read_ahead): without fusectl or root the
kernel's defaults stay, and the log says so.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .. import statedir

log = logging.getLogger("ckptfs.fuse")

CONNECTIONS = Path("/sys/fs/fuse/connections")
MAX_BACKGROUND = 64
# Three quarters of it, the kernel's own ratio (12 -> 9).
CONGESTION_THRESHOLD = MAX_BACKGROUND * 3 // 4


def mount_device(mountpoint: Path) -> str | None:
    """The mount's device ("0:N") from mountinfo (a stat of our own mount from the daemon
    would wait for the loop that serves it), the newest if stacked; None if not mounted."""
    real = statedir.real_mountpoint(mountpoint)
    with open("/proc/self/mountinfo") as f:
        devs = [ln.split()[2] for ln in f if statedir.unescape_mounts(ln.split()[4]) == real]
    return devs[-1] if devs else None


def tune_connection(mountpoint: Path, connections: Path = CONNECTIONS,
                    max_background: int = MAX_BACKGROUND,
                    congestion: int = CONGESTION_THRESHOLD) -> bool:
    """Raise the connection's background limit and congestion threshold (never lower
    them); True if both now stand at least there."""
    try:
        dev = mount_device(mountpoint)
        if dev is None:
            return False
        conn = connections / dev.split(":")[1]
        if not conn.is_dir():
            log.info("fusectl not mounted at %s: the kernel keeps its FUSE request limits "
                     "for %s (max_background 12)", connections, mountpoint)
            return False
        # max_background first: the threshold is meant to stay below it.
        for name, value in (("max_background", max_background),
                            ("congestion_threshold", congestion)):
            f = conn / name
            if int(f.read_text()) < value:
                f.write_text(f"{value}\n")
        return True
    except (OSError, ValueError) as exc:
        log.info("could not raise the FUSE request limits of %s: %s", mountpoint, exc)
        return False
