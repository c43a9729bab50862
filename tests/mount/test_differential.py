"""Differential test: random operation sequences on ckptfs and on a plain directory.

A hypothesis state machine applies the same operations (create/open, write, pwrite past EOF
and across the 256 KiB chunk boundaries, truncate, rename of files and directories, unlink,
mkdir, rmdir, symlink, link, chmod, read, reopen, close, unmount+remount) to a real ckptfs mount
and to a reference directory on the host filesystem. Every operation must have the same
outcome on both sides (return value, or errno), and after every step the two trees must be
identical: names, types, modes, sizes, link counts, contents and link targets, plus the
live size of every open file.

One mount serves the whole test; the tree is cleared between examples.
"""

from __future__ import annotations

import collections
import errno
import os
import random
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import engine as hypothesis_engine
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
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
# A path argument: an existing entry, a new name inside an existing directory, or any path
# of the small name universe (mostly missing: exercises ENOENT/ENOTDIR/...).
picks = st.tuples(
    st.sampled_from(["existing", "existing", "child", "child", "random"]),
    st.integers(0, 10**6),
    paths,
)
BOUNDARIES = [0, 1, 4095, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 1, 2 * CHUNK, 3 * CHUNK]
offsets = st.one_of(st.sampled_from(BOUNDARIES), st.integers(0, 3 * CHUNK + 100))
lengths = st.one_of(
    st.sampled_from([0, 1, 2, 100, 4096, CHUNK - 1, CHUNK, CHUNK + 1]),
    st.integers(0, 2 * CHUNK + 10),
)


@dataclass(frozen=True)
class Payload:
    """``length`` pseudo-random bytes from ``seed`` (short to print in a failing example)."""

    seed: int
    length: int

    def __bytes__(self) -> bytes:
        return random.Random(self.seed).randbytes(self.length)


payloads = st.builds(Payload, st.integers(0, 2**32), lengths)
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
    stats: collections.Counter[str] = collections.Counter()

    def __init__(self) -> None:
        super().__init__()
        self.fs_root: Path = self.mount.mountpoint
        clear_tree(self.fs_root)
        clear_tree(self.ref_root)
        self.handles: list[Handle] = []
        self.steps = 0
        self.remounted = False
        self.existing: dict[str, str] = {}  # path -> kind, from the last reference snapshot
        self.stats["examples"] += 1

    # ----------------------------------------------------------------- helpers

    def both(self, what: str, fn: Callable[[Path], Any]) -> Outcome:
        """Run ``fn(root)`` on both roots; the outcomes must match."""
        got = outcome(lambda: fn(self.fs_root))
        want = outcome(lambda: fn(self.ref_root))
        self.count(what, want)
        assert got == want, f"{what}: ckptfs {describe(got)} != reference {describe(want)}"
        return got

    def count(self, what: str, o: Outcome) -> None:
        self.stats[what.split("(")[0] + " " + (o[0] if o[0] == "ok" else str(o[1]))] += 1

    def both_fd(self, what: str, h: Handle, fn: Callable[[int], Any]) -> Outcome:
        got = outcome(lambda: fn(h.fs_fd))
        want = outcome(lambda: fn(h.ref_fd))
        self.count(what, want)
        assert got == want, (
            f"{what} on handle({h.path!r}, {h.mode}): ckptfs {describe(got)} != reference {describe(want)}"
        )
        return got

    def resolve(self, p: tuple[str, int, str]) -> str:
        kind, n, rnd = p
        if kind == "existing" and self.existing:
            return sorted(self.existing)[n % len(self.existing)]
        if kind == "child":
            dirs = [""] + [k + "/" for k in self.existing if self.existing[k] == "dir"]
            return dirs[n % len(dirs)] + NAMES[(n // len(dirs)) % len(NAMES)]
        return rnd

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

    @initialize(p1=payloads, p2=payloads, off=offsets)
    def seed_tree(self, p1: Payload, p2: Payload, off: int) -> None:
        """Start every example with some content and two open files."""
        d1, d2 = bytes(p1), bytes(p2)
        self.both("mkdir('a')", lambda r: os.mkdir(r / "a"))
        self.both("write_file('b')", lambda r: (r / "b").write_bytes(d1))
        self.both("write_file('a/c')", lambda r: (r / "a" / "c").write_bytes(d2))
        self.do_open("b", "rw")
        self.do_open("a/c", "rw")
        self.both_fd(
            f"pwrite({len(d1)}, {off})", self.handles[-1], lambda fd: os.pwrite(fd, d1, off)
        )

    @precondition(lambda self: len(self.handles) < MAX_OPEN)
    @rule(p=picks, mode=st.sampled_from(sorted(OPEN_MODES)))
    def open(self, p: tuple[str, int, str], mode: str) -> None:
        self.do_open(self.resolve(p), mode)

    def do_open(self, path: str, mode: str) -> None:
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
        self.do_open(h.path, "rw")

    @precondition(has_handles)
    @rule(i=handle_index, payload=payloads)
    def write(self, i: int, payload: Payload) -> None:
        data = bytes(payload)
        self.both_fd(f"write({len(data)})", self.handle(i), lambda fd: os.write(fd, data))

    @precondition(has_handles)
    @rule(i=handle_index, payload=payloads, off=offsets)
    def pwrite(self, i: int, payload: Payload, off: int) -> None:
        data = bytes(payload)
        self.both_fd(
            f"pwrite({len(data)}, {off})", self.handle(i), lambda fd: os.pwrite(fd, data, off)
        )

    @precondition(has_handles)
    @rule(i=handle_index, off=offsets, whence=st.sampled_from([os.SEEK_SET, os.SEEK_END]))
    def seek(self, i: int, off: int, whence: int) -> None:
        if whence == os.SEEK_END:
            off = -min(off, 1000)
        self.both_fd(
            f"lseek({off}, {whence})", self.handle(i), lambda fd: os.lseek(fd, off, whence)
        )

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

    @rule(p=picks, size=sizes)
    def truncate(self, p: tuple[str, int, str], size: int) -> None:
        path = self.resolve(p)
        self.both(f"truncate({path!r}, {size})", lambda r: os.truncate(r / path, size))

    @rule(p=picks, payload=payloads)
    def write_whole_file(self, p: tuple[str, int, str], payload: Payload) -> None:
        data = bytes(payload)
        path = self.resolve(p)

        def op(root: Path) -> int:
            with open(root / path, "wb") as f:
                return f.write(data)

        self.both(f"write_file({path!r}, {len(data)})", op)

    @rule(p=picks)
    def read_whole_file(self, p: tuple[str, int, str]) -> None:
        path = self.resolve(p)
        self.both(f"read_file({path!r})", lambda r: (r / path).read_bytes())

    @rule(s=picks, d=picks)
    def rename(self, s: tuple[str, int, str], d: tuple[str, int, str]) -> None:
        src, dst = self.resolve(s), self.resolve(d)
        self.both(f"rename({src!r}, {dst!r})", lambda r: os.rename(r / src, r / dst))

    @rule(s=picks, d=picks)
    def link(self, s: tuple[str, int, str], d: tuple[str, int, str]) -> None:
        src, dst = self.resolve(s), self.resolve(d)
        self.both(f"link({src!r}, {dst!r})", lambda r: os.link(r / src, r / dst))

    @rule(p=picks)
    def unlink(self, p: tuple[str, int, str]) -> None:
        path = self.resolve(p)
        self.both(f"unlink({path!r})", lambda r: os.unlink(r / path))

    @rule(p=picks)
    def mkdir(self, p: tuple[str, int, str]) -> None:
        path = self.resolve(p)
        self.both(f"mkdir({path!r})", lambda r: os.mkdir(r / path))

    @rule(p=picks)
    def rmdir(self, p: tuple[str, int, str]) -> None:
        path = self.resolve(p)
        self.both(f"rmdir({path!r})", lambda r: os.rmdir(r / path))

    @rule(p=picks)
    def listdir(self, p: tuple[str, int, str]) -> None:
        path = self.resolve(p)
        self.both(f"listdir({path!r})", lambda r: sorted(os.listdir(r / path)))

    @rule(p=picks)
    def stat_path(self, p: tuple[str, int, str]) -> None:
        path = self.resolve(p)

        def op(root: Path) -> tuple[int, int]:
            s = os.stat(root / path)
            return stat.S_IFMT(s.st_mode), (s.st_size if stat.S_ISREG(s.st_mode) else 0)

        self.both(f"stat({path!r})", op)

    @rule(t=picks, p=picks)
    def symlink(self, t: tuple[str, int, str], p: tuple[str, int, str]) -> None:
        link_target, path = self.resolve(t), self.resolve(p)
        self.both(
            f"symlink({link_target!r}, {path!r})", lambda r: os.symlink(link_target, r / path)
        )

    @rule(p=picks, mode=st.sampled_from([0o600, 0o644, 0o755, 0o700]))
    def chmod(self, p: tuple[str, int, str], mode: int) -> None:
        path = self.resolve(p)
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
        self.stats["steps"] += 1
        fs, ref = self.snapshot(self.fs_root), self.snapshot(self.ref_root)
        self.existing = {k: v[0] for k, v in ref.items()}
        if fs != ref:
            diffs = [f"only in ckptfs: {k}" for k in fs.keys() - ref.keys()]
            diffs += [f"only in reference: {k}" for k in ref.keys() - fs.keys()]
            for k in sorted(fs.keys() & ref.keys()):
                if fs[k] != ref[k]:
                    a, b = fs[k], ref[k]
                    if a[0] == b[0] == "file" and a[2] == b[2] and a[3] != b[3]:
                        first = next(i for i in range(len(a[3])) if a[3][i] != b[3][i])
                        diffs.append(
                            f"{k}: contents differ from offset {first} "
                            f"(chunk {first // CHUNK} + {first % CHUNK})"
                        )
                    else:
                        short = (lambda t: t[:3] + t[4:]) if a[0] == "file" else (lambda t: t)
                        diffs.append(f"{k}: ckptfs {short(a)} != reference {short(b)}")
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
                    assert len(data) == s.st_size, (
                        f"{p}: read {len(data)} bytes, st_size {s.st_size}"
                    )
                    out[r] = ("file", stat.S_IMODE(s.st_mode), s.st_size, data, s.st_nlink)

        walk(root, "")
        return out

    def teardown(self) -> None:
        for h in list(self.handles):
            self.close_handle(h)


@pytest.mark.slow
def test_ckptfs_matches_plain_directory(
    ckpt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = tmp_path / "reference"
    ref.mkdir()
    # Every example may unmount and mount again, so shrinking a failure is slow; cap it
    # (hypothesis' own cap is 5 minutes). The failing example is saved in .hypothesis/ and
    # replayed first next time, so a rerun continues from the shrunk case.
    monkeypatch.setattr(
        hypothesis_engine,
        "MAX_SHRINKING_SECONDS",
        int(os.environ.get("CKPTFS_DIFF_SHRINK_SECONDS", "90")),
        raising=False,
    )

    class Machine(CkptfsVsPlainDir):
        pass

    Machine.mount = ckpt
    Machine.ref_root = ref
    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=int(os.environ.get("CKPTFS_DIFF_EXAMPLES", "40")),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
        ),
    )
    print(f"remounts exercised: {Machine.remounts_total}")
    print("operations (reference outcome):", dict(sorted(Machine.stats.items())))
