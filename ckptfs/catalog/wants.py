"""Chunks a reader waits for (issue 14; docs/multinode.md "Reads of another node's chunks"):
the SQL, once for every engine.

With a shared catalog a node may read a chunk that only another node's local tiers hold
(committed there, its upload still queued). The reading node records a **want**: a row of
``chunk_wants`` (the digest, who waits, until when), and the engine tells the other nodes
in the same transaction (PostgreSQL: ``NOTIFY ckptfs_chunk_wants``, delivered at the
commit; SQLite has no other node and sends nothing). A holding node's uploader then asks
``wanted_uploads``: the wanted chunks with upload jobs it can run, which it starts before
every other job and despite a save's deferral. A want is removed by its waiter when its
wait ends (``unwant_chunks``), and ignored once ``until_ns`` passed (a waiter that died
mid-wait), then purged by the next ``want_chunks``. Times: the database's clock (nodes'
clocks differ), like the sessions'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from .conn import Conn, SqlBase

__all__ = ["WANTS_CHANNEL", "WANTS_DDL", "WantListener", "WantsSql", "held_on"]

WANTS_CHANNEL = "ckptfs_chunk_wants"

WANTS_DDL = """
-- Chunks a reader waits for that only other nodes' local tiers hold (catalog/wants.py):
-- their holders upload them first. Times: the database's clock, ns.
CREATE TABLE IF NOT EXISTS chunk_wants (
    digest    BLOB NOT NULL,
    waiter    TEXT NOT NULL,
    wanted_ns INTEGER NOT NULL,
    until_ns  INTEGER NOT NULL,
    PRIMARY KEY (digest, waiter)
);
"""


class WantListener(Protocol):
    """Where a holding node hears of new wants (PostgreSQL: a dedicated LISTEN
    connection). ``wait`` blocks (a worker thread) until a want may have been recorded
    since the last return: a notification, or a (re)connection, after which notifications
    sent meanwhile are unknown; False once ``close`` (any thread) ended it. Raises
    CatalogUnavailable while the database cannot be reached."""

    def wait(self) -> bool:
        ...

    def close(self) -> None:
        ...


def held_on(sources: Sequence[str] | None) -> tuple[str, tuple[str, ...]]:
    """The condition (and its parameters) that keeps upload jobs ``u`` of chunks with a
    valid replica on one of ``sources`` (None: every job)."""
    if sources is None:
        return "", ()
    if not sources:
        return " AND 1=0", ()
    ph = ",".join("?" * len(sources))
    return (f" AND EXISTS (SELECT 1 FROM replicas h WHERE h.digest = u.digest AND "
            f"h.state = 'valid' AND h.tier IN ({ph}))", tuple(sources))


class WantsSql(SqlBase):
    """The want methods of SqlCatalog; an engine provides ``_notify_wants`` and
    ``listen_wants``."""

    def _notify_wants(self, c: Conn) -> None:
        """Tell the other nodes, at this transaction's commit, that a want was recorded.
        SQLite: nobody to tell."""

    def listen_wants(self) -> WantListener | None:
        """A listener for new wants (its own connection); None: this engine has no other
        node to hear from (SQLite)."""
        return None

    def want_chunks(self, digests: Iterable[bytes], waiter: str, ttl_s: float) -> None:
        """``waiter`` waits for these chunks for at most ``ttl_s`` more seconds: their
        holders upload them first. Renews a want of the same waiter; purges stale ones."""
        todo = sorted(set(digests))
        if not todo:
            return
        ttl_ns = int(ttl_s * 1e9)

        def body(c: Conn) -> None:
            now = self._db_now(c)
            c.execute("DELETE FROM chunk_wants WHERE until_ns<?", (now,))
            for d in todo:
                c.execute(
                    "INSERT INTO chunk_wants (digest, waiter, wanted_ns, until_ns) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (digest, waiter) DO UPDATE SET "
                    "until_ns=excluded.until_ns",
                    (d, waiter, now, now + ttl_ns),
                )
            self._notify_wants(c)

        self._write(body)

    def unwant_chunks(self, digests: Iterable[bytes], waiter: str) -> None:
        """``waiter`` no longer waits for these chunks (its read got them, or gave up)."""
        todo = sorted(set(digests))
        if not todo:
            return

        def body(c: Conn) -> None:
            for d in todo:
                c.execute("DELETE FROM chunk_wants WHERE digest=? AND waiter=?", (d, waiter))

        self._write(body)

    def wanted_uploads(self, sources: Sequence[str] | None, limit: int = 1000) -> list[bytes]:
        """The chunks some live want names that still have an upload job of ``sources``
        (see uploads.due_uploads), the longest wanted first."""
        held, args = held_on(sources)
        with self._reading() as c:
            now = self._db_now(c)
            rows = c.execute(
                "SELECT w.digest, min(w.wanted_ns) FROM chunk_wants w WHERE w.until_ns>=? "
                f"AND EXISTS (SELECT 1 FROM upload_jobs u WHERE u.digest = w.digest{held}) "
                "GROUP BY w.digest ORDER BY min(w.wanted_ns), w.digest LIMIT ?",
                (now, *args, limit),
            ).fetchall()
        return [bytes(r[0]) for r in rows]

    def chunk_wants(self) -> list[tuple[bytes, str, int]]:
        """Every live want: (digest, waiter, ns until it expires). For tests and status."""
        with self._reading() as c:
            now = self._db_now(c)
            rows = c.execute("SELECT digest, waiter, until_ns FROM chunk_wants WHERE until_ns>=? "
                             "ORDER BY digest, waiter", (now,)).fetchall()
        return [(bytes(d), str(w), int(u) - now) for d, w, u in rows]
