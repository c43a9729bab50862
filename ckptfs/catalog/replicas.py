"""Replica rows' SQL, once for every engine: where chunk copies are, which are bad, and
local eviction (protocols.ReplicaCatalog). What each method does is said on its Protocol;
comments here say how."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .audit import AuditRecord, AuditSql
from .conn import Conn
from .deletion_events import DeletionEventsSql
from .deletions import queue_deletion

__all__ = ["KNOWN_CHUNK", "VALID_REPLICA", "ReplicaSql"]

# A valid copy on a tier, just written and verified (params: digest, tier, time.time_ns()):
# its write counts as its last check (checks.py), unless the row was already valid (a
# commit that found the chunk there wrote nothing); a chunk known with its length
# (contents.py and uploads.py write them too).
VALID_REPLICA = (
    "INSERT INTO replicas (digest, tier, state, checked_ns) VALUES (?, ?, 'valid', ?) "
    "ON CONFLICT (digest, tier) DO UPDATE SET state='valid', checked_ns=CASE WHEN "
    "replicas.state='valid' THEN replicas.checked_ns ELSE excluded.checked_ns END"
)
KNOWN_CHUNK = "INSERT INTO chunks VALUES (?, ?) ON CONFLICT (digest) DO NOTHING"


class ReplicaSql(AuditSql, DeletionEventsSql):
    """The replica methods of SqlCatalog."""

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

    def stored_by_tier(self) -> dict[str, tuple[int, int]]:
        with self._reading() as c:
            rows = c.execute(
                "SELECT r.tier, count(*), coalesce(sum(c.length), 0) FROM replicas r "
                "JOIN chunks c ON c.digest = r.digest WHERE r.state = 'valid' GROUP BY r.tier"
            ).fetchall()
        return {str(t): (int(n), int(b)) for t, n, b in rows}

    def stored_on_tier(self, tier: str) -> tuple[int, int]:
        with self._reading() as c:
            n, size = c.execute(
                "SELECT count(*), coalesce(sum(c.length), 0) FROM replicas r JOIN chunks c "
                "ON c.digest = r.digest WHERE r.tier = ? AND r.state = 'valid'", (tier,)
            ).fetchone()
        return int(n), int(size)

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
            c.execute(VALID_REPLICA, (digest, tier, time.time_ns()))
            return True

        return self._write(body)

    def add_replica(self, digest: bytes, tier: str, length: int) -> None:
        def body(c: Conn) -> None:
            c.execute(KNOWN_CHUNK, (digest, length))
            c.execute(VALID_REPLICA, (digest, tier, time.time_ns()))

        self._write(body)

    def remove_replica(self, digest: bytes, tier: str) -> None:
        def body(c: Conn) -> None:
            c.execute("DELETE FROM replicas WHERE digest=? AND tier=?", (digest, tier))

        self._write(body)

    def replica_keys(self, tier: str) -> set[bytes]:
        with self._reading() as c:
            return {bytes(r[0]) for r in c.execute("SELECT digest FROM replicas WHERE tier=?", (tier,))}

    def replica_keys_all(self) -> set[bytes]:
        with self._reading() as c:
            rows = c.execute("SELECT digest FROM chunks UNION SELECT digest FROM replicas")
            return {bytes(r[0]) for r in rows}

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
