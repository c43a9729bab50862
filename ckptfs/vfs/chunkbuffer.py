"""An in-memory chunk under construction: staged in place, or a list of immutable parts.

A new chunk first written by a request of at least ``STAGE_MIN`` bytes (a save) is staged
(codec/staged.py): every write is copied into a reused page-aligned buffer as it arrives,
and the frame is later written from that buffer as it is. Other chunks (small files,
rewrites of stored chunks) keep the parts: sequential writes append the ``bytes`` object
the FUSE layer handed us, other writes (overwrite, holes) rebuild the chunk as one new
bytearray. Parts are never mutated in place, so a buffer can share parts with the copy
that is being stored in a worker thread; a staged chunk is copied instead (``copy``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..codec.staged import Staged

Buffer = bytes | bytearray | memoryview
# A new chunk first written by a request this large (or a whole chunk) is staged: a save's
# chunk, a large O_DIRECT frame. Small files stay parts (small frames are written buffered).
STAGE_MIN = 128 * 1024
_MAX_PARTS = 128
_MERGE = 64


class ChunkBuffer:
    __slots__ = ("parts", "length", "staged")

    def __init__(self, parts: Sequence[Buffer] = (), staged: Staged | None = None) -> None:
        self.parts: list[Buffer] = [p for p in parts if len(p)]
        self.length = sum(len(p) for p in self.parts)
        self.staged = staged  # the chunk's bytes are there, not in parts
        if staged is not None:
            assert not self.parts
            self.length = staged.length

    def copy(self) -> ChunkBuffer:
        """An independent buffer with the same bytes (a staged chunk is copied once)."""
        if self.staged is not None:
            return ChunkBuffer([self.staged.slice(0, self.length)])
        return ChunkBuffer(self.parts)

    def content(self) -> Staged | list[Buffer]:
        """What the store writes: the staged chunk, or the parts."""
        return self.staged if self.staged is not None else self.parts

    def joined(self) -> bytes:
        if self.staged is not None:
            return self.staged.slice(0, self.length)
        if len(self.parts) == 1 and isinstance(self.parts[0], bytes):
            return self.parts[0]
        return b"".join(self.parts)

    def write(self, at: int, data: Buffer) -> None:
        n = len(data)
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
            if len(self.parts) > _MAX_PARTS:
                # Many small appends: merge the tail, so writev stays under IOV_MAX.
                self.parts[-_MERGE:] = [b"".join(self.parts[-_MERGE:])]
            return
        whole = bytearray(self.joined())
        whole[at : at + n] = data
        self.parts = [whole]
        self.length = len(whole)

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
