"""The deletion queue's SQL, once for every engine: chunk frames to delete from tiers
(protocols.DeletionQueue; upload/deleter.py runs it). What each method does is said on its
Protocol; comments here say how. Queuing a row inside another transaction is deletions.py;
the owners of claims, claims.py; the events other nodes hear, deletion_events.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from .claims import forget_owner, move_owner, record_owner
from .conn import Conn
from .deletion_events import DeletionEventsSql
from .deletions import queue_deletion
from .moves import MOVED_PAIR
from .rows import Deletion, DeletionBacklog

__all__ = ["CLAIM_LEASE_NS", "DeletionQueueSql"]

# A deletion row of a remote tier being deleted has a negative next_try_ns: claimed by a
# deleter until -next_try_ns (a lease; a node that died mid-delete leaves it due again
# then). Chunk objects are keyed by digest and any node may upload one, so while a row is
# claimed no upload of its pair starts or is recorded (uploads._CLAIMED): the DELETE may
# land after the PUT.
# The end of a claim is an event (deletion_events.py: the claimant's own uploader is kicked
# in-process, other nodes' hear a NOTIFY); a lease that runs out is a deadline. A DELETE
# that failed in doubt (sent, perhaps, and no answer read: TierError.in_doubt) may still
# land: its row stays claimed for the tier's request grace (postpone_deletion with
# keep_claim), a new lease the deleter itself ends (deleter.py). A deleter's claim lasts
# at least twice its tier's request grace: the call, and a grace after it.
CLAIM_LEASE_NS = 600 * 10**9


def _restamp_jobs(c: Conn, digest: bytes, tier: str, now: int) -> bool:
    # A claim ended: a job queued while it ran waited for it. Restamped, so an upload that
    # started before the claim (of a job dropped since) cannot finish it. True: a job
    # waited (its uploader is to be told).
    return c.execute("UPDATE upload_jobs SET enqueued_ns=? WHERE digest=? AND tier=?",
                     (now, digest, tier)).rowcount > 0


class DeletionQueueSql(DeletionEventsSql):
    """The deletion-queue methods of SqlCatalog."""

    def queue_deletions(self, pairs: Iterable[tuple[bytes, str]]) -> int:
        now = time.time_ns()
        todo = set(pairs)

        def body(c: Conn) -> int:
            for d, tier in todo:
                row = c.execute("SELECT length FROM chunks WHERE digest=?", (d,)).fetchone()
                queue_deletion(c, d, tier, 0 if row is None else int(row[0]), now)
            if todo:
                self._notify_deletions(c)
            return len(todo)

        return self._write(body)

    def due_deletions(
        self, now_ns: int, limit: int, skip: set[tuple[bytes, str]], tiers: Sequence[str]
    ) -> list[Deletion]:
        if not tiers:
            return []
        tp = ",".join("?" * len(tiers))
        rows = self._query(
            f"SELECT digest, tier, length, attempts FROM deletions WHERE next_try_ns BETWEEN ? "
            f"AND ? AND tier IN ({tp}) ORDER BY enqueued_ns LIMIT ?",
            (-now_ns, now_ns, *tiers, limit + len(skip)),
        )
        out = [Deletion(bytes(d), str(t), int(n), int(a)) for d, t, n, a in rows]
        return [r for r in out if (r.digest, r.tier) not in skip][:limit]

    def next_deletion_due_ns(self, skip: set[tuple[bytes, str]], tiers: Sequence[str]) -> int | None:
        if not tiers:
            return None
        tp = ",".join("?" * len(tiers))
        # Unclaimed rows by their retry time, claimed ones by their lease's end.
        rows = self._query(
            f"SELECT * FROM (SELECT digest, tier, next_try_ns FROM deletions WHERE tier IN ({tp}) "
            "AND next_try_ns>=0 ORDER BY next_try_ns LIMIT ?) AS due UNION ALL "
            f"SELECT * FROM (SELECT digest, tier, -next_try_ns FROM deletions WHERE tier IN ({tp}) "
            "AND next_try_ns<0 ORDER BY next_try_ns DESC LIMIT ?) AS leased",
            (*tiers, len(skip) + 1, *tiers, len(skip) + 1),
        )
        due = [int(n) for d, t, n in rows if (bytes(d), str(t)) not in skip]
        return min(due, default=None)

    def claim_deletions(
        self, pairs: Sequence[tuple[bytes, str]], lease_until_ns: int | None = None,
        owner: tuple[str, str] | None = None,
    ) -> list[tuple[bytes, str]]:
        todo = list(pairs)

        def body(c: Conn) -> list[tuple[bytes, str]]:
            ok = []
            now = time.time_ns()
            cancelled = held = False
            for d, tier in todo:
                row = c.execute(
                    "SELECT next_try_ns FROM deletions WHERE digest=? AND tier=?", (d, tier)
                ).fetchone()
                if row is None or -int(row[0]) > now:
                    continue  # done, or being deleted by another deleter (its lease runs)
                # A move (moves.py): a node's uncommitted chunk is, or is being, PUT there.
                wanted = c.execute(
                    "SELECT 1 FROM replicas WHERE digest=? AND tier=? AND state='valid' UNION ALL "
                    f"SELECT 1 FROM upload_jobs WHERE digest=? AND tier=? UNION ALL {MOVED_PAIR} "
                    "LIMIT 1",
                    (d, tier, d, tier, d, tier),
                ).fetchone()
                if wanted:
                    c.execute("DELETE FROM deletions WHERE digest=? AND tier=?", (d, tier))
                    cancelled = True
                    # A claim whose lease ran out (its deleter died, or its DELETE's grace
                    # ended unwritten) ended here: the jobs it held may run.
                    if int(row[0]) < 0 and _restamp_jobs(c, d, tier, now):
                        held = True
                    continue
                if lease_until_ns is not None:
                    c.execute("UPDATE deletions SET next_try_ns=? WHERE digest=? AND tier=?",
                              (-lease_until_ns, d, tier))
                    if owner is not None:  # a restart of its node takes it back (claims.py)
                        record_owner(c, d, tier, lease_until_ns, owner)
                ok.append((d, tier))
            if cancelled:  # the row ended: a settle may wait for it
                self._notify_deletions(c)
            if held:
                self._notify_held(c)
            return ok

        return self._write(body)

    def finish_deletions(
        self, pairs: Iterable[tuple[bytes, str]], lease_until_ns: int | None = None
    ) -> None:
        todo = list(pairs)
        # With the lease: only this claim's rows (one whose lease ran out may be another's).
        only = "" if lease_until_ns is None else " AND next_try_ns=?"
        tail = () if lease_until_ns is None else (-lease_until_ns,)

        def body(c: Conn) -> None:
            now = time.time_ns()
            ended = held = False
            for d, tier in todo:
                row = c.execute("DELETE FROM deletions WHERE digest=? AND tier=?" + only +
                                " RETURNING next_try_ns", (d, tier, *tail)).fetchone()
                if row is None:
                    continue
                ended = True
                if int(row[0]) < 0:
                    forget_owner(c, d, tier)
                    if _restamp_jobs(c, d, tier, now):
                        held = True
            if ended:  # a settle, on any node, may wait for these rows
                self._notify_deletions(c)
            if held:
                self._notify_held(c)

        self._write(body)

    def release_deletion_claims(
        self, pairs: Iterable[tuple[bytes, str]], lease_until_ns: int
    ) -> int:
        todo = list(pairs)

        def body(c: Conn) -> int:
            now = time.time_ns()
            n = 0
            held = False
            for d, tier in todo:
                row = c.execute(
                    "UPDATE deletions SET next_try_ns=0 WHERE digest=? AND tier=? AND next_try_ns=? "
                    "RETURNING 1", (d, tier, -lease_until_ns)).fetchone()
                if row is not None:
                    held = _restamp_jobs(c, d, tier, now) or held
                    n += 1
            if n:  # due again, for any node's deleter
                self._notify_deletions(c)
            if held:
                self._notify_held(c)
            return n

        return self._write(body)

    def postpone_deletion(
        self, digest: bytes, tier: str, next_try_ns: int, error: str,
        lease_until_ns: int | None = None, *, keep_claim: bool = False,
    ) -> None:
        only = "" if lease_until_ns is None else " AND next_try_ns=?"
        tail = () if lease_until_ns is None else (-lease_until_ns,)
        # Kept: the claim's new lease runs until the retry time (the row is then due again
        # as any lease that ran out is).
        value = -next_try_ns if keep_claim else next_try_ns

        def body(c: Conn) -> None:
            if not c.execute(
                "UPDATE deletions SET attempts=attempts+1, next_try_ns=?, last_error=? "
                "WHERE digest=? AND tier=?" + only, (value, error, digest, tier, *tail),
            ).rowcount:
                return
            # Tried: a settle may wait for it (and a claim's lease became a retry time).
            self._notify_deletions(c)
            if keep_claim:
                if lease_until_ns is not None:  # the same owner, a new lease (claims.py)
                    move_owner(c, digest, tier, lease_until_ns, next_try_ns)
                return  # still claimed: the jobs it holds stay held
            if lease_until_ns is not None and c.execute(
                "SELECT 1 FROM upload_jobs WHERE digest=? AND tier=?", (digest, tier)
            ).fetchone():
                self._notify_held(c)  # the claim ended: that job may run

        self._write(body)

    def retry_deletions_now(self, tier: str | None = None) -> int:
        def body(c: Conn) -> int:
            if tier is None:
                n = c.execute("UPDATE deletions SET next_try_ns=0 WHERE next_try_ns>0").rowcount
            else:
                n = c.execute(
                    "UPDATE deletions SET next_try_ns=0 WHERE tier=? AND next_try_ns>0", (tier,)
                ).rowcount
            if n:  # due now, for the deleters of every node
                self._notify_deletions(c)
            return int(n)

        return self._write(body)

    def deletions_pending(self, digests: Iterable[bytes], due_before_ns: int | None = None) -> set[bytes]:
        out = set()
        with self._reading() as c:
            for d in set(digests):
                if due_before_ns is None:
                    row = c.execute("SELECT 1 FROM deletions WHERE digest=? LIMIT 1", (d,)).fetchone()
                else:
                    row = c.execute(
                        "SELECT 1 FROM deletions WHERE digest=? AND next_try_ns<=? LIMIT 1",
                        (d, due_before_ns),
                    ).fetchone()
                if row:
                    out.add(d)
        return out

    def deletion_keys(self, tier: str) -> set[bytes]:
        return {bytes(r[0]) for r in self._query("SELECT digest FROM deletions WHERE tier=?", (tier,))}

    def deletion_backlog(self) -> list[DeletionBacklog]:
        out = []
        with self._reading() as c:
            try:
                rows = c.execute(
                    "SELECT tier, count(*), coalesce(sum(length), 0), min(enqueued_ns), "
                    "count(*) FILTER (WHERE attempts>0) FROM deletions GROUP BY tier ORDER BY tier"
                ).fetchall()
            except self._missing_table:
                return []
            for tier, n, size, oldest, failing in rows:
                err = c.execute(
                    # The latest retry time, also of a claim kept after a DELETE in doubt
                    # (negative: claimed until then).
                    "SELECT last_error FROM deletions WHERE tier=? AND last_error IS NOT NULL "
                    "ORDER BY abs(next_try_ns) DESC LIMIT 1", (tier,),
                ).fetchone()
                out.append(DeletionBacklog(str(tier), int(n), int(size), None if oldest is None else int(oldest),
                                           int(failing), None if err is None else str(err[0])))
        return out
