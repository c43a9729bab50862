"""An in-memory chunk under construction, kept as a list of immutable parts.

Sequential writes, the hot path, only append the ``bytes`` object the FUSE layer handed us:
no copy on the trio thread. Other writes (overwrite, holes) rebuild the chunk as one new
bytearray. Parts are never mutated in place, so a buffer can share parts with the copy
that is being stored in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence

Buffer = bytes | bytearray | memoryview
_MAX_PARTS = 128
_MERGE = 64


class ChunkBuffer:
    __slots__ = ("parts", "length")

    def __init__(self, parts: Sequence[Buffer] = ()) -> None:
        self.parts: list[Buffer] = [p for p in parts if len(p)]
        self.length = sum(len(p) for p in self.parts)

    def copy(self) -> ChunkBuffer:
        return ChunkBuffer(self.parts)

    def joined(self) -> bytes:
        if len(self.parts) == 1 and isinstance(self.parts[0], bytes):
            return self.parts[0]
        return b"".join(self.parts)

    def write(self, at: int, data: Buffer) -> None:
        n = len(data)
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
