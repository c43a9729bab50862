"""The upload queue's SQL, once for every engine: jobs that copy chunks to remote tiers
(protocols.UploadQueue). What each method does is said on its Protocol; comments here say
how.

A job whose pair's remote deletion is claimed waits (``_CLAIMED``; deletion_queue.py says
why): its DELETE may land after the PUT.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from .conn import IN_BATCH, Conn
from .deletion_events import DeletionEventsSql
from .deletions import queue_deletion
from .replicas import VALID_REPLICA
from .rows import Backlog, UploadJob
from .wants import held_on

__all__ = ["UploadQueueSql", "wanted_on"]

# No claimed deletion row of the job's pair (upload_jobs u): deletion_queue.CLAIM_LEASE_NS.
_CLAIMED = (" AND NOT EXISTS (SELECT 1 FROM deletions d WHERE d.digest = u.digest "
            "AND d.tier = u.tier AND d.next_try_ns < 0)")


def wanted_on(c: Conn, tier: str, digests: Sequence[bytes]) -> int:
    """These chunks are to be uploaded to ``tier``: cancel their deletion rows there that
    no deleter claimed yet (nothing was deleted). A claimed row stays: the job waits for
    it. Reading the rows makes this transaction conflict with a concurrent claim. Returns
    how many rows were cancelled."""
    n = 0
    for at in range(0, len(digests), IN_BATCH):
        part = digests[at:at + IN_BATCH]
        n += c.execute(f"DELETE FROM deletions WHERE tier=? AND next_try_ns>=0 "
                       f"AND digest IN ({','.join('?' * len(part))})", (tier, *part)).rowcount
    return n


class UploadQueueSql(DeletionEventsSql):
    """The upload-job methods of SqlCatalog."""

    def queue_upload(self, digest: bytes, tier: str) -> bool:
        def body(c: Conn) -> bool:
            if not c.execute(
                "INSERT INTO upload_jobs (digest, tier, length, enqueued_ns) "
                "SELECT digest, ?, length, ? FROM chunks WHERE digest=? ON CONFLICT DO NOTHING",
                (tier, time.time_ns(), digest),
            ).rowcount:
                return False
            if wanted_on(c, tier, [digest]):
                self._notify_deletions(c)  # a cancelled row ends a settle's wait
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
            if wanted_on(c, tier, [digest]):
                self._notify_deletions(c)  # a cancelled row ends a settle's wait
            return True

        return self._write(body)

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
                    c.execute(VALID_REPLICA, (digest, tier, time.time_ns()))
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

    def upload_job_pairs(self) -> set[tuple[bytes, str]]:
        with self._reading() as c:
            return {(bytes(d), str(t)) for d, t in c.execute("SELECT digest, tier FROM upload_jobs")}

    def drop_upload_jobs(self, digests: Iterable[bytes], tier: str | None = None) -> int:
        todo = set(digests)

        def body(c: Conn) -> int:
            if tier is not None:
                return sum(c.execute("DELETE FROM upload_jobs WHERE digest=? AND tier=?",
                                     (d, tier)).rowcount for d in todo)
            return sum(c.execute("DELETE FROM upload_jobs WHERE digest=?", (d,)).rowcount for d in todo)

        return self._write(body)
