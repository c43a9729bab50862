"""POSIX semantics of a real ckptfs mount, one focused test per semantic.

The contract these tests enforce is the list of POSIX calls in docs/frameworks.md (what
the checkpoint writers of PyTorch DCP, Orbax/tensorstore, Lightning, HF, DeepSpeed and
Megatron actually do to a filesystem; docs/semantics.md says what ckptfs does for each).
Every test asserts real outcomes (errno values, bytes, sizes, modes, mtimes) on a real
FUSE mount with 256 KiB chunks, so that "multi-chunk" costs little.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import mmap
import multiprocessing
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CHUNK = 256 * 1024  # must match conftest.TEST_MOUNT_ARGS
MiB = 1024 * 1024
OLD_NS = 1_000_000_000 * 10**9 + 123_456_789  # 2001-09-09, with a ns part


def rbytes(n: int, seed: int | str = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def expect_errno(
    errnos: int | tuple[int, ...], fn: Callable[..., Any], *args: Any, **kw: Any
) -> OSError:
    want = (errnos,) if isinstance(errnos, int) else errnos
    try:
        res = fn(*args, **kw)
    except OSError as e:
        assert e.errno in want, (
            f"{fn.__name__}{args}: errno {e.errno} ({errno.errorcode.get(e.errno or 0)}), "
            f"want {[errno.errorcode[x] for x in want]}"
        )
        return e
    if fn is os.open and isinstance(res, int):
        os.close(res)  # an open fd would keep the mount busy
    pytest.fail(f"{fn.__name__}{args} succeeded, want {[errno.errorcode[x] for x in want]}")


def write_file(path: Path, data: bytes, block: int = 100_000) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(0, len(data), block):
            assert os.write(fd, data[i : i + block]) == len(data[i : i + block])
    finally:
        os.close(fd)


def read_file(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def pread_all(fd: int, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        b = os.pread(fd, size - len(out), len(out))
        if not b:
            break
        out += b
    return bytes(out)


def assert_bytes_equal(got: bytes, want: bytes, what: str = "data") -> None:
    if got == want:
        return
    n = min(len(got), len(want))
    first = next((i for i in range(n) if got[i] != want[i]), n)
    raise AssertionError(
        f"{what}: {len(got)} bytes, want {len(want)}; first difference at offset {first} "
        f"(chunk {first // CHUNK}, offset in chunk {first % CHUNK})"
    )


# --------------------------------------------------------------------------- lookup / stat


def test_enoent_on_missing_names(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    missing = mp / "no-such-file"
    expect_errno(errno.ENOENT, os.stat, missing)
    expect_errno(errno.ENOENT, os.lstat, missing)
    expect_errno(errno.ENOENT, os.open, missing, os.O_RDONLY)
    expect_errno(errno.ENOENT, os.open, missing, os.O_RDWR)
    expect_errno(errno.ENOENT, os.unlink, missing)
    expect_errno(errno.ENOENT, os.rmdir, missing)
    expect_errno(errno.ENOENT, os.listdir, missing)
    expect_errno(errno.ENOENT, os.readlink, missing)
    expect_errno(errno.ENOENT, os.rename, missing, mp / "x")
    expect_errno(errno.ENOENT, os.truncate, missing, 0)
    expect_errno(errno.ENOENT, os.chmod, missing, 0o600)
    expect_errno(errno.ENOENT, os.utime, missing, None)
    with pytest.raises(FileNotFoundError), open(missing, "rb"):
        pass
    assert not os.path.exists(missing)
    # Missing parent components.
    expect_errno(errno.ENOENT, os.stat, mp / "no-dir" / "f")
    expect_errno(errno.ENOENT, os.open, mp / "no-dir" / "f", os.O_WRONLY | os.O_CREAT)
    expect_errno(errno.ENOENT, os.mkdir, mp / "no-dir" / "sub")
    # A file used as a directory.
    (mp / "plain").write_bytes(b"x")
    expect_errno(errno.ENOTDIR, os.stat, mp / "plain" / "f")
    expect_errno(errno.ENOTDIR, os.listdir, mp / "plain")


def test_negative_lookup_then_create_then_unlink(ckpt: Any) -> None:
    f = ckpt.mountpoint / "flip"
    for _ in range(3):
        expect_errno(errno.ENOENT, os.stat, f)
        f.write_bytes(b"hello")
        assert os.stat(f).st_size == 5
        assert read_file(f) == b"hello"
        os.unlink(f)
        expect_errno(errno.ENOENT, os.stat, f)
        assert "flip" not in os.listdir(ckpt.mountpoint)


def test_access_on_parent_and_files(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    d = mp / "ckpt"
    d.mkdir()
    assert os.access(mp, os.W_OK | os.X_OK)
    assert os.access(d, os.W_OK)
    (d / "f").write_bytes(b"1")
    assert os.access(d / "f", os.R_OK | os.W_OK)
    assert not os.access(d / "missing", os.F_OK)


def test_stat_types_and_owner(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    (mp / "d").mkdir()
    (mp / "f").write_bytes(b"abc")
    st_root = os.stat(mp)
    assert stat.S_ISDIR(st_root.st_mode)
    st_d = os.stat(mp / "d")
    st_f = os.stat(mp / "f")
    assert stat.S_ISDIR(st_d.st_mode)
    assert stat.S_ISREG(st_f.st_mode)
    assert st_f.st_size == 3
    assert st_f.st_nlink == 1
    assert st_d.st_nlink >= 1
    assert st_f.st_uid == os.geteuid() and st_f.st_gid == os.getegid()
    assert st_f.st_ino != st_d.st_ino != st_root.st_ino
    assert st_f.st_blksize > 0


def test_mkdir_eexist(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    os.mkdir(mp / "d")
    expect_errno(errno.EEXIST, os.mkdir, mp / "d")
    (mp / "f").write_bytes(b"")
    expect_errno(errno.EEXIST, os.mkdir, mp / "f")
    expect_errno(errno.EEXIST, os.mkdir, mp)
    assert stat.S_ISREG(os.stat(mp / "f").st_mode)


def test_open_o_excl_eexist(ckpt: Any) -> None:
    f = ckpt.mountpoint / "lock"
    fd = os.open(f, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    os.write(fd, b"first")
    os.close(fd)
    expect_errno(errno.EEXIST, os.open, f, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    expect_errno(errno.EEXIST, os.open, f, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_TRUNC, 0o644)
    with pytest.raises(FileExistsError), open(f, "xb"):
        pass
    (ckpt.mountpoint / "d").mkdir()
    expect_errno(errno.EEXIST, os.open, ckpt.mountpoint / "d", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    assert read_file(f) == b"first"


def test_makedirs_exist_ok(ckpt: Any) -> None:
    deep = ckpt.mountpoint / "a" / "b" / "c" / "d"
    os.makedirs(deep, exist_ok=True)
    os.makedirs(deep, exist_ok=True)
    os.makedirs(ckpt.mountpoint / "a" / "b", exist_ok=True)
    assert os.path.isdir(deep)
    with pytest.raises(FileExistsError):
        os.makedirs(deep)
    (deep / "file").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        os.makedirs(deep / "file", exist_ok=True)
    Path(ckpt.mountpoint / "p" / "q").mkdir(parents=True, exist_ok=True)
    assert sorted(os.listdir(ckpt.mountpoint)) == ["a", "p"]


def test_eisdir_enotdir(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    (mp / "d").mkdir()
    (mp / "f").write_bytes(b"x")
    expect_errno(errno.EISDIR, os.open, mp / "d", os.O_WRONLY)
    expect_errno(errno.EISDIR, os.open, mp / "d", os.O_RDWR)
    expect_errno(errno.EISDIR, os.unlink, mp / "d")
    expect_errno(errno.ENOTDIR, os.rmdir, mp / "f")
    expect_errno(errno.ENOTDIR, os.open, mp / "f", os.O_RDONLY | os.O_DIRECTORY)
    expect_errno(errno.EISDIR, os.rename, mp / "f", mp / "d")
    expect_errno(errno.ENOTDIR, os.rename, mp / "d", mp / "f")
    expect_errno(errno.EINVAL, os.rename, mp / "d", mp / "d" / "sub")
    assert read_file(mp / "f") == b"x" and os.path.isdir(mp / "d")


# --------------------------------------------------------------------------- create / write


def test_live_size_via_fstat_while_writing(ckpt: Any) -> None:
    f = ckpt.mountpoint / "growing"
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    rd = os.open(f, os.O_RDONLY)
    try:
        written = 0
        for i in range(12):  # 12 * 100_000 = 1.2 MB, ~4.6 chunks
            written += os.write(fd, rbytes(100_000, i))
            assert os.fstat(fd).st_size == written
            assert os.fstat(rd).st_size == written
            assert os.stat(f).st_size == written
        assert written > 4 * CHUNK
    finally:
        os.close(rd)
        os.close(fd)
    assert os.stat(f).st_size == 1_200_000


def test_create_o_trunc_on_existing_file(ckpt: Any) -> None:
    f = ckpt.mountpoint / "model.bin"
    write_file(f, rbytes(3 * CHUNK + 5, "old"))
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.fstat(fd).st_size == 0
        assert os.stat(f).st_size == 0
        new = rbytes(CHUNK // 2 + 3, "new")
        assert os.write(fd, new) == len(new)
    finally:
        os.close(fd)
    assert os.stat(f).st_size == len(new)
    assert_bytes_equal(read_file(f), new)
    # O_TRUNC without O_CREAT, and Python's "wb", on the same file.
    fd = os.open(f, os.O_RDWR | os.O_TRUNC)
    assert os.fstat(fd).st_size == 0
    assert os.pread(fd, 10, 0) == b""
    os.close(fd)
    assert os.stat(f).st_size == 0
    with open(f, "wb") as fh:
        fh.write(b"tail")
    assert read_file(f) == b"tail"


def test_large_sequential_write_read_back(ckpt: Any) -> None:
    f = ckpt.mountpoint / "big.bin"
    data = rbytes(20 * MiB, "big")
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(0, len(data), MiB):
            assert os.write(fd, data[i : i + MiB]) == MiB
    finally:
        os.close(fd)
    assert os.stat(f).st_size == len(data)
    got = read_file(f)
    assert_bytes_equal(got, data, "20 MiB file")


def test_writev(ckpt: Any) -> None:
    f = ckpt.mountpoint / "vec"
    parts = [rbytes(n, n) for n in (1, 4095, CHUNK, 77_777, CHUNK + 1)]
    fd = os.open(f, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        n = os.writev(fd, parts)
        assert n == sum(map(len, parts))
    finally:
        os.close(fd)
    assert_bytes_equal(read_file(f), b"".join(parts))


def test_random_pread_vs_reference(ckpt: Any) -> None:
    f = ckpt.mountpoint / "random"
    data = rbytes(4 * CHUNK + 12_345, "ref")
    write_file(f, data, block=65_536)
    rng = random.Random(7)
    offsets = [
        0,
        1,
        CHUNK - 1,
        CHUNK,
        CHUNK + 1,
        2 * CHUNK - 3,
        4 * CHUNK,
        len(data) - 1,
        len(data),
        len(data) + 5000,
    ]
    offsets += [rng.randrange(0, len(data) + 1000) for _ in range(400)]
    fd = os.open(f, os.O_RDONLY)
    try:
        for off in offsets:
            n = rng.choice([0, 1, 17, 4096, 65_536, CHUNK, CHUNK + 7, rng.randrange(1, 300_000)])
            assert os.pread(fd, n, off) == data[off : off + n], (off, n)
    finally:
        os.close(fd)


def test_lseek_read(ckpt: Any) -> None:
    f = ckpt.mountpoint / "seek"
    data = rbytes(2 * CHUNK + 999, "seek")
    write_file(f, data)
    fd = os.open(f, os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, os.SEEK_END) == len(data)
        assert os.lseek(fd, CHUNK - 10, os.SEEK_SET) == CHUNK - 10
        assert os.read(fd, 20) == data[CHUNK - 10 : CHUNK + 10]
        assert os.lseek(fd, 0, os.SEEK_CUR) == CHUNK + 10
        assert os.lseek(fd, -5, os.SEEK_END) == len(data) - 5
        assert os.read(fd, 100) == data[-5:]
        assert os.read(fd, 100) == b""
    finally:
        os.close(fd)


def test_read_after_write_coherence_while_open(ckpt: Any) -> None:
    f = ckpt.mountpoint / "coherent"
    fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    early = os.open(f, os.O_RDONLY)  # opened while the file is still empty
    try:
        ref = bytearray(rbytes(300_000, "a"))
        os.write(fd, ref)
        assert os.pread(fd, len(ref), 0) == ref
        assert os.pread(early, len(ref) + 10, 0) == ref
        late = os.open(f, os.O_RDONLY)
        try:
            assert os.pread(late, len(ref) + 10, 0) == ref
            # Overwrite across the first chunk boundary.
            patch = rbytes(200_000, "b")
            assert os.pwrite(fd, patch, 100_000) == len(patch)
            ref[100_000:300_000] = patch
            for r in (fd, early, late):
                assert_bytes_equal(pread_all(r, len(ref) + 10), bytes(ref), "after overwrite")
            # Extend through another fd, read through the first ones.
            wr2 = os.open(f, os.O_WRONLY)
            ext = rbytes(CHUNK, "c")
            assert os.pwrite(wr2, ext, len(ref)) == CHUNK
            ref += ext
            os.close(wr2)
            for r in (fd, early, late):
                assert os.fstat(r).st_size == len(ref)
                assert_bytes_equal(pread_all(r, len(ref) + 10), bytes(ref), "after extend")
        finally:
            os.close(late)
    finally:
        os.close(early)
        os.close(fd)
    assert_bytes_equal(read_file(f), bytes(ref))


def test_rename_then_read(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    data = rbytes(CHUNK + 10, "rr")
    write_file(mp / "tmp.partial", data)
    os.rename(mp / "tmp.partial", mp / "final")
    assert_bytes_equal(read_file(mp / "final"), data)
    assert os.stat(mp / "final").st_size == len(data)


# --------------------------------------------------------------------------- mmap


@pytest.mark.parametrize("prot", ["r", "rw"])
def test_mmap_private(ckpt: Any, prot: str) -> None:
    f = ckpt.mountpoint / "weights.safetensors"
    data = rbytes(3 * CHUNK + 1234, "mmap")
    write_file(f, data)
    fd = os.open(f, os.O_RDONLY)
    try:
        p = mmap.PROT_READ | (mmap.PROT_WRITE if prot == "rw" else 0)
        m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=p)
        try:
            assert len(m) == len(data)
            assert_bytes_equal(m[:], data, "mapping")
            assert m[CHUNK - 5 : CHUNK + 5] == data[CHUNK - 5 : CHUNK + 5]
            if prot == "rw":
                m[0:4] = b"XXXX"
                m[2 * CHUNK : 2 * CHUNK + 4] = b"YYYY"
                assert m[0:4] == b"XXXX"
        finally:
            m.close()
    finally:
        os.close(fd)
    # MAP_PRIVATE writes never reach the file.
    assert_bytes_equal(read_file(f), data, "file after private mapping")


def test_mmap_private_of_file_written_on_open_fd(ckpt: Any) -> None:
    f = ckpt.mountpoint / "fresh"
    data = rbytes(CHUNK + 4097, "fresh")
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        try:
            assert_bytes_equal(m[:], data, "mapping of a still-open file")
        finally:
            m.close()
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- rename


def test_rename_file_onto_existing_target(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    old = rbytes(2 * CHUNK + 3, "old")
    new = rbytes(CHUNK + 77, "new")
    write_file(mp / "latest", old)
    write_file(mp / "latest.tmp", new)
    os.rename(mp / "latest.tmp", mp / "latest")
    expect_errno(errno.ENOENT, os.stat, mp / "latest.tmp")
    assert os.listdir(mp) == ["latest"]
    assert os.stat(mp / "latest").st_size == len(new)
    assert_bytes_equal(read_file(mp / "latest"), new)
    os.replace(mp / "latest", mp / "latest2")
    assert os.listdir(mp) == ["latest2"]


def test_rename_replaced_target_keeps_data_for_open_fd(ckpt_factory: Any) -> None:
    m = ckpt_factory.mount()
    mp = m.mountpoint
    old = rbytes(2 * CHUNK + 3, "old")
    new = rbytes(CHUNK + 77, "new")
    write_file(mp / "target", old)
    write_file(mp / "src", new)
    ckpt_factory.remount(m)  # empty page cache: reads below must come from the filesystem
    fd = os.open(mp / "target", os.O_RDONLY)
    try:
        os.rename(mp / "src", mp / "target")
        assert_bytes_equal(pread_all(fd, len(old) + 10), old, "replaced file through open fd")
    finally:
        os.close(fd)
    assert_bytes_equal(read_file(mp / "target"), new)


def test_rename_onto_target_open_for_writing(ckpt_factory: Any) -> None:
    """The replaced file's pending writes and its close must not touch the new file."""
    m = ckpt_factory.mount()
    mp = m.mountpoint
    old = bytearray(rbytes(2 * CHUNK, "old"))
    new = rbytes(CHUNK + 77, "new")
    write_file(mp / "target", bytes(old))
    fd = os.open(mp / "target", os.O_RDWR)
    try:
        os.pwrite(fd, b"dirty", 10)
        old[10:15] = b"dirty"
        write_file(mp / "src", new)
        os.rename(mp / "src", mp / "target")
        os.pwrite(fd, b"after", CHUNK + 3)
        old[CHUNK + 3 : CHUNK + 8] = b"after"
        os.fsync(fd)
        assert_bytes_equal(pread_all(fd, 3 * CHUNK), bytes(old), "replaced file through its fd")
    finally:
        os.close(fd)
    assert_bytes_equal(read_file(mp / "target"), new, "new file after old fd closed")
    assert os.listdir(mp) == ["target"]
    ckpt_factory.remount(m)
    assert_bytes_equal(read_file(mp / "target"), new, "new file after remount")
    assert os.listdir(mp) == ["target"]


@pytest.mark.parametrize("order", ["fd1-first", "fd2-first"])
def test_two_writers_same_chunk_close_order(ckpt: Any, order: str) -> None:
    """Interleaved writes through two fds into the same chunks; neither close may clobber."""
    f = ckpt.mountpoint / "shared"
    ref = bytearray()

    def put(fd: int, data: bytes, off: int) -> None:
        assert os.pwrite(fd, data, off) == len(data)
        if off > len(ref):
            ref.extend(bytes(off - len(ref)))
        ref[off : off + len(data)] = data

    fd1 = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    fd2 = os.open(f, os.O_RDWR)
    first, second = (fd1, fd2) if order == "fd1-first" else (fd2, fd1)
    try:
        put(fd1, rbytes(CHUNK + 100, "one"), 0)
        put(fd2, rbytes(1000, "two"), 500)
        put(fd1, rbytes(10, "three"), 1200)
        put(fd2, rbytes(CHUNK, "four"), CHUNK - 50)
        rd = os.open(f, os.O_RDONLY)
        assert_bytes_equal(pread_all(rd, len(ref) + 1), bytes(ref), "reader")
        os.close(rd)  # a reader's release must not disturb the writers
        put(fd1, rbytes(7, "five"), CHUNK - 51)
        os.close(first)
        first = -1
        assert_bytes_equal(pread_all(second, len(ref) + 1), bytes(ref), "after first close")
        put(second, b"last", 3)
    finally:
        for fd in (first, second):
            if fd >= 0:
                os.close(fd)
    assert_bytes_equal(read_file(f), bytes(ref), "after both closed")


def test_rename_while_source_fd_open(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    a, b = rbytes(CHUNK + 100, "a"), rbytes(CHUNK + 200, "b")
    fd = os.open(mp / "writing.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, a)
        os.rename(mp / "writing.tmp", mp / "done")
        os.write(fd, b)
        os.fsync(fd)
        assert os.fstat(fd).st_size == len(a) + len(b)
    finally:
        os.close(fd)
    expect_errno(errno.ENOENT, os.stat, mp / "writing.tmp")
    assert os.stat(mp / "done").st_size == len(a) + len(b)
    assert_bytes_equal(read_file(mp / "done"), a + b)


def test_rename_across_directories(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    (mp / "tmp").mkdir()
    (mp / "ckpt" / "step1").mkdir(parents=True)
    d1, d2 = rbytes(CHUNK * 2, 1), rbytes(1000, 2)
    write_file(mp / "tmp" / "x", d1)
    write_file(mp / "tmp" / "y", d2)
    write_file(mp / "ckpt" / "step1" / "y", b"to be replaced")
    os.rename(mp / "tmp" / "x", mp / "ckpt" / "step1" / "x")
    os.rename(mp / "tmp" / "y", mp / "ckpt" / "step1" / "y")
    assert os.listdir(mp / "tmp") == []
    assert sorted(os.listdir(mp / "ckpt" / "step1")) == ["x", "y"]
    assert_bytes_equal(read_file(mp / "ckpt" / "step1" / "x"), d1)
    assert_bytes_equal(read_file(mp / "ckpt" / "step1" / "y"), d2)
    expect_errno(errno.ENOENT, os.stat, mp / "tmp" / "x")


def test_rename_nonempty_directory_tree(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    src = mp / "step_100.orbax-checkpoint-tmp"
    files = {
        "a/b/leaf": rbytes(10, "leaf"),
        "a/shard": rbytes(CHUNK + 1, "shard"),
        "big": rbytes(3 * CHUNK, "big"),
        "a/b/c/d/deep": b"deep",
    }
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        write_file(src / rel, data)
    fd = os.open(src / "a" / "shard", os.O_WRONLY | os.O_APPEND)
    dst = mp / "step_100"
    try:
        os.rename(src, dst)
        os.write(fd, b"appended after dir rename")
    finally:
        os.close(fd)
    files["a/shard"] += b"appended after dir rename"
    expect_errno(errno.ENOENT, os.stat, src)
    expect_errno(errno.ENOENT, os.stat, src / "big")
    for rel, data in files.items():
        assert_bytes_equal(read_file(dst / rel), data, rel)
    # Move it again, into another directory and onto an existing empty directory.
    (mp / "final").mkdir()
    (mp / "final" / "step_100").mkdir()
    os.rename(dst, mp / "final" / "step_100")
    for rel, data in files.items():
        assert_bytes_equal(read_file(mp / "final" / "step_100" / rel), data, rel)
    assert sorted(os.listdir(mp)) == ["final"]
    # Onto a non-empty directory: refused.
    (mp / "other" / "x").mkdir(parents=True)
    expect_errno((errno.ENOTEMPTY, errno.EEXIST), os.rename, mp / "other", mp / "final")
    expect_errno((errno.ENOTEMPTY, errno.EEXIST), os.rename, mp / "final", mp / "other")


# --------------------------------------------------------------------------- unlink / rmdir


def test_unlink(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    write_file(mp / "f", rbytes(CHUNK * 2, "u"))
    (mp / "g").write_bytes(b"g")
    os.unlink(mp / "f")
    expect_errno(errno.ENOENT, os.stat, mp / "f")
    expect_errno(errno.ENOENT, os.unlink, mp / "f")
    assert os.listdir(mp) == ["g"]
    # A new file under the same name starts empty.
    (mp / "f").write_bytes(b"new")
    assert read_file(mp / "f") == b"new"


def test_unlink_while_open(ckpt_factory: Any) -> None:
    m = ckpt_factory.mount()
    mp = m.mountpoint
    data = rbytes(2 * CHUNK + 5, "open-unlinked")
    write_file(mp / "f", data)
    ckpt_factory.remount(m)  # empty page cache
    fd = os.open(mp / "f", os.O_RDWR)
    try:
        os.unlink(mp / "f")
        expect_errno(errno.ENOENT, os.stat, mp / "f")
        assert os.listdir(mp) == []
        assert os.fstat(fd).st_nlink == 0
        assert_bytes_equal(pread_all(fd, len(data) + 1), data, "unlinked file through fd")
        os.pwrite(fd, b"more", len(data))
        assert pread_all(fd, len(data) + 10) == data + b"more"
        (mp / "f").write_bytes(b"replacement")  # same name, different file
        assert read_file(mp / "f") == b"replacement"
        assert pread_all(fd, len(data) + 10) == data + b"more"
    finally:
        os.close(fd)
    assert read_file(mp / "f") == b"replacement"
    ckpt_factory.remount(m)
    assert os.listdir(mp) == ["f"]
    assert read_file(mp / "f") == b"replacement"


def test_rmdir_and_enotempty(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    (mp / "d" / "sub").mkdir(parents=True)
    expect_errno(errno.ENOTEMPTY, os.rmdir, mp / "d")
    os.rmdir(mp / "d" / "sub")
    (mp / "d" / "f").write_bytes(b"x")
    expect_errno(errno.ENOTEMPTY, os.rmdir, mp / "d")
    os.unlink(mp / "d" / "f")
    os.rmdir(mp / "d")
    expect_errno(errno.ENOENT, os.stat, mp / "d")
    expect_errno(errno.ENOENT, os.rmdir, mp / "d")
    assert os.listdir(mp) == []


def test_rmdir_via_dir_fd(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    (mp / "parent" / "child").mkdir(parents=True)
    (mp / "parent" / "file").write_bytes(b"x")
    dfd = os.open(mp / "parent", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rmdir("child", dir_fd=dfd)  # unlinkat(dfd, "child", AT_REMOVEDIR)
        os.unlink("file", dir_fd=dfd)
        assert os.listdir(dfd) == []
    finally:
        os.close(dfd)
    os.rmdir(mp / "parent")
    assert os.listdir(mp) == []


def test_rmtree_nested(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    root = mp / "checkpoint-500"
    for i in range(4):
        for j in range(3):
            d = root / f"d{i}" / f"e{j}"
            d.mkdir(parents=True)
            for k in range(3):
                (d / f"f{k}").write_bytes(rbytes(1000 * k, (i, j, k).__repr__()))
    write_file(root / "big", rbytes(3 * CHUNK, "big"))
    (root / ".hidden").write_bytes(b"h")
    os.symlink("big", root / "link")
    (mp / "keep").write_bytes(b"keep")
    assert shutil.rmtree.avoids_symlink_attacks  # the fd-based (openat/unlinkat) variant
    shutil.rmtree(root)
    expect_errno(errno.ENOENT, os.stat, root)
    assert os.listdir(mp) == ["keep"]


# --------------------------------------------------------------------------- fsync


def test_fsync_file_and_directory(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    (mp / "d").mkdir()
    fd = os.open(mp / "d" / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, rbytes(CHUNK + 1, "s"))
        os.fsync(fd)
        os.fdatasync(fd)
        os.write(fd, b"more")
        os.fsync(fd)
    finally:
        os.close(fd)
    rfd = os.open(mp / "d" / "f", os.O_RDONLY)
    try:
        os.fsync(rfd)
    finally:
        os.close(rfd)
    for path, flags in (
        (mp / "d", os.O_RDONLY),
        (mp / "d", os.O_RDONLY | os.O_DIRECTORY),
        (mp, os.O_RDONLY),
    ):
        dfd = os.open(path, flags)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    assert_bytes_equal(read_file(mp / "d" / "f"), rbytes(CHUNK + 1, "s") + b"more")


@pytest.mark.parametrize("change", ["overwrite", "o_trunc", "ftruncate"])
def test_fsync_after_other_fds_committed(ckpt: Any, change: str) -> None:
    """tensorstore-style: write, read back through another fd, change the data, fsync.

    A second fd's close commits the open file; the data written before it is then replaced
    (overwrite, or truncation through yet another fd) and its old chunk collected. fsync on
    the writer must still succeed.
    """
    f = ckpt.mountpoint / "f"
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"version-1", 0)
        assert read_file(f) == b"version-1"  # open, read, close a second fd
        if change == "overwrite":
            os.pwrite(fd, b"version-2", 0)
            want = b"version-2"
        elif change == "o_trunc":
            with open(f, "wb"):
                pass
            want = b""
        else:
            other = os.open(f, os.O_WRONLY)
            os.ftruncate(other, 3)
            os.close(other)
            want = b"ver"
        assert read_file(f) == want  # and commit again
        os.fsync(fd)
        assert pread_all(fd, 100) == want
    finally:
        os.close(fd)
    assert read_file(f) == want


def test_metadata_changes_while_open_survive_close(ckpt_factory: Any) -> None:
    """chmod/chown/utime on a file that is open with pending writes; close must keep them."""
    m = ckpt_factory.mount()
    f = m.mountpoint / "f"
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, rbytes(CHUNK + 10, "meta"))
        os.chmod(f, 0o600)
        os.utime(f, ns=(OLD_NS, OLD_NS))
    finally:
        os.close(fd)
    st = os.stat(f)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_mtime_ns == OLD_NS
    fd = os.open(f, os.O_RDWR)
    try:
        os.write(fd, b"y")
        os.fchmod(fd, 0o640)
        os.write(fd, rbytes(CHUNK, "meta2"))
        if os.geteuid() == 0:
            os.fchown(fd, 1234, 5678)
    finally:
        os.close(fd)
    st = os.stat(f)
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert st.st_mtime_ns > OLD_NS
    ckpt_factory.remount(m)
    st2 = os.stat(f)
    assert stat.S_IMODE(st2.st_mode) == 0o640
    assert st2.st_mtime_ns == st.st_mtime_ns
    if os.geteuid() == 0:
        assert (st2.st_uid, st2.st_gid) == (1234, 5678)
    assert st2.st_size == CHUNK + 10


# --------------------------------------------------------------------------- truncate


def test_ftruncate_shrink_and_extend(ckpt: Any) -> None:
    f = ckpt.mountpoint / "t"
    data = rbytes(3 * CHUNK, "t")
    write_file(f, data)
    fd = os.open(f, os.O_RDWR)
    try:
        os.ftruncate(fd, CHUNK + 100)
        assert os.fstat(fd).st_size == CHUNK + 100
        assert pread_all(fd, 3 * CHUNK) == data[: CHUNK + 100]
        os.ftruncate(fd, 3 * CHUNK)
        assert os.fstat(fd).st_size == 3 * CHUNK
        want = data[: CHUNK + 100] + bytes(2 * CHUNK - 100)
        assert_bytes_equal(pread_all(fd, 4 * CHUNK), want, "extended (open)")
    finally:
        os.close(fd)
    assert os.stat(f).st_size == 3 * CHUNK
    assert_bytes_equal(read_file(f), want, "extended (reopened)")


@pytest.mark.parametrize("cut", [10, CHUNK // 2, CHUNK, CHUNK + 1, 2 * CHUNK - 1])
def test_truncate_mid_chunk_then_extend_reads_zeros(ckpt: Any, cut: int) -> None:
    """Bytes past a truncation point must read as zeros after the file grows again."""
    f = ckpt.mountpoint / "mid"
    data = rbytes(2 * CHUNK + 500, "mid")
    write_file(f, data)
    os.truncate(f, cut)
    assert os.stat(f).st_size == cut
    assert read_file(f) == data[:cut]
    os.truncate(f, 2 * CHUNK + 500)
    assert_bytes_equal(read_file(f), data[:cut] + bytes(2 * CHUNK + 500 - cut), "after extend")
    # Shrink again, then grow by a write past EOF (leaving a hole).
    os.truncate(f, cut)
    fd = os.open(f, os.O_WRONLY)
    try:
        os.pwrite(fd, b"END", 3 * CHUNK)
    finally:
        os.close(fd)
    assert_bytes_equal(read_file(f), data[:cut] + bytes(3 * CHUNK - cut) + b"END", "after hole")


def test_ftruncate_preallocate_then_pwrite(ckpt: Any) -> None:
    """safetensors-style: ftruncate to the final size, then fill in the pieces."""
    f = ckpt.mountpoint / "prealloc"
    size = 3 * CHUNK + 1000
    data = rbytes(size, "pre")
    fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        assert os.fstat(fd).st_size == size
        assert pread_all(fd, size) == bytes(size)
        pieces = list(range(0, size, 70_000))
        random.Random(3).shuffle(pieces)
        for off in pieces:
            os.pwrite(fd, data[off : off + 70_000], off)
        assert os.fstat(fd).st_size == size
    finally:
        os.close(fd)
    assert_bytes_equal(read_file(f), data)


def test_sparse_write_beyond_eof(ckpt: Any) -> None:
    f = ckpt.mountpoint / "sparse"
    fd = os.open(f, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"head", 0)
        os.pwrite(fd, b"tail", 5 * CHUNK + 3)
        assert os.fstat(fd).st_size == 5 * CHUNK + 7
    finally:
        os.close(fd)
    assert_bytes_equal(read_file(f), b"head" + bytes(5 * CHUNK - 1) + b"tail")


# --------------------------------------------------------------------------- attributes


def test_chmod(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    old_umask = os.umask(0o022)
    try:
        fd = os.open(mp / "f", os.O_WRONLY | os.O_CREAT, 0o666)
        os.close(fd)
        assert stat.S_IMODE(os.stat(mp / "f").st_mode) == 0o644
        fd = os.open(mp / "private", os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
        assert stat.S_IMODE(os.stat(mp / "private").st_mode) == 0o600
        os.mkdir(mp / "d", 0o750)
        assert stat.S_IMODE(os.stat(mp / "d").st_mode) == 0o750
    finally:
        os.umask(old_umask)
    for mode in (0o600, 0o755, 0o640, 0o4755, 0o000, 0o777):
        os.chmod(mp / "f", mode)
        assert stat.S_IMODE(os.stat(mp / "f").st_mode) == mode
    os.chmod(mp / "f", 0o644)
    os.chmod(mp / "f", os.stat(mp / "f").st_mode | stat.S_IXUSR)  # DeepSpeed's zero_to_fp32 +x
    assert stat.S_IMODE(os.stat(mp / "f").st_mode) == 0o744
    assert stat.S_ISREG(os.stat(mp / "f").st_mode)
    os.chmod(mp / "d", 0o700)
    assert stat.S_IMODE(os.stat(mp / "d").st_mode) == 0o700
    assert stat.S_ISDIR(os.stat(mp / "d").st_mode)
    fd = os.open(mp / "f", os.O_RDONLY)
    try:
        os.fchmod(fd, 0o600)
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_chown(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    (mp / "f").write_bytes(b"x")
    (mp / "d").mkdir()
    os.chown(mp / "f", 1234, 4321)
    st = os.stat(mp / "f")
    assert (st.st_uid, st.st_gid) == (1234, 4321)
    os.chown(mp / "f", -1, 99)
    st = os.stat(mp / "f")
    assert (st.st_uid, st.st_gid) == (1234, 99)
    os.chown(mp / "d", 555, 666)
    st = os.stat(mp / "d")
    assert (st.st_uid, st.st_gid) == (555, 666)
    assert read_file(mp / "f") == b"x"


def test_utime_ns_precision(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    (mp / "f").write_bytes(b"x")
    (mp / "d").mkdir()
    atime, mtime = 1_234_567_890_123_456_789, 1_300_000_000_987_654_321
    for p in (mp / "f", mp / "d"):
        os.utime(p, ns=(atime, mtime))
        st = os.stat(p)
        assert st.st_mtime_ns == mtime, p
        assert st.st_atime_ns == atime, p
    # utime(None) means "now".
    before = time.time_ns()
    os.utime(mp / "f")
    after = time.time_ns()
    st = os.stat(mp / "f")
    assert before - 2 * 10**9 <= st.st_mtime_ns <= after + 2 * 10**9
    # shutil.copystat (used by copy2/copytree) must not fail.
    (mp / "g").write_bytes(b"y")
    os.utime(mp / "g", ns=(atime, mtime))
    shutil.copystat(mp / "g", mp / "f")
    assert os.stat(mp / "f").st_mtime_ns == mtime


def test_mtime_updated_by_writes(ckpt: Any) -> None:
    f = ckpt.mountpoint / "f"
    write_file(f, b"v1")
    os.utime(f, ns=(OLD_NS, OLD_NS))
    fd = os.open(f, os.O_WRONLY)
    try:
        os.pwrite(fd, rbytes(CHUNK + 5, "m"), 0)
    finally:
        os.close(fd)
    t1 = os.stat(f).st_mtime_ns
    assert t1 > OLD_NS
    assert abs(t1 - time.time_ns()) < 60 * 10**9
    os.utime(f, ns=(OLD_NS, OLD_NS))
    os.truncate(f, 10)
    assert os.stat(f).st_mtime_ns > OLD_NS
    # Monotonic across a series of writes.
    last = os.stat(f).st_mtime_ns
    for i in range(5):
        with open(f, "ab") as fh:
            fh.write(b"%d" % i)
        now = os.stat(f).st_mtime_ns
        assert now >= last
        last = now


def test_mtime_stable_after_close(ckpt: Any) -> None:
    """Closing (flush/release) and reading must not move mtime (HF/Lightning sort by it)."""
    f = ckpt.mountpoint / "f"
    write_file(f, rbytes(2 * CHUNK + 1, "st"))
    st1 = os.stat(f)
    assert read_file(f) == rbytes(2 * CHUNK + 1, "st")
    fd = os.open(f, os.O_RDWR)
    os.fsync(fd)
    os.close(fd)
    st2 = os.stat(f)
    assert st2.st_mtime_ns == st1.st_mtime_ns
    assert st2.st_size == st1.st_size


def test_directory_mtime_on_create_unlink_rename(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    d, e = mp / "d", mp / "e"
    d.mkdir()
    e.mkdir()

    def changes(what: str, op: Callable[[], Any], *dirs: Path) -> None:
        for x in dirs:
            os.utime(x, ns=(OLD_NS, OLD_NS))
        op()
        for x in dirs:
            assert os.stat(x).st_mtime_ns > OLD_NS, f"{what}: mtime of {x.name} not updated"

    changes("create", lambda: (d / "f").write_bytes(b"x"), d)
    changes("mkdir", lambda: (d / "sub").mkdir(), d)
    changes("symlink", lambda: os.symlink("f", d / "l"), d)
    changes("rename within", lambda: os.rename(d / "f", d / "g"), d)
    changes("rename across", lambda: os.rename(d / "g", e / "g"), d, e)
    changes("unlink", lambda: os.unlink(e / "g"), e)
    changes("rmdir", lambda: os.rmdir(d / "sub"), d)
    # Monotonic over a series of operations without resetting.
    last = os.stat(d).st_mtime_ns
    for i in range(6):
        (d / f"n{i}").write_bytes(b"")
        if i % 2:
            os.unlink(d / f"n{i - 1}")
        now = os.stat(d).st_mtime_ns
        assert now >= last
        last = now


def test_symlink_readlink_lstat(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    (mp / "ckpt-10").mkdir()
    write_file(mp / "ckpt-10" / "model.pt", b"weights")
    os.symlink("ckpt-10/model.pt", mp / "last.ckpt")
    os.symlink("ckpt-10", mp / "latest")
    os.symlink("does-not-exist", mp / "dangling")
    assert os.readlink(mp / "last.ckpt") == "ckpt-10/model.pt"
    st = os.lstat(mp / "last.ckpt")
    assert stat.S_ISLNK(st.st_mode)
    assert st.st_size == len("ckpt-10/model.pt")
    assert os.path.islink(mp / "last.ckpt")
    assert not os.path.islink(mp / "ckpt-10")
    assert stat.S_ISREG(os.stat(mp / "last.ckpt").st_mode)
    assert read_file(mp / "last.ckpt") == b"weights"
    assert os.listdir(mp / "latest") == ["model.pt"]
    assert os.path.islink(mp / "dangling")
    expect_errno(errno.ENOENT, os.stat, mp / "dangling")
    expect_errno(errno.EEXIST, os.symlink, "x", mp / "latest")
    # Replacing a link Lightning-style: unlink, re-create.
    os.unlink(mp / "last.ckpt")
    os.symlink("/absolute/elsewhere", mp / "last.ckpt")
    assert os.readlink(mp / "last.ckpt") == "/absolute/elsewhere"
    assert read_file(mp / "ckpt-10" / "model.pt") == b"weights"
    assert sorted(os.listdir(mp)) == ["ckpt-10", "dangling", "last.ckpt", "latest"]


def test_o_append_from_two_fds(ckpt: Any) -> None:
    f = ckpt.mountpoint / "progress.txt"
    f.write_bytes(b"start\n")
    fd1 = os.open(f, os.O_WRONLY | os.O_APPEND)
    fd2 = os.open(f, os.O_WRONLY | os.O_APPEND)
    want = bytearray(b"start\n")
    try:
        for i in range(8):
            for fd, tag in ((fd1, "a"), (fd2, "b")):
                line = (f"{tag}{i}:" + "x" * (50_000 * (i % 3))).encode() + b"\n"
                assert os.write(fd, line) == len(line)
                want += line
        # Even after a seek, O_APPEND writes go to the end.
        os.lseek(fd1, 0, os.SEEK_SET)
        os.write(fd1, b"end\n")
        want += b"end\n"
        assert os.fstat(fd2).st_size == len(want)
    finally:
        os.close(fd1)
        os.close(fd2)
    assert len(want) > CHUNK
    assert_bytes_equal(read_file(f), bytes(want))


def test_statvfs(ckpt: Any) -> None:
    sv = os.statvfs(ckpt.mountpoint)
    assert sv.f_bsize > 0 and sv.f_frsize > 0
    assert sv.f_blocks > 0
    assert sv.f_bavail > 0
    assert sv.f_bfree >= sv.f_bavail
    assert sv.f_blocks >= sv.f_bfree
    assert sv.f_namemax >= 255
    du = shutil.disk_usage(ckpt.mountpoint)
    assert du.total > 0 and du.free > 0 and du.used >= 0


def test_o_direct_open(ckpt: Any) -> None:
    f = ckpt.mountpoint / "direct"
    try:
        fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError as e:
        assert e.errno == errno.EINVAL, f"O_DIRECT open: {e}"
        return
    size = 2 * 4096 + CHUNK
    buf = mmap.mmap(-1, size)  # page-aligned
    data = rbytes(size, "direct")
    buf.write(data)
    try:
        assert os.pwrite(fd, buf, 0) == size
        back = mmap.mmap(-1, size)
        assert os.preadv(fd, [back], 0) == size
        assert back[:] == data
    finally:
        os.close(fd)
    assert_bytes_equal(read_file(f), data)


def test_hard_links(ckpt_factory: Any) -> None:
    m = ckpt_factory.mount()
    mp = m.mountpoint
    write_file(mp / "a", b"shared")
    try:
        os.link(mp / "a", mp / "b")
    except OSError as e:
        assert e.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM), f"link: {e}"
        expect_errno(errno.ENOENT, os.stat, mp / "b")
        assert os.stat(mp / "a").st_nlink == 1
        return
    sa, sb = os.stat(mp / "a"), os.stat(mp / "b")
    assert sa.st_ino == sb.st_ino
    assert sa.st_nlink == sb.st_nlink == 2
    with open(mp / "a", "ab") as fh:
        fh.write(b"+more")
    assert read_file(mp / "b") == b"shared+more"
    (mp / "d").mkdir()
    os.link(mp / "b", mp / "d" / "c")
    assert os.stat(mp / "a").st_nlink == 3
    expect_errno(errno.EEXIST, os.link, mp / "a", mp / "b")
    ckpt_factory.remount(m)
    sa, sc = os.stat(mp / "a"), os.stat(mp / "d" / "c")
    assert sa.st_ino == sc.st_ino and sa.st_nlink == sc.st_nlink == 3
    os.unlink(mp / "a")
    assert os.stat(mp / "b").st_nlink == 2
    assert read_file(mp / "b") == b"shared+more"
    fd = os.open(mp / "d" / "c", os.O_WRONLY)
    os.pwrite(fd, b"S", 0)
    os.close(fd)
    assert read_file(mp / "b") == b"Shared+more"
    os.unlink(mp / "b")
    assert os.stat(mp / "d" / "c").st_nlink == 1
    ckpt_factory.remount(m)
    assert read_file(mp / "d" / "c") == b"Shared+more"
    assert os.stat(mp / "d" / "c").st_nlink == 1


def test_xattrs(ckpt: Any) -> None:
    # Stored like any POSIX filesystem's (was: setxattr refused with ENOTSUP).
    f = ckpt.mountpoint / "f"
    f.write_bytes(b"x")
    assert os.listxattr(f) == []
    os.setxattr(f, "user.ckpt", b"value")
    assert os.getxattr(f, "user.ckpt") == b"value"
    assert "user.ckpt" in os.listxattr(f)
    os.removexattr(f, "user.ckpt")
    assert "user.ckpt" not in os.listxattr(f)
    expect_errno(errno.ENODATA, os.getxattr, f, "user.missing")
    # copy2 copies xattrs.
    os.setxattr(f, "user.kept", b"1")
    shutil.copy2(f, ckpt.mountpoint / "g")
    assert read_file(ckpt.mountpoint / "g") == b"x"
    assert os.getxattr(ckpt.mountpoint / "g", "user.kept") == b"1"
    assert read_file(f) == b"x"


def _libc_fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


@pytest.mark.parametrize("how", ["fallocate", "posix_fallocate"])
def test_fallocate(ckpt: Any, how: str) -> None:
    f = ckpt.mountpoint / "falloc"
    data = rbytes(1000, "fa")
    write_file(f, data)
    fd = os.open(f, os.O_RDWR)
    try:
        try:
            if how == "fallocate":
                _libc_fallocate(fd, 0, 500, 2 * CHUNK)
            else:
                os.posix_fallocate(fd, 500, 2 * CHUNK)
        except OSError as e:
            assert e.errno in (errno.EOPNOTSUPP, errno.ENOTSUP), f"{how}: {e}"
            want = data
        else:
            want = data + bytes(500 + 2 * CHUNK - len(data))
        assert os.fstat(fd).st_size == len(want)
        assert_bytes_equal(pread_all(fd, len(want) + 10), want, how)
    finally:
        os.close(fd)
    assert_bytes_equal(read_file(f), want, how)


def test_byte_range_and_flock_locks(ckpt: Any) -> None:
    f = ckpt.mountpoint / "lockfile"
    f.write_bytes(b"x" * 100)
    fd1 = os.open(f, os.O_RDWR)
    fd2 = os.open(f, os.O_RDWR)
    try:
        # Open-file-description locks (tensorstore uses F_OFD_SETLKW).
        lk = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        fcntl.fcntl(fd1, fcntl.F_OFD_SETLKW, lk)
        expect_errno((errno.EAGAIN, errno.EACCES), fcntl.fcntl, fd2, fcntl.F_OFD_SETLK, lk)
        unlk = struct.pack("hhqqi4x", fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0)
        fcntl.fcntl(fd1, fcntl.F_OFD_SETLK, unlk)
        fcntl.fcntl(fd2, fcntl.F_OFD_SETLK, lk)
        fcntl.fcntl(fd2, fcntl.F_OFD_SETLK, unlk)
        # flock.
        fcntl.flock(fd1, fcntl.LOCK_EX)
        expect_errno(errno.EWOULDBLOCK, fcntl.flock, fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd1, fcntl.LOCK_UN)
        fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd2, fcntl.LOCK_UN)
        # POSIX lockf, checked from another process.
        fcntl.lockf(fd1, fcntl.LOCK_EX)
        probe = (
            "import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "try:\n    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
            "except OSError as e:\n    print(e.errno)\nelse:\n    print('locked')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, str(f)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        assert out in (str(errno.EAGAIN), str(errno.EACCES)), out
        fcntl.lockf(fd1, fcntl.LOCK_UN)
    finally:
        os.close(fd1)
        os.close(fd2)


# --------------------------------------------------------------------------- concurrency


def _writer_data(i: int) -> bytes:
    return rbytes(2 * CHUNK + 1000 * i + 7, f"writer{i}")


def _write_one(path: str, i: int) -> str:
    """Write file ``i`` in odd-sized pieces; return its sha256. Runs in threads and processes."""
    data = _writer_data(i)
    piece = 60_000 + 1_111 * i
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, len(data), piece):
            os.write(fd, data[off : off + piece])
    finally:
        os.close(fd)
    return hashlib.sha256(data).hexdigest()


def test_concurrent_writer_threads(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            _write_one(str(mp / f"thread_{i}.bin"), i)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "writer threads hung"
    assert not errors, errors
    for i in range(8):
        assert_bytes_equal(read_file(mp / f"thread_{i}.bin"), _writer_data(i), f"thread_{i}")
    assert len(os.listdir(mp)) == 8


def test_concurrent_writer_processes(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        res = [pool.apply_async(_write_one, (str(mp / f"proc_{i}.bin"), i)) for i in range(4)]
        digests = [r.get(timeout=120) for r in res]
    for i in range(4):
        got = read_file(mp / f"proc_{i}.bin")
        assert_bytes_equal(got, _writer_data(i), f"proc_{i}")
        assert hashlib.sha256(got).hexdigest() == digests[i]


def test_concurrent_pwrite_into_one_file(ckpt: Any) -> None:
    """Threads fill disjoint, chunk-unaligned regions of one file (shared chunks)."""
    f = ckpt.mountpoint / "shared.bin"
    region = 150_001
    data = rbytes(8 * region, "shared")
    fd = os.open(f, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            own = os.open(f, os.O_WRONLY)
            try:
                for off in range(i * region, (i + 1) * region, 33_333):
                    end = min(off + 33_333, (i + 1) * region)
                    os.pwrite(own, data[off:end], off)
            finally:
                os.close(own)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "writer threads hung"
        assert not errors, errors
        assert_bytes_equal(pread_all(fd, len(data) + 1), data, "while open")
    finally:
        os.close(fd)
    assert_bytes_equal(read_file(f), data, "after close")


# --------------------------------------------------------------------------- persistence


def _snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    snap: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                snap[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                snap[rel] = ("dir", st.st_mode, st.st_mtime_ns, st.st_uid, st.st_gid)
            else:
                content = read_file(p)
                assert len(content) == st.st_size, rel
                snap[rel] = (
                    "file",
                    st.st_mode,
                    st.st_size,
                    st.st_mtime_ns,
                    st.st_uid,
                    st.st_gid,
                    hashlib.sha256(content).hexdigest(),
                )
    return snap


def _diff(a: dict[str, tuple[Any, ...]], b: dict[str, tuple[Any, ...]]) -> list[str]:
    out = [f"only before: {k}" for k in a.keys() - b.keys()]
    out += [f"only after: {k}" for k in b.keys() - a.keys()]
    out += [f"{k}: {a[k]} != {b[k]}" for k in sorted(a.keys() & b.keys()) if a[k] != b[k]]
    return out


def test_data_survives_umount_and_remount(ckpt_factory: Any) -> None:
    m = ckpt_factory.mount()
    mp = m.mountpoint
    sizes = [0, 1, 4095, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 2 * MiB + 3]
    (mp / "ckpt" / "step_1" / "model").mkdir(parents=True)
    for s in sizes:
        write_file(mp / "ckpt" / "step_1" / f"f{s}", rbytes(s, s))
    # Holes, truncation, overwrite, rename, symlink, dotfiles, modes, explicit times.
    fd = os.open(mp / "sparse", os.O_RDWR | os.O_CREAT, 0o600)
    os.pwrite(fd, b"tail", 3 * CHUNK + 5)
    os.close(fd)
    write_file(mp / "truncated", rbytes(3 * CHUNK, "tr"))
    os.truncate(mp / "truncated", CHUNK + 100)
    write_file(mp / "overwritten", rbytes(2 * CHUNK, "ow"))
    fd = os.open(mp / "overwritten", os.O_WRONLY)
    os.pwrite(fd, rbytes(100_000, "patch"), CHUNK - 50_000)
    os.close(fd)
    write_file(mp / "ckpt" / "step_1" / "model" / "x.tmp", rbytes(CHUNK + 9, "x"))
    os.rename(mp / "ckpt" / "step_1" / "model" / "x.tmp", mp / "ckpt" / "step_1" / "model" / "x")
    os.rename(mp / "ckpt" / "step_1", mp / "ckpt" / "step_2")
    os.symlink("ckpt/step_2", mp / "latest")
    (mp / ".metadata").write_bytes(b"{}")
    (mp / "empty-dir").mkdir()
    os.chmod(mp / "ckpt" / "step_2" / "f1", 0o751)
    os.chmod(mp / "empty-dir", 0o700)
    os.utime(mp / "ckpt" / "step_2" / "f4095", ns=(OLD_NS, OLD_NS + 1))
    before = _snapshot(mp)
    assert before["sparse"][2] == 3 * CHUNK + 9

    ckpt_factory.remount(m)
    after = _snapshot(mp)
    assert not _diff(before, after), "\n".join(_diff(before, after))
    assert read_file(mp / "sparse") == bytes(3 * CHUNK + 5) + b"tail"
    assert read_file(mp / "truncated") == rbytes(3 * CHUNK, "tr")[: CHUNK + 100]

    # Change things after the remount; they must survive the next one as well.
    with open(mp / "ckpt" / "step_2" / "f1", "ab") as fh:
        fh.write(rbytes(CHUNK, "app"))
    os.unlink(mp / "ckpt" / "step_2" / f"f{CHUNK}")
    write_file(mp / "ckpt" / "step_2" / "new", rbytes(CHUNK + 3, "new"))
    before = _snapshot(mp)
    ckpt_factory.remount(m)
    after = _snapshot(mp)
    assert not _diff(before, after), "\n".join(_diff(before, after))
    assert_bytes_equal(
        read_file(mp / "ckpt" / "step_2" / "f1"), rbytes(1, 1) + rbytes(CHUNK, "app")
    )


# --------------------------------------------------------------------------- names / readdir


def test_dotfiles_and_odd_names(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    names = [
        ".hidden",
        ".a.b",
        "..double",
        "...",
        ".metadata",
        ".tmp-123.partial",
        "name with spaces",
        "ünïcødé-名前",
        "x" * 255,
        "-dash",
        "a=b,c;d",
    ]
    for i, n in enumerate(names):
        (mp / n).write_bytes(f"{i}".encode())
    (mp / ".cache" / "sub").mkdir(parents=True)
    (mp / ".cache" / "sub" / ".f").write_bytes(b"deep")
    assert sorted(os.listdir(mp)) == sorted(names + [".cache"])
    for i, n in enumerate(names):
        assert read_file(mp / n) == f"{i}".encode(), n
    os.rename(mp / ".tmp-123.partial", mp / "final")
    assert (mp / "final").read_bytes() == str(names.index(".tmp-123.partial")).encode()
    assert read_file(mp / ".cache" / "sub" / ".f") == b"deep"
    expect_errno(errno.ENOENT, os.stat, mp / ".tmp-123.partial")


def test_name_longer_than_namemax(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    namemax = os.statvfs(mp).f_namemax
    ok = "n" * namemax
    (mp / ok).write_bytes(b"x")
    assert os.listdir(mp) == [ok]
    long = "n" * (namemax + 1)
    expect_errno(errno.ENAMETOOLONG, os.open, mp / long, os.O_WRONLY | os.O_CREAT, 0o644)
    expect_errno(errno.ENAMETOOLONG, os.mkdir, mp / long)
    expect_errno(errno.ENAMETOOLONG, os.symlink, "x", mp / long)
    expect_errno(errno.ENAMETOOLONG, os.rename, mp / ok, mp / long)
    expect_errno(errno.ENAMETOOLONG, os.stat, mp / long)
    assert os.listdir(mp) == [ok]


def test_readdir_listing(ckpt: Any) -> None:
    mp = ckpt.mountpoint
    d = mp / "dir"
    d.mkdir()
    for n in ("f1", "f2", ".dot"):
        (d / n).write_bytes(n.encode())
    (d / "sub").mkdir()
    os.symlink("f1", d / "link")
    assert sorted(os.listdir(d)) == [".dot", "f1", "f2", "link", "sub"]
    kinds = {}
    with os.scandir(d) as it:
        for e in it:
            kinds[e.name] = (
                e.is_file(follow_symlinks=False),
                e.is_dir(follow_symlinks=False),
                e.is_symlink(),
            )
            assert e.inode() == os.lstat(d / e.name).st_ino, e.name
    assert kinds == {
        ".dot": (True, False, False),
        "f1": (True, False, False),
        "f2": (True, False, False),
        "sub": (False, True, False),
        "link": (False, False, True),
    }
    # fd-based scandir (fwalk, rmtree).
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(dfd) as it:
            assert sorted(e.name for e in it) == [".dot", "f1", "f2", "link", "sub"]
    finally:
        os.close(dfd)
    # The listing follows changes.
    os.unlink(d / "f2")
    os.rename(d / "f1", d / "renamed")
    os.rmdir(d / "sub")
    assert sorted(os.listdir(d)) == [".dot", "link", "renamed"]
    assert sorted(os.listdir(mp)) == ["dir"]
    walked = [
        (Path(r).relative_to(mp).as_posix(), sorted(ds), sorted(fs)) for r, ds, fs in os.walk(mp)
    ]
    assert walked == [(".", ["dir"], []), ("dir", [], [".dot", "link", "renamed"])]


def test_many_files_in_one_directory(ckpt: Any) -> None:
    d = ckpt.mountpoint / "shards"
    d.mkdir()
    # Long, varied names: the listing needs several readdir calls (offsets must resume).
    names = [f"{i:04d}_" + "n" * (i % 200) + ".distcp" for i in range(300)]
    for i, n in enumerate(names):
        (d / n).write_bytes(i.to_bytes(2, "little") * (i % 7))
    assert sorted(os.listdir(d)) == sorted(names)
    with os.scandir(d) as it:
        entries = list(it)
    assert len(entries) == 300
    assert sorted(e.name for e in entries) == sorted(names)
    assert len({e.inode() for e in entries}) == 300
    for i, n in enumerate(names):
        assert read_file(d / n) == i.to_bytes(2, "little") * (i % 7)
    for n in names[::2]:
        os.unlink(d / n)
    assert sorted(os.listdir(d)) == sorted(names[1::2])
    shutil.rmtree(d)
    assert os.listdir(ckpt.mountpoint) == []


def test_unlink_while_iterating_directory(ckpt: Any) -> None:
    """Deleting entries as readdir returns them must not make it skip the others."""
    d = ckpt.mountpoint / "cleanup"
    d.mkdir()
    names = {f"{i:04d}_" + "n" * (i % 200) for i in range(300)}
    for n in names:
        (d / n).write_bytes(b"")
    seen = []
    with os.scandir(d) as it:
        for e in it:
            seen.append(e.name)
            os.unlink(e.path)
    assert sorted(seen) == sorted(names)
    assert os.listdir(d) == []
    os.rmdir(d)


def test_write_only_overwrite_is_seen_by_a_reader_with_cached_pages(ckpt: Any) -> None:
    # Write-only handles bypass the page cache (direct I/O); their commit must drop pages
    # a reader cached earlier, or a later open would serve the old bytes.
    p = ckpt.mountpoint / "cached"
    old = rbytes(600_000, "old")
    write_file(p, old)
    assert p.read_bytes() == old  # now in the kernel page cache (keep_cache)
    fd = os.open(p, os.O_WRONLY)
    try:
        os.pwrite(fd, b"N" * 5000, 300_000)
    finally:
        os.close(fd)
    expected = old[:300_000] + b"N" * 5000 + old[305_000:]
    assert p.read_bytes() == expected
    with open(p, "rb") as f:
        assert mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)[:] == expected
