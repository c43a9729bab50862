"""The SQLite catalog engine (WAL): one file, one connection, one transaction at a time.

``SqliteCatalog`` is the logic of sql.py on one sqlite3 connection. Only one thread at a
time uses it (the VFS runs it through a limiter of ``concurrency`` = 1), so the connection
is shared across worker threads with ``check_same_thread=False``; a read runs on it without
a transaction of its own (SQLite's statements each see one committed state, and no write
runs meanwhile).

Durability: commits use ``synchronous=NORMAL`` (safe against a killed daemon, since the WAL
is in the page cache); ``synced=True`` commits (fsync, fsyncdir) switch to FULL for that
transaction, which also syncs every earlier commit. ``BEGIN IMMEDIATE`` takes the write
lock up front, so a write transaction never conflicts and never runs twice.

Also here: the schema's creation and migration (``PRAGMA table_info`` and a table rebuild:
SQLite cannot add a CHECK to a table), read-only opens (``file:...?mode=ro``), the
snapshot (the online backup API), and ``catalog_file`` (a SQLite catalog file built from
rows: every engine's snapshot).
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ..errors import InvalidArgument
from .checks import CHECKS_INDEX
from .hooks import CatalogHooks
from .schema import (
    CHECKPOINT_STATES,
    MARK_CHANGED,
    SCHEMA,
    SCHEMA_VERSION,
    SEQUENCES,
    TABLES,
    checkpoints_ddl,
    init_rows,
    newer_schema,
)
from .sql import SqlCatalog

__all__ = ["SqliteCatalog", "catalog_file", "read_recorded_tiers"]

T = TypeVar("T")


def _migrate(c: sqlite3.Connection, version: int) -> None:
    """Bring a catalog of an older schema version up to SCHEMA_VERSION, in the caller's
    transaction (tables new in a version are made by SCHEMA's CREATE IF NOT EXISTS)."""
    if version < 2:
        cols = {str(r[1]) for r in c.execute("PRAGMA table_info(inodes)")}
        if "rdev" not in cols:
            c.execute("ALTER TABLE inodes ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0")
    if version < 9:
        _rebuild_checkpoints(c)
    if version < 10:  # replicas.checked_ns (the scrubber's, checks.py)
        if "checked_ns" not in {str(r[1]) for r in c.execute("PRAGMA table_info(replicas)")}:
            c.execute("ALTER TABLE replicas ADD COLUMN checked_ns INTEGER NOT NULL DEFAULT 0")
        c.execute(CHECKS_INDEX)
    # 4: the sessions tables, 5: chunk_wants, 6: ns_usage and ns_files (namespaces are
    # counted at the first mount that declares them), audit_log and namespace_keys, 7:
    # chunk_moves, 8: deletion_claims (9: the checkpoints table rebuilt above), 11: drills;
    # SCHEMA's CREATE IF NOT EXISTS has made them.
    c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))


def _rebuild_checkpoints(c: sqlite3.Connection) -> None:
    """Schema 3: checkpoints.state gets its CHECK; schema 9: checkpoints.root holds the
    bytes of the path (ckptfs/names.py: any name, UTF-8 or not). SQLite cannot change a column or
    add a constraint, so the table is rebuilt under the same name with the same rows, ids
    and AUTOINCREMENT sequence (ids are never reused: the metrics remember them)."""
    seq = c.execute("SELECT seq FROM sqlite_sequence WHERE name='checkpoints'").fetchone()
    bad = c.execute(
        f"SELECT root, state FROM checkpoints WHERE state NOT IN ({CHECKPOINT_STATES}) LIMIT 1"
    ).fetchone()
    if bad is not None:
        raise InvalidArgument(f"catalog: checkpoint {bad[0]} has an unknown state {bad[1]!r}")
    c.execute(checkpoints_ddl("checkpoints_v3"))
    c.execute("INSERT INTO checkpoints_v3 (id, root, framework, step, state, begin_ns, commit_ns, "
              "reason, tags, leftover) SELECT id, CAST(root AS BLOB), framework, step, state, begin_ns, "
              "commit_ns, reason, tags, leftover FROM checkpoints")
    c.execute("DROP TABLE checkpoints")
    c.execute("ALTER TABLE checkpoints_v3 RENAME TO checkpoints")
    if seq is not None:
        _set_sequence(c, "checkpoints", int(seq[0]))


def _set_sequence(c: sqlite3.Connection, table: str, seq: int) -> None:
    """Make AUTOINCREMENT of ``table`` continue after ``seq`` (or after its largest key)."""
    c.execute("UPDATE sqlite_sequence SET seq=max(seq, ?) WHERE name=?", (seq, table))
    if not c.execute("SELECT 1 FROM sqlite_sequence WHERE name=?", (table,)).fetchone():
        c.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table, seq))


def read_recorded_tiers(path: Path) -> list[dict[str, Any]] | None:
    """The tier records (meta ``tiers``) of the catalog file at ``path``, opened read-only
    and closed again; None if there is no such catalog or it cannot be read (recorded.py
    asks before a daemon, maybe a running one, opens it)."""
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='tiers'").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return None if row is None else list(json.loads(row[0]))


class _Shared:
    """A read's connection: the catalog's one (a context manager that does nothing, so a
    read costs what it did before reads took a connection)."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None


class SqliteCatalog(SqlCatalog):
    concurrency = 1
    _missing_table = (sqlite3.OperationalError,)

    def __init__(self, path: Path, readonly: bool = False, *,
                 hooks: CatalogHooks | None = None) -> None:
        """``readonly`` opens a live catalog beside its daemon (status, sync) without
        touching it; WAL lets the reader see every committed transaction. ``hooks``: what
        it calls back (hooks.py)."""
        super().__init__(hooks)
        self.path = path
        if readonly:
            self.conn = sqlite3.connect(
                f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
            self._shared = _Shared(self.conn)
            return
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._shared = _Shared(self.conn)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA foreign_keys=OFF")
        self._init_schema()

    def close(self) -> None:
        self.conn.close()

    # -- transactions ------------------------------------------------------------------------

    def _reading(self) -> _Shared:
        return self._shared

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.conn.execute(sql, params).fetchall()

    def _transaction(self, body: Callable[[sqlite3.Connection], T], synced: bool,
                     touch: bool = False) -> T:
        conn = self.conn
        if synced:
            conn.execute("PRAGMA synchronous=FULL")
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = body(conn)
                if touch:
                    conn.execute(MARK_CHANGED, (str(time.time_ns()),))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result
        finally:
            if synced:
                conn.execute("PRAGMA synchronous=NORMAL")

    def _init_schema(self) -> None:
        self.conn.executescript(SCHEMA)  # idempotent; executescript manages its own transaction

        def body(c: sqlite3.Connection) -> None:
            row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                init_rows(c)
            elif int(row[0]) < SCHEMA_VERSION:
                _migrate(c, int(row[0]))
            elif int(row[0]) != SCHEMA_VERSION:
                raise newer_schema(str(self.path), int(row[0]))

        self._transaction(body, False)

    # -- the snapshot ------------------------------------------------------------------------

    def backup_bytes(self) -> bytes:
        """A consistent copy of the whole catalog (SQLite online backup)."""
        with tempfile.TemporaryDirectory() as d:
            dest = sqlite3.connect(Path(d) / "snap.sqlite")
            try:
                self.conn.backup(dest)
            finally:
                dest.close()
            return (Path(d) / "snap.sqlite").read_bytes()


def catalog_file(rows: Mapping[str, Iterable[Sequence[Any]]], sequences: Mapping[str, int]) -> bytes:
    """A SQLite catalog file (this schema) holding ``rows`` (table -> rows in TABLES'
    column order), whose sequences continue after ``sequences`` (table -> last key
    handed out): another engine's snapshot, restorable as a SqliteCatalog."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "snap.sqlite"
        cat = SqliteCatalog(path)
        try:
            def body(c: sqlite3.Connection) -> None:
                for table, cols in TABLES.items():
                    c.execute(f"DELETE FROM {table}")  # the new file's own root and meta
                    c.executemany(
                        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                        rows.get(table, ()),
                    )
                for table in SEQUENCES:
                    _set_sequence(c, table, int(sequences.get(table, 0)))

            cat._transaction(body, True)
        finally:
            cat.close()
        return path.read_bytes()
