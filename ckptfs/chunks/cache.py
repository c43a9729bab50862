"""The read cache of decoded chunks: an LRU of verified plaintext, with the chunks a
sequential reader read to their end going first and the chunks fetched ahead of a reader
counted (readahead stops at half the cache). Its chunks' receive buffers go back to the
pool (chunks/bufpool.py) when they leave it. The trio thread only."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from ..catalog import ChunkRef
from ..codec import frame
from .bufpool import FramePool

# Chunks read to their end by sequential readers that stay cached (a late request of the
# kernel for a piece of one is still served from memory); older ones leave the cache.
CONSUMED_KEEP = 64 * 1024 * 1024


class ReadCache:
    def __init__(self, limit: int, keep: int, count: Callable[[str], None]) -> None:
        self.entries: OrderedDict[bytes, frame.Buffer] = OrderedDict()
        self.bytes = 0
        self.limit = limit
        # Cached chunks a sequential reader read to their end, oldest first, with lengths.
        self._consumed: OrderedDict[bytes, int] = OrderedDict()
        self._consumed_bytes = 0
        # Chunks fetched (or being fetched) ahead of a reader and not read yet, with their
        # lengths: readahead stops at half the cache, so what it fetched is not evicted
        # unread (and fetched again) when many files are read at once.
        self._ahead: dict[bytes, int] = {}
        self._ahead_bytes = 0
        # Receive buffers of remote GETs and of local O_DIRECT reads, reused when their
        # chunks leave the cache (chunks/bufpool.py); as many idle as GETs run at once
        # (``keep``), and more while the cache has room for them: when several readers'
        # files end together, 9-10 chunks left the cache at once, and the buffers beyond 8
        # were unmapped and made again a moment later (performance-history.md, "Cold reads
        # on a quiet VM (session 22)").
        self.frames = FramePool(keep=keep, count=count, room=self.room)

    def get(self, digest: bytes) -> frame.Buffer | None:
        """A cached chunk, now the most recently used (None: not cached)."""
        data = self.entries.get(digest)
        if data is not None:
            self.entries.move_to_end(digest)
            self.read_again(digest)
        return data

    def __contains__(self, digest: bytes) -> bool:
        return digest in self.entries

    def room(self) -> int:
        """Bytes the read cache could still take: what idle receive buffers may hold."""
        return max(0, self.limit - self.bytes)

    def put(self, digest: bytes, data: frame.Buffer) -> None:
        if len(data) > self.limit:
            return
        if digest in self.entries:
            self.entries.move_to_end(digest)
            return
        self.entries[digest] = data
        self.bytes += len(data)
        while self.bytes > self.limit:
            self.uncache(next(iter(self.entries)))

    def uncache(self, digest: bytes) -> None:
        """The chunk leaves the cache; its receive buffer goes back to the pool."""
        data = self.entries.pop(digest, None)
        if data is None:
            return
        self.bytes -= len(data)
        self._unconsume(digest)
        self.forget_ahead([digest])
        self._recycle(data)

    def consumed(self, digest: bytes) -> None:
        """A sequential reader read this chunk to its end: it is the first to go when the
        cache is full, before the chunks the readahead fetched for what comes next (plain
        LRU evicted those, unread, and they were fetched again). Beyond CONSUMED_KEEP bytes
        of such chunks the oldest leave the cache at once, so their receive buffers are
        reused by the next reads: a restore otherwise filled the whole cache with chunks
        read to their end before any buffer came back, and every read until then faulted
        in fresh pages (the kernel zeroing 16 MiB per chunk)."""
        data = self.entries.get(digest)
        if data is None:
            return
        self.entries.move_to_end(digest, last=False)
        if digest not in self._consumed:
            self._consumed[digest] = len(data)
            self._consumed_bytes += len(data)
        while self._consumed_bytes > CONSUMED_KEEP:
            self.uncache(next(iter(self._consumed)))

    def read_again(self, digest: bytes) -> None:
        """A cached chunk is read again. One read to its end stays among the consumed
        chunks, as the newest: the usual cause is a late request of the kernel for an
        earlier piece of it (pyfuse3 runs requests concurrently, so the last MiB of a chunk
        is often answered before the one before it). Taking it out of them, as before, kept
        it and its receive buffer in the cache until the LRU limit: a 1 GiB cold read grew
        the cache to 19 chunks and read 42 % of its chunks into fresh buffers (profile,
        performance-history.md "Cold read profile (session 21)"). A reader that really comes back
        to it keeps it for another CONSUMED_KEEP bytes of consumed chunks."""
        if digest in self._consumed:
            self._consumed.move_to_end(digest)

    def _unconsume(self, digest: bytes) -> None:
        n = self._consumed.pop(digest, None)
        if n is not None:
            self._consumed_bytes -= n

    def _recycle(self, data: frame.Buffer) -> None:
        """A chunk left the cache: its receive buffer (if a GET read it into one of the
        pool's) is reused once no reply or copy-back views it any more."""
        if isinstance(data, memoryview):
            self.frames.give(data.obj)

    def reserve_ahead(self, ref: ChunkRef) -> bool:
        """Room to fetch this chunk ahead of its reader: True (and counted until it is
        read, evicted or forgotten) if the chunks fetched ahead and not read yet stay
        within half the cache."""
        if ref.digest in self._ahead:
            return True
        if self._ahead and self._ahead_bytes + ref.length > self.limit // 2:
            return False
        self._ahead[ref.digest] = ref.length
        self._ahead_bytes += ref.length
        return True

    def forget_ahead(self, digests: Iterable[bytes]) -> None:
        """These chunks no longer count as fetched ahead (read, evicted, or their
        readahead ended without them)."""
        for d in digests:
            n = self._ahead.pop(d, None)
            if n is not None:
                self._ahead_bytes -= n

    def forget_keys(self, key_ids: set[int]) -> None:
        """Keys were shredded: cached plaintext they sealed leaves the cache (reads of it
        go to the tiers, where its frames no longer open)."""
        for digest, data in list(self.entries.items()):
            if frame.opened_key_id(data) in key_ids:
                self.uncache(digest)
