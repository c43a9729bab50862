"""Catalog namespace and extent logic, without a mount."""

import errno
import sqlite3
import stat
from pathlib import Path

import pytest

from ckptfs.catalog import Catalog, ChunkRef
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.chunks import frame
from ckptfs.errors import CkptfsError
from ckptfs.mount import restore_catalog
from ckptfs.testing.tiers import MemoryTier
from ckptfs.upload.uploader import SNAPSHOT_NAME

R = ROOT_INODE
F = stat.S_IFREG | 0o644
D = stat.S_IFDIR | 0o755


@pytest.fixture
def cat(tmp_path: Path) -> Catalog:
    c = Catalog(tmp_path / "c.sqlite")
    yield c
    c.close()


def _errno(fn, *args) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(CkptfsError) as info:
        fn(*args)
    return info.value.errno


def test_create_lookup_and_exact_errors(cat: Catalog) -> None:
    f = cat.create(R, b"a", F, 0, 0)
    assert cat.lookup(R, b"a").ino == f.ino
    assert _errno(cat.lookup, R, b"missing") == errno.ENOENT
    assert _errno(cat.create, R, b"a", F, 0, 0) == errno.EEXIST
    assert _errno(cat.lookup, f.ino, b"x") == errno.ENOTDIR
    assert _errno(cat.unlink, R, b"missing") == errno.ENOENT


def test_directory_link_counts(cat: Catalog) -> None:
    d = cat.create(R, b"d", D, 0, 0)
    cat.create(d.ino, b"e", D, 0, 0)
    assert cat.get_inode(R).nlink == 3
    assert cat.get_inode(d.ino).nlink == 3
    assert _errno(cat.rmdir, R, b"d") == errno.ENOTEMPTY
    cat.rename(d.ino, b"e", R, b"e", False)
    assert cat.get_inode(d.ino).nlink == 2
    assert cat.get_inode(R).nlink == 4
    cat.rmdir(R, b"e")
    assert cat.get_inode(R).nlink == 3


def test_rename_rules(cat: Catalog) -> None:
    a = cat.create(R, b"a", F, 0, 0)
    b = cat.create(R, b"b", F, 0, 0)
    replaced = cat.rename(R, b"a", R, b"b", False)
    assert replaced is not None and replaced.ino == b.ino and replaced.nlink == 0
    assert cat.lookup(R, b"b").ino == a.ino
    assert _errno(cat.lookup, R, b"a") == errno.ENOENT
    c = cat.create(R, b"c", F, 0, 0)
    assert _errno(cat.rename, R, b"c", R, b"b", True) == errno.EEXIST  # RENAME_NOREPLACE
    d = cat.create(R, b"d", D, 0, 0)
    sub = cat.create(d.ino, b"sub", D, 0, 0)
    assert _errno(cat.rename, R, b"d", sub.ino, b"x", False) == errno.EINVAL
    assert _errno(cat.rename, R, b"c", R, b"d", False) == errno.EISDIR
    assert _errno(cat.rename, R, b"d", R, b"c", False) == errno.ENOTDIR
    cat.create(sub.ino, b"f", F, 0, 0)
    e = cat.create(R, b"e", D, 0, 0)
    cat.rename(R, b"d", R, b"e", False)  # onto an empty directory: allowed
    assert cat.lookup(R, b"e").ino == d.ino
    assert cat.get_inode(e.ino).nlink == 0
    assert cat.lookup(cat.lookup(cat.lookup(R, b"e").ino, b"sub").ino, b"f").ino
    assert c.ino != d.ino


def test_commit_file_and_unreferenced_chunks(cat: Catalog) -> None:
    f = cat.create(R, b"f", F, 0, 0)
    r0 = ChunkRef(b"\x01" * 32, 10, ("t0",))
    r1 = ChunkRef(b"\x02" * 32, 10, ("t1",))
    cat.commit_file(f.ino, 20, 1, 1, 10, {0: r0, 1: r1})
    assert cat.extents(f.ino) == {0: r0, 1: r1}
    assert cat.get_inode(f.ino).size == 20
    dropped = cat.commit_file(f.ino, 5, 2, 2, 10, {})  # truncate: chunk 1 falls off
    assert dropped == [r1.digest]
    assert set(cat.extents(f.ino)) == {0}
    assert cat.drop_unreferenced([r0.digest, r1.digest]) == {r1.digest: ["t1"]}
    inode = cat.unlink(R, b"f")
    assert inode.nlink == 0
    assert cat.delete_inode(f.ino) == [r0.digest]
    assert cat.drop_unreferenced([r0.digest]) == {r0.digest: ["t0"]}
    assert _errno(cat.get_inode, f.ino) == errno.ENOENT


def test_readdir_is_stable_across_renames(cat: Catalog) -> None:
    for i in range(10):
        cat.create(R, f"f{i}".encode(), F, 0, 0)
    first = cat.readdir(R, 0, limit=4)
    rest = cat.readdir(R, first[-1][0], limit=100)
    names = [n for _, n, _ in first + rest]
    assert names == [f"f{i}".encode() for i in range(10)]
    cat.rename(R, b"f0", R, b"g0", False)
    assert [n for _, n, _ in cat.readdir(R, 0)][0] == b"g0"


def test_reopen_keeps_everything(tmp_path: Path) -> None:
    c = Catalog(tmp_path / "c.sqlite")
    f = c.create(R, b"keep", F, 1, 2)
    c.close()
    c2 = Catalog(tmp_path / "c.sqlite")
    got = c2.lookup(R, b"keep")
    assert (got.ino, got.uid, got.gid) == (f.ino, 1, 2)
    c2.close()


def test_adopting_a_snapshot_drops_files_whose_upload_was_pending(cat: Catalog) -> None:
    import json

    cat.set_meta("tiers", json.dumps([{"name": "l", "kind": "local"}, {"name": "s3", "kind": "s3"}]))
    d = cat.create(R, b"ckpt", D, 0, 0)
    done = cat.create(d.ino, b"done.pt", F, 0, 0)
    pending = cat.create(d.ino, b"pending.pt", F, 0, 0)
    up, local_only = b"\x01" * 32, b"\x02" * 32
    cat.commit_file(done.ino, 10, 1, 1, 16, {0: ChunkRef(up, 10, ("l",))}, uploads={up: ["s3"]})
    cat.commit_file(pending.ino, 10, 1, 1, 16, {0: ChunkRef(local_only, 10, ("l",))},
                    uploads={local_only: ["s3"]})
    assert cat.finish_upload(up, "s3")
    kept, removed = cat.adopt_snapshot(["remote0"])
    assert (kept, removed) == (1, ["/ckpt/pending.pt"])
    assert cat.lookup(d.ino, b"done.pt").size == 10
    assert _errno(cat.lookup, d.ino, b"pending.pt") == errno.ENOENT
    assert cat.extents(done.ino)[0].tiers == ("remote0",)
    assert cat.backlog().chunks == 0


# --------------------------------------------------------------------------- schema migration

# The inodes table as schema version 1 made it (before rdev); version 1 had no xattrs table.
_V1_INODES = """
CREATE TABLE inodes (
    ino      INTEGER PRIMARY KEY AUTOINCREMENT,
    mode     INTEGER NOT NULL,
    uid      INTEGER NOT NULL,
    gid      INTEGER NOT NULL,
    size     INTEGER NOT NULL DEFAULT 0,
    nlink    INTEGER NOT NULL,
    atime_ns INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    target   BLOB
);
"""


def make_v1(path: Path) -> None:
    """Turn a catalog into what schema version 1 wrote: the version-1 inodes table, no
    xattrs table, schema_version 1."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("ALTER TABLE inodes RENAME TO inodes_v2")
        conn.execute(_V1_INODES)
        conn.execute("INSERT INTO inodes SELECT ino, mode, uid, gid, size, nlink, atime_ns, "
                     "mtime_ns, ctime_ns, target FROM inodes_v2")
        conn.execute("DROP TABLE inodes_v2")
        conn.execute("DROP TABLE xattrs")
        conn.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_version_1_catalog_is_migrated_to_2(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    c = Catalog(path)
    d = c.create(R, b"d", D, 0, 0)
    f = c.create(d.ino, b"f", F, 7, 8)
    c.create(R, b"ln", stat.S_IFLNK | 0o777, 0, 0, b"d/f")
    c.close()
    make_v1(path)
    conn = sqlite3.connect(path)
    assert "rdev" not in {r[1] for r in conn.execute("PRAGMA table_info(inodes)")}
    conn.close()
    c = Catalog(path)
    try:
        assert c.get_meta("schema_version") == "2"
        got = c.lookup(d.ino, b"f")
        assert (got.ino, got.uid, got.gid, got.mode, got.rdev) == (f.ino, 7, 8, F, 0)
        assert c.get_inode(c.lookup(R, b"ln").ino).target == b"d/f"
        dev = c.create(R, b"dev", stat.S_IFCHR | 0o600, 0, 0, None, 0x0103)
        assert c.get_inode(dev.ino).rdev == 0x0103
        c.set_xattr(f.ino, b"user.k", b"v")
        assert c.get_xattr(f.ino, b"user.k") == b"v"
    finally:
        c.close()
    c = Catalog(path)  # opening a version-2 catalog again changes nothing
    assert c.get_meta("schema_version") == "2" and c.get_inode(dev.ino).rdev == 0x0103
    c.close()


def test_newer_catalog_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    Catalog(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(CkptfsError, match="schema version 99"):
        Catalog(path)


def test_old_snapshot_restores_with_its_xattrs_table_added(tmp_path: Path) -> None:
    """A catalog snapshot a version-1 daemon uploaded restores on a new node."""
    src = tmp_path / "old.sqlite"
    c = Catalog(src)
    c.set_meta("tiers", '[{"name": "remote0", "kind": "s3"}]')
    f = c.create(R, b"f", F, 0, 0)
    c.close()
    make_v1(src)
    data = src.read_bytes()
    remote = MemoryTier("remote0", kind="s3")
    digest = frame.digest_of(data)
    remote.put_meta(SNAPSHOT_NAME, b"".join(bytes(p) for p in frame.encode([data], digest)))
    dest = tmp_path / "new" / "catalog.sqlite"
    dest.parent.mkdir()
    restore_catalog(dest, [remote])  # type: ignore[list-item]
    c = Catalog(dest)
    try:
        assert c.get_meta("schema_version") == "2"
        assert c.lookup(R, b"f").ino == f.ino
        assert c.list_xattrs(f.ino) == []
    finally:
        c.close()


def test_xattrs_in_the_catalog(cat: Catalog) -> None:
    f = cat.create(R, b"f", F, 0, 0)
    t0 = cat.get_inode(f.ino).ctime_ns
    assert cat.set_xattr(f.ino, b"user.b", b"2").ctime_ns >= t0
    cat.set_xattr(f.ino, b"user.a", b"1")
    assert cat.list_xattrs(f.ino) == [b"user.a", b"user.b"]
    assert _errno(lambda: cat.set_xattr(f.ino, b"user.a", b"x", create=True)) == errno.EEXIST
    assert _errno(lambda: cat.set_xattr(f.ino, b"user.c", b"x", replace_only=True)) == errno.ENODATA
    assert cat.xattr_inodes() == {f.ino}
    cat.remove_xattr(f.ino, b"user.a")
    assert _errno(cat.remove_xattr, f.ino, b"user.a") == errno.ENODATA
    cat.unlink(R, b"f")
    cat.delete_inode(f.ino)
    assert cat.xattr_inodes() == set()
