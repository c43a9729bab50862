"""Directory attributes as the catalog has them, for the kernel's GETATTRs of directories,
and the attributes of regular files as this node last committed them.

Under ``default_permissions`` the kernel checks every path walk against the directory's
mode, and every create, unlink or rename in a directory makes it fetch the directory's
attributes again: one GETATTR per such operation, which this cache answers without a
catalog round trip. Correct by construction of the order: every entry carries the number
``stamp`` gave in the catalog thread (where calls run one at a time, in commit order) when
it was read, and a change of directory rows there either refreshes the entries it changed
or clears them all, with its own number; an older reading never replaces a newer one.

Regular files: a write makes the kernel drop its cached size and times, so the first stat
after a close is a GETATTR. The last close of a file whose open state is exactly what its
commit wrote puts those attributes here (``put_file``); anything else that may change a
file's row forgets it (``forget``: an entry without attributes, so that no older reading
can come back) or clears the cache; a rename puts the moved file's row as it read it.
One node owns the catalog (docs/semantics.md): no other writer can change a row behind
this cache. A shared catalog (several nodes, docs/multinode.md) has other writers: there
the cache is off (``enabled=False``: it keeps nothing).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from ..catalog import Inode

FILES_MAX = 1 << 16  # regular files remembered (about 200 bytes each)


class DirAttrs:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._seq = itertools.count(1)
        self._entries: dict[int, tuple[int, Inode]] = {}
        self._files: OrderedDict[int, tuple[int, Inode | None]] = OrderedDict()
        self._epoch = 0  # readings older than the last clear are stale

    def stamp(self) -> int:
        """In the catalog thread, right after a read or change: its place in commit order."""
        return next(self._seq)

    def get(self, ino: int) -> Inode | None:
        e = self._entries.get(ino) or self._files.get(ino)
        return None if e is None else e[1]  # a file's entry may be forgotten (None)

    def put_file(self, seq: int, inode: Inode) -> None:
        """A regular file's attributes as known at ``seq``: as its commit wrote them (taken
        on the trio thread when the caller knew them exact: after every catalog call that
        could have changed the row had finished), or as a catalog call read them."""
        self._put_file(seq, inode.ino, inode)

    def forget(self, seq: int, ino: int) -> None:
        """The catalog call numbered ``seq`` may have changed this file's row: no reading
        older than ``seq`` may come back (kept as an entry without attributes)."""
        self._put_file(seq, ino, None)

    def _put_file(self, seq: int, ino: int, inode: Inode | None) -> None:
        if seq < self._epoch or not self.enabled:
            return
        cur = self._files.pop(ino, None)
        self._files[ino] = cur if cur is not None and cur[0] > seq else (seq, inode)
        if len(self._files) > FILES_MAX:
            self._files.popitem(last=False)  # the least recently used

    def put(self, seq: int, inode: Inode) -> None:
        """A directory's row as read (or written) by the catalog call numbered ``seq``."""
        if not inode.is_dir or seq < self._epoch or not self.enabled:
            return
        cur = self._entries.get(inode.ino)
        if cur is None or cur[0] < seq:
            self._entries[inode.ino] = (seq, inode)

    def clear(self, seq: int) -> None:
        """The catalog call numbered ``seq`` changed directory rows in ways not tracked."""
        self._epoch = max(self._epoch, seq)
        self._entries.clear()
        self._files.clear()
