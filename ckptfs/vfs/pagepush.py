"""Chunks fetched ahead of a sequential reader, handed to the kernel's page cache.

Why: every byte a FUSE read returns is copied by the kernel into the reader's page-cache
pages inside ``fuse_reply_buf``, on the one thread that answers requests (pyfuse3's trio
thread), with the GIL held. On a cold restore that copy, into pages the kernel has just
allocated, is what bounds the read (docs/performance-history.md, "Cold reads on a quiet VM"): the
fetch threads are ahead, the reply thread is busy. FUSE_NOTIFY_STORE lets the daemon write
a verified chunk's bytes into the file's page cache from a worker thread instead; the
reader then finds the pages cached and the kernel sends no read request for them. The
message is written by fuse/notify.py with ``os.writev`` on the session's /dev/fuse
descriptor, without the GIL (as pyfuse3 3.5's own ``notify_store`` would be too; its
read reply is what holds the GIL): ``PUSH_THREADS`` copies run at once beside the replies.

What is pushed: chunks the readahead fetched (a sequential reader is coming), and the rest
of a chunk the reader entered before any readahead fetched it (a file's first, or where
a reader of items came back to); none of the pages its reader's requests asked for
(vfs/readstreams.py: each reader's runs of requests, so a look further on, as at a DCP
item's zip directory, does not stop the pushes of the chunks before it); only
their verified plaintext (the same view a reply would send), only bytes below the file's
size (a store past the end would grow the kernel's idea of the size), in whole pages, and
never a chunk's last ``TRIPWIRE`` bytes (a quarter of a smaller chunk): the reader's
kernel asks for those, which tells the readahead where the reader is (it advances from
read requests) and marks the chunk read to its end (the read cache lets it go).

Never wrong bytes (the OpenFile enforces it, ``OpenFile.hold_pushes``): a push writes the
committed version into the cache, so it must not land after a write changed those pages.
No push starts while the file has a handle open for writing or uncommitted changes, and
an open for writing, a truncate, the last close and the retirement of a failed OpenFile
first wait until the pushes in flight have ended (a retired one never pushes again). With
a shared catalog (several nodes) there is no push at all: another node's commit is only
seen at the next open, which drops the cached pages, and a push still in flight from a
reader of the old version could land after that drop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from .chunkbuffer import Buffer

log = logging.getLogger("ckptfs.vfs")

PAGE = 4096
KiB = 1024
# A chunk's tail left for the kernel to ask for (see above): one small request per chunk.
TRIPWIRE = 256 * KiB
# Pushed in pieces of this size, from a chunk's end backwards, until one that the reader's
# requests have reached: the reader's kernel asks for the front of a chunk while the push
# fills its back, and no page is copied twice.
PIECE = 1024 * KiB
# Pushes in flight at once: each is a memory copy in the kernel, so about one per core the
# reply thread does not need.
PUSH_THREADS = 2

# (inode, offset, bytes): write them into the kernel's page cache of the inode (blocking;
# OSError if the kernel refuses, e.g. ENOENT when it holds no inode of that number).
StorePages = Callable[[int, int, Buffer], None]
# A file offset -> where the reader's run of requests that holds it ends (the offset
# itself if none does): pages below that were asked for, and need no push.
Asked = Callable[[int], int]


@dataclass
class PagePush:
    """Pushes verified chunks into the kernel's page cache, at most ``PUSH_THREADS`` at
    once, counting what it did in ``count`` (the store's statistics) and the bytes it
    delivered in ``delivered`` (on the trio thread: the bytes applications read, which
    otherwise only replies add to)."""

    store_pages: StorePages
    count: Callable[[str, int], None]
    delivered: Callable[[int], None]
    limiter: trio.CapacityLimiter

    @classmethod
    def make(cls, store_pages: StorePages, count: Callable[[str, int], None],
             delivered: Callable[[int], None]) -> PagePush:
        return cls(store_pages, count, delivered, trio.CapacityLimiter(PUSH_THREADS))

    @staticmethod
    def span(base: int, length: int, size: int) -> int:
        """Bytes to push of a chunk of ``length`` bytes at file offset ``base`` (page
        aligned) of a file of ``size`` bytes: those within the file, but the last
        TRIPWIRE (a quarter of a smaller chunk), rounded down to whole pages (0: nothing)."""
        end = min(length, size - base)
        end -= max(PAGE, min(TRIPWIRE, length // 4 // PAGE * PAGE))
        return max(0, end // PAGE * PAGE)

    async def push(self, ino: int, base: int, data: Buffer, asked: Asked) -> None:
        """Store ``data`` at ``base`` in the inode's page cache, in a worker thread, piece
        by piece from its end, each but what its reader has asked for (``asked``: where
        the reader's run of requests that holds an offset ends). A refusal costs
        only the push (the reader's requests fetch the bytes as before). The memoryview
        held by the thread keeps a reused receive buffer from being handed out again
        until the store has read it (chunks/bufpool.py)."""
        view = memoryview(data)
        try:
            pushed = await trio.to_thread.run_sync(self._store, ino, base, view, asked,
                                                   limiter=self.limiter)
        except OSError as exc:
            self.count("page_cache_push_errors", 1)
            log.debug("page cache push of inode %d at %d refused: %s", ino, base, exc)
            return
        finally:
            view.release()
        if pushed:  # (nothing, if the reader's requests had got there first)
            self.count("page_cache_pushes", 1)
            self.count("page_cache_pushed_bytes", pushed)
            self.delivered(pushed)

    def _store(self, ino: int, base: int, view: memoryview, asked: Asked) -> int:
        """Blocking: the pieces, from the end, less what the reader asked for (read
        without a lock: at worst a piece is pushed that a request also answers); returns
        the bytes pushed."""
        pushed = 0
        for lo in reversed(range(0, len(view), PIECE)):
            hi = min(lo + PIECE, len(view))
            start = -(-(asked(base + lo) - base) // PAGE) * PAGE  # requests reached here
            start = max(lo, start)
            if start >= hi:
                continue  # asked for; a piece below may not be (a look further on)
            with view[start:hi] as piece:
                self.store_pages(ino, base + start, piece)
            pushed += hi - start
        return pushed
