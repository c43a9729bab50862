"""The catalog's logic, once for every SQL engine: ``SqlCatalog``.

What each public method does is said once, on its Protocol (protocols.py, where a caller's
type leads); comments here say how. Every public method is one transaction. A method that changes something hands its body
(a function of a connection) to ``_write``; the engine runs it in a write transaction
(SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: SERIALIZABLE, and the body runs again after a
serialization failure, so a body does nothing but SQL and returns its result). A read takes
one connection for all its statements (``with self._reading() as c``), so a read of several
statements sees one state; a read of one statement asks ``_query``. Helpers that read inside a transaction take its connection
(``_get_inode(c, ...)``, ``_path_of(c, ...)``): never the engine's, which may be another
transaction.

The SQL here is what both SQLite (3.35 and later) and PostgreSQL accept: ``INSERT ... ON
CONFLICT``, ``RETURNING``, ``count(*) FILTER (WHERE ...)``, ``?`` placeholders. What an
engine translates or provides (sqlite.py, postgres.py):

* placeholders (PostgreSQL's ``%s``) and ``group_concat`` (PostgreSQL's ``string_agg``):
  ``Dialect.translate``, once per statement text;
* the DDL (``SCHEMA`` is SQLite's; PostgreSQL's is translated from it: BIGINT, BYTEA,
  identity columns), its creation and migration;
* transactions, connections, retries and the mapping of its errors;
* ``backup_bytes``: the snapshot stored on the remotes, always a SQLite catalog file.

Inode numbers, ``dentries.id`` (readdir cookies, in insertion order) and checkpoint ids come
from the engine's sequence and are never reused: the kernel may still cache an old inode
number, the metrics remember checkpoint ids.
"""

from __future__ import annotations

import errno
import json
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..errors import (
    AlreadyExists,
    CkptfsError,
    InvalidArgument,
    IsADirectory,
    NoAttribute,
    NotADirectory,
    NotEmpty,
    NotFound,
    NotPermitted,
)
from ..names import path_bytes, path_str, readable
from .audit import AUDIT_DDL, AuditRecord, AuditSql
from .claims import CLAIMS_DDL, ClaimsSql, forget_owner, move_owner, record_owner
from .deletion_events import DeletionEventsSql
from .deletions import queue_deletion
from .hooks import CatalogHooks
from .keys import KEYS_DDL, KeysSql
from .moves import MOVED_PAIR, MOVES_DDL, MovesSql
from .quotas import QUOTAS_DDL, Charge, QuotasSql, charge_commit, uncharge_inode
from .rows import (
    ROOT_INODE,
    Around,
    Backlog,
    CheckpointRow,
    CheckpointState,
    ChunkRef,
    Deletion,
    DeletionBacklog,
    ExtentReplicas,
    Inode,
    UploadJob,
)
from .sessions import SESSIONS_DDL, SessionsSql
from .wants import WANTS_DDL, WantsSql, held_on

__all__ = [
    "CHECKPOINT_STATES", "INODE_COLS", "MARK_CHANGED", "ROOT_INODE", "SCHEMA", "SCHEMA_VERSION",
    "SEQUENCES", "TABLES", "Conn", "Cursor", "SqlCatalog", "checkpoints_ddl", "init_rows",
    "newer_schema",
]

T = TypeVar("T")

# 2: inodes.rdev and the xattrs table; 3: CHECK on checkpoints.state (sqlite.py migrates);
# 4: the node sessions' tables sessions and open_handles (sessions.py); 5: chunk_wants
# (wants.py); 6: ns_usage and ns_files (quotas.py), audit_log (audit.py), namespace_keys
# (keys.py); 7: chunk_moves (moves.py); 8: deletion_claims (claims.py); 9: checkpoints.root
# holds the bytes of the path (ckptfs/names.py). Every engine stores this layout (the remote
# snapshot is a SQLite file of it).
SCHEMA_VERSION = 9

CHECKPOINT_STATES = ", ".join(f"'{s.value}'" for s in CheckpointState)


class Cursor(Protocol):
    """What the logic uses of a DB-API cursor (sqlite3's and psycopg's both are)."""

    @property
    def rowcount(self) -> int:
        ...

    def fetchone(self) -> Any:
        ...

    def fetchall(self) -> list[Any]:
        ...

    def __iter__(self) -> Iterator[Any]:
        ...


class Conn(Protocol):
    """One connection inside one transaction; statements in the portable SQL of this
    module (``?`` placeholders), which the engine translates."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Cursor:
        ...


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

# Host parameters per statement: SQLite before 3.32 allows 999.
_SQL_VARS = 900

INODE_COLS = "ino, mode, uid, gid, size, nlink, atime_ns, mtime_ns, ctime_ns, target, rdev"
_INODE_COLS_I = ", ".join("i." + x.strip() for x in INODE_COLS.split(","))
# A path from an inode up to the root: one row (parent, name, depth) per level, the
# inode's own name first. A directory has one name; a file with several links takes one.
_MAX_DEPTH = 4096
_PATH_UP = (
    "WITH RECURSIVE up(parent, name, depth) AS ("
    "SELECT * FROM (SELECT parent, name, 1 FROM dentries WHERE ino=? LIMIT 1) AS leaf "
    "UNION ALL SELECT d.parent, d.name, up.depth + 1 FROM up JOIN dentries d ON d.ino = up.parent "
    "WHERE up.parent != ? AND up.depth < ?) "
    "SELECT parent, name FROM up ORDER BY depth"
)

def _path_from(rows: Sequence[Any]) -> str:
    """The path _PATH_UP's rows spell (``<unlinked>/...`` if they do not reach the root)."""
    parts = [bytes(r[1]).decode(errors="surrogateescape") for r in reversed(rows)]
    if (not rows or int(rows[-1][0]) != ROOT_INODE) and len(rows) < _MAX_DEPTH:
        return "<unlinked>/" + "/".join(parts)
    return "/" + "/".join(parts)


# Extent indexes per statement (well below every engine's limit of bound parameters).
_IN_BATCH = 500

_INODE_COLS_P = ", ".join("p." + x.strip() for x in INODE_COLS.split(","))
_N_INODE_COLS = len(INODE_COLS.split(","))

_SET_META = "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value=excluded.value"
# A change of the namespace or of file contents, at a time (str(time.time_ns())).
MARK_CHANGED = ("INSERT INTO meta VALUES ('changed_ns', ?) "
                "ON CONFLICT (key) DO UPDATE SET value=excluded.value")
_VALID_REPLICA = (
    "INSERT INTO replicas VALUES (?, ?, 'valid') ON CONFLICT (digest, tier) DO UPDATE SET state='valid'"
)
_KNOWN_CHUNK = "INSERT INTO chunks VALUES (?, ?) ON CONFLICT (digest) DO NOTHING"


def _inode(row: tuple[object, ...]) -> Inode:
    return Inode(*row)  # type: ignore[arg-type]


# A deletion row of a remote tier being deleted has a negative next_try_ns: claimed by a
# deleter until -next_try_ns (a lease; a node that died mid-delete leaves it due again
# then). Chunk objects are keyed by digest and any node may upload one, so while a row is
# claimed no upload of its pair starts or is recorded: the DELETE may land after the PUT.
# The end of a claim is an event (deletion_events.py: the claimant's own uploader is kicked
# in-process, other nodes' hear a NOTIFY); a lease that runs out is a deadline. A DELETE
# that failed in doubt (sent, perhaps, and no answer read: TierError.in_doubt) may still
# land: its row stays claimed for the tier's request grace (postpone_deletion with
# keep_claim), a new lease the deleter itself ends (deleter.py). A deleter's claim lasts
# at least twice its tier's request grace: the call, and a grace after it.
CLAIM_LEASE_NS = 600 * 10**9
_CLAIMED = (" AND NOT EXISTS (SELECT 1 FROM deletions d WHERE d.digest = u.digest "
            "AND d.tier = u.tier AND d.next_try_ns < 0)")


def _restamp_jobs(c: Conn, digest: bytes, tier: str, now: int) -> bool:
    # A claim ended: a job queued while it ran waited for it. Restamped, so an upload that
    # started before the claim (of a job dropped since) cannot finish it. True: a job
    # waited (its uploader is to be told).
    return c.execute("UPDATE upload_jobs SET enqueued_ns=? WHERE digest=? AND tier=?",
                     (now, digest, tier)).rowcount > 0


def _wanted_on(c: Conn, tier: str, digests: Sequence[bytes]) -> int:
    """These chunks are to be uploaded to ``tier``: cancel their deletion rows there that
    no deleter claimed yet (nothing was deleted). A claimed row stays: the job waits for
    it. Reading the rows makes this transaction conflict with a concurrent claim. Returns
    how many rows were cancelled."""
    n = 0
    for at in range(0, len(digests), _IN_BATCH):
        part = digests[at:at + _IN_BATCH]
        n += c.execute(f"DELETE FROM deletions WHERE tier=? AND next_try_ns>=0 "
                       f"AND digest IN ({','.join('?' * len(part))})", (tier, *part)).rowcount
    return n


def init_rows(c: Conn) -> None:
    """The rows of a new catalog: its version, filesystem id and root directory."""
    c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    c.execute("INSERT INTO meta VALUES ('fs_id', ?)", (uuid.uuid4().hex,))
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


class _Paths:
    """Directory paths read in one transaction, each at most once (an audit record and
    the caller's ``Around`` need the same ones)."""

    __slots__ = ("c", "got")

    def __init__(self, c: Conn) -> None:
        self.c = c
        self.got: dict[int, str] = {}

    def of(self, ino: int) -> str:
        path = self.got.get(ino)
        if path is None:
            path = self.got[ino] = SqlCatalog._path_of(self.c, ino)
        return path

    def entry(self, parent: int, name: bytes) -> Callable[[], str]:
        """The path of entry ``name`` of ``parent``, when asked (for an audit record)."""
        return lambda: self.of(parent).rstrip("/") + "/" + name.decode(errors="surrogateescape")


def _tell(around: Around | None, paths: _Paths, dirs: dict[int, Inode],
          named: tuple[int, ...], moved: Inode | None = None) -> None:
    """Fill ``around`` (if any) with a change's directories after it and the paths of
    the directories it ``named``."""
    if around is None:
        return
    around.dirs = dirs
    around.moved = moved
    around.dir_paths = {d: paths.of(d) for d in named} if around.paths else {}


def _touched(pdir: Inode, now: int, nlink_delta: int = 0) -> Inode:
    """``pdir`` as ``_touch_dir`` leaves it (in the transaction that read it)."""
    return replace(pdir, mtime_ns=now, ctime_ns=now, nlink=pdir.nlink + nlink_delta)


class SqlCatalog(SessionsSql, WantsSql, MovesSql, ClaimsSql, DeletionEventsSql, QuotasSql, AuditSql,
                 KeysSql):
    """The catalog on an engine (sqlite.py, postgres.py), which provides ``_write``,
    ``_reading``, ``backup_bytes`` and ``close``."""

    path: Path
    # How many transactions may run at once (the daemon sizes its catalog limiter by it).
    concurrency: int = 1
    shared: bool = False  # several nodes may use it (PostgreSQL)
    # Errors of a read-only catalog of an older schema that lacks a table.
    _missing_table: tuple[type[Exception], ...] = ()

    def __init__(self, hooks: CatalogHooks | None = None) -> None:
        AuditSql.__init__(self)
        # Called (in the calling thread, after the COMMIT) by every transaction that
        # changed the namespace or file contents: the uploader's wake for its snapshot.
        # Must be thread-safe and must not block (TrioToken.run_sync_soon).
        self.on_touch: Callable[[], None] | None = None
        if hooks is not None:  # what the daemon is called back with (hooks.py)
            self.on_touch, self.on_audit_note = hooks.on_touch, hooks.on_audit_note
            self.audit_node = hooks.node

    # -- what the engine provides ------------------------------------------------------------

    def _transaction(self, body: Callable[[Conn], T], synced: bool, touch: bool) -> T:
        """Run ``body`` in one write transaction and commit it (again after a conflict).
        ``touch``: also mark meta ``changed_ns`` (MARK_CHANGED; SQLite in the transaction,
        PostgreSQL right after its commit)."""
        raise NotImplementedError

    def _reading(self) -> AbstractContextManager[Conn]:
        """A connection for one read (its statements see one state)."""
        raise NotImplementedError

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one statement: a read that needs no transaction of its own (the
        hot ones: getattr, lookup, readdir, a file's extents)."""
        raise NotImplementedError

    def backup_bytes(self) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- transactions ------------------------------------------------------------------------

    def _write(self, body: Callable[[Conn], T], synced: bool = False, touch: bool = False) -> T:
        """One write transaction. ``touch`` marks a change of the namespace or of file
        contents (meta ``changed_ns``): the remote catalog snapshot is stale until it is
        retaken."""
        result = self._transaction(body, synced, touch)
        if touch and self.on_touch is not None:
            self.on_touch()
        return result

    # -- meta --------------------------------------------------------------------------------

    @staticmethod
    def _get_meta(c: Conn, key: str) -> str | None:
        row = c.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def get_meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key=?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self._write(lambda c: c.execute(_SET_META, (key, value)))

    def recorded_tiers(self) -> list[dict[str, str]]:
        raw = self.get_meta("tiers")
        return [] if raw is None else list(json.loads(raw))

    def sync(self) -> None:
        self._write(lambda c: c.execute(_SET_META, ("last_sync_ns", str(time.time_ns()))), synced=True)

    # -- namespace ---------------------------------------------------------------------------

    @staticmethod
    def _get_inode(c: Conn, ino: int) -> Inode:
        row = c.execute(f"SELECT {INODE_COLS} FROM inodes WHERE ino=?", (ino,)).fetchone()
        if row is None:
            raise NotFound(f"inode {ino}")
        return _inode(row)

    def get_inode(self, ino: int) -> Inode:
        rows = self._query(f"SELECT {INODE_COLS} FROM inodes WHERE ino=?", (ino,))
        if not rows:
            raise NotFound(f"inode {ino}")
        return _inode(rows[0])

    def _dir(self, c: Conn, ino: int) -> Inode:
        inode = self._get_inode(c, ino)
        if not inode.is_dir:
            raise NotADirectory(f"inode {ino}")
        return inode

    @staticmethod
    def _entry(c: Conn, parent: int, name: bytes) -> Inode | None:
        row = c.execute(
            f"SELECT {_INODE_COLS_I} FROM dentries d JOIN inodes i ON i.ino = d.ino "
            "WHERE d.parent=? AND d.name=?",
            (parent, name),
        ).fetchone()
        return None if row is None else _inode(row)

    def _named(self, c: Conn, parent: int, name: bytes) -> tuple[Inode, Inode]:
        """Directory ``parent`` and the inode its entry ``name`` names; NotFound if none."""
        pdir, inode = self._dir_entry(c, parent, name)
        if inode is None:
            raise NotFound(name.decode(errors="replace"))
        return pdir, inode

    @staticmethod
    def _dir_entry(c: Conn, parent: int, name: bytes) -> tuple[Inode, Inode | None]:
        """Directory ``parent`` and the inode of its entry ``name`` (None: no such entry),
        in one statement; NotFound / NotADirectory for a parent that is none."""
        row = c.execute(
            f"SELECT {_INODE_COLS_P}, {_INODE_COLS_I} FROM inodes p LEFT JOIN dentries d "
            "ON d.parent = p.ino AND d.name = ? LEFT JOIN inodes i ON i.ino = d.ino WHERE p.ino = ?",
            (name, parent),
        ).fetchone()
        if row is None:
            raise NotFound(f"inode {parent}")
        pdir = _inode(row[:_N_INODE_COLS])
        if not pdir.is_dir:
            raise NotADirectory(f"inode {parent}")
        entry = row[_N_INODE_COLS:]
        return pdir, None if entry[0] is None else _inode(entry)

    def lookup(self, parent: int, name: bytes) -> Inode:
        # One statement: the parent's mode, and the entry's inode if there is one.
        rows = self._query(
            f"SELECT p.mode, {_INODE_COLS_I} FROM inodes p LEFT JOIN dentries d "
            "ON d.parent = p.ino AND d.name = ? LEFT JOIN inodes i ON i.ino = d.ino WHERE p.ino = ?",
            (name, parent),
        )
        if not rows:
            raise NotFound(f"inode {parent}")
        if not stat.S_ISDIR(int(rows[0][0])):
            raise NotADirectory(f"inode {parent}")
        if rows[0][1] is None:
            raise NotFound(name.decode(errors="replace"))
        return _inode(rows[0][1:])

    @staticmethod
    def _touch_dir(c: Conn, ino: int, now: int, nlink_delta: int = 0) -> None:
        c.execute(
            "UPDATE inodes SET mtime_ns=?, ctime_ns=?, nlink=nlink+? WHERE ino=?",
            (now, now, nlink_delta, ino),
        )

    def create(
        self, parent: int, name: bytes, mode: int, uid: int, gid: int, target: bytes | None = None,
        rdev: int = 0, *, audit: AuditRecord | None = None, around: Around | None = None,
    ) -> Inode:
        now = time.time_ns()
        is_dir = stat.S_ISDIR(mode)
        size = len(target) if target is not None else 0

        def body(c: Conn) -> Inode:
            paths = _Paths(c)
            pdir, taken = self._dir_entry(c, parent, name)
            if taken is not None:
                raise AlreadyExists(name.decode(errors="replace"))
            m, g = mode, gid
            if pdir.mode & stat.S_ISGID:
                # A setgid directory gives new entries its group, and subdirectories its setgid.
                g = pdir.gid
                if is_dir:
                    m |= stat.S_ISGID
            row = c.execute(
                "INSERT INTO inodes (mode, uid, gid, size, nlink, atime_ns, mtime_ns, ctime_ns, target,"
                f" rdev) VALUES (?,?,?,?,?,?,?,?,?,?) RETURNING {INODE_COLS}",
                (m, uid, g, size, 2 if is_dir else 1, now, now, now, target, rdev),
            ).fetchone()
            inode = _inode(row)
            c.execute("INSERT INTO dentries (parent, name, ino) VALUES (?,?,?)", (parent, name, inode.ino))
            self._touch_dir(c, parent, now, 1 if is_dir else 0)
            self._audit_in(c, audit, paths.entry(parent, name), ino=inode.ino, mode=m)
            _tell(around, paths, {parent: _touched(pdir, now, 1 if is_dir else 0)}, (parent,))
            return inode

        return self._write(body, touch=True)

    def link(self, ino: int, parent: int, name: bytes) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            self._dir(c, parent)
            inode = self._get_inode(c, ino)
            if inode.is_dir:
                raise NotPermitted("hard links to directories are not allowed")
            if inode.nlink <= 0:
                # As Linux: no new name for a file whose last one went (another node's
                # kernel may still think it has one); its drop may be under way.
                raise NotFound(f"inode {ino} has no name left")
            if self._entry(c, parent, name) is not None:
                raise AlreadyExists(name.decode(errors="replace"))
            c.execute("INSERT INTO dentries (parent, name, ino) VALUES (?,?,?)", (parent, name, ino))
            c.execute("UPDATE inodes SET nlink=nlink+1, ctime_ns=? WHERE ino=?", (now, ino))
            self._touch_dir(c, parent, now)
            return self._get_inode(c, ino)

        return self._write(body, touch=True)

    def unlink(self, parent: int, name: bytes, *, audit: AuditRecord | None = None,
               around: Around | None = None) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            paths = _Paths(c)
            pdir, inode = self._named(c, parent, name)
            if inode.is_dir:
                raise IsADirectory(name.decode(errors="replace"))
            c.execute("DELETE FROM dentries WHERE parent=? AND name=?", (parent, name))
            c.execute("UPDATE inodes SET nlink=nlink-1, ctime_ns=? WHERE ino=?", (now, inode.ino))
            self._touch_dir(c, parent, now)
            self._audit_in(c, audit, paths.entry(parent, name), ino=inode.ino,
                           nlink=inode.nlink - 1)
            _tell(around, paths, {parent: _touched(pdir, now)}, (parent,))
            return replace(inode, nlink=inode.nlink - 1, ctime_ns=now)

        return self._write(body, touch=True)

    def rmdir(self, parent: int, name: bytes, *, audit: AuditRecord | None = None) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            paths = _Paths(c)
            _, inode = self._named(c, parent, name)
            if not inode.is_dir:
                raise NotADirectory(name.decode(errors="replace"))
            if c.execute("SELECT 1 FROM dentries WHERE parent=? LIMIT 1", (inode.ino,)).fetchone():
                raise NotEmpty(name.decode(errors="replace"))
            c.execute("DELETE FROM dentries WHERE parent=? AND name=?", (parent, name))
            c.execute("UPDATE inodes SET nlink=0, ctime_ns=? WHERE ino=?", (now, inode.ino))
            self._touch_dir(c, parent, now, -1)
            self._audit_in(c, audit, paths.entry(parent, name), ino=inode.ino)
            return replace(inode, nlink=0)

        return self._write(body, touch=True)

    @staticmethod
    def _is_ancestor(c: Conn, anc: int, ino: int) -> bool:
        """True if ``anc`` is ``ino`` or one of its ancestors (directories have one parent)."""
        while True:
            if ino == anc:
                return True
            if ino == ROOT_INODE:
                return False
            row = c.execute("SELECT parent FROM dentries WHERE ino=? LIMIT 1", (ino,)).fetchone()
            if row is None:
                return False
            ino = int(row[0])

    def rename(
        self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, noreplace: bool,
        *, audit: AuditRecord | None = None, around: Around | None = None,
    ) -> Inode | None:
        """``around``: the directories after the rename (none if a directory moved or was
        replaced: their own rows changed too), the renamed inode after it, and with
        ``paths`` the paths of both directories."""
        now = time.time_ns()

        def body(c: Conn) -> Inode | None:
            paths = _Paths(c)
            old_dir, src = self._dir_entry(c, old_parent, old_name)
            new_dir, dst = self._dir_entry(c, new_parent, new_name)
            if src is None:
                raise NotFound(old_name.decode(errors="replace"))
            old_path = paths.entry(old_parent, old_name)() if audit is not None else ""
            if src.is_dir and self._is_ancestor(c, src.ino, new_parent):
                raise InvalidArgument("cannot move a directory into itself")
            replaced: Inode | None = None
            named = (old_parent, new_parent)
            if dst is not None:
                if noreplace:
                    raise AlreadyExists(new_name.decode(errors="replace"))
                if dst.ino == src.ino:
                    # Both names link the same inode: POSIX says do nothing.
                    _tell(around, paths, {old_parent: old_dir, new_parent: new_dir}, named, src)
                    return None
                if src.is_dir:
                    if not dst.is_dir:
                        raise NotADirectory(new_name.decode(errors="replace"))
                    if c.execute("SELECT 1 FROM dentries WHERE parent=? LIMIT 1", (dst.ino,)).fetchone():
                        raise NotEmpty(new_name.decode(errors="replace"))
                elif dst.is_dir:
                    raise IsADirectory(new_name.decode(errors="replace"))
                c.execute("DELETE FROM dentries WHERE parent=? AND name=?", (new_parent, new_name))
                new_nlink = 0 if dst.is_dir else dst.nlink - 1
                c.execute("UPDATE inodes SET nlink=?, ctime_ns=? WHERE ino=?", (new_nlink, now, dst.ino))
                if dst.is_dir:
                    self._touch_dir(c, new_parent, now, -1)
                replaced = replace(dst, nlink=new_nlink)
            c.execute(
                "UPDATE dentries SET parent=?, name=? WHERE parent=? AND name=?",
                (new_parent, new_name, old_parent, old_name),
            )
            c.execute("UPDATE inodes SET ctime_ns=? WHERE ino=?", (now, src.ino))
            moved_dir = src.is_dir and old_parent != new_parent
            self._touch_dir(c, old_parent, now, -1 if moved_dir else 0)
            if new_parent != old_parent:
                self._touch_dir(c, new_parent, now, 1 if moved_dir else 0)
            self._audit_in(c, audit, paths.entry(new_parent, new_name), ino=src.ino,
                           src=old_path, replaced=None if replaced is None else replaced.ino)
            dirs = {} if src.is_dir or (replaced is not None and replaced.is_dir) else {
                old_parent: _touched(old_dir, now), new_parent: _touched(new_dir, now)}
            _tell(around, paths, dirs, named, replace(src, ctime_ns=now))
            return replaced

        return self._write(body, touch=True)

    def setattr(
        self,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
    ) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            inode = self._get_inode(c, ino)
            m = mode if mode is None else stat.S_IFMT(inode.mode) | stat.S_IMODE(mode)
            new = replace(
                inode,
                mode=inode.mode if m is None else m,
                uid=inode.uid if uid is None else uid,
                gid=inode.gid if gid is None else gid,
                atime_ns=inode.atime_ns if atime_ns is None else atime_ns,
                mtime_ns=inode.mtime_ns if mtime_ns is None else mtime_ns,
                ctime_ns=now,
            )
            c.execute(
                "UPDATE inodes SET mode=?, uid=?, gid=?, atime_ns=?, mtime_ns=?, ctime_ns=? WHERE ino=?",
                (new.mode, new.uid, new.gid, new.atime_ns, new.mtime_ns, new.ctime_ns, ino),
            )
            return new

        return self._write(body, touch=True)

    def readdir(self, parent: int, after_id: int, limit: int = 256) -> list[tuple[int, bytes, Inode]]:
        rows = self._query(
            f"SELECT d.id, d.name, {_INODE_COLS_I} FROM dentries d JOIN inodes i ON i.ino = d.ino "
            "WHERE d.parent=? AND d.id>? ORDER BY d.id LIMIT ?",
            (parent, after_id, limit),
        )
        return [(int(r[0]), bytes(r[1]), _inode(r[2:])) for r in rows]

    # -- extended attributes -----------------------------------------------------------------

    def get_xattr(self, ino: int, name: bytes) -> bytes | None:
        rows = self._query("SELECT value FROM xattrs WHERE ino=? AND name=?", (ino, name))
        return bytes(rows[0][0]) if rows else None

    def list_xattrs(self, ino: int) -> list[bytes]:
        return [bytes(r[0]) for r in self._query("SELECT name FROM xattrs WHERE ino=? ORDER BY name", (ino,))]

    def xattr_inodes(self) -> set[int]:
        return {int(r[0]) for r in self._query("SELECT DISTINCT ino FROM xattrs")}

    def set_xattr(self, ino: int, name: bytes, value: bytes, *, create: bool = False,
                  replace_only: bool = False, total_max: int | None = None) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            inode = self._get_inode(c, ino)
            exists = c.execute("SELECT 1 FROM xattrs WHERE ino=? AND name=?", (ino, name)).fetchone()
            if create and exists:
                raise AlreadyExists(name.decode(errors="replace"))
            if replace_only and not exists:
                raise NoAttribute(name.decode(errors="replace"))
            if total_max is not None:
                # In the transaction: two setxattrs at once cannot both take the last room.
                others = c.execute("SELECT COALESCE(SUM(LENGTH(name) + LENGTH(value)), 0) "
                                   "FROM xattrs WHERE ino=? AND name<>?", (ino, name)).fetchone()
                total = int(others[0]) + len(name) + len(value)
                if total > total_max:
                    raise CkptfsError(f"inode {ino}: its xattrs would hold {total} bytes, more "
                                      f"than {total_max}", errno=errno.ENOSPC)
            c.execute("INSERT INTO xattrs VALUES (?, ?, ?) ON CONFLICT (ino, name) DO UPDATE SET "
                      "value=excluded.value", (ino, name, value))
            c.execute("UPDATE inodes SET ctime_ns=? WHERE ino=?", (now, ino))
            return replace(inode, ctime_ns=now)

        return self._write(body, touch=True)

    def remove_xattr(self, ino: int, name: bytes) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            inode = self._get_inode(c, ino)
            if not c.execute("DELETE FROM xattrs WHERE ino=? AND name=?", (ino, name)).rowcount:
                raise NoAttribute(name.decode(errors="replace"))
            c.execute("UPDATE inodes SET ctime_ns=? WHERE ino=?", (now, ino))
            return replace(inode, ctime_ns=now)

        return self._write(body, touch=True)

    # -- file contents -----------------------------------------------------------------------

    def extents(self, ino: int) -> dict[int, ChunkRef]:
        rows = self._query(
            "SELECT e.idx, e.digest, e.length, group_concat(r.tier) FROM extents e "
            "LEFT JOIN replicas r ON r.digest = e.digest AND r.state = 'valid' "
            "WHERE e.ino=? GROUP BY e.ino, e.idx",
            (ino,),
        )
        return {
            int(idx): ChunkRef(bytes(d), int(n), tuple(sorted(t.split(","))) if t else ())
            for idx, d, n, t in rows
        }

    def commit_file(
        self,
        ino: int,
        size: int,
        mtime_ns: int,
        ctime_ns: int,
        chunk_size: int,
        changes: dict[int, ChunkRef | None],
        synced: bool = False,
        uploads: dict[bytes, list[str]] | None = None,
        charge: Charge | None = None,
        *,
        audit: AuditRecord | None = None,
    ) -> list[bytes]:
        n_chunks = (size + chunk_size - 1) // chunk_size
        queued = uploads or {}

        def body(c: Conn) -> list[bytes]:
            if charge is not None:  # first: a refusal leaves nothing of the version
                charge_commit(c, ino, size, charge)
            # The extents this version drops (beyond its end) or replaces, deleted and
            # returned in one statement per _IN_BATCH of them (not a read and a delete each).
            kept = [idx for idx in changes if idx < n_chunks]
            dropped: list[bytes] = []
            wanted: dict[str, list[bytes]] = {}  # tier -> chunks given an upload job there
            for at in range(0, max(len(kept), 1), _IN_BATCH):
                part = kept[at:at + _IN_BATCH]
                where = ["idx>=?"] if at == 0 else []  # the first also drops the tail
                if part:
                    where.append(f"idx IN ({','.join('?' * len(part))})")
                dropped += [bytes(r[0]) for r in c.execute(
                    f"DELETE FROM extents WHERE ino=? AND ({' OR '.join(where)}) RETURNING digest",
                    (ino, *([n_chunks] if at == 0 else []), *part)).fetchall()]
            for idx, ref in changes.items():
                if idx >= n_chunks or ref is None:
                    continue
                c.execute(_KNOWN_CHUNK, (ref.digest, ref.length))
                for tier in ref.tiers:
                    c.execute(_VALID_REPLICA, (ref.digest, tier))
                c.execute(
                    "INSERT INTO extents VALUES (?, ?, ?, ?) ON CONFLICT (ino, idx) DO UPDATE SET "
                    "digest=excluded.digest, length=excluded.length",
                    (ino, idx, ref.digest, ref.length),
                )
                for tier in queued.get(ref.digest, ()):
                    if c.execute(
                        "INSERT INTO upload_jobs (digest, tier, length, enqueued_ns) "
                        "SELECT ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM replicas "
                        "WHERE digest=? AND tier=? AND state='valid') ON CONFLICT DO NOTHING",
                        (ref.digest, tier, ref.length, mtime_ns, ref.digest, tier),
                    ).rowcount:
                        wanted.setdefault(tier, []).append(ref.digest)
            # Cancelled rows end a settle's wait (Deleter.settle, on any node).
            if sum(_wanted_on(c, tier, digests) for tier, digests in wanted.items()):
                self._notify_deletions(c)
            c.execute(
                "UPDATE inodes SET size=?, mtime_ns=?, ctime_ns=? WHERE ino=?",
                (size, mtime_ns, ctime_ns, ino),
            )
            self._audit_in(c, audit, lambda: self._path_of(c, ino), ino=ino, size=size,
                           chunks=sum(r is not None for r in changes.values()), synced=synced)
            return dropped

        return self._write(body, synced=synced, touch=True)

    def delete_inode(self, ino: int) -> list[bytes]:
        def body(c: Conn) -> list[bytes]:
            if c.execute("SELECT 1 FROM open_handles WHERE ino=? LIMIT 1", (ino,)).fetchone():
                return []
            # The inode first: one linked again meanwhile (another node's link by its
            # number) keeps its name and its extents. Extents of an inode whose row is
            # gone already (a leftover) go too.
            if c.execute("DELETE FROM inodes WHERE ino=? AND nlink<=0", (ino,)).rowcount:
                c.execute("DELETE FROM xattrs WHERE ino=?", (ino,))
                uncharge_inode(c, ino)
            elif c.execute("SELECT 1 FROM inodes WHERE ino=?", (ino,)).fetchone():
                return []
            return [bytes(r[0]) for r in c.execute(
                "DELETE FROM extents WHERE ino=? RETURNING digest", (ino,)).fetchall()]

        return self._write(body)

    def unlinked_inodes(self) -> list[int]:
        return [int(r[0]) for r in self._query("SELECT ino FROM inodes WHERE nlink<=0")]

    def drop_unreferenced(
        self, digests: Iterable[bytes], extra_tiers: dict[bytes, set[str]] | None = None
    ) -> dict[bytes, list[str]]:
        now = time.time_ns()
        todo = set(digests)

        def body(c: Conn) -> dict[bytes, list[str]]:
            gone: dict[bytes, list[str]] = {}
            for d in todo:
                if c.execute("SELECT 1 FROM extents WHERE digest=? LIMIT 1", (d,)).fetchone():
                    continue
                # Each row deleted and read in one statement (not a read and a delete).
                row = c.execute("DELETE FROM chunks WHERE digest=? RETURNING length", (d,)).fetchone()
                tiers = {str(r[0]) for r in c.execute(
                    "DELETE FROM replicas WHERE digest=? RETURNING tier", (d,)).fetchall()}
                extra = (extra_tiers or {}).get(d, set())
                if row is None and not tiers and not extra:
                    continue  # dropped already (by another collect)
                jobs = {str(r[0]) for r in c.execute(
                    "DELETE FROM upload_jobs WHERE digest=? RETURNING tier", (d,)).fetchall()}
                length = 0 if row is None else int(row[0])
                for tier in tiers | jobs | extra:
                    queue_deletion(c, d, tier, length, now)
                gone[d] = sorted(tiers | extra)
            if gone:  # rows for other nodes' local tiers, and remote ones any node takes
                self._notify_deletions(c)
            return gone

        return self._write(body)

    # -- the deletion queue ------------------------------------------------------------------

    def queue_deletions(self, pairs: Iterable[tuple[bytes, str]]) -> int:
        now = time.time_ns()
        todo = set(pairs)

        def body(c: Conn) -> int:
            for d, tier in todo:
                row = c.execute("SELECT length FROM chunks WHERE digest=?", (d,)).fetchone()
                queue_deletion(c, d, tier, 0 if row is None else int(row[0]), now)
            if todo:
                self._notify_deletions(c)
            return len(todo)

        return self._write(body)

    def due_deletions(
        self, now_ns: int, limit: int, skip: set[tuple[bytes, str]], tiers: Sequence[str]
    ) -> list[Deletion]:
        if not tiers:
            return []
        tp = ",".join("?" * len(tiers))
        rows = self._query(
            f"SELECT digest, tier, length, attempts FROM deletions WHERE next_try_ns BETWEEN ? "
            f"AND ? AND tier IN ({tp}) ORDER BY enqueued_ns LIMIT ?",
            (-now_ns, now_ns, *tiers, limit + len(skip)),
        )
        out = [Deletion(bytes(d), str(t), int(n), int(a)) for d, t, n, a in rows]
        return [r for r in out if (r.digest, r.tier) not in skip][:limit]

    def next_deletion_due_ns(self, skip: set[tuple[bytes, str]], tiers: Sequence[str]) -> int | None:
        if not tiers:
            return None
        tp = ",".join("?" * len(tiers))
        # Unclaimed rows by their retry time, claimed ones by their lease's end.
        rows = self._query(
            f"SELECT * FROM (SELECT digest, tier, next_try_ns FROM deletions WHERE tier IN ({tp}) "
            "AND next_try_ns>=0 ORDER BY next_try_ns LIMIT ?) AS due UNION ALL "
            f"SELECT * FROM (SELECT digest, tier, -next_try_ns FROM deletions WHERE tier IN ({tp}) "
            "AND next_try_ns<0 ORDER BY next_try_ns DESC LIMIT ?) AS leased",
            (*tiers, len(skip) + 1, *tiers, len(skip) + 1),
        )
        due = [int(n) for d, t, n in rows if (bytes(d), str(t)) not in skip]
        return min(due, default=None)

    def claim_deletions(
        self, pairs: Sequence[tuple[bytes, str]], lease_until_ns: int | None = None,
        owner: tuple[str, str] | None = None,
    ) -> list[tuple[bytes, str]]:
        todo = list(pairs)

        def body(c: Conn) -> list[tuple[bytes, str]]:
            ok = []
            now = time.time_ns()
            cancelled = held = False
            for d, tier in todo:
                row = c.execute(
                    "SELECT next_try_ns FROM deletions WHERE digest=? AND tier=?", (d, tier)
                ).fetchone()
                if row is None or -int(row[0]) > now:
                    continue  # done, or being deleted by another deleter (its lease runs)
                # A move (moves.py): a node's uncommitted chunk is, or is being, PUT there.
                wanted = c.execute(
                    "SELECT 1 FROM replicas WHERE digest=? AND tier=? AND state='valid' UNION ALL "
                    f"SELECT 1 FROM upload_jobs WHERE digest=? AND tier=? UNION ALL {MOVED_PAIR} "
                    "LIMIT 1",
                    (d, tier, d, tier, d, tier),
                ).fetchone()
                if wanted:
                    c.execute("DELETE FROM deletions WHERE digest=? AND tier=?", (d, tier))
                    cancelled = True
                    # A claim whose lease ran out (its deleter died, or its DELETE's grace
                    # ended unwritten) ended here: the jobs it held may run.
                    if int(row[0]) < 0 and _restamp_jobs(c, d, tier, now):
                        held = True
                    continue
                if lease_until_ns is not None:
                    c.execute("UPDATE deletions SET next_try_ns=? WHERE digest=? AND tier=?",
                              (-lease_until_ns, d, tier))
                    if owner is not None:  # a restart of its node takes it back (claims.py)
                        record_owner(c, d, tier, lease_until_ns, owner)
                ok.append((d, tier))
            if cancelled:  # the row ended: a settle may wait for it
                self._notify_deletions(c)
            if held:
                self._notify_held(c)
            return ok

        return self._write(body)

    def finish_deletions(
        self, pairs: Iterable[tuple[bytes, str]], lease_until_ns: int | None = None
    ) -> None:
        todo = list(pairs)
        # With the lease: only this claim's rows (one whose lease ran out may be another's).
        only = "" if lease_until_ns is None else " AND next_try_ns=?"
        tail = () if lease_until_ns is None else (-lease_until_ns,)

        def body(c: Conn) -> None:
            now = time.time_ns()
            ended = held = False
            for d, tier in todo:
                row = c.execute("DELETE FROM deletions WHERE digest=? AND tier=?" + only +
                                " RETURNING next_try_ns", (d, tier, *tail)).fetchone()
                if row is None:
                    continue
                ended = True
                if int(row[0]) < 0:
                    forget_owner(c, d, tier)
                    if _restamp_jobs(c, d, tier, now):
                        held = True
            if ended:  # a settle, on any node, may wait for these rows
                self._notify_deletions(c)
            if held:
                self._notify_held(c)

        self._write(body)

    def release_deletion_claims(
        self, pairs: Iterable[tuple[bytes, str]], lease_until_ns: int
    ) -> int:
        todo = list(pairs)

        def body(c: Conn) -> int:
            now = time.time_ns()
            n = 0
            held = False
            for d, tier in todo:
                row = c.execute(
                    "UPDATE deletions SET next_try_ns=0 WHERE digest=? AND tier=? AND next_try_ns=? "
                    "RETURNING 1", (d, tier, -lease_until_ns)).fetchone()
                if row is not None:
                    held = _restamp_jobs(c, d, tier, now) or held
                    n += 1
            if n:  # due again, for any node's deleter
                self._notify_deletions(c)
            if held:
                self._notify_held(c)
            return n

        return self._write(body)

    def postpone_deletion(
        self, digest: bytes, tier: str, next_try_ns: int, error: str,
        lease_until_ns: int | None = None, *, keep_claim: bool = False,
    ) -> None:
        only = "" if lease_until_ns is None else " AND next_try_ns=?"
        tail = () if lease_until_ns is None else (-lease_until_ns,)
        # Kept: the claim's new lease runs until the retry time (the row is then due again
        # as any lease that ran out is).
        value = -next_try_ns if keep_claim else next_try_ns

        def body(c: Conn) -> None:
            if not c.execute(
                "UPDATE deletions SET attempts=attempts+1, next_try_ns=?, last_error=? "
                "WHERE digest=? AND tier=?" + only, (value, error, digest, tier, *tail),
            ).rowcount:
                return
            # Tried: a settle may wait for it (and a claim's lease became a retry time).
            self._notify_deletions(c)
            if keep_claim:
                if lease_until_ns is not None:  # the same owner, a new lease (claims.py)
                    move_owner(c, digest, tier, lease_until_ns, next_try_ns)
                return  # still claimed: the jobs it holds stay held
            if lease_until_ns is not None and c.execute(
                "SELECT 1 FROM upload_jobs WHERE digest=? AND tier=?", (digest, tier)
            ).fetchone():
                self._notify_held(c)  # the claim ended: that job may run

        self._write(body)

    def retry_deletions_now(self, tier: str | None = None) -> int:
        def body(c: Conn) -> int:
            if tier is None:
                n = c.execute("UPDATE deletions SET next_try_ns=0 WHERE next_try_ns>0").rowcount
            else:
                n = c.execute(
                    "UPDATE deletions SET next_try_ns=0 WHERE tier=? AND next_try_ns>0", (tier,)
                ).rowcount
            if n:  # due now, for the deleters of every node
                self._notify_deletions(c)
            return int(n)

        return self._write(body)

    def deletions_pending(self, digests: Iterable[bytes], due_before_ns: int | None = None) -> set[bytes]:
        out = set()
        with self._reading() as c:
            for d in set(digests):
                if due_before_ns is None:
                    row = c.execute("SELECT 1 FROM deletions WHERE digest=? LIMIT 1", (d,)).fetchone()
                else:
                    row = c.execute(
                        "SELECT 1 FROM deletions WHERE digest=? AND next_try_ns<=? LIMIT 1",
                        (d, due_before_ns),
                    ).fetchone()
                if row:
                    out.add(d)
        return out

    def deletion_keys(self, tier: str) -> set[bytes]:
        return {bytes(r[0]) for r in self._query("SELECT digest FROM deletions WHERE tier=?", (tier,))}

    def deletion_backlog(self) -> list[DeletionBacklog]:
        out = []
        with self._reading() as c:
            try:
                rows = c.execute(
                    "SELECT tier, count(*), coalesce(sum(length), 0), min(enqueued_ns), "
                    "count(*) FILTER (WHERE attempts>0) FROM deletions GROUP BY tier ORDER BY tier"
                ).fetchall()
            except self._missing_table:
                return []
            for tier, n, size, oldest, failing in rows:
                err = c.execute(
                    # The latest retry time, also of a claim kept after a DELETE in doubt
                    # (negative: claimed until then).
                    "SELECT last_error FROM deletions WHERE tier=? AND last_error IS NOT NULL "
                    "ORDER BY abs(next_try_ns) DESC LIMIT 1", (tier,),
                ).fetchone()
                out.append(DeletionBacklog(str(tier), int(n), int(size), None if oldest is None else int(oldest),
                                           int(failing), None if err is None else str(err[0])))
        return out

    # -- remote replication ------------------------------------------------------------------

    def due_uploads(
        self, now_ns: int, limit: int, skip: set[tuple[bytes, str]],
        sources: Sequence[str] | None = None,
    ) -> list[UploadJob]:
        held, args = held_on(sources)
        rows = self._query(
            "SELECT u.digest, u.tier, u.length, u.enqueued_ns, u.attempts, group_concat(r.tier) "
            "FROM upload_jobs u LEFT JOIN replicas r ON r.digest = u.digest AND r.state = 'valid' "
            f"WHERE u.next_try_ns<=?{held}{_CLAIMED} GROUP BY u.digest, u.tier ORDER BY u.enqueued_ns "
            "LIMIT ?",
            (now_ns, *args, limit + len(skip)),
        )
        jobs = [
            UploadJob(bytes(d), str(t), int(n), int(e), int(a), tuple(s.split(",")) if s else ())
            for d, t, n, e, a, s in rows
        ]
        return [j for j in jobs if (j.digest, j.tier) not in skip][:limit]

    def due_uploads_of(
        self, digests: Iterable[bytes], now_ns: int, limit: int, skip: set[tuple[bytes, str]],
        sources: Sequence[str] | None = None,
    ) -> list[UploadJob]:
        jobs: list[UploadJob] = []
        held, args = held_on(sources)
        with self._reading() as c:
            for d in digests:
                if len(jobs) >= limit:
                    break
                rows = c.execute(
                    "SELECT u.digest, u.tier, u.length, u.enqueued_ns, u.attempts, group_concat(r.tier) "
                    "FROM upload_jobs u LEFT JOIN replicas r ON r.digest = u.digest AND r.state = 'valid' "
                    f"WHERE u.digest=? AND u.next_try_ns<=?{held}{_CLAIMED} "
                    "GROUP BY u.digest, u.tier",
                    (d, now_ns, *args),
                ).fetchall()
                jobs += [
                    UploadJob(bytes(d), str(t), int(n), int(e), int(a), tuple(s.split(",")) if s else ())
                    for d, t, n, e, a, s in rows
                    if (bytes(d), str(t)) not in skip
                ]
        return jobs[:limit]

    def pending_digests(self, digests: Iterable[bytes]) -> int:
        with self._reading() as c:
            return sum(
                1 for d in set(digests)
                if c.execute("SELECT 1 FROM upload_jobs WHERE digest=? LIMIT 1", (d,)).fetchone()
            )

    def next_upload_due_ns(
        self, skip: set[tuple[bytes, str]], sources: Sequence[str] | None = None
    ) -> int | None:
        held, args = held_on(sources)
        rows = self._query(
            f"SELECT * FROM (SELECT u.digest, u.tier, u.next_try_ns FROM upload_jobs u "
            f"WHERE 1=1{held}{_CLAIMED} ORDER BY u.next_try_ns LIMIT ?) AS due UNION ALL "
            # Jobs held by a claim, found from the (few) claimed rows: the claim's end is an
            # event (a kick, or another node's NOTIFY: deletion_events.py); its lease's end,
            # should its node die, a deadline. A lease that ran out still holds the job
            # (moves.py: its deleter may still be deleting) until a deleter takes the row
            # over, which due_deletions offers at once; that claim's end is the event. So
            # it is no deadline here: a past one would make the uploader loop until then.
            f"SELECT * FROM (SELECT u.digest, u.tier, -d.next_try_ns FROM deletions d JOIN "
            f"upload_jobs u ON u.digest = d.digest AND u.tier = d.tier WHERE d.next_try_ns < 0 "
            f"AND d.next_try_ns < ?{held} ORDER BY d.next_try_ns DESC LIMIT ?) AS waiting",
            (*args, len(skip) + 1, -time.time_ns(), *args, len(skip) + 1),
        )
        due = [int(n) for d, t, n in rows if (bytes(d), str(t)) not in skip]
        return min(due, default=None)

    def finish_upload(self, digest: bytes, tier: str) -> bool:
        return self.finish_uploads([(digest, tier)])[(digest, tier)]

    def finish_uploads(
        self, done: Sequence[tuple[bytes, str]], jobs: Mapping[tuple[bytes, str], int] | None = None
    ) -> dict[tuple[bytes, str], bool]:
        def body(c: Conn) -> dict[tuple[bytes, str], bool]:
            kept: dict[tuple[bytes, str], bool] = {}
            now = time.time_ns()
            queued = False
            for digest, tier in done:
                ran = (jobs or {}).get((digest, tier))
                if ran is not None and c.execute(
                    "SELECT 1 FROM upload_jobs WHERE digest=? AND tier=? AND enqueued_ns!=?",
                    (digest, tier, ran),
                ).fetchone():
                    # This upload ran for an older job (its chunk was dropped, its object
                    # deleted, perhaps after this PUT): the newer job uploads it again.
                    kept[(digest, tier)] = False
                    continue
                if c.execute("SELECT 1 FROM deletions WHERE digest=? AND tier=? AND "
                             "next_try_ns<0", (digest, tier)).fetchone():
                    # A deletion of this object is claimed: its DELETE may land after this
                    # PUT. The job stays and runs again once that deletion is done.
                    c.execute("UPDATE upload_jobs SET next_try_ns=0 WHERE digest=? AND tier=?",
                              (digest, tier))
                    kept[(digest, tier)] = False
                    continue
                gone = c.execute(
                    "DELETE FROM upload_jobs WHERE digest=? AND tier=?", (digest, tier)
                ).rowcount == 0
                if gone:
                    # The copy just made is garbage: the deletion queue removes it.
                    queue_deletion(c, digest, tier, 0, now)
                    queued = True
                else:
                    c.execute(_VALID_REPLICA, (digest, tier))
                kept[(digest, tier)] = not gone
            if queued:  # a remote row: any node's deleter may take it
                self._notify_deletions(c)
            return kept

        return self._write(body, touch=True)

    def retry_uploads_now(self, tier: str) -> int:
        def body(c: Conn) -> int:
            return c.execute(
                "UPDATE upload_jobs SET next_try_ns=0 WHERE tier=? AND next_try_ns>0 "
                "AND state='pending'", (tier,)
            ).rowcount

        return self._write(body)

    def postpone_upload(
        self, digest: bytes, tier: str, next_try_ns: int, error: str, blocked: bool
    ) -> None:
        def body(c: Conn) -> None:
            c.execute(
                "UPDATE upload_jobs SET attempts=attempts+1, next_try_ns=?, last_error=?, state=? "
                "WHERE digest=? AND tier=?",
                (next_try_ns, error, "blocked" if blocked else "pending", digest, tier),
            )

        self._write(body)

    def backlog(self) -> Backlog:
        with self._reading() as c:
            n, size, oldest, blocked = c.execute(
                "SELECT count(*), coalesce(sum(length), 0), min(enqueued_ns), "
                "count(*) FILTER (WHERE state='blocked') FROM upload_jobs"
            ).fetchone()
            err = c.execute(
                "SELECT last_error FROM upload_jobs WHERE last_error IS NOT NULL "
                "ORDER BY next_try_ns DESC LIMIT 1"
            ).fetchone()
        return Backlog(int(n), int(size), None if oldest is None else int(oldest), int(blocked),
                       None if err is None else str(err[0]))

    def snapshot_of_ns(self) -> int | None:
        taken = self.get_meta("snapshot_of_ns")
        return None if taken is None else int(taken)

    def snapshot_is_current(self) -> bool:
        with self._reading() as c:
            changed = self._get_meta(c, "changed_ns")
            taken = self._get_meta(c, "snapshot_of_ns")
        return changed is None or (taken is not None and int(taken) >= int(changed))

    def adopt_snapshot(self, remote_tiers: list[str]) -> tuple[int, list[str]]:
        recorded = {t["name"]: t.get("kind", "local") for t in self.recorded_tiers()}
        snap_remotes = [n for n, k in recorded.items() if k != "local"]
        # The chunks a remote held (read before the replica rows are replaced below).
        held = ("SELECT digest FROM replicas WHERE state='valid' AND tier IN "
                f"({','.join('?' * len(snap_remotes)) or 'NULL'})")

        def body(c: Conn) -> tuple[int, list[str]]:
            lost = [
                int(r[0]) for r in c.execute(
                    f"SELECT DISTINCT ino FROM extents WHERE digest NOT IN ({held})", snap_remotes
                ).fetchall()
            ]
            removed = [self._path_of(c, ino) for ino in lost]
            for ino in lost:
                for parent, in c.execute("SELECT parent FROM dentries WHERE ino=?", (ino,)).fetchall():
                    c.execute("UPDATE inodes SET mtime_ns=?, ctime_ns=? WHERE ino=?",
                              (time.time_ns(), time.time_ns(), parent))
                c.execute("DELETE FROM dentries WHERE ino=?", (ino,))
                c.execute("DELETE FROM extents WHERE ino=?", (ino,))
                c.execute("DELETE FROM xattrs WHERE ino=?", (ino,))
                uncharge_inode(c, ino)
                c.execute("DELETE FROM inodes WHERE ino=?", (ino,))
            c.execute(f"DELETE FROM chunks WHERE digest NOT IN ({held})", snap_remotes)
            c.execute("DELETE FROM upload_jobs")
            # Another node's queue: never delete on the strength of its rows (fsck finds
            # what is left over).
            c.execute("DELETE FROM deletions")
            c.execute("DELETE FROM replicas")
            for tier in remote_tiers:
                c.execute("INSERT INTO replicas SELECT digest, ?, 'valid' FROM chunks", (tier,))
            kept = int(c.execute(
                "SELECT count(*) FROM inodes WHERE mode & 61440 = 32768").fetchone()[0])
            return kept, removed

        return self._write(body, touch=True)

    def pending_uploads_for(self, inos: Iterable[int]) -> int:
        total = 0
        with self._reading() as c:
            for ino in inos:
                row = c.execute(
                    "SELECT count(*) FROM upload_jobs u WHERE u.digest IN "
                    "(SELECT digest FROM extents WHERE ino=?)", (ino,)
                ).fetchone()
                total += int(row[0])
        return total

    def not_durable_files(self) -> dict[str, set[int]]:
        with self._reading() as c:
            rows = c.execute(
                "SELECT DISTINCT r.tier, e.ino FROM upload_jobs u "
                "JOIN extents e ON e.digest = u.digest "
                "JOIN replicas r ON r.digest = u.digest AND r.state = 'valid' AND r.tier <> u.tier"
            ).fetchall()
        out: dict[str, set[int]] = {}
        for tier, ino in rows:
            out.setdefault(str(tier), set()).add(int(ino))
        return out

    # -- local eviction ----------------------------------------------------------------------

    def eviction_candidates(
        self, local_tiers: Sequence[str], remote_tiers: Sequence[str], limit: int
    ) -> list[tuple[bytes, str, int]]:
        if not local_tiers or not remote_tiers:
            return []
        lp = ",".join("?" * len(local_tiers))
        rp = ",".join("?" * len(remote_tiers))
        with self._reading() as c:
            rows = c.execute(
                f"SELECT r.digest, r.tier, c.length FROM replicas r JOIN chunks c ON c.digest = r.digest "
                f"WHERE r.tier IN ({lp}) AND EXISTS (SELECT 1 FROM replicas x WHERE x.digest = r.digest "
                f"AND x.state = 'valid' AND x.tier IN ({rp})) "
                "AND NOT EXISTS (SELECT 1 FROM upload_jobs u WHERE u.digest = r.digest) "
                "ORDER BY (SELECT max(i.mtime_ns) FROM extents e JOIN inodes i ON i.ino = e.ino "
                "WHERE e.digest = r.digest) LIMIT ?",
                (*local_tiers, *remote_tiers, limit),
            ).fetchall()
        return [(bytes(d), str(t), int(n)) for d, t, n in rows]

    def forget_local_replica(self, digest: bytes, tier: str, remote_tiers: Sequence[str], *,
                             audit: AuditRecord | None = None) -> bool:
        rp = ",".join("?" * len(remote_tiers)) or "NULL"

        def body(c: Conn) -> bool:
            ok = c.execute(
                f"SELECT 1 FROM replicas WHERE digest=? AND state='valid' AND tier IN ({rp}) "
                "AND NOT EXISTS (SELECT 1 FROM upload_jobs WHERE digest=?) LIMIT 1",
                (digest, *remote_tiers, digest),
            ).fetchone()
            if not ok:
                return False
            if not c.execute("DELETE FROM replicas WHERE digest=? AND tier=?", (digest, tier)).rowcount:
                return False
            row = c.execute("SELECT length FROM chunks WHERE digest=?", (digest,)).fetchone()
            queue_deletion(c, digest, tier, 0 if row is None else int(row[0]), time.time_ns())
            self._notify_deletions(c)
            self._audit_in(c, audit, None, digest=digest.hex(), tier=tier)
            return True

        return self._write(body)

    def has_chunk(self, digest: bytes) -> bool:
        return bool(self._query("SELECT 1 FROM chunks WHERE digest=?", (digest,)))

    def chunk_length(self, digest: bytes) -> int:
        rows = self._query("SELECT length FROM chunks WHERE digest=?", (digest,))
        return int(rows[0][0]) if rows else 0

    def stored_by_tier(self) -> dict[str, tuple[int, int]]:
        with self._reading() as c:
            rows = c.execute(
                "SELECT r.tier, count(*), coalesce(sum(c.length), 0) FROM replicas r "
                "JOIN chunks c ON c.digest = r.digest WHERE r.state = 'valid' GROUP BY r.tier"
            ).fetchall()
        return {str(t): (int(n), int(b)) for t, n, b in rows}

    def replica_tiers(self, digest: bytes) -> tuple[str, ...]:
        with self._reading() as c:
            rows = c.execute(
                "SELECT tier FROM replicas WHERE digest=? AND state='valid' ORDER BY tier", (digest,)
            ).fetchall()
        return tuple(str(r[0]) for r in rows)

    def bad_replica_tiers(self, digest: bytes) -> tuple[str, ...]:
        with self._reading() as c:
            rows = c.execute(
                "SELECT tier FROM replicas WHERE digest=? AND state='bad' ORDER BY tier", (digest,)
            ).fetchall()
        return tuple(str(r[0]) for r in rows)

    def bad_replica_keys(self, tier: str) -> set[bytes]:
        with self._reading() as c:
            rows = c.execute("SELECT digest FROM replicas WHERE tier=? AND state='bad'", (tier,))
            return {bytes(r[0]) for r in rows}

    # -- self-healing ------------------------------------------------------------------------

    def mark_replica_bad(self, digest: bytes, tier: str) -> None:
        def body(c: Conn) -> None:
            c.execute("UPDATE replicas SET state='bad' WHERE digest=? AND tier=?", (digest, tier))

        self._write(body)

    def add_replica_if_known(self, digest: bytes, tier: str) -> bool:
        def body(c: Conn) -> bool:
            if not c.execute("SELECT 1 FROM chunks WHERE digest=?", (digest,)).fetchone():
                queue_deletion(c, digest, tier, 0, time.time_ns())
                self._notify_deletions(c)
                return False
            c.execute(_VALID_REPLICA, (digest, tier))
            return True

        return self._write(body)

    def requeue_upload(self, digest: bytes, tier: str) -> bool:
        def body(c: Conn) -> bool:
            row = c.execute("SELECT length FROM chunks WHERE digest=?", (digest,)).fetchone()
            if row is None:
                return False
            c.execute("DELETE FROM replicas WHERE digest=? AND tier=?", (digest, tier))
            c.execute(
                "INSERT INTO upload_jobs (digest, tier, length, enqueued_ns) "
                "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", (digest, tier, int(row[0]), time.time_ns()),
            )
            if _wanted_on(c, tier, [digest]):
                self._notify_deletions(c)  # a cancelled row ends a settle's wait
            return True

        return self._write(body)

    def upload_job_pairs(self) -> set[tuple[bytes, str]]:
        with self._reading() as c:
            return {(bytes(d), str(t)) for d, t in c.execute("SELECT digest, tier FROM upload_jobs")}

    def queue_upload(self, digest: bytes, tier: str) -> bool:
        def body(c: Conn) -> bool:
            if not c.execute(
                "INSERT INTO upload_jobs (digest, tier, length, enqueued_ns) "
                "SELECT digest, ?, length, ? FROM chunks WHERE digest=? ON CONFLICT DO NOTHING",
                (tier, time.time_ns(), digest),
            ).rowcount:
                return False
            if _wanted_on(c, tier, [digest]):
                self._notify_deletions(c)  # a cancelled row ends a settle's wait
            return True

        return self._write(body)

    def extent_replicas(self, inos: Sequence[int], tiers: Sequence[str]) -> list[ExtentReplicas]:
        out: list[ExtentReplicas] = []
        tp = ",".join("?" * len(tiers)) or "NULL"
        step = max(1, _SQL_VARS - len(tiers))
        with self._reading() as c:
            for i in range(0, len(inos), step):
                batch = list(inos[i : i + step])
                ip = ",".join("?" * len(batch))
                rows = c.execute(
                    f"SELECT e.ino, e.digest, e.length, EXISTS (SELECT 1 FROM replicas r "
                    f"WHERE r.digest = e.digest AND r.state = 'valid' AND r.tier IN ({tp})) "
                    f"FROM extents e WHERE e.ino IN ({ip})",
                    (*tiers, *batch),
                ).fetchall()
                out += [ExtentReplicas(int(i_), bytes(d), int(n), bool(on)) for i_, d, n, on in rows]
        return out

    def stored_on_tier(self, tier: str) -> tuple[int, int]:
        with self._reading() as c:
            n, size = c.execute(
                "SELECT count(*), coalesce(sum(c.length), 0) FROM replicas r JOIN chunks c "
                "ON c.digest = r.digest WHERE r.tier = ? AND r.state = 'valid'", (tier,)
            ).fetchone()
        return int(n), int(size)

    # -- checkpoints -------------------------------------------------------------------------

    def _resolve(self, c: Conn, path: str) -> Inode | None:
        ino = ROOT_INODE
        for part in [p for p in path.split("/") if p]:
            row = c.execute(
                "SELECT ino FROM dentries WHERE parent=? AND name=?", (ino, path_bytes(part))
            ).fetchone()
            if row is None:
                return None
            ino = int(row[0])
        try:
            return self._get_inode(c, ino)
        except CkptfsError:
            return None

    def resolve(self, path: str) -> Inode | None:
        with self._reading() as c:
            return self._resolve(c, path)

    def list_names(self, ino: int) -> list[str]:
        with self._reading() as c:
            rows = c.execute("SELECT name FROM dentries WHERE parent=? ORDER BY id", (ino,)).fetchall()
        return [bytes(r[0]).decode(errors="surrogateescape") for r in rows]

    def checkpoint_begin(
        self, root: str, framework: str, step: int | None, t_ns: int, *,
        keep_newer_commit: bool = False,
    ) -> bool:
        def body(c: Conn) -> bool:
            row = c.execute("SELECT state, commit_ns FROM checkpoints WHERE root=?",
                            (key,)).fetchone()
            if row is not None and row[0] == CheckpointState.WRITING:
                return False
            if (keep_newer_commit and row is not None and row[0] == CheckpointState.COMMITTED
                    and row[1] is not None and int(row[1]) >= t_ns):
                return False  # a write that the commit already covers, recorded late
            c.execute(
                "INSERT INTO checkpoints (root, framework, step, state, begin_ns) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (root) DO UPDATE SET "
                "framework=excluded.framework, step=excluded.step, state=excluded.state, "
                "begin_ns=excluded.begin_ns, commit_ns=NULL, reason=NULL",
                (key, framework, step, CheckpointState.WRITING.value, t_ns),
            )
            return True

        key = path_bytes(root)

        return self._write(body)

    def checkpoint_commit(
        self, root: str, framework: str, step: int | None, t_ns: int, reason: str, *,
        audit: AuditRecord | None = None,
    ) -> None:
        def body(c: Conn) -> None:
            c.execute(
                "INSERT INTO checkpoints (root, framework, step, state, begin_ns, commit_ns, reason) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (root) DO UPDATE SET "
                "framework=excluded.framework, step=coalesce(excluded.step, checkpoints.step), "
                "state=excluded.state, begin_ns=coalesce(checkpoints.begin_ns, excluded.begin_ns), "
                "commit_ns=excluded.commit_ns, reason=excluded.reason",
                (path_bytes(root), framework, step, CheckpointState.COMMITTED.value, t_ns, t_ns,
                 readable(reason)),
            )
            self._audit_in(c, audit, lambda: root, framework=framework, step=step, reason=reason)

        self._write(body, touch=True)

    def checkpoint_set_state(
        self, root: str, state: CheckpointState | str, reason: str | None = None, *,
        only_from: CheckpointState | None = None, audit: AuditRecord | None = None,
    ) -> bool:
        try:
            st = CheckpointState(state)
        except ValueError:
            raise InvalidArgument(f"checkpoint state {state!r}") from None

        def body(c: Conn) -> bool:
            if only_from is None:
                done = bool(c.execute(
                    "UPDATE checkpoints SET state=?, reason=coalesce(?, reason) WHERE root=?",
                    (st.value, text, key),
                ).rowcount)
            else:
                done = bool(c.execute(
                    "UPDATE checkpoints SET state=?, reason=coalesce(?, reason) "
                    "WHERE root=? AND state=?",
                    (st.value, text, key, CheckpointState(only_from).value),
                ).rowcount)
            if done:
                self._audit_in(c, audit, lambda: root, state=st.value, reason=reason)
            return done

        key, text = path_bytes(root), None if reason is None else readable(reason)

        return self._write(body, touch=True)

    def checkpoint_leftover(self, root: str, digests: list[bytes]) -> None:
        left = json.dumps([d.hex() for d in digests]) if digests else None

        def body(c: Conn) -> None:
            c.execute("UPDATE checkpoints SET leftover=? WHERE root=?", (left, path_bytes(root)))

        self._write(body)

    def expired_leftovers(self) -> dict[str, list[bytes]]:
        with self._reading() as c:
            rows = c.execute(
                "SELECT root, leftover FROM checkpoints WHERE state=? AND leftover IS NOT NULL",
                (CheckpointState.EXPIRED.value,),
            ).fetchall()
        return {path_str(r): [bytes.fromhex(h) for h in json.loads(v)] for r, v in rows}

    def checkpoint_tag(self, root: str, tag: str, *, audit: AuditRecord | None = None) -> bool:
        def body(c: Conn) -> bool:
            row = c.execute("SELECT tags FROM checkpoints WHERE root=?", (key,)).fetchone()
            if row is None:
                return False
            tags = {t for t in str(row[0]).split(",") if t} | {readable(tag)}
            c.execute("UPDATE checkpoints SET tags=? WHERE root=?", (",".join(sorted(tags)), key))
            self._audit_in(c, audit, lambda: root, tag=tag)
            return True

        key = path_bytes(root)

        return self._write(body, touch=True)

    def checkpoint_rows(self, under: str = "/") -> list[CheckpointRow]:
        # Roots are bytes (ckptfs/names.py): "under" compares the leading bytes, no pattern.
        prefix = path_bytes(under.rstrip("/")) + b"/"
        rows = self._query(
            "SELECT id, root, framework, step, state, begin_ns, commit_ns, reason, tags "
            "FROM checkpoints WHERE root = ? OR substr(root, 1, ?) = ? ORDER BY id",
            (prefix[:-1] or b"/", len(prefix), prefix),
        )
        return [
            CheckpointRow(int(i), path_str(root), str(fw), None if step is None else int(step),
                          CheckpointState(state), None if b is None else int(b),
                          None if cm is None else int(cm), None if why is None else str(why),
                          str(tags))
            for i, root, fw, step, state, b, cm, why, tags in rows
        ]

    def rename_checkpoints(self, old: str, new: str) -> None:
        under = "SELECT id, root FROM checkpoints WHERE root = ? OR substr(root, 1, ?) = ?"
        # Most renames (a file's, in a save or a rotation) move no checkpoint: a read
        # answers that, without a write transaction per renamed file. A row recorded
        # after this read is as late as one recorded after the transaction would be.
        src, dst = path_bytes(old), path_bytes(new)  # roots are bytes (ckptfs/names.py)
        args = (src, len(src) + 1, src + b"/")
        if not self._query(under, args):
            return

        def body(c: Conn) -> None:
            for cid, root in c.execute(under, args).fetchall():
                moved = dst + bytes(root)[len(src):]
                c.execute("DELETE FROM checkpoints WHERE root=? AND id<>?", (moved, cid))
                c.execute("UPDATE checkpoints SET root=? WHERE id=?", (moved, cid))

        self._write(body)

    # -- retention ---------------------------------------------------------------------------

    def _files_under(self, c: Conn, root: str) -> list[Inode]:
        top = self._resolve(c, root)
        out: list[Inode] = []
        stack = [] if top is None else [top]
        while stack:
            inode = stack.pop()
            if stat.S_ISDIR(inode.mode):
                for r in c.execute("SELECT ino FROM dentries WHERE parent=?", (inode.ino,)).fetchall():
                    stack.append(self._get_inode(c, int(r[0])))
            elif stat.S_ISREG(inode.mode):
                out.append(inode)
        return out

    def files_under(self, root: str) -> list[Inode]:
        with self._reading() as c:
            return self._files_under(c, root)

    def digests_under(self, roots: Iterable[str]) -> dict[bytes, int]:
        out: dict[bytes, int] = {}
        with self._reading() as c:
            for root in roots:
                for inode in self._files_under(c, root):
                    for d, n in c.execute(
                        "SELECT digest, length FROM extents WHERE ino=?", (inode.ino,)
                    ).fetchall():
                        out[bytes(d)] = int(n)
        return out

    def drop_upload_jobs(self, digests: Iterable[bytes], tier: str | None = None) -> int:
        todo = set(digests)

        def body(c: Conn) -> int:
            if tier is not None:
                return sum(c.execute("DELETE FROM upload_jobs WHERE digest=? AND tier=?",
                                     (d, tier)).rowcount for d in todo)
            return sum(c.execute("DELETE FROM upload_jobs WHERE digest=?", (d,)).rowcount for d in todo)

        return self._write(body)

    # -- fsck --------------------------------------------------------------------------------

    def replica_keys(self, tier: str) -> set[bytes]:
        with self._reading() as c:
            return {bytes(r[0]) for r in c.execute("SELECT digest FROM replicas WHERE tier=?", (tier,))}

    def replica_keys_all(self) -> set[bytes]:
        with self._reading() as c:
            rows = c.execute("SELECT digest FROM chunks UNION SELECT digest FROM replicas")
            return {bytes(r[0]) for r in rows}

    def referenced_digests(self) -> set[bytes]:
        with self._reading() as c:
            return {bytes(r[0]) for r in c.execute("SELECT DISTINCT digest FROM extents")}

    def all_extents(self) -> list[tuple[int, int, bytes, int]]:
        with self._reading() as c:
            return [
                (int(a), int(b), bytes(d), int(n))
                for a, b, d, n in c.execute("SELECT ino, idx, digest, length FROM extents")
            ]

    def remove_replica(self, digest: bytes, tier: str) -> None:
        def body(c: Conn) -> None:
            c.execute("DELETE FROM replicas WHERE digest=? AND tier=?", (digest, tier))

        self._write(body)

    def add_replica(self, digest: bytes, tier: str, length: int) -> None:
        def body(c: Conn) -> None:
            c.execute(_KNOWN_CHUNK, (digest, length))
            c.execute(_VALID_REPLICA, (digest, tier))

        self._write(body)

    def dangling_dentries(self) -> list[tuple[int, bytes, int]]:
        with self._reading() as c:
            return [
                (int(p), bytes(n), int(i))
                for p, n, i in c.execute(
                    "SELECT parent, name, ino FROM dentries d WHERE NOT EXISTS "
                    "(SELECT 1 FROM inodes i WHERE i.ino = d.ino)"
                )
            ]

    @staticmethod
    def _path_of(c: Conn, ino: int) -> str:
        """The path of ``ino`` (one of its names if it has several), in one statement
        whatever its depth; ``<unlinked>/...`` from where the chain of names ends."""
        if ino == ROOT_INODE:
            return "/"
        return _path_from(c.execute(_PATH_UP, (ino, ROOT_INODE, _MAX_DEPTH)).fetchall())

    def path_of(self, ino: int) -> str:
        # One statement, so one snapshot without a read transaction around it.
        if ino == ROOT_INODE:
            return "/"
        return _path_from(self._query(_PATH_UP, (ino, ROOT_INODE, _MAX_DEPTH)))
