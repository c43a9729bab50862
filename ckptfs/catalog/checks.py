"""The scrubber's catalog (schema 10; ckptfs/scrub/): when each chunk copy was last read
and verified (``replicas.checked_ns``, 0: never), the copies due oldest check first, each
tier's progress and the end of its last full pass (``meta`` ``scrub_pass:TIER``), and the lease of the remote's scrub on a shared catalog (a ``meta`` row,
``scrub_remote``: the holding node and its expiry, on the database's clock).

A copy written since its last check is not reset: every copy is verified as it is written
(chunks/writer.py, the uploader's read-back), so an old check time only makes it due
sooner. A restored snapshot carries no check times (schema.TABLES leaves the column out):
a restored node checks everything once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .conn import Conn, SqlBase

__all__ = ["CHECKS_INDEX", "ReplicaCheck", "ReplicaChecks", "ReplicaCheckSql", "TierProgress"]

# Oldest check first, per tier (the scrubber's batch query).
CHECKS_INDEX = "CREATE INDEX IF NOT EXISTS replicas_checked ON replicas (tier, checked_ns)"
LEASE_KEY = "scrub_remote"
PASS_KEY = "scrub_pass:"  # + a tier's name: the end of its last full pass (ns)


@dataclass(frozen=True)
class ReplicaCheck:
    """A copy to check: the chunk, its tier, length, state (valid, bad) and last check."""

    digest: bytes
    tier: str
    length: int
    state: str
    checked_ns: int


@dataclass(frozen=True)
class TierProgress:
    """A tier's copies, their bytes, the oldest check among them (0: one never checked:
    no full pass yet) and the bytes checked since ``since_ns``; ``bad``: copies recorded bad."""

    copies: int
    bytes: int
    oldest_checked_ns: int
    bytes_since: int
    bad: int


class ReplicaChecks(Protocol):
    """The scrubber's rows."""

    def replicas_to_check(
        self, tiers: Sequence[str], before_ns: int, limit: int
    ) -> list[ReplicaCheck]:
        """Copies on ``tiers`` last checked before ``before_ns``, oldest check first."""
        ...

    def record_checked(self, pairs: Sequence[tuple[bytes, str]], checked_ns: int) -> None:
        """These copies were read and verified (or healed) at ``checked_ns``."""
        ...

    def check_progress(self, tiers: Sequence[str], since_ns: int) -> dict[str, TierProgress]:
        """Each of ``tiers`` that holds copies: its progress (TierProgress)."""
        ...

    def next_check_due_ns(self, tiers: Sequence[str]) -> int | None:
        """The oldest check time among the copies on ``tiers`` (None: no copies)."""
        ...

    def record_scrub_pass(self, tiers: Sequence[str], finished_ns: int) -> None:
        """A pass checked every copy on ``tiers`` that was due; it ended at ``finished_ns``."""
        ...

    def scrub_passes(self) -> dict[str, int]:
        """The end of the last full pass of each tier that had one."""
        ...

    def take_scrub_lease(self, node: str, ttl_s: float) -> str:
        """Take or renew the lease of the remote's scrub for ``node`` unless another node
        holds it unexpired; the holder's name after the call."""
        ...

    def release_scrub_lease(self, node: str) -> None:
        """End ``node``'s lease (a clean shutdown), if it holds it."""
        ...


class ReplicaCheckSql(SqlBase):
    """The ReplicaChecks methods of SqlCatalog."""

    def replicas_to_check(
        self, tiers: Sequence[str], before_ns: int, limit: int
    ) -> list[ReplicaCheck]:
        if not tiers:
            return []
        marks = ",".join("?" * len(tiers))
        rows = self._query(
            "SELECT r.digest, r.tier, c.length, r.state, r.checked_ns FROM replicas r "
            f"JOIN chunks c ON c.digest = r.digest WHERE r.tier IN ({marks}) "
            "AND r.checked_ns < ? ORDER BY r.checked_ns, r.digest, r.tier LIMIT ?",
            (*tiers, before_ns, limit),
        )
        return [ReplicaCheck(bytes(d), str(t), int(n), str(s), int(k)) for d, t, n, s, k in rows]

    def record_checked(self, pairs: Sequence[tuple[bytes, str]], checked_ns: int) -> None:
        if not pairs:
            return

        def body(c: Conn) -> None:
            for digest, tier in pairs:
                c.execute("UPDATE replicas SET checked_ns = ? WHERE digest = ? AND tier = ?",
                          (checked_ns, digest, tier))

        self._write(body)

    def check_progress(self, tiers: Sequence[str], since_ns: int) -> dict[str, TierProgress]:
        if not tiers:
            return {}
        marks = ",".join("?" * len(tiers))
        rows = self._query(
            "SELECT r.tier, count(*), coalesce(sum(c.length), 0), min(r.checked_ns), "
            "coalesce(sum(CASE WHEN r.checked_ns >= ? THEN c.length ELSE 0 END), 0), "
            "coalesce(sum(CASE WHEN r.state = 'bad' THEN 1 ELSE 0 END), 0) "
            f"FROM replicas r JOIN chunks c ON c.digest = r.digest WHERE r.tier IN ({marks}) "
            "GROUP BY r.tier", (since_ns, *tiers),
        )
        return {str(t): TierProgress(int(n), int(b), int(o), int(s), int(bad))
                for t, n, b, o, s, bad in rows}

    def next_check_due_ns(self, tiers: Sequence[str]) -> int | None:
        if not tiers:
            return None
        marks = ",".join("?" * len(tiers))
        row = self._query(f"SELECT min(checked_ns) FROM replicas WHERE tier IN ({marks})",
                          tuple(tiers))
        return None if not row or row[0][0] is None else int(row[0][0])

    def record_scrub_pass(self, tiers: Sequence[str], finished_ns: int) -> None:
        def body(c: Conn) -> None:
            for tier in tiers:
                c.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                          "value = excluded.value", (PASS_KEY + tier, str(finished_ns)))

        if tiers:
            self._write(body)

    def scrub_passes(self) -> dict[str, int]:
        rows = self._query("SELECT key, value FROM meta WHERE key LIKE ?", (PASS_KEY + "%",))
        return {str(k)[len(PASS_KEY):]: int(v) for k, v in rows}

    def take_scrub_lease(self, node: str, ttl_s: float) -> str:
        def body(c: Conn) -> str:
            now = self._db_now(c)
            row = c.execute("SELECT value FROM meta WHERE key = ?", (LEASE_KEY,)).fetchone()
            if row is not None:
                held = json.loads(str(row[0]))
                if held.get("node") != node and int(held.get("until_ns", 0)) > now:
                    return str(held.get("node"))
            value = json.dumps({"node": node, "until_ns": now + int(ttl_s * 1e9)})
            c.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET "
                      "value = excluded.value", (LEASE_KEY, value))
            return node

        return self._write(body)

    def release_scrub_lease(self, node: str) -> None:
        def body(c: Conn) -> None:
            row = c.execute("SELECT value FROM meta WHERE key = ?", (LEASE_KEY,)).fetchone()
            if row is not None and json.loads(str(row[0])).get("node") == node:
                c.execute("DELETE FROM meta WHERE key = ?", (LEASE_KEY,))

        self._write(body)

