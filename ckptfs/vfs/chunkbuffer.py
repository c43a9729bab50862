"""An in-memory chunk under construction: a list of immutable parts, or staged in place.

Sequential writes append the ``bytes`` object the FUSE layer handed us, as they are: the
trio thread copies no byte of them. A new chunk first written by a request of at least
``STAGE_MIN`` bytes (a save) is assembled by the store: at dispatch it takes a reused
page-aligned buffer (codec/staged.py) and hands it the parts, which the worker thread that
hashes and writes the chunk copies in (``Staged.assemble``), so its frame is written from
that buffer as it is. Other chunks (small files, rewrites of stored chunks) are stored as
their parts. An overwrite of a save's chunk stages it in place on the spot (one copy of
what it holds; later writes are copied in as they arrive); other writes into a chunk
(overwrite, holes) of the rest rebuild it as one new bytearray. Parts are never mutated in
place, so a buffer can share parts with the copy that is being stored in a worker thread;
a staged chunk is copied instead (``copy``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..codec.staged import Staged, StagePool

Buffer = bytes | bytearray | memoryview
# A new chunk first written by a request this large (or a whole chunk) is staged: a save's
# chunk, a large O_DIRECT frame. Small files stay parts (small frames are written buffered).
STAGE_MIN = 128 * 1024
_MAX_PARTS = 128
_MERGE = 64


class ChunkBuffer:
    __slots__ = ("parts", "length", "staged", "pool", "handed")

    def __init__(
        self, parts: Sequence[Buffer] = (), staged: Staged | None = None,
        pool: StagePool | None = None,
    ) -> None:
        self.parts: list[Buffer] = [p for p in parts if len(p)]
        self.length = sum(len(p) for p in self.parts)
        self.staged = staged  # the chunk's bytes are there, not in parts
        if staged is not None:
            assert not self.parts
            self.length = staged.length
        # A save's chunk: stored from a buffer of this pool (``content``), or staged in
        # place at its first overwrite.
        self.pool = pool
        # The buffer ``content`` handed the parts to (the store assembles them there); the
        # parts stay the chunk's bytes for reads until it is stored.
        self.handed: Staged | None = None

    def copy(self) -> ChunkBuffer:
        """An independent buffer with the same bytes (a staged chunk is copied once)."""
        if self.staged is not None:
            return ChunkBuffer([self.staged.slice(0, self.length)])
        return ChunkBuffer(self.parts)

    def content(self) -> Staged | list[Buffer]:
        """What the store writes (once, on the trio thread: the chunk is no longer written
        to): the staged chunk; a save's parts handed to a buffer of the pool, which the
        store's worker thread assembles them in; or the parts."""
        if self.staged is not None:
            return self.staged
        if self.pool is not None and self.parts:
            assert self.handed is None
            self.handed = self.pool.take()
            self.handed.hand(self.parts)
            return self.handed
        return self.parts

    def buffers(self) -> list[Staged]:
        """The pool buffers it holds, let go: the chunk is done with (stored or dropped),
        no copy or write of them is in flight."""
        out = [s for s in (self.staged, self.handed) if s is not None]
        self.staged = self.handed = None
        return out

    def joined(self) -> bytes:
        if self.staged is not None:
            return self.staged.slice(0, self.length)
        if len(self.parts) == 1 and isinstance(self.parts[0], bytes):
            return self.parts[0]
        return b"".join(self.parts)

    def write(self, at: int, data: Buffer) -> None:
        n = len(data)
        if self.staged is None and self.pool is not None and at < self.length:
            self._stage()  # an overwrite of a save's chunk: in place from now on
        if self.staged is not None:
            self.staged.write(at, data)
            self.length = self.staged.length
            return
        if at > self.length:
            self.parts.append(bytes(at - self.length))  # a hole inside the chunk: zeros
            self.length = at
        if at == self.length:
            self.parts.append(data)
            self.length += n
            if len(self.parts) > _MAX_PARTS and self.pool is None:
                # Many small appends: merge the tail, so writev stays under IOV_MAX.
                self.parts[-_MERGE:] = [b"".join(self.parts[-_MERGE:])]
            return
        whole = bytearray(self.joined())
        whole[at : at + n] = data
        self.parts = [whole]
        self.length = len(whole)

    def _stage(self) -> None:
        """Copy the parts into a buffer of the pool (on the trio thread, as every write
        of a save's chunk was before the store assembled them): an overwrite then costs
        its own bytes, not a rebuild of the chunk."""
        assert self.pool is not None and self.handed is None
        staged = self.pool.take()
        try:
            at = 0
            for p in self.parts:
                staged.write(at, p)
                at += len(p)
        except BaseException:
            self.pool.give(staged)
            raise
        self.staged, self.parts = staged, []

    def truncate(self, length: int) -> None:
        if length >= self.length:
            return
        if self.staged is not None:
            self.staged.truncate(length)
            self.length = self.staged.length
            return
        kept: list[Buffer] = []
        left = length
        for p in self.parts:
            if left <= 0:
                break
            kept.append(p if len(p) <= left else memoryview(p)[:left])
            left -= len(p)
        self.parts = kept
        self.length = length

    def slice(self, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of the chunk; short if the chunk holds less."""
        if self.staged is not None:
            return self.staged.slice(lo, hi)
        out = []
        pos = 0
        for p in self.parts:
            end = pos + len(p)
            if end > lo and pos < hi:
                out.append(memoryview(p)[max(lo - pos, 0) : min(hi, end) - pos])
            if end >= hi:
                break
            pos = end
        return b"".join(out)
