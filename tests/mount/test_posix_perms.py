"""Special files, the permission rules the kernel leaves to the filesystem, and stored
extended attributes, on a real ckptfs mount (what the pjdfstest suite checks, by cause).

Other users are real processes: the test runs a small Python child as another uid and
gid (subprocess ``user=``/``group=``), which reports the errno of each call it makes.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sqlite3
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.catalog.test_catalog import make_v1
from tests.mount.test_posix import expect_errno

from ckptfs.catalog.catalog import SCHEMA_VERSION
from ckptfs.vfs.filesystem import XATTR_TOTAL_MAX

# The children run a system Python: the test's own may live where other users cannot read.
CHILD_PYTHON = "/usr/bin/python3"
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(CHILD_PYTHON, os.X_OK),
    reason=f"needs root (other uids, chown, mknod) and {CHILD_PYTHON}",
)
NOBODY = 65534
OTHER = 4242  # a second unprivileged uid/gid


def as_user(cwd: Path, uid: int, gid: int, calls: list[str], groups: tuple[int, ...] = ()) -> list[int]:
    """Run each Python statement as uid/gid in a child, in ``cwd`` (entered before the ids
    change: the test's tmp dir is root's own); the errno of each (0: it worked)."""
    calls = [c.replace(str(cwd) + "/", "") for c in calls]  # paths relative to cwd
    code = (
        "import json, os, sys\n"
        "out = []\n"
        "for stmt in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        exec(stmt)\n"
        "        out.append(0)\n"
        "    except OSError as e:\n"
        "        out.append(e.errno)\n"
        "print(json.dumps(out))\n"
    )
    res = subprocess.run(
        [CHILD_PYTHON, "-c", code, json.dumps(calls)], user=uid, group=gid,
        extra_groups=list(groups), cwd=cwd, capture_output=True, text=True, timeout=60, check=True,
    )
    return list(json.loads(res.stdout))


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


# --------------------------------------------------------------------------- special files


@needs_root
def test_special_files_are_inodes_with_rdev_and_survive_remount(ckpt_factory: Any) -> None:
    m = ckpt_factory.mount()
    mp = m.mountpoint
    os.mkfifo(mp / "fifo", 0o640)
    os.mknod(mp / "chr", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    os.mknod(mp / "blk", stat.S_IFBLK | 0o660, os.makedev(8, 17))
    os.mknod(mp / "reg", stat.S_IFREG | 0o644)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(mp / "sock"))
    finally:
        s.close()
    expect_errno(errno.EEXIST, os.mkfifo, mp / "fifo")

    def check() -> None:
        st = {n: os.lstat(mp / n) for n in ("fifo", "chr", "blk", "reg", "sock")}
        assert stat.S_ISFIFO(st["fifo"].st_mode) and mode(mp / "fifo") == 0o640
        assert stat.S_ISCHR(st["chr"].st_mode) and st["chr"].st_rdev == os.makedev(1, 3)
        assert stat.S_ISBLK(st["blk"].st_mode) and st["blk"].st_rdev == os.makedev(8, 17)
        assert stat.S_ISREG(st["reg"].st_mode) and st["reg"].st_size == 0
        assert stat.S_ISSOCK(st["sock"].st_mode)
        assert sorted(os.listdir(mp)) == ["blk", "chr", "fifo", "reg", "sock"]

    check()
    ckpt_factory.remount(m)
    check()
    # Special files take part in the namespace like any file.
    os.rename(mp / "fifo", mp / "fifo2")
    os.link(mp / "chr", mp / "chr2")
    assert os.lstat(mp / "chr").st_nlink == 2
    os.chown(mp / "blk", 123, 456)
    assert (os.lstat(mp / "blk").st_uid, os.lstat(mp / "blk").st_gid) == (123, 456)
    for n in ("fifo2", "chr", "chr2", "blk", "reg", "sock"):
        os.unlink(mp / n)
    assert os.listdir(mp) == []


def test_fifo_passes_data(ckpt: Any) -> None:
    f = ckpt.mountpoint / "pipe"
    os.mkfifo(f)
    fd = os.open(f, os.O_RDWR)  # Linux: a FIFO opened read-write does not block
    try:
        assert os.write(fd, b"through the pipe") == 16
        assert os.read(fd, 100) == b"through the pipe"
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- setuid, setgid


@needs_root
@pytest.mark.parametrize("flags", ["O_WRONLY", "O_RDWR"])
def test_write_by_another_user_clears_setuid(ckpt: Any, flags: str) -> None:
    mnt = ckpt.mountpoint
    f = ckpt.mountpoint / "prog"
    f.write_bytes(b"#!")
    os.chmod(f, 0o6777)
    assert as_user(mnt, NOBODY, NOBODY, [
        f"fd = os.open({str(f)!r}, os.{flags}); os.write(fd, b'x'); os.close(fd)",
    ]) == [0]
    assert mode(f) == 0o777  # setuid gone, setgid (with group exec) gone
    # The owner (root here) writing keeps the bits, as CAP_FSETID does.
    os.chmod(f, 0o6777)
    with open(f, "r+b") as fh:
        fh.write(b"y")
    assert mode(f) == 0o6777


@needs_root
def test_chown_clears_setuid_and_setgid_with_group_exec(ckpt: Any) -> None:
    f = ckpt.mountpoint / "f"
    f.write_bytes(b"x")
    os.chmod(f, 0o6755)
    os.chown(f, 1234, -1)
    assert mode(f) == 0o755
    os.chmod(f, 0o6745)  # setgid without group exec (mandatory locking): kept
    os.chown(f, -1, 99)
    assert mode(f) == 0o2745
    d = ckpt.mountpoint / "d"
    d.mkdir()
    os.chmod(d, 0o2775)
    os.chown(d, 1234, 99)  # directories keep setgid
    assert mode(d) == 0o2775


@needs_root
def test_chmod_and_chown_rules_for_non_owners(ckpt: Any) -> None:
    mnt = ckpt.mountpoint
    mp = ckpt.mountpoint
    os.chmod(mp, 0o777)
    f = mp / "mine"
    f.write_bytes(b"x")
    os.chown(f, NOBODY, NOBODY)
    p = str(f)
    got = as_user(mnt, NOBODY, NOBODY, [
        f"os.chmod({p!r}, 0o2755)",    # setgid on a group it is in: kept
        f"os.chown({p!r}, -1, {OTHER})",  # a group it is not in: EPERM
        f"os.chown({p!r}, {OTHER}, -1)",  # giving the file away: EPERM
    ])
    assert got == [0, errno.EPERM, errno.EPERM]
    assert mode(f) == 0o2755
    os.chown(f, NOBODY, OTHER)  # the file's group is not one of nobody's
    assert as_user(mnt, NOBODY, NOBODY, [f"os.chmod({p!r}, 0o2755)"]) == [0]
    assert mode(f) == 0o755  # setgid silently dropped
    assert as_user(mnt, OTHER, OTHER, [f"os.chmod({p!r}, 0o777)"]) == [errno.EPERM]
    # A member of the file's group (a supplementary group) may chown to it.
    os.chown(f, NOBODY, NOBODY)
    assert as_user(mnt, NOBODY, NOBODY, [f"os.chown({p!r}, -1, {OTHER})"], groups=(OTHER,)) == [0]
    assert os.stat(f).st_gid == OTHER


@needs_root
def test_setgid_directory_passes_its_group(ckpt: Any) -> None:
    mnt = ckpt.mountpoint
    d = ckpt.mountpoint / "shared"
    d.mkdir()
    os.chown(d, 0, OTHER)
    os.chmod(d, 0o2777)
    (d / "file").write_bytes(b"x")
    (d / "sub").mkdir()
    os.mkfifo(d / "fifo")
    assert os.stat(d / "file").st_gid == OTHER
    assert os.stat(d / "fifo").st_gid == OTHER
    assert os.stat(d / "sub").st_gid == OTHER and mode(d / "sub") & stat.S_ISGID
    # Also for another user, who is not in the group.
    assert as_user(mnt, NOBODY, NOBODY, [f"os.mkdir({str(d / 'n')!r})"]) == [0]
    assert os.stat(d / "n").st_gid == OTHER and mode(d / "n") & stat.S_ISGID
    assert os.stat(d / "n").st_uid == NOBODY


# --------------------------------------------------------------------------- sticky, times


@needs_root
def test_sticky_directory_only_owners_delete(ckpt: Any) -> None:
    mnt = ckpt.mountpoint
    t = ckpt.mountpoint / "tmp"
    t.mkdir()
    os.chmod(t, 0o1777)
    (t / "roots").write_bytes(b"x")
    (t / "rootdir").mkdir()
    got = as_user(mnt, NOBODY, NOBODY, [
        f"os.unlink({str(t / 'roots')!r})",
        f"os.rename({str(t / 'roots')!r}, {str(t / 'moved')!r})",
        f"os.rmdir({str(t / 'rootdir')!r})",
        f"open({str(t / 'own')!r}, 'w').close()",
        f"os.rename({str(t / 'own')!r}, {str(t / 'roots')!r})",  # replacing root's file
        f"os.rename({str(t / 'own')!r}, {str(t / 'own2')!r})",
        f"os.unlink({str(t / 'own2')!r})",
    ])
    assert got == [errno.EPERM, errno.EPERM, errno.EPERM, 0, errno.EPERM, 0, 0]
    assert sorted(os.listdir(t)) == ["rootdir", "roots"]
    # The directory's owner may delete anyone's entries.
    os.chown(t, NOBODY, NOBODY)
    assert as_user(mnt, NOBODY, NOBODY, [f"os.unlink({str(t / 'roots')!r})"]) == [0]


@needs_root
def test_utimensat_eperm_and_eacces(ckpt: Any) -> None:
    mnt = ckpt.mountpoint
    f = ckpt.mountpoint / "f"
    f.write_bytes(b"x")
    os.chmod(f, 0o666)
    p = str(f)
    got = as_user(mnt, NOBODY, NOBODY, [
        f"os.utime({p!r}, ns=(10**18, 10**18))",  # explicit times: owner only
        f"os.utime({p!r})",                      # now: anyone who may write
    ])
    assert got == [errno.EPERM, 0]
    os.chmod(f, 0o644)
    assert as_user(mnt, NOBODY, NOBODY, [f"os.utime({p!r})"]) == [errno.EACCES]
    os.chown(f, NOBODY, NOBODY)
    assert as_user(mnt, NOBODY, NOBODY, [f"os.utime({p!r}, ns=(10**18, 2 * 10**18))"]) == [0]
    assert os.stat(f).st_mtime_ns == 2 * 10**18


# --------------------------------------------------------------------------- extended attributes


def test_xattrs_set_get_list_remove_and_flags(ckpt: Any) -> None:
    f = ckpt.mountpoint / "f"
    f.write_bytes(b"x")
    before = os.stat(f).st_ctime_ns
    os.setxattr(f, "user.mime", b"text/plain")
    assert os.stat(f).st_ctime_ns > before
    os.setxattr(f, "user.empty", b"")
    assert os.getxattr(f, "user.mime") == b"text/plain"
    assert os.getxattr(f, "user.empty") == b""
    assert sorted(os.listxattr(f)) == ["user.empty", "user.mime"]
    expect_errno(errno.EEXIST, os.setxattr, f, "user.mime", b"y", os.XATTR_CREATE)
    expect_errno(errno.ENODATA, os.setxattr, f, "user.new", b"y", os.XATTR_REPLACE)
    os.setxattr(f, "user.mime", b"application/x", os.XATTR_REPLACE)
    os.setxattr(f, "user.new", b"y", os.XATTR_CREATE)
    assert os.getxattr(f, "user.mime") == b"application/x"
    expect_errno(errno.ENODATA, os.getxattr, f, "user.missing")
    os.removexattr(f, "user.new")
    expect_errno(errno.ENODATA, os.removexattr, f, "user.new")
    assert sorted(os.listxattr(f)) == ["user.empty", "user.mime"]
    big = os.urandom(65536)
    os.setxattr(f, "user.big", big)
    assert os.getxattr(f, "user.big") == big
    expect_errno(errno.E2BIG, os.setxattr, f, "user.big", big + b"x")
    expect_errno(errno.ERANGE, os.setxattr, f, "user." + "n" * 251, b"v")
    d = ckpt.mountpoint / "d"
    d.mkdir()
    os.setxattr(d, "user.on-a-dir", b"1")
    assert os.listxattr(d) == ["user.on-a-dir"]
    os.symlink("f", ckpt.mountpoint / "ln")
    expect_errno(errno.EPERM, os.setxattr, ckpt.mountpoint / "ln", "user.x", b"1",
                 follow_symlinks=False)
    expect_errno(errno.EOPNOTSUPP, os.setxattr, f, "bogus.ns", b"1")


def test_reserved_ckptfs_names_are_not_stored(ckpt: Any) -> None:
    f = ckpt.mountpoint / "f"
    f.write_bytes(b"x")
    for name in ("user.ckptfs.state", "user.ckptfs.checkpoint", "user.ckptfs.anything"):
        expect_errno(errno.EPERM, os.setxattr, f, name, b"mine")
        expect_errno(errno.ENODATA, os.getxattr, f, name)
        expect_errno(errno.EPERM, os.removexattr, f, name)
    assert os.listxattr(f) == []


@needs_root
def _setxattr_errno(path: Path, name: str, value: bytes) -> int:
    """0 or the errno of a setxattr (no 64 KiB value in a failure's message)."""
    try:
        os.setxattr(path, name, value)
    except OSError as exc:
        return exc.errno or -1
    return 0


def test_an_inodes_xattrs_are_bounded_in_total_with_enospc(ckpt: Any) -> None:
    """Issue 33: 1000 xattrs of 64 KiB on one inode were all stored. The names and values
    of one inode's xattrs hold XATTR_TOTAL_MAX bytes at most (ENOSPC, as ext4)."""
    f = ckpt.mountpoint / "f"
    f.write_bytes(b"x")
    big = os.urandom(65536)
    os.setxattr(f, "user.0", big)
    stored = 6 + len(big)
    i = 1
    while stored + 6 + len(big) <= XATTR_TOTAL_MAX:  # what still fits, if anything
        os.setxattr(f, f"user.{i}", big)
        stored, i = stored + 6 + len(big), i + 1
    assert _setxattr_errno(f, f"user.{i}", big) == errno.ENOSPC
    left = XATTR_TOTAL_MAX - stored - len(f"user.{i}")
    assert _setxattr_errno(f, f"user.{i}", os.urandom(left + 1)) == errno.ENOSPC
    os.setxattr(f, f"user.{i}", b"s" * left)  # exactly the bound
    assert sorted(os.listxattr(f)) == sorted(f"user.{n}" for n in range(i + 1))
    assert os.getxattr(f, "user.0") == big
    # A removal gives its room back; a replacement counts only the new value.
    os.removexattr(f, f"user.{i}")
    os.setxattr(f, "user.0", b"small")
    os.setxattr(f, "user.again", big)
    assert os.getxattr(f, "user.again") == big


def test_trusted_xattrs_for_root_only(ckpt: Any) -> None:
    mnt = ckpt.mountpoint
    f = ckpt.mountpoint / "f"
    f.write_bytes(b"x")
    os.chmod(f, 0o666)
    os.setxattr(f, "trusted.t", b"root's")
    os.setxattr(f, "user.u", b"all")
    assert sorted(os.listxattr(f)) == ["trusted.t", "user.u"]
    p = str(f)
    got = as_user(mnt, NOBODY, NOBODY, [
        f"assert os.listxattr({p!r}) == ['user.u'], os.listxattr({p!r})",
        f"os.getxattr({p!r}, 'trusted.t')",
        f"os.setxattr({p!r}, 'trusted.x', b'1')",
        f"os.setxattr({p!r}, 'user.v', b'2')",
    ])
    assert got == [0, errno.ENODATA, errno.EPERM, 0]
    os.chmod(f, 0o644)
    assert as_user(mnt, NOBODY, NOBODY, [f"os.setxattr({p!r}, 'user.w', b'3')"]) == [errno.EACCES]


def test_xattrs_survive_remount_and_rename_and_go_with_the_inode(ckpt_factory: Any) -> None:
    m = ckpt_factory.mount()
    mp = m.mountpoint
    (mp / "a").mkdir()
    f = mp / "a" / "f"
    f.write_bytes(b"x")
    os.setxattr(f, "user.k", b"v1")
    os.link(f, mp / "hard")
    assert os.getxattr(mp / "hard", "user.k") == b"v1"
    ckpt_factory.remount(m)
    assert os.getxattr(f, "user.k") == b"v1"
    os.rename(mp / "a", mp / "b")
    assert os.getxattr(mp / "b" / "f", "user.k") == b"v1"
    os.unlink(mp / "b" / "f")
    os.unlink(mp / "hard")
    (mp / "b" / "f").write_bytes(b"new")  # a new inode under the old name: no attributes
    assert os.listxattr(mp / "b" / "f") == []
    ckpt_factory.remount(m)
    assert os.listxattr(mp / "b" / "f") == []
    conn = sqlite3.connect(m.state_dir / "catalog.sqlite")
    try:
        assert conn.execute("SELECT count(*) FROM xattrs").fetchone()[0] == 0
    finally:
        conn.close()


def test_state_dir_of_schema_version_1_mounts_and_is_migrated(ckpt_factory: Any) -> None:
    m = ckpt_factory.mount()
    mp = m.mountpoint
    (mp / "run").mkdir()
    (mp / "run" / "step-1.pt").write_bytes(b"weights" * 1000)
    m.stop()
    db = m.state_dir / "catalog.sqlite"
    make_v1(db)
    m.start()
    assert (mp / "run" / "step-1.pt").read_bytes() == b"weights" * 1000
    os.mkfifo(mp / "run" / "fifo")
    os.setxattr(mp / "run" / "step-1.pt", "user.k", b"v")
    ckpt_factory.remount(m)
    assert stat.S_ISFIFO(os.lstat(mp / "run" / "fifo").st_mode)
    assert os.getxattr(mp / "run" / "step-1.pt", "user.k") == b"v"
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (str(SCHEMA_VERSION),)
    finally:
        conn.close()


@needs_root
def test_supplementary_group_members_may_write(ckpt: Any) -> None:
    mnt = ckpt.mountpoint
    f = mnt / "team"
    f.write_bytes(b"0123456789")
    os.chown(f, 0, OTHER)
    os.chmod(f, 0o660)
    p = str(f)
    calls = [f"os.truncate({p!r}, 4)", f"os.utime({p!r})", f"os.setxattr({p!r}, 'user.t', b'1')"]
    assert as_user(mnt, NOBODY, NOBODY, calls) == [errno.EACCES] * 3
    assert as_user(mnt, NOBODY, NOBODY, calls, groups=(OTHER,)) == [0, 0, 0]
    assert f.read_bytes() == b"0123"
    assert os.getxattr(f, "user.t") == b"1"
