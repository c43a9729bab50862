"""Directory attributes as the catalog has them, for the kernel's GETATTRs of directories.

Under ``default_permissions`` the kernel checks every path walk against the directory's
mode, and every create, unlink or rename in a directory makes it fetch the directory's
attributes again: one GETATTR per such operation, which this cache answers without a
catalog round trip. Correct by construction of the order: every entry carries the number
``stamp`` gave in the catalog thread (where calls run one at a time, in commit order) when
it was read, and a change of directory rows there either refreshes the entries it changed
or clears them all, with its own number; an older reading never replaces a newer one.
"""

from __future__ import annotations

import itertools

from ..catalog import Inode


class DirAttrs:
    def __init__(self) -> None:
        self._seq = itertools.count(1)
        self._entries: dict[int, tuple[int, Inode]] = {}
        self._epoch = 0  # readings older than the last clear are stale

    def stamp(self) -> int:
        """In the catalog thread, right after a read or change: its place in commit order."""
        return next(self._seq)

    def get(self, ino: int) -> Inode | None:
        e = self._entries.get(ino)
        return None if e is None else e[1]

    def put(self, seq: int, inode: Inode) -> None:
        """A directory's row as read (or written) by the catalog call numbered ``seq``."""
        if not inode.is_dir or seq < self._epoch:
            return
        cur = self._entries.get(inode.ino)
        if cur is None or cur[0] < seq:
            self._entries[inode.ino] = (seq, inode)

    def clear(self, seq: int) -> None:
        """The catalog call numbered ``seq`` changed directory rows in ways not tracked."""
        self._epoch = max(self._epoch, seq)
        self._entries.clear()
