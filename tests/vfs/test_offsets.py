"""Large offsets and arbitrary byte names in the filesystem core, without the kernel.

Offsets up to the largest the kernel accepts (2**63 - 1) either work or fail with EFBIG
(past MAX_FILE_SIZE), and never read back wrong: a float in the chunk count of a commit
once dropped the last chunk of a file larger than 2**53 from the open file's extents
(zeros until a remount). The state machine checks names (any bytes but ``/`` and NUL, up
to 255) and offsets against a reference model after every step, across restarts.
"""

from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.vfs.test_vfs import CS, RW, make_fs

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.vfs.context import ROOT
from ckptfs.vfs.filesystem import Filesystem
from ckptfs.vfs.openfile import MAX_FILE_SIZE

T = TypeVar("T")
KERNEL_MAX = 2**63 - 1  # the largest offset + 1 the kernel lets through (MAX_LFS_FILESIZE)
MARK = b"TAIL-MARKER"


async def _errno_of(aw: Awaitable[Any]) -> int:
    try:
        await aw
    except CkptfsError as exc:
        return exc.errno
    return 0


@pytest.mark.parametrize("off", [2**53 + 1, 2**55 + CS - 10, 2**57, 2**59 + CS - 1,
                                 MAX_FILE_SIZE - len(MARK)])
async def test_a_write_at_a_large_offset_reads_back_before_and_after_a_restart(
    tmp_path: Path, off: int
) -> None:
    tiers: list[Tier] = [MemoryTier("a")]
    async with make_fs(tmp_path, tiers) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        assert await fs.write(fh, off, MARK) == len(MARK)
        await fs.fsync(fh)
        assert bytes(await fs.read(fh, off, len(MARK))) == MARK  # the same handle
        await fs.release(fh)
        fh = await fs.open(inode.ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, off - 5, 5 + len(MARK) + 5)) == bytes(5) + MARK
        await fs.release(fh)
        assert (await fs.getattr(inode.ino)).size == off + len(MARK)
        # A truncate into the marker keeps what is below the cut, also on a large chunk index.
        await fs.setattr(inode.ino, size=off + 4)
        fh = await fs.open(inode.ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, off, 100)) == MARK[:4]
        await fs.release(fh)
    async with make_fs(tmp_path, tiers) as fs:
        fh = await fs.open(inode.ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, off, 100)) == MARK[:4]
        await fs.release(fh)


async def test_past_the_largest_file_size_writes_and_truncates_fail_with_efbig(
    tmp_path: Path,
) -> None:
    async with make_fs(tmp_path, [MemoryTier("a")]) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        for off in (MAX_FILE_SIZE, 2**62, KERNEL_MAX - len(MARK)):
            assert await _errno_of(fs.write(fh, off, MARK)) == errno.EFBIG
        # Across the bound: cut short there, as Linux does at a filesystem's maximum.
        assert await fs.write(fh, MAX_FILE_SIZE - 4, MARK) == 4
        await fs.fsync(fh)
        assert bytes(await fs.read(fh, MAX_FILE_SIZE - 8, 100)) == bytes(4) + MARK[:4]
        assert await _errno_of(fs.setattr(inode.ino, size=MAX_FILE_SIZE + 1)) == errno.EFBIG
        await fs.release(fh)
        assert (await fs.getattr(inode.ino)).size == MAX_FILE_SIZE
        # Without an open writer (a truncate committed at once) it is refused too.
        assert await _errno_of(fs.setattr(inode.ino, size=KERNEL_MAX)) == errno.EFBIG
        assert (await fs.getattr(inode.ino)).size == MAX_FILE_SIZE


# -- the state machine -----------------------------------------------------------------------

class FsThread:
    """A Filesystem (``make_fs``) served by a trio loop in a thread of its own, so that the
    state machine's rules (plain functions) can call into it; ``restart`` stops it as a
    crash would and builds a new one on the same catalog and tiers."""

    def __init__(self, path: Path, tiers: list[Tier]) -> None:
        self.path, self.tiers = path, tiers
        self.fs: Filesystem
        self._token: trio.lowlevel.TrioToken
        self._stop: trio.Event
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        ready = threading.Event()
        self._error = None
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self, ready: threading.Event) -> None:
        async def main() -> None:
            async with make_fs(self.path, self.tiers) as fs:
                self.fs, self._token, self._stop = fs, trio.lowlevel.current_trio_token(), trio.Event()
                ready.set()
                await self._stop.wait()

        try:
            trio.run(main)
        except BaseException as exc:
            self._error = exc
        finally:
            ready.set()

    def stop(self) -> None:
        if self._thread is None:
            return
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error

    def restart(self) -> None:
        self.stop()
        self.start()

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kw: Any) -> T:
        async def run() -> T:
            return await fn(*args, **kw)

        try:
            return trio.from_thread.run(run, trio_token=self._token)
        except trio.RunFinishedError:
            if self._thread is not None:
                self._thread.join()
            raise AssertionError(f"the filesystem's loop ended: {self._error!r}") from self._error

    def close(self, fh: int) -> None:
        """close(2) as the kernel sends it: FLUSH (the commit), then RELEASE."""
        try:
            self.call(self.fs.flush, fh)
        finally:
            self.call(self.fs.release, fh)

    def errno_of(self, fn: Callable[..., Awaitable[Any]], *args: Any, **kw: Any) -> int:
        """0 if the call succeeded, else its errno (a CkptfsError; anything else fails)."""
        try:
            self.call(fn, *args, **kw)
        except CkptfsError as exc:
            return exc.errno
        return 0


class Model:
    """A file as the reference sees it: its size and its writes, in order (sparse: a
    write at 2**59 costs what it wrote)."""

    def __init__(self) -> None:
        self.size = 0
        self.writes: list[tuple[int, bytes]] = []
        self.xattrs: dict[bytes, bytes] = {}

    def write(self, off: int, data: bytes) -> None:
        self.writes.append((off, data))
        self.size = max(self.size, off + len(data))

    def truncate(self, size: int) -> None:
        kept = []
        for off, data in self.writes:
            if off < size:
                kept.append((off, data[: size - off]))
        self.writes, self.size = kept, size

    def read(self, off: int, n: int) -> bytes:
        end = min(off + n, self.size)
        out = bytearray(max(0, end - off))
        for w_off, data in self.writes:
            lo, hi = max(off, w_off), min(end, w_off + len(data))
            if lo < hi:
                out[lo - off : hi - off] = data[lo - w_off : hi - w_off]
        return bytes(out)

    def windows(self) -> list[tuple[int, int]]:
        """Ranges worth reading back: around each write's ends, and the file's end."""
        spots = [(max(0, off - 3), len(data) + 6) for off, data in self.writes]
        return [*spots, (0, 16), (max(0, self.size - 20), 40)]


def _name(raw: bytes) -> bytes:
    # Any bytes but "/" and NUL, and not "." or "..": what the kernel lets through.
    name = raw.replace(b"/", b"\xff").replace(b"\0", b"\xfe")
    return b"\xff." if name in (b".", b"..") else name


NAMES = st.one_of(
    st.sampled_from([b"x-\xff", b"\xff" * 255, b"a" * 255, b"\xc3\x28", b"\xed\xa0\x80", b"-",
                     b"\n", b" ", b"caf\xe9", b"checkpoint-1\xff"]),
    st.binary(min_size=1, max_size=255).map(_name),
)
TOO_LONG = st.integers(256, 300).map(lambda n: b"\xff" * n)
# Offsets: small ones around chunk ends, then any up to the kernel's largest, with a bias
# for chunk ends and the places where a float or the size bound would go wrong.
SPOTS = [0, 1, CS - 1, CS, 2**31, 2**32, 2**53 - 1, 2**53 + 1, 2**55 + CS - 10, 2**57,
         MAX_FILE_SIZE - CS, MAX_FILE_SIZE - 11, MAX_FILE_SIZE - 1, MAX_FILE_SIZE,
         MAX_FILE_SIZE + 1, 2**62, KERNEL_MAX - 300]
OFFSETS = st.one_of(
    st.integers(0, 3 * CS),
    st.sampled_from(SPOTS),
    st.integers(0, MAX_FILE_SIZE),
    st.builds(lambda k, d: max(0, k * CS + d), st.integers(0, MAX_FILE_SIZE // CS),
              st.integers(-16, 16)),
    st.integers(MAX_FILE_SIZE, KERNEL_MAX - 300),
)
LENGTHS = st.one_of(st.sampled_from([1, 11, CS - 1, CS, CS + 1]), st.integers(1, 300))
PICK = st.tuples(st.sampled_from([True, True, True, False]), st.integers(0, 10**6), NAMES)


class Symlink:
    def __init__(self, target: bytes) -> None:
        self.target = target


class EmptyDir:
    """A directory of the model (kept empty: its names are the run directory's job)."""


Entry = Model | Symlink | EmptyDir
TARGETS = st.binary(min_size=1, max_size=300).map(lambda b: b.replace(b"\0", b"\xfe"))
XATTR_NAMES = st.binary(min_size=1, max_size=200).map(
    lambda b: b"user." + b.replace(b"\0", b"\xfe"))


class NamesAndOffsets(RuleBasedStateMachine):
    """Creates, writes, reads, truncates, renames, links, symlinks, directories, unlinks
    and xattrs with arbitrary byte names and offsets, in a directory with a non-UTF-8
    name, against ``Model``; restarts keep everything (every file is closed after each
    call)."""

    fs_thread: FsThread  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[bytes, Entry] = {}  # hard links share one Model
        self.dir = 0

    @property
    def files(self) -> dict[bytes, Model]:
        return {n: e for n, e in self.entries.items() if isinstance(e, Model)}

    @initialize(names=st.lists(NAMES, min_size=1, max_size=3, unique=True))
    def clear(self, names: list[bytes]) -> None:
        t = self.fs_thread
        for _, name, _ in t.call(t.fs.readdir, ROOT_INODE, 0):
            self._remove_tree(ROOT_INODE, name)
        self.dir = t.call(t.fs.mkdir, ROOT_INODE, b"run-\xff\xfe", 0o755, ROOT).ino
        for name in names:
            self.create(name)

    def _remove_tree(self, parent: int, name: bytes) -> None:
        t = self.fs_thread
        inode = t.call(t.fs.lookup, parent, name)
        if inode.is_dir:
            for _, child, _ in t.call(t.fs.readdir, inode.ino, 0):
                self._remove_tree(inode.ino, child)
            t.call(t.fs.rmdir, parent, name)
        else:
            t.call(t.fs.unlink, parent, name)

    def _pick(self, pick: tuple[bool, int, bytes], among: Any = None) -> bytes:
        names = sorted(self.entries if among is None else among)
        existing, i, fresh = pick
        return names[i % len(names)] if existing and names else fresh

    def _file_ino(self, name: bytes) -> int | None:
        """The inode of file ``name``; None if the model has no file there (checked:
        ENOENT, or not a regular file)."""
        t = self.fs_thread
        try:
            inode = t.call(t.fs.lookup, self.dir, name)
        except CkptfsError as exc:
            assert name not in self.entries and exc.errno == errno.ENOENT, (name, exc)
            return None
        assert inode.is_reg == isinstance(self.entries.get(name), Model), name
        return inode.ino if inode.is_reg else None

    @rule(name=NAMES)
    def create(self, name: bytes) -> None:
        t = self.fs_thread
        try:
            fh, _ = t.call(t.fs.create, self.dir, name, 0o644, RW, ROOT)
        except CkptfsError as exc:
            assert name in self.entries and exc.errno == errno.EEXIST, (name, exc)
            return
        assert name not in self.entries, name
        t.close(fh)
        self.entries[name] = Model()

    @rule(name=TOO_LONG)
    def create_too_long(self, name: bytes) -> None:
        t = self.fs_thread
        assert t.errno_of(t.fs.create, self.dir, name, 0o644, RW, ROOT) == errno.ENAMETOOLONG

    @rule(name=NAMES)
    def mkdir(self, name: bytes) -> None:
        t = self.fs_thread
        got = t.errno_of(t.fs.mkdir, self.dir, name, 0o755, ROOT)
        assert got == (errno.EEXIST if name in self.entries else 0), (name, got)
        self.entries.setdefault(name, EmptyDir())

    @rule(name=NAMES, to=TARGETS)
    def symlink(self, name: bytes, to: bytes) -> None:
        t = self.fs_thread
        got = t.errno_of(t.fs.symlink, self.dir, name, to, ROOT)
        assert got == (errno.EEXIST if name in self.entries else 0), (name, got)
        self.entries.setdefault(name, Symlink(to))

    @precondition(lambda self: self.files)
    @rule(src=PICK, name=NAMES)
    def link(self, src: tuple[bool, int, bytes], name: bytes) -> None:
        a, t = self._pick(src, self.files), self.fs_thread
        ino = self._file_ino(a)
        if ino is None:
            return
        got = t.errno_of(t.fs.link, ino, self.dir, name)
        assert got == (errno.EEXIST if name in self.entries else 0), (a, name, got)
        self.entries.setdefault(name, self.entries[a])

    @precondition(lambda self: self.files)
    @rule(pick=PICK, off=OFFSETS, n=LENGTHS, seed=st.integers(0, 2**32), sync=st.booleans())
    def write(self, pick: tuple[bool, int, bytes], off: int, n: int, seed: int,
              sync: bool) -> None:
        name, t = self._pick(pick, self.files), self.fs_thread
        data = random.Random(seed).randbytes(n)
        ino = self._file_ino(name)
        if ino is None:
            return
        fh = t.call(t.fs.open, ino, RW)
        try:
            try:
                done = t.call(t.fs.write, fh, off, data)
            except CkptfsError as exc:
                assert off >= MAX_FILE_SIZE and exc.errno == errno.EFBIG, (off, exc)
                return
            assert off < MAX_FILE_SIZE and done == min(n, MAX_FILE_SIZE - off), (off, n, done)
            model = self.entries[name]
            assert isinstance(model, Model)
            model.write(off, data[:done])
            assert bytes(t.call(t.fs.read, fh, off, done)) == data[:done], off  # uncommitted
            if sync:  # the same handle, after its commit (issue 33: zeros at 2**57)
                t.call(t.fs.fsync, fh)
                assert bytes(t.call(t.fs.read, fh, off, done)) == data[:done], off
        finally:
            t.close(fh)

    @precondition(lambda self: self.files)
    @rule(pick=PICK, size=OFFSETS)
    def truncate(self, pick: tuple[bool, int, bytes], size: int) -> None:
        name, t = self._pick(pick, self.files), self.fs_thread
        ino = self._file_ino(name)
        if ino is None:
            return
        got = t.errno_of(t.fs.setattr, ino, size=size)
        assert got == (errno.EFBIG if size > MAX_FILE_SIZE else 0), (size, got)
        model = self.entries[name]
        if not got and isinstance(model, Model):
            model.truncate(size)

    @precondition(lambda self: self.files)
    @rule(pick=PICK, xname=XATTR_NAMES, value=st.binary(max_size=300), remove=st.booleans())
    def xattr(self, pick: tuple[bool, int, bytes], xname: bytes, value: bytes,
              remove: bool) -> None:
        name, t = self._pick(pick, self.files), self.fs_thread
        ino = self._file_ino(name)
        if ino is None:
            return
        model = self.entries[name]
        assert isinstance(model, Model)
        if remove:
            if model.xattrs and value:  # mostly one that is there
                xname = sorted(model.xattrs)[len(value) % len(model.xattrs)]
            got = t.errno_of(t.fs.removexattr, ino, xname)
            assert got == (0 if xname in model.xattrs else errno.ENODATA), (xname, got)
            model.xattrs.pop(xname, None)
        else:
            want = errno.ERANGE if len(xname) > 255 else 0
            assert t.errno_of(t.fs.setxattr, ino, xname, value) == want, xname
            if not want:
                model.xattrs[xname] = value

    @rule(src=PICK, dst=PICK)
    def rename(self, src: tuple[bool, int, bytes], dst: tuple[bool, int, bytes]) -> None:
        a, b, t = self._pick(src), self._pick(dst), self.fs_thread
        got = t.errno_of(t.fs.rename, self.dir, a, self.dir, b, 0, ROOT)
        old, new = self.entries.get(a), self.entries.get(b)
        if old is None:
            want = errno.ENOENT
        elif new is None or old is new:  # the same inode (or name): nothing changes
            want = 0
        elif isinstance(old, EmptyDir):
            want = 0 if isinstance(new, EmptyDir) else errno.ENOTDIR
        else:
            want = errno.EISDIR if isinstance(new, EmptyDir) else 0
        assert got == want, (a, b, got, want)
        if not want and old is not new:
            self.entries[b] = self.entries.pop(a)

    @rule(pick=PICK)
    def unlink(self, pick: tuple[bool, int, bytes]) -> None:
        name, t = self._pick(pick), self.fs_thread
        got = t.errno_of(t.fs.unlink, self.dir, name)
        entry = self.entries.get(name)
        want = (errno.ENOENT if entry is None else
                errno.EISDIR if isinstance(entry, EmptyDir) else 0)
        assert got == want, (name, got, want)
        if not want:
            del self.entries[name]

    @rule(pick=PICK)
    def rmdir(self, pick: tuple[bool, int, bytes]) -> None:
        name, t = self._pick(pick), self.fs_thread
        got = t.errno_of(t.fs.rmdir, self.dir, name)
        entry = self.entries.get(name)
        want = (errno.ENOENT if entry is None else
                0 if isinstance(entry, EmptyDir) else errno.ENOTDIR)
        assert got == want, (name, got, want)
        if not want:
            del self.entries[name]

    @rule()
    def restart(self) -> None:
        self.fs_thread.restart()

    @invariant()
    def matches_the_model(self) -> None:
        if not self.dir:
            return
        t = self.fs_thread
        listed = {name for _, name, _ in t.call(t.fs.readdir, self.dir, 0)}
        assert listed == set(self.entries)
        inos: dict[int, int] = {}  # Model id -> inode number: hard links share one
        for name, entry in self.entries.items():
            inode = t.call(t.fs.lookup, self.dir, name)
            if isinstance(entry, Symlink):
                assert t.call(t.fs.readlink, inode.ino) == entry.target, name
                continue
            if isinstance(entry, EmptyDir):
                assert inode.is_dir and not t.call(t.fs.readdir, inode.ino, 0), name
                continue
            assert inode.is_reg and inode.size == entry.size, name
            assert inos.setdefault(id(entry), inode.ino) == inode.ino, name
            links = sum(1 for e in self.entries.values() if e is entry)
            assert inode.nlink == links, name
            assert sorted(t.call(t.fs.listxattr, inode.ino)) == sorted(entry.xattrs), name
            for xname, value in entry.xattrs.items():
                assert t.call(t.fs.getxattr, inode.ino, xname) == value, (name, xname)
            fh = t.call(t.fs.open, inode.ino, os.O_RDONLY)
            try:
                for off, n in entry.windows():
                    assert bytes(t.call(t.fs.read, fh, off, n)) == entry.read(off, n), (name, off)
            finally:
                t.call(t.fs.release, fh)


def test_names_and_offsets_against_a_model(tmp_path: Path) -> None:
    """The VFS without the kernel and without a checkpoint tracker (make_fs builds none):
    with one, a rename of a name that is not UTF-8 ends the loop in the tracker's catalog
    call (issue 33 item 3, fixed separately)."""
    fs_thread = FsThread(tmp_path, [MemoryTier("a"), MemoryTier("b")])
    fs_thread.start()
    try:
        class Machine(NamesAndOffsets):
            pass

        Machine.fs_thread = fs_thread
        run_state_machine_as_test(Machine, settings=settings(
            max_examples=int(os.environ.get("CKPTFS_FUZZ_EXAMPLES", "40")),
            stateful_step_count=25, deadline=None, database=None,
            suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
        ))
    finally:
        fs_thread.stop()
