"""The PostgreSQL catalog engine: one catalog shared by several nodes (issue 14).

``PostgresCatalog(url)`` is the logic of sql.py on a pool of psycopg 3 connections
(``concurrency`` = the pool size: that many transactions run at once, each on a connection
of its own, never shared between threads).

* Writes run SERIALIZABLE. A serialization failure, a deadlock, or a unique violation of
  the dentries key (a concurrent create of the same name) rolls the transaction back and
  runs its body again after a jittered backoff (up to MAX_ATTEMPTS times); the rerun sees
  the other transaction's rows, so a lost race on a name becomes EEXIST.
* Reads of several statements run REPEATABLE READ READ ONLY: they see one snapshot. A
  read of one statement (``_query``: getattr, lookup, readdir, extents) runs alone in
  autocommit, one round trip.
* ``synced`` needs nothing: a PostgreSQL commit is durable (``synchronous_commit``).
* A server that cannot be reached fails the call with CatalogUnavailable (EIO) within
  CONNECT_TIMEOUT / POOL_WAIT seconds, and while it stays unreachable every further call
  within DOWN_WAIT; a pooled connection the server dropped (a restart)
  is noticed at the transaction's BEGIN and replaced.
* Every statement is a round trip (``counts``): psycopg's pipeline mode was measured and
  not kept (docs/performance.md, "Several nodes").
* The schema is schema.SCHEMA translated (BIGINT, BYTEA, identity columns), created by the
  first opener of an empty database under a transaction-level advisory lock; meta
  ``schema_version`` is checked like SQLite's, and MIGRATIONS holds a step per version.
* ``try_exclusive`` (the retention pass, one node at a time): a session-level advisory
  lock on a connection of its own, outside the pool, held across the pass's transactions
  and freed by PostgreSQL when that connection ends (a node that dies frees it).
* ``backup_bytes`` (the snapshot the uploader stores on the remotes) is a SQLite catalog
  file of the same rows (sqlite.catalog_file), read in one snapshot: a bucket restore
  brings it back as a SqliteCatalog.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool, PoolTimeout

from ..errors import CatalogUnavailable, InvalidArgument, NotFound, NotPermitted
from .audit import AUDIT_DDL, AUDIT_PENDING_DDL, chain_pending
from .checks import CHECKS_INDEX
from .claims import CLAIMS_DDL
from .conn import Conn, Cursor
from .contents import put_extent
from .deletion_events import DELETIONS_CHANNEL, HELD_CHANNEL
from .drills import DRILLS_DDL
from .hooks import CatalogHooks
from .keys import KEYS_DDL
from .moves import MOVES_DDL
from .pglisten import PgListener
from .protocols import ExclusiveLock
from .quotas import QUOTAS_DDL
from .rows import ChunkRef
from .schema import SCHEMA, SCHEMA_VERSION, SEQUENCES, TABLES, init_rows, newer_schema
from .sessions import SESSIONS_DDL
from .sql import SqlCatalog
from .sqlite import catalog_file
from .uploads import wanted_on
from .wants import WANTS_CHANNEL, WANTS_DDL

__all__ = ["CONNECT_TIMEOUT", "Counts", "MAX_ATTEMPTS", "MIGRATIONS", "POOL_WAIT", "PostgresCatalog",
           "pg_schema", "translate"]

T = TypeVar("T")
log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 3  # s, per connection attempt: a dead server fails calls, never hangs them
POOL_WAIT = 5.0  # s a transaction waits for a free (or new) pooled connection
# s a call waits for a connection while the database is known unreachable (the last call
# failed to reach it): every caller waiting POOL_WAIT held a catalog slot that long, and
# the daemon's background services, taking slots too, made a file system call queue for
# several POOL_WAITs (25 s under load); a call that reaches it ends the outage.
DOWN_WAIT = 1.0
MAX_ATTEMPTS = 100  # runs of one write transaction that conflicts with others (~5 s of backoff)
_BACKOFF_FIRST, _BACKOFF_MAX = 0.002, 0.1  # s; full jitter, doubling

_CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT, "keepalives": 1, "keepalives_idle": 10,
    "keepalives_interval": 3, "keepalives_count": 3, "tcp_user_timeout": 20_000,
}

# pg_advisory_xact_lock key of the schema creation ("ckptfs" in ASCII).
_SCHEMA_LOCK = 0x636B70746673
# Unique keys whose violation means a concurrent transaction came first: the same name
# created (the rerun says EEXIST), or the same audit seq appended (the rerun appends after it).
_RERUN_KEYS = ("dentries_parent_name_key", "audit_log_pkey")

# The change mark (a write's ``touch``): meta ``changed_ns``, a statement of its own after
# the COMMIT (READ COMMITTED, never a serialization failure), not in the transaction, where
# every change on every node would write this one row and all but one of any concurrent
# changes would conflict and run again. After the COMMIT, so a snapshot that began before
# the commit (and so misses the change) is older than the mark; a failure of the mark
# loses only the mark (the next change writes it), not the change. Never backwards: the
# nodes' clocks differ a little.
_MARK_CHANGED = ("INSERT INTO meta VALUES ('changed_ns', '{}') ON CONFLICT (key) DO UPDATE SET "
                 "value = greatest(meta.value::bigint, excluded.value::bigint)::text")


def _mark_changed_sql() -> str:
    return _MARK_CHANGED.format(time.time_ns())

# A chunk of a file's new version, in one statement (``_put_extents``): its chunk row, its
# valid replica on the tier that holds it, the extent, and (``_CHUNK_JOB``) the upload job
# to one more tier unless that tier holds a valid copy, with the cancellation of the
# tier's unclaimed deletion row of the chunk when the job was made (uploads.wanted_on).
# The parts see one snapshot, not each other's rows: the job's tier is never the
# replica's (the caller checks), and the deletion reads the job's RETURNING.
_CHUNK_ROWS = (
    "WITH ch AS (INSERT INTO chunks VALUES (?, ?) ON CONFLICT (digest) DO NOTHING), "
    "rp AS (INSERT INTO replicas (digest, tier, state, checked_ns) VALUES (?, ?, 'valid', ?) "
    "ON CONFLICT (digest, tier) DO UPDATE SET state='valid', checked_ns=CASE WHEN "
    "replicas.state='valid' THEN replicas.checked_ns ELSE excluded.checked_ns END), "
    "ex AS (INSERT INTO extents VALUES (?, ?, ?, ?) ON CONFLICT (ino, idx) DO UPDATE SET "
    "digest=excluded.digest, length=excluded.length)")
_CHUNK_JOB = (
    ", job AS (INSERT INTO upload_jobs (digest, tier, length, enqueued_ns) SELECT ?, ?, ?, ? "
    "WHERE NOT EXISTS (SELECT 1 FROM replicas WHERE digest=? AND tier=? AND state='valid') "
    "ON CONFLICT DO NOTHING RETURNING 1), "
    "gone AS (DELETE FROM deletions WHERE tier=? AND next_try_ns>=0 AND digest=? "
    "AND EXISTS (SELECT 1 FROM job) RETURNING 1) "
    "SELECT (SELECT count(*) FROM job), (SELECT count(*) FROM gone)")

_BEGIN_WRITE = "BEGIN ISOLATION LEVEL SERIALIZABLE"
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"

# pg_try_advisory_xact_lock key of the cleanup of expired node sessions ("ckptss").
_SESSIONS_LOCK = 0x636B70747373
# pg_advisory_xact_lock key of chaining the pending audit records ("ckptau"): one node at a time.
_AUDIT_LOCK = 0x636B70746175


def _run_ddl(c: Conn, ddl: str) -> None:
    """SQLite DDL of schema.py, translated, one statement at a time (a migration step)."""
    for stmt in pg_ddl(ddl).split(";"):
        body = "\n".join(ln for ln in stmt.splitlines() if not ln.strip().startswith("--"))
        if body.strip():
            c.execute(body)


def _add_sessions(c: Conn) -> None:
    """Schema 4: the node sessions' tables (sessions.SESSIONS_DDL)."""
    _run_ddl(c, SESSIONS_DDL)


def _add_wants(c: Conn) -> None:
    """Schema 5: chunk_wants (wants.WANTS_DDL)."""
    _run_ddl(c, WANTS_DDL)


def _add_governance(c: Conn) -> None:
    """Schema 6: ns_usage and ns_files (quotas.QUOTAS_DDL; namespaces are counted at the
    first mount that declares them), audit_log (audit.AUDIT_DDL) and namespace_keys
    (keys.KEYS_DDL)."""
    _run_ddl(c, QUOTAS_DDL)
    _run_ddl(c, AUDIT_DDL)
    _run_ddl(c, KEYS_DDL)


def _add_moves(c: Conn) -> None:
    """Schema 7: chunk_moves (moves.MOVES_DDL)."""
    _run_ddl(c, MOVES_DDL)


def _add_claims(c: Conn) -> None:
    """Schema 8: deletion_claims (claims.CLAIMS_DDL)."""
    _run_ddl(c, CLAIMS_DDL)


def _roots_as_bytes(c: Conn) -> None:
    """Schema 9: checkpoints.root holds the bytes of the path (ckptfs/names.py: any name)."""
    kind = c.execute("SELECT data_type FROM information_schema.columns WHERE "
                     "table_schema = current_schema() AND table_name = 'checkpoints' "
                     "AND column_name = 'root'").fetchone()
    if kind is not None and str(kind[0]) != "bytea":
        c.execute("ALTER TABLE checkpoints ALTER COLUMN root TYPE BYTEA "
                  "USING convert_to(root, 'UTF8')")


def _add_replica_checks(c: Conn) -> None:
    """Schema 10: replicas.checked_ns, the scrubber's last check of each copy, and its
    index (checks.py)."""
    c.execute("ALTER TABLE replicas ADD COLUMN IF NOT EXISTS checked_ns BIGINT NOT NULL DEFAULT 0")
    c.execute(CHECKS_INDEX)


def _add_drills(c: Conn) -> None:
    """Schema 11: drills (drills.DRILLS_DDL)."""
    _run_ddl(c, DRILLS_DDL)


# Steps from schema version v to v + 1, each in the opener's transaction. The PostgreSQL
# schema starts at version 3 (the first with this engine).
MIGRATIONS: dict[int, Callable[[Conn], None]] = {
    3: _add_sessions, 4: _add_wants, 5: _add_governance, 6: _add_moves, 7: _add_claims,
    8: _roots_as_bytes, 9: _add_replica_checks, 10: _add_drills,
}

_GROUP_CONCAT = re.compile(r"group_concat\(([^()]*)\)")


@lru_cache(maxsize=4096)
def translate(sql: str) -> str:
    """The catalog's portable SQL as PostgreSQL takes it (``%s`` placeholders, ``string_agg``);
    once per statement text."""
    out = sql.replace("%", "%%").replace("?", "%s")
    return _GROUP_CONCAT.sub(r"string_agg(\1, ',')", out)


def pg_schema() -> str:
    """schema.SCHEMA in PostgreSQL's DDL: the same tables, columns and keys."""
    return pg_ddl(SCHEMA)


def pg_ddl(ddl: str) -> str:
    """SQLite DDL of schema.py in PostgreSQL's."""
    ddl = ddl.replace("INTEGER PRIMARY KEY AUTOINCREMENT",
                         "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
    ddl = re.sub(r"\bINTEGER\b", "BIGINT", ddl)
    ddl = re.sub(r"\bBLOB\b", "BYTEA", ddl)
    return ddl.replace(" WITHOUT ROWID", "")


class Counts:
    """What the engine sent (for tests that pin the cost of a request, and benchmarks):
    statements (the bodies' and the reads', not BEGIN, COMMIT, the change mark), round
    trips (waits for the server's answers) and write transactions (runs: a rerun counts).
    Counted without a lock: exact while one thread uses the catalog, close otherwise."""

    __slots__ = ("round_trips", "statements", "transactions")

    def __init__(self) -> None:
        self.statements = self.round_trips = self.transactions = 0


class _PgConn:
    """A pooled connection in one transaction, taking the catalog's portable statements
    (prepared by psycopg at their 5th use on a connection). ``later``: statements (literal
    SQL) to run right after the COMMIT, in its round trip (``_after_commit``)."""

    __slots__ = ("conn", "counts", "later")

    def __init__(self, conn: psycopg.Connection[Any], counts: Counts) -> None:
        self.conn, self.counts = conn, counts
        self.later: list[str] = []

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Cursor:
        self.counts.statements += 1
        self.counts.round_trips += 1
        return self.conn.execute(translate(sql), tuple(params))


def _backoff(attempt: int) -> float:
    return random.uniform(0, min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** attempt))


def describe(url: str) -> str:
    """The database of ``url`` for messages: name and host, never the password."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.ProgrammingError as e:
        raise InvalidArgument(f"catalog URL: {e}") from None
    host = str(info.get("host") or "localhost")
    port = f":{info['port']}" if info.get("port") else ""
    return f"PostgreSQL database {info.get('dbname') or '?'} on {host}{port}"


def lock_key(name: str) -> int:
    """The advisory lock key (a signed 64-bit integer) of the cluster-wide lock ``name``."""
    digest = hashlib.blake2b(b"ckptfs lock " + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class _AdvisoryLock:
    """A session-level advisory lock on a connection of its own (not a pooled one: the
    lock lives as long as its connection, across any number of pooled transactions)."""

    def __init__(self, conn: psycopg.Connection[Any], key: int) -> None:
        self.conn = conn
        self.key = key

    def held(self) -> bool:
        try:
            self.conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False  # the connection is gone, and the lock with it

    def release(self) -> None:
        # The server frees a session's advisory locks when its connection ends: closing
        # needs no round trip (an unlock could hang on a server that stopped answering).
        self.conn.close()


class PostgresCatalog(SqlCatalog):
    def __init__(self, url: str, *, pool_size: int = 4, readonly: bool = False,
                 hooks: CatalogHooks | None = None) -> None:
        """``readonly``: reads only (status and the like beside the daemons); an empty
        database is not made a catalog. ``hooks``: what it calls back (hooks.py)."""
        super().__init__(hooks)
        self.where = describe(url)
        self.path = Path(self.where)  # the Protocol's name of the catalog (not a file)
        self.readonly = readonly
        self.concurrency = pool_size
        self.shared = True
        # Audit records are chained after their transaction (audit.py), once the table of
        # pending ones exists (a read-only open of an older catalog may lack it).
        self._audit_deferred = True
        self._pending_table = True
        # Transactions run again after a conflict (serialization failure, deadlock, a
        # concurrent create of a name): how contended the shared catalog is.
        self.conflicts = 0
        self.counts = Counts()
        self._count = threading.Lock()
        given = conninfo_to_dict(url)
        self._password = str(given.get("password") or "")
        # TCP keepalives bound a hang on a server that vanished mid-transaction (a unix
        # socket needs none); the URL's own settings win.
        conn_kwargs: dict[str, Any] = {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in given}
        conn_kwargs["autocommit"] = True
        self._url, self._conn_kwargs = url, conn_kwargs  # the want listener's and locks' connections
        # The last call could not reach the database: the next ones wait DOWN_WAIT, not
        # POOL_WAIT, for a connection (a bool: written and read whole by any thread).
        self._down = False
        # The database's clock, in ns since the epoch (node sessions' expiries).
        self._now_ns_sql = "CAST(extract(epoch FROM clock_timestamp()) * 1000000000 AS BIGINT)"
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            url, min_size=1, max_size=pool_size, open=False, timeout=POOL_WAIT,
            kwargs=conn_kwargs, name="ckptfs-catalog",
            # The pool's reconnection backs off exponentially until it gives up: give up
            # soon, so that a server back after a long outage is used at once (the next
            # transaction that waits for a connection starts a new attempt).
            reconnect_timeout=CONNECT_TIMEOUT + 1,
        )
        try:
            self._pool.open(wait=True, timeout=CONNECT_TIMEOUT + 1)
            self._init_schema()
        except PoolTimeout as e:
            self._pool.close()
            raise self._unavailable(e) from None
        except BaseException:
            self._pool.close()
            raise

    def close(self) -> None:
        self._pool.close()

    def _unavailable(self, e: BaseException) -> CatalogUnavailable:
        self._down = True
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if self._password:
            msg = msg.replace(self._password, "***")
        return CatalogUnavailable(f"catalog {self.where} unavailable: {msg}")

    # -- connections and transactions --------------------------------------------------------

    def _getconn(self) -> psycopg.Connection[Any]:
        try:
            return self._pool.getconn(timeout=DOWN_WAIT if self._down else POOL_WAIT)
        except PoolTimeout as e:
            raise self._unavailable(e) from None

    def _live(self, first: Callable[[psycopg.Connection[Any]], T]) -> tuple[psycopg.Connection[Any], T]:
        """A pooled connection, and what ``first(conn)`` returned on it; the caller puts
        the connection back. A connection the server dropped meanwhile (a restart) fails
        ``first`` before anything else ran on it: it goes back (the pool drops it) and the
        next one is tried. No connection within POOL_WAIT (DOWN_WAIT once a call found the
        database down), or a server that cannot be reached: CatalogUnavailable."""
        for stale in range(self.concurrency + 1):
            conn = self._getconn()
            try:
                got = first(conn)
                self._down = False
                return conn, got
            except (psycopg.OperationalError, psycopg.InterfaceError) as e:
                self._pool.putconn(conn)
                if not conn.broken or stale == self.concurrency:
                    raise self._unavailable(e) from None
            except BaseException:
                self._pool.putconn(conn)
                raise
        raise AssertionError("unreachable")

    @contextmanager
    def _session(self, begin: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside a transaction begun with ``begin`` (on a live
        connection: ``_live``); rolled back if the caller did not end it."""
        conn, _ = self._live(lambda c: c.execute(begin))
        self.counts.round_trips += 1
        try:
            yield conn
        finally:
            if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                with suppress(psycopg.Error):  # broken now: the pool drops it
                    conn.execute("ROLLBACK")
            self._pool.putconn(conn)

    @contextmanager
    def _reading(self) -> Iterator[Conn]:
        try:
            with self._session(_BEGIN_READ) as conn:
                yield _PgConn(conn, self.counts)
                conn.execute("COMMIT")
                self.counts.round_trips += 1
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:
            raise self._unavailable(e) from None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """One statement in autocommit (its own snapshot): one round trip, not three. On
        a connection the server dropped (a restart) the read runs again on the next."""
        text, args = translate(sql), tuple(params)
        self.counts.statements += 1
        self.counts.round_trips += 1
        conn, rows = self._live(lambda c: c.execute(text, args).fetchall())
        self._pool.putconn(conn)
        return rows

    def _transaction(self, body: Callable[[Conn], T], synced: bool, touch: bool) -> T:
        if self.readonly:
            raise NotPermitted(f"catalog {self.where} is open read-only")
        last: Exception | None = None
        for attempt in range(MAX_ATTEMPTS):
            try:
                self.counts.transactions += 1
                with self._session(_BEGIN_WRITE) as conn:
                    pc = _PgConn(conn, self.counts)
                    result = body(pc)
                    self._commit(conn, pc.later + ([_mark_changed_sql()] if touch else []))
                return result
            except (pgerrors.SerializationFailure, pgerrors.DeadlockDetected) as e:
                last = e
            except pgerrors.UniqueViolation as e:
                if e.diag.constraint_name not in _RERUN_KEYS:
                    raise
                last = e
            except (psycopg.OperationalError, psycopg.InterfaceError) as e:
                raise self._unavailable(e) from None
            with self._count:
                self.conflicts += 1
            log.debug("catalog %s: transaction runs again (%d): %s", self.where, attempt + 1,
                      str(last).splitlines()[0])
            time.sleep(_backoff(attempt))
        raise CatalogUnavailable(
            f"catalog {self.where}: a transaction conflicted {MAX_ATTEMPTS} times: {last}")

    def _commit(self, conn: psycopg.Connection[Any], after: list[str]) -> None:
        """COMMIT, and the statements ``after`` it (the change mark, a directory's times)
        in the same round trip: one simple query, whose statements after the COMMIT run
        in a READ COMMITTED transaction of their own (whatever the server's default),
        only if the COMMIT succeeded. A COMMIT fails only by a serialization failure (no
        deferred constraints) or a lost connection, both raised (the first runs the body
        again); a READ COMMITTED statement never fails by a serialization failure, so any
        other error is theirs, and loses only them (the caller's ``_session`` rolls their
        transaction back)."""
        self.counts.round_trips += 1
        if not after:
            conn.execute("COMMIT")
            return
        try:
            conn.execute("; ".join(["COMMIT", "BEGIN ISOLATION LEVEL READ COMMITTED", *after,
                                    "COMMIT"]))
        except (pgerrors.SerializationFailure, psycopg.OperationalError, psycopg.InterfaceError):
            raise
        except psycopg.Error as e:
            log.warning("catalog %s: after a commit, %s not written: %s", self.where,
                        "; ".join(after), str(e).splitlines()[0])

    def _after_commit(self, c: Conn, sql: str, values: Sequence[int]) -> None:
        """``sql`` (``?`` for each of the integers ``values``) right after the commit, not
        in the transaction (``_commit``): a write that conflicts with every concurrent
        change and need not be atomic with them (a directory's times)."""
        assert isinstance(c, _PgConn)
        c.later.append(sql.replace("?", "{}").format(*(int(v) for v in values)))

    def _put_extents(self, c: Conn, ino: int, n_chunks: int, changes: dict[int, ChunkRef | None],
                     queued: dict[bytes, list[str]], enqueued_ns: int) -> int:
        """contents.py's, with a chunk held on one tier and queued to at most one other
        (a file's commit on a node: its local tier, the remote) in one statement
        (_CHUNK_ROWS), not five; any other chunk as there."""
        cancelled = 0
        for idx, ref in changes.items():
            if idx >= n_chunks or ref is None:
                continue
            to = queued.get(ref.digest, [])
            if len(ref.tiers) != 1 or len(to) > 1 or set(to) & set(ref.tiers):
                for tier in put_extent(c, ino, idx, ref, to, enqueued_ns):
                    cancelled += wanted_on(c, tier, [ref.digest])
                continue
            d, n = ref.digest, ref.length
            # the replica was written verified: its first check (scrub, checks.py)
            args: tuple[Any, ...] = (d, n, d, ref.tiers[0], time.time_ns(), ino, idx, d, n)
            if not to:
                c.execute(_CHUNK_ROWS + " SELECT 0, 0", args)
                continue
            row = c.execute(_CHUNK_ROWS + _CHUNK_JOB,
                            (*args, d, to[0], n, enqueued_ns, d, to[0], to[0], d)).fetchone()
            cancelled += int(row[1])
        return cancelled

    def _audit_chain(self) -> int:
        """Chain the pending audit records (audit.chain_pending) in a transaction of their
        own, READ COMMITTED under a transaction-level advisory lock: the chainers of all
        nodes take turns, each seeing the last one's head (no serialization failure, no
        rerun), and the writers, which only insert pending rows, never wait for it. A
        read-only open chains too (a record is no change of the file system), except where
        the server refuses writes (a standby): then the log reads without them."""
        if not self._pending_table or not self._query("SELECT EXISTS (SELECT 1 FROM audit_pending)")[0][0]:
            return 0
        try:
            with self._session("BEGIN ISOLATION LEVEL READ COMMITTED") as conn:
                c = _PgConn(conn, self.counts)
                c.execute("SELECT pg_advisory_xact_lock(?)", (_AUDIT_LOCK,))
                moved = chain_pending(c)
                conn.execute("COMMIT")
                self.counts.round_trips += 1
        except (pgerrors.ReadOnlySqlTransaction, pgerrors.InsufficientPrivilege) as e:
            log.debug("catalog %s: audit records not chained: %s", self.where, e)
            return 0
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:
            raise self._unavailable(e) from None
        except psycopg.Error as e:  # they stay pending: the next flush or read tries again
            log.warning("catalog %s: audit records not chained: %s", self.where,
                        str(e).splitlines()[0])
            return 0
        return moved

    def _cleanup_lock(self, c: Conn) -> bool:
        """One node at a time cleans up expired sessions; the lock ends with the transaction."""
        return bool(c.execute("SELECT pg_try_advisory_xact_lock(?)", (_SESSIONS_LOCK,)).fetchone()[0])

    # -- wants (wants.py) -------------------------------------------------------------------

    def _notify_wants(self, c: Conn) -> None:
        """Delivered to every listening node when this transaction commits (not at all
        if it rolls back and runs again: then its rerun notifies)."""
        c.execute(f"NOTIFY {WANTS_CHANNEL}")

    def listen_wants(self) -> PgListener:
        return PgListener(self._url, self._conn_kwargs, WANTS_CHANNEL, self._unavailable)

    # -- the deletion queue's events (deletion_events.py) ----------------------------------
    # PostgreSQL folds identical notifications of one transaction into one; the SQL sends
    # each at most once per transaction anyway (one round trip, not one per row).

    def _notify_deletions(self, c: Conn) -> None:
        c.execute(f"NOTIFY {DELETIONS_CHANNEL}")

    def _notify_held(self, c: Conn) -> None:
        c.execute(f"NOTIFY {HELD_CHANNEL}")

    def listen_deletions(self) -> PgListener:
        return PgListener(self._url, self._conn_kwargs, DELETIONS_CHANNEL, self._unavailable)

    def listen_held_uploads(self) -> PgListener:
        return PgListener(self._url, self._conn_kwargs, HELD_CHANNEL, self._unavailable)

    def try_exclusive(self, name: str) -> ExclusiveLock | None:
        """The cluster-wide lock ``name`` (pg_try_advisory_lock on a connection of its
        own), or None if another connection holds it. CatalogUnavailable if the database
        cannot be reached."""
        key = lock_key(name)
        try:
            conn = psycopg.connect(self._url, **self._conn_kwargs)
        except psycopg.Error as e:
            raise self._unavailable(e) from None
        try:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            got = bool(row and row[0])
        except psycopg.Error as e:
            conn.close()
            raise self._unavailable(e) from None
        if not got:
            conn.close()
            return None
        return _AdvisoryLock(conn, key)

    # -- the schema --------------------------------------------------------------------------

    def _init_schema(self) -> None:
        """Create the schema in an empty database, or check (and migrate) an existing one.
        READ COMMITTED, under an advisory lock: the second of two openers of an empty
        database waits for the first and then sees its schema."""
        begin = "BEGIN READ ONLY" if self.readonly else "BEGIN ISOLATION LEVEL READ COMMITTED"
        try:
            with self._session(begin) as conn:
                c = _PgConn(conn, self.counts)
                if not self.readonly:
                    c.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
                if c.execute("SELECT to_regclass('meta')").fetchone()[0] is None:
                    if self.readonly:
                        raise NotFound(f"no ckptfs catalog in {self.where}")
                    self._create_schema(conn)
                else:
                    self._check_version(c)
                if not self.readonly:  # no schema version of its own: a table only nodes use
                    _run_ddl(c, AUDIT_PENDING_DDL)
                self._pending_table = c.execute(
                    "SELECT to_regclass('audit_pending')").fetchone()[0] is not None
                conn.execute("COMMIT")
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:
            raise self._unavailable(e) from None

    def _create_schema(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(pg_schema())
        init_rows(_PgConn(conn, self.counts))
        # The root's number was given explicitly: new inodes continue after it.
        conn.execute("SELECT setval(pg_get_serial_sequence('inodes', 'ino'), "
                     "(SELECT max(ino) FROM inodes))")

    def _check_version(self, c: Conn) -> None:
        row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            raise InvalidArgument(f"{self.where} holds a table meta but no ckptfs catalog")
        version = int(row[0])
        if version > SCHEMA_VERSION:
            raise newer_schema(self.where, version)
        if version < SCHEMA_VERSION and self.readonly:
            raise InvalidArgument(f"catalog {self.where}: schema version {version} needs a "
                                  "migration: open it read-write (mount) first")
        while version < SCHEMA_VERSION:
            step = MIGRATIONS.get(version)
            if step is None:
                raise InvalidArgument(f"catalog {self.where}: no migration from schema version {version}")
            step(c)
            version += 1
            c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))

    # -- the snapshot ------------------------------------------------------------------------

    def backup_bytes(self) -> bytes:
        """The whole catalog in one snapshot, as a SQLite catalog file (what a bucket
        restore opens as a SqliteCatalog), with the sequences carried over; the pending
        audit records chained first (the snapshot has no table of them)."""
        self._audit_chain()
        with self._reading() as c:
            rows = {
                table: c.execute(f"SELECT {', '.join(cols)} FROM {table}").fetchall()
                for table, cols in TABLES.items()
            }
            seqs = {
                table: int(c.execute(
                    f"SELECT greatest(coalesce(pg_sequence_last_value(pg_get_serial_sequence("
                    f"'{table}', '{key}')::regclass), 0), coalesce(max({key}), 0)) FROM {table}"
                ).fetchone()[0])
                for table, key in SEQUENCES.items()
            }
        return catalog_file(rows, seqs)
