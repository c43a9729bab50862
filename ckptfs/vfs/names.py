"""The names of directories this mount created, known completely (name -> inode number),
so that a LOOKUP there needs no catalog round trip when the name is missing, or when the
inode's attributes are known too (an open file, or vfs/dirattrs.py).

The kernel looks a name up before every create (and the new name of every rename); in a
save's new directory (``tmp-checkpoint-N/``, a rank's shard directory) every such lookup
misses. A directory made by this mount starts empty, and every change of its names goes
through this mount's Filesystem (one node owns the catalog, docs/semantics.md), which
records it here on the trio thread right after its catalog call returned, with no await in
between: a lookup that finds a name missing here ran before any change that adds it. A
change that fails, or is not tracked, forgets the directory: its lookups go to the catalog
again. Bounded: the oldest directories are forgotten first, and a directory with very many
names is forgotten. A shared catalog (several nodes) has other writers of names: there
nothing is known (``enabled=False``).
"""

from __future__ import annotations

from collections import OrderedDict

MAX_DIRS = 4096
MAX_NAMES = 1 << 16  # per directory
MAX_TOTAL = 1 << 18  # names in all known directories (about 100 bytes each)


class KnownNames:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._dirs: OrderedDict[int, dict[bytes, int]] = OrderedDict()
        self._total = 0  # names held, over all directories

    def new_dir(self, ino: int) -> None:
        """A directory this mount just created (empty)."""
        self.forget(ino)
        if not self.enabled:
            return
        self._dirs[ino] = {}
        while len(self._dirs) > MAX_DIRS:
            self._total -= len(self._dirs.popitem(last=False)[1])

    def known(self, ino: int) -> bool:
        return ino in self._dirs

    def absent(self, parent: int, name: bytes) -> bool:
        """True only if ``parent`` is known and has no entry ``name``."""
        names = self._dirs.get(parent)
        return names is not None and name not in names

    def ino(self, parent: int, name: bytes) -> int | None:
        """The inode ``name`` links in a known ``parent`` (None: not known, or absent)."""
        names = self._dirs.get(parent)
        return None if names is None else names.get(name)

    def added(self, parent: int, name: bytes, ino: int) -> None:
        names = self._dirs.get(parent)
        if names is None:
            return
        if name not in names:
            self._total += 1
        names[name] = ino
        if len(names) > MAX_NAMES:
            self.forget(parent)
        while self._total > MAX_TOTAL and self._dirs:
            self._total -= len(self._dirs.popitem(last=False)[1])  # the oldest first

    def removed(self, parent: int, name: bytes) -> None:
        names = self._dirs.get(parent)
        if names is not None and names.pop(name, None) is not None:
            self._total -= 1

    def forget(self, *inos: int) -> None:
        for ino in inos:
            names = self._dirs.pop(ino, None)
            if names is not None:
                self._total -= len(names)
