"""Differential test: random operation sequences on ckptfs and on a plain directory.

A hypothesis state machine applies the same operations (create/open, write, pwrite past EOF
and across the 256 KiB chunk boundaries, truncate, rename of files and directories, unlink,
mkdir, rmdir, symlink, chmod, read, reopen, close, unmount+remount) to a real ckptfs mount
and to a reference directory on the host filesystem. Every operation must have the same
outcome on both sides (return value, or errno), and after every step the two trees must be
identical: names, types, modes, sizes, contents and link targets, plus the live size of
every open file.

One mount serves the whole test; the tree is cleared between examples.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

CHUNK = 256 * 1024  # must match conftest.TEST_MOUNT_ARGS
MAX_OPEN = 5

NAMES = ["a", "b", "c", ".d"]
name = st.sampled_from(NAMES)
paths = st.one_of(
    name,
    st.tuples(name, name).map("/".join),
    st.tuples(name, name, name).map("/".join),
)
BOUNDARIES = [0, 1, 4095, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, 3 * CHUNK + 7]
offsets = st.one_of(st.sampled_from(BOUNDARIES), st.integers(0, 3 * CHUNK + 100))
lengths = st.one_of(
    st.sampled_from([0, 1, 2, 100, 4096, CHUNK - 1, CHUNK, CHUNK + 1]), st.integers(0, 2 * CHUNK + 10)
)
payloads = st.tuples(st.integers(0, 2**32), lengths).map(lambda t: random.Random(t[0]).randbytes(t[1]))
sizes = st.one_of(st.sampled_from(BOUNDARIES), st.integers(0, 3 * CHUNK + 100))
handle_index = st.integers(0, MAX_OPEN - 1)

OPEN_MODES = {
    "r": os.O_RDONLY,
    "rw": os.O_RDWR,
    "w+trunc": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "rw+creat": os.O_RDWR | os.O_CREAT,
    "rw+excl": os.O_RDWR | os.O_CREAT | os.O_EXCL,
    "append": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "rw+trunc": os.O_RDWR | os.O_TRUNC,
}

Outcome = tuple[str, Any]


def outcome(fn: Callable[[], Any]) -> Outcome:
    try:
        return ("ok", fn())
    except OSError as e:
        return ("err", errno.errorcode.get(e.errno or 0, e.errno))


def clear_tree(root: Path) -> None:
    for n in os.listdir(root):
        p = root / n
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def describe(o: Outcome) -> str:
    if o[0] == "ok" and isinstance(o[1], bytes | bytearray):
        return f"ok({len(o[1])} bytes)"
    return repr(o)


class Handle:
    def __init__(self, fs_fd: int, ref_fd: int, path: str, mode: str) -> None:
        self.fs_fd, self.ref_fd, self.path, self.mode = fs_fd, ref_fd, path, mode


class CkptfsVsPlainDir(RuleBasedStateMachine):
    mount: Any = None  # the ckptfs Mount, set by the test
    ref_root: Path = Path()
    remounts_total = 0

    def __init__(self) -> None:
        super().__init__()
        self.fs_root: Path = self.mount.mountpoint
        clear_tree(self.fs_root)
        clear_tree(self.ref_root)
        self.handles: list[Handle] = []
        self.steps = 0
        self.remounted = False

    # ----------------------------------------------------------------- helpers

    def both(self, what: str, fn: Callable[[Path], Any]) -> Outcome:
        """Run ``fn(root)`` on both roots; the outcomes must match."""
        got = outcome(lambda: fn(self.fs_root))
        want = outcome(lambda: fn(self.ref_root))
        assert got == want, f"{what}: ckptfs {describe(got)} != reference {describe(want)}"
        return got

    def both_fd(self, what: str, h: Handle, fn: Callable[[int], Any]) -> Outcome:
        got = outcome(lambda: fn(h.fs_fd))
        want = outcome(lambda: fn(h.ref_fd))
        assert got == want, (
            f"{what} on handle({h.path!r}, {h.mode}): ckptfs {describe(got)} != reference {describe(want)}"
        )
        return got

    def handle(self, i: int) -> Handle:
        return self.handles[i % len(self.handles)]

    def has_handles(self) -> bool:
        return bool(self.handles)

    def close_handle(self, h: Handle) -> None:
        self.handles.remove(h)
        fs_err = outcome(lambda: os.close(h.fs_fd))
        os.close(h.ref_fd)
        assert fs_err == ("ok", None), f"close: {fs_err}"

    # ----------------------------------------------------------------- rules

    @precondition(lambda self: len(self.handles) < MAX_OPEN)
    @rule(path=paths, mode=st.sampled_from(sorted(OPEN_MODES)))
    def open(self, path: str, mode: str) -> None:
        flags = OPEN_MODES[mode]
        fds: dict[str, int] = {}

        def op(root: Path) -> None:
            fds[str(root)] = os.open(root / path, flags, 0o644)

        res = self.both(f"open({path!r}, {mode})", op)
        if res[0] == "ok":
            h = Handle(fds[str(self.fs_root)], fds[str(self.ref_root)], path, mode)
            self.handles.append(h)
            if stat.S_ISDIR(os.fstat(h.ref_fd).st_mode):
                # Directory fds: sizes and lseek differ legitimately between filesystems.
                self.close_handle(h)

    @precondition(has_handles)
    @rule(i=handle_index)
    def close(self, i: int) -> None:
        self.close_handle(self.handle(i))

    @precondition(has_handles)
    @rule(i=handle_index)
    def reopen(self, i: int) -> None:
        h = self.handle(i)
        self.close_handle(h)
        self.open(h.path, "rw")

    @precondition(has_handles)
    @rule(i=handle_index, data=payloads)
    def write(self, i: int, data: bytes) -> None:
        self.both_fd(f"write({len(data)})", self.handle(i), lambda fd: os.write(fd, data))

    @precondition(has_handles)
    @rule(i=handle_index, data=payloads, off=offsets)
    def pwrite(self, i: int, data: bytes, off: int) -> None:
        self.both_fd(f"pwrite({len(data)}, {off})", self.handle(i), lambda fd: os.pwrite(fd, data, off))

    @precondition(has_handles)
    @rule(i=handle_index, off=offsets, whence=st.sampled_from([os.SEEK_SET, os.SEEK_END]))
    def seek(self, i: int, off: int, whence: int) -> None:
        if whence == os.SEEK_END:
            off = -min(off, 1000)
        self.both_fd(f"lseek({off}, {whence})", self.handle(i), lambda fd: os.lseek(fd, off, whence))

    @precondition(has_handles)
    @rule(i=handle_index, off=offsets, n=lengths)
    def pread(self, i: int, off: int, n: int) -> None:
        self.both_fd(f"pread({n}, {off})", self.handle(i), lambda fd: os.pread(fd, n, off))

    @precondition(has_handles)
    @rule(i=handle_index, n=lengths)
    def read(self, i: int, n: int) -> None:
        self.both_fd(f"read({n})", self.handle(i), lambda fd: os.read(fd, n))

    @precondition(has_handles)
    @rule(i=handle_index, size=sizes)
    def ftruncate(self, i: int, size: int) -> None:
        self.both_fd(f"ftruncate({size})", self.handle(i), lambda fd: os.ftruncate(fd, size))

    @precondition(has_handles)
    @rule(i=handle_index)
    def fsync(self, i: int) -> None:
        self.both_fd("fsync", self.handle(i), os.fsync)

    @rule(path=paths, size=sizes)
    def truncate(self, path: str, size: int) -> None:
        self.both(f"truncate({path!r}, {size})", lambda r: os.truncate(r / path, size))

    @rule(path=paths, data=payloads)
    def write_whole_file(self, path: str, data: bytes) -> None:
        def op(root: Path) -> int:
            with open(root / path, "wb") as f:
                return f.write(data)

        self.both(f"write_file({path!r}, {len(data)})", op)

    @rule(path=paths)
    def read_whole_file(self, path: str) -> None:
        self.both(f"read_file({path!r})", lambda r: (r / path).read_bytes())

    @rule(src=paths, dst=paths)
    def rename(self, src: str, dst: str) -> None:
        self.both(f"rename({src!r}, {dst!r})", lambda r: os.rename(r / src, r / dst))

    @rule(path=paths)
    def unlink(self, path: str) -> None:
        self.both(f"unlink({path!r})", lambda r: os.unlink(r / path))

    @rule(path=paths)
    def mkdir(self, path: str) -> None:
        self.both(f"mkdir({path!r})", lambda r: os.mkdir(r / path))

    @rule(path=paths)
    def rmdir(self, path: str) -> None:
        self.both(f"rmdir({path!r})", lambda r: os.rmdir(r / path))

    @rule(path=paths)
    def listdir(self, path: str) -> None:
        self.both(f"listdir({path!r})", lambda r: sorted(os.listdir(r / path)))

    @rule(path=paths)
    def stat_path(self, path: str) -> None:
        def op(root: Path) -> tuple[int, int]:
            s = os.stat(root / path)
            return stat.S_IFMT(s.st_mode), (s.st_size if stat.S_ISREG(s.st_mode) else 0)

        self.both(f"stat({path!r})", op)

    @rule(link_target=paths, path=paths)
    def symlink(self, link_target: str, path: str) -> None:
        self.both(f"symlink({link_target!r}, {path!r})", lambda r: os.symlink(link_target, r / path))

    @rule(path=paths, mode=st.sampled_from([0o600, 0o644, 0o755, 0o700]))
    def chmod(self, path: str, mode: int) -> None:
        self.both(f"chmod({path!r}, {oct(mode)})", lambda r: os.chmod(r / path, mode))

    @precondition(lambda self: not self.remounted and self.steps >= 8)
    @rule()
    def remount(self) -> None:
        """Unmount and mount ckptfs again with the same state; nothing may change."""
        for h in list(self.handles):
            self.close_handle(h)
        self.mount.stop()
        self.mount.start()
        self.remounted = True
        type(self).remounts_total += 1

    # ----------------------------------------------------------------- checks

    @invariant()
    def trees_identical(self) -> None:
        self.steps += 1
        fs, ref = self.snapshot(self.fs_root), self.snapshot(self.ref_root)
        if fs != ref:
            diffs = [f"only in ckptfs: {k}" for k in fs.keys() - ref.keys()]
            diffs += [f"only in reference: {k}" for k in ref.keys() - fs.keys()]
            for k in sorted(fs.keys() & ref.keys()):
                if fs[k] != ref[k]:
                    a, b = fs[k], ref[k]
                    if a[0] == b[0] == "file" and a[2] == b[2] and a[3] != b[3]:
                        first = next(i for i in range(len(a[3])) if a[3][i] != b[3][i])
                        diffs.append(f"{k}: contents differ from offset {first} "
                                     f"(chunk {first // CHUNK} + {first % CHUNK})")
                    else:
                        diffs.append(f"{k}: ckptfs {a[:3]} != reference {b[:3]}")
            raise AssertionError("trees differ:\n" + "\n".join(diffs))

    @invariant()
    def open_sizes_identical(self) -> None:
        for h in self.handles:
            got, want = os.fstat(h.fs_fd).st_size, os.fstat(h.ref_fd).st_size
            assert got == want, f"fstat size of handle({h.path!r}, {h.mode}): {got} != {want}"

    @staticmethod
    def snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
        out: dict[str, tuple[Any, ...]] = {}

        def walk(d: Path, rel: str) -> None:
            for n in sorted(os.listdir(d)):
                p, r = d / n, f"{rel}{n}"
                s = os.lstat(p)
                if stat.S_ISLNK(s.st_mode):
                    out[r] = ("link", os.readlink(p))
                elif stat.S_ISDIR(s.st_mode):
                    out[r] = ("dir", stat.S_IMODE(s.st_mode))
                    walk(p, r + "/")
                else:
                    data = p.read_bytes()
                    assert len(data) == s.st_size, f"{p}: read {len(data)} bytes, st_size {s.st_size}"
                    out[r] = ("file", stat.S_IMODE(s.st_mode), s.st_size, data)

        walk(root, "")
        return out

    def teardown(self) -> None:
        for h in list(self.handles):
            self.close_handle(h)


def test_ckptfs_matches_plain_directory(ckpt: Any, tmp_path: Path) -> None:
    ref = tmp_path / "reference"
    ref.mkdir()

    class Machine(CkptfsVsPlainDir):
        pass

    Machine.mount = ckpt
    Machine.ref_root = ref
    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=int(os.environ.get("CKPTFS_DIFF_EXAMPLES", "30")),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        ),
    )
    print(f"remounts exercised: {Machine.remounts_total}")
