"""Who asks: the caller of the system call behind a request (from the FUSE request).

The VFS decides the rules the kernel leaves to the filesystem (sticky directories,
ownership for chown/chmod, setgid inheritance, clearing setuid, control xattrs) from this.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestContext:
    uid: int
    gid: int
    pid: int = 0
    groups: tuple[int, ...] = ()  # supplementary groups, where the request needs them

    @property
    def is_root(self) -> bool:
        # Root stands for CAP_FOWNER, CAP_CHOWN and CAP_FSETID (the kernel tells us no more).
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups

    def owns(self, uid: int) -> bool:
        return self.is_root or self.uid == uid

    def may_write(self, mode: int, uid: int, gid: int) -> bool:
        """Write permission by the mode bits (owner, group, other), as the kernel checks."""
        if self.is_root:
            return True
        if self.uid == uid:
            return bool(mode & stat.S_IWUSR)
        if self.in_group(gid):
            return bool(mode & stat.S_IWGRP)
        return bool(mode & stat.S_IWOTH)


ROOT = RequestContext(uid=0, gid=0)  # the daemon's own work (retention, tests)


def groups_from_status(text: str) -> tuple[int, ...]:
    """The supplementary groups from the text of /proc/PID/status."""
    for line in text.splitlines():
        if line.startswith("Groups:"):
            return tuple(int(g) for g in line.split()[1:])
    return ()


def read_groups(pid: int) -> tuple[int, ...]:
    """The supplementary groups of process ``pid`` (blocking: a worker thread reads it)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return groups_from_status(f.read())
    except OSError:
        return ()  # the caller is gone: no supplementary groups to honour
