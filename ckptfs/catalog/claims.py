"""Who holds each claim of a remote deletion row, so that a restarted daemon takes back the
claims its dead predecessor left (issue 33, item 9; upload/deleter.py): the SQL, once for
every engine.

A deleter claims a remote row for a lease (deletion_queue.CLAIM_LEASE_NS, 600 s: its negative
next_try_ns) before its DELETE; while claimed, no node uploads the pair. A daemon killed
mid-delete left its claims to run out with that lease: its rows, and the uploads of
their pairs, waited ten minutes after the restart. Each claim now records its owner in
``deletion_claims``: the node, and the session of the daemon that made it (on SQLite,
which has no sessions, that daemon's own id), keyed by the claim's lease value, written in
the claim's transaction. At its start a daemon takes back (``adopt_deletion_claims``) the
claims of its own node whose session is not alive (with a shared catalog: never another
node's, never a live session's; on SQLite every claim, since one daemon at a time holds
the state dir and its catalog): each becomes its own, with a lease that ends when the dead
daemon's DELETE, sent at the latest when it died, can no longer land (the tier's request
grace from now): the deleter then releases it and the row is tried again at once, as after
any DELETE in doubt. A claim without an owner row (made by an older ckptfs, or kept after
a DELETE in doubt by a version that did not record it) still runs out with its lease.

Owner rows are not deleted with every claim's end: one whose lease value no longer matches
its row's claim is stale and ignored, and the adoption drops those.
"""

from __future__ import annotations

from collections.abc import Mapping

from .conn import Conn, SqlBase

__all__ = ["CLAIMS_DDL", "ClaimsSql", "forget_owner", "move_owner", "record_owner"]

CLAIMS_DDL = """
-- The owner of each claimed remote deletion row (catalog/claims.py): its node and session,
-- by the claim's lease value (-deletions.next_try_ns).
CREATE TABLE IF NOT EXISTS deletion_claims (
    digest   BLOB NOT NULL,
    tier     TEXT NOT NULL,
    lease_ns INTEGER NOT NULL,
    node     TEXT NOT NULL,
    sid      TEXT NOT NULL,
    PRIMARY KEY (digest, tier)
) WITHOUT ROWID;
"""


def record_owner(c: Conn, digest: bytes, tier: str, lease_ns: int, owner: tuple[str, str]
                 ) -> None:
    """In the claim's transaction: ``owner`` (node, session) holds the claim ``lease_ns``."""
    c.execute("INSERT INTO deletion_claims (digest, tier, lease_ns, node, sid) "
              "VALUES (?, ?, ?, ?, ?) ON CONFLICT (digest, tier) DO UPDATE SET "
              "lease_ns=excluded.lease_ns, node=excluded.node, sid=excluded.sid",
              (digest, tier, lease_ns, *owner))


def move_owner(c: Conn, digest: bytes, tier: str, old_lease_ns: int, new_lease_ns: int) -> None:
    """The claim goes on under a new lease value (kept after a DELETE in doubt)."""
    c.execute("UPDATE deletion_claims SET lease_ns=? WHERE digest=? AND tier=? AND lease_ns=?",
              (new_lease_ns, digest, tier, old_lease_ns))


def forget_owner(c: Conn, digest: bytes, tier: str) -> None:
    """The pair's deletion row is gone."""
    c.execute("DELETE FROM deletion_claims WHERE digest=? AND tier=?", (digest, tier))


class ClaimsSql(SqlBase):
    """The claim-owner methods of SqlCatalog; the sessions' table is
    sessions.SESSIONS_DDL, its times the database's clock (``_db_now``)."""

    def adopt_deletion_claims(
        self, node: str, sid: str, until_by_tier: Mapping[str, int], every: bool = False,
    ) -> list[tuple[bytes, str, int]]:
        """Take back the claims left by dead daemons of ``node``: claimed rows of the tiers
        in ``until_by_tier`` whose owner row names ``node`` and a session other than
        ``sid`` that is not alive (``every``: every claimed row of those tiers, owner or
        none: one node, one daemon). Each is claimed again, owned by (``node``, ``sid``),
        until its tier's value. Returns (digest, tier, lease value) of each taken."""

        def body(c: Conn) -> list[tuple[bytes, str, int]]:
            # Stale owner rows first (their claim ended): they would only mislead.
            c.execute("DELETE FROM deletion_claims WHERE NOT EXISTS (SELECT 1 FROM deletions d "
                      "WHERE d.digest = deletion_claims.digest AND d.tier = deletion_claims.tier "
                      "AND d.next_try_ns = -deletion_claims.lease_ns)")
            now = self._db_now(c)
            live = {str(r[0]) for r in
                    c.execute("SELECT sid FROM sessions WHERE expires_ns>?", (now,)).fetchall()}
            rows = c.execute(
                "SELECT d.digest, d.tier, d.next_try_ns, o.node, o.sid FROM deletions d "
                "LEFT JOIN deletion_claims o ON o.digest = d.digest AND o.tier = d.tier "
                "WHERE d.next_try_ns < 0").fetchall()
            taken = []
            for digest, tier, value, owner_node, owner_sid in rows:
                tier = str(tier)
                if tier not in until_by_tier:
                    continue
                dead = owner_sid is not None and str(owner_node) == node and \
                    str(owner_sid) != sid and str(owner_sid) not in live
                if not (every or dead):
                    continue
                until = until_by_tier[tier]
                if c.execute("UPDATE deletions SET next_try_ns=? WHERE digest=? AND tier=? "
                             "AND next_try_ns=?", (-until, digest, tier, value)).rowcount:
                    record_owner(c, bytes(digest), tier, until, (node, sid))
                    taken.append((bytes(digest), tier, until))
            return taken

        return self._write(body)
