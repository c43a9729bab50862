"""The catalog's schema, once for every engine: the tables (SQLite's DDL; postgres.py
translates it), the schema version, the tables a snapshot copies, and the rows of a new
catalog. Each role's module (sessions.py, wants.py, quotas.py, audit.py, keys.py,
moves.py, claims.py) holds the DDL of its own tables; the schema is all of them. An
engine creates and migrates it (sqlite.py, postgres.py)."""

from __future__ import annotations

import stat
import time
import uuid

from ..errors import InvalidArgument
from .audit import AUDIT_DDL
from .checks import CHECKS_INDEX
from .claims import CLAIMS_DDL
from .conn import Conn
from .drills import DRILLS_DDL
from .keys import KEYS_DDL
from .moves import MOVES_DDL
from .quotas import QUOTAS_DDL
from .rows import ROOT_INODE, CheckpointState
from .sessions import SESSIONS_DDL
from .tree import INODE_COLS
from .wants import WANTS_DDL

__all__ = [
    "CHECKPOINT_STATES", "MARK_CHANGED", "SCHEMA", "SCHEMA_VERSION", "SEQUENCES", "TABLES",
    "checkpoints_ddl", "init_rows", "newer_schema",
]

# 2: inodes.rdev and the xattrs table; 3: CHECK on checkpoints.state (sqlite.py migrates);
# 4: the node sessions' tables sessions and open_handles (sessions.py); 5: chunk_wants
# (wants.py); 6: ns_usage and ns_files (quotas.py), audit_log (audit.py), namespace_keys
# (keys.py); 7: chunk_moves (moves.py); 8: deletion_claims (claims.py); 9: checkpoints.root
# holds the bytes of the path (ckptfs/names.py); 10: replicas.checked_ns, the scrubber's
# last check of each copy (checks.py); 11: drills (drills.py). Every engine stores this
# layout (the remote snapshot is a SQLite file of it).
SCHEMA_VERSION = 11

CHECKPOINT_STATES = ", ".join(f"'{s.value}'" for s in CheckpointState)


def checkpoints_ddl(table: str) -> str:
    """The checkpoints table (the schema-3 migration builds a copy under another name)."""
    return f"""-- Checkpoints the detectors found (checkpoints/detectors.py): a directory or a file,
-- by path inside the mount; state is a CheckpointState.
CREATE TABLE {table} (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    root       BLOB NOT NULL UNIQUE,  -- the bytes of the path (ckptfs/names.py)
    framework  TEXT NOT NULL,
    step       INTEGER,
    state      TEXT NOT NULL CHECK (state IN ({CHECKPOINT_STATES})),
    begin_ns   INTEGER,
    commit_ns  INTEGER,
    reason     TEXT,
    tags       TEXT NOT NULL DEFAULT '',
    leftover   TEXT  -- expired: hex digests not yet verified gone from every tier (JSON)
);"""


# The schema, in SQLite's DDL (postgres.py translates it: one layout for both engines).
SCHEMA = """
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
    checked_ns INTEGER NOT NULL DEFAULT 0,  -- last read and verified (checks.py; 0: never)
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
""" + checkpoints_ddl("IF NOT EXISTS checkpoints") + """
-- Chunk frames to delete from a tier (the deletion queue, chunks/deleter.py). Written in
-- the transaction that drops a chunk's last reference or a local replica (eviction), so a
-- restart replays them; removed when the frame is gone, or cancelled when the chunk is
-- wanted again on that tier (a valid replica row, an upload job or a move of an
-- uncommitted chunk, moves.py, for the same pair).
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
""" + SESSIONS_DDL + WANTS_DDL + QUOTAS_DDL + AUDIT_DDL + KEYS_DDL + MOVES_DDL + CLAIMS_DDL
SCHEMA += DRILLS_DDL

# Every table with its columns in schema order (the snapshot copies them; not the sessions
# tables, nor chunk_wants, chunk_moves and deletion_claims: a restore from the snapshot is
# one node, without sessions, and the uncommitted chunks a live node moved and the owners
# of its claims are no content of the restore).
TABLES: dict[str, tuple[str, ...]] = {
    "meta": ("key", "value"),
    "inodes": ("ino", "mode", "uid", "gid", "size", "nlink", "atime_ns", "mtime_ns", "ctime_ns",
               "target", "rdev"),
    "dentries": ("id", "parent", "name", "ino"),
    "xattrs": ("ino", "name", "value"),
    "chunks": ("digest", "length"),
    "replicas": ("digest", "tier", "state"),
    "extents": ("ino", "idx", "digest", "length"),
    "upload_jobs": ("digest", "tier", "length", "enqueued_ns", "attempts", "next_try_ns", "state",
                    "last_error"),
    "checkpoints": ("id", "root", "framework", "step", "state", "begin_ns", "commit_ns", "reason",
                    "tags", "leftover"),
    "deletions": ("digest", "tier", "length", "enqueued_ns", "attempts", "next_try_ns",
                  "last_error"),
    "ns_usage": ("ns", "bytes", "files", "quota"),
    "ns_files": ("ino", "ns", "bytes"),
    # A node restored from the snapshot keeps the chain (and its seals still match).
    "audit_log": ("seq", "time_ns", "node", "uid", "pid", "action", "path", "detail", "prev",
                  "digest"),
    # The wrapped keys: a node restored from the snapshot opens its namespaces' chunks
    # (with the KEK); a shredded version is a tombstone there too.
    "namespace_keys": ("key_id", "namespace", "version", "wrapped", "kek_id", "created_ns",
                       "shredded_ns"),
}
# The tables whose key comes from a sequence (never reused; the snapshot carries it over).
SEQUENCES = {"inodes": "ino", "dentries": "id", "checkpoints": "id"}

# A change of the namespace or of file contents, at a time (str(time.time_ns())).
MARK_CHANGED = ("INSERT INTO meta VALUES ('changed_ns', ?) "
                "ON CONFLICT (key) DO UPDATE SET value=excluded.value")


def init_rows(c: Conn) -> None:
    """The rows of a new catalog: its version, filesystem id and root directory."""
    c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    c.execute("INSERT INTO meta VALUES ('fs_id', ?)", (uuid.uuid4().hex,))
    c.execute(CHECKS_INDEX)  # not in SCHEMA: an older replicas table lacks its column
    now = time.time_ns()
    c.execute(
        f"INSERT INTO inodes ({INODE_COLS}) VALUES (?,?,?,?,?,?,?,?,?,NULL,0)",
        (ROOT_INODE, stat.S_IFDIR | 0o755, 0, 0, 0, 2, now, now, now),
    )


def newer_schema(where: str, version: int) -> InvalidArgument:
    return InvalidArgument(
        f"catalog {where}: schema version {version}, this ckptfs knows {SCHEMA_VERSION} "
        "(a newer ckptfs made it: upgrade ckptfs)"
    )
