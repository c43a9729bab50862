"""File contents' SQL, once for every engine: extents, chunk rows and the commit of a file
(protocols.ContentsCatalog). What each method does is said on its Protocol; comments here
say how."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from .audit import AuditRecord, AuditSql
from .conn import IN_BATCH, Conn
from .deletion_events import DeletionEventsSql
from .deletions import queue_deletion
from .quotas import Charge, charge_commit, uncharge_inode
from .replicas import KNOWN_CHUNK, VALID_REPLICA
from .rows import ChunkRef, ExtentReplicas
from .tree import files_under, path_of
from .uploads import wanted_on

__all__ = ["ContentsSql", "put_extent"]

# Host parameters per statement: SQLite before 3.32 allows 999.
_SQL_VARS = 900


class ContentsSql(AuditSql, DeletionEventsSql):
    """The file-contents methods of SqlCatalog."""

    def extents(self, ino: int) -> dict[int, ChunkRef]:
        rows = self._query(
            "SELECT e.idx, e.digest, e.length, group_concat(r.tier) FROM extents e "
            "LEFT JOIN replicas r ON r.digest = e.digest AND r.state = 'valid' "
            "WHERE e.ino=? GROUP BY e.ino, e.idx",
            (ino,),
        )
        return {
            int(idx): ChunkRef(bytes(d), int(n), tuple(sorted(t.split(","))) if t else ())
            for idx, d, n, t in rows
        }

    def commit_file(
        self,
        ino: int,
        size: int,
        mtime_ns: int,
        ctime_ns: int,
        chunk_size: int,
        changes: dict[int, ChunkRef | None],
        synced: bool = False,
        uploads: dict[bytes, list[str]] | None = None,
        charge: Charge | None = None,
        *,
        audit: AuditRecord | None = None,
    ) -> list[bytes]:
        n_chunks = (size + chunk_size - 1) // chunk_size
        queued = uploads or {}

        def body(c: Conn) -> list[bytes]:
            if charge is not None:  # first: a refusal leaves nothing of the version
                charge_commit(c, ino, size, charge)
            dropped = _drop_extents(c, ino, n_chunks, [idx for idx in changes if idx < n_chunks])
            # Cancelled rows end a settle's wait (Deleter.settle, on any node).
            if self._put_extents(c, ino, n_chunks, changes, queued, mtime_ns):
                self._notify_deletions(c)
            c.execute(
                "UPDATE inodes SET size=?, mtime_ns=?, ctime_ns=? WHERE ino=?",
                (size, mtime_ns, ctime_ns, ino),
            )
            self._audit_in(c, audit, lambda: path_of(c, ino), ino=ino, size=size,
                           chunks=sum(r is not None for r in changes.values()), synced=synced)
            return dropped

        return self._write(body, synced=synced, touch=True)

    def _put_extents(self, c: Conn, ino: int, n_chunks: int, changes: dict[int, ChunkRef | None],
                     queued: dict[bytes, list[str]], enqueued_ns: int) -> int:
        """Write a version's new extents, their chunk and replica rows and the upload jobs
        ``queued`` names (unless the tier holds a valid copy), and cancel the unclaimed
        deletions of the chunks given a job there (``wanted_on``); how many were cancelled.
        PostgreSQL does a chunk's rows in one statement (postgres.py)."""
        wanted: dict[str, list[bytes]] = {}
        for idx, ref in changes.items():
            if idx < n_chunks and ref is not None:
                for tier in put_extent(c, ino, idx, ref, queued.get(ref.digest, ()), enqueued_ns):
                    wanted.setdefault(tier, []).append(ref.digest)
        return sum(wanted_on(c, tier, digests) for tier, digests in wanted.items())

    def delete_inode(self, ino: int) -> list[bytes]:
        def body(c: Conn) -> list[bytes]:
            if c.execute("SELECT 1 FROM open_handles WHERE ino=? LIMIT 1", (ino,)).fetchone():
                return []
            # The inode first: one linked again meanwhile (another node's link by its
            # number) keeps its name and its extents. Extents of an inode whose row is
            # gone already (a leftover) go too.
            if c.execute("DELETE FROM inodes WHERE ino=? AND nlink<=0", (ino,)).rowcount:
                c.execute("DELETE FROM xattrs WHERE ino=?", (ino,))
                uncharge_inode(c, ino)
            elif c.execute("SELECT 1 FROM inodes WHERE ino=?", (ino,)).fetchone():
                return []
            return [bytes(r[0]) for r in c.execute(
                "DELETE FROM extents WHERE ino=? RETURNING digest", (ino,)).fetchall()]

        return self._write(body)

    def drop_unreferenced(
        self, digests: Iterable[bytes], extra_tiers: dict[bytes, set[str]] | None = None
    ) -> dict[bytes, list[str]]:
        now = time.time_ns()
        todo = set(digests)

        def body(c: Conn) -> dict[bytes, list[str]]:
            gone: dict[bytes, list[str]] = {}
            for d in todo:
                if c.execute("SELECT 1 FROM extents WHERE digest=? LIMIT 1", (d,)).fetchone():
                    continue
                # Each row deleted and read in one statement (not a read and a delete).
                row = c.execute("DELETE FROM chunks WHERE digest=? RETURNING length", (d,)).fetchone()
                tiers = {str(r[0]) for r in c.execute(
                    "DELETE FROM replicas WHERE digest=? RETURNING tier", (d,)).fetchall()}
                extra = (extra_tiers or {}).get(d, set())
                if row is None and not tiers and not extra:
                    continue  # dropped already (by another collect)
                jobs = {str(r[0]) for r in c.execute(
                    "DELETE FROM upload_jobs WHERE digest=? RETURNING tier", (d,)).fetchall()}
                length = 0 if row is None else int(row[0])
                for tier in tiers | jobs | extra:
                    queue_deletion(c, d, tier, length, now)
                gone[d] = sorted(tiers | extra)
            if gone:  # rows for other nodes' local tiers, and remote ones any node takes
                self._notify_deletions(c)
            return gone

        return self._write(body)

    def has_chunk(self, digest: bytes) -> bool:
        return bool(self._query("SELECT 1 FROM chunks WHERE digest=?", (digest,)))

    def chunk_length(self, digest: bytes) -> int:
        rows = self._query("SELECT length FROM chunks WHERE digest=?", (digest,))
        return int(rows[0][0]) if rows else 0

    def digests_under(self, roots: Iterable[str]) -> dict[bytes, int]:
        out: dict[bytes, int] = {}
        with self._reading() as c:
            for root in roots:
                for inode in files_under(c, root):
                    for d, n in c.execute(
                        "SELECT digest, length FROM extents WHERE ino=?", (inode.ino,)
                    ).fetchall():
                        out[bytes(d)] = int(n)
        return out

    def referenced_digests(self) -> set[bytes]:
        with self._reading() as c:
            return {bytes(r[0]) for r in c.execute("SELECT DISTINCT digest FROM extents")}

    def all_extents(self) -> list[tuple[int, int, bytes, int]]:
        with self._reading() as c:
            return [
                (int(a), int(b), bytes(d), int(n))
                for a, b, d, n in c.execute("SELECT ino, idx, digest, length FROM extents")
            ]

    def extent_replicas(self, inos: Sequence[int], tiers: Sequence[str]) -> list[ExtentReplicas]:
        out: list[ExtentReplicas] = []
        tp = ",".join("?" * len(tiers)) or "NULL"
        step = max(1, _SQL_VARS - len(tiers))
        with self._reading() as c:
            for i in range(0, len(inos), step):
                batch = list(inos[i : i + step])
                ip = ",".join("?" * len(batch))
                rows = c.execute(
                    f"SELECT e.ino, e.digest, e.length, EXISTS (SELECT 1 FROM replicas r "
                    f"WHERE r.digest = e.digest AND r.state = 'valid' AND r.tier IN ({tp})) "
                    f"FROM extents e WHERE e.ino IN ({ip})",
                    (*tiers, *batch),
                ).fetchall()
                out += [ExtentReplicas(int(i_), bytes(d), int(n), bool(on)) for i_, d, n, on in rows]
        return out


def _drop_extents(c: Conn, ino: int, n_chunks: int, kept: list[int]) -> list[bytes]:
    """The extents a file's new version drops (beyond its end, ``n_chunks``) or replaces
    (``kept``), deleted and returned in one statement per IN_BATCH of them (not a read and
    a delete each): the digests that lost a reference."""
    dropped: list[bytes] = []
    for at in range(0, max(len(kept), 1), IN_BATCH):
        part = kept[at:at + IN_BATCH]
        where = ["idx>=?"] if at == 0 else []  # the first also drops the tail
        if part:
            where.append(f"idx IN ({','.join('?' * len(part))})")
        dropped += [bytes(r[0]) for r in c.execute(
            f"DELETE FROM extents WHERE ino=? AND ({' OR '.join(where)}) RETURNING digest",
            (ino, *([n_chunks] if at == 0 else []), *part)).fetchall()]
    return dropped


def put_extent(c: Conn, ino: int, idx: int, ref: ChunkRef, queued: Sequence[str],
               enqueued_ns: int) -> list[str]:
    """Extent ``idx`` of ``ino``, its chunk and replica rows, and upload jobs to the tiers
    ``queued`` (unless the tier holds a valid copy): the tiers given a job."""
    c.execute(KNOWN_CHUNK, (ref.digest, ref.length))
    for tier in ref.tiers:
        c.execute(VALID_REPLICA, (ref.digest, tier, time.time_ns()))  # written verified
    c.execute(
        "INSERT INTO extents VALUES (?, ?, ?, ?) ON CONFLICT (ino, idx) DO UPDATE SET "
        "digest=excluded.digest, length=excluded.length",
        (ino, idx, ref.digest, ref.length),
    )
    return [tier for tier in queued if c.execute(
        "INSERT INTO upload_jobs (digest, tier, length, enqueued_ns) "
        "SELECT ?, ?, ?, ? WHERE NOT EXISTS (SELECT 1 FROM replicas "
        "WHERE digest=? AND tier=? AND state='valid') ON CONFLICT DO NOTHING",
        (ref.digest, tier, ref.length, enqueued_ns, ref.digest, tier),
    ).rowcount]
