"""`ckptfs prefetch PATH...`: stage files into the local tiers ahead of a restart.

Every regular file under the paths that names a chunk with no valid local copy is read
through the mount, one sequential reader per file and ``--jobs`` files at once, in large
reads. A sequential read of a chunk only a remote tier holds makes the daemon copy it to
a local tier in the background (``copy_back``, verified, recorded as a replica). The
command then polls the live catalog (read-only) until every chunk of those files has a
valid replica on a local tier the daemon serves, and exits:

* 0 when everything is local;
* 1 on a read error (the file is named), on ``--timeout``, or when the copy-backs stopped
  making progress after a second read pass (the number of chunks still only on a remote
  is given, with the files and how full the local tiers are: the daemon skips a copy-back
  that finds no room, and one of a chunk it answers from its memory cache);
* 2 on bad arguments (a path that does not exist or is outside a ckptfs mount).

Reads drop the pages they brought into the kernel page cache (``POSIX_FADV_DONTNEED``),
before and after, so staging neither fills the page cache nor is short-circuited by pages
cached earlier (a read the page cache answers never reaches the daemon).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

from ..catalog.protocols import ContentsCatalog, MetaCatalog, ReplicaCatalog
from ..errors import EXIT_DENIED, EXIT_USAGE, CkptfsError, UsageError
from ..stats import read_stats
from .live import mount_of, open_catalog, require_daemon, state_dir_readable

EXIT_OK = 0
EXIT_FAILED = 1

READ_SIZE = 8 * 1024 * 1024  # bytes per read() call
DROP_EVERY = 64 * 1024 * 1024  # drop the pages read so far this often
POLL_S = 0.25  # how often the catalog is read while waiting for copy-backs
STALL_S = 15.0  # after the reads: no chunk became local for this long -> read again / give up
REREADS = 1  # extra read passes over files whose chunks stalled


@dataclass
class FileItem:
    path: Path
    ino: int
    size: int


@dataclass
class MountJob:
    """The files of one ckptfs mount to stage."""

    mountpoint: Path
    state_dir: Path
    files: list[FileItem] = field(default_factory=list)


@dataclass
class ChunkStatus:
    """Where the chunks of the files stand (distinct chunks; bytes counted per file)."""

    chunks: int = 0
    remote_only: int = 0  # distinct chunks with no valid copy on a local tier
    file_bytes: int = 0  # bytes the files' extents cover
    local_bytes: int = 0  # of those, in chunks with a valid local copy
    incomplete: set[int] = field(default_factory=set)  # inodes naming a remote-only chunk


# -- catalog -------------------------------------------------------------------------------


def local_tier_names(catalog: MetaCatalog, state_dir: Path) -> list[str]:
    """The local tiers the running daemon serves (from its stats.json), else the local
    tiers the catalog records. A copy on a tier the daemon does not serve is no use."""
    stats = read_stats(state_dir)
    if stats and stats.get("tiers"):
        names = [str(t["name"]) for t in stats["tiers"] if t.get("kind") == "local"]
        if names:
            return names
    return [t["name"] for t in catalog.recorded_tiers() if t.get("kind", "local") == "local"]


def chunk_status(catalog: ContentsCatalog, inos: Sequence[int], local_tiers: Sequence[str]) -> ChunkStatus:
    """Read-only: for the files ``inos``, which chunks have a valid copy on ``local_tiers``."""
    st = ChunkStatus()
    seen: dict[bytes, bool] = {}
    for e in catalog.extent_replicas(inos, local_tiers):
        st.file_bytes += e.length
        if e.on_tiers:
            st.local_bytes += e.length
        else:
            st.incomplete.add(e.ino)
        seen.setdefault(e.digest, e.on_tiers)
    st.chunks = len(seen)
    st.remote_only = sum(1 for local in seen.values() if not local)
    return st


class TierUsageCatalog(MetaCatalog, ReplicaCatalog, Protocol):
    """The tiers recorded and what each one stores."""


def local_usage(catalog: TierUsageCatalog, state_dir: Path) -> list[str]:
    """One line per local tier: chunk bytes recorded there and free space on its device."""
    lines = []
    served = set(local_tier_names(catalog, state_dir))
    for t in catalog.recorded_tiers():
        if t.get("kind", "local") != "local" or t["name"] not in served:
            continue
        chunks, size = catalog.stored_on_tier(t["name"])
        text = f"{t['name']} ({t.get('path', '?')}): {size / 1e9:.2f} GB in {chunks} chunk(s)"
        with contextlib.suppress(OSError, KeyError):
            free = shutil.disk_usage(t["path"]).free
            text += f", {free / 1e9:.2f} GB free on its device"
        lines.append(text)
    return lines


# -- arguments -----------------------------------------------------------------------------


def group_by_mount(paths: Iterable[Path]) -> list[MountJob]:
    """Group the regular files under ``paths`` by mount; UsageError for a bad path."""
    jobs: dict[Path, MountJob] = {}
    seen: set[tuple[Path, int]] = set()
    for path in paths:
        found = mount_of(Path(os.path.realpath(path)))
        if found is not None:
            require_daemon(*found)  # a dead mount answers ENOTCONN, not "no such file"
        try:
            os.lstat(path)
        except FileNotFoundError:
            raise UsageError(f"{path}: no such file or directory") from None
        # Any other error (EACCES: a path inside another namespace) is the caller's.
        if found is None:
            raise UsageError(f"{path} is not inside a ckptfs mount")
        mnt, state_dir = found
        job = jobs.setdefault(state_dir, MountJob(mnt, state_dir))
        for f in _regular_files(Path(path)):
            if (state_dir, f.ino) not in seen:  # hard links: stage each inode once
                seen.add((state_dir, f.ino))
                job.files.append(f)
    return list(jobs.values())


def _regular_files(path: Path) -> Iterable[FileItem]:
    st = os.stat(path)  # a path named on the command line is followed if it is a link
    if stat.S_ISREG(st.st_mode):
        yield FileItem(path, st.st_ino, st.st_size)
        return
    if not stat.S_ISDIR(st.st_mode):
        return

    def fail(exc: OSError) -> None:
        raise exc

    for root, _dirs, names in os.walk(path, onerror=fail):
        for name in sorted(names):
            p = Path(root) / name
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                yield FileItem(p, st.st_ino, st.st_size)


# -- reading -------------------------------------------------------------------------------


class Reader:
    """Reads files sequentially through the mount, ``jobs`` at once, dropping the pages."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.bytes_read = 0
        self.errors: list[tuple[Path, OSError]] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._pending = 0

    def start(self, files: Sequence[FileItem]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="prefetch")
        # Largest first: the long files start early and the pool drains evenly.
        for f in sorted(files, key=lambda f: -f.size):
            with self._lock:
                self._pending += 1
            self._pool.submit(self._read_one, f)

    @property
    def done(self) -> bool:
        return self._pending == 0

    def _buffer(self) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = memoryview(bytearray(READ_SIZE))
        return buf

    def _read_one(self, item: FileItem) -> None:
        try:
            if not self.stop.is_set():
                self._read_file(item.path)
        except OSError as exc:
            with self._lock:
                self.errors.append((item.path, exc))
            self.stop.set()
        finally:
            with self._lock:
                self._pending -= 1

    def _read_file(self, path: Path) -> None:
        # The daemon stages the file itself (fetch, verify, write locally) and returns when
        # done; reading through the mount is the fallback for an older daemon, and for a
        # reader who does not own the file (control xattrs are the owner's: EPERM).
        try:
            os.setxattr(path, "user.ckptfs.prefetch", b"1", follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM,
                                 errno.EACCES):
                raise
        else:
            with self._lock:
                self.bytes_read += path.stat().st_size
            return
        buf = self._buffer()
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            # Pages cached earlier would answer the reads without the daemon seeing them.
            _drop(fd, 0, 0)
            off = dropped = 0
            while not self.stop.is_set():
                n = os.readv(fd, [buf])
                if n == 0:
                    break
                off += n
                with self._lock:
                    self.bytes_read += n
                if off - dropped >= DROP_EVERY:
                    _drop(fd, dropped, off - dropped)
                    dropped = off
            _drop(fd, 0, 0)
        finally:
            os.close(fd)

    def shutdown(self) -> None:
        self.stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _drop(fd: int, off: int, length: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, off, length, os.POSIX_FADV_DONTNEED)


# -- progress ------------------------------------------------------------------------------


class ProgressLine:
    """One updating line on a terminal; on a pipe, a plain line every 10 s at most."""

    def __init__(self, out: TextIO, total: int) -> None:
        self.out = out
        self.total = total
        self.tty = out.isatty()
        self.t0 = time.monotonic()
        self._last = 0.0
        self._width = 0

    def update(self, read: int, local: int, remote_only: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.2 if self.tty else 10.0):
            return
        self._last = now
        secs = max(now - self.t0, 1e-6)
        frac = local / self.total if self.total else 1.0
        bar = "#" * int(frac * 20)
        line = (f"prefetch [{bar:<20}] {frac * 100:3.0f}% {local / 1e9:.2f}/{self.total / 1e9:.2f} "
                f"GB local, read {read / secs / 1e6:.0f} MB/s, {remote_only} chunk(s) remote, "
                f"{secs:.0f} s")
        if self.tty:
            line = line[: max(20, shutil.get_terminal_size().columns - 1)]  # one line: no wrap
            pad = " " * max(0, self._width - len(line))
            self.out.write("\r" + line + pad)
            self._width = len(line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def finish(self) -> None:
        if self.tty and self._width:
            self.out.write("\n")
            self.out.flush()


# -- the command ---------------------------------------------------------------------------


def cmd_prefetch(paths: Sequence[Path], timeout: float | None, jobs: int) -> int:
    if jobs < 1:
        print(f"ckptfs prefetch: --jobs must be at least 1, got {jobs}", file=sys.stderr)
        return EXIT_USAGE
    if timeout is not None and timeout <= 0:
        print(f"ckptfs prefetch: --timeout must be positive, got {timeout:g}", file=sys.stderr)
        return EXIT_USAGE
    try:
        mounts = group_by_mount(paths)
    except UsageError as exc:
        print(f"ckptfs prefetch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):  # another namespace, or the mode bits
            print(f"ckptfs prefetch: {exc.filename}: permission denied (a namespace of other "
                  "users, or the mode bits)", file=sys.stderr)
            return EXIT_DENIED
        print(f"ckptfs prefetch: cannot list {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_FAILED
    deadline = None if timeout is None else time.monotonic() + timeout
    code = EXIT_OK
    for job in mounts:
        code = max(code, _prefetch_mount(job, deadline, timeout, jobs))
        if code == EXIT_FAILED:
            break
    return code


def _prefetch_through_mount(job: MountJob, jobs: int) -> int:
    """A user who cannot read the state dir (private to the daemon's user): the daemon
    stages each file on request (``user.ckptfs.prefetch``, which returns once the file's
    chunks are local, for the file's owner), ``jobs`` files at once."""
    t0 = time.monotonic()

    def one(f: FileItem) -> tuple[Path, OSError] | None:
        try:
            os.setxattr(f.path, "user.ckptfs.prefetch", b"1", follow_symlinks=False)
        except OSError as exc:
            return f.path, exc
        return None

    with ThreadPoolExecutor(jobs, thread_name_prefix="prefetch") as pool:
        errors = [e for e in pool.map(one, job.files) if e is not None]
    for path, exc in errors:
        print(f"ckptfs prefetch: staging {path} failed: {exc.strerror or exc}", file=sys.stderr)
    if errors:
        return EXIT_FAILED
    print(f"ckptfs prefetch: {len(job.files)} file(s) under {job.mountpoint}, "
          f"{sum(f.size for f in job.files) / 1e9:.2f} GB on the local tiers "
          f"({time.monotonic() - t0:.1f} s)")
    return EXIT_OK


def _prefetch_mount(job: MountJob, deadline: float | None, timeout: float | None, jobs: int) -> int:
    if not state_dir_readable(job.state_dir):
        return _prefetch_through_mount(job, jobs)
    catalog = open_catalog(job.state_dir)
    reader = Reader(jobs)
    try:
        local = local_tier_names(catalog, job.state_dir)
        if not local:
            raise CkptfsError(f"{job.state_dir}: the catalog records no local tier")
        by_ino = {f.ino: f for f in job.files}
        inos = list(by_ino)
        st = chunk_status(catalog, inos, local)
        t0 = time.monotonic()
        if st.remote_only == 0:
            print(f"ckptfs prefetch: {len(inos)} file(s) under {job.mountpoint}, "
                  f"{st.file_bytes / 1e9:.2f} GB: already on the local tiers")
            return EXIT_OK
        progress = ProgressLine(sys.stderr, st.file_bytes)
        reader.start([by_ino[i] for i in sorted(st.incomplete)])
        staging = _Staging(catalog, job.state_dir, by_ino, local, reader, progress, t0)
        return staging.wait(st.remote_only, deadline, timeout)
    finally:
        reader.shutdown()
        catalog.close()


class PrefetchCatalog(ContentsCatalog, TierUsageCatalog, Protocol):
    """What prefetch reads: the files' extents and replicas, the tiers and their usage."""


@dataclass
class _Staging:
    """The files being read: polls the catalog until every chunk is local, a read fails,
    the deadline passes, or the copy-backs stall."""

    catalog: PrefetchCatalog
    state_dir: Path
    by_ino: dict[int, FileItem]
    local: list[str]
    reader: Reader
    progress: ProgressLine
    t0: float

    def status(self) -> ChunkStatus:
        return chunk_status(self.catalog, list(self.by_ino), self.local)

    def wait(self, remote_only: int, deadline: float | None, timeout: float | None) -> int:
        reader = self.reader
        passes = 0
        best = remote_only
        last_change = time.monotonic()
        while True:
            st = self.status()
            self.progress.update(reader.bytes_read, st.local_bytes, st.remote_only)
            if reader.errors:
                return self._read_failed()
            if st.remote_only == 0:
                return self._staged(st)
            now = time.monotonic()
            if st.remote_only < best:
                best, last_change = st.remote_only, now
            elif not reader.done:
                last_change = now  # reading still goes on: copy-backs follow it
            if deadline is not None and now >= deadline:
                return self._give_up(st, f" after {timeout:.0f} s")
            if reader.done and now - last_change >= STALL_S:
                if passes >= REREADS:
                    return self._give_up(st, f": no copy-back for {STALL_S:.0f} s after "
                                             "reading everything")
                # A copy-back can be skipped (no room at that moment, or the chunk was
                # answered from a cache): read the files still incomplete once more.
                passes += 1
                last_change = now
                reader.start([self.by_ino[i] for i in sorted(st.incomplete)])
            time.sleep(POLL_S)  # the daemon records copy-backs in its own process: poll

    def _staged(self, st: ChunkStatus) -> int:
        reader = self.reader
        reader.shutdown()
        secs = time.monotonic() - self.t0
        self.progress.update(reader.bytes_read, st.local_bytes, 0, force=True)
        self.progress.finish()
        print(f"ckptfs prefetch: {len(self.by_ino)} file(s), {st.file_bytes / 1e9:.2f} GB on "
              f"the local tiers ({reader.bytes_read / 1e9:.2f} GB read in {secs:.1f} s, "
              f"{reader.bytes_read / max(secs, 1e-6) / 1e6:.0f} MB/s)")
        return EXIT_OK

    def _read_failed(self) -> int:
        self.reader.shutdown()
        self.progress.finish()
        for path, exc in self.reader.errors:
            print(f"ckptfs prefetch: staging {path} failed: {exc.strerror or exc}",
                  file=sys.stderr)
        if any(exc.errno == errno.ENOSPC for _, exc in self.reader.errors):
            st = self.status()
            print(f"ckptfs prefetch: {st.remote_only} of {st.chunks} chunk(s) still only "
                  "on a remote tier: the local tiers have no room", file=sys.stderr)
            _diagnose(self.catalog, self.state_dir, st, self.by_ino)
        return EXIT_FAILED

    def _give_up(self, st: ChunkStatus, why: str) -> int:
        """The deadline passed, or the copy-backs stalled after the last read pass."""
        self.reader.shutdown()
        self.progress.finish()
        print(f"ckptfs prefetch: {st.remote_only} of {st.chunks} chunk(s) still only on a "
              f"remote tier{why}", file=sys.stderr)
        _diagnose(self.catalog, self.state_dir, st, self.by_ino)
        return EXIT_FAILED


def _diagnose(catalog: TierUsageCatalog, state_dir: Path, st: ChunkStatus, by_ino: dict[int, FileItem]) -> None:
    """Name the files not yet local and where the local tiers stand. The daemon skips a
    copy-back when no local tier has room, and does not copy back a chunk it answers from
    its decoded-chunk cache (one read non-sequentially before, e.g. through mmap)."""
    names = [str(by_ino[i].path) for i in sorted(st.incomplete) if i in by_ino]
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    print(f"ckptfs prefetch: not yet local: {', '.join(names[:5])}{more}", file=sys.stderr)
    print("ckptfs prefetch: local tiers: " + "; ".join(local_usage(catalog, state_dir)),
          file=sys.stderr)
    print("ckptfs prefetch: a copy-back is skipped when no local tier has room (device full or "
          "its `capacity` reached), or when the daemon serves the chunk from its memory cache "
          "(after a non-sequential read of it); in that case run prefetch again later or "
          "after a remount", file=sys.stderr)
