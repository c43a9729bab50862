"""Uncommitted chunks moved to a remote tier (docs/multinode.md "One chunk, two nodes"):
the SQL, once for every engine.

A writer whose local tiers are full moves its uncommitted chunks to their remote tiers and
drops the local frames (chunks/store.py ``_spill``). Chunk objects are keyed by digest, so
another node's deletion of the same digest on the same tier would remove the object the
writer's coming commit will name. Before its PUT, the mover records a **move**: a row of
``chunk_moves`` (digest, tier, node) that ``claim_deletions`` counts as the pair being
wanted, like a valid replica or an upload job, in one transaction with the check that no
deletion of the pair is claimed now (``begin_move``; refused: the move waits, its PUT would
race that DELETE). From then on no node claims a deletion of the pair, so nothing deletes
what the PUT stores.

The row goes when the chunk stops being uncommitted on that node (``end_moves``: it was
committed, and its replica row protects the object; or it was dropped, and the object is
queued for deletion unless something else wants the pair), or when the node's session
ends (a daemon that died: ``release_moves_of``, from sessions.py; SQLite has no sessions,
and a mount releases every move left by an earlier run, ``release_moves``). Tied to the
session rather than to a lease of its own: a writer may keep a moved chunk uncommitted
for as long as its file stays open, and a session's end is already when every other trace
of a dead node (its open handles) goes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from .conn import Conn
from .deletion_events import DeletionEventsSql
from .deletions import queue_deletion

__all__ = ["MOVED_PAIR", "MOVES_DDL", "MovesSql", "release_moves_of"]

MOVES_DDL = """
-- Uncommitted chunks a node moves or moved to a remote tier (its local tiers full;
-- catalog/moves.py): while a row is here no node claims a deletion of the pair.
CREATE TABLE IF NOT EXISTS chunk_moves (
    digest   BLOB NOT NULL,
    tier     TEXT NOT NULL,
    node     TEXT NOT NULL,
    length   INTEGER NOT NULL,
    moved_ns INTEGER NOT NULL,
    PRIMARY KEY (digest, tier, node)
);
"""

# A move of the pair (digest, tier) on any node: claim_deletions' "wanted" (deletion_queue.py).
MOVED_PAIR = "SELECT 1 FROM chunk_moves WHERE digest=? AND tier=?"


def _queue_unwanted(c: Conn, digest: bytes, tier: str, length: int, now: int) -> bool:
    """A move of the pair just ended: queue the object's deletion unless the pair is wanted
    (a valid replica: committed; an upload job; another node's move). True if queued."""
    if c.execute(
        "SELECT 1 FROM replicas WHERE digest=? AND tier=? AND state='valid' UNION ALL "
        "SELECT 1 FROM upload_jobs WHERE digest=? AND tier=? UNION ALL "
        f"{MOVED_PAIR} LIMIT 1",
        (digest, tier, digest, tier, digest, tier),
    ).fetchone():
        return False
    queue_deletion(c, digest, tier, length, now)
    return True


def release_moves_of(c: Conn, node: str | None) -> int:
    """End every move of ``node`` (None: of every node) inside the caller's transaction, as
    ``end_moves`` does; the number of deletions queued."""
    if node is None:
        rows = c.execute("DELETE FROM chunk_moves RETURNING digest, tier, length").fetchall()
    else:
        rows = c.execute("DELETE FROM chunk_moves WHERE node=? RETURNING digest, tier, length",
                         (node,)).fetchall()
    now = time.time_ns()
    return sum(_queue_unwanted(c, bytes(d), str(t), int(n), now) for d, t, n in rows)


class MovesSql(DeletionEventsSql):
    """The move methods of SqlCatalog. A deletion row a move queues or cancels is an
    event for other nodes' deleters (a settle may wait for a cancelled row)."""

    def begin_move(self, digest: bytes, length: int, tiers: Sequence[str], node: str) -> bool:
        """Before ``node`` PUTs its uncommitted chunk on ``tiers``: False, writing nothing,
        if a deletion of one of the pairs is claimed (its DELETE may land after the PUT:
        try again once it is done); else cancel their unclaimed deletion rows (nothing
        was deleted yet), record the moves and return True."""
        todo = sorted(set(tiers))

        def body(c: Conn) -> bool:
            for tier in todo:
                # Any claim holds, also one whose lease ran out: its deleter may still
                # be deleting (as for uploads, uploads._CLAIMED); another deleter takes it
                # over, and its end lets the move go on.
                if c.execute("SELECT 1 FROM deletions WHERE digest=? AND tier=? AND "
                             "next_try_ns<0", (digest, tier)).fetchone():
                    return False
            now = time.time_ns()
            cancelled = 0
            for tier in todo:
                cancelled += c.execute("DELETE FROM deletions WHERE digest=? AND tier=?",
                                       (digest, tier)).rowcount
                c.execute(
                    "INSERT INTO chunk_moves (digest, tier, node, length, moved_ns) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (digest, tier, node) DO UPDATE SET "
                    "moved_ns=excluded.moved_ns",
                    (digest, tier, node, length, now),
                )
            if cancelled:
                self._notify_deletions(c)
            return True

        return self._write(body)

    def end_moves(self, pairs: Iterable[tuple[bytes, str]], node: str) -> int:
        """These chunks are no longer uncommitted on ``node`` (committed, or dropped):
        end its moves of them; an object nothing wants any more (no valid replica, no
        upload job, no other node's move) is queued for deletion. Returns how many were."""
        todo = sorted(set(pairs))

        def body(c: Conn) -> int:
            queued = 0
            now = time.time_ns()
            for digest, tier in todo:
                row = c.execute(
                    "DELETE FROM chunk_moves WHERE digest=? AND tier=? AND node=? "
                    "RETURNING length", (digest, tier, node)).fetchone()
                if row is not None:  # gone: ended with the node's session (queued there)
                    queued += _queue_unwanted(c, digest, tier, int(row[0]), now)
            if queued:
                self._notify_deletions(c)
            return queued

        return self._write(body) if todo else 0

    def release_moves(self, node: str | None = None) -> int:
        """End the moves ``node`` (None: every node) left behind: a run that ended without
        ending them (a crash). A mount calls it on an engine without sessions (SQLite);
        a shared catalog does it when a session ends. Returns the deletions queued."""
        def body(c: Conn) -> int:
            queued = release_moves_of(c, node)
            if queued:
                self._notify_deletions(c)
            return queued

        return self._write(body)

    def chunk_moves(self) -> list[tuple[bytes, str, str]]:
        """Every move recorded: (digest, tier, node). For tests and status."""
        rows = self._query("SELECT digest, tier, node FROM chunk_moves ORDER BY digest, tier, node")
        return [(bytes(d), str(t), str(n)) for d, t, n in rows]
