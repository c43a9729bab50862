"""The open handles of the filesystem: a handle per open, the table of them by number
(shared with the checkpoint tracker and the janitor), and what statfs answers."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .openfile import OpenFile

NAME_MAX = 255  # the longest name (statfs says so; longer ones: ENAMETOOLONG)


def uses_direct_io(flags: int) -> bool:
    """Write-only handles bypass the kernel page cache: a checkpoint save then costs one
    copy less and does not double-cache the checkpoint in RAM, and nothing can mmap a
    write-only handle. O_DIRECT asks for it explicitly."""
    return bool(flags & os.O_DIRECT) or (flags & os.O_ACCMODE) == os.O_WRONLY


@dataclass
class Handle:
    file: OpenFile
    flags: int
    wrote: bool = False
    caller_uid: int = 0  # who opened it: a write by non-root clears setuid/setgid
    caller_pid: int = 0  # and its process (the audit record of its commit)
    # The file's path for checkpoint events, valid while the namespace generation it was
    # resolved at is current (vfs/pathgen.py): no catalog round trip per event.
    path: str | None = None
    path_gen: int = -1

    @property
    def writable(self) -> bool:
        return (self.flags & os.O_ACCMODE) != os.O_RDONLY

    @property
    def direct_io(self) -> bool:
        return uses_direct_io(self.flags)


@dataclass(frozen=True)
class FsStats:
    block_size: int
    blocks: int
    blocks_free: int
    blocks_avail: int
    files: int
    files_free: int
    name_max: int


class HandleTable(dict[int, Handle]):
    """The open handles by number. Built by the composition root and shared with the
    checkpoint tracker (files open for writing) and the janitor (files open at all)."""

    def writing_inos(self) -> list[int]:
        return sorted({h.file.ino for h in self.values() if h.writable})

    def open_inos(self) -> list[int]:
        return sorted({h.file.ino for h in self.values()})
