"""A chunk assembled in place, in a reused page-aligned buffer behind room for its header.

Why: pyfuse3 hands every write over as a fresh ``bytes``. Kept as the chunk's parts until
the chunk is stored, 16 MiB of them per chunk land on pages malloc has just taken from the
kernel (on this VM, a host fault per page) and are copied once more into an aligned
buffer for O_DIRECT, then compared with that copy. A staged chunk is copied out of each
write's ``bytes`` as it arrives, into a buffer that a pool keeps mapped, and compared with
it there while both are in the CPU's cache (that ``bytes`` is then freed and malloc reuses
it). The frame is this very buffer: the header is packed into the room before the chunk
(``frame``), the digest is computed over the chunk as it lies there, and the frame goes to
the device from the same memory (tiers/direct.py): no second copy, no second compare.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap

from ..errors import CorruptChunk
from .frame import HEADER_SIZE, Buffer, header

ALIGN = 4096

_libc = ctypes.CDLL(None, use_errno=True)  # CDLL calls release the GIL
_libc.memcmp.restype = ctypes.c_int
_libc.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


def _address(buf: mmap.mmap) -> int:
    # The temporary ctypes object (a buffer export) dies at once; the address stays valid
    # as long as the mapping lives.
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _source(data: Buffer) -> bytes | int:
    """What ctypes.memmove can read ``data`` from without copying it (the caller holds
    ``data``, so an address stays valid)."""
    if isinstance(data, bytes):
        return data
    view = memoryview(data)
    if not view.readonly and view.contiguous:
        return ctypes.addressof((ctypes.c_char * view.nbytes).from_buffer(view))
    return bytes(view)  # a read-only view: rare, copy


class Staged:
    """One chunk's bytes at offset HEADER_SIZE of a page-aligned buffer. Only its owner
    (the open file that writes it, then the store that writes its frame) touches it."""

    __slots__ = ("buf", "base", "length", "capacity")

    def __init__(self, buf: mmap.mmap, capacity: int) -> None:
        self.buf = buf
        self.base = _address(buf)
        self.length = 0
        self.capacity = capacity  # chunk bytes it may hold

    def write(self, at: int, data: Buffer) -> None:
        """Bytes ``data`` at chunk offset ``at``; a gap after the current end reads as zeros.
        The copy is compared with ``data`` at once (while both are in the CPU's cache), so
        the digest computed over the staged chunk is that of the bytes pyfuse3 handed over
        (docs/semantics.md, "Verification"). Copy and compare release the GIL (ctypes).
        CorruptChunk if they differ."""
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        if at + n > self.capacity:
            raise ValueError(f"write of {n} bytes at {at} past a {self.capacity}-byte chunk")
        if at > self.length:
            ctypes.memset(self.base + HEADER_SIZE + self.length, 0, at - self.length)
        src = _source(data)
        dst = self.base + HEADER_SIZE + at
        ctypes.memmove(dst, src, n)
        if _libc.memcmp(dst, src, n) != 0:
            raise CorruptChunk(f"a write of {n} bytes at chunk offset {at} was not copied exactly")
        self.length = max(self.length, at + n)

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def body(self) -> memoryview:
        return memoryview(self.buf)[HEADER_SIZE : HEADER_SIZE + self.length]

    def slice(self, lo: int, hi: int) -> bytes:
        hi = min(hi, self.length)
        if lo >= hi:
            return b""
        return self.buf[HEADER_SIZE + lo : HEADER_SIZE + hi]

    def frame(self, digest: bytes) -> memoryview:
        """The raw frame of the chunk (digest computed over ``body()``), in place: its
        header is packed into the room before the chunk. Page-aligned, so it can be
        written with O_DIRECT as it is."""
        self.buf[:HEADER_SIZE] = header(self.length, digest)
        return memoryview(self.buf)[: HEADER_SIZE + self.length]


class StagePool:
    """Buffers for staged chunks of one size, kept mapped for reuse: a save's chunks land
    on pages that are already there. At most ``keep`` are kept (the memory budget's worth,
    which a save may fill anyway). Whenever the last buffer in use comes back (no chunk is
    being written), the idle ones are marked MADV_FREE: the kernel takes their pages if it
    needs memory (an idle daemon holds nothing it must keep), and otherwise the next save
    reuses them without a fault. Used on the trio thread only."""

    def __init__(self, chunk_size: int, keep: int) -> None:
        self.chunk_size = chunk_size
        self.size = -(-(HEADER_SIZE + chunk_size) // ALIGN) * ALIGN
        self.keep = keep
        self._idle: list[mmap.mmap] = []
        self.in_use = 0
        self.made = 0  # buffers mapped (statistics; tests)

    def take(self) -> Staged:
        self.in_use += 1
        if self._idle:
            return Staged(self._idle.pop(), self.chunk_size)
        self.made += 1
        # Private, not mmap's default shared mapping (shmem): MADV_FREE needs private pages.
        buf = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return Staged(buf, self.chunk_size)

    def give(self, staged: Staged) -> None:
        """``staged`` is done with (stored or dropped): its buffer serves a later chunk.
        One still viewed (a memoryview outlived the write) or beyond ``keep`` is let go
        (unmapped when its last reference goes)."""
        self.in_use -= 1
        if len(self._idle) < self.keep and _unviewed(staged.buf):
            self._idle.append(staged.buf)
        if self.in_use == 0:
            for buf in self._idle:
                with contextlib.suppress(OSError):  # a hint; a kernel without it keeps them
                    buf.madvise(_MADV_FREE)

    def clear(self) -> None:
        self._idle.clear()


_MADV_FREE = getattr(mmap, "MADV_FREE", mmap.MADV_DONTNEED)


def _unviewed(buf: mmap.mmap) -> bool:
    try:
        buf.resize(len(buf))  # an mmap with live exports refuses to resize (BufferError)
    except BufferError:
        return False
    return True
