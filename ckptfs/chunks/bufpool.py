"""Receive buffers for chunk GETs and local frame reads, reused once nothing views them.

A GET's body read into a fresh 16 MiB buffer costs a page fault and a zeroed page per
4 KiB (15-17 % of the daemon's CPU in a bucket-only restore, perf); a local O_DIRECT read
into a new bytearray also had Python zero it first, with the GIL held. A buffer is an
anonymous mapping, so it is page-aligned, as O_DIRECT needs. A chunk that leaves
the read cache gives its buffer back here; the next GET reads into it, so its pages stay
mapped (private memory, not shared: ``new_buffer``).
A buffer goes out again only when no memoryview of it is alive (a FUSE reply,
a copy-back or a read-modify-write may still hold the bytes): an mmap with live exports
refuses to be resized, which ``unviewed`` tests. Only buffers this pool made
(``FrameBuffer``) are taken back, and only views of them are ever handed out, so nothing
else holds one. A new buffer is an anonymous mapping: its pages are zeroed by the kernel
as the body lands, as for a fresh ``bytes`` (a ``bytearray`` would be zeroed once more).
It is private: a shared anonymous mapping (``mmap``'s default) is shmem, whose pages
fault in at a higher cost. Filling fresh 16 MiB buffers measured 0.83-0.99 CPU s/GB
shared, 0.59-0.70 private, 0.19 reused (the copy alone). Transparent huge pages
(``MADV_HUGEPAGE``) were cheaper still when their memory had just been freed (0.31-0.35)
but erratic in a restore (1.3-3.6 CPU s/GB of GETs, against 1.6-1.7 with 4 KiB pages):
most likely because on this VM free 2 MiB blocks are what is handed back to the host,
so they fault there again (not shown). So: private, 4 KiB pages.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable

MiB = 1024 * 1024


class FrameBuffer(mmap.mmap):
    """A receive buffer made by a FramePool (the only kind it takes back)."""


def new_buffer(size: int) -> FrameBuffer:
    """A private anonymous mapping. Why: mmap's default (MAP_SHARED) is shared memory,
    whose pages fault in through shmem. First touch of a new 16 MiB buffer on the
    benchmark machine (loaded): shared 15-19 ms of CPU, private 10-12 ms. Transparent huge
    pages (madvise) made the first touch cheaper still (5 ms) but cold reads costlier
    (2.0-2.3 against 1.7-1.8 CPU s/GB: with THP defrag = madvise a fault may compact
    memory first), so they are not asked for."""
    return FrameBuffer(-1, size, flags=mmap.MAP_PRIVATE)


def unviewed(buf: mmap.mmap) -> bool:
    """True if no buffer export (memoryview, ...) of ``buf`` is alive."""
    try:
        buf.resize(len(buf))  # an mmap with exports refuses to resize (BufferError)
    except BufferError:
        return False
    return True


class FramePool:
    """Thread-safe: ``take`` runs in the GET's worker thread, ``give`` on the trio thread;
    the lock is held for list operations only."""

    def __init__(
        self, keep: int, count: Callable[[str], None] | None = None,
        room: Callable[[], int] | None = None,
    ) -> None:
        """``keep``: idle buffers held for reuse, at least (if given back); ``room``: bytes
        more idle buffers may hold beyond those (the read cache's unused room: a chunk
        leaving the cache makes room for its buffer, so the cache and the idle buffers
        together stay within the cache's limit)."""
        self.keep = keep
        self._room = room
        self._idle: list[FrameBuffer] = []  # oldest first; some may still be viewed
        self._idle_bytes = 0
        self._lock = threading.Lock()
        self._count = count  # statistics: frame_buffers_made, frame_buffers_reused
        self.made = 0
        self.reused = 0

    def take(self, n: int) -> FrameBuffer | None:
        """A buffer of at least ``n`` bytes (at most about twice as many), or None for a
        body too small to be worth one (it is read into plain bytes)."""
        if n < MiB or self.keep <= 0:
            return None
        with self._lock:
            for i, buf in enumerate(self._idle):
                if n <= len(buf) <= 2 * n and unviewed(buf):
                    del self._idle[i]
                    self._idle_bytes -= len(buf)
                    self.reused += 1
                    if self._count is not None:
                        self._count("frame_buffers_reused")
                    return buf
            self.made += 1
        if self._count is not None:
            self._count("frame_buffers_made")
        return new_buffer(-(-n // MiB) * MiB)  # whole MiB: a frame and its tail fit

    def give(self, buf: object) -> None:
        """``buf`` (a FrameBuffer; anything else is ignored) is no longer needed by its
        owner; it is reused once its last view is gone. Beyond ``keep`` idle buffers and
        the ``room`` the oldest ones go."""
        if not isinstance(buf, FrameBuffer):
            return
        room = 0 if self._room is None else self._room()  # outside the lock: the caller's
        with self._lock:
            if any(b is buf for b in self._idle):
                return
            self._idle.append(buf)
            self._idle_bytes += len(buf)
            while len(self._idle) > self.keep and self._idle_bytes > room:
                self._idle_bytes -= len(self._idle.pop(0))  # freed when its last view goes

    @property
    def idle(self) -> int:
        """Idle buffers held now."""
        return len(self._idle)

    def clear(self) -> None:
        """Let the idle buffers go (their memory returns to the system)."""
        with self._lock:
            self._idle.clear()
            self._idle_bytes = 0
