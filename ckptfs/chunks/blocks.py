"""Digests of a chunk's 1 MiB blocks, so that part of a chunk can be read with every byte
still checked.

A chunk's digest covers all of it (up to 16 MiB): a read of 1 MiB from a chunk not in
memory fetches and hashes the whole frame. A page-cache reader whose cache lost a few
pages (this kernel reclaims cold page cache within seconds) pays that for every hole.
When the daemon has just verified a whole chunk (read back against its digest), it also
keeps the blake3 digest of each 1 MiB block of those same bytes; a later read of part of
the chunk can then fetch only the blocks it covers and check each against its digest.
The guarantee is the one the whole-chunk check gives (blake3 collision resistance): the
block digests come from bytes that matched the catalog's digest, in this process. They
are kept in memory only (32 bytes per MiB, a bounded LRU): nothing of the on-disk
formats changes, and after a restart a chunk is read whole again first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import blake3

from ..codec.frame import Buffer

BLOCK = 1 << 20
DIGEST = 32


def of_buffer(data: Buffer) -> bytes:
    """The blake3 digests of each BLOCK of ``data``, concatenated (the last may be short)."""
    view = memoryview(data).cast("B")
    return b"".join(blake3.blake3(view[at:at + BLOCK]).digest()
                    for at in range(0, len(view), BLOCK))


def count(length: int) -> int:
    return (length + BLOCK - 1) // BLOCK


def check(digests: bytes, first: int, data: Buffer) -> bool:
    """True if ``data`` are whole blocks of the chunk from block ``first`` on (the chunk's
    last block may be short), each matching its digest."""
    view = memoryview(data).cast("B")
    for i, at in enumerate(range(0, len(view), BLOCK)):
        want = digests[(first + i) * DIGEST:(first + i + 1) * DIGEST]
        if len(want) != DIGEST or blake3.blake3(view[at:at + BLOCK]).digest() != want:
            return False
    return True


class BlockDigests:
    """The block digests of recently verified chunks, at most ``budget`` bytes of them
    (least recently used go first). Thread-safe: workers put, readers get."""

    def __init__(self, budget: int = 16 << 20) -> None:
        self.budget = budget
        self._lock = threading.Lock()
        self._map: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0

    def put(self, digest: bytes, digests: bytes) -> None:
        with self._lock:
            old = self._map.pop(digest, None)
            if old is not None:
                self._bytes -= len(old)
            self._map[digest] = digests
            self._bytes += len(digests)
            while self._bytes > self.budget and self._map:
                _, gone = self._map.popitem(last=False)
                self._bytes -= len(gone)

    def get(self, digest: bytes) -> bytes | None:
        with self._lock:
            got = self._map.get(digest)
            if got is not None:
                self._map.move_to_end(digest)
            return got

    def __contains__(self, digest: bytes) -> bool:
        with self._lock:
            return digest in self._map

    def forget(self, digests: Sequence[bytes]) -> None:
        with self._lock:
            for d in digests:
                old = self._map.pop(d, None)
                if old is not None:
                    self._bytes -= len(old)
