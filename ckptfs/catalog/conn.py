"""Connections, cursors and transactions: what every role's SQL (namespace.py, contents.py,
uploads.py, ... assembled as sql.SqlCatalog) stands on, and what an engine (sqlite.py,
postgres.py) provides.

A method that changes something hands its body (a function of a ``Conn``) to ``_write``;
the engine runs it in one write transaction (``_transaction``: SQLite ``BEGIN IMMEDIATE``;
PostgreSQL SERIALIZABLE, and the body runs again after a serialization failure, so a body
does nothing but SQL and returns its result). A read of several statements takes one
connection (``with self._reading() as c``), so it sees one state; a read of one statement
asks ``_query``. After a transaction that changed the namespace or file contents
(``touch``), ``_write`` calls the hooks' ``on_touch`` (hooks.py: given when the catalog is
opened).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .hooks import CatalogHooks

__all__ = ["IN_BATCH", "SQLITE_NOW_NS", "Conn", "Cursor", "SqlBase"]

T = TypeVar("T")

# Values in one ``IN (...)`` list per statement (well below every engine's limit of bound
# parameters).
IN_BATCH = 500

# SQLite's clock in ns since the epoch (julianday has sub-millisecond precision).
SQLITE_NOW_NS = "CAST((julianday('now') - 2440587.5) * 86400000000000.0 AS INTEGER)"


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
    """One connection inside one transaction; statements in the portable SQL of the
    catalog's modules (``?`` placeholders), which the engine translates."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Cursor:
        ...


class SqlBase:
    """Transactions and reads on an engine's connections, and the hooks it calls back."""

    path: Path
    # How many transactions may run at once (the daemon sizes its catalog limiter by it).
    concurrency: int = 1
    shared: bool = False  # several nodes may use it (PostgreSQL)
    # Errors of a read-only catalog of an older schema that lacks a table.
    _missing_table: tuple[type[Exception], ...] = ()
    # The database's clock in ns since the epoch, an SQL expression (node sessions'
    # expiries, wants: nodes' clocks differ).
    _now_ns_sql: str = SQLITE_NOW_NS

    def __init__(self, hooks: CatalogHooks | None = None) -> None:
        self.hooks = hooks if hooks is not None else CatalogHooks()

    # Until the daemon gives its hooks when it opens the catalog (issue 34), a caller may
    # still set them as attributes: each replaces that field of ``hooks``.
    @property
    def on_touch(self) -> Callable[[], None] | None:
        return self.hooks.on_touch

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
        if touch:
            self._fire_touch()
        return result

    def _fire_touch(self) -> None:
        """A committed transaction changed the namespace or file contents: tell the hook
        (the uploader's wake for its snapshot)."""
        touched = self.hooks.on_touch
        if touched is not None:
            touched()

    def _after_commit(self, c: Conn, sql: str, values: Sequence[int]) -> None:
        """Run ``sql`` (``?`` for each of ``values``) for a change that need not be atomic
        with its transaction: here, in it; PostgreSQL runs it right after the commit."""
        c.execute(sql, values)

    def _db_now(self, c: Conn) -> int:
        """The database's clock, in the caller's transaction."""
        return int(c.execute(f"SELECT {self._now_ns_sql}").fetchone()[0])
