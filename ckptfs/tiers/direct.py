"""Frame files written with O_DIRECT from reused page-aligned buffers, and checked.

Why: a buffered write copies each frame into fresh page-cache pages (on a VM, a host fault
per page) and leaves the device write to the final fsync. With O_DIRECT the frame is copied
once into an aligned buffer that is reused (no fresh pages) and sent to the device while
the writer goes on, so an fsync has little left to do.

What is checked against what (docs/semantics.md, "Verification"): the chunk's digest is
computed over its parts; the aligned buffer is compared byte for byte with those parts
before it is written (equal bytes have the chunk's digest), which is the check the
buffered read-back from the page cache made. With ``read_back`` (tier key
``verify_writes = "device"``) the frame is also read back from the device with O_DIRECT
and compared again: that checks the device, at the price of a device read per chunk.
Comparisons are memcmp calls, not a second blake3 pass, and run with the GIL released.
A frame's last partial block goes through the page cache from the same compared buffer
(``_write_frame``); buffered frames are read back and compared the same way
(``read_back_and_compare``).

Reads of large frames (``read_whole``, ``read_into`` a reused buffer) use O_DIRECT too: the
frame goes from the device into the buffer it is served from, without a page-cache copy in
between.

Not every filesystem takes O_DIRECT (tmpfs, some FUSE and overlay setups): ``supported``
probes a directory once, and the tier falls back to buffered writes there.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import threading
from collections.abc import Sequence

from ..codec.frame import Buffer
from ..errors import CorruptChunk

ALIGN = 4096  # covers every logical block size in use (512 and 4096)
MIN_FRAME = 1024 * 1024  # smaller frames (small files) stay buffered: no gain, more syscalls
_KEEP = 4  # idle buffers a pool keeps; more are unmapped when given back
_GRAIN = 1024 * 1024  # buffer sizes are rounded up to this, so one size serves every chunk

_libc = ctypes.CDLL(None, use_errno=True)  # CDLL calls release the GIL
_libc.memcmp.restype = ctypes.c_int
_libc.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_libc.sync_file_range.restype = ctypes.c_int
_libc.sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range, do not wait
_NOT_SUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE}


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def supported(directory: str) -> bool:
    """True if files in ``directory`` can be opened with O_DIRECT (probed with a temp file)."""
    path = os.path.join(directory, f".direct-probe.{os.getpid()}.{threading.get_ident()}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    try:
        buf = mmap.mmap(-1, ALIGN)
        try:
            os.pwrite(fd, buf, 0)  # some filesystems accept the open and refuse the write
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return False
            raise
        finally:
            buf.close()
        return True
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


class BufferPool:
    """Page-aligned anonymous buffers, reused so frame copies never land on fresh pages."""

    def __init__(self, keep: int = _KEEP) -> None:
        self._keep = keep
        self._idle: list[mmap.mmap] = []
        self._lock = threading.Lock()  # dict/list operations only

    def take(self, size: int) -> mmap.mmap:
        with self._lock:
            for i, buf in enumerate(self._idle):
                if len(buf) >= size:
                    return self._idle.pop(i)
        return mmap.mmap(-1, _round_up(size, _GRAIN))

    def give(self, buf: mmap.mmap) -> None:
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(buf)
                return
        buf.close()


def _address(buf: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def _copy(base: int, at: int, part: Buffer, view: memoryview) -> None:
    """Copy ``part`` to ``base + at`` with the GIL released (ctypes.memmove), so the copy
    of a 16 MiB frame does not hold up the trio thread; a slice assignment would."""
    n = len(part)
    if isinstance(part, bytes):
        ctypes.memmove(base + at, part, n)
        return
    src = memoryview(part)
    if not src.readonly and src.contiguous:
        holder = (ctypes.c_char * n).from_buffer(src)
        ctypes.memmove(base + at, ctypes.addressof(holder), n)
        return
    view[at : at + n] = src  # a read-only view (a truncated chunk's part): rare


def _same(base: int, at: int, part: Buffer) -> bool:
    """The buffer at ``base + at`` holds exactly ``part`` (memcmp, without copying part)."""
    n = len(part)
    if isinstance(part, bytes):
        return _libc.memcmp(base + at, part, n) == 0
    view = memoryview(part)
    if not view.readonly and view.contiguous:
        holder = (ctypes.c_char * n).from_buffer(view)
        return _libc.memcmp(base + at, ctypes.addressof(holder), n) == 0
    return _libc.memcmp(base + at, bytes(view), n) == 0  # a read-only view: rare, copy


def read_whole(fd: int, size: int) -> memoryview:
    """The ``size`` bytes of the file ``fd`` (opened with O_DIRECT), read from the device
    into an aligned region of a new bytearray: no page-cache copy, and the caller may keep
    (and slice) the result. A short read returns what was read (the frame check fails)."""
    padded = _round_up(size, ALIGN)
    holder = bytearray(padded + ALIGN)
    skip = -ctypes.addressof(ctypes.c_char.from_buffer(holder)) % ALIGN
    return _read_aligned(fd, size, memoryview(holder)[skip : skip + padded])


def read_into(fd: int, size: int, buf: mmap.mmap) -> memoryview:
    """Like ``read_whole``, into ``buf`` (an anonymous mapping: page-aligned, at least
    ``aligned_size(size)`` bytes), a buffer the caller reuses. Why: a new bytearray is
    zeroed by Python with the GIL held, a page fault per 4 KiB, for every chunk read
    (the trio thread waited for it); a reused mapping has its pages already, and a new
    one is faulted in by the kernel inside the read, with the GIL released."""
    return _read_aligned(fd, size, memoryview(buf)[: _round_up(size, ALIGN)])


def aligned_size(size: int) -> int:
    """The room an O_DIRECT read of a ``size``-byte file needs (whole blocks)."""
    return _round_up(size, ALIGN)


def _read_aligned(fd: int, size: int, view: memoryview) -> memoryview:
    got = 0
    while got < size:
        n = os.preadv(fd, [view[got:]], got)
        if n == 0:
            break
        got += n
    return view[:got]


def _compare(base: int, parts: Sequence[Buffer], what: str) -> None:
    at = 0
    for p in parts:
        if not _same(base, at, p):
            raise CorruptChunk(f"{what} differs from the chunk's bytes at offset {at}")
        at += len(p)


def _write_frame(fd: int, view: memoryview, size: int) -> None:
    """Write ``view[:size]`` at offset 0 of ``fd`` (O_DIRECT): the whole blocks with
    O_DIRECT, the last partial block (a frame is its header plus the chunk, so there is one)
    through the page cache from the same buffer. Why not one padded O_DIRECT write and an
    ftruncate to ``size``, as before: ext4 zeroes the cut block in a truncate, which reads
    it back from the device and takes a journal handle; with four writers fsyncing, that
    waited on the journal's commits for about a third as long as the device writes took."""
    whole = size // ALIGN * ALIGN
    done = 0
    while done < whole:
        done += os.pwritev(fd, [view[done:whole]], done)
    if whole == size:
        return
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
    try:
        while done < size:
            done += os.pwritev(fd, [view[done:size]], done)
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)  # the read-back reads from the device
    # Start the tail's writeback now: its block is allocated here, with the whole blocks'
    # (one journal transaction), not in each frame's fsync, which would then need a
    # journal commit of its own.
    if _libc.sync_file_range(fd, whole, size - whole, _SYNC_FILE_RANGE_WRITE) != 0:
        err = ctypes.get_errno()
        if err not in _NOT_SUPPORTED:  # only a hint; a device error or ENOSPC is real
            raise OSError(err, os.strerror(err))


def read_back_and_compare(
    fd: int, parts: Sequence[Buffer], size: int, pool: BufferPool
) -> None:
    """A frame just written to ``fd`` through the page cache: read it back into a reused
    buffer and compare it with ``parts`` (memcmp, GIL released). The check the earlier
    read-back plus blake3 made (what the page cache holds is what was hashed), without a
    second hash pass or a fresh buffer per frame."""
    _read_back(fd, parts, size, pool, size + 1, "the frame read back")  # one byte more:
    # a longer file is not the frame


def _read_back(
    fd: int, parts: Sequence[Buffer], size: int, pool: BufferPool, room: int, what: str
) -> None:
    """Read up to ``room`` bytes of ``fd`` into a reused buffer; exactly ``size`` must come
    back, equal to ``parts`` (CorruptChunk otherwise)."""
    buf = pool.take(room)
    try:
        view = memoryview(buf)
        try:
            got = len(_read_aligned(fd, room, view[:room]))
            if got != size:
                raise CorruptChunk(f"{what}: {got} bytes of a {size}-byte frame")
            _compare(_address(buf), parts, what)
        finally:
            view.release()
    finally:
        pool.give(buf)


def _aligned(parts: Sequence[Buffer]) -> memoryview | None:
    """The frame as one page-aligned writable view, if it is handed over as one (a chunk
    staged in place, codec/staged.py): O_DIRECT can write it as it lies."""
    if len(parts) != 1 or not isinstance(parts[0], memoryview):
        return None
    view = parts[0]
    if view.readonly or not view.c_contiguous:
        return None
    holder = (ctypes.c_char * view.nbytes).from_buffer(view)
    return view if ctypes.addressof(holder) % ALIGN == 0 else None


def _read_back_direct(fd: int, parts: Sequence[Buffer], size: int, pool: BufferPool) -> None:
    """Read the frame just written to ``fd`` back from the device (O_DIRECT) into a
    reused buffer and compare it with ``parts``."""
    _read_back(fd, parts, size, pool, _round_up(size, ALIGN),
               "the frame read back from the device")


def write_checked(
    fd: int, parts: Sequence[Buffer], size: int, pool: BufferPool, read_back: bool
) -> None:
    """Write ``parts`` (``size`` bytes) at offset 0 of the new file ``fd`` (opened with
    O_DIRECT, read-write) from an aligned buffer, after checking that the buffer holds
    exactly ``parts``. A frame handed over as one page-aligned buffer (a staged chunk) is
    written from that buffer itself: the digest was computed over exactly those bytes, so
    there is no copy to check. With ``read_back`` the frame is then read back from the
    device and compared again. Raises OSError from the device, CorruptChunk on a
    difference."""
    whole = _aligned(parts)
    if whole is not None:
        _write_frame(fd, whole, size)
        if read_back:
            _read_back_direct(fd, parts, size, pool)
        return
    padded = _round_up(size, ALIGN)
    buf = pool.take(padded)
    try:
        view = memoryview(buf)
        base = _address(buf)
        try:
            at = 0
            for p in parts:
                _copy(base, at, p, view)
                at += len(p)
            _compare(base, parts, "the buffer sent to the device")
            _write_frame(fd, view, size)
            if not read_back:
                return
            got = 0
            while got < size:
                n = os.preadv(fd, [view[got:padded]], got)
                if n == 0:
                    break
                got += n
            if got != size:
                raise CorruptChunk(f"read back {got} of {size} bytes from the device")
            _compare(base, parts, "the frame read back from the device")
        finally:
            view.release()
    finally:
        pool.give(buf)
