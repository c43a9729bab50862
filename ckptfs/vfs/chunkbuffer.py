"""An in-memory chunk under construction: a list of immutable parts, or staged in place.

Writes append the ``bytes`` object the FUSE layer handed us as it is: the trio thread
copies no byte of a save. The store hashes the parts in its worker thread and writes them
(with O_DIRECT, the tier copies them into a reused aligned buffer there and compares the
copy: tiers/direct.py). Parts are never mutated in place, so a buffer can share parts with
the copy that is being stored in a worker thread. Other writes (overwrite, holes) rebuild
a chunk as one new bytearray, except for a save's chunk (its first write at least
``STAGE_MIN`` bytes): its first overwrite stages it in place (codec/staged.py: one copy of
what it holds into a reused page-aligned buffer; later writes are copied in as they
arrive), so an overwrite costs its own bytes, not a rebuild; a staged chunk is copied
when it must be shared (``copy``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..codec.staged import Staged, StagePool

Buffer = bytes | bytearray | memoryview
# A new chunk first written by a request this large (or a whole chunk) is a save's: an
# overwrite stages it in place instead of rebuilding it. Small files stay parts always.
STAGE_MIN = 128 * 1024
_MAX_PARTS = 128
# A save's chunk keeps more (a 64 MiB chunk of 128 KiB requests: 512) before a merge
# copies any on the trio thread: a frame's writev takes IOV_MAX (1024) buffers.
_MAX_SAVE_PARTS = 1000
_MERGE = 64


class ChunkBuffer:
    __slots__ = ("parts", "length", "staged", "pool")

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
        # A save's chunk: staged in a buffer of this pool at its first overwrite.
        self.pool = pool

    def copy(self) -> ChunkBuffer:
        """An independent buffer with the same bytes (a staged chunk is copied once)."""
        if self.staged is not None:
            return ChunkBuffer([self.staged.slice(0, self.length)])
        return ChunkBuffer(self.parts)

    def content(self) -> Staged | list[Buffer]:
        """What the store writes: the staged chunk, or the parts (which its worker thread
        hashes, and copies into an aligned buffer for O_DIRECT)."""
        return self.staged if self.staged is not None else self.parts

    def buffers(self) -> list[Staged]:
        """The pool buffer it holds, let go: the chunk is done with (stored or dropped),
        no write of it is in flight."""
        out = [] if self.staged is None else [self.staged]
        self.staged = None
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
            if len(self.parts) > (_MAX_SAVE_PARTS if self.pool is not None else _MAX_PARTS):
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
        assert self.pool is not None
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
