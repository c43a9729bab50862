"""The SQLite catalog engine's own behaviour, without a mount: reopening, snapshot
adoption and schema migrations. What every engine must do is in catalog_conformance.py."""

import errno
import json
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptfs.catalog import Catalog, CheckpointRow, CheckpointState, ChunkRef, SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE, SCHEMA_VERSION
from ckptfs.codec import frame
from ckptfs.daemon.restore import restore_catalog
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import MemoryTier
from ckptfs.upload.uploader import SNAPSHOT_NAME

R = ROOT_INODE
F = stat.S_IFREG | 0o644
D = stat.S_IFDIR | 0o755


@pytest.fixture
def cat(tmp_path: Path) -> Iterator[Catalog]:
    c = SqliteCatalog(tmp_path / "c.sqlite")
    yield c
    c.close()


def _errno(fn, *args) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(CkptfsError) as info:
        fn(*args)
    return info.value.errno












def test_reopen_keeps_everything(tmp_path: Path) -> None:
    c = SqliteCatalog(tmp_path / "c.sqlite")
    f = c.create(R, b"keep", F, 1, 2)
    c.close()
    c2 = SqliteCatalog(tmp_path / "c.sqlite")
    got = c2.lookup(R, b"keep")
    assert (got.ino, got.uid, got.gid) == (f.ino, 1, 2)
    c2.close()


def test_adopting_a_snapshot_drops_files_whose_upload_was_pending(cat: Catalog) -> None:
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


# The whole schema as version 2 made it (ckptfs before the CHECK on checkpoints.state),
# verbatim: a catalog built from it is what an existing state dir holds.
_V2_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS inodes (
    ino      INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: the kernel may still cache an old one
    mode     INTEGER NOT NULL,
    uid      INTEGER NOT NULL,
    gid      INTEGER NOT NULL,
    size     INTEGER NOT NULL DEFAULT 0,
    nlink    INTEGER NOT NULL,
    atime_ns INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    target   BLOB,
    rdev     INTEGER NOT NULL DEFAULT 0  -- device number of a char or block special file
);
CREATE TABLE IF NOT EXISTS dentries (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    parent INTEGER NOT NULL,
    name   BLOB NOT NULL,
    ino    INTEGER NOT NULL,
    UNIQUE (parent, name)
);
CREATE INDEX IF NOT EXISTS dentries_ino ON dentries (ino);
-- Extended attributes stored for applications (user.*, trusted.*, security.*); the
-- user.ckptfs.* control names are not stored here.
CREATE TABLE IF NOT EXISTS xattrs (
    ino   INTEGER NOT NULL,
    name  BLOB NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (ino, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chunks (
    digest BLOB PRIMARY KEY,
    length INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replicas (
    digest BLOB NOT NULL,
    tier   TEXT NOT NULL,
    state  TEXT NOT NULL CHECK (state IN ('valid', 'bad')),
    PRIMARY KEY (digest, tier)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS extents (
    ino    INTEGER NOT NULL,
    idx    INTEGER NOT NULL,
    digest BLOB NOT NULL,
    length INTEGER NOT NULL,
    PRIMARY KEY (ino, idx)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS extents_digest ON extents (digest);
-- Chunks still to copy to a remote tier. Written in the commit that makes a file name the
-- chunk, so a restart replays them; deleted when the copy is recorded as a replica.
CREATE TABLE IF NOT EXISTS upload_jobs (
    digest      BLOB NOT NULL,
    tier        TEXT NOT NULL,
    length      INTEGER NOT NULL,
    enqueued_ns INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_try_ns INTEGER NOT NULL DEFAULT 0,
    state       TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'blocked')),
    last_error  TEXT,
    PRIMARY KEY (digest, tier)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS upload_jobs_order ON upload_jobs (enqueued_ns);
-- Checkpoints the detectors found (checkpoints/detectors.py): a directory or a file, by path
-- inside the mount. state: writing | committed | partial | expired | deleted.
CREATE TABLE IF NOT EXISTS checkpoints (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    root       TEXT NOT NULL UNIQUE,
    framework  TEXT NOT NULL,
    step       INTEGER,
    state      TEXT NOT NULL,
    begin_ns   INTEGER,
    commit_ns  INTEGER,
    reason     TEXT,
    tags       TEXT NOT NULL DEFAULT '',
    leftover   TEXT  -- expired: hex digests not yet verified gone from every tier (JSON)
);
-- Chunk frames to delete from a tier (the deletion queue, chunks/deleter.py). Written in
-- the transaction that drops a chunk's last reference or a local replica (eviction), so a
-- restart replays them; removed when the frame is gone, or cancelled when the chunk is
-- wanted again on that tier (a valid replica row or an upload job for the same pair).
CREATE TABLE IF NOT EXISTS deletions (
    digest      BLOB NOT NULL,
    tier        TEXT NOT NULL,
    length      INTEGER NOT NULL DEFAULT 0,
    enqueued_ns INTEGER NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_try_ns INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT,
    PRIMARY KEY (digest, tier)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS deletions_due ON deletions (next_try_ns);
"""

# The checkpoints table of schema versions 1 and 2 (no CHECK on state).
_V2_CHECKPOINTS = _V2_SCHEMA[_V2_SCHEMA.index("CREATE TABLE IF NOT EXISTS checkpoints"):]
_V2_CHECKPOINTS = _V2_CHECKPOINTS[: _V2_CHECKPOINTS.index(");") + 2]


def _unchecked_checkpoints(conn: sqlite3.Connection) -> None:
    """Put the checkpoints table back as versions 1 and 2 made it (same rows)."""
    conn.execute("ALTER TABLE checkpoints RENAME TO checkpoints_v3")
    conn.execute(_V2_CHECKPOINTS)
    conn.execute("INSERT INTO checkpoints SELECT * FROM checkpoints_v3")
    conn.execute("DROP TABLE checkpoints_v3")


def make_v2(path: Path) -> None:
    """Turn a catalog into what schema version 2 wrote: no CHECK on checkpoints.state."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        _unchecked_checkpoints(conn)
        conn.execute("UPDATE meta SET value='2' WHERE key='schema_version'")
        conn.execute("COMMIT")
    finally:
        conn.close()


def make_v1(path: Path) -> None:
    """Turn a catalog into what schema version 1 wrote: the version-1 inodes table, no
    xattrs table, no CHECK on checkpoints.state, schema_version 1."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        _unchecked_checkpoints(conn)
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


def test_version_1_catalog_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    c = SqliteCatalog(path)
    d = c.create(R, b"d", D, 0, 0)
    f = c.create(d.ino, b"f", F, 7, 8)
    c.create(R, b"ln", stat.S_IFLNK | 0o777, 0, 0, b"d/f")
    c.close()
    make_v1(path)
    conn = sqlite3.connect(path)
    assert "rdev" not in {r[1] for r in conn.execute("PRAGMA table_info(inodes)")}
    conn.close()
    c = SqliteCatalog(path)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        got = c.lookup(d.ino, b"f")
        assert (got.ino, got.uid, got.gid, got.mode, got.rdev) == (f.ino, 7, 8, F, 0)
        assert c.get_inode(c.lookup(R, b"ln").ino).target == b"d/f"
        dev = c.create(R, b"dev", stat.S_IFCHR | 0o600, 0, 0, None, 0x0103)
        assert c.get_inode(dev.ino).rdev == 0x0103
        c.set_xattr(f.ino, b"user.k", b"v")
        assert c.get_xattr(f.ino, b"user.k") == b"v"
    finally:
        c.close()
    c = SqliteCatalog(path)  # opening a migrated catalog again changes nothing
    assert c.get_meta("schema_version") == str(SCHEMA_VERSION) and c.get_inode(dev.ino).rdev == 0x0103
    c.close()


def make_v2_catalog(path: Path) -> None:
    """A catalog as schema version 2 created it, with the version-2 DDL: a directory, a
    file and checkpoint rows in every state (one deleted row left the id sequence ahead)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.executescript(_V2_SCHEMA)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '2')")
        conn.execute("INSERT INTO meta VALUES ('fs_id', 'f')")
        conn.execute("INSERT INTO inodes (ino, mode, uid, gid, size, nlink, atime_ns, mtime_ns, "
                     "ctime_ns, target, rdev) VALUES (1, ?, 0, 0, 0, 3, 1, 1, 1, NULL, 0)", (D,))
        conn.execute("INSERT INTO inodes (ino, mode, uid, gid, size, nlink, atime_ns, mtime_ns, "
                     "ctime_ns, target, rdev) VALUES (2, ?, 0, 0, 0, 2, 1, 1, 1, NULL, 0)", (D,))
        conn.execute("INSERT INTO inodes (ino, mode, uid, gid, size, nlink, atime_ns, mtime_ns, "
                     "ctime_ns, target, rdev) VALUES (3, ?, 5, 6, 0, 1, 1, 1, 1, NULL, 0)", (F,))
        conn.execute("INSERT INTO dentries (parent, name, ino) VALUES (1, ?, 2)", (b"run",))
        conn.execute("INSERT INTO dentries (parent, name, ino) VALUES (2, ?, 3)", (b"step-1.pt",))
        for i, state in enumerate(["writing", "committed", "partial", "expired", "deleted"], 1):
            conn.execute(
                "INSERT INTO checkpoints (id, root, framework, step, state, begin_ns, commit_ns, "
                "reason, tags, leftover) VALUES (?, ?, 'torch', ?, ?, 10, ?, ?, ?, ?)",
                (i, f"/run/step-{i}", i, state, 20 if state == "committed" else None,
                 "why" if state == "partial" else None, "milestone" if i == 2 else "",
                 '["ab"]' if state == "expired" else None),
            )
        conn.execute("INSERT INTO checkpoints (root, framework, state) VALUES ('/gone', 'hf', 'deleted')")
        conn.execute("DELETE FROM checkpoints WHERE root='/gone'")  # id 6 stays used
        conn.execute("COMMIT")
    finally:
        conn.close()


def _check_sql(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("SELECT sql FROM sqlite_master WHERE name='checkpoints'").fetchone()[0])
    finally:
        conn.close()


def test_version_2_catalog_gets_the_checkpoint_state_check(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    make_v2_catalog(path)
    assert "CHECK" not in _check_sql(path)
    c = SqliteCatalog(path)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION) == "11"
        rows = c.checkpoint_rows("/")
        assert [(r.id, r.root, r.state) for r in rows] == [
            (1, "/run/step-1", CheckpointState.WRITING), (2, "/run/step-2", CheckpointState.COMMITTED),
            (3, "/run/step-3", CheckpointState.PARTIAL), (4, "/run/step-4", CheckpointState.EXPIRED),
            (5, "/run/step-5", CheckpointState.DELETED),
        ]
        assert rows[1] == CheckpointRow(2, "/run/step-2", "torch", 2, CheckpointState.COMMITTED,
                                        10, 20, None, "milestone")
        assert rows[2].reason == "why"
        assert c.expired_leftovers() == {"/run/step-4": [b"\xab"]}
        # The mapping view is what it was before rows were typed (JSON output included).
        assert [r.as_dict() for r in c.checkpoint_rows("/run/step-2")] == [{
            "id": 2, "root": "/run/step-2", "framework": "torch", "step": 2, "state": "committed",
            "begin_ns": 10, "commit_ns": 20, "reason": None, "tags": "milestone"}]
        assert json.dumps(c.checkpoint_rows("/run/step-2")[0].as_dict()["state"]) == '"committed"'
        # Ids are never reused: the deleted row's id 6 stays taken.
        c.checkpoint_begin("/run/step-7", "torch", 7, 30)
        assert c.checkpoint_rows("/run/step-7")[0].id == 7
        # The namespace came through untouched, and inode numbers continue.
        assert c.lookup(c.lookup(R, b"run").ino, b"step-1.pt").uid == 5
        assert c.create(R, b"new", F, 0, 0).ino == 4
        assert _errno(c.checkpoint_set_state, "/run/step-1", "bogus") == errno.EINVAL
    finally:
        c.close()
    assert "CHECK (state IN ('writing', 'committed', 'partial', 'expired', 'deleted'))" in _check_sql(path)
    conn = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE checkpoints SET state='bogus' WHERE id=1")
    finally:
        conn.close()
    c = SqliteCatalog(path)  # opening it again changes nothing
    try:
        assert [r.id for r in c.checkpoint_rows("/")] == [1, 2, 3, 4, 5, 7]
    finally:
        c.close()


def test_version_2_catalog_with_an_unknown_state_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    make_v2_catalog(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE checkpoints SET state='bogus' WHERE id=1")
    conn.commit()
    conn.close()
    with pytest.raises(CkptfsError, match="unknown state 'bogus'"):
        SqliteCatalog(path)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("2",)
        assert conn.execute("SELECT count(*) FROM checkpoints").fetchone() == (5,)
    finally:
        conn.close()


def test_newer_catalog_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    SqliteCatalog(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(CkptfsError, match="schema version 99"):
        SqliteCatalog(path)


def test_old_snapshot_restores_with_its_xattrs_table_added(tmp_path: Path) -> None:
    """A catalog snapshot a version-1 daemon uploaded restores on a new node."""
    src = tmp_path / "old.sqlite"
    c = SqliteCatalog(src)
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
    restore_catalog(dest, [remote])
    c = SqliteCatalog(dest)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert c.lookup(R, b"f").ino == f.ino
        assert c.list_xattrs(f.ino) == []
    finally:
        c.close()


def test_adopting_a_snapshot_keeps_which_chunks_each_known_remote_holds(cat: Catalog) -> None:
    """Two remotes striped by digest: each keeps its own rows after a restore (the
    scrubber would find the others' chunks missing on it); a remote the snapshot does not
    name may hold any chunk."""
    cat.set_meta("tiers", json.dumps([{"name": "a", "kind": "s3"}, {"name": "b", "kind": "s3"}]))
    d = cat.create(R, b"ckpt", D, 0, 0)
    f = cat.create(d.ino, b"f.pt", F, 0, 0)
    one, two = b"\x01" * 32, b"\x02" * 32
    cat.commit_file(f.ino, 20, 1, 1, 16,
                    {0: ChunkRef(one, 10, ("a",)), 1: ChunkRef(two, 10, ("b",))})
    kept, removed = cat.adopt_snapshot(["a", "b", "new"])
    assert (kept, removed) == (1, [])
    ext = cat.extents(f.ino)
    assert set(ext[0].tiers) == {"a", "new"} and set(ext[1].tiers) == {"b", "new"}
