"""A local tier: a directory standing for one NVMe device.

Layout: ``<root>/chunks/<2 hex>/<64 hex digest>`` frames, written to ``<root>/tmp/`` first
and renamed into place, so a key never names a half-written frame.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..chunks.frame import Buffer
from ..config import TierConfig
from ..errors import NoSpace, TierError
from .base import TierUsage, verify_by_reading

_NOSPACE = {errno.ENOSPC, errno.EDQUOT}
DIR_MODE = 0o700


def _private_dir(path: Path) -> None:
    """0700, whatever the umask (mkdir's mode passes through it) or an older version made."""
    if stat.S_IMODE(os.stat(path).st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)


class LocalTier:
    kind = "local"

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
        except OSError as exc:
            raise TierError(f"tier {self.name}: cannot open {self.root}: {exc.strerror}") from exc

    def check(self) -> None:
        """Raise TierError if the tier's directory is gone or unusable."""
        if not self._chunks.is_dir() or not os.access(self._chunks, os.W_OK):
            raise TierError(f"tier {self.name}: directory {self._chunks} is missing or not writable")

    # -- the Tier protocol -------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self._chunks / key[:2] / key

    def put(self, key: str, parts: Sequence[Buffer], expected_sha256: str | None = None) -> int:
        # Local frames are checked by reading them back (verify), not by a wire checksum.
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
        tmp = self._tmp / f"{key[:16]}.{uuid.uuid4().hex}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                written = os.writev(fd, parts)
                while written < size:  # writev may be short on huge frames
                    joined = b"".join(bytes(p) for p in parts)
                    written += os.write(fd, joined[written:])
            finally:
                os.close(fd)
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
        except OSError as exc:
            with self._lock:
                self._used -= size
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if exc.errno in _NOSPACE:
                raise NoSpace(f"tier {self.name}: device full ({exc.strerror})") from exc
            raise TierError(f"tier {self.name}: put {key[:16]}: {exc.strerror}") from exc
        return size

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                return f.read()
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
