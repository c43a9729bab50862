"""A local tier: a directory standing for one NVMe device.

Layout: ``<root>/chunks/<2 hex>/<64 hex digest>`` frames, written to ``<root>/tmp/`` first
and renamed into place, so a key never names a half-written frame.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..codec.frame import Buffer
from ..config import TierConfig
from ..errors import CorruptChunk, NoSpace, TierError
from . import direct
from .base import TierUsage, verify_by_reading

_NOSPACE = {errno.ENOSPC, errno.EDQUOT}
DIR_MODE = 0o700


def _private_dir(path: Path) -> None:
    """0700, whatever the umask (mkdir's mode passes through it) or an older version made."""
    if stat.S_IMODE(os.stat(path).st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)


class LocalTier:
    kind = "local"
    request_grace_s = 0.0  # a call that returned is over

    def __init__(self, cfg: TierConfig) -> None:
        self.name = cfg.name
        self.location = cfg.location
        self.weight = cfg.weight
        self.capacity = cfg.capacity
        self.root = cfg.path
        self._chunks = self.root / "chunks"
        self._tmp = self.root / "tmp"
        self._lock = threading.Lock()
        self._used = 0  # bytes of frames stored here; scanned at open, then tracked
        # Large frames go to the device with O_DIRECT and are checked there by put itself
        # (tiers/direct.py), if the filesystem takes it; decided when the tier opens.
        self._direct_wanted = cfg.direct_io
        self._direct = False  # O_DIRECT wanted and taken by the filesystem (decided at open)
        self._read_back = cfg.verify_writes == "device"
        # Every put checks its frame itself (O_DIRECT: the buffer sent; buffered: a
        # read-back compared with the parts), so no separate verify follows it.
        self.verified_put = True
        self._buffers = direct.BufferPool()
        self._linked = hasattr(os, "O_TMPFILE")  # small frames named by a link (_put_linked)

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        """Create the layout and count what is stored. Leftover temp files are removed:
        they are puts that never completed (a crash), never referenced by anything. The
        chunk directories are made 0700 (chunk files are 0600): no other user lists them."""
        try:
            for d in (self._chunks, self._tmp):
                d.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
                _private_dir(d)
            for entry in os.scandir(self._tmp):
                os.unlink(entry.path)
            used = 0
            for sub in os.scandir(self._chunks):
                if sub.is_dir():
                    _private_dir(Path(sub.path))
                    for f in os.scandir(sub.path):
                        used += f.stat().st_size
            self._used = used
            self._direct = self._direct_wanted and direct.supported(str(self._tmp))
        except OSError as exc:
            raise TierError(f"tier {self.name}: cannot open {self.root}: {exc.strerror}") from exc
        if self._read_back and not self._direct:
            raise TierError(
                f"tier {self.name}: verify_writes = \"device\" needs O_DIRECT, which "
                + ("direct_io = false turns off" if not self._direct_wanted
                   else f"the filesystem of {self.root} refuses")
            )

    def check(self) -> None:
        """Raise TierError if the tier's directory is gone or unusable."""
        if not self._chunks.is_dir() or not os.access(self._chunks, os.W_OK):
            raise TierError(f"tier {self.name}: directory {self._chunks} is missing or not writable")

    # -- the Tier protocol -------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self._chunks / key[:2] / key

    def put(self, key: str, parts: Sequence[Buffer], expected_sha256: str | None = None) -> int:
        """Store the frame under ``key``, all or nothing, checked before it gets its name
        (CorruptChunk if it differs from ``parts``): a large O_DIRECT frame by comparing the
        buffer sent to the device (and with ``verify_writes = "device"`` its read-back),
        a buffered one by reading it back from the page cache and comparing."""
        size = sum(len(p) for p in parts)
        if self.capacity is not None:
            with self._lock:
                if self._used + size > self.capacity:
                    raise NoSpace(f"tier {self.name}: capacity {self.capacity} bytes reached")
                self._used += size  # reserve now, so parallel puts cannot overshoot the cap
        else:
            with self._lock:
                self._used += size
        final = self._path(key)
        tmp: Path | None = None
        try:
            large = self._direct and size >= direct.MIN_FRAME
            if not large and self._linked and self._put_linked(final, parts, size):
                return size
            tmp = self._tmp / f"{key[:16]}.{uuid.uuid4().hex}"
            if large:
                self._write_direct(tmp, parts, size)
            else:
                self._write_buffered(tmp, parts, size)
            self._rename_into_place(tmp, final)
        except (OSError, CorruptChunk) as exc:
            with self._lock:
                self._used -= size
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if isinstance(exc, CorruptChunk):
                raise CorruptChunk(f"tier {self.name}: put {key[:16]}: {exc}") from exc
            if exc.errno in _NOSPACE:
                raise NoSpace(f"tier {self.name}: device full ({exc.strerror})") from exc
            raise TierError(f"tier {self.name}: put {key[:16]}: {exc.strerror}") from exc
        return size

    def _rename_into_place(self, tmp: Path, final: Path) -> None:
        try:
            replaced = final.stat().st_size  # same key = same content: a harmless rewrite
        except FileNotFoundError:
            replaced = 0
        try:
            os.rename(tmp, final)
        except FileNotFoundError:
            final.parent.mkdir(mode=DIR_MODE, exist_ok=True)
            _private_dir(final.parent)
            os.rename(tmp, final)
        if replaced:
            with self._lock:
                self._used -= replaced

    def _put_linked(self, final: Path, parts: Sequence[Buffer], size: int) -> bool:
        """A buffered frame written to an unnamed file in ``tmp/`` (O_TMPFILE), read back
        from the same descriptor (with ``verified_put``), then named by one link: the key
        appears with the whole frame or not at all, as with a rename, with one directory
        change instead of three (create in tmp/, rename out of it, into chunks/) and no
        second open; a crash before the link leaves nothing behind. False (nothing done)
        where the filesystem has no O_TMPFILE or the key exists: the caller renames."""
        try:
            fd = os.open(self._tmp, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                self._linked = False  # decided once: this filesystem cannot
                return False
            raise
        try:
            _write_all(fd, parts, size)
            direct.read_back_and_compare(fd, parts, size, self._buffers)
            try:
                try:
                    os.link(str(fd), final, src_dir_fd=_proc_fd(), follow_symlinks=True)
                except FileNotFoundError:
                    final.parent.mkdir(mode=DIR_MODE, exist_ok=True)
                    _private_dir(final.parent)
                    os.link(str(fd), final, src_dir_fd=_proc_fd(), follow_symlinks=True)
            except FileExistsError:
                # The key exists (the same bytes, also from a concurrent put): rewritten by
                # rename, as before, which replaces a bad old copy.
                return False
        finally:
            os.close(fd)
        return True

    def _write_direct(self, tmp: Path, parts: Sequence[Buffer], size: int) -> None:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_DIRECT, 0o600)
        try:
            direct.write_checked(fd, parts, size, self._buffers, self._read_back)
        finally:
            os.close(fd)

    def _write_buffered(self, tmp: Path, parts: Sequence[Buffer], size: int) -> None:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, parts, size)
            direct.read_back_and_compare(fd, parts, size, self._buffers)
        finally:
            os.close(fd)

    def get(self, key: str) -> Buffer | None:
        return self._get(key, None)

    def get_into(self, key: str, take: Callable[[int], mmap.mmap | None]) -> Buffer | None:
        """Like ``get``, but a large frame lands in ``take(n)`` (a reused page-aligned
        anonymous mapping of at least ``n`` bytes, chunks/bufpool.py: no fresh pages to
        fault in, nothing to zero) and comes back as a view of it, read with O_DIRECT where
        the tier uses it; a small frame, or ``take`` giving None or too small a buffer: as
        ``get``."""
        return self._get(key, take)

    def _get(self, key: str, take: Callable[[int], mmap.mmap | None] | None) -> Buffer | None:
        path = self._path(key)
        try:
            # O_DIRECT where it works: a large frame skips the page cache; a small one is
            # read buffered from the same descriptor (O_DIRECT cleared), not opened twice.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if self._direct else 0))
            try:
                size = os.fstat(fd).st_size
                if size >= direct.MIN_FRAME:
                    room = direct.aligned_size(size)
                    buf = None if take is None else take(room)
                    if buf is not None and len(buf) >= room:
                        return direct.read_into(fd, size, buf)
                    if self._direct:
                        return direct.read_whole(fd, size)
                elif self._direct:
                    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
                return os.pread(fd, size + 1, 0)  # one byte more: a frame that grew shows
            finally:
                os.close(fd)
        except FileNotFoundError:
            if not self._chunks.is_dir():
                raise TierError(f"tier {self.name}: directory {self._chunks} vanished") from None
            return None
        except OSError as exc:
            raise TierError(f"tier {self.name}: get {key[:16]}: {exc.strerror}") from exc

    def has(self, key: str) -> bool:
        return self._path(key).exists()

    def verify(self, key: str, digest: bytes) -> None:
        verify_by_reading(self, key, digest)

    def delete(self, key: str) -> int:
        path = self._path(key)
        try:
            size = path.stat().st_size
            os.unlink(path)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise TierError(f"tier {self.name}: delete {key[:16]}: {exc.strerror}") from exc
        with self._lock:
            self._used -= size
        return size

    def sync(self, keys: Sequence[str]) -> None:
        """fsync the frames and the directories that name them."""
        dirs = set()
        try:
            for key in keys:
                path = self._path(key)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                dirs.add(path.parent)
            for d in dirs:
                fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise TierError(f"tier {self.name}: fsync: {exc.strerror}") from exc

    def list_keys(self) -> Iterator[str]:
        try:
            for sub in os.scandir(self._chunks):
                if sub.is_dir():
                    for f in os.scandir(sub.path):
                        yield f.name
        except OSError as exc:
            raise TierError(f"tier {self.name}: listing failed: {exc.strerror}") from exc

    def usage(self) -> TierUsage:
        try:
            st = os.statvfs(self._chunks)
            dev = os.stat(self._chunks).st_dev
        except OSError as exc:
            raise TierError(f"tier {self.name}: statvfs: {exc.strerror}") from exc
        total = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize
        if self.capacity is not None:
            total = min(total, self.capacity)
            free = max(0, min(free, self.capacity - self._used))
        return TierUsage(
            total=total, free=free, used=self._used, device=dev, capped=self.capacity is not None
        )


def _write_all(fd: int, parts: Sequence[Buffer], size: int) -> None:
    written = os.writev(fd, parts)
    while written < size:  # writev may be short on huge frames
        joined = b"".join(bytes(p) for p in parts)
        written += os.write(fd, joined[written:])


_proc: tuple[int, int] | None = None  # (pid, descriptor of /proc/self/fd)
_proc_lock = threading.Lock()


def _proc_fd() -> int:
    """A descriptor of this process's /proc/self/fd, for linkat of an O_TMPFILE file by its
    descriptor number (AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH). Opened once per
    process (a forked child opens its own: the parent's would name the parent's files)."""
    global _proc
    with _proc_lock:
        if _proc is None or _proc[0] != os.getpid():
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
            _proc = (os.getpid(), os.open("/proc/self/fd", flags))
        return _proc[1]
