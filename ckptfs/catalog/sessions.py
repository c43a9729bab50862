"""Node sessions (issue 14; docs/multinode.md "Node sessions"): the SQL, once for every engine.

Each daemon on a shared catalog registers a session: a row of ``sessions`` (its node name,
a random id, an expiry) whose expiry its heartbeat pushes forward. The inodes a session
holds open are rows of ``open_handles``. Every time here is the **database's** clock
(``_now_ns_sql``, an engine's expression), never a node's: nodes' clocks differ.

* An inode with no name left is dropped only when no session holds it open: the last
  closer anywhere drops it (``release_inode``), or the end of the last session holding it
  (``close_session``, ``cleanup_expired_sessions``).
* A session whose expiry passed is ended by one live node at a time (the engine's
  ``_cleanup_lock``: PostgreSQL's pg_try_advisory_xact_lock; SQLite needs none): its
  open-handle rows go, its unlinked-open inodes are dropped, and the checkpoints it was
  writing (a file under them open for writing) that no other session writes are marked
  partial; the uncommitted chunks it had moved to a remote (moves.py) are queued for
  deletion. Its committed files keep their last commit: nothing else of a dead node is in
  the catalog.
* One live session per node name: two daemons with one name would mix the replicas of
  their local tiers (named NODE:NAME). The exception is the registering daemon's own
  earlier session (``register_session``'s ``earlier``: the id its state dir names, from a
  daemon of that state dir that was killed or crashed, dead since the new one holds the
  state dir's lock): it is ended at once, as an expired one would be, and replaced.

What each method does is said on protocols.SessionCatalog. The SQLite engine has the same
tables and methods (real, cheap, unused: one node, so the daemon registers no session and
the VFS notes no open handles there).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from ..errors import NotFound, UsageError
from ..names import path_bytes, path_str, readable
from .conn import SQLITE_NOW_NS, Conn
from .deletion_events import DeletionEventsSql
from .moves import release_moves_of
from .protocols import ExclusiveLock
from .quotas import uncharge_inode
from .rows import CheckpointState, Registered, SessionEnd, SessionRow
from .tree import path_of

__all__ = ["SESSIONS_DDL", "SQLITE_NOW_NS", "OneNodeLock", "SessionsSql", "note_open_in"]

SESSIONS_DDL = """
-- Node sessions of a shared catalog (catalog/sessions.py). Times: the database's clock, ns.
CREATE TABLE IF NOT EXISTS sessions (
    sid        TEXT PRIMARY KEY,
    node       TEXT NOT NULL UNIQUE,
    started_ns INTEGER NOT NULL,
    beat_ns    INTEGER NOT NULL,
    expires_ns INTEGER NOT NULL,
    info       TEXT NOT NULL DEFAULT ''
);
-- The inodes each session holds open (writing: one of its handles may write).
CREATE TABLE IF NOT EXISTS open_handles (
    sid     TEXT NOT NULL,
    ino     INTEGER NOT NULL,
    writing INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sid, ino)
);
CREATE INDEX IF NOT EXISTS open_handles_ino ON open_handles (ino);
"""

_SET_CHANGED = ("INSERT INTO meta VALUES ('changed_ns', ?) "
                "ON CONFLICT (key) DO UPDATE SET value=excluded.value")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _drop_if_orphan(c: Conn, ino: int) -> list[bytes] | None:
    """Drop inode ``ino`` if it has no name left and no session holds it open; the digests
    its extents referenced, or None if it stays (or is gone already)."""
    row = c.execute("SELECT nlink FROM inodes WHERE ino=?", (ino,)).fetchone()
    if row is None or int(row[0]) > 0:
        return None
    if c.execute("SELECT 1 FROM open_handles WHERE ino=? LIMIT 1", (ino,)).fetchone():
        return None
    digests = [bytes(r[0]) for r in c.execute("SELECT digest FROM extents WHERE ino=?", (ino,))]
    c.execute("DELETE FROM extents WHERE ino=?", (ino,))
    c.execute("DELETE FROM xattrs WHERE ino=?", (ino,))
    uncharge_inode(c, ino)
    c.execute("DELETE FROM inodes WHERE ino=?", (ino,))
    return digests


class OneNodeLock:
    """``try_exclusive`` of an engine that one node uses (SQLite): nobody else to exclude."""

    def held(self) -> bool:
        return True

    def release(self) -> None:
        pass


def note_open_in(c: Conn, sid: str, ino: int, writing: bool) -> None:
    """Note ``ino`` (which exists) open under session ``sid``, in the caller's transaction;
    nothing if the session has ended (the node notes it anew under its next one)."""
    c.execute(
        "INSERT INTO open_handles (sid, ino, writing) SELECT ?, ?, ? WHERE EXISTS "
        "(SELECT 1 FROM sessions WHERE sid=?) ON CONFLICT (sid, ino) DO UPDATE SET "
        "writing = CASE WHEN excluded.writing > open_handles.writing "
        "THEN excluded.writing ELSE open_handles.writing END",
        (sid, ino, int(writing), sid),
    )


class SessionsSql(DeletionEventsSql):
    """The session methods of SqlCatalog; an engine provides ``_now_ns_sql`` (conn.py)
    and ``_cleanup_lock``."""

    # -- what the engine provides ------------------------------------------------------------

    def _cleanup_lock(self, c: Conn) -> bool:
        """Whether this transaction may clean up expired sessions (one node at a time)."""
        return True

    def try_exclusive(self, name: str) -> ExclusiveLock | None:
        """One node uses this engine: the lock is always granted (PostgreSQL overrides)."""
        return OneNodeLock()

    # -- sessions ----------------------------------------------------------------------------

    def register_session(
        self, node: str, timeout_s: float, info: str = "", sid: str | None = None,
        earlier: str = "",
    ) -> Registered:
        timeout_ns = int(timeout_s * 1e9)
        new_sid = sid or uuid.uuid4().hex

        def body(c: Conn) -> Registered:
            now = self._db_now(c)
            row = c.execute("SELECT sid, expires_ns, info FROM sessions WHERE node=?",
                            (node,)).fetchone()
            previous = None
            if row is not None:
                if str(row[0]) == new_sid:
                    # This registration committed before, and its reply was lost.
                    c.execute("UPDATE sessions SET beat_ns=?, expires_ns=? WHERE sid=?",
                              (now, now + timeout_ns, new_sid))
                    return Registered(new_sid, None)
                # A live session is refused, unless it is the caller's own earlier one: the
                # caller holds the state dir of the daemon that registered it, which is dead.
                if int(row[1]) > now and not (earlier and str(row[0]) == earlier):
                    raise UsageError(
                        f"node {node!r} has a live session in the catalog ({row[2] or 'no info'}; "
                        f"expires in {(int(row[1]) - now) / 1e9:.1f} s): two daemons with one node "
                        "name would mix their local tiers' replicas; give each node a name of its "
                        "own (node / --node), or wait for that daemon's session to expire"
                    )
                previous = self._end(c, str(row[0]), node, f"its node {node} restarted")
            done = c.execute(
                "INSERT INTO sessions (sid, node, started_ns, beat_ns, expires_ns, info) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (node) DO NOTHING",
                (new_sid, node, now, now, now + timeout_ns, info),
            ).rowcount
            if not done:  # a concurrent registration of the name won (SQLite cannot race)
                raise UsageError(f"node {node!r} has a live session in the catalog")
            return Registered(new_sid, previous)

        return self._write(body, touch=True)

    def heartbeat_session(self, sid: str, timeout_s: float) -> bool:
        timeout_ns = int(timeout_s * 1e9)

        def body(c: Conn) -> bool:
            now = self._db_now(c)
            return bool(c.execute("UPDATE sessions SET beat_ns=?, expires_ns=? WHERE sid=?",
                                  (now, now + timeout_ns, sid)).rowcount)

        return self._write(body)

    def close_session(self, sid: str) -> SessionEnd:
        def body(c: Conn) -> SessionEnd:
            row = c.execute("SELECT node FROM sessions WHERE sid=?", (sid,)).fetchone()
            return self._end(c, sid, "" if row is None else str(row[0]), "")

        return self._write(body, touch=True)

    def cleanup_expired_sessions(self) -> list[SessionEnd]:
        with self._reading() as c:
            now = self._db_now(c)
            if not c.execute("SELECT 1 FROM sessions WHERE expires_ns<? LIMIT 1", (now,)).fetchone():
                return []  # the common case, without a write

        def body(c: Conn) -> list[SessionEnd]:
            if not self._cleanup_lock(c):
                return []
            now = self._db_now(c)
            rows = c.execute("SELECT sid, node FROM sessions WHERE expires_ns<? ORDER BY node",
                             (now,)).fetchall()
            ended = [self._end(c, str(sid), str(node), f"its node {node} died (session expired)")
                     for sid, node in rows]
            if ended:  # touched only by the winner: a loser writes nothing
                c.execute(_SET_CHANGED, (str(time.time_ns()),))
            return ended

        ended = self._write(body)
        if ended:
            self._fire_touch()
        return ended

    def sessions(self) -> list[SessionRow]:
        with self._reading() as c:
            now = self._db_now(c)
            rows = c.execute("SELECT sid, node, started_ns, beat_ns, expires_ns, info FROM sessions "
                             "ORDER BY node").fetchall()
        return [SessionRow(str(s), str(n), int(a), int(b), int(e), str(i), int(e) > now)
                for s, n, a, b, e, i in rows]

    def database_now_ns(self) -> int:
        with self._reading() as c:
            return self._db_now(c)

    # -- open handles ------------------------------------------------------------------------

    def note_open(self, sid: str, ino: int, writing: bool = False) -> None:
        def body(c: Conn) -> None:
            if c.execute("SELECT 1 FROM inodes WHERE ino=?", (ino,)).fetchone() is None:
                raise NotFound(f"inode {ino}")
            note_open_in(c, sid, ino, writing)

        self._write(body)

    def note_open_many(self, sid: str, inos: Sequence[tuple[int, bool]]) -> None:
        def body(c: Conn) -> None:
            for ino, writing in inos:
                c.execute(
                    "INSERT INTO open_handles (sid, ino, writing) SELECT ?, ?, ? WHERE EXISTS "
                    "(SELECT 1 FROM sessions WHERE sid=?) AND EXISTS (SELECT 1 FROM inodes "
                    "WHERE ino=?) ON CONFLICT (sid, ino) DO NOTHING",
                    (sid, ino, int(writing), sid, ino),
                )

        self._write(body)

    def release_inode(self, sid: str, ino: int) -> list[bytes] | None:
        def body(c: Conn) -> list[bytes] | None:
            # The row and the inode's link count in one statement: a file with a name
            # (nearly every close) needs no other.
            row = c.execute("DELETE FROM open_handles WHERE sid=? AND ino=? "
                            "RETURNING (SELECT nlink FROM inodes WHERE ino=?)",
                            (sid, ino, ino)).fetchone()
            if row is not None and row[0] is not None and int(row[0]) > 0:
                return None
            return _drop_if_orphan(c, ino)

        return self._write(body)

    def open_inodes(self) -> set[int]:
        with self._reading() as c:
            return {int(r[0]) for r in c.execute("SELECT DISTINCT ino FROM open_handles")}

    def open_writer_paths(self) -> list[str]:
        """The paths of the inodes some session holds open for writing, one snapshot (the
        checkpoint tracker's and ``latest``'s writers on every node). A session expired
        and not yet cleaned up still counts: its cleanup decides what its writers left
        (the checkpoints they wrote become partial). Inodes with no name left are skipped."""
        with self._reading() as c:
            inos = [int(r[0]) for r in c.execute(
                "SELECT DISTINCT ino FROM open_handles WHERE writing=1 ORDER BY ino").fetchall()]
            paths = [path_of(c, ino) for ino in inos]
        return [p for p in paths if p.startswith("/")]

    # -- ending a session --------------------------------------------------------------------

    def _end(self, c: Conn, sid: str, node: str, why: str) -> SessionEnd:
        held = [(int(i), bool(w)) for i, w in
                c.execute("SELECT ino, writing FROM open_handles WHERE sid=?", (sid,)).fetchall()]
        writing = [path_of(c, ino) for ino, w in held if w]
        c.execute("DELETE FROM open_handles WHERE sid=?", (sid,))
        c.execute("DELETE FROM sessions WHERE sid=?", (sid,))
        dropped: list[int] = []
        digests: list[bytes] = []
        for ino, _ in held:
            gone = _drop_if_orphan(c, ino)
            if gone is not None:
                dropped.append(ino)
                digests += gone
        partial = self._mark_partial(c, writing, why) if why and writing else []
        # Its uncommitted chunks moved to a remote will never be committed by it: the
        # objects are queued for deletion unless something else wants them.
        if node and release_moves_of(c, node):
            self._notify_deletions(c)
        return SessionEnd(sid, node, len(held), tuple(dropped), tuple(digests), tuple(partial))

    def _mark_partial(self, c: Conn, dead: list[str], why: str) -> list[str]:
        """The checkpoints still "writing" with a file under them that the ended session
        had open for writing, and none that another session has: partial."""
        live = [path_of(c, int(r[0])) for r in
                c.execute("SELECT DISTINCT ino FROM open_handles WHERE writing=1").fetchall()]
        out = []
        for (root,) in c.execute("SELECT root FROM checkpoints WHERE state=?",
                                 (CheckpointState.WRITING.value,)).fetchall():
            path = path_str(root)  # roots are bytes (ckptfs/names.py)
            if any(_under(p, path) for p in dead) and not any(_under(p, path) for p in live):
                c.execute("UPDATE checkpoints SET state=?, reason=? WHERE root=?",
                          (CheckpointState.PARTIAL.value, readable(f"no commit: {why}"),
                           path_bytes(path)))
                out.append(path)
        return out
